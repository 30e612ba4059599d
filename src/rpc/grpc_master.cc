#include "rpc/grpc_master.h"

#include "fluxon/v1/master.grpc.pb.h"

namespace fluxon {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}
absl::Status FromGrpcStatus(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

namespace {

template <typename Reply>
grpc::Status Answer(const absl::StatusOr<Reply>& r, Reply* out) {
  if (!r.ok()) return ToGrpcStatus(r.status());
  *out = *r;
  return grpc::Status::OK;
}

class GrpcMasterClient final : public MasterApi {
 public:
  GrpcMasterClient(std::shared_ptr<grpc::Channel> channel, std::chrono::milliseconds deadline)
      : stub_(v1::MasterService::NewStub(channel)), deadline_(deadline) {}

#define FLUXON_GRPC_CALL(Method, Req, Reply)                        \
  absl::StatusOr<v1::Reply> Method(const v1::Req& r) override {     \
    grpc::ClientContext ctx;                                        \
    ctx.set_deadline(std::chrono::system_clock::now() + deadline_); \
    v1::Reply reply;                                                \
    grpc::Status s = stub_->Method(&ctx, r, &reply);                \
    if (!s.ok()) return FromGrpcStatus(s);                          \
    return reply;                                                   \
  }
  FLUXON_GRPC_CALL(RegisterOwner, RegisterOwnerRequest, RegisterOwnerReply)
  FLUXON_GRPC_CALL(UnregisterOwner, UnregisterOwnerRequest, UnregisterOwnerReply)
  FLUXON_GRPC_CALL(PublishBatch, PublishBatchRequest, PublishBatchReply)
  FLUXON_GRPC_CALL(Lookup, LookupRequest, LookupReply)
  FLUXON_GRPC_CALL(RemoveRoutes, RemoveRoutesRequest, RemoveRoutesReply)
  FLUXON_GRPC_CALL(ListOwners, ListOwnersRequest, ListOwnersReply)
  FLUXON_GRPC_CALL(ListKeys, ListKeysRequest, ListKeysReply)
  FLUXON_GRPC_CALL(BatchGetStart, BatchGetStartRequest, BatchGetStartReply)
  FLUXON_GRPC_CALL(BatchGetDone, BatchGetDoneRequest, BatchGetDoneReply)
  FLUXON_GRPC_CALL(BatchGetRevoke, BatchGetRevokeRequest, BatchGetRevokeReply)
#undef FLUXON_GRPC_CALL

 private:
  std::unique_ptr<v1::MasterService::Stub> stub_;
  const std::chrono::milliseconds deadline_;
};

class MasterServiceImpl final : public v1::MasterService::Service {
 public:
  explicit MasterServiceImpl(MasterApi* master) : master_(master) {}
  grpc::Status RegisterOwner(grpc::ServerContext*, const v1::RegisterOwnerRequest* r,
                             v1::RegisterOwnerReply* out) override {
    return Answer(master_->RegisterOwner(*r), out);
  }
  grpc::Status UnregisterOwner(grpc::ServerContext*, const v1::UnregisterOwnerRequest* r,
                               v1::UnregisterOwnerReply* out) override {
    return Answer(master_->UnregisterOwner(*r), out);
  }
  grpc::Status PublishBatch(grpc::ServerContext*, const v1::PublishBatchRequest* r,
                            v1::PublishBatchReply* out) override {
    return Answer(master_->PublishBatch(*r), out);
  }
  grpc::Status Lookup(grpc::ServerContext*, const v1::LookupRequest* r,
                      v1::LookupReply* out) override {
    return Answer(master_->Lookup(*r), out);
  }
  grpc::Status RemoveRoutes(grpc::ServerContext*, const v1::RemoveRoutesRequest* r,
                            v1::RemoveRoutesReply* out) override {
    return Answer(master_->RemoveRoutes(*r), out);
  }
  grpc::Status ListOwners(grpc::ServerContext*, const v1::ListOwnersRequest* r,
                          v1::ListOwnersReply* out) override {
    return Answer(master_->ListOwners(*r), out);
  }
  grpc::Status ListKeys(grpc::ServerContext*, const v1::ListKeysRequest* r,
                        v1::ListKeysReply* out) override {
    return Answer(master_->ListKeys(*r), out);
  }
  grpc::Status BatchGetStart(grpc::ServerContext*, const v1::BatchGetStartRequest* r,
                             v1::BatchGetStartReply* out) override {
    return Answer(master_->BatchGetStart(*r), out);
  }
  grpc::Status BatchGetDone(grpc::ServerContext*, const v1::BatchGetDoneRequest* r,
                            v1::BatchGetDoneReply* out) override {
    return Answer(master_->BatchGetDone(*r), out);
  }
  grpc::Status BatchGetRevoke(grpc::ServerContext*, const v1::BatchGetRevokeRequest* r,
                              v1::BatchGetRevokeReply* out) override {
    return Answer(master_->BatchGetRevoke(*r), out);
  }

 private:
  MasterApi* const master_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MasterApi>> MakeGrpcMasterClient(
    const std::string& address, const GrpcSecurity& security, std::chrono::milliseconds deadline) {
  if (address.empty()) return absl::InvalidArgumentError("master address is empty");
  return std::make_unique<GrpcMasterClient>(security.Channel(address), deadline);
}

absl::StatusOr<std::unique_ptr<MasterApi>> MakeGrpcMasterClient(
    const std::string& address, std::chrono::milliseconds deadline) {
  return MakeGrpcMasterClient(address, GrpcSecurity::Plaintext(), deadline);
}

std::unique_ptr<grpc::Service> MakeMasterGrpcService(MasterApi* master) {
  return std::make_unique<MasterServiceImpl>(master);
}

}  // namespace fluxon
