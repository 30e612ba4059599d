// CPU-side tests of the data plane: layout arithmetic, argument validation, plan parsing, the
// copy-engine descriptor builder, and registration refusing to pretend without a usable GPU.
#include "fluxon/kv_transfer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "fluxon/host_registration.h"

namespace fluxon {
namespace {

// The benchmark model: 36 layers, 4 KV heads x 128 dims, bf16, 64-token pages.
KvPageLayout ModelMha() { return {KvAttention::kMha, 36, 64, 4 * 128 * 2}; }
// DeepSeek-like MLA: 61 layers, kv_lora_rank 512 + rope 64, bf16.
KvPageLayout ModelMla() { return {KvAttention::kMla, 61, 64, 576 * 2}; }

TEST(KvLayout, MhaValueIsLayerMajorKThenV) {
  const KvPageLayout l = ModelMha();
  EXPECT_EQ(l.buffers_per_layer(), 2u);
  EXPECT_EQ(l.chunk_bytes(), 65536u);
  EXPECT_EQ(l.layer_bytes(), 131072u);
  EXPECT_EQ(l.value_bytes(), 4718592u);  // the 4,718,592-byte value of the issue
  EXPECT_EQ(l.chunk_offset(0, 0), 0u);
  EXPECT_EQ(l.chunk_offset(0, 1), 65536u);
  EXPECT_EQ(l.chunk_offset(1, 0), 131072u);
  EXPECT_EQ(l.chunk_offset(35, 1), l.value_bytes() - l.chunk_bytes());
  EXPECT_EQ(l.device_page_offset(3), 3u * 65536u);
  EXPECT_TRUE(l.IsValid());
}

TEST(KvLayout, MlaValueIsOneChunkPerLayer) {
  const KvPageLayout l = ModelMla();
  EXPECT_EQ(l.buffers_per_layer(), 1u);
  EXPECT_EQ(l.chunk_bytes(), 64u * 1152u);
  EXPECT_EQ(l.value_bytes(), 4497408u);  // DeepSeek-V3 bf16 page of 64 tokens
  EXPECT_EQ(l.chunk_offset(60, 0), 60u * 64u * 1152u);
  EXPECT_EQ(l.chunks_per_value(), 61u);
}

TEST(KvLayout, ValidationNamesTheProblem) {
  EXPECT_TRUE(ValidateLayout(ModelMha()).ok());
  KvPageLayout zero_layers = ModelMha();
  zero_layers.num_layers = 0;
  EXPECT_EQ(ValidateLayout(zero_layers).code(), absl::StatusCode::kInvalidArgument);
  KvPageLayout odd = {KvAttention::kMla, 2, 1, 8};  // 8-byte chunks cannot be 16-byte copies
  absl::Status s = ValidateLayout(odd);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("multiple of 16"), std::string::npos) << s;
  KvPageLayout ok_small_rows = {KvAttention::kMla, 2, 2, 8};  // 16-byte chunks are fine
  EXPECT_TRUE(ValidateLayout(ok_small_rows).ok());
  KvPageLayout bad_kind = ModelMha();
  bad_kind.attention = static_cast<KvAttention>(7);
  EXPECT_FALSE(ValidateLayout(bad_kind).ok());
}

KvDeviceBuffers Buffers(KvPageLayout layout, uint64_t device_pages = 100) {
  KvDeviceBuffers b;
  b.layout = layout;
  b.device_pages = device_pages;
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    b.k_ptrs.push_back(0x10000000ull + l * 0x1000000ull);
    if (layout.attention == KvAttention::kMha) b.v_ptrs.push_back(0x80000000ull + l * 0x1000000ull);
  }
  return b;
}

TEST(KvDeviceBuffers, RejectsNullMisalignedAndMiscountedPointers) {
  EXPECT_TRUE(ValidateDeviceBuffers(Buffers(ModelMha())).ok());
  EXPECT_TRUE(ValidateDeviceBuffers(Buffers(ModelMla())).ok());

  KvDeviceBuffers missing_v = Buffers(ModelMha());
  missing_v.v_ptrs.pop_back();
  EXPECT_EQ(ValidateDeviceBuffers(missing_v).code(), absl::StatusCode::kInvalidArgument);

  KvDeviceBuffers mla_with_v = Buffers(ModelMla());
  mla_with_v.v_ptrs.push_back(0x1000);
  EXPECT_FALSE(ValidateDeviceBuffers(mla_with_v).ok());

  KvDeviceBuffers null_k = Buffers(ModelMha());
  null_k.k_ptrs[5] = 0;
  absl::Status s = ValidateDeviceBuffers(null_k);
  EXPECT_NE(s.message().find("layer 5 is null"), std::string::npos) << s;

  KvDeviceBuffers misaligned_v = Buffers(ModelMha());
  misaligned_v.v_ptrs[2] += 8;
  s = ValidateDeviceBuffers(misaligned_v);
  EXPECT_NE(s.message().find("not 16-byte aligned"), std::string::npos) << s;

  KvDeviceBuffers no_pages = Buffers(ModelMha(), 0);
  EXPECT_FALSE(ValidateDeviceBuffers(no_pages).ok());
}

