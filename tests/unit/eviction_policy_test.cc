// AdaptiveChainPolicy (the HotTier default) and the replayed acceptance traces: tail
// first within a chain (E1), shared prefixes kept while a branch lives, cohorts never split (E2),
// S4 readmits lossless, probation as a one-hit filter that cyclic traffic leaves open, ghost
// regret moving the weights the right way, bounded metadata, and the hit rates against the
// baselines and Belady.
#include "eviction/baseline_policies.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cohort_test_util.h"
#include "eviction/eviction_replay.h"
#include "eviction/selecting_policy.h"
#include "eviction/trace_suite.h"
#include "owner/hot_tier.h"

namespace fluxon {
namespace {

using namespace eviction_replay;

using testing::Ids;

// Every cohort here carries a fingerprint (1000 + id) for the ghost lists.
constexpr uint64_t kFingerprintBase = 1000;
Cohort Make(uint64_t id, uint64_t weight = 1) {
  return testing::MakeCohort(id, weight, kFingerprintBase);
}
std::vector<Cohort> Chain(uint64_t first, uint64_t n) {
  return testing::MakeChain(first, n, kFingerprintBase);
}

size_t IndexOf(const std::vector<uint64_t>& v, uint64_t id) {
  return static_cast<size_t>(std::find(v.begin(), v.end(), id) - v.begin());
}

// An adaptive policy that starts undecided (0.5 / 0.5), to see which way the ghosts move it.
struct Undecided : AdaptiveChainPolicy {
  Undecided() : AdaptiveChainPolicy(Mode::kAdaptive, 0.5) {}
};

struct RecencyOnly : AdaptiveChainPolicy {
  RecencyOnly() : AdaptiveChainPolicy(Mode::kRecencyOnly) {}
};

struct PredictionOnly : AdaptiveChainPolicy {
  PredictionOnly() : AdaptiveChainPolicy(Mode::kPredictionOnly) {}
};

TEST(AdaptiveChainPolicyTest, VictimsComeFromTheTailOfTheirChain) {
  HotTier<AdaptiveChainPolicy> tier;
  tier.AdmitChain(Chain(1, 4));
  EXPECT_EQ(Ids(tier.TakeVictims(2)), (std::vector<uint64_t>{4, 3}));
  EXPECT_EQ(Ids(tier.TakeVictims(2)), (std::vector<uint64_t>{2, 1}));
}

TEST(AdaptiveChainPolicyTest, ASharedPrefixOutlivesEveryBranchBuiltOnIt) {
  // A system prompt (1, 2) with conversation A (3, 4) in one batch; B (10, 11) and C (20) branch
  // off page 2. Whatever the experts prefer, 1 and 2 go only after every branch, 2 before 1.
  for (bool touch_prefix : {false, true}) {
    HotTier<AdaptiveChainPolicy> tier;
    tier.AdmitChain(Chain(1, 4));
    tier.AdmitChain(Chain(10, 2), /*parent=*/2);
    tier.AdmitChain(Chain(20, 1), /*parent=*/2);
    if (touch_prefix) tier.Touch({2, 1});  // the prefix is the hottest: still last
    const auto v = Ids(tier.TakeVictims(7));
    SCOPED_TRACE(touch_prefix);
    ASSERT_EQ(v.size(), 7u);
    EXPECT_EQ(IndexOf(v, 2), 5u);
    EXPECT_EQ(IndexOf(v, 1), 6u);
    EXPECT_LT(IndexOf(v, 4), IndexOf(v, 3));  // A tail first
    EXPECT_LT(IndexOf(v, 11), IndexOf(v, 10));
  }
}

TEST(AdaptiveChainPolicyTest, AnAtomicGroupIsOneVictimWithAllItsKeys) {
  HotTier<AdaptiveChainPolicy> tier;
  Cohort g = Make(1, 300);
  g.keys = {"k0", "k1", "k2"};
  Cohort h = Make(2, 100);
  h.keys = {"k3"};
  tier.AdmitChain({g, h});
  auto v = tier.TakeVictims(150);  // the tail (100) is not enough: the whole group follows
  ASSERT_EQ(Ids(v), (std::vector<uint64_t>{2, 1}));
  EXPECT_EQ(v[1].keys, (std::vector<std::string>{"k0", "k1", "k2"}));
  EXPECT_EQ(v[1].weight, 300u);
  EXPECT_EQ(tier.weight(), 0u);
}

TEST(AdaptiveChainPolicyTest, S4ReadmitIsLosslessAndReturnsUnderItsParent) {
  HotTier<AdaptiveChainPolicy> tier;
  tier.AdmitChain(Chain(1, 2));
  tier.AdmitChain(Chain(10, 1), /*parent=*/2);  // a branch: 2 is kept while 10 lives
  auto v = tier.TakeVictims(1);
  ASSERT_EQ(v.size(), 1u);
  const uint64_t first = v[0].id;
  ASSERT_TRUE(first == 10 || first == 2) << first;  // 2 is its chain's tail after the split
  EXPECT_EQ(v[0].after, first == 10 ? 2u : 1u) << "the predecessor is recorded for the readmit";
  const double w = tier.InspectPolicy([](const auto& p) { return p.prediction_weight(); });
  tier.Readmit(std::move(v[0]));  // pinned: not evicted, not lost
  EXPECT_EQ(tier.size(), 3u);
  EXPECT_EQ(tier.weight(), 3u);
  // A readmit is not a miss: no regret from the ghost entry the eviction left.
  EXPECT_EQ(tier.InspectPolicy([](const auto& p) { return p.prediction_weight(); }), w);
  const auto all = Ids(tier.TakeVictims(3));
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all.back(), 1u);
  EXPECT_EQ(tier.weight(), 0u);
  EXPECT_TRUE(tier.TakeVictims(1).empty());
}

// The prediction expert's candidate among chains on probation is the newest one not accessed in
// the last few ticks (chains being served now are not victims), however many recent chains
// there are: cohorts put back at one tick (pinned values an eviction round could not take) are
// all recent, and the candidate is found past them by the index's order, not by a walk.
TEST(AdaptiveChainPolicyTest, TheProbationCandidateIsTheNewestChainThatIsNotRecent) {
  PredictionOnly p;
  for (uint64_t id = 1; id <= 5; ++id) p.Insert(id, 0, /*now=*/id, /*refresh=*/true, 0, 1);
  for (uint64_t id = 100; id < 2100; ++id) p.Insert(id, 0, /*now=*/20, /*refresh=*/false, 0, 1);
  EXPECT_EQ(p.Coldest(20), std::optional<uint64_t>(5))
      << "the chains put back at tick 20 are recent";
  EXPECT_EQ(p.CheckInvariants(), "");
  p.Erase(5);
  EXPECT_EQ(p.Coldest(20), std::optional<uint64_t>(4));
  PredictionOnly all_recent;
  for (uint64_t id = 1; id <= 50; ++id) all_recent.Insert(id, 0, 20, /*refresh=*/false, 0, 1);
  EXPECT_EQ(all_recent.Coldest(21), std::optional<uint64_t>(50))
      << "every chain recent: the newest one, as before";
  EXPECT_EQ(all_recent.Coldest(2), std::optional<uint64_t>(50)) << "a clock below the window";
}

// Only the access being served (its tick) is recent: the chain the request before put is a
// candidate, and on round-barrier traffic it is the conversation that returns last.
TEST(AdaptiveChainPolicyTest, TheChainOfThePreviousRequestIsACandidate) {
  PredictionOnly p;
  p.Insert(1, 0, /*now=*/1, /*refresh=*/true, 0, 1);   // request 1 puts chain 1
  p.Insert(2, 0, /*now=*/10, /*refresh=*/true, 0, 1);  // request 2 puts chain 2
  EXPECT_EQ(p.Coldest(12), std::optional<uint64_t>(2)) << "put last, predicted to return last";
  p.Touch({2}, 12);  // request 3 reads chain 2 at tick 12: now it is being served
  EXPECT_EQ(p.Coldest(12), std::optional<uint64_t>(1));
  EXPECT_EQ(p.CheckInvariants(), "");
}

TEST(AdaptiveChainPolicyTest, ADeleteIsNotAGhost) {
  HotTier<AdaptiveChainPolicy> tier;
  Cohort a = Make(1);
  a.keys = {"ns:a"};
  tier.AdmitChain({a});
  EXPECT_TRUE(tier.ForgetIfAllUnder(1, "ns:"));
  EXPECT_EQ(tier.InspectPolicy([](const auto& p) { return p.ghost_size(); }), 0u);
  EXPECT_EQ(tier.InspectPolicy([](const auto& p) { return p.cohorts(); }), 0u);
}

// 4 hot prompts of 4 pages, each round all four, then `scans` one-hit scans of 12 new pages.
Trace HotSetAndScans(int scans = 1) {
  Trace t;
  uint32_t next = 16;
  for (int round = 0; round < 60; ++round) {
    for (uint32_t h = 0; h < 4; ++h) t.Add({4 * h, 4 * h + 1, 4 * h + 2, 4 * h + 3});
    for (int k = 0; k < scans; ++k) {
      std::vector<uint32_t> scan;
      for (int i = 0; i < 12; ++i) scan.push_back(next++);
      t.Add(scan);
    }
  }
  t.distinct = next;
  t.name = "hot set and scans";
  return t;
}

// Replays `trace` at `pct` % of its working set (20 pages for pct 0) with an undecided start;
// returns the final prediction weight.
double FinalPredictionWeight(const Trace& trace, int pct) {
  HotTier<Undecided> tier;
  Replay<Undecided>(trace, pct == 0 ? 20 : trace.distinct * pct / 100, 128, true, &tier);
  return tier.InspectPolicy([](const auto& p) { return p.prediction_weight(); });
}

TEST(AdaptiveChainPolicyTest, GhostsMoveTheWeightTowardTheRightExpert) {
  // Mild popularity skew (Zipf 0.8) at half the working set, conversations that end: recency is
  // the better expert there (cohort LRU is ahead of the prediction expert alone,
  // bench/eviction_policy_bench), and the weight goes to it.
  EXPECT_LT(FinalPredictionWeight(ZipfMultiTurn(0.8), 50), 0.1);
}

TEST(AdaptiveChainPolicyTest, RegularPeriodsLetPredictionChooseWhateverTheWeights) {
  // Cyclic multi-turn: every conversation comes back once a round, so the chains' periods hardly
  // differ and prediction chooses every victim the experts disagree on (recency would evict
  // exactly the conversation that returns next). The weights do not matter there: a policy that
  // starts undecided does as well as the default one, and since no victim was chosen by the
  // weights, no ghost moves them.
  const Trace trace = CyclicMultiTurn();
  const uint64_t capacity = trace.distinct / 2;
  HotTier<Undecided> undecided;
  const double ours = Replay<Undecided>(trace, capacity, 128, true, &undecided).hit_rate();
  const double prior = Replay<AdaptiveChainPolicy>(trace, capacity).hit_rate();
  const double recency = Replay<RecencyOnly>(trace, capacity).hit_rate();
  EXPECT_NEAR(ours, prior, 0.5);
  EXPECT_GT(ours, recency + 10.0);
  EXPECT_EQ(undecided.InspectPolicy([](const auto& p) { return p.prediction_weight(); }), 0.5);
}

TEST(AdaptiveChainPolicyTest, OneHitScansDoNotFlushAHotSet) {
  // 4 hot prompts of 4 pages and two one-hit scans of 12 pages every round, 30 pages of room:
  // the hot set and one scan fit. LRU (page or chain) gives the second scan the hot prompts,
  // which were used before the first scan. The scans are put on probation; their ghosts never
  // come back while the hot prompts' do, so the probation target falls and each scan goes before
  // any hot prompt.
  const Trace trace = HotSetAndScans(2);
  HotTier<AdaptiveChainPolicy> tier;
  const double ours = Replay<AdaptiveChainPolicy>(trace, 30, 128, true, &tier).hit_rate();
  const double opt = ReplayBelady(trace, 30).hit_rate();
  const double lru = Replay<LruPolicy>(trace, 30).hit_rate();
  const double cohort_lru = Replay<RecencyOnly>(trace, 30).hit_rate();
  const double prediction = Replay<PredictionOnly>(trace, 30).hit_rate();
  // Measured: 37.2 % against Belady's 39.3; LRU and cohort LRU 0.0, the prediction expert alone
  // 0.5 (it expects a once-seen chain back after the mean period); the target ends at 0.42.
  EXPECT_GE(ours, opt - 3.0);
  EXPECT_GE(ours, std::max({lru, cohort_lru, prediction}) + 30.0);
  EXPECT_LT(tier.InspectPolicy([](const auto& p) { return p.probation_target(); }), 0.5);
}

TEST(AdaptiveChainPolicyTest, ProbationEndsAtTheFirstAccess) {
  HotTier<AdaptiveChainPolicy> tier;
  tier.AdmitChain(Chain(1, 3));
  tier.AdmitChain(Chain(10, 2));
  auto probation = [&] {
    return tier.InspectPolicy([](const auto& p) { return p.probation_weight(); });
  };
  EXPECT_EQ(probation(), 5u);
  tier.Touch({2, 1});  // a restore of a prefix of the first chain: the whole chain leaves
  EXPECT_EQ(probation(), 2u);
  tier.AdmitChain(Chain(4, 1), /*parent=*/3);  // appended to an accessed chain: not on probation
  EXPECT_EQ(probation(), 2u);
  tier.AdmitChain(Chain(20, 1), /*parent=*/2);  // a branch is a new chain: on probation
  EXPECT_EQ(probation(), 3u);
}

TEST(AdaptiveChainPolicyTest, TheFilterTakesTheLargestWeightTimesAgeFirst) {
  // Of the probation chains, the filter takes from the one that has held the most weight for the
  // longest without being read again (weight x requests since its put), not simply the oldest,
  // and chooses again after every victim.
  HotTier<AdaptiveChainPolicy> tier;
  auto heavy_chain = [](uint64_t first, uint64_t n) {
    std::vector<Cohort> out;
    for (uint64_t i = 0; i < n; ++i) out.push_back(Make(first + i, 100));
    return out;
  };
  // A chain that was read, evicted and put again: a main ghost hit lowers the target below 1.
  tier.AdmitChain(Chain(100, 1));
  tier.Touch({100});
  ASSERT_EQ(Ids(tier.TakeVictims(1)), (std::vector<uint64_t>{100}));
  tier.AdmitChain(Chain(100, 1));
  ASSERT_LT(tier.InspectPolicy([](const auto& p) { return p.probation_target(); }), 1.0);
  tier.AdmitChain(heavy_chain(1, 2));  // the oldest: 200 x 5 requests at the eviction below
  for (uint64_t i = 0; i < 3; ++i) tier.AdmitChain(Chain(200 + i, 1));  // 1 x 2..4
  tier.AdmitChain(heavy_chain(10, 12));                                 // the newest: 1200 x 1
  // 21 and 20 (the heavy chain's tail) until it is down to the oldest one's 1000, then 2.
  EXPECT_EQ(Ids(tier.TakeVictims(300)), (std::vector<uint64_t>{21, 20, 2}));
}

// The prediction expert calls a chain that was put once and not read for twice the mean period
// "finished" only while that mean rests on at least a quarter as many chains as it would judge:
// early in a round of round-barrier traffic, the few chains read again are those with the
// shortest gaps, and every chain not reached yet would look finished.
std::vector<uint64_t> FirstVictimWithPeriodicChains(uint64_t periodic) {
  HotTier<PredictionOnly> tier;
  for (uint64_t i = 0; i < 8; ++i) tier.AdmitChain(Chain(10 + i, 1));  // put once, oldest first
  for (uint64_t i = 0; i < periodic; ++i) tier.AdmitChain(Chain(100 + i, 1));
  for (int round = 0; round < 2; ++round) {  // read again every `periodic` requests: due later
    for (uint64_t i = 0; i < periodic; ++i) tier.Touch({100 + i});
  }
  return Ids(tier.TakeVictims(1));
}

TEST(AdaptiveChainPolicyTest, ThePutOnceOverdueRuleWaitsForEnoughPeriods) {
  // One periodic chain, eight put once: 1 x 4 < 8, so the oldest put-once chain (10) is not
  // called finished; the expert ranks by predicted return instead (the newest put-once chain,
  // 17: only the access being served is recent).
  EXPECT_EQ(FirstVictimWithPeriodicChains(1), (std::vector<uint64_t>{17}));
  // Two or more periodic chains (2 x 4 >= 8): the rule applies and the oldest goes first.
  EXPECT_EQ(FirstVictimWithPeriodicChains(2), (std::vector<uint64_t>{10}));
  EXPECT_EQ(FirstVictimWithPeriodicChains(4), (std::vector<uint64_t>{10}));
}

TEST(AdaptiveChainPolicyTest, AGhostHitSkipsProbation) {
  // A chain that was evicted and is put again (its first page a ghost) is no one-hit chain: it
  // goes straight to the main part, as a ghost hit goes to S3-FIFO's main queue.
  HotTier<AdaptiveChainPolicy> tier;
  auto probation = [&] {
    return tier.InspectPolicy([](const auto& p) { return p.probation_weight(); });
  };
  tier.AdmitChain(Chain(1, 2));
  EXPECT_EQ(probation(), 2u);
  ASSERT_EQ(tier.TakeVictims(2).size(), 2u);
  tier.AdmitChain(Chain(1, 2));  // the same pages (fingerprints) again
  EXPECT_EQ(probation(), 0u);
  tier.AdmitChain(Chain(50, 1));  // a page never seen: on probation
  EXPECT_EQ(probation(), 1u);
}

// A miss that puts back an evicted prefix (a shared system prompt) followed by new pages (a
// conversation) makes two chains: the prefix, a ghost hit, off probation, and the new pages on
// probation after it, so the one-hit filter empties the new pages and leaves the prefix. As one
// chain both parts shared one probation state and one period, and the prefix went with the
// conversation's tail.
TEST(AdaptiveChainPolicyTest, AReturningPrefixAndTheNewPagesAfterItAreTwoChains) {
  AdaptiveChainPolicy p;
  uint64_t now = 0;
  // The prefix (content 101-103) put as ids 1-3, then evicted: three ghosts.
  for (uint64_t i = 1; i <= 3; ++i) p.Insert(i, i - 1, ++now, /*refresh=*/true, 100 + i, 1);
  for (uint64_t i = 3; i >= 1; --i) p.Evict(i);
  ASSERT_EQ(p.ghost_size(), 3u);
  // One put: the prefix again (ids 11-13, the same content), then new pages (ids 14-16).
  for (uint64_t i = 11; i <= 16; ++i) {
    p.Insert(i, i == 11 ? 0 : i - 1, ++now, true, i <= 13 ? 90 + i : 500 + i, 1);
  }
  EXPECT_EQ(p.chains(), 2u);
  EXPECT_EQ(p.probation_weight(), 3u) << "the new pages only";
  EXPECT_EQ(p.Predecessor(14), 13u) << "the new chain branches off the prefix's tail";
  EXPECT_EQ(p.CheckInvariants(), "");
  for (uint64_t v : {16, 15, 14}) {
    ASSERT_EQ(p.Coldest(now + 10), std::optional<uint64_t>(v));
    p.Evict(v);
  }
  EXPECT_EQ(p.chains(), 1u);
  EXPECT_EQ(p.cohorts(), 3u);
  EXPECT_EQ(p.probation_weight(), 0u) << "the prefix stays off probation";
  // The reverse within one put: new pages, then a page that is a ghost (content 514).
  p.Insert(21, 0, ++now, true, 621, 1);
  p.Insert(22, 21, now, true, 622, 1);
  p.Insert(23, 22, now, true, 514, 1);
  EXPECT_EQ(p.chains(), 3u);
  // Without the boundary 23 would continue the chain on probation (3 pages); with it, that
  // chain is an inner one (only leaf chains are candidates) and 23 skips probation.
  EXPECT_EQ(p.probation_weight(), 0u);
  EXPECT_EQ(p.CheckInvariants(), "");
}

// Drives the probation target below 0.2: one page off probation evicted and put back 150 times
// (ids from `first_id`; every ghost hit lowers the target), then erased. Returns the next free id.
uint64_t LowerProbationTarget(AdaptiveChainPolicy& p, uint64_t& now, uint64_t first_id) {
  uint64_t id = first_id;
  p.Insert(id, 0, ++now, /*refresh=*/true, /*fingerprint=*/7000, 1);
  for (int i = 0; i < 150; ++i) {
    p.Evict(id);
    p.Insert(++id, 0, ++now, true, 7000, 1);
  }
  p.Erase(id);
  return id + 1;
}

// Puts `n` one-page chains (ids 1000 + i), each read by the request after its put: n periods of
// 1, so the periods are regular once there are enough of them.
void AddChainsWithPeriodOne(AdaptiveChainPolicy& p, uint64_t& now, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    p.Insert(1000 + i, 0, ++now, /*refresh=*/true, /*fingerprint=*/5000 + i, 1);
    p.Touch({1000 + i}, ++now);
  }
}

