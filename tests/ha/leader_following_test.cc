// The owners' side of standby masters: the gRPC master client's cancellation of calls in flight,
// and LeaderFollowingMaster against a real etcd (Debian's etcd-server) with stand-in masters —
// it follows the key, fences answers of an older epoch, and ends the calls still waiting on a
// leader that was replaced.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/put_id.h"
#include "gtest/gtest.h"
#include "ha/elected_master.h"
#include "ha/etcd_client.h"
#include "ha/etcd_fixture.h"
#include "ha/leader_following_master.h"
#include "rpc/forwarding_master.h"
#include "rpc_grpc/grpc_master.h"

namespace fluxon {
namespace {

using std::chrono::milliseconds;
using testing_ha::Clock;
using testing_ha::Etcd;
using testing_ha::EtcdBinary;

// A master that answers every call with an empty reply stamped with `epoch`, or holds each call
// while `hold` is set (a paused master, as its callers see it), for at most 20 s.
class StandInMaster final : public ForwardingMaster<StandInMaster> {
 public:
  std::atomic<uint64_t> epoch{0};
  std::atomic<bool> hold{false};
  std::atomic<int> calls{0};

  template <typename Reply, typename Request>
  absl::StatusOr<Reply> Forward(const Request&,
                                absl::StatusOr<Reply> (MasterApi::*)(const Request&)) {
    calls.fetch_add(1);
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (hold.load() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(5));
    Reply r;
    if constexpr (requires { r.set_master_epoch(0); }) r.set_master_epoch(epoch.load());
    return r;
  }
};

// A StandInMaster served over gRPC on a loopback port of its own.
struct ServedMaster {
  ServedMaster() {
    service = MakeMasterGrpcService(&master);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service.get());
    server = b.BuildAndStart();
  }
  ~ServedMaster() {
    master.hold = false;
    server->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }
  StandInMaster master;
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

TEST(GrpcMasterClient, CancelInFlightEndsWaitingCallsAsUnavailable) {
  ServedMaster m;
  ASSERT_NE(m.port, 0);
  auto client = MakeCancellableGrpcMasterClient(m.address(), GrpcSecurity::Plaintext(),
                                                std::chrono::seconds(15));
  ASSERT_TRUE(client.ok()) << client.status();
  m.master.epoch = 7;
  auto ok = (*client)->RegisterOwner({});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->master_epoch(), 7u);

  m.master.hold = true;
  auto waiting = std::async(std::launch::async, [&] { return (*client)->Lookup({}); });
  while (m.master.calls.load() < 2) std::this_thread::sleep_for(milliseconds(5));
  const auto t0 = Clock::now();
  (*client)->CancelInFlight();
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "a cancelled call waited on";
  const absl::StatusOr<v1::LookupReply> r = waiting.get();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(IsUncertain(r.status())) << r.status();  // outcome unknown, never a refusal
  EXPECT_NE(r.status().message().find("cancelled"), std::string::npos) << r.status();
  // Later calls are not affected.
  m.master.hold = false;
  EXPECT_TRUE((*client)->RegisterOwner({}).ok());
}

class LeaderFollowingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdBinary().empty()) GTEST_SKIP() << "no etcd binary (scripts/install-deps.sh)";
    const absl::Status started = serving_.Start("fluxon-following");
    dir_ = serving_.dir;
    etcd_ = serving_.etcd ? &*serving_.etcd : nullptr;
    etcd_client_ = serving_.client.get();
    ASSERT_TRUE(started.ok()) << started;
  }
  void TearDown() override {
    follower_.reset();
    serving_.etcd.reset();
  }

  // Makes `value` the leader (a lease of its own); returns the epoch (create_revision).
  int64_t Lead(const std::string& value) {
    auto lease = etcd_client_->GrantLease(30);
    EXPECT_TRUE(lease.ok()) << lease.status();
    auto r = etcd_client_->CreateIfAbsent(kKey, value, lease->id);
    EXPECT_TRUE(r.ok() && r->created) << r.status();
    lease_ = lease->id;
    return r->kv.create_revision;
  }
  void Resign() { EXPECT_TRUE(etcd_client_->RevokeLease(lease_).ok()); }
  // An elected master of this test's etcd and key (a standby poll of 20 ms, owners kept 60 s).
  ElectedMasterOptions ElectedOptions() const {
    ElectedMasterOptions o;
    o.election.endpoints = {etcd_->endpoint()};
    o.election.key = kKey;
    o.election.ttl_s = 5;
    o.election.poll_interval = milliseconds(20);
    o.master.owner_lease = std::chrono::seconds(60);
    return o;
  }

  void Follow() {
    LeaderFollowingOptions o;
    o.endpoints = {etcd_->endpoint()};
    o.key = kKey;
    o.poll_interval = milliseconds(50);
    auto f = LeaderFollowingMaster::Start(o, [](const std::string& address) {
      return MakeCancellableGrpcMasterClient(address, GrpcSecurity::Plaintext(),
                                             std::chrono::seconds(15));
    });
    ASSERT_TRUE(f.ok()) << f.status();
    follower_ = std::move(*f);
  }

  bool WaitFollowing(const std::string& address, milliseconds bound) {
    const auto deadline = Clock::now() + bound;
    while (follower_->leader().address != address) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return true;
  }

  static constexpr const char* kKey = "/fluxon/test/following/leader";
  std::string dir_;
  testing_ha::ServingEtcd serving_;
  Etcd* etcd_ = nullptr;               // serving_'s
  EtcdClient* etcd_client_ = nullptr;  // serving_'s
  std::unique_ptr<LeaderFollowingMaster> follower_;
  int64_t lease_ = 0;
};

