// Batch arguments shared by the client library and the owner: validation of keys, atomic groups
// and replica masks, and the prefix arithmetic of get_start.
//
// Invariants:
// - Validation is total and side-effect free; both the client (before any RPC) and the owner
//   (before any reservation) run it, so a bad call reserves nothing anywhere.
// - atomic_group_lens, when given, are positive and sum to the number of keys; absent means every
//   key is its own group. A replica mask has one entry per key and is uniform inside a group.
// - G4: the prefix is computed over the keys in their original order; transferable_len is the raw
//   hit prefix rounded down to a whole group, so a group is never split.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "fluxon/put_options.h"

namespace fluxon {

// 1..kMaxBatchKeys distinct, non-empty keys of at most kMaxKeyBytes each (units.h).
absl::Status ValidateKeys(std::span<const std::string> keys);
// A delete-by-prefix names a namespace: an empty prefix (everything) is refused.
absl::Status ValidateDeletePrefix(const std::string& prefix);
// A put's parent-key hint names the page before the batch: it must not be one of its keys.
absl::Status ValidateParentKey(const std::string& parent_key, std::span<const std::string> keys);
absl::Status ValidateValueLen(int64_t value_len);
absl::Status ValidateGroups(std::span<const uint32_t> group_lens, size_t num_keys);
// Options that exist in the API but are not implemented yet are refused, never carried and
// ignored: reject_if_inflight_same_key and reject_if_exist_same_key are always on (False is
// refused), write_through and a non-empty lease_id are refused — each with InvalidArgument
// naming the option (make_replica_task and its mask are served). Called by the
// client before any request and by the owner before any reservation.
absl::Status ValidateSupportedPutOptions(bool reject_if_inflight_same_key,
                                         bool reject_if_exist_same_key, bool write_through,
                                         const std::string& lease_id);
// Everything a put batch is checked for before anything is reserved or sent: its keys, value_len,
// parent_key, groups, replica mask and the options not implemented yet. The C++ client calls it
// before its request, the owner before any reservation (the Python layer mirrors it).
absl::Status ValidatePutStart(std::span<const std::string> keys, int64_t value_len,
                              const PutOptions& options);
absl::Status ValidateReplicaMask(const std::vector<bool>& mask,
                                 std::span<const uint32_t> group_lens, size_t num_keys);

struct PrefixResult {
  uint32_t raw_prefix_hit_len = 0;
  uint32_t transferable_len = 0;
  uint32_t prefix_hit_groups = 0;
  std::optional<uint32_t> first_miss_index;
  std::optional<uint32_t> first_miss_group_index;
  bool all_hit() const { return !first_miss_index.has_value(); }
};

// What the owner's get_start answers: the prefix, the handle and the transferable values.
struct GetStartOutcome {
  PrefixResult prefix;
  uint64_t handle_id = 0;
  // The transferable prefix includes values still being fetched from other owners: offsets and
  // lens are empty and come with get_transfer.
  bool deferred = false;
  std::vector<uint64_t> offsets;  // transferable prefix (empty when deferred)
  std::vector<uint64_t> lens;
  uint32_t local_pinned = 0;
  uint32_t inflight_joined = 0;
  uint32_t leader_started = 0;
};

// `hits[i]` says whether key i is available; `group_lens` may be empty (one key per group).
PrefixResult ComputePrefix(const std::vector<bool>& hits, std::span<const uint32_t> group_lens);

// Whether `len` ends on a group boundary (0 and the total count as boundaries).
bool IsGroupBoundary(uint32_t len, std::span<const uint32_t> group_lens);

}  // namespace fluxon
