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
//   owner/eviction_policies.h for it, the interface and the baselines): Insert(id, after, now,
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
#include "owner/eviction_policies.h"

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

// Least recently used cohort first; within one access the caller's order decides.
class LruPolicy {
 public:
  void Insert(uint64_t id, uint64_t /*after*/, uint64_t /*now*/, bool /*refresh*/,
              uint64_t /*fingerprint*/ = 0, uint64_t /*weight*/ = 1) {
    order_.push_front(id);
    pos_[id] = order_.begin();
  }
  void Touch(const std::vector<uint64_t>& ids, uint64_t /*now*/) {
    for (uint64_t id : ids) {
      auto it = pos_.find(id);
      if (it != pos_.end()) order_.splice(order_.begin(), order_, it->second);
    }
  }
  void Erase(uint64_t id) {
    auto it = pos_.find(id);
    if (it == pos_.end()) return;
    order_.erase(it->second);
    pos_.erase(it);
  }
  void Evict(uint64_t id) { Erase(id); }
  uint64_t Predecessor(uint64_t /*id*/) const { return 0; }
  std::optional<uint64_t> Coldest(uint64_t /*now*/) const {
    if (order_.empty()) return std::nullopt;
    return order_.back();
  }

 private:
  std::list<uint64_t> order_;  // front: most recently used
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> pos_;
};

// The previous default (kept as a baseline and as AdaptiveChainPolicy's prediction expert's
// origin). Evicts the chain whose next access is predicted to come last, tail first (an
// approximation of Belady's optimum for prefix-restored chains). Each chain learns its reuse period
// (EWMA of the gaps between accesses, on the logical clock); its next access is predicted at last +
// period (chains seen only once use the mean period of the others). A chain that is overdue by more
// than one period (now > last + 2 * period) is taken as finished and goes first.
//
// Why not LRU: multi-turn traffic is cyclic (every conversation comes back once per round, after
// the others), LRU's worst case: it evicts exactly the conversation that returns next. On the
// multi-turn replay in bench/eviction_policy_bench this policy is within a point of Belady where
// LRU keeps a third of that; on Zipf-skewed sessions it is ahead of LRU too (docs/perf.md).
class ReusePredictionPolicy {
 public:
  // `after` == 0 or not the tail of a live chain: `id` starts a new chain. `refresh`: this is an
  // access (an admission by a put), not a re-insertion of a cohort that could not be evicted.
  void Insert(uint64_t id, uint64_t after, uint64_t now, bool refresh, uint64_t /*fingerprint*/ = 0,
              uint64_t /*weight*/ = 1) {
    auto prev = cohorts_.find(after);
    uint64_t chain_id;
    if (after != 0 && prev != cohorts_.end() &&
        chains_.at(prev->second.chain).cohorts.back() == after) {
      chain_id = prev->second.chain;
    } else {
      chain_id = ++last_chain_id_;
      chains_.emplace(chain_id, Chain{});
      chains_.at(chain_id).last = now;
      Index(chain_id);
    }
    Chain& c = chains_.at(chain_id);
    c.cohorts.push_back(id);
    cohorts_[id] = Member{chain_id, std::prev(c.cohorts.end())};
    if (refresh && c.last != now) {
      Unindex(chain_id);
      c.last = now;
      Index(chain_id);
    }
  }
  // One access: each distinct chain among `ids` learns the gap since its last access.
  void Touch(const std::vector<uint64_t>& ids, uint64_t now) {
    for (uint64_t id : ids) {
      auto m = cohorts_.find(id);
      if (m == cohorts_.end()) continue;
      Chain& c = chains_.at(m->second.chain);
      if (c.last == now) continue;  // already counted for this access
      Unindex(m->second.chain);
      const double gap = static_cast<double>(now - c.last);
      if (c.has_period && gap < kRepeatFraction * c.period) {
        // The same request again (a probe, then the read): not a new reuse gap.
      } else if (c.has_period) {
        period_sum_ -= c.period;
        c.period = 0.5 * c.period + 0.5 * gap;
      } else {
        c.has_period = true;
        c.period = gap;
        ++period_count_;
      }
      period_sum_ += c.period;
      c.last = now;
      Index(m->second.chain);
    }
  }
  void Erase(uint64_t id) {
    auto m = cohorts_.find(id);
    if (m == cohorts_.end()) return;
    const uint64_t chain_id = m->second.chain;
    Chain& c = chains_.at(chain_id);
    c.cohorts.erase(m->second.pos);
    cohorts_.erase(m);
    if (c.cohorts.empty()) {
      Unindex(chain_id);
      if (c.has_period) {
        period_sum_ -= c.period;
        --period_count_;
      }
      chains_.erase(chain_id);
    }
  }
  void Evict(uint64_t id) { Erase(id); }
  uint64_t Predecessor(uint64_t id) const {
    auto m = cohorts_.find(id);
    if (m == cohorts_.end()) return 0;
    const Chain& c = chains_.at(m->second.chain);
    return m->second.pos == c.cohorts.begin() ? 0 : *std::prev(m->second.pos);
  }
  std::optional<uint64_t> Coldest(uint64_t now) const {
    if (chains_.empty()) return std::nullopt;
    const double mean = period_count_ > 0 ? period_sum_ / static_cast<double>(period_count_) : 0;
    const double t = static_cast<double>(now);
    // Finished chains first: overdue by more than a period.
    if (!with_period_.empty()) {
      const auto& [pred, chain_id] = *with_period_.begin();
      if (t > pred + chains_.at(chain_id).period) return chains_.at(chain_id).cohorts.back();
    }
    if (!without_period_.empty() && mean > 0) {
      const auto& [last, chain_id] = *without_period_.begin();
      if (t > static_cast<double>(last) + 2 * mean) return chains_.at(chain_id).cohorts.back();
    }
    // Otherwise the chain predicted to come back last, passing over chains accessed in the last
    // kRecentTicks ticks: those are the requests being served now, and taking the tail of a
    // prefix that was just restored would orphan the pages its own put is about to append.
    std::optional<std::pair<double, uint64_t>> best;
    std::optional<uint64_t> fallback;
    auto consider = [&](double pred, uint64_t chain_id) {
      if (!fallback) fallback = chain_id;
      if (chains_.at(chain_id).last + kRecentTicks > now) return false;
      if (!best || std::make_pair(pred, chain_id) > *best) best = {pred, chain_id};
      return true;
    };
    for (auto it = with_period_.rbegin(); it != with_period_.rend(); ++it) {
      if (consider(it->first, it->second)) break;
    }
    for (auto it = without_period_.rbegin(); it != without_period_.rend(); ++it) {
      if (consider(static_cast<double>(it->first) + mean, it->second)) break;
    }
    return chains_.at(best ? best->second : *fallback).cohorts.back();
  }

