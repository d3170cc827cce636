// Eager tensors: dispatch, autograd (finite-difference gradient checks in f64 for every differentiable op of the
// training API), no_grad, accumulation, errors, autocast, tracing to a graph that a Session runs.
#include "core/runtime/eager.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>

#include "core/runtime/eager_internal.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"

namespace keel::eager {
namespace {

std::shared_ptr<Environment>& reference_env() {
  static std::shared_ptr<Environment> e = [] {
    EnvironmentOptions o;
    o.discover_plugins = false;  // the reference device: the oracle, with f64 kernels
    o.threads = 2;
    return std::shared_ptr<Environment>(Environment::create(o).value());
  }();
  return e;
}

class EagerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { init(reference_env()); }
};

Tensor rnd(const Shape& s, double lo = -1, double hi = 1, bool grad = true) {
  Tensor t = rand_uniform(s, static_cast<float>(lo), static_cast<float>(hi), DType::kF64);
  if (grad) t.requires_grad_();
  return t;
}

double to_double(const Tensor& t) { return t.to(DType::kF64).to_vector<double>()[0]; }

// t computed now (its data read): the ops after it run apart instead of joining a deferred convolution
// (eager_deferred.cc), for the comparisons of the fused ops with the separate ones.
Tensor now(Tensor t) {
  (void)t.data();
  return t;
}

// Checks d(sum(f(inputs) * W))/d(inputs) against central differences (W fixed random weights, so every output
// element matters). Inputs are f64 leaves; `h` the step.
void gradcheck(const std::string& what, const std::function<Tensor(const std::vector<Tensor>&)>& f,
               std::vector<Tensor> inputs, double tol = 1e-6, double h = 1e-6) {
  manual_seed(99);
  Tensor y0 = f(inputs);
  Tensor w = rand_uniform(y0.shape(), 0.5f, 1.5f, DType::kF64);
  auto loss_of = [&](const std::vector<Tensor>& in) {
    manual_seed(7);  // ops that draw from the generator (dropout) see the same draws every time
    return sum(f(in) * w);
  };
  for (auto& t : inputs)
    if (t.requires_grad()) t.zero_grad();
  loss_of(inputs).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    ASSERT_TRUE(inputs[i].grad().defined()) << what << ": no gradient for input " << i;
    auto analytic = inputs[i].grad().to_vector<double>();
    auto base = inputs[i].to_vector<double>();
    ASSERT_EQ(analytic.size(), base.size());
    for (size_t j = 0; j < base.size(); ++j) {
      auto probe = [&](double delta) {
        auto v = base;
        v[j] += delta;
        std::vector<Tensor> in = inputs;
        keel::Tensor d = keel::Tensor::from_vector(DType::kF64, inputs[i].shape(), v);
        in[i] = Tensor(d, false);
        NoGradGuard ng;
        return to_double(loss_of(in));
      };
      double numeric = (probe(h) - probe(-h)) / (2 * h);
      double scale = std::max({1.0, std::abs(numeric), std::abs(analytic[j])});
      ASSERT_NEAR(analytic[j], numeric, tol * scale * 10 + 1e-7)
          << what << ": input " << i << " element " << j << " of " << shape_to_string(inputs[i].shape());
    }
  }
}

using V = std::vector<Tensor>;

TEST_F(EagerTest, ArithmeticWithBroadcasting) {
  gradcheck("add", [](const V& v) { return v[0] + v[1]; }, {rnd({2, 3}), rnd({3})});
  gradcheck("sub", [](const V& v) { return v[0] - v[1]; }, {rnd({2, 1, 3}), rnd({4, 1})});
  gradcheck("mul", [](const V& v) { return v[0] * v[1]; }, {rnd({2, 3}), rnd({2, 1})});
  gradcheck("div", [](const V& v) { return v[0] / v[1]; }, {rnd({2, 3}), rnd({3}, 1, 2)});
  gradcheck("scalars", [](const V& v) { return (2.f - v[0] * 3.f) / 4.f + 1.f; }, {rnd({5})});
  gradcheck("neg", [](const V& v) { return -v[0]; }, {rnd({4})});
}

// full / zeros / ones: every element holds the value converted to the dtype (one conversion, its bytes repeated);
// zeros are +0 (all-zero bits), -0.0 keeps its sign, every dtype the factories take.
TEST_F(EagerTest, FactoriesFillEveryElementInEveryDtype) {
  const Shape shape{3, 1000};
  EXPECT_EQ(full(shape, 1.5f).to_vector<float>(), std::vector<float>(3000, 1.5f));
  EXPECT_EQ(full(shape, 1.5f, DType::kF64).to_vector<double>(), std::vector<double>(3000, 1.5));
  EXPECT_EQ(full(shape, -7.f, DType::kI64).to_vector<int64_t>(), std::vector<int64_t>(3000, -7));
  EXPECT_EQ(full(shape, 9.f, DType::kI32).to_vector<int32_t>(), std::vector<int32_t>(3000, 9));
  EXPECT_EQ(full(shape, 3.f, DType::kU8).to_vector<uint8_t>(), std::vector<uint8_t>(3000, 3));
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const keel::Tensor h = full(shape, 0.1f, dt).data();
    const uint16_t want = dt == DType::kF16 ? f32_to_f16(0.1f) : f32_to_bf16(0.1f);
    for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(h.data<uint16_t>()[i], want) << dtype_name(dt) << " " << i;
  }
  const auto z = zeros(shape).to_vector<float>();
  for (float v : z) ASSERT_TRUE(v == 0.f && !std::signbit(v));
  for (float v : full(shape, -0.f).to_vector<float>()) ASSERT_TRUE(v == 0.f && std::signbit(v));
  EXPECT_EQ(ones({0, 4}).numel(), 0);
  EXPECT_THROW(full(shape, 1.f, DType::kString), Error);
}

TEST_F(EagerTest, UnaryOps) {
  gradcheck("relu", [](const V& v) { return relu(v[0]); }, {rnd({3, 4})});
  gradcheck("sigmoid", [](const V& v) { return sigmoid(v[0]); }, {rnd({3, 4})});
  gradcheck("tanh", [](const V& v) { return tanh(v[0]); }, {rnd({3, 4})});
  gradcheck("gelu", [](const V& v) { return gelu(v[0]); }, {rnd({3, 4}, -3, 3)});
  // keel.Gelu's tanh approximation (what fuse_gelu makes of GPT-2's gelu_new): its GeluGrad carries the attribute.
  gradcheck("gelu tanh",
            [](const V& v) {
              return detail::apply1("Gelu", {v[0]}, {{"approximate", Attribute::of_string("tanh")}}, "keel");
            },
            {rnd({3, 4}, -3, 3)});
  gradcheck("leaky_relu", [](const V& v) { return leaky_relu(v[0], 0.2f); }, {rnd({3, 4})});
  gradcheck("exp", [](const V& v) { return exp(v[0]); }, {rnd({6})});
  gradcheck("log", [](const V& v) { return log(v[0]); }, {rnd({6}, 0.5, 2)});
  gradcheck("sqrt", [](const V& v) { return sqrt(v[0]); }, {rnd({6}, 0.5, 2)});
  gradcheck("abs", [](const V& v) { return abs(v[0]); }, {rnd({6})});
  gradcheck("pow", [](const V& v) { return pow(v[0], 3.f); }, {rnd({6})});
  gradcheck("clamp", [](const V& v) { return clamp(v[0], -0.5f, 0.5f); }, {rnd({8})});
  gradcheck("softmax", [](const V& v) { return softmax(v[0], 1); }, {rnd({2, 5})});
  gradcheck("log_softmax", [](const V& v) { return log_softmax(v[0], -1); }, {rnd({2, 5})});
}

