// fluxond's configuration: one YAML format for every role (the daemon's, not the client API's).
// Every scalar setting is defined once, in config/settings.h; docs/settings.md is its reference.
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
#include "config/settings.h"

namespace fluxon {

enum class Role { kEmbedded, kMaster, kOwner, kRemoteCache, kClient };
const char* RoleName(Role role);
inline bool RoleHasOwner(Role r) {
  return r == Role::kEmbedded || r == Role::kOwner || r == Role::kRemoteCache;
}
inline bool RoleHasMaster(Role r) { return r == Role::kEmbedded || r == Role::kMaster; }

// The structs below hold what ParseConfig resolved. Every scalar field, its default, bounds and
// description come from one line of config/settings.h; the structs add only what is not a
// scalar setting (sections, lists).

struct SegmentConfig {
  FLUXON_SEGMENT_SETTINGS(FLUXON_DECLARE_SETTING)
};

struct ExpectedCapacityConfig {
  FLUXON_EXPECTED_CAPACITY_SETTINGS(FLUXON_DECLARE_SETTING)
};

struct LocalReserveConfig {
  std::optional<ExpectedCapacityConfig> expected_capacity;  // owner.local_reserve.expected_capacity
  FLUXON_LOCAL_RESERVE_SETTINGS(FLUXON_DECLARE_SETTING)
};

struct DemotionConfig {
  FLUXON_DEMOTION_SETTINGS(FLUXON_DECLARE_SETTING)
};

struct OwnerConfig {
  SegmentConfig segment;             // owner.segment
  LocalReserveConfig local_reserve;  // owner.local_reserve
  DemotionConfig demotion;           // owner.demotion
  FLUXON_OWNER_SETTINGS(FLUXON_DECLARE_SETTING)
  // The data plane's transports (owner.transports). Only "tcp" is served today; "rdma" is
  // refused: the verbs transport and its queue-pair exchange over the gRPC peer service
  // (rpc_grpc/grpc_verbs_exchange.h, mutual TLS) pass the conformance suite on the emulator, but an
  // owner serves a single transport so far.
  std::vector<std::string> transports = {"tcp"};
};

// One `faults:` entry: a rule of the fault injector (common/fault_injector.h).
struct FaultConfig {
  std::string point;
  std::string action;  // delay | drop | duplicate | fail | refuse
  std::chrono::milliseconds delay{0};
  int count = -1;
};

// Where replicas go (master.replica_task_placement; master/replica_placement.h has the rules).
struct ReplicaPlacementConfig {
  FLUXON_REPLICA_PLACEMENT_SETTINGS(FLUXON_DECLARE_SETTING)
  // Roles of owners that hold only copies (no inference): preferred as targets, and the only
  // targets under restrict_to_remote_only_node_roles. Each one of owner, remote_cache, embedded.
  std::vector<std::string> remote_only_node_roles = {"remote_cache"};
};

struct MasterConfig {
  FLUXON_MASTER_SETTINGS(FLUXON_DECLARE_SETTING)
  ReplicaPlacementConfig replica_task_placement;  // master.replica_task_placement
};

// Standby masters elected through etcd (`election:`; docs/ha.md). Role master campaigns for the
// key; roles owner and remote_cache follow whoever holds it (instead of owner.master_address).
struct ElectionConfig {
  std::vector<std::string> endpoints;  // etcd members, host:port (IPv4 literals when several)
  FLUXON_ELECTION_SETTINGS(FLUXON_DECLARE_SETTING)
};

struct ClientConfig {
  FLUXON_CLIENT_SETTINGS(FLUXON_DECLARE_SETTING)
};

struct AdminConfig {
  FLUXON_ADMIN_SETTINGS(FLUXON_DECLARE_SETTING)
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
  FLUXON_TLS_SETTINGS(FLUXON_DECLARE_SETTING)
};
struct SecurityConfig {
  std::optional<TlsConfig> tls;
  FLUXON_SECURITY_SETTINGS(FLUXON_DECLARE_SETTING)
};

struct Config {
  Role role = Role::kEmbedded;  // role: embedded | master | owner | remote_cache | client
  FLUXON_TOP_SETTINGS(FLUXON_DECLARE_SETTING)
  std::optional<MasterConfig> master;
  std::optional<OwnerConfig> owner;
  std::optional<ClientConfig> client;
  std::optional<ElectionConfig> election;
  AdminConfig admin;
  SecurityConfig security;
  std::vector<FaultConfig> faults;
};

// True for "localhost", 127.0.0.0/8 and ::1 (bracketed or not): an address only this machine
// reaches. Anything else (0.0.0.0, [::], other IPs, host names) may be reached from the network.
bool IsLoopbackHost(absl::string_view host);
// True for the hosts that mean every interface: 0.0.0.0, :: (bracketed or not), and empty.
bool IsWildcardHost(absl::string_view host);
// The host part of "host:port" / "[v6]:port" (brackets removed); the text itself without a colon.
std::string HostOfAddress(absl::string_view address);
// "host:port", the host bracketed when it is an IPv6 literal (the inverse of HostOfAddress).
std::string JoinHostPort(absl::string_view host, int port);
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
// The reference of every setting (key, kind and bounds, default, description) as the Markdown
// of docs/settings.md (`fluxond --settings-reference` prints it; a test keeps the file equal).
std::string SettingsReferenceMarkdown();

// "4GiB", "512MiB", "1.5GB", "4096" -> bytes.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

}  // namespace fluxon
