// MasterElection: one master candidate's campaign for the cluster's leadership key in etcd.
//
// The leader is the candidate whose value the key holds. The key is attached to the candidate's
// etcd lease, so it goes when the lease ends: the process died, was paused, or lost etcd for a
// TTL. The epoch of a leadership is the key's create_revision: etcd's revision only grows, so
// every new leadership has a larger epoch than every earlier one, and a call carrying an older
// epoch can be refused (fencing).
//
// Invariants:
// - IsLeaderNow() is true only while this candidate holds the key and its lease is valid by the
//   local monotonic clock (LeadershipTerm): a paused process (SIGSTOP past the TTL) wakes up no
//   longer leader without asking etcd, before anyone else could have been elected.
// - A leadership that ended by the local clock is never resumed, even when etcd later renews the
//   lease (a keep-alive answered late, etcd back from an outage): the candidate revokes that
//   lease and campaigns again, so its next leadership has a new epoch.
// - One thread runs the campaign (grant, create-if-absent, keep-alive, watch by polling); every
//   etcd call is bounded by the client's deadline, every wait by StopSignal.
// - Stop() revokes the lease: the key goes at once and a standby takes over without waiting out
//   the TTL.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "common/stop_signal.h"
#include "ha/etcd_client.h"
#include "ha/leadership_term.h"

namespace fluxon {

struct ElectionOptions {
  std::vector<std::string> endpoints;  // etcd members, host:port
  std::string key;                     // the leadership key, e.g. /fluxon/<cluster>/master/leader
  std::string value;                   // what this candidate publishes there (its address)
  std::string admin_address;  // published at LeaderAdminKey(key) with it (ha/leader_record.h)
  int64_t ttl_s = 5;          // the lease: how long a dead leader keeps the key
  std::chrono::milliseconds poll_interval{200};                // a standby's look at the key
  std::chrono::milliseconds call_deadline{1000};               // each etcd call
  std::shared_ptr<grpc::ChannelCredentials> etcd_credentials;  // TLS to etcd (null: plaintext)
};

// The leadership as last observed.
struct Leadership {
  bool known = false;  // a leader holds the key
  bool mine = false;   // ... and it is this candidate (IsLeaderNow says whether it still is)
  std::string value;   // the leader's published value
  int64_t epoch = 0;   // the key's create_revision
};

class MasterElection {
 public:
  static absl::StatusOr<std::unique_ptr<MasterElection>> Start(ElectionOptions options);
  ~MasterElection();
  MasterElection(const MasterElection&) = delete;
  MasterElection& operator=(const MasterElection&) = delete;

  bool IsLeaderNow() const;
  // This candidate's epoch while it leads, else 0.
  int64_t LeaderEpoch() const;
  Leadership Observed() const;
  // Waits (bounded) until this candidate leads.
  bool WaitLeader(std::chrono::milliseconds timeout) const;
  // Gives up: revokes the lease (the key goes at once) and ends the campaign thread.
  void Stop();

 private:
  using Clock = std::chrono::steady_clock;
  MasterElection(ElectionOptions options, std::unique_ptr<EtcdClient> etcd);
  void Run();
  // One step of the campaign; returns how long to wait before the next.
  std::chrono::milliseconds Step();
  void Lose(const char* why);
  // Lose(why), then revokes `lease` (best effort) so the key it holds goes at once.
  void GiveUp(int64_t lease, const char* why);

  const ElectionOptions options_;
  const std::unique_ptr<EtcdClient> etcd_;
  EtcdClient::KeyValues attached_;  // written with the key: the admin address (set once)
  StopSignal stop_;
  // Campaign state, written by the campaign thread only (read under mu_ by the others).
  mutable Mutex mu_;
  mutable CondVar changed_;
  int64_t lease_id_ ABSL_GUARDED_BY(mu_) = 0;
  LeadershipTerm term_ ABSL_GUARDED_BY(mu_);  // of lease_id_
  Leadership observed_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace fluxon
