#include "master/master_core.h"

#include <random>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "fluxon/status.h"
#include "fluxon/units.h"
#include "spdlog/spdlog.h"

namespace fluxon {

namespace {
uint64_t NewEpoch() {
  std::random_device rd;
  uint64_t e = 0;
  while (e == 0) e = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return e;
}
}  // namespace

MasterCore::MasterCore(MasterOptions options) : MasterCore(options, 0, nullptr) {}

MasterCore::MasterCore(MasterOptions options, uint64_t epoch,
                       std::shared_ptr<MasterCounters> counters)
    : options_(options),
      epoch_(epoch != 0 ? epoch : NewEpoch()),
      routes_(options.route_keys),
      inflight_(options.inflight_get_ttl),
      counters_(counters ? std::move(counters) : std::make_shared<MasterCounters>()) {
  spdlog::info("master epoch {:#x}, route keys kept {}", epoch_,
               options.route_keys == RouteKeys::kFull ? "in full" : "as fingerprints");
}

size_t MasterCore::DropGetsOf(uint32_t node, uint64_t generation) {
  // The reads waiting for it name memory that is gone too.
  counters_->peer_read_keys_dropped.fetch_add(static_cast<int64_t>(peer_reads_.Forget(node)),
                                              std::memory_order_relaxed);
  MutexLock lock(&gets_mu_);
  return inflight_.DropRequester(node, generation) + inflight_.DropSource(node, generation);
}

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
  v1::RegisterOwnerReply reply;
  reply.set_master_epoch(epoch_);
  reply.set_inflight_get_ttl_ms(static_cast<uint64_t>(options_.inflight_get_ttl.count()));
  reply.set_owner_lease_ms(static_cast<uint64_t>(options_.owner_lease.count()));
  reply.set_hlc(clock_.Now());
  {
    MutexLock lock(&owners_mu_);
    const auto now = Clock::now();
    if (retired_.contains({r.node_id(), r.generation()})) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "owner node %d generation %d expired (not heard for longer than the %d ms lease + %d "
          "ms grace; its routes were dropped); restart the owner to register a new generation",
          r.node_id(), r.generation(), options_.owner_lease.count(), options_.owner_grace.count()));
    }
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
    if (it != owners_.end() && it->second.info.generation() == r.generation() &&
        (it->second.info.address() != r.address() || it->second.info.role() != r.role())) {
      // A heartbeat must come from the owner that registered: same data-plane address, role.
      return absl::PermissionDeniedError(absl::StrFormat(
          "node %d generation %d is registered with address '%s' and role %s; a heartbeat "
          "naming '%s' and role %s is refused",
          r.node_id(), r.generation(), it->second.info.address(), it->second.info.role(),
          r.address(), r.role()));
    }
    OwnerRec& rec = owners_[r.node_id()];
    old_generation = rec.info.generation();
    rec.info.set_node_id(r.node_id());
    rec.info.set_generation(r.generation());
    rec.info.set_role(r.role());
    rec.info.set_capacity_bytes(r.capacity_bytes());
    rec.info.set_address(r.address());
    rec.info.set_peer_address(r.peer_address());
    rec.info.mutable_transports()->CopyFrom(r.transports());
    *rec.info.mutable_capacity() = r.capacity();
    rec.last_heard = now;
    // Routes exist only for registered owners (expiry and unregistration drop them): an owner
    // this table did not know holds no route here.
    reply.set_newly_registered(old_generation != r.generation());
    if (old_generation == r.generation() && rec.republish_due) {
      reply.set_republish(true);
      rec.republish_due = false;
    } else if (old_generation != r.generation()) {
      rec.republish_due = false;  // a new generation republishes everything anyway
    }
  }
  if (old_generation == r.generation()) {  // a heartbeat: the reads peers made of its values
    size_t dropped = 0;
    const size_t moved =
        peer_reads_.Drain(r.node_id(), r.generation(), reply.mutable_peer_reads(), &dropped);
    counters_->peer_read_keys.fetch_add(static_cast<int64_t>(moved), std::memory_order_relaxed);
    counters_->peer_read_keys_dropped.fetch_add(static_cast<int64_t>(dropped),
                                                std::memory_order_relaxed);
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
  if (old_generation != 0) DropGetsOf(r.node_id(), old_generation);
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
  DropGetsOf(r.node_id(), r.generation());
  spdlog::info("owner node {} (generation {}) unregistered; dropped {} routes", r.node_id(),
               r.generation(), reply.dropped_routes());
  return reply;
}

