#include "owner/handle_table.h"

#include "absl/strings/str_format.h"
#include "common/batch.h"
#include "fluxon/status.h"
#include "spdlog/spdlog.h"

namespace fluxon {

HandleTable::~HandleTable() {
  std::vector<uint64_t> ids;
  table_.ForEach([&](const uint64_t& id, const std::shared_ptr<Handle>&) { ids.push_back(id); });
  for (uint64_t id : ids) table_.Take(id);
}

uint64_t HandleTable::Open(uint64_t client_id, std::vector<HolderRef> pins,
                           std::vector<uint32_t> group_lens, std::vector<Pending> pending) {
  auto h = std::make_shared<Handle>();
  h->client_id = client_id;
  h->pins = std::move(pins);
  h->group_lens = std::move(group_lens);
  h->deferred = !pending.empty();
  h->pending = std::move(pending);
  h->deadline = Clock::now() + handle_ttl_;
  const uint64_t id = next_id_.fetch_add(1);
  table_.InsertIfAbsent(id, std::move(h));
  counters_->live_handles.fetch_add(1, std::memory_order_relaxed);
  return id;
}

absl::Status HandleTable::CheckConsume(const std::shared_ptr<Handle>* hp, uint64_t client_id,
                                       uint64_t handle_id, uint32_t consume, uint32_t* keep) {
  if (hp == nullptr || (*hp)->client_id != client_id) {
    return absl::NotFoundError(absl::StrFormat(
        "get handle %d is unknown (never issued, cancelled, already released, or expired)",
        handle_id));
  }
  const Handle& h = **hp;
  if (h.consumed) {
    return absl::FailedPreconditionError(
        absl::StrFormat("get handle %d was already consumed by get_transfer", handle_id));
  }
  const uint32_t t = static_cast<uint32_t>(h.pins.size());
  *keep = consume == 0 ? t : consume;
  if (*keep > t) {
    return absl::InvalidArgumentError(
        absl::StrFormat("consume_prefix_len %d exceeds transferable_len %d", *keep, t));
  }
  if (!IsGroupBoundary(*keep, h.group_lens)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("consume_prefix_len %d is not on an atomic group boundary", *keep));
  }
  return absl::OkStatus();
}

void HandleTable::ConsumeLocked(Handle& h, uint32_t keep, std::vector<HolderRef>* tail,
                                std::vector<Located>* located) const {
  const uint32_t t = static_cast<uint32_t>(h.pins.size());
  for (uint32_t i = keep; i < t; ++i) tail->push_back(std::move(h.pins[i]));
  h.pins.resize(keep);
  h.consumed = true;
  h.deadline = Clock::now() + view_lease_;
  counters_->live_handles.fetch_sub(1, std::memory_order_relaxed);
  counters_->live_views.fetch_add(1, std::memory_order_relaxed);
  if (located != nullptr && h.deferred) {
    located->reserve(keep);
    for (const HolderRef& p : h.pins) located->push_back(Located{p->offset, p->len});
  }
}

absl::Status HandleTable::Consume(uint64_t client_id, uint64_t handle_id, uint32_t consume,
                                  Clock::time_point wait_until, std::vector<Located>* located) {
  // A handle without values being fetched is consumed in this one shard section (the local-hit
  // path). A deferred handle's consumed values still being fetched are waited for first, outside
  // the shard lock (one get_transfer at a time: `resolving`).
  std::vector<Pending> waiting;
  std::vector<HolderRef> tail;
  uint32_t keep = 0;
  bool consumed = false;
  absl::Status checked =
      table_.Update(handle_id, [&](std::shared_ptr<Handle>* hp, bool*) -> absl::Status {
        FLUXON_RETURN_IF_ERROR(CheckConsume(hp, client_id, handle_id, consume, &keep));
        Handle& h = **hp;
        if (h.pending.empty()) {
          ConsumeLocked(h, keep, &tail, located);
          consumed = true;
          return absl::OkStatus();
        }
        if (h.resolving) {
          return absl::FailedPreconditionError(
              absl::StrFormat("get handle %d is being transferred already", handle_id));
        }
        h.resolving = true;
        for (const Pending& p : h.pending) {
          if (p.index < keep) waiting.push_back(p);
        }
        return absl::OkStatus();
      });
  if (consumed) {
    tail.clear();  // G5: the dropped suffix is released now, outside the shard lock
    return checked;
  }
  if (!checked.ok()) return checked;
  std::vector<std::pair<uint32_t, HolderRef>> arrived;
  arrived.reserve(waiting.size());
  for (const Pending& p : waiting) arrived.emplace_back(p.index, p.op->Wait(wait_until));
  waiting.clear();

  std::shared_ptr<Handle> failed;
  absl::Status result =
      table_.Update(handle_id, [&](std::shared_ptr<Handle>* hp, bool* erase) -> absl::Status {
        if (hp != nullptr && (*hp)->client_id == client_id && !(*hp)->pending.empty()) {
          Handle& h = **hp;
          for (auto& [index, holder] : arrived) h.pins[index] = std::move(holder);
          h.pending.clear();
          h.resolving = false;
          uint32_t missing = 0, first = 0;
          for (uint32_t i = keep; i-- > 0;) {
            if (!h.pins[i]) {
              ++missing;
              first = i;
            }
          }
          if (missing > 0) {
            failed = std::move(*hp);
            *erase = true;
            return absl::AbortedError(absl::StrFormat(
                "%d of the %d consumed values could not be fetched from the owners holding them "
                "(the first at index %d); get handle %d is released: start the get again",
                missing, keep, first, handle_id));
          }
        }
        FLUXON_RETURN_IF_ERROR(CheckConsume(hp, client_id, handle_id, consume, &keep));
        ConsumeLocked(**hp, keep, &tail, located);
        return absl::OkStatus();
      });
  if (failed) {
    counters_->deferred_gets_failed.fetch_add(1, std::memory_order_relaxed);
    Drop(std::move(failed));
  }
  arrived.clear();
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
