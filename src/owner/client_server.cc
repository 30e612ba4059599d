#include "owner/client_server.h"

#include "rpc/client_codec.h"

#include <grp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "common/private_files.h"
#include "fluxon/status.h"
#include "fluxon/v1/client.pb.h"
#include "rpc/frame.h"
#include "spdlog/spdlog.h"

namespace fluxon {
namespace {

namespace asio = boost::asio;
constexpr size_t kMaxQueuedEvents = 100'000;
constexpr size_t kSessionSecretBytes = 16;

// Whether two secrets differ, in time independent of where (a check must not leak a prefix).
bool SecretsDiffer(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return true;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff != 0;
}

void SetStatus(v1::OwnerMessage* m, const absl::Status& s) {
  m->set_code(static_cast<int32_t>(s.code()));
  m->set_message(std::string(s.message()));
}

std::optional<ClientRequestType> TimedRequestType(v1::ClientRequest::BodyCase body) {
  switch (body) {
    case v1::ClientRequest::kPutStart:
      return ClientRequestType::kPutStart;
    case v1::ClientRequest::kPutCommit:
      return ClientRequestType::kPutCommit;
    case v1::ClientRequest::kPutAbort:
      return ClientRequestType::kPutAbort;
    case v1::ClientRequest::kGetStart:
      return ClientRequestType::kGetStart;
    case v1::ClientRequest::kGetTransfer:
      return ClientRequestType::kGetTransfer;
    case v1::ClientRequest::kCancelGet:
      return ClientRequestType::kCancelGet;
    case v1::ClientRequest::kReleaseViews:
      return ClientRequestType::kReleaseViews;
    default:
      return std::nullopt;
  }
}

}  // namespace

const char* ClientRequestTypeName(ClientRequestType type) {
  switch (type) {
    case ClientRequestType::kPutStart:
      return "put_start";
    case ClientRequestType::kPutCommit:
      return "put_commit";
    case ClientRequestType::kPutAbort:
      return "put_abort";
    case ClientRequestType::kGetStart:
      return "get_start";
    case ClientRequestType::kGetTransfer:
      return "get_transfer";
    case ClientRequestType::kCancelGet:
      return "cancel_get";
    case ClientRequestType::kReleaseViews:
      return "release_views";
  }
  return "unknown";
}

class ClientServer::Impl {
 public:
  // One accepted socket and the thread serving it.
  struct Connection {
    int fd = -1;  // -1 once closed (guarded by Impl::mu_ for the close)
    std::thread thread;
    bool done = false;  // guarded by Impl::mu_
    ucred peer{};       // SO_PEERCRED at accept
    std::chrono::steady_clock::time_point accepted_at;
    uint64_t session = 0;  // set by Hello
    // Events connections only: frames waiting to be written, and an eventfd that wakes the thread.
    Mutex mu;
    std::deque<std::string> events ABSL_GUARDED_BY(mu);
    int wake_fd = -1;
  };
  // A client process's session: the owner's, bound to the process that opened it.
  struct Session {
    std::string secret;  // kSessionSecretBytes random bytes
    uid_t uid = 0;
    pid_t pid = 0;
    int connections = 0;           // open connections that joined it
    Connection* events = nullptr;  // its events connection, if open
  };

  Impl(OwnerCore* core, ClientServerOptions options)
      : core_(core), options_(std::move(options)), acceptor_(io_) {}
  ~Impl() { Stop(); }

  absl::Status Listen();
  void Run() {
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  void Stop();
  size_t sessions() const {
    MutexLock lock(&mu_);
    return sessions_.size();
  }
  const ClientRequestLatencies& latencies() const { return latencies_; }

 private:
  void AcceptLoop();
  bool PeerAllowed(int fd, ucred* cred);
  void Serve(Connection* c);
  void ServeEvents(Connection* c);
  // Handles one request; returns false when the connection must close. A short dispatch: Hello
  // and PutCommit write their own answers (the segment fd rides on Hello's; PutCommit wakes the
  // publisher after its answer), every other request is answered by Answer.
  bool Handle(Connection* c, v1::ClientRequest& req, bool* events);
  bool HandleHello(Connection* c, const v1::Hello& h, v1::OwnerMessage* resp, bool* events);
  bool HandlePutCommit(Connection* c, const v1::PutCommitRequest& r, v1::OwnerMessage* resp,
                       std::chrono::steady_clock::time_point parsed_at);
  // One handler per request type: converts with rpc/client_codec, calls the core, fills `resp`.
  absl::Status Answer(Connection* c, v1::ClientRequest& req, v1::OwnerMessage* resp);
  absl::Status AnswerPutStart(Connection* c, v1::PutStartRequest* r, v1::PutStartReply* out);
  absl::Status AnswerGetStart(Connection* c, v1::GetStartRequest* r, v1::GetStartReply* out);
  // A deferred handle's answer carries the consumed values' places (none otherwise).
  absl::Status AnswerGetTransfer(Connection* c, const v1::GetTransferRequest& r,
                                 v1::OwnerMessage* resp);
  absl::Status AnswerDeletePrefix(const v1::DeletePrefixRequest& r, v1::DeletePrefixReply* out);
  void AnswerStats(v1::StatsReply* out);
  // The request's latency, recorded before its answer is written (a client that has its answer
  // sees it counted). Untimed request types are not recorded.
  void RecordLatency(v1::ClientRequest::BodyCase body,
                     std::chrono::steady_clock::time_point parsed_at);
  // Opens a session for `c` or joins the one its Hello names.
  absl::Status OpenOrJoinSession(Connection* c, const v1::Hello& h, std::string* new_secret);
  // `c` leaves its session; the last connection out ends it (cleanup in the core).
  void LeaveSession(Connection* c);
  void SendEvent(uint64_t client_id, const v1::OwnerMessage& msg);
  // Tells the peer why its connection is refused or closed (an id-0 error frame; best effort).
  static void SendRefusal(int fd, const absl::Status& why);
  void ReapFinished() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  OwnerCore* const core_;
  const ClientServerOptions options_;
  asio::io_context io_;
  asio::local::stream_protocol::acceptor acceptor_;
  std::thread accept_thread_;
  std::atomic<bool> stopped_{false};
  gid_t allowed_gid_ = static_cast<gid_t>(-1);
  mutable Mutex mu_;
  std::map<Connection*, std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  ClientRequestLatencies latencies_;  // each histogram is internally atomic
};

void ClientServer::Impl::Stop() {
  if (stopped_.exchange(true)) return;
  boost::system::error_code ec;
  ::shutdown(acceptor_.native_handle(), SHUT_RDWR);
  acceptor_.close(ec);
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    MutexLock lock(&mu_);
    for (auto& [p, c] : connections_) {
      if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
      if (c->wake_fd >= 0) {
        const uint64_t one = 1;
        (void)!::write(c->wake_fd, &one, sizeof one);
      }
    }
  }
  for (;;) {
    std::unique_ptr<Connection> c;
    {
      MutexLock lock(&mu_);
      if (connections_.empty()) break;
      c = std::move(connections_.begin()->second);
      connections_.erase(connections_.begin());
    }
    if (c->thread.joinable()) c->thread.join();
    if (c->wake_fd >= 0) ::close(c->wake_fd);
  }
  ::unlink(options_.socket_path.c_str());
}

void ClientServer::Impl::ReapFinished() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->second->done) {
      it->second->thread.join();
      if (it->second->wake_fd >= 0) ::close(it->second->wake_fd);
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void ClientServer::Impl::SendRefusal(int fd, const absl::Status& why) {
  v1::OwnerMessage m;
  m.set_id(0);
  SetStatus(&m, why);
  const std::string frame = EncodeFrame(m);
  // Non-blocking: a peer that does not read must not stall the owner.
  (void)!::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void ClientServer::Impl::AcceptLoop() {
  for (;;) {
    boost::system::error_code ec;
    asio::local::stream_protocol::socket socket(io_);
    acceptor_.accept(socket, ec);
    if (stopped_) return;
    if (ec) {
      spdlog::warn("accept failed: {}", ec.message());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    const int fd = socket.release(ec);
    ucred cred{};
    if (ec || !PeerAllowed(fd, &cred)) {
      if (!ec) SendRefusal(fd, absl::PermissionDeniedError("peer is not allowed on this socket"));
      ::close(fd);
      continue;
    }
    MutexLock lock(&mu_);
    ReapFinished();
    if (connections_.size() >= options_.max_connections) {
      spdlog::warn(
          "refusing a client connection from pid {}: {} connections open (max_connections)",
          cred.pid, connections_.size());
      SendRefusal(fd, absl::ResourceExhaustedError(absl::StrFormat(
                          "the owner has %d client connections open (max_connections); "
                          "connection refused",
                          connections_.size())));
      ::close(fd);
      continue;
    }
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->peer = cred;
    c->accepted_at = std::chrono::steady_clock::now();
    Connection* raw = c.get();
    connections_[raw] = std::move(c);
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }
}

void ClientServer::Impl::Serve(Connection* c) {
  bool events = false;
  for (;;) {
    const bool said_hello = c->session != 0;
    FrameReadOptions read;
    if (said_hello) {
      // Idle connections of a live session may wait for their next request without limit.
      if (!WaitReadable(c->fd, options_.busy_poll_us).ok()) break;
      read.deadline = std::chrono::steady_clock::now() + options_.frame_timeout;
    } else {
      read.max_bytes = kMaxHelloFrameBytes;
      read.deadline = c->accepted_at + options_.hello_timeout;
    }
    v1::ClientRequest req;
    absl::Status st = ReadFrame(c->fd, &req, read);
    if (!st.ok()) {
      if (st.code() != absl::StatusCode::kUnavailable) {
        spdlog::warn("client pid {} session {}: {}; closing the connection", c->peer.pid,
                     c->session, st.ToString());
        SendRefusal(c->fd,
                    absl::Status(st.code(),
                                 absl::StrCat(st.message(), "; the owner closed the connection")));
      }
      break;
    }
    if (!said_hello && req.body_case() != v1::ClientRequest::kHello) {
      spdlog::warn("client pid {} sent a request before Hello; closing the connection",
                   c->peer.pid);
      SendRefusal(c->fd, absl::FailedPreconditionError(
                             "the first frame on a connection must be Hello; connection closed"));
      break;
    }
    if (!Handle(c, req, &events)) break;
    if (events) {
      ServeEvents(c);
      break;
    }
  }
  LeaveSession(c);
  MutexLock lock(&mu_);
  // Closed now, not at the next accept: the peer sees the end at once.
  ::close(c->fd);
  c->fd = -1;
  c->done = true;
}

absl::Status ClientServer::Impl::OpenOrJoinSession(Connection* c, const v1::Hello& h,
                                                   std::string* new_secret) {
  if (c->session != 0) {
    return absl::FailedPreconditionError("this connection already said Hello");
  }
  MutexLock lock(&mu_);
  if (h.client_id() == 0) {
    if (h.events()) {
      return absl::InvalidArgumentError("an events connection must join an open session");
    }
    std::string secret(kSessionSecretBytes, '\0');
    if (getrandom(secret.data(), secret.size(), 0) != static_cast<ssize_t>(secret.size())) {
      return absl::InternalError("no randomness for a session secret");
    }
    const uint64_t id = core_->NewClientId();
    Session& s = sessions_[id];
    s.secret = secret;
    s.uid = c->peer.uid;
    s.pid = c->peer.pid;
    s.connections = 1;
    c->session = id;
    *new_secret = std::move(secret);
    return absl::OkStatus();
  }
  auto it = sessions_.find(h.client_id());
  const std::string& given = h.session_secret();
  // One answer for every refusal: a probe learns nothing about which sessions exist.
  const absl::Status refused = absl::PermissionDeniedError(
      "unknown session, wrong session secret, or another process (sessions are per process)");
  if (it == sessions_.end() || SecretsDiffer(given, it->second.secret) ||
      it->second.uid != c->peer.uid || it->second.pid != c->peer.pid) {
    spdlog::warn("refused a Hello from pid {} uid {} naming session {}", c->peer.pid, c->peer.uid,
                 h.client_id());
    return refused;
  }
  if (h.events() && it->second.events != nullptr) {
    return absl::AlreadyExistsError("the session already has an events connection");
  }
  ++it->second.connections;
  if (h.events()) it->second.events = c;
  c->session = h.client_id();
  return absl::OkStatus();
}

void ClientServer::Impl::LeaveSession(Connection* c) {
  if (c->session == 0) return;
  bool last = false;
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(c->session);
    if (it != sessions_.end()) {
      if (it->second.events == c) it->second.events = nullptr;
      if (--it->second.connections == 0) {
        sessions_.erase(it);
        last = true;
      }
    }
  }
  if (last) core_->DisconnectClient(c->session);
}

// An events connection: writes queued PutDone frames and watches for its end.
void ClientServer::Impl::ServeEvents(Connection* c) {
  pollfd fds[2] = {{c->fd, POLLIN, 0}, {c->wake_fd, POLLIN, 0}};
  bool open = true;
  while (open && !stopped_) {
    fds[0].revents = fds[1].revents = 0;
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (fds[0].revents != 0) {
      char buf[64];
      const ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) open = false;
    }
    if (fds[1].revents != 0) {
      uint64_t count;
      (void)!::read(c->wake_fd, &count, sizeof count);
    }
    std::deque<std::string> out;
    {
      MutexLock lock(&c->mu);
      out.swap(c->events);
    }
    for (const std::string& frame : out) {
      if (!WriteAll(c->fd, frame.data(), frame.size()).ok()) {
        open = false;
        break;
      }
    }
  }
}

void ClientServer::Impl::SendEvent(uint64_t client_id, const v1::OwnerMessage& msg) {
  std::string frame = EncodeFrame(msg);
  MutexLock lock(&mu_);
  auto it = sessions_.find(client_id);
  if (it == sessions_.end() || it->second.events == nullptr) return;  // nobody waits for it
  Connection* c = it->second.events;
  {
    MutexLock cl(&c->mu);
    if (c->events.size() >= kMaxQueuedEvents) {
      spdlog::warn("client {} stopped reading its events; closing its events connection",
                   client_id);
      ::shutdown(c->fd, SHUT_RDWR);
    } else {
      c->events.push_back(std::move(frame));
    }
  }
  const uint64_t one = 1;
  (void)!::write(c->wake_fd, &one, sizeof one);
}

void ClientServer::Impl::RecordLatency(v1::ClientRequest::BodyCase body,
                                       std::chrono::steady_clock::time_point parsed_at) {
  if (const std::optional<ClientRequestType> timed = TimedRequestType(body)) {
    latencies_[static_cast<int>(*timed)].Record(std::chrono::steady_clock::now() - parsed_at);
  }
}

bool ClientServer::Impl::Handle(Connection* c, v1::ClientRequest& req, bool* events) {
  v1::OwnerMessage resp;
  resp.set_id(req.id());
  const auto parsed_at = std::chrono::steady_clock::now();
  switch (req.body_case()) {
    case v1::ClientRequest::kHello:
      return HandleHello(c, req.hello(), &resp, events);
    case v1::ClientRequest::kPutCommit:
      return HandlePutCommit(c, req.put_commit(), &resp, parsed_at);
    default:
      break;
  }
  SetStatus(&resp, Answer(c, req, &resp));
  RecordLatency(req.body_case(), parsed_at);
  const bool written = WriteFrame(c->fd, resp).ok();
  // After the answer: a deferred get_start's prefetch worker must not delay it.
  if (req.body_case() == v1::ClientRequest::kGetStart) core_->WakePrefetches();
  return written;
}

bool ClientServer::Impl::HandleHello(Connection* c, const v1::Hello& h, v1::OwnerMessage* resp,
                                     bool* events) {
  // A refused Hello is answered with the reason and closes the connection.
  auto refuse = [&](const absl::Status& why) {
    SetStatus(resp, why);
    (void)WriteFrame(c->fd, *resp);
    return false;
  };
  if (h.protocol_version() != kProtocolVersion) {
    return refuse(absl::FailedPreconditionError(absl::StrFormat(
        "client speaks protocol %d, owner speaks %d", h.protocol_version(), kProtocolVersion)));
  }
  if (h.events()) {
    c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->wake_fd < 0) {
      return refuse(absl::ResourceExhaustedError("eventfd for the events connection failed"));
    }
  }
  std::string secret;
  if (absl::Status joined = OpenOrJoinSession(c, h, &secret); !joined.ok()) return refuse(joined);
  if (h.events()) {
    // The events connection is answered like any request, then only carries PutDone events.
    *events = true;
    SetStatus(resp, absl::OkStatus());
    return WriteFrame(c->fd, *resp).ok();
  }
  const Segment& seg = core_->memory().segment();
  v1::HelloReply* hr = resp->mutable_hello();
  hr->set_client_id(c->session);
  if (!secret.empty()) hr->set_session_secret(secret);
  v1::SegmentInfo* si = hr->mutable_segment();
  si->set_segment_label("external_owner:0");
  si->set_generation(seg.generation());
  si->set_total_bytes(seg.total_bytes());
  si->set_data_offset(seg.data_offset());
  si->set_node_id(seg.node_id());
  si->set_path(seg.path());
  SetStatus(resp, absl::OkStatus());
  // The segment fd rides on the reply frame.
  return SendFrameWithFd(c->fd, EncodeFrame(*resp), seg.fd()).ok();
}

bool ClientServer::Impl::HandlePutCommit(Connection* c, const v1::PutCommitRequest& r,
                                         v1::OwnerMessage* resp,
                                         std::chrono::steady_clock::time_point parsed_at) {
  const uint64_t put_id = r.put_id();
  const uint64_t client = c->session;
  const absl::Status st = core_->PutCommit(
      client, put_id,
      [this, client, put_id](const absl::Status& s) {
        v1::OwnerMessage ev;
        v1::PutDoneEvent* pd = ev.mutable_put_done();
        pd->set_put_id(put_id);
        pd->set_code(static_cast<int32_t>(s.code()));
        pd->set_message(std::string(s.message()));
        SendEvent(client, ev);
      },
      /*defer_publish_wake=*/true);
  SetStatus(resp, st);
  RecordLatency(v1::ClientRequest::kPutCommit, parsed_at);
  const bool written = WriteFrame(c->fd, *resp).ok();
  core_->WakePublisher();  // after the answer: the woken actor must not delay it
  return written;
}

absl::Status ClientServer::Impl::Answer(Connection* c, v1::ClientRequest& req,
                                        v1::OwnerMessage* resp) {
  switch (req.body_case()) {
    case v1::ClientRequest::kPutStart:
      return AnswerPutStart(c, req.mutable_put_start(), resp->mutable_put_start());
    case v1::ClientRequest::kPutAbort:
      return core_->PutAbort(c->session, req.put_abort().put_id());
    case v1::ClientRequest::kGetStart:
      return AnswerGetStart(c, req.mutable_get_start(), resp->mutable_get_start());
    case v1::ClientRequest::kGetTransfer:
      return AnswerGetTransfer(c, req.get_transfer(), resp);
    case v1::ClientRequest::kCancelGet:
      return core_->CancelGet(c->session, req.cancel_get().handle_id());
    case v1::ClientRequest::kReleaseViews:
      return core_->ReleaseViews(c->session, req.release_views().handle_id());
    case v1::ClientRequest::kDeletePrefix:
      return AnswerDeletePrefix(req.delete_prefix(), resp->mutable_delete_prefix());
    case v1::ClientRequest::kStats:
      AnswerStats(resp->mutable_stats());
      return absl::OkStatus();
    case v1::ClientRequest::kHello:
    case v1::ClientRequest::kPutCommit:
      break;  // handled by Handle
    case v1::ClientRequest::BODY_NOT_SET:
      return absl::InvalidArgumentError("empty request");
  }
  return absl::InternalError("request type without a handler");
}

absl::Status ClientServer::Impl::AnswerPutStart(Connection* c, v1::PutStartRequest* r,
                                                v1::PutStartReply* out) {
  PutStartArgs a;
  a.options = DecodePutStart(r, &a.keys, &a.value_len);
  std::vector<uint32_t> conflicts;
  absl::StatusOr<PutStartOutcome> started = core_->PutStart(c->session, std::move(a), &conflicts);
  for (uint32_t i : conflicts) out->add_conflict_indices(i);
  if (!started.ok()) return started.status();
  out->set_put_id(started->put_id);
  for (uint64_t o : started->offsets) out->add_offsets(o);
  return absl::OkStatus();
}

absl::Status ClientServer::Impl::AnswerGetStart(Connection* c, v1::GetStartRequest* r,
                                                v1::GetStartReply* out) {
  std::vector<std::string> keys;
  std::vector<uint32_t> groups;
  const bool allow_deferred = r->allow_deferred();
  const bool best_effort = DecodeGetStart(r, &keys, &groups);
  absl::StatusOr<GetStartOutcome> started =
      core_->GetStart(c->session, keys, groups, best_effort, allow_deferred,
                      /*defer_prefetch_wake=*/true);
  if (!started.ok()) return started.status();
  EncodeGetStartReply(*started, out);
  // get_start + get_transfer in one round trip: the whole prefix, here already (a deferred
  // answer's transfer waits for its fetch, so it stays a call of its own).
  if (r->transfer() && started->handle_id != 0 && !started->deferred) {
    absl::Status transferred = core_->GetTransfer(c->session, started->handle_id, 0, nullptr);
    if (!transferred.ok()) {
      (void)core_->CancelGet(c->session, started->handle_id);
      return transferred;
    }
    out->set_transferred(true);
    out->set_view_lease_ms(static_cast<uint64_t>(core_->view_lease().count()));
  }
  return absl::OkStatus();
}

absl::Status ClientServer::Impl::AnswerGetTransfer(Connection* c, const v1::GetTransferRequest& r,
                                                   v1::OwnerMessage* resp) {
  std::vector<HandleTable::Located> located;
  FLUXON_RETURN_IF_ERROR(
      core_->GetTransfer(c->session, r.handle_id(), r.consume_prefix_len(), &located));
  if (located.empty()) return absl::OkStatus();
  v1::GetTransferReply* out = resp->mutable_get_transfer();
  out->mutable_offsets()->Reserve(static_cast<int>(located.size()));
  out->mutable_lens()->Reserve(static_cast<int>(located.size()));
  for (const HandleTable::Located& l : located) {
    out->add_offsets(l.offset);
    out->add_lens(l.len);
  }
  return absl::OkStatus();
}

absl::Status ClientServer::Impl::AnswerDeletePrefix(const v1::DeletePrefixRequest& r,
                                                    v1::DeletePrefixReply* out) {
  absl::StatusOr<DeleteOutcome> deleted = core_->DeletePrefix(r.prefix());
  if (!deleted.ok()) return deleted.status();
  out->set_deleted(deleted->deleted);
  out->set_skipped_in_use(deleted->skipped_in_use);
  return absl::OkStatus();
}

void ClientServer::Impl::AnswerStats(v1::StatsReply* out) {
  auto* counters = out->mutable_counters();
  for (const auto& [k, v] : core_->Stats()) (*counters)[k] = v;
  (*counters)["client_sessions"] = static_cast<int64_t>(sessions());
}

