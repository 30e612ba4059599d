// RemoteFetcher: the requester side of a remote get (design §6). A get batch's leaders whose
// route names another owner are fetched here, all of them together:
//
//   reserve each key (Reserved(put_id): no local put or second fetch of it meanwhile)
//   claim one target slot per key (Free -> Prepared)
//   ONE BatchGetStart for the batch (G8), retried with the same request_id while uncertain (T1)
//   ONE data-plane read per source peer (descriptor batching)
//   targets read in time -> Pending (hidden) -> ONE BatchGetDone, retried until certain (T1)
//     GET_DONE: Pending -> Committed, the key becomes a Committed copy in a new cohort of the
//     hot tier (one ranking: the cohort this owner demoted it with, local again), and the holder
//     is the canonical MemoryInfo every joiner shares (G7)
//   everything else -> ONE BatchGetRevoke, retried until acknowledged; then the slot is freed
//
// Invariants:
// - A target slot always has exactly one owner: this batch, then either the key index (a
//   committed copy) or the unfinished list (Done/Revoke still being retried, in the background
//   by the maintenance actor) or the quarantine. It is freed only when the master can no longer
//   publish it: Revoke acknowledged, Done answered "not published", or (quarantine: the
//   BatchGetStart answer was lost, so its get_ids are unknown) the master's in-flight TTL plus
//   a margin has passed since the call.
// - The read of a source is bounded by the master's in-flight TTL measured from before the
//   BatchGetStart (minus a margin): the master's source pin outlives every read that counts, so
//   a source never frees memory under a read that is installed. A read that ends later is
//   revoked and its bytes are never used.
// - Every wait is bounded: by remote_get_timeout for the batch's answer to its client, by the
//   transport's deadline for reads. Background retries stop when the owner stops.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/fault_injector.h"
#include "common/latency_histogram.h"
#include "common/mutex.h"
#include "common/stop_signal.h"
#include "holder/holder.h"
#include "owner/hot_tier.h"
#include "owner/key_index.h"
#include "owner/master_registration.h"
#include "owner/owner_counters.h"
#include "owner/publisher.h"
#include "rpc/master_api.h"
#include "slot/slot_pool.h"

namespace fluxon {
namespace transport {
class Transport;
}

// One leader key whose route names another owner.
struct RemoteLeader {
  std::string key;
  uint64_t put_id = 0;
  uint64_t len = 0;
  uint64_t version = 0;  // with put_id, the identity looked up (T2)
  // Only this location may be the source (generation 0: any live one), and the atomic group
  // the key is claimed with (0: the key alone): see GetStartItem and PullItem.
  uint32_t source_node_id = 0;
  uint64_t source_generation = 0;
  uint32_t group = 0;
};

// Why a leader was not fetched (kNone: it was).
enum class FetchMiss : uint8_t {
  kNone,
  kBusy,          // the key is reserved here already (a put, or another fetch of it)
  kNoSpace,       // no slot could be claimed within the fetch's bound
  kGone,          // the master routes no live location of the key
  kObsolete,      // the route names another identity (put_id, version)
  kAlreadyLocal,  // the master already routes a location of this identity on this owner
  kFailed,        // the start, the read or the done did not complete
};
const char* FetchMissName(FetchMiss m);

class RemoteFetcher {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::chrono::milliseconds timeout{10'000};  // remote_get_timeout
  };
  RemoteFetcher(Options options, MasterRegistration* registration, MasterApi* master,
                SlotPool* pool, KeyIndex* keys, HotTier<>* hot, Publisher* publisher,
                OwnerCounters* counters, EvictionSignals* signals, transport::Transport* transport,
                FaultInjector* faults, StopSignal* stop);
  ~RemoteFetcher();

  bool enabled() const { return transport_ != nullptr; }
  // Fetches every leader; returns one holder per leader (empty: miss) and its cohort, and (when
  // `misses` is given) why each leader was missed. `replica`: the copies are replicas a source
  // asked for (the master counts them apart), not a client's get.
  std::vector<HolderRef> Fetch(const std::vector<RemoteLeader>& leaders,
                               std::vector<uint64_t>* cohorts,
                               std::vector<FetchMiss>* misses = nullptr, bool replica = false);
  // Frees quarantined targets whose time has come and retries unfinished Done/Revoke calls.
  void RunMaintenance(Clock::time_point now);

