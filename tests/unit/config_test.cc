#include "config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "fluxon/units.h"

namespace fluxon {
namespace {

using ::testing::HasSubstr;

std::string Reject(const std::string& yaml) {
  absl::StatusOr<Config> c = ParseConfig(yaml);
  EXPECT_FALSE(c.ok()) << "accepted:\n" << yaml;
  return c.ok() ? "" : std::string(c.status().message());
}

// A machine with 1 TiB of memory, so tests with big segments do not depend on the host.
constexpr MachineLimits kBigMachine{.physical_memory_bytes = 1ull << 40};

void ExpectAccepted(const std::string& yaml) {
  absl::StatusOr<Config> c = ParseConfig(yaml, kBigMachine);
  EXPECT_TRUE(c.ok()) << c.status() << "\n" << yaml;
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
)",
                       kBigMachine);
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
  // A fault point is a name: a trailing carriage return would not survive a dump and re-parse.
  EXPECT_THAT(Reject("faults: [{point: \"master.Lookup\\r\", action: fail}]"),
              HasSubstr("faults[0].point"));
}

TEST(ConfigRejects, HardTimeoutNotAboveSoft) {
  EXPECT_THAT(Reject("owner: {local_reserve: {claim_soft_timeout_ms: 100, "
                     "claim_hard_timeout_ms: 100}}"),
              HasSubstr("owner.local_reserve.claim_hard_timeout_ms"));
  EXPECT_THAT(Reject("owner: {local_reserve: {claim_soft_timeout_ms: 100, "
                     "claim_hard_timeout_ms: 50}}"),
              HasSubstr("greater than claim_soft_timeout_ms"));
}

TEST(Config, ParsesDemotion) {
  auto c = ParseConfig(R"(
role: owner
owner:
  master_address: 10.0.0.1:50151
  data_address: "127.0.0.1:0"
  demotion: {enabled: true, start_ratio: 0.8, max_bytes_in_flight: 64MiB,
             remote_budget_bytes: 2GiB, keep_fetched_copies: false}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->owner->demotion.enabled);
  EXPECT_FALSE(c->owner->demotion.keep_fetched_copies);
  EXPECT_TRUE(ParseConfig("")->owner->demotion.keep_fetched_copies);
  EXPECT_EQ(c->owner->demotion.remote_budget_bytes, 2ull << 30);
  EXPECT_DOUBLE_EQ(c->owner->demotion.start_ratio, 0.8);
  EXPECT_EQ(c->owner->demotion.max_bytes_in_flight, 64ull << 20);
  EXPECT_THAT(DumpConfig(*c), HasSubstr("demotion"));
  // Off by default, and one ranking with it.
  EXPECT_FALSE(ParseConfig("")->owner->demotion.enabled);
  EXPECT_EQ(ParseConfig("")->owner->demotion.remote_budget_bytes, 0u);
}

TEST(ConfigRejects, DemotionThatCannotRunAheadOfPressureOrHasNowhereToGo) {
  const std::string owner =
      "role: owner\nowner: {master_address: a:1, data_address: \"127.0.0.1:0\", ";
  EXPECT_THAT(Reject(owner + "demotion: {enabled: true, start_ratio: 0.95}}"),
              HasSubstr("owner.demotion.start_ratio"));
  EXPECT_THAT(Reject(owner + "hot_capacity_ratio: 0.8, demotion: {enabled: true}}"),
              HasSubstr("below owner.hot_capacity_ratio"));
  EXPECT_THAT(Reject(owner + "demotion: {enabled: true, max_bytes_in_flight: 0}}"),
              HasSubstr("owner.demotion.max_bytes_in_flight"));
  EXPECT_THAT(Reject(owner + "demotion: {enabled: true, speed: 2}}"), HasSubstr("unknown key"));
  // A remote budget ranks demoted values: without demotion it would be ignored.
  EXPECT_THAT(Reject(owner + "demotion: {remote_budget_bytes: 1GiB}}"),
              HasSubstr("needs owner.demotion.enabled: true"));
  // What one ranking does with a value fetched back: without a remote budget it would be ignored.
  EXPECT_THAT(Reject(owner + "demotion: {enabled: true, keep_fetched_copies: false}}"),
              HasSubstr("needs owner.demotion.remote_budget_bytes"));
  EXPECT_THAT(Reject(owner + "demotion: {enabled: true, remote_budget_bytes: -1}}"),
              HasSubstr("owner.demotion.remote_budget_bytes"));
  // The embedded default has no master to place a demotion, and no data plane to serve it.
  EXPECT_THAT(Reject("owner: {demotion: {enabled: true}}"), HasSubstr("owner.master_address"));
  EXPECT_THAT(Reject("role: owner\nowner: {master_address: a:1, demotion: {enabled: true}}"),
              HasSubstr("owner.data_address"));
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

TEST(Config, NewFieldsParseAndRoundTrip) {
  auto c = ParseConfig(R"(
role: embedded
owner:
  put_lease_ms: 1234
  view_lease_ms: 2345
  commit_wait_timeout_ms: 3456
  max_connections: 77
  hello_timeout_ms: 456
  frame_timeout_ms: 567
  heartbeat_interval_ms: 250
  register_timeout_ms: 789
master: {owner_lease_ms: 4000}
admin: {allow_mutations: true}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  const OwnerConfig& o = *c->owner;
  EXPECT_EQ(o.put_lease.count(), 1234);
  EXPECT_EQ(o.view_lease.count(), 2345);
  EXPECT_EQ(o.commit_wait_timeout.count(), 3456);
  EXPECT_EQ(o.max_connections, 77);
  EXPECT_EQ(o.hello_timeout.count(), 456);
  EXPECT_EQ(o.frame_timeout.count(), 567);
  EXPECT_EQ(o.heartbeat_interval.count(), 250);
  EXPECT_EQ(o.register_timeout.count(), 789);
  EXPECT_EQ(c->master->owner_lease.count(), 4000);
  EXPECT_TRUE(c->admin.allow_mutations);

  const std::string dumped = DumpConfig(*c);
  for (const char* line :
       {"put_lease_ms: 1234", "view_lease_ms: 2345", "commit_wait_timeout_ms: 3456",
        "max_connections: 77", "hello_timeout_ms: 456", "frame_timeout_ms: 567",
        "heartbeat_interval_ms: 250", "register_timeout_ms: 789", "owner_lease_ms: 4000",
        "allow_mutations: true"}) {
    EXPECT_THAT(dumped, HasSubstr(line));
  }
  auto again = ParseConfig(dumped);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << dumped;
  EXPECT_EQ(DumpConfig(*again), dumped);
  EXPECT_EQ(again->owner->view_lease.count(), 2345);
  EXPECT_EQ(again->master->owner_lease.count(), 4000);
  EXPECT_TRUE(again->admin.allow_mutations);

  auto client =
      ParseConfig("role: client\nclient: {socket_path: /tmp/x.sock, call_timeout_ms: 42}");
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(client->client->call_timeout.count(), 42);
  auto client_again = ParseConfig(DumpConfig(*client));
  ASSERT_TRUE(client_again.ok()) << client_again.status();
  EXPECT_EQ(client_again->client->call_timeout.count(), 42);
  EXPECT_EQ(client_again->client->socket_path, "/tmp/x.sock");
}

TEST(Config, MasterRouteKeysAreFullOrFingerprint) {
  auto d = ParseConfig("");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->master->route_keys, "full");
  auto f = ParseConfig("role: master\nmaster: {route_keys: fingerprint}\n");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->master->route_keys, "fingerprint");
  EXPECT_THAT(Reject("role: master\nmaster: {route_keys: hashed}\n"),
              HasSubstr("master.route_keys: must be one of full"));
}