TEST_F(EagerTest, LinearAlgebra) {
  gradcheck("matmul", [](const V& v) { return matmul(v[0], v[1]); }, {rnd({3, 4}), rnd({4, 2})});
  gradcheck("batched matmul", [](const V& v) { return matmul(v[0], v[1]); }, {rnd({2, 3, 4}), rnd({4, 2})});
  gradcheck("linear", [](const V& v) { return linear(v[0], v[1], v[2]); }, {rnd({3, 4}), rnd({5, 4}), rnd({5})});
  gradcheck("linear 3-D", [](const V& v) { return linear(v[0], v[1], v[2]); }, {rnd({2, 3, 4}), rnd({5, 4}), rnd({5})});
  gradcheck("linear no bias", [](const V& v) { return linear(v[0], v[1], Tensor()); }, {rnd({3, 4}), rnd({5, 4})});
}

TEST_F(EagerTest, Convolution) {
  gradcheck("conv2d", [](const V& v) { return conv2d(v[0], v[1], v[2]); },
            {rnd({2, 2, 5, 5}), rnd({3, 2, 3, 3}), rnd({3})});
  gradcheck("conv2d stride pad dilation",
            [](const V& v) {
              return conv2d(v[0], v[1], v[2], {2, 1}, {1, 2}, {1, 2});
            },
            {rnd({1, 2, 6, 7}), rnd({2, 2, 3, 2}), rnd({2})});
  gradcheck("conv2d groups",
            [](const V& v) {
              return conv2d(v[0], v[1], Tensor(), {1, 1}, {1, 1}, {1, 1}, 2);
            },
            {rnd({1, 4, 4, 4}), rnd({6, 2, 3, 3})});
  gradcheck("conv_transpose2d",
            [](const V& v) {
              return conv_transpose2d(v[0], v[1], v[2], {2, 2}, {1, 0}, {1, 0});
            },
            {rnd({1, 2, 3, 4}), rnd({2, 3, 3, 2}), rnd({3})});
  gradcheck("conv_transpose2d groups",
            [](const V& v) {
              return conv_transpose2d(v[0], v[1], Tensor(), {1, 1}, {0, 0}, {0, 0}, 2);
            },
            {rnd({1, 4, 3, 3}), rnd({4, 1, 2, 2})});
}

TEST_F(EagerTest, Pooling) {
  gradcheck("max_pool2d", [](const V& v) { return max_pool2d(v[0], {2, 2}); }, {rnd({2, 2, 4, 6})});
  gradcheck("max_pool2d stride pad",
            [](const V& v) {
              return max_pool2d(v[0], {3, 3}, {2, 2}, {1, 1});
            },
            {rnd({1, 2, 5, 5})});
  gradcheck("avg_pool2d", [](const V& v) { return avg_pool2d(v[0], {2, 2}); }, {rnd({2, 2, 4, 4})});
  gradcheck("avg_pool2d pad", [](const V& v) { return avg_pool2d(v[0], {3, 3}, {2, 2}, {1, 1}); }, {rnd({1, 2, 5, 5})});
  gradcheck("global_avg_pool2d", [](const V& v) { return global_avg_pool2d(v[0]); }, {rnd({2, 3, 3, 2})});
}

// A MaxPool over a Relu's output folds the Relu's backward into its own (run_backward): the gradients equal those
// of the same network with a Mul by one between the two (which keeps them apart), bit for bit, with windows that
// overlap, windows of zeros only (half the inputs are negative), and a Relu output that feeds two ops (not folded).
// The fold runs ReluGrad over the pooled tensor only.
TEST_F(EagerTest, ReluUnderMaxPoolFoldsItsBackward) {
  struct Case {
    std::string what;
    std::function<Tensor(const Tensor&)> pool;
  };
  const std::vector<Case> cases = {
      {"2x2",
       [](const Tensor& r) {
         return max_pool2d(r, {2, 2});
       }},
      {"3x3 stride 2 pad 1",
       [](const Tensor& r) {
         return max_pool2d(r, {3, 3}, {2, 2}, {1, 1});
       }},
  };
  for (const auto& c : cases) {
    for (bool two_consumers : {false, true}) {
      manual_seed(5);
      Tensor x = rnd({2, 3, 6, 6});
      Tensor w2 = rand_uniform({2, 3, 6, 6}, 0.5f, 1.5f, DType::kF64);
      auto grad_of = [&](bool keep_apart) {
        x.zero_grad();
        Tensor r = relu(x);
        Tensor p = c.pool(keep_apart ? r * 1.0f : r);
        Tensor w = rand_uniform(p.shape(), 0.5f, 1.5f, DType::kF64);
        Tensor loss = sum(p * w);
        if (two_consumers) loss = loss + sum(r * w2);
        loss.backward();
        return x.grad().to_vector<double>();
      };
      manual_seed(11);
      set_profiling(true);
      (void)profile_report();  // clears the counters
      const auto folded = grad_of(false);
      const std::string report = profile_report();
      set_profiling(false);
      manual_seed(11);
      const auto apart = grad_of(true);
      EXPECT_EQ(folded, apart) << c.what << (two_consumers ? ", two consumers" : "");
      size_t zeros = 0;
      for (double g : folded) zeros += g == 0.0;
      EXPECT_GT(zeros, folded.size() / 2) << "negative inputs and non-maxima get no gradient";
      // ReluGrad ran over the pooled shape when folded, over the Relu's own shape when its output fed two ops.
      bool ran = false, full = false;
      std::istringstream lines(report);
      for (std::string line; std::getline(lines, line);) {
        if (line.find("ReluGrad") == std::string::npos) continue;
        ran = true;
        full = full || line.find("[2, 3, 6, 6]") != std::string::npos;
      }
      EXPECT_TRUE(ran) << report;
      EXPECT_EQ(full, two_consumers) << c.what << "\n" << report;
    }
  }
}

