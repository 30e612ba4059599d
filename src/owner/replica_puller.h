// ReplicaPuller: the target's side of a replica (docs/replicas.md). Another owner names exact
// value identities (key, put_id, version); this owner pulls each through the remote-get path
// (RemoteFetcher): the master pins a live location of exactly that identity (BatchGetStart),
// the data plane's authenticated one-sided READ copies it into a slot claimed here, the copy is
// installed Committed and the master adds it to the route as another location of the same
// identity (BatchGetDone). Nobody writes into this owner's segment but this owner.
//
// Invariants:
// - A pull copies only the named identity: a route naming another (put_id, version) is
//   kObsolete and nothing is installed; a deleted or evicted value (no route) is kSourceGone,
//   and so is one the named source no longer holds, whatever other copies exist.
// - An atomic group's slots are claimed whole: no space for one member is kNoSpace for all.
// - Idempotent (T1): a retried pull of an identity already held here answers kAlreadyHeld and
//   makes no second copy (one location per owner generation).
// - A pull leaves nothing reserved or claimed when it fails (the fetch path's guarantee), and a
//   malformed batch is refused whole before anything is reserved.
// - The copy is an ordinary Committed copy: evicted by this owner's policy, its route location
//   removed exactly (node, generation, put_id) when it goes; it never vetoes the source (S3).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fluxon/v1/peer.pb.h"
#include "owner/key_index.h"
#include "owner/owner_counters.h"
#include "owner/remote_fetcher.h"

namespace fluxon {

// One value to pull: its key and identity, and its length in bytes.
struct PullItem {
  std::string key;
  uint64_t put_id = 0;
  uint64_t version = 0;
  uint64_t len = 0;
  // The location to copy from (generation 0: any live location of the identity) and the atomic
  // group (items sharing a non-zero group are claimed whole; 0: alone).
  uint32_t source_node_id = 0;
  uint64_t source_generation = 0;
  uint32_t group = 0;
};

enum class PullOutcome : uint8_t {
  kCompleted,    // copied, installed and routed here
  kAlreadyHeld,  // this owner already holds this identity (a retry, or an earlier copy)
  kObsolete,     // the key is routed (or held here) with another identity: not copied
  kSourceGone,   // no live location of the identity (deleted, evicted, its owner gone)
  kNoSpace,      // no slot could be claimed here
  kFailed,       // anything else (busy key, failed read, uncertain master): try again later
};
const char* PullOutcomeName(PullOutcome o);
// The peer protocol's forms (proto/fluxon/v1/peer.proto), one mapping each way.
PullItem PullItemFromProto(const v1::PullItem& item);
v1::PullReplicasReply PullReplyOf(const std::vector<PullOutcome>& outcomes);

class ReplicaPuller {
 public:
  ReplicaPuller(KeyIndex* keys, RemoteFetcher* fetcher, OwnerCounters* counters)
      : keys_(keys), fetcher_(fetcher), counters_(counters) {}

  // Pulls every item; one outcome per item. InvalidArgument (nothing done) for a malformed
  // batch: empty, more than kMaxBatchKeys items, an empty or oversized key, a zero or oversized
  // length, a zero put_id, a key named twice, or a group whose items are not consecutive.
  absl::StatusOr<std::vector<PullOutcome>> Pull(const std::vector<PullItem>& items);

 private:
  void Count(PullOutcome o);

  KeyIndex* const keys_;
  RemoteFetcher* const fetcher_;
  OwnerCounters* const counters_;
};

}  // namespace fluxon
