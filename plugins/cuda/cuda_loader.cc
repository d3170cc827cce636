// plugins/cuda/cuda_loader.cc — libkeel_cuda.so, the library the "cuda" manifest names: asks the CUDA runtime for a
// device and only then loads the plugin proper, libkeel_cuda_kernels.so (cuda_plugin.cc and the kernels), from its own
// directory, handing init and shutdown through to it.
//
// Why: loading cuBLASLt runs its static initialisers, 0.3 s of every process that discovers the plugin (measured on
// the 2-vCPU development host: `python3 -c "import ctypes; ctypes.CDLL('libcublasLt.so.13')"` 0.298 s, libcudart 0.001,
// libcudnn 0.002), on machines without a GPU as much as on those with one: every `keel` command, every rank of a
// data-parallel job, every test that starts a process, every environment a host application creates. This library
// links the CUDA runtime alone; without a driver or a GPU, init returns UNAVAILABLE with the runtime's reason (as the
// plugin proper would) and cuBLASLt / cuDNN are never loaded.
//
// Built against <keel/plugin.h> only, as the plugin proper. The plugin proper is never unloaded (cuBLASLt and cuDNN
// keep process-wide state): a later environment's init loads it again, which finds the loaded copy.
// Thread-safety: the core calls init / shutdown of one plugin for one environment at a time; the pointers they share
// are atomic, since kernels of other environments may run meanwhile.
#include <dlfcn.h>
#include <keel/plugin.h>

#include <atomic>
#include <string>

#include "cuda_device_probe.h"

namespace {

constexpr const char* kKernelsLibrary = "libkeel_cuda_kernels.so";
constexpr const char* kKernelsEntry = "keel_cuda_kernels_entry";  // not keel_plugin_entry: not a plugin of its own

std::atomic<const keel_plugin_t*> g_kernels{nullptr};  // the plugin proper's descriptor, once loaded

keel_status_t unavailable(const keel_core_api_t* host, const std::string& why) {
  return host->status_create(KEEL_STATUS_UNAVAILABLE, why.c_str());
}

// This library's directory, with a trailing '/' ("" when the loader cannot tell: then the search path decides).
std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&own_directory), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
}

keel_status_t loader_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  const std::string why = keel::cuda::no_device_reason();
  if (!why.empty()) return unavailable(host, why);
  const std::string path = own_directory() + kKernelsLibrary;
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    return unavailable(
        host, "cuda: a CUDA device is present but " + path + " does not load: " + (err ? err : "unknown dlopen error"));
  }
  auto entry = reinterpret_cast<keel_plugin_entry_fn>(dlsym(lib, kKernelsEntry));
  const keel_plugin_t* kernels = entry ? entry() : nullptr;
  if (kernels == nullptr || kernels->init == nullptr)
    return unavailable(host, "cuda: " + path + " has no " + kKernelsEntry + " with an init");
  g_kernels.store(kernels, std::memory_order_release);
  return kernels->init(host, plugin);
}

void loader_shutdown() {
  const keel_plugin_t* kernels = g_kernels.load(std::memory_order_acquire);
  if (kernels && kernels->shutdown) kernels->shutdown();
}

const keel_plugin_t kLoader = {.struct_size = sizeof(keel_plugin_t),
                               .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                               .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                               .name = "cuda",
                               .version = "0.1.0",
                               .kind = KEEL_PLUGIN_KIND_DEVICE,
                               .init = loader_init,
                               .shutdown = loader_shutdown,
                               .init_instance = nullptr,
                               .shutdown_instance = nullptr};

}  // namespace

extern "C" KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &kLoader; }
