#include "transport/verbs/verbs_transport.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "transport/peer_window.h"

namespace fluxon::transport::verbs {

namespace {
constexpr uint32_t kMaxAttempts = 3;
constexpr uint32_t kQpAccess = kLocalWrite | kRemoteRead | kRemoteWrite;
}  // namespace

// ----- InProcessVerbsExchange -------------------------------------------------------------------

void InProcessVerbsExchange::Publish(const std::string& name, VerbsAcceptor* acceptor) {
  MutexLock lock(&mu_);
  acceptors_[name] = acceptor;
}
void InProcessVerbsExchange::Withdraw(const std::string& name, VerbsAcceptor* acceptor) {
  MutexLock lock(&mu_);
  auto it = acceptors_.find(name);
  if (it != acceptors_.end() && it->second == acceptor) acceptors_.erase(it);
}
absl::StatusOr<std::pair<QpAddress, RegionInfo>> InProcessVerbsExchange::Connect(
    const std::string& peer, const QpAddress& initiator) {
  MutexLock lock(&mu_);
  auto it = acceptors_.find(peer);
  if (it == acceptors_.end())
    return absl::UnavailableError(absl::StrCat("peer ", peer, " not published"));
  return it->second->AcceptQp(initiator);
}
void InProcessVerbsExchange::Disconnect(const std::string& peer, uint32_t remote_qp_num,
                                        uint32_t local_qp_num) {
  MutexLock lock(&mu_);
  auto it = acceptors_.find(peer);
  if (it != acceptors_.end()) it->second->ReleaseQp(remote_qp_num, local_qp_num);
}

// ----- Peer -------------------------------------------------------------------------------------

struct VBatch {
  std::shared_ptr<BatchState> state;
};

struct VWr {
  std::shared_ptr<VBatch> batch;
  uint32_t descriptor = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint8_t* local = nullptr;
  uint32_t len = 0;
  uint32_t attempts = 0;
};

struct PostedWr {
  VWr wr;
  uint64_t wr_id = 0;
};

struct QpSlot {
  Handle qp = 0;
  uint32_t qp_num = 0;
  uint32_t remote_qp_num = 0;
  bool broken = false;      // in the error state (or about to be): drained, then destroyed
  bool deliberate = false;  // broken by an abort: flushed WRs of other batches are requeued
  std::deque<PostedWr> posted;
};

class VerbsTransport::Peer {
 public:
  Peer(std::string address, VerbsTransport* t, Handle cq)
      : address_(std::move(address)), t_(t), cq_(cq) {
    slots_.resize(t->options_.qps_per_peer);
  }