// While the periods are regular (round-barrier traffic) or the probation target is low, a chain
// that has been a shared prefix (a system prompt a conversation branched off) stays a chain of
// its own: when its branches are gone and a later request reads it and puts new pages after it,
// they are a branch on probation, not the prompt's tail with the prompt's period (a victim
// emptying that tail went on into the prompt). Otherwise the new pages continue the prompt's
// chain.
TEST(AdaptiveChainPolicyTest, NewPagesAfterASharedPrefixAreABranchOfTheirOwn) {
  enum Case { kRegular, kLowTarget, kNeither };
  for (const Case k : {kRegular, kLowTarget, kNeither}) {
    SCOPED_TRACE(k == kRegular ? "regular periods" : k == kLowTarget ? "low target" : "neither");
    const bool branches = k != kNeither;
    AdaptiveChainPolicy p;
    uint64_t now = 0;
    if (k == kLowTarget) {
      LowerProbationTarget(p, now, 2000);
      ASSERT_LT(p.probation_target(), 0.2);
    }
    if (k == kRegular) {
      AddChainsWithPeriodOne(p, now, 16);  // periods of 1, as the prompt's below
    }
    // The prompt (ids 1-3), read, then a conversation after it (ids 4-5) and another (6-7).
    for (uint64_t i = 1; i <= 3; ++i) p.Insert(i, i - 1, ++now, /*refresh=*/true, 100 + i, 1);
    p.Touch({3, 2, 1}, ++now);
    p.Insert(4, 3, ++now, true, 104, 1);
    p.Insert(5, 4, now, true, 105, 1);
    p.Touch({3, 2, 1}, ++now);
    p.Insert(6, 3, ++now, true, 106, 1);
    p.Insert(7, 6, now, true, 107, 1);
    const size_t others = k == kRegular ? 16 : 0;
    ASSERT_EQ(p.chains(), others + 3);
    // Both conversations leave: the prompt's tail has no branch left.
    for (uint64_t v : {5, 4, 7, 6}) p.Erase(v);
    ASSERT_EQ(p.chains(), others + 1);
    ASSERT_EQ(p.probation_weight(), 0u);
    ASSERT_EQ(p.PeriodsRegular(), k == kRegular);
    // A third request reads the prompt and puts its conversation (ids 8-9) after it.
    p.Touch({3, 2, 1}, ++now);
    p.Insert(8, 3, ++now, true, 108, 1);
    p.Insert(9, 8, now, true, 109, 1);
    EXPECT_EQ(p.Predecessor(8), 3u);
    EXPECT_EQ(p.CheckInvariants(), "");
    if (!branches) {
      EXPECT_EQ(p.chains(), 1u) << "the conversation continues the prompt's chain";
      EXPECT_EQ(p.probation_weight(), 0u);
      continue;
    }
    EXPECT_EQ(p.chains(), others + 2) << "the conversation is a branch, not the prompt's tail";
    EXPECT_EQ(p.probation_weight(), 2u) << "the new pages are on probation";
    // The conversation's next turn (ids 10-11), a later request after reading it, continues its
    // chain: only a prefix that has been shared starts branches.
    p.Touch({9, 8, 3, 2, 1}, ++now);
    p.Insert(10, 9, ++now, true, 110, 1);
    p.Insert(11, 10, now, true, 111, 1);
    EXPECT_EQ(p.chains(), others + 2);
    EXPECT_EQ(p.CheckInvariants(), "");
  }
}

