#include "core/runtime/shape_values.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "core/base/status.h"
#include "core/runtime/environment.h"
#include "core/runtime/kernel_context.h"

namespace keel::shape_values {
namespace {

// ai.onnx ops evaluated when all their inputs are known: deterministic, cheap, and what shape-computing exports use.
// (Shape and Size are handled apart: they need only their input's static shape.)
bool evaluable(const std::string& op) {
  static const std::unordered_set<std::string> kOps = {"Constant",
                                                       "Identity",
                                                       "Cast",
                                                       "Gather",
                                                       "Unsqueeze",
                                                       "Squeeze",
                                                       "Concat",
                                                       "Slice",
                                                       "Reshape",
                                                       "Flatten",
                                                       "Transpose",
                                                       "Expand",
                                                       "Tile",
                                                       "ConstantOfShape",
                                                       "Range",
                                                       "Where",
                                                       "Add",
                                                       "Sub",
                                                       "Mul",
                                                       "Div",
                                                       "Mod",
                                                       "Neg",
                                                       "Abs",
                                                       "Floor",
                                                       "Ceil",
                                                       "Sqrt",
                                                       "Min",
                                                       "Max",
                                                       "Equal",
                                                       "Less",
                                                       "Greater",
                                                       "LessOrEqual",
                                                       "GreaterOrEqual",
                                                       "Not",
                                                       "And",
                                                       "Or",
                                                       "ReduceProd",
                                                       "ReduceSum",
                                                       "ReduceMin",
                                                       "ReduceMax"};
  return kOps.count(op) != 0;
}

bool small_dtype(DType d) {
  switch (d) {
    case DType::kI64:
    case DType::kI32:
    case DType::kF32:
    case DType::kF64:
    case DType::kBool: return true;
    default: return false;
  }
}

// The static shape of `v` from the inferred types, or nullptr.
const Shape* static_shape(const std::unordered_map<std::string, ValueInfo>& types, const std::string& v) {
  auto it = types.find(v);
  if (it == types.end() || !it->second.is_tensor() || !it->second.shape) return nullptr;
  for (int64_t d : *it->second.shape)
    if (d < 0) return nullptr;
  return &*it->second.shape;
}

// The environment whose registry holds the reference kernels alone. Never destroyed: kernels may be evaluated from
// static destructors' shape inference, and the kernels keep the host API pointer it registered.
Environment* reference_environment() {
  static Environment* env = [] {
    EnvironmentOptions o;
    o.discover_plugins = false;
    o.threads = 1;
    auto e = Environment::create(o);
    return e.is_ok() ? std::move(e).value().release() : nullptr;
  }();
  return env;
}

// Runs `node` on the first reference kernel that takes it. Outputs over kMaxElements, and workspace over 64 KiB, are
// refused (the kernel fails, the values stay unknown).
StatusOr<std::vector<Tensor>> evaluate(const Node& node, int32_t opset, const std::vector<Tensor>& inputs,
                                       const std::vector<DType>& out_dtypes) {
  Environment* env = reference_environment();
  if (env == nullptr) return failed_precondition("no reference environment");
  std::string reasons;
  for (const KernelEntry* k : env->registry().kernels_for("", node.op_type, opset, "cpu")) {
    keel_kernel_context_t ctx;
    ctx.node = &node;
    ctx.opset = opset;
    ctx.pool = &env->thread_pool();
    ctx.bind_inputs(inputs);
    ctx.output_dtypes = out_dtypes;
    void* state = k->def.user_data;
    if (k->def.create) {
      ctx.phase = keel_kernel_context_t::Phase::kCreate;
      Status cs = Status::from_c(k->def.create(k->def.user_data, &ctx, &state));
      if (!cs.is_ok()) {
        reasons += (reasons.empty() ? "" : "; ") + k->name + ": " + cs.message();
        continue;
      }
    }
    ctx.phase = keel_kernel_context_t::Phase::kCompute;
    ctx.outputs.assign(out_dtypes.size(), Tensor());
    ctx.output_views.assign(out_dtypes.size(), keel_tensor_t{});
    ctx.allocate_output = [](int32_t, DType dtype, const Shape& shape) -> StatusOr<Tensor> {
      if (shape_numel(shape) > kMaxElements) return invalid_argument("shape value over the size limit");
      return Tensor::host(dtype, shape);
    };
    std::vector<std::unique_ptr<char[]>> workspace;
    ctx.allocate_workspace = [&workspace](uint64_t bytes) -> StatusOr<void*> {
      if (bytes > (uint64_t{1} << 16)) return invalid_argument("workspace over the size limit");
      workspace.push_back(std::make_unique<char[]>(bytes));
      return static_cast<void*>(workspace.back().get());
    };
    Status st = Status::from_c(k->def.compute(state, &ctx));
    if (k->def.create && k->def.release) k->def.release(state);
    if (!st.is_ok()) {
      reasons += (reasons.empty() ? "" : "; ") + k->name + ": " + st.message();
      continue;
    }
    for (size_t i = 0; i < out_dtypes.size(); ++i)
      if (out_dtypes[i] != DType::kUndefined && !ctx.outputs[i].defined())
        return internal_error("kernel " + k->name + " did not write output " + std::to_string(i));
    return std::move(ctx.outputs);
  }
  return unimplemented(reasons.empty() ? "no reference kernel" : reasons);
}

}  // namespace

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KEEL_SHAPE_VALUES");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

int64_t propagate(const Graph& graph, const std::unordered_map<std::string, ValueInfo>& types,
                  std::unordered_map<std::string, Tensor>& known, std::unordered_set<NodeId>& tried) {
  if (known.empty()) {
    for (const auto& [name, t] : graph.initializers)
      if (!graph.is_graph_input(name) && small_dtype(t.dtype()) && t.numel() <= kMaxElements && t.location().is_host())
        known.emplace(name, t);
  }
  auto order = graph.topological_order();
  if (!order.is_ok()) return 0;
  int32_t opset = 0;
  if (auto it = graph.opsets.find(""); it != graph.opsets.end()) opset = it->second;
  int64_t learnt = 0;
  // Whether a value can teach ONNX inference something: a node reading it has an output not statically shaped.
  auto informative = [&](const std::string& v) -> int64_t {
    for (NodeId c : graph.consumers(v))
      for (const auto& o : graph.node(c)->outputs)
        if (!o.empty() && !static_shape(types, o)) return 1;
    return 0;
  };
  for (NodeId id : *order) {
    if (tried.count(id)) continue;
    const Node& n = *graph.node(id);
    if (!n.domain.empty() || n.outputs.empty()) continue;
    // Every output must be typed, statically shaped and small: that bounds what evaluation allocates.
    std::vector<DType> out_dtypes;
    bool outputs_ok = true;
    for (const auto& o : n.outputs) {
      if (o.empty()) {
        out_dtypes.push_back(DType::kUndefined);
        continue;
      }
      const Shape* s = static_shape(types, o);
      outputs_ok =
          outputs_ok && s && shape_numel(*s) <= kMaxElements && small_dtype(types.at(o).dtype) && !known.count(o);
      out_dtypes.push_back(outputs_ok ? types.at(o).dtype : DType::kUndefined);
    }
    if (!outputs_ok) continue;
    if (n.op_type == "Shape" || n.op_type == "Size") {
      const Shape* in = n.inputs.empty() ? nullptr : static_shape(types, n.inputs[0]);
      if (in == nullptr || out_dtypes[0] != DType::kI64) continue;
      tried.insert(id);
      const int64_t r = static_cast<int64_t>(in->size());
      std::vector<int64_t> v;
      if (n.op_type == "Size") {
        v = {shape_numel(*in)};
        if (v[0] == std::numeric_limits<int64_t>::max()) continue;  // saturated: more elements than int64 holds
      } else {  // opset 15's start/end, clamped as the reference kernel does
        int64_t s = n.attr_int("start", 0), e = n.attr_int("end", r);
        if (s < 0) s += r;
        if (e < 0) e += r;
        s = std::clamp<int64_t>(s, 0, r);
        e = std::clamp<int64_t>(e, 0, r);
        for (int64_t i = s; i < e; ++i) v.push_back((*in)[static_cast<size_t>(i)]);
      }
      Shape shape = n.op_type == "Size" ? Shape{} : Shape{static_cast<int64_t>(v.size())};
      if (shape != *static_shape(types, n.outputs[0])) continue;
      known.emplace(n.outputs[0], Tensor::from_vector(DType::kI64, shape, v));
      learnt += informative(n.outputs[0]);
      continue;
    }
    if (!evaluable(n.op_type)) continue;
    std::vector<Tensor> inputs;
    bool inputs_known = true;
    for (const auto& v : n.inputs) {
      if (v.empty()) {
        inputs.emplace_back();
        continue;
      }
      auto it = known.find(v);
      if (it == known.end()) {
        inputs_known = false;
        break;
      }
      inputs.push_back(it->second);
    }
    if (!inputs_known) continue;
    tried.insert(id);
    auto outs = evaluate(n, opset, inputs, out_dtypes);
    if (!outs.is_ok()) continue;
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (n.outputs[i].empty() || !(*outs)[i].defined()) continue;
      // A kernel that disagrees with inference (dtype or element count) teaches nothing.
      const Tensor& t = (*outs)[i];
      if (t.dtype() != out_dtypes[i] || t.shape() != *static_shape(types, n.outputs[i])) continue;
      known.emplace(n.outputs[i], t);
      learnt += informative(n.outputs[i]);
    }
  }
  return learnt;
}

}  // namespace keel::shape_values
