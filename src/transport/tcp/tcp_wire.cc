#include "transport/tcp/tcp_wire.h"

#include "absl/strings/str_cat.h"

namespace fluxon::transport::tcp {

absl::Status ValidateRequestHeader(const RequestHeader& h) {
  if (h.magic != kRequestMagic) return absl::DataLossError("bad request magic");
  if (h.version != kWireVersion) {
    return absl::DataLossError(
        absl::StrCat("wire version ", h.version, ", expected ", kWireVersion));
  }
  if (h.op != static_cast<uint8_t>(OpKind::kRead) && h.op != static_cast<uint8_t>(OpKind::kWrite)) {
    return absl::DataLossError(absl::StrCat("unknown op ", h.op));
  }
  if (h.descriptor_count == 0 || h.descriptor_count > kMaxDescriptorsPerRequest) {
    return absl::DataLossError(absl::StrCat("descriptor count ", h.descriptor_count,
                                            " outside [1, ", kMaxDescriptorsPerRequest, "]"));
  }
  if (h.payload_bytes > kMaxRequestBytes) {
    return absl::DataLossError(
        absl::StrCat("payload of ", h.payload_bytes, " bytes over ", kMaxRequestBytes));
  }
  if (h.op == static_cast<uint8_t>(OpKind::kRead) && h.payload_bytes != 0) {
    return absl::DataLossError("a read request carries no payload");
  }
  return absl::OkStatus();
}

absl::Status ValidateRequestDescriptors(const RequestHeader& h,
                                        std::span<const WireDescriptor> descriptors) {
  uint64_t total = 0;
  for (const WireDescriptor& d : descriptors) {
    if (d.len == 0) return absl::DataLossError("zero-length descriptor");
    if (d.len > kMaxRequestBytes - total) {
      return absl::DataLossError(
          absl::StrCat("descriptors total more than ", kMaxRequestBytes, " bytes"));
    }
    total += d.len;
  }
  if (h.op == static_cast<uint8_t>(OpKind::kWrite) && total != h.payload_bytes) {
    return absl::DataLossError(
        absl::StrCat("write payload of ", h.payload_bytes, " bytes, descriptors total ", total));
  }
  return absl::OkStatus();
}

}  // namespace fluxon::transport::tcp
