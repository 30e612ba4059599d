// Baseline eviction policies for bench/eviction_policy_bench and the tests: cohort LRU
// (LruPolicy), the owner's previous default (ReusePredictionPolicy), and page-level S3-FIFO and
// ARC as published. Only benchmarks and tests build them (library fluxon_eviction_baselines);
// the owner runs AdaptiveChainPolicy (src/owner/eviction/adaptive_chain_policy.h). Every policy
// implements the interface described there.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <deque>
#include <list>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"

#include "owner/hot_tier.h"

namespace fluxon {

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

// Page-level baselines (page level, as published; no chains: Predecessor is always 0). Their
// capacity is the most cohorts ever resident (the cache fills before it evicts).

// A bounded FIFO of fingerprints with membership; Take removes one (a ghost hit).
class GhostFifo {
 public:
  void Push(uint64_t fingerprint, uint64_t limit) {
    fifo_.push_back({fingerprint, ++seq_});
    index_[fingerprint] = seq_;
    while (fifo_.size() > limit) {
      auto g = index_.find(fifo_.front().first);
      if (g != index_.end() && g->second == fifo_.front().second) index_.erase(g);
      fifo_.pop_front();
    }
  }
  bool Take(uint64_t fingerprint) { return index_.erase(fingerprint) > 0; }
  size_t size() const { return index_.size(); }

 private:
  std::deque<std::pair<uint64_t, uint64_t>> fifo_;  // (fingerprint, sequence), oldest first
  absl::flat_hash_map<uint64_t, uint64_t> index_;   // fingerprint -> newest sequence
  uint64_t seq_ = 0;
};

// S3-FIFO (Yang et al., SOSP '23): a small FIFO (10 %) filters one-hit entries, a main FIFO with
// 2-bit frequencies (reinserted while > 0), a ghost FIFO of evicted small-queue keys as long as
// the main queue; a ghost hit is admitted to main.
class S3FifoPolicy {
 public:
  void Insert(uint64_t id, uint64_t /*after*/, uint64_t /*now*/, bool /*refresh*/,
              uint64_t fingerprint = 0, uint64_t /*weight*/ = 1) {
    const bool to_main = fingerprint != 0 && ghost_.Take(fingerprint);
    auto& q = to_main ? main_ : small_;
    q.push_front(id);
    entries_[id] = Entry{q.begin(), to_main, 0, fingerprint};
    cap_ = std::max<uint64_t>(cap_, entries_.size());
  }
  void Touch(const std::vector<uint64_t>& ids, uint64_t /*now*/) {
    for (uint64_t id : ids) {
      auto e = entries_.find(id);
      if (e != entries_.end()) e->second.freq = std::min(e->second.freq + 1, 3);
    }
  }
  void Erase(uint64_t id) {
    auto e = entries_.find(id);
    if (e == entries_.end()) return;
    (e->second.main ? main_ : small_).erase(e->second.pos);
    entries_.erase(e);
  }
  void Evict(uint64_t id) {
    auto e = entries_.find(id);
    if (e == entries_.end()) return;
    if (!e->second.main && e->second.fingerprint != 0) {
      ghost_.Push(e->second.fingerprint, std::max<uint64_t>(cap_ - cap_ / 10, 1));
    }
    Erase(id);
  }
  uint64_t Predecessor(uint64_t /*id*/) const { return 0; }
  std::optional<uint64_t> Coldest(uint64_t /*now*/) {
    while (!small_.empty() || !main_.empty()) {
      if (!small_.empty() && (small_.size() * 10 >= cap_ || main_.empty())) {
        const uint64_t id = small_.back();
        Entry& e = entries_.at(id);
        if (e.freq == 0) return id;  // one hit: out (to the ghost, in Evict)
        small_.pop_back();           // reused while small: promoted
        main_.push_front(id);
        e = Entry{main_.begin(), true, 0, e.fingerprint};
        continue;
      }
      const uint64_t id = main_.back();
      Entry& e = entries_.at(id);
      if (e.freq == 0) return id;
      --e.freq;
      main_.splice(main_.begin(), main_, e.pos);
    }
    return std::nullopt;
  }

 private:
  struct Entry {
    std::list<uint64_t>::iterator pos;
    bool main;
    int freq;
    uint64_t fingerprint;
  };
  std::list<uint64_t> small_, main_;  // front: newest
  absl::flat_hash_map<uint64_t, Entry> entries_;
  GhostFifo ghost_;
  uint64_t cap_ = 0;
};

// ARC (Megiddo and Modha, FAST '03): T1 (seen once) and T2 (seen again) with ghosts B1 and B2 of
// their evicted keys; a hit in B1 grows T1's target p, a hit in B2 shrinks it.
class ArcPolicy {
 public:
  void Insert(uint64_t id, uint64_t /*after*/, uint64_t /*now*/, bool refresh,
              uint64_t fingerprint = 0, uint64_t /*weight*/ = 1) {
    bool t2 = false;
    if (fingerprint != 0) {
      const double b1 = static_cast<double>(b1_.size()), b2 = static_cast<double>(b2_.size());
      if (b1_.Take(fingerprint)) {
        t2 = true;
        if (refresh) p_ = std::min(static_cast<double>(cap_), p_ + std::max(b2 / b1, 1.0));
      } else if (b2_.Take(fingerprint)) {
        t2 = true;
        if (refresh) p_ = std::max(0.0, p_ - std::max(b1 / std::max(b2, 1.0), 1.0));
      }
    }
    auto& q = t2 ? t2_ : t1_;
    q.push_front(id);
    entries_[id] = Entry{q.begin(), t2, fingerprint};
    cap_ = std::max<uint64_t>(cap_, entries_.size());
  }
  void Touch(const std::vector<uint64_t>& ids, uint64_t /*now*/) {
    for (uint64_t id : ids) {
      auto e = entries_.find(id);
      if (e == entries_.end()) continue;
      t2_.splice(t2_.begin(), e->second.t2 ? t2_ : t1_, e->second.pos);
      e->second.t2 = true;
    }
  }
  void Erase(uint64_t id) {
    auto e = entries_.find(id);
    if (e == entries_.end()) return;
    (e->second.t2 ? t2_ : t1_).erase(e->second.pos);
    entries_.erase(e);
  }
  void Evict(uint64_t id) {
    auto e = entries_.find(id);
    if (e == entries_.end()) return;
    const bool t2 = e->second.t2;
    const uint64_t fp = e->second.fingerprint;
    Erase(id);
    if (fp == 0) return;
    // |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c.
    const uint64_t b1_max = cap_ > t1_.size() ? cap_ - t1_.size() : 1;
    if (t2) {
      b2_.Push(fp,
               std::max<uint64_t>(2 * cap_ - std::min(2 * cap_, entries_.size() + b1_.size()), 1));
    } else {
      b1_.Push(fp, b1_max);
    }
  }
  uint64_t Predecessor(uint64_t /*id*/) const { return 0; }
  std::optional<uint64_t> Coldest(uint64_t /*now*/) {
    if (!t1_.empty() && (static_cast<double>(t1_.size()) > p_ || t2_.empty())) return t1_.back();
    if (!t2_.empty()) return t2_.back();
    return std::nullopt;
  }

 private:
  struct Entry {
    std::list<uint64_t>::iterator pos;
    bool t2;
    uint64_t fingerprint;
  };
  std::list<uint64_t> t1_, t2_;  // front: most recent
  absl::flat_hash_map<uint64_t, Entry> entries_;
  GhostFifo b1_, b2_;
  double p_ = 0;
  uint64_t cap_ = 0;
};

}  // namespace fluxon
