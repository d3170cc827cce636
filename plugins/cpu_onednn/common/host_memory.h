// plugins/cpu_onednn/common/host_memory.h — (internal) host memory for the plugin's large buffers (the weight
// arena's chunks, the constants' copies, the buffers a plan times convolutions over) in transparent huge pages.
//
// A fresh 4 KiB page costs 10-20 µs to fault in on the virtual machines measured, and a batch-1 network streams its
// weights from memory on every run (ResNet-50: 100 MB), where with 4 KiB pages every 4 KiB of that stream is a TLB
// miss and a stop for the hardware prefetcher (core/base/host_memory.h is the core's counterpart). Stateless and
// thread-safe.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace keel::onednn {

inline constexpr size_t kHugePage = size_t{2} << 20;

// `bytes` bytes (at least 1) of host memory: from `huge_from` bytes on 2 MiB-aligned, rounded up to whole 2 MiB and
// advised as transparent huge pages (madvise; advice only, ignored where THP is off), else 64-byte aligned. Not
// zero-filled. Free it with std::free. Null when it cannot be had.
inline void* alloc_host(size_t bytes, size_t huge_from) {
  const bool huge = bytes >= huge_from;
  const size_t align = huge ? kHugePage : 64;
  const size_t size = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
  void* p = nullptr;
  if (posix_memalign(&p, align, size) != 0) return nullptr;
  if (huge) madvise(p, size, MADV_HUGEPAGE);
  return p;
}

// Frees what alloc_host returned (a unique_ptr's deleter).
struct HostFree {
  void operator()(void* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<void, HostFree>;

// `bytes` zero-filled bytes of alloc_host memory, from 4 MiB on in huge pages (the buffers a plan times steps over).
// Throws std::bad_alloc when they cannot be had.
inline HostBuffer zeroed_host(size_t bytes) {
  HostBuffer p(alloc_host(bytes, 2 * kHugePage));
  if (!p) throw std::bad_alloc();
  std::memset(p.get(), 0, bytes);
  return p;
}

}  // namespace keel::onednn
