// The masters' election through a real etcd (Debian's etcd-server) on loopback, with each
// candidate its own process (election_candidate): one leader at a time, epochs that only grow,
// a clean stop handing over at once, kill -9 and SIGSTOP past the lease replaced after the TTL
// with no split brain (the paused leader wakes up no longer leading), and an etcd restart the
// campaign recovers from. Skipped where no etcd binary exists (scripts/install-deps.sh installs
// etcd-server).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "ha/etcd_client.h"
#include "ha/etcd_fixture.h"
#include "ha/leader_record.h"
#include "tools/tool_test_util.h"

namespace fluxon {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing_ha::Child;
using testing_ha::Etcd;
using testing_ha::EtcdBinary;
constexpr int kTtlS = 2;

struct CandidateState {
  uint64_t seq = 0;
  bool leader_now = false;
  int64_t epoch = 0;
  std::string observed;
};

class ElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdBinary().empty()) GTEST_SKIP() << "no etcd binary (scripts/install-deps.sh)";
    const absl::Status started = serving_.Start("fluxon-election");
    dir_ = serving_.dir;
    etcd_ = serving_.etcd ? &*serving_.etcd : nullptr;
    client_ = serving_.client.get();
    ASSERT_TRUE(started.ok()) << started;
  }
  void TearDown() override {
    candidates_.clear();
    serving_.etcd.reset();
    if (!dir_.empty() && !HasFailure()) testing::RunCommand({"rm", "-rf", dir_});
  }

  static bool WaitFor(const std::function<bool()>& ok, milliseconds bound) {
    const auto deadline = Clock::now() + bound;
    while (Clock::now() < deadline) {
      if (ok()) return true;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return ok();
  }

  void StartCandidate(const std::string& name) {
    candidates_.emplace(
        std::piecewise_construct, std::forward_as_tuple(name),
        std::forward_as_tuple(
            std::vector<std::string>{ELECTION_CANDIDATE_PATH, etcd_->endpoint(), kKey, name,
                                     std::to_string(kTtlS), StatePath(name)},
            dir_ + "/" + name + ".log"));
  }
  std::string StatePath(const std::string& name) const { return dir_ + "/" + name + ".state"; }
  CandidateState State(const std::string& name) const {
    CandidateState s;
    std::ifstream f(StatePath(name));
    std::string line;
    if (!std::getline(f, line)) return s;
    for (absl::string_view field : absl::StrSplit(line, ' ')) {
      std::pair<std::string, std::string> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
      if (kv.first == "seq") s.seq = std::stoull(kv.second);
      if (kv.first == "leader_now") s.leader_now = kv.second == "1";
      if (kv.first == "epoch") s.epoch = std::stoll(kv.second);
      if (kv.first == "observed") s.observed = kv.second;
    }
    return s;
  }
  // The key's holder as etcd has it: (value, create_revision), empty when no leader.
  std::optional<EtcdKeyValue> Holder() const {
    auto kv = client_->Get(kKey);
    return kv.ok() ? *kv : std::nullopt;
  }
  // Waits for a leader in etcd whose candidate also believes it leads with that epoch.
  // `exclude`: a candidate that was killed or paused (its state file is stale).
  std::optional<std::pair<std::string, int64_t>> WaitLeader(milliseconds bound,
                                                            const std::string& exclude = "") {
    std::optional<std::pair<std::string, int64_t>> out;
    WaitFor(
        [&] {
          std::optional<EtcdKeyValue> h = Holder();
          if (!h || !candidates_.contains(h->value) || h->value == exclude) return false;
          const CandidateState s = State(h->value);
          if (!s.leader_now || s.epoch != h->create_revision) return false;
          out.emplace(h->value, h->create_revision);
          return true;
        },
        bound);
    return out;
  }
  int Leaders() const {
    int n = 0;
    for (const auto& [name, _] : candidates_) n += State(name).leader_now ? 1 : 0;
    return n;
  }

  static constexpr const char* kKey = "/fluxon/test/master/leader";
  std::string dir_;
  testing_ha::ServingEtcd serving_;
  Etcd* etcd_ = nullptr;          // serving_'s
  EtcdClient* client_ = nullptr;  // serving_'s
  std::map<std::string, Child> candidates_;
};

TEST(EtcdClientTest, RefusesEndpointsItCannotDial) {
  EXPECT_TRUE(absl::IsInvalidArgument(EtcdClient::Connect({}).status()));
  for (const char* bad : {"127.0.0.1", ":2379", "127.0.0.1:0", "127.0.0.1:x", "h:70000"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(EtcdClient::Connect({bad}).status())) << bad;
  }
  EXPECT_TRUE(EtcdClient::Connect({"etcd.local:2379"}).ok());  // one member: any host name
  // Several members share the ipv4: resolver: addresses only.
  EXPECT_TRUE(
      absl::IsInvalidArgument(EtcdClient::Connect({"127.0.0.1:2379", "etcd.local:2379"}).status()));
  EXPECT_TRUE(EtcdClient::Connect({"127.0.0.1:2379", "127.0.0.2:2379"}).ok());
}

TEST_F(ElectionTest, OneLeaderWhoseEpochIsTheKeysRevisionAndAStandbyThatSeesIt) {
  StartCandidate("a");
  StartCandidate("b");
  auto leader = WaitLeader(milliseconds(10000));
  ASSERT_TRUE(leader.has_value());
  const std::string other = leader->first == "a" ? "b" : "a";
  ASSERT_TRUE(WaitFor(
      [&] { return State(other).observed == absl::StrCat(leader->first, "@", leader->second); },
      milliseconds(3000)))
      << State(other).observed;
  // For a while (several keep-alive periods): exactly one leader, always the same.
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(Leaders(), 1);
    EXPECT_FALSE(State(other).leader_now);
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(Holder()->value, leader->first);
}

