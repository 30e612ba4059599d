#include "transport/tcp/tcp_handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fluxon::transport::tcp {
namespace {

using Clock = std::chrono::steady_clock;

struct Challenge {
  uint32_t magic = kChallengeMagic;
  uint8_t version = kHandshakeVersion;
  uint8_t reserved[3] = {0, 0, 0};
  uint8_t server_nonce[kNonceBytes] = {};
};
static_assert(sizeof(Challenge) == 40);

struct Proof {
  uint32_t magic = kProofMagic;
  uint8_t version = kHandshakeVersion;
  uint8_t reserved[3] = {0, 0, 0};
  uint8_t client_nonce[kNonceBytes] = {};
  uint8_t mac[kMacBytes] = {};
};
static_assert(sizeof(Proof) == 72);

struct Verdict {
  uint32_t magic = kVerdictMagic;
  uint8_t accepted = 0;
  uint8_t reserved[3] = {0, 0, 0};
  uint8_t mac[kMacBytes] = {};
};
static_assert(sizeof(Verdict) == 40);

constexpr char kClientLabel[] = "fluxon tcp client";
constexpr char kServerLabel[] = "fluxon tcp server";

// Waits for `events` on fd until the deadline; Unavailable when it passes or on a socket error.
absl::Status WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return absl::UnavailableError("handshake timed out");
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 60'000)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("poll: ", std::strerror(errno)));
    if (n > 0) return absl::OkStatus();
  }
}

// Moves exactly `len` bytes, each step bounded by the deadline (a peer that sends one byte at a
// time cannot stretch the handshake past it).
absl::Status SendExact(int fd, const void* data, size_t len, Clock::time_point deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    if (absl::Status s = WaitFor(fd, POLLOUT, deadline); !s.ok()) return s;
    const ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status RecvExact(int fd, void* data, size_t len, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (len > 0) {
    if (absl::Status s = WaitFor(fd, POLLIN, deadline); !s.ok()) return s;
    const ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    }
    if (n == 0) return absl::UnavailableError("connection closed during the handshake");
    p += n;
    len -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status RandomNonce(uint8_t* out) {
  if (RAND_bytes(out, static_cast<int>(kNonceBytes)) != 1) {
    return absl::InternalError("RAND_bytes failed: no randomness for the handshake nonce");
  }
  return absl::OkStatus();
}

// HMAC-SHA256(secret, label | first | second); false when OpenSSL failed (out is then unset, so
// a caller fails the handshake instead of comparing against it).
[[nodiscard]] bool Mac(const std::string& secret, const char* label, const uint8_t* first,
                       const uint8_t* second, uint8_t* out) {
  uint8_t msg[sizeof(kServerLabel) + 2 * kNonceBytes];
  static_assert(sizeof(kClientLabel) == sizeof(kServerLabel));
  std::memcpy(msg, label, sizeof(kServerLabel));
  std::memcpy(msg + sizeof(kServerLabel), first, kNonceBytes);
  std::memcpy(msg + sizeof(kServerLabel) + kNonceBytes, second, kNonceBytes);
  unsigned int len = 0;
  // An empty key is valid for HMAC; pass a non-null pointer either way.
  static const uint8_t kNoKey = 0;
  return HMAC(EVP_sha256(),
              secret.empty() ? static_cast<const void*>(&kNoKey)
                             : static_cast<const void*>(secret.data()),
              static_cast<int>(secret.size()), msg, sizeof(msg), out, &len) != nullptr &&
         len == kMacBytes;
}

absl::Status MacFailed() { return absl::InternalError("HMAC-SHA256 failed in the handshake"); }

bool MacEquals(const uint8_t* a, const uint8_t* b) { return CRYPTO_memcmp(a, b, kMacBytes) == 0; }

}  // namespace

absl::Status ClientHandshake(int fd, const std::string& secret, Clock::time_point deadline) {
  Challenge challenge;
  if (absl::Status s = RecvExact(fd, &challenge, sizeof(challenge), deadline); !s.ok()) return s;
  if (challenge.magic != kChallengeMagic || challenge.version != kHandshakeVersion) {
    return absl::UnavailableError(
        absl::StrFormat("the peer does not speak the data-plane handshake (magic 0x%08x, version "
                        "%d; expected 0x%08x, %d)",
                        challenge.magic, challenge.version, kChallengeMagic, kHandshakeVersion));
  }
  Proof proof;
  if (absl::Status s = RandomNonce(proof.client_nonce); !s.ok()) return s;
  if (!Mac(secret, kClientLabel, challenge.server_nonce, proof.client_nonce, proof.mac)) {
    return MacFailed();
  }
  if (absl::Status s = SendExact(fd, &proof, sizeof(proof), deadline); !s.ok()) return s;
  Verdict verdict;
  if (absl::Status s = RecvExact(fd, &verdict, sizeof(verdict), deadline); !s.ok()) {
    // A refusing server writes its whole verdict before it closes (it has read all of our
    // proof, so the close follows the data): a short verdict is a dead or broken peer, an outage
    // to retry, not a refusal.
    return absl::UnavailableError(
        absl::StrCat("the peer ended the data-plane handshake before its verdict: ", s.message()));
  }
  if (verdict.magic != kVerdictMagic) {
    return absl::UnavailableError("the peer's handshake verdict is malformed");
  }
  if (verdict.accepted != 1) {
    return absl::PermissionDeniedError(
        "the peer refused our data-plane handshake: the cluster secrets differ");
  }
  uint8_t expected[kMacBytes];
  if (!Mac(secret, kServerLabel, proof.client_nonce, challenge.server_nonce, expected)) {
    return MacFailed();
  }
  if (!MacEquals(expected, verdict.mac)) {
    return absl::PermissionDeniedError(
        "the peer could not prove it holds the cluster secret: refusing to use it");
  }
  return absl::OkStatus();
}

absl::Status ServerHandshake(int fd, const std::string& secret, Clock::time_point deadline) {
  Challenge challenge;
  if (absl::Status s = RandomNonce(challenge.server_nonce); !s.ok()) return s;
  if (absl::Status s = SendExact(fd, &challenge, sizeof(challenge), deadline); !s.ok()) return s;
  Proof proof;
  if (absl::Status s = RecvExact(fd, &proof, sizeof(proof), deadline); !s.ok()) return s;
  if (proof.magic != kProofMagic || proof.version != kHandshakeVersion) {
    return absl::UnavailableError(absl::StrFormat(
        "not a data-plane handshake (magic 0x%08x, version %d)", proof.magic, proof.version));
  }
  uint8_t expected[kMacBytes];
  if (!Mac(secret, kClientLabel, challenge.server_nonce, proof.client_nonce, expected)) {
    return MacFailed();
  }
  Verdict verdict;
  if (!MacEquals(expected, proof.mac)) {
    (void)SendExact(fd, &verdict, sizeof(verdict), deadline);  // accepted = 0, no MAC
    return absl::PermissionDeniedError("the peer's cluster secret proof does not verify");
  }
  verdict.accepted = 1;
  if (!Mac(secret, kServerLabel, proof.client_nonce, challenge.server_nonce, verdict.mac)) {
    return MacFailed();
  }
  return SendExact(fd, &verdict, sizeof(verdict), deadline);
}

}  // namespace fluxon::transport::tcp