  // Creates the missing QPs (first use, after a teardown); checks the peer's generation when
  // `expected_generation` is non-zero. Returns the peer's region info.
  absl::StatusOr<RegionInfo> EnsureConnected(uint64_t expected_generation) {
    MutexLock connect_lock(&connect_mu_);
    std::vector<int> missing;
    {
      MutexLock lock(&mu_);
      for (size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i].qp == 0) missing.push_back(static_cast<int>(i));
      }
    }
    for (int i : missing) {
      VerbsApi& api = *t_->api_;
      absl::StatusOr<Handle> qp =
          api.CreateRcQp(t_->pd_, cq_, t_->options_.max_outstanding_wr_per_qp);
      if (!qp.ok()) return qp.status();
      auto cleanup = [&](absl::Status s) {
        (void)api.ModifyQpToError(*qp);
        (void)api.DestroyQp(*qp);
        return s;
      };
      absl::Status s = api.ModifyQpToInit(*qp, kQpAccess);
      if (!s.ok()) return cleanup(s);
      absl::StatusOr<QpAddress> mine = api.LocalAddress(*qp);
      if (!mine.ok()) return cleanup(mine.status());
      auto remote = t_->exchange_->Connect(address_, *mine);
      if (!remote.ok()) return cleanup(remote.status());
      s = api.ModifyQpToRtr(*qp, remote->first);
      if (s.ok()) s = api.ModifyQpToRts(*qp, mine->psn);
      if (!s.ok()) {
        t_->exchange_->Disconnect(address_, remote->first.qp_num, mine->qp_num);
        return cleanup(s);
      }
      MutexLock lock(&mu_);
      QpSlot& slot = slots_[i];
      slot = QpSlot{};
      slot.qp = *qp;
      slot.qp_num = mine->qp_num;
      slot.remote_qp_num = remote->first.qp_num;
      info_ = remote->second;
    }
    MutexLock lock(&mu_);
    if (info_.generation == 0) return absl::UnavailableError("not connected");
    if (expected_generation != 0 && info_.generation != expected_generation) {
      return absl::FailedPreconditionError(
          absl::StrCat("stale generation: the request carries generation ", expected_generation,
                       ", peer ", address_, " serves generation ", info_.generation));
    }
    return info_;
  }

  void Enqueue(std::vector<VWr> wrs) {
    std::vector<std::shared_ptr<VBatch>> finish;
    {
      MutexLock lock(&mu_);
      for (VWr& w : wrs) {
        window_.Queue(w.len);
        queue_.push_back(std::move(w));
      }
      PumpLocked(finish);
    }
    for (auto& b : finish) b->state->FinishUnit();
  }

  void AbortBatch(const VBatch* b) {
    std::vector<std::shared_ptr<VBatch>> finish;
    {
      MutexLock lock(&mu_);
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->batch.get() == b) {
          window_.Dequeue(it->len);
          finish.push_back(it->batch);
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      for (QpSlot& slot : slots_) {
        if (slot.qp == 0 || slot.broken) continue;
        const bool carries = std::any_of(slot.posted.begin(), slot.posted.end(),
                                         [b](const PostedWr& p) { return p.wr.batch.get() == b; });
        if (carries) BreakLocked(slot, /*deliberate=*/true);  // the device flushes its WRs
      }
    }
    for (auto& f : finish) f->state->FinishUnit();
  }

  // Polls this peer's CQ once; returns how many completions it handled.
  int Poll() {
    WorkCompletion wc[64];
    absl::StatusOr<int> n = t_->api_->PollCq(cq_, wc);
    if (!n.ok()) {
      if (n.status().code() == absl::StatusCode::kDataLoss) {
        spdlog::critical("verbs transport: {}", n.status().ToString());
        std::abort();  // lost completions: buffers can no longer be accounted for
      }
      return 0;  // our device is gone (an emulated crash of this node)
    }
    std::vector<std::shared_ptr<VBatch>> finish;
    std::vector<std::pair<std::shared_ptr<VBatch>, absl::Status>> aborts;
    std::vector<std::pair<uint32_t, uint32_t>> disconnect;  // (remote, local) queue pairs
    bool peer_dead = false;
    bool need_reconnect = false;
    {
      MutexLock lock(&mu_);
      for (int i = 0; i < *n; ++i) HandleLocked(wc[i], finish, aborts, peer_dead);
      for (QpSlot& slot : slots_) {
        if (slot.qp != 0 && slot.broken && slot.posted.empty()) {  // drained: tear it down
          (void)t_->api_->DestroyQp(slot.qp);
          disconnect.emplace_back(slot.remote_qp_num, slot.qp_num);
          slot = QpSlot{};
        }
      }
      if (peer_dead) {
        for (const VWr& w : queue_) aborts.emplace_back(w.batch, DeadStatus());
        for (QpSlot& slot : slots_) {
          for (const PostedWr& p : slot.posted) aborts.emplace_back(p.wr.batch, DeadStatus());
          if (slot.qp != 0 && !slot.broken) BreakLocked(slot, /*deliberate=*/false);
        }
        info_ = RegionInfo{};
      }
      PumpLocked(finish);
      const bool usable = std::any_of(slots_.begin(), slots_.end(),
                                      [](const QpSlot& s) { return s.qp != 0 && !s.broken; });
      need_reconnect = !usable && !queue_.empty() && !peer_dead;
    }
    // Aborts first: a batch's last unit must not complete it before its abort status is set.
    for (auto& [b, s] : aborts) b->state->Abort(s);
    for (auto& f : finish) f->state->FinishUnit();
    for (auto [remote, local] : disconnect) t_->exchange_->Disconnect(address_, remote, local);
    if (need_reconnect) {
      absl::StatusOr<RegionInfo> s = EnsureConnected(0);
      if (!s.ok()) {
        FailQueued(
            absl::UnavailableError(absl::StrCat("peer ", address_, ": ", s.status().message())));
      } else {
        Enqueue({});
      }
    }
    return *n;
  }

  void Close() {
    std::vector<std::pair<uint32_t, uint32_t>> disconnect;  // (remote, local) queue pairs
    {
      MutexLock lock(&mu_);
      for (QpSlot& slot : slots_) {
        if (slot.qp == 0) continue;
        (void)t_->api_->ModifyQpToError(slot.qp);
        (void)t_->api_->DestroyQp(slot.qp);
        disconnect.emplace_back(slot.remote_qp_num, slot.qp_num);
        slot = QpSlot{};
      }
    }
    for (auto [remote, local] : disconnect) t_->exchange_->Disconnect(address_, remote, local);
    (void)t_->api_->DestroyCq(cq_);
  }

  PeerWindow window() const {
    MutexLock lock(&mu_);
    return window_;
  }
  uint64_t live_qps() const {
    MutexLock lock(&mu_);
    return std::count_if(slots_.begin(), slots_.end(), [](const QpSlot& s) { return s.qp != 0; });
  }

 private:
  absl::Status DeadStatus() const {
    return absl::UnavailableError(
        absl::StrCat("peer ", address_, " does not respond (retry exceeded)"));
  }

  void FailQueued(const absl::Status& why) {
    std::vector<std::shared_ptr<VBatch>> batches;
    {
      MutexLock lock(&mu_);
      for (const VWr& w : queue_) batches.push_back(w.batch);
    }
    for (auto& b : batches) b->state->Abort(why);
  }

  void BreakLocked(QpSlot& slot, bool deliberate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    slot.broken = true;
    slot.deliberate = deliberate;
    (void)t_->api_->ModifyQpToError(slot.qp);
  }

  // Posts queued WRs: lists per QP within its outstanding bound and the peer's byte budget.
  void PumpLocked(std::vector<std::shared_ptr<VBatch>>& finish) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto& o = t_->options_;
    for (QpSlot& slot : slots_) {
      if (slot.qp == 0 || slot.broken) continue;
      while (!queue_.empty() && slot.posted.size() < o.max_outstanding_wr_per_qp) {
        list_.clear();
        const size_t first = slot.posted.size();
        while (!queue_.empty() && slot.posted.size() < o.max_outstanding_wr_per_qp) {
          VWr& w = queue_.front();
          if (!window_.Admits(w.len, o.max_inflight_bytes_per_peer)) break;
          VWr wr = std::move(w);
          queue_.pop_front();
          window_.Dequeue(wr.len);
          if (wr.batch->state->aborted()) {
            finish.push_back(wr.batch);
            continue;
          }
          SendWr s;
          s.wr_id = next_wr_id_++;
          s.opcode =
              wr.batch->state->op() == OpKind::kRead ? WrOpcode::kRdmaRead : WrOpcode::kRdmaWrite;
          s.local_addr = reinterpret_cast<uint64_t>(wr.local);
          s.length = wr.len;
          s.lkey = lkey_.load();
          s.remote_addr = wr.remote_addr;
          s.rkey = wr.rkey;
          s.signaled = (list_.size() + 1) % o.signal_every == 0;
          list_.push_back(s);
          window_.Launch(wr.len);
          slot.posted.push_back(PostedWr{std::move(wr), s.wr_id});
        }
        if (list_.empty()) return;     // budget exhausted
        list_.back().signaled = true;  // every list ends signaled: no WR is left unretired
        absl::Status s = t_->api_->PostSend(slot.qp, list_);
        if (!s.ok()) {
          spdlog::error("verbs transport: post_send to {}: {}", address_, s.ToString());
          // Nothing of this list was posted: back to the queue, the QP is torn down.
          while (slot.posted.size() > first) {
            VWr wr = std::move(slot.posted.back().wr);
            slot.posted.pop_back();
            window_.Land(wr.len);
            window_.Queue(wr.len);
            queue_.push_front(std::move(wr));
          }
          BreakLocked(slot, /*deliberate=*/true);
          break;
        }
      }
    }
  }

  void HandleLocked(const WorkCompletion& wc, std::vector<std::shared_ptr<VBatch>>& finish,
                    std::vector<std::pair<std::shared_ptr<VBatch>, absl::Status>>& aborts,
                    bool& peer_dead) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = std::find_if(slots_.begin(), slots_.end(),
                           [&](const QpSlot& s) { return s.qp != 0 && s.qp_num == wc.qp_num; });
    if (it == slots_.end()) return;
    QpSlot& slot = *it;
    if (wc.status != WcStatus::kSuccess) slot.broken = true;
    while (!slot.posted.empty()) {
      PostedWr p = std::move(slot.posted.front());
      slot.posted.pop_front();
      window_.Land(p.wr.len);
      const bool matching = p.wr_id == wc.wr_id;
      BatchState& b = *p.wr.batch->state;
      if (!matching || wc.status == WcStatus::kSuccess) {
        // Earlier WRs of an RC QP completed before this one (in order): they succeeded.
        b.RecordPiece(p.wr.descriptor, p.wr.len, absl::OkStatus());
        finish.push_back(p.wr.batch);
      } else if (wc.status == WcStatus::kFlushError) {
        if (!b.aborted() && slot.deliberate && p.wr.attempts + 1 < kMaxAttempts) {
          ++p.wr.attempts;
          window_.Queue(p.wr.len);
          queue_.push_back(std::move(p.wr));
        } else {
          if (!b.aborted()) {
            aborts.emplace_back(p.wr.batch, absl::UnavailableError(absl::StrCat(
                                                "QP to ", address_, " failed; work flushed")));
          }
          finish.push_back(p.wr.batch);
        }
      } else if (wc.status == WcStatus::kRetryExceeded) {
        peer_dead = true;
        aborts.emplace_back(p.wr.batch, DeadStatus());
        finish.push_back(p.wr.batch);
      } else {
        const absl::Status s =
            wc.status == WcStatus::kRemoteAccessError
                ? absl::FailedPreconditionError(absl::StrCat(
                      "remote access error at ", address_,
                      ": its registration changed (restarted?) or the range is not registered"))
                : absl::InternalError(
                      absl::StrCat("work request to ", address_, ": ", WcStatusName(wc.status)));
        b.RecordPiece(p.wr.descriptor, 0, s);
        finish.push_back(p.wr.batch);
      }
      if (matching) break;
    }
  }

 public:
  std::atomic<uint32_t> lkey_{0};  // the region MR lkey; set by Submit before it enqueues

 private:
  const std::string address_;
  VerbsTransport* const t_;
  const Handle cq_;
  Mutex connect_mu_;
  mutable Mutex mu_;
  RegionInfo info_ ABSL_GUARDED_BY(mu_);
  std::vector<QpSlot> slots_ ABSL_GUARDED_BY(mu_);
  std::deque<VWr> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<SendWr> list_ ABSL_GUARDED_BY(mu_);  // reused for each post
  PeerWindow window_ ABSL_GUARDED_BY(mu_);
  uint64_t next_wr_id_ ABSL_GUARDED_BY(mu_) = 1;
};