namespace {
void FillLocation(const RouteLocation& l, v1::RouteLocation* o) {
  o->set_node_id(l.node_id);
  o->set_generation(l.generation);
  o->set_put_id(l.put_id);
  o->set_offset(l.offset);
  o->set_len(l.len);
  o->set_version(l.version);
}

void FillRoute(const std::string& key, const Route& r, v1::Route* out) {
  const RouteLocation& p = r.primary();
  out->set_key(key);
  out->set_node_id(p.node_id);
  out->set_generation(p.generation);
  out->set_put_id(p.put_id);
  out->set_offset(p.offset);
  out->set_len(p.len);
  out->set_version(p.version);
  for (const RouteLocation& l : r.locations) FillLocation(l, out->add_locations());
}
}  // namespace

absl::StatusOr<v1::PublishBatchReply> MasterCore::PublishBatch(const v1::PublishBatchRequest& r) {
  if (absl::Status s = CheckGeneration(r.node_id(), r.generation()); !s.ok()) return s;
  // Checked before anything is routed: a refused batch changes nothing.
  for (const v1::RouteItem& item : r.items()) {
    if (item.len() > kMaxRoutedValueBytes) {
      return absl::InvalidArgumentError(
          absl::StrFormat("publish of '%s' names a %d-byte value; a route takes at most %d bytes",
                          item.key(), item.len(), kMaxRoutedValueBytes));
    }
  }
  v1::PublishBatchReply reply;
  reply.set_master_epoch(epoch_);
  counters_->publish_batches.fetch_add(1, std::memory_order_relaxed);
  std::vector<RouteLocation> displaced;
  std::vector<RouteLocation> all_displaced;
  for (const v1::RouteItem& item : r.items()) {
    const RouteLocation loc{
        r.node_id(),   r.generation(), item.put_id() ? item.put_id() : r.put_id(),
        item.offset(), item.len(),     item.version()};
    if (!clock_.Observe(loc.version)) {
      spdlog::warn(
          "node {} published '{}' with version {}, over an hour ahead of this clock; not taken "
          "into the master's clock",
          r.node_id(), item.key(), loc.version);
    }
    displaced.clear();
    switch (routes_.Publish(item.key(), loc, PublishKind{r.republish(), item.copy()}, &displaced)) {
      case RouteTable::PublishOutcome::kSuperseded:
        reply.add_outcomes(v1::SUPERSEDED);
        counters_->superseded_items.fetch_add(1, std::memory_order_relaxed);
        break;
      case RouteTable::PublishOutcome::kPublished:
        reply.add_outcomes(v1::PUBLISHED);
        counters_->published_items.fetch_add(1, std::memory_order_relaxed);
        break;
      case RouteTable::PublishOutcome::kRepublished:
        reply.add_outcomes(v1::PUBLISHED);
        counters_->republished_items.fetch_add(1, std::memory_order_relaxed);
        break;
      case RouteTable::PublishOutcome::kReplaced:
        reply.add_outcomes(v1::PUBLISHED);
        counters_->replaced_routes.fetch_add(1, std::memory_order_relaxed);
        all_displaced.insert(all_displaced.end(), displaced.begin(), displaced.end());
        break;
      case RouteTable::PublishOutcome::kRefused:
        reply.add_outcomes(v1::REFUSED);
        counters_->publish_identity_refused.fetch_add(1, std::memory_order_relaxed);
        spdlog::warn(
            "refused node {}'s publish of '{}' as its own value: put {} (version {}) was put by "
            "node {}, and the item is not a copy",
            r.node_id(), item.key(), loc.put_id, loc.version, PutIdOrigin(loc.put_id));
        break;
    }
  }
  if (!all_displaced.empty()) MarkRepublishDue(all_displaced, r.node_id());
  reply.set_hlc(clock_.Now());
  return reply;
}

