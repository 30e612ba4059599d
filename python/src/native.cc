// fluxon._native: the pybind11 binding of libfluxon_client. Errors cross into Python as
// _native.Error(code, message, conflict_indices); the pure-Python layer maps codes to the public
// exception classes. Every call that talks to the owner or waits releases the GIL.
//
// Nothing here raises a raw TypeError or dereferences an unchecked address: keys and integer
// lists are converted by the checked helpers below (InvalidArgument naming the argument and
// index), and a plan pointer is looked up in the issuing client's plan registry (PeekPlan)
// before anything reads the blob.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "config/config.h"
#include "fluxon/client.h"
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

[[noreturn]] void RaiseInvalid(const std::string& message) {
  Raise(absl::InvalidArgumentError(message));
}

// A non-empty str of at most `max_bytes` bytes of UTF-8 (lone surrogates are rejected).
std::string Utf8FromPy(py::handle v, const std::string& name, uint64_t max_bytes) {
  if (!PyUnicode_Check(v.ptr())) {
    RaiseInvalid(name + " must be a str, got " + std::string(Py_TYPE(v.ptr())->tp_name));
  }
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(v.ptr(), &n);
  if (p == nullptr) {
    PyErr_Clear();
    RaiseInvalid(name + " is not valid UTF-8 text (it holds a lone surrogate)");
  }
  if (n == 0) RaiseInvalid(name + " is an empty string");
  if (static_cast<uint64_t>(n) > max_bytes) {
    RaiseInvalid(name + " is " + std::to_string(n) + " bytes of UTF-8; the limit is " +
                 std::to_string(max_bytes));
  }
  return std::string(p, static_cast<size_t>(n));
}

// A list/tuple (any sequence but str/bytes) as a fast sequence, or InvalidArgument.
py::object SequenceFromPy(py::handle v, const std::string& name) {
  if (PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()) || !PySequence_Check(v.ptr())) {
    RaiseInvalid(name + " must be a sequence, got " + std::string(Py_TYPE(v.ptr())->tp_name));
  }
  PyObject* fast = PySequence_Fast(v.ptr(), "");
  if (fast == nullptr) {
    PyErr_Clear();
    RaiseInvalid(name + " must be a sequence");
  }
  return py::reinterpret_steal<py::object>(fast);
}

// The batch's keys: 1..kMaxBatchKeys valid keys (duplicates are left to ValidateKeys).
std::vector<std::string> KeysFromPy(py::handle v) {
  py::object seq = SequenceFromPy(v, "keys");
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  if (static_cast<uint64_t>(n) > kMaxBatchKeys) {
    RaiseInvalid("a batch holds at most " + std::to_string(kMaxBatchKeys) + " keys, got " +
                 std::to_string(n));
  }
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    keys.push_back(Utf8FromPy(PySequence_Fast_GET_ITEM(seq.ptr(), i),
                              "keys[" + std::to_string(i) + "]", kMaxKeyBytes));
  }
  return keys;
}

// Every item an int in [0, max] (Python ints or anything with __index__, e.g. numpy integers).
std::vector<uint64_t> U64ListFromPy(py::handle v, const std::string& name, uint64_t max) {
  py::object seq = SequenceFromPy(v, name);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  std::vector<uint64_t> out;
  out.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq.ptr(), i);
    const std::string what = name + "[" + std::to_string(i) + "]";
    if (PyBool_Check(item)) RaiseInvalid(what + " must be an int, got bool");
    py::object idx = py::reinterpret_steal<py::object>(PyNumber_Index(item));
    if (!idx) {
      PyErr_Clear();
      RaiseInvalid(what + " must be an int, got " + std::string(Py_TYPE(item)->tp_name));
    }
    const unsigned long long x = PyLong_AsUnsignedLongLong(idx.ptr());
    if (PyErr_Occurred() || x > max) {  // negative or too large
      PyErr_Clear();
      RaiseInvalid(what + " must be in [0, " + std::to_string(max) + "], got " +
                   std::string(py::str(idx)));
    }
    out.push_back(static_cast<uint64_t>(x));
  }
  return out;
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
    d["deferred"] = r.deferred;
    d["transferred"] = r.transferred;
    return d;
  }

 private:
  GetStartHandle h_;
};

