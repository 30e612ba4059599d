#include "transport/tcp/socket_io.h"

#include <errno.h>
#include <limits.h>
#include <linux/errqueue.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace fluxon::transport {
namespace {

// Drops `n` transferred bytes from the front of `iov`; returns the new first index.
size_t Advance(std::span<iovec> iov, size_t first, size_t n) {
  while (n > 0 && first < iov.size()) {
    if (n >= iov[first].iov_len) {
      n -= iov[first].iov_len;
      iov[first].iov_len = 0;
      ++first;
    } else {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + n;
      iov[first].iov_len -= n;
      n = 0;
    }
  }
  while (first < iov.size() && iov[first].iov_len == 0) ++first;
  return first;
}

absl::Status ErrnoStatus(const char* what, int err) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

}  // namespace

absl::Status SendAll(int fd, std::span<iovec> iov, int flags) {
  size_t first = Advance(iov, 0, 0);
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = &iov[first];
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t n = ::sendmsg(fd, &msg, flags | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ENOBUFS && (flags & MSG_ZEROCOPY)) {  // out of optmem: send this one copied
        flags &= ~MSG_ZEROCOPY;
        continue;
      }
      return ErrnoStatus("send", errno);
    }
    first = Advance(iov, first, static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, std::span<iovec> iov) {
  size_t first = Advance(iov, 0, 0);
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = &iov[first];
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t n = ::recvmsg(fd, &msg, MSG_WAITALL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("recv", errno);
    }
    if (n == 0) return absl::UnavailableError("connection closed by the peer");
    first = Advance(iov, first, static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

int DrainZerocopyCompletions(int fd) {
  int reaped = 0;
  for (;;) {
    char control[128];
    msghdr msg{};
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    if (::recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) return reaped;
    ++reaped;
  }
}

}  // namespace fluxon::transport
