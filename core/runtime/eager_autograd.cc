// Eager autograd: op application (autocast, dispatch, recording of grad_fn nodes), the nodes (gradient programs of
// ops/gradients.h, C++ backward functions, leaf accumulators), the backward engine and leaves' post-accumulate hooks.
#include "core/runtime/eager_internal.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/base/log.h"
#include "core/runtime/kernel_dispatch.h"

namespace keel::eager {
namespace detail {

namespace {

keel::Tensor zeros_like_type(const ops::TypeShape& ts, const std::string& mem) {
  keel::Tensor h = check(keel::Tensor::host(ts.dtype, ts.shape), "zeros");
  return mem == "cpu" ? h : copy_to(h, mem);
}

// Runs a gradient program.
struct OpBackward : GradNode {
  std::string domain, op;
  std::shared_ptr<const ops::GradProgram> prog;
  std::vector<keel::Tensor> saved_x, saved_y;
  std::string mem;  // where the forward ran ("cpu" or a device memory type)
  // A MaxPool over a Relu's output keeps its own output, for folding the Relu's backward into its own (run_backward).
  keel::Tensor pooled;
  // A keel.FusedConv with a Relu whose MaxPool folded the Relu's backward (run_backward): the gradient it receives is
  // already its pre-activation's, the value of its program's first step (ReluGrad(dY, Y), g_fused_conv), which is
  // then not run.
  bool grad_is_preact = false;

  std::string name() const override { return op + "Backward"; }

