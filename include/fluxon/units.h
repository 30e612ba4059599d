// Size constants and the exact-fit slot arithmetic shared by the owner, the client and the config
// validator. One definition, so the three can never disagree about how many slots a grant holds.
#pragma once

#include <cstdint>

namespace fluxon {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;
inline constexpr uint64_t kGiB = 1024 * kMiB;

// A grant is the 512 MiB physical container carved from the owner segment (S1: never the unit of
// eviction). Slots are cut from a grant at exact fit.
inline constexpr uint64_t kGrantBytes = 512 * kMiB;
inline constexpr uint64_t kSlotAlignment = 4 * kKiB;
inline constexpr uint64_t kMinSlotBytes = 4 * kKiB;
inline constexpr uint64_t kMaxValueBytes = kGrantBytes;

// Request limits, checked by the client before it sends anything and again by the owner before
// anything is reserved. A key's bytes are stored several times over (key table, route table,
// hot tier), so the limit bounds memory no counter sees. kMaxBatchKeys keeps a batch's plan blob
// (16 + 8 * count bytes) well inside the plan arena and a request inside one frame.
inline constexpr uint64_t kMaxKeyBytes = 4 * kKiB;
inline constexpr uint64_t kMaxBatchKeys = 65'536;
// The largest value any *_ms setting accepts (24 h): past it, deadline arithmetic on
// steady_clock would overflow.
inline constexpr int64_t kMaxSettingMs = 24ll * 3600 * 1000;

constexpr uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

constexpr uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// align_up(max(value_len, 4 KiB), 4 KiB): exact fit, never rounded to a power of two (rounding
// wasted 44% of memory in the original deployment).
constexpr uint64_t SlotSizeFor(uint64_t value_len) {
  return AlignUp(value_len < kMinSlotBytes ? kMinSlotBytes : value_len, kSlotAlignment);
}

constexpr uint64_t SlotsPerGrant(uint64_t slot_size) { return kGrantBytes / slot_size; }

// Expected-capacity prewarm: counts the tail of every grant that cannot hold a whole slot.
constexpr uint64_t ExpectedGrants(uint64_t value_len, uint64_t payload_capacity_bytes) {
  const uint64_t slot = SlotSizeFor(value_len);
  return CeilDiv(payload_capacity_bytes, SlotsPerGrant(slot) * slot);
}

static_assert(SlotSizeFor(4'718'592) == 4'718'592);
static_assert(SlotsPerGrant(SlotSizeFor(4'718'592)) == 113);
static_assert(ExpectedGrants(4'718'592, 109'951'162'777) == 207);
static_assert(SlotSizeFor(1) == 4096 && SlotSizeFor(4097) == 8192);

}  // namespace fluxon
