// keel/core/runtime/environment.h — one Keel runtime instance: plugins, registry, devices and their memory pools.
//
// Create one per process (or per embedding); sessions reference it and must not outlive it. After create() the
// environment is read-only except for the allocators (internally synchronised), so it may be shared across threads.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/allocator.h"
#include "core/base/device_spec.h"
#include "core/base/log.h"
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
  int32_t threads = 0;  // 0 = all cores
  // Plugins linked into the host (static descriptors), loaded after the reference device and before discovery.
  struct Builtin {
    const keel_plugin_t* descriptor;
    int32_t priority;
    std::string description;
  };
  std::vector<Builtin> builtin_plugins;
  // Plugin libraries loaded by path (PluginManager::load_library: a library with its manifest beside it, or a
  // minimal manifest made from its descriptor; a path to a manifest loads that manifest), after `manifests` and
  // before discovery, so they win over a discovered plugin of the same name.
  std::vector<std::filesystem::path> libraries;
  // Options for plugins from the host: plugin name -> key -> value (text), merged over the manifest's [options]
  // (converted to the type the manifest gives the key; a key the manifest lacks is an integer, a float, a boolean
  // or a string, whichever the text reads as). A plugin whose option does not convert fails to load, naming it.
  std::map<std::string, std::map<std::string, std::string>> plugin_options;
  // This environment's log (keel::log): the callback receives Keel's messages of this environment at min_level
  // (keel_log_level_t) and above, and nothing else sees them. Empty: spdlog's default logger, as the CLI uses.
  std::function<void(int32_t level, const std::string& message)> log_callback;
  int32_t log_min_level = 2;  // KEEL_LOG_INFO
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
  // This environment's log target (never null): hold a log::Scope on it while working for this environment.
  const log::Target* log_target() const { return log_target_.get(); }

 private:
  Environment() = default;
  EnvironmentOptions options_;
  std::unique_ptr<log::Target> log_target_;  // before plugins_: the plugins' handles point at it
  Registry registry_;
  std::unique_ptr<PluginManager> plugins_;
  std::unique_ptr<ThreadPool> pool_;
  mutable std::mutex alloc_mu_;
  std::map<std::string, std::unique_ptr<CachingAllocator>> allocators_;
};

}  // namespace keel
