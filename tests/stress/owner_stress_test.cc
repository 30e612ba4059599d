// Concurrency stress of the owner: writers, readers and the eviction actor race on overlapping
// keys, with publish responses dropped and duplicated. Readers check that every value they pin
// still carries its own key's tag (S2: a pinned slot is never reused), and at the end every
// temporary counter returns to zero and the slot pool is consistent. Runs under TSAN and ASAN.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "common/fault_injector.h"
#include "fluxon/units.h"
#include "master/master_core.h"
#include "owner/owner_core.h"
#include "rpc/fault_injecting_master.h"

namespace fluxon {
namespace {

constexpr int64_t kValueLen = 16 * 1024;

uint64_t TagOf(const std::string& key) { return std::hash<std::string>{}(key) | 1; }

int Rounds() {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  return 150;
#else
  return 1500;
#endif
}

TEST(OwnerStress, WritersReadersAndEvictionKeepValuesIntact) {
  MasterCore master;
  FaultInjector faults;
  FaultInjectingMaster faulty(&master, &faults);
  OwnerConfig cfg;
  cfg.segment.size_bytes = kGrantBytes;
  cfg.local_reserve.claim_soft_timeout = std::chrono::milliseconds(2);
  cfg.local_reserve.claim_hard_timeout = std::chrono::milliseconds(3000);
  cfg.eviction_interval = std::chrono::milliseconds(1);
  OwnerRuntime rt;
  rt.maintenance_interval = std::chrono::milliseconds(5);
  auto owner_or = OwnerCore::Create(cfg, &faulty, rt);
  ASSERT_TRUE(owner_or.ok()) << owner_or.status();
  OwnerCore& owner = **owner_or;
  ASSERT_TRUE(owner.Start().ok());
  uint8_t* base = owner.memory().segment().base();
  faults.Set({"master.PublishBatch", FaultAction::kDrop, std::chrono::milliseconds(0), 3});
  faults.Set({"master.RemoveRoutes", FaultAction::kDuplicate, std::chrono::milliseconds(0), 20});
  faults.Set({"master.Lookup", FaultAction::kFail, std::chrono::milliseconds(0), 20});

  std::atomic<int> violations{0}, published{0}, futures_pending{0};
  auto writer = [&](int id) {
    std::mt19937 rng(id);
    for (int r = 0; r < Rounds(); ++r) {
      PutStartArgs a;
      const int chain = rng() % 64;
      const int start = 4 * (rng() % 8);
      for (int i = 0; i < 4; ++i) {
        a.keys.push_back("c" + std::to_string(chain) + "-" + std::to_string(start + i));
      }
      a.value_len = kValueLen;
      a.options.atomic_group_lens = {2, 2};
      std::vector<uint32_t> conflicts;
      auto put = owner.PutStart(100 + id, a, &conflicts);
      if (!put.ok()) continue;  // conflict or no space: nothing reserved
      if (rng() % 8 == 0) {
        if (!owner.PutAbort(100 + id, put->put_id).ok()) ++violations;
        continue;
      }
      for (size_t i = 0; i < a.keys.size(); ++i) {
        const uint64_t tag = TagOf(a.keys[i]);
        std::memcpy(base + put->offsets[i], &tag, sizeof tag);
      }
      ++futures_pending;
      const absl::Status s = owner.PutCommit(100 + id, put->put_id, [&](const absl::Status& st) {
        if (st.ok()) ++published;
        --futures_pending;
      });
      if (!s.ok()) ++violations;
    }
  };
  auto reader = [&](int id) {
    std::mt19937 rng(1000 + id);
    for (int r = 0; r < Rounds(); ++r) {
      std::vector<std::string> keys;
      const int chain = rng() % 64;
      for (int i = 0; i < 8; ++i)
        keys.push_back("c" + std::to_string(chain) + "-" + std::to_string(i));
      auto g = owner.GetStart(200 + id, keys, {2, 2, 2, 2}, true);
      if (!g.ok()) {
        ++violations;
        continue;
      }
      if (g->prefix.transferable_len % 2 != 0) ++violations;  // never half a group
      if (g->handle_id == 0) continue;
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
      for (uint32_t i = 0; i < g->prefix.transferable_len; ++i) {
        uint64_t tag;
        std::memcpy(&tag, base + g->offsets[i], sizeof tag);
        if (tag != TagOf(keys[i])) ++violations;  // the pinned slot was reused under us
      }
      if (rng() % 3 == 0) {
        if (!owner.CancelGet(200 + id, g->handle_id).ok()) ++violations;
      } else {
        if (!owner.GetTransfer(200 + id, g->handle_id, 0).ok()) ++violations;
        if (!owner.ReleaseViews(200 + id, g->handle_id).ok()) ++violations;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) threads.emplace_back(writer, i);
  for (int i = 0; i < 2; ++i) threads.emplace_back(reader, i);
  std::atomic<bool> stop{false};
  std::thread evictor([&] {
    while (!stop) {
      owner.EvictSome(4 * kValueLen * 8);
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  });
  for (auto& t : threads) t.join();
  stop = true;
  evictor.join();
  for (int i = 0; i < 500 && futures_pending.load() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(futures_pending.load(), 0);
  EXPECT_EQ(violations.load(), 0);
  EXPECT_GT(published.load(), 0);
  auto s = owner.Stats();
  for (const char* k : {"live_handles", "live_views", "prepared_puts", "inflight_gets",
                        "slots_Prepared", "slots_Releasing", "slots_PendingLocalVisible"}) {
    EXPECT_EQ(s[k], 0) << k;
  }
  // Every committed value has exactly one live route, and nothing else is held.
  EXPECT_EQ(static_cast<size_t>(s["slots_Committed"]), master.route_count());
  EXPECT_EQ(s["keys"], s["slots_Committed"]);
  owner.Stop();
  EXPECT_TRUE(owner.memory().pool().CheckConsistency().ok())
      << owner.memory().pool().CheckConsistency();
}

}  // namespace
}  // namespace fluxon
