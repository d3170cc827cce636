#include "core/train/optim.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>

#include "core/base/target_clones.h"

namespace keel::train {
namespace {

[[noreturn]] void fail(const std::string& msg) { throw eager::Error(invalid_argument(msg)); }

std::vector<ParamGroup> one_group(std::vector<Tensor> params, double lr, double wd) {
  ParamGroup g;
  g.params = std::move(params);
  g.lr = g.initial_lr = lr;
  g.weight_decay = wd;
  return {std::move(g)};
}

std::vector<ParamGroup> with_defaults(std::vector<ParamGroup> groups, double lr, double wd) {
  // Groups built with the defaults of ParamGroup take the optimizer's; initial_lr follows lr.
  for (auto& g : groups) {
    if (g.lr < 0) g.lr = lr;
    if (g.weight_decay < 0) g.weight_decay = wd;
    g.initial_lr = g.lr;
  }
  return groups;
}

// The loop of sgd_update_on_host, compiled twice on x86-64 (for AVX-512, chosen at load time where the CPU has it,
// and for the baseline) at -O3, whose loop unswitching takes the invariant branches out so that each variant
// vectorises: at the build's -O2 it stayed a scalar SSE loop (addss/mulss), 3.8% of a 1-thread LeNet-like training
// step in `perf`. The pointers do not overlap (the caller checks). Both clones compute the same values.
#if KEEL_TARGET_CLONES
#define KEEL_SGD_CLONES __attribute__((target_clones("avx512f", "default"), optimize("O3", "fp-contract=off")))
#else
#define KEEL_SGD_CLONES
#endif
KEEL_SGD_CLONES void sgd_loop(float* __restrict pp, const float* __restrict gp, float* __restrict bp, int64_t n,
                              float lr, float wd, float m, float keep, bool damp, bool nesterov) {
  const bool decay = wd != 0;
  for (int64_t i = 0; i < n; ++i) {
    float gi = gp[i];
    if (decay) gi = gi + pp[i] * wd;
    float b = bp[i] * m;
    b = damp ? b + gi * keep : b + gi;
    bp[i] = b;
    const float step = nesterov ? gi + b * m : b;
    pp[i] = pp[i] - step * lr;
  }
}

// GradScaler's unscale of one f32 gradient in host memory, in place (as unscale_on_host), the same clones as
// sgd_loop: each element times inv, rounded to f32 (the reference keel.CheckFiniteAndUnscale's value); true when every
// result is finite (the exponent test is an integer OR, which vectorises where a float sum would not).
KEEL_SGD_CLONES bool unscale_loop(float* __restrict g, int64_t n, float inv) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float u = g[i] * inv;
    g[i] = u;
    uint32_t bits;
    std::memcpy(&bits, &u, sizeof bits);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

bool overlap(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bytes && y < x + bytes;
}

// SGD's update of one f32 parameter on the CPU whose momentum buffer exists (every step after the first) in one pass
// over host memory. The eager path in SGD::step runs five ops per parameter, each reading and writing the whole
// tensor (the LeNet-like model's 1.2 M fc1 weights: about 56 MB a step against 24 MB here). The same operations in the
// same order, each rounded to f32 (no contraction: ISO C++ mode), so the same bits. False where it does not apply
// (another device or dtype, or tensors that share memory).
bool sgd_update_on_host(Tensor& p, const Tensor& g, Tensor& buf, float lr, float wd, const SGDOptions& o) {
  const int64_t n = p.numel();
  if (p.device() != "cpu" || g.device() != "cpu" || buf.device() != "cpu" || p.dtype() != DType::kF32 ||
      g.dtype() != DType::kF32 || buf.dtype() != DType::kF32 || g.numel() != n || buf.numel() != n)
    return false;
  float* pp = p.data().data<float>();
  const float* gp = g.data().data<float>();
  float* bp = buf.data().data<float>();
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (overlap(pp, gp, bytes) || overlap(pp, bp, bytes) || overlap(gp, bp, bytes)) return false;
  sgd_loop(pp, gp, bp, n, lr, wd, static_cast<float>(o.momentum), static_cast<float>(1 - o.dampening), o.dampening != 0,
           o.nesterov);
  return true;
}

// Adam's update of one f32 parameter on the CPU in one pass (see adam_update_on_host), the same clones as sgd_loop;
// sqrt and division are IEEE operations in both clones (errno is never set: v >= 0).
#if KEEL_TARGET_CLONES
#define KEEL_ADAM_CLONES \
  __attribute__((target_clones("avx512f", "default"), optimize("O3", "fp-contract=off", "no-math-errno")))
#else
#define KEEL_ADAM_CLONES
#endif
struct AdamScalars {
  float decay_scale;  // AdamW: p *= decay_scale first (1 when off)
  float wd;           // Adam: g += p·wd (0 when off)
  float b1, one_minus_b1, b2, one_minus_b2;
  float sqrt_bc2, eps, step_size;
};
KEEL_ADAM_CLONES void adam_loop(float* __restrict pp, const float* __restrict gp, float* __restrict mp,
                                float* __restrict vp, int64_t n, const AdamScalars& s) {
  const bool decoupled = s.decay_scale != 1, decay = s.wd != 0;
  const float decay_scale = s.decay_scale, wd = s.wd, b1 = s.b1, k1 = s.one_minus_b1, b2 = s.b2, k2 = s.one_minus_b2,
              sqrt_bc2 = s.sqrt_bc2, eps = s.eps, step_size = s.step_size;
  for (int64_t i = 0; i < n; ++i) {
    float p = pp[i];
    if (decoupled) p = p * decay_scale;
    float g = gp[i];
    if (decay) g = g + p * wd;
    const float m = mp[i] * b1 + g * k1;
    const float v = vp[i] * b2 + (g * g) * k2;
    mp[i] = m;
    vp[i] = v;
    const float denom = std::sqrt(v) / sqrt_bc2 + eps;
    pp[i] = p - (m / denom) * step_size;
  }
}

// Adam's (or AdamW's) update of one f32 parameter on the CPU in one pass over host memory, where the eager path in
// Adam::step runs about a dozen ops per parameter, each reading and writing the whole tensor and allocating new
// moment buffers (the LeNet-like model's 1.2 M fc1 weights: about 170 MB of memory traffic a step against 34 MB
// here). The same operations in the same order, each rounded to f32: the same bits. The moments are updated in place
// (as PyTorch's are). False where it does not apply (another device or dtype, or tensors that share memory).
bool adam_update_on_host(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamScalars& s) {
  const int64_t n = p.numel();
  for (const Tensor* t :
       {static_cast<const Tensor*>(&p), &g, static_cast<const Tensor*>(&m), static_cast<const Tensor*>(&v)})
    if (t->device() != "cpu" || t->dtype() != DType::kF32 || t->numel() != n) return false;
  float* pp = p.data().data<float>();
  const float* gp = g.data().data<float>();
  float* mp = m.data().data<float>();
  float* vp = v.data().data<float>();
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  const void* ptrs[] = {pp, gp, mp, vp};
  for (int a = 0; a < 4; ++a)
    for (int b = a + 1; b < 4; ++b)
      if (overlap(ptrs[a], ptrs[b], bytes)) return false;
  adam_loop(pp, gp, mp, vp, n, s);
  return true;
}

}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  size_t n = 0;
  for (const auto& g : groups_) {
    if (!(g.lr >= 0)) fail("optimizer: learning rate must be >= 0, got " + std::to_string(g.lr));
    if (!(g.weight_decay >= 0)) fail("optimizer: weight_decay must be >= 0");
    for (const auto& p : g.params) {
      if (!p.defined()) fail("optimizer: parameter " + std::to_string(n) + " is undefined");
      if (!p.is_leaf() || !p.requires_grad())
        fail("optimizer: parameter " + std::to_string(n) + " is not a leaf that requires grad");
      ++n;
    }
  }
  if (n == 0) fail("optimizer got an empty parameter list");
  state_.resize(n);
  steps_.assign(n, 0);
}

