// The eviction generalisation suite: every family of bench/eviction/trace_suite.h swept over its
// parameters and seeds, replayed in memory (eviction_replay.h) at 5 / 10 / 25 / 50 % of each
// trace's working set, with the owner's policy (AdaptiveChainPolicy), the baselines it must
// beat (page LRU, S3-FIFO, ARC), the previous policy (ReusePredictionPolicy) and Belady.
//
// Seeds 1 .. seeds/2 are the tuning half, the rest the held-out half: a change to the policy may
// look at the tuning half only, and the held-out tables are printed first. Goals (held-out):
//   - at or above the best of page LRU, S3-FIFO and ARC in >= 98 % of cells, never more than
//     0.5 points below it;
//   - on round-barrier traffic never below the previous policy, and within 3 points of Belady at
//     50 %;
//   - cost per access <= 1.5x page LRU's (time inside the HotTier, per cell, median over cells).
//
//   build/bench/bench_eviction_suite                      # the tables of docs/perf.md
//   build/bench/bench_eviction_suite --quick              # a small sweep (the test)
//   build/bench/bench_eviction_suite --family barrier --seeds 4 --capacities 25,50 --misses 40
//   build/bench/bench_eviction_suite --csv cells.csv       # also every cell, one line each
//   build/bench/bench_eviction_suite --selecting           # the policy measured: SelectingPolicy
//   (bench/eviction/selecting_policy.h) over the owner's policy, the previous one, ARC, S3-FIFO
//   and page LRU; --selecting-options half_life,margin,judge_every,followers sets its options
//   (FLUXON_SEL_DEBUG=1 prints each cell's simulated hit rates and switches)
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "eviction/baseline_policies.h"
#include "eviction/eviction_replay.h"
#include "eviction/selecting_policy.h"
#include "eviction/trace_suite.h"

