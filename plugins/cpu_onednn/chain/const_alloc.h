// plugins/cpu_onednn/chain/const_alloc.h — (internal) the allocator of the chains' constant copies (ConstT's bytes,
// chain/recipe.h). Stateless; thread-safe.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace keel::onednn::chain {

// The allocator of constants' host copies: from 4 MiB on 2 MiB-aligned and advised as transparent huge pages (madvise;
// advice only). A claim copies every initializer it reads (ResNet-50: 100 MB), and a fresh 4 KiB page costs 10-20 us
// to fault in on the virtual machines measured (core/base/tensor.h, Storage::allocate_host).
template <class T>
struct ConstAlloc {
  using value_type = T;
  ConstAlloc() = default;
  template <class U>
  ConstAlloc(const ConstAlloc<U>&) {}
  T* allocate(size_t n) {
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t bytes = n * sizeof(T);
    if (bytes < 2 * kHuge) return std::allocator<T>().allocate(n);
    void* p = std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
    if (!p) throw std::bad_alloc();
    madvise(p, bytes, MADV_HUGEPAGE);
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) < 2 * (size_t{2} << 20)) return std::allocator<T>().deallocate(p, n);
    std::free(p);
  }
  template <class U>
  bool operator==(const ConstAlloc<U>&) const {
    return true;
  }
};

}  // namespace keel::onednn::chain
