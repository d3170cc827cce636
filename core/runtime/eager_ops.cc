// Eager factories (full, zeros, randn, from_vector, ...), the functional ops (matmul, conv2d, pooling,
// activations, normalisations, shape ops, reductions) and the losses.
#include "core/runtime/eager_internal.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <set>
#include <type_traits>

#include "core/base/log.h"
#include "core/base/target_clones.h"

namespace keel::eager {

using namespace detail;

// ------------------------------------------------------------------------------------------------ factories

namespace {
// A factory's device: "cuda", "cuda:1" (the names Tensor::device() gives), or "" for the default device; an absent
// or malformed one is an Error naming it.
std::string dev_or_default(const std::string& d) {
  if (d.empty()) return default_device();
  spec_of(d);
  return d;
}
keel::Tensor host_filled(const Shape& shape, DType dt, const std::function<double()>& value) {
  keel::Tensor t = check(keel::Tensor::host(dt, shape), "factory " + shape_to_string(shape));
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    double v = value();
    switch (dt) {
      case DType::kF32: t.data<float>()[i] = static_cast<float>(v); break;
      case DType::kF64: t.data<double>()[i] = v; break;
      case DType::kF16: t.data<uint16_t>()[i] = f32_to_f16(static_cast<float>(v)); break;
      case DType::kBF16: t.data<uint16_t>()[i] = f32_to_bf16(static_cast<float>(v)); break;
      case DType::kI64: t.data<int64_t>()[i] = static_cast<int64_t>(v); break;
      case DType::kI32: t.data<int32_t>()[i] = static_cast<int32_t>(v); break;
      case DType::kBool:
      case DType::kU8: t.data<uint8_t>()[i] = static_cast<uint8_t>(v); break;
      default: fail(invalid_argument(std::string("factory of dtype ") + dtype_name(dt)));
    }
  }
  return t;
}
// `shape` filled with one value: converted once (as host_filled converts), then its bytes repeated; zero needs no
// pass at all (fresh host memory is zeroed, and 0 is all-zero bits in every dtype).
keel::Tensor host_constant(const Shape& shape, DType dt, double value) {
  const keel::Tensor one = host_filled({}, dt, [value] { return value; });  // also rejects an unsupported dtype
  keel::Tensor t = check(keel::Tensor::host(dt, shape), "factory " + shape_to_string(shape));
  const auto n = static_cast<size_t>(t.numel());
  const auto* bytes = static_cast<const unsigned char*>(one.raw_data());
  if (std::all_of(bytes, bytes + dtype_size(dt), [](unsigned char b) { return b == 0; })) return t;
  switch (dtype_size(dt)) {
    case 1: std::fill_n(t.data<uint8_t>(), n, *one.data<uint8_t>()); break;
    case 2: std::fill_n(t.data<uint16_t>(), n, *one.data<uint16_t>()); break;
    case 4: std::fill_n(t.data<uint32_t>(), n, *one.data<uint32_t>()); break;
    case 8: std::fill_n(t.data<uint64_t>(), n, *one.data<uint64_t>()); break;
    default: fail(invalid_argument(std::string("factory of dtype ") + dtype_name(dt)));
  }
  return t;
}
void check_shape(const Shape& s, const char* what) {
  for (int64_t d : s)
    if (d < 0) fail(invalid_argument(std::string(what) + ": negative dimension in " + shape_to_string(s)));
}
}  // namespace

