#include "transport/region.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace fluxon::transport {

absl::Status CheckRange(uint64_t region_len, uint64_t offset, uint64_t len) {
  if (len == 0) return absl::OutOfRangeError("zero-length descriptor");
  if (len > region_len || offset > region_len - len) {
    return absl::OutOfRangeError(absl::StrCat("range [", offset, ", +", len,
                                              ") lies outside the registered region of ",
                                              region_len, " bytes"));
  }
  return absl::OkStatus();
}

RegisteredRegion::Lease::~Lease() {
  if (owner_ != nullptr) owner_->Release();
}

absl::Status RegisteredRegion::Register(uint64_t generation, void* base, uint64_t len) {
  if (generation == 0) return absl::InvalidArgumentError("region generation must be non-zero");
  if (base == nullptr || len == 0) return absl::InvalidArgumentError("empty region");
  if (reinterpret_cast<uintptr_t>(base) > UINTPTR_MAX - len) {
    return absl::InvalidArgumentError("region wraps the address space");
  }
  MutexLock lock(&mu_);
  if (view_.generation != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("a region of generation ", view_.generation, " is registered already"));
  }
  view_ = RegionView{generation, static_cast<uint8_t*>(base), len};
  accepting_ = true;
  return absl::OkStatus();
}

absl::Status RegisteredRegion::Unregister(absl::Duration bound) {
  const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(bound);
  MutexLock lock(&mu_);
  if (view_.generation == 0) return absl::NotFoundError("no region registered");
  accepting_ = false;
  while (active_ > 0) {
    if (std::chrono::steady_clock::now() >= until) {
      return absl::DeadlineExceededError(
          absl::StrCat(active_, " serving operations still use the region"));
    }
    cv_.WaitUntil(&mu_, until);
  }
  view_ = RegionView{};
  return absl::OkStatus();
}

absl::Status RegisteredRegion::SetGeneration(uint64_t generation) {
  if (generation == 0) return absl::InvalidArgumentError("region generation must be non-zero");
  MutexLock lock(&mu_);
  if (view_.generation == 0) return absl::FailedPreconditionError("no region registered");
  view_.generation = generation;
  return absl::OkStatus();
}

absl::StatusOr<RegisteredRegion::Lease> RegisteredRegion::Acquire(uint64_t generation) {
  MutexLock lock(&mu_);
  if (!accepting_) return absl::FailedPreconditionError("the peer has no registered region");
  if (generation != view_.generation) {
    // The served generation is not named: a refusal must not tell a guesser what to send.
    return absl::FailedPreconditionError(
        absl::StrCat("stale generation: the peer does not serve generation ", generation,
                     " (restarted or re-registered; look the route up again)"));
  }
  ++active_;
  return Lease(this, view_);
}

void RegisteredRegion::Release() {
  MutexLock lock(&mu_);
  if (--active_ == 0) cv_.SignalAll();
}

absl::Status RegisteredRegion::CheckLocal(const void* addr, uint64_t len) const {
  MutexLock lock(&mu_);
  if (!accepting_) return absl::FailedPreconditionError("no local region registered");
  const auto a = reinterpret_cast<uintptr_t>(addr);
  const auto b = reinterpret_cast<uintptr_t>(view_.base);
  if (a < b) return absl::InvalidArgumentError("local address below the registered region");
  absl::Status s = CheckRange(view_.len, a - b, len);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("local ", s.message()));
  return absl::OkStatus();
}

bool RegisteredRegion::registered() const {
  MutexLock lock(&mu_);
  return accepting_;
}

RegionView RegisteredRegion::view() const {
  MutexLock lock(&mu_);
  return view_;
}

uint64_t RegisteredRegion::active_leases() const {
  MutexLock lock(&mu_);
  return active_;
}

}  // namespace fluxon::transport
