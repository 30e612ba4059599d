// RouteTable: versions, copies and exact removal (T1, T2), with either key policy
// (master.route_keys): the rules do not depend on what the table keeps of a key.
#include "route/route_table.h"

#include <gtest/gtest.h>

#include "absl/strings/str_format.h"

namespace fluxon {
namespace {

RouteLocation Loc(uint32_t node, uint64_t gen, uint64_t put, uint64_t offset = 0,
                  uint64_t version = 0) {
  return RouteLocation{node, gen, put, offset, 4096, version};
}

// put_id `seq` put by `node` (PutPath's layout).
uint64_t PutOf(uint32_t node, uint64_t seq) {
  return (static_cast<uint64_t>(node) << kPutIdSeqBits) | seq;
}

class RouteTableTest : public testing::TestWithParam<RouteKeys> {};

// Item 3 of the versions issue: after a master restart the owners republish in any order, and the
// higher version wins whoever comes first; a fresh put never replaces a route.
TEST_P(RouteTableTest, RepublishedHigherVersionReplacesTheRouteAndALowerOneIsSuperseded) {
  const PublishKind republish{/*republish=*/true, /*copy=*/false};
  RouteTable t(GetParam());
  const RouteLocation v1 = Loc(1, 10, PutOf(1, 5), 0, /*version=*/100);
  const RouteLocation v2 = Loc(2, 20, PutOf(2, 9), 0, /*version=*/200);
  EXPECT_EQ(t.Publish("k", v1, republish), RouteTable::PublishOutcome::kPublished);
  std::vector<RouteLocation> displaced;
  EXPECT_EQ(t.Publish("k", v2, republish, &displaced), RouteTable::PublishOutcome::kReplaced);
  ASSERT_EQ(displaced.size(), 1u);
  EXPECT_TRUE(displaced[0].SameIdentity(v1));
  EXPECT_EQ(t.Lookup("k")->primary().node_id, 2u);
  EXPECT_EQ(t.Publish("k", v1, republish), RouteTable::PublishOutcome::kSuperseded);
  EXPECT_EQ(t.Lookup("k")->version(), 200u);
  // The other order ends the same way.
  RouteTable u(GetParam());
  EXPECT_EQ(u.Publish("k", v2, republish), RouteTable::PublishOutcome::kPublished);
  EXPECT_EQ(u.Publish("k", v1, republish), RouteTable::PublishOutcome::kSuperseded);
  EXPECT_EQ(u.Lookup("k")->version(), 200u);
  // A fresh put of a newer version does not replace a live route (the first writer wins).
  const RouteLocation v3 = Loc(3, 30, PutOf(3, 1), 0, /*version=*/300);
  EXPECT_EQ(u.Publish("k", v3), RouteTable::PublishOutcome::kSuperseded);
  EXPECT_EQ(u.Lookup("k")->version(), 200u);
}

// Item 4: equal put_ids are not trusted. The same put_id with another version is another value;
// the same identity from an owner that did not put it joins only as a copy.
TEST_P(RouteTableTest, EqualPutIdsAreNotTrustedToBeEqualValues) {
  RouteTable t(GetParam());
  const uint64_t put = PutOf(1, 77);
  EXPECT_EQ(t.Publish("k", Loc(1, 10, put, 0, 100)), RouteTable::PublishOutcome::kPublished);
  // A restarted node 1 that drew the same put_id for new bytes: another version, superseded.
  EXPECT_EQ(t.Publish("k", Loc(1, 12, put, 0, 500)), RouteTable::PublishOutcome::kSuperseded);
  EXPECT_FALSE(t.AddCopy("k", Loc(3, 30, put, 0, 500)));
  // Node 2 claiming the identity as its own: refused.
  EXPECT_EQ(t.Publish("k", Loc(2, 20, put, 0, 100)), RouteTable::PublishOutcome::kRefused);
  // As a copy (republished after a master restart): joins.
  EXPECT_EQ(t.Publish("k", Loc(2, 20, put, 0, 100), PublishKind{true, true}),
            RouteTable::PublishOutcome::kPublished);
  // The origin under a new generation republishing its own put: joins.
  EXPECT_EQ(t.Publish("k", Loc(1, 11, put, 8192, 100), PublishKind{true, false}),
            RouteTable::PublishOutcome::kPublished);
  EXPECT_EQ(t.Lookup("k")->locations.size(), 3u);
}

TEST_P(RouteTableTest, PublishIsIdempotentAndOtherIdentitiesAreSuperseded) {
  RouteTable t(GetParam());
  EXPECT_EQ(t.Publish("k", Loc(1, 10, 7)), RouteTable::PublishOutcome::kPublished);
  EXPECT_EQ(t.Publish("k", Loc(1, 10, 7)), RouteTable::PublishOutcome::kRepublished);
  EXPECT_EQ(t.Publish("k", Loc(2, 20, 8)), RouteTable::PublishOutcome::kSuperseded);
  EXPECT_EQ(t.Publish("k", Loc(1, 10, 7, 8192)), RouteTable::PublishOutcome::kSuperseded);
  ASSERT_TRUE(t.Lookup("k").has_value());
  EXPECT_EQ(t.Lookup("k")->locations.size(), 1u);
  EXPECT_EQ(t.Lookup("k")->primary().node_id, 1u);
}

TEST_P(RouteTableTest, CopiesJoinOnlyTheRoutedVersionAndPromoteWhenThePrimaryGoes) {
  RouteTable t(GetParam());
  t.Publish("k", Loc(1, 10, 7));
  EXPECT_FALSE(t.AddCopy("k", Loc(2, 20, 8)));  // another version: stale (T2)
  EXPECT_FALSE(t.AddCopy("absent", Loc(2, 20, 7)));
  EXPECT_TRUE(t.AddCopy("k", Loc(2, 20, 7, 4096)));
  EXPECT_TRUE(t.AddCopy("k", Loc(2, 20, 7, 4096)));   // the same copy again: one location
  EXPECT_FALSE(t.AddCopy("k", Loc(2, 20, 7, 8192)));  // one location per owner generation
  ASSERT_EQ(t.Lookup("k")->locations.size(), 2u);
  EXPECT_EQ(t.LocationsPerNode()[2], 1u);
  EXPECT_FALSE(t.RemoveLocation("k", 1, 11, 7));  // wrong generation: exact removal only
  EXPECT_TRUE(t.RemoveLocation("k", 1, 10, 7));
  ASSERT_TRUE(t.Lookup("k").has_value());
  EXPECT_EQ(t.Lookup("k")->primary().node_id, 2u);  // the copy is the primary now
  EXPECT_TRUE(t.RemoveLocation("k", 2, 20, 7));
  EXPECT_FALSE(t.Lookup("k").has_value());
  EXPECT_EQ(t.size(), 0u);
}

TEST_P(RouteTableTest, RemoveIfCopiedKeepsTheLastServingLocation) {
  RouteTable t(GetParam());
  t.Publish("k", Loc(1, 10, 7));
  const auto any = [](const RouteLocation&) { return true; };
  const auto none = [](const RouteLocation&) { return false; };
  // Alone: the value would leave the cluster.
  EXPECT_EQ(t.RemoveLocationIfCopied("k", 1, 10, 7, any), RouteTable::CopyRemoval::kSole);
  ASSERT_TRUE(t.AddCopy("k", Loc(2, 20, 7)));
  // A copy that does not serve (its owner is not live) is no copy.
  EXPECT_EQ(t.RemoveLocationIfCopied("k", 1, 10, 7, none), RouteTable::CopyRemoval::kSole);
  EXPECT_EQ(t.Lookup("k")->locations.size(), 2u);
  // Exact: another generation or put_id is not there.
  EXPECT_EQ(t.RemoveLocationIfCopied("k", 1, 11, 7, any), RouteTable::CopyRemoval::kAbsent);
  EXPECT_EQ(t.RemoveLocationIfCopied("k", 1, 10, 8, any), RouteTable::CopyRemoval::kAbsent);
  EXPECT_EQ(t.RemoveLocationIfCopied("k", 1, 10, 7, any), RouteTable::CopyRemoval::kRemoved);
  EXPECT_EQ(t.Lookup("k")->primary().node_id, 2u);
  // Of the last two copies removed this way, one stays.
  EXPECT_EQ(t.RemoveLocationIfCopied("k", 2, 20, 7, any), RouteTable::CopyRemoval::kSole);
  EXPECT_EQ(t.RemoveLocationIfCopied("missing", 2, 20, 7, any), RouteTable::CopyRemoval::kAbsent);
}

// Capacity counted once (P3): logical bytes count each value once, physical bytes every location;
// every change keeps the totals equal to a recount.
TEST_P(RouteTableTest, TotalsCountEachValueOnceAndEveryLocation) {
  RouteTable t(GetParam());
  auto expect = [&](uint64_t routes, uint64_t locations, uint64_t logical, uint64_t physical) {
    const RouteTable::Totals x = t.totals();
    EXPECT_EQ(x.routes, routes);
    EXPECT_EQ(x.locations, locations);
    EXPECT_EQ(x.logical_bytes, logical);
    EXPECT_EQ(x.physical_bytes, physical);
    uint64_t recount = 0;
    for (const auto& [node, u] : t.UsagePerNode()) recount += u.bytes;
    EXPECT_EQ(recount, physical);
  };
  t.Publish("a", Loc(1, 10, PutOf(1, 1)));
  t.Publish("a", Loc(1, 10, PutOf(1, 1)));  // a republish: nothing new
  t.Publish("b", Loc(1, 10, PutOf(1, 2)));
  expect(2, 2, 8192, 8192);
  ASSERT_TRUE(t.AddCopy("a", Loc(2, 20, PutOf(1, 1))));
  ASSERT_TRUE(t.AddCopy("a", Loc(2, 20, PutOf(1, 1))));  // the same copy again
  expect(2, 3, 8192, 12288);
  auto usage = t.UsagePerNode();
  EXPECT_EQ(usage[1].sole_bytes, 4096u);  // b only
  EXPECT_EQ(usage[2].sole_bytes, 0u);
  // A demotion's end: the source's location goes only while the copy stays.
  EXPECT_EQ(
      t.RemoveLocationIfCopied("a", 1, 10, PutOf(1, 1), [](const RouteLocation&) { return true; }),
      RouteTable::CopyRemoval::kRemoved);
  expect(2, 2, 8192, 8192);
  EXPECT_EQ(t.UsagePerNode()[2].sole_bytes, 4096u);
  // A republished higher version replaces the route: the old locations go with it.
  ASSERT_TRUE(t.AddCopy("b", Loc(3, 30, PutOf(1, 2))));
  RouteLocation newer = Loc(2, 20, PutOf(2, 5), 0, /*version=*/9);
  newer.len = 100;
  EXPECT_EQ(t.Publish("b", newer, PublishKind{.republish = true}),
            RouteTable::PublishOutcome::kReplaced);
  expect(2, 2, 4196, 4196);
  EXPECT_EQ(t.DropNode(2, 20), 2u);
  expect(0, 0, 0, 0);
}

TEST_P(RouteTableTest, DropNodeRemovesEveryLocationOfThatGeneration) {
  RouteTable t(GetParam());
  t.Publish("a", Loc(1, 10, 1));
  t.Publish("b", Loc(2, 20, 2));
  t.AddCopy("b", Loc(1, 10, 2));
  t.Publish("c", Loc(1, 11, 3));  // another generation of node 1
  EXPECT_EQ(t.DropNode(1, 10), 2u);
  EXPECT_FALSE(t.Lookup("a").has_value());
  ASSERT_TRUE(t.Lookup("b").has_value());
  EXPECT_EQ(t.Lookup("b")->locations.size(), 1u);
  EXPECT_TRUE(t.Lookup("c").has_value());
  EXPECT_EQ(t.size(), 2u);
  if (GetParam() == RouteKeys::kFull) {
    auto listed = t.ListByPrefix("", 10);
    ASSERT_TRUE(listed.ok());
    ASSERT_EQ(listed->size(), 2u);
    EXPECT_EQ((*listed)[0].first, "b");
  }
}

TEST(RouteTableFullKeys, ListByPrefixPagesInKeyOrderAndSaysWhetherMoreMatch) {
  RouteTable t(RouteKeys::kFull);
  for (int i = 99; i >= 0; --i) t.Publish(absl::StrFormat("p/%03d", i), Loc(1, 10, i + 1));
  t.Publish("q/0", Loc(1, 10, 500));
  std::vector<std::string> seen;
  std::string after;
  bool more = true;
  while (more) {
    auto page = *t.ListByPrefix("p/", 7, after, &more);
    ASSERT_LE(page.size(), 7u);
    ASSERT_FALSE(page.empty());
    for (const auto& [key, route] : page) seen.push_back(key);
    after = page.back().first;
  }
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[i], absl::StrFormat("p/%03d", i));
  auto last = *t.ListByPrefix("p/", 10, "p/090", &more);
  EXPECT_EQ(last.size(), 9u);
  EXPECT_FALSE(more);
}

// With fingerprints only the table holds no key bytes: it still tells keys apart (a key that was
// never routed misses, however close to a routed one) and refuses to list.
TEST(RouteTableFingerprints, KeysAreToldApartAndListingIsRefused) {
  RouteTable t(RouteKeys::kFingerprint);
  for (int i = 0; i < 10'000; ++i) {
    ASSERT_EQ(t.Publish(absl::StrFormat("k/%d", i), Loc(1, 10, i + 1)),
              RouteTable::PublishOutcome::kPublished);
  }
  EXPECT_EQ(t.size(), 10'000u);
  for (int i = 0; i < 10'000; ++i) {
    const auto r = t.Lookup(absl::StrFormat("k/%d", i));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->put_id(), static_cast<uint64_t>(i + 1));
    EXPECT_FALSE(t.Lookup(absl::StrFormat("k/%d ", i)).has_value());
  }
  const auto listed = t.ListByPrefix("k/", 10);
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Two tables draw different secrets: a fingerprint names a key only inside its process, and
// routing is the same whatever the draw.
TEST(RouteTableFingerprints, TablesAgreeOnRoutesWhateverTheirSecrets) {
  RouteTable a(RouteKeys::kFingerprint);
  RouteTable b(RouteKeys::kFingerprint);
  for (int i = 0; i < 1'000; ++i) {
    a.Publish(absl::StrFormat("x%d", i), Loc(1, 10, i + 1));
    b.Publish(absl::StrFormat("x%d", 999 - i), Loc(1, 10, 1'000 - i));
  }
  for (int i = 0; i < 1'000; ++i) {
    EXPECT_EQ(a.Lookup(absl::StrFormat("x%d", i))->put_id(),
              b.Lookup(absl::StrFormat("x%d", i))->put_id());
  }
}

// A value of 4 GiB or more does not fit a route's 32-bit len: refused, never truncated.
TEST_P(RouteTableTest, ALenOver32BitsIsRefused) {
  RouteTable t(GetParam());
  RouteLocation big = Loc(1, 10, PutOf(1, 1));
  big.len = kMaxRoutedValueBytes + 1;
  EXPECT_EQ(t.Publish("k", big), RouteTable::PublishOutcome::kRefused);
  EXPECT_FALSE(t.Lookup("k").has_value());
  big.len = kMaxRoutedValueBytes;
  EXPECT_EQ(t.Publish("k", big), RouteTable::PublishOutcome::kPublished);
  EXPECT_EQ(t.Lookup("k")->primary().len, kMaxRoutedValueBytes);
  RouteLocation copy = big;
  copy.node_id = 2;
  copy.len = kMaxRoutedValueBytes + 1;
  EXPECT_FALSE(t.AddCopy("k", copy));
  EXPECT_EQ(t.totals().physical_bytes, kMaxRoutedValueBytes);
}

INSTANTIATE_TEST_SUITE_P(KeyPolicies, RouteTableTest,
                         testing::Values(RouteKeys::kFull, RouteKeys::kFingerprint),
                         [](const testing::TestParamInfo<RouteKeys>& info) {
                           return info.param == RouteKeys::kFull ? "Full" : "Fingerprint";
                         });

}  // namespace
}  // namespace fluxon
