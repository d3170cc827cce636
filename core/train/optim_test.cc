#include "core/train/optim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

namespace keel::train {
namespace {

Tensor param(std::vector<float> v) {
  Tensor p = eager::from_vector(v, {static_cast<int64_t>(v.size())});
  p.requires_grad_(true);
  return p;
}
void set_grad(Tensor& p, std::vector<float> g) { p.set_grad(eager::from_vector(g, {static_cast<int64_t>(g.size())})); }

TEST(SGD, MomentumWeightDecayMatchesHandComputedSteps) {
  Tensor p = param({1.f});
  SGD opt({p}, SGDOptions{0.1, 0.9, 0, 0.01, false});
  set_grad(p, {0.5f});
  opt.step();
  EXPECT_NEAR(p.item(), 0.949f, 1e-6);  // g = 0.5 + 0.01·1; b = g; p = 1 − 0.1·0.51
  set_grad(p, {0.5f});
  opt.step();
  EXPECT_NEAR(p.item(), 0.852151f, 1e-6);  // g = 0.50949; b = 0.9·0.51 + 0.50949 = 0.96849
}

// A convolution deferred before a step (eager::conv2d waits for the op that reads it) is computed with the weights
// of before the step, as if it had run at its call: SGD's one-pass update and Adam's write the weights in place.
TEST(Optimizer, AStepComesAfterADeferredConvolutionOfItsWeights) {
  for (bool adam : {false, true}) {
    eager::manual_seed(3);
    Tensor x = eager::randn({2, 3, 8, 8});
    Tensor w = eager::randn({4, 3, 3, 3}).requires_grad_(), b = eager::randn({4}).requires_grad_();
    const auto want = [&] {
      Tensor c = eager::conv2d(x, w, b);
      (void)c.data();
      return c.to_vector<float>();
    }();
    Tensor c = eager::conv2d(x, w, b);
    w.set_grad(eager::ones(w.shape()));
    b.set_grad(eager::ones(b.shape()));
    std::unique_ptr<Optimizer> opt;
    if (adam) opt = std::make_unique<Adam>(std::vector<Tensor>{w, b}, AdamOptions{});
    else opt = std::make_unique<SGD>(std::vector<Tensor>{w, b}, SGDOptions{0.5});
    opt->step();
    const auto got = c.to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_FLOAT_EQ(got[i], want[i]) << (adam ? "Adam" : "SGD") << " " << i;
  }
}

TEST(SGD, NesterovAndDampening) {
  Tensor p = param({1.f});
  SGD nes({p}, SGDOptions{0.1, 0.9, 0, 0.01, true});
  set_grad(p, {0.5f});
  nes.step();
  EXPECT_NEAR(p.item(), 0.9031f, 1e-6);  // g + 0.9·b = 0.51 + 0.459
  Tensor q = param({1.f});
  SGD damp({q}, SGDOptions{0.1, 0.9, 0.5, 0, false});
  set_grad(q, {0.5f});
  damp.step();
  EXPECT_NEAR(q.item(), 0.95f, 1e-6);  // the first buffer is the gradient itself, undampened
  set_grad(q, {0.5f});
  damp.step();
  EXPECT_NEAR(q.item(), 0.88f, 1e-6);  // b = 0.9·0.5 + 0.5·0.5 = 0.7
  EXPECT_THROW(SGD({param({1})}, SGDOptions{0.1, 0, 0, 0, true}), eager::Error);
  // Parameters without a gradient are left alone.
  Tensor r = param({2.f});
  SGD plain({r}, SGDOptions{0.1});
  plain.step();
  EXPECT_EQ(r.item(), 2.f);
}

// From the second step on SGD updates f32 parameters on the CPU in one pass over memory (sgd_update_on_host): the
// same bits as the eager ops it replaces (the first step's path), for every combination of its options.
TEST(SGD, OnePassUpdateEqualsTheEagerOps) {
  const std::vector<SGDOptions> cases = {
      {0.05, 0.9, 0, 0, false}, {0.05, 0.9, 0, 1e-3, false}, {0.05, 0.9, 0.3, 1e-3, false}, {0.05, 0.8, 0, 1e-2, true}};
  for (const auto& o : cases) {
    eager::manual_seed(21);
    Tensor p = eager::randn({1001}).requires_grad_(true);
    Tensor ref = p.detach() * 1.f, buf;
    SGD opt({p}, o);
    for (int step = 0; step < 4; ++step) {
      eager::NoGradGuard ng;
      const Tensor g = eager::randn({1001});
      p.set_grad(g);
      opt.step();
      // The eager ops of SGD::step, one by one.
      Tensor gg = o.weight_decay != 0 ? g + ref * static_cast<float>(o.weight_decay) : g;
      if (step == 0) buf = gg * 1.f;
      else {
        buf = buf * static_cast<float>(o.momentum);
        buf = o.dampening == 0 ? buf + gg : buf + gg * static_cast<float>(1 - o.dampening);
      }
      gg = o.nesterov ? gg + buf * static_cast<float>(o.momentum) : buf;
      ref = ref - gg * static_cast<float>(o.lr);
      ASSERT_EQ(p.to_vector<float>(), ref.to_vector<float>())
          << "step " << step << ", momentum " << o.momentum << ", dampening " << o.dampening << ", weight decay "
          << o.weight_decay << ", nesterov " << o.nesterov;
    }
  }
}

// On a device with a Momentum kernel (the CUDA plugin), SGD::step updates a group's parameters with one
// ai.onnx.preview.training Momentum call: alpha = momentum, beta = 1 - dampening, norm_coefficient = weight decay,
// T = 1. That mapping gives the eager ops' values: checked here on the reference kernel (f64 math, so within an ulp
// or two of the f32 ops), two tensors in one call, every option combination.
TEST(SGD, TheDeviceUpdatesMomentumCallEqualsTheEagerOps) {
  const std::vector<SGDOptions> cases = {
      {0.05, 0.9, 0, 0, false}, {0.05, 0.9, 0, 1e-3, false}, {0.05, 0.9, 0.3, 1e-3, false}, {0.05, 0.8, 0, 1e-2, true}};
  for (const auto& o : cases) {
    eager::manual_seed(5);
    eager::NoGradGuard ng;
    std::vector<Tensor> x = {eager::randn({300}), eager::randn({7, 3})};
    std::vector<Tensor> g = {eager::randn({300}), eager::randn({7, 3})};
    std::vector<Tensor> v = {eager::randn({300}), eager::randn({7, 3})};
    std::vector<Tensor> in = {eager::full({}, static_cast<float>(o.lr)),
                              eager::from_vector(std::vector<int64_t>{1}, {})};
    for (auto* group : {&x, &g, &v}) in.insert(in.end(), group->begin(), group->end());
    auto out = eager::call_op("ai.onnx.preview.training", "Momentum", in,
                              {{"alpha", Attribute::of_float(static_cast<float>(o.momentum))},
                               {"beta", Attribute::of_float(static_cast<float>(1 - o.dampening))},
                               {"norm_coefficient", Attribute::of_float(static_cast<float>(o.weight_decay))},
                               {"mode", Attribute::of_string(o.nesterov ? "nesterov" : "standard")}},
                              4);
    for (size_t i = 0; i < 2; ++i) {
      Tensor gg = o.weight_decay != 0 ? g[i] + x[i] * static_cast<float>(o.weight_decay) : g[i];
      Tensor buf = v[i] * static_cast<float>(o.momentum);
      buf = o.dampening == 0 ? buf + gg : buf + gg * static_cast<float>(1 - o.dampening);
      gg = o.nesterov ? gg + buf * static_cast<float>(o.momentum) : buf;
      const Tensor ref = x[i] - gg * static_cast<float>(o.lr);
      const auto a = out[i].to_vector<float>(), b = ref.to_vector<float>();
      const auto va = out[2 + i].to_vector<float>(), vb = buf.to_vector<float>();
      for (size_t k = 0; k < a.size(); ++k) {
        ASSERT_NEAR(a[k], b[k], 1e-6f * (1 + std::fabs(b[k]))) << "tensor " << i << " element " << k;
        ASSERT_NEAR(va[k], vb[k], 1e-6f * (1 + std::fabs(vb[k]))) << "momentum of tensor " << i << " element " << k;
      }
    }
  }
}

// On a device with an AdamStep kernel (the CUDA plugin), Adam::step updates parameters of one step count with one
// keel.AdamStep call taking the step's nine scalars. Its reference kernel gives the eager ops' bits (the same f32
// operations in the same order): Adam and AdamW, with and without weight decay, the first and a later step, two
// tensors in one call.
TEST(Adam, TheDeviceUpdatesAdamStepCallEqualsTheEagerOps) {
  struct C {
    double wd;
    bool decoupled;
    int64_t t;
  };
  for (const C& c : {C{0, false, 1}, C{1e-2, false, 3}, C{1e-2, true, 1}, C{5e-3, true, 7}}) {
    eager::manual_seed(9);
    eager::NoGradGuard ng;
    const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    std::vector<Tensor> p = {eager::randn({257}), eager::randn({4, 6})};
    std::vector<Tensor> g = {eager::randn({257}), eager::randn({4, 6})};
    std::vector<Tensor> m = {eager::randn({257}) * 0.1f, eager::randn({4, 6}) * 0.1f};
    // Second moments are non-negative: squares.
    Tensor r0 = eager::randn({257}), r1 = eager::randn({4, 6});
    std::vector<Tensor> v = {r0 * r0 * 0.01f, r1 * r1 * 0.01f};
    const double bc1 = 1 - std::pow(b1, static_cast<double>(c.t)), bc2 = 1 - std::pow(b2, static_cast<double>(c.t));
    const std::vector<float> sc = {c.decoupled && c.wd != 0 ? static_cast<float>(1 - lr * c.wd) : 1.f,
                                   !c.decoupled ? static_cast<float>(c.wd) : 0.f,
                                   static_cast<float>(b1),
                                   1 - static_cast<float>(b1),
                                   static_cast<float>(b2),
                                   1 - static_cast<float>(b2),
                                   static_cast<float>(std::sqrt(bc2)),
                                   static_cast<float>(eps),
                                   static_cast<float>(lr / bc1)};
    std::vector<Tensor> in = {eager::from_vector(sc, {9})};
    for (auto* group : {&p, &g, &m, &v}) in.insert(in.end(), group->begin(), group->end());
    auto out = eager::call_op("keel", "AdamStep", in, {}, 6);
    for (size_t i = 0; i < 2; ++i) {
      // Adam::step's eager ops, one by one.
      Tensor pp = p[i] * 1.f, gg = g[i];
      if (c.wd != 0) {
        if (c.decoupled) pp = pp * static_cast<float>(1 - lr * c.wd);
        else gg = gg + pp * static_cast<float>(c.wd);
      }
      Tensor mm = m[i] * static_cast<float>(b1) + gg * (1 - static_cast<float>(b1));
      Tensor vv = v[i] * static_cast<float>(b2) + (gg * gg) * (1 - static_cast<float>(b2));
      Tensor denom = eager::sqrt(vv) / static_cast<float>(std::sqrt(bc2)) + static_cast<float>(eps);
      pp = pp - (mm / denom) * static_cast<float>(lr / bc1);
      EXPECT_EQ(out[i].to_vector<float>(), pp.to_vector<float>()) << "parameter " << i << ", case t=" << c.t;
      EXPECT_EQ(out[2 + i].to_vector<float>(), mm.to_vector<float>()) << "first moment " << i;
      EXPECT_EQ(out[4 + i].to_vector<float>(), vv.to_vector<float>()) << "second moment " << i;
    }
  }
}

// A gradient that shares the parameter's memory (a detached view of it) is updated by the eager ops, not the one-pass
// loop (which assumes separate memory): the result is the eager ops' as if the gradient were a copy.
TEST(SGD, GradientSharingTheParametersMemoryStillStepsRight) {
  eager::manual_seed(5);
  Tensor p = eager::randn({257}).requires_grad_(true);
  SGD opt({p}, {0.1, 0.9, 0, 0, false});
  Tensor ref = p.detach() * 1.f, buf;
  for (int step = 0; step < 3; ++step) {
    eager::NoGradGuard ng;
    p.set_grad(p.detach());  // g aliases p
    const Tensor g = ref * 1.f;
    buf = step == 0 ? g * 1.f : buf * 0.9f + g;
    ref = ref - buf * 0.1f;
    opt.step();
    ASSERT_EQ(p.to_vector<float>(), ref.to_vector<float>()) << "step " << step;
  }
}

// Adam and AdamW update f32 parameters on the CPU in one pass over memory (adam_update_on_host): the same bits as the
// eager ops that other devices and dtypes run, every step including the first, with and without weight decay; the
// moments in the state are the eager ones too.
TEST(Adam, OnePassUpdateEqualsTheEagerOps) {
  struct Case {
    bool decoupled;
    double lr, wd, eps;
  };
  for (const Case& c : {Case{false, 1e-3, 0, 1e-8}, Case{false, 3e-3, 1e-2, 1e-8}, Case{true, 1e-3, 1e-2, 1e-8},
                        Case{true, 0.2, 0.5, 1e-3}}) {
    eager::manual_seed(33);
    Tensor p = eager::randn({1001}).requires_grad_(true);
    Tensor ref = p.detach() * 1.f;
    Tensor m = eager::zeros({1001}), v = eager::zeros({1001});
    AdamOptions o;
    o.lr = c.lr;
    o.weight_decay = c.wd;
    o.eps = c.eps;
    Adam opt({p}, o, c.decoupled);
    const auto b1 = static_cast<float>(o.beta1), b2 = static_cast<float>(o.beta2);
    for (int t = 1; t <= 5; ++t) {
      eager::NoGradGuard ng;
      Tensor g = eager::randn({1001}) * (t == 3 ? 0.f : 1.f);  // a zero gradient once
      p.set_grad(g);
      opt.step();
      // The eager ops of Adam::step, one by one.
      if (c.wd != 0) {
        if (c.decoupled) ref = ref * static_cast<float>(1 - c.lr * c.wd);
        else g = g + ref * static_cast<float>(c.wd);
      }
      m = m * b1 + g * (1 - b1);
      v = v * b2 + (g * g) * (1 - b2);
      const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(t));
      const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(t));
      Tensor denom = eager::sqrt(v) / static_cast<float>(std::sqrt(bc2)) + static_cast<float>(c.eps);
      ref = ref - (m / denom) * static_cast<float>(c.lr / bc1);
      ASSERT_EQ(p.to_vector<float>(), ref.to_vector<float>())
          << "step " << t << ", decoupled " << c.decoupled << ", lr " << c.lr << ", weight decay " << c.wd;
      const State st = opt.state_dict();
      ASSERT_NE(st.tensor("0.exp_avg"), nullptr);
      ASSERT_NE(st.tensor("0.exp_avg_sq"), nullptr);
      ASSERT_EQ(st.tensor("0.exp_avg")->to_vector<float>(), m.to_vector<float>()) << "step " << t;
      ASSERT_EQ(st.tensor("0.exp_avg_sq")->to_vector<float>(), v.to_vector<float>()) << "step " << t;
    }
  }
}

