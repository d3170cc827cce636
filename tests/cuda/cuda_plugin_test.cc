// cuda_plugin_test — the CUDA device plugin (plugins/cuda) against the reference CPU kernels, through the device
// conformance suite's cases for the ops the plugin implements. Without a "cuda" device (no GPU, no driver, plugin
// not built) the tests skip with the plugin manager's recorded reason, e.g. "unavailable: no CUDA device: ...", but
// for the plugin's two libraries, which are checked either way.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <keel/plugin.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include <cmath>
#include <random>

#include "core/base/graph.h"
#include "core/runtime/environment.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "tools/conformance/device_cts.h"

namespace keel {
namespace {

struct Envs {
  std::unique_ptr<Environment> dut, oracle;
  std::string why_no_cuda;  // empty when a cuda device is present
};

Envs& envs() {
  static Envs e = [] {
    Envs r;
    auto dut = Environment::create();
    EnvironmentOptions o;
    o.discover_plugins = false;
    auto oracle = Environment::create(o);
    if (dut.is_ok()) r.dut = std::move(dut).value();
    if (oracle.is_ok()) r.oracle = std::move(oracle).value();
    if (!r.dut) return r;
    bool present = false;
    for (const std::string& d : r.dut->registry().device_types()) present = present || d == "cuda";
    if (!present) {
      r.why_no_cuda = "the cuda plugin was not found (not built: no CUDA toolkit, or KEEL_CUDA=OFF)";
      for (const auto& p : r.dut->plugins())
        if (p.name == "cuda") r.why_no_cuda = "cuda plugin " + std::string(p.reason.empty() ? "not loaded" : p.reason);
    }
    return r;
  }();
  return e;
}

#define SKIP_WITHOUT_CUDA()                                              \
  do {                                                                   \
    ASSERT_TRUE(envs().dut&& envs().oracle);                             \
    if (!envs().why_no_cuda.empty()) GTEST_SKIP() << envs().why_no_cuda; \
  } while (0)

TEST(CudaPlugin, SkipsWithAReasonOrLoads) {
  ASSERT_TRUE(envs().dut);
  for (const auto& p : envs().dut->plugins()) {
    if (p.name != "cuda") continue;
    // Never "failed": without a GPU the plugin must be skipped with a reason that says so.
    EXPECT_NE(p.state, PluginState::kFailed) << p.reason;
    if (p.state == PluginState::kSkipped) {
      EXPECT_NE(p.reason.find("no CUDA device"), std::string::npos) << p.reason;
    }
  }
  SKIP_WITHOUT_CUDA();
}

// The plugin is two libraries (plugins/cuda/cuda_loader.cc): the manifest's libkeel_cuda.so links the CUDA runtime
// alone and loads libkeel_cuda_kernels.so (cuBLASLt, cuDNN) only once a device is found. Without a device, discovering
// the plugin must not have loaded cuBLASLt (0.3 s of static initialisers per process); with one, it must have.
TEST(CudaPlugin, LoadsCublasLtOnlyWithADevice) {
  ASSERT_TRUE(envs().dut);
  bool listed = false;
  for (const auto& p : envs().dut->plugins()) listed = listed || p.name == "cuda";
  if (!listed) GTEST_SKIP() << envs().why_no_cuda;
  void* cublaslt = dlopen("libcublasLt.so.13", RTLD_LAZY | RTLD_NOLOAD);
  if (cublaslt) dlclose(cublaslt);  // (RTLD_NOLOAD took a reference)
  if (envs().why_no_cuda.empty()) {
    EXPECT_NE(cublaslt, nullptr) << "a cuda device is registered but cuBLASLt is not loaded";
  } else {
    EXPECT_EQ(cublaslt, nullptr) << "cuBLASLt was loaded although the plugin was skipped: " << envs().why_no_cuda;
  }
}

// The plugin proper exports its descriptor under its own name (not keel_plugin_entry: no manifest names it), as the
// "cuda" device plugin; it loads wherever its libraries are present, GPU or not.
TEST(CudaPlugin, KernelsLibraryHoldsThePluginProper) {
  ASSERT_TRUE(envs().dut);
  std::string dir;
  for (const auto& p : envs().dut->plugins())
    if (p.name == "cuda") dir = std::filesystem::path(p.library).parent_path().string();
  if (dir.empty()) GTEST_SKIP() << envs().why_no_cuda;
  const std::string path = dir + "/libkeel_cuda_kernels.so";
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  EXPECT_EQ(dlsym(lib, "keel_plugin_entry"), nullptr);
  auto entry = reinterpret_cast<keel_plugin_entry_fn>(dlsym(lib, "keel_cuda_kernels_entry"));
  ASSERT_NE(entry, nullptr);
  const keel_plugin_t* d = entry();
  ASSERT_NE(d, nullptr);
  EXPECT_STREQ(d->name, "cuda");
  EXPECT_EQ(d->kind, KEEL_PLUGIN_KIND_DEVICE);
  EXPECT_NE(d->init, nullptr);
  EXPECT_EQ(d->abi_major, KEEL_PLUGIN_ABI_MAJOR);
}

// The ops the plugin implements natively, each against the reference kernels on the CPU.
class CudaOps : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaOps, MatchReference) {
  SKIP_WITHOUT_CUDA();
  cts::Options o;
  o.device = "cuda";
  o.op = GetParam();
  o.kernel_prefix = "cuda_";
  o.out = &std::cout;
  cts::Report r = cts::run(*envs().dut, *envs().oracle, o);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.errors, 0);
  EXPECT_GT(r.native, 0) << "no " << GetParam() << " case ran on a cuda_ kernel";
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaOps,
                         ::testing::Values("Relu", "Sigmoid", "Tanh", "Add", "Mul", "Div", "Softmax", "MatMul", "Gemm",
                                           "Transpose", "Concat", "Cast", "Where", "Clip", "ReduceSum", "ReduceMean",
                                           "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare", "ReduceL1",
                                           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin",
                                           "LayerNormalization", "Gather", "Slice", "Expand", "Pad", "Split", "Resize",
                                           "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Gelu"));
