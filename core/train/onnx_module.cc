// keel/core/train/onnx_module.cc — see onnx_module.h.
#include "core/train/onnx_module.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>

#include "core/runtime/onnx_io.h"

namespace keel::train {
namespace {

// A plain container for the children that dotted initializer names create.
class Scope : public nn::Module {
 public:
  Scope() : nn::Module("Scope") {}
};

std::vector<std::string> split_dotted(const std::string& name) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t dot = name.find('.', start);
    std::string part = name.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    parts.push_back(part.empty() ? "_" : part);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

}  // namespace

Tensor* OnnxModule::slot_for(const std::string& dotted, Tensor t, bool parameter) {
  auto parts = split_dotted(dotted);
  nn::Module* m = this;
  try {
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      nn::Module* next = nullptr;
      for (const auto& [n, c] : m->named_children())
        if (n == parts[i]) next = c.get();
      if (!next) next = m->register_module(parts[i], std::make_shared<Scope>()).get();
      m = next;
    }
    return parameter ? m->register_parameter(parts.back(), t) : m->register_buffer(parts.back(), t);
  } catch (const eager::Error&) {
    // A name that is both a leaf and a prefix ("fc" and "fc.weight"): flat, dots replaced.
    std::string flat = dotted;
    for (char& c : flat)
      if (c == '.') c = '_';
    return parameter ? register_parameter(flat, t) : register_buffer(flat, t);
  }
}

StatusOr<std::shared_ptr<OnnxModule>> OnnxModule::load(const std::filesystem::path& file) {
  KEEL_ASSIGN_OR_RETURN(Graph g, load_onnx(file), "fine-tuning " + file.string());
  return from_graph(std::move(g), file.string());
}

StatusOr<std::shared_ptr<OnnxModule>> OnnxModule::from_graph(Graph graph, const std::string& origin) {
  std::shared_ptr<OnnxModule> m(new OnnxModule());
  KEEL_ASSIGN_OR_RETURN(m->order_, graph.topological_order(), origin);
  std::set<std::string> bn_stats;
  for (NodeId id : m->order_) {
    const Node* n = graph.node(id);
    for (const auto& [k, a] : n->attrs)
      if (a.kind == AttrKind::kGraph)
        return Status(StatusCode::kUnimplemented, origin + ": node '" + n->name + "' (" + n->op_type +
                                                      ") has a subgraph; control flow is not trainable eagerly");
    if (n->op_type == "BatchNormalization")
      for (size_t i = 3; i < n->inputs.size() && i < 5; ++i) bn_stats.insert(n->inputs[i]);
  }
  if (graph.inputs.empty() || graph.outputs.empty())
    return Status(StatusCode::kInvalidArgument, origin + ": the graph needs at least one input and one output");
  std::vector<std::string> names;
  for (const auto& [name, t] : graph.initializers) names.push_back(name);
  std::sort(names.begin(), names.end());  // deterministic registration (the map is unordered)
  try {
    eager::NoGradGuard ng;
    for (const auto& name : names) {
      const keel::Tensor& t = graph.initializers.at(name);
      const DType dt = t.dtype();
      const bool floating = dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16 || dt == DType::kF64;
      const bool param = floating && !bn_stats.count(name);
      KEEL_ASSIGN_OR_RETURN(keel::Tensor copy, t.clone(), origin + ": initializer " + name);
      m->values_[name] = m->slot_for(name, Tensor(copy), param);
      if (param) m->param_names_[name] = name;
    }
  } catch (const eager::Error& e) {
    return e.status().with_context(origin);
  }
  m->graph_ = std::move(graph);
  return m;
}

std::vector<Tensor> OnnxModule::forward_all(const std::vector<Tensor>& inputs) {
  if (inputs.size() != graph_.inputs.size())
    throw eager::Error(Status(StatusCode::kInvalidArgument, "OnnxModule: the graph takes " +
                                                                std::to_string(graph_.inputs.size()) +
                                                                " input(s), got " + std::to_string(inputs.size())));
  std::map<std::string, Tensor> v;
  for (size_t i = 0; i < inputs.size(); ++i) v[graph_.inputs[i]] = inputs[i];
  for (const auto& [name, slot] : values_) v[name] = *slot;
  for (NodeId id : order_) {
    const Node* n = graph_.node(id);
    std::vector<Tensor> ins;
    for (const auto& in : n->inputs) {
      if (in.empty()) {
        ins.emplace_back();
        continue;
      }
      auto it = v.find(in);
      if (it == v.end())
        throw eager::Error(Status(StatusCode::kInvalidArgument,
                                  "OnnxModule: node '" + n->name + "' reads '" + in + "', which nothing produced"));
      ins.push_back(it->second);
    }
    // Frozen batch norm / inference-mode dropout: the attributes as exported (training_mode absent = inference).
    std::vector<Tensor> outs = eager::call_op(n->domain, n->op_type, ins, n->attrs, n->outputs.size());
    for (size_t k = 0; k < n->outputs.size() && k < outs.size(); ++k)
      if (!n->outputs[k].empty()) v[n->outputs[k]] = outs[k];
  }
  std::vector<Tensor> out;
  for (const auto& o : graph_.outputs) out.push_back(v.at(o));
  return out;
}

