#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/batch.h"
#include "common/mutex.h"
#include "common/streaming_copy.h"
#include "fluxon/client.h"
#include "fluxon/plan_blob.h"
#include "fluxon/status.h"
#include "fluxon/v1/client.pb.h"
#include "rpc/client_codec.h"
#include "rpc/frame.h"
#include "slot/segment.h"

namespace fluxon {

struct KvFuture::State {
  mutable Mutex mu;
  mutable CondVar cv;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);

  void Complete(absl::Status s) {
    MutexLock lock(&mu);
    if (done) return;
    done = true;
    status = std::move(s);
    cv.SignalAll();
  }
};

bool KvFuture::done() const {
  MutexLock lock(&state_->mu);
  return state_->done;
}

absl::Status KvFuture::Wait(std::optional<std::chrono::milliseconds> timeout) const {
  MutexLock lock(&state_->mu);
  const auto deadline =
      std::chrono::steady_clock::now() + timeout.value_or(std::chrono::hours(24 * 365));
  while (!state_->done) {
    if (!state_->cv.WaitUntil(&state_->mu, deadline) && !state_->done) {
      return absl::DeadlineExceededError("put is not published yet");
    }
  }
  return state_->status;
}

absl::Status KvFuture::status() const {
  MutexLock lock(&state_->mu);
  return state_->status;
}

namespace {

absl::StatusOr<int> ConnectUnix(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(std::strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    close(fd);
    return absl::InvalidArgumentError("socket path too long: " + path);
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrFormat(
        "cannot reach the Fluxon owner at %s: %s (is fluxond running?)", path, std::strerror(err)));
  }
  return fd;
}

absl::Status StatusOf(const v1::OwnerMessage& m) {
  return absl::Status(static_cast<absl::StatusCode>(m.code()), m.message());
}

// One blocking request/response socket; one request at a time. Every call is bounded by
// `call_timeout`; a connection whose call failed is never reused (a late answer would otherwise
// be read as the next call's).
class Connection {
 public:
  Connection(int fd, int64_t busy_poll_us, std::chrono::milliseconds call_timeout)
      : fd_(fd), busy_poll_us_(busy_poll_us), call_timeout_(call_timeout) {}
  ~Connection() { close(fd_); }
  absl::StatusOr<v1::OwnerMessage> Call(v1::ClientRequest& req, int* received_fd = nullptr) {
    req.set_id(++next_id_);
    if (req.ByteSizeLong() + 4 > kMaxFrameBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "request of %d bytes exceeds the %d-byte frame limit (fewer or shorter keys per batch)",
          req.ByteSizeLong(), kMaxFrameBytes));
    }
    if (absl::Status wrote = WriteFrame(fd_, req); !wrote.ok()) {
      // The owner may have refused the connection (id-0 frame, then close) before our write
      // arrived: its reason is more useful than the broken pipe.
      FrameReadOptions read;
      read.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      v1::OwnerMessage refusal;
      if (ReadFrame(fd_, &refusal, read).ok() && refusal.id() == 0 && refusal.code() != 0) {
        return absl::Status(static_cast<absl::StatusCode>(refusal.code()), refusal.message());
      }
      return wrote;
    }
    const auto deadline = std::chrono::steady_clock::now() + call_timeout_;
    absl::Status st = WaitReadable(fd_, busy_poll_us_, deadline);
    v1::OwnerMessage resp;
    if (st.ok()) {
      FrameReadOptions read;
      read.deadline = deadline;
      read.received_fd = received_fd;
      st = ReadFrame(fd_, &resp, read);
    }
    if (st.code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::DeadlineExceededError(
          absl::StrFormat("the owner did not answer within %d ms (call_timeout); is it stuck?",
                          call_timeout_.count()));
    }
    FLUXON_RETURN_IF_ERROR(st);
    if (resp.id() == 0 && resp.code() != 0) {
      // The owner refused or closed this connection and said why.
      return absl::Status(static_cast<absl::StatusCode>(resp.code()), resp.message());
    }
    if (resp.id() != req.id()) return absl::DataLossError("owner answered another request");
    return resp;
  }
  int fd() const { return fd_; }

 private:
  const int fd_;
  const int64_t busy_poll_us_;
  const std::chrono::milliseconds call_timeout_;
  uint64_t next_id_ = 0;
};

struct PutPlan : PlanPayload {
  uint64_t put_id;
};
struct GetPlan : PlanPayload {
  uint64_t owner_handle;
};

struct HandleState {
  uint64_t owner_handle = 0;
  bool deferred = false;     // the offsets come with the transfer
  bool transferred = false;  // the owner transferred the prefix with get_start
  // Transferred: when the owner releases the views by their lease (a plan issued later would
  // name slots that may hold other values by then).
  std::chrono::steady_clock::time_point views_expire;
  std::vector<uint64_t> offsets;     // checked against the segment (empty when deferred)
  std::vector<uint32_t> group_lens;  // the caller's groups
  uint32_t transferable = 0;
};

}  // namespace

// The client's side of one owner session. The session is bound to the owner that opened it (its
// segment generation) and ends for good when the owner closes it (the events connection ends) or
// a new connection finds another owner or no session: the client is then detached and every
// call fails with Unavailable, so a stale mapping never serves or takes bytes (the caller makes
// a new client, which maps the new segment).
class KvClient::Impl {
 public:
  ClientOptions options;
  uint64_t client_id = 0;
  std::string session_secret;
  uint64_t generation = 0;  // of the segment this client mapped
  std::unique_ptr<Segment> segment;
  std::string segment_label;
  std::unique_ptr<PlanRegistry> plans;

  Mutex pool_mu;
  std::vector<std::unique_ptr<Connection>> idle ABSL_GUARDED_BY(pool_mu);

  std::atomic<bool> detached{false};
  std::atomic<bool> closing{false};
  mutable Mutex detach_mu;
  std::string detach_reason ABSL_GUARDED_BY(detach_mu);

  int events_fd = -1;
  std::thread events_thread;
  Mutex futures_mu;
  absl::flat_hash_map<uint64_t, std::shared_ptr<KvFuture::State>> futures
      ABSL_GUARDED_BY(futures_mu);
  bool events_closed ABSL_GUARDED_BY(futures_mu) = false;

  Mutex handles_mu;
  absl::flat_hash_map<uint64_t, HandleState> handles ABSL_GUARDED_BY(handles_mu);
  std::atomic<uint64_t> next_handle{1};

  // Removes and returns the handle if `check` accepts it (a handle is consumed once: by a
  // transfer or a cancel); NotFound when it is unknown or already consumed, else check's error
  // with the handle kept.
  absl::StatusOr<HandleState> TakeHandle(
      uint64_t id, const std::function<absl::Status(const HandleState&)>& check) {
    MutexLock lock(&handles_mu);
    auto it = handles.find(id);
    if (it == handles.end()) {
      return absl::NotFoundError(
          absl::StrFormat("get handle %d is unknown or was already consumed or cancelled", id));
    }
    FLUXON_RETURN_IF_ERROR(check(it->second));
    HandleState hs = std::move(it->second);
    handles.erase(it);
    return hs;
  }

  ~Impl() {
    closing = true;
    if (events_fd >= 0) shutdown(events_fd, SHUT_RDWR);
    if (events_thread.joinable()) events_thread.join();
    if (events_fd >= 0) close(events_fd);
  }

  // Ends this client's use of the session, once; later calls fail with the reason.
  void Detach(const std::string& reason) {
    {
      MutexLock lock(&detach_mu);
      if (detached.load()) return;
      detach_reason = reason;
      detached = true;
    }
    std::vector<std::unique_ptr<Connection>> dropped;
    {
      MutexLock lock(&pool_mu);
      dropped.swap(idle);
    }
    if (events_fd >= 0) shutdown(events_fd, SHUT_RDWR);  // fails pending futures
  }
  absl::Status CheckAttached() const {
    if (!detached.load(std::memory_order_acquire)) return absl::OkStatus();
    MutexLock lock(&detach_mu);
    return absl::UnavailableError(
        absl::StrCat("this client's session with the owner has ended (", detach_reason,
                     "); its plans and handles are void: create a new client"));
  }

