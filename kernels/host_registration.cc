#include "fluxon/host_registration.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "fluxon/plan_blob.h"
#include "fluxon/status.h"

namespace fluxon {

absl::Status ValidateHostMappings(std::span<const HostMapping> mappings) {
  if (mappings.empty()) return absl::InvalidArgumentError("no host mappings to register");
  std::vector<const HostMapping*> sorted;
  for (const HostMapping& m : mappings) {
    if (m.base == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("host mapping '%s' has a null base address", m.label));
    }
    if (m.bytes == 0) {
      return absl::InvalidArgumentError(absl::StrFormat("host mapping '%s' is empty", m.label));
    }
    const auto begin = reinterpret_cast<uintptr_t>(m.base);
    if (begin + m.bytes < begin) {
      return absl::InvalidArgumentError(
          absl::StrFormat("host mapping '%s' wraps the address space", m.label));
    }
    sorted.push_back(&m);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const HostMapping* a, const HostMapping* b) { return a->base < b->base; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    const auto prev_end = reinterpret_cast<uintptr_t>(sorted[i - 1]->base) + sorted[i - 1]->bytes;
    if (reinterpret_cast<uintptr_t>(sorted[i]->base) < prev_end) {
      return absl::InvalidArgumentError(absl::StrFormat("host mappings '%s' and '%s' overlap",
                                                        sorted[i - 1]->label, sorted[i]->label));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HostRegistration>> HostRegistration::Register(
    std::span<const HostMapping> mappings) {
  FLUXON_RETURN_IF_ERROR(ValidateHostMappings(mappings));
  int device = -1;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    int can_use_host_pointer = 0;
    err = cudaDeviceGetAttribute(&can_use_host_pointer,
                                 cudaDevAttrCanUseHostPointerForRegisteredMem, device);
    if (err == cudaSuccess && !can_use_host_pointer) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "CUDA device %d cannot use host pointers of registered memory directly; Fluxon plans "
          "carry host addresses, so this platform is not supported",
          device));
    }
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot register Fluxon host memory with CUDA: %s (%s)",
                        cudaGetErrorName(err), cudaGetErrorString(err)));
  }

  std::vector<HostMapping> done;
  auto unwind = [&done] {
    for (const HostMapping& m : done) cudaHostUnregister(m.base);
  };
  for (const HostMapping& m : mappings) {
    err = cudaHostRegister(m.base, m.bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (err != cudaSuccess) {
      cudaGetLastError();  // reported here; must not surface again in another library's check
      unwind();
      return absl::InternalError(absl::StrFormat(
          "cudaHostRegister of host mapping '%s' (%p, %d bytes) failed: %s (%s); refusing to "
          "run the data plane on unregistered memory",
          m.label, m.base, m.bytes, cudaGetErrorName(err), cudaGetErrorString(err)));
    }
    done.push_back(m);
    void* device_ptr = nullptr;
    err = cudaHostGetDevicePointer(&device_ptr, m.base, 0);
    if (err != cudaSuccess || device_ptr != m.base) {
      cudaGetLastError();
      unwind();
      return absl::InternalError(absl::StrFormat(
          "host mapping '%s' at %p is seen by the device at %p (%s): kernels could not use "
          "plan addresses unchanged",
          m.label, m.base, device_ptr, cudaGetErrorName(err)));
    }
  }
  return std::unique_ptr<HostRegistration>(new HostRegistration(std::move(done)));
}

HostRegistration::HostRegistration(std::vector<HostMapping> mappings)
    : mappings_(std::move(mappings)) {}

HostRegistration::~HostRegistration() {
  for (const HostMapping& m : mappings_) cudaHostUnregister(m.base);
}

bool HostRegistration::Contains(uint64_t ptr, uint64_t bytes) const {
  for (const HostMapping& m : mappings_) {
    const auto begin = reinterpret_cast<uint64_t>(m.base);
    if (ptr >= begin && bytes <= m.bytes && ptr - begin <= m.bytes - bytes) return true;
  }
  return false;
}

}  // namespace fluxon
