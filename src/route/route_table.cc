#include "route/route_table.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string_view>

#include "absl/status/status.h"
#include "common/sharded_table.h"
#include "route/route_key.h"
#include "spdlog/spdlog.h"

namespace fluxon {
namespace route_internal {

// A location as the table stores it: 40 B (RouteLocation's len narrowed to 32 bits, the rest
// reordered so nothing pads).
struct StoredLocation {
  uint32_t node_id = 0;
  uint32_t len = 0;
  uint64_t generation = 0;
  uint64_t put_id = 0;
  uint64_t offset = 0;
  uint64_t version = 0;

  static StoredLocation Of(const RouteLocation& l) {
    return StoredLocation{l.node_id, static_cast<uint32_t>(l.len), l.generation, l.put_id, l.offset,
                          l.version};
  }
  RouteLocation Loaded() const {
    return RouteLocation{node_id, generation, put_id, offset, len, version};
  }
  // Identity checks are RouteLocation's (one definition of "the same value").
  bool SameValue(const RouteLocation& o) const { return Loaded().SameValue(o); }
  bool SameIdentity(const RouteLocation& o) const { return Loaded().SameIdentity(o); }
  bool At(uint32_t node, uint64_t gen, uint64_t put) const {
    return node_id == node && generation == gen && put_id == put;
  }
};
static_assert(sizeof(StoredLocation) == 40);

// [0] is the primary; never empty in the table.
using StoredRoute = absl::InlinedVector<StoredLocation, 1>;

Route Loaded(const StoredRoute& r) {
  Route out;
  out.locations.reserve(r.size());
  for (const StoredLocation& l : r) out.locations.push_back(l.Loaded());
  return out;
}

// A key's bytes in one heap block: a 4-byte length, then the bytes (an std::string would add 24 B
// to every slot and still allocate for any key over 15 B).
class KeyBytes {
 public:
  KeyBytes() = default;
  explicit KeyBytes(std::string_view key)
      : block_(std::make_unique<char[]>(sizeof(uint32_t) + key.size())) {
    const uint32_t n = static_cast<uint32_t>(key.size());
    std::memcpy(block_.get(), &n, sizeof(n));
    std::memcpy(block_.get() + sizeof(n), key.data(), key.size());
  }
  std::string_view view() const {
    if (block_ == nullptr) return {};
    uint32_t n = 0;
    std::memcpy(&n, block_.get(), sizeof(n));
    return std::string_view(block_.get() + sizeof(n), n);
  }

 private:
  std::unique_ptr<char[]> block_;
};

// The two key policies (RouteKeys). A policy says what an entry keeps of its key and whether a
// fingerprint match is the key's.
struct FingerprintOnly {
  struct Kept {};
  static Kept Keep(std::string_view) { return {}; }
  static bool Matches(const Kept&, std::string_view) { return true; }
  static std::string_view Name(const Kept&) { return {}; }
};
struct FullKey {
  using Kept = KeyBytes;
  static Kept Keep(std::string_view key) { return KeyBytes(key); }
  static bool Matches(const Kept& kept, std::string_view key) { return kept.view() == key; }
  static std::string_view Name(const Kept& kept) { return kept.view(); }
};

}  // namespace route_internal

using route_internal::StoredLocation;
using route_internal::StoredRoute;

class RouteTable::Store {
 public:
  virtual ~Store() = default;
  virtual PublishOutcome Publish(const std::string& key, const RouteLocation& loc, PublishKind kind,
                                 std::vector<RouteLocation>* displaced) = 0;
  virtual bool AddCopy(const std::string& key, const RouteLocation& copy) = 0;
  virtual std::optional<Route> Lookup(const std::string& key) const = 0;
  virtual bool RemoveLocation(const std::string& key, uint32_t node_id, uint64_t generation,
                              uint64_t put_id) = 0;
  virtual CopyRemoval RemoveLocationIfCopied(
      const std::string& key, uint32_t node_id, uint64_t generation, uint64_t put_id,
      const std::function<bool(const RouteLocation&)>& serves) = 0;
  virtual uint64_t DropNode(uint32_t node_id, uint64_t generation) = 0;
  virtual void ForEachRoute(
      const std::function<void(std::string_view key, const StoredRoute&)>& fn) const = 0;
  virtual size_t size() const = 0;

