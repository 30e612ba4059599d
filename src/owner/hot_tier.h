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
//   Coldest(now) -> optional<id>, on a logical clock that advances once per admission or access;
//   optionally EvictReturningPredecessor(id) (Predecessor then Evict in one lookup).
// - Fingerprints (for ghost lists): a cohort's own, or a hash of its first key and key count.
// - Copied elsewhere (recoverable-first eviction, design §7): a cohort whose every member has a
//   complete copy on another node (a replica the target confirmed, or this owner's own copy of
//   a value fetched from a peer) is also on the copied list, least recently used first;
//   TakeCopied hands those out before any victim of the policy, from any place in their chain
//   (the prefix stays readable in the cluster: a get fetches it from the other copy), and the
//   policy forgets them without a ghost (a later miss costs a remote get, not a recompute). The
//   mark is a hint: the other copy may be gone by then, which the master's only-if-copied route
//   removal decides; a cohort it refuses is readmitted unmarked.
// - One ranking for both tiers (EnableOneRanking; owner.demotion.remote_budget_bytes): a cohort
//   this owner demoted stays in the policy with its copy's place (remote_address), so the policy
//   ranks what is here and what this owner keeps on remote_caches as one set (its chains,
//   periods and ghosts intact). Residency is chosen apart from the ranking: the local cohorts
//   form a least-recently-used list (TakeLocal hands out its cold end for demotion or release;
//   the cohort stays ranked while it moves, and EndMove says where it is then); weight() is
//   what is held here, remote_weight() what this owner keeps elsewhere (a cohort with both
//   counts in both; both_weight() is the part counted twice). A get that fetches a value of
//   such a cohort back installs it under the same cohort (RemoteCohortOf, Relocalised); with
//   keep_fetched_copies its copy there stays and the cohort, held in both tiers, is on a local
//   list of its own that TakeLocal empties first (releasing it moves no data); without, its copy
//   there is dropped (TakeRemoteToDrop). TakeVictims may hand out a cohort that is moving
//   (Cohort::moving): whoever moves it then finds it gone at EndMove and evicts it.
#pragma once

#include <algorithm>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <iterator>
#include <list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "common/check.h"
#include "common/mutex.h"
#include "owner/eviction/adaptive_chain_policy.h"

