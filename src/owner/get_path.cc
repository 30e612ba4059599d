#include "owner/get_path.h"

#include "fluxon/status.h"

namespace fluxon {

using Clock = std::chrono::steady_clock;

GetPath::~GetPath() {
  std::deque<PrefetchChunk> left;
  {
    MutexLock lock(&prefetch_mu_);
    left.swap(prefetch_queue_);
  }
  for (PrefetchChunk& c : left) EndChunk(c, /*fetch=*/false);
}

absl::StatusOr<GetStartOutcome> GetPath::Start(uint64_t client_id,
                                               const std::vector<std::string>& keys,
                                               const std::vector<uint32_t>& group_lens,
                                               bool prefix_best_effort, bool allow_deferred,
                                               bool defer_prefetch_wake) {
  FLUXON_RETURN_IF_ERROR(ValidateKeys(keys));
  FLUXON_RETURN_IF_ERROR(ValidateGroups(group_lens, keys.size()));
  const Clock::time_point began = Clock::now();
  const size_t n = keys.size();
  counters_->get_batches.fetch_add(1, std::memory_order_relaxed);
  counters_->get_keys.fetch_add(n, std::memory_order_relaxed);
  GetStartOutcome out;
  std::vector<HolderRef> held(n);
  std::vector<uint64_t> cohort_of(n, 0);
  std::vector<HandleTable::Pending> deferred;
  Deferral defer;
  defer.allowed =
      allow_deferred && options_.prefetch_workers > 0 && remote_ != nullptr && remote_->enabled();
  defer.wake_later = defer_prefetch_wake;
  HoldKeys(keys, &out, held, cohort_of, defer, &deferred);

  // G4: results are already in original order; compute the prefix over the caller's groups (a
  // value being fetched counts as a hit: its route was found).
  std::vector<bool> hits(n);
  for (size_t i = 0; i < n; ++i) hits[i] = static_cast<bool>(held[i]);
  for (const HandleTable::Pending& p : deferred) hits[p.index] = true;
  out.prefix = ComputePrefix(hits, group_lens);
  if (!prefix_best_effort && !out.prefix.all_hit()) out.prefix.transferable_len = 0;
  const uint32_t t = out.prefix.transferable_len;
  counters_->hits.fetch_add(t, std::memory_order_relaxed);
  counters_->misses.fetch_add(n - t, std::memory_order_relaxed);

  // G5: release everything past the transferable prefix now (a fetch past it still ends and
  // installs its copies; nothing here waits for it).
  uint32_t released = 0;
  for (size_t i = t; i < n; ++i) {
    if (held[i]) {
      held[i].reset();
      ++released;
    }
  }
  std::erase_if(deferred, [t](const HandleTable::Pending& p) { return p.index >= t; });
  counters_->suffix_released.fetch_add(released, std::memory_order_relaxed);
  if (t > 0) {
    OpenPrefix(client_id, group_lens, cohort_of, t, std::move(held), std::move(deferred), &out);
  }
  if (out.deferred) {
    counters_->deferred_start_us.fetch_add(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - began).count(),
        std::memory_order_relaxed);
  }
  return out;
}

void GetPath::HoldKeys(const std::vector<std::string>& keys, GetStartOutcome* out,
                       std::vector<HolderRef>& held, std::vector<uint64_t>& cohort_of,
                       Deferral defer, std::vector<HandleTable::Pending>* deferred) {
  const size_t n = keys.size();
  std::vector<std::shared_ptr<SharedGetOp>> joined(n), led(n);
  // Classify every key (G1) with one O(1) shard section each (G3, G10).
  for (size_t i = 0; i < n; ++i) {
    if (keys_->Pin(keys[i], &held[i], &cohort_of[i])) {
      ++out->local_pinned;
      continue;
    }
    auto [op, leads] = flights_->LeadOrJoin(keys[i]);
    if (leads) {
      led[i] = std::move(op);
      ++out->leader_started;
    } else {
      joined[i] = std::move(op);
      ++out->inflight_joined;
    }
  }
  // G8: the batch's leaders go to the master as one Lookup, after every pin and marker (G2).
  if (out->leader_started > 0) LookupLeaders(keys, led, held, cohort_of, defer, deferred);
  // Joiners observe their leader's terminal state and canonical holder (G7).
  if (out->inflight_joined > 0) {
    const auto begin = Clock::now();
    const auto deadline = begin + options_.join_timeout;
    for (size_t i = 0; i < n; ++i) {
      if (!joined[i]) continue;
      if (!defer.allowed) {
        held[i] = joined[i]->Wait(deadline);
      } else if (joined[i]->WaitDecided(deadline, &held[i])) {
        // Another get's leader is fetching it from another owner: counted as being fetched,
        // like this batch's own remote leaders (G11), not waited for here.
        deferred->push_back(HandleTable::Pending{static_cast<uint32_t>(i), std::move(joined[i])});
      }
    }
    counters_->remote_join_wait_us.fetch_add(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - begin).count(),
        std::memory_order_relaxed);
  }
  counters_->local_pinned.fetch_add(out->local_pinned, std::memory_order_relaxed);
  counters_->inflight_joined.fetch_add(out->inflight_joined, std::memory_order_relaxed);
  counters_->leader_started.fetch_add(out->leader_started, std::memory_order_relaxed);
}

