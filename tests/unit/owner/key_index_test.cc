// KeyIndex: the one owner of a value's lifecycle. Each transition that also moves the value's
// slot moves it in the same call, after checking the key's state; a transition naming another
// version, or the other kind of reservation, changes neither the key nor the slot.
#include "owner/key_index.h"

#include "tests/unit/owner/owner_parts_fixture.h"

namespace fluxon::testing {
namespace {

class KeyIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PartsOptions o;
    o.register_at_master = false;
    o.run_publisher = false;
    parts_ = OwnerParts::Create(&master_, o);
    ASSERT_NE(parts_, nullptr);
  }
  std::vector<SlotRef> Claim(size_t n) {
    absl::StatusOr<std::vector<SlotRef>> s = parts_->pool().Claim(kValueLen, n);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : std::vector<SlotRef>();
  }
  KeyIndex& keys() { return *parts_->keys; }
  int64_t Slots(SlotState s) { return parts_->SlotsIn(s); }

  MasterCore master_;
  std::unique_ptr<OwnerParts> parts_;
};

// G3: a batch reserves every key or none; a conflict leaves nothing of the batch reserved, and
// releasing a reservation aborts its Prepared slots in the same call.
TEST_F(KeyIndexTest, ReserveIsAllOrNoneAndReleaseAbortsTheSlots) {
  const std::vector<std::string> first = {"a", "b"};
  ASSERT_TRUE(keys().ReserveAll(first, 1, nullptr));
  const std::vector<std::string> second = {"c", "b", "d"};
  std::vector<uint32_t> conflicts;
  EXPECT_FALSE(keys().ReserveAll(second, 2, &conflicts));
  EXPECT_EQ(conflicts, std::vector<uint32_t>{1});
  EXPECT_EQ(keys().StateName("c"), "absent");
  EXPECT_EQ(keys().StateName("d"), "absent");
  EXPECT_EQ(keys().StateName("b"), "reserved");

  std::vector<SlotRef> slots = Claim(2);
  EXPECT_EQ(Slots(SlotState::kPrepared), 2);
  keys().ReleaseReservation(first, 1, slots);
  EXPECT_EQ(keys().StateName("a"), "absent");
  EXPECT_EQ(keys().StateName("b"), "absent");
  EXPECT_EQ(Slots(SlotState::kPrepared), 0);
  EXPECT_EQ(parts_->counters->reserved_entries.load(), 0);
}

// The put path's reserve-and-claim: all or none. A conflict reserves nothing and claims nothing;
// otherwise every key is Reserved with a Prepared slot each.
TEST_F(KeyIndexTest, ReserveAndClaimIsAllOrNone) {
  const std::vector<std::string> held = {"h"};
  ASSERT_TRUE(keys().ReserveAll(held, 1, nullptr));
  std::vector<uint32_t> conflicts;
  const std::vector<std::string> batch = {"p", "h", "q"};
  auto refused = keys().ReserveAndClaim(batch, 2, kValueLen, &conflicts);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(conflicts, std::vector<uint32_t>{1});
  EXPECT_EQ(keys().StateName("p"), "absent");
  EXPECT_EQ(Slots(SlotState::kPrepared), 0);
  const std::vector<std::string> fresh = {"p", "q"};
  auto slots = keys().ReserveAndClaim(fresh, 3, kValueLen, nullptr);
  ASSERT_TRUE(slots.ok()) << slots.status();
  EXPECT_EQ(slots->size(), 2u);
  EXPECT_EQ(keys().StateName("q"), "reserved");
  EXPECT_EQ(Slots(SlotState::kPrepared), 2);
  keys().ReleaseReservation(fresh, 3, *slots);
  keys().ReleaseReservation(held, 1, {});
  EXPECT_EQ(Slots(SlotState::kPrepared), 0);
  EXPECT_EQ(parts_->counters->reserved_entries.load(), 0);
}

