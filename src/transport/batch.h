// BatchState and BatchRegistry: the completion bookkeeping every transport shares.
//
// Invariants and why:
// - A batch is cut by its transport into `units` (TCP requests, verbs work requests). It completes
//   exactly once, when every unit has been finished by the transport (FinishUnit). A unit is
//   finished only after no thread or device touches its memory any more, so completion means the
//   caller's buffers are free again, also after an abort.
// - Abort (cancel, deadline, dead peer, shutdown) records the first abort status and runs the
//   transport's abort hook once, outside every lock; the hook drops queued units (finishing them)
//   and tears down what carries in-flight ones, whose units the transport then finishes.
// - Descriptor results: a descriptor is OK when all of its bytes were moved without error; the
// first
//   error recorded for it wins; a descriptor left incomplete by an abort gets the abort status.
// - Lock order: transport locks may be held while calling RecordPiece/FinishUnit/Abort; the batch
//   mutex is a leaf, and the hooks run after it is released.
// - BatchRegistry owns a strong reference to each live batch and one reaper thread that aborts a
//   batch at its deadline with DeadlineExceeded (its wait is bounded by the nearest deadline and a
//   1 s tick). The owning transport aborts all and waits for them before it is destroyed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/mutex.h"
#include "transport/transport.h"

namespace fluxon::transport {

using Clock = std::chrono::steady_clock;

class BatchState {
 public:
  BatchState(uint64_t id, PeerId peer, OpKind op, std::span<const Descriptor> descriptors,
             Clock::time_point deadline);

  uint64_t id() const { return id_; }
  OpKind op() const { return op_; }
  const PeerId& peer() const { return peer_; }
  const std::vector<Descriptor>& descriptors() const { return descriptors_; }
  Clock::time_point deadline() const { return deadline_; }

  // Set by the transport before the batch is visible to any other thread.
  void SetUnits(uint64_t units) {
    MutexLock lock(&mu_);
    units_remaining_ = units;
  }
  void SetAbortHook(std::function<void()> hook) { abort_hook_ = std::move(hook); }
  void SetCompletionHook(std::function<void()> hook) { completion_hook_ = std::move(hook); }

  // Records the outcome of `bytes` of descriptor `index`.
  void RecordPiece(uint32_t index, uint64_t bytes, const absl::Status& status);
  // One unit is finished; the last one completes the batch.
  void FinishUnit();
  // Ends the batch early with `status`. Returns false if it was done or aborted already.
  bool Abort(absl::Status status);
  bool aborted() const;
  absl::Status abort_status() const;

  bool Done() const;
  bool WaitFor(absl::Duration timeout);
  const BatchResult& Wait();

 private:
  const uint64_t id_;
  const PeerId peer_;
  const OpKind op_;
  const std::vector<Descriptor> descriptors_;
  const Clock::time_point deadline_;
  std::function<void()> abort_hook_;       // set before publication, then read-only
  std::function<void()> completion_hook_;  // set before publication, then read-only

  mutable Mutex mu_;
  CondVar done_cv_;
  uint64_t units_remaining_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> bytes_done_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> errors_ ABSL_GUARDED_BY(mu_);
  absl::Status abort_status_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  BatchResult result_;  // written once before done_ is set, read-only afterwards
};

class BatchRegistry {
 public:
  BatchRegistry();
  ~BatchRegistry();  // requires every batch complete (the transport waits first)
  BatchRegistry(const BatchRegistry&) = delete;
  BatchRegistry& operator=(const BatchRegistry&) = delete;

  // A new batch, not yet live. The caller sets its units and abort hook, then calls Arm(), which
  // makes it live (visible to AbortAll and the reaper) and starts its deadline; its completion
  // removes it. Arm must precede the first FinishUnit.
  std::shared_ptr<BatchState> Create(const PeerId& peer, OpKind op,
                                     std::span<const Descriptor> descriptors,
                                     absl::Duration timeout);
  void Arm(const std::shared_ptr<BatchState>& batch);
  void AbortAll(const absl::Status& status);
  // True when no batch is live within `timeout`.
  bool WaitAllDone(absl::Duration timeout);
  uint64_t outstanding() const;
  uint64_t completed() const { return completed_.load(std::memory_order_relaxed); }

 private:
  void OnComplete(uint64_t id, Clock::time_point deadline);
  void ReaperLoop();

  mutable Mutex mu_;
  CondVar cv_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<BatchState>> live_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> completed_{0};
  std::thread reaper_;
};

// Deadline of a batch submitted now with `timeout` (clamped to [1 ms, 24 h]).
Clock::time_point DeadlineAfter(absl::Duration timeout);

}  // namespace fluxon::transport