  // Per-source-peer read latency (one histogram per source node).
  std::map<uint32_t, LatencyHistogram::Snapshot> PeerLatency() const;

 private:
  struct Target;  // one key's fetch: reservation, slot, get_id, source, holder
  struct Unfinished;
  struct Pending;
  // Fetch's phases, in order:
  // Reserves each leader's key and claims its target slot; the targets that got both.
  // Leaders that got neither are marked in `misses` (kBusy, kNoSpace).
  std::vector<std::unique_ptr<Target>> ReserveAndClaim(const std::vector<RemoteLeader>& leaders,
                                                       Clock::time_point deadline,
                                                       std::vector<FetchMiss>* misses);
  // One BatchGetStart (G8, retried with its request_id while uncertain, T1): the targets whose
  // get started go to `started`, those started with an answer not to be trusted to `revoke`;
  // the rest are freed or quarantined. False when no get can have started usably.
  bool StartGets(std::vector<std::unique_ptr<Target>>& targets, Clock::time_point deadline,
                 std::chrono::milliseconds ttl, bool replica, std::vector<Target*>* started,
                 std::vector<Target*>* revoke);
  // A quarantined target gives up its key's reservation (its slot stays claimed).
  void UnreserveForQuarantine(Target& t);
  // Targets read in time become hidden Pending slots (`done`); the others go to `revoke`.
  void HideReads(std::vector<Target*>& started, std::vector<Target*>* done,
                 std::vector<Target*>* revoke);
  // Scatters installed copies to their leaders' indices and hands unresolved targets to the
  // background retries; returns the hits.
  uint32_t Collect(std::vector<std::unique_ptr<Target>>& targets, std::vector<HolderRef>* out,
                   std::vector<uint64_t>* cohorts);
  // Transfers the started targets, one read batch per source peer.
  void ReadAll(std::vector<Target*>& started, Clock::time_point read_deadline);
  // Done for `done`, Revoke for `revoke`; what stays uncertain goes to the unfinished list.
  void Finish(std::vector<Target*>& done, std::vector<Target*>& revoke, Clock::time_point until);
  // One Done/Revoke round for `u`; true when it is resolved (certainly).
  bool TryDone(std::vector<Target*>& items, Clock::time_point until, bool background);
  bool TryRevoke(std::vector<Target*>& items, Clock::time_point until);
  void Install(Target& t, std::map<uint64_t, Cohort>* cohorts);
  void Free(Target& t);
  void Quarantine(std::vector<std::unique_ptr<Target>> targets, Clock::time_point until);
  uint64_t NextRequestId();

  const Options options_;
  MasterRegistration* const registration_;
  MasterApi* const master_;
  SlotPool* const pool_;
  KeyIndex* const keys_;
  HotTier<>* const hot_;
  Publisher* const publisher_;
  OwnerCounters* const counters_;
  EvictionSignals* const signals_;
  transport::Transport* const transport_;
  FaultInjector* const faults_;
  StopSignal* const stop_;

  std::atomic<uint64_t> next_request_{0};
  const uint64_t request_base_;

  mutable Mutex mu_;
  struct Quarantined {
    std::vector<std::unique_ptr<Target>> targets;
    Clock::time_point until;
  };
  std::vector<Quarantined> quarantine_ ABSL_GUARDED_BY(mu_);
  struct Pending {
    std::vector<std::unique_ptr<Target>> targets;
    bool done = false;  // true: retry BatchGetDone; false: retry BatchGetRevoke
  };
  std::vector<Pending> unfinished_ ABSL_GUARDED_BY(mu_);
  Clock::time_point next_unfinished_retry_ ABSL_GUARDED_BY(mu_);
  std::chrono::milliseconds unfinished_backoff_ ABSL_GUARDED_BY(mu_){25};
  std::map<uint32_t, std::unique_ptr<LatencyHistogram>> peer_latency_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fluxon
