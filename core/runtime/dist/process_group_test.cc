// process_group_test — the rendezvous check (ranks as threads over an in-process and a TCP store): success, a world
// size that differs between ranks, a duplicate rank, a rank that never arrives (named, within the timeout); backend
// lookup errors; and ProcessGroup over the gloo collective plugin (threads sharing one store; skipped, with the
// reason, when no "gloo" collective is registered).
#include "core/runtime/dist/process_group.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

namespace keel::dist {
namespace {

using Clock = std::chrono::steady_clock;

// Runs rendezvous_check for (rank, size) pairs, one thread each, over `store`.
std::vector<Status> rendezvous(Store& store, const std::vector<std::pair<int, int>>& ranks, int64_t timeout_ms) {
  std::vector<Status> out(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i)
    threads.emplace_back([&, i] { out[i] = rendezvous_check(store, ranks[i].first, ranks[i].second, timeout_ms); });
  for (auto& t : threads) t.join();
  return out;
}

TEST(Rendezvous, AllRanksArrive) {
  InProcessStore store;
  for (const Status& s : rendezvous(store, {{0, 4}, {1, 4}, {2, 4}, {3, 4}}, 5000))
    EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(Rendezvous, AllRanksArriveOverTcp) {
  auto server = TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.is_ok());
  std::vector<Status> out(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      auto c = TcpStore::connect("127.0.0.1", (*server)->port(), 5000);
      if (!c.is_ok()) {
        out[r] = c.status();
        return;
      }
      PrefixStore group(std::shared_ptr<Store>(std::move(c).value()), "g");
      out[r] = rendezvous_check(group, r, 3, 5000);
    });
  for (auto& t : threads) t.join();
  for (const Status& s : out) EXPECT_TRUE(s.is_ok()) << s.to_string();
}

TEST(Rendezvous, WorldSizeMismatchIsNamed) {
  InProcessStore store;
  auto out = rendezvous(store, {{0, 2}, {1, 3}}, 1000);
  ASSERT_FALSE(out[1].is_ok());
  EXPECT_EQ(out[1].code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out[1].message().find("rank 1 has world size 3, rank 0 has 2"), std::string::npos) << out[1].to_string();
  ASSERT_FALSE(out[0].is_ok());  // rank 0 learns of it too
  EXPECT_NE(out[0].message().find("rank 1 has world size 3"), std::string::npos) << out[0].to_string();
}

TEST(Rendezvous, DuplicateRankIsNamed) {
  // Three processes for a world of three, two of them rank 1: the second rank 1 fails at once, the first when rank 2
  // does not come; both name the duplicate, and rank 0 names the missing rank and the duplicate.
  InProcessStore store;
  auto t0 = Clock::now();
  auto out = rendezvous(store, {{0, 3}, {1, 3}, {1, 3}}, 500);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0);
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(out[i].code(), StatusCode::kAlreadyExists) << out[i].to_string();
    EXPECT_NE(out[i].message().find("as rank 1 of 3 (duplicate RANK"), std::string::npos) << out[i].to_string();
  }
  ASSERT_FALSE(out[0].is_ok());
  EXPECT_NE(out[0].message().find("rank 2 of 3 never arrived"), std::string::npos) << out[0].to_string();
  EXPECT_NE(out[0].message().find("rank 1 joined 2 times (duplicate RANK)"), std::string::npos) << out[0].to_string();
}

TEST(Rendezvous, RankThatNeverArrivesIsNamedWithinTheTimeout) {
  InProcessStore store;
  auto t0 = Clock::now();
  auto out = rendezvous(store, {{0, 4}, {1, 4}, {3, 4}}, 500);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(took, 3.0);
  for (const Status& s : out) {
    ASSERT_FALSE(s.is_ok());
    EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  }
  EXPECT_NE(out[0].message().find("rank 2 of 4 never arrived"), std::string::npos) << out[0].to_string();
  // Rank 0 missing altogether:
  InProcessStore store2;
  auto no_root = rendezvous(store2, {{1, 2}}, 200);
  EXPECT_NE(no_root[0].message().find("rank 0 never arrived"), std::string::npos) << no_root[0].to_string();
}

TEST(Rendezvous, BadRankIsInvalidArgument) {
  InProcessStore store;
  EXPECT_EQ(rendezvous_check(store, 2, 2, 100).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rendezvous_check(store, 0, 0, 100).code(), StatusCode::kInvalidArgument);
}

std::unique_ptr<Environment> make_env() {
  EnvironmentOptions opts;
#ifdef KEEL_PLUGIN_DIR_DEFAULT
  opts.plugin_paths.emplace_back(KEEL_PLUGIN_DIR_DEFAULT);
#endif
  auto env = Environment::create(opts);
  EXPECT_TRUE(env.is_ok()) << env.status().to_string();
  return env.is_ok() ? std::move(env).value() : nullptr;
}

TEST(ProcessGroup, UnknownBackendNamesTheRegisteredOnes) {
  auto env = make_env();
  ASSERT_TRUE(env);
  auto e = find_collective(*env, "no-such-backend");
  ASSERT_FALSE(e.is_ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
  EXPECT_NE(e.status().message().find("'no-such-backend'"), std::string::npos) << e.status().to_string();
  EXPECT_NE(e.status().message().find("registered:"), std::string::npos) << e.status().to_string();
  Identity id;
  auto pg = ProcessGroup::create(*env, id, "no-such-backend", 0, 1000);
  ASSERT_FALSE(pg.is_ok());
  EXPECT_EQ(pg.status().code(), StatusCode::kNotFound);
}

// Each rank passes its own index as the device (LOCAL_RANK, as a program written for GPUs does, and the header's
// example): a host collective ignores it (a program of 2 CPU ranks failed on rank 1 with "device cpu:1 does not
// exist", found by the install test's data-parallel train_cnn).
TEST(ProcessGroup, GlooGroupOfThreeThreads) {
  auto env = make_env();
  ASSERT_TRUE(env);
  if (!find_collective(*env, "gloo").is_ok())
    GTEST_SKIP() << "no \"gloo\" collective registered (plugins/gloo not built)";
  auto base = std::make_shared<InProcessStore>();
  constexpr int kRanks = 3;
  std::vector<std::string> errors(kRanks);
  std::vector<float> sums(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      auto pg =
          ProcessGroup::create_with_store(*env, std::make_shared<PrefixStore>(base, "t"), r, kRanks, "gloo", r, 20000);
      if (!pg.is_ok()) {
        errors[r] = pg.status().to_string();
        return;
      }
      if ((*pg)->rank() != r || (*pg)->size() != kRanks || (*pg)->backend() != "gloo") errors[r] = "wrong accessors";
      float v = static_cast<float>(r + 1);
      Status s = (*pg)->comm().all_reduce(&v, &sums[r], 1, DType::kF32, KEEL_REDUCE_SUM);
      if (!s.is_ok()) errors[r] = s.to_string();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(sums[r], 6.0f) << "rank " << r;
  }
}

TEST(ProcessGroup, SingleProcessGroupNeedsNoServer) {
  auto env = make_env();
  ASSERT_TRUE(env);
  if (!find_collective(*env, "gloo").is_ok())
    GTEST_SKIP() << "no \"gloo\" collective registered (plugins/gloo not built)";
  Identity id;  // rank 0 of 1
  auto pg = ProcessGroup::create(*env, id, "", 0, 5000);
  ASSERT_TRUE(pg.is_ok()) << pg.status().to_string();
  EXPECT_EQ((*pg)->size(), 1);
  float v = 2, out = 0;
  ASSERT_TRUE((*pg)->comm().all_reduce(&v, &out, 1, DType::kF32, KEEL_REDUCE_SUM).is_ok());
  EXPECT_EQ(out, 2.0f);
}

}  // namespace
}  // namespace keel::dist
