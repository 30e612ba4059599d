// OwnerCore: the owner's control logic on top of its memory: the hostless put path (reserve,
// commit local-visible, background publish), the get path (classify, pin, prefix, handles), the
// publish job actor, the capacity-eviction actor and the handle TTL sweeper.
//
// Invariants:
// - V1: PutCommit makes every value of the batch locally readable (pinnable by GetStart) before
//   it returns, without waiting for the master.
// - V2/V3: a value becomes Committed (route live) and enters the hot tier only after the master
//   published its route; the batch's PutDone callback runs after that.
// - A1/A2: one publish job owns a whole committed batch and sends one PublishBatch; an uncertain
//   outcome is retried with the same identity (25 ms .. 1 s backoff) until it resolves; only a
//   definite rejection (never published) drops the local values. Cohorts (one atomic group of one
//   batch) are admitted to the hot tier together.
// - G1-G3, G6, G7 (single owner): GetStart splits the batch per key into LocalJoin (pin the
//   resident holder now), InflightJoin (join the key's shared op) and Leader (install the key's
//   marker atomically); all pins and markers exist before the one Lookup of the batch's leaders
//   (G2, G8); a key has at most one leader; joiners see the leader's terminal state and holder.
// - G4/G5: hits are scattered back to their indices before the prefix is computed over the
//   original groups; everything past transferable_len is released inside GetStart.
// - G10: every key-table critical section is one shard lock for O(1) work; no lock is held across
//   a master call, a claim wait or while holders are dropped.
// - Capacity eviction evicts whole cohorts of Committed values that nothing pins, removes their
//   routes at the master before releasing their slots (S2), retries route removal with the same
//   identity (T1), backs off when nothing is evictable, and never changes the configured
//   capacity (S5). A put that cannot get slots fails with ResourceExhausted after the claim's hard
//   timeout.
// - Handles not consumed within handle_ttl are dropped by the same path as cancel; prepared puts
//   not committed or aborted within put_lease are aborted by the abort path; views not released
//   within view_lease are released by the release path. A client's prepared puts, handles and
//   views are released when its session ends. So a stopped or dead client pins nothing forever.
// - A commit consumes its put: if it cannot be queued for publish (the bounded queue stayed full
//   for commit_wait_timeout, or the owner is stopping) the put is aborted and nothing stays
//   reserved. No wait in the owner is unbounded, and every wait ends when the owner stops.
// - The owner heartbeats the master (re-registration of its own identity) every
//   heartbeat_interval; a publish refused because the master does not know this generation
//   (master restarted) re-registers and retries instead of failing forever. Stop gives the
//   node_id back (UnregisterOwner).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/fault_injector.h"
#include "common/mutex.h"
#include "common/sharded_table.h"
#include "fluxon/batch.h"
#include "fluxon/config.h"
#include "master/master_api.h"
#include "owner/hot_tier.h"
#include "owner/owner_memory.h"
#include "route/key_control_table.h"

