// keel-cts — run the device conformance suite (device_cts.h) from the command line; every failure prints a
// one-line repro of this tool.
//   keel-cts --device cpu [--op Conv] [--case 'N=1 C=3 ...'] [--verbose] [--list]
//   (a progress bar on stderr unless -q; logs at warn unless --log-level or KEEL_LOG_LEVEL says otherwise)
//   keel-cts --device cpu --random-chains 200 [--seed 1] [--bf16 | --int8]
//   keel-cts --device cpu --random-grads 400 [--seed 1] [--bf16]
//   keel-cts --random-chains 1 --seed 17 --save DIR   (that case as DIR/model.onnx + DIR/test_data_set_0)
// Random chains and random gradients: device_cts.h, random_chain_case and random_grad_case.
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "core/runtime/environment.h"
#include "core/runtime/onnx_io.h"
#include "tools/conformance/device_cts.h"
#include "tools/keel/progress.h"

int main(int argc, char** argv) {
  using namespace keel;
  cts::Options o;
  std::vector<std::string> plugin_paths;
  bool list = false;
  int64_t random_chains = 0, random_grads = 0;
  uint64_t first_seed = 1;
  std::string save_dir;
  bool bf16 = false, int8 = false;
  CLI::App app{"keel-cts: every kernel of a device against the reference kernels", "keel-cts"};
  app.add_option("--device,-d", o.device, "Device type under test (cpu, cuda, ...)");
  app.add_option("--op", o.op, "Only this op type");
  app.add_option("--case", o.label, "Only the case with this label (as printed in a repro)");
  app.add_option("--kernel-prefix", o.kernel_prefix, "Count the cases served by kernels named with this prefix");
  app.add_option("--plugin-path", plugin_paths, "Extra directory to search for plugin manifests (repeatable)");
  app.add_flag("--verbose,-v", o.verbose, "Print every case, not only failures");
  std::string log_level = "warn";
  if (const char* lvl = std::getenv("KEEL_LOG_LEVEL")) log_level = lvl;
  app.add_option("--log-level", log_level, "Log level: trace, debug, info, warn, error, off (env KEEL_LOG_LEVEL)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  bool quiet = false;
  app.add_flag("--quiet,-q", quiet, "No progress bar (it goes to stderr: a line per 10% when that is not a terminal)");
  app.add_flag("--list", list, "List the cases and exit");
  app.add_option("--random-chains", random_chains,
                 "Instead of the table, this many random chains (a differential fuzzer of the device's fusion)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--random-grads", random_grads,
                 "Instead of the table, this many random backward ops (a differential fuzzer of training's kernels)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->excludes("--random-chains");
  app.add_option("--save", save_dir,
                 "Write the one case selected (--op/--case, or --random-chains 1) as DIR/model.onnx and its inputs as "
                 "DIR/test_data_set_0/input_K.pb, for `keel run` or another runtime, and exit");
  app.add_flag("--bf16", bf16, "With --random-chains or --random-grads: every float input bf16");
  app.add_flag("--int8", int8, "With --random-chains: int8 QDQ chains of convolutions instead");
  app.add_option("--seed", first_seed,
                 "The first random case's seed (with --random-chains or --random-grads; the others follow it)");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  std::vector<cts::OpCase> generated;
  for (int64_t i = 0; i < random_chains; ++i)
    generated.push_back(cts::random_chain_case(first_seed + i, int8 ? DType::kI8 : bf16 ? DType::kBF16 : DType::kF32));
  if (random_grads > 0 && int8) {
    std::cerr << "keel-cts: --int8 goes with --random-chains, not --random-grads\n";
    return 2;
  }
  for (int64_t i = 0; i < random_grads; ++i)
    generated.push_back(cts::random_grad_case(first_seed + i, bf16 ? DType::kBF16 : DType::kF32));
  if (random_chains > 0 || random_grads > 0) o.cases = &generated;
  if (!save_dir.empty()) {
    std::vector<const cts::OpCase*> picked;
    for (const auto& c : o.cases ? *o.cases : cts::all_cases())
      if (cts::selected(o, c)) picked.push_back(&c);
    if (picked.size() != 1) {
      std::cerr << "keel-cts: --save takes exactly one case; " << picked.size() << " selected\n";
      return 2;
    }
    cts::Built b = cts::build(*picked[0]);
    std::filesystem::create_directories(std::filesystem::path(save_dir) / "test_data_set_0");
    Status st = save_onnx(b.graph, std::filesystem::path(save_dir) / "model.onnx");
    for (size_t k = 0; st.is_ok() && k < b.feeds.size(); ++k)
      st = write_tensor_pb(b.feeds[k].second,
                           std::filesystem::path(save_dir) / "test_data_set_0" / ("input_" + std::to_string(k) + ".pb"),
                           b.feeds[k].first);
    if (!st.is_ok()) {
      std::cerr << "keel-cts: --save " << save_dir << ": " << st.to_string() << "\n";
      return 1;
    }
    std::cout << "wrote " << save_dir << "/model.onnx (" << picked[0]->op << " '" << picked[0]->label << "')\n";
    return 0;
  }
  if (list) {
    for (const auto& c : o.cases ? *o.cases : cts::all_cases())
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
  int64_t selected = 0;
  for (const auto& c : o.cases ? *o.cases : cts::all_cases()) selected += cts::selected(o, c);
  cli::ProgressBar bar("cases", selected, "case", !quiet && selected > 1);
  int64_t bad = 0;
  o.on_case = [&](const cts::CaseResult& c) {
    bad += c.outcome == cts::Outcome::kFail || c.outcome == cts::Outcome::kError;
    bar.tick(1, bad ? std::to_string(bad) + " failing" : "");
  };
  cts::Report r = cts::run(**dut, **oracle, o);
  bar.finish(bad ? std::to_string(bad) + " failing" : "all pass");
  if (!o.kernel_prefix.empty()) {
    std::cout << "served by " << o.kernel_prefix << "* kernels, per op:";
    for (const auto& [op, n] : r.native_by_op) std::cout << " " << op << " " << n.first << "/" << n.second;
    std::cout << "\n";
  }
  return r.ok() ? 0 : 3;
}
