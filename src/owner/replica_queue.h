// ReplicaQueue: the source's side of replicas by pull (docs/replicas.md). After a put batch's
// values are Committed (their route published), the groups the client asked replicas for
// (make_replica_task, make_replica_task_mask) are queued here; `in_flight` workers drain the
// queue in batches: each asks the master where each atomic group of its batch goes
// (PlaceReplicas: whole groups, never this owner) and sends each target one PullReplicas for its
// groups. Several batches in flight overlap one batch's control round trips with another's
// reads. The target pulls the exact
// identities through the remote-get path; nothing is written into another owner's segment.
//
// Invariants:
// - Never on the put's path: Enqueue does not block and does no I/O. A task that does not fit
//   (capacity_keys) is dropped and counted (queue_full); a (key, put_id) already queued is
//   counted (duplicate) and not queued twice.
// - Replicas never hold up or veto freeing this owner's memory (S3): nothing here pins a value.
//   A task whose value this owner no longer holds with that identity when its batch is formed is
//   "source gone" (or "obsolete": another identity is held) without asking anyone; a value evicted
//   while its pull runs makes the target answer "source gone".
// - Atomic groups are placed whole: one group goes to one target in one call, marked as a group
//   (the target claims its slots whole). Every item names this owner's location (node, current
//   generation) as the one to copy from: a value it no longer holds is "source gone" at the
//   target even where other copies exist.
// - A PullReplicas call is retried (same items, idempotent at the target, T1) while its outcome
//   is unknown or items answer PULL_FAILED, at most max_attempts calls with a 25 ms, 50 ms, ...
//   backoff; whatever is still unresolved is counted failed. A retried item the target already
//   copied answers "already held": never a second copy.
// - One PullReplicas carries at most batch_keys distinct keys (the target refuses a key twice),
//   and a key is in at most one batch in flight (a later put of it waits for the earlier one).
// - Every wait is bounded (pull_timeout per call) and ends when the owner stops (the peer client
//   is cancelled); tasks still queued then are dropped uncounted.
// - Every task ends in exactly one outcome counter: enqueued = completed + already_held +
//   obsolete + source_gone + no_space + failed + (dropped at stop).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/mutex.h"
#include "common/stop_signal.h"
#include "owner/eviction_signals.h"
#include "owner/key_index.h"
#include "owner/master_registration.h"
#include "owner/owner_counters.h"
#include "owner/write_through.h"
#include "rpc/master_api.h"
#include "rpc/peer_api.h"

namespace fluxon {

// One value to replicate: its key and identity, its length and the bytes of its slot (what the
// target will claim, for placement).
struct ReplicaTask {
  std::string key;
  uint64_t put_id = 0;
  uint64_t version = 0;
  uint64_t len = 0;
  uint64_t slot_bytes = 0;
  // Nonzero: this task demotes that cohort of this owner (single copy: the source releases its
  // slots once the copy is routed), the same for every member of its group; placed only on
  // remote-only roles.
  uint64_t demoted_cohort = 0;
  // Set: this task copies a write-through put, which completes when its groups end.
  std::shared_ptr<WriteThroughPut> write_through;
};
// One atomic group (or a single key): placed whole on one target.
using ReplicaGroup = std::vector<ReplicaTask>;

class ReplicaQueue {
 public:
  struct Options {
    size_t capacity_keys = 16'384;
    size_t batch_keys = 256;
    std::chrono::milliseconds pull_timeout{30'000};
    size_t in_flight = 2;  // batches replicated at once (workers running Run)
    int max_attempts = 3;
  };
  // `registration` names this owner to targets (its node and current generation: the location
  // they copy from).
  // `ends` (may be null) hears how every group ended, once per group given to Enqueue
  // (recoverable-first eviction and demotion act on it).
  ReplicaQueue(Options options, MasterRegistration* registration, MasterApi* master, PeerApi* peers,
               KeyIndex* keys, OwnerCounters* counters, StopSignal* stop,
               EvictionSignals* ends = nullptr);

  // Queues `groups` (never blocks). A group is queued whole or dropped whole (then it ends
  // kFailed at once). A batch holds demotions or replicas, never both.
  void Enqueue(std::vector<ReplicaGroup> groups);
  // One worker: replicates queued batches until stopping. The owner runs options.in_flight of
  // them.
  void Run();
  // Wakes the actor and cancels calls in progress (call after stop_->Stop()).
  void Interrupt();
  // Tasks queued or being replicated.
  size_t queued_keys() const;
  // True when nothing is queued or in progress (tests wait for it).
  bool idle() const;

 private:
  using TaskId = std::pair<std::string, uint64_t>;  // (key, put_id)
  // The next batch: whole groups up to batch_keys keys, no key twice, none of a batch in flight.
  std::vector<ReplicaGroup> TakeBatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The front group can go now: none of its keys is in a batch in flight.
  bool FrontReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Replicate(std::vector<ReplicaGroup> batch);
  // The members still held here with their identity; the others are counted.
  ReplicaGroup StillHeld(const ReplicaGroup& g);
  // Sends `items` to one target, retrying as described; counts every item's final outcome and
  // ends every group. `groups[i]`: the atomic group number of items[i] within this call (0:
  // alone).
  void PullOn(const std::string& peer_address, const std::vector<ReplicaTask>& items,
              const std::vector<uint32_t>& groups);
  void Finished(const std::vector<ReplicaGroup>& batch);
  // Ends every group of one call by its members' final outcomes (EndInFlight).
  void EndGroups(const std::string& target, const std::vector<ReplicaTask>& items,
                 const std::vector<uint32_t>& groups, const std::vector<v1::PullOutcome>& final);
  // Tells `ends_` how group `g` ended (`target`: the peer asked, if any).
  void Ended(const ReplicaGroup& g, ReplicaGroupEnd end, const std::string& target = {});
  // Ends a group taken from the queue: its identities leave the queue first (its keys stay in
  // flight until Finished), so a listener that enqueues it again at once (a demotion readmitted
  // and chosen again by another round) is not refused as a duplicate of itself.
  void EndInFlight(const ReplicaGroup& g, ReplicaGroupEnd end, const std::string& target = {});
  // These tasks' identities are no longer queued (each task of a taken batch leaves exactly
  // once, when it ends; Finished then only releases the keys in flight).
  void Unqueue(const ReplicaGroup& tasks);

  const Options options_;
  MasterRegistration* const registration_;
  MasterApi* const master_;
  PeerApi* const peers_;
  KeyIndex* const keys_;
  OwnerCounters* const counters_;
  StopSignal* const stop_;
  EvictionSignals* const ends_;

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<ReplicaGroup> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<TaskId> queued_ ABSL_GUARDED_BY(mu_);  // queued or in progress
  size_t keys_queued_ ABSL_GUARDED_BY(mu_) = 0;              // tasks in queued_
  absl::flat_hash_set<std::string> keys_in_flight_ ABSL_GUARDED_BY(mu_);
  size_t batches_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fluxon
