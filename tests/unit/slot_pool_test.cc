#include "slot/slot_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "fluxon/status.h"
#include "fluxon/units.h"

namespace fluxon {
namespace {

using std::chrono::milliseconds;

class SlotPoolTest : public ::testing::Test {
 protected:
  void MakePool(uint64_t grants, SlotPoolOptions opts = {}) {
    SegmentOptions so;
    so.size_bytes = grants * kGrantBytes;
    auto seg = Segment::Create(so);
    ASSERT_TRUE(seg.ok()) << seg.status();
    segment_ = std::move(*seg);
    opts.populate_grants = false;
    auto pool = SlotPool::Create(segment_.get(), std::move(opts));
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
  }
  // Memory populated when carved, one warm grant, grants idle after 1 ms.
  void MakeWarmPool(uint64_t grants) {
    SegmentOptions so;
    so.size_bytes = grants * kGrantBytes;
    auto seg = Segment::Create(so);
    ASSERT_TRUE(seg.ok()) << seg.status();
    segment_ = std::move(*seg);
    SlotPoolOptions o;
    o.populate_grants = true;
    o.warm_grants = 1;
    o.shrink_idle = milliseconds(1);
    auto pool = SlotPool::Create(segment_.get(), std::move(o));
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
  }
  int64_t Count(SlotState s) { return pool_->Stats().slots_by_state[static_cast<int>(s)]; }
  SlotState State(const SlotRef& r) { return *pool_->StateOf(r); }

