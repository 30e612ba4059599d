// HotTier and its eviction policies: chain order (tail first), S4 ownership transfer, the previous
// default (reuse prediction). The default, AdaptiveChainPolicy: tests/unit/eviction_policy_test.
#include "owner/hot_tier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
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

// A cohort split in two (a remote_cache asked to drop some of its values while others are read)
// and both parts readmitted: one cohort under its id, with both parts' keys and weight, and the
// policy listing it once — before, the second admission left the policy naming a victim the
// tier no longer held (a remote_cache crashed on it under the capacity-split benchmark).
TEST(HotTierTest, TwoPartsOfOneCohortReadmittedAreOneCohort) {
  HotTier<> tier;
  std::vector<Cohort> chain = Chain(1, 3);
  chain[2].keys = {"c1", "c2", "c3"};
  chain[2].weight = 3;
  tier.AdmitChain(std::move(chain));
  auto v = tier.TakeVictims(1);
  ASSERT_EQ(Ids(v), (std::vector<uint64_t>{3}));
  Cohort stay = v[0], pinned = v[0];
  stay.keys = {"c2", "c3"};
  stay.weight = 2;
  pinned.keys = {"c1"};
  pinned.weight = 1;
  tier.Readmit(std::move(stay));
  tier.Readmit(std::move(pinned));
  EXPECT_EQ(tier.size(), 3u);
  EXPECT_EQ(tier.weight(), 5u);
  EXPECT_EQ(tier.InspectPolicy([](const AdaptiveChainPolicy& p) { return p.CheckInvariants(); }),
            "");
  EXPECT_EQ(tier.InspectPolicy([](const AdaptiveChainPolicy& p) { return p.cohorts(); }), 3u);
  // Everything leaves once, the split cohort whole.
  std::vector<Cohort> all = tier.TakeVictims(100);
  ASSERT_EQ(Ids(all), (std::vector<uint64_t>{3, 2, 1}));
  std::vector<std::string> keys = all[0].keys;
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"c1", "c2", "c3"}));
  EXPECT_EQ(all[0].weight, 3u);
  EXPECT_EQ(tier.weight(), 0u);
  EXPECT_EQ(tier.size(), 0u);
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

// One ranking for both tiers: a cohort keyed "k<id>", put_id 7.
Cohort Keyed(uint64_t id, uint64_t weight = 10) {
  Cohort c = Make(id, weight);
  c.put_id = 7;
  c.keys = {"k" + std::to_string(id)};
  return c;
}

TEST(HotTierOneRankingTest, ADemotedCohortStaysRankedAndCountsInTheRemoteTier) {
  HotTier<> tier;
  tier.EnableOneRanking();
  tier.AdmitChain({Keyed(1), Keyed(2), Keyed(3)});
  // The local list's cold end is the least recently used: the first admitted.
  std::vector<Cohort> moving = tier.TakeLocal(10);
  ASSERT_EQ(Ids(moving), (std::vector<uint64_t>{1}));
  EXPECT_TRUE(moving[0].moving);
  EXPECT_EQ(tier.weight(), 30u);  // held here until the move ends
  ASSERT_TRUE(tier.EndMove(1, /*local_freed=*/true, "rc:1"));
  EXPECT_EQ(tier.weight(), 20u);
  EXPECT_EQ(tier.remote_weight(), 10u);
  EXPECT_EQ(tier.size(), 3u);  // still ranked
  EXPECT_EQ(tier.RemoteCohortOf("k1", 7), 1u);
  EXPECT_EQ(tier.RemoteCohortOf("k1", 8), 0u);  // another identity of the key
  EXPECT_EQ(tier.RemoteCohortOf("k2", 7), 0u);  // held here only
  // A remote cohort is not local: the next move takes the next coldest.
  EXPECT_EQ(Ids(tier.TakeLocal(10)), (std::vector<uint64_t>{2}));
  ASSERT_TRUE(tier.EndMove(2, /*local_freed=*/false, {}));  // kept: back to the cold end
  EXPECT_EQ(Ids(tier.TakeLocal(10)), (std::vector<uint64_t>{2}));
  ASSERT_TRUE(tier.EndMove(2, false, {}));
  // The policy still sees all three: its victims come from the tail, wherever it is held.
  std::vector<Cohort> victims = tier.TakeVictims(30);
  EXPECT_EQ(Ids(victims), (std::vector<uint64_t>{3, 2, 1}));
  EXPECT_EQ(victims[2].remote_address, "rc:1");
  EXPECT_FALSE(victims[2].local);
  EXPECT_EQ(tier.weight(), 0u);
  EXPECT_EQ(tier.remote_weight(), 0u);
  EXPECT_EQ(tier.RemoteCohortOf("k1", 7), 0u);
}

