// Gradient rules (see gradients.h). Each rule is written against concrete shapes: eager autograd always knows them.
#include "ops/gradients.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace keel::ops {

GradBuilder::GradBuilder(const Node& node, int32_t opset, std::vector<TypeShape> inputs, std::vector<TypeShape> outputs,
                         std::vector<bool> needs_grad)
    : node_(node), opset_(opset), in_(std::move(inputs)), out_(std::move(outputs)), needs_(std::move(needs_grad)) {
  prog_.input_grads.assign(in_.size(), "");
}

std::vector<std::string> GradBuilder::op_n(const std::string& op_type, std::vector<std::string> inputs,
                                           size_t num_outputs, std::map<std::string, Attribute> attrs,
                                           std::vector<bool> wanted, const std::string& domain) {
  GradStep s;
  s.domain = domain;
  s.op_type = op_type;
  s.inputs = std::move(inputs);
  s.attrs = std::move(attrs);
  for (size_t i = 0; i < num_outputs; ++i) {
    bool w = wanted.empty() || (i < wanted.size() && wanted[i]);
    s.outputs.push_back(w ? "t" + std::to_string(counter_++) : std::string());
  }
  prog_.steps.push_back(s);
  return s.outputs;
}

std::string GradBuilder::constant(Tensor t) {
  std::string name = "c" + std::to_string(counter_++);
  prog_.constants[name] = std::move(t);
  return name;
}

std::string GradBuilder::ints(const std::vector<int64_t>& v) {
  return constant(Tensor::from_vector(DType::kI64, {static_cast<int64_t>(v.size())}, v));
}

StatusOr<Tensor> scalar_constant(double v, DType dtype) {
  KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host(dtype, {}), "scalar");
  switch (dtype) {
    case DType::kF32: *t.data<float>() = static_cast<float>(v); break;
    case DType::kF64: *t.data<double>() = v; break;
    case DType::kF16: *t.data<uint16_t>() = f32_to_f16(static_cast<float>(v)); break;
    case DType::kBF16: *t.data<uint16_t>() = f32_to_bf16(static_cast<float>(v)); break;
    case DType::kI64: *t.data<int64_t>() = static_cast<int64_t>(v); break;
    case DType::kI32: *t.data<int32_t>() = static_cast<int32_t>(v); break;
    default: return invalid_argument(std::string("scalar of dtype ") + dtype_name(dtype));
  }
  return t;
}

std::string GradBuilder::scalar(double v, DType dtype) {
  StatusOr<Tensor> t = scalar_constant(v, dtype);
  if (!t.is_ok()) {
    if (status_.is_ok())
      status_ = t.status().with_context("gradient of " + node_.op_type + " (node '" + node_.name + "')");
    return std::string();
  }
  return constant(std::move(t).value());
}

std::string GradBuilder::sum_to(const std::string& g, const Shape& from, const Shape& to) {
  if (from == to) return g;
  // Axes of `from` that `to` broadcast over: leading extra dims, and dims where `to` has 1.
  std::vector<int64_t> axes;
  size_t lead = from.size() - to.size();
  for (size_t d = 0; d < from.size(); ++d)
    if (d < lead || (to[d - lead] == 1 && from[d] != 1)) axes.push_back(static_cast<int64_t>(d));
  std::string r = g;
  if (!axes.empty()) r = op("ReduceSum", {g, ints(axes)}, {{"keepdims", Attribute::of_int(1)}});
  return op("Reshape", {r, ints(to)});
}

void GradBuilder::grad(size_t i, const std::string& value) {
  if (i < prog_.input_grads.size() && needs(i)) prog_.input_grads[i] = value;
}

