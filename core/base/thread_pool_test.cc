// Stress tests of ThreadPool::parallel_for: many tiny calls (the completion hand-off of every call is exercised),
// nested calls, calls from several threads at once, and exceptions. Built twice: into core_base_test, and on its
// own with -fsanitize=thread (thread_pool_tsan_test), where a data race on the caller's completion state — the
// hang found in DeviceConformance.Cpu — is a ThreadSanitizer report and a failed test.
#include "core/base/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <vector>

namespace keel {
namespace {

TEST(ThreadPool, ManyTinyCallsCoverEveryIndexOnce) {
  ThreadPool pool(2);
  for (int i = 0; i < 20000; ++i) {
    int hits[2] = {0, 0};
    pool.parallel_for(2, 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) ++hits[k];
    });
    ASSERT_EQ(hits[0], 1) << "call " << i;
    ASSERT_EQ(hits[1], 1) << "call " << i;
  }
}

TEST(ThreadPool, ChunksPartitionTheRange) {
  ThreadPool pool(4);
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 1001}) {
    for (int64_t min_chunk : {1, 3, 100}) {
      std::vector<std::atomic<int>> seen(n);
      pool.parallel_for(n, min_chunk, [&](int64_t b, int64_t e) {
        ASSERT_LE(0, b);
        ASSERT_LE(b, e);
        ASSERT_LE(e, n);
        for (int64_t k = b; k < e; ++k) seen[k].fetch_add(1);
      });
      for (int64_t k = 0; k < n; ++k) ASSERT_EQ(seen[k].load(), 1) << "n=" << n << " min_chunk=" << min_chunk;
    }
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(3);
  for (int i = 0; i < 2000; ++i) {
    std::atomic<int64_t> sum{0};
    pool.parallel_for(6, 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        pool.parallel_for(4, 1, [&](int64_t b2, int64_t e2) {
          for (int64_t j = b2; j < e2; ++j) sum.fetch_add(k * 4 + j);
        });
      }
    });
    ASSERT_EQ(sum.load(), 24 * 23 / 2);
  }
}

TEST(ThreadPool, SeveralCallerThreadsShareTheWorkers) {
  ThreadPool pool(2);
  constexpr int kCallers = 4, kCalls = 3000;
  std::vector<std::thread> callers;
  std::atomic<int> failures{0};
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        std::vector<int> v(3 + (i + t) % 5, 0);
        pool.parallel_for(static_cast<int64_t>(v.size()), 1, [&](int64_t b, int64_t e) {
          for (int64_t k = b; k < e; ++k) v[k] = static_cast<int>(k) + 1;
        });
        const int n = static_cast<int>(v.size());
        if (std::accumulate(v.begin(), v.end(), 0) != n * (n + 1) / 2) failures.fetch_add(1);
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(ThreadPool, AChunksExceptionReachesTheCallerAfterEveryChunk) {
  ThreadPool pool(2);
  for (int i = 0; i < 500; ++i) {
    std::atomic<int> finished{0};
    const int64_t thrower = i % 2;  // the caller's chunk or the worker's
    try {
      pool.parallel_for(2, 1, [&](int64_t b, int64_t) {
        if (b == thrower) throw std::runtime_error("chunk failed");
        finished.fetch_add(1);
      });
      FAIL() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "chunk failed");
    }
    EXPECT_EQ(finished.load(), 1);  // the other chunk ran to its end before parallel_for returned
  }
}

}  // namespace
}  // namespace keel
