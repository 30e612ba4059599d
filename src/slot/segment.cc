#include "slot/segment.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <numa.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/private_files.h"
#include "fluxon/units.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace fluxon {
namespace {

constexpr uint64_t kSegmentMagic = 0x31304745534E4C46ULL;  // "FLNSEG01"
constexpr uint64_t kSmallPage = 4 * kKiB;
constexpr uint64_t kHugePage = 2 * kMiB;

struct SegmentHeader {
  uint64_t magic;
  uint64_t generation;
  uint64_t total_bytes;
  uint64_t data_offset;
  uint64_t node_id;
};

absl::Status ErrnoError(const std::string& what) {
  return absl::InternalError(absl::StrFormat("%s: %s", what, std::strerror(errno)));
}

uint64_t NewGeneration() {
  std::random_device rd;
  uint64_t g = 0;
  while (g == 0) g = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  return g;
}

}  // namespace

Segment::Segment(uint8_t* base, int fd, bool is_owner, std::string path, SegmentDescriptor desc,
                 uint64_t page_bytes, int numa_node)
    : base_(base),
      fd_(fd),
      is_owner_(is_owner),
      path_(std::move(path)),
      desc_(desc),
      page_bytes_(page_bytes),
      numa_node_(numa_node) {}

Segment::~Segment() {
  munmap(base_, desc_.total_bytes);
  close(fd_);
  if (is_owner_ && !path_.empty()) unlink(path_.c_str());
}

absl::StatusOr<std::unique_ptr<Segment>> Segment::Create(const SegmentOptions& options) {
  if (options.size_bytes == 0) return absl::InvalidArgumentError("segment size must be > 0");
  if (options.numa_node >= 0) {
    if (numa_available() < 0) {
      return absl::FailedPreconditionError("NUMA placement requested but NUMA is unavailable");
    }
    if (options.numa_node > numa_max_node()) {
      return absl::InvalidArgumentError(absl::StrFormat("numa_node %d does not exist (max node %d)",
                                                        options.numa_node, numa_max_node()));
    }
  }
  const uint64_t page = options.huge_pages ? kHugePage : kSmallPage;
  const uint64_t data_offset = page;  // the header page; grants start page-aligned after it
  const uint64_t total = data_offset + AlignUp(options.size_bytes, page);

  int fd = -1;
  if (options.path.empty()) {
    unsigned flags = MFD_CLOEXEC | (options.huge_pages ? MFD_HUGETLB : 0u);
    fd = memfd_create(options.name.c_str(), flags);
    if (fd < 0)
      return ErrnoError("memfd_create" + std::string(options.huge_pages ? " (MFD_HUGETLB)" : ""));
  } else {
    // Never a file another user planted or can open, never through a symlink: the segment
    // holds every committed value, and the owner serves what it reads there.
    auto file = CreateOrOpenPrivateFile(options.path, "owner.segment.path");
    if (!file.ok()) return file.status();
    fd = file->fd;
    // An existing private file (a previous run's) starts empty like a new one.
    if (!file->created && ftruncate(fd, 0) != 0) {
      absl::Status st = ErrnoError("truncate segment " + options.path);
      close(fd);
      return st;
    }
    if (options.huge_pages) {
      struct statfs fs {};
      if (fstatfs(fd, &fs) != 0 || fs.f_type != HUGETLBFS_MAGIC) {
        close(fd);
        unlink(options.path.c_str());
        return absl::FailedPreconditionError(absl::StrFormat(
            "huge_pages requires the segment path to be on hugetlbfs; %s is not", options.path));
      }
    }
  }
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
    absl::Status st = ErrnoError(absl::StrFormat("ftruncate segment to %d bytes", total));
    close(fd);
    if (!options.path.empty()) unlink(options.path.c_str());
    return st;
  }
  void* addr = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    absl::Status st = ErrnoError(absl::StrFormat("mmap %d-byte segment", total));
    close(fd);
    if (!options.path.empty()) unlink(options.path.c_str());
    return st;
  }
  SegmentDescriptor desc{NewGeneration(), total, data_offset, options.node_id};
  // Writing the header faults in the header page; with huge pages that is where a missing
  // hugepage pool shows up (SIGBUS is avoided by populating first).
  if (options.huge_pages && madvise(addr, data_offset, MADV_POPULATE_WRITE) != 0) {
    absl::Status st = absl::ResourceExhaustedError(
        absl::StrFormat("no huge pages available for the segment header (vm.nr_hugepages?): %s",
                        std::strerror(errno)));
    munmap(addr, total);
    close(fd);
    if (!options.path.empty()) unlink(options.path.c_str());
    return st;
  }
  auto* header = static_cast<SegmentHeader*>(addr);
  header->generation = desc.generation;
  header->total_bytes = total;
  header->data_offset = data_offset;
  header->node_id = desc.node_id;
  header->magic = kSegmentMagic;
  return std::unique_ptr<Segment>(new Segment(static_cast<uint8_t*>(addr), fd, /*is_owner=*/true,
                                              options.path, desc, page, options.numa_node));
}

