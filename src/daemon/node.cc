#include "daemon/node.h"

#include "absl/strings/str_format.h"
#include "daemon/grpc_services.h"
#include "daemon/metrics.h"
#include "daemon/metrics_exposer.h"
#include "fluxon/status.h"
#include "fluxon/units.h"
#include "rpc/fault_injecting_master.h"
#include "rpc/grpc_security.h"
#include "security/security_files.h"
#include "spdlog/spdlog.h"
#include "transport/tcp/tcp_transport.h"

namespace fluxon {

absl::StatusOr<std::unique_ptr<FluxonNode>> FluxonNode::Start(const Config& config) {
  FLUXON_RETURN_IF_ERROR(CheckListenSecurity(config));
  std::unique_ptr<FluxonNode> node(new FluxonNode(config));
  {
    FLUXON_ASSIGN_OR_RETURN(GrpcSecurity grpc_security, GrpcSecurity::FromConfig(config.security));
    node->grpc_security_ = std::make_unique<GrpcSecurity>(std::move(grpc_security));
    if (node->grpc_security_->tls()) {
      spdlog::info("gRPC: mutual TLS (certificate {}, CA {})", config.security.tls->cert_file,
                   config.security.tls->ca_file);
    }
  }
  std::string cluster_secret;
  if (!config.security.cluster_secret_file.empty()) {
    FLUXON_ASSIGN_OR_RETURN(cluster_secret,
                            security::LoadClusterSecret(config.security.cluster_secret_file));
  } else if (config.owner && !config.owner->data_address.empty()) {
    // The data plane always authenticates: without a configured secret (a loopback cluster on
    // one machine, the start-up rule refuses anything else) it uses the machine-local one every
    // fluxond of this user shares; only security.insecure serves with no secret at all.
    if (config.security.insecure) {
      spdlog::warn(
          "data plane without a cluster secret (security.insecure): any local process can read "
          "this owner's segment through it");
    } else {
      const std::string path = security::MachineSecretPath();
      FLUXON_ASSIGN_OR_RETURN(cluster_secret, security::LoadOrCreateMachineSecret(path));
      spdlog::info("data plane: machine-local cluster secret {}", path);
    }
  }
  for (const FaultConfig& f : config.faults) {
    FLUXON_ASSIGN_OR_RETURN(FaultAction action, ParseFaultAction(f.action));
    node->faults_.Set(FaultRule{f.point, action, f.delay, f.count});
  }
  if (RoleHasMaster(config.role)) {
    node->master_ = std::make_unique<MasterCore>(MasterOptions::FromConfig(*config.master));
    node->master_->StartMaintenance(std::chrono::milliseconds(100));
  }
  if (RoleHasOwner(config.role)) {
    MasterApi* master = node->master_.get();
    if (master == nullptr) {
      FLUXON_ASSIGN_OR_RETURN(
          node->remote_master_,
          MakeGrpcMasterClient(config.owner->master_address, *node->grpc_security_));
      master = node->remote_master_.get();
    }
    node->master_for_owner_ = std::make_unique<FaultInjectingMaster>(master, &node->faults_);
    OwnerRuntime rt;
    rt.node_id = config.node_id;
    rt.role = config.role;
    rt.faults = &node->faults_;
    if (!config.owner->data_address.empty()) {
      // Bound before the owner registers, so the master learns the endpoint peers can reach.
      transport::TcpTransportOptions to;
      to.listen_address = config.owner->data_address;
      to.cluster_secret = cluster_secret;
      FLUXON_ASSIGN_OR_RETURN(node->data_plane_, transport::TcpTransport::Create(to));
      rt.data_address = node->data_plane_->endpoint();
      rt.data_plane = node->data_plane_.get();
    }
    FLUXON_ASSIGN_OR_RETURN(node->owner_,
                            OwnerCore::Create(*config.owner, node->master_for_owner_.get(), rt));
  }
  if (node->data_plane_) {
    const Segment& seg = node->owner_->memory().segment();
    FLUXON_RETURN_IF_ERROR(
        node->data_plane_->RegisterRegion(seg.generation(), seg.base(), seg.total_bytes()));
    // A new registration generation (the master expired this owner) is served from then on:
    // reads naming the old one, whose routes the master dropped, are refused.
    transport::Transport* plane = node->data_plane_.get();
    node->owner_->SetGenerationListener(
        [plane](uint64_t generation) { return plane->SetRegionGeneration(generation); });
    spdlog::info("data plane ({}) serving the segment on {}", node->data_plane_->name(),
                 node->data_plane_->endpoint());
  }
  FLUXON_ASSIGN_OR_RETURN(node->grpc_, GrpcServers::Start(node.get()));
  if (node->owner_) {
    FLUXON_RETURN_IF_ERROR(node->owner_->Start());
    if (config.role != Role::kRemoteCache) {
      FLUXON_ASSIGN_OR_RETURN(
          node->clients_,
          ClientServer::Start(node->owner_.get(), ClientServerOptions::FromConfig(*config.owner)));
    }
  }
  if (config.admin.metrics_port != 0) {
    FLUXON_ASSIGN_OR_RETURN(
        node->metrics_, MetricsExposer::Start(config.admin.metrics_address,
                                              config.admin.metrics_port, NodeCollectables(*node)));
    spdlog::info("metrics on http://{}:{}/metrics", config.admin.metrics_address,
                 node->metrics_->port());
  }
  return node;
}

FluxonNode::FluxonNode(Config config) : config_(std::move(config)) {}
FluxonNode::~FluxonNode() { Stop(); }

void FluxonNode::Stop() {
  // First end every wait a request may be in (fault delays, claims, commit backpressure), so
  // the servers below can join their threads without waiting out a timeout.
  faults_.Shutdown();
  if (owner_) owner_->BeginStop();
  if (metrics_) metrics_->Stop();
  if (clients_) clients_->Stop();
  if (grpc_) grpc_->Stop();
  if (owner_) owner_->Stop();
  if (data_plane_) (void)data_plane_->UnregisterRegion();  // NotFound when already done
}

std::string FluxonNode::StatusText() const {
  std::string out =
      absl::StrFormat("role=%s node_id=%d\n", RoleName(config_.role), config_.node_id);
  if (master_) {
    out += absl::StrFormat("master: %d routes, control on %s\n", master_->route_count(),
                           config_.master->listen_address);
  }
  if (owner_) {
    out += owner_->memory().StatusText();
    if (clients_) out += absl::StrFormat("clients: socket %s\n", config_.owner->socket_path);
  }
  out += absl::StrFormat("admin: %s\n", config_.admin.listen_address);
  if (metrics_) {
    out += absl::StrFormat("metrics: http://%s:%d/metrics\n", config_.admin.metrics_address,
                           metrics_->port());
  }
  return out;
}

std::string FluxonNode::admin_address() const {
  const std::string& configured = config_.admin.listen_address;
  const size_t colon = configured.rfind(':');
  const std::string host = colon == std::string::npos ? configured : configured.substr(0, colon);
  return absl::StrFormat("%s:%d", host, grpc_ ? grpc_->admin_port() : 0);
}

int FluxonNode::metrics_port() const { return metrics_ ? metrics_->port() : 0; }

std::string FluxonNode::data_address() const {
  return data_plane_ ? data_plane_->endpoint() : std::string();
}

}  // namespace fluxon
