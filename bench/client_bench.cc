// Control-path cost of the hostless API through the real Unix-socket protocol (no data copy):
//   get cycle = get_start + get_transfer + release_views on local hits,
//   put cycle = local_fast_put_start + local_fast_put_commit,
// for batches of 1, 32 and 128 pages, against an in-process embedded fluxond. Also the same
// 128-key request as a gRPC unary call over a Unix socket (MasterService.Lookup) to show why the
// client <-> owner hot path does not use gRPC.
//
//   build/bench/bench_client --benchmark_min_time=1
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

#include "common/mutex.h"
#include "daemon/node.h"
#include "fluxon/client.h"
#include "fluxon/units.h"
#include "fluxon/v1/master.grpc.pb.h"
#include "master/master_core.h"

namespace fluxon {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kValueLen = 4096;  // control-path cost does not depend on the value size

// With FLUXON_SOCKET set the client benchmarks use that running fluxond (another process, as in
// production); otherwise they start an embedded node in this process. The *InProcess benchmarks
// always run on an embedded node of their own (they call the owner directly: the floor).
struct Env {
  explicit Env(bool in_process) {
    if (const char* external = std::getenv("FLUXON_SOCKET"); external != nullptr && !in_process) {
      ClientOptions o;
      o.socket_path = external;
      client = std::move(*KvClient::Connect(o));
      return;
    }
    Config c = DefaultEmbeddedConfig();
    c.log_level = "error";
    c.master->listen_address = "127.0.0.1:0";
    c.admin.listen_address = "127.0.0.1:0";
    c.admin.metrics_port = 0;
    c.owner->socket_path =
        "/tmp/fluxon-bench-" + std::to_string(getpid()) + (in_process ? "-inproc" : "") + ".sock";
    c.owner->segment.size_bytes = 4 * kGrantBytes;
    node = std::move(*FluxonNode::Start(c));
    ClientOptions o;
    o.socket_path = c.owner->socket_path;
    client = std::move(*KvClient::Connect(o));
  }
  std::unique_ptr<FluxonNode> node;
  std::unique_ptr<KvClient> client;
};

Env& Shared() {
  static Env* env = new Env(/*in_process=*/false);
  return *env;
}
Env& InProcess() {
  static Env* env = new Env(/*in_process=*/true);
  return *env;
}

void ReportPercentiles(benchmark::State& state, std::vector<double>& us) {
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  state.counters["p50_us"] = us[us.size() / 2];
  state.counters["p99_us"] = us[std::min(us.size() - 1, us.size() * 99 / 100)];
}

std::vector<std::string> Keys(const std::string& prefix, int64_t n, int64_t from) {
  std::vector<std::string> keys;
  for (int64_t i = 0; i < n; ++i) keys.push_back(prefix + std::to_string(from + i));
  return keys;
}

// Puts `keys` unless every one is stored already (a get cycle's local hits).
void PutUnlessStored(Env& env, const std::vector<std::string>& keys) {
  if (auto probe = env.client->GetStart(keys); probe.ok()) {
    const bool present = probe->result.all_hit;
    (void)env.client->CancelGetTransfer(*probe);
    if (!present) {
      auto plan = env.client->LocalFastPutStart(keys, kValueLen, {});
      (void)env.client->LocalFastPutCommit(*plan)->Wait();
    }
  }
}

void BM_GetCycleLocalHit(benchmark::State& state) {
  Env& env = Shared();
  const int64_t n = state.range(0);
  auto keys = Keys("hit" + std::to_string(n) + "-", n, 0);
  PutUnlessStored(env, keys);
  std::vector<double> us;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    auto h = env.client->GetStart(keys);
    auto plan = env.client->GetTransfer(*h);
    absl::Status s = env.client->ReleaseViews(*plan);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!s.ok() || !h->result.all_hit) state.SkipWithError("get cycle failed");
  }
  ReportPercentiles(state, us);
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_GetCycleLocalHit)->Arg(1)->Arg(32)->Arg(128)->UseRealTime();

// The same cycle with get_start transferring the prefix (GetStartOptions::transfer): two round
// trips, get_start and release_views; get_transfer issues the plan without calling the owner.
void BM_GetCycleLocalHitTransferWithStart(benchmark::State& state) {
  Env& env = Shared();
  const int64_t n = state.range(0);
  auto keys = Keys("hit" + std::to_string(n) + "-", n, 0);
  PutUnlessStored(env, keys);
  GetStartOptions options;
  options.transfer = true;
  std::vector<double> us;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    auto h = env.client->GetStart(keys, options);
    auto plan = env.client->GetTransfer(*h);
    absl::Status s = env.client->ReleaseViews(*plan);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!s.ok() || !h->result.all_hit || !h->result.transferred) {
      state.SkipWithError("get cycle failed");
    }
  }
  ReportPercentiles(state, us);
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_GetCycleLocalHitTransferWithStart)->Arg(1)->Arg(128)->UseRealTime();

