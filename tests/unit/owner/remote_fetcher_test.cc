// RemoteFetcher on its own (src/owner/remote_fetcher.h), between two owners' parts registered at
// one MasterCore, each serving its segment over a TCP data plane on 127.0.0.1 (as fluxond does
// with owner.data_address): node 1 fetches what node 2 published. One BatchGetStart, one read per
// source peer and one BatchGetDone per batch (G8); the copy is the key's one canonical holder,
// of the same put_id (G7, T2); uncertain answers are retried with the same identity (T1); every
// failure is a miss that leaves nothing reserved, except targets whose get may have started,
// which stay claimed until the master can no longer publish them.
#include "owner/remote_fetcher.h"

#include <type_traits>

#include "rpc/forwarding_master.h"
#include "tests/unit/owner/owner_parts_fixture.h"

namespace fluxon::testing {
namespace {

// Between the requester and the master: every call goes through unchanged except
// BatchGetStart, whose request or answer it changes as `Edit` says. Stands in for masters that
// answer differently from this tree's (an earlier one that ignores source_peers_apart, or one
// that leaves a source out of source_peers).
class StartEditingMaster : public ForwardingMaster<StartEditingMaster> {
 public:
  enum class Edit { kIgnoreSourcePeersApart, kDropSourcePeers };
  StartEditingMaster(MasterApi* next, Edit edit) : next_(next), edit_(edit) {}

  template <typename Reply, typename Request>
  absl::StatusOr<Reply> Forward(const Request& r,
                                absl::StatusOr<Reply> (MasterApi::*method)(const Request&)) {
    if constexpr (std::is_same_v<Request, v1::BatchGetStartRequest>) {
      if (edit_ == Edit::kIgnoreSourcePeersApart) {
        v1::BatchGetStartRequest earlier = r;  // the field unknown to it: read as unset
        earlier.clear_source_peers_apart();
        return next_->BatchGetStart(earlier);
      }
      absl::StatusOr<v1::BatchGetStartReply> reply = next_->BatchGetStart(r);
      if (reply.ok()) reply->clear_source_peers();
      return reply;
    }
    return (next_->*method)(r);
  }

 private:
  MasterApi* const next_;
  const Edit edit_;
};

class RemoteFetcherTest : public OwnerPartsTest {
 protected:
  // The requester (node 1) and the source (node 2), both with a data plane. With
  // `requester_master`, the requester's calls go through it to the shared master.
  void TwoOwners(PartsOptions requester = {}, PartsOptions source = {},
                 std::unique_ptr<MasterApi> requester_master = nullptr) {
    requester.node_id = 1;
    requester.data_plane = true;
    source.node_id = 2;
    source.data_plane = true;
    a_ = requester_master != nullptr ? &MakeOver(std::move(requester_master), requester)
                                     : &Make(requester);
    b_ = &Make(source);
    // Carves the requester's grant now: populating 512 MiB must not eat a fetch's deadline.
    auto warm = a_->pool().Claim(kValueLen, 1);
    ASSERT_TRUE(warm.ok()) << warm.status();
    ASSERT_TRUE(a_->pool().Abort(warm->front()).ok());
  }
  // The leaders a get of `keys` on node 1 would hand the fetcher: the master's routes.
  std::vector<RemoteLeader> Leaders(const std::vector<std::string>& keys) {
    std::vector<RemoteLeader> out;
    for (const std::string& k : keys) {
      auto route = RouteOf(master(), k);
      EXPECT_TRUE(route.has_value()) << k;
      if (route) out.push_back(RemoteLeader{k, route->put_id(), route->len(), route->version()});
    }
    return out;
  }
  size_t Locations(const std::string& key) {
    auto route = RouteOf(master(), key);
    return route ? static_cast<size_t>(route->locations_size()) : 0;
  }
  // Nothing of a fetch is left on the requester: no reservation, no claimed or hidden target.
  void ExpectNothingHeld(const std::vector<std::string>& keys) {
    for (const std::string& k : keys) EXPECT_EQ(a_->State(k), "absent") << k;
    EXPECT_EQ(a_->SlotsIn(SlotState::kPrepared), 0);
    EXPECT_EQ(a_->SlotsIn(SlotState::kPending), 0);
    EXPECT_EQ(a_->counters->reserved_entries.load(), 0);
    EXPECT_EQ(a_->counters->remote_pending_targets.load(), 0);
    EXPECT_EQ(a_->counters->remote_quarantined_slots.load(), 0);
    EXPECT_EQ(a_->counters->remote_unfinished.load(), 0);
  }
  std::vector<HolderRef> Fetch(const std::vector<RemoteLeader>& leaders,
                               std::vector<uint64_t>* cohorts = nullptr) {
    std::vector<uint64_t> ignored;
    return a_->remote->Fetch(leaders, cohorts != nullptr ? cohorts : &ignored);
  }
  // Checks that `h` is node 1's installed copy of `key`, with the source's bytes and put_id.
  void ExpectCopy(const HolderRef& h, const std::string& key, uint64_t put_id) {
    ASSERT_TRUE(h) << key;
    EXPECT_EQ(h->key, key);
    EXPECT_EQ(h->put_id, put_id);
    EXPECT_EQ(h->node_id, a_->node_id());
    EXPECT_EQ(TagAt(*a_, h->offset), TagOf(key));
    EXPECT_EQ(a_->State(key), "committed");
  }