TEST(KvKernelConfig, BudgetThreadsAndVectorsAreBounded) {
  EXPECT_TRUE(ValidateKernelConfig({}, 132).ok());
  EXPECT_FALSE(ValidateKernelConfig({.sm_budget = 0}, 132).ok());
  EXPECT_FALSE(ValidateKernelConfig({.sm_budget = 133}, 132).ok());
  EXPECT_TRUE(ValidateKernelConfig({.sm_budget = 132}, 132).ok());
  EXPECT_FALSE(ValidateKernelConfig({.threads_per_block = 1000}, 132).ok());
  EXPECT_FALSE(ValidateKernelConfig({.threads_per_block = 2048}, 132).ok());
  EXPECT_FALSE(ValidateKernelConfig({.vectors_per_thread = 3}, 132).ok());
  EXPECT_TRUE(ValidateKernelConfig({.vectors_per_thread = 8}, 132).ok());
}

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = PlanRegistry::Create({1 << 16});
    ASSERT_TRUE(r.ok()) << r.status();
    plans_ = std::move(*r);
  }
  std::unique_ptr<PlanRegistry> plans_;
};

TEST_F(PlanTest, ReadsCountAndValuesAndChecksKind) {
  std::vector<uint64_t> values = {0x100000, 0x600000, 0x200000};
  auto put = plans_->Issue(PlanKind::kPut, values);
  ASSERT_TRUE(put.ok());
  auto view = ReadTransferPlan(*put, PlanKind::kPut, plans_.get());
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->count, 3u);
  EXPECT_EQ(view->value_ptrs[1], 0x600000u);

  // A put plan handed to restore: the registry knows the kind.
  auto wrong = ReadTransferPlan(*put, PlanKind::kGet, plans_.get());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("is a put plan, expected a get plan"), std::string::npos)
      << wrong.status();

  // Without a registry the ABI alone is checked.
  auto raw = ReadTransferPlan(*put, PlanKind::kGet, nullptr);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->count, 3u);
}