namespace fluxon {

struct Cohort {
  uint64_t id = 0;
  uint64_t put_id = 0;
  std::vector<std::string> keys;
  uint64_t weight = 0;  // sum of member slot sizes
  uint64_t after = 0;   // the cohort before it in its chain when it was taken (0: chain head)
  bool copied_elsewhere = false;  // every member has a complete copy on another node (a hint)
  // Identifies the cohort's content across lifetimes (ghost lists); 0: HotTier derives it from
  // the first key.
  uint64_t fingerprint = 0;
  // One ranking: the values are held here (some members may be missing after a partial
  // re-localisation: removal skips them) ...
  bool local = true;
  // ... and/or this owner's demoted copy of them is on the remote_cache whose peer service is
  // here (empty: none).
  std::string remote_address;
  bool moving = false;  // taken by TakeLocal, not ended yet (still ranked)
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
      if (!remote_keys_.empty()) NoteSuperseded(cohort);
      weight_ += cohort.weight;
      if (cohort.fingerprint == 0 && !cohort.keys.empty()) cohort.fingerprint = Fingerprint(cohort);
      policy_.Insert(cohort.id, after, now, /*refresh=*/true, cohort.fingerprint, cohort.weight);
      after = cohort.id;
      if (cohort.copied_elsewhere) ListCopied(cohort.id);
      ListLocal(cohort, /*cold=*/false);
      cohorts_.emplace(cohort.id, std::move(cohort));
    }
  }
  // One ranking for both tiers (see the invariants). Call before the first admission.
  // `keep_fetched_copies`: a value fetched back keeps its copy on the remote_cache, and the
  // cohort, held in both tiers, is released here before any cohort held here only (recoverable
  // first); false: its copy there is dropped (TakeRemoteToDrop) and it is demoted again later.
  void EnableOneRanking(bool keep_fetched_copies = false) {
    keep_fetched_copies_ = keep_fetched_copies;
    one_ranking_.store(true, std::memory_order_relaxed);
  }
  // The values `copied` have a complete copy on another node now (a replica completed): cohort
  // `id` is marked when every member it has is among them. False when the cohort is not here
  // (evicted, or taken by a round in progress) or has a member not copied.
  bool MarkCopied(uint64_t id, const std::vector<std::string>& copied) {
    MutexLock lock(&mu_);
    auto it = cohorts_.find(id);
    if (it == cohorts_.end()) return false;
    for (const std::string& k : it->second.keys) {
      if (std::find(copied.begin(), copied.end(), k) == copied.end()) return false;
    }
    if (!it->second.copied_elsewhere && it->second.remote_address.empty() && !it->second.moving) {
      it->second.copied_elsewhere = true;
      UnlistLocal(id);
      ListCopied(id);
    }
    return true;
  }
  // Takes copied-elsewhere cohorts worth at least `bytes` (or all of them), least recently
  // used first. Like TakeVictims, ownership passes to the caller (S4).
  std::vector<Cohort> TakeCopied(uint64_t bytes) {
    std::vector<Cohort> out;
    MutexLock lock(&mu_);
    uint64_t taken = 0;
    while (taken < bytes && !copied_order_.empty()) {
      const uint64_t id = copied_order_.front();
      copied_order_.pop_front();
      copied_.erase(id);
      auto it = cohorts_.find(id);
      it->second.after = policy_.Predecessor(id);
      policy_.Erase(id);
      taken += it->second.weight;
      Unaccount(it->second);
      out.push_back(std::move(it->second));
      cohorts_.erase(it);
    }
    return out;
  }
  uint64_t copied_cohorts() const {
    MutexLock lock(&mu_);
    return copied_.size();
  }
  // One access to these cohorts (a restored prefix, passed tail first).
  void Touch(const std::vector<uint64_t>& ids) {
    MutexLock lock(&mu_);
    policy_.Touch(ids, ++clock_);
    if (one_ranking_.load(std::memory_order_relaxed)) {
      for (uint64_t id : ids) {
        auto l = local_.find(id);
        if (l == local_.end()) continue;
        std::list<uint64_t>& order = *l->second.order;
        order.splice(order.end(), order, l->second.pos);
      }
    }
    if (copied_.empty()) return;
    for (uint64_t id : ids) {
      auto c = copied_.find(id);
      if (c != copied_.end()) copied_order_.splice(copied_order_.end(), copied_order_, c->second);
    }
  }
  std::vector<Cohort> TakeVictims(uint64_t bytes) {
    std::vector<Cohort> out;
    MutexLock lock(&mu_);
    uint64_t taken = 0;
    while (taken < bytes) {
      std::optional<uint64_t> id = policy_.Coldest(clock_);
      if (!id) break;
      const uint64_t after = EvictFromPolicy(*id);
      auto it = cohorts_.find(*id);
      FLUXON_DCHECK(it != cohorts_.end(), "the policy named a cohort the tier does not hold");
      if (it == cohorts_.end()) continue;  // (cannot happen: Readmit admits an id once)
      taken += it->second.weight;
      Unaccount(it->second);
      it->second.after = after;
      out.push_back(std::move(it->second));
      cohorts_.erase(it);
    }
    return out;
  }
  // A cohort that could not be evicted now (pinned, in use) goes back where it was: the tail of
  // its chain (a new chain if its predecessor is gone), without counting as an access. A part
  // of a cohort readmitted while another part of it (the same id) is here joins that part: one
  // id is admitted once, or the policy would list it twice and name as a victim an id the tier
  // no longer holds.
  void Readmit(Cohort cohort) {
    MutexLock lock(&mu_);
    if (auto held = cohorts_.find(cohort.id); held != cohorts_.end()) {
      Cohort& c = held->second;
      const uint64_t after = policy_.Predecessor(c.id);
      policy_.Erase(c.id);
      Unaccount(c);
      for (std::string& k : cohort.keys) {
        if (std::find(c.keys.begin(), c.keys.end(), k) == c.keys.end())
          c.keys.push_back(std::move(k));
      }
      c.weight += cohort.weight;
      c.copied_elsewhere = c.copied_elsewhere && cohort.copied_elsewhere;
      policy_.Insert(c.id, after, clock_, /*refresh=*/false, c.fingerprint, c.weight);
      Account(c, /*cold=*/true);
      return;
    }
    policy_.Insert(cohort.id, cohort.after, clock_, /*refresh=*/false, cohort.fingerprint,
                   cohort.weight);
    cohort.moving = false;
    Account(cohort, /*cold=*/true);
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
    Unaccount(it->second);
    cohorts_.erase(it);
    return true;
  }

  // One ranking: takes local cohorts worth at least `bytes` (or all of them) from the cold end
  // of the local lists, none copied elsewhere and none already moving, for demotion or release:
  // those whose copy is on a remote_cache too first (releasing them moves no data), then those
  // held here only. They stay ranked (and counted here) until EndMove; the caller gets their
  // descriptions.
  std::vector<Cohort> TakeLocal(uint64_t bytes) {
    std::vector<Cohort> out;
    MutexLock lock(&mu_);
    uint64_t taken = 0;
    while (taken < bytes && !(both_order_.empty() && local_order_.empty())) {
      const uint64_t id = both_order_.empty() ? local_order_.front() : both_order_.front();
      UnlistLocal(id);
      Cohort& c = cohorts_.find(id)->second;
      c.moving = true;
      taken += c.weight;
      out.push_back(c);
    }
    return out;
  }
  // Ends the move of cohort `id`: `local_freed`, its values left this owner; `remote_address`
  // (not empty): this owner's copy of it is on that remote_cache now. A cohort still here goes
  // back to the cold end of the local list. False when the cohort is not here any more (the
  // policy evicted it meanwhile: the mover evicts what is left of it).
  bool EndMove(uint64_t id, bool local_freed, const std::string& remote_address) {
    MutexLock lock(&mu_);
    auto it = cohorts_.find(id);
    if (it == cohorts_.end() || !it->second.moving) return false;
    Cohort& c = it->second;
    Unaccount(c);
    c.moving = false;
    if (local_freed) c.local = false;
    if (!remote_address.empty()) c.remote_address = remote_address;
    FLUXON_DCHECK(c.local || !c.remote_address.empty(), "a ranked cohort is held somewhere");
    Account(c, /*cold=*/true);
    return true;
  }
  // One ranking: the cohort whose remote copy holds `key` with `put_id` (0: none), so a fetch of
  // it back here installs the value under that cohort.
  uint64_t RemoteCohortOf(const std::string& key, uint64_t put_id) const {
    // Off: nothing is ranked remotely, so no fetched page takes the lock to learn it.
    if (!one_ranking_.load(std::memory_order_relaxed)) return 0;
    MutexLock lock(&mu_);
    auto r = remote_keys_.find(key);
    if (r == remote_keys_.end()) return 0;
    auto it = cohorts_.find(r->second);
    return it != cohorts_.end() && it->second.put_id == put_id ? r->second : 0;
  }
  // Values of cohort `id` were fetched back here: it is local again (the most recently used
  // end). False when the cohort is not here.
  bool Relocalised(uint64_t id) {
    MutexLock lock(&mu_);
    auto it = cohorts_.find(id);
    if (it == cohorts_.end()) return false;
    if (it->second.local) return true;
    Unaccount(it->second);
    it->second.local = true;
    Account(it->second, /*cold=*/false);
    // Held in both tiers now: either this copy is released first when room is needed, or the
    // copy there is a duplicate at rest (TakeRemoteToDrop).
    if (!keep_fetched_copies_) remote_drops_.push_back(id);
    return true;
  }
  // Takes cohort `id` out of the tier (as a victim: its ghost is remembered), e.g. a moving
  // cohort that pressure deletes instead. Nullopt when it is not here.
  std::optional<Cohort> Take(uint64_t id) {
    MutexLock lock(&mu_);
    auto it = cohorts_.find(id);
    if (it == cohorts_.end()) return std::nullopt;
    it->second.after = EvictFromPolicy(id);
    Unaccount(it->second);
    Cohort out = std::move(it->second);
    cohorts_.erase(it);
    return out;
  }
  // One ranking: the remote copies to drop, and their cohorts' descriptions: those of cohorts
  // fetched back here since (capacity is counted once: a value is not held in both tiers at
  // rest), and those that hold a key put here again since (another identity). A cohort held
  // here keeps its local values (removal skips the members put again) and only loses its
  // copy's place; one held only there leaves the ranking.
  std::vector<Cohort> TakeRemoteToDrop() {
    std::vector<Cohort> out;
    MutexLock lock(&mu_);
    for (uint64_t id : remote_drops_) {
      auto it = cohorts_.find(id);
      if (it == cohorts_.end() || it->second.moving || it->second.remote_address.empty()) continue;
      out.push_back(it->second);
      ForgetRemoteLocked(it);
    }
    remote_drops_.clear();
    return out;
  }
  // One ranking: the cohorts whose every key starts with `prefix` and whose copy is on a
  // remote_cache (deleted on request): out of the ranking where held only there, their copy's
  // place forgotten where held here too. The caller drops the copies.
  std::vector<Cohort> TakeRemoteUnder(std::string_view prefix) {
    std::vector<uint64_t> ids;
    MutexLock lock(&mu_);
    for (const auto& [key, id] : remote_keys_) {
      if (key.compare(0, prefix.size(), prefix) == 0) ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::vector<Cohort> out;
    for (uint64_t id : ids) {
      auto it = cohorts_.find(id);
      if (it == cohorts_.end() || it->second.moving) continue;
      const std::vector<std::string>& keys = it->second.keys;
      if (!std::all_of(keys.begin(), keys.end(), [&](const std::string& k) {
            return k.compare(0, prefix.size(), prefix) == 0;
          })) {
        continue;
      }
      out.push_back(it->second);
      ForgetRemoteLocked(it);
    }
    return out;
  }
  // This owner's copy of cohort `id` on a remote_cache is gone (the master knows no other
  // copy): it stays ranked while held here, and leaves (as a victim) when it is not.
  void ForgetRemoteCopy(uint64_t id) {
    MutexLock lock(&mu_);
    auto it = cohorts_.find(id);
    if (it == cohorts_.end() || it->second.remote_address.empty()) return;
    ForgetRemoteLocked(it, /*as_victim=*/true);
  }
  // Bytes of the cohorts this owner keeps on remote_caches (one ranking).
  uint64_t remote_weight() const {
    MutexLock lock(&mu_);
    return remote_weight_;
  }
  // Bytes of the cohorts held both here and on a remote_cache (counted in both weights).
  uint64_t both_weight() const {
    MutexLock lock(&mu_);
    return both_weight_;
  }
  // Bytes ranked (one ranking), each cohort once wherever it is held: one snapshot of
  // weight() + remote_weight() - both_weight().
  uint64_t ranked_weight() const {
    MutexLock lock(&mu_);
    return weight_ + remote_weight_ - both_weight_;
  }
  // Bytes of the cohorts held here.
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

  // Forgets the place of the cohort's remote copy: a cohort held here keeps its place in the
  // local list; one held only there leaves the ranking (`as_victim`: its ghost is remembered).
  void ForgetRemoteLocked(absl::flat_hash_map<uint64_t, Cohort>::iterator it,
                          bool as_victim = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Cohort& c = it->second;
    if (!c.local) {
      if (as_victim) {
        policy_.Evict(c.id);
      } else {
        policy_.Erase(c.id);
      }
      Unaccount(c);
      cohorts_.erase(it);
      return;
    }
    auto l = local_.find(c.id);
    const bool relist = l != local_.end() && l->second.order == &both_order_;
    if (relist) UnlistLocal(c.id);
    UnindexRemote(c);
    c.remote_address.clear();
    // From the list of cohorts held in both tiers to the local one: a copy given up after a
    // fetch back is warm here, one lost there (`as_victim`) goes to the cold end.
    if (relist) ListLocal(c, /*cold=*/as_victim);
  }
  // Counts `c` (not in cohorts_ yet, or just changed) in the weights and lists.
  void Account(const Cohort& c, bool cold) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (c.local) weight_ += c.weight;
    if (c.copied_elsewhere) ListCopied(c.id);
    ListLocal(c, cold);
    if (!c.remote_address.empty()) {
      if (c.local) both_weight_ += c.weight;
      remote_weight_ += c.weight;
      for (const std::string& k : c.keys) remote_keys_[k] = c.id;
    }
  }
  // Undoes Account (the cohort leaves, or is about to change).
  void Unaccount(const Cohort& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (c.local) weight_ -= c.weight;
    UnlistCopied(c.id);
    UnlistLocal(c.id);
    if (!c.remote_address.empty()) UnindexRemote(c);
  }
  // Takes `c`'s remote copy out of the remote weight and the key index.
  void UnindexRemote(const Cohort& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (c.local) both_weight_ -= c.weight;
    remote_weight_ -= c.weight;
    for (const std::string& k : c.keys) {
      auto r = remote_keys_.find(k);
      if (r != remote_keys_.end() && r->second == c.id) remote_keys_.erase(r);
    }
  }
  // A key of `c` that a remote copy holds under another cohort was put again.
  void NoteSuperseded(const Cohort& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::string& k : c.keys) {
      auto r = remote_keys_.find(k);
      if (r == remote_keys_.end() || r->second == c.id) continue;
      if (remote_drops_.empty() || remote_drops_.back() != r->second)
        remote_drops_.push_back(r->second);
    }
  }
  // One ranking: a local cohort that is not copied elsewhere nor moving is on a local list:
  // the one of cohorts held in both tiers when its copy is on a remote_cache too.
  std::list<uint64_t>& ListOf(const Cohort& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return c.remote_address.empty() || !keep_fetched_copies_ ? local_order_ : both_order_;
  }
  void ListLocal(const Cohort& c, bool cold) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!one_ranking_.load(std::memory_order_relaxed) || !c.local || c.copied_elsewhere ||
        c.moving || local_.contains(c.id)) {
      return;
    }
    std::list<uint64_t>& order = ListOf(c);
    local_.emplace(c.id,
                   LocalPlace{&order, order.insert(cold ? order.begin() : order.end(), c.id)});
  }
  void UnlistLocal(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto l = local_.find(id);
    if (l == local_.end()) return;
    l->second.order->erase(l->second.pos);
    local_.erase(l);
  }
  void ListCopied(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (copied_.contains(id)) return;
    copied_order_.push_back(id);
    copied_.emplace(id, std::prev(copied_order_.end()));
  }
  void UnlistCopied(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto c = copied_.find(id);
    if (c == copied_.end()) return;
    copied_order_.erase(c->second);
    copied_.erase(c);
  }

  // Evicts `id` from the policy and returns its predecessor there: in one lookup where the policy
  // offers EvictReturningPredecessor (a victim's place is looked up once per eviction, on the
  // eviction hot path), else Predecessor then Evict.
  uint64_t EvictFromPolicy(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if constexpr (requires(Policy & p) {
                    { p.EvictReturningPredecessor(id) } -> std::same_as<uint64_t>;
                  }) {
      return policy_.EvictReturningPredecessor(id);
    } else {
      const uint64_t after = policy_.Predecessor(id);
      policy_.Evict(id);
      return after;
    }
  }

  mutable Mutex mu_;
  Policy policy_ ABSL_GUARDED_BY(mu_);
  // The copied-elsewhere cohorts, least recently used first (a subset of cohorts_).
  std::list<uint64_t> copied_order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::list<uint64_t>::iterator> copied_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Cohort> cohorts_ ABSL_GUARDED_BY(mu_);
  // One ranking: the local cohorts not copied elsewhere nor moving, least recently used first;
  // the keys of the remote copies this owner keeps, and their bytes.
  // Set once, before the first admission (EnableOneRanking), and read without the lock.
  std::atomic<bool> one_ranking_{false};
  std::list<uint64_t> local_order_ ABSL_GUARDED_BY(mu_);
  // ... and those held here whose copy is on a remote_cache too (taken first); local_ indexes
  // both lists: which one, and the place there.
  std::list<uint64_t> both_order_ ABSL_GUARDED_BY(mu_);
  struct LocalPlace {
    std::list<uint64_t>* order;
    std::list<uint64_t>::iterator pos;
  };
  absl::flat_hash_map<uint64_t, LocalPlace> local_ ABSL_GUARDED_BY(mu_);
  bool keep_fetched_copies_ = false;  // set with one_ranking_, before the first admission
  absl::flat_hash_map<std::string, uint64_t> remote_keys_ ABSL_GUARDED_BY(mu_);
  uint64_t remote_weight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t both_weight_ ABSL_GUARDED_BY(mu_) = 0;            // of the cohorts held in both tiers
  std::vector<uint64_t> remote_drops_ ABSL_GUARDED_BY(mu_);  // see TakeRemoteToDrop
  uint64_t weight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;  // logical time: one tick per admission or access
};

}  // namespace fluxon
