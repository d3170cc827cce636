#include "core/train/nn.h"

#include <gtest/gtest.h>

#include <cmath>

namespace keel::train {
namespace {

using namespace keel::train::nn;

Tensor t2(std::vector<float> v, Shape s) { return eager::from_vector(v, s); }

TEST(Module, NamesParametersWithDottedPathsInRegistrationOrder) {
  eager::manual_seed(0);
  auto net = std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      std::make_shared<Conv2D>(1, 4, 3), std::make_shared<BatchNorm2D>(4), std::make_shared<ReLU>(),
      std::make_shared<Flatten>(), std::make_shared<Linear>(4 * 4 * 4, 3)});
  std::vector<std::string> names;
  for (const auto& [n, p] : net->named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias"}));
  std::vector<std::string> sd;
  for (const auto& [n, p] : net->state_dict()) sd.push_back(n);
  EXPECT_EQ(sd, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                                          "1.num_batches_tracked", "4.weight", "4.bias"}));
  EXPECT_EQ(net->num_parameters(), 4 * 9 + 4 + 4 + 4 + 64 * 3 + 3);
  for (const auto& p : net->parameters()) EXPECT_TRUE(p.requires_grad() && p.is_leaf());
  auto y = net->forward(eager::randn({2, 1, 6, 6}));
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  EXPECT_NE(net->to_string().find("(4): Linear(in_features=64, out_features=3, bias=true)"), std::string::npos)
      << net->to_string();
  EXPECT_THROW(net->register_parameter("0", eager::zeros({1})), eager::Error);  // clashes with a submodule
  EXPECT_THROW(net->register_buffer("a.b", eager::zeros({1})), eager::Error);
}

TEST(Module, DefaultInitialisationFollowsPyTorchBoundsAndTheSeed) {
  eager::manual_seed(42);
  Linear a(100, 50);
  eager::manual_seed(42);
  Linear b(100, 50);
  auto wa = a.weight().to_vector<float>(), wb = b.weight().to_vector<float>();
  EXPECT_EQ(wa, wb);
  const float bound = 1.f / 10.f;
  float lo = 1, hi = -1;
  double mean = 0;
  for (float w : wa) lo = std::min(lo, w), hi = std::max(hi, w), mean += w;
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -0.9f * bound);  // uniform over the whole range
  EXPECT_GT(hi, 0.9f * bound);
  EXPECT_NEAR(mean / static_cast<double>(wa.size()), 0.0, 0.005);
  for (float v : a.bias().to_vector<float>()) EXPECT_LE(std::fabs(v), bound);
  Conv2D c(Conv2DOptions(8, 4, {3, 3}).with_groups(2));  // fan_in = 8/2 * 9 = 36
  for (float v : c.weight().to_vector<float>()) EXPECT_LE(std::fabs(v), 1.f / 6.f);
  EXPECT_EQ(c.weight().shape(), (Shape{4, 4, 3, 3}));
  ConvTranspose2D ct(4, 6, 2);  // weight [in, out, k, k], fan_in from dim 1 = 6 * 4
  EXPECT_EQ(ct.weight().shape(), (Shape{4, 6, 2, 2}));
  for (float v : ct.weight().to_vector<float>()) EXPECT_LE(std::fabs(v), 1.f / std::sqrt(24.f) + 1e-7f);
  BatchNorm2D bn(3);
  EXPECT_EQ(bn.weight().to_vector<float>(), std::vector<float>(3, 1.f));
  EXPECT_EQ(bn.running_var().to_vector<float>(), std::vector<float>(3, 1.f));
}

TEST(Module, LoadStateDictChecksKeysAndShapes) {
  eager::manual_seed(1);
  Linear a(3, 2), b(3, 2), c(4, 2);
  ASSERT_TRUE(b.load_state_dict(a.state_dict()).is_ok());
  EXPECT_EQ(a.weight().to_vector<float>(), b.weight().to_vector<float>());
  // The loaded values are copies: changing a does not change b.
  {
    eager::NoGradGuard ng;
    a.weight().copy_(eager::zeros({2, 3}));
  }
  EXPECT_NE(b.weight().to_vector<float>(), a.weight().to_vector<float>());
  auto st = c.load_state_dict(a.state_dict());
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find(
                "size mismatch for weight: copying a tensor of shape [2, 3], the shape in the current model is [2, 4]"),
            std::string::npos)
      << st.message();
  StateDict partial = {{"weight", a.weight()}, {"extra", a.bias()}};
  auto st2 = b.load_state_dict(partial);
  ASSERT_FALSE(st2.is_ok());
  EXPECT_NE(st2.message().find("missing key(s): bias"), std::string::npos) << st2.message();
  EXPECT_NE(st2.message().find("unexpected key(s): extra"), std::string::npos);
  EXPECT_TRUE(b.load_state_dict({{"weight", a.weight()}}, /*strict=*/false).is_ok());
}