  OwnerParts* a_ = nullptr;
  OwnerParts* b_ = nullptr;
};

// G8/G7/T2: a batch of leaders on one source is one BatchGetStart, one data-plane read and one
// BatchGetDone; each key becomes a Committed copy of the same put_id in the hot tier, and the
// master routes to both locations.
TEST_F(RemoteFetcherTest, FetchInstallsCopiesWithOneStartOneReadOneDone) {
  TwoOwners();
  const std::vector<std::string> keys = Keys("r", 4);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  const std::vector<RemoteLeader> leaders = Leaders(keys);
  std::vector<uint64_t> cohorts;
  std::vector<HolderRef> got = Fetch(leaders, &cohorts);
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < keys.size(); ++i) {
    ExpectCopy(got[i], keys[i], leaders[i].put_id);
    EXPECT_NE(cohorts[i], 0u);
    EXPECT_EQ(Locations(keys[i]), 2u);
  }
  EXPECT_EQ(mc().get_start_calls.load(), 1);
  EXPECT_EQ(mc().get_done_calls.load(), 1);
  EXPECT_EQ(mc().gets_done.load(), 4);
  EXPECT_EQ(master().inflight_gets(), 0u);
  EXPECT_EQ(a_->counters->remote_transfer_submissions.load(), 1);
  EXPECT_EQ(a_->counters->remote_hits.load(), 4);
  EXPECT_EQ(a_->counters->remote_bytes.load(), 4 * kValueLen);
  EXPECT_EQ(a_->SlotsIn(SlotState::kCommitted), 4);
  EXPECT_EQ(a_->counters->remote_pending_targets.load(), 0);
  EXPECT_GE(a_->hot->size(), 1u);
  // The copy is an ordinary local value now: a get pins it without the master.
  got.clear();
  auto local = a_->gets->Start(1, keys, {}, false);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(local->local_pinned, 4u);
  EXPECT_TRUE(a_->gets->Cancel(1, local->handle_id).ok());
}

// G6/G7 through GetPath: a get of keys routed to another owner leads them and has them fetched,
// and its prefix covers them.
TEST_F(RemoteFetcherTest, GetStartFetchesLeadersRoutedToAnotherOwner) {
  TwoOwners();
  ASSERT_TRUE(PutAndPublish(*b_, {"g0", "g1"}, {2}).ok());
  auto got = a_->gets->Start(1, {"g0", "g1"}, {2}, false);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->leader_started, 2u);
  EXPECT_EQ(got->prefix.transferable_len, 2u);
  EXPECT_EQ(TagAt(*a_, got->offsets[0]), TagOf("g0"));
  EXPECT_EQ(TagAt(*a_, got->offsets[1]), TagOf("g1"));
  EXPECT_EQ(a_->flights->size(), 0u);
  EXPECT_EQ(mc().get_start_calls.load(), 1);
  EXPECT_TRUE(a_->gets->Cancel(1, got->handle_id).ok());
}

