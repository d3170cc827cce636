#include "core/runtime/reference_device.h"

#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/base/host_memory.h"
#include "core/base/status.h"
#include "core/base/thread_pool.h"
#include "ops/reference/fused_kernels.h"
#include "ops/reference/grad_kernels.h"
#include "ops/reference/reference_kernels.h"

namespace keel {
namespace {

keel_status_t cpu_count(void*, int32_t* out) {
  *out = 1;
  return nullptr;
}
keel_status_t cpu_props(void*, int32_t device, keel_device_properties_t* p) {
  if (device != 0) return make_c_status(KEEL_STATUS_OUT_OF_RANGE, "the reference CPU device has only device 0");
  std::snprintf(p->name, sizeof p->name, "host CPU (reference kernels)");
  p->total_memory = 0;
  p->free_memory = 0;
  p->capabilities = KEEL_DEVICE_CAP_F16 | KEEL_DEVICE_CAP_BF16 | KEEL_DEVICE_CAP_INT8 | KEEL_DEVICE_CAP_F64 |
                    KEEL_DEVICE_CAP_UNIFIED_HOST_MEMORY;
  p->multiprocessors = static_cast<int32_t>(available_cpus());
  return nullptr;
}
// Host memory for the CPU device (the memory pools' segments: 2 MiB and multiples): from 2 MiB on in whole huge pages
// (core/base/host_memory.h).
keel_status_t cpu_alloc(void*, int32_t device, uint64_t bytes, uint64_t alignment, void** out) {
  *out = allocate_host_memory(bytes, alignment, uint64_t{2} << 20, true);
  if (*out == nullptr) {
    return make_c_status(KEEL_STATUS_OUT_OF_MEMORY, ("cannot allocate " + std::to_string(bytes) + " bytes").c_str());
  }
  return nullptr;
}
void cpu_free(void*, int32_t, void* p) { std::free(p); }
keel_status_t cpu_copy(void*, int32_t kind, int32_t, void* dst, int32_t, const void* src, uint64_t bytes,
                       keel_stream_t) {
  if (bytes) std::memcpy(dst, src, bytes);
  return nullptr;
}
keel_status_t cpu_sync(void*, int32_t) { return nullptr; }

keel_status_t reference_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  keel_device_table_t t{};
  t.struct_size = sizeof t;
  t.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  t.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  t.device_type = "cpu";
  t.device_count = cpu_count;
  t.get_properties = cpu_props;
  t.allocate = cpu_alloc;
  t.free = cpu_free;
  t.copy = cpu_copy;
  t.device_synchronize = cpu_sync;
  if (keel_status_t st = host->register_device(plugin, &t)) return st;
  if (keel_status_t st = ops::register_reference_kernels(host, plugin)) return st;
  if (keel_status_t st = ops::register_fused_reference_kernels(host, plugin)) return st;
  return ops::register_grad_reference_kernels(host, plugin);
}

const keel_plugin_t kReferencePlugin = {.struct_size = sizeof(keel_plugin_t),
                                        .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                        .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                                        .name = "reference",
                                        .version = "0.1.0",
                                        .kind = KEEL_PLUGIN_KIND_DEVICE,
                                        .init = reference_init,
                                        .shutdown = nullptr,
                                        .init_instance = nullptr,
                                        .shutdown_instance = nullptr};

}  // namespace

const keel_plugin_t* reference_plugin() { return &kReferencePlugin; }

}  // namespace keel
