// keel/core/runtime/host_api.h — the host side of the plugin ABI: the keel_core_api_t a plugin's init receives,
// and the per-plugin handle that attributes registrations to their plugin.
//
// One handle per plugin; it owns a copy of the host table whose plugin_options/plugin_dir are that plugin's. The
// handle must outlive every use of what the plugin registered (the Environment keeps handles until shutdown).
#pragma once

#include <keel/plugin.h>

#include <atomic>
#include <memory>
#include <string>

#include "core/base/log.h"
#include "core/base/options.h"
#include "core/base/registry.h"

struct keel_plugin_handle_s {
  // Null once the environment released a plugin without instances whose globals may still point at this handle
  // (the handle is kept until the last environment using that plugin goes; entries then answer "unavailable").
  std::atomic<keel::Registry*> registry{nullptr};
  std::atomic<const keel::log::Target*> log_target{nullptr};  // the environment's log (null: none, or released)
  keel::PluginId id = -1;
  int32_t priority = 0;
  std::string name;
  std::string dir;
  keel::Options options;
  keel_core_api_t api{};
};

namespace keel {

// A handle for plugin `id` whose registrations go to `registry` with `priority`.
std::unique_ptr<keel_plugin_handle_s> make_plugin_handle(Registry& registry, PluginId id, int32_t priority,
                                                         std::string name, std::string dir, Options options);

// The shared tables (also used by in-core code such as the executor and the pass manager).
const keel_kernel_api_t* kernel_api();
const keel_graph_api_t* graph_api();

}  // namespace keel
