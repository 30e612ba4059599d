#include "route/route_table.h"

#include <algorithm>

#include "absl/strings/match.h"

namespace fluxon {

RouteTable::PublishOutcome RouteTable::Publish(const std::string& key, const RouteLocation& loc,
                                               PublishKind kind,
                                               std::vector<RouteLocation>* displaced) {
  return routes_.Upsert(
      key, [&] { return Route{{loc}}; },
      [&](Route& cur, bool inserted) {
        const int64_t len = static_cast<int64_t>(loc.len);
        if (inserted) {
          Count(1, 1, len, len);
          return PublishOutcome::kPublished;
        }
        for (const RouteLocation& l : cur.locations) {
          if (l.SameIdentity(loc)) return PublishOutcome::kRepublished;
        }
        if (!cur.primary().SameValue(loc)) {
          // Another value holds the key. A fresh put never replaces it; a republish does when
          // its version is higher (ties: the route stays).
          if (!kind.republish || loc.version <= cur.version()) return PublishOutcome::kSuperseded;
          if (displaced != nullptr) displaced->assign(cur.locations.begin(), cur.locations.end());
          int64_t old_physical = 0;
          for (const RouteLocation& l : cur.locations) old_physical += static_cast<int64_t>(l.len);
          Count(0, 1 - static_cast<int64_t>(cur.locations.size()),
                len - static_cast<int64_t>(cur.primary().len), len - old_physical);
          cur.locations.clear();
          cur.locations.push_back(loc);
          return PublishOutcome::kReplaced;
        }
        // The same value from another place: a copy, or its origin republishing its own put.
        for (const RouteLocation& l : cur.locations) {
          if (l.node_id == loc.node_id && l.generation == loc.generation) {
            return PublishOutcome::kSuperseded;  // one location per (node, generation)
          }
        }
        if (!kind.copy && PutIdOrigin(loc.put_id) != loc.node_id) return PublishOutcome::kRefused;
        cur.locations.push_back(loc);
        Count(0, 1, 0, len);
        return PublishOutcome::kPublished;
      });
}

bool RouteTable::AddCopy(const std::string& key, const RouteLocation& copy) {
  return routes_.Update(key, [&](Route* r, bool*) {
    if (r == nullptr || !r->primary().SameValue(copy)) return false;
    for (const RouteLocation& l : r->locations) {
      if (l.node_id == copy.node_id && l.generation == copy.generation) return l.SameIdentity(copy);
    }
    r->locations.push_back(copy);
    Count(0, 1, 0, static_cast<int64_t>(copy.len));
    return true;
  });
}

std::optional<Route> RouteTable::Lookup(const std::string& key) const { return routes_.Get(key); }

bool RouteTable::RemoveLocation(const std::string& key, uint32_t node_id, uint64_t generation,
                                uint64_t put_id) {
  return routes_.Update(key, [&](Route* r, bool* erase) {
    if (r == nullptr) return false;
    auto it = std::find_if(r->locations.begin(), r->locations.end(), [&](const RouteLocation& l) {
      return l.node_id == node_id && l.generation == generation && l.put_id == put_id;
    });
    if (it == r->locations.end()) return false;
    const int64_t len = static_cast<int64_t>(it->len);
    r->locations.erase(it);  // a copy moves up to primary when the primary goes
    if (r->locations.empty()) *erase = true;
    Count(r->locations.empty() ? -1 : 0, -1, r->locations.empty() ? -len : 0, -len);
    return true;
  });
}

RouteTable::CopyRemoval RouteTable::RemoveLocationIfCopied(
    const std::string& key, uint32_t node_id, uint64_t generation, uint64_t put_id,
    const std::function<bool(const RouteLocation&)>& serves) {
  return routes_.Update(key, [&](Route* r, bool* erase) {
    if (r == nullptr) return CopyRemoval::kAbsent;
    auto it = r->locations.end();
    bool other = false;
    for (auto l = r->locations.begin(); l != r->locations.end(); ++l) {
      if (l->node_id == node_id && l->generation == generation && l->put_id == put_id) {
        it = l;
      } else if (l->node_id != node_id && serves(*l)) {
        other = true;  // every location of a route carries its identity
      }
    }
    if (it == r->locations.end()) return CopyRemoval::kAbsent;
    if (!other) return CopyRemoval::kSole;
    const int64_t len = static_cast<int64_t>(it->len);
    r->locations.erase(it);  // another location stays: the route does
    Count(0, -1, 0, -len);
    return CopyRemoval::kRemoved;
  });
}

uint64_t RouteTable::DropNode(uint32_t node_id, uint64_t generation) {
  std::vector<std::pair<std::string, uint64_t>> found;  // (key, put_id)
  routes_.ForEach([&](const std::string& key, const Route& r) {
    for (const RouteLocation& l : r.locations) {
      if (l.node_id == node_id && l.generation == generation) found.emplace_back(key, l.put_id);
    }
  });
  uint64_t dropped = 0;
  for (const auto& [key, put_id] : found)
    dropped += RemoveLocation(key, node_id, generation, put_id);
  return dropped;
}

std::map<uint32_t, uint64_t> RouteTable::LocationsPerNode() const {
  std::map<uint32_t, uint64_t> out;
  routes_.ForEach([&](const std::string&, const Route& r) {
    for (const RouteLocation& l : r.locations) ++out[l.node_id];
  });
  return out;
}

void RouteTable::Count(int64_t routes, int64_t locations, int64_t logical, int64_t physical) {
  routes_n_.fetch_add(routes, std::memory_order_relaxed);
  locations_n_.fetch_add(locations, std::memory_order_relaxed);
  logical_bytes_.fetch_add(logical, std::memory_order_relaxed);
  physical_bytes_.fetch_add(physical, std::memory_order_relaxed);
}

RouteTable::Totals RouteTable::totals() const {
  const auto read = [](const std::atomic<int64_t>& v) {
    return static_cast<uint64_t>(std::max<int64_t>(0, v.load(std::memory_order_relaxed)));
  };
  return Totals{read(routes_n_), read(locations_n_), read(logical_bytes_), read(physical_bytes_)};
}

std::map<uint32_t, RouteTable::NodeUsage> RouteTable::UsagePerNode() const {
  std::map<uint32_t, NodeUsage> out;
  routes_.ForEach([&](const std::string&, const Route& r) {
    const bool sole = r.locations.size() == 1;
    for (const RouteLocation& l : r.locations) {
      NodeUsage& u = out[l.node_id];
      ++u.locations;
      u.bytes += l.len;
      if (sole) {
        ++u.sole_locations;
        u.sole_bytes += l.len;
      }
    }
  });
  return out;
}

std::vector<std::pair<std::string, Route>> RouteTable::ListByPrefix(const std::string& prefix,
                                                                    size_t limit,
                                                                    const std::string& start_after,
                                                                    bool* more) const {
  // The limit + 1 smallest matching keys: one more than asked shows whether more exist.
  std::map<std::string, Route> smallest;
  routes_.ForEach([&](const std::string& key, const Route& r) {
    if (!absl::StartsWith(key, prefix) || (!start_after.empty() && key <= start_after)) return;
    if (smallest.size() > limit && key >= smallest.rbegin()->first) return;
    smallest.emplace(key, r);
    if (smallest.size() > limit + 1) smallest.erase(std::prev(smallest.end()));
  });
  if (more != nullptr) *more = smallest.size() > limit;
  std::vector<std::pair<std::string, Route>> out;
  for (auto& [key, r] : smallest) {
    if (out.size() >= limit) break;
    out.emplace_back(key, std::move(r));
  }
  return out;
}

}  // namespace fluxon
