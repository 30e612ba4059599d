#include "owner/owner_core.h"

#include <algorithm>

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "fluxon/status.h"
#include "fluxon/units.h"
#include "spdlog/spdlog.h"

namespace fluxon {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

struct OwnerCore::KeyEntry {
  enum class State : uint8_t { kReserved, kLocalVisible, kCommitted, kEvicting };
  State state = State::kReserved;
  uint64_t put_id = 0;
  HolderRef resident;  // set from commit on; the value's canonical MemoryInfo
  uint64_t cohort_id = 0;
};

struct OwnerCore::PutBatch {
  uint64_t client_id = 0;
  uint64_t put_id = 0;
  std::vector<std::string> keys;
  std::vector<SlotRef> slots;
  uint64_t value_len = 0;
  std::vector<uint32_t> group_lens;
  std::string parent_key;
  Clock::time_point deadline;  // put_lease: aborted when not committed or aborted by then
};

struct OwnerCore::GetHandle {
  uint64_t id = 0;
  uint64_t client_id = 0;
  std::vector<HolderRef> pins;
  std::vector<uint32_t> group_lens;  // of the transferable prefix
  bool consumed = false;
  Clock::time_point deadline;  // handle_ttl before get_transfer, view_lease after
};

// One per key being fetched by a leader; joiners wait on it (G6/G7).
struct OwnerCore::SharedGetOp {
  enum class Phase : uint8_t { kStarting, kReady, kFailed };
  Mutex mu;
  CondVar cv;
  Phase phase ABSL_GUARDED_BY(mu) = Phase::kStarting;
  HolderRef holder ABSL_GUARDED_BY(mu);

