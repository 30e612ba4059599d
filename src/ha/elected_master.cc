#include "ha/elected_master.h"

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace fluxon {

ElectedMaster::ElectedMaster(ElectedMasterOptions options) : options_(std::move(options)) {}

ElectedMaster::~ElectedMaster() { Stop(); }

absl::Status ElectedMaster::Campaign(const std::string& advertised,
                                     const std::string& admin_address) {
  ElectionOptions eo = options_.election;
  eo.value = advertised;
  eo.admin_address = admin_address;
  {
    MutexLock lock(&mu_);
    if (stopped_) return absl::FailedPreconditionError("the master is stopping");
    if (election_) return absl::FailedPreconditionError("already campaigning");
  }
  absl::StatusOr<std::unique_ptr<MasterElection>> e = MasterElection::Start(std::move(eo));
  if (!e.ok()) return e.status();
  spdlog::info("master: campaigning for {} in etcd as {} (admin {})", options_.election.key,
               advertised, admin_address);
  MutexLock lock(&mu_);
  election_ = std::move(*e);
  return absl::OkStatus();
}

void ElectedMaster::Stop() {
  std::shared_ptr<MasterElection> election;
  std::shared_ptr<MasterCore> core;
  {
    MutexLock lock(&mu_);
    stopped_ = true;
    election = std::move(election_);
    core = std::move(core_);
    core_epoch_ = 0;
  }
  // Outside the lock: revoking the lease is an etcd call (bounded by its deadline).
  if (election) election->Stop();
}

std::shared_ptr<MasterElection> ElectedMaster::election() const {
  MutexLock lock(&mu_);
  return election_;
}

bool ElectedMaster::leading() const {
  const std::shared_ptr<MasterElection> e = election();
  return e && e->IsLeaderNow();
}

Leadership ElectedMaster::observed() const {
  const std::shared_ptr<MasterElection> e = election();
  return e ? e->Observed() : Leadership{};
}

std::shared_ptr<MasterCore> ElectedMaster::current() const {
  MutexLock lock(&mu_);
  const int64_t epoch = election_ ? election_->LeaderEpoch() : 0;
  return epoch != 0 && epoch == core_epoch_ ? core_ : nullptr;
}

std::shared_ptr<MasterCore> ElectedMaster::CurrentCore(int64_t* epoch_out) {
  // Declared before the lock: a retired core is destroyed (its maintenance thread joined) after
  // the lock is released.
  std::shared_ptr<MasterCore> retired;
  MutexLock lock(&mu_);
  // Read under the lock: every retirement and creation follows the leadership as it is at that
  // moment, so a caller that looked at the election earlier can neither retire the core of a
  // leadership that began since nor create one for a leadership that ended (epochs only grow).
  const int64_t epoch = !stopped_ && election_ ? election_->LeaderEpoch() : 0;
  *epoch_out = epoch;
  if (epoch <= 0) {
    if (core_ != nullptr && !stopped_) {
      spdlog::warn("master: leadership of epoch {} ended; its {} routes are dropped", core_epoch_,
                   core_->route_count());
    }
    retired = std::move(core_);
    core_epoch_ = 0;
    return nullptr;
  }
  if (epoch != core_epoch_) {
    retired = std::move(core_);
    core_ = std::make_shared<MasterCore>(options_.master, static_cast<uint64_t>(epoch), counters_);
    core_->StartMaintenance(options_.maintenance_interval);
    core_epoch_ = epoch;
    spdlog::info(
        "master: leading with epoch {}: an empty route table, filled by the owners' republish",
        epoch);
  }
  return core_;
}

absl::Status ElectedMaster::NotLeader() const {
  const Leadership l = observed();
  if (l.known && !l.mine) {
    return absl::UnavailableError(absl::StrFormat(
        "this master does not lead; the leader is %s (epoch %d)", l.value, l.epoch));
  }
  return absl::UnavailableError("this master does not lead (no leader known to it now)");
}

template <typename Reply, typename Request>
absl::StatusOr<Reply> ElectedMaster::Forward(
    const Request& r, absl::StatusOr<Reply> (MasterApi::*method)(const Request&)) {
  const std::shared_ptr<MasterElection> e = election();
  int64_t epoch = 0;
  const std::shared_ptr<MasterCore> core = e ? CurrentCore(&epoch) : nullptr;
  if (core == nullptr) return NotLeader();
  absl::StatusOr<Reply> reply = ((*core).*method)(r);
  // An answer leaves only from a master that still leads in the same epoch: a call that began
  // before the lease ended says nothing after it (its outcome is uncertain to the caller).
  if (e->LeaderEpoch() != epoch) {
    return absl::UnavailableError(
        absl::StrFormat("this master's leadership (epoch %d) ended during the call", epoch));
  }
  return reply;
}

}  // namespace fluxon
