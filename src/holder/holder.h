// Holders: refcounted views of one resident value (MemoryInfo), and the registry that exports
// them to other processes by ID.
//
// Invariants:
// - A MemoryInfo owns exactly one holder reference on its slot (SlotPool::AcquireHolder or the
//   commit that created it). HolderRef copies share that one reference; when the last copy goes,
//   the reference is released through the pool, which frees the slot if its route is not live
//   (S2). Pinning a value is copying a HolderRef: no pool lock is taken.
// - Holder IDs for external exports are non-zero and come from a 64-bit counter that never wraps
//   in practice, so an ID is never reused, let alone while live. An ID is bound to the owner
//   generation; a release that names another generation is rejected.
// - The pool must outlive every HolderRef created on it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/sharded_table.h"
#include "slot/slot_pool.h"

namespace fluxon {

struct MemoryInfo {
  std::string key;
  uint64_t put_id = 0;
  uint64_t offset = 0;  // from the segment base
  uint64_t len = 0;     // value bytes (<= slot size)
  uint32_t node_id = 0;
  uint64_t generation = 0;
  SlotRef slot;
};

class HolderRef {
 public:
  HolderRef() = default;

  // Prepared -> PendingLocalVisible and the resident holder (V1: readable locally at once).
  static absl::StatusOr<HolderRef> CommitLocalVisible(SlotPool* pool, const SlotRef& slot,
                                                      std::string key, uint64_t put_id,
                                                      uint64_t len);
  // Prepared -> Pending (remote-get target, hidden) and its holder.
  static absl::StatusOr<HolderRef> CommitHidden(SlotPool* pool, const SlotRef& slot,
                                                std::string key, uint64_t put_id, uint64_t len);
  // An additional MemoryInfo on a live slot.
  static absl::StatusOr<HolderRef> Acquire(SlotPool* pool, const SlotRef& slot, std::string key,
                                           uint64_t put_id, uint64_t len);

  const MemoryInfo& info() const { return *info_; }
  const MemoryInfo* operator->() const { return info_.get(); }
  explicit operator bool() const { return info_ != nullptr; }
  long use_count() const { return info_.use_count(); }
  void reset() { info_.reset(); }
  friend bool operator==(const HolderRef& a, const HolderRef& b) { return a.info_ == b.info_; }

 private:
  static HolderRef Adopt(SlotPool* pool, const SlotRef& slot, std::string key, uint64_t put_id,
                         uint64_t len);
  std::shared_ptr<const MemoryInfo> info_;
};

class HolderRegistry {
 public:
  explicit HolderRegistry(uint64_t generation) : generation_(generation) {}

  // Exports a holder; the returned ID keeps it pinned until Release.
  uint64_t Export(HolderRef holder);
  absl::StatusOr<HolderRef> Get(uint64_t id) const;
  absl::Status Release(uint64_t id, uint64_t generation);
  size_t size() const { return table_.size(); }
  uint64_t generation() const { return generation_; }

 private:
  const uint64_t generation_;
  std::atomic<uint64_t> next_id_{1};
  ShardedTable<uint64_t, HolderRef, 64> table_;
};

}  // namespace fluxon