  std::vector<keel::Tensor> apply(std::vector<keel::Tensor>& grads) override {
    std::unordered_map<std::string, keel::Tensor> vals;
    auto lookup = [&](const std::string& v) -> keel::Tensor {
      if (v.empty()) return keel::Tensor();
      auto colon = v.find(':');
      if (colon != std::string::npos) {
        size_t i = std::stoul(v.substr(colon + 1));
        char kind = v[0];
        if (kind == 'x') return saved_x.at(i);
        if (kind == 'y') return saved_y.at(i);
        if (!grads.at(i).defined()) grads[i] = zeros_like_type(out_types.at(i), mem);
        return grads[i];
      }
      if (auto it = vals.find(v); it != vals.end()) return it->second;
      if (auto c = prog->constants.find(v); c != prog->constants.end()) {
        keel::Tensor t = c->second;
        if (mem != "cpu" && !is_small_int(t)) t = device_constant(t, mem);
        vals[v] = t;
        return t;
      }
      fail(internal_error(name() + ": gradient program reads unknown value '" + v + "'"));
    };
    for (size_t k = 0; k < prog->steps.size(); ++k) {
      const ops::GradStep& s = prog->steps[k];
      if (k == 0 && grad_is_preact) {
        vals[s.outputs[0]] = grads.at(0);
        continue;
      }
      std::vector<keel::Tensor> ins;
      for (const auto& v : s.inputs) ins.push_back(lookup(v));
      if (s.domain.empty() && s.op_type == "Reshape" && ins.size() == 2 && is_small_int(ins[1])) {
        Shape shape(ins[1].data<int64_t>(), ins[1].data<int64_t>() + ins[1].numel());
        vals[s.outputs[0]] = check(ins[0].reshaped(shape), name());
        continue;
      }
      std::vector<bool> wanted;
      for (const auto& o : s.outputs) wanted.push_back(!o.empty());
      auto outs = run_kernel(s.domain, s.op_type, s.attrs, ins, s.outputs.size(), wanted);
      for (size_t i = 0; i < outs.size(); ++i)
        if (!s.outputs[i].empty()) vals[s.outputs[i]] = std::move(outs[i]);
    }
    std::vector<keel::Tensor> result;
    for (const auto& g : prog->input_grads) result.push_back(g.empty() ? keel::Tensor() : lookup(g));
    saved_x.clear();
    saved_y.clear();
    return result;
  }
};

// Whether `n` is the backward of the ONNX op `op`.
bool is_op(const GradNode* n, const char* op) {
  const auto* ob = dynamic_cast<const OpBackward*>(n);
  return ob != nullptr && ob->domain.empty() && ob->op == op;
}

// Whether `n` is the backward of a keel.FusedConv with a fused Relu (eager's conv2d_relu): its program starts with
// ReluGrad(dY, Y) (g_fused_conv).
bool is_fused_relu(const GradNode* n) {
  const auto* ob = dynamic_cast<const OpBackward*>(n);
  if (ob == nullptr || ob->domain != "keel" || ob->op != "FusedConv" || ob->prog->steps.empty()) return false;
  const ops::GradStep& s = ob->prog->steps[0];
  return s.op_type == "ReluGrad" && s.inputs == std::vector<std::string>{"dy:0", "y:0"};
}

// A node whose backward is an error (no gradient rule, or the rule rejected the case): reported at backward time.
struct ErrorBackward : GradNode {
  std::string op, message;
  std::string name() const override { return op + "Backward"; }
  std::vector<keel::Tensor> apply(std::vector<keel::Tensor>&) override { fail(unimplemented(message)); }
};

struct AccumulateGrad : GradNode {
  std::shared_ptr<TensorImpl> leaf;
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<keel::Tensor> apply(std::vector<keel::Tensor>&) override { return {}; }
};

std::shared_ptr<GradNode> accumulator_of(const std::shared_ptr<TensorImpl>& leaf) {
  if (auto a = leaf->accumulator.lock()) return a;
  auto a = std::make_shared<AccumulateGrad>();
  a->leaf = leaf;
  a->out_types = {ops::TypeShape{leaf->data.dtype(), leaf->data.shape()}};
  leaf->accumulator = a;
  return a;
}

}  // namespace

Edge edge_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return Edge{};
  const auto& impl = t.impl();
  need(impl);  // a deferred tensor's grad_fn exists once it is computed
  if (impl->grad_fn) return Edge{impl->grad_fn, impl->output_nr};
  return Edge{accumulator_of(impl), 0};
}

void record_unary_grad(Tensor& out, const Tensor& x, const std::string& name,
                       std::function<keel::Tensor(const keel::Tensor&)> fn) {
  if (!t_grad_enabled || !x.requires_grad()) return;
  auto n = std::make_shared<FnBackward>();
  n->nm = name;
  n->fn = [fn = std::move(fn)](std::vector<keel::Tensor>& g) { return std::vector<keel::Tensor>{fn(g[0])}; };
  n->out_types = {ops::TypeShape{out.dtype(), out.shape()}};
  n->next.push_back(edge_of(x));
  out.impl()->requires_grad = true;
  out.impl()->grad_fn = n;
}

// ------------------------------------------------------------------------------------------------ op application

namespace {

const std::set<std::string>& autocast_low_ops() {
  static const std::set<std::string> s = {"Conv", "ConvTranspose", "MatMul", "Gemm"};
  return s;
}
const std::set<std::string>& autocast_f32_ops() {
  static const std::set<std::string> s = {"ReduceSum",
                                          "ReduceMean",
                                          "Softmax",
                                          "LogSoftmax",
                                          "BatchNormalization",
                                          "LayerNormalization",
                                          "SoftmaxCrossEntropyLoss",
                                          "BatchNormTraining",
                                          "Exp",
                                          "Log",
                                          "Pow",
                                          "Sqrt",
                                          "GlobalAveragePool",
                                          "AveragePool"};
  return s;
}

// The kernels of `device` that would take the call with its float inputs in `low` and in f32 (each the first of the
// ranked kernels the dispatch module accepts, kernel_dispatch.h: the same test the call itself will pass or fail;
// nullptr where none does), from one walk over the ranked kernels.
struct LowAndF32Kernels {
  const KernelEntry* low = nullptr;
  const KernelEntry* f32 = nullptr;
};
LowAndF32Kernels kernels_for(const std::string& domain, const std::string& op_type, const std::vector<Tensor>& inputs,
                             const std::string& device, DType low) {
  Node node;
  node.domain = domain;
  node.op_type = op_type;
  auto types_in = [&](DType dt) {
    dispatch::CallTypes types;
    for (const Tensor& t : inputs)
      types.inputs.push_back(!t.defined() ? DType::kUndefined : dtype_is_float(t.dtype()) ? dt : t.dtype());
    return types;
  };
  const dispatch::CallTypes low_types = types_in(low), f32_types = types_in(DType::kF32);
  const int32_t opset = domain.empty() ? kOpset : 1;
  LowAndF32Kernels r;
  for (const KernelEntry* k : dispatch::ranked_kernels(environment().registry(), node, opset, device)) {
    if (!r.low && dispatch::kernel_accepts(*k, node, opset, low_types, nullptr)) r.low = k;
    if (!r.f32 && dispatch::kernel_accepts(*k, node, opset, f32_types, nullptr)) r.f32 = k;
    if (r.low && r.f32) break;
  }
  return r;
}
// adjust_inputs' choice: the low dtype where a kernel as good as the f32 one takes it.
bool low_ranks_first(const LowAndF32Kernels& k) { return k.low && (!k.f32 || k.low->priority >= k.f32->priority); }

// Autocast and type promotion: the dtypes the float inputs of this op run in.
std::vector<Tensor> adjust_inputs(const std::string& domain, const std::string& op_type, std::vector<Tensor> inputs) {
  std::vector<size_t> fl;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && dtype_is_float(inputs[i].dtype())) fl.push_back(i);
  if (fl.empty()) return inputs;
  DType target = DType::kUndefined;
  const DType low = t_autocast;
  const bool onnx = domain.empty();
  if (low != DType::kUndefined &&
      ((onnx && autocast_low_ops().count(op_type)) || (domain == "keel" && op_type == "FusedConv"))) {
    // Low precision only where a kernel as good as the f32 one takes it: on a CPU without fp16 instructions the
    // only f16 Gemm is the reference kernel, which made SimpleCNN's `--amp fp16` step 12x slower than f32's.
    std::string dev = inputs[fl[0]].data().location().device_type;
    const LowAndF32Kernels ks = kernels_for(domain, op_type, inputs, dev, low);
    const auto [low_k, f32_k] = ks;
    if (low_ranks_first(ks)) {
      target = low;
    } else {
      std::string key = op_type + "@" + dev;
      std::lock_guard<std::mutex> lock(rt().mu);
      if (rt().warned.insert(key).second) {
        if (!low_k) log::info("autocast: no {} kernel for {} on {}; it runs in f32", dtype_name(low), op_type, dev);
        else
          log::warn("autocast: {} runs in f32 on {}: its {} kernel there is {}, which ranks below {} (f32)", op_type,
                    dev, dtype_name(low), low_k->name, f32_k->name);
      }
      target = DType::kF32;
    }
  } else if (low != DType::kUndefined &&
             (autocast_f32_ops().count(op_type) || (!onnx && op_type == "BatchNormTraining"))) {
    target = DType::kF32;
    for (size_t i : fl)
      if (inputs[i].dtype() == DType::kF64) target = DType::kF64;
  } else {
    // Mixed float inputs promote to the widest.
    auto rank = [](DType d) { return d == DType::kF64 ? 3 : d == DType::kF32 ? 2 : 1; };
    DType first = inputs[fl[0]].dtype();
    bool mixed = false;
    target = first;
    for (size_t i : fl) {
      DType d = inputs[i].dtype();
      if (d != first) mixed = true;
      if (rank(d) > rank(target)) target = d;
    }
    if (!mixed) return inputs;
  }
  for (size_t i : fl)
    if (inputs[i].dtype() != target) inputs[i] = cast_to(inputs[i], target);
  return inputs;
}

// Ops whose float inputs differ in dtype by design, passed through as given: Cast, and keel.CheckFiniteAndUnscale
// (an f32 inv_scale with f16 / bf16 gradients, which must not be widened).
bool keeps_input_dtypes(const std::string& domain, const std::string& op_type) {
  return op_type == "Cast" || (domain == "keel" && op_type == "CheckFiniteAndUnscale");
}

}  // namespace