std::vector<Tensor*> Optimizer::flat_params() {
  std::vector<Tensor*> out;
  for (auto& g : groups_)
    for (auto& p : g.params) out.push_back(&p);
  return out;
}

void Optimizer::zero_grad() {
  for (auto& g : groups_)
    for (auto& p : g.params) p.zero_grad();
}

void Optimizer::set_lr(double lr) {
  for (auto& g : groups_) g.lr = lr;
}

State Optimizer::state_dict() const {
  State s;
  s.values["type"] = name();
  auto& groups = s.values["groups"] = nlohmann::json::array();
  size_t n = 0;
  for (const auto& g : groups_) {
    groups.push_back(
        {{"lr", g.lr}, {"initial_lr", g.initial_lr}, {"weight_decay", g.weight_decay}, {"params", g.params.size()}});
    n += g.params.size();
  }
  s.values["steps"] = steps_;
  for (size_t i = 0; i < state_.size(); ++i)
    for (const auto& [k, t] : state_[i]) s.tensors.emplace_back(std::to_string(i) + "." + k, t);
  return s;
}

Status Optimizer::load_state_dict(const State& s) {
  try {
    if (s.values.value("type", std::string()) != name())
      return invalid_argument("optimizer state is for '" + s.values.value("type", std::string("?")) + "', this is " +
                              name());
    const auto& groups = s.values.at("groups");
    if (groups.size() != groups_.size())
      return invalid_argument("optimizer state has " + std::to_string(groups.size()) +
                              " parameter groups, this optimizer " + std::to_string(groups_.size()));
    for (size_t i = 0; i < groups_.size(); ++i)
      if (groups[i].at("params").get<size_t>() != groups_[i].params.size())
        return invalid_argument("optimizer state: group " + std::to_string(i) + " has " +
                                groups[i].at("params").dump() + " parameters, this optimizer " +
                                std::to_string(groups_[i].params.size()));
    auto steps = s.values.at("steps").get<std::vector<int64_t>>();
    if (steps.size() != state_.size())
      return invalid_argument("optimizer state: per-parameter steps do not match the parameters");
    auto params = flat_params();
    std::vector<std::map<std::string, Tensor>> state(state_.size());
    for (const auto& [name, t] : s.tensors) {
      auto dot = name.find('.');
      size_t idx = 0;
      try {
        idx = std::stoul(name.substr(0, dot));
      } catch (...) {
        return invalid_argument("optimizer state: tensor '" + name + "' is not named <param index>.<buffer>");
      }
      if (dot == std::string::npos || idx >= params.size())
        return invalid_argument("optimizer state: tensor '" + name + "' does not belong to a parameter");
      if (t.shape() != params[idx]->shape())
        return invalid_argument("optimizer state: " + name + " has shape " + shape_to_string(t.shape()) +
                                ", parameter " + std::to_string(idx) + " has " + shape_to_string(params[idx]->shape()));
      // Onto the parameter's device, detached, a private copy (the optimizer updates its buffers).
      Tensor copy = eager::zeros(t.shape(), params[idx]->dtype(), params[idx]->device());
      copy.copy_(t);
      state[idx][name.substr(dot + 1)] = copy;
    }
    for (size_t i = 0; i < groups_.size(); ++i) {
      groups_[i].lr = groups[i].at("lr").get<double>();
      groups_[i].initial_lr = groups[i].at("initial_lr").get<double>();
      groups_[i].weight_decay = groups[i].at("weight_decay").get<double>();
    }
    state_ = std::move(state);
    steps_ = std::move(steps);
  } catch (const eager::Error& e) {
    return e.status().with_context("optimizer load_state_dict");
  } catch (const std::exception& e) {
    return invalid_argument(std::string("optimizer state is malformed: ") + e.what());
  }
  return Status::ok();
}

