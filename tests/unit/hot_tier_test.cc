// HotTier and its eviction policies: chain order (tail first), S4 ownership transfer, the previous
// default (reuse prediction). The default, AdaptiveChainPolicy: tests/unit/eviction_policy_test.
#include "owner/hot_tier.h"

#include <gtest/gtest.h>

#include <vector>

#include "cohort_test_util.h"
#include "eviction/baseline_policies.h"
#include "eviction/eviction_replay.h"

namespace fluxon {
namespace {

using testing::Ids;

// No fingerprints: the cohorts have no keys to derive one from.
Cohort Make(uint64_t id, uint64_t weight = 1) { return testing::MakeCohort(id, weight, 0); }
std::vector<Cohort> Chain(uint64_t first, uint64_t n) { return testing::MakeChain(first, n, 0); }

TEST(HotTierTest, VictimsComeFromTheTailOfTheirChain) {
  HotTier<> tier;
  tier.AdmitChain(Chain(1, 4));
  EXPECT_EQ(Ids(tier.TakeVictims(2)), (std::vector<uint64_t>{4, 3}));
  EXPECT_EQ(tier.weight(), 2u);
  EXPECT_EQ(tier.size(), 2u);
}

TEST(HotTierTest, WeightIsCountedInBytesNotCohorts) {
  HotTier<> tier;
  tier.AdmitChain({Make(1, 100), Make(2, 300)});
  EXPECT_EQ(tier.weight(), 400u);
  const auto v = tier.TakeVictims(250);  // the tail (300) covers it alone
  EXPECT_EQ(Ids(v), (std::vector<uint64_t>{2}));
  EXPECT_EQ(tier.weight(), 100u);
}

TEST(HotTierTest, S4ReadmittedCohortReturnsToItsChainTail) {
  HotTier<> tier;
  tier.AdmitChain(Chain(1, 3));
  auto v = tier.TakeVictims(1);
  ASSERT_EQ(Ids(v), (std::vector<uint64_t>{3}));
  EXPECT_EQ(v[0].after, 2u);
  tier.Readmit(std::move(v[0]));  // pinned: not evicted, not lost
  EXPECT_EQ(tier.size(), 3u);
  EXPECT_EQ(Ids(tier.TakeVictims(3)), (std::vector<uint64_t>{3, 2, 1}));
  EXPECT_EQ(tier.weight(), 0u);
  EXPECT_TRUE(tier.TakeVictims(1).empty());
}

TEST(HotTierTest, CopiedCohortsGoFirstLeastRecentlyUsedFromAnywhereInTheirChain) {
  HotTier<> tier;
  std::vector<Cohort> chain = Chain(1, 5);
  chain[1].copied_elsewhere = true;  // e.g. a copy fetched from a peer: copied on admission
  chain[1].keys = {"b"};
  chain[3].keys = {"d1", "d2"};
  tier.AdmitChain(std::move(chain));
  // A group is marked only when every member it has is copied.
  EXPECT_FALSE(tier.MarkCopied(4, {"d1"}));
  EXPECT_TRUE(tier.MarkCopied(4, {"d2", "d1"}));
  EXPECT_FALSE(tier.MarkCopied(99, {}));  // not here
  EXPECT_EQ(tier.copied_cohorts(), 2u);
  tier.Touch({2});  // 2 used after 4 was marked: 4 is the least recently used copied cohort
  auto first = tier.TakeCopied(1);
  ASSERT_EQ(Ids(first), (std::vector<uint64_t>{4}));
  EXPECT_EQ(first[0].after, 3u);  // from the middle of its chain
  EXPECT_EQ(tier.weight(), 4u);
  // Refused by the master (no other live copy): back unmarked, where it was.
  first[0].copied_elsewhere = false;
  tier.Readmit(std::move(first[0]));
  EXPECT_EQ(Ids(tier.TakeCopied(10)), (std::vector<uint64_t>{2}));
  EXPECT_TRUE(tier.TakeCopied(10).empty());
  EXPECT_EQ(tier.copied_cohorts(), 0u);
  // The rest go by the policy, tail first.
  EXPECT_EQ(Ids(tier.TakeVictims(4)), (std::vector<uint64_t>{5, 4, 3, 1}));
}

TEST(HotTierTest, AVictimOrAForgottenCohortLeavesTheCopiedList) {
  HotTier<> tier;
  tier.AdmitChain(Chain(1, 2));
  ASSERT_TRUE(tier.MarkCopied(2, {}));
  ASSERT_TRUE(tier.MarkCopied(1, {}));
  EXPECT_EQ(Ids(tier.TakeVictims(1)), (std::vector<uint64_t>{2}));
  EXPECT_EQ(tier.copied_cohorts(), 1u);
  EXPECT_TRUE(tier.ForgetIfAllUnder(1, ""));
  EXPECT_EQ(tier.copied_cohorts(), 0u);
  EXPECT_TRUE(tier.TakeCopied(10).empty());
}

TEST(HotTierTest, AProbeThenAReadIsOneAccess) {
  // Every 8 ticks: B is read once; two ticks later A is probed and read. Both come back every 8
  // ticks and A was last seen later, so A is predicted back last and goes first. Counting A's
  // probe as an access of its own would shrink A's period to about half and take B instead.
  HotTier<ReusePredictionPolicy> tier;
  tier.AdmitChain(Chain(1, 1));            // A
  tier.AdmitChain(Chain(10, 1));           // B
  auto tick = [&] { tier.Touch({999}); };  // another request: the clock advances
  for (int round = 0; round < 4; ++round) {
    tier.Touch({10});  // B
    tick();
    tier.Touch({1});  // A: batch_exists
    tier.Touch({1});  // A: batch_get
    for (int i = 0; i < 4; ++i) tick();
  }
  EXPECT_EQ(Ids(tier.TakeVictims(1)), (std::vector<uint64_t>{1}));
}

TEST(HotTierTest, ChainPredictedToReturnLastGoesFirst) {
  // Two chains with the same reuse period; A was accessed more recently, so B returns sooner.
  HotTier<ReusePredictionPolicy> tier;
  tier.AdmitChain(Chain(1, 2));   // A
  tier.AdmitChain(Chain(10, 2));  // B
  tier.Touch({2, 1});
  tier.Touch({11, 10});
  tier.Touch({2, 1});
  tier.Touch({11, 10});
  tier.Touch({2, 1});  // A: period 2, last 7 -> next ~9; B: period 2, last 6 -> next ~8
  EXPECT_EQ(Ids(tier.TakeVictims(1)), (std::vector<uint64_t>{2}));
}

TEST(HotTierTest, OverdueChainGoesBeforeLiveOnes) {
  HotTier<ReusePredictionPolicy> tier;
  tier.AdmitChain(Chain(1, 1));   // A: used once, then forgotten
  tier.AdmitChain(Chain(10, 1));  // B and C: steady period 2
  tier.AdmitChain(Chain(20, 1));
  tier.Touch({1});
  for (int i = 0; i < 6; ++i) {
    tier.Touch({10});
    tier.Touch({20});
  }
  // A's last access is 10 ticks old with a period of 3: overdue, whereas B and C are due soon.
  EXPECT_EQ(Ids(tier.TakeVictims(1)), (std::vector<uint64_t>{1}));
}

TEST(HotTierTest, ForgetDropsOnlyCohortsWhollyUnderThePrefix) {
  HotTier<> tier;
  Cohort a = Make(1, 10), mixed = Make(2, 20);
  a.keys = {"ns:a", "ns:b"};
  mixed.keys = {"ns:c", "other:d"};
  tier.AdmitChain({a, mixed});
  EXPECT_FALSE(tier.ForgetIfAllUnder(2, "ns:"));
  EXPECT_TRUE(tier.ForgetIfAllUnder(1, "ns:"));
  EXPECT_FALSE(tier.ForgetIfAllUnder(1, "ns:"));  // gone already
  EXPECT_EQ(tier.weight(), 20u);
  EXPECT_EQ(Ids(tier.TakeVictims(100)), (std::vector<uint64_t>{2}));
}

TEST(HotTierTest, LruPolicyEvictsLeastRecentlyUsed) {
  HotTier<LruPolicy> tier;
  tier.AdmitChain({Make(1)});
  tier.AdmitChain({Make(2)});
  tier.AdmitChain({Make(3)});
  tier.Touch({1});
  EXPECT_EQ(Ids(tier.TakeVictims(2)), (std::vector<uint64_t>{2, 3}));
}

}  // namespace
}  // namespace fluxon
