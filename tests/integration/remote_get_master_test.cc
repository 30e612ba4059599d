// The master's side of remote get (design §6): BatchGetStart / BatchGetDone / BatchGetRevoke,
// the (key, requester_owner) dedup (G7), one call per batch (G8), idempotent retries (T1),
// same-put_id convergence (T2), source pins against route removal, the in-flight TTL, and owner
// expiry after lease + grace.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "common/put_id.h"
#include "master/master_core.h"

namespace fluxon {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kLen = 4096;

void Register(MasterCore& m, uint32_t node, uint64_t gen, bool data_plane = true) {
  v1::RegisterOwnerRequest r;
  r.set_node_id(node);
  r.set_generation(gen);
  if (data_plane) {
    r.set_address("127.0.0.1:" + std::to_string(40000 + node));
    r.add_transports("tcp");
  }
  ASSERT_TRUE(m.RegisterOwner(r).ok());
}

// `copy`: the items are copies of put_id's value (a republish of remote-get targets).
void Publish(MasterCore& m, uint32_t node, uint64_t gen, uint64_t put_id,
             const std::vector<std::string>& keys, bool copy = false) {
  v1::PublishBatchRequest r;
  r.set_node_id(node);
  r.set_generation(gen);
  r.set_put_id(put_id);
  r.set_republish(copy);
  uint64_t off = 0;
  for (const auto& k : keys) {
    v1::RouteItem* i = r.add_items();
    i->set_key(k);
    i->set_put_id(put_id);
    i->set_offset(off += kLen);
    i->set_len(kLen);
    i->set_copy(copy);
  }
  auto reply = m.PublishBatch(r);
  ASSERT_TRUE(reply.ok()) << reply.status();
}

v1::BatchGetStartRequest Start(uint32_t node, uint64_t gen, uint64_t request_id,
                               const std::vector<std::string>& keys, uint64_t put_id) {
  v1::BatchGetStartRequest r;
  r.set_requester_node_id(node);
  r.set_requester_generation(gen);
  r.set_request_id(request_id);
  uint64_t off = 1 << 20;
  for (const auto& k : keys) {
    v1::GetStartItem* i = r.add_items();
    i->set_key(k);
    i->set_put_id(put_id);
    i->set_target_offset(off += kLen);
    i->set_len(kLen);
  }
  return r;
}

v1::BatchGetDoneRequest Done(const v1::BatchGetStartRequest& start,
                             const v1::BatchGetStartReply& reply) {
  v1::BatchGetDoneRequest r;
  r.set_requester_node_id(start.requester_node_id());
  r.set_requester_generation(start.requester_generation());
  for (int i = 0; i < start.items_size(); ++i) {
    v1::GetDoneItem* d = r.add_items();
    d->set_get_id(reply.results(i).get_id());
    d->set_key(start.items(i).key());
    d->set_put_id(start.items(i).put_id());
    d->set_target_offset(start.items(i).target_offset());
    d->set_len(start.items(i).len());
  }
  return r;
}

v1::RemoveRoutesRequest Remove(uint32_t node, uint64_t gen, const std::string& key,
                               uint64_t put_id) {
  v1::RemoveRoutesRequest r;
  r.set_node_id(node);
  r.set_generation(gen);
  v1::RouteItem* i = r.add_items();
  i->set_key(key);
  i->set_put_id(put_id);
  return r;
}

size_t Locations(MasterCore& m, const std::string& key) {
  v1::LookupRequest r;
  r.add_keys(key);
  auto reply = m.Lookup(r);
  if (!reply.ok() || !reply->found(0)) return 0;
  return static_cast<size_t>(reply->routes(0).locations_size());
}

// Registers owners 1 .. `owners` (owner n under generation 11 * n) and publishes `keys` on owner
// 1 as put_id 7.
void PublishOnOwnerOne(MasterCore& m, const std::vector<std::string>& keys, uint32_t owners = 2) {
  for (uint32_t n = 1; n <= owners; ++n) Register(m, n, 11 * n);
  Publish(m, 1, 11, 7, keys);
}

// A get that owner 2 (generation 22) started of what owner 1 (generation 11) published under
// put_id 7: the request, and the master's answer.
struct StartedGet {
  v1::BatchGetStartRequest request;
  absl::StatusOr<v1::BatchGetStartReply> reply;
};

// Registers owners 1 and 2, publishes `keys` on owner 1 as put_id 7, and sends owner 2's
// BatchGetStart of them with `request_id`.
StartedGet StartGetFromOwnerOne(MasterCore& m, uint64_t request_id,
                                const std::vector<std::string>& keys) {
  PublishOnOwnerOne(m, keys);
  v1::BatchGetStartRequest request = Start(2, 22, request_id, keys, 7);
  auto reply = m.BatchGetStart(request);
  return {std::move(request), std::move(reply)};
}

v1::BatchGetRevokeRequest Revoke(uint32_t node, uint64_t gen, const std::vector<uint64_t>& ids) {
  v1::BatchGetRevokeRequest r;
  r.set_requester_node_id(node);
  r.set_requester_generation(gen);
  for (uint64_t id : ids) r.add_get_ids(id);
  return r;
}

TEST(RemoteGetMaster, StartPinsTheSourceUntilDoneWhichAddsTheCopy) {
  MasterCore m;
  const auto [start, s] = StartGetFromOwnerOne(m, 100, {"k"});
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->results_size(), 1);
  EXPECT_EQ(s->results(0).outcome(), v1::GET_STARTED);
  EXPECT_NE(s->results(0).get_id(), 0u);
  EXPECT_EQ(s->results(0).source().node_id(), 1u);
  EXPECT_EQ(s->results(0).source_address(), "127.0.0.1:40001");
  EXPECT_EQ(m.inflight_gets(), 1u);

