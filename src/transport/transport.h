// The data-plane transport interface: one-sided, batched reads and writes between owners'
// registered segments. Every transport (TCP, RDMA verbs, the verbs emulator) implements it, and
// one conformance suite (tests/transport/transport_conformance_test.cc) runs over all of them.
//
// Model (NIXL-style): one Transport object per process. It is both
//   - the serving side: the owner registers its segment range and generation with
//     RegisterRegion; peers then read and write inside that range, and
//   - the initiator: Submit moves bytes between the peer's registered region and local memory,
//     which must lie inside this transport's own registered region (RDMA needs a local MR; TCP
//     checks the same rule so both behave alike).
// The transport knows nothing about slots, keys or routes: a descriptor is (remote offset, local
// address, length).
//
// Invariants every implementation keeps (the conformance suite checks them):
// - Serving side: every request is checked against the registered region before any byte moves:
//   no region or a different generation -> FailedPrecondition; len == 0, or offset/len outside
//   [0, region_len) (overflow-safe: offset + len is never computed unchecked) -> OutOfRange for
//   that descriptor. A refused descriptor never reads or writes memory.
// - One Submit per peer per batch. It returns at once with a BatchHandle (connecting on first use
//   is bounded by the batch deadline); the batch completes exactly once, with one status per
//   descriptor.
// - A batch completes only when no thread and no device can touch its local memory any more:
//   after Wait() returns, the caller may free or reuse the local buffers, also after a
//   cancellation, a deadline or a dead peer.
// - Every batch completes by its deadline (DeadlineExceeded) plus a bounded teardown: a blocked
//   connection or queue pair is torn down to get there. Cancel() completes it with Cancelled the
//   same way. A peer whose connection is reset fails its in-flight batches at once (Unavailable).
// - In-flight bytes per peer are bounded (Options::max_inflight_bytes_per_peer); what does not
//   fit waits in the peer's queue (its wait is bounded by the batch deadline).
// - A peer is (address, expected generation). A restarted peer has a new generation; a request
//   carrying the old one is refused with FailedPrecondition naming the request's generation
//   only (never the served one: a refusal reveals nothing a guesser could use).
// - One-sided WRITE is served only where the serving side allows it (TCP: its write filter;
//   verbs: serve_remote_writes): owners never write to peers, so an owner's data plane refuses
//   every WRITE (PermissionDenied per descriptor) and nothing a peer sends changes its memory.
// - No exceptions cross this interface; errors are absl::Status.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/region.h"

namespace fluxon::transport {

// Wire/queue-pair limits shared by every transport (checked on both sides).
inline constexpr uint32_t kMaxDescriptorsPerBatch = 65536;
// The largest single descriptor (the largest Fluxon value is 512 MiB).
inline constexpr uint64_t kMaxDescriptorBytes = uint64_t{1} << 30;

enum class OpKind : uint8_t {
  kRead = 1,   // remote region -> local memory
  kWrite = 2,  // local memory -> remote region
};

struct Descriptor {
  uint64_t remote_offset = 0;  // offset into the peer's registered region
  void* local_addr = nullptr;  // inside this transport's registered region
  uint64_t len = 0;            // > 0, <= kMaxDescriptorBytes
};

struct PeerId {
  std::string address;               // "host:port" for tcp; the node name for verbs
  uint64_t expected_generation = 0;  // the generation the caller believes the peer serves
};

struct BatchResult {
  absl::Status status;                    // OK iff every descriptor is OK
  std::vector<absl::Status> descriptors;  // one per submitted descriptor, same order
  uint64_t bytes_ok = 0;                  // bytes of the descriptors that succeeded
};

class BatchState;  // batch.h: shared by the transport and the handle

// The caller's view of one submitted batch. Copyable; all copies name the same batch.
class BatchHandle {
 public:
  BatchHandle() = default;
  explicit BatchHandle(std::shared_ptr<BatchState> state) : state_(std::move(state)) {}