// The training kernels (cuda_train_ops.cc): the backward ops the gradient rules emit, the loss, batch-norm training.
INSTANTIATE_TEST_SUITE_P(Training, CudaOps,
                         ::testing::Values("ConvGrad", "MaxPoolGrad", "AveragePoolGrad", "ReluGrad", "SigmoidGrad",
                                           "TanhGrad", "GeluGrad", "LeakyReluGrad", "SoftmaxCrossEntropyLoss",
                                           "SoftmaxCrossEntropyLossGrad", "BatchNormTraining", "BatchNormGrad",
                                           "LayerNormGrad", "GatherGrad", "DropoutMask", "Momentum", "AdamStep",
                                           "CheckFiniteAndUnscale"));

// Run-time errors of the plugin's kernels are statuses, not crashes: Gather indices out of range, as a constant
// (checked on the host) and as an input (checked on the device, read back after the kernel).
TEST(CudaPlugin, GatherIndexOutOfRangeIsAnError) {
  SKIP_WITHOUT_CUDA();
  for (bool constant : {true, false}) {
    GraphBuilder gb("gather_oob", 13);
    std::string x = gb.input("x", DType::kF32, {4, 3});
    Tensor idx = Tensor::host(DType::kI64, {2}).value();
    idx.data<int64_t>()[0] = 1;
    idx.data<int64_t>()[1] = 4;  // out of range for a dimension of 4
    std::string i = constant ? gb.constant("i", idx) : gb.input("i", DType::kI64, {2});
    gb.output(gb.op1("Gather", {x, i}, {{"axis", Attribute::of_int(0)}}));
    SessionOptions so;
    so.devices = {"cuda"};
    so.fallback = Fallback::kError;
    auto s = Session::create(*envs().dut, gb.take(), so);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    Tensor xv = Tensor::host(DType::kF32, {4, 3}).value();
    for (int k = 0; k < 12; ++k) xv.data<float>()[k] = static_cast<float>(k);
    std::vector<std::pair<std::string, Tensor>> feeds = {{"x", xv}};
    if (!constant) feeds.emplace_back("i", idx);
    auto out = (*s)->run(feeds);
    ASSERT_FALSE(out.is_ok()) << (constant ? "constant" : "input") << " indices";
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << out.status().to_string();
    EXPECT_NE(out.status().message().find("out of range"), std::string::npos) << out.status().to_string();
    // The device is still usable afterwards: in-range indices run.
    idx.data<int64_t>()[1] = -4;
    if (!constant) {
      feeds.back().second = idx;
      auto ok = (*s)->run(feeds);
      ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
      EXPECT_EQ((*ok)[0].data<float>()[3], 0.f);  // row -4 = row 0
    }
  }
}

