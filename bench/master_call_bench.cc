// The remote-get control calls' cost by batch size: one BatchGetStart of N keys followed by the
// BatchGetRevoke that ends those gets (the start pins every source; the revoke unpins them, so
// each iteration starts from the same state), and one BatchGetDone of N keys (a completed copy
// is added to each route, then removed again outside the timing), in process (MasterCore
// alone) and over gRPC on loopback (the daemon's client and service, plaintext). The gap
// between the two is what the RPC layer adds; items/s per key shows what grows with the batch.
//
//   build/bench/bench_master_call [--benchmark_filter=...] [--benchmark_min_time=0.5]
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/service_type.h>

#include <memory>
#include <string>
#include <vector>

#include "common/put_id.h"
#include "master/master_core.h"
#include "rpc_grpc/grpc_master.h"

namespace fluxon {
namespace {

constexpr uint32_t kSource = 2;
constexpr uint32_t kRequester = 3;
constexpr uint64_t kGeneration = 1000;
constexpr uint64_t kValueLen = 64 * 1024;
constexpr int kRoutes = 4096;

std::string KeyOf(int i) { return "kv/llama-3-8b/tp0/page/" + std::to_string(i); }

// One master with a source owner holding kRoutes values and a requester, served over gRPC.
class Cluster {
 public:
  Cluster() {
    MasterOptions options;
    options.owner_lease = std::chrono::hours(1);
    options.owner_grace = std::chrono::hours(1);
    core_ = std::make_unique<MasterCore>(options);
    for (uint32_t n : {kSource, kRequester}) {
      v1::RegisterOwnerRequest r;
      r.set_node_id(n);
      r.set_generation(kGeneration + n);
      r.set_capacity_bytes(uint64_t{1} << 40);
      r.set_address("127.0.0.1:" + std::to_string(40000 + n));
      r.add_transports("tcp");
      if (!core_->RegisterOwner(r).ok()) std::abort();
    }
    v1::PublishBatchRequest p;
    p.set_node_id(kSource);
    p.set_generation(kGeneration + kSource);
    put_id_ = (uint64_t{kSource} << kPutIdSeqBits) | 1;
    p.set_put_id(put_id_);
    for (int i = 0; i < kRoutes; ++i) {
      v1::RouteItem* it = p.add_items();
      it->set_key(KeyOf(i));
      it->set_put_id(put_id_);
      it->set_offset(static_cast<uint64_t>(i) * kValueLen);
      it->set_len(kValueLen);
      it->set_version(1);
    }
    if (!core_->PublishBatch(p).ok()) std::abort();
    service_ = MakeMasterGrpcService(core_.get());
    grpc::ServerBuilder b;
    ApplyServerLimits(&b);
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    auto client = MakeGrpcMasterClient("127.0.0.1:" + std::to_string(port));
    if (!server_ || !client.ok()) std::abort();
    client_ = std::move(*client);
  }
  ~Cluster() { server_->Shutdown(); }

  MasterApi* api(bool grpc) { return grpc ? client_.get() : static_cast<MasterApi*>(core_.get()); }
  MasterCore& core() { return *core_; }

  v1::BatchGetStartRequest StartOf(int n) {
    v1::BatchGetStartRequest r;
    r.set_requester_node_id(kRequester);
    r.set_requester_generation(kGeneration + kRequester);
    r.set_request_id(++request_id_);
    r.set_source_peers_apart(true);  // as an owner's RemoteFetcher asks
    for (int i = 0; i < n; ++i) {
      v1::GetStartItem* it = r.add_items();
      it->set_key(KeyOf(i));
      it->set_put_id(put_id_);
      it->set_target_offset(static_cast<uint64_t>(i) * kValueLen);
      it->set_len(kValueLen);
      it->set_version(1);
    }
    return r;
  }
  v1::BatchGetRevokeRequest RevokeOf(const v1::BatchGetStartReply& started) {
    v1::BatchGetRevokeRequest r;
    r.set_requester_node_id(kRequester);
    r.set_requester_generation(kGeneration + kRequester);
    for (const v1::GetStartResult& res : started.results()) r.add_get_ids(res.get_id());
    return r;
  }
  v1::BatchGetDoneRequest DoneOf(const v1::BatchGetStartRequest& start,
                                 const v1::BatchGetStartReply& started) {
    v1::BatchGetDoneRequest r;
    r.set_requester_node_id(kRequester);
    r.set_requester_generation(kGeneration + kRequester);
    for (int i = 0; i < start.items_size(); ++i) {
      v1::GetDoneItem* it = r.add_items();
      it->set_get_id(started.results(i).get_id());
      it->set_key(start.items(i).key());
      it->set_put_id(put_id_);
      it->set_target_offset(start.items(i).target_offset());
      it->set_len(kValueLen);
    }
    return r;
  }
  // Removes the requester's copies that a Done added (back to one location per route).
  void DropCopies(const v1::BatchGetStartRequest& start) {
    v1::RemoveRoutesRequest r;
    r.set_node_id(kRequester);
    r.set_generation(kGeneration + kRequester);
    for (const v1::GetStartItem& it : start.items()) {
      v1::RouteItem* item = r.add_items();
      item->set_key(it.key());
      item->set_put_id(put_id_);
    }
    if (!core_->RemoveRoutes(r).ok()) std::abort();
  }

