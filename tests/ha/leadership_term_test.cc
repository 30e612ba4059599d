// LeadershipTerm, the local-clock judgement of a master candidate's leadership: a term that ran
// out is never revived by a late keep-alive answer (a revived term would serve an empty route
// table under an epoch the owners already filled), and a lease that ran out is not led with.
#include "ha/leadership_term.h"

#include "gtest/gtest.h"

namespace fluxon {
namespace {

using Clock = LeadershipTerm::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;
constexpr milliseconds kMargin{400};

TEST(LeadershipTermTest, LeadsUntilTheLeaseEstimateAndKeepAlivesInTimeExtendIt) {
  const Clock::time_point t0{};
  LeadershipTerm term;
  term.Granted(t0, seconds(2), kMargin);
  EXPECT_FALSE(term.Leads(t0));  // a lease, not yet a term
  ASSERT_TRUE(term.Begin(7, t0 + milliseconds(10)));
  EXPECT_TRUE(term.Leads(t0 + milliseconds(1599)));
  EXPECT_FALSE(term.Leads(t0 + milliseconds(1600)));  // sent + TTL - margin
  EXPECT_EQ(term.epoch(), 7);
  // A keep-alive sent at 0.6 s and answered at 1 s: valid until 2.2 s.
  ASSERT_TRUE(term.Renewed(t0 + milliseconds(600), seconds(2), kMargin, t0 + milliseconds(1000)));
  EXPECT_TRUE(term.Leads(t0 + milliseconds(2199)));
  EXPECT_FALSE(term.Leads(t0 + milliseconds(2200)));
}

TEST(LeadershipTermTest, AKeepAliveAnsweredAfterTheTermRanOutDoesNotReviveIt) {
  const Clock::time_point t0{};
  LeadershipTerm term;
  term.Granted(t0, seconds(2), kMargin);
  ASSERT_TRUE(term.Begin(7, t0));
  // Sent at 1.0 s (in time), answered at 1.7 s: the term had ended at 1.6 s, whatever etcd says.
  EXPECT_FALSE(term.Renewed(t0 + milliseconds(1000), seconds(2), kMargin, t0 + milliseconds(1700)));
  EXPECT_FALSE(term.Leads(t0 + milliseconds(1701)));
  EXPECT_FALSE(term.Leads(t0 + milliseconds(1800)));  // would be within the renewed estimate
  // Later answers do not revive it either, nor does taking the key again on this lease.
  EXPECT_FALSE(term.Renewed(t0 + milliseconds(1750), seconds(2), kMargin, t0 + milliseconds(1760)));
  EXPECT_FALSE(term.Begin(7, t0 + milliseconds(1770)));
  EXPECT_FALSE(term.Leads(t0 + milliseconds(1780)));
}

TEST(LeadershipTermTest, ALeaseThatRanOutBeforeTheKeyWasTakenIsNotLedWith) {
  const Clock::time_point t0{};
  LeadershipTerm term;
  term.Granted(t0, seconds(2), kMargin);
  EXPECT_FALSE(term.Begin(9, t0 + milliseconds(1600)));
  EXPECT_FALSE(term.Leads(t0 + milliseconds(1601)));
  EXPECT_TRUE(term.Expired(t0 + milliseconds(1600)));
}

TEST(LeadershipTermTest, AStandbysLeaseIsRenewedWhenAnsweredLateAndANewLeaseStartsAfresh) {
  const Clock::time_point t0{};
  LeadershipTerm term;
  term.Granted(t0, seconds(2), kMargin);
  // Not leading: a late answer only moves the estimate (nothing was served on it).
  ASSERT_TRUE(term.Renewed(t0 + milliseconds(1000), seconds(2), kMargin, t0 + milliseconds(1700)));
  ASSERT_TRUE(term.Begin(11, t0 + milliseconds(1800)));
  EXPECT_TRUE(term.Leads(t0 + milliseconds(2500)));
  term.End();
  EXPECT_FALSE(term.Leads(t0 + milliseconds(2501)));
  // The next campaign's lease is a fresh one: its term may begin (under a new epoch).
  term.Granted(t0 + milliseconds(3000), seconds(2), kMargin);
  ASSERT_TRUE(term.Begin(12, t0 + milliseconds(3010)));
  EXPECT_TRUE(term.Leads(t0 + milliseconds(3020)));
  EXPECT_EQ(term.epoch(), 12);
}

}  // namespace
}  // namespace fluxon
