// HandleTable on its own (src/owner/handle_table.h): a handle holds the pins of a transferable
// prefix for its session; get_transfer keeps a whole-group prefix and drops the rest at once
// (G5), release_views and cancel drop the rest, each once; unconsumed handles expire after
// handle_ttl and views after view_lease; a session's handles and views go when it ends. Whether
// a pin is still held is read from the holder's reference count (the test keeps one copy).
#include "owner/handle_table.h"

#include "tests/unit/owner/owner_parts_fixture.h"

namespace fluxon::testing {
namespace {

class HandleTableTest : public OwnerPartsTest {
 protected:
  // The table under test, counting into `counters`.
  HandleTable& Table(milliseconds handle_ttl = milliseconds(30'000),
                     milliseconds view_lease = milliseconds(300'000)) {
    table_.emplace(&counters, handle_ttl, view_lease);
    return *table_;
  }
  // `n` holders, each on its own slot of a new owner; the test keeps these copies, the table gets
  // others.
  std::vector<HolderRef> Holders(int n) {
    OwnerParts& o = Make();
    std::vector<HolderRef> out;
    for (int i = 0; i < n; ++i) out.push_back(LocalHolder(o, "h" + std::to_string(i)));
    return out;
  }
  // Whether the table still holds each of `mine` (a pin is a second reference).
  static std::vector<bool> Held(const std::vector<HolderRef>& mine) {
    std::vector<bool> out;
    for (const HolderRef& h : mine) out.push_back(h.use_count() > 1);
    return out;
  }

  OwnerCounters counters;
  std::optional<HandleTable> table_;
};

TEST_F(HandleTableTest, OpenHoldsThePinsAndCountsALiveHandle) {
  HandleTable& table = Table();
  std::vector<HolderRef> mine = Holders(2);
  const uint64_t a = table.Open(1, mine, {});
  const uint64_t b = table.Open(1, {mine[0]}, {});
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(table.size(), 2u);
  EXPECT_EQ(counters.live_handles.load(), 2);
  EXPECT_EQ(mine[0].use_count(), 3);
  EXPECT_EQ(Held(mine), std::vector<bool>({true, true}));
  EXPECT_TRUE(table.Cancel(1, a).ok());
  EXPECT_TRUE(table.Cancel(1, b).ok());
  EXPECT_EQ(Held(mine), std::vector<bool>({false, false}));
  EXPECT_EQ(counters.live_handles.load(), 0);
  EXPECT_EQ(table.size(), 0u);
}

// G5: consume keeps a prefix on a group boundary and drops the rest of the pins at once; the
// handle becomes views (live_handles -> live_views), consumed once, released once.
TEST_F(HandleTableTest, G5ConsumeKeepsAGroupPrefixAndDropsTheRestAtOnce) {
  HandleTable& table = Table();
  std::vector<HolderRef> mine = Holders(5);
  const uint64_t id = table.Open(1, mine, {2, 2, 1});
  EXPECT_EQ(table.Consume(1, id, 3).code(), absl::StatusCode::kInvalidArgument);  // mid-group
  EXPECT_EQ(table.Consume(1, id, 6).code(), absl::StatusCode::kInvalidArgument);  // too long
  EXPECT_EQ(Held(mine), std::vector<bool>(5, true));  // a refused consume changes nothing
  ASSERT_TRUE(table.Consume(1, id, 2).ok());
  EXPECT_EQ(Held(mine), std::vector<bool>({true, true, false, false, false}));
  EXPECT_EQ(counters.live_handles.load(), 0);
  EXPECT_EQ(counters.live_views.load(), 1);
  EXPECT_EQ(table.Consume(1, id, 2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table.Cancel(1, id).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(table.Release(1, id).ok());
  EXPECT_EQ(Held(mine), std::vector<bool>(5, false));
  EXPECT_EQ(counters.live_views.load(), 0);
  EXPECT_EQ(table.Release(1, id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.size(), 0u);
}

// Consume 0 keeps every pin; views are released by Release only, never by Cancel; an unconsumed
// handle has no views to release.
TEST_F(HandleTableTest, ConsumeAllKeepsEveryPinAndReleaseNeedsAConsume) {
  HandleTable& table = Table();
  std::vector<HolderRef> mine = Holders(3);
  const uint64_t id = table.Open(1, mine, {});
  EXPECT_EQ(table.Release(1, id).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(table.Consume(1, id, 0).ok());
  EXPECT_EQ(Held(mine), std::vector<bool>(3, true));
  ASSERT_TRUE(table.Release(1, id).ok());
  EXPECT_EQ(Held(mine), std::vector<bool>(3, false));
}

// A handle belongs to the session that opened it: another session's calls are NotFound and
// change nothing.
TEST_F(HandleTableTest, AnotherSessionsHandleIsNotFound) {
  HandleTable& table = Table();
  std::vector<HolderRef> mine = Holders(1);
  const uint64_t id = table.Open(1, mine, {});
  EXPECT_EQ(table.Consume(2, id, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Cancel(2, id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Release(2, id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Cancel(1, id + 1000).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Held(mine), std::vector<bool>({true}));
  EXPECT_EQ(counters.live_handles.load(), 1);
  EXPECT_TRUE(table.Cancel(1, id).ok());
}

// An unconsumed handle expires handle_ttl after it was opened, through the same drop path.
TEST_F(HandleTableTest, UnconsumedHandleExpiresAfterHandleTtl) {
  HandleTable& table = Table(milliseconds(100));
  std::vector<HolderRef> mine = Holders(2);
  const auto before = Clock::now();
  const uint64_t id = table.Open(1, mine, {});
  EXPECT_EQ(table.ExpireDue(before + milliseconds(99)), 0u);
  EXPECT_EQ(Held(mine), std::vector<bool>({true, true}));
  EXPECT_EQ(table.ExpireDue(Clock::now() + milliseconds(100)), 1u);
  EXPECT_EQ(Held(mine), std::vector<bool>({false, false}));
  EXPECT_EQ(counters.handles_expired.load(), 1);
  EXPECT_EQ(counters.live_handles.load(), 0);
  EXPECT_EQ(table.Consume(1, id, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.ExpireDue(Clock::now() + milliseconds(100)), 0u);  // dropped once
}

// Views live for view_lease from the consume, not for handle_ttl: past handle_ttl they stay;
// past view_lease they are released (views_expired) and a later release_views is NotFound.
TEST_F(HandleTableTest, ViewsExpireAfterViewLeaseNotHandleTtl) {
  HandleTable& table = Table(milliseconds(100), milliseconds(1'000));
  std::vector<HolderRef> mine = Holders(2);
  const uint64_t id = table.Open(1, mine, {});
  ASSERT_TRUE(table.Consume(1, id, 0).ok());
  const auto consumed = Clock::now();
  EXPECT_EQ(table.ExpireDue(consumed + milliseconds(500)), 0u);  // past handle_ttl
  EXPECT_EQ(Held(mine), std::vector<bool>({true, true}));
  EXPECT_EQ(table.ExpireDue(Clock::now() + milliseconds(1'000)), 1u);
  EXPECT_EQ(Held(mine), std::vector<bool>({false, false}));
  EXPECT_EQ(counters.views_expired.load(), 1);
  EXPECT_EQ(counters.handles_expired.load(), 0);
  EXPECT_EQ(counters.live_views.load(), 0);
  EXPECT_EQ(table.Release(1, id).code(), absl::StatusCode::kNotFound);
}

// A session that ended drops its handles and views (both gauges), and only its own.
TEST_F(HandleTableTest, DropSessionDropsThatSessionsHandlesAndViewsOnly) {
  HandleTable& table = Table();
  std::vector<HolderRef> mine = Holders(3);
  const uint64_t handle = table.Open(1, {mine[0]}, {});
  const uint64_t views = table.Open(1, {mine[1]}, {});
  ASSERT_TRUE(table.Consume(1, views, 0).ok());
  const uint64_t other = table.Open(2, {mine[2]}, {});
  EXPECT_EQ(table.DropSession(1), 2u);
  EXPECT_EQ(Held(mine), std::vector<bool>({false, false, true}));
  EXPECT_EQ(counters.live_handles.load(), 1);
  EXPECT_EQ(counters.live_views.load(), 0);
  EXPECT_EQ(table.Cancel(1, handle).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.DropSession(1), 0u);
  EXPECT_TRUE(table.Cancel(2, other).ok());
}

}  // namespace
}  // namespace fluxon::testing
