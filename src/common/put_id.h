// The layout of a put_id: the node that put the batch in the high kPutIdNodeBits bits, a per-start
// sequence below (owner/put_path.h says how the sequence starts). The master reads the origin
// node from it (route/route_table.h).
#pragma once

#include <cstdint>

namespace fluxon {

inline constexpr int kPutIdNodeBits = 20;
inline constexpr int kPutIdSeqBits = 64 - kPutIdNodeBits;

// The node that put the value named by `put_id`.
inline uint32_t PutIdOrigin(uint64_t put_id) {
  return static_cast<uint32_t>(put_id >> kPutIdSeqBits);
}

}  // namespace fluxon
