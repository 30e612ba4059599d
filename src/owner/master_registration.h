// MasterRegistration: this owner's registration with its master — the identity (node_id,
// generation, role, capacity) and every call that concerns it: register at start, heartbeat,
// re-register after a refused publish, a new generation after the master expired this owner,
// unregister at stop — and what the owner learns from the master's answers (its epoch, its
// in-flight get TTL).
//
// Invariants:
// - The heartbeat is a re-registration of the same identity (the master renews the lease and
//   changes nothing else), so a master that restarted learns of this owner again within one
//   heartbeat interval.
// - Routes are soft state. Every master answer carries the master's epoch (random per master
//   instance); when an answer shows an epoch other than the last one seen, or this owner had
//   to register under a new generation, the routes the master held for it are gone and a
//   republish is due (TakeRepublishDue; the Republisher does it). So is it when the master
//   answers a registration as new to it (it holds routes of registered owners only).
// - An owner the master expired (not heard for lease + grace: SIGSTOP, a long pause, a
//   partition) is refused under that generation from then on. The heartbeat notices the
//   refusal, picks a new generation (never 0, never the one before), tells the generation
//   listener (the data plane then serves under the new generation only, so reads naming the
//   old one fail) and registers again. Until then registered() is false.
// - At start, a registration refused because the node_id's previous owner is still within its
//   lease (AlreadyExists: this node restarted after kill -9) is retried until register_timeout,
//   never forever; uncertain outcomes are retried a bounded number of times.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/hybrid_clock.h"
#include "common/mutex.h"
#include "common/stop_signal.h"
#include "owner/owner_counters.h"
#include "rpc/master_api.h"

namespace fluxon {

struct OwnerIdentity {
  uint32_t node_id = 0;
  uint64_t generation = 0;  // the first generation (the segment's); see generation() after
  std::string role;
  uint64_t capacity_bytes = 0;
  std::string data_address;             // data-plane endpoint peers reach; empty: none
  std::vector<std::string> transports;  // data-plane transports served there
};

class MasterRegistration {
 public:
  // Called with the new generation before the owner registers under it.
  using GenerationListener = std::function<absl::Status(uint64_t generation)>;
  // The owner's memory now, sent with every registration and heartbeat.
  using CapacitySource = std::function<v1::OwnerCapacity()>;
  // Hears the reads peers made of this owner's values (heartbeat answers; hints).
  using PeerReadSink =
      std::function<void(const google::protobuf::RepeatedPtrField<v1::PeerRead>& reads)>;

  MasterRegistration(OwnerIdentity identity, MasterApi* master, OwnerCounters* counters,
                     StopSignal* stop)
      : identity_(std::move(identity)),
        master_(master),
        counters_(counters),
        stop_(stop),
        generation_(identity_.generation) {}

  const OwnerIdentity& identity() const { return identity_; }
  // The generation this owner is registered (or registering) under now.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  // True while the master knows the current generation (the last registration or heartbeat
  // succeeded and no refusal came since).
  bool registered() const { return registered_.load(std::memory_order_acquire); }
  void SetGenerationListener(GenerationListener listener) { listener_ = std::move(listener); }
  // Set before the first Register (not synchronised with the heartbeat thread).
  void SetCapacitySource(CapacitySource source) { capacity_ = std::move(source); }
  // Set before the first Register (not synchronised with the heartbeat thread).
  void SetPeerReadSink(PeerReadSink sink) { peer_reads_ = std::move(sink); }
  // This owner's peer service (where sources send PullReplicas); set before the first Register
  // (the admin server binds before the owner starts). Empty: it takes no replicas.
  void SetPeerAddress(std::string address) { peer_address_ = std::move(address); }

  // One RegisterOwner of this identity (also the heartbeat and the re-registration).
  absl::Status Register();
  // Start-up registration, retried as described above within `timeout`.
  absl::Status RegisterAtStart(std::chrono::milliseconds timeout);
  // Heartbeats every `interval` until `stop`; renews the generation when the master refuses
  // this one as expired; logs each change between failing and working.
  void HeartbeatLoop(std::chrono::milliseconds interval);
  // Gives the node_id back (best effort, at stop).
  void Unregister();

