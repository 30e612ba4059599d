#include "owner/key_index.h"

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "spdlog/spdlog.h"

namespace fluxon {

KeyIndex::~KeyIndex() {
  // Holders go before the pool they pin (the owner destroys the index before its memory).
  std::vector<std::string> keys;
  table_.ForEach([&](const std::string& k, const Entry&) { keys.push_back(k); });
  for (const std::string& k : keys) table_.Take(k);
}

void KeyIndex::Count(State s, int delta) {
  switch (s) {
    case State::kReserved:
      counters_->reserved_entries.fetch_add(delta, std::memory_order_relaxed);
      break;
    case State::kLocalVisible:
      counters_->local_visible_entries.fetch_add(delta, std::memory_order_relaxed);
      break;
    case State::kCommitted:
    case State::kEvicting:  // still committed memory until erased
      counters_->committed_entries.fetch_add(delta, std::memory_order_relaxed);
      break;
  }
}

bool KeyIndex::ReserveAll(std::span<const std::string> keys, uint64_t put_id,
                          std::vector<uint32_t>* conflicts, bool fetch) {
  size_t reserved = 0;
  bool conflict = false;
  for (size_t i = 0; i < keys.size(); ++i) {
    Entry e;
    e.put_id = put_id;
    e.fetch = fetch;
    if (table_.InsertIfAbsent(keys[i], std::move(e))) {
      ++reserved;
    } else {
      conflict = true;
      if (conflicts != nullptr) conflicts->push_back(static_cast<uint32_t>(i));
    }
  }
  Count(State::kReserved, static_cast<int>(reserved));
  if (conflict) Unreserve(keys, put_id, fetch);
  return !conflict;
}

absl::StatusOr<std::vector<SlotRef>> KeyIndex::ReserveAndClaim(
    std::span<const std::string> keys, uint64_t put_id, uint64_t value_len,
    std::vector<uint32_t>* conflicts, std::optional<std::chrono::milliseconds> wait) {
  if (!ReserveAll(keys, put_id, conflicts)) {
    const size_t n = conflicts != nullptr ? conflicts->size() : 0;
    return absl::AlreadyExistsError(absl::StrFormat(
        "%d of %d keys are already stored or being written; nothing was reserved", n, keys.size()));
  }
  absl::StatusOr<std::vector<SlotRef>> slots = pool_->Claim(value_len, keys.size(), wait);
  if (!slots.ok()) Unreserve(keys, put_id, /*fetch=*/false);
  return slots;
}

std::vector<KeyIndex::TargetClaim> KeyIndex::ReserveAndClaimEach(
    std::span<const TargetRequest> targets, std::chrono::milliseconds wait) {
  std::vector<TargetClaim> out(targets.size());
  // The unit a claim succeeds or fails as: an atomic group (its members share a non-zero group
  // number and are consecutive), else the key alone; [begin, end) of targets, in order.
  std::vector<std::pair<size_t, size_t>> units;
  units.reserve(targets.size());
  for (size_t b = 0; b < targets.size();) {
    size_t e = b + 1;
    if (targets[b].group != 0) {
      while (e < targets.size() && targets[e].group == targets[b].group) ++e;
    }
    units.emplace_back(b, e);
    b = e;
  }
  auto release = [&](size_t i, TargetOutcome why) {
    const std::string key(targets[i].key);
    if (out[i].outcome == TargetOutcome::kClaimed || out[i].slot) {
      ReleaseReservation(
          std::span<const std::string>(&key, 1), targets[i].put_id,
          out[i].slot ? std::span<const SlotRef>(&*out[i].slot, 1) : std::span<const SlotRef>(),
          /*fetch=*/true);
    }
    out[i].slot.reset();
    out[i].outcome = why;
  };
  // Reserve every key (a local put or another fetch cannot take it meanwhile); a unit with a
  // busy member is given up whole.
  std::map<uint64_t, std::vector<size_t>> by_len;
  for (const auto& [ub, ue] : units) {
    bool busy = false;
    for (size_t i = ub; i < ue; ++i) {
      const std::string key(targets[i].key);
      if (targets[i].len > 0 &&
          ReserveAll(std::span<const std::string>(&key, 1), targets[i].put_id, nullptr,
                     /*fetch=*/true)) {
        out[i].outcome = TargetOutcome::kClaimed;  // reserved; its slot follows
      } else {
        busy = true;
      }
    }
    if (busy) {
      for (size_t i = ub; i < ue; ++i) release(i, TargetOutcome::kBusy);
      continue;
    }
    for (size_t i = ub; i < ue; ++i) by_len[targets[i].len].push_back(i);
  }
  // Claims: all of one length at once; if that fails, unit by unit (a prefix is still useful).
  for (const auto& [len, group] : by_len) {
    absl::StatusOr<std::vector<SlotRef>> all = pool_->Claim(len, group.size(), wait);
    if (all.ok()) {
      for (size_t j = 0; j < group.size(); ++j) out[group[j]].slot = (*all)[j];
      continue;
    }
    bool exhausted = false;
    for (const auto& [ub, ue] : units) {
      std::vector<size_t> of_len;
      for (size_t i = ub; i < ue; ++i) {
        if (out[i].outcome == TargetOutcome::kClaimed && targets[i].len == len) of_len.push_back(i);
      }
      if (of_len.empty() || exhausted) continue;
      absl::StatusOr<std::vector<SlotRef>> some = pool_->Claim(len, of_len.size(), wait);
      if (!some.ok()) {
        exhausted = true;
        continue;
      }
      for (size_t j = 0; j < of_len.size(); ++j) out[of_len[j]].slot = (*some)[j];
    }
  }
  // A unit is claimed whole or not at all.
  for (const auto& [ub, ue] : units) {
    bool whole = true;
    for (size_t i = ub; i < ue; ++i) {
      whole &= out[i].outcome != TargetOutcome::kClaimed || out[i].slot.has_value();
    }
    if (whole) continue;
    for (size_t i = ub; i < ue; ++i) {
      if (out[i].outcome == TargetOutcome::kClaimed) release(i, TargetOutcome::kNoSpace);
    }
  }
  return out;
}

absl::StatusOr<HolderRef> KeyIndex::CommitHidden(const std::string& key, uint64_t put_id,
                                                 const SlotRef& slot, uint64_t len) {
  return HolderRef::CommitHidden(pool_, slot, key, put_id, len);
}

void KeyIndex::Unreserve(std::span<const std::string> keys, uint64_t put_id, bool fetch) {
  int removed = 0;
  for (const std::string& k : keys) {
    removed += table_.EraseIf(k, [&](const Entry& e) {
      return e.put_id == put_id && e.state == State::kReserved && e.fetch == fetch;
    });
  }
  Count(State::kReserved, -removed);
}

void KeyIndex::AbortPrepared(std::span<const SlotRef> slots, uint64_t put_id) {
  for (const SlotRef& slot : slots) {
    const absl::Status s = pool_->Abort(slot);
    if (!s.ok()) {
      spdlog::error("aborting a prepared slot of put {}: {}", put_id, s.ToString());
      FLUXON_DCHECK(s.ok(), "a prepared slot could not be aborted");
    }
  }
}

void KeyIndex::ReleaseReservation(std::span<const std::string> keys, uint64_t put_id,
                                  std::span<const SlotRef> slots, bool fetch) {
  // The keys go first: once a slot is Free another put may claim it, and it must not find this
  // put's reservation still naming it.
  Unreserve(keys, put_id, fetch);
  AbortPrepared(slots, put_id);
}

bool KeyIndex::MakeLocalVisible(const std::string& key, uint64_t put_id, const SlotRef& slot,
                                uint64_t value_len) {
  // The holder is made outside the shard lock (an allocation and one CAS on the slot's word).
  absl::StatusOr<HolderRef> holder =
      HolderRef::CommitLocalVisible(pool_, slot, key, put_id, value_len);
  if (!holder.ok()) {
    spdlog::error("commit of put {} key {}: {}", put_id, key, holder.status().ToString());
    Unreserve({&key, 1}, put_id, /*fetch=*/false);  // the key is not left reserved
    return false;
  }
  const bool made = table_.Update(key, [&](Entry* e, bool*) {
    if (e == nullptr || e->put_id != put_id || e->fetch) return false;
    FLUXON_DCHECK(e->state == State::kReserved, "a put's key is committed twice");
    if (e->state != State::kReserved) return false;
    e->state = State::kLocalVisible;
    e->resident = std::move(*holder);
    return true;
  });
  if (made) {
    Count(State::kReserved, -1);
    Count(State::kLocalVisible, 1);
  }
  // Not made: `holder` still has the only reference and frees the slot as it goes.
  return made;
}

bool KeyIndex::Promote(const std::string& key, uint64_t put_id, uint64_t cohort_id,
                       uint64_t version) {
  const bool promoted = table_.Update(key, [&](Entry* e, bool*) {
    if (e == nullptr || e->put_id != put_id) return false;
    FLUXON_DCHECK(e->state == State::kLocalVisible, "a key is promoted that is not local-visible");
    if (e->state != State::kLocalVisible) return false;
    const absl::Status route = pool_->PublishRoute(e->resident->slot);
    if (!route.ok()) {
      spdlog::error("publishing the route of put {} key {}: {}", put_id, key, route.ToString());
      FLUXON_DCHECK(route.ok(), "a published slot refused its route");
      return false;
    }
    e->state = State::kCommitted;
    e->cohort_id = cohort_id;
    e->version = version;
    return true;
  });
  if (promoted) {
    Count(State::kLocalVisible, -1);
    Count(State::kCommitted, 1);
  }
  return promoted;
}

bool KeyIndex::CommitCopy(const std::string& key, uint64_t put_id, HolderRef* holder,
                          uint64_t cohort_id, uint64_t version) {
  const bool made = table_.Update(key, [&](Entry* e, bool*) {
    if (e == nullptr || e->put_id != put_id || e->state != State::kReserved || !e->fetch ||
        !*holder) {
      return false;
    }
    const absl::Status route = pool_->PublishRoute((*holder)->slot);
    if (!route.ok()) {
      spdlog::error("publishing the route of the remote copy of {}: {}", key, route.ToString());
      FLUXON_DCHECK(route.ok(), "a remote-get target refused its route");
      return false;
    }
    e->state = State::kCommitted;
    e->fetch = false;
    e->resident = std::move(*holder);
    e->cohort_id = cohort_id;
    e->version = version;
    e->copy = true;
    return true;
  });
  if (made) {
    Count(State::kReserved, -1);
    Count(State::kCommitted, 1);
  }
  return made;
}

HolderRef KeyIndex::EraseUnpublished(const std::string& key, uint64_t put_id) {
  HolderRef dropped;
  table_.Update(key, [&](Entry* e, bool* erase) {
    if (e == nullptr || e->put_id != put_id) return 0;
    FLUXON_DCHECK(e->state == State::kLocalVisible, "an unpublished key is not local-visible");
    if (e->state != State::kLocalVisible) return 0;
    dropped = std::move(e->resident);
    *erase = true;
    return 0;
  });
  if (dropped) Count(State::kLocalVisible, -1);
  return dropped;
}

bool KeyIndex::Pin(const std::string& key, HolderRef* holder, uint64_t* cohort) {
  return table_.Update(key, [&](Entry* e, bool*) {
    if (e == nullptr || (e->state != State::kLocalVisible && e->state != State::kCommitted)) {
      return false;
    }
    *holder = e->resident;
    *cohort = e->cohort_id;
    return true;
  });
}

bool KeyIndex::PinVersion(const std::string& key, uint64_t put_id, HolderRef* holder,
                          uint64_t* cohort) {
  return table_.Update(key, [&](Entry* e, bool*) {
    if (e == nullptr || e->put_id != put_id ||
        (e->state != State::kLocalVisible && e->state != State::kCommitted)) {
      return false;
    }
    *holder = e->resident;
    *cohort = e->cohort_id;
    return true;
  });
}

uint64_t KeyIndex::CommittedCohort(const std::string& key, std::optional<uint64_t> put_id) {
  return table_.Update(key, [&](Entry* e, bool*) -> uint64_t {
    if (e == nullptr || e->state != State::kCommitted) return 0;
    return !put_id || e->put_id == *put_id ? e->cohort_id : 0;
  });
}

KeyIndex::MarkResult KeyIndex::MarkEvicting(const std::string& key, uint64_t put_id) {
  return table_.Update(key, [&](Entry* e, bool*) {
    if (e == nullptr || e->put_id != put_id) return MarkResult::kGone;
    // The index's reference is the only one: no plan, join or handle pins the value.
    if (e->state != State::kCommitted || e->resident.use_count() != 1) return MarkResult::kInUse;
    e->state = State::kEvicting;
    return MarkResult::kMarked;
  });
}

void KeyIndex::UnmarkEvicting(const std::string& key, uint64_t put_id) {
  table_.Update(key, [&](Entry* e, bool*) {
    if (e != nullptr && e->put_id == put_id && e->state == State::kEvicting) {
      e->state = State::kCommitted;
    }
    return 0;
  });
}

HolderRef KeyIndex::EraseEvicting(const std::string& key, uint64_t put_id) {
  HolderRef last;
  table_.Update(key, [&](Entry* e, bool* erase) {
    if (e != nullptr && e->put_id == put_id && e->state == State::kEvicting) {
      // The index's reference is still alive, so the slot goes Committed -> Releasing here and
      // to Free only when the caller drops `last`.
      const absl::Status released = pool_->ReleaseRoute(e->resident->slot);
      FLUXON_DCHECK(released.ok(), "a committed slot's route was not live");
      if (!released.ok()) spdlog::error("releasing the route of {}: {}", key, released.ToString());
      last = std::move(e->resident);
      *erase = true;
    }
    return 0;
  });
  if (last) Count(State::kEvicting, -1);
  return last;
}

HolderRef KeyIndex::EraseStale(const std::string& key, uint64_t put_id) {
  HolderRef resident;
  table_.Update(key, [&](Entry* e, bool* erase) {
    if (e != nullptr && e->put_id == put_id && e->state == State::kCommitted) {
      // Readers' holders share the slot: it stays Releasing until the last of them goes.
      const absl::Status released = pool_->ReleaseRoute(e->resident->slot);
      FLUXON_DCHECK(released.ok(), "a committed slot's route was not live");
      if (!released.ok()) spdlog::error("releasing the route of {}: {}", key, released.ToString());
      resident = std::move(e->resident);
      *erase = true;
    }
    return 0;
  });
  if (resident) Count(State::kCommitted, -1);
  return resident;
}

std::optional<KeyIndex::Identity> KeyIndex::IdentityOf(const std::string& key) const {
  std::optional<Entry> e = table_.Get(key);  // a copy under the shard lock
  if (!e) return std::nullopt;
  return Identity{e->state, e->put_id, e->version, e->resident ? e->resident->len : 0};
}

void KeyIndex::ForEachCommitted(const std::function<void(const CommittedValue&)>& fn) const {
  table_.ForEach([&](const std::string& key, const Entry& e) {
    if (e.state == State::kCommitted && e.resident) {
      fn(CommittedValue{key, e.put_id, e.version, e.copy, e.resident->offset, e.resident->len});
    }
  });
}

void KeyIndex::ForEachWithPrefix(
    const std::string& prefix,
    const std::function<void(const std::string&, uint64_t, uint64_t)>& fn) const {
  table_.ForEach([&](const std::string& key, const Entry& e) {
    if (absl::StartsWith(key, prefix))
      fn(key, e.put_id, e.state == State::kCommitted ? e.cohort_id : 0);
  });
}

std::string KeyIndex::StateName(const std::string& key) const {
  // Get copies the entry (and its holder reference) under the shard lock.
  std::optional<Entry> e = table_.Get(key);
  if (!e) return "absent";
  switch (e->state) {
    case State::kReserved:
      return "reserved";
    case State::kLocalVisible:
      return "local_visible";
    case State::kCommitted:
      return "committed";
    case State::kEvicting:
      return "evicting";
  }
  return "unknown";
}

}  // namespace fluxon
