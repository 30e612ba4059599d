// libfluxon_client: the C++ client an inference process links to reach its machine's owner.
//
// Contract (mirrors the design's public contract and the Python package `fluxon`):
// - Connect attaches to the owner's segment (fd passed over the socket) and maps it once;
//   WaitLocalSegmentsReady lists that mapping for CUDA registration.
// - LocalFastPutStart validates everything before any RPC, reserves keys and slots, and returns a
//   put plan (plan blob address); a conflict fails with AlreadyExists and the conflicting indices,
//   with nothing reserved. LocalFastPutCommit consumes the plan and returns a KvFuture that
//   completes when the owner's master route is published; PutAbort consumes it and releases all.
// - GetStart plans a batch and pins its transferable prefix; GetTransfer consumes the handle
//   (optionally a shorter whole-group prefix) into a get plan; CancelGetTransfer drops the handle;
//   ReleaseViews consumes the get plan after the restore kernel is done.
// - A plan is valid once, in this process; using one of the wrong kind or twice fails fast.
// - All methods are thread-safe. Errors are absl::Status; no exception escapes.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fluxon/plan_blob.h"
#include "fluxon/put_options.h"

namespace fluxon {

struct SegmentMapping {
  std::string segment_label;  // "external_owner:0"
  uint64_t write_ptr = 0;
  uint64_t read_ptr = 0;
  uint64_t len = 0;
  uint64_t generation = 0;
  uint32_t node_id = 0;
};

// Completes when the batch's route is published (or definitively not).
class KvFuture {
 public:
  bool done() const;
  // Waits up to `timeout` (forever when unset); DeadlineExceeded if it did not complete.
  absl::Status Wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt) const;
  // The outcome once done (OkStatus while pending).
  absl::Status status() const;

  struct State;
  explicit KvFuture(std::shared_ptr<State> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<State> state_;
};

struct GetStartResult {
  uint32_t raw_prefix_hit_len = 0;
  uint32_t transferable_len = 0;
  uint32_t prefix_hit_groups = 0;
  std::optional<uint32_t> first_miss_index;
  std::optional<uint32_t> first_miss_group_index;
  bool all_hit = false;
  uint32_t local_pinned = 0;
  uint32_t inflight_joined = 0;
  uint32_t leader_started = 0;
  // Values of the transferable prefix were still being fetched from other owners when the owner
  // answered (allow_deferred): GetTransfer waits for them and may fail (Aborted).
  bool deferred = false;
  // The owner transferred the whole prefix with the answer (GetStartOptions::transfer).
  bool transferred = false;
};

struct GetStartOptions {
  bool prefix_best_effort = true;
  std::vector<uint32_t> atomic_group_lens;  // empty: one key per group
  // See GetStart.
  bool allow_deferred = false;
  // The owner also transfers the whole transferable prefix in the same round trip (not when it
  // defers the answer): GetTransfer then issues the plan without calling the owner, the views'
  // lease starts at GetStart, a shorter consume_prefix_len keeps the rest's views until
  // ReleaseViews, and CancelGetTransfer releases the views. A restore that always consumes what
  // it found saves one round trip. A GetTransfer after the views' lease (the owner's
  // view_lease_ms, counted from GetStart) fails with DeadlineExceeded.
  bool transfer = false;
};

// Returned by GetStart; consumed by GetTransfer or CancelGetTransfer (once).
struct GetStartHandle {
  uint64_t id = 0;  // client-side handle id
  GetStartResult result;
};

struct ClientOptions {
  std::string socket_path = "/tmp/fluxon/owner.sock";
  std::string client_name = "fluxon-client";
  size_t plan_arena_bytes = 16 << 20;
  // After sending a request, poll for the answer this long before sleeping (0: always sleep).
  int64_t busy_poll_us = 200;
  // Every call waits at most this long for the owner's answer; then it fails with
  // DeadlineExceeded and its connection is dropped (a late answer can never be mistaken for the
  // next call's). A dead owner fails calls with Unavailable at once.
  std::chrono::milliseconds call_timeout{60'000};
};

class KvClient {
 public:
  static absl::StatusOr<std::unique_ptr<KvClient>> Connect(const ClientOptions& options);
  ~KvClient();
  KvClient(const KvClient&) = delete;
  KvClient& operator=(const KvClient&) = delete;