void MasterCore::MarkRepublishDue(const std::vector<RouteLocation>& displaced,
                                  uint32_t except_node) {
  MutexLock lock(&owners_mu_);
  for (const RouteLocation& l : displaced) {
    if (l.node_id == except_node) continue;
    auto it = owners_.find(l.node_id);
    if (it != owners_.end() && it->second.info.generation() == l.generation &&
        !it->second.republish_due) {
      it->second.republish_due = true;
      spdlog::info(
          "a republished newer version replaced a route naming node {}'s put {}; it will be "
          "told to republish",
          l.node_id, l.put_id);
    }
  }
}

absl::StatusOr<v1::LookupReply> MasterCore::Lookup(const v1::LookupRequest& r) {
  counters_->lookup_batches.fetch_add(1, std::memory_order_relaxed);
  counters_->lookup_keys.fetch_add(r.keys_size(), std::memory_order_relaxed);
  v1::LookupReply reply;
  reply.set_master_epoch(epoch_);
  reply.set_hlc(clock_.Now());
  const std::map<uint32_t, uint64_t> live =
      r.with_liveness() ? LiveGenerations() : std::map<uint32_t, uint64_t>{};
  for (const std::string& key : r.keys()) {
    std::optional<Route> route = routes_.Lookup(key);
    reply.add_found(route.has_value());
    v1::Route* out = reply.add_routes();
    if (!route) continue;
    FillRoute(key, *route, out);
    if (!r.with_liveness()) continue;
    for (v1::RouteLocation& l : *out->mutable_locations()) {
      auto g = live.find(l.node_id());
      l.set_live(g != live.end() && g->second == l.generation());
    }
  }
  return reply;
}

absl::StatusOr<v1::RemoveRoutesReply> MasterCore::RemoveRoutes(const v1::RemoveRoutesRequest& r) {
  if (absl::Status s = CheckGeneration(r.node_id(), r.generation()); !s.ok()) return s;
  v1::RemoveRoutesReply reply;
  reply.set_master_epoch(epoch_);
  reply.set_hlc(clock_.Now());
  // only_if_copied: another location must be on a live owner's current generation (one that
  // could serve a read now).
  const std::map<uint32_t, Peer> peers =
      r.only_if_copied() ? LivePeers() : std::map<uint32_t, Peer>{};
  const auto serves = [&](const RouteLocation& l) {
    auto p = peers.find(l.node_id);
    return p != peers.end() && p->second.generation == l.generation;
  };
  // Under gets_mu_: a location is either pinned by a get that BatchGetStart handed it to, or
  // removed before any such get starts (never both).
  MutexLock lock(&gets_mu_);
  for (const v1::RouteItem& item : r.items()) {
    if (inflight_.Pinned(item.key(), r.node_id(), r.generation(), item.put_id())) {
      counters_->remove_refused_pinned.fetch_add(1, std::memory_order_relaxed);
      reply.add_removed(false);
      reply.add_pinned(true);
      reply.add_sole(false);
      continue;
    }
    bool removed = false, sole = false;
    if (r.only_if_copied()) {
      const RouteTable::CopyRemoval c = routes_.RemoveLocationIfCopied(
          item.key(), r.node_id(), r.generation(), item.put_id(), serves);
      removed = c == RouteTable::CopyRemoval::kRemoved;
      sole = c == RouteTable::CopyRemoval::kSole;
      if (sole) counters_->remove_refused_sole.fetch_add(1, std::memory_order_relaxed);
    } else {
      removed = routes_.RemoveLocation(item.key(), r.node_id(), r.generation(), item.put_id());
    }
    if (removed) counters_->removed_routes.fetch_add(1, std::memory_order_relaxed);
    reply.add_removed(removed);
    reply.add_pinned(false);
    reply.add_sole(sole);
  }
  return reply;
}

