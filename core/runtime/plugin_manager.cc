// keel/core/runtime/plugin_manager.cc — discovery of plugin manifests, loading of plugin libraries, init.
//
// The manifest: one `NAME.keel-plugin.toml` beside the plugin's library (also documented in plugins/null/README.md).
//
//   name = "null"                  # required, string; must equal the descriptor's name
//   kind = "device"                # required: device | collective | pass (must equal the descriptor's kind)
//   library = "libkeel_null.so"    # required, relative to the manifest's directory (absolute allowed)
//   abi = "1.0"                    # required, "MAJOR.MINOR"; MAJOR must equal KEEL_PLUGIN_ABI_MAJOR (checked before
//                                  #   the library is loaded; the descriptor's abi_major is checked again after)
//   version = "0.1.0"              # optional string (the descriptor's version when absent)
//   vendor = "Keel"                # optional string
//   description = "..."            # optional string
//   priority = 10                  # optional integer (default 0); higher wins among kernels for one device type;
//                                  #   the built-in reference device has 0
//   [requires]                     # optional table of strings, e.g. cuda = ">=12.0" (recorded and shown; not
//                                  #   enforced yet)
//   [options]                      # optional table of integers, floats, booleans, strings and arrays of strings;
//                                  #   the plugin reads it through keel_core_api_t.plugin_options
//
// Unknown keys are allowed (a newer ABI minor may add keys). A known key of the wrong type is an error that names
// the key, the expected type and the file.
//
// Order of checks for one manifest (each failure ends the attempt with a recorded reason; nothing throws):
//   TOML syntax -> required keys and types -> duplicate name (skipped) -> manifest ABI -> library exists ->
//   dlopen (dlerror text: missing dependency, not an ELF file, undefined symbol) -> entry symbol -> descriptor
//   (non-NULL, size, ABI major, name, kind, init) -> init (error status -> failed, UNAVAILABLE -> skipped; an
//   exception -> failed) -> a device plugin must end up with a device (else skipped: no device present).
//
// A plugin whose init failed has its registrations undone and its library unloaded; its shutdown is not called
// (init failing means it cleaned up after itself). A plugin skipped after a successful init (no device present)
// has its registrations undone, then shutdown called, then its library unloaded. (ABI 1.5) "shutdown" is
// shutdown_instance(instance) for a plugin with instances; for one without, shutdown runs only when no other
// PluginManager (environment) of the process has that plugin initialised, and the host tables it was given stay
// allocated (their registry cleared) until then, since its globals may point at any of them.
//
// Libraries are opened with RTLD_NOW | RTLD_LOCAL: with lazy binding an unresolved function would abort the process
// on its first call ("symbol lookup error"); with RTLD_NOW it is a load failure with the symbol's name.
#include "core/runtime/plugin_manager.h"

#include <dlfcn.h>

#include <toml++/toml.h>
#include <boost/dll/shared_library.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <variant>

#include "core/base/options.h"
#include "core/runtime/host_api.h"

namespace fs = std::filesystem;

namespace keel {

const char* plugin_state_name(PluginState s) {
  switch (s) {
    case PluginState::kLoaded: return "loaded";
    case PluginState::kSkipped: return "skipped";
    case PluginState::kFailed: return "failed";
  }
  return "unknown";
}

struct PluginManager::Loaded {
  PluginId id = -1;
  const keel_plugin_t* descriptor = nullptr;
  std::unique_ptr<keel_plugin_handle_s> handle;  // the host table the plugin received; outlives its registrations
  boost::dll::shared_library library;            // not loaded for built-ins
  bool has_instance = false;                     // initialised with init_instance (ABI 1.5)
  void* instance = nullptr;                      // what init_instance returned, for shutdown_instance
};

namespace {

constexpr std::string_view kManifestSuffix = ".keel-plugin.toml";

// A failed step: the record's state and reason.
struct Outcome {
  PluginState state = PluginState::kLoaded;
  std::string reason;
  bool ok() const { return state == PluginState::kLoaded; }
};
Outcome failed(std::string reason) { return {PluginState::kFailed, std::move(reason)}; }
Outcome skipped(std::string reason) { return {PluginState::kSkipped, std::move(reason)}; }

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// "foo" for ".../foo.keel-plugin.toml"; the record's name when the manifest cannot be read.
std::string manifest_stem(const fs::path& manifest) {
  std::string file = manifest.filename().string();
  if (ends_with(file, kManifestSuffix)) return file.substr(0, file.size() - kManifestSuffix.size());
  return manifest.stem().string();
}

const char* kind_name(int32_t kind) {
  switch (kind) {
    case KEEL_PLUGIN_KIND_DEVICE: return "device";
    case KEEL_PLUGIN_KIND_COLLECTIVE: return "collective";
    case KEEL_PLUGIN_KIND_PASS: return "pass";
  }
  return "";
}

// "an integer", "a string", ... for messages about wrong types.
const char* toml_type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::none: return "nothing";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
  }
  return "an unknown type";
}

