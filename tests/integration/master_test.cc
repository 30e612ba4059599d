#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "master/master_core.h"

namespace fluxon {
namespace {

v1::PublishBatchRequest Batch(uint32_t node, uint64_t gen, uint64_t put_id,
                              std::vector<std::string> keys) {
  v1::PublishBatchRequest r;
  r.set_node_id(node);
  r.set_generation(gen);
  r.set_put_id(put_id);
  uint64_t off = 4096;
  for (auto& k : keys) {
    v1::RouteItem* i = r.add_items();
    i->set_key(k);
    i->set_put_id(put_id);
    i->set_offset(off += 4096);
    i->set_len(100);
  }
  return r;
}

void Register(MasterCore& m, uint32_t node, uint64_t gen) {
  v1::RegisterOwnerRequest r;
  r.set_node_id(node);
  r.set_generation(gen);
  ASSERT_TRUE(m.RegisterOwner(r).ok());
}

TEST(MasterCore, PublishIsIdempotentByIdentity) {
  MasterCore m;
  Register(m, 1, 10);
  auto r = m.PublishBatch(Batch(1, 10, 7, {"a", "b"}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcomes(0), v1::PUBLISHED);
  auto again = m.PublishBatch(Batch(1, 10, 7, {"a", "b"}));
  EXPECT_EQ(again->outcomes(1), v1::PUBLISHED);
  EXPECT_EQ(m.route_count(), 2u);
  EXPECT_EQ(m.counters().published_items.load(), 2);
  EXPECT_EQ(m.counters().republished_items.load(), 2);
  auto other = m.PublishBatch(Batch(1, 10, 8, {"b", "c"}));
  EXPECT_EQ(other->outcomes(0), v1::SUPERSEDED);
  EXPECT_EQ(other->outcomes(1), v1::PUBLISHED);
}

// A batch naming a value of 4 GiB or more (a buggy or hostile owner) is refused whole, before
// any of its items is routed.
TEST(MasterCore, APublishWithAnOversizedLenIsRefusedWhole) {
  MasterCore m;
  Register(m, 1, 10);
  v1::PublishBatchRequest r = Batch(1, 10, 7, {"a", "b", "c"});
  r.mutable_items(2)->set_len(kMaxRoutedValueBytes + 1);
  const auto refused = m.PublishBatch(r);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.route_count(), 0u);
  r.mutable_items(2)->set_len(kMaxRoutedValueBytes);
  ASSERT_TRUE(m.PublishBatch(r).ok());
  EXPECT_EQ(m.route_count(), 3u);
}

TEST(MasterCore, RemoveIsExact) {
  MasterCore m;
  Register(m, 1, 10);
  ASSERT_TRUE(m.PublishBatch(Batch(1, 10, 7, {"a"})).ok());
  v1::RemoveRoutesRequest rr;
  rr.set_node_id(1);
  rr.set_generation(10);
  auto* item = rr.add_items();
  item->set_key("a");
  item->set_put_id(6);  // another version: not removed
  EXPECT_FALSE(m.RemoveRoutes(rr)->removed(0));
  item->set_put_id(7);
  EXPECT_TRUE(m.RemoveRoutes(rr)->removed(0));
  EXPECT_FALSE(m.RemoveRoutes(rr)->removed(0));  // idempotent
  EXPECT_EQ(m.route_count(), 0u);
}

TEST(MasterCore, StaleGenerationIsRejectedAndReRegistrationDropsRoutes) {
  MasterCore m(MasterOptions{std::chrono::milliseconds(100)});
  Register(m, 1, 10);
  ASSERT_TRUE(m.PublishBatch(Batch(1, 10, 1, {"a", "b"})).ok());
  Register(m, 2, 20);
  ASSERT_TRUE(m.PublishBatch(Batch(2, 20, 1, {"c"})).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // node 1's lease lapses
  Register(m, 1, 11);                                           // node 1 restarted
  EXPECT_EQ(m.route_count(), 1u);
  auto stale = m.PublishBatch(Batch(1, 10, 2, {"d"}));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m.PublishBatch(Batch(3, 1, 1, {"e"})).status().code(),
            absl::StatusCode::kFailedPrecondition);  // never registered
  v1::LookupRequest lr;
  lr.add_keys("a");
  lr.add_keys("c");
  auto l = m.Lookup(lr);
  EXPECT_FALSE(l->found(0));
  EXPECT_TRUE(l->found(1));
  EXPECT_EQ(l->routes(1).node_id(), 2u);
}

// Issue: a second process registering a live owner's node_id must be refused, not obeyed (it
// would drop the live owner's routes and make its publishes stale for good).
TEST(MasterCore, RegistrationOfALiveOwnersNodeIdIsRefused) {
  MasterCore m(MasterOptions{std::chrono::milliseconds(300)});
  Register(m, 1, 10);
  ASSERT_TRUE(m.PublishBatch(Batch(1, 10, 1, {"a"})).ok());
  v1::RegisterOwnerRequest rogue;
  rogue.set_node_id(1);
  rogue.set_generation(99);
  auto refused = m.RegisterOwner(rogue);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("live owner"));
  EXPECT_EQ(m.route_count(), 1u);
  // The live owner keeps publishing; heartbeats (re-registration of its identity) keep it live.
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Register(m, 1, 10);
  }
  EXPECT_EQ(m.RegisterOwner(rogue).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(m.PublishBatch(Batch(1, 10, 2, {"b"})).ok());
  EXPECT_EQ(m.route_count(), 2u);
}

// Routes exist only for registered owners, so a registration new to the table is answered as
// such (the owner republishes); a heartbeat of a known identity is not.
TEST(MasterCore, ARegistrationNewToTheTableIsAnsweredAsNewAndAHeartbeatIsNot) {
  MasterCore m(MasterOptions{std::chrono::milliseconds(60'000)});
  v1::RegisterOwnerRequest r;
  r.set_node_id(1);
  r.set_generation(10);
  auto first = m.RegisterOwner(r);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->newly_registered());
  auto beat = m.RegisterOwner(r);
  ASSERT_TRUE(beat.ok());
  EXPECT_FALSE(beat->newly_registered());
  v1::UnregisterOwnerRequest u;
  u.set_node_id(1);
  u.set_generation(10);
  ASSERT_TRUE(m.UnregisterOwner(u).ok());
  auto again = m.RegisterOwner(r);  // the same identity, forgotten meanwhile
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->newly_registered());
  // A fresh table under the same epoch (a leadership that began again) does not know it either.
  MasterCore same_epoch(MasterOptions{std::chrono::milliseconds(60'000)}, m.epoch(),
                        std::make_shared<MasterCounters>());
  auto fresh = same_epoch.RegisterOwner(r);
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(fresh->newly_registered());
}

TEST(MasterCore, UnregisterFreesTheNodeIdAndDropsItsRoutes) {
  MasterCore m(MasterOptions{std::chrono::milliseconds(60'000)});
  Register(m, 1, 10);
  ASSERT_TRUE(m.PublishBatch(Batch(1, 10, 1, {"a", "b"})).ok());
  v1::UnregisterOwnerRequest wrong;
  wrong.set_node_id(1);
  wrong.set_generation(11);
  EXPECT_EQ(m.UnregisterOwner(wrong).status().code(), absl::StatusCode::kFailedPrecondition);
  v1::UnregisterOwnerRequest u;
  u.set_node_id(1);
  u.set_generation(10);
  auto r = m.UnregisterOwner(u);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->dropped_routes(), 2u);
  EXPECT_EQ(m.route_count(), 0u);
  Register(m, 1, 11);  // the restarted owner need not wait for the lease
}

TEST(MasterCore, ListKeysByPrefixSorted) {
  MasterCore m;
  Register(m, 1, 10);
  ASSERT_TRUE(m.PublishBatch(Batch(1, 10, 1, {"p:b", "p:a", "q:z", "p:c"})).ok());
  v1::ListKeysRequest r;
  r.set_prefix("p:");
  r.set_limit(2);
  auto l = m.ListKeys(r);
  ASSERT_EQ(l->routes_size(), 2);
  EXPECT_EQ(l->routes(0).key(), "p:a");
  EXPECT_EQ(l->routes(1).key(), "p:b");
  auto owners = m.ListOwners({});
  ASSERT_EQ(owners->owners_size(), 1);
  EXPECT_EQ(owners->owners(0).routes(), 4u);
}

}  // namespace
}  // namespace fluxon
