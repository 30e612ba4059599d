// GPU data-plane benchmark: GB/s of plan-driven KV write (GPU -> values) and restore (values ->
// GPU) against, in the same run, the ceiling (one contiguous cudaMemcpyAsync of the same bytes),
// one cudaMemcpyAsync per chunk, and the copy-engine batch path; GB/s versus SM budget; per-layer
// restore latency. Values live in a real memfd Segment, plans are real PlanRegistry blobs, both
// registered through HostRegistration.
//
// Method: CUDA events around each repetition, warm-up first, median of many repetitions, and the
// batches rotate over three disjoint sets of device pages and values so that no repetition is
// served from the L2 a previous one filled.
//
// Usage: kv_transfer_bench [--verify] [--small] [--quick] [--no-sweep] [--bulk] [--csv FILE]
//   --verify  byte-compare every path on a small case and exit (for compute-sanitizer)
//   --small   tiny shapes (with --verify: the sanitizer case)
//   --quick   fewer repetitions
//   --bulk    measure (or verify) the cp.async.bulk kernel instead of the vector kernel
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fluxon/host_registration.h"
#include "fluxon/kv_transfer.h"
#include "fluxon/plan_blob.h"
#include "kernels/host_mappings.h"
#include "slot/segment.h"

namespace fluxon {
namespace bench {
// plain_copy.cu
cudaError_t LaunchPlainCopy(const void* src, void* dst, uint64_t bytes, int blocks,
                            cudaStream_t stream);
}  // namespace bench
namespace {

#define CUDA_OK(expr)                                                                              \
  do {                                                                                             \
    cudaError_t err_ = (expr);                                                                     \
    if (err_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

void StatusOk(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

template <typename T>
T TakeOk(absl::StatusOr<T> v, const char* what) {
  StatusOk(v.status(), what);
  return std::move(*v);
}

struct Model {
  std::string name;
  KvPageLayout layout;
};

constexpr int kSets = 3;  // rotation depth

// Everything one model's measurements need: device pool, segment values, plans per set and batch.
class Rig {
 public:
  Rig(const Model& model, int max_batch, cudaStream_t stream, uint64_t seed)
      : model_(model), max_batch_(max_batch), stream_(stream), rng_(seed) {
    const KvPageLayout& l = model.layout;
    slot_bytes_ = (l.value_bytes() + 4095) / 4096 * 4096;
    device_pages_ = static_cast<uint64_t>(kSets) * max_batch + 16;
    // Device pool: one allocation per layer buffer, as an inference engine has.
    for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
      for (uint32_t b = 0; b < l.buffers_per_layer(); ++b) {
        void* p = nullptr;
        CUDA_OK(cudaMalloc(&p, device_pages_ * l.chunk_bytes()));
        FillDeviceRandom(p, device_pages_ * l.chunk_bytes());
        (b == 0 ? k_ptrs_ : v_ptrs_).push_back(reinterpret_cast<uint64_t>(p));
      }
    }
    CUDA_OK(cudaMalloc(&scratch_, max_batch * l.value_bytes()));
    // Values: slots of kSets * max_batch values in a memfd segment.
    SegmentOptions so;
    so.size_bytes = slot_bytes_ * kSets * max_batch;
    so.name = "fluxon-bench";
    segment_ = TakeOk(Segment::Create(so), "Segment::Create");
    plans_ = TakeOk(PlanRegistry::Create({4 << 20}), "PlanRegistry::Create");
    std::vector<HostMapping> mappings = {SegmentMapping(*segment_, "cpu:0"),
                                         PlanArenaMapping(*plans_)};
    registration_ = TakeOk(HostRegistration::Register(mappings), "HostRegistration::Register");
    FillHostRandom(segment_->base() + segment_->data_offset(), so.size_bytes);

    KvDataPlaneOptions options;
    options.buffers = KvDeviceBuffers{l, k_ptrs_, v_ptrs_, device_pages_};
    options.plans = plans_.get();
    options.registration = registration_.get();
    options.staging_group_pages = 8;
    plane_ = TakeOk(KvDataPlane::Create(options), "KvDataPlane::Create");

    // Disjoint random device pages per set; values of set s are its own slots, shuffled.
    std::vector<int64_t> all(device_pages_);
    for (uint64_t i = 0; i < device_pages_; ++i) all[i] = static_cast<int64_t>(i);
    std::shuffle(all.begin(), all.end(), rng_);
    for (int s = 0; s < kSets; ++s) {
      sets_[s].pages.assign(all.begin() + s * max_batch, all.begin() + (s + 1) * max_batch);
      for (int i = 0; i < max_batch; ++i) {
        sets_[s].values.push_back(reinterpret_cast<uint64_t>(ValueBase(s)) + i * slot_bytes_);
      }
      std::shuffle(sets_[s].values.begin(), sets_[s].values.end(), rng_);
      CUDA_OK(cudaMalloc(&sets_[s].device_pages, max_batch * sizeof(int64_t)));
      CUDA_OK(cudaMemcpy(sets_[s].device_pages, sets_[s].pages.data(), max_batch * sizeof(int64_t),
                         cudaMemcpyHostToDevice));
    }
  }

  ~Rig() {
    for (uint64_t p : k_ptrs_) cudaFree(reinterpret_cast<void*>(p));
    for (uint64_t p : v_ptrs_) cudaFree(reinterpret_cast<void*>(p));
    for (auto& s : sets_) cudaFree(s.device_pages);
    cudaFree(scratch_);
    plane_.reset();
    registration_.reset();
  }

  // A live plan of `kind` over the first `batch` values of set `s` (cached; never consumed here).
  uint64_t Plan(PlanKind kind, int s, int batch) {
    auto key = std::make_tuple(static_cast<int>(kind), s, batch);
    for (auto& [k, v] : plan_cache_) {
      if (k == key) return v;
    }
    std::vector<uint64_t> values(sets_[s].values.begin(), sets_[s].values.begin() + batch);
    const uint64_t p = TakeOk(plans_->Issue(kind, values), "Issue");
    plan_cache_.push_back({key, p});
    return p;
  }

  KvTransferRequest Request(PlanKind kind, int s, int batch) {
    KvTransferRequest r;
    r.plan_ptr = Plan(kind, s, batch);
    r.device_page_indices = sets_[s].device_pages;
    r.num_pages = batch;
    r.host_page_indices = std::span<const int64_t>(sets_[s].pages.data(), batch);
    return r;
  }

  std::vector<KvCopyDescriptor> Descriptors(KvDirection dir, int s, int batch, uint32_t layer_begin,
                                            uint32_t layer_count) {
    return TakeOk(BuildCopyDescriptors(dir, plane_->buffers(),
                                       std::span<const uint64_t>(sets_[s].values.data(), batch),
                                       std::span<const int64_t>(sets_[s].pages.data(), batch),
                                       layer_begin, layer_count, {.merge_adjacent = false}),
                  "BuildCopyDescriptors");
  }

  uint8_t* ValueBase(int s) const {
    return segment_->base() + segment_->data_offset() + s * max_batch_ * slot_bytes_;
  }
  void* scratch() const { return scratch_; }
  KvDataPlane& plane() { return *plane_; }
  // Another plane over the same buffers with a different staging configuration.
  std::unique_ptr<KvDataPlane> MakePlane(uint32_t group_pages, uint32_t slots) {
    KvDataPlaneOptions options;
    options.buffers = plane_->buffers();
    options.plans = plans_.get();
    options.registration = registration_.get();
    options.staging_group_pages = group_pages;
    options.staging_slots = slots;
    return TakeOk(KvDataPlane::Create(options), "KvDataPlane::Create (staging)");
  }
  const KvPageLayout& layout() const { return model_.layout; }
  const Model& model() const { return model_; }
  uint64_t device_pages() const { return device_pages_; }
  const std::vector<int64_t>& pages(int s) const { return sets_[s].pages; }
  const std::vector<uint64_t>& values(int s) const { return sets_[s].values; }
  uint64_t k_ptr(uint32_t layer) const { return k_ptrs_[layer]; }
  uint64_t v_ptr(uint32_t layer) const { return v_ptrs_[layer]; }

  void FillDeviceRandom(void* p, uint64_t bytes) {
    std::vector<uint64_t> host(std::min<uint64_t>(bytes, 8 << 20) / 8);
    for (auto& w : host) w = rng_();
    for (uint64_t off = 0; off < bytes; off += host.size() * 8) {
      CUDA_OK(cudaMemcpy(static_cast<uint8_t*>(p) + off, host.data(),
                         std::min<uint64_t>(host.size() * 8, bytes - off), cudaMemcpyHostToDevice));
    }
  }
  void FillHostRandom(uint8_t* p, uint64_t bytes) {
    uint64_t x = rng_() | 1;
    auto* w = reinterpret_cast<uint64_t*>(p);
    for (uint64_t i = 0; i < bytes / 8; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      w[i] = x;
    }
  }

 private:
  struct Set {
    std::vector<int64_t> pages;
    std::vector<uint64_t> values;
    int64_t* device_pages = nullptr;
  };
  Model model_;
  int max_batch_;
  cudaStream_t stream_;
  std::mt19937_64 rng_;
  uint64_t slot_bytes_ = 0;
  uint64_t device_pages_ = 0;
  std::vector<uint64_t> k_ptrs_, v_ptrs_;
  void* scratch_ = nullptr;
  std::unique_ptr<Segment> segment_;
  std::unique_ptr<PlanRegistry> plans_;
  std::unique_ptr<HostRegistration> registration_;
  std::unique_ptr<KvDataPlane> plane_;
  Set sets_[kSets];
  std::vector<std::pair<std::tuple<int, int, int>, uint64_t>> plan_cache_;
};

struct Timer {
  cudaStream_t stream;
  int warmup;
  int reps;
  // Median milliseconds of fn(set) over reps, rotating sets.
  double MedianMs(const std::function<void(int)>& fn) {
    cudaEvent_t a, b;
    CUDA_OK(cudaEventCreate(&a));
    CUDA_OK(cudaEventCreate(&b));
    for (int i = 0; i < warmup; ++i) fn(i % kSets);
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      CUDA_OK(cudaEventRecord(a, stream));
      fn(i % kSets);
      CUDA_OK(cudaEventRecord(b, stream));
      CUDA_OK(cudaEventSynchronize(b));
      float t = 0;
      CUDA_OK(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t);
    }
    CUDA_OK(cudaGetLastError());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }
};

double GBps(uint64_t bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

void Csv(FILE* csv, const std::string& section, const std::string& model, const std::string& dir,
         int batch, const std::string& method, const std::string& config, uint64_t bytes,
         double ms) {
  if (csv != nullptr) {
    std::fprintf(csv, "%s,%s,%s,%d,%s,%s,%llu,%.6f,%.3f\n", section.c_str(), model.c_str(),
                 dir.c_str(), batch, method.c_str(), config.c_str(),
                 static_cast<unsigned long long>(bytes), ms, GBps(bytes, ms));
    std::fflush(csv);
  }
}

const char* DirName(KvDirection d) {
  return d == KvDirection::kDeviceToValues ? "write D2H" : "restore H2D";
}

void LaunchKernel(Rig& rig, KvDirection dir, int s, int batch, const KvKernelConfig& cfg,
                  cudaStream_t stream, std::optional<uint32_t> layer = std::nullopt) {
  if (dir == KvDirection::kDeviceToValues) {
    StatusOk(rig.plane().WritePages(rig.Request(PlanKind::kPut, s, batch), stream, cfg),
             "WritePages");
  } else if (layer.has_value()) {
    StatusOk(rig.plane().RestoreLayer(rig.Request(PlanKind::kGet, s, batch), *layer, stream, cfg),
             "RestoreLayer");
  } else {
    StatusOk(rig.plane().RestorePages(rig.Request(PlanKind::kGet, s, batch), stream, cfg),
             "RestorePages");
  }
}

void LaunchCopyEngine(Rig& rig, KvDirection dir, int s, int batch, const KvCopyEngineOptions& o,
                      cudaStream_t stream, std::optional<uint32_t> layer = std::nullopt) {
  const PlanKind kind = dir == KvDirection::kDeviceToValues ? PlanKind::kPut : PlanKind::kGet;
  StatusOk(rig.plane().CopyWithCopyEngine(dir, rig.Request(kind, s, batch), layer, stream, o),
           "CopyWithCopyEngine");
}

void LaunchStaged(Rig& rig, KvDataPlane& plane, KvDirection dir, int s, int batch, int sm_budget,
                  cudaStream_t stream, std::optional<uint32_t> layer = std::nullopt) {
  const PlanKind kind = dir == KvDirection::kDeviceToValues ? PlanKind::kPut : PlanKind::kGet;
  StatusOk(plane.CopyStaged(dir, rig.Request(kind, s, batch), layer, stream, sm_budget),
           "CopyStaged");
}

// The ceiling: one contiguous copy of `bytes` between set s's value area and device scratch.
void LaunchCeiling(Rig& rig, KvDirection dir, int s, uint64_t bytes, cudaStream_t stream) {
  if (dir == KvDirection::kDeviceToValues) {
    CUDA_OK(
        cudaMemcpyAsync(rig.ValueBase(s), rig.scratch(), bytes, cudaMemcpyDeviceToHost, stream));
  } else {
    CUDA_OK(
        cudaMemcpyAsync(rig.scratch(), rig.ValueBase(s), bytes, cudaMemcpyHostToDevice, stream));
  }
}

// ---------------------------------------------------------------------------------------------
// Verification: every path, byte for byte, against per-chunk cudaMemcpy of the same layout.

bool VerifyModel(Rig& rig, cudaStream_t stream, int batch, bool bulk) {
  const KvPageLayout& l = rig.layout();
  bool ok = true;
  auto report = [&](const char* what, bool good) {
    std::printf("  verify %-4s %-34s batch %3d: %s\n", rig.model().name.c_str(), what, batch,
                good ? "ok" : "MISMATCH");
    ok &= good;
  };
  // Reference of set s: each chunk of each value equals the device chunk at its page.
  auto values_match_device = [&](int s, uint32_t layer_begin, uint32_t layer_count) {
    std::vector<uint8_t> chunk(l.chunk_bytes());
    for (int p = 0; p < batch; ++p) {
      for (uint32_t layer = layer_begin; layer < layer_begin + layer_count; ++layer) {
        for (uint32_t b = 0; b < l.buffers_per_layer(); ++b) {
          const uint64_t dev = (b == 0 ? rig.k_ptr(layer) : rig.v_ptr(layer)) +
                               l.device_page_offset(rig.pages(s)[p]);
          CUDA_OK(cudaMemcpy(chunk.data(), reinterpret_cast<void*>(dev), chunk.size(),
                             cudaMemcpyDeviceToHost));
          const auto* val =
              reinterpret_cast<const uint8_t*>(rig.values(s)[p]) + l.chunk_offset(layer, b);
          if (std::memcmp(chunk.data(), val, chunk.size()) != 0) return false;
        }
      }
    }
    return true;
  };
  auto poison_values = [&](int s) {
    for (int p = 0; p < batch; ++p) {
      std::memset(reinterpret_cast<void*>(rig.values(s)[p]), 0xA5, l.value_bytes());
    }
  };
  auto poison_pages = [&](int s) {
    for (int p = 0; p < batch; ++p) {
      for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
        for (uint32_t b = 0; b < l.buffers_per_layer(); ++b) {
          const uint64_t dev = (b == 0 ? rig.k_ptr(layer) : rig.v_ptr(layer)) +
                               l.device_page_offset(rig.pages(s)[p]);
          CUDA_OK(cudaMemset(reinterpret_cast<void*>(dev), 0x5A, l.chunk_bytes()));
        }
      }
    }
  };
  auto randomize_values = [&](int s) {
    for (int p = 0; p < batch; ++p) {
      rig.FillHostRandom(reinterpret_cast<uint8_t*>(rig.values(s)[p]), l.value_bytes());
    }
  };
  const KvKernelConfig cfg{
      .sm_budget = 3, .threads_per_block = 256, .vectors_per_thread = 4, .bulk_copy = bulk};
  const int s = 1;
  // Kernel write.
  poison_values(s);
  LaunchKernel(rig, KvDirection::kDeviceToValues, s, batch, cfg, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  report("kernel write", values_match_device(s, 0, l.num_layers));
  // Kernel restore of fresh host data into poisoned pages.
  randomize_values(s);
  poison_pages(s);
  LaunchKernel(rig, KvDirection::kValuesToDevice, s, batch, cfg, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  report("kernel restore", values_match_device(s, 0, l.num_layers));
  // Per-layer restore of the last layer only.
  randomize_values(s);
  LaunchKernel(rig, KvDirection::kValuesToDevice, s, batch, cfg, stream, l.num_layers - 1);
  CUDA_OK(cudaStreamSynchronize(stream));
  report("kernel restore last layer", values_match_device(s, l.num_layers - 1, 1));
  // Copy engine both ways.
  poison_values(s);
  LaunchCopyEngine(rig, KvDirection::kDeviceToValues, s, batch, {.num_streams = 3}, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  report("copy engine write", values_match_device(s, 0, l.num_layers));
  randomize_values(s);
  poison_pages(s);
  LaunchCopyEngine(rig, KvDirection::kValuesToDevice, s, batch, {.num_streams = 2}, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  report("copy engine restore", values_match_device(s, 0, l.num_layers));
  // Staged path both ways, and one layer.
  poison_values(s);
  LaunchStaged(rig, rig.plane(), KvDirection::kDeviceToValues, s, batch, 3, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  report("staged write", values_match_device(s, 0, l.num_layers));
  randomize_values(s);
  poison_pages(s);
  LaunchStaged(rig, rig.plane(), KvDirection::kValuesToDevice, s, batch, 2, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  report("staged restore", values_match_device(s, 0, l.num_layers));
  randomize_values(s);
  LaunchStaged(rig, rig.plane(), KvDirection::kValuesToDevice, s, batch, 2, stream, 1);
  CUDA_OK(cudaStreamSynchronize(stream));
  report("staged restore layer 1", values_match_device(s, 1, 1));
  StatusOk(rig.plane().TakeDeviceErrors(), "device errors");
  return ok;
}

Model MhaModel(bool small) {
  return small ? Model{"MHA", {KvAttention::kMha, 3, 16, 2 * 64 * 2}}
               : Model{"MHA", {KvAttention::kMha, 36, 64, 4 * 128 * 2}};
}
Model MlaModel(bool small) {
  return small ? Model{"MLA", {KvAttention::kMla, 3, 16, 576}}
               : Model{"MLA", {KvAttention::kMla, 61, 64, 576 * 2}};
}

// ---------------------------------------------------------------------------------------------

struct BenchOptions {
  bool quick = false;
  bool sweep = true;
  bool bulk = false;  // measure the bulk-copy kernel instead of the vector kernel
};

constexpr int kStagedSms = 4;

void BenchModel(Rig& rig, cudaStream_t stream, const BenchOptions& opt, FILE* csv) {
  const bool quick = opt.quick;
  const KvPageLayout& l = rig.layout();
  const std::string& name = rig.model().name;
  const int reps_big = quick ? 7 : 21;
  const int reps_small = quick ? 21 : 101;
  KvKernelConfig default_cfg{};
  default_cfg.bulk_copy = opt.bulk;
  const KvCopyEngineOptions default_ce{};
  const char* kernel_name = opt.bulk ? "bulk kernel" : "kernel";

  std::printf("\n### %s: %u layers x %u buffers, page %u tokens, row %llu B, value %llu B\n",
              name.c_str(), l.num_layers, l.buffers_per_layer(), l.page_size,
              static_cast<unsigned long long>(l.row_bytes),
              static_cast<unsigned long long>(l.value_bytes()));
  std::printf(
      "\n| direction | pages | MiB | ceiling GB/s | memcpy/chunk GB/s | copy engine GB/s "
      "(%% ceil) | %s %d SMs GB/s (%% ceil) | staged CE + %d SMs GB/s (%% ceil) |\n"
      "|---|---|---|---|---|---|---|---|\n",
      kernel_name, default_cfg.sm_budget, kStagedSms);
  for (KvDirection dir : {KvDirection::kDeviceToValues, KvDirection::kValuesToDevice}) {
    for (int batch : {1, 16, 128}) {
      const uint64_t bytes = batch * l.value_bytes();
      Timer t{stream, 3, batch >= 16 ? reps_big : reps_small};
      const double ceil_ms = t.MedianMs([&](int s) { LaunchCeiling(rig, dir, s, bytes, stream); });
      std::vector<std::vector<KvCopyDescriptor>> desc(kSets);
      for (int s = 0; s < kSets; ++s) desc[s] = rig.Descriptors(dir, s, batch, 0, l.num_layers);
      const cudaMemcpyKind kind =
          dir == KvDirection::kDeviceToValues ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
      const double chunk_ms = t.MedianMs([&](int s) {
        for (const auto& d : desc[s]) {
          CUDA_OK(cudaMemcpyAsync(reinterpret_cast<void*>(d.dst),
                                  reinterpret_cast<const void*>(d.src), d.bytes, kind, stream));
        }
      });
      const double ce_ms =
          t.MedianMs([&](int s) { LaunchCopyEngine(rig, dir, s, batch, default_ce, stream); });
      const double k_ms =
          t.MedianMs([&](int s) { LaunchKernel(rig, dir, s, batch, default_cfg, stream); });
      const double st_ms = t.MedianMs(
          [&](int s) { LaunchStaged(rig, rig.plane(), dir, s, batch, kStagedSms, stream); });
      const double ceil = GBps(bytes, ceil_ms);
      std::printf(
          "| %s | %d | %.1f | %.1f | %.1f | %.1f (%.1f%%) | %.1f (%.1f%%) | %.1f (%.1f%%) |\n",
          DirName(dir), batch, bytes / 1048576.0, ceil, GBps(bytes, chunk_ms), GBps(bytes, ce_ms),
          100 * GBps(bytes, ce_ms) / ceil, GBps(bytes, k_ms), 100 * GBps(bytes, k_ms) / ceil,
          GBps(bytes, st_ms), 100 * GBps(bytes, st_ms) / ceil);
      Csv(csv, "main", name, DirName(dir), batch, "staged", "default", bytes, st_ms);
      Csv(csv, "main", name, DirName(dir), batch, "ceiling", "", bytes, ceil_ms);
      Csv(csv, "main", name, DirName(dir), batch, "memcpy_per_chunk", "", bytes, chunk_ms);
      Csv(csv, "main", name, DirName(dir), batch, "copy_engine", "default", bytes, ce_ms);
      Csv(csv, "main", name, DirName(dir), batch, kernel_name, "default", bytes, k_ms);
    }
  }
  StatusOk(rig.plane().TakeDeviceErrors(), "device errors");
  if (!opt.sweep) return;

  // GB/s versus SM budget and kernel shape, 128 pages.
  const int batch = 128;
  const uint64_t bytes = batch * l.value_bytes();
  Timer t{stream, 2, reps_big};
  std::printf(
      "\n%s, 128 pages (%.0f MiB): kernel GB/s by SM budget "
      "(threads x vectors in flight per thread)\n\n",
      name.c_str(), bytes / 1048576.0);
  const std::vector<std::pair<int, int>> shapes = {{1024, 2}, {1024, 4}, {1024, 8}, {512, 8}};
  std::printf("| direction | ceiling |");
  for (int sm : {1, 2, 4, 8, 16, 32}) std::printf(" %d SM |", sm);
  std::printf(" shape |\n|---|---|---|---|---|---|---|---|---|\n");
  for (KvDirection dir : {KvDirection::kDeviceToValues, KvDirection::kValuesToDevice}) {
    const double ceil =
        GBps(bytes, t.MedianMs([&](int s) { LaunchCeiling(rig, dir, s, bytes, stream); }));
    // Plain contiguous SM copy of the same bytes (no plan): what any SM copy reaches.
    std::printf("| %s | %.1f |", DirName(dir), ceil);
    for (int sm : {1, 2, 4, 8, 16, 32}) {
      const double ms = t.MedianMs([&](int s) {
        const void* src = dir == KvDirection::kDeviceToValues ? rig.scratch() : rig.ValueBase(s);
        void* dst = dir == KvDirection::kDeviceToValues ? static_cast<void*>(rig.ValueBase(s))
                                                        : rig.scratch();
        CUDA_OK(bench::LaunchPlainCopy(src, dst, bytes, sm, stream));
      });
      std::printf(" %.1f |", GBps(bytes, ms));
      Csv(csv, "sm_sweep", name, DirName(dir), batch, "plain_sm_copy", "sm=" + std::to_string(sm),
          bytes, ms);
    }
    std::printf(" plain copy, no plan |\n");
    for (auto [threads, vectors] : shapes) {
      for (int load : {0, 1, 2}) {
        const bool restore = dir == KvDirection::kValuesToDevice;
        if (load != 0 && (!restore || vectors != 8 || threads != 1024)) continue;
        if (opt.bulk && (load != 0 || threads != 1024 || vectors != 8)) continue;
        const char* load_name = load == 1 ? " ld.cv" : load == 2 ? " ld.L2::256B" : "";
        std::printf("| %s | %.1f |", DirName(dir), ceil);
        for (int sm : {1, 2, 4, 8, 16, 32}) {
          const KvKernelConfig cfg{sm, threads, vectors, static_cast<KvHostLoad>(load), opt.bulk};
          const double ms =
              t.MedianMs([&](int s) { LaunchKernel(rig, dir, s, batch, cfg, stream); });
          std::printf(" %.1f |", GBps(bytes, ms));
          Csv(csv, "sm_sweep", name, DirName(dir), batch, opt.bulk ? "bulk_kernel" : "kernel",
              "sm=" + std::to_string(sm) + " threads=" + std::to_string(threads) +
                  " vectors=" + std::to_string(vectors) + load_name,
              bytes, ms);
        }
        if (opt.bulk) {
          std::printf(" cp.async.bulk %ux%u KiB |\n", 8u, 16u);
        } else {
          std::printf(" %dx%d%s |\n", threads, vectors, load_name);
        }
      }
    }
  }

  // Copy-engine options.
  std::printf("\n%s, 128 pages: copy-engine GB/s by streams (plan order / host-address order)\n\n",
              name.c_str());
  std::printf(
      "| direction | ceiling | 1 | 4 | 8 | 16 | 24 | 32 | 16, sorted | 16, overlap flag |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  for (KvDirection dir : {KvDirection::kDeviceToValues, KvDirection::kValuesToDevice}) {
    if (opt.bulk) break;  // the bulk run measures kernels only
    const double ceil =
        GBps(bytes, t.MedianMs([&](int s) { LaunchCeiling(rig, dir, s, bytes, stream); }));
    std::printf("| %s | %.1f |", DirName(dir), ceil);
    std::vector<std::pair<std::string, KvCopyEngineOptions>> opts = {
        {"streams=1", {.num_streams = 1}},
        {"streams=4", {.num_streams = 4}},
        {"streams=8", {.num_streams = 8}},
        {"streams=16", {.num_streams = 16}},
        {"streams=24", {.num_streams = 24}},
        {"streams=32", {.num_streams = 32}},
        {"streams=16 sorted", {.num_streams = 16, .sort_by_host_address = true}},
        {"streams=16 overlap", {.num_streams = 16, .prefer_overlap_with_compute = true}},
    };
    for (auto& [label, o] : opts) {
      const double ms = t.MedianMs([&](int s) { LaunchCopyEngine(rig, dir, s, batch, o, stream); });
      std::printf(" %.1f |", GBps(bytes, ms));
      Csv(csv, "ce_sweep", name, DirName(dir), batch, "copy_engine", label, bytes, ms);
    }
    std::printf("\n");
  }

  // Staged copy-engine path: group size x SM budget of the gather/scatter kernel.
  if (!opt.bulk) {
    std::printf(
        "\n%s, 128 pages: staged copy engine GB/s (%% of ceiling) by staging group and "
        "gather/scatter SMs (2 slots)\n\n| direction | ceiling | group | 1 SM | 2 SMs | "
        "4 SMs | 8 SMs |\n|---|---|---|---|---|---|---|\n",
        name.c_str());
    for (KvDirection dir : {KvDirection::kDeviceToValues, KvDirection::kValuesToDevice}) {
      const double ceil =
          GBps(bytes, t.MedianMs([&](int s) { LaunchCeiling(rig, dir, s, bytes, stream); }));
      for (uint32_t group : {4u, 8u, 16u}) {
        std::unique_ptr<KvDataPlane> plane = rig.MakePlane(group, 2);
        std::printf("| %s | %.1f | %u |", DirName(dir), ceil, group);
        for (int sm : {1, 2, 4, 8}) {
          const double ms =
              t.MedianMs([&](int s) { LaunchStaged(rig, *plane, dir, s, batch, sm, stream); });
          std::printf(" %.1f (%.1f%%) |", GBps(bytes, ms), 100 * GBps(bytes, ms) / ceil);
          Csv(csv, "staged_sweep", name, DirName(dir), batch, "staged",
              "group=" + std::to_string(group) + " sm=" + std::to_string(sm), bytes, ms);
        }
        std::printf("\n");
        CUDA_OK(cudaStreamSynchronize(stream));
      }
    }
  }

  // Per-layer restore latency.
  std::printf("\n%s: one-layer restore (layer %u) latency, median\n\n", name.c_str(),
              l.num_layers / 2);
  std::printf(
      "| pages | bytes | ceiling µs (GB/s) | %s 2 SMs µs (%% ceil) | %s 4 SMs µs | %s "
      "8 SMs µs | copy engine µs | staged CE + 4 SMs µs (%% ceil) | plain SM copy 4 SMs "
      "µs |\n|---|---|---|---|---|---|---|---|---|\n",
      kernel_name, kernel_name, kernel_name);
  for (int b : {1, 16, 128}) {
    const uint64_t layer_bytes = b * l.layer_bytes();
    Timer lt{stream, 5, b >= 16 ? reps_small : reps_small * 2};
    const uint32_t layer = l.num_layers / 2;
    const double ceil_ms = lt.MedianMs(
        [&](int s) { LaunchCeiling(rig, KvDirection::kValuesToDevice, s, layer_bytes, stream); });
    double kms[3];
    int i = 0;
    for (int sm : {2, 4, 8}) {
      KvKernelConfig cfg = default_cfg;  // carries the bulk flag
      cfg.sm_budget = sm;
      kms[i] = lt.MedianMs([&](int s) {
        LaunchKernel(rig, KvDirection::kValuesToDevice, s, b, cfg, stream, layer);
      });
      Csv(csv, "layer", name, "restore H2D", b, kernel_name, "sm=" + std::to_string(sm),
          layer_bytes, kms[i]);
      ++i;
    }
    const double ce_ms = lt.MedianMs([&](int s) {
      LaunchCopyEngine(rig, KvDirection::kValuesToDevice, s, b, default_ce, stream, layer);
    });
    const double plain_ms = lt.MedianMs([&](int s) {
      CUDA_OK(bench::LaunchPlainCopy(rig.ValueBase(s), rig.scratch(), layer_bytes, 4, stream));
    });
    Csv(csv, "layer", name, "restore H2D", b, "plain_sm_copy", "sm=4", layer_bytes, plain_ms);
    Csv(csv, "layer", name, "restore H2D", b, "ceiling", "", layer_bytes, ceil_ms);
    Csv(csv, "layer", name, "restore H2D", b, "copy_engine", "default", layer_bytes, ce_ms);
    const double st_ms = lt.MedianMs([&](int s) {
      LaunchStaged(rig, rig.plane(), KvDirection::kValuesToDevice, s, b, 4, stream, layer);
    });
    Csv(csv, "layer", name, "restore H2D", b, "staged", "sm=4", layer_bytes, st_ms);
    std::printf(
        "| %d | %llu | %.1f (%.1f GB/s) | %.1f (%.1f%%) | %.1f | %.1f | %.1f | %.1f (%.1f%%) | "
        "%.1f |\n",
        b, static_cast<unsigned long long>(layer_bytes), ceil_ms * 1e3, GBps(layer_bytes, ceil_ms),
        kms[0] * 1e3, 100 * ceil_ms / kms[0], kms[1] * 1e3, kms[2] * 1e3, ce_ms * 1e3, st_ms * 1e3,
        100 * ceil_ms / st_ms, plain_ms * 1e3);
  }

  // Layer-wise restore as the forward pass drives it: every layer of 128 pages, one launch per
  // layer enqueued back to back (host work overlaps the copies), time per layer.
  {
    const int b = 128;
    const uint64_t all_bytes = b * l.value_bytes();
    Timer pt{stream, 1, quick ? 3 : 7};
    const double ceil_ms = pt.MedianMs(
        [&](int s) { LaunchCeiling(rig, KvDirection::kValuesToDevice, s, all_bytes, stream); });
    auto per_layer = [&](const std::function<void(int, uint32_t)>& one) {
      return pt.MedianMs([&](int s) {
        for (uint32_t layer = 0; layer < l.num_layers; ++layer) one(s, layer);
      });
    };
    KvKernelConfig cfg2 = default_cfg;
    cfg2.sm_budget = 2;
    const double k_ms = per_layer([&](int s, uint32_t layer) {
      LaunchKernel(rig, KvDirection::kValuesToDevice, s, b, cfg2, stream, layer);
    });
    const double st_ms = per_layer([&](int s, uint32_t layer) {
      LaunchStaged(rig, rig.plane(), KvDirection::kValuesToDevice, s, b, 4, stream, layer);
    });
    const double n = l.num_layers;
    std::printf(
        "\n%s: layer-wise restore of 128 pages, %u launches back to back: per layer "
        "ceiling %.1f µs; %s 2 SMs %.1f µs (%.1f%%); staged CE + 4 SMs %.1f µs (%.1f%%)\n",
        name.c_str(), l.num_layers, ceil_ms * 1e3 / n, kernel_name, k_ms * 1e3 / n,
        100 * ceil_ms / k_ms, st_ms * 1e3 / n, 100 * ceil_ms / st_ms);
    Csv(csv, "layer_pipeline", name, "restore H2D", b, "ceiling", "", all_bytes, ceil_ms);
    Csv(csv, "layer_pipeline", name, "restore H2D", b, kernel_name, "sm=2", all_bytes, k_ms);
    Csv(csv, "layer_pipeline", name, "restore H2D", b, "staged", "sm=4", all_bytes, st_ms);
  }
  StatusOk(rig.plane().TakeDeviceErrors(), "device errors");
}

int Main(int argc, char** argv) {
  bool verify = false, small = false;
  BenchOptions opt;
  const char* csv_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--verify")
      verify = true;
    else if (a == "--small")
      small = true;
    else if (a == "--quick")
      opt.quick = true;
    else if (a == "--no-sweep")
      opt.sweep = false;
    else if (a == "--bulk")
      opt.bulk = true;
    else if (a == "--csv" && i + 1 < argc)
      csv_path = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s [--verify] [--small] [--quick] [--no-sweep] [--bulk] [--csv FILE]\n",
                   argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("device: %s, %d SMs, L2 %d MiB, driver %d, runtime %d\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, driver, runtime);
  FILE* csv = nullptr;
  if (csv_path != nullptr) {
    csv = std::fopen(csv_path, "w");
    if (csv) std::fprintf(csv, "section,model,direction,pages,method,config,bytes,ms,gbps\n");
  }
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  if (verify) {
    bool ok = true;
    for (const Model& m : {MhaModel(small), MlaModel(small)}) {
      Rig rig(m, small ? 8 : 128, stream, 1234);
      for (int batch : {1, small ? 5 : 37, small ? 8 : 128}) {
        ok &= VerifyModel(rig, stream, batch, opt.bulk);
      }
    }
    std::printf("verify: %s\n", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  }
  for (const Model& m : {MhaModel(small), MlaModel(small)}) {
    Rig rig(m, 128, stream, 42);
    BenchModel(rig, stream, opt, csv);
  }
  if (csv) std::fclose(csv);
  return 0;
}

}  // namespace
}  // namespace fluxon

int main(int argc, char** argv) { return fluxon::Main(argc, argv); }
