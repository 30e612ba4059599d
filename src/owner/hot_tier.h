// HotTier: the owner's size-weighted cache of committed local values, tracked per eviction cohort
// (one atomic group of one put batch). It holds no memory itself, only cohort descriptions; the
// key-control table holds the values.
//
// Invariants:
// - A1: a cohort is admitted whole, after every member's route is published.
// - Weight is the real slot size of each member, so eviction pressure matches memory use.
// - S4: TakeVictims transfers ownership of the chosen cohorts to the caller, who must either
//   finish evicting them or Readmit them; nothing is dropped silently.
// - Chains: the cohorts of one put batch form a chain in batch order (batch order is chain order
//   inside a prompt); a victim is always the tail of its chain, so a restore's prefix is never
//   broken while later pages of the same chain are kept (design §7: a miss at page i makes every
//   later page useless).
// - The eviction order is the Policy type parameter (AdaptiveChainPolicy by default, see
//   owner/eviction/adaptive_chain_policy.h for it and the interface; the baselines are in
//   bench/eviction/baseline_policies.h): Insert(id, after, now,
//   refresh, fingerprint, weight), Touch(ids, now), Erase(id), Evict(id), Predecessor(id) and
//   Coldest(now) -> optional<id>, on a logical clock that advances once per admission or access.
// - Fingerprints (for ghost lists): a cohort's own, or a hash of its first key and key count.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "common/mutex.h"
#include "owner/eviction/adaptive_chain_policy.h"

namespace fluxon {

struct Cohort {
  uint64_t id = 0;
  uint64_t put_id = 0;
  std::vector<std::string> keys;
  uint64_t weight = 0;  // sum of member slot sizes
  uint64_t after = 0;   // the cohort before it in its chain when it was taken (0: chain head)
  // Identifies the cohort's content across lifetimes (ghost lists); 0: HotTier derives it from
  // the first key.
  uint64_t fingerprint = 0;
};

template <typename Policy = AdaptiveChainPolicy>
class HotTier {
 public:
  // Admits the cohorts of one put batch as one chain, in batch order. `parent`: the cohort of the
  // page just before the batch's first one (the client's parent-key hint), 0 if unknown; the
  // batch then continues that chain when `parent` is its tail.
  void AdmitChain(std::vector<Cohort> chain, uint64_t parent = 0) {
    MutexLock lock(&mu_);
    const uint64_t now = ++clock_;
    uint64_t after = parent;
    for (Cohort& cohort : chain) {
      weight_ += cohort.weight;
      if (cohort.fingerprint == 0 && !cohort.keys.empty()) cohort.fingerprint = Fingerprint(cohort);
      policy_.Insert(cohort.id, after, now, /*refresh=*/true, cohort.fingerprint, cohort.weight);
      after = cohort.id;
      cohorts_.emplace(cohort.id, std::move(cohort));
    }
  }
  // One access to these cohorts (a restored prefix, passed tail first).
  void Touch(const std::vector<uint64_t>& ids) {
    MutexLock lock(&mu_);
    policy_.Touch(ids, ++clock_);
  }
  std::vector<Cohort> TakeVictims(uint64_t bytes) {
    std::vector<Cohort> out;
    MutexLock lock(&mu_);
    uint64_t taken = 0;
    while (taken < bytes) {
      std::optional<uint64_t> id = policy_.Coldest(clock_);
      if (!id) break;
      const uint64_t after = policy_.Predecessor(*id);
      policy_.Evict(*id);
      auto it = cohorts_.find(*id);
      taken += it->second.weight;
      weight_ -= it->second.weight;
      it->second.after = after;
      out.push_back(std::move(it->second));
      cohorts_.erase(it);
    }
    return out;
  }
  // A cohort that could not be evicted now (pinned, in use) goes back where it was: the tail of
  // its chain (a new chain if its predecessor is gone), without counting as an access.
  void Readmit(Cohort cohort) {
    MutexLock lock(&mu_);
    weight_ += cohort.weight;
    policy_.Insert(cohort.id, cohort.after, clock_, /*refresh=*/false, cohort.fingerprint,
                   cohort.weight);
    cohorts_.emplace(cohort.id, std::move(cohort));
  }
  // Drops a cohort whose every key starts with `prefix` (its values were deleted on request);
  // a cohort with a key outside the prefix stays, since its other values are still live.
  bool ForgetIfAllUnder(uint64_t id, std::string_view prefix) {
    MutexLock lock(&mu_);
    auto it = cohorts_.find(id);
    if (it == cohorts_.end()) return false;
    for (const std::string& k : it->second.keys) {
      if (k.compare(0, prefix.size(), prefix) != 0) return false;
    }
    policy_.Erase(id);
    weight_ -= it->second.weight;
    cohorts_.erase(it);
    return true;
  }
  uint64_t weight() const {
    MutexLock lock(&mu_);
    return weight_;
  }
  size_t size() const {
    MutexLock lock(&mu_);
    return cohorts_.size();
  }

  // Runs `f(const Policy&)` under the lock (tests, the bench).
  template <typename F>
  auto InspectPolicy(F&& f) const {
    MutexLock lock(&mu_);
    return f(policy_);
  }

 private:
  static uint64_t Fingerprint(const Cohort& cohort) {
    const uint64_t h = absl::HashOf(cohort.keys.front(), cohort.keys.size());
    return h == 0 ? 1 : h;
  }

  mutable Mutex mu_;
  Policy policy_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Cohort> cohorts_ ABSL_GUARDED_BY(mu_);
  uint64_t weight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;  // logical time: one tick per admission or access
};

}  // namespace fluxon
