// GetPath: the prefix-restore path (design §6) on one owner: classify each key of a batch, pin
// what is resident, lead or join the lookups of the rest, compute the prefix, and hand the
// transferable prefix to a handle (GetStart); then consume, cancel or release it.
//
// Invariants:
// - G1–G3: each key is classified with one O(1) shard section: LocalJoin (pin the resident
//   holder now), InflightJoin (join the key's shared op) or Leader (install the key's op
//   atomically); every pin and marker exists before the batch's one master Lookup (G2, G8).
// - G6/G7: a key has at most one leader on this owner; joiners see its terminal state and its
//   canonical holder. A route to this owner's own generation is taken only with the same put_id
//   (T2); leaders routed to other owners are fetched together by the RemoteFetcher (one
//   BatchGetStart, one read per source peer, one Done/Revoke; G8) before the prefix is computed,
//   and their joiners share the installed copy. Without a data plane they are misses.
// - G4/G5: hits are scattered back to their indices before the prefix is computed over the
//   caller's groups; everything past transferable_len is released inside GetStart.
// - Deferred (the design's OwnerRpc branch, when the caller allows it and prefetch workers run):
//   the leaders routed to other owners count as hits and GetStart answers at once; their fetch
//   is queued in chunks (in key order, about prefetch_chunk_bytes each; by default one) for the
//   workers, which finish each leader's op as its chunk ends, so get_transfer waits only for the
//   chunks of the consumed prefix. A batch whose chunks do not all fit the bounded queue is fetched
//   before the answer, as without deferral. Every queued chunk ends once: fetched, or (stopping) a
//   miss. A key that joins another get's op waits only until that leader knows where the value
//   is: one being fetched from another owner counts the same way (its handle waits for the op's
//   terminal holder at get_transfer, G7).
#pragma once

#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/batch.h"
#include "common/mutex.h"
#include "common/stop_signal.h"
#include "owner/handle_table.h"
#include "owner/hot_tier.h"
#include "owner/key_index.h"
#include "owner/master_registration.h"
#include "owner/owner_counters.h"
#include "owner/publisher.h"
#include "owner/remote_fetcher.h"
#include "owner/single_flight.h"
#include "rpc/master_api.h"