// A peer's read reaches the source's hot tier with the source's next heartbeat: the values read
// count as an access there (their chain leaves probation, the one-hit filter; the unread batch
// stays on it).
TEST_F(RemoteFetcherTest, PeerReadsReachTheSourcesHotTierWithItsHeartbeat) {
  TwoOwners();
  const std::vector<std::string> read = Keys("read", 4), unread = Keys("unread", 4);
  ASSERT_TRUE(PutAndPublish(*b_, read, {4}).ok());
  ASSERT_TRUE(PutAndPublish(*b_, unread, {4}).ok());
  const uint64_t total = b_->hot->weight();
  auto on_probation = [&] {
    return b_->hot->InspectPolicy(
        [](const AdaptiveChainPolicy& p) { return p.probation_weight(); });
  };
  ASSERT_EQ(on_probation(), total);  // neither was accessed
  auto got = a_->gets->Start(1, read, {4}, false);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->prefix.transferable_len, 4u);
  EXPECT_TRUE(a_->gets->Cancel(1, got->handle_id).ok());
  EXPECT_EQ(b_->counters->peer_read_touches.load(), 0);
  EXPECT_EQ(on_probation(), total);                // not before the heartbeat
  ASSERT_TRUE(b_->registration->Register().ok());  // the heartbeat
  EXPECT_EQ(b_->counters->peer_read_touches.load(), 4);
  EXPECT_EQ(mc().peer_read_keys.load(), 4);
  EXPECT_EQ(on_probation(), total / 2);  // the unread batch only
  // Handed over once: the next heartbeat touches nothing more.
  ASSERT_TRUE(b_->registration->Register().ok());
  EXPECT_EQ(b_->counters->peer_read_touches.load(), 4);
}

// A route whose owner is no longer live (not heard within the master's owner_lease), or has no
// data plane, has no source: a miss, and nothing stays reserved or claimed.
TEST_F(RemoteFetcherTest, RouteToAnOwnerThatIsNotLiveIsAMiss) {
  MasterOptions mo;
  mo.owner_lease = milliseconds(300);
  UseMaster(mo);
  TwoOwners();
  ASSERT_TRUE(PutAndPublish(*b_, {"stale"}).ok());
  ASSERT_TRUE(RegisterPeer(master(), 3, 33).ok());  // node 3: no data plane
  ASSERT_TRUE(PublishOne(master(), 3, 33, 9, "planeless").ok());
  std::this_thread::sleep_for(milliseconds(400));  // node 2 is silent past its lease

  std::vector<HolderRef> got = Fetch(Leaders({"stale", "planeless"}));
  EXPECT_FALSE(got[0]);
  EXPECT_FALSE(got[1]);
  EXPECT_EQ(mc().get_start_calls.load(), 1);
  EXPECT_EQ(mc().gets_started.load(), 0);
  EXPECT_EQ(a_->counters->remote_misses.load(), 2);
  ExpectNothingHeld({"stale", "planeless"});
}

// A definite BatchGetStart refusal is a miss that frees every target and reservation: the next
// fetch of the same keys proceeds.
TEST_F(RemoteFetcherTest, RefusedBatchGetStartIsAMissAndLeavesNothingReserved) {
  TwoOwners();
  const std::vector<std::string> keys = Keys("x", 3);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  const std::vector<RemoteLeader> leaders = Leaders(keys);
  Fault("master.BatchGetStart", FaultAction::kRefuse, 1);
  std::vector<HolderRef> got = Fetch(leaders);
  for (const HolderRef& h : got) EXPECT_FALSE(h);
  ExpectNothingHeld(keys);
  EXPECT_EQ(a_->counters->remote_misses.load(), 3);
  got = Fetch(leaders);
  for (size_t i = 0; i < keys.size(); ++i) ExpectCopy(got[i], keys[i], leaders[i].put_id);
}

