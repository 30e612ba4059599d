// HandleTable: the owner's get handles (from get_start) and the views they become (from
// get_transfer), per session.
//
// Invariants:
// - A handle belongs to the session that opened it; another session's id is NotFound (ids are
//   not usable across sessions).
// - A handle is consumed once (get_transfer keeps a whole-group prefix of its pins and drops the
//   rest at once, G5), then released once (release_views); an unconsumed handle is cancelled
//   once. Every pin is dropped outside the table's locks.
// - Lifetimes are bounded: an unconsumed handle expires after handle_ttl, views after
//   view_lease (ExpireDue), through the same drop path as cancel/release; a session's handles
//   and views are all dropped when it ends.
// - The gauges live_handles and live_views count them and are changed only here.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sharded_table.h"
#include "holder/holder.h"
#include "owner/owner_counters.h"

namespace fluxon {

class HandleTable {
 public:
  using Clock = std::chrono::steady_clock;

  HandleTable(OwnerCounters* counters, std::chrono::milliseconds handle_ttl,
              std::chrono::milliseconds view_lease)
      : counters_(counters), handle_ttl_(handle_ttl), view_lease_(view_lease) {}
  ~HandleTable();

  // A new handle of `client_id` holding `pins` (the transferable prefix) with the caller's
  // groups covering it. Returns its id.
  uint64_t Open(uint64_t client_id, std::vector<HolderRef> pins, std::vector<uint32_t> group_lens);
  // get_transfer: keeps the first `consume` pins (0: all), on a group boundary; the rest are
  // dropped now. The views' lease starts.
  absl::Status Consume(uint64_t client_id, uint64_t handle_id, uint32_t consume);
  // cancel_get_transfer of an unconsumed handle.
  absl::Status Cancel(uint64_t client_id, uint64_t handle_id);
  // release_views of a consumed handle.
  absl::Status Release(uint64_t client_id, uint64_t handle_id);
  // Drops every handle past handle_ttl and every view past view_lease; returns how many.
  size_t ExpireDue(Clock::time_point now);
  // Drops every handle and view of a session that ended; returns how many.
  size_t DropSession(uint64_t client_id);
  size_t size() const { return table_.size(); }

 private:
  struct Handle {
    uint64_t client_id = 0;
    std::vector<HolderRef> pins;
    std::vector<uint32_t> group_lens;  // of the transferable prefix
    bool consumed = false;
    Clock::time_point deadline;  // handle_ttl before consume, view_lease after
  };
  // Drops a handle taken out of the table (its pins, its gauge).
  void Drop(std::shared_ptr<Handle> handle);

  OwnerCounters* const counters_;
  const std::chrono::milliseconds handle_ttl_;
  const std::chrono::milliseconds view_lease_;
  std::atomic<uint64_t> next_id_{1};
  ShardedTable<uint64_t, std::shared_ptr<Handle>, 64> table_;
};

}  // namespace fluxon
