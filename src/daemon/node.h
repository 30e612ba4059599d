// FluxonNode: one fluxond's components, assembled from its config by role.
//   embedded:     MasterCore + OwnerCore (in-process master calls) + client socket + admin
//   master:       MasterCore served over gRPC + admin; with `election:` an ElectedMaster instead
//                 (a fresh MasterCore per leadership won in etcd; a standby refuses every call)
//   owner:        OwnerCore with a gRPC master client + client socket + admin (+ the data plane
//                 serving its segment when owner.data_address is set); with `election:` the
//                 client follows whichever master leads (LeaderFollowingMaster)
//   remote_cache: OwnerCore with a gRPC master client (no local clients) + admin
// Every master call an owner makes passes through the fault injector (points "master.<Method>").
//
// Security (config `security:`): CheckListenSecurity is applied first, then the TLS files and the
// cluster secret are read and checked, before anything listens; a node that cannot authenticate
// its peers as configured does not start.
//
// With admin.metrics_port != 0 the node also serves Prometheus metrics over HTTP
// (admin.metrics_address:metrics_port, path /metrics).
//
// Invariants: components start in dependency order and stop in reverse (the metrics endpoint and
// sockets first, so no request or scrape arrives at a stopped core; the owner before the master
// it publishes to). Stop first ends every wait a request can be in (fault delays, slot claims,
// publish backpressure), so it finishes within a bound whatever the load or the master's state.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/fault_injector.h"
#include "config/config.h"
#include "ha/elected_master.h"
#include "ha/leader_following_master.h"
#include "master/master_core.h"
#include "owner/client_server.h"
#include "owner/owner_core.h"
#include "rpc/peer_api.h"

namespace fluxon {

class GrpcServers;
class GrpcSecurity;
class MetricsExposer;
namespace transport {
class Transport;
}

class FluxonNode {
 public:
  static absl::StatusOr<std::unique_ptr<FluxonNode>> Start(const Config& config);
  ~FluxonNode();
  void Stop();

  const Config& config() const { return config_; }
  // The master core serving now: the node's own (roles embedded and master), or the current
  // leadership's of an elected master (null while it stands by); null on roles without one.
  std::shared_ptr<MasterCore> master() const;
  // The master counters of this process (they continue across an elected master's leaderships);
  // null on roles without a master.
  const MasterCounters* master_counters() const;
  // The master API the node's calls go to: its own master (what its master service serves), or
  // an owner's client of the cluster's master. Null on neither.
  MasterApi* master_api() const;
  // The election of role master with `election:` (null otherwise).
  const ElectedMaster* elected_master() const { return elected_.get(); }
  // The leader an owner with `election:` follows (null otherwise).
  const LeaderFollowingMaster* followed_master() const { return followed_; }
  OwnerCore* owner() { return owner_.get(); }
  FaultInjector& faults() { return faults_; }
  std::string StatusText() const;
  std::chrono::steady_clock::time_point started_at() const { return started_at_; }
  size_t client_sessions() const { return clients_ ? clients_->sessions() : 0; }
  // The client socket server (null on roles without local clients).
  const ClientServer* client_server() const { return clients_.get(); }
  // Where the admin service and the metrics endpoint are bound (ports the kernel picked for
  // ":0" addresses); metrics_port() is 0 when metrics are disabled.
  std::string admin_address() const;
  int metrics_port() const;
  // The data-plane endpoint this owner serves its segment on (empty without a data plane).
  std::string data_address() const;
  // Where sources reach this owner's peer service (PullReplicas): the admin address, at the
  // data plane's host when the admin service listens on a wildcard.
  std::string PeerServiceAddress() const;
  // The credentials of every gRPC server and channel of this node (security.tls or plaintext).
  const GrpcSecurity& grpc_security() const { return *grpc_security_; }

 private:
  explicit FluxonNode(Config config);
  // The start-up steps, in order (each owns one part of the node).
  absl::Status StartMaster();
  absl::Status StartOwner(const std::string& cluster_secret);
  absl::Status ServeSegment();  // the data plane serves the owner's segment
  absl::Status StartServers();  // gRPC, the owner and its client socket, /metrics
  absl::Status Campaign();      // an elected master publishes its bound address in etcd

  Config config_;
  std::unique_ptr<GrpcSecurity> grpc_security_;
  FaultInjector faults_;
  std::shared_ptr<MasterCore> master_;
  std::unique_ptr<ElectedMaster> elected_;
  std::unique_ptr<MasterApi> remote_master_;
  LeaderFollowingMaster* followed_ = nullptr;  // remote_master_ when it follows an election
  std::unique_ptr<MasterApi> master_for_owner_;
  // The owners' peer service as a client (the replica pulls this owner asks for). Declared
  // before owner_: it outlives the owner's threads and its stop, which cancel its calls.
  std::unique_ptr<PeerApi> peers_;
  std::unique_ptr<PeerApi> peers_for_owner_;  // peers_ through the fault points "peer.<Method>"
  std::unique_ptr<OwnerCore> owner_;
  // The data plane serving the owner's segment to peers. Declared after owner_: destroyed (and
  // its region unregistered) before the owner's memory goes.
  std::unique_ptr<transport::Transport> data_plane_;
  std::unique_ptr<ClientServer> clients_;
  std::unique_ptr<GrpcServers> grpc_;
  std::unique_ptr<MetricsExposer> metrics_;
  std::chrono::steady_clock::time_point started_at_ = std::chrono::steady_clock::now();
};

}  // namespace fluxon
