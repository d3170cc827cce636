// Random training: a differential fuzzer of eager training as a whole — the autograd's rules and their composition,
// the fused eager paths (conv2d_relu, conv2d_relu_max_pool2d), autocast, batch statistics and SGD's steps — on the
// plugins' kernels against the reference kernels.
//
// Seed S draws a small network (a CNN of convolutions of random geometry with BatchNorm, activations, pooling and
// residuals; or a transformer-like block over a sequence of token embeddings or features: LayerNorm, MLP,
// self-attention), a loss (cross-entropy, MSE, BCE with logits), SGD (plain, with momentum and weight decay, or
// Nesterov's), autocast (none or bf16) and a team of 1 or 2 threads. Its parameters and batches come from a host
// generator, so that both environments start from the same values; each trains 3 steps. Every step's loss, the first
// step's gradients and, at the end, every parameter and running statistic are compared (relative L2; see compare()
// for what counts as rounding: a bf16 value as near the f32 run as the reference kernels' own, a diverging run, a
// difference that goes away with other values of the same network). Not Adam: its first steps move every weight by
// about lr whatever the gradient's size, so a gradient that is rounding noise in both runs (a bias a BatchNorm takes
// out) would move apart by 2 lr; its kernel is the CTS's (AdamStep).
//
// Repro of a failure: KEEL_RANDOM_TRAINING_SEED=S KEEL_RANDOM_TRAINING_COUNT=1 build/bin/train_random_test
// (KEEL_RANDOM_TRAINING_COUNT=N runs N seeds from KEEL_RANDOM_TRAINING_SEED, default 1; ctest runs 200, about 4 s;
// 6,000 take 2 minutes on the 2-vCPU host).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/base/tensor.h"
#include "core/runtime/environment.h"
#include "core/train/optim.h"

namespace keel::train {
namespace {

using eager::Tensor;

std::shared_ptr<Environment> make_env(bool plugins) {
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  EnvironmentOptions o;
  o.discover_plugins = plugins;
  auto e = Environment::create(o);
  if (!e.is_ok()) throw std::runtime_error(e.status().to_string());
  return std::shared_ptr<Environment>(std::move(e).value());
}

// What one run produced: the loss of every step, the first step's gradients, then every parameter and buffer after
// the last step (flattened, in order; names for parameters, then buffers).
struct Outcome {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
  std::vector<std::vector<float>> tensors;
  std::vector<std::string> names;
};

// A network drawn from a seed: train() builds it in the bound environment (its architecture replayed from the seed,
// its parameters and batch from a host generator: the same values in every environment) and trains it.
class RandomNet {
 public:
  explicit RandomNet(uint64_t seed) : rng_(seed * 0x9E3779B97F4A7C15ull + 1), seed_(seed) {
    amp_ = chance(30);
    threads_ = static_cast<int>(1 + uniform(2));
    optimizer_ = static_cast<int>(uniform(3));  // SGD, with momentum and weight decay, Nesterov
    loss_ = static_cast<int>(uniform(10));      // 0-6 cross-entropy, 7-8 MSE, 9 BCE with logits
    sequence_ = chance(35);
    const char* optimizers[] = {"sgd", "sgd momentum+wd", "sgd nesterov"};
    what_ << "seed=" << seed << ": " << threads_ << "t" << (amp_ ? " bf16" : "") << " " << optimizers[optimizer_]
          << (loss_ <= 6   ? " cross-entropy"
              : loss_ <= 8 ? " mse"
                           : " bce");
  }

  std::string what() const { return what_.str(); }

