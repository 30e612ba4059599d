// The RDMA queue-pair exchange over the gRPC peer service: QP and MR information is given only to
// peers with a certificate of the cluster's CA, and the serving transport creates no queue pair
// for anyone else. (The conformance suite runs every transport test over this exchange too:
// TransportConformance/emulated_verbs__gRPC_exchange.)
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fluxon/v1/peer.grpc.pb.h"
#include "rpc_grpc/grpc_verbs_exchange.h"
#include "security/security_files.h"
#include "tests/transport/test_pki.h"
#include "transport/verbs/verbs_emulator.h"
#include "transport/verbs/verbs_transport.h"

namespace fluxon {
namespace {

using transport::OpKind;
using transport::verbs::VerbsTransport;
using transport::verbs::VerbsTransportOptions;

struct PeerNode {
  std::shared_ptr<GrpcVerbsExchange> exchange;
  std::unique_ptr<grpc::Server> server;
  std::string name;
  ~PeerNode() {
    if (server) server->Shutdown();
  }
};

GrpcSecurity Security(const testing::TestPki& pki, const std::string& leaf) {
  auto m = security::LoadTlsMaterial(pki.Config(leaf));
  EXPECT_TRUE(m.ok()) << m.status();
  return GrpcSecurity::MutualTls(*m);
}

std::unique_ptr<PeerNode> StartPeerService(const GrpcSecurity& sec) {
  auto n = std::make_unique<PeerNode>();
  n->exchange = std::make_shared<GrpcVerbsExchange>(sec, std::chrono::seconds(3));
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", sec.ServerCredentials(), &port);
  b.RegisterService(n->exchange->service());
  n->server = b.BuildAndStart();
  n->name = absl::StrCat("127.0.0.1:", port);
  return n;
}

std::unique_ptr<VerbsTransport> Transport(transport::verbs::EmulatedFabric& fabric,
                                          const PeerNode& node) {
  VerbsTransportOptions o;
  o.node_name = node.name;
  auto t = VerbsTransport::Create(o, fabric.AttachNode(node.name), node.exchange);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(GrpcVerbsExchange, MembersConnectPeersWithoutAClusterCertificateLearnNothing) {
  testing::TestPki pki;
  if (!pki.ok()) GTEST_SKIP() << "openssl could not make the test certificates";
  auto fabric_ptr = std::make_shared<transport::verbs::EmulatedFabric>();
  transport::verbs::EmulatedFabric& fabric = *fabric_ptr;
  auto server_node = StartPeerService(Security(pki, "node"));
  auto server = Transport(fabric, *server_node);
  std::vector<uint8_t> region(1 << 20, 0x3c);
  ASSERT_TRUE(server->RegisterRegion(5, region.data(), region.size()).ok());

  // A member reads through a queue pair set up over the authenticated exchange.
  auto member_node = StartPeerService(Security(pki, "node"));
  auto member = Transport(fabric, *member_node);
  std::vector<uint8_t> local(1 << 16, 0);
  ASSERT_TRUE(member->RegisterRegion(1, local.data(), local.size()).ok());
  transport::Descriptor d{0, local.data(), 4096};
  auto h = member->Submit({server_node->name, 5}, OpKind::kRead, {&d, 1}, absl::Seconds(5));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(h->Wait().status.ok()) << h->Wait().status;
  EXPECT_EQ(local[0], 0x3c);
  const uint64_t qps_for_member = server->stats().serving_connections;
  EXPECT_GT(qps_for_member, 0u);

  // An authenticated caller that names serving queue pairs by number, but not the initiator's
  // queue pair each serves (a stale or buggy peer), releases none of them: the member still reads.
  {
    auto stub = v1::PeerService::NewStub(Security(pki, "node").Channel(server_node->name));
    for (uint32_t qp = 0; qp < 4096; ++qp) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
      v1::ReleaseQpRequest req;
      req.set_node_name(server_node->name);
      req.set_qp_num(qp);
      req.set_initiator_qp_num(0xFFFFFFFFu);
      v1::ReleaseQpReply reply;
      ASSERT_TRUE(stub->ReleaseQp(&ctx, req, &reply).ok());
    }
    EXPECT_EQ(server->stats().serving_connections, qps_for_member);
    local[0] = 0;
    auto again = member->Submit({server_node->name, 5}, OpKind::kRead, {&d, 1}, absl::Seconds(5));
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE(again->Wait().status.ok()) << again->Wait().status;
    EXPECT_EQ(local[0], 0x3c);
  }

  // A peer whose certificate another CA signed: the TLS handshake fails, so ConnectQp never
  // reaches the acceptor and no queue pair is made for it.
  auto rogue_node = StartPeerService(Security(pki, "rogue"));
  auto rogue = Transport(fabric, *rogue_node);
  std::vector<uint8_t> rogue_mem(1 << 16, 0x11);
  ASSERT_TRUE(rogue->RegisterRegion(1, rogue_mem.data(), rogue_mem.size()).ok());
  for (OpKind op : {OpKind::kRead, OpKind::kWrite}) {
    transport::Descriptor rd{0, rogue_mem.data(), 4096};
    auto rh = rogue->Submit({server_node->name, 5}, op, {&rd, 1}, absl::Seconds(5));
    ASSERT_TRUE(rh.ok());
    EXPECT_FALSE(rh->Wait().status.ok());
    EXPECT_EQ(rh->Wait().bytes_ok, 0u);
  }
  EXPECT_EQ(region[0], 0x3c);
  EXPECT_EQ(rogue_mem[0], 0x11);
  EXPECT_EQ(server->stats().serving_connections, qps_for_member)
      << "the serving side made a queue pair for an unauthenticated peer";

  // A plaintext client of the peer service gets nothing either.
  auto plain = v1::PeerService::NewStub(
      grpc::CreateChannel(server_node->name, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  v1::ConnectQpRequest req;
  req.set_node_name(server_node->name);
  req.mutable_initiator()->set_gid(std::string(16, '\0'));
  v1::ConnectQpReply reply;
  EXPECT_FALSE(plain->ConnectQp(&ctx, req, &reply).ok());
  EXPECT_EQ(reply.rkey(), 0u);
  EXPECT_EQ(server->stats().serving_connections, qps_for_member);
  member.reset();
  rogue.reset();
  server.reset();
}

TEST(GrpcVerbsExchange, MalformedOrUnpublishedRequestsCreateNoQueuePair) {
  testing::TestPki pki;
  if (!pki.ok()) GTEST_SKIP() << "openssl could not make the test certificates";
  auto fabric_ptr = std::make_shared<transport::verbs::EmulatedFabric>();
  transport::verbs::EmulatedFabric& fabric = *fabric_ptr;
  const GrpcSecurity sec = Security(pki, "node");
  auto server_node = StartPeerService(sec);
  auto stub = v1::PeerService::NewStub(sec.Channel(server_node->name));
  auto call = [&](const v1::ConnectQpRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    v1::ConnectQpReply reply;
    return stub->ConnectQp(&ctx, req, &reply);
  };
  v1::ConnectQpRequest req;
  req.set_node_name(server_node->name);
  req.mutable_initiator()->set_gid(std::string(16, '\0'));
  // Nothing published yet.
  EXPECT_EQ(call(req).error_code(), grpc::UNAVAILABLE);
  auto server = Transport(fabric, *server_node);
  std::vector<uint8_t> region(1 << 20, 0);
  ASSERT_TRUE(server->RegisterRegion(5, region.data(), region.size()).ok());
  v1::ConnectQpRequest bad = req;
  bad.mutable_initiator()->set_gid("short");
  EXPECT_EQ(call(bad).error_code(), grpc::INVALID_ARGUMENT);
  bad = req;
  bad.mutable_initiator()->set_lid(70000);
  EXPECT_EQ(call(bad).error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(server->stats().serving_connections, 0u);
  server.reset();
  EXPECT_EQ(call(req).error_code(), grpc::UNAVAILABLE) << "withdrawn with its transport";
}

}  // namespace
}  // namespace fluxon
