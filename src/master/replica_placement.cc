#include "master/replica_placement.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace fluxon {
namespace {

bool IsRemoteOnly(const ReplicaPlacementOptions& options, const std::string& role) {
  return std::find(options.remote_only_node_roles.begin(), options.remote_only_node_roles.end(),
                   role) != options.remote_only_node_roles.end();
}

// Bytes a candidate may still take: its free bytes, and its ratio budget less what it holds.
// A remote-only owner is a cache tier: it drops its coldest copies to take new ones, so its
// evictable bytes are room and only what it cannot evict counts as held. Any other owner's
// committed values are its own working set: a replica never pushes them out.
uint64_t Room(const ReplicaPlacementOptions& options, const PlacementCandidate& c, uint64_t given) {
  const uint64_t budget =
      static_cast<uint64_t>(static_cast<long double>(c.segment_bytes) * options.capacity_ratio);
  const uint64_t evictable =
      IsRemoteOnly(options, c.role) ? std::min(c.evictable_bytes, c.committed_bytes) : 0;
  const uint64_t held = c.committed_bytes - evictable + given;
  const uint64_t available = c.free_bytes + evictable;
  const uint64_t by_ratio = budget > held ? budget - held : 0;
  const uint64_t by_free = available > given ? available - given : 0;
  return std::min(by_ratio, by_free);
}

}  // namespace

std::vector<GroupPlacement> PlaceGroups(const ReplicaPlacementOptions& options,
                                        uint32_t source_node,
                                        const std::vector<uint64_t>& group_bytes,
                                        const std::vector<PlacementCandidate>& candidates) {
  // Eligible candidates in preference tiers: remote-only roles first; others only unrestricted.
  std::vector<size_t> preferred, others;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const PlacementCandidate& c = candidates[i];
    if (c.node_id == source_node || !c.live || c.address.empty() || c.peer_address.empty()) {
      continue;
    }
    if (IsRemoteOnly(options, c.role)) {
      preferred.push_back(i);
    } else if (!options.restrict_to_remote_only_node_roles) {
      others.push_back(i);
    }
  }
  std::vector<uint64_t> given(candidates.size(), 0);
  std::vector<GroupPlacement> out(group_bytes.size());
  const std::string roles = absl::StrJoin(options.remote_only_node_roles, ", ");
  for (size_t g = 0; g < group_bytes.size(); ++g) {
    const uint64_t bytes = group_bytes[g];
    for (const std::vector<size_t>* tier : {&preferred, &others}) {
      size_t best = candidates.size();
      uint64_t best_room = 0;
      for (size_t i : *tier) {
        const uint64_t room = Room(options, candidates[i], given[i]);
        if (room < bytes) continue;
        if (best == candidates.size() || room > best_room ||
            (room == best_room && candidates[i].node_id < candidates[best].node_id)) {
          best = i;
          best_room = room;
        }
      }
      if (best != candidates.size()) {
        given[best] += bytes;
        out[g].placed = true;
        out[g].candidate = best;
        break;
      }
    }
    if (out[g].placed) continue;
    if (preferred.empty() && others.empty()) {
      out[g].reason = options.restrict_to_remote_only_node_roles
                          ? absl::StrFormat(
                                "NoSpace: no live owner of a remote-only role (%s) besides the "
                                "source serves a data plane",
                                roles)
                          : "NoSpace: no live owner besides the source serves a data plane";
    } else {
      out[g].reason = absl::StrFormat(
          "NoSpace: no %s has room for a group of %d bytes (free bytes, and %.2f of its segment "
          "less what it holds)",
          options.restrict_to_remote_only_node_roles ? "remote-only owner (" + roles + ")"
                                                     : "candidate owner",
          bytes, options.capacity_ratio);
    }
  }
  return out;
}

}  // namespace fluxon