  absl::StatusOr<std::unique_ptr<Connection>> Acquire() {
    FLUXON_RETURN_IF_ERROR(CheckAttached());
    {
      MutexLock lock(&pool_mu);
      if (!idle.empty()) {
        auto c = std::move(idle.back());
        idle.pop_back();
        return c;
      }
    }
    v1::OwnerMessage hello;
    int passed = -1;
    absl::StatusOr<std::unique_ptr<Connection>> c = OpenConnection(true, &hello, &passed);
    if (passed >= 0) close(passed);  // the segment is mapped once, from the first connection
    if (!c.ok()) {
      if (c.status().code() == absl::StatusCode::kPermissionDenied) {
        // The owner does not know this session: it restarted (or ended the session).
        Detach(absl::StrCat("the owner refused to rejoin the session: ", c.status().message()));
        return CheckAttached();
      }
      return c.status();
    }
    const uint64_t gen = hello.hello().segment().generation();
    if (gen != generation) {
      Detach(absl::StrFormat("the owner restarted: segment generation %d, this client mapped %d",
                             gen, generation));
      return CheckAttached();
    }
    return c;
  }
  // Opens a control connection and says Hello: `join` false opens the session, true joins it
  // (its puts and handles then belong to the session, whatever connection carries them).
  absl::StatusOr<std::unique_ptr<Connection>> OpenConnection(bool join, v1::OwnerMessage* hello,
                                                             int* seg_fd) {
    FLUXON_ASSIGN_OR_RETURN(int fd, ConnectUnix(options.socket_path));
    auto c = std::make_unique<Connection>(fd, options.busy_poll_us, options.call_timeout);
    v1::ClientRequest req;
    v1::Hello* h = req.mutable_hello();
    h->set_protocol_version(kProtocolVersion);
    h->set_client_name(options.client_name);
    if (join) {
      h->set_client_id(client_id);
      h->set_session_secret(session_secret);
    }
    FLUXON_ASSIGN_OR_RETURN(*hello, c->Call(req, seg_fd));
    absl::Status st = StatusOf(*hello);
    if (!st.ok()) {
      if (*seg_fd >= 0) close(*seg_fd);
      *seg_fd = -1;
      return st;
    }
    return c;
  }
  void Return(std::unique_ptr<Connection> c) {
    MutexLock lock(&pool_mu);
    if (detached.load()) return;  // closes it
    if (idle.size() < 16) idle.push_back(std::move(c));
  }
  // One request on a pooled connection; a broken connection is dropped, not returned.
  absl::StatusOr<v1::OwnerMessage> Call(v1::ClientRequest& req) {
    FLUXON_ASSIGN_OR_RETURN(std::unique_ptr<Connection> c, Acquire());
    absl::StatusOr<v1::OwnerMessage> resp = c->Call(req);
    if (resp.ok()) Return(std::move(c));
    return resp;
  }

  // The value addresses of an answer's offsets, each checked to lie inside the mapped segment
  // with its length (Segment::Resolve): a buggy or stale owner's offsets never become
  // pointers outside the mapping. `len(i)` is value i's length.
  template <typename Offsets, typename Len>
  absl::StatusOr<std::vector<uint64_t>> ValuePointers(const Offsets& offsets, Len len) const {
    std::vector<uint64_t> ptrs;
    ptrs.reserve(offsets.size());
    for (int i = 0; i < offsets.size(); ++i) {
      absl::StatusOr<uint8_t*> p = segment->Resolve(offsets[i], len(i));
      if (!p.ok()) {
        return absl::DataLossError(absl::StrCat("the owner answered value ", i,
                                                " outside the segment: ", p.status().message()));
      }
      ptrs.push_back(reinterpret_cast<uint64_t>(*p));
    }
    return ptrs;
  }

  // A request whose answer carries nothing but its status.
  absl::Status CallForStatus(v1::ClientRequest& req) {
    FLUXON_ASSIGN_OR_RETURN(v1::OwnerMessage resp, Call(req));
    return StatusOf(resp);
  }

  void EventsLoop() {
    for (;;) {
      v1::OwnerMessage m;
      if (!ReadFrame(events_fd, &m).ok()) break;
      if (!m.has_put_done()) continue;
      std::shared_ptr<KvFuture::State> st;
      {
        MutexLock lock(&futures_mu);
        auto it = futures.find(m.put_done().put_id());
        if (it == futures.end()) continue;
        st = std::move(it->second);
        futures.erase(it);
      }
      st->Complete(
          absl::Status(static_cast<absl::StatusCode>(m.put_done().code()), m.put_done().message()));
    }
    if (!closing.load()) {
      Detach("the owner closed the session (it stopped or restarted)");
    }
    absl::flat_hash_map<uint64_t, std::shared_ptr<KvFuture::State>> orphaned;
    {
      MutexLock lock(&futures_mu);
      events_closed = true;
      orphaned.swap(futures);
    }
    for (auto& [id, st] : orphaned) {
      st->Complete(absl::UnavailableError("connection to the owner was lost before publish"));
    }
  }
};

