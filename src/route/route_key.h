// RouteKey: the master's name for a key — a 128-bit keyed fingerprint of the key's bytes.
//
// Why a fingerprint: the master must fit the design's scale (100 M routes) and a key is most of a
// route's memory (SGLang's keys are ~100 B; a route's locations are 40 B). The route table is
// keyed by RouteKey, so a slot has a fixed 16 B key whatever the key's length, and the key's
// bytes are kept beside it only when the master lists keys (RouteKeys::kFull).
//
// Invariants:
// - The fingerprint is SipHash-2-4 with a 128-bit output (libsodium's
//   crypto_shorthash_siphashx24), keyed by a secret drawn from the OS at construction and never
//   leaving the process. Two different keys share a fingerprint with probability ~2^-128 per
//   pair (1e-22 for 100 M keys), and nobody who lacks the secret can make them collide on
//   purpose: a client cannot craft a key that reads another key's value.
// - A fingerprint means something only inside the process that made it: a new master (restart,
//   failover) draws a new secret, and the owners' republish (full keys) rebuilds its table.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

namespace fluxon {

struct RouteKey {
  uint64_t lo = 0;
  uint64_t hi = 0;

  bool operator==(const RouteKey& o) const { return lo == o.lo && hi == o.hi; }
  // The bits are already uniform (a PRF's output): the hash table takes one word.
  template <typename H>
  friend H AbslHashValue(H h, const RouteKey& k) {
    return H::combine(std::move(h), k.lo);
  }
};

class RouteKeyHasher {
 public:
  // Draws the secret (libsodium's CSPRNG). Aborts if libsodium cannot initialise: without it no
  // fingerprint is safe.
  RouteKeyHasher();
  RouteKey operator()(std::string_view key) const;

 private:
  unsigned char secret_[16];
};

}  // namespace fluxon
