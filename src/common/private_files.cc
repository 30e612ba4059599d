#include "common/private_files.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_format.h"

namespace fluxon {
namespace {

absl::Status Errno(const std::string& what, const std::string& path, int err) {
  return absl::FailedPreconditionError(
      absl::StrFormat("%s %s: %s", what, path, std::strerror(err)));
}

}  // namespace

absl::Status CheckPrivateFile(int fd, const std::string& path, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Errno(what, path, errno);
  const uid_t me = ::geteuid();
  if (!S_ISREG(st.st_mode) || st.st_uid != me || (st.st_mode & 0777) != 0600 || st.st_nlink != 1) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s %s already exists and is not a private file of this user (wanted: a regular file of "
        "uid %d, mode 0600, one link; found: %s of uid %d, mode %o, %d links); remove it or "
        "choose another path",
        what, path, me, S_ISREG(st.st_mode) ? "a regular file" : "not a regular file", st.st_uid,
        st.st_mode & 07777, st.st_nlink));
  }
  return absl::OkStatus();
}

absl::StatusOr<PrivateFile> CreateOrOpenPrivateFile(const std::string& path,
                                                    const std::string& what) {
  PrivateFile f;
  f.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (f.fd >= 0) {
    f.created = true;
    // The umask may have taken bits away, never added them; 0600 is what the file must have.
    if (::fchmod(f.fd, 0600) != 0) {
      absl::Status st = Errno(what, path, errno);
      ::close(f.fd);
      ::unlink(path.c_str());
      return st;
    }
    return f;
  }
  if (errno != EEXIST) return Errno(what, path, errno);
  // O_NONBLOCK: a planted FIFO must not block the open; the fstat check refuses it.
  f.fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (f.fd < 0) {
    if (errno == ELOOP) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "%s %s is a symbolic link; it is never followed: remove it or choose another path", what,
          path));
    }
    return Errno(what, path, errno);
  }
  absl::Status st = CheckPrivateFile(f.fd, path, what);
  if (!st.ok()) {
    ::close(f.fd);
    return st;
  }
  const int flags = ::fcntl(f.fd, F_GETFL);
  if (flags < 0 || ::fcntl(f.fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    st = Errno(what, path, errno);
    ::close(f.fd);
    return st;
  }
  return f;
}

absl::Status EnsureSafeDirectory(const std::string& dir, mode_t mode, const std::string& what) {
  if (dir.empty()) return absl::OkStatus();
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return Errno(what, dir, errno);
    std::error_code ec;
    const std::filesystem::path p(dir);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
    if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) return Errno(what, dir, errno);
    if (::lstat(dir.c_str(), &st) != 0) return Errno(what, dir, errno);
  }
  const uid_t me = ::geteuid();
  const bool others_write = (st.st_mode & 0022) != 0;
  const bool sticky = (st.st_mode & S_ISVTX) != 0;
  if (!S_ISDIR(st.st_mode) || (st.st_uid != me && st.st_uid != 0) || (others_write && !sticky)) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s directory %s is not safe (wanted: a directory, not a symlink, of uid %d or root, "
        "not writable by others unless sticky; found: %s of uid %d, mode %o)",
        what, dir, me, S_ISDIR(st.st_mode) ? "a directory" : "not a directory", st.st_uid,
        st.st_mode & 07777));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RandomHex(size_t n) {
  std::string raw(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(raw.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrFormat("getrandom: %s", std::strerror(errno)));
    }
    got += static_cast<size_t>(r);
  }
  std::string hex;
  hex.reserve(2 * n);
  for (unsigned char b : raw) hex += absl::StrFormat("%02x", b);
  return hex;
}

}  // namespace fluxon