// --- SGD ---

SGD::SGD(std::vector<Tensor> params, SGDOptions o) : SGD(one_group(std::move(params), o.lr, o.weight_decay), o) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions o)
    : Optimizer(with_defaults(std::move(groups), o.lr, o.weight_decay)), o_(o) {
  if (o.momentum < 0) fail("SGD: momentum must be >= 0");
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    fail("SGD: Nesterov momentum requires a momentum and zero dampening");
}

namespace {

// SGD's update of a group's f32 parameters in a device's own memory whose momentum buffers exist (every step after the
// first), all of them in one ai.onnx.preview.training Momentum call (the CUDA plugin updates up to 16 tensors a
// launch) instead of five ops each: alpha = momentum, beta = 1 - dampening, norm_coefficient = weight decay. The new
// momenta replace the buffers and the new values the parameters' storage (Tensor::set_data_: no copy back per
// parameter and step). The same operations in the same
// order as the eager path (and sgd_update_on_host), each rounded to f32. False when the device has no Momentum kernel
// for these tensors (the caller then runs the eager ops).
// Whether `device` ("cuda", "cuda:1") registers a kernel for the op: the fused optimizer updates are taken only there
// (a device without one would run the op on the CPU, copying every tensor over and back).
bool device_has_kernel(const std::string& domain, const std::string& op, const std::string& device) {
  return !eager::environment().registry().kernels_for(domain, op, 1, device.substr(0, device.find(':'))).empty();
}

struct DeviceUpdate {
  size_t idx;
  Tensor p, g, buf;
};
bool sgd_update_on_device(std::vector<DeviceUpdate>& u, float lr, float wd, const SGDOptions& o) {
  if (u.empty()) return false;
  const std::string device = u[0].p.device();
  if (!device_has_kernel("ai.onnx.preview.training", "Momentum", device)) return false;
  std::vector<Tensor> in;
  in.reserve(2 + 3 * u.size());
  // Read-only scalars, cached on the device by value: no upload (a wait for the device) per step.
  in.push_back(eager::cached_constant(eager::full({}, lr, DType::kF32, "cpu"), device));
  in.push_back(eager::cached_constant(eager::full({}, 1.f, DType::kI64, "cpu"), device));  // T > 0: beta applies
  for (auto& x : u) in.push_back(x.p.detach());
  for (auto& x : u) in.push_back(x.g);
  for (auto& x : u) in.push_back(x.buf);
  std::vector<Tensor> out;
  try {
    out = eager::call_op("ai.onnx.preview.training", "Momentum", in,
                         {{"alpha", Attribute::of_float(static_cast<float>(o.momentum))},
                          {"beta", Attribute::of_float(static_cast<float>(1 - o.dampening))},
                          {"norm_coefficient", Attribute::of_float(wd)},
                          {"mode", Attribute::of_string(o.nesterov ? "nesterov" : "standard")}},
                         2 * u.size());
  } catch (const eager::Error& e) {
    if (e.status().code() != StatusCode::kUnimplemented) throw;
    return false;  // no Momentum kernel on this device for these tensors: the eager ops
  }
  for (size_t k = 0; k < u.size(); ++k) {
    u[k].p.set_data_(out[k]);  // the op's output becomes the parameter: no copy
    u[k].buf = out[u.size() + k];
  }
  return true;
}

}  // namespace

// Deferred convolutions (eager::conv2d) that read a parameter see its values from before the step, which may write
// it in place.
void Optimizer::compute_deferred_reading_params() {
  for (const auto& g : groups_)
    for (const Tensor& p : g.params) eager::compute_deferred(p);
}

void SGD::step() {
  compute_deferred_reading_params();
  eager::NoGradGuard ng;
  size_t i = 0;
  for (auto& group : param_groups()) {
    const auto lr = static_cast<float>(group.lr), wd = static_cast<float>(group.weight_decay);
    // Parameters in a device's own memory with a momentum buffer: one fused update per device (below).
    std::map<std::string, std::vector<DeviceUpdate>> on_device;
    for (auto& p : group.params) {
      const size_t idx = i++;
      Tensor g = p.grad();
      if (!g.defined()) continue;
      auto it = o_.momentum != 0 ? state_[idx].find("momentum_buffer") : state_[idx].end();
      if (it != state_[idx].end() && sgd_update_on_host(p, g, it->second, lr, wd, o_)) {
        ++steps_[idx];
        continue;
      }
      if (it != state_[idx].end() && p.device() != "cpu" && p.dtype() == DType::kF32 && g.dtype() == DType::kF32 &&
          it->second.dtype() == DType::kF32 && g.device() == p.device() && it->second.device() == p.device() &&
          g.shape() == p.shape() && it->second.shape() == p.shape()) {
        on_device[p.device()].push_back(DeviceUpdate{idx, p, g, it->second});
        continue;
      }
      sgd_eager_update(p, g, idx, lr, wd);
    }
    for (auto& [device, u] : on_device) {
      if (sgd_update_on_device(u, lr, wd, o_)) {
        for (auto& x : u) {
          state_[x.idx]["momentum_buffer"] = x.buf;
          ++steps_[x.idx];
        }
      } else {
        for (auto& x : u) sgd_eager_update(x.p, x.g, x.idx, lr, wd);
      }
    }
  }
}

