#include "owner/replica_puller.h"

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/batch.h"
#include "fluxon/status.h"
#include "fluxon/units.h"
#include "spdlog/spdlog.h"

namespace fluxon {

PullItem PullItemFromProto(const v1::PullItem& it) {
  return PullItem{it.key(),  it.put_id(),         it.version(),
                  it.len(),  it.source_node_id(), it.source_generation(),
                  it.group()};
}

v1::PullReplicasReply PullReplyOf(const std::vector<PullOutcome>& outcomes) {
  v1::PullReplicasReply reply;
  for (PullOutcome o : outcomes) {
    v1::PullOutcome p = v1::PULL_FAILED;
    switch (o) {
      case PullOutcome::kCompleted:
        p = v1::PULL_COMPLETED;
        break;
      case PullOutcome::kAlreadyHeld:
        p = v1::PULL_ALREADY_HELD;
        break;
      case PullOutcome::kObsolete:
        p = v1::PULL_OBSOLETE;
        break;
      case PullOutcome::kSourceGone:
        p = v1::PULL_SOURCE_GONE;
        break;
      case PullOutcome::kNoSpace:
        p = v1::PULL_NO_SPACE;
        break;
      case PullOutcome::kFailed:
        break;
    }
    reply.add_outcomes(p);
  }
  return reply;
}

const char* PullOutcomeName(PullOutcome o) {
  switch (o) {
    case PullOutcome::kCompleted:
      return "completed";
    case PullOutcome::kAlreadyHeld:
      return "already_held";
    case PullOutcome::kObsolete:
      return "obsolete";
    case PullOutcome::kSourceGone:
      return "source_gone";
    case PullOutcome::kNoSpace:
      return "no_space";
    case PullOutcome::kFailed:
      return "failed";
  }
  return "failed";
}

void ReplicaPuller::Count(PullOutcome o) {
  std::atomic<int64_t>* c = nullptr;
  switch (o) {
    case PullOutcome::kCompleted:
      c = &counters_->replica_pulls_completed;
      break;
    case PullOutcome::kAlreadyHeld:
      c = &counters_->replica_pulls_already_held;
      break;
    case PullOutcome::kObsolete:
      c = &counters_->replica_pulls_obsolete;
      break;
    case PullOutcome::kSourceGone:
      c = &counters_->replica_pulls_source_gone;
      break;
    case PullOutcome::kNoSpace:
      c = &counters_->replica_pulls_no_space;
      break;
    case PullOutcome::kFailed:
      c = &counters_->replica_pulls_failed;
      break;
  }
  c->fetch_add(1, std::memory_order_relaxed);
}

absl::StatusOr<std::vector<PullOutcome>> ReplicaPuller::Pull(const std::vector<PullItem>& items) {
  std::vector<std::string> keys;
  keys.reserve(items.size());
  for (const PullItem& it : items) keys.push_back(it.key);
  FLUXON_RETURN_IF_ERROR(ValidateKeys(keys));
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].put_id == 0) {
      return absl::InvalidArgumentError(absl::StrFormat("pull item %d has put_id 0", i));
    }
    if (items[i].len == 0 || items[i].len > kMaxValueBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pull item %d has length %d; it must be in (0, %d]", i, items[i].len, kMaxValueBytes));
    }
  }
  // A group's items are consecutive (so a group number cannot join items far apart by mistake).
  absl::flat_hash_set<uint32_t> closed;
  for (size_t i = 0; i < items.size(); ++i) {
    const uint32_t g = items[i].group;
    if (g == 0 || (i > 0 && items[i - 1].group == g)) continue;
    if (!closed.insert(g).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pull item %d: the items of group %d are not consecutive", i, g));
    }
  }
  std::vector<PullOutcome> out(items.size(), PullOutcome::kFailed);
  // What this owner holds already decides first: the same identity is a retry (T1), another
  // committed identity makes the pull obsolete here, anything in flight is tried again later.
  std::vector<RemoteLeader> leaders;
  std::vector<size_t> leader_index;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::optional<KeyIndex::Identity> held = keys_->IdentityOf(items[i].key);
    if (!held) {
      leaders.push_back(RemoteLeader{items[i].key, items[i].put_id, items[i].len, items[i].version,
                                     items[i].source_node_id, items[i].source_generation,
                                     items[i].group});
      leader_index.push_back(i);
    } else if (held->state == KeyIndex::State::kCommitted && held->put_id == items[i].put_id &&
               held->version == items[i].version) {
      out[i] = PullOutcome::kAlreadyHeld;
    } else if (held->state == KeyIndex::State::kCommitted) {
      out[i] = PullOutcome::kObsolete;
    }
  }
  if (!leaders.empty()) {
    std::vector<uint64_t> cohorts;
    std::vector<FetchMiss> misses;
    std::vector<HolderRef> got = fetcher_->Fetch(leaders, &cohorts, &misses, /*replica=*/true);
    for (size_t j = 0; j < leaders.size(); ++j) {
      PullOutcome& o = out[leader_index[j]];
      if (got[j]) {
        o = PullOutcome::kCompleted;  // installed; the index keeps it, this pin goes
        continue;
      }
      switch (misses[j]) {
        case FetchMiss::kNoSpace:
          o = PullOutcome::kNoSpace;
          break;
        case FetchMiss::kGone:
          o = PullOutcome::kSourceGone;
          break;
        case FetchMiss::kObsolete:
          o = PullOutcome::kObsolete;
          break;
        case FetchMiss::kAlreadyLocal:
          o = PullOutcome::kAlreadyHeld;
          break;
        default:
          o = PullOutcome::kFailed;
          break;
      }
    }
  }
  for (PullOutcome o : out) Count(o);
  return out;
}

}  // namespace fluxon