// T1: a BatchGetStart the master applied but whose answer was lost is retried with the same
// request_id; the master answers from its stored reply (no second get, no BUSY) and the fetch
// goes on to install the copies.
TEST_F(RemoteFetcherTest, LostBatchGetStartAnswerIsRetriedWithTheSameRequestId) {
  TwoOwners();
  const std::vector<std::string> keys = Keys("t", 2);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  Fault("master.BatchGetStart", FaultAction::kDrop, 1);
  const std::vector<RemoteLeader> leaders = Leaders(keys);
  std::vector<HolderRef> got = Fetch(leaders);
  for (size_t i = 0; i < keys.size(); ++i) ExpectCopy(got[i], keys[i], leaders[i].put_id);
  EXPECT_EQ(mc().get_start_calls.load(), 2);
  EXPECT_EQ(mc().get_start_replayed.load(), 1);
  EXPECT_EQ(mc().gets_started.load(), 2);
  EXPECT_EQ(master().inflight_gets(), 0u);
}

// T1 (quarantine): when no BatchGetStart answer comes at all, the gets may have started with ids
// nobody knows, so the targets are neither used nor freed: they stay claimed (the keys are not
// reserved any more) until the master's in-flight TTL plus a margin has passed.
TEST_F(RemoteFetcherTest, UnansweredBatchGetStartQuarantinesTheTargetsUntilTheTtl) {
  PartsOptions requester;
  requester.remote_get_timeout = milliseconds(200);
  TwoOwners(requester);
  const std::vector<std::string> keys = Keys("q", 2);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  Fault("master.BatchGetStart", FaultAction::kFail, -1);
  const auto before = Clock::now();
  std::vector<HolderRef> got = Fetch(Leaders(keys));
  EXPECT_LT(Clock::now() - before, milliseconds(3'000));  // bounded by remote_get_timeout
  EXPECT_FALSE(got[0]);
  EXPECT_FALSE(got[1]);
  faults_.Clear("master.BatchGetStart");
  EXPECT_EQ(a_->counters->remote_start_lost.load(), 1);
  EXPECT_EQ(a_->counters->remote_quarantined_slots.load(), 2);
  EXPECT_EQ(a_->SlotsIn(SlotState::kPrepared), 2);
  EXPECT_EQ(a_->State("q0"), "absent");

  a_->remote->RunMaintenance(Clock::now());  // not yet
  EXPECT_EQ(a_->SlotsIn(SlotState::kPrepared), 2);
  const milliseconds ttl = a_->registration->inflight_get_ttl();
  a_->remote->RunMaintenance(Clock::now() + ttl + milliseconds(2'001));
  ExpectNothingHeld(keys);
}

// A read that fails is never installed: its get is revoked at the master (the source's pin ends)
// and the target freed; the source can then evict its value.
TEST_F(RemoteFetcherTest, FailedReadIsRevokedAndItsTargetFreed) {
  TwoOwners();
  ASSERT_TRUE(PutAndPublish(*b_, {"f"}).ok());
  a_->peer_faults.Set(FaultRule{"peer.read", FaultAction::kFail, milliseconds(0), 1});
  std::vector<HolderRef> got = Fetch(Leaders({"f"}));
  EXPECT_FALSE(got[0]);
  EXPECT_EQ(a_->counters->remote_transfer_failures.load(), 1);
  EXPECT_EQ(mc().get_revoke_calls.load(), 1);
  EXPECT_EQ(mc().gets_revoked.load(), 1);
  EXPECT_EQ(master().inflight_gets(), 0u);
  EXPECT_EQ(Locations("f"), 1u);
  ExpectNothingHeld({"f"});
  EXPECT_EQ(b_->evictor->EvictSome(UINT64_MAX), static_cast<uint64_t>(kValueLen));
}

// T1: a BatchGetDone whose answer was lost is retried; the master recognises its own copy (same
// key, put_id, target) and the fetch installs it once.
TEST_F(RemoteFetcherTest, LostBatchGetDoneAnswerIsRetriedToTheSameEnd) {
  TwoOwners();
  ASSERT_TRUE(PutAndPublish(*b_, {"d"}).ok());
  Fault("master.BatchGetDone", FaultAction::kDrop, 1);
  const std::vector<RemoteLeader> leaders = Leaders({"d"});
  std::vector<HolderRef> got = Fetch(leaders);
  ExpectCopy(got[0], "d", leaders[0].put_id);
  EXPECT_EQ(mc().get_done_calls.load(), 2);
  EXPECT_EQ(mc().get_done_replayed.load(), 1);
  EXPECT_EQ(Locations("d"), 2u);
}

// T1: a BatchGetDone that stays unanswered past the batch's deadline is a miss for the caller,
// but the target is not freed (the master may publish it): the maintenance round retries the
// Done with the same get_id and installs the copy.
TEST_F(RemoteFetcherTest, UnansweredBatchGetDoneIsFinishedInTheBackground) {
  PartsOptions requester;
  requester.remote_get_timeout = milliseconds(1'000);
  TwoOwners(requester);
  ASSERT_TRUE(PutAndPublish(*b_, {"warm", "bg"}).ok());
  ASSERT_TRUE(Fetch(Leaders({"warm"}))[0]);  // the data-plane connection is up
  Fault("master.BatchGetDone", FaultAction::kFail, -1);
  std::vector<HolderRef> got = Fetch(Leaders({"bg"}));
  EXPECT_FALSE(got[0]);
  EXPECT_EQ(a_->counters->remote_transfer_failures.load(), 0);  // the read itself succeeded
  EXPECT_EQ(a_->counters->remote_unfinished.load(), 1);
  EXPECT_EQ(a_->State("bg"), "reserved");  // still the fetch's
  EXPECT_EQ(a_->SlotsIn(SlotState::kPending), 1);
  EXPECT_EQ(Locations("bg"), 1u);

  faults_.Clear("master.BatchGetDone");
  a_->remote->RunMaintenance(Clock::now());
  EXPECT_EQ(a_->counters->remote_unfinished.load(), 0);
  EXPECT_EQ(a_->State("bg"), "committed");
  EXPECT_EQ(a_->SlotsIn(SlotState::kPending), 0);
  EXPECT_EQ(a_->SlotsIn(SlotState::kCommitted), 2);  // warm and bg
  EXPECT_EQ(Locations("bg"), 2u);
}

// A key this owner is putting itself (reserved by a local put) is not fetched; the other leaders
// of the batch are.
TEST_F(RemoteFetcherTest, KeyReservedByALocalPutIsNotFetched) {
  TwoOwners();
  ASSERT_TRUE(PutAndPublish(*b_, {"mine", "theirs"}).ok());
  auto local = a_->puts->Start(1, Args({"mine"}), nullptr);
  ASSERT_TRUE(local.ok());
  const std::vector<RemoteLeader> leaders = Leaders({"mine", "theirs"});
  std::vector<HolderRef> got = Fetch(leaders);
  EXPECT_FALSE(got[0]);
  ExpectCopy(got[1], "theirs", leaders[1].put_id);
  EXPECT_EQ(a_->State("mine"), "reserved");
  EXPECT_EQ(mc().get_start_items.load(), 1);
  EXPECT_TRUE(a_->puts->Abort(1, local->put_id).ok());
}

// A master that does not know source_peers_apart (an earlier one) names the source's address
// and transports in every item and lists no source peers: the fetch reads from the per-item
// address and installs the copies as before.
TEST_F(RemoteFetcherTest, AMasterThatIgnoresSourcePeersApartIsReadThroughEachItemsAddress) {
  TwoOwners({}, {},
            std::make_unique<StartEditingMaster>(
                &faulty(), StartEditingMaster::Edit::kIgnoreSourcePeersApart));
  const std::vector<std::string> keys = Keys("e", 3);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  const std::vector<RemoteLeader> leaders = Leaders(keys);
  std::vector<HolderRef> got = Fetch(leaders);
  ASSERT_EQ(got.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ExpectCopy(got[i], keys[i], leaders[i].put_id);
    EXPECT_EQ(Locations(keys[i]), 2u);
  }
  EXPECT_EQ(mc().get_start_calls.load(), 1);
  EXPECT_EQ(a_->counters->remote_transfer_submissions.load(), 1);
  EXPECT_EQ(master().inflight_gets(), 0u);
}

// A started item whose source has no address anywhere in the answer (not in the item, not in
// source_peers) is malformed: nothing is read, its get is revoked at the master (the source's
// pin ends) and its target freed.
TEST_F(RemoteFetcherTest, AStartedItemWithoutAnySourceAddressIsRevokedNotRead) {
  TwoOwners(
      {}, {},
      std::make_unique<StartEditingMaster>(&faulty(), StartEditingMaster::Edit::kDropSourcePeers));
  const std::vector<std::string> keys = Keys("m", 2);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  std::vector<HolderRef> got = Fetch(Leaders(keys));
  for (const HolderRef& h : got) EXPECT_FALSE(h);
  EXPECT_EQ(a_->counters->remote_transfer_submissions.load(), 0);
  EXPECT_EQ(mc().gets_revoked.load(), 2);
  EXPECT_EQ(master().inflight_gets(), 0u);
  for (const std::string& k : keys) EXPECT_EQ(Locations(k), 1u);
  ExpectNothingHeld(keys);
}

// Without a data plane every leader is a miss, decided without calling the master.
TEST_F(RemoteFetcherTest, WithoutADataPlaneEveryLeaderIsAMiss) {
  PartsOptions source;
  source.node_id = 2;
  source.data_plane = true;
  b_ = &Make(source);
  PartsOptions requester;
  requester.node_id = 1;
  a_ = &Make(requester);
  ASSERT_TRUE(PutAndPublish(*b_, {"n"}).ok());
  EXPECT_FALSE(a_->remote->enabled());
  std::vector<HolderRef> got = Fetch(Leaders({"n"}));
  EXPECT_FALSE(got[0]);
  EXPECT_EQ(mc().get_start_calls.load(), 0);
  EXPECT_EQ(a_->counters->remote_misses.load(), 1);
  ExpectNothingHeld({"n"});
}

// Deferred get_start (the OwnerRpc branch): the answer comes before the read, counts the values
// being fetched in the prefix and carries no offsets; get_transfer waits for the consumed values
// and then names each one's place, with the source's bytes.
TEST_F(RemoteFetcherTest, ADeferredGetStartAnswersBeforeTheReadAndTheTransferWaitsForIt) {
  PartsOptions requester;
  requester.prefetch_workers = 2;
  TwoOwners(requester);
  const std::vector<std::string> keys = Keys("d", 4);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  a_->peer_faults.Set(FaultRule{"peer.read", FaultAction::kDelay, milliseconds(600), 1});
  const auto t0 = std::chrono::steady_clock::now();
  auto got = a_->gets->Start(1, keys, {}, true, /*allow_deferred=*/true);
  const auto answered = std::chrono::steady_clock::now() - t0;
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_LT(answered, milliseconds(400));  // the read alone takes 600 ms
  EXPECT_TRUE(got->deferred);
  EXPECT_EQ(got->leader_started, 4u);
  EXPECT_EQ(got->prefix.transferable_len, 4u);
  EXPECT_TRUE(got->offsets.empty());
  EXPECT_EQ(a_->counters->deferred_gets.load(), 1);
  std::vector<HandleTable::Located> located;
  ASSERT_TRUE(a_->gets->Transfer(1, got->handle_id, 0, &located).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(600));
  ASSERT_EQ(located.size(), 4u);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(TagAt(*a_, located[i].offset), TagOf(keys[i]));
    EXPECT_EQ(located[i].len, static_cast<uint64_t>(kValueLen));
    EXPECT_EQ(a_->State(keys[i]), "committed");
  }
  EXPECT_EQ(a_->flights->size(), 0u);
  ASSERT_TRUE(a_->gets->Release(1, got->handle_id).ok());
  EXPECT_EQ(a_->counters->live_views.load(), 0);
  // Local now: the next get is answered with offsets, deferral allowed or not.
  auto local = a_->gets->Start(1, keys, {}, true, true);
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(local->deferred);
  EXPECT_EQ(local->local_pinned, 4u);
  EXPECT_EQ(local->offsets.size(), 4u);
  EXPECT_TRUE(a_->gets->Cancel(1, local->handle_id).ok());
}

// A deferred get_start whose keys another get is already fetching from another owner joins that
// fetch without waiting for its read (G11), and its transfer gets the one installed copy (G7);
// one BatchGetStart serves both.
TEST_F(RemoteFetcherTest, ADeferredGetStartJoiningAFetchInFlightAnswersBeforeTheRead) {
  PartsOptions requester;
  requester.prefetch_workers = 2;
  TwoOwners(requester);
  const std::vector<std::string> keys = Keys("j", 4);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  a_->peer_faults.Set(FaultRule{"peer.read", FaultAction::kDelay, milliseconds(600), 1});
  const auto t0 = std::chrono::steady_clock::now();
  auto first = a_->gets->Start(1, keys, {}, true, /*allow_deferred=*/true);
  ASSERT_TRUE(first.ok() && first->deferred);
  ASSERT_EQ(first->leader_started, 4u);
  auto second = a_->gets->Start(2, keys, {}, true, /*allow_deferred=*/true);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(400));  // the read takes 600
  EXPECT_TRUE(second->deferred);
  EXPECT_EQ(second->inflight_joined, 4u);
  EXPECT_EQ(second->prefix.transferable_len, 4u);
  EXPECT_TRUE(second->offsets.empty());
  for (auto [client, handle] : {std::pair{2u, second->handle_id}, {1u, first->handle_id}}) {
    std::vector<HandleTable::Located> located;
    ASSERT_TRUE(a_->gets->Transfer(client, handle, 0, &located).ok());
    ASSERT_EQ(located.size(), keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(TagAt(*a_, located[i].offset), TagOf(keys[i]));
    }
    ASSERT_TRUE(a_->gets->Release(client, handle).ok());
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(600));
  EXPECT_EQ(mc().get_start_calls.load(), 1);
  EXPECT_EQ(a_->flights->size(), 0u);
  EXPECT_EQ(a_->counters->live_views.load(), 0);
  EXPECT_EQ(a_->counters->live_handles.load(), 0);
}

// A consumed value that could not be fetched fails the transfer (Aborted) and releases the whole
// handle: no plan ever names a value that is not here, and nothing stays reserved or pinned.
TEST_F(RemoteFetcherTest, ADeferredValueThatCannotBeFetchedFailsTheTransfer) {
  PartsOptions requester;
  requester.prefetch_workers = 1;
  TwoOwners(requester);
  const std::vector<std::string> keys = Keys("x", 2);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  a_->peer_faults.Set(FaultRule{"peer.read", FaultAction::kFail, milliseconds(0), 1});
  auto got = a_->gets->Start(1, keys, {}, true, true);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->deferred);
  EXPECT_EQ(got->prefix.transferable_len, 2u);
  std::vector<HandleTable::Located> located;
  const absl::Status s = a_->gets->Transfer(1, got->handle_id, 0, &located);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_TRUE(located.empty());
  EXPECT_EQ(a_->counters->deferred_gets_failed.load(), 1);
  EXPECT_EQ(a_->counters->live_handles.load(), 0);
  EXPECT_EQ(a_->gets->Release(1, got->handle_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(master().inflight_gets(), 0u);
  ExpectNothingHeld(keys);
}

// A deferred handle cancelled while its values are read: the fetch still ends (its copies are
// installed, unpinned) and nothing of the handle stays.
TEST_F(RemoteFetcherTest, ADeferredHandleCancelledMidReadLeavesOnlyTheInstalledCopies) {
  PartsOptions requester;
  requester.prefetch_workers = 1;
  TwoOwners(requester);
  const std::vector<std::string> keys = Keys("c", 3);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  a_->peer_faults.Set(FaultRule{"peer.read", FaultAction::kDelay, milliseconds(300), 1});
  auto got = a_->gets->Start(1, keys, {}, true, true);
  ASSERT_TRUE(got.ok() && got->deferred);
  ASSERT_TRUE(a_->gets->Cancel(1, got->handle_id).ok());
  EXPECT_EQ(a_->counters->live_handles.load(), 0);
  ASSERT_TRUE(WaitUntil([&] { return a_->flights->size() == 0; }));
  for (const std::string& k : keys) EXPECT_EQ(a_->State(k), "committed") << k;
  EXPECT_EQ(a_->counters->remote_pending_targets.load(), 0);
  EXPECT_EQ(master().inflight_gets(), 0u);
  // Unpinned: every copy is evictable.
  EXPECT_EQ(a_->evictor->EvictSome(UINT64_MAX), static_cast<uint64_t>(3 * kValueLen));
}

// The chunks end in key order: a transfer of the first value waits for its own chunk, not for
// the batch (one worker, one value per chunk, every read 300 ms).
TEST_F(RemoteFetcherTest, ADeferredTransferOfAPrefixWaitsOnlyForItsChunks) {
  PartsOptions requester;
  requester.prefetch_workers = 1;
  requester.prefetch_chunk_bytes = kValueLen;
  TwoOwners(requester);
  const std::vector<std::string> keys = Keys("p", 4);
  ASSERT_TRUE(PutAndPublish(*b_, keys).ok());
  a_->peer_faults.Set(FaultRule{"peer.read", FaultAction::kDelay, milliseconds(300), -1});
  const auto t0 = std::chrono::steady_clock::now();
  auto got = a_->gets->Start(1, keys, {}, true, true);
  ASSERT_TRUE(got.ok() && got->deferred);
  std::vector<HandleTable::Located> located;
  ASSERT_TRUE(a_->gets->Transfer(1, got->handle_id, 1, &located).ok());
  const auto first = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(located.size(), 1u);
  EXPECT_EQ(TagAt(*a_, located[0].offset), TagOf(keys[0]));
  EXPECT_GE(first, milliseconds(300));
  EXPECT_LT(first, milliseconds(900));  // the last chunk ends after 1,200 ms
  ASSERT_TRUE(a_->gets->Release(1, got->handle_id).ok());
  // The rest still arrives and is installed (unpinned).
  ASSERT_TRUE(WaitUntil([&] { return a_->flights->size() == 0; }));
  for (const std::string& k : keys) EXPECT_EQ(a_->State(k), "committed") << k;
  a_->peer_faults.Clear("");
}

// A deferred get_start may queue its fetch without waking a worker (the client server wakes them
// after writing the answer): WakePrefetches starts it, and a wake never given strands nothing
// (the workers' 100 ms poll finds the chunk). Bytes checked either way.
TEST_F(RemoteFetcherTest, AFetchQueuedWithoutItsWakeIsFetchedWokenOrNot) {
  PartsOptions requester;
  requester.prefetch_workers = 1;
  TwoOwners(requester);
  ASSERT_TRUE(PutAndPublish(*b_, {"woken", "unwoken"}).ok());
  for (const std::string key : {"woken", "unwoken"}) {
    auto got = a_->gets->Start(1, {key}, {}, true, /*allow_deferred=*/true,
                               /*defer_prefetch_wake=*/true);
    ASSERT_TRUE(got.ok() && got->deferred) << key;
    if (key == "woken") a_->gets->WakePrefetches();
    std::vector<HandleTable::Located> located;
    ASSERT_TRUE(a_->gets->Transfer(1, got->handle_id, 0, &located).ok()) << key;
    ASSERT_EQ(located.size(), 1u);
    EXPECT_EQ(TagAt(*a_, located[0].offset), TagOf(key));
    ASSERT_TRUE(a_->gets->Release(1, got->handle_id).ok());
  }
  a_->gets->WakePrefetches();  // nothing owed: a no-op
  EXPECT_EQ(a_->flights->size(), 0u);
}

// Without prefetch workers (or without allow_deferred) a get_start answers once the values are
// here, as always.
TEST_F(RemoteFetcherTest, WithoutPrefetchWorkersAGetIsNeverDeferred) {
  TwoOwners();
  ASSERT_TRUE(PutAndPublish(*b_, {"w"}).ok());
  auto got = a_->gets->Start(1, {"w"}, {}, true, true);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->deferred);
  ASSERT_EQ(got->offsets.size(), 1u);
  EXPECT_EQ(TagAt(*a_, got->offsets[0]), TagOf("w"));
  std::vector<HandleTable::Located> located;
  ASSERT_TRUE(a_->gets->Transfer(1, got->handle_id, 0, &located).ok());
  EXPECT_TRUE(located.empty());  // the places came with the start
  EXPECT_TRUE(a_->gets->Release(1, got->handle_id).ok());
}

}  // namespace
}  // namespace fluxon::testing
