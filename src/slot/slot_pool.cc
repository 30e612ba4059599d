#include "slot/slot_pool.h"

#include <algorithm>
#include <deque>

#include "absl/strings/str_format.h"
#include "fluxon/status.h"
#include "fluxon/units.h"
#include "spdlog/spdlog.h"

namespace fluxon {
namespace {

using Clock = std::chrono::steady_clock;

// Background first touch goes in steps of this size: one madvise(MADV_POPULATE_WRITE) holds the
// process's mmap lock for reading while it clears the pages, and a thread that maps memory
// (malloc growing a table) waits for it, and every page fault queues behind that writer. 2 MiB
// (~0.5 ms of clearing) bounds that wait; 32 MiB chunks doubled the put cycle's p99 at 2 cores.
constexpr uint64_t kPopulateChunkBytes = 2ull << 20;

// Slot word: bits 0-2 state, bits 3-31 holder_ref_count, bits 32-63 epoch.
constexpr uint64_t kStateMask = 0x7;
constexpr uint32_t kHolderShift = 3;
constexpr uint64_t kMaxHolders = (uint64_t{1} << 29) - 1;

constexpr uint64_t Pack(SlotState s, uint64_t holders, uint32_t epoch) {
  return static_cast<uint64_t>(s) | (holders << kHolderShift) | (uint64_t{epoch} << 32);
}
constexpr SlotState StateBits(uint64_t w) { return static_cast<SlotState>(w & kStateMask); }
constexpr uint64_t HolderBits(uint64_t w) { return (w >> kHolderShift) & kMaxHolders; }
constexpr uint32_t EpochBits(uint64_t w) { return static_cast<uint32_t>(w >> 32); }

struct NextWord {
  SlotState state;
  uint64_t holders;
};

absl::Status WrongState(const char* op, SlotState s, const char* want) {
  return absl::FailedPreconditionError(
      absl::StrFormat("%s: slot is %s, expected %s", op, SlotStateName(s), want));
}

}  // namespace

const char* SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kFree:
      return "Free";
    case SlotState::kPrepared:
      return "Prepared";
    case SlotState::kPendingLocalVisible:
      return "PendingLocalVisible";
    case SlotState::kPending:
      return "Pending";
    case SlotState::kCommitted:
      return "Committed";
    case SlotState::kReleasing:
      return "Releasing";
  }
  return "Unknown";
}

struct SlotPool::Grant {
  uint32_t position;
  uint64_t offset;
  uint64_t slot_size;
  uint32_t slot_count;
  uint32_t carve;
  SizeClass* cls;
  std::unique_ptr<std::atomic<uint64_t>[]> words;
};

struct SlotPool::Waiter {
  size_t count;
};

struct SlotPool::SizeClass {
  explicit SizeClass(uint64_t size) : slot_size(size), slots_per_grant(SlotsPerGrant(size)) {}

  struct FreeList {
    std::vector<uint32_t> stack;  // popped from the back: lowest index first
    Clock::time_point idle_since;
  };

  const uint64_t slot_size;
  const uint64_t slots_per_grant;
  Mutex mu;
  CondVar cv;
  absl::btree_map<uint32_t, FreeList> grants ABSL_GUARDED_BY(mu);
  // Positions of grants with at least one free slot; claims take the lowest so high grants drain
  // and can be shrunk.
  absl::btree_set<uint32_t> with_free ABSL_GUARDED_BY(mu);
  uint64_t free_slots ABSL_GUARDED_BY(mu) = 0;
  std::deque<Waiter*> waiters ABSL_GUARDED_BY(mu);
  uint64_t pending_demand ABSL_GUARDED_BY(mu) = 0;
  bool refilling ABSL_GUARDED_BY(mu) = false;
};

