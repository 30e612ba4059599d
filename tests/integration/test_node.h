// Test helpers: an in-process fluxond (FluxonNode) on a private socket and ephemeral ports.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/node.h"
#include "fluxon/client.h"
#include "fluxon/units.h"

namespace fluxon::testing {

inline std::string UniqueSocketPath() {
  static std::atomic<int> n{0};
  return "/tmp/fluxon-test/" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".sock";
}

inline Config TestConfig(uint64_t segment_bytes = 2 * kGrantBytes) {
  Config c = DefaultEmbeddedConfig();
  c.log_level = "warn";
  c.master->listen_address = "127.0.0.1:0";
  c.admin.listen_address = "127.0.0.1:0";
  c.admin.metrics_port = 0;
  c.owner->socket_path = UniqueSocketPath();
  c.owner->segment.size_bytes = segment_bytes;
  c.owner->local_reserve.claim_hard_timeout = std::chrono::milliseconds(2000);
  return c;
}

inline std::unique_ptr<FluxonNode> StartNode(const Config& c) {
  auto node = FluxonNode::Start(c);
  if (!node.ok()) {
    fprintf(stderr, "node start failed: %s\n", node.status().ToString().c_str());
    abort();
  }
  return std::move(*node);
}

inline std::unique_ptr<KvClient> Connect(const Config& c) {
  ClientOptions o;
  o.socket_path = c.owner->socket_path;
  auto client = KvClient::Connect(o);
  if (!client.ok()) {
    fprintf(stderr, "connect failed: %s\n", client.status().ToString().c_str());
    abort();
  }
  return std::move(*client);
}

// Owner and client counters that are back to zero once no work is in flight.
inline const std::vector<std::string>& OwnerTemporaryCounters() {
  static const std::vector<std::string> names = {
      "live_handles",     "live_views",      "prepared_puts",
      "reserved_entries", "inflight_gets",   "slots_Prepared",
      "slots_Pending",    "slots_Releasing", "slots_PendingLocalVisible",
      "publish_queue"};
  return names;
}
inline const std::vector<std::string>& ClientTemporaryCounters() {
  static const std::vector<std::string> names = {"client_active_plans", "client_handles",
                                                 "client_pending_futures"};
  return names;
}

// The temporary counters of `node` (and of `client`, when given) that are not zero, as
// "name=value" items; empty at baseline.
inline std::string BaselineGaps(FluxonNode& node, KvClient* client = nullptr) {
  std::string gaps;
  auto s = node.owner()->Stats();
  for (const auto& k : OwnerTemporaryCounters()) {
    if (s[k] != 0) gaps += k + "=" + std::to_string(s[k]) + " ";
  }
  if (client != nullptr) {
    auto cs = client->Stats();
    if (!cs.ok()) return "client stats: " + cs.status().ToString();
    for (const auto& k : ClientTemporaryCounters()) {
      if ((*cs)[k] != 0) gaps += k + "=" + std::to_string((*cs)[k]) + " ";
    }
  }
  return gaps;
}

// Waits (bounded by `within`) until every temporary counter is back to zero and returns what is
// still not, empty at baseline. Releases triggered by a disconnect or a commit's completion run
// on the owner's threads after the call that caused them returns, so a test must wait for the
// whole baseline, never for one counter and then read the others.
inline std::string WaitForBaseline(FluxonNode& node, KvClient* client = nullptr,
                                   std::chrono::milliseconds within = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  std::string gaps = BaselineGaps(node, client);
  while (!gaps.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    gaps = BaselineGaps(node, client);
  }
  return gaps;
}

}  // namespace fluxon::testing
