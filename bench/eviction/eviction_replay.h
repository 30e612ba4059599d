// Replays prompt traces against a HotTier eviction policy and against Belady's offline optimum,
// in pages (every page one cohort of weight 1, as a put without atomic groups makes them).
//
// A trace is a list of prompts, each a sequence of page ids; a page id stands for a chained key
// (the same id is the same key, and a page's id determines every page before it), so two prompts
// with the same system prompt share its pages. Each access restores the longest stored prefix
// (two accesses to those pages, as SGLang's are: the existence probe, then the read), then writes
// the missing pages in batches of at most `batch_pages` (one chain per batch, naming the page
// before it as the client's parent key does), evicting first when the capacity would be exceeded.
// The hit rate counts restored pages over requested pages. The working set is the number of
// distinct pages of the trace. Used by bench/eviction_policy_bench and tests/unit/hot_tier_test.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "owner/hot_tier.h"

namespace fluxon::eviction_replay {

struct Trace {
  std::string name;
  std::vector<uint32_t> pages;   // every prompt's page ids, concatenated
  std::vector<size_t> start{0};  // prompt i is pages[start[i], start[i + 1])
  uint32_t distinct = 0;         // page ids are 0 .. distinct - 1: the working set
  size_t size() const { return start.size() - 1; }
  size_t length(size_t i) const { return start[i + 1] - start[i]; }
  const uint32_t* prompt(size_t i) const { return pages.data() + start[i]; }
  void Add(const std::vector<uint32_t>& prompt) {
    pages.insert(pages.end(), prompt.begin(), prompt.end());
    start.push_back(pages.size());
  }
};

// Shapes of prompts: a system prompt of `system_pages`, a first turn of `first_pages` after it,
// `pages_per_turn` more every turn.
struct Shape {
  uint32_t system_pages = 8;
  uint32_t first_pages = 8;
  uint32_t pages_per_turn = 4;
};

namespace internal {

struct Ids {
  uint32_t next = 0;
  std::vector<uint32_t> Take(uint32_t n) {
    std::vector<uint32_t> out(n);
    for (uint32_t& id : out) id = next++;
    return out;
  }
};

inline std::vector<double> ZipfWeights(uint32_t n, double alpha) {
  std::vector<double> w(n);
  for (uint32_t i = 0; i < n; ++i) w[i] = 1.0 / std::pow(i + 1.0, alpha);
  return w;
}

// Conversations picked with Zipf(alpha) (uniform for alpha 0), each with a system prompt picked
// with Zipf(alpha) among `system_prompts` when it starts; after `max_turns` turns it restarts as
// a new conversation (new pages).
class ZipfConversations {
 public:
  ZipfConversations(Ids* ids, uint32_t conversations, uint32_t system_prompts, double alpha,
                    uint32_t max_turns, Shape shape, uint64_t seed)
      : ids_(ids),
        shape_(shape),
        max_turns_(max_turns),
        rng_(seed),
        ctx_(conversations),
        turns_(conversations, 0) {
    auto cw = ZipfWeights(conversations, alpha);
    auto sw = ZipfWeights(system_prompts, alpha);
    pick_conv_ = std::discrete_distribution<uint32_t>(cw.begin(), cw.end());
    pick_sys_ = std::discrete_distribution<uint32_t>(sw.begin(), sw.end());
    for (uint32_t s = 0; s < system_prompts; ++s) sys_.push_back(ids_->Take(shape.system_pages));
  }
  std::vector<uint32_t> Next() {
    const uint32_t c = pick_conv_(rng_);
    std::vector<uint32_t>& ctx = ctx_[c];
    if (turns_[c] == max_turns_) turns_[c] = 0;  // restart: a new conversation
    if (turns_[c] == 0) {
      ctx = sys_[pick_sys_(rng_)];
      auto first = ids_->Take(shape_.first_pages);
      ctx.insert(ctx.end(), first.begin(), first.end());
    } else {
      auto more = ids_->Take(shape_.pages_per_turn);
      ctx.insert(ctx.end(), more.begin(), more.end());
    }
    ++turns_[c];
    return ctx;
  }

