// ElectedMaster: the master role of a cluster with standby masters. Every candidate runs one;
// the etcd election (MasterElection) decides which one serves.
//
// Invariants:
// - A call is served only while this candidate leads (MasterElection::IsLeaderNow: the key is
//   its and its lease is valid by the local clock), and its answer leaves only if the candidate
//   still leads, in the same epoch, when the call ends. Otherwise the call fails with
//   Unavailable ("not the leader", naming the leader when one is known): an uncertain outcome,
//   which the owners' retries carry to the leader they follow (ha/leader_following_master.h).
//   A master paused past its lease therefore answers nothing after it wakes.
// - Each leadership serves its own MasterCore, created empty when the leadership begins and
//   stamped with the leadership's epoch (etcd's create_revision: it only grows), so every answer
//   carries the epoch and an owner that sees a new one republishes what it holds (the new
//   leader is filled by the owners' republish: no log, nothing to replay). A core is never
//   served again once its leadership ended, even when this candidate wins the next one: the
//   routes it held may have been removed at another leader meanwhile.
// - Counters are one set for the process (shared by its cores), so its metrics continue across
//   leaderships.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "ha/master_election.h"
#include "master/master_core.h"
#include "rpc/forwarding_master.h"

namespace fluxon {

struct ElectedMasterOptions {
  ElectionOptions election;  // its value and admin address are set by Campaign
  MasterOptions master;
  std::chrono::milliseconds maintenance_interval{100};  // each core's ExpireDue period
};

class ElectedMaster final : public ForwardingMaster<ElectedMaster> {
 public:
  explicit ElectedMaster(ElectedMasterOptions options);
  ~ElectedMaster() override;
  ElectedMaster(const ElectedMaster&) = delete;
  ElectedMaster& operator=(const ElectedMaster&) = delete;

  // Starts campaigning with `advertised` (the master service's address owners dial) as the
  // published value and `admin_address` (fluxonctl's; empty: none) beside it
  // (ha/leader_record.h). Until then every call is refused.
  absl::Status Campaign(const std::string& advertised, const std::string& admin_address);
  // Gives the leadership up (the key goes at once: a standby takes over without waiting out the
  // TTL) and refuses every call from then on.
  void Stop();

  // The core of the current leadership; null while this candidate does not lead.
  std::shared_ptr<MasterCore> current() const;
  bool leading() const;
  // The leadership as last observed (whoever leads), for status and metrics.
  Leadership observed() const;
  const MasterCounters& counters() const { return *counters_; }

 private:
  // The core of the leadership current now (made when it begins) and its epoch; null (epoch 0)
  // while this candidate does not lead, and then the last leadership's core is dropped.
  std::shared_ptr<MasterCore> CurrentCore(int64_t* epoch);
  std::shared_ptr<MasterElection> election() const;
  absl::Status NotLeader() const;
  friend class ForwardingMaster<ElectedMaster>;
  // Runs one call on the current leadership's core (see the invariants).
  template <typename Reply, typename Request>
  absl::StatusOr<Reply> Forward(const Request& r,
                                absl::StatusOr<Reply> (MasterApi::*method)(const Request&));

  const ElectedMasterOptions options_;
  const std::shared_ptr<MasterCounters> counters_ = std::make_shared<MasterCounters>();
  mutable Mutex mu_;
  // Shared with the calls using it (Stop takes it away; a call in flight keeps it alive).
  std::shared_ptr<MasterElection> election_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<MasterCore> core_ ABSL_GUARDED_BY(mu_);
  int64_t core_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace fluxon
