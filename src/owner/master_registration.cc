#include "owner/master_registration.h"

#include <algorithm>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "rpc/retry.h"
#include "spdlog/spdlog.h"

namespace fluxon {

void MasterRegistration::SetRegistered(bool registered) {
  if (registered_.exchange(registered, std::memory_order_acq_rel) != registered) {
    counters_->master_registered.store(registered ? 1 : 0, std::memory_order_relaxed);
  }
}

absl::Status MasterRegistration::Register() {
  v1::RegisterOwnerRequest req;
  req.set_node_id(identity_.node_id);
  req.set_generation(generation());
  req.set_role(identity_.role);
  req.set_capacity_bytes(identity_.capacity_bytes);
  req.set_address(identity_.data_address);
  req.set_peer_address(peer_address_);
  for (const std::string& t : identity_.transports) req.add_transports(t);
  if (capacity_) *req.mutable_capacity() = capacity_();
  absl::StatusOr<v1::RegisterOwnerReply> r = master_->RegisterOwner(req);
  if (r.ok()) {
    NoteInflightGetTtl(r->inflight_get_ttl_ms());
    NoteClock(r->hlc());
    const uint64_t epoch_before = epoch_.load(std::memory_order_acquire);
    NoteEpoch(r->master_epoch());
    SetRegistered(true);
    if (peer_reads_ && r->peer_reads_size() > 0) peer_reads_(r->peer_reads());
    // The master's table did not know this owner, so none of our routes are there: a master or
    // a leadership that started empty, maybe under an epoch already seen. (Not at the first
    // registration: nothing is committed before it.)
    if (r->newly_registered() && registered_once_.exchange(true, std::memory_order_acq_rel)) {
      if (epoch_before == r->master_epoch()) {  // (a new epoch is logged by NoteEpoch)
        spdlog::info(
            "the master did not know this owner (generation {}): republishing every "
            "committed value",
            req.generation());
      }
      MarkRepublishDue();
    }
    if (r->republish()) {
      // A newer version of one of our keys replaced our route: republishing drops what was
      // superseded (a value no reader may be served any more).
      spdlog::info("the master asks for a republish: a newer version replaced one of our routes");
      MarkRepublishDue();
    }
  } else if (IsGenerationRefused(r.status())) {
    SetRegistered(false);
  } else if (!IsUncertain(r.status())) {
    // A definite refusal (another certificate owns the node_id, a live owner holds it, ...):
    // the master does not count this owner as a member, whatever it thought before. Status,
    // the watchdog probe and /metrics say so until a registration passes again.
    counters_->registrations_refused.fetch_add(1, std::memory_order_relaxed);
    if (registered()) {
      spdlog::error("the master refused this owner's registration: {}", r.status().ToString());
    }
    SetRegistered(false);
  }
  return r.status();
}

void MasterRegistration::NoteEpoch(uint64_t epoch) {
  if (epoch == 0) return;
  const uint64_t before = epoch_.exchange(epoch, std::memory_order_acq_rel);
  if (before != 0 && before != epoch) {
    counters_->master_epoch_changes.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn(
        "the master is a new instance (epoch {:#x}, was {:#x}): its routes are gone; "
        "republishing every committed value",
        epoch, before);
    MarkRepublishDue();
  }
}

void MasterRegistration::NoteRefused() {
  refused_.store(true, std::memory_order_release);
  Wake();
}

bool MasterRegistration::WaitRepublishDue(std::chrono::milliseconds timeout) {
  return WaitUntil(std::chrono::steady_clock::now() + timeout,
                   [this] { return republish_due_.load(std::memory_order_acquire); });
}

absl::Status MasterRegistration::RegisterAtStart(std::chrono::milliseconds timeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  int uncertain = 0;
  bool warned = false;
  absl::Status r = RetryUncertain([&] { return Register(); }, stop_,
                                  [&](const absl::Status& s, std::chrono::milliseconds) {
                                    if (s.code() == absl::StatusCode::kAlreadyExists && !warned) {
                                      warned = true;
                                      spdlog::warn("{}; waiting for the lease to pass",
                                                   std::string(s.message()));
                                    }
                                  },
                                  [&](const absl::Status& s) {
                                    if (std::chrono::steady_clock::now() >= give_up) return false;
                                    if (s.code() == absl::StatusCode::kAlreadyExists)
                                      return true;  // the lease lapses
                                    return IsUncertain(s) && ++uncertain <= 20;
                                  });
  if (r.ok()) return r;
  return absl::Status(r.code(), absl::StrFormat("registering with the master: %s", r.message()));
}

absl::Status MasterRegistration::RenewGeneration(const absl::Status& refusal) {
  const uint64_t old = generation();
  std::random_device rd;
  uint64_t next = 0;
  while (next == 0 || next == old || next == identity_.generation) {
    next = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  spdlog::warn(
      "the master refused generation {} ({}): this owner was expired and its routes dropped; "
      "registering as generation {} and republishing every committed value",
      old, std::string(refusal.message()), next);
  if (listener_) {
    if (absl::Status s = listener_(next); !s.ok()) {
      spdlog::error("switching to generation {}: {}", next, s.ToString());
      return s;
    }
  }
  generation_.store(next, std::memory_order_release);
  counters_->generation_renewals.fetch_add(1, std::memory_order_relaxed);
  MarkRepublishDue();
  return absl::OkStatus();
}

void MasterRegistration::HeartbeatLoop(std::chrono::milliseconds interval) {
  bool failing = false;
  auto next = std::chrono::steady_clock::now() + interval;
  for (;;) {
    // Sleep until the next beat, or sooner when a master call was refused.
    if (!WaitUntil(next, [this] { return refused_.load(std::memory_order_acquire); })) return;
    refused_.store(false);
    next = std::chrono::steady_clock::now() + interval;
    absl::Status r = Register();
    if (IsGenerationRefused(r)) {
      // Expired (or a stale generation): a new generation, then register under it.
      if (RenewGeneration(r).ok()) r = Register();
    }
    if (!r.ok() && !failing) {
      spdlog::warn("heartbeat to the master failed: {}", r.ToString());
    } else if (r.ok() && failing) {
      spdlog::info("heartbeat to the master succeeded again (generation {})", generation());
    }
    failing = !r.ok();
  }
}

void MasterRegistration::Unregister() {
  v1::UnregisterOwnerRequest req;
  req.set_node_id(identity_.node_id);
  req.set_generation(generation());
  absl::StatusOr<v1::UnregisterOwnerReply> r = master_->UnregisterOwner(req);
  if (!r.ok()) spdlog::info("unregistering from the master: {}", r.status().ToString());
  SetRegistered(false);
}

}  // namespace fluxon