Tensor OnnxModule::forward(const Tensor& x) {
  if (graph_.inputs.size() != 1)
    throw eager::Error(
        Status(StatusCode::kInvalidArgument, "OnnxModule: forward(x) needs a one-input graph; this one has " +
                                                 std::to_string(graph_.inputs.size()) + " (use forward_all)"));
  return forward_all({x}).at(0);
}

StatusOr<int64_t> OnnxModule::freeze(const std::string& pattern) {
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Status(StatusCode::kInvalidArgument, "freeze: bad pattern '" + pattern + "': " + e.what());
  }
  int64_t n = 0;
  std::string some;
  for (auto& [name, p] : named_parameters()) {
    if (some.size() < 200) some += (some.empty() ? "" : ", ") + name;
    if (!std::regex_search(name, re)) continue;
    Tensor t = p;
    t.requires_grad_(false);
    ++n;
  }
  if (n == 0)
    return Status(StatusCode::kInvalidArgument,
                  "freeze: '" + pattern + "' matches no parameter (they are: " + some + ")");
  return n;
}

std::vector<Tensor> OnnxModule::trainable_parameters() const {
  std::vector<Tensor> out;
  for (const auto& p : parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

StatusOr<std::vector<std::string>> OnnxModule::replace_head(int64_t num_classes) {
  if (num_classes < 1) return Status(StatusCode::kInvalidArgument, "replace_head: the class count must be >= 1");
  const std::string out = graph_.outputs.at(0);
  auto producer_of = [&](const std::string& v) -> const Node* {
    for (NodeId id : order_)
      for (const auto& o : graph_.node(id)->outputs)
        if (o == v) return graph_.node(id);
    return nullptr;
  };
  const Node* producer = producer_of(out);
  // Through pass-through ops (the tracer's output Identity, inference-mode Dropout).
  while (producer && (producer->op_type == "Identity" || producer->op_type == "Dropout") && !producer->inputs.empty())
    producer = producer_of(producer->inputs[0]);
  if (!producer) return Status(StatusCode::kInvalidArgument, "replace_head: nothing produces the output '" + out + "'");
  std::string w_name, b_name;
  bool w_out_first = true;  // weight layout [out, in] (Gemm transB = 1) or [in, out]
  if (producer->op_type == "Gemm" && producer->inputs.size() >= 2) {
    w_name = producer->inputs[1];
    w_out_first = producer->attr_int("transB", 0) != 0;
    if (producer->inputs.size() >= 3) b_name = producer->inputs[2];
  } else if (producer->op_type == "Add" && producer->inputs.size() == 2) {
    for (int side = 0; side < 2 && w_name.empty(); ++side) {
      for (NodeId id : order_) {
        const Node* mm = graph_.node(id);
        if (mm->op_type == "MatMul" && mm->outputs.at(0) == producer->inputs[side] && mm->inputs.size() == 2) {
          w_name = mm->inputs[1];
          w_out_first = false;
          b_name = producer->inputs[1 - side];
        }
      }
    }
  }
  if (w_name.empty() || !values_.count(w_name))
    return Status(StatusCode::kInvalidArgument, "replace_head: the output '" + out + "' comes from " +
                                                    producer->op_type + " '" + producer->name +
                                                    "', not from a Gemm or MatMul + Add with a weight initializer");
  Tensor& w = *values_.at(w_name);
  if (w.rank() != 2)
    return Status(StatusCode::kInvalidArgument, "replace_head: the classifier weight '" + w_name + "' is not 2-D");
  const int64_t in = w_out_first ? w.dim(1) : w.dim(0);
  const float bound = 1.f / std::sqrt(static_cast<float>(in));
  try {
    eager::NoGradGuard ng;
    Shape ws = w_out_first ? Shape{num_classes, in} : Shape{in, num_classes};
    w = eager::rand_uniform(ws, -bound, bound, w.dtype()).detach();
    w.requires_grad_(true);
    if (!b_name.empty() && values_.count(b_name)) {
      Tensor& b = *values_.at(b_name);
      b = eager::rand_uniform({num_classes}, -bound, bound, b.dtype()).detach();
      b.requires_grad_(true);
    }
  } catch (const eager::Error& e) {
    return e.status().with_context("replace_head");
  }
  std::vector<std::string> names = {w_name};
  if (!b_name.empty()) names.push_back(b_name);
  return names;
}

}  // namespace keel::train
