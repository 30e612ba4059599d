#include "owner/republisher.h"

#include <string>
#include <vector>

#include "rpc/retry.h"
#include "spdlog/spdlog.h"

namespace fluxon {

namespace {
struct Offered {
  std::string key;
  uint64_t put_id = 0;
  uint64_t offset = 0;
  uint64_t len = 0;
};
}  // namespace

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

bool Republisher::RunRound() {
  const auto began = std::chrono::steady_clock::now();
  std::vector<Offered> all;
  keys_->ForEachCommitted(
      [&](const std::string& key, uint64_t put_id, uint64_t offset, uint64_t len) {
        all.push_back(Offered{key, put_id, offset, len});
      });
  uint64_t published = 0, dropped = 0, skipped = 0;
  const uint32_t node = registration_->identity().node_id;
  for (size_t begin = 0; begin < all.size(); begin += options_.batch_keys) {
    const size_t end = std::min(all.size(), begin + options_.batch_keys);
    // Pin each value for the call: eviction cannot take it while its route is being restored.
    std::vector<HolderRef> pins;
    std::vector<size_t> offered;
    pins.reserve(end - begin);
    for (size_t i = begin; i < end; ++i) {
      HolderRef h;
      uint64_t cohort = 0;
      if (!keys_->PinVersion(all[i].key, all[i].put_id, &h, &cohort)) {
        ++skipped;  // deleted, evicted or being evicted since the scan
        continue;
      }
      pins.push_back(std::move(h));
      offered.push_back(i);
    }
    if (offered.empty()) continue;
    v1::PublishBatchRequest req;
    req.set_node_id(node);
    for (size_t i : offered) {
      v1::RouteItem* item = req.add_items();
      item->set_key(all[i].key);
      item->set_put_id(all[i].put_id);
      item->set_offset(all[i].offset);
      item->set_len(all[i].len);
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
    pins.clear();  // before dropping: the index's reference must be the only one
    for (int j = 0; j < reply->outcomes_size(); ++j) {
      const Offered& v = all[offered[j]];
      if (reply->outcomes(j) == v1::PUBLISHED) {
        ++published;
      } else if (evictor_->DropUnrouted(v.key, v.put_id)) {
        ++dropped;  // the master names another version of this key: ours is stale
      } else {
        ++skipped;
      }
    }
    // Rate bound: at most values_per_second.
    const auto budget = std::chrono::microseconds(static_cast<int64_t>(
        1e6 * static_cast<double>(end) / static_cast<double>(options_.values_per_second)));
    const auto spent = std::chrono::steady_clock::now() - began;
    if (spent < budget &&
        !stop_->SleepFor(std::chrono::duration_cast<std::chrono::milliseconds>(budget - spent))) {
      return false;
    }
    if (generation_used != registration_->generation()) return false;  // renewed meanwhile
  }
  counters_->republished_values.fetch_add(static_cast<int64_t>(published),
                                          std::memory_order_relaxed);
  counters_->republish_dropped.fetch_add(static_cast<int64_t>(dropped), std::memory_order_relaxed);
  counters_->republish_rounds.fetch_add(1, std::memory_order_relaxed);
  spdlog::info(
      "republish round: {} of {} committed values routed again, {} dropped (another version "
      "is routed), {} skipped (gone meanwhile or in use), {} ms",
      published, all.size(), dropped, skipped,
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                            began)
          .count());
  return true;
}

}  // namespace fluxon