// ----- VerbsTransport ---------------------------------------------------------------------------

VerbsTransport::VerbsTransport(VerbsTransportOptions options, std::unique_ptr<VerbsApi> api,
                               std::shared_ptr<VerbsExchange> exchange)
    : options_(std::move(options)), api_(std::move(api)), exchange_(std::move(exchange)) {}

absl::StatusOr<std::unique_ptr<VerbsTransport>> VerbsTransport::Create(
    VerbsTransportOptions options, std::unique_ptr<VerbsApi> api,
    std::shared_ptr<VerbsExchange> exchange) {
  if (options.node_name.empty()) return absl::InvalidArgumentError("node_name is required");
  if (options.qps_per_peer < 1 || options.max_outstanding_wr_per_qp < 1 ||
      options.signal_every < 1 || options.max_wr_bytes < 1 ||
      options.max_wr_bytes > (uint64_t{1} << 31)) {
    return absl::InvalidArgumentError("bad verbs transport options");
  }
  std::unique_ptr<VerbsTransport> t(
      new VerbsTransport(std::move(options), std::move(api), std::move(exchange)));
  auto ctx = t->api_->OpenDevice(t->options_.device);
  if (!ctx.ok()) return ctx.status();
  t->context_ = *ctx;
  auto pd = t->api_->AllocPd(t->context_);
  if (!pd.ok()) return pd.status();
  t->pd_ = *pd;
  auto cq = t->api_->CreateCq(t->context_, 16);
  if (!cq.ok()) return cq.status();
  t->serving_cq_ = *cq;
  t->exchange_->Publish(t->options_.node_name, t.get());
  t->poller_ = std::thread([p = t.get()] { p->PollLoop(); });
  return t;
}

