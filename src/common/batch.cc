#include "common/batch.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "fluxon/units.h"

namespace fluxon {

absl::Status ValidateKeys(std::span<const std::string> keys) {
  if (keys.empty()) return absl::InvalidArgumentError("keys must not be empty");
  if (keys.size() > kMaxBatchKeys) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a batch holds at most %d keys, got %d (split it)", kMaxBatchKeys, keys.size()));
  }
  absl::flat_hash_set<absl::string_view> seen;
  seen.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("keys[%d] is an empty string", i));
    }
    if (keys[i].size() > kMaxKeyBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "keys[%d] is %d bytes; keys are at most %d bytes", i, keys[i].size(), kMaxKeyBytes));
    }
    if (!seen.insert(keys[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("keys[%d] ('%s') appears twice in one batch", i, keys[i]));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateDeletePrefix(const std::string& prefix) {
  if (prefix.empty()) {
    return absl::InvalidArgumentError("delete prefix must not be empty (name a namespace)");
  }
  if (prefix.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "delete prefix is %d bytes; keys are at most %d bytes", prefix.size(), kMaxKeyBytes));
  }
  return absl::OkStatus();
}

absl::Status ValidateParentKey(const std::string& parent_key, std::span<const std::string> keys) {
  if (parent_key.empty()) return absl::OkStatus();
  if (parent_key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "parent_key is %d bytes; keys are at most %d bytes", parent_key.size(), kMaxKeyBytes));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] == parent_key) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "parent_key '%s' is keys[%d] of the same batch; it names the page before keys[0]",
          parent_key, i));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateValueLen(int64_t value_len) {
  if (value_len <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat("value_len must be > 0, got %d", value_len));
  }
  if (static_cast<uint64_t>(value_len) > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("value_len %d exceeds the 512 MiB value limit", value_len));
  }
  return absl::OkStatus();
}

absl::Status ValidateGroups(std::span<const uint32_t> group_lens, size_t num_keys) {
  if (group_lens.empty()) return absl::OkStatus();
  uint64_t sum = 0;
  for (size_t i = 0; i < group_lens.size(); ++i) {
    if (group_lens[i] == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("atomic_group_lens[%d] must be positive", i));
    }
    sum += group_lens[i];
  }
  if (sum != num_keys) {
    return absl::InvalidArgumentError(
        absl::StrFormat("atomic_group_lens sum to %d but there are %d keys", sum, num_keys));
  }
  return absl::OkStatus();
}

absl::Status ValidateSupportedPutOptions(bool reject_if_inflight_same_key,
                                         bool reject_if_exist_same_key, bool write_through,
                                         const std::string& lease_id) {
  if (!reject_if_inflight_same_key) {
    return absl::InvalidArgumentError(
        "reject_if_inflight_same_key=False is not supported: a key being written or fetched is "
        "always rejected (KeyConflictError)");
  }
  if (!reject_if_exist_same_key) {
    return absl::InvalidArgumentError(
        "reject_if_exist_same_key=False is not supported: a stored key is always rejected "
        "(values are immutable; delete it first)");
  }
  (void)write_through;  // accepted; an owner that cannot copy elsewhere refuses it (PutPath)
  if (!lease_id.empty()) {
    return absl::InvalidArgumentError(
        "lease_id is not implemented (no lease semantics yet); leave it unset");
  }
  return absl::OkStatus();
}

absl::Status ValidatePutStart(std::span<const std::string> keys, int64_t value_len,
                              const PutOptions& o) {
  if (absl::Status s = ValidateKeys(keys); !s.ok()) return s;
  if (absl::Status s = ValidateParentKey(o.parent_key, keys); !s.ok()) return s;
  if (absl::Status s = ValidateValueLen(value_len); !s.ok()) return s;
  if (absl::Status s = ValidateGroups(o.atomic_group_lens, keys.size()); !s.ok()) return s;
  if (absl::Status s =
          ValidateReplicaMask(o.make_replica_task_mask, o.atomic_group_lens, keys.size());
      !s.ok()) {
    return s;
  }
  return ValidateSupportedPutOptions(o.reject_if_inflight_same_key, o.reject_if_exist_same_key,
                                     o.write_through, o.lease_id);
}

absl::Status ValidateReplicaMask(const std::vector<bool>& mask,
                                 std::span<const uint32_t> group_lens, size_t num_keys) {
  if (mask.empty()) return absl::OkStatus();
  if (mask.size() != num_keys) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "make_replica_task_mask has %d entries but there are %d keys", mask.size(), num_keys));
  }
  size_t start = 0;
  for (size_t g = 0; g < group_lens.size(); ++g) {
    for (size_t i = start + 1; i < start + group_lens[g]; ++i) {
      if (mask[i] != mask[start]) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "make_replica_task_mask mixes values inside atomic group %d (keys %d..%d)", g, start,
            start + group_lens[g] - 1));
      }
    }
    start += group_lens[g];
  }
  return absl::OkStatus();
}

PrefixResult ComputePrefix(const std::vector<bool>& hits, std::span<const uint32_t> group_lens) {
  PrefixResult r;
  const uint32_t n = static_cast<uint32_t>(hits.size());
  while (r.raw_prefix_hit_len < n && hits[r.raw_prefix_hit_len]) ++r.raw_prefix_hit_len;
  if (r.raw_prefix_hit_len < n) r.first_miss_index = r.raw_prefix_hit_len;
  if (group_lens.empty()) {
    r.transferable_len = r.raw_prefix_hit_len;
    r.prefix_hit_groups = r.raw_prefix_hit_len;
    r.first_miss_group_index = r.first_miss_index;
    return r;
  }
  uint32_t end = 0;
  for (uint32_t g = 0; g < group_lens.size(); ++g) {
    const uint32_t next = end + group_lens[g];
    if (next > r.raw_prefix_hit_len) {
      if (r.first_miss_index) r.first_miss_group_index = g;
      break;
    }
    end = next;
    ++r.prefix_hit_groups;
  }
  r.transferable_len = end;
  return r;
}

bool IsGroupBoundary(uint32_t len, std::span<const uint32_t> group_lens) {
  if (group_lens.empty()) return true;
  uint32_t end = 0;
  if (len == 0) return true;
  for (uint32_t g : group_lens) {
    end += g;
    if (end == len) return true;
    if (end > len) return false;
  }
  return false;
}

}  // namespace fluxon
