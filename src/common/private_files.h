// Files and directories the daemon creates must not be usable by another local user: a file
// planted at a configured path (another uid, a loose mode, a symlink, a hard link to one of our
// files) must stop the start with a clear error, never be opened, truncated or served.
// The kernel's fs.protected_* settings are not relied on.
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fluxon {

// An open file descriptor of a private file and whether this call created it.
struct PrivateFile {
  int fd = -1;
  bool created = false;
};

// Creates `path` as a new regular file, mode 0600, without following a symlink
// (O_CREAT | O_EXCL | O_NOFOLLOW), or opens the one already there only if fstat says it is a
// regular file of this effective uid, mode 0600 (no group or other bits), with one link.
// `what` names the file (the config key) in errors. The caller owns the descriptor.
absl::StatusOr<PrivateFile> CreateOrOpenPrivateFile(const std::string& path,
                                                    const std::string& what);

// The check CreateOrOpenPrivateFile applies to an existing file, on an open descriptor.
absl::Status CheckPrivateFile(int fd, const std::string& path, const std::string& what);

// Makes sure `dir` is a directory others cannot tamper with: created (with missing parents) as
// `mode` when absent; when present it must be a real directory (not a symlink) owned by this
// effective uid or by root, and writable by group or others only when the sticky bit is set
// (as /tmp is: nobody may then rename or remove another user's entries).
absl::Status EnsureSafeDirectory(const std::string& dir, mode_t mode, const std::string& what);

// `n` random bytes as lowercase hex, from the kernel's CSPRNG: names nobody can guess.
absl::StatusOr<std::string> RandomHex(size_t n);

}  // namespace fluxon
