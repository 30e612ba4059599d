#include "owner/client_server.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "fluxon/v1/client.pb.h"
#include "rpc/frame.h"
#include "spdlog/spdlog.h"

namespace fluxon {
namespace {

namespace asio = boost::asio;
using Socket = asio::local::stream_protocol::socket;
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
  class Connection;

  Impl(OwnerCore* core, ClientServerOptions options)
      : core_(core), options_(std::move(options)), acceptor_(io_) {}

  absl::Status Listen();
  void Run() {
    for (int i = 0; i < options_.io_threads; ++i) threads_.emplace_back([this] { io_.run(); });
  }
  void Stop() {
    if (stopped_.exchange(true)) return;
    asio::post(io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
    });
    {
      MutexLock lock(&mu_);
      for (auto& [id, c] : all_) CloseConnection(c);
    }
    work_.reset();
    for (auto& t : threads_) t.join();
    threads_.clear();
    ::unlink(options_.socket_path.c_str());
  }
  size_t sessions() const {
    MutexLock lock(&mu_);
    return events_.size();
  }

  void Accept();
  bool PeerAllowed(int fd);
  void RegisterEvents(uint64_t client_id, std::shared_ptr<Connection> c) {
    MutexLock lock(&mu_);
    events_[client_id] = std::move(c);
  }
  void SendEvent(uint64_t client_id, v1::OwnerMessage msg);
  void Closed(Connection* c);
  void CloseConnection(const std::shared_ptr<Connection>& c);

  OwnerCore* const core_;
  const ClientServerOptions options_;
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_{io_.get_executor()};
  asio::local::stream_protocol::acceptor acceptor_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopped_{false};
  gid_t allowed_gid_ = static_cast<gid_t>(-1);
  mutable Mutex mu_;
  std::map<uint64_t, std::shared_ptr<Connection>> events_ ABSL_GUARDED_BY(mu_);
  std::map<Connection*, std::shared_ptr<Connection>> all_ ABSL_GUARDED_BY(mu_);
  ClientRequestLatencies latencies_;
};

class ClientServer::Impl::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Impl* server, Socket socket)
      : server_(server), socket_(std::move(socket)), strand_(asio::make_strand(server->io_)) {}

  void Start() { ReadHeader(); }
  void Close() {
    asio::post(strand_, [self = shared_from_this()] {
      boost::system::error_code ec;
      self->socket_.shutdown(asio::socket_base::shutdown_both, ec);
      self->socket_.close(ec);
    });
  }
  // Queues a frame; frames are written in order on the connection's strand.
  void Send(std::string frame) {
    asio::post(strand_, [self = shared_from_this(), frame = std::move(frame)]() mutable {
      if (self->out_.size() >= kMaxQueuedEvents) {
        spdlog::warn("client {} stopped reading its events; closing the session", self->client_id_);
        boost::system::error_code ec;
        self->socket_.close(ec);
        return;
      }
      self->out_.push_back(std::move(frame));
      if (self->out_.size() == 1) self->WriteNext();
    });
  }

 private:
  void ReadHeader() {
    asio::async_read(socket_, asio::buffer(&len_, 4),
                     asio::bind_executor(strand_, [self = shared_from_this()](
                                                      boost::system::error_code ec, size_t) {
                       if (ec) return self->OnClose();
                       if (self->len_ > kMaxFrameBytes) {
                         spdlog::warn("client sent a {}-byte frame; closing", self->len_);
                         return self->OnClose();
                       }
                       self->body_.resize(self->len_);
                       self->ReadBody();
                     }));
  }
  void ReadBody() {
    asio::async_read(socket_, asio::buffer(body_),
                     asio::bind_executor(strand_, [self = shared_from_this()](
                                                      boost::system::error_code ec, size_t) {
                       if (ec) return self->OnClose();
                       self->OnFrame();
                     }));
  }
  void WriteNext() {
    asio::async_write(socket_, asio::buffer(out_.front()),
                      asio::bind_executor(strand_, [self = shared_from_this()](
                                                       boost::system::error_code ec, size_t) {
                        self->out_.pop_front();
                        if (ec) return;
                        if (!self->out_.empty()) self->WriteNext();
                      }));
  }
  void OnClose() {
    if (closed_) return;
    closed_ = true;
    if (is_events_ && client_id_ != 0) server_->core_->DisconnectClient(client_id_);
    server_->Closed(this);
  }
  void OnFrame();
  void Reply(v1::OwnerMessage& msg) {
    out_.push_back(EncodeFrame(msg));
    if (out_.size() == 1) WriteNext();
  }

  Impl* const server_;
  Socket socket_;
  asio::strand<asio::io_context::executor_type> strand_;
  uint32_t len_ = 0;
  std::string body_;
  std::deque<std::string> out_;
  uint64_t client_id_ = 0;
  bool is_events_ = false;
  bool closed_ = false;
};

void ClientServer::Impl::Connection::OnFrame() {
  v1::ClientRequest req;
  v1::OwnerMessage resp;
  if (!req.ParseFromString(body_)) {
    spdlog::warn("malformed request frame; closing connection");
    return OnClose();
  }
  const auto parsed_at = std::chrono::steady_clock::now();
  const std::optional<ClientRequestType> timed = TimedRequestType(req.body_case());
  resp.set_id(req.id());
  OwnerCore* core = server_->core_;
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
        is_events_ = true;
        client_id_ = h.client_id();
        server_->RegisterEvents(client_id_, shared_from_this());
        break;
      }
      client_id_ = core->NewClientId();
      const Segment& seg = core->memory().segment();
      v1::HelloReply* hr = resp.mutable_hello();
      hr->set_client_id(client_id_);
      v1::SegmentInfo* si = hr->mutable_segment();
      si->set_segment_label("external_owner:0");
      si->set_generation(seg.generation());
      si->set_total_bytes(seg.total_bytes());
      si->set_data_offset(seg.data_offset());
      si->set_node_id(seg.node_id());
      si->set_path(seg.path());
      SetStatus(&resp, absl::OkStatus());
      // The segment fd rides on the reply frame.
      absl::Status sent = SendFrameWithFd(socket_.native_handle(), EncodeFrame(resp), seg.fd());
      if (!sent.ok()) return OnClose();
      return ReadHeader();
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
      std::vector<uint32_t> conflicts;
      absl::StatusOr<PutStartOutcome> r = core->PutStart(client_id_, a, &conflicts);
      v1::PutStartReply* pr = resp.mutable_put_start();
      for (uint32_t c : conflicts) pr->add_conflict_indices(c);
      if (r.ok()) {
        pr->set_put_id(r->put_id);
        for (uint64_t o : r->offsets) pr->add_offsets(o);
      }
      st = r.status();
      break;
    }
    case v1::ClientRequest::kPutCommit: {
      const uint64_t put_id = req.put_commit().put_id();
      Impl* server = server_;
      const uint64_t client = client_id_;
      st = core->PutCommit(client_id_, put_id, [server, client, put_id](const absl::Status& s) {
        v1::OwnerMessage ev;
        v1::PutDoneEvent* pd = ev.mutable_put_done();
        pd->set_put_id(put_id);
        pd->set_code(static_cast<int32_t>(s.code()));
        pd->set_message(std::string(s.message()));
        server->SendEvent(client, std::move(ev));
      });
      break;
    }
    case v1::ClientRequest::kPutAbort:
      st = core->PutAbort(client_id_, req.put_abort().put_id());
      break;
    case v1::ClientRequest::kGetStart: {
      const v1::GetStartRequest& g = req.get_start();
      std::vector<std::string> keys(g.keys().begin(), g.keys().end());
      std::vector<uint32_t> groups(g.atomic_group_lens().begin(), g.atomic_group_lens().end());
      absl::StatusOr<GetStartOutcome> r =
          core->GetStart(client_id_, keys, groups, g.prefix_best_effort());
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
      st = core->GetTransfer(client_id_, req.get_transfer().handle_id(),
                             req.get_transfer().consume_prefix_len());
      break;
    case v1::ClientRequest::kCancelGet:
      st = core->CancelGet(client_id_, req.cancel_get().handle_id());
      break;
    case v1::ClientRequest::kReleaseViews:
      st = core->ReleaseViews(client_id_, req.release_views().handle_id());
      break;
    case v1::ClientRequest::kStats: {
      auto* counters = resp.mutable_stats()->mutable_counters();
      for (const auto& [k, v] : core->Stats()) (*counters)[k] = v;
      (*counters)["client_sessions"] = static_cast<int64_t>(server_->sessions());
      break;
    }
    case v1::ClientRequest::BODY_NOT_SET:
      st = absl::InvalidArgumentError("empty request");
      break;
  }
  SetStatus(&resp, st);
  // Recorded before the reply is queued, so a client that has its reply sees it counted.
  if (timed) {
    server_->latencies_[static_cast<int>(*timed)].Record(std::chrono::steady_clock::now() -
                                                         parsed_at);
  }
  Reply(resp);
  ReadHeader();
}

