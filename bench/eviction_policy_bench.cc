// Eviction policies on replayed prompt traces: hit rate of the owner's policy against LRU and
// Belady's offline optimum (design §7), and the policy's cost per replayed access.
//
//   build/bench/bench_eviction_policy --benchmark_counters_tabular=true
//
// Traces (pages of one conversation are chained; a restore is a leading prefix):
//   multiturn: 16 conversations x 4 rounds, 16 pages then 8 more per round (working set 640),
//              the Fluxon-vs-Mooncake multi-turn workload (bench/mooncake_compare.py);
//   zipf:      64 conversations picked with Zipf(1) weights, 1,500 accesses, up to 12 turns.
// Capacity is in pages; the hit rate is restored pages over requested pages (%).
#include <benchmark/benchmark.h>

#include <vector>

#include "owner/eviction_replay.h"

namespace fluxon {
namespace {

using namespace eviction_replay;

const std::vector<Access>& Trace(int which) {
  static const auto* multiturn = new std::vector<Access>(MultiTurn(16, 4, 16, 8));
  static const auto* zipf = new std::vector<Access>(ZipfTurns(64, 1500, 16, 8, 12, 7));
  return which == 0 ? *multiturn : *zipf;
}

enum Kind { kLru = 0, kReusePrediction = 1, kReusePredictionNoHint = 2, kBelady = 3 };

void BM_Replay(benchmark::State& state) {
  const auto& trace = Trace(static_cast<int>(state.range(0)));
  const uint64_t cap = static_cast<uint64_t>(state.range(1));
  const auto kind = static_cast<Kind>(state.range(2));
  Result r;
  for (auto _ : state) {
    switch (kind) {
      case kLru:
        r = Replay<LruPolicy>(trace, cap, 128);
        break;
      case kReusePrediction:
        r = Replay<ReusePredictionPolicy>(trace, cap, 128);
        break;
      case kReusePredictionNoHint:
        r = Replay<ReusePredictionPolicy>(trace, cap, 128, /*parent_hint=*/false);
        break;
      case kBelady:
        r = ReplayBelady(trace, cap);
        break;
    }
    benchmark::DoNotOptimize(r);
  }
  static const char* kNames[] = {"lru", "reuse_prediction", "reuse_prediction_no_hint", "belady"};
  state.SetLabel(std::string(state.range(0) == 0 ? "multiturn " : "zipf ") + kNames[kind]);
  state.counters["hit_%"] = r.hit_rate();
  state.counters["evicted"] = static_cast<double>(r.evictions);
  state.counters["accesses/s"] = benchmark::Counter(static_cast<double>(trace.size()),
                                                    benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_Replay)
    ->ArgsProduct({{0},
                   {227, 341, 455, 568},
                   {kLru, kReusePrediction, kReusePredictionNoHint, kBelady}})
    ->ArgsProduct({{1}, {227, 455, 910}, {kLru, kReusePrediction, kReusePredictionNoHint, kBelady}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace fluxon
