#include "rpc_grpc/grpc_peer.h"

#include <grpcpp/grpcpp.h>

#include <list>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "fluxon/v1/peer.grpc.pb.h"
#include "rpc_grpc/grpc_master.h"

namespace fluxon {
namespace {

// Peers a node talks to are the cluster's owners; the bound only keeps a churning cluster (new
// addresses after restarts) from growing the cache without end.
constexpr size_t kMaxChannels = 1024;

class GrpcPeerClient final : public PeerApi {
 public:
  explicit GrpcPeerClient(const GrpcSecurity& security) : security_(security) {}

  absl::StatusOr<v1::PullReplicasReply> PullReplicas(const std::string& peer_address,
                                                     const v1::PullReplicasRequest& r,
                                                     std::chrono::milliseconds timeout) override {
    absl::StatusOr<v1::PullReplicasReply> reply =
        Call(peer_address, "PullReplicas", &v1::PeerService::Stub::PullReplicas, r, timeout);
    if (reply.ok() && reply->outcomes_size() != r.items_size()) {
      return absl::DataLossError(absl::StrFormat("peer %s answered %d outcomes for %d items",
                                                 peer_address, reply->outcomes_size(),
                                                 r.items_size()));
    }
    return reply;
  }

  absl::StatusOr<v1::DropCopiesReply> DropCopies(const std::string& peer_address,
                                                 const v1::DropCopiesRequest& r,
                                                 std::chrono::milliseconds timeout) override {
    return Call(peer_address, "DropCopies", &v1::PeerService::Stub::DropCopies, r, timeout);
  }

  void Cancel() override {
    MutexLock lock(&mu_);
    cancelled_ = true;
    for (grpc::ClientContext* c : active_) c->TryCancel();
  }

 private:
  // One unary call on the peer's stub, cancellable by Cancel() and bounded by `timeout`.
  template <typename Request, typename Reply>
  absl::StatusOr<Reply> Call(const std::string& peer_address, const char* name,
                             grpc::Status (v1::PeerService::Stub::*method)(grpc::ClientContext*,
                                                                           const Request&, Reply*),
                             const Request& r, std::chrono::milliseconds timeout) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    std::shared_ptr<v1::PeerService::Stub> stub;
    {
      MutexLock lock(&mu_);
      if (cancelled_) return absl::CancelledError("the owner is stopping");
      stub = StubLocked(peer_address);
      active_.insert(&ctx);
    }
    Reply reply;
    const grpc::Status s = (stub.get()->*method)(&ctx, r, &reply);
    {
      MutexLock lock(&mu_);
      active_.erase(&ctx);
    }
    if (!s.ok()) {
      const absl::Status st = FromGrpcStatus(s);
      return absl::Status(st.code(),
                          absl::StrFormat("peer %s: %s: %s", peer_address, name, st.message()));
    }
    return reply;
  }

  std::shared_ptr<v1::PeerService::Stub> StubLocked(const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = stubs_.find(address);
    if (it != stubs_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
    if (stubs_.size() >= kMaxChannels) {
      stubs_.erase(lru_.back());
      lru_.pop_back();
    }
    // The message limits of every control channel, without their 100 ms reconnect floor (which
    // is also gRPC's connect deadline: a TLS handshake with a busy peer can outlast it).
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kGrpcMaxMessageBytes);
    args.SetMaxSendMessageSize(kGrpcMaxMessageBytes);
    auto stub = std::shared_ptr<v1::PeerService::Stub>(
        v1::PeerService::NewStub(security_.Channel(address, args)));
    lru_.push_front(address);
    stubs_.emplace(address, std::make_pair(stub, lru_.begin()));
    return stub;
  }

  const GrpcSecurity security_;
  Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<grpc::ClientContext*> active_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::pair<std::shared_ptr<v1::PeerService::Stub>,
                                             std::list<std::string>::iterator>>
      stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<PeerApi> MakeGrpcPeerClient(const GrpcSecurity& security) {
  return std::make_unique<GrpcPeerClient>(security);
}

}  // namespace fluxon
