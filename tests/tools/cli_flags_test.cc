// The shared flag helpers: '-' spelled flag names, positional arguments, and usage errors
// reported as statuses (never an exit).
#include "daemon/cli_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, test_target, "default", "a string flag for the test");
ABSL_FLAG(bool, test_verbose, false, "a bool flag for the test");
ABSL_FLAG(int32_t, test_count, 1, "an int flag for the test");

namespace fluxon {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<std::vector<std::string>> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseFlagsOrUsageError(static_cast<int>(argv.size()), argv.data());
}

class CliFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::SetFlag(&FLAGS_test_target, "default");
    absl::SetFlag(&FLAGS_test_verbose, false);
    absl::SetFlag(&FLAGS_test_count, 1);
  }
};

TEST_F(CliFlagsTest, NormalizesOnlyFlagNames) {
  std::vector<std::string> args = {"prog", "--check-config=my-file", "pos-arg", "--a-b", "-x-y"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::vector<std::string> storage;
  std::vector<char*> out = NormalizeFlagNames(static_cast<int>(argv.size()), argv.data(), &storage);
  std::vector<std::string> got(out.begin(), out.end());
  EXPECT_THAT(got, ElementsAre("prog", "--check_config=my-file", "pos-arg", "--a_b", "-x-y"));
}

TEST_F(CliFlagsTest, ParsesFlagsAnywhereAndKeepsPositionals) {
  auto r = Parse({"route", "--test-target", "a-b", "key-1", "--test-verbose", "--test_count=7"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*r, ElementsAre("route", "key-1"));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_target), "a-b");
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_verbose));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 7);
}

TEST_F(CliFlagsTest, NegatedBoolAndDoubleDash) {
  absl::SetFlag(&FLAGS_test_verbose, true);
  auto r = Parse({"--notest-verbose", "--", "--test-count=3", "-x"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_verbose));
  EXPECT_THAT(*r, ElementsAre("--test-count=3", "-x"));
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 1);
}

TEST_F(CliFlagsTest, UsageErrorsAreStatuses) {
  EXPECT_THAT(Parse({"--no-such"}).status().message(), HasSubstr("unknown flag --no-such"));
  EXPECT_THAT(Parse({"--test-count"}).status().message(), HasSubstr("needs a value"));
  EXPECT_THAT(Parse({"--test-count", "many"}).status().message(), HasSubstr("bad value 'many'"));
  EXPECT_FALSE(Parse({"--test-verbose=maybe"}).ok());
}

}  // namespace
}  // namespace fluxon
