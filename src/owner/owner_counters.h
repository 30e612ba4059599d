// OwnerCounters: the one definition of every counter and gauge the owner's control logic keeps.
// Each entry of FLUXON_OWNER_COUNTERS names, once, the field, what kind of value it is, the
// Prometheus family (with an optional label) it is exported as, and its help text; the struct,
// the stats map the client protocol and fluxonctl carry, and the /metrics page are all generated
// from that list, so a counter can never be renamed in one place and not another.
//
// Invariants: counters only grow (kCounter, kMicros); gauges (kGauge) go up and down with the state
// they count and return to their baseline when the workload ends. Members of one labelled family
// are adjacent in the list (the exporter writes the family's HELP/TYPE once, at its first member).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace fluxon {

// kMicros: a counter of microseconds, exported in seconds (Prometheus base units).
enum class CounterKind { kCounter, kGauge, kMicros };

// X(field, kind, metric family, label "key=value" or "", help)
#define FLUXON_OWNER_COUNTERS(X)                                                                  \
  X(put_batches, kCounter, "fluxon_put_batches_total", "", "Put batches started.")                \
  X(put_pages, kCounter, "fluxon_put_pages_total", "", "Values (pages) in started put batches.")  \
  X(put_commits, kCounter, "fluxon_put_commits_total", "", "Put batches committed.")              \
  X(put_aborts, kCounter, "fluxon_put_aborts_total", "", "Put batches aborted.")                  \
  X(puts_expired, kCounter, "fluxon_puts_expired_total", "",                                      \
    "Prepared puts aborted after put_lease (never committed or aborted).")                        \
  X(commit_timeouts, kCounter, "fluxon_commit_timeouts_total", "",                                \
    "Commits refused (put aborted) after commit_wait_timeout of publish backpressure.")           \
  X(get_batches, kCounter, "fluxon_get_batches_total", "", "Get batches started.")                \
  X(get_keys, kCounter, "fluxon_get_pages_total", "", "Keys (pages) in started get batches.")     \
  X(hits, kCounter, "fluxon_hits_total", "",                                                      \
    "Keys of get batches found (local, joined or fetched).")                                      \
  X(misses, kCounter, "fluxon_misses_total", "", "Keys of get batches not found.")                \
  X(local_pinned, kCounter, "fluxon_get_keys_by_path_total", "path=local_pinned",                 \
    "Keys of get batches by how they were served: local_pinned (resident), inflight_joined "      \
    "(joined another get's lookup), leader_started (looked up).")                                 \
  X(inflight_joined, kCounter, "fluxon_get_keys_by_path_total", "path=inflight_joined", "")       \
  X(leader_started, kCounter, "fluxon_get_keys_by_path_total", "path=leader_started", "")         \
  X(suffix_released, kCounter, "fluxon_get_suffix_released_total", "",                            \
    "Pinned keys released because they lay past the transferable prefix.")                        \
  X(deferred_gets, kCounter, "fluxon_deferred_gets_total", "stage=started",                       \
    "Get batches answered before their values on other owners were fetched (started), and their " \
    "get_transfers that failed because a consumed value could not be fetched (failed).")          \
  X(deferred_gets_failed, kCounter, "fluxon_deferred_gets_total", "stage=failed", "")             \
  X(lookup_calls, kCounter, "fluxon_get_lookups_total", "",                                       \
    "Master Lookups of get batches' leaders (one per batch with leaders).")                       \
  X(lookup_us, kMicros, "fluxon_get_lookup_seconds_total", "",                                    \
    "Time get batches spent in the master Lookup of their leaders.")                              \
  X(deferred_start_us, kMicros, "fluxon_deferred_get_start_seconds_total", "",                    \
    "Time the get path spent answering deferred get_starts (the Lookup included, the socket "     \
    "not).")                                                                                      \
  X(handles_expired, kCounter, "fluxon_handles_expired_total", "",                                \
    "Get handles dropped after handle_ttl.")                                                      \
  X(views_expired, kCounter, "fluxon_views_expired_total", "",                                    \
    "Get views released after view_lease.")                                                       \
  X(evicted_cohorts, kCounter, "fluxon_evicted_cohorts_total", "",                                \
    "Cohorts evicted for capacity.")                                                              \
  X(evicted_pages, kCounter, "fluxon_evicted_pages_total", "", "Values evicted for capacity.")    \
  X(evicted_bytes, kCounter, "fluxon_evicted_bytes_total", "",                                    \
    "Slot bytes freed by capacity eviction.")                                                     \
  X(evicted_copied_pages, kCounter, "fluxon_evicted_copied_pages_total", "",                      \
    "Values evicted first because a copy on another node keeps them in the cluster.")             \
  X(eviction_kept_sole, kCounter, "fluxon_eviction_kept_sole_total", "",                          \
    "Copied-elsewhere eviction candidates kept: the master found no other live copy.")            \
  X(cohorts_marked_copied, kCounter, "fluxon_cohorts_marked_copied_total", "",                    \
    "Cohorts marked as copied on another node (replicas completed) after their admission.")       \
  X(demotions_started, kCounter, "fluxon_demotions_total", "stage=started",                       \
    "Values demoted to a remote_cache by stage: started (handed to the replica queue), demoted "  \
    "(copy routed there, this location removed, slot freed), no_space (no remote_cache had "      \
    "room: kept), failed (kept: a failed pull, or the value changed meanwhile).")                 \
  X(demoted_pages, kCounter, "fluxon_demotions_total", "stage=demoted", "")                       \
  X(demotion_no_space, kCounter, "fluxon_demotions_total", "stage=no_space", "")                  \
  X(demotion_failed, kCounter, "fluxon_demotions_total", "stage=failed", "")                      \
  X(demoting_bytes, kGauge, "fluxon_demoting_bytes", "",                                          \
    "Slot bytes of cohorts being demoted (out of the hot tier, still committed and readable).")   \
  X(remote_drops_dropped, kCounter, "fluxon_remote_drops_total", "outcome=dropped",               \
    "One ranking: demoted copies this owner's policy evicted and asked their remote_cache to "    \
    "drop, by outcome: dropped, kept (pinned by a reader there, or busy), not_held (gone "        \
    "already), failed (the call failed: the copy stays until that remote_cache evicts it), "      \
    "refused (a value another node put).")                                                        \
  X(remote_drops_kept, kCounter, "fluxon_remote_drops_total", "outcome=kept", "")                 \
  X(remote_drops_not_held, kCounter, "fluxon_remote_drops_total", "outcome=not_held", "")         \
  X(remote_drops_failed, kCounter, "fluxon_remote_drops_total", "outcome=failed", "")             \
  X(remote_drops_refused, kCounter, "fluxon_remote_drops_total", "outcome=refused", "")           \
  X(remote_duplicate_pages, kCounter, "fluxon_remote_duplicate_pages_total", "",                  \
    "One ranking: demoted copies dropped because their value is held here again (fetched back, "  \
    "or its key put again): capacity counted once.")                                              \
  X(relocalised_pages, kCounter, "fluxon_relocalised_pages_total", "",                            \
    "One ranking: values of this owner's demoted cohorts fetched back here (the same cohort "     \
    "again, its rank kept).")                                                                     \
  X(dropped_on_request_pages, kCounter, "fluxon_dropped_on_request_pages_total", "",              \
    "Copies removed because the owner that demoted them here asked (DropCopies).")                \
  X(eviction_rounds, kCounter, "fluxon_eviction_rounds_total", "",                                \
    "Capacity eviction rounds run.")                                                              \
  X(eviction_skipped_pinned, kCounter, "fluxon_eviction_skipped_pinned_total", "",                \
    "Eviction candidates skipped because a reader pinned them.")                                  \
  X(eviction_skipped_source_pinned, kCounter, "fluxon_eviction_skipped_source_pinned_total", "",  \
    "Eviction or delete candidates kept because a peer's remote get was reading them.")           \
  X(remote_get_batches, kCounter, "fluxon_remote_get_calls_total", "call=start",                  \
    "Remote-get master calls (they grow with batches, not keys, G8): start (BatchGetStart), "     \
    "done (BatchGetDone), revoke (BatchGetRevoke), each counted once per call incl. retries.")    \
  X(remote_get_done_calls, kCounter, "fluxon_remote_get_calls_total", "call=done", "")            \
  X(remote_get_revoke_calls, kCounter, "fluxon_remote_get_calls_total", "call=revoke", "")        \
  X(remote_get_keys, kCounter, "fluxon_remote_get_keys_total", "",                                \
    "Leader keys routed to another owner and sent in a BatchGetStart.")                           \
  X(remote_hits, kCounter, "fluxon_remote_hits_total", "",                                        \
    "Keys read from another owner and installed here as a cached copy.")                          \
  X(peer_read_touches, kCounter, "fluxon_peer_read_touches_total", "",                            \
    "Values of this owner that peers read (reported by the master), counted as accesses here.")   \
  X(replica_pulls_completed, kCounter, "fluxon_replica_pulls_total", "outcome=completed",         \
    "Replica pulls this owner served as a target, by outcome (owner/replica_puller.h).")          \
  X(replica_pulls_already_held, kCounter, "fluxon_replica_pulls_total", "outcome=already_held",   \
    "")                                                                                           \
  X(replica_pulls_obsolete, kCounter, "fluxon_replica_pulls_total", "outcome=obsolete", "")       \
  X(replica_pulls_source_gone, kCounter, "fluxon_replica_pulls_total", "outcome=source_gone", "") \
  X(replica_pulls_no_space, kCounter, "fluxon_replica_pulls_total", "outcome=no_space", "")       \
  X(replica_pulls_failed, kCounter, "fluxon_replica_pulls_total", "outcome=failed", "")           \
  X(replica_tasks_enqueued, kCounter, "fluxon_replica_tasks_total", "outcome=enqueued",           \
    "Replica tasks of this owner's puts (make_replica_task), by what became of them: enqueued, "  \
    "dropped (queue_full, duplicate), and each sent pull's outcome (owner/replica_queue.h).")     \
  X(replica_tasks_queue_full, kCounter, "fluxon_replica_tasks_total", "outcome=queue_full", "")   \
  X(replica_tasks_duplicate, kCounter, "fluxon_replica_tasks_total", "outcome=duplicate", "")     \
  X(replica_tasks_completed, kCounter, "fluxon_replica_tasks_total", "outcome=completed", "")     \
  X(replica_tasks_already_held, kCounter, "fluxon_replica_tasks_total", "outcome=already_held",   \
    "")                                                                                           \
  X(replica_tasks_obsolete, kCounter, "fluxon_replica_tasks_total", "outcome=obsolete", "")       \
  X(replica_tasks_source_gone, kCounter, "fluxon_replica_tasks_total", "outcome=source_gone", "") \
  X(replica_tasks_no_space, kCounter, "fluxon_replica_tasks_total", "outcome=no_space", "")       \
  X(replica_tasks_failed, kCounter, "fluxon_replica_tasks_total", "outcome=failed", "")           \
  X(replica_targets_remote_cache, kCounter, "fluxon_replica_targets_total", "role=remote_cache",  \
    "Replica tasks sent to a target, by the target's role (remote_cache, or any other role).")    \
  X(replica_targets_other_roles, kCounter, "fluxon_replica_targets_total", "role=other", "")      \
  X(replica_pull_calls, kCounter, "fluxon_replica_pull_calls_total", "",                          \
    "PullReplicas calls this owner sent to targets (retries included).")                          \
  X(replica_place_us, kMicros, "fluxon_replica_call_seconds_total", "call=place",                 \
    "Time replication waited on calls, summed over batches in flight: place (PlaceReplicas) "     \
    "and pull (PullReplicas: the target's claims, reads and installs).")                          \
  X(replica_pull_us, kMicros, "fluxon_replica_call_seconds_total", "call=pull", "")               \
  X(replica_queue_keys, kGauge, "fluxon_replica_queue_keys", "",                                  \
    "Replica tasks queued or being replicated.")                                                  \
  X(remote_misses, kCounter, "fluxon_remote_misses_total", "",                                    \
    "Keys routed to another owner that could not be fetched (no slot, refused, transfer failed, " \
    "lost answer, timeout).")                                                                     \
  X(remote_bytes, kCounter, "fluxon_remote_bytes_total", "",                                      \
    "Value bytes read from other owners.")                                                        \
  X(remote_transfer_submissions, kCounter, "fluxon_remote_transfer_submissions_total", "",        \
    "Data-plane read batches submitted (one per source peer per get batch).")                     \
  X(remote_transfer_failures, kCounter, "fluxon_remote_transfer_failures_total", "",              \
    "Data-plane read batches that failed (peer dead, refused, deadline).")                        \
  X(remote_start_lost, kCounter, "fluxon_remote_start_lost_total", "",                            \
    "BatchGetStart calls whose answer never came: their targets were quarantined.")               \
  X(remote_claim_us, kMicros, "fluxon_remote_get_seconds_total", "part=claim",                    \
    "Time remote gets spent, by part: claim (reserving the keys and claiming target slots), "     \
    "start (the BatchGetStart call), read (the data-plane reads, all peers of a batch at once), " \
    "finish (the BatchGetDone or Revoke calls) and install (the copies into the index and the "   \
    "hot tier).")                                                                                 \
  X(remote_start_us, kMicros, "fluxon_remote_get_seconds_total", "part=start", "")                \
  X(remote_read_us, kMicros, "fluxon_remote_get_seconds_total", "part=read", "")                  \
  X(remote_finish_us, kMicros, "fluxon_remote_get_seconds_total", "part=finish", "")              \
  X(remote_install_us, kMicros, "fluxon_remote_get_seconds_total", "part=install", "")            \
  X(remote_join_wait_us, kMicros, "fluxon_get_join_wait_seconds_total", "",                       \
    "Time get batches spent waiting for another batch's in-flight lookup or fetch of a key.")     \
  X(remote_quarantined_slots, kGauge, "fluxon_remote_quarantined_slots", "",                      \
    "Remote-get target slots held until the master's in-flight TTL passed (lost BatchGetStart).") \
  X(remote_unfinished, kGauge, "fluxon_remote_unfinished_gets", "",                               \
    "Remote gets whose Done or Revoke is still being retried in the background.")                 \
  X(remote_pending_targets, kGauge, "fluxon_remote_pending_targets", "",                          \
    "Remote-get target slots claimed and not yet installed or freed.")                            \
  X(deleted_pages, kCounter, "fluxon_deleted_pages_total", "",                                    \
    "Values deleted on request (delete by prefix).")                                              \
  X(publish_batches, kCounter, "fluxon_publish_batches_total", "",                                \
    "Put batches sent to the master for publishing.")                                             \
  X(publish_retries, kCounter, "fluxon_publish_retries_total", "",                                \
    "PublishBatch calls retried after an uncertain outcome.")                                     \
  X(route_remove_calls, kCounter, "fluxon_route_remove_calls_total", "",                          \
    "RemoveRoutes calls sent to the master (eviction and deletes, batched).")                     \
  X(route_remove_retries, kCounter, "fluxon_route_remove_retries_total", "",                      \
    "RemoveRoutes calls retried after an uncertain outcome.")                                     \
  X(route_remove_unconfirmed, kCounter, "fluxon_route_remove_unconfirmed_total", "",              \
    "Values kept because the master did not confirm their route removal (tried again later).")    \
  X(master_reregistrations, kCounter, "fluxon_master_reregistrations_total", "",                  \
    "Re-registrations after the master refused a publish as stale.")                              \
  X(master_epoch_changes, kCounter, "fluxon_master_epoch_changes_total", "",                      \
    "New master instances seen (a restarted master): each starts a republish of every value.")    \
  X(generation_renewals, kCounter, "fluxon_generation_renewals_total", "",                        \
    "Registrations under a new generation after the master expired this owner.")                  \
  X(registrations_refused, kCounter, "fluxon_registrations_refused_total", "",                    \
    "Registrations or heartbeats the master refused (not expiry: another certificate's node_id, " \
    "a live owner holding it, a changed address); the owner is unregistered until one passes.")   \
  X(republish_rounds, kCounter, "fluxon_republish_rounds_total", "",                              \
    "Republish rounds completed (every committed value offered to the master again).")            \
  X(republished_values, kCounter, "fluxon_republished_values_total", "",                          \
    "Committed values whose route a republish restored or confirmed.")                            \
  X(republish_dropped, kCounter, "fluxon_republish_dropped_total", "",                            \
    "Local values dropped by a republish because the master holds another version of the key.")   \
  X(master_registered, kGauge, "fluxon_master_registered", "",                                    \
    "1 while the master knows this owner's current generation and its routes are republished.")   \
  X(superseded, kCounter, "fluxon_superseded_total", "",                                          \
    "Published values another version of the key had already superseded.")                        \
  X(put_conflicts, kCounter, "fluxon_errors_total", "kind=put_conflict",                          \
    "Business errors: put_conflict (key exists or in flight), put_no_space (no slots within the " \
    "claim's hard timeout), claim_timeout (slot claims timed out), publish_failure (publish "     \
    "definitively rejected).")                                                                    \
  X(put_no_space, kCounter, "fluxon_errors_total", "kind=put_no_space", "")                       \
  X(publish_failures, kCounter, "fluxon_errors_total", "kind=publish_failure", "")                \
  X(reserved_entries, kGauge, "fluxon_key_entries", "state=reserved",                             \
    "Owner key entries by state.")                                                                \
  X(local_visible_entries, kGauge, "fluxon_key_entries", "state=local_visible", "")               \
  X(committed_entries, kGauge, "fluxon_key_entries", "state=committed", "")                       \
  X(live_handles, kGauge, "fluxon_live_get_handles", "",                                          \
    "Get handles not yet transferred or cancelled.")                                              \
  X(live_views, kGauge, "fluxon_live_get_views", "",                                              \
    "Get plans whose views are not yet released.")                                                \
  X(disconnects, kCounter, "fluxon_client_disconnects_total", "", "Client sessions that ended.")