  // The source's eviction cannot remove a location a peer is reading.
  auto removed = m.RemoveRoutes(Remove(1, 11, "k", 7));
  ASSERT_TRUE(removed.ok());
  EXPECT_FALSE(removed->removed(0));
  EXPECT_TRUE(removed->pinned(0));
  EXPECT_EQ(Locations(m, "k"), 1u);

  auto d = m.BatchGetDone(Done(start, *s));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcomes(0), v1::GET_DONE);
  EXPECT_EQ(Locations(m, "k"), 2u);  // the requester's copy joined the same put_id
  EXPECT_EQ(m.inflight_gets(), 0u);

  // Unpinned now: the source's location goes, the copy becomes primary.
  removed = m.RemoveRoutes(Remove(1, 11, "k", 7));
  ASSERT_TRUE(removed.ok());
  EXPECT_TRUE(removed->removed(0));
  v1::LookupRequest lr;
  lr.add_keys("k");
  auto route = m.Lookup(lr);
  ASSERT_TRUE(route.ok() && route->found(0));
  EXPECT_EQ(route->routes(0).node_id(), 2u);
}

// A requester that asks for the sources apart gets each source node's address and transports
// once, in source_peers, and items without them; one that does not (an earlier requester) gets
// them in every item.
TEST(RemoteGetMaster, SourcePeersApartListEachSourceOnce) {
  MasterCore m;
  PublishOnOwnerOne(m, {"a", "b", "c"});
  v1::BatchGetStartRequest request = Start(2, 22, 300, {"a", "b", "c"}, 7);
  request.set_source_peers_apart(true);
  auto s = m.BatchGetStart(request);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->results_size(), 3);
  for (const v1::GetStartResult& r : s->results()) {
    EXPECT_EQ(r.outcome(), v1::GET_STARTED);
    EXPECT_TRUE(r.source_address().empty());
    EXPECT_EQ(r.source_transports_size(), 0);
  }
  ASSERT_EQ(s->source_peers_size(), 1);
  EXPECT_EQ(s->source_peers(0).node_id(), 1u);
  EXPECT_EQ(s->source_peers(0).address(), "127.0.0.1:40001");
  // The same request again (T1) is answered the same way.
  auto again = m.BatchGetStart(request);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->source_peers_size(), 1);
  EXPECT_EQ(again->results(0).get_id(), s->results(0).get_id());
}

TEST(RemoteGetMaster, RemoveOnlyIfCopiedNeverRemovesTheLastLiveLocation) {
  MasterOptions options;
  options.owner_lease = milliseconds(200);
  MasterCore m(options);
  const auto [start, s] = StartGetFromOwnerOne(m, 100, {"k", "solo"});
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(m.BatchGetDone(Done(start, *s)).ok());  // owner 2 holds copies of both
  ASSERT_EQ(Locations(m, "k"), 2u);
  ASSERT_TRUE(m.RemoveRoutes(Remove(2, 22, "solo", 7))->removed(0));  // owner 1's is alone now

  auto only_if_copied = [](uint32_t node, uint64_t gen, const std::string& key) {
    v1::RemoveRoutesRequest r = Remove(node, gen, key, 7);
    r.set_only_if_copied(true);
    return r;
  };
  auto solo = m.RemoveRoutes(only_if_copied(1, 11, "solo"));
  ASSERT_TRUE(solo.ok());
  EXPECT_FALSE(solo->removed(0));
  EXPECT_TRUE(solo->sole(0));
  EXPECT_EQ(Locations(m, "solo"), 1u);
  // Both owners evicting the copied value this way: the first goes, the second is the last.
  auto first = m.RemoveRoutes(only_if_copied(1, 11, "k"));
  EXPECT_TRUE(first->removed(0));
  EXPECT_FALSE(first->sole(0));
  auto second = m.RemoveRoutes(only_if_copied(2, 22, "k"));
  EXPECT_FALSE(second->removed(0));
  EXPECT_TRUE(second->sole(0));
  EXPECT_EQ(Locations(m, "k"), 1u);
  EXPECT_EQ(m.counters().remove_refused_sole.load(), 2);
  // A retried removal whose first answer was lost finds nothing to remove: gone, not sole.
  auto retried = m.RemoveRoutes(only_if_copied(1, 11, "k"));
  EXPECT_FALSE(retried->removed(0));
  EXPECT_FALSE(retried->sole(0));

  // A copy on an owner whose lease ran out serves nobody: it does not count.
  Publish(m, 1, 11, 7, {"k"}, /*copy=*/true);  // owner 1 holds a copy again, next to owner 2
  ASSERT_EQ(Locations(m, "k"), 2u);
  std::this_thread::sleep_for(milliseconds(250));
  Register(m, 1, 11);  // owner 1's heartbeat; owner 2 stays silent
  auto dead_copy = m.RemoveRoutes(only_if_copied(1, 11, "k"));
  EXPECT_FALSE(dead_copy->removed(0));
  EXPECT_TRUE(dead_copy->sole(0));
  // Without only_if_copied removal is unconditional, as before.
  EXPECT_TRUE(m.RemoveRoutes(Remove(1, 11, "k", 7))->removed(0));
}

