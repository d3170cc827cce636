// keel/core/train/onnx_module.h — an ONNX model as a trainable nn::Module (fine-tuning imported models).
//
// The graph's floating initializers become parameters (requires_grad) named after the initializers: a dotted name
// ("features.0.weight", PyTorch's export) becomes a path of child modules, so state dicts and checkpoints line up
// with the exporting framework's; BatchNormalization's running statistics (inputs 3 and 4) and integer initializers
// (Reshape targets, indices) become buffers. forward() runs the graph's nodes in topological order as eager ops
// (eager::call_op: the same kernels, with ops/gradients.h's rules for backward), so training, autocast, tracing and
// export_onnx work as for a hand-written module. BatchNormalization runs in inference mode with the stored
// statistics (frozen batch norm, the usual choice when fine-tuning) and Dropout as ONNX's inference-mode identity.
// Ops without an eager kernel or a gradient rule fail in forward/backward with eager::Error naming the op; graphs
// with subgraph attributes (If, Loop, Scan) are refused at load.
//
// freeze(pattern) stops gradients for parameters whose dotted name matches a regular expression (ECMAScript,
// searched), trainable_parameters() is what the optimizer should get; replace_head(n) swaps the classifier — the
// Gemm (or MatMul followed by Add) that produces the graph's first output — for a new one with n outputs, initialised
// as nn::Linear is.
// Thread-safety: a module is used by one thread at a time.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/base/graph.h"
#include "core/base/status.h"
#include "core/runtime/eager.h"
#include "core/train/nn.h"

namespace keel::train {

class OnnxModule : public nn::Module {
 public:
  static StatusOr<std::shared_ptr<OnnxModule>> load(const std::filesystem::path& file);
  static StatusOr<std::shared_ptr<OnnxModule>> from_graph(Graph graph, const std::string& origin = "graph");

  // The first graph input -> the first graph output.
  Tensor forward(const Tensor& x) override;
  // Every graph input (in order) -> every graph output (in order).
  std::vector<Tensor> forward_all(const std::vector<Tensor>& inputs);

  // Parameters whose dotted name matches `pattern` stop requiring grad. Returns how many; INVALID_ARGUMENT for a bad
  // pattern or one that matches no parameter (naming some that exist).
  StatusOr<int64_t> freeze(const std::string& pattern);
  std::vector<Tensor> trainable_parameters() const;
  // A new classifier with `num_classes` outputs; returns the names of its weight and bias parameters.
  StatusOr<std::vector<std::string>> replace_head(int64_t num_classes);

  const Graph& graph() const { return graph_; }
  const std::vector<std::string>& input_names() const { return graph_.inputs; }

 private:
  OnnxModule() : nn::Module("OnnxModule") {}
  Tensor* slot_for(const std::string& dotted, Tensor t, bool parameter);

  Graph graph_;
  std::vector<NodeId> order_;
  std::map<std::string, Tensor*> values_;           // initializer name -> its parameter or buffer slot
  std::map<std::string, std::string> param_names_;  // initializer name -> dotted parameter name
};

}  // namespace keel::train
