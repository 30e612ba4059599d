// ReplicaPlacement: where the master places replicas of a source owner's atomic groups (the
// design's replica_task_placement). A pure function of the owners' last reported capacity, so it
// is tested without processes.
//
// Rules (each has a test in tests/unit/replica_placement_test.cc):
// - Never the source owner, never an owner that is not live, serves no data plane or no peer
//   service (it could not be asked to pull).
// - A group is placed whole on one target or not at all (atomic groups are never split).
// - A target takes a group only while its committed bytes plus what this call already gave it
//   plus the group stay within capacity_ratio of its segment (master.replica_cache_capacity_ratio:
//   the rest is headroom for the target's own puts and eviction) and within its free bytes.
//   A remote-only owner (a cache tier) counts its evictable bytes as room, not as held: once
//   full it keeps taking replicas and evicts its coldest copies. Any other owner's committed
//   values are its own and are never counted as room.
// - restrict_to_remote_only_node_roles: only owners whose role is in remote_only_node_roles are
//   candidates; when none is, every group is NoSpace (no fallback to a GPU owner). Unrestricted,
//   a remote-only role with room is preferred, then any other owner.
// - Among eligible targets the one with the most room left takes the group (ties: lower
//   node_id), so successive groups spread over targets by free capacity.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fluxon {

// The master's defaults are the config's (master.replica_task_placement, built by
// MasterOptions::FromConfig); these are neutral: no preferred role, no restriction, no headroom.
struct ReplicaPlacementOptions {
  std::vector<std::string> remote_only_node_roles;
  bool restrict_to_remote_only_node_roles = false;
  double capacity_ratio = 1.0;
};

struct PlacementCandidate {
  uint32_t node_id = 0;
  uint64_t generation = 0;
  std::string role;
  std::string address;       // data-plane endpoint; empty: serves no peers (never a target)
  std::string peer_address;  // peer service (PullReplicas); empty: takes no replicas
  bool live = false;
  uint64_t segment_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t committed_bytes = 0;
  uint64_t evictable_bytes = 0;  // of committed_bytes, what its evictor may drop
};

struct GroupPlacement {
  bool placed = false;
  size_t candidate = 0;  // index into the candidates, when placed
  std::string reason;    // NoSpace: why not, when not placed
};

std::vector<GroupPlacement> PlaceGroups(const ReplicaPlacementOptions& options,
                                        uint32_t source_node,
                                        const std::vector<uint64_t>& group_bytes,
                                        const std::vector<PlacementCandidate>& candidates);

}  // namespace fluxon