// conv2d_relu is relu(conv2d(...)) in one keel.FusedConv kernel: same outputs and gradients (x, w, b) as the two
// ops, on the reference kernels and on the plugins (oneDNN's FusedConv, its Relu a post-op), alone and under a
// MaxPool, whose fold then runs the Relu's backward over the pooled tensor and the FusedConv's backward skips its
// own; the forward runs no Relu. Two shapes: 16 input channels (oneDNN's primitive) and one, padded, with 20 output
// channels (the oneDNN plugin's stem kernel: blocks of 8 channels and single ones, the padded copy). A Tracer
// records Conv and Relu; an f64 input runs the two ops.
TEST_F(EagerTest, Conv2dReluIsReluOfConv2dInOneKernel) {
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  auto plugins = Environment::create();
  ASSERT_TRUE(plugins.is_ok()) << plugins.status().to_string();
  std::shared_ptr<Environment> penv(std::move(plugins).value());
  struct Layer {
    int64_t in, out, pad;
  };
  for (bool on_plugins : {false, true}) {
    if (on_plugins) init(penv, 1);
    for (const Layer& l : {Layer{16, 32, 0}, Layer{1, 20, 1}})
      for (bool pool : {false, true}) {
        const std::string what = std::string(on_plugins ? "plugins" : "reference") + ", " + std::to_string(l.in) +
                                 " -> " + std::to_string(l.out) + (pool ? ", max pool" : "");
        manual_seed(21);
        Tensor x = randn({2, l.in, 10, 10}).requires_grad_(), w = randn({l.out, l.in, 3, 3}, 0.2f).requires_grad_(),
               b = randn({l.out}, 0.1f).requires_grad_();
        const int64_t side = 8 + 2 * l.pad;  // the convolution's output
        const std::string full =
            "[2, " + std::to_string(l.out) + ", " + std::to_string(side) + ", " + std::to_string(side) + "]";
        Tensor weights = rand_uniform({2, l.out, pool ? side / 2 : side, pool ? side / 2 : side}, 0.5f, 1.5f);
        struct Run {
          std::vector<float> y, dx, dw, db;
          std::string report;
        };
        auto run = [&](bool fused) {
          for (Tensor* t : {&x, &w, &b}) t->zero_grad();
          set_profiling(true);
          (void)profile_report();  // clears the counters
          const std::array<int64_t, 2> pad{l.pad, l.pad};
          Tensor y = fused ? conv2d_relu(x, w, b, {1, 1}, pad) : relu(now(conv2d(x, w, b, {1, 1}, pad)));
          if (pool) y = max_pool2d(y, {2, 2});
          sum(y * weights).backward();
          Run r{y.to_vector<float>(), x.grad().to_vector<float>(), w.grad().to_vector<float>(),
                b.grad().to_vector<float>(), profile_report()};
          set_profiling(false);
          return r;
        };
        const Run fused = run(true), apart = run(false);
        auto near = [&](const std::vector<float>& got, const std::vector<float>& want, const char* name) {
          ASSERT_EQ(got.size(), want.size()) << what << " " << name;
          for (size_t i = 0; i < want.size(); ++i)
            ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << what << " " << name << " element " << i;
        };
        near(fused.y, apart.y, "y");
        near(fused.dx, apart.dx, "dx");
        near(fused.dw, apart.dw, "dw");
        near(fused.db, apart.db, "db");
        EXPECT_NE(fused.report.find("keel.FusedConv"), std::string::npos) << what << "\n" << fused.report;
        bool relu_ran = false, relu_grad_full = false;
        std::istringstream lines(fused.report);
        for (std::string line; std::getline(lines, line);) {
          relu_ran = relu_ran || line.rfind("Relu ", 0) == 0;
          if (line.find("ReluGrad") != std::string::npos)
            relu_grad_full = relu_grad_full || line.find(full) != std::string::npos;
        }
        EXPECT_FALSE(relu_ran) << what << "\n" << fused.report;
        EXPECT_EQ(relu_grad_full, !pool) << what << ": the fold runs ReluGrad over the pooled tensor\n" << fused.report;
      }
  }
  {
    // Under bf16 autocast on the plugins (oneDNN's bf16 FusedConv takes constant weights only): runs, as the two ops.
    manual_seed(4);
    Tensor x = randn({2, 16, 10, 10}), w = randn({32, 16, 3, 3}, 0.2f).requires_grad_(), b = randn({32}, 0.1f);
    AutocastGuard bf16(DType::kBF16);
    Tensor y = conv2d_relu(x, w, b), want = relu(now(conv2d(x, w, b)));
    ASSERT_EQ(y.dtype(), want.dtype());
    const auto got = y.to(DType::kF32).to_vector<float>(), ref = want.to(DType::kF32).to_vector<float>();
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 2e-2 * (1 + std::abs(ref[i]))) << i;
    sum(y.to(DType::kF32)).backward();
    EXPECT_TRUE(w.grad().defined());
  }
  init(reference_env());
  {
    manual_seed(2);
    Tensor x = randn({1, 2, 5, 5}), w = randn({3, 2, 3, 3}), b = randn({3});
    Tracer tr("conv_relu");
    tr.input(x, "x");
    tr.output(conv2d_relu(x, w, b), "y");
    auto g = tr.graph();
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    std::vector<std::string> ops;
    for (NodeId id : g->node_ids()) ops.push_back(g->node(id)->op_type);
    ASSERT_GE(ops.size(), 2u);  // the output's naming may add an Identity
    EXPECT_EQ(std::vector<std::string>(ops.begin(), ops.begin() + 2), (std::vector<std::string>{"Conv", "Relu"}));
    EXPECT_EQ(std::count(ops.begin(), ops.end(), "FusedConv"), 0);
  }
  gradcheck("conv2d_relu f64",
            [](const V& v) {
              return conv2d_relu(v[0], v[1], v[2], {1, 1}, {1, 1});
            },
            {rnd({1, 2, 4, 4}), rnd({3, 2, 3, 3}), rnd({3})});
}

