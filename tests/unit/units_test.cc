#include "fluxon/units.h"

#include <gtest/gtest.h>

namespace fluxon {
namespace {

TEST(ExactFitSlots, QwenPageValueGives113SlotsPerGrant) {
  EXPECT_EQ(SlotSizeFor(4'718'592), 4'718'592u);  // already 4 KiB aligned: no rounding
  EXPECT_EQ(SlotsPerGrant(SlotSizeFor(4'718'592)), 113u);
  // A power-of-two class would have given 64 slots of 8 MiB.
  EXPECT_NE(SlotsPerGrant(SlotSizeFor(4'718'592)), kGrantBytes / (8 * kMiB));
}

TEST(ExactFitSlots, AlignsUpToFourKiBWithMinimum) {
  EXPECT_EQ(SlotSizeFor(1), 4096u);
  EXPECT_EQ(SlotSizeFor(4096), 4096u);
  EXPECT_EQ(SlotSizeFor(4097), 8192u);
  EXPECT_EQ(SlotSizeFor(5'000'000), 5'001'216u);
  EXPECT_EQ(SlotSizeFor(kGrantBytes), kGrantBytes);
  EXPECT_EQ(SlotsPerGrant(SlotSizeFor(kGrantBytes)), 1u);
  EXPECT_EQ(SlotsPerGrant(4096), 131072u);
  EXPECT_EQ(SlotsPerGrant(SlotSizeFor(300 * kMiB)), 1u);
}

TEST(ExpectedCapacity, DesignExampleGives207Grants) {
  // value_len 4,718,592 and a 0.8 payload target of 109,951,162,777 bytes.
  EXPECT_EQ(ExpectedGrants(4'718'592, 109'951'162'777), 207u);
  // 207 grants hold 23,391 slots = 110,372,585,472 payload bytes.
  EXPECT_EQ(207 * SlotsPerGrant(4'718'592), 23'391u);
  EXPECT_EQ(207 * SlotsPerGrant(4'718'592) * 4'718'592, 110'372'585'472u);
  // Dividing by 512 MiB alone (ignoring grant tails) would have given too few grants.
  EXPECT_LT(CeilDiv(109'951'162'777, kGrantBytes), 207u);
}

TEST(ExpectedCapacity, ExactMultipleNeedsNoExtraGrant) {
  const uint64_t per_grant = SlotsPerGrant(4'718'592) * 4'718'592;
  EXPECT_EQ(ExpectedGrants(4'718'592, per_grant), 1u);
  EXPECT_EQ(ExpectedGrants(4'718'592, per_grant + 1), 2u);
  EXPECT_EQ(ExpectedGrants(4'718'592, 1), 1u);
}

}  // namespace
}  // namespace fluxon
