#include "daemon/metrics.h"

#include <chrono>
#include <limits>
#include <map>

#include "daemon/node.h"
#include "fluxon/version.h"
#include "prometheus/client_metric.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace fluxon {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(const std::string& name, MetricType type, const std::string& help) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

std::vector<ClientMetric::Label> ToLabels(const MetricLabels& labels) {
  std::vector<ClientMetric::Label> out;
  out.reserve(labels.size());
  for (const auto& [name, value] : labels) out.push_back({name, value});
  return out;
}

// One sample of a counter or gauge family.
void AddSample(MetricFamily& f, const MetricLabels& labels, double value) {
  ClientMetric m;
  m.label = ToLabels(labels);
  if (f.type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
}

MetricFamily Gauge(const std::string& name, const std::string& help, double value) {
  MetricFamily f = Family(name, MetricType::Gauge, help);
  AddSample(f, {}, value);
  return f;
}

int64_t Get(const std::map<std::string, int64_t>& stats, const std::string& key) {
  auto it = stats.find(key);
  return it == stats.end() ? 0 : it->second;
}

// The counter tables' rows, owner (kind and label) and master (plain counters) alike.
CounterKind KindOf(const OwnerCounterDef& d) { return d.kind; }
CounterKind KindOf(const MasterCounterDef&) { return CounterKind::kCounter; }
std::string LabelOf(const OwnerCounterDef& d) { return d.label; }
std::string LabelOf(const MasterCounterDef&) { return ""; }

// One family per metric name of a counter table, read now. A labelled family's members are
// adjacent rows; the family's help is its first member's. `after` is called with each family and
// sample label just added, for samples the table does not own.
template <typename Def, size_t N, typename Counters, typename After>
std::vector<MetricFamily> TableFamilies(const Def (&defs)[N], const Counters& counters,
                                        const After& after) {
  std::vector<MetricFamily> out;
  for (const Def& d : defs) {
    const int64_t raw = (counters.*d.field).load(std::memory_order_relaxed);
    const CounterKind kind = KindOf(d);
    const double value =
        kind == CounterKind::kMicros ? static_cast<double>(raw) / 1e6 : static_cast<double>(raw);
    const std::string label = LabelOf(d);
    if (label.empty() || out.empty() || out.back().name != d.metric) {
      out.push_back(Family(
          d.metric, kind == CounterKind::kGauge ? MetricType::Gauge : MetricType::Counter, d.help));
    }
    MetricLabels labels;
    if (!label.empty()) {
      const size_t eq = label.find('=');
      labels.emplace_back(label.substr(0, eq), label.substr(eq + 1));
    }
    AddSample(out.back(), labels, value);
    after(out.back(), label);
  }
  return out;
}

// The node's gauges of state (uptime, the owner's pool and tables, the master's routes), read
// at scrape time.
class NodeStateCollectable : public prometheus::Collectable {
 public:
  explicit NodeStateCollectable(FluxonNode* node) : node_(node) {}

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> out;
    out.push_back(
        Gauge("fluxon_uptime_seconds", "Seconds since this fluxond started.",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - node_->started_at())
                  .count()));
    if (OwnerCore* owner = node_->owner()) CollectOwner(*owner, out);
    if (const std::shared_ptr<MasterCore> master = node_->master()) {
      out.push_back(Gauge("fluxon_master_routes", "Live key routes in the master's table.",
                          static_cast<double>(master->route_count())));
      const RouteTable::Totals totals = master->route_totals();
      out.push_back(Gauge("fluxon_master_route_locations",
                          "Locations of the routed values (a value with copies has several).",
                          static_cast<double>(totals.locations)));
      out.push_back(Gauge("fluxon_master_logical_bytes",
                          "Value bytes of the routed values, each counted once.",
                          static_cast<double>(totals.logical_bytes)));
      out.push_back(Gauge("fluxon_master_physical_bytes",
                          "Value bytes at every location of the routed values (copies included).",
                          static_cast<double>(totals.physical_bytes)));
      out.push_back(Gauge("fluxon_master_inflight_gets",
                          "Remote gets in flight (BatchGetStart until Done, Revoke or the TTL).",
                          static_cast<double>(master->inflight_gets())));
    }
    if (const ElectedMaster* elected = node_->elected_master()) {
      out.push_back(Gauge("fluxon_master_leader",
                          "1 while this master leads its etcd election (and serves), else 0.",
                          elected->leading() ? 1.0 : 0.0));
      out.push_back(Gauge("fluxon_master_leader_epoch",
                          "Epoch (etcd create_revision) of the leadership this master last saw.",
                          static_cast<double>(elected->observed().epoch)));
    }
    return out;
  }

 private:
  void CollectOwner(OwnerCore& owner, std::vector<MetricFamily>& out) const {
    const std::map<std::string, int64_t> s = owner.Stats();
    const SlotPoolStats pool = owner.memory().pool().Stats();

    MetricFamily slots =
        Family("fluxon_slots", MetricType::Gauge, "Slots of the owner's pool by state.");
    for (int i = 0; i < kNumSlotStates; ++i) {
      AddSample(slots, {{"state", SlotStateName(static_cast<SlotState>(i))}},
                static_cast<double>(pool.slots_by_state[i]));
    }
    out.push_back(std::move(slots));
    out.push_back(Gauge("fluxon_grants", "512 MiB grants carved from the segment.",
                        static_cast<double>(pool.grants)));
    out.push_back(Gauge("fluxon_grant_capacity",
                        "Grants the segment can hold (or the expected-capacity cap).",
                        static_cast<double>(pool.grant_capacity)));
    out.push_back(Gauge("fluxon_segment_bytes", "Data bytes of the owner's shared segment.",
                        static_cast<double>(owner.memory().segment().data_bytes())));
    struct PerClass {
      const char* name;
      const char* help;
      uint64_t SizeClassStats::*field;
    };
    for (const PerClass& p : {
             PerClass{"fluxon_slot_class_grants", "Grants carved for each slot size class.",
                      &SizeClassStats::grants},
             PerClass{"fluxon_slot_class_free_slots", "Free slots of each slot size class.",
                      &SizeClassStats::free_slots},
             PerClass{"fluxon_slot_class_waiting_claims",
                      "Claims waiting for slots in each slot size class.",
                      &SizeClassStats::waiting_claims},
         }) {
      MetricFamily f = Family(p.name, MetricType::Gauge, p.help);
      for (const SizeClassStats& c : pool.classes) {
        AddSample(f, {{"slot_size", std::to_string(c.slot_size)}}, static_cast<double>(c.*p.field));
      }
      out.push_back(std::move(f));
    }
    out.push_back(Gauge("fluxon_keys", "Keys the owner holds (any state).", Get(s, "keys")));
    out.push_back(Gauge("fluxon_prepared_puts",
                        "Put batches started and not yet committed or aborted.",
                        Get(s, "prepared_puts")));
    out.push_back(
        Gauge("fluxon_inflight_gets", "Keys with a lookup in flight.", Get(s, "inflight_gets")));
    out.push_back(Gauge("fluxon_publish_queue", "Committed batches waiting for or in publishing.",
                        Get(s, "publish_queue")));
    out.push_back(Gauge("fluxon_hot_cohorts", "Cohorts in the hot tier (eviction candidates).",
                        Get(s, "hot_cohorts")));
    out.push_back(Gauge("fluxon_hot_bytes", "Slot bytes of the cohorts in the hot tier.",
                        Get(s, "hot_weight_bytes")));
    out.push_back(Gauge("fluxon_remote_ranked_bytes",
                        "One ranking: slot bytes of the values this owner demoted and still "
                        "ranks on remote_caches.",
                        Get(s, "remote_ranked_bytes")));
    out.push_back(Gauge("fluxon_hot_copied_cohorts",
                        "Cohorts in the hot tier with a copy on another node (evicted first).",
                        Get(s, "hot_copied_cohorts")));
    out.push_back(Gauge("fluxon_client_sessions", "Connected client sessions.",
                        static_cast<double>(node_->client_sessions())));
  }

  FluxonNode* const node_;
};

}  // namespace

