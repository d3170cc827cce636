// `keel optimize MODEL.onnx -o OUT.onnx [--passes a,b,c | --config FILE.toml] [--device cpu]` — runs a pass pipeline
// (passes are plugins; see passes/) on a model and writes the result as ONNX, printing what every pass did: nodes
// before/after, its counters (ops fused, bytes saved, ...), its notes and its time.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <unordered_set>

#include "core/base/pass_manager.h"
#include "core/runtime/host_api.h"
#include "core/runtime/kernel_context.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/pipelines.h"
#include "tools/keel/commands.h"

namespace keel::cli {
namespace {

struct OptimizeArgs {
  std::string model, output, passes, config, device = "cpu";
  bool list = false;
};

std::map<std::string, size_t> op_histogram(const Graph& g) {
  std::map<std::string, size_t> h;
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    h[(n->domain.empty() ? "" : n->domain + ".") + n->op_type]++;
  }
  return h;
}

uint64_t initializer_bytes(const Graph& g) {
  uint64_t b = 0;
  for (const auto& [k, t] : g.initializers) b += t.byte_size();
  return b;
}

// Drops value info of values the passes removed, so the saved model describes only what exists.
void drop_stale_value_info(Graph& g) {
  std::unordered_set<std::string> live(g.inputs.begin(), g.inputs.end());
  live.insert(g.outputs.begin(), g.outputs.end());
  for (const auto& [k, t] : g.initializers) live.insert(k);
  for (NodeId id : g.node_ids())
    for (const auto& o : g.node(id)->outputs) live.insert(o);
  for (auto it = g.value_info.begin(); it != g.value_info.end();)
    it = live.count(it->first) ? std::next(it) : g.value_info.erase(it);
}

std::string format_bytes(uint64_t b) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2);
  if (b >= (1ull << 20)) os << static_cast<double>(b) / (1 << 20) << " MiB";
  else if (b >= 1024) os << static_cast<double>(b) / 1024 << " KiB";
  else os << b << " B";
  return os.str();
}