  // Applies what one change did to a route (every change is one of these, under its shard lock).
  void Count(int64_t routes, int64_t locations, int64_t logical, int64_t physical) {
    routes_n_.fetch_add(routes, std::memory_order_relaxed);
    locations_n_.fetch_add(locations, std::memory_order_relaxed);
    logical_bytes_.fetch_add(logical, std::memory_order_relaxed);
    physical_bytes_.fetch_add(physical, std::memory_order_relaxed);
  }
  Totals totals() const {
    const auto read = [](const std::atomic<int64_t>& v) {
      return static_cast<uint64_t>(std::max<int64_t>(0, v.load(std::memory_order_relaxed)));
    };
    return Totals{read(routes_n_), read(locations_n_), read(logical_bytes_), read(physical_bytes_)};
  }

 private:
  std::atomic<int64_t> routes_n_{0};
  std::atomic<int64_t> locations_n_{0};
  std::atomic<int64_t> logical_bytes_{0};
  std::atomic<int64_t> physical_bytes_{0};
};

namespace {

using route_internal::FingerprintOnly;
using route_internal::FullKey;
using route_internal::Loaded;

template <typename KeyPolicy>
class RouteStore final : public RouteTable::Store {
  using PublishOutcome = RouteTable::PublishOutcome;
  using CopyRemoval = RouteTable::CopyRemoval;
  struct Entry {
    [[no_unique_address]] typename KeyPolicy::Kept key;
    StoredRoute route;
  };

 public:
  PublishOutcome Publish(const std::string& key, const RouteLocation& loc, PublishKind kind,
                         std::vector<RouteLocation>* displaced) override {
    if (loc.len > kMaxRoutedValueBytes) return PublishOutcome::kRefused;
    const StoredLocation stored = StoredLocation::Of(loc);
    return routes_.Upsert(
        hasher_(key),
        [&] {
          return Entry{KeyPolicy::Keep(key), StoredRoute{stored}};
        },
        [&](Entry& e, bool inserted) {
          const int64_t len = static_cast<int64_t>(loc.len);
          if (inserted) {
            Count(1, 1, len, len);
            return PublishOutcome::kPublished;
          }
          if (!KeyPolicy::Matches(e.key, key)) return Collision(key);
          StoredRoute& cur = e.route;
          for (const StoredLocation& l : cur) {
            if (l.SameIdentity(loc)) return PublishOutcome::kRepublished;
          }
          if (!cur.front().SameValue(loc)) {
            // Another value holds the key. A fresh put never replaces it; a republish does when
            // its version is higher (ties: the route stays).
            if (!kind.republish || loc.version <= cur.front().version) {
              return PublishOutcome::kSuperseded;
            }
            if (displaced != nullptr) {
              displaced->clear();
              for (const StoredLocation& l : cur) displaced->push_back(l.Loaded());
            }
            int64_t old_physical = 0;
            for (const StoredLocation& l : cur) old_physical += l.len;
            Count(0, 1 - static_cast<int64_t>(cur.size()),
                  len - static_cast<int64_t>(cur.front().len), len - old_physical);
            cur.clear();
            cur.push_back(stored);
            return PublishOutcome::kReplaced;
          }
          // The same value from another place: a copy, or its origin republishing its own put.
          for (const StoredLocation& l : cur) {
            if (l.node_id == loc.node_id && l.generation == loc.generation) {
              return PublishOutcome::kSuperseded;  // one location per (node, generation)
            }
          }
          if (!kind.copy && PutIdOrigin(loc.put_id) != loc.node_id) {
            return PublishOutcome::kRefused;
          }
          cur.push_back(stored);
          Count(0, 1, 0, len);
          return PublishOutcome::kPublished;
        });
  }

