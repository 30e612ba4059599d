#include "fluxon/kv_transfer.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "fluxon/host_registration.h"
#include "fluxon/status.h"
#include "kv_copy_kernel.h"

namespace fluxon {

namespace {

const char* AttentionName(KvAttention attention) {
  switch (attention) {
    case KvAttention::kMha:
      return "MHA";
    case KvAttention::kMla:
      return "MLA";
  }
  return "unknown";
}

// Also clears the runtime's last-error slot, so a failure we report is not reported again to
// whichever library (torch, the caller) polls cudaGetLastError next.
absl::Status CudaError(cudaError_t err, const char* what) {
  cudaGetLastError();
  return absl::InternalError(
      absl::StrFormat("%s failed: %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err)));
}

bool Aligned(uint64_t address, uint64_t alignment) { return address % alignment == 0; }

// cudaMemcpyBatchAsync lost its failIdx argument in CUDA 13; the batch API exists since 12.8.
cudaError_t CopyBatch(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                      cudaMemcpyAttributes* attrs, cudaStream_t stream) {
  size_t attrs_index = 0;
#if CUDART_VERSION >= 13000
  return cudaMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, &attrs_index, 1, stream);
#elif CUDART_VERSION >= 12080
  size_t fail_index = 0;
  return cudaMemcpyBatchAsync(const_cast<void**>(dsts), const_cast<void**>(srcs),
                              const_cast<size_t*>(sizes), count, attrs, &attrs_index, 1,
                              &fail_index, stream);
#else
#error "the copy-engine path needs cudaMemcpyBatchAsync (CUDA 12.8 or newer)"
#endif
}

}  // namespace

absl::Status ValidateLayout(const KvPageLayout& layout) {
  if (layout.attention != KvAttention::kMha && layout.attention != KvAttention::kMla) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV layout attention kind %d is neither MHA nor MLA", static_cast<int>(layout.attention)));
  }
  if (layout.num_layers == 0 || layout.page_size == 0 || layout.row_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV layout needs num_layers, page_size and row_bytes > 0 (got %d, %d, %d)",
                        layout.num_layers, layout.page_size, layout.row_bytes));
  }
  if (layout.chunk_bytes() % kKvVectorBytes != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "page_size * row_bytes = %d is not a multiple of %d bytes (16-byte vector copies)",
        layout.chunk_bytes(), kKvVectorBytes));
  }
  if (layout.chunk_bytes() / kKvVectorBytes >= (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "page_size * row_bytes = %d bytes is too large for one chunk (limit 16 GiB)",
        layout.chunk_bytes()));
  }
  if (layout.value_bytes() / layout.num_layers != layout.layer_bytes()) {
    return absl::InvalidArgumentError("KV layout value size overflows 64 bits");
  }
  return absl::OkStatus();
}

absl::Status ValidateDeviceBuffers(const KvDeviceBuffers& buffers) {
  FLUXON_RETURN_IF_ERROR(ValidateLayout(buffers.layout));
  const KvPageLayout& layout = buffers.layout;
  if (buffers.k_ptrs.size() != layout.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s layout has %d layers but %d %s buffer pointers were given",
                        AttentionName(layout.attention), layout.num_layers, buffers.k_ptrs.size(),
                        layout.attention == KvAttention::kMha ? "K" : "KV"));
  }
  const size_t want_v = layout.attention == KvAttention::kMha ? layout.num_layers : 0;
  if (buffers.v_ptrs.size() != want_v) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s layout with %d layers needs %d V buffer pointers, got %d",
        AttentionName(layout.attention), layout.num_layers, want_v, buffers.v_ptrs.size()));
  }
  if (buffers.device_pages == 0) {
    return absl::InvalidArgumentError("device_pages (pages per layer buffer) must be > 0");
  }
  if (buffers.device_pages > std::numeric_limits<uint64_t>::max() / layout.chunk_bytes()) {
    return absl::InvalidArgumentError("device_pages * chunk bytes overflows 64 bits");
  }
  for (int side = 0; side < 2; ++side) {
    const std::vector<uint64_t>& ptrs = side == 0 ? buffers.k_ptrs : buffers.v_ptrs;
    const char* name = side == 0 ? (layout.attention == KvAttention::kMha ? "K" : "KV") : "V";
    for (size_t layer = 0; layer < ptrs.size(); ++layer) {
      if (ptrs[layer] == 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s buffer pointer of layer %d is null", name, layer));
      }
      if (!Aligned(ptrs[layer], kKvVectorBytes)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s buffer pointer of layer %d (0x%x) is not 16-byte aligned", name,
                            layer, ptrs[layer]));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateKernelConfig(const KvKernelConfig& config, int device_sm_count) {
  if (config.sm_budget < 1 || (device_sm_count > 0 && config.sm_budget > device_sm_count)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sm_budget %d is outside [1, %d]", config.sm_budget, device_sm_count));
  }
  if (config.threads_per_block < 32 || config.threads_per_block > 1024 ||
      config.threads_per_block % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "threads_per_block %d must be a multiple of 32 in [32, 1024]", config.threads_per_block));
  }
  if (static_cast<int>(config.host_load) > static_cast<int>(KvHostLoad::kPrefetch256B)) {
    return absl::InvalidArgumentError("unknown host_load mode");
  }
  const int v = config.vectors_per_thread;
  if (v != 1 && v != 2 && v != 4 && v != 8) {
    return absl::InvalidArgumentError(
        absl::StrFormat("vectors_per_thread %d must be 1, 2, 4 or 8", v));
  }
  return absl::OkStatus();
}