absl::StatusOr<v1::ListOwnersReply> MasterCore::ListOwners(const v1::ListOwnersRequest&) {
  std::map<uint32_t, RouteTable::NodeUsage> per_node = routes_.UsagePerNode();
  v1::ListOwnersReply reply;
  const RouteTable::Totals totals = routes_.totals();
  v1::ClusterUsage* cluster = reply.mutable_cluster();
  cluster->set_routes(totals.routes);
  cluster->set_locations(totals.locations);
  cluster->set_logical_bytes(totals.logical_bytes);
  cluster->set_physical_bytes(totals.physical_bytes);
  {
    MutexLock lock(&owners_mu_);
    const auto now = Clock::now();
    for (const auto& [id, rec] : owners_) {
      v1::OwnerInfo* o = reply.add_owners();
      *o = rec.info;
      const RouteTable::NodeUsage& usage = per_node[id];
      o->set_routes(usage.locations);
      o->set_routed_bytes(usage.bytes);
      o->set_sole_routes(usage.sole_locations);
      o->set_sole_bytes(usage.sole_bytes);
      const auto quiet =
          std::chrono::duration_cast<std::chrono::milliseconds>(now - rec.last_heard);
      o->set_last_heard_ms_ago(static_cast<uint64_t>(quiet.count()));
      o->set_lease_ms_left(static_cast<uint64_t>(
          std::max<int64_t>(0, (options_.owner_lease + options_.owner_grace - quiet).count())));
    }
  }
  MutexLock lock(&gets_mu_);
  for (v1::OwnerInfo& o : *reply.mutable_owners()) {
    o.set_inflight_gets(inflight_.RequestedBy(o.node_id()));
    o.set_source_pins(inflight_.PinsOn(o.node_id()));
  }
  return reply;
}

