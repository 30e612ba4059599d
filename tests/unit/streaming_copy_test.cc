// StreamingCopy writes exactly memcpy's bytes for every size around its thresholds and every
// alignment of source and destination, and nothing outside the destination range.
#include "common/streaming_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace fluxon {
namespace {

TEST(StreamingCopyTest, MatchesMemcpyForSizesAndAlignments) {
  std::mt19937 rng(3);
  const size_t big = kStreamingCopyMinBytes;
  std::vector<size_t> sizes = {
      0, 1, 15, 16, 63, 64, 65, 4095, big - 1, big, big + 1, big + 63, big + 64 + 17, 3 * big + 5};
  for (size_t n : sizes) {
    for (size_t src_off : {0, 1, 7, 16, 33}) {
      for (size_t dst_off : {0, 3, 8, 15, 48}) {
        std::vector<uint8_t> src(n + 64), dst(n + 128, 0xAB);
        for (auto& b : src) b = static_cast<uint8_t>(rng());
        StreamingCopy(dst.data() + dst_off, src.data() + src_off, n);
        for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xAB) << n << " before " << i;
        ASSERT_EQ(0, std::memcmp(dst.data() + dst_off, src.data() + src_off, n))
            << "n=" << n << " src+" << src_off << " dst+" << dst_off;
        for (size_t i = dst_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xAB) << n << " after";
      }
    }
  }
}

}  // namespace
}  // namespace fluxon
