// The owner's data plane: with owner.data_address set, fluxond serves its segment over the TCP
// transport and registers the endpoint with the master; a peer reads a committed value's bytes
// at its route's offset, and a request naming another generation is refused.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "security/security_files.h"
#include "tests/integration/test_node.h"
#include "transport/tcp/tcp_transport.h"

namespace fluxon {
namespace {

using ::fluxon::testing::Connect;
using ::fluxon::testing::StartNode;
using ::fluxon::testing::TestConfig;

// The secret every fluxond of this user on this machine serves its loopback data plane with.
std::string MachineSecret() {
  auto s = security::LoadOrCreateMachineSecret(security::MachineSecretPath());
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : std::string();
}

// Puts `bytes` under `key` through `client`, waits for the route and returns its offset.
uint64_t PutAndRoute(FluxonNode& node, KvClient& client, const std::string& key,
                     std::vector<uint8_t>& bytes) {
  const int64_t len = static_cast<int64_t>(bytes.size());
  auto plan = client.LocalFastPutStart({key}, len, PutOptions{});
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return 0;
  EXPECT_TRUE(CopyPlanValues(*plan, bytes.data(), len, CopyDirection::kToValues).ok());
  auto fut = client.LocalFastPutCommit(*plan);
  EXPECT_TRUE(fut.ok() && fut->Wait(std::chrono::milliseconds(5000)).ok());
  v1::LookupRequest lr;
  lr.add_keys(key);
  auto route = node.master()->Lookup(lr);
  EXPECT_TRUE(route.ok() && route->found(0));
  return route.ok() && route->found(0) ? route->routes(0).offset() : 0;
}

// A peer with the machine's secret: its own initiator transport over `local`.
std::unique_ptr<transport::TcpTransport> MachinePeer(std::vector<uint8_t>& local) {
  transport::TcpTransportOptions po;
  po.listen_address = "";
  po.cluster_secret = MachineSecret();
  auto peer = transport::TcpTransport::Create(po);
  EXPECT_TRUE(peer.ok()) << peer.status();
  if (!peer.ok()) return nullptr;
  EXPECT_TRUE((*peer)->RegisterRegion(77, local.data(), local.size()).ok());
  return std::move(*peer);
}

TEST(DataPlane, PeerReadsACommittedValueAtItsRouteAndAStaleGenerationIsRefused) {
  Config c = TestConfig();
  c.owner->data_address = "127.0.0.1:0";
  auto node = StartNode(c);
  ASSERT_FALSE(node->data_address().empty());
  auto owners = node->master()->ListOwners({});
  ASSERT_TRUE(owners.ok());
  ASSERT_EQ(owners->owners_size(), 1);
  EXPECT_EQ(owners->owners(0).address(), node->data_address());
  ASSERT_EQ(owners->owners(0).transports_size(), 1);
  EXPECT_EQ(owners->owners(0).transports(0), "tcp");

  constexpr int64_t kLen = 64 * 1024;
  std::vector<uint8_t> bytes(kLen);
  for (int64_t i = 0; i < kLen; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  auto client = Connect(c);
  const uint64_t offset = PutAndRoute(*node, *client, "remote-readable", bytes);

  // A peer: its own transport with a registered local buffer.
  std::vector<uint8_t> local(kLen, 0);
  auto peer = MachinePeer(local);
  ASSERT_NE(peer, nullptr);
  const transport::Descriptor d{offset, local.data(), static_cast<uint64_t>(kLen)};
  auto batch = peer->Submit({node->data_address(), node->owner()->generation()},
                            transport::OpKind::kRead, {&d, 1}, absl::Seconds(5));
  ASSERT_TRUE(batch.ok()) << batch.status();
  const transport::BatchResult& r = batch->Wait();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(local, bytes);

  auto stale = peer->Submit({node->data_address(), node->owner()->generation() + 1},
                            transport::OpKind::kRead, {&d, 1}, absl::Seconds(5));
  ASSERT_TRUE(stale.ok());
  EXPECT_EQ(stale->Wait().status.code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(peer->UnregisterRegion().ok());
}

// Cluster hardening, item 5: owners never write to peers, so a one-sided WRITE into an owner's
// segment is refused (PermissionDenied) and the committed value keeps its bytes.
TEST(DataPlane, OneSidedWriteIntoAnOwnersSegmentIsRefused) {
  Config c = TestConfig();
  c.owner->data_address = "127.0.0.1:0";
  auto node = StartNode(c);
  constexpr int64_t kLen = 8192;
  std::vector<uint8_t> bytes(kLen, 0x5A);
  auto client = Connect(c);
  const uint64_t offset = PutAndRoute(*node, *client, "not-writable", bytes);

  std::vector<uint8_t> evil(kLen, 0xEE);
  auto peer = MachinePeer(evil);
  ASSERT_NE(peer, nullptr);
  const transport::Descriptor d{offset, evil.data(), static_cast<uint64_t>(kLen)};
  auto batch = peer->Submit({node->data_address(), node->owner()->registration_generation()},
                            transport::OpKind::kWrite, {&d, 1}, absl::Seconds(5));
  ASSERT_TRUE(batch.ok()) << batch.status();
  const transport::BatchResult& r = batch->Wait();
  ASSERT_EQ(r.descriptors.size(), 1u);
  EXPECT_EQ(r.descriptors[0].code(), absl::StatusCode::kPermissionDenied);
  EXPECT_GE(node->owner()->Stats()["data_plane_requests_refused"], 1);

  // The owner's own readers still see the bytes that were put.
  std::vector<uint8_t> back(kLen, 0);
  auto h = client->GetStart({"not-writable"});
  ASSERT_TRUE(h.ok());
  auto get = client->GetTransfer(*h);
  ASSERT_TRUE(get.ok());
  ASSERT_TRUE(CopyPlanValues(*get, back.data(), kLen, CopyDirection::kFromValues).ok());
  EXPECT_EQ(back, bytes);
  ASSERT_TRUE(client->ReleaseViews(*get).ok());
  ASSERT_TRUE(peer->UnregisterRegion().ok());
}

// Item 4: a loopback data plane without a configured secret still authenticates (with the
// machine-local secret): a peer with an empty or a guessed secret is refused before any
// request is read, and the refusal names no generation.
TEST(DataPlane, LoopbackDataPlaneWithoutAConfiguredSecretRefusesAnEmptySecret) {
  Config c = TestConfig();
  c.owner->data_address = "127.0.0.1:0";
  auto node = StartNode(c);
  std::vector<uint8_t> local(4096, 0);
  for (const std::string& secret : {std::string(), std::string(32, 'a')}) {
    transport::TcpTransportOptions po;
    po.listen_address = "";
    po.cluster_secret = secret;
    auto peer = transport::TcpTransport::Create(po);
    ASSERT_TRUE(peer.ok());
    ASSERT_TRUE((*peer)->RegisterRegion(79, local.data(), local.size()).ok());
    const transport::Descriptor d{0, local.data(), local.size()};
    auto batch = (*peer)->Submit({node->data_address(), node->owner()->registration_generation()},
                                 transport::OpKind::kRead, {&d, 1}, absl::Seconds(5));
    ASSERT_TRUE(batch.ok());
    const absl::Status st = batch->Wait().status;
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
    EXPECT_EQ(
        std::string(st.message()).find(std::to_string(node->owner()->registration_generation())),
        std::string::npos);
    ASSERT_TRUE((*peer)->UnregisterRegion().ok());
  }
  // The server counts a refusal after it closed the connection: the peer may see it first.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (node->owner()->Stats()["data_plane_handshakes_refused"] < 2 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(node->owner()->Stats()["data_plane_handshakes_refused"], 2);
}

// A machine secret file another user could have planted (wrong mode) is refused, never read.
TEST(DataPlane, MachineSecretFileWithLooseModeIsRefused) {
  const std::string path = "/tmp/fluxon-test-machine-secret-" + std::to_string(::getpid());
  ::unlink(path.c_str());
  auto created = security::LoadOrCreateMachineSecret(path);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->size(), 64u);
  auto again = security::LoadOrCreateMachineSecret(path);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *created);  // one secret for every fluxond of this user
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  auto loose = security::LoadOrCreateMachineSecret(path);
  EXPECT_EQ(loose.status().code(), absl::StatusCode::kPermissionDenied);
  ::unlink(path.c_str());
}

// A local user who plants files under the temporary names an earlier version used
// (<secret>.<pid>.tmp, for every pid this process could have) does not stop the first start: the
// temporary name is unguessable, and the planted files are left alone.
TEST(DataPlane, PlantedTemporaryNamesDoNotStopTheMachineSecret) {
  const std::string path = "/tmp/fluxon-test-machine-secret-planted-" + std::to_string(::getpid());
  ::unlink(path.c_str());
  std::vector<std::string> planted;
  for (int pid = ::getpid() - 2; pid <= ::getpid() + 2; ++pid) {
    planted.push_back(path + "." + std::to_string(pid) + ".tmp");
    const int fd = ::open(planted.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    ASSERT_GE(fd, 0);
    ::close(fd);
  }
  auto created = security::LoadOrCreateMachineSecret(path);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->size(), 64u);
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  for (const auto& p : planted) {
    EXPECT_EQ(::access(p.c_str(), F_OK), 0) << p;
    ::unlink(p.c_str());
  }
  ::unlink(path.c_str());
}

TEST(DataPlane, OffByDefault) {
  Config c = TestConfig();
  auto node = StartNode(c);
  EXPECT_TRUE(node->data_address().empty());
}

}  // namespace
}  // namespace fluxon
