// The RDMA transport's queue-pair/MR exchange over the owners' gRPC peer service
// (proto/fluxon/v1/peer.proto), on the node's credentials (GrpcSecurity: mutual TLS when
// security.tls is set). It replaces InProcessVerbsExchange outside one process.
//
//   serving side:  PeerServiceImpl answers ConnectQp / ReleaseQp by calling the VerbsAcceptor
//                  published under the request's node name (or the only one published: one
//                  transport per process, whose name a peer may spell differently, e.g. an
//                  interface address for 0.0.0.0).
//   initiator:     Connect(peer, ...) dials `peer` (host:port of the serving node's peer service,
//                  which is also that transport's node name) and calls ConnectQp.
//
// Invariants and why:
// - QP numbers, GIDs, addresses and rkeys never travel on an unauthenticated channel: with TLS a
//   caller without a certificate of the cluster's CA is refused in the handshake, so it never
//   learns an rkey and the acceptor never creates a queue pair for it.
// - The acceptor is never called after Withdraw returned (the service holds its mutex across the
//   call), and a malformed request (GID not 16 bytes, LID over 16 bits) is InvalidArgument before
//   any queue pair exists.
// - Every call has a deadline (connect_timeout); a lost or late answer is Unavailable /
//   DeadlineExceeded for the batch that needed it, and a queue pair the answer named is released
//   by the serving side when the initiator's QP never connects (the transport's own teardown).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/mutex.h"
#include "fluxon/v1/peer.grpc.pb.h"
#include "rpc_grpc/grpc_security.h"
#include "transport/verbs/verbs_transport.h"

namespace fluxon {

class GrpcVerbsExchange final : public transport::verbs::VerbsExchange {
 public:
  explicit GrpcVerbsExchange(GrpcSecurity security,
                             std::chrono::milliseconds call_timeout = std::chrono::seconds(5));
  ~GrpcVerbsExchange() override;

  // The service to register on the node's gRPC server (it must outlive the server's use of it).
  grpc::Service* service();

  void Publish(const std::string& name, transport::verbs::VerbsAcceptor* acceptor) override;
  void Withdraw(const std::string& name, transport::verbs::VerbsAcceptor* acceptor) override;
  absl::StatusOr<std::pair<transport::verbs::QpAddress, transport::verbs::RegionInfo>> Connect(
      const std::string& peer, const transport::verbs::QpAddress& initiator) override;
  void Disconnect(const std::string& peer, uint32_t remote_qp_num, uint32_t local_qp_num) override;

  class Service;

 private:
  v1::PeerService::Stub* StubFor(const std::string& peer);

  const GrpcSecurity security_;
  const std::chrono::milliseconds call_timeout_;
  std::unique_ptr<Service> service_;
  Mutex stubs_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<v1::PeerService::Stub>> stubs_
      ABSL_GUARDED_BY(stubs_mu_);
};

}  // namespace fluxon
