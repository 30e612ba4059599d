// SlotPool: the owner's local-reserve pool. 512 MiB grants carved from the segment, cut into
// exact-fit slots, one value per slot.
//
// Slot lifecycle (states are SlotState):
//   Free -> Prepared                 Claim (local_fast_put_start, or a remote-get target)
//   Prepared -> Free                 Abort (put_abort)
//   Prepared -> PendingLocalVisible  CommitLocalVisible: local reads may pin it at once (V1)
//   Prepared -> Pending              CommitHidden: remote-get target, invisible until published
//   PendingLocalVisible|Pending -> Committed   PublishRoute: the master route is live (V3)
//   Committed -> Releasing           ReleaseRoute while holders remain
//   Committed|Releasing|Pending* -> Free        last reference gone
//
// Invariants:
// - S2: a slot returns to Free only when its route is not live (state != Committed) and its
//   holder_ref_count is 0. Route release and holder release each happen exactly once, in either
//   order; the thread whose compare-and-swap makes the slot free, and only it, pushes the slot on
//   the free list, so a slot is never on a free list twice.
// - S1: eviction and reuse are per slot. A grant is only a container: it is shrunk (dynamic mode)
//   only when every one of its slots is Free and has been for `shrink_idle`.
// - Every SlotRef carries the slot's epoch (bumped on every claim) and the grant's carve id; an
//   operation with a stale ref fails instead of touching a reused or re-carved slot.
// - Expected-capacity mode: `expected_grants` grants are carved at Prewarm and that count is a hard
//   cap on grants (S5: pressure triggers reclaim through on_pressure, never growth). Dynamic mode
//   grows on demand, bounded by the segment, and shrinks idle grants down to the floor
//   max(expected, ceil((used + pending demand) / slots_per_grant)).
// - Claims are served first-come first-served per size class. A claim that cannot be served within
//   the hard timeout fails with ResourceExhausted carrying the stage (claim_turn or refill); after
//   the soft timeout it reports pressure once. A claim larger than the class can ever hold fails at
//   once. A failed claim reserves nothing. The hard timeout is not counted while the class is
//   being carved or while free slots the claim could take wait for the claims ahead of it: a
//   claim never times out while the segment has room for it (a busy machine's first touch of a
//   grant can outlast a short timeout).
// - Locks: one short mutex per size class guards free lists and waiters; one allocator mutex guards
//   grant positions. Neither is held while the other is taken, nor while memory is touched.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "slot/segment.h"

namespace fluxon {

enum class SlotState : uint8_t {
  kFree = 0,
  kPrepared = 1,
  kPendingLocalVisible = 2,
  kPending = 3,
  kCommitted = 4,
  kReleasing = 5,
};
inline constexpr int kNumSlotStates = 6;
const char* SlotStateName(SlotState state);

struct SlotRef {
  uint32_t grant = 0;  // grant position in the segment
  uint32_t index = 0;  // slot index inside the grant
  uint32_t epoch = 0;  // claim epoch of the slot
  uint32_t carve = 0;  // which carving of the grant position (positions are re-carved after shrink)
  friend bool operator==(const SlotRef&, const SlotRef&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const SlotRef& r) {
    return H::combine(std::move(h), r.grant, r.index, r.epoch, r.carve);
  }
};

struct ExpectedCapacity {
  uint64_t value_len = 0;
  uint64_t payload_capacity_bytes = 0;
};

struct PressureEvent {
  uint64_t slot_size;
  uint64_t deficit_slots;  // slots the oldest waiting claim still lacks
};

struct SlotPoolOptions {
  std::optional<ExpectedCapacity> expected_capacity;
  std::chrono::milliseconds claim_soft_timeout{10};
  std::chrono::milliseconds claim_hard_timeout{30'000};
  std::chrono::milliseconds shrink_idle{5'000};
  // Dynamic mode: a class in use keeps at least this fraction of a grant in free slots —
  // RefillLowClasses carves a grant below it, and ShrinkIdleGrants never shrinks a class below
  // it (the same bound on both sides, so an idle owner never carves and shrinks in turn).
  double spare_fraction = 0.25;
  // Dynamic mode with populate_grants: free grant positions PrefaultAhead keeps populated, so
  // the carve a claim waits for takes one and skips the first touch (0: none).
  uint32_t warm_grants = 0;
  bool populate_grants = true;  // allocate (and NUMA-place) grant memory when carved
  // Called (outside every pool lock) once per claim that waited past the soft timeout.
  std::function<void(const PressureEvent&)> on_pressure;
};

struct SizeClassStats {
  uint64_t slot_size = 0;
  uint64_t slots_per_grant = 0;
  uint64_t grants = 0;
  uint64_t free_slots = 0;
  uint64_t waiting_claims = 0;
  uint64_t pending_demand_slots = 0;
  bool carving = false;  // a grant is being carved for the class (its free slots are coming)
};

struct SlotPoolStats {
  std::array<int64_t, kNumSlotStates> slots_by_state{};
  uint64_t grants = 0;
  uint64_t grant_capacity = 0;  // positions in the segment (or the expected-capacity cap)
  uint64_t claims = 0;
  uint64_t claim_timeouts = 0;
  uint64_t grants_shrunk = 0;
  uint64_t warm_grants = 0;  // free positions populated ahead of a carve
  std::vector<SizeClassStats> classes;
};

class SlotPool {
 public:
  static absl::StatusOr<std::unique_ptr<SlotPool>> Create(Segment* segment,
                                                          SlotPoolOptions options);
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // Carves the expected-capacity grants (no-op in dynamic mode).
  absl::Status Prewarm();

  // Claims `count` slots for values of `value_len` bytes, all or nothing (Free -> Prepared).
  absl::StatusOr<std::vector<SlotRef>> Claim(
      uint64_t value_len, size_t count,
      std::optional<std::chrono::milliseconds> hard_timeout = std::nullopt);
  absl::Status Abort(const SlotRef& ref);
  // Shutdown: every waiting and later Claim fails at once with Unavailable (a stopping owner
  // must not keep a request in a claim wait for up to the hard timeout).
  void CancelClaims();

  // Prepared -> PendingLocalVisible / Pending, taking the first holder reference.
  absl::Status CommitLocalVisible(const SlotRef& ref);
  absl::Status CommitHidden(const SlotRef& ref);
  // PendingLocalVisible|Pending -> Committed (route live).
  absl::Status PublishRoute(const SlotRef& ref);
  // Committed -> Releasing, or -> Free when no holder remains. Exactly once per publish.
  absl::Status ReleaseRoute(const SlotRef& ref);
  // Holder references: one per MemoryInfo bound to the slot (pins copy a holder, not this count).
  absl::Status AcquireHolder(const SlotRef& ref);
  absl::Status ReleaseHolder(const SlotRef& ref);

  // Returns grants that have been wholly free for shrink_idle (dynamic mode only), keeping a
  // class in use at its spare (spare_fraction of a grant free).
  size_t ShrinkIdleGrants();
  // Dynamic mode: carves one more grant for each class in use whose free slots fell below its
  // spare, so a claim rarely waits for a grant to be populated. Returns the grants carved.
  size_t RefillLowClasses();
  // Populates free grant positions until warm_grants of them are (outside every pool lock but
  // the position bookkeeping); returns the positions populated. For a background thread: a
  // carve racing with it on the same position populates it too, harmlessly.
  size_t PrefaultAhead();
  // Populates up to `max_bytes` of the grants AddGrant carved populated only in part (for the
  // maintenance thread, outside every pool lock but the bookkeeping); returns the bytes done.
  // Clients may already write into those grants: populating is a prefault, it changes no byte.
  uint64_t PopulateBehind(uint64_t max_bytes);
  // Whether another grant can still be carved (dynamic mode with a free position).
  bool CanGrow() const;

  absl::StatusOr<SlotState> StateOf(const SlotRef& ref) const;
  uint32_t HolderCountOf(const SlotRef& ref) const;
  uint64_t OffsetOf(const SlotRef& ref) const;
  uint64_t SlotSizeOf(const SlotRef& ref) const;
  uint8_t* AddressOf(const SlotRef& ref) const { return segment_->base() + OffsetOf(ref); }
  Segment* segment() const { return segment_; }
  const SlotPoolOptions& options() const { return options_; }
  uint64_t expected_grants() const { return expected_grants_; }

  SlotPoolStats Stats() const;
  // Walks every grant and checks free lists against slot words: no slot twice on a free list,
  // every listed slot Free, counts consistent. For tests and `fluxonctl slots --check`.
  absl::Status CheckConsistency() const;

 private:
  struct SizeClass;
  struct Grant;
  struct Waiter;

  SlotPool(Segment* segment, SlotPoolOptions options, uint64_t positions, uint64_t expected_grants);

  SizeClass* ClassFor(uint64_t slot_size);
  uint64_t MaxSlotsReachable(const SizeClass& cls) const;
  // Free slots a class in use keeps (options_.spare_fraction of a grant).
  uint64_t SpareSlots(const SizeClass& cls) const;
  // Carves a free position for `cls`. With populate_grants, a warm position is used as it is;
  // a cold one is populated for its first `claim_bytes` only (the claim waiting for it) and
  // the rest is left to PopulateBehind, so a claim never waits for 512 MiB of first touch.
  // NUMA placement populates the whole grant at once (placement binds as it touches).
  absl::Status AddGrant(SizeClass* cls, uint64_t claim_bytes = ~uint64_t{0});
  // The claim at the front of `cls`'s queue takes `count` free slots (Free -> Prepared, epoch
  // bumped) and leaves the queue. Called with cls->mu held and free_slots >= count.
  std::vector<SlotRef> TakeFreeSlots(SizeClass* cls, size_t count);
  // A claim leaves `cls`'s queue without slots (timed out or cancelled); the next one may go.
  // Called with cls->mu held.
  static void LeaveQueue(SizeClass* cls, Waiter* claim);
  absl::StatusOr<std::atomic<uint64_t>*> WordFor(const SlotRef& ref) const;
  // Applies `next(old_state, old_holders)` atomically; pushes the slot to its free list when the
  // transition produced Free.
  template <typename Next>
  absl::Status Transition(const SlotRef& ref, const char* op, Next next);
  void PushFree(const SlotRef& ref);
  void CountTransition(SlotState from, SlotState to);
  void CountTransitionBatch(size_t claimed);

  Segment* const segment_;
  const SlotPoolOptions options_;
  const uint64_t positions_;        // grant positions the segment holds
  const uint64_t expected_grants_;  // 0 in dynamic mode

  mutable Mutex classes_mu_;
  absl::btree_map<uint64_t, std::unique_ptr<SizeClass>> classes_ ABSL_GUARDED_BY(classes_mu_);

  mutable Mutex alloc_mu_;
  absl::btree_set<uint32_t> free_positions_ ABSL_GUARDED_BY(alloc_mu_);
  // The free positions whose memory is populated (a subset of free_positions_).
  absl::btree_set<uint32_t> warm_positions_ ABSL_GUARDED_BY(alloc_mu_);
  uint64_t carved_grants_ ABSL_GUARDED_BY(alloc_mu_) = 0;
  uint32_t next_carve_ ABSL_GUARDED_BY(alloc_mu_) = 1;
  // Grant metadata per (position, slot size); immutable once published and kept until the pool
  // dies, so a stale SlotRef reads Free words, never freed memory.
  std::vector<std::unique_ptr<Grant>> retired_ ABSL_GUARDED_BY(alloc_mu_);
  // Carved grants whose memory [next, end) is not populated yet (PopulateBehind), oldest first.
  struct Unpopulated {
    uint32_t position = 0;
    uint64_t next = 0;
    uint64_t end = 0;
  };
  std::deque<Unpopulated> unpopulated_ ABSL_GUARDED_BY(alloc_mu_);
  std::unique_ptr<std::atomic<Grant*>[]> grants_;

  std::array<std::atomic<int64_t>, kNumSlotStates> state_counts_{};
  std::atomic<uint64_t> claims_{0};
  std::atomic<bool> claims_cancelled_{false};
  std::atomic<uint64_t> claim_timeouts_{0};
  std::atomic<uint64_t> grants_shrunk_{0};
};

}  // namespace fluxon
