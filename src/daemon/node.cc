#include "daemon/node.h"

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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
  if (node->elected_) FLUXON_RETURN_IF_ERROR(node->Campaign());
  return node;
}

namespace {

// TLS to etcd with the node's own certificate when security.tls is set (etcd then verifies it
// against the same CA); plaintext otherwise.
std::shared_ptr<grpc::ChannelCredentials> EtcdCredentials(const GrpcSecurity& security) {
  return security.tls() ? security.ChannelCredentials() : nullptr;
}

}  // namespace

absl::Status FluxonNode::StartMaster() {
  const MasterOptions options = MasterOptions::FromConfig(*config_.master);
  if (!config_.election) {
    master_ = std::make_shared<MasterCore>(options);
    master_->StartMaintenance(std::chrono::milliseconds(100));
    return absl::OkStatus();
  }
  const ElectionConfig& e = *config_.election;
  ElectedMasterOptions eo;
  eo.election.endpoints = e.endpoints;
  eo.election.key = e.key;
  eo.election.ttl_s = e.lease_ttl_s;
  eo.election.poll_interval = e.poll_interval;
  eo.election.etcd_credentials = EtcdCredentials(*grpc_security_);
  eo.master = options;
  elected_ = std::make_unique<ElectedMaster>(std::move(eo));
  return absl::OkStatus();
}

absl::Status FluxonNode::Campaign() {
  std::string advertised = config_.election->advertise_address;
  if (advertised.empty()) {
    // The config check refuses a wildcard listen address without advertise_address.
    advertised = JoinHostPort(HostOfAddress(config_.master->listen_address), grpc_->master_port());
  }
  // fluxonctl --etcd reaches the leader's admin service: a wildcard admin host is reachable at
  // the advertised master's host.
  std::string admin = admin_address();
  if (IsWildcardHost(HostOfAddress(admin))) {
    admin = JoinHostPort(HostOfAddress(advertised), grpc_->admin_port());
  }
  return elected_->Campaign(advertised, admin);
}

absl::Status FluxonNode::StartOwner(const std::string& cluster_secret) {
  MasterApi* master = master_.get();
  if (master == nullptr && config_.election) {
    const ElectionConfig& e = *config_.election;
    LeaderFollowingOptions fo;
    fo.endpoints = e.endpoints;
    fo.key = e.key;
    fo.poll_interval = e.poll_interval;
    fo.etcd_credentials = EtcdCredentials(*grpc_security_);
    const GrpcSecurity* security = grpc_security_.get();
    FLUXON_ASSIGN_OR_RETURN(
        std::unique_ptr<LeaderFollowingMaster> followed,
        LeaderFollowingMaster::Start(std::move(fo), [security](const std::string& address) {
          return MakeCancellableGrpcMasterClient(address, *security);
        }));
    // The owner registers at start: give the masters' campaign time to name a leader first
    // (without one, the registration's own bounded retries decide).
    if (!followed->WaitLeader(config_.owner->register_timeout)) {
      spdlog::warn("no master leads in etcd ({}, key {}) yet; registering anyway",
                   absl::StrJoin(e.endpoints, ","), e.key);
    }
    followed_ = followed.get();
    remote_master_ = std::move(followed);
    master = remote_master_.get();
  } else if (master == nullptr) {
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
  if (followed_) followed_->Stop();
  // Last: the lease is revoked, so a standby takes over at once instead of after the TTL.
  if (elected_) elected_->Stop();
}

std::shared_ptr<MasterCore> FluxonNode::master() const {
  if (elected_) return elected_->current();
  return master_;
}

const MasterCounters* FluxonNode::master_counters() const {
  if (elected_) return &elected_->counters();
  return master_ ? &master_->counters() : nullptr;
}

MasterApi* FluxonNode::master_api() const {
  if (elected_) return elected_.get();
  if (master_) return master_.get();
  return remote_master_.get();
}

std::string FluxonNode::StatusText() const {
  std::string out =
      absl::StrFormat("role=%s node_id=%d\n", RoleName(config_.role), config_.node_id);
  if (const std::shared_ptr<MasterCore> m = master()) {
    out += absl::StrFormat("master: %d routes, control on %s\n", m->route_count(),
                           config_.master->listen_address);
  }
  if (elected_) {
    const Leadership l = elected_->observed();
    out += absl::StrFormat(
        "election: %s (key %s), %s\n", elected_->leading() ? "leader" : "standby",
        config_.election->key,
        l.known ? absl::StrFormat("leader %s, epoch %d", l.value, l.epoch) : "no leader known");
  }
  if (followed_) {
    const LeaderFollowingMaster::Leader l = followed_->leader();
    out += absl::StrFormat("master (elected, key %s): %s\n", config_.election->key,
                           l.address.empty() ? std::string("none known")
                                             : absl::StrFormat("%s, epoch %d", l.address, l.epoch));
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
  if (IsWildcardHost(address.substr(0, colon))) {
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