// While the periods are regular, prediction chooses every victim: the probation filter does not
// go first either (on round-barrier traffic a conversation put and not yet read again is one its
// next round will read; prediction ranks it with the others). Otherwise the filter goes first.
TEST(AdaptiveChainPolicyTest, WhileThePeriodsAreRegularTheFilterDoesNotGoFirst) {
  for (const bool regular : {true, false}) {
    SCOPED_TRACE(regular ? "regular periods" : "too few periods");
    AdaptiveChainPolicy p;
    uint64_t now = 0;
    LowerProbationTarget(p, now, 2000);
    const uint64_t with_period = regular ? 16 : 4;
    AddChainsWithPeriodOne(p, now, with_period);
    // A chain put and not read since (ids 1-4): on probation, over the target.
    for (uint64_t i = 1; i <= 4; ++i) p.Insert(i, i - 1, ++now, /*refresh=*/true, 100 + i, 1);
    ASSERT_EQ(p.PeriodsRegular(), regular);
    ASSERT_EQ(p.probation_weight(), 4u);
    ASSERT_GT(4.0 / static_cast<double>(with_period + 4), p.probation_target());
    const std::optional<uint64_t> victim = p.Coldest(++now);
    ASSERT_TRUE(victim.has_value());
    if (regular) {
      EXPECT_GE(*victim, 1000u) << "prediction's victim, a chain with a period";
    } else {
      EXPECT_EQ(*victim, 4u) << "the filter's victim: the probation chain's tail";
    }
    EXPECT_EQ(p.CheckInvariants(), "");
  }
}

