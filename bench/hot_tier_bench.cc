// The owner's hot tier under eviction: the time of an eviction round while values are pinned
// (docs/perf.md, "Eviction rounds with pinned values").
//
// Each iteration admits one put batch (a chain of `batch` cohorts of 64 KiB), takes victims worth
// one batch, puts back every `pinned_every`-th of them (a value a reader still pins goes back as
// Readmit does, at the same tick: a chain of its own when its predecessor left), and takes
// victims worth the ones put back. The tier holds 64 batches. The second take is what an
// eviction round does after pinned values come back; before the prediction expert found its
// candidate in O(log n), every victim of that take walked every chain put back.
//
//   build/bench/bench_hot_tier --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "owner/hot_tier.h"

namespace fluxon {
namespace {

constexpr uint64_t kValue = 64 << 10;
constexpr int kResidentBatches = 64;

std::vector<Cohort> Batch(uint64_t* next_id, int n) {
  std::vector<Cohort> out(n);
  for (Cohort& c : out) {
    c.id = ++*next_id;
    c.put_id = c.id;
    c.keys = {"k" + std::to_string(c.id)};
    c.weight = kValue;
  }
  return out;
}

void BM_EvictionRoundWithPinnedValues(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const int pinned_every = static_cast<int>(state.range(1));  // 0: none pinned
  HotTier<> tier;
  uint64_t next_id = 0;
  for (int i = 0; i < kResidentBatches; ++i) tier.AdmitChain(Batch(&next_id, batch));
  uint64_t readmitted = 0;
  for (auto _ : state) {
    tier.AdmitChain(Batch(&next_id, batch));
    std::vector<Cohort> victims = tier.TakeVictims(batch * kValue);
    uint64_t back = 0;
    for (size_t i = 0; i < victims.size(); ++i) {
      if (pinned_every > 0 && i % pinned_every == 0) {
        tier.Readmit(std::move(victims[i]));
        ++back;
      }
    }
    readmitted += back;
    benchmark::DoNotOptimize(tier.TakeVictims(back * kValue));
  }
  state.counters["readmitted_per_round"] =
      benchmark::Counter(static_cast<double>(readmitted) / state.iterations());
  state.SetItemsProcessed(state.iterations() * batch);
}
BENCHMARK(BM_EvictionRoundWithPinnedValues)
    ->ArgNames({"batch", "pinned_every"})
    ->Args({256, 0})
    ->Args({256, 2})
    ->Args({1024, 0})
    ->Args({1024, 2})
    ->Args({1024, 1})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace fluxon
