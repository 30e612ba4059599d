// The hostless data plane: moves KV pages between a GPU KV cache (SGLang layer_first pools) and
// Fluxon values named by a plan blob, with either SM kernels or the copy engines. No host loop over
// pages or layers on the kernel path: kernels read `count` and `value_ptrs[]` from the blob.
//
// Invariants and why:
// - Everything checkable on the host is checked before any launch, and a rejected call launches
//   nothing: the plan (non-null, 8-byte aligned, live magic, count equal to the number of page
//   indices, kind put for write and get for restore when a PlanRegistry is given), every value
//   pointer (non-null, 16-byte aligned, and inside a registered mapping when a HostRegistration is
//   given), the page-index pointer, the layer id, and host-visible page indices (range). A bad call
//   must never reach the GPU: a fault there poisons the inference process's whole CUDA context.
// - What only the device sees (the plan's magic and count when the kernel runs, device-resident
//   page indices) is checked again in the kernel: a failing page or plan moves no bytes and sets a
//   sticky bit that TakeDeviceErrors() turns into an error after the caller's stream finished.
// - The kernel path uses at most `sm_budget` thread blocks (the forward pass owns the rest of the
//   GPU) and only 16-byte, warp-coalesced accesses; the copy-engine path uses no SMs; the staged
//   path uses at most `sm_budget` blocks only while it gathers or scatters in device memory.
//
// Which path (H200, PCIe Gen5; docs/perf.md): the kernel path has the lowest latency (small
// batches, one-layer restore) and reaches what any SM-issued copy reaches over PCIe (~95% D2H,
// ~92% H2D of a contiguous DMA copy); the staged path reaches 97-99% on 128-page batches and keeps
// SMs busy only briefly; the plain copy-engine path needs no SMs and no staging (~93-97%).
// - Values (host memory) and the plan blob must be registered (HostRegistration) in the current
//   CUDA context; kernels dereference the plan's host addresses unchanged.
// - A KvDataPlane's device pointer table mirrors the KvDeviceBuffers it was created with; the
//   buffers must outlive it. Calls may come from several threads; copy-engine calls serialize on
//   the plane's private streams.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "fluxon/kv_layout.h"
#include "fluxon/plan_blob.h"

namespace fluxon {

class HostRegistration;

// The GPU side: per-layer buffer addresses of one KV pool.
struct KvDeviceBuffers {
  KvPageLayout layout;
  std::vector<uint64_t> k_ptrs;  // per layer: the K buffer (MHA) or the KV buffer (MLA)
  std::vector<uint64_t> v_ptrs;  // per layer: the V buffer (MHA); empty for MLA
  uint64_t device_pages = 0;     // pages each buffer holds; valid page indices are [0, this)
};

// How the vector kernel loads value bytes from host memory (restore).
enum class KvHostLoad : uint8_t {
  kStreaming = 0,     // ld.global.cs
  kBypassCache = 1,   // ld.global.cv: never a cached system-memory line
  kPrefetch256B = 2,  // ld.global.cs.L2::256B: ask L2 for 256-byte fetches
};

// Launch shape of the SM kernels.
struct KvKernelConfig {
  int sm_budget = 4;  // at most this many thread blocks, one per SM (fewer when the work is small)
  int threads_per_block = 1024;  // multiple of 32, at most 1024
  int vectors_per_thread = 8;    // 16-byte loads in flight per thread before the stores: 1,2,4,8
  KvHostLoad host_load = KvHostLoad::kStreaming;
  // Drive the bulk-copy engine (cp.async.bulk, 128 threads per block) instead of vector loads;
  // threads_per_block and vectors_per_thread are then ignored.
  bool bulk_copy = false;
};

// Copy-engine (DMA) path: cudaMemcpyBatchAsync built from the same plan.
struct KvCopyEngineOptions {
  int num_streams = 16;        // the descriptor list is split into this many batches (at most 32)
  bool merge_adjacent = true;  // coalesce descriptors contiguous on both sides
  bool sort_by_host_address = false;         // issue in host-address order instead of plan order
  bool prefer_overlap_with_compute = false;  // cudaMemcpyFlagPreferOverlapWithCompute
};

// Copy streams a staged group's descriptors can be spread over.
inline constexpr int kMaxStagedCopyStreams = 8;

// How a layer-wise restore (KvDataPlane::RestoreLayers) moves each layer.
enum class KvLayerPath : uint8_t {
  kKernel = 0,  // the one-layer restore kernel (SM loads over PCIe; lowest latency)
  kStaged = 1,  // copy engines into the staging buffer + a scatter kernel (highest throughput)
};

struct KvLayerWiseOptions {
  KvLayerPath path = KvLayerPath::kKernel;
  int sm_budget = 4;  // blocks of the restore (kernel) or scatter (staged) kernel
  // Staged: copy streams per group, 1..kMaxStagedCopyStreams. One is fastest on the H200 (one
  // engine per direction streams the large descriptors back to back; docs/perf.md).
  int copy_streams = 1;
};

// One transfer. The kernel path reads device_page_indices; the copy-engine path needs the indices
// on the host. host_page_indices, when given on the kernel path, must equal the device ones and
// are range-checked on the host (cheap); otherwise the kernel checks the range.
struct KvTransferRequest {
  uint64_t plan_ptr = 0;
  const int64_t* device_page_indices = nullptr;
  uint64_t num_pages = 0;
  std::span<const int64_t> host_page_indices;
  // Kernel path only (WritePages, RestorePages, RestoreLayer), instead of device_page_indices:
  // the transfer's token slots in device memory, num_pages * token_page_size of them (int64 when
  // token_slot_bytes is 8, int32 when 4). The copy kernel derives each page's index from its row
  // as PagesFromTokenSlots does, in the same launch (no index buffer, no second kernel); a row
  // that is not one whole, aligned page is skipped and reported as kKvDeviceErrorPageOutOfRange.
  // The other paths refuse such a request.
  const void* device_token_slots = nullptr;
  int token_slot_bytes = 0;
  uint32_t token_page_size = 0;
};

// One (dst, src, bytes) copy of the copy-engine path.
struct KvCopyDescriptor {
  uint64_t dst = 0;
  uint64_t src = 0;
  uint64_t bytes = 0;
};

// ---- Host-side checks and arithmetic (no CUDA calls; CPU-testable) ----

absl::Status ValidateLayout(const KvPageLayout& layout);
absl::Status ValidateDeviceBuffers(const KvDeviceBuffers& buffers);
absl::Status ValidateKernelConfig(const KvKernelConfig& config, int device_sm_count);

// Parses and checks the plan at plan_ptr for a transfer of `expected` kind (see invariants). With
// `plans` null only the ABI is checked (magic, count); the kind cannot be.
absl::StatusOr<PlanView> ReadTransferPlan(uint64_t plan_ptr, PlanKind expected,
                                          const PlanRegistry* plans);
// Checks every value pointer of a plan against the layout (and the registration when given).
absl::Status ValidatePlanValues(const PlanView& plan, const KvPageLayout& layout,
                                const HostRegistration* registration);
absl::Status ValidatePageIndices(std::span<const int64_t> page_indices, uint64_t device_pages);

// The descriptors of a copy-engine transfer of layers [layer_begin, layer_begin + layer_count).
absl::StatusOr<std::vector<KvCopyDescriptor>> BuildCopyDescriptors(
    KvDirection direction, const KvDeviceBuffers& buffers, std::span<const uint64_t> value_ptrs,
    std::span<const int64_t> page_indices, uint32_t layer_begin, uint32_t layer_count,
    const KvCopyEngineOptions& options);

// Splits descriptors into at most `parts` contiguous runs of about equal bytes; returns the run
// boundaries (parts + 1 entries or fewer, first 0, last descriptors.size()).
std::vector<size_t> SplitDescriptorsByBytes(std::span<const KvCopyDescriptor> descriptors,
                                            int parts);

// Page indices of token slots on the device, without a host round trip: pages[p] is the page of
// slots [p * page_size, (p + 1) * page_size) (device memory, int64 or int32 as slot_bytes 8 or
// 4) when they are page_size consecutive slots starting at a multiple of page_size, else -1,
// which every KV copy refuses as out of range (page skipped, error bit set). Enqueued on
// `stream`; num_slots must be a positive multiple of page_size.
absl::Status PagesFromTokenSlots(const void* slots, int slot_bytes, uint64_t num_slots,
                                 uint32_t page_size, int64_t* pages, cudaStream_t stream);

struct KvDataPlaneOptions {
  KvDeviceBuffers buffers;
  // Staged copy-engine path (CopyStaged): a device staging buffer of staging_slots slots of
  // staging_group_pages values each is allocated at Create; 0 pages disables the path. Measured
  // on the H200 (docs/perf.md): 4 pages x 2 slots (36 MiB for 4.5 MiB values) with 4-8 SMs is
  // the best setting for 128-page batches.
  uint32_t staging_group_pages = 0;
  uint32_t staging_slots = 2;
  // When set, a plan's kind is checked: put for write, get for restore.
  const PlanRegistry* plans = nullptr;
  // When set, every value of a plan must lie inside one of its mappings.
  const HostRegistration* registration = nullptr;
};

class KvDataPlane {
 public:
  // Uploads the per-layer pointer table to the current device and allocates the error word.
  static absl::StatusOr<std::unique_ptr<KvDataPlane>> Create(KvDataPlaneOptions options);
  ~KvDataPlane();
  KvDataPlane(const KvDataPlane&) = delete;
  KvDataPlane& operator=(const KvDataPlane&) = delete;

