#include "core/train/nn.h"

#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <typeinfo>

namespace keel::train::nn {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw eager::Error(invalid_argument(msg)); }

// U(-bound, bound) from the global generator, as a leaf.
Tensor uniform(const Shape& shape, double bound) {
  return eager::rand_uniform(shape, static_cast<float>(-bound), static_cast<float>(bound)).detach();
}

std::string pair_str(std::array<int64_t, 2> a) {
  return "(" + std::to_string(a[0]) + ", " + std::to_string(a[1]) + ")";
}

}  // namespace

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}
Module::~Module() = default;

Tensor Module::forward(const Tensor&) { fail(type_name_ + " has no single-input forward()"); }

void Module::check_name(const std::string& name) const {
  if (name.empty() || name.find('.') != std::string::npos)
    fail(type_name_ + ": invalid member name '" + name + "' (non-empty, no '.')");
  for (const auto& s : params_)
    if (s.name == name) fail(type_name_ + ": '" + name + "' is already a parameter");
  for (const auto& s : buffers_)
    if (s.name == name) fail(type_name_ + ": '" + name + "' is already a buffer");
  for (const auto& c : children_)
    if (c.first == name) fail(type_name_ + ": '" + name + "' is already a submodule");
}

Tensor* Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_name(name);
  if (t.defined()) {
    t = t.detach();
    if (requires_grad) t.requires_grad_(true);
  }
  params_.push_back({name, std::move(t)});
  return &params_.back().tensor;
}

Tensor* Module::register_buffer(const std::string& name, Tensor t) {
  check_name(name);
  if (t.defined()) t = t.detach();
  buffers_.push_back({name, std::move(t)});
  return &buffers_.back().tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_name(name);
  if (!m) fail(type_name_ + ": submodule '" + name + "' is null");
  children_.emplace_back(name, std::move(m));
}

void Module::collect(const std::string& prefix, bool params, bool buffers, bool recurse,
                     std::vector<std::pair<std::string, Tensor*>>& out) const {
  // Slots are owned by this module; handing out non-const pointers from a const walk lets load/to share the code.
  auto* self = const_cast<Module*>(this);
  if (params)
    for (auto& s : self->params_)
      if (s.tensor.defined()) out.emplace_back(prefix + s.name, &s.tensor);
  if (buffers)
    for (auto& s : self->buffers_)
      if (s.tensor.defined()) out.emplace_back(prefix + s.name, &s.tensor);
  if (recurse)
    for (const auto& [n, c] : children_) c->collect(prefix + n + ".", params, buffers, true, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", true, false, recurse, slots);
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [n, p] : slots) out.emplace_back(n, *p);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", false, true, recurse, slots);
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [n, p] : slots) out.emplace_back(n, *p);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& t : parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

StateDict Module::state_dict() const {
  // PyTorch's order: a module's own parameters, its buffers, then each child.
  StateDict out;
  std::vector<std::pair<std::string, Tensor*>> slots;
  std::function<void(const Module&, const std::string&)> walk = [&](const Module& m, const std::string& prefix) {
    m.collect(prefix, true, true, false, slots);
    for (const auto& [n, c] : m.children_) walk(*c, prefix + n + ".");
  };
  walk(*this, "");
  for (auto& [n, p] : slots) out.emplace_back(n, *p);
  return out;
}

Status Module::load_state_dict(const StateDict& state, bool strict) {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", true, true, true, slots);
  std::map<std::string, const Tensor*> given;
  for (const auto& [n, t] : state) given[n] = &t;
  std::vector<std::string> missing, mismatched, unexpected;
  std::set<std::string> mine;
  for (auto& [n, p] : slots) {
    mine.insert(n);
    auto it = given.find(n);
    if (it == given.end()) {
      missing.push_back(n);
      continue;
    }
    if (!it->second->defined() || it->second->shape() != p->shape())
      mismatched.push_back("size mismatch for " + n + ": copying a tensor of shape " +
                           (it->second->defined() ? shape_to_string(it->second->shape()) : std::string("<undefined>")) +
                           ", the shape in the current model is " + shape_to_string(p->shape()));
    else if (dtype_is_float(p->dtype()) != dtype_is_float(it->second->dtype()))
      mismatched.push_back("dtype mismatch for " + n + ": " + dtype_name(it->second->dtype()) +
                           " given, the model has " + dtype_name(p->dtype()));
  }
  for (const auto& [n, t] : given)
    if (!mine.count(n)) unexpected.push_back(n);
  std::string msg;
  auto list = [&](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    msg += msg.empty() ? "" : "; ";
    msg += what;
    for (size_t i = 0; i < v.size(); ++i) msg += (i ? ", " : " ") + v[i];
  };
  if (strict) {
    list("missing key(s):", missing);
    list("unexpected key(s):", unexpected);
  }
  list("", mismatched);
  if (!msg.empty()) return invalid_argument("load_state_dict into " + type_name_ + ": " + msg);
  eager::NoGradGuard ng;
  try {
    for (auto& [n, p] : slots) {
      auto it = given.find(n);
      if (it != given.end()) p->copy_(*it->second);
    }
  } catch (const eager::Error& e) {
    return e.status().with_context("load_state_dict");
  }
  return Status::ok();
}

