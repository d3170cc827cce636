// plugins/cuda/cuda_plugin.cc — the CUDA device plugin proper (libkeel_cuda_kernels.so, loaded by cuda_loader.cc once
// a device is found): the "cuda" device table over the CUDA runtime, and the registration of the plugin's kernels
// (cuda_ops.cc: own CUDA kernels; cuda_blas.cc: MatMul/Gemm via cuBLASLt; cuda_dnn.cc: convolution, pooling,
// BatchNormalization via cuDNN).
//
// Built against <keel/plugin.h> only (never core/ headers, never libkeel_core) plus the CUDA runtime, cuBLASLt, cuDNN,
// linked dynamically. keel_stream_t / keel_event_t are cudaStream_t / cudaEvent_t; a NULL stream is the legacy
// default stream of the device. Device memory comes from cudaMalloc on an explicit device (never managed memory);
// the core pools on top of it.
//
// Streams (the stream contract of plugin.h; the device declares KEEL_DEVICE_CAP_STREAMS). Each run of a session gets
// a non-blocking stream per device from d_stream_create; every kernel launches on the context's stream (Ctx::stream)
// and binds its pooled cuBLASLt / cuDNN handle to it per call, so compute returns as soon as its work is queued, with
// nothing synchronised per node. d_copy queues on the given stream: a host-to-device copy from pageable memory has
// read it when cudaMemcpyAsync returns (CUDA stages it); from pinned memory the stream is synchronised, because the
// caller may reuse the source at once. Device-to-host copies complete at stream_synchronize, which the core calls
// only where a result leaves the device. A NULL stream keeps the older promise: the copy is complete on return.
//
// Without a driver or a GPU, init returns UNAVAILABLE ("no CUDA device: cudaGetDeviceCount returned ..."): the
// plugin manager records the plugin as skipped with that reason and the process goes on with the CPU.
#include <dlfcn.h>

#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "cuda_common.h"
#include "cuda_device_probe.h"

namespace keel::cuda {

std::atomic<const keel_core_api_t*> g_host{nullptr};
namespace {
std::atomic<keel_plugin_handle_t*> g_plugin{nullptr};  // the handle of the last init, for log_line
}  // namespace

void log_line(int32_t level, const std::string& msg) {
  const keel_core_api_t* host = host_api();
  keel_plugin_handle_t* plugin = g_plugin.load(std::memory_order_acquire);
  if (host && plugin) host->log(plugin, level, msg.c_str());
}

keel_status_t make_status(int32_t code, const std::string& msg) { return host_api()->status_create(code, msg.c_str()); }

void check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  const int32_t code = e == cudaErrorMemoryAllocation ? KEEL_STATUS_OUT_OF_MEMORY : KEEL_STATUS_INTERNAL;
  throw Failure{code, std::string("cuda: ") + what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e)};
}

void* Ctx::workspace(uint64_t bytes) const {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (keel_status_t st = api()->workspace(raw(), bytes, &p)) {
    Failure f{st->code, std::string("cuda: workspace of ") + std::to_string(bytes) +
                            " bytes: " + (st->message ? st->message : "allocation failed")};
    keel_status_release(st);
    throw f;
  }
  return p;
}

