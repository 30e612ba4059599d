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
  out.Family("fluxon_key_entries", "gauge", "Owner key entries by state.");
  for (const char* state : {"reserved", "local_visible", "committed"}) {
    out.Sample("fluxon_key_entries", {{"state", state}}, Get(s, std::string(state) + "_entries"));
  }

  out.Counter("fluxon_hits_total", "Keys of get batches found (local, joined or fetched).",
              Get(s, "hits"));
  out.Counter("fluxon_misses_total", "Keys of get batches not found.", Get(s, "misses"));
  out.Family("fluxon_get_keys_by_path_total", "counter",
             "Keys of get batches by how they were served: local_pinned (resident), "
             "inflight_joined (joined another get's lookup), leader_started (looked up).");
  for (const char* path : {"local_pinned", "inflight_joined", "leader_started"}) {
    out.Sample("fluxon_get_keys_by_path_total", {{"path", path}}, Get(s, path));
  }
  out.Counter("fluxon_get_suffix_released_total",
              "Pinned keys released because they lay past the transferable prefix.",
              Get(s, "suffix_released"));

  out.Counter("fluxon_put_batches_total", "Put batches started.", Get(s, "put_batches"));
  out.Counter("fluxon_put_pages_total", "Values (pages) in started put batches.",
              Get(s, "put_pages"));
  out.Counter("fluxon_put_commits_total", "Put batches committed.", Get(s, "put_commits"));
  out.Counter("fluxon_put_aborts_total", "Put batches aborted.", Get(s, "put_aborts"));
  out.Counter("fluxon_get_batches_total", "Get batches started.", Get(s, "get_batches"));
  out.Counter("fluxon_get_pages_total", "Keys (pages) in started get batches.", Get(s, "get_keys"));

  out.Counter("fluxon_evicted_cohorts_total", "Cohorts evicted for capacity.",
              Get(s, "evicted_cohorts"));
  out.Counter("fluxon_evicted_pages_total", "Values evicted for capacity.",
              Get(s, "evicted_pages"));
  out.Counter("fluxon_deleted_pages_total", "Values deleted on request (delete by prefix).",
              Get(s, "deleted_pages"));
  out.Counter("fluxon_evicted_bytes_total", "Slot bytes freed by capacity eviction.",
              Get(s, "evicted_bytes"));
  out.Counter("fluxon_eviction_rounds_total", "Capacity eviction rounds run.",
              Get(s, "eviction_rounds"));
  out.Counter("fluxon_eviction_skipped_pinned_total",
              "Eviction candidates skipped because a reader pinned them.",
              Get(s, "eviction_skipped_pinned"));

  out.Counter("fluxon_publish_batches_total", "Put batches sent to the master for publishing.",
              Get(s, "publish_batches"));
  out.Counter("fluxon_publish_retries_total",
              "PublishBatch calls retried after an uncertain outcome.", Get(s, "publish_retries"));
  out.Counter("fluxon_route_remove_retries_total",
              "RemoveRoutes calls retried after an uncertain outcome.",
              Get(s, "route_remove_retries"));
  out.Counter("fluxon_superseded_total",
              "Published values another version of the key had already superseded.",
              Get(s, "superseded"));

  out.Family("fluxon_errors_total", "counter",
             "Business errors: put_conflict (key exists or in flight), put_no_space (no slots "
             "within the claim's hard timeout), claim_timeout (slot claims timed out), "
             "publish_failure (publish definitively rejected).");
  out.Sample("fluxon_errors_total", {{"kind", "put_conflict"}}, Get(s, "put_conflicts"));
  out.Sample("fluxon_errors_total", {{"kind", "put_no_space"}}, Get(s, "put_no_space"));
  out.Sample("fluxon_errors_total", {{"kind", "claim_timeout"}}, Get(s, "claim_timeouts"));
  out.Sample("fluxon_errors_total", {{"kind", "publish_failure"}}, Get(s, "publish_failures"));

  out.Gauge("fluxon_prepared_puts", "Put batches started and not yet committed or aborted.",
            Get(s, "prepared_puts"));
  out.Gauge("fluxon_live_get_handles", "Get handles not yet transferred or cancelled.",
            Get(s, "live_handles"));
  out.Gauge("fluxon_live_get_views", "Get plans whose views are not yet released.",
            Get(s, "live_views"));
  out.Gauge("fluxon_inflight_gets", "Keys with a lookup in flight.", Get(s, "inflight_gets"));
  out.Gauge("fluxon_publish_queue", "Committed batches waiting for or in publishing.",
            Get(s, "publish_queue"));
  out.Gauge("fluxon_hot_cohorts", "Cohorts in the hot tier (eviction candidates).",
            Get(s, "hot_cohorts"));
  out.Gauge("fluxon_hot_bytes", "Slot bytes of the cohorts in the hot tier.",
            Get(s, "hot_weight_bytes"));
  out.Counter("fluxon_handles_expired_total", "Get handles dropped after handle_ttl.",
              Get(s, "handles_expired"));
  out.Counter("fluxon_puts_expired_total",
              "Prepared puts aborted after put_lease (never committed or aborted).",
              Get(s, "puts_expired"));
  out.Counter("fluxon_views_expired_total", "Get views released after view_lease.",
              Get(s, "views_expired"));
  out.Counter("fluxon_commit_timeouts_total",
              "Commits refused (put aborted) after commit_wait_timeout of publish backpressure.",
              Get(s, "commit_timeouts"));
  out.Counter("fluxon_master_reregistrations_total",
              "Re-registrations after the master refused a publish as stale.",
              Get(s, "master_reregistrations"));
  out.Gauge("fluxon_client_sessions", "Connected client sessions.",
            static_cast<double>(node.client_sessions()));
  out.Counter("fluxon_client_disconnects_total", "Client sessions that ended.",
              Get(s, "disconnects"));
}

void RenderMaster(const MasterCore& master, PrometheusText& out) {
  const MasterCounters& c = master.counters();
  out.Gauge("fluxon_master_routes", "Live key routes in the master's table.",
            static_cast<double>(master.route_count()));
  out.Counter("fluxon_master_publish_batches_total", "PublishBatch calls served.",
              c.publish_batches.load());
  out.Counter("fluxon_master_published_items_total", "Routes published.", c.published_items.load());
  out.Counter("fluxon_master_republished_items_total",
              "Publishes of a route that already had that identity (idempotent retries).",
              c.republished_items.load());
  out.Counter("fluxon_master_superseded_items_total",
              "Publishes refused because another version holds the key.",
              c.superseded_items.load());
  out.Counter("fluxon_master_lookup_batches_total", "Lookup calls served.",
              c.lookup_batches.load());
  out.Counter("fluxon_master_lookup_keys_total", "Keys looked up.", c.lookup_keys.load());
  out.Counter("fluxon_master_removed_routes_total", "Routes removed.", c.removed_routes.load());
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
  if (OwnerCore* owner = node.owner()) RenderOwner(*owner, node, out);
  if (MasterCore* master = node.master()) RenderMaster(*master, out);
  if (const ClientServer* clients = node.client_server()) RenderLatencies(*clients, out);
  return out.text();
}

}  // namespace fluxon
