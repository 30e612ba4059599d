// gRPC control services of one fluxond: MasterService (master and embedded roles, from
// rpc_grpc/grpc_master.h) and AdminService (every role; what fluxonctl talks to).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rpc_grpc/grpc_master.h"

namespace fluxon {

class FluxonNode;

class GrpcServers {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcServers>> Start(FluxonNode* node);
  ~GrpcServers();
  void Stop();
  // The port the admin service is bound to (the configured one, or the one the kernel picked for
  // a ":0" address).
  int admin_port() const;
  // The port the master service is bound to (0 on roles without a master).
  int master_port() const;

  class Impl;

 private:
  explicit GrpcServers(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon
