#include "ha/leader_following_master.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace fluxon {

absl::StatusOr<std::unique_ptr<LeaderFollowingMaster>> LeaderFollowingMaster::Start(
    LeaderFollowingOptions options, Dialer dial) {
  if (options.key.empty()) return absl::InvalidArgumentError("election key is empty");
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd =
      EtcdClient::Connect(options.endpoints, options.call_deadline, options.etcd_credentials);
  if (!etcd.ok()) return etcd.status();
  std::unique_ptr<LeaderFollowingMaster> m(
      new LeaderFollowingMaster(std::move(options), std::move(dial), std::move(*etcd)));
  m->Refresh();  // a leader known before the first call when etcd answers at once
  m->thread_ = std::thread([raw = m.get()] { raw->Run(); });
  return m;
}

LeaderFollowingMaster::LeaderFollowingMaster(LeaderFollowingOptions options, Dialer dial,
                                             std::unique_ptr<EtcdClient> etcd)
    : options_(std::move(options)), dial_(std::move(dial)), etcd_(std::move(etcd)) {
  MutexLock lock(&mu_);
  last_problem_ = "the leadership key has not been read yet";
}

LeaderFollowingMaster::~LeaderFollowingMaster() { Stop(); }

void LeaderFollowingMaster::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

LeaderFollowingMaster::Leader LeaderFollowingMaster::leader() const {
  MutexLock lock(&mu_);
  return leader_;
}

bool LeaderFollowingMaster::WaitLeader(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (client_ == nullptr && !stopping_) {
    if (!changed_.WaitUntil(&mu_, deadline)) break;
  }
  return client_ != nullptr;
}

void LeaderFollowingMaster::Kick() {
  MutexLock lock(&mu_);
  kicked_ = true;
  changed_.SignalAll();
}

void LeaderFollowingMaster::Run() {
  // A kicked read comes at most every kMinGap: calls failing fast at a dead leader must not
  // turn into a stream of etcd reads.
  constexpr std::chrono::milliseconds kMinGap{50};
  auto last = std::chrono::steady_clock::now();
  for (;;) {
    {
      MutexLock lock(&mu_);
      for (;;) {
        if (stopping_) return;
        const auto now = std::chrono::steady_clock::now();
        if (now >= last + options_.poll_interval || (kicked_ && now >= last + kMinGap)) break;
        changed_.WaitUntil(&mu_, kicked_ ? last + kMinGap : last + options_.poll_interval);
      }
      kicked_ = false;
    }
    last = std::chrono::steady_clock::now();
    Refresh();
  }
}

void LeaderFollowingMaster::Refresh() {
  absl::StatusOr<std::optional<EtcdKeyValue>> kv = etcd_->Get(options_.key);
  if (!kv.ok()) {
    // etcd unreachable: keep the leader we know (it serves until its lease ends).
    MutexLock lock(&mu_);
    last_problem_ = "etcd: " + kv.status().ToString();
    return;
  }
  if (!kv->has_value()) {
    std::shared_ptr<CancellableMasterApi> lost;
    {
      MutexLock lock(&mu_);
      if (!leader_.address.empty()) {
        spdlog::warn("master election {}: no master leads now (the leader's key is gone)",
                     options_.key);
        lost = client_;
      }
      last_problem_ = "no master leads now (the leadership key is empty)";
      leader_ = Leader{};  // the old leader's client stays: it may still answer "not the leader"
    }
    // Its lease is gone: calls still waiting on it can only end refused or at their deadline.
    if (lost != nullptr) lost->CancelInFlight();
    return;
  }
  const EtcdKeyValue& key = **kv;
  int64_t seen = highest_epoch_.load(std::memory_order_relaxed);
  while (key.create_revision > seen &&
         !highest_epoch_.compare_exchange_weak(seen, key.create_revision)) {
  }
  std::shared_ptr<CancellableMasterApi> client;
  {
    MutexLock lock(&mu_);
    if (leader_.address == key.value && leader_.epoch == key.create_revision) return;
    if (client_ != nullptr && leader_.address == key.value) client = client_;
  }
  if (client == nullptr) {
    absl::StatusOr<std::unique_ptr<CancellableMasterApi>> dialed = dial_(key.value);
    if (!dialed.ok()) {
      MutexLock lock(&mu_);
      last_problem_ =
          absl::StrFormat("the leader's address '%s': %s", key.value, dialed.status().ToString());
      return;
    }
    client = std::move(*dialed);
  }
  spdlog::info("master election {}: following the leader {} (epoch {})", options_.key, key.value,
               key.create_revision);
  std::shared_ptr<CancellableMasterApi> old;
  {
    MutexLock lock(&mu_);
    old = std::exchange(client_, client);
    leader_ = Leader{key.value, key.create_revision};
    last_problem_.clear();
    changed_.SignalAll();
  }
  // Calls still waiting on the previous leader end now (Unavailable: retried here).
  if (old != nullptr && old != client) old->CancelInFlight();
}

template <typename Reply, typename Request>
absl::StatusOr<Reply> LeaderFollowingMaster::Forward(
    const Request& r, absl::StatusOr<Reply> (MasterApi::*method)(const Request&)) {
  std::shared_ptr<CancellableMasterApi> client;
  std::string problem;
  {
    MutexLock lock(&mu_);
    client = client_;
    problem = last_problem_;
  }
  if (client == nullptr) {
    Kick();
    return absl::UnavailableError("no master to call: " + problem);
  }
  absl::StatusOr<Reply> reply = ((*client).*method)(r);
  if (!reply.ok()) {
    if (reply.status().code() == absl::StatusCode::kUnavailable) Kick();
    return reply;
  }
  if constexpr (requires { reply->master_epoch(); }) {
    const int64_t highest = highest_epoch_.load(std::memory_order_relaxed);
    const uint64_t epoch = reply->master_epoch();
    if (epoch != 0 && highest > 0 && epoch < static_cast<uint64_t>(highest)) {
      Kick();
      return absl::UnavailableError(absl::StrFormat(
          "an answer of epoch %d from a deposed master (the leadership's epoch is %d)", epoch,
          highest));
    }
  }
  return reply;
}

}  // namespace fluxon