TEST(Config, NewFieldDefaultsMatchTheHeader) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  const OwnerConfig defaults;
  EXPECT_EQ(c->owner->put_lease, defaults.put_lease);
  EXPECT_EQ(c->owner->max_connections, defaults.max_connections);
  EXPECT_EQ(c->owner->heartbeat_interval, defaults.heartbeat_interval);
  EXPECT_EQ(c->master->owner_lease, MasterConfig{}.owner_lease);
  EXPECT_FALSE(c->admin.allow_mutations);
  EXPECT_THAT(Reject("admin: {allow_mutations: perhaps}"), HasSubstr("admin.allow_mutations"));
}

// Every *_ms key, with the section it lives in and a role that has that section.
struct MsKey {
  const char* role;
  const char* section;  // dotted path of the mapping holding the key
  const char* key;
};
constexpr MsKey kMsKeys[] = {
    {"embedded", "owner.local_reserve", "claim_soft_timeout_ms"},
    {"embedded", "owner.local_reserve", "shrink_idle_ms"},
    {"embedded", "owner", "eviction_interval_ms"},
    {"embedded", "owner", "handle_ttl_ms"},
    {"embedded", "owner", "put_lease_ms"},
    {"embedded", "owner", "view_lease_ms"},
    {"embedded", "owner", "commit_wait_timeout_ms"},
    {"embedded", "owner", "hello_timeout_ms"},
    {"embedded", "owner", "frame_timeout_ms"},
    {"owner", "owner", "heartbeat_interval_ms"},
    {"owner", "owner", "register_timeout_ms"},
    {"embedded", "master", "inflight_ttl_ms"},
    {"embedded", "master", "owner_lease_ms"},
    {"client", "client", "call_timeout_ms"},
};