// Device memory of a cuda session comes from the core's caching allocator: visible in memory_stats as "cuda:0",
// reused across runs (cache hits), and given back by trim once the session is gone.
TEST(CudaPlugin, DeviceMemoryIsPooled) {
  SKIP_WITHOUT_CUDA();
  {
    GraphBuilder gb("pool", 13);
    std::string x = gb.input("x", DType::kF32, {64, 1024});
    gb.output(gb.op1("Relu", {gb.op1("Add", {x, x})}));
    SessionOptions so;
    so.devices = {"cuda"};
    auto s = Session::create(*envs().dut, gb.take(), so);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    Tensor xv = Tensor::host(DType::kF32, {64, 1024}).value();
    for (int64_t k = 0; k < xv.numel(); ++k) xv.data<float>()[k] = static_cast<float>(k % 7) - 3.f;
    for (int run = 0; run < 3; ++run) {
      auto out = (*s)->run({{"x", xv}});
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      EXPECT_EQ((*out)[0].data<float>()[0], 0.f);  // relu(2 * -3)
      EXPECT_EQ((*out)[0].data<float>()[4], 2.f);  // relu(2 * 1)
    }
    auto stats = envs().dut->memory_stats();
    ASSERT_TRUE(stats.count("cuda:0"));
    const AllocatorStats& c = stats["cuda:0"];
    EXPECT_GT(c.allocations, 0u);
    EXPECT_GT(c.cache_hits, 0u) << "later runs reuse pooled device blocks";
    EXPECT_GT(c.reserved_bytes, 0u);
    EXPECT_GE(c.reserved_bytes, c.in_use_bytes);
  }
  envs().dut->trim_memory();
  auto after = envs().dut->memory_stats()["cuda:0"];
  EXPECT_EQ(after.in_use_bytes, 0u) << "the session is gone";
  EXPECT_EQ(after.reserved_bytes, 0u) << "trim gave every free segment back";
  EXPECT_EQ(after.segments, 0u);
}

// The cuDNN / cuBLASLt kernels (cuda_dnn.cc, cuda_blas.cc), each op's cases including the f16 / bf16 ones.
INSTANTIATE_TEST_SUITE_P(DnnOps, CudaOps,
                         ::testing::Values("Conv", "FusedConv", "ConvTranspose", "MaxPool", "AveragePool",
                                           "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "FusedMatMul",
                                           "FusedGemm"));

