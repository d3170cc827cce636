// keel/core/runtime/environment.h — one Keel runtime instance: plugins, registry, devices and their memory pools.
//
// Create one per process (or per embedding); sessions reference it and must not outlive it. After create() the
// environment is read-only except for the allocators (internally synchronised), so it may be shared across threads.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/base/allocator.h"
#include "core/base/registry.h"
#include "core/base/status.h"
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
