// SingleFlight on its own (src/owner/single_flight.h): one leader per key, decided by one atomic
// insert-or-join (G3, G6); joiners see the leader's one terminal state and its one canonical
// holder (G7), or a miss when their deadline passes first; the leader's Finish removes its own
// op only, so no marker is left behind and a newer op is never removed (G10, no ABA).
#include "owner/single_flight.h"

#include <atomic>

#include "tests/unit/owner/owner_parts_fixture.h"

namespace fluxon::testing {
namespace {

class SingleFlightTest : public OwnerPartsTest {
 protected:
  // Two LeadOrJoin calls of one key: the first's op and whether it leads, then the second's.
  struct LeadAndJoin {
    std::shared_ptr<SharedGetOp> op;
    bool leads;
    std::shared_ptr<SharedGetOp> joined;
    bool joins_leads;
  };
  LeadAndJoin LeadThenJoin(const std::string& key) {
    auto [op, leads] = flights.LeadOrJoin(key);
    auto [joined, joins_leads] = flights.LeadOrJoin(key);
    return {op, leads, joined, joins_leads};
  }

  SingleFlight flights;
};

// G6: the first caller of a key leads, later ones join the same op; keys are independent.
TEST_F(SingleFlightTest, FirstCallerLeadsLaterCallersJoinTheSameOp) {
  auto [op, leads, joined, joins_leads] = LeadThenJoin("k");
  auto [other, other_leads] = flights.LeadOrJoin("other");
  EXPECT_TRUE(leads);
  EXPECT_FALSE(joins_leads);
  EXPECT_EQ(joined, op);
  EXPECT_TRUE(other_leads);
  EXPECT_NE(other, op);
  EXPECT_EQ(flights.size(), 2u);
  flights.Finish("k", op, HolderRef());
  flights.Finish("other", other, HolderRef());
  EXPECT_EQ(flights.size(), 0u);
}

// G3/G6: callers racing on one key get exactly one leader and all share its op.
TEST_F(SingleFlightTest, ConcurrentCallersGetExactlyOneLeader) {
  constexpr int kThreads = 8;
  std::atomic<int> leaders{0};
  std::vector<std::shared_ptr<SharedGetOp>> ops(kThreads);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      auto [op, leads] = flights.LeadOrJoin("race");
      ops[t] = op;
      if (leads) ++leaders;
    });
  }
  go = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(leaders.load(), 1);
  for (const auto& op : ops) EXPECT_EQ(op, ops[0]);
  EXPECT_EQ(flights.size(), 1u);
  flights.Finish("race", ops[0], HolderRef());
}

// G7: every joiner, waiting before or arriving after the leader's Finish, sees the leader's one
// canonical holder (the same MemoryInfo, not a copy).
TEST_F(SingleFlightTest, G7JoinersSeeTheLeadersCanonicalHolder) {
  OwnerParts& o = Make();
  auto [op, leads] = flights.LeadOrJoin("k");
  ASSERT_TRUE(leads);
  std::vector<HolderRef> seen(3);
  std::vector<std::thread> joiners;
  for (int j = 0; j < 3; ++j) {
    auto [joined, joins_leads] = flights.LeadOrJoin("k");
    ASSERT_FALSE(joins_leads);
    joiners.emplace_back([&seen, j, op = joined] { seen[j] = op->Wait(Clock::now() + kWait); });
  }
  HolderRef canonical = LocalHolder(o, "k", 42);
  ASSERT_TRUE(canonical);
  flights.Finish("k", op, canonical);
  for (std::thread& t : joiners) t.join();
  for (const HolderRef& h : seen) {
    EXPECT_TRUE(h == canonical);
    EXPECT_EQ(h->put_id, 42u);
  }
  EXPECT_TRUE(op->Wait(Clock::now()) == canonical);  // a late waiter of the op sees it too
  EXPECT_EQ(flights.size(), 0u);
}

// G7: a leader that found nothing ends Failed: its joiners see a miss (an empty holder).
TEST_F(SingleFlightTest, G7JoinersSeeTheLeadersFailure) {
  OwnerParts& o = Make();
  auto [op, leads, joined, joins_leads] = LeadThenJoin("missing");
  ASSERT_TRUE(leads);
  ASSERT_FALSE(joins_leads);
  HolderRef seen = LocalHolder(o, "not-the-answer");  // overwritten by the wait
  ASSERT_TRUE(seen);
  std::thread joiner([&seen, op = joined] { seen = op->Wait(Clock::now() + kWait); });
  flights.Finish("missing", op, HolderRef());
  joiner.join();
  EXPECT_FALSE(seen);
  EXPECT_EQ(flights.size(), 0u);
}

// A joiner waits with a deadline: when it passes first, the joiner sees a miss, never a partial
// state, and the op stays the leader's.
TEST_F(SingleFlightTest, JoinerPastItsDeadlineSeesAMiss) {
  OwnerParts& o = Make();
  auto [op, leads, joined, joins_leads] = LeadThenJoin("slow");
  ASSERT_TRUE(leads && !joins_leads);
  const auto begin = Clock::now();
  EXPECT_FALSE(joined->Wait(begin + milliseconds(50)));
  EXPECT_GE(Clock::now() - begin, milliseconds(50));
  EXPECT_EQ(flights.size(), 1u);
  HolderRef h = LocalHolder(o, "slow");
  flights.Finish("slow", op, h);
  EXPECT_TRUE(joined->Wait(Clock::now() + kWait) == h);  // a later wait sees the end state
}

// G10 (and no ABA): Finish removes the leader's own op, so a cancelled or failed lookup leaves
// no marker and the next get leads a new op; a stale Finish of the old op never removes the
// newer one.
TEST_F(SingleFlightTest, G10FinishLeavesNoMarkerAndNeverRemovesANewerOp) {
  auto [first, first_leads] = flights.LeadOrJoin("k");
  ASSERT_TRUE(first_leads);
  flights.Finish("k", first, HolderRef());
  EXPECT_EQ(flights.size(), 0u);
  auto [second, second_leads] = flights.LeadOrJoin("k");
  EXPECT_TRUE(second_leads);  // not joined to the old, finished op
  EXPECT_NE(second, first);
  flights.Finish("k", first, HolderRef());  // the old op's identity: the new one stays
  EXPECT_EQ(flights.size(), 1u);
  auto [joined, joins_leads] = flights.LeadOrJoin("k");
  EXPECT_FALSE(joins_leads);
  EXPECT_EQ(joined, second);
  flights.Finish("k", second, HolderRef());
  EXPECT_EQ(flights.size(), 0u);
}

}  // namespace
}  // namespace fluxon::testing
