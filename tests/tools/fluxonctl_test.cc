// fluxonctl end to end: an in-process fluxond with real client traffic, inspected and driven by
// the real fluxonctl binary (tables and --json), including fault injection and exit statuses.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/integration/test_node.h"
#include "tests/tools/tool_test_util.h"

namespace fluxon {
namespace {

using ::fluxon::testing::CommandResult;
using ::fluxon::testing::Connect;
using ::fluxon::testing::NumberedKeys;
using ::fluxon::testing::PutAndWait;
using ::fluxon::testing::RunCommand;
using ::fluxon::testing::StartNode;
using ::fluxon::testing::TestConfig;
using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kValueLen = 64 * 1024;

class FluxonctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = TestConfig();
    config_.admin.allow_mutations = true;
    node_ = StartNode(config_);
    client_ = Connect(config_);
  }

  // fluxonctl --admin <this node> ARGS...
  CommandResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {FLUXONCTL_PATH, "--admin", node_->admin_address()});
    return RunCommand(args);
  }
  // Runs with --json, expects success, returns the parsed document.
  json CtlJson(std::vector<std::string> args) {
    args.push_back("--json");
    CommandResult r = Ctl(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << r.out;
    return j;
  }
  // The table row (split on runs of spaces) whose first cell is `first`, or empty.
  static std::vector<std::string> Row(const std::string& table, const std::string& first) {
    for (absl::string_view line : absl::StrSplit(table, '\n')) {
      std::vector<std::string> cells = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (!cells.empty() && cells[0] == first) return cells;
    }
    return {};
  }

  Config config_;
  std::unique_ptr<FluxonNode> node_;
  std::unique_ptr<KvClient> client_;
};