VerbsTransport::~VerbsTransport() {
  closing_.store(true);
  registry_.AbortAll(absl::CancelledError("transport shutting down"));
  if (!registry_.WaitAllDone(absl::Seconds(30))) {
    spdlog::critical("verbs transport: batches did not complete within 30 s of shutdown");
    std::abort();
  }
  exchange_->Withdraw(options_.node_name, this);
  stop_polling_.store(true);
  if (poller_.joinable()) poller_.join();
  {
    MutexLock lock(&peers_mu_);
    for (auto& [a, p] : peers_) p->Close();
  }
  {
    MutexLock lock(&mr_mu_);
    for (auto& [num, serving] : serving_qps_) {
      (void)api_->ModifyQpToError(serving.qp);
      (void)api_->DestroyQp(serving.qp);
    }
    serving_qps_.clear();
    if (mr_.mr != 0) (void)api_->DeregisterMr(mr_.mr);
    mr_ = MrInfo{};
  }
  if (serving_cq_) (void)api_->DestroyCq(serving_cq_);
  if (pd_) (void)api_->DeallocPd(pd_);
  if (context_) (void)api_->CloseDevice(context_);
}

absl::Status VerbsTransport::RegisterRegion(uint64_t generation, void* base, uint64_t len) {
  MutexLock lock(&mr_mu_);
  absl::Status s = region_.Register(generation, base, len);
  if (!s.ok()) return s;
  // Remote WRITE access only where the options allow it: the NIC then refuses every one-sided
  // write into this region (owners never write to peers).
  auto mr = api_->RegisterMr(
      pd_, base, len,
      kLocalWrite | kRemoteRead | (options_.serve_remote_writes ? kRemoteWrite : 0));
  if (!mr.ok()) {
    (void)region_.Unregister(absl::Seconds(1));
    return mr.status();
  }
  mr_ = *mr;
  return absl::OkStatus();
}

absl::Status VerbsTransport::SetRegionGeneration(uint64_t) {
  return absl::UnimplementedError(
      "the verbs transport cannot change its region's generation while queue pairs carry it");
}

absl::Status VerbsTransport::UnregisterRegion() {
  if (!region_.registered()) return absl::NotFoundError("no region registered");
  registry_.AbortAll(absl::CancelledError("the local region is being unregistered"));
  if (!registry_.WaitAllDone(absl::Seconds(30))) {
    return absl::DeadlineExceededError("batches did not complete within 30 s");
  }
  MutexLock lock(&mr_mu_);
  for (auto& [num, serving] : serving_qps_) {  // peers' QPs to us fail from now on
    (void)api_->ModifyQpToError(serving.qp);
    (void)api_->DestroyQp(serving.qp);
  }
  serving_qps_.clear();
  if (mr_.mr != 0) (void)api_->DeregisterMr(mr_.mr);
  mr_ = MrInfo{};
  return region_.Unregister(absl::Seconds(30));
}

absl::StatusOr<std::pair<QpAddress, RegionInfo>> VerbsTransport::AcceptQp(
    const QpAddress& initiator) {
  MutexLock lock(&mr_mu_);
  if (mr_.mr == 0 || closing_.load())
    return absl::FailedPreconditionError("the peer has no registered region");
  auto qp = api_->CreateRcQp(pd_, serving_cq_, 1);
  if (!qp.ok()) return qp.status();
  absl::Status s = api_->ModifyQpToInit(*qp, kQpAccess);
  if (s.ok()) s = api_->ModifyQpToRtr(*qp, initiator);
  absl::StatusOr<QpAddress> mine = api_->LocalAddress(*qp);
  if (s.ok() && mine.ok()) s = api_->ModifyQpToRts(*qp, mine->psn);
  if (!s.ok() || !mine.ok()) {
    (void)api_->ModifyQpToError(*qp);
    (void)api_->DestroyQp(*qp);
    return s.ok() ? mine.status() : s;
  }
  serving_qps_[mine->qp_num] = ServingQp{*qp, initiator.qp_num};
  const RegionView v = region_.view();
  return std::make_pair(
      *mine, RegionInfo{v.generation, reinterpret_cast<uint64_t>(v.base), v.len, mr_.rkey});
}

void VerbsTransport::ReleaseQp(uint32_t qp_num, uint32_t initiator_qp_num) {
  MutexLock lock(&mr_mu_);
  auto it = serving_qps_.find(qp_num);
  if (it == serving_qps_.end()) return;
  if (it->second.initiator_qp_num != initiator_qp_num) {
    spdlog::warn("verbs: release of queue pair {} refused: it serves queue pair {}, not {}", qp_num,
                 it->second.initiator_qp_num, initiator_qp_num);
    return;
  }
  (void)api_->ModifyQpToError(it->second.qp);
  (void)api_->DestroyQp(it->second.qp);
  serving_qps_.erase(it);
}

