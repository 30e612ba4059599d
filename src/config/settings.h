// The one definition of every scalar setting of fluxond's YAML config.
//
// Each setting is one line of an X-list below: (field, YAML key, kind, default, description).
// From that line come the config struct's field and its default (config/config.h), its parse and
// its bounds (ParseConfig), its dump (DumpConfig) and its row in the settings reference
// (SettingsReferenceMarkdown, checked against docs/settings.md by a test). Adding a setting is
// one line here plus its use; rules that relate two settings (claim_hard > claim_soft, the
// heartbeat inside the lease, a prewarm that fits the segment) are written once in ParseConfig.
//
// A kind names the field's C++ type, how the YAML scalar is read and checked, and how the
// reference describes it:
//   Millis{min}      std::chrono::milliseconds in [min, kMaxSettingMs] (min 1 unless said)
//   Bytes{}          uint64_t byte size > 0 ("4GiB", "512MiB", "1.5GB", "4096")
//   Ratio{}          double strictly inside (0, 1)
//   Text{}           std::string, any value (empty allowed)
//   NonEmptyText{}   std::string; set means non-empty (omit it for "none")
//   Flag{}           bool (true / false)
//   IntIn<T>(lo,hi)  integer T in [lo, hi]
//   SocketPath{}     std::string, non-empty, shorter than sun_path (108 bytes with its NUL)
//   ListenAddress{}  host:port, port 0 allowed (the kernel picks)
//   PeerAddress{}    host:port of a peer (port 0 refused) or empty (unset; not dumped)
//   OptionalListen{} host:port, port 0 allowed, or empty (unset; not dumped)
//   IpLiteral{}      an IPv4 or unbracketed IPv6 address (no name lookup)
//   OneOf({...})     std::string, one of the listed words
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace fluxon {
namespace config_internal {

struct Millis {
  using Type = std::chrono::milliseconds;
  int64_t min_ms = 1;
};
struct Bytes {
  using Type = uint64_t;
};
struct BytesOrZero {  // 0 turns the setting off
  using Type = uint64_t;
};
struct Ratio {
  using Type = double;
};
struct Text {
  using Type = std::string;
};
struct NonEmptyText {
  using Type = std::string;
};
struct Flag {
  using Type = bool;
};
template <typename T>
struct IntIn {
  using Type = T;
  constexpr IntIn(int64_t l, int64_t h) : lo(l), hi(h) {}
  int64_t lo;
  int64_t hi;
};
struct SocketPath {
  using Type = std::string;
};
struct ListenAddress {
  using Type = std::string;
};
struct PeerAddress {
  using Type = std::string;
};
struct OptionalListen {
  using Type = std::string;
};
struct IpLiteral {
  using Type = std::string;
};
// Lives only as long as the full expression it is written in (the X-list's walk).
struct OneOf {
  using Type = std::string;
  OneOf(std::initializer_list<const char*> w) : words(w) {}
  std::initializer_list<const char*> words;
};

}  // namespace config_internal
}  // namespace fluxon

// clang-format off
// (field, YAML key, kind, default, description)

#define FLUXON_TOP_SETTINGS(X)                                                                    \
  X(node_id, "node_id", IntIn<uint32_t>(0, (1 << 20) - 1), 0,                                     \
    "this node's id, unique in the cluster; part of every value identity (put_id's high 20 bits)") \
  X(log_level, "log_level", OneOf({"trace", "debug", "info", "warn", "error", "off"}), "info",   \
    "spdlog level")

#define FLUXON_SEGMENT_SETTINGS(X)                                                                \
  X(size_bytes, "size", Bytes{}, 4ull << 30,                                                      \
    "the shared host-memory segment; at least one 512 MiB grant, at most the machine's MemTotal") \
  X(huge_pages, "huge_pages", Flag{}, false, "back the segment with huge pages")                  \
  X(numa_node, "numa_node", IntIn<int>(-1, 1023), -1, "NUMA node the segment binds to; -1: none") \
  X(path, "path", Text{}, "", "file the segment maps; empty: a memfd shared by fd passing")

#define FLUXON_EXPECTED_CAPACITY_SETTINGS(X)                                                      \
  X(value_len, "value_len", Bytes{}, 0,                                                           \
    "required in the section: the value size to prewarm slots for; at most 512 MiB")             \
  X(payload_capacity_bytes, "payload_capacity_bytes", Bytes{}, 0,                                 \
    "required in the section: how many bytes of such values to prewarm grants for; they must "    \
    "fit in owner.segment.size")

