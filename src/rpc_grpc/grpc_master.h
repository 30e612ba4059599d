// The master's control API over gRPC: the client an owner uses to reach a separate master, and
// the service that serves a MasterApi (MasterCore) to them. Every MasterApi call maps to one
// unary RPC of MasterService (proto/fluxon/v1/master.proto).
//
// Invariants: a transport failure surfaces as Unavailable or DeadlineExceeded (uncertain: the
// caller retries with the same identity, rpc/retry.h); every client call has a deadline.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "rpc/master_api.h"
#include "rpc_grpc/grpc_security.h"

namespace fluxon {

// A MasterApi over gRPC whose calls in flight can be ended at once: CancelInFlight makes each
// of them return Unavailable (its outcome is unknown, as for any lost answer). An owner following
// an elected master cancels the calls still waiting on a master that stopped leading (a paused
// one would hold them until their deadline).
class CancellableMasterApi : public MasterApi {
 public:
  virtual void CancelInFlight() = 0;
};

// A MasterApi over gRPC to `address` (host:port) with `security`'s credentials (mutual TLS when
// configured); each call waits at most `deadline`.
absl::StatusOr<std::unique_ptr<CancellableMasterApi>> MakeCancellableGrpcMasterClient(
    const std::string& address, const GrpcSecurity& security,
    std::chrono::milliseconds deadline = std::chrono::seconds(5));
absl::StatusOr<std::unique_ptr<MasterApi>> MakeGrpcMasterClient(
    const std::string& address, const GrpcSecurity& security,
    std::chrono::milliseconds deadline = std::chrono::seconds(5));
// The same over plaintext (loopback tests).
absl::StatusOr<std::unique_ptr<MasterApi>> MakeGrpcMasterClient(
    const std::string& address, std::chrono::milliseconds deadline = std::chrono::seconds(5));

// The gRPC service serving `master` (not owned; must outlive the service).
// `node_bound_certificates`: admit a node_id only from the certificate naming it (see
// NodeIdentityBinding in grpc_master.cc).
std::unique_ptr<grpc::Service> MakeMasterGrpcService(MasterApi* master,
                                                     bool node_bound_certificates = false);
// The node a certificate is issued to: its Common Name is "fluxon-node-<id>" (decimal, no
// leading zeros, below 2^20). Empty for any other name.
std::optional<uint32_t> CertificateNode(const std::string& common_name);
// The node the caller's verified certificate is issued to (CertificateNode of its Common Name);
// empty without TLS or for a certificate naming no node.
std::optional<uint32_t> PeerCertificateNode(const grpc::ServerContext& ctx);

// gRPC message size limit of every control channel and server, set explicitly (gRPC's default
// receive limit is 4 MiB). No request or answer of ours comes near it: the client splits master
// calls so that one message carries at most kMasterCallKeyBytes of keys (below).
inline constexpr int kGrpcMaxMessageBytes = 64 << 20;
// Key bytes per master RPC: calls whose keys would exceed it are split into several RPCs (each
// item keeps its own identity, so a retried part is idempotent like the whole, T1). 1 MiB of
// keys stays far below kGrpcMaxMessageBytes for every request and answer (an answer repeats a
// key at most once, with under 100 bytes of route per location).
inline constexpr size_t kMasterCallKeyBytes = 1 << 20;
// Reconnect backoff of the control channels: a restarted master is found again within about
// one second, not gRPC's default exponential backoff (up to 120 s).
inline constexpr int kGrpcMinReconnectMs = 100;
inline constexpr int kGrpcMaxReconnectMs = 1000;

// Channel arguments of every control channel a node opens (message limits, reconnect backoff).
grpc::ChannelArguments ControlChannelArgs();
// Applies the message limits to a server.
void ApplyServerLimits(grpc::ServerBuilder* builder);

// absl <-> gRPC status, code for code.
grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace fluxon