  // Kernel path. All enqueue on `stream` and return before the copy ran.
  // Write (backup): every layer of each page, GPU -> values (put plan).
  absl::Status WritePages(const KvTransferRequest& request, cudaStream_t stream,
                          const KvKernelConfig& config = {});
  // Restore: every layer of each page, values -> GPU (get plan).
  absl::Status RestorePages(const KvTransferRequest& request, cudaStream_t stream,
                            const KvKernelConfig& config = {});
  // Layer-wise restore of layer `layer_id` only, to overlap with the forward pass.
  absl::Status RestoreLayer(const KvTransferRequest& request, uint32_t layer_id,
                            cudaStream_t stream, const KvKernelConfig& config = {});

  // Copy-engine path for the same work; `layer` empty means all layers. Needs host_page_indices.
  absl::Status CopyWithCopyEngine(KvDirection direction, const KvTransferRequest& request,
                                  std::optional<uint32_t> layer, cudaStream_t stream,
                                  const KvCopyEngineOptions& options = {});

  // Staged copy-engine path: the PCIe transfer runs on the copy engines as one large descriptor
  // per page (per page and layer for a layer restore) through the device staging buffer, and a
  // short gather (write) or scatter (restore) kernel of at most sm_budget blocks moves the chunks
  // between the staging buffer and the KV buffers at device-memory speed, pipelined by groups of
  // staging_group_pages pages; each group's descriptors are spread over `copy_streams` copy
  // streams (1..kMaxStagedCopyStreams), so more than one copy engine works at a time. SMs are
  // busy only for the gather/scatter. Needs device_page_indices and staging configured at
  // Create. host_page_indices are optional: when given they are range-checked on the host; when
  // not, the kernel's range check is the only one and a skipped page leaves stale staging bytes
  // in its value, so a writer must call TakeDeviceErrors before it publishes the values.
  absl::Status CopyStaged(KvDirection direction, const KvTransferRequest& request,
                          std::optional<uint32_t> layer, cudaStream_t stream, int sm_budget = 8,
                          int copy_streams = 1);

  // Layer-wise restore of several get plans: for each layer of [layer_begin, layer_begin +
  // layer_done.size()), every request's copies of that layer, then layer_done[i] is recorded on
  // `stream` (so event i completes only after layer layer_begin + i landed for every request).
  // `continues`: this call follows the previous RestoreLayers of the same load on the same
  // stream, with nothing enqueued on `stream` in between that the copies must wait for; the
  // staged path's copy streams then do not wait for `stream` again, so the copy engines do not
  // idle between calls. The first call of a load passes false.
  absl::Status RestoreLayers(std::span<const KvTransferRequest> requests, uint32_t layer_begin,
                             std::span<const cudaEvent_t> layer_done, cudaStream_t stream,
                             const KvLayerWiseOptions& options, bool continues);

  // Reads and clears the kernels' sticky error bits. Call after the streams used finished.
  absl::Status TakeDeviceErrors();

  const KvDeviceBuffers& buffers() const;
  const KvPageLayout& layout() const;

 private:
  class Impl;
  explicit KvDataPlane(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fluxon
