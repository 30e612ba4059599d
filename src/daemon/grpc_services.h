// gRPC control services of one fluxond: MasterService (master and embedded roles) and
// AdminService (every role; what fluxonctl talks to), plus the gRPC client an owner uses to reach
// a separate master.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "master/master_api.h"

namespace fluxon {

class FluxonNode;

// A MasterApi over gRPC. Transport failures surface as Unavailable/DeadlineExceeded (uncertain
// outcome: the caller retries with the same identity).
absl::StatusOr<std::unique_ptr<MasterApi>> MakeGrpcMasterClient(const std::string& address);

class GrpcServers {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcServers>> Start(FluxonNode* node);
  ~GrpcServers();
  void Stop();
  // The port the admin service is bound to (the configured one, or the one the kernel picked for
  // a ":0" address).
  int admin_port() const;

  class Impl;

 private:
  explicit GrpcServers(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon
