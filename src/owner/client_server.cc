#include "owner/client_server.h"

#include <grp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "fluxon/v1/client.pb.h"
#include "rpc/frame.h"
#include "spdlog/spdlog.h"

namespace fluxon {
namespace {

namespace asio = boost::asio;
constexpr size_t kMaxQueuedEvents = 100'000;

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
    int fd = -1;
    std::thread thread;
    bool done = false;  // guarded by Impl::mu_
    // Events connections only: frames waiting to be written, and an eventfd that wakes the thread.
    Mutex mu;
    std::deque<std::string> events ABSL_GUARDED_BY(mu);
    int wake_fd = -1;
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
  bool PeerAllowed(int fd);
  void Serve(Connection* c);
  void ServeEvents(Connection* c, uint64_t client_id);
  // Handles one request; returns false when the connection must close.
  bool Handle(Connection* c, const v1::ClientRequest& req, uint64_t* client_id, bool* events);
  void SendEvent(uint64_t client_id, const v1::OwnerMessage& msg);
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
  std::map<uint64_t, Connection*> sessions_ ABSL_GUARDED_BY(mu_);  // client_id -> events conn
  ClientRequestLatencies latencies_;  // each histogram is internally atomic
};

void ClientServer::Impl::Stop() {
  if (stopped_.exchange(true)) return;
  boost::system::error_code ec;
  ::shutdown(acceptor_.native_handle(), SHUT_RDWR);
  acceptor_.close(ec);
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::unique_ptr<Connection>> all;
  {
    MutexLock lock(&mu_);
    for (auto& [p, c] : connections_) {
      ::shutdown(c->fd, SHUT_RDWR);
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
    ::close(c->fd);
    if (c->wake_fd >= 0) ::close(c->wake_fd);
  }
  ::unlink(options_.socket_path.c_str());
}

void ClientServer::Impl::ReapFinished() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->second->done) {
      it->second->thread.join();
      ::close(it->second->fd);
      if (it->second->wake_fd >= 0) ::close(it->second->wake_fd);
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
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
    if (ec || !PeerAllowed(fd)) {
      ::close(fd);
      continue;
    }
    MutexLock lock(&mu_);
    ReapFinished();
    if (connections_.size() >= options_.max_connections) {
      spdlog::warn("refusing a client connection: {} connections open", connections_.size());
      ::close(fd);
      continue;
    }
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    Connection* raw = c.get();
    connections_[raw] = std::move(c);
    raw->thread = std::thread([this, raw] { Serve(raw); });
  }
}

void ClientServer::Impl::Serve(Connection* c) {
  uint64_t client_id = 0;
  bool events = false;
  for (;;) {
    if (!WaitReadable(c->fd, options_.busy_poll_us).ok()) break;
    v1::ClientRequest req;
    absl::Status st = ReadFrame(c->fd, &req);
    if (!st.ok()) {
      if (st.code() != absl::StatusCode::kUnavailable) {
        spdlog::warn("client {}: {}; closing the connection", client_id, st.ToString());
      }
      break;
    }
    if (!Handle(c, req, &client_id, &events)) break;
    if (events) {
      ServeEvents(c, client_id);
      break;
    }
  }
  MutexLock lock(&mu_);
  c->done = true;
}

// An events connection: writes queued PutDone frames and watches for the session's end.
void ClientServer::Impl::ServeEvents(Connection* c, uint64_t client_id) {
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
  {
    MutexLock lock(&mu_);
    auto it = sessions_.find(client_id);
    if (it != sessions_.end() && it->second == c) sessions_.erase(it);
  }
  core_->DisconnectClient(client_id);
}

void ClientServer::Impl::SendEvent(uint64_t client_id, const v1::OwnerMessage& msg) {
  std::string frame = EncodeFrame(msg);
  MutexLock lock(&mu_);
  auto it = sessions_.find(client_id);
  if (it == sessions_.end()) return;  // the session is gone; nobody waits for this future
  Connection* c = it->second;
  {
    MutexLock cl(&c->mu);
    if (c->events.size() >= kMaxQueuedEvents) {
      spdlog::warn("client {} stopped reading its events; closing the session", client_id);
      ::shutdown(c->fd, SHUT_RDWR);
    } else {
      c->events.push_back(std::move(frame));
    }
  }
  const uint64_t one = 1;
  (void)!::write(c->wake_fd, &one, sizeof one);
}

bool ClientServer::Impl::Handle(Connection* c, const v1::ClientRequest& req, uint64_t* client_id,
                                bool* events) {
  v1::OwnerMessage resp;
  resp.set_id(req.id());
  const auto parsed_at = std::chrono::steady_clock::now();
  const std::optional<ClientRequestType> timed = TimedRequestType(req.body_case());
  // Recorded before the reply is written, so a client that has its reply sees it counted.
  auto record = [&] {
    if (timed) {
      latencies_[static_cast<int>(*timed)].Record(std::chrono::steady_clock::now() - parsed_at);
    }
  };
  absl::Status st;
  switch (req.body_case()) {
    case v1::ClientRequest::kHello: {
      const v1::Hello& h = req.hello();
      if (h.protocol_version() != kProtocolVersion) {
        st = absl::FailedPreconditionError(absl::StrFormat(
            "client speaks protocol %d, owner speaks %d", h.protocol_version(), kProtocolVersion));
        break;
      }
      if (h.events()) {
        if (h.client_id() == 0) {
          st = absl::InvalidArgumentError("events connection needs the session's client_id");
          break;
        }
        c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c->wake_fd < 0) {
          st = absl::ResourceExhaustedError("eventfd for the events connection failed");
          break;
        }
        *client_id = h.client_id();
        *events = true;
        {
          MutexLock lock(&mu_);
          sessions_[*client_id] = c;
        }
        break;
      }
      // A session's further control connections carry its id: its puts, handles and PutDone
      // events must stay with the one events connection that ends the session.
      *client_id = h.client_id() != 0 ? h.client_id() : core_->NewClientId();
      const Segment& seg = core_->memory().segment();
      v1::HelloReply* hr = resp.mutable_hello();
      hr->set_client_id(*client_id);
      v1::SegmentInfo* si = hr->mutable_segment();
      si->set_segment_label("external_owner:0");
      si->set_generation(seg.generation());
      si->set_total_bytes(seg.total_bytes());
      si->set_data_offset(seg.data_offset());
      si->set_node_id(seg.node_id());
      si->set_path(seg.path());
      SetStatus(&resp, absl::OkStatus());
      // The segment fd rides on the reply frame.
      return SendFrameWithFd(c->fd, EncodeFrame(resp), seg.fd()).ok();
    }
    case v1::ClientRequest::kPutStart: {
      const v1::PutStartRequest& p = req.put_start();
      PutStartArgs a;
      a.keys.assign(p.keys().begin(), p.keys().end());
      a.value_len = static_cast<int64_t>(p.value_len());
      a.reject_if_inflight_same_key = p.reject_if_inflight_same_key();
      a.reject_if_exist_same_key = p.reject_if_exist_same_key();
      a.write_through = p.write_through();
      a.make_replica_task = p.make_replica_task();
      a.make_replica_task_mask.assign(p.make_replica_task_mask().begin(),
                                      p.make_replica_task_mask().end());
      a.atomic_group_lens.assign(p.atomic_group_lens().begin(), p.atomic_group_lens().end());
      a.lease_id = p.lease_id();
      a.parent_key = p.parent_key();
      std::vector<uint32_t> conflicts;
      absl::StatusOr<PutStartOutcome> r = core_->PutStart(*client_id, a, &conflicts);
      v1::PutStartReply* pr = resp.mutable_put_start();
      for (uint32_t i : conflicts) pr->add_conflict_indices(i);
      if (r.ok()) {
        pr->set_put_id(r->put_id);
        for (uint64_t o : r->offsets) pr->add_offsets(o);
      }
      st = r.status();
      break;
    }
    case v1::ClientRequest::kPutCommit: {
      const uint64_t put_id = req.put_commit().put_id();
      const uint64_t client = *client_id;
      st = core_->PutCommit(
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
      SetStatus(&resp, st);
      record();
      const bool written = WriteFrame(c->fd, resp).ok();
      core_->WakePublisher();  // after the answer: the woken actor must not delay it
      return written;
    }
    case v1::ClientRequest::kPutAbort:
      st = core_->PutAbort(*client_id, req.put_abort().put_id());
      break;
    case v1::ClientRequest::kGetStart: {
      const v1::GetStartRequest& g = req.get_start();
      std::vector<std::string> keys(g.keys().begin(), g.keys().end());
      std::vector<uint32_t> groups(g.atomic_group_lens().begin(), g.atomic_group_lens().end());
      absl::StatusOr<GetStartOutcome> r =
          core_->GetStart(*client_id, keys, groups, g.prefix_best_effort());
      st = r.status();
      if (r.ok()) {
        v1::GetStartReply* gr = resp.mutable_get_start();
        gr->set_handle_id(r->handle_id);
        gr->set_raw_prefix_hit_len(r->prefix.raw_prefix_hit_len);
        gr->set_transferable_len(r->prefix.transferable_len);
        gr->set_prefix_hit_groups(r->prefix.prefix_hit_groups);
        gr->set_first_miss_index(r->prefix.first_miss_index ? *r->prefix.first_miss_index : -1);
        gr->set_first_miss_group_index(
            r->prefix.first_miss_group_index ? *r->prefix.first_miss_group_index : -1);
        for (uint64_t o : r->offsets) gr->add_offsets(o);
        for (uint64_t l : r->lens) gr->add_lens(l);
        gr->set_local_pinned(r->local_pinned);
        gr->set_inflight_joined(r->inflight_joined);
        gr->set_leader_started(r->leader_started);
      }
      break;
    }
    case v1::ClientRequest::kGetTransfer:
      st = core_->GetTransfer(*client_id, req.get_transfer().handle_id(),
                              req.get_transfer().consume_prefix_len());
      break;
    case v1::ClientRequest::kCancelGet:
      st = core_->CancelGet(*client_id, req.cancel_get().handle_id());
      break;
    case v1::ClientRequest::kReleaseViews:
      st = core_->ReleaseViews(*client_id, req.release_views().handle_id());
      break;
    case v1::ClientRequest::kDeletePrefix: {
      absl::StatusOr<DeleteOutcome> r = core_->DeletePrefix(req.delete_prefix().prefix());
      if (r.ok()) {
        resp.mutable_delete_prefix()->set_deleted(r->deleted);
        resp.mutable_delete_prefix()->set_skipped_in_use(r->skipped_in_use);
      }
      st = r.status();
      break;
    }
    case v1::ClientRequest::kStats: {
      auto* counters = resp.mutable_stats()->mutable_counters();
      for (const auto& [k, v] : core_->Stats()) (*counters)[k] = v;
      (*counters)["client_sessions"] = static_cast<int64_t>(sessions());
      break;
    }
    case v1::ClientRequest::BODY_NOT_SET:
      st = absl::InvalidArgumentError("empty request");
      break;
  }
  SetStatus(&resp, st);
  record();
  return WriteFrame(c->fd, resp).ok();
}

bool ClientServer::Impl::PeerAllowed(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  if (cred.uid == 0 || cred.uid == geteuid()) return true;
  if (allowed_gid_ != static_cast<gid_t>(-1) && cred.gid == allowed_gid_) return true;
  spdlog::warn("refused a client connection from uid {} gid {} pid {}", cred.uid, cred.gid,
               cred.pid);
  return false;
}

absl::Status ClientServer::Impl::Listen() {
  const std::filesystem::path path(options_.socket_path);
  if (path.string().size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("socket path %s is too long for a Unix socket", path.string()));
  }
  std::error_code fec;
  std::filesystem::create_directories(path.parent_path(), fec);
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