absl::StatusOr<std::unique_ptr<SlotPool>> SlotPool::Create(Segment* segment,
                                                           SlotPoolOptions options) {
  if (segment == nullptr || !segment->is_owner()) {
    return absl::InvalidArgumentError("a slot pool needs the owner's segment");
  }
  if (options.claim_soft_timeout.count() <= 0 || options.claim_hard_timeout.count() <= 0 ||
      options.shrink_idle.count() <= 0) {
    return absl::InvalidArgumentError("slot pool timeouts must be > 0");
  }
  if (options.claim_hard_timeout <= options.claim_soft_timeout) {
    return absl::InvalidArgumentError("claim hard timeout must be greater than the soft timeout");
  }
  const uint64_t positions = segment->data_bytes() / kGrantBytes;
  uint64_t expected = 0;
  if (options.expected_capacity.has_value()) {
    const ExpectedCapacity& ec = *options.expected_capacity;
    if (ec.value_len == 0 || ec.value_len > kMaxValueBytes || ec.payload_capacity_bytes == 0) {
      return absl::InvalidArgumentError(
          "expected capacity needs 0 < value_len <= 512 MiB and payload_capacity_bytes > 0");
    }
    expected = ExpectedGrants(ec.value_len, ec.payload_capacity_bytes);
    if (expected > positions) {
      return absl::InvalidArgumentError(
          absl::StrFormat("expected capacity needs %d grants of 512 MiB but the segment holds %d",
                          expected, positions));
    }
  }
  if (positions == 0) {
    return absl::InvalidArgumentError("segment is smaller than one 512 MiB grant");
  }
  return std::unique_ptr<SlotPool>(new SlotPool(segment, std::move(options), positions, expected));
}

SlotPool::SlotPool(Segment* segment, SlotPoolOptions options, uint64_t positions,
                   uint64_t expected_grants)
    : segment_(segment),
      options_(std::move(options)),
      positions_(positions),
      expected_grants_(expected_grants),
      grants_(new std::atomic<Grant*>[positions]) {
  MutexLock lock(&alloc_mu_);
  for (uint32_t p = 0; p < positions_; ++p) {
    free_positions_.insert(p);
    grants_[p].store(nullptr, std::memory_order_relaxed);
  }
}

SlotPool::~SlotPool() {
  const int64_t free = state_counts_[0].load();
  int64_t total = 0;
  for (const auto& c : state_counts_) total += c.load();
  if (total != free) {
    spdlog::warn("slot pool destroyed with {} slots not Free", total - free);
  }
}

void SlotPool::CancelClaims() {
  claims_cancelled_.store(true, std::memory_order_release);
  std::vector<SizeClass*> classes;
  {
    MutexLock lock(&classes_mu_);
    for (auto& [size, cls] : classes_) classes.push_back(cls.get());
  }
  for (SizeClass* cls : classes) {
    MutexLock lock(&cls->mu);
    cls->cv.SignalAll();
  }
}

SlotPool::SizeClass* SlotPool::ClassFor(uint64_t slot_size) {
  MutexLock lock(&classes_mu_);
  auto& cls = classes_[slot_size];
  if (!cls) cls = std::make_unique<SizeClass>(slot_size);
  return cls.get();
}

absl::Status SlotPool::Prewarm() {
  if (expected_grants_ == 0) return absl::OkStatus();
  SizeClass* cls = ClassFor(SlotSizeFor(options_.expected_capacity->value_len));
  for (;;) {
    {
      MutexLock lock(&alloc_mu_);
      if (carved_grants_ >= expected_grants_) break;
    }
    FLUXON_RETURN_IF_ERROR(AddGrant(cls));
  }
  spdlog::info("local reserve prewarmed {} grants of {}-byte slots ({} slots)", expected_grants_,
               cls->slot_size, expected_grants_ * cls->slots_per_grant);
  return absl::OkStatus();
}

