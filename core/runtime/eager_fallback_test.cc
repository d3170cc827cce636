// Eager ops on a device that lacks kernels: a call the device has no kernel for runs on the CPU (inputs copied to the
// host, outputs back to the device), with one warning per op type; results and gradients equal the CPU's and stay on
// the device. A test plugin exposes one device of type "acc" in its own memory (the core treats it as device memory,
// as it does CUDA's; tests/common/fake_device.h) with two kernels, Relu and an f32-only MatMul; no GPU is needed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/base/log.h"
#include "core/runtime/eager.h"
#include "tests/common/fake_device.h"

namespace keel {
namespace {

const keel_core_api_t* g_host = nullptr;
testkit::FakeDevice g_acc;  // type "acc": Relu (testkit::fake_relu) and an f32-only MatMul
std::mutex g_mu;
int g_matmul_runs = 0;

// [M,K] x [K,N] in f32 only (its type constraint says so), for autocast's choice of dtype on a device.
keel_status_t acc_matmul(void*, keel_kernel_context_t* ctx) {
  const keel_kernel_api_t* k = g_host->kernel;
  const keel_tensor_t* a = k->input(ctx, 0);
  const keel_tensor_t* b = k->input(ctx, 1);
  if (a->dtype != KEEL_DTYPE_F32 || b->dtype != KEEL_DTYPE_F32 || a->ndim != 2 || b->ndim != 2 ||
      a->dims[1] != b->dims[0])
    return g_host->status_create(KEEL_STATUS_UNIMPLEMENTED, "acc: 2-D f32 MatMul only");
  const int64_t m = a->dims[0], kk = a->dims[1], n = b->dims[1];
  const int64_t dims[2] = {m, n};
  keel_tensor_t* y = nullptr;
  if (keel_status_t st = k->output(ctx, 0, 2, dims, &y)) return st;
  const float* pa = static_cast<const float*>(a->data);
  const float* pb = static_cast<const float*>(b->data);
  float* py = static_cast<float*>(y->data);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0;
      for (int64_t p = 0; p < kk; ++p) acc += pa[i * kk + p] * pb[p * n + j];
      py[i * n + j] = acc;
    }
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_matmul_runs;
  return nullptr;
}
const int32_t kAccF32[] = {KEEL_DTYPE_F32};
const keel_type_constraint_t kAccF32Only[] = {{KEEL_TYPE_CONSTRAINT_HEADER, "T", kAccF32, 1}};

keel_status_t acc_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  g_host = host;
  g_acc.type = "acc";
  g_acc.host = host;
  const keel_device_table_t t = g_acc.table();
  if (keel_status_t st = host->register_device(plugin, &t)) return st;
  keel_kernel_def_t k = testkit::kernel_def("acc_relu", "Relu", 1, "acc", testkit::fake_relu);
  k.user_data = &g_acc;
  if (keel_status_t st = host->register_kernel(plugin, &k)) return st;
  k = testkit::kernel_def("acc_matmul_f32", "MatMul", 13, "acc", acc_matmul);
  k.constraints = kAccF32Only;
  k.constraint_count = 1;
  return host->register_kernel(plugin, &k);
}
const keel_plugin_t kAccPlugin = testkit::device_plugin("acc", acc_init);

class EagerFallback : public ::testing::Test {
 protected:
  void SetUp() override {
    g_acc.reset_counts();
    EnvironmentOptions o;
    o.discover_plugins = false;
    o.threads = 1;
    o.builtin_plugins.push_back({&kAccPlugin, 10, "a device with only Relu"});
    auto env = Environment::create(o);
    ASSERT_TRUE(env.is_ok()) << env.status().to_string();
    eager::init(std::shared_ptr<Environment>(std::move(env).value()));
  }
  void TearDown() override { eager::init(nullptr); }

  // Warnings logged on this thread while `f` runs.
  template <class F>
  std::vector<std::string> warnings_of(F&& f) {
    std::vector<std::string> got;
    log::Target target(
        [&](int32_t level, const std::string& m) {
          if (level >= 3) got.push_back(m);
        },
        0);
    log::Scope scope(&target);
    f();
    return got;
  }
};

int count_with(const std::vector<std::string>& v, const std::string& what) {
  int n = 0;
  for (const auto& s : v) n += s.find(what) != std::string::npos ? 1 : 0;
  return n;
}

