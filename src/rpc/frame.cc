#include "rpc/frame.h"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/strings/str_format.h"

namespace fluxon {
namespace {

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

}  // namespace

absl::Status WaitReadable(int fd, int64_t spin_us) {
  pollfd p{fd, POLLIN, 0};
  if (spin_us > 0) {
    timespec start{}, now{};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
      const int n = poll(&p, 1, 0);
      if (n > 0) return absl::OkStatus();
      if (n < 0 && errno != EINTR) return IoError("poll");
      clock_gettime(CLOCK_MONOTONIC, &now);
      const int64_t elapsed_us =
          (now.tv_sec - start.tv_sec) * 1'000'000 + (now.tv_nsec - start.tv_nsec) / 1000;
      if (elapsed_us >= spin_us) break;
      sched_yield();  // lets a runnable thread (e.g. the publisher) have this core while we wait
    }
  }
  for (;;) {
    const int n = poll(&p, 1, -1);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) return IoError("poll");
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

absl::Status ReadAll(int fd, void* data, size_t len) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = recv(fd, p, len, 0);
    if (n == 0) return absl::UnavailableError("connection closed by the owner");
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("read");
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

absl::Status ReadFrame(int fd, google::protobuf::MessageLite* msg, int* received_fd) {
  if (received_fd != nullptr) *received_fd = -1;
  uint32_t len = 0;
  if (received_fd != nullptr) {
    // The length prefix arrives together with any passed descriptor.
    char cbuf[CMSG_SPACE(sizeof(int))];
    iovec iov{&len, 4};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    ssize_t n;
    do {
      n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n == 0) return absl::UnavailableError("connection closed by the owner");
    if (n < 0) return IoError("recvmsg");
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        std::memcpy(received_fd, CMSG_DATA(c), sizeof(int));
      }
    }
    if (n < 4) {
      absl::Status s = ReadAll(fd, reinterpret_cast<char*>(&len) + n, 4 - static_cast<size_t>(n));
      if (!s.ok()) return s;
    }
  } else {
    absl::Status s = ReadAll(fd, &len, 4);
    if (!s.ok()) return s;
  }
  if (len > kMaxFrameBytes) {
    return absl::DataLossError(
        absl::StrFormat("frame of %d bytes exceeds the %d-byte limit", len, kMaxFrameBytes));
  }
  std::string body(len, '\0');
  absl::Status s = ReadAll(fd, body.data(), len);
  if (!s.ok()) return s;
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
