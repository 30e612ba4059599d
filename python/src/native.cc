// fluxon._native: the pybind11 binding of libfluxon_client. Errors cross into Python as
// _native.Error(code, message, conflict_indices); the pure-Python layer maps codes to the public
// exception classes. Every call that talks to the owner or waits releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "fluxon/client.h"
#include "fluxon/config.h"
#include "fluxon/plan_blob_abi.h"
#include "fluxon/units.h"
#include "fluxon/version.h"

namespace py = pybind11;

namespace fluxon {
namespace {

struct NativeError {
  int code;
  std::string message;
  std::vector<uint32_t> conflict_indices;
};

[[noreturn]] void Raise(const absl::Status& s, std::vector<uint32_t> conflicts = {}) {
  throw NativeError{static_cast<int>(s.code()), std::string(s.message()), std::move(conflicts)};
}

template <typename T>
T Unwrap(absl::StatusOr<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(*r);
}

void Check(const absl::Status& s) {
  if (!s.ok()) Raise(s);
}

class PyFuture {
 public:
  explicit PyFuture(KvFuture f) : f_(std::move(f)) {}
  bool done() const { return f_.done(); }
  // Returns (code, message); code 4 (DeadlineExceeded) when the wait timed out.
  std::pair<int, std::string> wait(std::optional<double> timeout_s) const {
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      if (timeout_s) {
        s = f_.Wait(std::chrono::milliseconds(static_cast<int64_t>(*timeout_s * 1000)));
      } else {
        s = f_.Wait();
      }
    }
    return {static_cast<int>(s.code()), std::string(s.message())};
  }

 private:
  KvFuture f_;
};

class PyHandle {
 public:
  explicit PyHandle(GetStartHandle h) : h_(std::move(h)) {}
  const GetStartHandle& get() const { return h_; }
  py::dict result() const {
    const GetStartResult& r = h_.result;
    py::dict d;
    d["raw_prefix_hit_len"] = r.raw_prefix_hit_len;
    d["transferable_len"] = r.transferable_len;
    d["prefix_hit_groups"] = r.prefix_hit_groups;
    d["first_miss_index"] = r.first_miss_index ? py::cast(*r.first_miss_index) : py::none();
    d["first_miss_group_index"] =
        r.first_miss_group_index ? py::cast(*r.first_miss_group_index) : py::none();
    d["all_hit"] = r.all_hit;
    d["local_pinned"] = r.local_pinned;
    d["inflight_joined"] = r.inflight_joined;
    d["leader_started"] = r.leader_started;
    return d;
  }

 private:
  GetStartHandle h_;
};

class PyClient {
 public:
  explicit PyClient(const std::string& socket_path) {
    ClientOptions o;
    o.socket_path = socket_path;
    absl::StatusOr<std::unique_ptr<KvClient>> c;
    {
      py::gil_scoped_release nogil;
      c = KvClient::Connect(o);
    }
    client_ = Unwrap(std::move(c));
  }

  py::list segments() const {
    py::list out;
    for (const SegmentMapping& m : client_->WaitLocalSegmentsReady()) {
      py::dict d;
      d["segment_label"] = m.segment_label;
      d["write_ptr"] = m.write_ptr;
      d["read_ptr"] = m.read_ptr;
      d["len"] = m.len;
      d["generation"] = m.generation;
      d["node_id"] = m.node_id;
      out.append(d);
    }
    return out;
  }

  std::pair<uint64_t, uint64_t> plan_arena() const { return client_->PlanArena(); }

  void prefault_segment() {
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = client_->PrefaultSegment();
    }
    Check(s);
  }

  uint64_t put_start(const std::vector<std::string>& keys, int64_t value_len, bool reject_inflight,
                     bool reject_exist, bool write_through, bool make_replica_task,
                     std::vector<bool> mask, std::vector<uint32_t> groups, std::string lease_id,
                     std::string parent_key) {
    PutOptions o;
    o.reject_if_inflight_same_key = reject_inflight;
    o.reject_if_exist_same_key = reject_exist;
    o.write_through = write_through;
    o.make_replica_task = make_replica_task;
    o.make_replica_task_mask = std::move(mask);
    o.atomic_group_lens = std::move(groups);
    o.lease_id = std::move(lease_id);
    o.parent_key = std::move(parent_key);
    std::vector<uint32_t> conflicts;
    absl::StatusOr<uint64_t> plan;
    {
      py::gil_scoped_release nogil;
      plan = client_->LocalFastPutStart(keys, value_len, o, &conflicts);
    }
    if (!plan.ok()) Raise(plan.status(), std::move(conflicts));
    return *plan;
  }

  PyFuture put_commit(uint64_t plan) {
    absl::StatusOr<KvFuture> f;
    {
      py::gil_scoped_release nogil;
      f = client_->LocalFastPutCommit(plan);
    }
    return PyFuture(Unwrap(std::move(f)));
  }

