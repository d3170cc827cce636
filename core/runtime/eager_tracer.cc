// The tracer: eager ops recorded as graph IR while a Tracer is alive on the thread ("to_static"), pruned to what the
// marked outputs need, validated and shape-inferred.
#include "core/runtime/eager_internal.h"

#include <set>

#include "core/runtime/onnx_io.h"

namespace keel::eager {

using namespace detail;

struct Tracer::Impl {
  Graph graph;
  int32_t opset = kOpset;
  std::vector<std::shared_ptr<TensorImpl>> keep;  // tensors seen (their addresses name values)
  std::unordered_map<const TensorImpl*, std::string> names;
  std::unordered_map<const TensorImpl*, std::string> param_names;
  std::set<std::string> used;
  bool stopped = false;
  bool uses_keel = false;
  int counter = 0;

  std::string fresh(const std::string& prefix) {
    std::string n;
    do n = prefix + std::to_string(counter++);
    while (used.count(n));
    used.insert(n);
    return n;
  }
  std::string name_of(const Tensor& t) {
    auto it = names.find(t.impl().get());
    if (it != names.end()) return it->second;
    // Not produced by a recorded op: an initializer (parameter, buffer, constant).
    std::string n;
    if (auto p = param_names.find(t.impl().get()); p != param_names.end()) n = p->second;
    else n = fresh("const_");
    used.insert(n);
    graph.initializers[n] = to_host(t.data());
    graph.value_info[n] = ValueInfo{t.dtype(), t.shape()};
    keep.push_back(t.impl());
    names[t.impl().get()] = n;
    return n;
  }
  void record(const std::string& domain, const std::string& op_type, const std::map<std::string, Attribute>& attrs,
              const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
    if (stopped) return;
    Node n;
    n.domain = domain;
    n.op_type = op_type;
    n.attrs = attrs;
    n.name = fresh(op_type + "_");
    for (const auto& t : inputs) n.inputs.push_back(t.defined() ? name_of(t) : std::string());
    for (const auto& t : outputs) {
      if (!t.defined()) {
        n.outputs.push_back("");
        continue;
      }
      std::string v = fresh("v");
      n.outputs.push_back(v);
      names[t.impl().get()] = v;
      keep.push_back(t.impl());
      graph.value_info[v] = ValueInfo{t.dtype(), t.shape()};
    }
    if (domain == "keel") uses_keel = true;
    graph.add_node(std::move(n));
  }
};

namespace detail {

void trace_record(const std::string& domain, const std::string& op_type, const std::map<std::string, Attribute>& attrs,
                  const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  if (t_tracer) t_tracer->record(domain, op_type, attrs, inputs, outputs);
}

}  // namespace detail

Tracer::Tracer(std::string graph_name, int32_t opset) : impl_(std::make_unique<Impl>()) {
  if (t_tracer) fail(failed_precondition("a Tracer is already recording on this thread"));
  if (opset != kOpset)
    fail(invalid_argument("Tracer: eager ops run at opset " + std::to_string(kOpset) + "; opset " +
                          std::to_string(opset) + " requested"));
  impl_->graph.name = std::move(graph_name);
  impl_->opset = opset;
  impl_->graph.opsets = {{"", opset}};
  t_tracer = impl_.get();
}

Tracer::~Tracer() {
  if (t_tracer == impl_.get()) t_tracer = nullptr;
}

void Tracer::input(const Tensor& t, const std::string& name) {
  need_defined(t, "Tracer::input", "tensor");
  if (name.empty() || impl_->used.count(name))
    fail(invalid_argument("Tracer::input: name '" + name + "' is empty or taken"));
  impl_->used.insert(name);
  impl_->names[t.impl().get()] = name;
  impl_->keep.push_back(t.impl());
  impl_->graph.inputs.push_back(name);
  impl_->graph.value_info[name] = ValueInfo{t.dtype(), t.shape()};
}

void Tracer::name_parameter(const Tensor& t, const std::string& name) {
  need_defined(t, "Tracer::name_parameter", "tensor");
  if (name.empty() || impl_->used.count(name))
    fail(invalid_argument("Tracer::name_parameter: name '" + name + "' is empty or taken"));
  if (impl_->names.count(t.impl().get()))
    fail(failed_precondition("Tracer::name_parameter('" + name + "'): the tensor was already used under another name"));
  impl_->used.insert(name);
  impl_->param_names[t.impl().get()] = name;
  impl_->keep.push_back(t.impl());
}

void Tracer::output(const Tensor& t, const std::string& name) {
  need_defined(t, "Tracer::output", "tensor");
  std::string v = impl_->name_of(t);
  if (!name.empty() && name != v) {
    if (impl_->used.count(name)) fail(invalid_argument("Tracer::output: name '" + name + "' is taken"));
    impl_->used.insert(name);
    Node n;
    n.op_type = "Identity";
    n.name = impl_->fresh("Identity_");
    n.inputs = {v};
    n.outputs = {name};
    impl_->graph.add_node(std::move(n));
    impl_->graph.value_info[name] = ValueInfo{t.dtype(), t.shape()};
    v = name;
  }
  impl_->graph.outputs.push_back(v);
}

StatusOr<Graph> Tracer::graph() {
  if (t_tracer == impl_.get()) t_tracer = nullptr;
  impl_->stopped = true;
  Graph& g = impl_->graph;
  if (g.outputs.empty()) return failed_precondition("Tracer::graph: no outputs were marked (Tracer::output)");
  if (impl_->uses_keel) g.opsets["keel"] = 1;
  // Keep only what the outputs need: walk back from them.
  KEEL_ASSIGN_OR_RETURN(auto order, g.topological_order(), "Tracer::graph");
  std::unordered_set<std::string> needed(g.outputs.begin(), g.outputs.end());
  std::unordered_set<NodeId> keep;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node* n = g.node(*it);
    bool wanted = false;
    for (const auto& o : n->outputs) wanted = wanted || (!o.empty() && needed.count(o));
    if (!wanted) continue;
    keep.insert(*it);
    for (const auto& in : n->inputs)
      if (!in.empty()) needed.insert(in);
  }
  for (NodeId id : order)
    if (!keep.count(id)) KEEL_RETURN_IF_ERROR(g.remove_node(id), "Tracer::graph");
  for (auto it = g.initializers.begin(); it != g.initializers.end();) {
    if (!needed.count(it->first)) it = g.initializers.erase(it);
    else ++it;
  }
  std::vector<std::string> inputs;
  for (const auto& in : g.inputs)
    if (needed.count(in)) inputs.push_back(in);
  g.inputs = inputs;
  // Recorded shapes are exact; ONNX inference checks them and fills what was not recorded.
  for (auto it = g.value_info.begin(); it != g.value_info.end();) {
    if (!needed.count(it->first)) it = g.value_info.erase(it);
    else ++it;
  }
  KEEL_RETURN_IF_ERROR(g.validate(), "Tracer::graph");
  KEEL_RETURN_IF_ERROR(infer_shapes(g), "Tracer::graph");
  return g;
}

}  // namespace keel::eager
