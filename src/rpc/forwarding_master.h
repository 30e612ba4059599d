// ForwardingMaster<Derived>: a MasterApi whose every method is one call of
// Derived::Forward(request, &MasterApi::Method), for the wrappers that treat every master call
// alike (the elected master serving its leadership's core, an owner's client following the
// leader). Derived declares
//   template <typename Reply, typename Request>
//   absl::StatusOr<Reply> Forward(const Request&, absl::StatusOr<Reply> (MasterApi::*)(const
//   Request&));
// and befriends ForwardingMaster<Derived> when it keeps Forward private.
#pragma once

#include "rpc/master_api.h"

namespace fluxon {

template <typename Derived>
class ForwardingMaster : public MasterApi {
 public:
#define FLUXON_FORWARD_MASTER(Method, Req, Reply)                       \
  absl::StatusOr<v1::Reply> Method(const v1::Req& r) override {         \
    return static_cast<Derived*>(this)->Forward(r, &MasterApi::Method); \
  }
  FLUXON_FORWARD_MASTER(RegisterOwner, RegisterOwnerRequest, RegisterOwnerReply)
  FLUXON_FORWARD_MASTER(UnregisterOwner, UnregisterOwnerRequest, UnregisterOwnerReply)
  FLUXON_FORWARD_MASTER(PublishBatch, PublishBatchRequest, PublishBatchReply)
  FLUXON_FORWARD_MASTER(Lookup, LookupRequest, LookupReply)
  FLUXON_FORWARD_MASTER(RemoveRoutes, RemoveRoutesRequest, RemoveRoutesReply)
  FLUXON_FORWARD_MASTER(ListOwners, ListOwnersRequest, ListOwnersReply)
  FLUXON_FORWARD_MASTER(ListKeys, ListKeysRequest, ListKeysReply)
  FLUXON_FORWARD_MASTER(PlaceReplicas, PlaceReplicasRequest, PlaceReplicasReply)
  FLUXON_FORWARD_MASTER(BatchGetStart, BatchGetStartRequest, BatchGetStartReply)
  FLUXON_FORWARD_MASTER(BatchGetDone, BatchGetDoneRequest, BatchGetDoneReply)
  FLUXON_FORWARD_MASTER(BatchGetRevoke, BatchGetRevokeRequest, BatchGetRevokeReply)
#undef FLUXON_FORWARD_MASTER
};

}  // namespace fluxon
