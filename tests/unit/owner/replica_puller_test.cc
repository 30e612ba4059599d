// ReplicaPuller on its own (src/owner/replica_puller.h), between two owners' parts registered at
// one MasterCore, each serving its segment over a TCP data plane on 127.0.0.1: the target
// (node 1) pulls exact identities that the source (node 2) published. A pull copies only the
// named identity (T2), a retry makes no second copy (T1), a deleted value is "source gone", and
// nothing stays reserved or claimed after a pull that did not complete.
#include "owner/replica_puller.h"

#include "tests/unit/owner/owner_parts_fixture.h"

namespace fluxon::testing {
namespace {

class ReplicaPullerTest : public OwnerPartsTest {
 protected:
  void TwoOwners() {
    PartsOptions target, source;
    target.node_id = 1;
    target.data_plane = true;
    source.node_id = 2;
    source.data_plane = true;
    a_ = &Make(target);
    b_ = &Make(source);
    auto warm = a_->pool().Claim(kValueLen, 1);  // carve the target's grant before timing starts
    ASSERT_TRUE(warm.ok()) << warm.status();
    ASSERT_TRUE(a_->pool().Abort(warm->front()).ok());
    puller_ = std::make_unique<ReplicaPuller>(a_->keys.get(), a_->remote.get(), a_->counters.get());
  }
  // The identity the master routes for `key`.
  PullItem ItemOf(const std::string& key) {
    auto route = RouteOf(master(), key);
    EXPECT_TRUE(route.has_value()) << key;
    if (!route) return PullItem{key, 1, 0, kValueLen};
    return PullItem{key, route->put_id(), route->version(), route->len()};
  }
  size_t Locations(const std::string& key) {
    auto route = RouteOf(master(), key);
    return route ? static_cast<size_t>(route->locations_size()) : 0;
  }
  std::vector<PullOutcome> Pull(const std::vector<PullItem>& items) {
    absl::StatusOr<std::vector<PullOutcome>> r = puller_->Pull(items);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : std::vector<PullOutcome>(items.size(), PullOutcome::kFailed);
  }
  void ExpectNothingPending() {
    EXPECT_EQ(a_->SlotsIn(SlotState::kPrepared), 0);
    EXPECT_EQ(a_->SlotsIn(SlotState::kPending), 0);
    EXPECT_EQ(a_->counters->reserved_entries.load(), 0);
    EXPECT_EQ(a_->counters->remote_pending_targets.load(), 0);
  }

