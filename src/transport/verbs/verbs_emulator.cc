#include "transport/verbs/verbs_emulator.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace fluxon::transport::verbs {

namespace {
const char* StateName(QpState s) {
  switch (s) {
    case QpState::kReset:
      return "RESET";
    case QpState::kInit:
      return "INIT";
    case QpState::kRtr:
      return "RTR";
    case QpState::kRts:
      return "RTS";
    case QpState::kError:
      return "ERROR";
  }
  return "?";
}
bool Within(uint64_t base, uint64_t len, uint64_t addr, uint64_t n) {
  return addr >= base && n <= len && addr - base <= len - n;
}
}  // namespace

// The device of one node: every call checks the node is alive and the handles are its own.
class EmulatedFabric::Device final : public VerbsApi {
 public:
  Device(std::shared_ptr<EmulatedFabric> f, std::string node)
      : f_(std::move(f)), node_(std::move(node)) {}

  absl::StatusOr<std::vector<std::string>> ListDevices() override {
    return std::vector<std::string>{"emu0"};
  }
  absl::StatusOr<Handle> OpenDevice(const std::string& name) override {
    MutexLock lock(&f_->mu_);
    Node& n = f_->nodes_[node_];
    if (!n.alive) return Dead();
    if (!name.empty() && name != "emu0") return absl::NotFoundError("no device " + name);
    const Handle h = f_->next_handle_++;
    f_->contexts_[h] = Context{node_, n.epoch};
    return h;
  }
  absl::Status CloseDevice(Handle context) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return absl::OkStatus();
    if (!Mine(context)) return f_->Violation("CloseDevice: unknown context");
    for (auto& [h, pd] : f_->pds_) {
      if (pd.context == context) return f_->Violation("CloseDevice with a PD still allocated");
    }
    for (auto& [h, cq] : f_->cqs_) {
      if (cq.context == context) return f_->Violation("CloseDevice with a CQ still alive");
    }
    f_->contexts_.erase(context);
    return absl::OkStatus();
  }
  absl::StatusOr<Handle> AllocPd(Handle context) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return Dead();
    if (!Mine(context)) return f_->Violation("AllocPd: unknown context");
    const Handle h = f_->next_handle_++;
    f_->pds_[h] = Pd{context};
    return h;
  }
  absl::Status DeallocPd(Handle pd) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return absl::OkStatus();
    if (!f_->pds_.contains(pd)) return f_->Violation("DeallocPd: unknown PD");
    for (auto& [h, mr] : f_->mrs_) {
      if (mr.pd == pd) return f_->Violation("DeallocPd with an MR still registered");
    }
    for (auto& [h, qp] : f_->qps_) {
      if (qp.pd == pd) return f_->Violation("DeallocPd with a QP still alive");
    }
    f_->pds_.erase(pd);
    return absl::OkStatus();
  }
  absl::StatusOr<MrInfo> RegisterMr(Handle pd, void* addr, uint64_t len, uint32_t access) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return Dead();
    if (!f_->pds_.contains(pd)) return f_->Violation("RegisterMr: unknown PD");
    if (addr == nullptr || len == 0) return f_->Violation("RegisterMr: empty range");
    if ((access & (kRemoteWrite)) && !(access & kLocalWrite)) {
      return f_->Violation("RegisterMr: REMOTE_WRITE requires LOCAL_WRITE");
    }
    const Handle h = f_->next_handle_++;
    const uint32_t key = f_->next_key_++;
    f_->mrs_[h] = Mr{pd, static_cast<uint8_t*>(addr), len, access, key, key ^ 0x5A5A0000u};
    return MrInfo{h, key, key ^ 0x5A5A0000u};
  }
  absl::Status DeregisterMr(Handle mr) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return absl::OkStatus();
    if (!f_->mrs_.contains(mr)) return f_->Violation("DeregisterMr: unknown MR");
    f_->mrs_.erase(mr);
    return absl::OkStatus();
  }
  absl::StatusOr<Handle> CreateCq(Handle context, int depth) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return Dead();
    if (!Mine(context)) return f_->Violation("CreateCq: unknown context");
    if (depth < 1) return f_->Violation("CreateCq: depth < 1");
    const Handle h = f_->next_handle_++;
    f_->cqs_[h] = Cq{context, static_cast<size_t>(depth), {}, false};
    return h;
  }
  absl::Status DestroyCq(Handle cq) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return absl::OkStatus();
    if (!f_->cqs_.contains(cq)) return f_->Violation("DestroyCq: unknown CQ");
    for (auto& [h, qp] : f_->qps_) {
      if (qp.cq == cq) return f_->Violation("DestroyCq while a QP still uses it");
    }
    f_->cqs_.erase(cq);
    return absl::OkStatus();
  }
  absl::StatusOr<Handle> CreateRcQp(Handle pd, Handle send_cq, uint32_t max_send_wr) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return Dead();
    if (!f_->pds_.contains(pd) || !f_->cqs_.contains(send_cq)) {
      return f_->Violation("CreateRcQp: unknown PD or CQ");
    }
    if (max_send_wr == 0) return f_->Violation("CreateRcQp: max_send_wr 0");
    const Handle h = f_->next_handle_++;
    Qp qp;
    qp.pd = pd;
    qp.cq = send_cq;
    qp.qp_num = f_->next_qp_num_++;
    qp.max_send_wr = max_send_wr;
    f_->qp_by_num_[qp.qp_num] = h;
    f_->qps_[h] = std::move(qp);
    return h;
  }
  absl::Status DestroyQp(Handle qp) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return absl::OkStatus();
    auto it = f_->qps_.find(qp);
    if (it == f_->qps_.end()) return f_->Violation("DestroyQp: unknown QP");
    if (!it->second.queue.empty()) return f_->Violation("DestroyQp with work requests outstanding");
    f_->qp_by_num_.erase(it->second.qp_num);
    f_->qps_.erase(it);
    return absl::OkStatus();
  }
  absl::StatusOr<QpAddress> LocalAddress(Handle qp) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return Dead();
    auto it = f_->qps_.find(qp);
    if (it == f_->qps_.end()) return f_->Violation("LocalAddress: unknown QP");
    QpAddress a;
    a.qp_num = it->second.qp_num;
    a.psn = it->second.qp_num;
    return a;
  }
  absl::Status ModifyQpToInit(Handle qp, uint32_t access) override {
    return Transition(qp, QpState::kReset, QpState::kInit, [&](Qp& q) { q.access = access; });
  }
  absl::Status ModifyQpToRtr(Handle qp, const QpAddress& remote) override {
    return Transition(qp, QpState::kInit, QpState::kRtr,
                      [&](Qp& q) { q.remote_qp_num = remote.qp_num; });
  }
  absl::Status ModifyQpToRts(Handle qp, uint32_t) override {
    return Transition(qp, QpState::kRtr, QpState::kRts, [](Qp&) {});
  }
  absl::Status ModifyQpToError(Handle qp) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return absl::OkStatus();
    auto it = f_->qps_.find(qp);
    if (it == f_->qps_.end()) return f_->Violation("ModifyQpToError: unknown QP");
    f_->ToError(it->second);
    return absl::OkStatus();
  }
  absl::Status PostSend(Handle qp, std::span<const SendWr> list) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return Dead();
    auto it = f_->qps_.find(qp);
    if (it == f_->qps_.end()) return f_->Violation("PostSend: unknown QP");
    Qp& q = it->second;
    if (q.state != QpState::kRts) {
      return f_->Violation(absl::StrCat("PostSend on QP ", q.qp_num, " in state ",
                                        StateName(q.state), " (must be RTS)"));
    }
    if (q.unretired + list.size() > q.max_send_wr) {
      return f_->Violation(absl::StrCat("PostSend: ", q.unretired + list.size(),
                                        " WRs outstanding on QP ", q.qp_num, ", max_send_wr ",
                                        q.max_send_wr, " (signal and poll more often)"));
    }
    for (const SendWr& w : list) {
      if (w.length == 0) return f_->Violation("PostSend: zero-length WR");
    }
    for (const SendWr& w : list) q.queue.push_back(w);
    q.unretired += list.size();
    f_->work_cv_.SignalAll();
    return absl::OkStatus();
  }
  absl::StatusOr<int> PollCq(Handle cq, std::span<WorkCompletion> out) override {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return Dead();
    auto it = f_->cqs_.find(cq);
    if (it == f_->cqs_.end()) return f_->Violation("PollCq: unknown CQ");
    if (it->second.overrun) return absl::DataLossError("CQ overrun: completions were lost");
    int n = 0;
    while (n < static_cast<int>(out.size()) && !it->second.entries.empty()) {
      out[n++] = it->second.entries.front();
      it->second.entries.pop_front();
    }
    return n;
  }

 private:
  absl::Status Dead() const {
    return absl::UnavailableError("emulated node " + node_ + " is dead");
  }
  bool NodeAlive() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(f_->mu_) { return f_->nodes_[node_].alive; }
  bool Mine(Handle context) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(f_->mu_) {
    auto it = f_->contexts_.find(context);
    return it != f_->contexts_.end() && it->second.node == node_;
  }
  template <typename F>
  absl::Status Transition(Handle qp, QpState from, QpState to, F apply) {
    MutexLock lock(&f_->mu_);
    if (!NodeAlive()) return Dead();
    auto it = f_->qps_.find(qp);
    if (it == f_->qps_.end()) return f_->Violation("modify_qp: unknown QP");
    if (it->second.state != from) {
      return f_->Violation(absl::StrCat("modify_qp ", StateName(it->second.state), " -> ",
                                        StateName(to), " (only from ", StateName(from), ")"));
    }
    apply(it->second);
    it->second.state = to;
    return absl::OkStatus();
  }

  std::shared_ptr<EmulatedFabric> f_;
  const std::string node_;
};