// With fewer than 8 chains holding a period, the regularity read last over at least 16 stands:
// a small cache on round-barrier traffic holds few conversations long enough to learn a period.
// A reading over fewer (8: enough to decide, not to remember) is not kept.
TEST(AdaptiveChainPolicyTest, ARegularReadingOverManyChainsStandsWhileFewHaveAPeriod) {
  for (const uint64_t chains : {16, 8}) {
    SCOPED_TRACE(chains);
    AdaptiveChainPolicy p;
    uint64_t now = 0;
    AddChainsWithPeriodOne(p, now, chains);
    ASSERT_TRUE(p.PeriodsRegular());
    for (uint64_t i = 4; i < chains; ++i) p.Erase(1000 + i);  // 4 chains with a period left
    EXPECT_EQ(p.PeriodsRegular(), chains == 16);
    EXPECT_EQ(p.CheckInvariants(), "");
  }
}

TEST(AdaptiveChainPolicyTest, CyclicTrafficKeepsProbationOpen) {
  // Every chain of the cyclic trace comes back, so its probation is no filter: the target stays
  // at (or near) 1 and the hit rate is the prediction expert's.
  const Trace trace = CyclicMultiTurn();
  for (int pct : {10, 25, 50}) {
    const uint64_t cap = trace.distinct * pct / 100;
    HotTier<AdaptiveChainPolicy> tier;
    const double ours = Replay<AdaptiveChainPolicy>(trace, cap, 128, true, &tier).hit_rate();
    SCOPED_TRACE(pct);
    EXPECT_GE(ours, Replay<PredictionOnly>(trace, cap).hit_rate() - 0.3);
  }
}

// A page whose ghost is still in the FIFO skips probation when it is put again; one whose ghost
// has left the FIFO is a new page (its index entry, kept until the index is compacted, is not a
// ghost hit).
TEST(AdaptiveChainPolicyTest, OnlyAGhostStillInTheFifoSkipsProbation) {
  AdaptiveChainPolicy p;
  uint64_t now = 0;
  p.Insert(1, 0, ++now, /*refresh=*/true, /*fingerprint=*/100, 1);  // at most one resident
  p.Evict(1);                                                       // ghost 100
  p.Insert(2, 0, ++now, true, 200, 1);
  p.Evict(2);  // ghost 200; the FIFO holds one, so 100 leaves it
  ASSERT_EQ(p.ghost_size(), 1u);
  p.Insert(3, 0, ++now, true, 100, 1);  // 100 again: not a ghost any more
  EXPECT_EQ(p.probation_weight(), 1u);
  p.Insert(4, 0, ++now, true, 200, 1);  // 200 again: a ghost hit, past probation
  EXPECT_EQ(p.probation_weight(), 1u);
  EXPECT_EQ(p.cohorts(), 2u);
  EXPECT_EQ(p.CheckInvariants(), "");
}

// A chain on probation (put, not read again) is predicted to come back no sooner than the pages
// that came back after their eviction did, not after the mean period of the chains read while
// resident, which leans to the short ones: here two prefixes read on alternate requests.
TEST(AdaptiveChainPolicyTest, ProbationChainIsPredictedAfterTheReturnedGapNotTheShortMean) {
  AdaptiveChainPolicy p(AdaptiveChainPolicy::Mode::kPredictionOnly);
  uint64_t now = 0;
  // Eight one-page chains, resident together (so the ghost FIFO holds eight), then evicted.
  for (uint64_t i = 1; i <= 8; ++i) p.Insert(100 + i, 0, ++now, /*refresh=*/true, 1000 + i, 1);
  for (uint64_t i = 1; i <= 8; ++i) p.Evict(100 + i);
  EXPECT_EQ(p.returned_gap(), 0.0);
  // Two hot chains read on alternate requests: periods of 2.
  p.Insert(1, 0, ++now, true, 1, 1);
  p.Insert(2, 0, ++now, true, 2, 1);
  for (int i = 0; i < 50; ++i) {
    p.Touch({1}, ++now);
    p.Touch({2}, ++now);
  }
  // The eight come back, 110 requests after their last access, and are dropped again.
  for (uint64_t i = 1; i <= 8; ++i) p.Insert(200 + i, 0, ++now, true, 1000 + i, 1);
  EXPECT_NEAR(p.returned_gap(), 110.0, 1e-9);
  for (uint64_t i = 1; i <= 8; ++i) p.Erase(200 + i);
  // A chain put once (request 119), then both hot chains read once more (120, 121).
  p.Insert(300, 0, ++now, true, 3000, 1);
  p.Touch({1}, ++now);
  p.Touch({2}, ++now);
  now += 10;  // none of them among the recent
  // Predicted: chain 1 at 122, chain 2 at 123, the put chain at 119 + 110. With the mean period
  // (2) standing in for its own it would be 121, and chain 2, read every other request, the
  // victim.
  EXPECT_EQ(p.Coldest(now), std::optional<uint64_t>(300));
  EXPECT_EQ(p.CheckInvariants(), "");
}