Tensor full(const Shape& shape, float value, DType dtype, const std::string& device) {
  check_shape(shape, "full");
  return wrap_const(host_constant(shape, dtype, static_cast<double>(value)), dev_or_default(device));
}
Tensor empty(const Shape& shape, DType dtype, const std::string& device) {
  check_shape(shape, "empty");
  return Tensor(alloc_tensor(dtype, shape, memory_type_of(dev_or_default(device))), false);
}
Tensor zeros(const Shape& shape, DType dtype, const std::string& device) { return full(shape, 0.f, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, const std::string& device) { return full(shape, 1.f, dtype, device); }
Tensor randn(const Shape& shape, float stddev, DType dtype) {
  check_shape(shape, "randn");
  std::normal_distribution<double> d(0.0, stddev);
  auto& g = generator();
  return wrap_const(host_filled(shape, dtype, [&] { return d(g); }), default_device());
}
Tensor rand_uniform(const Shape& shape, float lo, float hi, DType dtype) {
  check_shape(shape, "rand_uniform");
  if (!(hi >= lo)) fail(invalid_argument("rand_uniform: hi < lo"));
  std::uniform_real_distribution<double> d(lo, hi);
  auto& g = generator();
  return wrap_const(host_filled(shape, dtype, [&] { return d(g); }), default_device());
}
Tensor from_vector(const std::vector<float>& v, const Shape& shape) {
  check_shape(shape, "from_vector");
  if (static_cast<int64_t>(v.size()) != shape_numel(shape))
    fail(invalid_argument("from_vector: " + std::to_string(v.size()) + " values for shape " + shape_to_string(shape)));
  return wrap_const(keel::Tensor::from_vector(DType::kF32, shape, v), default_device());
}
Tensor from_vector(const std::vector<int64_t>& v, const Shape& shape) {
  check_shape(shape, "from_vector");
  if (static_cast<int64_t>(v.size()) != shape_numel(shape))
    fail(invalid_argument("from_vector: " + std::to_string(v.size()) + " values for shape " + shape_to_string(shape)));
  return wrap_const(keel::Tensor::from_vector(DType::kI64, shape, v), default_device());
}

Tensor cached_constant(const Tensor& t, const std::string& device) {
  const std::string mem = memory_type_of(dev_or_default(device));
  return Tensor(device_constant(to_host(t.data()), mem), false);
}

// ------------------------------------------------------------------------------------------------ ops

std::vector<Tensor> call_op(const std::string& domain, const std::string& op_type, const std::vector<Tensor>& inputs,
                            const std::map<std::string, Attribute>& attrs, size_t num_outputs) {
  return apply(domain == "ai.onnx" ? std::string() : domain, op_type, inputs, attrs, num_outputs);
}

namespace detail {

void need_defined(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) fail(invalid_argument(std::string(op) + ": " + what + " is undefined"));
}
void need_rank(const Tensor& t, int64_t r, const char* op, const char* what) {
  need_defined(t, op, what);
  if (t.rank() != r)
    fail(invalid_argument(std::string(op) + ": " + what + " must have rank " + std::to_string(r) + ", got " +
                          t.data().describe()));
}

}  // namespace detail

Tensor matmul(const Tensor& a, const Tensor& b) {
  need_defined(a, "matmul", "a");
  need_defined(b, "matmul", "b");
  return apply1("MatMul", {a, b});
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  need_rank(w, 2, "linear", "weight");
  need_defined(x, "linear", "x");
  if (x.dim(-1) != w.dim(1))
    fail(invalid_argument("linear: x " + x.data().describe() + " does not match weight " + w.data().describe()));
  if (b.defined() && (b.rank() != 1 || b.dim(0) != w.dim(0)))
    fail(invalid_argument("linear: bias " + b.data().describe() + " must be [" + std::to_string(w.dim(0)) + "]"));
  if (x.rank() == 2) return apply1("Gemm", {x, w, b}, {{"transB", ai(1)}});
  Tensor y = matmul(x, transpose(w, {1, 0}));
  return b.defined() ? y + b : y;
}

namespace {
// The checks every conv2d form makes before it runs or defers: ranks, groups and the bias's length (a kernel would
// read a bias of another length past its end).
void check_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, int64_t groups, const char* op) {
  need_rank(x, 4, op, "input");
  need_rank(w, 4, op, "weight");
  if (groups <= 0) fail(invalid_argument(std::string(op) + ": groups must be positive"));
  if (b.defined() && (b.rank() != 1 || b.dim(0) != w.dim(0)))
    fail(invalid_argument(std::string(op) + ": bias " + shape_to_string(b.shape()) + " does not match " +
                          std::to_string(w.dim(0)) + " output channels"));
}

