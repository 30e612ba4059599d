// The TCP transport's connection handshake: both ends prove they hold the cluster secret before
// a single request is read or served.
//
//   server -> client  Challenge {magic "FXHC", version, server nonce (32 random bytes)}
//   client -> server  Proof     {magic "FXHP", version, client nonce (32 random bytes),
//                                HMAC-SHA256(secret, "fluxon tcp client" | server nonce |
//                                client nonce)}
//   server -> client  Verdict   {magic "FXHV", accepted (1) or refused (0),
//                                HMAC-SHA256(secret, "fluxon tcp server" | client nonce |
//                                server nonce) when accepted}
//
// Then the connection carries requests (tcp_wire.h). Invariants and why:
// - The server serves nothing on a connection whose proof does not verify: it answers a refused
//   verdict and closes. Each side's nonce is fresh per connection, so a recorded proof is useless
//   on another connection; the two MACs use different labels, so a server's answer cannot be
//   replayed as a client's proof.
// - The client checks the server's MAC too, so a process that does not hold the secret cannot
//   pose as an owner and feed it bytes.
// - MACs are compared in constant time (CRYPTO_memcmp).
// - Both sides are bounded: each message must arrive by the deadline (SO_RCVTIMEO/SO_SNDTIMEO
//   for the handshake only), so a connection that never speaks cannot hold a serving thread.
// - An empty secret is allowed (a loopback-only data plane, security.insecure): the handshake
//   runs the same way and proves nothing beyond speaking the protocol.
// The data itself then moves on the authenticated connection unencrypted (no per-message MAC):
// the threat this closes is a peer without the secret, not an on-path attacker; clusters that
// need confidentiality on the wire run the data plane over an encrypted network (WireGuard, IPsec
// or RDMA inside a trusted fabric).
#pragma once

#include <chrono>
#include <string>

#include "absl/status/status.h"

namespace fluxon::transport::tcp {

inline constexpr uint32_t kChallengeMagic = 0x46584843;  // "FXHC"
inline constexpr uint32_t kProofMagic = 0x46584850;      // "FXHP"
inline constexpr uint32_t kVerdictMagic = 0x46584856;    // "FXHV"
inline constexpr uint8_t kHandshakeVersion = 1;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;

// The initiator's side on a freshly connected blocking socket. PermissionDenied when the server
// refuses our proof or its own MAC does not verify; Unavailable for I/O errors and the deadline.
absl::Status ClientHandshake(int fd, const std::string& secret,
                             std::chrono::steady_clock::time_point deadline);

// The serving side. PermissionDenied (after a refused verdict was sent) when the client's proof
// does not verify; Unavailable for I/O errors, the deadline and protocol errors.
absl::Status ServerHandshake(int fd, const std::string& secret,
                             std::chrono::steady_clock::time_point deadline);

}  // namespace fluxon::transport::tcp
