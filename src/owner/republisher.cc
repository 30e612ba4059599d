#include "owner/republisher.h"

#include <string>
#include <vector>

#include "rpc/retry.h"
#include "spdlog/spdlog.h"

namespace fluxon {

void Republisher::Run() {
  auto backoff = std::chrono::milliseconds(100);
  while (registration_->WaitRepublishDue(std::chrono::milliseconds(500))) {
    if (!registration_->TakeRepublishDue()) continue;
    if (RunRound()) {
      backoff = std::chrono::milliseconds(100);
      continue;
    }
    // Not finished: due again after a pause (the master is unreachable or refused us).
    if (!stop_->SleepFor(backoff)) return;
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2'000));
    registration_->MarkRepublishDue();
  }
}

bool Republisher::RepublishChunk(std::span<const Offered> chunk, Tally* tally) {
  // Pin each value for the call: eviction cannot take it while its route is being restored.
  std::vector<HolderRef> pins;
  std::vector<const Offered*> offered;
  pins.reserve(chunk.size());
  for (const Offered& v : chunk) {
    HolderRef h;
    uint64_t cohort = 0;
    if (!keys_->PinVersion(v.key, v.put_id, &h, &cohort)) {
      ++tally->skipped;  // deleted, evicted or being evicted since the scan
      continue;
    }
    pins.push_back(std::move(h));
    offered.push_back(&v);
  }
  if (offered.empty()) return true;
  v1::PublishBatchRequest req;
  req.set_node_id(registration_->identity().node_id);
  // A republish: on a conflict the master keeps the higher version, and tells the owners of a
  // replaced route to republish in turn (so they drop what they hold of the older one).
  req.set_republish(true);
  for (const Offered* v : offered) {
    v1::RouteItem* item = req.add_items();
    item->set_key(v->key);
    item->set_put_id(v->put_id);
    item->set_offset(v->offset);
    item->set_len(v->len);
    item->set_version(v->version);
    item->set_copy(v->copy);
  }
  uint64_t generation_used = 0;
  absl::StatusOr<v1::PublishBatchReply> reply = RetryUncertain(
      [&] {
        generation_used = registration_->generation();
        req.set_generation(generation_used);
        return master_->PublishBatch(req);
      },
      stop_, [](const absl::Status&, std::chrono::milliseconds) {});
  if (!reply.ok()) {
    if (IsGenerationRefused(reply.status())) registration_->NoteRefused();
    spdlog::warn("republish of {} values: {}; trying again later", offered.size(),
                 reply.status().ToString());
    return false;
  }
  if (reply->outcomes_size() != req.items_size()) {
    spdlog::error("republish: {} outcomes for {} values; trying again later",
                  reply->outcomes_size(), req.items_size());
    return false;
  }
  registration_->NoteEpoch(reply->master_epoch());
  registration_->NoteClock(reply->hlc());
  pins.clear();  // before dropping: the index's reference must be the only one
  for (int j = 0; j < reply->outcomes_size(); ++j) {
    const Offered& v = *offered[j];
    if (reply->outcomes(j) == v1::PUBLISHED) {
      ++tally->published;
    } else if (evictor_->DropUnrouted(v.key, v.put_id)) {
      ++tally->dropped;  // the master names another version of this key: ours is stale
    } else {
      ++tally->skipped;
    }
  }
  return generation_used == registration_->generation();  // else renewed meanwhile
}

bool Republisher::RunRound() {
  const auto began = std::chrono::steady_clock::now();
  std::vector<Offered> all;
  keys_->ForEachCommitted([&](const KeyIndex::CommittedValue& v) {
    all.push_back(Offered{v.key, v.put_id, v.version, v.copy, v.offset, v.len});
  });
  Tally tally;
  for (size_t begin = 0; begin < all.size(); begin += options_.batch_keys) {
    const size_t end = std::min(all.size(), begin + options_.batch_keys);
    if (!RepublishChunk(std::span<const Offered>(all).subspan(begin, end - begin), &tally)) {
      return false;
    }
    // Rate bound: at most values_per_second.
    const auto budget = std::chrono::microseconds(static_cast<int64_t>(
        1e6 * static_cast<double>(end) / static_cast<double>(options_.values_per_second)));
    const auto spent = std::chrono::steady_clock::now() - began;
    if (spent < budget &&
        !stop_->SleepFor(std::chrono::duration_cast<std::chrono::milliseconds>(budget - spent))) {
      return false;
    }
  }
  counters_->republished_values.fetch_add(static_cast<int64_t>(tally.published),
                                          std::memory_order_relaxed);
  counters_->republish_dropped.fetch_add(static_cast<int64_t>(tally.dropped),
                                         std::memory_order_relaxed);
  counters_->republish_rounds.fetch_add(1, std::memory_order_relaxed);
  spdlog::info(
      "republish round: {} of {} committed values routed again, {} dropped (another version "
      "is routed), {} skipped (gone meanwhile), {} ms",
      tally.published, all.size(), tally.dropped, tally.skipped,
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                            began)
          .count());
  return true;
}

}  // namespace fluxon