// conv2d_relu_max_pool2d is max_pool2d(conv2d_relu(...)) in one keel.FusedConvMaxPool kernel, its backward one
// keel.FusedConvMaxPoolGrad: same outputs and gradients (x, w, b) as the separate ops, on the reference kernels and on
// the plugins. Shapes: 16 -> 32 channels (oneDNN's Winograd primitive, 16-channel blocks); 1 -> 20 padded (the
// plugin's stem kernel, plain output); 32 -> 24 over 11x11 (a block half filled, a row and a column no window
// covers); a 3x2 window. Without a gradient the op makes no window positions; a Tracer records Conv, Relu, MaxPool.
TEST_F(EagerTest, Conv2dReluMaxPoolIsMaxPoolOfConv2dReluInOneKernel) {
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  auto plugins = Environment::create();
  ASSERT_TRUE(plugins.is_ok()) << plugins.status().to_string();
  std::shared_ptr<Environment> penv(std::move(plugins).value());
  struct Case {
    int64_t in, out, side, pad;
    std::array<int64_t, 2> pool;
  };
  for (bool on_plugins : {false, true}) {
    if (on_plugins) init(penv, 1);
    for (const Case& l : {Case{16, 32, 10, 0, {2, 2}}, Case{1, 20, 10, 1, {2, 2}}, Case{32, 24, 11, 0, {2, 2}},
                          Case{16, 16, 10, 1, {3, 2}}}) {
      const std::string what = std::string(on_plugins ? "plugins" : "reference") + ", " + std::to_string(l.in) +
                               " -> " + std::to_string(l.out) + " at " + std::to_string(l.side) + ", pool " +
                               std::to_string(l.pool[0]) + "x" + std::to_string(l.pool[1]);
      manual_seed(23);
      Tensor x = randn({2, l.in, l.side, l.side}).requires_grad_(),
             w = randn({l.out, l.in, 3, 3}, 0.2f).requires_grad_(), b = randn({l.out}, 0.1f).requires_grad_();
      const int64_t conv = l.side - 2 + 2 * l.pad;
      Tensor weights = rand_uniform({2, l.out, conv / l.pool[0], conv / l.pool[1]}, 0.5f, 1.5f);
      struct Run {
        std::vector<float> y, dx, dw, db, eval;
        std::string report;
      };
      auto run = [&](bool fused) {
        for (Tensor* t : {&x, &w, &b}) t->zero_grad();
        set_profiling(true);
        (void)profile_report();  // clears the counters
        const std::array<int64_t, 2> pad{l.pad, l.pad};
        auto forward = [&] {
          return fused ? conv2d_relu_max_pool2d(x, w, b, l.pool, {1, 1}, pad)
                       : max_pool2d(now(relu(now(conv2d(x, w, b, {1, 1}, pad)))), l.pool);
        };
        Tensor y = forward();
        sum(y * weights).backward();
        Run r{y.to_vector<float>(),
              x.grad().to_vector<float>(),
              w.grad().to_vector<float>(),
              b.grad().to_vector<float>(),
              {},
              profile_report()};
        set_profiling(false);
        NoGradGuard ng;
        r.eval = forward().to_vector<float>();
        return r;
      };
      const Run fused = run(true), apart = run(false);
      auto near = [&](const std::vector<float>& got, const std::vector<float>& want, const char* name) {
        ASSERT_EQ(got.size(), want.size()) << what << " " << name;
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << what << " " << name << " element " << i;
      };
      near(fused.y, apart.y, "y");
      near(fused.eval, apart.y, "y without grad");
      near(fused.dx, apart.dx, "dx");
      near(fused.dw, apart.dw, "dw");
      near(fused.db, apart.db, "db");
      EXPECT_NE(fused.report.find("keel.FusedConvMaxPoolGrad"), std::string::npos) << what << "\n" << fused.report;
      if (on_plugins) {
        for (const char* k : {"onednn_f32_keel_fusedconvmaxpool ", "onednn_keel_fusedconvmaxpoolgrad "})
          EXPECT_NE(fused.report.find(k), std::string::npos) << what << ": " << k << "\n" << fused.report;
      }
      std::istringstream lines(fused.report);
      for (std::string line; std::getline(lines, line);)
        for (const char* op : {"MaxPool ", "keel.MaxPoolGrad ", "keel.ConvGrad ", "keel.ReluGrad ", "Relu "})
          EXPECT_NE(line.rfind(op, 0), 0u) << what << ": " << op << "ran\n" << fused.report;
    }
  }
  // A window larger than the convolution's output: an Error naming both, on either kernel set.
  for (bool on_plugins : {true, false}) {
    if (!on_plugins) init(reference_env());
    Tensor x = randn({1, 2, 5, 5}), w = randn({3, 2, 3, 3}), b = randn({3});
    try {
      (void)conv2d_relu_max_pool2d(x, w, b, {4, 4});
      ADD_FAILURE() << "a 4x4 window over a 3x3 output was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("smaller than the pool window 4x4"), std::string::npos) << e.what();
    }
  }
  // A Tracer records the standard ops for the fused call and for the calls one by one (which deferral would
  // otherwise fuse, eager_deferred.cc).
  for (bool fused : {true, false}) {
    manual_seed(2);
    Tensor x = randn({1, 2, 6, 6}), w = randn({3, 2, 3, 3}), b = randn({3});
    Tracer tr("conv_relu_pool");
    tr.input(x, "x");
    tr.output(fused ? conv2d_relu_max_pool2d(x, w, b, {2, 2}) : max_pool2d(relu(conv2d(x, w, b)), {2, 2}), "y");
    auto g = tr.graph();
    ASSERT_TRUE(g.is_ok()) << g.status().to_string();
    std::vector<std::string> ops;
    for (NodeId id : g->node_ids()) ops.push_back(g->node(id)->op_type);
    ASSERT_GE(ops.size(), 3u);
    EXPECT_EQ(std::vector<std::string>(ops.begin(), ops.begin() + 3),
              (std::vector<std::string>{"Conv", "Relu", "MaxPool"}))
        << (fused ? "fused" : "apart");
  }
  gradcheck("conv2d_relu_max_pool2d f64",
            [](const V& v) {
              return conv2d_relu_max_pool2d(v[0], v[1], v[2], {2, 2}, {1, 1}, {1, 1});
            },
            {rnd({1, 2, 4, 4}), rnd({3, 2, 3, 3}), rnd({3})});
}

// Under autocast, conv2d_relu_max_pool2d over at most 4 input channels (a first layer) still runs the fused op, in
// f32 (the same values and gradients as without autocast, to the bit); over more it runs the separate ops in bf16,
// but in fp16 on the CPU, whose only f16 convolution is the reference kernel (autocast would run the convolution in
// f32 anyway), the fused op again: separate, it stored the convolution's output whole, for nothing.
TEST_F(EagerTest, Conv2dReluMaxPoolUnderAutocastStaysFusedInF32ForAFirstLayer) {
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  auto plugins = Environment::create();
  ASSERT_TRUE(plugins.is_ok()) << plugins.status().to_string();
  init(std::shared_ptr<Environment>(std::move(plugins).value()), 1);
  for (const auto& [in, low] :
       {std::pair{int64_t{1}, DType::kBF16}, {int64_t{16}, DType::kBF16}, {int64_t{16}, DType::kF16}}) {
    const std::string what = std::to_string(in) + " input channel(s), autocast " + dtype_name(low);
    manual_seed(5);
    Tensor x = randn({2, in, 10, 10}), w = randn({16, in, 3, 3}, 0.2f).requires_grad_(),
           b = randn({16}, 0.1f).requires_grad_();
    struct Run {
      DType dtype;
      std::vector<float> y, dw, db;
      std::string report;
    };
    auto run = [&](bool amp) {
      w.zero_grad();
      b.zero_grad();
      set_profiling(true);
      (void)profile_report();
      Tensor y;
      {
        std::optional<AutocastGuard> guard;
        if (amp) guard.emplace(low);
        y = conv2d_relu_max_pool2d(x, w, b, {2, 2});
      }
      const DType dt = y.dtype();
      Tensor yf = dt == DType::kF32 ? y : y.to(DType::kF32);
      sum(yf).backward();
      Run r{dt, yf.to_vector<float>(), w.grad().to_vector<float>(), b.grad().to_vector<float>(), profile_report()};
      set_profiling(false);
      return r;
    };
    const Run plain = run(false), amp = run(true);
    if (in == 1 || low == DType::kF16) {
      EXPECT_EQ(amp.dtype, DType::kF32) << what;
      EXPECT_EQ(amp.y, plain.y) << what;
      EXPECT_EQ(amp.dw, plain.dw) << what;
      EXPECT_EQ(amp.db, plain.db) << what;
      EXPECT_NE(amp.report.find("keel.FusedConvMaxPool "), std::string::npos) << what << "\n" << amp.report;
    } else {
      EXPECT_EQ(amp.dtype, DType::kBF16) << what;
      EXPECT_EQ(amp.report.find("keel.FusedConvMaxPool "), std::string::npos) << what << "\n" << amp.report;
      ASSERT_EQ(amp.y.size(), plain.y.size());
      for (size_t i = 0; i < plain.y.size(); ++i)
        ASSERT_NEAR(amp.y[i], plain.y[i], 0.05 * (1 + std::abs(plain.y[i]))) << what << " element " << i;
    }
  }
  init(reference_env());
}

