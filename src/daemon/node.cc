#include "daemon/node.h"

#include "absl/strings/str_format.h"
#include "daemon/grpc_services.h"
#include "daemon/metrics.h"
#include "daemon/metrics_exposer.h"
#include "fluxon/status.h"
#include "fluxon/units.h"
#include "rpc/fault_injecting_master.h"
#include "rpc/fault_injecting_peers.h"
#include "rpc_grpc/grpc_peer.h"
#include "rpc_grpc/grpc_security.h"
#include "security/security_files.h"
#include "spdlog/spdlog.h"
#include "transport/tcp/tcp_transport.h"

namespace fluxon {

namespace {

// The data plane's secret: the configured file, else (a loopback cluster on one machine: the
// start-up rule refuses anything else) the machine-local one every fluxond of this user shares;
// only security.insecure serves with no secret at all. Empty without a data plane.
absl::StatusOr<std::string> DataPlaneSecret(const Config& config) {
  if (!config.security.cluster_secret_file.empty()) {
    return security::LoadClusterSecret(config.security.cluster_secret_file);
  }
  if (!config.owner || config.owner->data_address.empty()) return std::string();
  if (config.security.insecure) {
    spdlog::warn(
        "data plane without a cluster secret (security.insecure): any local process can read "
        "this owner's segment through it");
    return std::string();
  }
  const std::string path = security::MachineSecretPath();
  FLUXON_ASSIGN_OR_RETURN(std::string secret, security::LoadOrCreateMachineSecret(path));
  spdlog::info("data plane: machine-local cluster secret {}", path);
  return secret;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FluxonNode>> FluxonNode::Start(const Config& config) {
  FLUXON_RETURN_IF_ERROR(CheckListenSecurity(config));
  std::unique_ptr<FluxonNode> node(new FluxonNode(config));
  FLUXON_ASSIGN_OR_RETURN(GrpcSecurity grpc_security, GrpcSecurity::FromConfig(config.security));
  node->grpc_security_ = std::make_unique<GrpcSecurity>(std::move(grpc_security));
  if (node->grpc_security_->tls()) {
    spdlog::info("gRPC: mutual TLS (certificate {}, CA {})", config.security.tls->cert_file,
                 config.security.tls->ca_file);
  }
  FLUXON_ASSIGN_OR_RETURN(const std::string cluster_secret, DataPlaneSecret(config));
  for (const FaultConfig& f : config.faults) {
    FLUXON_ASSIGN_OR_RETURN(FaultAction action, ParseFaultAction(f.action));
    node->faults_.Set(FaultRule{f.point, action, f.delay, f.count});
  }
  if (RoleHasMaster(config.role)) FLUXON_RETURN_IF_ERROR(node->StartMaster());
  if (RoleHasOwner(config.role)) FLUXON_RETURN_IF_ERROR(node->StartOwner(cluster_secret));
  if (node->data_plane_) FLUXON_RETURN_IF_ERROR(node->ServeSegment());
  FLUXON_RETURN_IF_ERROR(node->StartServers());
  return node;
}

absl::Status FluxonNode::StartMaster() {
  master_ = std::make_unique<MasterCore>(MasterOptions::FromConfig(*config_.master));
  master_->StartMaintenance(std::chrono::milliseconds(100));
  return absl::OkStatus();
}

absl::Status FluxonNode::StartOwner(const std::string& cluster_secret) {
  MasterApi* master = master_.get();
  if (master == nullptr) {
    FLUXON_ASSIGN_OR_RETURN(remote_master_,
                            MakeGrpcMasterClient(config_.owner->master_address, *grpc_security_));
    master = remote_master_.get();
  }
  master_for_owner_ = std::make_unique<FaultInjectingMaster>(master, &faults_);
  OwnerRuntime rt;
  rt.node_id = config_.node_id;
  rt.role = config_.role;
  rt.faults = &faults_;
  peers_ = MakeGrpcPeerClient(*grpc_security_);
  peers_for_owner_ = std::make_unique<FaultInjectingPeers>(peers_.get(), &faults_);
  rt.peers = peers_for_owner_.get();
  if (!config_.owner->data_address.empty()) {
    // Bound before the owner registers, so the master learns the endpoint peers can reach.
    transport::TcpTransportOptions to;
    to.listen_address = config_.owner->data_address;
    to.cluster_secret = cluster_secret;
    FLUXON_ASSIGN_OR_RETURN(data_plane_, transport::TcpTransport::Create(to));
    rt.data_address = data_plane_->endpoint();
    rt.data_plane = data_plane_.get();
  }
  FLUXON_ASSIGN_OR_RETURN(owner_, OwnerCore::Create(*config_.owner, master_for_owner_.get(), rt));
  return absl::OkStatus();
}

absl::Status FluxonNode::ServeSegment() {
  const Segment& seg = owner_->memory().segment();
  FLUXON_RETURN_IF_ERROR(
      data_plane_->RegisterRegion(seg.generation(), seg.base(), seg.total_bytes()));
  // A new registration generation (the master expired this owner) is served from then on:
  // reads naming the old one, whose routes the master dropped, are refused.
  transport::Transport* plane = data_plane_.get();
  owner_->SetGenerationListener(
      [plane](uint64_t generation) { return plane->SetRegionGeneration(generation); });
  spdlog::info("data plane ({}) serving the segment on {}", data_plane_->name(),
               data_plane_->endpoint());
  return absl::OkStatus();
}

absl::Status FluxonNode::StartServers() {
  FLUXON_ASSIGN_OR_RETURN(grpc_, GrpcServers::Start(this));
  if (owner_) {
    // An owner that reads peers (a data plane) takes replicas: sources reach its peer service
    // on the admin port, registered with the master before the first registration.
    if (data_plane_) owner_->SetPeerAddress(PeerServiceAddress());
    FLUXON_RETURN_IF_ERROR(owner_->Start());
    if (config_.role != Role::kRemoteCache) {
      FLUXON_ASSIGN_OR_RETURN(
          clients_,
          ClientServer::Start(owner_.get(), ClientServerOptions::FromConfig(*config_.owner)));
    }
  }
  if (config_.admin.metrics_port != 0) {
    FLUXON_ASSIGN_OR_RETURN(
        metrics_, MetricsExposer::Start(config_.admin.metrics_address, config_.admin.metrics_port,
                                        NodeCollectables(*this)));
    spdlog::info("metrics on http://{}:{}/metrics", config_.admin.metrics_address,
                 metrics_->port());
  }
  return absl::OkStatus();
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

std::string FluxonNode::PeerServiceAddress() const {
  // A wildcard admin address is reachable at the data plane's host (peers reach that one).
  std::string address = admin_address();
  const size_t colon = address.rfind(':');
  const std::string host = address.substr(0, colon);
  if (host == "0.0.0.0" || host == "[::]" || host == "::") {
    const std::string data = data_address();
    const size_t data_colon = data.rfind(':');
    if (data_colon != std::string::npos)
      address = data.substr(0, data_colon) + address.substr(colon);
  }
  return address;
}

int FluxonNode::metrics_port() const { return metrics_ ? metrics_->port() : 0; }

std::string FluxonNode::data_address() const {
  return data_plane_ ? data_plane_->endpoint() : std::string();
}

}  // namespace fluxon
