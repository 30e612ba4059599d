// ReplicaQueue on its own (src/owner/replica_queue.h): the source (node 2) queues replica tasks
// of values it published; the actor places them at one MasterCore and asks the target (node 1)
// through a PeerApi that calls the target's ReplicaPuller in process (the gRPC peer service is
// the daemon's; tests/python/test_cluster_replicas.py covers it). Each test checks the copies the
// master routes and that every task ends in exactly one outcome counter.
#include "owner/replica_queue.h"

#include <thread>

#include "owner/replica_puller.h"
#include "tests/unit/owner/owner_parts_fixture.h"

namespace fluxon::testing {
namespace {

constexpr char kTargetAddress[] = "target:1";

// The target's peer service in process. `lose_answers` answers drop after the pull ran (an
// uncertain outcome); with `block`, a call waits until Cancel.
class InProcessPeers final : public PeerApi {
 public:
  explicit InProcessPeers(ReplicaPuller* puller) : puller_(puller) {}
  absl::StatusOr<v1::PullReplicasReply> PullReplicas(const std::string& address,
                                                     const v1::PullReplicasRequest& r,
                                                     std::chrono::milliseconds timeout) override {
    calls.fetch_add(1);
    if (block.load()) {
      MutexLock lock(&mu_);
      const auto until = std::chrono::steady_clock::now() + timeout;
      while (!cancelled_) {
        if (!cv_.WaitUntil(&mu_, until)) return absl::DeadlineExceededError("blocked call");
      }
      return absl::CancelledError("cancelled");
    }
    if (address != kTargetAddress) return absl::UnavailableError("no such peer");
    std::vector<PullItem> items;
    for (const v1::PullItem& it : r.items()) items.push_back(PullItemFromProto(it));
    absl::StatusOr<std::vector<PullOutcome>> got = puller_->Pull(items);
    if (!got.ok()) return got.status();
    if (lose_answers.load() > 0) {
      lose_answers.fetch_sub(1);
      return absl::UnavailableError("answer lost");
    }
    return PullReplyOf(*got);
  }
  absl::StatusOr<v1::DropCopiesReply> DropCopies(const std::string&, const v1::DropCopiesRequest&,
                                                 std::chrono::milliseconds) override {
    return absl::UnimplementedError("not used here");
  }
  void Cancel() override {
    MutexLock lock(&mu_);
    cancelled_ = true;
    cv_.SignalAll();
  }

  std::atomic<int> calls{0};
  std::atomic<int> lose_answers{0};
  std::atomic<bool> block{false};