absl::Status SlotPool::AddGrant(SizeClass* cls, uint64_t claim_bytes) {
  Grant* grant = nullptr;
  bool warm = false;
  {
    MutexLock lock(&alloc_mu_);
    if (expected_grants_ > 0 && carved_grants_ >= expected_grants_) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("expected-capacity cap of %d grants reached", expected_grants_));
    }
    if (free_positions_.empty()) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "segment has no free grant position (%d grants of 512 MiB carved)", carved_grants_));
    }
    // A populated position first: the claim then skips the first touch.
    const uint32_t pos =
        warm_positions_.empty() ? *free_positions_.begin() : *warm_positions_.begin();
    warm = warm_positions_.erase(pos) > 0;
    free_positions_.erase(pos);
    ++carved_grants_;
    for (auto& g : retired_) {
      if (g->position == pos && g->slot_size == cls->slot_size) grant = g.get();
    }
    if (grant == nullptr) {
      auto g = std::make_unique<Grant>();
      g->position = pos;
      g->offset = segment_->data_offset() + uint64_t{pos} * kGrantBytes;
      g->slot_size = cls->slot_size;
      g->slot_count = static_cast<uint32_t>(cls->slots_per_grant);
      g->cls = cls;
      g->carve = next_carve_++;
      g->words.reset(new std::atomic<uint64_t>[g->slot_count]);
      for (uint32_t i = 0; i < g->slot_count; ++i) {
        g->words[i].store(Pack(SlotState::kFree, 0, 0), std::memory_order_relaxed);
      }
      grant = g.get();
      retired_.push_back(std::move(g));
    }
  }
  if (options_.populate_grants && !warm) {
    // What the waiting claim takes first (the lowest slots), in whole 2 MiB pages (huge pages
    // too); the rest in the background. NUMA placement: all of it now.
    const uint64_t grant_bytes = uint64_t{grant->slot_count} * grant->slot_size;
    constexpr uint64_t kUnit = 2ull << 20;
    const uint64_t now_bytes =
        segment_->numa_node() >= 0
            ? grant_bytes
            : std::min(grant_bytes,
                       (std::min(claim_bytes, grant_bytes) + kUnit - 1) / kUnit * kUnit);
    absl::Status st = segment_->PopulateRange(grant->offset, now_bytes);
    if (!st.ok()) {
      MutexLock lock(&alloc_mu_);
      free_positions_.insert(grant->position);
      --carved_grants_;
      return st;
    }
    if (now_bytes < grant_bytes) {
      MutexLock lock(&alloc_mu_);
      unpopulated_.push_back(
          Unpopulated{grant->position, grant->offset + now_bytes, grant->offset + grant_bytes});
    }
  }
  grants_[grant->position].store(grant, std::memory_order_release);
  state_counts_[0].fetch_add(grant->slot_count, std::memory_order_relaxed);
  {
    MutexLock lock(&cls->mu);
    SizeClass::FreeList& fl = cls->grants[grant->position];
    fl.stack.resize(grant->slot_count);
    for (uint32_t i = 0; i < grant->slot_count; ++i) fl.stack[i] = grant->slot_count - 1 - i;
    fl.idle_since = Clock::now();
    cls->with_free.insert(grant->position);
    cls->free_slots += grant->slot_count;
    cls->cv.SignalAll();
  }
  spdlog::debug("carved grant {} into {} slots of {} bytes", grant->position, grant->slot_count,
                grant->slot_size);
  return absl::OkStatus();
}

uint64_t SlotPool::MaxSlotsReachable(const SizeClass& cls) const {
  if (expected_grants_ == 0) return positions_ * cls.slots_per_grant;
  uint64_t own = 0;
  {
    MutexLock lock(const_cast<Mutex*>(&cls.mu));
    own = cls.grants.size();
  }
  MutexLock lock(&alloc_mu_);
  return (own + (expected_grants_ - carved_grants_)) * cls.slots_per_grant;
}

