// OwnerMemory: the owner's memory core assembled from its config: the shared segment and the
// local-reserve slot pool (prewarmed when expected capacity is set), plus the holder registry for
// exports. One object owns all three so their lifetimes nest correctly: holders die before the
// pool, the pool before the segment.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "holder/holder.h"
#include "slot/segment.h"
#include "slot/slot_pool.h"

namespace fluxon {

class OwnerMemory {
 public:
  // `on_pressure` is called when a slot claim waits past the soft timeout (outside pool locks).
  static absl::StatusOr<std::unique_ptr<OwnerMemory>> Create(
      const OwnerConfig& config, uint32_t node_id,
      std::function<void(const PressureEvent&)> on_pressure = nullptr);

  Segment& segment() { return *segment_; }
  SlotPool& pool() { return *pool_; }
  HolderRegistry& holders() { return *holders_; }
  std::string StatusText() const;

 private:
  OwnerMemory() = default;
  std::unique_ptr<Segment> segment_;
  std::unique_ptr<SlotPool> pool_;
  std::unique_ptr<HolderRegistry> holders_;
};

}  // namespace fluxon
