// libibverbs behind VerbsApi. Compiled and linked in every build; NOT YET RUN ON HARDWARE (no
// machine we have has an RDMA device, and the kernel has no soft-RoCE module). The conformance
// suite runs over it where ibv_get_device_list returns a device.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "transport/verbs/verbs_api.h"

namespace fluxon::transport::verbs {
namespace {

constexpr uint8_t kPort = 1;
constexpr int kGidIndex = 0;

absl::Status Errno(const char* what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

struct Context {
  ibv_context* ctx = nullptr;
  ibv_port_attr port{};
  ibv_gid gid{};
};
struct Pd {
  ibv_pd* pd = nullptr;
  Context* context = nullptr;
};
struct Qp {
  ibv_qp* qp = nullptr;
  Context* context = nullptr;
};

template <typename T>
T* As(Handle h) {
  return reinterpret_cast<T*>(h);
}
template <typename T>
Handle H(T* p) {
  return reinterpret_cast<Handle>(p);
}

int ToIbvAccess(uint32_t a) {
  int r = 0;
  if (a & kLocalWrite) r |= IBV_ACCESS_LOCAL_WRITE;
  if (a & kRemoteWrite) r |= IBV_ACCESS_REMOTE_WRITE;
  if (a & kRemoteRead) r |= IBV_ACCESS_REMOTE_READ;
  return r;
}

WcStatus FromIbv(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS:
      return WcStatus::kSuccess;
    case IBV_WC_LOC_PROT_ERR:
      return WcStatus::kLocalProtectionError;
    case IBV_WC_REM_ACCESS_ERR:
      return WcStatus::kRemoteAccessError;
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return WcStatus::kRetryExceeded;
    case IBV_WC_WR_FLUSH_ERR:
      return WcStatus::kFlushError;
    default:
      return WcStatus::kGeneralError;
  }
}

class IbverbsApi final : public VerbsApi {
 public:
  absl::StatusOr<std::vector<std::string>> ListDevices() override {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    std::vector<std::string> names;
    if (list == nullptr) return names;  // no RDMA subsystem: no devices
    for (int i = 0; i < n; ++i) names.push_back(ibv_get_device_name(list[i]));
    ibv_free_device_list(list);
    return names;
  }
  absl::StatusOr<Handle> OpenDevice(const std::string& name) override {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list == nullptr || n == 0) return absl::NotFoundError("no RDMA device");
    ibv_context* ctx = nullptr;
    for (int i = 0; i < n && ctx == nullptr; ++i) {
      if (name.empty() || name == ibv_get_device_name(list[i])) ctx = ibv_open_device(list[i]);
    }
    ibv_free_device_list(list);
    if (ctx == nullptr) return absl::NotFoundError(absl::StrCat("RDMA device '", name, "'"));
    auto c = std::make_unique<Context>();
    c->ctx = ctx;
    if (ibv_query_port(ctx, kPort, &c->port) != 0 ||
        ibv_query_gid(ctx, kPort, kGidIndex, &c->gid)) {
      ibv_close_device(ctx);
      return Errno("ibv_query_port/gid", errno);
    }
    return H(c.release());
  }
  absl::Status CloseDevice(Handle context) override {
    auto* c = As<Context>(context);
    const int rc = ibv_close_device(c->ctx);
    delete c;
    return rc == 0 ? absl::OkStatus() : Errno("ibv_close_device", rc);
  }
  absl::StatusOr<Handle> AllocPd(Handle context) override {
    ibv_pd* pd = ibv_alloc_pd(As<Context>(context)->ctx);
    if (pd == nullptr) return Errno("ibv_alloc_pd", errno);
    return H(new Pd{pd, As<Context>(context)});
  }
  absl::Status DeallocPd(Handle pd) override {
    auto* p = As<Pd>(pd);
    const int rc = ibv_dealloc_pd(p->pd);
    delete p;
    return rc == 0 ? absl::OkStatus() : Errno("ibv_dealloc_pd", rc);
  }
  absl::StatusOr<MrInfo> RegisterMr(Handle pd, void* addr, uint64_t len, uint32_t access) override {
    ibv_mr* mr = ibv_reg_mr(As<Pd>(pd)->pd, addr, len, ToIbvAccess(access));
    if (mr == nullptr) return Errno("ibv_reg_mr", errno);
    return MrInfo{H(mr), mr->lkey, mr->rkey};
  }
  absl::Status DeregisterMr(Handle mr) override {
    const int rc = ibv_dereg_mr(As<ibv_mr>(mr));
    return rc == 0 ? absl::OkStatus() : Errno("ibv_dereg_mr", rc);
  }
  absl::StatusOr<Handle> CreateCq(Handle context, int depth) override {
    ibv_cq* cq = ibv_create_cq(As<Context>(context)->ctx, depth, nullptr, nullptr, 0);
    if (cq == nullptr) return Errno("ibv_create_cq", errno);
    return H(cq);
  }
  absl::Status DestroyCq(Handle cq) override {
    const int rc = ibv_destroy_cq(As<ibv_cq>(cq));
    return rc == 0 ? absl::OkStatus() : Errno("ibv_destroy_cq", rc);
  }
  absl::StatusOr<Handle> CreateRcQp(Handle pd, Handle send_cq, uint32_t max_send_wr) override {
    ibv_qp_init_attr attr{};
    attr.send_cq = As<ibv_cq>(send_cq);
    attr.recv_cq = As<ibv_cq>(send_cq);
    attr.qp_type = IBV_QPT_RC;
    attr.sq_sig_all = 0;  // selective signaling
    attr.cap.max_send_wr = max_send_wr;
    attr.cap.max_recv_wr = 1;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(As<Pd>(pd)->pd, &attr);
    if (qp == nullptr) return Errno("ibv_create_qp", errno);
    return H(new Qp{qp, As<Pd>(pd)->context});
  }
  absl::Status DestroyQp(Handle qp) override {
    auto* q = As<Qp>(qp);
    const int rc = ibv_destroy_qp(q->qp);
    delete q;
    return rc == 0 ? absl::OkStatus() : Errno("ibv_destroy_qp", rc);
  }
  absl::StatusOr<QpAddress> LocalAddress(Handle qp) override {
    auto* q = As<Qp>(qp);
    QpAddress a;
    a.qp_num = q->qp->qp_num;
    a.lid = q->context->port.lid;
    std::memcpy(a.gid.data(), q->context->gid.raw, 16);
    a.psn = q->qp->qp_num & 0xFFFFFF;
    return a;
  }
  absl::Status ModifyQpToInit(Handle qp, uint32_t access) override {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = kPort;
    attr.qp_access_flags = ToIbvAccess(access);
    const int rc =
        ibv_modify_qp(As<Qp>(qp)->qp, &attr,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    return rc == 0 ? absl::OkStatus() : Errno("ibv_modify_qp(INIT)", rc);
  }
  absl::Status ModifyQpToRtr(Handle qp, const QpAddress& remote) override {
    auto* q = As<Qp>(qp);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = q->context->port.active_mtu;
    attr.dest_qp_num = remote.qp_num;
    attr.rq_psn = remote.psn;
    attr.max_dest_rd_atomic = 16;
    attr.min_rnr_timer = 12;
    attr.ah_attr.dlid = remote.lid;
    attr.ah_attr.port_num = kPort;
    bool global = false;
    for (uint8_t b : remote.gid) global = global || b != 0;
    if (global) {  // RoCE: route by GID
      attr.ah_attr.is_global = 1;
      std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid.data(), 16);
      attr.ah_attr.grh.sgid_index = kGidIndex;
      attr.ah_attr.grh.hop_limit = 1;
    }
    const int rc =
        ibv_modify_qp(q->qp, &attr,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    return rc == 0 ? absl::OkStatus() : Errno("ibv_modify_qp(RTR)", rc);
  }
  absl::Status ModifyQpToRts(Handle qp, uint32_t psn) override {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.sq_psn = psn;
    attr.max_rd_atomic = 16;
    const int rc = ibv_modify_qp(As<Qp>(qp)->qp, &attr,
                                 IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    return rc == 0 ? absl::OkStatus() : Errno("ibv_modify_qp(RTS)", rc);
  }
  absl::Status ModifyQpToError(Handle qp) override {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    const int rc = ibv_modify_qp(As<Qp>(qp)->qp, &attr, IBV_QP_STATE);
    return rc == 0 ? absl::OkStatus() : Errno("ibv_modify_qp(ERR)", rc);
  }
  absl::Status PostSend(Handle qp, std::span<const SendWr> list) override {
    if (list.empty()) return absl::OkStatus();
    std::vector<ibv_send_wr> wrs(list.size());
    std::vector<ibv_sge> sges(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      const SendWr& w = list[i];
      sges[i] = ibv_sge{w.local_addr, w.length, w.lkey};
      ibv_send_wr& r = wrs[i];
      r = ibv_send_wr{};
      r.wr_id = w.wr_id;
      r.sg_list = &sges[i];
      r.num_sge = 1;
      r.opcode = w.opcode == WrOpcode::kRdmaRead ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      r.send_flags = w.signaled ? IBV_SEND_SIGNALED : 0;
      r.wr.rdma.remote_addr = w.remote_addr;
      r.wr.rdma.rkey = w.rkey;
      r.next = i + 1 < list.size() ? &wrs[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(As<Qp>(qp)->qp, wrs.data(), &bad);
    return rc == 0 ? absl::OkStatus() : Errno("ibv_post_send", rc);
  }
  absl::StatusOr<int> PollCq(Handle cq, std::span<WorkCompletion> out) override {
    ibv_wc wc[64];
    const int n = ibv_poll_cq(As<ibv_cq>(cq), std::min<int>(64, out.size()), wc);
    if (n < 0) return absl::InternalError("ibv_poll_cq failed");
    for (int i = 0; i < n; ++i)
      out[i] = WorkCompletion{wc[i].wr_id, FromIbv(wc[i].status), wc[i].qp_num};
    return n;
  }
};

}  // namespace

const char* WcStatusName(WcStatus s) {
  switch (s) {
    case WcStatus::kSuccess:
      return "success";
    case WcStatus::kLocalProtectionError:
      return "local protection error";
    case WcStatus::kRemoteAccessError:
      return "remote access error";
    case WcStatus::kRetryExceeded:
      return "retry exceeded (no response from the peer)";
    case WcStatus::kFlushError:
      return "flushed (QP in error state)";
    case WcStatus::kGeneralError:
      return "general error";
  }
  return "?";
}

std::unique_ptr<VerbsApi> MakeIbverbsApi() { return std::make_unique<IbverbsApi>(); }

}  // namespace fluxon::transport::verbs