// A gradient that shares the parameter's memory takes the eager ops, with the same result as a separate copy.
TEST(Adam, GradientSharingTheParametersMemoryStillStepsRight) {
  eager::manual_seed(6);
  Tensor p = eager::randn({129}).requires_grad_(true), q = p.detach() * 1.f;
  q.requires_grad_(true);
  AdamOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  Adam a({p}, o), b({q}, o);
  for (int t = 0; t < 3; ++t) {
    eager::NoGradGuard ng;
    p.set_grad(p.detach());        // aliases p
    q.set_grad(q.detach() * 1.f);  // a copy
    a.step();
    b.step();
    ASSERT_EQ(p.to_vector<float>(), q.to_vector<float>()) << "step " << t;
  }
}

// PyTorch's Adam/AdamW in double precision, the oracle for the eager implementation.
std::vector<double> adam_reference(bool decoupled, double lr, double wd, const std::vector<std::vector<double>>& grads,
                                   double p0) {
  double p = p0, m = 0, v = 0;
  std::vector<double> out;
  for (size_t t = 1; t <= grads.size(); ++t) {
    double g = grads[t - 1][0];
    if (decoupled) p *= 1 - lr * wd;
    else g += wd * p;
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    const double bc1 = 1 - std::pow(0.9, static_cast<double>(t)), bc2 = 1 - std::pow(0.999, static_cast<double>(t));
    p -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + 1e-8);
    out.push_back(p);
  }
  return out;
}

