// PlanArena: a PlanRegistry owned for Python, exposed as fluxon.kernels.PlanArena. A
// DataPlane(plans=arena) checks a plan's kind (put or get) as well as its ABI. Issue and check
// happen in the one extension module: a registry must not cross two copies of the library.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "fluxon/plan_blob.h"

namespace fluxon::python {

class PlanArena {
 public:
  static absl::StatusOr<std::unique_ptr<PlanArena>> Create(uint64_t arena_bytes) {
    absl::StatusOr<std::unique_ptr<PlanRegistry>> registry =
        PlanRegistry::Create(PlanRegistryOptions{arena_bytes});
    if (!registry.ok()) return registry.status();
    return std::unique_ptr<PlanArena>(new PlanArena(std::move(*registry)));
  }
  absl::StatusOr<uint64_t> Issue(PlanKind kind, const std::vector<uint64_t>& values) {
    return registry_->Issue(kind, values);
  }
  absl::Status Consume(uint64_t plan_ptr, PlanKind kind) {
    return registry_->Consume(plan_ptr, kind).status();
  }
  const PlanRegistry& registry() const { return *registry_; }

 private:
  explicit PlanArena(std::unique_ptr<PlanRegistry> registry) : registry_(std::move(registry)) {}
  std::unique_ptr<PlanRegistry> registry_;
};

}  // namespace fluxon::python