absl::StatusOr<std::vector<SlotRef>> SlotPool::Claim(
    uint64_t value_len, size_t count, std::optional<std::chrono::milliseconds> hard_timeout) {
  if (value_len == 0 || value_len > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("value_len %d is outside (0, 512 MiB]", value_len));
  }
  if (count == 0) return absl::InvalidArgumentError("claim of zero slots");
  SizeClass* cls = ClassFor(SlotSizeFor(value_len));
  const uint64_t reachable = MaxSlotsReachable(*cls);
  if (count > reachable) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "claim of %d slots of %d bytes can never be served: the pool can hold at most %d", count,
        cls->slot_size, reachable));
  }
  claims_.fetch_add(1, std::memory_order_relaxed);
  const absl::Status cancelled = absl::UnavailableError("the owner is shutting down");
  if (claims_cancelled_.load(std::memory_order_acquire)) return cancelled;
  const auto start = Clock::now();
  const auto soft_deadline = start + options_.claim_soft_timeout;
  const auto deadline = start + hard_timeout.value_or(options_.claim_hard_timeout);
  bool pressure_reported = false;

  MutexLock lock(&cls->mu);
  Waiter me{count};
  cls->waiters.push_back(&me);
  cls->pending_demand += count;
  const char* stage = "claim_turn";
  for (;;) {
    const bool my_turn = cls->waiters.front() == &me;
    if (my_turn && cls->free_slots >= count) {
      return TakeFreeSlots(cls, count);
    }
    if (my_turn) {
      stage = "refill";
      if (!cls->refilling) {
        cls->refilling = true;
        // The slots the new grant must give this claim (the free ones are taken first).
        const uint64_t claim_bytes =
            (count - std::min<uint64_t>(count, cls->free_slots)) * cls->slot_size;
        cls->mu.Unlock();
        absl::Status grown = AddGrant(cls, claim_bytes);
        cls->mu.Lock();
        cls->refilling = false;
        if (grown.ok()) continue;
        // Slots freed while the lock was released signalled nobody (this claim was not
        // waiting): look again before sleeping, or the wake-up is lost until the deadline.
        if (cls->free_slots >= count) continue;
      }
    } else {
      stage = "claim_turn";
    }
    const auto now = Clock::now();
    if (claims_cancelled_.load(std::memory_order_acquire)) {
      LeaveQueue(cls, &me);
      return cancelled;
    }
    // Past the deadline a claim still waits while its class is being carved (a grant's first
    // touch can take longer than the claim's timeout on a busy machine) or while slots it
    // could take are free: a claim never times out while the segment has room for it.
    const bool still_coming = cls->refilling || cls->free_slots >= count;
    if (now >= deadline && !still_coming) break;
    if (now >= deadline) {
      cls->cv.WaitUntil(&cls->mu, now + std::chrono::milliseconds(10));
      continue;
    }
    if (!pressure_reported && now >= soft_deadline) {
      pressure_reported = true;
      if (options_.on_pressure) {
        const uint64_t front_need = cls->waiters.front()->count;
        PressureEvent ev{cls->slot_size,
                         front_need > cls->free_slots ? front_need - cls->free_slots : 0};
        cls->mu.Unlock();
        options_.on_pressure(ev);
        cls->mu.Lock();
      }
      continue;
    }
    cls->cv.WaitUntil(&cls->mu, pressure_reported ? deadline : std::min(deadline, soft_deadline));
  }
  // Timed out: leave the queue without reserving anything and let the next claim try.
  LeaveQueue(cls, &me);
  claim_timeouts_.fetch_add(1, std::memory_order_relaxed);
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  return WithPayload(
      absl::ResourceExhaustedError(absl::StrFormat(
          "local reserve claim timed out after %d ms (stage=%s): need %d slots of %d bytes; "
          "pool: %d free, %d grants in class, %d claims waiting",
          waited, stage, count, cls->slot_size, cls->free_slots, cls->grants.size(),
          cls->waiters.size())),
      kClaimStagePayload, stage);
}

std::vector<SlotRef> SlotPool::TakeFreeSlots(SizeClass* cls, size_t count) {
  cls->mu.AssertHeld();
  std::vector<SlotRef> refs;
  refs.reserve(count);
  while (refs.size() < count) {
    const uint32_t pos = *cls->with_free.begin();
    SizeClass::FreeList& fl = cls->grants[pos];
    Grant* g = grants_[pos].load(std::memory_order_acquire);
    while (!fl.stack.empty() && refs.size() < count) {
      const uint32_t idx = fl.stack.back();
      fl.stack.pop_back();
      std::atomic<uint64_t>& word = g->words[idx];
      uint64_t old = word.load(std::memory_order_acquire);
      uint32_t epoch;
      do {
        epoch = EpochBits(old) + 1;
      } while (!word.compare_exchange_weak(old, Pack(SlotState::kPrepared, 0, epoch),
                                           std::memory_order_acq_rel));
      refs.push_back(SlotRef{pos, idx, epoch, g->carve});
    }
    if (fl.stack.empty()) cls->with_free.erase(pos);
  }
  cls->free_slots -= count;
  cls->pending_demand -= count;
  cls->waiters.pop_front();
  if (!cls->waiters.empty()) cls->cv.SignalAll();
  CountTransitionBatch(count);
  return refs;
}

void SlotPool::LeaveQueue(SizeClass* cls, Waiter* claim) {
  cls->mu.AssertHeld();
  cls->waiters.erase(std::find(cls->waiters.begin(), cls->waiters.end(), claim));
  cls->pending_demand -= claim->count;
  cls->cv.SignalAll();
}

