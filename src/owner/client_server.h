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
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "owner/owner_core.h"

namespace fluxon {

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

  class Impl;

 private:
  explicit ClientServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon
