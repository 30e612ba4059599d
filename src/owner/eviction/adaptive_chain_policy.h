// AdaptiveChainPolicy: the owner's eviction policy for HotTier (src/owner/hot_tier.h), one header
// per production policy. The baselines it is measured against (page and cohort LRU, the previous
// ReusePredictionPolicy, S3-FIFO, ARC) and the trace replay live in bench/eviction/, built only
// into the benchmarks and tests.
//
// The policy interface (every policy here and in hot_tier.h), on HotTier's logical clock (one tick
// per admission or access):
//   Insert(id, after, now, refresh, fingerprint, weight)  admission (refresh) or S4 readmission
//   Touch(ids, now)          one access, restored prefix passed tail first
//   Erase(id)                dropped on request (delete by prefix): remembered nowhere
//   Evict(id)                dropped as a victim of TakeVictims: may enter a ghost list
//   EvictReturningPredecessor(id)  (optional) Predecessor(id), then Evict(id), in one lookup
//   Predecessor(id)          the cohort before it in its prompt (0: none known)
//   Coldest(now)             the next victim
// `fingerprint` identifies a cohort's content across its lifetimes (a hash of its first key; keys
// are chained hashes, so a page that comes back after a miss has the same one); 0 = unknown.
//
// ---------------------------------------------------------------------------------------------
// AdaptiveChainPolicy: chain tree + probation (one-hit filter) + two experts + ghost regret.
//
// 1. Structure. Cohorts form chains (put batches in batch order, continued through the client's
//    parent-key hint), and chains form a tree: a batch whose parent is in the middle of a chain
//    (a shared system prompt, a forked conversation) splits that chain there, so the shared prefix
//    becomes its own chain with its own access statistics (one chain per radix-tree edge).
//    While the chains' periods are regular (PeriodsRegular: round-barrier traffic) or the
//    probation target is low (see 2: pages put once seldom come back), a chain that has been
//    such a prefix stays one: a later put after its tail starts a branch even when no
//    branch is left (the conversations that hung off a system prompt were evicted), so the new
//    pages are a chain on probation of their own, not the tail of the prompt's chain with the
//    prompt's period, which a victim emptying it would follow into the prompt. A conversation's
//    own turns still continue its chain. (Always on, the rule put too many first turns of
//    popular Zipf conversations on probation: the acceptance mix at 10 % fell below ARC.)
//    Invariants: E1 only a leaf chain's tail is ever a victim, so a prefix is never evicted while
//    a longer prompt built on it is kept (design §7: a miss at page i makes every later page
//    useless); E2 a cohort (atomic group) is one entry and is never split; E3 only a chain's tail
//    can have branches (a branch off the middle splits the chain first).
// 2. Probation (S3-FIFO's small queue, ARC's adaptive split, on chains). A chain that has not been
//    accessed since its put is on probation; its first access (a restore of any of its pages)
//    ends it. While the probation chains hold more than a target share of the resident weight,
//    one of them is the victim: the one-hit filter (a scan, a conversation that never comes back)
//    that neither expert below is. Not simply the oldest: the one with the largest weight times
//    age (requests since its put), the space-time it has held without being read, chosen again
//    for every victim. Age alone would keep a long one-hit prompt (a scan of 48 pages, a
//    conversation that returns only after more than the capacity) as long as a short first turn
//    that comes back; weight times age takes the long one first, then any chain whose wait
//    has grown as costly. The target adapts as ARC's p does, on the ghosts (see 4):
//    a page evicted from probation that comes back raises it, one evicted from the rest lowers
//    it, by kTargetStep of the resident weight times the ratio of the other ghost population to
//    this one's. It starts at 1 (probation unlimited, no filtering): on cyclic traffic every
//    probation chain comes back and the target stays high; where once-seen chains do not come
//    back, only the main part's victims return and the target falls. A new chain whose first page
//    is a ghost (evicted, then missed) skips probation, as a ghost hit goes to S3-FIFO's main
//    queue. A put whose pages change between ghosts and pages not seen recently starts a new
//    chain (a branch) at each change: a miss that puts back an evicted shared prefix (a system
//    prompt) and a new conversation after it makes two chains, the prefix off probation and the
//    conversation on it, each with its own statistics; as one chain the prefix was emptied with
//    the conversation's tail.
// 3. Two experts rank the evictable (leaf) chains when probation is within its target:
//    - prediction: the chain whose next access is predicted last (each chain learns its reuse
//      period; overdue chains first) — Belady-like on cyclic multi-turn traffic, where recency is
//      exactly wrong (the least recently used conversation is the next to return);
//    - recency: the least recently used chain (LRU on chains, tail first) — right when popularity
//      is skewed and periods are noisy, and after a shift of the hot set.
//    A chain on probation has no period yet: prediction places its next access after the larger
//    of the mean period and the reuse gap of pages that came back after eviction (an EWMA kept
//    from the ghosts, which remember their chain's last access).
//    A chain overdue by more than (1 + slack) of its periods is finished (a conversation that
//    ended) and goes first. The slack adapts on the ghosts, as the probation target does: a page
//    evicted as finished that comes back within kLateReturn periods of its chain's last access
//    was late, not finished, and raises it by kSlackUp (to at most kMaxSlack); each page evicted
//    as finished lowers it by kSlackDown. On round-barrier traffic every conversation comes back
//    within two rounds, however late the shuffled order puts it, and the slack rises until the
//    rule stops taking conversations that are merely late; where chains do end (a Zipf
//    conversation that restarts), their pages do not come back and it stays near 0.
//    Where they disagree, each chooses its weight's share of the victims, deterministically
//    (smooth weighted round robin on running credits, no random numbers) — except while the
//    chains' periods lie close together (PeriodsRegular: round-barrier traffic, where every
//    conversation returns once a round), when prediction chooses, untagged; the probation filter
//    (2) does not go first then either: a chain put and not yet read again is a conversation its
//    next round reads, and prediction places it with the others.
// 4. Regret (LeCaR). Every victim's fingerprint goes to a ghost FIFO, tagged with whether it was
//    on probation and, while the experts disagreed, with the expert that chose it. When a tagged
//    page is admitted again, that expert pays regret d^age (age in evictions since, d chosen so
//    that regret falls to 0.005 at the ghost's length, as LeCaR does), divided by its weight (at
//    least kRegretFloor: EXP3's importance weighting, so an expert chosen rarely is not favoured
//    for being caught rarely); weight *= exp(-0.45 * that), renormalised, each weight at least
//    kMinWeight so the mix can swing back when the traffic changes. The prior is prediction
//    (1 - kMinWeight): the chains exist for it, and where no ghost ever comes back (cyclic traffic
//    at a small capacity: every evicted page returns after more evictions than the ghost holds)
//    there is no evidence either way, and prediction is the one that keeps a stable subset of
//    conversations whole.
//    A victim chain stays the victim until it is empty or accessed again, so misses concentrate in
//    few prompts instead of being spread over many (the cyclic trace's lesson), but only while
//    the stage that chose it (the filter, or the expert) would still choose it: when another
//    chain's prediction overtakes it (a conversation served meanwhile, never to return), the
//    choice is made again instead of emptying a chain that comes back next.
//    Periods are measured on a request clock, not on HotTier's call clock: one tick per restore
//    (the read right after a probe of the same prefix is the same request) and per put that
//    continues nothing stored (a miss). On the call clock a hit costs three ticks (probe, read,
//    put) and a miss one, so the first period of a conversation depended on how many of the
//    requests before it hit (on cyclic multi-turn traffic the conversations put first in the
//    first round learnt periods a third shorter than the last ones, and the last one was
//    evicted as "predicted last" just before its turn).
// 5. Bounds. Metadata per live cohort and chain, plus a ghost FIFO of at most as many entries as
//    the most cohorts ever resident (so bounded by the capacity) and its index, which drops the
//    entries of ghosts that left the FIFO in one pass when it holds twice that; nothing else is
//    kept per key that left both. No state outlives its cohort except the ghost entry and the
//    chain pool's free slots (as many slots as chains were ever live at once, each keeping at
//    most a small vector's storage for the next chain).
// 6. Cost (per access, amortised; no allocation per page but the ghost's): a restored prefix costs
//    one hash lookup per chain, not per page (its pages are matched against the chain's vector);
//    each touched chain moves to the front of an intrusive recency list (O(1)) and is re-keyed in
//    the prediction index (a btree) only when its predicted time changes: a repeat (the read
//    right after the probe) updates the recency only. A put re-keys its chain once, not per page;
//    a tail eviction re-keys nothing unless the chain empties. The probation FIFO is the index of
//    the chains without a period, which prediction needs anyway; the filter also keeps one FIFO
//    per weight class (the bit width of the weight, re-filed when a put or an eviction moves a
//    chain across a power of 2) and compares the oldest chain of each non-empty class, so its
//    choice is within a factor of 2 of the largest weight times age at a cost of one comparison
//    per class.
// Parameters: the learning rate 0.45 and the regret discount come from LeCaR, the target's rule
// from ARC; kRepeatFraction is ReusePredictionPolicy's (a probe then a read is one access);
// kRecentTicks (chains accessed at the current tick, the access being served, are not victims)
// is 1 where ReusePredictionPolicy has 4. The mode lets the bench run each expert alone (no
// probation).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <deque>
#include <iterator>
#include <limits>
#include <list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "common/check.h"