  // `autocast` false trains the same network in f32 even when it is drawn with bf16 autocast (the exact side against
  // which both environments' bf16 rounding is measured).
  Outcome train(std::shared_ptr<Environment> env, bool autocast = true) {
    eager::init(std::move(env), threads_);
    // parameter and batch values: the same in both runs
    std::mt19937_64 vals(seed_ * 31 + 7 + values_salt_ * 0x9E3779B97F4A7C15ull);
    params_.clear(), stats_.clear(), names_.clear();
    std::mt19937_64 shape_rng = rng_;  // the architecture's draws replay identically in both runs
    std::function<Tensor(const Tensor&)> forward;
    Tensor x, target;
    const int64_t n = 1 + static_cast<int64_t>(shape_rng() % 4), classes = 2 + static_cast<int64_t>(shape_rng() % 9);
    std::ostringstream arch;
    if (sequence_) {
      forward = sequence_net(shape_rng, vals, n, classes, x, arch);
    } else {
      forward = conv_net(shape_rng, vals, n, classes, x, arch);
    }
    if (first_arch_.empty()) first_arch_ = arch.str();
    std::uniform_real_distribution<float> u(0.f, 1.f);
    if (loss_ <= 6) {
      std::vector<int64_t> lab(static_cast<size_t>(n));
      for (auto& l : lab) l = static_cast<int64_t>(vals() % static_cast<uint64_t>(classes));
      target = eager::from_vector(lab, {n});
    } else {
      std::vector<float> t(static_cast<size_t>(n * classes));
      for (auto& v : t) v = loss_ == 9 ? (u(vals) < 0.5f ? 0.f : 1.f) : u(vals) * 2 - 1;
      target = eager::from_vector(t, {n, classes});
    }
    std::unique_ptr<Optimizer> opt;
    switch (optimizer_) {
      case 0: opt = std::make_unique<SGD>(params_, SGDOptions{0.05}); break;
      case 1: opt = std::make_unique<SGD>(params_, SGDOptions{0.02, 0.9, 0, 1e-3}); break;
      default: opt = std::make_unique<SGD>(params_, SGDOptions{0.02, 0.9, 0, 0, true}); break;
    }
    Outcome out;
    for (int step = 0; step < 3; ++step) {
      Tensor loss;
      {
        std::unique_ptr<eager::AutocastGuard> ac;
        if (amp_ && autocast) ac = std::make_unique<eager::AutocastGuard>(DType::kBF16);
        Tensor logits = forward(x);
        if (loss_ <= 6) loss = eager::cross_entropy(logits, target);
        else if (loss_ <= 8) loss = eager::mse_loss(logits, target);
        else loss = eager::binary_cross_entropy_with_logits(logits, target);
      }
      loss.backward();
      if (step == 0)
        for (const Tensor& p : params_)
          out.grads.push_back(p.grad().defined() ? p.grad().to(DType::kF32).to_vector<float>()
                                                 : std::vector<float>(static_cast<size_t>(p.numel()), 0.f));
      opt->step();
      opt->zero_grad();
      out.losses.push_back(loss.item());
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      out.tensors.push_back(params_[i].to(DType::kF32).to_vector<float>());
      out.names.push_back(names_[i]);
    }
    for (size_t i = 0; i < stats_.size(); ++i) {
      out.tensors.push_back(stats_[i]->first.to_vector<float>());
      out.names.push_back("bn.running_mean#" + std::to_string(i));
      out.tensors.push_back(stats_[i]->second.to_vector<float>());
      out.names.push_back("bn.running_var#" + std::to_string(i));
    }
    return out;
  }

  std::string arch() const { return first_arch_; }
  bool amp() const { return amp_; }
  // Other initial values and batch in the runs after this call, the architecture and everything else the same: a
  // value that sat within rounding of a kink (a ReLU's zero, two window values in a max pooling) moves away from it,
  // while a kernel's error stays.
  void use_other_values() { values_salt_ = 1; }

 private:
  int64_t uniform(int64_t k) { return static_cast<int64_t>(rng_() % static_cast<uint64_t>(k)); }
  bool chance(int pct) { return uniform(100) < pct; }
  static int64_t draw(std::mt19937_64& r, int64_t k) { return static_cast<int64_t>(r() % static_cast<uint64_t>(k)); }
  static int64_t pick(std::mt19937_64& r, std::initializer_list<int64_t> v) {
    return *(v.begin() + draw(r, static_cast<int64_t>(v.size())));
  }

