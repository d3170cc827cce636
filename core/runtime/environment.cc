#include "core/runtime/environment.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <new>

#include "core/base/thread_pool.h"
#include "core/runtime/reference_device.h"
#include "hal/device.h"
#include "ops/schemas.h"

namespace keel {

StatusOr<std::unique_ptr<Environment>> Environment::create(EnvironmentOptions options) {
  ops::register_keel_schemas();  // before any model is loaded or shape-inferred
  std::unique_ptr<Environment> env(new Environment());
  env->options_ = options;
  env->log_target_ = std::make_unique<log::Target>(options.log_callback, options.log_min_level);
  log::Scope log_scope(env->log_target_.get());
  env->pool_ = std::make_unique<ThreadPool>(options.threads);
  env->plugins_ = std::make_unique<PluginManager>(env->registry_);
  env->plugins_->set_log_target(env->log_target_.get());
  env->plugins_->set_option_overrides(options.plugin_options);
  env->plugins_->load_builtin(reference_plugin(), 0, "portable reference kernels on the host CPU");
  for (const auto& b : options.builtin_plugins) env->plugins_->load_builtin(b.descriptor, b.priority, b.description);
  for (const auto& m : options.manifests) env->plugins_->load_manifest(m);
  for (const auto& l : options.libraries) env->plugins_->load_library(l);
  if (options.discover_plugins) env->plugins_->load_from(PluginManager::search_path(options.plugin_paths));
  for (const auto& [plugin, kv] : options.plugin_options) {
    bool found = false;
    for (const auto& p : env->plugins()) found = found || p.name == plugin;
    if (!found) log::warn("options were given for plugin '{}', which was not found", plugin);
  }
  if (!env->registry_.device("cpu")) {
    return internal_error("the built-in reference CPU device failed to load: " +
                          (env->plugins().empty() ? std::string("?") : env->plugins().front().reason));
  }
  for (const auto& p : env->plugins()) {
    if (p.state != PluginState::kLoaded) log::info("plugin {} {}: {}", p.name, plugin_state_name(p.state), p.reason);
  }
  return env;
}

Environment::~Environment() {
  log::Scope log_scope(log_target_.get());  // what plugins log at shutdown is this environment's
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
  auto a =
      std::make_unique<CachingAllocator>(std::make_unique<hal::DeviceRawAllocator>(hal::Device(dev, device_index)));
  CachingAllocator* raw = a.get();
  allocators_.emplace(key, std::move(a));
  return raw;
}

Status Environment::copy(void* dst, const Location& dst_at, const void* src, const Location& src_at, uint64_t bytes) {
  if (bytes == 0) return Status::ok();
  const std::string what =
      "copy " + std::to_string(bytes) + " bytes from " + src_at.to_string() + " to " + dst_at.to_string();
  if (src_at.is_host() && dst_at.is_host()) {
    std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  auto device_of = [&](const Location& at) -> StatusOr<hal::Device> {
    const DeviceEntry* d = registry_.device(at.device_type);
    if (d == nullptr) return not_found("no device type '" + at.device_type + "'");
    if (at.device_index < 0 || at.device_index >= d->device_count) {
      return Status(StatusCode::kOutOfRange,
                    at.to_string() + " does not exist (" + std::to_string(d->device_count) + " present)");
    }
    return hal::Device(d, at.device_index);
  };
  if (src_at.is_host()) {
    KEEL_ASSIGN_OR_RETURN(hal::Device dev, device_of(dst_at), what);
    return dev.copy(KEEL_COPY_HOST_TO_DEVICE, dst, dst_at.device_index, src, 0, bytes).with_context(what);
  }
  if (dst_at.is_host()) {
    KEEL_ASSIGN_OR_RETURN(hal::Device dev, device_of(src_at), what);
    return dev.copy(KEEL_COPY_DEVICE_TO_HOST, dst, 0, src, src_at.device_index, bytes).with_context(what);
  }
  KEEL_ASSIGN_OR_RETURN(hal::Device from, device_of(src_at), what);
  KEEL_ASSIGN_OR_RETURN(hal::Device to, device_of(dst_at), what);
  if (src_at.device_type == dst_at.device_type) {
    bool peer = src_at.device_index == dst_at.device_index;  // within one device: always the table's copy
    if (!peer) {
      auto props = from.properties();
      peer = props.is_ok() && (props.value().capabilities & KEEL_DEVICE_CAP_PEER_COPY) != 0;
    }
    if (peer) {
      return from.copy(KEEL_COPY_DEVICE_TO_DEVICE, dst, dst_at.device_index, src, src_at.device_index, bytes)
          .with_context(what);
    }
  }
  // Staged through the host: device -> host buffer -> device.
  std::unique_ptr<char[]> staging(new (std::nothrow) char[bytes]);
  if (!staging) return out_of_memory(what + ": no host staging buffer");
  KEEL_RETURN_IF_ERROR(from.copy(KEEL_COPY_DEVICE_TO_HOST, staging.get(), 0, src, src_at.device_index, bytes), what);
  KEEL_RETURN_IF_ERROR(to.copy(KEEL_COPY_HOST_TO_DEVICE, dst, dst_at.device_index, staging.get(), 0, bytes), what);
  return Status::ok();
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