// Dropout keeps 1 - p of the elements, scaled by 1 / (1 - p), zeroes the rest; the same seed draws the same mask.
// custom_function: the caller's forward (x * 2) and backward (g * 3) are what autograd uses; without grad no node
// is recorded; a backward of the wrong shape is an Error naming the function.
TEST_F(EagerTest, CustomFunctionUsesTheCallersForwardAndBackward) {
  auto times = [](double k) {
    return [k](const keel::Tensor& t) { return (Tensor(t) * static_cast<float>(k)).data(); };
  };
  Tensor x = from_vector(std::vector<float>{1.f, -2.f, 3.f}, {3});
  x.requires_grad_();
  Tensor y = custom_function(x, times(2), times(3), "TimesTwo");
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2.f, -4.f, 6.f}));
  sum(y * y).backward();  // d/dx = 3 * (2y) with the custom backward
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{12.f, -24.f, 36.f}));
  Tensor plain = from_vector(std::vector<float>{1.f}, {1});
  EXPECT_FALSE(custom_function(plain, times(2), times(3), "TimesTwo").requires_grad());
  Tensor z = from_vector(std::vector<float>{1.f, 2.f}, {2});
  z.requires_grad_();
  Tensor bad = custom_function(
      z, times(1), [](const keel::Tensor&) { return from_vector(std::vector<float>{0.f}, {1}).data(); }, "Bad");
  try {
    sum(bad).backward();
    ADD_FAILURE() << "a wrong-shaped gradient was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Bad: backward returned"), std::string::npos) << e.what();
  }
}

TEST_F(EagerTest, DropoutKeepsOneMinusPScaled) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF64}) {
    const Tensor x = ones({1000, 101}, dt);  // an odd count: the last element takes half a draw
    manual_seed(3);
    const auto y = dropout(x, 0.3f, true).to(DType::kF64).to_vector<double>();
    manual_seed(3);
    EXPECT_EQ(dropout(x, 0.3f, true).to(DType::kF64).to_vector<double>(), y) << dtype_name(dt);
    const double scale = dt == DType::kBF16 ? 1.4296875 : dt == DType::kF32 ? static_cast<double>(1.f / 0.7f) : 1 / 0.7;
    size_t kept = 0;
    for (double v : y) {
      if (v != 0) {
        EXPECT_NEAR(v, scale, 1e-6) << dtype_name(dt);
      }
      kept += v != 0;
    }
    EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(y.size()), 0.7, 0.005) << dtype_name(dt);
  }
  // The mask depends on the seed only, not on the dtype (f32 takes its own vectorised path); the two halves of one
  // 64-bit value decide neighbours independently; the next call (the generator moved on) draws another mask.
  {
    const Tensor x32 = ones({1000, 101}), x64 = ones({1000, 101}, DType::kF64);
    manual_seed(11);
    const auto a = dropout(x32, 0.3f, true).to_vector<float>();
    const auto b = dropout(x32, 0.3f, true).to_vector<float>();
    manual_seed(11);
    const auto c = dropout(x64, 0.3f, true).to_vector<double>();
    // The 16-bit floats select their bit patterns (their own vectorised path): the same mask again.
    manual_seed(11);
    const auto h = dropout(ones({1000, 101}, DType::kF16), 0.3f, true).to(DType::kF32).to_vector<float>();
    manual_seed(11);
    const auto g = dropout(ones({1000, 101}, DType::kBF16), 0.3f, true).to(DType::kF32).to_vector<float>();
    size_t both = 0, same = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i] != 0, c[i] != 0) << "element " << i;
      EXPECT_EQ(a[i] != 0, h[i] != 0) << "f16 element " << i;
      EXPECT_EQ(a[i] != 0, g[i] != 0) << "bf16 element " << i;
      if (h[i] != 0) {
        EXPECT_EQ(h[i], 1.4287109375f) << "f16 element " << i;  // 1 / 0.7 in f16
      }
      same += (a[i] != 0) == (b[i] != 0);
      if (i % 2 == 0 && i + 1 < a.size()) both += a[i] != 0 && a[i + 1] != 0;
    }
    EXPECT_NEAR(static_cast<double>(both) / static_cast<double>(a.size() / 2), 0.49, 0.01);
    EXPECT_NEAR(static_cast<double>(same) / static_cast<double>(a.size()), 0.58, 0.01);  // 0.7^2 + 0.3^2
  }
  const Tensor x = ones({4});
  EXPECT_EQ(dropout(x, 0.5f, false).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(dropout(x, 0.f, true).to_vector<float>(), x.to_vector<float>());
  EXPECT_THROW(dropout(x, 1.f, true), Error);
}

TEST_F(EagerTest, Normalisation) {
  Tensor rm = zeros({3}, DType::kF64), rv = ones({3}, DType::kF64);
  gradcheck(
      "batch_norm train", [&](const V& v) { return batch_norm(v[0], v[1], v[2], rm, rv, true); },
      {rnd({4, 3, 2, 2}), rnd({3}, 0.5, 1.5), rnd({3})}, 1e-5);
  gradcheck(
      "batch_norm train NC", [&](const V& v) { return batch_norm(v[0], v[1], v[2], rm, rv, true); },
      {rnd({5, 3}), rnd({3}, 0.5, 1.5), rnd({3})}, 1e-5);
  Tensor em = rnd({3}, -0.2, 0.2, false), ev = rnd({3}, 0.5, 1.5, false);
  gradcheck(
      "batch_norm eval", [&](const V& v) { return batch_norm(v[0], v[1], v[2], em, ev, false); },
      {rnd({2, 3, 2, 2}), rnd({3}), rnd({3})}, 1e-4, 1e-2);  // the reference kernel computes in f32
  gradcheck(
      "layer_norm", [](const V& v) { return layer_norm(v[0], 1, v[1], v[2]); }, {rnd({3, 5}), rnd({5}), rnd({5})}, 1e-4,
      1e-3);  // scale read as f32
  gradcheck(
      "layer_norm 2 dims", [](const V& v) { return layer_norm(v[0], 2, v[1], v[2]); },
      {rnd({2, 3, 4}), rnd({3, 4}), rnd({3, 4})}, 1e-4, 1e-3);
}