// YAML setting `section.key: value` (nested block mappings), plus what the role needs.
std::string MsYaml(const MsKey& k, const std::string& value) {
  std::string yaml = std::string("role: ") + k.role + "\n";
  const std::string section = k.section;
  std::string indent;
  size_t start = 0;
  while (true) {
    const size_t dot = section.find('.', start);
    yaml += indent + section.substr(start, dot - start) + ":\n";
    indent += "  ";
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (std::string(k.role) == "owner") yaml += indent + "master_address: '10.0.0.1:50151'\n";
  // claim_hard_timeout_ms must stay above claim_soft_timeout_ms.
  if (std::string(k.key) == "claim_soft_timeout_ms") yaml += indent + "claim_hard_timeout_ms: 1\n";
  return yaml + indent + k.key + ": " + value + "\n";
}

TEST(ConfigRejects, MillisecondSettingsAboveTheMaximum) {
  ASSERT_EQ(kMaxSettingMs, 86'400'000);
  const std::string max = std::to_string(kMaxSettingMs);
  const std::string over = std::to_string(kMaxSettingMs + 1);
  for (const MsKey& k : kMsKeys) {
    const std::string name = std::string(k.section) + "." + k.key;
    SCOPED_TRACE(name);
    const std::string at_max = MsYaml(k, max);
    if (std::string(k.key) == "claim_soft_timeout_ms") {
      // The soft timeout itself is accepted at the maximum; only the hard one above it is not.
      EXPECT_THAT(Reject(at_max), HasSubstr("owner.local_reserve.claim_hard_timeout_ms: must be "
                                            "greater than claim_soft_timeout_ms (86400000)"));
    } else {
      ExpectAccepted(at_max);
    }
    for (const std::string& bad :
         {over, std::string("9223372036854775807"), std::string("99999999999999999999999")}) {
      EXPECT_THAT(Reject(MsYaml(k, bad)),
                  HasSubstr(name + ": must be at most 86400000 ms (24 h), got " + bad));
    }
    EXPECT_THAT(Reject(MsYaml(k, "-99999999999999999999999")), HasSubstr(name + ": must be > 0"));
    EXPECT_THAT(Reject(MsYaml(k, "soon")), HasSubstr(name + ": must be an integer"));
  }
  // The hard claim timeout (checked against soft) has the same bound.
  ExpectAccepted("owner: {local_reserve: {claim_hard_timeout_ms: " + max + "}}");
  EXPECT_THAT(Reject("owner: {local_reserve: {claim_hard_timeout_ms: " + over + "}}"),
              HasSubstr("owner.local_reserve.claim_hard_timeout_ms: must be at most 86400000 ms"));
}

TEST(ConfigRejects, HandleTtlInt64MaxOverflow) {
  EXPECT_THAT(Reject("owner: {handle_ttl_ms: 9223372036854775807}"),
              HasSubstr("owner.handle_ttl_ms: must be at most 86400000 ms (24 h)"));
}

TEST(ConfigRejects, FaultDelayBounds) {
  const std::string fault = "faults: [{point: p, action: delay, delay_ms: ";
  ExpectAccepted(fault + "0}]");
  ExpectAccepted(fault + std::to_string(kMaxSettingMs) + "}]");
  EXPECT_THAT(Reject(fault + std::to_string(kMaxSettingMs + 1) + "}]"),
              HasSubstr("faults[0].delay_ms: must be at most 86400000 ms (24 h)"));
  EXPECT_THAT(Reject(fault + "9223372036854775807}]"),
              HasSubstr("faults[0].delay_ms: must be at most 86400000 ms"));
  EXPECT_THAT(Reject(fault + "-1}]"), HasSubstr("faults[0].delay_ms: must be >= 0"));
  EXPECT_THAT(Reject("faults: [{point: p, action: fail, count: 4294967296}]"),
              HasSubstr("faults[0].count"));
  auto c = ParseConfig(fault + "25, count: 3}]");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->faults.size(), 1u);
  EXPECT_EQ(c->faults[0].delay.count(), 25);
  auto again = ParseConfig(DumpConfig(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->faults[0].delay.count(), 25);
  EXPECT_EQ(again->faults[0].count, 3);
}

TEST(ConfigRejects, MaxConnectionsOutsideRange) {
  ExpectAccepted("owner: {max_connections: 1}");
  ExpectAccepted("owner: {max_connections: 65536}");
  for (const char* v : {"0", "-1", "65537", "9223372036854775807"}) {
    EXPECT_THAT(Reject(std::string("owner: {max_connections: ") + v + "}"),
                HasSubstr("owner.max_connections: must be in [1, 65536]"));
  }
  EXPECT_THAT(Reject("owner: {max_connections: lots}"),
              HasSubstr("owner.max_connections: must be an integer"));
}

TEST(ConfigRejects, ConnectionTimeoutsNotPositive) {
  for (const char* key : {"hello_timeout_ms", "frame_timeout_ms", "put_lease_ms", "view_lease_ms",
                          "commit_wait_timeout_ms", "heartbeat_interval_ms"}) {
    for (const char* v : {"0", "-1"}) {
      EXPECT_THAT(Reject(std::string("owner: {") + key + ": " + v + "}"),
                  HasSubstr(std::string("owner.") + key + ": must be > 0 ms"));
    }
  }
  EXPECT_THAT(Reject("master: {owner_lease_ms: 0}"), HasSubstr("master.owner_lease_ms"));
  EXPECT_THAT(Reject("role: client\nclient: {call_timeout_ms: 0}"),
              HasSubstr("client.call_timeout_ms: must be > 0 ms"));
}

TEST(ConfigRejects, HeartbeatNotBelowOwnerLease) {
  ExpectAccepted("owner: {heartbeat_interval_ms: 4999}\nmaster: {owner_lease_ms: 5000}");
  EXPECT_THAT(Reject("owner: {heartbeat_interval_ms: 5000}\nmaster: {owner_lease_ms: 5000}"),
              HasSubstr("owner.heartbeat_interval_ms: must be less than master.owner_lease_ms "
                        "(5000 ms), got 5000 ms"));
  // Against the default lease (5000 ms) too.
  EXPECT_THAT(Reject("owner: {heartbeat_interval_ms: 6000}"),
              HasSubstr("owner.heartbeat_interval_ms: must be less than master.owner_lease_ms"));
  EXPECT_THAT(Reject("master: {owner_lease_ms: 1000}"), HasSubstr("owner.heartbeat_interval_ms"));
  // role=owner: the master (and its lease) live elsewhere; nothing to compare against.
  ExpectAccepted(
      "role: owner\nowner: {master_address: '10.0.0.1:50151', heartbeat_interval_ms: "
      "60000}");
}

TEST(ConfigRejects, SegmentLargerThanPhysicalMemory) {
  const MachineLimits small{.physical_memory_bytes = 8ull << 30};
  EXPECT_TRUE(ParseConfig("owner: {segment: {size: 8GiB}}", small).ok());
  auto over = ParseConfig("owner: {segment: {size: 9GiB}}", small);
  ASSERT_FALSE(over.ok());
  EXPECT_THAT(std::string(over.status().message()),
              HasSubstr("owner.segment.size: 9663676416 bytes (9.0 GiB) is larger than this "
                        "machine's physical memory, 8589934592 bytes (8.0 GiB)"));
  // Unknown memory (0): not checked.
  EXPECT_TRUE(ParseConfig("owner: {segment: {size: 9GiB}}", MachineLimits{}).ok());
  // This machine: no test host has 1 PiB.
  EXPECT_GT(ThisMachineLimits().physical_memory_bytes, 0u);
  EXPECT_THAT(Reject("owner: {segment: {size: 1024TiB}}"),
              HasSubstr("owner.segment.size: 1125899906842624 bytes"));
  EXPECT_THAT(Reject("owner: {segment: {size: 1024TiB}}"), HasSubstr("physical memory"));
}

TEST(ConfigRejects, SocketPathTooLong) {
  const std::string base = "/tmp/";
  const std::string p107 = base + std::string(107 - base.size(), 'a');
  const std::string p108 = base + std::string(108 - base.size(), 'a');
  ASSERT_EQ(p107.size(), 107u);
  auto ok = ParseConfig("owner: {socket_path: " + p107 + "}");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->owner->socket_path, p107);
  EXPECT_THAT(Reject("owner: {socket_path: " + p108 + "}"),
              HasSubstr("owner.socket_path: is 108 bytes; a Unix socket path must be shorter "
                        "than 108 bytes"));
  EXPECT_TRUE(ParseConfig("role: client\nclient: {socket_path: " + p107 + "}").ok());
  EXPECT_THAT(Reject("role: client\nclient: {socket_path: " + p108 + "}"),
              HasSubstr("client.socket_path: is 108 bytes"));
  EXPECT_THAT(Reject("role: client\nclient: {socket_path: ''}"),
              HasSubstr("client.socket_path: must not be empty"));
  EXPECT_THAT(Reject("owner: {socket_path: ''}"),
              HasSubstr("owner.socket_path: must not be empty"));
}

