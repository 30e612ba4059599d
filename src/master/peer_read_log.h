// PeerReadLog: the remote gets that read each owner's values, kept until that owner's next
// heartbeat answer carries them (RegisterOwnerReply.peer_reads). An owner sees its own clients'
// reads but not its peers': without these, a value only peers read (a remote_cache's demoted
// pages, a replica) looks unread to its eviction policy however hot it is.
//
// Invariants:
// - Hints only: nothing depends on their delivery. A heartbeat answer that is lost loses the
//   reads it carried; a master restart loses them all.
// - Bounded: at most kMaxKeysPerNode keys and kMaxBytesPerNode bytes of them wait per owner
//   (past either the oldest reads are dropped and counted), and one answer carries at most
//   kMaxBytesPerAnswer bytes of keys (the rest wait for the next heartbeat).
// - Reads are kept per (node, generation): a new generation of the node (a restart, an
//   expiry) holds none of the old one's values, so its reads are dropped (Forget).
// - All state is guarded by mu_; no other lock is taken under it.
#pragma once

#include <cstdint>
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "common/mutex.h"
#include "fluxon/v1/master.pb.h"

namespace fluxon {

class PeerReadLog {
 public:
  static constexpr size_t kMaxKeysPerNode = 65'536;
  static constexpr size_t kMaxBytesPerNode = 4 << 20;  // key bytes + 8 per put_id
  static constexpr size_t kMaxBytesPerAnswer = 1 << 20;

  // One remote get batch read `read` (keys aligned with put_ids) from (node, generation);
  // returns the keys dropped to make room (or of an older generation).
  size_t Record(uint32_t node, uint64_t generation, v1::PeerRead read);
  // Moves the reads waiting for (node, generation), oldest first, into `out` (up to
  // kMaxBytesPerAnswer); returns the keys moved. Reads of another generation are dropped
  // (counted in *dropped).
  size_t Drain(uint32_t node, uint64_t generation,
               google::protobuf::RepeatedPtrField<v1::PeerRead>* out, size_t* dropped);
  // Drops the reads waiting for `node` (its generation ended); returns the keys dropped.
  size_t Forget(uint32_t node);

  size_t waiting_keys(uint32_t node) const {
    MutexLock lock(&mu_);
    auto it = nodes_.find(node);
    return it == nodes_.end() ? 0 : it->second.keys;
  }
  size_t waiting_bytes(uint32_t node) const {
    MutexLock lock(&mu_);
    auto it = nodes_.find(node);
    return it == nodes_.end() ? 0 : it->second.bytes;
  }
  // What one read costs against the bounds: its keys' bytes and 8 per put_id.
  static size_t BytesOf(const v1::PeerRead& read);

 private:
  struct Pending {
    uint64_t generation = 0;
    size_t keys = 0;
    size_t bytes = 0;
    std::deque<v1::PeerRead> reads;
  };
  mutable Mutex mu_;
  absl::flat_hash_map<uint32_t, Pending> nodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fluxon
