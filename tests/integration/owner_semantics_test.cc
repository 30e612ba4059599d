// End-to-end semantics of the single-node owner through the real client socket: put/get round
// trips, V1-V3, conflicts, prefixes and groups (G4/G5), handles, publish retries (A1/A2, T1),
// singleflight (G1-G3, G6, G7), capacity eviction (S2, S5), NoSpace, disconnect cleanup, and
// clients in other processes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstring>
#include <set>
#include <thread>

#include "fluxon/plan_blob_abi.h"
#include "owner/put_path.h"
#include "tests/integration/test_node.h"

namespace fluxon {
namespace {

using ::fluxon::testing::Connect;
using ::fluxon::testing::StartNode;
using ::fluxon::testing::TestConfig;
using ::fluxon::testing::WaitForBaseline;
using std::chrono::milliseconds;
using ::testing::ElementsAre;

constexpr int64_t kValueLen = 64 * 1024;

std::vector<std::string> Keys(const std::string& prefix, int n, int from = 0) {
  std::vector<std::string> out;
  for (int i = from; i < from + n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

std::vector<uint64_t> PlanPtrs(uint64_t plan) {
  const auto* h = reinterpret_cast<const PlanBlobHeader*>(plan);
  const uint64_t* p = PlanValuePtrs(reinterpret_cast<const void*>(plan));
  return std::vector<uint64_t>(p, p + h->count);
}

// Writes a recognisable pattern per key, commits, waits for publish.
void PutValues(KvClient& c, const std::vector<std::string>& keys, PutOptions o = {},
               int64_t value_len = kValueLen) {
  auto plan = c.LocalFastPutStart(keys, value_len, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<uint64_t> ptrs = PlanPtrs(*plan);
  for (size_t i = 0; i < keys.size(); ++i) {
    std::memset(reinterpret_cast<void*>(ptrs[i]), 0, value_len);
    std::memcpy(reinterpret_cast<void*>(ptrs[i]), keys[i].data(), keys[i].size());
  }
  auto fut = c.LocalFastPutCommit(*plan);
  ASSERT_TRUE(fut.ok()) << fut.status();
  ASSERT_TRUE(fut->Wait(milliseconds(5000)).ok()) << fut->status();
}

// Owner (and client) counters that must return to zero after any workload, waited for as a
// whole: a disconnect's or a commit's releases finish on the owner's threads.
void ExpectBaseline(FluxonNode& node, KvClient* c = nullptr) {
  EXPECT_EQ(WaitForBaseline(node, c), "");
}

bool RoutePublished(FluxonNode& node, const std::string& key) {
  v1::LookupRequest r;
  r.add_keys(key);
  auto reply = node.master()->Lookup(r);
  return reply.ok() && reply->found(0);
}

// A node on cfg and a client of it: a test adjusts cfg, then calls Start (or, managing its own
// clients, starts the node alone).
class OwnerSemantics : public ::testing::Test {
 protected:
  void Start() {
    node = StartNode(cfg);
    c = Connect(cfg);
  }

  Config cfg = TestConfig();
  std::unique_ptr<FluxonNode> node;
  std::unique_ptr<KvClient> c;
};

TEST_F(OwnerSemantics, PutThenGetRoundTripsBytes) {
  Start();
  auto segs = c->WaitLocalSegmentsReady();
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].segment_label, "external_owner:0");
  EXPECT_EQ(segs[0].generation, node->owner()->generation());
  auto keys = Keys("rt", 8);
  PutValues(*c, keys);
  for (const auto& k : keys) EXPECT_TRUE(RoutePublished(*node, k));
  auto h = c->GetStart(keys);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->result.all_hit);
  EXPECT_EQ(h->result.transferable_len, 8u);
  EXPECT_EQ(h->result.local_pinned, 8u);
  auto plan = c->GetTransfer(*h);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto ptrs = PlanPtrs(*plan);
  ASSERT_EQ(ptrs.size(), 8u);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(std::memcmp(reinterpret_cast<void*>(ptrs[i]), keys[i].data(), keys[i].size()), 0);
    EXPECT_GE(ptrs[i], segs[0].read_ptr);
    EXPECT_LT(ptrs[i] + kValueLen, segs[0].read_ptr + segs[0].len + 1);
  }
  ASSERT_TRUE(c->ReleaseViews(*plan).ok());
  ExpectBaseline(*node, c.get());
  EXPECT_EQ(node->owner()->Stats()["slots_Committed"], 8);
}

// DropCopies (one ranking: an owner asks a remote_cache to drop the copies it demoted there) is
// served by remote_cache nodes only: an owner's values are its own to evict, so an owner refuses
// the call and keeps every value, whoever names them.
TEST_F(OwnerSemantics, AnOwnerRefusesToDropCopiesOnRequest) {
  Start();
  auto keys = Keys("drop", 4);
  PutValues(*c, keys);
  v1::DropCopiesRequest req;
  req.set_requester_node_id(node->owner()->node_id() + 1);
  for (const auto& k : keys) {
    v1::DropItem* item = req.add_items();
    item->set_key(k);
    item->set_put_id(1);
  }
  absl::StatusOr<v1::DropCopiesReply> reply = node->owner()->DropCopies(req);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition) << reply.status();
  auto s = node->owner()->Stats();
  EXPECT_EQ(s["slots_Committed"], 4);
  EXPECT_EQ(s["dropped_on_request_pages"], 0);
  for (const auto& k : keys) EXPECT_TRUE(RoutePublished(*node, k));
  ExpectBaseline(*node, c.get());
}

