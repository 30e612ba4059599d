// The leadership record in etcd: what an elected master publishes and how a reader finds it.
//
//   <key>         the leader's master address (owners dial it); its create_revision is the
//                 leadership's epoch
//   <key>/admin   the leader's admin address (fluxonctl reaches the leader through it)
//
// Both are written by one transaction on the leader's lease (MasterElection), so they appear
// and vanish together; a reader takes both at one revision and checks that they come from the
// same leadership (equal create_revision).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "ha/etcd_client.h"

namespace fluxon {

// The key holding the leader's admin address beside the leadership key `key`.
std::string LeaderAdminKey(const std::string& key);

struct LeaderRecord {
  std::string master_address;
  std::string admin_address;
  int64_t epoch = 0;
};

// The current leader's record. NotFound: no master leads (the key is empty); FailedPrecondition:
// the leader publishes no admin address (a master that predates it); etcd's errors as they come.
absl::StatusOr<LeaderRecord> ReadLeaderRecord(EtcdClient& etcd, const std::string& key);

}  // namespace fluxon
