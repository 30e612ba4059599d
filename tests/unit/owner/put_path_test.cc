// PutPath on its own (src/owner/put_path.h): Start reserves every key and claims one slot per key
// or nothing; Abort, ExpireDue (put_lease) and AbortSession give keys and slots back; Commit makes
// the values locally readable before the master answers (V1) and consumes the put even when the
// publisher has no room for it.
#include "owner/put_path.h"

#include "tests/unit/owner/owner_parts_fixture.h"

namespace fluxon::testing {
namespace {

using ::testing::ElementsAre;

class PutPathTest : public OwnerPartsTest {};

TEST_F(PutPathTest, StartReservesEveryKeyAndClaimsOneSlotPerKey) {
  OwnerParts& o = Make();
  std::vector<uint32_t> conflicts;
  auto put = o.puts->Start(1, Args(Keys("k", 3), {1, 2}), &conflicts);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_NE(put->put_id, 0u);
  ASSERT_EQ(put->offsets.size(), 3u);
  for (uint64_t off : put->offsets) {
    EXPECT_GE(off, o.memory->segment().data_offset());
    EXPECT_LE(off + kValueLen, o.memory->segment().total_bytes());
  }
  EXPECT_NE(put->offsets[0], put->offsets[1]);
  EXPECT_NE(put->offsets[1], put->offsets[2]);
  for (const std::string& k : Keys("k", 3)) EXPECT_EQ(o.State(k), "reserved");
  EXPECT_EQ(o.SlotsIn(SlotState::kPrepared), 3);
  EXPECT_EQ(o.puts->prepared(), 1u);
  EXPECT_EQ(o.counters->reserved_entries.load(), 3);
  EXPECT_TRUE(conflicts.empty());
  // put_ids carry the node id in their high bits (T2: unique per value across owners).
  EXPECT_EQ(put->put_id >> kPutIdSeqBits, o.node_id());
}

// G3: keys are reserved all or none; a conflict names the indices already present and leaves
// nothing of the new batch reserved or claimed.
TEST_F(PutPathTest, ConflictReportsIndicesAndReservesNothing) {
  OwnerParts& o = Make();
  ASSERT_TRUE(PutAndPublish(o, {"done"}).ok());  // committed
  auto prepared = o.puts->Start(1, Args({"b"}), nullptr);
  ASSERT_TRUE(prepared.ok());  // reserved by another prepared put
  const int64_t prepared_slots = o.SlotsIn(SlotState::kPrepared);

  std::vector<uint32_t> conflicts;
  auto put = o.puts->Start(2, Args({"a", "b", "c", "done"}), &conflicts);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(conflicts, ElementsAre(1, 3));
  EXPECT_EQ(o.State("a"), "absent");
  EXPECT_EQ(o.State("c"), "absent");
  EXPECT_EQ(o.State("b"), "reserved");
  EXPECT_EQ(o.State("done"), "committed");
  EXPECT_EQ(o.SlotsIn(SlotState::kPrepared), prepared_slots);
  EXPECT_EQ(o.puts->prepared(), 1u);
  EXPECT_EQ(o.counters->put_conflicts.load(), 1);
  EXPECT_EQ(o.counters->reserved_entries.load(), 1);
}

// Validation happens before anything is reserved (put_path.h).
TEST_F(PutPathTest, InvalidBatchesReserveNothing) {
  OwnerParts& o = Make();
  PutStartArgs bad_groups = Args(Keys("g", 3), {1, 1});  // covers 2 of 3 keys
  PutStartArgs parent_inside = Args(Keys("p", 2));
  parent_inside.options.parent_key = "p1";
  for (PutStartArgs a : {Args(Keys("z", 2), {}, 0), bad_groups, parent_inside, Args({"x", "x"})}) {
    auto put = o.puts->Start(1, a, nullptr);
    EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument) << put.status();
  }
  EXPECT_EQ(o.keys->size(), 0u);
  EXPECT_EQ(o.SlotsIn(SlotState::kPrepared), 0);
  EXPECT_EQ(o.puts->prepared(), 0u);
}

// A failed claim leaves nothing reserved: a claim the pool can never serve (ResourceExhausted,
// counted as put_no_space), and a claim cancelled because the owner stops (Unavailable).
TEST_F(PutPathTest, ClaimFailureLeavesNothingReserved) {
  OwnerParts& o = Make();
  // 512 MiB values: one per grant, and a 1 GiB segment has two grant positions.
  auto huge = o.puts->Start(1, Args(Keys("huge", 3), {}, int64_t{512} << 20), nullptr);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_EQ(o.counters->put_no_space.load(), 1);
  for (const std::string& k : Keys("huge", 3)) EXPECT_EQ(o.State(k), "absent");

  o.pool().CancelClaims();
  auto cancelled = o.puts->Start(1, Args(Keys("c", 2)), nullptr);
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kUnavailable) << cancelled.status();
  EXPECT_EQ(o.keys->size(), 0u);
  EXPECT_EQ(o.counters->reserved_entries.load(), 0);
  EXPECT_EQ(o.SlotsIn(SlotState::kPrepared), 0);
  EXPECT_EQ(o.puts->prepared(), 0u);
}

