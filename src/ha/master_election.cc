#include "ha/master_election.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ha/leader_record.h"
#include "spdlog/spdlog.h"

namespace fluxon {
namespace {

// Taken off the lease's TTL when judging it locally: covers the keep-alive's own flight and a
// late wake-up of the campaign thread.
std::chrono::milliseconds Margin(int64_t ttl_s) {
  return std::min<std::chrono::milliseconds>(std::chrono::milliseconds(500),
                                             std::chrono::milliseconds(ttl_s * 1000 / 5));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MasterElection>> MasterElection::Start(ElectionOptions options) {
  if (options.key.empty()) return absl::InvalidArgumentError("election key is empty");
  if (options.value.empty()) return absl::InvalidArgumentError("election value is empty");
  if (options.ttl_s < 2 || options.ttl_s > 3600) {
    return absl::InvalidArgumentError(
        absl::StrCat("election TTL must be 2..3600 s, got ", options.ttl_s));
  }
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd =
      EtcdClient::Connect(options.endpoints, options.call_deadline, options.etcd_credentials);
  if (!etcd.ok()) return etcd.status();
  std::unique_ptr<MasterElection> e(new MasterElection(std::move(options), std::move(*etcd)));
  e->thread_ = std::thread([raw = e.get()] { raw->Run(); });
  return e;
}

MasterElection::MasterElection(ElectionOptions options, std::unique_ptr<EtcdClient> etcd)
    : options_(std::move(options)), etcd_(std::move(etcd)) {
  if (!options_.admin_address.empty()) {
    attached_.emplace_back(LeaderAdminKey(options_.key), options_.admin_address);
  }
}

MasterElection::~MasterElection() { Stop(); }

bool MasterElection::IsLeaderNow() const {
  MutexLock lock(&mu_);
  return term_.Leads(Clock::now());
}

int64_t MasterElection::LeaderEpoch() const {
  MutexLock lock(&mu_);
  return term_.Leads(Clock::now()) ? term_.epoch() : 0;
}

Leadership MasterElection::Observed() const {
  MutexLock lock(&mu_);
  return observed_;
}

bool MasterElection::WaitLeader(std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  MutexLock lock(&mu_);
  while (!term_.Leads(Clock::now())) {
    if (!changed_.WaitUntil(&mu_, deadline)) return term_.Leads(Clock::now());
  }
  return true;
}

void MasterElection::Stop() {
  if (!thread_.joinable()) return;
  stop_.Stop();
  thread_.join();
  int64_t lease = 0;
  {
    MutexLock lock(&mu_);
    lease = lease_id_;
    lease_id_ = 0;
    term_.End();
    changed_.SignalAll();
  }
  if (lease != 0) {
    if (absl::Status st = etcd_->RevokeLease(lease); !st.ok()) {
      spdlog::warn("election {}: revoking lease {:x}: {} (the key goes when it expires)",
                   options_.key, lease, st.ToString());
    }
  }
}

void MasterElection::Run() {
  while (!stop_.stopped()) {
    const std::chrono::milliseconds wait = Step();
    if (!stop_.SleepFor(wait)) return;
  }
}

void MasterElection::Lose(const char* why) {
  MutexLock lock(&mu_);
  if (term_.leading()) {
    spdlog::warn("election {}: leadership (epoch {}) lost: {}", options_.key, term_.epoch(), why);
  }
  term_.End();
  lease_id_ = 0;  // a new lease for the next campaign
  observed_.mine = false;
  changed_.SignalAll();
}

void MasterElection::GiveUp(int64_t lease, const char* why) {
  Lose(why);
  if (absl::Status st = etcd_->RevokeLease(lease); !st.ok()) {
    spdlog::debug("election {}: revoking lease {:x}: {} (the key goes when it expires)",
                  options_.key, lease, st.ToString());
  }
}

std::chrono::milliseconds MasterElection::Step() {
  const auto keepalive_every = std::chrono::milliseconds(options_.ttl_s * 1000 / 3);
  const std::chrono::milliseconds margin = Margin(options_.ttl_s);
  int64_t lease = 0;
  bool leader = false, expired = false;
  {
    MutexLock lock(&mu_);
    lease = lease_id_;
    leader = term_.leading();
    expired = lease != 0 && term_.Expired(Clock::now());
  }
  // The lease ran out by the local clock (no keep-alive answered in time, or the process was
  // paused): whatever etcd says, this candidate no longer leads, and gives that lease up.
  if (expired) {
    GiveUp(lease, "the lease's TTL passed without a keep-alive");
    return std::chrono::milliseconds(0);
  }
  if (lease == 0) {
    const Clock::time_point sent = Clock::now();
    absl::StatusOr<EtcdClient::Lease> granted = etcd_->GrantLease(options_.ttl_s);
    if (!granted.ok()) {
      spdlog::debug("election {}: lease grant: {}", options_.key, granted.status().ToString());
      return options_.poll_interval;
    }
    MutexLock lock(&mu_);
    lease = lease_id_ = granted->id;
    term_.Granted(sent, std::chrono::seconds(granted->ttl_s), margin);
  } else {
    const Clock::time_point sent = Clock::now();
    absl::StatusOr<int64_t> ttl = etcd_->KeepAliveOnce(lease);
    if (ttl.ok()) {
      bool renewed = false;
      {
        MutexLock lock(&mu_);
        renewed = term_.Renewed(sent, std::chrono::seconds(*ttl), margin, Clock::now());
      }
      if (!renewed) {
        GiveUp(lease, "a keep-alive was answered after the lease's local estimate ran out");
        return std::chrono::milliseconds(0);
      }
    } else if (absl::IsNotFound(ttl.status())) {
      Lose("etcd says the lease is gone");
      return std::chrono::milliseconds(0);
    } else {
      spdlog::debug("election {}: keep-alive: {}", options_.key, ttl.status().ToString());
      return options_.poll_interval;  // try again soon; the local deadline decides
    }
  }
  if (leader) {
    // Still the holder? (An operator may have deleted the key.)
    absl::StatusOr<std::optional<EtcdKeyValue>> kv = etcd_->Get(options_.key);
    if (kv.ok() && (!kv->has_value() || (*kv)->lease != lease)) {
      GiveUp(lease, "the leadership key no longer names this candidate's lease");
      return std::chrono::milliseconds(0);
    }
    return std::min(keepalive_every, std::chrono::milliseconds(1000));
  }
  absl::StatusOr<EtcdClient::CreateResult> r =
      etcd_->CreateIfAbsent(options_.key, options_.value, lease, attached_);
  if (!r.ok()) {
    spdlog::debug("election {}: campaign: {}", options_.key, r.status().ToString());
    return options_.poll_interval;
  }
  const bool mine = r->kv.lease == lease;
  bool leads = false;
  {
    MutexLock lock(&mu_);
    // The key is ours but the lease may have run out meanwhile: then it is not led with.
    leads = mine && term_.Begin(r->kv.create_revision, Clock::now());
    observed_ = Leadership{true, leads, r->kv.value, r->kv.create_revision};
    if (leads) spdlog::info("election {}: leader, epoch {}", options_.key, observed_.epoch);
    changed_.SignalAll();
  }
  if (mine && !leads) {
    GiveUp(lease, "the lease ran out while the key was being taken");
    return std::chrono::milliseconds(0);
  }
  return leads ? std::min(keepalive_every, std::chrono::milliseconds(1000))
               : options_.poll_interval;
}

}  // namespace fluxon