TEST(RemoteGetMaster, DedupIsPerKeyAndRequesterOwner) {  // G7
  MasterCore m;
  PublishOnOwnerOne(m, {"k"}, /*owners=*/3);
  auto a = m.BatchGetStart(Start(2, 22, 1, {"k"}, 7));
  auto again = m.BatchGetStart(Start(2, 22, 2, {"k"}, 7));
  auto other = m.BatchGetStart(Start(3, 33, 1, {"k"}, 7));
  ASSERT_TRUE(a.ok() && again.ok() && other.ok());
  EXPECT_EQ(a->results(0).outcome(), v1::GET_STARTED);
  EXPECT_EQ(again->results(0).outcome(), v1::GET_BUSY);     // one target per (key, requester)
  EXPECT_EQ(other->results(0).outcome(), v1::GET_STARTED);  // two owners may fetch at once
  EXPECT_EQ(m.inflight_gets(), 2u);
}

TEST(RemoteGetMaster, OneCallPerBatchWhateverTheKeyCount) {  // G8
  MasterCore m;
  std::vector<std::string> keys;
  for (int i = 0; i < 128; ++i) keys.push_back("page-" + std::to_string(i));
  const auto [start, s] = StartGetFromOwnerOne(m, 5, keys);
  ASSERT_TRUE(s.ok());
  auto d = m.BatchGetDone(Done(start, *s));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(m.counters().get_start_calls.load(), 1);
  EXPECT_EQ(m.counters().get_start_items.load(), 128);
  EXPECT_EQ(m.counters().get_done_calls.load(), 1);
  EXPECT_EQ(m.counters().gets_done.load(), 128);
}

TEST(RemoteGetMaster, RetriedStartWithTheSameRequestIdGetsTheSameAnswer) {  // T1
  MasterCore m;
  const auto [start, first] = StartGetFromOwnerOne(m, 42, {"a", "b"});
  auto retry = m.BatchGetStart(start);
  ASSERT_TRUE(first.ok() && retry.ok());
  EXPECT_EQ(first->SerializeAsString(), retry->SerializeAsString());
  EXPECT_EQ(retry->results(0).outcome(), v1::GET_STARTED);  // not BUSY: it is the same request
  EXPECT_EQ(m.counters().gets_started.load(), 2);
  EXPECT_EQ(m.counters().get_start_replayed.load(), 1);
  EXPECT_EQ(m.inflight_gets(), 2u);
}

TEST(RemoteGetMaster, DoneAndRevokeRetriesAreIdempotent) {  // T1
  MasterCore m;
  const auto [start, s] = StartGetFromOwnerOne(m, 1, {"a", "b"});
  ASSERT_TRUE(s.ok());
  const auto done = Done(start, *s);
  auto d1 = m.BatchGetDone(done);
  auto d2 = m.BatchGetDone(done);  // the first answer was lost: the retry sees its own copy
  ASSERT_TRUE(d1.ok() && d2.ok());
  EXPECT_EQ(d1->outcomes(0), v1::GET_DONE);
  EXPECT_EQ(d2->outcomes(0), v1::GET_DONE);
  EXPECT_EQ(Locations(m, "a"), 2u);  // one copy, not two

  // Revoke of a finished or unknown get: acknowledged, nothing changes.
  const auto rv = Revoke(2, 22, {s->results(0).get_id(), 987654});
  auto r1 = m.BatchGetRevoke(rv);
  auto r2 = m.BatchGetRevoke(rv);
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_TRUE(r1->revoked(0) && r1->revoked(1) && r2->revoked(0));
  EXPECT_EQ(Locations(m, "a"), 2u);
  EXPECT_EQ(m.inflight_gets(), 0u);
}

TEST(RemoteGetMaster, RevokedGetReleasesItsPinAndItsDoneIsUnknown) {
  MasterCore m;
  const auto [start, s] = StartGetFromOwnerOne(m, 1, {"k"});
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(m.BatchGetRevoke(Revoke(2, 22, {s->results(0).get_id()})).ok());
  EXPECT_EQ(m.inflight_gets(), 0u);
  auto d = m.BatchGetDone(Done(start, *s));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->outcomes(0), v1::GET_DONE_UNKNOWN);  // the target must be freed, not published
  EXPECT_EQ(Locations(m, "k"), 1u);
  auto removed = m.RemoveRoutes(Remove(1, 11, "k", 7));
  ASSERT_TRUE(removed.ok());
  EXPECT_TRUE(removed->removed(0));
}

