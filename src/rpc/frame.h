// Framing for the client <-> owner Unix-socket protocol: a uint32 little-endian length, then one
// serialized protobuf message. Blocking helpers with deadlines, plus SCM_RIGHTS fd passing.
//
// Invariants:
// - A frame is never larger than the reader's limit (kMaxFrameBytes at most; a server passes a
//   much smaller one until the peer said Hello). A peer announcing more is refused before any
//   body byte is read, so a corrupt or hostile length cannot make the reader allocate.
// - The body buffer grows as bytes arrive (at most twice what was received, never the announced
//   length up front): four bytes on the wire never cost 64 MiB of memory.
// - With a deadline every wait is bounded: a frame that does not arrive whole in time fails with
//   DeadlineExceeded. Partial reads and writes are completed or reported, never truncated.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"

namespace fluxon {

inline constexpr uint32_t kMaxFrameBytes = 64u << 20;
// What a connection that has not said Hello may announce (a Hello is a few dozen bytes).
inline constexpr uint32_t kMaxHelloFrameBytes = 64u << 10;
inline constexpr uint32_t kProtocolVersion = 2;

using FrameDeadline = std::optional<std::chrono::steady_clock::time_point>;

// Waits until `fd` is readable (or closed): polls without sleeping for up to `spin_us`
// microseconds, then blocks until `deadline` (forever when unset; DeadlineExceeded after it).
// Spinning first keeps back-to-back requests from paying a thread wake-up each (tens of
// microseconds on virtual machines) at the cost of a little CPU.
absl::Status WaitReadable(int fd, int64_t spin_us, FrameDeadline deadline = std::nullopt);

absl::Status WriteAll(int fd, const void* data, size_t len);

absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& msg);

struct FrameReadOptions {
  uint32_t max_bytes = kMaxFrameBytes;
  FrameDeadline deadline;  // unset: wait forever
  // Where a descriptor passed with the frame (SCM_RIGHTS) lands (-1 when none); null: none is
  // expected (one that arrives anyway is closed).
  int* received_fd = nullptr;
};
// Reads one frame into `msg`. Unavailable when the peer closed, DataLoss for an oversize or
// malformed frame, DeadlineExceeded when the deadline passed.
absl::Status ReadFrame(int fd, google::protobuf::MessageLite* msg,
                       const FrameReadOptions& options = {});

// Serializes `msg` into a frame (length prefix included).
std::string EncodeFrame(const google::protobuf::MessageLite& msg);
// Sends an already-encoded frame with `pass_fd` attached as SCM_RIGHTS.
absl::Status SendFrameWithFd(int socket_fd, const std::string& frame, int pass_fd);

}  // namespace fluxon
