// Framing for the client <-> owner Unix-socket protocol: a uint32 little-endian length, then one
// serialized protobuf message. Blocking helpers for the client side, plus SCM_RIGHTS fd passing.
//
// Invariants: a frame is never larger than kMaxFrameBytes (a peer announcing more is cut off, so
// a corrupt length cannot make us allocate gigabytes); partial reads and writes are completed or
// reported as errors, never silently truncated.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"

namespace fluxon {

inline constexpr uint32_t kMaxFrameBytes = 64u << 20;
inline constexpr uint32_t kProtocolVersion = 1;

// Waits until `fd` is readable (or closed): polls without sleeping for up to `spin_us`
// microseconds, then blocks. Spinning first keeps back-to-back requests from paying a thread
// wake-up each (tens of microseconds on virtual machines) at the cost of a little CPU.
absl::Status WaitReadable(int fd, int64_t spin_us);

absl::Status WriteAll(int fd, const void* data, size_t len);
absl::Status ReadAll(int fd, void* data, size_t len);

absl::Status WriteFrame(int fd, const google::protobuf::MessageLite& msg);
// Reads one frame into `msg`. `received_fd`, when non-null, receives an fd passed with the frame
// (or -1).
absl::Status ReadFrame(int fd, google::protobuf::MessageLite* msg, int* received_fd = nullptr);

// Serializes `msg` into a frame (length prefix included).
std::string EncodeFrame(const google::protobuf::MessageLite& msg);
// Sends an already-encoded frame with `pass_fd` attached as SCM_RIGHTS.
absl::Status SendFrameWithFd(int socket_fd, const std::string& frame, int pass_fd);

}  // namespace fluxon
