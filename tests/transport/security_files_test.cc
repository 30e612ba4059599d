// Reading the security files named by the config: a cluster secret is loaded trimmed, a short one
// is refused, and a path naming something that is no certificate, key or secret (too large) is
// refused with the config key instead of read without end.
#include "security/security_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace fluxon::security {
namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  ::chmod(path.c_str(), 0600);
  return path;
}

TEST(SecurityFiles, ClusterSecretIsTrimmedAndNeedsSixteenBytes) {
  absl::StatusOr<std::string> ok =
      LoadClusterSecret(WriteFile("secret-ok", "  0123456789abcdef-x\n"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "0123456789abcdef-x");
  EXPECT_EQ(LoadClusterSecret(WriteFile("secret-short", "short\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadClusterSecret(::testing::TempDir() + "/no-such-secret").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SecurityFiles, AnOversizedFileIsRefusedNamingTheKey) {
  const std::string path = WriteFile("secret-huge", std::string((1 << 20) + 1, 'k'));
  absl::StatusOr<std::string> s = LoadClusterSecret(path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("security.cluster_secret_file"), std::string::npos)
      << s.status();
  EXPECT_NE(s.status().message().find("over"), std::string::npos) << s.status();
  // Exactly at the limit is still read (and then judged as a secret).
  EXPECT_TRUE(LoadClusterSecret(WriteFile("secret-max", std::string(1 << 20, 'k'))).ok());
}

}  // namespace
}  // namespace fluxon::security