// A prepared put belongs to its session: another session's put id is NotFound and changes
// nothing; Abort frees the keys and the slots, once.
TEST_F(PutPathTest, AbortFreesSlotsAndKeysOnceAndOnlyForItsSession) {
  OwnerParts& o = Make();
  auto put = o.puts->Start(1, Args(Keys("k", 4)), nullptr);
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(o.puts->Abort(2, put->put_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(o.puts->Commit(2, put->put_id, nullptr, false).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(o.State("k0"), "reserved");
  EXPECT_EQ(o.SlotsIn(SlotState::kPrepared), 4);

  ASSERT_TRUE(o.puts->Abort(1, put->put_id).ok());
  for (const std::string& k : Keys("k", 4)) EXPECT_EQ(o.State(k), "absent");
  EXPECT_EQ(o.SlotsIn(SlotState::kPrepared), 0);
  EXPECT_EQ(o.puts->prepared(), 0u);
  EXPECT_EQ(o.counters->put_aborts.load(), 1);
  EXPECT_EQ(o.puts->Abort(1, put->put_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(o.counters->put_aborts.load(), 1);
  // The keys can be put again.
  EXPECT_TRUE(PutAndPublish(o, Keys("k", 4)).ok());
  EXPECT_TRUE(o.pool().CheckConsistency().ok());
}

// V1 (and P1): Commit makes every value readable here before it returns, while the master's
// PublishBatch is still delayed; no route exists yet (V2). The PutDone comes after the route.
TEST_F(PutPathTest, V1CommitMakesValuesReadableBeforeTheMasterAnswers) {
  OwnerParts& o = Make();
  Fault("master.PublishBatch", FaultAction::kDelay, 1, milliseconds(10'000));
  const std::vector<std::string> keys = Keys("v", 3);
  auto put = StartTagged(o, 1, keys);
  ASSERT_TRUE(put.ok());
  DoneLatch done;
  const auto begin = Clock::now();
  ASSERT_TRUE(o.puts->Commit(1, put->put_id, done.Callback(), false).ok());
  EXPECT_LT(Clock::now() - begin, milliseconds(2'000));  // did not wait for the delayed publish
  EXPECT_EQ(o.puts->prepared(), 0u);                     // the commit consumed the put
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(o.State(keys[i]), "local_visible");
    HolderRef h;
    uint64_t cohort = 99;
    ASSERT_TRUE(o.keys->Pin(keys[i], &h, &cohort));
    EXPECT_EQ(cohort, 0u);  // not committed yet
    EXPECT_EQ(h->offset, put->offsets[i]);
    EXPECT_EQ(h->put_id, put->put_id);
    EXPECT_EQ(TagAt(o, h->offset), TagOf(keys[i]));
    EXPECT_FALSE(RouteOf(master(), keys[i]).has_value());
  }
  EXPECT_EQ(o.SlotsIn(SlotState::kPendingLocalVisible), 3);
  EXPECT_FALSE(done.Ready());

  faults_.Clear("master.PublishBatch");  // ends the delay: the publish goes through
  ASSERT_TRUE(done.Wait().ok());
  for (const std::string& k : keys) {
    EXPECT_EQ(o.State(k), "committed");
    EXPECT_TRUE(RouteOf(master(), k).has_value());
  }
}

// A commit consumes its put: when the publish queue stays full for commit_wait_timeout the put is
// aborted and nothing stays reserved or claimed.
TEST_F(PutPathTest, CommitWithoutAQueuePlaceAbortsThePut) {
  PartsOptions po;
  po.run_publisher = false;  // the queue is never drained
  po.publish_queue_capacity = 1;
  po.commit_wait_timeout = milliseconds(50);
  OwnerParts& o = Make(po);
  auto first = StartTagged(o, 1, {"first"});
  auto second = StartTagged(o, 1, {"second", "third"});
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(o.puts->Commit(1, first->put_id, nullptr, false).ok());
  const absl::Status s = o.puts->Commit(1, second->put_id, nullptr, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(o.counters->commit_timeouts.load(), 1);
  EXPECT_EQ(o.State("second"), "absent");
  EXPECT_EQ(o.State("third"), "absent");
  EXPECT_EQ(o.State("first"), "local_visible");
  EXPECT_EQ(o.SlotsIn(SlotState::kPrepared), 0);
  EXPECT_EQ(o.puts->prepared(), 0u);
  EXPECT_EQ(o.puts->Abort(1, second->put_id).code(), absl::StatusCode::kNotFound);
}

// A prepared put not committed or aborted within put_lease is aborted by ExpireDue, through the
// abort path; a committed put is not the table's any more.
TEST_F(PutPathTest, ExpireDueAbortsPutsPastTheLease) {
  PartsOptions po;
  po.put_lease = milliseconds(200);
  OwnerParts& o = Make(po);
  const auto before = Clock::now();
  auto stale = o.puts->Start(1, Args(Keys("s", 2)), nullptr);
  auto committed = StartTagged(o, 1, {"c"});
  ASSERT_TRUE(stale.ok() && committed.ok());
  DoneLatch done;
  ASSERT_TRUE(o.puts->Commit(1, committed->put_id, done.Callback(), false).ok());
  ASSERT_TRUE(done.Wait().ok());

  EXPECT_EQ(o.puts->ExpireDue(before + milliseconds(199)), 0u);  // within the lease
  EXPECT_EQ(o.State("s0"), "reserved");
  EXPECT_EQ(o.puts->ExpireDue(Clock::now() + milliseconds(200)), 1u);
  EXPECT_EQ(o.counters->puts_expired.load(), 1);
  EXPECT_EQ(o.State("s0"), "absent");
  EXPECT_EQ(o.State("s1"), "absent");
  EXPECT_EQ(o.State("c"), "committed");
  EXPECT_EQ(o.SlotsIn(SlotState::kPrepared), 0);
  EXPECT_EQ(o.puts->Commit(1, stale->put_id, nullptr, false).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(o.puts->ExpireDue(Clock::now() + milliseconds(10'000)), 0u);
}

// A session's prepared puts are aborted when it ends; other sessions' are kept.
TEST_F(PutPathTest, AbortSessionAbortsOnlyThatSessionsPuts) {
  OwnerParts& o = Make();
  ASSERT_TRUE(o.puts->Start(1, Args({"a1"}), nullptr).ok());
  ASSERT_TRUE(o.puts->Start(1, Args({"a2", "a3"}), nullptr).ok());
  auto other = o.puts->Start(2, Args({"b1"}), nullptr);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(o.puts->AbortSession(1), 2u);
  EXPECT_EQ(o.State("a1"), "absent");
  EXPECT_EQ(o.State("a3"), "absent");
  EXPECT_EQ(o.State("b1"), "reserved");
  EXPECT_EQ(o.SlotsIn(SlotState::kPrepared), 1);
  EXPECT_EQ(o.puts->prepared(), 1u);
  EXPECT_EQ(o.puts->AbortSession(1), 0u);
  EXPECT_TRUE(o.puts->Abort(2, other->put_id).ok());
}

}  // namespace
}  // namespace fluxon::testing
