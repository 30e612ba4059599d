// Shared fixture of the owner's part tests (tests/unit/owner/*_test.cc): the parts that
// OwnerCore::Create assembles (KeyIndex, SingleFlight, HandleTable, Publisher, PutPath, GetPath,
// Evictor, RemoteFetcher, MasterRegistration), constructed directly and wired as owner_core.cc
// wires them, over real owner memory (OwnerMemory::Create, a 1 GiB memfd segment) and a real
// MasterCore behind the fault-injecting master ("master.<Method>" fault points).
//
// Nothing here runs the maintenance actor: a test calls ExpireDue, RunRound, EvictSome and
// RunMaintenance itself, with the time it needs. The publish actor and the heartbeat run on
// threads only when asked for (PartsOptions), so a test can hold the publish queue still. Every
// wait is bounded; the fixture's teardown shuts the fault injector down first, so no delayed
// master call outlives a test.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/fault_injector.h"
#include "common/stop_signal.h"
#include "config/config.h"
#include "fluxon/units.h"
#include "master/master_core.h"
#include "owner/evictor.h"
#include "owner/get_path.h"
#include "owner/handle_table.h"
#include "owner/hot_tier.h"
#include "owner/key_index.h"
#include "owner/master_registration.h"
#include "owner/owner_counters.h"
#include "owner/owner_memory.h"
#include "owner/publisher.h"
#include "owner/put_path.h"
#include "owner/remote_fetcher.h"
#include "owner/single_flight.h"
#include "rpc/fault_injecting_master.h"
#include "transport/tcp/tcp_transport.h"