TEST(HotTierOneRankingTest, AFetchedBackCohortIsLocalAgainAndMostRecentlyUsed) {
  HotTier<> tier;
  tier.EnableOneRanking();
  tier.AdmitChain({Keyed(1), Keyed(2)});
  ASSERT_EQ(Ids(tier.TakeLocal(10)), (std::vector<uint64_t>{1}));
  ASSERT_TRUE(tier.EndMove(1, true, "rc:1"));
  ASSERT_TRUE(tier.Relocalised(1));
  EXPECT_EQ(tier.weight(), 20u);
  EXPECT_EQ(tier.remote_weight(), 10u);  // held in both tiers until its copy there is dropped
  // Cohort 2 is now the coldest here; cohort 1 keeps its copy's place while moving again.
  std::vector<Cohort> moving = tier.TakeLocal(20);
  ASSERT_EQ(Ids(moving), (std::vector<uint64_t>{2, 1}));
  EXPECT_EQ(moving[1].remote_address, "rc:1");
  EXPECT_TRUE(tier.TakeRemoteToDrop().empty());  // not while it moves
  ASSERT_TRUE(tier.EndMove(1, true, {}));        // released: the copy there stays
  EXPECT_EQ(tier.remote_weight(), 10u);
  EXPECT_EQ(tier.RemoteCohortOf("k1", 7), 1u);
  EXPECT_FALSE(tier.Relocalised(3));  // not here
  ASSERT_TRUE(tier.EndMove(2, false, {}));
}

