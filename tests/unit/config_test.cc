#include "fluxon/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

namespace fluxon {
namespace {

using ::testing::HasSubstr;

std::string Reject(const std::string& yaml) {
  absl::StatusOr<Config> c = ParseConfig(yaml);
  EXPECT_FALSE(c.ok()) << "accepted:\n" << yaml;
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(Config, EmptyConfigIsTheEmbeddedDefault) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->role, Role::kEmbedded);
  ASSERT_TRUE(c->owner.has_value());
  ASSERT_TRUE(c->master.has_value());
  EXPECT_EQ(c->owner->local_reserve.claim_soft_timeout.count(), 10);
  EXPECT_EQ(c->owner->local_reserve.claim_hard_timeout.count(), 30000);
  EXPECT_EQ(c->owner->segment.size_bytes, 4ull << 30);
}

TEST(Config, ParsesSizesAndExpectedCapacity) {
  auto c = ParseConfig(R"(
role: owner
owner:
  master_address: 10.0.0.1:50151
  segment: {size: 128GiB, numa_node: 0}
  local_reserve:
    expected_capacity: {value_len: 4718592, payload_capacity_bytes: 109951162777}
    claim_soft_timeout_ms: 20
    claim_hard_timeout_ms: 1000
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->owner->segment.size_bytes, 128ull << 30);
  EXPECT_EQ(c->owner->segment.numa_node, 0);
  EXPECT_EQ(c->owner->local_reserve.expected_capacity->value_len, 4718592u);
  EXPECT_FALSE(c->master.has_value());
  EXPECT_THAT(DumpConfig(*c), HasSubstr("prewarms 207 grants"));
}

TEST(Config, DumpRoundTrips) {
  auto c = ParseConfig("owner: {segment: {size: 2GiB, path: /dev/shm/x}}\nnode_id: 4\n");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string dumped = DumpConfig(*c);
  auto again = ParseConfig(dumped);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << dumped;
  EXPECT_EQ(DumpConfig(*again), dumped);
  EXPECT_EQ(again->owner->segment.path, "/dev/shm/x");
  EXPECT_EQ(again->node_id, 4u);
}

TEST(Config, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("1.5 GiB"), 3ull << 29);
  EXPECT_EQ(*ParseByteSize("2GB"), 2'000'000'000u);
  EXPECT_FALSE(ParseByteSize("lots").ok());
  EXPECT_FALSE(ParseByteSize("1.5").ok());
  EXPECT_FALSE(ParseByteSize("").ok());
}

TEST(ConfigRejects, NonPositiveSizes) {
  EXPECT_THAT(Reject("owner: {segment: {size: 0}}"), HasSubstr("owner.segment.size"));
  EXPECT_THAT(Reject("owner: {segment: {size: -1GiB}}"), HasSubstr("owner.segment.size"));
  EXPECT_THAT(Reject("owner: {segment: {size: 1MiB}}"), HasSubstr("owner.segment.size"));
  EXPECT_THAT(Reject("owner: {local_reserve: {expected_capacity: {value_len: 0, "
                     "payload_capacity_bytes: 1GiB}}}"),
              HasSubstr("owner.local_reserve.expected_capacity.value_len"));
  EXPECT_THAT(Reject("owner: {local_reserve: {expected_capacity: {value_len: 4096, "
                     "payload_capacity_bytes: 0}}}"),
              HasSubstr("payload_capacity_bytes"));
}

TEST(ConfigRejects, NonPositiveTimeouts) {
  EXPECT_THAT(Reject("owner: {local_reserve: {claim_soft_timeout_ms: 0}}"),
              HasSubstr("owner.local_reserve.claim_soft_timeout_ms"));
  EXPECT_THAT(Reject("owner: {local_reserve: {claim_hard_timeout_ms: -5}}"),
              HasSubstr("owner.local_reserve.claim_hard_timeout_ms"));
  EXPECT_THAT(Reject("owner: {local_reserve: {shrink_idle_ms: 0}}"),
              HasSubstr("owner.local_reserve.shrink_idle_ms"));
  EXPECT_THAT(Reject("master: {inflight_ttl_ms: 0}"), HasSubstr("master.inflight_ttl_ms"));
}

TEST(ConfigRejects, HardTimeoutNotAboveSoft) {
  EXPECT_THAT(Reject("owner: {local_reserve: {claim_soft_timeout_ms: 100, "
                     "claim_hard_timeout_ms: 100}}"),
              HasSubstr("owner.local_reserve.claim_hard_timeout_ms"));
  EXPECT_THAT(Reject("owner: {local_reserve: {claim_soft_timeout_ms: 100, "
                     "claim_hard_timeout_ms: 50}}"),
              HasSubstr("greater than claim_soft_timeout_ms"));
}

TEST(ConfigRejects, ValueOver512MiB) {
  EXPECT_THAT(Reject("owner: {segment: {size: 8GiB}, local_reserve: {expected_capacity: "
                     "{value_len: 513MiB, payload_capacity_bytes: 1GiB}}}"),
              HasSubstr("512 MiB"));
}

TEST(ConfigRejects, PrewarmLargerThanOwnerMemory) {
  // 207 grants (~111 GB) do not fit a 64 GiB segment.
  EXPECT_THAT(Reject("owner: {segment: {size: 64GiB}, local_reserve: {expected_capacity: "
                     "{value_len: 4718592, payload_capacity_bytes: 109951162777}}}"),
              HasSubstr("owner.local_reserve.expected_capacity: prewarm needs 207 grants"));
}

TEST(ConfigRejects, OwnerOnlyKeysOnMasterAndClient) {
  EXPECT_THAT(Reject("role: master\nowner: {segment: {size: 4GiB}}"),
              HasSubstr("owner: owner-only section is not allowed for role=master"));
  EXPECT_THAT(Reject("role: client\nowner: {local_reserve: {expected_capacity: "
                     "{value_len: 4096, payload_capacity_bytes: 1GiB}}}"),
              HasSubstr("role=client"));
  EXPECT_THAT(Reject("role: owner\nowner: {master_address: a:1}\nmaster: {}"), HasSubstr("master"));
  EXPECT_THAT(Reject("role: embedded\nclient: {socket_path: /x}"), HasSubstr("client"));
}

TEST(ConfigRejects, RatiosOutsideOpenUnitInterval) {
  for (const char* v : {"0", "1", "1.5", "-0.1"}) {
    EXPECT_THAT(Reject(std::string("owner: {hot_capacity_ratio: ") + v + "}"),
                HasSubstr("owner.hot_capacity_ratio: must lie in (0, 1)"));
  }
  EXPECT_THAT(Reject("master: {replica_cache_capacity_ratio: 1.0}"),
              HasSubstr("master.replica_cache_capacity_ratio"));
  EXPECT_TRUE(ParseConfig("owner: {hot_capacity_ratio: 0.5}").ok());
}

TEST(ConfigRejects, UnknownKeysRolesAndShapes) {
  EXPECT_THAT(Reject("owner: {segmnet: {size: 4GiB}}"), HasSubstr("owner.segmnet: unknown key"));
  EXPECT_THAT(Reject("rol: owner"), HasSubstr("rol: unknown key"));
  EXPECT_THAT(Reject("role: leader"), HasSubstr("role"));
  EXPECT_THAT(Reject("role: owner"), HasSubstr("owner.master_address"));
  EXPECT_THAT(Reject("owner: [1, 2]"), HasSubstr("owner: must be a mapping"));
  EXPECT_THAT(Reject("node_id: -3"), HasSubstr("node_id"));
  EXPECT_THAT(Reject("log_level: loud"), HasSubstr("log_level"));
  EXPECT_THAT(Reject("admin: {metrics_port: 70000}"), HasSubstr("admin.metrics_port"));
  EXPECT_THAT(Reject("owner: {segment: {size: 4GiB, huge_pages: maybe}}"),
              HasSubstr("owner.segment.huge_pages"));
  EXPECT_THAT(Reject("[not, a, map]"), HasSubstr("mapping"));
  EXPECT_THAT(Reject("owner: {segment: {size: 4GiB"), HasSubstr("YAML"));
}

TEST(Config, MetricsAddressDefaultsToLoopback) {
  auto c = ParseConfig("role: embedded");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->admin.metrics_address, "127.0.0.1");
  auto all = ParseConfig("admin: {metrics_address: 0.0.0.0, metrics_port: 9500}");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->admin.metrics_address, "0.0.0.0");
  auto again = ParseConfig(DumpConfig(*all));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->admin.metrics_address, "0.0.0.0");
  EXPECT_EQ(again->admin.metrics_port, 9500);
  EXPECT_THAT(Reject("admin: {metrics_address: ''}"), HasSubstr("admin.metrics_address"));
}

TEST(Config, LoadFileNamesThePath) {
  auto missing = LoadConfigFile("/nonexistent/fluxon.yaml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  const std::string path = ::testing::TempDir() + "/bad.yaml";
  std::ofstream(path) << "owner: {hot_capacity_ratio: 2}\n";
  auto bad = LoadConfigFile(path);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(path));
}

TEST(Config, ShippedSingleNodeConfigIsValid) {
  auto c = LoadConfigFile(std::string(FLUXON_SOURCE_DIR) + "/configs/single-node.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->role, Role::kEmbedded);
  EXPECT_EQ(DumpConfig(*c), DumpConfig(DefaultEmbeddedConfig()));
}

}  // namespace
}  // namespace fluxon