  // A parameter uniform in offset +- bound (PyTorch's default initialisation: bound 1 / sqrt(fan_in)), requiring
  // grad.
  Tensor param(std::mt19937_64& vals, const std::string& name, Shape shape, float bound, float offset = 0.f) {
    const int64_t count = shape_numel(shape);
    std::uniform_real_distribution<float> u(offset - bound, offset + bound);
    std::vector<float> v(static_cast<size_t>(count));
    for (auto& e : v) e = u(vals);
    Tensor t = eager::from_vector(v, shape);
    t.requires_grad_();
    params_.push_back(t);
    names_.push_back(name + "#" + std::to_string(params_.size() - 1));
    return t;
  }
  static Tensor data(std::mt19937_64& vals, Shape shape, float stddev) {
    const int64_t count = shape_numel(shape);
    std::normal_distribution<float> g(0.f, stddev);
    std::vector<float> v(static_cast<size_t>(count));
    for (auto& e : v) e = g(vals);
    return eager::from_vector(v, shape);
  }

  static std::function<Tensor(const Tensor&)> activation(std::mt19937_64& r, std::ostringstream& arch) {
    switch (draw(r, 6)) {
      case 0: arch << " relu"; return [](const Tensor& t) { return eager::relu(t); };
      case 1: arch << " gelu"; return [](const Tensor& t) { return eager::gelu(t); };
      case 2: arch << " sigmoid"; return [](const Tensor& t) { return eager::sigmoid(t); };
      case 3: arch << " tanh"; return [](const Tensor& t) { return eager::tanh(t); };
      case 4: arch << " leaky_relu"; return [](const Tensor& t) { return eager::leaky_relu(t, 0.1f); };
      default: arch << " identity"; return [](const Tensor& t) { return t; };
    }
  }

  // Convolutions of random geometry, BatchNorm, activations, pooling and residuals over [N, C, H, W], then a
  // classifier.
  std::function<Tensor(const Tensor&)> conv_net(std::mt19937_64& r, std::mt19937_64& vals, int64_t n, int64_t classes,
                                                Tensor& x, std::ostringstream& arch) {
    int64_t c = pick(r, {1, 3, 4, 8}), h = 6 + draw(r, 14), w = draw(r, 2) ? h : 6 + draw(r, 14);
    x = data(vals, {n, c, h, w}, 1.f);
    arch << "conv net x=[" << n << "," << c << "," << h << "," << w << "]";
    std::vector<std::function<Tensor(const Tensor&)>> layers;
    const int blocks = 1 + static_cast<int>(draw(r, 4));
    for (int b = 0; b < blocks; ++b) {
      const int64_t kind = draw(r, 100);
      const int64_t k = pick(r, {1, 3, 3, 5}), s = draw(r, 3) == 0 ? 2 : 1, d = k > 1 && draw(r, 5) == 0 ? 2 : 1;
      const int64_t eff = (k - 1) * d + 1, p = draw(r, 2) ? eff / 2 : draw(r, eff);
      const int64_t oh = (h + 2 * p - eff) / s + 1, ow = (w + 2 * p - eff) / s + 1;
      if (oh < 2 || ow < 2) continue;
      int64_t g = 1, m = pick(r, {4, 8, 16, 17, 32});
      if (draw(r, 5) == 0 && c > 1) g = c, m = c * pick(r, {1, 2}), arch << " depthwise";
      else if (draw(r, 6) == 0 && c % 2 == 0 && m % 2 == 0) g = 2;
      // BatchNorm after a plain convolution, which then has no bias (its gradient is zero up to rounding noise,
      // which Adam would turn into steps of lr either way)
      const bool bn = kind >= 40 && draw(r, 2);
      const bool bias = !bn && draw(r, 3) != 0;
      Tensor wt = param(vals, "conv.w", {m, c / g, k, k}, 1.f / std::sqrt(static_cast<float>(c / g * k * k)));
      Tensor bt = bias ? param(vals, "conv.b", {m}, 0.1f) : Tensor();
      const std::array<int64_t, 2> st{s, s}, pd{p, p}, dl{d, d};
      arch << " conv" << k << "x" << k << "/" << s << " p" << p << " d" << d << " g" << g << " " << c << "->" << m;
      const size_t block_start = layers.size();
      const bool pooled = kind < 20 && s == 1 && oh >= 4 && ow >= 4;
      const int64_t in_h = h, in_w = w;
      if (pooled) {
        // conv2d_relu_max_pool2d: keel.FusedConvMaxPool on a CPU device
        layers.push_back([=](const Tensor& t) {
          return eager::conv2d_relu_max_pool2d(t, wt, bt, {2, 2}, st, pd, dl, g);
        });
        arch << "+relu+maxpool2";
        h = oh / 2, w = ow / 2;
      } else if (kind < 40) {
        layers.push_back([=](const Tensor& t) { return eager::conv2d_relu(t, wt, bt, st, pd, dl, g); });
        arch << "+relu";
        h = oh, w = ow;
      } else {
        layers.push_back([=](const Tensor& t) { return eager::conv2d(t, wt, bt, st, pd, dl, g); });
        h = oh, w = ow;
        if (bn) {  // in training mode: batch statistics, running ones updated in place
          Tensor gamma = param(vals, "bn.gamma", {m}, 0.2f, 1.f), beta = param(vals, "bn.beta", {m}, 0.2f);
          auto stats = std::make_shared<std::pair<Tensor, Tensor>>(eager::zeros({m}), eager::ones({m}));
          stats_.push_back(stats);
          layers.push_back(
              [=](const Tensor& t) { return eager::batch_norm(t, gamma, beta, stats->first, stats->second, true); });
          arch << "+bn";
        }
        layers.push_back(activation(r, arch));
      }
      if (m == c && h == in_h && w == in_w && draw(r, 3) == 0) {  // a residual around this block's layers
        std::vector<std::function<Tensor(const Tensor&)>> inner(
            layers.begin() + static_cast<std::ptrdiff_t>(block_start), layers.end());
        layers.resize(block_start);
        layers.push_back([inner](const Tensor& t) {
          Tensor y = t;
          for (const auto& f : inner) y = f(y);
          return y + t;
        });
        arch << " (residual)";
      }
      c = m;
      const int64_t pool = draw(r, 6);
      if (pool == 0 && h >= 3 && w >= 3) {
        layers.push_back([](const Tensor& t) { return eager::max_pool2d(t, {3, 3}, {2, 2}, {1, 1}); });
        h = (h + 2 - 3) / 2 + 1, w = (w + 2 - 3) / 2 + 1;
        arch << " maxpool3/2p1";
      } else if (pool == 1 && h >= 2 && w >= 2) {
        layers.push_back([](const Tensor& t) { return eager::avg_pool2d(t, {2, 2}); });
        h /= 2, w /= 2;
        arch << " avgpool2";
      }
    }
    int64_t features;
    if (draw(r, 2)) {
      layers.push_back([](const Tensor& t) { return eager::flatten(eager::global_avg_pool2d(t)); });
      features = c;
      arch << " gap";
    } else {
      layers.push_back([](const Tensor& t) { return eager::flatten(t); });
      features = c * h * w;
      arch << " flatten";
    }
    Tensor fw = param(vals, "fc.w", {classes, features}, 1.f / std::sqrt(static_cast<float>(features)));
    Tensor fb = param(vals, "fc.b", {classes}, 0.1f);
    layers.push_back([=](const Tensor& t) { return eager::linear(t, fw, fb); });
    arch << " linear(" << features << "->" << classes << ")";
    return [layers](const Tensor& in) {
      Tensor y = in;
      for (const auto& f : layers) y = f(y);
      return y;
    };
  }

