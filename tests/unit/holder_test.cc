#include "holder/holder.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "fluxon/units.h"

namespace fluxon {
namespace {

class HolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SegmentOptions so;
    so.size_bytes = kGrantBytes;
    so.node_id = 5;
    segment_ = std::move(*Segment::Create(so));
    SlotPoolOptions po;
    po.populate_grants = false;
    pool_ = std::move(*SlotPool::Create(segment_.get(), po));
  }
  SlotRef ClaimOne() { return (*pool_->Claim(10'000, 1))[0]; }

  std::unique_ptr<Segment> segment_;
  std::unique_ptr<SlotPool> pool_;
};

TEST_F(HolderTest, CommitMakesAResidentHolderWithMemoryInfo) {
  SlotRef slot = ClaimOne();
  auto h = HolderRef::CommitLocalVisible(pool_.get(), slot, "k1", 77, 10'000);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ((*h)->key, "k1");
  EXPECT_EQ((*h)->put_id, 77u);
  EXPECT_EQ((*h)->len, 10'000u);
  EXPECT_EQ((*h)->offset, pool_->OffsetOf(slot));
  EXPECT_EQ((*h)->node_id, 5u);
  EXPECT_EQ((*h)->generation, segment_->generation());
  EXPECT_EQ(*pool_->StateOf(slot), SlotState::kPendingLocalVisible);
  EXPECT_EQ(pool_->HolderCountOf(slot), 1u);
}

TEST_F(HolderTest, PinsShareOneHolderAndTheLastDropFreesAnUnroutedSlot) {
  SlotRef slot = ClaimOne();
  auto resident = HolderRef::CommitLocalVisible(pool_.get(), slot, "k", 1, 100);
  ASSERT_TRUE(resident.ok());
  HolderRef pin1 = *resident;
  HolderRef pin2 = pin1;
  EXPECT_EQ(pool_->HolderCountOf(slot), 1u);  // copies pin without touching the pool
  EXPECT_EQ(pin1.use_count(), 3);
  resident->reset();
  pin1.reset();
  EXPECT_EQ(*pool_->StateOf(slot), SlotState::kPendingLocalVisible);
  pin2.reset();
  EXPECT_EQ(*pool_->StateOf(slot), SlotState::kFree);
}

TEST_F(HolderTest, HolderOutlivesRouteThenFrees) {
  SlotRef slot = ClaimOne();
  auto resident = HolderRef::CommitLocalVisible(pool_.get(), slot, "k", 1, 100);
  ASSERT_TRUE(pool_->PublishRoute(slot).ok());
  HolderRef reader = *resident;
  resident->reset();
  ASSERT_TRUE(pool_->ReleaseRoute(slot).ok());
  EXPECT_EQ(*pool_->StateOf(slot), SlotState::kReleasing);
  reader.reset();
  EXPECT_EQ(*pool_->StateOf(slot), SlotState::kFree);
  EXPECT_TRUE(pool_->CheckConsistency().ok());
}

TEST_F(HolderTest, SecondMemoryInfoCountsSeparately) {
  SlotRef slot = ClaimOne();
  auto a = HolderRef::CommitLocalVisible(pool_.get(), slot, "k", 1, 100);
  auto b = HolderRef::Acquire(pool_.get(), slot, "k", 1, 100);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool_->HolderCountOf(slot), 2u);
  a->reset();
  EXPECT_EQ(*pool_->StateOf(slot), SlotState::kPendingLocalVisible);
  b->reset();
  EXPECT_EQ(*pool_->StateOf(slot), SlotState::kFree);
}

TEST_F(HolderTest, BadLengthIsRejectedWithoutStateChange) {
  SlotRef slot = ClaimOne();
  EXPECT_FALSE(HolderRef::CommitLocalVisible(pool_.get(), slot, "k", 1, 0).ok());
  EXPECT_FALSE(HolderRef::CommitLocalVisible(pool_.get(), slot, "k", 1, 20'000).ok());
  EXPECT_EQ(*pool_->StateOf(slot), SlotState::kPrepared);
}

TEST_F(HolderTest, RegistryIdsAreNonZeroUniqueAndBoundToGeneration) {
  HolderRegistry reg(segment_->generation());
  SlotRef slot = ClaimOne();
  HolderRef h = *HolderRef::CommitLocalVisible(pool_.get(), slot, "k", 1, 100);
  std::set<uint64_t> ids;
  for (int i = 0; i < 100; ++i) {
    uint64_t id = reg.Export(h);
    EXPECT_NE(id, 0u);
    EXPECT_TRUE(ids.insert(id).second);
  }
  EXPECT_EQ(reg.size(), 100u);
  const uint64_t some = *ids.begin();
  EXPECT_EQ(reg.Release(some, segment_->generation() + 1).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(reg.Get(some).ok());
  EXPECT_TRUE(reg.Release(some, segment_->generation()).ok());
  EXPECT_EQ(reg.Release(some, segment_->generation()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.Release(0, segment_->generation()).code(), absl::StatusCode::kInvalidArgument);
  // A released ID is never handed out again.
  EXPECT_FALSE(ids.contains(reg.Export(h)));
  h.reset();
  for (uint64_t id : ids) (void)reg.Release(id, segment_->generation());
  EXPECT_EQ(*pool_->StateOf(slot), SlotState::kPendingLocalVisible);  // one export left
}

TEST_F(HolderTest, ExportedHolderPinsUntilReleased) {
  HolderRegistry reg(segment_->generation());
  SlotRef slot = ClaimOne();
  uint64_t id = reg.Export(*HolderRef::CommitLocalVisible(pool_.get(), slot, "k", 1, 100));
  EXPECT_EQ(*pool_->StateOf(slot), SlotState::kPendingLocalVisible);
  ASSERT_TRUE(reg.Release(id, reg.generation()).ok());
  EXPECT_EQ(*pool_->StateOf(slot), SlotState::kFree);
}

}  // namespace
}  // namespace fluxon
