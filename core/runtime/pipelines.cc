#include "core/runtime/pipelines.h"

namespace keel {

const std::vector<std::string>& default_pipeline_passes() {
  static const std::vector<std::string> passes = {
      "fold_constants",         "remove_identity",     "eliminate_common_subexpressions",
      "eliminate_dead_code",    "fuse_conv_bn",        "fuse_gelu",
      "fuse_layer_norm",        "fuse_attention",      "fuse_conv_activation",
      "fuse_matmul_activation", "eliminate_dead_code",
  };
  return passes;
}

std::vector<std::string> default_pass_pipeline(const Registry& registry, std::vector<std::string>* missing) {
  std::vector<std::string> out;
  for (const auto& name : default_pipeline_passes()) {
    if (registry.pass(name)) out.push_back(name);
    else if (missing) missing->push_back(name);
  }
  return out;
}

std::vector<std::string> auto_pass_pipeline(const Graph& graph, const Registry& registry) {
  bool qdq = false;
  for (NodeId id : graph.node_ids()) qdq = qdq || graph.node(id)->op_type == "DequantizeLinear";
  if (qdq) {
    std::vector<std::string> out;
    if (registry.pass("fuse_qdq")) out.push_back("fuse_qdq");
    return out;
  }
  return default_pass_pipeline(registry);
}

StatusOr<std::vector<std::string>> named_pass_pipeline(const std::string& name, const Graph& graph,
                                                       const Registry& registry) {
  if (name == "none") return std::vector<std::string>{};
  if (name == "auto") return auto_pass_pipeline(graph, registry);
  return invalid_argument("pipeline '" + name + "' is neither \"auto\" nor \"none\"");
}

}  // namespace keel
