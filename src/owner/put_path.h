// PutPath: the hostless put path (design §5 steps 1–2): reserve keys and claim slots
// (PutStart), make them locally readable and hand the batch to the publisher (Commit), or
// release everything (Abort). Owns the table of prepared puts.
//
// Invariants:
// - Validation happens before anything is reserved; a conflict reserves nothing.
// - A prepared put belongs to its session; another session's put id is NotFound.
// - V1: Commit makes every value of the batch locally readable (pinnable by GetStart) before it
//   returns, without waiting for the master. A commit consumes its put: if the publisher has no
//   place for it (backpressure timeout, stopping) the put is aborted and nothing stays reserved.
// - A prepared put is committed, aborted, expired (put_lease) or dropped with its session —
//   exactly one of them, through Take (the table's one removal), so it is never released twice.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/put_id.h"
#include "common/sharded_table.h"
#include "fluxon/put_options.h"
#include "owner/key_index.h"
#include "owner/owner_counters.h"
#include "owner/publisher.h"
#include "slot/slot_pool.h"

namespace fluxon {

// One put batch as the owner receives it: the keys, value_len and the client's PutOptions.
struct PutStartArgs {
  std::vector<std::string> keys;
  int64_t value_len = 0;
  PutOptions options;
};
struct PutStartOutcome {
  uint64_t put_id = 0;
  std::vector<uint64_t> offsets;
  std::vector<uint32_t> conflict_indices;  // non-empty only with an AlreadyExists status
};

// put_ids name put batches:
//   put_id = node_id << kPutIdSeqBits | (origin + n)     (common/put_id.h)
// with node_id in the high kPutIdNodeBits bits (two owners never share one) and, below it, a
// per-start origin drawn at random from 2^(kPutIdSeqBits - 1) values plus the count n of batches
// put since. No clock is trusted: two starts of one node repeat an id only if their ranges of
// [origin, origin + n) overlap, about (n1 + n2) / 2^43 for starts of n1 and n2 batches. Even
// then nothing is confused: a value's identity is (put_id, version), the version being the
// owner's hybrid-clock stamp (common/hybrid_clock.h), and the master never joins equal put_ids
// of different versions. node_id must fit in kPutIdNodeBits (config validation).
// The first put_id of an owner start.
uint64_t FirstPutId(uint32_t node_id);

class PutPath {
 public:
  // `write_through`: where write-through puts are tracked; null: this owner has no other node to
  // copy to, and write_through=True is refused.
  PutPath(uint32_t node_id, std::chrono::milliseconds put_lease, KeyIndex* keys, SlotPool* pool,
          Publisher* publisher, OwnerCounters* counters,
          WriteThroughTracker* write_through = nullptr)
      : put_lease_(put_lease),
        keys_(keys),
        pool_(pool),
        publisher_(publisher),
        counters_(counters),
        write_through_(write_through),
        next_put_id_(FirstPutId(node_id)) {}
  ~PutPath();

  // Takes `args` by value: its keys move into the prepared batch (no second copy per key).
  absl::StatusOr<PutStartOutcome> Start(uint64_t client_id, PutStartArgs args,
                                        std::vector<uint32_t>* conflict_indices);
  absl::Status Commit(uint64_t client_id, uint64_t put_id, PutDoneCallback done,
                      bool defer_publish_wake);
  absl::Status Abort(uint64_t client_id, uint64_t put_id);
  // Aborts every prepared put past put_lease; returns how many.
  size_t ExpireDue(std::chrono::steady_clock::time_point now);
  // Aborts every prepared put of a session that ended; returns how many.
  size_t AbortSession(uint64_t client_id);
  size_t prepared() const { return puts_.size(); }

 private:
  // Removes a prepared put of `client_id` from the table (commit, abort, expiry all use it).
  absl::StatusOr<std::shared_ptr<PutBatch>> Take(uint64_t client_id, uint64_t put_id);
  // Releases a taken put's reservations and slots.
  void Release(const PutBatch& b);

  const std::chrono::milliseconds put_lease_;
  KeyIndex* const keys_;
  SlotPool* const pool_;
  Publisher* const publisher_;
  OwnerCounters* const counters_;
  WriteThroughTracker* const write_through_;
  std::atomic<uint64_t> next_put_id_;
  ShardedTable<uint64_t, std::shared_ptr<PutBatch>, 16> puts_;
};

}  // namespace fluxon
