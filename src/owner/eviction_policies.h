// Eviction policies for HotTier (src/owner/hot_tier.h): the owner's default, AdaptiveChainPolicy,
// and the baselines it is measured against in bench/eviction_policy_bench (S3-FIFO and ARC, page
// level as published). LruPolicy (page LRU) and ReusePredictionPolicy (the previous default) live
// in hot_tier.h.
//
// The policy interface (every policy here and in hot_tier.h), on HotTier's logical clock (one tick
// per admission or access):
//   Insert(id, after, now, refresh, fingerprint, weight)  admission (refresh) or S4 readmission
//   Touch(ids, now)          one access, restored prefix passed tail first
//   Erase(id)                dropped on request (delete by prefix): remembered nowhere
//   Evict(id)                dropped as a victim of TakeVictims: may enter a ghost list
//   Predecessor(id)          the cohort before it in its prompt (0: none known)
//   Coldest(now)             the next victim
// `fingerprint` identifies a cohort's content across its lifetimes (a hash of its first key; keys
// are chained hashes, so a page that comes back after a miss has the same one); 0 = unknown.
//
// ---------------------------------------------------------------------------------------------
// AdaptiveChainPolicy: chain tree + two experts + ghost regret (LeCaR-style weights).
//
// 1. Structure. Cohorts form chains (put batches in batch order, continued through the client's
//    parent-key hint), and chains form a tree: a batch whose parent is in the middle of a chain
//    (a shared system prompt, a forked conversation) splits that chain there, so the shared prefix
//    becomes its own chain with its own access statistics (one chain per radix-tree edge). Only a
//    leaf chain's tail is ever a victim: a prefix is never evicted while a longer prompt built on
//    it is kept (design §7: a miss at page i makes every later page useless). A cohort (atomic
//    group) is one entry and is never split.
// 2. Two experts rank the evictable chains:
//    - prediction: the chain whose next access is predicted last (each chain learns its reuse
//      period; overdue chains first) — Belady-like on cyclic multi-turn traffic, where recency is
//      exactly wrong (the least recently used conversation is the next to return);
//    - recency: the least recently used chain (LRU on chains, tail first) — right when popularity
//      is skewed and periods are noisy, and after a shift of the hot set.
// 3. Adaptation. Each victim chain is chosen by one expert: the one with the larger share of
//    decisions, given deterministically in proportion to the weights (a running credit, no random
//    numbers). While the experts disagree, the victim's fingerprint goes to a ghost FIFO tagged
//    with the expert that chose it; a victim both experts picked is not tagged. When a tagged page
//    is admitted again (it was evicted, then missed), the expert that evicted it pays regret d^age
//    (age in evictions since, d chosen so that regret falls to 0.005 at the ghost's length, as
//    LeCaR does), weight *= exp(-0.45 * regret), renormalised; weights stay in [0.001, 0.999] so
//    the losing expert keeps being sampled and the mix can swing back when the traffic changes.
//    The prior is prediction (0.999): the chains exist for it, and where no ghost ever comes back
//    (cyclic traffic at a small capacity: every evicted page returns after more evictions than
//    the ghost holds) there is no evidence either way, and prediction is the one that keeps a
//    stable subset of conversations whole.
//    A victim chain stays the victim until it is empty or accessed again, so misses concentrate in
//    few prompts instead of being spread over many (the cyclic trace's lesson).
// 4. Bounds. Metadata per live cohort and chain, plus a ghost FIFO of at most as many entries as
//    the most cohorts ever resident (so bounded by the capacity); nothing is kept per key that
//    left both. No state outlives its cohort except the ghost entry.
// Parameters: the learning rate 0.45 and the regret discount come from LeCaR; kRepeatFraction and
// kRecentTicks are ReusePredictionPolicy's (a probe then a read is one access; chains being served
// now are not victims). The mode lets the bench run each expert alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <list>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"

namespace fluxon {

class AdaptiveChainPolicy {
 public:
  enum class Mode { kAdaptive, kPredictionOnly, kRecencyOnly };
  enum Expert : int { kPrediction = 0, kRecency = 1, kNone = 2 };

  explicit AdaptiveChainPolicy(Mode mode = Mode::kAdaptive,
                               double prediction_weight = 1.0 - kMinWeight)
      : mode_(mode), weight_{prediction_weight, 1.0 - prediction_weight} {}