int optimize(const OptimizeArgs& a, Globals& g) {
  auto env = make_environment(g);
  if (!env) return 1;
  const Registry& reg = env->registry();
  if (a.list) {
    std::cout << "registered passes:\n";
    for (const auto& p : reg.passes())
      std::cout << "  " << std::left << std::setw(34) << p->name << p->description << "\n";
    return 0;
  }
  if (a.model.empty() || a.output.empty()) {
    std::cerr << "keel optimize: give MODEL.onnx and -o OUT.onnx (or --list-passes)\n";
    return 2;
  }
  // The pipeline.
  std::vector<PassSpec> pipeline;
  if (!a.config.empty()) {
    std::ifstream f(a.config);
    if (!f) {
      std::cerr << "keel optimize: cannot read '" << a.config << "'\n";
      return 1;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    auto p = parse_pipeline_toml(ss.str(), a.config);
    if (!p.is_ok()) {
      std::cerr << "keel optimize: " << p.status().to_string() << "\n";
      return 1;
    }
    pipeline = std::move(p).value();
  } else if (!a.passes.empty() && a.passes != "default") {
    auto p = parse_pipeline_list(a.passes);
    if (!p.is_ok()) {
      std::cerr << "keel optimize: " << p.status().to_string() << "\n";
      return 2;
    }
    pipeline = std::move(p).value();
  } else {
    // The default pipeline runs what is installed: a missing pass plugin narrows it, with a note.
    std::vector<std::string> missing;
    for (const std::string& name : default_pipeline(*env, &missing)) pipeline.push_back(PassSpec{name, {}});
    if (!missing.empty()) {
      std::string m;
      for (const auto& s : missing) m += (m.empty() ? "" : ", ") + s;
      std::cerr << "keel optimize: note: passes not installed, skipped from the default pipeline: " << m
                << " (see `keel plugins`)\n";
    }
  }
  if (!reg.device(a.device)) {
    std::cerr << "keel optimize: device '" << a.device << "' is not available (see `keel plugins`)\n";
    return 1;
  }

  auto loaded = load_onnx(a.model);
  if (!loaded.is_ok()) {
    std::cerr << "keel optimize: " << loaded.status().to_string() << "\n";
    return 1;
  }
  Graph graph = std::move(loaded).value();
  const size_t nodes0 = graph.node_count();
  const uint64_t bytes0 = initializer_bytes(graph);
  auto hist0 = op_histogram(graph);

  keel_graph_s view;
  view.graph = &graph;
  view.env = env.get();
  PassManager pm(reg, graph_api());
  auto t0 = std::chrono::steady_clock::now();
  auto reports = pm.run(graph, &view, pipeline, a.device);
  double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!reports.is_ok()) {
    std::cerr << "keel optimize: " << reports.status().to_string() << "\n";
    return 1;
  }
  std::cout << std::left << std::setw(34) << "pass" << std::right << std::setw(8) << "nodes" << std::setw(8) << "->"
            << std::setw(12) << "ms"
            << "  changes\n";
  for (const PassReport& r : *reports) {
    std::ostringstream changes;
    for (const auto& [k, v] : r.counters) {
      if (v == 0) continue;
      changes << (changes.tellp() > 0 ? ", " : "") << k << " "
              << (k.find("bytes") != std::string::npos ? format_bytes(v) : std::to_string(v));
    }
    std::cout << std::left << std::setw(34) << r.pass << std::right << std::setw(8) << r.nodes_before << std::setw(8)
              << r.nodes_after << std::setw(12) << std::fixed << std::setprecision(2) << r.milliseconds << "  "
              << (changes.tellp() > 0 ? changes.str() : "-") << "\n";
    for (const auto& n : r.notes) std::cout << "    note: " << n << "\n";
  }
  Status st = infer_shapes(graph);
  if (!st.is_ok()) std::cerr << "keel optimize: warning: shape inference on the result: " << st.to_string() << "\n";
  drop_stale_value_info(graph);
  st = save_onnx(graph, a.output);
  if (!st.is_ok()) {
    std::cerr << "keel optimize: " << st.to_string() << "\n";
    return 1;
  }
  auto hist1 = op_histogram(graph);
  std::cout << "nodes: " << nodes0 << " -> " << graph.node_count() << "; constants: " << format_bytes(bytes0) << " -> "
            << format_bytes(initializer_bytes(graph)) << "; passes took " << std::fixed << std::setprecision(1)
            << total_ms << " ms\n";
  std::map<std::string, std::pair<size_t, size_t>> diff;
  for (const auto& [k, v] : hist0) diff[k].first = v;
  for (const auto& [k, v] : hist1) diff[k].second = v;
  std::ostringstream ops;
  for (const auto& [k, v] : diff)
    if (v.first != v.second) ops << (ops.tellp() > 0 ? ", " : "") << k << " " << v.first << "->" << v.second;
  if (ops.tellp() > 0) std::cout << "ops: " << ops.str() << "\n";
  std::cout << "wrote " << a.output << "\n";
  return 0;
}

}  // namespace

std::vector<std::string> default_pipeline(const Environment& env, std::vector<std::string>* missing) {
  return default_pass_pipeline(env.registry(), missing);  // core/runtime/pipelines.h: the C/C++ API's as well
}

void add_optimize_command(CLI::App& app, Globals& g) {
  auto a = std::make_shared<OptimizeArgs>();
  auto* cmd = app.add_subcommand("optimize", "Run graph passes (a pipeline) on an ONNX model and write the result");
  cmd->add_option("model", a->model, "The model (.onnx)")->check(CLI::ExistingFile);
  cmd->add_option("--output,-o", a->output, "Where to write the optimised model (.onnx)");
  auto* passes = cmd->add_option("--passes,-p", a->passes,
                                 "Comma-separated pass names, or 'default' (the default when neither --passes nor "
                                 "--config is given)");
  cmd->add_option("--config,-c", a->config, "A TOML pipeline ([[pass]] name = ..., [pass.options] ...)")
      ->check(CLI::ExistingFile)
      ->excludes(passes);
  cmd->add_option("--device,-d", a->device, "The device type the passes target (fusions need its kernels)");
  cmd->add_flag("--list-passes", a->list, "List the registered passes and exit");
  cmd->callback([a, &g] {
    int rc = optimize(*a, g);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace keel::cli
