// EvictionSignals: what the publisher, the get path, the remote fetcher and the replica queue
// tell the evictor (an interface, so none of them depends on the evictor itself).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fluxon {

// How a replica group (an atomic group the replica queue took) ended.
enum class ReplicaGroupEnd : uint8_t {
  kCopied,   // the target holds every member (completed or already held)
  kNoSpace,  // placed nowhere, or the target had no room
  kGone,     // this owner no longer holds the values with that identity
  kFailed,   // anything else: not queued (full, duplicate), a failed call, the owner stopping
};

// What the publisher and the get path tell the evictor.
class EvictionSignals {
 public:
  virtual ~EvictionSignals() = default;
  // Pins were dropped or cohorts admitted: a backed-off eviction may try again at once.
  virtual void CandidatesChanged() = 0;
  // Wakes the maintenance actor now (capacity may need eviction).
  virtual void SignalPressure() = 0;
  // A replica group ended (once per group the replica queue was given): `keys` (put_id, one
  // atomic group); `demoted_cohort`: the cohort it demotes (0: a replica the client asked for).
  // kCopied: every member has a complete copy on another node now, the owner whose peer service
  // is at `target` (empty when no target was asked).
  virtual void ReplicaGroupEnded(const std::vector<std::string>& keys, uint64_t put_id,
                                 uint64_t demoted_cohort, ReplicaGroupEnd end,
                                 const std::string& target) = 0;
};

}  // namespace fluxon