  // A transformer-like block over [N, S, E]: token embeddings or features, LayerNorm, self-attention and an MLP with
  // residuals, a mean over the sequence and a classifier.
  std::function<Tensor(const Tensor&)> sequence_net(std::mt19937_64& r, std::mt19937_64& vals, int64_t n,
                                                    int64_t classes, Tensor& x, std::ostringstream& arch) {
    const int64_t s = pick(r, {1, 3, 7, 16}), e = pick(r, {8, 16, 24, 32});
    std::vector<std::function<Tensor(const Tensor&)>> layers;
    if (draw(r, 2)) {
      const int64_t vocab = pick(r, {5, 50});
      std::vector<int64_t> ids(static_cast<size_t>(n * s));
      for (auto& id : ids) id = static_cast<int64_t>(vals() % static_cast<uint64_t>(vocab));
      x = eager::from_vector(ids, {n, s});
      Tensor table = param(vals, "embedding", {vocab, e}, 1.f);
      layers.push_back([=](const Tensor& t) { return eager::embedding(table, t); });
      arch << "sequence ids=[" << n << "," << s << "] embedding(" << vocab << "," << e << ")";
    } else {
      x = data(vals, {n, s, e}, 1.f);
      arch << "sequence x=[" << n << "," << s << "," << e << "]";
    }
    const int blocks = 1 + static_cast<int>(draw(r, 2));
    for (int b = 0; b < blocks; ++b) {
      const bool ln = draw(r, 4) != 0;
      Tensor lw = ln ? param(vals, "ln.w", {e}, 1.f) : Tensor(), lb = ln ? param(vals, "ln.b", {e}, 0.2f) : Tensor();
      auto norm = [=](const Tensor& t) { return ln ? eager::layer_norm(t, 1, lw, lb) : t; };
      if (draw(r, 2)) {  // self-attention, one head
        const float bound = 1.f / std::sqrt(static_cast<float>(e));
        Tensor wq = param(vals, "attn.q", {e, e}, bound), wk = param(vals, "attn.k", {e, e}, bound),
               wv = param(vals, "attn.v", {e, e}, bound), wo = param(vals, "attn.o", {e, e}, bound);
        Tensor bo = param(vals, "attn.o.b", {e}, 0.1f);
        const float scale = 1.f / std::sqrt(static_cast<float>(e));
        layers.push_back([=](const Tensor& t) {
          Tensor h = norm(t);
          Tensor q = eager::linear(h, wq, Tensor()), k = eager::linear(h, wk, Tensor()),
                 v = eager::linear(h, wv, Tensor());
          Tensor a = eager::softmax(eager::matmul(q, eager::transpose(k, {0, 2, 1})) * scale, -1);
          return t + eager::linear(eager::matmul(a, v), wo, bo);
        });
        arch << (ln ? " ln" : "") << " attention";
      }
      const int64_t hidden = pick(r, {16, 33, 64});
      Tensor w1 = param(vals, "mlp.w1", {hidden, e}, 1.f / std::sqrt(static_cast<float>(e)));
      Tensor b1 = param(vals, "mlp.b1", {hidden}, 0.1f);
      Tensor w2 = param(vals, "mlp.w2", {e, hidden}, 1.f / std::sqrt(static_cast<float>(hidden)));
      Tensor b2 = param(vals, "mlp.b2", {e}, 0.1f);
      auto act = activation(r, arch);
      layers.push_back([=](const Tensor& t) { return t + eager::linear(act(eager::linear(norm(t), w1, b1)), w2, b2); });
      arch << " mlp(" << e << "->" << hidden << ")";
    }
    Tensor hw = param(vals, "head.w", {classes, e}, 1.f / std::sqrt(static_cast<float>(e)));
    Tensor hb = param(vals, "head.b", {classes}, 0.1f);
    layers.push_back([=](const Tensor& t) { return eager::linear(eager::mean(t, {1}), hw, hb); });
    arch << " mean linear(" << e << "->" << classes << ")";
    return [layers](const Tensor& in) {
      Tensor y = in;
      for (const auto& f : layers) y = f(y);
      return y;
    };
  }

