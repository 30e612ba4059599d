// Reading the files `security:` names (config/config.h): the TLS material and the
// cluster secret. Everything is checked when the node starts, so a wrong path, a key that does
// not belong to its certificate or a too-short secret is a start-up error naming the file, not a
// handshake failure later.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"

namespace fluxon::security {

// PEM text of a node's (or fluxonctl's) TLS identity and the CA it trusts.
struct TlsMaterial {
  std::string cert_chain;   // this side's certificate (and intermediates)
  std::string private_key;  // its key
  std::string ca_certs;     // the CA certificates peers must chain to
  // DNS and IP names of the first certificate (subjectAltName, else the subject CN): what a
  // client dialing this node may call it (the watchdog probe uses the first).
  std::vector<std::string> names;
};

// Reads and checks the three files: each readable, the certificate and CA parse as X.509, the key
// parses and matches the certificate. InvalidArgument / NotFound naming the config key and path.
absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsConfig& tls);

// The minimum length of a cluster secret, in bytes after stripping surrounding whitespace.
inline constexpr size_t kMinClusterSecretBytes = 16;

// Reads security.cluster_secret_file: the file's bytes with surrounding whitespace removed, at
// least kMinClusterSecretBytes. Logs a warning when other users may read it (mode & 0077).
absl::StatusOr<std::string> LoadClusterSecret(const std::string& path);

// The machine-local cluster secret of this user: what a data plane uses when no
// security.cluster_secret_file is set (so it is never open, even on loopback). Every fluxond of
// one user on one machine shares it (they find each other's data planes on loopback); nobody
// else can read it. Created at first use with 32 random bytes (hex), mode 0600, atomically (two
// owners starting at once agree on one). A file there that is not a regular file owned by this
// user with no group/other permissions is refused, never read (another user could have planted
// a secret they know).
std::string MachineSecretPath();
absl::StatusOr<std::string> LoadOrCreateMachineSecret(const std::string& path);

}  // namespace fluxon::security
