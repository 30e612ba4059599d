// The data plane's membership proof (transport/tcp/tcp_handshake.h): a peer without the cluster
// secret is refused before any byte of the region is read or written, in both directions, and a
// connection that never completes the handshake is closed by its deadline.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "transport/tcp/tcp_handshake.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tcp_wire.h"

namespace fluxon::transport {
namespace {

using Clock = std::chrono::steady_clock;

struct SocketPair {
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0); }
  ~SocketPair() {
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  int fds[2] = {-1, -1};
};

struct Outcome {
  absl::Status client;
  absl::Status server;
};

Outcome Handshake(const std::string& client_secret, const std::string& server_secret) {
  SocketPair p;
  Outcome out;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  std::thread server([&] { out.server = tcp::ServerHandshake(p.fds[1], server_secret, deadline); });
  out.client = tcp::ClientHandshake(p.fds[0], client_secret, deadline);
  server.join();
  return out;
}

TEST(TcpHandshake, SameSecretPassesBothWays) {
  const Outcome o =
      Handshake("a cluster secret of 32 bytes ...", "a cluster secret of 32 bytes ...");
  EXPECT_TRUE(o.client.ok()) << o.client;
  EXPECT_TRUE(o.server.ok()) << o.server;
  const Outcome empty = Handshake("", "");
  EXPECT_TRUE(empty.client.ok() && empty.server.ok());
}

TEST(TcpHandshake, WrongSecretIsRefusedOnBothSides) {
  const Outcome o = Handshake("the client's secret, 16+ bytes", "the server's secret, 16+ bytes");
  EXPECT_EQ(o.server.code(), absl::StatusCode::kPermissionDenied) << o.server;
  EXPECT_EQ(o.client.code(), absl::StatusCode::kPermissionDenied) << o.client;
  // A secret that is a prefix of the other is a different key too.
  const Outcome prefix = Handshake("secret-secret-secret", "secret-secret-secret-2");
  EXPECT_EQ(prefix.server.code(), absl::StatusCode::kPermissionDenied);
  const Outcome none = Handshake("", "a real secret, long enough");
  EXPECT_EQ(none.server.code(), absl::StatusCode::kPermissionDenied);
}

// A fake server's first steps on `fd`: sends a fresh challenge, reads the client's proof.
void ChallengeAndReadProof(int fd, uint8_t (&proof)[72]) {
  uint8_t challenge[40] = {};
  const uint32_t magic = tcp::kChallengeMagic;
  std::memcpy(challenge, &magic, 4);
  challenge[4] = tcp::kHandshakeVersion;
  ASSERT_EQ(::send(fd, challenge, sizeof(challenge), 0), 40);
  ASSERT_EQ(::recv(fd, proof, sizeof(proof), MSG_WAITALL), 72);
}

TEST(TcpHandshake, ServerThatCannotProveTheSecretIsRefusedByTheClient) {
  // A fake server: a fresh challenge, then an "accepted" verdict with a MAC it could not compute.
  SocketPair p;
  absl::Status client;
  std::thread fake([&] {
    uint8_t proof[72];
    ASSERT_NO_FATAL_FAILURE(ChallengeAndReadProof(p.fds[1], proof));
    uint8_t verdict[40] = {};
    const uint32_t vmagic = tcp::kVerdictMagic;
    std::memcpy(verdict, &vmagic, 4);
    verdict[4] = 1;                                // accepted
    std::memcpy(verdict + 8, proof + 8 + 32, 32);  // echoes the client's own MAC back
    ASSERT_EQ(::send(p.fds[1], verdict, sizeof(verdict), 0), 40);
  });
  client = tcp::ClientHandshake(p.fds[0], "the cluster secret, 16+ bytes",
                                Clock::now() + std::chrono::seconds(5));
  fake.join();
  EXPECT_EQ(client.code(), absl::StatusCode::kPermissionDenied) << client;
}

TEST(TcpHandshake, PeerThatDiesBeforeItsVerdictIsAnOutageNotARefusal) {
  SocketPair p;
  std::thread dying([&] {
    uint8_t proof[72];
    ASSERT_NO_FATAL_FAILURE(ChallengeAndReadProof(p.fds[1], proof));
    ::shutdown(p.fds[1], SHUT_RDWR);  // gone before the verdict
  });
  const absl::Status s = tcp::ClientHandshake(p.fds[0], "the cluster secret, 16+ bytes",
                                              Clock::now() + std::chrono::seconds(5));
  dying.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST(TcpHandshake, SilentPeerEndsAtTheDeadline) {
  SocketPair p;
  const auto start = Clock::now();
  const absl::Status s =
      tcp::ServerHandshake(p.fds[1], "secret", start + std::chrono::milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
}

// ----- Through TcpTransport: serving side and initiator with their own secrets -------------

std::unique_ptr<TcpTransport> MakeTransport(const std::string& secret, bool listen,
                                            absl::Duration handshake_timeout = absl::Seconds(5)) {
  TcpTransportOptions o;
  o.listen_address = listen ? "127.0.0.1:0" : "";
  o.connections_per_peer = 2;
  o.request_bytes = 64 << 10;
  o.max_inflight_bytes_per_peer = 1 << 20;
  o.cluster_secret = secret;
  o.handshake_timeout = handshake_timeout;
  auto t = TcpTransport::Create(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

struct Served {
  // Serves the region through `t` under `generation`.
  absl::Status Serve(std::unique_ptr<TcpTransport> t, uint64_t generation) {
    transport = std::move(t);
    return transport->RegisterRegion(generation, region.data(), region.size());
  }
  // ... through a listening transport of `secret`.
  absl::Status Serve(const std::string& secret, uint64_t generation,
                     absl::Duration handshake_timeout = absl::Seconds(5)) {
    return Serve(MakeTransport(secret, /*listen=*/true, handshake_timeout), generation);
  }

  std::vector<uint8_t> region = std::vector<uint8_t>(1 << 20, 0x5a);
  std::unique_ptr<TcpTransport> transport;
};

// The server's handshakes_refused once it reached `at_least`, or after 2 s: it counts a refusal
// after sending its verdict.
uint64_t RefusalsWithin2s(TcpTransport& server, uint64_t at_least) {
  for (int i = 0; i < 200 && server.stats().handshakes_refused < at_least; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return server.stats().handshakes_refused;
}

TEST(TcpTransportSecret, MembersMoveBytesOthersAreRefusedAndTouchNothing) {
  Served server;
  ASSERT_TRUE(server.Serve("cluster secret: fluxon-test-1", 7).ok());

  std::vector<uint8_t> local(1 << 16, 0x11);
  auto member = MakeTransport("cluster secret: fluxon-test-1", /*listen=*/false);
  ASSERT_TRUE(member->RegisterRegion(1, local.data(), local.size()).ok());
  Descriptor d{0, local.data(), 4096};
  auto h =
      member->Submit({server.transport->endpoint(), 7}, OpKind::kRead, {&d, 1}, absl::Seconds(5));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(h->Wait().status.ok()) << h->Wait().status;
  EXPECT_EQ(local[0], 0x5a);

  std::vector<uint8_t> other_mem(1 << 16, 0x22);
  auto outsider = MakeTransport("a different secret, fluxon-test", /*listen=*/false);
  ASSERT_TRUE(outsider->RegisterRegion(1, other_mem.data(), other_mem.size()).ok());
  for (OpKind op : {OpKind::kWrite, OpKind::kRead}) {
    Descriptor od{0, other_mem.data(), 4096};
    auto oh = outsider->Submit({server.transport->endpoint(), 7}, op, {&od, 1}, absl::Seconds(5));
    ASSERT_TRUE(oh.ok());
    const BatchResult& r = oh->Wait();
    EXPECT_EQ(r.status.code(), absl::StatusCode::kPermissionDenied) << r.status;
    EXPECT_EQ(r.bytes_ok, 0u);
  }
  EXPECT_EQ(server.region[0], 0x5a) << "a refused write changed the region";
  EXPECT_EQ(other_mem[0], 0x22) << "a refused read filled local memory";
  // The server counts a refusal after sending its verdict: poll (bounded) for both.
  EXPECT_GE(RefusalsWithin2s(*server.transport, 2), 2u);

  // A member that served nothing to the outsider still serves members afterwards.
  auto again =
      member->Submit({server.transport->endpoint(), 7}, OpKind::kRead, {&d, 1}, absl::Seconds(5));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->Wait().status.ok());
}

int ConnectLoopback(const std::string& endpoint) {
  const int port = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// Reads until EOF (or 5 s); returns the bytes received.
size_t DrainUntilClosed(int fd) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  size_t total = 0;
  uint8_t buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    // Closed: EOF, or a reset (the server closed with our unread bytes in its buffer).
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return total;
    if (n < 0) return SIZE_MAX;
    total += static_cast<size_t>(n);
  }
}

TEST(TcpTransportSecret, RequestWithoutHandshakeIsNeverServed) {
  Served server;
  ASSERT_TRUE(server.Serve("cluster secret: fluxon-test-2", 9).ok());
  // A raw peer skips the handshake and sends a well-formed write request for offset 0.
  const int fd = ConnectLoopback(server.transport->endpoint());
  std::vector<uint8_t> msg(sizeof(tcp::RequestHeader) + sizeof(tcp::WireDescriptor) + 4096, 0x77);
  tcp::RequestHeader h;
  h.op = static_cast<uint8_t>(OpKind::kWrite);
  h.descriptor_count = 1;
  h.generation = 9;
  h.payload_bytes = 4096;
  tcp::WireDescriptor wd{0, 4096};
  std::memcpy(msg.data(), &h, sizeof(h));
  std::memcpy(msg.data() + sizeof(h), &wd, sizeof(wd));
  uint8_t challenge[40];
  ASSERT_EQ(::recv(fd, challenge, sizeof(challenge), MSG_WAITALL), 40);
  (void)::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL);
  // The server found no proof in the request's first 72 bytes and closed: no reply, ever.
  EXPECT_EQ(DrainUntilClosed(fd), 0u);
  ::close(fd);
  EXPECT_EQ(server.region[0], 0x5a);
  EXPECT_EQ(RefusalsWithin2s(*server.transport, 1), 1u);
}

TEST(TcpTransportSecret, ConnectionThatNeverProvesIsClosedByTheHandshakeTimeout) {
  Served server;
  ASSERT_TRUE(server.Serve("s3cret-s3cret-s3cret", 3, absl::Milliseconds(300)).ok());
  const int fd = ConnectLoopback(server.transport->endpoint());
  const auto start = Clock::now();
  EXPECT_EQ(DrainUntilClosed(fd), 40u) << "only the challenge, then the close";
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4));
  ::close(fd);
  EXPECT_EQ(RefusalsWithin2s(*server.transport, 1), 1u);
}

// Cluster hardening, item 6: silent TCP connects (no handshake) cannot lock members out; the
// oldest unauthenticated connection makes room, and members keep reading throughout.
TEST(TcpTransportSecret, SilentConnectsDoNotLockMembersOut) {
  Served server;
  ASSERT_TRUE(server.Serve("cluster secret: fluxon-test-6", 6, absl::Seconds(5)).ok());
  std::vector<int> silent;
  for (int i = 0; i < 300; ++i) silent.push_back(ConnectLoopback(server.transport->endpoint()));
  std::vector<uint8_t> local(1 << 16, 0x11);
  auto member = MakeTransport("cluster secret: fluxon-test-6", /*listen=*/false);
  ASSERT_TRUE(member->RegisterRegion(1, local.data(), local.size()).ok());
  for (int round = 0; round < 5; ++round) {
    Descriptor d{0, local.data(), 4096};
    auto h =
        member->Submit({server.transport->endpoint(), 6}, OpKind::kRead, {&d, 1}, absl::Seconds(3));
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(h->Wait().status.ok()) << "round " << round << ": " << h->Wait().status;
  }
  // Evicted connections are shut down at once but counted until their threads have closed them:
  // on a loaded machine that takes a moment, so the bound is checked within 2 s.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (server.transport->stats().serving_connections > 64u + 2u &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_LE(server.transport->stats().serving_connections, 64u + 2u);
  for (int fd : silent) ::close(fd);
}

// An authenticated connection idle for idle_timeout is closed; the member reconnects on its next
// batch.
TEST(TcpTransportSecret, IdleConnectionIsClosedAndTheMemberReconnects) {
  Served server;
  TcpTransportOptions o;
  o.listen_address = "127.0.0.1:0";
  o.cluster_secret = "cluster secret: fluxon-test-7";
  o.idle_timeout = absl::Milliseconds(200);
  auto t = TcpTransport::Create(o);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(server.Serve(std::move(*t), 7).ok());
  std::vector<uint8_t> local(1 << 16, 0x11);
  auto member = MakeTransport("cluster secret: fluxon-test-7", /*listen=*/false);
  ASSERT_TRUE(member->RegisterRegion(1, local.data(), local.size()).ok());
  Descriptor d{0, local.data(), 4096};
  auto first =
      member->Submit({server.transport->endpoint(), 7}, OpKind::kRead, {&d, 1}, absl::Seconds(5));
  ASSERT_TRUE(first.ok() && first->Wait().status.ok());
  for (int i = 0; i < 300 && server.transport->stats().serving_connections > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server.transport->stats().serving_connections, 0u);
  EXPECT_GE(server.transport->stats().idle_closed, 1u);
  local[0] = 0;
  bool ok = false;
  for (int attempt = 0; attempt < 3 && !ok; ++attempt) {  // at most one batch meets the close
    auto again =
        member->Submit({server.transport->endpoint(), 7}, OpKind::kRead, {&d, 1}, absl::Seconds(5));
    ok = again.ok() && again->Wait().status.ok();
  }
  EXPECT_TRUE(ok);
  EXPECT_EQ(local[0], 0x5a);
}

// More than 64 requesters (each with several connections) are served by one source at once.
TEST(TcpTransportSecret, OneSourceServes128Requesters) {
  Served server;
  ASSERT_TRUE(server.Serve("cluster secret: fluxon-test-8", 8).ok());
  constexpr int kRequesters = 128;
  std::vector<std::vector<uint8_t>> locals(kRequesters, std::vector<uint8_t>(8192, 0));
  std::vector<std::unique_ptr<TcpTransport>> members;
  for (int i = 0; i < kRequesters; ++i) {
    TcpTransportOptions o;
    o.listen_address = "";
    o.connections_per_peer = 4;
    o.cluster_secret = "cluster secret: fluxon-test-8";
    auto m = TcpTransport::Create(o);
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE((*m)->RegisterRegion(1, locals[i].data(), locals[i].size()).ok());
    members.push_back(std::move(*m));
  }
  std::vector<BatchHandle> batches;
  std::vector<Descriptor> descs(kRequesters);
  for (int i = 0; i < kRequesters; ++i) {
    descs[i] = Descriptor{static_cast<uint64_t>(i) * 4096, locals[i].data(), 4096};
    auto h = members[i]->Submit({server.transport->endpoint(), 8}, OpKind::kRead, {&descs[i], 1},
                                absl::Seconds(20));
    ASSERT_TRUE(h.ok());
    batches.push_back(*h);
  }
  int ok = 0;
  for (auto& b : batches) ok += b.Wait().status.ok();
  EXPECT_EQ(ok, kRequesters);
  for (int i = 0; i < kRequesters; ++i) EXPECT_EQ(locals[i][0], 0x5a) << i;
}

}  // namespace
}  // namespace fluxon::transport
