// StreamingCopy: a memcpy for large, write-once copies (KV pages moving between a host pool and
// Fluxon values).
//
// Invariants:
// - The bytes written are exactly memcpy's, for any size and alignment of either pointer.
// - Copies of at least kStreamingCopyMinBytes use non-temporal stores: the destination is not
//   read back by this CPU soon (a GPU DMA or another process reads it), so skipping the cache
//   avoids a read-for-ownership of every destination line and keeps the cache for the rest.
//   glibc switches to such stores only above a threshold derived from the L3 size, which on
//   large-L3 servers is far above one KV page.
// - The call ends with a store fence: its writes are ordered before whatever the thread does
//   next (a commit RPC, a thread join), like a plain memcpy's.
#pragma once

#include <cstddef>

namespace fluxon {

inline constexpr size_t kStreamingCopyMinBytes = 64 * 1024;

void StreamingCopy(void* dst, const void* src, size_t n);

}  // namespace fluxon
