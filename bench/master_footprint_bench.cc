// The master's footprint and speed at scale, in process (no gRPC): N routes of K-byte keys
// published into one MasterCore as a new leader receives them (republish batches of 4,096 from
// --owners owners), then looked up. Prints the resident memory each route costs (VmRSS growth /
// N, the key bytes' share apart), publish and lookup throughput per core (thread CPU time), and
// the model for 100 M routes (memory, and the republish that fills a new leader).
//
//   build/bench/bench_master_footprint --routes 10000000 --key-bytes 107 --owners 2 \
//       [--route-keys full|fingerprint]
#include <sys/resource.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/put_id.h"
#include "master/master_core.h"

namespace fluxon {
namespace {

uint64_t RssBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  }
  return 0;
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Key i: a fixed prefix padded to `bytes` with i's decimal digits at the end (SGLang's page keys
// are hashes of this order of length; what matters here is the length).
std::string KeyOf(uint64_t i, size_t bytes) {
  std::string k = "kv/llama-3-8b/tp0/page/" + std::to_string(i);
  if (k.size() < bytes) k.insert(k.find("/page/") + 6, bytes - k.size(), 'x');
  return k;
}

int Run(uint64_t routes, size_t key_bytes, uint32_t owners, RouteKeys route_keys) {
  MasterOptions options;
  options.route_keys = route_keys;
  options.owner_lease = std::chrono::hours(1);
  options.owner_grace = std::chrono::hours(1);
  MasterCore master(options);
  for (uint32_t n = 1; n <= owners; ++n) {
    v1::RegisterOwnerRequest r;
    r.set_node_id(n);
    r.set_generation(1000 + n);
    r.set_capacity_bytes(uint64_t{1} << 40);
    if (!master.RegisterOwner(r).ok()) return 1;
  }
  const uint64_t rss0 = RssBytes();
  constexpr uint64_t kBatch = 4096;
  double cpu = 0, wall = 0;
  v1::PublishBatchRequest req;
  for (uint64_t b = 0; b < routes; b += kBatch) {
    const uint32_t node = 1 + static_cast<uint32_t>((b / kBatch) % owners);
    req.Clear();
    req.set_node_id(node);
    req.set_generation(1000 + node);
    req.set_republish(true);
    const uint64_t put_id = (uint64_t{node} << kPutIdSeqBits) | (b / kBatch + 1);
    req.set_put_id(put_id);
    for (uint64_t i = b; i < std::min(routes, b + kBatch); ++i) {
      v1::RouteItem* it = req.add_items();
      it->set_key(KeyOf(i, key_bytes));
      it->set_put_id(put_id);
      it->set_offset((i - b) * 4096);
      it->set_len(4096);
      it->set_version(1);
    }
    const double c0 = ThreadCpuSeconds(), w0 = WallSeconds();
    if (!master.PublishBatch(req).ok()) return 1;
    cpu += ThreadCpuSeconds() - c0;
    wall += WallSeconds() - w0;
  }
  const uint64_t rss1 = RssBytes();
  if (master.route_count() != routes) {
    std::fprintf(stderr, "routes %zu, expected %lu\n", master.route_count(), routes);
    return 1;
  }
  // Lookups of random routed keys, in batches like a remote get's.
  std::mt19937_64 rng(42);
  const uint64_t lookups = std::min<uint64_t>(routes, 2'000'000);
  double lcpu = 0;
  v1::LookupRequest lr;
  for (uint64_t done = 0; done < lookups; done += kBatch) {
    lr.Clear();
    lr.set_requester_node_id(1);
    for (uint64_t i = 0; i < kBatch; ++i) lr.add_keys(KeyOf(rng() % routes, key_bytes));
    const double c0 = ThreadCpuSeconds();
    auto r = master.Lookup(lr);
    lcpu += ThreadCpuSeconds() - c0;
    if (!r.ok()) return 1;
  }
  const double per_route = static_cast<double>(rss1 - rss0) / static_cast<double>(routes);
  const double publish_rate = static_cast<double>(routes) / cpu;
  std::printf(
      "routes %lu, keys of %zu B, %u owners, route keys kept %s\n"
      "master RSS %.1f -> %.1f MiB: %.0f B per route (of which %zu B the key's bytes kept)\n"
      "republish into an empty master: %.2f s wall, %.0f routes/s per core\n"
      "lookup: %.0f keys/s per core (batches of %lu)\n"
      "model, 100 M routes: %.1f GiB, republish %.0f s on one core\n",
      routes, key_bytes, owners, route_keys == RouteKeys::kFull ? "in full" : "as fingerprints",
      rss0 / 1048576.0, rss1 / 1048576.0, per_route, route_keys == RouteKeys::kFull ? key_bytes : 0,
      wall, publish_rate, static_cast<double>(lookups) / lcpu, kBatch,
      per_route * 1e8 / (1024.0 * 1024 * 1024), 1e8 / publish_rate);
  return 0;
}

}  // namespace
}  // namespace fluxon

int main(int argc, char** argv) {
  uint64_t routes = 1'000'000;
  size_t key_bytes = 107;
  uint32_t owners = 2;
  fluxon::RouteKeys route_keys = fluxon::RouteKeys::kFull;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--route-keys" &&
        (std::strcmp(argv[i + 1], "full") == 0 || std::strcmp(argv[i + 1], "fingerprint") == 0)) {
      route_keys = std::strcmp(argv[i + 1], "full") == 0 ? fluxon::RouteKeys::kFull
                                                         : fluxon::RouteKeys::kFingerprint;
      continue;
    }
    const uint64_t v = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--routes") {
      routes = v;
    } else if (flag == "--key-bytes") {
      key_bytes = v;
    } else if (flag == "--owners") {
      owners = static_cast<uint32_t>(v);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--routes N] [--key-bytes K] [--owners O] "
                   "[--route-keys full|fingerprint]\n",
                   argv[0]);
      return 2;
    }
  }
  if (routes == 0 || owners == 0 || owners > 1000) return 2;
  return fluxon::Run(routes, key_bytes, owners, route_keys);
}