absl::StatusOr<PlanView> ReadTransferPlan(uint64_t plan_ptr, PlanKind expected,
                                          const PlanRegistry* plans) {
  if (plan_ptr == 0) return absl::InvalidArgumentError("plan_ptr is null");
  if (!Aligned(plan_ptr, alignof(PlanBlobHeader))) {
    return absl::InvalidArgumentError(
        absl::StrFormat("plan_ptr 0x%x is not 8-byte aligned: not a plan blob", plan_ptr));
  }
  if (plans != nullptr) {
    // The registry knows the kind and whether the plan is still live; its errors name both.
    return plans->Peek(plan_ptr, expected);
  }
  const auto* header = reinterpret_cast<const PlanBlobHeader*>(plan_ptr);
  if (header->magic == kPlanBlobConsumedMagic) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "plan 0x%x was already consumed (a plan is valid for one commit/abort/release)", plan_ptr));
  }
  if (header->magic != kPlanBlobMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("plan 0x%x has bad magic 0x%x (expected 0x%x): not a Fluxon plan blob",
                        plan_ptr, header->magic, kPlanBlobMagic));
  }
  if (header->count == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("plan 0x%x holds no values", plan_ptr));
  }
  return PlanView{expected, header->count, PlanValuePtrs(reinterpret_cast<const void*>(plan_ptr))};
}

