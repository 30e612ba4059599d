#include "rpc_grpc/grpc_verbs_exchange.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "rpc_grpc/grpc_master.h"
#include "spdlog/spdlog.h"

namespace fluxon {

using transport::verbs::QpAddress;
using transport::verbs::RegionInfo;
using transport::verbs::VerbsAcceptor;

namespace {

void ToProto(const QpAddress& a, v1::QpAddressInfo* out) {
  out->set_qp_num(a.qp_num);
  out->set_lid(a.lid);
  out->set_gid(std::string(reinterpret_cast<const char*>(a.gid.data()), a.gid.size()));
  out->set_psn(a.psn);
}

absl::StatusOr<QpAddress> FromProto(const v1::QpAddressInfo& p) {
  if (p.gid().size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrFormat("queue pair GID must be 16 bytes, got %d", p.gid().size()));
  }
  if (p.lid() > 0xFFFF) {
    return absl::InvalidArgumentError(absl::StrFormat("LID %d is over 16 bits", p.lid()));
  }
  QpAddress a;
  a.qp_num = p.qp_num();
  a.lid = static_cast<uint16_t>(p.lid());
  std::memcpy(a.gid.data(), p.gid().data(), 16);
  a.psn = p.psn();
  return a;
}

}  // namespace

class GrpcVerbsExchange::Service final : public v1::PeerService::Service {
 public:
  void Publish(const std::string& name, VerbsAcceptor* acceptor) {
    MutexLock lock(&mu_);
    acceptors_[name] = acceptor;
  }
  void Withdraw(const std::string& name, VerbsAcceptor* acceptor) {
    MutexLock lock(&mu_);  // waits for a call into `acceptor` in progress
    auto it = acceptors_.find(name);
    if (it != acceptors_.end() && it->second == acceptor) acceptors_.erase(it);
  }

  grpc::Status ConnectQp(grpc::ServerContext* ctx, const v1::ConnectQpRequest* r,
                         v1::ConnectQpReply* out) override {
    absl::StatusOr<QpAddress> initiator = FromProto(r->initiator());
    if (!initiator.ok()) return ToGrpcStatus(initiator.status());
    MutexLock lock(&mu_);
    VerbsAcceptor* a = FindLocked(r->node_name());
    if (a == nullptr) return NotServed(r->node_name());
    absl::StatusOr<std::pair<QpAddress, RegionInfo>> accepted = a->AcceptQp(*initiator);
    if (!accepted.ok()) return ToGrpcStatus(accepted.status());
    ToProto(accepted->first, out->mutable_responder());
    out->set_generation(accepted->second.generation);
    out->set_addr(accepted->second.addr);
    out->set_len(accepted->second.len);
    out->set_rkey(accepted->second.rkey);
    spdlog::debug("peer service: queue pair {} for {} ({})", accepted->first.qp_num, ctx->peer(),
                  GrpcSecurity::PeerIdentity(*ctx));
    return grpc::Status::OK;
  }

  grpc::Status ReleaseQp(grpc::ServerContext*, const v1::ReleaseQpRequest* r,
                         v1::ReleaseQpReply*) override {
    MutexLock lock(&mu_);
    VerbsAcceptor* a = FindLocked(r->node_name());
    if (a == nullptr) return NotServed(r->node_name());
    a->ReleaseQp(r->qp_num(), r->initiator_qp_num());
    return grpc::Status::OK;
  }

 private:
  VerbsAcceptor* FindLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = acceptors_.find(name);
    if (it != acceptors_.end()) return it->second;
    return acceptors_.size() == 1 ? acceptors_.begin()->second : nullptr;
  }
  static grpc::Status NotServed(const std::string& name) {
    return grpc::Status(grpc::UNAVAILABLE,
                        absl::StrFormat("no RDMA transport is published as '%s' here", name));
  }

  Mutex mu_;
  absl::flat_hash_map<std::string, VerbsAcceptor*> acceptors_ ABSL_GUARDED_BY(mu_);
};

GrpcVerbsExchange::GrpcVerbsExchange(GrpcSecurity security, std::chrono::milliseconds call_timeout)
    : security_(std::move(security)),
      call_timeout_(call_timeout),
      service_(std::make_unique<Service>()) {}

GrpcVerbsExchange::~GrpcVerbsExchange() = default;

grpc::Service* GrpcVerbsExchange::service() { return service_.get(); }

void GrpcVerbsExchange::Publish(const std::string& name, VerbsAcceptor* acceptor) {
  service_->Publish(name, acceptor);
}

void GrpcVerbsExchange::Withdraw(const std::string& name, VerbsAcceptor* acceptor) {
  service_->Withdraw(name, acceptor);
}

v1::PeerService::Stub* GrpcVerbsExchange::StubFor(const std::string& peer) {
  MutexLock lock(&stubs_mu_);
  std::unique_ptr<v1::PeerService::Stub>& stub = stubs_[peer];
  if (!stub) stub = v1::PeerService::NewStub(security_.Channel(peer));
  return stub.get();
}

absl::StatusOr<std::pair<QpAddress, RegionInfo>> GrpcVerbsExchange::Connect(
    const std::string& peer, const QpAddress& initiator) {
  v1::ConnectQpRequest req;
  req.set_node_name(peer);
  ToProto(initiator, req.mutable_initiator());
  v1::ConnectQpReply reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + call_timeout_);
  const grpc::Status s = StubFor(peer)->ConnectQp(&ctx, req, &reply);
  if (!s.ok()) {
    const absl::Status st = FromGrpcStatus(s);
    return absl::Status(st.code(),
                        absl::StrFormat("peer service %s: ConnectQp: %s", peer, st.message()));
  }
  absl::StatusOr<QpAddress> responder = FromProto(reply.responder());
  if (!responder.ok()) {
    return absl::DataLossError(absl::StrFormat(
        "peer service %s answered a malformed queue pair: %s", peer, responder.status().message()));
  }
  RegionInfo region;
  region.generation = reply.generation();
  region.addr = reply.addr();
  region.len = reply.len();
  region.rkey = reply.rkey();
  return std::make_pair(*responder, region);
}

void GrpcVerbsExchange::Disconnect(const std::string& peer, uint32_t remote_qp_num,
                                   uint32_t local_qp_num) {
  v1::ReleaseQpRequest req;
  req.set_node_name(peer);
  req.set_qp_num(remote_qp_num);
  req.set_initiator_qp_num(local_qp_num);
  v1::ReleaseQpReply reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + call_timeout_);
  const grpc::Status s = StubFor(peer)->ReleaseQp(&ctx, req, &reply);
  if (!s.ok()) {
    spdlog::warn("peer service {}: ReleaseQp {}: {}", peer, remote_qp_num, s.error_message());
  }
}

}  // namespace fluxon
