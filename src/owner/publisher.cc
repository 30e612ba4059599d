#include "owner/publisher.h"

#include "absl/strings/str_format.h"
#include "common/check.h"
#include "rpc/retry.h"
#include "spdlog/spdlog.h"

namespace fluxon {

using Clock = std::chrono::steady_clock;

absl::Status Publisher::ReservePlace() {
  const absl::Status stopping =
      absl::UnavailableError("the owner is shutting down; the put was aborted");
  MutexLock lock(&mu_);
  const auto deadline = Clock::now() + options_.commit_wait_timeout;
  // A stopping owner takes no new commits, even when the cancelled backlog made room.
  if (stop_->stopped()) return stopping;
  while (queue_.size() + reserved_ >= options_.queue_capacity) {
    if (stop_->stopped()) return stopping;
    const auto now = Clock::now();
    if (now >= deadline) {
      counters_->commit_timeouts.fetch_add(1, std::memory_order_relaxed);
      return absl::UnavailableError(absl::StrFormat(
          "the publish queue stayed full for %d ms (commit_wait_timeout; is the master "
          "reachable?); the put was aborted",
          options_.commit_wait_timeout.count()));
    }
    cv_.WaitUntil(&mu_, std::min(deadline, now + std::chrono::milliseconds(100)));
  }
  if (stop_->stopped()) return stopping;
  ++reserved_;
  return absl::OkStatus();
}

void Publisher::CancelPlace() {
  MutexLock lock(&mu_);
  FLUXON_DCHECK(reserved_ > 0, "a publish place is given back twice");
  --reserved_;
  cv_.SignalAll();
}

void Publisher::Push(std::shared_ptr<PutBatch> batch, PutDoneCallback done, bool defer_wake) {
  MutexLock lock(&mu_);
  FLUXON_DCHECK(reserved_ > 0, "a batch is queued without a reserved place");
  --reserved_;
  queue_.push_back(Job{std::move(batch), std::move(done)});
  ++queued_total_;
  if (!defer_wake) cv_.SignalAll();
}

void Publisher::Wake() {
  MutexLock lock(&mu_);
  cv_.SignalAll();
}

void Publisher::Interrupt() { Wake(); }

size_t Publisher::backlog() const {
  MutexLock lock(&mu_);
  return queue_.size() + in_flight_;
}

bool Publisher::WaitQueuedSettled(Clock::time_point deadline) {
  MutexLock lock(&mu_);
  const uint64_t ticket = queued_total_;
  while (settled_total_ < ticket) {
    const auto now = Clock::now();
    if (now >= deadline || stop_->stopped()) return false;
    cv_.WaitUntil(&mu_, std::min(deadline, now + std::chrono::milliseconds(100)));
  }
  return true;
}

void Publisher::Run() {
  for (;;) {
    Job job;
    {
      MutexLock lock(&mu_);
      while (queue_.empty()) {
        if (stop_->stopped()) return;
        cv_.WaitUntil(&mu_, Clock::now() + std::chrono::milliseconds(100));
      }
      job = std::move(queue_.front());
      queue_.pop_front();
      ++in_flight_;
      cv_.SignalAll();
    }
    // A stopping owner does not call the master for the backlog (each call could wait out its
    // deadline): the remaining jobs end Cancelled at once.
    const absl::Status outcome = stop_->stopped()
                                     ? absl::CancelledError("owner stopping before publish")
                                     : PublishOne(*job.batch);
    {
      MutexLock lock(&mu_);
      --in_flight_;
      ++settled_total_;
      cv_.SignalAll();
    }
    // After the batch left the queue's accounting, so a caller woken here sees it settled. A
    // write-through put completes when its copies are routed too.
    if (job.batch->write_through) {
      job.batch->write_through->Published(outcome, std::move(job.done));
    } else if (job.done) {
      job.done(outcome);
    }
  }
}

absl::Status Publisher::PublishOne(const PutBatch& b) {
  const OwnerIdentity& me = registration_->identity();
  v1::PublishBatchRequest req;
  req.set_node_id(me.node_id);
  req.set_put_id(b.put_id);
  // The batch's version, stamped once: every retry of this request carries the same identity
  // (T1). Stamped now, after every master answer this owner has seen, so it sorts after them.
  const uint64_t version = registration_->clock().Now();
  for (size_t i = 0; i < b.keys.size(); ++i) {
    v1::RouteItem* item = req.add_items();
    item->set_key(b.keys[i]);
    item->set_put_id(b.put_id);
    item->set_offset(pool_->OffsetOf(b.slots[i]));
    item->set_len(b.value_len);
    item->set_version(version);
  }
  for (uint32_t g : b.group_lens) req.add_atomic_group_lens(g);

  // A refusal of this generation (the master restarted before our heartbeat, or expired this
  // owner) is not the batch's fault: the heartbeat re-registers at once (under a new generation
  // when expired) and the batch is retried under the generation then current, for up to
  // kRefusedRetryWindow; only then is it given up.
  const auto refused_until = Clock::now() + kRefusedRetryWindow;
  bool warned_refused = false;
  uint64_t generation_used = 0;
  absl::StatusOr<v1::PublishBatchReply> reply = RetryUncertain(
      [&]() -> absl::StatusOr<v1::PublishBatchReply> {
        generation_used = registration_->generation();
        req.set_generation(generation_used);
        absl::StatusOr<v1::PublishBatchReply> r = master_->PublishBatch(req);
        if (!r.ok() && IsGenerationRefused(r.status())) {
          registration_->NoteRefused();
          if (!warned_refused) {
            warned_refused = true;
            counters_->master_reregistrations.fetch_add(1, std::memory_order_relaxed);
            spdlog::warn("publish of put {} refused ({}); re-registering with the master", b.put_id,
                         std::string(r.status().message()));
          }
        }
        return r;
      },
      stop_,
      [&](const absl::Status& s, std::chrono::milliseconds backoff) {
        counters_->publish_retries.fetch_add(1, std::memory_order_relaxed);
        if (!IsGenerationRefused(s)) {
          spdlog::warn("publish of put {} uncertain ({}); retrying in {} ms", b.put_id,
                       s.ToString(), backoff.count());
        }
      },
      [&](const absl::Status& s) {
        return IsUncertain(s) || (IsGenerationRefused(s) && Clock::now() < refused_until);
      });
  if (!reply.ok() && IsUncertain(reply.status()) && stop_->stopped()) {
    return absl::CancelledError("owner stopping before publish resolved");
  }
  counters_->publish_batches.fetch_add(1, std::memory_order_relaxed);

  std::vector<bool> published(b.keys.size(), false);
  if (reply.ok()) {
    for (size_t i = 0; i < b.keys.size() && i < static_cast<size_t>(reply->outcomes_size()); ++i) {
      published[i] = reply->outcomes(i) == v1::PUBLISHED;
    }
  }
  size_t not_published = 0;
  PromoteAndAdmit(b, version, published, &not_published);
  if (reply.ok()) {
    registration_->NoteClock(reply->hlc());
    registration_->NoteEpoch(reply->master_epoch());
    // Promoted after a republish may have scanned: republish again if the routes moved on.
    registration_->RepublishIfChanged(generation_used, reply->master_epoch());
  }
  if (not_published > 0) {
    counters_->superseded.fetch_add(not_published, std::memory_order_relaxed);
    if (!reply.ok()) counters_->publish_failures.fetch_add(1, std::memory_order_relaxed);
  }
  if (!reply.ok()) return reply.status();
  if (not_published > 0) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "%d of %d keys were already published by another writer", not_published, b.keys.size()));
  }
  return absl::OkStatus();
}