void GetPath::NotePeerReads(const google::protobuf::RepeatedPtrField<v1::PeerRead>& reads) {
  int64_t touched_keys = 0;
  std::vector<uint64_t> touched;
  for (const v1::PeerRead& read : reads) {
    // Tail first, as a restore touches (the head stays warmest).
    touched.clear();
    const int n = std::min(read.keys_size(), read.put_ids_size());
    for (int i = n; i-- > 0;) {
      const uint64_t cohort = keys_->CommittedCohort(read.keys(i), read.put_ids(i));
      if (cohort == 0) continue;
      ++touched_keys;
      if (touched.empty() || touched.back() != cohort) touched.push_back(cohort);
    }
    if (!touched.empty()) hot_->Touch(touched);
  }
  counters_->peer_read_touches.fetch_add(touched_keys, std::memory_order_relaxed);
}

void GetPath::OpenPrefix(uint64_t client_id, const std::vector<uint32_t>& group_lens,
                         const std::vector<uint64_t>& cohort_of, uint32_t t,
                         std::vector<HolderRef> held, std::vector<HandleTable::Pending> deferred,
                         GetStartOutcome* out) {
  // Touch the restored chain tail first, so its head stays warmest.
  std::vector<uint64_t> touched;
  for (size_t i = t; i-- > 0;) {
    if (cohort_of[i] != 0 && (touched.empty() || touched.back() != cohort_of[i])) {
      touched.push_back(cohort_of[i]);
    }
  }
  hot_->Touch(touched);

  std::vector<uint32_t> prefix_groups;
  if (!group_lens.empty()) {
    uint32_t covered = 0;
    for (uint32_t g : group_lens) {
      if (covered + g > t) break;
      prefix_groups.push_back(g);
      covered += g;
    }
  }
  held.resize(t);
  if (!deferred.empty()) {
    counters_->deferred_gets.fetch_add(1, std::memory_order_relaxed);
    out->deferred = true;
    out->handle_id =
        handles_->Open(client_id, std::move(held), std::move(prefix_groups), std::move(deferred));
    return;
  }
  out->offsets.reserve(t);
  out->lens.reserve(t);
  for (size_t i = 0; i < t; ++i) {
    out->offsets.push_back(held[i]->offset);
    out->lens.push_back(held[i]->len);
  }
  out->handle_id = handles_->Open(client_id, std::move(held), std::move(prefix_groups));
}

void GetPath::LookupLeaders(const std::vector<std::string>& keys,
                            std::vector<std::shared_ptr<SharedGetOp>>& led,
                            std::vector<HolderRef>& held, std::vector<uint64_t>& cohort_of,
                            Deferral defer, std::vector<HandleTable::Pending>* deferred) {
  v1::LookupRequest req;
  req.set_requester_node_id(registration_->identity().node_id);
  const uint32_t me = registration_->identity().node_id;
  const uint64_t my_generation = registration_->generation();
  std::vector<size_t> leader_index;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (led[i]) {
      req.add_keys(keys[i]);
      leader_index.push_back(i);
    }
  }
  const Clock::time_point lookup_start = Clock::now();
  absl::StatusOr<v1::LookupReply> reply = master_->Lookup(req);
  counters_->lookup_calls.fetch_add(1, std::memory_order_relaxed);
  counters_->lookup_us.fetch_add(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - lookup_start).count(),
      std::memory_order_relaxed);
  auto found = [&](size_t j) {
    return reply.ok() && j < static_cast<size_t>(reply->found_size()) && reply->found(j);
  };
  // G5: the prefix ends at the first key nobody has; a remote fetch past it would be released
  // at once, so it is not started.
  size_t first_miss = keys.size();
  for (size_t j = 0; j < leader_index.size(); ++j) {
    if (!found(j)) {
      first_miss = leader_index[j];
      break;
    }
  }
  std::vector<RemoteLeader> remote;
  std::vector<size_t> remote_index;
  for (size_t j = 0; j < leader_index.size(); ++j) {
    const size_t i = leader_index[j];
    if (!found(j)) continue;
    const v1::Route& route = reply->routes(j);
    bool here = false;  // a location on this owner's generation
    for (const v1::RouteLocation& l : route.locations()) {
      here |= l.node_id() == me && l.generation() == my_generation;
    }
    if (route.locations_size() == 0) {
      here = route.node_id() == me && route.generation() == my_generation;
    }
    if (here) {
      // Published here after we looked: take the canonical holder (T2: same put_id).
      keys_->PinVersion(keys[i], route.put_id(), &held[i], &cohort_of[i]);
    } else if (remote_ != nullptr && i < first_miss) {
      remote.push_back(RemoteLeader{keys[i], route.put_id(), route.len(), route.version()});
      remote_index.push_back(i);
    }
  }
  // Routed elsewhere and about to be fetched: a deferred joiner need not wait for the read.
  for (size_t i : remote_index) led[i]->MarkRouted();
  bool queued = false;
  if (!remote.empty() && defer.allowed) {
    // In key order, so the first chunk covers the start of the prefix.
    std::vector<PrefetchChunk> chunks;
    const uint64_t chunk_bytes =
        options_.prefetch_chunk_bytes == 0 ? UINT64_MAX : options_.prefetch_chunk_bytes;
    uint64_t bytes = chunk_bytes;
    for (size_t r = 0; r < remote.size(); ++r) {
      if (bytes >= chunk_bytes) {
        chunks.emplace_back();
        bytes = 0;
      }
      bytes += remote[r].len;
      chunks.back().leaders.push_back(remote[r]);
      chunks.back().ops.push_back(led[remote_index[r]]);
    }
    queued = QueuePrefetch(std::move(chunks), defer.wake_later);
    if (queued) {
      for (size_t i : remote_index) {
        deferred->push_back(HandleTable::Pending{static_cast<uint32_t>(i), std::move(led[i])});
      }
    }
  }
  if (!remote.empty() && !queued) {
    std::vector<uint64_t> cohorts;
    std::vector<HolderRef> fetched = remote_->Fetch(remote, &cohorts);
    for (size_t r = 0; r < remote_index.size(); ++r) {
      held[remote_index[r]] = std::move(fetched[r]);
      cohort_of[remote_index[r]] = cohorts[r];
    }
  }
  // Every leader's op ends with its key's one canonical holder (or a miss), seen by its joiners;
  // a queued one's ends with its chunk.
  for (size_t i : leader_index) {
    if (led[i]) flights_->Finish(keys[i], led[i], held[i]);
  }
}

bool GetPath::QueuePrefetch(std::vector<PrefetchChunk> chunks, bool wake_later) {
  {
    MutexLock lock(&prefetch_mu_);
    if (stop_ == nullptr || stop_->stopped() ||
        prefetch_queue_.size() + chunks.size() > kMaxQueuedChunks) {
      return false;
    }
    for (PrefetchChunk& c : chunks) prefetch_queue_.push_back(std::move(c));
    if (wake_later) {
      prefetch_wake_owed_ = true;
      return true;
    }
  }
  prefetch_cv_.SignalAll();
  return true;
}

void GetPath::WakePrefetches() {
  {
    MutexLock lock(&prefetch_mu_);
    if (!prefetch_wake_owed_) return;
    prefetch_wake_owed_ = false;
  }
  prefetch_cv_.SignalAll();
}

void GetPath::EndChunk(PrefetchChunk& chunk, bool fetch) {
  std::vector<HolderRef> fetched(chunk.leaders.size());
  if (fetch) {
    std::vector<uint64_t> cohorts;
    fetched = remote_->Fetch(chunk.leaders, &cohorts);
  }
  for (size_t j = 0; j < chunk.leaders.size(); ++j) {
    flights_->Finish(chunk.leaders[j].key, chunk.ops[j], std::move(fetched[j]));
  }
}

void GetPath::RunPrefetches() {
  for (;;) {
    std::optional<PrefetchChunk> chunk;
    std::deque<PrefetchChunk> left;
    {
      MutexLock lock(&prefetch_mu_);
      while (prefetch_queue_.empty() && !stop_->stopped()) {
        prefetch_cv_.WaitUntil(&prefetch_mu_,
                               std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
      }
      if (stop_->stopped()) {
        left.swap(prefetch_queue_);
      } else {
        chunk.emplace(std::move(prefetch_queue_.front()));
        prefetch_queue_.pop_front();
      }
    }
    if (!chunk) {
      for (PrefetchChunk& c : left) EndChunk(c, /*fetch=*/false);
      return;
    }
    EndChunk(*chunk, /*fetch=*/true);
  }
}

void GetPath::InterruptPrefetches() {
  MutexLock lock(&prefetch_mu_);
  prefetch_cv_.SignalAll();
}

absl::Status GetPath::Transfer(uint64_t client_id, uint64_t handle_id, uint32_t consume,
                               std::vector<HandleTable::Located>* located) {
  return Changed(handles_->Consume(client_id, handle_id, consume,
                                   Clock::now() + options_.transfer_wait, located));
}

absl::Status GetPath::Cancel(uint64_t client_id, uint64_t handle_id) {
  return Changed(handles_->Cancel(client_id, handle_id));
}

absl::Status GetPath::Release(uint64_t client_id, uint64_t handle_id) {
  return Changed(handles_->Release(client_id, handle_id));
}

size_t GetPath::ExpireDue(Clock::time_point now) {
  const size_t n = handles_->ExpireDue(now);
  if (n > 0) signals_->CandidatesChanged();
  return n;
}

size_t GetPath::DropSession(uint64_t client_id) {
  const size_t n = handles_->DropSession(client_id);
  if (n > 0) signals_->CandidatesChanged();
  return n;
}

}  // namespace fluxon
