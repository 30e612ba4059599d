#include "daemon/grpc_services.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_format.h"
#include "daemon/node.h"
#include "fluxon/v1/admin.grpc.pb.h"
#include "fluxon/v1/master.grpc.pb.h"
#include "fluxon/v1/peer.grpc.pb.h"
#include "fluxon/version.h"
#include "rpc_grpc/grpc_master.h"
#include "rpc_grpc/grpc_security.h"
#include "spdlog/spdlog.h"

namespace fluxon {
namespace {

template <typename Reply>
grpc::Status Answer(const absl::StatusOr<Reply>& r, Reply* out) {
  if (!r.ok()) return ToGrpcStatus(r.status());
  *out = *r;
  return grpc::Status::OK;
}

class AdminServiceImpl final : public v1::AdminService::Service {
 public:
  AdminServiceImpl(FluxonNode* node, MasterApi* master) : node_(node), master_(master) {}

  grpc::Status Status(grpc::ServerContext*, const v1::StatusRequest*,
                      v1::StatusReply* out) override {
    out->set_version(FLUXON_VERSION_STRING);
    out->set_role(RoleName(node_->config().role));
    out->set_node_id(node_->config().node_id);
    out->set_uptime_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - node_->started_at())
                           .count());
    if (OwnerCore* o = node_->owner()) {
      const SlotPoolStats s = o->memory().pool().Stats();
      out->set_generation(o->generation());
      out->set_segment_bytes(o->memory().segment().data_bytes());
      out->set_grants(s.grants);
      out->set_grant_capacity(s.grant_capacity);
      out->set_keys(o->Stats()["keys"]);
      out->set_clients(node_->client_sessions());
      out->set_master_registered(o->registered_with_master());
      out->set_registration_generation(o->registration_generation());
    }
    if (const ElectedMaster* e = node_->elected_master()) {
      const Leadership l = e->observed();
      out->set_election(e->leading() ? "leader" : "standby");
      if (l.known) {
        out->set_leader_address(l.value);
        out->set_leader_epoch(l.epoch);
      }
    } else if (const LeaderFollowingMaster* f = node_->followed_master()) {
      const LeaderFollowingMaster::Leader l = f->leader();
      out->set_election("follower");
      out->set_leader_address(l.address);
      out->set_leader_epoch(l.epoch);
    }
    return grpc::Status::OK;
  }
  grpc::Status Owners(grpc::ServerContext*, const v1::ListOwnersRequest* r,
                      v1::ListOwnersReply* out) override {
    if (master_ == nullptr) return NoMaster();
    return Answer(master_->ListOwners(*r), out);
  }
  grpc::Status Slots(grpc::ServerContext*, const v1::SlotsRequest*, v1::SlotsReply* out) override {
    OwnerCore* o = node_->owner();
    if (o == nullptr) return grpc::Status(grpc::FAILED_PRECONDITION, "this node has no owner");
    const SlotPoolStats s = o->memory().pool().Stats();
    for (int i = 0; i < kNumSlotStates; ++i) {
      (*out->mutable_by_state())[SlotStateName(static_cast<SlotState>(i))] = s.slots_by_state[i];
    }
    for (const SizeClassStats& c : s.classes) {
      v1::SlotClass* sc = out->add_classes();
      sc->set_slot_size(c.slot_size);
      sc->set_slots_per_grant(c.slots_per_grant);
      sc->set_grants(c.grants);
      sc->set_free(c.free_slots);
      sc->set_waiting_claims(c.waiting_claims);
    }
    return grpc::Status::OK;
  }
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest2*,
                     v1::CountersReply* out) override {
    auto* m = out->mutable_counters();
    if (OwnerCore* o = node_->owner()) {
      for (const auto& [k, v] : o->Stats()) (*m)["owner_" + k] = v;
      (*m)["owner_client_sessions"] = static_cast<int64_t>(node_->client_sessions());
    }
    if (const MasterCounters* c = node_->master_counters()) {
      for (const MasterCounterDef& d : kMasterCounterDefs) {
        (*m)[std::string("master_") + d.name] = ((*c).*d.field).load(std::memory_order_relaxed);
      }
      // A standby (elected) master serves no core: no routes, no gets.
      const std::shared_ptr<MasterCore> mc = node_->master();
      (*m)["master_routes"] = mc ? static_cast<int64_t>(mc->route_count()) : 0;
      (*m)["master_inflight_gets"] = mc ? static_cast<int64_t>(mc->inflight_gets()) : 0;
      if (const ElectedMaster* e = node_->elected_master()) {
        (*m)["master_leader"] = e->leading() ? 1 : 0;
        (*m)["master_leader_epoch"] = e->observed().epoch;
      }
    }
    return grpc::Status::OK;
  }
  grpc::Status GetRoute(grpc::ServerContext*, const v1::RouteRequest* r,
                        v1::RouteReply* out) override {
    if (OwnerCore* o = node_->owner()) out->set_local_state(o->KeyState(r->key()));
    if (master_ == nullptr) return grpc::Status::OK;
    v1::LookupRequest lr;
    lr.add_keys(r->key());
    absl::StatusOr<v1::LookupReply> reply = master_->Lookup(lr);
    if (!reply.ok()) return ToGrpcStatus(reply.status());
    out->set_found(reply->found(0));
    if (reply->found(0)) *out->mutable_route() = reply->routes(0);
    return grpc::Status::OK;
  }
  grpc::Status Keys(grpc::ServerContext*, const v1::ListKeysRequest* r,
                    v1::ListKeysReply* out) override {
    if (master_ == nullptr) return NoMaster();
    return Answer(master_->ListKeys(*r), out);
  }
  grpc::Status Placement(grpc::ServerContext*, const v1::PlaceReplicasRequest* r,
                         v1::PlaceReplicasReply* out) override {
    if (master_ == nullptr) return NoMaster();
    return Answer(master_->PlaceReplicas(*r), out);
  }
  grpc::Status SetFault(grpc::ServerContext* ctx, const v1::SetFaultRequest* r,
                        v1::Empty*) override {
    if (grpc::Status refused = RefuseUnlessMutationsAllowed(*ctx, "fault set"); !refused.ok()) {
      return refused;
    }
    absl::StatusOr<FaultAction> action = ParseFaultAction(r->rule().action());
    if (!action.ok()) return ToGrpcStatus(action.status());
    if (r->rule().point().empty())
      return grpc::Status(grpc::INVALID_ARGUMENT, "fault point is empty");
    if (r->rule().count() == 0 || r->rule().count() < -1) {
      return grpc::Status(grpc::INVALID_ARGUMENT, "count must be positive or -1");
    }
    node_->faults().Set(FaultRule{r->rule().point(), *action,
                                  std::chrono::milliseconds(r->rule().delay_ms()),
                                  r->rule().count()});
    spdlog::info("fault set: {} {} delay={}ms count={}", r->rule().point(), r->rule().action(),
                 r->rule().delay_ms(), r->rule().count());
    return grpc::Status::OK;
  }
  grpc::Status ClearFaults(grpc::ServerContext* ctx, const v1::ClearFaultsRequest* r,
                           v1::Empty*) override {
    if (grpc::Status refused = RefuseUnlessMutationsAllowed(*ctx, "fault clear"); !refused.ok()) {
      return refused;
    }
    node_->faults().Clear(r->point());
    return grpc::Status::OK;
  }
  grpc::Status ListFaults(grpc::ServerContext*, const v1::ListFaultsRequest*,
                          v1::ListFaultsReply* out) override {
    for (const FaultRule& f : node_->faults().List()) {
      v1::FaultRule* r = out->add_rules();
      r->set_point(f.point);
      r->set_action(FaultActionName(f.action));
      r->set_delay_ms(static_cast<uint32_t>(f.delay.count()));
      r->set_count(f.count);
    }
    return grpc::Status::OK;
  }

 private:
  // State-changing admin calls are off unless the config enables them (admin.allow_mutations),
  // and then need an authenticated peer: a client certificate the CA verified (security.tls),
  // or, without TLS, an admin service reachable only from this machine (a loopback address).
  // A node serving admin on the network without TLS (security.insecure) refuses them all.
  grpc::Status RefuseUnlessMutationsAllowed(const grpc::ServerContext& ctx,
                                            const char* what) const {
    const Config& config = node_->config();
    if (!config.admin.allow_mutations) {
      spdlog::warn("refused admin call '{}' from {}: admin.allow_mutations is off", what,
                   ctx.peer());
      return grpc::Status(grpc::PERMISSION_DENIED,
                          std::string(what) +
                              " changes the node's state and is disabled: set "
                              "admin.allow_mutations: true in the node's config to enable it");
    }
    if (node_->grpc_security().tls()) {
      if (GrpcSecurity::PeerAuthenticated(ctx)) {
        spdlog::info("admin call '{}' by {}", what, GrpcSecurity::PeerIdentity(ctx));
        return grpc::Status::OK;
      }
    } else if (IsLoopbackHost(HostOfAddress(config.admin.listen_address))) {
      return grpc::Status::OK;
    }
    spdlog::warn("refused admin call '{}' from {}: the peer is not authenticated", what,
                 ctx.peer());
    return grpc::Status(grpc::PERMISSION_DENIED,
                        std::string(what) +
                            " needs an authenticated peer: configure security.tls (the admin "
                            "service listens beyond loopback without it)");
  }
  static grpc::Status NoMaster() {
    return grpc::Status(grpc::FAILED_PRECONDITION, "this node cannot reach a master");
  }
  FluxonNode* const node_;
  MasterApi* const master_;
};

