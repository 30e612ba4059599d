#include "owner/put_path.h"

#include <chrono>
#include <random>

#include "absl/strings/str_format.h"
#include "common/batch.h"
#include "common/check.h"
#include "fluxon/status.h"
#include "spdlog/spdlog.h"

namespace fluxon {

uint64_t FirstPutId(uint32_t node_id) {
  FLUXON_DCHECK(node_id < (1u << kPutIdNodeBits), "node_id does not fit in a put_id");
  std::random_device rd;
  const uint64_t random = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  // Half the sequence space: the count never carries into the node bits (2^43 batches).
  const uint64_t origin = random & ((uint64_t{1} << (kPutIdSeqBits - 1)) - 1);
  return (static_cast<uint64_t>(node_id) << kPutIdSeqBits) | (origin + 1);
}

PutPath::~PutPath() {
  std::vector<uint64_t> ids;
  puts_.ForEach([&](const uint64_t& id, const std::shared_ptr<PutBatch>&) { ids.push_back(id); });
  for (uint64_t id : ids) {
    std::optional<std::shared_ptr<PutBatch>> b = puts_.Take(id);
    if (b) Release(**b);
  }
}

absl::StatusOr<PutStartOutcome> PutPath::Start(uint64_t client_id, PutStartArgs a,
                                               std::vector<uint32_t>* conflicts) {
  FLUXON_RETURN_IF_ERROR(ValidatePutStart(a.keys, a.value_len, a.options));
  if (a.options.write_through && write_through_ == nullptr) {
    return absl::InvalidArgumentError(
        "write_through=True needs a cluster owner (a separate master, through owner.master_address "
        "or election, and owner.data_address) with another node to copy to; this owner has none: "
        "use write_through=False");
  }
  const uint64_t put_id = next_put_id_.fetch_add(1);
  // Reserve every key, one shard lock each (G3), and claim their slots; a conflict or a failed
  // claim leaves nothing reserved.
  absl::StatusOr<std::vector<SlotRef>> slots =
      keys_->ReserveAndClaim(a.keys, put_id, static_cast<uint64_t>(a.value_len), conflicts);
  if (!slots.ok()) {
    if (slots.status().code() == absl::StatusCode::kAlreadyExists) {
      counters_->put_conflicts.fetch_add(1, std::memory_order_relaxed);
    } else if (slots.status().code() == absl::StatusCode::kResourceExhausted) {
      counters_->put_no_space.fetch_add(1, std::memory_order_relaxed);
    }
    return slots.status();
  }
  auto batch = std::make_shared<PutBatch>();
  batch->client_id = client_id;
  batch->put_id = put_id;
  const size_t n = a.keys.size();
  batch->keys = std::move(a.keys);
  batch->slots = std::move(*slots);
  batch->value_len = static_cast<uint64_t>(a.value_len);
  batch->group_lens = std::move(a.options.atomic_group_lens);
  batch->parent_key = std::move(a.options.parent_key);
  // The design's per-key decision: !write_through && make_replica_task && mask[i] (an empty
  // mask broadcasts make_replica_task); a write-through put copies every group instead.
  if (a.options.write_through) {
    batch->write_through = write_through_->Start(batch->keys, batch->parent_key);
  } else if (a.options.make_replica_task) {
    batch->replicate = a.options.make_replica_task_mask.empty()
                           ? std::vector<bool>(n, true)
                           : std::move(a.options.make_replica_task_mask);
  }
  batch->deadline = std::chrono::steady_clock::now() + put_lease_;
  PutStartOutcome out;
  out.put_id = put_id;
  out.offsets.reserve(batch->slots.size());
  for (const SlotRef& s : batch->slots) out.offsets.push_back(pool_->OffsetOf(s));
  puts_.InsertIfAbsent(put_id, std::move(batch));
  counters_->put_batches.fetch_add(1, std::memory_order_relaxed);
  counters_->put_pages.fetch_add(n, std::memory_order_relaxed);
  return out;
}

absl::StatusOr<std::shared_ptr<PutBatch>> PutPath::Take(uint64_t client_id, uint64_t put_id) {
  std::shared_ptr<PutBatch> taken;
  puts_.Update(put_id, [&](std::shared_ptr<PutBatch>* b, bool* erase) {
    if (b == nullptr || (*b)->client_id != client_id) return 0;
    taken = std::move(*b);
    *erase = true;
    return 0;
  });
  if (!taken) {
    // Another session's put is indistinguishable from none: ids are not usable across sessions.
    return absl::NotFoundError(absl::StrFormat(
        "put %d is not prepared in this session (committed, aborted or expired)", put_id));
  }
  return taken;
}

void PutPath::Release(const PutBatch& b) { keys_->ReleaseReservation(b.keys, b.put_id, b.slots); }

absl::Status PutPath::Abort(uint64_t client_id, uint64_t put_id) {
  FLUXON_ASSIGN_OR_RETURN(std::shared_ptr<PutBatch> taken, Take(client_id, put_id));
  Release(*taken);
  counters_->put_aborts.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status PutPath::Commit(uint64_t client_id, uint64_t put_id, PutDoneCallback done,
                             bool defer_publish_wake) {
  // Backpressure first, before anything becomes visible: a commit that cannot be queued aborts
  // the put, so a failed commit leaves nothing reserved.
  if (absl::Status place = publisher_->ReservePlace(); !place.ok()) {
    if (Abort(client_id, put_id).ok()) {
      spdlog::warn("commit of put {}: {}", put_id, std::string(place.message()));
    }
    return place;
  }
  absl::StatusOr<std::shared_ptr<PutBatch>> taken = Take(client_id, put_id);
  if (!taken.ok()) {
    publisher_->CancelPlace();
    return taken.status();
  }
  std::shared_ptr<PutBatch> batch = std::move(*taken);
  // V1: every value is local-read-ready before this returns.
  for (size_t i = 0; i < batch->keys.size(); ++i) {
    keys_->MakeLocalVisible(batch->keys[i], put_id, batch->slots[i], batch->value_len);
  }
  counters_->put_commits.fetch_add(1, std::memory_order_relaxed);
  publisher_->Push(std::move(batch), std::move(done), defer_publish_wake);
  return absl::OkStatus();
}

size_t PutPath::ExpireDue(std::chrono::steady_clock::time_point now) {
  std::vector<std::pair<uint64_t, uint64_t>> due;  // (client, put)
  puts_.ForEach([&](const uint64_t& id, const std::shared_ptr<PutBatch>& b) {
    if (b->deadline <= now) due.emplace_back(b->client_id, id);
  });
  size_t expired = 0;
  for (const auto& [client, put_id] : due) {
    if (Abort(client, put_id).ok()) {
      ++expired;
      counters_->puts_expired.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("put {} (session {}) not committed or aborted within put_lease ({} ms): aborted",
                   put_id, client, put_lease_.count());
    }
  }
  return expired;
}

size_t PutPath::AbortSession(uint64_t client_id) {
  std::vector<uint64_t> ids;
  puts_.ForEach([&](const uint64_t& id, const std::shared_ptr<PutBatch>& b) {
    if (b->client_id == client_id) ids.push_back(id);
  });
  size_t aborted = 0;
  for (uint64_t id : ids) aborted += Abort(client_id, id).ok();
  return aborted;
}

}  // namespace fluxon
