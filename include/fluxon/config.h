// Fluxon configuration: one YAML format for every role.
//
// Validation rules (each rejection names the offending key):
// - sizes and timeouts must be positive; claim_hard_timeout_ms > claim_soft_timeout_ms;
// - every *_ms setting (and a fault's delay_ms, which may be 0) is at most kMaxSettingMs
//   (86400000 ms, 24 h): past it, deadline arithmetic on steady_clock overflows; an integer too
//   large for int64 is reported against the same bound;
// - owner.max_connections is an integer in [1, 65536]; owner.busy_poll_us is in [0, 100000];
// - owner.heartbeat_interval_ms < master.owner_lease_ms for role=embedded (both in one file), or
//   the master would expire its own owner between heartbeats;
// - expected_capacity.value_len must be in (0, 512 MiB]; the grants it prewarms must fit in
//   owner.segment.size;
// - owner.segment.size is at least one 512 MiB grant and at most the machine's physical memory
//   (MemTotal; MachineLimits injects it);
// - owner.socket_path and client.socket_path are non-empty and shorter than 108 bytes
//   (sizeof(sockaddr_un::sun_path), which includes the terminating NUL);
// - master.listen_address, admin.listen_address and owner.master_address (when set) are
//   host:port, host a hostname, an IPv4 address or a bracketed IPv6 address ([::1]:50151), port
//   in [0, 65535]; port 0 (the kernel picks) only for listen addresses; admin.metrics_address is
//   an IP address alone (IPv4 or unbracketed IPv6: the metrics server resolves no names);
// - ratios must lie strictly inside (0, 1);
// - a key may appear only once in any mapping (yaml-cpp would keep both and read the first);
// - the text is UTF-8 (YAML is Unicode; yaml-cpp's emitter turns other bytes into U+FFFD, so
//   DumpConfig would not reproduce a value holding them);
// - owner-only keys (the `owner` section, expected capacity) are rejected on master and client
//   configs; unknown keys are rejected everywhere (a typo must not silently fall back to a
//   default).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace fluxon {

enum class Role { kEmbedded, kMaster, kOwner, kRemoteCache, kClient };
const char* RoleName(Role role);
inline bool RoleHasOwner(Role r) {
  return r == Role::kEmbedded || r == Role::kOwner || r == Role::kRemoteCache;
}
inline bool RoleHasMaster(Role r) { return r == Role::kEmbedded || r == Role::kMaster; }

struct SegmentConfig {
  uint64_t size_bytes = 4ull << 30;
  bool huge_pages = false;
  int numa_node = -1;
  std::string path;  // empty: memfd shared by fd passing
};

struct ExpectedCapacityConfig {
  uint64_t value_len = 0;
  uint64_t payload_capacity_bytes = 0;
};