void SlotPool::CountTransitionBatch(size_t count) {
  state_counts_[static_cast<int>(SlotState::kFree)].fetch_sub(count, std::memory_order_relaxed);
  state_counts_[static_cast<int>(SlotState::kPrepared)].fetch_add(count, std::memory_order_relaxed);
}

void SlotPool::CountTransition(SlotState from, SlotState to) {
  if (from == to) return;
  state_counts_[static_cast<int>(from)].fetch_sub(1, std::memory_order_relaxed);
  state_counts_[static_cast<int>(to)].fetch_add(1, std::memory_order_relaxed);
}

absl::StatusOr<std::atomic<uint64_t>*> SlotPool::WordFor(const SlotRef& ref) const {
  if (ref.grant >= positions_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("slot ref names grant %d of %d", ref.grant, positions_));
  }
  Grant* g = grants_[ref.grant].load(std::memory_order_acquire);
  if (g == nullptr || ref.index >= g->slot_count) {
    return absl::InvalidArgumentError(
        absl::StrFormat("slot ref (grant %d, slot %d) names no carved slot", ref.grant, ref.index));
  }
  if (g->carve != ref.carve) {
    return absl::FailedPreconditionError(
        absl::StrFormat("stale slot ref: grant %d was re-carved (carve %d, ref has %d)", ref.grant,
                        g->carve, ref.carve));
  }
  return &g->words[ref.index];
}

template <typename Next>
absl::Status SlotPool::Transition(const SlotRef& ref, const char* op, Next next) {
  FLUXON_ASSIGN_OR_RETURN(std::atomic<uint64_t> * word, WordFor(ref));
  uint64_t old = word->load(std::memory_order_acquire);
  for (;;) {
    if (EpochBits(old) != ref.epoch) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: stale slot ref (grant %d, slot %d, epoch %d; slot is at epoch %d)",
                          op, ref.grant, ref.index, ref.epoch, EpochBits(old)));
    }
    const SlotState from = StateBits(old);
    absl::StatusOr<NextWord> n = next(from, HolderBits(old));
    if (!n.ok()) return n.status();
    if (word->compare_exchange_weak(old, Pack(n->state, n->holders, ref.epoch),
                                    std::memory_order_acq_rel, std::memory_order_acquire)) {
      CountTransition(from, n->state);
      if (n->state == SlotState::kFree) PushFree(ref);
      return absl::OkStatus();
    }
  }
}

void SlotPool::PushFree(const SlotRef& ref) {
  Grant* g = grants_[ref.grant].load(std::memory_order_acquire);
  SizeClass* cls = g->cls;
  MutexLock lock(&cls->mu);
  SizeClass::FreeList& fl = cls->grants[ref.grant];
  fl.stack.push_back(ref.index);
  if (fl.stack.size() == 1) cls->with_free.insert(ref.grant);
  if (fl.stack.size() == g->slot_count) fl.idle_since = Clock::now();
  ++cls->free_slots;
  if (!cls->waiters.empty()) cls->cv.SignalAll();
}

absl::Status SlotPool::Abort(const SlotRef& ref) {
  return Transition(ref, "abort", [](SlotState s, uint64_t h) -> absl::StatusOr<NextWord> {
    if (s != SlotState::kPrepared) return WrongState("abort", s, "Prepared");
    return NextWord{SlotState::kFree, 0};
  });
}

absl::Status SlotPool::CommitLocalVisible(const SlotRef& ref) {
  return Transition(ref, "commit", [](SlotState s, uint64_t h) -> absl::StatusOr<NextWord> {
    if (s != SlotState::kPrepared) return WrongState("commit", s, "Prepared");
    return NextWord{SlotState::kPendingLocalVisible, 1};
  });
}

absl::Status SlotPool::CommitHidden(const SlotRef& ref) {
  return Transition(ref, "commit_hidden", [](SlotState s, uint64_t h) -> absl::StatusOr<NextWord> {
    if (s != SlotState::kPrepared) return WrongState("commit_hidden", s, "Prepared");
    return NextWord{SlotState::kPending, 1};
  });
}

absl::Status SlotPool::PublishRoute(const SlotRef& ref) {
  return Transition(ref, "publish_route", [](SlotState s, uint64_t h) -> absl::StatusOr<NextWord> {
    if (s != SlotState::kPendingLocalVisible && s != SlotState::kPending) {
      return WrongState("publish_route", s, "PendingLocalVisible or Pending");
    }
    return NextWord{SlotState::kCommitted, h};
  });
}

