// Replays prompt traces against a HotTier eviction policy and against Belady's offline optimum,
// in pages (every page one cohort of weight 1, as a put without atomic groups makes them).
//
// A trace is a list of accesses, each a prompt of `pages` chained pages of one conversation:
// restore the longest stored prefix (one access to those pages), then write the rest in batches
// of at most `batch_pages` (one chain per batch, as the owner admits a put batch), evicting
// first if the capacity would be exceeded. The hit rate counts restored pages over requested.
// Used by bench/eviction_policy_bench and tests/unit/hot_tier_test.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "owner/hot_tier.h"

namespace fluxon::eviction_replay {

struct Access {
  uint32_t conversation;
  uint32_t pages;
};

// SGLang's multi-turn pattern: every round, each conversation in turn sends its whole context
// plus `pages_per_turn` new pages.
inline std::vector<Access> MultiTurn(uint32_t conversations, uint32_t turns, uint32_t first_pages,
                                     uint32_t pages_per_turn) {
  std::vector<Access> out;
  for (uint32_t t = 0; t < turns; ++t) {
    for (uint32_t c = 0; c < conversations; ++c)
      out.push_back({c, first_pages + t * pages_per_turn});
  }
  return out;
}

// Conversations picked with Zipf(1) weights; each pick extends that conversation by a turn.
inline std::vector<Access> ZipfTurns(uint32_t conversations, uint32_t accesses,
                                     uint32_t first_pages, uint32_t pages_per_turn,
                                     uint32_t max_turns, uint64_t seed) {
  std::vector<double> w(conversations);
  for (uint32_t i = 0; i < conversations; ++i) w[i] = 1.0 / (i + 1);
  std::discrete_distribution<uint32_t> pick(w.begin(), w.end());
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> turns(conversations, 0);
  std::vector<Access> out;
  for (uint32_t i = 0; i < accesses; ++i) {
    const uint32_t c = pick(rng);
    out.push_back({c, first_pages + turns[c] * pages_per_turn});
    turns[c] = std::min(turns[c] + 1, max_turns);
  }
  return out;
}

struct Result {
  uint64_t requested = 0;
  uint64_t hits = 0;
  uint64_t evictions = 0;
  double hit_rate() const { return requested ? 100.0 * hits / requested : 0; }
};

using PageKey = std::pair<uint32_t, uint32_t>;  // (conversation, page index)

// `parent_hint`: each batch names the page before it (as a client passing the parent key does).
// Every restore is two accesses, as SGLang's are: the existence probe, then the read.
template <typename Policy>
Result Replay(const std::vector<Access>& trace, uint64_t capacity_pages, uint32_t batch_pages,
              bool parent_hint = true) {
  HotTier<Policy> tier;
  std::map<PageKey, uint64_t> stored;  // page -> cohort id
  absl::flat_hash_map<uint64_t, PageKey> page_of;
  uint64_t next_id = 1;
  Result r;
  for (const Access& a : trace) {
    r.requested += a.pages;
    uint32_t prefix = 0;
    std::vector<uint64_t> touched;
    while (prefix < a.pages && stored.count({a.conversation, prefix})) ++prefix;
    for (uint32_t i = prefix; i-- > 0;) touched.push_back(stored.at({a.conversation, i}));
    if (!touched.empty()) {
      tier.Touch(touched);  // batch_exists
      tier.Touch(touched);  // batch_get
    }
    r.hits += prefix;
    for (uint32_t i = prefix; i < a.pages; i += batch_pages) {
      const uint32_t n = std::min(batch_pages, a.pages - i);
      if (stored.size() + n > capacity_pages) {
        for (Cohort& v : tier.TakeVictims(stored.size() + n - capacity_pages)) {
          stored.erase(page_of.at(v.id));
          page_of.erase(v.id);
          ++r.evictions;
        }
      }
      std::vector<Cohort> batch;
      for (uint32_t j = i; j < i + n && stored.size() + batch.size() < capacity_pages; ++j) {
        Cohort c;
        c.id = next_id++;
        c.weight = 1;
        batch.push_back(c);
        stored[{a.conversation, j}] = c.id;
        page_of[c.id] = {a.conversation, j};
      }
      uint64_t parent = 0;
      if (parent_hint && i > 0) {
        auto p = stored.find({a.conversation, i - 1});
        if (p != stored.end()) parent = p->second;
      }
      tier.AdmitChain(std::move(batch), parent);
    }
  }
  return r;
}

// Belady's optimum for prefix restores: on overflow, drop the stored page whose next request is
// farthest in the future (the deepest page first on ties, which keeps prefixes whole).
inline Result ReplayBelady(const std::vector<Access>& trace, uint64_t capacity_pages) {
  constexpr uint64_t kNever = ~uint64_t{0};
  // next_use[t][page]: the next access after t that requests the page.
  std::map<uint32_t, std::vector<uint64_t>> uses;  // conversation -> access times
  for (uint64_t t = 0; t < trace.size(); ++t) uses[trace[t].conversation].push_back(t);
  auto next_use = [&](uint32_t conv, uint32_t page, uint64_t t) {
    const auto& u = uses[conv];
    for (auto it = std::upper_bound(u.begin(), u.end(), t); it != u.end(); ++it) {
      if (trace[*it].pages > page) return *it;
    }
    return kNever;
  };
  std::set<std::tuple<uint64_t, uint32_t, uint32_t>> by_next;  // (next use, page, conversation)
  std::map<PageKey, uint64_t> stored;                          // page -> its key in by_next
  Result r;
  for (uint64_t t = 0; t < trace.size(); ++t) {
    const Access& a = trace[t];
    r.requested += a.pages;
    uint32_t prefix = 0;
    while (prefix < a.pages && stored.count({a.conversation, prefix})) ++prefix;
    r.hits += prefix;
    for (uint32_t i = 0; i < prefix; ++i) {  // re-key the restored pages by their next use
      auto& nu = stored[{a.conversation, i}];
      by_next.erase({nu, i, a.conversation});
      nu = next_use(a.conversation, i, t);
      by_next.insert({nu, i, a.conversation});
    }
    for (uint32_t i = prefix; i < a.pages; ++i) {
      const uint64_t nu = next_use(a.conversation, i, t);
      if (stored.size() >= capacity_pages) {
        auto victim = std::prev(by_next.end());
        if (std::make_tuple(nu, i, a.conversation) > *victim) continue;  // not worth storing
        stored.erase({std::get<2>(*victim), std::get<1>(*victim)});
        by_next.erase(victim);
        ++r.evictions;
      }
      stored[{a.conversation, i}] = nu;
      by_next.insert({nu, i, a.conversation});
    }
  }
  return r;
}

}  // namespace fluxon::eviction_replay
