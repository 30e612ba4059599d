// One conformance suite for every Transport: TCP against a real peer process,
// the verbs transport over the in-process verbs emulator, and over real libibverbs where a device
// exists (skipped with a message otherwise).
//
// Every wait here is bounded; every test ends by checking that the initiator's outstanding
// batches, in-flight and queued bytes are back to zero (and, for the emulator, that it saw no
// violation and that every verbs object was destroyed).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/transport/peer_process.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/tcp_wire.h"
#include "transport/transport.h"
#ifdef FLUXON_HAVE_VERBS_TRANSPORT
#include "transport/verbs/verbs_api.h"
#include "transport/verbs/verbs_emulator.h"
#include "transport/verbs/verbs_transport.h"
#ifdef FLUXON_HAVE_VERBS_GRPC
#include <grpcpp/grpcpp.h>

#include <map>

#include "rpc_grpc/grpc_verbs_exchange.h"
#include "security/security_files.h"
#include "tests/transport/test_pki.h"
#endif
#endif

namespace fluxon::transport {
namespace {

using testing::PeerProcess;
using testing::SharedMemory;

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;
constexpr uint64_t kPageValue = 4718592;  // 4.5 MiB: one SGLang page of the benchmark model
constexpr absl::Duration kTimeout = absl::Seconds(20);
constexpr absl::Duration kWaitBound = absl::Seconds(30);

// Deterministic bytes: position- and seed-dependent, so a misplaced copy never matches.
void Fill(uint8_t* p, uint64_t len, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  uint64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < len; ++i) p[i] = static_cast<uint8_t>(x >> (i % 8));
}

// The peer side of a test: a region served by some transport, mapped in this process too.
class PeerHarness {
 public:
  virtual ~PeerHarness() = default;
  virtual PeerId id() const = 0;  // address + the generation it serves now
  virtual uint8_t* memory() const = 0;
  virtual uint64_t len() const = 0;
  virtual void Kill() = 0;                        // kill -9 / an emulated host crash
  virtual void Stall(bool stalled) = 0;           // SIGSTOP / the emulator holds its work
  virtual void Restart(uint64_t generation) = 0;  // same address and memory, new generation
};

// Local memory of the initiator: anonymous, registered with the initiator transport.
class LocalRegion {
 public:
  explicit LocalRegion(uint64_t len) : len_(len) {
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~LocalRegion() {
    if (base_) ::munmap(base_, len_);
  }
  uint8_t* base() const { return base_; }
  uint64_t len() const { return len_; }

 private:
  uint8_t* base_;
  uint64_t len_;
};

// ----- TCP: the peer is a transport_peer child process ---------------------------------------

class TcpPeer final : public PeerHarness {
 public:
  TcpPeer(std::unique_ptr<SharedMemory> mem, uint64_t generation)
      : mem_(std::move(mem)), generation_(generation) {
    Spawn(0);
  }
  PeerId id() const override { return {address_, generation_}; }
  uint8_t* memory() const override { return mem_->base(); }
  uint64_t len() const override { return mem_->len(); }
  void Kill() override {
    if (proc_) proc_->Kill();
  }
  void Stall(bool stalled) override { proc_->Stop(stalled); }
  void Restart(uint64_t generation) override {
    const int port = proc_->port();
    proc_->Kill();
    proc_.reset();
    generation_ = generation;
    Spawn(port);
  }

 private:
  void Spawn(int port) {
    auto p = PeerProcess::Start(TRANSPORT_PEER_PATH, *mem_, generation_, port);
    if (!p.ok()) {
      ADD_FAILURE() << "transport_peer: " << p.status();
      return;
    }
    proc_ = std::move(*p);
    address_ = proc_->address();
  }

