// keel/core/base/registry.h — what plugins registered: device tables, kernels, passes, collectives, claim hooks.
//
// Plugins register through the core API (keel_core_api_t, core/runtime/host_api.cc) while their init runs; the registry
// copies each definition (strings and constraint arrays) so a plugin's stack or static data may go away. Every entry
// remembers the plugin that made it (`plugin`) and that plugin's priority, so a plugin whose init fails can be undone
// (remove_plugin) and kernels can be ranked.
//
// Thread-safety: registration and removal happen during environment start-up, single-threaded. After start-up the
// registry is only read, and concurrent reads are safe (a device entry's host_memory_known cache is atomics).
#pragma once

#include <keel/plugin.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/base/dtype.h"
#include "core/base/status.h"

namespace keel {

using PluginId = int32_t;  // index of a plugin record in the environment's plugin list; -1 = the core itself

struct DeviceEntry {
  PluginId plugin = -1;
  int32_t priority = 0;
  std::string device_type;
  keel_device_table_t table{};  // copy; table.device_type points into device_type
  int32_t device_count = 0;
  // What hal::Device::host_memory() found per device index, filled on first use from any thread (0 not asked yet,
  // 1 no, 2 yes; device_count entries): a device's capabilities do not change, and eager asks on nearly every op
  // (a scalar's memory type), where the table's get_properties is a driver query (CUDA: cudaGetDeviceProperties).
  std::unique_ptr<std::atomic<int8_t>[]> host_memory_known;
};

struct KernelEntry {
  PluginId plugin = -1;
  int32_t priority = 0;
  std::string name, domain, op_type, device_type;
  int32_t since_version = 1;
  int32_t end_version = 0;  // 0 = open-ended
  struct Constraint {
    std::string name;
    std::vector<DType> dtypes;
  };
  std::vector<Constraint> constraints;
  keel_kernel_def_t def{};  // copy; string members point into the strings above

  bool covers_opset(int32_t opset) const {
    return opset >= since_version && (end_version == 0 || opset <= end_version);
  }
  // The dtypes allowed for a type parameter, or nullptr when unconstrained.
  const std::vector<DType>* allowed(const std::string& type_param) const;
};

struct PassEntry {
  PluginId plugin = -1;
  std::string name, description;
  keel_pass_def_t def{};
};

// A claim hook of a plugin without a device table of its own (keel_claimer_def_t, ABI 1.1).
struct ClaimerEntry {
  PluginId plugin = -1;
  int32_t priority = 0;
  std::string name, device_type;
  keel_claimer_def_t def{};  // copy; string members point into the strings above
};

struct CollectiveEntry {
  PluginId plugin = -1;
  std::string backend, device_type;
  keel_collective_table_t table{};
};

// "" and "ai.onnx" are the same domain.
std::string normalize_domain(const std::string& domain);

class Registry {
 public:
  Status add_device(PluginId plugin, int32_t priority, const keel_device_table_t* table);
  Status add_kernel(PluginId plugin, int32_t priority, const keel_kernel_def_t* def);
  Status add_pass(PluginId plugin, const keel_pass_def_t* def);
  Status add_collective(PluginId plugin, const keel_collective_table_t* table);
  Status add_claimer(PluginId plugin, int32_t priority, const keel_claimer_def_t* def);
  // Forgets everything `plugin` registered.
  void remove_plugin(PluginId plugin);

  // Kernels for (domain, op_type) at `opset` on `device_type`, best first (priority, then registration order).
  std::vector<const KernelEntry*> kernels_for(const std::string& domain, const std::string& op_type, int32_t opset,
                                              const std::string& device_type) const;
  // Devices of a type, best first. Device types in priority order.
  const DeviceEntry* device(const std::string& device_type) const;
  std::vector<std::string> device_types() const;
  const PassEntry* pass(const std::string& name) const;
  // Claim hooks for a device type, best first (priority, then registration order).
  std::vector<const ClaimerEntry*> claimers_for(const std::string& device_type) const;

  const std::vector<std::unique_ptr<DeviceEntry>>& devices() const { return devices_; }
  const std::vector<std::unique_ptr<KernelEntry>>& kernels() const { return kernels_; }
  const std::vector<std::unique_ptr<PassEntry>>& passes() const { return passes_; }
  const std::vector<std::unique_ptr<CollectiveEntry>>& collectives() const { return collectives_; }

 private:
  std::vector<std::unique_ptr<DeviceEntry>> devices_;
  std::vector<std::unique_ptr<KernelEntry>> kernels_;
  std::vector<std::unique_ptr<PassEntry>> passes_;
  std::vector<std::unique_ptr<CollectiveEntry>> collectives_;
  std::vector<std::unique_ptr<ClaimerEntry>> claimers_;
};

}  // namespace keel