class PyClient {
 public:
  PyClient(const std::string& socket_path, int64_t call_timeout_ms) {
    if (call_timeout_ms <= 0 || call_timeout_ms > kMaxSettingMs) {
      Raise(absl::InvalidArgumentError(absl::StrFormat("call_timeout must be in (0, %d] ms, got %d",
                                                       kMaxSettingMs, call_timeout_ms)));
    }
    ClientOptions o;
    o.socket_path = socket_path;
    o.call_timeout = std::chrono::milliseconds(call_timeout_ms);
    absl::StatusOr<std::unique_ptr<KvClient>> c;
    {
      py::gil_scoped_release nogil;
      c = KvClient::Connect(o);
    }
    client_ = Unwrap(std::move(c));
    segments_ = client_->WaitLocalSegmentsReady();
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

  uint64_t put_start(py::handle py_keys, int64_t value_len, bool reject_inflight, bool reject_exist,
                     bool write_through, bool make_replica_task, std::vector<bool> mask,
                     std::vector<uint32_t> groups, std::string lease_id, py::handle py_parent_key) {
    const std::vector<std::string> keys = KeysFromPy(py_keys);
    std::string parent_key;
    if (!py_parent_key.is_none())
      parent_key = Utf8FromPy(py_parent_key, "parent_key", kMaxKeyBytes);
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

  PyHandle get_start(py::handle py_keys, bool best_effort, std::vector<uint32_t> groups,
                     bool allow_deferred, bool transfer) {
    const std::vector<std::string> keys = KeysFromPy(py_keys);
    GetStartOptions options;
    options.prefix_best_effort = best_effort;
    options.atomic_group_lens = std::move(groups);
    options.allow_deferred = allow_deferred;
    options.transfer = transfer;
    absl::StatusOr<GetStartHandle> h;
    {
      py::gil_scoped_release nogil;
      h = client_->GetStart(keys, options);
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

  std::pair<uint64_t, uint64_t> delete_prefix(py::handle py_prefix) {
    const std::string prefix = Utf8FromPy(py_prefix, "prefix", kMaxKeyBytes);
    absl::StatusOr<std::pair<uint64_t, uint64_t>> s;
    {
      py::gil_scoped_release nogil;
      s = client_->DeletePrefix(prefix);
    }
    return Unwrap(std::move(s));
  }

  // Plan access: each validates plan_ptr with this client's registry (PeekPlan: NotFound for an
  // address it never issued, FailedPrecondition once consumed) before the blob is read.
  std::vector<uint64_t> plan_value_ptrs(uint64_t plan) const {
    const PlanView v = Unwrap(client_->PeekPlan(plan));
    return std::vector<uint64_t>(v.value_ptrs, v.value_ptrs + v.count);
  }

  // Copies all of a live plan's values to/from `host` (count * value_len contiguous bytes).
  // A plan consumed by another thread during the copy fails the copy's own magic check.
  void copy_plan(uint64_t plan, uint64_t host, uint64_t value_len, bool to_values, int threads) {
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      absl::StatusOr<PlanView> v = client_->PeekPlan(plan);
      s = v.ok() ? CheckValuesMapped(*v, v->count, value_len) : v.status();
      if (s.ok()) {
        s = CopyPlanValues(plan, reinterpret_cast<uint8_t*>(host), value_len, Direction(to_values),
                           threads);
      }
    }
    Check(s);
  }

  // Scatter/gather between the plan's first value_count values and host segments.
  void copy_segments(uint64_t plan, uint64_t value_count, uint64_t value_len, py::handle py_ptrs,
                     py::handle py_sizes, uint64_t segs_per_value, bool to_values, int threads) {
    const std::vector<uint64_t> ptrs =
        U64ListFromPy(py_ptrs, "seg_ptrs", std::numeric_limits<uint64_t>::max());
    const std::vector<uint64_t> sizes = U64ListFromPy(py_sizes, "seg_sizes", kMaxValueBytes);
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      absl::StatusOr<PlanView> v = client_->PeekPlan(plan);
      s = v.status();
      if (s.ok() && value_count > v->count) {
        s = absl::InvalidArgumentError(
            absl::StrCat("value_count ", value_count, " exceeds the plan's ", v->count, " values"));
      }
      if (s.ok()) s = CheckValuesMapped(*v, value_count, value_len);
      if (s.ok()) {
        s = CopyPlanSegments(plan, value_count, value_len, ptrs, sizes, segs_per_value,
                             Direction(to_values), threads);
      }
    }
    Check(s);
  }

 private:
  // Each of the first `count` values, value_len bytes long, lies inside a segment mapping: a
  // value_len larger than the plan's values is not recorded in the blob, but it can then at worst
  // reach a neighbouring slot, never unmapped memory.
  absl::Status CheckValuesMapped(const PlanView& v, uint64_t count, uint64_t value_len) const {
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t p = v.value_ptrs[i];
      bool mapped = false;
      for (const SegmentMapping& m : segments_) {
        mapped = mapped ||
                 (p >= m.write_ptr && value_len <= m.len && p - m.write_ptr <= m.len - value_len);
      }
      if (!mapped) {
        return absl::InvalidArgumentError(absl::StrCat(
            "value_len ", value_len, " runs past the segment at the plan's value ", i));
      }
    }
    return absl::OkStatus();
  }

  static CopyDirection Direction(bool to_values) {
    return to_values ? CopyDirection::kToValues : CopyDirection::kFromValues;
  }

  std::unique_ptr<KvClient> client_;
  std::vector<SegmentMapping> segments_;  // fixed for the client's life
};

// The client call timeout a config names (client.call_timeout_ms; the default otherwise).
int64_t CallTimeoutMsFromConfig(const std::string& path) {
  absl::StatusOr<Config> c = LoadConfigFile(path);
  if (!c.ok()) Raise(c.status());
  return c->client ? c->client->call_timeout.count() : ClientConfig{}.call_timeout.count();
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
  m.attr("MAX_KEY_BYTES") = kMaxKeyBytes;
  m.attr("MAX_BATCH_KEYS") = kMaxBatchKeys;
  m.attr("MAX_VALUE_BYTES") = kMaxValueBytes;

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
      .def(py::init<const std::string&, int64_t>(), py::arg("socket_path"),
           py::arg("call_timeout_ms") = ClientOptions{}.call_timeout.count())
      .def("segments", &PyClient::segments)
      .def("plan_arena", &PyClient::plan_arena)
      .def("prefault_segment", &PyClient::prefault_segment)
      .def("put_start", &PyClient::put_start)
      .def("put_commit", &PyClient::put_commit)
      .def("put_abort", &PyClient::put_abort)
      .def("get_start", &PyClient::get_start, py::arg("keys"), py::arg("best_effort"),
           py::arg("groups"), py::arg("allow_deferred") = false, py::arg("transfer") = false)
      .def("get_transfer", &PyClient::get_transfer)
      .def("cancel_get_transfer", &PyClient::cancel_get_transfer)
      .def("release_views", &PyClient::release_views)
      .def("stats", &PyClient::stats)
      .def("delete_prefix", &PyClient::delete_prefix)
      .def("plan_value_ptrs", &PyClient::plan_value_ptrs, py::arg("plan_ptr"))
      .def("copy_plan", &PyClient::copy_plan, py::arg("plan_ptr"), py::arg("host_ptr"),
           py::arg("value_len"), py::arg("to_values"), py::arg("threads") = 4)
      .def("copy_segments", &PyClient::copy_segments, py::arg("plan_ptr"), py::arg("value_count"),
           py::arg("value_len"), py::arg("seg_ptrs"), py::arg("seg_sizes"),
           py::arg("segs_per_value"), py::arg("to_values"), py::arg("threads") = 4);
  m.def("socket_from_config", &SocketFromConfig, py::arg("path"));
  m.def("call_timeout_ms_from_config", &CallTimeoutMsFromConfig, py::arg("path"));
  m.def("slot_size_for", [](uint64_t v) { return SlotSizeFor(v); });
  m.def("slots_per_grant", [](uint64_t s) { return SlotsPerGrant(s); });
}
