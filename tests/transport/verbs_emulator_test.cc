// The verbs emulator enforces the semantics the verbs transport relies on, and fails loudly.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "transport/verbs/verbs_emulator.h"

namespace fluxon::transport::verbs {
namespace {

// Two nodes with one connected RC QP pair, a 64 KiB MR on each.
struct Pair {
  explicit Pair(bool assert_on_violation = false, int cq_depth = 64, uint32_t max_wr = 8) {
    EmulatorOptions o;
    o.assert_on_violation = assert_on_violation;
    fabric = std::make_shared<EmulatedFabric>(o);
    a = fabric->AttachNode("a");
    b = fabric->AttachNode("b");
    ctx_a = *a->OpenDevice("");
    ctx_b = *b->OpenDevice("");
    pd_a = *a->AllocPd(ctx_a);
    pd_b = *b->AllocPd(ctx_b);
    mem_a.assign(65536, 1);
    mem_b.assign(65536, 2);
    mr_a =
        *a->RegisterMr(pd_a, mem_a.data(), mem_a.size(), kLocalWrite | kRemoteRead | kRemoteWrite);
    mr_b =
        *b->RegisterMr(pd_b, mem_b.data(), mem_b.size(), kLocalWrite | kRemoteRead | kRemoteWrite);
    cq_a = *a->CreateCq(ctx_a, cq_depth);
    cq_b = *b->CreateCq(ctx_b, cq_depth);
    qp_a = *a->CreateRcQp(pd_a, cq_a, max_wr);
    qp_b = *b->CreateRcQp(pd_b, cq_b, max_wr);
  }
  void Connect() {
    ASSERT_TRUE(a->ModifyQpToInit(qp_a, kRemoteRead | kRemoteWrite | kLocalWrite).ok());
    ASSERT_TRUE(b->ModifyQpToInit(qp_b, kRemoteRead | kRemoteWrite | kLocalWrite).ok());
    ASSERT_TRUE(a->ModifyQpToRtr(qp_a, *b->LocalAddress(qp_b)).ok());
    ASSERT_TRUE(b->ModifyQpToRtr(qp_b, *a->LocalAddress(qp_a)).ok());
    ASSERT_TRUE(a->ModifyQpToRts(qp_a, 0).ok());
    ASSERT_TRUE(b->ModifyQpToRts(qp_b, 0).ok());
  }
  SendWr Read(uint64_t id, uint64_t local_off, uint64_t remote_off, uint32_t len, bool signaled) {
    return SendWr{id,
                  WrOpcode::kRdmaRead,
                  reinterpret_cast<uint64_t>(mem_a.data() + local_off),
                  len,
                  mr_a.lkey,
                  reinterpret_cast<uint64_t>(mem_b.data() + remote_off),
                  mr_b.rkey,
                  signaled};
  }
  // Polls a's CQ until `n` completions arrived or 2 s passed.
  std::vector<WorkCompletion> Poll(size_t n) {
    std::vector<WorkCompletion> out;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (out.size() < n && std::chrono::steady_clock::now() < until) {
      WorkCompletion wc[16];
      auto got = a->PollCq(cq_a, wc);
      if (!got.ok()) break;
      out.insert(out.end(), wc, wc + *got);
      if (*got == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return out;
  }
  std::shared_ptr<EmulatedFabric> fabric;
  std::unique_ptr<VerbsApi> a, b;
  Handle ctx_a, ctx_b, pd_a, pd_b, cq_a, cq_b, qp_a, qp_b;
  MrInfo mr_a, mr_b;
  std::vector<uint8_t> mem_a, mem_b;
};

TEST(VerbsEmulator, PostingOnAQpNotInRtsFails) {
  Pair p;
  SendWr wr = p.Read(1, 0, 0, 64, true);
  EXPECT_EQ(p.a->PostSend(p.qp_a, {&wr, 1}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.fabric->violations(), 1u);
  EXPECT_NE(p.fabric->last_violation().find("RESET"), std::string::npos);
}

TEST(VerbsEmulator, StateTransitionsMustBeInOrder) {
  Pair p;
  EXPECT_FALSE(p.a->ModifyQpToRtr(p.qp_a, *p.b->LocalAddress(p.qp_b)).ok());  // RESET -> RTR
  EXPECT_FALSE(p.a->ModifyQpToRts(p.qp_a, 0).ok());
  EXPECT_EQ(p.fabric->violations(), 2u);
}

TEST(VerbsEmulator, ReadWithSelectiveSignalingAndOrder) {
  Pair p;
  p.Connect();
  std::memset(p.mem_b.data(), 7, 4096);
  // Three WRs, only the last signaled: one completion, and all three executed in order.
  std::vector<SendWr> list = {p.Read(1, 0, 0, 1024, false), p.Read(2, 1024, 1024, 1024, false),
                              p.Read(3, 2048, 2048, 2048, true)};
  ASSERT_TRUE(p.a->PostSend(p.qp_a, list).ok());
  auto wcs = p.Poll(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 3u);
  EXPECT_EQ(wcs[0].status, WcStatus::kSuccess);
  EXPECT_EQ(p.Poll(1).size(), 0u) << "unsignaled WRs must not complete";
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(p.mem_a[i], 7);
  EXPECT_EQ(p.fabric->violations(), 0u);
}

TEST(VerbsEmulator, WrongRkeyOrRangeIsARemoteAccessErrorAndFlushes) {
  Pair p;
  p.Connect();
  SendWr bad = p.Read(1, 0, 0, 64, false);
  bad.rkey ^= 1;
  std::vector<SendWr> list = {bad, p.Read(2, 0, 0, 64, false)};
  ASSERT_TRUE(p.a->PostSend(p.qp_a, list).ok());
  auto wcs = p.Poll(2);
  ASSERT_EQ(wcs.size(), 2u) << "errors and flushes complete even when unsignaled";
  EXPECT_EQ(wcs[0].status, WcStatus::kRemoteAccessError);
  EXPECT_EQ(wcs[1].status, WcStatus::kFlushError);
  EXPECT_EQ(p.mem_a[0], 1) << "a refused read wrote local memory";
  // The QP is in error now: posting is a violation.
  SendWr again = p.Read(3, 0, 0, 64, true);
  EXPECT_FALSE(p.a->PostSend(p.qp_a, {&again, 1}).ok());

  Pair q;
  q.Connect();
  SendWr out = q.Read(1, 0, 65536 - 32, 64, true);  // past the remote MR's end
  ASSERT_TRUE(q.a->PostSend(q.qp_a, {&out, 1}).ok());
  auto w = q.Poll(1);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].status, WcStatus::kRemoteAccessError);
}

TEST(VerbsEmulator, SendQueueDepthAndCqDepthAreEnforced) {
  Pair p(/*assert=*/false, /*cq_depth=*/2, /*max_wr=*/4);
  p.Connect();
  std::vector<SendWr> five;
  for (int i = 0; i < 5; ++i) five.push_back(p.Read(i + 1, 0, 0, 64, true));
  EXPECT_EQ(p.a->PostSend(p.qp_a, five).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.fabric->violations(), 1u);
  std::vector<SendWr> three = {p.Read(1, 0, 0, 64, true), p.Read(2, 0, 0, 64, true),
                               p.Read(3, 0, 0, 64, true)};
  ASSERT_TRUE(p.a->PostSend(p.qp_a, three).ok());  // 3 signaled completions, CQ depth 2
  for (int i = 0; i < 200 && p.fabric->violations() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(p.fabric->violations(), 2u);
  EXPECT_NE(p.fabric->last_violation().find("CQ overrun"), std::string::npos);
  WorkCompletion wc[4];
  EXPECT_EQ(p.a->PollCq(p.cq_a, wc).status().code(), absl::StatusCode::kDataLoss);
}

TEST(VerbsEmulator, DeadResponderIsRetryExceeded) {
  Pair p;
  p.Connect();
  p.fabric->KillNode("b");
  SendWr wr = p.Read(1, 0, 0, 64, false);
  ASSERT_TRUE(p.a->PostSend(p.qp_a, {&wr, 1}).ok());
  auto wcs = p.Poll(1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, WcStatus::kRetryExceeded);
}

TEST(VerbsEmulator, LifetimeViolations) {
  Pair p;
  EXPECT_FALSE(p.a->DestroyCq(p.cq_a).ok());  // a QP still uses it
  EXPECT_FALSE(p.a->DeallocPd(p.pd_a).ok());  // MR and QP still alive
  EXPECT_EQ(p.fabric->violations(), 2u);
}

TEST(VerbsEmulatorDeathTest, AssertsOnViolationWhenAsked) {
  EXPECT_DEATH(
      {
        Pair p(/*assert=*/true);
        SendWr wr = p.Read(1, 0, 0, 64, true);
        (void)p.a->PostSend(p.qp_a, {&wr, 1});
      },
      "");
}

}  // namespace
}  // namespace fluxon::transport::verbs
