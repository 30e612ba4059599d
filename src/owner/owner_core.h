// OwnerCore: the owner's control logic on top of its memory — a facade that assembles the parts
// and owns their threads. Each part owns its state (dependencies point one way, down this list):
//   KeyIndex (per-key state machine) <- SingleFlight, HandleTable <- Publisher (publish actor)
//   <- PutPath (reserve, commit, abort) ; GetPath (classify, pin, prefix, handles) ; Evictor
//   (capacity eviction, delete by prefix) ; MasterRegistration (register, heartbeat) ;
//   RemoteFetcher (remote get: BatchGetStart, one read per source peer, Done/Revoke).
// The invariants below are the parts' together; each part's header states its own.
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
//   (master restarted) re-registers and retries instead of failing forever; an owner the master
//   expired registers again under a new generation. Either way (a new master epoch, a new
//   generation) the Republisher restores the route of every committed value (soft state).
//   Stop gives the node_id back (UnregisterOwner).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/batch.h"
#include "common/stop_signal.h"
#include "config/config.h"
#include "owner/evictor.h"
#include "owner/get_path.h"
#include "owner/handle_table.h"
#include "owner/hot_tier.h"
#include "owner/key_index.h"
#include "owner/master_registration.h"
#include "owner/owner_counters.h"
#include "owner/owner_memory.h"
#include "owner/publisher.h"
#include "owner/put_path.h"
#include "owner/remote_fetcher.h"
#include "owner/replica_puller.h"
#include "owner/replica_queue.h"
#include "owner/republisher.h"
#include "owner/single_flight.h"
#include "rpc/master_api.h"

namespace fluxon {

// What an owner learns from the process that runs it rather than from its config section: its
// identity and the data plane the node bound. Every setting comes from OwnerConfig, whose one
// definition is config/settings.h; OwnerCore::Create builds each part's options from it.
struct OwnerRuntime {
  uint32_t node_id = 0;
  Role role = Role::kEmbedded;
  // The data-plane endpoint this owner serves (registered with the master; empty: none) and the
  // transport it reads other owners' values with (remote get); null: routes on other owners are
  // misses. Not owned; must outlive the core's threads.
  std::string data_address;
  transport::Transport* data_plane = nullptr;
  // Fault points of the data plane ("peer.read"); not owned, may be null.
  FaultInjector* faults = nullptr;
  // The owners' peer service as a client (replica pulls this owner asks targets for); not
  // owned, must outlive the core's threads. Null: replica tasks end failed.
  PeerApi* peers = nullptr;
  // How often the maintenance actor runs when nothing wakes it (expiry, shrink, eviction
  // rounds). Not a setting: tests shorten it.
  std::chrono::milliseconds maintenance_interval{50};
};

class OwnerCore {
 public:
  static absl::StatusOr<std::unique_ptr<OwnerCore>> Create(const OwnerConfig& config,
                                                           MasterApi* master, OwnerRuntime runtime);
  ~OwnerCore();
  OwnerCore(const OwnerCore&) = delete;
  OwnerCore& operator=(const OwnerCore&) = delete;

  // Registers with the master and starts the publish, maintenance and heartbeat actors.
  absl::Status Start();
  // Makes every wait (claims, commit backpressure, retries) end at once and refuses new work;
  // Stop joins the actors afterwards. Call before stopping the servers that call into the core.
  void BeginStop();
  void Stop();

  uint64_t NewClientId() { return next_client_id_.fetch_add(1); }
  // A client session ended: its prepared puts are aborted, its handles and views released.
  void DisconnectClient(uint64_t client_id);

  absl::StatusOr<PutStartOutcome> PutStart(uint64_t client_id, PutStartArgs args,
                                           std::vector<uint32_t>* conflict_indices) {
    return puts_->Start(client_id, std::move(args), conflict_indices);
  }
  // With `defer_publish_wake`, the publish actor is not woken until WakePublisher(): a socket
  // server answers the client first, so the woken actor does not preempt the answer.
  absl::Status PutCommit(uint64_t client_id, uint64_t put_id, PutDoneCallback done,
                         bool defer_publish_wake = false) {
    return puts_->Commit(client_id, put_id, std::move(done), defer_publish_wake);
  }
  void WakePublisher() { publisher_->Wake(); }
  absl::Status PutAbort(uint64_t client_id, uint64_t put_id) {
    return puts_->Abort(client_id, put_id);
  }

  absl::StatusOr<GetStartOutcome> GetStart(uint64_t client_id, const std::vector<std::string>& keys,
                                           const std::vector<uint32_t>& group_lens,
                                           bool prefix_best_effort, bool allow_deferred = false,
                                           bool defer_prefetch_wake = false) {
    return gets_->Start(client_id, keys, group_lens, prefix_best_effort, allow_deferred,
                        defer_prefetch_wake);
  }
  // After the answer of a GetStart that deferred its prefetch wake (GetPath::Start).
  void WakePrefetches() { gets_->WakePrefetches(); }
  // How long a get plan's views stay pinned unless released (view_lease).
  std::chrono::milliseconds view_lease() const { return config_.view_lease; }
  absl::Status GetTransfer(uint64_t client_id, uint64_t handle_id, uint32_t consume_prefix_len,
                           std::vector<HandleTable::Located>* located = nullptr) {
    return gets_->Transfer(client_id, handle_id, consume_prefix_len, located);
  }
  absl::Status CancelGet(uint64_t client_id, uint64_t handle_id) {
    return gets_->Cancel(client_id, handle_id);
  }
  absl::Status ReleaseViews(uint64_t client_id, uint64_t handle_id) {
    return gets_->Release(client_id, handle_id);
  }