#define FLUXON_LOCAL_RESERVE_SETTINGS(X)                                                          \
  X(claim_soft_timeout, "claim_soft_timeout_ms", Millis{}, std::chrono::milliseconds(10),         \
    "a claim that waited this long asks for capacity (eviction, a new grant)")                    \
  X(claim_hard_timeout, "claim_hard_timeout_ms", Millis{}, std::chrono::milliseconds(30'000),     \
    "a claim fails with ResourceExhausted after this long; must exceed claim_soft_timeout_ms")    \
  X(shrink_idle, "shrink_idle_ms", Millis{}, std::chrono::milliseconds(5'000),                    \
    "a grant with no value for this long goes back to the segment")                               \
  X(warm_grants, "warm_grants", IntIn<uint32_t>(0, 64), 1,                                        \
    "dynamic mode: free grant positions kept populated ahead of the next carve (at start, then "  \
    "in the background), so a claim does not wait for first touch; 0: populate on the claim's "  \
    "path")

#define FLUXON_DEMOTION_SETTINGS(X)                                                               \
  X(enabled, "enabled", Flag{}, false,                                                            \
    "demote cold values to a remote_cache (one copy: this owner's slots are freed once the "      \
    "copy is routed) before pressure deletes them; needs a cluster master "                       \
    "(owner.master_address or election) and owner.data_address")                                  \
  X(start_ratio, "start_ratio", Ratio{}, 0.85,                                                    \
    "demotion runs while used slots exceed this fraction of the capacity; below "                 \
    "owner.hot_capacity_ratio")                                                                   \
  X(max_bytes_in_flight, "max_bytes_in_flight", Bytes{}, 256ull << 20,                            \
    "slot bytes being demoted at once (still ranked and readable here until the copy is routed)") \
  X(remote_budget_bytes, "remote_budget_bytes", BytesOrZero{}, 0,                                      \
    "one ranking for both tiers: this owner's eviction policy keeps ranking the values it "       \
    "demoted, up to this many bytes on remote_caches, and asks the remote_cache to drop those "   \
    "it evicts; set it to this owner's share of the remote_caches' memory. 0: a demoted value "   \
    "is ranked by the remote_cache that holds it")                                                \
  X(keep_fetched_copies, "keep_fetched_copies", Flag{}, true,                                     \
    "one ranking: a demoted value fetched back keeps its copy on the remote_cache and is "        \
    "released here before values held here only (no second demotion); false: that copy is "      \
    "dropped and the value is demoted again when it cools")