// Conv's attributes for conv2d and conv2d_relu (symmetric padding, PyTorch's).
std::map<std::string, Attribute> conv2d_attrs(const Tensor& w, std::array<int64_t, 2> stride,
                                              std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation,
                                              int64_t groups) {
  return {{"strides", ais({stride[0], stride[1]})},
          {"pads", ais({padding[0], padding[1], padding[0], padding[1]})},
          {"dilations", ais({dilation[0], dilation[1]})},
          {"group", ai(groups)},
          {"kernel_shape", ais({w.dim(2), w.dim(3)})}};
}
}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, std::array<int64_t, 2> stride,
              std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  check_conv2d(x, w, b, groups, "conv2d");
  if (Tensor d = defer_conv2d(x, w, b, stride, padding, dilation, groups); d.defined()) return d;
  return apply1("Conv", {x, w, b}, conv2d_attrs(w, stride, padding, dilation, groups));
}

Tensor conv2d_relu(const Tensor& x, const Tensor& w, const Tensor& b, std::array<int64_t, 2> stride,
                   std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  NoDeferGuard no_defer;  // its parts, where they run apart, are computed now
  auto unfused = [&] { return relu(conv2d(x, w, b, stride, padding, dilation, groups)); };
  // A trace records the standard ops (an exported model stays plain ONNX).
  if (t_tracer != nullptr) return unfused();
  check_conv2d(x, w, b, groups, "conv2d_relu");
  // Where no kernel takes the fused op (a device without one), the two ops run; remembered per environment, device and
  // dtype, so it is tried once.
  static std::mutex mu;
  static std::set<std::string> lacking;
  const DType at = autocast_dtype() != DType::kUndefined ? autocast_dtype() : x.dtype();
  if (at != DType::kF32 && at != DType::kF16 && at != DType::kBF16) return unfused();  // the fused ops' dtypes
  const std::string key =
      std::to_string(reinterpret_cast<uintptr_t>(&environment())) + "|" + x.device() + "|" + dtype_name(at);
  bool lacks = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    lacks = lacking.count(key) > 0;
  }
  if (lacks) return unfused();  // not under mu: computing a deferred input may come back here
  try {
    auto attrs = conv2d_attrs(w, stride, padding, dilation, groups);
    attrs["activation"] = Attribute::of_string("Relu");
    return apply1("FusedConv", {x, w, b}, attrs, "keel");
  } catch (const Error& e) {
    if (e.status().code() != StatusCode::kUnimplemented) throw;
    log::debug("conv2d_relu: no fused kernel on {} for {} ({}); Conv and Relu run apart", x.device(), dtype_name(at),
               e.status().message());
    std::lock_guard<std::mutex> lock(mu);
    lacking.insert(key);
  }
  return unfused();
}

