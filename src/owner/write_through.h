// Write-through puts (write_through=True): the put's completion (PutDone, the client's KvFuture)
// waits until every atomic group of it has a committed, routed copy on another node. After the
// local commit and publish the publisher queues the groups on the replica queue (placed by the
// master's replica_task_placement, pulled by their target through the remote-get path, as any
// replica); each group's end reaches the batch's WriteThroughPut, which completes the put once
// all have ended and its publish outcome is known.
//
// Invariants:
// - Completes exactly once, only after the publish outcome and every queued group's end.
// - A failed copy fails the put with a clear error (no room, the value changed meanwhile, the
//   copy failed) and leaves the local copy routed; nothing is rolled back.
// - The parent rule (design: a child is never backed while its parent is not): a put naming a
//   parent_key succeeds only if the parent is backed on another node — a write-through put of
//   this owner still in flight that holds the parent completes first and the child follows its
//   outcome; otherwise the master's route of the parent must name another node.
// - The tracker holds puts only between their publish and their completion.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/mutex.h"
#include "owner/eviction_signals.h"
#include "owner/master_registration.h"
#include "rpc/master_api.h"

namespace fluxon {

using WriteThroughDone = std::function<void(const absl::Status&)>;

class WriteThroughTracker;

class WriteThroughPut : public std::enable_shared_from_this<WriteThroughPut> {
 public:
  WriteThroughPut(WriteThroughTracker* tracker, std::vector<std::string> keys,
                  std::string parent_key)
      : tracker_(tracker), keys_(std::move(keys)), parent_key_(std::move(parent_key)) {}

  // The replica queue: one group of `members` values ended.
  void GroupEnded(ReplicaGroupEnd end, size_t members);
  // The publisher: `groups` were given to the replica queue (after the local commit).
  void Queued(size_t groups);
  // The publisher: the publish outcome and the callback to complete.
  void Published(absl::Status outcome, WriteThroughDone done);

 private:
  friend class WriteThroughTracker;
  // Completes once every part is known; follows the parent when it is still in flight.
  void MaybeFinish();
  void Finish(absl::Status status);
  // A child waiting on this put: finished with this put's outcome when it completes.
  void AddDependent(std::shared_ptr<WriteThroughPut> child);
  void ParentFinished(const absl::Status& parent);

  WriteThroughTracker* const tracker_;
  const std::vector<std::string> keys_;
  const std::string parent_key_;

  Mutex mu_;
  std::optional<size_t> expected_ ABSL_GUARDED_BY(mu_);
  size_t ended_ ABSL_GUARDED_BY(mu_) = 0;
  size_t copied_ ABSL_GUARDED_BY(mu_) = 0;  // values of the groups that ended kCopied
  absl::Status copy_error_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> published_ ABSL_GUARDED_BY(mu_);
  WriteThroughDone done_ ABSL_GUARDED_BY(mu_);
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> result_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<WriteThroughPut>> dependents_ ABSL_GUARDED_BY(mu_);
};

class WriteThroughTracker {
 public:
  WriteThroughTracker(MasterRegistration* registration, MasterApi* master)
      : registration_(registration), master_(master) {}

  // A write-through put of `keys` (naming `parent_key`, may be empty).
  std::shared_ptr<WriteThroughPut> Start(std::vector<std::string> keys, std::string parent_key);
  // Write-through puts published and not yet complete.
  size_t in_flight() const;

 private:
  friend class WriteThroughPut;
  void Register(const std::shared_ptr<WriteThroughPut>& put);
  void Forget(const WriteThroughPut& put);
  // The in-flight put holding `key`, if any.
  std::shared_ptr<WriteThroughPut> InFlight(const std::string& key) const;
  // Whether the master routes `key` to a node other than this owner.
  bool BackedElsewhere(const std::string& key) const;

  MasterRegistration* const registration_;
  MasterApi* const master_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<WriteThroughPut>> by_key_ ABSL_GUARDED_BY(mu_);
  size_t puts_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fluxon
