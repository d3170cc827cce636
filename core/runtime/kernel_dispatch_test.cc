// Kernel dispatch (kernel_dispatch.h): acceptance by dtype, the order candidates are tried in, rejection versus
// failure at create, and the fall-through after a run-time rejection — the same in a Session and in eager ops.
//
// A test plugin registers four Relu kernels on the CPU, above the reference kernels (ranked in registration order):
//   t_rejects   no constraints; compute always rejects (UNIMPLEMENTED), so the fall-through starts
//   t_f64_only  T = f64 only: never the one for an f32 call, even as an alternative
//   t_broken    create fails with INTERNAL when `g_broken_create` is set (a failure, not a rejection), else accepts
//   t_f32       T = f32; computes Relu
#include "core/runtime/kernel_dispatch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/runtime/eager.h"
#include "core/runtime/kernel_context.h"
#include "core/runtime/session.h"
#include "tests/common/fake_device.h"

namespace keel {
namespace {

const keel_core_api_t* g_host = nullptr;
std::atomic<int> g_f64_runs{0}, g_f32_runs{0}, g_broken_runs{0};
std::atomic<bool> g_broken_create{false};

keel_status_t rejects(void*, keel_kernel_context_t*) {
  return g_host->status_create(KEEL_STATUS_UNIMPLEMENTED, "t_rejects: never");
}

keel_status_t relu_f32(keel_kernel_context_t* ctx) {
  const keel_kernel_api_t* k = g_host->kernel;
  const keel_tensor_t* x = k->input(ctx, 0);
  keel_tensor_t* y = nullptr;
  if (keel_status_t st = k->output(ctx, 0, x->ndim, x->dims, &y)) return st;
  const float* in = static_cast<const float*>(x->data);
  float* out = static_cast<float*>(y->data);
  for (uint64_t i = 0; i < x->byte_size / sizeof(float); ++i) out[i] = in[i] > 0 ? in[i] : 0;
  return nullptr;
}
keel_status_t f32_compute(void*, keel_kernel_context_t* ctx) {
  ++g_f32_runs;
  return relu_f32(ctx);
}
// Reads its input as f64: run on f32 data it would read past the end (what acceptance must prevent).
keel_status_t f64_compute(void*, keel_kernel_context_t* ctx) {
  ++g_f64_runs;
  const keel_tensor_t* x = g_host->kernel->input(ctx, 0);
  if (x->dtype != KEEL_DTYPE_F64) return g_host->status_create(KEEL_STATUS_INTERNAL, "t_f64_only ran on non-f64");
  return g_host->status_create(KEEL_STATUS_INTERNAL, "t_f64_only is not meant to run in this test");
}
keel_status_t broken_create(void*, keel_kernel_context_t*, void** out_state) {
  *out_state = nullptr;
  if (g_broken_create) return g_host->status_create(KEEL_STATUS_INTERNAL, "t_broken: create failed");
  return g_host->status_create(KEEL_STATUS_UNIMPLEMENTED, "t_broken: not this time");
}
keel_status_t broken_compute(void*, keel_kernel_context_t*) {
  ++g_broken_runs;
  return g_host->status_create(KEEL_STATUS_INTERNAL, "t_broken ran");
}

const int32_t kF32[] = {KEEL_DTYPE_F32};
const int32_t kF64[] = {KEEL_DTYPE_F64};
const keel_type_constraint_t kOnlyF32[] = {{KEEL_TYPE_CONSTRAINT_HEADER, "T", kF32, 1}};
const keel_type_constraint_t kOnlyF64[] = {{KEEL_TYPE_CONSTRAINT_HEADER, "T", kF64, 1}};

keel_status_t add_relu(const keel_core_api_t* host, keel_plugin_handle_t* plugin, const char* name,
                       const keel_type_constraint_t* constraints,
                       keel_status_t (*create)(void*, keel_kernel_context_t*, void**),
                       keel_status_t (*compute)(void*, keel_kernel_context_t*)) {
  keel_kernel_def_t k = testkit::kernel_def(name, "Relu", 1, "cpu", compute);
  k.constraints = constraints;
  k.constraint_count = constraints ? 1 : 0;
  k.create = create;
  return host->register_kernel(plugin, &k);
}

keel_status_t test_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  g_host = host;
  if (keel_status_t st = add_relu(host, plugin, "t_rejects", nullptr, nullptr, rejects)) return st;
  if (keel_status_t st = add_relu(host, plugin, "t_f64_only", kOnlyF64, nullptr, f64_compute)) return st;
  if (keel_status_t st = add_relu(host, plugin, "t_broken", nullptr, broken_create, broken_compute)) return st;
  return add_relu(host, plugin, "t_f32", kOnlyF32, nullptr, f32_compute);
}

const keel_plugin_t kTestPlugin = testkit::device_plugin("dispatch_test", test_init);

class Dispatch : public ::testing::Test {
 protected:
  void SetUp() override {
    g_f64_runs = g_f32_runs = g_broken_runs = 0;
    g_broken_create = false;
    EnvironmentOptions o;
    o.discover_plugins = false;
    o.threads = 1;
    o.builtin_plugins.push_back({&kTestPlugin, 100, "Relu kernels above the reference"});
    auto env = Environment::create(o);
    ASSERT_TRUE(env.is_ok()) << env.status().to_string();
    env_ = std::shared_ptr<Environment>(std::move(env).value());
  }
  void TearDown() override { eager::init(nullptr); }

