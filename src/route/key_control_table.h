// KeyControlTable: the owner's per-key control state (in-flight put reservations, in-flight get
// markers, local-visible entries), sharded 256 ways by key.
//
// Invariants:
// - G10: a key-control critical section is one shard lock for O(1) work on one key. No
//   process-wide key mutex exists; a batch is processed key by key, so a large batch never blocks
//   unrelated keys, and no shard lock is held across an RPC, a transfer or a wait.
// - G3: leader/joiner decisions are per-key atomic insert-or-join (InsertIfAbsent / Upsert), never
//   "snapshot the in-flight set, insert later".
// - Cleanup is by identity (EraseIf with the op's identity), so a finished op never erases a newer
//   op that took the same key (no ABA).
#pragma once

#include <string>

#include "common/sharded_table.h"

namespace fluxon {

inline constexpr size_t kKeyControlShards = 256;

template <typename Entry>
using KeyControlTable = ShardedTable<std::string, Entry, kKeyControlShards>;

}  // namespace fluxon
