// LeaderFollowingMaster: the master as an owner of a cluster with standby masters sees it. It
// reads the leadership key in etcd (ha/master_election.h: the value is the leader's master
// address, create_revision its epoch) and sends every call to the leader named there.
//
// Invariants:
// - The key is read every poll interval, and at once after a call failed with Unavailable (the
//   master it reached may be a standby or deposed); the client of a leader is made once per
//   address and replaced when the key names another. The calls still waiting on the old one are
//   cancelled then (they end as Unavailable and are retried at the new leader): a paused or
//   partitioned old leader would otherwise hold each of them until its deadline.
// - Fencing: etcd's epochs only grow, and an elected master stamps its leadership's epoch on
//   every answer. An answer carrying an epoch below the highest one read from etcd comes from a
//   deposed master and is returned as Unavailable (uncertain: the caller retries at the leader),
//   never as an outcome.
// - etcd unreachable: calls keep going to the last leader read (it serves until its own lease
//   ends); no leader known yet: calls fail with Unavailable, which every caller treats as an
//   uncertain outcome and retries within its own bounds.
// - Every etcd read has a deadline; Stop ends the reader thread at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "ha/etcd_client.h"
#include "rpc/forwarding_master.h"
#include "rpc_grpc/grpc_master.h"

namespace fluxon {

struct LeaderFollowingOptions {
  std::vector<std::string> endpoints;  // etcd members, host:port
  std::string key;                     // the leadership key the masters campaign for
  std::chrono::milliseconds poll_interval{200};
  std::chrono::milliseconds call_deadline{1000};               // each etcd read
  std::shared_ptr<grpc::ChannelCredentials> etcd_credentials;  // TLS to etcd (null: plaintext)
};

class LeaderFollowingMaster final : public ForwardingMaster<LeaderFollowingMaster> {
 public:
  // Makes the client of the master at one address.
  using Dialer =
      std::function<absl::StatusOr<std::unique_ptr<CancellableMasterApi>>(const std::string&)>;

  static absl::StatusOr<std::unique_ptr<LeaderFollowingMaster>> Start(
      LeaderFollowingOptions options, Dialer dial);
  ~LeaderFollowingMaster() override;
  LeaderFollowingMaster(const LeaderFollowingMaster&) = delete;
  LeaderFollowingMaster& operator=(const LeaderFollowingMaster&) = delete;
  void Stop();

  struct Leader {
    std::string address;  // empty: none known
    int64_t epoch = 0;
  };
  // The leader as last read from etcd.
  Leader leader() const;
  // Waits (bounded) until a leader is known.
  bool WaitLeader(std::chrono::milliseconds timeout) const;

 private:
  LeaderFollowingMaster(LeaderFollowingOptions options, Dialer dial,
                        std::unique_ptr<EtcdClient> etcd);
  void Run();
  // One read of the key; switches the client when it names another leader.
  void Refresh();
  // Asks the reader for a read now (a call met a master that may not lead).
  void Kick();
  friend class ForwardingMaster<LeaderFollowingMaster>;
  template <typename Reply, typename Request>
  absl::StatusOr<Reply> Forward(const Request& r,
                                absl::StatusOr<Reply> (MasterApi::*method)(const Request&));

  const LeaderFollowingOptions options_;
  const Dialer dial_;
  const std::unique_ptr<EtcdClient> etcd_;
  // The highest epoch read from etcd: answers below it are a deposed master's.
  std::atomic<int64_t> highest_epoch_{0};
  mutable Mutex mu_;
  mutable CondVar changed_;
  // The leader's client, shared with the calls using it.
  std::shared_ptr<CancellableMasterApi> client_ ABSL_GUARDED_BY(mu_);
  Leader leader_ ABSL_GUARDED_BY(mu_);
  std::string last_problem_ ABSL_GUARDED_BY(mu_);  // why no leader is known, for errors
  bool kicked_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace fluxon
