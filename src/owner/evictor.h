// Evictor: capacity eviction and delete-by-prefix (design §7), and the pressure signal the
// maintenance actor waits on.
//
// Invariants:
// - Whole cohorts only (one atomic group of one batch; S1: never a grant), only Committed values
//   nothing pins; a cohort with a pinned member is re-admitted to the hot tier unchanged (S4).
// - S2: the routes of every removed cohort go to the master (RemoveRoutes, at most
//   kRouteRemoveBatch keys per call, and the gRPC client splits by bytes) before any of their
//   slots is released. Only a definite answer frees a slot: the master's reply saying the
//   location was removed or is not there. Any error — uncertain (Unavailable, DeadlineExceeded)
//   or not (ResourceExhausted, PermissionDenied, Internal, FailedPrecondition, a malformed
//   reply) — keeps the value: the member goes back to Committed and its cohort, with the
//   members kept, is re-admitted, to be tried again (same key + put_id, T1) in a later round.
//   A location the master reports pinned (a peer's remote get is reading it) is kept the same
//   way.
// - Bounded: one removal call is retried at most a few times (well under a second, longer for
//   an operator's delete), so local maintenance (handle, put and view expiry, quarantine
//   release) never waits on an unreachable master.
// - Two paths: the hot tier over hot_capacity_ratio of the capacity evicts the overage at once;
//   claims still short of slots get the rate-limited fallback (<= max_bytes_per_round per round,
//   rounds >= min_interval apart). Either backs off (up to 2 s) when nothing was evictable, and
//   retries at once when candidates changed. Eviction never changes the capacity (S5).
// - Demotion (owner.demotion, design §7 single-copy demotion): above start_ratio a round first
//   releases copied cohorts (duplicates at rest), then hands cold cohorts (the policy's victims,
//   at most max_bytes_in_flight at once) to the replica queue with a demotion intent: a
//   remote_cache pulls them, the copy joins the route, and only then is this owner's location
//   removed (only if copied) and its slots freed, so a demoted value is always routed somewhere.
//   While in flight the cohort is out of the hot tier but Committed and readable. No room on
//   any remote_cache, a failure or a value gone meanwhile: the cohort goes back to the hot tier
//   (S4) and demotion pauses after no space (1 s, doubling to 16 s); pressure above
//   hot_capacity_ratio then deletes as without demotion, so a put never waits for a demotion.
// - Recoverable first (design §7): a round takes the hot tier's copied-elsewhere cohorts before
//   any victim of the policy, and removes their routes only if copied (the master removes this
//   location only while another live location of the value stays, atomically per key), so this
//   pass never takes a value out of the cluster; a member the master finds sole is kept and its
//   cohort readmitted unmarked (the hint was stale). Only then cold cohorts without a copy.
// - One ranking for both tiers (demotion with remote_budget_bytes > 0; HotTier's one-ranking
//   invariants): the policy ranks what is here and what this owner demoted, together (a cohort
//   held in both tiers once), within start_ratio of the capacity plus the remote budget. A round
//   first trims that set to its budget with the policy's victims: a victim held here is evicted
//   (route first, then slots); this owner's copy of it on a remote_cache is dropped there
//   (DropCopies: that owner evicts it the same way; a failed drop leaves a routed copy its own
//   eviction takes later). Then, above start_ratio, the least recently used local cohorts move out,
//   those with a copy on a remote_cache (fetched back, keep_fetched_copies) first: one with a copy
//   there is released (removed here only if copied), one without is demoted (as above) and stays
//   ranked with its copy's place. Pressure above hot_capacity_ratio releases the local cohorts
//   with a copy there, then evicts the policy's victims from both tiers until enough is freed
//   here. A cohort the policy evicts while it moves is evicted by the move's end: what is left
//   here is removed, the copy made meanwhile is dropped.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/stop_signal.h"
#include "owner/hot_tier.h"
#include "owner/key_index.h"
#include "owner/master_registration.h"
#include "owner/owner_counters.h"
#include "owner/publisher.h"
#include "owner/replica_queue.h"
#include "rpc/master_api.h"
#include "rpc/peer_api.h"
#include "slot/slot_pool.h"

