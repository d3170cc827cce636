// keel/core/runtime/plugin_manager.h — finds plugin manifests, loads plugin libraries, calls their init.
//
// Discovery: every `*.keel-plugin.toml` in each search directory (not recursive), directories in the order given
// (the Environment passes: API paths, then KEEL_PLUGIN_PATH entries, then ~/.local/lib/keel/plugins, then the
// install directory <exe>/../lib/keel/plugins), files within a directory in lexical order.
// Loading: Boost.DLL; the entry symbol KEEL_PLUGIN_ENTRY_SYMBOL; the descriptor's ABI major must equal ours and its
// name must equal the manifest's; then init(host, handle). Every failure is recorded on the plugin's record with a
// reason and the plugin is skipped (its registrations undone); nothing throws or aborts.
//
// Thread-safety: load_* are called once, at environment start-up, from one thread; plugins() may then be read
// concurrently. Destruction calls each loaded plugin's shutdown_instance with its instance (ABI 1.5), or, for a
// plugin without instances, its shutdown once the last PluginManager of the process that initialised it goes
// (reverse load order), and releases the libraries;
// the code of a plugin whose init succeeded stays mapped until the process ends (RTLD_NODELETE), since threads it
// started (an OpenMP pool, a driver's) may outlive it.
#pragma once

#include <keel/plugin.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/base/log.h"
#include "core/base/options.h"
#include "core/base/registry.h"
#include "core/base/status.h"

namespace keel {

enum class PluginState {
  kLoaded,   // init succeeded; what it registered is in use
  kSkipped,  // not used, for a reason that is not an error of the plugin (duplicate name, no device present)
  kFailed,   // the plugin or its manifest is broken (reason says how)
};
const char* plugin_state_name(PluginState s);  // "loaded", "skipped", "failed"

struct PluginRecord {
  PluginId id = -1;
  std::string name;  // from the manifest (or the file stem when the manifest cannot be read)
  std::string kind;  // "device" | "collective" | "pass" ("" when unknown)
  std::string version;
  std::string vendor;
  std::string description;
  int32_t priority = 0;
  std::filesystem::path manifest;  // absolute; empty for built-ins
  std::filesystem::path library;   // absolute; "(built-in)" for built-ins
  PluginState state = PluginState::kFailed;
  std::string reason;                               // empty when loaded
  std::string abi;                                  // the manifest's "MAJOR.MINOR" ("" for built-ins)
  std::map<std::string, std::string> requirements;  // the manifest's [requires] (shown, not enforced yet)
};

class PluginManager {
 public:
  explicit PluginManager(Registry& registry);
  ~PluginManager();
  PluginManager(const PluginManager&) = delete;
  PluginManager& operator=(const PluginManager&) = delete;

  // Registers a plugin linked into the core (the reference CPU device), through the same ABI checks and init.
  void load_builtin(const keel_plugin_t* descriptor, int32_t priority, const std::string& description);
  // Discovers and loads the manifests in `dirs` (missing directories are ignored).
  void load_from(const std::vector<std::filesystem::path>& dirs);
  // Loads one manifest file (keel plugin-test uses this).
  void load_manifest(const std::filesystem::path& manifest);
  // Loads one plugin library by path: with the manifest beside it that names it (any *.keel-plugin.toml in its
  // directory whose `library` is this file), else with a minimal manifest made from its descriptor (name, kind,
  // version and ABI of the descriptor; priority 0; no [options] but the host's). A path ending in .keel-plugin.toml
  // is load_manifest. Failures are recorded like those of discovered plugins.
  void load_library(const std::filesystem::path& library);
  // Options from the host, per plugin name, merged over each manifest's [options] (EnvironmentOptions::plugin_options).
  // Call before loading.
  void set_option_overrides(std::map<std::string, std::map<std::string, std::string>> overrides) {
    overrides_ = std::move(overrides);
  }
  // The log target the plugins' host tables log to (may be null). Call before loading.
  void set_log_target(const log::Target* target) { log_target_ = target; }

  const std::vector<PluginRecord>& plugins() const { return records_; }

  // The default search directories after `api_paths`: KEEL_PLUGIN_PATH (':'-separated), ~/.local/lib/keel/plugins,
  // <directory of the running executable>/../lib/keel/plugins, and <directory of libkeel.so>/keel/plugins (the
  // install directory as a host application linking libkeel sees it; omitted when it is the previous one).
  static std::vector<std::filesystem::path> search_path(const std::vector<std::filesystem::path>& api_paths);

 private:
  struct Loaded;
  // Calls init for a plugin whose descriptor passed the checks; keeps `loaded` on success, else undoes its
  // registrations (and unloads its library when `loaded` goes). Returns the record's state and reason.
  std::pair<PluginState, std::string> init_plugin(const PluginRecord& rec, std::unique_ptr<Loaded> loaded);

  // The host's options for plugin `name` merged into `options`; an error names the option that does not convert.
  std::string merge_overrides(const std::string& name, Options* options) const;
  // A handle for `rec` with `options` (after the host's overrides) and the log target.
  std::unique_ptr<keel_plugin_handle_s> handle_for(const PluginRecord& rec, const std::string& dir, Options options);

  Registry& registry_;
  std::map<std::string, std::map<std::string, std::string>> overrides_;
  const log::Target* log_target_ = nullptr;
  std::vector<PluginRecord> records_;
  std::vector<std::unique_ptr<Loaded>> loaded_;  // libraries and handles of loaded plugins, in load order
};

}  // namespace keel
