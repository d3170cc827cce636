// `keel plugin-test PATH/TO/X.keel-plugin.toml [--model M.onnx]... [--op OP] [--verbose]` — the plugin conformance
// kit. Loads that one plugin (PluginManager::load_manifest, no discovery), runs the device conformance suite
// (tools/conformance, library keel_device_cts) on every device type the plugin serves, then runs the given
// models on it (fallback to the CPU) against the reference device, and prints a report a vendor can act on: per op,
// cases supported / passed / failed / fell back to another plugin's kernel, one repro line per failure, and per
// model which nodes ran on the device and which fell back, with the reason. Exit 0 when nothing failed, 3 otherwise.
//
// The kit is linked in every build, -DKEEL_BUILD_TESTS=OFF included.
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <random>
#include <set>

#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "tools/conformance/device_cts.h"
#include "tools/keel/commands.h"

namespace keel::cli {
namespace {

struct PluginTestArgs {
  std::string manifest;
  std::vector<std::string> models;
  std::string op;
  bool verbose = false;
};

// Random inputs for a model (dynamic dims = 1), the same for both runs.
StatusOr<std::vector<std::pair<std::string, Tensor>>> model_inputs(const Session& s) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& name : s.input_names()) {
    const ValueInfo* vi = s.graph().info(name);
    if (!vi || !vi->shape) return invalid_argument("input '" + name + "' has no known shape");
    Shape shape = *vi->shape;
    for (auto& d : shape) d = d < 0 ? 1 : d;
    KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host(vi->dtype, shape), name);
    if (vi->dtype == DType::kF32) {
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
    }
    out.emplace_back(name, t);
  }
  return out;
}