absl::Status SlotPool::ReleaseRoute(const SlotRef& ref) {
  return Transition(ref, "release_route", [](SlotState s, uint64_t h) -> absl::StatusOr<NextWord> {
    if (s != SlotState::kCommitted) return WrongState("release_route", s, "Committed (route live)");
    if (h > 0) return NextWord{SlotState::kReleasing, h};
    return NextWord{SlotState::kFree, 0};
  });
}

absl::Status SlotPool::AcquireHolder(const SlotRef& ref) {
  return Transition(ref, "acquire_holder", [](SlotState s, uint64_t h) -> absl::StatusOr<NextWord> {
    if (s != SlotState::kPendingLocalVisible && s != SlotState::kPending &&
        s != SlotState::kCommitted) {
      return WrongState("acquire_holder", s, "PendingLocalVisible, Pending or Committed");
    }
    if (h >= kMaxHolders) return absl::ResourceExhaustedError("slot holder count overflow");
    return NextWord{s, h + 1};
  });
}

absl::Status SlotPool::ReleaseHolder(const SlotRef& ref) {
  return Transition(ref, "release_holder", [](SlotState s, uint64_t h) -> absl::StatusOr<NextWord> {
    if (h == 0) return WrongState("release_holder", s, "a slot with a holder");
    if (h == 1 && s != SlotState::kCommitted) return NextWord{SlotState::kFree, 0};
    return NextWord{s, h - 1};
  });
}

size_t SlotPool::ShrinkIdleGrants() {
  if (expected_grants_ > 0) return 0;
  std::vector<SizeClass*> classes;
  {
    MutexLock lock(&classes_mu_);
    for (auto& [size, cls] : classes_) classes.push_back(cls.get());
  }
  const auto now = Clock::now();
  std::vector<Grant*> shrunk;
  for (SizeClass* cls : classes) {
    MutexLock lock(&cls->mu);
    const uint64_t spg = cls->slots_per_grant;
    const uint64_t used = cls->grants.size() * spg - cls->free_slots;
    // A class in use keeps its spare: shrinking below it would only make the next refill
    // carve (and populate) the same memory again.
    const uint64_t spare = used > 0 ? SpareSlots(*cls) : 0;
    const uint64_t floor_grants = CeilDiv(used + cls->pending_demand + spare, spg);
    for (auto it = cls->grants.rbegin(); it != cls->grants.rend();) {
      if (cls->grants.size() <= floor_grants) break;
      const SizeClass::FreeList& fl = it->second;
      if (fl.stack.size() != spg || now - fl.idle_since < options_.shrink_idle) {
        ++it;
        continue;
      }
      const uint32_t pos = it->first;
      shrunk.push_back(grants_[pos].load(std::memory_order_acquire));
      cls->with_free.erase(pos);
      cls->free_slots -= spg;
      it = decltype(it)(cls->grants.erase(std::next(it).base()));
    }
  }
  for (Grant* g : shrunk) {
    state_counts_[0].fetch_sub(g->slot_count, std::memory_order_relaxed);
    {
      // A shrunk grant's memory is populated already: keep it as a warm position while fewer
      // than warm_grants are, rather than punch it out and populate another one later.
      MutexLock lock(&alloc_mu_);
      if (options_.populate_grants && warm_positions_.size() < options_.warm_grants) {
        free_positions_.insert(g->position);
        warm_positions_.insert(g->position);
        --carved_grants_;
        continue;
      }
    }
    {
      // Nothing populates a position that is released (its memory goes back to the kernel).
      MutexLock lock(&alloc_mu_);
      std::erase_if(unpopulated_, [&](const Unpopulated& u) { return u.position == g->position; });
    }
    absl::Status st = segment_->ReleaseRange(g->offset, g->slot_count * g->slot_size);
    if (!st.ok()) spdlog::warn("releasing grant {} memory: {}", g->position, st.ToString());
    MutexLock lock(&alloc_mu_);
    free_positions_.insert(g->position);
    --carved_grants_;
  }
  if (!shrunk.empty()) {
    grants_shrunk_.fetch_add(shrunk.size(), std::memory_order_relaxed);
    spdlog::info("shrank {} idle grants", shrunk.size());
    // Claims of other classes may be waiting for a grant position.
    for (SizeClass* cls : classes) {
      MutexLock lock(&cls->mu);
      cls->cv.SignalAll();
    }
  }
  return shrunk.size();
}

