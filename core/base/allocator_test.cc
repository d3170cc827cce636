#include "core/base/allocator.h"

#include <gtest/gtest.h>

#include <map>

namespace keel {
namespace {

// Counts raw traffic and can be told to fail.
class CountingRaw : public RawAllocator {
 public:
  StatusOr<void*> allocate(uint64_t bytes, uint64_t alignment) override {
    if (fail || reserved + bytes > limit) return out_of_memory("counting allocator: limit reached");
    void* p = std::aligned_alloc(alignment, bytes);
    live[p] = bytes;
    reserved += bytes;
    ++allocs;
    return p;
  }
  void free(void* p) override {
    reserved -= live[p];
    live.erase(p);
    std::free(p);
    ++frees;
  }
  std::string name() const override { return "test:0"; }
  std::map<void*, uint64_t> live;
  uint64_t reserved = 0, limit = ~0ull;
  int allocs = 0, frees = 0;
  bool fail = false;
};

struct Fixture {
  CountingRaw* raw = new CountingRaw;
  CachingAllocator pool{std::unique_ptr<RawAllocator>(raw)};
};

TEST(CachingAllocator, ReusesFreedBlocksWithoutRawAllocation) {
  Fixture f;
  auto a = f.pool.allocate(1000);
  ASSERT_TRUE(a.is_ok());
  f.pool.free(a.value());
  int raw_before = f.raw->allocs;
  auto b = f.pool.allocate(1000);
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b.value(), a.value());
  EXPECT_EQ(f.raw->allocs, raw_before);
  EXPECT_EQ(f.pool.stats().cache_hits, 1u);
  f.pool.free(b.value());
}

TEST(CachingAllocator, SplitsSegmentsForSmallRequests) {
  Fixture f;
  std::vector<void*> ptrs;
  for (int i = 0; i < 100; ++i) ptrs.push_back(f.pool.allocate(4096).value());
  EXPECT_EQ(f.raw->allocs, 1) << "100 x 4 KiB should share one 2 MiB segment";
  for (size_t i = 1; i < ptrs.size(); ++i) EXPECT_NE(ptrs[i], ptrs[i - 1]);
  for (void* p : ptrs) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % CachingAllocator::kAlignment, 0u);
  for (void* p : ptrs) f.pool.free(p);
  // Merged back into one free block: two 1 MiB requests (the largest "small" size) fit without another segment.
  auto m1 = f.pool.allocate(CachingAllocator::kSmallSize);
  auto m2 = f.pool.allocate(CachingAllocator::kSmallSize);
  ASSERT_TRUE(m1.is_ok() && m2.is_ok());
  EXPECT_EQ(f.raw->allocs, 1);
  f.pool.free(m1.value());
  f.pool.free(m2.value());
}

TEST(CachingAllocator, StatisticsTrackInUseReservedAndPeak) {
  Fixture f;
  auto a = f.pool.allocate(3 << 20).value();  // large: its own 4 MiB segment
  auto b = f.pool.allocate(512).value();
  auto s = f.pool.stats();
  EXPECT_EQ(s.in_use_bytes, (3u << 20) + 512u);
  EXPECT_EQ(s.reserved_bytes, (4u << 20) + (2u << 20));
  EXPECT_EQ(s.peak_in_use_bytes, s.in_use_bytes);
  f.pool.free(a);
  s = f.pool.stats();
  EXPECT_EQ(s.in_use_bytes, 512u);
  EXPECT_EQ(s.peak_in_use_bytes, (3u << 20) + 512u);
  EXPECT_EQ(s.reserved_bytes, (6u << 20));
  f.pool.reset_peak();
  EXPECT_EQ(f.pool.stats().peak_in_use_bytes, 512u);
  f.pool.free(b);
}

TEST(CachingAllocator, StatisticsCountHitsMissesSegmentsAndBlocks) {
  Fixture f;
  void* a = f.pool.allocate(4096).value();     // miss: a small segment
  void* b = f.pool.allocate(4096).value();     // hit: split from that segment
  void* c = f.pool.allocate(3 << 20).value();  // miss: a large segment
  auto s = f.pool.stats();
  EXPECT_EQ(s.allocations, 3u);
  EXPECT_EQ(s.cache_hits, 1u);
  EXPECT_EQ(s.cache_misses, 2u);
  EXPECT_EQ(s.segments, 2u);
  EXPECT_EQ(s.blocks_in_use, 3u);
  EXPECT_EQ(s.free_blocks, 2u);  // the rest of the small segment, the last 1 MiB of the large one
  f.pool.free(a);
  f.pool.free(b);
  f.pool.free(c);
  s = f.pool.stats();
  EXPECT_EQ(s.blocks_in_use, 0u);
  EXPECT_EQ(s.free_blocks, 2u);  // merged: one per segment
  EXPECT_EQ(f.pool.trim(), (2u << 20) + (4u << 20));
  s = f.pool.stats();
  EXPECT_EQ(s.segments, 0u);
  EXPECT_EQ(s.free_blocks, 0u);
  EXPECT_EQ(s.raw_frees, 2u);
  EXPECT_EQ(s.reserved_bytes, 0u);
}

TEST(CachingAllocator, TrimReleasesOnlyWhollyFreeSegments) {
  Fixture f;
  auto a = f.pool.allocate(3 << 20).value();
  auto b = f.pool.allocate(100).value();
  f.pool.free(a);
  uint64_t released = f.pool.trim();
  EXPECT_EQ(released, 4u << 20);
  EXPECT_EQ(f.raw->frees, 1);
  EXPECT_EQ(f.pool.stats().reserved_bytes, 2u << 20);
  f.pool.free(b);
  EXPECT_EQ(f.pool.trim(), 2u << 20);
  EXPECT_EQ(f.raw->reserved, 0u);
}

TEST(CachingAllocator, StreamsDoNotShareBlocks) {
  Fixture f;
  auto a = f.pool.allocate(1000, /*stream=*/1).value();
  f.pool.free(a);
  auto b = f.pool.allocate(1000, /*stream=*/2).value();
  EXPECT_NE(a, b);
  EXPECT_EQ(f.raw->allocs, 2);
  auto c = f.pool.allocate(1000, /*stream=*/1).value();
  EXPECT_EQ(a, c);
  f.pool.free(b);
  f.pool.free(c);
}

TEST(CachingAllocator, OutOfMemoryTrimsCacheThenReportsClearly) {
  Fixture f;
  f.raw->limit = 6u << 20;
  auto a = f.pool.allocate(3 << 20).value();  // 4 MiB segment
  f.pool.free(a);                             // cached, not returned
  // 5 MiB needs a 6 MiB segment: only possible after trimming the cached 4 MiB.
  auto b = f.pool.allocate(5 << 20);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  auto c = f.pool.allocate(5 << 20);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(c.status().message().find("test:0"), std::string::npos) << c.status().message();
  EXPECT_EQ(f.pool.stats().failed_allocations, 1u);
  f.pool.free(b.value());
}

TEST(CachingAllocator, ZeroByteRequestsGetDistinctBlocks) {
  Fixture f;
  auto a = f.pool.allocate(0).value();
  auto b = f.pool.allocate(0).value();
  EXPECT_NE(a, b);
  f.pool.free(a);
  f.pool.free(b);
}

}  // namespace
}  // namespace keel