TEST_F(OwnerSemantics, V1LocalReadBeforeMasterPublishAndFutureAfter) {
  cfg.faults.push_back({"master.PublishBatch", "delay", milliseconds(600), 1});
  Start();
  auto keys = Keys("v1-", 4);
  auto plan = c->LocalFastPutStart(keys, kValueLen, {});
  ASSERT_TRUE(plan.ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto fut = c->LocalFastPutCommit(*plan);
  ASSERT_TRUE(fut.ok());
  // V1: the same owner hits and pins at once, while the publish is held back.
  auto h = c->GetStart(keys);
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->result.all_hit);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(300));
  // V2: nothing global sees it yet; V3: it is not Committed yet.
  EXPECT_FALSE(fut->done());
  EXPECT_FALSE(RoutePublished(*node, keys[0]));
  EXPECT_EQ(node->owner()->KeyState(keys[0]), "local_visible");
  EXPECT_EQ(node->owner()->Stats()["slots_PendingLocalVisible"], 4);
  ASSERT_TRUE(fut->Wait(milliseconds(5000)).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(550));
  EXPECT_TRUE(RoutePublished(*node, keys[0]));
  EXPECT_EQ(node->owner()->KeyState(keys[0]), "committed");
  auto p = c->GetTransfer(*h);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(c->ReleaseViews(*p).ok());
  ExpectBaseline(*node, c.get());
}

