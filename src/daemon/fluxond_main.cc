// fluxond: the Fluxon daemon. The role (embedded master+owner, master, owner, remote_cache) comes
// from the config; with no arguments it runs the built-in embedded single-node config.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "common/cli_flags.h"
#include "daemon/node.h"
#include "fluxon/config.h"
#include "fluxon/version.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "", "config file (YAML); empty: the built-in embedded config");
ABSL_FLAG(std::string, check_config, "", "validate FILE, print the resolved config and exit");
ABSL_FLAG(bool, version, false, "print the version and exit");
ABSL_FLAG(bool, once, false, "start, print status and exit (smoke test)");

namespace {

int RunDaemon(const fluxon::Config& config, bool once) {
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  spdlog::info("fluxond {} starting, role={} node_id={}", FLUXON_VERSION_STRING,
               fluxon::RoleName(config.role), config.node_id);
  // Signals are handled by sigwait below; block them before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  absl::StatusOr<std::unique_ptr<fluxon::FluxonNode>> node = fluxon::FluxonNode::Start(config);
  if (!node.ok()) {
    spdlog::error("fluxond failed to start: {}", node.status().ToString());
    std::cerr << "fluxond failed to start: " << node.status().message() << "\n";
    return 1;
  }
  std::cout << "fluxond " << FLUXON_VERSION_STRING << " ready\n" << (*node)->StatusText();
  std::cout.flush();
  if (!once) {
    int sig = 0;
    sigwait(&set, &sig);
    spdlog::info("fluxond stopping on signal {}", sig);
  }
  (*node)->Stop();
  node->reset();
  spdlog::info("fluxond stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("fluxond [--config FILE] | --check-config FILE | --version");
  std::vector<std::string> storage;
  // --check-config as well as --check_config: flag names use '-' on our command lines.
  std::vector<char*> args = fluxon::NormalizeFlagNames(argc, argv, &storage);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (absl::GetFlag(FLAGS_version)) {
    std::cout << "fluxond " << FLUXON_VERSION_STRING << " (" << FLUXON_GIT_REVISION << ")\n";
    return 0;
  }
  if (const std::string file = absl::GetFlag(FLAGS_check_config); !file.empty()) {
    absl::StatusOr<fluxon::Config> c = fluxon::LoadConfigFile(file);
    if (!c.ok()) {
      std::cerr << "invalid config: " << c.status().message() << "\n";
      return 2;
    }
    std::cout << fluxon::DumpConfig(*c);
    return 0;
  }
  fluxon::Config config = fluxon::DefaultEmbeddedConfig();
  if (const std::string file = absl::GetFlag(FLAGS_config); !file.empty()) {
    absl::StatusOr<fluxon::Config> c = fluxon::LoadConfigFile(file);
    if (!c.ok()) {
      std::cerr << "invalid config: " << c.status().message() << "\n";
      return 2;
    }
    config = *c;
  }
  if (config.role == fluxon::Role::kClient) {
    std::cerr << "role=client configs are for the client library, not fluxond\n";
    return 2;
  }
  return RunDaemon(config, absl::GetFlag(FLAGS_once));
}