TEST_F(EagerTest, BatchNormRunningStatistics) {
  Tensor x = from_vector(std::vector<float>{1, 2, 3, 4, 10, 20, 30, 40},
                         {4, 2});  // channel 0: 1,3,10,30; channel 1: 2,4,20,40
  Tensor rm = zeros({2}), rv = ones({2});
  batch_norm(x, Tensor(), Tensor(), rm, rv, true, 0.1f);
  auto m = rm.to_vector<float>(), v = rv.to_vector<float>();
  EXPECT_NEAR(m[0], 0.1 * 11.0, 1e-5);
  EXPECT_NEAR(m[1], 0.1 * 16.5, 1e-5);
  // unbiased variance of {1,3,10,30}: mean 11, squares 100+64+1+361 = 526, / 3
  EXPECT_NEAR(v[0], 0.9 + 0.1 * 526.0 / 3.0, 1e-3);
}

TEST_F(EagerTest, ShapesAndReductions) {
  gradcheck("reshape", [](const V& v) { return reshape(v[0], {3, -1}) * v[1]; }, {rnd({2, 3, 2}), rnd({3, 4})});
  gradcheck("flatten", [](const V& v) { return flatten(v[0]); }, {rnd({2, 3, 2})});
  gradcheck("transpose", [](const V& v) { return transpose(v[0], {2, 0, 1}); }, {rnd({2, 3, 4})});
  gradcheck("concat", [](const V& v) { return concat({v[0], v[1]}, 1); }, {rnd({2, 3}), rnd({2, 2})});
  gradcheck("sum all", [](const V& v) { return sum(v[0] * v[0]); }, {rnd({2, 3})});
  gradcheck("sum axes", [](const V& v) { return sum(v[0], {0, 2}); }, {rnd({2, 3, 4})});
  gradcheck("sum keepdims", [](const V& v) { return sum(v[0], {1}, true); }, {rnd({2, 3, 4})});
  gradcheck("mean", [](const V& v) { return mean(v[0], {-1}); }, {rnd({2, 3, 4})});
  gradcheck("mean all", [](const V& v) { return mean(v[0]); }, {rnd({2, 3})});
  Tensor idx = from_vector(std::vector<int64_t>{0, 2, 2, 1}, {2, 2});
  gradcheck("embedding", [&](const V& v) { return embedding(v[0], idx); }, {rnd({3, 4})});
  gradcheck("dropout", [](const V& v) { return dropout(v[0], 0.3f, true); }, {rnd({20})});
  gradcheck(
      "cast round trip", [](const V& v) { return v[0].to(DType::kF32).to(DType::kF64); }, {rnd({4})}, 1e-2, 1e-3);
}

TEST_F(EagerTest, Losses) {
  Tensor t = from_vector(std::vector<int64_t>{2, 0, 1}, {3});
  for (const char* red : {"mean", "sum", "none"}) {
    gradcheck(std::string("cross_entropy ") + red, [&](const V& v) { return cross_entropy(v[0], t, red); },
              {rnd({3, 4})});
    gradcheck(std::string("mse ") + red, [&](const V& v) { return mse_loss(v[0], v[1], red); },
              {rnd({3, 2}), rnd({3, 2})});
    gradcheck(std::string("bce ") + red, [&](const V& v) { return binary_cross_entropy_with_logits(v[0], v[1], red); },
              {rnd({3, 2}, -3, 3), rnd({3, 2}, 0, 1)});
  }
}

TEST_F(EagerTest, CrossEntropyValue) {
  Tensor logits = from_vector(std::vector<float>{1, 2, 3, 1, 1, 1}, {2, 3});
  Tensor t = from_vector(std::vector<int64_t>{2, 0}, {2});
  double l0 = -(3 - std::log(std::exp(1.) + std::exp(2.) + std::exp(3.)));
  double l1 = std::log(3.0);
  EXPECT_NEAR(cross_entropy(logits, t).item(), (l0 + l1) / 2, 1e-5);
  EXPECT_NEAR(cross_entropy(logits, t, "sum").item(), l0 + l1, 1e-5);
}

TEST_F(EagerTest, AccumulationNoGradAndGraphRelease) {
  Tensor w = from_vector(std::vector<float>{1, 2, 3}, {3}).requires_grad_();
  Tensor y = sum(w * w);
  y.backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 4, 6}));
  sum(w * 2.f).backward();  // accumulates
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{4, 6, 8}));
  EXPECT_THROW(y.backward(), Error);  // the graph was freed
  w.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  {
    NoGradGuard ng;
    Tensor z = w * w;
    EXPECT_FALSE(z.requires_grad());
    EXPECT_TRUE(z.is_leaf());
  }
  EXPECT_TRUE(grad_enabled());
  // Two leaves fed by one Add get separate gradient buffers.
  Tensor a = ones({2}).requires_grad_(), b = ones({2}).requires_grad_();
  sum(a + b).backward();
  EXPECT_NE(a.grad().data().raw_data(), b.grad().data().raw_data());
  // A gradient that flows along two paths is summed.
  Tensor x = from_vector(std::vector<float>{3}, {1}).requires_grad_();
  (x * x + x).backward();
  EXPECT_FLOAT_EQ(x.grad().item(), 7.f);
  Tensor d = (x * x).detach();
  EXPECT_FALSE(d.requires_grad());
}

TEST_F(EagerTest, ErrorsNameTheProblem) {
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  try {
    matmul(a, b);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MatMul"), std::string::npos) << e.what();
  }
  EXPECT_THROW(conv2d(zeros({1, 3, 5, 5}), zeros({4, 2, 3, 3}), Tensor()), Error);
  EXPECT_THROW(reshape(a, {4, -1}), Error);
  EXPECT_THROW(cross_entropy(a, zeros({2}), "mean"), Error);  // float target
  EXPECT_THROW(cross_entropy(a, from_vector(std::vector<int64_t>{0, 1}, {2}), "avg"), Error);
  EXPECT_THROW(Tensor().shape(), Error);
  EXPECT_THROW(zeros({2}).backward(), Error);
  EXPECT_THROW(from_vector(std::vector<int64_t>{1}, {1}).requires_grad_(), Error);
  EXPECT_THROW(set_device("no_such_device"), Error);
  EXPECT_THROW(AutocastGuard(DType::kF32), Error);
}