namespace fluxon {

class AdaptiveChainPolicy {
 public:
  enum class Mode { kAdaptive, kPredictionOnly, kRecencyOnly };
  enum Expert : int { kPrediction = 0, kRecency = 1 };
  static constexpr int kExperts = 2;
  static constexpr double kMinWeight = 1e-4;

  explicit AdaptiveChainPolicy(Mode mode = Mode::kAdaptive,
                               double prediction_weight = 1.0 - kMinWeight)
      : mode_(mode), weight_{prediction_weight, 1.0 - prediction_weight} {}
  AdaptiveChainPolicy(const AdaptiveChainPolicy&) = delete;
  AdaptiveChainPolicy& operator=(const AdaptiveChainPolicy&) = delete;

  void Insert(uint64_t id, uint64_t after, uint64_t now, bool refresh, uint64_t fingerprint = 0,
              uint64_t weight = 1) {
    const std::optional<uint64_t> ghost_last_request =
        fingerprint != 0 ? GhostHit(fingerprint, /*penalize=*/refresh) : std::nullopt;
    const bool ghost_hit = ghost_last_request.has_value();
    // A page back after its eviction: the gap since its chain's last access is a reuse gap that
    // no chain's period shows (the chain is gone). + 1: this put's request (counted below when
    // the put continues nothing).
    if (ghost_hit && refresh) NoteReturnedGap(requests_ + 1 - *ghost_last_request);
    victim_verified_ = false;
    Chain* c = nullptr;
    // `after`'s chain and position: the cohort inserted last (the next page of one put: no
    // lookup), or found.
    Chain* p = nullptr;
    uint32_t pos = 0;
    if (after != 0 && after == last_inserted_) {
      p = last_inserted_chain_;
      pos = static_cast<uint32_t>(p->cohorts.size() - 1);
    } else if (after != 0) {
      if (auto prev = members_.find(after); prev != members_.end()) {
        p = prev->second.chain;
        pos = prev->second.pos;
      }
    }
    // A put that continues no stored prompt is a request of its own (a miss); one that continues
    // a stored cohort belongs to the request that restored it.
    if (refresh && p == nullptr) ++requests_;
    last_touch_front_ = 0;
    // The next page of one put that is a ghost where the page before was not, or the reverse:
    // a new chain from here (see 2: returning and new content get their own statistics).
    const bool ghost_boundary =
        refresh && p != nullptr && after == last_inserted_ && ghost_hit != last_inserted_ghost_;
    last_inserted_ghost_ = ghost_hit;
    if (p != nullptr) {
      // A later put after a chain that has been a shared prefix starts a branch while the
      // periods are regular or the probation target is low (see 1).
      const bool extends_shared = refresh && p->shared && p->last != now &&
                                  (PeriodsRegular() || target_ < kBranchBelowTarget);
      if (pos + 1 == p->cohorts.size() && p->tail_children == 0 && !ghost_boundary &&
          !extends_shared) {
        c = p;  // continues its chain
      } else {
        if (pos + 1 != p->cohorts.size()) Split(p, pos);
        p->shared = true;
        c = NewChain(after, now);  // a branch off `after`
      }
    } else {
      c = NewChain(0, now);
    }
    if (ghost_hit && refresh && c->cohorts.empty()) {
      // A new chain whose first page was evicted and is back: not on probation (S3-FIFO and
      // ARC: a ghost hit goes to the main queue); its period is not known yet, the mean stands in.
      c->has_period = true;
      c->period = period_count_ > 0 ? period_sum_ / static_cast<double>(period_count_) : 1.0;
    }
    const bool refreshes = refresh && now > c->last;
    if (refreshes) Unindex(c);
    c->cohorts.push_back(id);
    c->weight += weight;
    total_weight_ += weight;
    if (InProbation(c)) {
      probation_weight_ += weight;
      Reclass(c);
    }
    if (refreshes) {
      c->last = now;
      c->last_request = requests_;
      MoveToFront(c);
    }
    members_[id] = Member{c, static_cast<uint32_t>(c->cohorts.size() - 1), weight, fingerprint};
    Reindex(c);
    high_water_ = std::max<uint64_t>(high_water_, members_.size());
    last_inserted_ = id;  // the tail of c until a cohort is erased or c splits (both reset it)
    last_inserted_chain_ = c;
  }