std::string where(const fs::path& file, const toml::node& node) {
  std::string s = file.string();
  const auto& begin = node.source().begin;
  if (begin.line != 0) s += ":" + std::to_string(begin.line);
  return s;
}

std::string wrong_type(std::string_view key, const char* expected, const toml::node& node, const fs::path& file) {
  return "manifest key '" + std::string(key) + "' must be " + expected + ", not " + toml_type_name(node.type()) +
         ", in " + where(file, node);
}

struct Manifest {
  std::string name, kind, library, abi, version, vendor, description;
  int64_t priority = 0;
  int abi_major = -1, abi_minor = -1;
  std::map<std::string, std::string> requirements;
  Options options;
};

// Reads string key `key` into *out. Missing: error when required, else untouched.
Outcome read_string(const toml::table& t, std::string_view key, bool required, std::string* out, const fs::path& file) {
  const toml::node* n = t.get(key);
  if (n == nullptr) {
    if (required) return failed("manifest key '" + std::string(key) + "' (a string) is missing in " + file.string());
    return {};
  }
  const auto* s = n->as_string();
  if (s == nullptr) return failed(wrong_type(key, "a string", *n, file));
  *out = s->get();
  return {};
}

// "MAJOR.MINOR" with decimal digits only.
bool parse_abi(const std::string& s, int* major, int* minor) {
  size_t dot = s.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 >= s.size()) return false;
  auto digits = [](std::string_view v) {
    return !v.empty() && v.size() <= 6 && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  std::string_view a(s.data(), dot), b(s.data() + dot + 1, s.size() - dot - 1);
  if (!digits(a) || !digits(b)) return false;
  *major = std::stoi(std::string(a));
  *minor = std::stoi(std::string(b));
  return true;
}

Outcome read_options(const toml::table& t, const fs::path& file, Options* out) {
  for (const auto& [key, node] : t) {
    std::string k(key.str());
    std::string full = "options." + k;
    switch (node.type()) {
      case toml::node_type::integer: out->values[k] = node.as_integer()->get(); break;
      case toml::node_type::floating_point: out->values[k] = node.as_floating_point()->get(); break;
      case toml::node_type::boolean: out->values[k] = node.as_boolean()->get(); break;
      case toml::node_type::string: out->values[k] = node.as_string()->get(); break;
      case toml::node_type::array: {
        std::vector<std::string> list;
        for (const auto& elem : *node.as_array()) {
          const auto* s = elem.as_string();
          if (s == nullptr) return failed(wrong_type(full, "an array of strings", elem, file));
          list.push_back(s->get());
        }
        out->values[k] = std::move(list);
        break;
      }
      default:
        return failed(wrong_type(full, "an integer, a float, a boolean, a string or an array of strings", node, file));
    }
  }
  return {};
}