Tensor conv2d_relu_max_pool2d(const Tensor& x, const Tensor& w, const Tensor& b, std::array<int64_t, 2> pool,
                              std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                              std::array<int64_t, 2> dilation, int64_t groups) {
  NoDeferGuard no_defer;
  auto unfused = [&] { return max_pool2d(conv2d_relu(x, w, b, stride, padding, dilation, groups), pool); };
  check_conv2d(x, w, b, groups, "conv2d_relu_max_pool2d");
  if (pool[0] <= 0 || pool[1] <= 0 || pool[0] * pool[1] > 256)
    fail(invalid_argument("conv2d_relu_max_pool2d: the pool window must be positive and at most 256 positions"));
  // The fused op is f32 on the host (the reference kernel and the CPU plugin's); a device without it would run it
  // through the CPU fallback, slower than its own two kernels. Under autocast it still runs, in f32, for a first
  // layer over at most 4 channels (SimpleCNN's 1 -> 32): a few MFLOP that a 16-bit convolution does not make
  // cheaper, bound by the output it writes, which the fused op pools before storing. With --amp bf16 on a CPU with
  // bf16 instructions the 16-bit Conv, Relu, MaxPool and their gradients took 2.0 ms a SimpleCNN step against 0.84.
  // Over more channels the layer runs apart in 16 bits, unless autocast would run its FusedConv in f32 anyway (no
  // 16-bit kernel there as good as the f32 one: fp16 on a CPU without fp16 instructions): then the fused op, in f32,
  // as without autocast (the LeNet-like model with --amp fp16 on such a CPU stored its 9.4 MB convolution output:
  // peak memory 37.7 MiB against 29.8 in fp32).
  const bool low =
      autocast_dtype() != DType::kUndefined && x.dim(1) > 4 && autocast_runs_low("keel", "FusedConv", {x, w, b});
  if (t_tracer != nullptr || low || x.dtype() != DType::kF32 || x.device().rfind("cpu", 0) != 0) return unfused();
  auto attrs = conv2d_attrs(w, stride, padding, dilation, groups);
  attrs["activation"] = Attribute::of_string("Relu");
  attrs["pool_kernel_shape"] = ais({pool[0], pool[1]});
  attrs["pool_strides"] = ais({pool[0], pool[1]});
  const bool grad = grad_enabled() && (x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()));
  return apply("keel", "FusedConvMaxPool", {x, w, b}, attrs, 2, {true, grad})[0];
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& b, std::array<int64_t, 2> stride,
                        std::array<int64_t, 2> padding, std::array<int64_t, 2> output_padding, int64_t groups) {
  need_rank(x, 4, "conv_transpose2d", "input");
  need_rank(w, 4, "conv_transpose2d", "weight");
  if (groups <= 0) fail(invalid_argument("conv_transpose2d: groups must be positive"));
  return apply1("ConvTranspose", {x, w, b},
                {{"strides", ais({stride[0], stride[1]})},
                 {"pads", ais({padding[0], padding[1], padding[0], padding[1]})},
                 {"output_padding", ais({output_padding[0], output_padding[1]})},
                 {"group", ai(groups)},
                 {"kernel_shape", ais({w.dim(2), w.dim(3)})}});
}

namespace {
std::map<std::string, Attribute> pool_attrs(std::array<int64_t, 2> k, std::array<int64_t, 2> s,
                                            std::array<int64_t, 2> p) {
  if (s[0] == 0) s[0] = k[0];
  if (s[1] == 0) s[1] = k[1];
  return {{"kernel_shape", ais({k[0], k[1]})}, {"strides", ais({s[0], s[1]})}, {"pads", ais({p[0], p[1], p[0], p[1]})}};
}
}  // namespace

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  need_rank(x, 4, "max_pool2d", "input");
  if (Tensor f = fuse_max_pool2d(x, kernel, stride, padding); f.defined()) return f;
  return apply1("MaxPool", {x}, pool_attrs(kernel, stride, padding));
}
Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  need_rank(x, 4, "avg_pool2d", "input");
  auto a = pool_attrs(kernel, stride, padding);
  a["count_include_pad"] = ai(1);
  return apply1("AveragePool", {x}, a);
}
Tensor global_avg_pool2d(const Tensor& x) {
  need_rank(x, 4, "global_avg_pool2d", "input");
  return apply1("GlobalAveragePool", {x});
}