int run_plugin_test(const PluginTestArgs& a, const Globals& g) {
  EnvironmentOptions eo;
  eo.discover_plugins = false;
  eo.threads = g.threads;
  eo.manifests.emplace_back(std::filesystem::absolute(a.manifest));
  auto dut = Environment::create(eo);
  EnvironmentOptions ro;
  ro.discover_plugins = false;
  ro.threads = g.threads;
  auto oracle = Environment::create(ro);
  if (!dut.is_ok() || !oracle.is_ok()) {
    std::cerr << "keel plugin-test: cannot start the runtime: "
              << (dut.is_ok() ? oracle.status().to_string() : dut.status().to_string()) << "\n";
    return 1;
  }
  const PluginRecord* rec = nullptr;
  for (const auto& p : (*dut)->plugins())
    if (!p.manifest.empty()) rec = &p;
  if (rec == nullptr) {
    std::cerr << "keel plugin-test: no plugin was read from " << a.manifest << "\n";
    return 1;
  }
  std::cout << "plugin " << rec->name << " " << rec->version << " (" << rec->kind << ", ABI " << rec->abi
            << "): " << plugin_state_name(rec->state) << (rec->reason.empty() ? "" : ": " + rec->reason) << "\n";
  if (rec->state != PluginState::kLoaded) return 3;

  // What the plugin serves: its device types and kernels (a kernel-only plugin, like oneDNN, serves "cpu").
  const Registry& reg = (*dut)->registry();
  std::set<std::string> devices, kernels;
  for (const auto& d : reg.devices())
    if (d->plugin == rec->id) devices.insert(d->device_type);
  for (const auto& k : reg.kernels())
    if (k->plugin == rec->id) {
      kernels.insert(k->name);
      devices.insert(k->device_type);
    }
  std::cout << kernels.size() << " kernel(s) on device type(s):";
  for (const auto& d : devices) std::cout << " " << d;
  std::cout << "\n";
  if (devices.empty()) {
    std::cout << "nothing to test: the plugin registers no device and no kernel (a pass or collective plugin)\n";
    return 0;
  }

  bool ok = true;
  for (const auto& device : devices) {
    std::cout << "\n== device conformance suite on " << device << "\n";
    cts::Options o;
    o.device = device;
    o.op = a.op;
    o.verbose = a.verbose;
    o.out = a.verbose ? &std::cout : nullptr;
    cts::Report r = cts::run(**dut, **oracle, o);
    struct Row {
      int cases = 0, supported = 0, passed = 0, failed = 0, native = 0, other = 0;
    };
    std::map<std::string, Row> rows;
    for (const auto& c : r.results) {
      Row& row = rows[c.c->op];
      ++row.cases;
      if (c.outcome == cts::Outcome::kUnsupported) continue;
      ++row.supported;
      if (c.outcome == cts::Outcome::kPass) ++row.passed;
      if (c.outcome == cts::Outcome::kFail || c.outcome == cts::Outcome::kError) ++row.failed;
      if (!c.kernel.empty()) (kernels.count(c.kernel) ? row.native : row.other)++;
    }
    std::cout << std::left << std::setw(24) << "OP" << std::right << std::setw(7) << "CASES" << std::setw(11)
              << "SUPPORTED" << std::setw(8) << "PASSED" << std::setw(8) << "FAILED" << std::setw(12) << "BY-PLUGIN"
              << std::setw(12) << "FELL-BACK"
              << "\n";
    for (const auto& [op, row] : rows) {
      if (row.supported == 0 && !a.verbose) continue;  // ops the plugin does not claim: summarised below
      std::cout << std::left << std::setw(24) << op << std::right << std::setw(7) << row.cases << std::setw(11)
                << row.supported << std::setw(8) << row.passed << std::setw(8) << row.failed << std::setw(12)
                << row.native << std::setw(12) << row.other << "\n";
    }
    int unsupported_ops = 0;
    for (const auto& [op, row] : rows) unsupported_ops += row.supported == 0;
    std::cout << unsupported_ops << " op(s) of the suite have no kernel on " << device
              << " (they fall back to the CPU in a session with fallback = cpu)\n";
    std::cout << "FELL-BACK: cases that another plugin's kernel for " << device << " served (e.g. the reference).\n";
    for (const auto& c : r.results) {
      if (c.outcome == cts::Outcome::kFail || c.outcome == cts::Outcome::kError) {
        std::cout << cts::outcome_name(c.outcome) << " " << c.c->op << " [" << c.c->label << "] kernel "
                  << (c.kernel.empty() ? "?" : c.kernel) << ": " << c.message << "\n  repro: " << c.repro << "\n";
      }
    }
    std::cout << "summary " << device << ": " << r.passed << " passed, " << r.failed << " failed, " << r.errors
              << " errors, " << r.unsupported << " unsupported, " << r.invalid << " invalid\n";
    ok = ok && r.ok();
  }

  // Real models: placement on the plugin's device (fallback = cpu) and outputs against the reference device.
  for (const auto& m : a.models) {
    std::cout << "\n== model " << m << "\n";
    auto graph = load_onnx(m);
    if (!graph.is_ok()) {
      std::cout << "cannot load: " << graph.status().to_string() << "\n";
      ok = false;
      continue;
    }
    for (const auto& device : devices) {
      SessionOptions so;
      so.devices = {device};
      auto s = Session::create(**dut, *graph, so);
      auto ref = Session::create(**oracle, *graph, {});
      if (!s.is_ok() || !ref.is_ok()) {
        std::cout << device
                  << ": cannot create a session: " << (s.is_ok() ? ref.status().to_string() : s.status().to_string())
                  << "\n";
        ok = false;
        continue;
      }
      int on_device = 0, total = 0;
      for (const auto& [node, op, dev, kernel] : (*s)->placement()) {
        if (op == "Copy") continue;
        ++total;
        on_device += dev == device;
      }
      std::cout << device << ": " << on_device << " of " << total << " nodes on " << device << "\n";
      for (const auto& f : (*s)->fallbacks())
        std::cout << "  fell back: " << f.node << " (" << f.op_type << ") -> " << f.to << ": " << f.reason << "\n";
      auto inputs = model_inputs(**s);
      if (!inputs.is_ok()) {
        std::cout << "  skipped the run: " << inputs.status().to_string() << "\n";
        continue;
      }
      auto out = (*s)->run(*inputs);
      auto want = (*ref)->run(*inputs);
      if (!out.is_ok() || !want.is_ok()) {
        std::cout << "  run failed: " << (out.is_ok() ? want.status().to_string() : out.status().to_string()) << "\n";
        ok = false;
        continue;
      }
      double worst = 0;
      bool same = out->size() == want->size();
      for (size_t i = 0; same && i < out->size(); ++i) {
        const Tensor &x = (*out)[i], &y = (*want)[i];
        if (x.dtype() != y.dtype() || x.shape() != y.shape()) {
          same = false;
          break;
        }
        if (x.dtype() != DType::kF32) continue;
        for (int64_t k = 0; k < x.numel(); ++k) {
          double e = std::fabs(double(x.data<float>()[k]) - double(y.data<float>()[k])) /
                     std::max(1.0, std::fabs(double(y.data<float>()[k])));
          worst = std::max(worst, e);
        }
      }
      bool pass = same && worst <= 1e-3;
      std::cout << "  outputs vs reference: " << (pass ? "PASS" : "FAIL") << " (max relative error " << worst << ")\n";
      ok = ok && pass;
    }
  }
  std::cout << "\n" << (ok ? "PASS" : "FAIL") << ": plugin " << rec->name << "\n";
  return ok ? 0 : 3;
}

}  // namespace

void add_plugin_test_command(CLI::App& app, Globals& g) {
  auto a = std::make_shared<PluginTestArgs>();
  auto* cmd = app.add_subcommand("plugin-test",
                                 "Conformance kit: load one plugin from its manifest, run the device conformance "
                                 "suite and models on it, print a per-op report");
  cmd->add_option("manifest", a->manifest, "The plugin's NAME.keel-plugin.toml")->required()->check(CLI::ExistingFile);
  cmd->add_option("--model,-m", a->models, "An ONNX model to run on the plugin's device (repeatable)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--op", a->op, "Only this op type of the suite");
  cmd->add_flag("--verbose,-v", a->verbose, "Print every case");
  cmd->callback([a, &g] {
    int rc = run_plugin_test(*a, g);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace keel::cli