TEST(RemoteGetMaster, DoneNamingAnotherTargetOrLengthPublishesNothing) {
  MasterCore m;
  const auto [start, s] = StartGetFromOwnerOne(m, 1, {"k"});
  ASSERT_TRUE(s.ok());
  auto wrong_len = Done(start, *s);
  wrong_len.mutable_items(0)->set_len(kLen * 2);
  auto wrong_target = Done(start, *s);
  wrong_target.mutable_items(0)->set_target_offset(start.items(0).target_offset() + kLen);
  for (const auto& bad : {wrong_len, wrong_target}) {
    auto d = m.BatchGetDone(bad);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->outcomes(0), v1::GET_DONE_UNKNOWN);
  }
  EXPECT_EQ(Locations(m, "k"), 1u);
  EXPECT_EQ(m.inflight_gets(), 1u);  // the real get is left alone
  auto d = m.BatchGetDone(Done(start, *s));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->outcomes(0), v1::GET_DONE);
}

TEST(RemoteGetMaster, InflightTtlEndsGetsOfASilentRequester) {
  MasterOptions o;
  o.inflight_get_ttl = milliseconds(200);
  MasterCore m(o);
  const auto [start, s] = StartGetFromOwnerOne(m, 1, {"k"});
  ASSERT_TRUE(s.ok());
  m.ExpireDue(Clock::now() + milliseconds(100));
  EXPECT_EQ(m.inflight_gets(), 1u);
  m.ExpireDue(Clock::now() + milliseconds(250));
  EXPECT_EQ(m.inflight_gets(), 0u);
  EXPECT_EQ(m.counters().gets_expired.load(), 1);
  auto removed = m.RemoveRoutes(Remove(1, 11, "k", 7));  // the pin went with the TTL
  ASSERT_TRUE(removed.ok());
  EXPECT_TRUE(removed->removed(0));
  auto d = m.BatchGetDone(Done(start, *s));  // a Done after the TTL publishes nothing
  ASSERT_TRUE(d.ok());
  EXPECT_NE(d->outcomes(0), v1::GET_DONE);
}

TEST(RemoteGetMaster, SamePutIdConvergesOnlyAnotherPutIdIsStale) {  // T2
  MasterCore m;
  PublishOnOwnerOne(m, {"k"}, /*owners=*/3);
  // Another version asked for: stale.
  auto stale = m.BatchGetStart(Start(2, 22, 1, {"k"}, 8));
  ASSERT_TRUE(stale.ok());
  EXPECT_EQ(stale->results(0).outcome(), v1::GET_STALE_VERSION);
  // Two requesters' Dones of the same put_id both join the route.
  const auto s2 = Start(2, 22, 2, {"k"}, 7);
  const auto s3 = Start(3, 33, 2, {"k"}, 7);
  auto a = m.BatchGetStart(s2);
  auto b = m.BatchGetStart(s3);
  ASSERT_TRUE(a.ok() && b.ok());
  auto da = m.BatchGetDone(Done(s2, *a));
  auto db = m.BatchGetDone(Done(s3, *b));
  ASSERT_TRUE(da.ok() && db.ok());
  EXPECT_EQ(da->outcomes(0), v1::GET_DONE);
  EXPECT_EQ(db->outcomes(0), v1::GET_DONE);
  EXPECT_EQ(Locations(m, "k"), 3u);
  // The requester holds the version already: a new start says so (it pins the local copy).
  auto local = m.BatchGetStart(Start(2, 22, 3, {"k"}, 7));
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local->results(0).outcome(), v1::GET_ALREADY_LOCAL);
}

TEST(RemoteGetMaster, DoneAgainstALiveLocationOfTheSameVersionConverges) {  // T2
  MasterCore m;
  PublishOnOwnerOne(m, {"k"}, /*owners=*/3);
  const auto first = Start(2, 22, 1, {"k"}, 7);
  auto s1 = m.BatchGetStart(first);
  ASSERT_TRUE(s1.ok());
  ASSERT_TRUE(m.BatchGetDone(Done(first, *s1)).ok());
  // A second start from node 3 reads from node 1 or 2; node 2's own second Done of another
  // target of the same version is told the canonical copy exists.
  auto second = Start(2, 22, 2, {"k"}, 7);
  second.mutable_items(0)->set_target_offset(second.items(0).target_offset() + 10 * kLen);
  v1::BatchGetStartReply fake;
  fake.add_results()->set_get_id(424242);
  auto d = m.BatchGetDone(Done(second, fake));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->outcomes(0), v1::GET_DONE_PRESENT);
  EXPECT_EQ(Locations(m, "k"), 2u);  // one route, one copy per requester
}

TEST(RemoteGetMaster, ClearErrorsAndNoSourceWithoutALiveDataPlane) {
  MasterOptions o;
  o.owner_lease = milliseconds(100);
  MasterCore m(o);
  Register(m, 1, 11, /*data_plane=*/false);
  Register(m, 2, 22);
  Publish(m, 1, 11, 7, {"k"});
  // A stale requester generation.
  auto stale_gen = m.BatchGetStart(Start(2, 21, 1, {"k"}, 7));
  EXPECT_EQ(stale_gen.status().code(), absl::StatusCode::kFailedPrecondition);
  // No request identity.
  EXPECT_EQ(m.BatchGetStart(Start(2, 22, 0, {"k"}, 7)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The only location's owner serves no data plane.
  auto none = m.BatchGetStart(Start(2, 22, 1, {"k", "absent"}, 7));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->results(0).outcome(), v1::GET_NO_SOURCE);
  EXPECT_EQ(none->results(1).outcome(), v1::GET_NO_ROUTE);
  // A route to an owner that stopped heartbeating (not live) is not handed out.
  Register(m, 3, 33);
  Publish(m, 3, 33, 9, {"j"});
  std::this_thread::sleep_for(milliseconds(150));
  Register(m, 2, 22);  // the requester heartbeats; node 3 does not
  auto dead = m.BatchGetStart(Start(2, 22, 2, {"j"}, 9));
  ASSERT_TRUE(dead.ok());
  EXPECT_EQ(dead->results(0).outcome(), v1::GET_NO_SOURCE);
  EXPECT_EQ(m.inflight_gets(), 0u);
}

TEST(RemoteGetMaster, ExpiredOwnerLosesItsRoutesGetsAndGeneration) {
  MasterOptions o;
  o.owner_lease = milliseconds(100);
  o.owner_grace = milliseconds(100);
  MasterCore m(o);
  PublishOnOwnerOne(m, {"k"});
  Publish(m, 2, 22, 3, {"other"});
  ASSERT_TRUE(m.BatchGetStart(Start(2, 22, 1, {"k"}, 7)).ok());
  ASSERT_EQ(m.inflight_gets(), 1u);
  m.ExpireDue(Clock::now() + milliseconds(150));  // past the lease, inside the grace
  EXPECT_EQ(m.route_count(), 2u);
  m.ExpireDue(Clock::now() + milliseconds(250));  // past lease + grace: both expire
  EXPECT_EQ(m.route_count(), 0u);
  EXPECT_EQ(m.inflight_gets(), 0u);  // the requester's gets went with it
  EXPECT_EQ(m.counters().owners_expired.load(), 2);
  // The old generation is refused from now on; a restarted owner (new generation) is welcome.
  v1::RegisterOwnerRequest old;
  old.set_node_id(1);
  old.set_generation(11);
  auto refused = m.RegisterOwner(old);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), testing::HasSubstr("expired"));
  old.set_generation(12);
  EXPECT_TRUE(m.RegisterOwner(old).ok());
}

// Cluster hardening, item 3: the gets reading from an owner end with its expiry, so a requester
// whose read was slowed past its source's lease never publishes what it read.
TEST(RemoteGetMaster, ExpiryOfASourceEndsTheGetsReadingFromIt) {
  MasterOptions o;
  o.owner_lease = milliseconds(100);
  o.owner_grace = milliseconds(100);
  MasterCore m(o);
  const auto [start, s] = StartGetFromOwnerOne(m, 5, {"k"});
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->results(0).outcome(), v1::GET_STARTED);
  for (int i = 0; i < 6; ++i) {  // the requester stays heard, the source does not
    std::this_thread::sleep_for(milliseconds(50));
    Register(m, 2, 22);
  }
  m.ExpireDue(Clock::now());
  EXPECT_EQ(m.counters().owners_expired.load(), 1);
  EXPECT_EQ(m.inflight_gets(), 0u);
  auto d = m.BatchGetDone(Done(start, *s));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->outcomes(0), v1::GET_DONE_UNKNOWN);
  EXPECT_EQ(Locations(m, "k"), 0u);
}

// The same when the source re-registers under a new generation (its memory was reset).
TEST(RemoteGetMaster, SourceReregisteringEndsTheGetsReadingFromIt) {
  MasterCore m;
  const auto [start, s] = StartGetFromOwnerOne(m, 5, {"k"});
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(m.UnregisterOwner([] {
               v1::UnregisterOwnerRequest r;
               r.set_node_id(1);
               r.set_generation(11);
               return r;
             }())
                .ok(),
            true);
  EXPECT_EQ(m.inflight_gets(), 0u);
  auto d = m.BatchGetDone(Done(start, *s));
  ASSERT_TRUE(d.ok());
  EXPECT_NE(d->outcomes(0), v1::GET_DONE);
}