  std::mt19937_64 rng_;
  uint64_t seed_;
  bool amp_ = false, sequence_ = false;
  uint64_t values_salt_ = 0;
  int threads_ = 1, optimizer_ = 0, loss_ = 0;
  std::vector<Tensor> params_;
  std::vector<std::shared_ptr<std::pair<Tensor, Tensor>>> stats_;  // BatchNorm's running mean and variance
  std::vector<std::string> names_;
  std::ostringstream what_;
  std::string first_arch_;
};

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    ref += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(err) / std::max(std::sqrt(ref), 1e-3);
}

uint64_t env_u64(const char* name, uint64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : dflt;
}

// The L2 distances of `got` and of `want` from `exact`.
std::pair<double, double> to_exact(const std::vector<float>& got, const std::vector<float>& want,
                                   const std::vector<float>& exact) {
  double a = 0, b = 0;
  for (size_t j = 0; j < exact.size(); ++j) {
    a += (static_cast<double>(got[j]) - exact[j]) * (static_cast<double>(got[j]) - exact[j]);
    b += (static_cast<double>(want[j]) - exact[j]) * (static_cast<double>(want[j]) - exact[j]);
  }
  return {std::sqrt(a), std::sqrt(b)};
}

// What differs between the two environments' runs of `net` ("" when they agree); `exact` is the reference kernels'
// run in f32 when `net` trains under bf16 autocast.
std::string compare(const RandomNet& net, const Outcome& want, const Outcome& got, const Outcome& exact) {
  // Float noise (sums in other orders, Winograd's transforms), or bf16's rounding at other places in the two
  // environments' kernels.
  // (f32: 5e-3; random training seed 5613's gradient of a bias behind a sigmoid, a pooling, a strided 1x1
  // convolution and a BatchNorm came out 2.0e-3 apart.)
  const double tol = net.amp() ? 5e-2 : 5e-3;
  // bf16 gradients: twice that (seeds 12361, 14693: biases whose gradients partly cancel, 5.3% and 7.0% apart; the
  // two environments' bf16 kernels round at other places)
  const double grad_tol = net.amp() ? 0.1 : tol;
  std::ostringstream bad;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    const double d = std::abs(static_cast<double>(got.losses[i]) - want.losses[i]);
    if (!(d <= tol * std::max(1.0, std::abs(static_cast<double>(want.losses[i])))))
      bad << " loss of step " << i + 1 << " " << got.losses[i] << " vs " << want.losses[i] << ";";
  }
  // The first step's gradients, each relative to its own norm, or to a fraction of the network's gradient per
  // element (1% in f32, 10% in bf16) where its own is smaller: a gradient that sums terms which nearly cancel keeps
  // only their rounding noise (a bias whose shift a later BatchNorm takes out, the weight of a 1x1 convolution from
  // one channel into one, which a BatchNorm's scale invariance makes zero: random training seeds 848, 1954, 2832
  // had such gradients 0.0002-0.011 of the network's, which came out 0.004-0.46 apart relative to themselves).
  double all = 0;
  size_t count = 0;
  for (const auto& g : want.grads)
    for (float v : g) all += static_cast<double>(v) * v, ++count;
  const double per_element = std::sqrt(all / static_cast<double>(std::max<size_t>(count, 1)));
  for (size_t i = 0; i < want.grads.size(); ++i) {
    double err = 0, ref = 0;
    for (size_t j = 0; j < want.grads[i].size(); ++j) {
      const double d = static_cast<double>(got.grads[i][j]) - want.grads[i][j];
      err += d * d, ref += static_cast<double>(want.grads[i][j]) * want.grads[i][j];
    }
    const double floor = (net.amp() ? 0.1 : 0.01) * per_element * std::sqrt(static_cast<double>(want.grads[i].size()));
    const double e = std::sqrt(err) / std::max({std::sqrt(ref), floor, 1e-30});
    if (e <= grad_tol) continue;
    const double norm = std::sqrt(ref) / (per_element * std::sqrt(static_cast<double>(want.grads[i].size())));
    // In bf16 also as near the f32 gradient as twice the reference kernels' own bf16 rounding: a gradient whose terms
    // nearly cancel is mostly that rounding (random training seed 34070: the bias of a convolution behind a sigmoid, a
    // pooling and a BatchNorm, 0.08 of the network's per element, came out 10.2% of the floor apart; each 0.0012-0.0015
    // from the f32 gradient).
    if (net.amp()) {
      const auto [mine, theirs] = to_exact(got.grads[i], want.grads[i], exact.grads[i]);
      if (mine <= 2 * theirs) {
        std::cerr << net.what() << ": gradient of " << want.names[i] << " relative L2 " << e << " (its norm " << norm
                  << " of the network's per element) accepted: L2 to the f32 gradient " << mine
                  << ", the reference kernels' " << theirs << "\n";
        continue;
      }
    }
    bad << " gradient of " << want.names[i] << " relative L2 " << e << " (its norm " << norm
        << " of the network's per element);";
  }
  // A run whose loss grows more than 100-fold diverges: its steps grow with it, and a gradient that is rounding noise
  // (above) moves its weight by that noise times the growth (seeds 38815 and 38903: losses 0.17 -> 8e6 and 2.4 -> 8e7,
  // weights whose gradients a BatchNorm's scale invariance makes zero ending 106% and 0.8% apart). Its losses and
  // first gradients are compared, not the state it ends in.
  bool diverged = false;
  for (float l : want.losses)
    if (!(std::abs(l) <= 100 * std::max(1.f, std::abs(want.losses.front())))) diverged = true;
  for (size_t i = 0; i < want.tensors.size() && !diverged; ++i) {
    const double e = rel_l2(got.tensors[i], want.tensors[i]);
    if (e <= tol) continue;
    if (net.amp()) {  // as the gradients (a BatchNorm's running mean of values that nearly cancel, in bf16)
      const auto [mine, theirs] = to_exact(got.tensors[i], want.tensors[i], exact.tensors[i]);
      if (mine <= 2 * theirs) {
        std::cerr << net.what() << ": " << want.names[i] << " relative L2 " << e << " accepted: L2 to the f32 run's "
                  << mine << ", the reference kernels' " << theirs << "\n";
        continue;
      }
    }
    bad << " " << want.names[i] << " relative L2 " << e << ";";
  }
  return bad.str();
}