// Parses and validates a manifest. Fills what it could read even on failure (so the record shows the name).
Outcome parse_manifest(const fs::path& file, Manifest* m) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return failed("cannot read manifest " + file.string() + ": " + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  toml::table root;
#if TOML_EXCEPTIONS
  try {
    root = toml::parse(text, file.string());
  } catch (const toml::parse_error& e) {
    const auto& pos = e.source().begin;
    return failed("TOML parse error in " + file.string() + ":" + std::to_string(pos.line) + ":" +
                  std::to_string(pos.column) + ": " + one_line(std::string(e.description())));
  }
#else
  toml::parse_result result = toml::parse(text, file.string());
  if (!result) {
    const auto& e = result.error();
    const auto& pos = e.source().begin;
    return failed("TOML parse error in " + file.string() + ":" + std::to_string(pos.line) + ":" +
                  std::to_string(pos.column) + ": " + one_line(std::string(e.description())));
  }
  root = std::move(result).table();
#endif

  Outcome o;
  // The name first, so that later failures are shown under it.
  if (o = read_string(root, "name", true, &m->name, file); !o.ok()) return o;
  if (m->name.empty()) return failed("manifest key 'name' is empty in " + file.string());
  if (o = read_string(root, "kind", true, &m->kind, file); !o.ok()) return o;
  if (o = read_string(root, "library", true, &m->library, file); !o.ok()) return o;
  if (o = read_string(root, "abi", true, &m->abi, file); !o.ok()) return o;
  if (o = read_string(root, "version", false, &m->version, file); !o.ok()) return o;
  if (o = read_string(root, "vendor", false, &m->vendor, file); !o.ok()) return o;
  if (o = read_string(root, "description", false, &m->description, file); !o.ok()) return o;

  if (m->kind != "device" && m->kind != "collective" && m->kind != "pass") {
    std::string kind = m->kind;
    m->kind.clear();
    return failed("manifest key 'kind' must be one of device, collective, pass (got '" + kind + "') in " +
                  file.string());
  }
  if (m->library.empty()) return failed("manifest key 'library' is empty in " + file.string());
  if (!parse_abi(m->abi, &m->abi_major, &m->abi_minor)) {
    return failed("manifest key 'abi' must be a \"MAJOR.MINOR\" string such as \"" +
                  std::to_string(KEEL_PLUGIN_ABI_MAJOR) + "." + std::to_string(KEEL_PLUGIN_ABI_MINOR) + "\" (got \"" +
                  m->abi + "\") in " + file.string());
  }

  if (const toml::node* n = root.get("priority")) {
    const auto* i = n->as_integer();
    if (i == nullptr) return failed(wrong_type("priority", "an integer", *n, file));
    int64_t p = i->get();
    if (p < std::numeric_limits<int32_t>::min() || p > std::numeric_limits<int32_t>::max()) {
      return failed("manifest key 'priority' is out of the 32-bit range (" + std::to_string(p) + ") in " +
                    where(file, *n));
    }
    m->priority = p;
  }

  if (const toml::node* n = root.get("requires")) {
    const auto* t = n->as_table();
    if (t == nullptr) return failed(wrong_type("requires", "a table of strings", *n, file));
    for (const auto& [key, value] : *t) {
      std::string k(key.str());
      const auto* s = value.as_string();
      if (s == nullptr) return failed(wrong_type("requires." + k, "a string", value, file));
      m->requirements[k] = s->get();
    }
  }

  if (const toml::node* n = root.get("options")) {
    const auto* t = n->as_table();
    if (t == nullptr) return failed(wrong_type("options", "a table", *n, file));
    if (o = read_options(*t, file, &m->options); !o.ok()) return o;
  }
  return {};
}

std::string abi_string(int major, int minor) { return std::to_string(major) + "." + std::to_string(minor); }

std::string core_abi() { return abi_string(KEEL_PLUGIN_ABI_MAJOR, KEEL_PLUGIN_ABI_MINOR); }

bool uses_instances(const keel_plugin_t* d) {
  return KEEL_HAS_MEMBER(d, keel_plugin_t, init_instance) && d->init_instance != nullptr;
}

// Checks a descriptor before anything of it is called. `origin` names where it came from, for messages.
Outcome check_descriptor(const keel_plugin_t* d, const std::string& origin) {
  if (d == nullptr)
    return failed("entry symbol " KEEL_PLUGIN_ENTRY_SYMBOL " returned NULL (no descriptor) in " + origin);
  if (d->struct_size < offsetof(keel_plugin_t, abi_minor) + sizeof(d->abi_minor)) {
    return failed("plugin descriptor in " + origin + " is too small (struct_size " + std::to_string(d->struct_size) +
                  ") to hold its ABI version");
  }
  if (d->abi_major != KEEL_PLUGIN_ABI_MAJOR) {
    return failed("ABI mismatch: plugin ABI " + abi_string(d->abi_major, d->abi_minor) + ", core ABI " + core_abi() +
                  " (descriptor of " + origin + "; rebuild the plugin against this SDK)");
  }
  if (uses_instances(d)) {
    if (!KEEL_HAS_MEMBER(d, keel_plugin_t, shutdown_instance) || d->shutdown_instance == nullptr) {
      return failed("plugin descriptor in " + origin + " has init_instance but no shutdown_instance");
    }
  } else if (!KEEL_HAS_MEMBER(d, keel_plugin_t, init) || d->init == nullptr) {
    return failed("plugin descriptor in " + origin + " has no init function");
  }
  if (d->name == nullptr || d->name[0] == '\0') return failed("plugin descriptor in " + origin + " has no name");
  return {};
}

// A handle that dlopen()s a library and dlclose()s it when it goes out of scope.
struct DlProbe {
  void* handle = nullptr;
  ~DlProbe() {
    if (handle != nullptr) dlclose(handle);
  }
};

// Plugins without instances (init/shutdown, ABI < 1.5) keep their state in globals that every environment of the
// process shares: their shutdown runs when the last environment that initialised them goes, and the host tables
// (handles) they were given stay allocated until then, since a global of the plugin may still point at any of them.
struct LegacyUsers {
  int count = 0;
  std::vector<std::unique_ptr<keel_plugin_handle_s>> retired;
};
std::mutex& legacy_mu() {
  static auto* mu = new std::mutex();  // never destroyed: environments may be released during static destruction
  return *mu;
}
std::map<const keel_plugin_t*, LegacyUsers>& legacy_users() {
  static auto* m = new std::map<const keel_plugin_t*, LegacyUsers>();
  return *m;
}