// One parameter's update by eager ops (any device and dtype; the first step, which makes the momentum buffer).
void SGD::sgd_eager_update(Tensor& p, Tensor g, size_t idx, float lr, float wd) {
  auto it = o_.momentum != 0 ? state_[idx].find("momentum_buffer") : state_[idx].end();
  if (wd != 0) g = g + p * wd;
  if (o_.momentum != 0) {
    Tensor buf;
    if (it == state_[idx].end()) {
      buf = g * 1.f;  // a copy: the buffer must not alias the gradient
    } else {
      buf = it->second * static_cast<float>(o_.momentum);
      buf = o_.dampening == 0 ? buf + g : buf + g * static_cast<float>(1 - o_.dampening);
    }
    state_[idx]["momentum_buffer"] = buf;
    g = o_.nesterov ? g + buf * static_cast<float>(o_.momentum) : buf;
  }
  p.copy_(p - g * lr);
  ++steps_[idx];
}

// --- Adam / AdamW ---

Adam::Adam(std::vector<Tensor> params, AdamOptions o, bool decoupled)
    : Adam(one_group(std::move(params), o.lr, o.weight_decay), o, decoupled) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions o, bool decoupled)
    : Optimizer(with_defaults(std::move(groups), o.lr, o.weight_decay)), o_(o), decoupled_(decoupled) {
  if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1)) fail("Adam: betas must be in [0, 1)");
  if (!(o.eps >= 0)) fail("Adam: eps must be >= 0");
}

namespace {

// Adam's step of parameters in a device's own memory, f32, one device and the same step count (so the same
// scalars): one keel.AdamStep call (the CUDA plugin updates up to 16 tensors a launch) instead of about a dozen ops
// each; the new moments replace the state and the new values the parameters' storage (set_data_, as SGD's). Same
// operations in the same order as adam_loop. False when the device has no AdamStep kernel.
struct DeviceAdam {
  size_t idx;
  Tensor p, g, m, v;
};
bool adam_update_on_device(std::vector<DeviceAdam>& u, const AdamScalars& s) {
  if (u.empty()) return false;
  const std::string device = u[0].p.device();
  if (!device_has_kernel("keel", "AdamStep", device)) return false;
  const std::vector<float> sc = {s.decay_scale,  s.wd,       s.b1,  s.one_minus_b1, s.b2,
                                 s.one_minus_b2, s.sqrt_bc2, s.eps, s.step_size};
  std::vector<Tensor> in = {eager::from_vector(sc, {9}).to(device)};
  for (auto& x : u) in.push_back(x.p.detach());
  for (auto& x : u) in.push_back(x.g);
  for (auto& x : u) in.push_back(x.m);
  for (auto& x : u) in.push_back(x.v);
  std::vector<Tensor> out;
  try {
    out = eager::call_op("keel", "AdamStep", in, {}, 3 * u.size());
  } catch (const eager::Error& e) {
    if (e.status().code() != StatusCode::kUnimplemented) throw;
    return false;
  }
  const size_t n = u.size();
  for (size_t k = 0; k < n; ++k) {
    u[k].p.set_data_(out[k]);
    u[k].m = out[n + k];
    u[k].v = out[2 * n + k];
  }
  return true;
}

}  // namespace