  bool AddCopy(const std::string& key, const RouteLocation& copy) override {
    if (copy.len > kMaxRoutedValueBytes) return false;
    return routes_.Update(hasher_(key), [&](Entry* e, bool*) {
      if (e == nullptr || !KeyPolicy::Matches(e->key, key)) return false;
      StoredRoute& r = e->route;
      if (!r.front().SameValue(copy)) return false;
      for (const StoredLocation& l : r) {
        if (l.node_id == copy.node_id && l.generation == copy.generation) {
          return l.SameIdentity(copy);
        }
      }
      r.push_back(StoredLocation::Of(copy));
      Count(0, 1, 0, static_cast<int64_t>(copy.len));
      return true;
    });
  }

  std::optional<Route> Lookup(const std::string& key) const override {
    return routes_.Read(hasher_(key), [&](const Entry* e) -> std::optional<Route> {
      if (e == nullptr || !KeyPolicy::Matches(e->key, key)) return std::nullopt;
      return Loaded(e->route);
    });
  }

  bool RemoveLocation(const std::string& key, uint32_t node_id, uint64_t generation,
                      uint64_t put_id) override {
    return RemoveAt(hasher_(key), &key, node_id, generation, put_id);
  }

  CopyRemoval RemoveLocationIfCopied(
      const std::string& key, uint32_t node_id, uint64_t generation, uint64_t put_id,
      const std::function<bool(const RouteLocation&)>& serves) override {
    return routes_.Update(hasher_(key), [&](Entry* e, bool*) {
      if (e == nullptr || !KeyPolicy::Matches(e->key, key)) return CopyRemoval::kAbsent;
      StoredRoute& r = e->route;
      auto it = r.end();
      bool other = false;
      for (auto l = r.begin(); l != r.end(); ++l) {
        if (l->At(node_id, generation, put_id)) {
          it = l;
        } else if (l->node_id != node_id && serves(l->Loaded())) {
          other = true;  // every location of a route carries its identity
        }
      }
      if (it == r.end()) return CopyRemoval::kAbsent;
      if (!other) return CopyRemoval::kSole;
      const int64_t len = it->len;
      r.erase(it);  // another location stays: the route does
      Count(0, -1, 0, -len);
      return CopyRemoval::kRemoved;
    });
  }

  uint64_t DropNode(uint32_t node_id, uint64_t generation) override {
    std::vector<std::pair<RouteKey, uint64_t>> found;  // (fingerprint, put_id)
    routes_.ForEach([&](const RouteKey& fp, const Entry& e) {
      for (const StoredLocation& l : e.route) {
        if (l.node_id == node_id && l.generation == generation) found.emplace_back(fp, l.put_id);
      }
    });
    uint64_t dropped = 0;
    for (const auto& [fp, put_id] : found) {
      dropped += RemoveAt(fp, nullptr, node_id, generation, put_id);
    }
    return dropped;
  }

  void ForEachRoute(
      const std::function<void(std::string_view, const StoredRoute&)>& fn) const override {
    routes_.ForEach([&](const RouteKey&, const Entry& e) { fn(KeyPolicy::Name(e.key), e.route); });
  }

  size_t size() const override { return routes_.size(); }

 private:
  // Removes (node, generation, put_id) from the route named `fp` (and `*key`, when given).
  bool RemoveAt(const RouteKey& fp, const std::string* key, uint32_t node_id, uint64_t generation,
                uint64_t put_id) {
    return routes_.Update(fp, [&](Entry* e, bool* erase) {
      if (e == nullptr || (key != nullptr && !KeyPolicy::Matches(e->key, *key))) return false;
      StoredRoute& r = e->route;
      auto it = std::find_if(r.begin(), r.end(), [&](const StoredLocation& l) {
        return l.At(node_id, generation, put_id);
      });
      if (it == r.end()) return false;
      const int64_t len = it->len;
      r.erase(it);  // a copy moves up to primary when the primary goes
      if (r.empty()) *erase = true;
      Count(r.empty() ? -1 : 0, -1, r.empty() ? -len : 0, -len);
      return true;
    });
  }

