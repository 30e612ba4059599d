// Publisher: the owner's one publish actor (design §5 step 3). Committed batches wait in a
// bounded queue; the actor sends each batch as one PublishBatch, promotes the values the master
// published (LocalVisible -> Committed, route live), drops the ones it superseded, admits the
// batch to the hot tier as one chain, and completes the batch's PutDone.
//
// Invariants:
// - A1/A2: one job owns one whole batch and one PublishBatch identity; an uncertain outcome is
//   retried with the same identity (RetryUncertain) until it resolves; only a definite answer
//   drops local values. A refusal because the master does not know this generation (it
//   restarted, or expired this owner) wakes the heartbeat, which registers again (under a new
//   generation when expired), and the batch is retried for kRefusedRetryWindow.
// - V2/V3: a value is promoted only after the master published its route; the batch's cohorts
//   are admitted to the hot tier after every member was promoted (A1).
// - Backpressure: commits take a place in the queue (ReservePlace) before their values become
//   visible; a place not found within commit_wait_timeout, or while stopping, is an error the
//   committer turns into an abort. The queue never holds more than queue_capacity jobs.
// - Stopping: the backlog is completed Cancelled without calling the master.
// - The publisher tells the evictor about new candidates through EvictionSignals only.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/mutex.h"
#include "common/stop_signal.h"
#include "owner/eviction_signals.h"
#include "owner/hot_tier.h"
#include "owner/key_index.h"
#include "owner/master_registration.h"
#include "owner/owner_counters.h"
#include "owner/replica_queue.h"
#include "rpc/master_api.h"
#include "slot/slot_pool.h"

namespace fluxon {

using PutDoneCallback = std::function<void(const absl::Status&)>;

// A prepared put: its keys, slots and hints, from PutStart to the end of its publish.
struct PutBatch {
  uint64_t client_id = 0;
  uint64_t put_id = 0;
  std::vector<std::string> keys;
  std::vector<SlotRef> slots;
  uint64_t value_len = 0;
  std::vector<uint32_t> group_lens;
  std::string parent_key;
  // Per key: replicate after the commit (make_replica_task and its mask, uniform per atomic
  // group); empty: no key.
  std::vector<bool> replicate;
  // Set for write_through=True: every group is copied to another node and the put completes
  // when the copies are routed (owner/write_through.h).
  std::shared_ptr<WriteThroughPut> write_through;
  std::chrono::steady_clock::time_point deadline;  // put_lease
};

class Publisher {
 public:
  struct Options {
    size_t queue_capacity = 512;
    std::chrono::milliseconds commit_wait_timeout{30'000};
  };
  // How long a batch refused because the master does not know this owner's generation is
  // retried (under the generation then current) before it is given up.
  static constexpr std::chrono::milliseconds kRefusedRetryWindow{10'000};
  Publisher(Options options, MasterRegistration* registration, MasterApi* master, KeyIndex* keys,
            SlotPool* pool, HotTier<>* hot, OwnerCounters* counters, EvictionSignals* signals,
            StopSignal* stop, ReplicaQueue* replicas = nullptr)
      : options_(options),
        registration_(registration),
        master_(master),
        keys_(keys),
        pool_(pool),
        hot_(hot),
        counters_(counters),
        signals_(signals),
        stop_(stop),
        replicas_(replicas) {}

  // Takes a place in the queue, waiting up to commit_wait_timeout; Unavailable when none was
  // found in time or the owner is stopping.
  absl::Status ReservePlace();
  // Gives a reserved place back (the commit failed before Push).
  void CancelPlace();
  // Queues `batch` in a reserved place; `done` runs with its outcome. Wakes the actor unless
  // `defer_wake` (then Wake() must follow).
  void Push(std::shared_ptr<PutBatch> batch, PutDoneCallback done, bool defer_wake);
  void Wake();
  // The actor: publishes queued batches until stopping (then cancels the backlog).
  void Run();
  // Wakes every wait (call after stop_->Stop()).
  void Interrupt();
  // Batches queued or being published.
  size_t backlog() const;
  // Waits until every batch queued before this call has been published (or given up), up to
  // `deadline` or until the owner stops; true when they all settled.
  bool WaitQueuedSettled(std::chrono::steady_clock::time_point deadline);
  // Cohort ids are one sequence per owner (published batches and remote-get copies alike).
  uint64_t NewCohortId() { return next_cohort_id_.fetch_add(1); }

 private:
  struct Job {
    std::shared_ptr<PutBatch> batch;
    PutDoneCallback done;
  };
  // The batch's outcome for its PutDone.
  absl::Status PublishOne(const PutBatch& b);
  // One cohort per atomic group (or per key), of the members the master published.
  void PromoteAndAdmit(const PutBatch& b, uint64_t version, const std::vector<bool>& published,
                       size_t* not_published);

  const Options options_;
  MasterRegistration* const registration_;
  MasterApi* const master_;
  KeyIndex* const keys_;
  SlotPool* const pool_;
  HotTier<>* const hot_;
  OwnerCounters* const counters_;
  EvictionSignals* const signals_;
  StopSignal* const stop_;
  ReplicaQueue* const replicas_;  // null: replica tasks are not served (tests)
  std::atomic<uint64_t> next_cohort_id_{1};

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  size_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  size_t reserved_ ABSL_GUARDED_BY(mu_) = 0;  // places taken between ReservePlace and Push
  // Batches ever queued and ever settled (published or given up); the actor settles them in
  // queue order, so every batch queued before `settled_` reached n is settled.
  uint64_t queued_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t settled_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fluxon
