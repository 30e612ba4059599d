// The master's replica placement (master/replica_placement.h): the pure rules, then MasterCore
// placing by the capacity owners report with their registrations and heartbeats.
#include "master/replica_placement.h"

#include <optional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fluxon/units.h"
#include "master/master_core.h"

namespace fluxon {
namespace {

using ::testing::HasSubstr;

PlacementCandidate Owner(uint32_t node, std::string role, uint64_t free_bytes,
                         uint64_t committed = 0, uint64_t segment = 8 * kGiB,
                         uint64_t evictable = 0) {
  PlacementCandidate c;
  c.node_id = node;
  c.generation = 100 + node;
  c.role = std::move(role);
  c.address = "127.0.0.1:" + std::to_string(7000 + node);
  c.peer_address = "127.0.0.1:" + std::to_string(8000 + node);
  c.live = true;
  c.segment_bytes = segment;
  c.free_bytes = free_bytes;
  c.committed_bytes = committed;
  c.evictable_bytes = evictable;
  return c;
}

ReplicaPlacementOptions Options(bool restrict) {
  return ReplicaPlacementOptions{{"remote_cache"}, restrict, 0.95};
}

uint32_t Target(const std::vector<PlacementCandidate>& c, const GroupPlacement& p) {
  EXPECT_TRUE(p.placed) << p.reason;
  return p.placed ? c[p.candidate].node_id : 0;
}

TEST(ReplicaPlacement, NeverTheSourceNorADeadOrDataPlanelessOwner) {
  std::vector<PlacementCandidate> c = {Owner(1, "owner", 4 * kGiB), Owner(2, "owner", 1 * kGiB),
                                       Owner(3, "owner", 6 * kGiB), Owner(4, "owner", 7 * kGiB),
                                       Owner(5, "owner", 8 * kGiB)};
  c[2].live = false;          // most room after nodes 4 and 5, but its lease ran out
  c[3].address.clear();       // serves no data plane
  c[4].peer_address.clear();  // serves no peer service: it could not be asked to pull
  const auto placed = PlaceGroups(Options(false), /*source=*/1, {kMiB, kMiB}, c);
  ASSERT_EQ(placed.size(), 2u);
  EXPECT_EQ(Target(c, placed[0]), 2u);
  EXPECT_EQ(Target(c, placed[1]), 2u);
}

TEST(ReplicaPlacement, PicksTheTargetWithMostRoomAndSpreadsGroups) {
  std::vector<PlacementCandidate> c = {Owner(1, "owner", 4 * kGiB),
                                       Owner(2, "remote_cache", 3 * kGiB),
                                       Owner(3, "remote_cache", 2 * kGiB)};
  // 2 GiB groups: node 2 (3 GiB) first, then node 3 (2 GiB) has more room than node 2's 1 GiB.
  const auto placed = PlaceGroups(Options(true), 1, {2 * kGiB, 2 * kGiB}, c);
  EXPECT_EQ(Target(c, placed[0]), 2u);
  EXPECT_EQ(Target(c, placed[1]), 3u);
}

TEST(ReplicaPlacement, AGroupIsPlacedWholeOrNotAtAll) {
  std::vector<PlacementCandidate> c = {Owner(1, "owner", 4 * kGiB),
                                       Owner(2, "remote_cache", 3 * kGiB),
                                       Owner(3, "remote_cache", 3 * kGiB)};
  // 5 GiB fits on neither target alone, though both together have 6 GiB: never split.
  const auto placed = PlaceGroups(Options(true), 1, {5 * kGiB, kGiB}, c);
  EXPECT_FALSE(placed[0].placed);
  EXPECT_THAT(placed[0].reason, HasSubstr("NoSpace"));
  EXPECT_TRUE(placed[1].placed);
}

TEST(ReplicaPlacement, StrictRolesWithoutCandidateIsNoSpaceNotAGpuOwner) {
  std::vector<PlacementCandidate> c = {Owner(1, "owner", 4 * kGiB), Owner(2, "owner", 4 * kGiB),
                                       Owner(3, "embedded", 4 * kGiB)};
  const auto strict = PlaceGroups(Options(true), 1, {kMiB}, c);
  EXPECT_FALSE(strict[0].placed);
  EXPECT_THAT(strict[0].reason, HasSubstr("NoSpace"));
  EXPECT_THAT(strict[0].reason, HasSubstr("remote_cache"));
  // Unrestricted, another owner takes it.
  const auto open = PlaceGroups(Options(false), 1, {kMiB}, c);
  EXPECT_TRUE(open[0].placed);
  // A full remote_cache under strict placement is NoSpace too, though a GPU owner has room.
  c.push_back(Owner(4, "remote_cache", kMiB / 2));
  const auto full = PlaceGroups(Options(true), 1, {kMiB}, c);
  EXPECT_FALSE(full[0].placed);
}

TEST(ReplicaPlacement, UnrestrictedPrefersRemoteOnlyRolesWithRoom) {
  std::vector<PlacementCandidate> c = {Owner(1, "owner", 4 * kGiB), Owner(2, "owner", 7 * kGiB),
                                       Owner(3, "remote_cache", 2 * kGiB)};
  const auto placed = PlaceGroups(Options(false), 1, {kGiB, kGiB, kGiB}, c);
  EXPECT_EQ(Target(c, placed[0]), 3u);  // the remote_cache, though node 2 has more room
  // The remote_cache's 2 GiB free less 1 GiB given leaves 1 GiB: the second fits, the third
  // goes to a GPU owner.
  EXPECT_EQ(Target(c, placed[1]), 3u);
  EXPECT_EQ(Target(c, placed[2]), 2u);
}

TEST(ReplicaPlacement, CapacityRatioKeepsHeadroomOnTheTarget) {
  // 8 GiB segment at 0.95: 7.6 GiB may be committed. 7 GiB held leaves 0.6 GiB, though 1 GiB
  // is free.
  std::vector<PlacementCandidate> c = {Owner(1, "owner", 4 * kGiB),
                                       Owner(2, "remote_cache", 1 * kGiB, 7 * kGiB)};
  EXPECT_FALSE(PlaceGroups(Options(true), 1, {700 * kMiB}, c)[0].placed);
  EXPECT_TRUE(PlaceGroups(Options(true), 1, {500 * kMiB}, c)[0].placed);
  ReplicaPlacementOptions all = Options(true);
  all.capacity_ratio = 1.0;
  EXPECT_TRUE(PlaceGroups(all, 1, {1 * kGiB}, c)[0].placed);
}

TEST(ReplicaPlacement, AFullRemoteCacheEvictsItsCopiesToTakeMore) {
  // The remote_cache holds 7.6 GiB, all evictable copies, and has nothing free: it is a cache
  // tier, so its evictable bytes are room (it drops its coldest copies) within the ratio.
  std::vector<PlacementCandidate> c = {
      Owner(1, "owner", 4 * kGiB),
      Owner(2, "remote_cache", 0, 7600 * kMiB, 8 * kGiB, /*evictable=*/7600 * kMiB)};
  const auto placed = PlaceGroups(Options(true), 1, {kGiB, kGiB}, c);
  EXPECT_EQ(Target(c, placed[0]), 2u);
  EXPECT_EQ(Target(c, placed[1]), 2u);
  // What it cannot evict (readers' pins) still counts as held: 7 GiB pinned of 7.6 leaves 0.6.
  c[1].evictable_bytes = 600 * kMiB;
  EXPECT_FALSE(PlaceGroups(Options(true), 1, {700 * kMiB}, c)[0].placed);
  EXPECT_TRUE(PlaceGroups(Options(true), 1, {500 * kMiB}, c)[0].placed);
  // A GPU owner's committed values are its own working set: never room for a replica, even
  // when its evictor could drop them.
  std::vector<PlacementCandidate> gpu = {Owner(1, "owner", 4 * kGiB),
                                         Owner(2, "owner", 0, 7 * kGiB, 8 * kGiB, 7 * kGiB)};
  EXPECT_FALSE(PlaceGroups(Options(false), 1, {kMiB}, gpu)[0].placed);
}

void RegisterWith(MasterCore& m, uint32_t node, uint64_t gen, const std::string& role,
                  uint64_t free_bytes, uint64_t committed = 0,
                  std::optional<uint64_t> evictable = std::nullopt) {
  v1::RegisterOwnerRequest r;
  r.set_node_id(node);
  r.set_generation(gen);
  r.set_role(role);
  r.set_address("127.0.0.1:" + std::to_string(7000 + node));
  r.set_peer_address("127.0.0.1:" + std::to_string(8000 + node));
  r.add_transports("tcp");
  v1::OwnerCapacity* c = r.mutable_capacity();
  c->set_segment_bytes(8 * kGiB);
  c->set_free_bytes(free_bytes);
  c->set_committed_bytes(committed);
  c->set_evictable_bytes(evictable.value_or(committed));
  ASSERT_TRUE(m.RegisterOwner(r).ok());
}

v1::PlaceReplicasRequest Place(uint32_t source, std::vector<uint64_t> groups) {
  v1::PlaceReplicasRequest r;
  r.set_source_node_id(source);
  for (uint64_t g : groups) r.add_group_bytes(g);
  return r;
}

TEST(MasterPlacement, HeartbeatUpdatesTheCapacityListOwnersShows) {
  MasterCore m;
  RegisterWith(m, 1, 10, "owner", 4 * kGiB);
  RegisterWith(m, 1, 10, "owner", 3 * kGiB, kGiB);  // heartbeat: same identity, new figures
  auto owners = m.ListOwners({});
  ASSERT_TRUE(owners.ok());
  ASSERT_EQ(owners->owners_size(), 1);
  EXPECT_EQ(owners->owners(0).capacity().free_bytes(), 3 * kGiB);
  EXPECT_EQ(owners->owners(0).capacity().committed_bytes(), kGiB);
  EXPECT_EQ(owners->owners(0).capacity().segment_bytes(), 8 * kGiB);
}

TEST(MasterPlacement, PlacesByReportedCapacityUnderTheConfiguredRoles) {
  MasterOptions strict;
  strict.placement = ReplicaPlacementOptions{{"remote_cache"}, true, 0.95};
  MasterCore m(strict);
  RegisterWith(m, 1, 10, "owner", 4 * kGiB);
  RegisterWith(m, 2, 20, "owner", 6 * kGiB);
  auto none = m.PlaceReplicas(Place(1, {kMiB}));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->groups(0).placed());
  EXPECT_THAT(none->groups(0).reason(), HasSubstr("NoSpace"));

