// `keel prune MODEL.onnx --ratio R --mode channel|magnitude -o OUT.onnx` — runs the `prune` pass (passes/prune) and
// writes the result, printing parameters (non-zero and total), FLOPs (model_work.h: Conv/Gemm/MatMul MACs x 2 from the
// inferred value-info shapes) and the model size before and after, with the pass's notes (what was skipped and why).
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <unordered_set>

#include "core/base/pass_manager.h"
#include "core/runtime/host_api.h"
#include "core/runtime/kernel_context.h"
#include "core/runtime/onnx_io.h"
#include "tools/keel/commands.h"
#include "tools/keel/model_work.h"

namespace keel::cli {
namespace {

struct PruneArgs {
  std::string model, output, mode = "channel";
  double ratio = 0.5;
  bool coupled = true;
  std::string device = "cpu";
};

struct ModelStats {
  int64_t params = 0, nonzero = 0, flops = 0;
};

ModelStats model_stats(const Graph& g) {
  ModelStats s;
  for (const auto& [k, t] : g.initializers) {
    if (t.dtype() != DType::kF32) continue;
    s.params += t.numel();
    for (int64_t i = 0; i < t.numel(); ++i) s.nonzero += t.data<float>()[i] != 0.f;
  }
  s.flops = model_work(g).flops;
  return s;
}

std::string human(double v) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2);
  if (v >= 1e9) os << v / 1e9 << " G";
  else if (v >= 1e6) os << v / 1e6 << " M";
  else if (v >= 1e3) os << v / 1e3 << " K";
  else os << v << " ";
  return os.str();
}

int prune(const PruneArgs& a, Globals& g) {
  if (!(a.ratio >= 0 && a.ratio <= 1)) {
    std::cerr << "keel prune: --ratio must be in 0..1\n";
    return 2;
  }
  if (a.mode != "channel" && a.mode != "magnitude") {
    std::cerr << "keel prune: --mode must be channel or magnitude\n";
    return 2;
  }
  auto env = make_environment(g);
  if (!env) return 1;
  if (!env->registry().pass("prune")) {
    std::cerr << "keel prune: the prune pass plugin is not installed (see `keel plugins`)\n";
    return 1;
  }
  auto loaded = load_onnx(a.model);
  if (!loaded.is_ok()) {
    std::cerr << "keel prune: " << loaded.status().to_string() << "\n";
    return 1;
  }
  Graph graph = std::move(loaded).value();
  ModelStats s0 = model_stats(graph);
  PassSpec spec{"prune", {}};
  spec.options.values["ratio"] = a.ratio;
  spec.options.values["mode"] = a.mode;
  spec.options.values["coupled"] = a.coupled;
  keel_graph_s view;
  view.graph = &graph;
  view.env = env.get();
  auto reports = PassManager(env->registry(), graph_api()).run(graph, &view, {spec}, a.device);
  if (!reports.is_ok()) {
    std::cerr << "keel prune: " << reports.status().to_string() << "\n";
    return 1;
  }
  for (const PassReport& r : *reports) {
    for (const auto& [k, v] : r.counters) std::cout << "  " << k << ": " << v << "\n";
    for (const auto& n : r.notes) std::cout << "  note: " << n << "\n";
  }
  Status st = infer_shapes(graph);
  if (!st.is_ok()) std::cerr << "keel prune: warning: shape inference on the result: " << st.to_string() << "\n";
  ModelStats s1 = model_stats(graph);
  st = save_onnx(graph, a.output);
  if (!st.is_ok()) {
    std::cerr << "keel prune: " << st.to_string() << "\n";
    return 1;
  }
  auto pct = [](int64_t b, int64_t c) { return b ? 100.0 * (1.0 - static_cast<double>(c) / b) : 0.0; };
  std::cout << std::fixed << std::setprecision(1);
  std::cout << "parameters: " << human(s0.params) << "-> " << human(s1.params) << "(-" << pct(s0.params, s1.params)
            << "%)\n";
  std::cout << "non-zero parameters: " << human(s0.nonzero) << "-> " << human(s1.nonzero) << "(-"
            << pct(s0.nonzero, s1.nonzero) << "%)\n";
  std::cout << "FLOPs (conv/gemm/matmul): " << human(s0.flops) << "-> " << human(s1.flops) << "(-"
            << pct(s0.flops, s1.flops) << "%)\n";
  std::cout << "wrote " << a.output << " (" << human(std::filesystem::file_size(a.output)) << "B)\n";
  return 0;
}

}  // namespace

void add_prune_command(CLI::App& app, Globals& g) {
  auto a = std::make_shared<PruneArgs>();
  auto* cmd = app.add_subcommand("prune",
                                 "Prune a model (magnitude sparsity or Conv channel pruning) and report "
                                 "parameters and FLOPs before/after");
  cmd->add_option("model", a->model, "The model (.onnx)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--output,-o", a->output, "Where to write the pruned model (.onnx)")->required();
  cmd->add_option("--ratio,-r", a->ratio, "Fraction of weights (magnitude) or output channels (channel) to remove");
  cmd->add_option("--mode,-m", a->mode, "channel (structured) or magnitude (unstructured)");
  cmd->add_option("--coupled", a->coupled,
                  "channel mode: prune residual-coupled channel groups jointly (true, default) or only the "
                  "Convs outside them (false)");
  cmd->callback([a, &g] {
    int rc = prune(*a, g);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace keel::cli