 private:
  static constexpr uint64_t kRecentTicks = 4;
  // Accesses closer than this fraction of a chain's period are one request seen twice (SGLang
  // probes with batch_exists, then reads): counting them would halve every period and make
  // live chains look overdue.
  static constexpr double kRepeatFraction = 0.25;
  struct Chain {
    std::list<uint64_t> cohorts;  // head first
    uint64_t last = 0;            // logical time of the last access
    double period = 0;
    bool has_period = false;
  };
  struct Member {
    uint64_t chain;
    std::list<uint64_t>::iterator pos;
  };
  void Index(uint64_t chain_id) {
    const Chain& c = chains_.at(chain_id);
    if (c.has_period) {
      with_period_.emplace(static_cast<double>(c.last) + c.period, chain_id);
    } else {
      without_period_.emplace(c.last, chain_id);
    }
  }
  void Unindex(uint64_t chain_id) {
    const Chain& c = chains_.at(chain_id);
    if (c.has_period) {
      with_period_.erase({static_cast<double>(c.last) + c.period, chain_id});
    } else {
      without_period_.erase({c.last, chain_id});
    }
  }

  absl::flat_hash_map<uint64_t, Chain>
      chains_;  // newer chains have larger ids (ties: newest first)
  uint64_t last_chain_id_ = 0;
  absl::flat_hash_map<uint64_t, Member> cohorts_;
  std::set<std::pair<double, uint64_t>> with_period_;       // (predicted next access, chain)
  std::set<std::pair<uint64_t, uint64_t>> without_period_;  // (last access, chain)
  double period_sum_ = 0;
  uint64_t period_count_ = 0;
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
