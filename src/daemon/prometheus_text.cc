#include "daemon/prometheus_text.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fluxon {

std::string PrometheusText::FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    return absl::StrFormat("%d", static_cast<int64_t>(value));
  }
  if (std::fabs(value) >= 1e15) return absl::StrFormat("%.17g", value);
  // Nanosecond resolution, without trailing zeros: 0.000005, 1.25.
  std::string s = absl::StrFormat("%.9f", value);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

std::string PrometheusText::EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

void PrometheusText::Family(absl::string_view name, absl::string_view type,
                            absl::string_view help) {
  // HELP text escapes only backslash and newline.
  std::string escaped;
  for (char c : help) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  absl::StrAppend(&out_, "# HELP ", name, " ", escaped, "\n# TYPE ", name, " ", type, "\n");
}

void PrometheusText::Sample(absl::string_view name, const Labels& labels, double value) {
  absl::StrAppend(&out_, name);
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i > 0) out_ += ',';
      absl::StrAppend(&out_, labels[i].first, "=\"", EscapeLabelValue(labels[i].second), "\"");
    }
    out_ += '}';
  }
  absl::StrAppend(&out_, " ", FormatValue(value), "\n");
}

void PrometheusText::Counter(absl::string_view name, absl::string_view help, int64_t value) {
  Family(name, "counter", help);
  Sample(name, {}, static_cast<double>(value));
}

void PrometheusText::Gauge(absl::string_view name, absl::string_view help, double value) {
  Family(name, "gauge", help);
  Sample(name, {}, value);
}

void PrometheusText::Histogram(
    absl::string_view name, absl::string_view help,
    const std::vector<std::pair<Labels, LatencyHistogram::Snapshot>>& series) {
  Family(name, "histogram", help);
  const std::string bucket = absl::StrCat(name, "_bucket");
  for (const auto& [labels, snap] : series) {
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= LatencyHistogram::kNumBounds; ++i) {
      cumulative += snap.counts[i];
      Labels with_le = labels;
      with_le.emplace_back("le", i < LatencyHistogram::kNumBounds
                                     ? FormatValue(LatencyHistogram::BoundSeconds(i))
                                     : "+Inf");
      Sample(bucket, with_le, static_cast<double>(cumulative));
    }
    Sample(absl::StrCat(name, "_sum"), labels, snap.sum_seconds);
    Sample(absl::StrCat(name, "_count"), labels, static_cast<double>(snap.count));
  }
}

}  // namespace fluxon