// Item 11: a BatchGetStart answer is kept for retries (T1) only while a get it started is in
// flight; an answer that started nothing is not kept at all.
TEST(RemoteGetMaster, StoredAnswersGoWithTheirLastGet) {
  MasterCore m;
  const auto [start, s] = StartGetFromOwnerOne(m, 9, {"a", "b"});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(m.stored_get_replies(), 1u);
  auto replay = m.BatchGetStart(start);  // T1: the stored answer
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->results(0).get_id(), s->results(0).get_id());
  ASSERT_TRUE(m.BatchGetDone(Done(start, *s)).ok());
  EXPECT_EQ(m.stored_get_replies(), 0u);
  ASSERT_TRUE(m.BatchGetStart(Start(2, 22, 10, {"missing"}, 7)).ok());
  EXPECT_EQ(m.stored_get_replies(), 0u);
}

// Item 7: every master instance has its own epoch, carried by its answers.
TEST(RemoteGetMaster, EveryAnswerCarriesTheMastersEpoch) {
  MasterCore m1, m2;
  EXPECT_NE(m1.epoch(), 0u);
  EXPECT_NE(m1.epoch(), m2.epoch());
  v1::RegisterOwnerRequest r;
  r.set_node_id(1);
  r.set_generation(11);
  auto reg = m1.RegisterOwner(r);
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ(reg->master_epoch(), m1.epoch());
  v1::LookupRequest lr;
  lr.add_keys("x");
  EXPECT_EQ(m1.Lookup(lr)->master_epoch(), m1.epoch());
}

// A republished copy of the routed version joins the route (same put_id from another owner);
// another put_id is still superseded (T2).
TEST(RemoteGetMaster, RepublishedCopyOfTheRoutedVersionJoinsTheRoute) {
  MasterCore m;
  PublishOnOwnerOne(m, {"k"});
  Publish(m, 2, 22, 7, {"k"}, /*copy=*/true);
  EXPECT_EQ(Locations(m, "k"), 2u);
  v1::PublishBatchRequest other;
  other.set_node_id(2);
  other.set_generation(22);
  v1::RouteItem* i = other.add_items();
  i->set_key("k");
  i->set_put_id(8);
  i->set_offset(4096);
  i->set_len(kLen);
  auto reply = m.PublishBatch(other);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->outcomes(0), v1::SUPERSEDED);
}

// T2 by identity: a get naming the routed put_id with another version is stale, never started
// (equal put_ids of different versions are different values).
TEST(RemoteGetMaster, GetOfTheRoutedPutIdWithAnotherVersionIsStale) {
  MasterCore m;
  PublishOnOwnerOne(m, {"k"});  // routed with version 0
  v1::BatchGetStartRequest start = Start(2, 22, 1, {"k"}, 7);
  start.mutable_items(0)->set_version(5);
  auto reply = m.BatchGetStart(start);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->results(0).outcome(), v1::GET_STALE_VERSION);
  start.mutable_items(0)->set_version(0);
  start.set_request_id(2);
  reply = m.BatchGetStart(start);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->results(0).outcome(), v1::GET_STARTED);
  EXPECT_EQ(reply->results(0).source().version(), 0u);
}

// Versions issue, item 4: a publish naming a routed put_id as the publisher's own value, from an
// owner that did not put it, is refused and counted (equal numbers are not equal bytes); the
// same put_id with another version is another value and never joins. After a master restart the
// higher republished version wins whoever comes first, and the displaced owner is told to
// republish in its next heartbeat answer (once).
TEST(RemoteGetMaster, EqualPutIdsDoNotJoinAndANewerRepublishTakesTheRoute) {
  MasterCore m;
  Register(m, 1, 11);
  Register(m, 2, 22);
  const uint64_t put = (uint64_t{1} << kPutIdSeqBits) | 5;  // put by node 1
  auto publish = [&](uint32_t node, uint64_t gen, uint64_t version, bool republish,
                     uint64_t put_id = 0) {
    if (put_id == 0) put_id = put;
    v1::PublishBatchRequest r;
    r.set_node_id(node);
    r.set_generation(gen);
    r.set_put_id(put_id);
    r.set_republish(republish);
    v1::RouteItem* i = r.add_items();
    i->set_key("k");
    i->set_put_id(put_id);
    i->set_offset(4096);
    i->set_len(kLen);
    i->set_version(version);
    auto reply = m.PublishBatch(r);
    EXPECT_TRUE(reply.ok()) << reply.status();
    EXPECT_GE(reply->hlc(), version);  // the master's clock has seen it
    return reply.ok() ? reply->outcomes(0) : v1::REFUSED;
  };
  EXPECT_EQ(publish(1, 11, 100, false), v1::PUBLISHED);
  EXPECT_EQ(publish(2, 22, 100, false), v1::REFUSED);  // node 2 did not put it
  EXPECT_EQ(m.counters().publish_identity_refused.load(), 1u);
  EXPECT_EQ(publish(2, 22, 90, false), v1::SUPERSEDED);  // same put_id, another version
  EXPECT_EQ(Locations(m, "k"), 1u);
  // A republished higher version replaces the route; node 1 learns it once, at its heartbeat.
  const uint64_t put2 = (uint64_t{2} << kPutIdSeqBits) | 9;     // node 2's own put
  EXPECT_EQ(publish(2, 22, 300, false, put2), v1::SUPERSEDED);  // a fresh put never replaces
  EXPECT_EQ(publish(2, 22, 300, true, put2), v1::PUBLISHED);
  EXPECT_EQ(m.counters().replaced_routes.load(), 1u);
  v1::RegisterOwnerRequest beat;
  beat.set_node_id(1);
  beat.set_generation(11);
  beat.set_address("127.0.0.1:40001");
  beat.add_transports("tcp");
  auto first = m.RegisterOwner(beat);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->republish());
  auto second = m.RegisterOwner(beat);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->republish());
  // Node 1's republish of the older version is superseded: it drops its copy.
  EXPECT_EQ(publish(1, 11, 100, true), v1::SUPERSEDED);
}