Tensor random_tensor(Shape shape, uint32_t seed, float lo, float hi) {
  Tensor t = Tensor::host(DType::kF32, std::move(shape)).value();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// A small CNN as an ONNX model: Conv -> BatchNormalization -> Relu -> MaxPool -> Conv -> Relu -> GlobalAveragePool
// -> Flatten -> Gemm, serialized and loaded back through the ONNX importer.
StatusOr<Graph> small_cnn() {
  GraphBuilder b("small_cnn", 15);
  auto ints = [](std::vector<int64_t> v) { return Attribute::of_ints(std::move(v)); };
  std::string x = b.input("X", DType::kF32, {2, 3, 32, 32});
  std::string w1 = b.constant("W1", random_tensor({16, 3, 3, 3}, 1, -0.4f, 0.4f));
  std::string b1 = b.constant("B1", random_tensor({16}, 2, -0.1f, 0.1f));
  std::string c1 = b.op1("Conv", {x, w1, b1}, {{"kernel_shape", ints({3, 3})}, {"pads", ints({1, 1, 1, 1})}});
  std::string bn = b.op1(
      "BatchNormalization",
      {c1, b.constant("S", random_tensor({16}, 3, 0.5f, 1.5f)), b.constant("T", random_tensor({16}, 4, -0.2f, 0.2f)),
       b.constant("M", random_tensor({16}, 5, -0.2f, 0.2f)), b.constant("V", random_tensor({16}, 6, 0.5f, 2.f))},
      {{"epsilon", Attribute::of_float(1e-5f)}});
  std::string r1 = b.op1("Relu", {bn});
  std::string p1 = b.op1("MaxPool", {r1}, {{"kernel_shape", ints({2, 2})}, {"strides", ints({2, 2})}});
  std::string w2 = b.constant("W2", random_tensor({32, 16, 3, 3}, 7, -0.2f, 0.2f));
  std::string b2 = b.constant("B2", random_tensor({32}, 8, -0.1f, 0.1f));
  std::string c2 = b.op1("Conv", {p1, w2, b2},
                         {{"kernel_shape", ints({3, 3})}, {"strides", ints({2, 2})}, {"pads", ints({1, 1, 1, 1})}});
  std::string r2 = b.op1("Relu", {c2});
  std::string gap = b.op1("GlobalAveragePool", {r2});
  std::string flat = b.op1("Flatten", {gap}, {{"axis", Attribute::of_int(1)}});
  std::string wf = b.constant("WF", random_tensor({10, 32}, 9, -0.3f, 0.3f));
  std::string bf = b.constant("BF", random_tensor({10}, 10, -0.1f, 0.1f));
  b.output(b.op1("Gemm", {flat, wf, bf}, {{"transB", Attribute::of_int(1)}}));
  KEEL_ASSIGN_OR_RETURN(std::string bytes, serialize_onnx(b.take()), "serialize small_cnn");
  return load_onnx_from_memory(bytes.data(), bytes.size(), {});
}

// Runs small_cnn on `device` (the CPU takes what it cannot) with `passes`, and on the reference CPU; the outputs
// must agree within rtol 1e-3 (f32, no TF32). Returns the kernels that ran, "op:kernel" each.
void run_small_cnn(const std::vector<std::string>& passes, std::vector<std::string>* kernels) {
  auto g = small_cnn();
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto g2 = small_cnn();
  ASSERT_TRUE(g2.is_ok()) << g2.status().to_string();
  const Tensor x = random_tensor({2, 3, 32, 32}, 11, -1.f, 1.f);
  SessionOptions so;
  so.devices = {"cuda"};
  so.passes = passes;
  auto s = Session::create(*envs().dut, std::move(g).value(), so);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  auto ref = Session::create(*envs().oracle, std::move(g2).value(), SessionOptions{});
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  for (const auto& [node, op, dev, kernel] : (*s)->placement()) kernels->push_back(op + ":" + kernel);
  auto got = (*s)->run({{"X", x}});
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  auto want = (*ref)->run({{"X", x}});
  ASSERT_TRUE(want.is_ok()) << want.status().to_string();
  ASSERT_EQ((*got)[0].shape(), (Shape{2, 10}));
  ASSERT_EQ((*want)[0].shape(), (Shape{2, 10}));
  const float* a = (*got)[0].data<float>();
  const float* e = (*want)[0].data<float>();
  for (int64_t i = 0; i < 20; ++i) EXPECT_NEAR(a[i], e[i], 1e-4 + 1e-3 * std::fabs(e[i])) << "output " << i;
}

bool ran_on(const std::vector<std::string>& kernels, const std::string& op, const std::string& kernel) {
  for (const auto& k : kernels)
    if (k == op + ":" + kernel) return true;
  return false;
}

TEST(CudaPlugin, SmallCnnMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  std::vector<std::string> kernels;
  run_small_cnn({}, &kernels);
  EXPECT_TRUE(ran_on(kernels, "Conv", "cuda_cudnn_conv"));
  EXPECT_TRUE(ran_on(kernels, "BatchNormalization", "cuda_batch_norm"));
  EXPECT_TRUE(ran_on(kernels, "MaxPool", "cuda_cudnn_max_pool"));
  EXPECT_TRUE(ran_on(kernels, "GlobalAveragePool", "cuda_cudnn_global_average_pool"));
  EXPECT_TRUE(ran_on(kernels, "Gemm", "cuda_cublaslt_gemm"));
}

// The same model after the fusion passes: BatchNormalization folded into the Conv, Conv + Relu as keel.FusedConv
// (cudnnConvolutionBiasActivationForward).
TEST(CudaPlugin, SmallCnnFusedMatchesCpu) {
  SKIP_WITHOUT_CUDA();
  std::vector<std::string> kernels;
  run_small_cnn({"fuse_conv_bn", "fuse_conv_activation", "fuse_matmul_activation"}, &kernels);
  EXPECT_TRUE(ran_on(kernels, "FusedConv", "cuda_cudnn_fused_conv"));
}

}  // namespace
}  // namespace keel