  void put_abort(uint64_t plan) {
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = client_->PutAbort(plan);
    }
    Check(s);
  }

  PyHandle get_start(const std::vector<std::string>& keys, bool best_effort,
                     std::vector<uint32_t> groups) {
    absl::StatusOr<GetStartHandle> h;
    {
      py::gil_scoped_release nogil;
      h = client_->GetStart(keys, best_effort, groups);
    }
    return PyHandle(Unwrap(std::move(h)));
  }

  uint64_t get_transfer(const PyHandle& h, std::optional<uint32_t> consume) {
    absl::StatusOr<uint64_t> plan;
    {
      py::gil_scoped_release nogil;
      plan = client_->GetTransfer(h.get(), consume);
    }
    return Unwrap(std::move(plan));
  }

  void cancel_get_transfer(const PyHandle& h) {
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = client_->CancelGetTransfer(h.get());
    }
    Check(s);
  }

  void release_views(uint64_t plan) {
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = client_->ReleaseViews(plan);
    }
    Check(s);
  }

  std::map<std::string, int64_t> stats() {
    absl::StatusOr<std::map<std::string, int64_t>> s;
    {
      py::gil_scoped_release nogil;
      s = client_->Stats();
    }
    return Unwrap(std::move(s));
  }

  std::pair<uint64_t, uint64_t> delete_prefix(const std::string& prefix) {
    absl::StatusOr<std::pair<uint64_t, uint64_t>> s;
    {
      py::gil_scoped_release nogil;
      s = client_->DeletePrefix(prefix);
    }
    return Unwrap(std::move(s));
  }

 private:
  std::unique_ptr<KvClient> client_;
};

void CopyPlan(uint64_t plan, uint64_t host, uint64_t value_len, bool to_values, int threads) {
  absl::Status s;
  {
    py::gil_scoped_release nogil;
    s = CopyPlanValues(plan, reinterpret_cast<uint8_t*>(host), value_len,
                       to_values ? CopyDirection::kToValues : CopyDirection::kFromValues, threads);
  }
  Check(s);
}

void CopySegments(uint64_t plan, uint64_t value_count, uint64_t value_len,
                  const std::vector<uint64_t>& seg_ptrs, const std::vector<uint64_t>& seg_sizes,
                  uint64_t segs_per_value, bool to_values, int threads) {
  absl::Status s;
  {
    py::gil_scoped_release nogil;
    s = CopyPlanSegments(plan, value_count, value_len, seg_ptrs, seg_sizes, segs_per_value,
                         to_values ? CopyDirection::kToValues : CopyDirection::kFromValues,
                         threads);
  }
  Check(s);
}

std::vector<uint64_t> PlanValuePointers(uint64_t plan) {
  if (plan == 0) Raise(absl::InvalidArgumentError("null plan"));
  const auto* h = reinterpret_cast<const PlanBlobHeader*>(plan);
  if (h->magic != kPlanBlobMagic) Raise(absl::InvalidArgumentError("not a live Fluxon plan"));
  const uint64_t* p = PlanValuePtrs(reinterpret_cast<const void*>(plan));
  return std::vector<uint64_t>(p, p + h->count);
}

std::string SocketFromConfig(const std::string& path) {
  absl::StatusOr<Config> c = LoadConfigFile(path);
  if (!c.ok()) Raise(c.status());
  if (c->client) return c->client->socket_path;
  if (c->owner) return c->owner->socket_path;
  Raise(absl::InvalidArgumentError(path + ": config names no owner socket (role=master?)"));
}

}  // namespace
}  // namespace fluxon

PYBIND11_MODULE(_native, m) {
  using namespace fluxon;
  m.doc() = "Native core of the fluxon package (use the fluxon module, not this one).";
  m.attr("__version__") = FLUXON_VERSION_STRING;
  m.attr("PLAN_BLOB_MAGIC") = kPlanBlobMagic;

  static py::exception<NativeError> error(m, "Error");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const NativeError& e) {
      py::object exc = py::reinterpret_borrow<py::object>(error.ptr())(
          e.code, e.message, py::cast(e.conflict_indices));
      PyErr_SetObject(error.ptr(), exc.ptr());
    }
  });

  py::class_<PyFuture>(m, "Future")
      .def("done", &PyFuture::done)
      .def("wait", &PyFuture::wait, py::arg("timeout_s") = py::none());
  py::class_<PyHandle>(m, "Handle").def("result", &PyHandle::result);
  py::class_<PyClient>(m, "Client")
      .def(py::init<const std::string&>(), py::arg("socket_path"))
      .def("segments", &PyClient::segments)
      .def("plan_arena", &PyClient::plan_arena)
      .def("prefault_segment", &PyClient::prefault_segment)
      .def("put_start", &PyClient::put_start)
      .def("put_commit", &PyClient::put_commit)
      .def("put_abort", &PyClient::put_abort)
      .def("get_start", &PyClient::get_start)
      .def("get_transfer", &PyClient::get_transfer)
      .def("cancel_get_transfer", &PyClient::cancel_get_transfer)
      .def("release_views", &PyClient::release_views)
      .def("stats", &PyClient::stats)
      .def("delete_prefix", &PyClient::delete_prefix);
  m.def("copy_plan", &CopyPlan, py::arg("plan_ptr"), py::arg("host_ptr"), py::arg("value_len"),
        py::arg("to_values"), py::arg("threads") = 4);
  m.def("copy_segments", &CopySegments, py::arg("plan_ptr"), py::arg("value_count"),
        py::arg("value_len"), py::arg("seg_ptrs"), py::arg("seg_sizes"), py::arg("segs_per_value"),
        py::arg("to_values"), py::arg("threads") = 4);
  m.def("plan_value_ptrs", &PlanValuePointers, py::arg("plan_ptr"));
  m.def("socket_from_config", &SocketFromConfig, py::arg("path"));
  m.def("slot_size_for", [](uint64_t v) { return SlotSizeFor(v); });
  m.def("slots_per_grant", [](uint64_t s) { return SlotsPerGrant(s); });
}
