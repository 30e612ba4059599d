#include "master/peer_read_log.h"

#include <utility>

namespace fluxon {

size_t PeerReadLog::BytesOf(const v1::PeerRead& read) {
  size_t bytes = 0;
  for (const std::string& k : read.keys()) bytes += k.size() + sizeof(uint64_t);
  return bytes;
}

size_t PeerReadLog::Record(uint32_t node, uint64_t generation, v1::PeerRead read) {
  if (read.keys_size() == 0) return 0;
  size_t dropped = 0;
  MutexLock lock(&mu_);
  Pending& p = nodes_[node];
  if (p.generation != generation) {
    // Reads of an older generation name memory that is gone; a newer one is answered first.
    dropped += p.keys;
    p = Pending{generation, 0, 0, {}};
  }
  p.keys += static_cast<size_t>(read.keys_size());
  p.bytes += BytesOf(read);
  p.reads.push_back(std::move(read));
  while (p.keys > kMaxKeysPerNode || p.bytes > kMaxBytesPerNode) {
    const size_t n = static_cast<size_t>(p.reads.front().keys_size());
    p.keys -= n;
    p.bytes -= BytesOf(p.reads.front());
    dropped += n;
    p.reads.pop_front();
  }
  return dropped;
}

size_t PeerReadLog::Drain(uint32_t node, uint64_t generation,
                          google::protobuf::RepeatedPtrField<v1::PeerRead>* out, size_t* dropped) {
  MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return 0;
  Pending& p = it->second;
  if (p.generation != generation) {
    *dropped += p.keys;
    nodes_.erase(it);
    return 0;
  }
  size_t bytes = 0, moved = 0;
  while (!p.reads.empty()) {
    const size_t read_bytes = BytesOf(p.reads.front());
    // Always at least one read per answer, so a read larger than the bound still goes.
    if (moved > 0 && bytes + read_bytes > kMaxBytesPerAnswer) break;
    bytes += read_bytes;
    const size_t n = static_cast<size_t>(p.reads.front().keys_size());
    moved += n;
    p.keys -= n;
    p.bytes -= read_bytes;
    *out->Add() = std::move(p.reads.front());
    p.reads.pop_front();
  }
  if (p.reads.empty()) nodes_.erase(it);
  return moved;
}

size_t PeerReadLog::Forget(uint32_t node) {
  MutexLock lock(&mu_);
  auto it = nodes_.find(node);
  if (it == nodes_.end()) return 0;
  const size_t dropped = it->second.keys;
  nodes_.erase(it);
  return dropped;
}

}  // namespace fluxon
