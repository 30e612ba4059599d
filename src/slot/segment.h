// Segment: the owner's shared host-memory segment that every inference process on the machine
// attaches to.
//
// Invariants:
// - One segment per owner start. Its header (first page) records a non-zero random `generation`;
//   a client attaching by fd or path must present the generation the owner advertised, so a
//   mapping of a previous owner start is rejected instead of silently read.
// - Bytes [data_offset, size) are the grant area; every range handed out (Resolve) lies inside it.
// - Backing is a memfd (shared by fd passing) or a file such as /dev/shm/NAME (shared by path);
//   with huge_pages it is a MFD_HUGETLB memfd or a file on hugetlbfs, and failure is an error,
//   never a silent fallback to small pages.
// - NUMA placement is by first touch: PopulateRange binds the range to the configured node and
//   touches it from a thread running on that node.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace fluxon {

struct SegmentOptions {
  uint64_t size_bytes = 0;  // grant area; the header page is added on top
  bool huge_pages = false;
  int numa_node = -1;  // -1: no placement
  std::string path;    // empty: anonymous memfd
  std::string name = "fluxon-segment";
  uint32_t node_id = 0;
};

// What an owner tells a client so it can attach and validate.
struct SegmentDescriptor {
  uint64_t generation = 0;
  uint64_t total_bytes = 0;  // header + grant area
  uint64_t data_offset = 0;
  uint32_t node_id = 0;
};

class Segment {
 public:
  // Owner side: creates and maps a new segment with a fresh generation.
  static absl::StatusOr<std::unique_ptr<Segment>> Create(const SegmentOptions& options);
  // Client side: maps the segment behind `fd` (the call dups it) and validates it.
  static absl::StatusOr<std::unique_ptr<Segment>> AttachFd(int fd,
                                                           const SegmentDescriptor& expected);
  // Client side: opens and maps a path-backed segment and validates it.
  static absl::StatusOr<std::unique_ptr<Segment>> AttachPath(const std::string& path,
                                                             const SegmentDescriptor& expected);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  uint8_t* base() const { return base_; }
  int fd() const { return fd_; }
  bool is_owner() const { return is_owner_; }
  const std::string& path() const { return path_; }
  uint64_t generation() const { return desc_.generation; }
  uint64_t total_bytes() const { return desc_.total_bytes; }
  uint64_t data_offset() const { return desc_.data_offset; }
  uint64_t data_bytes() const { return desc_.total_bytes - desc_.data_offset; }
  uint32_t node_id() const { return desc_.node_id; }
  uint64_t page_bytes() const { return page_bytes_; }
  int numa_node() const { return numa_node_; }  // -1: no placement
  const SegmentDescriptor& descriptor() const { return desc_; }

  // Address of [offset, offset + len) after checking it lies in the grant area.
  absl::StatusOr<uint8_t*> Resolve(uint64_t offset, uint64_t len) const;
  // Allocates (and places, when a NUMA node is set) the pages of a range. Owner only.
  absl::Status PopulateRange(uint64_t offset, uint64_t len);
  // Maps every page of the grant area into this process's page tables (owner or client).
  absl::Status PopulateMapping();
  // Returns the pages of a range to the kernel (the range reads as zeros afterwards). Owner only.
  absl::Status ReleaseRange(uint64_t offset, uint64_t len);

 private:
  Segment(uint8_t* base, int fd, bool is_owner, std::string path, SegmentDescriptor desc,
          uint64_t page_bytes, int numa_node);
  static absl::StatusOr<std::unique_ptr<Segment>> MapAndValidate(int fd, std::string path,
                                                                 const SegmentDescriptor& expected);

  uint8_t* const base_;
  const int fd_;
  const bool is_owner_;
  const std::string path_;
  const SegmentDescriptor desc_;
  const uint64_t page_bytes_;
  const int numa_node_;
};

}  // namespace fluxon