  // One access: each distinct chain among `ids` learns the gap since its last access. `ids` is
  // normally a restored prefix, tail first: after one lookup, the pages before it in its chain are
  // matched against the chain itself.
  void Touch(const std::vector<uint64_t>& ids, uint64_t now) {
    if (ids.empty()) return;
    victim_verified_ = false;
    // The read right after a probe of the same prefix is the same request.
    if (ids.front() != last_touch_front_) ++requests_;
    last_touch_front_ = ids.front();
    for (size_t i = 0; i < ids.size();) {
      auto m = members_.find(ids[i++]);
      if (m == members_.end()) continue;
      Chain* c = m->second.chain;
      uint32_t pos = m->second.pos;
      while (pos > 0 && i < ids.size() && ids[i] == c->cohorts[pos - 1]) {
        --pos;
        ++i;
      }
      TouchChain(c, now);
    }
  }

  void Erase(uint64_t id) {
    auto m = members_.find(id);
    if (m == members_.end()) return;
    victim_verified_ = false;
    EraseMember(m);
  }

  void Evict(uint64_t id) { EvictReturningPredecessor(id); }

  // Evict, returning what Predecessor(id) returned before it (0 when `id` is not here).
  uint64_t EvictReturningPredecessor(uint64_t id) {
    auto m = members_.find(id);
    if (m == members_.end()) return 0;
    // Taking the victim chain's tail while the chain keeps a cohort changes nothing the stage
    // that chose it reads (its index keys stay; see StillChosen's cache); anything else may.
    Chain* const chain = m->second.chain;
    if (chain != victim_ || chain->cohorts.size() < 2 || chain->cohorts.back() != id) {
      victim_verified_ = false;
    }
    const uint64_t fp = m->second.fingerprint;
    if (fp != 0) {
      uint8_t tag = chain == victim_ ? victim_tag_ : 0;  // experts that chose it
      if (InProbation(chain)) {
        tag |= kProbationBit;
        ++probation_ghosts_;
      }
      if (chain == victim_ && victim_source_ == kByPrediction && Finished(*chain)) {
        tag |= kFinishedBit;
        slack_ = std::max(slack_ - kSlackDown, 0.0);
        // A lower slack may make another chain finished: the stage is asked again.
        victim_verified_ = false;
      }
      ghost_.push_back(
          {fp, ++evictions_, tag, static_cast<float>(chain->period), chain->last_request});
      ghost_index_[fp] = evictions_;
      const uint64_t bound = std::max<uint64_t>(high_water_, 1);
      while (ghost_.size() > bound) {
        if (ghost_.front().tag & kProbationBit) --probation_ghosts_;
        ghost_.pop_front();
      }
      // The index keeps the entries of ghosts that left the FIFO (older than its front, so
      // GhostHit ignores them) until it holds twice as many as the FIFO may: then one pass drops
      // them all. A lookup per eviction into a table this size misses the cache; a pass over it
      // per `bound` evictions reads it in order.
      if (ghost_index_.size() > 2 * bound) {
        const uint64_t oldest = ghost_.front().seq;
        absl::erase_if(ghost_index_, [oldest](const auto& e) { return e.second < oldest; });
      }
    }
    const uint64_t before = m->second.pos == 0 ? chain->parent : chain->cohorts[m->second.pos - 1];
    EraseMember(m);
    return before;
  }

  // The cohort before `id` in its prompt: its chain predecessor, or the cohort its chain branched
  // off (so a readmitted chain head goes back under its parent).
  uint64_t Predecessor(uint64_t id) const {
    auto m = members_.find(id);
    if (m == members_.end()) return 0;
    const Chain* c = m->second.chain;
    return m->second.pos == 0 ? c->parent : c->cohorts[m->second.pos - 1];
  }

  std::optional<uint64_t> Coldest(uint64_t now) {
    if (chains_.live() == 0) return std::nullopt;
    // The current victim chain stays the victim until it is accessed again.
    if (victim_ != nullptr && victim_->indexed && victim_->last == victim_last_ &&
        VictimStillChosen(now)) {
      return victim_->cohorts.back();
    }
    victim_verified_ = false;
    // The filter first: probation over its target share gives up its oldest chain. Not while the
    // periods are regular: prediction chooses every victim then (see 3).
    if (mode_ == Mode::kAdaptive && !PeriodsRegular()) {
      if (Chain* c = FilterVictim(); c != nullptr) return SetVictim(c, 0, kByFilter);
    }
    Chain* cand[kExperts] = {nullptr, nullptr};
    if (mode_ != Mode::kRecencyOnly) cand[kPrediction] = PredictionVictim(now);
    if (mode_ != Mode::kPredictionOnly) cand[kRecency] = RecencyVictim();
    if (cand[kPrediction] == nullptr || cand[kRecency] == nullptr ||
        cand[kPrediction] == cand[kRecency]) {
      Chain* c = cand[kPrediction] != nullptr ? cand[kPrediction] : cand[kRecency];
      // No leaf (cannot happen): any tail.
      const uint64_t id = SetVictim(c != nullptr ? c : lru_tail_, 0,
                                    cand[kPrediction] != nullptr ? kByPrediction : kByRecency);
      Verified(c != nullptr, now);
      return id;
    }
    // Regular traffic: when the chains' periods hardly differ (round-barrier multi-turn, where
    // every conversation comes back once a round), prediction chooses, whatever the weights say
    // (the ghost regret cannot tell the experts apart there: see 4). The victim carries no
    // expert's tag: the rule chose it, not the weights, so its ghost moves no weight.
    if (PeriodsRegular()) {
      const uint64_t id = SetVictim(cand[kPrediction], 0, kByPrediction);
      Verified(true, now);
      return id;
    }
    // They disagree: smooth weighted round robin (each gains its weight in credit, the richer
    // one chooses and pays 1), so each expert chooses its weight's share of the decisions.
    int best = kPrediction;
    for (int i = 0; i < kExperts; ++i) {
      credit_[i] += weight_[i];
      if (credit_[i] > credit_[best]) best = i;
    }
    credit_[best] -= 1.0;
    const uint64_t id =
        SetVictim(cand[best], uint8_t{1} << best, best == kPrediction ? kByPrediction : kByRecency);
    Verified(true, now);
    return id;
  }