bool autocast_runs_low(const std::string& domain, const std::string& op_type, const std::vector<Tensor>& inputs) {
  if (t_autocast == DType::kUndefined) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && dtype_is_float(t.dtype()))
      return low_ranks_first(kernels_for(domain, op_type, inputs, t.data().location().device_type, t_autocast));
  return false;
}

// The core of every op: autocast, dispatch, autograd recording, tracing.
std::vector<Tensor> apply(const std::string& domain, const std::string& op_type, std::vector<Tensor> inputs,
                          const std::map<std::string, Attribute>& attrs, size_t num_outputs, std::vector<bool> wanted,
                          bool differentiable) {
  if (!keeps_input_dtypes(domain, op_type)) inputs = adjust_inputs(domain, op_type, std::move(inputs));
  std::vector<keel::Tensor> datas;
  datas.reserve(inputs.size());
  for (const auto& t : inputs) datas.push_back(t.defined() ? t.data() : keel::Tensor());
  CachedKernel* ck = nullptr;
  auto outs = run_kernel(domain, op_type, attrs, datas, num_outputs, wanted, &ck);
  std::vector<Tensor> result;
  result.reserve(outs.size());
  for (auto& o : outs) result.push_back(o.defined() ? Tensor(std::move(o), false) : Tensor());
  trace_record(domain, op_type, attrs, inputs, result);

  bool any = false;
  if (t_grad_enabled && differentiable)
    for (const auto& t : inputs) any = any || t.requires_grad();
  if (!any) return result;
  uint64_t mask = 0;
  std::vector<bool> needs(inputs.size(), false);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].requires_grad()) {
      needs[i] = true;
      mask |= 1ull << std::min<size_t>(i, 63);
    }
  std::vector<ops::TypeShape> in_types, out_types;
  for (const auto& t : inputs)
    in_types.push_back(t.defined() ? ops::TypeShape{t.dtype(), t.shape()} : ops::TypeShape{});
  for (const auto& t : result)
    out_types.push_back(t.defined() ? ops::TypeShape{t.dtype(), t.shape()} : ops::TypeShape{});
  std::shared_ptr<GradNode> node;
  std::shared_ptr<const ops::GradProgram> prog;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(ck->grad_mu);
    if (auto it = ck->grads.find(mask); it != ck->grads.end()) prog = it->second;
    else if (auto e = ck->grad_errors.find(mask); e != ck->grad_errors.end()) error = e->second;
    else {
      ops::GradRule rule = ops::gradient_rule(domain, op_type);
      if (rule == nullptr) {
        error = "no gradient rule for " + op_label(domain, op_type) + " (ops/gradients.cc)";
      } else {
        ops::GradBuilder b(ck->node, ck->opset, in_types, out_types, needs);
        std::vector<keel::Tensor> values;
        for (size_t i = 0; i < datas.size(); ++i)
          values.push_back(is_shape_input(domain, op_type, i, datas[i]) ? datas[i] : keel::Tensor());
        b.set_values(values);
        Status st = rule(b);
        if (st.is_ok()) st = b.status();  // a failed helper (a scalar of a dtype without numbers)
        if (st.is_ok()) prog = std::make_shared<const ops::GradProgram>(b.take());
        else error = st.message();
      }
      if (prog) ck->grads[mask] = prog;
      else ck->grad_errors[mask] = error;
    }
  }
  if (prog) {
    auto ob = std::make_shared<OpBackward>();
    ob->domain = domain;
    ob->op = op_type;
    ob->prog = prog;
    ob->mem = ck->memory_type;
    ob->saved_x.resize(inputs.size());
    ob->saved_y.resize(result.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (prog->reads_x[i]) ob->saved_x[i] = datas[i];
    for (size_t j = 0; j < result.size(); ++j)
      if (prog->reads_y[j] && result[j].defined()) ob->saved_y[j] = result[j].data();
    if (is_op(ob.get(), "MaxPool") && result.size() == 1 && result[0].defined() && inputs.size() == 1 &&
        inputs[0].defined() &&
        (is_op(inputs[0].impl()->grad_fn.get(), "Relu") || is_fused_relu(inputs[0].impl()->grad_fn.get())))
      ob->pooled = result[0].data();
    node = ob;
  } else {
    auto eb = std::make_shared<ErrorBackward>();
    eb->op = op_type;
    eb->message = error;
    node = eb;
  }
  node->num_outputs = result.size();
  node->out_types = out_types;
  for (size_t i = 0; i < inputs.size(); ++i) node->next.push_back(needs[i] ? edge_of(inputs[i]) : Edge{});
  for (size_t j = 0; j < result.size(); ++j) {
    if (!result[j].defined() || !dtype_is_float(result[j].dtype())) continue;
    result[j].impl()->requires_grad = true;
    result[j].impl()->grad_fn = node;
    result[j].impl()->output_nr = static_cast<uint32_t>(j);
  }
  return result;
}