Tensor relu(const Tensor& x) {
  if (Tensor d = defer_relu(x); d.defined()) return d;
  return apply1("Relu", {x});
}
Tensor sigmoid(const Tensor& x) { return apply1("Sigmoid", {x}); }
Tensor tanh(const Tensor& x) { return apply1("Tanh", {x}); }
Tensor gelu(const Tensor& x) { return apply1("Gelu", {x}, {}, "keel"); }
Tensor leaky_relu(const Tensor& x, float slope) { return apply1("LeakyRelu", {x}, {{"alpha", af(slope)}}); }
Tensor softmax(const Tensor& x, int64_t axis) { return apply1("Softmax", {x}, {{"axis", ai(axis)}}); }
Tensor log_softmax(const Tensor& x, int64_t axis) { return apply1("LogSoftmax", {x}, {{"axis", ai(axis)}}); }
Tensor exp(const Tensor& x) { return apply1("Exp", {x}); }
Tensor log(const Tensor& x) { return apply1("Log", {x}); }
Tensor sqrt(const Tensor& x) { return apply1("Sqrt", {x}); }
Tensor abs(const Tensor& x) { return apply1("Abs", {x}); }
Tensor pow(const Tensor& x, float exponent) {
  need_defined(x, "pow", "x");
  return apply1("Pow", {x, scalar_like(x, exponent)});
}
Tensor clamp(const Tensor& x, float lo, float hi) {
  need_defined(x, "clamp", "x");
  if (hi < lo) fail(invalid_argument("clamp: hi < lo"));
  return apply1("Clip", {x, scalar_like(x, lo), scalar_like(x, hi)});
}

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& running_mean, Tensor& running_var,
                  bool training, float momentum, float eps) {
  need_defined(x, "batch_norm", "input");
  if (x.rank() < 2) fail(invalid_argument("batch_norm: input must be [N, C, ...], got " + x.data().describe()));
  const int64_t C = x.dim(1);
  DType pdt = t_autocast != DType::kUndefined && x.dtype() != DType::kF64 ? DType::kF32 : x.dtype();
  Tensor w = weight.defined() ? weight : ones({C}, pdt, x.device());
  Tensor b = bias.defined() ? bias : zeros({C}, pdt, x.device());
  for (const Tensor* t : {&w, &b})
    if (t->shape() != Shape{C}) fail(invalid_argument("batch_norm: weight/bias must be [" + std::to_string(C) + "]"));
  if (training) {
    auto outs = apply("keel", "BatchNormTraining", {x, w, b}, {{"epsilon", af(eps)}}, 4);
    if (running_mean.defined() && running_var.defined()) {
      NoGradGuard ng;
      Tensor m = outs[1].detach(), v = outs[3].detach();
      if (m.dtype() != running_mean.dtype()) m = m.to(running_mean.dtype());
      if (v.dtype() != running_var.dtype()) v = v.to(running_var.dtype());
      running_mean.copy_(running_mean * (1.f - momentum) + m * momentum);
      running_var.copy_(running_var * (1.f - momentum) + v * momentum);
    }
    return outs[0];
  }
  if (!running_mean.defined() || !running_var.defined())
    fail(invalid_argument("batch_norm: evaluation mode needs running_mean and running_var"));
  return apply1("BatchNormalization", {x, w, b, running_mean, running_var}, {{"epsilon", af(eps)}});
}

Tensor layer_norm(const Tensor& x, int64_t normalized_dims, const Tensor& weight, const Tensor& bias, float eps) {
  need_defined(x, "layer_norm", "input");
  if (normalized_dims <= 0 || normalized_dims > x.rank())
    fail(invalid_argument("layer_norm: normalized_dims " + std::to_string(normalized_dims) + " for " +
                          x.data().describe()));
  Shape ns(x.shape().end() - normalized_dims, x.shape().end());
  DType pdt = t_autocast != DType::kUndefined && x.dtype() != DType::kF64 ? DType::kF32 : x.dtype();
  Tensor w = weight.defined() ? weight : ones(ns, pdt, x.device());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&w, &bias})
    if (t->defined() && t->shape() != ns)
      fail(invalid_argument("layer_norm: weight/bias must be " + shape_to_string(ns)));
  std::map<std::string, Attribute> a = {{"axis", ai(x.rank() - normalized_dims)}, {"epsilon", af(eps)}};
  if (x.dtype() == DType::kF64) a["stash_type"] = ai(static_cast<int64_t>(DType::kF64));  // statistics in f64
  auto outs = apply("", "LayerNormalization", {x, w, bias}, a, 3);
  return outs[0];
}

