#include "owner/remote_fetcher.h"

#include <algorithm>
#include <optional>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "common/check.h"
#include "rpc/retry.h"
#include "spdlog/spdlog.h"
#include "transport/transport.h"

namespace fluxon {

struct RemoteFetcher::Target {
  size_t index = 0;  // in the leaders of the batch
  std::string key;
  uint64_t put_id = 0;
  uint64_t version = 0;
  uint64_t len = 0;
  uint32_t source_node_id = 0;  // only this location may be the source (generation 0: any)
  uint64_t source_generation = 0;
  bool reserved = false;        // the key's Reserved(put_id) entry is ours
  std::optional<SlotRef> slot;  // claimed (Prepared) until CommitHidden
  HolderRef holder;             // after the read: the Pending target's holder
  uint64_t get_id = 0;
  v1::RouteLocation source;
  std::string source_address;
  bool read_ok = false;
  enum class Fate { kActive, kInstalled, kFreed, kDeferDone, kDeferRevoke } fate = Fate::kActive;
  FetchMiss miss = FetchMiss::kFailed;  // why, unless installed
  HolderRef result;                     // installed: the canonical holder
  uint64_t cohort = 0;
};

namespace {
std::chrono::milliseconds Margin(std::chrono::milliseconds ttl) {
  return std::min(ttl / 10, std::chrono::milliseconds(2'000));
}
}  // namespace

RemoteFetcher::RemoteFetcher(Options options, MasterRegistration* registration, MasterApi* master,
                             SlotPool* pool, KeyIndex* keys, HotTier<>* hot, Publisher* publisher,
                             OwnerCounters* counters, EvictionSignals* signals,
                             transport::Transport* transport, FaultInjector* faults,
                             StopSignal* stop)
    : options_(options),
      registration_(registration),
      master_(master),
      pool_(pool),
      keys_(keys),
      hot_(hot),
      publisher_(publisher),
      counters_(counters),
      signals_(signals),
      transport_(transport),
      faults_(faults),
      stop_(stop),
      request_base_([] {
        std::random_device rd;
        return (static_cast<uint64_t>(rd()) << 32) ^ rd();
      }()) {}

RemoteFetcher::~RemoteFetcher() {
  // Stopping: nothing can be retried any more. The slots go back to the pool (the owner's
  // memory, and with it every location the master may still name, goes away with this owner).
  std::vector<Quarantined> q;
  std::vector<Pending> u;
  {
    MutexLock lock(&mu_);
    q.swap(quarantine_);
    u.swap(unfinished_);
  }
  for (Quarantined& e : q) {
    for (auto& t : e.targets) Free(*t);
  }
  for (Pending& e : u) {
    for (auto& t : e.targets) Free(*t);
  }
}

uint64_t RemoteFetcher::NextRequestId() {
  const uint64_t id = request_base_ + next_request_.fetch_add(1, std::memory_order_relaxed) + 1;
  return id == 0 ? 1 : id;
}

void RemoteFetcher::Free(Target& t) {
  // A filled target's holder is its slot's last reference (Pending): dropping it frees the slot.
  // An unfilled one is still Prepared and is aborted with its reservation (if it still has one:
  // a quarantined target gave it up already).
  const bool prepared = !t.holder && t.slot;
  t.holder.reset();
  keys_->ReleaseReservation(
      t.reserved ? std::span<const std::string>(&t.key, 1) : std::span<const std::string>(),
      t.put_id, prepared ? std::span<const SlotRef>(&*t.slot, 1) : std::span<const SlotRef>(),
      /*fetch=*/true);
  if (t.slot) counters_->remote_pending_targets.fetch_sub(1, std::memory_order_relaxed);
  t.slot.reset();
  t.reserved = false;
  t.fate = Target::Fate::kFreed;
}

const char* FetchMissName(FetchMiss m) {
  switch (m) {
    case FetchMiss::kNone:
      return "none";
    case FetchMiss::kBusy:
      return "busy";
    case FetchMiss::kNoSpace:
      return "no_space";
    case FetchMiss::kGone:
      return "gone";
    case FetchMiss::kObsolete:
      return "obsolete";
    case FetchMiss::kAlreadyLocal:
      return "already_local";
    case FetchMiss::kFailed:
      return "failed";
  }
  return "failed";
}

std::vector<std::unique_ptr<RemoteFetcher::Target>> RemoteFetcher::ReserveAndClaim(
    const std::vector<RemoteLeader>& leaders, Clock::time_point deadline,
    std::vector<FetchMiss>* misses) {
  std::vector<KeyIndex::TargetRequest> requests;
  requests.reserve(leaders.size());
  for (const RemoteLeader& l : leaders) requests.push_back({l.key, l.put_id, l.len, l.group});
  const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::clamp(deadline - Clock::now(), Clock::duration(std::chrono::milliseconds(1)),
                 Clock::duration(std::chrono::milliseconds(200))));
  const std::vector<KeyIndex::TargetClaim> claims = keys_->ReserveAndClaimEach(requests, wait);
  std::vector<std::unique_ptr<Target>> claimed;
  for (size_t i = 0; i < leaders.size(); ++i) {
    switch (claims[i].outcome) {
      case KeyIndex::TargetOutcome::kBusy:
        (*misses)[i] = leaders[i].len == 0 ? FetchMiss::kFailed : FetchMiss::kBusy;
        continue;
      case KeyIndex::TargetOutcome::kNoSpace:
        (*misses)[i] = FetchMiss::kNoSpace;
        continue;
      case KeyIndex::TargetOutcome::kClaimed:
        break;
    }
    auto t = std::make_unique<Target>();
    t->index = i;
    t->key = leaders[i].key;
    t->put_id = leaders[i].put_id;
    t->version = leaders[i].version;
    t->len = leaders[i].len;
    t->source_node_id = leaders[i].source_node_id;
    t->source_generation = leaders[i].source_generation;
    t->reserved = true;
    t->slot = claims[i].slot;
    counters_->remote_pending_targets.fetch_add(1, std::memory_order_relaxed);
    claimed.push_back(std::move(t));
  }
  return claimed;
}

bool RemoteFetcher::StartGets(std::vector<std::unique_ptr<Target>>& targets,
                              Clock::time_point deadline, std::chrono::milliseconds ttl,
                              bool replica, std::vector<Target*>* started,
                              std::vector<Target*>* revoke) {
  // G8: one BatchGetStart for every target of the batch, the same identity on every retry.
  v1::BatchGetStartRequest req;
  req.set_requester_node_id(registration_->identity().node_id);
  req.set_requester_generation(registration_->generation());
  req.set_request_id(NextRequestId());
  req.set_replica(replica);
  req.set_source_peers_apart(true);  // each source's address once, not in every item
  for (auto& t : targets) {
    v1::GetStartItem* item = req.add_items();
    item->set_key(t->key);
    item->set_put_id(t->put_id);
    item->set_target_offset(pool_->OffsetOf(*t->slot));
    item->set_len(t->len);
    item->set_version(t->version);
    item->set_source_node_id(t->source_node_id);
    item->set_source_generation(t->source_generation);
  }
  absl::StatusOr<v1::BatchGetStartReply> reply = RetryUncertainUntil(
      [&] {
        counters_->remote_get_batches.fetch_add(1, std::memory_order_relaxed);
        return master_->BatchGetStart(req);
      },
      stop_, deadline);
  if (!reply.ok()) {
    if (IsUncertain(reply.status())) {
      // The master may have started these gets; their ids are unknown, so nothing can revoke
      // them: the targets stay claimed until the in-flight TTL has surely passed.
      counters_->remote_start_lost.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("BatchGetStart of {} keys: no answer ({}); quarantining their targets for {} ms",
                   targets.size(), reply.status().ToString(), (ttl + Margin(ttl)).count());
      for (auto& t : targets) UnreserveForQuarantine(*t);
      Quarantine(std::move(targets), Clock::now() + ttl + Margin(ttl));
    } else {
      if (IsGenerationRefused(reply.status())) registration_->NoteRefused();
      spdlog::warn("BatchGetStart of {} keys refused: {}", targets.size(),
                   reply.status().ToString());
      for (auto& t : targets) Free(*t);
    }
    return false;
  }
  // The sources' data-plane addresses, by node (an item naming its own address, as an earlier
  // master answers, keeps it).
  absl::flat_hash_map<uint32_t, const std::string*> peer_address;
  for (const v1::SourcePeer& p : reply->source_peers()) peer_address[p.node_id()] = &p.address();
  static const std::string kNoAddress;
  const auto address_of = [&](const v1::GetStartResult& r) -> const std::string& {
    if (!r.source_address().empty()) return r.source_address();
    auto it = peer_address.find(r.source().node_id());
    return it == peer_address.end() ? kNoAddress : *it->second;
  };
  registration_->NoteInflightGetTtl(reply->inflight_get_ttl_ms());
  registration_->NoteEpoch(reply->master_epoch());
  registration_->NoteClock(reply->hlc());
  std::vector<std::unique_ptr<Target>> unanswered;
  for (size_t j = 0; j < targets.size(); ++j) {
    Target& t = *targets[j];
    if (j >= static_cast<size_t>(reply->results_size())) {
      // A short answer: whether these started is unknown; owned by the quarantine from here.
      UnreserveForQuarantine(t);
      t.fate = Target::Fate::kFreed;
      auto moved = std::make_unique<Target>(std::move(t));
      moved->fate = Target::Fate::kActive;
      unanswered.push_back(std::move(moved));
      continue;
    }
    const v1::GetStartResult& r = reply->results(static_cast<int>(j));
    if (r.outcome() == v1::GET_STARTED &&
        (r.get_id() == 0 || r.source().len() != t.len || r.source().put_id() != t.put_id ||
         r.source().version() != t.version || r.source().generation() == 0 ||
         address_of(r).empty())) {
      // A malformed answer is not read from; its get (if any) is revoked with the failures.
      spdlog::error("BatchGetStart answered a malformed source for {}; not reading it", t.key);
      if (r.get_id() != 0) {
        t.get_id = r.get_id();
        revoke->push_back(&t);
      } else {
        Free(t);
      }
      continue;
    }
    if (r.outcome() != v1::GET_STARTED) {
      switch (r.outcome()) {
        case v1::GET_NO_ROUTE:
        case v1::GET_NO_SOURCE:
          t.miss = FetchMiss::kGone;
          break;
        case v1::GET_STALE_VERSION:
          t.miss = FetchMiss::kObsolete;
          break;
        case v1::GET_ALREADY_LOCAL:
          t.miss = FetchMiss::kAlreadyLocal;
          break;
        case v1::GET_BUSY:
          t.miss = FetchMiss::kBusy;
          break;
        default:
          t.miss = FetchMiss::kFailed;
          break;
      }
      Free(t);
      continue;
    }
    t.get_id = r.get_id();
    t.source = r.source();
    t.source_address = address_of(r);
    started->push_back(&t);
  }
  if (!unanswered.empty()) Quarantine(std::move(unanswered), Clock::now() + ttl + Margin(ttl));
  return true;
}

void RemoteFetcher::UnreserveForQuarantine(Target& t) {
  // The key only: the slot stays Prepared until the quarantine ends (a late peer write may
  // still land in it).
  keys_->ReleaseReservation(std::span<const std::string>(&t.key, 1), t.put_id, {},
                            /*fetch=*/true);
  t.reserved = false;
}

void RemoteFetcher::HideReads(std::vector<Target*>& started, std::vector<Target*>* done,
                              std::vector<Target*>* revoke) {
  for (Target* t : started) {
    if (t->read_ok) {
      absl::StatusOr<HolderRef> h = keys_->CommitHidden(t->key, t->put_id, *t->slot, t->len);
      if (h.ok()) {
        t->holder = std::move(*h);
        done->push_back(t);
        continue;
      }
      spdlog::error("remote-get target of {}: {}", t->key, h.status().ToString());
    }
    revoke->push_back(t);
  }
}

uint32_t RemoteFetcher::Collect(std::vector<std::unique_ptr<Target>>& targets,
                                std::vector<HolderRef>* out, std::vector<uint64_t>* cohorts) {
  std::vector<Pending> deferred(2);
  deferred[0].done = true;
  uint32_t hits = 0;
  for (auto& t : targets) {
    if (!t) continue;
    if (t->fate == Target::Fate::kInstalled) {
      (*out)[t->index] = t->result;
      (*cohorts)[t->index] = t->cohort;
      ++hits;
    } else if (t->fate == Target::Fate::kDeferDone) {
      deferred[0].targets.push_back(std::move(t));
    } else if (t->fate == Target::Fate::kDeferRevoke) {
      deferred[1].targets.push_back(std::move(t));
    }
  }
  size_t moved = 0;
  {
    MutexLock lock(&mu_);
    for (Pending& p : deferred) {
      if (p.targets.empty()) continue;
      moved += p.targets.size();
      unfinished_.push_back(std::move(p));
    }
  }
  if (moved > 0) {
    counters_->remote_unfinished.fetch_add(static_cast<int64_t>(moved), std::memory_order_relaxed);
    spdlog::warn("{} remote gets still unresolved at the master; retrying in the background",
                 moved);
  }
  return hits;
}

std::vector<HolderRef> RemoteFetcher::Fetch(const std::vector<RemoteLeader>& leaders,
                                            std::vector<uint64_t>* cohorts,
                                            std::vector<FetchMiss>* misses, bool replica) {
  const size_t n = leaders.size();
  std::vector<HolderRef> out(n);
  cohorts->assign(n, 0);
  std::vector<FetchMiss> why(n, FetchMiss::kFailed);
  if (misses == nullptr) misses = &why;
  misses->assign(n, FetchMiss::kFailed);
  if (n == 0) return out;
  if (transport_ == nullptr) {
    counters_->remote_misses.fetch_add(n, std::memory_order_relaxed);
    return out;
  }
  counters_->remote_get_keys.fetch_add(n, std::memory_order_relaxed);
  const Clock::time_point t0 = Clock::now();
  const std::chrono::milliseconds ttl = registration_->inflight_get_ttl();
  const Clock::time_point deadline = t0 + std::min(options_.timeout, ttl - Margin(ttl));

  // Each part's time goes to its counter as it ends (the parts follow one another).
  Clock::time_point part_begin = t0;
  const auto part_ended = [&part_begin](std::atomic<int64_t>& counter) {
    const Clock::time_point now = Clock::now();
    counter.fetch_add(
        std::chrono::duration_cast<std::chrono::microseconds>(now - part_begin).count(),
        std::memory_order_relaxed);
    part_begin = now;
  };
  std::vector<std::unique_ptr<Target>> targets = ReserveAndClaim(leaders, deadline, misses);
  part_ended(counters_->remote_claim_us);
  std::vector<Target*> started, revoke;  // revoke: started, but with an answer we do not trust
  const bool any_started =
      !targets.empty() && StartGets(targets, deadline, ttl, replica, &started, &revoke);
  if (!targets.empty()) part_ended(counters_->remote_start_us);
  if (!any_started) {
    for (const auto& t : targets) {
      if (t) (*misses)[t->index] = t->miss;
    }
    counters_->remote_misses.fetch_add(n, std::memory_order_relaxed);
    return out;
  }
  // Reads: bounded by the pin (TTL from before the start, minus the margin) and the deadline.
  ReadAll(started, std::min(deadline, t0 + ttl - Margin(ttl)));
  part_ended(counters_->remote_read_us);
  std::vector<Target*> done;
  HideReads(started, &done, &revoke);
  Finish(done, revoke, std::max(deadline, Clock::now() + std::chrono::milliseconds(500)));
  part_ended(counters_->remote_finish_us);
  for (const auto& t : targets) {
    if (t) (*misses)[t->index] = t->fate == Target::Fate::kInstalled ? FetchMiss::kNone : t->miss;
  }
  const uint32_t hits = Collect(targets, &out, cohorts);
  part_ended(counters_->remote_install_us);
  counters_->remote_hits.fetch_add(hits, std::memory_order_relaxed);
  counters_->remote_misses.fetch_add(n - hits, std::memory_order_relaxed);
  return out;
}

void RemoteFetcher::ReadAll(std::vector<Target*>& started, Clock::time_point read_deadline) {
  if (started.empty()) return;
  // One read batch per source peer (address, generation).
  std::map<std::pair<std::string, uint64_t>, std::vector<Target*>> by_peer;
  for (Target* t : started) by_peer[{t->source_address, t->source.generation()}].push_back(t);
  struct Submitted {
    std::vector<Target*> targets;
    transport::BatchHandle handle;
    uint32_t node = 0;
    Clock::time_point at;
    bool drop = false;
  };
  std::vector<Submitted> batches;
  for (auto& [peer, group] : by_peer) {
    std::optional<FaultRule> rule;
    if (faults_ != nullptr) rule = faults_->Take("peer.read");
    if (rule && rule->action == FaultAction::kDelay) faults_->Sleep(*rule);
    counters_->remote_transfer_submissions.fetch_add(1, std::memory_order_relaxed);
    if (rule && (rule->action == FaultAction::kFail || rule->action == FaultAction::kRefuse)) {
      counters_->remote_transfer_failures.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    std::vector<transport::Descriptor> descs;
    descs.reserve(group.size());
    for (Target* t : group) {
      descs.push_back(
          transport::Descriptor{t->source.offset(), pool_->AddressOf(*t->slot), t->len});
    }
    const auto left = read_deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      counters_->remote_transfer_failures.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    absl::StatusOr<transport::BatchHandle> h =
        transport_->Submit(transport::PeerId{peer.first, peer.second}, transport::OpKind::kRead,
                           descs, absl::FromChrono(left));
    if (!h.ok()) {
      counters_->remote_transfer_failures.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("remote read from {}: {}", peer.first, h.status().ToString());
      continue;
    }
    Submitted s;
    s.targets = group;
    s.handle = *h;
    s.node = group.front()->source.node_id();
    s.at = Clock::now();
    s.drop = rule && rule->action == FaultAction::kDrop;
    batches.push_back(std::move(s));
  }
  for (Submitted& s : batches) {
    const transport::BatchResult& r = s.handle.Wait();
    const Clock::time_point end = Clock::now();
    {
      MutexLock lock(&mu_);
      auto& hist = peer_latency_[s.node];
      if (!hist) hist = std::make_unique<LatencyHistogram>();
      hist->Record(end - s.at);
    }
    if (!r.status.ok() || s.drop) {
      counters_->remote_transfer_failures.fetch_add(1, std::memory_order_relaxed);
      if (!s.drop) {
        spdlog::warn("remote read of {} values from node {}: {}", s.targets.size(), s.node,
                     r.status.ToString());
      }
    }
    // A read that ended after its pin may have lasted is never used (the source may have
    // reused the memory since).
    const bool in_time = end < read_deadline;
    for (size_t j = 0; j < s.targets.size(); ++j) {
      const bool ok = !s.drop && in_time && j < r.descriptors.size() && r.descriptors[j].ok();
      s.targets[j]->read_ok = ok;
      if (ok) counters_->remote_bytes.fetch_add(s.targets[j]->len, std::memory_order_relaxed);
    }
  }
}

void RemoteFetcher::Finish(std::vector<Target*>& done, std::vector<Target*>& revoke,
                           Clock::time_point until) {
  if (!done.empty() && !TryDone(done, until, /*background=*/false)) {
    for (Target* t : done) t->fate = Target::Fate::kDeferDone;
  }
  if (!revoke.empty() && !TryRevoke(revoke, until)) {
    for (Target* t : revoke) t->fate = Target::Fate::kDeferRevoke;
  }
}

bool RemoteFetcher::TryDone(std::vector<Target*>& items, Clock::time_point until, bool background) {
  v1::BatchGetDoneRequest req;
  req.set_requester_node_id(registration_->identity().node_id);
  req.set_requester_generation(registration_->generation());
  for (Target* t : items) {
    v1::GetDoneItem* item = req.add_items();
    item->set_get_id(t->get_id);
    item->set_key(t->key);
    item->set_put_id(t->put_id);
    item->set_target_offset(t->holder->offset);
    item->set_len(t->len);
  }
  absl::StatusOr<v1::BatchGetDoneReply> reply = RetryUncertainUntil(
      [&] {
        counters_->remote_get_done_calls.fetch_add(1, std::memory_order_relaxed);
        return master_->BatchGetDone(req);
      },
      stop_, until);
  if (!reply.ok() && IsUncertain(reply.status())) return false;
  if (reply.ok() && reply->outcomes_size() != req.items_size()) {
    spdlog::error("BatchGetDone answered {} outcomes for {} items; retrying",
                  reply->outcomes_size(), req.items_size());
    return false;
  }
  if (!reply.ok()) {
    // A definite refusal (this generation unknown to the master): nothing was published.
    if (IsGenerationRefused(reply.status())) registration_->NoteRefused();
    spdlog::warn("BatchGetDone of {} gets refused: {}", items.size(), reply.status().ToString());
    for (Target* t : items) Free(*t);
    return true;
  }
  registration_->NoteEpoch(reply->master_epoch());
  std::vector<Cohort> chain;
  std::vector<Cohort> relocalised;  // values of cohorts this owner ranks, fetched back
  for (size_t j = 0; j < items.size(); ++j) {
    Target& t = *items[j];
    switch (reply->outcomes(static_cast<int>(j))) {
      case v1::GET_DONE: {
        // One ranking: a value of a cohort this owner demoted comes back under that cohort.
        const uint64_t ranked = hot_->RemoteCohortOf(t.key, t.put_id);
        if (ranked == 0 && (chain.empty() || chain.back().put_id != t.put_id)) {
          Cohort c;
          c.id = publisher_->NewCohortId();
          c.put_id = t.put_id;
          // The source it was read from holds the value too (recoverable-first eviction; the
          // master decides at removal whether a copy still stays).
          c.copied_elsewhere = true;
          chain.push_back(std::move(c));
        }
        const uint64_t cohort_id = ranked != 0 ? ranked : chain.back().id;
        const SlotRef slot = t.holder->slot;
        HolderRef canonical = t.holder;
        if (!keys_->CommitCopy(t.key, t.put_id, &t.holder, cohort_id, t.version)) {
          // Cannot happen while our reservation stands. The master routes readers to this slot
          // now (GET_DONE), so it must never return to Free and be reused for another value:
          // its route is marked live on the slot (it then outlives its holder) and stays until
          // the master drops it (S2, T2).
          spdlog::error("installing the remote copy of {} failed; its slot stays allocated", t.key);
          FLUXON_DCHECK(false, "a remote copy lost its reservation");
          const absl::Status kept = pool_->PublishRoute(slot);
          if (!kept.ok()) spdlog::error("keeping the slot of {}: {}", t.key, kept.ToString());
          t.fate = Target::Fate::kFreed;
          break;
        }
        t.reserved = false;
        counters_->remote_pending_targets.fetch_sub(1, std::memory_order_relaxed);
        t.slot.reset();
        if (ranked != 0 && (relocalised.empty() || relocalised.back().id != ranked)) {
          relocalised.emplace_back();
          relocalised.back().id = ranked;
          relocalised.back().put_id = t.put_id;
        }
        Cohort& c = ranked != 0 ? relocalised.back() : chain.back();
        c.keys.push_back(t.key);
        c.weight += pool_->SlotSizeOf(slot);
        t.result = background ? HolderRef() : std::move(canonical);
        t.cohort = cohort_id;
        t.fate = Target::Fate::kInstalled;
        break;
      }
      default:  // present elsewhere here, stale, unknown: nothing names this target
        Free(t);
        break;
    }
  }
  // A cohort the policy evicted meanwhile is not here any more: its values fetched back stay
  // as a cohort of their own, like any copy of a peer's value.
  for (Cohort& c : relocalised) {
    counters_->relocalised_pages.fetch_add(static_cast<int64_t>(c.keys.size()),
                                           std::memory_order_relaxed);
    if (hot_->Relocalised(c.id)) continue;
    c.copied_elsewhere = true;
    chain.push_back(std::move(c));
  }
  if (!chain.empty() || !relocalised.empty()) {
    hot_->AdmitChain(std::move(chain), 0);
    signals_->CandidatesChanged();
    // Installed after a republish may have scanned: republish again if the routes moved on.
    registration_->RepublishIfChanged(req.requester_generation(), reply->master_epoch());
  }
  return true;
}

bool RemoteFetcher::TryRevoke(std::vector<Target*>& items, Clock::time_point until) {
  v1::BatchGetRevokeRequest req;
  req.set_requester_node_id(registration_->identity().node_id);
  req.set_requester_generation(registration_->generation());
  for (Target* t : items) req.add_get_ids(t->get_id);
  absl::StatusOr<v1::BatchGetRevokeReply> reply = RetryUncertainUntil(
      [&] {
        counters_->remote_get_revoke_calls.fetch_add(1, std::memory_order_relaxed);
        return master_->BatchGetRevoke(req);
      },
      stop_, until);
  if (!reply.ok() && IsUncertain(reply.status())) return false;
  // Revoked, or refused definitely (the master does not know this generation: it publishes
  // nothing for it): the targets are free either way. Revoke never publishes.
  for (Target* t : items) Free(*t);
  return true;
}

void RemoteFetcher::Quarantine(std::vector<std::unique_ptr<Target>> targets,
                               Clock::time_point until) {
  if (targets.empty()) return;
  counters_->remote_quarantined_slots.fetch_add(static_cast<int64_t>(targets.size()),
                                                std::memory_order_relaxed);
  MutexLock lock(&mu_);
  quarantine_.push_back(Quarantined{std::move(targets), until});
}

void RemoteFetcher::RunMaintenance(Clock::time_point now) {
  std::vector<Quarantined> due;
  std::vector<Pending> retry;
  {
    MutexLock lock(&mu_);
    for (auto it = quarantine_.begin(); it != quarantine_.end();) {
      if (it->until <= now) {
        due.push_back(std::move(*it));
        it = quarantine_.erase(it);
      } else {
        ++it;
      }
    }
    if (now >= next_unfinished_retry_) retry.swap(unfinished_);
  }
  for (Quarantined& q : due) {
    counters_->remote_quarantined_slots.fetch_sub(static_cast<int64_t>(q.targets.size()),
                                                  std::memory_order_relaxed);
    for (auto& t : q.targets) Free(*t);
  }
  std::vector<Pending> still;
  for (Pending& p : retry) {
    if (stop_->stopped()) {
      still.push_back(std::move(p));
      continue;
    }
    std::vector<Target*> items;
    for (auto& t : p.targets) items.push_back(t.get());
    const bool resolved = p.done ? TryDone(items, now, /*background=*/true) : TryRevoke(items, now);
    if (resolved) {
      counters_->remote_unfinished.fetch_sub(static_cast<int64_t>(p.targets.size()),
                                             std::memory_order_relaxed);
    } else {
      still.push_back(std::move(p));
    }
  }
  if (!retry.empty()) {
    // Each round calls the master once per unresolved batch; while it stays unreachable the
    // rounds back off (25 ms .. 1 s), so the maintenance actor keeps evicting in between.
    MutexLock lock(&mu_);
    unfinished_backoff_ = still.empty()
                              ? std::chrono::milliseconds(25)
                              : std::min(unfinished_backoff_ * 2, std::chrono::milliseconds(1000));
    next_unfinished_retry_ = Clock::now() + unfinished_backoff_;
    for (Pending& p : still) unfinished_.push_back(std::move(p));
  }
}

std::map<uint32_t, LatencyHistogram::Snapshot> RemoteFetcher::PeerLatency() const {
  std::map<uint32_t, LatencyHistogram::Snapshot> out;
  MutexLock lock(&mu_);
  for (const auto& [node, h] : peer_latency_) out[node] = h->Read();
  return out;
}

}  // namespace fluxon
