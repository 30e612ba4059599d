// Blocking scatter/gather socket I/O straight from and into caller memory.
//
// Both functions move every byte described by `iov` (they advance the iovec array in place over
// partial transfers, IOV_MAX entries per system call) or return an error: Unavailable naming the
// errno for a reset or closed connection. Neither allocates.
#pragma once

#include <sys/uio.h>

#include <span>

#include "absl/status/status.h"

namespace fluxon::transport {

// `flags` are passed to sendmsg (MSG_NOSIGNAL is always added; MSG_ZEROCOPY is honoured).
absl::Status SendAll(int fd, std::span<iovec> iov, int flags = 0);
absl::Status RecvAll(int fd, std::span<iovec> iov);
// Reaps MSG_ZEROCOPY completion notifications without blocking; returns how many were reaped.
int DrainZerocopyCompletions(int fd);

}  // namespace fluxon::transport
