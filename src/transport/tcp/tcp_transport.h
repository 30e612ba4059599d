// TcpTransport: the Transport over TCP (the default where no RDMA exists).
//
// Initiator: per peer address, `connections_per_peer` connections, each with a sender thread and
// a receiver thread (full duplex, so a connection carries several requests at once without any
// deadlock between a large request and a large reply). A batch is cut into requests of at most
// `request_bytes` (descriptors are split at request boundaries), queued on the peer, and the
// connections' senders take requests from the queue while the peer's in-flight bytes stay within
// `max_inflight_bytes_per_peer`. Payloads go straight between the socket and the caller's memory
// (sendmsg/recvmsg iovecs; no intermediate buffer, no per-value allocation).
//
// Handshake: before any request, both ends of a connection prove they hold the cluster secret
// (tcp_handshake.h); a serving connection that fails it is closed without reading a request, an
// initiator that fails it gets PermissionDenied for the batch.
//
// Serving side: Boost.Asio accepts; each connection is served by one thread with blocking
// sendmsg/recvmsg straight from and into the registered region, after validating the request
// (tcp_wire.h, RegisteredRegion).
//
// Invariants and why:
// - A request is in exactly one place: the peer's queue, or one connection's `sent` FIFO (from
//   the moment its sender takes it until its reply is consumed or the connection is torn down).
//   Only the receiver of a connection (or the connection's teardown, after its sender has left
//   its send call) finishes the requests of its FIFO, so a unit is finished only when no thread
//   touches its memory.
// - Aborting a batch (cancel, deadline) drops its queued requests and shuts down the connections
//   that carry its in-flight ones ("deliberate" teardown); other batches' requests on those
//   connections are requeued (reads and writes are idempotent), at most kMaxAttempts times.
// - A connection that fails on its own (reset, EOF: the peer died) fails the whole peer: every
//   batch with a request queued or in flight to it is aborted with Unavailable at once and every
//   connection of the peer is torn down; the next Submit connects again.
// - Lock order: Peer::mu_ -> Connection::mu_ -> (BatchState, BatchRegistry). Abort() is never
//   called with a peer or connection lock held.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "transport/batch.h"
#include "transport/region.h"
#include "transport/transport.h"

namespace fluxon::transport {

struct TcpTransportOptions {
  std::string listen_address = "127.0.0.1:0";  // serving side; empty: initiator only
  int connections_per_peer = 4;
  uint64_t request_bytes = uint64_t{4} << 20;  // at most tcp::kMaxRequestBytes
  uint64_t max_inflight_bytes_per_peer = uint64_t{256} << 20;
  // A batch larger than one request per connection gets requests of its share per connection
  // instead (batch bytes / connections_per_peer, at most max_inflight_bytes_per_peer /
  // connections_per_peer and tcp::kMaxRequestBytes): fewer requests, so fewer wake-ups between
  // the submit, the senders and the completion. Off: requests of request_bytes.
  bool requests_of_connection_share = false;
  absl::Duration connect_timeout = absl::Seconds(2);
  // Serving side: connections at most (each has a thread), and of them at most
  // max_unauthenticated_connections still in the handshake (more are closed at once, so silent
  // connects cannot take the places of members). 1024 serves 256 requesters at 4 connections.
  int max_serving_connections = 1024;
  int max_unauthenticated_connections = 64;
  // An authenticated serving connection with no request for this long is closed (the
  // initiator reconnects on its next batch).
  absl::Duration idle_timeout = absl::Seconds(300);
  bool zerocopy_send = false;  // MSG_ZEROCOPY for read replies (measured in bench/transport_bench)
  // Every connection starts with the mutual cluster-secret handshake (tcp_handshake.h), served
  // and initiated with this secret; a serving connection must complete it within
  // handshake_timeout (an initiator within its connect deadline).
  std::string cluster_secret;
  absl::Duration handshake_timeout = absl::Seconds(1);
  // Serving side: whether a peer may WRITE [offset, offset + len) of the region. Null: every
  // WRITE is refused (PermissionDenied per descriptor; the payload is read and discarded). An
  // owner never writes to a peer, so fluxond leaves it null.
  std::function<bool(uint64_t offset, uint64_t len)> write_filter;
};

// The largest request a batch of `batch_bytes` is cut into under `options`
// (requests_of_connection_share).
uint64_t TcpRequestLimit(const TcpTransportOptions& options, uint64_t batch_bytes);

class TcpTransport final : public Transport {
 public:
  static absl::StatusOr<std::unique_ptr<TcpTransport>> Create(TcpTransportOptions options);
  ~TcpTransport() override;

  std::string_view name() const override { return "tcp"; }
  std::string endpoint() const override { return endpoint_; }
  absl::Status RegisterRegion(uint64_t generation, void* base, uint64_t len) override;
  absl::Status SetRegionGeneration(uint64_t generation) override;
  absl::Status UnregisterRegion() override;

  // The bytes in flight on each usable connection to `address` (empty: none); a batch's requests
  // are spread so that these differ by at most one request.
  std::vector<uint64_t> ConnectionLoads(const std::string& address) const;

  class Peer;
  class Server;

 private:
  explicit TcpTransport(TcpTransportOptions options);
  absl::StatusOr<BatchHandle> DoSubmit(const PeerId& peer, OpKind op,
                                       std::span<const Descriptor> descriptors,
                                       absl::Duration timeout) override;
  void AddStats(TransportStats* s) const override;
  Peer* GetPeer(const std::string& address);
  void RequestReconnect(Peer* peer);
  void ReconnectLoop();

  const TcpTransportOptions options_;
  std::string endpoint_;
  BatchRegistry registry_;
  std::unique_ptr<Server> server_;

  mutable Mutex peers_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(peers_mu_);

  // Connects peers whose queued requests lost their last connection to a deliberate teardown.
  Mutex reconnect_mu_;
  CondVar reconnect_cv_;
  std::vector<Peer*> reconnect_queue_ ABSL_GUARDED_BY(reconnect_mu_);
  bool reconnect_stop_ ABSL_GUARDED_BY(reconnect_mu_) = false;
  std::thread reconnector_;  // last: started after everything it uses
};

}  // namespace fluxon::transport