bool SlotPool::CanGrow() const {
  MutexLock lock(&alloc_mu_);
  if (expected_grants_ > 0) return carved_grants_ < expected_grants_;
  return !free_positions_.empty();
}

uint64_t SlotPool::SpareSlots(const SizeClass& cls) const {
  return static_cast<uint64_t>(options_.spare_fraction * static_cast<double>(cls.slots_per_grant));
}

uint64_t SlotPool::PopulateBehind(uint64_t max_bytes) {
  uint64_t done = 0;
  while (done < max_bytes) {
    uint64_t offset = 0, len = 0;
    {
      MutexLock lock(&alloc_mu_);
      if (unpopulated_.empty()) break;
      Unpopulated& u = unpopulated_.front();
      offset = u.next;
      // One madvise call per chunk; the lock is never held over it.
      len = std::min({kPopulateChunkBytes, u.end - u.next, max_bytes - done});
      u.next += len;
      if (u.next >= u.end) unpopulated_.pop_front();
    }
    if (absl::Status st = segment_->PopulateRange(offset, len); !st.ok()) {
      spdlog::warn("populating {} bytes of a carved grant: {}", len, st.ToString());
      break;  // first touch by the writers instead
    }
    done += len;
  }
  return done;
}

size_t SlotPool::PrefaultAhead() {
  if (expected_grants_ > 0 || !options_.populate_grants) return 0;
  size_t populated = 0;
  for (;;) {
    uint32_t pos = 0;
    {
      MutexLock lock(&alloc_mu_);
      if (warm_positions_.size() >= options_.warm_grants) break;
      // The highest cold free position: carves take warm ones, else the lowest, so the two
      // rarely meet on one position.
      bool found = false;
      for (auto it = free_positions_.rbegin(); it != free_positions_.rend() && !found; ++it) {
        if (!warm_positions_.contains(*it)) {
          pos = *it;
          found = true;
        }
      }
      if (!found) break;
    }
    const uint64_t offset = segment_->data_offset() + uint64_t{pos} * kGrantBytes;
    absl::Status st;
    for (uint64_t o = 0; o < kGrantBytes && st.ok(); o += kPopulateChunkBytes) {
      st = segment_->PopulateRange(offset + o, kPopulateChunkBytes);
    }
    if (!st.ok()) {
      spdlog::warn("prefaulting grant position {}: {}", pos, st.ToString());
      break;
    }
    MutexLock lock(&alloc_mu_);
    // Still free (a carve did not take it meanwhile): ready for the next carve.
    if (free_positions_.contains(pos)) warm_positions_.insert(pos);
    ++populated;
  }
  return populated;
}

size_t SlotPool::RefillLowClasses() {
  if (expected_grants_ > 0) return 0;
  std::vector<SizeClass*> low;
  {
    MutexLock lock(&classes_mu_);
    for (auto& [size, cls] : classes_) {
      MutexLock cl(&cls->mu);
      // Only classes in use: an idle class keeps no spare grant (it would only be shrunk).
      const bool in_use = cls->grants.size() * cls->slots_per_grant > cls->free_slots;
      if (in_use && !cls->refilling && cls->free_slots < SpareSlots(*cls)) {
        low.push_back(cls.get());
      }
    }
  }
  size_t carved = 0;
  for (SizeClass* cls : low) {
    uint64_t claim_bytes = 0;
    {
      MutexLock cl(&cls->mu);
      if (cls->refilling) continue;
      cls->refilling = true;
      // A spare is carved ahead of need: it populates now only what claims already wait for
      // (their turn comes once `refilling` clears), the rest in the background. Populating the
      // whole 512 MiB here held every claim of the class for ~150 ms on a 2-core machine.
      if (cls->pending_demand > cls->free_slots) {
        claim_bytes = (cls->pending_demand - cls->free_slots) * cls->slot_size;
      }
    }
    if (AddGrant(cls, claim_bytes).ok()) ++carved;
    MutexLock cl(&cls->mu);
    cls->refilling = false;
    cls->cv.SignalAll();
  }
  return carved;
}

