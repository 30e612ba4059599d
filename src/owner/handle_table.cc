#include "owner/handle_table.h"

#include "absl/strings/str_format.h"
#include "common/batch.h"
#include "spdlog/spdlog.h"

namespace fluxon {

HandleTable::~HandleTable() {
  std::vector<uint64_t> ids;
  table_.ForEach([&](const uint64_t& id, const std::shared_ptr<Handle>&) { ids.push_back(id); });
  for (uint64_t id : ids) table_.Take(id);
}

uint64_t HandleTable::Open(uint64_t client_id, std::vector<HolderRef> pins,
                           std::vector<uint32_t> group_lens) {
  auto h = std::make_shared<Handle>();
  h->client_id = client_id;
  h->pins = std::move(pins);
  h->group_lens = std::move(group_lens);
  h->deadline = Clock::now() + handle_ttl_;
  const uint64_t id = next_id_.fetch_add(1);
  table_.InsertIfAbsent(id, std::move(h));
  counters_->live_handles.fetch_add(1, std::memory_order_relaxed);
  return id;
}

absl::Status HandleTable::Consume(uint64_t client_id, uint64_t handle_id, uint32_t consume) {
  std::vector<HolderRef> tail;
  absl::Status result =
      table_.Update(handle_id, [&](std::shared_ptr<Handle>* hp, bool*) -> absl::Status {
        if (hp == nullptr || (*hp)->client_id != client_id) {
          return absl::NotFoundError(absl::StrFormat(
              "get handle %d is unknown (never issued, already released, or expired)", handle_id));
        }
        Handle& h = **hp;
        if (h.consumed) {
          return absl::FailedPreconditionError(
              absl::StrFormat("get handle %d was already consumed by get_transfer", handle_id));
        }
        const uint32_t t = static_cast<uint32_t>(h.pins.size());
        const uint32_t keep = consume == 0 ? t : consume;
        if (keep > t) {
          return absl::InvalidArgumentError(
              absl::StrFormat("consume_prefix_len %d exceeds transferable_len %d", keep, t));
        }
        if (!IsGroupBoundary(keep, h.group_lens)) {
          return absl::InvalidArgumentError(
              absl::StrFormat("consume_prefix_len %d is not on an atomic group boundary", keep));
        }
        for (uint32_t i = keep; i < t; ++i) tail.push_back(std::move(h.pins[i]));
        h.pins.resize(keep);
        h.consumed = true;
        h.deadline = Clock::now() + view_lease_;
        return absl::OkStatus();
      });
  if (result.ok()) {
    counters_->live_handles.fetch_sub(1, std::memory_order_relaxed);
    counters_->live_views.fetch_add(1, std::memory_order_relaxed);
  }
  tail.clear();  // G5: the dropped suffix is released now, outside the shard lock
  return result;
}

absl::Status HandleTable::Cancel(uint64_t client_id, uint64_t handle_id) {
  std::shared_ptr<Handle> taken;
  absl::Status result =
      table_.Update(handle_id, [&](std::shared_ptr<Handle>* hp, bool* erase) -> absl::Status {
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
  if (taken) Drop(std::move(taken));
  return result;
}

absl::Status HandleTable::Release(uint64_t client_id, uint64_t handle_id) {
  std::shared_ptr<Handle> taken;
  absl::Status result =
      table_.Update(handle_id, [&](std::shared_ptr<Handle>* hp, bool* erase) -> absl::Status {
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
  if (taken) Drop(std::move(taken));
  return result;
}

void HandleTable::Drop(std::shared_ptr<Handle> handle) {
  handle->pins.clear();
  if (handle->consumed) {
    counters_->live_views.fetch_sub(1, std::memory_order_relaxed);
  } else {
    counters_->live_handles.fetch_sub(1, std::memory_order_relaxed);
  }
}

size_t HandleTable::ExpireDue(Clock::time_point now) {
  std::vector<uint64_t> due;
  table_.ForEach([&](const uint64_t& id, const std::shared_ptr<Handle>& h) {
    if (h->deadline <= now) due.push_back(id);
  });
  size_t expired = 0;
  for (uint64_t id : due) {
    std::shared_ptr<Handle> taken;
    table_.Update(id, [&](std::shared_ptr<Handle>* hp, bool* erase) {
      if (hp != nullptr && (*hp)->deadline <= now) {
        taken = std::move(*hp);
        *erase = true;
      }
      return 0;
    });
    if (!taken) continue;
    ++expired;
    if (taken->consumed) {
      counters_->views_expired.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn(
          "views of handle {} (session {}) not released within view_lease ({} ms): "
          "released",
          id, taken->client_id, view_lease_.count());
    } else {
      counters_->handles_expired.fetch_add(1, std::memory_order_relaxed);
    }
    Drop(std::move(taken));
  }
  return expired;
}

size_t HandleTable::DropSession(uint64_t client_id) {
  std::vector<uint64_t> ids;
  table_.ForEach([&](const uint64_t& id, const std::shared_ptr<Handle>& h) {
    if (h->client_id == client_id) ids.push_back(id);
  });
  size_t dropped = 0;
  for (uint64_t id : ids) {
    std::shared_ptr<Handle> taken;
    table_.Update(id, [&](std::shared_ptr<Handle>* hp, bool* erase) {
      if (hp != nullptr && (*hp)->client_id == client_id) {
        taken = std::move(*hp);
        *erase = true;
      }
      return 0;
    });
    if (taken) {
      Drop(std::move(taken));
      ++dropped;
    }
  }
  return dropped;
}

}  // namespace fluxon
