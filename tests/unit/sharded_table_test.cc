#include "common/sharded_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "route/key_control_table.h"

namespace fluxon {
namespace {

TEST(ShardedTable, HasTwoHundredFiftySixShardsSpreadByKey) {
  using Table = KeyControlTable<int>;
  EXPECT_EQ(Table::shard_count(), 256u);
  std::set<size_t> used;
  for (int i = 0; i < 4096; ++i) used.insert(Table::ShardOf("page-" + std::to_string(i)));
  EXPECT_GT(used.size(), 240u);
}

TEST(ShardedTable, InsertIfAbsentDecidesOneWinner) {
  KeyControlTable<int> t;
  EXPECT_TRUE(t.InsertIfAbsent("a", 1));
  EXPECT_FALSE(t.InsertIfAbsent("a", 2));
  EXPECT_EQ(t.Get("a"), 1);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_EQ(t.Take("a"), 1);
  EXPECT_FALSE(t.Contains("a"));
  EXPECT_EQ(t.size(), 0u);
}

TEST(ShardedTable, EraseIfComparesIdentity) {
  KeyControlTable<int> t;
  t.InsertIfAbsent("k", 7);
  // An op with identity 6 finishing late must not erase the newer op 7.
  EXPECT_FALSE(t.EraseIf("k", [](int v) { return v == 6; }));
  EXPECT_TRUE(t.Contains("k"));
  EXPECT_TRUE(t.EraseIf("k", [](int v) { return v == 7; }));
  EXPECT_FALSE(t.Contains("k"));
}

TEST(ShardedTable, UpdateAndUpsert) {
  KeyControlTable<int> t;
  int r = t.Upsert(
      "x", [] { return 10; }, [](int& v, bool inserted) { return inserted ? v : -1; });
  EXPECT_EQ(r, 10);
  r = t.Upsert(
      "x", [] { return 99; }, [](int& v, bool inserted) { return inserted ? -1 : ++v; });
  EXPECT_EQ(r, 11);
  bool had = t.Update("x", [](int* v, bool* erase) {
    *erase = v != nullptr;
    return v != nullptr;
  });
  EXPECT_TRUE(had);
  EXPECT_EQ(t.size(), 0u);
}

TEST(ShardedTable, ConcurrentLeaderElectionHasExactlyOneLeaderPerKey) {
  KeyControlTable<int> t;
  std::atomic<int> leaders{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int k = 0; k < 5000; ++k) {
        if (t.InsertIfAbsent("key" + std::to_string(k), th)) ++leaders;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(leaders.load(), 5000);
  EXPECT_EQ(t.size(), 5000u);
  size_t visited = 0;
  t.ForEach([&](const std::string&, const int&) { ++visited; });
  EXPECT_EQ(visited, 5000u);
}

}  // namespace
}  // namespace fluxon