// The finished rule's slack: a page evicted as finished (overdue by more than 1 + slack periods)
// that comes back within 2.5 periods of its chain's last access was late, not finished, and
// raises the slack; each page evicted as finished lowers it; one back later than that moves
// nothing.
TEST(AdaptiveChainPolicyTest, AFinishedChainBackLateRaisesTheSlack) {
  PredictionOnly p;
  uint64_t now = 0;
  // Chain 1 read every 10 requests, chain 4 every 100 (predicted later than any other, so it is
  // the victim until a chain is finished), chains 2 and 3 in every other request.
  for (uint64_t id = 1; id <= 4; ++id) p.Insert(id, 0, ++now, /*refresh=*/true, 100 + id, 1);
  uint64_t step = 0, filler = 0;
  bool one_read = true;
  auto next_request = [&] {
    ++step;
    if (step % 100 == 95) {
      p.Touch({4}, ++now);
    } else if (one_read && step % 10 == 0) {
      p.Touch({1}, ++now);
    } else {
      p.Touch({2 + filler++ % 2}, ++now);
    }
  };
  while (step < 300) next_request();
  // Chain 1 stops being read: overdue by more than two periods (20 requests), it is finished.
  one_read = false;
  for (int i = 0; i < 20; ++i) {
    next_request();
    ASSERT_EQ(p.Coldest(now + 5), std::optional<uint64_t>(4)) << i;
  }
  next_request();
  ASSERT_EQ(p.Coldest(now + 5), std::optional<uint64_t>(1));
  p.Evict(1);
  EXPECT_EQ(p.finished_slack(), 0.0) << "never below 0";
  // Its page is put again 23 requests after its last read: within 2.5 periods, late.
  next_request();
  p.Insert(10, 0, ++now, true, 101, 1);
  EXPECT_DOUBLE_EQ(p.finished_slack(), 0.02);
  // Back as a ghost hit with the mean period; finished in time, and its page lowers the slack.
  int waited = 0;
  while (p.Coldest(now + 5) != std::optional<uint64_t>(10) && waited++ < 200) next_request();
  ASSERT_LT(waited, 200);
  p.Evict(10);
  EXPECT_DOUBLE_EQ(p.finished_slack(), 0.01);
  // Back 90 requests after its last access, more than 2.5 periods: no evidence either way.
  for (int i = 0; i < 90; ++i) next_request();
  p.Insert(11, 0, ++now, true, 101, 1);
  EXPECT_DOUBLE_EQ(p.finished_slack(), 0.01);
  EXPECT_EQ(p.CheckInvariants(), "");
}

TEST(AdaptiveChainPolicyTest, MetadataIsBoundedByTheCapacity) {
  const Trace trace = ZipfMultiTurn(1.1);  // 4,000 accesses, every key new after a restart
  const uint64_t cap = trace.distinct / 10;
  HotTier<AdaptiveChainPolicy> tier;
  const Result r = Replay<AdaptiveChainPolicy>(trace, cap, 128, true, &tier);
  ASSERT_GT(r.evictions, 5 * cap);  // the ghost has turned over many times
  tier.InspectPolicy([&](const AdaptiveChainPolicy& p) {
    EXPECT_LE(p.cohorts(), cap);
    EXPECT_LE(p.chains(), p.cohorts());
    EXPECT_LE(p.ghost_size(), cap);
    // The index drops the entries of ghosts that left the FIFO in one pass when it reaches
    // twice the FIFO's bound.
    EXPECT_LE(p.ghost_index_size(), 2 * cap + 1);
    return 0;
  });
  tier.TakeVictims(~uint64_t{0});
  tier.InspectPolicy([&](const AdaptiveChainPolicy& p) {
    EXPECT_EQ(p.cohorts(), 0u);
    EXPECT_EQ(p.chains(), 0u);  // no chain outlives its cohorts
    EXPECT_LE(p.ghost_size(), cap);
    return 0;
  });
}