TEST(Adam, MatchesPyTorchsUpdateRule) {
  const std::vector<std::vector<double>> grads = {{0.5}, {-0.2}, {0.05}, {1.5}, {0.3}};
  for (bool decoupled : {false, true}) {
    Tensor p = param({1.f});
    AdamOptions o;
    o.lr = 0.1;
    o.weight_decay = 0.1;
    Adam opt({p}, o, decoupled);
    EXPECT_EQ(opt.name(), decoupled ? "AdamW" : "Adam");
    auto ref = adam_reference(decoupled, 0.1, 0.1, grads, 1.0);
    for (size_t i = 0; i < grads.size(); ++i) {
      set_grad(p, {static_cast<float>(grads[i][0])});
      opt.step();
      EXPECT_NEAR(p.item(), ref[i], 1e-5) << (decoupled ? "AdamW" : "Adam") << " step " << i + 1;
    }
  }
  // Without weight decay, a constant gradient moves the parameter by lr per step: 1 → 0.9 → 0.8.
  Tensor q = param({1.f});
  AdamOptions o;
  o.lr = 0.1;
  Adam opt({q}, o);
  set_grad(q, {0.5f});
  opt.step();
  EXPECT_NEAR(q.item(), 0.9f, 1e-5);
  set_grad(q, {0.5f});
  opt.step();
  EXPECT_NEAR(q.item(), 0.8f, 1e-5);
  EXPECT_EQ(AdamW::defaults().weight_decay, 0.01);
}

