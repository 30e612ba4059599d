// Hardening against hostile or broken local peers (each test fails on the behaviour it guards
// against): raw-protocol abuse of the client socket (garbage, oversize and slow frames, requests
// before Hello, spoofed sessions, connection floods), leases on prepared puts and views, a stale
// client after a daemon restart, bounded shutdown under a failing master and injected delays,
// and group membership through supplementary groups.
#include <gmock/gmock.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include "fluxon/v1/client.pb.h"
#include "rpc/frame.h"
#include "slot/segment.h"
#include "tests/integration/test_node.h"

namespace fluxon {
namespace {

using ::fluxon::testing::Connect;
using ::fluxon::testing::StartNode;
using ::fluxon::testing::TestConfig;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int64_t kValueLen = 4096;

// A hand-driven client connection: frames built from the protocol's messages, or raw bytes.
class RawConn {
 public:
  explicit RawConn(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawConn() {
    if (fd_ >= 0) close(fd_);
  }
  bool connected() const { return connected_; }
  int fd() const { return fd_; }
  void SendBytes(const void* data, size_t len) { ASSERT_TRUE(WriteAll(fd_, data, len).ok()); }
  void Send(v1::ClientRequest req) {
    req.set_id(++next_id_);
    ASSERT_TRUE(WriteFrame(fd_, req).ok());
  }
  absl::StatusOr<v1::OwnerMessage> Read(milliseconds timeout = milliseconds(5000)) {
    v1::OwnerMessage m;
    int passed = -1;
    FrameReadOptions o;
    o.deadline = Clock::now() + timeout;
    o.received_fd = &passed;
    absl::Status s = ReadFrame(fd_, &m, o);
    if (passed >= 0) close(passed);
    if (!s.ok()) return s;
    return m;
  }
  // Hello; returns the reply (session id and secret for a new session).
  absl::StatusOr<v1::OwnerMessage> Hello(uint64_t client_id = 0, const std::string& secret = "",
                                         bool events = false) {
    v1::ClientRequest req;
    v1::Hello* h = req.mutable_hello();
    h->set_protocol_version(kProtocolVersion);
    h->set_client_id(client_id);
    h->set_session_secret(secret);
    h->set_events(events);
    req.set_id(++next_id_);
    // A refused connection may be closed before the Hello is written: that is an answer too.
    if (absl::Status s = WriteFrame(fd_, req); !s.ok()) return s;
    return Read();
  }
  // True when the owner closed the connection within `timeout` (EOF, after any pending frames).
  bool ClosedWithin(milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    char buf[4096];
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      const int left = static_cast<int>(
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count());
      if (poll(&p, 1, std::max(left, 0)) <= 0) continue;
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
    }
    return false;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  uint64_t next_id_ = 0;
};

v1::ClientRequest PutStartRequest(const std::vector<std::string>& keys) {
  v1::ClientRequest req;
  for (const auto& k : keys) req.mutable_put_start()->add_keys(k);
  req.mutable_put_start()->set_value_len(kValueLen);
  req.mutable_put_start()->set_reject_if_exist_same_key(true);
  req.mutable_put_start()->set_reject_if_inflight_same_key(true);
  return req;
}

// Polls `pred` until true or `timeout` passes.
template <typename Pred>
bool Eventually(Pred pred, milliseconds timeout = milliseconds(5000)) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return pred();
}

int64_t Stat(FluxonNode& node, const std::string& name) { return node.owner()->Stats()[name]; }

bool AtBaseline(FluxonNode& node) {
  return ::fluxon::testing::BaselineGaps(node).empty() && node.client_sessions() == 0;
}

int64_t RssKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Item 4 and 6: frames

TEST(RawProtocol, OversizeFrameIsRefusedAndClosedAtOnce) {
  Config c = TestConfig();
  auto node = StartNode(c);
  RawConn conn(c.owner->socket_path);
  ASSERT_TRUE(conn.connected());
  ASSERT_TRUE(conn.Hello().ok());
  const uint32_t len = 70u << 20;  // a batch with a 70 MiB key
  conn.SendBytes(&len, 4);
  auto m = conn.Read(milliseconds(2000));  // no other client connects meanwhile
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->id(), 0u);
  EXPECT_EQ(m->code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_THAT(m->message(), HasSubstr("exceeds"));
  EXPECT_TRUE(conn.ClosedWithin(milliseconds(2000)));
  EXPECT_TRUE(Eventually([&] { return node->client_sessions() == 0; }));
}

TEST(RawProtocol, GarbageFrameIsRefusedAndClosed) {
  Config c = TestConfig();
  auto node = StartNode(c);
  RawConn conn(c.owner->socket_path);
  ASSERT_TRUE(conn.Hello().ok());
  const char garbage[] = {8,      0,      0,      0,      '\xff', '\xff',
                          '\xff', '\xff', '\xff', '\xff', '\xff', '\xff'};
  conn.SendBytes(garbage, sizeof garbage);
  auto m = conn.Read(milliseconds(2000));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(conn.ClosedWithin(milliseconds(2000)));
}

TEST(RawProtocol, AnnouncedLengthsAreNotAllocatedUpFront) {
  Config c = TestConfig();
  c.owner->frame_timeout = milliseconds(800);
  auto node = StartNode(c);
  // Before Hello a connection may announce only a small frame.
  {
    RawConn conn(c.owner->socket_path);
    const uint32_t len = 1u << 20;
    conn.SendBytes(&len, 4);
    auto m = conn.Read(milliseconds(2000));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->code(), static_cast<int>(absl::StatusCode::kDataLoss));
    EXPECT_TRUE(conn.ClosedWithin(milliseconds(2000)));
  }
  // After Hello: eight connections each announce 60 MiB and send four bytes of it.
  const int64_t before = RssKiB();
  std::vector<std::unique_ptr<RawConn>> conns;
  for (int i = 0; i < 8; ++i) {
    conns.push_back(std::make_unique<RawConn>(c.owner->socket_path));
    ASSERT_TRUE(conns.back()->Hello().ok());
    const uint32_t len = 60u << 20;
    conns.back()->SendBytes(&len, 4);
    conns.back()->SendBytes("abcd", 4);
  }
  std::this_thread::sleep_for(milliseconds(300));
  const int64_t grown_kib = RssKiB() - before;
  EXPECT_LT(grown_kib, 64 * 1024) << "eight announced 60 MiB frames grew RSS by " << grown_kib
                                  << " KiB";
  // A frame that does not arrive whole within frame_timeout is refused and closed.
  for (auto& conn : conns) {
    auto m = conn->Read(milliseconds(3000));
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    EXPECT_TRUE(conn->ClosedWithin(milliseconds(2000)));
  }
  EXPECT_TRUE(Eventually([&] { return node->client_sessions() == 0; }));
}

TEST(RawProtocol, ConnectionThatNeverSaysHelloIsClosed) {
  Config c = TestConfig();
  c.owner->hello_timeout = milliseconds(300);
  auto node = StartNode(c);
  RawConn conn(c.owner->socket_path);
  const auto start = Clock::now();
  EXPECT_TRUE(conn.ClosedWithin(milliseconds(3000)));
  EXPECT_GE(Clock::now() - start, milliseconds(250));
}

// ---------------------------------------------------------------------------------------------
// Item 2 and 5: sessions

TEST(RawProtocol, RequestBeforeHelloIsRefusedAndReservesNothing) {
  Config c = TestConfig();
  auto node = StartNode(c);
  RawConn conn(c.owner->socket_path);
  conn.Send(PutStartRequest({"no-hello"}));
  auto m = conn.Read();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(m->message(), HasSubstr("Hello"));
  EXPECT_TRUE(conn.ClosedWithin(milliseconds(2000)));
  EXPECT_EQ(Stat(*node, "prepared_puts"), 0);
  EXPECT_EQ(node->owner()->KeyState("no-hello"), "absent");
}

TEST(RawProtocol, PreparedPutOfAControlOnlySessionIsAbortedWhenItCloses) {
  Config c = TestConfig();
  auto node = StartNode(c);
  {
    RawConn conn(c.owner->socket_path);
    ASSERT_TRUE(conn.Hello().ok());
    conn.Send(PutStartRequest({"orphan-a", "orphan-b"}));
    auto m = conn.Read();
    ASSERT_TRUE(m.ok());
    ASSERT_EQ(m->code(), 0) << m->message();
    EXPECT_EQ(Stat(*node, "prepared_puts"), 1);
  }  // closed without an events connection
  EXPECT_TRUE(Eventually([&] { return AtBaseline(*node); }));
  auto client = Connect(c);
  auto plan = client->LocalFastPutStart({"orphan-a", "orphan-b"}, kValueLen, PutOptions{});
  EXPECT_TRUE(plan.ok()) << plan.status();  // not KeyConflict: nothing stayed reserved
  ASSERT_TRUE(client->PutAbort(*plan).ok());
}

// Options the API names but the owner does not implement are refused by the owner itself (a
// client that skips its own checks gets the same answer), with nothing reserved.
TEST(RawProtocol, OwnerRefusesOptionsItDoesNotImplement) {
  Config c = TestConfig();
  auto node = StartNode(c);
  RawConn conn(c.owner->socket_path);
  ASSERT_TRUE(conn.Hello().ok());
  const std::vector<std::pair<std::function<void(v1::PutStartRequest*)>, std::string>> cases = {
      {[](v1::PutStartRequest* p) { p->set_reject_if_inflight_same_key(false); },
       "reject_if_inflight_same_key"},
      {[](v1::PutStartRequest* p) { p->set_reject_if_exist_same_key(false); },
       "reject_if_exist_same_key"},
      {[](v1::PutStartRequest* p) { p->set_write_through(true); }, "write_through"},
      // A mask of the wrong length (one key, two entries) is malformed, never shortened.
      {[](v1::PutStartRequest* p) {
         p->set_make_replica_task(true);
         p->add_make_replica_task_mask(true);
         p->add_make_replica_task_mask(true);
       },
       "make_replica_task_mask"},
      {[](v1::PutStartRequest* p) { p->set_lease_id("lease-1"); }, "lease_id"},
  };
  for (const auto& [mutate, option] : cases) {
    v1::ClientRequest req = PutStartRequest({"opt"});
    mutate(req.mutable_put_start());
    conn.Send(req);
    auto m = conn.Read();
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << option;
    EXPECT_NE(m->message().find(option), std::string::npos) << m->message();
    EXPECT_EQ(Stat(*node, "prepared_puts"), 0) << option;
    EXPECT_EQ(Stat(*node, "reserved_entries"), 0) << option;
    EXPECT_EQ(Stat(*node, "slots_Prepared"), 0) << option;
    EXPECT_EQ(node->owner()->KeyState("opt"), "absent");
  }
}

TEST(RawProtocol, SessionIdsAreSecretAndBoundToTheProcess) {
  Config c = TestConfig();
  auto node = StartNode(c);
  auto victim = Connect(c);
  auto plan = victim->LocalFastPutStart({"victim"}, kValueLen, PutOptions{});
  ASSERT_TRUE(plan.ok());
  // Guessing: session ids are small integers, but joining needs the secret.
  for (uint64_t guess = 1; guess <= 4; ++guess) {
    for (bool events : {false, true}) {
      RawConn spy(c.owner->socket_path);
      auto m = spy.Hello(guess, "", events);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(m->code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
      EXPECT_TRUE(spy.ClosedWithin(milliseconds(2000)));
      RawConn spy2(c.owner->socket_path);
      m = spy2.Hello(guess, std::string(16, 'x'), events);
      ASSERT_TRUE(m.ok());
      EXPECT_EQ(m->code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
    }
  }
  // The victim's session survived every attempt (no spoofed events connection ended it).
  EXPECT_EQ(Stat(*node, "disconnects"), 0);
  auto fut = victim->LocalFastPutCommit(*plan);
  ASSERT_TRUE(fut.ok()) << fut.status();
  ASSERT_TRUE(fut->Wait(milliseconds(5000)).ok());

  // With the right id and secret, another process is still refused (sessions are per process).
  RawConn owner_conn(c.owner->socket_path);
  auto opened = owner_conn.Hello();
  ASSERT_TRUE(opened.ok());
  const uint64_t id = opened->hello().client_id();
  const std::string secret = opened->hello().session_secret();
  ASSERT_NE(id, 0u);
  ASSERT_EQ(secret.size(), 16u);
  const pid_t child = fork();
  if (child == 0) {
    RawConn other(c.owner->socket_path);
    auto m = other.Hello(id, secret);
    _exit(m.ok() && m->code() == static_cast<int>(absl::StatusCode::kPermissionDenied) ? 0 : 1);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  RawConn same_process(c.owner->socket_path);
  auto joined = same_process.Hello(id, secret);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->code(), 0) << joined->message();
}

TEST(RawProtocol, AnotherSessionsPutAndHandleIdsAreNotFound) {
  Config c = TestConfig();
  auto node = StartNode(c);
  auto a = Connect(c);
  auto plan = a->LocalFastPutStart({"mine"}, kValueLen, PutOptions{});
  ASSERT_TRUE(plan.ok());
  RawConn spy(c.owner->socket_path);
  ASSERT_TRUE(spy.Hello().ok());
  for (uint64_t put_id = 1; put_id <= 3; ++put_id) {
    v1::ClientRequest abort;
    abort.mutable_put_abort()->set_put_id(put_id);
    spy.Send(abort);
    auto m = spy.Read();
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->code(), static_cast<int>(absl::StatusCode::kNotFound));
  }
  auto fut = a->LocalFastPutCommit(*plan);
  ASSERT_TRUE(fut.ok()) << fut.status();
}

TEST(RawProtocol, ConnectionsPastTheLimitAreRefusedWithAReason) {
  Config c = TestConfig();
  c.owner->max_connections = 3;
  auto node = StartNode(c);
  std::vector<std::unique_ptr<RawConn>> open;
  for (int i = 0; i < 3; ++i) {
    open.push_back(std::make_unique<RawConn>(c.owner->socket_path));
    ASSERT_TRUE(open.back()->Hello().ok());
  }
  RawConn extra(c.owner->socket_path);
  auto m = extra.Read();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(m->message(), HasSubstr("max_connections"));
  EXPECT_TRUE(extra.ClosedWithin(milliseconds(2000)));
  ClientOptions o;
  o.socket_path = c.owner->socket_path;
  auto refused = KvClient::Connect(o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
}

// ---------------------------------------------------------------------------------------------
// Item 5: leases

TEST(Leases, PreparedPutAndViewsOfAStoppedClientExpire) {
  Config c = TestConfig();
  c.owner->put_lease = milliseconds(300);
  c.owner->view_lease = milliseconds(300);
  auto node = StartNode(c);
  auto client = Connect(c);
  auto stored = client->LocalFastPutStart({"held"}, kValueLen, PutOptions{});
  ASSERT_TRUE(stored.ok());
  auto fut = client->LocalFastPutCommit(*stored);
  ASSERT_TRUE(fut.ok() && fut->Wait(milliseconds(5000)).ok());

  auto prepared = client->LocalFastPutStart({"forgotten"}, kValueLen, PutOptions{});
  ASSERT_TRUE(prepared.ok());
  auto h = client->GetStart({"held"});
  ASSERT_TRUE(h.ok());
  auto view = client->GetTransfer(*h);
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(Stat(*node, "live_views"), 1);
  // The client keeps its connections open but does nothing (a stopped process).
  // Waits for every counter the expiry changes, not one of them: the others may trail it.
  EXPECT_TRUE(Eventually([&] {
    return Stat(*node, "prepared_puts") == 0 && Stat(*node, "live_views") == 0 &&
           Stat(*node, "slots_Prepared") == 0 && Stat(*node, "puts_expired") == 1 &&
           Stat(*node, "views_expired") == 1;
  }));
  EXPECT_EQ(Stat(*node, "puts_expired"), 1);
  EXPECT_EQ(Stat(*node, "views_expired"), 1);
  EXPECT_EQ(Stat(*node, "slots_Prepared"), 0);
  EXPECT_EQ(node->owner()->KeyState("forgotten"), "absent");
  auto late = client->LocalFastPutCommit(*prepared);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("expired"));
  EXPECT_EQ(client->ReleaseViews(*view).code(), absl::StatusCode::kNotFound);
  // The expired pin is gone: the value can be evicted or deleted like any other.
  auto del = client->DeletePrefix("held");
  ASSERT_TRUE(del.ok());
  EXPECT_EQ(del->first, 1u);
}

// ---------------------------------------------------------------------------------------------
// Item 1: a client of a restarted daemon

TEST(StaleClient, ClientOfARestartedDaemonFailsEveryCallAndServesNoBytes) {
  Config c = TestConfig();
  auto first = StartNode(c);
  auto stale = Connect(c);
  std::vector<uint8_t> old_bytes(kValueLen, 0xAA), new_bytes(kValueLen, 0xBB);
  auto plan = stale->LocalFastPutStart({"k"}, kValueLen, PutOptions{});
  ASSERT_TRUE(plan.ok());
  ASSERT_TRUE(CopyPlanValues(*plan, old_bytes.data(), kValueLen, CopyDirection::kToValues).ok());
  auto fut = stale->LocalFastPutCommit(*plan);
  ASSERT_TRUE(fut.ok() && fut->Wait(milliseconds(5000)).ok());
  auto pending = stale->LocalFastPutStart({"pending"}, kValueLen, PutOptions{});
  ASSERT_TRUE(pending.ok());
  const uint64_t old_generation = stale->WaitLocalSegmentsReady()[0].generation;

  first->Stop();
  first.reset();
  auto second = StartNode(c);  // same socket, new segment and generation
  {
    auto writer = Connect(c);
    auto p = writer->LocalFastPutStart({"k"}, kValueLen, PutOptions{});
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(CopyPlanValues(*p, new_bytes.data(), kValueLen, CopyDirection::kToValues).ok());
    auto f = writer->LocalFastPutCommit(*p);
    ASSERT_TRUE(f.ok() && f->Wait(milliseconds(5000)).ok());
  }
  ASSERT_NE(second->owner()->generation(), old_generation);

  // Read side: no call serves bytes through the old mapping.
  EXPECT_TRUE(Eventually([&] {
    auto h = stale->GetStart({"k"});
    return h.status().code() == absl::StatusCode::kUnavailable;
  }));
  auto h = stale->GetStart({"k"});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("create a new client"));
  // Write side: nothing is reserved on the new daemon, and the old plan is void.
  auto p = stale->LocalFastPutStart({"fresh"}, kValueLen, PutOptions{});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(stale->LocalFastPutCommit(*pending).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(stale->PeekPlan(*pending).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Stat(*second, "prepared_puts"), 0);
  EXPECT_EQ(second->owner()->KeyState("fresh"), "absent");
  // A new client sees the new bytes.
  auto fresh = Connect(c);
  auto g = fresh->GetStart({"k"});
  ASSERT_TRUE(g.ok());
  ASSERT_EQ(g->result.transferable_len, 1u);
  auto gp = fresh->GetTransfer(*g);
  ASSERT_TRUE(gp.ok());
  std::vector<uint8_t> got(kValueLen);
  ASSERT_TRUE(CopyPlanValues(*gp, got.data(), kValueLen, CopyDirection::kFromValues).ok());
  EXPECT_EQ(got, new_bytes);
  ASSERT_TRUE(fresh->ReleaseViews(*gp).ok());
}

// ---------------------------------------------------------------------------------------------
// Item 7: bounded shutdown

TEST(Shutdown, CommitsBlockedOnPublishBackpressureEndAndStopIsBounded) {
  Config c = TestConfig();
  c.owner->commit_wait_timeout = milliseconds(400);
  auto node = StartNode(c);
  node->faults().Set(FaultRule{"master.PublishBatch", FaultAction::kFail, {}, -1});
  auto client = Connect(c);
  // Fill the publish queue (512 jobs) while the master keeps failing.
  absl::Status last;
  int committed = 0;
  for (int i = 0; i < 600 && last.ok(); ++i) {
    auto p = client->LocalFastPutStart({"bp-" + std::to_string(i)}, kValueLen, PutOptions{});
    ASSERT_TRUE(p.ok()) << p.status();
    auto f = client->LocalFastPutCommit(*p);
    last = f.status();
    if (f.ok()) ++committed;
  }
  EXPECT_GE(committed, 512);
  // The commit past the bound fails after commit_wait_timeout, and aborted its put.
  EXPECT_EQ(last.code(), absl::StatusCode::kUnavailable) << last;
  EXPECT_THAT(std::string(last.message()), HasSubstr("aborted"));
  EXPECT_EQ(Stat(*node, "prepared_puts"), 0);
  EXPECT_GE(Stat(*node, "commit_timeouts"), 1);

  // A commit waiting now is ended by SIGTERM-equivalent Stop, which finishes within a bound.
  auto p = client->LocalFastPutStart({"bp-last"}, kValueLen, PutOptions{});
  ASSERT_TRUE(p.ok());
  auto blocked = std::async(std::launch::async, [&] { return client->LocalFastPutCommit(*p); });
  std::this_thread::sleep_for(milliseconds(100));
  const auto start = Clock::now();
  node->Stop();
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  ASSERT_EQ(blocked.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_FALSE(blocked.get().ok());
}

TEST(Shutdown, ClearingOrStoppingEndsAnInjectedDelay) {
  Config c = TestConfig();
  auto node = StartNode(c);
  auto client = Connect(c);
  node->faults().Set(FaultRule{"master.Lookup", FaultAction::kDelay, milliseconds(3'600'000), -1});
  auto get = std::async(std::launch::async, [&] { return client->GetStart({"absent"}); });
  ASSERT_EQ(get.wait_for(milliseconds(300)), std::future_status::timeout);  // sleeping
  node->faults().Clear("master.Lookup");
  ASSERT_EQ(get.wait_for(std::chrono::seconds(3)), std::future_status::ready);
  EXPECT_TRUE(get.get().ok());

  node->faults().Set(FaultRule{"master.Lookup", FaultAction::kDelay, milliseconds(3'600'000), -1});
  auto get2 = std::async(std::launch::async, [&] { return client->GetStart({"absent-2"}); });
  ASSERT_EQ(get2.wait_for(milliseconds(300)), std::future_status::timeout);
  const auto start = Clock::now();
  node->Stop();
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  ASSERT_EQ(get2.wait_for(std::chrono::seconds(5)), std::future_status::ready);
}

// ---------------------------------------------------------------------------------------------
// Item 4: a bounded wait on every client call

TEST(ClientTimeout, StuckOwnerBecomesDeadlineExceeded) {
  Config c = TestConfig();
  auto node = StartNode(c);
  ClientOptions o;
  o.socket_path = c.owner->socket_path;
  o.call_timeout = milliseconds(300);
  auto client = KvClient::Connect(o);
  ASSERT_TRUE(client.ok());
  node->faults().Set(FaultRule{"master.Lookup", FaultAction::kDelay, milliseconds(5000), -1});
  const auto start = Clock::now();
  auto h = (*client)->GetStart({"stuck"});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
  node->faults().Clear("");
  // The connection that timed out was dropped; the next call works.
  EXPECT_TRUE((*client)->GetStart({"stuck-2"}).ok());
}

// ---------------------------------------------------------------------------------------------
// The client trusts no offset the owner sends: a buggy or stale owner's offsets outside the
// mapped segment (or a prefix described by too few offsets) fail the call, never become plan
// pointers a kernel or copy would write through.

// A fake owner on a Unix socket: a real segment, a session, and a scripted answer per request.
class FakeOwner {
 public:
  using Answer = std::function<void(const v1::ClientRequest&, v1::OwnerMessage*)>;
  FakeOwner(std::string path, Answer answer) : path_(std::move(path)), answer_(std::move(answer)) {
    SegmentOptions so;
    so.size_bytes = kGrantBytes;
    segment_ = std::move(*Segment::Create(so));
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    ::unlink(path_.c_str());
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(listen(listen_fd_, 8), 0);
    accept_ = std::thread([this] { AcceptLoop(); });
  }
  ~FakeOwner() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    accept_.join();
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    for (auto& t : conns_) t.join();
    for (int fd : fds_) close(fd);
    ::unlink(path_.c_str());
  }
  uint64_t total_bytes() const { return segment_->total_bytes(); }

 private:
  void AcceptLoop() {
    for (;;) {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) return;
      fds_.push_back(fd);
      conns_.emplace_back([this, fd] { Serve(fd); });
    }
  }
  void Serve(int fd) {
    for (;;) {
      v1::ClientRequest req;
      FrameReadOptions o;
      o.deadline = Clock::now() + milliseconds(10'000);
      if (!ReadFrame(fd, &req, o).ok()) return;
      v1::OwnerMessage resp;
      resp.set_id(req.id());
      if (req.has_hello()) {
        if (req.hello().events()) {
          (void)WriteFrame(fd, resp);
          continue;
        }
        v1::HelloReply* h = resp.mutable_hello();
        h->set_client_id(1);
        h->set_session_secret(std::string(16, 's'));
        v1::SegmentInfo* si = h->mutable_segment();
        si->set_generation(segment_->generation());
        si->set_total_bytes(segment_->total_bytes());
        si->set_data_offset(segment_->data_offset());
        si->set_node_id(segment_->node_id());
        (void)SendFrameWithFd(fd, EncodeFrame(resp), segment_->fd());
        continue;
      }
      answer_(req, &resp);
      (void)WriteFrame(fd, resp);
    }
  }
  const std::string path_;
  const Answer answer_;
  std::unique_ptr<Segment> segment_;
  int listen_fd_ = -1;
  std::thread accept_;
  std::vector<int> fds_;  // accept thread only until the destructor joins it
  std::vector<std::thread> conns_;
};

TEST(ClientChecksOwner, OffsetsOutsideTheSegmentFailTheCall) {
  const std::string path = ::fluxon::testing::UniqueSocketPath();
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::atomic<int> aborts{0}, cancels{0};
  uint64_t outside = 0;
  FakeOwner owner(path, [&](const v1::ClientRequest& req, v1::OwnerMessage* resp) {
    if (req.has_put_start()) {
      resp->mutable_put_start()->set_put_id(7);
      resp->mutable_put_start()->add_offsets(outside);  // past the end of the segment
    } else if (req.has_get_start()) {
      v1::GetStartReply* g = resp->mutable_get_start();
      g->set_handle_id(9);
      g->set_raw_prefix_hit_len(2);
      g->set_transferable_len(2);  // ... described by one offset only
      g->add_offsets(outside - kValueLen);
      g->add_lens(kValueLen);
    } else if (req.has_put_abort()) {
      ++aborts;
    } else if (req.has_cancel_get()) {
      ++cancels;
    }
  });
  outside = owner.total_bytes();
  ClientOptions o;
  o.socket_path = path;
  auto client = KvClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto plan = (*client)->LocalFastPutStart({"k"}, kValueLen, PutOptions{});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kDataLoss) << plan.status();
  EXPECT_EQ(aborts.load(), 1);  // the owner's reservation is given back
  EXPECT_EQ((*client)->PeekPlan(1).status().code(), absl::StatusCode::kNotFound);
  auto h = (*client)->GetStart({"a", "b"});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss) << h.status();
  EXPECT_EQ(cancels.load(), 1);
  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ((*stats)["client_active_plans"], 0);
  EXPECT_EQ((*stats)["client_handles"], 0);
}