namespace fluxon {

struct DeleteOutcome {
  uint64_t deleted = 0;         // values removed (route first, then slot)
  uint64_t skipped_in_use = 0;  // values kept: pinned, not committed yet, or unconfirmed below
  uint64_t unconfirmed = 0;     // kept because the master did not confirm the route removal
};

struct DemotionOptions {
  // Demotion runs while used slots exceed this fraction of the capacity (below
  // hot_capacity_ratio, so it runs ahead of the pressure that deletes).
  double start_ratio = 0.85;
  uint64_t max_bytes_in_flight = 256ull << 20;  // slot bytes being demoted at once
  // One ranking for both tiers when nonzero: the bytes of demoted values this owner keeps
  // ranked on remote_caches (and drops there when its policy evicts them).
  uint64_t remote_budget_bytes = 0;
  // One ranking: a value fetched back keeps its copy on the remote_cache, and its cohort is
  // released here first (HotTier::EnableOneRanking); false: that copy is dropped.
  bool keep_fetched_copies = true;
  // Bounds one DropCopies call.
  std::chrono::milliseconds drop_timeout{2'000};
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
  // Calls per RemoveRoutes request: eviction (25 + 50 ms of backoff, so a round never stalls
  // maintenance), an operator's delete (about 2.5 s of backoff before it reports values kept).
  static constexpr int kEvictRemoveAttempts = 3;
  static constexpr int kDeleteRemoveAttempts = 8;

  Evictor(Options options, MasterRegistration* registration, MasterApi* master, KeyIndex* keys,
          HotTier<>* hot, SlotPool* pool, OwnerCounters* counters, StopSignal* stop)
      : options_(options),
        registration_(registration),
        master_(master),
        keys_(keys),
        hot_(hot),
        pool_(pool),
        counters_(counters),
        stop_(stop) {}

  void CandidatesChanged() override { candidates_changed_.store(true, std::memory_order_relaxed); }
  void SignalPressure() override;
  void ReplicaGroupEnded(const std::vector<std::string>& keys, uint64_t put_id,
                         uint64_t demoted_cohort, ReplicaGroupEnd end,
                         const std::string& target) override;
  // Turns demotion on (owner.demotion): cold cohorts go to a remote_cache through `queue`
  // before pressure deletes them. With options.remote_budget_bytes, one ranking for both tiers:
  // `peers` (not null) carries the drops. Call before the maintenance actor starts (and before
  // the hot tier's first admission).
  void EnableDemotion(ReplicaQueue* queue, DemotionOptions options, PeerApi* peers = nullptr);
  // The other side of one ranking: drops the copies named (a remote_cache asked by the owner
  // that demoted them), each as eviction removes a value; counts what was dropped, kept, not
  // held, and refused (a value another node put: only its owner may drop it).
  v1::DropCopiesReply DropCopies(const v1::DropCopiesRequest& req);
  // Waits up to `interval` unless pressure was signalled; false when stopping.
  bool WaitForWork(std::chrono::milliseconds interval);
  void Interrupt();

  // One maintenance round of eviction (watermark overage, then the pressure fallback).
  void RunRound();
  // Evicts cohorts worth at least `bytes` (or all evictable ones), copied-elsewhere ones first;
  // returns bytes evicted.
  uint64_t EvictSome(uint64_t bytes);
  // Every member of the values `keys` (put_id) has a complete copy on another node now (a
  // replica completed): their cohort is evicted first. False when their cohort is not here.
  bool NoteCopiedElsewhere(const std::vector<std::string>& keys, uint64_t put_id);
  // Drops a Committed value the master does not route here (a republish found another version
  // of its key): no route removal is needed. New readers no longer find it at once; readers
  // holding a view keep their bytes until they release it, and the slot is freed then. False
  // when the key no longer carries put_id's Committed value.
  bool DropUnrouted(const std::string& key, uint64_t put_id);
  // Removes every committed, unpinned value whose key starts with `prefix`, like eviction does.
  absl::StatusOr<DeleteOutcome> DeletePrefix(const std::string& prefix);

 private:
  struct Need {
    uint64_t over_watermark = 0;  // used bytes above hot_capacity_ratio of the capacity
    uint64_t deficit = 0;         // bytes waiting claims lack when the pool cannot grow
    uint64_t over_demotion = 0;   // used bytes above demotion's start_ratio (demotion on)
    uint64_t over_budget = 0;     // one ranking: ranked bytes above both tiers' budget
  };
  // One demotion round: releases copied cohorts, then queues cold ones, up to `bytes`.
  void Demote(uint64_t bytes);
  bool one_ranking() const { return demotions_ != nullptr && demotion_.remote_budget_bytes > 0; }
  // One ranking: drops the remote copies of values put here again since, and of values fetched
  // back here without keep_fetched_copies (HotTier::TakeRemoteToDrop): an older identity, or a
  // duplicate at rest, would hold budget it does not serve.
  void DropDuplicates();
  // One ranking: evicts the policy's victims worth `bytes` from both tiers.
  struct TrimResult {
    uint64_t taken = 0;       // bytes of the victims taken (either tier)
    uint64_t freed_here = 0;  // bytes freed on this owner
  };
  TrimResult Trim(uint64_t bytes);
  // Pressure's rounds of Trim per EvictSome (one ranking): bounds one call when the victims are
  // mostly on remote_caches.
  static constexpr int kPressureTrims = 8;
  // One ranking: moves local cohorts worth `bytes` out of this owner, least recently used
  // first: released where a copy is on a remote_cache, demoted (`demote`: within the demotions'
  // bound and the remote budget) where not, else kept. Returns the bytes freed here at once.
  uint64_t MoveLocal(uint64_t bytes, bool demote);
  // One ranking: removes the local values of moving cohorts whose remote copy exists (only if
  // copied) and ends their moves; returns bytes freed.
  uint64_t ReleaseLocal(std::vector<Cohort> cohorts, uint64_t* pages = nullptr);
  // Asks the remote_cache at `address` to drop this owner's copies of `cohorts`; what it
  // answered (kept: also those it refused; failed: values of calls that failed).
  struct DropCounts {
    uint64_t dropped = 0;
    uint64_t kept = 0;
    uint64_t failed = 0;
  };
  DropCounts DropRemote(const std::string& address, const std::vector<Cohort>& cohorts);
  // DropRemote for cohorts on any remote_caches (each to its own).
  DropCounts DropRemoteCopies(std::vector<Cohort> cohorts);
  // After a failed drop, that remote_cache is not asked again for this long (its drops count
  // failed at once); at most this many peers are remembered so.
  static constexpr std::chrono::milliseconds kDropBackoff{5'000};
  static constexpr size_t kMaxDropBackoffPeers = 1024;
  // A demotion of `weight` bytes ended.
  void Undemoting(uint64_t weight) ABSL_EXCLUSIVE_LOCKS_REQUIRED(demote_mu_);
  // Queues `cold` (taken from the hot tier, or moving) for demotion; returns what could not go.
  std::vector<Cohort> QueueDemotions(std::vector<Cohort> cold);
  Need Measure() const;
  enum class RemoveResult { kRemoved, kInUse, kGone };
  struct Removal {
    RemoveResult result = RemoveResult::kGone;
    uint64_t pages = 0;                    // values freed
    std::vector<std::string> pinned_keys;  // kept: pinned by a remote get, unconfirmed or sole
    uint64_t unconfirmed = 0;              // of pinned_keys: the master did not confirm
    uint64_t sole = 0;                     // of pinned_keys: no other live copy (only if copied)
  };
  // The master's verdict on one route removal.
  enum class RouteVerdict : uint8_t { kGone, kPinned, kUnconfirmed, kSole };
  // Removes the members of each cohort that still carry its put_id, each cohort all or none.
  // `attempts` bounds the calls per RemoveRoutes request; `only_if_copied`: only while another
  // live location of each value stays.
  std::vector<Removal> RemoveCohorts(const std::vector<Cohort>& cohorts, int attempts,
                                     bool only_if_copied = false);
  // One RemoveRoutes request, retried at most `attempts` times while uncertain; the verdict of
  // each item (kGone only on a definite answer).
  std::vector<RouteVerdict> RemoveRoutes(const v1::RemoveRoutesRequest& req, int attempts);
  // Evicts `victims` (taken from the hot tier), readmitting what must stay; returns bytes freed
  // (and adds the values freed to `*pages`, when given).
  uint64_t Settle(std::vector<Cohort> victims, bool only_if_copied, uint64_t* pages = nullptr);

  const Options options_;
  MasterRegistration* const registration_;
  MasterApi* const master_;
  KeyIndex* const keys_;
  HotTier<>* const hot_;
  SlotPool* const pool_;
  OwnerCounters* const counters_;
  StopSignal* const stop_;

  Mutex mu_;
  CondVar cv_;
  bool pressure_ ABSL_GUARDED_BY(mu_) = false;

  // Demotion (off while demotions_ is null; both set before the maintenance actor starts).
  ReplicaQueue* demotions_ = nullptr;
  DemotionOptions demotion_;
  PeerApi* peers_ = nullptr;  // one ranking: drops
  Mutex demote_mu_;
  absl::flat_hash_map<uint64_t, Cohort> demoting_ ABSL_GUARDED_BY(demote_mu_);  // by cohort id
  uint64_t demoting_bytes_ ABSL_GUARDED_BY(demote_mu_) = 0;
  std::chrono::steady_clock::time_point demotion_paused_until_ ABSL_GUARDED_BY(demote_mu_);
  std::chrono::milliseconds demotion_backoff_ ABSL_GUARDED_BY(demote_mu_){1000};
  // One ranking: remote_caches whose last drop failed, and until when they are not asked.
  absl::flat_hash_map<std::string, std::chrono::steady_clock::time_point> drop_backoff_
      ABSL_GUARDED_BY(demote_mu_);
  std::atomic<bool> candidates_changed_{false};

  // Round state (the maintenance actor's thread only).
  using Clock = std::chrono::steady_clock;
  Clock::time_point next_fallback_ = Clock::now();
  std::chrono::milliseconds fallback_backoff_ = options_.min_interval;
  Clock::time_point next_watermark_ = Clock::now();
  std::chrono::milliseconds watermark_backoff_ = options_.min_interval;
};

}  // namespace fluxon