  void Insert(uint64_t id, uint64_t after, uint64_t now, bool refresh, uint64_t fingerprint = 0,
              uint64_t /*weight*/ = 1) {
    if (fingerprint != 0) GhostHit(fingerprint, /*penalize=*/refresh);
    uint64_t chain_id = 0;
    auto prev = after != 0 ? members_.find(after) : members_.end();
    if (prev != members_.end()) {
      Chain& p = chains_.at(prev->second.chain);
      if (p.cohorts.back() == after && prev->second.children == 0) {
        chain_id = prev->second.chain;  // continues its chain
      } else {
        if (p.cohorts.back() != after) Split(prev->second.chain, after);
        chain_id = NewChain(after, now);  // a branch off `after`
      }
    } else {
      chain_id = NewChain(0, now);
    }
    Chain& c = chains_.at(chain_id);
    const bool was_evictable = !c.cohorts.empty();
    if (was_evictable) Unindex(chain_id);
    c.cohorts.push_back(id);
    members_[id] = Member{chain_id, std::prev(c.cohorts.end()), 0, fingerprint};
    if (refresh) c.last = std::max(c.last, now);
    Reindex(chain_id);
    high_water_ = std::max<uint64_t>(high_water_, members_.size());
  }

  // One access: each distinct chain among `ids` learns the gap since its last access.
  void Touch(const std::vector<uint64_t>& ids, uint64_t now) {
    for (uint64_t id : ids) {
      auto m = members_.find(id);
      if (m == members_.end()) continue;
      const uint64_t chain_id = m->second.chain;
      Chain& c = chains_.at(chain_id);
      if (c.last == now) continue;  // already counted for this access
      Unindex(chain_id);
      const double gap = static_cast<double>(now - c.last);
      if (c.has_period && gap < kRepeatFraction * c.period) {
        // The same request again (a probe, then the read): not a new reuse gap.
      } else if (c.has_period) {
        c.period = 0.5 * c.period + 0.5 * gap;
      } else {
        c.has_period = true;
        c.period = gap;
      }
      c.last = now;
      Reindex(chain_id);
    }
  }

  void Erase(uint64_t id) {
    auto m = members_.find(id);
    if (m == members_.end()) return;
    const uint64_t chain_id = m->second.chain;
    Chain& c = chains_.at(chain_id);
    Unindex(chain_id);
    c.cohorts.erase(m->second.pos);
    members_.erase(m);
    if (!c.cohorts.empty()) {
      Reindex(chain_id);
      return;
    }
    const uint64_t parent = c.parent;
    chains_.erase(chain_id);
    if (parent != 0) {  // the parent may have become a leaf's tail
      auto p = members_.find(parent);
      if (p != members_.end() && p->second.children > 0 && --p->second.children == 0) {
        Unindex(p->second.chain);
        Reindex(p->second.chain);
      }
    }
  }

  void Evict(uint64_t id) {
    auto m = members_.find(id);
    if (m == members_.end()) return;
    const uint64_t fp = m->second.fingerprint;
    if (fp != 0) {
      const Expert tag = m->second.chain == victim_chain_ ? victim_tag_ : kNone;
      ghost_.push_back({fp, ++evictions_, tag});
      ghost_index_[fp] = evictions_;
      while (ghost_.size() > std::max<uint64_t>(high_water_, 1)) {
        auto g = ghost_index_.find(ghost_.front().fingerprint);
        if (g != ghost_index_.end() && g->second == ghost_.front().seq) ghost_index_.erase(g);
        ghost_.pop_front();
      }
    }
    Erase(id);
  }

  // The cohort before `id` in its prompt: its chain predecessor, or the cohort its chain branched
  // off (so a readmitted chain head goes back under its parent).
  uint64_t Predecessor(uint64_t id) const {
    auto m = members_.find(id);
    if (m == members_.end()) return 0;
    const Chain& c = chains_.at(m->second.chain);
    return m->second.pos == c.cohorts.begin() ? c.parent : *std::prev(m->second.pos);
  }