  std::unique_ptr<SharedMemory> mem_;
  uint64_t generation_;
  std::unique_ptr<PeerProcess> proc_;
  std::string address_;
};

struct TcpEnv {
  static constexpr const char* kName = "tcp";
  absl::Status Available() { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<Transport>> MakeInitiator() {
    TcpTransportOptions o;
    o.listen_address = "";  // initiator only
    o.connections_per_peer = 4;
    o.request_bytes = 1 * MiB;
    o.max_inflight_bytes_per_peer = kMaxInflight;
    auto t = TcpTransport::Create(o);
    if (!t.ok()) return t.status();
    return std::unique_ptr<Transport>(std::move(*t));
  }
  std::unique_ptr<PeerHarness> StartPeer(uint64_t len, uint64_t generation) {
    auto mem = SharedMemory::Create(len);
    if (!mem.ok()) {
      ADD_FAILURE() << mem.status();
      return nullptr;
    }
    return std::make_unique<TcpPeer>(std::move(*mem), generation);
  }
  void CheckClean() {}
  static constexpr uint64_t kMaxInflight = 32 * MiB;
};

#ifdef FLUXON_HAVE_VERBS_TRANSPORT
// ----- Verbs over the emulator: the peer is a second VerbsTransport on the emulated fabric ----

class VerbsPeer final : public PeerHarness {
 public:
  using Factory = std::function<std::unique_ptr<Transport>(const std::string& node)>;
  VerbsPeer(std::string node, uint64_t len, uint64_t generation, Factory make,
            std::function<void(const std::string&, bool)> kill_or_revive,
            std::function<void(const std::string&, bool)> stall)
      : node_(std::move(node)),
        local_(len),
        generation_(generation),
        make_(std::move(make)),
        kill_or_revive_(std::move(kill_or_revive)),
        stall_(std::move(stall)) {
    Serve();
  }
  ~VerbsPeer() override { transport_.reset(); }
  PeerId id() const override { return {node_, generation_}; }
  uint8_t* memory() const override { return local_.base(); }
  uint64_t len() const override { return local_.len(); }
  void Kill() override {
    kill_or_revive_(node_, /*kill=*/true);
    transport_.reset();  // the dead host's objects are gone; its transport tears down quietly
  }
  void Stall(bool stalled) override { stall_(node_, stalled); }
  void Restart(uint64_t generation) override {
    Kill();
    kill_or_revive_(node_, /*kill=*/false);
    generation_ = generation;
    Serve();
  }

 private:
  void Serve() {
    transport_ = make_(node_);
    ASSERT_NE(transport_, nullptr);
    ASSERT_TRUE(transport_->RegisterRegion(generation_, local_.base(), local_.len()).ok());
  }
  std::string node_;
  LocalRegion local_;
  uint64_t generation_;
  Factory make_;
  std::function<void(const std::string&, bool)> kill_or_revive_;
  std::function<void(const std::string&, bool)> stall_;
  std::unique_ptr<Transport> transport_;
};

// The emulated fabric the verbs environments share: transports attach to it by node name; how
// their queue pairs are exchanged is the environment's.
class EmulatedFabricEnv {
 public:
  EmulatedFabricEnv() {
    verbs::EmulatorOptions eo;
    eo.assert_on_violation = false;  // checked at the end of every test instead (CheckClean)
    fabric = std::make_shared<verbs::EmulatedFabric>(eo);
  }
  absl::Status Available() { return absl::OkStatus(); }
  void CheckClean() {
    EXPECT_EQ(fabric->violations(), 0u) << fabric->last_violation();
    EXPECT_EQ(fabric->live_objects(), 0u) << "verbs objects leaked";
  }
  static constexpr uint64_t kMaxInflight = 32 * MiB;

 protected:
  std::unique_ptr<Transport> MakeOn(const std::string& node,
                                    std::shared_ptr<verbs::VerbsExchange> exchange) {
    verbs::VerbsTransportOptions o;
    o.node_name = node;
    o.qps_per_peer = 2;
    o.max_wr_bytes = 1 * MiB;
    o.max_outstanding_wr_per_qp = 16;
    o.max_inflight_bytes_per_peer = kMaxInflight;
    o.serve_remote_writes = true;  // the suite writes into peers (owners never allow it)
    auto t = verbs::VerbsTransport::Create(o, fabric->AttachNode(node), std::move(exchange));
    if (!t.ok()) {
      ADD_FAILURE() << t.status();
      return nullptr;
    }
    return std::move(*t);
  }
  absl::StatusOr<std::unique_ptr<Transport>> InitiatorOn(const std::string& node,
                                                         VerbsPeer::Factory make) {
    auto t = make(node);
    if (!t) return absl::InternalError("initiator");
    return t;
  }
  std::unique_ptr<PeerHarness> PeerOn(std::string node, uint64_t len, uint64_t generation,
                                      VerbsPeer::Factory make) {
    auto fabric_ref = fabric;
    return std::make_unique<VerbsPeer>(
        std::move(node), len, generation, std::move(make),
        [fabric_ref](const std::string& n, bool kill) {
          if (kill) {
            fabric_ref->KillNode(n);
          } else {
            fabric_ref->ReviveNode(n);
          }
        },
        [fabric_ref](const std::string& n, bool stalled) {
          fabric_ref->SetNodeStalled(n, stalled);
        });
  }