absl::StatusOr<v1::ListKeysReply> MasterCore::ListKeys(const v1::ListKeysRequest& r) {
  // Bounded by count and by key bytes: one page fits any gRPC client's default 4 MiB limit.
  constexpr size_t kPageKeyBytes = 2 << 20;
  const uint32_t limit = r.limit() == 0 ? 100 : std::min<uint32_t>(r.limit(), 10'000);
  bool more = false;
  v1::ListKeysReply reply;
  size_t key_bytes = 0;
  auto listed = routes_.ListByPrefix(r.prefix(), limit, r.start_after(), &more);
  if (!listed.ok()) return listed.status();
  for (const auto& [key, route] : *listed) {
    if (reply.routes_size() > 0 && key_bytes + key.size() > kPageKeyBytes) {
      more = true;
      break;
    }
    key_bytes += key.size();
    FillRoute(key, route, reply.add_routes());
  }
  reply.set_more(more);
  return reply;
}

absl::StatusOr<v1::PlaceReplicasReply> MasterCore::PlaceReplicas(
    const v1::PlaceReplicasRequest& r) {
  // Bounded like a put batch: one answer stays far below the gRPC message limit.
  constexpr int kMaxGroups = 65'536;
  if (r.group_bytes_size() == 0 || r.group_bytes_size() > kMaxGroups) {
    return absl::InvalidArgumentError(absl::StrFormat("PlaceReplicas needs 1..%d groups, got %d",
                                                      kMaxGroups, r.group_bytes_size()));
  }
  std::vector<uint64_t> group_bytes(r.group_bytes().begin(), r.group_bytes().end());
  for (size_t g = 0; g < group_bytes.size(); ++g) {
    if (group_bytes[g] == 0) {
      return absl::InvalidArgumentError(absl::StrFormat("group %d has 0 bytes", g));
    }
  }
  std::vector<PlacementCandidate> candidates;
  {
    MutexLock lock(&owners_mu_);
    const auto now = Clock::now();
    for (const auto& [id, rec] : owners_) {
      PlacementCandidate c;
      c.node_id = id;
      c.generation = rec.info.generation();
      c.role = rec.info.role();
      c.address = rec.info.address();
      c.peer_address = rec.info.peer_address();
      c.live = now - rec.last_heard < options_.owner_lease;
      c.segment_bytes = rec.info.capacity().segment_bytes();
      c.free_bytes = rec.info.capacity().free_bytes();
      c.committed_bytes = rec.info.capacity().committed_bytes();
      c.evictable_bytes = rec.info.capacity().evictable_bytes();
      candidates.push_back(std::move(c));
    }
  }
  ReplicaPlacementOptions placement = options_.placement;
  if (r.remote_only()) placement.restrict_to_remote_only_node_roles = true;
  const std::vector<GroupPlacement> placed =
      PlaceGroups(placement, r.source_node_id(), group_bytes, candidates);
  v1::PlaceReplicasReply reply;
  for (const GroupPlacement& p : placed) {
    v1::PlacedGroup* g = reply.add_groups();
    g->set_placed(p.placed);
    if (!p.placed) {
      g->set_reason(p.reason);
      continue;
    }
    const PlacementCandidate& c = candidates[p.candidate];
    g->set_node_id(c.node_id);
    g->set_generation(c.generation);
    g->set_role(c.role);
    g->set_address(c.address);
    g->set_peer_address(c.peer_address);
  }
  return reply;
}

std::map<uint32_t, uint64_t> MasterCore::LiveGenerations() const {
  std::map<uint32_t, uint64_t> out;
  MutexLock lock(&owners_mu_);
  const auto now = Clock::now();
  for (const auto& [id, rec] : owners_) {
    if (now - rec.last_heard < options_.owner_lease) out[id] = rec.info.generation();
  }
  return out;
}

std::map<uint32_t, MasterCore::Peer> MasterCore::LivePeers() const {
  std::map<uint32_t, Peer> out;
  MutexLock lock(&owners_mu_);
  const auto now = Clock::now();
  for (const auto& [id, rec] : owners_) {
    if (rec.info.address().empty() || now - rec.last_heard >= options_.owner_lease) continue;
    Peer& p = out[id];
    p.generation = rec.info.generation();
    p.address = rec.info.address();
    p.transports.assign(rec.info.transports().begin(), rec.info.transports().end());
  }
  return out;
}

absl::StatusOr<v1::BatchGetStartReply> MasterCore::BatchGetStart(
    const v1::BatchGetStartRequest& r) {
  FLUXON_RETURN_IF_ERROR(CheckGeneration(r.requester_node_id(), r.requester_generation()));
  if (r.request_id() == 0) return absl::InvalidArgumentError("BatchGetStart needs a request_id");
  if (r.items_size() == 0 || r.items_size() > static_cast<int>(kMaxBatchKeys)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "BatchGetStart carries %d items; it must carry 1 to %d", r.items_size(), kMaxBatchKeys));
  }
  counters_->get_start_calls.fetch_add(1, std::memory_order_relaxed);
  counters_->get_start_items.fetch_add(r.items_size(), std::memory_order_relaxed);
  const std::map<uint32_t, Peer> peers = LivePeers();
  const auto now = Clock::now();
  MutexLock lock(&gets_mu_);
  if (const v1::BatchGetStartReply* seen =
          inflight_.FindReply(r.requester_node_id(), r.request_id())) {
    counters_->get_start_replayed.fetch_add(1, std::memory_order_relaxed);
    return *seen;  // T1: the same request again changes nothing
  }
  v1::BatchGetStartReply reply;
  reply.set_master_epoch(epoch_);
  reply.set_hlc(clock_.Now());
  reply.set_inflight_get_ttl_ms(static_cast<uint64_t>(options_.inflight_get_ttl.count()));
  absl::flat_hash_set<uint32_t> listed_peers;  // source_peers_apart: nodes in source_peers
  for (const v1::GetStartItem& item : r.items()) {
    v1::GetStartResult* out = reply.add_results();
    if (item.key().empty() || item.key().size() > kMaxKeyBytes || item.len() == 0) {
      out->set_outcome(v1::GET_INVALID);
      continue;
    }
    const std::optional<Route> route = routes_.Lookup(item.key());
    if (!route) {
      out->set_outcome(v1::GET_NO_ROUTE);
      continue;
    }
    if (route->put_id() != item.put_id() || route->version() != item.version()) {
      out->set_outcome(v1::GET_STALE_VERSION);  // T2: only another identity is stale
      continue;
    }
    const RouteLocation* source = nullptr;
    bool local = false;
    for (const RouteLocation& l : route->locations) {
      if (l.node_id == r.requester_node_id()) {
        local = l.generation == r.requester_generation();
        continue;
      }
      if (item.source_generation() != 0 &&
          (l.node_id != item.source_node_id() || l.generation != item.source_generation())) {
        continue;  // only the named location may be the source
      }
      auto peer = peers.find(l.node_id);
      if (source == nullptr && peer != peers.end() && peer->second.generation == l.generation &&
          l.len == item.len()) {
        source = &l;
      }
    }
    if (local) {
      out->set_outcome(v1::GET_ALREADY_LOCAL);
      continue;
    }
    if (source == nullptr) {
      out->set_outcome(v1::GET_NO_SOURCE);
      continue;
    }
    if (inflight_.Busy(item.key(), r.requester_node_id())) {
      out->set_outcome(v1::GET_BUSY);  // G7: one prepared target per (key, requester)
      continue;
    }
    out->set_outcome(v1::GET_STARTED);
    out->set_get_id(inflight_.Start(item.key(), r.requester_node_id(), r.requester_generation(),
                                    r.request_id(), *source, item.target_offset(), item.len(), now,
                                    r.replica()));
    FillLocation(*source, out->mutable_source());
    const Peer& peer = peers.at(source->node_id);
    if (!r.source_peers_apart()) {
      out->set_source_address(peer.address);
      for (const std::string& t : peer.transports) out->add_source_transports(t);
    } else if (listed_peers.insert(source->node_id).second) {
      v1::SourcePeer* sp = reply.add_source_peers();
      sp->set_node_id(source->node_id);
      sp->set_address(peer.address);
      for (const std::string& t : peer.transports) sp->add_transports(t);
    }
    counters_->gets_started.fetch_add(1, std::memory_order_relaxed);
  }
  inflight_.StoreReply(r.requester_node_id(), r.request_id(), reply, now);
  return reply;
}

