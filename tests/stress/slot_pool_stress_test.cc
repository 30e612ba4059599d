// Concurrency stress for the slot pool and holders: threads claim, commit, publish, pin, and
// release route and holders in random orders. Checks S2 (a slot is never reused while its route is
// live or a holder remains), no double free-list entries, and that every counter returns to its
// baseline. Run under ThreadSanitizer and AddressSanitizer in CI.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "fluxon/units.h"
#include "holder/holder.h"
#include "slot/slot_pool.h"

namespace fluxon {
namespace {

constexpr uint64_t kValueLen = 4096;

struct Env {
  Env(uint64_t grants, SlotPoolOptions opts = {}) {
    SegmentOptions so;
    so.size_bytes = grants * kGrantBytes;
    segment = std::move(*Segment::Create(so));
    opts.populate_grants = false;
    pool = std::move(*SlotPool::Create(segment.get(), opts));
  }
  std::unique_ptr<Segment> segment;
  std::unique_ptr<SlotPool> pool;
};

// Every value writes a unique token into its slot. A pin that later reads another token has seen
// its slot reused under it: an S2 violation.
uint64_t ReadToken(SlotPool& pool, const HolderRef& h) {
  uint64_t t;
  std::memcpy(&t, pool.segment()->base() + h->offset, sizeof t);
  return t;
}

int Iterations() {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  return 3000;
#else
  return 20000;
#endif
}

TEST(SlotPoolStress, RandomLifecyclesKeepS2AndReturnToBaseline) {
  Env env(1);
  SlotPool& pool = *env.pool;
  Mutex mu;
  // Values whose route is live, owned by whoever takes them out.
  std::deque<std::pair<SlotRef, HolderRef>> routed ABSL_GUARDED_BY(mu);
  // Pins (reader holders) that any thread may drop, with the token they must keep seeing.
  std::deque<std::pair<HolderRef, uint64_t>> pins ABSL_GUARDED_BY(mu);
  std::atomic<uint64_t> next_token{1};
  std::atomic<int> violations{0};

  auto check_pin = [&](const HolderRef& h, uint64_t token) {
    if (ReadToken(pool, h) != token) ++violations;
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      for (int i = 0; i < Iterations(); ++i) {
        const int op = rng() % 10;
        if (op < 4) {
          // Put: claim a batch, then abort or commit it; committed values get a token, a pin
          // and, sometimes, a route.
          const size_t n = 1 + rng() % 8;
          auto refs = pool.Claim(kValueLen, n, std::chrono::milliseconds(2000));
          if (!refs.ok()) continue;
          if (rng() % 4 == 0) {
            for (const SlotRef& r : *refs) {
              if (!pool.Abort(r).ok()) ++violations;
            }
            continue;
          }
          for (const SlotRef& r : *refs) {
            const uint64_t token = next_token.fetch_add(1);
            std::memcpy(pool.AddressOf(r), &token, sizeof token);
            auto h = HolderRef::CommitLocalVisible(&pool, r, "k", token, kValueLen);
            if (!h.ok()) {
              ++violations;
              continue;
            }
            HolderRef pin = *h;
            const bool publish = rng() % 3 != 0;
            if (publish && !pool.PublishRoute(r).ok()) ++violations;
            MutexLock lock(&mu);
            pins.emplace_back(std::move(pin), token);
            if (publish) {
              routed.emplace_back(r, std::move(*h));
            } else {
              // Never published: only holders keep it; dropping the resident holder here leaves
              // the pin as the last reference.
              h->reset();
            }
          }
        } else if (op < 7) {
          // Evict a routed value: route release and resident-holder release in random order.
          std::pair<SlotRef, HolderRef> v;
          {
            MutexLock lock(&mu);
            if (routed.empty()) continue;
            const size_t k = rng() % routed.size();
            std::swap(routed[k], routed.back());
            v = std::move(routed.back());
            routed.pop_back();
          }
          if (rng() % 2 == 0) {
            if (!pool.ReleaseRoute(v.first).ok()) ++violations;
            v.second.reset();
          } else {
            v.second.reset();
            if (!pool.ReleaseRoute(v.first).ok()) ++violations;
          }
        } else {
          // Drop a pin (possibly the last holder, racing with route release elsewhere).
          std::pair<HolderRef, uint64_t> p;
          {
            MutexLock lock(&mu);
            if (pins.empty()) continue;
            const size_t k = rng() % pins.size();
            std::swap(pins[k], pins.back());
            p = std::move(pins.back());
            pins.pop_back();
          }
          check_pin(p.first, p.second);
          p.first.reset();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  {
    MutexLock lock(&mu);
    for (auto& [h, token] : pins) check_pin(h, token);
    pins.clear();
    for (auto& [r, h] : routed) {
      h.reset();
      if (!pool.ReleaseRoute(r).ok()) ++violations;
    }
    routed.clear();
  }
  EXPECT_EQ(violations.load(), 0);
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency();
  SlotPoolStats s = pool.Stats();
  const int64_t total = static_cast<int64_t>(s.grants * SlotsPerGrant(kValueLen));
  EXPECT_EQ(s.slots_by_state[static_cast<int>(SlotState::kFree)], total);
  for (int st = 1; st < kNumSlotStates; ++st) EXPECT_EQ(s.slots_by_state[st], 0) << st;
  EXPECT_EQ(s.classes[0].waiting_claims, 0u);
  EXPECT_EQ(s.classes[0].pending_demand_slots, 0u);
}

TEST(SlotPoolStress, RouteReleaseRacingLastHolderFreesExactlyOnce) {
  Env env(1);
  SlotPool& pool = *env.pool;
  for (int round = 0; round < Iterations() / 4; ++round) {
    auto refs = pool.Claim(kValueLen, 64);
    ASSERT_TRUE(refs.ok());
    std::vector<HolderRef> holders;
    for (const SlotRef& r : *refs) {
      holders.push_back(*HolderRef::CommitLocalVisible(&pool, r, "k", 1, kValueLen));
      ASSERT_TRUE(pool.PublishRoute(r).ok());
    }
    std::atomic<int> failures{0};
    std::thread route_side([&] {
      for (const SlotRef& r : *refs) {
        if (!pool.ReleaseRoute(r).ok()) ++failures;
      }
    });
    std::thread holder_side([&] {
      for (HolderRef& h : holders) h.reset();
    });
    route_side.join();
    holder_side.join();
    ASSERT_EQ(failures.load(), 0);
    for (const SlotRef& r : *refs) ASSERT_EQ(*pool.StateOf(r), SlotState::kFree);
  }
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency();
}

TEST(SlotPoolStress, ConcurrentClaimsNeverHandOutASlotTwice) {
  SlotPoolOptions o;
  o.claim_hard_timeout = std::chrono::milliseconds(5000);
  Env env(1, o);
  SlotPool& pool = *env.pool;
  const uint64_t slot = kGrantBytes / 64;  // 64 slots: heavy contention and waiting
  std::vector<std::atomic<int>> owned(64);
  std::atomic<int> violations{0}, timeouts{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < Iterations() / 4; ++i) {
        auto refs = pool.Claim(slot, 1 + rng() % 24);
        if (!refs.ok()) {
          ++timeouts;
          continue;
        }
        for (const SlotRef& r : *refs) {
          if (owned[r.index].fetch_add(1) != 0) ++violations;
        }
        for (const SlotRef& r : *refs) {
          owned[r.index].fetch_sub(1);
          if (!pool.Abort(r).ok()) ++violations;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(timeouts.load(), 0);
  ASSERT_TRUE(pool.CheckConsistency().ok());
  EXPECT_EQ(pool.Stats().slots_by_state[0], 64);
}

TEST(SlotPoolStress, GrowAndShrinkUnderLoad) {
  SlotPoolOptions o;
  o.shrink_idle = std::chrono::milliseconds(1);
  Env env(4, o);
  SlotPool& pool = *env.pool;
  std::atomic<bool> stop{false};
  std::atomic<int> violations{0};
  std::thread shrinker([&] {
    while (!stop) {
      pool.ShrinkIdleGrants();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < Iterations() / 10; ++i) {
        auto refs = pool.Claim(kGrantBytes / 4, 1 + rng() % 6, std::chrono::milliseconds(5000));
        if (!refs.ok()) {
          ++violations;
          continue;
        }
        for (const SlotRef& r : *refs) {
          *pool.AddressOf(r) = 1;
          if (!pool.Abort(r).ok()) ++violations;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  stop = true;
  shrinker.join();
  EXPECT_EQ(violations.load(), 0);
  ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency();
  SlotPoolStats s = pool.Stats();
  for (int st = 1; st < kNumSlotStates; ++st) EXPECT_EQ(s.slots_by_state[st], 0);
}

}  // namespace
}  // namespace fluxon

namespace fluxon {
namespace {

// A claim that finds the pool at its cap tries to grow (AddGrant, lock released), fails, and
// waits. Slots freed while it was growing must not be a lost wake-up: the claim is served as soon
// as enough slots are free, not at its hard timeout. (Multi-turn traffic at a capacity cap hit
// this: a put waited the whole 30 s with the slots it needed free.)
TEST(SlotPoolStress, ClaimAtTheCapIsServedAsSoonAsSlotsAreFreed) {
  SlotPoolOptions opts;
  opts.expected_capacity =
      ExpectedCapacity{kValueLen, SlotsPerGrant(SlotSizeFor(kValueLen)) * SlotSizeFor(kValueLen)};
  opts.claim_hard_timeout = std::chrono::milliseconds(5000);
  Env env(2, opts);
  SlotPool& pool = *env.pool;
  ASSERT_TRUE(pool.Prewarm().ok());
  const size_t total = SlotsPerGrant(SlotSizeFor(kValueLen));
  auto all = pool.Claim(kValueLen, total);
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<SlotRef> held = std::move(*all);
  const int rounds = Iterations() / 50;
  for (int r = 0; r < rounds; ++r) {
    const size_t k = 16 + r % 48;  // freed one by one: a burst, as eviction frees a cohort set
    std::vector<SlotRef> to_free(held.end() - k, held.end());
    held.resize(held.size() - k);
    std::thread freer([&] {
      // Free at slightly different moments so some land while the claim is growing.
      std::this_thread::sleep_for(std::chrono::microseconds(r % 50));
      for (const SlotRef& s : to_free) {
        ASSERT_TRUE(pool.Abort(s).ok());
        std::this_thread::yield();
      }
    });
    const auto start = std::chrono::steady_clock::now();
    auto got = pool.Claim(kValueLen, k);
    const auto waited = std::chrono::steady_clock::now() - start;
    freer.join();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_LT(waited, std::chrono::milliseconds(1000)) << "round " << r;
    held.insert(held.end(), got->begin(), got->end());
  }
  for (const SlotRef& s : held) ASSERT_TRUE(pool.Abort(s).ok());
}

}  // namespace
}  // namespace fluxon
