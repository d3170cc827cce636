// plugins/cpu_onednn/chain/const_alloc.h — (internal) the allocator of the chains' constant copies (ConstT's bytes,
// chain/recipe.h). Stateless; thread-safe.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

#include "common/host_memory.h"

namespace keel::onednn::chain {

// The allocator of constants' host copies: from 4 MiB on in huge pages (common/host_memory.h). A claim copies every
// initializer it reads (ResNet-50: 100 MB).
template <class T>
struct ConstAlloc {
  using value_type = T;
  ConstAlloc() = default;
  template <class U>
  ConstAlloc(const ConstAlloc<U>&) {}
  T* allocate(size_t n) {
    void* p = alloc_host(n * sizeof(T), 2 * kHugePage);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const ConstAlloc<U>&) const {
    return true;
  }
};

}  // namespace keel::onednn::chain