absl::Status ValidatePlanValues(const PlanView& plan, const KvPageLayout& layout,
                                const HostRegistration* registration) {
  const uint64_t value_bytes = layout.value_bytes();
  for (uint64_t i = 0; i < plan.count; ++i) {
    const uint64_t value = plan.value_ptrs[i];
    if (value == 0) {
      return absl::InvalidArgumentError(absl::StrFormat("plan value %d is a null pointer", i));
    }
    if (!Aligned(value, kKvVectorBytes)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("plan value %d (0x%x) is not 16-byte aligned", i, value));
    }
    if (registration != nullptr && !registration->Contains(value, value_bytes)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "plan value %d [0x%x, +%d bytes) is not inside a CUDA-registered host mapping", i, value,
          value_bytes));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidatePageIndices(std::span<const int64_t> page_indices, uint64_t device_pages) {
  for (size_t i = 0; i < page_indices.size(); ++i) {
    const int64_t page = page_indices[i];
    if (page < 0 || static_cast<uint64_t>(page) >= device_pages) {
      return absl::OutOfRangeError(
          absl::StrFormat("page index %d at position %d is outside the device KV pool [0, %d)",
                          page, i, device_pages));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<KvCopyDescriptor>> BuildCopyDescriptors(
    KvDirection direction, const KvDeviceBuffers& buffers, std::span<const uint64_t> value_ptrs,
    std::span<const int64_t> page_indices, uint32_t layer_begin, uint32_t layer_count,
    const KvCopyEngineOptions& options) {
  const KvPageLayout& layout = buffers.layout;
  if (value_ptrs.size() != page_indices.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("plan holds %d values but %d page indices were given", value_ptrs.size(),
                        page_indices.size()));
  }
  if (layer_count == 0 || layer_begin >= layout.num_layers ||
      layer_count > layout.num_layers - layer_begin) {
    return absl::InvalidArgumentError(
        absl::StrFormat("layers [%d, %d) are outside the layout's %d layers", layer_begin,
                        static_cast<uint64_t>(layer_begin) + layer_count, layout.num_layers));
  }
  FLUXON_RETURN_IF_ERROR(ValidatePageIndices(page_indices, buffers.device_pages));
  const uint32_t per_layer = layout.buffers_per_layer();
  const uint64_t chunk = layout.chunk_bytes();
  std::vector<KvCopyDescriptor> out;
  out.reserve(value_ptrs.size() * layer_count * per_layer);

  struct Run {
    uint64_t host;
    uint64_t device;
  };
  std::vector<Run> runs;
  runs.reserve(out.capacity());
  for (size_t p = 0; p < value_ptrs.size(); ++p) {
    const uint64_t device_offset =
        layout.device_page_offset(static_cast<uint64_t>(page_indices[p]));
    for (uint32_t layer = layer_begin; layer < layer_begin + layer_count; ++layer) {
      for (uint32_t b = 0; b < per_layer; ++b) {
        const uint64_t buffer = b == 0 ? buffers.k_ptrs[layer] : buffers.v_ptrs[layer];
        runs.push_back({value_ptrs[p] + layout.chunk_offset(layer, b), buffer + device_offset});
      }
    }
  }
  if (options.sort_by_host_address) {
    std::stable_sort(runs.begin(), runs.end(),
                     [](const Run& a, const Run& b) { return a.host < b.host; });
  }
  const bool to_values = direction == KvDirection::kDeviceToValues;
  for (const Run& run : runs) {
    const uint64_t dst = to_values ? run.host : run.device;
    const uint64_t src = to_values ? run.device : run.host;
    if (options.merge_adjacent && !out.empty() && out.back().dst + out.back().bytes == dst &&
        out.back().src + out.back().bytes == src) {
      out.back().bytes += chunk;
    } else {
      out.push_back({dst, src, chunk});
    }
  }
  return out;
}

std::vector<size_t> SplitDescriptorsByBytes(std::span<const KvCopyDescriptor> descriptors,
                                            int parts) {
  std::vector<size_t> bounds = {0};
  if (descriptors.empty()) return bounds;
  uint64_t total = 0;
  for (const KvCopyDescriptor& d : descriptors) total += d.bytes;
  parts = std::max(1, std::min<int>(parts, static_cast<int>(descriptors.size())));
  uint64_t done = 0;
  int part = 1;
  for (size_t i = 0; i < descriptors.size(); ++i) {
    done += descriptors[i].bytes;
    // Close a run once it reached its share of the bytes (the last run takes the remainder).
    if (part < parts && done * parts >= total * part && i + 1 < descriptors.size()) {
      bounds.push_back(i + 1);
      ++part;
    }
  }
  bounds.push_back(descriptors.size());
  return bounds;
}

absl::Status PagesFromTokenSlots(const void* slots, int slot_bytes, uint64_t num_slots,
                                 uint32_t page_size, int64_t* pages, cudaStream_t stream) {
  if (slot_bytes != 4 && slot_bytes != 8) {
    return absl::InvalidArgumentError(
        absl::StrFormat("token slots must be int32 or int64, got %d-byte elements", slot_bytes));
  }
  if (page_size == 0 || num_slots == 0 || num_slots % page_size != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d token slots is not a whole number of %d-token pages", num_slots, page_size));
  }
  if (slots == nullptr || pages == nullptr ||
      !Aligned(reinterpret_cast<uint64_t>(slots), slot_bytes) ||
      !Aligned(reinterpret_cast<uint64_t>(pages), sizeof(int64_t))) {
    return absl::InvalidArgumentError("token slots or page indices are null or misaligned");
  }
  const cudaError_t err = kernels::LaunchPagesFromSlots(slots, slot_bytes, num_slots / page_size,
                                                        page_size, pages, stream);
  if (err != cudaSuccess) return CudaError(err, "pages-from-slots kernel launch");
  return absl::OkStatus();
}

// ---- KvDataPlane ----

namespace {
constexpr int kMaxCopyEngineStreams = 32;
}  // namespace

class KvDataPlane::Impl {
 public:
  Impl(KvDataPlaneOptions options, int sm_count, uint64_t* device_table, uint32_t* error_host,
       uint32_t* error_device, uint8_t* staging, uint64_t staging_slot_bytes)
      : options_(std::move(options)),
        sm_count_(sm_count),
        device_table_(device_table),
        error_host_(error_host),
        error_device_(error_device),
        staging_(staging),
        staging_slot_bytes_(staging_slot_bytes) {}

  ~Impl() {
    for (cudaEvent_t e : staged_ready_) cudaEventDestroy(e);
    for (cudaEvent_t e : staged_free_) cudaEventDestroy(e);
    cudaFree(staging_);
    for (cudaEvent_t e : join_events_) cudaEventDestroy(e);
    if (fork_event_ != nullptr) cudaEventDestroy(fork_event_);
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
    cudaFree(device_table_);
    cudaFreeHost(error_host_);
  }

  absl::Status Launch(KvDirection direction, const KvTransferRequest& request, uint32_t layer_begin,
                      uint32_t layer_count, cudaStream_t stream, const KvKernelConfig& config) {
    FLUXON_RETURN_IF_ERROR(ValidateKernelConfig(config, sm_count_));
    FLUXON_ASSIGN_OR_RETURN(PlanView plan, CheckRequest(direction, request, layer_begin,
                                                        layer_count, /*need_host_indices=*/false,
                                                        /*allow_token_slots=*/true));
    const KvPageLayout& layout = options_.buffers.layout;
    const uint64_t items_per_page =
        kernels::KvItemsPerPage(layout.chunk_bytes(), layer_count * layout.buffers_per_layer(),
                                config.vectors_per_thread, config.bulk_copy);
    const uint64_t max_items = std::numeric_limits<int32_t>::max();
    if (items_per_page > max_items) {
      return absl::InvalidArgumentError(
          absl::StrFormat("one page is %d warp tiles, more than the kernel indexes (%d)",
                          items_per_page, max_items));
    }
    return LaunchPrepared(direction, KernelParams(request, plan, layer_begin, layer_count),
                          items_per_page, stream, config);
  }

  // The per-request fields of a kernel path launch (a request CheckRequest accepted).
  static kernels::KvCopyParams KernelParams(const KvTransferRequest& request, const PlanView& plan,
                                            uint32_t layer_begin, uint32_t layer_count) {
    kernels::KvCopyParams params;
    params.plan = reinterpret_cast<const void*>(request.plan_ptr);
    params.page_indices = request.device_page_indices;
    params.token_slots = request.device_token_slots;
    params.slot_bytes = static_cast<uint32_t>(request.token_slot_bytes);
    params.slot_page_size = request.token_page_size;
    params.num_pages = plan.count;
    params.layer_begin = layer_begin;
    params.layer_count = layer_count;
    return params;
  }

  // Fills the pool-wide fields of `params` and launches.
  absl::Status LaunchPrepared(KvDirection direction, kernels::KvCopyParams params,
                              uint64_t items_per_page, cudaStream_t stream,
                              const KvKernelConfig& config) {
    const KvPageLayout& layout = options_.buffers.layout;
    const uint64_t max_items = std::numeric_limits<int32_t>::max();
    if (items_per_page > max_items) {
      return absl::InvalidArgumentError(
          absl::StrFormat("one page is %d warp tiles, more than the kernel indexes (%d)",
                          items_per_page, max_items));
    }
    params.buffer_table = device_table_;
    params.device_pages = options_.buffers.device_pages;
    params.chunk_bytes = layout.chunk_bytes();
    params.buffers_per_layer = layout.buffers_per_layer();
    params.window_pages = static_cast<uint32_t>(
        std::min<uint64_t>(kernels::kMaxWindowPages, max_items / items_per_page));
    params.error_bits = error_device_;
    // Blocks: the SM budget, but no more than keep every warp (every bulk pipeline) busy; an idle
    // block still pays its plan round trip and slows small transfers down.
    const int threads = config.bulk_copy ? kernels::kBulkThreadsPerBlock : config.threads_per_block;
    const uint64_t items_per_block_round =
        config.bulk_copy ? kernels::kBulkStages : static_cast<uint64_t>(threads / 32);
    const uint64_t total_items = items_per_page * params.num_pages;
    const int blocks = static_cast<int>(std::min<uint64_t>(
        config.sm_budget, (total_items + items_per_block_round - 1) / items_per_block_round));
    kernels::KvCopyLaunch launch{std::max(blocks, 1), threads, config.vectors_per_thread,
                                 static_cast<int>(config.host_load), config.bulk_copy};
    const cudaError_t err = kernels::LaunchKvCopy(direction, params, launch, stream);
    if (err != cudaSuccess) return CudaError(err, "KV copy kernel launch");
    return absl::OkStatus();
  }

  absl::Status Staged(KvDirection direction, const KvTransferRequest& request, uint32_t layer_begin,
                      uint32_t layer_count, cudaStream_t stream, int sm_budget, int copy_streams) {
    FLUXON_RETURN_IF_ERROR(CheckStaged(copy_streams));
    const KvKernelConfig config = StagedKernelConfig(sm_budget);
    FLUXON_RETURN_IF_ERROR(ValidateKernelConfig(config, sm_count_));
    FLUXON_ASSIGN_OR_RETURN(PlanView plan,
                            CheckStagedRequest(direction, request, layer_begin, layer_count));
    MutexLock lock(&mu_);
    FLUXON_RETURN_IF_ERROR(EnsureStreams());
    if (direction == KvDirection::kValuesToDevice) {
      FLUXON_RETURN_IF_ERROR(ForkCopyStreams(stream, copy_streams));
    }
    return StagedLocked(direction, plan, request, layer_begin, layer_count, stream, config,
                        copy_streams);
  }

  absl::Status RestoreLayers(std::span<const KvTransferRequest> requests, uint32_t layer_begin,
                             std::span<const cudaEvent_t> layer_done, cudaStream_t stream,
                             const KvLayerWiseOptions& options, bool continues) {
    const KvPageLayout& layout = options_.buffers.layout;
    if (requests.empty()) return absl::InvalidArgumentError("no restore requests");
    if (layer_done.empty() || layer_begin >= layout.num_layers ||
        layer_done.size() > layout.num_layers - layer_begin) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "layers [%d, %d) are outside the layout's %d layers", layer_begin,
          static_cast<uint64_t>(layer_begin) + layer_done.size(), layout.num_layers));
    }
    for (cudaEvent_t e : layer_done) {
      if (e == nullptr) return absl::InvalidArgumentError("a layer event is null");
    }
    const bool staged = options.path == KvLayerPath::kStaged;
    if (!staged && options.path != KvLayerPath::kKernel) {
      return absl::InvalidArgumentError("unknown layer-wise restore path");
    }
    KvKernelConfig config;
    config.sm_budget = options.sm_budget;
    if (staged) {
      FLUXON_RETURN_IF_ERROR(CheckStaged(options.copy_streams));
      config = StagedKernelConfig(options.sm_budget);
    }
    FLUXON_RETURN_IF_ERROR(ValidateKernelConfig(config, sm_count_));
    const uint32_t layer_count = static_cast<uint32_t>(layer_done.size());
    // Every request is checked before anything is enqueued: a bad one enqueues nothing.
    std::vector<PlanView> plans;
    plans.reserve(requests.size());
    for (const KvTransferRequest& request : requests) {
      FLUXON_ASSIGN_OR_RETURN(
          PlanView plan,
          staged
              ? CheckStagedRequest(KvDirection::kValuesToDevice, request, layer_begin, layer_count)
              : CheckRequest(KvDirection::kValuesToDevice, request, layer_begin, layer_count,
                             /*need_host_indices=*/false, /*allow_token_slots=*/true));
      plans.push_back(plan);
    }
    const uint64_t items_per_page = kernels::KvItemsPerPage(
        layout.chunk_bytes(), layout.buffers_per_layer(), config.vectors_per_thread, false);
    MutexLock lock(&mu_);
    if (staged) {
      FLUXON_RETURN_IF_ERROR(EnsureStreams());
      if (!continues) FLUXON_RETURN_IF_ERROR(ForkCopyStreams(stream, options.copy_streams));
    }
    for (uint32_t i = 0; i < layer_count; ++i) {
      const uint32_t layer = layer_begin + i;
      for (size_t r = 0; r < requests.size(); ++r) {
        if (staged) {
          FLUXON_RETURN_IF_ERROR(StagedLocked(KvDirection::kValuesToDevice, plans[r], requests[r],
                                              layer, 1, stream, config, options.copy_streams));
        } else {
          FLUXON_RETURN_IF_ERROR(LaunchPrepared(KvDirection::kValuesToDevice,
                                                KernelParams(requests[r], plans[r], layer, 1),
                                                items_per_page, stream, config));
        }
      }
      const cudaError_t err = cudaEventRecord(layer_done[i], stream);
      if (err != cudaSuccess) return CudaError(err, "cudaEventRecord (layer done)");
    }
    return absl::OkStatus();
  }

  absl::Status CopyEngine(KvDirection direction, const KvTransferRequest& request,
                          uint32_t layer_begin, uint32_t layer_count, cudaStream_t stream,
                          const KvCopyEngineOptions& options) {
    if (options.num_streams < 1 || options.num_streams > kMaxCopyEngineStreams) {
      return absl::InvalidArgumentError(
          absl::StrFormat("copy-engine num_streams %d is outside [1, %d]", options.num_streams,
                          kMaxCopyEngineStreams));
    }
    FLUXON_ASSIGN_OR_RETURN(PlanView plan, CheckRequest(direction, request, layer_begin,
                                                        layer_count, /*need_host_indices=*/true));
    FLUXON_ASSIGN_OR_RETURN(
        std::vector<KvCopyDescriptor> descriptors,
        BuildCopyDescriptors(direction, options_.buffers,
                             std::span<const uint64_t>(plan.value_ptrs, plan.count),
                             request.host_page_indices, layer_begin, layer_count, options));
    const std::vector<size_t> bounds = SplitDescriptorsByBytes(descriptors, options.num_streams);

    std::vector<void*> dsts(descriptors.size());
    std::vector<const void*> srcs(descriptors.size());
    std::vector<size_t> sizes(descriptors.size());
    for (size_t i = 0; i < descriptors.size(); ++i) {
      dsts[i] = reinterpret_cast<void*>(descriptors[i].dst);
      srcs[i] = reinterpret_cast<const void*>(descriptors[i].src);
      sizes[i] = descriptors[i].bytes;
    }
    cudaMemcpyAttributes attrs = {};
    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attrs.flags = options.prefer_overlap_with_compute ? cudaMemcpyFlagPreferOverlapWithCompute
                                                      : cudaMemcpyFlagDefault;

    MutexLock lock(&mu_);
    FLUXON_RETURN_IF_ERROR(EnsureStreams());
    cudaError_t err = cudaEventRecord(fork_event_, stream);
    if (err != cudaSuccess) return CudaError(err, "cudaEventRecord (copy-engine fork)");
    const size_t runs = bounds.size() - 1;
    for (size_t r = 0; r < runs; ++r) {
      cudaStream_t s = streams_[r];
      err = cudaStreamWaitEvent(s, fork_event_, 0);
      if (err != cudaSuccess) return CudaError(err, "cudaStreamWaitEvent (copy-engine fork)");
      const size_t begin = bounds[r];
      const size_t count = bounds[r + 1] - begin;
      err = CopyBatch(dsts.data() + begin, srcs.data() + begin, sizes.data() + begin, count, &attrs,
                      s);
      if (err != cudaSuccess) return CudaError(err, "cudaMemcpyBatchAsync");
      err = cudaEventRecord(join_events_[r], s);
      if (err != cudaSuccess) return CudaError(err, "cudaEventRecord (copy-engine join)");
      err = cudaStreamWaitEvent(stream, join_events_[r], 0);
      if (err != cudaSuccess) return CudaError(err, "cudaStreamWaitEvent (copy-engine join)");
    }
    return absl::OkStatus();
  }

  absl::Status TakeDeviceErrors() {
    // The word is mapped host memory written by kernels that already finished (caller synced).
    const uint32_t bits = __atomic_exchange_n(error_host_, 0u, __ATOMIC_ACQ_REL);
    if (bits == 0) return absl::OkStatus();
    std::string what;
    if (bits & kKvDeviceErrorBadMagic) what += " the plan's magic was not live when it ran;";
    if (bits & kKvDeviceErrorCountMismatch) {
      what += " the plan's count differed from the number of page indices;";
    }
    if (bits & kKvDeviceErrorPageOutOfRange) {
      what += absl::StrFormat(" a device page index was outside [0, %d) (page skipped);",
                              options_.buffers.device_pages);
    }
    return absl::DataLossError(
        absl::StrFormat("KV copy kernel reported errors (bits 0x%x):%s", bits, what));
  }

  const KvDataPlaneOptions& options() const { return options_; }

 private:
  absl::Status CheckStaged(int copy_streams) const {
    if (staging_ == nullptr) {
      return absl::FailedPreconditionError(
          "the staged copy-engine path is not configured (KvDataPlaneOptions::"
          "staging_group_pages is 0)");
    }
    if (copy_streams < 1 || copy_streams > kMaxStagedCopyStreams) {
      return absl::InvalidArgumentError(absl::StrFormat("staged copy_streams %d is outside [1, %d]",
                                                        copy_streams, kMaxStagedCopyStreams));
    }
    return absl::OkStatus();
  }

  static KvKernelConfig StagedKernelConfig(int sm_budget) {
    KvKernelConfig config;
    config.sm_budget = sm_budget;
    config.vectors_per_thread = 8;
    return config;
  }

  // The staged path's request checks: device indices always (the gather/scatter kernel reads
  // them), host indices only when given.
  absl::StatusOr<PlanView> CheckStagedRequest(KvDirection direction,
                                              const KvTransferRequest& request,
                                              uint32_t layer_begin, uint32_t layer_count) {
    if (request.device_page_indices == nullptr ||
        !Aligned(reinterpret_cast<uint64_t>(request.device_page_indices), sizeof(int64_t))) {
      return absl::InvalidArgumentError(
          "the staged path needs 8-byte aligned device_page_indices (the gather/scatter kernel "
          "reads them)");
    }
    return CheckRequest(direction, request, layer_begin, layer_count,
                        /*need_host_indices=*/false);
  }

  // Makes the first `copy_streams` copy streams wait for everything enqueued on `stream` so far
  // (a restore's copies overwrite the staging slots and destination pages only after that).
  absl::Status ForkCopyStreams(cudaStream_t stream, int copy_streams)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    cudaError_t err = cudaEventRecord(fork_event_, stream);
    for (int r = 0; r < copy_streams && err == cudaSuccess; ++r) {
      err = cudaStreamWaitEvent(streams_[r], fork_event_, 0);
    }
    return err == cudaSuccess ? absl::OkStatus() : CudaError(err, "staged fork");
  }

  // Makes `s` wait until staging slot `slot` is free: every free event its last use recorded (a
  // write's parts on their copy streams, or a restore's scatter), whatever that use's direction.
  cudaError_t WaitSlotFree(cudaStream_t s, uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    cudaError_t err = cudaSuccess;
    for (int r = 0; r < slot_free_events_[slot] && err == cudaSuccess; ++r) {
      err = cudaStreamWaitEvent(s, staged_free_[slot * kMaxStagedCopyStreams + r], 0);
    }
    return err;
  }

  // One staged transfer, checks done and copy streams forked (restore). Groups of pages rotate
  // over the staging slots; within a group the descriptors are split into up to `copy_streams`
  // contiguous parts, part r on copy stream r. Events: a write's gather records ready[slot] on
  // `stream` and each part records free[slot][r] on its copy stream; a restore's parts record
  // ready[slot][r] and the scatter records free[slot] on `stream`. The first touch of a slot
  // waits for its previous use's free event(s), of either direction (WaitSlotFree).
  // Kept as one function on purpose: each group's event records and waits pair up across the
  // copy streams and the kernel stream, and reading the pairing in one place is what keeps it
  // right.
  absl::Status StagedLocked(KvDirection direction, const PlanView& plan,
                            const KvTransferRequest& request, uint32_t layer_begin,
                            uint32_t layer_count, cudaStream_t stream, const KvKernelConfig& config,
                            int copy_streams) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const KvPageLayout& layout = options_.buffers.layout;
    const uint64_t page_bytes = layer_count * layout.layer_bytes();  // selected layers of a page
    const uint64_t value_offset = layer_begin * layout.layer_bytes();
    const uint64_t slot_pages = staging_slot_bytes_ / page_bytes;
    // At least four groups when the batch allows, so the copy engine and the kernel overlap;
    // two for one layer (a layer-wise restore also overlaps a layer's scatter with the next
    // layer's copy, and fewer groups cost less host time per layer: measured on the H200).
    const uint64_t min_groups = layer_count == 1 ? 2 : 4;
    const uint64_t group = std::max<uint64_t>(
        1, std::min<uint64_t>(slot_pages, (plan.count + min_groups - 1) / min_groups));
    const uint32_t slots = options_.staging_slots;
    const uint64_t items_per_page =
        kernels::KvItemsPerPage(layout.chunk_bytes(), layer_count * layout.buffers_per_layer(),
                                config.vectors_per_thread, false);
    const bool write = direction == KvDirection::kDeviceToValues;
    cudaMemcpyAttributes attrs = {};
    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    constexpr int K = kMaxStagedCopyStreams;
    int streams_used = 0;
    cudaError_t err = cudaSuccess;
    std::vector<void*>& dsts = staged_dsts_;
    std::vector<const void*>& srcs = staged_srcs_;
    std::vector<size_t>& sizes = staged_sizes_;
    for (uint64_t g = 0, begin = 0; begin < plan.count; ++g, begin += group) {
      const uint64_t n = std::min<uint64_t>(group, plan.count - begin);
      // Slots rotate across calls too, so the next call's first group does not wait for this
      // call's last one.
      const uint32_t slot = static_cast<uint32_t>((next_slot_ + g) % slots);
      uint8_t* slot_base = staging_ + slot * staging_slot_bytes_;
      // One descriptor per page, merged when the values are adjacent in host memory too.
      dsts.clear();
      srcs.clear();
      sizes.clear();
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t host = plan.value_ptrs[begin + i] + value_offset;
        const uint64_t dev = reinterpret_cast<uint64_t>(slot_base) + i * page_bytes;
        const uint64_t dst = write ? host : dev;
        const uint64_t src = write ? dev : host;
        if (!sizes.empty() && reinterpret_cast<uint64_t>(dsts.back()) + sizes.back() == dst &&
            reinterpret_cast<uint64_t>(srcs.back()) + sizes.back() == src) {
          sizes.back() += page_bytes;
        } else {
          dsts.push_back(reinterpret_cast<void*>(dst));
          srcs.push_back(reinterpret_cast<const void*>(src));
          sizes.push_back(page_bytes);
        }
      }
      const int parts = static_cast<int>(std::min<size_t>(copy_streams, sizes.size()));
      streams_used = std::max(streams_used, parts);
      auto part_begin = [&](int r) { return sizes.size() * r / parts; };
      auto copy_part = [&](int r) {
        const size_t b = part_begin(r);
        return CopyBatch(dsts.data() + b, srcs.data() + b, sizes.data() + b, part_begin(r + 1) - b,
                         &attrs, streams_[r]);
      };
      kernels::KvCopyParams params;
      params.plan = nullptr;
      params.staging_base = reinterpret_cast<uint64_t>(slot_base);
      params.staging_stride = page_bytes;
      params.page_indices = request.device_page_indices + begin;
      params.num_pages = n;
      params.layer_begin = layer_begin;
      params.layer_count = layer_count;
      if (write) {
        err = WaitSlotFree(stream, slot);
        if (err != cudaSuccess) return CudaError(err, "cudaStreamWaitEvent (staging slot)");
        // Gather: KV buffers -> staging slot, as a device-to-device "write".
        FLUXON_RETURN_IF_ERROR(
            LaunchPrepared(KvDirection::kDeviceToValues, params, items_per_page, stream, config));
        err = cudaEventRecord(staged_ready_[slot * K], stream);
        for (int r = 0; r < parts && err == cudaSuccess; ++r) {
          err = cudaStreamWaitEvent(streams_[r], staged_ready_[slot * K], 0);
          if (err == cudaSuccess) err = copy_part(r);
          if (err == cudaSuccess) err = cudaEventRecord(staged_free_[slot * K + r], streams_[r]);
        }
        if (err != cudaSuccess) return CudaError(err, "staged copy (write)");
        slot_free_events_[slot] = parts;
      } else {
        for (int r = 0; r < parts && err == cudaSuccess; ++r) {
          err = WaitSlotFree(streams_[r], slot);
          if (err == cudaSuccess) err = copy_part(r);
          if (err == cudaSuccess) err = cudaEventRecord(staged_ready_[slot * K + r], streams_[r]);
          if (err == cudaSuccess) err = cudaStreamWaitEvent(stream, staged_ready_[slot * K + r], 0);
        }
        if (err != cudaSuccess) return CudaError(err, "staged copy (restore)");
        // Scatter: staging slot -> KV buffers.
        FLUXON_RETURN_IF_ERROR(
            LaunchPrepared(KvDirection::kValuesToDevice, params, items_per_page, stream, config));
        err = cudaEventRecord(staged_free_[slot * K], stream);
        if (err != cudaSuccess) return CudaError(err, "cudaEventRecord (staging slot)");
        slot_free_events_[slot] = 1;
      }
    }
    if (write) {
      // A copy stream is in order: its last copy finishing means all of its copies finished.
      for (int r = 0; r < streams_used && err == cudaSuccess; ++r) {
        err = cudaEventRecord(join_events_[r], streams_[r]);
        if (err == cudaSuccess) err = cudaStreamWaitEvent(stream, join_events_[r], 0);
      }
      if (err != cudaSuccess) return CudaError(err, "staged join");
    }
    const uint64_t groups = (plan.count + group - 1) / group;
    next_slot_ = static_cast<uint32_t>((next_slot_ + groups) % slots);
    return absl::OkStatus();
  }

  // `allow_token_slots`: the kernel path, which can take token slots instead of page indices.
  absl::StatusOr<PlanView> CheckRequest(KvDirection direction, const KvTransferRequest& request,
                                        uint32_t layer_begin, uint32_t layer_count,
                                        bool need_host_indices, bool allow_token_slots = false) {
    const KvPageLayout& layout = options_.buffers.layout;
    if (layer_count == 0 || layer_begin >= layout.num_layers ||
        layer_count > layout.num_layers - layer_begin) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "layer %d is outside the layout's %d layers", layer_begin, layout.num_layers));
    }
    const PlanKind expected =
        direction == KvDirection::kDeviceToValues ? PlanKind::kPut : PlanKind::kGet;
    FLUXON_ASSIGN_OR_RETURN(PlanView plan,
                            ReadTransferPlan(request.plan_ptr, expected, options_.plans));
    if (request.num_pages != plan.count) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "plan holds %d values but %d page indices were given", plan.count, request.num_pages));
    }
    if (request.device_token_slots != nullptr) {
      if (!allow_token_slots) {
        return absl::InvalidArgumentError(
            "token slots are taken by the kernel path only (WritePages, RestorePages, "
            "RestoreLayer, RestoreLayers on the kernel path); give page indices here");
      }
      return CheckTokenSlots(request, plan, layout);
    }
    if (need_host_indices) {
      if (request.host_page_indices.size() != request.num_pages) {
        return absl::InvalidArgumentError(
            absl::StrFormat("the copy-engine path needs %d page indices on the host, got %d",
                            request.num_pages, request.host_page_indices.size()));
      }
    } else {
      if (request.device_page_indices == nullptr) {
        return absl::InvalidArgumentError("device_page_indices is null");
      }
      if (!Aligned(reinterpret_cast<uint64_t>(request.device_page_indices), sizeof(int64_t))) {
        return absl::InvalidArgumentError("device_page_indices is not 8-byte aligned (int64)");
      }
      if (!request.host_page_indices.empty() &&
          request.host_page_indices.size() != request.num_pages) {
        return absl::InvalidArgumentError(
            absl::StrFormat("host_page_indices has %d entries, expected %d",
                            request.host_page_indices.size(), request.num_pages));
      }
    }
    FLUXON_RETURN_IF_ERROR(
        ValidatePageIndices(request.host_page_indices, options_.buffers.device_pages));
    FLUXON_RETURN_IF_ERROR(ValidatePlanValues(plan, layout, options_.registration));
    return plan;
  }

  // A kernel-path request by token slots (CheckRequest's part for them).
  absl::StatusOr<PlanView> CheckTokenSlots(const KvTransferRequest& request, const PlanView& plan,
                                           const KvPageLayout& layout) {
    if (request.device_page_indices != nullptr || !request.host_page_indices.empty()) {
      return absl::InvalidArgumentError(
          "give token slots or page indices, not both (the kernel derives the pages)");
    }
    if (request.token_slot_bytes != 4 && request.token_slot_bytes != 8) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "token slots must be int32 or int64, got %d-byte elements", request.token_slot_bytes));
    }
    if (request.token_page_size == 0) {
      return absl::InvalidArgumentError("token_page_size is 0");
    }
    if (!Aligned(reinterpret_cast<uint64_t>(request.device_token_slots),
                 static_cast<uint64_t>(request.token_slot_bytes))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("device_token_slots is not %d-byte aligned", request.token_slot_bytes));
    }
    FLUXON_RETURN_IF_ERROR(ValidatePlanValues(plan, layout, options_.registration));
    return plan;
  }

  absl::Status EnsureStreams() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!streams_.empty()) return absl::OkStatus();
    cudaError_t err = cudaEventCreateWithFlags(&fork_event_, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError(err, "cudaEventCreate");
    for (int i = 0; i < kMaxCopyEngineStreams; ++i) {
      cudaStream_t s = nullptr;
      err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (err != cudaSuccess) return CudaError(err, "cudaStreamCreate");
      streams_.push_back(s);
      cudaEvent_t e = nullptr;
      err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      if (err != cudaSuccess) return CudaError(err, "cudaEventCreate");
      join_events_.push_back(e);
    }
    for (uint32_t i = 0; i < options_.staging_slots * kMaxStagedCopyStreams; ++i) {
      cudaEvent_t ready = nullptr;
      cudaEvent_t free_slot = nullptr;
      err = cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);
      if (err == cudaSuccess) err = cudaEventCreateWithFlags(&free_slot, cudaEventDisableTiming);
      if (err != cudaSuccess) return CudaError(err, "cudaEventCreate");
      staged_ready_.push_back(ready);
      staged_free_.push_back(free_slot);
    }
    slot_free_events_.assign(options_.staging_slots, 0);
    return absl::OkStatus();
  }

  const KvDataPlaneOptions options_;
  const int sm_count_;
  uint64_t* const device_table_;
  uint32_t* const error_host_;
  uint32_t* const error_device_;
  Mutex mu_;
  std::vector<cudaStream_t> streams_ ABSL_GUARDED_BY(mu_);
  std::vector<cudaEvent_t> join_events_ ABSL_GUARDED_BY(mu_);
  cudaEvent_t fork_event_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint8_t* const staging_;  // device staging buffer of the staged path (null: not configured)
  const uint64_t staging_slot_bytes_;
  // [slot][copy stream]: slot filled (ready) and drained, reusable (free); see StagedLocked.
  std::vector<cudaEvent_t> staged_ready_ ABSL_GUARDED_BY(mu_);
  std::vector<cudaEvent_t> staged_free_ ABSL_GUARDED_BY(mu_);
  // Descriptor scratch of StagedLocked, kept to avoid an allocation per group.
  std::vector<void*> staged_dsts_ ABSL_GUARDED_BY(mu_);
  std::vector<const void*> staged_srcs_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> staged_sizes_ ABSL_GUARDED_BY(mu_);
  uint32_t next_slot_ ABSL_GUARDED_BY(mu_) = 0;  // first slot of the next call
  // Free events staged_free_[slot][0, n) that the last use of each slot recorded.
  std::vector<int> slot_free_events_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<KvDataPlane>> KvDataPlane::Create(KvDataPlaneOptions options) {
  FLUXON_RETURN_IF_ERROR(ValidateDeviceBuffers(options.buffers));
  if (options.staging_group_pages > 0 && (options.staging_slots < 1 || options.staging_slots > 8)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("staging_slots %d is outside [1, 8]", options.staging_slots));
  }
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return CudaError(err, "cudaGetDevice");
  int sm_count = 0;
  err = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return CudaError(err, "cudaDeviceGetAttribute(MultiProcessorCount)");

  const KvDeviceBuffers& buffers = options.buffers;
  std::vector<uint64_t> table;  // [layer][buffer], what the kernel indexes
  table.reserve(buffers.layout.chunks_per_value());
  for (uint32_t layer = 0; layer < buffers.layout.num_layers; ++layer) {
    table.push_back(buffers.k_ptrs[layer]);
    if (buffers.layout.attention == KvAttention::kMha) table.push_back(buffers.v_ptrs[layer]);
  }
  uint64_t* device_table = nullptr;
  err = cudaMalloc(reinterpret_cast<void**>(&device_table), table.size() * sizeof(uint64_t));
  if (err != cudaSuccess) return CudaError(err, "cudaMalloc (KV buffer table)");
  err = cudaMemcpy(device_table, table.data(), table.size() * sizeof(uint64_t),
                   cudaMemcpyHostToDevice);
  if (err != cudaSuccess) {
    cudaFree(device_table);
    return CudaError(err, "cudaMemcpy (KV buffer table)");
  }
  uint32_t* error_host = nullptr;
  err = cudaHostAlloc(reinterpret_cast<void**>(&error_host), sizeof(uint32_t),
                      cudaHostAllocMapped | cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaFree(device_table);
    return CudaError(err, "cudaHostAlloc (KV error word)");
  }
  *error_host = 0;
  uint32_t* error_device = nullptr;
  err = cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_device), error_host, 0);
  if (err != cudaSuccess) {
    cudaFree(device_table);
    cudaFreeHost(error_host);
    return CudaError(err, "cudaHostGetDevicePointer (KV error word)");
  }
  uint8_t* staging = nullptr;
  const uint64_t slot_bytes = options.staging_group_pages * buffers.layout.value_bytes();
  if (options.staging_group_pages > 0) {
    err = cudaMalloc(reinterpret_cast<void**>(&staging), slot_bytes * options.staging_slots);
    if (err != cudaSuccess) {
      cudaFree(device_table);
      cudaFreeHost(error_host);
      return CudaError(err, "cudaMalloc (staging buffer)");
    }
  }
  return std::unique_ptr<KvDataPlane>(new KvDataPlane(std::make_unique<Impl>(
      std::move(options), sm_count, device_table, error_host, error_device, staging, slot_bytes)));
}