Tensor apply1(const std::string& op_type, std::vector<Tensor> inputs, const std::map<std::string, Attribute>& attrs,
              const std::string& domain) {
  return apply(domain, op_type, std::move(inputs), attrs, 1)[0];
}

Tensor cast_to(const Tensor& t, DType dt) {
  if (t.dtype() == dt) return t;
  return apply1("Cast", {t}, {{"to", Attribute::of_int(static_cast<int64_t>(dt))}});
}

Tensor wrap_const(keel::Tensor host, const std::string& device) {
  std::string mem = memory_type_of(device);
  return Tensor(mem == "cpu" ? std::move(host) : copy_to(host, mem), false);
}
Tensor scalar_like(const Tensor& t, double v) {
  return Tensor(device_constant(host_scalar(v, t.dtype()), memory_type_of(t.device())), false);
}
Tensor ints_const(const std::vector<int64_t>& v) {
  return Tensor(keel::Tensor::from_vector(DType::kI64, {static_cast<int64_t>(v.size())}, v), false);
}

// ------------------------------------------------------------------------------------------------ backward engine

namespace {

void accumulate(TensorImpl& leaf, keel::Tensor g) {
  if (g.dtype() != leaf.data.dtype()) g = run1("Cast", {g}, {{"to", ai(static_cast<int64_t>(leaf.data.dtype()))}});
  if (g.shape() != leaf.data.shape()) g = check(g.reshaped(leaf.data.shape()), "accumulate grad");
  if (!leaf.grad.defined()) {
    // The gradient may alias another leaf's (Add passes dY through) or a saved value: own a copy.
    leaf.grad = Tensor(copy_to(g, device_name(g.location())), false);
  } else {
    leaf.grad = Tensor(run1("Add", {leaf.grad.data(), g}), false);
  }
}

// Runs a leaf's post-accumulate-grad hooks on a copy of the list (a hook may remove itself or others).
void run_post_accumulate_hooks(const std::shared_ptr<TensorImpl>& leaf) {
  if (leaf->post_accumulate_hooks.empty()) return;
  auto hooks = leaf->post_accumulate_hooks;
  const Tensor handle(leaf);
  for (const auto& [id, hook] : hooks) hook(handle);
}

}  // namespace