TEST_F(EagerFallback, MissingOpsRunOnTheCpuWithOneWarningPerOpTypeAndResultsStayOnTheDevice) {
  const std::vector<float> xs = {-1.5f, -0.25f, 0.f, 0.5f, 1.f, 2.f};
  eager::Tensor x = eager::from_vector(xs, {2, 3}).to("acc");
  ASSERT_EQ(x.device(), "acc");
  eager::Tensor y;
  std::vector<std::string> warned = warnings_of([&] {
    for (int i = 0; i < 3; ++i) y = eager::exp(eager::relu(x)) + x;  // Relu on acc; Exp and Add fall back
  });
  EXPECT_EQ(count_with(warned, "Exp has no kernel on acc"), 1) << ::testing::PrintToString(warned);
  EXPECT_EQ(count_with(warned, "Add has no kernel on acc"), 1) << ::testing::PrintToString(warned);
  EXPECT_EQ(count_with(warned, "Relu"), 0) << "Relu has a kernel on acc";
  { EXPECT_EQ(g_acc.relu_runs_on(0), 3); }
  EXPECT_EQ(y.device(), "acc");
  std::vector<float> got = y.to_vector<float>();
  ASSERT_EQ(got.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_FLOAT_EQ(got[i], std::exp(xs[i] > 0 ? xs[i] : 0.f) + xs[i]) << i;
}

// cached_constant (the fused optimizers' per-step scalars): a value is uploaded to the device once, then shared; a new
// value is one more upload; what comes back is the value, on the device; a tensor above 256 bytes is a plain copy.
TEST_F(EagerFallback, CachedConstantsAreUploadedOncePerValue) {
  const int before = g_acc.copies_of("H2D");
  eager::Tensor a = eager::cached_constant(eager::full({}, 0.125f, DType::kF32, "cpu"), "acc");
  eager::Tensor b = eager::cached_constant(eager::full({}, 0.125f, DType::kF32, "cpu"), "acc");
  EXPECT_EQ(g_acc.copies_of("H2D") - before, 1) << "the same value again: no upload";
  EXPECT_EQ(a.device(), "acc");
  EXPECT_EQ(a.data().raw_data(), b.data().raw_data());
  eager::Tensor c = eager::cached_constant(eager::full({}, 0.25f, DType::kF32, "cpu"), "acc");
  EXPECT_EQ(g_acc.copies_of("H2D") - before, 2) << "a new value: one upload";
  EXPECT_EQ(c.item(), 0.25f);
  EXPECT_EQ(b.item(), 0.125f);
  eager::Tensor i = eager::cached_constant(eager::full({}, 1.f, DType::kI64, "cpu"), "acc");
  EXPECT_EQ(i.dtype(), DType::kI64);
  EXPECT_EQ(i.to_vector<int64_t>(), std::vector<int64_t>{1});
  const int big_before = g_acc.copies_of("H2D");
  for (int k = 0; k < 2; ++k) (void)eager::cached_constant(eager::full({100}, 1.f, DType::kF32, "cpu"), "acc");
  EXPECT_EQ(g_acc.copies_of("H2D") - big_before, 2) << "400 bytes: copied each time, not cached";
}

TEST_F(EagerFallback, GradientsThroughFallenBackOpsEqualTheCpusAndLandOnTheDevice) {
  const std::vector<float> xs = {-2.f, -0.5f, 0.25f, 1.f, 3.f, 0.75f};
  eager::Tensor x = eager::from_vector(xs, {3, 2}).to("acc").detach();
  x.requires_grad_();
  // Mul, ReduceSum and the keel.ReluGrad of backward have no acc kernel.
  eager::Tensor loss = eager::sum(eager::relu(x) * x);
  EXPECT_EQ(loss.device(), "acc");
  loss.backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().device(), "acc");
  // d/dx relu(x) * x = 2x for x > 0, 0 otherwise.
  std::vector<float> g = x.grad().to_vector<float>();
  ASSERT_EQ(g.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i) EXPECT_FLOAT_EQ(g[i], xs[i] > 0 ? 2 * xs[i] : 0.f) << i;
  float want = 0;
  for (float v : xs) want += v > 0 ? v * v : 0;
  EXPECT_FLOAT_EQ(loss.item(), want);
}

TEST_F(EagerFallback, AnOpWithOnlyShapeInputsOnTheDefaultDeviceFallsBackToo) {
  eager::Tensor shape = eager::from_vector(std::vector<int64_t>{2, 3}, {2});  // on the host: a shape input
  eager::set_device("acc");
  std::vector<eager::Tensor> out;
  std::vector<std::string> warned = warnings_of([&] { out = eager::call_op("", "ConstantOfShape", {shape}); });
  eager::set_device("cpu");
  EXPECT_EQ(count_with(warned, "ConstantOfShape has no kernel on acc"), 1) << ::testing::PrintToString(warned);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].device(), "acc");
  EXPECT_EQ(out[0].to_vector<float>(), std::vector<float>(6, 0.f));
}