  std::optional<uint64_t> Coldest(uint64_t now) {
    if (chains_.empty()) return std::nullopt;
    // The current victim chain stays the victim until it is accessed again.
    auto sticky = chains_.find(victim_chain_);
    if (sticky != chains_.end() && sticky->second.indexed && sticky->second.last == victim_last_) {
      return sticky->second.cohorts.back();
    }
    std::optional<uint64_t> pred, rec;
    if (mode_ != Mode::kRecencyOnly) pred = PredictionVictim(now);
    if (mode_ != Mode::kPredictionOnly && !by_last_.empty()) rec = by_last_.begin()->second;
    Expert tag = kNone;
    uint64_t chain_id;
    if (pred && rec && *pred != *rec) {
      credit_ += weight_[kPrediction];
      if (credit_ >= 1.0) {
        credit_ -= 1.0;
        tag = kPrediction;
        chain_id = *pred;
      } else {
        tag = kRecency;
        chain_id = *rec;
      }
    } else if (pred || rec) {
      chain_id = pred ? *pred : *rec;
    } else {
      chain_id = chains_.begin()->first;  // no leaf (cannot happen in a tree): any tail
    }
    victim_chain_ = chain_id;
    victim_tag_ = tag;
    victim_last_ = chains_.at(chain_id).last;
    return chains_.at(chain_id).cohorts.back();
  }

  // Introspection for tests and the bench.
  double prediction_weight() const { return weight_[kPrediction]; }
  size_t ghost_size() const { return ghost_.size(); }
  size_t ghost_index_size() const { return ghost_index_.size(); }
  size_t chains() const { return chains_.size(); }
  size_t cohorts() const { return members_.size(); }

 private:
  static constexpr uint64_t kRecentTicks = 4;
  static constexpr double kRepeatFraction = 0.25;
  static constexpr double kLearningRate = 0.45;  // LeCaR's
  static constexpr double kMinWeight = 0.001;

  struct Chain {
    std::list<uint64_t> cohorts;  // head first
    uint64_t parent = 0;          // the cohort this chain branches off (0: a root)
    uint64_t last = 0;            // logical time of the last access
    double period = 0;
    bool has_period = false;
    bool indexed = false;  // in the expert indexes: a leaf (its tail has no branches)
    double indexed_pred = 0;
    double indexed_period = 0;
    uint64_t indexed_last = 0;
  };
  struct Member {
    uint64_t chain;
    std::list<uint64_t>::iterator pos;
    uint32_t children;  // chains branching off this cohort
    uint64_t fingerprint;
  };
  struct Ghost {
    uint64_t fingerprint;
    uint64_t seq;
    Expert tag;
  };

  uint64_t NewChain(uint64_t parent, uint64_t now) {
    const uint64_t id = ++last_chain_id_;
    Chain& c = chains_[id];
    c.parent = parent;
    c.last = now;
    if (parent != 0) {
      Member& p = members_.at(parent);
      if (p.children++ == 0) Unindex(p.chain);  // no longer a leaf's tail
    }
    return id;
  }

  // Moves the cohorts after `at` into a new chain branching off `at`, with the same statistics.
  void Split(uint64_t chain_id, uint64_t at) {
    Chain& c = chains_.at(chain_id);
    Unindex(chain_id);
    const uint64_t tail_id = ++last_chain_id_;
    Chain& t = chains_[tail_id];
    t.parent = at;
    t.last = c.last;
    t.period = c.period;
    t.has_period = c.has_period;
    t.cohorts.splice(t.cohorts.begin(), c.cohorts, std::next(members_.at(at).pos), c.cohorts.end());
    for (uint64_t id : t.cohorts) members_.at(id).chain = tail_id;
    ++members_.at(at).children;
    Reindex(tail_id);
    if (victim_chain_ == chain_id) victim_chain_ = 0;
  }

  void Reindex(uint64_t chain_id) {
    Chain& c = chains_.at(chain_id);
    if (c.indexed || c.cohorts.empty() || members_.at(c.cohorts.back()).children != 0) return;
    c.indexed = true;
    c.indexed_last = c.last;
    by_last_.emplace(c.last, chain_id);
    if (c.has_period) {
      c.indexed_pred = static_cast<double>(c.last) + c.period;
      c.indexed_period = c.period;
      by_pred_.emplace(c.indexed_pred, chain_id);
      period_sum_ += c.period;
      ++period_count_;
    } else {
      no_period_.emplace(c.last, chain_id);
    }
  }
  void Unindex(uint64_t chain_id) {
    Chain& c = chains_.at(chain_id);
    if (!c.indexed) return;
    c.indexed = false;
    by_last_.erase({c.indexed_last, chain_id});
    if (by_pred_.erase({c.indexed_pred, chain_id}) > 0) {
      period_sum_ -= c.indexed_period;
      --period_count_;
    } else {
      no_period_.erase({c.indexed_last, chain_id});
    }
  }

