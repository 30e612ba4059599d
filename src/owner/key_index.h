// KeyIndex: the owner's per-key state and the one owner of a value's lifecycle. Every change of a
// key's state goes through a method here, each checked against the state it starts from, and the
// transitions that also move the value's slot (slot/slot_pool.h) move it in the same call, after
// checking the key's state — no caller advances the two state machines side by side:
//
//   key transition                                    slot transition in the same call
//   absent --ReserveAndClaim--> Reserved(put_id)      Free --Claim--> Prepared (all or none)
//   absent --ReserveAndClaimEach--> Reserved(put_id)  Free --Claim--> Prepared (per key: a
//     (a remote get's or a replica pull's targets)      busy key or no slot leaves it absent)
//   absent --ReserveAll--> Reserved(put_id)           (the caller claims Prepared slots)
//   Reserved --ReleaseReservation--> absent           Prepared --Abort--> Free
//   Reserved --CommitHidden--> Reserved (holder)      Prepared --CommitHidden--> Pending
//   Reserved --MakeLocalVisible--> LocalVisible       Prepared --CommitLocalVisible--> Pending*
//   LocalVisible --Promote--> Committed(cohort)       Pending* --PublishRoute--> Committed
//   LocalVisible --EraseUnpublished--> absent         the last holder goes: -> Free
//   Reserved --CommitCopy--> Committed(cohort)        Pending --PublishRoute--> Committed
//     (a remote get's cached copy, route published)
//   Committed --MarkEvicting--> Evicting              —
//   Evicting --UnmarkEvicting--> Committed            —
//   Evicting --EraseEvicting--> absent                Committed --ReleaseRoute--> Releasing,
//                                                       Free when the returned holder goes
//   Committed --EraseStale--> absent (pins allowed)   Committed --ReleaseRoute--> Releasing,
//                                                       Free when the last reader lets go
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
// - A key is Committed exactly while its slot is Committed (route live, V3): Promote and
//   CommitCopy publish the slot's route under the key's shard lock and change nothing when the
//   slot refuses; EraseEvicting releases the route before the entry goes. The slot transitions
//   are one CAS on the slot's word (no lock), so the shard section stays O(1) (G10).
// - The gauges reserved_entries, local_visible_entries and committed_entries count entries by
//   state and are changed only here, with the transition.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "holder/holder.h"
#include "owner/owner_counters.h"
#include "route/key_control_table.h"
#include "slot/slot_pool.h"

namespace fluxon {

class KeyIndex {
 public:
  enum class State : uint8_t { kReserved, kLocalVisible, kCommitted, kEvicting };
  enum class MarkResult { kGone, kMarked, kInUse };

  // `pool` holds the slots of every value in the index; both must outlive it.
  KeyIndex(OwnerCounters* counters, SlotPool* pool) : counters_(counters), pool_(pool) {}
  ~KeyIndex();

  // Reserves every key for `put_id`, all or none. On a conflict nothing stays reserved and
  // `conflicts` (when non-null) lists the indices that were already present.
  // `fetch`: the reservation of a remote get's target (else a local put's).
  bool ReserveAll(std::span<const std::string> keys, uint64_t put_id,
                  std::vector<uint32_t>* conflicts, bool fetch = false);
  // Reserves every key for `put_id` and claims one Prepared slot of `value_len` bytes for each,
  // all or none (the put path). A conflict reserves nothing: AlreadyExists, `conflicts` (when
  // non-null) lists the indices already present. A claim that fails (ResourceExhausted after
  // `wait`, default the pool's hard timeout; Unavailable when stopping) leaves nothing reserved.
  absl::StatusOr<std::vector<SlotRef>> ReserveAndClaim(
      std::span<const std::string> keys, uint64_t put_id, uint64_t value_len,
      std::vector<uint32_t>* conflicts,
      std::optional<std::chrono::milliseconds> wait = std::nullopt);
  // One target of a remote get or a replica pull: its key, identity and length, and its atomic
  // group (targets sharing a non-zero group are claimed whole or not at all; 0: alone).
  struct TargetRequest {
    std::string_view key;
    uint64_t put_id = 0;
    uint64_t len = 0;
    uint32_t group = 0;
  };
  enum class TargetOutcome : uint8_t { kClaimed, kBusy, kNoSpace };
  struct TargetClaim {
    TargetOutcome outcome = TargetOutcome::kBusy;
    std::optional<SlotRef> slot;  // kClaimed: the Prepared slot of the fetch reservation
  };
  // Per target (or per atomic group, whole: its members consecutive with one non-zero group
  // number), independently of the others: reserves the key for
  // the fetch (`fetch` reservation) and claims a slot (all targets of one length at once within
  // `wait`, else unit by unit, so a prefix is still served). kBusy: the key (or another key of
  // its group) is reserved or held here already; kNoSpace: no slot for it (or for another member
  // of its group). A target that is not claimed keeps nothing reserved or claimed. Claimed
  // targets end with ReleaseReservation(fetch) or CommitCopy.
  std::vector<TargetClaim> ReserveAndClaimEach(std::span<const TargetRequest> targets,
                                               std::chrono::milliseconds wait);
  // A fetch target's bytes are in: its Prepared `slot` becomes Pending behind its canonical
  // holder (hidden: no reader can pin it until CommitCopy).
  absl::StatusOr<HolderRef> CommitHidden(const std::string& key, uint64_t put_id,
                                         const SlotRef& slot, uint64_t len);
  // Drops `put_id`'s reservations of `keys` of the same kind and aborts the Prepared `slots`
  // claimed for them (an abort, an expired put, a failed claim with no slots, a remote get's
  // target that was never filled). `keys` may be empty: slots whose reservation already went.
  void ReleaseReservation(std::span<const std::string> keys, uint64_t put_id,
                          std::span<const SlotRef> slots, bool fetch = false);
  // Reserved(put_id) -> LocalVisible: binds the written Prepared `slot` to its canonical holder
  // (slot Prepared -> PendingLocalVisible, V1). False when the holder cannot be made (the key's
  // reservation is then dropped) or the key is not put_id's reservation (the slot is freed).
  bool MakeLocalVisible(const std::string& key, uint64_t put_id, const SlotRef& slot,
                        uint64_t value_len);
  // LocalVisible(put_id) -> Committed in `cohort_id`, publishing the slot's route (V3); the value's
  // identity is (put_id, version). False, nothing changed, when the key is not put_id's
  // local-visible value or the slot refuses.
  bool Promote(const std::string& key, uint64_t put_id, uint64_t cohort_id, uint64_t version = 0);
  // LocalVisible(put_id) -> absent (never published); returns its holder to drop unlocked.
  HolderRef EraseUnpublished(const std::string& key, uint64_t put_id);