  // Whether the standard deviation of the indexed chains' log periods is below kRegularSpread
  // (periods within about a factor of 1.5 of each other), the online sign of round-barrier
  // traffic; Zipf popularity spreads periods over orders of magnitude. It takes at least
  // kRegularMinChains chains with a period; with fewer, the reading last taken over at least
  // kRegularRememberChains stands (false before any): a small cache on round-barrier traffic
  // holds few conversations long enough to learn a period, and the traffic has not changed.
  bool PeriodsRegular() const {
    if (period_count_ < kRegularMinChains) return remembered_regular_;
    return SpreadIsRegular();
  }

  // Introspection for tests and the bench.
  double weight(Expert e) const { return weight_[e]; }
  double prediction_weight() const { return weight_[kPrediction]; }
  uint64_t probation_weight() const { return probation_weight_; }
  // Probation's target share of the resident weight (ARC's p, as a fraction).
  double probation_target() const { return target_; }
  size_t ghost_size() const { return ghost_.size(); }
  // The reuse gap of pages that came back after eviction (requests; 0: none yet).
  double returned_gap() const { return returned_gap_; }
  // The finished rule's slack, in periods (see 3).
  double finished_slack() const { return slack_; }
  size_t ghost_index_size() const { return ghost_index_.size(); }
  size_t chains() const { return chains_.live(); }
  size_t cohorts() const { return members_.size(); }

  // The structure's invariants, checked in full (tests): empty when they hold, else the first
  // broken one. Every member names a live chain that lists it at its position; every chain is
  // non-empty, on the recency list once, weighs its members, and is indexed exactly when its
  // tail has no branches, in the index its period says; the class mask names the non-empty
  // classes; the victim, if any, is a live chain.
  std::string CheckInvariants() const {
    auto live = [&](const Chain* c) { return c != nullptr && c->alive; };
    uint64_t weight = 0, probation = 0, periods = 0;
    for (const auto& [id, m] : members_) {
      if (!live(m.chain)) return "member " + std::to_string(id) + " names a dead chain";
      if (m.pos >= m.chain->cohorts.size() || m.chain->cohorts[m.pos] != id) {
        return "member " + std::to_string(id) + " is not at its position in its chain";
      }
      weight += m.weight;
    }
    if (weight != total_weight_) return "total weight differs from the members' sum";
    size_t listed = 0;
    for (const Chain* c = lru_head_; c != nullptr; c = c->older) {
      if (!live(c)) return "a dead chain on the recency list";
      if (++listed > chains_.live()) return "the recency list loops";
      if (c->older == nullptr && c != lru_tail_) return "the recency list's tail is wrong";
    }
    if (listed != chains_.live()) return "the recency list misses chains";
    for (const Chain& c : chains_.slots()) {
      if (!c.alive) continue;
      const uint64_t id = c.id;
      if (c.cohorts.empty()) return "chain " + std::to_string(id) + " is empty";
      uint64_t w = 0;
      for (uint64_t m : c.cohorts) {
        auto it = members_.find(m);
        if (it == members_.end() || it->second.chain != &c) {
          return "chain " + std::to_string(id) + " lists a cohort that is not its member";
        }
        w += it->second.weight;
      }
      if (w != c.weight) return "chain " + std::to_string(id) + " weight differs";
      if (c.indexed != (c.tail_children == 0)) {
        return "chain " + std::to_string(id) + " indexed but not a leaf, or a leaf not indexed";
      }
      if (!c.indexed) continue;
      if (c.has_period) {
        ++periods;
        if (!by_pred_.contains({c.indexed_pred, c.id, const_cast<Chain*>(&c)})) {
          return "chain " + std::to_string(id) + " missing from the prediction index";
        }
      } else {
        probation += c.weight;
        // PredictionVictim finds the newest chain not recent by this order.
        if (c.indexed_last != c.last) {
          return "chain " + std::to_string(id) + " on probation is indexed at another last access";
        }
        const LastKey k{c.indexed_last, c.id, const_cast<Chain*>(&c)};
        if (!no_period_.contains(k) || !by_class_[c.indexed_class].contains(k)) {
          return "chain " + std::to_string(id) + " missing from the probation indexes";
        }
      }
    }
    if (periods != period_count_ || by_pred_.size() != period_count_) {
      return "the prediction index holds other chains than the indexed ones with a period";
    }
    if (probation != probation_weight_) return "probation weight differs";
    size_t in_classes = 0;
    for (int k = 0; k < 64; ++k) {
      if (by_class_[k].empty() == ((class_mask_ >> k) & 1)) return "class mask is wrong";
      in_classes += by_class_[k].size();
    }
    if (in_classes != no_period_.size()) return "the class index holds other chains";
    for (const LastKey& k : no_period_) {
      if (!live(k.chain)) return "a dead chain in the probation index";
    }
    if (victim_ != nullptr && !live(victim_)) return "the victim is a dead chain";
    return "";
  }