namespace {

// ---------------------------------------------------------------------------------------------------------------
// The device table
// ---------------------------------------------------------------------------------------------------------------

keel_status_t cuda_error(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return nullptr;
  (void)cudaGetLastError();
  const int32_t code = e == cudaErrorMemoryAllocation ? KEEL_STATUS_OUT_OF_MEMORY : KEEL_STATUS_INTERNAL;
  return make_status(code, "cuda: " + what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

keel_status_t d_device_count(void*, int32_t* out_count) {
  *out_count = 0;
  std::string why = no_device_reason(out_count);
  if (!why.empty()) return make_status(KEEL_STATUS_UNAVAILABLE, why);
  return nullptr;
}

// A device's properties, asked of the runtime once per device (cudaGetDeviceProperties is a query of every attribute;
// they never change) and kept for the process. Thread-safe.
cudaError_t cached_properties(int32_t device, cudaDeviceProp* out) {
  static std::mutex mu;
  static std::unordered_map<int32_t, cudaDeviceProp> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(device);
  if (it == known.end()) {
    cudaDeviceProp prop;
    if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) return e;
    it = known.emplace(device, prop).first;
  }
  *out = it->second;
  return cudaSuccess;
}

// The free memory of `device`, without making a context there: only where its primary context is already active (this
// process works on it), read through the driver with that context pushed for the call, so the thread's current device
// stays as it was; 0 ("unknown", as plugin.h allows) otherwise. Before, cudaSetDevice(device) (which since CUDA 12
// starts the device's context) and back made a context, about half a GiB, on every GPU whose properties were asked:
// every device at environment creation, and device 0 in a rank working on device 1 (and each query cost a device
// switch). The driver's entries come from the libcuda the runtime already loaded (RTLD_NOLOAD): no link to it, so
// the plugin still loads where there is no driver.
uint64_t free_memory_if_active(int32_t device) {
  struct Driver {
    using Res = int;  // CUresult
    Res (*device_get)(int*, int) = nullptr;
    Res (*ctx_state)(int, unsigned*, int*) = nullptr;
    Res (*ctx_retain)(void**, int) = nullptr;
    Res (*ctx_release)(int) = nullptr;
    Res (*ctx_push)(void*) = nullptr;
    Res (*ctx_pop)(void**) = nullptr;
    Res (*mem_info)(size_t*, size_t*) = nullptr;
    bool ok = false;
  };
  static const Driver d = [] {
    Driver r;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) return r;
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
    };
    sym(r.device_get, "cuDeviceGet");
    sym(r.ctx_state, "cuDevicePrimaryCtxGetState");
    sym(r.ctx_retain, "cuDevicePrimaryCtxRetain");
    sym(r.ctx_release, "cuDevicePrimaryCtxRelease_v2");
    sym(r.ctx_push, "cuCtxPushCurrent_v2");
    sym(r.ctx_pop, "cuCtxPopCurrent_v2");
    sym(r.mem_info, "cuMemGetInfo_v2");
    r.ok = r.device_get && r.ctx_state && r.ctx_retain && r.ctx_release && r.ctx_push && r.ctx_pop && r.mem_info;
    return r;  // (the handle stays open: the runtime holds the library anyway)
  }();
  if (!d.ok) return 0;
  int dev = 0;
  unsigned flags = 0;
  int active = 0;
  if (d.device_get(&dev, device) != 0 || d.ctx_state(dev, &flags, &active) != 0 || !active) return 0;
  void* ctx = nullptr;
  if (d.ctx_retain(&ctx, dev) != 0) return 0;  // active already: a reference more, no new context
  size_t free_b = 0, total_b = 0;
  uint64_t got = 0;
  if (d.ctx_push(ctx) == 0) {
    if (d.mem_info(&free_b, &total_b) == 0) got = free_b;
    void* popped = nullptr;
    d.ctx_pop(&popped);
  }
  d.ctx_release(dev);
  return got;
}

keel_status_t d_get_properties(void*, int32_t device, keel_device_properties_t* p) {
  cudaDeviceProp prop;
  if (keel_status_t s = cuda_error(cached_properties(device, &prop), "cudaGetDeviceProperties")) return s;
  if (KEEL_HAS_MEMBER(p, keel_device_properties_t, name)) {
    std::strncpy(p->name, prop.name, sizeof(p->name) - 1);
    p->name[sizeof(p->name) - 1] = '\0';
  }
  if (KEEL_HAS_MEMBER(p, keel_device_properties_t, total_memory)) p->total_memory = prop.totalGlobalMem;
  if (KEEL_HAS_MEMBER(p, keel_device_properties_t, free_memory)) p->free_memory = free_memory_if_active(device);
  if (KEEL_HAS_MEMBER(p, keel_device_properties_t, capabilities)) {
    uint64_t caps = KEEL_DEVICE_CAP_F16 | KEEL_DEVICE_CAP_INT8 | KEEL_DEVICE_CAP_F64 | KEEL_DEVICE_CAP_ASYNC_COPY |
                    KEEL_DEVICE_CAP_PEER_COPY | KEEL_DEVICE_CAP_STREAMS;
    if (prop.major >= 8) caps |= KEEL_DEVICE_CAP_BF16;
    p->capabilities = caps;
  }
  if (KEEL_HAS_MEMBER(p, keel_device_properties_t, compute_major)) p->compute_major = prop.major;
  if (KEEL_HAS_MEMBER(p, keel_device_properties_t, compute_minor)) p->compute_minor = prop.minor;
  if (KEEL_HAS_MEMBER(p, keel_device_properties_t, multiprocessors)) p->multiprocessors = prop.multiProcessorCount;
  return nullptr;
}

keel_status_t d_allocate(void*, int32_t device, uint64_t bytes, uint64_t alignment, void** out) {
  *out = nullptr;
  if (alignment > 256)
    return make_status(KEEL_STATUS_INVALID_ARGUMENT,
                       "cuda: allocate: alignment " + std::to_string(alignment) + " > 256 (cudaMalloc's) unsupported");
  if (keel_status_t s = cuda_error(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")")) return s;
  cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    *out = nullptr;
    return cuda_error(e, "cudaMalloc(" + std::to_string(bytes) + " bytes on device " + std::to_string(device) + ")");
  }
  return nullptr;
}

void d_free(void*, int32_t device, void* ptr) {
  if (!ptr) return;
  cudaSetDevice(device);
  cudaFree(ptr);
  (void)cudaGetLastError();
}

keel_status_t d_allocate_pinned(void*, uint64_t bytes, void** out) {
  *out = nullptr;
  cudaError_t e = cudaMallocHost(out, bytes ? bytes : 1);
  if (e != cudaSuccess) *out = nullptr;
  return cuda_error(e, "cudaMallocHost(" + std::to_string(bytes) + " bytes)");
}
void d_free_pinned(void*, void* ptr) {
  if (ptr) cudaFreeHost(ptr);
  (void)cudaGetLastError();
}

keel_status_t d_copy(void*, int32_t kind, int32_t dst_device, void* dst, int32_t src_device, const void* src,
                     uint64_t bytes, keel_stream_t stream) {
  if (bytes == 0) return nullptr;
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  int32_t work_device = -1;
  cudaMemcpyKind k;
  switch (kind) {
    case KEEL_COPY_HOST_TO_DEVICE:
      k = cudaMemcpyHostToDevice;
      work_device = dst_device;
      break;
    case KEEL_COPY_DEVICE_TO_HOST:
      k = cudaMemcpyDeviceToHost;
      work_device = src_device;
      break;
    case KEEL_COPY_DEVICE_TO_DEVICE:
      k = cudaMemcpyDeviceToDevice;
      work_device = src_device;
      break;
    case KEEL_COPY_HOST_TO_HOST: k = cudaMemcpyHostToHost; break;
    default: return make_status(KEEL_STATUS_INVALID_ARGUMENT, "cuda: copy: unknown copy kind " + std::to_string(kind));
  }
  if (work_device >= 0)
    if (keel_status_t st = cuda_error(cudaSetDevice(work_device), "cudaSetDevice")) return st;
  cudaError_t e;
  // Between two cards on the NULL stream (eager's .to("cuda:1")): cudaMemcpyPeer, which CUDA orders after the work
  // queued on both devices (the destination block may still be read by the other card's queued kernels; a copy on
  // the source's default stream alone is not ordered against the other device). A given stream: the caller orders it
  // (session.cc copy_into makes it wait for the destination's stream first).
  if (kind == KEEL_COPY_DEVICE_TO_DEVICE && dst_device != src_device)
    e = s == nullptr ? cudaMemcpyPeer(dst, dst_device, src, src_device, bytes)
                     : cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, s);
  else e = cudaMemcpyAsync(dst, src, bytes, k, s);
  if (e == cudaSuccess && s == nullptr) {
    e = cudaStreamSynchronize(nullptr);  // the NULL stream: complete on return
  } else if (e == cudaSuccess && kind == KEEL_COPY_HOST_TO_DEVICE) {
    // Pinned (or registered) host memory is read asynchronously: the source must be read before we return.
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, src) == cudaSuccess && attr.type == cudaMemoryTypeHost) {
      e = cudaStreamSynchronize(s);
    } else {
      (void)cudaGetLastError();  // pageable memory: staged by CUDA, read when cudaMemcpyAsync returned
    }
  }
  return cuda_error(e, "copy of " + std::to_string(bytes) + " bytes");
}