 private:
  std::unique_ptr<MasterCore> core_;
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<MasterApi> client_;
  uint64_t put_id_ = 0;
  uint64_t request_id_ = 0;
};

Cluster& TheCluster() {
  static Cluster* cluster = new Cluster();  // lives until exit (benchmarks share it)
  return *cluster;
}

// Start + Revoke of N keys; the time of each call is reported apart (manual timing).
void BM_StartRevoke(benchmark::State& state) {
  Cluster& c = TheCluster();
  const bool grpc = state.range(0) != 0;
  const int n = static_cast<int>(state.range(1));
  MasterApi* api = c.api(grpc);
  double start_s = 0, revoke_s = 0;
  for (auto _ : state) {
    const v1::BatchGetStartRequest req = c.StartOf(n);
    const auto t0 = std::chrono::steady_clock::now();
    auto started = api->BatchGetStart(req);
    const auto t1 = std::chrono::steady_clock::now();
    if (!started.ok() || started->results_size() != n ||
        started->results(0).outcome() != v1::GET_STARTED) {
      state.SkipWithError("BatchGetStart did not start every get");
      break;
    }
    auto revoked = api->BatchGetRevoke(c.RevokeOf(*started));
    const auto t2 = std::chrono::steady_clock::now();
    if (!revoked.ok()) {
      state.SkipWithError("BatchGetRevoke failed");
      break;
    }
    start_s += std::chrono::duration<double>(t1 - t0).count();
    revoke_s += std::chrono::duration<double>(t2 - t1).count();
  }
  const double it = static_cast<double>(state.iterations());
  state.counters["start_us"] = 1e6 * start_s / it;
  state.counters["revoke_us"] = 1e6 * revoke_s / it;
  state.counters["start_us_per_key"] = 1e6 * start_s / it / n;
  state.SetItemsProcessed(state.iterations() * n);
}

// Start (untimed) + Done of N keys (timed); the copies added are removed outside the timing.
void BM_Done(benchmark::State& state) {
  Cluster& c = TheCluster();
  const bool grpc = state.range(0) != 0;
  const int n = static_cast<int>(state.range(1));
  MasterApi* api = c.api(grpc);
  for (auto _ : state) {
    state.PauseTiming();
    const v1::BatchGetStartRequest req = c.StartOf(n);
    auto started = c.core().BatchGetStart(req);
    if (!started.ok()) {
      state.SkipWithError("BatchGetStart failed");
      break;
    }
    const v1::BatchGetDoneRequest done = c.DoneOf(req, *started);
    state.ResumeTiming();
    auto r = api->BatchGetDone(done);
    state.PauseTiming();
    if (!r.ok() || r->outcomes_size() != n || r->outcomes(0) != v1::GET_DONE) {
      state.SkipWithError("BatchGetDone did not complete every get");
      break;
    }
    c.DropCopies(req);
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"grpc", "keys"});
  for (int grpc : {0, 1}) {
    for (int n : {1, 64, 256, 1024}) b->Args({grpc, n});
  }
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}
BENCHMARK(BM_StartRevoke)->Apply(Shapes);
BENCHMARK(BM_Done)->Apply(Shapes);

}  // namespace
}  // namespace fluxon

BENCHMARK_MAIN();