// Every control character in a string setting survives the dump (ParseConfig -> DumpConfig ->
// ParseConfig gives the same value and the same dump): a carriage return written plain read back
// as a line break.
TEST(ConfigDump, ControlCharactersInStringsRoundTrip) {
  for (int ch = 1; ch < 0x80; ++ch) {
    if (ch >= 0x20 && ch != 0x7f) continue;
    const std::string value = "/tmp/a" + std::string(1, static_cast<char>(ch)) + "b";
    const std::string yaml = absl::StrFormat("owner:\n  socket_path: \"/tmp/a\\x%02xb\"\n", ch);
    absl::StatusOr<Config> c = ParseConfig(yaml, kBigMachine);
    ASSERT_TRUE(c.ok()) << ch << ": " << c.status();
    ASSERT_EQ(c->owner->socket_path, value) << ch;
    const std::string dump = DumpConfig(*c);
    absl::StatusOr<Config> again = ParseConfig(dump, kBigMachine);
    ASSERT_TRUE(again.ok()) << ch << ": " << again.status() << "\n" << dump;
    EXPECT_EQ(again->owner->socket_path, value) << ch;
    EXPECT_EQ(DumpConfig(*again), dump) << ch;
  }
  // The fuzzer's input: two carriage returns at the end of a plain scalar.
  absl::StatusOr<Config> c = ParseConfig("owner:\n  socket_path: /\r\r ", kBigMachine);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Config> again = ParseConfig(DumpConfig(*c), kBigMachine);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->owner->socket_path, c->owner->socket_path);
  EXPECT_EQ(DumpConfig(*again), DumpConfig(*c));
}

TEST(Config, AcceptsListenAddresses) {
  for (const char* a : {"127.0.0.1:0", "0.0.0.0:50151", "localhost:50151", "[::1]:50151", "[::]:0",
                        "host-1.example.com:65535", "10.0.0.1:1"}) {
    SCOPED_TRACE(a);
    ExpectAccepted(std::string("master: {listen_address: '") + a + "'}");
    ExpectAccepted(std::string("admin: {listen_address: '") + a + "'}");
  }
  for (const char* a : {"10.0.0.1:50151", "localhost:50151", "[::1]:50151", "master-0:1"}) {
    SCOPED_TRACE(a);
    ExpectAccepted(std::string("role: owner\nowner: {master_address: '") + a + "'}");
  }
}

TEST(ConfigRejects, BadAddresses) {
  const char* kBad[] = {
      "127.0.0.1",   "127.0.0.1:99999", ":",         "host:abc", "",
      ":50151",      "127.0.0.1:",      "::1:50151", "[::1]",    "[::1",
      "[zz]:50151",  "-bad:1",          "a..b:1",    "a b:1",    "1.2.3.4.5:1",
      "999.0.0.1:1", "host:-1",         "host:+80",  "host:1 ",  "host:000000080"};
  for (const char* a : kBad) {
    SCOPED_TRACE(a);
    EXPECT_THAT(Reject(std::string("master: {listen_address: '") + a + "'}"),
                HasSubstr("master.listen_address: "));
    EXPECT_THAT(Reject(std::string("admin: {listen_address: '") + a + "'}"),
                HasSubstr("admin.listen_address: "));
  }
  EXPECT_THAT(Reject("master: {listen_address: '127.0.0.1'}"),
              HasSubstr("master.listen_address: '127.0.0.1' is not host:port (no :port)"));
  EXPECT_THAT(Reject("master: {listen_address: '127.0.0.1:99999'}"),
              HasSubstr("port 99999 is not in [0, 65535]"));
  EXPECT_THAT(Reject("master: {listen_address: 'host:abc'}"),
              HasSubstr("port 'abc' is not a number in [0, 65535]"));
  EXPECT_THAT(Reject("master: {listen_address: '::1:50151'}"), HasSubstr("[::1]:50151"));
  EXPECT_THAT(Reject("master: {listen_address: ''}"),
              HasSubstr("master.listen_address: must not be empty"));
  // master_address, when set, names the peer: same syntax, and port 0 means nothing there.
  for (const char* a : kBad) {
    if (std::string(a).empty()) continue;  // empty is "unset", reported as required below
    SCOPED_TRACE(a);
    EXPECT_THAT(Reject(std::string("role: owner\nowner: {master_address: '") + a + "'}"),
                HasSubstr("owner.master_address: "));
  }
  EXPECT_THAT(Reject("role: owner\nowner: {master_address: '10.0.0.1:0'}"),
              HasSubstr("owner.master_address: '10.0.0.1:0' is not host:port (port 0 is only"));
  EXPECT_THAT(Reject("role: owner\nowner: {master_address: ''}"),
              HasSubstr("owner.master_address: is required"));
  // Embedded roles may still name a master_address; it is checked when set.
  EXPECT_THAT(Reject("owner: {master_address: 'nope'}"), HasSubstr("owner.master_address"));
}