// The fetch path's reserve-and-claim is per target: a key reserved here already is busy and
// the others are claimed; a claimed target is a fetch reservation (a put's release leaves it)
// that CommitHidden turns Pending behind its holder and CommitCopy installs.
TEST_F(KeyIndexTest, ReserveAndClaimEachIsPerTarget) {
  const std::vector<std::string> held = {"busy"};
  ASSERT_TRUE(keys().ReserveAll(held, 1, nullptr));
  const std::vector<KeyIndex::TargetRequest> targets = {
      {"t1", 5, kValueLen}, {"busy", 5, kValueLen}, {"t2", 6, kValueLen}};
  const auto claims = keys().ReserveAndClaimEach(targets, std::chrono::milliseconds(50));
  ASSERT_EQ(claims.size(), 3u);
  EXPECT_EQ(claims[0].outcome, KeyIndex::TargetOutcome::kClaimed);
  EXPECT_EQ(claims[1].outcome, KeyIndex::TargetOutcome::kBusy);
  EXPECT_EQ(claims[2].outcome, KeyIndex::TargetOutcome::kClaimed);
  EXPECT_EQ(Slots(SlotState::kPrepared), 2);
  const std::vector<std::string> t1 = {"t1"};
  keys().ReleaseReservation(t1, 5, {}, /*fetch=*/false);
  EXPECT_EQ(keys().StateName("t1"), "reserved");
  absl::StatusOr<HolderRef> h = keys().CommitHidden("t1", 5, *claims[0].slot, kValueLen);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(Slots(SlotState::kPending), 1);
  ASSERT_TRUE(keys().CommitCopy("t1", 5, &*h, /*cohort_id=*/9, /*version=*/3));
  EXPECT_EQ(keys().StateName("t1"), "committed");
  const std::vector<std::string> t2 = {"t2"};
  keys().ReleaseReservation(t2, 6, std::span<const SlotRef>(&*claims[2].slot, 1), true);
  keys().ReleaseReservation(held, 1, {});
  EXPECT_EQ(Slots(SlotState::kPrepared), 0);
  EXPECT_EQ(keys().StateName("t2"), "absent");
}

// An atomic group is claimed whole: one busy member gives the whole group up (nothing of it stays
// reserved or claimed); a target alone is unaffected.
TEST_F(KeyIndexTest, ReserveAndClaimEachTakesAGroupWhole) {
  const std::vector<std::string> held = {"g-busy"};
  ASSERT_TRUE(keys().ReserveAll(held, 1, nullptr));
  const std::vector<KeyIndex::TargetRequest> targets = {{"g-a", 5, kValueLen, 3},
                                                        {"g-busy", 5, kValueLen, 3},
                                                        {"g-c", 5, kValueLen, 3},
                                                        {"solo", 6, kValueLen, 0}};
  const auto claims = keys().ReserveAndClaimEach(targets, std::chrono::milliseconds(50));
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(claims[i].outcome, KeyIndex::TargetOutcome::kBusy) << i;
    EXPECT_FALSE(claims[i].slot.has_value()) << i;
  }
  EXPECT_EQ(claims[3].outcome, KeyIndex::TargetOutcome::kClaimed);
  EXPECT_EQ(keys().StateName("g-a"), "absent");
  EXPECT_EQ(keys().StateName("g-c"), "absent");
  EXPECT_EQ(Slots(SlotState::kPrepared), 1);
  const std::vector<std::string> solo = {"solo"};
  keys().ReleaseReservation(solo, 6, std::span<const SlotRef>(&*claims[3].slot, 1), true);
  keys().ReleaseReservation(held, 1, {});
  EXPECT_EQ(Slots(SlotState::kPrepared), 0);
  EXPECT_EQ(parts_->counters->reserved_entries.load(), 0);
}

// T2: a put's release never drops a remote get's reservation of the same number, or the reverse.
TEST_F(KeyIndexTest, ReleaseOfAnotherKindOrVersionKeepsTheReservation) {
  const std::vector<std::string> k = {"x"};
  ASSERT_TRUE(keys().ReserveAll(k, 7, nullptr, /*fetch=*/true));
  keys().ReleaseReservation(k, 7, {}, /*fetch=*/false);
  EXPECT_EQ(keys().StateName("x"), "reserved");
  keys().ReleaseReservation(k, 8, {}, /*fetch=*/true);
  EXPECT_EQ(keys().StateName("x"), "reserved");
  keys().ReleaseReservation(k, 7, {}, /*fetch=*/true);
  EXPECT_EQ(keys().StateName("x"), "absent");
}