#define FLUXON_OWNER_SETTINGS(X)                                                                  \
  X(hot_capacity_ratio, "hot_capacity_ratio", Ratio{}, 0.95,                                      \
    "eviction keeps the hot tier under this fraction of the segment")                             \
  X(socket_path, "socket_path", SocketPath{}, "/tmp/fluxon/owner.sock",                           \
    "the Unix socket clients connect to")                                                         \
  X(socket_group, "socket_group", Text{}, "",                                                     \
    "group allowed on the client socket; empty: the owner's uid only")                            \
  X(master_address, "master_address", PeerAddress{}, "",                                          \
    "where the master listens; role=owner and role=remote_cache name it or an election section")  \
  X(eviction_max_bytes_per_round, "eviction_max_bytes_per_round", Bytes{}, 256ull << 20,          \
    "capacity eviction frees at most this much per round")                                        \
  X(eviction_interval, "eviction_interval_ms", Millis{}, std::chrono::milliseconds(200),          \
    "capacity eviction rounds are at least this far apart")                                       \
  X(handle_ttl, "handle_ttl_ms", Millis{}, std::chrono::milliseconds(30'000),                     \
    "a get_start handle not consumed in time is dropped as by cancel (handles_expired)")          \
  X(busy_poll_us, "busy_poll_us", IntIn<int64_t>(0, 100'000), 200,                                \
    "a client connection's thread polls this long before it sleeps")                              \
  X(put_lease, "put_lease_ms", Millis{}, std::chrono::milliseconds(60'000),                       \
    "a prepared put not committed or aborted in time is aborted (puts_expired)")                  \
  X(view_lease, "view_lease_ms", Millis{}, std::chrono::milliseconds(300'000),                    \
    "a get plan's pins not released in time are released (views_expired)")                        \
  X(commit_wait_timeout, "commit_wait_timeout_ms", Millis{}, std::chrono::milliseconds(30'000),   \
    "a commit waits this long for room in the publish queue, then aborts the put (Unavailable)")  \
  X(max_connections, "max_connections", IntIn<int64_t>(1, 65'536), 1024,                          \
    "client connections open at once; more are refused")                                          \
  X(hello_timeout, "hello_timeout_ms", Millis{}, std::chrono::milliseconds(10'000),               \
    "a new client connection must say Hello within this")                                         \
  X(frame_timeout, "frame_timeout_ms", Millis{}, std::chrono::milliseconds(10'000),               \
    "a frame must arrive whole within this of its first byte")                                    \
  X(heartbeat_interval, "heartbeat_interval_ms", Millis{}, std::chrono::milliseconds(1'000),      \
    "how often the owner tells the master it is alive; below master.owner_lease_ms")              \
  X(register_timeout, "register_timeout_ms", Millis{}, std::chrono::milliseconds(30'000),         \
    "a start retries a registration refused while the node_id's previous owner is in its lease")  \
  X(remote_get_timeout, "remote_get_timeout_ms", Millis{}, std::chrono::milliseconds(10'000),     \
    "a remote get (start, data-plane read, done) ends within this; the rest is a miss")           \
  X(remote_prefetch_workers, "remote_prefetch_workers", IntIn<uint32_t>(0, 64), 4,                \
    "threads fetching the values a deferred get_start left to other owners (0: every get_start "  \
    "fetches them before it answers)")                                                            \
  X(remote_prefetch_chunk_bytes, "remote_prefetch_chunk_bytes", BytesOrZero{}, 0,                 \
    "a deferred batch's remote values are fetched in key-ordered chunks of about this many "      \
    "bytes, so a shorter consumed prefix waits for fewer (0: the whole batch at once, one "       \
    "BatchGetStart and one BatchGetDone per batch)")                                              \
  X(data_address, "data_address", OptionalListen{}, "",                                           \
    "where this owner serves its segment to other owners (port 0: the kernel picks); empty: no "  \
    "data plane")                                                                                 \
  X(replica_queue_keys, "replica_queue_keys", IntIn<uint64_t>(1, 1 << 24), 16'384,               \
    "replica tasks (make_replica_task) queued at most; more are dropped and counted (queue_full)") \
  X(replica_batch_keys, "replica_batch_keys", IntIn<uint64_t>(1, 65'536), 256,                   \
    "replica tasks placed and sent to targets per batch (one PullReplicas per target)")           \
  X(replica_pulls_in_flight, "replica_pulls_in_flight", IntIn<uint32_t>(1, 64), 8,               \
    "replica batches sent at once (one's control round trips run beside the others' reads)")     \
  X(replica_pull_timeout, "replica_pull_timeout_ms", Millis{}, std::chrono::milliseconds(30'000), \
    "a PullReplicas call ends within this (retried twice while its outcome is unknown)")

#define FLUXON_MASTER_SETTINGS(X)                                                                 \
  X(listen_address, "listen_address", ListenAddress{}, "127.0.0.1:50151",                         \
    "the master's gRPC service")                                                                  \
  X(replica_cache_capacity_ratio, "replica_cache_capacity_ratio", Ratio{}, 0.95,                  \
    "a replica target's committed bytes stay within this fraction of its segment (the rest is "   \
    "headroom for its own puts and eviction)")                                                    \
  X(inflight_ttl, "inflight_ttl_ms", Millis{}, std::chrono::milliseconds(60'000),                 \
    "a remote get (and its source pin) ends by this")                                             \
  X(owner_lease, "owner_lease_ms", Millis{}, std::chrono::milliseconds(5'000),                    \
    "an owner not heard for this is not live; only then may another process take its node_id")   \
  X(owner_grace, "owner_grace_ms", Millis{}, std::chrono::milliseconds(5'000),                    \
    "an owner not heard for owner_lease_ms + this expires: its routes and gets are dropped")      \
  X(route_keys, "route_keys", OneOf({"full", "fingerprint"}), "full",                             \
    "what the master keeps of a routed key: full (its bytes, so fluxonctl keys lists them) or "   \
    "fingerprint (a 128-bit keyed hash only: ~110 B less per route at 100 B keys; listing "       \
    "keys is refused)")

#define FLUXON_REPLICA_PLACEMENT_SETTINGS(X)                                                      \
  X(restrict_to_remote_only_node_roles, "restrict_to_remote_only_node_roles", Flag{}, false,      \
    "replicas go only to owners of remote_only_node_roles; none with room: NoSpace (no fallback)")

#define FLUXON_ELECTION_SETTINGS(X)                                                               \
  X(key, "key", NonEmptyText{}, "/fluxon/default/master/leader",                                  \
    "the leadership key in etcd; every master and owner of one cluster names the same one")       \
  X(lease_ttl_s, "lease_ttl_s", IntIn<int64_t>(2, 3'600), 5,                                      \
    "role master: its etcd lease; a dead or paused leader is replaced after about this")          \
  X(poll_interval, "poll_interval_ms", Millis{}, std::chrono::milliseconds(200),                  \
    "how often a standby master tries for the key and an owner reads who holds it")               \
  X(advertise_address, "advertise_address", PeerAddress{}, "",                                    \
    "role master: the address owners dial, published in the key; empty: master.listen_address "  \
    "(with the port it bound), which must then name a host, not a wildcard")

#define FLUXON_CLIENT_SETTINGS(X)                                                                 \
  X(socket_path, "socket_path", SocketPath{}, "/tmp/fluxon/owner.sock",                           \
    "the owner's Unix socket")                                                                    \
  X(call_timeout, "call_timeout_ms", Millis{}, std::chrono::milliseconds(60'000),                 \
    "every client call waits at most this long for the owner (then TimeoutError)")

#define FLUXON_ADMIN_SETTINGS(X)                                                                  \
  X(listen_address, "listen_address", ListenAddress{}, "127.0.0.1:50152",                         \
    "the admin gRPC service (fluxonctl, health)")                                                 \
  X(metrics_port, "metrics_port", IntIn<int>(0, 65'535), 9464,                                    \
    "the Prometheus /metrics port; 0 disables it")                                                \
  X(metrics_address, "metrics_address", IpLiteral{}, "127.0.0.1",                                 \
    "where /metrics binds (0.0.0.0: every interface)")                                            \
  X(allow_mutations, "allow_mutations", Flag{}, false,                                            \
    "admit state-changing admin calls (fault set / clear)")

#define FLUXON_TLS_SETTINGS(X)                                                                    \
  X(cert_file, "cert_file", Text{}, "", "required in the section: this node's PEM certificate") \
  X(key_file, "key_file", Text{}, "", "required in the section: its PEM private key")     \
  X(ca_file, "ca_file", Text{}, "", "required in the section: the PEM CA peers must chain to")   \
  X(node_bound_certificates, "node_bound_certificates", Flag{}, false,                            \
    "the master admits a node_id only from the certificate naming it (Common Name "               \
    "fluxon-node-<id>), also after a master restart; certificates naming no node are refused")

#define FLUXON_SECURITY_SETTINGS(X)                                                               \
  X(cluster_secret_file, "cluster_secret_file", NonEmptyText{}, "",                               \
    "the data plane's shared secret (>= 16 bytes); unset: the machine-local one")                 \
  X(insecure, "insecure", Flag{}, false,                                                          \
    "allow network-reachable services without TLS or a data plane without a secret")

// clang-format on

// The field declarations of one X-list: `Type field{default};`.
#define FLUXON_DECLARE_SETTING(field, key, kind, def, doc) \
  decltype(::fluxon::config_internal::kind)::Type field{def};

namespace fluxon {
namespace config_internal {

// Settings<T>::Visit(obj, fn) calls fn(key, kind, obj.field, doc) for every setting of T's X-list,
// in the list's order (the parse, dump and reference all use this one walk).
template <typename T>
struct Settings;

#define FLUXON_VISIT_SETTING(field, key, kind, def, doc) fn(key, kind, obj.field, doc);
#define FLUXON_SETTINGS_OF(Struct, LIST)   \
  template <>                              \
  struct Settings<Struct> {                \
    template <typename Obj, typename Fn>   \
    static void Visit(Obj& obj, Fn&& fn) { \
      LIST(FLUXON_VISIT_SETTING)           \
    }                                      \
  };

}  // namespace config_internal
}  // namespace fluxon