 private:
  ReplicaPuller* const puller_;
  Mutex mu_;
  CondVar cv_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

class ReplicaQueueTest : public OwnerPartsTest {
 protected:
  // `ends`: who hears how each group ended (the source's evictor unless given).
  void TwoOwners(ReplicaQueue::Options options = {}, std::string target_role = "embedded",
                 EvictionSignals* ends = nullptr) {
    PartsOptions target, source;
    target.role = std::move(target_role);
    target.node_id = 1;
    target.data_plane = true;
    target.peer_address = kTargetAddress;
    source.node_id = 2;
    source.data_plane = true;
    a_ = &Make(target);
    b_ = &Make(source);
    // The target's capacity as its heartbeat would report it (placement reads it).
    a_->registration->SetCapacitySource([] {
      v1::OwnerCapacity c;
      c.set_segment_bytes(uint64_t{1} << 30);
      c.set_free_bytes(uint64_t{1} << 30);
      return c;
    });
    ASSERT_TRUE(a_->registration->Register().ok());
    puller_ = std::make_unique<ReplicaPuller>(a_->keys.get(), a_->remote.get(), a_->counters.get());
    peers_ = std::make_unique<InProcessPeers>(puller_.get());
    queue_ = std::make_unique<ReplicaQueue>(options, b_->registration.get(), &master(),
                                            peers_.get(), b_->keys.get(), b_->counters.get(),
                                            &stop_, ends != nullptr ? ends : b_->evictor.get());
  }
  void TearDown() override {
    StopActor();
    OwnerPartsTest::TearDown();
  }
  void StartActor(int workers = 1) {
    for (int i = 0; i < workers; ++i) actors_.emplace_back([this] { queue_->Run(); });
  }
  void StopActor() {
    if (actors_.empty()) return;
    stop_.Stop();
    queue_->Interrupt();
    for (std::thread& t : actors_) t.join();
    actors_.clear();
  }
  // The group of `keys` as the master routes them (the source's identities).
  ReplicaGroup GroupOf(const std::vector<std::string>& keys) {
    ReplicaGroup g;
    for (const std::string& k : keys) {
      auto route = RouteOf(master(), k);
      EXPECT_TRUE(route.has_value()) << k;
      if (route)
        g.push_back(ReplicaTask{k, route->put_id(), route->version(), kValueLen, kValueLen});
    }
    return g;
  }
  void WaitIdle() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!queue_->idle()) {
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "the replica queue never drained";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  size_t Locations(const std::string& key) {
    auto route = RouteOf(master(), key);
    return route ? static_cast<size_t>(route->locations_size()) : 0;
  }
  const OwnerCounters& src() { return *b_->counters; }
  // Every enqueued task ended in exactly one outcome.
  void ExpectAccounted() {
    const OwnerCounters& c = src();
    EXPECT_EQ(c.replica_tasks_enqueued.load(),
              c.replica_tasks_completed.load() + c.replica_tasks_already_held.load() +
                  c.replica_tasks_obsolete.load() + c.replica_tasks_source_gone.load() +
                  c.replica_tasks_no_space.load() + c.replica_tasks_failed.load());
    EXPECT_EQ(c.replica_queue_keys.load(), 0);
  }

  OwnerParts* a_ = nullptr;
  OwnerParts* b_ = nullptr;
  StopSignal stop_;
  std::unique_ptr<ReplicaPuller> puller_;
  std::unique_ptr<InProcessPeers> peers_;
  std::unique_ptr<ReplicaQueue> queue_;
  std::vector<std::thread> actors_;
};

// Queued groups are placed on the target and pulled there: each key gets a second location of
// its identity, the master counts the replica copies, and every task is completed.
TEST_F(ReplicaQueueTest, QueuedGroupsArePulledByTheirTarget) {
  TwoOwners();
  const std::vector<std::string> keys = Keys("rq", 6);
  ASSERT_TRUE(PutAndPublish(*b_, keys, {2, 4}).ok());
  StartActor();
  queue_->Enqueue({GroupOf({keys[0], keys[1]}), GroupOf({keys[2], keys[3], keys[4], keys[5]})});
  WaitIdle();
  for (const std::string& k : keys) {
    EXPECT_EQ(Locations(k), 2u) << k;
    EXPECT_EQ(a_->State(k), "committed") << k;
  }
  EXPECT_EQ(src().replica_tasks_enqueued.load(), 6);
  EXPECT_EQ(src().replica_tasks_completed.load(), 6);
  EXPECT_EQ(src().replica_targets_other_roles.load(), 6);  // the target registered as embedded
  EXPECT_EQ(src().replica_pull_calls.load(), 1);           // one call for the one target
  EXPECT_EQ(a_->counters->replica_pulls_completed.load(), 6);
  EXPECT_EQ(master().counters().replica_copies_other_roles.load(), 6);
  EXPECT_EQ(master().counters().replica_copies_remote_cache.load(), 0);
  // Both groups are held whole on the target: the source evicts them first now (recoverable
  // first), and the target's copies are marked too (their source holds them).
  EXPECT_EQ(b_->hot->copied_cohorts(), 2u);
  EXPECT_EQ(b_->counters->cohorts_marked_copied.load(), 2);
  EXPECT_EQ(a_->hot->copied_cohorts(), a_->hot->size());
  ExpectAccounted();
}

// Several workers drain the queue in batches of batch_keys keys, each batch its own call; every
// key is copied once.
TEST_F(ReplicaQueueTest, SeveralBatchesInFlight) {
  ReplicaQueue::Options o;
  o.batch_keys = 2;
  o.in_flight = 2;
  TwoOwners(o);
  const std::vector<std::string> keys = Keys("fl", 8);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  std::vector<ReplicaGroup> groups;
  for (const std::string& k : keys) groups.push_back(GroupOf({k}));
  queue_->Enqueue(std::move(groups));
  StartActor(2);
  WaitIdle();
  EXPECT_EQ(src().replica_tasks_completed.load(), 8);
  EXPECT_EQ(src().replica_pull_calls.load(), 4);
  for (const std::string& k : keys) EXPECT_EQ(Locations(k), 2u) << k;
  EXPECT_EQ(master().counters().replica_copies_other_roles.load(), 8);
  ExpectAccounted();
}

// T1: a PullReplicas answer lost after the target copied is retried with the same items; the
// retry finds them held, and the route has one copy per key.
TEST_F(ReplicaQueueTest, ALostAnswerIsRetriedAndFindsTheCopyHeld) {
  TwoOwners();
  const std::vector<std::string> keys = Keys("lost", 3);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  peers_->lose_answers = 1;
  StartActor();
  queue_->Enqueue({GroupOf({keys[0]}), GroupOf({keys[1]}), GroupOf({keys[2]})});
  WaitIdle();
  EXPECT_EQ(peers_->calls.load(), 2);
  EXPECT_EQ(src().replica_tasks_already_held.load(), 3);
  EXPECT_EQ(src().replica_tasks_completed.load(), 0);
  for (const std::string& k : keys) EXPECT_EQ(Locations(k), 2u) << k;
  EXPECT_EQ(master().counters().replica_copies_other_roles.load(), 3);  // copied once each
  ExpectAccounted();
}

// S3: a value the source deleted before its batch was formed is "source gone" without asking
// anyone; nothing is copied.
TEST_F(ReplicaQueueTest, AValueGoneBeforeItsBatchIsSourceGoneWithoutACall) {
  TwoOwners();
  ASSERT_TRUE(PutAndPublish(*b_, {"gone-a", "gone-b"}).ok());
  const ReplicaGroup g = GroupOf({"gone-a", "gone-b"});
  auto removed = b_->evictor->DeletePrefix("gone-");
  ASSERT_TRUE(removed.ok());
  queue_->Enqueue({g});
  StartActor();
  WaitIdle();
  EXPECT_EQ(src().replica_tasks_source_gone.load(), 2);
  EXPECT_EQ(peers_->calls.load(), 0);
  EXPECT_EQ(a_->State("gone-a"), "absent");
  ExpectAccounted();
}

// S3: the source evicts for capacity while the task is queued; the task ends "source gone" and
// nothing is copied (a replica never holds up or vetoes the source's eviction).
TEST_F(ReplicaQueueTest, EvictedWhileQueuedIsSourceGone) {
  TwoOwners();
  ASSERT_TRUE(PutAndPublish(*b_, {"ev-a", "ev-b"}).ok());
  queue_->Enqueue({GroupOf({"ev-a", "ev-b"})});
  EXPECT_GE(b_->evictor->EvictSome(uint64_t{1} << 30), static_cast<uint64_t>(2 * kValueLen));
  EXPECT_EQ(b_->State("ev-a"), "absent");
  StartActor();
  WaitIdle();
  EXPECT_EQ(src().replica_tasks_source_gone.load(), 2);
  EXPECT_EQ(a_->State("ev-a"), "absent");
  EXPECT_EQ(Locations("ev-a"), 0u);
  ExpectAccounted();
}

// The queue is bounded and never blocks: a group that does not fit is dropped whole and
// counted; a (key, put_id) already queued is not queued twice.
TEST_F(ReplicaQueueTest, BoundedAndDeduplicated) {
  ReplicaQueue::Options small;
  small.capacity_keys = 4;
  TwoOwners(small);
  const std::vector<std::string> keys = Keys("b", 6);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  queue_->Enqueue({GroupOf({keys[0], keys[1]}), GroupOf({keys[0]}), GroupOf({keys[2], keys[3]}),
                   GroupOf({keys[4], keys[5]})});
  EXPECT_EQ(queue_->queued_keys(), 4u);
  EXPECT_EQ(src().replica_tasks_enqueued.load(), 4);
  EXPECT_EQ(src().replica_tasks_duplicate.load(), 1);
  EXPECT_EQ(src().replica_tasks_queue_full.load(), 2);
  StartActor();
  WaitIdle();
  EXPECT_EQ(src().replica_tasks_completed.load(), 4);
  EXPECT_EQ(Locations(keys[4]), 1u);
  ExpectAccounted();
}

// No target: the master places nothing (the only other owner registered no peer service), so
// every task is NoSpace and nobody is asked.
TEST_F(ReplicaQueueTest, NoTargetIsNoSpace) {
  TwoOwners();
  ASSERT_TRUE(PutAndPublish(*b_, {"solo"}).ok());
  a_->registration->SetPeerAddress("");
  ASSERT_TRUE(a_->registration->Register().ok());  // the heartbeat says: no peer service now
  queue_->Enqueue({GroupOf({"solo"})});
  StartActor();
  WaitIdle();
  EXPECT_EQ(src().replica_tasks_no_space.load(), 1);
  EXPECT_EQ(peers_->calls.load(), 0);
  ExpectAccounted();
}

// Enqueues the group again the first time a group ends, from inside the end (as an evictor
// does that readmits a demoted cohort and has another round choose it at once).
class EnqueueAgainOnce final : public EvictionSignals {
 public:
  std::function<void()> again;
  std::atomic<int> ends{0};
  void CandidatesChanged() override {}
  void SignalPressure() override {}
  void ReplicaGroupEnded(const std::vector<std::string>&, uint64_t, uint64_t, ReplicaGroupEnd,
                         const std::string&) override {
    if (ends.fetch_add(1) == 0) again();
  }
};

// A group leaves the queue before its end is told: enqueued again from there, it is queued (and
// found held by the target), not refused as a duplicate of itself.
TEST_F(ReplicaQueueTest, AGroupEnqueuedAgainAsItEndsIsNotADuplicate) {
  EnqueueAgainOnce listener;
  TwoOwners({}, "embedded", &listener);
  ASSERT_TRUE(PutAndPublish(*b_, {"re0", "re1"}, {2}).ok());
  const ReplicaGroup g = GroupOf({"re0", "re1"});
  listener.again = [&] { queue_->Enqueue({g}); };
  queue_->Enqueue({g});
  StartActor();
  ASSERT_TRUE(WaitUntil([&] { return listener.ends.load() == 2; }));
  WaitIdle();
  StopActor();  // before `listener` goes
  EXPECT_EQ(src().replica_tasks_duplicate.load(), 0);
  EXPECT_EQ(src().replica_tasks_enqueued.load(), 4);
  EXPECT_EQ(src().replica_tasks_completed.load(), 2);
  EXPECT_EQ(src().replica_tasks_already_held.load(), 2);
  ExpectAccounted();
}

// The batch that ended a group does not take its identities off the queue again when it
// finishes: the group queued again meanwhile stays queued (and in flight, a duplicate of it is
// still refused).
TEST_F(ReplicaQueueTest, AGroupQueuedAgainStaysQueuedAfterTheFirstBatchFinishes) {
  EnqueueAgainOnce listener;
  TwoOwners({}, "embedded", &listener);
  ASSERT_TRUE(PutAndPublish(*b_, {"st0", "st1"}, {2}).ok());
  const ReplicaGroup g = GroupOf({"st0", "st1"});
  listener.again = [&] {
    peers_->block = true;  // the second pull waits (until the actor stops)
    queue_->Enqueue({g});
  };
  queue_->Enqueue({g});
  StartActor();
  ASSERT_TRUE(WaitUntil([&] { return peers_->calls.load() == 2; }));  // the second is in flight
  EXPECT_EQ(queue_->queued_keys(), 2u);
  queue_->Enqueue({g});
  EXPECT_EQ(src().replica_tasks_duplicate.load(), 2);
  EXPECT_EQ(src().replica_tasks_enqueued.load(), 4);
  StopActor();  // ends the blocked call while `listener` still exists (it hears that end)
}

// Stopping ends a call in progress at once (the peer client is cancelled) and the actor returns.
TEST_F(ReplicaQueueTest, StopEndsACallInProgress) {
  ReplicaQueue::Options slow;
  slow.pull_timeout = std::chrono::milliseconds(60'000);
  TwoOwners(slow);
  ASSERT_TRUE(PutAndPublish(*b_, {"s"}).ok());
  peers_->block = true;
  StartActor();
  queue_->Enqueue({GroupOf({"s"})});
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (peers_->calls.load() == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), until);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const auto t0 = std::chrono::steady_clock::now();
  StopActor();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

// Demotion (single copy): above start_ratio the source's round hands its cold cohorts to the
// queue with a demotion intent; a remote_cache pulls them, the copy joins the route, and only
// then does the source's location go and its slots free: every value stays routed, once.
TEST_F(ReplicaQueueTest, DemotionMovesColdCohortsToTheRemoteCacheAndFreesTheSource) {
  TwoOwners({}, "remote_cache");
  const std::vector<std::string> keys = Keys("dm", 6);
  ASSERT_TRUE(PutAndPublish(*b_, keys, {2, 4}).ok());
  b_->evictor->EnableDemotion(queue_.get(), DemotionOptions{1e-9, uint64_t{1} << 30});
  StartActor();
  b_->evictor->RunRound();
  WaitIdle();
  ASSERT_TRUE(WaitUntil([&] { return b_->counters->demoted_pages.load() == 6; }))
      << b_->counters->demoted_pages.load();
  for (const std::string& k : keys) {
    auto route = RouteOf(master(), k);
    ASSERT_TRUE(route.has_value()) << k;
    ASSERT_EQ(route->locations_size(), 1) << k;
    EXPECT_EQ(route->locations(0).node_id(), a_->node_id()) << k;
    EXPECT_EQ(b_->State(k), "absent") << k;
    EXPECT_EQ(a_->State(k), "committed") << k;
  }
  EXPECT_EQ(b_->counters->demotions_started.load(), 6);
  EXPECT_EQ(b_->counters->demoting_bytes.load(), 0);
  EXPECT_EQ(b_->counters->committed_entries.load(), 0);
  EXPECT_EQ(b_->hot->size(), 0u);
  EXPECT_EQ(src().replica_targets_remote_cache.load(), 6);
  ExpectAccounted();
}

// No remote_cache (the only other owner is a GPU-side one): a demotion never goes there; the
// cohorts go back to the hot tier, still routed here, and demotion pauses.
TEST_F(ReplicaQueueTest, DemotionWithoutARemoteCacheKeepsTheValues) {
  TwoOwners();  // the target registered as embedded: not a remote-only role
  const std::vector<std::string> keys = Keys("dn", 3);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  b_->evictor->EnableDemotion(queue_.get(), DemotionOptions{1e-9, uint64_t{1} << 30});
  StartActor();
  b_->evictor->RunRound();
  WaitIdle();
  ASSERT_TRUE(WaitUntil([&] { return b_->counters->demotion_no_space.load() == 3; }));
  for (const std::string& k : keys) {
    EXPECT_EQ(b_->State(k), "committed") << k;
    EXPECT_EQ(Locations(k), 1u) << k;
    EXPECT_EQ(a_->State(k), "absent") << k;
  }
  EXPECT_EQ(b_->hot->size(), 3u);  // readmitted
  EXPECT_EQ(b_->counters->demoting_bytes.load(), 0);
  EXPECT_EQ(b_->counters->demoted_pages.load(), 0);
  // Paused: the next round starts nothing.
  b_->evictor->RunRound();
  EXPECT_EQ(b_->counters->demotions_started.load(), 3);
  ExpectAccounted();
}

}  // namespace
}  // namespace fluxon::testing
