// SingleFlight: one in-flight lookup per key on this owner (G6/G7). The first get of a key that
// is not resident installs a SharedGetOp and leads; later gets of the key join it and wait for
// its one terminal state and its one canonical holder.
//
// Invariants:
// - G3: lead-or-join is one atomic per-key insert-or-join, never "snapshot then insert".
// - A leader finishes its op exactly once (Ready with a holder, or Failed), then removes it by
//   identity, so a newer op for the same key is never removed (no ABA).
// - Joiners wait with a deadline; a joiner that times out sees a miss, never a partial state.
// - kRouted (the leader found the value on another owner and its fetch has begun) is not
//   terminal: Wait goes on to Ready/Failed; only WaitDecided returns there, for a deferred
//   get_start that counts the value as being fetched (G11) instead of waiting for the read.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "common/mutex.h"
#include "holder/holder.h"
#include "route/key_control_table.h"

namespace fluxon {

class SharedGetOp {
 public:
  void Finish(HolderRef h) {
    MutexLock lock(&mu_);
    phase_ = h ? Phase::kReady : Phase::kFailed;
    holder_ = std::move(h);
    cv_.SignalAll();
  }
  // The leader found the value on another owner and is fetching it (no effect once finished).
  void MarkRouted() {
    MutexLock lock(&mu_);
    if (phase_ != Phase::kStarting) return;
    phase_ = Phase::kRouted;
    cv_.SignalAll();
  }
  // The leader's holder (empty on failure or when `deadline` passed first).
  HolderRef Wait(std::chrono::steady_clock::time_point deadline) {
    MutexLock lock(&mu_);
    while (phase_ == Phase::kStarting || phase_ == Phase::kRouted) {
      if (!cv_.WaitUntil(&mu_, deadline) &&
          (phase_ == Phase::kStarting || phase_ == Phase::kRouted)) {
        return HolderRef();
      }
    }
    return holder_;
  }
  // Waits (until `deadline`) only until the leader knows where the value is: true when it is
  // being fetched from another owner (its holder comes later, through Wait); false with the
  // terminal holder in `*holder` (empty: a miss, a failure or the deadline).
  bool WaitDecided(std::chrono::steady_clock::time_point deadline, HolderRef* holder) {
    MutexLock lock(&mu_);
    while (phase_ == Phase::kStarting) {
      if (!cv_.WaitUntil(&mu_, deadline) && phase_ == Phase::kStarting) {
        *holder = HolderRef();
        return false;
      }
    }
    if (phase_ == Phase::kRouted) return true;
    *holder = holder_;
    return false;
  }

 private:
  enum class Phase : uint8_t { kStarting, kRouted, kReady, kFailed };
  Mutex mu_;
  CondVar cv_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kStarting;
  HolderRef holder_ ABSL_GUARDED_BY(mu_);
};

class SingleFlight {
 public:
  // The key's op and whether the caller leads it (installed it) or joins it.
  std::pair<std::shared_ptr<SharedGetOp>, bool> LeadOrJoin(const std::string& key) {
    std::shared_ptr<SharedGetOp> op;
    bool leads = false;
    ops_.Upsert(
        key, [] { return std::make_shared<SharedGetOp>(); },
        [&](std::shared_ptr<SharedGetOp>& current, bool inserted) {
          op = current;
          leads = inserted;
          return 0;
        });
    return {std::move(op), leads};
  }
  // The leader's terminal state: removes this op (only this one), then wakes the joiners, so a
  // joiner that wakes never finds its finished op still in the table (a get of the key after
  // the erase pins the installed copy or leads a new op).
  void Finish(const std::string& key, const std::shared_ptr<SharedGetOp>& op, HolderRef holder) {
    ops_.EraseIf(key, [&](const std::shared_ptr<SharedGetOp>& current) { return current == op; });
    op->Finish(std::move(holder));
  }
  size_t size() const { return ops_.size(); }

 private:
  KeyControlTable<std::shared_ptr<SharedGetOp>> ops_;
};

}  // namespace fluxon