EmulatedFabric::EmulatedFabric(EmulatorOptions options)
    : options_(options), worker_([this] { WorkerLoop(); }) {}

EmulatedFabric::~EmulatedFabric() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    work_cv_.SignalAll();
  }
  worker_.join();
}

std::unique_ptr<VerbsApi> EmulatedFabric::AttachNode(const std::string& name) {
  {
    MutexLock lock(&mu_);
    nodes_[name];
  }
  return std::make_unique<Device>(shared_from_this(), name);
}

void EmulatedFabric::KillNode(const std::string& name) {
  MutexLock lock(&mu_);
  Node& n = nodes_[name];
  n.alive = false;
  n.stalled = false;
  // A crashed host: all of its objects vanish at once.
  std::vector<Handle> ctxs;
  for (auto& [h, c] : contexts_) {
    if (c.node == name) ctxs.push_back(h);
  }
  for (Handle c : ctxs) {
    std::vector<Handle> pds, cqs;
    for (auto& [h, pd] : pds_) {
      if (pd.context == c) pds.push_back(h);
    }
    for (auto& [h, cq] : cqs_) {
      if (cq.context == c) cqs.push_back(h);
    }
    for (Handle pd : pds) {
      std::erase_if(mrs_, [pd](const auto& kv) { return kv.second.pd == pd; });
      for (auto it = qps_.begin(); it != qps_.end();) {
        if (it->second.pd == pd) {
          qp_by_num_.erase(it->second.qp_num);
          it = qps_.erase(it);
        } else {
          ++it;
        }
      }
      pds_.erase(pd);
    }
    for (Handle cq : cqs) cqs_.erase(cq);
    contexts_.erase(c);
  }
  work_cv_.SignalAll();
}

