// Evictor on its own (src/owner/evictor.h): whole cohorts of unpinned Committed values only (S1,
// S4), routes removed at the master before any slot is freed and only on a definite answer (S2,
// T1), a location a peer's remote get pins at the master is kept (S2, S3), delete-by-prefix, and
// the watermark round that never changes the capacity (S5), recoverable-first eviction (a value
// copied on another node goes first, and only while the master still routes another live copy).
#include "owner/evictor.h"

#include "common/put_id.h"

#include "tests/unit/owner/owner_parts_fixture.h"

namespace fluxon::testing {
namespace {

class EvictorTest : public OwnerPartsTest {};

// S1/S4 (and E2): a cohort with a pinned member is not split and goes back to the hot tier
// unchanged; the unpinned cohorts go, route and slot; values not yet committed are not
// candidates at all.
TEST_F(EvictorTest, EvictsOnlyWholeUnpinnedCommittedCohorts) {
  OwnerParts& o = Make();
  ASSERT_TRUE(PutAndPublish(o, {"a0", "a1"}, {2}).ok());  // one cohort
  ASSERT_TRUE(PutAndPublish(o, {"b0"}).ok());
  auto pin = o.gets->Start(1, {"a0"}, {}, false);
  ASSERT_TRUE(pin.ok() && pin->handle_id != 0);
  Fault("master.PublishBatch", FaultAction::kDelay, 1, milliseconds(10'000));
  auto local = StartTagged(o, 1, {"l0"});
  ASSERT_TRUE(local.ok());
  ASSERT_TRUE(o.puts->Commit(1, local->put_id, nullptr, false).ok());  // LocalVisible only

  const uint64_t evicted = o.evictor->EvictSome(UINT64_MAX);
  EXPECT_EQ(evicted, static_cast<uint64_t>(kValueLen));  // b0's slot (64 KiB values fit exactly)
  EXPECT_EQ(o.State("b0"), "absent");
  EXPECT_FALSE(RouteOf(master(), "b0").has_value());
  EXPECT_EQ(o.State("a0"), "committed");
  EXPECT_EQ(o.State("a1"), "committed");  // its cohort's other member is pinned: kept whole
  EXPECT_TRUE(RouteOf(master(), "a1").has_value());
  EXPECT_EQ(o.State("l0"), "local_visible");
  EXPECT_EQ(o.hot->size(), 1u);  // a's cohort re-admitted
  EXPECT_EQ(o.counters->eviction_skipped_pinned.load(), 1);
  EXPECT_EQ(o.counters->evicted_cohorts.load(), 1);

  ASSERT_TRUE(o.gets->Cancel(1, pin->handle_id).ok());
  EXPECT_EQ(o.evictor->EvictSome(UINT64_MAX), 2u * kValueLen);
  EXPECT_EQ(o.State("a0"), "absent");
  EXPECT_EQ(o.State("a1"), "absent");
  EXPECT_EQ(o.hot->size(), 0u);
  faults_.Clear("master.PublishBatch");
}

// S2: the route goes first. While RemoveRoutes is still on its way to the master the value is
// Evicting, its slot still Committed and its route still served; only after the master removed
// the route is the slot freed.
TEST_F(EvictorTest, S2RouteIsRemovedAtTheMasterBeforeTheSlotIsFreed) {
  OwnerParts& o = Make();
  ASSERT_TRUE(PutAndPublish(o, {"s"}).ok());
  Fault("master.RemoveRoutes", FaultAction::kDelay, 1, milliseconds(10'000));
  uint64_t evicted = 0;
  std::thread evicting([&] { evicted = o.evictor->EvictSome(UINT64_MAX); });
  ASSERT_TRUE(WaitUntil([&] { return o.State("s") == "evicting"; }));
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(o.SlotsIn(SlotState::kCommitted), 1);
  EXPECT_TRUE(RouteOf(master(), "s").has_value());
  faults_.Clear("master.RemoveRoutes");
  evicting.join();
  EXPECT_EQ(evicted, static_cast<uint64_t>(kValueLen));
  EXPECT_FALSE(RouteOf(master(), "s").has_value());
  EXPECT_EQ(o.State("s"), "absent");
  EXPECT_EQ(o.SlotsIn(SlotState::kCommitted), 0);
  EXPECT_EQ(o.SlotsIn(SlotState::kReleasing), 0);
  EXPECT_EQ(mc().removed_routes.load(), 1);
  EXPECT_TRUE(o.pool().CheckConsistency().ok());
}

// S2/T1: any error keeps the value: a refused removal (definite error, not retried) and an
// undelivered one (uncertain, retried kEvictRemoveAttempts times) leave it Committed, routed and
// back in the hot tier; the next round tries the same key + put_id again and evicts it.
TEST_F(EvictorTest, S2UnconfirmedRemovalKeepsTheValueCommittedAndRouted) {
  OwnerParts& o = Make();
  ASSERT_TRUE(PutAndPublish(o, {"kept"}).ok());
  for (FaultAction action : {FaultAction::kRefuse, FaultAction::kFail}) {
    const int64_t calls = o.counters->route_remove_calls.load();
    Fault("master.RemoveRoutes", action, -1);
    EXPECT_EQ(o.evictor->EvictSome(UINT64_MAX), 0u);
    faults_.Clear("master.RemoveRoutes");
    EXPECT_EQ(o.State("kept"), "committed");
    EXPECT_TRUE(RouteOf(master(), "kept").has_value());
    EXPECT_EQ(o.SlotsIn(SlotState::kCommitted), 1);
    EXPECT_EQ(o.hot->size(), 1u);
    EXPECT_EQ(o.counters->route_remove_calls.load() - calls,
              action == FaultAction::kFail ? Evictor::kEvictRemoveAttempts : 1);
  }
  EXPECT_EQ(o.counters->route_remove_unconfirmed.load(), 2);
  EXPECT_EQ(mc().removed_routes.load(), 0);
  EXPECT_EQ(o.evictor->EvictSome(UINT64_MAX), static_cast<uint64_t>(kValueLen));
  EXPECT_EQ(o.State("kept"), "absent");
  EXPECT_FALSE(RouteOf(master(), "kept").has_value());
}

// T1: a removal the master applied but whose answer was lost is retried; the master then says
// the location is not there (a definite answer), and the slot is freed.
TEST_F(EvictorTest, LostRemovalAnswerIsRetriedToADefiniteEnd) {
  OwnerParts& o = Make();
  ASSERT_TRUE(PutAndPublish(o, {"lost"}).ok());
  Fault("master.RemoveRoutes", FaultAction::kDrop, 1);
  EXPECT_EQ(o.evictor->EvictSome(UINT64_MAX), static_cast<uint64_t>(kValueLen));
  EXPECT_EQ(o.counters->route_remove_calls.load(), 2);
  EXPECT_EQ(mc().removed_routes.load(), 1);
  EXPECT_EQ(o.State("lost"), "absent");
  EXPECT_EQ(o.SlotsIn(SlotState::kCommitted), 0);
}

// S2/S3: a location a peer's remote get is reading (pinned at the master by BatchGetStart) is
// not removed and the value is kept; once the get ended, the source may evict it.
TEST_F(EvictorTest, LocationPinnedByARemoteGetIsKept) {
  PartsOptions po;
  po.fake_data_address = "127.0.0.1:1";  // a source the master may name
  OwnerParts& o = Make(po);
  ASSERT_TRUE(PutAndPublish(o, {"read-by-peer"}).ok());
  auto route = RouteOf(master(), "read-by-peer");
  ASSERT_TRUE(route.has_value());
  ASSERT_TRUE(RegisterPeer(master(), 2, 22).ok());
  v1::BatchGetStartRequest start;
  start.set_requester_node_id(2);
  start.set_requester_generation(22);
  start.set_request_id(1);
  v1::GetStartItem* item = start.add_items();
  item->set_key("read-by-peer");
  item->set_put_id(route->put_id());
  item->set_version(route->version());
  item->set_target_offset(1 << 20);
  item->set_len(kValueLen);
  auto started = master().BatchGetStart(start);
  ASSERT_TRUE(started.ok());
  ASSERT_EQ(started->results(0).outcome(), v1::GET_STARTED);

  EXPECT_EQ(o.evictor->EvictSome(UINT64_MAX), 0u);
  EXPECT_EQ(o.State("read-by-peer"), "committed");
  EXPECT_TRUE(RouteOf(master(), "read-by-peer").has_value());
  EXPECT_EQ(o.counters->eviction_skipped_source_pinned.load(), 1);
  EXPECT_EQ(o.hot->size(), 1u);

  v1::BatchGetRevokeRequest revoke;
  revoke.set_requester_node_id(2);
  revoke.set_requester_generation(22);
  revoke.add_get_ids(started->results(0).get_id());
  ASSERT_TRUE(master().BatchGetRevoke(revoke).ok());
  EXPECT_EQ(o.evictor->EvictSome(UINT64_MAX), static_cast<uint64_t>(kValueLen));
  EXPECT_EQ(o.State("read-by-peer"), "absent");
}

// S2: delete-by-prefix removes committed, unpinned values under the prefix, route first; pinned
// and not yet committed ones are kept and counted; other prefixes are untouched.
TEST_F(EvictorTest, DeletePrefixRemovesCommittedUnpinnedValuesOnly) {
  OwnerParts& o = Make();
  ASSERT_TRUE(PutAndPublish(o, {"p/a", "p/b"}).ok());
  ASSERT_TRUE(PutAndPublish(o, {"p/c", "q/x"}).ok());
  auto pin = o.gets->Start(1, {"p/c"}, {}, false);
  ASSERT_TRUE(pin.ok() && pin->handle_id != 0);
  Fault("master.PublishBatch", FaultAction::kDelay, 1, milliseconds(10'000));
  auto local = StartTagged(o, 1, {"p/d"});
  ASSERT_TRUE(local.ok());
  ASSERT_TRUE(o.puts->Commit(1, local->put_id, nullptr, false).ok());

  EXPECT_EQ(o.evictor->DeletePrefix("").status().code(), absl::StatusCode::kInvalidArgument);
  auto out = o.evictor->DeletePrefix("p/");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->deleted, 2u);
  EXPECT_EQ(out->skipped_in_use, 2u);  // p/c pinned, p/d not committed
  EXPECT_EQ(out->unconfirmed, 0u);
  EXPECT_EQ(o.State("p/a"), "absent");
  EXPECT_EQ(o.State("p/b"), "absent");
  EXPECT_FALSE(RouteOf(master(), "p/a").has_value());
  EXPECT_EQ(o.State("p/c"), "committed");
  EXPECT_TRUE(RouteOf(master(), "p/c").has_value());
  EXPECT_EQ(o.State("p/d"), "local_visible");
  EXPECT_EQ(o.State("q/x"), "committed");
  EXPECT_EQ(o.hot->size(), 2u);  // p/a's and p/b's cohorts are forgotten
  EXPECT_EQ(o.counters->deleted_pages.load(), 2);
  ASSERT_TRUE(o.gets->Cancel(1, pin->handle_id).ok());
  faults_.Clear("master.PublishBatch");
}

// S2: a delete whose route removals the master refuses keeps every value, readable and routed,
// and reports them unconfirmed; deleting again once the master answers removes them.
TEST_F(EvictorTest, DeletePrefixWithRefusedRemovalKeepsTheValues) {
  OwnerParts& o = Make();
  ASSERT_TRUE(PutAndPublish(o, {"d/a", "d/b"}).ok());
  Fault("master.RemoveRoutes", FaultAction::kRefuse, -1);
  auto kept = o.evictor->DeletePrefix("d/");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->deleted, 0u);
  EXPECT_EQ(kept->unconfirmed, 2u);
  EXPECT_EQ(kept->skipped_in_use, 2u);
  EXPECT_EQ(o.State("d/a"), "committed");
  EXPECT_TRUE(RouteOf(master(), "d/b").has_value());
  faults_.Clear("master.RemoveRoutes");
  auto deleted = o.evictor->DeletePrefix("d/");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(deleted->deleted, 2u);
  EXPECT_EQ(o.State("d/a"), "absent");
  EXPECT_EQ(master().route_count(), 0u);
}

// S5 (and E1): used memory over hot_capacity_ratio of the capacity is evicted in one round, from
// the chain's tail; the configured capacity (grant positions, grants) does not change.
TEST_F(EvictorTest, S5WatermarkRoundEvictsTheOverageFromTheTail) {
  PartsOptions po;
  // 1 GiB of capacity: the watermark lies between 3 and 4 values of 64 KiB.
  po.hot_capacity_ratio = 0.0002;
  OwnerParts& o = Make(po);
  const std::vector<std::string> keys = Keys("w", 6);
  ASSERT_TRUE(PutAndPublish(o, keys).ok());  // one chain w0 .. w5
  const SlotPoolStats before = o.pool().Stats();
  o.evictor->RunRound();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(o.State(keys[i]), "committed") << keys[i];
  for (int i = 3; i < 6; ++i) EXPECT_EQ(o.State(keys[i]), "absent") << keys[i];
  const SlotPoolStats after = o.pool().Stats();
  EXPECT_EQ(after.grant_capacity, before.grant_capacity);
  EXPECT_EQ(after.grants, before.grants);
  EXPECT_EQ(o.counters->evicted_pages.load(), 3);
  o.evictor->RunRound();  // under the watermark now: nothing more goes
  EXPECT_EQ(o.State("w2"), "committed");
}

// Recoverable first (design §7): a cohort copied on another node goes before colder cohorts
// without a copy, and its route keeps the other location (nothing leaves the cluster). A stale
// hint (the other copy went meanwhile) is refused by the master: the value stays.
TEST_F(EvictorTest, CopiedCohortsGoFirstAndNeverTheLastCopy) {
  PartsOptions source, reader;
  source.node_id = 2;
  source.data_plane = true;
  reader.node_id = 1;
  reader.data_plane = true;
  OwnerParts& a = Make(reader);
  OwnerParts& b = Make(source);
  ASSERT_TRUE(PutAndPublish(b, {"cold"}).ok());  // put first: the policy's victim
  ASSERT_TRUE(PutAndPublish(b, {"copied"}).ok());
  ASSERT_TRUE(PutAndPublish(a, {"own"}).ok());
  // Node 1 reads "copied" from node 2: its copy is admitted as copied elsewhere.
  const auto route = RouteOf(master(), "copied");
  ASSERT_TRUE(route.has_value());
  std::vector<uint64_t> cohorts;
  auto fetched = a.remote->Fetch(
      {RemoteLeader{"copied", route->put_id(), route->len(), route->version()}}, &cohorts);
  ASSERT_EQ(fetched.size(), 1u);
  ASSERT_TRUE(fetched[0]);
  fetched.clear();
  EXPECT_EQ(a.hot->copied_cohorts(), 1u);
  // The source learns its value is copied (a replica completed).
  EXPECT_TRUE(b.evictor->NoteCopiedElsewhere({"copied"}, route->put_id()));
  EXPECT_FALSE(b.evictor->NoteCopiedElsewhere({"copied"}, route->put_id() + 1));  // not held
  EXPECT_EQ(b.counters->cohorts_marked_copied.load(), 1);

  EXPECT_EQ(b.evictor->EvictSome(1), static_cast<uint64_t>(kValueLen));
  EXPECT_EQ(b.State("copied"), "absent");
  EXPECT_EQ(b.State("cold"), "committed");  // colder, but its only copy
  auto after = RouteOf(master(), "copied");
  ASSERT_TRUE(after.has_value());
  ASSERT_EQ(after->locations_size(), 1);
  EXPECT_EQ(after->locations(0).node_id(), 1u);  // the copy serves it now
  EXPECT_EQ(b.counters->evicted_copied_pages.load(), 1);

  // Node 1's mark is stale now (the source let its copy go): the master refuses, the value
  // stays routed, and the round takes a policy victim instead.
  EXPECT_EQ(a.evictor->EvictSome(1), static_cast<uint64_t>(kValueLen));
  EXPECT_EQ(a.counters->eviction_kept_sole.load(), 1);
  EXPECT_EQ(a.counters->evicted_copied_pages.load(), 0);
  EXPECT_EQ(a.hot->copied_cohorts(), 0u);  // readmitted unmarked
  EXPECT_EQ(mc().remove_refused_sole.load(), 1);
  EXPECT_EQ(a.counters->evicted_pages.load(), 1);
  // Whichever the policy took, every value is still somewhere: "cold" at node 2, and "copied"
  // and "own" each either at node 1 or (the one evicted) nowhere but routed nowhere either.
  EXPECT_TRUE(RouteOf(master(), "cold").has_value());
  for (const std::string k : {"copied", "own"}) {
    EXPECT_EQ(RouteOf(master(), k).has_value(), a.State(k) == "committed") << k;
  }
}

// One ranking, the remote_cache's side (DropCopies): only values the caller put (the origin in
// the put_id), only the exact identity named; a named member of a cohort goes route first (S2)
// while the cohort's other members stay, still routed.
TEST_F(EvictorTest, DropCopiesDropsOnlyTheCallersValuesByExactIdentity) {
  OwnerParts& o = Make();                                 // node 1 puts here
  ASSERT_TRUE(PutAndPublish(o, {"d0", "d1"}, {2}).ok());  // one cohort of two
  const uint64_t put_id = o.keys->IdentityOf("d0")->put_id;
  ASSERT_EQ(PutIdOrigin(put_id), 1u);
  const auto drop = [&](uint32_t requester, uint64_t id) {
    v1::DropCopiesRequest req;
    req.set_requester_node_id(requester);
    v1::DropItem* item = req.add_items();
    item->set_key("d0");
    item->set_put_id(id);
    return o.evictor->DropCopies(req);
  };
  v1::DropCopiesReply r = drop(2, put_id);  // another node's drop of node 1's value
  EXPECT_EQ(r.refused(), 1u);
  EXPECT_EQ(r.dropped(), 0u);
  r = drop(1, put_id + 1);  // another identity of the key
  EXPECT_EQ(r.not_held(), 1u);
  EXPECT_EQ(o.State("d0"), "committed");
  EXPECT_TRUE(RouteOf(master(), "d0").has_value());

  r = drop(1, put_id);
  EXPECT_EQ(r.dropped(), 1u);
  EXPECT_EQ(r.kept() + r.not_held() + r.refused(), 0u);
  EXPECT_EQ(o.State("d0"), "absent");
  EXPECT_FALSE(RouteOf(master(), "d0").has_value());
  EXPECT_EQ(o.State("d1"), "committed");  // not named: stays, as a cohort of its own
  EXPECT_TRUE(RouteOf(master(), "d1").has_value());
  EXPECT_EQ(o.hot->size(), 1u);
  EXPECT_EQ(o.counters->dropped_on_request_pages.load(), 1);
  EXPECT_EQ(drop(1, put_id).not_held(), 1u);  // idempotent
}

}  // namespace
}  // namespace fluxon::testing