  // Two keys with one fingerprint (~2^-128 a pair; only a kept key can tell): the first keeps it.
  static PublishOutcome Collision(const std::string& key) {
    spdlog::error(
        "route key '{}' has the fingerprint of another routed key; its publish is refused", key);
    return PublishOutcome::kRefused;
  }

  const RouteKeyHasher hasher_;
  ShardedTable<RouteKey, Entry> routes_;
};

std::unique_ptr<RouteTable::Store> MakeStore(RouteKeys keys) {
  if (keys == RouteKeys::kFingerprint) return std::make_unique<RouteStore<FingerprintOnly>>();
  return std::make_unique<RouteStore<FullKey>>();
}

}  // namespace

RouteTable::RouteTable(RouteKeys keys) : keys_(keys), store_(MakeStore(keys)) {}
RouteTable::~RouteTable() = default;

RouteTable::PublishOutcome RouteTable::Publish(const std::string& key, const RouteLocation& loc,
                                               PublishKind kind,
                                               std::vector<RouteLocation>* displaced) {
  return store_->Publish(key, loc, kind, displaced);
}

bool RouteTable::AddCopy(const std::string& key, const RouteLocation& copy) {
  return store_->AddCopy(key, copy);
}

std::optional<Route> RouteTable::Lookup(const std::string& key) const {
  return store_->Lookup(key);
}

bool RouteTable::RemoveLocation(const std::string& key, uint32_t node_id, uint64_t generation,
                                uint64_t put_id) {
  return store_->RemoveLocation(key, node_id, generation, put_id);
}

RouteTable::CopyRemoval RouteTable::RemoveLocationIfCopied(
    const std::string& key, uint32_t node_id, uint64_t generation, uint64_t put_id,
    const std::function<bool(const RouteLocation&)>& serves) {
  return store_->RemoveLocationIfCopied(key, node_id, generation, put_id, serves);
}

uint64_t RouteTable::DropNode(uint32_t node_id, uint64_t generation) {
  return store_->DropNode(node_id, generation);
}

std::map<uint32_t, uint64_t> RouteTable::LocationsPerNode() const {
  std::map<uint32_t, uint64_t> out;
  store_->ForEachRoute([&](std::string_view, const StoredRoute& r) {
    for (const StoredLocation& l : r) ++out[l.node_id];
  });
  return out;
}

RouteTable::Totals RouteTable::totals() const { return store_->totals(); }

size_t RouteTable::size() const { return store_->size(); }

std::map<uint32_t, RouteTable::NodeUsage> RouteTable::UsagePerNode() const {
  std::map<uint32_t, NodeUsage> out;
  store_->ForEachRoute([&](std::string_view, const StoredRoute& r) {
    const bool sole = r.size() == 1;
    for (const StoredLocation& l : r) {
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

absl::StatusOr<std::vector<std::pair<std::string, Route>>> RouteTable::ListByPrefix(
    const std::string& prefix, size_t limit, const std::string& start_after, bool* more) const {
  if (keys_ != RouteKeys::kFull) {
    return absl::FailedPreconditionError(
        "this master keeps key fingerprints only (master.route_keys: fingerprint): it cannot "
        "list keys");
  }
  // The limit + 1 smallest matching keys: one more than asked shows whether more exist.
  std::map<std::string, Route> smallest;
  store_->ForEachRoute([&](std::string_view key, const StoredRoute& r) {
    if (!key.starts_with(prefix) || (!start_after.empty() && key <= start_after)) return;
    if (smallest.size() > limit && key >= smallest.rbegin()->first) return;
    smallest.emplace(std::string(key), Loaded(r));
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