 private:
  Ids* ids_;
  Shape shape_;
  uint32_t max_turns_;
  std::mt19937_64 rng_;
  std::discrete_distribution<uint32_t> pick_conv_, pick_sys_;
  std::vector<std::vector<uint32_t>> sys_, ctx_;
  std::vector<uint32_t> turns_;
};

// Round-barrier multi-turn: every round each conversation in turn sends its whole context plus a
// turn; conversation c uses system prompt c % system_prompts.
inline std::vector<std::vector<uint32_t>> Cyclic(Ids* ids, uint32_t conversations, uint32_t rounds,
                                                 uint32_t system_prompts, Shape shape) {
  std::vector<std::vector<uint32_t>> sys, ctx(conversations), out;
  for (uint32_t s = 0; s < system_prompts; ++s) sys.push_back(ids->Take(shape.system_pages));
  for (uint32_t r = 0; r < rounds; ++r) {
    for (uint32_t c = 0; c < conversations; ++c) {
      if (r == 0) ctx[c] = sys[c % system_prompts];
      auto more = ids->Take(r == 0 ? shape.first_pages : shape.pages_per_turn);
      ctx[c].insert(ctx[c].end(), more.begin(), more.end());
      out.push_back(ctx[c]);
    }
  }
  return out;
}

inline Trace Finish(std::string name, const std::vector<std::vector<uint32_t>>& prompts,
                    const Ids& ids) {
  Trace t;
  t.name = std::move(name);
  for (const auto& p : prompts) t.Add(p);
  t.distinct = ids.next;
  return t;
}

}  // namespace internal

// The acceptance traces. Shapes: system prompts of 8 pages, first turns of 8, 4 more
// per turn.
inline Trace CyclicMultiTurn(uint32_t conversations = 96, uint32_t rounds = 8,
                             uint32_t system_prompts = 4, Shape shape = {}) {
  internal::Ids ids;
  return internal::Finish(
      "cyclic", internal::Cyclic(&ids, conversations, rounds, system_prompts, shape), ids);
}

// 256 conversations and 8 system prompts picked with Zipf(alpha), up to 10 turns then restart.
inline Trace ZipfMultiTurn(double alpha, uint32_t accesses = 4000, uint32_t conversations = 256,
                           uint32_t system_prompts = 8, uint64_t seed = 1, Shape shape = {}) {
  internal::Ids ids;
  internal::ZipfConversations z(&ids, conversations, system_prompts, alpha, 10, shape, seed);
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t i = 0; i < accesses; ++i) prompts.push_back(z.Next());
  char name[32];
  std::snprintf(name, sizeof(name), "zipf%.1f", alpha);
  return internal::Finish(name, prompts, ids);
}

// The two interleaved: 48 round-barrier conversations (8 rounds) and Zipf(1.1) over 128 others,
// one access of each in turn.
inline Trace Mix(uint64_t seed = 2, Shape shape = {}) {
  internal::Ids ids;
  auto cyclic = internal::Cyclic(&ids, 48, 8, 4, shape);
  internal::ZipfConversations z(&ids, 128, 8, 1.1, 10, shape, seed);
  std::vector<std::vector<uint32_t>> prompts;
  for (const auto& p : cyclic) {
    prompts.push_back(p);
    prompts.push_back(z.Next());
  }
  return internal::Finish("mix", prompts, ids);
}

// A hot set (Zipf(1.1) over 256 conversations, 8 system prompts, as zipf1.1) with a one-hit
// prompt of `scan_pages` new pages after every `hot_per_scan` hot accesses.
inline Trace Scan(uint32_t accesses = 4000, uint32_t hot_per_scan = 9, uint32_t scan_pages = 48,
                  uint64_t seed = 3, Shape shape = {}) {
  internal::Ids ids;
  internal::ZipfConversations z(&ids, 256, 8, 1.1, 10, shape, seed);
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t i = 0; i < accesses; ++i) {
    prompts.push_back((i + 1) % (hot_per_scan + 1) == 0 ? ids.Take(scan_pages) : z.Next());
  }
  return internal::Finish("scan", prompts, ids);
}