void call_shutdown(const keel_plugin_t* d) {
  if (!KEEL_HAS_MEMBER(d, keel_plugin_t, shutdown) || d->shutdown == nullptr) return;
  try {
    d->shutdown();
  } catch (...) {
    // A C++ plugin broke the no-exceptions rule; nothing to report to at this point.
  }
}

// An environment stops using a plugin without instances. `counted`: its init had succeeded and was counted. The
// handle is retired (its registry cleared) rather than freed while other environments still use the plugin; the
// last user calls shutdown when `shutdown_if_last` (not after a failed init: the plugin cleaned up itself).
// The caller holds legacy_mu(): an init of the same plugin for another environment (which runs under it, see
// init_plugin) then never interleaves with this shutdown clearing the globals that init has just set.
void release_legacy_locked(const keel_plugin_t* d, std::unique_ptr<keel_plugin_handle_s> handle, bool counted,
                           bool shutdown_if_last = true) {
  LegacyUsers& u = legacy_users()[d];
  if (counted) --u.count;
  if (handle) {
    handle->registry.store(nullptr);
    handle->log_target.store(nullptr);  // the environment's log goes with it
  }
  if (u.count > 0) {
    if (handle) u.retired.push_back(std::move(handle));
    return;
  }
  if (shutdown_if_last) call_shutdown(d);
  legacy_users().erase(d);  // frees the retired handles; `handle` goes at return
}
void release_legacy(const keel_plugin_t* d, std::unique_ptr<keel_plugin_handle_s> handle, bool counted,
                    bool shutdown_if_last = true) {
  std::lock_guard<std::mutex> lock(legacy_mu());
  release_legacy_locked(d, std::move(handle), counted, shutdown_if_last);
}

// Text from the host converted to the type `like` has (or, without `like`, to what it reads as).
bool parse_int(const std::string& v, int64_t* out) {
  if (v.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 0);
  if (errno != 0 || end == nullptr || *end != '\0') return false;
  *out = x;
  return true;
}
bool parse_float(const std::string& v, double* out) {
  if (v.empty()) return false;
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (errno != 0 || end == nullptr || *end != '\0') return false;
  *out = x;
  return true;
}
bool parse_bool(std::string v, bool* out) {
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "true" || v == "1" || v == "yes" || v == "on") return *out = true, true;
  if (v == "false" || v == "0" || v == "no" || v == "off") return *out = false, true;
  return false;
}

}  // namespace

PluginManager::PluginManager(Registry& registry) : registry_(registry) {}

std::string PluginManager::merge_overrides(const std::string& name, Options* options) const {
  auto it = overrides_.find(name);
  if (it == overrides_.end()) return "";
  for (const auto& [key, text] : it->second) {
    auto bad = [&, key = key, text = text](const char* type) {
      return "option '" + key + "' of plugin '" + name + "' from the host: '" + text + "' is not " + type +
             " (the manifest's [options] gives the key that type)";
    };
    auto found = options->values.find(key);
    if (found == options->values.end()) {
      int64_t i = 0;
      double d = 0;
      if (parse_int(text, &i)) options->values[key] = i;
      else if (parse_float(text, &d)) options->values[key] = d;
      else if (text == "true" || text == "false") options->values[key] = text == "true";
      else options->values[key] = text;
      continue;
    }
    Options::Value& v = found->second;
    if (std::holds_alternative<int64_t>(v)) {
      int64_t i = 0;
      if (!parse_int(text, &i)) return bad("an integer");
      v = i;
    } else if (std::holds_alternative<double>(v)) {
      double d = 0;
      if (!parse_float(text, &d)) return bad("a float");
      v = d;
    } else if (std::holds_alternative<bool>(v)) {
      bool b = false;
      if (!parse_bool(text, &b)) return bad("a boolean (true/false, 1/0, yes/no, on/off)");
      v = b;
    } else if (std::holds_alternative<std::string>(v)) {
      v = text;
    } else {
      std::vector<std::string> list;
      std::stringstream ss(text);
      std::string item;
      while (std::getline(ss, item, ',')) list.push_back(item);
      v = std::move(list);
    }
  }
  return "";
}

std::unique_ptr<keel_plugin_handle_s> PluginManager::handle_for(const PluginRecord& rec, const std::string& dir,
                                                                Options options) {
  auto h = make_plugin_handle(registry_, rec.id, rec.priority, rec.name, dir, std::move(options));
  h->log_target.store(log_target_);
  return h;
}