  void Finish(HolderRef h) {
    MutexLock lock(&mu);
    phase = h ? Phase::kReady : Phase::kFailed;
    holder = std::move(h);
    cv.SignalAll();
  }
  HolderRef Wait(Clock::time_point deadline) {
    MutexLock lock(&mu);
    while (phase == Phase::kStarting) {
      if (!cv.WaitUntil(&mu, deadline) && phase == Phase::kStarting) return HolderRef();
    }
    return holder;
  }
};

struct OwnerCore::PublishJob {
  std::shared_ptr<PutBatch> batch;
  PutDoneCallback done;
};

struct OwnerCore::Counters {
  std::atomic<int64_t> put_batches{0}, put_pages{0}, put_conflicts{0}, put_no_space{0},
      put_aborts{0}, put_commits{0}, publish_batches{0}, publish_retries{0}, publish_failures{0},
      superseded{0}, get_batches{0}, get_keys{0}, local_pinned{0}, inflight_joined{0},
      leader_started{0}, hits{0}, misses{0}, suffix_released{0}, handles_expired{0},
      evicted_cohorts{0}, evicted_pages{0}, evicted_bytes{0}, eviction_rounds{0},
      eviction_skipped_pinned{0}, route_remove_retries{0}, local_visible_entries{0},
      committed_entries{0}, reserved_entries{0}, live_handles{0}, live_views{0}, disconnects{0},
      deleted_pages{0}, route_remove_calls{0}, puts_expired{0}, views_expired{0},
      commit_timeouts{0}, master_reregistrations{0};
};

absl::StatusOr<std::unique_ptr<OwnerCore>> OwnerCore::Create(const OwnerConfig& config,
                                                             MasterApi* master,
                                                             OwnerOptions options) {
  if (master == nullptr) return absl::InvalidArgumentError("owner needs a master");
  options.hot_capacity_ratio = config.hot_capacity_ratio;
  std::unique_ptr<OwnerCore> core(new OwnerCore(master, options));
  OwnerCore* raw = core.get();
  FLUXON_ASSIGN_OR_RETURN(
      core->memory_, OwnerMemory::Create(config, options.node_id,
                                         [raw](const PressureEvent&) { raw->SignalPressure(); }));
  return core;
}

OwnerCore::OwnerCore(MasterApi* master, OwnerOptions options)
    : master_(master), options_(std::move(options)), counters_(std::make_unique<Counters>()) {}

OwnerCore::~OwnerCore() {
  Stop();
  // Holders must go before the pool they pin.
  std::vector<std::shared_ptr<KeyEntry>> entries;
  keys_.ForEach(
      [&](const std::string&, const std::shared_ptr<KeyEntry>& e) { entries.push_back(e); });
  for (auto& e : entries) e->resident.reset();
  std::vector<std::shared_ptr<GetHandle>> handles;
  handles_.ForEach(
      [&](const uint64_t&, const std::shared_ptr<GetHandle>& h) { handles.push_back(h); });
  for (auto& h : handles) h->pins.clear();
}

absl::Status OwnerCore::RegisterWithMaster() {
  v1::RegisterOwnerRequest req;
  req.set_node_id(options_.node_id);
  req.set_generation(generation());
  req.set_role(options_.role);
  req.set_capacity_bytes(memory_->segment().data_bytes());
  return master_->RegisterOwner(req).status();
}

absl::Status OwnerCore::Start() {
  const auto give_up = Clock::now() + options_.register_timeout;
  auto backoff = std::chrono::milliseconds(25);
  for (int attempt = 0;; ++attempt) {
    absl::Status r = RegisterWithMaster();
    if (r.ok()) break;
    // Uncertain: retry a bounded number of times. AlreadyExists: the node_id's previous owner
    // (this node before a kill -9) is still within its lease; wait for it to lapse, bounded.
    const bool lease_held = r.code() == absl::StatusCode::kAlreadyExists;
    if ((!IsUncertain(r) && !lease_held) || (!lease_held && attempt >= 20) ||
        Clock::now() + backoff > give_up) {
      return absl::Status(r.code(),
                          absl::StrFormat("registering with the master: %s", r.message()));
    }
    if (lease_held && attempt == 0) {
      spdlog::warn("{}; waiting for the lease to pass", std::string(r.message()));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  started_ = true;
  threads_.emplace_back([this] { PublishLoop(); });
  threads_.emplace_back([this] { MaintenanceLoop(); });
  threads_.emplace_back([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

void OwnerCore::HeartbeatLoop() {
  bool failing = false;
  while (SleepUnlessStopping(options_.heartbeat_interval)) {
    absl::Status r = RegisterWithMaster();
    if (!r.ok() && !failing) {
      spdlog::warn("heartbeat to the master failed: {}", r.ToString());
    } else if (r.ok() && failing) {
      spdlog::info("heartbeat to the master succeeded again");
    }
    failing = !r.ok();
  }
}

void OwnerCore::BeginStop() {
  stop_requested_.store(true, std::memory_order_release);
  {
    MutexLock lock(&actor_mu_);
    stopping_ = true;
    actor_cv_.SignalAll();
  }
  {
    MutexLock lock(&publish_mu_);
    publish_cv_.SignalAll();
  }
  if (memory_) memory_->pool().CancelClaims();
}

void OwnerCore::Stop() {
  BeginStop();
  if (threads_.empty()) return;
  for (auto& t : threads_) t.join();
  threads_.clear();
  if (started_) {
    // Give the node_id back so a restarted owner need not wait for the lease (best effort).
    v1::UnregisterOwnerRequest req;
    req.set_node_id(options_.node_id);
    req.set_generation(generation());
    absl::StatusOr<v1::UnregisterOwnerReply> r = master_->UnregisterOwner(req);
    if (!r.ok()) spdlog::info("unregistering from the master: {}", r.status().ToString());
  }
}

bool OwnerCore::SleepUnlessStopping(std::chrono::milliseconds d) {
  MutexLock lock(&actor_mu_);
  const auto deadline = Clock::now() + d;
  while (!stopping_) {
    if (!actor_cv_.WaitUntil(&actor_mu_, deadline)) break;
  }
  return !stopping_;
}

// ---------------------------------------------------------------------------------------------
// Put path

absl::StatusOr<PutStartOutcome> OwnerCore::PutStart(uint64_t client_id, const PutStartArgs& a,
                                                    std::vector<uint32_t>* conflicts) {
  FLUXON_RETURN_IF_ERROR(ValidateKeys(a.keys));
  FLUXON_RETURN_IF_ERROR(ValidateParentKey(a.parent_key, a.keys));
  FLUXON_RETURN_IF_ERROR(ValidateValueLen(a.value_len));
  FLUXON_RETURN_IF_ERROR(ValidateGroups(a.atomic_group_lens, a.keys.size()));
  FLUXON_RETURN_IF_ERROR(
      ValidateReplicaMask(a.make_replica_task_mask, a.atomic_group_lens, a.keys.size()));
  if (a.write_through) {
    return absl::UnimplementedError(
        "write_through needs a remote owner; this deployment has none (use write_through=False)");
  }
  const uint64_t put_id = next_put_id_.fetch_add(1);
  // Reserve every key, one shard lock each (G3); collect conflicts.
  std::vector<size_t> reserved;
  reserved.reserve(a.keys.size());
  for (size_t i = 0; i < a.keys.size(); ++i) {
    auto entry = std::make_shared<KeyEntry>();
    entry->put_id = put_id;
    if (keys_.InsertIfAbsent(a.keys[i], entry)) {
      reserved.push_back(i);
    } else if (conflicts != nullptr) {
      conflicts->push_back(static_cast<uint32_t>(i));
    }
  }
  auto unreserve = [&] {
    for (size_t i : reserved) {
      keys_.EraseIf(a.keys[i], [&](const std::shared_ptr<KeyEntry>& e) {
        return e->put_id == put_id && e->state == KeyEntry::State::kReserved;
      });
    }
  };
  if (reserved.size() != a.keys.size()) {
    unreserve();
    counters_->put_conflicts.fetch_add(1, std::memory_order_relaxed);
    const size_t n = a.keys.size() - reserved.size();
    return absl::AlreadyExistsError(
        absl::StrFormat("%d of %d keys are already stored or being written; nothing was reserved",
                        n, a.keys.size()));
  }
  counters_->reserved_entries.fetch_add(a.keys.size(), std::memory_order_relaxed);
  absl::StatusOr<std::vector<SlotRef>> slots =
      memory_->pool().Claim(static_cast<uint64_t>(a.value_len), a.keys.size());
  if (!slots.ok()) {
    unreserve();
    counters_->reserved_entries.fetch_sub(a.keys.size(), std::memory_order_relaxed);
    if (slots.status().code() == absl::StatusCode::kResourceExhausted) {
      counters_->put_no_space.fetch_add(1, std::memory_order_relaxed);
    }
    return slots.status();
  }
  auto batch = std::make_shared<PutBatch>();
  batch->client_id = client_id;
  batch->put_id = put_id;
  batch->keys = a.keys;
  batch->slots = std::move(*slots);
  batch->value_len = static_cast<uint64_t>(a.value_len);
  batch->group_lens = a.atomic_group_lens;
  batch->parent_key = a.parent_key;
  batch->deadline = Clock::now() + options_.put_lease;
  PutStartOutcome out;
  out.put_id = put_id;
  out.offsets.reserve(batch->slots.size());
  for (const SlotRef& s : batch->slots) out.offsets.push_back(memory_->pool().OffsetOf(s));
  puts_.InsertIfAbsent(put_id, std::move(batch));
  counters_->put_batches.fetch_add(1, std::memory_order_relaxed);
  counters_->put_pages.fetch_add(a.keys.size(), std::memory_order_relaxed);
  return out;
}

absl::StatusOr<std::shared_ptr<OwnerCore::PutBatch>> OwnerCore::TakePreparedBatch(
    uint64_t client_id, uint64_t put_id) {
  std::shared_ptr<PutBatch> taken;
  bool wrong_client = false;
  puts_.Update(put_id, [&](std::shared_ptr<PutBatch>* b, bool* erase) {
    if (b == nullptr) return 0;
    if ((*b)->client_id != client_id) {
      wrong_client = true;
      return 0;
    }
    taken = std::move(*b);
    *erase = true;
    return 0;
  });
  if (!taken || wrong_client) {
    // Another session's put is indistinguishable from none: ids are not usable across sessions.
    return absl::NotFoundError(absl::StrFormat(
        "put %d is not prepared in this session (committed, aborted or expired)", put_id));
  }
  return taken;
}

absl::Status OwnerCore::PutAbort(uint64_t client_id, uint64_t put_id) {
  FLUXON_ASSIGN_OR_RETURN(std::shared_ptr<PutBatch> taken, TakePreparedBatch(client_id, put_id));
  PutBatch& b = *taken;
  for (size_t i = 0; i < b.keys.size(); ++i) {
    keys_.EraseIf(b.keys[i], [&](const std::shared_ptr<KeyEntry>& e) {
      return e->put_id == put_id && e->state == KeyEntry::State::kReserved;
    });
    (void)memory_->pool().Abort(b.slots[i]);
  }
  counters_->reserved_entries.fetch_sub(b.keys.size(), std::memory_order_relaxed);
  counters_->put_aborts.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

void OwnerCore::WakePublisher() {
  MutexLock lock(&publish_mu_);
  publish_cv_.SignalAll();
}

absl::Status OwnerCore::PutCommit(uint64_t client_id, uint64_t put_id, PutDoneCallback done,
                                  bool defer_publish_wake) {
  // Backpressure first (bounded queue, no task storm), before anything becomes visible: a commit
  // that cannot be queued aborts the put, so a failed commit leaves nothing reserved.
  absl::Status queued = absl::OkStatus();
  {
    MutexLock lock(&publish_mu_);
    const auto deadline = Clock::now() + options_.commit_wait_timeout;
    while (publish_queue_.size() + publish_reserved_ >= options_.publish_queue_capacity) {
      if (stop_requested()) {
        queued = absl::UnavailableError("the owner is shutting down; the put was aborted");
        break;
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        counters_->commit_timeouts.fetch_add(1, std::memory_order_relaxed);
        queued = absl::UnavailableError(absl::StrFormat(
            "the publish queue stayed full for %d ms (commit_wait_timeout; is the master "
            "reachable?); the put was aborted",
            options_.commit_wait_timeout.count()));
        break;
      }
      publish_cv_.WaitUntil(&publish_mu_, std::min(deadline, now + std::chrono::milliseconds(100)));
    }
    if (queued.ok()) ++publish_reserved_;
  }
  if (!queued.ok()) {
    if (PutAbort(client_id, put_id).ok()) {
      spdlog::warn("commit of put {}: {}", put_id, std::string(queued.message()));
    }
    return queued;
  }
  auto release_reservation = [&] {
    MutexLock lock(&publish_mu_);
    --publish_reserved_;
    publish_cv_.SignalAll();
  };
  absl::StatusOr<std::shared_ptr<PutBatch>> taken = TakePreparedBatch(client_id, put_id);
  if (!taken.ok()) {
    release_reservation();
    return taken.status();
  }
  std::shared_ptr<PutBatch> batch = std::move(*taken);
  SlotPool& pool = memory_->pool();
  // V1: every value is local-read-ready before this returns.
  for (size_t i = 0; i < batch->keys.size(); ++i) {
    absl::StatusOr<HolderRef> h = HolderRef::CommitLocalVisible(
        &pool, batch->slots[i], batch->keys[i], put_id, batch->value_len);
    if (!h.ok()) {
      spdlog::error("commit of put {} key {}: {}", put_id, batch->keys[i], h.status().ToString());
      continue;
    }
    keys_.Update(batch->keys[i], [&](std::shared_ptr<KeyEntry>* e, bool*) {
      if (e != nullptr && (*e)->put_id == put_id && (*e)->state == KeyEntry::State::kReserved) {
        (*e)->state = KeyEntry::State::kLocalVisible;
        (*e)->resident = std::move(*h);
      }
      return 0;
    });
    // If the entry was not ours, `h` still holds the holder and frees the slot when it goes.
  }
  counters_->reserved_entries.fetch_sub(batch->keys.size(), std::memory_order_relaxed);
  counters_->local_visible_entries.fetch_add(batch->keys.size(), std::memory_order_relaxed);
  counters_->put_commits.fetch_add(1, std::memory_order_relaxed);
  auto job = std::make_unique<PublishJob>();
  job->batch = std::move(batch);
  job->done = std::move(done);
  MutexLock lock(&publish_mu_);
  --publish_reserved_;
  publish_queue_.push_back(std::move(job));
  if (!defer_publish_wake) publish_cv_.SignalAll();
  return absl::OkStatus();
}

void OwnerCore::PublishLoop() {
  for (;;) {
    std::unique_ptr<PublishJob> job;
    {
      MutexLock lock(&publish_mu_);
      for (;;) {
        if (!publish_queue_.empty()) break;
        if (stop_requested()) return;
        publish_cv_.WaitUntil(&publish_mu_, Clock::now() + std::chrono::milliseconds(100));
      }
      job = std::move(publish_queue_.front());
      publish_queue_.pop_front();
      ++publish_in_flight_;
      publish_cv_.SignalAll();
    }
    // A stopping owner does not call the master for the backlog (each call could wait out its
    // deadline): the remaining jobs end Cancelled at once.
    const absl::Status outcome =
        stop_requested() ? absl::CancelledError("owner stopping before publish") : PublishOne(*job);
    {
      MutexLock lock(&publish_mu_);
      --publish_in_flight_;
    }
    // After the batch left the queue's accounting, so a caller woken here sees it settled.
    if (job->done) job->done(outcome);
  }
}

absl::Status OwnerCore::PublishOne(PublishJob& job) {
  PutBatch& b = *job.batch;
  SlotPool& pool = memory_->pool();
  v1::PublishBatchRequest req;
  req.set_node_id(options_.node_id);
  req.set_generation(generation());
  req.set_put_id(b.put_id);
  for (size_t i = 0; i < b.keys.size(); ++i) {
    v1::RouteItem* item = req.add_items();
    item->set_key(b.keys[i]);
    item->set_put_id(b.put_id);
    item->set_offset(pool.OffsetOf(b.slots[i]));
    item->set_len(b.value_len);
  }
  for (uint32_t g : b.group_lens) req.add_atomic_group_lens(g);

  absl::StatusOr<v1::PublishBatchReply> reply;
  auto backoff = std::chrono::milliseconds(25);
  bool reregistered = false;
  for (;;) {
    reply = master_->PublishBatch(req);
    if (!reply.ok() && reply.status().code() == absl::StatusCode::kFailedPrecondition &&
        !reregistered) {
      // The master does not know this generation (it restarted, or dropped us): register
      // again and retry once, instead of failing every later publish for good.
      reregistered = true;
      absl::Status r = RegisterWithMaster();
      spdlog::warn("publish of put {} refused ({}); re-registering with the master: {}", b.put_id,
                   std::string(reply.status().message()), r.ToString());
      if (r.ok()) {
        counters_->master_reregistrations.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
    }
    if (reply.ok() || !IsUncertain(reply.status())) break;
    // A2/T1: the batch may have been published; retry the same identity, never give up on it.
    counters_->publish_retries.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("publish of put {} uncertain ({}); retrying in {} ms", b.put_id,
                 reply.status().ToString(), backoff.count());
    if (!SleepUnlessStopping(backoff)) {
      return absl::CancelledError("owner stopping before publish resolved");
    }
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  counters_->publish_batches.fetch_add(1, std::memory_order_relaxed);

  // Which items became global.
  std::vector<bool> published(b.keys.size(), false);
  if (reply.ok()) {
    for (size_t i = 0; i < b.keys.size() && i < static_cast<size_t>(reply->outcomes_size()); ++i) {
      published[i] = reply->outcomes(i) == v1::PUBLISHED;
    }
  }
  // Cohorts: one per atomic group (or per key without groups).
  std::vector<uint32_t> groups = b.group_lens;
  if (groups.empty()) groups.assign(b.keys.size(), 1);
  size_t start = 0;
  size_t not_published = 0;
  std::vector<Cohort> cohorts;
  for (uint32_t len : groups) {
    Cohort cohort;
    cohort.id = next_cohort_id_.fetch_add(1);
    cohort.put_id = b.put_id;
    for (size_t i = start; i < start + len; ++i) {
      HolderRef dropped;
      if (published[i]) {
        (void)pool.PublishRoute(b.slots[i]);
        bool mine = keys_.Update(b.keys[i], [&](std::shared_ptr<KeyEntry>* e, bool*) {
          if (e == nullptr || (*e)->put_id != b.put_id) return false;
          (*e)->state = KeyEntry::State::kCommitted;
          (*e)->cohort_id = cohort.id;
          return true;
        });
        if (mine) {
          cohort.keys.push_back(b.keys[i]);
          cohort.weight += pool.SlotSizeOf(b.slots[i]);
        }
      } else {
        // Never published (superseded or rejected): the value stays local-only no longer.
        ++not_published;
        keys_.Update(b.keys[i], [&](std::shared_ptr<KeyEntry>* e, bool* erase) {
          if (e != nullptr && (*e)->put_id == b.put_id) {
            dropped = std::move((*e)->resident);
            *erase = true;
          }
          return 0;
        });
      }
    }
    start += len;
    if (!cohort.keys.empty()) cohorts.push_back(std::move(cohort));
  }
  counters_->local_visible_entries.fetch_sub(b.keys.size(), std::memory_order_relaxed);
  counters_->committed_entries.fetch_add(b.keys.size() - not_published, std::memory_order_relaxed);
  // A1: the whole batch is admitted after every member was promoted, as one chain that continues
  // the parent's when the client named the page before it.
  uint64_t parent_cohort = 0;
  if (!b.parent_key.empty()) {
    keys_.Update(b.parent_key, [&](std::shared_ptr<KeyEntry>* e, bool*) {
      if (e != nullptr && (*e)->state == KeyEntry::State::kCommitted) {
        parent_cohort = (*e)->cohort_id;
      }
      return 0;
    });
  }
  hot_.AdmitChain(std::move(cohorts), parent_cohort);
  if (not_published > 0) {
    counters_->superseded.fetch_add(not_published, std::memory_order_relaxed);
    if (!reply.ok()) counters_->publish_failures.fetch_add(1, std::memory_order_relaxed);
  }
  // Wake claims that may be waiting for eviction of now-evictable cohorts.
  candidates_changed_.store(true, std::memory_order_relaxed);
  SignalPressure();
  if (!reply.ok()) return reply.status();
  if (not_published > 0) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "%d of %d keys were already published by another writer", not_published, b.keys.size()));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Get path

absl::StatusOr<GetStartOutcome> OwnerCore::GetStart(uint64_t client_id,
                                                    const std::vector<std::string>& keys,
                                                    const std::vector<uint32_t>& group_lens,
                                                    bool prefix_best_effort) {
  FLUXON_RETURN_IF_ERROR(ValidateKeys(keys));
  FLUXON_RETURN_IF_ERROR(ValidateGroups(group_lens, keys.size()));
  const size_t n = keys.size();
  counters_->get_batches.fetch_add(1, std::memory_order_relaxed);
  counters_->get_keys.fetch_add(n, std::memory_order_relaxed);
  GetStartOutcome out;
  std::vector<HolderRef> held(n);
  std::vector<uint64_t> cohort_of(n, 0);
  std::vector<std::shared_ptr<SharedGetOp>> joined(n), led(n);

  // Classify every key (G1) with one O(1) shard section each (G3, G10).
  for (size_t i = 0; i < n; ++i) {
    const bool local = keys_.Update(keys[i], [&](std::shared_ptr<KeyEntry>* e, bool*) {
      if (e == nullptr) return false;
      const KeyEntry& k = **e;
      if (k.state != KeyEntry::State::kLocalVisible && k.state != KeyEntry::State::kCommitted) {
        return false;
      }
      held[i] = k.resident;
      cohort_of[i] = k.cohort_id;
      return true;
    });
    if (local) {
      ++out.local_pinned;
      continue;
    }
    inflight_gets_.Upsert(
        keys[i], [] { return std::make_shared<SharedGetOp>(); },
        [&](std::shared_ptr<SharedGetOp>& op, bool inserted) {
          (inserted ? led[i] : joined[i]) = op;
          return 0;
        });
    if (led[i]) {
      ++out.leader_started;
    } else {
      ++out.inflight_joined;
    }
  }

  // G8: the batch's leaders go to the master as one Lookup, after every pin and marker exists (G2).
  if (out.leader_started > 0) {
    v1::LookupRequest req;
    req.set_requester_node_id(options_.node_id);
    std::vector<size_t> leader_index;
    for (size_t i = 0; i < n; ++i) {
      if (led[i]) {
        req.add_keys(keys[i]);
        leader_index.push_back(i);
      }
    }
    absl::StatusOr<v1::LookupReply> reply = master_->Lookup(req);
    for (size_t j = 0; j < leader_index.size(); ++j) {
      const size_t i = leader_index[j];
      HolderRef found;
      if (reply.ok() && j < static_cast<size_t>(reply->found_size()) && reply->found(j)) {
        const v1::Route& route = reply->routes(j);
        if (route.node_id() == options_.node_id && route.generation() == generation()) {
          // Published here after we looked: take the canonical holder (T2: same put_id).
          keys_.Update(keys[i], [&](std::shared_ptr<KeyEntry>* e, bool*) {
            if (e != nullptr && (*e)->put_id == route.put_id() &&
                ((*e)->state == KeyEntry::State::kCommitted ||
                 (*e)->state == KeyEntry::State::kLocalVisible)) {
              found = (*e)->resident;
              cohort_of[i] = (*e)->cohort_id;
            }
            return 0;
          });
        }
        // Routes on other owners need a data transport between owners; they count as misses here.
      }
      held[i] = found;
      led[i]->Finish(found);
      inflight_gets_.EraseIf(keys[i],
                             [&](const std::shared_ptr<SharedGetOp>& op) { return op == led[i]; });
    }
  }
  // Joiners observe their leader's terminal state and canonical holder (G7).
  if (out.inflight_joined > 0) {
    const auto deadline = Clock::now() + options_.join_timeout;
    for (size_t i = 0; i < n; ++i) {
      if (joined[i]) held[i] = joined[i]->Wait(deadline);
    }
  }
  counters_->local_pinned.fetch_add(out.local_pinned, std::memory_order_relaxed);
  counters_->inflight_joined.fetch_add(out.inflight_joined, std::memory_order_relaxed);
  counters_->leader_started.fetch_add(out.leader_started, std::memory_order_relaxed);

  // G4: results are already in original order; compute the prefix over the caller's groups.
  std::vector<bool> hits(n);
  for (size_t i = 0; i < n; ++i) hits[i] = static_cast<bool>(held[i]);
  out.prefix = ComputePrefix(hits, group_lens);
  if (!prefix_best_effort && !out.prefix.all_hit()) out.prefix.transferable_len = 0;
  const uint32_t t = out.prefix.transferable_len;
  counters_->hits.fetch_add(t, std::memory_order_relaxed);
  counters_->misses.fetch_add(n - t, std::memory_order_relaxed);

  // G5: release everything past the transferable prefix now.
  uint32_t released = 0;
  for (size_t i = t; i < n; ++i) {
    if (held[i]) {
      held[i].reset();
      ++released;
    }
  }
  counters_->suffix_released.fetch_add(released, std::memory_order_relaxed);
  if (t == 0) return out;

  // Touch the restored chain tail first, so its head stays warmest.
  std::vector<uint64_t> touched;
  for (size_t i = t; i-- > 0;) {
    if (cohort_of[i] != 0 && (touched.empty() || touched.back() != cohort_of[i])) {
      touched.push_back(cohort_of[i]);
    }
  }
  hot_.Touch(touched);

  auto handle = std::make_shared<GetHandle>();
  handle->id = next_handle_id_.fetch_add(1);
  handle->client_id = client_id;
  handle->deadline = Clock::now() + options_.handle_ttl;
  if (!group_lens.empty()) {
    uint32_t covered = 0;
    for (uint32_t g : group_lens) {
      if (covered + g > t) break;
      handle->group_lens.push_back(g);
      covered += g;
    }
  }
  out.offsets.reserve(t);
  out.lens.reserve(t);
  for (size_t i = 0; i < t; ++i) {
    out.offsets.push_back(held[i]->offset);
    out.lens.push_back(held[i]->len);
  }
  held.resize(t);
  handle->pins = std::move(held);
  out.handle_id = handle->id;
  handles_.InsertIfAbsent(out.handle_id, std::move(handle));
  counters_->live_handles.fetch_add(1, std::memory_order_relaxed);
  return out;
}

absl::Status OwnerCore::GetTransfer(uint64_t client_id, uint64_t handle_id,
                                    uint32_t consume_prefix_len) {
  std::vector<HolderRef> tail;
  absl::Status result =
      handles_.Update(handle_id, [&](std::shared_ptr<GetHandle>* hp, bool*) -> absl::Status {
        if (hp == nullptr || (*hp)->client_id != client_id) {
          return absl::NotFoundError(absl::StrFormat(
              "get handle %d is unknown (never issued, already released, or expired)", handle_id));
        }
        GetHandle& h = **hp;
        if (h.consumed) {
          return absl::FailedPreconditionError(
              absl::StrFormat("get handle %d was already consumed by get_transfer", handle_id));
        }
        const uint32_t t = static_cast<uint32_t>(h.pins.size());
        const uint32_t consume = consume_prefix_len == 0 ? t : consume_prefix_len;
        if (consume > t) {
          return absl::InvalidArgumentError(
              absl::StrFormat("consume_prefix_len %d exceeds transferable_len %d", consume, t));
        }
        if (!IsGroupBoundary(consume, h.group_lens)) {
          return absl::InvalidArgumentError(
              absl::StrFormat("consume_prefix_len %d is not on an atomic group boundary", consume));
        }
        for (uint32_t i = consume; i < t; ++i) tail.push_back(std::move(h.pins[i]));
        h.pins.resize(consume);
        h.consumed = true;
        h.deadline = Clock::now() + options_.view_lease;
        return absl::OkStatus();
      });
  if (result.ok()) {
    counters_->live_handles.fetch_sub(1, std::memory_order_relaxed);
    counters_->live_views.fetch_add(1, std::memory_order_relaxed);
  }
  if (!tail.empty()) {
    tail.clear();  // outside the shard lock
    candidates_changed_.store(true, std::memory_order_relaxed);
  }
  return result;
}

absl::Status OwnerCore::CancelGet(uint64_t client_id, uint64_t handle_id) {
  std::shared_ptr<GetHandle> taken;
  absl::Status result =
      handles_.Update(handle_id, [&](std::shared_ptr<GetHandle>* hp, bool* erase) -> absl::Status {
        if (hp == nullptr || (*hp)->client_id != client_id) {
          return absl::NotFoundError(absl::StrFormat("get handle %d is unknown", handle_id));
        }
        if ((*hp)->consumed) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "get handle %d was consumed by get_transfer: release its plan instead", handle_id));
        }
        taken = std::move(*hp);
        *erase = true;
        return absl::OkStatus();
      });
  if (taken) DropHandle(std::move(taken));
  return result;
}

absl::Status OwnerCore::ReleaseViews(uint64_t client_id, uint64_t handle_id) {
  std::shared_ptr<GetHandle> taken;
  absl::Status result =
      handles_.Update(handle_id, [&](std::shared_ptr<GetHandle>* hp, bool* erase) -> absl::Status {
        if (hp == nullptr || (*hp)->client_id != client_id) {
          return absl::NotFoundError(absl::StrFormat(
              "views of handle %d are unknown (released, expired after view_lease, or another "
              "session's)",
              handle_id));
        }
        if (!(*hp)->consumed) {
          return absl::FailedPreconditionError(absl::StrFormat(
              "handle %d has no views yet: call get_transfer or cancel_get_transfer", handle_id));
        }
        taken = std::move(*hp);
        *erase = true;
        return absl::OkStatus();
      });
  if (taken) DropHandle(std::move(taken));
  return result;
}

void OwnerCore::DropHandle(std::shared_ptr<GetHandle> handle) {
  handle->pins.clear();
  candidates_changed_.store(true, std::memory_order_relaxed);
  if (handle->consumed) {
    counters_->live_views.fetch_sub(1, std::memory_order_relaxed);
  } else {
    counters_->live_handles.fetch_sub(1, std::memory_order_relaxed);
  }
}

void OwnerCore::ExpireLeases() {
  const auto now = Clock::now();
  std::vector<uint64_t> expired;
  handles_.ForEach([&](const uint64_t& id, const std::shared_ptr<GetHandle>& h) {
    if (h->deadline <= now) expired.push_back(id);
  });
  for (uint64_t id : expired) {
    std::shared_ptr<GetHandle> taken;
    handles_.Update(id, [&](std::shared_ptr<GetHandle>* hp, bool* erase) {
      if (hp != nullptr && (*hp)->deadline <= now) {
        taken = std::move(*hp);
        *erase = true;
      }
      return 0;
    });
    if (!taken) continue;
    if (taken->consumed) {
      counters_->views_expired.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn(
          "views of handle {} (session {}) not released within view_lease ({} ms): "
          "released",
          id, taken->client_id, options_.view_lease.count());
    } else {
      counters_->handles_expired.fetch_add(1, std::memory_order_relaxed);
    }
    DropHandle(std::move(taken));
  }
  std::vector<std::pair<uint64_t, uint64_t>> stale_puts;  // (client, put)
  puts_.ForEach([&](const uint64_t& id, const std::shared_ptr<PutBatch>& b) {
    if (b->deadline <= now) stale_puts.emplace_back(b->client_id, id);
  });
  for (const auto& [client, put_id] : stale_puts) {
    if (PutAbort(client, put_id).ok()) {
      counters_->puts_expired.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("put {} (session {}) not committed or aborted within put_lease ({} ms): aborted",
                   put_id, client, options_.put_lease.count());
    }
  }
}

void OwnerCore::DisconnectClient(uint64_t client_id) {
  std::vector<uint64_t> puts, handles;
  puts_.ForEach([&](const uint64_t& id, const std::shared_ptr<PutBatch>& b) {
    if (b->client_id == client_id) puts.push_back(id);
  });
  handles_.ForEach([&](const uint64_t& id, const std::shared_ptr<GetHandle>& h) {
    if (h->client_id == client_id) handles.push_back(id);
  });
  for (uint64_t id : puts) (void)PutAbort(client_id, id);
  for (uint64_t id : handles) {
    std::shared_ptr<GetHandle> taken;
    handles_.Update(id, [&](std::shared_ptr<GetHandle>* hp, bool* erase) {
      if (hp != nullptr) {
        taken = std::move(*hp);
        *erase = true;
      }
      return 0;
    });
    if (taken) DropHandle(std::move(taken));
  }
  counters_->disconnects.fetch_add(1, std::memory_order_relaxed);
  if (!puts.empty() || !handles.empty()) {
    spdlog::info("client {} disconnected: aborted {} prepared puts, released {} handles/views",
                 client_id, puts.size(), handles.size());
  }
}

// ---------------------------------------------------------------------------------------------
// Capacity eviction

void OwnerCore::SignalPressure() {
  MutexLock lock(&actor_mu_);
  pressure_ = true;
  actor_cv_.SignalAll();
}

OwnerCore::EvictionNeed OwnerCore::MeasureEvictionNeed() const {
  const SlotPoolStats s = memory_->pool().Stats();
  // Waiting claims ask for eviction only when the pool cannot grow: growth comes first.
  const bool can_grow = memory_->pool().CanGrow();
  EvictionNeed need;
  uint64_t used = 0;
  for (const SizeClassStats& c : s.classes) {
    if (!can_grow && c.pending_demand_slots > c.free_slots) {
      need.deficit += (c.pending_demand_slots - c.free_slots) * c.slot_size;
    }
    used += (c.grants * c.slots_per_grant - c.free_slots) * c.slot_size;
  }
  // Watermark: keep used memory under hot_capacity_ratio of what the pool can ever hold.
  uint64_t capacity = 0;
  if (memory_->pool().expected_grants() > 0) {
    for (const SizeClassStats& c : s.classes)
      capacity += c.grants * c.slots_per_grant * c.slot_size;
  } else {
    capacity = s.grant_capacity * kGrantBytes;
  }
  const uint64_t high = static_cast<uint64_t>(options_.hot_capacity_ratio * capacity);
  if (used > high) need.over_watermark = used - high;
  return need;
}

uint64_t OwnerCore::EvictSome(uint64_t bytes) {
  counters_->eviction_rounds.fetch_add(1, std::memory_order_relaxed);
  std::vector<Cohort> victims = hot_.TakeVictims(bytes);
  const std::vector<Removal> removals = RemoveCohorts(victims);
  if (removals.empty()) return 0;  // stopping
  uint64_t evicted = 0;
  for (size_t i = 0; i < victims.size(); ++i) {
    Cohort& cohort = victims[i];
    if (removals[i].result == RemoveResult::kInUse) {
      counters_->eviction_skipped_pinned.fetch_add(1, std::memory_order_relaxed);
      hot_.Readmit(std::move(cohort));  // S4: back to the tier, not dropped
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

absl::StatusOr<DeleteOutcome> OwnerCore::DeletePrefix(const std::string& prefix) {
  FLUXON_RETURN_IF_ERROR(ValidateDeletePrefix(prefix));
  // Eviction cohorts (one atomic group each) go together, so a group is never split; keys not
  // committed yet have no cohort and count as in use.
  std::map<std::pair<uint64_t, uint64_t>, Cohort> by_cohort;  // (put_id, cohort id)
  uint64_t uncommitted = 0;
  keys_.ForEach([&](const std::string& key, const std::shared_ptr<KeyEntry>& e) {
    if (!absl::StartsWith(key, prefix)) return;
    if (e->cohort_id == 0) {
      ++uncommitted;
      return;
    }
    Cohort& c = by_cohort[{e->put_id, e->cohort_id}];
    c.id = e->cohort_id;
    c.put_id = e->put_id;
    c.keys.push_back(key);
  });
  std::vector<Cohort> cohorts;
  cohorts.reserve(by_cohort.size());
  for (auto& [id, cohort] : by_cohort) cohorts.push_back(std::move(cohort));
  const std::vector<Removal> removals = RemoveCohorts(cohorts);
  if (removals.empty() && !cohorts.empty()) return absl::UnavailableError("owner is stopping");
  DeleteOutcome out;
  out.skipped_in_use = uncommitted;
  for (size_t i = 0; i < cohorts.size(); ++i) {
    if (removals[i].result == RemoveResult::kInUse) out.skipped_in_use += cohorts[i].keys.size();
    if (removals[i].result == RemoveResult::kRemoved) hot_.ForgetIfAllUnder(cohorts[i].id, prefix);
    out.deleted += removals[i].pages;
  }
  counters_->deleted_pages.fetch_add(out.deleted, std::memory_order_relaxed);
  spdlog::info("deleted {} values under prefix '{}' ({} in use, kept)", out.deleted, prefix,
               out.skipped_in_use);
  return out;
}

std::vector<OwnerCore::Removal> OwnerCore::RemoveCohorts(const std::vector<Cohort>& cohorts) {
  std::vector<Removal> out(cohorts.size());
  // (cohort index, key) of every member marked Evicting.
  std::vector<std::pair<size_t, std::string>> marked;
  for (size_t i = 0; i < cohorts.size(); ++i) {
    const Cohort& cohort = cohorts[i];
    // Mark every member Evicting, only if nothing pins it (the entry holds the only reference).
    const size_t first = marked.size();
    bool in_use = false;
    for (const std::string& key : cohort.keys) {
      const int r = keys_.Update(key, [&](std::shared_ptr<KeyEntry>* e, bool*) {
        if (e == nullptr || (*e)->put_id != cohort.put_id) return 0;  // gone already
        KeyEntry& k = **e;
        if (k.state != KeyEntry::State::kCommitted || k.resident.use_count() != 1) return 2;
        k.state = KeyEntry::State::kEvicting;
        return 1;
      });
      if (r == 2) {
        in_use = true;
        break;
      }
      if (r == 1) marked.emplace_back(i, key);
    }
    if (in_use) {
      for (size_t m = first; m < marked.size(); ++m) {
        keys_.Update(marked[m].second, [&](std::shared_ptr<KeyEntry>* e, bool*) {
          if (e != nullptr && (*e)->put_id == cohort.put_id)
            (*e)->state = KeyEntry::State::kCommitted;
          return 0;
        });
      }
      marked.resize(first);
      out[i].result = RemoveResult::kInUse;
    } else if (marked.size() > first) {
      out[i].result = RemoveResult::kRemoved;
    }
  }
  // S2: the routes go first; the slots are released only after the master removed them.
  for (size_t begin = 0; begin < marked.size(); begin += kRouteRemoveBatch) {
    v1::RemoveRoutesRequest req;
    req.set_node_id(options_.node_id);
    req.set_generation(generation());
    for (size_t m = begin; m < std::min(marked.size(), begin + kRouteRemoveBatch); ++m) {
      v1::RouteItem* item = req.add_items();
      item->set_key(marked[m].second);
      item->set_put_id(cohorts[marked[m].first].put_id);
    }
    if (!RemoveRoutesWithRetry(req)) return {};
  }
  SlotPool& pool = memory_->pool();
  for (const auto& [i, key] : marked) {
    std::shared_ptr<KeyEntry> entry;
    keys_.Update(key, [&, i = i](std::shared_ptr<KeyEntry>* e, bool* erase) {
      if (e != nullptr && (*e)->put_id == cohorts[i].put_id &&
          (*e)->state == KeyEntry::State::kEvicting) {
        entry = std::move(*e);
        *erase = true;
      }
      return 0;
    });
    if (!entry) continue;
    (void)pool.ReleaseRoute(entry->resident->slot);
    entry->resident.reset();  // the last reference: the slot returns to Free
    ++out[i].pages;
    counters_->committed_entries.fetch_sub(1, std::memory_order_relaxed);
  }
  return out;
}

bool OwnerCore::RemoveRoutesWithRetry(const v1::RemoveRoutesRequest& req) {
  auto backoff = std::chrono::milliseconds(25);
  for (;;) {
    counters_->route_remove_calls.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<v1::RemoveRoutesReply> r = master_->RemoveRoutes(req);
    if (r.ok() || !IsUncertain(r.status())) {
      if (!r.ok()) {
        spdlog::warn("removing {} routes: {} (routes are gone with the old master state)",
                     req.items_size(), r.status().ToString());
      }
      return true;
    }
    counters_->route_remove_retries.fetch_add(1, std::memory_order_relaxed);
    if (!SleepUnlessStopping(backoff)) return false;
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

void OwnerCore::MaintenanceLoop() {
  auto next_eviction = Clock::now();
  auto backoff = options_.evict_min_interval;
  auto next_watermark_eviction = Clock::now();
  auto watermark_backoff = options_.evict_min_interval;
  for (;;) {
    {
      MutexLock lock(&actor_mu_);
      if (!stopping_ && !pressure_) {
        actor_cv_.WaitUntil(&actor_mu_, Clock::now() + options_.maintenance_interval);
      }
      if (stopping_) return;
      pressure_ = false;
    }
    ExpireLeases();
    memory_->pool().ShrinkIdleGrants();
    memory_->pool().RefillLowClasses(0.25);
    if (candidates_changed_.exchange(false, std::memory_order_relaxed)) {
      backoff = watermark_backoff = options_.evict_min_interval;
      next_eviction = std::min(next_eviction, Clock::now());
      next_watermark_eviction = Clock::now();
    }
    // Two paths (design §7): the hot tier over its capacity window evicts the overage at once
    // (regular capacity eviction, as a size-bounded cache does on insert); claims still short of
    // slots after that get the rate-limited pressure fallback (<= evict_max_bytes_per_round per
    // round, rounds >= evict_min_interval apart). Either backs off when nothing was evictable.
    EvictionNeed need = MeasureEvictionNeed();
    const auto now = Clock::now();
    if (need.over_watermark > 0 && now >= next_watermark_eviction) {
      if (EvictSome(need.over_watermark) > 0) {
        watermark_backoff = options_.evict_min_interval;
        need = MeasureEvictionNeed();  // the deficit may be covered now
      } else {
        watermark_backoff = std::min(watermark_backoff * 2, std::chrono::milliseconds(2000));
        next_watermark_eviction = now + watermark_backoff;
      }
    }
    if (need.deficit == 0 || now < next_eviction) continue;
    const uint64_t evicted = EvictSome(std::min(need.deficit, options_.evict_max_bytes_per_round));
    if (evicted == 0) {
      // Nothing evictable (all pinned or in flight): back off instead of spinning.
      backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
    } else {
      backoff = options_.evict_min_interval;
    }
    next_eviction = Clock::now() + backoff;
  }
}

// ---------------------------------------------------------------------------------------------
// Introspection

std::map<std::string, int64_t> OwnerCore::Stats() const {
  std::map<std::string, int64_t> m;
  const Counters& c = *counters_;
#define FLUXON_STAT(name) m[#name] = c.name.load(std::memory_order_relaxed)
  FLUXON_STAT(put_batches);
  FLUXON_STAT(put_pages);
  FLUXON_STAT(put_conflicts);
  FLUXON_STAT(put_no_space);
  FLUXON_STAT(put_aborts);
  FLUXON_STAT(put_commits);
  FLUXON_STAT(publish_batches);
  FLUXON_STAT(publish_retries);
  FLUXON_STAT(publish_failures);
  FLUXON_STAT(superseded);
  FLUXON_STAT(get_batches);
  FLUXON_STAT(get_keys);
  FLUXON_STAT(local_pinned);
  FLUXON_STAT(inflight_joined);
  FLUXON_STAT(leader_started);
  FLUXON_STAT(hits);
  FLUXON_STAT(misses);
  FLUXON_STAT(suffix_released);
  FLUXON_STAT(handles_expired);
  FLUXON_STAT(evicted_cohorts);
  FLUXON_STAT(evicted_pages);
  FLUXON_STAT(evicted_bytes);
  FLUXON_STAT(deleted_pages);
  FLUXON_STAT(eviction_rounds);
  FLUXON_STAT(eviction_skipped_pinned);
  FLUXON_STAT(route_remove_retries);
  FLUXON_STAT(route_remove_calls);
  FLUXON_STAT(local_visible_entries);
  FLUXON_STAT(committed_entries);
  FLUXON_STAT(reserved_entries);
  FLUXON_STAT(live_handles);
  FLUXON_STAT(live_views);
  FLUXON_STAT(disconnects);
  FLUXON_STAT(puts_expired);
  FLUXON_STAT(views_expired);
  FLUXON_STAT(commit_timeouts);
  FLUXON_STAT(master_reregistrations);
#undef FLUXON_STAT
  const SlotPoolStats s = memory_->pool().Stats();
  for (int i = 0; i < kNumSlotStates; ++i) {
    m[std::string("slots_") + SlotStateName(static_cast<SlotState>(i))] = s.slots_by_state[i];
  }
  m["grants"] = static_cast<int64_t>(s.grants);
  m["grant_capacity"] = static_cast<int64_t>(s.grant_capacity);
  m["claim_timeouts"] = static_cast<int64_t>(s.claim_timeouts);
  m["grants_shrunk"] = static_cast<int64_t>(s.grants_shrunk);
  m["keys"] = static_cast<int64_t>(keys_.size());
  m["inflight_gets"] = static_cast<int64_t>(inflight_gets_.size());
  m["prepared_puts"] = static_cast<int64_t>(puts_.size());
  m["hot_cohorts"] = static_cast<int64_t>(hot_.size());
  m["hot_weight_bytes"] = static_cast<int64_t>(hot_.weight());
  {
    MutexLock lock(&publish_mu_);
    m["publish_queue"] = static_cast<int64_t>(publish_queue_.size() + publish_in_flight_);
  }
  return m;
}

std::string OwnerCore::KeyState(const std::string& key) const {
  std::optional<std::shared_ptr<KeyEntry>> e = keys_.Get(key);
  if (!e) return "absent";
  switch ((*e)->state) {
    case KeyEntry::State::kReserved:
      return "reserved";
    case KeyEntry::State::kLocalVisible:
      return "local_visible";
    case KeyEntry::State::kCommitted:
      return "committed";
    case KeyEntry::State::kEvicting:
      return "evicting";
  }
  return "unknown";
}

}  // namespace fluxon
