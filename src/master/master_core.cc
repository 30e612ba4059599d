#include "master/master_core.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace fluxon {

absl::Status MasterCore::CheckGeneration(uint32_t node_id, uint64_t generation) const {
  MutexLock lock(&owners_mu_);
  auto it = owners_.find(node_id);
  if (it == owners_.end()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("owner node %d is not registered with the master", node_id));
  }
  if (it->second.generation() != generation) {
    return absl::FailedPreconditionError(
        absl::StrFormat("owner node %d generation %d is stale (registered generation %d)", node_id,
                        generation, it->second.generation()));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterOwnerReply> MasterCore::RegisterOwner(
    const v1::RegisterOwnerRequest& r) {
  if (r.generation() == 0) return absl::InvalidArgumentError("owner generation must be non-zero");
  uint64_t old_generation = 0;
  {
    MutexLock lock(&owners_mu_);
    v1::OwnerInfo& info = owners_[r.node_id()];
    old_generation = info.generation();
    info.set_node_id(r.node_id());
    info.set_generation(r.generation());
    info.set_role(r.role());
    info.set_capacity_bytes(r.capacity_bytes());
    info.set_address(r.address());
  }
  if (old_generation != 0 && old_generation != r.generation()) {
    // The old owner's memory is gone: its routes must not be served.
    std::vector<std::string> stale;
    routes_.ForEach([&](const std::string& key, const RouteRec& rec) {
      if (rec.node_id == r.node_id() && rec.generation == old_generation) stale.push_back(key);
    });
    for (const std::string& key : stale) {
      routes_.EraseIf(key, [&](const RouteRec& rec) {
        return rec.node_id == r.node_id() && rec.generation == old_generation;
      });
    }
    spdlog::info("owner node {} re-registered (generation {} -> {}); dropped {} stale routes",
                 r.node_id(), old_generation, r.generation(), stale.size());
  } else {
    spdlog::info("owner node {} registered (role {}, generation {})", r.node_id(), r.role(),
                 r.generation());
  }
  v1::RegisterOwnerReply reply;
  reply.set_master_epoch(1);
  return reply;
}

absl::StatusOr<v1::PublishBatchReply> MasterCore::PublishBatch(const v1::PublishBatchRequest& r) {
  if (absl::Status s = CheckGeneration(r.node_id(), r.generation()); !s.ok()) return s;
  v1::PublishBatchReply reply;
  counters_.publish_batches.fetch_add(1, std::memory_order_relaxed);
  for (const v1::RouteItem& item : r.items()) {
    const RouteRec rec{r.node_id(), r.generation(), item.put_id() ? item.put_id() : r.put_id(),
                       item.offset(), item.len()};
    auto outcome = routes_.Upsert(
        item.key(), [&] { return rec; },
        [&](RouteRec& cur, bool inserted) {
          if (inserted) return 0;
          const bool same = cur.node_id == rec.node_id && cur.generation == rec.generation &&
                            cur.put_id == rec.put_id && cur.offset == rec.offset;
          return same ? 1 : 2;
        });
    if (outcome == 2) {
      reply.add_outcomes(v1::SUPERSEDED);
      counters_.superseded_items.fetch_add(1, std::memory_order_relaxed);
    } else {
      reply.add_outcomes(v1::PUBLISHED);
      (outcome == 0 ? counters_.published_items : counters_.republished_items)
          .fetch_add(1, std::memory_order_relaxed);
    }
  }
  return reply;
}

absl::StatusOr<v1::LookupReply> MasterCore::Lookup(const v1::LookupRequest& r) {
  counters_.lookup_batches.fetch_add(1, std::memory_order_relaxed);
  counters_.lookup_keys.fetch_add(r.keys_size(), std::memory_order_relaxed);
  v1::LookupReply reply;
  for (const std::string& key : r.keys()) {
    std::optional<RouteRec> rec = routes_.Get(key);
    reply.add_found(rec.has_value());
    v1::Route* route = reply.add_routes();
    if (rec) {
      route->set_key(key);
      route->set_node_id(rec->node_id);
      route->set_generation(rec->generation);
      route->set_put_id(rec->put_id);
      route->set_offset(rec->offset);
      route->set_len(rec->len);
    }
  }
  return reply;
}

absl::StatusOr<v1::RemoveRoutesReply> MasterCore::RemoveRoutes(const v1::RemoveRoutesRequest& r) {
  if (absl::Status s = CheckGeneration(r.node_id(), r.generation()); !s.ok()) return s;
  v1::RemoveRoutesReply reply;
  for (const v1::RouteItem& item : r.items()) {
    const bool removed = routes_.EraseIf(item.key(), [&](const RouteRec& rec) {
      return rec.node_id == r.node_id() && rec.generation == r.generation() &&
             rec.put_id == item.put_id();
    });
    if (removed) counters_.removed_routes.fetch_add(1, std::memory_order_relaxed);
    reply.add_removed(removed);
  }
  return reply;
}

absl::StatusOr<v1::ListOwnersReply> MasterCore::ListOwners(const v1::ListOwnersRequest&) {
  std::map<uint32_t, uint64_t> per_node;
  routes_.ForEach([&](const std::string&, const RouteRec& rec) { ++per_node[rec.node_id]; });
  v1::ListOwnersReply reply;
  MutexLock lock(&owners_mu_);
  for (const auto& [id, info] : owners_) {
    v1::OwnerInfo* o = reply.add_owners();
    *o = info;
    o->set_routes(per_node[id]);
  }
  return reply;
}

absl::StatusOr<v1::ListKeysReply> MasterCore::ListKeys(const v1::ListKeysRequest& r) {
  const uint32_t limit = r.limit() == 0 ? 100 : r.limit();
  std::map<std::string, RouteRec> sorted;
  routes_.ForEach([&](const std::string& key, const RouteRec& rec) {
    if (absl::StartsWith(key, r.prefix())) sorted.emplace(key, rec);
  });
  v1::ListKeysReply reply;
  for (const auto& [key, rec] : sorted) {
    if (static_cast<uint32_t>(reply.routes_size()) >= limit) break;
    v1::Route* route = reply.add_routes();
    route->set_key(key);
    route->set_node_id(rec.node_id);
    route->set_generation(rec.generation);
    route->set_put_id(rec.put_id);
    route->set_offset(rec.offset);
    route->set_len(rec.len);
  }
  return reply;
}

}  // namespace fluxon