TEST(ConfigRejects, BadMetricsAddress) {
  for (const char* a : {"127.0.0.1", "0.0.0.0", "::1", "::", "10.1.2.3"}) {
    SCOPED_TRACE(a);
    ExpectAccepted(std::string("admin: {metrics_address: '") + a + "'}");
  }
  for (const char* a : {"127.0.0.1:9464", "localhost", "[::1]", "999.1.1.1", "a b", ":"}) {
    SCOPED_TRACE(a);
    EXPECT_THAT(Reject(std::string("admin: {metrics_address: '") + a + "'}"),
                HasSubstr("admin.metrics_address: '" + std::string(a) + "' is not an IP address"));
  }
}

TEST(ConfigRejects, DuplicateKeys) {
  EXPECT_THAT(Reject("node_id: 1\nnode_id: 2\n"), HasSubstr("config: key node_id appears twice"));
  EXPECT_THAT(Reject("owner:\n  handle_ttl_ms: 1000\n  handle_ttl_ms: 2000\n"),
              HasSubstr("config: key owner.handle_ttl_ms appears twice"));
  EXPECT_THAT(Reject("owner:\n  local_reserve:\n    shrink_idle_ms: 1\n    shrink_idle_ms: 1\n"),
              HasSubstr("config: key owner.local_reserve.shrink_idle_ms appears twice"));
  EXPECT_THAT(Reject("owner: {segment: {size: 1GiB}}\nowner: {segment: {size: 2GiB}}\n"),
              HasSubstr("config: key owner appears twice"));
  EXPECT_THAT(Reject("faults:\n- {point: a, action: fail}\n- {point: b, action: fail, count: 1, "
                     "count: 2}\n"),
              HasSubstr("config: key faults[1].count appears twice"));
  // The same key in two different mappings is fine.
  ExpectAccepted(
      "owner: {socket_path: /tmp/a.sock}\nmaster: {listen_address: '127.0.0.1:0'}\n"
      "admin: {listen_address: '127.0.0.1:0'}");
}

TEST(Config, ShippedConfigsPassCheck) {
  for (const char* name : {"/configs/single-node.yaml", "/tests/configs/prewarm.yaml"}) {
    auto c = LoadConfigFile(std::string(FLUXON_SOURCE_DIR) + name);
    EXPECT_TRUE(c.ok()) << name << ": " << c.status();
  }
  auto overflow =
      LoadConfigFile(std::string(FLUXON_SOURCE_DIR) + "/tests/configs/overflow_ms.yaml");
  ASSERT_FALSE(overflow.ok());
  EXPECT_THAT(std::string(overflow.status().message()),
              HasSubstr("owner.handle_ttl_ms: must be at most 86400000 ms (24 h)"));
}

}  // namespace
}  // namespace fluxon

namespace fluxon {
namespace {

TEST(Config, DataPlaneAddressAndTransports) {
  auto c =
      ParseConfig("role: embedded\nowner: {data_address: \"127.0.0.1:0\", transports: [tcp]}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->owner->data_address, "127.0.0.1:0");
  ASSERT_EQ(c->owner->transports.size(), 1u);
  auto again = ParseConfig(DumpConfig(*c));
  ASSERT_TRUE(again.ok()) << again.status() << DumpConfig(*c);
  EXPECT_EQ(again->owner->data_address, "127.0.0.1:0");
  EXPECT_EQ(again->owner->transports, std::vector<std::string>{"tcp"});
  auto d = ParseConfig("role: embedded\n");
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->owner->data_address.empty());  // off by default
  EXPECT_EQ(d->owner->transports, std::vector<std::string>{"tcp"});
}

TEST(ConfigRejects, BadDataPlaneSettings) {
  for (const char* owner :
       {"{data_address: \"127.0.0.1\"}", "{data_address: \"host:99999\"}", "{transports: []}",
        "{transports: [tcp, tcp]}", "{transports: [carrier-pigeon]}", "{transports: [rdma]}",
        "{transports: tcp}"}) {
    auto c = ParseConfig(std::string("role: embedded\nowner: ") + owner + "\n");
    EXPECT_FALSE(c.ok()) << owner;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << owner;
  }
  auto rdma = ParseConfig("role: embedded\nowner: {transports: [rdma]}\n");
  EXPECT_NE(std::string(rdma.status().message()).find("owner.transports"), std::string::npos);
}

// Found by fuzz/config_fuzzer: a socket path holding bytes that are not UTF-8 was accepted (107
// bytes, under the 108-byte limit), but DumpConfig writes each such byte as U+FFFD (3 bytes), so
// the dumped config (what --check-config prints) named another path, 136 bytes long, which
// ParseConfig then refused. Non-UTF-8 text is now refused up front with the offending byte.
TEST(ConfigRejects, TextThatIsNotUtf8) {
  const std::string crash = "role: client\nclient:\n  socket_path: /tmp/flux" +
                            std::string(36, '\x04') + "1" + std::string(20, '\x04') +
                            std::string(14, '\xff') + "\xf6" + std::string(8, '\xff') + "0\n";
  EXPECT_THAT(Reject(crash), HasSubstr("not UTF-8"));
  EXPECT_THAT(Reject("role: client\nclient:\n  socket_path: /tmp/a\xff.sock\n"),
              HasSubstr("byte 42 (0xff)"));
  EXPECT_THAT(Reject("log_level: info # \xc0\xaf overlong\n"), HasSubstr("not UTF-8"));
  EXPECT_THAT(Reject("log_level: info # \xed\xa0\x80 surrogate\n"), HasSubstr("not UTF-8"));
  EXPECT_THAT(Reject("log_level: info # \xe2\x82 cut\n"), HasSubstr("not UTF-8"));
  // UTF-8 (and control characters, which the emitter escapes) round-trips through the dump.
  for (const std::string& path :
       std::vector<std::string>{"/tmp/fl\xc3\xbcxon-\xe2\x82\xac-\xf0\x9f\x98\x80.sock",
                                "/tmp/flux" + std::string(20, '\x04') + ".sock"}) {
    absl::StatusOr<Config> c =
        ParseConfig("role: client\nclient:\n  socket_path: \"" + path + "\"\n");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->client->socket_path, path);
    absl::StatusOr<Config> again = ParseConfig(DumpConfig(*c));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->client->socket_path, path);
  }
}

}  // namespace
}  // namespace fluxon