TEST(Layers, LinearComputesXWtPlusB) {
  Linear l(2, 2);
  {
    eager::NoGradGuard ng;
    l.weight().copy_(t2({1, 2, 3, 4}, {2, 2}));
    l.bias().copy_(t2({0.5f, -1}, {2}));
  }
  auto y = l(t2({1, 1, 0, 2}, {2, 2})).to_vector<float>();
  EXPECT_EQ(y, (std::vector<float>{3.5f, 6.f, 4.5f, 7.f}));
}

TEST(Layers, TrainEvalSwitchesDropoutAndBatchNorm) {
  eager::manual_seed(3);
  Sequential net{std::make_shared<Dropout>(0.5f)};
  auto x = eager::ones({1000});
  auto y = net(x).to_vector<float>();
  int zeros = 0;
  for (float v : y) {
    if (v == 0) ++zeros;
    else EXPECT_FLOAT_EQ(v, 2.f);
  }
  EXPECT_GT(zeros, 400);
  EXPECT_LT(zeros, 600);
  net.eval();
  EXPECT_FALSE(net[0]->is_training());
  EXPECT_EQ(net(x).to_vector<float>(), std::vector<float>(1000, 1.f));

  BatchNorm2D bn(1, 1e-5f, 0.5f);
  auto in = t2({1, 2, 3, 4}, {1, 1, 2, 2});  // mean 2.5, biased var 1.25, unbiased 5/3
  auto out = bn(in).to_vector<float>();
  EXPECT_NEAR(out[0], (1 - 2.5f) / std::sqrt(1.25f + 1e-5f), 1e-4);
  EXPECT_NEAR(bn.running_mean().to_vector<float>()[0], 1.25f, 1e-5);
  EXPECT_NEAR(bn.running_var().to_vector<float>()[0], 0.5f + 0.5f * 5.f / 3.f, 1e-5);
  EXPECT_EQ(bn.num_batches_tracked(), 1);
  bn.eval();
  auto ev = bn(in).to_vector<float>();
  EXPECT_NEAR(ev[0], (1 - 1.25f) / std::sqrt(0.5f + 2.5f / 3.f + 1e-5f), 1e-4);
  EXPECT_EQ(bn.num_batches_tracked(), 1);
}

TEST(Layers, ShapesOfConvPoolNormEmbedding) {
  eager::manual_seed(0);
  auto x = eager::randn({2, 3, 8, 8});
  EXPECT_EQ(Conv2D(Conv2DOptions(3, 5, {3, 3}).with_padding(1).with_stride(2))(x).shape(), (Shape{2, 5, 4, 4}));
  EXPECT_EQ(ConvTranspose2D(Conv2DOptions(3, 2, {2, 2}).with_stride(2))(x).shape(), (Shape{2, 2, 16, 16}));
  EXPECT_EQ(MaxPool2D(2)(x).shape(), (Shape{2, 3, 4, 4}));
  EXPECT_EQ(AvgPool2D(3, 1, 1)(x).shape(), (Shape{2, 3, 8, 8}));
  EXPECT_EQ(Flatten()(x).shape(), (Shape{2, 192}));
  EXPECT_EQ(Flatten(2)(x).shape(), (Shape{2, 3, 64}));
  auto ln = LayerNorm({8})(x).to_vector<float>();
  double m = 0;
  for (int i = 0; i < 8; ++i) m += ln[static_cast<size_t>(i)];
  EXPECT_NEAR(m / 8, 0, 1e-5);
  Embedding emb(10, 4);
  auto e = emb(eager::from_vector(std::vector<int64_t>{1, 9, 1}, {3}));
  EXPECT_EQ(e.shape(), (Shape{3, 4}));
  auto ev = e.to_vector<float>();
  EXPECT_EQ(std::vector<float>(ev.begin(), ev.begin() + 4), std::vector<float>(ev.begin() + 8, ev.end()));
  EXPECT_NEAR(GELU()(t2({1}, {1})).item(), 0.8413447f, 1e-5);
  EXPECT_NEAR(Sigmoid()(t2({0}, {1})).item(), 0.5f, 1e-6);
  EXPECT_NEAR(Tanh()(t2({1}, {1})).item(), std::tanh(1.f), 1e-6);
  EXPECT_THROW(Linear(3, 2)(eager::ones({2, 4})), eager::Error);
  EXPECT_THROW(Dropout(1.5f), eager::Error);
}

