#include "rpc_grpc/grpc_master.h"

#include <algorithm>

#include <grpc/grpc_security_constants.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "common/put_id.h"
#include "fluxon/status.h"
#include "fluxon/v1/master.grpc.pb.h"

namespace fluxon {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}
absl::Status FromGrpcStatus(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

grpc::ChannelArguments ControlChannelArgs() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kGrpcMaxMessageBytes);
  args.SetMaxSendMessageSize(kGrpcMaxMessageBytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kGrpcMinReconnectMs);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kGrpcMinReconnectMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kGrpcMaxReconnectMs);
  return args;
}

void ApplyServerLimits(grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(kGrpcMaxMessageBytes);
  builder->SetMaxSendMessageSize(kGrpcMaxMessageBytes);
}

namespace {

// [begin, end) ranges of `n` items whose key bytes (key_bytes(i) + a small per-item overhead)
// add up to at most kMasterCallKeyBytes each; one range per item at worst.
template <typename KeyBytes>
std::vector<std::pair<int, int>> SplitByKeyBytes(int n, KeyBytes key_bytes) {
  std::vector<std::pair<int, int>> out;
  int begin = 0;
  size_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    const size_t b = key_bytes(i) + 64;
    if (i > begin && bytes + b > kMasterCallKeyBytes) {
      out.emplace_back(begin, i);
      begin = i;
      bytes = 0;
    }
    bytes += b;
  }
  out.emplace_back(begin, n);
  return out;
}

template <typename Reply>
grpc::Status Answer(absl::StatusOr<Reply>&& r, Reply* out) {
  if (!r.ok()) return ToGrpcStatus(r.status());
  *out = std::move(*r);  // the answer's items are moved, not copied (batches of thousands)
  return grpc::Status::OK;
}

class GrpcMasterClient final : public CancellableMasterApi {
 public:
  GrpcMasterClient(std::shared_ptr<grpc::Channel> channel, std::chrono::milliseconds deadline)
      : stub_(v1::MasterService::NewStub(channel)), deadline_(deadline) {}

  void CancelInFlight() override {
    MutexLock lock(&mu_);
    for (auto& [ctx, cancelled] : in_flight_) {
      cancelled = true;
      ctx->TryCancel();
    }
  }

#define FLUXON_GRPC_CALL(Method, Req, Reply)                        \
  absl::StatusOr<v1::Reply> Call##Method(const v1::Req& r) {        \
    grpc::ClientContext ctx;                                        \
    ctx.set_deadline(std::chrono::system_clock::now() + deadline_); \
    InFlight call(this, &ctx);                                      \
    v1::Reply reply;                                                \
    grpc::Status s = stub_->Method(&ctx, r, &reply);                \
    if (!s.ok()) return call.Failure(s);                            \
    return reply;                                                   \
  }
  FLUXON_GRPC_CALL(RegisterOwner, RegisterOwnerRequest, RegisterOwnerReply)
  FLUXON_GRPC_CALL(UnregisterOwner, UnregisterOwnerRequest, UnregisterOwnerReply)
  FLUXON_GRPC_CALL(PublishBatch, PublishBatchRequest, PublishBatchReply)
  FLUXON_GRPC_CALL(Lookup, LookupRequest, LookupReply)
  FLUXON_GRPC_CALL(RemoveRoutes, RemoveRoutesRequest, RemoveRoutesReply)
  FLUXON_GRPC_CALL(ListOwners, ListOwnersRequest, ListOwnersReply)
  FLUXON_GRPC_CALL(ListKeys, ListKeysRequest, ListKeysReply)
  FLUXON_GRPC_CALL(PlaceReplicas, PlaceReplicasRequest, PlaceReplicasReply)
  FLUXON_GRPC_CALL(BatchGetStart, BatchGetStartRequest, BatchGetStartReply)
  FLUXON_GRPC_CALL(BatchGetDone, BatchGetDoneRequest, BatchGetDoneReply)
  FLUXON_GRPC_CALL(BatchGetRevoke, BatchGetRevokeRequest, BatchGetRevokeReply)