TEST_F(EagerTest, KernelInstancesAreCached) {
  Tensor x = rnd({2, 3}, -1, 1, false);
  relu(x);
  DispatchStats s0 = dispatch_stats();
  for (int i = 0; i < 10; ++i) relu(x);
  DispatchStats s1 = dispatch_stats();
  EXPECT_EQ(s1.cache_misses, s0.cache_misses);
  EXPECT_EQ(s1.cache_hits - s0.cache_hits, 10u);
  relu(rnd({4, 3}, -1, 1, false));  // a new shape is a new instance
  EXPECT_EQ(dispatch_stats().cache_misses, s1.cache_misses + 1);
  // Index values (data) are not part of the key; shape-like values (a Reshape's shape, ReduceSum's axes) are.
  Tensor table = rnd({5, 2}, -1, 1, false);
  embedding(table, from_vector(std::vector<int64_t>{0, 1}, {2}));
  DispatchStats s2 = dispatch_stats();
  auto got = embedding(table, from_vector(std::vector<int64_t>{4, 3}, {2})).to_vector<double>();
  EXPECT_EQ(dispatch_stats().cache_misses, s2.cache_misses);
  auto t = table.to_vector<double>();
  EXPECT_EQ(got, (std::vector<double>{t[8], t[9], t[6], t[7]}));
  sum(table, {0});
  DispatchStats s3 = dispatch_stats();
  sum(table, {1});
  EXPECT_EQ(dispatch_stats().cache_misses, s3.cache_misses + 1);
}

TEST_F(EagerTest, AutocastPolicy) {
  Tensor x = rand_uniform({2, 1, 6, 6}, -1, 1), w = rand_uniform({4, 1, 3, 3}, -1, 1).requires_grad_();
  Tensor fw = rand_uniform({3, 16}, -1, 1).requires_grad_();
  Tensor t = from_vector(std::vector<int64_t>{0, 2}, {2});
  Tensor y, loss;
  {
    AutocastGuard ac(DType::kBF16);
    EXPECT_EQ(autocast_dtype(), DType::kBF16);
    y = relu(conv2d(x, w, Tensor()));
    EXPECT_EQ(y.dtype(), DType::kBF16);  // conv in low precision, relu follows its input
    Tensor logits = linear(flatten(max_pool2d(y, {2, 2}, {2, 2}, {0, 0})), fw, Tensor());
    EXPECT_EQ(logits.dtype(), DType::kBF16);
    loss = cross_entropy(logits, t);
    EXPECT_EQ(loss.dtype(), DType::kF32);  // losses in f32
  }
  EXPECT_EQ(autocast_dtype(), DType::kUndefined);
  loss.backward();
  EXPECT_EQ(w.grad().dtype(), DType::kF32);  // master weights keep f32 gradients
  EXPECT_EQ(fw.grad().dtype(), DType::kF32);
  // The bf16 gradient is close to the f32 one.
  Tensor w32 = w.detach().requires_grad_(), fw32 = fw.detach().requires_grad_();
  cross_entropy(linear(flatten(max_pool2d(relu(conv2d(x, w32, Tensor())), {2, 2})), fw32, Tensor()), t).backward();
  auto a = fw.grad().to_vector<float>(), b = fw32.grad().to_vector<float>();
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err += (a[i] - b[i]) * (a[i] - b[i]);
    ref += b[i] * b[i];
  }
  EXPECT_LT(std::sqrt(err / std::max(ref, 1e-12)), 0.05);
}

// On the CPU plugins, autocast to fp16 keeps Gemm in f32 (the only f16 Gemm is the reference kernel, which ranks
// below oneDNN's f32 one: SimpleCNN's `keel train --amp fp16` ran 12x slower than fp32 on it), while bf16 runs on
// oneDNN's bf16 Gemm.
TEST_F(EagerTest, AutocastKeepsF32WhereTheLowPrecisionKernelRanksBelowIt) {
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  auto plugins = Environment::create();
  ASSERT_TRUE(plugins.is_ok()) << plugins.status().to_string();
  init(std::shared_ptr<Environment>(std::move(plugins).value()), 1);
  bool onednn_f32_gemm = false;
  for (const auto& k : environment().registry().kernels())
    onednn_f32_gemm = onednn_f32_gemm || k->name == "onednn_f32_gemm";
  if (!onednn_f32_gemm) {
    init(reference_env());
    GTEST_SKIP() << "the oneDNN plugin is not built";
  }
  manual_seed(9);
  Tensor x = randn({4, 32}), w = randn({8, 32}, 0.2f);
  const std::vector<float> want = linear(x, w, Tensor()).to_vector<float>();
  for (DType low : {DType::kF16, DType::kBF16}) {
    set_profiling(true);
    (void)profile_report();
    Tensor y;
    {
      AutocastGuard ac(low);
      y = linear(x, w, Tensor());
    }
    const std::string report = profile_report();
    set_profiling(false);
    const bool f16 = low == DType::kF16;
    EXPECT_EQ(y.dtype(), f16 ? DType::kF32 : DType::kBF16) << report;
    EXPECT_NE(report.find(f16 ? "onednn_f32_gemm" : "onednn_bf16_gemm"), std::string::npos) << report;
    EXPECT_EQ(report.find("ref_gemm"), std::string::npos) << report;
    const std::vector<float> got = y.to(DType::kF32).to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], f16 ? 1e-5 : 0.05 * (1 + std::abs(want[i]))) << dtype_name(low) << " " << i;
  }
  init(reference_env());
}