  // A master answer showed `epoch` (0: none). A new epoch makes a republish due.
  void NoteEpoch(uint64_t epoch);
  // A master answer showed the master's hybrid clock (0: none): versions this owner gives later
  // sort after every value the master had routed (see HybridClock).
  void NoteClock(uint64_t hlc) { (void)clock_.Observe(hlc); }
  // The clock that stamps this owner's value versions.
  HybridClock& clock() { return clock_; }
  // A master call was refused because it does not know this generation (restarted master
  // before our heartbeat, or this owner expired): the next heartbeat comes at once.
  void NoteRefused();
  // Wakes the heartbeat and republish waits (call after stop_->Stop()).
  void Interrupt() { Wake(); }
  // Work done under (generation, epoch) was applied after a republish may have scanned: if
  // either has changed since, another republish is due (nothing committed is left unrouted).
  void RepublishIfChanged(uint64_t generation_used, uint64_t epoch_seen) {
    if (generation() != generation_used ||
        (epoch_seen != 0 && epoch_.load(std::memory_order_acquire) != epoch_seen)) {
      MarkRepublishDue();
    }
  }
  void MarkRepublishDue() {
    republish_due_.store(true, std::memory_order_release);
    Wake();
  }
  // True once after a republish became due (new epoch or new generation).
  bool TakeRepublishDue() { return republish_due_.exchange(false, std::memory_order_acq_rel); }
  // Sleeps until a republish is due or `timeout`; false when stopping.
  bool WaitRepublishDue(std::chrono::milliseconds timeout);

  // The master's in-flight get TTL, as its last registration answer said (60 s until then).
  std::chrono::milliseconds inflight_get_ttl() const {
    return std::chrono::milliseconds(inflight_get_ttl_ms_.load(std::memory_order_relaxed));
  }
  void NoteInflightGetTtl(uint64_t ms) {
    if (ms > 0) inflight_get_ttl_ms_.store(static_cast<int64_t>(ms), std::memory_order_relaxed);
  }

 private:
  // Sleeps until `ready()`, `until` or stop (woken by Wake, no polling); false when stopping.
  template <typename Ready>
  bool WaitUntil(std::chrono::steady_clock::time_point until, Ready ready) {
    MutexLock lock(&wake_mu_);
    while (!stop_->stopped() && !ready() && std::chrono::steady_clock::now() < until) {
      wake_cv_.WaitUntil(&wake_mu_, until);
    }
    return !stop_->stopped();
  }
  void Wake() {
    MutexLock lock(&wake_mu_);
    wake_cv_.SignalAll();
  }
  // Picks and announces a new generation after the master refused the current one as expired.
  absl::Status RenewGeneration(const absl::Status& refusal);
  void SetRegistered(bool registered);

  const OwnerIdentity identity_;
  std::string peer_address_;
  MasterApi* const master_;
  OwnerCounters* const counters_;
  StopSignal* const stop_;
  GenerationListener listener_;
  CapacitySource capacity_;
  PeerReadSink peer_reads_;
  HybridClock clock_;
  std::atomic<uint64_t> generation_;
  std::atomic<bool> registered_{false};
  std::atomic<bool> registered_once_{false};  // a registration has succeeded before
  std::atomic<uint64_t> epoch_{0};
  std::atomic<bool> republish_due_{false};
  std::atomic<bool> refused_{false};
  std::atomic<int64_t> inflight_get_ttl_ms_{60'000};
  // Wakes the heartbeat (refused_) and the republisher (republish_due_); the flags are atomics
  // set before Wake takes the mutex, so no wake-up is lost.
  Mutex wake_mu_;
  CondVar wake_cv_;
};

// True when `s` is the master's refusal of a generation it does not know (FailedPrecondition:
// not registered, stale, or expired).
inline bool IsGenerationRefused(const absl::Status& s) {
  return s.code() == absl::StatusCode::kFailedPrecondition;
}

}  // namespace fluxon