// V1, then V3: MakeLocalVisible binds the slot to its holder (PendingLocalVisible, pinnable at
// once); Promote publishes the slot's route in the same call the key becomes Committed.
TEST_F(KeyIndexTest, LocalVisibleThenPromoteMovesKeyAndSlotTogether) {
  const std::vector<std::string> k = {"v"};
  ASSERT_TRUE(keys().ReserveAll(k, 11, nullptr));
  std::vector<SlotRef> slots = Claim(1);
  ASSERT_TRUE(keys().MakeLocalVisible("v", 11, slots[0], kValueLen));
  EXPECT_EQ(keys().StateName("v"), "local_visible");
  EXPECT_EQ(Slots(SlotState::kPendingLocalVisible), 1);
  HolderRef pin;
  uint64_t cohort = 1;
  ASSERT_TRUE(keys().Pin("v", &pin, &cohort));
  EXPECT_EQ(cohort, 0u);  // not committed yet
  pin.reset();

  EXPECT_FALSE(keys().Promote("v", 12, 5));  // another version: nothing moves
  EXPECT_EQ(keys().StateName("v"), "local_visible");
  EXPECT_EQ(Slots(SlotState::kPendingLocalVisible), 1);
  EXPECT_EQ(Slots(SlotState::kCommitted), 0);

  ASSERT_TRUE(keys().Promote("v", 11, 5));
  EXPECT_EQ(keys().StateName("v"), "committed");
  EXPECT_EQ(Slots(SlotState::kCommitted), 1);
  EXPECT_EQ(keys().CommittedCohort("v"), 5u);
  EXPECT_EQ(parts_->counters->committed_entries.load(), 1);
}

// A put whose reservation went (expired, aborted) cannot make its slot visible: the holder made
// for it is dropped and the slot is freed, nothing stays PendingLocalVisible.
TEST_F(KeyIndexTest, MakeLocalVisibleWithoutTheReservationFreesTheSlot) {
  std::vector<SlotRef> slots = Claim(1);
  EXPECT_FALSE(keys().MakeLocalVisible("gone", 3, slots[0], kValueLen));
  EXPECT_EQ(keys().StateName("gone"), "absent");
  EXPECT_EQ(Slots(SlotState::kPendingLocalVisible), 0);
  EXPECT_EQ(Slots(SlotState::kPrepared), 0);
}

// S2: only a value nothing pins may start evicting; erasing it releases the route in the same
// call, and the slot is Free once the returned (last) holder goes — never while a reader holds it.
TEST_F(KeyIndexTest, EvictionReleasesTheRouteOnlyForAnUnpinnedValue) {
  const std::vector<std::string> k = {"e"};
  ASSERT_TRUE(keys().ReserveAll(k, 21, nullptr));
  std::vector<SlotRef> slots = Claim(1);
  ASSERT_TRUE(keys().MakeLocalVisible("e", 21, slots[0], kValueLen));
  ASSERT_TRUE(keys().Promote("e", 21, 9));

  HolderRef reader;
  uint64_t cohort = 0;
  ASSERT_TRUE(keys().Pin("e", &reader, &cohort));
  EXPECT_EQ(keys().MarkEvicting("e", 21), KeyIndex::MarkResult::kInUse);
  reader.reset();
  EXPECT_EQ(keys().MarkEvicting("e", 22), KeyIndex::MarkResult::kGone);  // T2
  ASSERT_EQ(keys().MarkEvicting("e", 21), KeyIndex::MarkResult::kMarked);
  EXPECT_EQ(keys().StateName("e"), "evicting");
  EXPECT_FALSE(keys().Pin("e", &reader, &cohort));  // an evicting value is not readable

  HolderRef last = keys().EraseEvicting("e", 21);
  ASSERT_TRUE(last);
  EXPECT_EQ(keys().StateName("e"), "absent");
  EXPECT_EQ(Slots(SlotState::kCommitted), 0);
  EXPECT_EQ(Slots(SlotState::kReleasing), 1);  // route gone, the last holder still here
  last.reset();
  EXPECT_EQ(Slots(SlotState::kReleasing), 0);
  EXPECT_EQ(parts_->counters->committed_entries.load(), 0);
}

