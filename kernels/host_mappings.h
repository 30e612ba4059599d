// The host mappings of Fluxon's own memory objects (a segment, a plan arena), for code that holds
// them directly: the benchmark and the test support module. Clients get their mappings from
// KvClient::WaitLocalSegmentsReady; the public host_registration.h takes plain ranges.
#pragma once

#include <string>

#include "fluxon/host_registration.h"
#include "fluxon/plan_blob.h"
#include "slot/segment.h"

namespace fluxon {

inline HostMapping SegmentMapping(const Segment& segment, std::string label) {
  return HostMapping{std::move(label), segment.base(), static_cast<size_t>(segment.total_bytes())};
}

inline HostMapping PlanArenaMapping(const PlanRegistry& plans) {
  return HostMapping{"plan_arena", plans.arena_base(), plans.arena_bytes()};
}

}  // namespace fluxon
