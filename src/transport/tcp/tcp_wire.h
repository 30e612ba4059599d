// The TCP transport's wire format (one request, one reply; both ends are the same build and
// little-endian: x86-64 and aarch64 owners).
//
//   request: RequestHeader, WireDescriptor[descriptor_count], then for writes the payload (the
//            descriptors' bytes, in order).
//   reply:   ReplyHeader, message[message_bytes] (why a request was refused), status code
//            (absl::StatusCode, one byte) per descriptor, then for reads the payload: the bytes of
//            the descriptors whose code is OK, in order.
//
// A request that breaks the format (bad magic or version, too many descriptors, a total over
// kMaxRequestBytes, a write whose payload length is not the sum of its descriptors) is a protocol
// error: the server closes the connection without touching the region. A well-formed request with
// a wrong generation or bad ranges is answered with the refusal and the connection stays open.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "transport/transport.h"

namespace fluxon::transport::tcp {

inline constexpr uint32_t kRequestMagic = 0x46585452;  // "FXTR"
inline constexpr uint32_t kReplyMagic = 0x46585250;    // "FXRP"
inline constexpr uint8_t kWireVersion = 1;
inline constexpr uint32_t kMaxDescriptorsPerRequest = 4096;
inline constexpr uint64_t kMaxRequestBytes = uint64_t{64} << 20;
inline constexpr uint32_t kMaxReplyMessageBytes = 1024;

struct RequestHeader {
  uint32_t magic = kRequestMagic;
  uint8_t version = kWireVersion;
  uint8_t op = 0;  // OpKind
  uint16_t reserved0 = 0;
  uint32_t descriptor_count = 0;
  uint32_t reserved1 = 0;
  uint64_t generation = 0;
  uint64_t request_id = 0;
  uint64_t payload_bytes = 0;  // writes: the sum of the descriptors' lengths; reads: 0
};
static_assert(sizeof(RequestHeader) == 40);

struct WireDescriptor {
  uint64_t offset = 0;
  uint64_t len = 0;
};
static_assert(sizeof(WireDescriptor) == 16);

struct ReplyHeader {
  uint32_t magic = kReplyMagic;
  uint32_t descriptor_count = 0;
  uint64_t request_id = 0;
  uint8_t status_code = 0;  // absl::StatusCode of the whole request (OK or the refusal)
  uint8_t reserved[3] = {0, 0, 0};
  uint32_t message_bytes = 0;
  uint64_t payload_bytes = 0;  // reads: the sum of the OK descriptors' lengths
};
static_assert(sizeof(ReplyHeader) == 32);

// Header checks done before reading anything else of the request.
absl::Status ValidateRequestHeader(const RequestHeader& h);
// Checks the descriptor lengths (overflow-safe sum <= kMaxRequestBytes; each length >=1) and,
// for writes, that payload_bytes equals that sum.
absl::Status ValidateRequestDescriptors(const RequestHeader& h,
                                        std::span<const WireDescriptor> descriptors);

}  // namespace fluxon::transport::tcp