void Module::zero_grad() {
  for (auto& t : parameters()) t.zero_grad();
}

void Module::to(const std::string& device) {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", true, true, true, slots);
  eager::NoGradGuard ng;
  for (auto& [n, p] : slots) {
    Tensor there = p->to(device);  // *p itself when it is there already ("cuda" and "cuda:0" are one device)
    if (there.impl() == p->impl()) continue;
    const bool rg = p->requires_grad();
    Tensor moved = there.detach();
    if (rg) moved.requires_grad_(true);
    *p = moved;
  }
}

void Module::to(DType dtype) {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect("", true, true, true, slots);
  eager::NoGradGuard ng;
  for (auto& [n, p] : slots) {
    if (!dtype_is_float(p->dtype()) || p->dtype() == dtype) continue;
    const bool rg = p->requires_grad();
    Tensor cast = p->to(dtype).detach();
    if (rg) cast.requires_grad_(true);
    *p = cast;
  }
}

void Module::repr(std::string& out, int indent) const {
  out += type_name_ + "(" + extra_repr();
  if (!children_.empty()) {
    out += "\n";
    for (const auto& [n, c] : children_) {
      out += std::string(static_cast<size_t>(indent + 2), ' ') + "(" + n + "): ";
      c->repr(out, indent + 2);
      out += "\n";
    }
    out += std::string(static_cast<size_t>(indent), ' ');
  }
  out += ")";
}

std::string Module::to_string() const {
  std::string s;
  repr(s, 0);
  return s;
}

// --- Linear ---

Linear::Linear(int64_t in, int64_t out, bool bias) : Module("Linear"), in_(in), out_(out) {
  if (in < 1 || out < 1)
    fail("Linear: features must be >= 1, got in=" + std::to_string(in) + " out=" + std::to_string(out));
  weight_ = register_parameter("weight", eager::zeros({out, in}));
  bias_ = bias ? register_parameter("bias", eager::zeros({out})) : &no_bias_;
  reset_parameters();
}

void Linear::reset_parameters() {
  eager::NoGradGuard ng;
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
  weight_->copy_(uniform({out_, in_}, bound));
  if (bias_->defined()) bias_->copy_(uniform({out_}, bound));
}

Tensor Linear::forward(const Tensor& x) { return eager::linear(x, *weight_, *bias_); }

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(in_) + ", out_features=" + std::to_string(out_) +
         ", bias=" + (bias_->defined() ? "true" : "false");
}

// --- Conv2D / ConvTranspose2D ---