void ClientServer::Impl::SendEvent(uint64_t client_id, v1::OwnerMessage msg) {
  std::shared_ptr<Connection> c;
  {
    MutexLock lock(&mu_);
    auto it = events_.find(client_id);
    if (it == events_.end()) return;  // the session is gone; nobody waits for this future
    c = it->second;
  }
  c->Send(EncodeFrame(msg));
}

void ClientServer::Impl::Closed(Connection* c) {
  std::shared_ptr<Connection> keep;
  MutexLock lock(&mu_);
  for (auto it = events_.begin(); it != events_.end(); ++it) {
    if (it->second.get() == c) {
      events_.erase(it);
      break;
    }
  }
  auto it = all_.find(c);
  if (it != all_.end()) {
    keep = std::move(it->second);
    all_.erase(it);
  }
}

void ClientServer::Impl::CloseConnection(const std::shared_ptr<Connection>& c) { c->Close(); }

bool ClientServer::Impl::PeerAllowed(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  if (cred.uid == 0 || cred.uid == geteuid()) return true;
  if (allowed_gid_ != static_cast<gid_t>(-1)) {
    if (cred.gid == allowed_gid_) return true;
    // Supplementary groups of the peer are not visible here; its primary group must match.
  }
  spdlog::warn("refused a client connection from uid {} gid {} pid {}", cred.uid, cred.gid,
               cred.pid);
  return false;
}

void ClientServer::Impl::Accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, Socket socket) {
    if (ec) {
      if (!stopped_) spdlog::warn("accept failed: {}", ec.message());
      if (ec == asio::error::operation_aborted || stopped_) return;
      return Accept();
    }
    if (PeerAllowed(socket.native_handle())) {
      auto c = std::make_shared<Connection>(this, std::move(socket));
      {
        MutexLock lock(&mu_);
        all_[c.get()] = c;
      }
      c->Start();
    }
    Accept();
  });
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
      return absl::PermissionDeniedError(absl::StrFormat(
          "opening %s to group %s: %s", path.string(), options_.socket_group, std::strerror(errno)));
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
  impl->Accept();
  impl->Run();
  return std::unique_ptr<ClientServer>(new ClientServer(std::move(impl)));
}

ClientServer::ClientServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClientServer::~ClientServer() { Stop(); }
void ClientServer::Stop() { impl_->Stop(); }
size_t ClientServer::sessions() const { return impl_->sessions(); }
const ClientRequestLatencies& ClientServer::latencies() const { return impl_->latencies_; }

}  // namespace fluxon