TEST(Optimizer, StateDictRoundTripContinuesIdentically) {
  Tensor a = param({1.f, 2.f}), b = param({1.f, 2.f});
  SGD oa({a}, SGDOptions{0.1, 0.9});
  set_grad(a, {0.3f, -0.1f});
  oa.step();
  State s = oa.state_dict();
  EXPECT_EQ(s.values["type"], "SGD");
  ASSERT_NE(s.tensor("0.momentum_buffer"), nullptr);
  b.copy_(a);
  SGD ob({b}, SGDOptions{0.5, 0.9});
  ASSERT_TRUE(ob.load_state_dict(s).is_ok());
  EXPECT_EQ(ob.lr(), 0.1);
  set_grad(a, {0.2f, 0.2f});
  set_grad(b, {0.2f, 0.2f});
  oa.step();
  ob.step();
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  Adam adam({param({1.f, 2.f})}, AdamOptions{});
  auto st = adam.load_state_dict(s);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("'SGD', this is Adam"), std::string::npos);
  SGD wrong({param({1.f, 2.f, 3.f})}, SGDOptions{0.1, 0.9});
  EXPECT_FALSE(wrong.load_state_dict(s).is_ok());
}

TEST(Schedulers, FollowPyTorchsClosedForms) {
  Tensor p = param({0.f});
  SGD opt({p}, SGDOptions{1.0});
  auto lrs = [&](LRScheduler& s, int n) {
    std::vector<double> out = {opt.lr()};
    for (int i = 0; i < n; ++i) s.step(), out.push_back(opt.lr());
    return out;
  };
  auto near = [](const std::vector<double>& a, const std::vector<double>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-9) << i;
  };
  StepLR step(opt, 2, 0.1);
  near(lrs(step, 4), {1, 1, 0.1, 0.1, 0.01});
  MultiStepLR multi(opt, {3, 1}, 0.5);
  near(lrs(multi, 4), {1, 0.5, 0.5, 0.25, 0.25});
  CosineAnnealingLR cos(opt, 4, 0.0);
  near(lrs(cos, 4), {1, 0.8535533905932737, 0.5, 0.14644660940672627, 0});
  LinearWarmupLR warm(opt, 4, 0.25);
  near(lrs(warm, 5), {0.25, 0.4375, 0.625, 0.8125, 1, 1});
  auto after = std::make_shared<StepLR>(opt, 1, 0.5);
  LinearWarmupLR chained(opt, 2, 0.5, 1.0, after);
  near(lrs(chained, 4), {0.5, 0.75, 1, 0.5, 0.25});
  // Restoring the step restores the rate.
  State s = chained.state_dict();
  step.step();
  ASSERT_TRUE(chained.load_state_dict(s).is_ok());
  EXPECT_NEAR(opt.lr(), 0.25, 1e-12);
}