#undef FLUXON_GRPC_CALL

  absl::StatusOr<v1::RegisterOwnerReply> RegisterOwner(const v1::RegisterOwnerRequest& r) override {
    return CallRegisterOwner(r);
  }
  absl::StatusOr<v1::UnregisterOwnerReply> UnregisterOwner(
      const v1::UnregisterOwnerRequest& r) override {
    return CallUnregisterOwner(r);
  }
  absl::StatusOr<v1::ListOwnersReply> ListOwners(const v1::ListOwnersRequest& r) override {
    return CallListOwners(r);
  }
  absl::StatusOr<v1::ListKeysReply> ListKeys(const v1::ListKeysRequest& r) override {
    return CallListKeys(r);
  }
  absl::StatusOr<v1::PlaceReplicasReply> PlaceReplicas(const v1::PlaceReplicasRequest& r) override {
    return CallPlaceReplicas(r);
  }
  absl::StatusOr<v1::BatchGetRevokeReply> BatchGetRevoke(
      const v1::BatchGetRevokeRequest& r) override {
    return CallBatchGetRevoke(r);  // 8 bytes per item: 65,536 ids are 0.5 MiB
  }

  // Calls carrying keys are split by key bytes (kMasterCallKeyBytes); the parts' answers are
  // concatenated in item order. A part that fails fails the call with its status: items of
  // earlier parts may have been applied, which every caller already handles (each item is
  // idempotent by its identity, and an error is an uncertain or refused outcome for all).
  absl::StatusOr<v1::PublishBatchReply> PublishBatch(const v1::PublishBatchRequest& r) override {
    return Split<v1::PublishBatchReply>(
        r, r.items_size(), [&](int i) { return r.items(i).key().size(); },
        [](const v1::PublishBatchRequest& whole, int b, int e) {
          v1::PublishBatchRequest part = whole;
          part.clear_items();
          part.clear_atomic_group_lens();  // groups are the owner's; the master keys per item
          for (int i = b; i < e; ++i) *part.add_items() = whole.items(i);
          return part;
        },
        [this](const v1::PublishBatchRequest& p) { return CallPublishBatch(p); },
        [](v1::PublishBatchReply* all, v1::PublishBatchReply&& part) {
          all->mutable_outcomes()->MergeFrom(part.outcomes());
          all->set_master_epoch(part.master_epoch());
          all->set_hlc(std::max(all->hlc(), part.hlc()));
        });
  }
  absl::StatusOr<v1::LookupReply> Lookup(const v1::LookupRequest& r) override {
    return Split<v1::LookupReply>(
        r, r.keys_size(), [&](int i) { return 2 * r.keys(i).size(); },
        [](const v1::LookupRequest& whole, int b, int e) {
          v1::LookupRequest part;
          part.set_requester_node_id(whole.requester_node_id());
          for (int i = b; i < e; ++i) part.add_keys(whole.keys(i));
          return part;
        },
        [this](const v1::LookupRequest& p) { return CallLookup(p); },
        [](v1::LookupReply* all, v1::LookupReply&& part) {
          all->mutable_found()->MergeFrom(part.found());
          for (v1::Route& route : *part.mutable_routes()) {
            *all->add_routes() = std::move(route);
          }
          all->set_master_epoch(part.master_epoch());
          all->set_hlc(std::max(all->hlc(), part.hlc()));
        });
  }
  absl::StatusOr<v1::RemoveRoutesReply> RemoveRoutes(const v1::RemoveRoutesRequest& r) override {
    return Split<v1::RemoveRoutesReply>(
        r, r.items_size(), [&](int i) { return r.items(i).key().size(); },
        [](const v1::RemoveRoutesRequest& whole, int b, int e) {
          v1::RemoveRoutesRequest part = whole;
          part.clear_items();
          for (int i = b; i < e; ++i) *part.add_items() = whole.items(i);
          return part;
        },
        [this](const v1::RemoveRoutesRequest& p) { return CallRemoveRoutes(p); },
        [](v1::RemoveRoutesReply* all, v1::RemoveRoutesReply&& part) {
          all->mutable_removed()->MergeFrom(part.removed());
          all->mutable_pinned()->MergeFrom(part.pinned());
          all->mutable_sole()->MergeFrom(part.sole());
          all->set_master_epoch(part.master_epoch());
          all->set_hlc(std::max(all->hlc(), part.hlc()));
        });
  }
  absl::StatusOr<v1::BatchGetStartReply> BatchGetStart(const v1::BatchGetStartRequest& r) override {
    return Split<v1::BatchGetStartReply>(
        r, r.items_size(), [&](int i) { return r.items(i).key().size(); },
        [](const v1::BatchGetStartRequest& whole, int b, int e) {
          v1::BatchGetStartRequest part = whole;
          part.clear_items();
          // Each part is its own request: a distinct, deterministic request_id, so a retry of
          // the whole call replays every part's stored answer (T1).
          if (b > 0) {
            part.set_request_id(whole.request_id() ^
                                (static_cast<uint64_t>(b) * 0x9E3779B97F4A7C15ull));
          }
          for (int i = b; i < e; ++i) *part.add_items() = whole.items(i);
          return part;
        },
        [this](const v1::BatchGetStartRequest& p) { return CallBatchGetStart(p); },
        [](v1::BatchGetStartReply* all, v1::BatchGetStartReply&& part) {
          for (v1::GetStartResult& res : *part.mutable_results()) {
            *all->add_results() = std::move(res);
          }
          for (v1::SourcePeer& peer : *part.mutable_source_peers()) {  // one entry per node
            const bool listed =
                std::any_of(all->source_peers().begin(), all->source_peers().end(),
                            [&](const v1::SourcePeer& p) { return p.node_id() == peer.node_id(); });
            if (!listed) *all->add_source_peers() = std::move(peer);
          }
          all->set_inflight_get_ttl_ms(part.inflight_get_ttl_ms());
          all->set_master_epoch(part.master_epoch());
          all->set_hlc(std::max(all->hlc(), part.hlc()));
        });
  }
  absl::StatusOr<v1::BatchGetDoneReply> BatchGetDone(const v1::BatchGetDoneRequest& r) override {
    return Split<v1::BatchGetDoneReply>(
        r, r.items_size(), [&](int i) { return r.items(i).key().size(); },
        [](const v1::BatchGetDoneRequest& whole, int b, int e) {
          v1::BatchGetDoneRequest part = whole;
          part.clear_items();
          for (int i = b; i < e; ++i) *part.add_items() = whole.items(i);
          return part;
        },
        [this](const v1::BatchGetDoneRequest& p) { return CallBatchGetDone(p); },
        [](v1::BatchGetDoneReply* all, v1::BatchGetDoneReply&& part) {
          all->mutable_outcomes()->MergeFrom(part.outcomes());
          all->set_master_epoch(part.master_epoch());
        });
  }

 private:
  template <typename Reply, typename Req, typename KeyBytes, typename MakePart, typename CallPart,
            typename Merge>
  absl::StatusOr<Reply> Split(const Req& whole, int n, KeyBytes key_bytes, MakePart make_part,
                              CallPart call_part, Merge merge) {
    const std::vector<std::pair<int, int>> parts = SplitByKeyBytes(n, key_bytes);
    if (parts.size() == 1) return call_part(whole);
    Reply all;
    for (const auto& [b, e] : parts) {
      absl::StatusOr<Reply> part = call_part(make_part(whole, b, e));
      if (!part.ok() && b > 0) {
        // Earlier parts may have been applied: the whole call's outcome is unknown, never a
        // definite refusal (the caller retries the same identities, T1).
        return absl::UnavailableError(
            absl::StrFormat("part %d..%d of %d items: %s (earlier parts may have been applied)", b,
                            e, n, part.status().ToString()));
      }
      if (!part.ok()) return part.status();
      merge(&all, std::move(*part));
    }
    return all;
  }

  // One call's registration for CancelInFlight, from before the call until its context goes.
  class InFlight {
   public:
    InFlight(GrpcMasterClient* client, grpc::ClientContext* ctx) : client_(client), ctx_(ctx) {
      MutexLock lock(&client_->mu_);
      client_->in_flight_.emplace(ctx_, false);
    }
    ~InFlight() {
      MutexLock lock(&client_->mu_);
      client_->in_flight_.erase(ctx_);
    }
    // The call's failure: a cancelled call's outcome is unknown (Unavailable), never a refusal.
    absl::Status Failure(const grpc::Status& s) {
      bool cancelled = false;
      {
        MutexLock lock(&client_->mu_);
        cancelled = client_->in_flight_[ctx_];
      }
      if (cancelled) {
        return absl::UnavailableError(
            "the call was cancelled: the master it went to no longer leads (outcome unknown)");
      }
      return FromGrpcStatus(s);
    }

   private:
    GrpcMasterClient* const client_;
    grpc::ClientContext* const ctx_;
  };

  std::unique_ptr<v1::MasterService::Stub> stub_;
  const std::chrono::milliseconds deadline_;
  Mutex mu_;
  // Calls in flight, and whether CancelInFlight ended them.
  absl::flat_hash_map<grpc::ClientContext*, bool> in_flight_ ABSL_GUARDED_BY(mu_);
};

