// MasterCore: the global key -> route table, owner registry and generations.
//
// Invariants:
// - Routes live in a RouteTable (route/route_table.h): one version per key, with its primary
//   location and any copies. Publishing a key that already has a route of another identity
//   leaves the route unchanged and answers SUPERSEDED; publishing the same identity again answers
//   PUBLISHED (idempotent retry, T1).
// - V2: a route exists only after PublishBatch; nothing about an owner's local-visible values is
//   known here before that.
// - When an owner registers with a new generation, every route of its old generation is dropped:
//   that memory no longer exists. Calls naming an old generation fail with FailedPrecondition.
// - An owner is live while it was heard (registration, heartbeat = re-registration of the same
//   identity, publish, route removal) within owner_lease. A new generation for a live owner's
//   node_id is refused (AlreadyExists): a second process cannot take over a live owner's
//   node_id and drop its routes. UnregisterOwner (a stopping owner) frees the node_id at once.
// - An owner not heard for owner_lease + owner_grace has expired: its routes are dropped, the
//   gets it requested end, and its generation is refused from then on (a restarted owner comes
//   back with a new generation). Expiry runs in ExpireDue (the maintenance thread).
// - Remote gets (InflightGets): BatchGetStart looks up each key and pins its source location in
//   one critical section with RemoveRoutes' pin check, so a route is never removed between the
//   lookup that hands it to a reader and the pin that protects the read. A source is a live
//   owner with a data plane that is not the requester. BatchGetDone adds the requester's target
//   as a location of the same put_id (key/version/owner CAS) or says why not; Revoke ends gets.
// - When an owner's routes are dropped (new generation, unregister, expiry), the gets reading
//   from it end with them: BatchGetDone of such a get answers GET_DONE_UNKNOWN, so a requester
//   never publishes bytes read from memory its source may have reused since. Done also checks
//   that the pinned source location is still a location of the route.
// - Every registration and heartbeat carries the owner's capacity (free, committed bytes of its
//   segment); ListOwners shows it and PlaceReplicas places by it (master/replica_placement.h).
// - Lock order: owners_mu_ is never held while gets_mu_ is taken (snapshots are taken first).
//   The peer-read log's lock is a leaf: taken under gets_mu_ (BatchGetDone records), never
//   around another lock.
// - Peer reads (master/peer_read_log.h): every client remote get that completes is reported to
//   its source owner with that owner's next heartbeat answer, a bounded hint.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "common/hybrid_clock.h"
#include "common/mutex.h"
#include "common/stop_signal.h"
#include "config/config.h"
#include "master/inflight_gets.h"
#include "master/peer_read_log.h"
#include "master/replica_placement.h"
#include "route/route_table.h"
#include "rpc/master_api.h"

namespace fluxon {

// X(field, metric family, help): the one definition of each master counter; the struct, the
// stats map (`fluxonctl stats`, as master_<field>) and /metrics are generated from it.
#define FLUXON_MASTER_COUNTERS(X)                                                             \
  X(publish_batches, "fluxon_master_publish_batches_total", "PublishBatch calls served.")     \
  X(published_items, "fluxon_master_published_items_total", "Routes published.")              \
  X(republished_items, "fluxon_master_republished_items_total",                               \
    "Publishes of a route that already had that identity (idempotent retries).")              \
  X(superseded_items, "fluxon_master_superseded_items_total",                                 \
    "Publishes refused because another version holds the key.")                               \
  X(replaced_routes, "fluxon_master_replaced_routes_total",                                   \
    "Routes a republished higher version replaced (their owners are told to republish).")     \
  X(publish_identity_refused, "fluxon_master_publish_identity_refused_total",                 \
    "Publishes of a routed identity by an owner that neither put it nor holds it as a copy.") \
  X(lookup_batches, "fluxon_master_lookup_batches_total", "Lookup calls served.")             \
  X(lookup_keys, "fluxon_master_lookup_keys_total", "Keys looked up.")                        \
  X(removed_routes, "fluxon_master_removed_routes_total", "Routes removed.")                  \
  X(remove_refused_pinned, "fluxon_master_remove_refused_pinned_total",                       \
    "Route removals refused because a remote get was reading the location.")                  \
  X(remove_refused_sole, "fluxon_master_remove_refused_sole_total",                           \
    "Route removals asked only if copied, refused: no other live location holds the value.")  \
  X(get_start_calls, "fluxon_master_get_start_calls_total", "BatchGetStart calls served.")    \
  X(get_start_items, "fluxon_master_get_start_items_total", "Keys in BatchGetStart calls.")   \
  X(get_start_replayed, "fluxon_master_get_start_replayed_total",                             \
    "BatchGetStart retries answered from the stored reply (same request_id).")                \
  X(gets_started, "fluxon_master_gets_started_total", "Remote gets started (source pinned).") \
  X(get_done_calls, "fluxon_master_get_done_calls_total", "BatchGetDone calls served.")       \
  X(gets_done, "fluxon_master_gets_done_total",                                               \
    "Remote gets whose target became a location of the route.")                               \
  X(get_done_replayed, "fluxon_master_get_done_replayed_total",                               \
    "BatchGetDone items whose copy was already published (a retried Done, T1).")              \
  X(replica_copies_remote_cache, "fluxon_master_replica_copies_remote_cache_total",           \
    "Replica copies (pulled on a source's request) added to routes on remote_cache owners.")  \
  X(replica_copies_other_roles, "fluxon_master_replica_copies_other_roles_total",             \
    "Replica copies added to routes on owners of any other role (GPU owners, embedded).")     \
  X(get_revoke_calls, "fluxon_master_get_revoke_calls_total", "BatchGetRevoke calls served.") \
  X(gets_revoked, "fluxon_master_gets_revoked_total", "Remote gets revoked.")                 \
  X(gets_expired, "fluxon_master_gets_expired_total",                                         \
    "Remote gets ended by the in-flight TTL (requester silent).")                             \
  X(owners_expired, "fluxon_master_owners_expired_total",                                     \
    "Owners expired after lease + grace (routes dropped, generation refused).")               \
  X(peer_read_keys, "fluxon_master_peer_read_keys_total",                                     \
    "Keys of client remote gets reported to their source owner with its next heartbeat.")     \
  X(peer_read_keys_dropped, "fluxon_master_peer_read_keys_dropped_total",                     \
    "Peer-read keys dropped unreported (an owner's bound full, or its generation ended).")

struct MasterCounters {
#define FLUXON_MASTER_COUNTER_FIELD(field, metric, help) std::atomic<int64_t> field{0};
  FLUXON_MASTER_COUNTERS(FLUXON_MASTER_COUNTER_FIELD)
#undef FLUXON_MASTER_COUNTER_FIELD
};

struct MasterCounterDef {
  const char* name;
  const char* metric;
  const char* help;
  std::atomic<int64_t> MasterCounters::*field;
};
inline constexpr MasterCounterDef kMasterCounterDefs[] = {
#define FLUXON_MASTER_COUNTER_DEF(field, metric, help) \
  {#field, metric, help, &MasterCounters::field},
    FLUXON_MASTER_COUNTERS(FLUXON_MASTER_COUNTER_DEF)
#undef FLUXON_MASTER_COUNTER_DEF
};

// The master's settings; defaults are the config's (their one definition: config/settings.h).
struct MasterOptions {
  static MasterOptions FromConfig(const MasterConfig& c) {
    return MasterOptions{c.owner_lease, c.owner_grace, c.inflight_ttl, PlacementFromConfig(c),
                         RouteKeysFromConfig(c)};
  }
  static RouteKeys RouteKeysFromConfig(const MasterConfig& c) {
    return c.route_keys == "fingerprint" ? RouteKeys::kFingerprint : RouteKeys::kFull;
  }
  static ReplicaPlacementOptions PlacementFromConfig(const MasterConfig& c) {
    const ReplicaPlacementConfig& p = c.replica_task_placement;
    return ReplicaPlacementOptions{p.remote_only_node_roles, p.restrict_to_remote_only_node_roles,
                                   c.replica_cache_capacity_ratio};
  }
  std::chrono::milliseconds owner_lease = MasterConfig{}.owner_lease;
  // After the lease: how much longer before an unheard owner's routes are dropped.
  std::chrono::milliseconds owner_grace = MasterConfig{}.owner_grace;
  std::chrono::milliseconds inflight_get_ttl = MasterConfig{}.inflight_ttl;
  ReplicaPlacementOptions placement = PlacementFromConfig(MasterConfig{});
  RouteKeys route_keys = RouteKeysFromConfig(MasterConfig{});
};

class MasterCore final : public MasterApi {
 public:
  explicit MasterCore(MasterOptions options = {});
  // A master instance with a given epoch (non-zero; an elected master's is its leadership's
  // epoch, ha/elected_master.h) counting into `counters` (shared by the instances of one
  // process, so its metrics continue across leaderships; null: its own).
  MasterCore(MasterOptions options, uint64_t epoch, std::shared_ptr<MasterCounters> counters);
  ~MasterCore() override;

  absl::StatusOr<v1::RegisterOwnerReply> RegisterOwner(const v1::RegisterOwnerRequest& r) override;
  absl::StatusOr<v1::UnregisterOwnerReply> UnregisterOwner(
      const v1::UnregisterOwnerRequest& r) override;
  absl::StatusOr<v1::PublishBatchReply> PublishBatch(const v1::PublishBatchRequest& r) override;
  absl::StatusOr<v1::LookupReply> Lookup(const v1::LookupRequest& r) override;
  absl::StatusOr<v1::RemoveRoutesReply> RemoveRoutes(const v1::RemoveRoutesRequest& r) override;
  absl::StatusOr<v1::ListOwnersReply> ListOwners(const v1::ListOwnersRequest& r) override;
  absl::StatusOr<v1::ListKeysReply> ListKeys(const v1::ListKeysRequest& r) override;
  absl::StatusOr<v1::PlaceReplicasReply> PlaceReplicas(const v1::PlaceReplicasRequest& r) override;
  absl::StatusOr<v1::BatchGetStartReply> BatchGetStart(const v1::BatchGetStartRequest& r) override;
  absl::StatusOr<v1::BatchGetDoneReply> BatchGetDone(const v1::BatchGetDoneRequest& r) override;
  absl::StatusOr<v1::BatchGetRevokeReply> BatchGetRevoke(
      const v1::BatchGetRevokeRequest& r) override;

  // Ends remote gets past their TTL and expires owners past lease + grace.
  void ExpireDue(std::chrono::steady_clock::time_point now);
  // Runs ExpireDue every `interval` on a thread until destruction (the node calls it).
  void StartMaintenance(std::chrono::milliseconds interval);

  size_t route_count() const { return routes_.size(); }
  // Logical and physical bytes the routes hold (design P3: capacity counted once).
  RouteTable::Totals route_totals() const { return routes_.totals(); }
  // This instance's epoch (non-zero, fixed for the instance's life: random, or the leadership's
  // epoch of an elected master): every answer to an owner carries it, so an owner notices a
  // restarted (or newly elected) master and republishes its routes.
  uint64_t epoch() const { return epoch_; }
  size_t inflight_gets() const;
  // BatchGetStart answers kept for retries (T1): only while a get they started is in flight.
  size_t stored_get_replies() const;
  const MasterCounters& counters() const { return *counters_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct OwnerRec {
    v1::OwnerInfo info;
    Clock::time_point last_heard;
    // A route naming this owner's value was replaced by a higher republished version: its next
    // registration answer tells it to republish (and so drop what was superseded).
    bool republish_due = false;
  };
  // Tells the owners of `displaced` locations (other than `except_node`) to republish.
  void MarkRepublishDue(const std::vector<RouteLocation>& displaced, uint32_t except_node);
  // Checks the caller's generation and renews its lease.
  absl::Status CheckGeneration(uint32_t node_id, uint64_t generation);
  struct Peer {
    uint64_t generation = 0;
    std::string address;
    std::vector<std::string> transports;
  };
  // Live owners with a data plane, by node.
  std::map<uint32_t, Peer> LivePeers() const;
  // Every live owner's (heard within owner_lease) current generation, by node.
  std::map<uint32_t, uint64_t> LiveGenerations() const;

  // Ends every in-flight get requested by, or reading from, (node, generation): its memory or
  // its reader is gone, so no Done may publish a copy read from it (and its pins end). Drops
  // the peer reads waiting for the node too.
  size_t DropGetsOf(uint32_t node, uint64_t generation);

  const MasterOptions options_;
  const uint64_t epoch_;
  // Observes every published version; every answer to an owner carries it (see HybridClock).
  HybridClock clock_;
  mutable Mutex owners_mu_;
  std::map<uint32_t, OwnerRec> owners_ ABSL_GUARDED_BY(owners_mu_);
  // Expired (node, generation)s, refused from then on; bounded (oldest forgotten first).
  std::set<std::pair<uint32_t, uint64_t>> retired_ ABSL_GUARDED_BY(owners_mu_);
  std::deque<std::pair<uint32_t, uint64_t>> retired_order_ ABSL_GUARDED_BY(owners_mu_);
  RouteTable routes_;
  mutable Mutex gets_mu_;
  InflightGets inflight_ ABSL_GUARDED_BY(gets_mu_);
  // Client remote gets' reads of each source owner, for its next heartbeat (its own lock).
  PeerReadLog peer_reads_;
  const std::shared_ptr<MasterCounters> counters_;
  StopSignal stop_;
  std::thread maintenance_;
};

}  // namespace fluxon
