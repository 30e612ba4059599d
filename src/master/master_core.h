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
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <string>

#include "common/mutex.h"
#include "route/route_table.h"
#include "rpc/master_api.h"

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

struct MasterOptions {
  std::chrono::milliseconds owner_lease{5'000};
};

class MasterCore final : public MasterApi {
 public:
  explicit MasterCore(MasterOptions options = {}) : options_(options) {}

  absl::StatusOr<v1::RegisterOwnerReply> RegisterOwner(const v1::RegisterOwnerRequest& r) override;
  absl::StatusOr<v1::UnregisterOwnerReply> UnregisterOwner(
      const v1::UnregisterOwnerRequest& r) override;
  absl::StatusOr<v1::PublishBatchReply> PublishBatch(const v1::PublishBatchRequest& r) override;
  absl::StatusOr<v1::LookupReply> Lookup(const v1::LookupRequest& r) override;
  absl::StatusOr<v1::RemoveRoutesReply> RemoveRoutes(const v1::RemoveRoutesRequest& r) override;
  absl::StatusOr<v1::ListOwnersReply> ListOwners(const v1::ListOwnersRequest& r) override;
  absl::StatusOr<v1::ListKeysReply> ListKeys(const v1::ListKeysRequest& r) override;

  size_t route_count() const { return routes_.size(); }
  const MasterCounters& counters() const { return counters_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct OwnerRec {
    v1::OwnerInfo info;
    Clock::time_point last_heard;
  };
  // Checks the caller's generation and renews its lease.
  absl::Status CheckGeneration(uint32_t node_id, uint64_t generation);

  const MasterOptions options_;
  mutable Mutex owners_mu_;
  std::map<uint32_t, OwnerRec> owners_ ABSL_GUARDED_BY(owners_mu_);
  RouteTable routes_;
  MasterCounters counters_;
};

}  // namespace fluxon
