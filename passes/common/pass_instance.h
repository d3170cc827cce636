// passes/common/pass_instance.h — a pass plugin's per-environment state (plugin ABI 1.5 instances), for the pass
// plugins of this folder. Include it from the plugin's one source file.
//
// Each environment that loads a pass plugin gets its own PassInstance (its host table and plugin handle) from
// init_pass_instance, and each pass is registered with a binding of that instance as user_data and bound_run as its
// entry. bound_run sets this thread's g_host / g_plugin to the binding's environment for the duration of the run, so
// the pass bodies keep reading `g_host` and `g_plugin` and a pass asking the core about kernels (kernel_exists,
// kernel_priority) asks its own environment's registry. (With one global set by each environment's init, a pass run
// by one environment queried the registry of whichever environment had initialised last, racing with its
// registrations: ThreadSanitizer, Embedding.EnvironmentsWithTheirOwnOptionsOnSeveralThreadsAtOnce.)
//
// Thread-safety: runs of different environments on different threads each see their own g_host / g_plugin
// (thread-local); the instance is read-only after init_pass_instance.
#pragma once

#include <keel/plugin.h>

#include <cstddef>
#include <deque>
#include <memory>

namespace keel::passes {
namespace {  // internal linkage: the plugin's own copy (one source file per pass plugin)

using PassRun = keel_status_t (*)(void*, keel_graph_t*, const keel_graph_api_t*, const keel_options_t*, const char*,
                                  keel_pass_report_t*);

struct PassSpec {
  const char* name;
  const char* description;
  PassRun run;
};

struct PassInstance {
  struct Binding {
    const PassInstance* instance;
    PassRun run;
  };
  const keel_core_api_t* host = nullptr;
  keel_plugin_handle_t* handle = nullptr;
  std::deque<Binding> bindings;  // stable addresses: the passes' user_data
};

// The environment of the pass this thread is running (set by bound_run).
thread_local const keel_core_api_t* g_host = nullptr;
thread_local keel_plugin_handle_t* g_plugin = nullptr;

keel_status_t bound_run(void* user_data, keel_graph_t* graph, const keel_graph_api_t* api,
                        const keel_options_t* options, const char* name, keel_pass_report_t* report) {
  const auto* b = static_cast<const PassInstance::Binding*>(user_data);
  const keel_core_api_t* previous_host = g_host;
  keel_plugin_handle_t* previous_plugin = g_plugin;
  g_host = b->instance->host;
  g_plugin = b->instance->handle;
  keel_status_t status = b->run(nullptr, graph, api, options, name, report);
  g_host = previous_host;
  g_plugin = previous_plugin;
  return status;
}

// The plugin's init_instance: registers `passes` for this environment. A core with another ABI major or without the
// options API is told so (ABI_MISMATCH), as is one that `missing` (when given) finds lacking: it returns what is
// missing, or NULL.
template <size_t N>
keel_status_t init_pass_instance(const keel_core_api_t* host, keel_plugin_handle_t* plugin, void** out_instance,
                                 const PassSpec (&passes)[N],
                                 const char* (*missing)(const keel_core_api_t*) = nullptr) {
  if (host == nullptr) return nullptr;
  if (host->abi_major != KEEL_PLUGIN_ABI_MAJOR || !KEEL_HAS_MEMBER(host, keel_core_api_t, options))
    return host->status_create(KEEL_STATUS_ABI_MISMATCH, "core API too old");
  if (const char* what = missing ? missing(host) : nullptr) return host->status_create(KEEL_STATUS_ABI_MISMATCH, what);
  auto instance = std::make_unique<PassInstance>();
  instance->host = host;
  instance->handle = plugin;
  for (const PassSpec& spec : passes) {
    keel_pass_def_t p{};
    p.struct_size = sizeof p;
    p.abi_major = KEEL_PLUGIN_ABI_MAJOR;
    p.abi_minor = KEEL_PLUGIN_ABI_MINOR;
    p.name = spec.name;
    p.description = spec.description;
    p.user_data = &instance->bindings.emplace_back(PassInstance::Binding{instance.get(), spec.run});
    p.run = bound_run;
    if (keel_status_t st = host->register_pass(plugin, &p)) return st;
  }
  *out_instance = instance.release();
  return nullptr;
}

void shutdown_pass_instance(void* instance) { delete static_cast<PassInstance*>(instance); }

}  // namespace
}  // namespace keel::passes
