#include <sys/mman.h>

#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "common/mutex.h"
#include "fluxon/plan_blob.h"

namespace fluxon {

const char* PlanKindName(PlanKind kind) {
  switch (kind) {
    case PlanKind::kPut:
      return "put";
    case PlanKind::kGet:
      return "get";
  }
  return "unknown";
}

namespace {

constexpr size_t kMinBlockBytes = 64;
constexpr size_t kNumSizeClasses = 16;  // 64 B .. 2 MiB blocks (up to 262142 values per plan)

size_t SizeClassFor(size_t bytes) {
  size_t cls = 0;
  size_t block = kMinBlockBytes;
  while (block < bytes) {
    block <<= 1;
    ++cls;
  }
  return cls;
}

size_t BlockBytes(size_t cls) { return kMinBlockBytes << cls; }

enum class BlockState : uint8_t { kLive, kConsumed };

struct Block {
  size_t size_class;
  BlockState state;
  PlanKind kind;
  uint64_t count;
  std::unique_ptr<PlanPayload> payload;
};

}  // namespace

class PlanRegistry::Impl {
 public:
  Impl(unsigned char* base, size_t bytes) : base_(base), bytes_(bytes) {}
  ~Impl() { munmap(base_, bytes_); }

  absl::StatusOr<uint64_t> Issue(PlanKind kind, std::span<const uint64_t> value_ptrs,
                                 std::unique_ptr<PlanPayload> payload) {
    if (value_ptrs.empty()) return absl::InvalidArgumentError("plan must hold at least one value");
    const size_t need = PlanBlobBytes(value_ptrs.size());
    const size_t cls = SizeClassFor(need);
    if (cls >= kNumSizeClasses) {
      return absl::InvalidArgumentError(
          absl::StrFormat("plan of %d values exceeds the largest plan blob", value_ptrs.size()));
    }
    unsigned char* blob = nullptr;
    {
      MutexLock lock(&mu_);
      std::deque<unsigned char*>& free_list = free_[cls];
      if (!free_list.empty()) {
        blob = free_list.front();
        free_list.pop_front();
      } else if (used_ + BlockBytes(cls) <= bytes_) {
        blob = base_ + used_;
        used_ += BlockBytes(cls);
      } else {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "plan arena exhausted (%d bytes, %d live plans): commit, abort or release plans",
            bytes_, live_));
      }
      auto header = reinterpret_cast<PlanBlobHeader*>(blob);
      std::memcpy(PlanValuePtrs(blob), value_ptrs.data(), value_ptrs.size() * sizeof(uint64_t));
      header->count = value_ptrs.size();
      header->magic = kPlanBlobMagic;
      Block& b = blocks_[reinterpret_cast<uint64_t>(blob)];
      b.size_class = cls;
      b.state = BlockState::kLive;
      b.kind = kind;
      b.count = value_ptrs.size();
      b.payload = std::move(payload);
      ++live_;
    }
    return reinterpret_cast<uint64_t>(blob);
  }

  absl::StatusOr<std::unique_ptr<PlanPayload>> Consume(uint64_t plan_ptr, PlanKind expected) {
    std::unique_ptr<PlanPayload> payload;
    {
      MutexLock lock(&mu_);
      absl::StatusOr<Block*> block = FindLive(plan_ptr, expected);
      if (!block.ok()) return block.status();
      Block* b = *block;
      payload = std::move(b->payload);
      b->state = BlockState::kConsumed;
      reinterpret_cast<PlanBlobHeader*>(plan_ptr)->magic = kPlanBlobConsumedMagic;
      free_[b->size_class].push_back(reinterpret_cast<unsigned char*>(plan_ptr));
      --live_;
    }
    return payload;
  }

  absl::StatusOr<PlanView> Peek(uint64_t plan_ptr, std::optional<PlanKind> expected) const {
    MutexLock lock(&mu_);
    absl::StatusOr<Block*> block = FindLive(plan_ptr, expected);
    if (!block.ok()) return block.status();
    return PlanView{(*block)->kind, (*block)->count,
                    PlanValuePtrs(reinterpret_cast<const void*>(plan_ptr))};
  }

  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  size_t live() const {
    MutexLock lock(&mu_);
    return live_;
  }

 private:
  absl::StatusOr<Block*> FindLive(uint64_t plan_ptr, std::optional<PlanKind> expected) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = blocks_.find(plan_ptr);
    if (it == blocks_.end()) {
      return absl::NotFoundError(
          absl::StrFormat("0x%x is not a plan issued by this Fluxon client", plan_ptr));
    }
    Block* b = const_cast<Block*>(&it->second);
    if (b->state == BlockState::kConsumed) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "plan 0x%x was already consumed (a plan is valid for one commit/abort/release)",
          plan_ptr));
    }
    if (expected.has_value() && *expected != b->kind) {
      return absl::InvalidArgumentError(
          absl::StrFormat("plan 0x%x is a %s plan, expected a %s plan", plan_ptr,
                          PlanKindName(b->kind), PlanKindName(*expected)));
    }
    const auto* header = reinterpret_cast<const PlanBlobHeader*>(plan_ptr);
    if (header->magic != kPlanBlobMagic || header->count != b->count) {
      return absl::DataLossError(
          absl::StrFormat("plan 0x%x header was overwritten (magic or count changed)", plan_ptr));
    }
    return b;
  }

  unsigned char* const base_;
  const size_t bytes_;
  mutable Mutex mu_;
  size_t used_ ABSL_GUARDED_BY(mu_) = 0;
  size_t live_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<unsigned char*> free_[kNumSizeClasses] ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Block> blocks_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<PlanRegistry>> PlanRegistry::Create(PlanRegistryOptions options) {
  if (options.arena_bytes < kMinBlockBytes) {
    return absl::InvalidArgumentError("plan arena must be at least 64 bytes");
  }
  const size_t page = 4096;
  const size_t bytes = (options.arena_bytes + page - 1) / page * page;
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("mmap of %d-byte plan arena failed: %s", bytes, std::strerror(errno)));
  }
  return std::unique_ptr<PlanRegistry>(
      new PlanRegistry(std::make_unique<Impl>(static_cast<unsigned char*>(base), bytes)));
}

PlanRegistry::PlanRegistry(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PlanRegistry::~PlanRegistry() = default;

absl::StatusOr<uint64_t> PlanRegistry::Issue(PlanKind kind, std::span<const uint64_t> value_ptrs,
                                             std::unique_ptr<PlanPayload> payload) {
  return impl_->Issue(kind, value_ptrs, std::move(payload));
}
absl::StatusOr<std::unique_ptr<PlanPayload>> PlanRegistry::Consume(uint64_t plan_ptr,
                                                                   PlanKind expected) {
  return impl_->Consume(plan_ptr, expected);
}
absl::StatusOr<PlanView> PlanRegistry::Peek(uint64_t plan_ptr,
                                            std::optional<PlanKind> expected) const {
  return impl_->Peek(plan_ptr, expected);
}
void* PlanRegistry::arena_base() const { return impl_->base(); }
size_t PlanRegistry::arena_bytes() const { return impl_->bytes(); }
size_t PlanRegistry::live_plans() const { return impl_->live(); }

}  // namespace fluxon