namespace {
void check_conv(const Conv2DOptions& o, const char* what) {
  if (o.in_channels < 1 || o.out_channels < 1 || o.kernel[0] < 1 || o.kernel[1] < 1 || o.groups < 1)
    fail(std::string(what) + ": channels, kernel and groups must be >= 1");
  if (o.in_channels % o.groups || o.out_channels % o.groups)
    fail(std::string(what) + ": in_channels " + std::to_string(o.in_channels) + " and out_channels " +
         std::to_string(o.out_channels) + " must be divisible by groups " + std::to_string(o.groups));
  if (o.stride[0] < 1 || o.stride[1] < 1 || o.dilation[0] < 1 || o.dilation[1] < 1 || o.padding[0] < 0 ||
      o.padding[1] < 0)
    fail(std::string(what) + ": stride and dilation must be >= 1, padding >= 0");
  if (o.max_pool != std::array<int64_t, 2>{0, 0} && (o.max_pool[0] < 1 || o.max_pool[1] < 1))
    fail(std::string(what) + ": max_pool must be >= 1");
}

std::string conv_repr(const Conv2DOptions& o, bool transpose) {
  std::string s = std::to_string(o.in_channels) + ", " + std::to_string(o.out_channels) +
                  ", kernel_size=" + pair_str(o.kernel) + ", stride=" + pair_str(o.stride);
  if (o.padding != std::array<int64_t, 2>{0, 0}) s += ", padding=" + pair_str(o.padding);
  if (o.dilation != std::array<int64_t, 2>{1, 1}) s += ", dilation=" + pair_str(o.dilation);
  if (transpose && o.output_padding != std::array<int64_t, 2>{0, 0})
    s += ", output_padding=" + pair_str(o.output_padding);
  if (o.groups != 1) s += ", groups=" + std::to_string(o.groups);
  if (!o.bias) s += ", bias=false";
  if (o.relu && !transpose) s += ", relu";
  if (o.max_pool != std::array<int64_t, 2>{0, 0} && !transpose) s += ", max_pool=" + pair_str(o.max_pool);
  return s;
}
}  // namespace

Conv2D::Conv2D(Conv2DOptions o) : Module("Conv2D"), o_(o) {
  check_conv(o_, "Conv2D");
  const int64_t fan_in = o_.in_channels / o_.groups * o_.kernel[0] * o_.kernel[1];
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight_ = register_parameter(
      "weight", uniform({o_.out_channels, o_.in_channels / o_.groups, o_.kernel[0], o_.kernel[1]}, bound));
  bias_ = o_.bias ? register_parameter("bias", uniform({o_.out_channels}, bound)) : &no_bias_;
}

Tensor Conv2D::forward(const Tensor& x) {
  if (o_.max_pool != std::array<int64_t, 2>{0, 0}) {
    if (o_.relu)
      return eager::conv2d_relu_max_pool2d(x, *weight_, *bias_, o_.max_pool, o_.stride, o_.padding, o_.dilation,
                                           o_.groups);
    return eager::max_pool2d(eager::conv2d(x, *weight_, *bias_, o_.stride, o_.padding, o_.dilation, o_.groups),
                             o_.max_pool);
  }
  if (o_.relu) return eager::conv2d_relu(x, *weight_, *bias_, o_.stride, o_.padding, o_.dilation, o_.groups);
  return eager::conv2d(x, *weight_, *bias_, o_.stride, o_.padding, o_.dilation, o_.groups);
}
std::string Conv2D::extra_repr() const { return conv_repr(o_, false); }

ConvTranspose2D::ConvTranspose2D(Conv2DOptions o) : Module("ConvTranspose2D"), o_(o) {
  check_conv(o_, "ConvTranspose2D");
  if (o_.dilation != std::array<int64_t, 2>{1, 1}) fail("ConvTranspose2D: dilation other than 1 is not supported");
  if (o_.relu) fail("ConvTranspose2D: relu is a Conv2D option (apply eager::relu to the output)");
  if (o_.max_pool != std::array<int64_t, 2>{0, 0})
    fail("ConvTranspose2D: max_pool is a Conv2D option (apply eager::max_pool2d to the output)");
  // PyTorch computes fan_in from weight.size(1) (= out/groups) for transposed convolutions too.
  const int64_t fan_in = o_.out_channels / o_.groups * o_.kernel[0] * o_.kernel[1];
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  weight_ = register_parameter(
      "weight", uniform({o_.in_channels, o_.out_channels / o_.groups, o_.kernel[0], o_.kernel[1]}, bound));
  bias_ = o_.bias ? register_parameter("bias", uniform({o_.out_channels}, bound)) : &no_bias_;
}

Tensor ConvTranspose2D::forward(const Tensor& x) {
  return eager::conv_transpose2d(x, *weight_, *bias_, o_.stride, o_.padding, o_.output_padding, o_.groups);
}
std::string ConvTranspose2D::extra_repr() const { return conv_repr(o_, true); }

// --- BatchNorm2D ---

BatchNorm2D::BatchNorm2D(int64_t n, float eps, float momentum, bool affine, bool track)
    : Module("BatchNorm2D"), n_(n), eps_(eps), momentum_(momentum), affine_(affine), track_(track) {
  if (n < 1) fail("BatchNorm2D: num_features must be >= 1");
  if (affine) {
    weight_ = register_parameter("weight", eager::ones({n}));
    bias_ = register_parameter("bias", eager::zeros({n}));
  }
  if (track) {
    mean_ = register_buffer("running_mean", eager::zeros({n}));
    var_ = register_buffer("running_var", eager::ones({n}));
    tracked_ = register_buffer("num_batches_tracked", eager::from_vector(std::vector<int64_t>{0}, {}));
  }
}

int64_t BatchNorm2D::num_batches_tracked() const { return tracked_ ? tracked_->to_vector<int64_t>()[0] : 0; }

Tensor BatchNorm2D::forward(const Tensor& x) {
  if (x.rank() != 4 && x.rank() != 2)
    fail("BatchNorm2D: expected a 4-D NCHW (or 2-D NC) input, got " + shape_to_string(x.shape()));
  if (x.dim(1) != n_)
    fail("BatchNorm2D: input has " + std::to_string(x.dim(1)) + " channels, the layer " + std::to_string(n_));
  Tensor& w = affine_ ? *weight_ : none_;
  Tensor& b = affine_ ? *bias_ : none_;
  const bool batch_stats = is_training() || !track_;
  if (track_ && is_training()) {
    eager::NoGradGuard ng;
    tracked_->copy_(eager::from_vector(std::vector<int64_t>{num_batches_tracked() + 1}, {}));
  }
  if (is_training() && reduce_) return synchronized_forward(x, w, b);  // as torch's SyncBatchNorm: training only
  if (track_) return eager::batch_norm(x, w, b, *mean_, *var_, batch_stats, momentum_, eps_);
  // No running statistics: batch statistics always, into throw-away buffers.
  Tensor m = eager::zeros({n_}), v = eager::ones({n_});
  return eager::batch_norm(x, w, b, m, v, true, momentum_, eps_);
}

// The batch statistics over every replica (set_stats_reducer), from eager ops, so autograd carries the gradient
// through the reductions (each a sum across replicas whose backward sums the replicas' gradients): the result and the
// gradients equal one BatchNorm over the replicas' batches together. 16-bit inputs (autocast) are normalised in f32.
Tensor BatchNorm2D::synchronized_forward(const Tensor& x, const Tensor& w, const Tensor& b) {
  const bool image = x.rank() == 4;
  const std::vector<int64_t> axes = image ? std::vector<int64_t>{0, 2, 3} : std::vector<int64_t>{0};
  const std::vector<int64_t> per_channel = image ? std::vector<int64_t>{1, n_, 1, 1} : std::vector<int64_t>{1, n_};
  const Tensor xs = x.dtype() == DType::kF32 || x.dtype() == DType::kF64 ? x : x.to(DType::kF32);
  const Tensor count = reduce_(eager::full({1}, static_cast<float>(x.numel() / n_), xs.dtype(), x.device()));
  const Tensor mean = reduce_(eager::sum(xs, axes)) / count;
  const Tensor centered = xs - eager::reshape(mean, per_channel);
  const Tensor var = reduce_(eager::sum(centered * centered, axes)) / count;  // biased, as the normalisation uses
  Tensor y = centered / eager::sqrt(eager::reshape(var, per_channel) + eps_);
  if (affine_) y = y * eager::reshape(w, per_channel) + eager::reshape(b, per_channel);
  if (track_) {  // new = (1 - momentum) * old + momentum * batch, the unbiased variance for the running estimate
    eager::NoGradGuard ng;
    const Tensor n = count.detach();
    mean_->copy_(*mean_ * (1.f - momentum_) + mean.detach() * momentum_);
    var_->copy_(*var_ * (1.f - momentum_) + var.detach() * n / (n - 1.f) * momentum_);
  }
  return y.dtype() == x.dtype() ? y : y.to(x.dtype());
}

std::string BatchNorm2D::extra_repr() const {
  std::ostringstream s;
  s << n_ << ", eps=" << eps_ << ", momentum=" << momentum_ << ", affine=" << (affine_ ? "true" : "false")
    << ", track_running_stats=" << (track_ ? "true" : "false");
  return s.str();
}

// --- LayerNorm ---

LayerNorm::LayerNorm(std::vector<int64_t> shape, float eps, bool affine)
    : Module("LayerNorm"), shape_(std::move(shape)), eps_(eps) {
  if (shape_.empty()) fail("LayerNorm: normalized_shape must not be empty");
  for (int64_t d : shape_)
    if (d < 1) fail("LayerNorm: normalized_shape dims must be >= 1");
  if (affine) {
    weight_ = register_parameter("weight", eager::ones(shape_));
    bias_ = register_parameter("bias", eager::zeros(shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  const auto k = static_cast<int64_t>(shape_.size());
  if (x.rank() < k || !std::equal(shape_.begin(), shape_.end(), x.shape().end() - k))
    fail("LayerNorm: input " + shape_to_string(x.shape()) + " does not end with normalized_shape " +
         shape_to_string(shape_));
  return eager::layer_norm(x, k, weight_ ? *weight_ : none_, bias_ ? *bias_ : none_, eps_);
}

std::string LayerNorm::extra_repr() const {
  std::ostringstream s;
  s << shape_to_string(shape_) << ", eps=" << eps_ << ", elementwise_affine=" << (weight_ ? "true" : "false");
  return s.str();
}

// --- Dropout, Embedding, pooling, Flatten, Sequential ---

Dropout::Dropout(float p) : Module("Dropout"), p_(p) {
  if (!(p >= 0.f && p < 1.f)) fail("Dropout: p must be in [0, 1), got " + std::to_string(p));
}
Tensor Dropout::forward(const Tensor& x) { return eager::dropout(x, p_, is_training()); }
std::string Dropout::extra_repr() const {
  std::ostringstream s;
  s << "p=" << p_;
  return s.str();
}

Embedding::Embedding(int64_t num, int64_t dim) : Module("Embedding"), num_(num), dim_(dim) {
  if (num < 1 || dim < 1) fail("Embedding: num_embeddings and embedding_dim must be >= 1");
  weight_ = register_parameter("weight", eager::randn({num, dim}, 1.f).detach());
}
Tensor Embedding::forward(const Tensor& indices) { return eager::embedding(*weight_, indices); }
std::string Embedding::extra_repr() const { return std::to_string(num_) + ", " + std::to_string(dim_); }

MaxPool2D::MaxPool2D(int64_t k, int64_t s, int64_t p) : Module("MaxPool2D"), k_(k), s_(s ? s : k), p_(p) {
  if (k < 1 || s_ < 1 || p < 0 || p > k / 2)
    fail("MaxPool2D: kernel >= 1, stride >= 1 and 0 <= padding <= kernel/2 required");
}
Tensor MaxPool2D::forward(const Tensor& x) { return eager::max_pool2d(x, {k_, k_}, {s_, s_}, {p_, p_}); }
std::string MaxPool2D::extra_repr() const {
  return "kernel_size=" + std::to_string(k_) + ", stride=" + std::to_string(s_) + ", padding=" + std::to_string(p_);
}

AvgPool2D::AvgPool2D(int64_t k, int64_t s, int64_t p) : Module("AvgPool2D"), k_(k), s_(s ? s : k), p_(p) {
  if (k < 1 || s_ < 1 || p < 0 || p > k / 2)
    fail("AvgPool2D: kernel >= 1, stride >= 1 and 0 <= padding <= kernel/2 required");
}
Tensor AvgPool2D::forward(const Tensor& x) { return eager::avg_pool2d(x, {k_, k_}, {s_, s_}, {p_, p_}); }
std::string AvgPool2D::extra_repr() const {
  return "kernel_size=" + std::to_string(k_) + ", stride=" + std::to_string(s_) + ", padding=" + std::to_string(p_);
}

Tensor Flatten::forward(const Tensor& x) {
  const int64_t start = start_ < 0 ? start_ + x.rank() : start_;
  if (start < 0 || start >= std::max<int64_t>(x.rank(), 1))
    fail("Flatten: start_dim " + std::to_string(start_) + " out of range for " + shape_to_string(x.shape()));
  if (start == 1 && x.rank() >= 2) return eager::flatten(x, 1);
  std::vector<int64_t> shape(x.shape().begin(), x.shape().begin() + start);
  shape.push_back(-1);
  return eager::reshape(x, shape);
}

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) : Module("Sequential") {
  for (const auto& m : modules) push_back(m);
}

Sequential& Sequential::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(size()), std::move(m));
  return *this;
}