// One put cycle (local_fast_put_start + commit) of `keys`, its time in µs appended to `us`.
absl::StatusOr<KvFuture> TimedPutCycle(KvClient& client, const std::vector<std::string>& keys,
                                       std::vector<double>* us) {
  const auto t0 = Clock::now();
  absl::StatusOr<uint64_t> plan = client.LocalFastPutStart(keys, kValueLen, {});
  if (!plan.ok()) return plan.status();
  absl::StatusOr<KvFuture> fut = client.LocalFastPutCommit(*plan);
  us->push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  return fut;
}

void BM_PutCycle(benchmark::State& state) {
  Env& env = Shared();
  const int64_t n = state.range(0);
  static int64_t next = static_cast<int64_t>(getpid()) << 32;
  std::vector<double> us;
  std::vector<KvFuture> futures;
  for (auto _ : state) {
    auto keys = Keys("put-", n, next);
    next += n;
    absl::StatusOr<KvFuture> fut = TimedPutCycle(*env.client, keys, &us);
    if (!fut.ok()) {
      state.SkipWithError(std::string(fut.status().message()).c_str());
      break;
    }
    futures.push_back(*fut);
  }
  for (auto& f : futures) (void)f.Wait();
  if (std::getenv("FLUXON_BENCH_SLOW_US") != nullptr) {
    const double slow = std::atof(std::getenv("FLUXON_BENCH_SLOW_US"));
    for (size_t i = 0; i < us.size(); ++i) {
      if (us[i] > slow)
        std::fprintf(stderr, "slow put %zu (%lld keys before): %.0f us\n", i,
                     static_cast<long long>(i * n), us[i]);
    }
  }
  ReportPercentiles(state, us);
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_PutCycle)->Arg(1)->Arg(32)->Arg(128)->UseRealTime()->Iterations(2000);

// The same put cycle at steady state: each batch is deleted (untimed) `kSteadyDepth` batches
// later, so puts reuse slots that were written before instead of carving and first-touching
// fresh memory (BM_PutCycle puts 1 GiB of new values at 128 pages: 2 grants carved and
// populated during the run). The difference between the two is the cost of fresh memory.
void BM_PutCycleSteady(benchmark::State& state) {
  constexpr int64_t kSteadyDepth = 16;
  Env& env = Shared();
  const int64_t n = state.range(0);
  static int64_t next = (static_cast<int64_t>(getpid()) << 32) + (int64_t{1} << 31);
  const std::string run = "steady" + std::to_string(next) + "-";
  std::vector<double> us;
  std::deque<KvFuture> pending;
  int64_t batch = 0;
  for (auto _ : state) {
    auto keys = Keys(run + std::to_string(batch) + "-", n, 0);
    absl::StatusOr<KvFuture> fut = TimedPutCycle(*env.client, keys, &us);
    if (!fut.ok()) {
      state.SkipWithError(std::string(fut.status().message()).c_str());
      break;
    }
    state.PauseTiming();
    pending.push_back(*fut);
    if (static_cast<int64_t>(pending.size()) > kSteadyDepth) {
      (void)pending.front().Wait();
      pending.pop_front();
      (void)env.client->DeletePrefix(run + std::to_string(batch - kSteadyDepth) + "-");
    }
    ++batch;
    state.ResumeTiming();
  }
  for (auto& f : pending) (void)f.Wait();
  (void)env.client->DeletePrefix(run);
  next += 1;
  ReportPercentiles(state, us);
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_PutCycleSteady)->Arg(128)->UseRealTime()->Iterations(2000);