// The owners' peer service on an owner's admin port, with the node's gRPC credentials: replica
// pulls (docs/replicas.md). With mutual TLS the server admits only CA-verified member
// certificates, and a certificate issued to a node (CN fluxon-node-<id>) may ask only as that
// node. The RDMA exchange (ConnectQp/ReleaseQp) is not served by fluxond (TCP data plane only).
class PeerServiceImpl final : public v1::PeerService::Service {
 public:
  explicit PeerServiceImpl(OwnerCore* owner) : owner_(owner) {}

  grpc::Status PullReplicas(grpc::ServerContext* ctx, const v1::PullReplicasRequest* r,
                            v1::PullReplicasReply* out) override {
    if (const std::optional<uint32_t> named = PeerCertificateNode(*ctx);
        named && *named != r->requester_node_id()) {
      return ToGrpcStatus(absl::PermissionDeniedError(absl::StrFormat(
          "the certificate of node %d may not pull as node %d", *named, r->requester_node_id())));
    }
    std::vector<PullItem> items;
    items.reserve(r->items_size());
    for (const v1::PullItem& it : r->items()) items.push_back(PullItemFromProto(it));
    absl::StatusOr<std::vector<PullOutcome>> outcomes = owner_->PullReplicas(items);
    if (!outcomes.ok()) return ToGrpcStatus(outcomes.status());
    *out = PullReplyOf(*outcomes);
    spdlog::debug("pulled {} items for node {}", items.size(), r->requester_node_id());
    return grpc::Status::OK;
  }