// The SimpleCNN of the issue: traced, run in a Session, same outputs as eager; exported to ONNX and loaded back.
TEST_F(EagerTest, TraceSimpleCnnRunsInSession) {
  manual_seed(1);
  Tensor w1 = randn({32, 1, 3, 3}, 0.3f), b1 = randn({32}, 0.1f), w2 = randn({10, 32 * 13 * 13}, 0.01f),
         b2 = zeros({10});
  Tensor x = randn({2, 1, 28, 28});
  auto model = [&](const Tensor& in) { return linear(flatten(max_pool2d(relu(conv2d(in, w1, b1)), {2, 2})), w2, b2); };
  Tensor eager_out = model(x);
  Tracer tr("simple_cnn");
  tr.input(x, "image");
  tr.name_parameter(w1, "conv.weight");
  tr.name_parameter(b1, "conv.bias");
  tr.name_parameter(w2, "fc.weight");
  Tensor traced_out = model(x);
  tr.output(traced_out, "logits");
  auto g = tr.graph();
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_TRUE(g->initializers.count("conv.weight"));
  EXPECT_TRUE(g->initializers.count("fc.weight"));
  ASSERT_EQ(g->outputs, std::vector<std::string>{"logits"});
  const ValueInfo* vi = g->info("logits");
  ASSERT_NE(vi, nullptr);
  EXPECT_EQ(vi->shape, (Shape{2, 10}));
  auto path = std::filesystem::temp_directory_path() / "keel_eager_trace_test.onnx";
  ASSERT_TRUE(save_onnx(*g, path).is_ok());
  auto loaded = load_onnx(path);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  std::filesystem::remove(path);
  for (Graph* graph : {&g.value(), &loaded.value()}) {
    auto sess = Session::create(environment(), *graph);
    ASSERT_TRUE(sess.is_ok()) << sess.status().to_string();
    auto out = (*sess)->run({{"image", x.data()}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    auto a = Tensor((*out)[0]).to_vector<float>(), b = eager_out.to_vector<float>();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4);
  }
}

// The SimpleCNN training step on the discovered plugins (oneDNN's training kernels when built) gives the
// reference device's gradients, in f32 and under bf16 autocast.
TEST_F(EagerTest, TrainingStepOnPluginsMatchesReference) {
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  auto plugins = Environment::create();
  ASSERT_TRUE(plugins.is_ok()) << plugins.status().to_string();
  std::shared_ptr<Environment> penv(std::move(plugins).value());
  auto grads = [](DType amp) {
    manual_seed(5);
    Tensor w1 = randn({8, 1, 3, 3}, 0.3f).requires_grad_(), b1 = randn({8}, 0.1f).requires_grad_();
    Tensor w2 = randn({10, 8 * 13 * 13}, 0.02f).requires_grad_(), b2 = zeros({10}).requires_grad_();
    Tensor x = randn({16, 1, 28, 28});
    std::vector<int64_t> lab(16);
    for (size_t i = 0; i < lab.size(); ++i) lab[i] = static_cast<int64_t>(i % 10);
    Tensor t = from_vector(lab, {16});
    Tensor loss;
    {
      std::unique_ptr<AutocastGuard> ac;
      if (amp != DType::kUndefined) ac = std::make_unique<AutocastGuard>(amp);
      loss = cross_entropy(linear(flatten(max_pool2d(relu(conv2d(x, w1, b1)), {2, 2})), w2, b2), t);
    }
    loss.backward();
    std::vector<std::vector<float>> g;
    for (Tensor* p : {&w1, &b1, &w2, &b2}) g.push_back(p->grad().to_vector<float>());
    g.push_back({loss.item()});
    return g;
  };
  for (DType amp : {DType::kUndefined, DType::kBF16}) {
    init(reference_env());
    auto want = grads(amp);
    init(penv, 2);
    auto got = grads(amp);
    init(reference_env());
    const double tol = amp == DType::kUndefined ? 1e-4 : 3e-2;
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_EQ(got[k].size(), want[k].size());
      double err = 0, ref = 0;
      for (size_t i = 0; i < want[k].size(); ++i) {
        err += (got[k][i] - want[k][i]) * (got[k][i] - want[k][i]);
        ref += want[k][i] * want[k][i];
      }
      EXPECT_LE(std::sqrt(err), tol * std::max(std::sqrt(ref), 1e-3))
          << (amp == DType::kUndefined ? "f32" : "bf16") << " tensor " << k;
    }
  }
}

// A 3x3 stride-1 convolution with 16+ channels runs on oneDNN's Winograd kernel (when the plugin is built), whose
// kernel keeps the last weights' transform until the weights change, then switches to a primitive that transforms them
// itself: it must follow the weights, whether they come as another tensor or change in place (an optimizer step), and
// come back to the first ones.
TEST_F(EagerTest, WinogradConvOnPluginsFollowsItsWeights) {
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  auto plugins = Environment::create();
  ASSERT_TRUE(plugins.is_ok()) << plugins.status().to_string();
  std::shared_ptr<Environment> penv(std::move(plugins).value());
  manual_seed(3);
  const Tensor x = randn({2, 16, 10, 10}), b = randn({32}, 0.1f);
  const Tensor w1 = randn({32, 16, 3, 3}, 0.2f), w2 = randn({32, 16, 3, 3}, 0.2f);
  Tensor w3 = zeros({32, 16, 3, 3});
  w3.copy_(w2);
  // Run on the plugins: w1 twice, w2, w1 again, then w3 (w2's values) twice, then w3 after an in-place change.
  init(penv, 1);
  std::vector<std::vector<float>> got;
  for (const Tensor* w : std::vector<const Tensor*>{&w1, &w1, &w2, &w1, &w3, &w3})
    got.push_back(conv2d(x, *w, b).to_vector<float>());
  w3.copy_(w1);
  got.push_back(conv2d(x, w3, b).to_vector<float>());
  init(reference_env());
  const Tensor* want_w[] = {&w1, &w1, &w2, &w1, &w2, &w2, &w1};
  for (size_t k = 0; k < got.size(); ++k) {
    const auto want = conv2d(x, *want_w[k], b).to_vector<float>();
    ASSERT_EQ(got[k].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[k][i], want[i], 1e-4 * (1 + std::abs(want[i]))) << "run " << k << " element " << i;
  }
}

TEST_F(EagerTest, TracerRejectsMisuse) {
  Tracer tr;
  EXPECT_THROW(Tracer(), Error);     // one per thread
  EXPECT_FALSE(tr.graph().is_ok());  // no outputs
}

TEST_F(EagerTest, CallOpAndDeviceCopies) {
  Tensor x = from_vector(std::vector<float>{1, -2, 3, -4}, {2, 2}).requires_grad_();
  auto outs = call_op("", "Mul", {x, x});
  sum(outs[0]).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{2, -4, 6, -8}));
  Tensor same = x.to("cpu");
  EXPECT_EQ(same.impl(), x.impl());
  EXPECT_EQ(argmax(from_vector(std::vector<float>{1, 5, 2, 7, 0, 1}, {2, 3}), 1).to_vector<int64_t>(),
            std::vector<int64_t>({1, 0}));
}

// set_data_ (the fused device optimizers' update): every handle of the tensor sees the new storage, without a copy;
// a tensor detached before keeps the old values; a mismatch in shape, dtype or device, and a non-leaf that requires
// grad, are errors that change nothing.
TEST(Eager, SetDataSwapsTheStorageForEveryHandle) {
  Tensor p = from_vector(std::vector<float>{1.f, 2.f, 3.f}, {3});
  p.requires_grad_();
  Tensor same = p;  // another handle (a module's and an optimizer's)
  Tensor old = p.detach();
  Tensor fresh = from_vector(std::vector<float>{7.f, 8.f, 9.f}, {3});
  p.set_data_(fresh);
  EXPECT_EQ(same.to_vector<float>(), (std::vector<float>{7.f, 8.f, 9.f}));
  EXPECT_EQ(same.data().raw_data(), fresh.data().raw_data());  // no copy
  EXPECT_EQ(old.to_vector<float>(), (std::vector<float>{1.f, 2.f, 3.f}));
  EXPECT_TRUE(same.requires_grad());
  EXPECT_THROW(p.set_data_(from_vector(std::vector<float>{1.f, 2.f}, {2})), Error);
  EXPECT_THROW(p.set_data_(from_vector(std::vector<float>{1.f, 2.f, 3.f}, {3}).to(DType::kF16)), Error);
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{7.f, 8.f, 9.f}));
  Tensor y = p * 2.f;  // a non-leaf that requires grad
  EXPECT_THROW(y.set_data_(fresh), Error);
}

}  // namespace
}  // namespace keel::eager
