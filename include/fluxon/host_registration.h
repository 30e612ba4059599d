// Registers Fluxon's host memory (segment mappings and the plan-blob arena) with CUDA so that the
// data-plane kernels and copy engines can reach it.
//
// Invariants and why:
// - Registration is all or nothing: if any mapping fails to register, the ones already registered
//   are unregistered and the error names the failing mapping. There is never a silent fallback to
//   unregistered memory: a kernel dereferencing an unregistered host address faults and poisons the
//   caller's CUDA context, and a copy engine silently degrades to staged copies.
// - Mappings are registered with cudaHostRegisterMapped | cudaHostRegisterPortable in the CUDA
//   context current on the calling thread, and the device must be able to use the host addresses
//   directly (cudaHostGetDevicePointer returns the host address; true on every UVA platform that
//   supports cudaDevAttrCanUseHostPointerForRegisteredMem). Plans carry host addresses and kernels
//   dereference them unchanged, so a platform that needs translation is rejected at registration.
// - A HostRegistration unregisters exactly what it registered, once, when destroyed; the memory
//   must stay mapped until then.
// - Mappings must not overlap one another (an address belongs to one registration).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fluxon {

// One host range visible to this process, as wait_local_segments_ready() reports it.
struct HostMapping {
  std::string label;  // e.g. "cpu:0", "external_owner:0", "plan_arena"
  void* base = nullptr;
  size_t bytes = 0;
};

// Checks mappings without touching CUDA: at least one, each non-null and non-empty, no overlaps.
// Register calls this first.
absl::Status ValidateHostMappings(std::span<const HostMapping> mappings);

class HostRegistration {
 public:
  // Registers every mapping (see invariants) or none.
  static absl::StatusOr<std::unique_ptr<HostRegistration>> Register(
      std::span<const HostMapping> mappings);
  ~HostRegistration();
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

  // True when [ptr, ptr + bytes) lies entirely inside one registered mapping.
  bool Contains(uint64_t ptr, uint64_t bytes) const;
  const std::vector<HostMapping>& mappings() const { return mappings_; }

 private:
  explicit HostRegistration(std::vector<HostMapping> mappings);
  const std::vector<HostMapping> mappings_;
};

}  // namespace fluxon