void EmulatedFabric::ReviveNode(const std::string& name) {
  MutexLock lock(&mu_);
  Node& n = nodes_[name];
  n.alive = true;
  ++n.epoch;
}

void EmulatedFabric::SetNodeStalled(const std::string& name, bool stalled) {
  MutexLock lock(&mu_);
  nodes_[name].stalled = stalled;
  work_cv_.SignalAll();
}

uint64_t EmulatedFabric::violations() const {
  MutexLock lock(&mu_);
  return violations_;
}
std::string EmulatedFabric::last_violation() const {
  MutexLock lock(&mu_);
  return last_violation_;
}
uint64_t EmulatedFabric::live_objects() const {
  MutexLock lock(&mu_);
  return contexts_.size() + pds_.size() + mrs_.size() + cqs_.size() + qps_.size();
}

absl::Status EmulatedFabric::Violation(const std::string& what) {
  ++violations_;
  last_violation_ = what;
  spdlog::error("verbs emulator: VIOLATION: {}", what);
  if (options_.assert_on_violation) {
    spdlog::critical("verbs emulator: aborting on violation (assert_on_violation)");
    std::abort();
  }
  return absl::FailedPreconditionError("verbs emulator: " + what);
}

const std::string& EmulatedFabric::NodeOf(Handle context) const {
  static const std::string kNone;
  auto it = contexts_.find(context);
  return it == contexts_.end() ? kNone : it->second.node;
}