VerbsTransport::Peer* VerbsTransport::GetPeer(const std::string& address) {
  MutexLock lock(&peers_mu_);
  auto& p = peers_[address];
  if (!p) {
    const int depth = options_.qps_per_peer * static_cast<int>(options_.max_outstanding_wr_per_qp);
    auto cq = api_->CreateCq(context_, depth);  // every outstanding WR fits: no overrun possible
    if (!cq.ok()) {
      peers_.erase(address);
      return nullptr;
    }
    p = std::make_unique<Peer>(address, this, *cq);
  }
  return p.get();
}

absl::StatusOr<BatchHandle> VerbsTransport::DoSubmit(const PeerId& peer, OpKind op,
                                                     std::span<const Descriptor> descriptors,
                                                     absl::Duration timeout) {
  Peer* p = GetPeer(peer.address);
  if (p == nullptr) return absl::ResourceExhaustedError("cannot create a completion queue");
  {
    MutexLock lock(&mr_mu_);
    p->lkey_ = mr_.lkey;
  }
  auto batch = std::make_shared<VBatch>();
  batch->state = registry_.Create(peer, op, descriptors, timeout);
  BatchHandle handle(batch->state);

  absl::StatusOr<RegionInfo> info = p->EnsureConnected(peer.expected_generation);
  if (!info.ok()) {
    batch->state->SetUnits(1);
    registry_.Arm(batch->state);
    const absl::Status s =
        info.status().code() == absl::StatusCode::kFailedPrecondition
            ? info.status()
            : absl::UnavailableError(
                  absl::StrCat("peer ", peer.address, " unreachable: ", info.status().message()));
    batch->state->Abort(s);
    batch->state->FinishUnit();
    return handle;
  }
  // Out-of-range descriptors are refused here (OutOfRange); the NIC would refuse them too, but
  // with a QP-breaking remote access error.
  std::vector<VWr> wrs;
  for (uint32_t i = 0; i < descriptors.size(); ++i) {
    const Descriptor& d = descriptors[i];
    absl::Status range = CheckRange(info->len, d.remote_offset, d.len);
    if (!range.ok()) {
      batch->state->RecordPiece(
          i, 0,
          absl::OutOfRangeError(
              absl::StrCat("peer ", peer.address, " refused the descriptor: ", range.message())));
      continue;
    }
    for (uint64_t done = 0; done < d.len;) {
      const uint64_t n = std::min(d.len - done, options_.max_wr_bytes);
      wrs.push_back(VWr{batch, i, info->addr + d.remote_offset + done, info->rkey,
                        static_cast<uint8_t*>(d.local_addr) + done, static_cast<uint32_t>(n), 0});
      done += n;
    }
  }
  batch->state->SetUnits(std::max<size_t>(wrs.size(), 1));
  std::weak_ptr<VBatch> weak = batch;
  batch->state->SetAbortHook([p, weak] {
    if (auto b = weak.lock()) p->AbortBatch(b.get());
  });
  registry_.Arm(batch->state);
  if (wrs.empty()) {
    batch->state->FinishUnit();
  } else {
    p->Enqueue(std::move(wrs));
  }
  return handle;
}

void VerbsTransport::PollLoop() {
  int idle = 0;
  while (!stop_polling_.load()) {
    std::vector<Peer*> peers;
    {
      MutexLock lock(&peers_mu_);
      for (auto& [a, p] : peers_) peers.push_back(p.get());
    }
    int handled = 0;
    for (Peer* p : peers) handled += p->Poll();
    idle = handled > 0 ? 0 : idle + 1;
    if (handled == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(idle > 1000 ? 1000 : 20));
    }
  }
}

void VerbsTransport::AddStats(TransportStats* out) const {
  TransportStats& s = *out;
  s.outstanding_batches = registry_.outstanding();
  s.batches_completed = registry_.completed();
  {
    MutexLock lock(&peers_mu_);
    for (const auto& [a, p] : peers_) {
      const PeerWindow w = p->window();
      s.inflight_bytes += w.inflight();
      s.queued_bytes += w.queued();
      s.open_connections += p->live_qps();
    }
  }
  {
    MutexLock lock(&mr_mu_);
    s.serving_connections = serving_qps_.size();
  }
}

}  // namespace fluxon::transport::verbs