TEST(ClipGradNorm, ScalesToTheMaxNormAndReportsTheTotal) {
  Tensor a = param({3.f}), b = param({4.f, 0.f});
  set_grad(a, {3.f});
  set_grad(b, {4.f, 0.f});
  EXPECT_NEAR(clip_grad_norm_({a, b}, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(a.grad().item(), 0.6f, 1e-6);
  EXPECT_NEAR(b.grad().to_vector<float>()[0], 0.8f, 1e-6);
  EXPECT_NEAR(clip_grad_norm_({a, b}, 10.0), 1.0, 1e-5);  // under the max: unchanged
  EXPECT_NEAR(a.grad().item(), 0.6f, 1e-6);
  set_grad(a, {std::numeric_limits<float>::infinity()});
  EXPECT_THROW(clip_grad_norm_({a, b}, 1.0, true), eager::Error);
}

TEST(GradScaler, SkipsNonFiniteStepsAndAdaptsTheScale) {
  Tensor p = param({1.f});
  SGD opt({p}, SGDOptions{0.1});
  GradScalerOptions o;
  o.init_scale = 4;
  o.growth_interval = 2;
  GradScaler scaler(o);
  EXPECT_EQ(scaler.scale(eager::full({}, 1.5f)).item(), 6.f);
  set_grad(p, {4.f});  // as if backward of a scaled loss: true gradient 1
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_NEAR(p.item(), 0.9f, 1e-6);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4);
  set_grad(p, {4.f});
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 8);  // two good steps in a row
  set_grad(p, {std::numeric_limits<float>::infinity()});
  EXPECT_FALSE(scaler.step(opt));
  EXPECT_NEAR(p.item(), 0.8f, 1e-6);  // skipped
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  set_grad(p, {std::nanf("")});
  scaler.unscale_(opt);
  EXPECT_TRUE(scaler.found_inf());
  EXPECT_THROW(scaler.unscale_(opt), eager::Error);
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 2);
  GradScaler restored;
  ASSERT_TRUE(restored.load_state_dict(scaler.state_dict()).is_ok());
  EXPECT_EQ(restored.get_scale(), 2);
  GradScalerOptions off;
  off.enabled = false;
  GradScaler disabled(off);
  auto l = eager::full({}, 1.5f);
  EXPECT_EQ(disabled.scale(l).item(), 1.5f);
}