namespace fluxon {
namespace {

TEST(ConfigSecurity, ParsesDumpsAndRequiresAllThreeTlsFiles) {
  auto c = ParseConfig(
      "security:\n  tls: {cert_file: /n.pem, key_file: /n.key, ca_file: /ca.pem}\n"
      "  cluster_secret_file: /s\n  insecure: true\n");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->security.tls.has_value());
  EXPECT_EQ(c->security.tls->cert_file, "/n.pem");
  EXPECT_EQ(c->security.tls->key_file, "/n.key");
  EXPECT_EQ(c->security.tls->ca_file, "/ca.pem");
  EXPECT_EQ(c->security.cluster_secret_file, "/s");
  EXPECT_TRUE(c->security.insecure);
  auto again = ParseConfig(DumpConfig(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->security.tls->ca_file, "/ca.pem");
  EXPECT_EQ(again->security.cluster_secret_file, "/s");
  EXPECT_TRUE(again->security.insecure);
  EXPECT_FALSE(ParseConfig("")->security.tls.has_value());

  EXPECT_THAT(Reject("security: {tls: {cert_file: /n.pem, key_file: /n.key}}"),
              HasSubstr("security.tls.ca_file: is required"));
  EXPECT_THAT(Reject("security: {tls: {cert_file: /n.pem, ca_file: /c, key_file: ''}}"),
              HasSubstr("security.tls.key_file: is required"));
  EXPECT_THAT(Reject("security: {tls: {cert_file: a, key_file: b, ca_file: c, crl: d}}"),
              HasSubstr("security.tls.crl: unknown key"));
  EXPECT_THAT(Reject("security: {cluster_secret_file: ''}"),
              HasSubstr("security.cluster_secret_file: must not be empty"));
  EXPECT_THAT(Reject("security: {insecure: maybe}"), HasSubstr("security.insecure"));
  EXPECT_THAT(Reject("role: client\nsecurity: {insecure: true}"), HasSubstr("security"));
}

TEST(ConfigSecurity, NetworkReachableListenersNeedTlsOrASecretOrInsecure) {
  auto check = [](const std::string& yaml) {
    auto c = ParseConfig(yaml);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? CheckListenSecurity(*c) : c.status();
  };
  const std::string tls = "security: {tls: {cert_file: a, key_file: b, ca_file: c}}\n";
  // Loopback everywhere (the defaults): fine without anything.
  EXPECT_TRUE(check("").ok());
  EXPECT_TRUE(check("admin: {listen_address: 'localhost:0'}\nmaster: {listen_address: "
                    "'[::1]:0'}\nowner: {data_address: '127.0.0.2:0'}")
                  .ok());
  for (const char* a : {"0.0.0.0:0", "[::]:1", "10.1.2.3:50152", "node-7.example.com:1"}) {
    SCOPED_TRACE(a);
    absl::Status s = check(std::string("admin: {listen_address: '") + a + "'}");
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(s.message()), HasSubstr("admin.listen_address"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("security.insecure"));
    EXPECT_THAT(std::string(check(std::string("master: {listen_address: '") + a + "'}").message()),
                HasSubstr("master.listen_address"));
    EXPECT_TRUE(check(std::string("admin: {listen_address: '") + a + "'}\n" + tls).ok());
    EXPECT_TRUE(
        check(std::string("admin: {listen_address: '") + a + "'}\nsecurity: {insecure: true}")
            .ok());
    // The data plane needs the cluster secret; TLS alone does not cover it.
    const std::string data = std::string("owner: {data_address: '") + a + "'}\n";
    EXPECT_THAT(std::string(check(data + tls).message()), HasSubstr("owner.data_address"));
    EXPECT_TRUE(check(data + "security: {cluster_secret_file: /s}").ok());
  }
  // An owner dialing a master elsewhere listens on nothing reachable: no refusal.
  EXPECT_TRUE(check("role: owner\nowner: {master_address: '10.0.0.1:50151'}").ok());
}

TEST(ConfigSecurity, LoopbackHosts) {
  for (const char* h : {"localhost", "LOCALHOST", "127.0.0.1", "127.9.8.7", "::1", "[::1]"}) {
    EXPECT_TRUE(IsLoopbackHost(h)) << h;
  }
  for (const char* h : {"0.0.0.0", "::", "[::]", "128.0.0.1", "10.0.0.1", "localhost.example",
                        "::ffff:127.0.0.1", ""}) {
    EXPECT_FALSE(IsLoopbackHost(h)) << h;
  }
  EXPECT_EQ(HostOfAddress("[::1]:5"), "::1");
  EXPECT_EQ(HostOfAddress("a.b:5"), "a.b");
  EXPECT_EQ(HostOfAddress("10.0.0.1:0"), "10.0.0.1");
  for (const char* h : {"0.0.0.0", "::", "[::]", ""}) EXPECT_TRUE(IsWildcardHost(h)) << h;
  for (const char* h : {"127.0.0.1", "::1", "10.0.0.1", "a.b"})
    EXPECT_FALSE(IsWildcardHost(h)) << h;
  EXPECT_EQ(JoinHostPort("10.0.0.1", 5), "10.0.0.1:5");
  EXPECT_EQ(JoinHostPort("::1", 5), "[::1]:5");
  EXPECT_EQ(JoinHostPort(HostOfAddress("[fe80::2]:7"), 7), "[fe80::2]:7");
}

// The settings reference in docs/settings.md is the schema's (config/settings.h): a setting added,
// renamed or re-defaulted there without regenerating the file fails here.
TEST(Config, ReplicaPlacementParsesDumpsAndDefaults) {
  auto d = ParseConfig("");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->master->replica_task_placement.remote_only_node_roles,
            std::vector<std::string>{"remote_cache"});
  EXPECT_FALSE(d->master->replica_task_placement.restrict_to_remote_only_node_roles);
  const std::string yaml =
      "role: master\nmaster:\n  replica_task_placement:\n"
      "    remote_only_node_roles: [remote_cache, owner]\n"
      "    restrict_to_remote_only_node_roles: true\n";
  auto c = ParseConfig(yaml);
  ASSERT_TRUE(c.ok()) << c.status();
  const ReplicaPlacementConfig& p = c->master->replica_task_placement;
  EXPECT_TRUE(p.restrict_to_remote_only_node_roles);
  EXPECT_EQ(p.remote_only_node_roles, (std::vector<std::string>{"remote_cache", "owner"}));
  auto again = ParseConfig(DumpConfig(*c));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << DumpConfig(*c);
  EXPECT_EQ(again->master->replica_task_placement.remote_only_node_roles, p.remote_only_node_roles);
  EXPECT_TRUE(again->master->replica_task_placement.restrict_to_remote_only_node_roles);
}

TEST(ConfigRejects, BadReplicaPlacement) {
  EXPECT_THAT(Reject("master: {replica_task_placement: {remote_only_node_roles: [gpu]}}"),
              HasSubstr("master.replica_task_placement.remote_only_node_roles"));
  EXPECT_THAT(Reject("master: {replica_task_placement: {remote_only_node_roles: remote_cache}}"),
              HasSubstr("must be a list"));
  EXPECT_THAT(Reject("master: {replica_task_placement: {remote_only_node_roles: [owner, owner]}}"),
              HasSubstr("listed twice"));
  EXPECT_THAT(Reject("master: {replica_task_placement: {remote_only_node_roles: [], "
                     "restrict_to_remote_only_node_roles: true}}"),
              HasSubstr("restrict_to_remote_only_node_roles"));
  EXPECT_THAT(Reject("master: {replica_task_placement: {restrict: true}}"),
              HasSubstr("master.replica_task_placement.restrict: unknown key"));
  EXPECT_THAT(Reject("role: owner\nowner: {master_address: '127.0.0.1:1'}\n"
                     "master: {replica_task_placement: {}}"),
              HasSubstr("master"));
}

TEST(Config, ElectionParsesDumpsAndReplacesTheMasterAddress) {
  auto m = ParseConfig(
      "role: master\nelection: {endpoints: ['127.0.0.1:2379', '127.0.0.2:2379'], "
      "key: /fluxon/c1/master/leader, lease_ttl_s: 3, poll_interval_ms: 50, "
      "advertise_address: 'm1.example:50151'}\n");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->election.has_value());
  EXPECT_EQ(m->election->endpoints, (std::vector<std::string>{"127.0.0.1:2379", "127.0.0.2:2379"}));
  EXPECT_EQ(m->election->key, "/fluxon/c1/master/leader");
  EXPECT_EQ(m->election->lease_ttl_s, 3);
  EXPECT_EQ(m->election->poll_interval, std::chrono::milliseconds(50));
  EXPECT_EQ(m->election->advertise_address, "m1.example:50151");
  auto again = ParseConfig(DumpConfig(*m));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << DumpConfig(*m);
  EXPECT_EQ(DumpConfig(*again), DumpConfig(*m));
  // An owner follows the election instead of naming a master; defaults fill the rest.
  auto o = ParseConfig("role: owner\nelection: {endpoints: ['etcd.local:2379']}\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->election->key, "/fluxon/default/master/leader");
  EXPECT_EQ(o->election->lease_ttl_s, 5);
  EXPECT_TRUE(o->owner->master_address.empty());
  // Without the section there is no election.
  EXPECT_FALSE(ParseConfig("role: master\n")->election.has_value());
}

TEST(ConfigRejects, BadElection) {
  const std::string e = "election: {endpoints: ['127.0.0.1:2379']";
  EXPECT_THAT(Reject(e + "}\n"), HasSubstr("election: is for roles master, owner"));
  EXPECT_THAT(Reject("role: client\n" + e + "}\n"), HasSubstr("not role=client"));
  EXPECT_THAT(Reject("role: master\nelection: {key: /k}\n"),
              HasSubstr("election.endpoints: is required"));
  EXPECT_THAT(Reject("role: master\nelection: {endpoints: []}\n"),
              HasSubstr("election.endpoints: must be a non-empty list"));
  EXPECT_THAT(Reject("role: master\nelection: {endpoints: ['127.0.0.1']}\n"),
              HasSubstr("no :port"));
  EXPECT_THAT(Reject("role: master\nelection: {endpoints: ['127.0.0.1:0']}\n"),
              HasSubstr("election.endpoints"));
  EXPECT_THAT(Reject("role: master\nelection: {endpoints: ['127.0.0.1:1', 'etcd.local:2']}\n"),
              HasSubstr("IPv4 address:port"));
  EXPECT_THAT(Reject("role: master\nelection: {endpoints: ['127.0.0.1:1', '127.0.0.1:1']}\n"),
              HasSubstr("listed twice"));
  EXPECT_THAT(Reject("role: master\n" + e + ", key: fluxon}\n"),
              HasSubstr("election.key: must be a path"));
  EXPECT_THAT(Reject("role: master\n" + e + ", lease_ttl_s: 1}\n"),
              HasSubstr("election.lease_ttl_s"));
  EXPECT_THAT(Reject("role: master\n" + e + ", lease_ttl_s: 3601}\n"),
              HasSubstr("election.lease_ttl_s"));
  EXPECT_THAT(Reject("role: master\n" + e + ", advertise_address: 'x:0'}\n"),
              HasSubstr("election.advertise_address"));
  EXPECT_THAT(Reject("role: master\n" + e + ", ttl: 3}\n"), HasSubstr("election.ttl: unknown key"));
  // An owner names its master one way: an address or an election, never both.
  EXPECT_THAT(Reject("role: owner\nowner: {master_address: '127.0.0.1:1'}\n" + e + "}\n"),
              HasSubstr("exclusive"));
  EXPECT_THAT(Reject("role: remote_cache"), HasSubstr("or an election section"));
  // A master listening on every interface must say which address owners dial.
  EXPECT_THAT(Reject("role: master\nmaster: {listen_address: '0.0.0.0:50151'}\n"
                     "security: {insecure: true}\n" +
                     e + "}\n"),
              HasSubstr("election.advertise_address: is required"));
  ExpectAccepted(
      "role: master\nmaster: {listen_address: '0.0.0.0:50151'}\n"
      "security: {insecure: true}\n" +
      e + ", advertise_address: '10.0.0.1:50151'}\n");
}

TEST(ConfigSchema, DocsSettingsReferenceIsTheSchemas) {
  std::ifstream in(std::string(FLUXON_SOURCE_DIR) + "/docs/settings.md");
  ASSERT_TRUE(in) << "docs/settings.md is missing";
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string begin = "edit src/config/settings.h, not this table -->\n";
  const std::string end = "<!-- end of generated reference -->";
  const size_t b = text.find(begin);
  const size_t e = text.find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  EXPECT_EQ(text.substr(b + begin.size(), e - b - begin.size()), SettingsReferenceMarkdown())
      << "regenerate with: scripts/update-settings-doc.sh";
}

// Every scalar setting of the schema is read, bounded and dumped through its one definition:
// a non-default value of each kind survives ParseConfig -> DumpConfig -> ParseConfig.
TEST(ConfigSchema, NonDefaultValueOfEverySettingKindRoundTrips) {
  const std::string yaml = R"(role: embedded
node_id: 77
log_level: debug
owner:
  segment: {size: 1GiB, huge_pages: true, numa_node: 0, path: /dev/shm/fluxon-seg}
  local_reserve: {claim_soft_timeout_ms: 5, claim_hard_timeout_ms: 50, shrink_idle_ms: 7}
  hot_capacity_ratio: 0.5
  socket_path: /tmp/fluxon/schema.sock
  socket_group: users
  handle_ttl_ms: 1234
  busy_poll_us: 0
  max_connections: 7
  data_address: 127.0.0.1:0
master: {listen_address: 127.0.0.1:0, inflight_ttl_ms: 999, owner_lease_ms: 4000}
admin: {listen_address: 127.0.0.1:0, metrics_port: 0, metrics_address: "::1", allow_mutations: true}
security: {cluster_secret_file: /etc/fluxon/s, insecure: true}
)";
  absl::StatusOr<Config> c = ParseConfig(yaml, MachineLimits{});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node_id, 77u);
  EXPECT_EQ(c->log_level, "debug");
  EXPECT_EQ(c->owner->segment.size_bytes, kGiB);
  EXPECT_TRUE(c->owner->segment.huge_pages);
  EXPECT_EQ(c->owner->segment.numa_node, 0);
  EXPECT_EQ(c->owner->local_reserve.shrink_idle, std::chrono::milliseconds(7));
  EXPECT_EQ(c->owner->hot_capacity_ratio, 0.5);
  EXPECT_EQ(c->owner->socket_group, "users");
  EXPECT_EQ(c->owner->handle_ttl, std::chrono::milliseconds(1234));
  EXPECT_EQ(c->owner->busy_poll_us, 0);
  EXPECT_EQ(c->owner->max_connections, 7);
  EXPECT_EQ(c->master->inflight_ttl, std::chrono::milliseconds(999));
  EXPECT_EQ(c->admin.metrics_address, "::1");
  EXPECT_TRUE(c->admin.allow_mutations);
  EXPECT_EQ(c->security.cluster_secret_file, "/etc/fluxon/s");
  const std::string dumped = DumpConfig(*c);
  absl::StatusOr<Config> again = ParseConfig(dumped, MachineLimits{});
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << dumped;
  EXPECT_EQ(DumpConfig(*again), dumped);
}

