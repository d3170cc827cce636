// Deferred convolutions (core/runtime/eager_deferred.cc): conv2d, relu and max_pool2d called one after the other run
// as the fused ops, with the values and gradients of the separate ops; a deferred value read later, written under,
// read from several threads, made under other guards or by a bad call behaves as if it had been computed at its call.
// (A Tracer records the separate ops: EagerTest.Conv2dReluMaxPoolIsMaxPoolOfConv2dReluInOneKernel.)
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/runtime/eager.h"
#include "core/runtime/eager_internal.h"

namespace keel::eager {
namespace {

// The plugins' environment (the oneDNN CPU plugin where built), one kernel thread.
std::shared_ptr<Environment> plugins_env() {
  static std::shared_ptr<Environment> e = [] {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    auto env = Environment::create();
    EXPECT_TRUE(env.is_ok()) << env.status().to_string();
    return std::shared_ptr<Environment>(std::move(env).value());
  }();
  return e;
}

class DeferredConvTest : public ::testing::Test {
 protected:
  void SetUp() override { init(plugins_env(), 1); }
};

// t computed now (its data read): what follows it runs apart.
Tensor now(Tensor t) {
  (void)t.data();
  return t;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                 double tol = 1e-4) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " element " << i;
}

// The profile's op lines ("Op kernel calls ms") that start with `op` followed by a space.
bool ran(const std::string& report, const std::string& op) {
  std::istringstream lines(report);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(op + " ", 0) == 0) return true;
  return false;
}

struct Layer {
  Tensor x, w, b;
};
Layer layer(uint64_t seed, int64_t in = 3, int64_t out = 8, int64_t side = 12) {
  manual_seed(seed);
  return {randn({4, in, side, side}).requires_grad_(), randn({out, in, 3, 3}, 0.3f).requires_grad_(),
          randn({out}, 0.1f).requires_grad_()};
}

TEST_F(DeferredConvTest, SeparateCallsRunAsTheFusedOpsWithTheSameValuesAndGradients) {
  Layer l = layer(1);
  const std::array<int64_t, 2> pad{1, 1};
  struct Form {
    std::string what;
    std::function<Tensor(bool apart)> f;
    std::vector<std::string> fused_ops, absent_ops;
  };
  const std::vector<Form> forms = {
      {"max_pool2d(relu(conv2d))",
       [&](bool apart) {
         if (apart) return max_pool2d(now(relu(now(conv2d(l.x, l.w, l.b, {1, 1}, pad)))), {2, 2});
         return max_pool2d(relu(conv2d(l.x, l.w, l.b, {1, 1}, pad)), {2, 2});
       },
       {"keel.FusedConvMaxPool", "keel.FusedConvMaxPoolGrad"},
       {"Conv", "Relu", "MaxPool", "keel.ReluGrad", "keel.MaxPoolGrad"}},
      {"relu(conv2d)",
       [&](bool apart) {
         if (apart) return relu(now(conv2d(l.x, l.w, l.b, {1, 1}, pad)));
         return relu(conv2d(l.x, l.w, l.b, {1, 1}, pad));
       },
       {"keel.FusedConv"},
       {"Conv", "Relu"}},
      // A pooling the fused op does not take (overlapping windows): the convolution and its Relu fused, then MaxPool.
      {"max_pool2d 3x3 stride 2 of relu(conv2d)",
       [&](bool apart) {
         if (apart) return max_pool2d(now(relu(now(conv2d(l.x, l.w, l.b)))), {3, 3}, {2, 2});
         return max_pool2d(relu(conv2d(l.x, l.w, l.b)), {3, 3}, {2, 2});
       },
       {"keel.FusedConv", "MaxPool"},
       {"Conv", "Relu"}},
  };
  for (const Form& form : forms) {
    auto run = [&](bool apart, std::string* report) {
      for (Tensor* t : {&l.x, &l.w, &l.b}) t->zero_grad();
      set_profiling(true);
      (void)profile_report();  // clears the counters
      Tensor y = form.f(apart);
      sum(y * y).backward();
      *report = profile_report();
      set_profiling(false);
      return std::vector<std::vector<float>>{y.to_vector<float>(), l.x.grad().to_vector<float>(),
                                             l.w.grad().to_vector<float>(), l.b.grad().to_vector<float>()};
    };
    std::string fused_report, apart_report;
    const auto apart = run(true, &apart_report);
    const auto fused = run(false, &fused_report);
    const char* names[] = {"y", "dx", "dw", "db"};
    for (size_t k = 0; k < apart.size(); ++k) expect_near(fused[k], apart[k], form.what + " " + names[k]);
    for (const auto& op : form.fused_ops)
      EXPECT_TRUE(ran(fused_report, op)) << form.what << ": " << op << " did not run\n" << fused_report;
    for (const auto& op : form.absent_ops)
      EXPECT_FALSE(ran(fused_report, op)) << form.what << ": " << op << " ran\n" << fused_report;
    EXPECT_TRUE(ran(apart_report, "Conv")) << apart_report;
  }
}