// ---------------------------------------------------------------------------------------------
// Item 8: supplementary groups

// Runs `body` in a child process with the given uid, gid and supplementary groups; returns its
// exit status (-1 when it did not exit normally).
template <typename Body>
int RunAs(uid_t uid, gid_t gid, const std::vector<gid_t>& groups, Body body) {
  const pid_t child = fork();
  if (child == 0) {
    if (setgroups(groups.size(), groups.data()) != 0 || setgid(gid) != 0 || setuid(uid) != 0) {
      _exit(99);
    }
    _exit(body());
  }
  int wstatus = 0;
  if (waitpid(child, &wstatus, 0) != child || !WIFEXITED(wstatus)) return -1;
  return WEXITSTATUS(wstatus);
}

// 0: Hello accepted; 1: connected but refused; 2: could not connect.
int HelloOutcome(const std::string& path) {
  RawConn conn(path);
  if (!conn.connected()) return 2;
  auto m = conn.Hello();
  return m.ok() && m->code() == 0 ? 0 : 1;
}

TEST(PeerCredentials, SupplementaryGroupMembersAreAdmittedOthersRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other users";
  group* g = getgrnam("users");
  if (g == nullptr) GTEST_SKIP() << "no 'users' group on this machine";
  const gid_t allowed = g->gr_gid;
  Config c = TestConfig();
  c.owner->socket_group = "users";
  chmod("/tmp/fluxon-test", 0755);
  auto node = StartNode(c);
  const std::string path = c.owner->socket_path;
  auto hello_ok = [&] { return HelloOutcome(path); };
  constexpr uid_t kNobody = 65534;
  // Primary group: admitted (worked before too).
  EXPECT_EQ(RunAs(kNobody, allowed, {allowed}, hello_ok), 0);
  // Supplementary group only (usermod -aG): admitted.
  EXPECT_EQ(RunAs(kNobody, kNobody, {kNobody, allowed}, hello_ok), 0);
  // Not a member: refused (the socket file's mode stops it, or the credential check does).
  EXPECT_NE(RunAs(kNobody, kNobody, {kNobody}, hello_ok), 0);
}

// The socket's mode is the first gate and the peer-credential check the second: without
// socket_group the socket is 0600, and another uid is refused even when the file's mode would let
// it connect (an operator's chmod, a bind mount).
TEST(PeerCredentials, SocketIsOwnerOnlyAndAnotherUidIsRefusedEvenThroughAnOpenMode) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run clients as other users";
  Config c = TestConfig();
  chmod("/tmp/fluxon-test", 0755);
  auto node = StartNode(c);
  const std::string path = c.owner->socket_path;
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "no socket_group: owner-only";
  auto hello_ok = [&] { return HelloOutcome(path); };
  constexpr uid_t kNobody = 65534;
  EXPECT_EQ(RunAs(kNobody, kNobody, {kNobody}, hello_ok), 2) << "the mode keeps it out";
  ASSERT_EQ(::chmod(path.c_str(), 0666), 0);
  EXPECT_EQ(RunAs(kNobody, kNobody, {kNobody}, hello_ok), 1)
      << "connected through the open mode, then refused by the credential check";
  EXPECT_EQ(hello_ok(), 0) << "the owner's own uid is still admitted";
}

}  // namespace
}  // namespace fluxon
