// Fuzzes the TCP transport's request decoding on the serving side, step by step as
// TcpTransport::Server::Serve does it: a RequestHeader (ValidateRequestHeader), its
// descriptors (ValidateRequestDescriptors), the region lease for the request's generation
// (RegisteredRegion::Acquire) and the per-descriptor bounds check (CheckRange). The region is a
// heap buffer of exactly its registered length, so AddressSanitizer reports any access the
// decoder lets through outside it; every accepted descriptor is then read (and, for writes,
// written) in full, and checked against the region bounds without overflow.
//
// Input: region length (2 bytes), region generation (1 byte), then the request bytes as they
// arrive on the connection (header, descriptors; more requests may follow).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "transport/region.h"
#include "transport/tcp/tcp_wire.h"

namespace {

namespace tcp = fluxon::transport::tcp;
using fluxon::transport::OpKind;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint64_t region_len = 1 + (data[0] | (data[1] << 8));
  const uint64_t generation = 1 + data[2] % 4;  // requests often carry the right one
  data += 3;
  size -= 3;
  std::vector<uint8_t> region(region_len);
  fluxon::transport::RegisteredRegion reg;
  FUZZ_CHECK(reg.Register(generation, region.data(), region_len).ok());

  for (int requests = 0; requests < 64; ++requests) {
    tcp::RequestHeader h;
    if (size < sizeof(h)) break;  // the connection ends mid-header
    std::memcpy(&h, data, sizeof(h));
    data += sizeof(h);
    size -= sizeof(h);
    if (!tcp::ValidateRequestHeader(h).ok()) break;  // protocol error: connection closed
    FUZZ_CHECK(h.magic == tcp::kRequestMagic && h.version == tcp::kWireVersion);
    FUZZ_CHECK(h.op == static_cast<uint8_t>(OpKind::kRead) ||
               h.op == static_cast<uint8_t>(OpKind::kWrite));
    FUZZ_CHECK(h.descriptor_count >= 1 && h.descriptor_count <= tcp::kMaxDescriptorsPerRequest);
    FUZZ_CHECK(h.payload_bytes <= tcp::kMaxRequestBytes);

    std::vector<tcp::WireDescriptor> wire(h.descriptor_count);
    const size_t wire_bytes = wire.size() * sizeof(tcp::WireDescriptor);
    if (size < wire_bytes) break;  // the connection ends mid-descriptors
    std::memcpy(wire.data(), data, wire_bytes);
    data += wire_bytes;
    size -= wire_bytes;
    if (!tcp::ValidateRequestDescriptors(h, wire).ok()) break;
    uint64_t total = 0;
    for (const tcp::WireDescriptor& d : wire) {
      FUZZ_CHECK(d.len >= 1 && d.len <= tcp::kMaxRequestBytes - total);
      total += d.len;
    }
    if (h.op == static_cast<uint8_t>(OpKind::kWrite)) FUZZ_CHECK(total == h.payload_bytes);

    absl::StatusOr<fluxon::transport::RegisteredRegion::Lease> lease = reg.Acquire(h.generation);
    if (!lease.ok()) {
      FUZZ_CHECK(h.generation != generation);
      continue;  // refused, the connection stays open
    }
    FUZZ_CHECK(h.generation == generation);
    const fluxon::transport::RegionView& view = lease->view();
    FUZZ_CHECK(view.base == region.data() && view.len == region_len);
    uint64_t ok_bytes = 0;
    for (const tcp::WireDescriptor& d : wire) {
      if (!fluxon::transport::CheckRange(view.len, d.offset, d.len).ok()) continue;
      uint64_t end;
      FUZZ_CHECK(!__builtin_add_overflow(d.offset, d.len, &end) && end <= view.len);
      // What Serve does with an accepted descriptor: receive into it or send from it.
      uint8_t* p = view.base + d.offset;
      if (h.op == static_cast<uint8_t>(OpKind::kWrite)) {
        std::memset(p, static_cast<int>(d.len), d.len);
      } else {
        volatile uint8_t sink = 0;
        sink = sink + p[0] + p[d.len - 1];
      }
      ok_bytes += d.len;
    }
    FUZZ_CHECK(ok_bytes <= total);
  }
  FUZZ_CHECK(reg.active_leases() == 0);
  FUZZ_CHECK(reg.Unregister(absl::Seconds(1)).ok());
  return 0;
}
