// plugins/cpu_onednn/common/scratchpad.cc — see common/scratchpad.h.
#include "common/scratchpad.h"

#include <cstdlib>
#include <memory>
#include <new>

namespace keel::onednn {

dnnl::primitive_attr user_scratchpad(dnnl::primitive_attr attr) {
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

namespace {

struct FreeAligned {
  void operator()(void* p) const { std::free(p); }
};

// The calling thread's scratchpad: grown on demand (never shrunk), 64-byte aligned, freed at thread exit.
void* thread_scratchpad(size_t bytes) {
  thread_local std::unique_ptr<void, FreeAligned> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (!p) throw std::bad_alloc();
    buffer.reset(p);
    capacity = rounded;
  }
  return buffer.get();
}

}  // namespace

void execute(const dnnl::primitive& prim, dnnl::stream& s, std::unordered_map<int, dnnl::memory>& args) {
  const_dnnl_primitive_desc_t pd = prim.get_primitive_desc();
  const dnnl_memory_desc_t* md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  const size_t bytes = md ? dnnl_memory_desc_get_size(md) : 0;
  if (bytes > 0) {
    void* buffer = thread_scratchpad(bytes);
    auto it = args.find(DNNL_ARG_SCRATCHPAD);
    if (it != args.end() && it->second.get_desc().get_size() == bytes) {
      it->second.set_data_handle(buffer);
    } else {
      dnnl_engine_t eng = nullptr;
      dnnl::error::wrap_c_api(dnnl_primitive_desc_query(pd, dnnl_query_engine, 0, &eng), "scratchpad engine");
      args[DNNL_ARG_SCRATCHPAD] = dnnl::memory(dnnl::memory::desc(*md), dnnl::engine(eng, true), buffer);
    }
  }
  prim.execute(s, args);
}

}  // namespace keel::onednn