namespace fluxon::testing {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// One size class for every test (one 512 MiB grant carved per owner): 64 KiB values.
inline constexpr int64_t kValueLen = 64 * 1024;
// Every wait on an outcome in these tests ends after this, pass or fail.
inline constexpr milliseconds kWait{5'000};
// The data planes of the two-owner tests authenticate with this secret.
inline constexpr char kClusterSecret[] = "owner-part-tests-cluster-secret-0123456789";

// The one place these tests construct a KeyIndex.
inline std::unique_ptr<KeyIndex> MakeKeyIndex(OwnerCounters* counters, SlotPool* pool) {
  return std::make_unique<KeyIndex>(counters, pool);
}

struct PartsOptions {
  uint32_t node_id = 1;
  uint64_t segment_bytes = uint64_t{1} << 30;
  milliseconds claim_hard_timeout{1'000};
  milliseconds put_lease{60'000};
  milliseconds handle_ttl{30'000};
  milliseconds view_lease{300'000};
  milliseconds join_timeout{kWait};
  size_t publish_queue_capacity = 64;
  milliseconds commit_wait_timeout{kWait};
  double hot_capacity_ratio = 0.95;
  milliseconds remote_get_timeout{3'000};
  // GetPath's prefetch workers (threads started by Make): deferred get_starts need them.
  uint32_t prefetch_workers = 0;
  uint64_t prefetch_chunk_bytes = 0;
  // Registers the identity at the master when created (else the test does, or never).
  bool register_at_master = true;
  // The peer service address registered with the master (replica placement needs one).
  std::string peer_address;
  // The role registered with the master (placement prefers or restricts to remote_cache).
  std::string role = "embedded";
  // Runs Publisher::Run on a thread (else queued batches wait until the test runs it).
  bool run_publisher = true;
  // Runs MasterRegistration::HeartbeatLoop on a thread with this interval (0: no heartbeat).
  milliseconds heartbeat_interval{0};
  // Serves the segment over a TCP data plane on 127.0.0.1 and uses it for remote gets.
  bool data_plane = false;
  // A data-plane address registered at the master without serving one (a peer the master may
  // name as a source, whose reads would fail); ignored with data_plane.
  std::string fake_data_address;
};

// The bytes a test writes into a value of `key`: its first 8 bytes carry a tag of the key.
inline uint64_t TagOf(const std::string& key) { return std::hash<std::string>{}(key) | 1; }

// One owner's parts, wired as OwnerCore::Create wires them.
class OwnerParts {
 public:
  static std::unique_ptr<OwnerParts> Create(MasterApi* master, PartsOptions o) {
    std::unique_ptr<OwnerParts> p(new OwnerParts());
    p->options_ = o;
    OwnerParts* raw = p.get();
    OwnerConfig config;
    config.segment.size_bytes = o.segment_bytes;
    config.local_reserve.claim_hard_timeout = o.claim_hard_timeout;
    config.hot_capacity_ratio = o.hot_capacity_ratio;
    auto memory = OwnerMemory::Create(config, o.node_id, [raw](const PressureEvent&) {
      if (raw->evictor) raw->evictor->SignalPressure();
    });
    if (!memory.ok()) {
      ADD_FAILURE() << "owner memory: " << memory.status();
      return nullptr;
    }
    p->memory = std::move(*memory);
    p->counters = std::make_unique<OwnerCounters>();
    SlotPool* pool = &p->memory->pool();
    OwnerCounters* counters = p->counters.get();
    std::string address = o.fake_data_address;
    std::vector<std::string> transports;
    if (o.data_plane) {
      transport::TcpTransportOptions to;
      to.listen_address = "127.0.0.1:0";
      to.cluster_secret = kClusterSecret;
      to.connections_per_peer = 1;
      auto plane = transport::TcpTransport::Create(to);
      if (!plane.ok()) {
        ADD_FAILURE() << "data plane: " << plane.status();
        return nullptr;
      }
      p->plane = std::move(*plane);
      Segment& seg = p->memory->segment();
      const absl::Status registered =
          p->plane->RegisterRegion(seg.generation(), seg.base(), seg.total_bytes());
      if (!registered.ok()) {
        ADD_FAILURE() << "data plane region: " << registered;
        return nullptr;
      }
      address = p->plane->endpoint();
    }
    if (!address.empty()) transports = {"tcp"};
    p->registration = std::make_unique<MasterRegistration>(
        OwnerIdentity{o.node_id, p->memory->segment().generation(), o.role,
                      p->memory->segment().data_bytes(), address, transports},
        master, counters, &p->stop);
    p->registration->SetPeerAddress(o.peer_address);
    if (p->plane) {
      transport::Transport* plane = p->plane.get();
      p->registration->SetGenerationListener(
          [plane](uint64_t generation) { return plane->SetRegionGeneration(generation); });
    }
    p->keys = MakeKeyIndex(counters, pool);
    p->hot = std::make_unique<HotTier<>>();
    p->flights = std::make_unique<SingleFlight>();
    p->handles = std::make_unique<HandleTable>(counters, o.handle_ttl, o.view_lease);
    p->evictor = std::make_unique<Evictor>(
        Evictor::Options{o.hot_capacity_ratio, 256ull << 20, milliseconds(1)},
        p->registration.get(), master, p->keys.get(), p->hot.get(), pool, counters, &p->stop);
    p->publisher = std::make_unique<Publisher>(
        Publisher::Options{o.publish_queue_capacity, o.commit_wait_timeout}, p->registration.get(),
        master, p->keys.get(), pool, p->hot.get(), counters, p->evictor.get(), &p->stop);
    p->puts = std::make_unique<PutPath>(o.node_id, o.put_lease, p->keys.get(), pool,
                                        p->publisher.get(), counters);
    p->remote = std::make_unique<RemoteFetcher>(
        RemoteFetcher::Options{o.remote_get_timeout}, p->registration.get(), master, pool,
        p->keys.get(), p->hot.get(), p->publisher.get(), counters, p->evictor.get(), p->plane.get(),
        &p->peer_faults, &p->stop);
    p->gets = std::make_unique<GetPath>(
        GetPath::Options{o.join_timeout, o.prefetch_workers, o.remote_get_timeout + kWait,
                         o.prefetch_chunk_bytes},
        p->registration.get(), master, p->keys.get(), p->flights.get(), p->handles.get(),
        p->hot.get(), counters, p->evictor.get(), p->remote.get(), &p->stop);
    for (uint32_t i = 0; i < o.prefetch_workers; ++i) {
      p->threads_.emplace_back([raw] { raw->gets->RunPrefetches(); });
    }
    p->registration->SetPeerReadSink(
        [gets = p->gets.get()](const google::protobuf::RepeatedPtrField<v1::PeerRead>& reads) {
          gets->NotePeerReads(reads);
        });
    if (o.register_at_master) {
      const absl::Status registered = p->registration->Register();
      if (!registered.ok()) {
        ADD_FAILURE() << "registration of node " << o.node_id << ": " << registered;
        return nullptr;
      }
    }
    if (o.run_publisher) p->StartPublisher();
    if (o.heartbeat_interval.count() > 0) {
      p->threads_.emplace_back(
          [raw, interval = o.heartbeat_interval] { raw->registration->HeartbeatLoop(interval); });
    }
    return p;
  }

  ~OwnerParts() {
    Stop();
    // As ~OwnerCore: everything that holds slots goes before the memory, the data plane before
    // the segment it serves.
    gets.reset();
    remote.reset();
    puts.reset();
    publisher.reset();
    evictor.reset();
    handles.reset();
    flights.reset();
    hot.reset();
    keys.reset();
    if (plane) (void)plane->UnregisterRegion();
    plane.reset();
    registration.reset();
  }

  // As OwnerCore::BeginStop, then joins the threads this fixture started.
  void Stop() {
    stop.Stop();
    if (publisher) publisher->Interrupt();
    if (evictor) evictor->Interrupt();
    if (gets) gets->InterruptPrefetches();
    if (registration) registration->Interrupt();
    if (memory) memory->pool().CancelClaims();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }
  void StartPublisher() {
    threads_.emplace_back([this] { publisher->Run(); });
  }

  uint32_t node_id() const { return options_.node_id; }
  uint64_t generation() const { return registration->generation(); }
  SlotPool& pool() { return memory->pool(); }
  uint8_t* base() { return memory->segment().base(); }
  int64_t SlotsIn(SlotState s) { return pool().Stats().slots_by_state[static_cast<int>(s)]; }
  std::string State(const std::string& key) const { return keys->StateName(key); }

  // Declaration order is the reverse of destruction; the destructor resets explicitly anyway.
  std::unique_ptr<OwnerMemory> memory;
  std::unique_ptr<OwnerCounters> counters;
  StopSignal stop;
  FaultInjector peer_faults;  // "peer.read" of this owner's remote gets
  std::unique_ptr<transport::TcpTransport> plane;
  std::unique_ptr<MasterRegistration> registration;
  std::unique_ptr<KeyIndex> keys;
  std::unique_ptr<HotTier<>> hot;
  std::unique_ptr<SingleFlight> flights;
  std::unique_ptr<HandleTable> handles;
  std::unique_ptr<Evictor> evictor;
  std::unique_ptr<Publisher> publisher;
  std::unique_ptr<PutPath> puts;
  std::unique_ptr<RemoteFetcher> remote;
  std::unique_ptr<GetPath> gets;

 private:
  OwnerParts() = default;
  PartsOptions options_;
  std::vector<std::thread> threads_;
};

// A put's PutDone outcome, waited for with a bound.
class DoneLatch {
 public:
  DoneLatch() : promise_(std::make_shared<std::promise<absl::Status>>()) {
    future_ = promise_->get_future().share();
  }
  PutDoneCallback Callback() const {
    return [p = promise_](const absl::Status& s) { p->set_value(s); };
  }
  bool Ready(milliseconds within = milliseconds(0)) const {
    return future_.wait_for(within) == std::future_status::ready;
  }
  // The outcome, or DeadlineExceeded when it did not come within `within`.
  absl::Status Wait(milliseconds within = kWait) const {
    if (!Ready(within)) return absl::DeadlineExceededError("PutDone did not come in time");
    return future_.get();
  }

 private:
  std::shared_ptr<std::promise<absl::Status>> promise_;
  std::shared_future<absl::Status> future_;
};

// Polls `pred` until it holds or `within` passed; whether it held.
inline bool WaitUntil(const std::function<bool()>& pred, milliseconds within = kWait) {
  const auto deadline = Clock::now() + within;
  while (!pred()) {
    if (Clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

inline std::vector<std::string> Keys(const std::string& prefix, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

inline PutStartArgs Args(std::vector<std::string> keys, std::vector<uint32_t> groups = {},
                         int64_t value_len = kValueLen) {
  PutStartArgs a;
  a.keys = std::move(keys);
  a.value_len = value_len;
  a.options.atomic_group_lens = std::move(groups);
  return a;
}

// A started put whose values carry their keys' tags.
inline absl::StatusOr<PutStartOutcome> StartTagged(OwnerParts& o, uint64_t client,
                                                   const std::vector<std::string>& keys,
                                                   std::vector<uint32_t> groups = {}) {
  std::vector<uint32_t> conflicts;
  absl::StatusOr<PutStartOutcome> put =
      o.puts->Start(client, Args(keys, std::move(groups)), &conflicts);
  if (!put.ok()) return put;
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t tag = TagOf(keys[i]);
    std::memset(o.base() + put->offsets[i], 0, kValueLen);
    std::memcpy(o.base() + put->offsets[i], &tag, sizeof tag);
  }
  return put;
}

// Puts `keys` and waits until the publisher finished the batch; its PutDone outcome.
inline absl::Status PutAndPublish(OwnerParts& o, const std::vector<std::string>& keys,
                                  std::vector<uint32_t> groups = {}, uint64_t client = 7) {
  absl::StatusOr<PutStartOutcome> put = StartTagged(o, client, keys, std::move(groups));
  if (!put.ok()) return put.status();
  DoneLatch done;
  if (absl::Status s = o.puts->Commit(client, put->put_id, done.Callback(), false); !s.ok()) {
    return s;
  }
  return done.Wait();
}

// The master's route of `key`, if it has one.
inline std::optional<v1::Route> RouteOf(MasterApi& master, const std::string& key) {
  v1::LookupRequest r;
  r.add_keys(key);
  absl::StatusOr<v1::LookupReply> reply = master.Lookup(r);
  if (!reply.ok() || reply->found_size() != 1 || !reply->found(0)) return std::nullopt;
  return reply->routes(0);
}

// Registers node `node_id` under `generation` at `master`, with no data plane: a peer that
// exists only at the master.
inline absl::Status RegisterPeer(MasterCore& master, uint32_t node_id, uint64_t generation) {
  v1::RegisterOwnerRequest r;
  r.set_node_id(node_id);
  r.set_generation(generation);
  return master.RegisterOwner(r).status();
}

// Publishes, as node `node_id` under `generation`, the one route of `key` as `put_id` (a value at
// offset 4096 of that node's segment).
inline absl::Status PublishOne(MasterCore& master, uint32_t node_id, uint64_t generation,
                               uint64_t put_id, const std::string& key) {
  v1::PublishBatchRequest r;
  r.set_node_id(node_id);
  r.set_generation(generation);
  r.set_put_id(put_id);
  v1::RouteItem* item = r.add_items();
  item->set_key(key);
  item->set_put_id(put_id);
  item->set_offset(4096);
  item->set_len(kValueLen);
  return master.PublishBatch(r).status();
}

// The tag the value at `offset` of `o`'s segment carries.
inline uint64_t TagAt(OwnerParts& o, uint64_t offset) {
  uint64_t tag = 0;
  std::memcpy(&tag, o.base() + offset, sizeof tag);
  return tag;
}

// A LocalVisible holder on a slot of its own (no key index entry): what SingleFlight and
// HandleTable hand around.
inline HolderRef LocalHolder(OwnerParts& o, const std::string& key, uint64_t put_id = 1) {
  absl::StatusOr<std::vector<SlotRef>> slots = o.pool().Claim(kValueLen, 1);
  if (!slots.ok()) {
    ADD_FAILURE() << "claim: " << slots.status();
    return HolderRef();
  }
  absl::StatusOr<HolderRef> h =
      HolderRef::CommitLocalVisible(&o.pool(), slots->front(), key, put_id, kValueLen);
  if (!h.ok()) {
    ADD_FAILURE() << "commit: " << h.status();
    return HolderRef();
  }
  return *h;
}

// The base of every part test: one MasterCore behind a FaultInjectingMaster, and owners made
// over it on demand.
class OwnerPartsTest : public ::testing::Test {
 protected:
  ~OwnerPartsTest() override {
    faults_.Shutdown();  // no delayed master call outlives the test
    for (auto& o : owners_) {
      if (o) o->peer_faults.Shutdown();
    }
    owners_.clear();
  }

  // Replaces the master (before the first Make).
  void UseMaster(MasterOptions options) {
    master_ = std::make_unique<MasterCore>(options);
    faulty_ = std::make_unique<FaultInjectingMaster>(master_.get(), &faults_);
  }
  OwnerParts& Make(PartsOptions o = {}) { return MakeOn(faulty_.get(), o); }
  // An owner whose master calls go through `master` (a wrapper over faulty(), standing in for
  // a master that answers differently); kept until the owners are gone.
  OwnerParts& MakeOver(std::unique_ptr<MasterApi> master, PartsOptions o = {}) {
    masters_.push_back(std::move(master));
    return MakeOn(masters_.back().get(), o);
  }
  MasterCore& master() { return *master_; }
  MasterApi& faulty() { return *faulty_; }
  const MasterCounters& mc() { return master_->counters(); }
  void Fault(const std::string& point, FaultAction action, int count = 1,
             milliseconds delay = milliseconds(0)) {
    faults_.Set(FaultRule{point, action, delay, count});
  }

  FaultInjector faults_;
  std::unique_ptr<MasterCore> master_ = std::make_unique<MasterCore>();
  std::unique_ptr<FaultInjectingMaster> faulty_ =
      std::make_unique<FaultInjectingMaster>(master_.get(), &faults_);
  std::vector<std::unique_ptr<MasterApi>> masters_;  // MakeOver's; outlive the owners
  std::vector<std::unique_ptr<OwnerParts>> owners_;

 private:
  OwnerParts& MakeOn(MasterApi* master, const PartsOptions& o) {
    owners_.push_back(OwnerParts::Create(master, o));
    if (!owners_.back()) {
      ADD_FAILURE() << "owner parts of node " << o.node_id << " could not be made";
      std::abort();
    }
    return *owners_.back();
  }
};

}  // namespace fluxon::testing
