// RegisteredRegion: the one memory range a transport serves and uses as local memory.
//
// Invariants and why:
// - At most one region at a time: (generation != 0, base, len > 0).
// - The serving side takes a Lease per request (Acquire) after checking the request's generation;
//   UnregisterRegion refuses new leases first, then waits until every lease is returned, so no
//   serving operation can touch memory the owner is about to unmap. The transport interrupts its
//   serving connections so that the wait is short; the wait itself is bounded.
// - CheckRange is the one bounds check (overflow-safe: it never computes offset + len unchecked).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/mutex.h"

namespace fluxon::transport {

// OK iff 0 < len, len <= region_len and offset <= region_len - len.
absl::Status CheckRange(uint64_t region_len, uint64_t offset, uint64_t len);

struct RegionView {
  uint64_t generation = 0;
  uint8_t* base = nullptr;
  uint64_t len = 0;
};

class RegisteredRegion {
 public:
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept : owner_(other.owner_), view_(other.view_) {
      other.owner_ = nullptr;
    }
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    const RegionView& view() const { return view_; }

   private:
    friend class RegisteredRegion;
    Lease(RegisteredRegion* owner, RegionView view) : owner_(owner), view_(view) {}
    RegisteredRegion* owner_ = nullptr;
    RegionView view_;
  };

  absl::Status Register(uint64_t generation, void* base, uint64_t len);
  // Serves the registered region under `generation` from now on (the owner registered with its
  // master under a new generation); requests naming the old one are refused.
  absl::Status SetGeneration(uint64_t generation);
  // Stops new leases; waits (up to `bound`) for active ones. DeadlineExceeded if they remain.
  absl::Status Unregister(absl::Duration bound);

  // Serving side: FailedPrecondition when nothing is registered or `generation` differs.
  absl::StatusOr<Lease> Acquire(uint64_t generation);
  // Initiator side: OK when [addr, addr + len) lies inside the registered region.
  absl::Status CheckLocal(const void* addr, uint64_t len) const;

  bool registered() const;
  RegionView view() const;
  uint64_t active_leases() const;

 private:
  void Release();

  mutable Mutex mu_;
  CondVar cv_;
  RegionView view_ ABSL_GUARDED_BY(mu_);
  bool accepting_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t active_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fluxon::transport
