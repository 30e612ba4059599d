// Test/benchmark helpers: shared memory and a transport_peer child process serving it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace fluxon::transport::testing {

// A memfd mapped here; the fd is inheritable so a child can map the same pages.
class SharedMemory {
 public:
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Create(uint64_t len) {
    const int fd = ::memfd_create("fluxon-transport-test", 0);
    if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
    if (::ftruncate(fd, static_cast<off_t>(len)) != 0) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("ftruncate: ", std::strerror(errno)));
    }
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("mmap: ", std::strerror(errno)));
    }
    return std::unique_ptr<SharedMemory>(new SharedMemory(fd, static_cast<uint8_t*>(p), len));
  }
  ~SharedMemory() {
    ::munmap(base_, len_);
    ::close(fd_);
  }
  int fd() const { return fd_; }
  uint8_t* base() const { return base_; }
  uint64_t len() const { return len_; }

 private:
  SharedMemory(int fd, uint8_t* base, uint64_t len) : fd_(fd), base_(base), len_(len) {}
  int fd_;
  uint8_t* base_;
  uint64_t len_;
};

// A transport_peer child serving `memory` under `generation`.
class PeerProcess {
 public:
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Start(const std::string& exe,
                                                            const SharedMemory& memory,
                                                            uint64_t generation, int port = 0,
                                                            bool zerocopy = false) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      return absl::InternalError("pipe");
    }
    std::vector<std::string> args = {
        exe, absl::StrCat("--fd=", memory.fd()), absl::StrCat("--len=", memory.len()),
        absl::StrCat("--generation=", generation), absl::StrCat("--port=", port)};
    if (zerocopy) args.push_back("--zerocopy");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) return absl::InternalError("fork");
    if (pid == 0) {  // async-signal-safe calls only until exec
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    auto p = std::unique_ptr<PeerProcess>(new PeerProcess(pid, in[1], out[0]));
    // Read "PORT <n>\n" within 20 s.
    std::string line;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (line.find('\n') == std::string::npos) {
      pollfd pfd{out[0], POLLIN, 0};
      const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          until - std::chrono::steady_clock::now())
                                          .count());
      if (ms <= 0 || ::poll(&pfd, 1, ms) <= 0) return absl::DeadlineExceededError("peer start");
      char buf[64];
      const ssize_t n = ::read(out[0], buf, sizeof(buf));
      if (n <= 0) return absl::UnavailableError("peer exited before printing its port");
      line.append(buf, static_cast<size_t>(n));
    }
    if (line.rfind("PORT ", 0) != 0) return absl::InternalError("peer printed: " + line);
    p->port_ = std::atoi(line.c_str() + 5);
    return p;
  }

  ~PeerProcess() {
    if (pid_ > 0) {
      ::close(stdin_);
      stdin_ = -1;
      // A clean stop within 10 s, else kill -9.
      for (int i = 0; i < 1000; ++i) {
        if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
          pid_ = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (pid_ > 0) Kill();
    }
    if (stdin_ >= 0) ::close(stdin_);
    ::close(stdout_);
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // SIGSTOP / SIGCONT. Stopping returns once the process is stopped (its /proc state is 'T',
  // checked for up to 2 s): the signal alone is delivered asynchronously, and a peer that
  // still runs for a moment may answer a request the caller meant to stall.
  void Stop(bool stopped) {
    if (pid_ <= 0) return;
    ::kill(pid_, stopped ? SIGSTOP : SIGCONT);
    if (!stopped) return;
    const std::string path = "/proc/" + std::to_string(pid_) + "/stat";
    for (int i = 0; i < 2000; ++i) {
      std::ifstream f(path);
      std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const size_t close = text.rfind(')');
      if (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'T') return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  PeerProcess(pid_t pid, int in, int out) : pid_(pid), stdin_(in), stdout_(out) {}
  pid_t pid_;
  int stdin_;
  int stdout_;
  int port_ = 0;
};

}  // namespace fluxon::transport::testing
