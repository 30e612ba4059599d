#include "master/master_core.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace fluxon {

absl::Status MasterCore::CheckGeneration(uint32_t node_id, uint64_t generation) {
  MutexLock lock(&owners_mu_);
  auto it = owners_.find(node_id);
  if (it == owners_.end()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("owner node %d is not registered with the master", node_id));
  }
  if (it->second.info.generation() != generation) {
    return absl::FailedPreconditionError(
        absl::StrFormat("owner node %d generation %d is stale (registered generation %d)", node_id,
                        generation, it->second.info.generation()));
  }
  it->second.last_heard = Clock::now();
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterOwnerReply> MasterCore::RegisterOwner(
    const v1::RegisterOwnerRequest& r) {
  if (r.generation() == 0) return absl::InvalidArgumentError("owner generation must be non-zero");
  uint64_t old_generation = 0;
  {
    MutexLock lock(&owners_mu_);
    const auto now = Clock::now();
    auto it = owners_.find(r.node_id());
    if (it != owners_.end() && it->second.info.generation() != r.generation()) {
      const auto quiet = now - it->second.last_heard;
      if (quiet < options_.owner_lease) {
        const auto quiet_ms = std::chrono::duration_cast<std::chrono::milliseconds>(quiet).count();
        spdlog::warn(
            "refused registration of node {} generation {}: a live owner holds it (generation "
            "{}, heard {} ms ago)",
            r.node_id(), r.generation(), it->second.info.generation(), quiet_ms);
        return absl::AlreadyExistsError(absl::StrFormat(
            "node_id %d belongs to a live owner (generation %d, heard %d ms ago); a restarted "
            "owner may take it once the %d ms owner lease has passed",
            r.node_id(), it->second.info.generation(), quiet_ms, options_.owner_lease.count()));
      }
    }
    OwnerRec& rec = owners_[r.node_id()];
    old_generation = rec.info.generation();
    rec.info.set_node_id(r.node_id());
    rec.info.set_generation(r.generation());
    rec.info.set_role(r.role());
    rec.info.set_capacity_bytes(r.capacity_bytes());
    rec.info.set_address(r.address());
    rec.info.mutable_transports()->CopyFrom(r.transports());
    rec.last_heard = now;
  }
  if (old_generation == r.generation()) {
    v1::RegisterOwnerReply reply;  // a heartbeat
    reply.set_master_epoch(1);
    return reply;
  }
  if (old_generation != 0) {
    // The old owner's memory is gone: its routes must not be served.
    const uint64_t dropped = routes_.DropNode(r.node_id(), old_generation);
    spdlog::info("owner node {} re-registered (generation {} -> {}); dropped {} stale routes",
                 r.node_id(), old_generation, r.generation(), dropped);
  } else {
    spdlog::info("owner node {} registered (role {}, generation {})", r.node_id(), r.role(),
                 r.generation());
  }
  v1::RegisterOwnerReply reply;
  reply.set_master_epoch(1);
  return reply;
}

absl::StatusOr<v1::UnregisterOwnerReply> MasterCore::UnregisterOwner(
    const v1::UnregisterOwnerRequest& r) {
  {
    MutexLock lock(&owners_mu_);
    auto it = owners_.find(r.node_id());
    if (it == owners_.end() || it->second.info.generation() != r.generation()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "owner node %d generation %d is not the registered owner", r.node_id(), r.generation()));
    }
    owners_.erase(it);
  }
  v1::UnregisterOwnerReply reply;
  reply.set_dropped_routes(routes_.DropNode(r.node_id(), r.generation()));
  spdlog::info("owner node {} (generation {}) unregistered; dropped {} routes", r.node_id(),
               r.generation(), reply.dropped_routes());
  return reply;
}

