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
#include <string>

#include "absl/status/statusor.h"
#include "rpc/grpc_security.h"
#include "rpc/master_api.h"

namespace fluxon {

// A MasterApi over gRPC to `address` (host:port) with `security`'s credentials (mutual TLS when
// configured); each call waits at most `deadline`.
absl::StatusOr<std::unique_ptr<MasterApi>> MakeGrpcMasterClient(
    const std::string& address, const GrpcSecurity& security,
    std::chrono::milliseconds deadline = std::chrono::seconds(5));
// The same over plaintext (loopback tests).
absl::StatusOr<std::unique_ptr<MasterApi>> MakeGrpcMasterClient(
    const std::string& address, std::chrono::milliseconds deadline = std::chrono::seconds(5));

// The gRPC service serving `master` (not owned; must outlive the service).
std::unique_ptr<grpc::Service> MakeMasterGrpcService(MasterApi* master);

// absl <-> gRPC status, code for code.
grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace fluxon
