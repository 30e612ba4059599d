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
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "owner/owner_core.h"

namespace fluxon {

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

  class Impl;

 private:
  explicit ClientServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon
