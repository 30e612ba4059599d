// MasterApi: the master's control operations as seen by an owner. Implemented in process by
// MasterCore (embedded role), over gRPC by GrpcMasterClient (separate master), and wrapped by
// FaultInjectingMaster for fault tests. Messages are the proto types of master.proto.
//
// Contract (every implementation):
// - PublishBatch is idempotent by (node_id, generation, put_id): a retry of a batch that was
//   already applied returns PUBLISHED for the same items and changes nothing (T1, A2).
// - RemoveRoutes removes only routes that match key + put_id + the caller's node and generation.
// - Calls from an owner whose generation is not the registered one fail with FailedPrecondition.
// - RegisterOwner of the registered identity is a heartbeat; a new generation for a live owner's
//   node_id fails with AlreadyExists (another process cannot take over a live owner's routes).
// - BatchGetStart pins the source location it answers until the get's Done, Revoke or TTL:
//   RemoveRoutes of a pinned location answers pinned = true and removes nothing.
// - An error of code Unavailable or DeadlineExceeded means "outcome unknown": the caller retries
//   with the same identity, never assumes it failed.
#pragma once

#include "absl/status/statusor.h"
#include "fluxon/v1/master.pb.h"

namespace fluxon {

class MasterApi {
 public:
  virtual ~MasterApi() = default;
  virtual absl::StatusOr<v1::RegisterOwnerReply> RegisterOwner(
      const v1::RegisterOwnerRequest& r) = 0;
  virtual absl::StatusOr<v1::UnregisterOwnerReply> UnregisterOwner(
      const v1::UnregisterOwnerRequest& r) = 0;
  virtual absl::StatusOr<v1::PublishBatchReply> PublishBatch(const v1::PublishBatchRequest& r) = 0;
  virtual absl::StatusOr<v1::LookupReply> Lookup(const v1::LookupRequest& r) = 0;
  virtual absl::StatusOr<v1::RemoveRoutesReply> RemoveRoutes(const v1::RemoveRoutesRequest& r) = 0;
  virtual absl::StatusOr<v1::ListOwnersReply> ListOwners(const v1::ListOwnersRequest& r) = 0;
  virtual absl::StatusOr<v1::ListKeysReply> ListKeys(const v1::ListKeysRequest& r) = 0;
  // Where replicas of a source's atomic groups would go (a preview: reserves nothing).
  virtual absl::StatusOr<v1::PlaceReplicasReply> PlaceReplicas(
      const v1::PlaceReplicasRequest& r) = 0;
  // Remote get (design §6): one call per batch each (G8). BatchGetStart is idempotent by
  // (requester, request_id); Done and Revoke by get_id (T1).
  virtual absl::StatusOr<v1::BatchGetStartReply> BatchGetStart(
      const v1::BatchGetStartRequest& r) = 0;
  virtual absl::StatusOr<v1::BatchGetDoneReply> BatchGetDone(const v1::BatchGetDoneRequest& r) = 0;
  virtual absl::StatusOr<v1::BatchGetRevokeReply> BatchGetRevoke(
      const v1::BatchGetRevokeRequest& r) = 0;
};

inline bool IsUncertain(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

}  // namespace fluxon
