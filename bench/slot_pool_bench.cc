// Micro-benchmarks of the memory core's hot operations: slot claim/release and holder
// acquire/release, single-threaded and with two threads.
//
//   build/bench/bench_slot_pool --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "fluxon/plan_blob.h"
#include "fluxon/units.h"
#include "holder/holder.h"
#include "slot/slot_pool.h"

namespace fluxon {
namespace {

constexpr uint64_t kValueLen = 4'718'592;  // one page of a 36-layer, 8x128 bf16 KV (page 64)

struct Fixture {
  Fixture() {
    SegmentOptions so;
    so.size_bytes = 8 * kGrantBytes;
    segment = std::move(*Segment::Create(so));
    SlotPoolOptions po;
    po.populate_grants = false;
    pool = std::move(*SlotPool::Create(segment.get(), po));
    auto warm = pool->Claim(kValueLen, 4 * SlotsPerGrant(kValueLen));  // carve 4 grants up front
    for (const SlotRef& r : *warm) (void)pool->Abort(r);
  }
  std::unique_ptr<Segment> segment;
  std::unique_ptr<SlotPool> pool;
};

Fixture& Shared() {
  static Fixture* f = new Fixture();  // shared by the benchmark threads of one process
  return *f;
}

// Claim a batch of `range(0)` slots and abort them: local_fast_put_start + put_abort on the pool.
void BM_ClaimAbortBatch(benchmark::State& state) {
  SlotPool& pool = *Shared().pool;
  const size_t n = state.range(0);
  for (auto _ : state) {
    auto refs = pool.Claim(kValueLen, n);
    if (!refs.ok()) state.SkipWithError("claim failed");
    for (const SlotRef& r : *refs) (void)pool.Abort(r);
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_ClaimAbortBatch)->Arg(1)->Arg(32)->Arg(128)->Threads(1)->Threads(2)->UseRealTime();

// The whole put lifecycle per slot: claim, commit local-visible (resident holder), publish,
// release route, drop holder -> Free.
void BM_FullSlotLifecycleBatch(benchmark::State& state) {
  SlotPool& pool = *Shared().pool;
  const size_t n = state.range(0);
  std::vector<HolderRef> holders;
  holders.reserve(n);
  for (auto _ : state) {
    auto refs = pool.Claim(kValueLen, n);
    if (!refs.ok()) state.SkipWithError("claim failed");
    for (const SlotRef& r : *refs) {
      holders.push_back(*HolderRef::CommitLocalVisible(&pool, r, "key", 1, kValueLen));
      (void)pool.PublishRoute(r);
    }
    for (const SlotRef& r : *refs) (void)pool.ReleaseRoute(r);
    holders.clear();
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_FullSlotLifecycleBatch)->Arg(1)->Arg(128)->Threads(1)->Threads(2)->UseRealTime();

// Pin and unpin a committed value: copying a HolderRef (what a local hit does per page).
void BM_HolderPinUnpin(benchmark::State& state) {
  static HolderRef* resident = [] {
    SlotPool& pool = *Shared().pool;
    SlotRef r = (*pool.Claim(kValueLen, 1))[0];
    auto* h = new HolderRef(*HolderRef::CommitLocalVisible(&pool, r, "hot", 1, kValueLen));
    (void)pool.PublishRoute(r);
    return h;
  }();
  for (auto _ : state) {
    HolderRef pin = *resident;
    benchmark::DoNotOptimize(pin);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HolderPinUnpin)->Threads(1)->Threads(2)->UseRealTime();

// A new MemoryInfo on a committed slot (AcquireHolder on the slot word) and its release.
void BM_HolderAcquireRelease(benchmark::State& state) {
  SlotPool& pool = *Shared().pool;
  static SlotRef slot = [] {
    SlotPool& p = *Shared().pool;
    SlotRef r = (*p.Claim(kValueLen, 1))[0];
    (void)p.CommitLocalVisible(r);
    (void)p.PublishRoute(r);
    return r;
  }();
  for (auto _ : state) {
    auto h = HolderRef::Acquire(&pool, slot, "hot", 1, kValueLen);
    benchmark::DoNotOptimize(h);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HolderAcquireRelease)->Threads(1)->Threads(2)->UseRealTime();

// External export by ID and release (what an InlineLocal hit costs per page on the owner).
void BM_HolderExportRelease(benchmark::State& state) {
  static HolderRegistry* reg = new HolderRegistry(Shared().segment->generation());
  static HolderRef* resident = [] {
    SlotPool& pool = *Shared().pool;
    SlotRef r = (*pool.Claim(kValueLen, 1))[0];
    return new HolderRef(*HolderRef::CommitLocalVisible(&pool, r, "exp", 1, kValueLen));
  }();
  for (auto _ : state) {
    const uint64_t id = reg->Export(*resident);
    (void)reg->Release(id, reg->generation());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HolderExportRelease)->Threads(1)->Threads(2)->UseRealTime();

// Issue and consume a plan blob of `range(0)` values.
void BM_PlanIssueConsume(benchmark::State& state) {
  static PlanRegistry* reg = PlanRegistry::Create({}).value().release();
  std::vector<uint64_t> ptrs(state.range(0), 0x1000);
  for (auto _ : state) {
    auto p = reg->Issue(PlanKind::kPut, ptrs);
    (void)reg->Consume(*p, PlanKind::kPut);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_PlanIssueConsume)->Arg(1)->Arg(128)->Threads(1)->Threads(2)->UseRealTime();

}  // namespace
}  // namespace fluxon
