// `_fluxon_kernels`: Python bindings of the hostless data plane (raw pointers and stream handles;
// python/fluxon/kernels.py adds torch wrappers). It ships in the wheel and carries no test hooks:
// the tests' memory (a real memfd Segment) comes from the test support module
// `_fluxon_kernels_testing` (tests/kernels/kernels_testing_module.cc). `PlanArena` is public: a
// caller that drives the kernels over values it placed itself issues its plans there, and a
// DataPlane(plans=arena) refuses any plan the arena did not issue for that direction. It lives in
// this module because a PlanRegistry must be issued and checked by one copy of the library.
//
// Invariants and why:
// - Every absl::Status error becomes a Python exception before control returns (ValueError for
//   caller mistakes, RuntimeError otherwise); no C++ exception escapes from the library itself.
// - A DataPlane keeps the PlanArena and HostRegistration it checks against alive (keep_alive), so
//   Python garbage collection cannot free memory a launch validated against.
// - Launch calls release the GIL; they only validate and enqueue.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "fluxon/host_registration.h"
#include "fluxon/kv_transfer.h"
#include "fluxon/plan_blob.h"
#include "kernels/python/plan_arena.h"

namespace py = pybind11;

namespace fluxon {
namespace {

[[noreturn]] void Raise(const absl::Status& status) {
  const std::string message = status.ToString();
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kNotFound:
      throw py::value_error(message);
    default:
      throw std::runtime_error(message);
  }
}

void Check(const absl::Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Take(absl::StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return std::move(*value);
}

KvAttention ParseAttention(const std::string& name) {
  if (name == "mha" || name == "MHA") return KvAttention::kMha;
  if (name == "mla" || name == "MLA") return KvAttention::kMla;
  throw py::value_error("attention must be 'mha' or 'mla', got '" + name + "'");
}

KvDirection ParseDirection(const std::string& name) {
  if (name == "write") return KvDirection::kDeviceToValues;
  if (name == "restore") return KvDirection::kValuesToDevice;
  throw py::value_error("direction must be 'write' or 'restore', got '" + name + "'");
}

cudaStream_t StreamOf(uint64_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

class PyRegistration {
 public:
  explicit PyRegistration(std::unique_ptr<HostRegistration> registration)
      : registration_(std::move(registration)) {}
  const HostRegistration* get() const { return registration_.get(); }
  void Close() { registration_.reset(); }
  bool closed() const { return registration_ == nullptr; }

 private:
  std::unique_ptr<HostRegistration> registration_;
};

KvHostLoad ParseHostLoad(const std::string& name) {
  if (name == "streaming") return KvHostLoad::kStreaming;
  if (name == "bypass") return KvHostLoad::kBypassCache;
  if (name == "prefetch256") return KvHostLoad::kPrefetch256B;
  throw py::value_error("host_load must be 'streaming', 'bypass' or 'prefetch256', got '" + name +
                        "'");
}

KvKernelConfig MakeConfig(int sm_budget, int threads_per_block, int vectors_per_thread,
                          const std::string& host_load, bool bulk_copy) {
  return KvKernelConfig{sm_budget, threads_per_block, vectors_per_thread, ParseHostLoad(host_load),
                        bulk_copy};
}

// CUDA events owned here (one per layer of a layer-wise restore): recorded by RestoreLayers,
// waited for by the thread that completes the layer counter, with the GIL released.
class PyLayerEvents {
 public:
  explicit PyLayerEvents(uint32_t count) {
    if (count == 0) throw py::value_error("LayerEvents needs at least one event");
    events_.reserve(count);
    for (uint32_t i = 0; i < count; ++i) {
      cudaEvent_t e = nullptr;
      const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      if (err != cudaSuccess) {
        Destroy();
        throw std::runtime_error(std::string("cudaEventCreate failed: ") + cudaGetErrorString(err));
      }
      events_.push_back(e);
    }
  }
  ~PyLayerEvents() { Destroy(); }
  PyLayerEvents(const PyLayerEvents&) = delete;
  PyLayerEvents& operator=(const PyLayerEvents&) = delete;

  size_t size() const { return events_.size(); }
  std::span<const cudaEvent_t> Slice(uint32_t begin, uint32_t count) const {
    if (begin > events_.size() || count > events_.size() - begin) {
      throw py::value_error("event range is outside the LayerEvents");
    }
    return std::span<const cudaEvent_t>(events_).subspan(begin, count);
  }
  cudaEvent_t at(uint32_t i) const {
    if (i >= events_.size()) throw py::index_error("no such layer event");
    return events_[i];
  }
  // True once event i completed (or was never recorded); raises on a device error.
  bool Query(uint32_t i) const {
    const cudaError_t err = cudaEventQuery(at(i));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    Raise(absl::InternalError(std::string("cudaEventQuery failed: ") + cudaGetErrorString(err)));
  }
  void Synchronize(uint32_t i) const {
    cudaEvent_t e = at(i);
    cudaError_t err;
    {
      py::gil_scoped_release release;
      err = cudaEventSynchronize(e);
    }
    if (err != cudaSuccess) {
      Raise(absl::InternalError(std::string("cudaEventSynchronize failed: ") +
                                cudaGetErrorString(err)));
    }
  }

 private:
  void Destroy() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    events_.clear();
  }
  std::vector<cudaEvent_t> events_;
};

class PyDataPlane {
 public:
  PyDataPlane(const KvPageLayout& layout, std::vector<uint64_t> k_ptrs,
              std::vector<uint64_t> v_ptrs, uint64_t device_pages, const python::PlanArena* plans,
              const PyRegistration* registration, uint32_t staging_group_pages,
              uint32_t staging_slots) {
    KvDataPlaneOptions options;
    options.staging_group_pages = staging_group_pages;
    options.staging_slots = staging_slots;
    options.buffers = KvDeviceBuffers{layout, std::move(k_ptrs), std::move(v_ptrs), device_pages};
    options.plans = plans != nullptr ? &plans->registry() : nullptr;
    if (registration != nullptr && registration->closed()) {
      throw py::value_error("the host registration was closed");
    }
    options.registration = registration != nullptr ? registration->get() : nullptr;
    plane_ = Take(KvDataPlane::Create(std::move(options)));
  }

  void Kernel(const std::string& op, uint64_t plan_ptr, uint64_t page_indices_ptr,
              uint64_t num_pages, uint64_t stream, std::optional<uint32_t> layer_id,
              const std::optional<std::vector<int64_t>>& host_page_indices, int sm_budget,
              int threads_per_block, int vectors_per_thread, const std::string& host_load,
              bool bulk, uint64_t token_slots_ptr, int token_slot_bytes, uint32_t page_size) {
    KvTransferRequest request;
    request.plan_ptr = plan_ptr;
    request.device_page_indices = reinterpret_cast<const int64_t*>(page_indices_ptr);
    request.num_pages = num_pages;
    request.device_token_slots = reinterpret_cast<const void*>(token_slots_ptr);
    request.token_slot_bytes = token_slot_bytes;
    request.token_page_size = page_size;
    if (host_page_indices.has_value()) request.host_page_indices = *host_page_indices;
    const KvKernelConfig config =
        MakeConfig(sm_budget, threads_per_block, vectors_per_thread, host_load, bulk);
    absl::Status status;
    {
      py::gil_scoped_release release;
      if (op == "write") {
        status = plane_->WritePages(request, StreamOf(stream), config);
      } else if (layer_id.has_value()) {
        status = plane_->RestoreLayer(request, *layer_id, StreamOf(stream), config);
      } else {
        status = plane_->RestorePages(request, StreamOf(stream), config);
      }
    }
    Check(status);
  }

  void CopyEngine(const std::string& direction, uint64_t plan_ptr,
                  const std::vector<int64_t>& host_page_indices, uint64_t stream,
                  std::optional<uint32_t> layer_id, int num_streams, bool merge, bool sort,
                  bool overlap) {
    KvTransferRequest request;
    request.plan_ptr = plan_ptr;
    request.num_pages = host_page_indices.size();
    request.host_page_indices = host_page_indices;
    const KvCopyEngineOptions options{num_streams, merge, sort, overlap};
    const KvDirection dir = ParseDirection(direction);
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = plane_->CopyWithCopyEngine(dir, request, layer_id, StreamOf(stream), options);
    }
    Check(status);
  }

  void Staged(const std::string& direction, uint64_t plan_ptr, uint64_t page_indices_ptr,
              const std::optional<std::vector<int64_t>>& host_page_indices, uint64_t stream,
              std::optional<uint32_t> layer_id, int sm_budget, int copy_streams,
              std::optional<uint64_t> num_pages) {
    KvTransferRequest request;
    request.plan_ptr = plan_ptr;
    request.device_page_indices = reinterpret_cast<const int64_t*>(page_indices_ptr);
    if (host_page_indices.has_value()) {
      request.host_page_indices = *host_page_indices;
      request.num_pages = host_page_indices->size();
      if (num_pages.has_value() && *num_pages != request.num_pages) {
        throw py::value_error("num_pages differs from len(host_page_indices)");
      }
    } else if (num_pages.has_value()) {
      request.num_pages = *num_pages;
    } else {
      throw py::value_error("copy_staged needs host_page_indices or num_pages");
    }
    const KvDirection dir = ParseDirection(direction);
    absl::Status status;
    {
      py::gil_scoped_release release;
      status =
          plane_->CopyStaged(dir, request, layer_id, StreamOf(stream), sm_budget, copy_streams);
    }
    Check(status);
  }

  // requests: (plan_ptr, device page indices pointer, number of pages) per get plan.
  void RestoreLayers(const std::vector<std::tuple<uint64_t, uint64_t, uint64_t>>& requests,
                     uint32_t layer_begin, const PyLayerEvents& events, uint32_t event_begin,
                     uint32_t layer_count, uint64_t stream, const std::string& path, int sm_budget,
                     int copy_streams, bool continues) {
    KvLayerWiseOptions options;
    if (path == "kernel") {
      options.path = KvLayerPath::kKernel;
    } else if (path == "staged") {
      options.path = KvLayerPath::kStaged;
    } else {
      throw py::value_error("path must be 'kernel' or 'staged', got '" + path + "'");
    }
    options.sm_budget = sm_budget;
    options.copy_streams = copy_streams;
    std::vector<KvTransferRequest> reqs(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      reqs[i].plan_ptr = std::get<0>(requests[i]);
      reqs[i].device_page_indices = reinterpret_cast<const int64_t*>(std::get<1>(requests[i]));
      reqs[i].num_pages = std::get<2>(requests[i]);
    }
    const std::span<const cudaEvent_t> done = events.Slice(event_begin, layer_count);
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = plane_->RestoreLayers(reqs, layer_begin, done, StreamOf(stream), options, continues);
    }
    Check(status);
  }

