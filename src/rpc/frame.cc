#include "rpc/frame.h"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace fluxon {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status IoError(const char* what) {
  if (errno == EPIPE || errno == ECONNRESET) {
    return absl::UnavailableError(absl::StrFormat("%s: connection closed by peer", what));
  }
  return absl::UnavailableError(absl::StrFormat("%s: %s", what, std::strerror(errno)));
}

void WaitWritable(int fd) {
  pollfd p{fd, POLLOUT, 0};
  poll(&p, 1, 1000);
}

// poll() timeout for `deadline`: -1 (forever) when unset, else the remaining ms (>= 0).
int PollTimeoutMs(const FrameDeadline& deadline) {
  if (!deadline) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1'000'000));
}

absl::Status DeadlinePassed() {
  return absl::DeadlineExceededError("the peer did not send a whole frame in time");
}

// Reads exactly `len` bytes, each wait bounded by `deadline`.
absl::Status ReadExactly(int fd, char* p, size_t len, const FrameDeadline& deadline) {
  while (len > 0) {
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n == 0) return absl::UnavailableError("connection closed by the peer");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return IoError("read");
      pollfd pf{fd, POLLIN, 0};
      const int timeout = PollTimeoutMs(deadline);
      if (timeout == 0) return DeadlinePassed();
      const int r = poll(&pf, 1, timeout);
      if (r < 0 && errno != EINTR) return IoError("poll");
      if (r == 0) return DeadlinePassed();
      continue;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WaitReadable(int fd, int64_t spin_us, FrameDeadline deadline) {
  pollfd p{fd, POLLIN, 0};
  if (spin_us > 0) {
    const auto spin_end = Clock::now() + std::chrono::microseconds(spin_us);
    for (;;) {
      const int n = poll(&p, 1, 0);
      if (n > 0) return absl::OkStatus();
      if (n < 0 && errno != EINTR) return IoError("poll");
      const auto now = Clock::now();
      if (now >= spin_end || (deadline && now >= *deadline)) break;
      sched_yield();  // lets a runnable thread (e.g. the publisher) have this core while we wait
    }
  }
  for (;;) {
    const int timeout = PollTimeoutMs(deadline);
    const int n = poll(&p, 1, timeout);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) return IoError("poll");
    if (n == 0 && deadline && Clock::now() >= *deadline) {
      return absl::DeadlineExceededError("no answer before the deadline");
    }
  }
}

absl::Status WriteAll(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        WaitWritable(fd);
        continue;
      }
      return IoError("write");
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string EncodeFrame(const google::protobuf::MessageLite& msg) {
  const size_t size = msg.ByteSizeLong();
  std::string out(4 + size, '\0');
  const uint32_t len = static_cast<uint32_t>(size);
  std::memcpy(out.data(), &len, 4);
  msg.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(out.data() + 4));
  return out;
}

absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& msg) {
  const std::string frame = EncodeFrame(msg);
  return WriteAll(fd, frame.data(), frame.size());
}

absl::Status ReadFrame(int fd, google::protobuf::MessageLite* msg,
                       const FrameReadOptions& options) {
  if (options.received_fd != nullptr) *options.received_fd = -1;
  uint32_t len = 0;
  // The length prefix arrives together with any passed descriptor.
  char cbuf[CMSG_SPACE(sizeof(int))];
  iovec iov{&len, 4};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf;
  mh.msg_controllen = sizeof cbuf;
  ssize_t n;
  for (;;) {
    n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n >= 0) break;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IoError("recvmsg");
    absl::Status st = WaitReadable(fd, 0, options.deadline);
    if (!st.ok()) return st.code() == absl::StatusCode::kDeadlineExceeded ? DeadlinePassed() : st;
  }
  if (n == 0) return absl::UnavailableError("connection closed by the peer");
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int passed = -1;
      std::memcpy(&passed, CMSG_DATA(c), sizeof(int));
      if (options.received_fd != nullptr && *options.received_fd < 0) {
        *options.received_fd = passed;
      } else {
        ::close(passed);  // not expected here: never leak it
      }
    }
  }
  if (n < 4) {
    absl::Status s = ReadExactly(fd, reinterpret_cast<char*>(&len) + n, 4 - static_cast<size_t>(n),
                                 options.deadline);
    if (!s.ok()) return s;
  }
  if (len > options.max_bytes) {
    return absl::DataLossError(
        absl::StrFormat("frame of %d bytes exceeds the %d-byte limit", len, options.max_bytes));
  }
  // Grow with what arrives: at most twice the bytes received, never `len` up front.
  constexpr size_t kFirstChunk = 64 << 10;
  std::string body;
  size_t have = 0;
  while (have < len) {
    const size_t target = std::min<size_t>(len, std::max(kFirstChunk, 2 * have));
    body.resize(target);
    absl::Status s = ReadExactly(fd, body.data() + have, target - have, options.deadline);
    if (!s.ok()) return s;
    have = target;
  }
  if (!msg->ParseFromString(body)) return absl::DataLossError("malformed frame");
  return absl::OkStatus();
}

absl::Status SendFrameWithFd(int socket_fd, const std::string& frame, int pass_fd) {
  char cbuf[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{const_cast<char*>(frame.data()), frame.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf;
  mh.msg_controllen = sizeof cbuf;
  cmsghdr* c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  ssize_t n;
  for (;;) {
    n = sendmsg(socket_fd, &mh, MSG_NOSIGNAL);
    if (n >= 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {
      WaitWritable(socket_fd);
      continue;
    }
    return IoError("sendmsg");
  }
  if (static_cast<size_t>(n) < frame.size()) {
    return WriteAll(socket_fd, frame.data() + n, frame.size() - static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace fluxon