bool ClientServer::Impl::PeerAllowed(int fd, ucred* cred) {
  socklen_t len = sizeof *cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) != 0) return false;
  if (cred->uid == 0 || cred->uid == geteuid()) return true;
  if (allowed_gid_ != static_cast<gid_t>(-1)) {
    if (cred->gid == allowed_gid_) return true;
    // Supplementary groups count too (usermod -aG, systemd SupplementaryGroups=): the socket
    // file's 0660 mode admits them, so the credential check must as well.
    std::vector<gid_t> groups(64);
    for (;;) {
      socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
      if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
        groups.resize(bytes / sizeof(gid_t));
        break;
      }
      if (errno != ERANGE || groups.size() > 65536) {
        groups.clear();
        break;
      }
      groups.resize(std::max<size_t>(groups.size() * 2, bytes / sizeof(gid_t)));
    }
    if (std::find(groups.begin(), groups.end(), allowed_gid_) != groups.end()) return true;
  }
  spdlog::warn("refused a client connection from uid {} gid {} pid {}", cred->uid, cred->gid,
               cred->pid);
  return false;
}

absl::Status ClientServer::Impl::Listen() {
  const std::filesystem::path path(options_.socket_path);
  if (path.string().size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("socket path %s is too long for a Unix socket", path.string()));
  }
  // Another user who controls the socket's directory could swap the socket for one of theirs
  // and receive every client's requests; such a directory stops the start.
  if (absl::Status st = EnsureSafeDirectory(path.parent_path().string(), 0755, "owner.socket_path");
      !st.ok()) {
    return st;
  }
  if (std::filesystem::exists(path)) {
    // A live owner answers on it; a stale file from a dead one is replaced.
    asio::local::stream_protocol::socket probe(io_);
    boost::system::error_code ec;
    probe.connect(asio::local::stream_protocol::endpoint(path.string()), ec);
    if (!ec) {
      return absl::AlreadyExistsError(
          absl::StrFormat("another owner is listening on %s", path.string()));
    }
    ::unlink(path.c_str());
  }
  if (!options_.socket_group.empty()) {
    group* g = getgrnam(options_.socket_group.c_str());
    if (g == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("socket_group '%s' does not exist", options_.socket_group));
    }
    allowed_gid_ = g->gr_gid;
  }
  boost::system::error_code ec;
  const mode_t old_mask = ::umask(0177);  // the socket is born 0600
  acceptor_.open(asio::local::stream_protocol(), ec);
  if (!ec) acceptor_.bind(asio::local::stream_protocol::endpoint(path.string()), ec);
  ::umask(old_mask);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrFormat("listening on %s: %s", path.string(), ec.message()));
  }
  if (allowed_gid_ != static_cast<gid_t>(-1)) {
    if (::chown(path.c_str(), static_cast<uid_t>(-1), allowed_gid_) != 0 ||
        ::chmod(path.c_str(), 0660) != 0) {
      return absl::PermissionDeniedError(absl::StrFormat("opening %s to group %s: %s",
                                                         path.string(), options_.socket_group,
                                                         std::strerror(errno)));
    }
  }
  spdlog::info("owner listening for clients on {}", path.string());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ClientServer>> ClientServer::Start(OwnerCore* core,
                                                                  ClientServerOptions options) {
  auto impl = std::make_unique<Impl>(core, std::move(options));
  absl::Status st = impl->Listen();
  if (!st.ok()) return st;
  impl->Run();
  return std::unique_ptr<ClientServer>(new ClientServer(std::move(impl)));
}

ClientServer::ClientServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClientServer::~ClientServer() { Stop(); }
void ClientServer::Stop() { impl_->Stop(); }
size_t ClientServer::sessions() const { return impl_->sessions(); }
const ClientRequestLatencies& ClientServer::latencies() const { return impl_->latencies(); }

}  // namespace fluxon
