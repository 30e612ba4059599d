// Fuzzes plan-blob validation (src/common/plan_registry.cc): a client hands Fluxon back a
// plan_ptr, which may be anything: a live plan, a consumed one, a plan of the other kind, an
// address inside the arena that is no plan, one outside it, or a real plan whose header (magic,
// count) the caller's kernel overwrote. Peek and Consume must answer every one of them with a
// status, never crash or touch memory outside the arena, and agree with a model of what was
// issued.
//
// Input: a sequence of operations, each an opcode byte followed by its operands.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "fluxon/plan_blob.h"
#include "fuzz/fuzz_check.h"

namespace {

class Input {
 public:
  Input(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool empty() const { return n_ == 0; }
  uint8_t U8() { return n_ ? (--n_, *d_++) : 0; }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(U8()) << (8 * i);
    return v;
  }

 private:
  const uint8_t* d_;
  size_t n_;
};

struct Model {
  fluxon::PlanKind kind;
  uint64_t count;
  bool live;
};

// What FindLive compares: the header a live plan's kernel must leave alone.
bool HeaderIntact(uint64_t addr, const Model& m) {
  const auto* header = reinterpret_cast<const fluxon::PlanBlobHeader*>(addr);
  return header->magic == fluxon::kPlanBlobMagic && header->count == m.count;
}

class Payload : public fluxon::PlanPayload {
 public:
  explicit Payload(uint64_t tag) : tag(tag) {}
  uint64_t tag;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  fluxon::PlanRegistryOptions opts;
  opts.arena_bytes = 64 + (in.U16() % (256 << 10));
  auto reg_or = fluxon::PlanRegistry::Create(opts);
  FUZZ_CHECK(reg_or.ok());
  std::unique_ptr<fluxon::PlanRegistry> reg = std::move(*reg_or);
  auto* const base = static_cast<unsigned char*>(reg->arena_base());
  const size_t arena = reg->arena_bytes();
  const uint64_t lo = reinterpret_cast<uint64_t>(base);
  std::map<uint64_t, Model> issued;  // every plan_ptr ever returned, by address
  std::vector<uint64_t> ptrs;        // the same, in issue order (for picking one)

  auto pick_address = [&]() -> uint64_t {
    switch (in.U8() % 6) {
      case 0:  // a plan issued earlier (live, consumed or reused)
        return ptrs.empty() ? lo : ptrs[in.U16() % ptrs.size()];
      case 1:  // inside the arena, any alignment
        return lo + in.U64() % arena;
      case 2:  // inside a plan (not its start)
        return ptrs.empty() ? lo + 8 : ptrs[in.U16() % ptrs.size()] + 1 + in.U8() % 64;
      case 3:  // just past or before the arena
        return in.U8() & 1 ? lo + arena + in.U8() * 8 : lo - 8 * (1 + in.U8());
      case 4:  // null and small
        return in.U8();
      default:  // anything
        return in.U64();
    }
  };
  auto kind_of = [&]() { return in.U8() & 1 ? fluxon::PlanKind::kGet : fluxon::PlanKind::kPut; };

