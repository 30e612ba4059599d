// PeerWindow: the bytes of one peer's requests a transport has queued and has in flight, and the
// admission rule of its window. Both transports (tcp/, verbs/) account a peer's requests with it.
// Not thread-safe: the owning peer guards it with its own lock.
//
// Invariants: a request's bytes are queued, then dequeued (sent, or dropped when its batch was
// aborted) and, when sent, in flight until they land (answered or failed); a request is admitted
// when nothing is in flight or it fits under max_inflight (so one request larger than the window
// still goes, alone).
#pragma once

#include <cstdint>

#include "common/check.h"

namespace fluxon::transport {

class PeerWindow {
 public:
  void Queue(uint64_t bytes) { queued_ += bytes; }
  void Dequeue(uint64_t bytes) {
    FLUXON_DCHECK(queued_ >= bytes, "dequeued more bytes than were queued");
    queued_ -= bytes;
  }
  void Launch(uint64_t bytes) { inflight_ += bytes; }
  void Land(uint64_t bytes) {
    FLUXON_DCHECK(inflight_ >= bytes, "landed more bytes than were in flight");
    inflight_ -= bytes;
  }
  bool Admits(uint64_t bytes, uint64_t max_inflight) const {
    return inflight_ == 0 || inflight_ + bytes <= max_inflight;
  }
  uint64_t queued() const { return queued_; }
  uint64_t inflight() const { return inflight_; }

 private:
  uint64_t queued_ = 0;
  uint64_t inflight_ = 0;
};

}  // namespace fluxon::transport
