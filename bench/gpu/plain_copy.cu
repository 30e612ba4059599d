// Reference SM copy for the benchmark: one contiguous range, 16-byte vectors, 8 loads in flight
// per thread, no plan and no indirection. It bounds what any SM-issued copy reaches over the same
// link, so the plan-driven kernel can be compared against it in the same run.
#include <cuda_runtime.h>
#include <stdint.h>

namespace fluxon::bench {
namespace {

__global__ void __launch_bounds__(1024, 1) PlainCopyKernel(const int4* src, int4* dst, uint64_t n) {
  constexpr int kVectors = 8;
  const uint64_t tile = static_cast<uint64_t>(blockDim.x) * kVectors;
  for (uint64_t base = blockIdx.x * tile + threadIdx.x; base < n; base += gridDim.x * tile) {
    int4 r[kVectors];
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const uint64_t i = base + k * blockDim.x;
      if (i < n) r[k] = __ldcs(src + i);
    }
#pragma unroll
    for (int k = 0; k < kVectors; ++k) {
      const uint64_t i = base + k * blockDim.x;
      if (i < n) __stcs(dst + i, r[k]);
    }
  }
}

}  // namespace

cudaError_t LaunchPlainCopy(const void* src, void* dst, uint64_t bytes, int blocks,
                            cudaStream_t stream) {
  PlainCopyKernel<<<blocks, 1024, 0, stream>>>(static_cast<const int4*>(src),
                                               static_cast<int4*>(dst), bytes / 16);
  return cudaGetLastError();
}

}  // namespace fluxon::bench
