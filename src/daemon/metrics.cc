#include "daemon/metrics.h"

#include <chrono>
#include <map>

#include "daemon/node.h"
#include "daemon/prometheus_text.h"
#include "fluxon/version.h"

namespace fluxon {
namespace {

int64_t Get(const std::map<std::string, int64_t>& stats, const std::string& key) {
  auto it = stats.find(key);
  return it == stats.end() ? 0 : it->second;
}

void RenderOwner(OwnerCore& owner, const FluxonNode& node, PrometheusText& out) {
  const std::map<std::string, int64_t> s = owner.Stats();
  const SlotPoolStats pool = owner.memory().pool().Stats();

  out.Family("fluxon_slots", "gauge", "Slots of the owner's pool by state.");
  for (int i = 0; i < kNumSlotStates; ++i) {
    out.Sample("fluxon_slots", {{"state", SlotStateName(static_cast<SlotState>(i))}},
               static_cast<double>(pool.slots_by_state[i]));
  }
  out.Gauge("fluxon_grants", "512 MiB grants carved from the segment.",
            static_cast<double>(pool.grants));
  out.Gauge("fluxon_grant_capacity", "Grants the segment can hold (or the expected-capacity cap).",
            static_cast<double>(pool.grant_capacity));
  out.Gauge("fluxon_segment_bytes", "Data bytes of the owner's shared segment.",
            static_cast<double>(owner.memory().segment().data_bytes()));
  out.Family("fluxon_slot_class_grants", "gauge", "Grants carved for each slot size class.");
  for (const SizeClassStats& c : pool.classes) {
    out.Sample("fluxon_slot_class_grants", {{"slot_size", std::to_string(c.slot_size)}},
               static_cast<double>(c.grants));
  }
  out.Family("fluxon_slot_class_free_slots", "gauge", "Free slots of each slot size class.");
  for (const SizeClassStats& c : pool.classes) {
    out.Sample("fluxon_slot_class_free_slots", {{"slot_size", std::to_string(c.slot_size)}},
               static_cast<double>(c.free_slots));
  }
  out.Family("fluxon_slot_class_waiting_claims", "gauge",
             "Claims waiting for slots in each slot size class.");
  for (const SizeClassStats& c : pool.classes) {
    out.Sample("fluxon_slot_class_waiting_claims", {{"slot_size", std::to_string(c.slot_size)}},
               static_cast<double>(c.waiting_claims));
  }

  out.Gauge("fluxon_keys", "Keys the owner holds (any state).", Get(s, "keys"));
  out.Gauge("fluxon_prepared_puts", "Put batches started and not yet committed or aborted.",
            Get(s, "prepared_puts"));
  out.Gauge("fluxon_inflight_gets", "Keys with a lookup in flight.", Get(s, "inflight_gets"));
  out.Gauge("fluxon_publish_queue", "Committed batches waiting for or in publishing.",
            Get(s, "publish_queue"));
  out.Gauge("fluxon_hot_cohorts", "Cohorts in the hot tier (eviction candidates).",
            Get(s, "hot_cohorts"));
  out.Gauge("fluxon_hot_bytes", "Slot bytes of the cohorts in the hot tier.",
            Get(s, "hot_weight_bytes"));
  // Every owner counter, from its one definition (owner/owner_counters.h). Members of a labelled
  // family are adjacent there; the family's HELP/TYPE is written at its first member.
  const OwnerCounters& counters = owner.counters();
  const char* family = nullptr;
  for (const OwnerCounterDef& d : kOwnerCounterDefs) {
    const int64_t raw = (counters.*d.field).load(std::memory_order_relaxed);
    const double value =
        d.kind == CounterKind::kMicros ? static_cast<double>(raw) / 1e6 : static_cast<double>(raw);
    const char* type = d.kind == CounterKind::kGauge ? "gauge" : "counter";
    const std::string label(d.label);
    if (label.empty()) {
      family = nullptr;
      out.Family(d.metric, type, d.help);
      out.Sample(d.metric, {}, value);
      continue;
    }
    if (family == nullptr || std::string(family) != d.metric) {
      family = d.metric;
      out.Family(d.metric, type, d.help);
    }
    const size_t eq = label.find('=');
    out.Sample(d.metric, {{label.substr(0, eq), label.substr(eq + 1)}}, value);
    if (std::string(d.metric) == "fluxon_errors_total" && label == "kind=publish_failure") {
      // The slot pool's claim timeouts belong to the same family (the pool's own counter).
      out.Sample(d.metric, {{"kind", "claim_timeout"}}, static_cast<double>(pool.claim_timeouts));
    }
  }
  out.Gauge("fluxon_client_sessions", "Connected client sessions.",
            static_cast<double>(node.client_sessions()));
}

void RenderMaster(const MasterCore& master, PrometheusText& out) {
  const MasterCounters& c = master.counters();
  out.Gauge("fluxon_master_routes", "Live key routes in the master's table.",
            static_cast<double>(master.route_count()));
  for (const MasterCounterDef& d : kMasterCounterDefs) {
    out.Counter(d.metric, d.help, (c.*d.field).load(std::memory_order_relaxed));
  }
  out.Gauge("fluxon_master_inflight_gets",
            "Remote gets in flight (BatchGetStart until Done, Revoke or the TTL).",
            static_cast<double>(master.inflight_gets()));
}

void RenderLatencies(const ClientServer& clients, PrometheusText& out) {
  std::vector<std::pair<PrometheusText::Labels, LatencyHistogram::Snapshot>> series;
  for (int i = 0; i < kNumClientRequestTypes; ++i) {
    series.push_back({{{"request", ClientRequestTypeName(static_cast<ClientRequestType>(i))}},
                      clients.latencies()[i].Read()});
  }
  out.Histogram("fluxon_client_request_duration_seconds",
                "Time from a client request being parsed to its reply being queued, by request.",
                series);
}

}  // namespace

std::string RenderNodeMetrics(FluxonNode& node) {
  PrometheusText out;
  out.Family("fluxon_build_info", "gauge", "Version and role of this fluxond (always 1).");
  out.Sample("fluxon_build_info",
             {{"version", FLUXON_VERSION_STRING},
              {"role", RoleName(node.config().role)},
              {"node_id", std::to_string(node.config().node_id)}},
             1);
  out.Gauge(
      "fluxon_uptime_seconds", "Seconds since this fluxond started.",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - node.started_at()).count());
  if (OwnerCore* owner = node.owner()) {
    RenderOwner(*owner, node, out);
    std::vector<std::pair<PrometheusText::Labels, LatencyHistogram::Snapshot>> series;
    for (const auto& [source, snap] : owner->RemoteReadLatency()) {
      series.push_back({{{"source_node", std::to_string(source)}}, snap});
    }
    if (!series.empty()) {
      out.Histogram("fluxon_remote_read_duration_seconds",
                    "Data-plane read of one remote-get batch from one source owner, by source.",
                    series);
    }
  }
  if (MasterCore* master = node.master()) RenderMaster(*master, out);
  if (const ClientServer* clients = node.client_server()) RenderLatencies(*clients, out);
  return out.text();
}

}  // namespace fluxon