// With mutual TLS, a call naming a node_id must come from that node's certificate, so one member
// cannot register, heartbeat, publish or remove routes as another (PermissionDenied):
// - a certificate naming its node (Common Name fluxon-node-<id>, CertificateNode) acts as that
//   node only. The rule needs no memory, so it holds across master restarts.
// - with node_bound_certificates, a certificate naming no node is refused.
// - otherwise each node_id belongs to the certificate identity that first used it at this
//   master instance (a restarted master forgets it: use node-bound certificates to keep it).
// Without TLS there is no identity to bind (a loopback-only master) and every call passes.
class NodeIdentityBinding {
 public:
  explicit NodeIdentityBinding(bool node_bound) : node_bound_(node_bound) {}

  absl::Status Check(const grpc::ServerContext& ctx, uint32_t node_id) {
    if (!GrpcSecurity::PeerAuthenticated(ctx)) return absl::OkStatus();
    const std::string identity = GrpcSecurity::PeerIdentity(ctx);
    const std::optional<uint32_t> named = PeerCertificateNode(ctx);
    if (named) {
      if (*named == node_id) return absl::OkStatus();
      return absl::PermissionDeniedError(
          absl::StrFormat("the certificate '%s' is issued to node %d; it may not act as node_id %d",
                          identity, *named, node_id));
    }
    if (node_bound_) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "the certificate '%s' names no node (Common Name fluxon-node-<id>) and the master admits "
          "only node-bound certificates (security.tls.node_bound_certificates)",
          identity));
    }
    MutexLock lock(&mu_);
    auto [it, inserted] = bound_.try_emplace(node_id, identity);
    if (inserted || it->second == identity) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrFormat("node_id %d belongs to the certificate '%s'; this caller presented '%s'",
                        node_id, it->second, identity));
  }

 private:
  const bool node_bound_;
  Mutex mu_;
  absl::flat_hash_map<uint32_t, std::string> bound_ ABSL_GUARDED_BY(mu_);
};