TEST_F(OwnerSemantics, ConflictReportsIndicesAndReservesNothing) {
  Start();
  auto first = c->LocalFastPutStart({"a", "b"}, kValueLen, {});
  ASSERT_TRUE(first.ok());
  std::vector<uint32_t> conflicts;
  auto second = c->LocalFastPutStart({"c", "b", "d"}, kValueLen, {}, &conflicts);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(conflicts, ElementsAre(1u));
  EXPECT_EQ(node->owner()->KeyState("c"), "absent");
  EXPECT_EQ(node->owner()->Stats()["slots_Prepared"], 2);
  ASSERT_TRUE(c->PutAbort(*first).ok());
  EXPECT_EQ(node->owner()->KeyState("a"), "absent");
  // Existing (committed) keys conflict too.
  PutValues(*c, {"x"});
  conflicts.clear();
  EXPECT_EQ(c->LocalFastPutStart({"y", "x"}, kValueLen, {}, &conflicts).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(conflicts, ElementsAre(1u));
  ExpectBaseline(*node, c.get());
}

TEST_F(OwnerSemantics, BadInputsFailAndLeaveNothingBehind) {
  Start();
  const auto code = [](const absl::Status& s) { return s.code(); };
  EXPECT_EQ(code(c->LocalFastPutStart({}, kValueLen, {}).status()),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(c->LocalFastPutStart({"k"}, 0, {}).status()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(c->LocalFastPutStart({"k"}, -4, {}).status()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(c->LocalFastPutStart({"k", "k"}, kValueLen, {}).status()),
            absl::StatusCode::kInvalidArgument);
  PutOptions bad_groups;
  bad_groups.atomic_group_lens = {1, 2};
  EXPECT_EQ(code(c->LocalFastPutStart({"k1", "k2"}, kValueLen, bad_groups).status()),
            absl::StatusCode::kInvalidArgument);
  bad_groups.atomic_group_lens = {0, 2};
  EXPECT_EQ(code(c->LocalFastPutStart({"k1", "k2"}, kValueLen, bad_groups).status()),
            absl::StatusCode::kInvalidArgument);
  PutOptions bad_mask;
  bad_mask.make_replica_task_mask = {true};
  EXPECT_EQ(code(c->LocalFastPutStart({"k1", "k2"}, kValueLen, bad_mask).status()),
            absl::StatusCode::kInvalidArgument);
  bad_mask.make_replica_task_mask = {true, false};
  bad_mask.atomic_group_lens = {2};
  EXPECT_EQ(code(c->LocalFastPutStart({"k1", "k2"}, kValueLen, bad_mask).status()),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(c->GetStart({}).status()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(c->GetStart({"a", "b"}, true, {3}).status()), absl::StatusCode::kInvalidArgument);

  // Plans: wrong kind, reuse, unknown.
  PutValues(*c, {"p0", "p1"});
  auto put_plan = c->LocalFastPutStart({"q"}, kValueLen, {});
  ASSERT_TRUE(put_plan.ok());
  EXPECT_EQ(code(c->ReleaseViews(*put_plan)), absl::StatusCode::kInvalidArgument);
  auto h = c->GetStart({"p0", "p1"});
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(code(c->GetTransfer(*h, 0).status()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(c->GetTransfer(*h, 3).status()), absl::StatusCode::kInvalidArgument);
  auto get_plan = c->GetTransfer(*h);  // still usable after the bad calls
  ASSERT_TRUE(get_plan.ok());
  EXPECT_EQ(code(c->GetTransfer(*h).status()), absl::StatusCode::kNotFound);  // consumed
  EXPECT_EQ(code(c->LocalFastPutCommit(*get_plan).status()), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(c->PutAbort(*get_plan)), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->ReleaseViews(*get_plan).ok());
  EXPECT_EQ(code(c->ReleaseViews(*get_plan)), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c->PutAbort(*put_plan).ok());
  EXPECT_EQ(code(c->PutAbort(*put_plan)), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(c->ReleaseViews(12345)), absl::StatusCode::kNotFound);
  GetStartHandle unknown;
  unknown.id = 999999;
  EXPECT_EQ(code(c->CancelGetTransfer(unknown)), absl::StatusCode::kNotFound);
  ExpectBaseline(*node, c.get());
  EXPECT_EQ(node->owner()->KeyState("k"), "absent");
  EXPECT_EQ(node->owner()->KeyState("k1"), "absent");
}

TEST_F(OwnerSemantics, PrefixRespectsGroupsAndReleasesTheSuffix) {
  Start();
  auto keys = Keys("g", 6);
  PutValues(*c, {keys[0], keys[1], keys[2], keys[4]});
  auto h = c->GetStart(keys, true, {2, 2, 2});
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->result.raw_prefix_hit_len, 3u);
  EXPECT_EQ(h->result.transferable_len, 2u);
  EXPECT_EQ(h->result.prefix_hit_groups, 1u);
  EXPECT_EQ(h->result.first_miss_index, 3u);
  EXPECT_EQ(h->result.first_miss_group_index, 1u);
  EXPECT_FALSE(h->result.all_hit);
  // G5: pins past transferable_len were dropped inside get_start, so keys 2 and 4 are
  // evictable now while 0 and 1 stay pinned by the handle.
  node->owner()->EvictSome(1ull << 40);
  EXPECT_EQ(node->owner()->KeyState(keys[2]), "absent");
  EXPECT_EQ(node->owner()->KeyState(keys[4]), "absent");
  EXPECT_EQ(node->owner()->KeyState(keys[0]), "committed");
  EXPECT_FALSE(RoutePublished(*node, keys[2]));
  EXPECT_TRUE(RoutePublished(*node, keys[0]));
  EXPECT_EQ(c->GetTransfer(*h, 1).status().code(), absl::StatusCode::kInvalidArgument);
  auto plan = c->GetTransfer(*h, 2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(PlanPtrs(*plan).size(), 2u);
  ASSERT_TRUE(c->ReleaseViews(*plan).ok());
  // prefix_best_effort=false: all or nothing.
  auto strict = c->GetStart(keys, false, {2, 2, 2});
  ASSERT_TRUE(strict.ok());
  EXPECT_EQ(strict->result.transferable_len, 0u);
  EXPECT_EQ(strict->result.raw_prefix_hit_len, 2u);
  ASSERT_TRUE(c->CancelGetTransfer(*strict).ok());
  ExpectBaseline(*node, c.get());
}

TEST_F(OwnerSemantics, ShorterConsumeReleasesTheTail) {
  Start();
  auto keys = Keys("t", 4);
  PutValues(*c, keys);
  auto h = c->GetStart(keys, true, {2, 2});
  auto plan = c->GetTransfer(*h, 2);
  ASSERT_TRUE(plan.ok());
  node->owner()->EvictSome(1ull << 40);
  EXPECT_EQ(node->owner()->KeyState(keys[0]), "committed");  // held by the view
  EXPECT_EQ(node->owner()->KeyState(keys[3]), "absent");     // tail released at transfer
  ASSERT_TRUE(c->ReleaseViews(*plan).ok());
  ExpectBaseline(*node, c.get());
}

TEST_F(OwnerSemantics, CancelAndTtlExpiryReleaseHandles) {
  cfg.owner->handle_ttl = milliseconds(200);
  Start();
  auto keys = Keys("ttl", 3);
  PutValues(*c, keys);
  auto h1 = c->GetStart(keys);
  ASSERT_TRUE(c->CancelGetTransfer(*h1).ok());
  EXPECT_EQ(c->CancelGetTransfer(*h1).code(), absl::StatusCode::kNotFound);
  auto h2 = c->GetStart(keys);
  EXPECT_EQ(node->owner()->Stats()["live_handles"], 1);
  std::this_thread::sleep_for(milliseconds(300));  // past the TTL; expiry runs on the next tick
  for (int i = 0; i < 500 && node->owner()->Stats()["live_handles"] != 0; ++i) {
    std::this_thread::sleep_for(milliseconds(10));  // bounded: a busy machine delays the tick
  }
  EXPECT_EQ(node->owner()->Stats()["live_handles"], 0);
  EXPECT_EQ(node->owner()->Stats()["handles_expired"], 1);
  auto late = c->GetTransfer(*h2);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound);
  ExpectBaseline(*node, c.get());
}

TEST_F(OwnerSemantics, DroppedAndDuplicatedPublishRollForwardOnce) {
  Start();
  node->faults().Set({"master.PublishBatch", FaultAction::kDrop, milliseconds(0), 2});
  auto keys = Keys("drop", 5);
  PutValues(*c, keys, {});
  auto s = node->owner()->Stats();
  EXPECT_EQ(s["publish_retries"], 2);
  EXPECT_EQ(s["superseded"], 0);
  const MasterCounters& m = node->master()->counters();
  EXPECT_EQ(m.published_items.load(), 5);     // applied once
  EXPECT_EQ(m.republished_items.load(), 10);  // two idempotent retries
  EXPECT_EQ(node->master()->route_count(), 5u);
  node->faults().Set({"master.PublishBatch", FaultAction::kDuplicate, milliseconds(0), 1});
  PutValues(*c, Keys("dup", 3));
  EXPECT_EQ(node->master()->route_count(), 8u);
  node->faults().Set({"master.PublishBatch", FaultAction::kFail, milliseconds(0), 1});
  PutValues(*c, Keys("lost", 2));
  EXPECT_EQ(node->master()->route_count(), 10u);
  for (const auto& k : Keys("lost", 2)) EXPECT_EQ(node->owner()->KeyState(k), "committed");
  ExpectBaseline(*node, c.get());
}

TEST_F(OwnerSemantics, OverlappingGetsShareOneLeaderPerKey) {
  node = StartNode(cfg);
  auto c1 = Connect(cfg);
  auto c2 = Connect(cfg);
  PutValues(*c1, {"s0"});
  // Hold the master lookup so the two batches overlap on keys s1..s3.
  node->faults().Set({"master.Lookup", FaultAction::kDelay, milliseconds(300), 1});
  absl::StatusOr<GetStartHandle> r1, r2;
  std::thread t1([&] { r1 = c1->GetStart({"s0", "s1", "s2", "s3"}); });
  std::this_thread::sleep_for(milliseconds(100));
  r2 = c2->GetStart({"s0", "s2", "s3", "s4"});
  t1.join();
  ASSERT_TRUE(r1.ok());
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r1->result.local_pinned, 1u);
  EXPECT_EQ(r1->result.leader_started, 3u);
  EXPECT_EQ(r2->result.inflight_joined, 2u);                    // s2, s3 joined r1's leaders
  EXPECT_EQ(r2->result.leader_started, 1u);                     // s4
  EXPECT_EQ(node->master()->counters().lookup_keys.load(), 4);  // s1, s2, s3, s4 once each
  EXPECT_EQ(node->master()->counters().lookup_batches.load(), 2);
  EXPECT_EQ(r1->result.transferable_len, 1u);
  ASSERT_TRUE(c1->CancelGetTransfer(*r1).ok());
  ASSERT_TRUE(c2->CancelGetTransfer(*r2).ok());
  ExpectBaseline(*node, c1.get());
}

TEST_F(OwnerSemantics, ParentKeyContinuesAChainThatIsEvictedFromItsTail) {
  Start();
  auto a = Keys("chain-a", 4);
  auto b = Keys("chain-b", 4);
  PutValues(*c, a);
  PutOptions o;
  o.parent_key = a.back();  // b continues a's prompt
  PutValues(*c, b, o);
  // The restore of a's prefix is an access to the whole chain; its tail is still b's last page.
  auto h = c->GetStart(a, true, {});
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(c->CancelGetTransfer(*h).ok());
  for (int i = 3; i >= 0; --i) {
    node->owner()->EvictSome(1);  // one cohort (one page) per round
    EXPECT_EQ(node->owner()->KeyState(b[i]), "absent") << i;
    for (const auto& k : a) EXPECT_EQ(node->owner()->KeyState(k), "committed") << k;
  }
  node->owner()->EvictSome(1);
  EXPECT_EQ(node->owner()->KeyState(a[3]), "absent");
  EXPECT_EQ(node->owner()->KeyState(a[2]), "committed");
  ExpectBaseline(*node, c.get());
}

TEST_F(OwnerSemantics, DeletePrefixRemovesRoutesThenSlotsAndKeepsWhatIsInUse) {
  Start();
  auto gone = Keys("ns1:a", 3);
  auto held = Keys("ns1:b", 2);
  auto other = Keys("ns2:a", 2);
  PutValues(*c, gone);
  PutOptions grouped;
  grouped.atomic_group_lens = {2};
  PutValues(*c, held, grouped);
  PutValues(*c, other);
  auto pin = c->GetStart({held[0]}, true, {});  // a reader holds one member of the group
  ASSERT_TRUE(pin.ok());
  ASSERT_EQ(pin->result.transferable_len, 1u);
  const int64_t free_before = node->owner()->Stats()["slots_Free"];
  const int64_t cohorts_before = node->owner()->Stats()["hot_cohorts"];  // 3 + 1 + 2

  EXPECT_EQ(c->DeletePrefix("").status().code(), absl::StatusCode::kInvalidArgument);
  auto r = c->DeletePrefix("ns1:");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first, 3u);   // deleted
  EXPECT_EQ(r->second, 2u);  // the pinned group, kept whole
  for (const auto& k : gone) {
    EXPECT_EQ(node->owner()->KeyState(k), "absent") << k;
    EXPECT_FALSE(RoutePublished(*node, k)) << k;  // S2: no route left to a freed slot
  }
  for (const auto& k : held) EXPECT_EQ(node->owner()->KeyState(k), "committed") << k;
  for (const auto& k : other) EXPECT_TRUE(RoutePublished(*node, k)) << k;
  EXPECT_EQ(node->owner()->Stats()["slots_Free"], free_before + 3);
  EXPECT_EQ(node->owner()->Stats()["deleted_pages"], 3);
  EXPECT_EQ(node->owner()->Stats()["hot_cohorts"], cohorts_before - 3);  // no stale bookkeeping
  auto miss = c->GetStart(gone, true, {});
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(miss->result.raw_prefix_hit_len, 0u);
  ASSERT_TRUE(c->CancelGetTransfer(*miss).ok());

  // Released, the group goes on the next delete; the keys can be written again.
  ASSERT_TRUE(c->CancelGetTransfer(*pin).ok());
  r = c->DeletePrefix("ns1:");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first, 2u);
  EXPECT_EQ(r->second, 0u);
  PutValues(*c, gone);
  for (const auto& k : gone) EXPECT_EQ(node->owner()->KeyState(k), "committed");
  ExpectBaseline(*node, c.get());
}

TEST_F(OwnerSemantics, ParentKeyInsideTheBatchIsRejectedWithNothingReserved) {
  Start();
  auto keys = Keys("pk", 3);
  PutOptions o;
  o.parent_key = keys[1];
  auto plan = c->LocalFastPutStart(keys, kValueLen, o);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), ::testing::HasSubstr("parent_key"));
  for (const auto& k : keys) EXPECT_EQ(node->owner()->KeyState(k), "absent");
  // An unknown parent is only a hint: the put goes through.
  o.parent_key = "never-stored";
  PutValues(*c, keys, o);
  for (const auto& k : keys) EXPECT_EQ(node->owner()->KeyState(k), "committed");
  ExpectBaseline(*node, c.get());
}

// Design §7: the hot tier over its capacity window evicts the overage at once, like a
// size-bounded cache on insert; only the NoSpace fallback for waiting claims is rate-limited
// (<= eviction_max_bytes_per_round per round, rounds >= eviction_interval apart).
TEST_F(OwnerSemantics, WatermarkOverageIsEvictedAtOnceNotInRateLimitedRounds) {
  cfg = TestConfig(2 * kGrantBytes);    // 256 slots of 4 MiB
  cfg.owner->hot_capacity_ratio = 0.5;  // window: 128 slots
  cfg.owner->eviction_interval = milliseconds(30'000);
  cfg.owner->eviction_max_bytes_per_round = 64ull << 20;  // 16 slots per fallback round
  Start();
  const int64_t vlen = 4 << 20;
  PutValues(*c, Keys("w", 192), {}, vlen);  // one batch, one admission
  // 192 committed against a window of 128: 64 over, four fallback rounds' worth (two minutes at
  // the fallback's pace); the watermark path takes them in one go.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (node->owner()->Stats()["slots_Committed"] > 128 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  auto s = node->owner()->Stats();
  EXPECT_LE(s["slots_Committed"], 128);
  EXPECT_GE(s["evicted_pages"], 64);
  // One RemoveRoutes per eviction round, not one per evicted page (64 cohorts of one key here).
  EXPECT_LE(s["route_remove_calls"], 4);
  ExpectBaseline(*node, c.get());
}

TEST_F(OwnerSemantics, CapacityEvictionKeepsPinnedValuesAndRemovesRoutesFirst) {
  cfg = TestConfig(kGrantBytes);  // one grant: 128 slots of 4 MiB
  cfg.owner->local_reserve.claim_soft_timeout = milliseconds(5);
  cfg.owner->local_reserve.claim_hard_timeout = milliseconds(5000);
  cfg.owner->eviction_interval = milliseconds(10);
  Start();
  const int64_t vlen = 4 << 20;
  // 120 values in groups of 4 fill the grant past the 0.95 watermark.
  for (int b = 0; b < 30; ++b) {
    PutOptions o;
    o.atomic_group_lens = {4};
    PutValues(*c, Keys("e" + std::to_string(b) + "-", 4), o, vlen);
  }
  auto pinned_keys = Keys("e0-", 4);
  auto pin = c->GetStart(pinned_keys, true, {4});
  ASSERT_TRUE(pin.ok());
  ASSERT_EQ(pin->result.transferable_len, 4u);
  // 40 more values need eviction of cold cohorts; e0 is the coldest but pinned.
  for (int b = 30; b < 40; ++b) {
    PutOptions o;
    o.atomic_group_lens = {4};
    PutValues(*c, Keys("e" + std::to_string(b) + "-", 4), o, vlen);
  }
  // The last puts left the grant above its watermark: the maintenance thread may still be
  // evicting (each victim's route removed first, then its slot). Checked once it has settled:
  // no eviction for several rounds (bounded).
  auto s = node->owner()->Stats();
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
       std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(cfg.owner->eviction_interval * 5);
    auto now = node->owner()->Stats();
    const bool settled = now["evicted_pages"] == s["evicted_pages"];
    s = std::move(now);
    if (settled) break;
  }
  EXPECT_GT(s["evicted_cohorts"], 0);
  EXPECT_EQ(s["evicted_pages"], 4 * s["evicted_cohorts"]);  // whole groups only
  for (const auto& k : pinned_keys) EXPECT_EQ(node->owner()->KeyState(k), "committed");
  // Evicted keys are gone everywhere: no route left pointing at a reused slot (S2).
  int absent = 0;
  for (int b = 1; b < 40; ++b) {
    auto group = Keys("e" + std::to_string(b) + "-", 4);
    const bool gone = node->owner()->KeyState(group[0]) == "absent";
    for (const auto& k : group) {
      EXPECT_EQ(node->owner()->KeyState(k) == "absent", gone) << k;  // all or none of a group
      EXPECT_EQ(RoutePublished(*node, k), !gone) << k;
    }
    absent += gone;
  }
  EXPECT_GT(absent, 0);
  // S5: the configured capacity never changed.
  EXPECT_EQ(s["grant_capacity"], 1);
  EXPECT_LE(s["grants"], 1);
  ASSERT_TRUE(c->CancelGetTransfer(*pin).ok());
  ExpectBaseline(*node, c.get());
}

