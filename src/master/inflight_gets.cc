#include "master/inflight_gets.h"

#include <vector>

#include "common/check.h"

namespace fluxon {

const v1::BatchGetStartReply* InflightGets::FindReply(uint32_t requester_node,
                                                      uint64_t request_id) const {
  auto it = replies_.find({requester_node, request_id});
  return it == replies_.end() ? nullptr : &it->second.reply;
}

void InflightGets::StoreReply(uint32_t requester_node, uint64_t request_id,
                              v1::BatchGetStartReply reply, Clock::time_point now) {
  size_t live = 0;
  for (const v1::GetStartResult& r : reply.results()) live += r.outcome() == v1::GET_STARTED;
  if (live == 0) return;  // nothing started: a retry may compute its answer anew
  // A retry can arrive up to the TTL after the first attempt (and its gets live that long).
  const Clock::time_point expires = now + ttl_ + ttl_;
  replies_[{requester_node, request_id}] = StoredReply{std::move(reply), expires, live};
  reply_order_.emplace_back(expires, std::make_pair(requester_node, request_id));
  while (replies_.size() > kMaxStoredReplies && !reply_order_.empty()) {
    replies_.erase(reply_order_.front().second);
    reply_order_.pop_front();
  }
  // reply_order_ may hold entries of answers already gone with their gets: bound it too.
  while (reply_order_.size() > 2 * kMaxStoredReplies) reply_order_.pop_front();
}

uint64_t InflightGets::Start(std::string key, uint32_t requester_node,
                             uint64_t requester_generation, uint64_t request_id,
                             const RouteLocation& source, uint64_t target_offset, uint64_t len,
                             Clock::time_point now, bool replica) {
  const uint64_t id = next_get_id_++;
  auto pin = pins_.find(KeyRef{key, source.node_id, source.generation, source.put_id});
  if (pin == pins_.end()) {
    pin = pins_.emplace(KeyOf{key, source.node_id, source.generation, source.put_id}, 0).first;
  }
  ++pin->second;
  auto by = by_requester_key_.find(KeyRef{key, requester_node, 0, 0});
  if (by == by_requester_key_.end()) {
    by_requester_key_.emplace(KeyOf{key, requester_node, 0, 0}, id);
  } else {
    by->second = id;
  }
  gets_.emplace(id, Get{id, std::move(key), requester_node, requester_generation, source,
                        target_offset, len, request_id, now + ttl_, replica});
  return id;
}

void InflightGets::Erase(absl::flat_hash_map<uint64_t, Get>::iterator it) {
  const Get& g = it->second;
  auto pin = pins_.find(KeyRef{g.key, g.source.node_id, g.source.generation, g.source.put_id});
  FLUXON_DCHECK(pin != pins_.end() && pin->second > 0, "an in-flight get lost its source pin");
  if (pin != pins_.end() && --pin->second == 0) pins_.erase(pin);
  auto by = by_requester_key_.find(KeyRef{g.key, g.requester_node, 0, 0});
  if (by != by_requester_key_.end() && by->second == g.get_id) by_requester_key_.erase(by);
  auto reply = replies_.find({g.requester_node, g.request_id});
  if (reply != replies_.end() && --reply->second.live_gets == 0) replies_.erase(reply);
  gets_.erase(it);
}

std::optional<InflightGets::Get> InflightGets::Take(uint64_t get_id) {
  auto it = gets_.find(get_id);
  if (it == gets_.end()) return std::nullopt;
  Get g = it->second;
  Erase(it);
  return g;
}

bool InflightGets::Pinned(std::string_view key, uint32_t node, uint64_t generation,
                          uint64_t put_id) const {
  return pins_.contains(KeyRef{key, node, generation, put_id});
}

size_t InflightGets::ExpireDue(Clock::time_point now) {
  std::vector<uint64_t> due;
  for (const auto& [id, g] : gets_) {
    if (g.expires <= now) due.push_back(id);
  }
  for (uint64_t id : due) Erase(gets_.find(id));
  while (!reply_order_.empty() && reply_order_.front().first <= now) {
    auto it = replies_.find(reply_order_.front().second);
    if (it != replies_.end() && it->second.expires <= now) replies_.erase(it);
    reply_order_.pop_front();
  }
  return due.size();
}

template <typename Pred>
size_t InflightGets::DropIf(Pred pred) {
  std::vector<uint64_t> gone;
  for (const auto& [id, g] : gets_) {
    if (pred(g)) gone.push_back(id);
  }
  for (uint64_t id : gone) Erase(gets_.find(id));
  return gone.size();
}

size_t InflightGets::DropRequester(uint32_t node, uint64_t generation) {
  return DropIf([&](const Get& g) {
    return g.requester_node == node && g.requester_generation == generation;
  });
}

size_t InflightGets::DropSource(uint32_t node, uint64_t generation) {
  return DropIf(
      [&](const Get& g) { return g.source.node_id == node && g.source.generation == generation; });
}

size_t InflightGets::RequestedBy(uint32_t node) const {
  size_t n = 0;
  for (const auto& [id, g] : gets_) n += g.requester_node == node;
  return n;
}

size_t InflightGets::PinsOn(uint32_t node) const {
  size_t n = 0;
  for (const auto& [k, count] : pins_) {
    if (k.node == node) n += count;
  }
  return n;
}

}  // namespace fluxon
