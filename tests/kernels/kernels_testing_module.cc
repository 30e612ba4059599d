// `_fluxon_kernels_testing`: the kernel tests' support module, built beside `_fluxon_kernels` and
// never shipped in the wheel. It makes the memory Fluxon hands out without a daemon: a real memfd
// Segment (MAP_SHARED, as the owner creates it). Plans over it come from the shipped module's
// PlanArena: a PlanRegistry must be issued and checked by the same copy of the library (the
// wheel bundles its own abseil, whose hash seed differs from this module's).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "slot/segment.h"

namespace py = pybind11;

namespace fluxon {
namespace {

[[noreturn]] void Raise(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kInvalidArgument ||
      status.code() == absl::StatusCode::kOutOfRange ||
      status.code() == absl::StatusCode::kNotFound) {
    throw py::value_error(status.ToString());
  }
  throw std::runtime_error(status.ToString());
}

template <typename T>
T Take(absl::StatusOr<T> value) {
  if (!value.ok()) Raise(value.status());
  return std::move(*value);
}

// An owner-side memfd Segment (MAP_SHARED), as the daemon creates it.
class TestSegment {
 public:
  explicit TestSegment(uint64_t size_bytes) {
    SegmentOptions options;
    options.size_bytes = size_bytes;
    options.name = "fluxon-kernels-test";
    segment_ = Take(Segment::Create(options));
  }
  uint64_t base() const { return reinterpret_cast<uint64_t>(segment_->base()); }
  uint64_t total_bytes() const { return segment_->total_bytes(); }
  uint64_t data_offset() const { return segment_->data_offset(); }
  int fd() const { return segment_->fd(); }

 private:
  std::unique_ptr<Segment> segment_;
};

}  // namespace
}  // namespace fluxon

PYBIND11_MODULE(_fluxon_kernels_testing, m) {
  using fluxon::TestSegment;
  m.doc() = "Test support for fluxon.kernels: a real memfd Segment (not shipped).";
  py::class_<TestSegment>(m, "TestSegment")
      .def(py::init<uint64_t>(), py::arg("size_bytes"))
      .def_property_readonly("base", &TestSegment::base)
      .def_property_readonly("total_bytes", &TestSegment::total_bytes)
      .def_property_readonly("data_offset", &TestSegment::data_offset)
      .def_property_readonly("fd", &TestSegment::fd)
      .def("mapping", [](const TestSegment& s) {
        return std::make_tuple(std::string("cpu:0"), s.base(), s.total_bytes());
      });
}