KvDataPlane::KvDataPlane(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvDataPlane::~KvDataPlane() = default;

absl::Status KvDataPlane::WritePages(const KvTransferRequest& request, cudaStream_t stream,
                                     const KvKernelConfig& config) {
  return impl_->Launch(KvDirection::kDeviceToValues, request, 0, layout().num_layers, stream,
                       config);
}

absl::Status KvDataPlane::RestorePages(const KvTransferRequest& request, cudaStream_t stream,
                                       const KvKernelConfig& config) {
  return impl_->Launch(KvDirection::kValuesToDevice, request, 0, layout().num_layers, stream,
                       config);
}

absl::Status KvDataPlane::RestoreLayer(const KvTransferRequest& request, uint32_t layer_id,
                                       cudaStream_t stream, const KvKernelConfig& config) {
  return impl_->Launch(KvDirection::kValuesToDevice, request, layer_id, 1, stream, config);
}

absl::Status KvDataPlane::CopyWithCopyEngine(KvDirection direction,
                                             const KvTransferRequest& request,
                                             std::optional<uint32_t> layer, cudaStream_t stream,
                                             const KvCopyEngineOptions& options) {
  if (direction != KvDirection::kDeviceToValues && direction != KvDirection::kValuesToDevice) {
    return absl::InvalidArgumentError("unknown KV copy direction");
  }
  const uint32_t begin = layer.value_or(0);
  const uint32_t count = layer.has_value() ? 1 : layout().num_layers;
  return impl_->CopyEngine(direction, request, begin, count, stream, options);
}

absl::Status KvDataPlane::CopyStaged(KvDirection direction, const KvTransferRequest& request,
                                     std::optional<uint32_t> layer, cudaStream_t stream,
                                     int sm_budget, int copy_streams) {
  if (direction != KvDirection::kDeviceToValues && direction != KvDirection::kValuesToDevice) {
    return absl::InvalidArgumentError("unknown KV copy direction");
  }
  const uint32_t begin = layer.value_or(0);
  const uint32_t count = layer.has_value() ? 1 : layout().num_layers;
  return impl_->Staged(direction, request, begin, count, stream, sm_budget, copy_streams);
}

absl::Status KvDataPlane::RestoreLayers(std::span<const KvTransferRequest> requests,
                                        uint32_t layer_begin,
                                        std::span<const cudaEvent_t> layer_done,
                                        cudaStream_t stream, const KvLayerWiseOptions& options,
                                        bool continues) {
  return impl_->RestoreLayers(requests, layer_begin, layer_done, stream, options, continues);
}

absl::Status KvDataPlane::TakeDeviceErrors() { return impl_->TakeDeviceErrors(); }

const KvDeviceBuffers& KvDataPlane::buffers() const { return impl_->options().buffers; }
const KvPageLayout& KvDataPlane::layout() const { return impl_->options().buffers.layout; }

}  // namespace fluxon
