#include "route/route_key.h"

#include <sodium.h>

#include <cstdlib>
#include <cstring>

#include "spdlog/spdlog.h"

namespace fluxon {

RouteKeyHasher::RouteKeyHasher() {
  static_assert(crypto_shorthash_siphashx24_BYTES == sizeof(RouteKey));
  static_assert(crypto_shorthash_siphashx24_KEYBYTES == sizeof(secret_));
  // sodium_init is thread-safe and idempotent: 0 first time, 1 later, -1 on failure.
  if (sodium_init() < 0) {
    spdlog::critical("libsodium failed to initialise: the master cannot fingerprint keys");
    std::abort();
  }
  randombytes_buf(secret_, sizeof(secret_));
}

RouteKey RouteKeyHasher::operator()(std::string_view key) const {
  unsigned char out[crypto_shorthash_siphashx24_BYTES];
  crypto_shorthash_siphashx24(out, reinterpret_cast<const unsigned char*>(key.data()), key.size(),
                              secret_);
  RouteKey k;
  std::memcpy(&k.lo, out, sizeof(k.lo));
  std::memcpy(&k.hi, out + sizeof(k.lo), sizeof(k.hi));
  return k;
}

}  // namespace fluxon