namespace fluxon {

struct PutStartArgs {
  std::vector<std::string> keys;
  int64_t value_len = 0;
  bool reject_if_inflight_same_key = true;
  bool reject_if_exist_same_key = true;
  bool write_through = false;
  bool make_replica_task = false;
  std::vector<bool> make_replica_task_mask;
  std::vector<uint32_t> atomic_group_lens;
  std::string lease_id;
  std::string parent_key;  // eviction-order hint; empty: unknown
};

struct DeleteOutcome {
  uint64_t deleted = 0;         // values removed (route first, then slot)
  uint64_t skipped_in_use = 0;  // values pinned by a reader or not committed yet
};

struct PutStartOutcome {
  uint64_t put_id = 0;
  std::vector<uint64_t> offsets;
  std::vector<uint32_t> conflict_indices;  // non-empty only with an AlreadyExists status
};

struct GetStartOutcome {
  PrefixResult prefix;
  uint64_t handle_id = 0;
  std::vector<uint64_t> offsets;  // transferable prefix
  std::vector<uint64_t> lens;
  uint32_t local_pinned = 0;
  uint32_t inflight_joined = 0;
  uint32_t leader_started = 0;
};

using PutDoneCallback = std::function<void(const absl::Status&)>;

struct OwnerOptions {
  uint32_t node_id = 0;
  std::string role = "embedded";
  double hot_capacity_ratio = 0.95;
  uint64_t evict_max_bytes_per_round = 256ull << 20;
  std::chrono::milliseconds evict_min_interval{200};
  std::chrono::milliseconds handle_ttl{30'000};
  std::chrono::milliseconds put_lease{60'000};
  std::chrono::milliseconds view_lease{300'000};
  std::chrono::milliseconds commit_wait_timeout{30'000};
  std::chrono::milliseconds heartbeat_interval{1'000};
  // How long Start keeps retrying a registration refused because the node_id's previous owner
  // is still within its lease (a restart after kill -9).
  std::chrono::milliseconds register_timeout{30'000};
  std::chrono::milliseconds join_timeout{5'000};
  std::chrono::milliseconds maintenance_interval{50};
  size_t publish_queue_capacity = 512;
};

class OwnerCore {
 public:
  static absl::StatusOr<std::unique_ptr<OwnerCore>> Create(const OwnerConfig& config,
                                                           MasterApi* master, OwnerOptions options);
  ~OwnerCore();
  OwnerCore(const OwnerCore&) = delete;
  OwnerCore& operator=(const OwnerCore&) = delete;

  // Registers with the master and starts the publish, eviction, maintenance and heartbeat actors.
  absl::Status Start();
  // Makes every wait (claims, commit backpressure, retries) end at once and refuses new work;
  // Stop joins the actors afterwards. Call before stopping the servers that call into the core.
  void BeginStop();
  void Stop();

  uint64_t NewClientId() { return next_client_id_.fetch_add(1); }
  void DisconnectClient(uint64_t client_id);

  absl::StatusOr<PutStartOutcome> PutStart(uint64_t client_id, const PutStartArgs& args,
                                           std::vector<uint32_t>* conflict_indices);
  // With `defer_publish_wake`, the publish actor is not woken until WakePublisher(): a socket
  // server answers the client first, so the woken actor does not preempt the answer.
  absl::Status PutCommit(uint64_t client_id, uint64_t put_id, PutDoneCallback done,
                         bool defer_publish_wake = false);
  void WakePublisher();
  absl::Status PutAbort(uint64_t client_id, uint64_t put_id);

  absl::StatusOr<GetStartOutcome> GetStart(uint64_t client_id, const std::vector<std::string>& keys,
                                           const std::vector<uint32_t>& group_lens,
                                           bool prefix_best_effort);
  absl::Status GetTransfer(uint64_t client_id, uint64_t handle_id, uint32_t consume_prefix_len);
  absl::Status CancelGet(uint64_t client_id, uint64_t handle_id);
  absl::Status ReleaseViews(uint64_t client_id, uint64_t handle_id);

  // Evicts cold cohorts worth at least `bytes` (or all evictable ones); returns bytes evicted.
  uint64_t EvictSome(uint64_t bytes);
  // Removes every committed, unpinned value whose key starts with `prefix` (non-empty), the same
  // way eviction does (S2: routes removed at the master before slots are released).
  absl::StatusOr<DeleteOutcome> DeletePrefix(const std::string& prefix);

  std::map<std::string, int64_t> Stats() const;
  // The owner's view of one key: "absent", "reserved", "local_visible", "committed", "evicting".
  std::string KeyState(const std::string& key) const;

  OwnerMemory& memory() { return *memory_; }
  uint64_t generation() const { return memory_->segment().generation(); }
  uint32_t node_id() const { return options_.node_id; }

 private:
  struct KeyEntry;
  struct PutBatch;
  struct GetHandle;
  struct SharedGetOp;
  struct PublishJob;
  struct Counters;

  OwnerCore(MasterApi* master, OwnerOptions options);
  // Removes a prepared put of `client_id` from the table (commit and abort both consume it).
  absl::StatusOr<std::shared_ptr<PutBatch>> TakePreparedBatch(uint64_t client_id, uint64_t put_id);
  void PublishLoop();
  absl::Status PublishOne(PublishJob& job);  // the batch's outcome for its PutDone
  void MaintenanceLoop();
  void SignalPressure();
  struct EvictionNeed {
    uint64_t over_watermark = 0;  // used bytes above hot_capacity_ratio of the capacity
    uint64_t deficit = 0;         // bytes waiting claims lack when the pool cannot grow
  };
  EvictionNeed MeasureEvictionNeed() const;
  // Drops handles past their TTL, views past view_lease and prepared puts past put_lease.
  void ExpireLeases();
  // RegisterOwner with this owner's identity (also the heartbeat).
  absl::Status RegisterWithMaster();
  void HeartbeatLoop();
  bool stop_requested() const { return stop_requested_.load(std::memory_order_acquire); }
  void DropHandle(std::shared_ptr<GetHandle> handle);
  // Sleeps up to `d`; returns false when the owner is stopping.
  bool SleepUnlessStopping(std::chrono::milliseconds d);
  // Keys per RemoveRoutes call when eviction or a delete removes many (bounds one message).
  static constexpr size_t kRouteRemoveBatch = 4096;
  enum class RemoveResult { kRemoved, kInUse, kGone };
  struct Removal {
    RemoveResult result = RemoveResult::kGone;
    uint64_t pages = 0;  // values freed
  };
  // Removes the members of each cohort that still carry its put_id, each cohort all or none
  // (kInUse, nothing changed, if a member is pinned or not committed). The routes of all of
  // them go to the master together, in RemoveRoutes calls of at most kRouteRemoveBatch keys,
  // before any slot is released (S2). Empty when the owner stopped meanwhile.
  std::vector<Removal> RemoveCohorts(const std::vector<Cohort>& cohorts);
  // False when the owner stopped while retrying an uncertain outcome.
  bool RemoveRoutesWithRetry(const v1::RemoveRoutesRequest& req);

  MasterApi* const master_;
  const OwnerOptions options_;
  std::unique_ptr<OwnerMemory> memory_;

  KeyControlTable<std::shared_ptr<KeyEntry>> keys_;
  KeyControlTable<std::shared_ptr<SharedGetOp>> inflight_gets_;
  ShardedTable<uint64_t, std::shared_ptr<PutBatch>, 16> puts_;
  ShardedTable<uint64_t, std::shared_ptr<GetHandle>, 64> handles_;
  HotTier<> hot_;

  std::atomic<uint64_t> next_put_id_{1};
  std::atomic<uint64_t> next_handle_id_{1};
  std::atomic<uint64_t> next_client_id_{1};
  std::atomic<uint64_t> next_cohort_id_{1};

  mutable Mutex publish_mu_;
  CondVar publish_cv_;
  std::deque<std::unique_ptr<PublishJob>> publish_queue_ ABSL_GUARDED_BY(publish_mu_);
  size_t publish_in_flight_ ABSL_GUARDED_BY(publish_mu_) = 0;
  // Queue places taken by commits between their backpressure wait and their push.
  size_t publish_reserved_ ABSL_GUARDED_BY(publish_mu_) = 0;
  std::atomic<bool> stop_requested_{false};

  mutable Mutex actor_mu_;
  CondVar actor_cv_;
  bool stopping_ ABSL_GUARDED_BY(actor_mu_) = false;
  bool pressure_ ABSL_GUARDED_BY(actor_mu_) = false;
  // Set when pins are dropped or cohorts admitted: candidates changed, so a backed-off eviction
  // may try again at once.
  std::atomic<bool> candidates_changed_{false};

  std::unique_ptr<Counters> counters_;
  std::vector<std::thread> threads_;
  bool started_ = false;
};

}  // namespace fluxon