  // Reserved(put_id) -> Committed in `cohort_id` holding `holder` (moved from, slot Pending ->
  // Committed): a remote get's target whose copy the master published. False, nothing changed,
  // when the key is not put_id's fetch reservation or the slot refuses its route.
  // The copy keeps the identity (put_id, version) it was read as.
  bool CommitCopy(const std::string& key, uint64_t put_id, HolderRef* holder, uint64_t cohort_id,
                  uint64_t version = 0);

  // Pins a readable (LocalVisible or Committed) value: its holder and its cohort (0 before
  // commit). False when the key has no readable value.
  bool Pin(const std::string& key, HolderRef* holder, uint64_t* cohort);
  // Pin, only if the value carries `put_id` (the version the master routes to, T2).
  bool PinVersion(const std::string& key, uint64_t put_id, HolderRef* holder, uint64_t* cohort);
  // The cohort of a Committed key (of that put_id, when given); 0 otherwise.
  uint64_t CommittedCohort(const std::string& key, std::optional<uint64_t> put_id = std::nullopt);

  // Committed(put_id), referenced by nothing but the index -> Evicting. kInUse (unchanged) when
  // a reader pins it or it is not committed; kGone when the key no longer carries put_id.
  MarkResult MarkEvicting(const std::string& key, uint64_t put_id);
  // Evicting(put_id) -> Committed (the rest of its cohort was in use).
  void UnmarkEvicting(const std::string& key, uint64_t put_id);
  // Evicting(put_id) -> absent, releasing the slot's route (S2: the caller removed the master's
  // route first); returns the holder (the last reference) to release unlocked, which frees the
  // slot.
  HolderRef EraseEvicting(const std::string& key, uint64_t put_id);

  // Committed(put_id) -> absent whatever pins it: the master routes another version of the key,
  // so this copy must be invisible to new readers at once (T2). Releases the slot's route and
  // returns the index's holder; the slot goes Free when the last reference — the caller's, or a
  // reader's still holding a view of the old bytes — is dropped. Null when the key is not
  // put_id's Committed value (an Evicting one is the evictor's to finish).
  HolderRef EraseStale(const std::string& key, uint64_t put_id);

  // A Committed value as the republish offers it to the master.
  struct CommittedValue {
    const std::string& key;
    uint64_t put_id;
    uint64_t version;
    bool copy;  // a remote get's (or replica's) copy, not this owner's put
    uint64_t offset;
    uint64_t len;
  };
  // Calls fn for every Committed value (the republish after a master restart). Locks one shard
  // at a time; fn must not call back into the index.
  void ForEachCommitted(const std::function<void(const CommittedValue&)>& fn) const;
  // Calls fn(key, put_id, cohort_id) for every key starting with `prefix` (cohort 0: not
  // committed yet). Locks one shard at a time; fn must not call back into the index.
  void ForEachWithPrefix(
      const std::string& prefix,
      const std::function<void(const std::string&, uint64_t, uint64_t)>& fn) const;
  // A key's state and identity (put_id; version once Committed); nullopt when absent.
  struct Identity {
    State state;
    uint64_t put_id;
    uint64_t version;
    uint64_t len;  // value bytes (0 before LocalVisible)
  };
  std::optional<Identity> IdentityOf(const std::string& key) const;
  // "absent", "reserved", "local_visible", "committed" or "evicting".
  std::string StateName(const std::string& key) const;
  size_t size() const { return table_.size(); }

 private:
  struct Entry {
    State state = State::kReserved;
    uint64_t put_id = 0;
    HolderRef resident;  // from LocalVisible on: the value's canonical MemoryInfo
    uint64_t cohort_id = 0;
    uint64_t version = 0;  // from Committed on: with put_id, the value's identity
    bool fetch = false;    // Reserved by a remote get (its target), not by a local put
    bool copy = false;     // Committed as a copy of another owner's value (CommitCopy)
  };
  void Count(State s, int delta);
  void Unreserve(std::span<const std::string> keys, uint64_t put_id, bool fetch);
  void AbortPrepared(std::span<const SlotRef> slots, uint64_t put_id);

  OwnerCounters* const counters_;
  SlotPool* const pool_;
  KeyControlTable<Entry> table_;
};

}  // namespace fluxon