absl::StatusOr<v1::BatchGetDoneReply> MasterCore::BatchGetDone(const v1::BatchGetDoneRequest& r) {
  FLUXON_RETURN_IF_ERROR(CheckGeneration(r.requester_node_id(), r.requester_generation()));
  counters_->get_done_calls.fetch_add(1, std::memory_order_relaxed);
  // Replica copies are counted by the requester's role (the design's replica target counts).
  bool requester_remote_cache = false;
  {
    MutexLock lock(&owners_mu_);
    auto it = owners_.find(r.requester_node_id());
    requester_remote_cache = it != owners_.end() && it->second.info.role() == "remote_cache";
  }
  v1::BatchGetDoneReply reply;
  reply.set_master_epoch(epoch_);
  // Per source (node, generation): the client reads this batch made of its values, in order.
  std::map<std::pair<uint32_t, uint64_t>, v1::PeerRead> reads;
  MutexLock lock(&gets_mu_);
  for (const v1::GetDoneItem& item : r.items()) {
    const InflightGets::Get* get = inflight_.Find(item.get_id());
    const std::optional<Route> route = routes_.Lookup(item.key());
    // The copy carries the identity of the version the get pinned (a retried Done whose get
    // already ended: the routed one, checked against the requester's location below).
    const uint64_t version =
        get != nullptr ? get->source.version : (route ? route->version() : uint64_t{0});
    const RouteLocation target{r.requester_node_id(),
                               r.requester_generation(),
                               item.put_id(),
                               item.target_offset(),
                               item.len(),
                               version};
    // A get_id naming another key, requester or target is not this request's: left alone.
    const bool ours = get != nullptr && get->key == item.key() &&
                      get->requester_node == target.node_id &&
                      get->target_offset == item.target_offset() && get->len == item.len() &&
                      get->source.put_id == item.put_id();
    // The requester's location of this version, if the route has one already.
    const RouteLocation* mine = nullptr;
    if (route && route->put_id() == item.put_id()) {
      for (const RouteLocation& l : route->locations) {
        if (l.node_id == target.node_id && l.generation == target.generation) mine = &l;
      }
    }
    // The pinned source must still be a location of this version: a get whose source went
    // away (its owner expired or restarted) was ended with it, and this is the second check.
    bool source_live = false;
    if (ours && route && route->primary().SameValue(get->source)) {
      for (const RouteLocation& l : route->locations) source_live |= l.SameIdentity(get->source);
    }
    v1::RemoteGetDoneOutcome outcome;
    bool added = false;
    if (mine != nullptr) {
      // T2: the same version is converging, not stale. Ours (a retried Done) or another one.
      outcome = mine->SameIdentity(target) ? v1::GET_DONE : v1::GET_DONE_PRESENT;
      if (outcome == v1::GET_DONE) {
        counters_->get_done_replayed.fetch_add(1, std::memory_order_relaxed);
      }
    } else if (!ours) {
      outcome = v1::GET_DONE_UNKNOWN;  // expired, revoked, or not this requester's get
    } else if (!route || route->put_id() != item.put_id() || !source_live) {
      outcome = v1::GET_DONE_STALE;
    } else {
      added = routes_.AddCopy(item.key(), target);
      outcome = added ? v1::GET_DONE : v1::GET_DONE_STALE;
    }
    const bool replica = ours && get->replica;
    if (added && !replica) {
      // A client's read of the source's value: the source's eviction policy hears of it.
      v1::PeerRead& read = reads[{get->source.node_id, get->source.generation}];
      read.add_keys(item.key());
      read.add_put_ids(item.put_id());
    }
    if (ours) inflight_.Take(item.get_id());  // ends the get, releasing the source pin
    if (added) counters_->gets_done.fetch_add(1, std::memory_order_relaxed);
    if (added && replica) {
      (requester_remote_cache ? counters_->replica_copies_remote_cache
                              : counters_->replica_copies_other_roles)
          .fetch_add(1, std::memory_order_relaxed);
    }
    reply.add_outcomes(outcome);
  }
  for (auto& [source, read] : reads) {
    const size_t dropped = peer_reads_.Record(source.first, source.second, std::move(read));
    counters_->peer_read_keys_dropped.fetch_add(static_cast<int64_t>(dropped),
                                                std::memory_order_relaxed);
  }
  return reply;
}

