// The plan-driven KV copy kernels (see include/fluxon/kv_transfer.h for the contract).
//
// Work decomposition: a transfer is pages x selected chunks x tiles. Items are numbered page-major,
// so consecutive items walk one value sequentially (host-side accesses stay sequential for PCIe)
// and every item is independent. A persistent grid of at most `sm_budget` blocks strides over the
// items.
//
// - Vector kernel: a tile is what one warp moves in one step (32 lanes x kVectors x 16 bytes,
//   coalesced: lane l moves vectors l, l+32, ...); each thread keeps kVectors loads in flight
//   before its first store, which is what hides the PCIe round trip with few SMs.
// - Bulk kernel: one thread per block drives the Hopper bulk-copy engine (cp.async.bulk):
//   global -> shared completing on an mbarrier, then shared -> global, kBulkStages tiles deep.
//
// Each block first stages the plan's value pointers and the page indices of a window of pages in
// shared memory (one PCIe round trip per window instead of one per item) and checks them there.
// The first window is read in the same round trip as the plan header: the launcher validated
// count == num_pages, and a blob's arena block never shrinks, so reading num_pages pointers is in
// bounds even when the plan was consumed in between (the header check then discards them).
#include <cuda_runtime.h>

#include <algorithm>

#include "kv_copy_kernel.h"