TEST_F(LeaderFollowingTest, NoLeaderIsUnavailableThenTheKeysHolderIsCalled) {
  Follow();
  auto none = follower_->RegisterOwner({});
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(IsUncertain(none.status())) << none.status();
  ServedMaster m;
  const int64_t epoch = Lead(m.address());
  m.master.epoch = static_cast<uint64_t>(epoch);
  ASSERT_TRUE(follower_->WaitLeader(std::chrono::seconds(5)));
  EXPECT_EQ(follower_->leader().epoch, epoch);
  auto r = follower_->RegisterOwner({});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->master_epoch(), static_cast<uint64_t>(epoch));
  EXPECT_EQ(m.master.calls.load(), 1);
}

TEST_F(LeaderFollowingTest, AnAnswerOfAnOlderEpochIsNotTakenAsAnOutcome) {
  ServedMaster m;
  const int64_t epoch = Lead(m.address());
  Follow();
  ASSERT_TRUE(follower_->WaitLeader(std::chrono::seconds(5)));
  m.master.epoch = static_cast<uint64_t>(epoch - 1);  // a deposed leadership's answer
  auto stale = follower_->PublishBatch({});
  ASSERT_FALSE(stale.ok());
  EXPECT_TRUE(IsUncertain(stale.status())) << stale.status();
  EXPECT_NE(stale.status().message().find("deposed"), std::string::npos) << stale.status();
  m.master.epoch = static_cast<uint64_t>(epoch);
  EXPECT_TRUE(follower_->PublishBatch({}).ok());
}

TEST_F(LeaderFollowingTest, ANewLeaderEndsTheCallsWaitingOnTheOldOne) {
  ServedMaster old_leader, new_leader;
  old_leader.master.epoch = static_cast<uint64_t>(Lead(old_leader.address()));
  Follow();
  ASSERT_TRUE(WaitFollowing(old_leader.address(), milliseconds(5000)));
  old_leader.master.hold = true;  // paused: it accepts calls and answers none
  auto waiting = std::async(std::launch::async, [&] { return follower_->Lookup({}); });
  while (old_leader.master.calls.load() < 1) std::this_thread::sleep_for(milliseconds(5));
  Resign();
  new_leader.master.epoch = static_cast<uint64_t>(Lead(new_leader.address()));
  ASSERT_TRUE(WaitFollowing(new_leader.address(), milliseconds(5000)));
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(3)), std::future_status::ready)
      << "the call waited on the replaced leader";
  const auto r = waiting.get();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(IsUncertain(r.status())) << r.status();
  auto next = follower_->Lookup({});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->master_epoch(), new_leader.master.epoch.load());
  EXPECT_EQ(new_leader.master.calls.load(), 1);
}