  std::shared_ptr<verbs::EmulatedFabric> fabric;
};

struct EmulatedVerbsEnv : EmulatedFabricEnv {
  static constexpr const char* kName = "emulated verbs";
  std::unique_ptr<Transport> Make(const std::string& node) { return MakeOn(node, exchange); }
  VerbsPeer::Factory Factory() {
    return [this](const std::string& node) { return Make(node); };
  }
  absl::StatusOr<std::unique_ptr<Transport>> MakeInitiator() {
    return InitiatorOn(absl::StrCat("initiator-", next_++), Factory());
  }
  std::unique_ptr<PeerHarness> StartPeer(uint64_t len, uint64_t generation) {
    return PeerOn(absl::StrCat("peer-", next_++), len, generation, Factory());
  }
  std::shared_ptr<verbs::InProcessVerbsExchange> exchange =
      std::make_shared<verbs::InProcessVerbsExchange>();
  int next_ = 0;
};

#ifdef FLUXON_HAVE_VERBS_GRPC
// The emulated fabric, with the queue-pair exchange over the gRPC peer service under mutual TLS:
// every node (initiator and peers) serves its own PeerService on loopback, and its transport's
// name is that service's address.
struct GrpcVerbsEnv : EmulatedFabricEnv {
  static constexpr const char* kName = "emulated verbs, gRPC exchange";
  absl::Status Available() {
    if (!pki.ok()) return absl::UnavailableError("openssl could not make the test certificates");
    return absl::OkStatus();
  }
  struct Node {
    std::shared_ptr<GrpcVerbsExchange> exchange;
    std::unique_ptr<grpc::Server> server;
  };
  // Starts a node's peer service; returns its address (the transport's name).
  std::string StartNode() {
    auto material = security::LoadTlsMaterial(pki.Config("node"));
    EXPECT_TRUE(material.ok()) << material.status();
    const GrpcSecurity sec = GrpcSecurity::MutualTls(*material);
    auto node = std::make_unique<Node>();
    node->exchange = std::make_shared<GrpcVerbsExchange>(sec);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", sec.ServerCredentials(), &port);
    b.RegisterService(node->exchange->service());
    node->server = b.BuildAndStart();
    const std::string name = absl::StrCat("127.0.0.1:", port);
    nodes[name] = std::move(node);
    return name;
  }
  std::unique_ptr<Transport> Make(const std::string& node) {
    return MakeOn(node, nodes.at(node)->exchange);
  }
  VerbsPeer::Factory Factory() {
    return [this](const std::string& node) { return Make(node); };
  }
  absl::StatusOr<std::unique_ptr<Transport>> MakeInitiator() {
    return InitiatorOn(StartNode(), Factory());
  }
  std::unique_ptr<PeerHarness> StartPeer(uint64_t len, uint64_t generation) {
    return PeerOn(StartNode(), len, generation, Factory());
  }
  ~GrpcVerbsEnv() {
    for (auto& [name, node] : nodes) node->server->Shutdown();
  }
  fluxon::testing::TestPki pki;
  std::map<std::string, std::unique_ptr<Node>> nodes;
};
#endif

struct HardwareVerbsEnv {
  static constexpr const char* kName = "verbs (hardware)";
  absl::Status Available() {
    api = verbs::MakeIbverbsApi();
    auto devices = api->ListDevices();
    if (!devices.ok()) return devices.status();
    if (devices->empty()) return absl::NotFoundError("ibv_get_device_list returned no device");
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Transport>> MakeInitiator() {
    return absl::UnimplementedError("unreached without a device");
  }
  std::unique_ptr<PeerHarness> StartPeer(uint64_t, uint64_t) { return nullptr; }
  void CheckClean() {}
  static constexpr uint64_t kMaxInflight = 32 * MiB;
  std::unique_ptr<verbs::VerbsApi> api;
};
#endif

// ----- The suite ---------------------------------------------------------------------------

template <typename Env>
class TransportConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status available = env_.Available();
    if (!available.ok()) {
      GTEST_SKIP() << Env::kName << " not available here: " << available;
    }
    auto t = env_.MakeInitiator();
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = std::move(*t);
  }