// The acceptance traces, in memory; docs/perf.md has the full table.
TEST(AdaptiveChainPolicyTest, CyclicTraceIsNearBeladyAndNotBelowTheOldPolicy) {
  const Trace trace = CyclicMultiTurn();
  for (int pct : {10, 25, 50}) {
    const uint64_t cap = trace.distinct * pct / 100;
    const double ours = Replay<AdaptiveChainPolicy>(trace, cap).hit_rate();
    const double old = Replay<ReusePredictionPolicy>(trace, cap).hit_rate();
    const double lru = Replay<LruPolicy>(trace, cap).hit_rate();
    const double opt = ReplayBelady(trace, cap).hit_rate();
    SCOPED_TRACE(pct);
    EXPECT_GE(ours, lru + 8.0);
    EXPECT_GE(ours, opt - 3.0);
    EXPECT_GE(ours, old - 0.05);  // measured: 35.0 / 51.0 / 70.7 against 34.7 / 49.7 / 70.6
  }
}

// At least the best of page LRU, S3-FIFO and ARC on every trace and capacity.
TEST(AdaptiveChainPolicyTest, AtLeastTheBestPageLevelBaselineOnEveryTrace) {
  for (const Trace& trace :
       {ZipfMultiTurn(0.8), ZipfMultiTurn(1.1), ZipfMultiTurn(1.4), Mix(), Scan(), Diurnal()}) {
    for (int pct : {10, 25, 50}) {
      const uint64_t cap = trace.distinct * pct / 100;
      const double ours = Replay<AdaptiveChainPolicy>(trace, cap).hit_rate();
      const double best = std::max({Replay<LruPolicy>(trace, cap).hit_rate(),
                                    Replay<S3FifoPolicy>(trace, cap).hit_rate(),
                                    Replay<ArcPolicy>(trace, cap).hit_rate()});
      SCOPED_TRACE(trace.name + " " + std::to_string(pct));
      EXPECT_GE(ours, best);
      EXPECT_LE(ours, ReplayBelady(trace, cap).hit_rate() + 1e-9);
    }
  }
}

// bench/mooncake_compare.py's multi-turn workload (16 sessions x 4 turns, no shared system
// prompt, round barrier): not below the old policy at any capacity from 20 to 90 % of the working
// set, and at Belady's 64.3 % from 83 % (where fluxond's 2.5 GiB lies). Before the request clock,
// the last session learnt the longest period in the first round and was emptied just before its
// turn (63.9 at 84 %), and a victim chain was emptied even after another overtook it (54.0
// against the old policy's 56.2 at 65 %).
TEST(AdaptiveChainPolicyTest, MultiTurnSessionsAreNotBelowTheOldPolicy) {
  const Trace trace = Sessions();
  for (int pct = 20; pct <= 90; pct += 1) {
    const uint64_t cap = trace.distinct * pct / 100;
    const double ours = Replay<AdaptiveChainPolicy>(trace, cap).hit_rate();
    SCOPED_TRACE(pct);
    EXPECT_GE(ours, Replay<ReusePredictionPolicy>(trace, cap).hit_rate() - 1e-9);
    if (pct >= 83) {
      EXPECT_GE(ours, ReplayBelady(trace, cap).hit_rate() - 1e-9);
    }
  }
}

TEST(AdaptiveChainPolicyTest, ReplayCountsEveryPageAndSharesSystemPrompts) {
  // 4 conversations over 2 system prompts of 8 pages, 2 rounds, room for everything: only pages
  // never seen before miss (each system prompt once, each turn's new pages).
  const Trace trace = CyclicMultiTurn(4, 2, 2);
  const Result r = Replay<AdaptiveChainPolicy>(trace, 1000);
  EXPECT_EQ(r.evictions, 0u);
  EXPECT_EQ(r.requested, 4u * (16 + 20));
  EXPECT_EQ(r.requested - r.hits, trace.distinct);
  EXPECT_EQ(ReplayBelady(trace, 1000).hits, r.hits);
}

// The generalisation suite's traces are a function of their seed: the same seed replays the
// same trace (so a held-out seed stays held out), another seed gives another trace.
TEST(TraceSuiteTest, ACaseIsAFunctionOfItsSeed) {
  const std::vector<suite::Case> a = suite::Cases(7, /*quick=*/true);
  const std::vector<suite::Case> b = suite::Cases(7, /*quick=*/true);
  const std::vector<suite::Case> c = suite::Cases(8, /*quick=*/true);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), c.size());
  std::vector<std::string> families;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].trace.pages, b[i].trace.pages) << a[i].trace.name;
    EXPECT_EQ(a[i].trace.start, b[i].trace.start) << a[i].trace.name;
    EXPECT_NE(a[i].trace.pages, c[i].trace.pages) << a[i].trace.name;
    EXPECT_GT(a[i].trace.size(), 0u);
    families.push_back(a[i].family);
  }
  std::sort(families.begin(), families.end());
  families.erase(std::unique(families.begin(), families.end()), families.end());
  EXPECT_EQ(families, (std::vector<std::string>{"barrier", "diurnal", "docs", "mix", "zipf"}));
}

// A barrier trace of parallel groups: every conversation sends one prompt per round, each after
// the first extending its previous one.
TEST(TraceSuiteTest, EveryBarrierTurnExtendsItsConversation) {
  const suite::Case k = suite::Barrier(12, 3, 1, 2, 2, 2, 5);
  ASSERT_EQ(k.trace.size(), 12u * 3);
  // Prompts of one conversation share its first page after the system prompt, so a prompt's
  // predecessor is the longest earlier prompt that is a prefix of it.
  size_t extended = 0;
  for (size_t i = 0; i < k.trace.size(); ++i) {
    const std::vector<uint32_t> p(k.trace.prompt(i), k.trace.prompt(i) + k.trace.length(i));
    for (size_t j = 0; j < i; ++j) {
      const size_t n = k.trace.length(j);
      if (n < p.size() && std::equal(k.trace.prompt(j), k.trace.prompt(j) + n, p.begin()) &&
          n > 8) {
        ++extended;
        break;
      }
    }
  }
  EXPECT_EQ(extended, 12u * 2);  // every turn after the first extends the conversation's last
}

