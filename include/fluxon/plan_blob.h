// Plan blobs (ABI in plan_blob_abi.h) and the typed registry that issues and consumes them.
//
// Invariants:
// - A plan is either a put plan (writable value_ptrs from local_fast_put_start) or a get plan
//   (readable value_ptrs from get_transfer). The registry records the kind; consuming a plan as
//   the other kind fails with InvalidArgument and leaves the plan live and unchanged.
// - A plan is consumed exactly once (commit/abort for put plans, release_views for get plans). A
//   second consume fails with FailedPrecondition ("already consumed"); an address the registry
//   never issued fails with NotFound. Consuming overwrites the magic (kPlanBlobConsumedMagic).
// - Blobs come from one page-aligned arena whose range (arena_base, arena_bytes) the caller can
//   register with CUDA once; the arena never moves or grows, so the registration stays valid.
//   Freed blocks are reused oldest-first to keep a stale plan_ptr from aliasing a new plan soon.
// - The arena is bounded: when it is full, Issue fails with ResourceExhausted and nothing leaks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "absl/status/statusor.h"
#include "fluxon/plan_blob_abi.h"

namespace fluxon {

enum class PlanKind : uint8_t { kPut = 1, kGet = 2 };

const char* PlanKindName(PlanKind kind);

// State a caller attaches to a plan (slot leases, holders, ...) and gets back on Consume.
class PlanPayload {
 public:
  virtual ~PlanPayload() = default;
};

struct PlanView {
  PlanKind kind;
  uint64_t count;
  const uint64_t* value_ptrs;
};

struct PlanRegistryOptions {
  // Bytes of the blob arena. A 128-page plan takes 2 KiB, so 16 MiB holds ~8k such plans.
  size_t arena_bytes = 16 << 20;
};

class PlanRegistry {
 public:
  static absl::StatusOr<std::unique_ptr<PlanRegistry>> Create(PlanRegistryOptions options = {});
  ~PlanRegistry();
  PlanRegistry(const PlanRegistry&) = delete;
  PlanRegistry& operator=(const PlanRegistry&) = delete;

  // Writes a blob (magic, count, value_ptrs) and registers it as a live plan of `kind`.
  // Returns plan_ptr, the blob's address. Fails with InvalidArgument for an empty batch.
  absl::StatusOr<uint64_t> Issue(PlanKind kind, std::span<const uint64_t> value_ptrs,
                                 std::unique_ptr<PlanPayload> payload = nullptr);

  // Consumes a live plan of the expected kind and returns its payload (may be null).
  absl::StatusOr<std::unique_ptr<PlanPayload>> Consume(uint64_t plan_ptr, PlanKind expected);

  // Reads a live plan without consuming it. `expected` (when set) is checked like Consume.
  absl::StatusOr<PlanView> Peek(uint64_t plan_ptr, std::optional<PlanKind> expected) const;

  void* arena_base() const;
  size_t arena_bytes() const;
  size_t live_plans() const;

 private:
  class Impl;
  explicit PlanRegistry(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon
