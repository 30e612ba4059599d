// PutOptions: the options of one put batch (local_fast_put_start), the one type every layer
// carries them in — the C++ client, the wire (rpc/client_codec.h converts), the owner's put path.
// Which options are in effect and which are refused until implemented: fluxon/batch.h
// (ValidatePutStart).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fluxon {

struct PutOptions {
  bool reject_if_inflight_same_key = true;
  bool reject_if_exist_same_key = true;
  // The put completes only once every value has a committed, routed copy on another node
  // (a cluster owner only; docs/replicas.md "Write-through").
  bool write_through = false;
  bool make_replica_task = false;
  std::vector<bool> make_replica_task_mask;  // empty: broadcast make_replica_task
  std::vector<uint32_t> atomic_group_lens;   // empty: one key per group
  std::string lease_id;
  // The key of the page just before keys[0] in its prompt (empty: unknown). A hint for eviction
  // order only (chains are evicted from their tail); it must not be one of the batch's keys.
  std::string parent_key;
};

}  // namespace fluxon