struct LocalReserveConfig {
  std::optional<ExpectedCapacityConfig> expected_capacity;
  std::chrono::milliseconds claim_soft_timeout{10};
  std::chrono::milliseconds claim_hard_timeout{30'000};
  std::chrono::milliseconds shrink_idle{5'000};
};

struct OwnerConfig {
  SegmentConfig segment;
  LocalReserveConfig local_reserve;
  double hot_capacity_ratio = 0.95;
  std::string socket_path = "/tmp/fluxon/owner.sock";
  std::string socket_group;    // empty: owner's uid only
  std::string master_address;  // owner / remote_cache roles: where the master listens
  // Capacity eviction: at most this many bytes per round, rounds at least this far apart.
  uint64_t eviction_max_bytes_per_round = 256ull << 20;
  std::chrono::milliseconds eviction_interval{200};
  std::chrono::milliseconds handle_ttl{30'000};  // unconsumed get_start handles expire
  int64_t busy_poll_us = 200;  // a client connection's thread polls this long before sleeping
  // Leases: a prepared put not committed or aborted within put_lease is aborted; views (a get
  // plan's pins) not released within view_lease are released, through the same paths as an
  // explicit abort / release_views (counted as puts_expired / views_expired).
  std::chrono::milliseconds put_lease{60'000};
  std::chrono::milliseconds view_lease{300'000};
  // A commit waits at most this long for room in the bounded publish queue (the master is slow
  // or down); then the put is aborted and the commit fails with Unavailable.
  std::chrono::milliseconds commit_wait_timeout{30'000};
  // Client connections: at most max_connections open; a new connection must say Hello within
  // hello_timeout; a frame must arrive whole within frame_timeout of its first byte.
  int64_t max_connections = 1024;
  std::chrono::milliseconds hello_timeout{10'000};
  std::chrono::milliseconds frame_timeout{10'000};
  // How often the owner tells the master it is alive (the master's owner_lease must be longer).
  std::chrono::milliseconds heartbeat_interval{1'000};
  // Data plane: where this owner serves its segment to other owners (host:port; port 0 lets the
  // kernel pick; empty: no data plane, the single-machine default) and with which transports.
  // Only "tcp" is served today; "rdma" is refused: the verbs transport and its queue-pair
  // exchange over the gRPC peer service (rpc/grpc_verbs_exchange.h, mutual TLS) exist and pass
  // the conformance suite on the emulator, but an owner serves a single transport so far.
  std::string data_address;
  std::vector<std::string> transports = {"tcp"};
  // How long a starting owner retries a registration the master refuses because the node_id's
  // previous owner is still within its lease (a restart right after kill -9); then it fails.
  std::chrono::milliseconds register_timeout{30'000};
  // A remote get (BatchGetStart, the data-plane read, BatchGetDone) ends within this bound;
  // what is not read by then is a miss. The read is also bounded by the master's in-flight TTL.
  std::chrono::milliseconds remote_get_timeout{10'000};
};

struct FaultConfig {
  std::string point;
  std::string action;  // delay | drop | duplicate | fail
  std::chrono::milliseconds delay{0};
  int count = -1;
};

struct MasterConfig {
  std::string listen_address = "127.0.0.1:50151";
  double replica_cache_capacity_ratio = 0.95;
  std::chrono::milliseconds inflight_ttl{60'000};
  // An owner not heard from (registration, heartbeat, publish, route removal) for owner_lease is
  // no longer live: only then may another process register its node_id.
  std::chrono::milliseconds owner_lease{5'000};
  // An owner not heard for owner_lease + owner_grace expires: its routes are dropped and its
  // generation is refused from then on. inflight_ttl bounds a remote get (and its source pin).
  std::chrono::milliseconds owner_grace{5'000};
};

struct ClientConfig {
  std::string socket_path = "/tmp/fluxon/owner.sock";
  // Every client call waits at most this long for the owner's answer (then TimeoutError).
  std::chrono::milliseconds call_timeout{60'000};
};

struct AdminConfig {
  std::string listen_address = "127.0.0.1:50152";
  int metrics_port = 9464;                    // 0 disables the metrics endpoint
  std::string metrics_address = "127.0.0.1";  // where /metrics binds (0.0.0.0: every interface)
  // State-changing admin calls (fault injection set/clear) are refused unless this is true.
  bool allow_mutations = false;
};

// Transport security of every TCP port a node serves or dials (the Unix client socket is guarded by
// its file mode and peer credentials instead; see owner.socket_group).
//   security:
//     tls: {cert_file: node.pem, key_file: node.key, ca_file: ca.pem}
//     cluster_secret_file: /etc/fluxon/cluster.secret
//     insecure: false
// - tls: mutual TLS on the master and admin gRPC services and on every gRPC channel the node
//   opens (owner -> master, the watchdog probe): a peer must present a certificate chaining to
//   ca_file, and this node presents cert_file. The three files are PEM; all three or none.
// - cluster_secret_file: the data plane's membership proof. Every data-plane connection starts
//   with a mutual HMAC-SHA256 challenge-response over this secret (transport/tcp/tcp_handshake.h);
//   nothing is read or written for a peer that fails it. At least 16 bytes (surrounding
//   whitespace is stripped); every owner of a cluster holds the same file.
// - insecure: a node whose gRPC services listen on a non-loopback address without tls, or whose
//   data plane does without a cluster secret, refuses to start unless this is true
//   (CheckListenSecurity). State-changing admin calls then still need an authenticated peer.
struct TlsConfig {
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
};
struct SecurityConfig {
  std::optional<TlsConfig> tls;
  std::string cluster_secret_file;
  bool insecure = false;
};

struct Config {
  Role role = Role::kEmbedded;
  uint32_t node_id = 0;
  std::string log_level = "info";
  std::optional<MasterConfig> master;
  std::optional<OwnerConfig> owner;
  std::optional<ClientConfig> client;
  AdminConfig admin;
  SecurityConfig security;
  std::vector<FaultConfig> faults;
};

// True for "localhost", 127.0.0.0/8 and ::1 (bracketed or not): an address only this machine
// reaches. Anything else (0.0.0.0, [::], other IPs, host names) may be reached from the network.
bool IsLoopbackHost(absl::string_view host);
// The host part of "host:port" / "[v6]:port" (brackets removed); the text itself without a colon.
std::string HostOfAddress(absl::string_view address);
// The start-up rule for ports reachable from the network: FailedPrecondition naming the key when
// the master or admin service listens on a non-loopback address without security.tls, or the
// data plane (owner.data_address) does without security.cluster_secret_file, unless
// security.insecure is true. FluxonNode::Start and `fluxond --check-config` apply it.
absl::Status CheckListenSecurity(const Config& config);

// The documented built-in config `fluxond` runs with no arguments (also configs/single-node.yaml).
Config DefaultEmbeddedConfig();

// What the validator knows about the machine the config will run on. Tests inject these;
// ParseConfig(text) and LoadConfigFile read them from this machine (ThisMachineLimits).
struct MachineLimits {
  uint64_t physical_memory_bytes = 0;  // 0: unknown; owner.segment.size is then not checked
};
// MemTotal from /proc/meminfo, else sysconf(_SC_PHYS_PAGES) * page size, else 0.
MachineLimits ThisMachineLimits();

absl::StatusOr<Config> ParseConfig(absl::string_view yaml_text);
absl::StatusOr<Config> ParseConfig(absl::string_view yaml_text, const MachineLimits& machine);
absl::StatusOr<Config> LoadConfigFile(const std::string& path);
// The resolved config (defaults filled in) as YAML that ParseConfig accepts.
std::string DumpConfig(const Config& config);

// "4GiB", "512MiB", "1.5GB", "4096" -> bytes.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

}  // namespace fluxon