PluginManager::~PluginManager() {
  // Reverse load order: shutdown, forget the registrations (nothing may call into the library any more), unload.
  for (auto it = loaded_.rbegin(); it != loaded_.rend(); ++it) {
    Loaded& l = **it;
    if (l.has_instance) {
      if (l.descriptor->shutdown_instance != nullptr) {
        try {
          l.descriptor->shutdown_instance(l.instance);
        } catch (...) {
          // A C++ plugin broke the no-exceptions rule; nothing to report to at this point.
        }
      }
    } else if (l.descriptor != nullptr) {
      release_legacy(l.descriptor, std::move(l.handle), true);
    }
    registry_.remove_plugin(l.id);
  }
  while (!loaded_.empty()) loaded_.pop_back();
}

void PluginManager::load_builtin(const keel_plugin_t* descriptor, int32_t priority, const std::string& description) {
  PluginRecord rec;
  rec.id = static_cast<PluginId>(records_.size());
  rec.priority = priority;
  rec.description = description;
  rec.library = "(built-in)";
  Outcome o = check_descriptor(descriptor, "built-in plugin");
  if (descriptor != nullptr && descriptor->struct_size >= offsetof(keel_plugin_t, name) + sizeof(descriptor->name)) {
    rec.name = descriptor->name ? descriptor->name : "";
    rec.version = KEEL_HAS_MEMBER(descriptor, keel_plugin_t, version) && descriptor->version ? descriptor->version : "";
    rec.kind = KEEL_HAS_MEMBER(descriptor, keel_plugin_t, kind) ? kind_name(descriptor->kind) : "";
  }
  if (rec.name.empty()) rec.name = "(built-in)";
  if (o.ok()) {
    for (const auto& r : records_) {
      if (r.state == PluginState::kLoaded && r.name == rec.name) {
        o = skipped("duplicate plugin name '" + rec.name + "': already loaded from " +
                    (r.manifest.empty() ? r.library.string() : r.manifest.string()) + "; this one is built in");
        break;
      }
    }
  }
  if (o.ok()) {
    auto l = std::make_unique<Loaded>();
    l->id = rec.id;
    l->descriptor = descriptor;
    Options options;
    if (std::string err = merge_overrides(rec.name, &options); !err.empty()) {
      o = failed(err);
    } else {
      l->handle = handle_for(rec, "", std::move(options));
      std::tie(o.state, o.reason) = init_plugin(rec, std::move(l));
    }
  }
  rec.state = o.state;
  rec.reason = one_line(o.reason);
  records_.push_back(std::move(rec));
}