TEST_F(PlanTest, RejectsNullMisalignedConsumedAndForeignBlobs) {
  EXPECT_EQ(ReadTransferPlan(0, PlanKind::kGet, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint64_t> values = {0x100000};
  auto get = plans_->Issue(PlanKind::kGet, values);
  ASSERT_TRUE(get.ok());
  EXPECT_NE(
      ReadTransferPlan(*get + 4, PlanKind::kGet, nullptr).status().message().find("8-byte aligned"),
      std::string::npos);

  ASSERT_TRUE(plans_->Consume(*get, PlanKind::kGet).ok());
  auto consumed = ReadTransferPlan(*get, PlanKind::kGet, nullptr);
  EXPECT_EQ(consumed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(consumed.status().message().find("already consumed"), std::string::npos);
  EXPECT_EQ(ReadTransferPlan(*get, PlanKind::kGet, plans_.get()).status().code(),
            absl::StatusCode::kFailedPrecondition);

  alignas(8) uint64_t garbage[4] = {0x1234, 1, 0x100000, 0};
  auto bad = ReadTransferPlan(reinterpret_cast<uint64_t>(garbage), PlanKind::kGet, nullptr);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bad magic"), std::string::npos) << bad.status();
  // A blob the registry never issued.
  garbage[0] = kPlanBlobMagic;
  EXPECT_TRUE(ReadTransferPlan(reinterpret_cast<uint64_t>(garbage), PlanKind::kGet, nullptr).ok());
  EXPECT_EQ(ReadTransferPlan(reinterpret_cast<uint64_t>(garbage), PlanKind::kGet, plans_.get())
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  garbage[1] = 0;
  EXPECT_FALSE(ReadTransferPlan(reinterpret_cast<uint64_t>(garbage), PlanKind::kGet, nullptr).ok());
}

TEST(PlanValues, RejectsNullAndMisalignedValues) {
  const KvPageLayout layout = ModelMha();
  uint64_t ptrs[3] = {0x100000, 0x200000, 0x300000};
  PlanView view{PlanKind::kGet, 3, ptrs};
  EXPECT_TRUE(ValidatePlanValues(view, layout, nullptr).ok());
  ptrs[1] = 0;
  EXPECT_NE(ValidatePlanValues(view, layout, nullptr).message().find("value 1 is a null"),
            std::string::npos);
  ptrs[1] = 0x200008;
  EXPECT_NE(ValidatePlanValues(view, layout, nullptr).message().find("not 16-byte aligned"),
            std::string::npos);
}

TEST(PageIndices, RangeIsCheckedWithPosition) {
  std::vector<int64_t> ok = {0, 5, 99};
  EXPECT_TRUE(ValidatePageIndices(ok, 100).ok());
  std::vector<int64_t> too_big = {0, 100};
  absl::Status s = ValidatePageIndices(too_big, 100);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("page index 100 at position 1"), std::string::npos) << s;
  std::vector<int64_t> negative = {-1};
  EXPECT_FALSE(ValidatePageIndices(negative, 100).ok());
}

TEST(CopyDescriptors, OneDescriptorPerChunkInPlanOrder) {
  const KvDeviceBuffers b = Buffers(ModelMha());
  const KvPageLayout& l = b.layout;
  std::vector<uint64_t> values = {0x7000000000ull, 0x7100000000ull};
  std::vector<int64_t> pages = {7, 3};
  auto d = BuildCopyDescriptors(KvDirection::kDeviceToValues, b, values, pages, 0, l.num_layers,
                                {.merge_adjacent = false});
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u * 36u * 2u);
  // Page 0 (device page 7), layer 0, K then V; destination is the value, source the GPU buffer.
  EXPECT_EQ((*d)[0].dst, values[0]);
  EXPECT_EQ((*d)[0].src, b.k_ptrs[0] + 7 * l.chunk_bytes());
  EXPECT_EQ((*d)[1].dst, values[0] + l.chunk_bytes());
  EXPECT_EQ((*d)[1].src, b.v_ptrs[0] + 7 * l.chunk_bytes());
  // Page 1, layer 35, V is the value's last chunk.
  EXPECT_EQ(d->back().dst, values[1] + l.value_bytes() - l.chunk_bytes());
  EXPECT_EQ(d->back().src, b.v_ptrs[35] + 3 * l.chunk_bytes());
  for (const auto& x : *d) EXPECT_EQ(x.bytes, l.chunk_bytes());

  // Restore of one layer swaps the sides and takes that layer's chunks only.
  auto r = BuildCopyDescriptors(KvDirection::kValuesToDevice, b, values, pages, 9, 1, {});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[0].src, values[0] + l.chunk_offset(9, 0));
  EXPECT_EQ((*r)[0].dst, b.k_ptrs[9] + 7 * l.chunk_bytes());
  EXPECT_EQ((*r)[3].src, values[1] + l.chunk_offset(9, 1));
  EXPECT_EQ((*r)[3].dst, b.v_ptrs[9] + 3 * l.chunk_bytes());
}

TEST(CopyDescriptors, MergesRunsContiguousOnBothSides) {
  // MLA with layer buffers laid out back to back and one page: every layer chunk of the value is
  // adjacent on the device too only when the buffers are; here they are not, except layers 1->2.
  KvDeviceBuffers b = Buffers({KvAttention::kMla, 3, 4, 64}, 1);
  const uint64_t chunk = b.layout.chunk_bytes();
  b.k_ptrs = {0x100000, 0x200000, 0x200000 + chunk};
  std::vector<uint64_t> values = {0x9000000};
  std::vector<int64_t> pages = {0};
  auto d = BuildCopyDescriptors(KvDirection::kValuesToDevice, b, values, pages, 0, 3, {});
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)[1].bytes, 2 * chunk);
  EXPECT_EQ((*d)[1].dst, 0x200000u);

  // Consecutive device pages and values spaced one chunk apart merge across pages.
  KvDeviceBuffers one = Buffers({KvAttention::kMla, 1, 4, 64}, 10);
  std::vector<uint64_t> vals = {0x9000000, 0x9000000 + chunk, 0x9000000 + 2 * chunk};
  std::vector<int64_t> seq = {4, 5, 6};
  auto m = BuildCopyDescriptors(KvDirection::kDeviceToValues, one, vals, seq, 0, 1, {});
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->size(), 1u);
  EXPECT_EQ((*m)[0].bytes, 3 * chunk);
  auto unmerged = BuildCopyDescriptors(KvDirection::kDeviceToValues, one, vals, seq, 0, 1,
                                       {.merge_adjacent = false});
  EXPECT_EQ(unmerged->size(), 3u);
}