// Autocast asks the device's kernels through the dispatch module's acceptance: acc's MatMul takes f32 only, so under
// bf16 autocast a MatMul on acc runs there in f32 (said once), not in bf16 on the CPU; the CPU takes bf16.
TEST_F(EagerFallback, AutocastKeepsAnOpInF32OnADeviceWhoseKernelTakesNoLowPrecision) {
  const std::vector<float> as = {1, 2, 3, 4, 5, 6}, bs = {0.5f, -1, 2, 0.25f, -0.75f, 1.5f};
  const std::vector<float> want = {2.25f, 4, 7.5f, 6.25f};  // [2,3] x [3,2]
  eager::Tensor a = eager::from_vector(as, {2, 3}).to("acc");
  eager::Tensor b = eager::from_vector(bs, {3, 2}).to("acc");
  eager::Tensor y;
  std::vector<std::string> said;
  {
    log::Target target([&](int32_t, const std::string& m) { said.push_back(m); }, 0);
    log::Scope scope(&target);
    eager::AutocastGuard ac(DType::kBF16);
    for (int i = 0; i < 2; ++i) y = eager::matmul(a, b);
  }
  EXPECT_EQ(count_with(said, "autocast: no bf16 kernel for MatMul on acc"), 1) << ::testing::PrintToString(said);
  EXPECT_EQ(count_with(said, "MatMul has no kernel on acc"), 0) << ::testing::PrintToString(said);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    EXPECT_EQ(g_matmul_runs, 2);
  }
  EXPECT_EQ(y.device(), "acc");
  EXPECT_EQ(y.dtype(), DType::kF32);
  EXPECT_EQ(y.to_vector<float>(), want);

  eager::AutocastGuard ac(DType::kBF16);
  eager::Tensor on_cpu = eager::matmul(eager::from_vector(as, {2, 3}), eager::from_vector(bs, {3, 2}));
  EXPECT_EQ(on_cpu.dtype(), DType::kBF16) << "the CPU has bf16 MatMul kernels";
}

TEST_F(EagerFallback, BadInputIsStillAnErrorNotAFallback) {
  eager::Tensor a = eager::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).to("acc");
  eager::Tensor b = eager::from_vector(std::vector<float>{1, 2, 3, 4}, {4}).to("acc");
  try {
    (void)(a - b);
    FAIL() << "shapes [2,3] and [4] do not broadcast";
  } catch (const eager::Error& e) {
    EXPECT_NE(e.status().code(), StatusCode::kUnimplemented) << e.what();
    EXPECT_NE(std::string(e.what()).find("Sub"), std::string::npos) << e.what();
  }
}

// Eager's thread choice per op (eager_dispatch.cc, pool_for): an op whose inputs hold less than 4 MiB runs its kernel
// with one thread (a parallel region costs more than it saves there: SimpleCNN's training step ran 1.03 ms on two
// threads against 0.76 on one), a larger one with the runtime's pool. A Relu kernel on the CPU, ahead of every other
// one, records the thread count its context gives it.
std::mutex g_probe_mu;
std::vector<int32_t> g_probe_threads;

keel_status_t probe_relu(void*, keel_kernel_context_t* ctx) {
  const keel_kernel_api_t* k = g_host->kernel;
  const keel_tensor_t* x = k->input(ctx, 0);
  if (x->dtype != KEEL_DTYPE_F32) return g_host->status_create(KEEL_STATUS_UNIMPLEMENTED, "probe: f32 only");
  keel_tensor_t* y = nullptr;
  if (keel_status_t st = k->output(ctx, 0, x->ndim, x->dims, &y)) return st;
  int64_t n = 1;
  for (int32_t i = 0; i < x->ndim; ++i) n *= x->dims[i];
  const auto* px = static_cast<const float*>(x->data);
  auto* py = static_cast<float*>(y->data);
  for (int64_t i = 0; i < n; ++i) py[i] = px[i] > 0 ? px[i] : 0.f;
  std::lock_guard<std::mutex> lock(g_probe_mu);
  g_probe_threads.push_back(k->thread_count(ctx));
  return nullptr;
}

keel_status_t probe_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  g_host = host;
  keel_kernel_def_t k = testkit::kernel_def("probe_relu", "Relu", 1, "cpu", probe_relu);
  return host->register_kernel(plugin, &k);
}
const keel_plugin_t kProbePlugin = testkit::device_plugin("probe", probe_init);

TEST(EagerThreads, SmallOpsRunOnOneThreadLargeOnesOnThePool) {
  if (std::getenv("KEEL_EAGER_SERIAL_BYTES")) GTEST_SKIP() << "KEEL_EAGER_SERIAL_BYTES is set";
  EnvironmentOptions o;
  o.discover_plugins = false;
  o.threads = 2;
  o.builtin_plugins.push_back({&kProbePlugin, 1000, "a Relu that records its thread count"});
  auto env = Environment::create(o);
  ASSERT_TRUE(env.is_ok()) << env.status().to_string();
  eager::init(std::shared_ptr<Environment>(std::move(env).value()));
  {
    std::lock_guard<std::mutex> lock(g_probe_mu);
    g_probe_threads.clear();
  }
  {                                              // (the tensors go before their environment does)
    const int64_t big = (int64_t{4} << 20) / 4;  // f32 elements in 4 MiB: the first size on the pool
    eager::Tensor small = eager::relu(eager::full({big - 16}, -1.f));
    eager::Tensor large = eager::relu(eager::full({big}, 2.f));
    EXPECT_EQ(small.to_vector<float>()[0], 0.f);
    EXPECT_EQ(large.to_vector<float>()[big - 1], 2.f);
  }
  {
    std::lock_guard<std::mutex> lock(g_probe_mu);
    EXPECT_EQ(g_probe_threads, (std::vector<int32_t>{1, 2}));
  }
  eager::init(nullptr);
}

}  // namespace
}  // namespace keel