namespace {
void FillRoute(const std::string& key, const Route& r, v1::Route* out) {
  const RouteLocation& p = r.primary();
  out->set_key(key);
  out->set_node_id(p.node_id);
  out->set_generation(p.generation);
  out->set_put_id(p.put_id);
  out->set_offset(p.offset);
  out->set_len(p.len);
  for (const RouteLocation& l : r.locations) {
    v1::RouteLocation* o = out->add_locations();
    o->set_node_id(l.node_id);
    o->set_generation(l.generation);
    o->set_put_id(l.put_id);
    o->set_offset(l.offset);
    o->set_len(l.len);
  }
}
}  // namespace

absl::StatusOr<v1::PublishBatchReply> MasterCore::PublishBatch(const v1::PublishBatchRequest& r) {
  if (absl::Status s = CheckGeneration(r.node_id(), r.generation()); !s.ok()) return s;
  v1::PublishBatchReply reply;
  counters_.publish_batches.fetch_add(1, std::memory_order_relaxed);
  for (const v1::RouteItem& item : r.items()) {
    const RouteLocation loc{r.node_id(), r.generation(), item.put_id() ? item.put_id() : r.put_id(),
                            item.offset(), item.len()};
    switch (routes_.Publish(item.key(), loc)) {
      case RouteTable::PublishOutcome::kSuperseded:
        reply.add_outcomes(v1::SUPERSEDED);
        counters_.superseded_items.fetch_add(1, std::memory_order_relaxed);
        break;
      case RouteTable::PublishOutcome::kPublished:
        reply.add_outcomes(v1::PUBLISHED);
        counters_.published_items.fetch_add(1, std::memory_order_relaxed);
        break;
      case RouteTable::PublishOutcome::kRepublished:
        reply.add_outcomes(v1::PUBLISHED);
        counters_.republished_items.fetch_add(1, std::memory_order_relaxed);
        break;
    }
  }
  return reply;
}

absl::StatusOr<v1::LookupReply> MasterCore::Lookup(const v1::LookupRequest& r) {
  counters_.lookup_batches.fetch_add(1, std::memory_order_relaxed);
  counters_.lookup_keys.fetch_add(r.keys_size(), std::memory_order_relaxed);
  v1::LookupReply reply;
  for (const std::string& key : r.keys()) {
    std::optional<Route> route = routes_.Lookup(key);
    reply.add_found(route.has_value());
    v1::Route* out = reply.add_routes();
    if (route) FillRoute(key, *route, out);
  }
  return reply;
}

absl::StatusOr<v1::RemoveRoutesReply> MasterCore::RemoveRoutes(const v1::RemoveRoutesRequest& r) {
  if (absl::Status s = CheckGeneration(r.node_id(), r.generation()); !s.ok()) return s;
  v1::RemoveRoutesReply reply;
  for (const v1::RouteItem& item : r.items()) {
    const bool removed =
        routes_.RemoveLocation(item.key(), r.node_id(), r.generation(), item.put_id());
    if (removed) counters_.removed_routes.fetch_add(1, std::memory_order_relaxed);
    reply.add_removed(removed);
  }
  return reply;
}

absl::StatusOr<v1::ListOwnersReply> MasterCore::ListOwners(const v1::ListOwnersRequest&) {
  std::map<uint32_t, uint64_t> per_node = routes_.LocationsPerNode();
  v1::ListOwnersReply reply;
  MutexLock lock(&owners_mu_);
  const auto now = Clock::now();
  for (const auto& [id, rec] : owners_) {
    v1::OwnerInfo* o = reply.add_owners();
    *o = rec.info;
    o->set_routes(per_node[id]);
    o->set_last_heard_ms_ago(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(now - rec.last_heard).count()));
  }
  return reply;
}

absl::StatusOr<v1::ListKeysReply> MasterCore::ListKeys(const v1::ListKeysRequest& r) {
  const uint32_t limit = r.limit() == 0 ? 100 : r.limit();
  v1::ListKeysReply reply;
  for (const auto& [key, route] : routes_.ListByPrefix(r.prefix(), limit)) {
    FillRoute(key, route, reply.add_routes());
  }
  return reply;
}

}  // namespace fluxon
