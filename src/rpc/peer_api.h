// PeerApi: what one owner asks another directly, as the asking owner sees it: replica pulls,
// and the drops of the copies it demoted there (docs/replicas.md). Implemented over gRPC by the
// owners' peer service (rpc_grpc/grpc_peer.h), and by test doubles that call a target OwnerCore in
// process.
//
// Contract (every implementation):
// - PullReplicas asks the owner serving the peer service at `peer_address` to pull the items;
//   the answer has one outcome per item, in order. A retry of the same items is idempotent at
//   the target (an identity already held answers PULL_ALREADY_HELD: no second copy, T1).
// - DropCopies asks that owner to drop the named identities it holds (an eviction there: route
//   first, then the slot). Idempotent: an identity no longer held counts as not held.
// - Unavailable or DeadlineExceeded means "outcome unknown": the caller may ask again with the
//   same items; it never assumes nothing was copied.
// - A call ends within `timeout`, or sooner when Cancel() is called (stopping).
#pragma once

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "fluxon/v1/peer.pb.h"

namespace fluxon {

class PeerApi {
 public:
  virtual ~PeerApi() = default;
  virtual absl::StatusOr<v1::PullReplicasReply> PullReplicas(const std::string& peer_address,
                                                             const v1::PullReplicasRequest& r,
                                                             std::chrono::milliseconds timeout) = 0;
  virtual absl::StatusOr<v1::DropCopiesReply> DropCopies(const std::string& peer_address,
                                                         const v1::DropCopiesRequest& r,
                                                         std::chrono::milliseconds timeout) = 0;
  // Ends every call in progress (Cancelled) and refuses new ones: the owner is stopping.
  virtual void Cancel() = 0;
};

}  // namespace fluxon