 private:
  // Prediction passes over the chains accessed in the last kRecentTicks ticks: the access being
  // served. ReusePredictionPolicy's 4 also covered the request before (a hit is three ticks:
  // probe, read, put), whose conversation is, on round-barrier traffic, the one that returns
  // last (the generalisation suite's tuning half: 1 gained 44 barrier cells, 2 fewer;
  // docs/perf.md).
  static constexpr uint64_t kRecentTicks = 1;
  static constexpr double kRepeatFraction = 0.25;
  // The overdue rule for chains without a period needs a period for at least one indexed chain
  // in kMinPeriodShare + 1 (PredictionVictim).
  static constexpr uint64_t kMinPeriodShare = 4;
  static constexpr double kLearningRate = 0.45;  // LeCaR's
  // The probation target moves by this share of the resident weight per ghost hit (times ARC's
  // ratio of the two ghost populations), between 0 and 1 (probation unlimited: the start).
  static constexpr double kTargetStep = 0.01;
  // Below this probation target, new pages after a shared prefix are a branch (see 1): chosen
  // on the generalisation suite's tuning half (0.2: 849 -> 851 cells at or above the best
  // baseline, 165 -> 155 more than 0.5 below; 0.5 put the acceptance mix at 10 % below ARC;
  // docs/perf.md).
  static constexpr double kBranchBelowTarget = 0.2;
  // EXP3's importance weighting: regret is divided by the chooser's weight (at least this), so
  // an expert that is rarely chosen is not favoured for being rarely caught.
  static constexpr double kRegretFloor = 0.01;
  // PeriodsRegular: chosen on the generalisation suite's tuning half (bench/eviction_suite.cc;
  // 0.3 to 0.6 all gained there, 0.4 most without a family losing cells; docs/perf.md).
  static constexpr double kRegularSpread = 0.4;
  static constexpr uint64_t kRegularMinChains = 8;
  // The reading that stands while fewer than kRegularMinChains chains have a period is the last
  // one taken over at least this many (chosen on the tuning half: 16; a reading taken over 8, as
  // few as the rule asks for, stood from the first requests of the acceptance mix and put its
  // 10 % cell below ARC; docs/perf.md).
  static constexpr uint64_t kRegularRememberChains = 16;
  // returned_gap_'s EWMA rate, per page back from a ghost: chosen on the generalisation suite's
  // tuning half (0.01-0.05 all gained there) with the acceptance tables (bench_eviction_policy)
  // kept at or above the baselines (0.02 and 0.04 each put one cell below; docs/perf.md).
  static constexpr double kReturnedGapRate = 0.03;
  static constexpr uint8_t kProbationBit = 4;  // ghost tag: evicted while on probation
  static constexpr uint8_t kFinishedBit = 8;   // ghost tag: evicted as finished (overdue)
  // The finished rule's slack (see 3): chosen on the generalisation suite's tuning half
  // (docs/perf.md). kLateReturn bounds what counts as a late return: a page back after more
  // periods than that is a chain that restarted or a long tail, no evidence either way.
  static constexpr double kSlackUp = 0.02;
  static constexpr double kSlackDown = 0.01;
  static constexpr double kMaxSlack = 4;
  static constexpr double kLateReturn = 2.5;

  struct Chain {
    uint64_t id = 0;                // newer chains: larger ids (ties in the indexes)
    std::vector<uint64_t> cohorts;  // head first
    uint64_t parent = 0;            // the cohort this chain branches off (0: a root)
    uint32_t tail_children = 0;     // chains branching off the tail (E3: only the tail has any)
    uint64_t last = 0;              // logical time of the last access
    uint64_t last_request = 0;      // the request count at the last access
    uint64_t weight = 0;            // sum of the cohorts' weights
    double period = 0;
    bool has_period = false;  // accessed since its put (no period: on probation)
    bool indexed = false;     // in the expert indexes: a leaf (its tail has no branches)
    double indexed_pred = 0;
    double indexed_period = 0;
    double indexed_log_period = 0;  // log(max(indexed_period, 1)), computed once
    uint64_t indexed_last = 0;
    int indexed_class = 0;   // on probation: its weight class (by_class_)
    Chain* newer = nullptr;  // recency list, every chain
    Chain* older = nullptr;
    bool alive = false;  // in use (ChainPool): a freed slot is kept for the next chain
    // A prefix: a chain has branched off its tail (or it was split) at some time. A later put
    // after it starts a branch even when no branch is left (see 1).
    bool shared = false;
  };
  // The chains, at stable addresses, their slots reused. A chain is made for every put that
  // continues nothing, every branch and every split, and dropped when it empties; a hash-map
  // node per chain cost a malloc and a free each time, and its vector another. The pool has as many
  // slots as chains were ever live at once (each chain holds a cohort, so at most the most cohorts
  // ever resident); a freed slot keeps its vector's storage up to kKeptCapacity ids, so the storage
  // kept is bounded by that many per slot.
  class ChainPool {
   public:
    Chain* New(uint64_t id) {
      Chain* c;
      if (free_.empty()) {
        c = &slots_.emplace_back();
      } else {
        c = free_.back();
        free_.pop_back();
        std::vector<uint64_t> storage = std::move(c->cohorts);
        *c = Chain{};
        c->cohorts = std::move(storage);
      }
      c->id = id;
      c->alive = true;
      ++live_;
      return c;
    }
    void Free(Chain* c) {
      FLUXON_DCHECK(c->alive, "a chain freed twice");
      c->alive = false;
      c->cohorts.clear();
      if (c->cohorts.capacity() > kKeptCapacity) std::vector<uint64_t>().swap(c->cohorts);
      free_.push_back(c);
      --live_;
    }
    size_t live() const { return live_; }
    // Every slot, live or free (alive tells): for the invariant checks.
    const std::deque<Chain>& slots() const { return slots_; }

   private:
    static constexpr size_t kKeptCapacity = 16;
    std::deque<Chain> slots_;  // a deque: growing it moves no chain
    std::vector<Chain*> free_;
    size_t live_ = 0;
  };
  struct Member {
    Chain* chain;
    uint32_t pos;  // index in chain->cohorts
    uint64_t weight;
    uint64_t fingerprint;
  };
  // Drops member `m` from its chain (and the chain when it empties).
  void EraseMember(absl::flat_hash_map<uint64_t, Member>::iterator m) {
    last_inserted_ = 0;
    Chain* c = m->second.chain;
    const uint32_t pos = m->second.pos;
    const uint64_t w = m->second.weight;
    members_.erase(m);
    const bool tail = pos + 1 == c->cohorts.size();
    c->weight -= w;
    total_weight_ -= w;
    if (InProbation(c)) {
      probation_weight_ -= w;
      Reclass(c);
    }
    if (tail) {
      c->cohorts.pop_back();
      c->tail_children = 0;  // branches off an erased cohort hang on nothing (E3)
    } else {
      c->cohorts.erase(c->cohorts.begin() + pos);
      for (uint32_t j = pos; j < c->cohorts.size(); ++j) members_.at(c->cohorts[j]).pos = j;
    }
    if (c->cohorts.empty()) {
      DestroyChain(c);
    } else if (tail) {
      Reindex(c);  // the new tail has no branches: a leaf now, if it was not
    }
  }