  void TearDown() override {
    if (transport_) {
      // Completion hooks run just after Wait() returns: allow a moment to settle.
      TransportStats s;
      for (int i = 0; i < 200; ++i) {
        s = transport_->stats();
        if (s.outstanding_batches == 0 && s.inflight_bytes == 0 && s.queued_bytes == 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_EQ(s.outstanding_batches, 0u);
      EXPECT_EQ(s.inflight_bytes, 0u);
      EXPECT_EQ(s.queued_bytes, 0u);
      if (local_) {
        EXPECT_TRUE(transport_->UnregisterRegion().ok());
      }
      transport_.reset();
    }
    peer_.reset();
    local_.reset();
    env_.CheckClean();
  }

  void Start(uint64_t peer_len, uint64_t local_len, uint64_t generation = 7) {
    peer_ = env_.StartPeer(peer_len, generation);
    ASSERT_NE(peer_, nullptr);
    local_ = std::make_unique<LocalRegion>(local_len);
    ASSERT_NE(local_->base(), nullptr);
    ASSERT_TRUE(transport_->RegisterRegion(1, local_->base(), local_len).ok());
  }

  BatchResult Run(OpKind op, const std::vector<Descriptor>& d, absl::Duration timeout = kTimeout,
                  const PeerId* peer = nullptr) {
    auto h = transport_->Submit(peer ? *peer : peer_->id(), op, d, timeout);
    if (!h.ok()) return BatchResult{h.status(), {}, 0};
    EXPECT_TRUE(h->WaitFor(kWaitBound)) << "batch did not complete within the bound";
    return h->Wait();
  }

  // Writes `count` values of `size` to the peer and reads them back into another local area.
  void RoundTrip(uint64_t size, int count) {
    std::vector<Descriptor> w, r;
    for (int i = 0; i < count; ++i) {
      uint8_t* src = local_->base() + i * size;
      Fill(src, size, size + i);
      w.push_back({static_cast<uint64_t>(i) * size, src, size});
      r.push_back({static_cast<uint64_t>(i) * size, local_->base() + (count + i) * size, size});
    }
    BatchResult wr = Run(OpKind::kWrite, w);
    ASSERT_TRUE(wr.status.ok()) << wr.status;
    EXPECT_EQ(wr.bytes_ok, size * count);
    for (int i = 0; i < count; ++i) {
      ASSERT_EQ(std::memcmp(peer_->memory() + i * size, local_->base() + i * size, size), 0)
          << "write of value " << i << " (" << size << " B) not byte-exact";
    }
    BatchResult rd = Run(OpKind::kRead, r);
    ASSERT_TRUE(rd.status.ok()) << rd.status;
    ASSERT_EQ(rd.descriptors.size(), static_cast<size_t>(count));
    for (int i = 0; i < count; ++i) {
      EXPECT_TRUE(rd.descriptors[i].ok());
      ASSERT_EQ(std::memcmp(local_->base() + (count + i) * size, local_->base() + i * size, size),
                0)
          << "read of value " << i << " (" << size << " B) not byte-exact";
    }
  }

  // Waits (bounded) until the initiator has no connection open to anything.
  void WaitNoConnections() {
    for (int i = 0; i < 300 && transport_->stats().open_connections > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  Env env_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<PeerHarness> peer_;
  std::unique_ptr<LocalRegion> local_;
};

#if defined(FLUXON_HAVE_VERBS_GRPC)
using Envs = ::testing::Types<TcpEnv, EmulatedVerbsEnv, GrpcVerbsEnv, HardwareVerbsEnv>;
#elif defined(FLUXON_HAVE_VERBS_TRANSPORT)
using Envs = ::testing::Types<TcpEnv, EmulatedVerbsEnv, HardwareVerbsEnv>;
#else
using Envs = ::testing::Types<TcpEnv>;
#endif
class EnvNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    std::string n = T::kName;
    for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    return n;
  }
};
TYPED_TEST_SUITE(TransportConformance, Envs, EnvNames);

TYPED_TEST(TransportConformance, ByteExact4KiB) {
  this->Start(4 * MiB, 4 * MiB);
  this->RoundTrip(4 * KiB, 64);
}

TYPED_TEST(TransportConformance, ByteExact64KiB) {
  this->Start(8 * MiB, 8 * MiB);
  this->RoundTrip(64 * KiB, 32);
}

TYPED_TEST(TransportConformance, ByteExact4_5MiB) {
  this->Start(8 * kPageValue, 16 * kPageValue);
  this->RoundTrip(kPageValue, 8);
}

TYPED_TEST(TransportConformance, ByteExact512MiBValue) {
  constexpr uint64_t kBig = 512 * MiB;
  this->Start(kBig, kBig);
  uint8_t* local = this->local_->base();
  Fill(local, kBig, 512);
  BatchResult w = this->Run(OpKind::kWrite, {{0, local, kBig}}, absl::Seconds(60));
  ASSERT_TRUE(w.status.ok()) << w.status;
  ASSERT_EQ(std::memcmp(this->peer_->memory(), local, kBig), 0) << "512 MiB write not byte-exact";
  std::memset(local, 0, kBig);
  BatchResult r = this->Run(OpKind::kRead, {{0, local, kBig}}, absl::Seconds(60));
  ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(std::memcmp(this->peer_->memory(), local, kBig), 0) << "512 MiB read not byte-exact";
}

TYPED_TEST(TransportConformance, Batch128DescriptorsScattered) {
  constexpr uint64_t kSize = 16 * KiB;
  this->Start(8 * MiB, 8 * MiB);
  // Remote offsets in a shuffled order, local addresses in another: each descriptor stands alone.
  std::vector<uint64_t> slots(128);
  for (int i = 0; i < 128; ++i) slots[i] = i;
  std::mt19937 rng(42);
  std::shuffle(slots.begin(), slots.end(), rng);
  Fill(this->peer_->memory(), 128 * kSize * 2, 99);
  std::vector<Descriptor> r;
  for (int i = 0; i < 128; ++i) {
    r.push_back({slots[i] * kSize * 2, this->local_->base() + i * kSize, kSize});
  }
  BatchResult res = this->Run(OpKind::kRead, r);
  ASSERT_TRUE(res.status.ok()) << res.status;
  ASSERT_EQ(res.descriptors.size(), 128u);
  for (int i = 0; i < 128; ++i) {
    ASSERT_EQ(std::memcmp(this->local_->base() + i * kSize,
                          this->peer_->memory() + slots[i] * kSize * 2, kSize),
              0)
        << "descriptor " << i;
  }
}

TYPED_TEST(TransportConformance, ConcurrentBatchesFromThreads) {
  constexpr int kThreads = 4, kBatches = 12, kPerBatch = 16;
  constexpr uint64_t kSize = 64 * KiB;
  constexpr uint64_t kPerThread = kPerBatch * kSize;
  this->Start(kThreads * kPerThread, 2 * kThreads * kPerThread);
  std::atomic<int> failures{0};
  std::atomic<bool> stop_sampling{false};
  std::atomic<uint64_t> max_inflight{0};
  std::thread sampler([&] {
    while (!stop_sampling.load()) {
      max_inflight = std::max<uint64_t>(max_inflight, this->transport_->stats().inflight_bytes);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      uint8_t* src = this->local_->base() + t * 2 * kPerThread;
      uint8_t* dst = src + kPerThread;
      const uint64_t remote = t * kPerThread;
      for (int b = 0; b < kBatches; ++b) {
        Fill(src, kPerThread, t * 1000 + b);
        std::vector<Descriptor> w, r;
        for (int i = 0; i < kPerBatch; ++i) {
          w.push_back({remote + i * kSize, src + i * kSize, kSize});
          r.push_back({remote + i * kSize, dst + i * kSize, kSize});
        }
        if (!this->Run(OpKind::kWrite, w).status.ok() || !this->Run(OpKind::kRead, r).status.ok() ||
            std::memcmp(src, dst, kPerThread) != 0) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  stop_sampling = true;
  sampler.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(max_inflight.load(), TypeParam::kMaxInflight);
}

TYPED_TEST(TransportConformance, RefusesOutOfRangeAndOverflow) {
  constexpr uint64_t kLen = 1 * MiB;
  this->Start(kLen, 1 * MiB);
  std::memset(this->peer_->memory(), 0xAB, kLen);
  uint8_t* l = this->local_->base();
  std::memset(l, 0x11, 64 * KiB);
  const std::vector<Descriptor> d = {
      {0, l, 4 * KiB},                          // fine
      {kLen - 100, l + 4 * KiB, 4 * KiB},       // runs past the end
      {UINT64_MAX - 10, l + 8 * KiB, 4 * KiB},  // offset + len overflows
      {kLen, l + 12 * KiB, 1},                  // starts at the end
      {kLen - 4 * KiB, l + 16 * KiB, 4 * KiB},  // fine: the last page
  };
  BatchResult w = this->Run(OpKind::kWrite, d);
  EXPECT_EQ(w.status.code(), absl::StatusCode::kOutOfRange) << w.status;
  ASSERT_EQ(w.descriptors.size(), d.size());
  EXPECT_TRUE(w.descriptors[0].ok());
  EXPECT_EQ(w.descriptors[1].code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(w.descriptors[2].code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(w.descriptors[3].code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(w.descriptors[4].ok());
  // Only the two accepted ranges changed.
  for (uint64_t i = 0; i < kLen; ++i) {
    const bool written = i < 4 * KiB || i >= kLen - 4 * KiB;
    if (this->peer_->memory()[i] != (written ? 0x11 : 0xAB)) {
      FAIL() << "peer byte " << i << " is " << int(this->peer_->memory()[i]);
    }
  }
  BatchResult r = this->Run(OpKind::kRead, d);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(r.descriptors[0].ok());
  EXPECT_EQ(r.descriptors[2].code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(r.descriptors[4].ok());
}

TYPED_TEST(TransportConformance, RefusesStaleGeneration) {
  this->Start(1 * MiB, 1 * MiB, /*generation=*/7);
  std::memset(this->peer_->memory(), 0xCD, 1 * MiB);
  std::memset(this->local_->base(), 0x22, 64 * KiB);
  PeerId stale = this->peer_->id();
  stale.expected_generation = 6;
  BatchResult w =
      this->Run(OpKind::kWrite, {{0, this->local_->base(), 64 * KiB}}, kTimeout, &stale);
  EXPECT_EQ(w.status.code(), absl::StatusCode::kFailedPrecondition) << w.status;
  EXPECT_NE(w.status.message().find("generation"), std::string::npos) << w.status;
  EXPECT_EQ(this->peer_->memory()[0], 0xCD) << "a refused write reached the region";
  BatchResult ok = this->Run(OpKind::kWrite, {{0, this->local_->base(), 64 * KiB}});
  EXPECT_TRUE(ok.status.ok()) << ok.status;
}

TYPED_TEST(TransportConformance, RejectsBadArgumentsAtSubmit) {
  this->Start(1 * MiB, 1 * MiB);
  auto peer = this->peer_->id();
  EXPECT_EQ(this->transport_->Submit(peer, OpKind::kRead, {}, kTimeout).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> outside(4096);
  std::vector<Descriptor> d = {{0, outside.data(), outside.size()}};
  EXPECT_EQ(this->transport_->Submit(peer, OpKind::kRead, d, kTimeout).status().code(),
            absl::StatusCode::kInvalidArgument);
  d = {{0, this->local_->base(), 0}};
  EXPECT_EQ(this->transport_->Submit(peer, OpKind::kRead, d, kTimeout).status().code(),
            absl::StatusCode::kInvalidArgument);
  d = {{0, this->local_->base() + 1 * MiB - 10, 4096}};  // local range past the region
  EXPECT_EQ(this->transport_->Submit(peer, OpKind::kRead, d, kTimeout).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TYPED_TEST(TransportConformance, CancelEndsAStalledBatch) {
  this->Start(16 * MiB, 16 * MiB);
  // Connected (and, on TCP, past the membership handshake) before the peer stalls: what stalls
  // is the batch, not the connection set-up.
  ASSERT_TRUE(this->Run(OpKind::kRead, {{0, this->local_->base(), 4096}}).status.ok());
  this->peer_->Stall(true);
  auto h = this->transport_->Submit(this->peer_->id(), OpKind::kRead,
                                    std::vector<Descriptor>{{0, this->local_->base(), 16 * MiB}},
                                    absl::Seconds(60));
  ASSERT_TRUE(h.ok()) << h.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  h->Cancel();
  ASSERT_TRUE(h->WaitFor(absl::Seconds(5))) << "cancel did not end the batch";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(h->Wait().status.code(), absl::StatusCode::kCancelled) << h->Wait().status;
  this->peer_->Stall(false);
  // The transport is usable afterwards.
  Fill(this->peer_->memory(), 1 * MiB, 5);
  BatchResult r = this->Run(OpKind::kRead, {{0, this->local_->base(), 1 * MiB}});
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(std::memcmp(this->local_->base(), this->peer_->memory(), 1 * MiB), 0);
}

TYPED_TEST(TransportConformance, DeadlineIsBounded) {
  this->Start(16 * MiB, 16 * MiB);
  // Connected (and, on TCP, past the membership handshake) before the peer stalls: what stalls
  // is the batch, not the connection set-up.
  ASSERT_TRUE(this->Run(OpKind::kRead, {{0, this->local_->base(), 4096}}).status.ok());
  this->peer_->Stall(true);
  const auto t0 = std::chrono::steady_clock::now();
  auto h = this->transport_->Submit(this->peer_->id(), OpKind::kWrite,
                                    std::vector<Descriptor>{{0, this->local_->base(), 16 * MiB}},
                                    absl::Milliseconds(300));
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(h->WaitFor(absl::Seconds(5))) << "the deadline did not end the batch";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(h->Wait().status.code(), absl::StatusCode::kDeadlineExceeded) << h->Wait().status;
  this->peer_->Stall(false);
  BatchResult r = this->Run(OpKind::kRead, {{0, this->local_->base(), 1 * MiB}});
  EXPECT_TRUE(r.status.ok()) << r.status;
}

TYPED_TEST(TransportConformance, ReconnectsAfterPeerRestartWithNewGeneration) {
  this->Start(4 * MiB, 4 * MiB, /*generation=*/7);
  Fill(this->peer_->memory(), 1 * MiB, 1);
  ASSERT_TRUE(this->Run(OpKind::kRead, {{0, this->local_->base(), 1 * MiB}}).status.ok());
  const PeerId old_id = this->peer_->id();
  this->peer_->Restart(/*generation=*/8);
  this->WaitNoConnections();
  // The old generation is refused by the restarted peer, clearly.
  BatchResult stale =
      this->Run(OpKind::kRead, {{0, this->local_->base(), 1 * MiB}}, kTimeout, &old_id);
  EXPECT_FALSE(stale.status.ok());
  if (stale.status.code() == absl::StatusCode::kUnavailable) {  // raced the restart: once more
    stale = this->Run(OpKind::kRead, {{0, this->local_->base(), 1 * MiB}}, kTimeout, &old_id);
  }
  EXPECT_EQ(stale.status.code(), absl::StatusCode::kFailedPrecondition) << stale.status;
  // The new generation works on a fresh connection.
  Fill(this->peer_->memory(), 1 * MiB, 2);
  BatchResult fresh = this->Run(OpKind::kRead, {{0, this->local_->base(), 1 * MiB}});
  ASSERT_TRUE(fresh.status.ok()) << fresh.status;
  EXPECT_EQ(std::memcmp(this->local_->base(), this->peer_->memory(), 1 * MiB), 0);
}

TYPED_TEST(TransportConformance, PeerKilledMidBatchFailsIt) {
  this->Start(64 * MiB, 64 * MiB);
  ASSERT_TRUE(this->Run(OpKind::kRead, {{0, this->local_->base(), 4096}}).status.ok());
  this->peer_->Stall(true);  // holds the batch mid-flight
  auto h = this->transport_->Submit(this->peer_->id(), OpKind::kRead,
                                    std::vector<Descriptor>{{0, this->local_->base(), 64 * MiB}},
                                    absl::Seconds(60));
  ASSERT_TRUE(h.ok()) << h.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(h->Done());
  const auto t0 = std::chrono::steady_clock::now();
  this->peer_->Kill();
  ASSERT_TRUE(h->WaitFor(absl::Seconds(10))) << "a dead peer left its batch hanging";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(h->Wait().status.code(), absl::StatusCode::kUnavailable) << h->Wait().status;
  // A new batch to the dead peer fails at once too.
  BatchResult again = this->Run(OpKind::kRead, {{0, this->local_->base(), 4096}}, absl::Seconds(5));
  EXPECT_FALSE(again.status.ok());
}

// TCP: a batch's requests spread over every connection to the peer. With the peer stopped, the
// requests of one batch (16 of 1 MiB, 4 connections, a window of 32 MiB) are all sent and none
// is answered: each connection carries 4 of them, not whichever sender woke first all 16 (a
// read request is only a header, so one sender could take the whole queue and the batch would
// move at one connection's speed). Then the peer resumes and the batch completes byte-exact.
class TcpTransportSpread : public ::testing::Test {
 protected:
  // A peer serving `bytes` of a pattern and an initiator-only transport with options `o` (its
  // listen address cleared) and a registered local region of the same size.
  void Start(uint64_t bytes, uint64_t seed, TcpTransportOptions o) {
    peer_ = env_.StartPeer(bytes, 3);
    ASSERT_NE(peer_, nullptr);
    Fill(peer_->memory(), bytes, seed);
    o.listen_address = "";
    auto t = TcpTransport::Create(o);
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = std::move(*t);
    local_ = std::make_unique<LocalRegion>(bytes);
    ASSERT_NE(local_->base(), nullptr);
    ASSERT_TRUE(transport_->RegisterRegion(1, local_->base(), local_->len()).ok());
  }

  TcpEnv env_;
  std::unique_ptr<PeerHarness> peer_;
  std::unique_ptr<TcpTransport> transport_;
  std::unique_ptr<LocalRegion> local_;
};

TEST_F(TcpTransportSpread, ABatchsRequestsSpreadOverEveryConnection) {
  TcpTransportOptions o;
  o.connections_per_peer = 4;
  o.request_bytes = 1 * MiB;
  o.max_inflight_bytes_per_peer = 32 * MiB;
  ASSERT_NO_FATAL_FAILURE(Start(16 * MiB, 41, o));
  PeerHarness* peer = peer_.get();
  TcpTransport& transport = *transport_;
  LocalRegion& local = *local_;
  // Connected (all four connections past the handshake) before the peer stops.
  auto warm = transport.Submit(peer->id(), OpKind::kRead,
                               std::vector<Descriptor>{{0, local.base(), 4096}}, kTimeout);
  ASSERT_TRUE(warm.ok() && warm->WaitFor(kWaitBound) && warm->Wait().status.ok());
  ASSERT_EQ(transport.ConnectionLoads(peer->id().address).size(), 4u);

  peer->Stall(true);
  std::vector<Descriptor> d;
  for (uint64_t i = 0; i < 16; ++i) d.push_back({i * MiB, local.base() + i * MiB, 1 * MiB});
  auto h = transport.Submit(peer->id(), OpKind::kRead, d, kTimeout);
  ASSERT_TRUE(h.ok()) << h.status();
  std::vector<uint64_t> loads;
  for (int i = 0; i < 500; ++i) {  // every request sent: 16 MiB in flight
    loads = transport.ConnectionLoads(peer->id().address);
    uint64_t total = 0;
    for (uint64_t l : loads) total += l;
    if (total == 16 * MiB) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  peer->Stall(false);
  ASSERT_EQ(loads.size(), 4u);
  for (uint64_t l : loads) EXPECT_EQ(l, 4 * MiB) << "a connection carries more than its share";
  ASSERT_TRUE(h->WaitFor(kWaitBound));
  ASSERT_TRUE(h->Wait().status.ok()) << h->Wait().status;
  EXPECT_EQ(std::memcmp(local.base(), peer->memory(), 16 * MiB), 0);
  for (uint64_t l : transport.ConnectionLoads(peer->id().address)) EXPECT_EQ(l, 0u);
  EXPECT_TRUE(transport.UnregisterRegion().ok());
}

TEST_F(TcpTransportSpread, RequestsOfTheConnectionShare) {
  TcpTransportOptions o;
  o.connections_per_peer = 8;
  o.request_bytes = 4 * MiB;
  o.max_inflight_bytes_per_peer = 256 * MiB;
  EXPECT_EQ(TcpRequestLimit(o, 64 * MiB), 4 * MiB);  // off: request_bytes whatever the batch
  o.requests_of_connection_share = true;
  EXPECT_EQ(TcpRequestLimit(o, 64 * MiB), 8 * MiB);  // one request per connection
  EXPECT_EQ(TcpRequestLimit(o, 64 * MiB + 1), 8 * MiB + 1);
  EXPECT_EQ(TcpRequestLimit(o, 8 * MiB), 4 * MiB);      // never below request_bytes
  EXPECT_EQ(TcpRequestLimit(o, 1024 * MiB), 32 * MiB);  // every connection's in flight at once
  o.connections_per_peer = 2;
  o.max_inflight_bytes_per_peer = 1024 * MiB;
  EXPECT_EQ(TcpRequestLimit(o, 1024 * MiB), tcp::kMaxRequestBytes);
}

TEST_F(TcpTransportSpread, BatchesInConnectionShareRequestsArriveWhole) {
  TcpTransportOptions o;
  o.connections_per_peer = 3;
  o.request_bytes = 1 * MiB;
  o.max_inflight_bytes_per_peer = 64 * MiB;
  o.requests_of_connection_share = true;
  ASSERT_NO_FATAL_FAILURE(Start(24 * MiB, 43, o));
  PeerHarness* peer = peer_.get();
  TcpTransport& transport = *transport_;
  LocalRegion& local = *local_;
  // Values of an odd length, so requests of the share (about 8 MiB) split values between them.
  const uint64_t len = 3 * MiB + 4104;
  std::vector<Descriptor> d;
  for (uint64_t off = 0; off + len <= 24 * MiB; off += len)
    d.push_back({off, local.base() + off, len});
  auto h = transport.Submit(peer->id(), OpKind::kRead, d, kTimeout);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(h->WaitFor(kWaitBound));
  ASSERT_TRUE(h->Wait().status.ok()) << h->Wait().status;
  const uint64_t covered = d.size() * len;
  EXPECT_EQ(std::memcmp(local.base(), peer->memory(), covered), 0);
  for (uint64_t l : transport.ConnectionLoads(peer->id().address)) EXPECT_EQ(l, 0u);
  EXPECT_TRUE(transport.UnregisterRegion().ok());
}

TEST(TransportChoice, FirstCommonInLocalOrder) {
  const std::vector<std::string> both = {"rdma", "tcp"};
  const std::vector<std::string> tcp_only = {"tcp"};
  const std::vector<std::string> rdma_only = {"rdma"};
  EXPECT_EQ(*ChooseTransport(both, both), "rdma");
  EXPECT_EQ(*ChooseTransport(both, tcp_only), "tcp");
  EXPECT_EQ(*ChooseTransport(tcp_only, both), "tcp");
  const std::vector<std::string> tcp_first = {"tcp", "rdma"};
  EXPECT_EQ(*ChooseTransport(tcp_first, both), "tcp");  // local preference wins
  auto none = ChooseTransport(tcp_only, rdma_only);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("rdma"), std::string::npos);
  EXPECT_FALSE(ChooseTransport({}, both).ok());
}

}  // namespace
}  // namespace fluxon::transport