// Diurnal shift: Zipf(1.1) over 128 conversations and 8 system prompts, then, halfway, over 128
// other conversations with 8 other system prompts.
inline Trace Diurnal(uint32_t accesses = 4000, uint64_t seed = 4, Shape shape = {}) {
  internal::Ids ids;
  internal::ZipfConversations day(&ids, 128, 8, 1.1, 10, shape, seed);
  internal::ZipfConversations night(&ids, 128, 8, 1.1, 10, shape, seed + 1);
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t i = 0; i < accesses; ++i)
    prompts.push_back(i < accesses / 2 ? day.Next() : night.Next());
  return internal::Finish("diurnal", prompts, ids);
}

// The multi-turn workload of bench/mooncake_compare.py (--multiturn-capacities): `sessions`
// conversations without a shared system prompt, round barrier, a first turn of `first_pages`,
// `pages_per_turn` more every turn.
inline Trace Sessions(uint32_t sessions = 16, uint32_t turns = 4, uint32_t first_pages = 16,
                      uint32_t pages_per_turn = 8) {
  internal::Ids ids;
  std::vector<std::vector<uint32_t>> ctx(sessions), prompts;
  for (uint32_t r = 0; r < turns; ++r) {
    for (uint32_t s = 0; s < sessions; ++s) {
      auto more = ids.Take(r == 0 ? first_pages : pages_per_turn);
      ctx[s].insert(ctx[s].end(), more.begin(), more.end());
      prompts.push_back(ctx[s]);
    }
  }
  return internal::Finish("sessions", prompts, ids);
}

struct Result {
  uint64_t requested = 0;
  uint64_t hits = 0;
  uint64_t evictions = 0;
  uint64_t policy_ns = 0;  // time spent in the HotTier (admit, touch, take victims)
  uint64_t accesses = 0;
  double hit_rate() const { return requested ? 100.0 * hits / requested : 0; }
  double ns_per_access() const { return accesses ? static_cast<double>(policy_ns) / accesses : 0; }
};

// `parent_hint`: each batch names the page before it (as a client passing the parent key does).
template <typename Policy>
Result Replay(const Trace& trace, uint64_t capacity_pages, uint32_t batch_pages = 128,
              bool parent_hint = true, HotTier<Policy>* tier_out = nullptr) {
  using Clock = std::chrono::steady_clock;
  HotTier<Policy> own_tier;
  HotTier<Policy>& tier = tier_out ? *tier_out : own_tier;
  std::vector<uint64_t> stored(trace.distinct, 0);  // page -> cohort id (0: not stored)
  std::vector<uint32_t> page_of(1, 0);              // cohort id -> page
  uint64_t count = 0;
  Result r;
  std::vector<uint64_t> touched;
  std::vector<Cohort> batch;
  uint64_t ns = 0;
  for (size_t t = 0; t < trace.size(); ++t) {
    const uint32_t* p = trace.prompt(t);
    const uint32_t len = static_cast<uint32_t>(trace.length(t));
    r.requested += len;
    uint32_t prefix = 0;
    while (prefix < len && stored[p[prefix]] != 0) ++prefix;
    touched.clear();
    for (uint32_t i = prefix; i-- > 0;) touched.push_back(stored[p[i]]);
    auto t0 = Clock::now();
    if (!touched.empty()) {
      tier.Touch(touched);  // batch_exists
      tier.Touch(touched);  // batch_get
    }
    ns += (Clock::now() - t0).count();
    r.hits += prefix;
    uint32_t j = prefix;
    while (j < len) {
      if (stored[p[j]] != 0) {  // stored already (past a missing page): kept as it is
        ++j;
        continue;
      }
      uint32_t n = 0;
      while (j + n < len && n < batch_pages && stored[p[j + n]] == 0) ++n;
      t0 = Clock::now();
      if (count + n > capacity_pages) {
        for (Cohort& v : tier.TakeVictims(count + n - capacity_pages)) {
          stored[page_of[v.id]] = 0;
          --count;
          ++r.evictions;
        }
      }
      ns += (Clock::now() - t0).count();
      batch.clear();
      for (uint32_t i = j; i < j + n && count < capacity_pages; ++i) {
        Cohort c;
        c.id = page_of.size();
        c.weight = 1;
        c.fingerprint = p[i] + 1;
        page_of.push_back(p[i]);
        stored[p[i]] = c.id;
        ++count;
        batch.push_back(std::move(c));
      }
      const uint64_t parent = parent_hint && j > 0 ? stored[p[j - 1]] : 0;
      t0 = Clock::now();
      tier.AdmitChain(std::move(batch), parent);
      ns += (Clock::now() - t0).count();
      batch = {};
      j += n;
    }
  }
  r.policy_ns = ns;
  r.accesses = trace.size();
  return r;
}