Tensor dropout(const Tensor& x, float p, bool training) {
  need_defined(x, "dropout", "input");
  if (!(p >= 0.f && p < 1.f)) fail(invalid_argument("dropout: p must be in [0, 1), got " + std::to_string(p)));
  if (!training || p == 0.f) return x;
  // The mask (keel.DropoutMask, ops/schemas.cc): one draw of the global generator seeds a SplitMix64 stream for this
  // call, counter-based as PyTorch's GPU dropout is with Philox, so every device computes the same mask where x is
  // (no host loop and copy per step on a GPU). The same seed gives the same mask.
  const auto seed_bits = static_cast<int64_t>(generator()());  // all 64 bits (the kernel reads them back unsigned)
  keel::Tensor seed = keel::Tensor::from_vector(DType::kI64, {}, std::vector<int64_t>{seed_bits});
  const std::string mem = memory_type_of(x.device());
  if (mem != "cpu") seed = copy_to(seed, mem);
  keel::Tensor mask =
      run_kernel("keel", "DropoutMask", {{"ratio", Attribute::of_float(p)}}, {x.data(), seed}, 1, {})[0];
  return x * Tensor(std::move(mask), false);
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  need_rank(weight, 2, "embedding", "weight");
  need_defined(indices, "embedding", "indices");
  if (indices.dtype() != DType::kI64 && indices.dtype() != DType::kI32)
    fail(invalid_argument("embedding: indices must be int64 or int32, got " + indices.data().describe()));
  return apply1("Gather", {weight, indices}, {{"axis", ai(0)}});
}

namespace {
// A view of `x` with shape `s` (same element count, checked by the callers), differentiable. The tracer records it
// as `traced` (Reshape to the constant shape, or Flatten with its axis so a traced batch dimension stays free).
Tensor reshaped_view(const Tensor& x, const Shape& s, const char* traced, int64_t flatten_axis);
}  // namespace

Tensor reshape(const Tensor& x, const std::vector<int64_t>& shape) {
  need_defined(x, "reshape", "input");
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) fail(invalid_argument("reshape: more than one -1 in " + shape_to_string(shape)));
      infer = static_cast<int64_t>(i);
    } else if (s[i] < 0) {
      fail(invalid_argument("reshape: negative dimension in " + shape_to_string(shape)));
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || x.numel() % known != 0)
      fail(invalid_argument("reshape: cannot reshape " + x.data().describe() + " to " + shape_to_string(shape)));
    s[static_cast<size_t>(infer)] = x.numel() / known;
  }
  if (shape_numel(s) != x.numel())
    fail(invalid_argument("reshape: cannot reshape " + x.data().describe() + " to " + shape_to_string(shape)));
  return reshaped_view(x, s, "Reshape", 0);
}

Tensor custom_function(const Tensor& x, const CustomFn& forward, CustomFn backward, const std::string& name) {
  need_defined(x, name.c_str(), "input");
  Tensor out(forward(x.data()), false);
  const DType dt = x.dtype();
  const Shape shape = x.shape();
  record_unary_grad(out, x, name, [backward = std::move(backward), dt, shape, name](const keel::Tensor& g) {
    keel::Tensor dx = backward(g);
    if (dx.dtype() != dt || dx.shape() != shape)
      fail(invalid_argument(name + ": backward returned " + dx.describe() + " for an input of " +
                            std::string(dtype_name(dt)) + shape_to_string(shape)));
    return dx;
  });
  return out;
}

namespace {
Tensor reshaped_view(const Tensor& x, const Shape& s, const char* traced, int64_t flatten_axis) {
  Tensor out(check(x.data().reshaped(s), "reshape"), false);
  if (std::string(traced) == "Flatten")
    trace_record("", "Flatten", {{"axis", Attribute::of_int(flatten_axis)}}, {x}, {out});
  else trace_record("", "Reshape", {}, {x, ints_const(s)}, {out});
  const Shape from = x.shape();
  record_unary_grad(out, x, "ReshapeBackward",
                    [from](const keel::Tensor& g) { return check(g.reshaped(from), "reshape backward"); });
  return out;
}
}  // namespace