TEST(CopyDescriptors, SortByHostAddressAndRejectBadArguments) {
  const KvDeviceBuffers b = Buffers({KvAttention::kMla, 2, 4, 64}, 10);
  std::vector<uint64_t> values = {0x9000000, 0x1000000};
  std::vector<int64_t> pages = {1, 2};
  auto d = BuildCopyDescriptors(KvDirection::kDeviceToValues, b, values, pages, 0, 2,
                                {.merge_adjacent = false, .sort_by_host_address = true});
  ASSERT_TRUE(d.ok());
  ASSERT_EQ(d->size(), 4u);
  for (size_t i = 1; i < d->size(); ++i) EXPECT_LT((*d)[i - 1].dst, (*d)[i].dst);

  std::vector<int64_t> out_of_range = {1, 10};
  EXPECT_EQ(BuildCopyDescriptors(KvDirection::kDeviceToValues, b, values, out_of_range, 0, 2, {})
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  std::vector<int64_t> short_list = {1};
  EXPECT_FALSE(
      BuildCopyDescriptors(KvDirection::kDeviceToValues, b, values, short_list, 0, 2, {}).ok());
  EXPECT_FALSE(BuildCopyDescriptors(KvDirection::kDeviceToValues, b, values, pages, 2, 1, {}).ok());
  EXPECT_FALSE(BuildCopyDescriptors(KvDirection::kDeviceToValues, b, values, pages, 1, 2, {}).ok());
}

TEST(CopyDescriptors, SplitByBytesCoversEverythingInOrder) {
  std::vector<KvCopyDescriptor> d(10, KvCopyDescriptor{0, 0, 100});
  d[0].bytes = 500;  // one big descriptor takes a run of its own
  auto bounds = SplitDescriptorsByBytes(d, 4);
  ASSERT_GE(bounds.size(), 2u);
  EXPECT_EQ(bounds.front(), 0u);
  EXPECT_EQ(bounds.back(), d.size());
  EXPECT_LE(bounds.size(), 5u);
  for (size_t i = 1; i < bounds.size(); ++i) EXPECT_LT(bounds[i - 1], bounds[i]);
  EXPECT_EQ(bounds[1], 1u);
  // More parts than descriptors: one per descriptor at most.
  std::vector<KvCopyDescriptor> two(2, KvCopyDescriptor{0, 0, 16});
  EXPECT_EQ(SplitDescriptorsByBytes(two, 8), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(SplitDescriptorsByBytes(two, 1), (std::vector<size_t>{0, 2}));
}

TEST(HostRegistration, MappingsAreCheckedBeforeCuda) {
  std::vector<HostMapping> none;
  EXPECT_FALSE(ValidateHostMappings(none).ok());
  alignas(4096) static unsigned char area[3 * 4096];
  std::vector<HostMapping> overlap = {{"a", area, 8192}, {"b", area + 4096, 4096}};
  absl::Status s = ValidateHostMappings(overlap);
  EXPECT_NE(s.message().find("'a' and 'b' overlap"), std::string::npos) << s;
  std::vector<HostMapping> null_base = {{"seg", nullptr, 4096}};
  EXPECT_FALSE(ValidateHostMappings(null_base).ok());
  std::vector<HostMapping> empty = {{"seg", area, 0}};
  EXPECT_FALSE(ValidateHostMappings(empty).ok());
  std::vector<HostMapping> ok = {{"a", area, 4096}, {"b", area + 4096, 8192}};
  EXPECT_TRUE(ValidateHostMappings(ok).ok());
}

// Without a usable GPU (CI), registration must fail loudly, never return a registration that
// pretends the memory is registered.
TEST(HostRegistration, FailsHardWithoutAUsableDevice) {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) {
    GTEST_SKIP() << "a CUDA device is present; the GPU tests cover registration";
  }
  void* mem = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  std::vector<HostMapping> mappings = {{"cpu:0", mem, 1 << 16}};
  auto reg = HostRegistration::Register(mappings);
  EXPECT_FALSE(reg.ok());
  munmap(mem, 1 << 16);
}

}  // namespace
}  // namespace fluxon