absl::StatusOr<std::unique_ptr<Segment>> Segment::MapAndValidate(
    int fd, std::string path, const SegmentDescriptor& expected) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    absl::Status s = ErrnoError("fstat segment");
    close(fd);
    return s;
  }
  if (expected.total_bytes == 0 || static_cast<uint64_t>(st.st_size) != expected.total_bytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "segment size is %d bytes, owner advertised %d", st.st_size, expected.total_bytes));
  }
  void* addr = mmap(nullptr, expected.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    absl::Status s = ErrnoError("mmap segment");
    close(fd);
    return s;
  }
  const auto* header = static_cast<const SegmentHeader*>(addr);
  absl::Status bad;
  if (header->magic != kSegmentMagic) {
    bad = absl::FailedPreconditionError("not a Fluxon segment (bad header magic)");
  } else if (header->generation != expected.generation) {
    bad = absl::FailedPreconditionError(absl::StrFormat(
        "segment generation %d does not match the owner's generation %d (stale mapping)",
        header->generation, expected.generation));
  } else if (header->total_bytes != expected.total_bytes ||
             header->data_offset != expected.data_offset || header->node_id != expected.node_id) {
    bad = absl::FailedPreconditionError("segment header disagrees with the owner's descriptor");
  }
  if (!bad.ok()) {
    munmap(addr, expected.total_bytes);
    close(fd);
    return bad;
  }
  const uint64_t page = expected.data_offset;
  return std::unique_ptr<Segment>(new Segment(static_cast<uint8_t*>(addr), fd, /*is_owner=*/false,
                                              std::move(path), expected, page, -1));
}

absl::StatusOr<std::unique_ptr<Segment>> Segment::AttachFd(int fd,
                                                           const SegmentDescriptor& expected) {
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return ErrnoError("dup segment fd");
  return MapAndValidate(own, "", expected);
}

absl::StatusOr<std::unique_ptr<Segment>> Segment::AttachPath(const std::string& path,
                                                             const SegmentDescriptor& expected) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open segment " + path);
  return MapAndValidate(fd, path, expected);
}

absl::StatusOr<uint8_t*> Segment::Resolve(uint64_t offset, uint64_t len) const {
  if (offset < desc_.data_offset || len > desc_.total_bytes || offset > desc_.total_bytes - len) {
    return absl::OutOfRangeError(
        absl::StrFormat("range [%d, +%d) is outside the segment's grant area [%d, %d)", offset, len,
                        desc_.data_offset, desc_.total_bytes));
  }
  return base_ + offset;
}

absl::Status Segment::PopulateRange(uint64_t offset, uint64_t len) {
  if (!is_owner_) return absl::FailedPreconditionError("only the owner populates segment memory");
  absl::StatusOr<uint8_t*> start = Resolve(offset, len);
  if (!start.ok()) return start.status();
  uint8_t* addr = *start;
  absl::Status result;
  auto touch = [&] {
    if (numa_node_ >= 0) {
      numa_run_on_node(numa_node_);
      numa_tonode_memory(addr, len, numa_node_);
    }
    if (madvise(addr, len, MADV_POPULATE_WRITE) == 0) return;
    if (errno != EINVAL) {
      result = absl::ResourceExhaustedError(
          absl::StrFormat("populating %d segment bytes failed: %s", len, std::strerror(errno)));
      return;
    }
    // Kernels before 5.14 lack MADV_POPULATE_WRITE: touch one byte per page instead.
    for (uint64_t i = 0; i < len; i += page_bytes_) {
      volatile uint8_t* p = addr + i;
      *p = *p;
    }
  };
  if (numa_node_ >= 0) {
    // A dedicated thread, so the caller's CPU affinity is left as it was.
    std::thread placer(touch);
    placer.join();
  } else {
    touch();
  }
  return result;
}

absl::Status Segment::PopulateMapping() {
  if (madvise(base_ + desc_.data_offset, data_bytes(), MADV_POPULATE_WRITE) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("populating the segment mapping failed: %s", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status Segment::ReleaseRange(uint64_t offset, uint64_t len) {
  if (!is_owner_) return absl::FailedPreconditionError("only the owner releases segment memory");
  absl::StatusOr<uint8_t*> start = Resolve(offset, len);
  if (!start.ok()) return start.status();
  if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                static_cast<off_t>(len)) != 0) {
    return ErrnoError("punching a hole in the segment");
  }
  return absl::OkStatus();
}

}  // namespace fluxon