TEST(HotTierOneRankingTest, ACohortFetchedBackOrPutAgainGivesUpItsRemoteCopy) {
  HotTier<> tier;
  tier.EnableOneRanking();
  tier.AdmitChain({Keyed(1), Keyed(2)});
  ASSERT_EQ(tier.TakeLocal(20).size(), 2u);
  ASSERT_TRUE(tier.EndMove(1, true, "rc:1"));
  ASSERT_TRUE(tier.EndMove(2, true, "rc:2"));
  ASSERT_TRUE(tier.Relocalised(1));  // fetched back: a duplicate at rest
  Cohort again = Keyed(3);
  again.keys = {"k2"};  // k2 put again: another identity
  tier.AdmitChain({again});
  std::vector<Cohort> drop = tier.TakeRemoteToDrop();
  ASSERT_EQ(Ids(drop), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(drop[0].remote_address, "rc:1");
  EXPECT_EQ(drop[1].remote_address, "rc:2");
  EXPECT_EQ(tier.remote_weight(), 0u);
  EXPECT_EQ(tier.size(), 2u);  // 1 (held here) and 3; 2 was held only there
  EXPECT_EQ(tier.weight(), 20u);
  EXPECT_EQ(tier.RemoteCohortOf("k1", 7), 0u);
  EXPECT_TRUE(tier.TakeRemoteToDrop().empty());
}

TEST(HotTierOneRankingTest, AVictimTakenWhileItMovesEndsItsMove) {
  HotTier<> tier;
  tier.EnableOneRanking();
  tier.AdmitChain({Keyed(1)});
  ASSERT_EQ(Ids(tier.TakeLocal(10)), (std::vector<uint64_t>{1}));
  std::vector<Cohort> victims = tier.TakeVictims(10);
  ASSERT_EQ(Ids(victims), (std::vector<uint64_t>{1}));
  EXPECT_TRUE(victims[0].moving);  // whoever moves it evicts it
  EXPECT_FALSE(tier.EndMove(1, true, "rc:1"));
  EXPECT_EQ(tier.weight(), 0u);
  EXPECT_EQ(tier.remote_weight(), 0u);
  EXPECT_EQ(tier.size(), 0u);
}

TEST(HotTierOneRankingTest, ALostRemoteCopyLeavesTheRankingUnlessHeldHere) {
  HotTier<> tier;
  tier.EnableOneRanking();
  tier.AdmitChain({Keyed(1), Keyed(2)});
  ASSERT_EQ(tier.TakeLocal(20).size(), 2u);
  ASSERT_TRUE(tier.EndMove(1, true, "rc:1"));
  ASSERT_TRUE(tier.EndMove(2, false, "rc:1"));  // copied, but still held here (pinned)
  EXPECT_EQ(tier.remote_weight(), 20u);
  tier.ForgetRemoteCopy(1);
  tier.ForgetRemoteCopy(2);
  EXPECT_EQ(tier.size(), 1u);
  EXPECT_EQ(tier.remote_weight(), 0u);
  EXPECT_EQ(tier.weight(), 10u);
  EXPECT_EQ(Ids(tier.TakeLocal(10)), (std::vector<uint64_t>{2}));
}

TEST(HotTierOneRankingTest, AnAccessMovesALocalCohortToTheWarmEnd) {
  HotTier<> tier;
  tier.EnableOneRanking();
  tier.AdmitChain({Keyed(1), Keyed(2), Keyed(3)});
  tier.Touch({1});
  EXPECT_EQ(Ids(tier.TakeLocal(20)), (std::vector<uint64_t>{2, 3}));
}

TEST(HotTierOneRankingTest, OffByDefaultNothingIsListed) {
  HotTier<> tier;
  tier.AdmitChain({Keyed(1)});
  EXPECT_TRUE(tier.TakeLocal(10).empty());
  EXPECT_EQ(tier.remote_weight(), 0u);
}

TEST(HotTierOneRankingTest, ADeleteTakesTheRemoteCopiesUnderItsPrefix) {
  HotTier<> tier;
  tier.EnableOneRanking();
  Cohort both = Keyed(3);
  both.keys = {"k3", "x3"};  // one key outside the prefix: its copy stays
  tier.AdmitChain({Keyed(1), Keyed(2), both});
  ASSERT_EQ(tier.TakeLocal(30).size(), 3u);
  ASSERT_TRUE(tier.EndMove(1, true, "rc:1"));
  ASSERT_TRUE(tier.EndMove(2, false, "rc:1"));  // held in both tiers
  ASSERT_TRUE(tier.EndMove(3, true, "rc:1"));
  std::vector<Cohort> taken = tier.TakeRemoteUnder("k");
  EXPECT_EQ(Ids(taken), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(tier.size(), 2u);  // 2 stays, held here; 1 was held only there
  EXPECT_EQ(tier.remote_weight(), 10u);
  EXPECT_EQ(tier.RemoteCohortOf("k3", 7), 3u);
  EXPECT_EQ(tier.RemoteCohortOf("k2", 7), 0u);
}

TEST(HotTierOneRankingTest, GivingUpTheRemoteCopyKeepsTheLocalPlace) {
  HotTier<> tier;
  tier.EnableOneRanking();
  tier.AdmitChain({Keyed(1), Keyed(2), Keyed(3)});
  ASSERT_EQ(Ids(tier.TakeLocal(10)), (std::vector<uint64_t>{1}));
  ASSERT_TRUE(tier.EndMove(1, true, "rc:1"));
  ASSERT_TRUE(tier.Relocalised(1));  // the warm end
  ASSERT_EQ(Ids(tier.TakeRemoteToDrop()), (std::vector<uint64_t>{1}));
  // Still the warmest here: the next to move out are 2 and 3, not the value just read.
  EXPECT_EQ(Ids(tier.TakeLocal(20)), (std::vector<uint64_t>{2, 3}));
}

// With keep_fetched_copies, a cohort fetched back keeps its copy there and is the first to
// leave here: releasing it moves no data, where another cohort would have to be demoted.
TEST(HotTierOneRankingTest, AFetchedBackCohortKeepingItsCopyIsReleasedFirst) {
  HotTier<> tier;
  tier.EnableOneRanking(/*keep_fetched_copies=*/true);
  tier.AdmitChain({Keyed(1), Keyed(2), Keyed(3)});
  ASSERT_EQ(Ids(tier.TakeLocal(10)), (std::vector<uint64_t>{1}));
  ASSERT_TRUE(tier.EndMove(1, true, "rc:1"));
  ASSERT_TRUE(tier.Relocalised(1));
  tier.Touch({1});  // the read that fetched it
  EXPECT_EQ(tier.weight(), 30u);
  EXPECT_EQ(tier.remote_weight(), 10u);
  EXPECT_EQ(tier.both_weight(), 10u);            // one cohort, counted in both tiers
  EXPECT_EQ(tier.ranked_weight(), 30u);          // ... and ranked once
  EXPECT_TRUE(tier.TakeRemoteToDrop().empty());  // its copy there stays
  // Warmest here, yet the first to move out: 2 and 3 would need a demotion each.
  std::vector<Cohort> moving = tier.TakeLocal(20);
  ASSERT_EQ(Ids(moving), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(moving[0].remote_address, "rc:1");
  ASSERT_TRUE(tier.EndMove(1, /*local_freed=*/true, {}));  // released: held there only
  EXPECT_EQ(tier.both_weight(), 0u);
  EXPECT_EQ(tier.weight(), 20u);
  EXPECT_EQ(tier.remote_weight(), 10u);
  EXPECT_EQ(tier.RemoteCohortOf("k1", 7), 1u);
  ASSERT_TRUE(tier.EndMove(2, false, {}));
  EXPECT_EQ(Ids(tier.TakeLocal(10)), (std::vector<uint64_t>{2}));  // 1 is not here any more
  ASSERT_TRUE(tier.EndMove(2, false, {}));
}

TEST(HotTierOneRankingTest, CohortsHeldInBothTiersGoInTheirOwnRecencyOrder) {
  HotTier<> tier;
  tier.EnableOneRanking(/*keep_fetched_copies=*/true);
  tier.AdmitChain({Keyed(1), Keyed(2), Keyed(3), Keyed(4)});
  ASSERT_EQ(tier.TakeLocal(20).size(), 2u);
  ASSERT_TRUE(tier.EndMove(1, true, "rc:1"));
  ASSERT_TRUE(tier.EndMove(2, true, "rc:1"));
  ASSERT_TRUE(tier.Relocalised(1));
  ASSERT_TRUE(tier.Relocalised(2));
  tier.Touch({1});  // 2 is now the colder of the two
  EXPECT_EQ(Ids(tier.TakeLocal(10)), (std::vector<uint64_t>{2}));
  ASSERT_TRUE(tier.EndMove(2, false, {}));  // kept (pinned): the cold end of its list
  // Its copy there is lost (the remote_cache's own eviction): local only, still the coldest.
  tier.ForgetRemoteCopy(2);
  EXPECT_EQ(tier.both_weight(), 10u);
  EXPECT_EQ(tier.remote_weight(), 10u);
  EXPECT_EQ(Ids(tier.TakeLocal(30)), (std::vector<uint64_t>{1, 2, 3}));
  for (uint64_t id : {1, 2, 3}) ASSERT_TRUE(tier.EndMove(id, false, {}));
  // A victim held in both tiers leaves both weights.
  std::vector<Cohort> victims = tier.TakeVictims(40);
  EXPECT_EQ(victims.size(), 4u);
  EXPECT_EQ(tier.both_weight(), 0u);
  EXPECT_EQ(tier.weight(), 0u);
  EXPECT_EQ(tier.remote_weight(), 0u);
}

}  // namespace
}  // namespace fluxon
