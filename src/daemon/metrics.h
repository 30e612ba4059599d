// The Prometheus metrics of one fluxond (every name starts with "fluxon_"; see
// docs/operations.md for the list), as prometheus-cpp collectables that MetricsExposer serves.
//
// Every value is read at scrape time, in Collect(), from its one source: the X-macro counter
// tables (FLUXON_OWNER_COUNTERS in owner/owner_counters.h, FLUXON_MASTER_COUNTERS in
// master/master_core.h), the lock-free LatencyHistograms the hot path records into, and the
// pool, owner and master state. Nothing here keeps a second copy of a counter.
//
// Invariants:
// - Collecting reads values as they are at that moment (each value is read once; values of
//   different families are not a single atomic snapshot) and changes nothing.
// - A family's name, type, labels and help do not depend on the values; one name is one family,
//   whatever collectable it comes from, and appears once on a page.
// - Counters of kind kMicros are exported in seconds (Prometheus base units).
// - Owner families appear only when the node has an owner, master families only when it has a
//   master, the client latency histogram only when it serves local clients, the remote-read
//   histogram once a remote read has been recorded; a family that appears always has every one
//   of its label values (all slot states, all seven request types).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/latency_histogram.h"
#include "owner/owner_counters.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace fluxon {

class FluxonNode;
struct MasterCounters;

using MetricLabels = std::vector<std::pair<std::string, std::string>>;
using HistogramSeries = std::vector<std::pair<MetricLabels, LatencyHistogram::Snapshot>>;

// A histogram family of LatencyHistogram snapshots (in seconds), one metric per label set: the
// cumulative count of every bound of LatencyHistogram::kBoundsNanos, then le="+Inf" (= count).
prometheus::MetricFamily HistogramFamily(const std::string& name, const std::string& help,
                                         const HistogramSeries& series);

// One histogram family whose snapshots `read` takes at scrape time; no family while `read`
// returns no series.
class LatencyHistogramCollectable : public prometheus::Collectable {
 public:
  LatencyHistogramCollectable(std::string name, std::string help,
                              std::function<HistogramSeries()> read);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::string name_;
  const std::string help_;
  const std::function<HistogramSeries()> read_;
};

// Every owner counter and gauge of kOwnerCounterDefs, one family per metric name (the members
// of a labelled family are adjacent in the table; the family's help is its first member's).
// `claim_timeouts` (the slot pool's own counter) is the kind="claim_timeout" member of
// fluxon_errors_total, after kind="publish_failure".
class OwnerCountersCollectable : public prometheus::Collectable {
 public:
  OwnerCountersCollectable(const OwnerCounters* counters, std::function<int64_t()> claim_timeouts);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const OwnerCounters* const counters_;
  const std::function<int64_t()> claim_timeouts_;
};

// Every master counter of kMasterCounterDefs, one unlabelled counter family each.
class MasterCountersCollectable : public prometheus::Collectable {
 public:
  explicit MasterCountersCollectable(const MasterCounters* counters);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const MasterCounters* const counters_;
};

// Everything `node` exports, in page order: a prometheus::Registry with fluxon_build_info, the
// node's state gauges, the counter tables and the latency histograms of the roles it has. They
// read `node` (and its cores) at scrape time: the exposer serving them must be stopped before
// any of those is torn down.
std::vector<std::shared_ptr<prometheus::Collectable>> NodeCollectables(FluxonNode& node);

}  // namespace fluxon