// T2: a copy the master no longer routes leaves the index at once even while a reader pins it
// (no new reader finds it); the reader keeps its bytes, and the slot is freed when it lets go.
TEST_F(KeyIndexTest, StaleValueLeavesTheIndexAtOnceAndIsFreedByItsLastReader) {
  const std::vector<std::string> k = {"s"};
  ASSERT_TRUE(keys().ReserveAll(k, 51, nullptr));
  std::vector<SlotRef> slots = Claim(1);
  ASSERT_TRUE(keys().MakeLocalVisible("s", 51, slots[0], kValueLen));
  ASSERT_TRUE(keys().Promote("s", 51, 3));
  HolderRef reader;
  uint64_t cohort = 0;
  ASSERT_TRUE(keys().Pin("s", &reader, &cohort));

  EXPECT_FALSE(keys().EraseStale("s", 52));  // another version: untouched
  HolderRef resident = keys().EraseStale("s", 51);
  ASSERT_TRUE(resident);
  EXPECT_EQ(keys().StateName("s"), "absent");
  HolderRef again;
  EXPECT_FALSE(keys().Pin("s", &again, &cohort));
  resident.reset();
  EXPECT_EQ(Slots(SlotState::kReleasing), 1);  // the reader still holds the bytes
  EXPECT_EQ(parts_->counters->committed_entries.load(), 0);
  reader.reset();
  EXPECT_EQ(Slots(SlotState::kReleasing), 0);
  EXPECT_EQ(Slots(SlotState::kCommitted), 0);
}

// An evicting value the master still pins goes back to Committed with its route untouched.
TEST_F(KeyIndexTest, UnmarkEvictingKeepsTheRoute) {
  const std::vector<std::string> k = {"u"};
  ASSERT_TRUE(keys().ReserveAll(k, 31, nullptr));
  std::vector<SlotRef> slots = Claim(1);
  ASSERT_TRUE(keys().MakeLocalVisible("u", 31, slots[0], kValueLen));
  ASSERT_TRUE(keys().Promote("u", 31, 2));
  ASSERT_EQ(keys().MarkEvicting("u", 31), KeyIndex::MarkResult::kMarked);
  keys().UnmarkEvicting("u", 31);
  EXPECT_EQ(keys().StateName("u"), "committed");
  EXPECT_EQ(Slots(SlotState::kCommitted), 1);
}

// A remote get's copy (a fetch reservation, its slot Pending behind a hidden holder) becomes
// Committed with its route published in one call; a put's reservation of the key cannot.
TEST_F(KeyIndexTest, CommitCopyPublishesTheRouteOfAFetchReservationOnly) {
  const std::vector<std::string> put_key = {"p"};
  ASSERT_TRUE(keys().ReserveAll(put_key, 41, nullptr, /*fetch=*/false));
  std::vector<SlotRef> slots = Claim(2);
  absl::StatusOr<HolderRef> hidden =
      HolderRef::CommitHidden(&parts_->pool(), slots[0], "p", 41, kValueLen);
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  EXPECT_FALSE(keys().CommitCopy("p", 41, &*hidden, 1));  // a put's reservation
  EXPECT_EQ(Slots(SlotState::kPending), 1);
  EXPECT_EQ(keys().StateName("p"), "reserved");

  const std::vector<std::string> fetch_key = {"f"};
  ASSERT_TRUE(keys().ReserveAll(fetch_key, 42, nullptr, /*fetch=*/true));
  absl::StatusOr<HolderRef> copy =
      HolderRef::CommitHidden(&parts_->pool(), slots[1], "f", 42, kValueLen);
  ASSERT_TRUE(copy.ok()) << copy.status();
  ASSERT_TRUE(keys().CommitCopy("f", 42, &*copy, 3));
  EXPECT_FALSE(*copy);  // moved into the index
  EXPECT_EQ(keys().StateName("f"), "committed");
  EXPECT_EQ(Slots(SlotState::kCommitted), 1);
  EXPECT_EQ(keys().CommittedCohort("f"), 3u);
  hidden->reset();
  keys().ReleaseReservation(put_key, 41, {});
  // Evicted the way the evictor does it: the slot ends Free.
  ASSERT_EQ(keys().MarkEvicting("f", 42), KeyIndex::MarkResult::kMarked);
  keys().EraseEvicting("f", 42).reset();
  EXPECT_EQ(Slots(SlotState::kCommitted), 0);
  EXPECT_EQ(Slots(SlotState::kPending), 0);
}

}  // namespace
}  // namespace fluxon::testing
