// OnnxModule: an exported model loads as a trainable module that computes what the original computes, trains (loss
// falls), freezes by pattern, takes a new classifier, and exports again to a model that runs in a Session.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>

#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "core/train/export.h"
#include "core/train/onnx_module.h"
#include "core/train/optim.h"

namespace keel::train {
namespace {

using namespace keel::train::nn;

class SmallCNN : public Module {
 public:
  SmallCNN() : Module("SmallCNN") {
    conv = register_module("conv", std::make_shared<Conv2D>(1, 3, 3));
    fc = register_module("fc", std::make_shared<Linear>(3 * 3 * 3, 4));
  }
  Tensor forward(const Tensor& x) override {
    return fc->forward(eager::flatten(eager::max_pool2d(eager::relu(conv->forward(x)), {2, 2}), 1));
  }
  std::shared_ptr<Conv2D> conv;
  std::shared_ptr<Linear> fc;
};

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("keel_onnx_module_test_" + std::to_string(getpid()) + "_" + name);
}

std::shared_ptr<OnnxModule> exported(SmallCNN& model) {
  const auto path = temp_file("small.onnx");
  auto st = export_onnx(model, eager::randn({2, 1, 8, 8}), path);
  EXPECT_TRUE(st.is_ok()) << st.status().to_string();
  auto m = OnnxModule::load(path);
  std::filesystem::remove(path);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return m.is_ok() ? *m : nullptr;
}

TEST(OnnxModule, ComputesWhatTheExportedModelComputes) {
  eager::manual_seed(11);
  SmallCNN model;
  auto m = exported(model);
  ASSERT_TRUE(m);
  // Parameters keep the exporter's names, as a module path.
  std::vector<std::string> names;
  for (const auto& [n, p] : m->named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"conv.bias", "conv.weight", "fc.bias", "fc.weight"}));
  Tensor x = eager::randn({3, 1, 8, 8});
  eager::NoGradGuard ng;
  auto want = model(x).to_vector<float>(), got = (*m)(x).to_vector<float>();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5f);
}

TEST(OnnxModule, FineTunesWithAFrozenBackboneAndANewHead) {
  eager::manual_seed(12);
  SmallCNN model;
  auto m = exported(model);
  ASSERT_TRUE(m);
  auto frozen = m->freeze("^conv\\.");
  ASSERT_TRUE(frozen.is_ok()) << frozen.status().to_string();
  EXPECT_EQ(*frozen, 2);
  auto head = m->replace_head(2);
  ASSERT_TRUE(head.is_ok()) << head.status().to_string();
  EXPECT_EQ(*head, (std::vector<std::string>{"fc.weight", "fc.bias"}));
  auto trainable = m->trainable_parameters();
  ASSERT_EQ(trainable.size(), 2u);
  const auto conv_before = m->named_parameters()[1].second.to_vector<float>();  // conv.weight

  // Two classes: bright top half vs bright bottom half.
  std::vector<float> xs(16 * 64, 0.f);
  std::vector<int64_t> ys(16);
  for (int i = 0; i < 16; ++i) {
    ys[i] = i % 2;
    for (int r = 0; r < 8; ++r)
      for (int q = 0; q < 8; ++q) xs[i * 64 + r * 8 + q] = ((r < 4) == (i % 2 == 0)) ? 1.f : 0.f;
  }
  Tensor x = eager::from_vector(xs, {16, 1, 8, 8}), y = eager::from_vector(ys, {16});
  SGD opt(trainable, SGDOptions{.lr = 0.5, .momentum = 0.9});
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    Tensor loss = eager::cross_entropy((*m)(x), y);
    if (step == 0) first = loss.item();
    last = loss.item();
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
  EXPECT_LT(last, first * 0.5f) << "first " << first << " last " << last;
  EXPECT_EQ(m->named_parameters()[1].second.to_vector<float>(), conv_before) << "a frozen parameter changed";

  // Export again: the new head's shape, equal outputs in a Session.
  const auto path = temp_file("tuned.onnx");
  ASSERT_TRUE(export_onnx(*m, x, path).is_ok());
  auto g = load_onnx(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  SessionOptions so;
  so.devices = {"cpu"};
  auto session = Session::create(eager::environment(), *g, so);
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  auto out = (*session)->run({{g->inputs.at(0), x.data()}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ(out->at(0).shape(), (Shape{16, 2}));
  eager::NoGradGuard ng;
  auto want = (*m)(x).to_vector<float>();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out->at(0).data<float>()[i], want[i], 1e-4f);
}

TEST(OnnxModule, ClearErrors) {
  SmallCNN model;
  auto m = exported(model);
  ASSERT_TRUE(m);
  auto none = m->freeze("^nothing");
  ASSERT_FALSE(none.is_ok());
  EXPECT_NE(none.status().message().find("conv.weight"), std::string::npos) << none.status().to_string();
  EXPECT_FALSE(m->freeze("([").is_ok());
  EXPECT_FALSE(m->replace_head(0).is_ok());
  EXPECT_THROW((*m)(eager::randn({1, 2, 8, 8})), eager::Error);  // two channels into a one-channel Conv
  EXPECT_EQ(OnnxModule::load(temp_file("missing.onnx")).status().code() == StatusCode::kOk, false);
}

}  // namespace
}  // namespace keel::train