// Calls race the start of a leadership: every publish the elected master acknowledged is routed
// by the core it serves afterwards (a call that looked at the election before the leadership
// began must not drop the new leadership's core), and a standby answers Unavailable.
TEST_F(LeaderFollowingTest, EveryPublishAnElectedMasterAcknowledgedIsInItsCore) {
  ElectedMaster master(ElectedOptions());
  auto refused = master.ListOwners({});
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(IsUncertain(refused.status())) << refused.status();

  std::atomic<bool> stop{false};
  std::vector<std::vector<std::string>> acked(4);
  std::vector<std::thread> callers;
  for (uint32_t t = 0; t < acked.size(); ++t) {
    callers.emplace_back([&, t] {
      const uint32_t node = t + 1;
      v1::RegisterOwnerRequest reg;
      reg.set_node_id(node);
      reg.set_generation(100 + node);
      for (uint64_t i = 1; !stop.load(); ++i) {
        if (!master.RegisterOwner(reg).ok()) continue;  // a standby, or not yet leading
        v1::PublishBatchRequest p;
        p.set_node_id(node);
        p.set_generation(100 + node);
        const uint64_t put_id = (uint64_t{node} << kPutIdSeqBits) | i;
        p.set_put_id(put_id);
        v1::RouteItem* item = p.add_items();
        item->set_key(absl::StrCat("k", node, "-", i));
        item->set_put_id(put_id);
        item->set_offset(4096 * i);
        item->set_len(4096);
        item->set_version(1);
        auto r = master.PublishBatch(p);
        if (r.ok() && r->outcomes(0) == v1::PUBLISHED) acked[t].push_back(item->key());
      }
    });
  }
  std::this_thread::sleep_for(milliseconds(100));  // the callers are busy before the campaign
  ASSERT_TRUE(master.Campaign("127.0.0.1:1", "").ok());
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!master.leading() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(5));
  std::this_thread::sleep_for(milliseconds(300));
  stop = true;
  for (std::thread& c : callers) c.join();
  ASSERT_TRUE(master.leading());
  const std::shared_ptr<MasterCore> core = master.current();
  ASSERT_NE(core, nullptr);
  size_t total = 0;
  for (const auto& keys : acked) {
    for (const std::string& k : keys) {
      v1::LookupRequest lr;
      lr.add_keys(k);
      auto r = core->Lookup(lr);
      ASSERT_TRUE(r.ok());
      EXPECT_TRUE(r->found(0)) << "acknowledged " << k << " is not routed";
    }
    total += keys.size();
  }
  EXPECT_GT(total, 0u);
  EXPECT_EQ(core->route_count(), total);
  EXPECT_EQ(core->epoch(), static_cast<uint64_t>(master.observed().epoch));
  master.Stop();
  EXPECT_FALSE(master.ListOwners({}).ok());
}

// The leadership ends while a call runs on its core: the call's answer does not leave (it is
// Unavailable, an uncertain outcome the caller retries at the next leader), though the core did
// the work: only a master that leads in the same epoch from the start to the end of a call
// answers it.
TEST_F(LeaderFollowingTest, AnAnswerDoesNotLeaveWhenTheLeadershipEndedDuringTheCall) {
  // A publish large enough to outlast the start of Stop(); doubled until one does.
  for (int items = 50'000; items <= 1'600'000; items *= 2) {
    ElectedMaster master(ElectedOptions());
    ASSERT_TRUE(master.Campaign("127.0.0.1:1", "").ok());
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!master.leading() && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    ASSERT_TRUE(master.leading());
    v1::RegisterOwnerRequest reg;
    reg.set_node_id(1);
    reg.set_generation(7);
    ASSERT_TRUE(master.RegisterOwner(reg).ok());
    v1::PublishBatchRequest p;
    p.set_node_id(1);
    p.set_generation(7);
    p.set_put_id((uint64_t{1} << kPutIdSeqBits) | 1);
    for (int i = 0; i < items; ++i) {
      v1::RouteItem* item = p.add_items();
      item->set_key(absl::StrCat("long-call-", i));
      item->set_put_id(p.put_id());
      item->set_offset(4096 * uint64_t(i));
      item->set_len(4096);
      item->set_version(1);
    }
    std::atomic<bool> started{false};
    Clock::time_point call_end;
    absl::StatusOr<v1::PublishBatchReply> reply;
    std::thread caller([&] {
      started = true;
      reply = master.PublishBatch(p);
      call_end = Clock::now();
    });
    while (!started.load()) std::this_thread::yield();
    std::this_thread::sleep_for(milliseconds(5));
    master.Stop();
    const Clock::time_point stopped = Clock::now();
    caller.join();
    if (call_end <= stopped) {
      // The call may have ended before the leadership did: nothing to judge; try a longer one.
      if (reply.ok()) continue;
      // Ended as the leadership ended: its answer must be the refusal, never an outcome.
    }
    ASSERT_FALSE(reply.ok()) << items << " items: the answer left after the leadership ended";
    EXPECT_TRUE(IsUncertain(reply.status())) << reply.status();
    if (reply.status().message().find("ended during the call") != std::string::npos) return;
    // Refused at the start (Stop won the race to the call): try a longer call.
  }
  FAIL() << "no publish outlasted the start of Stop(), even of 1.6 M items";
}

}  // namespace
}  // namespace fluxon
