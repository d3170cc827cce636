// keel-cts — run the device conformance suite (device_cts.h) from the command line; every failure prints a
// one-line repro of this tool.
//   keel-cts --device cpu [--op Conv] [--case 'N=1 C=3 ...'] [--verbose] [--list]
#include <CLI/CLI.hpp>

#include <iostream>

#include "core/runtime/environment.h"
#include "tools/conformance/device_cts.h"

int main(int argc, char** argv) {
  using namespace keel;
  cts::Options o;
  std::vector<std::string> plugin_paths;
  bool list = false;
  CLI::App app{"keel-cts: every kernel of a device against the reference kernels", "keel-cts"};
  app.add_option("--device,-d", o.device, "Device type under test (cpu, cuda, ...)");
  app.add_option("--op", o.op, "Only this op type");
  app.add_option("--case", o.label, "Only the case with this label (as printed in a repro)");
  app.add_option("--kernel-prefix", o.kernel_prefix, "Count the cases served by kernels named with this prefix");
  app.add_option("--plugin-path", plugin_paths, "Extra directory to search for plugin manifests (repeatable)");
  app.add_flag("--verbose,-v", o.verbose, "Print every case, not only failures");
  app.add_flag("--list", list, "List the cases and exit");
  CLI11_PARSE(app, argc, argv);
  if (list) {
    for (const auto& c : cts::all_cases())
      if (o.op.empty() || c.op == o.op) std::cout << c.op << "  " << c.label << "\n";
    return 0;
  }
  EnvironmentOptions eo;
  for (const auto& p : plugin_paths) eo.plugin_paths.emplace_back(p);
  auto dut = Environment::create(eo);
  EnvironmentOptions ro;
  ro.discover_plugins = false;
  auto oracle = Environment::create(ro);
  if (!dut.is_ok() || !oracle.is_ok()) {
    std::cerr << "keel-cts: cannot start the runtime: "
              << (dut.is_ok() ? oracle.status().to_string() : dut.status().to_string()) << "\n";
    return 1;
  }
  if (o.device == "cpu" && o.kernel_prefix.empty()) {
    for (const auto& p : (*dut)->plugins())
      if (p.name == "cpu_onednn" && p.state == PluginState::kLoaded) o.kernel_prefix = "onednn_";
  }
  o.out = &std::cout;
  cts::Report r = cts::run(**dut, **oracle, o);
  if (!o.kernel_prefix.empty()) {
    std::cout << "served by " << o.kernel_prefix << "* kernels, per op:";
    for (const auto& [op, n] : r.native_by_op) std::cout << " " << op << " " << n.first << "/" << n.second;
    std::cout << "\n";
  }
  return r.ok() ? 0 : 3;
}
