// ClientServer: the owner's Unix-socket endpoint for inference processes (the hot path). Framed
// protobuf over a stream socket (Boost.Asio accepts; each connection is served by its own thread
// with blocking I/O); the segment fd is passed on Hello.
//
// Invariants:
// - The socket file is created with mode 0600 (0660 and the configured group when socket_group
//   is set) and every peer is checked with SO_PEERCRED: same uid, root, or that group.
// - A control connection carries one request at a time; its thread answers in order. After an
//   answer the thread polls for the next request for up to busy_poll_us before sleeping, so the
//   several round trips of one batch (start, transfer, release) do not each pay a wake-up.
// - A client session is its events connection: PutDone events for the session's puts are queued
//   to it (bounded; a session that stops reading past the bound is closed), and when it closes the
//   owner aborts the session's prepared puts and releases its handles and views.
// - Connections are bounded (max_connections); Stop closes every socket and joins every thread.
// - Every put/get request (ClientRequestType) is timed from the moment its frame is parsed to the
//   moment its reply is written, into that type's histogram, whatever the reply's status; it is
//   recorded before the reply leaves, so a client holding its reply finds the request counted.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/latency_histogram.h"
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

struct ClientServerOptions {
  std::string socket_path;
  std::string socket_group;  // empty: owner's uid only
  int64_t busy_poll_us = 200;
  size_t max_connections = 1024;
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
