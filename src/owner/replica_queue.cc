#include "owner/replica_queue.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_format.h"
#include "rpc/retry.h"
#include "spdlog/spdlog.h"

namespace fluxon {

namespace {

void Add(std::atomic<int64_t>& c, int64_t n) { c.fetch_add(n, std::memory_order_relaxed); }
void AddMicrosSince(std::atomic<int64_t>& c, std::chrono::steady_clock::time_point start) {
  Add(c, std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
             .count());
}

}  // namespace

ReplicaQueue::ReplicaQueue(Options options, MasterRegistration* registration, MasterApi* master,
                           PeerApi* peers, KeyIndex* keys, OwnerCounters* counters,
                           StopSignal* stop, EvictionSignals* ends)
    : options_(options),
      registration_(registration),
      master_(master),
      peers_(peers),
      keys_(keys),
      counters_(counters),
      stop_(stop),
      ends_(ends) {}

void ReplicaQueue::Enqueue(std::vector<ReplicaGroup> groups) {
  int64_t enqueued = 0, full = 0, duplicate = 0;
  std::vector<ReplicaGroup> dropped;
  {
    MutexLock lock(&mu_);
    for (ReplicaGroup& g : groups) {
      if (g.empty()) continue;
      bool seen = false;
      for (const ReplicaTask& t : g) seen |= queued_.contains(TaskId{t.key, t.put_id});
      if (seen) {
        duplicate += static_cast<int64_t>(g.size());
        dropped.push_back(std::move(g));
        continue;
      }
      if (keys_queued_ + g.size() > options_.capacity_keys) {
        full += static_cast<int64_t>(g.size());
        dropped.push_back(std::move(g));
        continue;
      }
      for (const ReplicaTask& t : g) queued_.insert(TaskId{t.key, t.put_id});
      keys_queued_ += g.size();
      enqueued += static_cast<int64_t>(g.size());
      queue_.push_back(std::move(g));
    }
    counters_->replica_queue_keys.store(static_cast<int64_t>(keys_queued_),
                                        std::memory_order_relaxed);
    if (enqueued > 0) cv_.SignalAll();
  }
  Add(counters_->replica_tasks_enqueued, enqueued);
  Add(counters_->replica_tasks_queue_full, full);
  Add(counters_->replica_tasks_duplicate, duplicate);
  if (full > 0) {
    spdlog::warn("replica queue full ({} keys): {} replica tasks dropped", options_.capacity_keys,
                 full);
  }
  for (const ReplicaGroup& g : dropped) Ended(g, ReplicaGroupEnd::kFailed);
}

void ReplicaQueue::Ended(const ReplicaGroup& g, ReplicaGroupEnd end, const std::string& target) {
  if (g.empty()) return;
  if (g.front().write_through) g.front().write_through->GroupEnded(end, g.size());
  if (ends_ == nullptr) return;
  std::vector<std::string> keys;
  keys.reserve(g.size());
  for (const ReplicaTask& t : g) keys.push_back(t.key);
  ends_->ReplicaGroupEnded(keys, g.front().put_id, g.front().demoted_cohort, end, target);
}

size_t ReplicaQueue::queued_keys() const {
  MutexLock lock(&mu_);
  return keys_queued_;
}

bool ReplicaQueue::idle() const {
  MutexLock lock(&mu_);
  return queue_.empty() && batches_in_flight_ == 0;
}

bool ReplicaQueue::FrontReady() const {
  if (queue_.empty()) return false;
  for (const ReplicaTask& t : queue_.front()) {
    if (keys_in_flight_.contains(t.key)) return false;
  }
  return true;
}

void ReplicaQueue::Interrupt() {
  if (peers_ != nullptr) peers_->Cancel();
  MutexLock lock(&mu_);
  cv_.SignalAll();
}

std::vector<ReplicaGroup> ReplicaQueue::TakeBatch() {
  std::vector<ReplicaGroup> batch;
  absl::flat_hash_set<std::string> keys;
  size_t n = 0;
  while (!queue_.empty()) {
    const ReplicaGroup& g = queue_.front();
    if (!batch.empty() && n + g.size() > options_.batch_keys) break;
    // One placement per batch: demotions (remote-only targets) and replicas apart.
    if (!batch.empty() &&
        (batch.front().front().demoted_cohort != 0) != (g.front().demoted_cohort != 0)) {
      break;
    }
    bool repeats = false;
    for (const ReplicaTask& t : g) {
      repeats |= keys.contains(t.key) || keys_in_flight_.contains(t.key);
    }
    if (repeats) break;  // the key again (a newer put of it): a later batch takes it
    for (const ReplicaTask& t : g) keys.insert(t.key);
    n += g.size();
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  for (const std::string& k : keys) keys_in_flight_.insert(k);
  return batch;
}

void ReplicaQueue::Run() {
  for (;;) {
    std::vector<ReplicaGroup> batch;
    std::deque<ReplicaGroup> dropped;
    {
      MutexLock lock(&mu_);
      while (!FrontReady() && !stop_->stopped()) {
        cv_.WaitUntil(&mu_, std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
      }
      if (stop_->stopped()) {
        // Queued tasks end with the owner (its values go with it); nothing was asked for them.
        dropped.swap(queue_);
        queued_.clear();
        keys_queued_ = 0;
        counters_->replica_queue_keys.store(0, std::memory_order_relaxed);
      } else {
        batch = TakeBatch();
        ++batches_in_flight_;
      }
    }
    if (stop_->stopped()) {
      for (const ReplicaGroup& g : dropped) Ended(g, ReplicaGroupEnd::kFailed);
      return;
    }
    Replicate(batch);
    Finished(batch);
  }
}

void ReplicaQueue::Unqueue(const ReplicaGroup& tasks) {
  MutexLock lock(&mu_);
  for (const ReplicaTask& t : tasks) {
    if (queued_.erase(TaskId{t.key, t.put_id}) > 0) --keys_queued_;
  }
  counters_->replica_queue_keys.store(static_cast<int64_t>(keys_queued_),
                                      std::memory_order_relaxed);
}

void ReplicaQueue::EndInFlight(const ReplicaGroup& g, ReplicaGroupEnd end,
                               const std::string& target) {
  Unqueue(g);
  Ended(g, end, target);
}

void ReplicaQueue::Finished(const std::vector<ReplicaGroup>& batch) {
  // Every task of the batch left queued_ when it ended (Unqueue): an identity queued again
  // since is a new task, and stays.
  MutexLock lock(&mu_);
  for (const ReplicaGroup& g : batch) {
    for (const ReplicaTask& t : g) keys_in_flight_.erase(t.key);
  }
  --batches_in_flight_;
  cv_.SignalAll();
}

ReplicaGroup ReplicaQueue::StillHeld(const ReplicaGroup& g) {
  ReplicaGroup held;
  for (const ReplicaTask& t : g) {
    const std::optional<KeyIndex::Identity> id = keys_->IdentityOf(t.key);
    if (id && id->state == KeyIndex::State::kCommitted && id->put_id == t.put_id &&
        id->version == t.version) {
      held.push_back(t);
    } else if (id && id->state == KeyIndex::State::kCommitted) {
      Add(counters_->replica_tasks_obsolete, 1);  // another identity of the key is held now
    } else {
      Add(counters_->replica_tasks_source_gone, 1);  // evicted or deleted first (S3)
    }
  }
  return held;
}

void ReplicaQueue::Replicate(std::vector<ReplicaGroup> batch) {
  std::vector<ReplicaGroup> groups;
  for (const ReplicaGroup& g : batch) {
    ReplicaGroup held = StillHeld(g);
    if (held.empty()) {
      EndInFlight(g, ReplicaGroupEnd::kGone);
      continue;
    }
    if (held.size() != g.size()) {
      // The members no longer held ended here (StillHeld counted them); the rest go on.
      ReplicaGroup gone;
      for (const ReplicaTask& t : g) {
        const bool kept = std::any_of(held.begin(), held.end(),
                                      [&](const ReplicaTask& h) { return h.key == t.key; });
        if (!kept) gone.push_back(t);
      }
      Unqueue(gone);
    }
    groups.push_back(std::move(held));
  }
  if (groups.empty()) return;
  size_t tasks = 0;
  v1::PlaceReplicasRequest place;
  place.set_source_node_id(registration_->identity().node_id);
  place.set_remote_only(groups.front().front().demoted_cohort != 0);
  for (const ReplicaGroup& g : groups) {
    uint64_t bytes = 0;
    for (const ReplicaTask& t : g) bytes += t.slot_bytes;
    place.add_group_bytes(bytes);
    tasks += g.size();
  }
  const auto place_start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::PlaceReplicasReply> placed =
      RetryUncertain([&] { return master_->PlaceReplicas(place); }, stop_,
                     [](const absl::Status&, std::chrono::milliseconds) {},
                     RetryOptions{.max_attempts = options_.max_attempts});
  AddMicrosSince(counters_->replica_place_us, place_start);
  if (placed.ok() && placed->groups_size() != static_cast<int>(groups.size())) {
    placed = absl::DataLossError(
        absl::StrFormat("the master placed %d groups of %d", placed->groups_size(), groups.size()));
  }
  if (!placed.ok()) {
    if (!stop_->stopped()) {
      spdlog::warn("replicas: PlaceReplicas for {} tasks failed: {}", tasks,
                   placed.status().ToString());
    }
    Add(counters_->replica_tasks_failed, static_cast<int64_t>(tasks));
    for (const ReplicaGroup& g : groups) EndInFlight(g, ReplicaGroupEnd::kFailed);
    return;
  }
  // One call per target, its groups' items in order, each group of several keys numbered.
  struct Call {
    std::vector<ReplicaTask> items;
    std::vector<uint32_t> groups;
    uint32_t next_group = 1;
  };
  std::map<std::string, Call> by_target;
  for (size_t g = 0; g < groups.size(); ++g) {
    const v1::PlacedGroup& p = placed->groups(static_cast<int>(g));
    if (!p.placed() || p.peer_address().empty()) {
      Add(counters_->replica_tasks_no_space, static_cast<int64_t>(groups[g].size()));
      EndInFlight(groups[g], ReplicaGroupEnd::kNoSpace);
      continue;
    }
    Add(p.role() == "remote_cache" ? counters_->replica_targets_remote_cache
                                   : counters_->replica_targets_other_roles,
        static_cast<int64_t>(groups[g].size()));
    Call& call = by_target[p.peer_address()];
    const uint32_t number = groups[g].size() > 1 ? call.next_group++ : 0;
    call.items.insert(call.items.end(), groups[g].begin(), groups[g].end());
    call.groups.insert(call.groups.end(), groups[g].size(), number);
  }
  for (const auto& [peer, call] : by_target) PullOn(peer, call.items, call.groups);
}

void ReplicaQueue::PullOn(const std::string& peer_address, const std::vector<ReplicaTask>& items,
                          const std::vector<uint32_t>& groups) {
  std::vector<v1::PullOutcome> final(items.size(), v1::PULL_FAILED);
  if (peers_ == nullptr) {
    Add(counters_->replica_tasks_failed, static_cast<int64_t>(items.size()));
    EndGroups(peer_address, items, groups, final);
    return;
  }
  std::vector<size_t> open(items.size());  // items whose outcome is not final yet
  for (size_t i = 0; i < items.size(); ++i) open[i] = i;
  const absl::Status last = RetryUncertain(
      [&]() -> absl::Status {
        v1::PullReplicasRequest req;
        req.set_requester_node_id(registration_->identity().node_id);
        const uint64_t generation = registration_->generation();
        for (size_t i : open) {
          v1::PullItem* it = req.add_items();
          it->set_key(items[i].key);
          it->set_put_id(items[i].put_id);
          it->set_version(items[i].version);
          it->set_len(items[i].len);
          it->set_source_node_id(registration_->identity().node_id);
          it->set_source_generation(generation);
          it->set_group(groups[i]);
        }
        Add(counters_->replica_pull_calls, 1);
        const auto pull_start = std::chrono::steady_clock::now();
        absl::StatusOr<v1::PullReplicasReply> r =
            peers_->PullReplicas(peer_address, req, options_.pull_timeout);
        AddMicrosSince(counters_->replica_pull_us, pull_start);
        if (!r.ok()) return r.status();
        std::vector<size_t> again;
        for (size_t j = 0; j < open.size(); ++j) {
          final[open[j]] = r->outcomes(static_cast<int>(j));
          if (final[open[j]] == v1::PULL_FAILED) again.push_back(open[j]);
        }
        open = std::move(again);
        if (open.empty()) return absl::OkStatus();
        // A busy key or a failed read at the target: tried again, like an unknown outcome.
        return absl::UnavailableError(
            absl::StrFormat("%d of %d items failed at the target", open.size(), items.size()));
      },
      stop_, [](const absl::Status&, std::chrono::milliseconds) {},
      RetryOptions{.max_attempts = options_.max_attempts});
  if (!last.ok() && !stop_->stopped()) {
    spdlog::warn("replicas: {} of {} pulls on {} not completed: {}", open.size(), items.size(),
                 peer_address, last.ToString());
  }
  for (v1::PullOutcome o : final) {
    switch (o) {
      case v1::PULL_COMPLETED:
        Add(counters_->replica_tasks_completed, 1);
        break;
      case v1::PULL_ALREADY_HELD:
        Add(counters_->replica_tasks_already_held, 1);
        break;
      case v1::PULL_OBSOLETE:
        Add(counters_->replica_tasks_obsolete, 1);
        break;
      case v1::PULL_SOURCE_GONE:
        Add(counters_->replica_tasks_source_gone, 1);
        break;
      case v1::PULL_NO_SPACE:
        Add(counters_->replica_tasks_no_space, 1);
        break;
      default:
        Add(counters_->replica_tasks_failed, 1);
        break;
    }
  }
  EndGroups(peer_address, items, groups, final);
}

void ReplicaQueue::EndGroups(const std::string& target, const std::vector<ReplicaTask>& items,
                             const std::vector<uint32_t>& groups,
                             const std::vector<v1::PullOutcome>& final) {
  for (size_t b = 0; b < items.size();) {
    size_t e = b + 1;
    if (groups[b] != 0) {
      while (e < items.size() && groups[e] == groups[b]) ++e;
    }
    // Whole: every member held there. Placed whole, so no space is the group's; gone only when
    // every member is.
    bool copied = true, no_space = false, gone = true;
    for (size_t i = b; i < e; ++i) {
      copied &= final[i] == v1::PULL_COMPLETED || final[i] == v1::PULL_ALREADY_HELD;
      no_space |= final[i] == v1::PULL_NO_SPACE;
      gone &= final[i] == v1::PULL_SOURCE_GONE || final[i] == v1::PULL_OBSOLETE;
    }
    const ReplicaGroupEnd end = copied     ? ReplicaGroupEnd::kCopied
                                : no_space ? ReplicaGroupEnd::kNoSpace
                                : gone     ? ReplicaGroupEnd::kGone
                                           : ReplicaGroupEnd::kFailed;
    const auto first = items.begin() + static_cast<std::ptrdiff_t>(b);
    const auto last = items.begin() + static_cast<std::ptrdiff_t>(e);
    EndInFlight(ReplicaGroup(first, last), end, target);
    b = e;
  }
}

}  // namespace fluxon