void Adam::step() {
  compute_deferred_reading_params();
  eager::NoGradGuard ng;
  size_t i = 0;
  const auto b1 = static_cast<float>(o_.beta1), b2 = static_cast<float>(o_.beta2);
  for (auto& group : param_groups()) {
    // Parameters in a device's own memory, by device and step count (one fused update each, below).
    struct Batch {
      AdamScalars s;
      double bc2, step_size;  // for the eager ops, where the device has no AdamStep kernel
      std::vector<DeviceAdam> u;
    };
    std::map<std::pair<std::string, int64_t>, Batch> on_device;
    for (auto& p : group.params) {
      const size_t idx = i++;
      Tensor g = p.grad();
      if (!g.defined()) continue;
      const int64_t t = ++steps_[idx];
      const double bc1 = 1 - std::pow(o_.beta1, static_cast<double>(t));
      const double bc2 = 1 - std::pow(o_.beta2, static_cast<double>(t));
      const double step_size = group.lr / bc1;
      auto& st = state_[idx];
      AdamScalars s{};
      s.decay_scale = group.weight_decay != 0 && decoupled_ ? static_cast<float>(1 - group.lr * group.weight_decay) : 1;
      s.wd = group.weight_decay != 0 && !decoupled_ ? static_cast<float>(group.weight_decay) : 0;
      s.b1 = b1;
      s.one_minus_b1 = 1 - b1;
      s.b2 = b2;
      s.one_minus_b2 = 1 - b2;
      s.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
      s.eps = static_cast<float>(o_.eps);
      s.step_size = static_cast<float>(step_size);
      const bool f32 =
          p.dtype() == DType::kF32 && g.dtype() == DType::kF32 && g.device() == p.device() && g.shape() == p.shape();
      if (f32) {
        // The moments start as zeros on the first step, as the eager path's do.
        Tensor& m = st["exp_avg"];
        Tensor& v = st["exp_avg_sq"];
        if (!m.defined()) m = eager::zeros(p.shape(), p.dtype(), p.device());
        if (!v.defined()) v = eager::zeros(p.shape(), p.dtype(), p.device());
        if (p.device() == "cpu" && adam_update_on_host(p, g, m, v, s)) continue;
        if (p.device() != "cpu" && m.dtype() == DType::kF32 && v.dtype() == DType::kF32 && m.device() == p.device() &&
            v.device() == p.device()) {
          Batch& b = on_device[std::make_pair(p.device(), t)];
          b.s = s, b.bc2 = bc2, b.step_size = step_size;
          b.u.push_back(DeviceAdam{idx, p, g, m, v});
          continue;
        }
      }
      adam_eager_update(p, g, idx, group.lr, group.weight_decay, bc2, step_size);
    }
    for (auto& [key, b] : on_device) {
      if (adam_update_on_device(b.u, b.s)) {
        for (auto& x : b.u) {
          state_[x.idx]["exp_avg"] = x.m;
          state_[x.idx]["exp_avg_sq"] = x.v;
        }
      } else {
        for (auto& x : b.u) adam_eager_update(x.p, x.g, x.idx, group.lr, group.weight_decay, b.bc2, b.step_size);
      }
    }
  }
}

// One parameter's update by eager ops (any device and dtype).
void Adam::adam_eager_update(Tensor& p, Tensor g, size_t idx, double lr, double weight_decay, double bc2,
                             double step_size) {
  const auto b1 = static_cast<float>(o_.beta1), b2 = static_cast<float>(o_.beta2);
  auto& st = state_[idx];
  if (weight_decay != 0) {
    if (decoupled_) p.copy_(p * static_cast<float>(1 - lr * weight_decay));
    else g = g + p * static_cast<float>(weight_decay);
  }
  Tensor m =
      st.count("exp_avg") && st["exp_avg"].defined() ? st["exp_avg"] : eager::zeros(p.shape(), p.dtype(), p.device());
  Tensor v = st.count("exp_avg_sq") && st["exp_avg_sq"].defined() ? st["exp_avg_sq"]
                                                                  : eager::zeros(p.shape(), p.dtype(), p.device());
  m = m * b1 + g * (1 - b1);
  v = v * b2 + (g * g) * (1 - b2);
  st["exp_avg"] = m;
  st["exp_avg_sq"] = v;
  Tensor denom = eager::sqrt(v) / static_cast<float>(std::sqrt(bc2)) + static_cast<float>(o_.eps);
  p.copy_(p - (m / denom) * static_cast<float>(step_size));
}

// --- clipping ---

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, bool error_if_nonfinite) {
  eager::NoGradGuard ng;
  std::vector<Tensor> grads;
  // Each device's sum of squares stays on it until all its gradients are in: one host read per device, not one per
  // gradient (a read waits for the device to finish its queued work).
  std::map<std::string, Tensor> sums;
  for (const auto& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    Tensor g32 = g.dtype() == DType::kF32 ? g : g.to(DType::kF32);
    Tensor s = eager::sum(g32 * g32);
    auto [it, first] = sums.try_emplace(g.device(), s);
    if (!first) it->second = it->second + s;
  }
  double total = 0;
  for (const auto& [device, s] : sums) total += static_cast<double>(s.item());
  const double norm = std::sqrt(total);
  if (!std::isfinite(norm) && error_if_nonfinite)
    fail("clip_grad_norm_: the total norm of the gradients is non-finite (" + std::to_string(norm) + ")");
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1) {
    for (auto& g : grads) g.copy_(g * static_cast<float>(coef));
  }
  return norm;
}

// --- schedulers ---

void LRScheduler::apply() {
  const double f = factor(step_);
  for (auto& g : opt_.param_groups()) g.lr = g.initial_lr * f;
}

void LRScheduler::step() {
  ++step_;
  apply();
}

State LRScheduler::state_dict() const {
  State s;
  s.values["step"] = step_;
  s.values["lr"] = opt_.lr();
  return s;
}

