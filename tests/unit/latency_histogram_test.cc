// LatencyHistogram: bucket boundaries (Prometheus `le` semantics), sums, and snapshots that stay
// consistent (monotone cumulative buckets, +Inf == count) while other threads record.
#include "common/latency_histogram.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace fluxon {
namespace {

using std::chrono::nanoseconds;

TEST(LatencyHistogram, BoundsAreStrictlyIncreasing) {
  for (size_t i = 1; i < LatencyHistogram::kNumBounds; ++i) {
    EXPECT_LT(LatencyHistogram::kBoundsNanos[i - 1], LatencyHistogram::kBoundsNanos[i]);
  }
  EXPECT_EQ(LatencyHistogram::kBoundsNanos.front(), 5'000u);
  EXPECT_EQ(LatencyHistogram::kBoundsNanos.back(), 10'000'000'000u);
}

TEST(LatencyHistogram, ValueOnABoundLandsInThatBucket) {
  for (size_t i = 0; i < LatencyHistogram::kNumBounds; ++i) {
    const uint64_t bound = LatencyHistogram::kBoundsNanos[i];
    EXPECT_EQ(LatencyHistogram::BucketFor(bound), i);
    EXPECT_EQ(LatencyHistogram::BucketFor(bound + 1), i + 1);
  }
  EXPECT_EQ(LatencyHistogram::BucketFor(0), 0u);
  EXPECT_EQ(LatencyHistogram::BucketFor(UINT64_MAX), LatencyHistogram::kNumBounds);
}

TEST(LatencyHistogram, RecordsCountsAndSum) {
  LatencyHistogram h;
  h.Record(nanoseconds(4'000));
  h.Record(nanoseconds(1'500'000));
  h.Record(std::chrono::seconds(11));
  h.Record(nanoseconds(-5));  // a clock going backwards counts as zero
  const LatencyHistogram::Snapshot s = h.Read();
  EXPECT_EQ(s.count, 4u);
  EXPECT_EQ(s.counts[0], 2u);
  EXPECT_EQ(s.counts[LatencyHistogram::BucketFor(1'500'000)], 1u);
  EXPECT_EQ(s.counts[LatencyHistogram::kNumBounds], 1u);
  EXPECT_EQ(s.Cumulative(LatencyHistogram::kNumBounds), 4u);
  EXPECT_EQ(s.Cumulative(LatencyHistogram::kNumBounds - 1), 3u);
  EXPECT_DOUBLE_EQ(s.sum_seconds, 11.001504);
}

TEST(LatencyHistogram, SnapshotsStayConsistentUnderConcurrentRecording) {
  LatencyHistogram h;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 50'000;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      const LatencyHistogram::Snapshot s = h.Read();
      uint64_t previous = 0;
      for (size_t i = 0; i <= LatencyHistogram::kNumBounds; ++i) {
        const uint64_t c = s.Cumulative(i);
        ASSERT_GE(c, previous);
        previous = c;
      }
      ASSERT_EQ(previous, s.count);
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&h, t] {
      for (int i = 0; i < kPerThread; ++i) h.Record(nanoseconds((i % 7) * 1'000'003 + t));
    });
  }
  for (auto& w : writers) w.join();
  done = true;
  reader.join();
  EXPECT_EQ(h.Read().count, uint64_t{kThreads} * kPerThread);
}

}  // namespace
}  // namespace fluxon