void run_backward(const Tensor& root, keel::Tensor root_grad) {
  NoGradGuard no_grad;
  const auto& impl = root.impl();
  if (!impl->grad_fn) {
    accumulate(*impl, std::move(root_grad));
    run_post_accumulate_hooks(impl);
    return;
  }
  // Dependencies: how many edges point at each node from nodes reachable from the root.
  std::unordered_map<GradNode*, int> deps;
  std::vector<GradNode*> stack = {impl->grad_fn.get()};
  std::unordered_set<GradNode*> seen = {impl->grad_fn.get()};
  while (!stack.empty()) {
    GradNode* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next) {
      if (!e.fn) continue;
      deps[e.fn.get()]++;
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }
  std::unordered_map<GradNode*, std::vector<keel::Tensor>> buffers;
  std::unordered_map<GradNode*, std::shared_ptr<GradNode>> owners;
  auto add_grad = [&](const std::shared_ptr<GradNode>& n, uint32_t slot, keel::Tensor g) {
    auto& buf = buffers[n.get()];
    owners[n.get()] = n;
    if (buf.size() < n->num_outputs) buf.resize(n->num_outputs);
    if (!buf[slot].defined()) buf[slot] = std::move(g);
    else buf[slot] = run1("Add", {buf[slot], g});
  };
  add_grad(impl->grad_fn, impl->output_nr, std::move(root_grad));
  std::vector<GradNode*> ready = {impl->grad_fn.get()};
  while (!ready.empty()) {
    GradNode* n = ready.back();
    ready.pop_back();
    std::vector<keel::Tensor> grads = std::move(buffers[n]);
    buffers.erase(n);
    std::shared_ptr<GradNode> hold = owners[n];
    owners.erase(n);
    if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) {
      if (!grads.empty() && grads[0].defined()) {
        accumulate(*acc->leaf, std::move(grads[0]));
        run_post_accumulate_hooks(acc->leaf);
      }
      continue;
    }
    if (n->released)
      fail(failed_precondition("backward through " + n->name() +
                               " a second time: the graph was freed by the first backward"));
    grads.resize(n->num_outputs);
    bool any = false;
    for (const auto& g : grads) any = any || g.defined();
    // MaxPool over a Relu's output Y that nothing else took a gradient from: ReluGrad(MaxPoolGrad(dY, Y), Y) equals
    // MaxPoolGrad(ReluGrad(dY, P), Y) with P = MaxPool(Y) (a window's gradient goes to its maximum, which is P: > 0
    // where the Relu passes it; an all-zero window's first zero gets nothing either way), so the Relu's backward runs
    // over the pooled tensor and the MaxPool's gradient goes straight to the Relu's input: a 2x2 pool's Relu
    // backward reads and writes a quarter of the memory (SimpleCNN's step: about 16 of 60 MB less). The same over a
    // keel.FusedConv with a Relu (conv2d_relu): the MaxPool's gradient is then its pre-activation gradient.
    auto* pool = dynamic_cast<OpBackward*>(n);
    GradNode* relu = n->next.size() == 1 ? n->next[0].fn.get() : nullptr;
    const bool fold_candidate = any && pool && pool->pooled.defined() && grads.size() == 1 && grads[0].defined() &&
                                relu != nullptr && !relu->released && deps[relu] == 1 &&
                                buffers.find(relu) == buffers.end();
    const bool fold = fold_candidate && is_op(relu, "Relu");
    const bool fold_fused = fold_candidate && !fold && is_fused_relu(relu);
    if (fold || fold_fused) grads[0] = run_kernel("keel", "ReluGrad", {}, {grads[0], pool->pooled}, 1, {true})[0];
    if (fold_fused) static_cast<OpBackward*>(relu)->grad_is_preact = true;
    std::vector<keel::Tensor> in_grads;
    if (any) in_grads = n->apply(grads);
    n->released = true;
    if (pool) pool->pooled = keel::Tensor();
    // Folded, the MaxPool's gradient is the Relu's input gradient: it goes along the Relu's edges, the Relu is done.
    const std::vector<Edge>& edges = fold ? relu->next : n->next;
    if (fold) {
      relu->released = true;
      deps[relu] = 0;
      static_cast<OpBackward*>(relu)->saved_y.clear();
    }
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.fn) continue;
      if (i < in_grads.size() && in_grads[i].defined()) add_grad(e.fn, e.input_nr, std::move(in_grads[i]));
      if (--deps[e.fn.get()] == 0) ready.push_back(e.fn.get());
    }
  }
}

}  // namespace detail