// Each kind's bounds come from the schema line and name the key.
TEST(ConfigSchema, KindsRefuseOutOfBoundsValuesNamingTheKey) {
  EXPECT_THAT(Reject("node_id: 1048576\n"), HasSubstr("node_id: must be in [0, 1048575]"));
  EXPECT_THAT(Reject("log_level: loud\n"), HasSubstr("log_level: must be one of trace"));
  EXPECT_THAT(Reject("owner: {segment: {numa_node: -2}}\n"),
              HasSubstr("owner.segment.numa_node: must be in [-1, 1023]"));
  EXPECT_THAT(Reject("owner: {busy_poll_us: 100001}\n"),
              HasSubstr("owner.busy_poll_us: must be in [0, 100000]"));
  EXPECT_THAT(Reject("admin: {metrics_port: 65536}\n"),
              HasSubstr("admin.metrics_port: must be in [0, 65535]"));
  EXPECT_THAT(Reject("security: {cluster_secret_file: \"\"}\n"),
              HasSubstr("security.cluster_secret_file: must not be empty"));
  EXPECT_THAT(Reject("owner: {data_address: nohost}\n"),
              HasSubstr("owner.data_address: 'nohost' is not host:port"));
  EXPECT_THAT(Reject("master: {owner_lease_ms: 0}\n"),
              HasSubstr("master.owner_lease_ms: must be > 0 ms"));
}

}  // namespace
}  // namespace fluxon
