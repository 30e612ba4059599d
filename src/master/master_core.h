// MasterCore: the global key -> route table, owner registry and generations.
//
// Invariants:
// - A route names exactly one (node, generation, put_id, offset, len). Publishing a key that
//   already has a route of another identity leaves the route unchanged and answers SUPERSEDED;
//   publishing the same identity again answers PUBLISHED (idempotent retry, T1).
// - V2: a route exists only after PublishBatch; nothing about an owner's local-visible values is
//   known here before that.
// - When an owner registers with a new generation, every route of its old generation is dropped:
//   that memory no longer exists. Calls naming an old generation fail with FailedPrecondition.
// - The route table is sharded by key (256 shards, G10); a batch takes one shard lock per key.
#pragma once

#include <atomic>
#include <map>
#include <string>

#include "common/mutex.h"
#include "common/sharded_table.h"
#include "master/master_api.h"

namespace fluxon {

struct MasterCounters {
  std::atomic<int64_t> publish_batches{0};
  std::atomic<int64_t> published_items{0};
  std::atomic<int64_t> republished_items{0};  // idempotent retries
  std::atomic<int64_t> superseded_items{0};
  std::atomic<int64_t> lookup_batches{0};
  std::atomic<int64_t> lookup_keys{0};
  std::atomic<int64_t> removed_routes{0};
};

class MasterCore final : public MasterApi {
 public:
  MasterCore() = default;

  absl::StatusOr<v1::RegisterOwnerReply> RegisterOwner(const v1::RegisterOwnerRequest& r) override;
  absl::StatusOr<v1::PublishBatchReply> PublishBatch(const v1::PublishBatchRequest& r) override;
  absl::StatusOr<v1::LookupReply> Lookup(const v1::LookupRequest& r) override;
  absl::StatusOr<v1::RemoveRoutesReply> RemoveRoutes(const v1::RemoveRoutesRequest& r) override;
  absl::StatusOr<v1::ListOwnersReply> ListOwners(const v1::ListOwnersRequest& r) override;
  absl::StatusOr<v1::ListKeysReply> ListKeys(const v1::ListKeysRequest& r) override;

  size_t route_count() const { return routes_.size(); }
  const MasterCounters& counters() const { return counters_; }

 private:
  struct RouteRec {
    uint32_t node_id;
    uint64_t generation;
    uint64_t put_id;
    uint64_t offset;
    uint64_t len;
  };
  absl::Status CheckGeneration(uint32_t node_id, uint64_t generation) const;

  mutable Mutex owners_mu_;
  std::map<uint32_t, v1::OwnerInfo> owners_ ABSL_GUARDED_BY(owners_mu_);
  ShardedTable<std::string, RouteRec> routes_;
  MasterCounters counters_;
};

}  // namespace fluxon
