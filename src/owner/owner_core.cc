#include "owner/owner_core.h"

#include <algorithm>

#include "fluxon/units.h"

#include "spdlog/spdlog.h"
#include "transport/transport.h"

namespace fluxon {

namespace {
// Internal sizes and bounds (not settings).
constexpr size_t kPublishQueueCapacity = 512;
constexpr std::chrono::milliseconds kJoinTimeout{5'000};  // a joiner waits this long for a leader
constexpr uint64_t kPopulateBytesPerRound = 64ull << 20;  // of carved grants, per prefault step
constexpr std::chrono::milliseconds kPrefaultIdle{20};    // the prefault thread's idle poll
}  // namespace

// The one place the parts' options are built from the owner's config.
absl::StatusOr<std::unique_ptr<OwnerCore>> OwnerCore::Create(const OwnerConfig& config,
                                                             MasterApi* master,
                                                             OwnerRuntime runtime) {
  if (master == nullptr) return absl::InvalidArgumentError("owner needs a master");
  std::unique_ptr<OwnerCore> core(new OwnerCore(config, std::move(runtime)));
  OwnerCore* raw = core.get();
  const OwnerRuntime& rt = core->runtime_;
  absl::StatusOr<std::unique_ptr<OwnerMemory>> memory =
      OwnerMemory::Create(config, rt.node_id, [raw](const PressureEvent&) {
        if (raw->evictor_) raw->evictor_->SignalPressure();
      });
  if (!memory.ok()) return memory.status();
  core->memory_ = std::move(*memory);
  OwnerCore& c = *core;
  SlotPool* pool = &c.memory_->pool();
  OwnerCounters* counters = c.counters_.get();
  const std::vector<std::string> transports =
      rt.data_address.empty() ? std::vector<std::string>() : config.transports;
  c.registration_ = std::make_unique<MasterRegistration>(
      OwnerIdentity{rt.node_id, c.generation(), RoleName(rt.role),
                    c.memory_->segment().data_bytes(), rt.data_address, transports},
      master, counters, &c.stop_);
  MasterRegistration* registration = c.registration_.get();
  c.keys_ = std::make_unique<KeyIndex>(counters, pool);
  c.hot_ = std::make_unique<HotTier<>>();
  registration->SetCapacitySource([raw] { return raw->Capacity(); });
  c.flights_ = std::make_unique<SingleFlight>();
  c.handles_ = std::make_unique<HandleTable>(counters, config.handle_ttl, config.view_lease);
  c.evictor_ = std::make_unique<Evictor>(
      Evictor::Options{config.hot_capacity_ratio, config.eviction_max_bytes_per_round,
                       config.eviction_interval},
      registration, master, c.keys_.get(), c.hot_.get(), pool, counters, &c.stop_);
  // Write-through needs another node to copy to: a master, a data plane and the peer service.
  if (rt.peers != nullptr && rt.role != Role::kEmbedded && !rt.data_address.empty()) {
    c.write_through_ = std::make_unique<WriteThroughTracker>(registration, master);
  }
  c.replicas_ = std::make_unique<ReplicaQueue>(
      ReplicaQueue::Options{config.replica_queue_keys, config.replica_batch_keys,
                            config.replica_pull_timeout, config.replica_pulls_in_flight},
      registration, master, rt.peers, c.keys_.get(), counters, &c.stop_, c.evictor_.get());
  if (config.demotion.enabled) {
    c.evictor_->EnableDemotion(
        c.replicas_.get(),
        DemotionOptions{.start_ratio = config.demotion.start_ratio,
                        .max_bytes_in_flight = config.demotion.max_bytes_in_flight,
                        .remote_budget_bytes = config.demotion.remote_budget_bytes,
                        .keep_fetched_copies = config.demotion.keep_fetched_copies},
        rt.peers);
  }
  c.publisher_ = std::make_unique<Publisher>(
      Publisher::Options{kPublishQueueCapacity, config.commit_wait_timeout}, registration, master,
      c.keys_.get(), pool, c.hot_.get(), counters, c.evictor_.get(), &c.stop_, c.replicas_.get());
  c.puts_ = std::make_unique<PutPath>(rt.node_id, config.put_lease, c.keys_.get(), pool,
                                      c.publisher_.get(), counters, c.write_through_.get());
  c.republisher_ =
      std::make_unique<Republisher>(Republisher::Options{}, registration, master, c.keys_.get(),
                                    c.evictor_.get(), counters, &c.stop_);
  c.remote_ = std::make_unique<RemoteFetcher>(RemoteFetcher::Options{config.remote_get_timeout},
                                              registration, master, pool, c.keys_.get(),
                                              c.hot_.get(), c.publisher_.get(), counters,
                                              c.evictor_.get(), rt.data_plane, rt.faults, &c.stop_);
  c.puller_ = std::make_unique<ReplicaPuller>(c.keys_.get(), c.remote_.get(), counters);
  // A deferred value is waited for as long as its fetch may take, and a margin.
  const GetPath::Options get_options{kJoinTimeout, config.remote_prefetch_workers,
                                     config.remote_get_timeout + std::chrono::seconds(2),
                                     config.remote_prefetch_chunk_bytes};
  c.gets_ = std::make_unique<GetPath>(get_options, registration, master, c.keys_.get(),
                                      c.flights_.get(), c.handles_.get(), c.hot_.get(), counters,
                                      c.evictor_.get(), c.remote_.get(), &c.stop_);
  // Peers' reads of this owner's values rank them in its hot tier (heartbeat answers).
  registration->SetPeerReadSink(
      [gets = c.gets_.get()](const google::protobuf::RepeatedPtrField<v1::PeerRead>& reads) {
        gets->NotePeerReads(reads);
      });
  return core;
}

OwnerCore::OwnerCore(const OwnerConfig& config, OwnerRuntime runtime)
    : config_(config), runtime_(std::move(runtime)), counters_(std::make_unique<OwnerCounters>()) {}

OwnerCore::~OwnerCore() {
  Stop();
  // Everything that holds slots goes before the memory (members are destroyed in reverse
  // declaration order, memory_ last; explicit here so the order is visible).
  gets_.reset();
  puller_.reset();
  remote_.reset();
  republisher_.reset();
  puts_.reset();
  publisher_.reset();
  replicas_.reset();
  evictor_.reset();
  handles_.reset();
  flights_.reset();
  hot_.reset();
  keys_.reset();
}

absl::Status OwnerCore::Start() {
  absl::Status registered = registration_->RegisterAtStart(config_.register_timeout);
  if (!registered.ok()) return registered;
  started_ = true;
  threads_.emplace_back([this] { publisher_->Run(); });
  threads_.emplace_back([this] { MaintenanceLoop(); });
  threads_.emplace_back([this] { PrefaultLoop(); });
  threads_.emplace_back([this] { registration_->HeartbeatLoop(config_.heartbeat_interval); });
  threads_.emplace_back([this] { republisher_->Run(); });
  for (uint32_t i = 0; i < config_.replica_pulls_in_flight; ++i) {
    threads_.emplace_back([this] { replicas_->Run(); });
  }
  for (uint32_t i = 0; i < config_.remote_prefetch_workers; ++i) {
    threads_.emplace_back([this] { gets_->RunPrefetches(); });
  }
  return absl::OkStatus();
}

void OwnerCore::BeginStop() {
  stop_.Stop();
  if (publisher_) publisher_->Interrupt();
  if (replicas_) replicas_->Interrupt();
  if (evictor_) evictor_->Interrupt();
  if (gets_) gets_->InterruptPrefetches();
  if (registration_) registration_->Interrupt();
  if (memory_) memory_->pool().CancelClaims();
}

void OwnerCore::Stop() {
  BeginStop();
  if (threads_.empty()) return;
  for (auto& t : threads_) t.join();
  threads_.clear();
  // Give the node_id back so a restarted owner need not wait for the lease (best effort).
  if (started_) registration_->Unregister();
}

void OwnerCore::DisconnectClient(uint64_t client_id) {
  const size_t puts = puts_->AbortSession(client_id);
  const size_t handles = gets_->DropSession(client_id);
  counters_->disconnects.fetch_add(1, std::memory_order_relaxed);
  if (puts > 0 || handles > 0) {
    spdlog::info("client {} disconnected: aborted {} prepared puts, released {} handles/views",
                 client_id, puts, handles);
  }
}

void OwnerCore::PrefaultLoop() {
  // First touch of grant memory, off every request's and the maintenance thread's path (expiry
  // and eviction never wait behind 512 MiB of page clearing): carved grants first (clients may
  // be writing into them), then free positions ahead of carves (warm_grants).
  while (!stop_.stopped()) {
    if (memory_->pool().PopulateBehind(kPopulateBytesPerRound) > 0) continue;
    memory_->pool().PrefaultAhead();
    if (!stop_.SleepFor(kPrefaultIdle)) return;
  }
}

void OwnerCore::MaintenanceLoop() {
  while (evictor_->WaitForWork(runtime_.maintenance_interval)) {
    const auto now = std::chrono::steady_clock::now();
    gets_->ExpireDue(now);
    puts_->ExpireDue(now);
    remote_->RunMaintenance(now);
    memory_->pool().ShrinkIdleGrants();
    memory_->pool().RefillLowClasses();
    evictor_->RunRound();
  }
}

v1::OwnerCapacity OwnerCore::Capacity() const {
  const SlotPoolStats s = memory_->pool().Stats();
  // Free: grant positions not carved yet, and the free slots of carved grants.
  uint64_t free_bytes = (s.grant_capacity - std::min(s.grants, s.grant_capacity)) * kGrantBytes;
  for (const SizeClassStats& c : s.classes) free_bytes += c.free_slots * c.slot_size;
  v1::OwnerCapacity capacity;
  capacity.set_segment_bytes(s.grant_capacity * kGrantBytes);
  capacity.set_free_bytes(free_bytes);
  // Every committed local value is in the hot tier, weighed by its slot size; all of it may be
  // evicted once readers' pins end.
  capacity.set_committed_bytes(hot_->weight());
  capacity.set_evictable_bytes(hot_->weight());
  return capacity;
}

std::map<std::string, int64_t> OwnerCore::Stats() const {
  std::map<std::string, int64_t> m;
  AppendCounters(*counters_, &m);
  const SlotPoolStats s = memory_->pool().Stats();
  for (int i = 0; i < kNumSlotStates; ++i) {
    m[std::string("slots_") + SlotStateName(static_cast<SlotState>(i))] = s.slots_by_state[i];
  }
  m["grants"] = static_cast<int64_t>(s.grants);
  m["grant_capacity"] = static_cast<int64_t>(s.grant_capacity);
  m["claim_timeouts"] = static_cast<int64_t>(s.claim_timeouts);
  m["grants_shrunk"] = static_cast<int64_t>(s.grants_shrunk);
  m["grants_warm"] = static_cast<int64_t>(s.warm_grants);
  m["keys"] = static_cast<int64_t>(keys_->size());
  m["inflight_gets"] = static_cast<int64_t>(flights_->size());
  m["prepared_puts"] = static_cast<int64_t>(puts_->prepared());
  m["hot_cohorts"] = static_cast<int64_t>(hot_->size());
  m["hot_weight_bytes"] = static_cast<int64_t>(hot_->weight());
  m["hot_copied_cohorts"] = static_cast<int64_t>(hot_->copied_cohorts());
  m["remote_ranked_bytes"] = static_cast<int64_t>(hot_->remote_weight());
  m["write_through_puts"] =
      write_through_ ? static_cast<int64_t>(write_through_->in_flight()) : int64_t{0};
  m["publish_queue"] = static_cast<int64_t>(publisher_->backlog());
  m["registration_generation"] = static_cast<int64_t>(registration_->generation());
  if (runtime_.data_plane != nullptr) {
    const transport::TransportStats t = runtime_.data_plane->stats();
    m["data_plane_serving_connections"] = static_cast<int64_t>(t.serving_connections);
    m["data_plane_requests_refused"] = static_cast<int64_t>(t.requests_refused);
    m["data_plane_handshakes_refused"] = static_cast<int64_t>(t.handshakes_refused);
  }
  return m;
}

}  // namespace fluxon
