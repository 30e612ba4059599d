// transport_bench: the data-plane transport against its ceilings on one machine.
//
// Reads 128 values of 4,718,592 bytes from ANOTHER PROCESS's shared memory over loopback:
//   fluxon-tcp   TcpTransport, one batch of 128 descriptors, with C connections
//   fluxon-tcp-zc  the same with MSG_ZEROCOPY on the serving side's replies
//   raw-tcp      the ceiling: C plain sockets, the server process write()s its share of the bytes
//                straight from the shared memory, the reader read()s into the same local buffer
//   memcpy       single-thread memcpy of the same bytes (from the shared mapping)
// for C in --connections (default 1,2,4,8). The modes alternate inside each round (the VM is
// noisy); the table reports, per mode and C, the median over rounds of GB/s and batch p50/p99,
// and the CPU time both processes spent per GB moved (this process's threads, user + system,
// and the serving process's: the peer for fluxon-tcp, the forked server for raw-tcp), summed
// over every timed batch, and both processes' context switches per timed batch (the raw client
// starts a thread per connection per batch; the serving process's exited threads are not
// counted).
//
//   transport_bench [--rounds=N] [--batches=K] [--connections=1,2,4,8] [--peer=PATH]
//                   [--values=128] [--value-len=4718592] [--local=anon|shm]
//                   [--request-bytes=4194304] [--connection-share] [--no-zc]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tests/transport/peer_process.h"
#include "transport/tcp/tcp_transport.h"

namespace {

using fluxon::transport::Descriptor;
using fluxon::transport::OpKind;
using fluxon::transport::PeerId;
using fluxon::transport::TcpTransport;
using fluxon::transport::TcpTransportOptions;
using fluxon::transport::testing::PeerProcess;
using fluxon::transport::testing::SharedMemory;
using Clock = std::chrono::steady_clock;

// The values read per batch (--values, --value-len); set once in main before any thread.
uint64_t g_value = 4718592;
int g_values = 128;
uint64_t BatchBytes() { return g_value * g_values; }

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---- raw socket ceiling: a forked server process ---------------------------------------------

// Server: accepts connections; on each, reads (offset, len) requests and write()s those bytes.
[[noreturn]] void RawServer(int listen_fd, const uint8_t* mem) {
  std::vector<std::thread> threads;
  for (;;) {
    const int fd = ::accept(listen_fd, nullptr, nullptr);
    if (fd < 0) break;
    threads.emplace_back([fd, mem] {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      uint64_t req[2];
      for (;;) {
        size_t got = 0;
        while (got < sizeof(req)) {
          const ssize_t n = ::read(fd, reinterpret_cast<char*>(req) + got, sizeof(req) - got);
          if (n <= 0) {
            ::close(fd);
            return;
          }
          got += n;
        }
        for (uint64_t off = 0; off < req[1];) {
          const ssize_t n = ::write(fd, mem + req[0] + off, req[1] - off);
          if (n <= 0) {
            ::close(fd);
            return;
          }
          off += n;
        }
      }
    });
  }
  ::_exit(0);
}

struct RawClient {
  std::vector<int> fds;
  ~RawClient() {
    for (int fd : fds) ::close(fd);
  }
  bool Connect(int port, int n) {
    for (int i = 0; i < n; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(port);
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return false;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      fds.push_back(fd);
    }
    return true;
  }
  // Each connection moves a contiguous share of the batch, as fast as read() goes.
  void Batch(uint8_t* local) {
    const int n = static_cast<int>(fds.size());
    std::vector<std::thread> ts;
    for (int i = 0; i < n; ++i) {
      ts.emplace_back([&, i] {
        const uint64_t share = BatchBytes() / n;
        const uint64_t off = i * share;
        const uint64_t len = i + 1 == n ? BatchBytes() - off : share;
        uint64_t req[2] = {off, len};
        if (::write(fds[i], req, sizeof(req)) != sizeof(req)) std::abort();
        for (uint64_t got = 0; got < len;) {
          const ssize_t r = ::read(fds[i], local + off + got, len - got);
          if (r <= 0) std::abort();
          got += r;
        }
      });
    }
    for (auto& t : ts) t.join();
  }
};

// ---- measurement ------------------------------------------------------------------------------

struct Samples {
  std::vector<double> gbps_per_round;  // one per round: bytes of its batches / their time
  std::vector<double> batch_s;         // every batch
  double cpu_s = 0;                    // both processes' CPU over every timed batch
  double switches = 0;                 // both processes' context switches over them
  int timed_batches = 0;               // the batches those sums cover
  double bytes = 0;                    // moved by every timed batch
};

// CPU seconds (user + system, every thread) this process has used.
double SelfCpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// CPU seconds another process has used (/proc/PID/stat utime + stime); 0 for pid <= 0.
double ProcessCpuSeconds(pid_t pid) {
  if (pid <= 0) return 0;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::strtod(field.c_str(), nullptr);
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Context switches (voluntary and not, every thread, exited ones included) of this process.
double SelfSwitches() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_nvcsw + u.ru_nivcsw);
}