  // Evicts cold cohorts worth at least `bytes` (or all evictable ones); returns bytes evicted.
  uint64_t EvictSome(uint64_t bytes) { return evictor_->EvictSome(bytes); }
  // Removes every committed, unpinned value whose key starts with `prefix` (non-empty), the same
  // way eviction does (S2: routes removed at the master before slots are released). Puts that
  // completed before the call are published asynchronously; the delete first waits (up to
  // kDeleteWaitsForPublish) for every batch queued so far, so a value its writer has just put is
  // deleted, not kept as not yet committed.
  static constexpr std::chrono::milliseconds kDeleteWaitsForPublish{5'000};
  absl::StatusOr<DeleteOutcome> DeletePrefix(const std::string& prefix) {
    publisher_->WaitQueuedSettled(std::chrono::steady_clock::now() + kDeleteWaitsForPublish);
    return evictor_->DeletePrefix(prefix);
  }

  // Replicas by pull: copies exact identities here through the remote-get path.
  absl::StatusOr<std::vector<PullOutcome>> PullReplicas(const std::vector<PullItem>& items) {
    return puller_->Pull(items);
  }
  // Drops the copies an owner demoted here and its policy evicted (one ranking). Only a
  // remote_cache holds demoted copies (placement puts demotions nowhere else), so only a
  // remote_cache drops on request: an owner's own values are its own to evict.
  absl::StatusOr<v1::DropCopiesReply> DropCopies(const v1::DropCopiesRequest& req) {
    if (runtime_.role != Role::kRemoteCache) {
      return absl::FailedPreconditionError(
          "DropCopies is served by remote_cache nodes only (they hold the demoted copies)");
    }
    return evictor_->DropCopies(req);
  }
  // Where this owner serves the peer service (registered with the master; sources send their
  // PullReplicas there). Set before Start; empty: it takes no replicas.
  void SetPeerAddress(std::string address) { registration_->SetPeerAddress(std::move(address)); }
  // True when no replica task of this owner's puts is queued or in progress.
  bool replicas_idle() const { return replicas_->idle(); }

  // Remote-get read latency per source node.
  std::map<uint32_t, LatencyHistogram::Snapshot> RemoteReadLatency() const {
    return remote_->PeerLatency();
  }
  // The typed counters (their one definition: owner_counters.h).
  const OwnerCounters& counters() const { return *counters_; }
  // Every counter and derived gauge by name (the client protocol's and fluxonctl's stats).
  std::map<std::string, int64_t> Stats() const;
  // This owner's memory as the master sees it (sent with every registration and heartbeat).
  v1::OwnerCapacity Capacity() const;
  // The owner's view of one key: "absent", "reserved", "local_visible", "committed", "evicting".
  std::string KeyState(const std::string& key) const { return keys_->StateName(key); }

  OwnerMemory& memory() { return *memory_; }
  // The segment's generation (what clients attach with; fixed for the process's life).
  uint64_t generation() const { return memory_->segment().generation(); }
  // The generation the master knows this owner by: the segment's at start, a new one after the
  // master expired this owner (MasterRegistration). Routes and data-plane reads carry it.
  uint64_t registration_generation() const { return registration_->generation(); }
  bool registered_with_master() const { return registration_->registered(); }
  // Called with a new registration generation before the owner registers under it (the node
  // points its data plane at it). Set before Start.
  void SetGenerationListener(MasterRegistration::GenerationListener l) {
    registration_->SetGenerationListener(std::move(l));
  }
  uint32_t node_id() const { return runtime_.node_id; }

 private:
  OwnerCore(const OwnerConfig& config, OwnerRuntime runtime);
  void MaintenanceLoop();
  void PrefaultLoop();

  const OwnerConfig config_;
  const OwnerRuntime runtime_;
  // Declaration order is destruction order reversed: memory outlives every holder of it.
  std::unique_ptr<OwnerMemory> memory_;
  std::unique_ptr<OwnerCounters> counters_;
  StopSignal stop_;
  std::unique_ptr<MasterRegistration> registration_;
  std::unique_ptr<KeyIndex> keys_;
  std::unique_ptr<HotTier<>> hot_;
  std::unique_ptr<SingleFlight> flights_;
  std::unique_ptr<HandleTable> handles_;
  std::unique_ptr<Evictor> evictor_;
  std::unique_ptr<WriteThroughTracker> write_through_;  // null: no other node to copy to
  std::unique_ptr<ReplicaQueue> replicas_;
  std::unique_ptr<Publisher> publisher_;
  std::unique_ptr<PutPath> puts_;
  std::unique_ptr<Republisher> republisher_;
  std::unique_ptr<RemoteFetcher> remote_;
  std::unique_ptr<ReplicaPuller> puller_;
  std::unique_ptr<GetPath> gets_;

  std::atomic<uint64_t> next_client_id_{1};
  std::vector<std::thread> threads_;
  bool started_ = false;
};

}  // namespace fluxon