  // ReusePredictionPolicy's choice among the leaf chains.
  std::optional<uint64_t> PredictionVictim(uint64_t now) const {
    if (by_last_.empty()) return std::nullopt;
    const double mean = period_count_ > 0 ? period_sum_ / static_cast<double>(period_count_) : 0;
    const double t = static_cast<double>(now);
    if (!by_pred_.empty()) {  // finished chains first: overdue by more than a period
      const auto& [pred, chain_id] = *by_pred_.begin();
      if (t > pred + chains_.at(chain_id).period) return chain_id;
    }
    if (!no_period_.empty() && mean > 0) {
      const auto& [last, chain_id] = *no_period_.begin();
      if (t > static_cast<double>(last) + 2 * mean) return chain_id;
    }
    std::optional<std::pair<double, uint64_t>> best;
    std::optional<uint64_t> fallback;
    auto consider = [&](double pred, uint64_t chain_id) {
      if (!fallback) fallback = chain_id;
      if (chains_.at(chain_id).last + kRecentTicks > now) return false;
      if (!best || std::make_pair(pred, chain_id) > *best) best = {pred, chain_id};
      return true;
    };
    for (auto it = by_pred_.rbegin(); it != by_pred_.rend(); ++it) {
      if (consider(it->first, it->second)) break;
    }
    for (auto it = no_period_.rbegin(); it != no_period_.rend(); ++it) {
      if (consider(static_cast<double>(it->first) + mean, it->second)) break;
    }
    if (best) return best->second;
    return fallback;
  }

  void GhostHit(uint64_t fingerprint, bool penalize) {
    auto g = ghost_index_.find(fingerprint);
    if (g == ghost_index_.end()) return;
    const uint64_t seq = g->second;
    ghost_index_.erase(g);
    if (!penalize || ghost_.empty() || seq < ghost_.front().seq) return;
    const Ghost& entry = ghost_[seq - ghost_.front().seq];
    if (entry.tag == kNone) return;
    // LeCaR: regret discounted to 0.005 over the ghost's length.
    const double n = static_cast<double>(std::max<size_t>(ghost_.size(), 1));
    const double regret = std::pow(0.005, static_cast<double>(evictions_ - seq) / n);
    weight_[entry.tag] *= std::exp(-kLearningRate * regret);
    const double sum = weight_[0] + weight_[1];
    for (double& w : weight_) w = std::clamp(w / sum, kMinWeight, 1.0 - kMinWeight);
  }

  Mode mode_;
  absl::node_hash_map<uint64_t, Chain> chains_;  // stable references; newer chains: larger ids
  uint64_t last_chain_id_ = 0;
  absl::flat_hash_map<uint64_t, Member> members_;
  std::set<std::pair<uint64_t, uint64_t>> by_last_;    // (last access, leaf chain)
  std::set<std::pair<double, uint64_t>> by_pred_;      // (predicted next access, leaf chain)
  std::set<std::pair<uint64_t, uint64_t>> no_period_;  // (last access, leaf chain), no period yet
  double period_sum_ = 0;                              // over the leaf chains with a period
  uint64_t period_count_ = 0;
  // The victim chain and the expert that chose it.
  uint64_t victim_chain_ = 0;
  uint64_t victim_last_ = 0;
  Expert victim_tag_ = kNone;
  // Ghosts: (fingerprint, eviction sequence, tag), oldest first; the index maps a fingerprint to
  // its newest sequence number. ghost_ holds consecutive sequence numbers.
  std::deque<Ghost> ghost_;
  absl::flat_hash_map<uint64_t, uint64_t> ghost_index_;
  uint64_t evictions_ = 0;
  uint64_t high_water_ = 0;  // the most cohorts ever resident: bounds the ghost FIFO
  double weight_[2];         // prior: prediction (see 3.)
  double credit_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Baselines for the bench (page level, as published; no chains: Predecessor is always 0). Their
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