TEST_F(DeferredConvTest, AnIntermediateReadLaterHoldsItsOwnValueAndGradient) {
  Layer l = layer(2);
  Tensor want_c = now(conv2d(l.x, l.w, l.b));
  sum(want_c).backward();
  const auto want_dw = l.w.grad().to_vector<float>();
  l.w.zero_grad();
  // Kept while the fused form is taken over it, then read: computed on its own.
  Tensor c = conv2d(l.x, l.w, l.b);
  Tensor r = relu(c);
  Tensor p = max_pool2d(r, {2, 2});
  EXPECT_EQ(c.shape(), (Shape{4, 8, 10, 10}));
  EXPECT_EQ(c.dtype(), DType::kF32);
  EXPECT_EQ(c.device(), "cpu");
  EXPECT_TRUE(c.requires_grad());
  EXPECT_FALSE(c.is_leaf());
  expect_near(c.to_vector<float>(), want_c.to_vector<float>(), "conv");
  std::vector<float> want_r = want_c.to_vector<float>();
  for (float& v : want_r) v = std::max(v, 0.f);
  expect_near(r.to_vector<float>(), want_r, "relu");
  sum(c).backward();
  expect_near(l.w.grad().to_vector<float>(), want_dw, "dw through the kept convolution");
  EXPECT_EQ(p.shape(), (Shape{4, 8, 5, 5}));
  // Its convolution read first, a relu over it (and a pooling over that) reads it: no second convolution.
  set_profiling(true);
  (void)profile_report();
  Tensor c2 = conv2d(l.x, l.w, l.b);
  Tensor r2 = relu(c2);
  expect_near(c2.to_vector<float>(), want_c.to_vector<float>(), "conv read first");
  Tensor p2 = max_pool2d(r2, {2, 2});
  expect_near(r2.to_vector<float>(), want_r, "relu of it");
  const std::string report = profile_report();
  set_profiling(false);
  EXPECT_TRUE(ran(report, "Conv") && ran(report, "Relu") && ran(report, "MaxPool")) << report;
  EXPECT_FALSE(ran(report, "keel.FusedConv") || ran(report, "keel.FusedConvMaxPool")) << report;
}

TEST_F(DeferredConvTest, WritesIntoItsInputsComeAfterIt) {
  Layer l = layer(3);
  const auto want = now(conv2d(l.x, l.w, l.b)).to_vector<float>();
  {
    Tensor c = conv2d(l.x, l.w, l.b);
    Tensor w2 = l.w.detach() * 2.f;
    l.w.copy_(w2);  // copy_ into the weights the deferred convolution reads
    expect_near(c.to_vector<float>(), want, "after copy_ into w");
    l.w.copy_(w2 * 0.5f);
  }
  {
    Tensor c = conv2d(l.x, l.w, l.b);
    Tensor x2 = zeros(l.x.shape());
    l.x.set_data_(x2);  // another storage for x
    expect_near(c.to_vector<float>(), want, "after set_data_ of x");
  }
  {
    // A write into a view of the weights' storage (detach() shares it) counts too.
    Tensor x = randn({2, 3, 8, 8});
    Tensor w = randn({4, 3, 3, 3});
    const auto want2 = now(conv2d(x, w, Tensor())).to_vector<float>();
    Tensor c = conv2d(x, w, Tensor());
    Tensor view = w.detach();
    view.copy_(zeros(w.shape()));
    expect_near(c.to_vector<float>(), want2, "after copy_ into a tensor sharing w's storage");
  }
  {
    // compute_deferred(w) before a write through data(); a deferred value that does not read w stays deferred, and
    // compute_deferred() computes every one.
    Tensor x = randn({2, 3, 8, 8});
    Tensor w = randn({4, 3, 3, 3}), other = randn({4, 3, 3, 3});
    const auto want3 = now(conv2d(x, w, Tensor())).to_vector<float>();
    const auto want_other = now(conv2d(x, other, Tensor())).to_vector<float>();
    Tensor c = conv2d(x, w, Tensor()), d = conv2d(x, other, Tensor());
    compute_deferred(w);
    EXPECT_FALSE(c.impl()->pending.load());
    EXPECT_TRUE(d.impl()->pending.load());
    std::fill_n(w.data().data<float>(), w.numel(), 0.f);
    expect_near(c.to_vector<float>(), want3, "after compute_deferred(w) and a raw write");
    compute_deferred();
    EXPECT_FALSE(d.impl()->pending.load());
    std::fill_n(other.data().data<float>(), other.numel(), 0.f);
    expect_near(d.to_vector<float>(), want_other, "after compute_deferred() and a raw write");
  }
}

