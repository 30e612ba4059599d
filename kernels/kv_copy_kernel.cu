// The plan-driven KV copy kernels (see include/fluxon/kv_transfer.h for the contract).
//
// Work decomposition: a transfer is pages x selected chunks x tiles, where a tile is what one warp
// moves in one step (32 lanes x kVectors x 16 bytes, coalesced: lane l moves vectors l, l+32, ...).
// Items are numbered page-major, so consecutive warps walk one value sequentially (host-side
// accesses stay sequential for PCIe) and every item is independent. A persistent grid of
// `sm_budget` blocks strides over the items; each thread keeps kVectors loads in flight before its
// first store, which is what hides the PCIe round trip with few SMs.
//
// Each block first stages the plan's value pointers and the page indices of a window of pages in
// shared memory (one PCIe round trip per window instead of one per item) and checks them there.
#include <cuda_runtime.h>

#include "kv_copy_kernel.h"

namespace fluxon::kernels {
namespace {

// Streaming loads/stores: one-time data must not evict the forward pass's working set.
__device__ __forceinline__ int4 LoadStreaming(const int4* p) { return __ldcs(p); }
// Re-fetch from memory, never a cached system-memory line.
__device__ __forceinline__ int4 LoadVolatile(const int4* p) { return __ldcv(p); }
__device__ __forceinline__ uint64_t LoadVolatileWord(const uint64_t* p) {
  return static_cast<uint64_t>(__ldcv(reinterpret_cast<const unsigned long long*>(p)));
}
__device__ __forceinline__ int64_t LoadDeviceIndex(const int64_t* p) {
  return static_cast<int64_t>(__ldcs(reinterpret_cast<const long long*>(p)));
}

template <KvDirection kDirection, int kVectors, bool kHostLoadsBypassCache>
__global__ void __launch_bounds__(1024, 1) KvCopyKernel(const KvCopyParams p) {
  __shared__ uint64_t s_value[kMaxWindowPages];
  __shared__ int64_t s_page[kMaxWindowPages];
  __shared__ int s_plan_ok;

  if (threadIdx.x == 0) {
    const auto* header = static_cast<const PlanBlobHeader*>(p.plan);
    const uint64_t magic = LoadVolatileWord(&header->magic);
    const uint64_t count = LoadVolatileWord(&header->count);
    int ok = 1;
    if (magic != kPlanBlobMagic) {
      if (blockIdx.x == 0) atomicOr(p.error_bits, kKvDeviceErrorBadMagic);
      ok = 0;
    } else if (count != p.num_pages) {
      if (blockIdx.x == 0) atomicOr(p.error_bits, kKvDeviceErrorCountMismatch);
      ok = 0;
    }
    s_plan_ok = ok;
  }
  __syncthreads();
  if (!s_plan_ok) return;

  const uint64_t* value_ptrs = PlanValuePtrs(p.plan);
  constexpr uint32_t kTileVectors = 32 * kVectors;
  const uint64_t chunk_vectors = p.chunk_bytes / kKvVectorBytes;
  const uint32_t chunks_per_page = p.layer_count * p.buffers_per_layer;
  const uint32_t tiles_per_chunk =
      static_cast<uint32_t>((chunk_vectors + kTileVectors - 1) / kTileVectors);
  const uint32_t items_per_page = chunks_per_page * tiles_per_chunk;
  const uint32_t first_chunk = p.layer_begin * p.buffers_per_layer;
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warps_per_block = blockDim.x / 32;
  const uint32_t first_item = blockIdx.x * warps_per_block + threadIdx.x / 32;
  const uint32_t item_stride = gridDim.x * warps_per_block;

  for (uint64_t window_begin = 0; window_begin < p.num_pages; window_begin += p.window_pages) {
    const uint32_t window_pages =
        static_cast<uint32_t>(min(static_cast<uint64_t>(p.window_pages), p.num_pages - window_begin));
    __syncthreads();  // the previous window's items are done with the staged arrays
    for (uint32_t i = threadIdx.x; i < window_pages; i += blockDim.x) {
      int64_t page = LoadDeviceIndex(p.page_indices + window_begin + i);
      if (page < 0 || static_cast<uint64_t>(page) >= p.device_pages) {
        if (blockIdx.x == 0) atomicOr(p.error_bits, kKvDeviceErrorPageOutOfRange);
        page = -1;
      }
      s_page[i] = page;
      s_value[i] = LoadVolatileWord(value_ptrs + window_begin + i);
    }
    __syncthreads();

    const uint32_t items = window_pages * items_per_page;
    for (uint32_t item = first_item; item < items; item += item_stride) {
      const uint32_t page = item / items_per_page;
      const uint32_t in_page = item - page * items_per_page;
      const uint32_t chunk_in_page = in_page / tiles_per_chunk;
      const uint32_t tile = in_page - chunk_in_page * tiles_per_chunk;
      const int64_t device_page = s_page[page];
      if (device_page < 0) continue;  // warp-uniform: the whole item belongs to one page
      const uint32_t chunk = first_chunk + chunk_in_page;  // index into [layer][buffer]
      const auto* device_chunk = reinterpret_cast<int4*>(
          __ldg(reinterpret_cast<const unsigned long long*>(p.buffer_table) + chunk) +
          static_cast<uint64_t>(device_page) * p.chunk_bytes);
      const auto* value_chunk =
          reinterpret_cast<int4*>(s_value[page] + static_cast<uint64_t>(chunk) * p.chunk_bytes);
      const uint64_t first_vector = static_cast<uint64_t>(tile) * kTileVectors + lane;

      int4 r[kVectors];
      if constexpr (kDirection == KvDirection::kDeviceToValues) {
#pragma unroll
        for (int k = 0; k < kVectors; ++k) {
          const uint64_t v = first_vector + k * 32;
          if (v < chunk_vectors) r[k] = LoadStreaming(device_chunk + v);
        }
#pragma unroll
        for (int k = 0; k < kVectors; ++k) {
          const uint64_t v = first_vector + k * 32;
          if (v < chunk_vectors) __stcs(const_cast<int4*>(value_chunk) + v, r[k]);
        }
      } else {
#pragma unroll
        for (int k = 0; k < kVectors; ++k) {
          const uint64_t v = first_vector + k * 32;
          if (v < chunk_vectors) {
            r[k] = kHostLoadsBypassCache ? LoadVolatile(value_chunk + v)
                                         : LoadStreaming(value_chunk + v);
          }
        }
#pragma unroll
        for (int k = 0; k < kVectors; ++k) {
          const uint64_t v = first_vector + k * 32;
          if (v < chunk_vectors) __stcg(const_cast<int4*>(device_chunk) + v, r[k]);
        }
      }
    }
  }
}

template <KvDirection kDirection, int kVectors>
cudaError_t LaunchWithVectors(const KvCopyParams& params, const KvCopyLaunch& launch,
                              cudaStream_t stream) {
  // cudaLaunchKernel returns this launch's error itself; the runtime's last-error slot (which
  // other libraries poll) is cleared again so a rejected launch is reported exactly once.
  const void* kernel =
      launch.host_loads_bypass_cache
          ? reinterpret_cast<const void*>(&KvCopyKernel<kDirection, kVectors, true>)
          : reinterpret_cast<const void*>(&KvCopyKernel<kDirection, kVectors, false>);
  KvCopyParams copy = params;
  void* args[] = {&copy};
  const cudaError_t err = cudaLaunchKernel(kernel, dim3(launch.blocks),
                                           dim3(launch.threads_per_block), args, 0, stream);
  if (err != cudaSuccess) cudaGetLastError();
  return err;
}

template <KvDirection kDirection>
cudaError_t LaunchWithDirection(const KvCopyParams& params, const KvCopyLaunch& launch,
                                cudaStream_t stream) {
  switch (launch.vectors_per_thread) {
    case 1:
      return LaunchWithVectors<kDirection, 1>(params, launch, stream);
    case 2:
      return LaunchWithVectors<kDirection, 2>(params, launch, stream);
    case 4:
      return LaunchWithVectors<kDirection, 4>(params, launch, stream);
    case 8:
      return LaunchWithVectors<kDirection, 8>(params, launch, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

uint64_t KvItemsPerPage(uint64_t chunk_bytes, uint32_t chunks_per_page, int vectors_per_thread) {
  const uint64_t tile_bytes = 32ull * vectors_per_thread * kKvVectorBytes;
  return chunks_per_page * ((chunk_bytes + tile_bytes - 1) / tile_bytes);
}

cudaError_t LaunchKvCopy(KvDirection direction, const KvCopyParams& params,
                         const KvCopyLaunch& launch, cudaStream_t stream) {
  if (direction == KvDirection::kDeviceToValues) {
    return LaunchWithDirection<KvDirection::kDeviceToValues>(params, launch, stream);
  }
  return LaunchWithDirection<KvDirection::kValuesToDevice>(params, launch, stream);
}

}  // namespace fluxon::kernels
