#include "core/base/allocator.h"

#include <cassert>
#include <cstdlib>

namespace keel {

namespace {
uint64_t round_up(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }
std::string mib(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}
}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<RawAllocator> raw) : raw_(std::move(raw)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Block* head : segments_) {
    raw_->free(head->ptr);
    for (Block* b = head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

CachingAllocator::Block* CachingAllocator::find_free_locked(uint64_t size, StreamKey stream, bool small) {
  Block key{nullptr, size, stream};
  key.small = small;
  auto it = free_blocks_.lower_bound(&key);
  if (it == free_blocks_.end() || (*it)->stream != stream || (*it)->small != small) return nullptr;
  Block* b = *it;
  free_blocks_.erase(it);
  return b;
}

StatusOr<void*> CachingAllocator::allocate(uint64_t bytes, StreamKey stream) {
  uint64_t size = round_up(bytes == 0 ? 1 : bytes, kAlignment);
  if (size < bytes) return invalid_argument("allocation of " + std::to_string(bytes) + " bytes overflows");
  std::lock_guard<std::mutex> lock(mu_);
  bool small = size <= kSmallSize;
  Block* block = find_free_locked(size, stream, small);
  if (block != nullptr) {
    ++stats_.cache_hits;
  } else {
    uint64_t seg_size = small ? kSegmentSize : round_up(size, kSegmentSize);
    auto raw = raw_->allocate(seg_size, kAlignment);
    if (!raw.is_ok()) {
      // Give cached segments back and try once more before failing.
      if (trim_locked() > 0) raw = raw_->allocate(seg_size, kAlignment);
    }
    if (!raw.is_ok()) {
      ++stats_.failed_allocations;
      if (raw.status().code() != StatusCode::kOutOfMemory) {
        return raw.status().with_context("allocate " + mib(bytes) + " on " + raw_->name());
      }
      return out_of_memory("cannot allocate " + mib(bytes) + " on " + raw_->name() + " (in use " +
                           mib(stats_.in_use_bytes) + ", reserved " + mib(stats_.reserved_bytes) +
                           "): " + raw.status().message());
    }
    block = new Block{static_cast<char*>(raw.value()), seg_size, stream};
    block->segment_head = true;
    block->small = small;
    segments_.insert(block);
    ++stats_.raw_allocations;
    stats_.reserved_bytes += seg_size;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  }
  // Split off the remainder when it is worth keeping.
  if (block->size - size >= kAlignment) {
    auto* rest = new Block{block->ptr + size, block->size - size, stream};
    rest->small = block->small;
    rest->prev = block;
    rest->next = block->next;
    if (block->next) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    free_blocks_.insert(rest);
  }
  block->allocated = true;
  allocated_[block->ptr] = block;
  ++stats_.allocations;
  stats_.in_use_bytes += block->size;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return static_cast<void*>(block->ptr);
}

void CachingAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(static_cast<char*>(ptr));
  assert(it != allocated_.end() && "CachingAllocator::free of a pointer it did not allocate");
  if (it == allocated_.end()) return;
  Block* b = it->second;
  allocated_.erase(it);
  b->allocated = false;
  stats_.in_use_bytes -= b->size;
  // Merge with free neighbours (never across segments: links only exist within one).
  if (b->next && !b->next->allocated) {
    Block* n = b->next;
    free_blocks_.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  if (b->prev && !b->prev->allocated) {
    Block* p = b->prev;
    free_blocks_.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  free_blocks_.insert(b);
}

uint64_t CachingAllocator::trim_locked() {
  uint64_t released = 0;
  for (auto it = segments_.begin(); it != segments_.end();) {
    Block* head = *it;
    if (!head->allocated && head->next == nullptr) {  // the whole segment is one free block
      free_blocks_.erase(head);
      raw_->free(head->ptr);
      released += head->size;
      stats_.reserved_bytes -= head->size;
      ++stats_.raw_frees;
      delete head;
      it = segments_.erase(it);
    } else {
      ++it;
    }
  }
  return released;
}

uint64_t CachingAllocator::trim() {
  std::lock_guard<std::mutex> lock(mu_);
  return trim_locked();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  AllocatorStats s = stats_;
  s.cache_misses = s.allocations - s.cache_hits;
  s.segments = segments_.size();
  s.blocks_in_use = allocated_.size();
  s.free_blocks = free_blocks_.size();
  return s;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

StatusOr<void*> HostRawAllocator::allocate(uint64_t bytes, uint64_t alignment) {
  void* p = std::aligned_alloc(alignment < 64 ? 64 : alignment, round_up(bytes, alignment < 64 ? 64 : alignment));
  if (p == nullptr) return out_of_memory("aligned_alloc(" + std::to_string(bytes) + ") failed");
  return p;
}

void HostRawAllocator::free(void* ptr) { std::free(ptr); }

}  // namespace keel
