// cuda_plugin_test — the CUDA device plugin (plugins/cuda) against the reference CPU kernels, through the device
// conformance suite's cases for the ops the plugin implements. Without a "cuda" device (no GPU, no driver, plugin
// not built) the tests skip with the plugin manager's recorded reason, e.g. "unavailable: no CUDA device: ...".
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>

#include "core/base/graph.h"
#include "core/runtime/environment.h"
#include "core/runtime/session.h"
#include "tests/device_conformance/device_cts.h"

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

#define SKIP_WITHOUT_CUDA()                                         \
  do {                                                              \
    ASSERT_TRUE(envs().dut && envs().oracle);                       \
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

}  // namespace
}  // namespace keel