keel_status_t d_stream_create(void*, int32_t device, keel_stream_t* out) {
  *out = nullptr;
  if (keel_status_t st = cuda_error(cudaSetDevice(device), "cudaSetDevice")) return st;
  cudaStream_t s = nullptr;
  if (keel_status_t st = cuda_error(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"))
    return st;
  *out = reinterpret_cast<keel_stream_t>(s);
  return nullptr;
}
void d_stream_release(void*, keel_stream_t stream) {
  if (stream) cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream));
  (void)cudaGetLastError();
}
keel_status_t d_stream_synchronize(void*, keel_stream_t stream) {
  return cuda_error(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}
// The device of every live event. A NULL stream is the legacy default stream of the calling thread's *current*
// device, so an event recorded on, or waited for by, the NULL stream (eager's default stream) sets the event's device
// first: a thread that has not touched the card yet (DataParallel's communication thread, on a rank whose LOCAL_RANK
// is 1) starts on device 0. So the NULL stream that waits is the one of the event's device (Keel makes no NULL
// stream wait for another card's event: sessions chained across cards wait on their own run streams).
std::mutex g_event_mu;
std::unordered_map<cudaEvent_t, int32_t> g_event_device;

keel_status_t set_event_device(cudaEvent_t ev) {
  int32_t device = -1;
  {
    std::lock_guard<std::mutex> lock(g_event_mu);
    auto it = g_event_device.find(ev);
    if (it != g_event_device.end()) device = it->second;
  }
  return device < 0 ? nullptr : cuda_error(cudaSetDevice(device), "cudaSetDevice");
}

keel_status_t d_event_create(void*, int32_t device, keel_event_t* out) {
  *out = nullptr;
  if (keel_status_t st = cuda_error(cudaSetDevice(device), "cudaSetDevice")) return st;
  cudaEvent_t ev = nullptr;
  if (keel_status_t st = cuda_error(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate"))
    return st;
  try {
    std::lock_guard<std::mutex> lock(g_event_mu);
    g_event_device[ev] = device;
  } catch (const std::bad_alloc&) {
    cudaEventDestroy(ev);
    return make_status(KEEL_STATUS_OUT_OF_MEMORY, "cuda: event bookkeeping");
  }
  *out = reinterpret_cast<keel_event_t>(ev);
  return nullptr;
}
void d_event_release(void*, keel_event_t ev) {
  if (!ev) return;
  {
    std::lock_guard<std::mutex> lock(g_event_mu);
    g_event_device.erase(reinterpret_cast<cudaEvent_t>(ev));
  }
  cudaEventDestroy(reinterpret_cast<cudaEvent_t>(ev));
  (void)cudaGetLastError();
}
keel_status_t d_event_record(void*, keel_event_t ev, keel_stream_t stream) {
  if (stream == nullptr)
    if (keel_status_t st = set_event_device(reinterpret_cast<cudaEvent_t>(ev))) return st;
  return cuda_error(cudaEventRecord(reinterpret_cast<cudaEvent_t>(ev), reinterpret_cast<cudaStream_t>(stream)),
                    "cudaEventRecord");
}
keel_status_t d_stream_wait_event(void*, keel_stream_t stream, keel_event_t ev) {
  if (stream == nullptr)
    if (keel_status_t st = set_event_device(reinterpret_cast<cudaEvent_t>(ev))) return st;
  return cuda_error(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), reinterpret_cast<cudaEvent_t>(ev), 0),
                    "cudaStreamWaitEvent");
}
keel_status_t d_event_synchronize(void*, keel_event_t ev) {
  return cuda_error(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(ev)), "cudaEventSynchronize");
}
keel_status_t d_device_synchronize(void*, int32_t device) {
  if (keel_status_t st = cuda_error(cudaSetDevice(device), "cudaSetDevice")) return st;
  return cuda_error(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// ---------------------------------------------------------------------------------------------------------------
// Kernels: the C edge
// ---------------------------------------------------------------------------------------------------------------

std::vector<KernelInfo>& all_kernels() {
  static std::vector<KernelInfo> v;
  return v;
}

// Host allocation failures at compute keep the plugin's name (sdk::current_outcome's `translate`).
bool host_oom(sdk::Stage stage, sdk::Outcome* out) {
  if (stage != sdk::Stage::kCompute) return false;
  try {
    throw;
  } catch (const std::bad_alloc&) {
    *out = {KEEL_STATUS_OUT_OF_MEMORY, "cuda: host allocation failed"};
    return true;
  } catch (...) {
    return false;
  }
}

keel_status_t kernel_create(void* user_data, keel_kernel_context_t* ctx, void** out_state) {
  const auto* info = static_cast<const KernelInfo*>(user_data);
  return sdk::guard(
      host_api(), sdk::Stage::kCreate,
      [&] {
        std::unique_ptr<Kernel> k(info->make());
        Ctx c(ctx);
        k->setup(c);
        *out_state = k.release();
      },
      std::string(info->name) + ": ");
}

keel_status_t kernel_compute(void* state, keel_kernel_context_t* ctx) {
  return sdk::guard(
      host_api(), sdk::Stage::kCompute,
      [&] {
        Ctx c(ctx);
        check_cuda(cudaSetDevice(c.device()), "cudaSetDevice");
        static_cast<Kernel*>(state)->run(c);
      },
      std::string(), host_oom);
}

void kernel_release(void* state) { delete static_cast<Kernel*>(state); }

keel_status_t cuda_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  if (!KEEL_HAS_MEMBER(host, keel_core_api_t, register_kernel) || host->kernel == nullptr ||
      !KEEL_HAS_MEMBER(host->kernel, keel_kernel_api_t, stream))
    return nullptr;  // a core too old to serve us: register nothing (recorded as "no device present")
  g_host.store(host, std::memory_order_release);
  g_plugin.store(plugin, std::memory_order_release);
  try {
    // Ask the runtime before registering anything: no driver / no GPU is a skip with the runtime's reason.
    int32_t count = 0;
    std::string why = no_device_reason(&count);
    if (!why.empty()) return make_status(KEEL_STATUS_UNAVAILABLE, why);

    keel_device_table_t t;
    std::memset(&t, 0, sizeof t);
    t.struct_size = sizeof t;
    t.abi_major = KEEL_PLUGIN_ABI_MAJOR;
    t.abi_minor = KEEL_PLUGIN_ABI_MINOR;
    t.device_type = "cuda";
    t.user_data = nullptr;
    t.device_count = d_device_count;
    t.get_properties = d_get_properties;
    t.allocate = d_allocate;
    t.free = d_free;
    t.allocate_pinned_host = d_allocate_pinned;
    t.free_pinned_host = d_free_pinned;
    t.copy = d_copy;
    t.stream_create = d_stream_create;
    t.stream_release = d_stream_release;
    t.stream_synchronize = d_stream_synchronize;
    t.event_create = d_event_create;
    t.event_release = d_event_release;
    t.event_record = d_event_record;
    t.stream_wait_event = d_stream_wait_event;
    t.event_synchronize = d_event_synchronize;
    t.device_synchronize = d_device_synchronize;
    t.claim_subgraphs = nullptr;
    if (keel_status_t st = host->register_device(plugin, &t)) return st;

    auto& kernels = all_kernels();
    kernels.clear();
    for (auto* list : {&elementwise_kernels, &blas_kernels, &dnn_kernels, &train_kernels})
      for (const auto& k : list()) kernels.push_back(k);
    for (auto& info : kernels) {
      keel_kernel_def_t def;
      std::memset(&def, 0, sizeof def);
      def.struct_size = sizeof def;
      def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
      def.abi_minor = KEEL_PLUGIN_ABI_MINOR;
      def.name = info.name;
      def.domain = info.domain ? info.domain : "";
      def.op_type = info.op_type;
      def.since_version = info.since_version;
      def.end_version = info.end_version;
      def.device_type = "cuda";
      def.constraints = nullptr;  // dtypes are checked in create (a rejection falls back to the CPU)
      def.constraint_count = 0;
      def.user_data = &info;
      def.create = kernel_create;
      def.compute = kernel_compute;
      def.release = kernel_release;
      if (keel_status_t st = host->register_kernel(plugin, &def)) return st;
    }
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    std::string msg = "cuda: " + std::to_string(count) + " device(s), runtime " + std::to_string(rt) + ", driver " +
                      std::to_string(drv) + ", " + std::to_string(kernels.size()) + " kernels";
    host->log(plugin, KEEL_LOG_INFO, msg.c_str());
    return nullptr;
  } catch (const std::exception& e) {
    return make_status(KEEL_STATUS_INTERNAL, std::string("cuda: init failed: ") + e.what());
  }
}

void cuda_shutdown() {
  blas_shutdown();
  dnn_shutdown();
  g_plugin.store(nullptr, std::memory_order_release);
  g_host.store(nullptr, std::memory_order_release);
}

const keel_plugin_t kCudaPlugin = {.struct_size = sizeof(keel_plugin_t),
                                   .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                   .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                                   .name = "cuda",
                                   .version = "0.1.0",
                                   .kind = KEEL_PLUGIN_KIND_DEVICE,
                                   .init = cuda_init,
                                   .shutdown = cuda_shutdown,
                                   .init_instance = nullptr,
                                   .shutdown_instance = nullptr};

}  // namespace
}  // namespace keel::cuda

// The plugin proper's descriptor, for the loader (cuda_loader.cc, libkeel_cuda.so) once it has found a device: this
// library is not a plugin of its own (no manifest names it, no keel_plugin_entry).
extern "C" KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_cuda_kernels_entry(void) { return &keel::cuda::kCudaPlugin; }