TEST_F(OwnerSemantics, PutFailsWithNoSpaceWhenEverythingIsPinnedOrInFlight) {
  cfg = TestConfig(kGrantBytes);
  cfg.owner->local_reserve.claim_soft_timeout = milliseconds(5);
  cfg.owner->local_reserve.claim_hard_timeout = milliseconds(400);
  cfg.owner->eviction_interval = milliseconds(10);
  Start();
  const int64_t vlen = 64 << 20;  // 8 slots per grant
  // 7 committed values (under the 0.95 watermark), all pinned by a reader...
  auto keys = Keys("full", 7);
  PutValues(*c, keys, {}, vlen);
  auto pin = c->GetStart(keys);
  ASSERT_EQ(pin->result.transferable_len, 7u);
  // ...and the 8th slot held by a put in flight.
  auto inflight = c->LocalFastPutStart({"inflight"}, vlen, {});
  ASSERT_TRUE(inflight.ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto more = c->LocalFastPutStart({"more"}, vlen, {});
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted) << more.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(3000));
  EXPECT_EQ(node->owner()->KeyState("more"), "absent");
  EXPECT_GT(node->owner()->Stats()["eviction_skipped_pinned"], 0);
  EXPECT_EQ(node->owner()->Stats()["evicted_cohorts"], 0);
  EXPECT_EQ(node->owner()->KeyState("full0"), "committed");
  ASSERT_TRUE(c->CancelGetTransfer(*pin).ok());
  // With the pins gone, eviction makes room.
  auto later = c->LocalFastPutStart({"more"}, vlen, {});
  ASSERT_TRUE(later.ok()) << later.status();
  ASSERT_TRUE(c->PutAbort(*later).ok());
  ASSERT_TRUE(c->PutAbort(*inflight).ok());
  ExpectBaseline(*node, c.get());
}

