#include "transport/tcp/tcp_transport.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <cerrno>
#include <cstring>
#include <limits>
#include <list>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "transport/peer_window.h"
#include "transport/tcp/socket_io.h"
#include "transport/tcp/tcp_handshake.h"
#include "transport/tcp/tcp_wire.h"

namespace fluxon::transport {

namespace asio = boost::asio;
using asio_tcp = asio::ip::tcp;

namespace {

constexpr uint32_t kMaxAttempts = 3;  // a requeued request after deliberate teardowns

// One piece of one descriptor: what one wire descriptor of one request carries.
struct Piece {
  uint32_t descriptor = 0;
  uint64_t remote_offset = 0;
  uint8_t* local = nullptr;
  uint64_t len = 0;
};

// Parses "host:port".
absl::StatusOr<asio_tcp::endpoint> ParseEndpoint(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host == "localhost") host = "127.0.0.1";
  boost::system::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(host, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "': ", ec.message()));
  char* end = nullptr;
  const unsigned long port = std::strtoul(address.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address '", address, "': bad port"));
  }
  return asio_tcp::endpoint(ip, static_cast<uint16_t>(port));
}

void SetBlockingNoDelay(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Connects within `deadline`; returns a blocking fd with TCP_NODELAY.
absl::StatusOr<int> ConnectTcp(const std::string& address, Clock::time_point deadline) {
  absl::StatusOr<asio_tcp::endpoint> ep = ParseEndpoint(address);
  if (!ep.ok()) return ep.status();
  asio::io_context io;
  asio_tcp::socket socket(io);
  boost::system::error_code result = asio::error::would_block;
  socket.async_connect(*ep, [&](const boost::system::error_code& ec) { result = ec; });
  io.run_until(deadline);
  if (result == asio::error::would_block) {
    boost::system::error_code ignored;
    socket.close(ignored);
    io.run();
    return absl::UnavailableError(absl::StrCat("connect to ", address, " timed out"));
  }
  if (result)
    return absl::UnavailableError(absl::StrCat("connect to ", address, ": ", result.message()));
  const int fd = socket.release();
  SetBlockingNoDelay(fd);
  return fd;
}

absl::Status DescriptorRefusal(uint8_t code, const std::string& address,
                               const std::string& message) {
  const auto c = static_cast<absl::StatusCode>(code);
  if (!message.empty()) return absl::Status(c, absl::StrCat("peer ", address, ": ", message));
  if (c == absl::StatusCode::kOutOfRange) {
    return absl::OutOfRangeError(absl::StrCat(
        "peer ", address, " refused the descriptor: offset/len outside its registered region"));
  }
  return absl::Status(c, absl::StrCat("peer ", address, " refused the descriptor"));
}

}  // namespace

// A batch as the TCP transport sees it: its pieces, cut into requests (units).
struct TcpBatch {
  std::shared_ptr<BatchState> state;
  std::vector<Piece> pieces;
};

struct Unit {
  std::shared_ptr<TcpBatch> batch;
  uint32_t first_piece = 0;
  uint32_t piece_count = 0;
  uint64_t bytes = 0;
  uint32_t attempts = 0;
};

// ---------------------------------------------------------------------------------------------
// Initiator: peers and their connections.

class Connection {
 public:
  explicit Connection(int fd) : fd_(fd) {}
  ~Connection() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

  // Marks the connection failed (first cause wins) and interrupts both of its threads.
  void Fail(bool deliberate, const absl::Status& why) {
    MutexLock lock(&mu_);
    FailLocked(deliberate, why);
  }
  void FailLocked(bool deliberate, const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!failed_) {
      failed_ = true;
      deliberate_ = deliberate;
      reason_ = why;
    }
    ::shutdown(fd_, SHUT_RDWR);
    cv_.SignalAll();
  }
  // Live and not failed: can take new requests.
  bool Usable() {
    MutexLock lock(&mu_);
    return !failed_ && !dead_.load();
  }
  bool CarriesLocked(const TcpBatch* b) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Unit& u : sent_) {
      if (u.batch.get() == b) return true;
    }
    return false;
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<Unit> sent_ ABSL_GUARDED_BY(mu_);  // requests sent (or being sent), in order
  bool sending_ ABSL_GUARDED_BY(mu_) = false;   // the sender is inside SendAll
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool deliberate_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status reason_ ABSL_GUARDED_BY(mu_);
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Bytes of the requests in sent_, changed only under the peer's mutex (the sender takes a
  // request only while its connection is among the least loaded: see Peer::LeastLoaded).
  std::atomic<uint64_t> inflight_bytes_{0};
  std::atomic<bool> dead_{false};  // set under the peer's mutex once torn down: threads exit
  std::thread sender_;
  std::thread receiver_;

 private:
  const int fd_;
};

class TcpTransport::Peer {
 public:
  Peer(std::string address, const TcpTransportOptions& options,
       std::function<void(Peer*)> request_reconnect)
      : address_(std::move(address)),
        options_(options),
        request_reconnect_(std::move(request_reconnect)) {}
  ~Peer() { Close(); }

  const std::string& address() const { return address_; }

  // Connects up to connections_per_peer live connections (first use, or after the peer died).
  absl::Status EnsureConnections(Clock::time_point deadline);
  void Enqueue(std::vector<Unit> units);
  void AbortBatch(const TcpBatch* b);
  // Aborts every batch with a request in the queue (the reconnector could not connect).
  void FailQueued(const absl::Status& why);
  void Close();

  PeerWindow window() const {
    MutexLock lock(&mu_);
    return window_;
  }
  uint64_t live_connections() const {
    MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const auto& c : connections_) n += c->Usable() ? 1 : 0;
    return n;
  }
  // The bytes in flight on each usable connection.
  std::vector<uint64_t> connection_loads() const {
    MutexLock lock(&mu_);
    std::vector<uint64_t> loads;
    for (const auto& c : connections_) {
      if (c->Usable()) loads.push_back(c->inflight_bytes_.load(std::memory_order_relaxed));
    }
    return loads;
  }

 private:
  // Whether `c` carries no more bytes than any other usable connection. A sender takes the next
  // request only then, so a batch's requests spread over every connection (one per connection
  // in turn) instead of going to whichever sender wakes first: a read request is only a header,
  // and one sender could otherwise take the whole queue before the others woke up, leaving the
  // other connections idle and the batch at one connection's speed.
  bool LeastLoaded(const Connection* c) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t mine = c->inflight_bytes_.load(std::memory_order_relaxed);
    for (const auto& other : connections_) {
      if (other.get() != c && other->Usable() &&
          other->inflight_bytes_.load(std::memory_order_relaxed) < mine) {
        return false;
      }
    }
    return true;
  }

  void SenderLoop(Connection* c);
  void ReceiverLoop(Connection* c);
  // Receiver side of a failed connection: waits for its sender, then settles its requests.
  void TearDown(Connection* c);
  // A peer-level failure: aborts every batch queued or in flight here.
  void FailPeer(const absl::Status& why);
  absl::Status ReadReply(Connection* c, const tcp::ReplyHeader& reply, const Unit& unit,
                         uint64_t request_id, std::vector<uint8_t>& codes, std::string& message,
                         std::vector<iovec>& iov);

  const std::string address_;
  const TcpTransportOptions& options_;
  const std::function<void(Peer*)> request_reconnect_;
  Mutex connect_mu_;  // one connecting Submit at a time per peer

  mutable Mutex mu_;
  CondVar work_cv_;
  std::deque<Unit> queue_ ABSL_GUARDED_BY(mu_);
  PeerWindow window_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
};

absl::Status TcpTransport::Peer::EnsureConnections(Clock::time_point deadline) {
  MutexLock connect_lock(&connect_mu_);
  std::vector<std::shared_ptr<Connection>> dead;
  int live = 0;
  {
    MutexLock lock(&mu_);
    if (closing_) return absl::CancelledError("transport closing");
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->dead_.load()) {
        dead.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        live += (*it)->Usable() ? 1 : 0;
        ++it;
      }
    }
  }
  for (auto& c : dead) {  // their threads are exiting (or have exited) on their own
    if (c->sender_.joinable()) c->sender_.join();
    if (c->receiver_.joinable()) c->receiver_.join();
  }
  absl::Status last_error;
  const auto connect_deadline =
      std::min(deadline, Clock::now() + absl::ToChronoNanoseconds(options_.connect_timeout));
  for (int i = live; i < options_.connections_per_peer; ++i) {
    absl::StatusOr<int> fd = ConnectTcp(address_, connect_deadline);
    if (!fd.ok()) {
      last_error = fd.status();
      break;
    }
    if (absl::Status hs = tcp::ClientHandshake(*fd, options_.cluster_secret, connect_deadline);
        !hs.ok()) {
      ::close(*fd);
      last_error = absl::Status(hs.code(), absl::StrCat("peer ", address_, ": ", hs.message()));
      spdlog::warn("tcp transport: {}", std::string(last_error.message()));
      break;
    }
    auto c = std::make_shared<Connection>(*fd);
    MutexLock lock(&mu_);
    if (closing_) return absl::CancelledError("transport closing");
    c->sender_ = std::thread([this, c = c.get()] { SenderLoop(c); });
    c->receiver_ = std::thread([this, c = c.get()] { ReceiverLoop(c); });
    connections_.push_back(std::move(c));
    ++live;
  }
  if (live == 0) return last_error.ok() ? absl::UnavailableError("no connection") : last_error;
  return absl::OkStatus();
}

void TcpTransport::Peer::Enqueue(std::vector<Unit> units) {
  MutexLock lock(&mu_);
  for (Unit& u : units) {
    window_.Queue(u.bytes);
    queue_.push_back(std::move(u));
  }
  work_cv_.SignalAll();
}

void TcpTransport::Peer::AbortBatch(const TcpBatch* b) {
  std::vector<Unit> dropped;
  {
    MutexLock lock(&mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->batch.get() == b) {
        window_.Dequeue(it->bytes);
        dropped.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& c : connections_) {
      MutexLock clock(&c->mu_);
      if (c->CarriesLocked(b)) {
        c->FailLocked(/*deliberate=*/true, absl::CancelledError("a batch on it was aborted"));
      }
    }
  }
  for (Unit& u : dropped) u.batch->state->FinishUnit();
}

void TcpTransport::Peer::SenderLoop(Connection* c) {
  std::vector<tcp::WireDescriptor> wire;
  std::vector<iovec> iov;
  wire.reserve(tcp::kMaxDescriptorsPerRequest);
  iov.reserve(tcp::kMaxDescriptorsPerRequest + 2);
  for (;;) {
    Unit unit;
    uint64_t request_id = 0;
    uint64_t generation = 0;
    {
      MutexLock lock(&mu_);
      for (;;) {
        if (closing_ || c->dead_.load()) return;
        {
          MutexLock clock(&c->mu_);
          if (c->failed_) return;
        }
        if (!queue_.empty() &&
            window_.Admits(queue_.front().bytes, options_.max_inflight_bytes_per_peer) &&
            LeastLoaded(c)) {
          break;
        }
        work_cv_.WaitUntil(&mu_, Clock::now() + std::chrono::seconds(1));
      }
      unit = std::move(queue_.front());
      queue_.pop_front();
      window_.Dequeue(unit.bytes);
      if (unit.batch->state->aborted()) {
        unit.batch->state->FinishUnit();
        continue;
      }
      window_.Launch(unit.bytes);
      c->inflight_bytes_.fetch_add(unit.bytes, std::memory_order_relaxed);
      // Another connection may be the least loaded now: its sender takes the next request.
      if (!queue_.empty()) work_cv_.SignalAll();
      MutexLock clock(&c->mu_);
      request_id = c->next_request_id_++;
      c->sending_ = true;
      generation = unit.batch->state->peer().expected_generation;
      c->sent_.push_back(unit);
      c->cv_.SignalAll();
    }
    const OpKind op = unit.batch->state->op();
    tcp::RequestHeader header;
    header.op = static_cast<uint8_t>(op);
    header.descriptor_count = unit.piece_count;
    header.generation = generation;
    header.request_id = request_id;
    header.payload_bytes = op == OpKind::kWrite ? unit.bytes : 0;
    wire.clear();
    iov.clear();
    const Piece* pieces = &unit.batch->pieces[unit.first_piece];
    for (uint32_t i = 0; i < unit.piece_count; ++i) {
      wire.push_back({pieces[i].remote_offset, pieces[i].len});
    }
    iov.push_back({&header, sizeof(header)});
    iov.push_back({wire.data(), wire.size() * sizeof(tcp::WireDescriptor)});
    if (op == OpKind::kWrite) {
      for (uint32_t i = 0; i < unit.piece_count; ++i)
        iov.push_back({pieces[i].local, pieces[i].len});
    }
    absl::Status s = SendAll(c->fd(), iov);
    {
      MutexLock clock(&c->mu_);
      c->sending_ = false;
      c->cv_.SignalAll();
    }
    if (!s.ok()) {
      c->Fail(/*deliberate=*/false, s);
      return;
    }
  }
}

absl::Status TcpTransport::Peer::ReadReply(Connection* c, const tcp::ReplyHeader& reply,
                                           const Unit& unit, uint64_t request_id,
                                           std::vector<uint8_t>& codes, std::string& message,
                                           std::vector<iovec>& iov) {
  if (reply.magic != tcp::kReplyMagic || reply.request_id != request_id ||
      reply.descriptor_count != unit.piece_count ||
      reply.message_bytes > tcp::kMaxReplyMessageBytes) {
    return absl::DataLossError(absl::StrCat("malformed reply from ", address_));
  }
  message.resize(reply.message_bytes);
  codes.resize(reply.descriptor_count);
  iov.clear();
  if (!message.empty()) iov.push_back({message.data(), message.size()});
  iov.push_back({codes.data(), codes.size()});
  absl::Status s = RecvAll(c->fd(), iov);
  if (!s.ok()) return s;
  const Piece* pieces = &unit.batch->pieces[unit.first_piece];
  uint64_t ok_bytes = 0;
  iov.clear();
  for (uint32_t i = 0; i < unit.piece_count; ++i) {
    if (codes[i] != 0) continue;
    ok_bytes += pieces[i].len;
    if (unit.batch->state->op() == OpKind::kRead) iov.push_back({pieces[i].local, pieces[i].len});
  }
  const uint64_t expected_payload = unit.batch->state->op() == OpKind::kRead ? ok_bytes : 0;
  if (reply.payload_bytes != expected_payload) {
    return absl::DataLossError(absl::StrCat("reply payload of ", reply.payload_bytes,
                                            " bytes from ", address_, ", expected ",
                                            expected_payload));
  }
  if (!iov.empty()) {
    s = RecvAll(c->fd(), iov);
    if (!s.ok()) return s;
  }
  for (uint32_t i = 0; i < unit.piece_count; ++i) {
    if (codes[i] == 0) {
      unit.batch->state->RecordPiece(pieces[i].descriptor, pieces[i].len, absl::OkStatus());
    } else {
      unit.batch->state->RecordPiece(pieces[i].descriptor, 0,
                                     DescriptorRefusal(codes[i], address_, message));
    }
  }
  return absl::OkStatus();
}

void TcpTransport::Peer::ReceiverLoop(Connection* c) {
  std::vector<uint8_t> codes;
  std::string message;
  std::vector<iovec> iov;
  codes.reserve(tcp::kMaxDescriptorsPerRequest);
  iov.reserve(tcp::kMaxDescriptorsPerRequest + 2);
  uint64_t expected_id = 1;
  absl::Status s;
  for (;;) {
    // Always blocked reading the next reply header, also when idle: a peer that dies is seen at
    // once (EOF or reset), not at the next request.
    tcp::ReplyHeader reply;
    iov.assign(1, iovec{&reply, sizeof(reply)});
    s = RecvAll(c->fd(), iov);
    if (!s.ok()) break;
    Unit unit;
    {
      MutexLock clock(&c->mu_);
      if (c->sent_.empty()) {
        s = absl::DataLossError(absl::StrCat("unsolicited reply from ", address_));
        break;
      }
      unit = c->sent_.front();
    }
    s = ReadReply(c, reply, unit, expected_id, codes, message, iov);
    if (!s.ok()) break;
    ++expected_id;
    {
      MutexLock lock(&mu_);
      window_.Land(unit.bytes);
      c->inflight_bytes_.fetch_sub(unit.bytes, std::memory_order_relaxed);
      {
        MutexLock clock(&c->mu_);
        c->sent_.pop_front();
      }
      // The landed bytes may let a queued request in (window, least loaded connection). With
      // nothing queued no sender can move, so none is woken: at 8 connections a batch's last
      // replies would otherwise wake every sender for nothing, once per reply.
      if (!queue_.empty()) work_cv_.SignalAll();
    }
    unit.batch->state->FinishUnit();
  }
  c->Fail(/*deliberate=*/false, s);
  TearDown(c);
}

void TcpTransport::Peer::TearDown(Connection* c) {
  std::deque<Unit> units;
  bool deliberate;
  bool need_reconnect = false;
  absl::Status reason;
  {
    MutexLock clock(&c->mu_);
    while (c->sending_) {  // shut down already: the send returns promptly
      ::shutdown(c->fd(), SHUT_RDWR);
      c->cv_.WaitUntil(&c->mu_, Clock::now() + std::chrono::milliseconds(100));
    }
    deliberate = c->deliberate_;
    reason = c->reason_;
  }
  std::vector<std::shared_ptr<TcpBatch>> to_fail;
  {
    MutexLock lock(&mu_);
    {
      MutexLock clock(&c->mu_);
      units.swap(c->sent_);
    }
    c->dead_.store(true);
    c->inflight_bytes_.store(0, std::memory_order_relaxed);
    for (Unit& u : units) {
      window_.Land(u.bytes);
      if (u.batch->state->aborted()) continue;
      if (deliberate && !closing_ && u.attempts + 1 < kMaxAttempts) {
        ++u.attempts;
        window_.Queue(u.bytes);
        queue_.push_front(u);
      } else {
        to_fail.push_back(u.batch);
      }
    }
    bool usable_left = false;
    for (auto& other : connections_) usable_left = usable_left || other->Usable();
    // A deliberate teardown leaves other batches' requests queued: if no connection is left to
    // send them, the transport's reconnector connects again (or fails them).
    need_reconnect = deliberate && !closing_ && !usable_left && !queue_.empty();
    work_cv_.SignalAll();
  }
  const absl::Status why = absl::UnavailableError(
      absl::StrCat("connection to peer ", address_, " lost: ", reason.message()));
  for (auto& b : to_fail) b->state->Abort(why);
  for (Unit& u : units) {
    if (u.batch->state->aborted()) u.batch->state->FinishUnit();
  }
  if (!deliberate) FailPeer(why);
  if (need_reconnect) request_reconnect_(this);
}

void TcpTransport::Peer::FailQueued(const absl::Status& why) {
  std::vector<std::shared_ptr<TcpBatch>> batches;
  {
    MutexLock lock(&mu_);
    for (const Unit& u : queue_) batches.push_back(u.batch);
  }
  for (auto& b : batches) b->state->Abort(why);
}

void TcpTransport::Peer::FailPeer(const absl::Status& why) {
  std::vector<std::shared_ptr<TcpBatch>> batches;
  {
    MutexLock lock(&mu_);
    for (const Unit& u : queue_) batches.push_back(u.batch);
    for (auto& c : connections_) {
      MutexLock clock(&c->mu_);
      for (const Unit& u : c->sent_) batches.push_back(u.batch);
      c->FailLocked(/*deliberate=*/true, why);
    }
  }
  for (auto& b : batches) b->state->Abort(why);
}

void TcpTransport::Peer::Close() {
  std::vector<std::shared_ptr<Connection>> conns;
  {
    MutexLock lock(&mu_);
    closing_ = true;
    for (auto& c : connections_) c->Fail(/*deliberate=*/true, absl::CancelledError("closing"));
    conns.swap(connections_);
    work_cv_.SignalAll();
  }
  for (auto& c : conns) {
    if (c->sender_.joinable()) c->sender_.join();
    if (c->receiver_.joinable()) c->receiver_.join();
  }
}

// ---------------------------------------------------------------------------------------------
// Serving side.

class TcpTransport::Server {
 public:
  Server(const TcpTransportOptions& options, RegisteredRegion& region)
      : options_(options), region_(region), acceptor_(io_) {}
  ~Server() { Stop(); }

  absl::StatusOr<std::string> Start(const std::string& listen_address) {
    absl::StatusOr<asio_tcp::endpoint> ep = ParseEndpoint(listen_address);
    if (!ep.ok()) return ep.status();
    boost::system::error_code ec;
    acceptor_.open(ep->protocol(), ec);
    if (!ec) acceptor_.set_option(asio_tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(*ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec)
      return absl::UnavailableError(absl::StrCat("listen on ", listen_address, ": ", ec.message()));
    const asio_tcp::endpoint local = acceptor_.local_endpoint();
    StartAccept();
    thread_ = std::thread([this] { io_.run(); });
    return absl::StrCat(local.address().to_string(), ":", local.port());
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    asio::post(io_, [this] {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
    });
    if (thread_.joinable()) thread_.join();
    std::list<ServingConnection> conns;
    {
      MutexLock lock(&mu_);
      for (auto& c : conns_) {
        if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
      }
      conns.swap(conns_);
    }
    for (auto& c : conns) c.thread.join();
  }

  // Interrupts every serving connection (UnregisterRegion: no request may keep a lease).
  void InterruptAll() {
    MutexLock lock(&mu_);
    for (auto& c : conns_) {
      if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
    }
  }

  uint64_t connections() const {
    MutexLock lock(&mu_);
    uint64_t n = 0;
    for (const auto& c : conns_) n += c.finished.load() ? 0 : 1;
    return n;
  }
  uint64_t refused() const { return refused_.load(); }
  uint64_t handshakes_refused() const { return handshakes_refused_.load(); }
  uint64_t idle_closed() const { return idle_closed_.load(); }

 private:
  struct ServingConnection {
    int fd = -1;
    std::atomic<bool> finished{false};
    std::atomic<bool> authenticated{false};  // past the handshake
    bool evicted = false;                    // shut down to make room (under mu_)
    std::thread thread;
  };

  void StartAccept() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, asio_tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) Adopt(socket.release());
      StartAccept();
    });
  }

  void Adopt(int fd) {
    SetBlockingNoDelay(fd);
    if (options_.zerocopy_send) {
      int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one));
    }
    std::list<ServingConnection> finished;
    MutexLock lock(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {  // reap finished ones
      auto next = std::next(it);
      if (it->finished.load()) finished.splice(finished.end(), conns_, it);
      it = next;
    }
    for (auto& c : finished) c.thread.join();  // they have returned already
    if (conns_.size() >= static_cast<size_t>(options_.max_serving_connections)) {
      spdlog::warn("tcp transport: refusing a connection over max_serving_connections ({})",
                   options_.max_serving_connections);
      ::close(fd);
      return;
    }
    if (handshaking_.load() >= options_.max_unauthenticated_connections) {
      // At the bound, the connection that has waited longest in its handshake goes: a member
      // proves itself in one round trip, so the oldest is a silent one, and a crowd of silent
      // connects can never hold every place against a member.
      for (auto& old : conns_) {
        if (!old.authenticated.load() && !old.finished.load() && !old.evicted && old.fd >= 0) {
          old.evicted = true;
          ::shutdown(old.fd, SHUT_RDWR);
          break;
        }
      }
    }
    handshaking_.fetch_add(1);
    ServingConnection& c = conns_.emplace_back();
    c.fd = fd;
    c.thread = std::thread([this, &c, fd] {
      Serve(fd, &c.authenticated);
      MutexLock lock(&mu_);  // InterruptAll never shuts down a closed (or reused) fd number
      ::close(fd);
      c.fd = -1;
      c.finished.store(true);
    });
  }

  // One served connection: the handshake, then requests until the peer goes, idles past
  // idle_timeout or sends something malformed.
  void Serve(int fd, std::atomic<bool>* authenticated);
  bool Authenticate(int fd, std::atomic<bool>* authenticated);
  // A connection's reusable buffers (sized once, for the largest request).
  struct RequestBuffers {
    tcp::RequestHeader header;
    std::vector<tcp::WireDescriptor> wire;
    std::vector<uint8_t> codes;  // per descriptor: 0, or the absl::StatusCode refusing it
    std::vector<iovec> iov;
    std::vector<uint8_t> scratch;  // discards refused write payload
    std::string message;           // why the whole request was refused (stale generation)
  };
  // Reads one request's header and descriptors; false: close the connection.
  bool ReadRequest(int fd, int idle_ms, RequestBuffers& b);
  // The per-descriptor verdicts (range, write filter); the bytes that will move.
  uint64_t CheckDescriptors(const absl::StatusOr<RegisteredRegion::Lease>& lease,
                            RequestBuffers& b);
  // A write's payload: into the region for accepted descriptors, discarded for refused ones.
  bool ReceiveWritePayload(int fd, uint8_t* base, RequestBuffers& b);
  bool SendReply(int fd, const absl::StatusOr<RegisteredRegion::Lease>& lease, uint8_t* base,
                 uint64_t ok_bytes, RequestBuffers& b);

  const TcpTransportOptions& options_;
  RegisteredRegion& region_;
  asio::io_context io_;
  asio_tcp::acceptor acceptor_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> handshakes_refused_{0};
  std::atomic<int> handshaking_{0};  // serving connections still in the handshake
  std::atomic<uint64_t> idle_closed_{0};
  mutable Mutex mu_;
  std::list<ServingConnection> conns_ ABSL_GUARDED_BY(mu_);  // stable addresses
};

bool TcpTransport::Server::Authenticate(int fd, std::atomic<bool>* authenticated) {
  const auto handshake_deadline =
      Clock::now() + absl::ToChronoNanoseconds(options_.handshake_timeout);
  const absl::Status hs = tcp::ServerHandshake(fd, options_.cluster_secret, handshake_deadline);
  if (hs.ok()) authenticated->store(true);
  handshaking_.fetch_sub(1);
  if (!hs.ok()) {
    handshakes_refused_.fetch_add(1);
    spdlog::warn("tcp transport: closing a connection before any request: {}",
                 std::string(hs.message()));
  }
  return hs.ok();
}

bool TcpTransport::Server::ReadRequest(int fd, int idle_ms, RequestBuffers& b) {
  // Idle bound: an authenticated connection with no request for idle_timeout is closed.
  pollfd pfd{fd, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&pfd, 1, idle_ms);
  } while (ready < 0 && errno == EINTR);
  if (ready == 0) {
    idle_closed_.fetch_add(1);
    return false;
  }
  b.iov.assign(1, iovec{&b.header, sizeof(b.header)});
  if (!RecvAll(fd, b.iov).ok()) return false;
  absl::Status s = tcp::ValidateRequestHeader(b.header);
  if (s.ok()) {
    b.wire.resize(b.header.descriptor_count);
    b.iov.assign(1, iovec{b.wire.data(), b.wire.size() * sizeof(tcp::WireDescriptor)});
    if (!RecvAll(fd, b.iov).ok()) return false;
    s = tcp::ValidateRequestDescriptors(b.header, b.wire);
  }
  if (!s.ok()) spdlog::warn("tcp transport: closing a connection: {}", s.ToString());
  return s.ok();
}

uint64_t TcpTransport::Server::CheckDescriptors(
    const absl::StatusOr<RegisteredRegion::Lease>& lease, RequestBuffers& b) {
  const tcp::RequestHeader& h = b.header;
  b.message.clear();
  if (!lease.ok()) {
    b.message = std::string(lease.status().message());
    b.codes.assign(h.descriptor_count, static_cast<uint8_t>(lease.status().code()));
    refused_.fetch_add(1);
    return 0;
  }
  b.codes.assign(h.descriptor_count, 0);
  uint64_t ok_bytes = 0;
  const bool write = h.op == static_cast<uint8_t>(OpKind::kWrite);
  for (uint32_t i = 0; i < h.descriptor_count; ++i) {
    if (!CheckRange(lease->view().len, b.wire[i].offset, b.wire[i].len).ok()) {
      b.codes[i] = static_cast<uint8_t>(absl::StatusCode::kOutOfRange);
      refused_.fetch_add(1);
    } else if (write && (!options_.write_filter ||
                         !options_.write_filter(b.wire[i].offset, b.wire[i].len))) {
      b.codes[i] = static_cast<uint8_t>(absl::StatusCode::kPermissionDenied);
      refused_.fetch_add(1);
    } else {
      ok_bytes += b.wire[i].len;
    }
  }
  return ok_bytes;
}

bool TcpTransport::Server::ReceiveWritePayload(int fd, uint8_t* base, RequestBuffers& b) {
  b.iov.clear();
  for (uint32_t i = 0; i < b.header.descriptor_count; ++i) {
    if (b.codes[i] == 0) {
      b.iov.push_back({base + b.wire[i].offset, b.wire[i].len});
      continue;
    }
    for (uint64_t left = b.wire[i].len; left > 0;) {
      const uint64_t n = std::min<uint64_t>(left, b.scratch.size());
      b.iov.push_back({b.scratch.data(), n});
      left -= n;
    }
  }
  return RecvAll(fd, b.iov).ok();
}

bool TcpTransport::Server::SendReply(int fd, const absl::StatusOr<RegisteredRegion::Lease>& lease,
                                     uint8_t* base, uint64_t ok_bytes, RequestBuffers& b) {
  const tcp::RequestHeader& h = b.header;
  const bool read = h.op == static_cast<uint8_t>(OpKind::kRead);
  tcp::ReplyHeader reply;
  reply.descriptor_count = h.descriptor_count;
  reply.request_id = h.request_id;
  reply.status_code =
      static_cast<uint8_t>(lease.ok() ? absl::StatusCode::kOk : lease.status().code());
  b.message.resize(std::min<size_t>(b.message.size(), tcp::kMaxReplyMessageBytes));
  reply.message_bytes = static_cast<uint32_t>(b.message.size());
  reply.payload_bytes = read ? ok_bytes : 0;
  b.iov.clear();
  b.iov.push_back({&reply, sizeof(reply)});
  if (!b.message.empty()) b.iov.push_back({b.message.data(), b.message.size()});
  b.iov.push_back({b.codes.data(), b.codes.size()});
  int flags = 0;
  if (read) {
    for (uint32_t i = 0; i < h.descriptor_count; ++i) {
      if (b.codes[i] == 0) b.iov.push_back({base + b.wire[i].offset, b.wire[i].len});
    }
    flags = options_.zerocopy_send ? MSG_ZEROCOPY : 0;
  }
  const absl::Status s = SendAll(fd, b.iov, flags);
  if (flags != 0) DrainZerocopyCompletions(fd);
  return s.ok();
}

void TcpTransport::Server::Serve(int fd, std::atomic<bool>* authenticated) {
  if (!Authenticate(fd, authenticated)) return;
  const int idle_ms = static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(options_.idle_timeout), std::numeric_limits<int>::max()));
  RequestBuffers b;
  b.scratch.resize(64 << 10);
  b.wire.reserve(tcp::kMaxDescriptorsPerRequest);
  b.codes.reserve(tcp::kMaxDescriptorsPerRequest);
  b.iov.reserve(tcp::kMaxDescriptorsPerRequest + 4);
  while (ReadRequest(fd, idle_ms, b)) {
    // The lease keeps the region mapped (and its generation current) until the reply is sent.
    const absl::StatusOr<RegisteredRegion::Lease> lease = region_.Acquire(b.header.generation);
    const uint64_t ok_bytes = CheckDescriptors(lease, b);
    uint8_t* const base = lease.ok() ? lease->view().base : nullptr;
    if (b.header.op == static_cast<uint8_t>(OpKind::kWrite) && !ReceiveWritePayload(fd, base, b)) {
      return;
    }
    if (!SendReply(fd, lease, base, ok_bytes, b)) return;
  }
}

// ---------------------------------------------------------------------------------------------

TcpTransport::TcpTransport(TcpTransportOptions options)
    : options_(std::move(options)), reconnector_([this] { ReconnectLoop(); }) {}

void TcpTransport::RequestReconnect(Peer* peer) {
  MutexLock lock(&reconnect_mu_);
  if (std::find(reconnect_queue_.begin(), reconnect_queue_.end(), peer) == reconnect_queue_.end()) {
    reconnect_queue_.push_back(peer);
  }
  reconnect_cv_.SignalAll();
}

void TcpTransport::ReconnectLoop() {
  for (;;) {
    std::vector<Peer*> peers;
    {
      MutexLock lock(&reconnect_mu_);
      while (reconnect_queue_.empty() && !reconnect_stop_) {
        reconnect_cv_.WaitUntil(&reconnect_mu_, Clock::now() + std::chrono::seconds(1));
      }
      if (reconnect_stop_) return;
      peers.swap(reconnect_queue_);
    }
    for (Peer* p : peers) {
      absl::Status s =
          p->EnsureConnections(Clock::now() + absl::ToChronoNanoseconds(options_.connect_timeout));
      if (!s.ok()) {
        p->FailQueued(absl::UnavailableError(
            absl::StrCat("peer ", p->address(), " unreachable: ", s.message())));
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Create(TcpTransportOptions options) {
  if (options.connections_per_peer < 1 || options.connections_per_peer > 64) {
    return absl::InvalidArgumentError("connections_per_peer must be in [1, 64]");
  }
  if (options.request_bytes < 4096 || options.request_bytes > tcp::kMaxRequestBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_bytes must be in [4096, ", tcp::kMaxRequestBytes, "]"));
  }
  if (options.max_inflight_bytes_per_peer < options.request_bytes) {
    return absl::InvalidArgumentError("max_inflight_bytes_per_peer must be >= request_bytes");
  }
  std::unique_ptr<TcpTransport> t(new TcpTransport(std::move(options)));
  if (!t->options_.listen_address.empty()) {
    t->server_ = std::make_unique<Server>(t->options_, t->region_);
    absl::StatusOr<std::string> ep = t->server_->Start(t->options_.listen_address);
    if (!ep.ok()) return ep.status();
    t->endpoint_ = *ep;
  }
  return t;
}

TcpTransport::~TcpTransport() {
  closing_.store(true);
  registry_.AbortAll(absl::CancelledError("transport shutting down"));
  if (!registry_.WaitAllDone(absl::Seconds(30))) {
    spdlog::critical("tcp transport: batches did not complete within 30 s of shutdown");
    std::abort();
  }
  {
    MutexLock lock(&reconnect_mu_);
    reconnect_stop_ = true;
    reconnect_cv_.SignalAll();
  }
  reconnector_.join();
  {
    MutexLock lock(&peers_mu_);
    for (auto& [address, peer] : peers_) peer->Close();
  }
  if (server_) server_->Stop();
}

absl::Status TcpTransport::RegisterRegion(uint64_t generation, void* base, uint64_t len) {
  return region_.Register(generation, base, len);
}

absl::Status TcpTransport::SetRegionGeneration(uint64_t generation) {
  return region_.SetGeneration(generation);
}

absl::Status TcpTransport::UnregisterRegion() {
  if (!region_.registered()) return absl::NotFoundError("no region registered");
  registry_.AbortAll(absl::CancelledError("the local region is being unregistered"));
  if (!registry_.WaitAllDone(absl::Seconds(30))) {
    return absl::DeadlineExceededError("batches did not complete within 30 s");
  }
  if (server_) server_->InterruptAll();
  return region_.Unregister(absl::Seconds(30));
}

TcpTransport::Peer* TcpTransport::GetPeer(const std::string& address) {
  MutexLock lock(&peers_mu_);
  auto& p = peers_[address];
  if (!p)
    p = std::make_unique<Peer>(address, options_, [this](Peer* peer) { RequestReconnect(peer); });
  return p.get();
}

uint64_t TcpRequestLimit(const TcpTransportOptions& options, uint64_t batch_bytes) {
  const uint64_t base = options.request_bytes;
  if (!options.requests_of_connection_share) return base;
  const uint64_t c = static_cast<uint64_t>(std::max(1, options.connections_per_peer));
  const uint64_t share = (batch_bytes + c - 1) / c;
  const uint64_t cap =
      std::min(tcp::kMaxRequestBytes, std::max(base, options.max_inflight_bytes_per_peer / c));
  return std::clamp(share, base, cap);
}

absl::StatusOr<BatchHandle> TcpTransport::DoSubmit(const PeerId& peer, OpKind op,
                                                   std::span<const Descriptor> descriptors,
                                                   absl::Duration timeout) {
  // Cut the batch into requests of at most RequestLimit() bytes and kMaxDescriptorsPerRequest
  // pieces.
  auto batch = std::make_shared<TcpBatch>();
  std::vector<Unit> units;
  {
    uint64_t total = 0;
    for (const Descriptor& d : descriptors) total += d.len;
    const uint64_t limit = TcpRequestLimit(options_, total);
    Unit cur;
    for (uint32_t i = 0; i < descriptors.size(); ++i) {
      const Descriptor& d = descriptors[i];
      for (uint64_t done = 0; done < d.len;) {
        const uint64_t n = std::min(d.len - done, limit - cur.bytes);
        batch->pieces.push_back(
            Piece{i, d.remote_offset + done, static_cast<uint8_t*>(d.local_addr) + done, n});
        done += n;
        cur.bytes += n;
        ++cur.piece_count;
        if (cur.bytes == limit || cur.piece_count == tcp::kMaxDescriptorsPerRequest) {
          units.push_back(cur);
          cur = Unit{};
          cur.first_piece = static_cast<uint32_t>(batch->pieces.size());
        }
      }
    }
    if (cur.piece_count > 0) units.push_back(cur);
    for (Unit& u : units) u.batch = batch;
  }

  batch->state = registry_.Create(peer, op, descriptors, timeout);
  batch->state->SetUnits(units.size());
  Peer* p = GetPeer(peer.address);
  std::weak_ptr<TcpBatch> weak = batch;
  batch->state->SetAbortHook([p, weak] {
    if (auto b = weak.lock()) p->AbortBatch(b.get());
  });
  registry_.Arm(batch->state);
  BatchHandle handle(batch->state);

  absl::Status s = p->EnsureConnections(batch->state->deadline());
  if (!s.ok()) {
    // A refused membership proof stays PermissionDenied: retrying the same peer will not help.
    batch->state->Abort(s.code() == absl::StatusCode::kPermissionDenied
                            ? s
                            : absl::UnavailableError(absl::StrCat("peer ", peer.address,
                                                                  " unreachable: ", s.message())));
    for (size_t i = 0; i < units.size(); ++i) batch->state->FinishUnit();
    return handle;
  }
  p->Enqueue(std::move(units));
  return handle;
}

std::vector<uint64_t> TcpTransport::ConnectionLoads(const std::string& address) const {
  MutexLock lock(&peers_mu_);
  auto it = peers_.find(address);
  return it == peers_.end() ? std::vector<uint64_t>{} : it->second->connection_loads();
}

void TcpTransport::AddStats(TransportStats* out) const {
  TransportStats& s = *out;
  s.outstanding_batches = registry_.outstanding();
  s.batches_completed = registry_.completed();
  {
    MutexLock lock(&peers_mu_);
    for (const auto& [address, p] : peers_) {
      const PeerWindow w = p->window();
      s.inflight_bytes += w.inflight();
      s.queued_bytes += w.queued();
      s.open_connections += p->live_connections();
    }
  }
  if (server_) {
    s.serving_connections = server_->connections();
    s.requests_refused = server_->refused();
    s.handshakes_refused = server_->handshakes_refused();
    s.idle_closed = server_->idle_closed();
  }
}

}  // namespace fluxon::transport
