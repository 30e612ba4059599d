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
// - A deferred handle (get_start answered before its values on other owners were fetched) holds
//   the fetches' shared ops for those values; get_transfer waits for the consumed ones outside
//   the table's locks (bounded), and a consumed value that could not be fetched drops the whole
//   handle (Aborted): a plan never names a value that is not here.
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
#include "owner/single_flight.h"

namespace fluxon {

class HandleTable {
 public:
  using Clock = std::chrono::steady_clock;

  HandleTable(OwnerCounters* counters, std::chrono::milliseconds handle_ttl,
              std::chrono::milliseconds view_lease)
      : counters_(counters), handle_ttl_(handle_ttl), view_lease_(view_lease) {}
  ~HandleTable();

  // A value of a deferred handle still being fetched: its index in the prefix and the fetch's op
  // (its holder once it ends).
  struct Pending {
    uint32_t index = 0;
    std::shared_ptr<SharedGetOp> op;
  };
  // Where a consumed value lies in the segment.
  struct Located {
    uint64_t offset = 0;
    uint64_t len = 0;
  };

  // A new handle of `client_id` holding `pins` (the transferable prefix) with the caller's
  // groups covering it; `pending` names the prefix's values still being fetched (their pins are
  // empty). Returns its id.
  uint64_t Open(uint64_t client_id, std::vector<HolderRef> pins, std::vector<uint32_t> group_lens,
                std::vector<Pending> pending = {});
  // get_transfer: keeps the first `consume` pins (0: all), on a group boundary; the rest are
  // dropped now. The views' lease starts. A deferred handle first waits, until `wait_until`, for
  // its consumed values still being fetched; `located` (may be null) gets every consumed value's
  // place when the handle was deferred.
  absl::Status Consume(uint64_t client_id, uint64_t handle_id, uint32_t consume,
                       Clock::time_point wait_until = {}, std::vector<Located>* located = nullptr);
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
    std::vector<Pending> pending;      // values still being fetched (deferred handles)
    bool deferred = false;             // opened with pending values
    bool resolving = false;            // a get_transfer waits for `pending`
    bool consumed = false;
    Clock::time_point deadline;  // handle_ttl before consume, view_lease after
  };
  // Whether `hp` is client_id's unconsumed handle and `consume` a valid prefix of it; sets
  // `keep` (the prefix length to keep).
  static absl::Status CheckConsume(const std::shared_ptr<Handle>* hp, uint64_t client_id,
                                   uint64_t handle_id, uint32_t consume, uint32_t* keep);
  // Keeps the first `keep` pins of a checked handle (the rest go to `tail`, released by the
  // caller outside the shard lock), starts its views' lease and moves it from the live handles
  // gauge to the live views gauge.
  void ConsumeLocked(Handle& h, uint32_t keep, std::vector<HolderRef>* tail,
                     std::vector<Located>* located) const;
  // Drops a handle taken out of the table (its pins, its gauge).
  void Drop(std::shared_ptr<Handle> handle);

  OwnerCounters* const counters_;
  const std::chrono::milliseconds handle_ttl_;
  const std::chrono::milliseconds view_lease_;
  std::atomic<uint64_t> next_id_{1};
  ShardedTable<uint64_t, std::shared_ptr<Handle>, 64> table_;
};

}  // namespace fluxon