#define FLUXON_CHECK_NODE(ctx, node)                                      \
  if (absl::Status bound = binding_.Check(*(ctx), (node)); !bound.ok()) { \
    return ToGrpcStatus(bound);                                           \
  }

class MasterServiceImpl final : public v1::MasterService::Service {
 public:
  MasterServiceImpl(MasterApi* master, bool node_bound_certificates)
      : master_(master), binding_(node_bound_certificates) {}
  grpc::Status RegisterOwner(grpc::ServerContext* ctx, const v1::RegisterOwnerRequest* r,
                             v1::RegisterOwnerReply* out) override {
    FLUXON_CHECK_NODE(ctx, r->node_id());
    return Answer(master_->RegisterOwner(*r), out);
  }
  grpc::Status UnregisterOwner(grpc::ServerContext* ctx, const v1::UnregisterOwnerRequest* r,
                               v1::UnregisterOwnerReply* out) override {
    FLUXON_CHECK_NODE(ctx, r->node_id());
    return Answer(master_->UnregisterOwner(*r), out);
  }
  grpc::Status PublishBatch(grpc::ServerContext* ctx, const v1::PublishBatchRequest* r,
                            v1::PublishBatchReply* out) override {
    FLUXON_CHECK_NODE(ctx, r->node_id());
    return Answer(master_->PublishBatch(*r), out);
  }
  grpc::Status Lookup(grpc::ServerContext*, const v1::LookupRequest* r,
                      v1::LookupReply* out) override {
    return Answer(master_->Lookup(*r), out);
  }
  grpc::Status RemoveRoutes(grpc::ServerContext* ctx, const v1::RemoveRoutesRequest* r,
                            v1::RemoveRoutesReply* out) override {
    FLUXON_CHECK_NODE(ctx, r->node_id());
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
  grpc::Status PlaceReplicas(grpc::ServerContext*, const v1::PlaceReplicasRequest* r,
                             v1::PlaceReplicasReply* out) override {
    return Answer(master_->PlaceReplicas(*r), out);
  }
  grpc::Status BatchGetStart(grpc::ServerContext* ctx, const v1::BatchGetStartRequest* r,
                             v1::BatchGetStartReply* out) override {
    FLUXON_CHECK_NODE(ctx, r->requester_node_id());
    return Answer(master_->BatchGetStart(*r), out);
  }
  grpc::Status BatchGetDone(grpc::ServerContext* ctx, const v1::BatchGetDoneRequest* r,
                            v1::BatchGetDoneReply* out) override {
    FLUXON_CHECK_NODE(ctx, r->requester_node_id());
    return Answer(master_->BatchGetDone(*r), out);
  }
  grpc::Status BatchGetRevoke(grpc::ServerContext* ctx, const v1::BatchGetRevokeRequest* r,
                              v1::BatchGetRevokeReply* out) override {
    FLUXON_CHECK_NODE(ctx, r->requester_node_id());
    return Answer(master_->BatchGetRevoke(*r), out);
  }

 private:
  MasterApi* const master_;
  NodeIdentityBinding binding_;
};
#undef FLUXON_CHECK_NODE

}  // namespace

