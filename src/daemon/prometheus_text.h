// PrometheusText: builds a metrics page in the Prometheus text exposition format 0.0.4.
//
// Invariants:
// - Every metric family is introduced once by Family() ("# HELP" then "# TYPE") and its samples
//   follow it directly; a family of type counter is named "..._total".
// - Label values are escaped (backslash, double quote, newline) as the format requires.
// - A histogram family is written whole: per label set, cumulative `_bucket` samples in increasing
//   `le` order ending with le="+Inf" (equal to `_count`), then `_sum` and `_count`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/latency_histogram.h"

namespace fluxon {

class PrometheusText {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;

  // A family with one unlabelled sample.
  void Counter(absl::string_view name, absl::string_view help, int64_t value);
  void Gauge(absl::string_view name, absl::string_view help, double value);

  // A family with one sample per label set.
  void Family(absl::string_view name, absl::string_view type, absl::string_view help);
  void Sample(absl::string_view name, const Labels& labels, double value);

  // A histogram family of LatencyHistogram snapshots (in seconds), one per label set.
  void Histogram(absl::string_view name, absl::string_view help,
                 const std::vector<std::pair<Labels, LatencyHistogram::Snapshot>>& series);

  const std::string& text() const { return out_; }

  // A sample value: integers exactly ("42"), fractions to nanoseconds ("0.000005"), "+Inf".
  static std::string FormatValue(double value);
  static std::string EscapeLabelValue(absl::string_view value);

 private:
  std::string out_;
};

}  // namespace fluxon