  struct Ghost {
    uint64_t fingerprint;
    uint64_t seq;
    uint8_t tag;   // bit e: expert e chose this victim; kProbationBit: it was on probation;
                   // kFinishedBit: evicted as finished
    float period;  // its chain's period (0: none)
    uint64_t last_request;  // its chain's request count at its last access
  };
  struct PredKey {
    double pred;
    uint64_t id;
    Chain* chain;
    bool operator<(const PredKey& o) const {
      return pred < o.pred || (pred == o.pred && id < o.id);
    }
  };
  struct LastKey {
    uint64_t last;
    uint64_t id;
    Chain* chain;
    bool operator<(const LastKey& o) const {
      return last < o.last || (last == o.last && id < o.id);
    }
  };

  static bool InProbation(const Chain* c) { return c->indexed && !c->has_period; }

  void TouchChain(Chain* c, uint64_t now) {
    if (c->last == now) return;  // already counted for this access
    const double gap = static_cast<double>(requests_ - c->last_request);
    c->last_request = requests_;
    if (c->has_period && gap < kRepeatFraction * c->period) {
      // The same request again (a probe, then the read): not a new reuse gap; the predicted
      // time moves by less than a quarter period, so the index keeps its key.
      c->last = now;
      MoveToFront(c);
      return;
    }
    Unindex(c);
    if (c->has_period) {
      c->period = 0.5 * c->period + 0.5 * gap;
    } else {
      c->has_period = true;  // leaves probation
      c->period = gap;
    }
    c->last = now;
    MoveToFront(c);
    Reindex(c);
  }

  Chain* NewChain(uint64_t parent, uint64_t now) {
    const uint64_t id = ++last_chain_id_;
    Chain& c = *chains_.New(id);
    c.parent = parent;
    c.last = now;
    c.last_request = requests_;
    PushFront(&c);
    if (parent != 0) {
      Chain* p = members_.at(parent).chain;
      if (p->tail_children++ == 0) Unindex(p);  // no longer a leaf
    }
    return &c;
  }

  void DestroyChain(Chain* c) {
    Unindex(c);
    Unlink(c);
    if (victim_ == c) victim_ = nullptr;
    if (c->parent != 0) {  // the parent may have become a leaf's tail
      auto p = members_.find(c->parent);
      if (p != members_.end()) {
        Chain* pc = p->second.chain;
        if (pc->cohorts.back() == c->parent && pc->tail_children > 0 && --pc->tail_children == 0)
          Reindex(pc);
      }
    }
    chains_.Free(c);
  }

  // Moves the cohorts after position `at` into a new chain branching off it, with the same
  // statistics.
  void Split(Chain* c, uint32_t at) {
    last_inserted_ = 0;  // it may move to the new chain
    Unindex(c);
    const uint64_t tail_id = ++last_chain_id_;
    Chain& t = *chains_.New(tail_id);
    t.parent = c->cohorts[at];
    t.last = c->last;
    t.last_request = c->last_request;
    t.period = c->period;
    t.has_period = c->has_period;
    t.tail_children = c->tail_children;
    t.shared = c->shared;
    c->shared = true;
    t.cohorts.assign(c->cohorts.begin() + at + 1, c->cohorts.end());
    c->cohorts.resize(at + 1);
    c->tail_children = 1;
    for (uint32_t j = 0; j < t.cohorts.size(); ++j) {
      Member& m = members_.at(t.cohorts[j]);
      m.chain = &t;
      m.pos = j;
      t.weight += m.weight;
    }
    c->weight -= t.weight;
    // Same recency as c, just ahead of it.
    t.older = c;
    t.newer = c->newer;
    (c->newer ? c->newer->older : lru_head_) = &t;
    c->newer = &t;
    Reindex(&t);
    if (victim_ == c) victim_ = nullptr;
  }

  void PushFront(Chain* c) {
    c->older = lru_head_;
    c->newer = nullptr;
    (lru_head_ ? lru_head_->newer : lru_tail_) = c;
    lru_head_ = c;
  }
  void Unlink(Chain* c) {
    (c->newer ? c->newer->older : lru_head_) = c->older;
    (c->older ? c->older->newer : lru_tail_) = c->newer;
    c->newer = c->older = nullptr;
  }
  void MoveToFront(Chain* c) {
    if (lru_head_ == c) return;
    Unlink(c);
    PushFront(c);
  }

  bool SpreadIsRegular() const {
    const double n = static_cast<double>(period_count_);
    const double mean = log_period_sum_ / n;
    const double var = std::max(log_period_sq_sum_ / n - mean * mean, 0.0);
    return var < kRegularSpread * kRegularSpread;
  }
  // After each change to the log-period sums (PeriodsRegular's memory).
  void RememberRegularity() {
    if (period_count_ >= kRegularRememberChains) remembered_regular_ = SpreadIsRegular();
  }

  void Reindex(Chain* c) {
    if (c->indexed || c->cohorts.empty() || c->tail_children != 0) return;
    c->indexed = true;
    c->indexed_last = c->last;
    if (c->has_period) {
      c->indexed_pred = static_cast<double>(c->last_request) + c->period;
      c->indexed_period = c->period;
      by_pred_.insert({c->indexed_pred, c->id, c});
      period_sum_ += c->period;
      const double lp = std::log(std::max(c->period, 1.0));
      c->indexed_log_period = lp;
      log_period_sum_ += lp;
      log_period_sq_sum_ += lp * lp;
      ++period_count_;
      RememberRegularity();
    } else {
      no_period_.insert({c->last, c->id, c});
      probation_weight_ += c->weight;
      c->indexed_class = WeightClass(c->weight);
      by_class_[c->indexed_class].insert({c->last, c->id, c});
      class_mask_ |= uint64_t{1} << c->indexed_class;
    }
  }
  void Unindex(Chain* c) {
    if (!c->indexed) return;
    if (c->has_period) {
      by_pred_.erase({c->indexed_pred, c->id, c});
      period_sum_ -= c->indexed_period;
      const double lp = c->indexed_log_period;  // exactly what Reindex added
      log_period_sum_ -= lp;
      log_period_sq_sum_ -= lp * lp;
      if (--period_count_ == 0) {  // no rounding error outlives the chains it came from
        period_sum_ = 0;
        log_period_sum_ = 0;
        log_period_sq_sum_ = 0;
      }
      RememberRegularity();
    } else {
      no_period_.erase({c->indexed_last, c->id, c});
      probation_weight_ -= c->weight;
      EraseFromClass(c);
    }
    c->indexed = false;
  }