  grpc::Status DropCopies(grpc::ServerContext* ctx, const v1::DropCopiesRequest* r,
                          v1::DropCopiesReply* out) override {
    if (const std::optional<uint32_t> named = PeerCertificateNode(*ctx);
        named && *named != r->requester_node_id()) {
      return ToGrpcStatus(absl::PermissionDeniedError(
          absl::StrFormat("the certificate of node %d may not drop copies as node %d", *named,
                          r->requester_node_id())));
    }
    absl::StatusOr<v1::DropCopiesReply> dropped = owner_->DropCopies(*r);
    if (!dropped.ok()) return ToGrpcStatus(dropped.status());
    *out = *std::move(dropped);
    spdlog::debug("node {} asked to drop {} copies: {} dropped, {} kept, {} not held",
                  r->requester_node_id(), r->items_size(), out->dropped(), out->kept(),
                  out->not_held());
    return grpc::Status::OK;
  }

 private:
  OwnerCore* const owner_;
};

}  // namespace

class GrpcServers::Impl {
 public:
  std::unique_ptr<grpc::Service> master_service;
  std::unique_ptr<AdminServiceImpl> admin_service;
  std::unique_ptr<PeerServiceImpl> peer_service;
  std::unique_ptr<grpc::Server> master_server;
  std::unique_ptr<grpc::Server> admin_server;
  int admin_port = 0;
  int master_port = 0;
};

absl::StatusOr<std::unique_ptr<GrpcServers>> GrpcServers::Start(FluxonNode* node) {
  auto impl = std::make_unique<Impl>();
  const Config& config = node->config();
  // The admin service's master calls (owners, keys, routes, placement) go where the node's own
  // go: its master, or an owner's client of the cluster's master (following an election).
  MasterApi* admin_master = node->master_api();
  if (RoleHasMaster(config.role)) {
    impl->master_service = MakeMasterGrpcService(
        admin_master, config.security.tls && config.security.tls->node_bound_certificates);
    grpc::ServerBuilder b;
    ApplyServerLimits(&b);
    int port = 0;
    b.AddListeningPort(config.master->listen_address, node->grpc_security().ServerCredentials(),
                       &port);
    b.RegisterService(impl->master_service.get());
    impl->master_server = b.BuildAndStart();
    if (!impl->master_server || port == 0) {
      return absl::UnavailableError(absl::StrFormat(
          "cannot serve the master on %s (address in use?)", config.master->listen_address));
    }
    impl->master_port = port;
    spdlog::info("master service on {} (port {})", config.master->listen_address, port);
  }
  impl->admin_service = std::make_unique<AdminServiceImpl>(node, admin_master);
  grpc::ServerBuilder b;
  ApplyServerLimits(&b);
  int port = 0;
  b.AddListeningPort(config.admin.listen_address, node->grpc_security().ServerCredentials(), &port);
  b.RegisterService(impl->admin_service.get());
  if (node->owner() != nullptr) {
    impl->peer_service = std::make_unique<PeerServiceImpl>(node->owner());
    b.RegisterService(impl->peer_service.get());
  }
  impl->admin_server = b.BuildAndStart();
  if (!impl->admin_server || port == 0) {
    return absl::UnavailableError(
        absl::StrFormat("cannot serve admin on %s (address in use?)", config.admin.listen_address));
  }
  impl->admin_port = port;
  spdlog::info("admin service on {} (port {})", config.admin.listen_address, port);
  return std::unique_ptr<GrpcServers>(new GrpcServers(std::move(impl)));
}

GrpcServers::GrpcServers(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrpcServers::~GrpcServers() { Stop(); }
int GrpcServers::admin_port() const { return impl_->admin_port; }
int GrpcServers::master_port() const { return impl_->master_port; }
void GrpcServers::Stop() {
  const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(500);
  if (impl_->admin_server) impl_->admin_server->Shutdown(deadline);
  if (impl_->master_server) impl_->master_server->Shutdown(deadline);
  impl_->admin_server.reset();
  impl_->master_server.reset();
}

}  // namespace fluxon
