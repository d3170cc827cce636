// keel/core/runtime/environment.h — one Keel runtime instance: plugins, registry, devices and their memory pools.
//
// Create one per process (or per embedding); sessions reference it and must not outlive it. After create() the
// environment is read-only except for the allocators (internally synchronised), so it may be shared across threads.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/allocator.h"
#include "core/base/device_spec.h"
#include "core/base/registry.h"
#include "core/base/status.h"
#include "core/base/tensor.h"
#include "core/runtime/plugin_manager.h"

namespace keel {

struct EnvironmentOptions {
  std::vector<std::filesystem::path> plugin_paths;  // searched before KEEL_PLUGIN_PATH and the defaults
  bool discover_plugins = true;                     // false: only the built-in reference device (and `manifests`)
  // Manifest files loaded one by one (PluginManager::load_manifest), after the built-ins and before discovery
  // (`keel plugin-test` loads exactly one plugin this way).
  std::vector<std::filesystem::path> manifests;
  int32_t threads = 0;                              // 0 = all cores
  // Plugins linked into the host (static descriptors), loaded after the reference device and before discovery.
  struct Builtin {
    const keel_plugin_t* descriptor;
    int32_t priority;
    std::string description;
  };
  std::vector<Builtin> builtin_plugins;
};

class ThreadPool;

class Environment {
 public:
  static StatusOr<std::unique_ptr<Environment>> create(EnvironmentOptions options = {});
  ~Environment();

  const Registry& registry() const { return registry_; }
  const std::vector<PluginRecord>& plugins() const { return plugins_->plugins(); }
  // The memory pool of one device (created on first use). NOT_FOUND / OUT_OF_RANGE for unknown devices.
  StatusOr<CachingAllocator*> allocator(const std::string& device_type, int32_t device_index = 0);
  StatusOr<CachingAllocator*> allocator(const DeviceSpec& device) { return allocator(device.type, device.index); }
  // Parses and checks a device spec ("cuda:1", "cpu") against the registered devices (DeviceSpec::resolve).
  StatusOr<DeviceSpec> device(std::string_view spec) const { return DeviceSpec::resolve(registry_, spec); }
  // Copies `bytes` bytes from `src` (memory at `src_at`) to `dst` (memory at `dst_at`); a location of type "cpu" is
  // host memory. Host <-> device goes through that device's table; two devices of one type through the table's
  // peer copy (KEEL_COPY_DEVICE_TO_DEVICE with both indices) when the source device reports
  // KEEL_DEVICE_CAP_PEER_COPY, else staged through a host buffer; two device types through a host buffer.
  // Synchronous as far as the host is concerned when it stages; otherwise ordered on the default streams.
  // Thread-safe (the device tables are).
  Status copy(void* dst, const Location& dst_at, const void* src, const Location& src_at, uint64_t bytes);
  // Statistics of every pool created so far, keyed "cpu:0", "cuda:0", ...
  std::map<std::string, AllocatorStats> memory_stats() const;
  // Trims every pool; returns bytes released.
  uint64_t trim_memory();
  ThreadPool& thread_pool() { return *pool_; }
  const EnvironmentOptions& options() const { return options_; }

 private:
  Environment() = default;
  EnvironmentOptions options_;
  Registry registry_;
  std::unique_ptr<PluginManager> plugins_;
  std::unique_ptr<ThreadPool> pool_;
  mutable std::mutex alloc_mu_;
  std::map<std::string, std::unique_ptr<CachingAllocator>> allocators_;
};

}  // namespace keel