void PluginManager::load_from(const std::vector<fs::path>& dirs) {
  std::set<fs::path> seen_dirs;
  for (const auto& dir : dirs) {
    if (dir.empty()) continue;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;  // missing directories are normal (e.g. no user directory)
    fs::path key = fs::weakly_canonical(dir, ec);
    if (ec) key = fs::absolute(dir, ec).lexically_normal();
    if (!seen_dirs.insert(key).second) continue;  // the same directory twice in the search path

    std::vector<fs::path> manifests;
    fs::directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
    for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
      const fs::path& p = it->path();
      if (!ends_with(p.filename().string(), kManifestSuffix)) continue;
      std::error_code type_ec;
      if (!fs::is_regular_file(p, type_ec)) continue;  // follows symlinks
      manifests.push_back(p);
    }
    std::sort(manifests.begin(), manifests.end(),
              [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
    for (const auto& m : manifests) load_manifest(m);
  }
}

void PluginManager::load_manifest(const fs::path& manifest_arg) {
  std::error_code ec;
  fs::path manifest = fs::absolute(manifest_arg, ec).lexically_normal();
  if (ec) manifest = manifest_arg;

  PluginRecord rec;
  rec.id = static_cast<PluginId>(records_.size());
  rec.manifest = manifest;
  rec.name = manifest_stem(manifest);

  auto finish = [&](const Outcome& o) {
    rec.state = o.state;
    rec.reason = one_line(o.reason);
    records_.push_back(std::move(rec));
  };

  Manifest m;
  Outcome o = parse_manifest(manifest, &m);
  if (!m.name.empty()) rec.name = m.name;
  rec.kind = m.kind;
  rec.version = m.version;
  rec.vendor = m.vendor;
  rec.description = m.description;
  rec.priority = static_cast<int32_t>(m.priority);
  rec.requirements = m.requirements;
  rec.abi = m.abi;
  if (!m.library.empty()) {
    fs::path lib(m.library);
    if (lib.is_relative()) lib = manifest.parent_path() / lib;
    rec.library = lib.lexically_normal();
  }
  if (!o.ok()) return finish(o);

  // Of two plugins with one name, the first in search order wins.
  for (const auto& r : records_) {
    if (r.state == PluginState::kLoaded && r.name == rec.name) {
      return finish(skipped("duplicate plugin name '" + rec.name + "': already loaded from " +
                            (r.manifest.empty() ? std::string("(built-in)") : r.manifest.string()) + "; this one is " +
                            manifest.string()));
    }
  }

  if (m.abi_major != KEEL_PLUGIN_ABI_MAJOR) {
    return finish(failed("ABI mismatch: plugin ABI " + abi_string(m.abi_major, m.abi_minor) + ", core ABI " +
                         core_abi() + " (from the manifest " + manifest.string() +
                         "; rebuild the plugin against this SDK)"));
  }

  if (!fs::exists(rec.library, ec)) return finish(failed("library not found: " + rec.library.string()));

  // dlopen first to get dlerror()'s text (missing dependency, not an ELF file, undefined symbol): Boost.DLL's
  // error_code only says "bad file descriptor". The probe handle is closed when Boost.DLL holds its own.
  DlProbe probe;
  dlerror();  // clear a stale error
  probe.handle = dlopen(rec.library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (probe.handle == nullptr) {
    const char* err = dlerror();
    std::string text = err ? err : "dlopen failed";
    // dlerror names the library itself for some errors ("<path>: invalid ELF header") but not for a missing
    // dependency ("libfoo.so: cannot open shared object file ..."): name it once.
    if (text.find(rec.library.string()) == std::string::npos) text = rec.library.string() + ": " + text;
    return finish(failed("cannot load library: " + text));
  }

  boost::dll::fs::error_code bec;
  boost::dll::shared_library library(boost::dll::fs::path(rec.library.string()),
                                     boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, bec);
  if (bec || !library.is_loaded()) {
    return finish(failed("cannot load library " + rec.library.string() + ": " + bec.message()));
  }

  if (!library.has(KEEL_PLUGIN_ENTRY_SYMBOL)) {
    return finish(failed("entry symbol " KEEL_PLUGIN_ENTRY_SYMBOL " not found in " + rec.library.string() +
                         " (export it with KEEL_PLUGIN_EXPORT and C linkage)"));
  }

  const keel_plugin_t* descriptor = nullptr;
  try {
    auto& entry = library.get<const keel_plugin_t*()>(KEEL_PLUGIN_ENTRY_SYMBOL);
    descriptor = entry();
  } catch (const std::exception& e) {
    return finish(failed("entry symbol " KEEL_PLUGIN_ENTRY_SYMBOL " threw: " + std::string(e.what())));
  } catch (...) {
    return finish(failed("entry symbol " KEEL_PLUGIN_ENTRY_SYMBOL " threw an unknown exception"));
  }

  if (o = check_descriptor(descriptor, rec.library.string()); !o.ok()) return finish(o);
  if (std::strcmp(descriptor->name, rec.name.c_str()) != 0) {
    return finish(failed("the descriptor's name '" + std::string(descriptor->name) +
                         "' differs from the manifest's name '" + rec.name + "' (" + rec.library.string() + ")"));
  }
  const char* dkind = KEEL_HAS_MEMBER(descriptor, keel_plugin_t, kind) ? kind_name(descriptor->kind) : "";
  if (rec.kind != dkind) {
    return finish(failed("the descriptor's kind '" + std::string(dkind) + "' differs from the manifest's kind '" +
                         rec.kind + "' (" + rec.library.string() + ")"));
  }
  if (rec.version.empty() && KEEL_HAS_MEMBER(descriptor, keel_plugin_t, version) && descriptor->version != nullptr) {
    rec.version = descriptor->version;
  }

  auto l = std::make_unique<Loaded>();
  l->id = rec.id;
  l->descriptor = descriptor;
  l->library = std::move(library);
  if (std::string err = merge_overrides(rec.name, &m.options); !err.empty()) return finish(failed(err));
  l->handle = handle_for(rec, manifest.parent_path().string(), std::move(m.options));
  std::tie(o.state, o.reason) = init_plugin(rec, std::move(l));
  // Pin a plugin whose init ran, loaded or not: its code (and libraries it pulled in, such as an OpenMP runtime whose
  // worker threads outlive the plugin) must stay mapped until the process ends, even after the manager unloads it.
  // A skipped one too: the CUDA runtime registers an exit handler even when it finds no device, and where atexit is
  // not tied to the library (ThreadSanitizer's interceptor) that handler ran into unmapped code at exit.
  if (void* pin = dlopen(rec.library.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) dlclose(pin);
  finish(o);
}

void PluginManager::load_library(const fs::path& library_arg) {
  std::error_code ec;
  fs::path library = fs::absolute(library_arg, ec).lexically_normal();
  if (ec) library = library_arg;
  if (ends_with(library.filename().string(), kManifestSuffix)) return load_manifest(library);

  // The manifest beside it that names this library, if any.
  fs::path canonical = fs::weakly_canonical(library, ec);
  if (ec) canonical = library;
  std::vector<fs::path> beside;
  for (fs::directory_iterator it(library.parent_path(), fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (ends_with(it->path().filename().string(), kManifestSuffix)) beside.push_back(it->path());
  }
  std::sort(beside.begin(), beside.end());
  for (const auto& m : beside) {
    Manifest parsed;
    if (!parse_manifest(m, &parsed).ok() || parsed.library.empty()) continue;
    fs::path lib(parsed.library);
    if (lib.is_relative()) lib = m.parent_path() / lib;
    std::error_code e2;
    fs::path c = fs::weakly_canonical(lib, e2);
    if (!e2 && c == canonical) return load_manifest(m);
  }

  // A minimal manifest from the descriptor.
  PluginRecord rec;
  rec.id = static_cast<PluginId>(records_.size());
  rec.library = library;
  rec.name = library.stem().string();
  rec.description = "loaded by path (no manifest)";
  auto finish = [&](const Outcome& o) {
    rec.state = o.state;
    rec.reason = one_line(o.reason);
    records_.push_back(std::move(rec));
  };
  if (!fs::exists(library, ec)) return finish(failed("library not found: " + library.string()));
  DlProbe probe;
  dlerror();
  probe.handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (probe.handle == nullptr) {
    const char* err = dlerror();
    std::string text = err ? err : "dlopen failed";
    if (text.find(library.string()) == std::string::npos) text = library.string() + ": " + text;
    return finish(failed("cannot load library: " + text));
  }
  boost::dll::fs::error_code bec;
  boost::dll::shared_library lib(boost::dll::fs::path(library.string()),
                                 boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, bec);
  if (bec || !lib.is_loaded()) return finish(failed("cannot load library " + library.string() + ": " + bec.message()));
  if (!lib.has(KEEL_PLUGIN_ENTRY_SYMBOL)) {
    return finish(failed("entry symbol " KEEL_PLUGIN_ENTRY_SYMBOL " not found in " + library.string() +
                         " (export it with KEEL_PLUGIN_EXPORT and C linkage)"));
  }
  const keel_plugin_t* descriptor = nullptr;
  try {
    descriptor = lib.get<const keel_plugin_t*()>(KEEL_PLUGIN_ENTRY_SYMBOL)();
  } catch (...) {
    return finish(failed("entry symbol " KEEL_PLUGIN_ENTRY_SYMBOL " threw in " + library.string()));
  }
  Outcome o = check_descriptor(descriptor, library.string());
  if (!o.ok()) return finish(o);
  rec.name = descriptor->name;
  rec.kind = KEEL_HAS_MEMBER(descriptor, keel_plugin_t, kind) ? kind_name(descriptor->kind) : "";
  if (KEEL_HAS_MEMBER(descriptor, keel_plugin_t, version) && descriptor->version != nullptr) {
    rec.version = descriptor->version;
  }
  rec.abi = abi_string(descriptor->abi_major, descriptor->abi_minor);
  if (rec.kind.empty()) return finish(failed("the descriptor of " + library.string() + " has no valid kind"));
  for (const auto& r : records_) {
    if (r.state == PluginState::kLoaded && r.name == rec.name) {
      return finish(skipped("duplicate plugin name '" + rec.name + "': already loaded from " +
                            (r.manifest.empty() ? r.library.string() : r.manifest.string()) + "; this one is " +
                            library.string()));
    }
  }
  Options options;
  if (std::string err = merge_overrides(rec.name, &options); !err.empty()) return finish(failed(err));
  auto l = std::make_unique<Loaded>();
  l->id = rec.id;
  l->descriptor = descriptor;
  l->library = std::move(lib);
  l->handle = handle_for(rec, library.parent_path().string(), std::move(options));
  std::tie(o.state, o.reason) = init_plugin(rec, std::move(l));
  if (void* pin = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) dlclose(pin);  // as above
  finish(o);
}

std::pair<PluginState, std::string> PluginManager::init_plugin(const PluginRecord& rec, std::unique_ptr<Loaded> l) {
  const keel_plugin_t* descriptor = l->descriptor;
  const bool instances = uses_instances(descriptor);
  keel_status_t status = nullptr;
  std::string thrown;
  bool threw = false;
  // A plugin without instances keeps its state in globals that every environment's init sets and the last
  // environment's shutdown clears: its init, the check below and its count run under legacy_mu(), so that
  // environments created and released on several threads at once never run one's init beside another's shutdown
  // (or two inits at once). (ThreadSanitizer, with Embedding.EnvironmentsWithTheirOwnOptionsOnSeveralThreadsAtOnce:
  // the null plugin's shutdown cleared its host pointer right after another environment's init had set it.)
  std::unique_lock<std::mutex> legacy_lock(legacy_mu(), std::defer_lock);
  if (!instances) legacy_lock.lock();
  // A plugin without instances may have pointed its globals at this handle before failing: retire the handle
  // rather than free it when other environments still use the plugin.
  auto drop_legacy = [&](bool shutdown_if_last) {
    if (!instances) release_legacy_locked(descriptor, std::move(l->handle), false, shutdown_if_last);
  };
  try {
    if (instances) {
      void* instance = nullptr;
      status = descriptor->init_instance(&l->handle->api, l->handle.get(), &instance);
      l->has_instance = status == nullptr;
      l->instance = status == nullptr ? instance : nullptr;
    } else {
      status = descriptor->init(&l->handle->api, l->handle.get());
    }
  } catch (const std::exception& e) {
    threw = true;
    thrown = e.what();
  } catch (...) {
    threw = true;
    thrown = "an exception that is not a std::exception";
  }
  if (threw) {
    registry_.remove_plugin(rec.id);
    drop_legacy(false);
    return {PluginState::kFailed, "init threw: " + thrown + " (plugins must return a status, not throw)"};
  }
  if (status != nullptr) {
    Status s = Status::from_c(status);  // releases the C status
    registry_.remove_plugin(rec.id);
    drop_legacy(false);
    if (s.code() == StatusCode::kUnavailable) return {PluginState::kSkipped, "unavailable: " + s.message()};
    return {PluginState::kFailed, std::string("init failed (") + status_code_name(s.code()) + "): " + s.message()};
  }

  // A device plugin must provide a device: its own table, or kernels for a device type that another plugin
  // provides (e.g. oneDNN kernels for the reference "cpu" device).
  if (rec.kind == "device") {
    bool own_device = false;
    for (const auto& d : registry_.devices())
      if (d->plugin == rec.id) own_device = true;
    if (!own_device) {
      bool any_kernel = false, all_served = true;
      for (const auto& k : registry_.kernels()) {
        if (k->plugin != rec.id) continue;
        any_kernel = true;
        if (registry_.device(k->device_type) == nullptr) all_served = false;
      }
      if (!any_kernel || !all_served) {
        registry_.remove_plugin(rec.id);
        if (instances) {
          try {
            descriptor->shutdown_instance(l->instance);
          } catch (...) {}
        } else {
          drop_legacy(true);  // shutdown only when no other environment uses the plugin's globals
        }
        return {PluginState::kSkipped,
                any_kernel ? "no device present: the plugin registered kernels only for device types that no plugin "
                             "provides"
                           : "no device present: the plugin registered no device"};
      }
    }
  }

  if (!instances) ++legacy_users()[descriptor].count;  // under legacy_lock
  loaded_.push_back(std::move(l));
  return {PluginState::kLoaded, ""};
}

std::vector<fs::path> PluginManager::search_path(const std::vector<fs::path>& api_paths) {
  std::vector<fs::path> out(api_paths.begin(), api_paths.end());
  if (const char* env = std::getenv("KEEL_PLUGIN_PATH"); env != nullptr) {
    std::string_view rest(env);
    while (true) {
      size_t colon = rest.find(':');
      std::string_view part = rest.substr(0, colon);
      if (!part.empty()) out.emplace_back(std::string(part));
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    out.push_back(fs::path(home) / ".local" / "lib" / "keel" / "plugins");
  }
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && !exe.empty()) out.push_back((exe.parent_path() / ".." / "lib" / "keel" / "plugins").lexically_normal());
  // The install directory seen from libkeel itself (<libdir>/keel/plugins): a host application embedding Keel
  // through the C API lives anywhere, but finds the plugins installed beside the library it links. In a build tree
  // and for the installed `keel` this is the directory above; it is listed once.
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&PluginManager::search_path), &info) != 0 && info.dli_fname != nullptr) {
    fs::path lib_dir =
        (fs::absolute(fs::path(info.dli_fname), ec).parent_path() / "keel" / "plugins").lexically_normal();
    auto same = [&](const fs::path& p) {
      std::error_code e1, e2;
      return fs::weakly_canonical(p, e1) == fs::weakly_canonical(lib_dir, e2) && !e1 && !e2;
    };
    if (!ec && std::none_of(out.begin(), out.end(), same)) out.push_back(lib_dir);
  }
  return out;
}

}  // namespace keel
