// KeyIndex: the owner's per-key state and the one owner of its transitions. Every change of a
// key's state goes through a method here, each checked against the state it starts from:
//
//   absent --ReserveAll--> Reserved(put_id) --MakeLocalVisible--> LocalVisible(put_id)
//   Reserved --Unreserve--> absent                LocalVisible --Promote--> Committed(cohort)
//   LocalVisible --EraseUnpublished--> absent     Committed --MarkEvicting--> Evicting
//   Evicting --UnmarkEvicting--> Committed        Evicting --EraseEvicting--> absent
//   Reserved --CommitCopy--> Committed(cohort)    (a remote get's cached copy, route published)
//
// Invariants:
// - An entry carries the put_id of the batch that reserved it; every transition names that
//   put_id and does nothing to an entry of another version (no ABA across versions, T2).
//   put_ids are unique per value across owners (PutPath: node_id in the high bits), and a
//   reservation also says whose it is — a local put's or a remote get's (`fetch`): a put's
//   rollback never drops a fetch's reservation or the reverse, whatever the numbers.
// - Reserved entries have no value; LocalVisible and Committed ones hold the value's canonical
//   MemoryInfo (V1: readable, and pinnable, from LocalVisible on); a Committed entry's route is
//   published (V2/V3). Only Committed entries that nothing but the index references may become
//   Evicting, so eviction never frees memory a reader holds (S2 with the pool's holder count).
// - G3/G10: each transition is one shard lock for O(1) work on one key; holders are released
//   outside the lock (the methods return them to the caller).
// - The gauges reserved_entries, local_visible_entries and committed_entries count entries by
//   state and are changed only here, with the transition.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "holder/holder.h"
#include "owner/owner_counters.h"
#include "route/key_control_table.h"

namespace fluxon {

class KeyIndex {
 public:
  enum class State : uint8_t { kReserved, kLocalVisible, kCommitted, kEvicting };
  enum class MarkResult { kGone, kMarked, kInUse };

  explicit KeyIndex(OwnerCounters* counters) : counters_(counters) {}
  ~KeyIndex();

  // Reserves every key for `put_id`, all or none. On a conflict nothing stays reserved and
  // `conflicts` (when non-null) lists the indices that were already present.
  // `fetch`: the reservation of a remote get's target (else a local put's).
  bool ReserveAll(std::span<const std::string> keys, uint64_t put_id,
                  std::vector<uint32_t>* conflicts, bool fetch = false);
  // Drops `put_id`'s reservations of `keys` of the same kind (abort, failed claim).
  void Unreserve(std::span<const std::string> keys, uint64_t put_id, bool fetch = false);
  // Reserved(put_id) -> LocalVisible holding `holder` (moved from). False when the key is not
  // put_id's reservation (then `holder` is left with the caller).
  bool MakeLocalVisible(const std::string& key, uint64_t put_id, HolderRef* holder);
  // LocalVisible(put_id) -> Committed in `cohort_id`. False when the key is not put_id's.
  bool Promote(const std::string& key, uint64_t put_id, uint64_t cohort_id);
  // LocalVisible(put_id) -> absent (never published); returns its holder to drop unlocked.
  HolderRef EraseUnpublished(const std::string& key, uint64_t put_id);

  // Reserved(put_id) -> Committed in `cohort_id` holding `holder` (moved from): a remote get's
  // target whose copy the master published. False when the key is not put_id's reservation.
  bool CommitCopy(const std::string& key, uint64_t put_id, HolderRef* holder, uint64_t cohort_id);

  // Pins a readable (LocalVisible or Committed) value: its holder and its cohort (0 before
  // commit). False when the key has no readable value.
  bool Pin(const std::string& key, HolderRef* holder, uint64_t* cohort);
  // Pin, only if the value carries `put_id` (the version the master routes to, T2).
  bool PinVersion(const std::string& key, uint64_t put_id, HolderRef* holder, uint64_t* cohort);
  // The cohort of a Committed key; 0 otherwise.
  uint64_t CommittedCohort(const std::string& key);

  // Committed(put_id), referenced by nothing but the index -> Evicting. kInUse (unchanged) when
  // a reader pins it or it is not committed; kGone when the key no longer carries put_id.
  MarkResult MarkEvicting(const std::string& key, uint64_t put_id);
  // Evicting(put_id) -> Committed (the rest of its cohort was in use).
  void UnmarkEvicting(const std::string& key, uint64_t put_id);
  // Evicting(put_id) -> absent; returns the holder (the last reference) to release unlocked.
  HolderRef EraseEvicting(const std::string& key, uint64_t put_id);

  // Calls fn(key, put_id, offset, len) for every Committed value (the republish after a master
  // restart). Locks one shard at a time; fn must not call back into the index.
  void ForEachCommitted(
      const std::function<void(const std::string&, uint64_t, uint64_t, uint64_t)>& fn) const;
  // Calls fn(key, put_id, cohort_id) for every key starting with `prefix` (cohort 0: not
  // committed yet). Locks one shard at a time; fn must not call back into the index.
  void ForEachWithPrefix(
      const std::string& prefix,
      const std::function<void(const std::string&, uint64_t, uint64_t)>& fn) const;
  // "absent", "reserved", "local_visible", "committed" or "evicting".
  std::string StateName(const std::string& key) const;
  size_t size() const { return table_.size(); }

 private:
  struct Entry {
    State state = State::kReserved;
    uint64_t put_id = 0;
    HolderRef resident;  // from LocalVisible on: the value's canonical MemoryInfo
    uint64_t cohort_id = 0;
    bool fetch = false;  // Reserved by a remote get (its target), not by a local put
  };
  void Count(State s, int delta);

  OwnerCounters* const counters_;
  KeyControlTable<Entry> table_;
};

}  // namespace fluxon