// Belady's optimum for prefix restores: on overflow, drop the stored page whose next request is
// farthest in the future (the deepest page first on ties, which keeps prefixes whole), or do not
// store the new page when it is the one needed last.
inline Result ReplayBelady(const Trace& trace, uint64_t capacity_pages) {
  constexpr uint64_t kNever = ~uint64_t{0};
  const uint32_t n = trace.distinct;
  // uses[off[p] .. off[p + 1]): the accesses that request page p, in order; depth: its index.
  std::vector<uint64_t> off(n + 1, 0), uses(trace.pages.size());
  std::vector<uint32_t> depth(n, 0), cursor(n, 0);
  for (uint32_t id : trace.pages) ++off[id + 1];
  for (uint32_t i = 0; i < n; ++i) off[i + 1] += off[i];
  {
    std::vector<uint64_t> fill(off.begin(), off.end() - 1);
    for (size_t t = 0; t < trace.size(); ++t) {
      for (size_t i = 0; i < trace.length(t); ++i) {
        const uint32_t id = trace.prompt(t)[i];
        uses[fill[id]++] = t;
        depth[id] = static_cast<uint32_t>(i);
      }
    }
  }
  auto next_use = [&](uint32_t id) {  // after the current access (cursor already advanced)
    const uint64_t k = off[id] + cursor[id];
    return k < off[id + 1] ? uses[k] : kNever;
  };
  std::set<std::tuple<uint64_t, uint32_t, uint32_t>> by_next;  // (next use, depth, page)
  std::vector<uint64_t> key(n, 0);
  std::vector<bool> stored(n, false);
  uint64_t count = 0;
  Result r;
  for (size_t t = 0; t < trace.size(); ++t) {
    const uint32_t* p = trace.prompt(t);
    const uint32_t len = static_cast<uint32_t>(trace.length(t));
    r.requested += len;
    for (uint32_t i = 0; i < len; ++i) ++cursor[p[i]];
    uint32_t prefix = 0;
    while (prefix < len && stored[p[prefix]]) ++prefix;
    r.hits += prefix;
    for (uint32_t i = 0; i < len; ++i) {
      const uint32_t id = p[i];
      const uint64_t nu = next_use(id);
      if (stored[id]) {  // re-key by its next use
        by_next.erase({key[id], depth[id], id});
        key[id] = nu;
        by_next.insert({nu, depth[id], id});
        continue;
      }
      if (count >= capacity_pages) {
        auto victim = std::prev(by_next.end());
        if (std::make_tuple(nu, depth[id], id) > *victim) continue;  // not worth storing
        stored[std::get<2>(*victim)] = false;
        by_next.erase(victim);
        --count;
        ++r.evictions;
      }
      stored[id] = true;
      key[id] = nu;
      by_next.insert({nu, depth[id], id});
      ++count;
    }
  }
  r.accesses = trace.size();
  return r;
}

}  // namespace fluxon::eviction_replay