namespace fluxon {
namespace {

using namespace eviction_replay;

// One trace at one capacity: every policy's hit rate, and the cost of the two that are timed.
struct Cell {
  const suite::Case* c = nullptr;
  int capacity_pct = 0;
  double lru = 0, s3fifo = 0, arc = 0, previous = 0, adaptive = 0, belady = 0;
  double prediction_alone = 0;  // the adaptive policy's prediction expert alone (a diagnosis)
  double lru_ns = 0, adaptive_ns = 0;
  bool held_out = false;
  double best_baseline() const { return std::max({lru, s3fifo, arc}); }
  const char* best_name() const {
    return lru >= s3fifo && lru >= arc ? "page LRU" : s3fifo >= arc ? "S3-FIFO" : "ARC";
  }
  double gap() const { return adaptive - best_baseline(); }
  // The best any online policy measured here reaches in this cell (a bound on choosing among them).
  double best_online() const { return std::max({lru, s3fifo, arc, previous, adaptive}); }
};

constexpr double kEps = 1e-9;

struct PredictionExpertPolicy : AdaptiveChainPolicy {
  PredictionExpertPolicy() : AdaptiveChainPolicy(Mode::kPredictionOnly) {}
};

SelectingOptions g_sel;  // --selecting-options half_life,margin,judge_every
struct Selecting : SelectingPolicy<AdaptiveChainPolicy, ReusePredictionPolicy, ArcPolicy,
                                   S3FifoPolicy, LruPolicy> {
  Selecting() : SelectingPolicy(g_sel) {}
  ~Selecting() {
    if (std::getenv("FLUXON_SEL_DEBUG") == nullptr) return;
    const auto r = simulated_hit_rates();
    std::fprintf(stderr,
                 "sims adaptive %.1f previous %.1f arc %.1f s3fifo %.1f lru %.1f; "
                 "leader %zu, %llu switches\n",
                 r[0], r[1], r[2], r[3], r[4], live_expert(),
                 static_cast<unsigned long long>(switches()));
  }
};
bool g_selecting = false;  // --selecting: the policy measured is Selecting, not the owner's

Cell Run(const suite::Case& c, int pct) {
  Cell cell;
  cell.c = &c;
  cell.capacity_pct = pct;
  const uint64_t cap = std::max<uint64_t>(1, uint64_t{c.trace.distinct} * pct / 100);
  const Result lru = Replay<LruPolicy>(c.trace, cap);
  const Result adaptive =
      g_selecting ? Replay<Selecting>(c.trace, cap) : Replay<AdaptiveChainPolicy>(c.trace, cap);
  cell.lru = lru.hit_rate();
  cell.adaptive = adaptive.hit_rate();
  cell.lru_ns = lru.ns_per_access();
  cell.adaptive_ns = adaptive.ns_per_access();
  cell.s3fifo = Replay<S3FifoPolicy>(c.trace, cap).hit_rate();
  cell.arc = Replay<ArcPolicy>(c.trace, cap).hit_rate();
  cell.previous = Replay<ReusePredictionPolicy>(c.trace, cap).hit_rate();
  cell.belady = ReplayBelady(c.trace, cap).hit_rate();
  cell.prediction_alone = Replay<PredictionExpertPolicy>(c.trace, cap).hit_rate();
  return cell;
}

struct Summary {
  int cells = 0, at_or_above = 0, over_half_below = 0;
  double worst = 0, gap_sum = 0;
  int below_previous = 0, at_50 = 0, within_3_of_belady = 0, best_online_within_3 = 0;
  double worst_vs_previous = 0;
  void Add(const Cell& x) {
    ++cells;
    const double g = x.gap();
    gap_sum += g;
    if (g >= -kEps) ++at_or_above;
    if (g < -0.5 - kEps) ++over_half_below;
    worst = std::min(worst, g);
    if (x.c->family == "barrier") {
      if (x.adaptive < x.previous - kEps) ++below_previous;
      worst_vs_previous = std::min(worst_vs_previous, x.adaptive - x.previous);
      if (x.capacity_pct == 50) {
        ++at_50;
        if (x.adaptive >= x.belady - 3 - kEps) ++within_3_of_belady;
        if (x.best_online() >= x.belady - 3 - kEps) ++best_online_within_3;
      }
    }
  }
};

void PrintSummary(const char* title, const std::vector<Cell>& cells, bool held_out) {
  std::map<std::string, Summary> by_family;
  Summary all;
  std::vector<double> cost;
  for (const Cell& x : cells) {
    if (x.held_out != held_out) continue;
    by_family[x.c->family].Add(x);
    all.Add(x);
    if (x.lru_ns > 0) cost.push_back(x.adaptive_ns / x.lru_ns);
  }
  std::printf("\n%s: %d cells\n\n", title, all.cells);
  std::printf(
      "| family | cells | at or above the best baseline | > 0.5 below | worst gap | mean gap | "
      "barrier: below the previous policy (worst) | barrier: within 3 of Belady at 50 %% (the "
      "best online policy of each cell) |\n"
      "|---|---|---|---|---|---|---|---|\n");
  auto row = [](const std::string& name, const Summary& s) {
    std::printf("| %s | %d | %d (%.1f %%) | %d | %+.1f | %+.2f |", name.c_str(), s.cells,
                s.at_or_above, s.cells ? 100.0 * s.at_or_above / s.cells : 0, s.over_half_below,
                s.worst, s.cells ? s.gap_sum / s.cells : 0);
    if (s.at_50 > 0 || s.below_previous > 0) {
      std::printf(" %d (%+.1f) | %d of %d (%d) |\n", s.below_previous, s.worst_vs_previous,
                  s.within_3_of_belady, s.at_50, s.best_online_within_3);
    } else {
      std::printf(" – | – |\n");
    }
  };
  for (const auto& [name, s] : by_family) row(name, s);
  row("**all**", all);
  if (!cost.empty()) {
    std::sort(cost.begin(), cost.end());
    std::printf(
        "\ncost per access, adaptive / page LRU (time inside the HotTier, per cell): median "
        "%.2fx, p90 %.2fx\n",
        cost[cost.size() / 2], cost[cost.size() * 9 / 10]);
  }
}

// Every cell, one line each (for analyses the tables do not make): the trace, its half, the
// capacity, each policy's hit rate and the two timed policies' cost per access.
// Closes `f`.
bool WriteCsv(FILE* f, const std::vector<Cell>& cells) {
  std::fprintf(f,
               "family,params,seed,held_out,capacity_pct,lru,s3fifo,arc,previous,adaptive,"
               "prediction_alone,belady,lru_ns,adaptive_ns\n");
  for (const Cell& x : cells) {
    std::fprintf(f, "%s,\"%s\",%llu,%d,%d,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.1f,%.1f\n",
                 x.c->family.c_str(), x.c->params.c_str(),
                 static_cast<unsigned long long>(x.c->seed), x.held_out ? 1 : 0, x.capacity_pct,
                 x.lru, x.s3fifo, x.arc, x.previous, x.adaptive, x.prediction_alone, x.belady,
                 x.lru_ns, x.adaptive_ns);
  }
  return std::fclose(f) == 0;
}

std::vector<int> Ints(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(std::atoi(x.c_str()));
  return out;
}

}  // namespace
}  // namespace fluxon

