// fluxond: the Fluxon daemon. The role (embedded master+owner, master, owner, remote_cache) comes
// from the config; with no arguments it runs the built-in embedded single-node config.
// Under systemd (Type=notify units in systemd/) it reports READY=1 once started, STOPPING=1 when a
// signal begins shutdown, and pings the watchdog while the node is healthy
// (daemon/systemd_notify.h).
#include <dlfcn.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
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
#include "config/config.h"
#include "daemon/cli_flags.h"
#include "daemon/node.h"
#include "daemon/systemd_notify.h"
#include "fluxon/v1/admin.grpc.pb.h"
#include "fluxon/version.h"
#include "rpc_grpc/grpc_security.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, config, "", "config file (YAML); empty: the built-in embedded config");
ABSL_FLAG(std::string, check_config, "", "validate FILE, print the resolved config and exit");
ABSL_FLAG(bool, version, false, "print the version and exit");
ABSL_FLAG(bool, settings_reference, false,
          "print the reference of every config setting (Markdown, docs/settings.md) and exit");
ABSL_FLAG(bool, once, false, "start, print status and exit (smoke test)");

namespace {

// The watchdog's health probe: the node is healthy when its admin gRPC server answers Status
// within the deadline (that takes a server thread and, on owner roles, the slot pool's and the key
// index's locks) and, on roles with local clients, the client socket file is still in place
// (without it no client can attach). It talks to the node only through those two, so it holds no
// pointer into the node and stays valid whatever the node's state.
class NodeHealthProbe {
 public:
  explicit NodeHealthProbe(const fluxon::FluxonNode& node) {
    target_ = LoopbackTarget(node.admin_address());
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);  // a proxy in the unit's environment: not for us
    // A lost connection is retried within a probe or two, not after gRPC's default backoff.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // With TLS the probe presents the node's own certificate and checks the node's server
    // certificate against the node's own name (it dials loopback, which the certificate need
    // not name).
    const fluxon::GrpcSecurity& security = node.grpc_security();
    std::string tls_name;
    if (security.tls() && !security.material()->names.empty()) {
      tls_name = security.material()->names.front();
    }
    admin_ = fluxon::v1::AdminService::NewStub(security.Channel(target_, args, tls_name));
    if (node.client_server() != nullptr) socket_path_ = node.config().owner->socket_path;
  }

  absl::Status operator()(std::chrono::milliseconds deadline) {
    if (!socket_path_.empty()) {
      struct stat st {};
      if (::stat(socket_path_.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
        return absl::UnavailableError(absl::StrFormat("client socket %s is gone", socket_path_));
      }
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    ctx.set_wait_for_ready(true);  // connecting (first probe, after a reconnect) is in the deadline
    fluxon::v1::StatusRequest req;
    fluxon::v1::StatusReply reply;
    const grpc::Status s = admin_->Status(&ctx, req, &reply);
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrFormat("admin Status on %s: %s", target_, s.error_message()));
    }
    // An owner the master does not know (expired, re-registering) serves only local hits:
    // not healthy until it is registered again.
    if (reply.registration_generation() != 0 && !reply.master_registered()) {
      return absl::UnavailableError("not registered with the master (re-registering)");
    }
    return absl::OkStatus();
  }

 private:
  // "0.0.0.0:P" and "[::]:P" (every interface) are reached on loopback; other hosts as they are.
  static std::string LoopbackTarget(const std::string& address) {
    const size_t colon = address.rfind(':');
    const std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
    const std::string port = colon == std::string::npos ? address : address.substr(colon + 1);
    if (host.empty() || host == "0.0.0.0") return "127.0.0.1:" + port;
    if (host == "[::]" || host == "::") return "[::1]:" + port;
    return address;
  }

  std::string target_;
  std::string socket_path_;
  std::unique_ptr<fluxon::v1::AdminService::Stub> admin_;
};

// The shared object whose malloc this process calls (the one symbol interposition picked:
// libmimalloc when FLUXON_MIMALLOC linked it, or whatever LD_PRELOAD put first, else libc).
std::string AllocatorName() {
  void* fn = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  const std::string path = info.dli_fname;
  return path.substr(path.find_last_of('/') + 1);
}

int RunDaemon(const fluxon::Config& config, bool once) {
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  spdlog::info("fluxond {} starting, role={} node_id={} allocator={}", FLUXON_VERSION_STRING,
               fluxon::RoleName(config.role), config.node_id, AllocatorName());
  // Signals are handled by sigwait below; block them before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A no-op without NOTIFY_SOCKET (not started by a Type=notify unit).
  fluxon::SystemdNotifier systemd;
  absl::StatusOr<std::unique_ptr<fluxon::FluxonNode>> node = fluxon::FluxonNode::Start(config);
  if (!node.ok()) {
    spdlog::error("fluxond failed to start: {}", node.status().ToString());
    std::cerr << "fluxond failed to start: " << node.status().message() << "\n";
    systemd.NotifyStatus("failed to start: " + std::string(node.status().message()));
    return 1;
  }
  std::cout << "fluxond " << FLUXON_VERSION_STRING << " ready\n" << (*node)->StatusText();
  std::cout.flush();
  // Every listener accepts by now (Start returned): only then may systemd start what needs us.
  const std::string ready =
      absl::StrFormat("ready: role=%s node_id=%d admin=%s", fluxon::RoleName(config.role),
                      config.node_id, (*node)->admin_address());
  systemd.NotifyReady(ready);
  if (!once) {
    if (systemd.watchdog_period().count() > 0) {
      auto probe = std::make_shared<NodeHealthProbe>(**node);
      systemd.StartWatchdog([probe](std::chrono::milliseconds d) { return (*probe)(d); }, ready);
    }
    int sig = 0;
    sigwait(&set, &sig);
    spdlog::info("fluxond stopping on signal {}", sig);
    systemd.NotifyStopping(absl::StrFormat("stopping on signal %d", sig));
  } else {
    systemd.NotifyStopping("stopping (--once)");
  }
  (*node)->Stop();
  node->reset();
  spdlog::info("fluxond stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "fluxond [--config FILE] | --check-config FILE | --settings-reference | --version");
  std::vector<std::string> storage;
  // --check-config as well as --check_config: flag names use '-' on our command lines.
  std::vector<char*> args = fluxon::NormalizeFlagNames(argc, argv, &storage);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (absl::GetFlag(FLAGS_version)) {
    std::cout << "fluxond " << FLUXON_VERSION_STRING << " (" << FLUXON_GIT_REVISION << ")\n";
    return 0;
  }
  if (absl::GetFlag(FLAGS_settings_reference)) {
    std::cout << fluxon::SettingsReferenceMarkdown();
    return 0;
  }
  if (const std::string file = absl::GetFlag(FLAGS_check_config); !file.empty()) {
    absl::StatusOr<fluxon::Config> c = fluxon::LoadConfigFile(file);
    if (!c.ok()) {
      std::cerr << "invalid config: " << c.status().message() << "\n";
      return 2;
    }
    if (absl::Status s = fluxon::CheckListenSecurity(*c); !s.ok()) {
      std::cerr << "config would not start: " << s.message() << "\n";
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