  // Probation chains are also indexed by weight class (the bit width of the weight), each class
  // by last access, so the filter finds its victim among the oldest chain of each class.
  static int WeightClass(uint64_t w) { return std::min(63, static_cast<int>(std::bit_width(w))); }
  void EraseFromClass(Chain* c) {
    auto& b = by_class_[c->indexed_class];
    b.erase({c->indexed_last, c->id, c});
    if (b.empty()) class_mask_ &= ~(uint64_t{1} << c->indexed_class);
  }
  // A probation chain whose weight changed (a put continued it, an eviction took its tail).
  void Reclass(Chain* c) {
    const int k = WeightClass(c->weight);
    if (k == c->indexed_class) return;
    EraseFromClass(c);
    c->indexed_class = k;
    by_class_[k].insert({c->indexed_last, c->id, c});
    class_mask_ |= uint64_t{1} << k;
  }

  // Whether an indexed chain with a period is overdue by more than (1 + slack_) periods.
  bool Finished(const Chain& c) const {
    return c.indexed && c.has_period &&
           static_cast<double>(requests_) > c.indexed_pred + c.indexed_period * (1 + slack_);
  }

  // ReusePredictionPolicy's choice among the leaf chains.
  Chain* PredictionVictim(uint64_t now) const {
    if (by_pred_.empty() && no_period_.empty()) return nullptr;
    const double mean = period_count_ > 0 ? period_sum_ / static_cast<double>(period_count_) : 0;
    const double t = static_cast<double>(requests_);
    if (!by_pred_.empty()) {  // finished chains first: overdue by more than (1 + slack) periods
      const PredKey& k = *by_pred_.begin();
      if (Finished(*k.chain)) return k.chain;
    }
    // A chain put once and not read for twice the mean period is finished too, but only while
    // the mean rests on enough chains (a fifth of those it judges): early in a round of
    // round-barrier traffic the few chains read again are the ones with the shortest gaps, so
    // their mean is far below the round and every chain not yet reached looked finished (the
    // generalisation suite's barrier family: 239 of 600 tuning cells at or above the best
    // baseline before, 311 after).
    if (!no_period_.empty() && mean > 0 && period_count_ * kMinPeriodShare >= no_period_.size()) {
      const LastKey& k = *no_period_.begin();
      if (t > static_cast<double>(k.chain->last_request) + 2 * mean) return k.chain;
    }
    double best_pred = 0;
    uint64_t best_id = 0;
    Chain* best = nullptr;
    Chain* fallback = nullptr;
    auto consider = [&](double pred, Chain* c) {
      if (fallback == nullptr) fallback = c;
      if (c->last + kRecentTicks > now) return false;
      if (best == nullptr || std::make_pair(pred, c->id) > std::make_pair(best_pred, best_id)) {
        best_pred = pred;
        best_id = c->id;
        best = c;
      }
      return true;
    };
    for (auto it = by_pred_.rbegin(); it != by_pred_.rend(); ++it) {
      if (consider(it->pred, it->chain)) break;
    }
    if (!no_period_.empty()) {
      // no_period_ is ordered by last access, so its recent chains are its newest end and the
      // candidate is the chain just before the first recent one: found in O(log n). (Walking
      // from the newest end passed every recent chain on each call, and an eviction round that
      // puts pinned cohorts back, each a chain of its own at the same tick, made that thousands
      // of chains per victim: the owner's maintenance thread spent most of its time here.)
      if (fallback == nullptr) fallback = no_period_.rbegin()->chain;
      auto first_recent =
          now >= kRecentTicks
              ? no_period_.upper_bound(
                    {now - kRecentTicks, std::numeric_limits<uint64_t>::max(), nullptr})
              : no_period_.begin();
      // Its next access is predicted a period after its put, the period unknown: the larger of
      // the mean period and the reuse gap of pages that came back after eviction. The mean is
      // over the chains read again while resident, so it leans to the short periods (the
      // survivors': a shared prefix read by every request, the popular conversations); a chain
      // on probation has not been read again, and the pages that came back after eviction
      // measure the longer gaps. (Generalisation suite, tuning half: 756 -> 790 cells at or
      // above the best baseline, most of it barrier traffic at 25 % of the working set and Zipf
      // at 5-10 %; docs/perf.md.)
      if (first_recent != no_period_.begin()) {
        Chain* c = std::prev(first_recent)->chain;
        consider(static_cast<double>(c->last_request) + std::max(mean, returned_gap_), c);
      }
    }
    return best != nullptr ? best : fallback;
  }

  // The least recently used leaf chain (inner chains are passed over: a prefix is touched with
  // every prompt built on it, so they sit near the front).
  Chain* RecencyVictim() const {
    for (Chain* c = lru_tail_; c != nullptr; c = c->newer) {
      if (c->indexed) return c;
    }
    return nullptr;
  }

  uint64_t SetVictim(Chain* c, uint8_t tag, uint8_t source) {
    victim_ = c;
    victim_tag_ = tag;
    victim_source_ = source;
    victim_last_ = c->last;
    return c->cohorts.back();
  }

  // The victim just set was chosen by its expert's stage at `now` (so StillChosen holds until
  // something it reads changes).
  void Verified(bool chosen_by_stage, uint64_t now) {
    victim_verified_ = chosen_by_stage;
    victim_verified_now_ = now;
  }
  // StillChosen, skipped for an expert's victim while nothing the expert reads has changed
  // (the filter levels weight times age over every victim, so it is asked each time).
  bool VictimStillChosen(uint64_t now) {
    if (victim_verified_ && victim_verified_now_ == now && victim_source_ != kByFilter) {
      FLUXON_DCHECK(StillChosen(now), "a cached victim its stage would no longer choose");
      return true;
    }
    const bool chosen = StillChosen(now);
    Verified(chosen && victim_source_ != kByFilter, now);
    return chosen;
  }
  // Whether the stage that chose the current victim would still choose it.
  bool StillChosen(uint64_t now) const {
    switch (victim_source_) {
      case kByFilter:
        return FilterVictim() == victim_;
      case kByPrediction:
        return PredictionVictim(now) == victim_;
      default:
        return RecencyVictim() == victim_;
    }
  }

  // While probation holds more than its target share: the probation chain that has held the most
  // weight for the longest without being read again (weight times requests since its put), taken
  // among the oldest chain of each weight class (exact up to a factor of 2 in weight). Chosen
  // again for every victim, so the filter levels that product instead of emptying one chain.
  Chain* FilterVictim() const {
    if (class_mask_ == 0 ||
        static_cast<double>(probation_weight_) <= target_ * static_cast<double>(total_weight_)) {
      return nullptr;
    }
    Chain* best = nullptr;
    double best_cost = -1;
    for (uint64_t m = class_mask_; m != 0; m &= m - 1) {
      Chain* c = by_class_[std::countr_zero(m)].begin()->chain;
      const double cost =
          static_cast<double>(c->weight) * static_cast<double>(requests_ - c->last_request + 1);
      if (cost > best_cost) {
        best_cost = cost;
        best = c;
      }
    }
    return best;
  }