int main(int argc, char** argv) {
  using namespace fluxon;
  int seeds = 10, misses = 20;
  bool list_tuning = false;  // list the tuning half's misses instead (while changing the policy)
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  bool quick = false;
  std::string family;
  std::string csv_path;  // --csv FILE: every cell's hit rates, one line each
  std::vector<int> caps = {5, 10, 25, 50};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--seeds" && i + 1 < argc) {
      seeds = std::atoi(argv[++i]);
    } else if (a == "--capacities" && i + 1 < argc) {
      caps = Ints(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads = static_cast<unsigned>(std::max(1, std::atoi(argv[++i])));
    } else if (a == "--family" && i + 1 < argc) {
      family = argv[++i];
    } else if (a == "--misses" && i + 1 < argc) {
      misses = std::atoi(argv[++i]);
    } else if (a == "--csv" && i + 1 < argc) {
      csv_path = argv[++i];
    } else if (a == "--list-tuning") {
      list_tuning = true;
    } else if (a == "--selecting") {
      g_selecting = true;
    } else if (a == "--selecting-options" && i + 1 < argc) {
      g_selecting = true;
      int followers = 0;
      unsigned long long sampled = 0;
      const int n = std::sscanf(argv[++i], "%lf,%lf,%u,%d,%llu", &g_sel.half_life_prompts,
                                &g_sel.switch_margin, &g_sel.judge_every, &followers, &sampled);
      g_sel.sampled_pages = sampled;
      if ((n != 4 && n != 5) || !(g_sel.half_life_prompts > 0) || g_sel.judge_every == 0 ||
          (followers != 0 && followers != 1)) {
        std::fprintf(stderr,
                     "--selecting-options wants half_life > 0, margin, judge_every >= 1 "
                     "and followers 0 or 1, then optionally the pages each simulation samples "
                     "(0: every page), e.g. 256,1,32,1 or 256,1,32,0,1024\n");
        return 2;
      }
      g_sel.followers = followers != 0;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--seeds N] [--capacities 5,10,25,50] [--threads N] "
                   "[--family barrier,zipf,...] [--misses N] [--list-tuning] [--csv FILE] "
                   "[--selecting] "
                   "[--selecting-options half_life,margin,judge_every,followers[,sampled_pages]]\n",
                   argv[0]);
      return 2;
    }
  }
  if (quick) seeds = std::min(seeds, 2);
  if (seeds < 2 || caps.empty() ||
      std::any_of(caps.begin(), caps.end(), [](int c) { return c <= 0 || c > 100; })) {
    std::fprintf(stderr, "--seeds must be at least 2 and every capacity in (0, 100]\n");
    return 2;
  }
  // Opened before the replay, so a path that cannot be written fails at once.
  FILE* csv = nullptr;
  if (!csv_path.empty() && (csv = std::fopen(csv_path.c_str(), "w")) == nullptr) {
    std::fprintf(stderr, "cannot open %s for writing\n", csv_path.c_str());
    return 2;
  }
  std::vector<suite::Case> cases;
  for (int seed = 1; seed <= seeds; ++seed) {
    for (suite::Case& c : suite::Cases(static_cast<uint64_t>(seed), quick)) {
      if (family.empty() || ("," + family + ",").find("," + c.family + ",") != std::string::npos)
        cases.push_back(std::move(c));
    }
  }
  std::vector<Cell> cells(cases.size() * caps.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < cells.size();) {
        const suite::Case& c = cases[i / caps.size()];
        cells[i] = Run(c, caps[i % caps.size()]);
        cells[i].held_out = c.seed > static_cast<uint64_t>(seeds / 2);
      }
    });
  }
  for (std::thread& t : pool) t.join();

  std::printf(
      "eviction generalisation suite: %zu traces (%d seeds; held out: seeds %d-%d), "
      "capacities",
      cases.size(), seeds, seeds / 2 + 1, seeds);
  for (int c : caps) std::printf(" %d", c);
  std::printf(" %% of each working set; hit rate in points of requested pages\n");
  PrintSummary("held-out seeds", cells, true);
  PrintSummary("tuning seeds", cells, false);

  std::vector<const Cell*> missed;
  for (const Cell& x : cells) {
    const bool below_previous = x.c->family == "barrier" && x.adaptive < x.previous - kEps;
    if (x.held_out != list_tuning && (x.gap() < -0.5 - kEps || below_previous)) {
      missed.push_back(&x);
    }
  }
  std::sort(missed.begin(), missed.end(), [](const Cell* a, const Cell* b) {
    return std::min(a->gap(), a->adaptive - a->previous) <
           std::min(b->gap(), b->adaptive - b->previous);
  });
  if (!missed.empty() && misses > 0) {
    std::printf(
        "\n%s cells more than 0.5 below the best baseline, or (barrier) below the previous "
        "policy, worst first (%zu; %d shown)\n\n| trace | seed | capacity | adaptive | best "
        "baseline | previous | Belady | prediction expert alone "
        "|\n|---|---|---|---|---|---|---|---|\n",
        list_tuning ? "tuning" : "held-out", missed.size(),
        std::min<int>(misses, static_cast<int>(missed.size())));
    for (int i = 0; i < misses && i < static_cast<int>(missed.size()); ++i) {
      const Cell& x = *missed[i];
      std::printf("| %s %s | %llu | %d %% | %.1f | %.1f (%s) | %.1f | %.1f | %.1f |\n",
                  x.c->family.c_str(), x.c->params.c_str(),
                  static_cast<unsigned long long>(x.c->seed), x.capacity_pct, x.adaptive,
                  x.best_baseline(), x.best_name(), x.previous, x.belady, x.prediction_alone);
    }
  }
  if (csv != nullptr) {
    if (!WriteCsv(csv, cells)) {
      std::fprintf(stderr, "cannot write %s\n", csv_path.c_str());
      return 1;
    }
    std::printf("\nwrote %zu cells to %s\n", cells.size(), csv_path.c_str());
  }
  // The replay must have measured something in every cell (a test runs --quick).
  for (const Cell& x : cells) {
    if (x.c->trace.size() == 0 || x.belady < 0 || x.belady > 100) {
      std::fprintf(stderr, "empty cell: %s seed %llu\n", x.c->trace.name.c_str(),
                   static_cast<unsigned long long>(x.c->seed));
      return 1;
    }
  }
  return 0;
}