TEST_F(DeferredConvTest, TheGuardsOfTheCallHold) {
  Layer l = layer(4);
  Tensor c;
  {
    NoGradGuard ng;
    c = conv2d(l.x, l.w, l.b);
  }
  EXPECT_FALSE(c.requires_grad());
  Tensor r = relu(c);  // outside the guard: not folded into the no-grad call, and no history either way
  EXPECT_FALSE(r.requires_grad());
  std::vector<float> want = now(conv2d(l.x, l.w, l.b)).to_vector<float>();
  for (float& v : want) v = std::max(v, 0.f);
  expect_near(r.to_vector<float>(), want, "relu of a no-grad convolution");
  EXPECT_TRUE(c.is_leaf());
  // Under autocast the deferred value has autocast's dtype, as the separate ops give it.
  Layer m = layer(5, 16, 16);
  for (DType low : {DType::kBF16}) {
    std::vector<float> apart, fused;
    DType apart_dt, fused_dt;
    {
      AutocastGuard ac(low);
      Tensor c2 = conv2d(m.x, m.w, m.b);
      EXPECT_EQ(c2.dtype(), now(conv2d(m.x, m.w, m.b)).dtype());
      Tensor a = max_pool2d(now(relu(now(conv2d(m.x, m.w, m.b)))), {2, 2});
      Tensor f = max_pool2d(relu(conv2d(m.x, m.w, m.b)), {2, 2});
      apart_dt = a.dtype(), fused_dt = f.dtype();
      apart = a.to(DType::kF32).to_vector<float>();
      fused = f.to(DType::kF32).to_vector<float>();
    }
    EXPECT_EQ(fused_dt, apart_dt);
    expect_near(fused, apart, "autocast", 2e-2);
  }
}

TEST_F(DeferredConvTest, ThreadsReadingOneDeferredValueSeeTheSameOne) {
  Layer l = layer(6);
  const auto want = now(conv2d(l.x, l.w, l.b)).to_vector<float>();
  for (int round = 0; round < 10; ++round) {
    Tensor c = relu(conv2d(l.x, l.w, l.b));
    std::vector<std::vector<float>> got(4);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < got.size(); ++t) threads.emplace_back([&, t] { got[t] = c.to_vector<float>(); });
    for (auto& th : threads) th.join();
    std::vector<float> want_r = want;
    for (float& v : want_r) v = std::max(v, 0.f);
    for (const auto& g : got) expect_near(g, want_r, "thread's read");
  }
}

TEST_F(DeferredConvTest, ABadCallFailsWhereItIsMade) {
  Tensor x = randn({1, 3, 5, 5}), w = randn({4, 2, 3, 3});
  EXPECT_THROW((void)conv2d(x, w, Tensor()), Error);
  Tensor w2 = randn({4, 3, 7, 7});  // a window larger than the padded input
  EXPECT_THROW((void)conv2d(x, w2, Tensor()), Error);
  Tensor b = randn({3});  // a bias of the wrong length
  EXPECT_THROW((void)conv2d(x, randn({4, 3, 3, 3}), b), Error);
}

}  // namespace
}  // namespace keel::eager
