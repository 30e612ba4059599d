// Evictor: capacity eviction and delete-by-prefix (design §7), and the pressure signal the
// maintenance actor waits on.
//
// Invariants:
// - Whole cohorts only (one atomic group of one batch; S1: never a grant), only Committed values
//   nothing pins; a cohort with a pinned member is re-admitted to the hot tier unchanged (S4).
// - S2: the routes of every removed cohort go to the master (RemoveRoutes, at most
//   kRouteRemoveBatch keys per call, retried with the same identity while uncertain, T1) before
//   any of their slots is released. A location the master reports pinned (a peer's remote get
//   is reading it) is kept: the member goes back to Committed and its cohort, with the members
//   kept, is re-admitted; it is tried again in a later round.
// - Two paths: the hot tier over hot_capacity_ratio of the capacity evicts the overage at once;
//   claims still short of slots get the rate-limited fallback (<= max_bytes_per_round per round,
//   rounds >= min_interval apart). Either backs off (up to 2 s) when nothing was evictable, and
//   retries at once when candidates changed. Eviction never changes the capacity (S5).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/stop_signal.h"
#include "owner/hot_tier.h"
#include "owner/key_index.h"
#include "owner/master_registration.h"
#include "owner/owner_counters.h"
#include "owner/publisher.h"
#include "rpc/master_api.h"
#include "slot/slot_pool.h"

namespace fluxon {

struct DeleteOutcome {
  uint64_t deleted = 0;         // values removed (route first, then slot)
  uint64_t skipped_in_use = 0;  // values pinned by a reader or not committed yet
};

class Evictor final : public EvictionSignals {
 public:
  struct Options {
    double hot_capacity_ratio = 0.95;
    uint64_t max_bytes_per_round = 256ull << 20;
    std::chrono::milliseconds min_interval{200};
  };
  // Keys per RemoveRoutes call when eviction or a delete removes many (bounds one message).
  static constexpr size_t kRouteRemoveBatch = 4096;

  Evictor(Options options, const OwnerIdentity* identity, MasterApi* master, KeyIndex* keys,
          HotTier<>* hot, SlotPool* pool, OwnerCounters* counters, StopSignal* stop)
      : options_(options),
        identity_(identity),
        master_(master),
        keys_(keys),
        hot_(hot),
        pool_(pool),
        counters_(counters),
        stop_(stop) {}

  void CandidatesChanged() override { candidates_changed_.store(true, std::memory_order_relaxed); }
  void SignalPressure() override;
  // Waits up to `interval` unless pressure was signalled; false when stopping.
  bool WaitForWork(std::chrono::milliseconds interval);
  void Interrupt();

  // One maintenance round of eviction (watermark overage, then the pressure fallback).
  void RunRound();
  // Evicts cold cohorts worth at least `bytes` (or all evictable ones); returns bytes evicted.
  uint64_t EvictSome(uint64_t bytes);
  // Removes every committed, unpinned value whose key starts with `prefix`, like eviction does.
  absl::StatusOr<DeleteOutcome> DeletePrefix(const std::string& prefix);

 private:
  struct Need {
    uint64_t over_watermark = 0;  // used bytes above hot_capacity_ratio of the capacity
    uint64_t deficit = 0;         // bytes waiting claims lack when the pool cannot grow
  };
  Need Measure() const;
  enum class RemoveResult { kRemoved, kInUse, kGone };
  struct Removal {
    RemoveResult result = RemoveResult::kGone;
    uint64_t pages = 0;                    // values freed
    std::vector<std::string> pinned_keys;  // kept: a remote get reads them (master pin)
  };
  // Removes the members of each cohort that still carry its put_id, each cohort all or none.
  // Empty when the owner stopped while a route removal was uncertain.
  std::vector<Removal> RemoveCohorts(const std::vector<Cohort>& cohorts);
  // False when the owner stopped while retrying an uncertain outcome. Sets pinned[i] for items
  // the master kept because a remote get reads them.
  bool RemoveRoutes(const v1::RemoveRoutesRequest& req, std::vector<bool>* pinned);

  const Options options_;
  const OwnerIdentity* const identity_;
  MasterApi* const master_;
  KeyIndex* const keys_;
  HotTier<>* const hot_;
  SlotPool* const pool_;
  OwnerCounters* const counters_;
  StopSignal* const stop_;

  Mutex mu_;
  CondVar cv_;
  bool pressure_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> candidates_changed_{false};

  // Round state (the maintenance actor's thread only).
  using Clock = std::chrono::steady_clock;
  Clock::time_point next_fallback_ = Clock::now();
  std::chrono::milliseconds fallback_backoff_ = options_.min_interval;
  Clock::time_point next_watermark_ = Clock::now();
  std::chrono::milliseconds watermark_backoff_ = options_.min_interval;
};

}  // namespace fluxon