// Item 11: a heartbeat (the registered node and generation) naming another data-plane address or
// role is refused; the registered owner keeps its record.
TEST(RemoteGetMaster, HeartbeatWithAnotherAddressIsRefused) {
  MasterCore m;
  Register(m, 1, 11);
  v1::RegisterOwnerRequest r;
  r.set_node_id(1);
  r.set_generation(11);
  r.set_address("127.0.0.1:1");
  r.add_transports("tcp");
  auto reply = m.RegisterOwner(r);
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kPermissionDenied);
  auto owners = m.ListOwners({});
  ASSERT_TRUE(owners.ok());
  ASSERT_EQ(owners->owners_size(), 1);
  EXPECT_EQ(owners->owners(0).address(), "127.0.0.1:40001");
}

// A heartbeat of (node, gen) as RegisterOwner answers it.
v1::RegisterOwnerReply Heartbeat(MasterCore& m, uint32_t node, uint64_t gen) {
  v1::RegisterOwnerRequest r;
  r.set_node_id(node);
  r.set_generation(gen);
  r.set_address("127.0.0.1:" + std::to_string(40000 + node));
  r.add_transports("tcp");
  auto reply = m.RegisterOwner(r);
  EXPECT_TRUE(reply.ok()) << reply.status();
  return reply.ok() ? *reply : v1::RegisterOwnerReply{};
}

