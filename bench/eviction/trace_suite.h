// The generalisation suite's traces (bench/eviction_suite.cc): seeded generator families, each
// swept over its parameters, so a policy is measured on many traces it was not tuned on rather
// than on the handful of acceptance traces in eviction_replay.h.
//
// Families (every random choice comes from the case's seed; the same case is the same trace):
//   barrier  round-barrier multi-turn: `conversations` conversations, `rounds` rounds; every round
//            each conversation sends its whole history plus a turn of U[turn_lo, turn_hi] new
//            pages (a first turn of U[4, 16]), after every other conversation of its group
//            (shuffled within the round); `system` shared system prompts of 8 pages (0: none),
//            assigned at random; `parallel` independent groups of conversations, each with its own
//            barrier, whose prompts interleave at random (several jobs on one cache).
//   zipf     conversations picked with Zipf(alpha), each restarting after U[4, 12] turns, 8 system
//            prompts picked with Zipf(alpha); no barrier.
//   docs     a hot set (Zipf(1.1) conversations) with a one-off document of `doc_pages` new pages
//            after every `hot_per_doc` hot accesses (retrieval results, uploads, scans).
//   diurnal  Zipf(alpha) over `conversations`, the whole population (conversations and system
//            prompts) replaced `shifts` times at even intervals.
//   mix      a barrier group of 48 conversations interleaved with Zipf(alpha) traffic, `zipf_per`
//            Zipf accesses per barrier access.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "eviction/eviction_replay.h"

namespace fluxon::eviction_replay::suite {

// One trace of the suite: its family, its parameters (for the tables) and its seed.
struct Case {
  std::string family;
  std::string params;
  uint64_t seed = 0;
  Trace trace;
};

namespace internal {

using eviction_replay::internal::Ids;

inline uint32_t Uniform(std::mt19937_64& rng, uint32_t lo, uint32_t hi) {
  return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
}

// One barrier group's prompts, round by round (each round shuffled).
inline std::vector<std::vector<uint32_t>> BarrierGroup(Ids* ids, std::mt19937_64& rng,
                                                       uint32_t conversations, uint32_t rounds,
                                                       uint32_t turn_lo, uint32_t turn_hi,
                                                       uint32_t system_prompts) {
  std::vector<std::vector<uint32_t>> sys, ctx(conversations), out;
  for (uint32_t s = 0; s < system_prompts; ++s) sys.push_back(ids->Take(8));
  std::vector<uint32_t> order(conversations);
  for (uint32_t c = 0; c < conversations; ++c) order[c] = c;
  for (uint32_t r = 0; r < rounds; ++r) {
    std::shuffle(order.begin(), order.end(), rng);
    for (uint32_t c : order) {
      if (r == 0 && system_prompts > 0) ctx[c] = sys[Uniform(rng, 0, system_prompts - 1)];
      auto more = ids->Take(r == 0 ? Uniform(rng, 4, 16) : Uniform(rng, turn_lo, turn_hi));
      ctx[c].insert(ctx[c].end(), more.begin(), more.end());
      out.push_back(ctx[c]);
    }
  }
  return out;
}

// Interleaves streams at random, each keeping its own order.
inline std::vector<std::vector<uint32_t>> Interleave(
    std::vector<std::vector<std::vector<uint32_t>>> streams, std::mt19937_64& rng) {
  std::vector<size_t> next(streams.size(), 0);
  std::vector<uint32_t> live;
  for (uint32_t i = 0; i < streams.size(); ++i) {
    if (!streams[i].empty()) live.push_back(i);
  }
  std::vector<std::vector<uint32_t>> out;
  while (!live.empty()) {
    const uint32_t k = Uniform(rng, 0, static_cast<uint32_t>(live.size()) - 1);
    const uint32_t s = live[k];
    out.push_back(std::move(streams[s][next[s]++]));
    if (next[s] == streams[s].size()) {
      live[k] = live.back();
      live.pop_back();
    }
  }
  return out;
}

// Zipf conversations that restart after U[4, 12] turns (ZipfConversations with a random length).
class ZipfTraffic {
 public:
  ZipfTraffic(Ids* ids, uint32_t conversations, double alpha, std::mt19937_64& rng)
      : ids_(ids), rng_(rng), ctx_(conversations), left_(conversations, 0) {
    auto cw = eviction_replay::internal::ZipfWeights(conversations, alpha);
    auto sw = eviction_replay::internal::ZipfWeights(8, alpha);
    pick_conv_ = std::discrete_distribution<uint32_t>(cw.begin(), cw.end());
    pick_sys_ = std::discrete_distribution<uint32_t>(sw.begin(), sw.end());
    for (int s = 0; s < 8; ++s) sys_.push_back(ids_->Take(8));
  }
  std::vector<uint32_t> Next() {
    const uint32_t c = pick_conv_(rng_);
    std::vector<uint32_t>& ctx = ctx_[c];
    if (left_[c] == 0) {  // a new conversation
      left_[c] = Uniform(rng_, 4, 12);
      ctx = sys_[pick_sys_(rng_)];
      auto first = ids_->Take(Uniform(rng_, 4, 16));
      ctx.insert(ctx.end(), first.begin(), first.end());
    } else {
      auto more = ids_->Take(Uniform(rng_, 2, 6));
      ctx.insert(ctx.end(), more.begin(), more.end());
    }
    --left_[c];
    return ctx;
  }

 private:
  Ids* ids_;
  std::mt19937_64& rng_;
  std::discrete_distribution<uint32_t> pick_conv_, pick_sys_;
  std::vector<std::vector<uint32_t>> sys_, ctx_;
  std::vector<uint32_t> left_;
};

inline Case Make(std::string family, std::string params, uint64_t seed,
                 const std::vector<std::vector<uint32_t>>& prompts, const Ids& ids) {
  Case c;
  c.family = std::move(family);
  c.params = std::move(params);
  c.seed = seed;
  c.trace = eviction_replay::internal::Finish(c.family + " " + c.params, prompts, ids);
  return c;
}

}  // namespace internal

inline Case Barrier(uint32_t conversations, uint32_t rounds, uint32_t turn_lo, uint32_t turn_hi,
                    uint32_t system_prompts, uint32_t parallel, uint64_t seed) {
  internal::Ids ids;
  std::mt19937_64 rng(seed * 1000003 + 11);
  std::vector<std::vector<std::vector<uint32_t>>> groups;
  for (uint32_t g = 0; g < parallel; ++g) {
    groups.push_back(internal::BarrierGroup(&ids, rng, conversations / parallel, rounds, turn_lo,
                                            turn_hi, system_prompts));
  }
  char p[96];
  std::snprintf(p, sizeof(p), "conv=%u rounds=%u turn=%u-%u system=%u parallel=%u", conversations,
                rounds, turn_lo, turn_hi, system_prompts, parallel);
  return internal::Make("barrier", p, seed, internal::Interleave(std::move(groups), rng), ids);
}

inline Case Zipf(double alpha, uint32_t conversations, uint32_t accesses, uint64_t seed) {
  internal::Ids ids;
  std::mt19937_64 rng(seed * 1000003 + 23);
  internal::ZipfTraffic z(&ids, conversations, alpha, rng);
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t i = 0; i < accesses; ++i) prompts.push_back(z.Next());
  char p[64];
  std::snprintf(p, sizeof(p), "alpha=%.1f conv=%u", alpha, conversations);
  return internal::Make("zipf", p, seed, prompts, ids);
}

inline Case Docs(uint32_t hot_per_doc, uint32_t doc_pages, uint32_t accesses, uint64_t seed) {
  internal::Ids ids;
  std::mt19937_64 rng(seed * 1000003 + 37);
  internal::ZipfTraffic z(&ids, 256, 1.1, rng);
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t i = 0; i < accesses; ++i) {
    prompts.push_back((i + 1) % (hot_per_doc + 1) == 0 ? ids.Take(doc_pages) : z.Next());
  }
  char p[64];
  std::snprintf(p, sizeof(p), "hot_per_doc=%u doc_pages=%u", hot_per_doc, doc_pages);
  return internal::Make("docs", p, seed, prompts, ids);
}