// Several gradients (two parameter groups, one parameter without a gradient): one non-finite element anywhere skips
// the whole step and halves the scale; finite gradients of any size (a sum that would overflow fp32 included) step
// and unscale every gradient, and the scale grows after growth_interval good steps.
TEST(GradScaler, ChecksEveryGradientOfEveryGroupInOnePass) {
  Tensor a = param({1.f, 2.f, 3.f}), b = param({1.f}), c = param({1.f, 1.f}), d = param({5.f});
  ParamGroup g1, g2;
  g1.params = {a, b};
  g2.params = {c, d};
  SGD opt({g1, g2}, SGDOptions{0.5});
  GradScalerOptions o;
  o.init_scale = 8;
  o.growth_interval = 3;
  GradScaler scaler(o);
  const float inf = std::numeric_limits<float>::infinity();
  for (int bad = 0; bad < 3; ++bad) {  // the inf (or NaN) in the first, middle and last gradient checked
    set_grad(a, {8.f, bad == 0 ? inf : 8.f, 8.f});
    set_grad(b, {8.f});
    set_grad(c, {8.f, bad == 2 ? -inf : (bad == 1 ? std::nanf("") : 8.f)});
    const double before = scaler.get_scale();
    EXPECT_FALSE(scaler.step(opt)) << bad;
    EXPECT_TRUE(scaler.found_inf());
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), before / 2) << bad;
    EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1.f, 2.f, 3.f}));  // nothing stepped
    EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{1.f, 1.f}));
    EXPECT_EQ(d.item(), 5.f);
  }
  EXPECT_EQ(scaler.skipped_steps(), 3);
  EXPECT_EQ(scaler.get_scale(), 1);
  // Finite: unscaled in place, stepped; large finite values whose fp32 sum overflows are not mistaken for inf.
  for (int step = 0; step < 3; ++step) {
    const float s = static_cast<float>(scaler.get_scale());
    set_grad(a, {2.f * s, 2.e38f, 2.e38f});
    set_grad(b, {2.f * s});
    set_grad(c, {0.f, 2.f * s});
    d.zero_grad();
    scaler.unscale_(opt);
    EXPECT_FALSE(scaler.found_inf()) << step;
    EXPECT_FLOAT_EQ(b.grad().item(), 2.f) << step;
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
  }
  EXPECT_EQ(scaler.get_scale(), 2);  // grown once, after growth_interval = 3 good steps
  EXPECT_EQ(scaler.skipped_steps(), 3);
  EXPECT_FLOAT_EQ(b.item(), 1.f - 3 * 0.5f * 2.f);
  EXPECT_FLOAT_EQ(c.to_vector<float>()[1], 1.f - 3 * 0.5f * 2.f);
  EXPECT_EQ(d.item(), 5.f);  // no gradient: untouched
}

