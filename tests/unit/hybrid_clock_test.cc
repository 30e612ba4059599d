// HybridClock (src/common/hybrid_clock.h): stamps strictly increase, never fall below the wall
// clock, follow what was observed, and an observed stamp far in the future is ignored (a peer
// cannot drag the clock ahead or make it wrap).
#include "common/hybrid_clock.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace fluxon {
namespace {

TEST(HybridClock, StampsIncreaseFollowObservedStampsAndIgnoreTheFarFuture) {
  HybridClock c;
  const uint64_t a = c.Now();
  EXPECT_GE(a, HybridClock::PhysicalStamp() - (uint64_t{1000} << HybridClock::kLogicalBits));
  EXPECT_GT(c.Now(), a);
  const uint64_t ahead = HybridClock::PhysicalStamp() + (uint64_t{60'000} << 16);  // 1 min
  EXPECT_TRUE(c.Observe(ahead));
  EXPECT_GT(c.Now(), ahead);  // a version given after seeing `ahead` sorts after it
  EXPECT_TRUE(c.Observe(1));  // an older stamp changes nothing
  EXPECT_GT(c.Now(), ahead);
  const uint64_t before = c.Last();
  EXPECT_FALSE(c.Observe(UINT64_MAX));  // would wrap the clock on the next Now()
  EXPECT_FALSE(c.Observe(HybridClock::PhysicalStamp() + 2 * HybridClock::kMaxAhead));
  EXPECT_EQ(c.Last(), before);
  EXPECT_GT(c.Now(), before);
}

}  // namespace
}  // namespace fluxon