  // A page admitted again while its ghost is kept: it was evicted, then missed. Returns its
  // chain's request count at its last access when it was a ghost.
  std::optional<uint64_t> GhostHit(uint64_t fingerprint, bool penalize) {
    auto g = ghost_index_.find(fingerprint);
    if (g == ghost_index_.end()) return std::nullopt;
    const uint64_t seq = g->second;
    ghost_index_.erase(g);
    if (ghost_.empty() || seq < ghost_.front().seq) return std::nullopt;  // it left the FIFO
    const Ghost& entry = ghost_[seq - ghost_.front().seq];
    const uint64_t last_request = entry.last_request;
    if (!penalize) return last_request;
    // A page evicted as finished, back within kLateReturn periods: the rule was too quick.
    // (+ 1: this put's request, counted after.)
    if ((entry.tag & kFinishedBit) &&
        static_cast<double>(requests_ + 1 - last_request) <= kLateReturn * entry.period) {
      slack_ = std::min(slack_ + kSlackUp, kMaxSlack);
    }
    // ARC: a page that left probation and came back says probation was too small, one that left
    // the main part says the opposite; the step grows with the other population's size.
    const double b1 = std::max<double>(static_cast<double>(probation_ghosts_), 1);
    const double b2 = std::max<double>(static_cast<double>(ghost_.size() - probation_ghosts_), 1);
    if (entry.tag & kProbationBit) {
      target_ = std::min(target_ + kTargetStep * std::max(b2 / b1, 1.0), 1.0);
    } else {
      target_ = std::max(target_ - kTargetStep * std::max(b1 / b2, 1.0), 0.0);
    }
    if ((entry.tag & ((1 << kExperts) - 1)) == 0) return last_request;
    // LeCaR: regret discounted to 0.005 over the ghost's length.
    const double n = static_cast<double>(std::max<size_t>(ghost_.size(), 1));
    const double regret = std::pow(0.005, static_cast<double>(evictions_ - seq) / n);
    for (int i = 0; i < kExperts; ++i) {
      if (entry.tag & (uint8_t{1} << i)) {
        weight_[i] *= std::exp(-kLearningRate * regret / std::max(weight_[i], kRegretFloor));
      }
    }
    const double sum = weight_[0] + weight_[1];
    for (double& w : weight_) w = std::clamp(w / sum, kMinWeight, 1.0 - kMinWeight);
    return last_request;
  }

  void NoteReturnedGap(uint64_t gap) {
    const double g = static_cast<double>(gap);
    returned_gap_ =
        returned_gap_ == 0 ? g : (1 - kReturnedGapRate) * returned_gap_ + kReturnedGapRate * g;
  }

  Mode mode_;
  ChainPool chains_;
  uint64_t last_chain_id_ = 0;
  absl::flat_hash_map<uint64_t, Member> members_;
  Chain* lru_head_ = nullptr;  // most recently used
  Chain* lru_tail_ = nullptr;
  absl::btree_set<PredKey> by_pred_;       // leaf chains with a period, by predicted next access
  absl::btree_set<LastKey> no_period_;     // leaf chains on probation, by last access (FIFO)
  absl::btree_set<LastKey> by_class_[64];  // the same, per weight class (the filter's index)
  uint64_t class_mask_ = 0;                // the non-empty classes
  double period_sum_ = 0;                  // over the leaf chains with a period
  double log_period_sum_ = 0;              // their log periods (PeriodsRegular)
  double log_period_sq_sum_ = 0;
  uint64_t period_count_ = 0;
  bool remembered_regular_ = false;  // PeriodsRegular's reading over kRegularRememberChains
  uint64_t total_weight_ = 0;
  uint64_t probation_weight_ = 0;  // of the leaf chains on probation
  double target_ = 1.0;            // probation's target share of the resident weight
  // The victim chain and the experts that proposed it.
  Chain* victim_ = nullptr;
  uint64_t victim_last_ = 0;
  uint8_t victim_tag_ = 0;
  enum : uint8_t { kByFilter, kByPrediction, kByRecency };
  uint8_t victim_source_ = kByFilter;
  // Ghosts: (fingerprint, eviction sequence, tag), oldest first; the index maps a fingerprint to
  // its newest sequence number. ghost_ holds consecutive sequence numbers.
  std::deque<Ghost> ghost_;
  absl::flat_hash_map<uint64_t, uint64_t> ghost_index_;
  uint64_t probation_ghosts_ = 0;  // ghosts tagged kProbationBit (ARC's |B1|)
  // The finished rule's slack, in periods (see 3).
  double slack_ = 0;
  uint64_t evictions_ = 0;
  // The request clock that periods are measured on: one tick per request (a restore, or a put
  // that continues nothing stored), not per call, so a period does not depend on how many calls
  // the requests in between made (a miss puts once, a hit probes, reads and puts).
  uint64_t requests_ = 0;
  uint64_t last_touch_front_ = 0;
  uint64_t high_water_ = 0;  // the most cohorts ever resident: bounds the ghost FIFO
  // The reuse gap, in requests, of pages that came back after their eviction (an EWMA; 0: none
  // yet): the stand-in for a probation chain's period when it exceeds the mean (see
  // PredictionVictim).
  double returned_gap_ = 0;
  // The cohort inserted last while it is its chain's tail and no cohort has moved since (0:
  // none), and its chain: the next page of the same put continues it without a lookup.
  uint64_t last_inserted_ = 0;
  Chain* last_inserted_chain_ = nullptr;
  bool last_inserted_ghost_ = false;  // whether the cohort inserted last was a ghost hit
  // StillChosen's cache: true while the victim was chosen or confirmed by its stage and nothing
  // that stage reads has changed since, except that the victim chain lost its tail (an eviction
  // from the victim keeps its index keys; see Evict), at the logical time victim_verified_now_.
  bool victim_verified_ = false;
  uint64_t victim_verified_now_ = 0;
  double weight_[kExperts];  // prior: prediction (see 3.)
  double credit_[kExperts] = {0, 0};
};

}  // namespace fluxon
