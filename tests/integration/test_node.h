// Test helpers: an in-process fluxond (FluxonNode) on a private socket and ephemeral ports.
#pragma once

#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>

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

}  // namespace fluxon::testing