  uint64_t id() const;
  bool Done() const;
  // Waits up to `timeout` for completion; true when the batch completed.
  bool WaitFor(absl::Duration timeout) const;
  // Waits for completion. Bounded: every batch completes by its deadline plus teardown.
  const BatchResult& Wait() const;
  // Ends the batch with Cancelled (descriptors already complete keep OK). A no-op once done.
  void Cancel() const;

 private:
  std::shared_ptr<BatchState> state_;
};

struct TransportStats {
  bool region_registered = false;
  uint64_t region_generation = 0;
  uint64_t outstanding_batches = 0;  // submitted, not yet complete
  uint64_t inflight_bytes = 0;       // bytes on connections / queue pairs, all peers
  uint64_t queued_bytes = 0;         // waiting for the in-flight budget, all peers
  uint64_t open_connections = 0;     // initiator connections or queue pairs
  uint64_t serving_connections = 0;  // connections / queue pairs served for peers
  uint64_t serving_active_requests = 0;
  uint64_t requests_refused = 0;  // serving side: descriptors or requests refused
  // Serving side: connections closed because the peer failed the membership proof (wrong cluster
  // secret, not our protocol, too slow) before any request was read.
  uint64_t handshakes_refused = 0;
  // Serving side: authenticated connections closed after idle_timeout without a request.
  uint64_t idle_closed = 0;
  uint64_t batches_completed = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // "tcp", "rdma", ...: the name used in the transport negotiation.
  virtual std::string_view name() const = 0;
  // What peers pass as PeerId::address to reach this transport ("127.0.0.1:PORT", a node name).
  virtual std::string endpoint() const = 0;

  // Registers the one region this transport serves and uses as local memory. `generation` is the
  // owner's segment generation (non-zero). FailedPrecondition when a region is registered already.
  virtual absl::Status RegisterRegion(uint64_t generation, void* base, uint64_t len) = 0;
  // Serves the registered region under `generation` from now on (non-zero); requests naming
  // the previous one are refused like any stale generation.
  virtual absl::Status SetRegionGeneration(uint64_t generation) = 0;
  // Cancels every outstanding batch, refuses new requests, and returns once no serving operation
  // or batch touches the region any more. NotFound when nothing is registered.
  virtual absl::Status UnregisterRegion() = 0;

  // Submits one batch to one peer. Cancelled once the transport is shutting down;
  // InvalidArgument for a bad op, an empty batch, more than kMaxDescriptorsPerBatch descriptors,
  // a zero or oversized length, or a local range outside the registered region;
  // FailedPrecondition when no region is registered. These checks are made here, once for every
  // transport, before DoSubmit; everything else (connection, peer refusal, deadline) arrives as
  // the batch's completion.
  absl::StatusOr<BatchHandle> Submit(const PeerId& peer, OpKind op,
                                     std::span<const Descriptor> descriptors,
                                     absl::Duration timeout);

  // The region's and every transport's common figures here; the rest from AddStats.
  TransportStats stats() const;

 protected:
  // Submit after its argument checks: `descriptors` is non-empty, within the limits and inside
  // the registered region.
  virtual absl::StatusOr<BatchHandle> DoSubmit(const PeerId& peer, OpKind op,
                                               std::span<const Descriptor> descriptors,
                                               absl::Duration timeout) = 0;
  // Adds the transport's own figures (batches, connections, serving side) to `s`.
  virtual void AddStats(TransportStats* s) const = 0;

  // The one region served and used as local memory (RegisterRegion/UnregisterRegion of the
  // transports manage it).
  RegisteredRegion region_;
  // Set when the transport begins shutting down: Submit refuses new batches from then on.
  std::atomic<bool> closing_{false};
};

// Picks the transport for one peer: the first entry of `local` (in local preference order) that
// `remote` also offers. NotFound naming both lists when there is none.
absl::StatusOr<std::string> ChooseTransport(std::span<const std::string> local,
                                            std::span<const std::string> remote);

}  // namespace fluxon::transport
