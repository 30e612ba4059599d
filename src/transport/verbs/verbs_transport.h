// VerbsTransport: the Transport over RDMA verbs (RC queue pairs, one-sided READ and WRITE),
// through the VerbsApi seam (libibverbs, or the emulator in CI).
//
// Per peer: `qps_per_peer` RC QPs and one CQ sized for every WR they may have outstanding (so a
// CQ overrun cannot happen by construction). The whole registered region is one MR
// (LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE): it is the local memory of our WRs and the target
// of our peers'. A batch is cut into WRs of at most max_wr_bytes; WR lists are posted with
// selective signaling (every signal_every-th WR and the last of a list), at most
// max_outstanding_wr_per_qp per QP, within max_inflight_bytes_per_peer. One completion thread
// polls every peer's CQ; a signaled completion retires every earlier WR of its QP (RC order).
//
// QP/MR information is exchanged through VerbsExchange: across processes over the owners' gRPC
// peer service on the node's credentials (GrpcVerbsExchange, rpc_grpc/grpc_verbs_exchange.h: mutual
// TLS, so no unauthenticated peer learns a QP or an rkey); InProcessVerbsExchange connects
// transports of one process (the emulator tests).
//
// Invariants and why:
// - Serving-side validation: the NIC enforces the MR bounds and rkey; a peer restart registers a
//   new MR (new rkey) under a new generation, and the exchange hands the initiator the peer's
//   generation at connect time: a batch whose expected generation differs is refused with
//   FailedPrecondition before any WR is posted. Offsets are also checked against the advertised
//   region length before posting, so an out-of-range descriptor is OutOfRange and never breaks
//   a QP.
// - A WR is in exactly one place: the peer's queue, or one QP's outstanding list (posted, not
//   retired). Only a completion (success, error or flush) retires it, so a batch completes only
//   when the device can no longer touch its memory.
// - Abort (cancel, deadline) drops queued WRs and moves the QPs carrying posted ones to the error
//   state: the device flushes them (bounded), other batches' flushed WRs are requeued. A QP in
//   error is destroyed once drained and reconnected on demand. RETRY_EXCEEDED (a dead peer)
//   fails every batch of that peer at once with Unavailable.
// - Lock order: VerbsTransport::peers_mu_ -> Peer::mu_ -> (BatchState). The exchange is never
//   called with a peer lock held.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/mutex.h"
#include "transport/batch.h"
#include "transport/region.h"
#include "transport/transport.h"
#include "transport/verbs/verbs_api.h"

namespace fluxon::transport::verbs {

// What a serving transport tells an initiator about its region.
struct RegionInfo {
  uint64_t generation = 0;
  uint64_t addr = 0;
  uint64_t len = 0;
  uint32_t rkey = 0;
};

// The serving side of the exchange: creates a QP connected to the initiator's.
class VerbsAcceptor {
 public:
  virtual ~VerbsAcceptor() = default;
  virtual absl::StatusOr<std::pair<QpAddress, RegionInfo>> AcceptQp(const QpAddress& initiator) = 0;
  // Releases serving queue pair `qp_num` only when it was made for the initiator's queue pair
  // `initiator_qp_num` (a stale or buggy peer cannot tear down another peer's queue pair by
  // naming its number); otherwise nothing happens.
  virtual void ReleaseQp(uint32_t qp_num, uint32_t initiator_qp_num) = 0;
};

class VerbsExchange {
 public:
  virtual ~VerbsExchange() = default;
  virtual void Publish(const std::string& name, VerbsAcceptor* acceptor) = 0;
  virtual void Withdraw(const std::string& name, VerbsAcceptor* acceptor) = 0;
  // NotFound/Unavailable when `peer` is not published.
  virtual absl::StatusOr<std::pair<QpAddress, RegionInfo>> Connect(const std::string& peer,
                                                                   const QpAddress& initiator) = 0;
  // Asks `peer` to release its queue pair `remote_qp_num`, connected to our `local_qp_num`.
  virtual void Disconnect(const std::string& peer, uint32_t remote_qp_num,
                          uint32_t local_qp_num) = 0;
};

// Transports of one process (tests, emulator). Calls into an acceptor under its own mutex, so an
// acceptor is never called after Withdraw returned.
class InProcessVerbsExchange final : public VerbsExchange {
 public:
  void Publish(const std::string& name, VerbsAcceptor* acceptor) override;
  void Withdraw(const std::string& name, VerbsAcceptor* acceptor) override;
  absl::StatusOr<std::pair<QpAddress, RegionInfo>> Connect(const std::string& peer,
                                                           const QpAddress& initiator) override;
  void Disconnect(const std::string& peer, uint32_t remote_qp_num, uint32_t local_qp_num) override;

 private:
  Mutex mu_;
  absl::flat_hash_map<std::string, VerbsAcceptor*> acceptors_ ABSL_GUARDED_BY(mu_);
};

struct VerbsTransportOptions {
  std::string node_name;  // this transport's endpoint in the exchange
  std::string device;     // empty: the first device
  int qps_per_peer = 2;
  uint32_t max_outstanding_wr_per_qp = 64;
  uint32_t signal_every = 8;
  uint64_t max_wr_bytes = uint64_t{1} << 20;
  uint64_t max_inflight_bytes_per_peer = uint64_t{256} << 20;
  // Registers the region with remote WRITE access (peers may RDMA-write into it). Off: the NIC
  // refuses every one-sided write (owners never write to peers).
  bool serve_remote_writes = false;
};

class VerbsTransport final : public Transport, private VerbsAcceptor {
 public:
  static absl::StatusOr<std::unique_ptr<VerbsTransport>> Create(
      VerbsTransportOptions options, std::unique_ptr<VerbsApi> api,
      std::shared_ptr<VerbsExchange> exchange);
  ~VerbsTransport() override;

  std::string_view name() const override { return "rdma"; }
  std::string endpoint() const override { return options_.node_name; }
  absl::Status RegisterRegion(uint64_t generation, void* base, uint64_t len) override;
  // Unimplemented: queue pairs carry the region's generation from their set-up, so a new one
  // would need every peer's queue pairs torn down first; fluxond serves TCP only.
  absl::Status SetRegionGeneration(uint64_t generation) override;
  absl::Status UnregisterRegion() override;

  class Peer;

 private:
  VerbsTransport(VerbsTransportOptions options, std::unique_ptr<VerbsApi> api,
                 std::shared_ptr<VerbsExchange> exchange);
  absl::StatusOr<std::pair<QpAddress, RegionInfo>> AcceptQp(const QpAddress& initiator) override;
  void ReleaseQp(uint32_t qp_num, uint32_t initiator_qp_num) override;
  absl::StatusOr<BatchHandle> DoSubmit(const PeerId& peer, OpKind op,
                                       std::span<const Descriptor> descriptors,
                                       absl::Duration timeout) override;
  void AddStats(TransportStats* s) const override;
  Peer* GetPeer(const std::string& address);
  void PollLoop();

  const VerbsTransportOptions options_;
  const std::unique_ptr<VerbsApi> api_;
  const std::shared_ptr<VerbsExchange> exchange_;
  Handle context_ = 0;  // set in Create, then read-only
  Handle pd_ = 0;
  Handle serving_cq_ = 0;
  BatchRegistry registry_;

  mutable Mutex mr_mu_;
  MrInfo mr_ ABSL_GUARDED_BY(mr_mu_);
  struct ServingQp {
    Handle qp = 0;
    uint32_t initiator_qp_num = 0;  // the peer's queue pair it is connected to
  };
  absl::flat_hash_map<uint32_t, ServingQp> serving_qps_ ABSL_GUARDED_BY(mr_mu_);

  mutable Mutex peers_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(peers_mu_);
  std::atomic<bool> stop_polling_{false};
  std::thread poller_;
};

}  // namespace fluxon::transport::verbs
