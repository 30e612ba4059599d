// The plan blob ABI shared by Fluxon and the native (CUDA) kernels. Dependency-free so that device
// code can include it.
//
// A plan blob is one contiguous host buffer; plan_ptr is its address:
//
//   uint64_t magic;              // kPlanBlobMagic
//   uint64_t count;              // number of values (pages) in the batch
//   uint64_t value_ptrs[count];  // absolute, process-local start address of each value
//
// value_len is deliberately not in the blob: the kernel receives the KV layout as its own
// arguments. The blob keeps page_count * layer_count loops out of the control path; kernels read
// the pointer table directly, so blobs live in memory the caller can cudaHostRegister.
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define FLUXON_HOST_DEVICE __host__ __device__
#else
#define FLUXON_HOST_DEVICE
#endif

namespace fluxon {

// The ASCII bytes "FLUXPLN1" in little-endian memory order.
inline constexpr uint64_t kPlanBlobMagic = 0x314E4C5058554C46ULL;
// Written over the magic when a plan is consumed, so a kernel handed a stale plan_ptr fails its
// magic check instead of reading addresses that may already be reused.
inline constexpr uint64_t kPlanBlobConsumedMagic = 0x44454D55534E4F43ULL;  // "CONSUMED"

struct PlanBlobHeader {
  uint64_t magic;
  uint64_t count;
};

static_assert(sizeof(PlanBlobHeader) == 16, "plan blob header is two uint64 words");
static_assert(offsetof(PlanBlobHeader, magic) == 0, "magic is word 0");
static_assert(offsetof(PlanBlobHeader, count) == 8, "count is word 1");
static_assert(alignof(PlanBlobHeader) == 8, "plan blob is 8-byte aligned");

inline constexpr size_t kPlanBlobValuePtrsOffset = sizeof(PlanBlobHeader);

FLUXON_HOST_DEVICE constexpr size_t PlanBlobBytes(uint64_t count) {
  return kPlanBlobValuePtrsOffset + count * sizeof(uint64_t);
}

FLUXON_HOST_DEVICE inline const uint64_t* PlanValuePtrs(const void* blob) {
  return reinterpret_cast<const uint64_t*>(static_cast<const unsigned char*>(blob) +
                                           kPlanBlobValuePtrsOffset);
}

FLUXON_HOST_DEVICE inline uint64_t* PlanValuePtrs(void* blob) {
  return reinterpret_cast<uint64_t*>(static_cast<unsigned char*>(blob) + kPlanBlobValuePtrsOffset);
}

}  // namespace fluxon
