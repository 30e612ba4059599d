// transport_peer: a serving process for the transport conformance suite and the benchmark.
//
//   transport_peer --fd=N --len=BYTES --generation=G [--port=P] [--zerocopy]
//
// Maps the shared memory behind the inherited fd N (a memfd the parent created and also maps),
// registers [0, len) with a TcpTransport under generation G, prints "PORT <port>" on stdout and
// serves until its stdin reaches EOF (the parent closed it or died) or it is killed.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "transport/tcp/tcp_transport.h"

namespace {

bool Flag(const char* arg, const char* name, std::string* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int fd = -1;
  uint64_t len = 0, generation = 0;
  int port = 0;
  bool zerocopy = false;
  for (int i = 1; i < argc; ++i) {
    std::string v;
    if (Flag(argv[i], "--fd", &v)) {
      fd = std::atoi(v.c_str());
    } else if (Flag(argv[i], "--len", &v)) {
      len = std::strtoull(v.c_str(), nullptr, 10);
    } else if (Flag(argv[i], "--generation", &v)) {
      generation = std::strtoull(v.c_str(), nullptr, 10);
    } else if (Flag(argv[i], "--port", &v)) {
      port = std::atoi(v.c_str());
    } else if (std::strcmp(argv[i], "--zerocopy") == 0) {
      zerocopy = true;
    } else {
      std::fprintf(stderr, "transport_peer: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (fd < 0 || len == 0 || generation == 0) {
    std::fprintf(stderr, "usage: transport_peer --fd=N --len=BYTES --generation=G [--port=P]\n");
    return 2;
  }
  void* base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    std::perror("transport_peer: mmap");
    return 1;
  }
  fluxon::transport::TcpTransportOptions options;
  options.listen_address = "127.0.0.1:" + std::to_string(port);
  options.zerocopy_send = zerocopy;
  // The conformance suite writes into this peer (a transport property); owners never allow it.
  options.write_filter = [](uint64_t, uint64_t) { return true; };
  auto transport = fluxon::transport::TcpTransport::Create(options);
  if (!transport.ok()) {
    std::fprintf(stderr, "transport_peer: %s\n", transport.status().ToString().c_str());
    return 1;
  }
  absl::Status s = (*transport)->RegisterRegion(generation, base, len);
  if (!s.ok()) {
    std::fprintf(stderr, "transport_peer: %s\n", s.ToString().c_str());
    return 1;
  }
  const std::string ep = (*transport)->endpoint();
  std::printf("PORT %s\n", ep.substr(ep.rfind(':') + 1).c_str());
  std::fflush(stdout);
  char buf[64];
  while (::read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
  }
  (void)(*transport)->UnregisterRegion();
  transport->reset();
  ::munmap(base, len);
  return 0;
}