TEST_F(OwnerSemantics, DisconnectReleasesPreparedPutsAndHandles) {
  node = StartNode(cfg);
  {
    auto writer = Connect(cfg);
    PutValues(*writer, Keys("d", 2));
  }
  {
    auto c = Connect(cfg);
    auto plan = c->LocalFastPutStart({"pending"}, kValueLen, {});
    ASSERT_TRUE(plan.ok());
    auto h = c->GetStart(Keys("d", 2));
    ASSERT_TRUE(h.ok());
    auto h2 = c->GetStart(Keys("d", 2));
    auto view = c->GetTransfer(*h2);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(node->owner()->Stats()["prepared_puts"], 1);
  }  // the client goes away without cleaning up
  ExpectBaseline(*node);
  EXPECT_EQ(node->owner()->KeyState("pending"), "absent");
}

TEST_F(OwnerSemantics, ThreadsSharingOneClientStayInOneSession) {
  // Concurrent calls open more pooled control connections; their puts must still complete
  // through the session's events connection, and disconnect must clean up all of them.
  node = StartNode(cfg);
  {
    auto c = Connect(cfg);
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 20; ++i) {
          auto keys = Keys("mt" + std::to_string(t) + "-" + std::to_string(i) + "-", 4);
          auto plan = c->LocalFastPutStart(keys, kValueLen, {});
          if (!plan.ok()) {
            ++failures;
            continue;
          }
          auto fut = c->LocalFastPutCommit(*plan);
          if (!fut.ok() || !fut->Wait(milliseconds(5000)).ok()) ++failures;
          auto h = c->GetStart(keys);
          if (!h.ok() || !h->result.all_hit || !c->CancelGetTransfer(*h).ok()) ++failures;
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
    ExpectBaseline(*node, c.get());
    // Leave a prepared put and a handle behind on whichever connections the pool hands out.
    std::vector<std::thread> leavers;
    for (int t = 0; t < 4; ++t) {
      leavers.emplace_back([&, t] {
        (void)c->LocalFastPutStart({"left" + std::to_string(t)}, kValueLen, {});
        (void)c->GetStart(Keys("mt0-0-", 4));
      });
    }
    for (auto& th : leavers) th.join();
  }
  ExpectBaseline(*node);
}