// A client's remote get that completed is reported to its source with the source's next
// heartbeat, once, in the batch's order: the source's eviction policy hears of peer reads.
TEST(RemoteGetMaster, ClientReadsReachTheSourceWithItsNextHeartbeatOnce) {
  MasterCore m;
  const auto [start, s] = StartGetFromOwnerOne(m, 100, {"a", "b", "c"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Heartbeat(m, 1, 11).peer_reads_size(), 0);  // started is not read
  auto d = m.BatchGetDone(Done(start, *s));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(Heartbeat(m, 2, 22).peer_reads_size(), 0);  // the reader hears nothing
  v1::RegisterOwnerReply beat = Heartbeat(m, 1, 11);
  ASSERT_EQ(beat.peer_reads_size(), 1);
  EXPECT_THAT(beat.peer_reads(0).keys(), ::testing::ElementsAre("a", "b", "c"));
  EXPECT_THAT(beat.peer_reads(0).put_ids(), ::testing::ElementsAre(7, 7, 7));
  EXPECT_EQ(Heartbeat(m, 1, 11).peer_reads_size(), 0);  // handed over once
  EXPECT_EQ(m.counters().peer_read_keys.load(), 3);

  // A retried Done (the copy is already published) reads nothing new.
  ASSERT_TRUE(m.BatchGetDone(Done(start, *s)).ok());
  EXPECT_EQ(Heartbeat(m, 1, 11).peer_reads_size(), 0);
}

// A replica pull is not a client's read; a revoked get read nothing; a source that comes back
// under a new generation never hears of reads of its old memory.
TEST(RemoteGetMaster, OnlyCompletedClientReadsOfTheLiveGenerationAreReported) {
  MasterCore m;
  PublishOnOwnerOne(m, {"r", "v", "g"});
  v1::BatchGetStartRequest replica = Start(2, 22, 1, {"r"}, 7);
  replica.set_replica(true);
  auto rs = m.BatchGetStart(replica);
  ASSERT_TRUE(rs.ok()) << rs.status();
  ASSERT_TRUE(m.BatchGetDone(Done(replica, *rs)).ok());
  auto vs = m.BatchGetStart(Start(2, 22, 2, {"v"}, 7));
  ASSERT_TRUE(vs.ok());
  ASSERT_TRUE(m.BatchGetRevoke(Revoke(2, 22, {vs->results(0).get_id()})).ok());
  EXPECT_EQ(Heartbeat(m, 1, 11).peer_reads_size(), 0);

  const v1::BatchGetStartRequest get = Start(2, 22, 3, {"g"}, 7);
  auto gs = m.BatchGetStart(get);
  ASSERT_TRUE(gs.ok());
  ASSERT_TRUE(m.BatchGetDone(Done(get, *gs)).ok());
  // Owner 1 stops (unregisters) before its heartbeat and comes back as generation 12.
  v1::UnregisterOwnerRequest bye;
  bye.set_node_id(1);
  bye.set_generation(11);
  ASSERT_TRUE(m.UnregisterOwner(bye).ok());
  Register(m, 1, 12);
  EXPECT_EQ(Heartbeat(m, 1, 12).peer_reads_size(), 0);
  EXPECT_EQ(m.counters().peer_read_keys_dropped.load(), 1);
}

// The log is bounded per owner (the oldest reads go first) and per answer (the rest wait for
// the next heartbeat); every dropped key is counted.
TEST(PeerReadLog, BoundedPerOwnerAndPerAnswer) {
  PeerReadLog log;
  const std::string key(1000, 'k');
  auto read_of = [&](int n, int first, const std::string& base = std::string(1000, 'k')) {
    v1::PeerRead r;
    for (int i = 0; i < n; ++i) {
      r.add_keys(base + std::to_string(first + i));
      r.add_put_ids(1);
    }
    return r;
  };
  // 1,100 keys of ~1 KB: more than one answer's bytes (1 MiB).
  for (int i = 0; i < 11; ++i) EXPECT_EQ(log.Record(1, 5, read_of(100, i * 100)), 0u);
  google::protobuf::RepeatedPtrField<v1::PeerRead> out;
  size_t dropped = 0;
  const size_t first = log.Drain(1, 5, &out, &dropped);
  EXPECT_LT(first, 1100u);
  EXPECT_GT(first, 0u);
  EXPECT_EQ(out[0].keys(0), key + "0");  // oldest first
  out.Clear();
  EXPECT_EQ(log.Drain(1, 5, &out, &dropped), 1100u - first);
  EXPECT_EQ(dropped, 0u);
  EXPECT_EQ(log.waiting_keys(1), 0u);
  EXPECT_EQ(log.waiting_bytes(1), 0u);

  // Long keys: the bytes bound drops the oldest reads first (100 keys of ~1 KB per read).
  size_t long_dropped = 0;
  for (int i = 0; i < 60; ++i) long_dropped += log.Record(3, 5, read_of(100, i * 100));
  EXPECT_GT(long_dropped, 0u);
  EXPECT_LE(log.waiting_bytes(3), PeerReadLog::kMaxBytesPerNode);
  EXPECT_EQ(log.waiting_keys(3) + long_dropped, 6000u);
  out.Clear();
  log.Drain(3, 5, &out, &dropped);
  EXPECT_EQ(out[0].keys(0), key + std::to_string(long_dropped));  // the oldest kept first
  const size_t left = log.waiting_keys(3);
  EXPECT_GT(left, 0u);  // one answer carries at most kMaxBytesPerAnswer
  EXPECT_EQ(log.Forget(3), left);
  EXPECT_EQ(log.waiting_bytes(3), 0u);

  // Past kMaxKeysPerNode the oldest reads are dropped.
  const int per_read = 4096;
  const int reads = static_cast<int>(PeerReadLog::kMaxKeysPerNode / per_read) + 2;
  size_t over = 0;
  for (int i = 0; i < reads; ++i) {
    over += log.Record(2, 5, read_of(per_read, i * per_read, "k"));  // short keys: the key bound
  }
  EXPECT_EQ(over, 2u * per_read);
  EXPECT_EQ(log.waiting_keys(2), PeerReadLog::kMaxKeysPerNode);
  // A heartbeat of another generation gets nothing, and the old generation's reads are dropped.
  out.Clear();
  EXPECT_EQ(log.Drain(2, 6, &out, &dropped), 0u);
  EXPECT_EQ(dropped, PeerReadLog::kMaxKeysPerNode);
  EXPECT_EQ(log.waiting_keys(2), 0u);
}

// A Lookup that asks with_liveness says per location whether its owner is live on that
// generation; a silent owner's location stays routed through its grace but is not live.
TEST(RemoteGetMaster, LookupWithLivenessMarksLocationsOfLiveOwners) {
  MasterOptions o;
  o.owner_lease = milliseconds(200);
  o.owner_grace = milliseconds(60'000);
  MasterCore m(o);
  const auto [start, s] = StartGetFromOwnerOne(m, 1, {"k"});
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(m.BatchGetDone(Done(start, *s)).ok());
  auto live_of = [&](bool ask) {
    v1::LookupRequest r;
    r.add_keys("k");
    r.set_with_liveness(ask);
    auto reply = m.Lookup(r);
    std::map<uint32_t, bool> out;
    if (reply.ok() && reply->found(0)) {
      for (const auto& l : reply->routes(0).locations()) out[l.node_id()] = l.live();
    }
    return out;
  };
  EXPECT_EQ(live_of(true), (std::map<uint32_t, bool>{{1, true}, {2, true}}));
  EXPECT_EQ(live_of(false), (std::map<uint32_t, bool>{{1, false}, {2, false}}));  // not asked
  std::this_thread::sleep_for(milliseconds(150));
  Heartbeat(m, 2, 22);
  std::this_thread::sleep_for(milliseconds(100));  // node 1 silent for 250 ms > its lease
  EXPECT_EQ(live_of(true), (std::map<uint32_t, bool>{{1, false}, {2, true}}));
}

}  // namespace
}  // namespace fluxon
