// Eviction policies on replayed prompt traces (design §7): hit rate of every policy at
// 10 / 25 / 50 % of each trace's working set, against Belady's offline optimum, and each policy's
// cost per replayed access (time inside the HotTier: admit, touch, take victims).
//
//   build/bench/bench_eviction_policy                    # the tables of docs/perf.md (markdown)
//   build/bench/bench_eviction_policy --dump-traces DIR  # also writes DIR/<trace>.trace for
//                                                        # bench/eviction_fluxond_replay.py
//   build/bench/bench_eviction_policy --only cyclic,zipf1.1 --capacities 25,50
//
// Traces (bench/eviction/eviction_replay.h; page ids stand for chained keys, system prompts
// shared):
//   cyclic     96 conversations x 8 rounds, round barrier, 4 shared system prompts;
//   zipfA      256 conversations and 8 system prompts picked with Zipf(A), A = 0.8 / 1.1 / 1.4,
//              up to 10 turns then restart, 4,000 accesses, no round barrier;
//   mix        48 round-barrier conversations interleaved with Zipf(1.1) over 128 others;
//   scan       zipf1.1's hot set with a one-hit prompt of 48 new pages after every 9 hot accesses;
//   diurnal    Zipf(1.1) over 128 conversations, a different 128 (and system prompts) halfway.
// Policies: page LRU (LruPolicy), cohort LRU (LRU over chains, tail first), S3-FIFO and ARC (page
// level, as published), reuse prediction (ReusePredictionPolicy, the previous default), adaptive
// (AdaptiveChainPolicy, the default) and its prediction expert alone (ablation), Belady.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "eviction/baseline_policies.h"
#include "eviction/eviction_replay.h"

namespace fluxon {
namespace {

using namespace eviction_replay;

struct ChainLruPolicy : AdaptiveChainPolicy {
  ChainLruPolicy() : AdaptiveChainPolicy(Mode::kRecencyOnly) {}
};
struct ChainPredictionPolicy : AdaptiveChainPolicy {
  ChainPredictionPolicy() : AdaptiveChainPolicy(Mode::kPredictionOnly) {}
};

struct Entry {
  const char* name;
  std::function<Result(const Trace&, uint64_t)> run;
};

template <typename P>
Entry Of(const char* name) {
  return {name, [](const Trace& t, uint64_t cap) { return Replay<P>(t, cap); }};
}

std::vector<Entry> Policies() {
  return {Of<LruPolicy>("page LRU"),
          Of<ChainLruPolicy>("cohort LRU"),
          Of<S3FifoPolicy>("S3-FIFO"),
          Of<ArcPolicy>("ARC"),
          Of<ReusePredictionPolicy>("reuse prediction (old)"),
          Of<ChainPredictionPolicy>("prediction expert alone"),
          Of<AdaptiveChainPolicy>("adaptive (new)"),
          {"Belady", [](const Trace& t, uint64_t cap) { return ReplayBelady(t, cap); }}};
}

std::vector<Trace> Traces() {
  return {
      CyclicMultiTurn(), ZipfMultiTurn(0.8), ZipfMultiTurn(1.1), ZipfMultiTurn(1.4), Mix(), Scan(),
      Diurnal(),         Sessions()};
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(x);
  return out;
}

void Dump(const Trace& t, const std::string& dir) {
  std::ofstream f(dir + "/" + t.name + ".trace");
  f << "# " << t.name << ": one prompt per line, page ids (chained keys); working set "
    << t.distinct << " pages\n";
  for (size_t i = 0; i < t.size(); ++i) {
    for (size_t j = 0; j < t.length(i); ++j) f << (j ? " " : "") << t.prompt(i)[j];
    f << "\n";
  }
}

}  // namespace
}  // namespace fluxon

int main(int argc, char** argv) {
  using namespace fluxon;
  std::string dump, only;
  std::vector<int> caps = {10, 25, 50};
  int reps = 3;
  bool weights = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--dump-traces") && i + 1 < argc) {
      dump = argv[++i];
    } else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) {
      only = argv[++i];
    } else if (!std::strcmp(argv[i], "--capacities") && i + 1 < argc) {
      caps.clear();
      for (const auto& c : Split(argv[++i])) caps.push_back(std::atoi(c.c_str()));
    } else if (!std::strcmp(argv[i], "--weights")) {
      weights = true;
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--dump-traces DIR] [--only t1,t2] [--capacities 10,25,50] "
                   "[--reps N] [--weights]\n",
                   argv[0]);
      return 2;
    }
  }
  const auto policies = Policies();
  std::vector<std::string> wanted = Split(only);
  std::vector<std::vector<double>> cost(policies.size());  // ns/access, every trace x capacity
  std::printf("hit rate, %% of requested pages (capacity in %% of the working set; pages)\n\n");
  std::printf("| trace | capacity |");
  for (const auto& p : policies) std::printf(" %s |", p.name);
  std::printf("\n|---|---|");
  for (size_t i = 0; i < policies.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (const Trace& t : Traces()) {
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), t.name) == wanted.end())
      continue;
    if (!dump.empty()) Dump(t, dump);
    for (int pct : caps) {
      const uint64_t cap = static_cast<uint64_t>(t.distinct) * pct / 100;
      std::printf("| %s | %d %% (%llu) |", t.name.c_str(), pct,
                  static_cast<unsigned long long>(cap));
      double best_baseline = 0, adaptive = 0;
      for (size_t k = 0; k < policies.size(); ++k) {
        Result r;
        double best_ns = 0;
        for (int rep = 0; rep < (policies[k].name == std::string("Belady") ? 1 : reps); ++rep) {
          r = policies[k].run(t, cap);
          if (rep == 0 || r.ns_per_access() < best_ns) best_ns = r.ns_per_access();
        }
        cost[k].push_back(best_ns);
        const std::string n = policies[k].name;
        if (n == "page LRU" || n == "S3-FIFO" || n == "ARC")
          best_baseline = std::max(best_baseline, r.hit_rate());
        if (n == "adaptive (new)") adaptive = r.hit_rate();
        std::printf(" %.1f |", r.hit_rate());
      }
      std::printf("%s",
                  adaptive + 1e-9 < best_baseline ? " <- below the best of LRU/S3-FIFO/ARC" : "");
      if (weights) {  // the adaptive policy's expert weights at the end of the replay
        HotTier<AdaptiveChainPolicy> tier;
        Replay<AdaptiveChainPolicy>(t, cap, 128, true, &tier);
        tier.InspectPolicy([](const AdaptiveChainPolicy& p) {
          std::printf(" weights prediction %.3f recency %.3f probation target %.3f",
                      p.weight(AdaptiveChainPolicy::kPrediction),
                      p.weight(AdaptiveChainPolicy::kRecency), p.probation_target());
          return 0;
        });
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  std::printf(
      "\ncost, ns per replayed access inside the HotTier (best of %d runs; median over the "
      "traces and capacities above, then the max)\n\n| policy | median ns/access | max | vs page "
      "LRU |\n|---|---|---|---|\n",
      reps);
  double lru_median = 0;
  for (size_t k = 0; k + 1 < policies.size(); ++k) {
    auto v = cost[k];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    const double median = v[v.size() / 2];
    if (k == 0) lru_median = median;
    std::printf("| %s | %.0f | %.0f | %.2fx |\n", policies[k].name, median, v.back(),
                lru_median > 0 ? median / lru_median : 0);
  }
  return 0;
}
