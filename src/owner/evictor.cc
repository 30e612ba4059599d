#include "owner/evictor.h"

#include <map>

#include "common/batch.h"
#include "common/check.h"
#include "common/put_id.h"
#include "fluxon/status.h"
#include "fluxon/units.h"
#include "rpc/retry.h"
#include "spdlog/spdlog.h"

namespace fluxon {

void Evictor::SignalPressure() {
  MutexLock lock(&mu_);
  pressure_ = true;
  cv_.SignalAll();
}

void Evictor::Interrupt() {
  MutexLock lock(&mu_);
  cv_.SignalAll();
}

bool Evictor::WaitForWork(std::chrono::milliseconds interval) {
  MutexLock lock(&mu_);
  if (!stop_->stopped() && !pressure_) cv_.WaitUntil(&mu_, Clock::now() + interval);
  pressure_ = false;
  return !stop_->stopped();
}

Evictor::Need Evictor::Measure() const {
  const SlotPoolStats s = pool_->Stats();
  // Waiting claims ask for eviction only when the pool cannot grow: growth comes first.
  const bool can_grow = pool_->CanGrow();
  Need need;
  uint64_t used = 0;
  for (const SizeClassStats& c : s.classes) {
    // A class being carved gets a grant's slots in a moment: evicting other classes for it
    // would free capacity its claims cannot use.
    if (!can_grow && !c.carving && c.pending_demand_slots > c.free_slots) {
      need.deficit += (c.pending_demand_slots - c.free_slots) * c.slot_size;
    }
    used += (c.grants * c.slots_per_grant - c.free_slots) * c.slot_size;
  }
  // Watermark: keep used memory under hot_capacity_ratio of what the pool can ever hold.
  uint64_t capacity = 0;
  if (pool_->expected_grants() > 0) {
    for (const SizeClassStats& c : s.classes)
      capacity += c.grants * c.slots_per_grant * c.slot_size;
  } else {
    capacity = s.grant_capacity * kGrantBytes;
  }
  const uint64_t high = static_cast<uint64_t>(options_.hot_capacity_ratio * capacity);
  if (used > high) need.over_watermark = used - high;
  if (demotions_ != nullptr) {
    const uint64_t start = static_cast<uint64_t>(demotion_.start_ratio * capacity);
    if (used > start) need.over_demotion = used - start;
    if (one_ranking()) {
      // The bytes ranked, each cohort once (one held in both tiers takes room in both, which
      // each tier's own bound accounts for: start_ratio here, the budget there).
      const uint64_t ranked = hot_->ranked_weight();
      const uint64_t budget = start + demotion_.remote_budget_bytes;
      if (ranked > budget) need.over_budget = ranked - budget;
    }
  }
  return need;
}

void Evictor::RunRound() {
  if (candidates_changed_.exchange(false, std::memory_order_relaxed)) {
    fallback_backoff_ = watermark_backoff_ = options_.min_interval;
    next_fallback_ = std::min(next_fallback_, Clock::now());
    next_watermark_ = Clock::now();
  }
  if (one_ranking()) DropDuplicates();
  Need need = Measure();
  const auto now = Clock::now();
  if (need.over_budget > 0) {
    Trim(need.over_budget);
    need = Measure();
  }
  if (need.over_demotion > 0) {
    Demote(need.over_demotion);
    need = Measure();
  }
  if (need.over_watermark > 0 && now >= next_watermark_) {
    if (EvictSome(need.over_watermark) > 0) {
      watermark_backoff_ = options_.min_interval;
      need = Measure();  // the deficit may be covered now
    } else {
      watermark_backoff_ = std::min(watermark_backoff_ * 2, std::chrono::milliseconds(2000));
      next_watermark_ = now + watermark_backoff_;
    }
  }
  if (need.deficit == 0 || now < next_fallback_) return;
  const uint64_t evicted = EvictSome(std::min(need.deficit, options_.max_bytes_per_round));
  // Nothing evictable (all pinned or in flight): back off instead of spinning.
  fallback_backoff_ = evicted == 0
                          ? std::min(fallback_backoff_ * 2, std::chrono::milliseconds(2000))
                          : options_.min_interval;
  next_fallback_ = Clock::now() + fallback_backoff_;
}

uint64_t Evictor::EvictSome(uint64_t bytes) {
  counters_->eviction_rounds.fetch_add(1, std::memory_order_relaxed);
  // Recoverable first: cohorts with a complete copy elsewhere leave nothing behind.
  uint64_t evicted = Settle(hot_->TakeCopied(bytes), /*only_if_copied=*/true);
  if (evicted >= bytes) return evicted;
  if (!one_ranking()) return evicted + Settle(hot_->TakeVictims(bytes - evicted), false);
  // One ranking: first what has a copy on a remote_cache (its rank stays), then the policy's
  // victims from both tiers until enough was freed here (a victim there is dropped there: the
  // set keeps the policy's order, and demotion refills the remote share from the local cold end).
  evicted += MoveLocal(bytes - evicted, /*demote=*/false);
  for (int i = 0; i < kPressureTrims && evicted < bytes; ++i) {
    const TrimResult t = Trim(bytes - evicted);
    evicted += t.freed_here;
    if (t.taken == 0) break;
  }
  return evicted;
}

bool Evictor::NoteCopiedElsewhere(const std::vector<std::string>& keys, uint64_t put_id) {
  if (keys.empty()) return false;
  // A group is one cohort (the publisher admits each atomic group as one): its first member
  // names it; a member of another cohort or identity means the group changed meanwhile.
  const uint64_t cohort = keys_->CommittedCohort(keys.front(), put_id);
  if (cohort == 0) return false;
  for (size_t i = 1; i < keys.size(); ++i) {
    if (keys_->CommittedCohort(keys[i], put_id) != cohort) return false;
  }
  if (!hot_->MarkCopied(cohort, keys)) return false;
  counters_->cohorts_marked_copied.fetch_add(1, std::memory_order_relaxed);
  CandidatesChanged();
  return true;
}

void Evictor::EnableDemotion(ReplicaQueue* queue, DemotionOptions options, PeerApi* peers) {
  demotion_ = options;
  demotions_ = queue;
  peers_ = peers;
  // The daemon always has a peer client; only a test without one may ask for no ranking here.
  FLUXON_DCHECK(peers_ != nullptr || demotion_.remote_budget_bytes == 0,
                "one ranking needs a peer client for its drops");
  if (peers_ == nullptr) demotion_.remote_budget_bytes = 0;
  if (demotion_.remote_budget_bytes > 0) hot_->EnableOneRanking(demotion_.keep_fetched_copies);
}

void Evictor::Demote(uint64_t bytes) {
  // Duplicates at rest first: a copied cohort's value stays in the cluster without this copy.
  const uint64_t released = Settle(hot_->TakeCopied(bytes), /*only_if_copied=*/true);
  if (released >= bytes) return;
  uint64_t want = bytes - released;
  if (one_ranking()) {
    // What is on its way out already counts; a cohort with a copy on a remote_cache is released
    // even while demotion pauses.
    {
      MutexLock lock(&demote_mu_);
      want = want > demoting_bytes_ ? want - demoting_bytes_ : 0;
    }
    if (want > 0) MoveLocal(want, /*demote=*/true);
    return;
  }
  {
    MutexLock lock(&demote_mu_);
    if (Clock::now() < demotion_paused_until_) return;
    const uint64_t room = demotion_.max_bytes_in_flight > demoting_bytes_
                              ? demotion_.max_bytes_in_flight - demoting_bytes_
                              : 0;
    want = std::min(want, room);
  }
  if (want == 0) return;
  for (Cohort& c : QueueDemotions(hot_->TakeVictims(want))) hot_->Readmit(std::move(c));
}

void Evictor::Undemoting(uint64_t weight) {
  demoting_bytes_ -= weight;
  counters_->demoting_bytes.store(static_cast<int64_t>(demoting_bytes_), std::memory_order_relaxed);
}

std::vector<Cohort> Evictor::QueueDemotions(std::vector<Cohort> cold) {
  std::vector<ReplicaGroup> groups;
  std::vector<Cohort> demoting, back;  // back: a member no longer held as committed
  int64_t pages = 0;
  for (Cohort& c : cold) {
    ReplicaGroup g;
    for (const std::string& key : c.keys) {
      const std::optional<KeyIndex::Identity> id = keys_->IdentityOf(key);
      if (!id || id->state != KeyIndex::State::kCommitted || id->put_id != c.put_id) continue;
      g.push_back(ReplicaTask{.key = key,
                              .put_id = c.put_id,
                              .version = id->version,
                              .len = id->len,
                              .slot_bytes = c.weight / c.keys.size(),
                              .demoted_cohort = c.id,
                              .write_through = nullptr});
    }
    if (g.size() != c.keys.size()) {
      back.push_back(std::move(c));  // changed meanwhile: eviction sorts it out
      continue;
    }
    pages += static_cast<int64_t>(g.size());
    demoting.push_back(std::move(c));
    groups.push_back(std::move(g));
  }
  {
    MutexLock lock(&demote_mu_);
    for (Cohort& c : demoting) {
      demoting_bytes_ += c.weight;
      demoting_.emplace(c.id, std::move(c));
    }
    counters_->demoting_bytes.store(static_cast<int64_t>(demoting_bytes_),
                                    std::memory_order_relaxed);
  }
  counters_->demotions_started.fetch_add(pages, std::memory_order_relaxed);
  // Outside demote_mu_: a group the queue cannot take ends (kFailed) right here.
  if (!groups.empty()) demotions_->Enqueue(std::move(groups));
  return back;
}

void Evictor::DropDuplicates() {
  std::vector<Cohort> there = hot_->TakeRemoteToDrop();
  int64_t pages = 0;
  for (const Cohort& c : there) pages += static_cast<int64_t>(c.keys.size());
  if (pages == 0) return;
  counters_->remote_duplicate_pages.fetch_add(pages, std::memory_order_relaxed);
  DropRemoteCopies(std::move(there));
}

Evictor::TrimResult Evictor::Trim(uint64_t bytes) {
  TrimResult result;
  std::vector<Cohort> here, there;
  for (Cohort& v : hot_->TakeVictims(bytes)) {
    result.taken += v.weight;
    if (v.moving) continue;  // the end of its move evicts it (EndMove finds it gone)
    if (!v.remote_address.empty()) there.push_back(v);
    if (v.local) {
      v.remote_address.clear();  // dropped below: a member kept here is ranked as local only
      here.push_back(std::move(v));
    }
  }
  result.freed_here = Settle(std::move(here), /*only_if_copied=*/false);
  DropRemoteCopies(std::move(there));
  return result;
}

uint64_t Evictor::MoveLocal(uint64_t bytes, bool demote) {
  uint64_t room = 0;
  if (demote) {
    // Within the demotions' bound, and within the remote budget: what this owner ranks on
    // remote_caches, with what is on its way there, never exceeds it.
    const uint64_t remote = hot_->remote_weight();
    MutexLock lock(&demote_mu_);
    const uint64_t committed = remote + demoting_bytes_;
    if (Clock::now() >= demotion_paused_until_ && demotion_.max_bytes_in_flight > demoting_bytes_ &&
        demotion_.remote_budget_bytes > committed) {
      room = std::min(demotion_.max_bytes_in_flight - demoting_bytes_,
                      demotion_.remote_budget_bytes - committed);
    }
  }
  std::vector<Cohort> release, demoting, deleting, back;
  for (Cohort& c : hot_->TakeLocal(bytes)) {
    if (!c.remote_address.empty()) {
      release.push_back(std::move(c));
    } else if (c.weight <= room) {
      room -= c.weight;
      demoting.push_back(std::move(c));
    } else {
      back.push_back(std::move(c));
    }
  }
  uint64_t freed = ReleaseLocal(std::move(release));
  for (Cohort& c : QueueDemotions(std::move(demoting))) back.push_back(std::move(c));
  // Back to the cold end, in their order.
  for (auto it = back.rbegin(); it != back.rend(); ++it) {
    if (!hot_->EndMove(it->id, /*local_freed=*/false, {})) deleting.push_back(std::move(*it));
  }
  std::vector<Cohort> out;
  for (Cohort& c : deleting) {
    // Out of the ranking first (a victim: its ghost stays); gone already when the policy evicted
    // it meanwhile, and then its description here is all that is left of it.
    std::optional<Cohort> taken = hot_->Take(c.id);
    Cohort victim = taken ? std::move(*taken) : std::move(c);
    victim.moving = false;
    out.push_back(std::move(victim));
  }
  freed += Settle(std::move(out), /*only_if_copied=*/false);
  return freed;
}

uint64_t Evictor::ReleaseLocal(std::vector<Cohort> cohorts, uint64_t* pages) {
  if (cohorts.empty()) return 0;
  const std::vector<Removal> removals =
      RemoveCohorts(cohorts, kEvictRemoveAttempts, /*only_if_copied=*/true);
  uint64_t freed = 0;
  std::vector<Cohort> orphans;
  for (size_t i = 0; i < cohorts.size(); ++i) {
    Cohort& c = cohorts[i];
    const Removal& r = removals[i];
    const bool all_freed = r.result != RemoveResult::kInUse && r.pinned_keys.empty();
    counters_->evicted_copied_pages.fetch_add(r.pages, std::memory_order_relaxed);
    counters_->evicted_pages.fetch_add(r.pages, std::memory_order_relaxed);
    counters_->evicted_bytes.fetch_add(c.weight * r.pages / std::max<size_t>(c.keys.size(), 1),
                                       std::memory_order_relaxed);
    if (pages != nullptr) *pages += r.pages;
    if (all_freed) freed += c.weight;
    const std::string address = c.remote_address;
    if (r.sole > 0) {
      // The master knows no other live copy: the one on the remote_cache is gone (its own
      // eviction, a restart). Nothing was removed here; the cohort stays, as local only.
      if (hot_->EndMove(c.id, /*local_freed=*/false, {})) {
        hot_->ForgetRemoteCopy(c.id);
        continue;
      }
    } else if (hot_->EndMove(c.id, all_freed, address)) {
      continue;
    } else {
      DropRemote(address, {c});  // the policy evicted it while it moved: its copy there goes
    }
    if (!all_freed) {  // ... and what is left here
      c.remote_address.clear();
      c.moving = false;
      orphans.push_back(std::move(c));
    }
  }
  return freed + Settle(std::move(orphans), /*only_if_copied=*/false);
}

Evictor::DropCounts Evictor::DropRemoteCopies(std::vector<Cohort> cohorts) {
  std::map<std::string, std::vector<Cohort>> by_address;
  for (Cohort& c : cohorts) by_address[c.remote_address].push_back(std::move(c));
  DropCounts total;
  for (const auto& [address, group] : by_address) {
    const DropCounts d = DropRemote(address, group);
    total.dropped += d.dropped;
    total.kept += d.kept;
    total.failed += d.failed;
  }
  return total;
}

Evictor::DropCounts Evictor::DropRemote(const std::string& address,
                                        const std::vector<Cohort>& cohorts) {
  DropCounts counts;
  if (peers_ == nullptr || address.empty() || cohorts.empty()) return counts;
  v1::DropCopiesRequest req;
  req.set_requester_node_id(registration_->identity().node_id);
  const auto send = [&] {
    if (req.items_size() == 0) return;
    const int64_t n = req.items_size();
    // A remote_cache that failed a drop is not asked again for a while: eviction (this may be
    // the maintenance round) never waits on an unreachable peer call after call.
    const auto now = Clock::now();
    bool backing_off = false;
    {
      MutexLock lock(&demote_mu_);
      auto b = drop_backoff_.find(address);
      if (b != drop_backoff_.end() && now < b->second) {
        backing_off = true;
      } else if (b != drop_backoff_.end()) {
        drop_backoff_.erase(b);
      }
    }
    absl::StatusOr<v1::DropCopiesReply> r =
        backing_off ? absl::UnavailableError("backing off after a failed drop")
                    : peers_->DropCopies(address, req, demotion_.drop_timeout);
    if (r.ok()) {
      counts.dropped += r->dropped();
      counts.kept += r->kept() + r->refused();
      counters_->remote_drops_dropped.fetch_add(static_cast<int64_t>(r->dropped()),
                                                std::memory_order_relaxed);
      counters_->remote_drops_kept.fetch_add(static_cast<int64_t>(r->kept()),
                                             std::memory_order_relaxed);
      counters_->remote_drops_not_held.fetch_add(static_cast<int64_t>(r->not_held()),
                                                 std::memory_order_relaxed);
      counters_->remote_drops_refused.fetch_add(static_cast<int64_t>(r->refused()),
                                                std::memory_order_relaxed);
    } else {
      // The copies stay routed and readable there; that owner's own eviction takes them.
      counts.failed += static_cast<uint64_t>(n);
      counters_->remote_drops_failed.fetch_add(n, std::memory_order_relaxed);
      if (!backing_off) {
        spdlog::warn(
            "dropping {} demoted copies on {}: {}; they stay there until it evicts them (no "
            "drops there for {} ms)",
            n, address, r.status().ToString(), kDropBackoff.count());
        MutexLock lock(&demote_mu_);
        if (drop_backoff_.size() < kMaxDropBackoffPeers)
          drop_backoff_[address] = now + kDropBackoff;
      }
    }
    req.clear_items();
  };
  for (const Cohort& c : cohorts) {
    for (const std::string& key : c.keys) {
      v1::DropItem* item = req.add_items();
      item->set_key(key);
      item->set_put_id(c.put_id);
      if (static_cast<size_t>(req.items_size()) >= kRouteRemoveBatch) send();
    }
  }
  send();
  return counts;
}

v1::DropCopiesReply Evictor::DropCopies(const v1::DropCopiesRequest& req) {
  v1::DropCopiesReply out;
  // The named members of each cohort held here.
  std::map<uint64_t, std::vector<std::string>> named;
  for (const v1::DropItem& item : req.items()) {
    // Only the owner that put a value demotes it, so only it may drop the copy (with node-bound
    // certificates the caller's node is its certificate's).
    if (PutIdOrigin(item.put_id()) != req.requester_node_id()) {
      out.set_refused(out.refused() + 1);
      continue;
    }
    const uint64_t cohort = keys_->CommittedCohort(item.key(), item.put_id());
    if (cohort == 0) {
      out.set_not_held(out.not_held() + 1);
      continue;
    }
    named[cohort].push_back(item.key());
  }
  std::vector<Cohort> victims;
  uint64_t asked = 0;
  for (auto& [id, keys] : named) {
    std::optional<Cohort> c = hot_->Take(id);
    if (!c) {  // being evicted or demoted here: that ends it
      out.set_kept(out.kept() + keys.size());
      continue;
    }
    // Members not named stay, as a cohort of their own weight share.
    std::vector<std::string> drop, stay;
    for (std::string& k : c->keys) {
      (std::find(keys.begin(), keys.end(), k) != keys.end() ? drop : stay).push_back(std::move(k));
    }
    out.set_kept(out.kept() + keys.size() - drop.size());  // not members any more
    const uint64_t members = drop.size() + stay.size();
    const uint64_t stay_weight = members == 0 ? 0 : c->weight * stay.size() / members;
    if (!stay.empty()) {  // (named members Settle keeps join it: HotTier::Readmit, one id once)
      Cohort rest = *c;
      rest.keys = std::move(stay);
      rest.weight = stay_weight;
      hot_->Readmit(std::move(rest));
    }
    if (drop.empty()) continue;
    c->keys = std::move(drop);
    c->weight -= stay_weight;
    asked += c->keys.size();
    victims.push_back(std::move(*c));
  }
  uint64_t pages = 0;
  Settle(std::move(victims), /*only_if_copied=*/false, &pages);
  out.set_dropped(pages);
  out.set_kept(out.kept() + (asked - std::min(asked, pages)));
  counters_->dropped_on_request_pages.fetch_add(static_cast<int64_t>(pages),
                                                std::memory_order_relaxed);
  if (pages > 0) CandidatesChanged();
  return out;
}

void Evictor::ReplicaGroupEnded(const std::vector<std::string>& keys, uint64_t put_id,
                                uint64_t demoted_cohort, ReplicaGroupEnd end,
                                const std::string& target) {
  if (demoted_cohort == 0) {
    if (end == ReplicaGroupEnd::kCopied) NoteCopiedElsewhere(keys, put_id);
    return;
  }
  Cohort cohort;
  {
    MutexLock lock(&demote_mu_);
    auto it = demoting_.find(demoted_cohort);
    if (it == demoting_.end()) return;
    cohort = std::move(it->second);
    demoting_.erase(it);
    // One ranking: its bytes stay counted until the cohort's copy counts as remote (EndMove),
    // so a round in between never sees room the remote budget does not have.
    if (!one_ranking()) Undemoting(cohort.weight);
    if (end == ReplicaGroupEnd::kNoSpace) {
      // No remote_cache has room: pause, and let pressure delete as without demotion.
      demotion_paused_until_ = Clock::now() + demotion_backoff_;
      demotion_backoff_ = std::min(demotion_backoff_ * 2, std::chrono::milliseconds(16'000));
    } else if (end == ReplicaGroupEnd::kCopied) {
      demotion_backoff_ = std::chrono::milliseconds(1000);
    }
  }
  const auto members = static_cast<int64_t>(cohort.keys.size());
  const uint64_t demoted_weight = cohort.weight;
  if (one_ranking()) {
    // The cohort stayed ranked while it moved (HotTier::EndMove ends the move).
    if (end == ReplicaGroupEnd::kCopied && !target.empty()) {
      cohort.remote_address = target;
      uint64_t pages = 0;
      ReleaseLocal({std::move(cohort)}, &pages);
      counters_->demoted_pages.fetch_add(static_cast<int64_t>(pages), std::memory_order_relaxed);
    } else {
      (end == ReplicaGroupEnd::kNoSpace ? counters_->demotion_no_space : counters_->demotion_failed)
          .fetch_add(members, std::memory_order_relaxed);
      if (!hot_->EndMove(cohort.id, /*local_freed=*/false, {})) {
        cohort.moving = false;  // the policy evicted it meanwhile: it goes now
        Settle({std::move(cohort)}, /*only_if_copied=*/false);
      }
    }
    {
      MutexLock lock(&demote_mu_);
      Undemoting(demoted_weight);
    }
    CandidatesChanged();
    return;
  }
  switch (end) {
    case ReplicaGroupEnd::kCopied: {
      // The copy is routed: now this location goes (only while the copy stays), then the slots.
      cohort.copied_elsewhere = true;
      uint64_t pages = 0;
      Settle({std::move(cohort)}, /*only_if_copied=*/true, &pages);
      counters_->demoted_pages.fetch_add(static_cast<int64_t>(pages), std::memory_order_relaxed);
      return;
    }
    case ReplicaGroupEnd::kNoSpace:
      counters_->demotion_no_space.fetch_add(members, std::memory_order_relaxed);
      break;
    case ReplicaGroupEnd::kGone:
    case ReplicaGroupEnd::kFailed:
      counters_->demotion_failed.fetch_add(members, std::memory_order_relaxed);
      break;
  }
  // Back where it was (S4): a value gone meanwhile is dropped by a later round (kGone there).
  hot_->Readmit(std::move(cohort));
  CandidatesChanged();
}

uint64_t Evictor::Settle(std::vector<Cohort> victims, bool only_if_copied, uint64_t* pages) {
  if (victims.empty()) return 0;
  const std::vector<Removal> removals =
      RemoveCohorts(victims, kEvictRemoveAttempts, only_if_copied);
  uint64_t evicted = 0;
  for (size_t i = 0; i < victims.size(); ++i) {
    Cohort& cohort = victims[i];
    if (removals[i].result == RemoveResult::kInUse) {
      counters_->eviction_skipped_pinned.fetch_add(1, std::memory_order_relaxed);
      hot_->Readmit(std::move(cohort));  // S4: back to the tier, not dropped
      continue;
    }
    if (only_if_copied) {
      counters_->evicted_copied_pages.fetch_add(removals[i].pages, std::memory_order_relaxed);
    }
    if (pages != nullptr) *pages += removals[i].pages;
    if (!removals[i].pinned_keys.empty()) {
      // A peer reads these members (master pin), or they are the last copy: they stay, with
      // their cohort.
      const size_t members = cohort.keys.size();
      const uint64_t kept_weight = cohort.weight * removals[i].pinned_keys.size() / members;
      const uint64_t freed = cohort.weight - kept_weight;
      evicted += freed;
      Cohort kept = std::move(cohort);
      kept.keys = removals[i].pinned_keys;
      kept.weight = kept_weight;
      if (removals[i].sole > 0) kept.copied_elsewhere = false;  // the hint was stale
      hot_->Readmit(std::move(kept));
      counters_->evicted_pages.fetch_add(removals[i].pages, std::memory_order_relaxed);
      counters_->evicted_bytes.fetch_add(freed, std::memory_order_relaxed);
      continue;
    }
    if (removals[i].result == RemoveResult::kGone) continue;
    evicted += cohort.weight;
    counters_->evicted_pages.fetch_add(removals[i].pages, std::memory_order_relaxed);
    counters_->evicted_cohorts.fetch_add(1, std::memory_order_relaxed);
    counters_->evicted_bytes.fetch_add(cohort.weight, std::memory_order_relaxed);
  }
  return evicted;
}

absl::StatusOr<DeleteOutcome> Evictor::DeletePrefix(const std::string& prefix) {
  FLUXON_RETURN_IF_ERROR(ValidateDeletePrefix(prefix));
  DeleteOutcome remote;
  if (one_ranking()) {
    // The copies this owner demoted under the prefix go too (first: a cohort held in both
    // tiers then loses its copy's place before its local values go).
    const DropCounts d = DropRemoteCopies(hot_->TakeRemoteUnder(prefix));
    remote.deleted += d.dropped;
    remote.skipped_in_use += d.kept;
    remote.unconfirmed += d.failed;
  }
  // Eviction cohorts (one atomic group each) go together, so a group is never split; keys not
  // committed yet have no cohort and count as in use.
  std::map<std::pair<uint64_t, uint64_t>, Cohort> by_cohort;  // (put_id, cohort id)
  uint64_t uncommitted = 0;
  keys_->ForEachWithPrefix(prefix, [&](const std::string& key, uint64_t put_id, uint64_t cohort) {
    if (cohort == 0) {
      ++uncommitted;
      return;
    }
    Cohort& c = by_cohort[{put_id, cohort}];
    c.id = cohort;
    c.put_id = put_id;
    c.keys.push_back(key);
  });
  std::vector<Cohort> cohorts;
  cohorts.reserve(by_cohort.size());
  for (auto& [id, cohort] : by_cohort) cohorts.push_back(std::move(cohort));
  const std::vector<Removal> removals = RemoveCohorts(cohorts, kDeleteRemoveAttempts);
  DeleteOutcome out;
  out.skipped_in_use = uncommitted;
  for (size_t i = 0; i < cohorts.size(); ++i) {
    if (removals[i].result == RemoveResult::kInUse) out.skipped_in_use += cohorts[i].keys.size();
    out.skipped_in_use += removals[i].pinned_keys.size();
    out.unconfirmed += removals[i].unconfirmed;
    if (removals[i].result == RemoveResult::kRemoved && removals[i].pinned_keys.empty()) {
      hot_->ForgetIfAllUnder(cohorts[i].id, prefix);
    }
    out.deleted += removals[i].pages;
  }
  out.deleted += remote.deleted;
  out.skipped_in_use += remote.skipped_in_use + remote.unconfirmed;
  out.unconfirmed += remote.unconfirmed;
  counters_->deleted_pages.fetch_add(out.deleted, std::memory_order_relaxed);
  if (out.unconfirmed > 0) {
    spdlog::warn(
        "delete of prefix '{}': {} values kept because the master did not confirm their route "
        "removal (they stay readable and routed; delete again later)",
        prefix, out.unconfirmed);
  }
  spdlog::info("deleted {} values under prefix '{}' ({} kept: in use or unconfirmed)", out.deleted,
               prefix, out.skipped_in_use);
  return out;
}

bool Evictor::DropUnrouted(const std::string& key, uint64_t put_id) {
  HolderRef resident = keys_->EraseStale(key, put_id);
  if (!resident) return false;
  // Frees the slot now, or when the last reader still holding a view of it releases that view.
  resident.reset();
  return true;
}

std::vector<Evictor::Removal> Evictor::RemoveCohorts(const std::vector<Cohort>& cohorts,
                                                     int attempts, bool only_if_copied) {
  std::vector<Removal> out(cohorts.size());
  // (cohort index, key) of every member marked Evicting.
  std::vector<std::pair<size_t, std::string>> marked;
  for (size_t i = 0; i < cohorts.size(); ++i) {
    const Cohort& cohort = cohorts[i];
    // Mark every member Evicting, only if nothing pins it.
    const size_t first = marked.size();
    bool in_use = false;
    for (const std::string& key : cohort.keys) {
      const KeyIndex::MarkResult r = keys_->MarkEvicting(key, cohort.put_id);
      if (r == KeyIndex::MarkResult::kInUse) {
        in_use = true;
        break;
      }
      if (r == KeyIndex::MarkResult::kMarked) marked.emplace_back(i, key);
    }
    if (in_use) {
      for (size_t m = first; m < marked.size(); ++m) {
        keys_->UnmarkEvicting(marked[m].second, cohort.put_id);
      }
      marked.resize(first);
      out[i].result = RemoveResult::kInUse;
    } else if (marked.size() > first) {
      out[i].result = RemoveResult::kRemoved;
    }
  }
  // S2: the routes go first; the slots are released only after the master removed them.
  std::vector<RouteVerdict> verdicts(marked.size(), RouteVerdict::kUnconfirmed);
  for (size_t begin = 0; begin < marked.size(); begin += kRouteRemoveBatch) {
    v1::RemoveRoutesRequest req;
    req.set_node_id(registration_->identity().node_id);
    req.set_generation(registration_->generation());
    req.set_only_if_copied(only_if_copied);
    for (size_t m = begin; m < std::min(marked.size(), begin + kRouteRemoveBatch); ++m) {
      v1::RouteItem* item = req.add_items();
      item->set_key(marked[m].second);
      item->set_put_id(cohorts[marked[m].first].put_id);
    }
    const std::vector<RouteVerdict> batch = RemoveRoutes(req, attempts);
    for (size_t j = 0; j < batch.size(); ++j) verdicts[begin + j] = batch[j];
  }
  for (size_t m = 0; m < marked.size(); ++m) {
    const auto& [i, key] = marked[m];
    if (verdicts[m] != RouteVerdict::kGone) {
      // Kept (T1: tried again later with the same key + put_id): a reader pins it at the
      // master, or the master did not confirm that the route is gone.
      keys_->UnmarkEvicting(key, cohorts[i].put_id);
      out[i].pinned_keys.push_back(key);
      if (verdicts[m] == RouteVerdict::kPinned) {
        counters_->eviction_skipped_source_pinned.fetch_add(1, std::memory_order_relaxed);
      } else if (verdicts[m] == RouteVerdict::kSole) {
        ++out[i].sole;
        counters_->eviction_kept_sole.fetch_add(1, std::memory_order_relaxed);
      } else {
        ++out[i].unconfirmed;
        counters_->route_remove_unconfirmed.fetch_add(1, std::memory_order_relaxed);
      }
      continue;
    }
    HolderRef last = keys_->EraseEvicting(key, cohorts[i].put_id);
    if (!last) continue;
    last.reset();  // the last reference: the slot returns to Free
    ++out[i].pages;
  }
  return out;
}

std::vector<Evictor::RouteVerdict> Evictor::RemoveRoutes(const v1::RemoveRoutesRequest& req,
                                                         int attempts) {
  std::vector<RouteVerdict> out(req.items_size(), RouteVerdict::kUnconfirmed);
  RetryOptions bounded;
  bounded.max_attempts = attempts;
  absl::StatusOr<v1::RemoveRoutesReply> r = RetryUncertain(
      [&] {
        counters_->route_remove_calls.fetch_add(1, std::memory_order_relaxed);
        return master_->RemoveRoutes(req);
      },
      stop_,
      [&](const absl::Status&, std::chrono::milliseconds) {
        counters_->route_remove_retries.fetch_add(1, std::memory_order_relaxed);
      },
      bounded);
  if (!r.ok()) {
    spdlog::warn("removing {} routes: {}; the values are kept and tried again later",
                 req.items_size(), r.status().ToString());
    return out;
  }
  // A master that does not know only_if_copied answers no `sole` at all: then it removed
  // unconditionally, and removed means gone as for any removal.
  const bool sole_ok = r->sole_size() == req.items_size() || r->sole_size() == 0;
  if (r->removed_size() != req.items_size() || r->pinned_size() != req.items_size() || !sole_ok) {
    spdlog::error("RemoveRoutes answered {}/{}/{} verdicts for {} items; the values are kept",
                  r->removed_size(), r->pinned_size(), r->sole_size(), req.items_size());
    return out;
  }
  registration_->NoteEpoch(r->master_epoch());
  registration_->NoteClock(r->hlc());
  for (int j = 0; j < req.items_size(); ++j) {
    // Not removed and not pinned: this location is not at the master (never published there,
    // or already removed by an earlier attempt whose answer was lost) — gone either way.
    if (r->pinned(j)) {
      out[j] = RouteVerdict::kPinned;
    } else if (r->sole_size() > 0 && r->sole(j)) {
      out[j] = RouteVerdict::kSole;
    } else {
      out[j] = RouteVerdict::kGone;
    }
  }
  return out;
}

}  // namespace fluxon