  std::vector<SegmentMapping> WaitLocalSegmentsReady() const;
  // Maps every page of the segment into this process now (MADV_POPULATE_WRITE), so CPU copies
  // into values never take first-touch page faults. With an expected-capacity owner the pages
  // already exist; with a dynamic owner this allocates the whole segment. CUDA registration
  // (cudaHostRegister) does the same as a side effect.
  absl::Status PrefaultSegment();
  // The plan-blob arena (register it with CUDA so kernels can read plans).
  std::pair<uint64_t, uint64_t> PlanArena() const;
  // A live plan of this client (any kind when `expected` is unset): NotFound for an address it
  // never issued (a forged integer is never dereferenced), FailedPrecondition once consumed.
  absl::StatusOr<PlanView> PeekPlan(uint64_t plan_ptr,
                                    std::optional<PlanKind> expected = std::nullopt) const;

  absl::StatusOr<uint64_t> LocalFastPutStart(const std::vector<std::string>& keys,
                                             int64_t value_len, const PutOptions& options,
                                             std::vector<uint32_t>* conflict_indices = nullptr);
  absl::StatusOr<KvFuture> LocalFastPutCommit(uint64_t plan_ptr);
  absl::Status PutAbort(uint64_t plan_ptr);

  // `allow_deferred`: for a batch with values held by other owners, the owner may answer before
  // it has fetched them (transferable_len counts them as found); GetTransfer then waits for the
  // consumed prefix and fails (Aborted, the handle released) if a consumed value could not be
  // fetched. Without it GetStart answers once every value of the prefix is here.
  absl::StatusOr<GetStartHandle> GetStart(const std::vector<std::string>& keys,
                                          bool prefix_best_effort = true,
                                          const std::vector<uint32_t>& atomic_group_lens = {},
                                          bool allow_deferred = false);
  absl::StatusOr<GetStartHandle> GetStart(const std::vector<std::string>& keys,
                                          const GetStartOptions& options);
  absl::StatusOr<uint64_t> GetTransfer(const GetStartHandle& handle,
                                       std::optional<uint32_t> consume_prefix_len = std::nullopt);
  absl::Status CancelGetTransfer(const GetStartHandle& handle);
  absl::Status ReleaseViews(uint64_t plan_ptr);

  // Owner counters plus this client's own (active plans and handles).
  absl::StatusOr<std::map<std::string, int64_t>> Stats();

  // Deletes the owner's committed values whose key starts with `prefix` (non-empty): routes
  // first, then slots. Values being read or written stay; {deleted, skipped_in_use}.
  absl::StatusOr<std::pair<uint64_t, uint64_t>> DeletePrefix(const std::string& prefix);

  class Impl;

 private:
  explicit KvClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Copies `count` values of `value_len` bytes between a contiguous host buffer and the values of a
// plan, on `threads` threads (a stand-in for the GPU kernels in CPU-only workloads and tests).
enum class CopyDirection { kToValues, kFromValues };
absl::Status CopyPlanValues(uint64_t plan_ptr, uint8_t* host, uint64_t value_len,
                            CopyDirection direction, int threads = 4);

// Scatter/gather copy between the first `value_count` values of a plan and host memory given as
// segments: value i is the concatenation of segments [i*segs_per_value, (i+1)*segs_per_value) in
// order (e.g. a host KV pool page's K and V buffers). `seg_ptrs` and `seg_sizes` have
// value_count*segs_per_value entries, and every value's segments must add up to exactly
// `value_len` (the plan's value size), so a copy never runs past a slot. Runs on `threads` threads.
absl::Status CopyPlanSegments(uint64_t plan_ptr, uint64_t value_count, uint64_t value_len,
                              const std::vector<uint64_t>& seg_ptrs,
                              const std::vector<uint64_t>& seg_sizes, uint64_t segs_per_value,
                              CopyDirection direction, int threads = 4);

}  // namespace fluxon
