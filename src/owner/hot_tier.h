// HotTier: the owner's size-weighted cache of committed local values, tracked per eviction cohort
// (one atomic group of one put batch). It holds no memory itself, only cohort descriptions; the
// key-control table holds the values.
//
// Invariants:
// - A1: a cohort is admitted whole, after every member's route is published.
// - Weight is the real slot size of each member, so eviction pressure matches memory use.
// - S4: TakeVictims transfers ownership of the chosen cohorts to the caller, who must either
//   finish evicting them or Readmit them; nothing is dropped silently.
// - The eviction order is the Policy type parameter (LruPolicy by default): a class with
//   Insert(id), Touch(id), Erase(id) and Coldest() -> optional<id>.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/mutex.h"

namespace fluxon {

struct Cohort {
  uint64_t id = 0;
  uint64_t put_id = 0;
  std::vector<std::string> keys;
  uint64_t weight = 0;  // sum of member slot sizes
};

class LruPolicy {
 public:
  void Insert(uint64_t id) {
    order_.push_front(id);
    pos_[id] = order_.begin();
  }
  void Touch(uint64_t id) {
    auto it = pos_.find(id);
    if (it != pos_.end()) order_.splice(order_.begin(), order_, it->second);
  }
  void Erase(uint64_t id) {
    auto it = pos_.find(id);
    if (it == pos_.end()) return;
    order_.erase(it->second);
    pos_.erase(it);
  }
  std::optional<uint64_t> Coldest() const {
    if (order_.empty()) return std::nullopt;
    return order_.back();
  }

 private:
  std::list<uint64_t> order_;  // front: most recently used
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> pos_;
};

template <typename Policy = LruPolicy>
class HotTier {
 public:
  void Admit(Cohort cohort) {
    MutexLock lock(&mu_);
    weight_ += cohort.weight;
    policy_.Insert(cohort.id);
    cohorts_.emplace(cohort.id, std::move(cohort));
  }
  // Marks cohorts as used; callers pass a prefix chain tail first so its head stays warmest and
  // a chain is evicted from its tail.
  void Touch(const std::vector<uint64_t>& ids) {
    MutexLock lock(&mu_);
    for (uint64_t id : ids) policy_.Touch(id);
  }
  std::vector<Cohort> TakeVictims(uint64_t bytes) {
    std::vector<Cohort> out;
    MutexLock lock(&mu_);
    uint64_t taken = 0;
    while (taken < bytes) {
      std::optional<uint64_t> id = policy_.Coldest();
      if (!id) break;
      policy_.Erase(*id);
      auto it = cohorts_.find(*id);
      taken += it->second.weight;
      weight_ -= it->second.weight;
      out.push_back(std::move(it->second));
      cohorts_.erase(it);
    }
    return out;
  }
  // A cohort that could not be evicted now (pinned, in use) goes back as most recently used, so
  // the next round does not pick it again at once.
  void Readmit(Cohort cohort) { Admit(std::move(cohort)); }
  uint64_t weight() const {
    MutexLock lock(&mu_);
    return weight_;
  }
  size_t size() const {
    MutexLock lock(&mu_);
    return cohorts_.size();
  }

 private:
  mutable Mutex mu_;
  Policy policy_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Cohort> cohorts_ ABSL_GUARDED_BY(mu_);
  uint64_t weight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fluxon
