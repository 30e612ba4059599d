// MasterRegistration: this owner's registration with its master — the identity (node_id,
// generation, role, capacity) and every call that concerns it: register at start, heartbeat,
// re-register after a refused publish, unregister at stop.
//
// Invariants:
// - The heartbeat is a re-registration of the same identity (the master renews the lease and
//   changes nothing else), so a master that restarted learns of this owner again within one
//   heartbeat interval.
// - At start, a registration refused because the node_id's previous owner is still within its
//   lease (AlreadyExists: this node restarted after kill -9) is retried until register_timeout,
//   never forever; uncertain outcomes are retried a bounded number of times.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/stop_signal.h"
#include "rpc/master_api.h"

namespace fluxon {

struct OwnerIdentity {
  uint32_t node_id = 0;
  uint64_t generation = 0;
  std::string role;
  uint64_t capacity_bytes = 0;
  std::string data_address;             // data-plane endpoint peers reach; empty: none
  std::vector<std::string> transports;  // data-plane transports served there
};

class MasterRegistration {
 public:
  MasterRegistration(OwnerIdentity identity, MasterApi* master, StopSignal* stop)
      : identity_(std::move(identity)), master_(master), stop_(stop) {}

  const OwnerIdentity& identity() const { return identity_; }
  // One RegisterOwner of this identity (also the heartbeat and the re-registration).
  absl::Status Register();
  // Start-up registration, retried as described above within `timeout`.
  absl::Status RegisterAtStart(std::chrono::milliseconds timeout);
  // Heartbeats every `interval` until `stop`; logs each change between failing and working.
  void HeartbeatLoop(std::chrono::milliseconds interval);
  // Gives the node_id back (best effort, at stop).
  void Unregister();
  // The master's in-flight get TTL, as its last registration answer said (60 s until then).
  std::chrono::milliseconds inflight_get_ttl() const {
    return std::chrono::milliseconds(inflight_get_ttl_ms_.load(std::memory_order_relaxed));
  }
  void NoteInflightGetTtl(uint64_t ms) {
    if (ms > 0) inflight_get_ttl_ms_.store(static_cast<int64_t>(ms), std::memory_order_relaxed);
  }

 private:
  const OwnerIdentity identity_;
  MasterApi* const master_;
  StopSignal* const stop_;
  std::atomic<int64_t> inflight_get_ttl_ms_{60'000};
};

}  // namespace fluxon
