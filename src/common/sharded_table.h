// ShardedTable: a hash map split into independently locked shards.
//
// Invariants (G10):
// - Every operation locks exactly one shard for an O(1) critical section: one lookup, insert or
//   erase plus the caller's callback, which must itself be O(1) and must never block, await, send
//   an RPC or touch another shard. Batch operations loop over keys outside any lock, one shard
//   lock per key.
// - There is no table-wide lock. ForEach visits shards one at a time (a consistent view per shard,
//   not of the whole table) and is for inspection, never for the hot path.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "common/mutex.h"

namespace fluxon {

template <typename K, typename V, size_t kShards = 256>
class ShardedTable {
  static_assert((kShards & (kShards - 1)) == 0, "shard count must be a power of two");

 public:
  using Map = absl::flat_hash_map<K, V>;

  static constexpr size_t shard_count() { return kShards; }
  static size_t ShardOf(const K& key) {
    // Mix the high bits in: flat_hash_map uses the low bits of the same hash for its buckets.
    const size_t h = absl::Hash<K>{}(key);
    return (h ^ (h >> 29)) & (kShards - 1);
  }

  // Inserts when absent; returns false (and leaves the table unchanged) when the key exists.
  bool InsertIfAbsent(const K& key, V value) {
    Shard& s = shards_[ShardOf(key)];
    MutexLock lock(&s.mu);
    const bool inserted = s.map.try_emplace(key, std::move(value)).second;
    if (inserted) size_.fetch_add(1, std::memory_order_relaxed);
    return inserted;
  }

  std::optional<V> Get(const K& key) const {
    const Shard& s = shards_[ShardOf(key)];
    MutexLock lock(&s.mu);
    auto it = s.map.find(key);
    if (it == s.map.end()) return std::nullopt;
    return it->second;
  }

  // Runs `fn(const V* current_or_null)` under the key's shard lock and returns its result.
  template <typename Fn>
  auto Read(const K& key, Fn&& fn) const {
    const Shard& s = shards_[ShardOf(key)];
    MutexLock lock(&s.mu);
    auto it = s.map.find(key);
    return fn(it == s.map.end() ? nullptr : &it->second);
  }

  bool Contains(const K& key) const {
    const Shard& s = shards_[ShardOf(key)];
    MutexLock lock(&s.mu);
    return s.map.contains(key);
  }

  // Removes the entry and returns it.
  std::optional<V> Take(const K& key) {
    return Update(key, [](V* current, bool* erase) -> std::optional<V> {
      if (current == nullptr) return std::nullopt;
      *erase = true;
      return std::optional<V>(std::move(*current));
    });
  }

  // Removes the entry only if `pred(value)` holds: cleanup compares identity, so a newer entry
  // that replaced the one being cleaned up is never removed (no ABA).
  template <typename Pred>
  bool EraseIf(const K& key, Pred&& pred) {
    return Update(key, [&](V* current, bool* erase) {
      *erase = current != nullptr && pred(static_cast<const V&>(*current));
      return *erase;
    });
  }

  // Runs `fn(V* current_or_null, bool* erase)` under the key's shard lock and returns its result.
  // `fn` may modify *current, insert by returning through `insert` (see Upsert), or set *erase.
  template <typename Fn>
  auto Update(const K& key, Fn&& fn) {
    Shard& s = shards_[ShardOf(key)];
    MutexLock lock(&s.mu);
    auto it = s.map.find(key);
    bool erase = false;
    V* current = it == s.map.end() ? nullptr : &it->second;
    auto result = fn(current, &erase);
    if (erase && current != nullptr) {
      s.map.erase(it);
      size_.fetch_sub(1, std::memory_order_relaxed);
    }
    return result;
  }

  // Runs `fn(V& value, bool inserted)` on the existing entry or on `make()` freshly inserted.
  template <typename Make, typename Fn>
  auto Upsert(const K& key, Make&& make, Fn&& fn) {
    Shard& s = shards_[ShardOf(key)];
    MutexLock lock(&s.mu);
    auto [it, inserted] = s.map.try_emplace(key);
    if (inserted) {
      it->second = make();
      size_.fetch_add(1, std::memory_order_relaxed);
    }
    return fn(it->second, inserted);
  }

  // Visits every entry, one shard lock at a time. Inspection only.
  void ForEach(const std::function<void(const K&, const V&)>& fn) const {
    for (const Shard& s : shards_) {
      MutexLock lock(&s.mu);
      for (const auto& [k, v] : s.map) fn(k, v);
    }
  }

  size_t size() const { return size_.load(std::memory_order_relaxed); }

 private:
  struct alignas(64) Shard {
    mutable Mutex mu;
    Map map ABSL_GUARDED_BY(mu);
  };
  std::array<Shard, kShards> shards_;
  std::atomic<size_t> size_{0};
};

}  // namespace fluxon
