// ClientServer: the owner's Unix-socket endpoint for inference processes (the hot path). Framed
// protobuf over a stream socket, driven by Boost.Asio; the segment fd is passed on Hello.
//
// Invariants:
// - The socket file is created with mode 0600 (0660 and the configured group when socket_group
//   is set) and every peer is checked with SO_PEERCRED: same uid, root, or a member of that group.
// - A control connection carries one request at a time; responses are written in request order.
// - A client session is its events connection: PutDone events for the session's puts are queued
//   to it (bounded; an unread queue past the bound closes the session), and when it closes the
//   owner aborts the session's prepared puts and releases its handles and views.
// - Every put/get request (ClientRequestType) is timed from the moment its frame is parsed to the
//   moment its reply is queued, into that type's histogram, whatever the reply's status; it is
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
  int io_threads = 4;
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