absl::StatusOr<std::unique_ptr<CancellableMasterApi>> MakeCancellableGrpcMasterClient(
    const std::string& address, const GrpcSecurity& security, std::chrono::milliseconds deadline) {
  if (address.empty()) return absl::InvalidArgumentError("master address is empty");
  return std::make_unique<GrpcMasterClient>(security.Channel(address, ControlChannelArgs()),
                                            deadline);
}

absl::StatusOr<std::unique_ptr<MasterApi>> MakeGrpcMasterClient(
    const std::string& address, const GrpcSecurity& security, std::chrono::milliseconds deadline) {
  FLUXON_ASSIGN_OR_RETURN(std::unique_ptr<CancellableMasterApi> client,
                          MakeCancellableGrpcMasterClient(address, security, deadline));
  return std::unique_ptr<MasterApi>(std::move(client));
}

absl::StatusOr<std::unique_ptr<MasterApi>> MakeGrpcMasterClient(
    const std::string& address, std::chrono::milliseconds deadline) {
  return MakeGrpcMasterClient(address, GrpcSecurity::Plaintext(), deadline);
}

std::unique_ptr<grpc::Service> MakeMasterGrpcService(MasterApi* master,
                                                     bool node_bound_certificates) {
  return std::make_unique<MasterServiceImpl>(master, node_bound_certificates);
}

std::optional<uint32_t> PeerCertificateNode(const grpc::ServerContext& ctx) {
  if (!GrpcSecurity::PeerAuthenticated(ctx)) return std::nullopt;
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  for (const grpc::string_ref& cn : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
    return CertificateNode(std::string(cn.data(), cn.size()));
  }
  return std::nullopt;
}

std::optional<uint32_t> CertificateNode(const std::string& common_name) {
  constexpr std::string_view kPrefix = "fluxon-node-";
  if (common_name.compare(0, kPrefix.size(), kPrefix) != 0) return std::nullopt;
  const std::string_view digits = std::string_view(common_name).substr(kPrefix.size());
  if (digits.empty() || digits.size() > 7 || (digits.size() > 1 && digits[0] == '0')) {
    return std::nullopt;
  }
  uint32_t id = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    id = id * 10 + static_cast<uint32_t>(c - '0');
  }
  if (id >= (1u << kPutIdNodeBits)) return std::nullopt;
  return id;
}

}  // namespace fluxon
