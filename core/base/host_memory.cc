// core/base/host_memory.cc — see core/base/host_memory.h.
#include "core/base/host_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

namespace keel {

void* allocate_host_memory(uint64_t bytes, uint64_t alignment, uint64_t huge_from, bool whole_huge_pages) {
  constexpr uint64_t kHuge = uint64_t{2} << 20;
  alignment = std::max<uint64_t>(alignment, 64);
  bytes = std::max<uint64_t>(bytes, 1);
  const bool huge = bytes >= huge_from && alignment <= kHuge;
  const uint64_t round_to = huge && whole_huge_pages ? kHuge : alignment;
  const uint64_t size = (bytes + round_to - 1) / round_to * round_to;
  void* p = nullptr;
  if (posix_memalign(&p, huge ? kHuge : alignment, size) != 0) return nullptr;
  if (huge) madvise(p, size, MADV_HUGEPAGE);  // advice only: its failure changes nothing
  return p;
}

}  // namespace keel
