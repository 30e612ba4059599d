// Unit tests of the transport's pure pieces: the bounds check, the wire-format validation and
// the batch bookkeeping.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>

#include "transport/batch.h"
#include "transport/region.h"
#include "transport/tcp/tcp_wire.h"

namespace fluxon::transport {
namespace {

TEST(CheckRange, AcceptsInsideRefusesOutsideAndOverflow) {
  EXPECT_TRUE(CheckRange(100, 0, 100).ok());
  EXPECT_TRUE(CheckRange(100, 99, 1).ok());
  EXPECT_EQ(CheckRange(100, 0, 0).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(CheckRange(100, 100, 1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(CheckRange(100, 1, 100).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(CheckRange(100, UINT64_MAX, 2).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(CheckRange(100, 50, UINT64_MAX - 10).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(CheckRange(UINT64_MAX, UINT64_MAX - 1, 2).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(CheckRange(UINT64_MAX, UINT64_MAX - 2, 2).ok());
}

TEST(RegisteredRegion, GenerationLeasesAndLocalChecks) {
  std::vector<uint8_t> mem(4096);
  RegisteredRegion r;
  EXPECT_EQ(r.Acquire(1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(r.Register(0, mem.data(), mem.size()).ok());
  ASSERT_TRUE(r.Register(5, mem.data(), mem.size()).ok());
  EXPECT_EQ(r.Register(6, mem.data(), mem.size()).code(), absl::StatusCode::kFailedPrecondition);
  auto stale = r.Acquire(4);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.status().message().find("stale generation"), std::string::npos);
  EXPECT_TRUE(r.CheckLocal(mem.data() + 10, 100).ok());
  EXPECT_FALSE(r.CheckLocal(mem.data() + 4000, 100).ok());
  EXPECT_FALSE(r.CheckLocal(mem.data() - 1, 1).ok());
  {
    auto lease = r.Acquire(5);
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(r.active_leases(), 1u);
    // Unregister waits for the lease (bounded): here it times out.
    EXPECT_EQ(r.Unregister(absl::Milliseconds(50)).code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_FALSE(r.Acquire(5).ok()) << "no new lease while unregistering";
  }
  EXPECT_TRUE(r.Unregister(absl::Seconds(1)).ok());
  EXPECT_EQ(r.Unregister(absl::Seconds(1)).code(), absl::StatusCode::kNotFound);
}

TEST(TcpWire, HeaderAndDescriptorValidation) {
  tcp::RequestHeader h;
  h.op = static_cast<uint8_t>(OpKind::kRead);
  h.descriptor_count = 1;
  EXPECT_TRUE(tcp::ValidateRequestHeader(h).ok());
  auto bad = h;
  bad.magic = 1;
  EXPECT_FALSE(tcp::ValidateRequestHeader(bad).ok());
  bad = h;
  bad.version = 9;
  EXPECT_FALSE(tcp::ValidateRequestHeader(bad).ok());
  bad = h;
  bad.op = 7;
  EXPECT_FALSE(tcp::ValidateRequestHeader(bad).ok());
  bad = h;
  bad.descriptor_count = 0;
  EXPECT_FALSE(tcp::ValidateRequestHeader(bad).ok());
  bad.descriptor_count = tcp::kMaxDescriptorsPerRequest + 1;
  EXPECT_FALSE(tcp::ValidateRequestHeader(bad).ok());
  bad = h;
  bad.payload_bytes = 1;  // a read carries no payload
  EXPECT_FALSE(tcp::ValidateRequestHeader(bad).ok());
  auto w = h;
  w.op = static_cast<uint8_t>(OpKind::kWrite);
  w.payload_bytes = tcp::kMaxRequestBytes + 1;
  EXPECT_FALSE(tcp::ValidateRequestHeader(w).ok());

  w.payload_bytes = 300;
  w.descriptor_count = 2;
  std::vector<tcp::WireDescriptor> d = {{0, 100}, {500, 200}};
  EXPECT_TRUE(tcp::ValidateRequestDescriptors(w, d).ok());
  w.payload_bytes = 299;
  EXPECT_FALSE(tcp::ValidateRequestDescriptors(w, d).ok());
  d = {{0, UINT64_MAX}, {0, 2}};  // the sum overflows
  EXPECT_FALSE(tcp::ValidateRequestDescriptors(h, d).ok());
  d = {{0, 0}};
  EXPECT_FALSE(tcp::ValidateRequestDescriptors(h, d).ok());
}

TEST(BatchState, CompletesOnceWithPerDescriptorStatus) {
  std::vector<uint8_t> a(10), b(20);
  std::vector<Descriptor> d = {{0, a.data(), 10}, {0, b.data(), 20}};
  BatchState s(1, PeerId{"p", 1}, OpKind::kRead, d, DeadlineAfter(absl::Seconds(10)));
  int completions = 0;
  s.SetCompletionHook([&] { ++completions; });
  s.SetUnits(2);
  s.RecordPiece(0, 10, absl::OkStatus());
  s.FinishUnit();
  EXPECT_FALSE(s.Done());
  s.RecordPiece(1, 0, absl::OutOfRangeError("x"));
  s.FinishUnit();
  ASSERT_TRUE(s.Done());
  EXPECT_EQ(completions, 1);
  const BatchResult& r = s.Wait();
  EXPECT_EQ(r.status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(r.descriptors[0].ok());
  EXPECT_EQ(r.descriptors[1].code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(r.bytes_ok, 10u);
  EXPECT_FALSE(s.Abort(absl::CancelledError("late")));
}

TEST(BatchRegistry, DeadlineAbortsAndHookRuns) {
  BatchRegistry reg;
  std::vector<uint8_t> a(10);
  std::vector<Descriptor> d = {{0, a.data(), 10}};
  auto b = reg.Create(PeerId{"p", 1}, OpKind::kRead, d, absl::Milliseconds(50));
  b->SetUnits(1);
  b->SetAbortHook(
      [b_raw = b.get()] { b_raw->FinishUnit(); });  // as a transport drops a queued unit
  reg.Arm(b);
  ASSERT_TRUE(b->WaitFor(absl::Seconds(5)));
  EXPECT_EQ(b->Wait().status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(b->Wait().descriptors[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(reg.WaitAllDone(absl::Seconds(1)));
  EXPECT_EQ(reg.outstanding(), 0u);
}

}  // namespace
}  // namespace fluxon::transport
