// Fuzzes the client <-> owner frame decoder (src/rpc/frame.cc): arbitrary bytes arrive on a
// Unix socketpair, as a client or an owner would send them, and ReadFrame decodes frames until
// the stream ends, with the pre-Hello limit (kMaxHelloFrameBytes) or the full one
// (kMaxFrameBytes), parsing each body as a ClientRequest (what the owner reads) or an
// OwnerMessage (what the client reads). Optionally a descriptor travels with the first bytes
// (SCM_RIGHTS), as with the events connection.
//
// Input: byte 0 = flags (bit 0: Hello limit, bit 1: OwnerMessage, bit 2: pass a descriptor,
// bit 3: expect one), the rest is the stream.
//
// Checked: no crash, leak or UB; a frame is accepted only if its announced length is within the
// limit and its body parses; the decoder consumes exactly 4 + length bytes per accepted frame;
// an accepted message re-encodes (EncodeFrame) to a frame that decodes again; a received
// descriptor is reported (and closed here), an unexpected one is never leaked.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fluxon/v1/client.pb.h"
#include "fuzz/fuzz_check.h"
#include "rpc/frame.h"

namespace {

// The stream must fit the socket buffer: the writer never blocks (nothing reads concurrently).
constexpr size_t kMaxStream = 96 << 10;

template <typename Msg>
void DecodeAll(int rd, const uint8_t* stream, size_t n, uint32_t max_bytes, bool expect_fd) {
  size_t consumed = 0;
  for (int frames = 0; frames < 1024; ++frames) {
    Msg msg;
    int received = -2;
    fluxon::FrameReadOptions opts;
    opts.max_bytes = max_bytes;
    opts.deadline = std::chrono::steady_clock::now();  // never wait: the writer side is shut
    opts.received_fd = expect_fd ? &received : nullptr;
    absl::Status st = fluxon::ReadFrame(rd, &msg, opts);
    if (expect_fd) {
      FUZZ_CHECK(received >= -1);
      if (received >= 0) {
        FUZZ_CHECK(fcntl(received, F_GETFD) >= 0);
        ::close(received);
      }
    }
    if (!st.ok()) {
      FUZZ_CHECK(st.code() == absl::StatusCode::kUnavailable ||
                 st.code() == absl::StatusCode::kDataLoss ||
                 st.code() == absl::StatusCode::kDeadlineExceeded);
      if (st.code() == absl::StatusCode::kDataLoss && n - consumed >= 4) {
        uint32_t len;
        std::memcpy(&len, stream + consumed, 4);
        // Oversize: refused before any body byte. Malformed: the whole body was there.
        FUZZ_CHECK(len > max_bytes || n - consumed - 4 >= len);
      }
      return;
    }
    FUZZ_CHECK(n - consumed >= 4);
    uint32_t len;
    std::memcpy(&len, stream + consumed, 4);
    FUZZ_CHECK(len <= max_bytes);
    FUZZ_CHECK(n - consumed - 4 >= len);
    consumed += 4 + len;

    // Round trip: what was accepted encodes to a frame that decodes again.
    const std::string again = fluxon::EncodeFrame(msg);
    FUZZ_CHECK(again.size() >= 4);
    uint32_t again_len;
    std::memcpy(&again_len, again.data(), 4);
    FUZZ_CHECK(again_len == again.size() - 4);
    Msg back;
    FUZZ_CHECK(back.ParseFromArray(again.data() + 4, static_cast<int>(again_len)));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const uint8_t* stream = data + 1;
  size_t n = size - 1;
  if (n > kMaxStream) n = kMaxStream;
  const uint32_t max_bytes = (flags & 1) ? fluxon::kMaxHelloFrameBytes : fluxon::kMaxFrameBytes;
  const bool owner_message = flags & 2;
  const bool pass_fd = flags & 4;
  const bool expect_fd = flags & 8;

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  int sndbuf = 256 << 10;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  size_t sent = 0;
  if (pass_fd && n > 0) {
    // The first bytes carry a descriptor, like SendFrameWithFd does.
    int passed = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    FUZZ_CHECK(passed >= 0);
    const size_t first = n < 4 ? n : 4;
    FUZZ_CHECK(fluxon::SendFrameWithFd(
                   sv[0], std::string(reinterpret_cast<const char*>(stream), first), passed)
                   .ok());
    ::close(passed);
    sent = first;
  }
  while (sent < n) {
    const ssize_t w = send(sv[0], stream + sent, n - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w <= 0) break;  // buffer full: the rest of the stream is cut off
    sent += static_cast<size_t>(w);
  }
  shutdown(sv[0], SHUT_WR);

  if (owner_message) {
    DecodeAll<fluxon::v1::OwnerMessage>(sv[1], stream, sent, max_bytes, expect_fd);
  } else {
    DecodeAll<fluxon::v1::ClientRequest>(sv[1], stream, sent, max_bytes, expect_fd);
  }
  ::close(sv[0]);
  ::close(sv[1]);
  return 0;
}
