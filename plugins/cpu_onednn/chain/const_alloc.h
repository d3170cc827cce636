// plugins/cpu_onednn/chain/const_alloc.h — (internal) the allocator of the chains' constant copies (ConstT's bytes,
// chain/recipe.h): a claim copies every initializer it reads (ResNet-50: 100 MB), the large ones into huge pages
// (common/host_memory.h). Stateless; thread-safe.
#pragma once

#include <cstddef>
#include <cstdlib>

#include "common/host_memory.h"

namespace keel::onednn::chain {

template <class T>
struct ConstAlloc {
  using value_type = T;
  ConstAlloc() = default;
  template <class U>
  ConstAlloc(const ConstAlloc<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(alloc_host(n * sizeof(T), alignof(T))); }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const ConstAlloc<U>&) const {
    return true;
  }
};

}  // namespace keel::onednn::chain