// f32 gradients in host memory are unscaled in place (a gradient tensor taken before sees the unscaled values, as with
// PyTorch's unscale_), in one pass each: no second copy of every gradient. Gradients that share memory (one tensor set
// as two parameters' .grad) are unscaled once, not twice.
TEST(GradScaler, UnscalesHostGradientsInPlaceAndSharedOnesOnce) {
  Tensor a = param({1.f, 2.f, 3.f}), b = param({1.f, 1.f}), c = param({4.f, 4.f});
  SGD opt({a, b, c}, SGDOptions{0.5});
  GradScalerOptions o;
  o.init_scale = 4;
  GradScaler scaler(o);
  set_grad(a, {4.f, 8.f, -12.f});
  const Tensor taken = a.grad();
  Tensor shared = eager::from_vector(std::vector<float>{8.f, 16.f}, {2});
  b.set_grad(shared);
  c.set_grad(shared);
  scaler.unscale_(opt);
  EXPECT_FALSE(scaler.found_inf());
  EXPECT_EQ(a.grad().data().raw_data(), taken.data().raw_data()) << "unscaled in place";
  EXPECT_EQ(taken.to_vector<float>(), (std::vector<float>{1.f, 2.f, -3.f}));
  EXPECT_EQ(b.grad().to_vector<float>(), (std::vector<float>{2.f, 4.f}));
  EXPECT_EQ(c.grad().to_vector<float>(), (std::vector<float>{2.f, 4.f}));
  scaler.update();
  // A non-finite result (a finite gradient that overflows once unscaled) is found in place too.
  GradScalerOptions small;
  small.init_scale = 0.5;
  GradScaler up(small);
  set_grad(a, {1.f, 3.e38f, 1.f});
  b.zero_grad();
  c.zero_grad();
  up.unscale_(opt);
  EXPECT_TRUE(up.found_inf());
}

// keel.CheckFiniteAndUnscale (what unscale_ calls on a device that has it): every gradient times inv_scale, rounded to
// its dtype as the eager Mul rounds it, in f32, f16 and bf16; found_inf is 1 exactly when an unscaled element is inf
// or NaN (a finite gradient that overflows once unscaled by an inv_scale above 1 included).
TEST(GradScaler, TheCheckFiniteAndUnscaleCallEqualsTheEagerOps) {
  eager::manual_seed(3);
  eager::NoGradGuard ng;
  const float inf = std::numeric_limits<float>::infinity();
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (float inv : {1.f / 65536, 0.3f, 4.f}) {
      std::vector<Tensor> g = {(eager::randn({257}) * (dt == DType::kF32 ? 1000.f : 10.f)).to(dt),
                               eager::randn({3, 5}).to(dt), eager::randn({64}).to(dt)};
      std::vector<Tensor> in = {eager::full({}, inv)};
      in.insert(in.end(), g.begin(), g.end());
      auto out = eager::call_op("keel", "CheckFiniteAndUnscale", in, {}, 4);
      EXPECT_EQ(out[0].item(), 0.f) << inv;
      for (size_t i = 0; i < g.size(); ++i) {
        EXPECT_EQ(out[i + 1].dtype(), dt);
        EXPECT_EQ(out[i + 1].shape(), g[i].shape());
        EXPECT_EQ(out[i + 1].to(DType::kF32).to_vector<float>(),
                  (g[i].to(DType::kF32) * inv).to(dt).to(DType::kF32).to_vector<float>())
            << "gradient " << i << ", inv_scale " << inv << ", dtype " << dtype_name(dt);
      }
    }
  // Non-finite in any gradient, or made by unscaling: found.
  for (int where = 0; where < 4; ++where) {
    std::vector<float> a = {1.f, 2.f, 3.f}, b = {1.f, 1.f};
    float inv = 0.5f;
    if (where == 0) a[1] = std::nanf("");
    if (where == 1) b[1] = -inf;
    if (where == 3) a[2] = 3.e38f, inv = 2.f;
    auto out = eager::call_op("keel", "CheckFiniteAndUnscale",
                              {eager::full({}, inv), eager::from_vector(a, {3}), eager::from_vector(b, {2})}, {}, 3);
    EXPECT_EQ(out[0].item(), where == 2 ? 0.f : 1.f) << "case " << where;
  }
}

}  // namespace
}  // namespace keel::train