// Random sequences of what the hot tier does to its policy — batches admitted as chains (after a
// resident, an evicted or no cohort), prefixes touched, victims taken (and some readmitted where
// they were), cohorts taken and readmitted under the same id (a partial drop), cohorts erased —
// keep every structural invariant after every step.
TEST(AdaptiveChainPolicyStress, RandomOperationsKeepEveryInvariant) {
  for (uint64_t seed = 1; seed <= 18; ++seed) {
    std::mt19937_64 rng(seed);
    AdaptiveChainPolicy p;
    std::vector<uint64_t> resident, gone;
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> held;  // id -> (weight, fingerprint)
    uint64_t next = 1, now = 0;
    // Seeds 13-18 start with a low probation target, so puts after shared prefixes branch (the
    // rule is seldom on from the start's target of 1).
    if (seed > 12) next = LowerProbationTarget(p, now, next);
    auto pick = [&](const std::vector<uint64_t>& v) -> uint64_t {
      return v.empty() ? 0 : v[rng() % v.size()];
    };
    auto drop = [&](uint64_t id) {
      resident.erase(std::find(resident.begin(), resident.end(), id));
      gone.push_back(id);
    };
    for (int step = 0; step < 4000; ++step) {
      const int op = static_cast<int>(rng() % 100);
      if (resident.empty() || (op < 35 && resident.size() < 300)) {
        uint64_t after = rng() % 4 == 0 ? 0 : (rng() % 5 == 0 ? pick(gone) : pick(resident));
        const int n = 1 + static_cast<int>(rng() % 4);
        ++now;
        for (int i = 0; i < n; ++i) {
          const uint64_t id = next++;
          const uint64_t w = 1 + rng() % (uint64_t{1} << 22);
          const uint64_t fp = rng() % 3 == 0 ? 1 + rng() % 64 : 0;
          p.Insert(id, after, now, /*refresh=*/true, fp, w);
          held[id] = {w, fp};
          resident.push_back(id);
          after = id;
        }
      } else if (op < 55) {
        std::vector<uint64_t> prefix{pick(resident)};  // tail first
        for (int i = 0; i < 5; ++i) {
          const uint64_t before = p.Predecessor(prefix.back());
          if (before == 0 || !held.contains(before)) break;
          prefix.push_back(before);
        }
        p.Touch(prefix, ++now);
      } else if (op < 75) {
        const std::optional<uint64_t> v = p.Coldest(now);
        ASSERT_TRUE(v.has_value());
        ASSERT_TRUE(held.contains(*v)) << "the policy named a cohort it does not hold: " << *v;
        const uint64_t after = p.Predecessor(*v);
        p.Evict(*v);
        if (rng() % 3 == 0) {  // could not go now: back where it was
          p.Insert(*v, after, now, /*refresh=*/false, held[*v].second, held[*v].first);
        } else {
          held.erase(*v);
          drop(*v);
        }
      } else if (op < 88) {
        const uint64_t id = pick(resident);  // part of a cohort dropped: the rest readmitted
        const uint64_t after = p.Predecessor(id);
        p.Evict(id);
        held[id].first = std::max<uint64_t>(1, held[id].first / 2);
        p.Insert(id, after, now, /*refresh=*/false, held[id].second, held[id].first);
      } else {
        const uint64_t id = pick(resident);
        p.Erase(id);
        held.erase(id);
        drop(id);
      }
      ASSERT_EQ(p.CheckInvariants(), "") << "seed " << seed << ", step " << step << ", op " << op;
      ASSERT_EQ(p.cohorts(), held.size());
    }
  }
}

}  // namespace
}  // namespace fluxon

namespace fluxon {
namespace {

// SelectingPolicy (bench/eviction/selecting_policy.h): its simulations rank the experts on the
// stream the live policy sees, and the live cache follows the best one. On interleaved
// round-barrier groups at 25 % the previous policy is far ahead of page LRU, which ranks the
// live cache first: the selector must move to it, with every expert following the live cache
// and with a rebuild at the switch alike.
using eviction_replay::Replay;
struct SelectFollowing : SelectingPolicy<LruPolicy, ReusePredictionPolicy> {};
struct SelectRebuilding : SelectingPolicy<LruPolicy, ReusePredictionPolicy> {
  SelectRebuilding() : SelectingPolicy(SelectingOptions{256, 1.0, 32, /*followers=*/false}) {}
};

TEST(SelectingPolicyTest, TheLiveCacheFollowsTheExpertItsSimulationsRankFirst) {
  const suite::Case c = suite::Barrier(512, 4, 2, 6, 0, 4, /*seed=*/1);
  const uint64_t cap = c.trace.distinct / 4;
  const double lru = Replay<LruPolicy>(c.trace, cap).hit_rate();
  const double previous = Replay<ReusePredictionPolicy>(c.trace, cap).hit_rate();
  ASSERT_GT(previous, lru + 5);
  const double following = Replay<SelectFollowing>(c.trace, cap).hit_rate();
  const double rebuilding = Replay<SelectRebuilding>(c.trace, cap).hit_rate();
  EXPECT_GT(following, lru + 3) << previous;
  EXPECT_GT(rebuilding, lru + 3) << previous;
  // Where the first expert is the better one, nothing moves it.
  const suite::Case z = suite::Zipf(1.0, 256, 4000, /*seed=*/1);
  const uint64_t zcap = z.trace.distinct / 10;
  const double za = Replay<LruPolicy>(z.trace, zcap).hit_rate();
  const double zp = Replay<ReusePredictionPolicy>(z.trace, zcap).hit_rate();
  const double zs = Replay<SelectFollowing>(z.trace, zcap).hit_rate();
  EXPECT_GE(zs, std::min(za, zp) - 0.5) << za << " " << zp;
}

}  // namespace
}  // namespace fluxon