// Baseline: one gRPC unary call carrying 128 keys over a Unix socket (callback-free sync API).
void BM_GrpcUnaryUnixSocket(benchmark::State& state) {
  static MasterCore* master = new MasterCore();
  static std::unique_ptr<grpc::Server> server;
  static std::unique_ptr<v1::MasterService::Stub> stub;
  static std::unique_ptr<v1::MasterService::Service> service;
  if (!server) {
    class Svc : public v1::MasterService::Service {
     public:
      grpc::Status Lookup(grpc::ServerContext*, const v1::LookupRequest* r,
                          v1::LookupReply* out) override {
        *out = *master->Lookup(*r);
        return grpc::Status::OK;
      }
    };
    service = std::make_unique<Svc>();
    const std::string addr = "unix:/tmp/fluxon-bench-grpc-" + std::to_string(getpid()) + ".sock";
    grpc::ServerBuilder b;
    b.AddListeningPort(addr, grpc::InsecureServerCredentials());
    b.RegisterService(service.get());
    server = b.BuildAndStart();
    stub =
        v1::MasterService::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  }
  v1::LookupRequest req;
  for (const auto& k : Keys("grpc-", state.range(0), 0)) req.add_keys(k);
  std::vector<double> us;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    grpc::ClientContext ctx;
    v1::LookupReply reply;
    grpc::Status s = stub->Lookup(&ctx, req, &reply);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!s.ok()) state.SkipWithError("grpc failed");
  }
  ReportPercentiles(state, us);
}
BENCHMARK(BM_GrpcUnaryUnixSocket)->Arg(128)->UseRealTime();

// The same 128-key lookup as one round trip of Fluxon's framed Unix-socket protocol (get_start on
// keys that all miss, then cancel: two round trips).
void BM_FramedUnixSocketMiss(benchmark::State& state) {
  Env& env = Shared();
  auto keys = Keys("miss-", state.range(0), 0);
  std::vector<double> us;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    auto h = env.client->GetStart(keys);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    (void)env.client->CancelGetTransfer(*h);
  }
  ReportPercentiles(state, us);
}
BENCHMARK(BM_FramedUnixSocketMiss)->Arg(1)->Arg(128)->UseRealTime();

}  // namespace
}  // namespace fluxon

namespace fluxon {
namespace {
// The owner's share of the get cycle, without the socket.
void BM_OwnerGetCycleInProcess(benchmark::State& state) {
  Env& env = InProcess();
  const int64_t n = state.range(0);
  auto keys = Keys("hit" + std::to_string(n) + "-", n, 0);
  if (env.node->owner()->KeyState(keys[0]) == "absent") {
    auto plan = env.client->LocalFastPutStart(keys, kValueLen, {});
    (void)env.client->LocalFastPutCommit(*plan)->Wait();
  }
  OwnerCore* owner = env.node->owner();
  std::vector<double> us;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    auto r = owner->GetStart(999, keys, {}, true);
    if (!r.ok()) {
      state.SkipWithError(r.status().ToString().c_str());
      break;
    }
    (void)owner->GetTransfer(999, r->handle_id, 0);
    (void)owner->ReleaseViews(999, r->handle_id);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  ReportPercentiles(state, us);
}
BENCHMARK(BM_OwnerGetCycleInProcess)->Arg(1)->Arg(128)->UseRealTime();
}  // namespace
}  // namespace fluxon

namespace fluxon {
namespace {
// The owner's share of the put cycle (reserve + claim, commit local-visible), without the socket;
// publish_us is the background publish that follows (master publish + promotion + admission).
void BM_OwnerPutCycleInProcess(benchmark::State& state) {
  Env& env = InProcess();
  OwnerCore* owner = env.node->owner();
  const int64_t n = state.range(0);
  static int64_t next = 0;
  std::vector<double> us, start_us, publish_us;
  for (auto _ : state) {
    PutStartArgs a;
    for (int64_t i = 0; i < n; ++i) a.keys.push_back("ip-" + std::to_string(next++));
    a.value_len = kValueLen;
    const auto t0 = Clock::now();
    auto r = owner->PutStart(999, a, nullptr);
    if (!r.ok()) {
      state.SkipWithError(r.status().ToString().c_str());
      break;
    }
    start_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    Mutex mu;
    CondVar cv;
    bool done = false;
    Clock::time_point published;
    (void)owner->PutCommit(999, r->put_id, [&](const absl::Status&) {
      MutexLock lock(&mu);
      published = Clock::now();
      done = true;
      cv.SignalAll();
    });
    const auto t1 = Clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    MutexLock lock(&mu);
    while (!done) cv.Wait(&mu);
    publish_us.push_back(std::chrono::duration<double, std::micro>(published - t1).count());
  }
  ReportPercentiles(state, us);
  if (publish_us.empty()) return;
  std::sort(start_us.begin(), start_us.end());
  state.counters["start_p99_us"] =
      start_us[std::min(start_us.size() - 1, start_us.size() * 99 / 100)];
  std::sort(publish_us.begin(), publish_us.end());
  state.counters["publish_p50_us"] = publish_us[publish_us.size() / 2];
}
BENCHMARK(BM_OwnerPutCycleInProcess)->Arg(1)->Arg(128)->UseRealTime()->Iterations(1000);
}  // namespace
}  // namespace fluxon
