// EvictionSignals: what the publisher, the get path, the remote fetcher and the replica queue
// tell the evictor (an interface, so none of them depends on the evictor itself).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fluxon {

// What the publisher and the get path tell the evictor.
class EvictionSignals {
 public:
  virtual ~EvictionSignals() = default;
  // Pins were dropped or cohorts admitted: a backed-off eviction may try again at once.
  virtual void CandidatesChanged() = 0;
  // Wakes the maintenance actor now (capacity may need eviction).
  virtual void SignalPressure() = 0;
  // Every member of the values `keys` (put_id, one atomic group) has a complete copy on another
  // node now (a replica completed): their cohort is evicted first when capacity is needed.
  virtual void CopiedElsewhere(const std::vector<std::string>& keys, uint64_t put_id) = 0;
};

}  // namespace fluxon
