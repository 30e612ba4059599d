// Cohorts for the HotTier and eviction policy tests: ids and weights only, no keys.
#pragma once

#include <cstdint>
#include <vector>

#include "owner/hot_tier.h"

namespace fluxon::testing {

// Cohort `id` of `weight`. With no keys HotTier derives no fingerprint, so the policy sees
// `fingerprint_base + id`, or 0 (no content identity) when fingerprint_base is 0.
inline Cohort MakeCohort(uint64_t id, uint64_t weight, uint64_t fingerprint_base) {
  Cohort c;
  c.id = id;
  c.weight = weight;
  if (fingerprint_base != 0) c.fingerprint = fingerprint_base + id;
  return c;
}

// The chain of cohorts first .. first + n - 1, of weight 1 each.
inline std::vector<Cohort> MakeChain(uint64_t first, uint64_t n, uint64_t fingerprint_base) {
  std::vector<Cohort> out;
  for (uint64_t i = 0; i < n; ++i) out.push_back(MakeCohort(first + i, 1, fingerprint_base));
  return out;
}

inline std::vector<uint64_t> Ids(const std::vector<Cohort>& cs) {
  std::vector<uint64_t> out;
  for (const Cohort& c : cs) out.push_back(c.id);
  return out;
}

}  // namespace fluxon::testing
