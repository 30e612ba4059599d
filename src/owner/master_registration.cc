#include "owner/master_registration.h"

#include <thread>

#include "absl/strings/str_format.h"
#include "rpc/retry.h"
#include "spdlog/spdlog.h"

namespace fluxon {

absl::Status MasterRegistration::Register() {
  v1::RegisterOwnerRequest req;
  req.set_node_id(identity_.node_id);
  req.set_generation(identity_.generation);
  req.set_role(identity_.role);
  req.set_capacity_bytes(identity_.capacity_bytes);
  req.set_address(identity_.data_address);
  for (const std::string& t : identity_.transports) req.add_transports(t);
  absl::StatusOr<v1::RegisterOwnerReply> r = master_->RegisterOwner(req);
  if (r.ok()) NoteInflightGetTtl(r->inflight_get_ttl_ms());
  return r.status();
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

void MasterRegistration::HeartbeatLoop(std::chrono::milliseconds interval) {
  bool failing = false;
  while (stop_->SleepFor(interval)) {
    absl::Status r = Register();
    if (!r.ok() && !failing) {
      spdlog::warn("heartbeat to the master failed: {}", r.ToString());
    } else if (r.ok() && failing) {
      spdlog::info("heartbeat to the master succeeded again");
    }
    failing = !r.ok();
  }
}

void MasterRegistration::Unregister() {
  v1::UnregisterOwnerRequest req;
  req.set_node_id(identity_.node_id);
  req.set_generation(identity_.generation);
  absl::StatusOr<v1::UnregisterOwnerReply> r = master_->UnregisterOwner(req);
  if (!r.ok()) spdlog::info("unregistering from the master: {}", r.status().ToString());
}

}  // namespace fluxon
