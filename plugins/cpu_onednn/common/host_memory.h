// plugins/cpu_onednn/common/host_memory.h — (internal) large host buffers on huge pages: the plugin's one place for
// it (the SDK has no allocator to lend; core's allocate_host_memory, core/base/tensor.h, is the same for the runtime).
// From kHugeFrom bytes on a buffer starts on a 2 MiB boundary and is advised to the kernel as transparent huge pages
// (madvise; advice only, ignored where THP is off): a fresh 4 KiB page costs 10-20 µs to fault in on the virtual
// machines measured, and a batch-1 network's weights stream from memory on every run, a TLB miss every 4 KiB.
// Stateless; thread-safe.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace keel::onednn {

inline constexpr size_t kHugePage = size_t{2} << 20;
inline constexpr size_t kHugeFrom = 2 * kHugePage;

// `bytes` of host memory, `alignment`-aligned (64 at least; 2 MiB from kHugeFrom on, the size then rounded up to
// whole 2 MiB pages), not zero-filled. Free it with std::free. Throws std::bad_alloc when it cannot be had.
inline void* alloc_host(size_t bytes, size_t alignment = 64) {
  alignment = std::max<size_t>(alignment, 64);
  const bool huge = bytes >= kHugeFrom && alignment <= kHugePage;
  if (huge) alignment = kHugePage;
  const size_t rounded = (std::max<size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  if (!p) throw std::bad_alloc();
  if (huge) madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

}  // namespace keel::onednn