  RegisterWith(m, 3, 30, "remote_cache", 2 * kGiB);
  auto placed = m.PlaceReplicas(Place(1, {kMiB, kMiB}));
  ASSERT_TRUE(placed.ok());
  for (const v1::PlacedGroup& g : placed->groups()) {
    EXPECT_TRUE(g.placed());
    EXPECT_EQ(g.node_id(), 3u);
    EXPECT_EQ(g.generation(), 30u);
    EXPECT_EQ(g.role(), "remote_cache");
    EXPECT_EQ(g.address(), "127.0.0.1:7003");
    EXPECT_EQ(g.peer_address(), "127.0.0.1:8003");
  }
  // The remote_cache fills up with copies it may evict: it still takes replicas (it drops its
  // coldest copies). Once readers pin what it holds, its next heartbeat says so and placement
  // follows.
  RegisterWith(m, 3, 30, "remote_cache", 0, 7 * kGiB);
  EXPECT_TRUE(m.PlaceReplicas(Place(1, {kMiB}))->groups(0).placed());
  RegisterWith(m, 3, 30, "remote_cache", 0, 7 * kGiB, /*evictable=*/0);
  EXPECT_FALSE(m.PlaceReplicas(Place(1, {kMiB}))->groups(0).placed());
}

TEST(MasterPlacement, DefaultsAreTheConfigs) {
  const MasterOptions defaults;
  EXPECT_EQ(defaults.placement.remote_only_node_roles, std::vector<std::string>{"remote_cache"});
  EXPECT_FALSE(defaults.placement.restrict_to_remote_only_node_roles);
  EXPECT_DOUBLE_EQ(defaults.placement.capacity_ratio, MasterConfig{}.replica_cache_capacity_ratio);
}

TEST(MasterPlacement, RefusesEmptyOrZeroByteGroups) {
  MasterCore m;
  EXPECT_EQ(m.PlaceReplicas(Place(1, {})).status().code(), absl::StatusCode::kInvalidArgument);
  auto zero = m.PlaceReplicas(Place(1, {kMiB, 0}));
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("group 1"));
}

}  // namespace
}  // namespace fluxon