Status LRScheduler::load_state_dict(const State& s) {
  if (!s.values.contains("step") || !s.values["step"].is_number_integer())
    return invalid_argument("scheduler state has no integer 'step'");
  step_ = s.values["step"].get<int64_t>();
  apply();
  return Status::ok();
}

StepLR::StepLR(Optimizer& opt, int64_t step_size, double gamma) : LRScheduler(opt), size_(step_size), gamma_(gamma) {
  if (step_size < 1) fail("StepLR: step_size must be >= 1");
  apply();
}
double StepLR::factor(int64_t t) const { return std::pow(gamma_, static_cast<double>(t / size_)); }

MultiStepLR::MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(opt), milestones_(std::move(milestones)), gamma_(gamma) {
  std::sort(milestones_.begin(), milestones_.end());
  apply();
}
double MultiStepLR::factor(int64_t t) const {
  auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), t) - milestones_.begin();
  return std::pow(gamma_, static_cast<double>(passed));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min)
    : LRScheduler(opt), t_max_(t_max), eta_min_(eta_min) {
  if (t_max < 1) fail("CosineAnnealingLR: T_max must be >= 1");
  apply();
}
double CosineAnnealingLR::factor(int64_t t) const {
  // As a factor of each group's initial lr: eta_min is absolute, so divide it out per group (groups share the base
  // in practice; with several bases eta_min is applied relative to the first group's).
  const double base = opt_.param_groups().empty() ? 1 : opt_.param_groups()[0].initial_lr;
  const double lr =
      eta_min_ + (base - eta_min_) * (1 + std::cos(M_PI * static_cast<double>(t) / static_cast<double>(t_max_))) / 2;
  return base > 0 ? lr / base : 0;
}

LinearWarmupLR::LinearWarmupLR(Optimizer& opt, int64_t total, double start, double end,
                               std::shared_ptr<LRScheduler> after)
    : LRScheduler(opt), total_(total), start_(start), end_(end), after_(std::move(after)) {
  if (total < 1) fail("LinearWarmupLR: total_steps must be >= 1");
  if (!(start > 0 && start <= 1) || !(end >= 0 && end <= 1))
    fail("LinearWarmupLR: factors must be in (0, 1] and [0, 1]");
  apply();
}
double LinearWarmupLR::factor(int64_t t) const {
  if (after_ && t >= total_) return after_->factor(t - total_);
  const double k = static_cast<double>(std::min(t, total_)) / static_cast<double>(total_);
  return start_ + (end_ - start_) * k;
}

// --- GradScaler ---

namespace {

// unscale_'s host path: the f32 gradients of `params` (one device, one dtype) in host memory, each multiplied by inv in
// place, once per distinct memory (one tensor set as two parameters' .grad is unscaled once); `found_inf` set when any
// result is not finite. False, changing nothing, where it does not apply (another device or dtype, or gradients that
// overlap in part, which an in-place pass would unscale twice where they meet).
bool unscale_on_host(const std::vector<Tensor*>& params, float inv, bool& found_inf) {
  std::vector<std::pair<float*, int64_t>> spans;
  for (const Tensor* p : params) {
    Tensor g = p->grad();
    if (g.device() != "cpu" || g.dtype() != DType::kF32) return false;
    spans.emplace_back(g.data().data<float>(), g.numel());
  }
  std::sort(spans.begin(), spans.end());
  spans.erase(std::unique(spans.begin(), spans.end()), spans.end());
  for (size_t k = 1; k < spans.size(); ++k)
    if (spans[k].first < spans[k - 1].first + spans[k - 1].second) return false;
  for (const auto& [data, n] : spans)
    if (!unscale_loop(data, n, inv)) found_inf = true;
  return true;
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions o) : o_(o), scale_(o.init_scale) {
  if (!(o.init_scale > 0) || !(o.growth_factor > 1) || !(o.backoff_factor > 0 && o.backoff_factor < 1) ||
      o.growth_interval < 1)
    fail("GradScaler: init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and growth_interval >= 1 required");
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!o_.enabled) return loss;
  Tensor l = loss.dtype() == DType::kF32 ? loss : loss.to(DType::kF32);
  return l * static_cast<float>(scale_);
}