MetricFamily HistogramFamily(const std::string& name, const std::string& help,
                             const HistogramSeries& series) {
  MetricFamily f = Family(name, MetricType::Histogram, help);
  for (const auto& [labels, snap] : series) {
    ClientMetric m;
    m.label = ToLabels(labels);
    m.histogram.sample_count = snap.count;
    m.histogram.sample_sum = snap.sum_seconds;
    uint64_t cumulative = 0;
    for (size_t i = 0; i < LatencyHistogram::kNumBounds; ++i) {
      cumulative += snap.counts[i];
      m.histogram.bucket.push_back({cumulative, LatencyHistogram::BoundSeconds(i)});
    }
    // +Inf: every observation (the snapshot's count is the sum of its bucket counts).
    m.histogram.bucket.push_back({snap.count, std::numeric_limits<double>::infinity()});
    f.metric.push_back(std::move(m));
  }
  return f;
}

LatencyHistogramCollectable::LatencyHistogramCollectable(std::string name, std::string help,
                                                         std::function<HistogramSeries()> read)
    : name_(std::move(name)), help_(std::move(help)), read_(std::move(read)) {}

std::vector<MetricFamily> LatencyHistogramCollectable::Collect() const {
  const HistogramSeries series = read_();
  if (series.empty()) return {};
  return {HistogramFamily(name_, help_, series)};
}