namespace fluxon::kernels {
namespace {

// Streaming loads/stores: one-time data must not evict the forward pass's working set.
__device__ __forceinline__ int4 LoadStreaming(const int4* p) { return __ldcs(p); }
// Re-fetch from memory, never a cached system-memory line.
__device__ __forceinline__ int4 LoadVolatile(const int4* p) { return __ldcv(p); }
// Streaming load that asks L2 to fetch 256 bytes (larger host reads over PCIe).
__device__ __forceinline__ int4 LoadPrefetch256(const int4* p) {
  int4 r;
  asm("ld.global.cs.L2::256B.v4.s32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}
__device__ __forceinline__ uint64_t LoadVolatileWord(const uint64_t* p) {
  return static_cast<uint64_t>(__ldcv(reinterpret_cast<const unsigned long long*>(p)));
}
__device__ __forceinline__ int64_t LoadDeviceIndex(const int64_t* p) {
  return static_cast<int64_t>(__ldcs(reinterpret_cast<const long long*>(p)));
}

// The page index of token-slot row `page` (PagesFromSlotsKernel's rule): -1 unless its
// slot_page_size slots are consecutive from a multiple of slot_page_size.
template <typename Slot>
__device__ int64_t PageOfSlotRow(const Slot* slots, uint64_t page, uint32_t page_size) {
  const Slot* row = slots + page * page_size;
  const int64_t first = static_cast<int64_t>(__ldcs(row));
  bool whole = first >= 0 && first % page_size == 0;
  for (uint32_t j = 1; whole && j < page_size; ++j) {
    whole = static_cast<int64_t>(__ldcs(row + j)) == first + j;
  }
  return whole ? first / page_size : -1;
}

__device__ __forceinline__ int64_t PageIndex(const KvCopyParams& p, uint64_t page) {
  if (p.token_slots == nullptr) return LoadDeviceIndex(p.page_indices + page);
  if (p.slot_bytes == 8) {
    return PageOfSlotRow(static_cast<const long long*>(p.token_slots), page, p.slot_page_size);
  }
  return PageOfSlotRow(static_cast<const int*>(p.token_slots), page, p.slot_page_size);
}

struct Staging {
  uint64_t value[kMaxWindowPages];
  int64_t page[kMaxWindowPages];
  int plan_ok;
};

// Stages the window [window_begin, +window_pages) of value pointers and page indices; with
// check_plan also reads and checks the plan header in the same round trip. Returns false (for the
// whole block) when the plan is not live. Ends with a block barrier.
__device__ bool StageWindow(const KvCopyParams& p, Staging& s, uint64_t window_begin,
                            uint32_t window_pages, bool check_plan) {
  __syncthreads();  // the previous window's items are done with the staged arrays
  const uint64_t* value_ptrs = p.plan != nullptr ? PlanValuePtrs(p.plan) : nullptr;
  if (check_plan && threadIdx.x == 0) {
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
    s.plan_ok = ok;
  }
  // In staging mode a value holds only the selected layers: shift its base back by the offset of
  // the first selected chunk so that chunk addressing below is the same as for plan values.
  const uint64_t staging_shift =
      static_cast<uint64_t>(p.layer_begin) * p.buffers_per_layer * p.chunk_bytes;
  for (uint32_t i = threadIdx.x; i < window_pages; i += blockDim.x) {
    s.value[i] = p.plan != nullptr
                     ? LoadVolatileWord(value_ptrs + window_begin + i)
                     : p.staging_base + (window_begin + i) * p.staging_stride - staging_shift;
    s.page[i] = PageIndex(p, window_begin + i);
  }
  __syncthreads();
  if (check_plan && !s.plan_ok) return false;
  for (uint32_t i = threadIdx.x; i < window_pages; i += blockDim.x) {
    const int64_t page = s.page[i];
    if (page < 0 || static_cast<uint64_t>(page) >= p.device_pages) {
      if (blockIdx.x == 0) atomicOr(p.error_bits, kKvDeviceErrorPageOutOfRange);
      s.page[i] = -1;
    }
  }
  __syncthreads();
  return true;
}

struct ItemAddress {
  char* device;  // start of the (page, layer, buffer) chunk in the layer buffer
  char* value;   // start of the same chunk inside the value
  uint32_t tile;
  bool skip;
};

__device__ __forceinline__ ItemAddress Locate(const KvCopyParams& p, const Staging& s,
                                              uint32_t item, uint32_t items_per_page,
                                              uint32_t tiles_per_chunk) {
  const uint32_t page = item / items_per_page;
  const uint32_t in_page = item - page * items_per_page;
  const uint32_t chunk_in_page = in_page / tiles_per_chunk;
  ItemAddress a;
  a.tile = in_page - chunk_in_page * tiles_per_chunk;
  const int64_t device_page = s.page[page];
  a.skip = device_page < 0;
  const uint32_t chunk = p.layer_begin * p.buffers_per_layer + chunk_in_page;  // [layer][buffer]
  a.device = reinterpret_cast<char*>(
      __ldg(reinterpret_cast<const unsigned long long*>(p.buffer_table) + chunk) +
      static_cast<uint64_t>(a.skip ? 0 : device_page) * p.chunk_bytes);
  a.value = reinterpret_cast<char*>(s.value[page] + static_cast<uint64_t>(chunk) * p.chunk_bytes);
  return a;
}

template <KvDirection kDirection, int kVectors, int kHostLoad>
__global__ void __launch_bounds__(1024, 1) KvCopyKernel(const KvCopyParams p) {
  __shared__ Staging s;
  constexpr uint32_t kTileVectors = 32 * kVectors;
  // 32-bit vector indices: the launcher guarantees chunk_bytes / 16 < 2^30.
  const uint32_t chunk_vectors = static_cast<uint32_t>(p.chunk_bytes / kKvVectorBytes);
  const uint32_t tiles_per_chunk = (chunk_vectors + kTileVectors - 1) / kTileVectors;
  const uint32_t items_per_page = p.layer_count * p.buffers_per_layer * tiles_per_chunk;
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warps_per_block = blockDim.x / 32;
  const uint32_t first_item = blockIdx.x * warps_per_block + threadIdx.x / 32;
  const uint32_t item_stride = gridDim.x * warps_per_block;

  for (uint64_t window_begin = 0; window_begin < p.num_pages; window_begin += p.window_pages) {
    const uint32_t window_pages = static_cast<uint32_t>(
        min(static_cast<uint64_t>(p.window_pages), p.num_pages - window_begin));
    if (!StageWindow(p, s, window_begin, window_pages, window_begin == 0 && p.plan != nullptr)) {
      return;
    }
    const uint32_t items = window_pages * items_per_page;
    for (uint32_t item = first_item; item < items; item += item_stride) {
      const ItemAddress a = Locate(p, s, item, items_per_page, tiles_per_chunk);
      if (a.skip) continue;  // warp-uniform: the whole item belongs to one page
      const uint32_t tile_begin = a.tile * kTileVectors;
      // Vectors of this tile inside the chunk (the last tile of a chunk may be partial).
      const uint32_t tile_vectors = min(kTileVectors, chunk_vectors - tile_begin);
      const int4* src;
      int4* dst;
      if constexpr (kDirection == KvDirection::kDeviceToValues) {
        src = reinterpret_cast<const int4*>(a.device) + tile_begin + lane;
        dst = reinterpret_cast<int4*>(a.value) + tile_begin + lane;
      } else {
        src = reinterpret_cast<const int4*>(a.value) + tile_begin + lane;
        dst = reinterpret_cast<int4*>(a.device) + tile_begin + lane;
      }
      int4 r[kVectors];
#pragma unroll
      for (int k = 0; k < kVectors; ++k) {
        if (lane + k * 32 < tile_vectors) {
          if constexpr (kDirection == KvDirection::kValuesToDevice && kHostLoad == 1) {
            r[k] = LoadVolatile(src + k * 32);
          } else if constexpr (kDirection == KvDirection::kValuesToDevice && kHostLoad == 2) {
            r[k] = LoadPrefetch256(src + k * 32);
          } else {
            r[k] = LoadStreaming(src + k * 32);
          }
        }
      }
#pragma unroll
      for (int k = 0; k < kVectors; ++k) {
        if (lane + k * 32 < tile_vectors) {
          if constexpr (kDirection == KvDirection::kDeviceToValues) {
            __stcs(dst + k * 32, r[k]);  // host memory: stream through
          } else {
            __stcg(dst + k * 32, r[k]);  // device KV cache: keep in L2 for the forward pass
          }
        }
      }
    }
  }
}

// ---- Bulk-copy (cp.async.bulk) kernel ----

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void BarrierInit(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(SharedAddress(bar)));
}

__device__ __forceinline__ void BarrierExpectBytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddress(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void BarrierWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(SharedAddress(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void BulkLoad(void* smem, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(SharedAddress(smem)),
      "l"(src), "r"(bytes), "r"(SharedAddress(bar))
      : "memory");
}

__device__ __forceinline__ void BulkStore(void* dst, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
               "r"(SharedAddress(smem)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most `pending` of the most recent bulk-store groups still read shared memory.
__device__ __forceinline__ void BulkStoresReadDone(uint32_t pending) {
  switch (pending) {
#define FLUXON_WAIT_READ(n)                                             \
  case n:                                                               \
    asm volatile("cp.async.bulk.wait_group.read " #n ";" ::: "memory"); \
    return;
    FLUXON_WAIT_READ(0)
    FLUXON_WAIT_READ(1)
    FLUXON_WAIT_READ(2)
    FLUXON_WAIT_READ(3)
    FLUXON_WAIT_READ(4)
    FLUXON_WAIT_READ(5)
    FLUXON_WAIT_READ(6)
#undef FLUXON_WAIT_READ
    default:
      asm volatile("cp.async.bulk.wait_group.read 7;" ::: "memory");
  }
}
static_assert(kBulkStages <= 8, "BulkStoresReadDone handles up to 8 stages");

__device__ __forceinline__ void BulkStoresComplete() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

template <KvDirection kDirection>
__global__ void __launch_bounds__(128, 1) KvBulkCopyKernel(const KvCopyParams p) {
  __shared__ Staging s;
  __shared__ alignas(8) uint64_t bars[kBulkStages];
  __shared__ char* pending_dst[kBulkStages];  // destination of the load in each stage
  __shared__ uint32_t pending_bytes[kBulkStages];
  extern __shared__ __align__(128) unsigned char stage_buf[];

  const uint32_t tiles_per_chunk =
      static_cast<uint32_t>((p.chunk_bytes + kBulkTileBytes - 1) / kBulkTileBytes);
  const uint32_t items_per_page = p.layer_count * p.buffers_per_layer * tiles_per_chunk;
  const bool driver = threadIdx.x == 0;
  if (driver) {
    for (int i = 0; i < kBulkStages; ++i) BarrierInit(&bars[i]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  uint32_t phase_bits = 0;  // per stage, parity of the next completion to wait for
  uint32_t issued = 0;      // loads issued by this block (stage = issued % kBulkStages)

  for (uint64_t window_begin = 0; window_begin < p.num_pages; window_begin += p.window_pages) {
    const uint32_t window_pages = static_cast<uint32_t>(
        min(static_cast<uint64_t>(p.window_pages), p.num_pages - window_begin));
    if (!StageWindow(p, s, window_begin, window_pages, window_begin == 0 && p.plan != nullptr)) {
      break;
    }
    if (!driver) continue;
    const uint32_t items = window_pages * items_per_page;
    // Software pipeline: loads run up to kBulkStages items ahead of the stores. `head` is the
    // first load not yet stored; every window drains, so stores issued so far == head.
    uint32_t head = issued;
    for (uint32_t item = blockIdx.x;; item += gridDim.x) {
      const bool more = item < items;
      // Store the oldest load when the ring is full, or drain at the end.
      while ((more && issued - head == kBulkStages) || (!more && head != issued)) {
        const uint32_t stage = head % kBulkStages;
        BarrierWait(&bars[stage], (phase_bits >> stage) & 1u);
        phase_bits ^= 1u << stage;
        BulkStore(pending_dst[stage], stage_buf + stage * kBulkTileBytes, pending_bytes[stage]);
        ++head;
      }
      if (!more) break;
      const ItemAddress a = Locate(p, s, item, items_per_page, tiles_per_chunk);
      if (a.skip) continue;
      const uint32_t stage = issued % kBulkStages;
      // The stage's previous store (store number issued - kBulkStages) must have finished reading
      // shared memory before the stage is reused.
      if (issued >= kBulkStages) BulkStoresReadDone(head - 1 - (issued - kBulkStages));
      const uint64_t offset = static_cast<uint64_t>(a.tile) * kBulkTileBytes;
      const uint32_t bytes =
          static_cast<uint32_t>(min(static_cast<uint64_t>(kBulkTileBytes), p.chunk_bytes - offset));
      const bool to_values = kDirection == KvDirection::kDeviceToValues;
      BarrierExpectBytes(&bars[stage], bytes);
      BulkLoad(stage_buf + stage * kBulkTileBytes, (to_values ? a.device : a.value) + offset, bytes,
               &bars[stage]);
      pending_dst[stage] = (to_values ? a.value : a.device) + offset;
      pending_bytes[stage] = bytes;
      ++issued;
    }
  }
  if (driver) BulkStoresComplete();
}

template <KvDirection kDirection, int kVectors>
const void* VectorKernel(int host_load) {
  if constexpr (kDirection == KvDirection::kDeviceToValues) {
    return reinterpret_cast<const void*>(&KvCopyKernel<kDirection, kVectors, 0>);
  } else {
    switch (host_load) {
      case 0:
        return reinterpret_cast<const void*>(&KvCopyKernel<kDirection, kVectors, 0>);
      case 1:
        return reinterpret_cast<const void*>(&KvCopyKernel<kDirection, kVectors, 1>);
      case 2:
        return reinterpret_cast<const void*>(&KvCopyKernel<kDirection, kVectors, 2>);
    }
    return nullptr;
  }
}

template <KvDirection kDirection>
const void* SelectKernel(const KvCopyLaunch& launch) {
  if (launch.bulk_copy) return reinterpret_cast<const void*>(&KvBulkCopyKernel<kDirection>);
  switch (launch.vectors_per_thread) {
    case 1:
      return VectorKernel<kDirection, 1>(launch.host_load);
    case 2:
      return VectorKernel<kDirection, 2>(launch.host_load);
    case 4:
      return VectorKernel<kDirection, 4>(launch.host_load);
    case 8:
      return VectorKernel<kDirection, 8>(launch.host_load);
  }
  return nullptr;
}

}  // namespace

uint64_t KvItemsPerPage(uint64_t chunk_bytes, uint32_t chunks_per_page, int vectors_per_thread,
                        bool bulk_copy) {
  const uint64_t tile_bytes =
      bulk_copy ? kBulkTileBytes : 32ull * vectors_per_thread * kKvVectorBytes;
  return chunks_per_page * ((chunk_bytes + tile_bytes - 1) / tile_bytes);
}

cudaError_t LaunchKvCopy(KvDirection direction, const KvCopyParams& params,
                         const KvCopyLaunch& launch, cudaStream_t stream) {
  const void* kernel = direction == KvDirection::kDeviceToValues
                           ? SelectKernel<KvDirection::kDeviceToValues>(launch)
                           : SelectKernel<KvDirection::kValuesToDevice>(launch);
  if (kernel == nullptr) return cudaErrorInvalidValue;
  size_t dynamic_smem = 0;
  if (launch.bulk_copy) {
    dynamic_smem = static_cast<size_t>(kBulkStages) * kBulkTileBytes;
    // Idempotent and cheap; needed once per kernel and device before >48 KiB of shared memory.
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic_smem));
    if (err != cudaSuccess) {
      cudaGetLastError();
      return err;
    }
  }
  // cudaLaunchKernel returns this launch's error itself; the runtime's last-error slot (which
  // other libraries poll) is cleared again so a rejected launch is reported exactly once.
  KvCopyParams copy = params;
  void* args[] = {&copy};
  const cudaError_t err = cudaLaunchKernel(
      kernel, dim3(launch.blocks), dim3(launch.threads_per_block), args, dynamic_smem, stream);
  if (err != cudaSuccess) cudaGetLastError();
  return err;
}

namespace {

// One thread per page: the page's token slots must be page_size consecutive slots starting at a
// multiple of page_size; the page index is then first / page_size, otherwise -1 (which every copy
// kernel refuses as out of range and reports through its error word).
template <typename Slot>
__global__ void PagesFromSlotsKernel(const Slot* __restrict__ slots, uint64_t num_pages,
                                     uint32_t page_size, int64_t* __restrict__ pages) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t p = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < num_pages;
       p += stride) {
    const Slot* row = slots + p * page_size;
    const int64_t first = static_cast<int64_t>(row[0]);
    bool whole = first >= 0 && first % page_size == 0;
    for (uint32_t j = 1; whole && j < page_size; ++j) {
      whole = static_cast<int64_t>(row[j]) == first + j;
    }
    pages[p] = whole ? first / page_size : -1;
  }
}

}  // namespace

cudaError_t LaunchPagesFromSlots(const void* slots, int slot_bytes, uint64_t num_pages,
                                 uint32_t page_size, int64_t* pages, cudaStream_t stream) {
  constexpr int kThreads = 128;
  const int blocks =
      static_cast<int>(std::min<uint64_t>(64, (num_pages + kThreads - 1) / kThreads));
  if (slot_bytes == 8) {
    PagesFromSlotsKernel<int64_t><<<blocks, kThreads, 0, stream>>>(
        static_cast<const int64_t*>(slots), num_pages, page_size, pages);
  } else if (slot_bytes == 4) {
    PagesFromSlotsKernel<int32_t><<<blocks, kThreads, 0, stream>>>(
        static_cast<const int32_t*>(slots), num_pages, page_size, pages);
  } else {
    return cudaErrorInvalidValue;
  }
  const cudaError_t err = cudaGetLastError();  // this launch's error, and the slot cleared
  return err;
}

}  // namespace fluxon::kernels
