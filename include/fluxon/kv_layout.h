// The byte layout of one KV page inside a Fluxon value, shared by the host launchers and the CUDA
// kernels. Dependency-free so that device code can include it.
//
// A page holds `page_size` tokens of every layer. A *row* is one token's bytes in one buffer of one
// layer (MHA: `H * D * elem_bytes` of K, or of V; MLA: `(kv_lora_rank + rope) * elem_bytes`). The
// layout is dtype-agnostic: only row_bytes matters.
//
// Value layout, layer-major (for layer in 0..L):
//   MHA: [K rows of the page: page_size * row_bytes] [V rows: page_size * row_bytes]
//   MLA: [KV rows of the page: page_size * row_bytes]
// so chunk (layer, buffer) lives at value + (layer * buffers_per_layer + buffer) * chunk_bytes.
//
// Invariants and why:
// - A whole page is one contiguous value (backup writes it in one pass) and one layer of a page is
//   one contiguous run of layer_bytes (layer-wise restore reads 1 run per page per layer; MHA's K
//   and V chunks of a layer are adjacent).
// - Device side (SGLang layer_first pools): buffer `b` of layer `l` is a device array of rows
//   `[device_pages * page_size, row]`; page index `i` owns rows [i * page_size, (i + 1) *
//   page_size), so every (page, layer, buffer) chunk is chunk_bytes contiguous on both sides.
// - chunk_bytes is a multiple of 16 (IsValid), so with 16-byte-aligned buffers and values every
//   chunk can be moved with 16-byte vector accesses.
// - The layout (attention kind, L, page_size, row_bytes) is not stored in the value: the page key
//   namespace must carry it (a page written with one layout is garbage under another).
#pragma once

#include <stdint.h>

#include "fluxon/plan_blob_abi.h"  // FLUXON_HOST_DEVICE

namespace fluxon {

enum class KvAttention : uint32_t {
  kMha = 1,  // separate K and V buffers per layer
  kMla = 2,  // one compressed KV buffer per layer
};

// Every access of the data plane is a 16-byte vector.
inline constexpr uint64_t kKvVectorBytes = 16;

struct KvPageLayout {
  KvAttention attention = KvAttention::kMha;
  uint32_t num_layers = 0;
  uint32_t page_size = 0;  // tokens per page
  uint64_t row_bytes = 0;  // bytes of one token in one buffer of one layer

  FLUXON_HOST_DEVICE constexpr uint32_t buffers_per_layer() const {
    return attention == KvAttention::kMha ? 2u : 1u;
  }
  // Bytes of one (page, layer, buffer) run.
  FLUXON_HOST_DEVICE constexpr uint64_t chunk_bytes() const { return page_size * row_bytes; }
  // Bytes of one layer of one page (K and V for MHA).
  FLUXON_HOST_DEVICE constexpr uint64_t layer_bytes() const {
    return buffers_per_layer() * chunk_bytes();
  }
  FLUXON_HOST_DEVICE constexpr uint64_t chunks_per_value() const {
    return static_cast<uint64_t>(num_layers) * buffers_per_layer();
  }
  // Bytes of one page's value.
  FLUXON_HOST_DEVICE constexpr uint64_t value_bytes() const { return num_layers * layer_bytes(); }
  // Offset of chunk (layer, buffer) inside the value; buffer is 0 (K or KV) or 1 (V).
  FLUXON_HOST_DEVICE constexpr uint64_t chunk_offset(uint32_t layer, uint32_t buffer) const {
    return (static_cast<uint64_t>(layer) * buffers_per_layer() + buffer) * chunk_bytes();
  }
  // Offset of page `page_index`'s rows inside one layer buffer on the device.
  FLUXON_HOST_DEVICE constexpr uint64_t device_page_offset(uint64_t page_index) const {
    return page_index * chunk_bytes();
  }
  FLUXON_HOST_DEVICE constexpr bool IsValid() const {
    return (attention == KvAttention::kMha || attention == KvAttention::kMla) && num_layers > 0 &&
           page_size > 0 && row_bytes > 0 && chunk_bytes() % kKvVectorBytes == 0;
  }
};

// Which way bytes move.
enum class KvDirection : uint32_t {
  kDeviceToValues = 1,  // write (backup): GPU KV buffers -> Fluxon values (put plan)
  kValuesToDevice = 2,  // restore: Fluxon values -> GPU KV buffers (get plan)
};

// Sticky error bits a kernel reports when the plan it finds at run time disagrees with what was
// validated at launch (a plan consumed in between) or a device-resident page index is out of range.
// A kernel that sets a bit moves no bytes for the affected pages (none at all for the plan bits).
enum KvDeviceError : uint32_t {
  kKvDeviceErrorBadMagic = 1u << 0,        // plan magic was not kPlanBlobMagic when the kernel ran
  kKvDeviceErrorCountMismatch = 1u << 1,   // plan count differed from the number of page indices
  kKvDeviceErrorPageOutOfRange = 1u << 2,  // a page index was < 0 or >= device_pages
};

}  // namespace fluxon