struct OwnerCounters {
#define FLUXON_OWNER_COUNTER_FIELD(field, kind, metric, label, help) std::atomic<int64_t> field{0};
  FLUXON_OWNER_COUNTERS(FLUXON_OWNER_COUNTER_FIELD)
#undef FLUXON_OWNER_COUNTER_FIELD
};

// How one counter is exported.
struct OwnerCounterDef {
  const char* name;  // stats-map key ("put_batches")
  CounterKind kind;
  const char* metric;  // Prometheus family
  const char* label;   // "key=value" or ""
  const char* help;    // the family's help (on its first member)
  std::atomic<int64_t> OwnerCounters::*field;
};

inline constexpr OwnerCounterDef kOwnerCounterDefs[] = {
#define FLUXON_OWNER_COUNTER_DEF(field, kind, metric, label, help) \
  {#field, CounterKind::kind, metric, label, help, &OwnerCounters::field},
    FLUXON_OWNER_COUNTERS(FLUXON_OWNER_COUNTER_DEF)
#undef FLUXON_OWNER_COUNTER_DEF
};

// Adds every counter's current value to `out` under its stats-map name.
inline void AppendCounters(const OwnerCounters& c, std::map<std::string, int64_t>* out) {
  for (const OwnerCounterDef& d : kOwnerCounterDefs) {
    (*out)[d.name] = (c.*d.field).load(std::memory_order_relaxed);
  }
}

}  // namespace fluxon