// Context switches of another process's live threads (/proc/PID/task/*/status); 0 for pid <= 0.
double ProcessSwitches(pid_t pid) {
  if (pid <= 0) return 0;
  double total = 0;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream f(task.path() / "status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0 ||
          line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
        total += std::strtod(line.c_str() + line.find(':') + 1, nullptr);
      }
    }
  }
  return total;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min<size_t>(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 5, batches = 4;
  std::vector<int> conn_counts = {1, 2, 4, 8};
  std::string peer_exe = TRANSPORT_PEER_PATH;
  bool local_shm_mode = false;
  uint64_t request_bytes = uint64_t{4} << 20;  // TcpTransportOptions' default
  bool zerocopy_mode = true;
  bool connection_share = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--rounds=", 0) == 0) {
      rounds = std::atoi(a.c_str() + 9);
    } else if (a.rfind("--batches=", 0) == 0) {
      batches = std::atoi(a.c_str() + 10);
    } else if (a.rfind("--connections=", 0) == 0) {
      conn_counts.clear();
      for (auto part : absl::StrSplit(a.substr(14), ',')) {
        int c;
        if (absl::SimpleAtoi(part, &c)) conn_counts.push_back(c);
      }
    } else if (a.rfind("--values=", 0) == 0) {
      g_values = std::atoi(a.c_str() + 9);
    } else if (a.rfind("--value-len=", 0) == 0) {
      g_value = std::strtoull(a.c_str() + 12, nullptr, 10);
    } else if (a == "--local=shm") {
      local_shm_mode = true;
    } else if (a == "--local=anon") {
      local_shm_mode = false;
    } else if (a.rfind("--request-bytes=", 0) == 0) {
      request_bytes = std::strtoull(a.c_str() + 16, nullptr, 10);
    } else if (a == "--connection-share") {
      connection_share = true;
    } else if (a == "--no-zc") {
      zerocopy_mode = false;
    } else if (a.rfind("--peer=", 0) == 0) {
      peer_exe = a.substr(7);
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }

  if (g_values <= 0 || g_value == 0 || g_value % 8 != 0) {
    std::fprintf(stderr, "--values must be positive and --value-len a positive multiple of 8\n");
    return 2;
  }
  auto shm = SharedMemory::Create(BatchBytes());
  if (!shm.ok()) return 1;
  for (uint64_t i = 0; i < BatchBytes(); i += 8) {
    const uint64_t v = i * 0x9E3779B97F4A7C15ull;
    std::memcpy((*shm)->base() + i, &v, 8);
  }

  // The raw server is forked first, before this process has any thread.
  const int listen_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof(addr);
  if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd, 64) != 0 ||
      ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) {
    std::perror("raw server");
    return 1;
  }
  const int raw_port = ntohs(addr.sin_port);
  const pid_t raw_pid = ::fork();
  if (raw_pid == 0) RawServer(listen_fd, (*shm)->base());
  ::close(listen_fd);

  auto peer = PeerProcess::Start(peer_exe, **shm, /*generation=*/1);
  auto peer_zc = PeerProcess::Start(peer_exe, **shm, /*generation=*/1, 0, /*zerocopy=*/true);
  if (!peer.ok() || !peer_zc.ok()) {
    std::fprintf(
        stderr, "peer: %s\n",
        peer.ok() ? peer_zc.status().ToString().c_str() : peer.status().ToString().c_str());
    return 1;
  }

  // The reader's destination: anonymous memory, or (--local=shm) a shared memfd mapping like an
  // owner's segment, whose 4 KiB pages are what a remote get or a replica pull writes into.
  std::unique_ptr<SharedMemory> local_shm;
  void* lp = nullptr;
  if (local_shm_mode) {
    auto m = SharedMemory::Create(BatchBytes());
    if (!m.ok()) return 1;
    local_shm = std::move(*m);
    lp = local_shm->base();
  } else {
    lp = ::mmap(nullptr, BatchBytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  auto* local = static_cast<uint8_t*>(lp);
  std::memset(local, 0, BatchBytes());  // fault the pages in before timing

  struct Runner {
    std::unique_ptr<TcpTransport> transport;
    PeerId peer;
  };
  std::map<int, Runner> fluxon, fluxon_zc;
  std::map<int, std::unique_ptr<RawClient>> raw;
  std::vector<Descriptor> descriptors;
  for (int i = 0; i < g_values; ++i)
    descriptors.push_back({i * g_value, local + i * g_value, g_value});
  for (int c : conn_counts) {
    for (auto* m : {&fluxon, &fluxon_zc}) {
      TcpTransportOptions o;
      o.listen_address = "";
      o.connections_per_peer = c;
      o.request_bytes = request_bytes;
      o.max_inflight_bytes_per_peer = std::max<uint64_t>(256 << 20, request_bytes);
      o.requests_of_connection_share = connection_share;
      auto t = TcpTransport::Create(o);
      if (!t.ok() || !(*t)->RegisterRegion(1, local, BatchBytes()).ok()) return 1;
      (*m)[c] = Runner{std::move(*t),
                       PeerId{m == &fluxon ? (*peer)->address() : (*peer_zc)->address(), 1}};
    }
    raw[c] = std::make_unique<RawClient>();
    if (!raw[c]->Connect(raw_port, c)) return 1;
  }

  std::map<std::string, Samples> samples;  // key: mode/C
  auto run_fluxon = [&](Runner& r) {
    auto h = r.transport->Submit(r.peer, OpKind::kRead, descriptors, absl::Seconds(60));
    if (!h.ok() || !h->Wait().status.ok()) {
      std::fprintf(stderr, "batch failed: %s\n",
                   h.ok() ? h->Wait().status.ToString().c_str() : h.status().ToString().c_str());
      std::exit(1);
    }
  };
  // `server`: the process that serves this mode's reads (its CPU counts with ours).
  auto measure = [&](const std::string& key, pid_t server, const std::function<void()>& batch) {
    batch();  // warm-up (connections, page tables)
    double total = 0;
    const double cpu0 = SelfCpuSeconds() + ProcessCpuSeconds(server);
    const double switches0 = SelfSwitches() + ProcessSwitches(server);
    for (int b = 0; b < batches; ++b) {
      const auto t0 = Clock::now();
      batch();
      const double s = Seconds(Clock::now() - t0);
      samples[key].batch_s.push_back(s);
      total += s;
    }
    samples[key].cpu_s += SelfCpuSeconds() + ProcessCpuSeconds(server) - cpu0;
    samples[key].switches += SelfSwitches() + ProcessSwitches(server) - switches0;
    samples[key].timed_batches += batches;
    samples[key].bytes += static_cast<double>(batches) * BatchBytes();
    samples[key].gbps_per_round.push_back(batches * BatchBytes() / total / 1e9);
  };
  for (int round = 0; round < rounds; ++round) {
    for (int c : conn_counts) {
      const std::string suffix = "/" + std::to_string(c);
      measure("fluxon-tcp" + suffix, (*peer)->pid(), [&] { run_fluxon(fluxon[c]); });
      measure("raw-tcp" + suffix, raw_pid, [&] { raw[c]->Batch(local); });
      if (zerocopy_mode) {
        measure("fluxon-tcp-zc" + suffix, (*peer_zc)->pid(), [&] { run_fluxon(fluxon_zc[c]); });
      }
    }
    measure("memcpy/1", 0, [&] { std::memcpy(local, (*shm)->base(), BatchBytes()); });
    std::fprintf(stderr, "round %d/%d done\n", round + 1, rounds);
  }
  if (std::memcmp(local, (*shm)->base(), BatchBytes()) != 0) {
    std::fprintf(stderr, "bytes differ after the run\n");
    return 1;
  }

  std::printf("read of %d x %llu B = %.1f MB per batch, %d rounds x %d batches per mode\n",
              g_values, static_cast<unsigned long long>(g_value), BatchBytes() / 1e6, rounds,
              batches);
  std::printf("fluxon requests: %llu B%s\n", static_cast<unsigned long long>(request_bytes),
              connection_share ? ", grown to the batch's share per connection" : "");
  std::printf(
      "| mode | connections | GB/s (median of rounds) | batch p50 ms | batch p99 ms | vs raw-tcp "
      "| CPU ms per GB | context switches per batch |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  auto row = [&](const std::string& mode, int c) {
    const std::string key = mode + "/" + std::to_string(c);
    const Samples& s = samples[key];
    const double gbps = Percentile(s.gbps_per_round, 0.5);
    const auto raw_it = samples.find("raw-tcp/" + std::to_string(c));
    std::string ratio = "";
    if (mode != "raw-tcp" && mode != "memcpy" && raw_it != samples.end()) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.0f %%",
                    100 * gbps / Percentile(raw_it->second.gbps_per_round, 0.5));
      ratio = buf;
    }
    std::printf("| %s | %d | %.2f | %.1f | %.1f | %s | %.0f | %.0f |\n", mode.c_str(), c, gbps,
                1e3 * Percentile(s.batch_s, 0.5), 1e3 * Percentile(s.batch_s, 0.99), ratio.c_str(),
                s.bytes > 0 ? 1e3 * s.cpu_s / (s.bytes / 1e9) : 0.0,
                s.timed_batches > 0 ? s.switches / s.timed_batches : 0.0);
  };
  for (int c : conn_counts) {
    row("fluxon-tcp", c);
    if (zerocopy_mode) row("fluxon-tcp-zc", c);
    row("raw-tcp", c);
  }
  row("memcpy", 1);

  fluxon.clear();
  fluxon_zc.clear();
  raw.clear();
  peer->reset();
  peer_zc->reset();
  ::kill(raw_pid, SIGKILL);
  ::waitpid(raw_pid, nullptr, 0);
  return 0;
}
