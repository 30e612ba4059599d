// Publisher on its own (src/owner/publisher.h): one PublishBatch per committed batch, promoted
// only after the master's route and admitted to the hot tier one cohort per group (A1, A2, V3);
// lost, duplicated and undelivered answers roll forward with the same identity (A2, T1); definite
// answers drop the local values; the bounded queue's backpressure; stopping cancels the backlog.
#include "owner/publisher.h"
#include "owner/republisher.h"

#include "tests/unit/owner/owner_parts_fixture.h"

namespace fluxon::testing {
namespace {

class PublisherTest : public OwnerPartsTest {};

// A1/A2: one batch is one PublishBatch; each atomic group becomes one cohort of the hot tier.
TEST_F(PublisherTest, OnePublishBatchPerBatchAndOneCohortPerGroup) {
  OwnerParts& o = Make();
  const std::vector<std::string> keys = Keys("g", 5);
  ASSERT_TRUE(PutAndPublish(o, keys, {2, 3}).ok());
  EXPECT_EQ(mc().publish_batches.load(), 1);
  EXPECT_EQ(mc().published_items.load(), 5);
  EXPECT_EQ(o.counters->publish_batches.load(), 1);
  for (const std::string& k : keys) {
    EXPECT_EQ(o.State(k), "committed");
    auto route = RouteOf(master(), k);
    ASSERT_TRUE(route.has_value());
    EXPECT_EQ(route->node_id(), o.node_id());
    EXPECT_EQ(route->generation(), o.generation());
  }
  EXPECT_EQ(o.SlotsIn(SlotState::kCommitted), 5);
  EXPECT_EQ(o.hot->size(), 2u);
  const uint64_t first = o.keys->CommittedCohort("g0");
  const uint64_t second = o.keys->CommittedCohort("g2");
  EXPECT_NE(first, 0u);
  EXPECT_EQ(o.keys->CommittedCohort("g1"), first);
  EXPECT_NE(second, first);
  EXPECT_EQ(o.keys->CommittedCohort("g3"), second);
  EXPECT_EQ(o.keys->CommittedCohort("g4"), second);
  EXPECT_GE(o.hot->weight(), 5u * kValueLen);
  EXPECT_EQ(o.publisher->backlog(), 0u);
}

// V3: Committed (route live) and hot-tier admission wait for the master's answer; until then the
// values are LocalVisible, in no cohort, and not evictable.
TEST_F(PublisherTest, V3PromotionAndAdmissionWaitForTheRoute) {
  OwnerParts& o = Make();
  Fault("master.PublishBatch", FaultAction::kDelay, 1, milliseconds(10'000));
  auto put = StartTagged(o, 1, Keys("d", 2), {2});
  ASSERT_TRUE(put.ok());
  DoneLatch done;
  ASSERT_TRUE(o.puts->Commit(1, put->put_id, done.Callback(), false).ok());
  ASSERT_TRUE(WaitUntil([&] { return o.publisher->backlog() == 1; }));
  EXPECT_EQ(o.State("d0"), "local_visible");
  EXPECT_EQ(o.keys->CommittedCohort("d0"), 0u);
  EXPECT_EQ(o.hot->size(), 0u);
  EXPECT_EQ(o.SlotsIn(SlotState::kPendingLocalVisible), 2);
  EXPECT_EQ(o.evictor->EvictSome(UINT64_MAX), 0u);
  EXPECT_FALSE(done.Ready());

  faults_.Clear("master.PublishBatch");
  ASSERT_TRUE(done.Wait().ok());
  EXPECT_EQ(o.State("d0"), "committed");
  EXPECT_EQ(o.SlotsIn(SlotState::kCommitted), 2);
  EXPECT_EQ(o.hot->size(), 1u);
  EXPECT_EQ(o.publisher->backlog(), 0u);
}

// A2/T1: the master applied the publish but its answer was lost; the retry carries the same
// identity, the master answers PUBLISHED again (idempotent), and the values end Committed once.
TEST_F(PublisherTest, DroppedAnswerIsRetriedWithTheSameIdentity) {
  OwnerParts& o = Make();
  Fault("master.PublishBatch", FaultAction::kDrop, 1);
  const std::vector<std::string> keys = Keys("r", 3);
  ASSERT_TRUE(PutAndPublish(o, keys).ok());
  EXPECT_EQ(mc().publish_batches.load(), 2);
  EXPECT_EQ(mc().published_items.load(), 3);
  EXPECT_EQ(mc().republished_items.load(), 3);  // the same (key, put_id, location) again
  EXPECT_EQ(mc().superseded_items.load(), 0);
  EXPECT_EQ(o.counters->publish_retries.load(), 1);
  EXPECT_EQ(o.counters->publish_batches.load(), 1);
  for (const std::string& k : keys) EXPECT_EQ(o.State(k), "committed");
  EXPECT_EQ(o.SlotsIn(SlotState::kCommitted), 3);
  EXPECT_EQ(o.hot->size(), 3u);  // admitted once
}

// A2/T1: a duplicated delivery is applied twice with the same identity and changes nothing.
TEST_F(PublisherTest, DuplicatedPublishIsAppliedOnce) {
  OwnerParts& o = Make();
  Fault("master.PublishBatch", FaultAction::kDuplicate, 1);
  ASSERT_TRUE(PutAndPublish(o, {"dup"}).ok());
  EXPECT_EQ(mc().published_items.load(), 1);
  EXPECT_EQ(mc().republished_items.load(), 1);
  EXPECT_EQ(master().route_count(), 1u);
  EXPECT_EQ(o.State("dup"), "committed");
  EXPECT_EQ(o.hot->size(), 1u);
}

// A2: a publish that was not delivered (uncertain) is retried until it is; the batch ends
// Committed after exactly one applied PublishBatch.
TEST_F(PublisherTest, UndeliveredPublishIsRetriedUntilDelivered) {
  OwnerParts& o = Make();
  Fault("master.PublishBatch", FaultAction::kFail, 2);
  ASSERT_TRUE(PutAndPublish(o, Keys("u", 2)).ok());
  EXPECT_EQ(mc().publish_batches.load(), 1);
  EXPECT_EQ(o.counters->publish_retries.load(), 2);
  EXPECT_EQ(o.State("u1"), "committed");
}

// A2: only a definite answer drops local values: a refused publish (never applied) erases the
// LocalVisible values and frees their slots, and PutDone carries the refusal (V2: no route).
TEST_F(PublisherTest, RefusedPublishDropsTheLocalValues) {
  OwnerParts& o = Make();
  Fault("master.PublishBatch", FaultAction::kRefuse, 1);
  const absl::Status s = PutAndPublish(o, Keys("x", 3));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  for (const std::string& k : Keys("x", 3)) {
    EXPECT_EQ(o.State(k), "absent");
    EXPECT_FALSE(RouteOf(master(), k).has_value());
  }
  EXPECT_EQ(o.SlotsIn(SlotState::kPendingLocalVisible), 0);
  EXPECT_EQ(o.SlotsIn(SlotState::kCommitted), 0);
  EXPECT_EQ(o.hot->size(), 0u);
  EXPECT_EQ(o.counters->publish_failures.load(), 1);
  EXPECT_EQ(o.counters->local_visible_entries.load(), 0);
  EXPECT_TRUE(PutAndPublish(o, Keys("x", 3)).ok());  // the keys are free again
}

// T2: a key another owner published first under another put_id is superseded: only that key's
// local value is dropped, the rest of the batch is committed, and PutDone says AlreadyExists.
TEST_F(PublisherTest, SupersededKeysAreDroppedTheRestCommitted) {
  OwnerParts& o = Make();
  ASSERT_TRUE(RegisterPeer(master(), 2, 22).ok());
  ASSERT_TRUE(PublishOne(master(), 2, 22, 5, "b").ok());

  const absl::Status s = PutAndPublish(o, {"a", "b"});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_EQ(o.State("a"), "committed");
  EXPECT_EQ(o.State("b"), "absent");
  auto route = RouteOf(master(), "b");
  ASSERT_TRUE(route.has_value());
  EXPECT_EQ(route->node_id(), 2u);
  EXPECT_EQ(route->put_id(), 5u);
  EXPECT_EQ(o.counters->superseded.load(), 1);
  EXPECT_EQ(o.SlotsIn(SlotState::kPendingLocalVisible), 0);
  EXPECT_EQ(o.SlotsIn(SlotState::kCommitted), 1);
}

// A2 (refusal clause): a publish refused because the master does not know this generation wakes
// the heartbeat, which registers again, and the batch is retried and published.
TEST_F(PublisherTest, GenerationRefusalReRegistersAndRetries) {
  PartsOptions po;
  po.heartbeat_interval = milliseconds(60'000);  // only a refusal wakes it within the test
  OwnerParts& o = Make(po);
  v1::UnregisterOwnerRequest gone;
  gone.set_node_id(o.node_id());
  gone.set_generation(o.generation());
  ASSERT_TRUE(master().UnregisterOwner(gone).ok());
  ASSERT_TRUE(PutAndPublish(o, {"after-restart"}).ok());
  EXPECT_EQ(o.State("after-restart"), "committed");
  EXPECT_TRUE(RouteOf(master(), "after-restart").has_value());
  EXPECT_EQ(o.counters->master_reregistrations.load(), 1);
  EXPECT_GE(o.counters->publish_retries.load(), 1);
  EXPECT_TRUE(o.registration->registered());
}

// A master table that forgot this owner under an epoch the owner had already seen (an elected
// master whose leadership lapsed and began again empty, or the owner unregistered meanwhile):
// the re-registration is answered as new, so a republish is due, and it puts back the routes
// of the values committed before.
TEST_F(PublisherTest, ATableThatForgotThisOwnerUnderTheSameEpochGetsItsRoutesRepublished) {
  PartsOptions po;
  po.heartbeat_interval = milliseconds(60'000);  // only a refusal wakes it within the test
  OwnerParts& o = Make(po);
  ASSERT_TRUE(PutAndPublish(o, {"before"}).ok());
  (void)o.registration->TakeRepublishDue();  // the first registration's (nothing was committed)
  v1::UnregisterOwnerRequest gone;
  gone.set_node_id(o.node_id());
  gone.set_generation(o.generation());
  ASSERT_TRUE(master().UnregisterOwner(gone).ok());
  ASSERT_FALSE(RouteOf(master(), "before").has_value());
  // Refused, re-registered, retried — all under the same epoch (the same MasterCore).
  ASSERT_TRUE(PutAndPublish(o, {"after"}).ok());
  ASSERT_TRUE(o.registration->TakeRepublishDue());
  Republisher republisher(Republisher::Options{}, o.registration.get(), &faulty(), o.keys.get(),
                          o.evictor.get(), o.counters.get(), &o.stop);
  ASSERT_TRUE(republisher.RunRound());
  EXPECT_TRUE(RouteOf(master(), "before").has_value());
  EXPECT_TRUE(RouteOf(master(), "after").has_value());
}

// Backpressure: ReservePlace never lets the queue hold more than queue_capacity jobs; a place
// not found within commit_wait_timeout is Unavailable; a place given back is free at once.
TEST_F(PublisherTest, ReservePlaceIsBoundedByCapacityAndCommitWaitTimeout) {
  PartsOptions po;
  po.run_publisher = false;
  po.publish_queue_capacity = 2;
  po.commit_wait_timeout = milliseconds(150);
  OwnerParts& o = Make(po);
  ASSERT_TRUE(o.publisher->ReservePlace().ok());
  ASSERT_TRUE(o.publisher->ReservePlace().ok());
  const auto begin = Clock::now();
  const absl::Status full = o.publisher->ReservePlace();
  const auto waited = Clock::now() - begin;
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable) << full;
  EXPECT_GE(waited, milliseconds(140));
  EXPECT_LT(waited, milliseconds(3'000));
  EXPECT_EQ(o.counters->commit_timeouts.load(), 1);
  o.publisher->CancelPlace();
  const auto again = Clock::now();
  EXPECT_TRUE(o.publisher->ReservePlace().ok());
  EXPECT_LT(Clock::now() - again, milliseconds(100));
  o.publisher->CancelPlace();
  o.publisher->CancelPlace();
}

// Backpressure: a commit waiting for a place gets one as soon as the actor takes a job out of
// the queue, and both batches are published.
TEST_F(PublisherTest, WaitingCommitProceedsWhenTheQueueDrains) {
  PartsOptions po;
  po.run_publisher = false;
  po.publish_queue_capacity = 1;
  OwnerParts& o = Make(po);
  auto first = StartTagged(o, 1, {"q1"});
  auto second = StartTagged(o, 1, {"q2"});
  ASSERT_TRUE(first.ok() && second.ok());
  DoneLatch d1, d2;
  ASSERT_TRUE(o.puts->Commit(1, first->put_id, d1.Callback(), false).ok());
  absl::Status committed = absl::UnknownError("not returned");
  std::thread waiter([&] { committed = o.puts->Commit(1, second->put_id, d2.Callback(), false); });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(o.State("q2"), "reserved");  // still waiting for a place: not visible yet
  o.StartPublisher();
  waiter.join();
  EXPECT_TRUE(committed.ok()) << committed;
  EXPECT_TRUE(d1.Wait().ok());
  EXPECT_TRUE(d2.Wait().ok());
  EXPECT_EQ(o.State("q2"), "committed");
  EXPECT_EQ(o.counters->commit_timeouts.load(), 0);
}

// Stopping: the backlog completes Cancelled without calling the master, and a stopping
// publisher takes no new commits.
TEST_F(PublisherTest, StoppingCancelsTheBacklogWithoutCallingTheMaster) {
  PartsOptions po;
  po.run_publisher = false;
  OwnerParts& o = Make(po);
  auto first = StartTagged(o, 1, {"s1"});
  auto second = StartTagged(o, 1, {"s2"});
  ASSERT_TRUE(first.ok() && second.ok());
  DoneLatch d1, d2;
  ASSERT_TRUE(o.puts->Commit(1, first->put_id, d1.Callback(), false).ok());
  ASSERT_TRUE(o.puts->Commit(1, second->put_id, d2.Callback(), false).ok());
  EXPECT_EQ(o.publisher->backlog(), 2u);
  o.stop.Stop();
  o.publisher->Run();  // returns once the backlog is cancelled
  EXPECT_EQ(d1.Wait().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(d2.Wait().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(mc().publish_batches.load(), 0);
  EXPECT_EQ(o.publisher->backlog(), 0u);
  EXPECT_EQ(o.publisher->ReservePlace().code(), absl::StatusCode::kUnavailable);
  auto third = o.puts->Start(1, Args({"s3"}), nullptr);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(o.puts->Commit(1, third->put_id, nullptr, false).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(o.State("s3"), "absent");  // the refused commit aborted its put
}

}  // namespace
}  // namespace fluxon::testing