TEST(RandomTraining, PluginsMatchTheReferenceKernels) {
  auto reference = make_env(false);
  auto plugins = make_env(true);
  const uint64_t first = env_u64("KEEL_RANDOM_TRAINING_SEED", 1), count = env_u64("KEEL_RANDOM_TRAINING_COUNT", 200);
  int failures = 0;
  for (uint64_t seed = first; seed < first + count && failures < 5; ++seed) {
    RandomNet net(seed);
    auto run = [&]() -> std::string {
      Outcome want = net.train(reference), got = net.train(plugins);
      Outcome exact = net.amp() ? net.train(reference, false) : Outcome{};
      return compare(net, want, got, exact);
    };
    std::string bad;
    try {
      bad = run();
      if (!bad.empty()) {
        // Once more with other values: a difference that goes away came from a value within rounding of a kink,
        // where the two environments' roundings take different sides (random training seeds 36653: a BatchNorm's
        // output of -3e-8 before a ReLU, and 55608: two values of a max pooling's window equal to 6 digits, each gave
        // one channel's weights gradients 2-6% apart in f32).
        net.use_other_values();
        if (run().empty()) {
          std::cerr << net.what() << " " << net.arch() << ":" << bad
                    << " accepted: the same network agrees with other values (a value within rounding of a kink)\n";
          bad.clear();
        }
      }
    } catch (const std::exception& e) {
      bad = std::string(" ") + e.what();
    }
    if (!bad.empty()) {
      ADD_FAILURE() << net.what() << " " << net.arch() << ":" << bad << "\n  repro: KEEL_RANDOM_TRAINING_SEED=" << seed
                    << " KEEL_RANDOM_TRAINING_COUNT=1 build/bin/train_random_test";
      ++failures;
    }
  }
  eager::init(reference);
}

}  // namespace
}  // namespace keel::train