void GradScaler::unscale_(Optimizer& opt) {
  // Deferred convolutions (eager::conv2d) that read a gradient unscaled in place see its values from before.
  for (const auto& g : opt.param_groups())
    for (const Tensor& p : g.params)
      if (p.defined() && p.grad().defined()) eager::compute_deferred(p.grad());
  if (!o_.enabled) return;
  if (unscaled_) fail("GradScaler: unscale_() was already called since the last update()");
  eager::NoGradGuard ng;
  const auto inv = static_cast<float>(1.0 / scale_);
  // The gradients by device and dtype, in parameter order.
  std::map<std::pair<std::string, DType>, std::vector<Tensor*>> by_device;
  for (auto& group : opt.param_groups())
    for (auto& p : group.params)
      if (p.grad().defined()) by_device[{p.grad().device(), p.grad().dtype()}].push_back(&p);
  // One flag per device and dtype: 0 when every unscaled gradient is finite (1 or NaN otherwise), read back once all
  // are queued.
  std::vector<Tensor> flags;
  found_inf_ = false;
  for (auto& [key, params] : by_device) {
    const std::string& device = key.first;
    // f32 gradients in host memory: one in-place pass each (unscale_on_host), instead of the reference kernel's copy of
    // them all beside them (0.65 ms of a LeNet-like step for its 1.2 M gradients).
    if (unscale_on_host(params, inv, found_inf_)) continue;
    // One keel.CheckFiniteAndUnscale call per device and dtype where the device has the kernel (the unscaled
    // gradients replace the .grad tensors).
    if (device_has_kernel("keel", "CheckFiniteAndUnscale", device)) {
      std::vector<Tensor> in = {eager::cached_constant(eager::full({}, inv, DType::kF32, "cpu"), device)};
      for (Tensor* p : params) in.push_back(p->grad());
      std::vector<Tensor> out;
      try {
        out = eager::call_op("keel", "CheckFiniteAndUnscale", in, {}, params.size() + 1);
      } catch (const eager::Error& e) {
        if (e.status().code() != StatusCode::kUnimplemented) throw;
      }
      if (!out.empty()) {
        for (size_t k = 0; k < params.size(); ++k) params[k]->set_grad(out[k + 1]);
        flags.push_back(out[0]);
        continue;
      }
    }
    // Eager ops on the device: g·0 is 0 where g is finite and NaN where it is not, so the sum of g·0 over all
    // gradients is 0 or NaN (never a false alarm from a large finite sum overflowing, in any dtype).
    Tensor flag;
    for (Tensor* p : params) {
      Tensor g = p->grad();
      Tensor u = g * inv;
      g.copy_(u);
      Tensor f = eager::sum(u * 0.f);
      if (f.dtype() != DType::kF32) f = f.to(DType::kF32);
      flag = flag.defined() ? flag + f : f;
    }
    flags.push_back(flag);
  }
  for (const Tensor& f : flags)
    if (f.item() != 0) found_inf_ = true;  // 1 or NaN
  unscaled_ = true;
}

bool GradScaler::step(Optimizer& opt) {
  if (!o_.enabled) {
    opt.step();
    return true;
  }
  if (!unscaled_) unscale_(opt);
  stepped_ = true;
  if (found_inf_) {
    ++skipped_;
    return false;
  }
  opt.step();
  return true;
}

void GradScaler::update() {
  if (!o_.enabled) return;
  if (!stepped_ && !unscaled_) return;  // nothing happened since the last update
  if (found_inf_) {
    scale_ *= o_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ >= o_.growth_interval) {
    scale_ *= o_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = stepped_ = found_inf_ = false;
}

State GradScaler::state_dict() const {
  State s;
  s.values = {{"scale", scale_},
              {"growth_tracker", growth_tracker_},
              {"skipped", skipped_},
              {"enabled", o_.enabled},
              {"growth_factor", o_.growth_factor},
              {"backoff_factor", o_.backoff_factor},
              {"growth_interval", o_.growth_interval}};
  return s;
}

Status GradScaler::load_state_dict(const State& s) {
  try {
    scale_ = s.values.at("scale").get<double>();
    growth_tracker_ = s.values.at("growth_tracker").get<int64_t>();
    skipped_ = s.values.value("skipped", int64_t{0});
  } catch (const std::exception& e) {
    return invalid_argument(std::string("grad scaler state is malformed: ") + e.what());
  }
  if (!(scale_ > 0)) return invalid_argument("grad scaler state: scale must be > 0");
  unscaled_ = stepped_ = found_inf_ = false;
  return Status::ok();
}

}  // namespace keel::train
