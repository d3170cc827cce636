// core/base/host_memory.h — (internal) host memory for large buffers, in transparent huge pages where it pays.
//
// On the virtual machines Keel is measured on, a fresh 4 KiB page costs 10-20 µs to fault in (`perf`: the
// hypervisor's interrupt window under every fault); writing a fresh 47 MB buffer took 124-149 ms in 4 KiB pages and
// 8.5-9 ms in huge pages (THP in `madvise` mode). Stateless and thread-safe.
#pragma once

#include <cstdint>

namespace keel {

// `bytes` bytes of host memory (at least 1), aligned to `alignment` (64 at least; a power of two up to 2 MiB); from
// `huge_from` bytes on it starts on a 2 MiB boundary and is advised to the kernel as transparent huge pages
// (madvise; advice only, ignored where THP is off). With `whole_huge_pages` such an allocation is also rounded up to
// whole 2 MiB, so that its last part can be a huge page too (at the cost of up to 2 MiB more, resident once written);
// otherwise its size is `bytes` rounded to `alignment`. Not zero-filled. Free it with std::free. Null when it cannot be
// had.
void* allocate_host_memory(uint64_t bytes, uint64_t alignment, uint64_t huge_from, bool whole_huge_pages);

}  // namespace keel
