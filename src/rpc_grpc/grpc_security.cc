#include "rpc_grpc/grpc_security.h"

#include "absl/strings/str_join.h"

namespace fluxon {

absl::StatusOr<GrpcSecurity> GrpcSecurity::FromConfig(const SecurityConfig& config) {
  if (!config.tls) return Plaintext();
  absl::StatusOr<security::TlsMaterial> m = security::LoadTlsMaterial(*config.tls);
  if (!m.ok()) return m.status();
  return MutualTls(std::move(*m));
}

std::shared_ptr<grpc::ServerCredentials> GrpcSecurity::ServerCredentials() const {
  if (!material_) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = material_->ca_certs;
  o.pem_key_cert_pairs.push_back({material_->private_key, material_->cert_chain});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> GrpcSecurity::ChannelCredentials() const {
  if (!material_) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = material_->ca_certs;
  o.pem_private_key = material_->private_key;
  o.pem_cert_chain = material_->cert_chain;
  return grpc::SslCredentials(o);
}

std::shared_ptr<grpc::Channel> GrpcSecurity::Channel(const std::string& target,
                                                     grpc::ChannelArguments args,
                                                     const std::string& tls_name) const {
  if (material_ && !tls_name.empty()) args.SetSslTargetNameOverride(tls_name);
  return grpc::CreateCustomChannel(target, ChannelCredentials(), args);
}

bool GrpcSecurity::PeerAuthenticated(const grpc::ServerContext& ctx) {
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  return auth != nullptr && auth->IsPeerAuthenticated();
}

std::string GrpcSecurity::PeerIdentity(const grpc::ServerContext& ctx) {
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return "";
  std::vector<std::string> ids;
  for (const grpc::string_ref& id : auth->GetPeerIdentity()) ids.emplace_back(id.data(), id.size());
  return absl::StrJoin(ids, ",");
}

}  // namespace fluxon
