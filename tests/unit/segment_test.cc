#include "slot/segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "fluxon/units.h"

namespace fluxon {
namespace {

SegmentOptions SmallSegment() {
  SegmentOptions o;
  o.size_bytes = 64 * kMiB;
  o.node_id = 3;
  return o;
}

// Runs `fn` in a forked child (another process mapping the same segment); returns its exit code.
template <typename Fn>
int InChild(Fn fn) {
  pid_t pid = fork();
  if (pid == 0) _exit(fn());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

TEST(Segment, CreateGivesNonZeroGenerationAndHeaderPage) {
  auto seg = Segment::Create(SmallSegment());
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_NE((*seg)->generation(), 0u);
  EXPECT_EQ((*seg)->data_offset(), 4096u);
  EXPECT_EQ((*seg)->data_bytes(), 64 * kMiB);
  EXPECT_EQ((*seg)->node_id(), 3u);
  auto other = Segment::Create(SmallSegment());
  ASSERT_TRUE(other.ok());
  EXPECT_NE((*seg)->generation(), (*other)->generation());
}

TEST(Segment, AnotherProcessAttachesByFdAndSeesWrites) {
  auto seg = Segment::Create(SmallSegment());
  ASSERT_TRUE(seg.ok());
  Segment& s = **seg;
  std::strcpy(reinterpret_cast<char*>(s.base() + s.data_offset()), "hello from owner");
  const SegmentDescriptor desc = s.descriptor();
  const int fd = s.fd();
  int rc = InChild([&] {
    auto att = Segment::AttachFd(fd, desc);
    if (!att.ok()) return 1;
    char* p = reinterpret_cast<char*>((*att)->base() + (*att)->data_offset());
    if (std::strcmp(p, "hello from owner") != 0) return 2;
    std::strcpy(p + 100, "hello from client");
    return 0;
  });
  EXPECT_EQ(rc, 0);
  EXPECT_STREQ(reinterpret_cast<char*>(s.base() + s.data_offset() + 100), "hello from client");
}

TEST(Segment, AttachByPathAndUnlinkOnOwnerExit) {
  SegmentOptions o = SmallSegment();
  o.path = "/dev/shm/fluxon-test-" + std::to_string(getpid());
  SegmentDescriptor desc;
  {
    auto seg = Segment::Create(o);
    ASSERT_TRUE(seg.ok()) << seg.status();
    desc = (*seg)->descriptor();
    (*seg)->base()[desc.data_offset] = 42;
    auto att = Segment::AttachPath(o.path, desc);
    ASSERT_TRUE(att.ok()) << att.status();
    EXPECT_FALSE((*att)->is_owner());
    EXPECT_EQ((*att)->base()[desc.data_offset], 42);
  }
  EXPECT_NE(access(o.path.c_str(), F_OK), 0);
}

// The segment file is never another user's or a symlink's target: a symlink at the path is
// refused without touching its target; a loose-mode or hard-linked file is refused unchanged;
// a private file of our own is reused.
TEST(Segment, PathThatIsNotAPrivateFileIsRefused) {
  SegmentOptions o = SmallSegment();
  const std::string dir = "/tmp/fluxon-test-segpath-" + std::to_string(getpid());
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  o.path = dir + "/segment";
  const std::string target = dir + "/target";
  {
    const int fd = ::open(target.c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "keep", 4), 4);
    ::close(fd);
  }
  ASSERT_EQ(::symlink(target.c_str(), o.path.c_str()), 0);
  auto linked = Segment::Create(o);
  EXPECT_EQ(linked.status().code(), absl::StatusCode::kPermissionDenied) << linked.status();
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 4);  // the symlink's target was not truncated or grown
  ASSERT_EQ(::unlink(o.path.c_str()), 0);

  ASSERT_EQ(::link(target.c_str(), o.path.c_str()), 0);  // one of our files, two links
  auto hard = Segment::Create(o);
  EXPECT_EQ(hard.status().code(), absl::StatusCode::kPermissionDenied) << hard.status();
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 4);
  ASSERT_EQ(::unlink(o.path.c_str()), 0);

  ASSERT_EQ(::rename(target.c_str(), o.path.c_str()), 0);
  ASSERT_EQ(::chmod(o.path.c_str(), 0640), 0);
  auto loose = Segment::Create(o);
  EXPECT_EQ(loose.status().code(), absl::StatusCode::kPermissionDenied) << loose.status();

  ASSERT_EQ(::chmod(o.path.c_str(), 0600), 0);  // now private: reused, starts empty
  {
    auto reused = Segment::Create(o);
    ASSERT_TRUE(reused.ok()) << reused.status();
    EXPECT_EQ((*reused)->base()[(*reused)->data_offset()], 0);
  }
  ::rmdir(dir.c_str());
}

TEST(Segment, StaleGenerationIsRejected) {
  auto seg = Segment::Create(SmallSegment());
  ASSERT_TRUE(seg.ok());
  SegmentDescriptor desc = (*seg)->descriptor();
  desc.generation ^= 1;
  auto att = Segment::AttachFd((*seg)->fd(), desc);
  EXPECT_EQ(att.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(att.status().message().find("generation"), std::string::npos);
}

TEST(Segment, WrongSizeIsRejected) {
  auto seg = Segment::Create(SmallSegment());
  SegmentDescriptor desc = (*seg)->descriptor();
  desc.total_bytes += 4096;
  EXPECT_FALSE(Segment::AttachFd((*seg)->fd(), desc).ok());
}

TEST(Segment, ResolveChecksTheGrantArea) {
  auto seg = Segment::Create(SmallSegment());
  Segment& s = **seg;
  EXPECT_TRUE(s.Resolve(s.data_offset(), 4096).ok());
  EXPECT_TRUE(s.Resolve(s.total_bytes() - 4096, 4096).ok());
  EXPECT_EQ(s.Resolve(0, 16).status().code(), absl::StatusCode::kOutOfRange);  // header
  EXPECT_FALSE(s.Resolve(s.total_bytes() - 4096, 4097).ok());
  EXPECT_FALSE(s.Resolve(s.data_offset(), UINT64_MAX).ok());
  EXPECT_FALSE(s.Resolve(UINT64_MAX - 10, 20).ok());
}

TEST(Segment, PopulateAndReleaseRange) {
  auto seg = Segment::Create(SmallSegment());
  Segment& s = **seg;
  ASSERT_TRUE(s.PopulateRange(s.data_offset(), 8 * kMiB).ok());
  s.base()[s.data_offset() + 10] = 7;
  ASSERT_TRUE(s.ReleaseRange(s.data_offset(), 8 * kMiB).ok());
  EXPECT_EQ(s.base()[s.data_offset() + 10], 0);  // hole punched: pages gone
}

TEST(Segment, NumaPlacementOnNodeZeroAndRejectsMissingNode) {
  SegmentOptions o = SmallSegment();
  o.numa_node = 0;
  auto seg = Segment::Create(o);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_TRUE((*seg)->PopulateRange((*seg)->data_offset(), 4 * kMiB).ok());
  o.numa_node = 1000;
  EXPECT_EQ(Segment::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Segment, HugePagesFailLoudlyWhenUnavailable) {
  SegmentOptions o = SmallSegment();
  o.huge_pages = true;
  auto seg = Segment::Create(o);
  // Either the machine has a hugepage pool and it works, or the error says why: never a silent
  // fallback to small pages.
  if (seg.ok()) {
    EXPECT_EQ((*seg)->page_bytes(), 2 * kMiB);
  } else {
    EXPECT_FALSE(seg.status().message().empty());
  }
  o.path = "/dev/shm/fluxon-huge-" + std::to_string(getpid());  // tmpfs, not hugetlbfs
  auto on_tmpfs = Segment::Create(o);
  EXPECT_EQ(on_tmpfs.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(access(o.path.c_str(), F_OK), 0);
}

TEST(Segment, ClientCannotPopulateOrRelease) {
  auto seg = Segment::Create(SmallSegment());
  auto att = Segment::AttachFd((*seg)->fd(), (*seg)->descriptor());
  ASSERT_TRUE(att.ok());
  EXPECT_FALSE((*att)->PopulateRange((*att)->data_offset(), 4096).ok());
  EXPECT_FALSE((*att)->ReleaseRange((*att)->data_offset(), 4096).ok());
}

}  // namespace
}  // namespace fluxon
