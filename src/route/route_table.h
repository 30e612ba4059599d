// RouteTable: the master's global key -> route table. A route names one value of a key — one
// identity (put_id, version) — and every place that value lives: the primary (the owner that
// published it first) and copies at other owners (remote-get targets, replicas), each with node,
// generation, identity, offset and len.
//
// Invariants:
// - A route's locations all carry its identity; a copy of another identity is refused (T2: a
//   different put_id or version is stale), and the same location added twice is one location.
// - A fresh publish of a key routed to another identity leaves the route unchanged (Superseded:
//   the first writer wins while the route lives); the same location again is an idempotent
//   retry (Republished, T1).
// - A republish (after a master restart or a new generation) of a key routed to another
//   identity is ordered by version: a higher version replaces the route (Replaced, the displaced
//   locations are returned so their owners can drop theirs), a lower or equal one is Superseded.
//   So after a master restart the newest value wins whichever owner republishes first.
// - The same identity from another (node, generation) joins the route only as a copy (the item
//   says so) or from the identity's origin node (put_id's high bits, republishing its own put);
//   any other owner publishing it as its own is Refused: equal numbers are not trusted to be
//   equal bytes.
// - Removing a location removes exactly (node, generation, put_id); the route goes with its last
//   location, and the first copy becomes primary when the primary goes.
// - Sharded by key (256 shards, G10): one shard lock per key, O(locations) work under it.
// - Keyed by the key's 128-bit keyed fingerprint (route/route_key.h), never by its bytes: what a
//   route costs does not grow with its key. RouteKeys::kFull keeps the bytes beside it (and
//   compares them, so a fingerprint that matched another key is a miss, never its route);
//   kFingerprint keeps none, and listing keys is refused.
// - A location's len is below 4 GiB (a value lives in one grant): a larger one is refused.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "common/put_id.h"

namespace fluxon {

struct RouteLocation {
  uint32_t node_id = 0;
  uint64_t generation = 0;
  uint64_t put_id = 0;
  uint64_t offset = 0;
  uint64_t len = 0;
  uint64_t version = 0;  // with put_id, the value's identity

  // The same value: put_id and version.
  bool SameValue(const RouteLocation& o) const {
    return put_id == o.put_id && version == o.version;
  }
  // The same value at the same place.
  bool SameIdentity(const RouteLocation& o) const {
    return node_id == o.node_id && generation == o.generation && SameValue(o) && offset == o.offset;
  }
};

struct Route {
  // [0] is the primary; never empty in the table. Inline: most keys have one location, and a
  // publish must not allocate per key beyond the table entry itself.
  absl::InlinedVector<RouteLocation, 1> locations;
  const RouteLocation& primary() const { return locations.front(); }
  uint64_t put_id() const { return locations.front().put_id; }
  uint64_t version() const { return locations.front().version; }
};

// What a publish is: a fresh put, or a republish of a committed value; the value's own put or a
// copy of it.
struct PublishKind {
  bool republish = false;
  bool copy = false;
};

// What the master keeps of a route's key (master.route_keys).
enum class RouteKeys {
  kFull,         // its bytes beside its fingerprint: keys can be listed (fluxonctl keys)
  kFingerprint,  // its fingerprint only: ~110 B per route less at SGLang's key sizes
};

// The largest location len a route takes (a value lives in one grant, far below it).
inline constexpr uint64_t kMaxRoutedValueBytes = (uint64_t{1} << 32) - 1;

class RouteTable {
 public:
  explicit RouteTable(RouteKeys keys = RouteKeys::kFull);
  ~RouteTable();
  RouteTable(const RouteTable&) = delete;
  RouteTable& operator=(const RouteTable&) = delete;

  RouteKeys keys() const { return keys_; }

  enum class PublishOutcome { kPublished, kRepublished, kSuperseded, kReplaced, kRefused };

  // Publishes `loc` for `key` by the rules above (kRefused also for a len over
  // kMaxRoutedValueBytes). On kReplaced, `displaced` (when given)
  // receives the locations the route named before.
  PublishOutcome Publish(const std::string& key, const RouteLocation& loc, PublishKind kind = {},
                         std::vector<RouteLocation>* displaced = nullptr);
  // Adds a copy of the routed value at another place; false when the key has no route or a
  // route of another identity.
  bool AddCopy(const std::string& key, const RouteLocation& copy);
  std::optional<Route> Lookup(const std::string& key) const;
  // Removes the location (node, generation, put_id) of `key`; true when one was removed.
  bool RemoveLocation(const std::string& key, uint32_t node_id, uint64_t generation,
                      uint64_t put_id);
  enum class CopyRemoval { kRemoved, kAbsent, kSole };
  // Removes the location (node, generation, put_id) of `key` only while another location of the
  // route that `serves(location)` accepts stays (recoverable-first eviction: the value never
  // leaves the cluster). Checked and removed under the key's shard lock, so of two owners
  // removing the last two copies this way one is refused (kSole). kAbsent: no such location.
  CopyRemoval RemoveLocationIfCopied(const std::string& key, uint32_t node_id, uint64_t generation,
                                     uint64_t put_id,
                                     const std::function<bool(const RouteLocation&)>& serves);
  // Removes every location of (node, generation) (its memory is gone); returns how many.
  uint64_t DropNode(uint32_t node_id, uint64_t generation);
  // Locations per node.
  std::map<uint32_t, uint64_t> LocationsPerNode() const;
  // What the routes hold, counted once (logical: each value once; physical: every location).
  // Kept up to date by every change (O(1) to read).
  struct Totals {
    uint64_t routes = 0;
    uint64_t locations = 0;
    uint64_t logical_bytes = 0;
    uint64_t physical_bytes = 0;
  };
  Totals totals() const;
  // Per node, by one scan: its locations and their value bytes, and of those the values no
  // other location holds.
  struct NodeUsage {
    uint64_t locations = 0;
    uint64_t bytes = 0;
    uint64_t sole_locations = 0;
    uint64_t sole_bytes = 0;
  };
  std::map<uint32_t, NodeUsage> UsagePerNode() const;
  // Routes whose key starts with `prefix` and sorts after `start_after` (all when empty), sorted
  // by key, at most `limit`; `*more` (when given) says whether more such routes exist. Holds at
  // most limit + 1 routes while it scans. FailedPrecondition with RouteKeys::kFingerprint (no
  // key bytes are kept).
  absl::StatusOr<std::vector<std::pair<std::string, Route>>> ListByPrefix(
      const std::string& prefix, size_t limit, const std::string& start_after = "",
      bool* more = nullptr) const;
  size_t size() const;

  // The storage, one per RouteKeys (route_table.cc): the policy is a type parameter there.
  class Store;

 private:
  const RouteKeys keys_;
  const std::unique_ptr<Store> store_;
};

}  // namespace fluxon