namespace fluxon {

class GetPath {
 public:
  struct Options {
    std::chrono::milliseconds join_timeout{10'000};
    // Threads that run RunPrefetches (the owner starts them); 0: no batch is deferred.
    uint32_t prefetch_workers = 0;
    // How long get_transfer waits for a deferred value: the fetch's own bound and a margin.
    std::chrono::milliseconds transfer_wait{12'000};
    // A deferred batch's remote values are fetched in chunks of about this many bytes (each
    // chunk one BatchGetStart, one read per source, one BatchGetDone); 0: the whole batch as one
    // (G8: one BatchGetStart per batch).
    uint64_t prefetch_chunk_bytes = 0;
  };
  // Chunks queued for the prefetch workers at most (a batch is queued whole or not at all).
  static constexpr size_t kMaxQueuedChunks = 1024;

  GetPath(Options options, const MasterRegistration* registration, MasterApi* master,
          KeyIndex* keys, SingleFlight* flights, HandleTable* handles, HotTier<>* hot,
          OwnerCounters* counters, EvictionSignals* signals, RemoteFetcher* remote,
          StopSignal* stop)
      : options_(options),
        registration_(registration),
        master_(master),
        keys_(keys),
        flights_(flights),
        handles_(handles),
        hot_(hot),
        counters_(counters),
        signals_(signals),
        remote_(remote),
        stop_(stop) {}
  ~GetPath();

  // `allow_deferred`: the answer may come before the values on other owners are fetched
  // (outcome.deferred; offsets then come with Transfer). `defer_prefetch_wake`: the fetch is
  // queued without waking a worker, and the caller calls WakePrefetches once its answer is out
  // (a worker woken at once can take the core from the thread writing the answer); a worker
  // finds it within its 100 ms poll even without the wake.
  absl::StatusOr<GetStartOutcome> Start(uint64_t client_id, const std::vector<std::string>& keys,
                                        const std::vector<uint32_t>& group_lens,
                                        bool prefix_best_effort, bool allow_deferred = false,
                                        bool defer_prefetch_wake = false);
  // Wakes the prefetch workers if a Start queued a fetch without waking them.
  void WakePrefetches();
  // `located` (may be null) gets the consumed values' places when the handle was deferred.
  absl::Status Transfer(uint64_t client_id, uint64_t handle_id, uint32_t consume_prefix_len,
                        std::vector<HandleTable::Located>* located = nullptr);
  absl::Status Cancel(uint64_t client_id, uint64_t handle_id);
  absl::Status Release(uint64_t client_id, uint64_t handle_id);
  // Handles past handle_ttl and views past view_lease; returns how many were dropped.
  size_t ExpireDue(std::chrono::steady_clock::time_point now);
  size_t DropSession(uint64_t client_id);
  // Peers read these values of this owner (the master's hints): each read is one access of the
  // cohorts it found here, as a local restore of the same prefix would be. Values not here (or
  // of another put_id) are skipped.
  void NotePeerReads(const google::protobuf::RepeatedPtrField<v1::PeerRead>& reads);
  // One prefetch worker: fetches queued chunks until the owner stops; the chunks still queued
  // then end as misses.
  void RunPrefetches();
  // Wakes the prefetch workers (after stop).
  void InterruptPrefetches();

 private:
  // A deferred batch's leaders fetched together, and their ops (finished when the fetch ends).
  struct PrefetchChunk {
    std::vector<RemoteLeader> leaders;
    std::vector<std::shared_ptr<SharedGetOp>> ops;
  };
  // Holds every key of the batch it can (G1: a local pin, a lookup it leads, or a flight it
  // joins); fills held/cohort_of and the outcome's classification counts. With `defer`, the
  // leaders routed elsewhere may be queued instead (`deferred`: their indices and ops).
  struct Deferral {
    bool allowed = false;     // leaders routed elsewhere may be queued
    bool wake_later = false;  // queued without waking a worker (WakePrefetches follows)
  };
  void HoldKeys(const std::vector<std::string>& keys, GetStartOutcome* out,
                std::vector<HolderRef>& held, std::vector<uint64_t>& cohort_of, Deferral defer,
                std::vector<HandleTable::Pending>* deferred);
  // Opens the handle over the first `t` keys (t > 0) and fills the outcome's offsets (none
  // when `deferred` names values of the prefix).
  void OpenPrefix(uint64_t client_id, const std::vector<uint32_t>& group_lens,
                  const std::vector<uint64_t>& cohort_of, uint32_t t, std::vector<HolderRef> held,
                  std::vector<HandleTable::Pending> deferred, GetStartOutcome* out);
  // The batch's leaders, looked up at the master in one call (G8); fills held/cohort_of, or
  // queues the remote ones (see HoldKeys).
  void LookupLeaders(const std::vector<std::string>& keys,
                     std::vector<std::shared_ptr<SharedGetOp>>& led, std::vector<HolderRef>& held,
                     std::vector<uint64_t>& cohort_of, Deferral defer,
                     std::vector<HandleTable::Pending>* deferred);
  // Queues every chunk, or none (false) when the queue has no room for all of them; wakes the
  // workers unless `wake_later`.
  bool QueuePrefetch(std::vector<PrefetchChunk> chunks, bool wake_later);
  // Ends a chunk's ops: with what was fetched (`fetch`), or as misses.
  void EndChunk(PrefetchChunk& chunk, bool fetch);
  // Pins were dropped: eviction candidates changed.
  absl::Status Changed(absl::Status s) {
    signals_->CandidatesChanged();
    return s;
  }

  const Options options_;
  const MasterRegistration* const registration_;
  MasterApi* const master_;
  KeyIndex* const keys_;
  SingleFlight* const flights_;
  HandleTable* const handles_;
  HotTier<>* const hot_;
  OwnerCounters* const counters_;
  EvictionSignals* const signals_;
  RemoteFetcher* const remote_;
  StopSignal* const stop_;

  Mutex prefetch_mu_;
  CondVar prefetch_cv_;
  std::deque<PrefetchChunk> prefetch_queue_ ABSL_GUARDED_BY(prefetch_mu_);
  bool prefetch_wake_owed_ ABSL_GUARDED_BY(prefetch_mu_) = false;
};

}  // namespace fluxon