void Publisher::PromoteAndAdmit(const PutBatch& b, uint64_t version,
                                const std::vector<bool>& published, size_t* not_published) {
  std::vector<uint32_t> groups = b.group_lens;
  if (groups.empty()) groups.assign(b.keys.size(), 1);
  size_t start = 0;
  std::vector<Cohort> cohorts;
  std::vector<ReplicaGroup> replica_groups;
  for (uint32_t len : groups) {
    Cohort cohort;
    cohort.id = next_cohort_id_.fetch_add(1);
    cohort.put_id = b.put_id;
    // The mask is uniform inside a group (validated): its first member decides for the group.
    // A write-through put copies every group (make_replica_task does not add to it).
    const bool replicate =
        b.write_through != nullptr || (!b.replicate.empty() && b.replicate[start]);
    ReplicaGroup replica;
    for (size_t i = start; i < start + len; ++i) {
      if (published[i]) {
        if (keys_->Promote(b.keys[i], b.put_id, cohort.id, version)) {
          cohort.keys.push_back(b.keys[i]);
          cohort.weight += pool_->SlotSizeOf(b.slots[i]);
          if (replicate) {
            replica.push_back(ReplicaTask{b.keys[i], b.put_id, version, b.value_len,
                                          pool_->SlotSizeOf(b.slots[i]), 0, b.write_through});
          }
        }
      } else {
        // Never published (superseded or rejected): the value stays local-only no longer.
        ++*not_published;
        HolderRef dropped = keys_->EraseUnpublished(b.keys[i], b.put_id);
      }
    }
    start += len;
    if (!cohort.keys.empty()) cohorts.push_back(std::move(cohort));
    if (!replica.empty()) replica_groups.push_back(std::move(replica));
  }
  // A1: the whole batch is admitted after every member was promoted, as one chain that continues
  // the parent's when the client named the page before it.
  const uint64_t parent_cohort = b.parent_key.empty() ? 0 : keys_->CommittedCohort(b.parent_key);
  hot_->AdmitChain(std::move(cohorts), parent_cohort);
  // After the route is published (a target's pull pins it at the master); never blocks.
  if (b.write_through != nullptr) b.write_through->Queued(replica_groups.size());
  if (replicas_ != nullptr && !replica_groups.empty()) {
    replicas_->Enqueue(std::move(replica_groups));
  }
  // Wake claims that may be waiting for eviction of now-evictable cohorts.
  signals_->CandidatesChanged();
  signals_->SignalPressure();
}

}  // namespace fluxon