absl::StatusOr<SlotState> SlotPool::StateOf(const SlotRef& ref) const {
  FLUXON_ASSIGN_OR_RETURN(std::atomic<uint64_t> * word, WordFor(ref));
  const uint64_t w = word->load(std::memory_order_acquire);
  if (EpochBits(w) != ref.epoch) return absl::FailedPreconditionError("stale slot ref");
  return StateBits(w);
}

uint32_t SlotPool::HolderCountOf(const SlotRef& ref) const {
  auto word = WordFor(ref);
  return word.ok() ? static_cast<uint32_t>(HolderBits((*word)->load())) : 0;
}

uint64_t SlotPool::OffsetOf(const SlotRef& ref) const {
  const Grant* g = grants_[ref.grant].load(std::memory_order_acquire);
  return g->offset + uint64_t{ref.index} * g->slot_size;
}

uint64_t SlotPool::SlotSizeOf(const SlotRef& ref) const {
  return grants_[ref.grant].load(std::memory_order_acquire)->slot_size;
}

SlotPoolStats SlotPool::Stats() const {
  SlotPoolStats s;
  for (int i = 0; i < kNumSlotStates; ++i) s.slots_by_state[i] = state_counts_[i].load();
  {
    MutexLock lock(&alloc_mu_);
    s.grants = carved_grants_;
    s.warm_grants = warm_positions_.size();
  }
  s.grant_capacity = expected_grants_ > 0 ? expected_grants_ : positions_;
  s.claims = claims_.load();
  s.claim_timeouts = claim_timeouts_.load();
  s.grants_shrunk = grants_shrunk_.load();
  MutexLock lock(&classes_mu_);
  for (const auto& [size, cls] : classes_) {
    MutexLock cl(&cls->mu);
    s.classes.push_back(SizeClassStats{size, cls->slots_per_grant, cls->grants.size(),
                                       cls->free_slots, cls->waiters.size(), cls->pending_demand,
                                       cls->refilling});
  }
  return s;
}

absl::Status SlotPool::CheckConsistency() const {
  MutexLock lock(&classes_mu_);
  int64_t free_words_total = 0;
  for (const auto& [size, cls] : classes_) {
    MutexLock cl(&cls->mu);
    uint64_t listed = 0;
    for (const auto& [pos, fl] : cls->grants) {
      const Grant* g = grants_[pos].load(std::memory_order_acquire);
      if (g == nullptr || g->cls != cls.get()) {
        return absl::InternalError(absl::StrFormat("grant %d is not carved for its class", pos));
      }
      std::vector<bool> seen(g->slot_count, false);
      for (uint32_t idx : fl.stack) {
        if (idx >= g->slot_count || seen[idx]) {
          return absl::InternalError(
              absl::StrFormat("grant %d: slot %d is on the free list twice", pos, idx));
        }
        seen[idx] = true;
        const SlotState st = StateBits(g->words[idx].load());
        if (st != SlotState::kFree) {
          return absl::InternalError(absl::StrFormat("grant %d: slot %d is listed free but is %s",
                                                     pos, idx, SlotStateName(st)));
        }
      }
      uint64_t free_words = 0;
      for (uint32_t i = 0; i < g->slot_count; ++i) {
        if (StateBits(g->words[i].load()) == SlotState::kFree) ++free_words;
      }
      if (free_words != fl.stack.size()) {
        return absl::InternalError(absl::StrFormat("grant %d: %d slots are Free but %d are listed",
                                                   pos, free_words, fl.stack.size()));
      }
      if ((fl.stack.empty()) == cls->with_free.contains(pos)) {
        return absl::InternalError(absl::StrFormat("grant %d: free-grant index is stale", pos));
      }
      listed += fl.stack.size();
      free_words_total += static_cast<int64_t>(free_words);
    }
    if (listed != cls->free_slots) {
      return absl::InternalError(
          absl::StrFormat("class %d: free_slots %d but %d listed", size, cls->free_slots, listed));
    }
  }
  if (free_words_total != state_counts_[0].load()) {
    return absl::InternalError(absl::StrFormat("Free counter %d but %d Free slots",
                                               state_counts_[0].load(), free_words_total));
  }
  return absl::OkStatus();
}

}  // namespace fluxon