OwnerCountersCollectable::OwnerCountersCollectable(const OwnerCounters* counters,
                                                   std::function<int64_t()> claim_timeouts)
    : counters_(counters), claim_timeouts_(std::move(claim_timeouts)) {}

std::vector<MetricFamily> OwnerCountersCollectable::Collect() const {
  return TableFamilies(
      kOwnerCounterDefs, *counters_, [this](MetricFamily& f, const std::string& label) {
        if (f.name == "fluxon_errors_total" && label == "kind=publish_failure") {
          AddSample(f, {{"kind", "claim_timeout"}}, static_cast<double>(claim_timeouts_()));
        }
      });
}

MasterCountersCollectable::MasterCountersCollectable(const MasterCounters* counters)
    : counters_(counters) {}

std::vector<MetricFamily> MasterCountersCollectable::Collect() const {
  return TableFamilies(kMasterCounterDefs, *counters_, [](MetricFamily&, const std::string&) {});
}

std::vector<std::shared_ptr<prometheus::Collectable>> NodeCollectables(FluxonNode& node) {
  std::vector<std::shared_ptr<prometheus::Collectable>> out;
  // What never changes while the node runs lives in a plain registry.
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildGauge()
      .Name("fluxon_build_info")
      .Help("Version and role of this fluxond (always 1).")
      .Register(*registry)
      .Add({{"version", FLUXON_VERSION_STRING},
            {"role", RoleName(node.config().role)},
            {"node_id", std::to_string(node.config().node_id)}})
      .Set(1);
  out.push_back(std::move(registry));
  out.push_back(std::make_shared<NodeStateCollectable>(&node));
  if (OwnerCore* owner = node.owner()) {
    out.push_back(std::make_shared<OwnerCountersCollectable>(&owner->counters(), [owner] {
      return static_cast<int64_t>(owner->memory().pool().Stats().claim_timeouts);
    }));
    out.push_back(std::make_shared<LatencyHistogramCollectable>(
        "fluxon_remote_read_duration_seconds",
        "Data-plane read of one remote-get batch from one source owner, by source.", [owner] {
          HistogramSeries series;
          for (const auto& [source, snap] : owner->RemoteReadLatency()) {
            series.push_back({{{"source_node", std::to_string(source)}}, snap});
          }
          return series;
        }));
  }
  if (const MasterCounters* counters = node.master_counters()) {
    out.push_back(std::make_shared<MasterCountersCollectable>(counters));
  }
  if (const ClientServer* clients = node.client_server()) {
    out.push_back(std::make_shared<LatencyHistogramCollectable>(
        "fluxon_client_request_duration_seconds",
        "Time from a client request being parsed to its reply being queued, by request.",
        [clients] {
          HistogramSeries series;
          for (int i = 0; i < kNumClientRequestTypes; ++i) {
            series.push_back(
                {{{"request", ClientRequestTypeName(static_cast<ClientRequestType>(i))}},
                 clients->latencies()[i].Read()});
          }
          return series;
        }));
  }
  return out;
}

}  // namespace fluxon