Tensor flatten(const Tensor& x, int64_t axis) {
  need_defined(x, "flatten", "input");
  int64_t r = x.rank();
  if (axis < 0) axis += r;
  if (axis < 0 || axis > r) fail(invalid_argument("flatten: axis out of range for " + x.data().describe()));
  int64_t a = 1, b = 1;
  for (int64_t i = 0; i < r; ++i) (i < axis ? a : b) *= x.shape()[static_cast<size_t>(i)];
  return reshaped_view(x, {a, b}, "Flatten", axis);
}

Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm) {
  need_defined(x, "transpose", "input");
  if (static_cast<int64_t>(perm.size()) != x.rank())
    fail(
        invalid_argument("transpose: perm has " + std::to_string(perm.size()) + " entries for " + x.data().describe()));
  return apply1("Transpose", {x}, {{"perm", ais(perm)}});
}

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  if (xs.empty()) fail(invalid_argument("concat of no tensors"));
  for (const auto& t : xs) need_defined(t, "concat", "an input");
  return apply1("Concat", xs, {{"axis", ai(axis)}});
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  need_defined(x, "sum", "input");
  std::vector<Tensor> ins = {x};
  if (!axes.empty()) ins.push_back(ints_const(axes));
  return apply1("ReduceSum", ins, {{"keepdims", ai(keepdims ? 1 : 0)}});
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  need_defined(x, "mean", "input");
  std::map<std::string, Attribute> a = {{"keepdims", ai(keepdims ? 1 : 0)}};
  if (!axes.empty()) a["axes"] = ais(axes);
  return apply1("ReduceMean", {x}, a);
}

Tensor argmax(const Tensor& x, int64_t axis, bool keepdims) {
  need_defined(x, "argmax", "input");
  return apply("", "ArgMax", {x}, {{"axis", ai(axis)}, {"keepdims", ai(keepdims ? 1 : 0)}}, 1, {}, false)[0];
}

namespace {
void check_reduction(const std::string& r, const char* op) {
  if (r != "mean" && r != "sum" && r != "none")
    fail(invalid_argument(std::string(op) + ": reduction must be mean, sum or none, got '" + r + "'"));
}
Tensor reduce_loss(const Tensor& l, const std::string& reduction) {
  if (reduction == "mean") return mean(l);
  if (reduction == "sum") return sum(l);
  return l;
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const std::string& reduction) {
  check_reduction(reduction, "cross_entropy");
  need_defined(logits, "cross_entropy", "logits");
  need_defined(target, "cross_entropy", "target");
  if (target.dtype() != DType::kI64 && target.dtype() != DType::kI32)
    fail(invalid_argument("cross_entropy: target must be int64 class indices, got " + target.data().describe()));
  if (logits.rank() < 2 || target.rank() != logits.rank() - 1 || target.dim(0) != logits.dim(0))
    fail(invalid_argument("cross_entropy: logits " + logits.data().describe() + " and target " +
                          target.data().describe() + " do not match ([N, C] and [N])"));
  auto outs =
      apply("", "SoftmaxCrossEntropyLoss", {logits, target}, {{"reduction", Attribute::of_string(reduction)}}, 2);
  return outs[0];
}

Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction) {
  check_reduction(reduction, "mse_loss");
  need_defined(input, "mse_loss", "input");
  need_defined(target, "mse_loss", "target");
  if (input.shape() != target.shape())
    fail(invalid_argument("mse_loss: input " + input.data().describe() + " and target " + target.data().describe() +
                          " differ in shape"));
  Tensor d = input - target;
  return reduce_loss(d * d, reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, const std::string& reduction) {
  check_reduction(reduction, "binary_cross_entropy_with_logits");
  need_defined(logits, "binary_cross_entropy_with_logits", "logits");
  need_defined(target, "binary_cross_entropy_with_logits", "target");
  if (logits.shape() != target.shape())
    fail(invalid_argument("binary_cross_entropy_with_logits: logits " + logits.data().describe() + " and target " +
                          target.data().describe() + " differ in shape"));
  // max(x, 0) - x t + log(1 + exp(-|x|)), stable for large |x|.
  Tensor l = relu(logits) - logits * target + apply1("Softplus", {-abs(logits)});
  return reduce_loss(l, reduction);
}

}  // namespace keel::eager