  Node relu_node() const {
    Node n;
    n.name = "r";
    n.op_type = "Relu";
    n.inputs = {"x"};
    n.outputs = {"y"};
    return n;
  }
  std::vector<const KernelEntry*> candidates() const {
    return dispatch::ranked_kernels(env_->registry(), relu_node(), 17, "cpu");
  }

  std::shared_ptr<Environment> env_;
};

std::vector<std::string> names(const std::vector<const KernelEntry*>& ks) {
  std::vector<std::string> out;
  for (const auto* k : ks) out.push_back(k->name);
  return out;
}

TEST_F(Dispatch, RanksByPriorityThenRegistrationOrder) {
  std::vector<std::string> got = names(candidates());
  ASSERT_GE(got.size(), 5u) << "the test kernels and the reference Relu";
  EXPECT_EQ(std::vector<std::string>(got.begin(), got.begin() + 4),
            (std::vector<std::string>{"t_rejects", "t_f64_only", "t_broken", "t_f32"}));
}

TEST_F(Dispatch, AcceptanceChecksKnownDtypesOnly) {
  const auto ks = candidates();
  const KernelEntry& f64_only = *ks[1];
  const Node n = relu_node();
  std::string why;
  EXPECT_FALSE(dispatch::kernel_accepts(f64_only, n, 17, {{DType::kF32}, {DType::kF32}}, &why));
  EXPECT_NE(why.find("t_f64_only does not take f32"), std::string::npos) << why;
  EXPECT_TRUE(dispatch::kernel_accepts(f64_only, n, 17, {{DType::kF64}, {DType::kF64}}, &why));
  // An unknown dtype is the create's to judge, not a rejection.
  EXPECT_TRUE(dispatch::kernel_accepts(f64_only, n, 17, {{DType::kUndefined}, {DType::kUndefined}}, &why));
  EXPECT_TRUE(dispatch::kernel_accepts(*ks[0], n, 17, {{DType::kF32}, {DType::kF32}}, &why)) << "no constraints";

  Graph g;
  g.inputs = {"x"};
  g.value_info["x"] = ValueInfo{DType::kF32, Shape{2}};
  dispatch::CallTypes t = dispatch::call_types(n, g);
  EXPECT_EQ(t.inputs, std::vector<DType>{DType::kF32});
  EXPECT_EQ(t.outputs, std::vector<DType>{DType::kUndefined}) << "y has no value info";
}

TEST_F(Dispatch, TakeKernelSkipsRejectionsAndLeavesTheAlternatives) {
  auto ks = candidates();
  ks.erase(ks.begin());  // from t_f64_only on
  std::vector<std::string> rejections;
  int fills = 0;
  auto choice = dispatch::take_kernel(
      ks, relu_node(), 17, {{DType::kF32}, {DType::kF32}}, [&](keel_kernel_context_t&) { ++fills; }, "Relu",
      &rejections);
  ASSERT_TRUE(choice.is_ok()) << choice.status().to_string();
  ASSERT_TRUE(choice.value());
  EXPECT_EQ(choice.value().kernel->name, "t_f32");
  EXPECT_EQ(fills, 1) << "only t_broken has a create";
  ASSERT_EQ(rejections.size(), 2u);
  EXPECT_NE(rejections[0].find("t_f64_only does not take f32"), std::string::npos) << rejections[0];
  EXPECT_EQ(rejections[1], "t_broken: t_broken: not this time") << "kernel name: its message";
  EXPECT_FALSE(ks.empty());
  EXPECT_EQ(ks.front()->name, "ref_relu") << "what follows the choice stays, in order";
}

TEST_F(Dispatch, ACreateFailureIsAnErrorNotARejection) {
  g_broken_create = true;
  auto ks = candidates();
  ks.erase(ks.begin());
  auto choice = dispatch::take_kernel(
      ks, relu_node(), 17, {{DType::kF32}, {DType::kF32}}, [](keel_kernel_context_t&) {}, "node 'r' (Relu)", nullptr);
  ASSERT_FALSE(choice.is_ok());
  EXPECT_EQ(choice.status().code(), StatusCode::kInternal);
  EXPECT_NE(choice.status().message().find("node 'r' (Relu) kernel t_broken: t_broken: create failed"),
            std::string::npos)
      << choice.status().to_string();
  EXPECT_EQ(names(ks), std::vector<std::string>({"t_f32", "ref_relu"})) << "the failed kernel is used up";
}

Graph relu_graph() {
  GraphBuilder b("relu");
  auto x = b.input("x", DType::kF32, {2, 3});
  b.output(b.op1("Relu", {x}));
  return b.take();
}

// The fall-through after a run-time rejection takes the next kernel that accepts the call: t_f64_only is skipped
// for an f32 call (it used to be installed unchecked, as only the first choice was checked for dtypes).
TEST_F(Dispatch, SessionFallThroughSkipsAlternativesThatRefuseTheDtypes) {
  SessionOptions opts;
  opts.devices = {"cpu"};
  auto s = Session::create(*env_, relu_graph(), opts);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  auto out = s.value()->run({{"x", Tensor::f32({2, 3}, {-1, 2, -3, 4, -5, 6})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const std::vector<float> want = {0, 2, 0, 4, 0, 6};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(out.value()[0].data<float>()[i], want[i]) << i;
  EXPECT_EQ(g_f64_runs.load(), 0);
  EXPECT_EQ(g_broken_runs.load(), 0);
  EXPECT_EQ(g_f32_runs.load(), 1);
  bool t_f32 = false;
  for (auto& [name, op, dev, kernel] : s.value()->placement()) t_f32 = t_f32 || kernel == "t_f32";
  EXPECT_TRUE(t_f32) << "the step now runs t_f32";
}

TEST_F(Dispatch, EagerFallThroughSkipsAlternativesThatRefuseTheDtypes) {
  eager::init(env_);
  eager::Tensor y = eager::relu(eager::from_vector(std::vector<float>{-1.f, 2.f, -3.f, 4.f}, {4}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0, 2, 0, 4}));
  EXPECT_EQ(g_f64_runs.load(), 0);
  EXPECT_EQ(g_broken_runs.load(), 0);
  EXPECT_EQ(g_f32_runs.load(), 1);
  (void)eager::relu(eager::from_vector(std::vector<float>{1.f, -2.f, 3.f, -4.f}, {4}));
  EXPECT_EQ(g_f32_runs.load(), 2) << "the cached call keeps the kernel it switched to";
}

// A create that fails (other than UNIMPLEMENTED) while falling through is an error in both: eager used to skip it
// silently and run the next kernel, the session reported it.
TEST_F(Dispatch, AFailedCreateDuringTheFallThroughIsAnErrorInSessionsAndEager) {
  g_broken_create = true;
  SessionOptions opts;
  opts.devices = {"cpu"};
  auto s = Session::create(*env_, relu_graph(), opts);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  auto out = s.value()->run({{"x", Tensor::f32({2, 3}, {-1, 2, -3, 4, -5, 6})}});
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("t_broken: create failed"), std::string::npos) << out.status().to_string();

  eager::init(env_);
  try {
    (void)eager::relu(eager::from_vector(std::vector<float>{-1.f, 2.f}, {2}));
    FAIL() << "t_broken's create failed";
  } catch (const eager::Error& e) {
    EXPECT_EQ(e.status().code(), StatusCode::kInternal) << e.what();
    EXPECT_NE(std::string(e.what()).find("Relu kernel t_broken: t_broken: create failed"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(g_f32_runs.load(), 0);
}

}  // namespace
}  // namespace keel
