#include "tools/keel/model_work.h"

#include <set>
#include <string>

namespace keel::cli {

namespace {

int64_t product(const Shape& s, size_t from) {
  int64_t p = 1;
  for (size_t d = from; d < s.size(); ++d) {
    if (s[d] < 0) return -1;
    p *= s[d];
  }
  return p;
}

}  // namespace

ModelWork model_work(const Graph& g) {
  auto shape_of = [&](const Node& n, size_t slot) -> const Shape* {
    if (slot >= n.inputs.size() || n.inputs[slot].empty()) return nullptr;
    const ValueInfo* vi = g.info(n.inputs[slot]);
    if (vi && vi->shape) return &*vi->shape;
    auto in = g.initializers.find(n.inputs[slot]);
    return in != g.initializers.end() ? &in->second.shape() : nullptr;
  };
  auto out_shape = [&](const Node& n) -> const Shape* {
    if (n.outputs.empty()) return nullptr;
    const ValueInfo* vi = g.info(n.outputs[0]);
    return vi && vi->shape ? &*vi->shape : nullptr;
  };
  std::set<std::string> dequantized;  // values DequantizeLinear makes
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    if (n->domain.empty() && n->op_type == "DequantizeLinear" && !n->outputs.empty()) dequantized.insert(n->outputs[0]);
  }
  auto from_dq = [&](const Node& n, size_t slot) {
    return slot < n.inputs.size() && dequantized.count(n.inputs[slot]);
  };

  ModelWork w;
  for (NodeId id : g.node_ids()) {
    const Node& n = *g.node(id);
    if (!n.domain.empty()) continue;
    const std::string& op = n.op_type;
    // The slots of data and weight, and whether the op is quantized by definition.
    size_t x = 0, wt = 1;
    bool quantized = false;
    if (op == "QLinearConv" || op == "QLinearMatMul") {
      wt = 3;  // after x, x_scale, x_zero_point
      quantized = true;
    } else if (op == "ConvInteger" || op == "MatMulInteger") {
      quantized = true;
    } else if (op != "Conv" && op != "ConvTranspose" && op != "Gemm" && op != "MatMul") {
      continue;
    }
    const Shape* y = out_shape(n);
    const Shape* xs = shape_of(n, x);
    const Shape* ws = shape_of(n, wt);
    const int64_t y_numel = y ? product(*y, 0) : -1;
    int64_t macs = -1;
    if (op == "Conv" || op == "QLinearConv" || op == "ConvInteger") {
      // Each output element: C/group x kernel taps, which is W's shape after its first dimension.
      if (ws && ws->size() >= 3 && y_numel >= 0 && product(*ws, 1) >= 0) macs = y_numel * product(*ws, 1);
    } else if (op == "ConvTranspose") {
      // Each input element reaches M/group x kernel taps outputs: W is [C, M/group, k...].
      const int64_t x_numel = xs ? product(*xs, 0) : -1;
      if (ws && ws->size() >= 3 && x_numel >= 0 && product(*ws, 1) >= 0) macs = x_numel * product(*ws, 1);
    } else if (op == "Gemm") {
      if (xs && xs->size() == 2 && y_numel >= 0) macs = y_numel * (n.attr_int("transA", 0) ? (*xs)[0] : (*xs)[1]);
    } else if (xs && !xs->empty() && y_numel >= 0 && xs->back() >= 0) {  // MatMul and its quantized forms
      macs = y_numel * xs->back();
    }
    if (macs < 0) {
      ++w.unknown;
      continue;
    }
    ++w.nodes;
    w.flops += 2 * macs;
    if (quantized || from_dq(n, x) || from_dq(n, wt)) w.int8_flops += 2 * macs;
  }
  return w;
}

}  // namespace keel::cli