absl::StatusOr<std::unique_ptr<KvClient>> KvClient::Connect(const ClientOptions& options) {
  if (options.call_timeout.count() <= 0) {
    return absl::InvalidArgumentError("call_timeout must be > 0");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  FLUXON_ASSIGN_OR_RETURN(impl->plans, PlanRegistry::Create({options.plan_arena_bytes}));
  // The first control connection's Hello opens the session and carries the segment fd.
  v1::OwnerMessage resp;
  int seg_fd = -1;
  FLUXON_ASSIGN_OR_RETURN(auto conn, impl->OpenConnection(false, &resp, &seg_fd));
  if (seg_fd < 0) return absl::DataLossError("owner did not pass its segment descriptor");
  if (resp.hello().client_id() == 0 || resp.hello().session_secret().empty()) {
    close(seg_fd);
    return absl::DataLossError("owner did not open a session (no id or secret)");
  }
  const v1::SegmentInfo& si = resp.hello().segment();
  SegmentDescriptor desc{si.generation(), si.total_bytes(), si.data_offset(), si.node_id()};
  absl::StatusOr<std::unique_ptr<Segment>> seg = Segment::AttachFd(seg_fd, desc);
  close(seg_fd);
  if (!seg.ok()) return seg.status();
  impl->segment = std::move(*seg);
  impl->segment_label = si.segment_label();
  impl->generation = si.generation();
  impl->client_id = resp.hello().client_id();
  impl->session_secret = resp.hello().session_secret();
  impl->Return(std::move(conn));

  FLUXON_ASSIGN_OR_RETURN(impl->events_fd, ConnectUnix(options.socket_path));
  v1::ClientRequest ev;
  v1::Hello* eh = ev.mutable_hello();
  eh->set_protocol_version(kProtocolVersion);
  eh->set_client_name(options.client_name);
  eh->set_events(true);
  eh->set_client_id(impl->client_id);
  eh->set_session_secret(impl->session_secret);
  ev.set_id(1);
  FLUXON_RETURN_IF_ERROR(WriteFrame(impl->events_fd, ev));
  v1::OwnerMessage ack;
  FrameReadOptions read;
  read.deadline = std::chrono::steady_clock::now() + options.call_timeout;
  FLUXON_RETURN_IF_ERROR(ReadFrame(impl->events_fd, &ack, read));
  FLUXON_RETURN_IF_ERROR(StatusOf(ack));
  Impl* raw = impl.get();
  impl->events_thread = std::thread([raw] { raw->EventsLoop(); });
  return std::unique_ptr<KvClient>(new KvClient(std::move(impl)));
}

KvClient::KvClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvClient::~KvClient() = default;

std::vector<SegmentMapping> KvClient::WaitLocalSegmentsReady() const {
  const Segment& s = *impl_->segment;
  SegmentMapping m;
  m.segment_label = impl_->segment_label;
  m.write_ptr = reinterpret_cast<uint64_t>(s.base());
  m.read_ptr = m.write_ptr;
  m.len = s.total_bytes();
  m.generation = s.generation();
  m.node_id = s.node_id();
  return {m};
}

absl::StatusOr<PlanView> KvClient::PeekPlan(uint64_t plan_ptr,
                                            std::optional<PlanKind> expected) const {
  FLUXON_RETURN_IF_ERROR(impl_->CheckAttached());
  return impl_->plans->Peek(plan_ptr, expected);
}

absl::Status KvClient::PrefaultSegment() { return impl_->segment->PopulateMapping(); }

std::pair<uint64_t, uint64_t> KvClient::PlanArena() const {
  return {reinterpret_cast<uint64_t>(impl_->plans->arena_base()), impl_->plans->arena_bytes()};
}

absl::StatusOr<uint64_t> KvClient::LocalFastPutStart(const std::vector<std::string>& keys,
                                                     int64_t value_len, const PutOptions& o,
                                                     std::vector<uint32_t>* conflict_indices) {
  FLUXON_RETURN_IF_ERROR(ValidatePutStart(keys, value_len, o));
  v1::ClientRequest req;
  EncodePutStart(keys, value_len, o, req.mutable_put_start());
  FLUXON_ASSIGN_OR_RETURN(v1::OwnerMessage resp, impl_->Call(req));
  absl::Status st = StatusOf(resp);
  if (!st.ok()) {
    if (conflict_indices != nullptr) {
      conflict_indices->assign(resp.put_start().conflict_indices().begin(),
                               resp.put_start().conflict_indices().end());
    }
    return st;
  }
  const v1::PutStartReply& r = resp.put_start();
  absl::StatusOr<std::vector<uint64_t>> ptrs =
      static_cast<size_t>(r.offsets_size()) == keys.size()
          ? impl_->ValuePointers(r.offsets(), [&](int) { return static_cast<uint64_t>(value_len); })
          : absl::DataLossError(absl::StrFormat("the owner answered %d offsets for %d keys",
                                                r.offsets_size(), keys.size()));
  absl::StatusOr<uint64_t> plan = absl::UnknownError("no plan");
  if (ptrs.ok()) {
    auto payload = std::make_unique<PutPlan>();
    payload->put_id = r.put_id();
    plan = impl_->plans->Issue(PlanKind::kPut, *ptrs, std::move(payload));
  } else {
    plan = ptrs.status();
  }
  if (!plan.ok()) {
    v1::ClientRequest abort;
    abort.mutable_put_abort()->set_put_id(r.put_id());
    (void)impl_->Call(abort);
  }
  return plan;
}

absl::StatusOr<KvFuture> KvClient::LocalFastPutCommit(uint64_t plan_ptr) {
  FLUXON_ASSIGN_OR_RETURN(std::unique_ptr<PlanPayload> payload,
                          impl_->plans->Consume(plan_ptr, PlanKind::kPut));
  const uint64_t put_id = static_cast<PutPlan*>(payload.get())->put_id;
  auto state = std::make_shared<KvFuture::State>();
  {
    MutexLock lock(&impl_->futures_mu);
    if (impl_->events_closed) return absl::UnavailableError("connection to the owner was lost");
    impl_->futures[put_id] = state;  // before the commit: the event may beat the response
  }
  v1::ClientRequest req;
  req.mutable_put_commit()->set_put_id(put_id);
  absl::StatusOr<v1::OwnerMessage> resp = impl_->Call(req);
  absl::Status st = resp.ok() ? StatusOf(*resp) : resp.status();
  if (!st.ok()) {
    MutexLock lock(&impl_->futures_mu);
    impl_->futures.erase(put_id);
    return st;
  }
  return KvFuture(state);
}

absl::Status KvClient::PutAbort(uint64_t plan_ptr) {
  FLUXON_ASSIGN_OR_RETURN(std::unique_ptr<PlanPayload> payload,
                          impl_->plans->Consume(plan_ptr, PlanKind::kPut));
  v1::ClientRequest req;
  req.mutable_put_abort()->set_put_id(static_cast<PutPlan*>(payload.get())->put_id);
  return impl_->CallForStatus(req);
}

absl::StatusOr<GetStartHandle> KvClient::GetStart(const std::vector<std::string>& keys,
                                                  bool prefix_best_effort,
                                                  const std::vector<uint32_t>& groups,
                                                  bool allow_deferred) {
  GetStartOptions options;
  options.prefix_best_effort = prefix_best_effort;
  options.atomic_group_lens = groups;
  options.allow_deferred = allow_deferred;
  return GetStart(keys, options);
}

absl::StatusOr<GetStartHandle> KvClient::GetStart(const std::vector<std::string>& keys,
                                                  const GetStartOptions& options) {
  const std::vector<uint32_t>& groups = options.atomic_group_lens;
  const bool allow_deferred = options.allow_deferred;
  FLUXON_RETURN_IF_ERROR(ValidateKeys(keys));
  FLUXON_RETURN_IF_ERROR(ValidateGroups(groups, keys.size()));
  v1::ClientRequest req;
  EncodeGetStart(keys, options.prefix_best_effort, groups, allow_deferred, req.mutable_get_start());
  req.mutable_get_start()->set_transfer(options.transfer);
  const auto sent = std::chrono::steady_clock::now();
  FLUXON_ASSIGN_OR_RETURN(v1::OwnerMessage resp, impl_->Call(req));
  FLUXON_RETURN_IF_ERROR(StatusOf(resp));
  const v1::GetStartReply& r = resp.get_start();
  // The transferable prefix must be described whole and inside the segment before it is kept.
  const uint32_t t = r.transferable_len();
  // A deferred answer describes its values with the transfer.
  const uint32_t described = r.deferred() ? 0 : t;
  absl::Status shape = absl::OkStatus();
  if (r.deferred() && !allow_deferred) {
    shape = absl::DataLossError("the owner deferred a get_start that did not allow it");
  } else if (r.transferred() && (!options.transfer || r.deferred() || r.handle_id() == 0)) {
    shape = absl::DataLossError("the owner transferred a get_start that did not ask for it");
  } else if (r.transferred() && r.view_lease_ms() == 0) {
    shape = absl::DataLossError("the owner transferred a get_start without the views' lease");
  } else if (t > keys.size() || static_cast<uint32_t>(r.offsets_size()) != described ||
             static_cast<uint32_t>(r.lens_size()) != described) {
    shape = absl::DataLossError(absl::StrFormat(
        "the owner answered transferable_len %d with %d offsets and %d lens for %d keys", t,
        r.offsets_size(), r.lens_size(), keys.size()));
  } else {
    shape = impl_->ValuePointers(r.offsets(), [&](int i) { return r.lens(i); }).status();
  }
  if (!shape.ok()) {
    if (r.handle_id() != 0) {
      // A transferred handle holds views: release_views ends it, cancel_get would not.
      v1::ClientRequest end;
      if (r.transferred()) {
        end.mutable_release_views()->set_handle_id(r.handle_id());
      } else {
        end.mutable_cancel_get()->set_handle_id(r.handle_id());
      }
      (void)impl_->Call(end);
    }
    return shape;
  }
  GetStartHandle h;
  h.id = impl_->next_handle.fetch_add(1);
  h.result = DecodeGetStartResult(r, keys.size());
  HandleState hs;
  hs.owner_handle = r.handle_id();
  hs.deferred = r.deferred();
  hs.transferred = r.transferred();
  // Measured from before the request left, so never later than the owner's own deadline; a
  // lease past a day is taken as a day (the sum stays far from overflow, and ending the local
  // transfers earlier is always safe).
  constexpr uint64_t kMaxLeaseMs = 24ull * 3600 * 1000;
  hs.views_expire =
      sent + std::chrono::milliseconds(std::min<uint64_t>(r.view_lease_ms(), kMaxLeaseMs));
  hs.offsets.assign(r.offsets().begin(), r.offsets().end());
  hs.group_lens = groups;
  hs.transferable = r.transferable_len();
  MutexLock lock(&impl_->handles_mu);
  impl_->handles.emplace(h.id, std::move(hs));
  return h;
}

absl::StatusOr<uint64_t> KvClient::GetTransfer(const GetStartHandle& handle,
                                               std::optional<uint32_t> consume_prefix_len) {
  FLUXON_ASSIGN_OR_RETURN(
      HandleState hs, impl_->TakeHandle(handle.id, [&](const HandleState& h) -> absl::Status {
        const uint32_t t = h.transferable;
        if (consume_prefix_len.has_value()) {
          const uint32_t c = *consume_prefix_len;
          if (c == 0 || c > t) {
            return absl::InvalidArgumentError(absl::StrFormat(
                "consume_prefix_len must be in [1, transferable_len=%d], got %d", t, c));
          }
          if (!IsGroupBoundary(c, h.group_lens)) {
            return absl::InvalidArgumentError(
                absl::StrFormat("consume_prefix_len %d is not on an atomic group boundary", c));
          }
        }
        if (t == 0) {
          return absl::FailedPreconditionError(
              "nothing to transfer (transferable_len is 0): call cancel_get_transfer");
        }
        return absl::OkStatus();
      }));
  const uint32_t consume = consume_prefix_len.value_or(hs.transferable);
  v1::OwnerMessage resp;
  if (hs.transferred && std::chrono::steady_clock::now() >= hs.views_expire) {
    v1::ClientRequest rel;  // the owner has released them, or is about to
    rel.mutable_release_views()->set_handle_id(hs.owner_handle);
    (void)impl_->Call(rel);
    return absl::DeadlineExceededError(
        "the views get_start(transfer=True) opened have passed their lease (view_lease_ms); "
        "call get_start again");
  }
  if (!hs.transferred) {
    v1::ClientRequest req;
    req.mutable_get_transfer()->set_handle_id(hs.owner_handle);
    req.mutable_get_transfer()->set_consume_prefix_len(consume);
    FLUXON_ASSIGN_OR_RETURN(resp, impl_->Call(req));
    FLUXON_RETURN_IF_ERROR(StatusOf(resp));
  }
  // A transferred handle (never deferred) was transferred whole by get_start: the plan covers
  // the consumed prefix, and release_views ends the views of all of it.
  std::vector<uint64_t> ptrs(consume);
  if (hs.deferred) {
    // The consumed values' places, checked against the segment like a get_start's.
    const v1::GetTransferReply& r = resp.get_transfer();
    absl::StatusOr<std::vector<uint64_t>> located =
        static_cast<uint32_t>(r.offsets_size()) == consume &&
                static_cast<uint32_t>(r.lens_size()) == consume
            ? impl_->ValuePointers(r.offsets(), [&](int i) { return r.lens(i); })
            : absl::DataLossError(absl::StrFormat(
                  "the owner answered %d offsets and %d lens for %d consumed values",
                  r.offsets_size(), r.lens_size(), consume));
    if (!located.ok()) {
      v1::ClientRequest rel;
      rel.mutable_release_views()->set_handle_id(hs.owner_handle);
      (void)impl_->Call(rel);
      return located.status();
    }
    ptrs = std::move(*located);
  } else {
    // The offsets were checked against the segment in GetStart.
    const uint64_t base = reinterpret_cast<uint64_t>(impl_->segment->base());
    for (uint32_t i = 0; i < consume; ++i) ptrs[i] = base + hs.offsets[i];
  }
  auto payload = std::make_unique<GetPlan>();
  payload->owner_handle = hs.owner_handle;
  absl::StatusOr<uint64_t> plan = impl_->plans->Issue(PlanKind::kGet, ptrs, std::move(payload));
  if (!plan.ok()) {
    v1::ClientRequest rel;
    rel.mutable_release_views()->set_handle_id(hs.owner_handle);
    (void)impl_->Call(rel);
  }
  return plan;
}

absl::Status KvClient::CancelGetTransfer(const GetStartHandle& handle) {
  FLUXON_ASSIGN_OR_RETURN(HandleState hs, impl_->TakeHandle(handle.id, [](const HandleState&) {
    return absl::OkStatus();
  }));
  if (hs.owner_handle == 0) return absl::OkStatus();  // nothing was pinned
  v1::ClientRequest req;
  if (hs.transferred) {
    req.mutable_release_views()->set_handle_id(hs.owner_handle);  // the views get_start opened
  } else {
    req.mutable_cancel_get()->set_handle_id(hs.owner_handle);
  }
  return impl_->CallForStatus(req);
}

absl::Status KvClient::ReleaseViews(uint64_t plan_ptr) {
  FLUXON_ASSIGN_OR_RETURN(std::unique_ptr<PlanPayload> payload,
                          impl_->plans->Consume(plan_ptr, PlanKind::kGet));
  v1::ClientRequest req;
  req.mutable_release_views()->set_handle_id(static_cast<GetPlan*>(payload.get())->owner_handle);
  return impl_->CallForStatus(req);
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> KvClient::DeletePrefix(const std::string& prefix) {
  FLUXON_RETURN_IF_ERROR(ValidateDeletePrefix(prefix));
  v1::ClientRequest req;
  req.mutable_delete_prefix()->set_prefix(prefix);
  FLUXON_ASSIGN_OR_RETURN(v1::OwnerMessage resp, impl_->Call(req));
  FLUXON_RETURN_IF_ERROR(StatusOf(resp));
  return std::make_pair(resp.delete_prefix().deleted(), resp.delete_prefix().skipped_in_use());
}

absl::StatusOr<std::map<std::string, int64_t>> KvClient::Stats() {
  v1::ClientRequest req;
  req.mutable_stats();
  FLUXON_ASSIGN_OR_RETURN(v1::OwnerMessage resp, impl_->Call(req));
  FLUXON_RETURN_IF_ERROR(StatusOf(resp));
  std::map<std::string, int64_t> out(resp.stats().counters().begin(),
                                     resp.stats().counters().end());
  out["client_active_plans"] = static_cast<int64_t>(impl_->plans->live_plans());
  {
    MutexLock lock(&impl_->handles_mu);
    out["client_handles"] = static_cast<int64_t>(impl_->handles.size());
  }
  {
    MutexLock lock(&impl_->futures_mu);
    out["client_pending_futures"] = static_cast<int64_t>(impl_->futures.size());
  }
  return out;
}

namespace {
// Runs work(begin, end) over [0, count) split into at most `threads` contiguous ranges, one
// thread each (the caller's thread alone when one range suffices).
template <typename Work>
void ParallelRanges(uint64_t count, int threads, const Work& work) {
  const uint64_t n = std::max<uint64_t>(1, std::min<uint64_t>(std::max(threads, 1), count));
  if (n == 1) {
    work(0, count);
    return;
  }
  std::vector<std::thread> pool;
  const uint64_t per = (count + n - 1) / n;
  for (uint64_t t = 0; t < n; ++t) {
    const uint64_t b = t * per, e = std::min(count, b + per);
    if (b < e) pool.emplace_back(work, b, e);
  }
  for (auto& th : pool) th.join();
}
}  // namespace

absl::Status CopyPlanValues(uint64_t plan_ptr, uint8_t* host, uint64_t value_len,
                            CopyDirection direction, int threads) {
  if (plan_ptr == 0 || host == nullptr) return absl::InvalidArgumentError("null plan or buffer");
  const auto* header = reinterpret_cast<const PlanBlobHeader*>(plan_ptr);
  if (header->magic != kPlanBlobMagic) {
    return absl::InvalidArgumentError("not a live Fluxon plan (bad magic)");
  }
  const uint64_t count = header->count;
  const uint64_t* ptrs = PlanValuePtrs(reinterpret_cast<const void*>(plan_ptr));
  auto work = [&](uint64_t begin, uint64_t end) {
    for (uint64_t i = begin; i < end; ++i) {
      auto* value = reinterpret_cast<uint8_t*>(ptrs[i]);
      uint8_t* h = host + i * value_len;
      if (direction == CopyDirection::kToValues) {
        StreamingCopy(value, h, value_len);
      } else {
        StreamingCopy(h, value, value_len);
      }
    }
  };
  ParallelRanges(count, threads, work);
  return absl::OkStatus();
}

absl::Status CopyPlanSegments(uint64_t plan_ptr, uint64_t value_count, uint64_t value_len,
                              const std::vector<uint64_t>& seg_ptrs,
                              const std::vector<uint64_t>& seg_sizes, uint64_t segs_per_value,
                              CopyDirection direction, int threads) {
  if (plan_ptr == 0) return absl::InvalidArgumentError("null plan");
  const auto* header = reinterpret_cast<const PlanBlobHeader*>(plan_ptr);
  if (header->magic != kPlanBlobMagic) {
    return absl::InvalidArgumentError("not a live Fluxon plan (bad magic)");
  }
  if (value_count > header->count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "value_count ", value_count, " exceeds the plan's ", header->count, " values"));
  }
  if (segs_per_value == 0) return absl::InvalidArgumentError("segs_per_value must be > 0");
  if (seg_ptrs.size() != seg_sizes.size() || seg_ptrs.size() != value_count * segs_per_value) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", value_count * segs_per_value,
                                                   " segments, got ", seg_ptrs.size(),
                                                   " pointers and ", seg_sizes.size(), " sizes"));
  }
  for (uint64_t i = 0; i < value_count; ++i) {
    uint64_t total = 0;
    for (uint64_t j = 0; j < segs_per_value; ++j) {
      const uint64_t k = i * segs_per_value + j;
      if (seg_ptrs[k] == 0 && seg_sizes[k] != 0) {
        return absl::InvalidArgumentError(absl::StrCat("segment ", k, " is a null pointer"));
      }
      total += seg_sizes[k];
    }
    if (total != value_len) {
      return absl::InvalidArgumentError(absl::StrCat("value ", i, ": segments add up to ", total,
                                                     " bytes, the value is ", value_len));
    }
  }
  const uint64_t* ptrs = PlanValuePtrs(reinterpret_cast<const void*>(plan_ptr));
  auto work = [&](uint64_t begin, uint64_t end) {
    for (uint64_t i = begin; i < end; ++i) {
      auto* value = reinterpret_cast<uint8_t*>(ptrs[i]);
      for (uint64_t j = 0; j < segs_per_value; ++j) {
        const uint64_t k = i * segs_per_value + j;
        auto* seg = reinterpret_cast<uint8_t*>(seg_ptrs[k]);
        if (direction == CopyDirection::kToValues) {
          StreamingCopy(value, seg, seg_sizes[k]);
        } else {
          StreamingCopy(seg, value, seg_sizes[k]);
        }
        value += seg_sizes[k];
      }
    }
  };
  ParallelRanges(value_count, threads, work);
  return absl::OkStatus();
}

}  // namespace fluxon