TEST_F(ElectionTest, ACleanStopHandsOverAtOnceWithAHigherEpoch) {
  StartCandidate("a");
  auto first = WaitLeader(milliseconds(10000));
  ASSERT_TRUE(first.has_value());
  StartCandidate("b");
  ASSERT_TRUE(WaitFor([&] { return State("b").observed == "a@" + std::to_string(first->second); },
                      milliseconds(3000)));
  const auto t0 = Clock::now();
  EXPECT_EQ(candidates_.at("a").Terminate(), 0);
  auto second = WaitLeader(milliseconds(kTtlS * 1000));  // well before the TTL would run out
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->first, "b");
  EXPECT_GT(second->second, first->second);
  EXPECT_LT(Clock::now() - t0, milliseconds(kTtlS * 1000));
}

TEST_F(ElectionTest, AKilledLeaderIsReplacedOnceItsLeaseEnds) {
  StartCandidate("a");
  auto first = WaitLeader(milliseconds(10000));
  ASSERT_TRUE(first.has_value());
  StartCandidate("b");
  candidates_.at("a").Kill();
  auto second = WaitLeader(milliseconds(kTtlS * 1000 + 5000), "a");
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->first, "b");
  EXPECT_GT(second->second, first->second);
}

TEST_F(ElectionTest, TheLeaderRecordNamesTheLeadersAdminAddressAndGoesWithItsLease) {
  EXPECT_TRUE(absl::IsNotFound(ReadLeaderRecord(*client_, kKey).status()));
  StartCandidate("a");
  auto first = WaitLeader(milliseconds(10000));
  ASSERT_TRUE(first.has_value());
  absl::StatusOr<LeaderRecord> r = ReadLeaderRecord(*client_, kKey);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->master_address, "a");
  EXPECT_EQ(r->admin_address, "a-admin");
  EXPECT_EQ(r->epoch, first->second);
  // Killed: both keys go with the lease (nobody else campaigns).
  candidates_.at("a").Kill();
  ASSERT_TRUE(WaitFor([&] { return !Holder().has_value(); }, milliseconds(kTtlS * 1000 + 5000)));
  EXPECT_TRUE(absl::IsNotFound(ReadLeaderRecord(*client_, kKey).status()));
  absl::StatusOr<std::optional<EtcdKeyValue>> admin = client_->Get(LeaderAdminKey(kKey));
  ASSERT_TRUE(admin.ok());
  EXPECT_FALSE(admin->has_value()) << (*admin)->value;
  // The next leader's record is its own, with its epoch.
  StartCandidate("b");
  auto second = WaitLeader(milliseconds(10000), "a");
  ASSERT_TRUE(second.has_value());
  r = ReadLeaderRecord(*client_, kKey);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->master_address, "b");
  EXPECT_EQ(r->admin_address, "b-admin");
  EXPECT_EQ(r->epoch, second->second);
  EXPECT_GT(r->epoch, first->second);
}

TEST_F(ElectionTest, ALeaderKeyWithoutAnAdminAddressIsReportedAsSuch) {
  // A leader that published no admin address (a master that predates it): FailedPrecondition
  // naming the key, not a wrong address.
  absl::StatusOr<EtcdClient::Lease> lease = client_->GrantLease(kTtlS);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->CreateIfAbsent(kKey, "old-master", lease->id).ok());
  absl::StatusOr<LeaderRecord> r = ReadLeaderRecord(*client_, kKey);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_NE(r.status().message().find(LeaderAdminKey(kKey)), std::string::npos) << r.status();
  EXPECT_TRUE(client_->RevokeLease(lease->id).ok());
}

TEST_F(ElectionTest, ALeaderPausedPastItsLeaseWakesUpNoLongerLeading) {
  StartCandidate("a");
  auto first = WaitLeader(milliseconds(10000));
  ASSERT_TRUE(first.has_value());
  StartCandidate("b");
  ASSERT_TRUE(WaitFor([&] { return !State("b").observed.empty(); }, milliseconds(3000)));
  candidates_.at("a").Signal(SIGSTOP);
  auto second = WaitLeader(milliseconds(kTtlS * 1000 + 5000), "a");
  ASSERT_TRUE(second.has_value());
  ASSERT_EQ(second->first, "b");
  const uint64_t seq_before = State("a").seq;
  candidates_.at("a").Signal(SIGCONT);
  // Its first report after waking up already says it does not lead (the local clock, not etcd).
  ASSERT_TRUE(WaitFor([&] { return State("a").seq > seq_before; }, milliseconds(2000)));
  EXPECT_FALSE(State("a").leader_now);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(Leaders(), 1);
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_TRUE(State("b").leader_now);
}

TEST_F(ElectionTest, WithEtcdGoneTheLeaderStopsLeadingAtItsLeaseAndTheCampaignRecovers) {
  StartCandidate("a");
  auto first = WaitLeader(milliseconds(10000));
  ASSERT_TRUE(first.has_value());
  etcd_->Kill();
  const auto t0 = Clock::now();
  ASSERT_TRUE(WaitFor([&] { return !State("a").leader_now; }, milliseconds(kTtlS * 1000 + 2000)));
  EXPECT_LE(Clock::now() - t0, milliseconds(kTtlS * 1000 + 500));
  etcd_->Start();  // same data directory: the same cluster comes back
  ASSERT_TRUE(etcd_->WaitReady(milliseconds(20000)));
  auto again = WaitLeader(milliseconds(30000));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->first, "a");
  // The leadership that ended is not resumed (etcd keeps the lease through its restart): the
  // candidate leads again under a new epoch, which makes the owners republish to it.
  EXPECT_GT(again->second, first->second);
}

}  // namespace
}  // namespace fluxon