  std::unique_ptr<Segment> segment_;
  std::unique_ptr<SlotPool> pool_;
};

TEST_F(SlotPoolTest, DynamicModeCarvesExactFitGrantsOnDemand) {
  MakePool(2);
  EXPECT_EQ(pool_->Stats().grants, 0u);
  auto refs = pool_->Claim(4'718'592, 3);
  ASSERT_TRUE(refs.ok()) << refs.status();
  SlotPoolStats s = pool_->Stats();
  EXPECT_EQ(s.grants, 1u);
  ASSERT_EQ(s.classes.size(), 1u);
  EXPECT_EQ(s.classes[0].slot_size, 4'718'592u);
  EXPECT_EQ(s.classes[0].slots_per_grant, 113u);
  EXPECT_EQ(s.classes[0].free_slots, 110u);
  EXPECT_EQ(Count(SlotState::kPrepared), 3);
  // Slots are laid end to end at exact-fit offsets inside the grant.
  std::set<uint64_t> offsets;
  for (const SlotRef& r : *refs) {
    EXPECT_EQ(pool_->SlotSizeOf(r), 4'718'592u);
    const uint64_t off = pool_->OffsetOf(r) - segment_->data_offset();
    EXPECT_EQ(off % 4'718'592, 0u);
    EXPECT_LT(off + 4'718'592, kGrantBytes + 1);
    offsets.insert(off);
  }
  EXPECT_EQ(offsets.size(), 3u);
  for (const SlotRef& r : *refs) EXPECT_TRUE(pool_->Abort(r).ok());
  EXPECT_EQ(Count(SlotState::kFree), 113);
  EXPECT_TRUE(pool_->CheckConsistency().ok());
}

TEST_F(SlotPoolTest, GrowsASecondGrantWhenTheFirstIsFull) {
  MakePool(2);
  auto a = pool_->Claim(SlotSizeFor(200 * kMiB), 2);  // 2 slots per grant
  ASSERT_TRUE(a.ok());
  auto b = pool_->Claim(200 * kMiB, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(pool_->Stats().grants, 2u);
  EXPECT_NE((*b)[0].grant, (*a)[0].grant);
}

TEST_F(SlotPoolTest, FullLifecycleLocalVisibleThenPublishThenRelease) {
  MakePool(1);
  SlotRef r = (*pool_->Claim(8192, 1))[0];
  EXPECT_EQ(State(r), SlotState::kPrepared);
  ASSERT_TRUE(pool_->CommitLocalVisible(r).ok());
  EXPECT_EQ(State(r), SlotState::kPendingLocalVisible);
  EXPECT_EQ(pool_->HolderCountOf(r), 1u);
  ASSERT_TRUE(pool_->PublishRoute(r).ok());
  EXPECT_EQ(State(r), SlotState::kCommitted);
  // Holder first: the slot stays Committed while the route is live (S2).
  ASSERT_TRUE(pool_->ReleaseHolder(r).ok());
  EXPECT_EQ(State(r), SlotState::kCommitted);
  ASSERT_TRUE(pool_->ReleaseRoute(r).ok());
  EXPECT_EQ(State(r), SlotState::kFree);
  EXPECT_TRUE(pool_->CheckConsistency().ok());
}

TEST_F(SlotPoolTest, RouteFirstLeavesSlotReleasingUntilLastHolder) {
  MakePool(1);
  SlotRef r = (*pool_->Claim(8192, 1))[0];
  ASSERT_TRUE(pool_->CommitLocalVisible(r).ok());
  ASSERT_TRUE(pool_->AcquireHolder(r).ok());  // a reader's MemoryInfo
  ASSERT_TRUE(pool_->PublishRoute(r).ok());
  ASSERT_TRUE(pool_->ReleaseRoute(r).ok());
  EXPECT_EQ(State(r), SlotState::kReleasing);
  EXPECT_EQ(Count(SlotState::kReleasing), 1);
  // No new holder on a slot whose route is gone.
  EXPECT_FALSE(pool_->AcquireHolder(r).ok());
  ASSERT_TRUE(pool_->ReleaseHolder(r).ok());
  EXPECT_EQ(State(r), SlotState::kReleasing);
  // The slot is not reusable while a holder remains: a claim gets another slot.
  auto other = pool_->Claim(8192, 1);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE((*other)[0].grant == r.grant && (*other)[0].index == r.index);
  ASSERT_TRUE(pool_->ReleaseHolder(r).ok());
  EXPECT_EQ(State(r), SlotState::kFree);
  ASSERT_TRUE(pool_->Abort((*other)[0]).ok());
  EXPECT_TRUE(pool_->CheckConsistency().ok());
}

TEST_F(SlotPoolTest, RouteAndHolderReleaseHappenExactlyOnce) {
  MakePool(1);
  SlotRef r = (*pool_->Claim(8192, 1))[0];
  ASSERT_TRUE(pool_->CommitLocalVisible(r).ok());
  ASSERT_TRUE(pool_->PublishRoute(r).ok());
  ASSERT_TRUE(pool_->ReleaseRoute(r).ok());
  EXPECT_EQ(pool_->ReleaseRoute(r).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(pool_->ReleaseHolder(r).ok());
  EXPECT_FALSE(pool_->ReleaseHolder(r).ok());
  EXPECT_EQ(Count(SlotState::kFree), static_cast<int64_t>(SlotsPerGrant(8192)));
  EXPECT_TRUE(pool_->CheckConsistency().ok());
}

TEST_F(SlotPoolTest, UnpublishedValueFreesWhenItsLastHolderGoes) {
  MakePool(1);
  SlotRef r = (*pool_->Claim(8192, 1))[0];
  ASSERT_TRUE(pool_->CommitLocalVisible(r).ok());
  ASSERT_TRUE(pool_->ReleaseHolder(r).ok());  // publish proven never to happen
  EXPECT_EQ(State(r), SlotState::kFree);
  EXPECT_FALSE(pool_->PublishRoute(r).ok());
}

TEST_F(SlotPoolTest, HiddenRemoteTargetPublishes) {
  MakePool(1);
  SlotRef r = (*pool_->Claim(8192, 1))[0];
  ASSERT_TRUE(pool_->CommitHidden(r).ok());
  EXPECT_EQ(State(r), SlotState::kPending);
  ASSERT_TRUE(pool_->PublishRoute(r).ok());
  EXPECT_EQ(State(r), SlotState::kCommitted);
}

TEST_F(SlotPoolTest, WrongTransitionsAreRejected) {
  MakePool(1);
  SlotRef r = (*pool_->Claim(8192, 1))[0];
  EXPECT_FALSE(pool_->PublishRoute(r).ok());
  EXPECT_FALSE(pool_->ReleaseRoute(r).ok());
  EXPECT_FALSE(pool_->AcquireHolder(r).ok());
  EXPECT_FALSE(pool_->ReleaseHolder(r).ok());
  ASSERT_TRUE(pool_->CommitLocalVisible(r).ok());
  EXPECT_FALSE(pool_->Abort(r).ok());
  EXPECT_FALSE(pool_->CommitLocalVisible(r).ok());
  EXPECT_EQ(State(r), SlotState::kPendingLocalVisible);
}

TEST_F(SlotPoolTest, StaleRefFailsAfterReuse) {
  MakePool(1);
  SlotRef r = (*pool_->Claim(kGrantBytes, 1))[0];  // one slot per grant: reuse is certain
  ASSERT_TRUE(pool_->Abort(r).ok());
  SlotRef again = (*pool_->Claim(kGrantBytes, 1))[0];
  EXPECT_EQ(again.index, r.index);
  EXPECT_NE(again.epoch, r.epoch);
  EXPECT_EQ(pool_->Abort(r).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(State(again), SlotState::kPrepared);
  EXPECT_EQ(pool_->Abort(SlotRef{99, 0, 0}).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SlotPoolTest, GrantIsNotTheUnitOfEviction) {
  // S1: freeing one slot of a grant full of committed values makes exactly that slot reusable.
  MakePool(1);
  const uint64_t slot = SlotSizeFor(100 * kMiB);
  auto refs = pool_->Claim(slot, SlotsPerGrant(slot));
  ASSERT_TRUE(refs.ok());
  for (const SlotRef& r : *refs) {
    ASSERT_TRUE(pool_->CommitLocalVisible(r).ok());
    ASSERT_TRUE(pool_->PublishRoute(r).ok());
    ASSERT_TRUE(pool_->ReleaseHolder(r).ok());
  }
  const SlotRef victim = (*refs)[2];
  ASSERT_TRUE(pool_->ReleaseRoute(victim).ok());
  auto reuse = pool_->Claim(slot, 1, milliseconds(50));
  ASSERT_TRUE(reuse.ok()) << reuse.status();
  EXPECT_EQ((*reuse)[0].index, victim.index);
  for (size_t i = 0; i < refs->size(); ++i) {
    if (i != 2) EXPECT_EQ(State((*refs)[i]), SlotState::kCommitted);
  }
  EXPECT_EQ(pool_->Stats().grants, 1u);
}

TEST_F(SlotPoolTest, ClaimTimesOutWithRefillStageAndReservesNothing) {
  SlotPoolOptions o;
  o.claim_soft_timeout = milliseconds(5);
  o.claim_hard_timeout = milliseconds(60);
  std::atomic<int> pressure{0};
  std::atomic<uint64_t> deficit{0};
  o.on_pressure = [&](const PressureEvent& ev) {
    ++pressure;
    deficit = ev.deficit_slots;
  };
  MakePool(1, o);
  auto all = pool_->Claim(kGrantBytes / 2, 2);
  ASSERT_TRUE(all.ok());
  auto t0 = std::chrono::steady_clock::now();
  auto r = pool_->Claim(kGrantBytes / 2, 1);
  auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(PayloadOf(r.status(), kClaimStagePayload), "refill");
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("stage=refill"));
  EXPECT_GE(waited, milliseconds(60));
  EXPECT_LT(waited, milliseconds(2000));
  EXPECT_EQ(pressure.load(), 1);
  EXPECT_EQ(deficit.load(), 1u);
  EXPECT_EQ(pool_->Stats().classes[0].waiting_claims, 0u);
  EXPECT_EQ(pool_->Stats().classes[0].pending_demand_slots, 0u);
  EXPECT_EQ(Count(SlotState::kPrepared), 2);
}

TEST_F(SlotPoolTest, QueuedClaimTimesOutAtClaimTurn) {
  SlotPoolOptions o;
  o.claim_soft_timeout = milliseconds(5);
  o.claim_hard_timeout = milliseconds(2000);
  MakePool(1, o);
  auto all = pool_->Claim(kGrantBytes / 2, 2);
  ASSERT_TRUE(all.ok());
  std::thread first([&] {
    auto r = pool_->Claim(kGrantBytes / 2, 1);  // front of the queue, waits for a release
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) EXPECT_TRUE(pool_->Abort((*r)[0]).ok());
  });
  while (pool_->Stats().classes[0].waiting_claims == 0) std::this_thread::yield();
  auto second = pool_->Claim(kGrantBytes / 2, 1, milliseconds(50));
  EXPECT_EQ(PayloadOf(second.status(), kClaimStagePayload), "claim_turn");
  ASSERT_TRUE(pool_->Abort((*all)[0]).ok());  // serves the first waiter
  first.join();
  ASSERT_TRUE(pool_->Abort((*all)[1]).ok());
  EXPECT_EQ(Count(SlotState::kFree), 2);
  EXPECT_TRUE(pool_->CheckConsistency().ok());
}

TEST_F(SlotPoolTest, WaitingClaimIsServedByARelease) {
  MakePool(1);
  auto all = pool_->Claim(kGrantBytes, 1);
  std::thread releaser([&] {
    std::this_thread::sleep_for(milliseconds(30));
    EXPECT_TRUE(pool_->Abort((*all)[0]).ok());
  });
  auto r = pool_->Claim(kGrantBytes, 1, milliseconds(5000));
  releaser.join();
  ASSERT_TRUE(r.ok()) << r.status();
}

TEST_F(SlotPoolTest, ImpossibleClaimFailsAtOnce) {
  // Waits of seconds, so "at once" is told from any wait with a bound a loaded machine keeps.
  SlotPoolOptions o;
  o.claim_soft_timeout = milliseconds(2'000);
  o.claim_hard_timeout = milliseconds(30'000);
  MakePool(1, o);
  auto t0 = std::chrono::steady_clock::now();
  auto r = pool_->Claim(kGrantBytes / 2, 3);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(500));
  EXPECT_EQ(pool_->Claim(0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_->Claim(kGrantBytes + 1, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_->Claim(4096, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool_->Stats().grants, 0u);
}

TEST_F(SlotPoolTest, ExpectedCapacityPrewarmsAndCapsGrants) {
  SlotPoolOptions o;
  // Two grants' worth of 100 MiB values (5 per grant): 7 values need 2 grants.
  o.expected_capacity = ExpectedCapacity{100 * kMiB, 7 * 100 * kMiB};
  o.claim_soft_timeout = milliseconds(2);
  o.claim_hard_timeout = milliseconds(30);
  MakePool(4, o);
  EXPECT_EQ(pool_->expected_grants(), 2u);
  ASSERT_TRUE(pool_->Prewarm().ok());
  EXPECT_EQ(pool_->Stats().grants, 2u);
  auto refs = pool_->Claim(100 * kMiB, 10);
  ASSERT_TRUE(refs.ok());
  // The cap holds even though the segment has room for two more grants (S5).
  auto more = pool_->Claim(100 * kMiB, 1);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool_->Stats().grants, 2u);
  EXPECT_EQ(pool_->Claim(100 * kMiB, 11).status().code(), absl::StatusCode::kResourceExhausted);
  // Another value size cannot take a grant past the cap either, and says so at once.
  auto other = pool_->Claim(4096, 1);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool_->ShrinkIdleGrants(), 0u);
  for (const SlotRef& r : *refs) ASSERT_TRUE(pool_->Abort(r).ok());
  EXPECT_EQ(pool_->ShrinkIdleGrants(), 0u);
  EXPECT_EQ(pool_->Stats().grants, 2u);
}

TEST_F(SlotPoolTest, ExpectedCapacityLargerThanSegmentIsRejected) {
  SegmentOptions so;
  so.size_bytes = kGrantBytes;
  auto seg = Segment::Create(so);
  SlotPoolOptions o;
  o.expected_capacity = ExpectedCapacity{4'718'592, 2 * kGrantBytes};
  EXPECT_EQ(SlotPool::Create(seg->get(), o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SlotPoolTest, DynamicModeShrinksIdleGrantsDownToTheFloor) {
  SlotPoolOptions o;
  o.shrink_idle = milliseconds(20);
  MakePool(3, o);
  const uint64_t slot = kGrantBytes / 2;
  auto refs = pool_->Claim(slot, 6);  // three grants
  ASSERT_TRUE(refs.ok());
  EXPECT_EQ(pool_->Stats().grants, 3u);
  // Free the slots of the two highest grants; keep one slot in grant 0.
  for (size_t i = 1; i < refs->size(); ++i) ASSERT_TRUE(pool_->Abort((*refs)[i]).ok());
  EXPECT_EQ(pool_->ShrinkIdleGrants(), 0u);  // not idle long enough yet
  std::this_thread::sleep_for(milliseconds(30));
  // Grant 0 is half used; one whole-free grant suffices for nothing pending, so two go back...
  // ...except grant 0's free half does not make it idle.
  EXPECT_EQ(pool_->ShrinkIdleGrants(), 2u);
  EXPECT_EQ(pool_->Stats().grants, 1u);
  EXPECT_EQ(pool_->Stats().grants_shrunk, 2u);
  EXPECT_TRUE(pool_->CheckConsistency().ok());
  EXPECT_EQ(State((*refs)[0]), SlotState::kPrepared);
  // A later claim carves again.
  auto again = pool_->Claim(slot, 3);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(pool_->Stats().grants, 2u);
  EXPECT_TRUE(pool_->CheckConsistency().ok());
}

// An idle owner's maintenance (refill, then shrink, every tick) reaches a fixed point: the
// spare grant a refill carves is never the one the next shrink returns, so nothing is carved,
// populated and punched out again and again (idle CPU would not stay flat).
TEST_F(SlotPoolTest, IdleRefillAndShrinkReachAFixedPoint) {
  SlotPoolOptions o;
  o.shrink_idle = milliseconds(1);
  MakePool(4, o);
  const uint64_t slot = 4 * kMiB;  // 128 slots per grant; the spare is 32 free slots
  auto refs = pool_->Claim(slot, 120);
  ASSERT_TRUE(refs.ok()) << refs.status();
  EXPECT_EQ(pool_->RefillLowClasses(), 1u);  // 8 free < 32: one spare grant
  EXPECT_EQ(pool_->Stats().grants, 2u);
  for (int tick = 0; tick < 5; ++tick) {
    std::this_thread::sleep_for(milliseconds(3));
    EXPECT_EQ(pool_->ShrinkIdleGrants(), 0u) << "tick " << tick;
    EXPECT_EQ(pool_->RefillLowClasses(), 0u) << "tick " << tick;
  }
  EXPECT_EQ(pool_->Stats().grants_shrunk, 0u);
  // Once most values are gone the spare is the free part of grant 0: the idle grant goes back,
  // and the refill that follows has nothing to do.
  for (size_t i = 20; i < refs->size(); ++i) ASSERT_TRUE(pool_->Abort((*refs)[i]).ok());
  std::this_thread::sleep_for(milliseconds(3));
  EXPECT_EQ(pool_->ShrinkIdleGrants(), 1u);
  EXPECT_EQ(pool_->RefillLowClasses(), 0u);
  EXPECT_EQ(pool_->Stats().grants, 1u);
  EXPECT_TRUE(pool_->CheckConsistency().ok());
}

TEST_F(SlotPoolTest, ShrunkPositionCanServeAnotherSizeClass) {
  SlotPoolOptions o;
  o.shrink_idle = milliseconds(1);
  MakePool(1, o);
  auto a = pool_->Claim(kGrantBytes, 1);
  ASSERT_TRUE(pool_->Abort((*a)[0]).ok());
  std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(pool_->ShrinkIdleGrants(), 1u);
  auto b = pool_->Claim(4096, 10);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(pool_->SlotSizeOf((*b)[0]), 4096u);
  EXPECT_FALSE(pool_->Abort((*a)[0]).ok());  // the old ref cannot touch the re-carved grant
  EXPECT_TRUE(pool_->CheckConsistency().ok());
}

// Warm grants: free positions populated ahead (off the claim's path), taken first by a carve
// (which then skips the first touch), refilled by the next PrefaultAhead, and kept populated by
// a shrink while fewer than warm_grants are.
TEST_F(SlotPoolTest, WarmGrantsArePopulatedAheadAndTakenFirst) {
  MakeWarmPool(3);
  SlotPool& pool = *pool_;
  EXPECT_EQ(pool.Stats().warm_grants, 0u);
  EXPECT_EQ(pool.PrefaultAhead(), 1u);  // the highest free position
  EXPECT_EQ(pool.PrefaultAhead(), 0u);  // enough already
  EXPECT_EQ(pool.Stats().warm_grants, 1u);

  auto refs = pool.Claim(kGrantBytes / 4, 4);
  ASSERT_TRUE(refs.ok()) << refs.status();
  EXPECT_EQ((*refs)[0].grant, 2u) << "the carve takes the warm position";
  EXPECT_EQ(pool.Stats().warm_grants, 0u);
  EXPECT_EQ(pool.PrefaultAhead(), 1u);
  EXPECT_EQ(pool.Stats().warm_grants, 1u);
  // The warm memory is usable like any carved grant's.
  auto more = pool.Claim(kGrantBytes / 4, 4);
  ASSERT_TRUE(more.ok());
  EXPECT_EQ((*more)[0].grant, 1u);
  std::memset(reinterpret_cast<void*>(pool.OffsetOf((*more)[3]) + segment_->base()), 0x5a,
              kGrantBytes / 4);

  // Two grants go idle; one warm position exists, so the shrunk ones are punched out and the
  // warm count stays at its target.
  for (const SlotRef& r : *refs) ASSERT_TRUE(pool.Abort(r).ok());
  for (const SlotRef& r : *more) ASSERT_TRUE(pool.Abort(r).ok());
  std::this_thread::sleep_for(milliseconds(3));
  EXPECT_EQ(pool.ShrinkIdleGrants(), 2u);
  EXPECT_EQ(pool.Stats().warm_grants, 1u);
  EXPECT_EQ(pool.Stats().grants, 0u);
  EXPECT_TRUE(pool.CheckConsistency().ok());
}

TEST_F(SlotPoolTest, ShrinkKeepsAGrantWarmWhenBelowTheTarget) {
  MakeWarmPool(1);
  SlotPool& pool = *pool_;
  auto refs = pool.Claim(kGrantBytes / 2, 1);  // carves the only position (nothing warm)
  ASSERT_TRUE(refs.ok());
  EXPECT_EQ(pool.PrefaultAhead(), 0u);  // no free position to warm
  ASSERT_TRUE(pool.Abort((*refs)[0]).ok());
  std::this_thread::sleep_for(milliseconds(3));
  EXPECT_EQ(pool.ShrinkIdleGrants(), 1u);
  EXPECT_EQ(pool.Stats().warm_grants, 1u) << "kept populated, not punched out";
  auto again = pool.Claim(4096, 1);  // another class takes the warm position
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(pool.Stats().warm_grants, 0u);
}

TEST_F(SlotPoolTest, ShrinkKeepsNoMoreWarmGrantsThanTheTarget) {
  MakeWarmPool(3);
  SlotPool& pool = *pool_;
  auto refs = pool.Claim(kGrantBytes, 3);  // all three positions, none warm
  ASSERT_TRUE(refs.ok()) << refs.status();
  for (const SlotRef& r : *refs) ASSERT_TRUE(pool.Abort(r).ok());
  std::this_thread::sleep_for(milliseconds(3));
  EXPECT_EQ(pool.ShrinkIdleGrants(), 3u);  // in one pass: one kept warm, two punched out
  EXPECT_EQ(pool.Stats().warm_grants, 1u);
  EXPECT_TRUE(pool.CheckConsistency().ok());
}

TEST_F(SlotPoolTest, PopulatedGrantMemoryIsWritable) {
  SegmentOptions so;
  so.size_bytes = kGrantBytes;
  auto seg = Segment::Create(so);
  SlotPoolOptions o;
  o.populate_grants = true;
  auto pool = SlotPool::Create(seg->get(), o);
  ASSERT_TRUE(pool.ok());
  auto refs = (*pool)->Claim(kGrantBytes / 4, 4);
  ASSERT_TRUE(refs.ok());
  for (const SlotRef& r : *refs) {
    uint8_t* p = (*pool)->AddressOf(r);
    p[0] = 1;
    p[kGrantBytes / 4 - 1] = 2;
  }
  for (const SlotRef& r : *refs) ASSERT_TRUE((*pool)->Abort(r).ok());
}

// Resident pages of [addr, addr + len), by mincore.
size_t ResidentPages(const uint8_t* addr, size_t len) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((len + page - 1) / page);
  if (mincore(const_cast<uint8_t*>(addr), len, vec.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

// Versions issue, item 7: a claim that carves a cold position waits only for the first touch of
// what it takes (whole 2 MiB units), never for the whole 512 MiB grant; PopulateBehind does the
// rest in bounded steps; a shrunk grant is not populated again.
TEST_F(SlotPoolTest, CarveForAClaimPopulatesWhatItTakesAndTheRestBehind) {
  SegmentOptions so;
  so.size_bytes = 2 * kGrantBytes;
  auto seg = Segment::Create(so);
  ASSERT_TRUE(seg.ok()) << seg.status();
  segment_ = std::move(*seg);
  SlotPoolOptions o;
  o.populate_grants = true;
  o.warm_grants = 0;
  o.shrink_idle = milliseconds(1);
  auto made = SlotPool::Create(segment_.get(), std::move(o));
  ASSERT_TRUE(made.ok()) << made.status();
  pool_ = std::move(*made);
  SlotPool& pool = *pool_;
  auto refs = pool.Claim(4096, 1);
  ASSERT_TRUE(refs.ok()) << refs.status();
  const uint8_t* grant = pool.AddressOf((*refs)[0]);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(ResidentPages(grant, 2 << 20), (2u << 20) / page) << "the claim's part";
  EXPECT_LT(ResidentPages(grant, kGrantBytes), (4u << 20) / page) << "not the whole grant";
  EXPECT_EQ(pool.PopulateBehind(64ull << 20), 64ull << 20);  // bounded per call
  uint64_t total = 64ull << 20;
  for (uint64_t step; (step = pool.PopulateBehind(64ull << 20)) > 0;) total += step;
  EXPECT_EQ(total, kGrantBytes - (2u << 20));
  EXPECT_EQ(ResidentPages(grant, kGrantBytes), kGrantBytes / page);
  EXPECT_EQ(pool.PopulateBehind(64ull << 20), 0u);

  // A carve whose grant shrinks before it was populated behind: nothing more is populated.
  auto other = pool.Claim(8192, 1);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(pool.Abort((*other)[0]).ok());
  ASSERT_TRUE(pool.Abort((*refs)[0]).ok());
  std::this_thread::sleep_for(milliseconds(3));
  ASSERT_EQ(pool.ShrinkIdleGrants(), 2u);
  EXPECT_EQ(pool.PopulateBehind(64ull << 20), 0u);
  EXPECT_TRUE(pool.CheckConsistency().ok());
}

// Cluster hardening, item 12: claims waiting behind the first carve of their class (a first
// touch of 512 MiB can outlast a short claim timeout on a busy machine) do not time out while the
// segment has room.
TEST(SlotPoolCarve, ClaimsBehindTheFirstCarveOfTheirClassDoNotTimeOut) {
  SegmentOptions so;
  so.size_bytes = 2 * kGrantBytes;
  auto seg = Segment::Create(so);
  ASSERT_TRUE(seg.ok()) << seg.status();
  SlotPoolOptions opts;
  opts.populate_grants = true;  // the carve touches every page: much longer than 2 ms
  opts.claim_soft_timeout = milliseconds(1);
  opts.claim_hard_timeout = milliseconds(2);
  auto pool = SlotPool::Create(seg->get(), std::move(opts));
  ASSERT_TRUE(pool.ok()) << pool.status();
  constexpr int kClaimers = 8;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  std::vector<std::vector<SlotRef>> got(kClaimers);
  for (int i = 0; i < kClaimers; ++i) {
    threads.emplace_back([&, i] {
      auto r = (*pool)->Claim(64 * 1024, 1);
      if (r.ok()) {
        got[i] = *r;
        ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kClaimers);
  EXPECT_EQ((*pool)->Stats().claim_timeouts, 0u);
  for (auto& refs : got) {
    for (const SlotRef& r : refs) EXPECT_TRUE((*pool)->Abort(r).ok());
  }
}

}  // namespace
}  // namespace fluxon