  for (int ops = 0; ops < 256 && !in.empty(); ++ops) {
    switch (in.U8() % 5) {
      case 0: {  // Issue
        const fluxon::PlanKind kind = kind_of();
        std::vector<uint64_t> values(in.U16() % 600);
        for (uint64_t& v : values) v = in.U64();
        absl::StatusOr<uint64_t> p = reg->Issue(kind, values, std::make_unique<Payload>(ops));
        if (!p.ok()) {
          FUZZ_CHECK(values.empty() || p.status().code() == absl::StatusCode::kResourceExhausted);
          break;
        }
        FUZZ_CHECK(!values.empty());
        FUZZ_CHECK(*p >= lo && *p + fluxon::PlanBlobBytes(values.size()) <= lo + arena);
        FUZZ_CHECK(*p % 8 == 0);
        auto it = issued.find(*p);
        FUZZ_CHECK(it == issued.end() || !it->second.live);  // never two live plans at one address
        issued[*p] = Model{kind, values.size(), true};
        ptrs.push_back(*p);
        const auto* header = reinterpret_cast<const fluxon::PlanBlobHeader*>(*p);
        FUZZ_CHECK(header->magic == fluxon::kPlanBlobMagic && header->count == values.size());
        FUZZ_CHECK(std::memcmp(fluxon::PlanValuePtrs(header), values.data(), values.size() * 8) ==
                   0);
        break;
      }
      case 1: {  // Peek, with or without an expected kind
        const uint64_t addr = pick_address();
        std::optional<fluxon::PlanKind> expected;
        if (in.U8() & 1) expected = kind_of();
        absl::StatusOr<fluxon::PlanView> v = reg->Peek(addr, expected);
        auto it = issued.find(addr);
        const bool valid = it != issued.end() && it->second.live &&
                           HeaderIntact(addr, it->second) &&
                           (!expected || *expected == it->second.kind);
        FUZZ_CHECK(v.ok() == valid);
        if (!v.ok()) {
          if (it == issued.end()) FUZZ_CHECK(v.status().code() == absl::StatusCode::kNotFound);
          break;
        }
        FUZZ_CHECK(!expected || *expected == it->second.kind);
        FUZZ_CHECK(v->kind == it->second.kind && v->count == it->second.count);
        FUZZ_CHECK(reinterpret_cast<uint64_t>(v->value_ptrs) == addr + 16);
        FUZZ_CHECK(addr + fluxon::PlanBlobBytes(v->count) <= lo + arena);
        volatile uint64_t sink = 0;
        for (uint64_t i = 0; i < v->count; ++i) sink = sink + v->value_ptrs[i];
        break;
      }
      case 2: {  // Consume (commit / abort / release_views)
        const uint64_t addr = pick_address();
        const fluxon::PlanKind expected = kind_of();
        auto it = issued.find(addr);
        const bool valid = it != issued.end() && it->second.live &&
                           HeaderIntact(addr, it->second) &&
                           expected == it->second.kind;  // judged before Consume rewrites the magic
        absl::StatusOr<std::unique_ptr<fluxon::PlanPayload>> p = reg->Consume(addr, expected);
        FUZZ_CHECK(p.ok() == valid);
        if (!p.ok()) {
          if (it == issued.end()) {
            FUZZ_CHECK(p.status().code() == absl::StatusCode::kNotFound);
          } else if (!it->second.live) {
            FUZZ_CHECK(p.status().code() == absl::StatusCode::kFailedPrecondition);
          }
          break;
        }
        FUZZ_CHECK(*p != nullptr);
        it->second.live = false;
        const auto* header = reinterpret_cast<const fluxon::PlanBlobHeader*>(addr);
        FUZZ_CHECK(header->magic == fluxon::kPlanBlobConsumedMagic);
        break;
      }
      case 3: {  // a kernel (or a bug) writes into the arena: possibly over a plan's header
        const size_t off = in.U64() % arena;
        const size_t len = std::min<size_t>(1 + in.U8() % 16, arena - off);
        for (size_t i = 0; i < len; ++i) base[off + i] = in.U8();
        break;
      }
      default: {  // restore a plan's header (a corrupted plan that is fixed again is valid)
        if (ptrs.empty()) break;
        const uint64_t addr = ptrs[in.U16() % ptrs.size()];
        Model& m = issued[addr];
        if (!m.live) break;
        auto* header = reinterpret_cast<fluxon::PlanBlobHeader*>(addr);
        header->magic = fluxon::kPlanBlobMagic;
        header->count = m.count;
        break;
      }
    }
  }
  size_t live = 0;
  for (const auto& [addr, m] : issued) live += m.live;
  FUZZ_CHECK(reg->live_plans() == live);
  return 0;
}