GradProgram GradBuilder::take() {
  prog_.reads_x.assign(in_.size(), false);
  prog_.reads_y.assign(out_.size(), false);
  prog_.reads_dy.assign(out_.size(), false);
  auto mark = [&](const std::string& v) {
    auto colon = v.find(':');
    if (colon == std::string::npos) return;
    size_t idx = std::stoul(v.substr(colon + 1));
    std::string kind = v.substr(0, colon);
    if (kind == "x" && idx < in_.size()) prog_.reads_x[idx] = true;
    if (kind == "y" && idx < out_.size()) prog_.reads_y[idx] = true;
    if (kind == "dy" && idx < out_.size()) prog_.reads_dy[idx] = true;
  };
  for (const auto& s : prog_.steps)
    for (const auto& v : s.inputs) mark(v);
  for (const auto& v : prog_.input_grads) mark(v);  // a gradient may be an input value itself (Identity)
  return std::move(prog_);
}

namespace {

using B = GradBuilder;
Attribute ai(int64_t v) { return Attribute::of_int(v); }
Attribute ais(std::vector<int64_t> v) { return Attribute::of_ints(std::move(v)); }

Status need_only(B& b, std::initializer_list<size_t> allowed, const char* why) {
  for (size_t i = 0; i < b.num_inputs(); ++i)
    if (b.needs(i) && std::find(allowed.begin(), allowed.end(), i) == allowed.end())
      return unimplemented(b.node().op_type + ": no gradient for input " + std::to_string(i) + " (" + why + ")");
  return Status::ok();
}

// --- elementwise arithmetic (numpy broadcasting) ---
Status g_add(B& b) {
  for (size_t i = 0; i < 2; ++i)
    if (b.needs(i)) b.grad(i, b.sum_to(B::dy(0), b.out(0).shape, b.in(i).shape));
  return Status::ok();
}
Status g_sub(B& b) {
  if (b.needs(0)) b.grad(0, b.sum_to(B::dy(0), b.out(0).shape, b.in(0).shape));
  if (b.needs(1)) b.grad(1, b.op("Neg", {b.sum_to(B::dy(0), b.out(0).shape, b.in(1).shape)}));
  return Status::ok();
}
Status g_mul(B& b) {
  if (b.needs(0)) b.grad(0, b.sum_to(b.op("Mul", {B::dy(0), B::x(1)}), b.out(0).shape, b.in(0).shape));
  if (b.needs(1)) b.grad(1, b.sum_to(b.op("Mul", {B::dy(0), B::x(0)}), b.out(0).shape, b.in(1).shape));
  return Status::ok();
}
Status g_div(B& b) {
  if (b.needs(0)) b.grad(0, b.sum_to(b.op("Div", {B::dy(0), B::x(1)}), b.out(0).shape, b.in(0).shape));
  if (b.needs(1)) {
    std::string t = b.op("Neg", {b.op("Div", {b.op("Mul", {B::dy(0), B::y(0)}), B::x(1)})});
    b.grad(1, b.sum_to(t, b.out(0).shape, b.in(1).shape));
  }
  return Status::ok();
}
Status g_neg(B& b) {
  b.grad(0, b.op("Neg", {B::dy(0)}));
  return Status::ok();
}

// --- activations and unary math ---
Status g_relu(B& b) {
  b.grad(0, b.op("ReluGrad", {B::dy(0), B::y(0)}, {}, "keel"));
  return Status::ok();
}
Status g_sigmoid(B& b) {
  b.grad(0, b.op("SigmoidGrad", {B::dy(0), B::y(0)}, {}, "keel"));
  return Status::ok();
}
Status g_tanh(B& b) {
  b.grad(0, b.op("TanhGrad", {B::dy(0), B::y(0)}, {}, "keel"));
  return Status::ok();
}
Status g_gelu(B& b) {
  // The approximation travels with the gradient (keel.Gelu's "approximate": none = erf, or tanh).
  const Attribute* a = b.node().attr("approximate");
  const std::string approximate = a && a->kind == AttrKind::kString ? a->s : "none";
  b.grad(0, b.op("GeluGrad", {B::dy(0), B::x(0)}, {{"approximate", Attribute::of_string(approximate)}}, "keel"));
  return Status::ok();
}
Status g_leaky_relu(B& b) {
  b.grad(0, b.op("LeakyReluGrad", {B::dy(0), B::x(0)},
                 {{"alpha", Attribute::of_float(b.node().attr_float("alpha", 0.01f))}}, "keel"));
  return Status::ok();
}
Status g_softplus(B& b) {
  b.grad(0, b.op("Mul", {B::dy(0), b.op("Sigmoid", {B::x(0)})}));
  return Status::ok();
}
Status g_exp(B& b) {
  b.grad(0, b.op("Mul", {B::dy(0), B::y(0)}));
  return Status::ok();
}
Status g_log(B& b) {
  b.grad(0, b.op("Div", {B::dy(0), B::x(0)}));
  return Status::ok();
}
Status g_sqrt(B& b) {
  b.grad(0, b.op("Div", {B::dy(0), b.op("Mul", {B::y(0), b.scalar(2.0, b.in(0).dtype)})}));
  return Status::ok();
}
Status g_abs(B& b) {
  b.grad(0, b.op("Mul", {B::dy(0), b.op("Sign", {B::x(0)})}));
  return Status::ok();
}
Status g_pow(B& b) {
  KEEL_RETURN_IF_ERROR(need_only(b, {0}, "the exponent is a constant"), "");
  if (b.in(1).dtype != b.in(0).dtype) return unimplemented("Pow: gradient needs the exponent in the base's dtype");
  std::string em1 = b.op("Sub", {B::x(1), b.scalar(1.0, b.in(1).dtype)});
  std::string d = b.op("Mul", {b.op("Pow", {B::x(0), em1}), B::x(1)});
  b.grad(0, b.sum_to(b.op("Mul", {B::dy(0), d}), b.out(0).shape, b.in(0).shape));
  return Status::ok();
}
Status g_clip(B& b) {
  KEEL_RETURN_IF_ERROR(need_only(b, {0}, "the bounds are constants"), "");
  std::string mask;
  if (b.has_input(1)) mask = b.op("GreaterOrEqual", {B::x(0), B::x(1)});
  if (b.has_input(2)) {
    std::string m2 = b.op("LessOrEqual", {B::x(0), B::x(2)});
    mask = mask.empty() ? m2 : b.op("And", {mask, m2});
  }
  if (mask.empty()) {
    b.grad(0, B::dy(0));
    return Status::ok();
  }
  b.grad(0, b.op("Where", {mask, B::dy(0), b.scalar(0.0, b.in(0).dtype)}));
  return Status::ok();
}
Status g_cast(B& b) {
  if (!dtype_is_float(b.in(0).dtype)) return unimplemented("Cast: no gradient into a non-floating input");
  b.grad(0, b.op("Cast", {B::dy(0)}, {{"to", ai(static_cast<int64_t>(b.in(0).dtype))}}));
  return Status::ok();
}
Status g_reshape_like(B& b) {  // Reshape, Flatten, Identity, Squeeze, Unsqueeze: same elements, another shape
  KEEL_RETURN_IF_ERROR(need_only(b, {0}, "shape inputs are integers"), "");
  b.grad(0, b.op("Reshape", {B::dy(0), b.ints(b.in(0).shape)}));
  return Status::ok();
}
Status g_transpose(B& b) {
  std::vector<int64_t> perm;
  if (const Attribute* a = b.node().attr("perm")) perm = a->ints;
  size_t r = b.in(0).shape.size();
  if (perm.empty())
    for (size_t i = 0; i < r; ++i) perm.push_back(static_cast<int64_t>(r - 1 - i));
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  b.grad(0, b.op("Transpose", {B::dy(0)}, {{"perm", ais(inv)}}));
  return Status::ok();
}
Status g_concat(B& b) {
  int64_t axis = b.node().attr_int("axis", 0);
  int64_t r = static_cast<int64_t>(b.out(0).shape.size());
  if (axis < 0) axis += r;
  std::vector<int64_t> sizes;
  std::vector<bool> wanted;
  for (size_t i = 0; i < b.num_inputs(); ++i) {
    sizes.push_back(b.in(i).shape[static_cast<size_t>(axis)]);
    wanted.push_back(b.needs(i));
  }
  auto parts = b.op_n("Split", {B::dy(0), b.ints(sizes)}, b.num_inputs(), {{"axis", ai(axis)}}, wanted);
  for (size_t i = 0; i < parts.size(); ++i)
    if (!parts[i].empty()) b.grad(i, parts[i]);
  return Status::ok();
}
Status g_expand(B& b) {
  KEEL_RETURN_IF_ERROR(need_only(b, {0}, "the shape is an integer input"), "");
  b.grad(0, b.sum_to(B::dy(0), b.out(0).shape, b.in(0).shape));
  return Status::ok();
}

// --- softmax family ---
int64_t norm_axis(int64_t a, size_t rank) { return a < 0 ? a + static_cast<int64_t>(rank) : a; }
Status g_softmax(B& b) {
  if (b.opset() < 13) return unimplemented("Softmax: gradient needs opset 13 semantics (one axis)");
  int64_t axis = norm_axis(b.node().attr_int("axis", -1), b.in(0).shape.size());
  std::string dot = b.op("ReduceSum", {b.op("Mul", {B::dy(0), B::y(0)}), b.ints({axis})}, {{"keepdims", ai(1)}});
  b.grad(0, b.op("Mul", {B::y(0), b.op("Sub", {B::dy(0), dot})}));
  return Status::ok();
}
Status g_log_softmax(B& b) {
  if (b.opset() < 13) return unimplemented("LogSoftmax: gradient needs opset 13 semantics (one axis)");
  int64_t axis = norm_axis(b.node().attr_int("axis", -1), b.in(0).shape.size());
  std::string s = b.op("ReduceSum", {B::dy(0), b.ints({axis})}, {{"keepdims", ai(1)}});
  b.grad(0, b.op("Sub", {B::dy(0), b.op("Mul", {b.op("Exp", {B::y(0)}), s})}));
  return Status::ok();
}

// --- linear algebra ---
std::vector<int64_t> swap_last2(size_t rank) {
  std::vector<int64_t> p;
  for (size_t i = 0; i < rank; ++i) p.push_back(static_cast<int64_t>(i));
  std::swap(p[rank - 1], p[rank - 2]);
  return p;
}
Status g_matmul(B& b) {
  const Shape& a = b.in(0).shape;
  const Shape& w = b.in(1).shape;
  if (a.size() < 2 || w.size() < 2) return unimplemented("MatMul: gradient of 1-D operands (reshape them to 2-D)");
  Shape yshape = b.out(0).shape;
  if (b.needs(0)) {
    std::string bt = b.op("Transpose", {B::x(1)}, {{"perm", ais(swap_last2(w.size()))}});
    std::string g = b.op("MatMul", {B::dy(0), bt});
    Shape gs = yshape;
    gs.back() = a.back();
    b.grad(0, b.sum_to(g, gs, a));
  }
  if (b.needs(1)) {
    std::string at = b.op("Transpose", {B::x(0)}, {{"perm", ais(swap_last2(a.size()))}});
    std::string g = b.op("MatMul", {at, B::dy(0)});
    Shape gs = yshape;
    gs[gs.size() - 2] = w[w.size() - 2];
    b.grad(1, b.sum_to(g, gs, w));
  }
  return Status::ok();
}
Status g_gemm(B& b) {
  int64_t ta = b.node().attr_int("transA", 0), tb = b.node().attr_int("transB", 0);
  float alpha = b.node().attr_float("alpha", 1.f), beta = b.node().attr_float("beta", 1.f);
  auto gemm = [&](const std::string& p, const std::string& q, int64_t tp, int64_t tq) {
    return b.op("Gemm", {p, q}, {{"transA", ai(tp)}, {"transB", ai(tq)}, {"alpha", Attribute::of_float(alpha)}});
  };
  if (b.needs(0)) b.grad(0, ta == 0 ? gemm(B::dy(0), B::x(1), 0, 1 - tb) : gemm(B::x(1), B::dy(0), tb, 1));
  if (b.needs(1)) b.grad(1, tb == 0 ? gemm(B::x(0), B::dy(0), 1 - ta, 0) : gemm(B::dy(0), B::x(0), 1, ta));
  if (b.has_input(2) && b.needs(2)) {
    std::string g = B::dy(0);
    if (beta != 1.f) g = b.op("Mul", {g, b.scalar(beta, b.out(0).dtype)});
    b.grad(2, b.sum_to(g, b.out(0).shape, b.in(2).shape));
  }
  return Status::ok();
}

// --- convolution and pooling ---
std::map<std::string, Attribute> conv_attrs(const Node& n) {
  std::map<std::string, Attribute> a;
  for (const char* k : {"strides", "pads", "dilations", "group", "kernel_shape", "auto_pad"})
    if (const Attribute* v = n.attr(k)) a[k] = *v;
  return a;
}
// X, W and B's gradients of a convolution from its output's gradient `dy` (one keel.ConvGrad).
void conv_input_grads(B& b, const std::string& dy) {
  const bool bias = b.has_input(2);
  auto outs = b.op_n("ConvGrad", {dy, B::x(0), B::x(1)}, 3, conv_attrs(b.node()),
                     {b.needs(0), b.needs(1), bias && b.needs(2)}, "keel");
  for (size_t i = 0; i < 3; ++i)
    if (!outs[i].empty()) b.grad(i, outs[i]);
}
Status g_conv(B& b) {
  conv_input_grads(b, B::dy(0));
  return Status::ok();
}
// keel.FusedConv = act(conv(X, W) + B + Z) with no activation or Relu (eager's conv2d_relu): the pre-activation
// gradient first (ReluGrad over the output; eager's MaxPool fold may hand it in directly and skip that first step),
// then ConvGrad; Z's gradient is the pre-activation gradient itself.
// The activation of a fused convolution into *act ("" or "Relu", the ones its gradient rule takes), else an error.
Status conv_activation(const B& b, const char* op, std::string* act) {
  const Attribute* a = b.node().attr("activation");
  *act = a ? a->s : std::string();
  if (!act->empty() && *act != "Relu")
    return unimplemented(std::string(op) + ": no gradient for activation '" + *act + "' (only none and Relu)");
  return Status::ok();
}
Status g_fused_conv(B& b) {
  std::string act;
  if (Status st = conv_activation(b, "FusedConv", &act); !st.is_ok()) return st;
  const std::string pre = act.empty() ? B::dy(0) : b.op("ReluGrad", {B::dy(0), B::y(0)}, {}, "keel");
  conv_input_grads(b, pre);
  if (b.has_input(3) && b.needs(3)) b.grad(3, pre);
  return Status::ok();
}
// keel.FusedConvMaxPool (eager's conv2d_relu_max_pool2d): one keel.FusedConvMaxPoolGrad from dP, X, W, the pooled
// output P and the window positions Arg (output 1, which the forward makes when a gradient is wanted).
Status g_fused_conv_max_pool(B& b) {
  std::string act;
  if (Status st = conv_activation(b, "FusedConvMaxPool", &act); !st.is_ok()) return st;
  if (b.num_outputs() < 2 || b.out(1).dtype != DType::kU8)
    return unimplemented("FusedConvMaxPool: its gradient needs the window positions (output Arg)");
  auto attrs = conv_attrs(b.node());
  for (const char* k : {"activation", "pool_kernel_shape", "pool_strides"})
    if (const Attribute* v = b.node().attr(k)) attrs[k] = *v;
  const bool bias = b.has_input(2);
  auto outs = b.op_n("FusedConvMaxPoolGrad", {B::dy(0), B::x(0), B::x(1), B::y(0), B::y(1)}, 3, attrs,
                     {b.needs(0), b.needs(1), bias && b.needs(2)}, "keel");
  for (size_t i = 0; i < 3; ++i)
    if (!outs[i].empty()) b.grad(i, outs[i]);
  return Status::ok();
}
Status g_conv_transpose(B& b) {
  const Node& n = b.node();
  if (n.attr("output_shape") || (n.attr("auto_pad") && n.attr("auto_pad")->s != "NOTSET"))
    return unimplemented("ConvTranspose: gradient needs explicit pads (no output_shape / auto_pad)");
  auto a = conv_attrs(n);
  a.erase("auto_pad");
  if (b.needs(0)) b.grad(0, b.op("Conv", {B::dy(0), B::x(1)}, a));
  if (b.needs(1)) {
    auto outs = b.op_n("ConvGrad", {B::x(0), B::dy(0), B::x(1)}, 3, a, {false, true, false}, "keel");
    b.grad(1, outs[1]);
  }
  if (b.has_input(2) && b.needs(2)) {
    std::vector<int64_t> axes = {0};
    for (size_t d = 2; d < b.out(0).shape.size(); ++d) axes.push_back(static_cast<int64_t>(d));
    b.grad(2, b.op("ReduceSum", {B::dy(0), b.ints(axes)}, {{"keepdims", ai(0)}}));
  }
  return Status::ok();
}
std::map<std::string, Attribute> pool_attrs(const Node& n) {
  std::map<std::string, Attribute> a;
  for (const char* k :
       {"kernel_shape", "strides", "pads", "dilations", "auto_pad", "ceil_mode", "count_include_pad", "storage_order"})
    if (const Attribute* v = n.attr(k)) a[k] = *v;
  return a;
}
Status g_max_pool(B& b) {
  b.grad(0, b.op("MaxPoolGrad", {B::dy(0), B::x(0)}, pool_attrs(b.node()), "keel"));
  return Status::ok();
}
Status g_average_pool(B& b) {
  auto a = pool_attrs(b.node());
  a["input_shape"] = ais(b.in(0).shape);
  b.grad(0, b.op("AveragePoolGrad", {B::dy(0)}, a, "keel"));
  return Status::ok();
}
Status g_global_average_pool(B& b) {
  const Shape& s = b.in(0).shape;
  int64_t n = 1;
  for (size_t d = 2; d < s.size(); ++d) n *= s[d];
  std::string e = b.op("Expand", {B::dy(0), b.ints(s)});
  b.grad(0, b.op("Mul", {e, b.scalar(1.0 / static_cast<double>(n), b.in(0).dtype)}));
  return Status::ok();
}

// --- reductions ---
Status reduce_grad(B& b, const std::vector<int64_t>& axes_in, bool mean) {
  const Shape& s = b.in(0).shape;
  bool keep = b.node().attr_int("keepdims", 1) != 0;
  std::vector<bool> reduced(s.size(), axes_in.empty());
  for (int64_t a : axes_in) reduced[static_cast<size_t>(norm_axis(a, s.size()))] = true;
  Shape kshape = s;
  int64_t n = 1;
  for (size_t d = 0; d < s.size(); ++d)
    if (reduced[d]) {
      kshape[d] = 1;
      n *= s[d];
    }
  std::string g = B::dy(0);
  if (!keep) g = b.op("Reshape", {g, b.ints(kshape)});
  g = b.op("Expand", {g, b.ints(s)});
  if (mean) g = b.op("Mul", {g, b.scalar(1.0 / static_cast<double>(std::max<int64_t>(n, 1)), b.in(0).dtype)});
  b.grad(0, g);
  return Status::ok();
}
Status g_reduce_sum(B& b) {
  if (b.opset() < 13) return unimplemented("ReduceSum: gradient needs opset 13 (axes input)");
  KEEL_RETURN_IF_ERROR(need_only(b, {0}, "axes are integers"), "");
  std::vector<int64_t> axes;
  if (b.has_input(1)) {
    const Tensor* v = b.value(1);
    if (v == nullptr || v->dtype() != DType::kI64) return unimplemented("ReduceSum: gradient needs the axes values");
    axes.assign(v->data<int64_t>(), v->data<int64_t>() + v->numel());
  }
  return reduce_grad(b, axes, false);
}
Status g_reduce_mean(B& b) {
  if (b.opset() >= 18) return unimplemented("ReduceMean: gradient implemented for opsets before 18 (axes attribute)");
  std::vector<int64_t> axes;
  if (const Attribute* a = b.node().attr("axes")) axes = a->ints;
  return reduce_grad(b, axes, true);
}

// --- normalisation ---
Status g_batch_norm_training(B& b) {  // keel.BatchNormTraining(X, scale, B) -> Y, mean, invstd, var
  auto outs = b.op_n("BatchNormGrad", {B::dy(0), B::x(0), B::x(1), B::y(1), B::y(2)}, 3,
                     {{"epsilon", Attribute::of_float(b.node().attr_float("epsilon", 1e-5f))}},
                     {b.needs(0), b.needs(1), b.needs(2)}, "keel");
  for (size_t i = 0; i < 3; ++i)
    if (!outs[i].empty()) b.grad(i, outs[i]);
  return Status::ok();
}
Status g_batch_norm_inference(B& b) {  // ONNX BatchNormalization with running statistics
  KEEL_RETURN_IF_ERROR(need_only(b, {0, 1, 2}, "running statistics are buffers"), "");
  if (b.node().attr_int("training_mode", 0) != 0)
    return unimplemented("BatchNormalization: training_mode (use keel.BatchNormTraining)");
  const Shape& s = b.in(0).shape;
  DType dt = b.in(0).dtype;
  Shape cshape(s.size(), 1);
  cshape[1] = s[1];
  std::vector<int64_t> axes = {0};
  for (size_t d = 2; d < s.size(); ++d) axes.push_back(static_cast<int64_t>(d));
  float eps = b.node().attr_float("epsilon", 1e-5f);
  std::string invstd = b.op("Reciprocal", {b.op("Sqrt", {b.op("Add", {B::x(4), b.scalar(eps, dt)})})});
  std::string inv_c = b.op("Reshape", {invstd, b.ints(cshape)});
  if (b.needs(0)) {
    std::string k = b.op("Reshape", {b.op("Mul", {B::x(1), invstd}), b.ints(cshape)});
    b.grad(0, b.op("Mul", {B::dy(0), k}));
  }
  if (b.needs(1)) {
    std::string xhat = b.op("Mul", {b.op("Sub", {B::x(0), b.op("Reshape", {B::x(3), b.ints(cshape)})}), inv_c});
    b.grad(1, b.op("ReduceSum", {b.op("Mul", {B::dy(0), xhat}), b.ints(axes)}, {{"keepdims", ai(0)}}));
  }
  if (b.needs(2)) b.grad(2, b.op("ReduceSum", {B::dy(0), b.ints(axes)}, {{"keepdims", ai(0)}}));
  return Status::ok();
}
Status g_layer_norm(B& b) {  // ONNX LayerNormalization-17 (outputs Y, Mean, InvStdDev)
  if (b.num_outputs() < 3) return unimplemented("LayerNormalization: gradient needs the Mean and InvStdDev outputs");
  std::vector<bool> w = {b.needs(0), b.needs(1), b.has_input(2) && b.needs(2)};
  std::vector<std::string> ins = {B::dy(0), B::x(0), B::x(1), B::y(1), B::y(2)};
  auto outs = b.op_n("LayerNormGrad", ins, 3, {{"axis", ai(b.node().attr_int("axis", -1))}}, w, "keel");
  for (size_t i = 0; i < 3; ++i)
    if (!outs[i].empty()) b.grad(i, outs[i]);
  return Status::ok();
}

// --- gather / losses ---
Status g_gather(B& b) {
  KEEL_RETURN_IF_ERROR(need_only(b, {0}, "indices are integers"), "");
  b.grad(0, b.op("GatherGrad", {B::dy(0), B::x(1)},
                 {{"axis", ai(b.node().attr_int("axis", 0))}, {"data_shape", ais(b.in(0).shape)}}, "keel"));
  return Status::ok();
}
Status g_softmax_cross_entropy(B& b) {
  KEEL_RETURN_IF_ERROR(need_only(b, {0}, "labels are integers; class weights are constants"), "");
  if (b.num_outputs() < 2) return unimplemented("SoftmaxCrossEntropyLoss: gradient needs the log_prob output");
  std::vector<std::string> ins = {B::dy(0), B::y(1), B::x(1)};
  if (b.has_input(2)) ins.push_back(B::x(2));
  std::map<std::string, Attribute> a = {
      {"reduction", Attribute::of_string(b.node().attr("reduction") ? b.node().attr("reduction")->s : "mean")}};
  if (const Attribute* ii = b.node().attr("ignore_index")) a["ignore_index"] = *ii;
  b.grad(0, b.op("SoftmaxCrossEntropyLossGrad", ins, a, "keel"));
  return Status::ok();
}

struct RuleEntry {
  const char* domain;
  const char* op_type;
  GradRule rule;
};
const RuleEntry kRules[] = {
    {"", "Add", g_add},
    {"", "Sub", g_sub},
    {"", "Mul", g_mul},
    {"", "Div", g_div},
    {"", "Neg", g_neg},
    {"", "Relu", g_relu},
    {"", "Sigmoid", g_sigmoid},
    {"", "Tanh", g_tanh},
    {"", "LeakyRelu", g_leaky_relu},
    {"", "Softplus", g_softplus},
    {"", "Exp", g_exp},
    {"", "Log", g_log},
    {"", "Sqrt", g_sqrt},
    {"", "Abs", g_abs},
    {"", "Pow", g_pow},
    {"", "Clip", g_clip},
    {"", "Cast", g_cast},
    {"", "Reshape", g_reshape_like},
    {"", "Flatten", g_reshape_like},
    {"", "Identity", g_reshape_like},
    {"", "Squeeze", g_reshape_like},
    {"", "Unsqueeze", g_reshape_like},
    {"", "Transpose", g_transpose},
    {"", "Concat", g_concat},
    {"", "Expand", g_expand},
    {"", "Softmax", g_softmax},
    {"", "LogSoftmax", g_log_softmax},
    {"", "MatMul", g_matmul},
    {"", "Gemm", g_gemm},
    {"", "Conv", g_conv},
    {"", "ConvTranspose", g_conv_transpose},
    {"", "MaxPool", g_max_pool},
    {"", "AveragePool", g_average_pool},
    {"", "GlobalAveragePool", g_global_average_pool},
    {"", "ReduceSum", g_reduce_sum},
    {"", "ReduceMean", g_reduce_mean},
    {"", "BatchNormalization", g_batch_norm_inference},
    {"", "LayerNormalization", g_layer_norm},
    {"", "Gather", g_gather},
    {"", "SoftmaxCrossEntropyLoss", g_softmax_cross_entropy},
    {"keel", "Gelu", g_gelu},
    {"keel", "FusedConv", g_fused_conv},
    {"keel", "FusedConvMaxPool", g_fused_conv_max_pool},
    {"keel", "BatchNormTraining", g_batch_norm_training},
};

}  // namespace

GradRule gradient_rule(const std::string& domain, const std::string& op_type) {
  const std::string d = domain == "ai.onnx" ? std::string() : domain;
  for (const auto& r : kRules)
    if (d == r.domain && op_type == r.op_type) return r.rule;
  return nullptr;
}

std::vector<std::string> differentiable_ops() {
  std::vector<std::string> v;
  for (const auto& r : kRules) v.push_back(std::string(*r.domain ? r.domain : "ai.onnx") + "." + r.op_type);
  return v;
}

}  // namespace keel::ops