// Sequential runs Conv2D -> ReLU [-> MaxPool2D(k, stride k)] as one fused op: the same outputs and gradients as the
// children one by one; a subclass (which may override forward) and a pooling of another stride run as written.
TEST(Layers, SequentialFusesConvReluPoolWithTheLayersResults) {
  struct DoubledReLU : ReLU {
    Tensor forward(const Tensor& x) override { return eager::relu(x) * 2.f; }
  };
  for (int variant = 0; variant < 3; ++variant) {
    eager::manual_seed(3);
    auto conv1 = std::make_shared<Conv2D>(Conv2DOptions(3, 8, {3, 3}).with_padding(1));
    std::shared_ptr<Module> relu1 = variant == 1 ? std::make_shared<DoubledReLU>() : std::make_shared<ReLU>();
    auto pool = std::make_shared<MaxPool2D>(2, variant == 2 ? 1 : 0);
    auto conv2 = std::make_shared<Conv2D>(Conv2DOptions(8, 4, {3, 3}));
    auto relu2 = std::make_shared<ReLU>();
    auto flat = std::make_shared<Flatten>();
    Sequential seq{conv1, relu1, pool, conv2, relu2, flat};
    auto x = eager::randn({2, 3, 13, 13});  // odd: the pooling drops the last row and column
    Tensor fused = seq(x);
    Tensor apart = x;
    for (const auto& [name, m] : seq.named_children()) apart = m->forward(apart);
    ASSERT_EQ(fused.shape(), apart.shape()) << "variant " << variant;
    auto a = fused.to_vector<float>(), b = apart.to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4f) << "variant " << variant << " element " << i;
    // Gradients of both paths, with respect to every parameter.
    std::vector<std::vector<float>> grads[2];
    for (int path = 0; path < 2; ++path) {
      for (auto& p : seq.parameters()) p.zero_grad();
      Tensor y = x;
      if (path == 0) y = seq(x);
      else
        for (const auto& [name, m] : seq.named_children()) y = m->forward(y);
      eager::sum(y * y).backward();
      for (auto& p : seq.parameters()) grads[path].push_back(p.grad().to_vector<float>());
    }
    for (size_t k = 0; k < grads[0].size(); ++k)
      for (size_t i = 0; i < grads[0][k].size(); ++i)
        ASSERT_NEAR(grads[0][k][i], grads[1][k][i], 1e-3f * (1 + std::fabs(grads[1][k][i])))
            << "variant " << variant << " parameter " << k << " element " << i;
  }
}

TEST(Losses, MatchHandComputedValues) {
  auto logits = t2({1, 2, 3, 1, 1, 1}, {2, 3});
  auto target = eager::from_vector(std::vector<int64_t>{2, 0}, {2});
  const double l0 = -std::log(std::exp(3.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0)));
  const double l1 = std::log(3.0);
  EXPECT_NEAR(nn::CrossEntropyLoss()(logits, target).item(), (l0 + l1) / 2, 1e-5);
  EXPECT_NEAR(nn::CrossEntropyLoss("sum")(logits, target).item(), l0 + l1, 1e-5);
  EXPECT_NEAR(nn::MSELoss()(t2({1, 2}, {2}), t2({0, 4}, {2})).item(), 2.5f, 1e-6);
  // BCE with logits: x=0 -> log 2; x=2, y=1 -> log(1 + e^-2).
  EXPECT_NEAR(nn::BCEWithLogitsLoss("sum")(t2({0, 2}, {2}), t2({1, 1}, {2})).item(),
              std::log(2.0) + std::log1p(std::exp(-2.0)), 1e-5);
}

}  // namespace
}  // namespace keel::train
