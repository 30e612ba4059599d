#include "fluxon/plan_blob.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace fluxon {
namespace {

class CountingPayload : public PlanPayload {
 public:
  explicit CountingPayload(int* alive) : alive_(alive) { ++*alive_; }
  ~CountingPayload() override { --*alive_; }

 private:
  int* alive_;
};

std::unique_ptr<PlanRegistry> MakeRegistry(size_t bytes = 1 << 20) {
  auto r = PlanRegistry::Create({bytes});
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(*r);
}

TEST(PlanBlobAbi, LayoutIsMagicCountThenPointers) {
  alignas(8) unsigned char blob[PlanBlobBytes(3)];
  auto* words = reinterpret_cast<uint64_t*>(blob);
  EXPECT_EQ(PlanBlobBytes(3), 40u);
  EXPECT_EQ(PlanValuePtrs(blob), words + 2);
  // The magic reads as "FLUXPLN1" in memory.
  uint64_t magic = kPlanBlobMagic;
  EXPECT_EQ(std::memcmp(&magic, "FLUXPLN1", 8), 0);
}

TEST(PlanRegistry, IssueWritesTheAbiAndConsumeReturnsPayload) {
  auto reg = MakeRegistry();
  int alive = 0;
  std::vector<uint64_t> ptrs = {0x1000, 0x2000, 0x3000};
  auto plan = reg->Issue(PlanKind::kPut, ptrs, std::make_unique<CountingPayload>(&alive));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const auto* words = reinterpret_cast<const uint64_t*>(*plan);
  EXPECT_EQ(words[0], kPlanBlobMagic);
  EXPECT_EQ(words[1], 3u);
  EXPECT_EQ(words[2], 0x1000u);
  EXPECT_EQ(words[4], 0x3000u);
  EXPECT_EQ(*plan % 8, 0u);
  EXPECT_GE(*plan, reinterpret_cast<uint64_t>(reg->arena_base()));
  EXPECT_LT(*plan, reinterpret_cast<uint64_t>(reg->arena_base()) + reg->arena_bytes());
  EXPECT_EQ(reinterpret_cast<uint64_t>(reg->arena_base()) % 4096, 0u);  // registrable with CUDA
  EXPECT_EQ(reg->live_plans(), 1u);
  EXPECT_EQ(alive, 1);
  auto payload = reg->Consume(*plan, PlanKind::kPut);
  ASSERT_TRUE(payload.ok());
  EXPECT_NE(payload->get(), nullptr);
  EXPECT_EQ(reg->live_plans(), 0u);
  EXPECT_EQ(words[0], kPlanBlobConsumedMagic);
  payload->reset();
  EXPECT_EQ(alive, 0);
}

TEST(PlanRegistry, WrongKindFailsAndLeavesPlanLive) {
  auto reg = MakeRegistry();
  std::vector<uint64_t> ptrs = {0x1000};
  auto plan = reg->Issue(PlanKind::kPut, ptrs);
  ASSERT_TRUE(plan.ok());
  auto wrong = reg->Consume(*plan, PlanKind::kGet);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("put plan, expected a get plan"), std::string::npos);
  EXPECT_EQ(reg->live_plans(), 1u);
  EXPECT_EQ(reinterpret_cast<const uint64_t*>(*plan)[0], kPlanBlobMagic);
  EXPECT_TRUE(reg->Consume(*plan, PlanKind::kPut).ok());
}

TEST(PlanRegistry, SecondConsumeFailsFast) {
  auto reg = MakeRegistry();
  std::vector<uint64_t> ptrs = {0x1000, 0x2000};
  auto plan = reg->Issue(PlanKind::kGet, ptrs);
  ASSERT_TRUE(reg->Consume(*plan, PlanKind::kGet).ok());
  auto again = reg->Consume(*plan, PlanKind::kGet);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("already consumed"), std::string::npos);
  EXPECT_FALSE(reg->Peek(*plan, std::nullopt).ok());
}

TEST(PlanRegistry, UnknownAddressIsNotFound) {
  auto reg = MakeRegistry();
  uint64_t fake[4] = {kPlanBlobMagic, 2, 0, 0};
  auto r = reg->Consume(reinterpret_cast<uint64_t>(fake), PlanKind::kPut);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reg->Consume(0, PlanKind::kPut).status().code(), absl::StatusCode::kNotFound);
}

TEST(PlanRegistry, EmptyBatchIsRejected) {
  auto reg = MakeRegistry();
  EXPECT_EQ(reg->Issue(PlanKind::kPut, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg->live_plans(), 0u);
}

TEST(PlanRegistry, CorruptedHeaderIsDetected) {
  auto reg = MakeRegistry();
  std::vector<uint64_t> ptrs = {1, 2};
  auto plan = reg->Issue(PlanKind::kPut, ptrs);
  reinterpret_cast<uint64_t*>(*plan)[1] = 5;  // count overwritten
  EXPECT_EQ(reg->Consume(*plan, PlanKind::kPut).status().code(), absl::StatusCode::kDataLoss);
}

TEST(PlanRegistry, ArenaExhaustionIsAnErrorAndRecovers) {
  auto reg = MakeRegistry(64 * 1024);
  std::vector<uint64_t> ptrs(128, 0x1000);  // 2 KiB blocks: 32 fit in 64 KiB
  std::vector<uint64_t> plans;
  for (;;) {
    auto p = reg->Issue(PlanKind::kPut, ptrs);
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
      break;
    }
    plans.push_back(*p);
  }
  EXPECT_EQ(plans.size(), 32u);
  ASSERT_TRUE(reg->Consume(plans.back(), PlanKind::kPut).ok());
  EXPECT_TRUE(reg->Issue(PlanKind::kPut, ptrs).ok());
}

TEST(PlanRegistry, FreedBlocksAreReusedOldestFirst) {
  auto reg = MakeRegistry();
  std::vector<uint64_t> ptrs = {7};
  uint64_t a = *reg->Issue(PlanKind::kPut, ptrs);
  uint64_t b = *reg->Issue(PlanKind::kPut, ptrs);
  ASSERT_TRUE(reg->Consume(a, PlanKind::kPut).ok());
  ASSERT_TRUE(reg->Consume(b, PlanKind::kPut).ok());
  EXPECT_EQ(*reg->Issue(PlanKind::kPut, ptrs), a);
  EXPECT_EQ(*reg->Issue(PlanKind::kPut, ptrs), b);
}

TEST(PlanRegistry, ConcurrentIssueConsumeKeepsEveryPlanDistinct) {
  auto reg = MakeRegistry(4 << 20);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint64_t> ptrs(1 + t * 10, 0x1000 + t);
      for (int i = 0; i < 2000; ++i) {
        auto p = reg->Issue(i % 2 ? PlanKind::kGet : PlanKind::kPut, ptrs);
        if (!p.ok()) {
          ++errors;
          continue;
        }
        auto view = reg->Peek(*p, std::nullopt);
        if (!view.ok() || view->count != ptrs.size() || view->value_ptrs[0] != ptrs[0]) ++errors;
        if (!reg->Consume(*p, i % 2 ? PlanKind::kGet : PlanKind::kPut).ok()) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(reg->live_plans(), 0u);
}

}  // namespace
}  // namespace fluxon