absl::StatusOr<v1::BatchGetRevokeReply> MasterCore::BatchGetRevoke(
    const v1::BatchGetRevokeRequest& r) {
  FLUXON_RETURN_IF_ERROR(CheckGeneration(r.requester_node_id(), r.requester_generation()));
  counters_->get_revoke_calls.fetch_add(1, std::memory_order_relaxed);
  v1::BatchGetRevokeReply reply;
  MutexLock lock(&gets_mu_);
  for (uint64_t id : r.get_ids()) {
    const InflightGets::Get* get = inflight_.Find(id);
    if (get != nullptr && get->requester_node != r.requester_node_id()) {
      reply.add_revoked(false);  // not the caller's get: left alone
      continue;
    }
    if (get != nullptr) {
      inflight_.Take(id);
      counters_->gets_revoked.fetch_add(1, std::memory_order_relaxed);
    }
    reply.add_revoked(true);  // idempotent: nothing is in flight for it now
  }
  return reply;
}

size_t MasterCore::stored_get_replies() const {
  MutexLock lock(&gets_mu_);
  return inflight_.stored_replies();
}

size_t MasterCore::inflight_gets() const {
  MutexLock lock(&gets_mu_);
  return inflight_.size();
}

void MasterCore::ExpireDue(Clock::time_point now) {
  size_t expired_gets = 0;
  {
    MutexLock lock(&gets_mu_);
    expired_gets = inflight_.ExpireDue(now);
  }
  if (expired_gets > 0) {
    counters_->gets_expired.fetch_add(static_cast<int64_t>(expired_gets),
                                      std::memory_order_relaxed);
    spdlog::info("{} remote gets passed their {} ms in-flight TTL; their source pins are released",
                 expired_gets, options_.inflight_get_ttl.count());
  }
  std::vector<std::pair<uint32_t, uint64_t>> expired;
  {
    MutexLock lock(&owners_mu_);
    for (auto it = owners_.begin(); it != owners_.end();) {
      if (now - it->second.last_heard < options_.owner_lease + options_.owner_grace) {
        ++it;
        continue;
      }
      const std::pair<uint32_t, uint64_t> id{it->first, it->second.info.generation()};
      expired.push_back(id);
      retired_.insert(id);
      retired_order_.push_back(id);
      while (retired_order_.size() > 4096) {
        retired_.erase(retired_order_.front());
        retired_order_.pop_front();
      }
      it = owners_.erase(it);
    }
  }
  for (const auto& [node, generation] : expired) {
    const uint64_t dropped = routes_.DropNode(node, generation);
    const size_t gets = DropGetsOf(node, generation);
    counters_->owners_expired.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn(
        "owner node {} generation {} expired (not heard for {} ms lease + {} ms grace): dropped "
        "{} routes and {} in-flight gets; that generation is refused from now on",
        node, generation, options_.owner_lease.count(), options_.owner_grace.count(), dropped,
        gets);
  }
}

void MasterCore::StartMaintenance(std::chrono::milliseconds interval) {
  if (maintenance_.joinable()) return;
  maintenance_ = std::thread([this, interval] {
    while (stop_.SleepFor(interval)) ExpireDue(Clock::now());
  });
}

MasterCore::~MasterCore() {
  stop_.Stop();
  if (maintenance_.joinable()) maintenance_.join();
}

}  // namespace fluxon