namespace {
// Child i of `children` when it is exactly a T (not a subclass, which may override forward), else null.
template <class T>
T* child_exactly(const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children, size_t i) {
  if (i >= children.size()) return nullptr;
  Module* m = children[i].second.get();
  return typeid(*m) == typeid(T) ? static_cast<T*>(m) : nullptr;
}
}  // namespace

Tensor Sequential::forward(const Tensor& x) {
  const auto& children = named_children();
  Tensor y = x;
  for (size_t i = 0; i < children.size(); ++i) {
    // Conv2D -> ReLU [-> MaxPool2D(k, stride k, no padding)] as one fused op (the class comment).
    Conv2D* conv = child_exactly<Conv2D>(children, i);
    if (conv && !conv->options().relu && conv->options().max_pool == std::array<int64_t, 2>{0, 0} &&
        child_exactly<ReLU>(children, i + 1)) {
      const Conv2DOptions& o = conv->options();
      MaxPool2D* pool = child_exactly<MaxPool2D>(children, i + 2);
      if (pool && pool->stride() == pool->kernel() && pool->padding() == 0) {
        y = eager::conv2d_relu_max_pool2d(y, conv->weight(), conv->bias(), {pool->kernel(), pool->kernel()}, o.stride,
                                          o.padding, o.dilation, o.groups);
        i += 2;
      } else {
        y = eager::conv2d_relu(y, conv->weight(), conv->bias(), o.stride, o.padding, o.dilation, o.groups);
        i += 1;
      }
      continue;
    }
    y = children[i].second->forward(y);
  }
  return y;
}

}  // namespace keel::train::nn

namespace keel::train::nn {

Tensor distillation_kl(const Tensor& student_logits, const Tensor& teacher_logits, float temperature,
                       const std::string& reduction) {
  if (!(temperature > 0.f) || !std::isfinite(temperature))
    fail("distillation_kl: the temperature must be a positive number, got " + std::to_string(temperature));
  if (reduction != "batchmean" && reduction != "sum" && reduction != "none")
    fail("distillation_kl: reduction must be batchmean, sum or none, got '" + reduction + "'");
  if (student_logits.rank() != 2 || student_logits.shape() != teacher_logits.shape())
    fail("distillation_kl: student logits " + shape_to_string(student_logits.shape()) + " and teacher logits " +
         shape_to_string(teacher_logits.shape()) + " must both be [N, C] of one shape");
  const float inv_t = 1.f / temperature;
  Tensor log_q = eager::log_softmax(student_logits * inv_t, 1);
  Tensor log_p = eager::log_softmax(teacher_logits.detach() * inv_t, 1);
  if (log_p.dtype() != log_q.dtype()) log_p = log_p.to(log_q.dtype());
  // sum_c p_c (log p_c - log q_c): p log p is a constant of the teacher, kept so the value is the divergence itself
  // (0 when the distributions agree).
  Tensor per_row = eager::sum(eager::exp(log_p) * (log_p - log_q), {1}) * (temperature * temperature);
  if (reduction == "none") return per_row;
  Tensor total = eager::sum(per_row);
  return reduction == "sum" ? total : total * (1.f / static_cast<float>(student_logits.dim(0)));
}

DistillationLoss::DistillationLoss(float temperature, float alpha) : temperature_(temperature), alpha_(alpha) {
  if (!(temperature > 0.f) || !std::isfinite(temperature))
    fail("DistillationLoss: the temperature must be a positive number, got " + std::to_string(temperature));
  if (!(alpha >= 0.f && alpha <= 1.f)) fail("DistillationLoss: alpha must be in [0, 1], got " + std::to_string(alpha));
}

DistillationLoss::Parts DistillationLoss::parts(const Tensor& student_logits, const Tensor& teacher_logits,
                                                const Tensor& target) const {
  Parts p;
  p.soft = distillation_kl(student_logits, teacher_logits, temperature_);
  p.hard = eager::cross_entropy(student_logits, target);
  if (p.hard.dtype() != p.soft.dtype()) p.hard = p.hard.to(p.soft.dtype());
  p.loss = alpha_ == 1.f ? p.soft : alpha_ == 0.f ? p.hard : p.soft * alpha_ + p.hard * (1.f - alpha_);
  return p;
}

}  // namespace keel::train::nn
