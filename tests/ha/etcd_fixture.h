// Test helpers for the high-availability tests: a real etcd member on loopback (Debian's
// etcd-server) and child processes started safely from a process running gRPC threads.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ha/etcd_client.h"
#include "tools/tool_test_util.h"

namespace fluxon {
namespace testing_ha {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

inline std::string EtcdBinary() {
  if (const char* e = std::getenv("FLUXON_ETCD"); e != nullptr) return e;
  for (const char* p : {"/usr/bin/etcd", "/usr/local/bin/etcd"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

// A child process with its output in `log`; killed (SIGKILL) when destroyed.
class Child {
 public:
  Child(const std::vector<std::string>& argv, const std::string& log) {
    // Everything the child needs is prepared before fork: the parent runs gRPC threads, and
    // between fork and exec the child may only make async-signal-safe calls (no allocation).
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const char* log_path = log.c_str();
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Child() { Kill(); }
  // Moved, the process goes with it (the source no longer kills it); never copied.
  Child(Child&& other) noexcept : pid_(std::exchange(other.pid_, -1)) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  Child& operator=(Child&&) = delete;
  void Signal(int sig) const {
    if (pid_ > 0) kill(pid_, sig);
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGCONT);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // SIGTERM, then a bounded wait for the exit; the exit status (-1: killed after the bound).
  int Terminate(milliseconds bound = milliseconds(10000)) {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + bound;
    int status = 0;
    while (Clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    Kill();
    return -1;
  }

 private:
  pid_t pid_ = -1;
};

class Etcd {
 public:
  explicit Etcd(const std::string& dir) : dir_(dir) {
    client_port_ = testing::FreeTcpPort();
    peer_port_ = testing::FreeTcpPort();
  }
  void Start() {
    const std::string client = absl::StrCat("http://127.0.0.1:", client_port_);
    const std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
    proc_.emplace(
        std::vector<std::string>{EtcdBinary(), "--name", "e0", "--data-dir", dir_ + "/etcd-data",
                                 "--listen-client-urls", client, "--advertise-client-urls", client,
                                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                 "--initial-cluster", "e0=" + peer},
        dir_ + "/etcd.log");
  }
  void Kill() { proc_.reset(); }
  // etcd accepts connections before it serves them, and a gRPC client that connects in that
  // window can wait a long time for the HTTP/2 handshake: wait for its own "ready" line (each
  // start appends one to the log).
  bool WaitReady(milliseconds bound) {
    const auto deadline = Clock::now() + bound;
    while (Clock::now() < deadline) {
      std::ifstream f(dir_ + "/etcd.log");
      std::stringstream ss;
      ss << f.rdbuf();
      size_t n = 0;
      for (size_t at = ss.str().find(kReady); at != std::string::npos;
           at = ss.str().find(kReady, at + 1)) {
        ++n;
      }
      if (n > starts_seen_) {
        starts_seen_ = n;
        return true;
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    return false;
  }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", client_port_); }

 private:
  std::string dir_;
  int client_port_ = 0, peer_port_ = 0;
  std::optional<Child> proc_;
  size_t starts_seen_ = 0;
  static constexpr const char* kReady = "ready to serve client requests";
};

// A fresh etcd member in a new directory under /tmp, started, and a client once it answers a read
// (each bounded by 20 s); an error naming the log otherwise.
struct ServingEtcd {
  std::string dir;
  std::optional<Etcd> etcd;
  std::unique_ptr<EtcdClient> client;

  absl::Status Start(const std::string& prefix) {
    std::string tmpl = "/tmp/" + prefix + "-XXXXXX";
    dir = mkdtemp(tmpl.data());
    etcd.emplace(dir);
    etcd->Start();
    if (!etcd->WaitReady(milliseconds(20000))) {
      return absl::UnavailableError("etcd not ready in 20 s; see " + dir + "/etcd.log");
    }
    absl::StatusOr<std::unique_ptr<EtcdClient>> c =
        EtcdClient::Connect({etcd->endpoint()}, milliseconds(2000));
    if (!c.ok()) return c.status();
    client = std::move(*c);
    const auto deadline = Clock::now() + milliseconds(20000);
    absl::Status last;
    while (!(last = client->Get("/probe").status()).ok()) {
      if (Clock::now() >= deadline) {
        return absl::UnavailableError(absl::StrCat("etcd did not answer in 20 s (", last.ToString(),
                                                   "); see ", dir, "/etcd.log"));
      }
      std::this_thread::sleep_for(milliseconds(50));
    }
    return absl::OkStatus();
  }
};

}  // namespace testing_ha
}  // namespace fluxon
