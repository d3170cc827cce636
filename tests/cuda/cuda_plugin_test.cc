// cuda_plugin_test — the CUDA device plugin (plugins/cuda) against the reference CPU kernels, through the device
// conformance suite's cases for the ops the plugin implements. Without a "cuda" device (no GPU, no driver, plugin
// not built) the tests skip with the plugin manager's recorded reason, e.g. "unavailable: no CUDA device: ...".
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>

#include "core/runtime/environment.h"
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
                                           "Transpose", "Concat", "Cast", "Where"));

}  // namespace
}  // namespace keel
