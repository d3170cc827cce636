// `keel plugins` — every plugin found (name, kind, version, priority, state, library, reason), the devices they
// provide (type, count, name and memory from get_properties), and what each loaded plugin registered.
// `--json` prints the same as one JSON object. Exits 0 even when plugins failed: reporting them is the job.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tools/keel/commands.h"

namespace keel::cli {
namespace {

struct Counts {
  int devices = 0, kernels = 0, passes = 0, collectives = 0;
};

struct DeviceInfo {
  int32_t index = 0;
  bool ok = false;
  std::string error;
  keel_device_properties_t props{};
};

std::map<PluginId, Counts> count_registrations(const Registry& r) {
  std::map<PluginId, Counts> c;
  for (const auto& d : r.devices()) ++c[d->plugin].devices;
  for (const auto& k : r.kernels()) ++c[k->plugin].kernels;
  for (const auto& p : r.passes()) ++c[p->plugin].passes;
  for (const auto& x : r.collectives()) ++c[x->plugin].collectives;
  return c;
}

std::vector<DeviceInfo> query_devices(const DeviceEntry& d) {
  std::vector<DeviceInfo> out;
  for (int32_t i = 0; i < d.device_count; ++i) {
    DeviceInfo info;
    info.index = i;
    info.props.struct_size = sizeof(info.props);
    if (d.table.get_properties == nullptr) {
      info.error = "get_properties not provided";
    } else {
      Status s = Status::from_c(d.table.get_properties(d.table.user_data, i, &info.props));
      info.props.name[sizeof(info.props.name) - 1] = '\0';
      if (s.is_ok()) info.ok = true;
      else info.error = s.to_string();
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::string human_bytes(uint64_t bytes) {
  if (bytes == 0) return "-";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string or_dash(const std::string& s) { return s.empty() ? "-" : s; }

// A plain text table: columns padded to their widest cell; the last column is not padded.
void print_table(std::ostream& os, const std::vector<std::vector<std::string>>& rows, const std::string& indent) {
  if (rows.empty()) return;
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size() && i < width.size(); ++i) width[i] = std::max(width[i], r[i].size());
  for (const auto& r : rows) {
    std::string line = indent;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    os << line << "\n";
  }
}

std::string plugin_name(const std::vector<PluginRecord>& plugins, PluginId id) {
  if (id >= 0 && static_cast<size_t>(id) < plugins.size() && plugins[id].id == id) return plugins[id].name;
  for (const auto& p : plugins)
    if (p.id == id) return p.name;
  return id < 0 ? "(core)" : "#" + std::to_string(id);
}

void print_text(const Environment& env, const std::vector<std::filesystem::path>& search) {
  const auto& plugins = env.plugins();
  const Registry& reg = env.registry();
  auto counts = count_registrations(reg);

  std::cout << "Search path (first match of a name wins):\n";
  for (const auto& d : search) {
    std::error_code ec;
    std::cout << "  " << d.string() << (std::filesystem::is_directory(d, ec) ? "" : "  (absent)") << "\n";
  }

  int loaded = 0, skipped = 0, failed = 0;
  std::vector<std::vector<std::string>> rows = {{"NAME", "KIND", "VERSION", "PRIO", "STATE", "LIBRARY", "REASON"}};
  for (const auto& p : plugins) {
    switch (p.state) {
      case PluginState::kLoaded: ++loaded; break;
      case PluginState::kSkipped: ++skipped; break;
      case PluginState::kFailed: ++failed; break;
    }
    std::string library =
        p.library.empty() ? (p.manifest.empty() ? "-" : "(manifest " + p.manifest.string() + ")") : p.library.string();
    rows.push_back({p.name, or_dash(p.kind), or_dash(p.version), std::to_string(p.priority), plugin_state_name(p.state),
                    library, p.reason});
  }
  std::cout << "\nPlugins: " << plugins.size() << " found, " << loaded << " loaded, " << skipped << " skipped, "
            << failed << " failed\n";
  print_table(std::cout, rows, "  ");

  bool any_requirements = false;
  for (const auto& p : plugins) any_requirements |= !p.requirements.empty();
  if (any_requirements) {
    std::cout << "\nRequirements (recorded, not enforced yet):\n";
    for (const auto& p : plugins) {
      if (p.requirements.empty()) continue;
      std::string line;
      for (const auto& [k, v] : p.requirements) line += (line.empty() ? "" : ", ") + k + " " + v;
      std::cout << "  " << p.name << " (" << plugin_state_name(p.state) << "): " << line << "\n";
    }
  }

  std::vector<std::vector<std::string>> devs = {{"TYPE", "INDEX", "PLUGIN", "PRIO", "NAME", "MEMORY"}};
  for (const auto& d : reg.devices()) {
    for (const auto& info : query_devices(*d)) {
      std::string name = info.ok ? std::string(info.props.name) : "(" + info.error + ")";
      std::string memory = info.ok ? human_bytes(info.props.total_memory) : "-";
      devs.push_back({d->device_type, std::to_string(info.index) + "/" + std::to_string(d->device_count),
                      plugin_name(plugins, d->plugin), std::to_string(d->priority), or_dash(name), memory});
    }
  }
  std::cout << "\nDevices: " << reg.devices().size() << " type(s)\n";
  if (devs.size() > 1) print_table(std::cout, devs, "  ");
  else std::cout << "  (none)\n";

  std::vector<std::vector<std::string>> regs = {{"PLUGIN", "DEVICES", "KERNELS", "PASSES", "COLLECTIVES"}};
  for (const auto& p : plugins) {
    if (p.state != PluginState::kLoaded) continue;
    Counts c = counts.count(p.id) ? counts.at(p.id) : Counts{};
    regs.push_back({p.name, std::to_string(c.devices), std::to_string(c.kernels), std::to_string(c.passes),
                    std::to_string(c.collectives)});
  }
  std::cout << "\nRegistered by each loaded plugin:\n";
  print_table(std::cout, regs, "  ");
}

void print_json(const Environment& env, const std::vector<std::filesystem::path>& search) {
  using nlohmann::json;
  const auto& plugins = env.plugins();
  const Registry& reg = env.registry();
  auto counts = count_registrations(reg);

  json out;
  out["core_abi"] = std::to_string(KEEL_PLUGIN_ABI_MAJOR) + "." + std::to_string(KEEL_PLUGIN_ABI_MINOR);
  out["search_path"] = json::array();
  for (const auto& d : search) out["search_path"].push_back(d.string());

  out["plugins"] = json::array();
  for (const auto& p : plugins) {
    Counts c = counts.count(p.id) ? counts.at(p.id) : Counts{};
    json j = {
        {"id", p.id},
        {"name", p.name},
        {"kind", p.kind},
        {"version", p.version},
        {"vendor", p.vendor},
        {"description", p.description},
        {"priority", p.priority},
        {"abi", p.abi},
        {"state", plugin_state_name(p.state)},
        {"reason", p.reason},
        {"manifest", p.manifest.string()},
        {"library", p.library.string()},
        {"requires", p.requirements},
        {"registered",
         {{"devices", c.devices}, {"kernels", c.kernels}, {"passes", c.passes}, {"collectives", c.collectives}}},
    };
    out["plugins"].push_back(std::move(j));
  }

  out["devices"] = json::array();
  for (const auto& d : reg.devices()) {
    json dev = {{"type", d->device_type},
                {"plugin", plugin_name(plugins, d->plugin)},
                {"priority", d->priority},
                {"count", d->device_count},
                {"devices", json::array()}};
    for (const auto& info : query_devices(*d)) {
      json one = {{"index", info.index}};
      if (info.ok) {
        one["name"] = std::string(info.props.name);
        one["total_memory"] = info.props.total_memory;
        one["free_memory"] = info.props.free_memory;
        one["capabilities"] = info.props.capabilities;
      } else {
        one["error"] = info.error;
      }
      dev["devices"].push_back(std::move(one));
    }
    out["devices"].push_back(std::move(dev));
  }
  std::cout << out.dump(2) << "\n";
}

}  // namespace

void add_plugins_command(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("plugins", "List every plugin found, its state and reason, and the devices");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "Print the same as JSON");
  cmd->callback([&g, json] {
    auto env = make_environment(g);
    if (!env) throw CLI::RuntimeError(1);
    std::vector<std::filesystem::path> api_paths(g.plugin_paths.begin(), g.plugin_paths.end());
    auto search = PluginManager::search_path(api_paths);
    if (*json) print_json(*env, search);
    else print_text(*env, search);
  });
}

}  // namespace keel::cli
