#include "holder/holder.h"

#include "absl/strings/str_format.h"
#include "fluxon/status.h"

namespace fluxon {

HolderRef HolderRef::Adopt(SlotPool* pool, const SlotRef& slot, std::string key, uint64_t put_id,
                           uint64_t len) {
  auto* info = new MemoryInfo{std::move(key),
                              put_id,
                              pool->OffsetOf(slot),
                              len,
                              pool->segment()->node_id(),
                              pool->segment()->generation(),
                              slot};
  HolderRef ref;
  ref.info_ = std::shared_ptr<const MemoryInfo>(info, [pool](const MemoryInfo* mi) {
    // The holder reference was taken when this MemoryInfo was made; a failure here means the
    // slot's accounting is broken, which the pool's consistency checks report.
    (void)pool->ReleaseHolder(mi->slot);
    delete mi;
  });
  return ref;
}

namespace {
absl::Status CheckLen(SlotPool* pool, const SlotRef& slot, uint64_t len) {
  if (len == 0 || len > pool->SlotSizeOf(slot)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "value length %d does not fit the %d-byte slot", len, pool->SlotSizeOf(slot)));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<HolderRef> HolderRef::CommitLocalVisible(SlotPool* pool, const SlotRef& slot,
                                                        std::string key, uint64_t put_id,
                                                        uint64_t len) {
  FLUXON_RETURN_IF_ERROR(pool->StateOf(slot).status());
  FLUXON_RETURN_IF_ERROR(CheckLen(pool, slot, len));
  FLUXON_RETURN_IF_ERROR(pool->CommitLocalVisible(slot));
  return Adopt(pool, slot, std::move(key), put_id, len);
}

absl::StatusOr<HolderRef> HolderRef::CommitHidden(SlotPool* pool, const SlotRef& slot,
                                                  std::string key, uint64_t put_id, uint64_t len) {
  FLUXON_RETURN_IF_ERROR(pool->StateOf(slot).status());
  FLUXON_RETURN_IF_ERROR(CheckLen(pool, slot, len));
  FLUXON_RETURN_IF_ERROR(pool->CommitHidden(slot));
  return Adopt(pool, slot, std::move(key), put_id, len);
}

absl::StatusOr<HolderRef> HolderRef::Acquire(SlotPool* pool, const SlotRef& slot, std::string key,
                                             uint64_t put_id, uint64_t len) {
  FLUXON_RETURN_IF_ERROR(pool->StateOf(slot).status());
  FLUXON_RETURN_IF_ERROR(CheckLen(pool, slot, len));
  FLUXON_RETURN_IF_ERROR(pool->AcquireHolder(slot));
  return Adopt(pool, slot, std::move(key), put_id, len);
}

uint64_t HolderRegistry::Export(HolderRef holder) {
  const uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
  table_.InsertIfAbsent(id, std::move(holder));
  return id;
}

absl::StatusOr<HolderRef> HolderRegistry::Get(uint64_t id) const {
  std::optional<HolderRef> h = table_.Get(id);
  if (!h) return absl::NotFoundError(absl::StrFormat("holder %d is not live", id));
  return *h;
}

absl::Status HolderRegistry::Release(uint64_t id, uint64_t generation) {
  if (generation != generation_) {
    return absl::FailedPreconditionError(
        absl::StrFormat("holder %d names owner generation %d; this owner is generation %d", id,
                        generation, generation_));
  }
  if (id == 0) return absl::InvalidArgumentError("holder id 0 is never issued");
  std::optional<HolderRef> h = table_.Take(id);
  if (!h) return absl::NotFoundError(absl::StrFormat("holder %d is not live", id));
  h->reset();  // dropped outside the shard lock
  return absl::OkStatus();
}

}  // namespace fluxon