using namespace detail;

int64_t Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) {
  need(impl_);
  if (impl_->grad_fn || !impl_->requires_grad)
    fail(failed_precondition("register_post_accumulate_grad_hook: only on a leaf that requires grad"));
  if (!hook) fail(invalid_argument("register_post_accumulate_grad_hook: empty hook"));
  const int64_t id = impl_->next_hook++;
  impl_->post_accumulate_hooks.emplace_back(id, std::move(hook));
  return id;
}

bool Tensor::remove_post_accumulate_grad_hook(int64_t handle) {
  if (!impl_) return false;
  auto& hooks = impl_->post_accumulate_hooks;
  for (auto it = hooks.begin(); it != hooks.end(); ++it) {
    if (it->first == handle) {
      hooks.erase(it);
      return true;
    }
  }
  return false;
}

void Tensor::backward(const Tensor& grad_output) const {
  need(impl_);
  if (!impl_->requires_grad) fail(failed_precondition("backward() on a tensor that does not require grad"));
  keel::Tensor g;
  if (grad_output.defined()) {
    if (grad_output.shape() != shape())
      fail(invalid_argument("backward: grad_output " + grad_output.data().describe() + " does not match " +
                            data().describe()));
    g = grad_output.data();
    if (g.dtype() != dtype()) g = run1("Cast", {g}, {{"to", ai(static_cast<int64_t>(dtype()))}});
  } else {
    if (numel() != 1)
      fail(invalid_argument("backward() without grad_output needs a one-element tensor, got " + data().describe()));
    g = wrap_const(check(keel::Tensor::host(dtype(), shape()), "ones"), device()).data();
    keel::Tensor one = host_scalar(1.0, dtype());
    if (g.location().is_host()) std::memcpy(g.raw_data(), one.raw_data(), one.byte_size());
    else g = copy_to(check(one.reshaped(shape()), "ones"), device_name(g.location()));
  }
  run_backward(*this, std::move(g));
}

}  // namespace keel::eager
