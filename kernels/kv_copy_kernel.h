// Internal interface between the host launcher (kv_transfer.cc, C++20) and the CUDA kernels
// (kv_copy_kernel.cu, C++17).
//
// Invariants and why:
// - The launcher validated everything host-visible before LaunchKvCopy; the kernel re-checks only
//   what can change or is device-resident (plan magic and count, page indices) and reports through
//   error_bits instead of touching memory it cannot vouch for.
// - window_pages * items_per_page fits in 32 bits (the launcher guarantees it) so the kernel's
//   per-item index arithmetic is 32-bit.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "fluxon/kv_layout.h"

namespace fluxon::kernels {

// Pages whose value pointers and indices a block stages in shared memory at a time.
inline constexpr uint32_t kMaxWindowPages = 1024;
// Bulk-copy kernel: bytes per cp.async.bulk tile and tiles in flight per block.
inline constexpr uint32_t kBulkTileBytes = 16384;
inline constexpr uint32_t kBulkStages = 8;
inline constexpr int kBulkThreadsPerBlock = 128;

struct KvCopyParams {
  // Plan blob (host memory registered with CUDA). Null in staging mode: value i then starts at
  // staging_base + i * staging_stride (a device staging buffer of the staged copy-engine path).
  const void* plan = nullptr;
  uint64_t staging_base = 0;
  uint64_t staging_stride = 0;
  const int64_t* page_indices = nullptr;  // device memory, num_pages entries
  // Instead of page_indices (when not null): num_pages * slot_page_size token slots in device
  // memory, slot_bytes (4 or 8) each; a page's index is its row's first slot / slot_page_size when
  // the row is one whole, aligned page, else the page is skipped as out of range.
  const void* token_slots = nullptr;
  uint32_t slot_bytes = 0;
  uint32_t slot_page_size = 0;
  uint64_t num_pages = 0;
  const uint64_t* buffer_table = nullptr;  // device memory, [layer][buffer] buffer addresses
  uint64_t device_pages = 0;
  uint64_t chunk_bytes = 0;
  uint32_t buffers_per_layer = 0;
  uint32_t layer_begin = 0;
  uint32_t layer_count = 0;
  uint32_t window_pages = 0;
  uint32_t* error_bits = nullptr;  // mapped host word, KvDeviceError bits
};

struct KvCopyLaunch {
  int blocks = 0;
  int threads_per_block = 0;
  int vectors_per_thread = 0;
  int host_load = 0;       // KvHostLoad
  bool bulk_copy = false;  // cp.async.bulk kernel (kBulkThreadsPerBlock threads)
};

// Items (warp tiles, or bulk tiles) per page for a given vectors_per_thread; used to size windows.
uint64_t KvItemsPerPage(uint64_t chunk_bytes, uint32_t chunks_per_page, int vectors_per_thread,
                        bool bulk_copy);

cudaError_t LaunchKvCopy(KvDirection direction, const KvCopyParams& params,
                         const KvCopyLaunch& launch, cudaStream_t stream);

// pages[p] = the page index of token slots [p * page_size, (p + 1) * page_size) when they are one
// whole, aligned page, else -1; slots are int64 (slot_bytes 8) or int32 (4), in device memory.
cudaError_t LaunchPagesFromSlots(const void* slots, int slot_bytes, uint64_t num_pages,
                                 uint32_t page_size, int64_t* pages, cudaStream_t stream);

}  // namespace fluxon::kernels
