// `keel info MODEL.onnx [--json]` — what a model is: inputs, outputs, opsets, producer, op histogram, parameters.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "core/runtime/onnx_io.h"
#include "tools/keel/commands.h"

namespace keel::cli {
namespace {

struct InfoArgs {
  std::string model;
  bool json = false;
  bool no_check = false;
};

void count_ops(const Graph& g, std::map<std::string, int64_t>& hist, int64_t& nodes) {
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    hist[n->domain.empty() ? n->op_type : n->domain + "." + n->op_type]++;
    ++nodes;
    for (const auto& [k, a] : n->attrs)
      if (a.g) count_ops(*a.g, hist, nodes);
  }
}

std::string type_string(const ValueInfo* vi) {
  if (!vi || vi->dtype == DType::kUndefined) return "?";
  return std::string(dtype_name(vi->dtype)) + (vi->shape ? shape_to_string(*vi->shape) : "[?]");
}

nlohmann::json type_json(const ValueInfo* vi) {
  nlohmann::json j;
  j["dtype"] = vi && vi->dtype != DType::kUndefined ? dtype_name(vi->dtype) : "unknown";
  if (vi && vi->shape) j["shape"] = *vi->shape;
  else j["shape"] = nullptr;
  return j;
}

std::string human_bytes(uint64_t b) {
  std::ostringstream os;
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  os << std::fixed << std::setprecision(u ? 1 : 0) << v << " " << units[u];
  return os.str();
}

int info(const InfoArgs& a) {
  OnnxModelMeta meta;
  OnnxLoadOptions opts;
  opts.meta = &meta;
  opts.check = !a.no_check;
  std::vector<std::string> warnings;
  opts.warn = [&](const std::string& w) { warnings.push_back(w); };
  auto loaded = load_onnx(a.model, opts);
  if (!loaded.is_ok()) {
    std::cerr << "keel info: " << loaded.status().to_string() << "\n";
    return 1;
  }
  const Graph& g = *loaded;
  std::map<std::string, int64_t> hist;
  int64_t nodes = 0;
  count_ops(g, hist, nodes);
  uint64_t params = 0, param_bytes = 0;
  for (const auto& [n, t] : g.initializers) {
    params += static_cast<uint64_t>(t.numel());
    param_bytes += t.byte_size();
  }
  std::vector<std::pair<std::string, int64_t>> ops(hist.begin(), hist.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& x, const auto& y) { return x.second > y.second; });

  if (a.json) {
    nlohmann::json j;
    j["file"] = a.model;
    j["file_bytes"] = meta.file_bytes;
    j["external_data_bytes"] = meta.external_bytes;
    j["ir_version"] = meta.ir_version;
    j["producer"] = {{"name", meta.producer_name}, {"version", meta.producer_version}};
    j["graph_name"] = g.name;
    nlohmann::json declared = nlohmann::json::object(), opsets = nlohmann::json::object();
    for (const auto& [d, v] : meta.declared_opsets) declared[d.empty() ? "ai.onnx" : d] = v;
    for (const auto& [d, v] : g.opsets) opsets[d.empty() ? "ai.onnx" : d] = v;
    j["declared_opsets"] = declared;
    j["opsets"] = opsets;
    j["upgraded"] = meta.upgraded;
    j["inputs"] = nlohmann::json::array();
    for (const auto& n : g.inputs) {
      auto t = type_json(g.info(n));
      t["name"] = n;
      j["inputs"].push_back(t);
    }
    j["outputs"] = nlohmann::json::array();
    for (const auto& n : g.outputs) {
      auto t = type_json(g.info(n));
      t["name"] = n;
      j["outputs"].push_back(t);
    }
    j["nodes"] = nodes;
    j["ops"] = nlohmann::json::object();
    for (const auto& [op, c] : hist) j["ops"][op] = c;
    j["initializers"] = g.initializers.size();
    j["parameters"] = params;
    j["parameter_bytes"] = param_bytes;
    j["warnings"] = warnings;
    std::cout << j.dump(2) << "\n";
    return 0;
  }

  std::cout << "model      " << a.model << "\n";
  std::cout << "file size  " << human_bytes(meta.file_bytes) << " (" << meta.file_bytes << " bytes)";
  if (meta.external_bytes) std::cout << " + " << human_bytes(meta.external_bytes) << " of external data";
  std::cout << "\n";
  std::cout << "producer   " << (meta.producer_name.empty() ? "?" : meta.producer_name)
            << (meta.producer_version.empty() ? "" : " " + meta.producer_version) << "\n";
  std::cout << "ir_version " << meta.ir_version << "\n";
  std::cout << "opsets    ";
  for (const auto& [d, v] : meta.declared_opsets) std::cout << " " << (d.empty() ? "ai.onnx" : d) << "=" << v;
  if (meta.upgraded) {
    std::cout << "  (upgraded to";
    for (const auto& [d, v] : g.opsets) std::cout << " " << (d.empty() ? "ai.onnx" : d) << "=" << v;
    std::cout << ")";
  }
  std::cout << "\n";
  std::cout << "inputs (" << g.inputs.size() << ")\n";
  for (const auto& n : g.inputs) std::cout << "  " << n << ": " << type_string(g.info(n)) << "\n";
  std::cout << "outputs (" << g.outputs.size() << ")\n";
  for (const auto& n : g.outputs) std::cout << "  " << n << ": " << type_string(g.info(n)) << "\n";
  std::cout << "parameters " << params << " in " << g.initializers.size() << " initializers ("
            << human_bytes(param_bytes) << ")\n";
  std::cout << "nodes      " << nodes << " (" << hist.size() << " op types)\n";
  for (const auto& [op, c] : ops)
    std::cout << "  " << std::left << std::setw(28) << op << std::right << std::setw(8) << c << "\n";
  for (const auto& w : warnings) std::cout << "note: " << w << "\n";
  return 0;
}

}  // namespace

void add_info_command(CLI::App& app, Globals& g) {
  auto a = std::make_shared<InfoArgs>();
  auto* cmd =
      app.add_subcommand("info", "Describe an ONNX model: inputs, outputs, opsets, producer, op histogram, size");
  cmd->add_option("model", a->model, "The model (.onnx)")->required()->check(CLI::ExistingFile);
  cmd->add_flag("--json", a->json, "Print JSON");
  cmd->add_flag("--no-check", a->no_check, "Skip the ONNX checker");
  cmd->callback([a] {
    int rc = info(*a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace keel::cli