TEST_F(OwnerSemantics, AnotherProcessReadsCommittedValues) {
  Start();
  auto keys = Keys("xp", 3);
  PutValues(*c, keys);
  const std::string socket = cfg.owner->socket_path;
  pid_t pid = fork();
  if (pid == 0) {
    ClientOptions o;
    o.socket_path = socket;
    auto child = KvClient::Connect(o);
    if (!child.ok()) _exit(1);
    auto h = (*child)->GetStart(keys);
    if (!h.ok() || !h->result.all_hit) _exit(2);
    auto plan = (*child)->GetTransfer(*h);
    if (!plan.ok()) _exit(3);
    auto ptrs = PlanPtrs(*plan);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (std::memcmp(reinterpret_cast<void*>(ptrs[i]), keys[i].data(), keys[i].size()) != 0)
        _exit(4);
    }
    // ...and writes a value the parent then reads.
    auto put = (*child)->LocalFastPutStart({"from-child"}, kValueLen, {});
    if (!put.ok()) _exit(5);
    std::memcpy(reinterpret_cast<void*>(PlanPtrs(*put)[0]), "child!", 6);
    auto fut = (*child)->LocalFastPutCommit(*put);
    if (!fut.ok() || !fut->Wait(milliseconds(5000)).ok()) _exit(6);
    if (!(*child)->ReleaseViews(*plan).ok()) _exit(7);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  auto h = c->GetStart({"from-child"});
  ASSERT_TRUE(h->result.all_hit);
  auto plan = c->GetTransfer(*h);
  EXPECT_EQ(std::memcmp(reinterpret_cast<void*>(PlanPtrs(*plan)[0]), "child!", 6), 0);
  ASSERT_TRUE(c->ReleaseViews(*plan).ok());
  ExpectBaseline(*node, c.get());
}

// put_ids carry their node in the high bits, and a start's origin follows no clock: two starts
// of one node draw unrelated origins (a clock stepped back cannot make them repeat).
TEST(PutIds, NodeInTheHighBitsAndARandomOriginPerStart) {
  const uint64_t a = FirstPutId(1), b = FirstPutId(2);
  EXPECT_EQ(PutIdOrigin(a), 1u);
  EXPECT_EQ(PutIdOrigin(b), 2u);
  EXPECT_NE(a, b);
  std::set<uint64_t> starts;
  for (int i = 0; i < 16; ++i) {
    const uint64_t id = FirstPutId(7);
    EXPECT_EQ(PutIdOrigin(id), 7u);
    // Far apart (a false failure here has odds of about 3 in 100,000).
    for (uint64_t other : starts) {
      EXPECT_GT(id > other ? id - other : other - id, uint64_t{1} << 20);
    }
    starts.insert(id);
  }
}

}  // namespace
}  // namespace fluxon
