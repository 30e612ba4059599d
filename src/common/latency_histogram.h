// LatencyHistogram: a lock-free histogram of durations with fixed, log-spaced bucket bounds
// (1-2-5 steps from 5 µs to 10 s), for Prometheus histograms of request latencies.
//
// Invariants:
// - Record is wait-free (relaxed atomic increments) and safe from any number of threads.
// - Bucket bounds are fixed at compile time, strictly increasing, and the same for every
//   histogram; a value lands in the first bucket whose upper bound is >= the value (Prometheus
//   `le` semantics), values above the last bound land in the overflow (+Inf) bucket.
// - A Snapshot is internally consistent for counts: its `count` is the sum of its bucket counts
//   (read once each), so cumulative buckets are monotone and the +Inf bucket equals `count` even
//   while other threads record. `sum_seconds` may include a recording whose bucket the snapshot
//   missed (or the reverse); it is exact whenever no recording is concurrent.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace fluxon {

class LatencyHistogram {
 public:
  // Upper bounds in nanoseconds.
  static constexpr std::array<uint64_t, 20> kBoundsNanos = {
      5'000,       10'000,        20'000,        50'000,        100'000,
      200'000,     500'000,       1'000'000,     2'000'000,     5'000'000,
      10'000'000,  20'000'000,    50'000'000,    100'000'000,   200'000'000,
      500'000'000, 1'000'000'000, 2'000'000'000, 5'000'000'000, 10'000'000'000};
  static constexpr size_t kNumBounds = kBoundsNanos.size();
  static_assert(
      [] {
        for (size_t i = 1; i < kNumBounds; ++i) {
          if (kBoundsNanos[i - 1] >= kBoundsNanos[i]) return false;
        }
        return true;
      }(),
      "bucket bounds must be strictly increasing");

  struct Snapshot {
    // Non-cumulative: counts[i] for bucket i (le = bound i), counts[kNumBounds] for +Inf only.
    std::array<uint64_t, kNumBounds + 1> counts{};
    uint64_t count = 0;
    double sum_seconds = 0;
    // Observations <= bound i (i == kNumBounds: every observation).
    uint64_t Cumulative(size_t i) const {
      uint64_t c = 0;
      for (size_t b = 0; b <= i; ++b) c += counts[b];
      return c;
    }
  };

  static constexpr double BoundSeconds(size_t i) { return kBoundsNanos[i] / 1e9; }

  void Record(std::chrono::nanoseconds d) {
    const uint64_t ns = d.count() < 0 ? 0 : static_cast<uint64_t>(d.count());
    buckets_[BucketFor(ns)].fetch_add(1, std::memory_order_relaxed);
    sum_nanos_.fetch_add(ns, std::memory_order_relaxed);
  }

  Snapshot Read() const {
    Snapshot s;
    for (size_t i = 0; i <= kNumBounds; ++i) {
      s.counts[i] = buckets_[i].load(std::memory_order_relaxed);
      s.count += s.counts[i];
    }
    s.sum_seconds = static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) / 1e9;
    return s;
  }

  static size_t BucketFor(uint64_t nanos) {
    size_t i = 0;
    while (i < kNumBounds && nanos > kBoundsNanos[i]) ++i;
    return i;
  }

 private:
  std::array<std::atomic<uint64_t>, kNumBounds + 1> buckets_{};
  std::atomic<uint64_t> sum_nanos_{0};
};

}  // namespace fluxon
