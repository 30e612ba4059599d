// GetPath on its own (src/owner/get_path.h): classification into LocalJoin / InflightJoin /
// Leader (G1, G2), one master Lookup per batch (G8), one leader per key whose joiners share its
// terminal state (G6, G7), the prefix over the caller's groups (G4), and the release of
// everything past transferable_len at once (G5). Whether a value is still pinned is read from
// the evictor: an unpinned Committed value is evictable, a pinned one is not.
#include "owner/get_path.h"

#include "tests/unit/owner/owner_parts_fixture.h"

namespace fluxon::testing {
namespace {

// Runs GetPath::Start on a thread (a second client of the owner).
struct AsyncGet {
  AsyncGet(OwnerParts& o, uint64_t client, std::vector<std::string> keys)
      : thread([&o, client, keys = std::move(keys), this] {
          result = o.gets->Start(client, keys, {}, true);
        }) {}
  ~AsyncGet() {
    if (thread.joinable()) thread.join();
  }
  absl::StatusOr<GetStartOutcome> Join() {
    thread.join();
    return result;
  }
  absl::StatusOr<GetStartOutcome> result = absl::UnknownError("not run");
  std::thread thread;
};

class GetPathTest : public OwnerPartsTest {
 protected:
  // Holds the master's Lookup back, starts client 1's get of `key` (it leads) and then client 2's
  // (it joins), and returns once the joiner has classified the key.
  void StartLeaderAndJoiner(OwnerParts& o, const std::string& key, std::optional<AsyncGet>& leader,
                            std::optional<AsyncGet>& joiner) {
    Fault("master.Lookup", FaultAction::kDelay, 1, milliseconds(10'000));
    leader.emplace(o, 1, std::vector<std::string>{key});
    ASSERT_TRUE(WaitUntil([&] { return o.flights->size() == 1; }));
    joiner.emplace(o, 2, std::vector<std::string>{key});
    ASSERT_TRUE(WaitUntil([&] { return o.counters->get_batches.load() == 2; }));
    std::this_thread::sleep_for(milliseconds(100));  // the joiner has classified the key
  }
};

// Evicts what it can of `keys` (each is one cohort) and says which went.
std::vector<bool> Evictable(OwnerParts& o, const std::vector<std::string>& keys) {
  o.evictor->EvictSome(UINT64_MAX);
  std::vector<bool> gone;
  for (const std::string& k : keys) gone.push_back(o.State(k) == "absent");
  return gone;
}

// G1/G2: resident values are pinned (LocalJoin) and handed to a handle at their own offsets;
// no master call is needed for them (P1).
TEST_F(GetPathTest, LocalHitsArePinnedAndHandedToAHandle) {
  OwnerParts& o = Make();
  const std::vector<std::string> keys = Keys("h", 3);
  ASSERT_TRUE(PutAndPublish(o, keys).ok());
  const int64_t lookups = mc().lookup_batches.load();
  auto got = o.gets->Start(1, keys, {}, false);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->local_pinned, 3u);
  EXPECT_EQ(got->leader_started, 0u);
  EXPECT_EQ(got->inflight_joined, 0u);
  EXPECT_EQ(got->prefix.transferable_len, 3u);
  EXPECT_TRUE(got->prefix.all_hit());
  EXPECT_NE(got->handle_id, 0u);
  ASSERT_EQ(got->offsets.size(), 3u);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(TagAt(o, got->offsets[i]), TagOf(keys[i]));
    EXPECT_EQ(got->lens[i], static_cast<uint64_t>(kValueLen));
  }
  EXPECT_EQ(mc().lookup_batches.load(), lookups);
  EXPECT_EQ(o.counters->live_handles.load(), 1);
  // Pinned: nothing is evictable while the handle holds them; cancelled, all of it is.
  EXPECT_EQ(Evictable(o, keys), std::vector<bool>({false, false, false}));
  ASSERT_TRUE(o.gets->Cancel(1, got->handle_id).ok());
  EXPECT_EQ(Evictable(o, keys), std::vector<bool>({true, true, true}));
}

// G8/G10: the batch's leaders go to the master as one Lookup; misses are not handed out and
// leave no in-flight marker behind.
TEST_F(GetPathTest, MissesLeadOneLookupAndLeaveNoMarker) {
  OwnerParts& o = Make();
  auto got = o.gets->Start(1, Keys("m", 4), {}, true);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->leader_started, 4u);
  EXPECT_EQ(got->prefix.transferable_len, 0u);
  EXPECT_EQ(got->handle_id, 0u);
  EXPECT_EQ(mc().lookup_batches.load(), 1);
  EXPECT_EQ(mc().lookup_keys.load(), 4);
  EXPECT_EQ(o.flights->size(), 0u);
  EXPECT_EQ(o.handles->size(), 0u);
  EXPECT_EQ(o.counters->misses.load(), 4);
}

// G10: a Lookup that fails is a miss for its leaders, and cancels their markers.
TEST_F(GetPathTest, FailedLookupIsAMissAndLeavesNoMarker) {
  OwnerParts& o = Make();
  ASSERT_TRUE(PutAndPublish(o, {"here"}).ok());
  Fault("master.Lookup", FaultAction::kFail, 1);
  auto got = o.gets->Start(1, {"here", "nowhere"}, {}, true);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->local_pinned, 1u);
  EXPECT_EQ(got->leader_started, 1u);
  EXPECT_EQ(got->prefix.transferable_len, 1u);
  EXPECT_EQ(o.flights->size(), 0u);
  ASSERT_TRUE(o.gets->Cancel(1, got->handle_id).ok());
}

// G4/G5: the prefix is computed over the caller's groups after the hits are in their original
// places; a group with a miss ends it, and the pins past it are released inside Start.
TEST_F(GetPathTest, G4PrefixEndsAtTheFirstGroupWithAMissAndG5ReleasesTheRest) {
  OwnerParts& o = Make();
  ASSERT_TRUE(PutAndPublish(o, {"p0", "p1", "p2", "p4"}).ok());  // p3 is missing
  const std::vector<std::string> keys = {"p0", "p1", "p2", "p3", "p4"};
  auto got = o.gets->Start(1, keys, {2, 2, 1}, true);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->prefix.raw_prefix_hit_len, 3u);
  EXPECT_EQ(got->prefix.transferable_len, 2u);  // the group {p2, p3} is not whole
  EXPECT_EQ(got->prefix.prefix_hit_groups, 1u);
  ASSERT_TRUE(got->prefix.first_miss_index.has_value());
  EXPECT_EQ(*got->prefix.first_miss_index, 3u);
  EXPECT_EQ(got->local_pinned, 4u);
  ASSERT_EQ(got->offsets.size(), 2u);
  EXPECT_EQ(TagAt(o, got->offsets[1]), TagOf("p1"));
  EXPECT_EQ(o.counters->suffix_released.load(), 2);  // p2 and p4
  EXPECT_EQ(Evictable(o, {"p0", "p1", "p2", "p4"}), std::vector<bool>({false, false, true, true}));
  ASSERT_TRUE(o.gets->Cancel(1, got->handle_id).ok());
}

// G5: without prefix_best_effort a batch with any miss transfers nothing and holds nothing.
TEST_F(GetPathTest, G5NotBestEffortWithAMissHoldsNothing) {
  OwnerParts& o = Make();
  ASSERT_TRUE(PutAndPublish(o, {"n0", "n1"}).ok());
  auto got = o.gets->Start(1, {"n0", "n1", "n2"}, {}, false);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->prefix.transferable_len, 0u);
  EXPECT_EQ(got->handle_id, 0u);
  EXPECT_EQ(o.counters->suffix_released.load(), 2);
  EXPECT_EQ(o.handles->size(), 0u);
  EXPECT_EQ(Evictable(o, {"n0", "n1"}), std::vector<bool>({true, true}));
}

// G5: get_transfer keeps a whole-group prefix and drops the rest at once; release_views drops
// the views; each is accepted once, only on a group boundary, only from the handle's session.
TEST_F(GetPathTest, G5TransferKeepsAGroupPrefixAndReleaseDropsTheViews) {
  OwnerParts& o = Make();
  const std::vector<std::string> keys = Keys("t", 4);
  ASSERT_TRUE(PutAndPublish(o, keys).ok());
  auto got = o.gets->Start(1, keys, {2, 2}, false);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(o.gets->Transfer(1, got->handle_id, 3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(o.gets->Transfer(2, got->handle_id, 2).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(o.gets->Transfer(1, got->handle_id, 2).ok());
  EXPECT_EQ(o.gets->Transfer(1, got->handle_id, 2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(o.gets->Cancel(1, got->handle_id).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Evictable(o, keys), std::vector<bool>({false, false, true, true}));
  ASSERT_TRUE(o.gets->Release(1, got->handle_id).ok());
  EXPECT_EQ(o.gets->Release(1, got->handle_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Evictable(o, {"t0", "t1"}), std::vector<bool>({true, true}));
}

// Handles not consumed within handle_ttl, and a session's handles when it ends, are dropped
// through the same path as cancel.
TEST_F(GetPathTest, ExpiredAndSessionHandlesAreReleased) {
  PartsOptions po;
  po.handle_ttl = milliseconds(100);
  OwnerParts& o = Make(po);
  ASSERT_TRUE(PutAndPublish(o, {"e0", "e1"}).ok());
  auto expiring = o.gets->Start(1, {"e0"}, {}, false);
  auto session = o.gets->Start(2, {"e1"}, {}, false);
  ASSERT_TRUE(expiring.ok() && session.ok());
  EXPECT_EQ(o.gets->DropSession(2), 1u);
  EXPECT_EQ(o.gets->ExpireDue(Clock::now() + milliseconds(101)), 1u);
  EXPECT_EQ(o.counters->handles_expired.load(), 1);
  EXPECT_EQ(o.gets->Transfer(1, expiring->handle_id, 0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Evictable(o, {"e0", "e1"}), std::vector<bool>({true, true}));
}

// G6/G7: a key has one leader on this owner; a get of it while the leader's lookup is in flight
// joins, and sees the leader's terminal state and its one canonical holder (here: the value a
// put committed while the leader was looking it up; the route names this owner, T2).
TEST_F(GetPathTest, G7JoinerSharesTheLeadersHolder) {
  OwnerParts& o = Make();
  std::optional<AsyncGet> leader, joiner;
  ASSERT_NO_FATAL_FAILURE(StartLeaderAndJoiner(o, "late", leader, joiner));
  ASSERT_TRUE(PutAndPublish(o, {"late"}).ok());
  faults_.Clear("master.Lookup");  // the leader's Lookup runs now and finds the route here
  auto led = leader->Join();
  auto joined = joiner->Join();
  ASSERT_TRUE(led.ok() && joined.ok());
  EXPECT_EQ(led->leader_started, 1u);
  EXPECT_EQ(joined->inflight_joined, 1u);
  EXPECT_EQ(joined->leader_started, 0u);
  EXPECT_EQ(led->prefix.transferable_len, 1u);
  EXPECT_EQ(joined->prefix.transferable_len, 1u);
  EXPECT_EQ(joined->offsets, led->offsets);
  EXPECT_EQ(TagAt(o, joined->offsets[0]), TagOf("late"));
  EXPECT_EQ(mc().lookup_batches.load(), 1);  // only the leader asked the master
  EXPECT_EQ(o.flights->size(), 0u);
  EXPECT_TRUE(o.gets->Cancel(1, led->handle_id).ok());
  EXPECT_TRUE(o.gets->Cancel(2, joined->handle_id).ok());
}

// G7/G10: a leader that misses ends its op Failed; its joiner sees the miss, and no marker is
// left, so the next get leads again.
TEST_F(GetPathTest, G7JoinerSeesTheLeadersMiss) {
  OwnerParts& o = Make();
  std::optional<AsyncGet> leader, joiner;
  ASSERT_NO_FATAL_FAILURE(StartLeaderAndJoiner(o, "gone", leader, joiner));
  faults_.Clear("master.Lookup");
  auto led = leader->Join();
  auto joined = joiner->Join();
  ASSERT_TRUE(led.ok() && joined.ok());
  EXPECT_EQ(joined->inflight_joined, 1u);
  EXPECT_EQ(led->prefix.transferable_len, 0u);
  EXPECT_EQ(joined->prefix.transferable_len, 0u);
  EXPECT_EQ(o.flights->size(), 0u);
  auto again = o.gets->Start(3, {"gone"}, {}, true);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->leader_started, 1u);
}

// A joiner waits at most join_timeout and then sees a miss, never a partial state.
TEST_F(GetPathTest, JoinerTimesOutToAMiss) {
  PartsOptions po;
  po.join_timeout = milliseconds(100);
  OwnerParts& o = Make(po);
  Fault("master.Lookup", FaultAction::kDelay, 1, milliseconds(10'000));
  AsyncGet leader(o, 1, {"slow"});
  ASSERT_TRUE(WaitUntil([&] { return o.flights->size() == 1; }));
  const auto begin = Clock::now();
  auto joined = o.gets->Start(2, {"slow"}, {}, true);
  const auto waited = Clock::now() - begin;
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->inflight_joined, 1u);
  EXPECT_EQ(joined->prefix.transferable_len, 0u);
  EXPECT_GE(waited, milliseconds(90));
  EXPECT_LT(waited, milliseconds(3'000));
  faults_.Clear("master.Lookup");
  ASSERT_TRUE(leader.Join().ok());
  EXPECT_EQ(o.flights->size(), 0u);
}

}  // namespace
}  // namespace fluxon::testing
