// Test plugins built in code: a device that needs no hardware, and plugin.h's descriptors with their ABI headers
// filled, so that a test states only what it is about (which device, which kernels) instead of repeating the C
// structs' boilerplate.
//
// FakeDevice: a device type whose memory is host memory (malloc), which the core treats as device memory, so every
// transfer is a copy through the table, counted by kind and logged with its device pair; `count` devices of the type,
// allocations counted per device. One object per plugin registration; it must outlive the environment that loaded
// the plugin (a namespace-scope object in the test file is the usual choice). Its counters are guarded by `mu` and
// may be read while runs go on. fake_relu is an f32 Relu kernel for such a device whose user_data is the
// FakeDevice (it counts its runs and checks that its tensors are on the context's device).
//
// Header-only, for tests (plugin.h's C ABI on one side, the test on the other).
#pragma once

#include <keel/plugin.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace keel::testkit {

using PluginInit = keel_status_t (*)(const keel_core_api_t*, keel_plugin_handle_t*);
using KernelCompute = keel_status_t (*)(void*, keel_kernel_context_t*);

// A device plugin's descriptor (ABI header filled) named `name` whose init is `init`.
inline keel_plugin_t device_plugin(const char* name, PluginInit init) {
  keel_plugin_t p{};
  p.struct_size = sizeof p;
  p.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  p.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  p.name = name;
  p.version = "1.0";
  p.kind = KEEL_PLUGIN_KIND_DEVICE;
  p.init = init;
  return p;
}

// A kernel definition (ABI header filled): `name` runs ONNX `op_type` from opset `since_version` on `device_type`.
// Set domain, constraints, create, release, flags and user_data on the result where a test needs them.
inline keel_kernel_def_t kernel_def(const char* name, const char* op_type, int32_t since_version,
                                    const char* device_type, KernelCompute compute) {
  keel_kernel_def_t k{};
  k.struct_size = sizeof k;
  k.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  k.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  k.name = name;
  k.op_type = op_type;
  k.since_version = since_version;
  k.device_type = device_type;
  k.compute = compute;
  return k;
}

struct FakeDevice {
  const char* type = "fake";
  int32_t count = 1;
  uint32_t capabilities = 0;              // keel_device_properties_t::capabilities (e.g. KEEL_DEVICE_CAP_PEER_COPY)
  const keel_core_api_t* host = nullptr;  // set by the test's init (fake_relu makes its statuses through it)

  std::mutex mu;                       // guards everything below
  std::map<std::string, int> copies;   // "H2D" / "D2H" / "D2D" / "H2H" -> count
  std::vector<std::string> copy_log;   // "H2D 0->1": kind, source device -> destination device
  std::map<int32_t, int> allocations;  // device index -> count
  std::map<int32_t, int> relu_runs;    // device index -> fake_relu runs

  // The device table (ABI header filled; user_data is this object).
  keel_device_table_t table() {
    keel_device_table_t t{};
    t.struct_size = sizeof t;
    t.abi_major = KEEL_PLUGIN_ABI_MAJOR;
    t.abi_minor = KEEL_PLUGIN_ABI_MINOR;
    t.device_type = type;
    t.user_data = this;
    t.device_count = [](void* self, int32_t* n) -> keel_status_t {
      *n = static_cast<FakeDevice*>(self)->count;
      return nullptr;
    };
    t.get_properties = [](void* self, int32_t device, keel_device_properties_t* p) -> keel_status_t {
      auto* d = static_cast<FakeDevice*>(self);
      if (device < 0 || device >= d->count)
        return d->host->status_create(KEEL_STATUS_OUT_OF_RANGE, "fake device: no such device index");
      std::snprintf(p->name, sizeof p->name, "%s device %d", d->type, device);
      p->capabilities = d->capabilities;
      return nullptr;
    };
    t.allocate = [](void* self, int32_t device, uint64_t bytes, uint64_t, void** out) -> keel_status_t {
      auto* d = static_cast<FakeDevice*>(self);
      {
        std::lock_guard<std::mutex> lock(d->mu);
        ++d->allocations[device];
      }
      *out = std::malloc(bytes ? bytes : 1);
      return *out ? nullptr : d->host->status_create(KEEL_STATUS_OUT_OF_MEMORY, "fake device: malloc failed");
    };
    t.free = [](void*, int32_t, void* p) { std::free(p); };
    t.copy = [](void* self, int32_t kind, int32_t dst_dev, void* dst, int32_t src_dev, const void* src, uint64_t n,
                keel_stream_t) -> keel_status_t {
      static const char* kinds[] = {"H2D", "D2H", "D2D", "H2H"};
      auto* d = static_cast<FakeDevice*>(self);
      {
        std::lock_guard<std::mutex> lock(d->mu);
        ++d->copies[kinds[kind & 3]];
        d->copy_log.push_back(std::string(kinds[kind & 3]) + " " + std::to_string(src_dev) + "->" +
                              std::to_string(dst_dev));
      }
      std::memcpy(dst, src, n);
      return nullptr;
    };
    return t;
  }

  int copies_of(const std::string& kind) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = copies.find(kind);
    return it == copies.end() ? 0 : it->second;
  }
  int total_copies() {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const auto& [k, v] : copies) n += v;
    return n;
  }
  int relu_runs_on(int32_t device) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = relu_runs.find(device);
    return it == relu_runs.end() ? 0 : it->second;
  }
  // Forgets every count and log entry.
  void reset_counts() {
    std::lock_guard<std::mutex> lock(mu);
    copies.clear();
    copy_log.clear();
    allocations.clear();
    relu_runs.clear();
  }
};

// Relu over f32 on a FakeDevice (the kernel's user_data): UNIMPLEMENTED for other dtypes, INTERNAL when a tensor is
// not on the context's device; counts its runs per device.
inline keel_status_t fake_relu(void* self, keel_kernel_context_t* ctx) {
  auto* d = static_cast<FakeDevice*>(self);
  const keel_kernel_api_t* k = d->host->kernel;
  const keel_tensor_t* x = k->input(ctx, 0);
  if (x->dtype != KEEL_DTYPE_F32) return d->host->status_create(KEEL_STATUS_UNIMPLEMENTED, "fake relu: f32 only");
  keel_tensor_t* y = nullptr;
  if (keel_status_t st = k->output(ctx, 0, x->ndim, x->dims, &y)) return st;
  const int32_t dev = k->device_index(ctx);
  if (x->device_index != dev || y->device_index != dev)
    return d->host->status_create(KEEL_STATUS_INTERNAL, "fake relu: tensors are not on the context's device");
  const float* in = static_cast<const float*>(x->data);
  float* out = static_cast<float*>(y->data);
  for (uint64_t i = 0; i < x->byte_size / 4; ++i) out[i] = in[i] > 0 ? in[i] : 0;
  std::lock_guard<std::mutex> lock(d->mu);
  ++d->relu_runs[dev];
  return nullptr;
}

}  // namespace keel::testkit
