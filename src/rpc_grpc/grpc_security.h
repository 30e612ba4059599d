// The gRPC credentials of one node (or of fluxonctl): mutual TLS from security.tls, or plaintext
// where the config has no TLS (loopback-only nodes, or security.insecure; see
// CheckListenSecurity in config/config.h).
//
// With TLS every server requires and verifies a client certificate chaining to the configured CA
// (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY), so a peer without one never gets
// as far as a call; every channel presents this side's certificate and verifies the server's
// against the same CA and the dialled host name.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "security/security_files.h"

namespace fluxon {

class GrpcSecurity {
 public:
  static GrpcSecurity Plaintext() { return GrpcSecurity(std::nullopt); }
  static GrpcSecurity MutualTls(security::TlsMaterial material) {
    return GrpcSecurity(std::move(material));
  }
  // Plaintext without security.tls; else the checked files (LoadTlsMaterial's errors).
  static absl::StatusOr<GrpcSecurity> FromConfig(const SecurityConfig& config);

  bool tls() const { return material_.has_value(); }
  const std::optional<security::TlsMaterial>& material() const { return material_; }
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;
  // A channel to `target` with these credentials. `tls_name` (TLS only, may be empty): the name
  // to verify the server's certificate against instead of target's host (the watchdog probe
  // dials its own node on loopback and checks it against the node's own certificate name).
  std::shared_ptr<grpc::Channel> Channel(const std::string& target,
                                         grpc::ChannelArguments args = {},
                                         const std::string& tls_name = "") const;

  // True when the call came over TLS from a peer whose certificate the CA verified.
  static bool PeerAuthenticated(const grpc::ServerContext& ctx);
  // The authenticated peer's name (its certificate's SAN/CN) for logs; empty when none.
  static std::string PeerIdentity(const grpc::ServerContext& ctx);

 private:
  explicit GrpcSecurity(std::optional<security::TlsMaterial> m) : material_(std::move(m)) {}
  std::optional<security::TlsMaterial> material_;
};

}  // namespace fluxon
