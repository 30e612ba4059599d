// EmulatedFabric: an in-process verbs "fabric" behind VerbsApi, for CI (no RDMA device here).
//
// Each AttachNode(name) is one host with one device ("emu0"). RC QPs of different nodes connect
// by qp_num; one worker thread executes posted work requests, in order per QP, with memcpy.
//
// What it enforces (a violation is counted, logged, returned as a clear status and, with
// assert_on_violation, aborts the process):
// - object lifetimes: unknown handles, destroying a CQ still used by a QP, a PD with MRs or QPs,
//   a device with PDs or CQs, a QP with work outstanding;
// - QP state transitions RESET -> INIT -> RTR -> RTS (-> ERROR from anywhere); posting on a QP
//   that is not in RTS;
// - the send queue depth: more than max_send_wr WRs outstanding (a WR's slot is freed when its
//   completion, or a later signaled one, is generated: a transport that never signals runs out);
// - CQ depth: a completion that does not fit is a CQ overrun (the CQ and its QPs go to error);
// - local keys: an lkey not of this node's PD, or a range outside its MR (local protection error).
// What it reports as completions, like hardware (not violations):
// - remote access errors: unknown rkey, a range outside the remote MR, missing access rights;
//   the QP then goes to the error state and its later WRs are flushed;
// - a dead or unconnected responder: retry exceeded; a stalled node's WRs wait (until the QP is
//   moved to error, which flushes them);
// - completions only for signaled WRs, except errors and flushes, which always complete.
// KillNode erases a node's objects at once (a host crash); its device then answers destroy calls
// with OK (nothing left to free) and everything else with Unavailable.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "transport/verbs/verbs_api.h"

namespace fluxon::transport::verbs {

struct EmulatorOptions {
#ifdef NDEBUG
  bool assert_on_violation = false;
#else
  bool assert_on_violation = true;
#endif
};

class EmulatedFabric : public std::enable_shared_from_this<EmulatedFabric> {
 public:
  explicit EmulatedFabric(EmulatorOptions options = {});
  ~EmulatedFabric();
  EmulatedFabric(const EmulatedFabric&) = delete;
  EmulatedFabric& operator=(const EmulatedFabric&) = delete;

  // The device of node `name` (created alive on first attach).
  std::unique_ptr<VerbsApi> AttachNode(const std::string& name);
  void KillNode(const std::string& name);
  void ReviveNode(const std::string& name);
  void SetNodeStalled(const std::string& name, bool stalled);

  uint64_t violations() const;
  std::string last_violation() const;
  uint64_t live_objects() const;  // contexts + PDs + MRs + CQs + QPs of every node

  class Device;

 private:
  friend class Device;
  struct Node {
    bool alive = true;
    bool stalled = false;
    uint64_t epoch = 0;
  };
  struct Context {
    std::string node;
    uint64_t epoch;
  };
  struct Pd {
    Handle context;
  };
  struct Mr {
    Handle pd;
    uint8_t* addr;
    uint64_t len;
    uint32_t access;
    uint32_t lkey, rkey;
  };
  struct Cq {
    Handle context;
    size_t depth;
    std::deque<WorkCompletion> entries;
    bool overrun = false;
  };
  struct Qp {
    Handle pd;
    Handle cq;
    uint32_t qp_num;
    uint32_t max_send_wr;
    QpState state = QpState::kReset;
    uint32_t access = 0;
    uint32_t remote_qp_num = 0;
    std::deque<SendWr> queue;     // posted, not executed
    uint32_t unretired = 0;       // executed or queued, slot not yet freed by a completion
    uint32_t unsignaled_run = 0;  // executed unsignaled WRs since the last completion
  };

  absl::Status Violation(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Alive(Handle context) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const std::string& NodeOf(Handle context) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete(Qp& qp, const SendWr& wr, WcStatus status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ToError(Qp& qp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Executes the first WR of `qp`; false when it must wait (stalled responder).
  bool Execute(Qp& qp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLoop();

  const EmulatorOptions options_;
  mutable Mutex mu_;
  CondVar work_cv_;
  Handle next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  uint32_t next_qp_num_ ABSL_GUARDED_BY(mu_) = 100;
  uint32_t next_key_ ABSL_GUARDED_BY(mu_) = 0x1000;
  std::map<std::string, Node> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<Handle, Context> contexts_ ABSL_GUARDED_BY(mu_);
  std::map<Handle, Pd> pds_ ABSL_GUARDED_BY(mu_);
  std::map<Handle, Mr> mrs_ ABSL_GUARDED_BY(mu_);
  std::map<Handle, Cq> cqs_ ABSL_GUARDED_BY(mu_);
  std::map<Handle, Qp> qps_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, Handle> qp_by_num_ ABSL_GUARDED_BY(mu_);
  uint64_t violations_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_violation_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace fluxon::transport::verbs
