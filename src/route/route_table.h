// RouteTable: the master's global key -> route table. A route names one version of a key (one
// put_id) and every place that version lives: the primary (the owner that published it) and
// copies at other owners (remote-get targets, replicas), each with node, generation, put_id,
// offset and len.
//
// Invariants:
// - A route's locations all carry its put_id; a copy of another version is refused (T2: only a
//   different put_id is stale), and the same location added twice is one location.
// - Publishing a key that has a route of another version (put_id) leaves it unchanged
//   (Superseded); the same identity again is an idempotent retry (Republished, T1); the same
//   version from another (node, generation) joins the route as a copy (a republished copy).
// - Removing a location removes exactly (node, generation, put_id); the route goes with its last
//   location, and the first copy becomes primary when the primary goes.
// - Sharded by key (256 shards, G10): one shard lock per key, O(locations) work under it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "common/sharded_table.h"

namespace fluxon {

struct RouteLocation {
  uint32_t node_id = 0;
  uint64_t generation = 0;
  uint64_t put_id = 0;
  uint64_t offset = 0;
  uint64_t len = 0;

  bool SameIdentity(const RouteLocation& o) const {
    return node_id == o.node_id && generation == o.generation && put_id == o.put_id &&
           offset == o.offset;
  }
};

struct Route {
  // [0] is the primary; never empty in the table. Inline: most keys have one location, and a
  // publish must not allocate per key beyond the table entry itself.
  absl::InlinedVector<RouteLocation, 1> locations;
  const RouteLocation& primary() const { return locations.front(); }
  uint64_t put_id() const { return locations.front().put_id; }
};

class RouteTable {
 public:
  enum class PublishOutcome { kPublished, kRepublished, kSuperseded };

  PublishOutcome Publish(const std::string& key, const RouteLocation& primary);
  // Adds a copy of the routed version at another place; false when the key has no route or a
  // route of another put_id.
  bool AddCopy(const std::string& key, const RouteLocation& copy);
  std::optional<Route> Lookup(const std::string& key) const;
  // Removes the location (node, generation, put_id) of `key`; true when one was removed.
  bool RemoveLocation(const std::string& key, uint32_t node_id, uint64_t generation,
                      uint64_t put_id);
  // Removes every location of (node, generation) (its memory is gone); returns how many.
  uint64_t DropNode(uint32_t node_id, uint64_t generation);
  // Locations per node.
  std::map<uint32_t, uint64_t> LocationsPerNode() const;
  // Routes whose key starts with `prefix` and sorts after `start_after` (all when empty), sorted
  // by key, at most `limit`; `*more` (when given) says whether more such routes exist. Holds at
  // most limit + 1 routes while it scans.
  std::vector<std::pair<std::string, Route>> ListByPrefix(const std::string& prefix, size_t limit,
                                                          const std::string& start_after = "",
                                                          bool* more = nullptr) const;
  size_t size() const { return routes_.size(); }

 private:
  ShardedTable<std::string, Route> routes_;
};

}  // namespace fluxon