inline Case Diurnal(double alpha, uint32_t shifts, uint32_t accesses, uint64_t seed) {
  internal::Ids ids;
  std::mt19937_64 rng(seed * 1000003 + 41);
  std::vector<std::vector<uint32_t>> prompts;
  const uint32_t period = accesses / (shifts + 1);
  for (uint32_t phase = 0; phase <= shifts; ++phase) {
    internal::ZipfTraffic z(&ids, 128, alpha, rng);  // a new population: new pages throughout
    for (uint32_t i = 0; i < period; ++i) prompts.push_back(z.Next());
  }
  char p[64];
  std::snprintf(p, sizeof(p), "alpha=%.1f shifts=%u", alpha, shifts);
  return internal::Make("diurnal", p, seed, prompts, ids);
}

inline Case Mix(double alpha, uint32_t zipf_per, uint64_t seed) {
  internal::Ids ids;
  std::mt19937_64 rng(seed * 1000003 + 53);
  auto barrier = internal::BarrierGroup(&ids, rng, 48, 8, 2, 6, 4);
  internal::ZipfTraffic z(&ids, 128, alpha, rng);
  std::vector<std::vector<uint32_t>> prompts;
  for (auto& b : barrier) {
    prompts.push_back(std::move(b));
    for (uint32_t i = 0; i < zipf_per; ++i) prompts.push_back(z.Next());
  }
  char p[64];
  std::snprintf(p, sizeof(p), "alpha=%.1f zipf_per=%u", alpha, zipf_per);
  return internal::Make("mix", p, seed, prompts, ids);
}

// Every case of the suite for one seed. `quick`: a few small cases of each family (the test).
inline std::vector<Case> Cases(uint64_t seed, bool quick) {
  std::vector<Case> out;
  if (quick) {
    out.push_back(Barrier(24, 4, 2, 6, 2, 1, seed));
    out.push_back(Barrier(32, 4, 1, 3, 0, 2, seed));
    out.push_back(Zipf(1.1, 64, 400, seed));
    out.push_back(Docs(5, 24, 400, seed));
    out.push_back(Diurnal(1.1, 1, 400, seed));
    out.push_back(Mix(1.1, 1, seed));
    return out;
  }
  for (uint32_t conv : {16u, 64u, 128u, 512u}) {
    for (uint32_t rounds : {4u, 8u, 16u}) {
      if (conv * rounds > 4096) continue;  // bounded trace length (the suite's run time)
      for (auto [lo, hi] : {std::pair{1u, 3u}, std::pair{4u, 8u}}) {
        out.push_back(Barrier(conv, rounds, lo, hi, conv >= 64 ? 4 : 0, 1, seed));
      }
      if (conv >= 64) out.push_back(Barrier(conv, rounds, 2, 6, 0, 4, seed));
    }
  }
  for (double alpha : {0.6, 0.8, 1.0, 1.2, 1.4}) {
    for (uint32_t conv : {64u, 256u, 1024u}) out.push_back(Zipf(alpha, conv, 3000, seed));
  }
  for (uint32_t hot_per_doc : {3u, 9u}) {
    for (uint32_t doc_pages : {16u, 64u}) out.push_back(Docs(hot_per_doc, doc_pages, 3000, seed));
  }
  for (double alpha : {0.8, 1.1}) {
    for (uint32_t shifts : {1u, 3u}) out.push_back(Diurnal(alpha, shifts, 3000, seed));
  }
  for (double alpha : {0.8, 1.1}) {
    for (uint32_t zipf_per : {1u, 3u}) out.push_back(Mix(alpha, zipf_per, seed));
  }
  return out;
}

}  // namespace fluxon::eviction_replay::suite
