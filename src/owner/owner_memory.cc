#include "owner/owner_memory.h"

#include "absl/strings/str_format.h"
#include "fluxon/status.h"
#include "fluxon/units.h"

namespace fluxon {

absl::StatusOr<std::unique_ptr<OwnerMemory>> OwnerMemory::Create(
    const OwnerConfig& config, uint32_t node_id,
    std::function<void(const PressureEvent&)> on_pressure) {
  std::unique_ptr<OwnerMemory> m(new OwnerMemory());
  SegmentOptions seg;
  seg.size_bytes = config.segment.size_bytes;
  seg.huge_pages = config.segment.huge_pages;
  seg.numa_node = config.segment.numa_node;
  seg.path = config.segment.path;
  seg.node_id = node_id;
  FLUXON_ASSIGN_OR_RETURN(m->segment_, Segment::Create(seg));
  SlotPoolOptions po;
  if (config.local_reserve.expected_capacity) {
    po.expected_capacity =
        ExpectedCapacity{config.local_reserve.expected_capacity->value_len,
                         config.local_reserve.expected_capacity->payload_capacity_bytes};
  }
  po.claim_soft_timeout = config.local_reserve.claim_soft_timeout;
  po.claim_hard_timeout = config.local_reserve.claim_hard_timeout;
  po.shrink_idle = config.local_reserve.shrink_idle;
  po.warm_grants = config.local_reserve.warm_grants;
  po.on_pressure = std::move(on_pressure);
  FLUXON_ASSIGN_OR_RETURN(m->pool_, SlotPool::Create(m->segment_.get(), po));
  FLUXON_RETURN_IF_ERROR(m->pool_->Prewarm());
  // Like the prewarm, before the owner serves: the first claims then carve without waiting for
  // first touch (the maintenance thread keeps warm_grants populated from then on).
  m->pool_->PrefaultAhead();
  m->holders_ = std::make_unique<HolderRegistry>(m->segment_->generation());
  return m;
}

std::string OwnerMemory::StatusText() const {
  const SlotPoolStats s = pool_->Stats();
  std::string out =
      absl::StrFormat("segment: %d bytes (%s), generation %d, grant positions %d\n",
                      segment_->data_bytes(), segment_->path().empty() ? "memfd" : segment_->path(),
                      segment_->generation(), segment_->data_bytes() / kGrantBytes);
  out += absl::StrFormat("local reserve: %s, grants %d/%d\n",
                         pool_->expected_grants() ? "expected-capacity (hard cap)" : "dynamic",
                         s.grants, s.grant_capacity);
  out += "slots:";
  for (int i = 0; i < kNumSlotStates; ++i) {
    out += absl::StrFormat(" %s=%d", SlotStateName(static_cast<SlotState>(i)), s.slots_by_state[i]);
  }
  out += "\n";
  for (const auto& c : s.classes) {
    out += absl::StrFormat("  class slot_size=%d slots_per_grant=%d grants=%d free=%d\n",
                           c.slot_size, c.slots_per_grant, c.grants, c.free_slots);
  }
  return out;
}

}  // namespace fluxon
