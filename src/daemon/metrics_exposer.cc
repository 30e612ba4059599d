#include "daemon/metrics_exposer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <system_error>
#include <thread>
#include <utility>

#include "CivetServer.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "fluxon/status.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "spdlog/spdlog.h"

namespace fluxon {
namespace {

constexpr char kUri[] = "/metrics";
constexpr char kTimeoutMs[] = "10000";  // a slow request is dropped after 10 s
constexpr unsigned kCivetFeatureIpv6 = 8;

// civetweb reports errors (a failed bind among them) through log_message. While Start builds
// the server on its thread they are kept for the error status; later ones are logged.
thread_local std::vector<std::string>* start_errors = nullptr;

int LogMessage(const mg_connection*, const char* message) {
  if (start_errors != nullptr) {
    start_errors->emplace_back(message);
  } else {
    spdlog::warn("metrics endpoint: {}", message);
  }
  return 1;  // handled: civetweb prints nothing itself
}

// civetweb's listening_ports entry for address:port.
absl::StatusOr<std::string> ListeningPort(const std::string& address, int port) {
  in_addr v4;
  in6_addr v6;
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return absl::StrFormat("%s:%d", address, port);
  if (inet_pton(AF_INET6, address.c_str(), &v6) == 1) {
    if (mg_check_feature(kCivetFeatureIpv6) == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "metrics address '%s' is IPv6; the civetweb library serving metrics was built without "
          "IPv6 (use an IPv4 address)",
          address));
    }
    return absl::StrFormat("[%s]:%d", address, port);
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("metrics address '%s' is not an IP address", address));
}

// Connects to address:port and closes at once (nothing is sent, so whoever accepts it reads
// end-of-file right away).
void Poke(const std::string& address, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1) return;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  (void)connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa);
  close(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(
    const std::string& address, int port,
    std::vector<std::shared_ptr<prometheus::Collectable>> collectables) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat("metrics port %d out of range", port));
  }
  FLUXON_ASSIGN_OR_RETURN(const std::string listening, ListeningPort(address, port));
  std::vector<std::string> errors;
  struct ResetStartErrors {
    ~ResetStartErrors() { start_errors = nullptr; }
  } reset;
  try {
    CivetCallbacks callbacks;
    callbacks.log_message = LogMessage;
    start_errors = &errors;
    auto exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", listening, "num_threads",
                                 std::to_string(kMetricsThreads), "request_timeout_ms", kTimeoutMs},
        &callbacks);
    start_errors = nullptr;
    for (const auto& c : collectables) exposer->RegisterCollectable(c, kUri);
    const std::vector<int> ports = exposer->GetListeningPorts();
    if (ports.empty()) {
      return absl::InternalError(
          absl::StrFormat("metrics server on %s:%d reports no listening port", address, port));
    }
    // Where Stop() can reach the listening socket ("0.0.0.0" listens on loopback too).
    std::string local = address == "0.0.0.0" ? "127.0.0.1" : address;
    return std::unique_ptr<MetricsExposer>(new MetricsExposer(
        std::move(exposer), std::move(collectables), std::move(local), ports.front()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrFormat("cannot serve metrics on %s:%d: %s", address, port,
                        errors.empty() ? e.what() : absl::StrJoin(errors, "; ")));
  }
}

MetricsExposer::MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer,
                               std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
                               std::string local_address, int port)
    : exposer_(std::move(exposer)),
      collectables_(std::move(collectables)),
      local_address_(std::move(local_address)),
      port_(port) {}

MetricsExposer::~MetricsExposer() { Stop(); }

void MetricsExposer::Stop() {
  if (exposer_ == nullptr) return;
  // Destroying the Exposer removes its /metrics handler, which civetweb does only once no
  // request is inside it, then stops civetweb and joins its threads: no Collect() runs after.
  // civetweb's accept loop sees the stop only when its poll of the listening socket returns
  // (at most every 2 s); connections made meanwhile end that wait. Known civetweb behaviour: a
  // connection it accepted but had not yet handed to a worker when the stop came stays open,
  // unanswered, until the process exits (fluxond exits right after stopping its node).

  std::atomic<bool> stopped{false};
  std::thread waker;
  try {
    waker = std::thread([this, &stopped] {
      while (!stopped.load()) {
        Poke(local_address_, port_);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  } catch (const std::system_error& e) {
    spdlog::warn("metrics endpoint: stopping without a waker thread ({})", e.what());
  }
  exposer_.reset();
  stopped = true;
  if (waker.joinable()) waker.join();
  collectables_.clear();
}

}  // namespace fluxon