TEST_F(FluxonctlTest, StatusShowsRoleKeysAndClients) {
  ASSERT_TRUE(PutAndWait(*client_, NumberedKeys("s/", 3), kValueLen).ok());
  json j = CtlJson({"status"});
  EXPECT_EQ(j["role"], "embedded");
  EXPECT_EQ(j["keys"], 3);
  EXPECT_EQ(j["clients"], 1);
  EXPECT_EQ(j["segment_bytes"], node_->owner()->memory().segment().data_bytes());
  EXPECT_EQ(j["generation"], node_->owner()->generation());

  CommandResult table = Ctl({"status"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(Row(table.out, "role"), ElementsAre("role", "embedded"));
  EXPECT_THAT(Row(table.out, "keys"), ElementsAre("keys", "3"));
}

TEST_F(FluxonctlTest, RouteShowsPublishedRouteAndLocalState) {
  ASSERT_TRUE(PutAndWait(*client_, {"route/a", "route/b"}, kValueLen).ok());
  v1::LookupRequest lookup;
  lookup.add_keys("route/b");
  auto expected = node_->master()->Lookup(lookup);
  ASSERT_TRUE(expected.ok() && expected->found(0));
  const v1::Route& want = expected->routes(0);

  json j = CtlJson({"route", "route/b"});
  EXPECT_EQ(j["key"], "route/b");
  EXPECT_EQ(j["found"], true);
  EXPECT_EQ(j["local_state"], "committed");
  EXPECT_EQ(j["route"]["node_id"], want.node_id());
  EXPECT_EQ(j["route"]["generation"], want.generation());
  EXPECT_EQ(j["route"]["put_id"], want.put_id());
  EXPECT_EQ(j["route"]["offset"], want.offset());
  EXPECT_EQ(j["route"]["len"], kValueLen);

  CommandResult table = Ctl({"route", "route/b"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(Row(table.out, "found"), ElementsAre("found", "yes"));
  EXPECT_THAT(Row(table.out, "local_state"), ElementsAre("local_state", "committed"));
  EXPECT_THAT(Row(table.out, "offset"), ElementsAre("offset", std::to_string(want.offset())));

  json missing = CtlJson({"route", "route/none"});
  EXPECT_EQ(missing["found"], false);
  EXPECT_TRUE(missing["route"].is_null());
  EXPECT_EQ(missing["local_state"], "absent");
}

TEST_F(FluxonctlTest, SlotsMatchThePool) {
  ASSERT_TRUE(PutAndWait(*client_, NumberedKeys("slots/", 5), kValueLen).ok());
  // A prepared (uncommitted) batch shows up as Prepared.
  auto pending = client_->LocalFastPutStart(NumberedKeys("prep/", 2), kValueLen, PutOptions{});
  ASSERT_TRUE(pending.ok());

  const SlotPoolStats pool = node_->owner()->memory().pool().Stats();
  json j = CtlJson({"slots"});
  for (int i = 0; i < kNumSlotStates; ++i) {
    const char* state = SlotStateName(static_cast<SlotState>(i));
    EXPECT_EQ(j["by_state"][state], pool.slots_by_state[i]) << state;
  }
  EXPECT_EQ(j["by_state"]["Committed"], 5);
  EXPECT_EQ(j["by_state"]["Prepared"], 2);
  ASSERT_EQ(j["classes"].size(), 1u);
  EXPECT_EQ(j["classes"][0]["slot_size"], kValueLen);
  EXPECT_EQ(j["classes"][0]["used"], 7);
  EXPECT_EQ(j["classes"][0]["free"], pool.classes[0].free_slots);

  CommandResult table = Ctl({"slots"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(Row(table.out, "Committed"), ElementsAre("Committed", "5"));
  EXPECT_THAT(Row(table.out, "Prepared"), ElementsAre("Prepared", "2"));
  std::vector<std::string> cls = Row(table.out, std::to_string(kValueLen));
  ASSERT_EQ(cls.size(), 6u) << table.out;
  EXPECT_EQ(cls[3], "7");  // USED
  ASSERT_TRUE(client_->PutAbort(*pending).ok());
}

TEST_F(FluxonctlTest, KeysListsExactlyThePrefix) {
  ASSERT_TRUE(PutAndWait(*client_, {"a/2", "a/0", "a/1", "ab", "b/0"}, kValueLen).ok());
  json j = CtlJson({"keys", "--prefix", "a/"});
  std::vector<std::string> keys;
  for (const json& route : j["keys"]) keys.push_back(route["key"]);
  EXPECT_THAT(keys, ElementsAre("a/0", "a/1", "a/2"));

  json limited = CtlJson({"keys", "--prefix=a", "--limit", "2"});
  ASSERT_EQ(limited["keys"].size(), 2u);
  EXPECT_EQ(limited["keys"][0]["key"], "a/0");

  CommandResult table = Ctl({"keys", "--prefix", "b/"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  std::vector<std::string> lines = absl::StrSplit(table.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << table.out;  // header + one key
  EXPECT_THAT(Row(table.out, "b/0"), ::testing::SizeIs(6));
  EXPECT_THAT(CtlJson({"keys", "--prefix", "zzz"})["keys"], ::testing::IsEmpty());
}

TEST_F(FluxonctlTest, StatsCountPutBatches) {
  ASSERT_TRUE(PutAndWait(*client_, NumberedKeys("st/", 4), kValueLen).ok());
  ASSERT_TRUE(PutAndWait(*client_, NumberedKeys("st2/", 1), kValueLen).ok());
  json j = CtlJson({"stats"});
  EXPECT_EQ(j["owner_put_batches"], 2);
  EXPECT_EQ(j["owner_put_pages"], 5);
  EXPECT_EQ(j["master_routes"], 5);
  EXPECT_EQ(j["owner_client_sessions"], 1);
}

TEST_F(FluxonctlTest, OwnersListsTheEmbeddedOwner) {
  json j = CtlJson({"owners"});
  ASSERT_EQ(j["owners"].size(), 1u);
  EXPECT_EQ(j["owners"][0]["node_id"], 0);
  EXPECT_EQ(j["owners"][0]["generation"], node_->owner()->generation());
}

// Issue: any local user could inject faults through the admin port. Mutating admin calls are
// refused unless admin.allow_mutations is set, and a refused call changes nothing.
TEST(FluxonctlMutations, FaultInjectionIsRefusedUnlessEnabled) {
  Config c = TestConfig();
  ASSERT_FALSE(c.admin.allow_mutations);
  auto node = StartNode(c);
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {FLUXONCTL_PATH, "--admin", node->admin_address()});
    return RunCommand(args);
  };
  CommandResult set = run({"fault", "set", "master.Lookup", "delay", "--delay-ms", "3600000"});
  EXPECT_NE(set.exit_code, 0);
  EXPECT_THAT(set.err, ::testing::HasSubstr("allow_mutations"));
  EXPECT_TRUE(node->faults().List().empty());
  node->faults().Set(FaultRule{"master.Lookup", FaultAction::kFail, {}, -1});
  EXPECT_NE(run({"fault", "clear"}).exit_code, 0);
  EXPECT_EQ(node->faults().List().size(), 1u);
  // Reads stay available.
  EXPECT_EQ(run({"fault", "list"}).exit_code, 0);
  EXPECT_EQ(run({"status"}).exit_code, 0);
}

TEST_F(FluxonctlTest, FaultDelayHoldsThePublish) {
  CommandResult set =
      Ctl({"fault", "set", "master.PublishBatch", "delay", "--delay-ms", "300", "--count", "1"});
  ASSERT_EQ(set.exit_code, 0) << set.err;
  json rules = CtlJson({"fault", "list"})["rules"];
  ASSERT_EQ(rules.size(), 1u);
  EXPECT_EQ(rules[0]["point"], "master.PublishBatch");
  EXPECT_EQ(rules[0]["action"], "delay");
  EXPECT_EQ(rules[0]["delay_ms"], 300);
  EXPECT_EQ(rules[0]["count"], 1);

  auto plan = client_->LocalFastPutStart({"slow"}, kValueLen, PutOptions{});
  ASSERT_TRUE(plan.ok());
  const auto committed_at = std::chrono::steady_clock::now();
  auto fut = client_->LocalFastPutCommit(*plan);
  ASSERT_TRUE(fut.ok());
  ASSERT_TRUE(fut->Wait(std::chrono::milliseconds(10'000)).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - committed_at, std::chrono::milliseconds(300));
  // The rule fired its one time and is gone.
  EXPECT_THAT(CtlJson({"fault", "list"})["rules"], ::testing::IsEmpty());

  ASSERT_EQ(Ctl({"fault", "set", "master.Lookup", "fail"}).exit_code, 0);
  ASSERT_EQ(Ctl({"fault", "set", "master.RemoveRoutes", "drop", "--count", "2"}).exit_code, 0);
  CommandResult table = Ctl({"fault", "list"});
  EXPECT_THAT(Row(table.out, "master.Lookup"),
              ElementsAre("master.Lookup", "fail", "0", "until-cleared"));
  EXPECT_THAT(Row(table.out, "master.RemoveRoutes"),
              ElementsAre("master.RemoveRoutes", "drop", "0", "2"));
  ASSERT_EQ(Ctl({"fault", "clear", "master.Lookup"}).exit_code, 0);
  EXPECT_EQ(node_->faults().List().size(), 1u);
  ASSERT_EQ(Ctl({"fault", "clear"}).exit_code, 0);
  EXPECT_TRUE(node_->faults().List().empty());
}

TEST_F(FluxonctlTest, UsageErrorsExitTwo) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"frobnicate"},
           {"route"},
           {"route", "a", "b"},
           {"status", "extra"},
           {"--no-such-flag", "status"},
           {"keys", "--limit", "many"},
           {"keys", "--limit", "0"},
           {"fault"},
           {"fault", "set", "master.Lookup"},
           {"fault", "set", "master.Lookup", "explode"},
           {"fault", "set", "master.Lookup", "fail", "--count", "0"},
           {"--timeout-ms", "0", "status"},
       }) {
    CommandResult r = Ctl(args);
    EXPECT_EQ(r.exit_code, 2) << absl::StrJoin(args, " ") << ": " << r.out << r.err;
    EXPECT_FALSE(r.err.empty()) << absl::StrJoin(args, " ");
  }
  EXPECT_TRUE(node_->faults().List().empty());  // nothing half-applied

  CommandResult none = RunCommand({FLUXONCTL_PATH});
  EXPECT_EQ(none.exit_code, 2);
  CommandResult help = RunCommand({FLUXONCTL_PATH, "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.out, HasSubstr("fault set POINT ACTION"));
}

TEST(FluxonctlStandalone, UnreachableDaemonExitsOne) {
  const std::string address = "127.0.0.1:" + std::to_string(fluxon::testing::FreeTcpPort());
  CommandResult r =
      RunCommand({FLUXONCTL_PATH, "--admin", address, "--timeout-ms", "2000", "status"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("cannot reach fluxond admin at " + address));
}

TEST(FluxonctlStandalone, OwnerOnlyCommandsOnAMasterFailWithTheReason) {
  Config c = TestConfig();
  c.role = Role::kMaster;
  c.owner.reset();
  auto node = StartNode(c);
  CommandResult r = RunCommand({FLUXONCTL_PATH, "--admin", node->admin_address(), "slots"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("this node has no owner"));
  CommandResult owners =
      RunCommand({FLUXONCTL_PATH, "--admin", node->admin_address(), "--json", "owners"});
  EXPECT_EQ(owners.exit_code, 0) << owners.err;
}

}  // namespace
}  // namespace fluxon