  OwnerParts* a_ = nullptr;
  OwnerParts* b_ = nullptr;
  std::unique_ptr<ReplicaPuller> puller_;
};

// A pull installs a Committed copy of exactly the named identity with the source's bytes, and
// the master routes both locations; the same pull again is "already held" and copies nothing.
TEST_F(ReplicaPullerTest, PullCopiesTheIdentityAndARetryIsAlreadyHeld) {
  TwoOwners();
  const std::vector<std::string> keys = Keys("rp", 4);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  std::vector<PullItem> items;
  for (const std::string& k : keys) items.push_back(ItemOf(k));
  for (PullOutcome o : Pull(items)) EXPECT_EQ(o, PullOutcome::kCompleted) << PullOutcomeName(o);
  for (const PullItem& it : items) {
    EXPECT_EQ(a_->State(it.key), "committed");
    EXPECT_EQ(Locations(it.key), 2u);
    const std::optional<KeyIndex::Identity> id = a_->keys->IdentityOf(it.key);
    ASSERT_TRUE(id.has_value());
    EXPECT_EQ(id->put_id, it.put_id);
    EXPECT_EQ(id->version, it.version);
    HolderRef h;
    uint64_t cohort = 0;
    ASSERT_TRUE(a_->keys->Pin(it.key, &h, &cohort));
    EXPECT_EQ(TagAt(*a_, h->offset), TagOf(it.key));  // the source's bytes
  }
  for (PullOutcome o : Pull(items)) EXPECT_EQ(o, PullOutcome::kAlreadyHeld);
  for (const PullItem& it : items) EXPECT_EQ(Locations(it.key), 2u);
  EXPECT_EQ(a_->counters->replica_pulls_completed.load(), 4);
  EXPECT_EQ(a_->counters->replica_pulls_already_held.load(), 4);
  ExpectNothingPending();
}

// T2: an identity the route no longer names (another version) is obsolete and never copied; a
// key with no route (deleted at the source) is "source gone"; neither leaves anything behind.
TEST_F(ReplicaPullerTest, OtherIdentityIsObsoleteAndADeletedValueIsSourceGone) {
  TwoOwners();
  ASSERT_TRUE(PutAndPublish(*b_, {"v", "d"}).ok());
  PullItem other = ItemOf("v");
  other.version += 1;  // the same put_id, another version: another value
  PullItem deleted = ItemOf("d");
  auto removed = b_->evictor->DeletePrefix("d");
  ASSERT_TRUE(removed.ok());
  ASSERT_EQ(removed->deleted, 1u);
  const std::vector<PullOutcome> got = Pull({other, deleted});
  EXPECT_EQ(got[0], PullOutcome::kObsolete) << PullOutcomeName(got[0]);
  EXPECT_EQ(got[1], PullOutcome::kSourceGone) << PullOutcomeName(got[1]);
  EXPECT_EQ(a_->State("v"), "absent");
  EXPECT_EQ(a_->State("d"), "absent");
  EXPECT_EQ(Locations("v"), 1u);
  ExpectNothingPending();
}

// A pull naming its source copies only from that location: a source generation the master does
// not route (the source's value went, whatever else holds it) is "source gone".
TEST_F(ReplicaPullerTest, ANamedSourceIsTheOnlySource) {
  TwoOwners();
  ASSERT_TRUE(PutAndPublish(*b_, {"ns-a", "ns-b"}).ok());
  PullItem wrong = ItemOf("ns-a");
  wrong.source_node_id = b_->registration->identity().node_id;
  wrong.source_generation = b_->generation() + 1;
  PullItem right = ItemOf("ns-b");
  right.source_node_id = b_->registration->identity().node_id;
  right.source_generation = b_->generation();
  const std::vector<PullOutcome> got = Pull({wrong, right});
  EXPECT_EQ(got[0], PullOutcome::kSourceGone) << PullOutcomeName(got[0]);
  EXPECT_EQ(got[1], PullOutcome::kCompleted) << PullOutcomeName(got[1]);
  EXPECT_EQ(a_->State("ns-a"), "absent");
  EXPECT_EQ(Locations("ns-b"), 2u);
  ExpectNothingPending();
}

// A malformed batch is refused whole before anything is reserved.
TEST_F(ReplicaPullerTest, MalformedBatchIsRefusedWhole) {
  TwoOwners();
  ASSERT_TRUE(PutAndPublish(*b_, {"m"}).ok());
  const PullItem good = ItemOf("m");
  for (const std::vector<PullItem>& bad :
       {std::vector<PullItem>{}, std::vector<PullItem>{good, good},
        std::vector<PullItem>{good, PullItem{"z", 0, 1, kValueLen}},
        std::vector<PullItem>{good, PullItem{"z", 5, 1, 0}},
        std::vector<PullItem>{good, PullItem{"", 5, 1, kValueLen}},
        // group 7's items are not consecutive
        std::vector<PullItem>{PullItem{"g1", 5, 1, kValueLen, 0, 0, 7},
                              PullItem{"g2", 5, 1, kValueLen, 0, 0, 8},
                              PullItem{"g3", 5, 1, kValueLen, 0, 0, 7}}}) {
    EXPECT_EQ(puller_->Pull(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(a_->State("m"), "absent");
  ExpectNothingPending();
}

}  // namespace
}  // namespace fluxon::testing