  void TakeDeviceErrors() { Check(plane_->TakeDeviceErrors()); }
  const KvPageLayout& layout() const { return plane_->layout(); }

 private:
  std::unique_ptr<KvDataPlane> plane_;
};

}  // namespace
}  // namespace fluxon

// The binding table: one declaration per Python name, long because the module is wide, not
// because it holds logic (the logic is in the Py* classes above).
PYBIND11_MODULE(_fluxon_kernels, m) {
  using namespace fluxon;
  m.doc() = "Fluxon hostless data plane: plan-driven KV copy kernels and the copy-engine path";

  py::class_<KvPageLayout>(m, "KvLayout")
      .def(py::init([](const std::string& attention, uint32_t num_layers, uint32_t page_size,
                       uint64_t row_bytes) {
             KvPageLayout layout{ParseAttention(attention), num_layers, page_size, row_bytes};
             Check(ValidateLayout(layout));
             return layout;
           }),
           py::arg("attention"), py::arg("num_layers"), py::arg("page_size"), py::arg("row_bytes"))
      .def_property_readonly(
          "attention",
          [](const KvPageLayout& l) { return l.attention == KvAttention::kMha ? "mha" : "mla"; })
      .def_readonly("num_layers", &KvPageLayout::num_layers)
      .def_readonly("page_size", &KvPageLayout::page_size)
      .def_readonly("row_bytes", &KvPageLayout::row_bytes)
      .def_property_readonly("buffers_per_layer", &KvPageLayout::buffers_per_layer)
      .def_property_readonly("chunk_bytes", &KvPageLayout::chunk_bytes)
      .def_property_readonly("layer_bytes", &KvPageLayout::layer_bytes)
      .def_property_readonly("value_bytes", &KvPageLayout::value_bytes)
      .def("chunk_offset", &KvPageLayout::chunk_offset, py::arg("layer"), py::arg("buffer"));

  py::class_<PyRegistration>(m, "HostRegistration")
      .def("close", &PyRegistration::Close)
      .def_property_readonly("closed", &PyRegistration::closed)
      .def("contains", [](const PyRegistration& r, uint64_t ptr,
                          uint64_t bytes) { return !r.closed() && r.get()->Contains(ptr, bytes); })
      .def("__enter__", [](PyRegistration& r) -> PyRegistration& { return r; })
      .def("__exit__", [](PyRegistration& r, py::args) { r.Close(); });

  m.def(
      "register_host_mappings",
      [](const std::vector<std::tuple<std::string, uint64_t, uint64_t>>& mappings) {
        std::vector<HostMapping> list;
        for (const auto& [label, base, bytes] : mappings) {
          list.push_back(HostMapping{label, reinterpret_cast<void*>(base), bytes});
        }
        return std::make_unique<PyRegistration>(Take(HostRegistration::Register(list)));
      },
      py::arg("mappings"),
      "cudaHostRegister every (label, base, bytes) mapping in the current CUDA context, or none; "
      "raises on any failure (never a fallback to unregistered memory).");

  m.def(
      "pages_from_slots",
      [](uint64_t slots_ptr, int slot_bytes, uint64_t num_slots, uint32_t page_size,
         uint64_t pages_ptr, uint64_t stream) {
        Check(PagesFromTokenSlots(reinterpret_cast<const void*>(slots_ptr), slot_bytes, num_slots,
                                  page_size, reinterpret_cast<int64_t*>(pages_ptr),
                                  StreamOf(stream)));
      },
      py::arg("slots_ptr"), py::arg("slot_bytes"), py::arg("num_slots"), py::arg("page_size"),
      py::arg("pages_ptr"), py::arg("stream") = 0,
      "Page index (or -1 for a slot row that is not one whole, aligned page) of every page_size "
      "token slots, computed on the device on `stream` (see PagesFromTokenSlots).");

  py::class_<PyLayerEvents>(m, "LayerEvents")
      .def(py::init<uint32_t>(), py::arg("count"))
      .def("__len__", &PyLayerEvents::size)
      .def("query", &PyLayerEvents::Query, py::arg("index"))
      .def("synchronize", &PyLayerEvents::Synchronize, py::arg("index"),
           "Waits (GIL released) until event `index` completed.");

  using python::PlanArena;
  py::class_<PlanArena>(
      m, "PlanArena",
      "Plan blobs issued in this process for values the caller placed itself (a Fluxon client "
      "issues its own). issue_put / issue_get return a plan address; a DataPlane(plans=arena) "
      "refuses a plan the arena did not issue, or issued for the other direction. Register "
      "mapping() with the values so the kernels can read the plans.")
      .def(py::init([](uint64_t arena_bytes) { return Take(PlanArena::Create(arena_bytes)); }),
           py::arg("arena_bytes") = 1 << 20)
      .def(
          "issue_put",
          [](PlanArena& a, const std::vector<uint64_t>& v) {
            return Take(a.Issue(PlanKind::kPut, v));
          },
          py::arg("value_ptrs"))
      .def(
          "issue_get",
          [](PlanArena& a, const std::vector<uint64_t>& v) {
            return Take(a.Issue(PlanKind::kGet, v));
          },
          py::arg("value_ptrs"))
      .def(
          "consume_put", [](PlanArena& a, uint64_t p) { Check(a.Consume(p, PlanKind::kPut)); },
          py::arg("plan_ptr"), "Retires a put plan (raises if it is not a live put plan).")
      .def(
          "consume_get", [](PlanArena& a, uint64_t p) { Check(a.Consume(p, PlanKind::kGet)); },
          py::arg("plan_ptr"), "Retires a get plan (raises if it is not a live get plan).")
      .def("mapping", [](const PlanArena& a) {
        return std::make_tuple(std::string("plan_arena"),
                               reinterpret_cast<uint64_t>(a.registry().arena_base()),
                               static_cast<uint64_t>(a.registry().arena_bytes()));
      });

  py::class_<PyDataPlane>(m, "DataPlane")
      .def(py::init<const KvPageLayout&, std::vector<uint64_t>, std::vector<uint64_t>, uint64_t,
                    const python::PlanArena*, const PyRegistration*, uint32_t, uint32_t>(),
           py::arg("layout"), py::arg("k_ptrs"), py::arg("v_ptrs"), py::arg("device_pages"),
           py::arg("plans") = nullptr, py::arg("registration") = nullptr,
           py::arg("staging_group_pages") = 0, py::arg("staging_slots") = 2, py::keep_alive<1, 6>(),
           py::keep_alive<1, 7>())
      .def_property_readonly("layout", &PyDataPlane::layout)
      .def(
          "write_pages",
          [](PyDataPlane& d, uint64_t plan_ptr, uint64_t page_indices_ptr, uint64_t num_pages,
             uint64_t stream, std::optional<std::vector<int64_t>> host_page_indices, int sm_budget,
             int threads_per_block, int vectors_per_thread, const std::string& host_load, bool bulk,
             uint64_t token_slots_ptr, int token_slot_bytes, uint32_t page_size) {
            d.Kernel("write", plan_ptr, page_indices_ptr, num_pages, stream, std::nullopt,
                     host_page_indices, sm_budget, threads_per_block, vectors_per_thread, host_load,
                     bulk, token_slots_ptr, token_slot_bytes, page_size);
          },
          py::arg("plan_ptr"), py::arg("page_indices_ptr"), py::arg("num_pages"),
          py::arg("stream") = 0, py::arg("host_page_indices") = py::none(),
          py::arg("sm_budget") = KvKernelConfig{}.sm_budget,
          py::arg("threads_per_block") = KvKernelConfig{}.threads_per_block,
          py::arg("vectors_per_thread") = KvKernelConfig{}.vectors_per_thread,
          py::arg("host_load") = "streaming", py::arg("bulk_copy") = false,
          py::arg("token_slots_ptr") = 0, py::arg("token_slot_bytes") = 0, py::arg("page_size") = 0,
          "Every layer of num_pages pages, device -> the put plan's values. The pages are given "
          "by page_indices_ptr (int64 in device memory) or, with page_indices_ptr 0, derived in "
          "the same kernel from token_slots_ptr (num_pages * page_size token slots of "
          "token_slot_bytes 4 or 8 in device memory; a row that is not one whole, aligned page "
          "is skipped and reported by take_device_errors).")
      .def(
          "restore_pages",
          [](PyDataPlane& d, uint64_t plan_ptr, uint64_t page_indices_ptr, uint64_t num_pages,
             uint64_t stream, std::optional<uint32_t> layer_id,
             std::optional<std::vector<int64_t>> host_page_indices, int sm_budget,
             int threads_per_block, int vectors_per_thread, const std::string& host_load, bool bulk,
             uint64_t token_slots_ptr, int token_slot_bytes, uint32_t page_size) {
            d.Kernel("restore", plan_ptr, page_indices_ptr, num_pages, stream, layer_id,
                     host_page_indices, sm_budget, threads_per_block, vectors_per_thread, host_load,
                     bulk, token_slots_ptr, token_slot_bytes, page_size);
          },
          py::arg("plan_ptr"), py::arg("page_indices_ptr"), py::arg("num_pages"),
          py::arg("stream") = 0, py::arg("layer_id") = py::none(),
          py::arg("host_page_indices") = py::none(),
          py::arg("sm_budget") = KvKernelConfig{}.sm_budget,
          py::arg("threads_per_block") = KvKernelConfig{}.threads_per_block,
          py::arg("vectors_per_thread") = KvKernelConfig{}.vectors_per_thread,
          py::arg("host_load") = "streaming", py::arg("bulk_copy") = false,
          py::arg("token_slots_ptr") = 0, py::arg("token_slot_bytes") = 0, py::arg("page_size") = 0,
          "Every layer (or layer_id) of num_pages pages, the get plan's values -> device; the "
          "pages as for write_pages (page indices, or token slots the kernel turns into pages).")
      .def("copy_engine", &PyDataPlane::CopyEngine, py::arg("direction"), py::arg("plan_ptr"),
           py::arg("host_page_indices"), py::arg("stream") = 0, py::arg("layer_id") = py::none(),
           py::arg("num_streams") = KvCopyEngineOptions{}.num_streams,
           py::arg("merge_adjacent") = true, py::arg("sort_by_host_address") = false,
           py::arg("prefer_overlap_with_compute") = false)
      .def("copy_staged", &PyDataPlane::Staged, py::arg("direction"), py::arg("plan_ptr"),
           py::arg("page_indices_ptr"), py::arg("host_page_indices") = py::none(),
           py::arg("stream") = 0, py::arg("layer_id") = py::none(), py::arg("sm_budget") = 8,
           py::arg("copy_streams") = 1, py::arg("num_pages") = py::none(),
           "Staged copy-engine path (see KvDataPlane::CopyStaged); needs staging_group_pages. "
           "Without host_page_indices give num_pages (the kernel then range-checks the pages: "
           "call take_device_errors before publishing written values).")
      .def("restore_layers", &PyDataPlane::RestoreLayers, py::arg("requests"),
           py::arg("layer_begin"), py::arg("events"), py::arg("event_begin"),
           py::arg("layer_count"), py::arg("stream") = 0, py::arg("path") = "kernel",
           py::arg("sm_budget") = KvLayerWiseOptions{}.sm_budget,
           py::arg("copy_streams") = KvLayerWiseOptions{}.copy_streams,
           py::arg("continues") = false,
           "Layer-wise restore (KvDataPlane::RestoreLayers) of [(plan_ptr, page_indices_ptr, "
           "num_pages)]: layers layer_begin.. for layer_count layers, events[event_begin + i] "
           "recorded after layer layer_begin + i.")
      .def("take_device_errors", &PyDataPlane::TakeDeviceErrors,
           "Raise if a kernel reported an error since the last call (call after the stream "
           "finished).");
}
