// InflightGets: the master's in-flight remote gets (design §6, G7/G8, T1/T2) and the source pins
// they hold.
//
// A remote get is started by BatchGetStart for (key, requester owner) and names the source
// location it reads and the target slot the requester prepared; it ends with BatchGetDone (the
// target becomes another location of the route), BatchGetRevoke, or its TTL.
//
// Invariants:
// - G7 dedup: at most one in-flight get per (key, requester node); two requesters may fetch the
//   same key at once.
// - Source pin: while a get is in flight its source location (key, node, generation, put_id) is
//   pinned; the master refuses to remove a pinned location (RemoveRoutes answers pinned), so the
//   source owner never frees memory a peer is reading. A pin lasts at most the TTL: a dead
//   requester cannot pin forever. (The requester bounds its read by the TTL measured from before
//   its BatchGetStart, so its read always ends inside the pin.)
// - T1: a BatchGetStart retried with the same (requester, request_id) gets the stored answer and
//   changes nothing; the answer is kept while a get it started is in flight (it goes with its
//   last get, or its TTL), and only answers that started a get are kept. At most
//   kMaxStoredReplies answers are kept (oldest forgotten first): a retry of a forgotten request
//   meets G7's dedup (GET_BUSY) for keys still in flight, never a second pinned get.
// - get_ids are non-zero and never reused (a 64-bit counter).
// - All state is guarded by one mutex, held by the caller for a whole batch (lookup + pin, or pin
//   check + route removal, must be atomic against each other). Work under it is O(batch).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "fluxon/v1/master.pb.h"
#include "route/route_table.h"

namespace fluxon {

class InflightGets {
 public:
  using Clock = std::chrono::steady_clock;

  struct Get {
    uint64_t get_id = 0;
    std::string key;
    uint32_t requester_node = 0;
    uint64_t requester_generation = 0;
    RouteLocation source;
    uint64_t target_offset = 0;
    uint64_t len = 0;
    uint64_t request_id = 0;  // the BatchGetStart that started it
    Clock::time_point expires;
    bool replica = false;  // a replica pull, not a client's get (counted apart when done)
  };
  static constexpr size_t kMaxStoredReplies = 65'536;

  explicit InflightGets(std::chrono::milliseconds ttl) : ttl_(ttl) {}
  std::chrono::milliseconds ttl() const { return ttl_; }

  // The stored answer of a request already seen, if any.
  const v1::BatchGetStartReply* FindReply(uint32_t requester_node, uint64_t request_id) const;
  void StoreReply(uint32_t requester_node, uint64_t request_id, v1::BatchGetStartReply reply,
                  Clock::time_point now);

  bool Busy(std::string_view key, uint32_t requester_node) const {
    return by_requester_key_.contains(KeyRef{key, requester_node, 0, 0});
  }
  // Records a get and pins its source; returns the get_id.
  uint64_t Start(std::string key, uint32_t requester_node, uint64_t requester_generation,
                 uint64_t request_id, const RouteLocation& source, uint64_t target_offset,
                 uint64_t len, Clock::time_point now, bool replica = false);
  const Get* Find(uint64_t get_id) const {
    auto it = gets_.find(get_id);
    return it == gets_.end() ? nullptr : &it->second;
  }
  // Ends a get (Done or Revoke), releasing its pin; nullopt when it is not in flight.
  std::optional<Get> Take(uint64_t get_id);
  bool Pinned(std::string_view key, uint32_t node, uint64_t generation, uint64_t put_id) const;

  // Ends gets past their TTL (and drops stored answers past theirs); returns the gets ended.
  size_t ExpireDue(Clock::time_point now);
  // Ends every get requested by (node, generation): that owner is gone.
  size_t DropRequester(uint32_t node, uint64_t generation);
  // Ends every get reading from (node, generation): that memory is gone (or may be reused).
  size_t DropSource(uint32_t node, uint64_t generation);
  size_t stored_replies() const { return replies_.size(); }

  size_t size() const { return gets_.size(); }
  size_t RequestedBy(uint32_t node) const;
  size_t PinsOn(uint32_t node) const;

 private:
  // A key with a node (and, for a pin, the source's generation and put_id; 0 in
  // by_requester_key_). The maps hold KeyOf; lookups pass a KeyRef, so finding an entry copies
  // no key (the hash and equality are transparent, and hash a KeyOf as its KeyRef).
  struct KeyRef {
    std::string_view key;
    uint32_t node;
    uint64_t generation;
    uint64_t put_id;
  };
  struct KeyOf {
    std::string key;
    uint32_t node;
    uint64_t generation;
    uint64_t put_id;
    KeyRef ref() const { return KeyRef{key, node, generation, put_id}; }
  };
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(const KeyRef& k) const {
      return absl::Hash<std::tuple<std::string_view, uint32_t, uint64_t, uint64_t>>{}(
          std::make_tuple(k.key, k.node, k.generation, k.put_id));
    }
    size_t operator()(const KeyOf& k) const { return (*this)(k.ref()); }
  };
  struct KeyEq {
    using is_transparent = void;
    static bool Same(const KeyRef& a, const KeyRef& b) {
      return a.node == b.node && a.generation == b.generation && a.put_id == b.put_id &&
             a.key == b.key;
    }
    bool operator()(const KeyOf& a, const KeyOf& b) const { return Same(a.ref(), b.ref()); }
    bool operator()(const KeyOf& a, const KeyRef& b) const { return Same(a.ref(), b); }
    bool operator()(const KeyRef& a, const KeyOf& b) const { return Same(a, b.ref()); }
    bool operator()(const KeyRef& a, const KeyRef& b) const { return Same(a, b); }
  };
  void Erase(absl::flat_hash_map<uint64_t, Get>::iterator it);

  const std::chrono::milliseconds ttl_;
  uint64_t next_get_id_ = 1;
  absl::flat_hash_map<uint64_t, Get> gets_;
  absl::flat_hash_map<KeyOf, uint64_t, KeyHash, KeyEq> by_requester_key_;  // (key, requester)
  absl::flat_hash_map<KeyOf, uint32_t, KeyHash, KeyEq> pins_;              // (key, source location)
  struct StoredReply {
    v1::BatchGetStartReply reply;
    Clock::time_point expires;
    size_t live_gets = 0;  // gets it started still in flight
  };
  template <typename Pred>
  size_t DropIf(Pred pred);
  absl::flat_hash_map<std::pair<uint32_t, uint64_t>, StoredReply> replies_;
  std::deque<std::pair<Clock::time_point, std::pair<uint32_t, uint64_t>>> reply_order_;
};

}  // namespace fluxon
