#include "core/runtime/environment.h"

#include <spdlog/spdlog.h>

#include "core/base/thread_pool.h"
#include "core/runtime/reference_device.h"
#include "hal/device.h"
#include "ops/schemas.h"

namespace keel {


StatusOr<std::unique_ptr<Environment>> Environment::create(EnvironmentOptions options) {
  ops::register_keel_schemas();  // before any model is loaded or shape-inferred
  std::unique_ptr<Environment> env(new Environment());
  env->options_ = options;
  env->pool_ = std::make_unique<ThreadPool>(options.threads);
  env->plugins_ = std::make_unique<PluginManager>(env->registry_);
  env->plugins_->load_builtin(reference_plugin(), 0, "portable reference kernels on the host CPU");
  for (const auto& b : options.builtin_plugins) env->plugins_->load_builtin(b.descriptor, b.priority, b.description);
  for (const auto& m : options.manifests) env->plugins_->load_manifest(m);
  if (options.discover_plugins) env->plugins_->load_from(PluginManager::search_path(options.plugin_paths));
  if (!env->registry_.device("cpu")) {
    return internal_error("the built-in reference CPU device failed to load: " +
                          (env->plugins().empty() ? std::string("?") : env->plugins().front().reason));
  }
  for (const auto& p : env->plugins()) {
    if (p.state != PluginState::kLoaded) spdlog::info("plugin {} {}: {}", p.name, plugin_state_name(p.state), p.reason);
  }
  return env;
}

Environment::~Environment() {
  // Pools go before the plugins whose free() they call.
  allocators_.clear();
  plugins_.reset();
}

StatusOr<CachingAllocator*> Environment::allocator(const std::string& device_type, int32_t device_index) {
  std::string key = device_type + ":" + std::to_string(device_index);
  std::lock_guard<std::mutex> lock(alloc_mu_);
  auto it = allocators_.find(key);
  if (it != allocators_.end()) return it->second.get();
  const DeviceEntry* dev = registry_.device(device_type);
  if (dev == nullptr) return not_found("no device type '" + device_type + "'");
  if (device_index < 0 || device_index >= dev->device_count) {
    return Status(StatusCode::kOutOfRange, key + " does not exist (" + std::to_string(dev->device_count) + " present)");
  }
  auto a = std::make_unique<CachingAllocator>(std::make_unique<hal::DeviceRawAllocator>(hal::Device(dev, device_index)));
  CachingAllocator* raw = a.get();
  allocators_.emplace(key, std::move(a));
  return raw;
}

std::map<std::string, AllocatorStats> Environment::memory_stats() const {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  std::map<std::string, AllocatorStats> out;
  for (const auto& [k, a] : allocators_) out[k] = a->stats();
  return out;
}

uint64_t Environment::trim_memory() {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  uint64_t n = 0;
  for (auto& [k, a] : allocators_) n += a->trim();
  return n;
}

}  // namespace keel