void EmulatedFabric::Complete(Qp& qp, const SendWr& wr, WcStatus status) {
  const bool generate = wr.signaled || status != WcStatus::kSuccess;
  if (!generate) {
    ++qp.unsignaled_run;
    return;
  }
  qp.unretired -= qp.unsignaled_run + 1;
  qp.unsignaled_run = 0;
  auto it = cqs_.find(qp.cq);
  if (it == cqs_.end()) return;
  Cq& cq = it->second;
  if (cq.overrun) return;
  if (cq.entries.size() >= cq.depth) {
    cq.overrun = true;
    (void)Violation(absl::StrCat("CQ overrun: depth ", cq.depth, " exceeded by QP ", qp.qp_num));
    return;
  }
  cq.entries.push_back(WorkCompletion{wr.wr_id, status, qp.qp_num});
}

void EmulatedFabric::ToError(Qp& qp) {
  qp.state = QpState::kError;
  while (!qp.queue.empty()) {  // flushed: every WR completes, signaled or not
    SendWr wr = qp.queue.front();
    qp.queue.pop_front();
    Complete(qp, wr, WcStatus::kFlushError);
  }
}

bool EmulatedFabric::Execute(Qp& qp) {
  const SendWr wr = qp.queue.front();
  auto fail = [&](WcStatus st) ABSL_NO_THREAD_SAFETY_ANALYSIS {  // called with mu_ held
    qp.queue.pop_front();
    Complete(qp, wr, st);
    ToError(qp);
    return true;
  };

  // The responder: the connected QP, alive, in RTR/RTS, connected back to us.
  auto rit = qp_by_num_.find(qp.remote_qp_num);
  if (rit == qp_by_num_.end()) return fail(WcStatus::kRetryExceeded);
  Qp& remote = qps_.at(rit->second);
  const std::string& remote_node = NodeOf(pds_.at(remote.pd).context);
  if (!nodes_[remote_node].alive) return fail(WcStatus::kRetryExceeded);
  if (nodes_[remote_node].stalled) return false;
  if ((remote.state != QpState::kRtr && remote.state != QpState::kRts) ||
      remote.remote_qp_num != qp.qp_num) {
    return fail(WcStatus::kRetryExceeded);
  }
  // Local key: ours, this PD, inside the MR, with LOCAL_WRITE when we write into it (READ).
  const Mr* local = nullptr;
  for (auto& [h, mr] : mrs_) {
    if (mr.lkey == wr.lkey && mr.pd == qp.pd) local = &mr;
  }
  if (local == nullptr ||
      !Within(reinterpret_cast<uint64_t>(local->addr), local->len, wr.local_addr, wr.length) ||
      (wr.opcode == WrOpcode::kRdmaRead && !(local->access & kLocalWrite))) {
    (void)Violation(
        absl::StrCat("local protection error on QP ", qp.qp_num, " (lkey ", wr.lkey, ")"));
    return fail(WcStatus::kLocalProtectionError);
  }
  // Remote key: the responder's PD, inside its MR, with the access right; the responder QP must
  // allow the operation too.
  const Mr* target = nullptr;
  for (auto& [h, mr] : mrs_) {
    if (mr.rkey == wr.rkey && mr.pd == remote.pd) target = &mr;
  }
  const uint32_t need = wr.opcode == WrOpcode::kRdmaRead ? kRemoteRead : kRemoteWrite;
  if (target == nullptr ||
      !Within(reinterpret_cast<uint64_t>(target->addr), target->len, wr.remote_addr, wr.length) ||
      !(target->access & need) || !(remote.access & need)) {
    remote.state = QpState::kError;
    return fail(WcStatus::kRemoteAccessError);
  }
  auto* l = reinterpret_cast<uint8_t*>(wr.local_addr);
  auto* r = reinterpret_cast<uint8_t*>(wr.remote_addr);
  if (wr.opcode == WrOpcode::kRdmaRead) {
    std::memcpy(l, r, wr.length);
  } else {
    std::memcpy(r, l, wr.length);
  }
  qp.queue.pop_front();
  Complete(qp, wr, WcStatus::kSuccess);
  return true;
}

void EmulatedFabric::WorkerLoop() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    bool progressed = false;
    for (auto& [h, qp] : qps_) {  // one WR per QP per pass: in order per QP, fair across QPs
      if (qp.state == QpState::kRts && !qp.queue.empty()) progressed |= Execute(qp);
    }
    if (!progressed)
      work_cv_.WaitUntil(&mu_, std::chrono::steady_clock::now() + std::chrono::milliseconds(5));
  }
}

}  // namespace fluxon::transport::verbs
