// ClientServer: the owner's Unix-socket endpoint for inference processes (the hot path). Framed
// protobuf over a stream socket (Boost.Asio accepts; each connection is served by its own thread
// with blocking I/O); the segment fd is passed on Hello.
//
// Invariants:
// - The socket file is created with mode 0600 (0660 and the configured group when socket_group
//   is set) and every peer is checked with SO_PEERCRED: same uid, root, or a member of that group
//   (primary or supplementary, read with SO_PEERGROUPS).
// - The first frame of a connection is a Hello (at most kMaxHelloFrameBytes, within
//   hello_timeout); anything else closes the connection. Every later frame must arrive whole
//   within frame_timeout and be at most kMaxFrameBytes. A connection that breaks a rule is told
//   why (an id-0 error frame) and closed at once, not at the next accept.
// - Sessions are the owner's: a Hello with client_id 0 opens one and gets its id and a 128-bit
//   random secret; another connection joins it only with both, and only from the same uid and
//   pid. Puts and handles belong to their session (another session's ids are NotFound).
// - A session ends when its last connection (control or events) closes: then the owner aborts
//   its prepared puts and releases its handles and views (one place, whatever closed last).
// - A control connection carries one request at a time; its thread answers in order. After an
//   answer the thread polls for the next request for up to busy_poll_us before sleeping, so the
//   several round trips of one batch (start, transfer, release) do not each pay a wake-up.
// - PutDone events for a session's puts are queued to its events connection (bounded; a session
//   that stops reading past the bound has that connection closed).
// - Connections are bounded (max_connections; one more is refused with a clear error frame);
//   Stop closes every socket and joins every thread.
// - Every put/get request (ClientRequestType) is timed from the moment its frame is parsed to the
//   moment its reply is written, into that type's histogram, whatever the reply's status; it is
//   recorded before the reply leaves, so a client holding its reply finds the request counted.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/latency_histogram.h"
#include "config/config.h"
#include "owner/owner_core.h"

namespace fluxon {

// The client requests whose latency is recorded.
enum class ClientRequestType {
  kPutStart,
  kPutCommit,
  kPutAbort,
  kGetStart,
  kGetTransfer,
  kCancelGet,
  kReleaseViews,
};
inline constexpr int kNumClientRequestTypes = 7;
// "put_start", "put_commit", ... (the `request` label of the latency histogram).
const char* ClientRequestTypeName(ClientRequestType type);
using ClientRequestLatencies = std::array<LatencyHistogram, kNumClientRequestTypes>;

// The client socket's settings (their one definition, defaults included: config/settings.h).
struct ClientServerOptions {
  static ClientServerOptions FromConfig(const OwnerConfig& config) {
    return ClientServerOptions{config.socket_path,   config.socket_group,
                               config.busy_poll_us,  static_cast<size_t>(config.max_connections),
                               config.hello_timeout, config.frame_timeout};
  }
  std::string socket_path;
  std::string socket_group;  // empty: owner's uid only
  int64_t busy_poll_us;
  size_t max_connections;
  std::chrono::milliseconds hello_timeout;
  std::chrono::milliseconds frame_timeout;
};

class ClientServer {
 public:
  static absl::StatusOr<std::unique_ptr<ClientServer>> Start(OwnerCore* core,
                                                             ClientServerOptions options);
  ~ClientServer();
  void Stop();
  size_t sessions() const;
  // Latency of each request type, indexed by ClientRequestType.
  const ClientRequestLatencies& latencies() const;

  class Impl;

 private:
  explicit ClientServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon
