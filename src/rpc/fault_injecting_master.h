// FaultInjectingMaster: a MasterApi decorator that applies the FaultInjector's rules at the fault
// points "master.<Method>" (rpc/fault_apply.h says what each action does).
#pragma once

#include "rpc/fault_apply.h"
#include "rpc/master_api.h"

namespace fluxon {

class FaultInjectingMaster final : public MasterApi {
 public:
  FaultInjectingMaster(MasterApi* inner, FaultInjector* faults) : inner_(inner), faults_(faults) {}

  absl::StatusOr<v1::RegisterOwnerReply> RegisterOwner(const v1::RegisterOwnerRequest& r) override {
    return Apply("master.RegisterOwner", [&] { return inner_->RegisterOwner(r); });
  }
  absl::StatusOr<v1::UnregisterOwnerReply> UnregisterOwner(
      const v1::UnregisterOwnerRequest& r) override {
    return Apply("master.UnregisterOwner", [&] { return inner_->UnregisterOwner(r); });
  }
  absl::StatusOr<v1::PublishBatchReply> PublishBatch(const v1::PublishBatchRequest& r) override {
    return Apply("master.PublishBatch", [&] { return inner_->PublishBatch(r); });
  }
  absl::StatusOr<v1::LookupReply> Lookup(const v1::LookupRequest& r) override {
    return Apply("master.Lookup", [&] { return inner_->Lookup(r); });
  }
  absl::StatusOr<v1::RemoveRoutesReply> RemoveRoutes(const v1::RemoveRoutesRequest& r) override {
    return Apply("master.RemoveRoutes", [&] { return inner_->RemoveRoutes(r); });
  }
  absl::StatusOr<v1::ListOwnersReply> ListOwners(const v1::ListOwnersRequest& r) override {
    return inner_->ListOwners(r);
  }
  absl::StatusOr<v1::ListKeysReply> ListKeys(const v1::ListKeysRequest& r) override {
    return inner_->ListKeys(r);
  }
  absl::StatusOr<v1::PlaceReplicasReply> PlaceReplicas(const v1::PlaceReplicasRequest& r) override {
    return Apply("master.PlaceReplicas", [&] { return inner_->PlaceReplicas(r); });
  }
  absl::StatusOr<v1::BatchGetStartReply> BatchGetStart(const v1::BatchGetStartRequest& r) override {
    return Apply("master.BatchGetStart", [&] { return inner_->BatchGetStart(r); });
  }
  absl::StatusOr<v1::BatchGetDoneReply> BatchGetDone(const v1::BatchGetDoneRequest& r) override {
    return Apply("master.BatchGetDone", [&] { return inner_->BatchGetDone(r); });
  }
  absl::StatusOr<v1::BatchGetRevokeReply> BatchGetRevoke(
      const v1::BatchGetRevokeRequest& r) override {
    return Apply("master.BatchGetRevoke", [&] { return inner_->BatchGetRevoke(r); });
  }

 private:
  template <typename Call>
  auto Apply(const char* point, Call call) -> decltype(call()) {
    return ApplyFault(faults_, point, std::move(call));
  }

  MasterApi* const inner_;
  FaultInjector* const faults_;
};

}  // namespace fluxon
