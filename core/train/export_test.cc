// export_onnx / trace_module: a Conv → ReLU → MaxPool → Flatten → Linear module exported with a dynamic batch runs
// in a Session at another batch size and equals the eager forward; the training mode is restored; export inside an
// autocast scope and an example without a batch dimension are clear errors.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>

#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "core/train/export.h"
#include "core/train/nn.h"

namespace keel::train {
namespace {

using namespace keel::train::nn;

class TinyCNN : public Module {
 public:
  TinyCNN() : Module("TinyCNN") {
    conv = register_module("conv", std::make_shared<Conv2D>(1, 3, 3));
    pool = register_module("pool", std::make_shared<MaxPool2D>(2));
    fc = register_module("fc", std::make_shared<Linear>(3 * 3 * 3, 4));
  }
  Tensor forward(const Tensor& x) override {
    return fc->forward(eager::flatten(pool->forward(eager::relu(conv->forward(x))), 1));
  }
  std::shared_ptr<Conv2D> conv;
  std::shared_ptr<MaxPool2D> pool;
  std::shared_ptr<Linear> fc;
};

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("keel_export_test_" + std::to_string(getpid()) + "_" + name);
}

TEST(ExportOnnx, DynamicBatchRunsInASessionLikeEager) {
  eager::manual_seed(3);
  TinyCNN model;
  model.train();
  const auto path = temp_file("tiny.onnx");
  auto nodes = export_onnx(model, eager::randn({2, 1, 8, 8}), path,
                           {.graph_name = "tiny", .input_name = "image", .output_name = "logits"});
  ASSERT_TRUE(nodes.is_ok()) << nodes.status().to_string();
  EXPECT_GE(*nodes, 5);
  EXPECT_TRUE(model.is_training()) << "the training mode must be restored";
  auto g = load_onnx(path);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  std::filesystem::remove(path);
  ASSERT_TRUE(g->info("image") && g->info("image")->shape);
  EXPECT_LT((*g->info("image")->shape)[0], 0) << "the batch dimension must be dynamic";
  EXPECT_TRUE(g->is_initializer("conv.weight") && g->is_initializer("fc.bias"))
      << "initializers named after parameters";

  Tensor x = eager::randn({5, 1, 8, 8});
  model.eval();
  eager::NoGradGuard ng;
  auto want = model(x).to_vector<float>();
  SessionOptions so;
  so.devices = {"cpu"};
  auto session = Session::create(eager::environment(), *g, so);
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  auto out = (*session)->run({{"image", x.data()}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ(out->at(0).shape(), (Shape{5, 4}));
  const float* got = out->at(0).data<float>();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4f) << i;
}

TEST(ExportOnnx, FixedBatchKeepsTheTracedShape) {
  TinyCNN model;
  auto g = trace_module(model, eager::randn({3, 1, 8, 8}), {.dynamic_batch = false});
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ((*g->info("input")->shape)[0], 3);
}

TEST(ExportOnnx, ClearErrors) {
  TinyCNN model;
  {
    eager::AutocastGuard ac(DType::kBF16);
    auto r = trace_module(model, eager::randn({1, 1, 8, 8}));
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("autocast"), std::string::npos) << r.status().to_string();
  }
  auto r = trace_module(model, Tensor());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("TinyCNN"), std::string::npos) << r.status().to_string();
  auto bad = trace_module(model, eager::randn({1, 2, 8, 8}));  // 2 channels into Conv2D(1, ...)
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("tracing"), std::string::npos) << bad.status().to_string();
  EXPECT_EQ(init_runtime(-1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace keel::train
