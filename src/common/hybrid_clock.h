// HybridClock: a hybrid logical clock that orders value versions across owners, owner restarts,
// clock steps and master restarts.
//
// A stamp is (wall-clock milliseconds << 16) | logical counter. Now() is strictly greater than
// every stamp this clock issued or observed before, and at least the local wall clock; Observe()
// takes in a stamp seen elsewhere. The master observes every version published to it and every
// master answer carries its clock; owners observe those answers. So a value put after an
// operation whose answer showed version v gets a version above v, whatever the local clocks
// say (a clock stepped back only slows the physical part: the logical part keeps the order).
//
// Stamps come from other processes (an owner's publish, a master's answer), so Observe takes
// in none further ahead of the local wall clock than kMaxAhead: a buggy or hostile peer cannot
// drag every later version far into the future, or make the clock wrap around.
//
// Thread-safe; lock-free.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace fluxon {

class HybridClock {
 public:
  static constexpr int kLogicalBits = 16;
  // The furthest ahead of the local wall clock an observed stamp may be (one hour).
  static constexpr uint64_t kMaxAhead = uint64_t{3'600'000} << kLogicalBits;

  // A stamp of the wall clock now, before any ordering (for tests and log lines).
  static uint64_t PhysicalStamp() {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
    return static_cast<uint64_t>(ms) << kLogicalBits;
  }

  // A new stamp: above every stamp issued or observed, at least the wall clock.
  uint64_t Now() {
    const uint64_t physical = PhysicalStamp();
    uint64_t last = last_.load(std::memory_order_relaxed);
    uint64_t next;
    do {
      next = physical > last ? physical : last + 1;
    } while (!last_.compare_exchange_weak(last, next, std::memory_order_acq_rel));
    return next;
  }

  // Takes in a stamp seen elsewhere (0: none): later Now()s are above it.
  // False (ignored) when the stamp is more than kMaxAhead past the local wall clock.
  bool Observe(uint64_t stamp) {
    if (stamp > PhysicalStamp() + kMaxAhead) return false;
    uint64_t last = last_.load(std::memory_order_relaxed);
    while (stamp > last && !last_.compare_exchange_weak(last, stamp, std::memory_order_acq_rel)) {
    }
    return true;
  }

  // The highest stamp issued or observed so far.
  uint64_t Last() const { return last_.load(std::memory_order_acquire); }

 private:
  std::atomic<uint64_t> last_{0};
};

}  // namespace fluxon
