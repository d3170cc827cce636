// keel/core/base/allocator.h — the caching allocator (memory pool) the core puts in front of every device.
//
// Device plugins only give raw allocate/free, which may be slow (cudaMalloc, page faults). CachingAllocator keeps
// freed blocks and hands them out again: best fit over free blocks, splitting large blocks (small requests, up to 1
// MiB, and large ones come from separate segments, so small blocks do not fragment large segments), merging neighbours
// on free, and pooling per stream (a block freed on one stream is only reused on that stream). Raw memory is taken in
// segments (2 MiB for small requests, rounded up to 2 MiB otherwise) and given back only by trim() — or
// automatically when the raw allocator fails, before reporting OUT_OF_MEMORY.
//
// Thread-safe: every public member takes an internal mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "core/base/status.h"

namespace keel {

// What the pool draws from: one device's raw memory (adapted from a plugin's device table by the HAL).
class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  virtual StatusOr<void*> allocate(uint64_t bytes, uint64_t alignment) = 0;
  virtual void free(void* ptr) = 0;
  virtual std::string name() const = 0;  // "cpu:0", "cuda:1": for error messages
};

struct AllocatorStats {
  uint64_t in_use_bytes = 0;    // handed out and not yet freed (rounded sizes)
  uint64_t reserved_bytes = 0;  // held from the raw allocator (in use + cached)
  uint64_t peak_in_use_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  uint64_t allocations = 0;      // calls to allocate that succeeded
  uint64_t cache_hits = 0;       // of those, served without a raw allocation
  uint64_t raw_allocations = 0;  // segments taken from the raw allocator
  uint64_t raw_frees = 0;        // segments given back
  uint64_t failed_allocations = 0;
  // Filled by stats() (not running counters):
  uint64_t cache_misses = 0;   // allocations - cache_hits: each took a new segment
  uint64_t segments = 0;       // segments held now
  uint64_t blocks_in_use = 0;  // blocks handed out and not yet freed
  uint64_t free_blocks = 0;    // cached blocks, all streams
};

class CachingAllocator {
 public:
  using StreamKey = uintptr_t;  // 0 = the default stream

  static constexpr uint64_t kAlignment = 256;           // every block starts on this boundary
  static constexpr uint64_t kSmallSize = 1ull << 20;    // requests up to 1 MiB share small segments
  static constexpr uint64_t kSegmentSize = 2ull << 20;  // small segments are 2 MiB; large ones round to 2 MiB

  explicit CachingAllocator(std::unique_ptr<RawAllocator> raw);
  ~CachingAllocator();  // gives every segment back; blocks still in use at that point are a programmer bug
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (0 is allowed and returns a distinct minimal block). OUT_OF_MEMORY names the
  // device, the request and the pool's statistics.
  StatusOr<void*> allocate(uint64_t bytes, StreamKey stream = 0);
  // Returns a block to the pool. `ptr` must come from allocate on this allocator.
  void free(void* ptr);
  // Gives every wholly free segment back to the raw allocator; returns the bytes released.
  uint64_t trim();
  AllocatorStats stats() const;
  void reset_peak();
  const RawAllocator& raw() const { return *raw_; }

 private:
  struct Block {
    char* ptr;
    uint64_t size;
    StreamKey stream;
    bool allocated = false;
    Block* prev = nullptr;  // neighbours within one segment
    Block* next = nullptr;
    bool segment_head = false;
    bool small = false;  // from a small (2 MiB) segment: small and large requests never share segments
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      if (a->small != b->small) return a->small < b->small;
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->ptr < b->ptr;
    }
  };

  Block* find_free_locked(uint64_t size, StreamKey stream, bool small);
  uint64_t trim_locked();

  std::unique_ptr<RawAllocator> raw_;
  mutable std::mutex mu_;
  std::set<Block*, BySize> free_blocks_;
  std::unordered_map<char*, Block*> allocated_;
  std::set<Block*> segments_;  // segment heads
  AllocatorStats stats_;
};

// RawAllocator over aligned host memory (the reference CPU device uses it).
class HostRawAllocator : public RawAllocator {
 public:
  StatusOr<void*> allocate(uint64_t bytes, uint64_t alignment) override;
  void free(void* ptr) override;
  std::string name() const override { return "cpu:0"; }
};

}  // namespace keel
