// Session: placement by priority with CPU fallback, copies at device boundaries, claims, memory planning, errors.
#include "core/runtime/session.h"

#include "core/runtime/onnx_io.h"
#include "tests/common/fake_device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace keel {
namespace {

// ---- A fake accelerator (tests/common/fake_device.h): "device memory" is malloc'd but not host-addressable as far
// as the core knows, so the core must insert copies. It runs Relu (and claims Sigmoid->Sigmoid chains as one
// subgraph); nothing else.
const keel_core_api_t* g_host = nullptr;
testkit::FakeDevice g_fake;
int g_claim_runs = 0;

keel_status_t fake_sigmoid_chain(void*, keel_kernel_context_t* ctx) {
  const keel_kernel_api_t* k = g_host->kernel;
  const keel_tensor_t* x = k->input(ctx, 0);
  keel_tensor_t* y = nullptr;
  if (keel_status_t st = k->output(ctx, 0, x->ndim, x->dims, &y)) return st;
  const float* in = static_cast<const float*>(x->data);
  float* out = static_cast<float*>(y->data);
  for (uint64_t i = 0; i < x->byte_size / 4; ++i) {
    float s = 1.f / (1.f + std::exp(-in[i]));
    out[i] = 1.f / (1.f + std::exp(-s));
  }
  ++g_claim_runs;
  return nullptr;
}
keel_status_t fake_claim(void*, const keel_graph_t* g, const keel_graph_api_t* api, keel_subgraph_sink_t* sink) {
  keel_node_id_t ids[64];
  size_t n = api->nodes(g, ids, 64);
  for (size_t i = 0; i < n; ++i) {
    if (std::strcmp(api->node_op_type(g, ids[i]), "Sigmoid") != 0) continue;
    keel_node_id_t users[4];
    if (api->value_consumers(g, api->node_output(g, ids[i], 0), users, 4) != 1) continue;
    if (std::strcmp(api->node_op_type(g, users[0]), "Sigmoid") != 0) continue;
    static keel_node_id_t pair[2];
    pair[0] = ids[i];
    pair[1] = users[0];
    keel_subgraph_def_t def{};
    def.struct_size = sizeof def;
    def.name = "fake_sigmoid_chain";
    def.node_ids = pair;
    def.node_count = 2;
    def.compute = fake_sigmoid_chain;
    return sink->claim(sink, &def);
  }
  return nullptr;
}
keel_status_t fake_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  g_host = host;
  g_fake.host = host;
  keel_device_table_t t = g_fake.table();
  t.claim_subgraphs = fake_claim;
  if (keel_status_t st = host->register_device(plugin, &t)) return st;
  keel_kernel_def_t k = testkit::kernel_def("fake_relu", "Relu", 1, "fake", testkit::fake_relu);
  k.user_data = &g_fake;
  if (keel_status_t st = host->register_kernel(plugin, &k)) return st;
  // A CPU kernel that outranks the reference one but rejects every case at run time.
  k = testkit::kernel_def("picky_neg", "Neg", 1, "cpu", [](void*, keel_kernel_context_t*) -> keel_status_t {
    return g_host->status_create(KEEL_STATUS_UNIMPLEMENTED, "picky: cannot do this case");
  });
  return host->register_kernel(plugin, &k);
}
const keel_plugin_t kFakePlugin = testkit::device_plugin("fake", fake_init);

std::unique_ptr<Environment> make_env() {
  EnvironmentOptions o;
  o.discover_plugins = false;
  o.threads = 2;
  o.builtin_plugins.push_back({&kFakePlugin, 10, "test accelerator"});
  auto env = Environment::create(o);
  EXPECT_TRUE(env.is_ok()) << env.status().to_string();
  return std::move(env).value();
}

// x -> Relu -> Neg -> Relu -> y
Graph relu_neg_relu() {
  GraphBuilder b("rnr");
  auto x = b.input("x", DType::kF32, {2, 3});
  auto r1 = b.op1("Relu", {x});
  auto n = b.op1("Neg", {r1});
  auto r2 = b.op1("Relu", {n});
  b.output(r2);
  return b.take();
}

TEST(Session, RunsOnTheReferenceCpu) {
  auto env = make_env();
  SessionOptions opts;
  opts.devices = {"cpu"};
  auto s = Session::create(*env, relu_neg_relu(), opts);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  auto out = s.value()->run({{"x", Tensor::f32({2, 3}, {-1, 2, -3, 4, -5, 6})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out.value()[0].data<float>()[i], 0.f);
  EXPECT_TRUE(s.value()->fallbacks().empty());
  // The picky Neg kernel (priority 10) rejected the case at run time; the reference kernel took over.
  bool ref_neg = false;
  for (auto& [name, op, dev, kernel] : s.value()->placement())
    ref_neg = ref_neg || (op == "Neg" && kernel == "ref_neg");
  EXPECT_TRUE(ref_neg);
}

TEST(Session, PrefersTheDeviceAndFallsBackToCpuWithAReason) {
  auto env = make_env();
  g_fake.reset_counts();
  SessionOptions opts;
  opts.devices = {"fake"};
  auto s = Session::create(*env, relu_neg_relu(), opts);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  auto& fb = s.value()->fallbacks();
  ASSERT_EQ(fb.size(), 1u);
  EXPECT_EQ(fb[0].op_type, "Neg");
  EXPECT_EQ(fb[0].from, "fake");
  EXPECT_EQ(fb[0].to, "cpu");
  EXPECT_NE(fb[0].reason.find("no kernel"), std::string::npos) << fb[0].reason;
  auto out = s.value()->run({{"x", Tensor::f32({2, 3}, {-1, 2, -3, 4, -5, 6})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(g_fake.relu_runs_on(0), 2);
  // host->fake, fake->host (for Neg), host->fake (for the second Relu), and the output back to the host.
  EXPECT_EQ(g_fake.total_copies(), 4);
  EXPECT_TRUE(out.value()[0].location().is_host());
  int copy_steps = 0;
  for (auto& [name, op, dev, kernel] : s.value()->placement()) copy_steps += op == "Copy";
  EXPECT_EQ(copy_steps, 3);
}

TEST(Session, FallbackErrorRefusesWithTheNodeAndReason) {
  auto env = make_env();
  SessionOptions opts;
  opts.devices = {"fake"};
  opts.fallback = Fallback::kError;
  auto s = Session::create(*env, relu_neg_relu(), opts);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(s.status().message().find("Neg"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("fake"), std::string::npos) << s.status().message();
}

TEST(Session, DefaultPlacementUsesTheHighestPriorityDevice) {
  auto env = make_env();
  ASSERT_EQ(env->registry().device_types().front(), "fake");
  auto s = Session::create(*env, relu_neg_relu());
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s.value()->fallbacks().size(), 1u);
}

TEST(Session, UnknownDeviceIsAClearError) {
  auto env = make_env();
  SessionOptions opts;
  opts.devices = {"tpu"};
  auto s = Session::create(*env, relu_neg_relu(), opts);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("tpu"), std::string::npos);
}

TEST(Session, DeviceClaimsAConnectedSubgraph) {
  auto env = make_env();
  g_claim_runs = 0;
  GraphBuilder b("chain");
  auto x = b.input("x", DType::kF32, {4});
  auto s1 = b.op1("Sigmoid", {x});
  auto s2 = b.op1("Sigmoid", {s1});
  auto r = b.op1("Relu", {s2});
  b.output(r);
  SessionOptions opts;
  opts.devices = {"fake"};
  auto s = Session::create(*env, b.take(), opts);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  bool saw_claim = false;
  for (auto& [name, op, dev, kernel] : s.value()->placement())
    saw_claim = saw_claim || (op == "Subgraph" && dev == "fake");
  EXPECT_TRUE(saw_claim);
  auto out = s.value()->run({{"x", Tensor::f32({4}, {-2, 0, 1, 3})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(g_claim_runs, 1);
  float x0 = 1.f / (1.f + std::exp(2.f));
  EXPECT_NEAR(out.value()[0].data<float>()[0], 1.f / (1.f + std::exp(-x0)), 1e-6);
}

// ---- A kernel-only plugin with a claim hook for "cpu" (keel_claimer_def_t, ABI 1.1): it claims the nodes named
// "claim_*" as one subgraph that computes tanh(tanh(x)), twice (the second claim overlaps and must be rejected),
// and, when a node "loop_a" exists, the non-convex pair {loop_a, loop_c} around an outside node; the nodes named
// "pair_*" (two Tanh, one after the other) as one subgraph with both Tanh outputs (tanh_pair).
int g_user_data_released = 0;
int g_tanh_chain_runs = 0;
void release_counter(void* p) {
  delete static_cast<int*>(p);
  ++g_user_data_released;
}
keel_status_t tanh_chain_create(void* user_data, keel_kernel_context_t*, void** out_state) {
  *out_state = new int(*static_cast<int*>(user_data));
  return nullptr;
}
// Profiling (ABI 1.3): whether the last compute saw profiling on, and what profile_step said to a NULL record.
int g_tanh_profiling = -1;
std::string g_null_step_error;
keel_status_t tanh_chain(void*, keel_kernel_context_t* ctx) {
  const keel_kernel_api_t* k = g_host->kernel;
  const keel_tensor_t* x = k->input(ctx, 0);
  keel_tensor_t* y = nullptr;
  if (keel_status_t st = k->output(ctx, 0, x->ndim, x->dims, &y)) return st;
  const bool prof = KEEL_HAS_MEMBER(k, keel_kernel_api_t, profile_step) && k->profiling(ctx) != 0;
  g_tanh_profiling = prof ? 1 : 0;
  // Two timed halves (profiled as two steps).
  const uint64_t n = x->byte_size / 4;
  auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < n / 2; ++i)
    static_cast<float*>(y->data)[i] = std::tanh(std::tanh(static_cast<const float*>(x->data)[i]));
  auto t1 = std::chrono::steady_clock::now();
  for (uint64_t i = n / 2; i < n; ++i)
    static_cast<float*>(y->data)[i] = std::tanh(std::tanh(static_cast<const float*>(x->data)[i]));
  auto t2 = std::chrono::steady_clock::now();
  ++g_tanh_chain_runs;
  if (prof) {
    // One step for both Tanh nodes (the second fused into the first), one layout step of the kernel's own, and one
    // record from an older layout (struct_size ends after `implementation`; the rest is poison the core must not read).
    const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    const double ms2 = std::chrono::duration<double, std::milli>(t2 - t1).count();
    const char* both[] = {"claim_0", "claim_1"};
    const char* first[] = {"claim_0"};
    keel_profile_step_t st{};
    st.struct_size = sizeof st;
    st.kind = "eltwise";
    st.implementation = "test:scalar";
    st.op_type = "Tanh";
    st.node_names = both;
    st.node_count = 2;
    st.time_ms = ms;
    if (keel_status_t e = k->profile_step(ctx, &st)) return e;
    st.kind = "reorder";
    st.op_type = nullptr;
    st.node_names = first;
    st.node_count = 1;
    st.time_ms = ms2;
    if (keel_status_t e = k->profile_step(ctx, &st)) return e;
    keel_profile_step_t old;
    std::memset(&old, 0xA5, sizeof old);
    old.struct_size = offsetof(keel_profile_step_t, op_type);
    old.kind = "old_layout";
    old.implementation = "";
    if (keel_status_t e = k->profile_step(ctx, &old)) return e;
    keel_status_t e = k->profile_step(ctx, nullptr);
    g_null_step_error = e && e->message ? e->message : "";
    keel_status_release(e);
  }
  return nullptr;
}
// The claim of two Tanh nodes whose outputs both leave it: a = tanh(x) (output 0), tanh(a) (output 1).
int g_tanh_pair_runs = 0;
keel_status_t tanh_pair(void*, keel_kernel_context_t* ctx) {
  const keel_kernel_api_t* k = g_host->kernel;
  const keel_tensor_t* x = k->input(ctx, 0);
  keel_tensor_t *a = nullptr, *y = nullptr;
  if (keel_status_t st = k->output(ctx, 0, x->ndim, x->dims, &a)) return st;
  if (keel_status_t st = k->output(ctx, 1, x->ndim, x->dims, &y)) return st;
  for (uint64_t i = 0; i < x->byte_size / 4; ++i) {
    static_cast<float*>(a->data)[i] = std::tanh(static_cast<const float*>(x->data)[i]);
    static_cast<float*>(y->data)[i] = std::tanh(static_cast<float*>(a->data)[i]);
  }
  ++g_tanh_pair_runs;
  return nullptr;
}
keel_status_t claim_by_names(void*, const keel_graph_t* g, const keel_graph_api_t* api, keel_subgraph_sink_t* sink) {
  keel_node_id_t ids[64];
  size_t n = api->nodes(g, ids, 64);
  std::vector<keel_node_id_t> chain, loop, pair;
  for (size_t i = 0; i < n; ++i) {
    std::string name = api->node_name(g, ids[i]);
    if (name.rfind("claim_", 0) == 0) chain.push_back(ids[i]);
    if (name == "loop_a" || name == "loop_c") loop.push_back(ids[i]);
    if (name.rfind("pair_", 0) == 0) pair.push_back(ids[i]);
  }
  keel_subgraph_def_t def{};
  def.struct_size = sizeof def;
  def.name = "tanh_chain";
  def.create = tanh_chain_create;
  def.compute = tanh_chain;
  def.release = [](void* s) { delete static_cast<int*>(s); };
  def.release_user_data = release_counter;
  for (const auto* ids_v : {&chain, &chain, &loop}) {
    if (ids_v->empty()) continue;
    def.node_ids = ids_v->data();
    def.node_count = ids_v->size();
    def.user_data = new int(1);
    if (keel_status_t st = sink->claim(sink, &def)) return st;
  }
  if (!pair.empty()) {
    def.name = "tanh_pair";
    def.compute = tanh_pair;
    def.node_ids = pair.data();
    def.node_count = pair.size();
    def.user_data = new int(1);
    if (keel_status_t st = sink->claim(sink, &def)) return st;
  }
  return nullptr;
}
// Registers the claimer `name` for "cpu" with the claim hook `claim` and, because a device plugin without a device
// table must serve some device type with a kernel, a kernel `noop_name` for an op no test uses (in `noop_domain`).
keel_status_t register_cpu_claimer(const keel_core_api_t* host, keel_plugin_handle_t* plugin, const char* name,
                                   decltype(keel_claimer_def_t::claim_subgraphs) claim, const char* noop_name,
                                   const char* noop_domain) {
  if (!KEEL_HAS_MEMBER(host, keel_core_api_t, register_claimer)) return nullptr;
  g_host = host;
  keel_claimer_def_t c{};
  c.struct_size = sizeof c;
  c.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  c.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  c.name = name;
  c.device_type = "cpu";
  c.claim_subgraphs = claim;
  if (keel_status_t st = host->register_claimer(plugin, &c)) return st;
  keel_kernel_def_t k = testkit::kernel_def(noop_name, "Noop", 1, "cpu",
                                            [](void*, keel_kernel_context_t*) -> keel_status_t { return nullptr; });
  k.domain = noop_domain;
  return host->register_kernel(plugin, &k);
}
keel_status_t claimer_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  return register_cpu_claimer(host, plugin, "by_names", claim_by_names, "claimer_noop", "test.claimer");
}
const keel_plugin_t kClaimerPlugin = {.struct_size = sizeof(keel_plugin_t),
                                      .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                      .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                                      .name = "claimer",
                                      .version = "1.0",
                                      .kind = KEEL_PLUGIN_KIND_DEVICE,
                                      .init = claimer_init,
                                      .shutdown = nullptr,
                                      .init_instance = nullptr,
                                      .shutdown_instance = nullptr};

// x[shape] -> Tanh -> Tanh -> Neg -> y, the Tanh nodes named `prefix`0 and `prefix`1 (the test claimers take
// nodes by name).
Graph tanh_tanh_neg_named(const std::string& graph_name, const std::vector<int64_t>& shape, const std::string& prefix) {
  GraphBuilder b(graph_name);
  auto x = b.input("x", DType::kF32, shape);
  b.output(b.op1("Neg", {b.op1("Tanh", {b.op1("Tanh", {x})})}));
  Graph graph = b.take();
  int k = 0;
  // A named copy: iterating value() of the temporary would dangle.
  const std::vector<NodeId> order = graph.topological_order().value();
  for (NodeId id : order) {
    Node* n = graph.node(id);
    if (n->op_type == "Tanh") n->name = prefix + std::to_string(k++);
  }
  return graph;
}

// An environment with the reference CPU and `plugin` built in (priority 20), no discovery.
std::unique_ptr<Environment> make_env_with(const keel_plugin_t* plugin, const char* what) {
  EnvironmentOptions o;
  o.discover_plugins = false;
  o.threads = 2;
  o.builtin_plugins.push_back({plugin, 20, what});
  auto env = Environment::create(o);
  EXPECT_TRUE(env.is_ok()) << env.status().to_string();
  return std::move(env).value();
}
std::unique_ptr<Environment> make_claimer_env() { return make_env_with(&kClaimerPlugin, "test claimer"); }

TEST(Session, KernelPluginClaimerTakesAChainOnCpuAndEveryUserDataIsReleased) {
  auto env = make_claimer_env();
  g_user_data_released = 0;
  g_tanh_chain_runs = 0;
  Graph graph = tanh_tanh_neg_named("claimer", {3}, "claim_");
  SessionOptions opts;
  opts.devices = {"cpu"};
  {
    auto s = Session::create(*env, std::move(graph), opts);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    // Both claims' user_data released: the accepted one after its create, the overlapping one when rejected.
    EXPECT_EQ(g_user_data_released, 2);
    bool saw = false;
    for (auto& [name, op, dev, kernel] : s.value()->placement()) saw = saw || (op == "Subgraph" && dev == "cpu");
    EXPECT_TRUE(saw);
    auto out = s.value()->run({{"x", Tensor::f32({3}, {-1, 0, 2})}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(g_tanh_chain_runs, 1);
    EXPECT_NEAR(out.value()[0].data<float>()[0], -std::tanh(std::tanh(-1.f)), 1e-6);
  }
}

TEST(Session, ProfileSplitsAClaimedSubgraphIntoTheStepsItsKernelReports) {
  auto env = make_claimer_env();
  auto make = [] { return tanh_tanh_neg_named("claimer", {4096}, "claim_"); };
  Tensor x = Tensor::f32({4096}, std::vector<float>(4096, 0.5f));
  SessionOptions opts;
  opts.devices = {"cpu"};
  {
    // Off: the kernel is told so, and the profile has no steps.
    auto s = Session::create(*env, make(), opts).value();
    ASSERT_TRUE(s->run({{"x", x}}).is_ok());
    EXPECT_EQ(g_tanh_profiling, 0);
    for (const auto& p : s->profile()) EXPECT_TRUE(p.steps.empty());
  }
  opts.profile = true;
  auto s = Session::create(*env, make(), opts).value();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->run({{"x", x}}).is_ok());
  EXPECT_EQ(g_tanh_profiling, 1);
  EXPECT_NE(g_null_step_error.find("profile_step"), std::string::npos) << g_null_step_error;
  const std::vector<NodeProfile> prof = s->profile();
  const NodeProfile* chain = nullptr;
  double total = 0;
  for (const auto& p : prof) {
    total += p.total_ms / p.calls;
    if (p.op_type == "Subgraph") chain = &p;
  }
  ASSERT_NE(chain, nullptr);
  ASSERT_EQ(chain->members.size(), 2u);
  EXPECT_EQ(chain->members[0], std::make_pair(std::string("claim_0"), std::string("Tanh")));
  ASSERT_EQ(chain->steps.size(), 3u);
  EXPECT_EQ(chain->steps[0].kind, "eltwise");
  EXPECT_EQ(chain->steps[0].implementation, "test:scalar");
  EXPECT_EQ(chain->steps[0].op_type, "Tanh");
  EXPECT_EQ(chain->steps[0].nodes, (std::vector<std::string>{"claim_0", "claim_1"}));
  EXPECT_EQ(chain->steps[0].calls, 3);
  EXPECT_GT(chain->steps[0].total_ms, 0);
  EXPECT_EQ(chain->steps[1].op_type, "");
  // The older record: only what its struct_size covers.
  EXPECT_EQ(chain->steps[2].kind, "old_layout");
  EXPECT_EQ(chain->steps[2].op_type, "");
  EXPECT_TRUE(chain->steps[2].nodes.empty());
  EXPECT_EQ(chain->steps[2].total_ms, 0);

  // By op type: the chain's time goes to Tanh (both nodes, one fused), the kernel's own reorder, and the rest of the
  // step; the rows add up to the steps' total.
  const std::vector<OpTypeProfile> rows = profile_by_op_type(prof);
  std::map<std::string, OpTypeProfile> by;
  double sum = 0;
  for (const auto& r : rows) by[r.op_type] = r, sum += r.ms;
  EXPECT_NEAR(sum, total, 1e-9 + 1e-6 * total);
  ASSERT_TRUE(by.count("Tanh") && by.count("(reorder)") && by.count("Neg") && by.count("(old_layout)"));
  EXPECT_EQ(by["Tanh"].nodes, 2);
  EXPECT_EQ(by["Tanh"].fused, 1);
  EXPECT_EQ(by["Tanh"].fused_in, (std::map<std::string, int>{{"Tanh", 1}}));
  EXPECT_NEAR(by["Tanh"].ms, chain->steps[0].total_ms / 3, 1e-12);
  EXPECT_NEAR(by["(reorder)"].ms, chain->steps[1].total_ms / 3, 1e-12);
  EXPECT_EQ(by["(reorder)"].nodes, 0);
  EXPECT_EQ(by["Neg"].nodes, 1);
  EXPECT_EQ(by["Tanh"].where, (std::vector<std::string>{"cpu:tanh_chain"}));
  EXPECT_FALSE(by.count("Subgraph")) << "a chain that reports its steps is split into them";
  s->reset_profile();
  for (const auto& p : s->profile()) {
    EXPECT_EQ(p.calls, 0);
    EXPECT_TRUE(p.steps.empty());
  }
  ASSERT_TRUE(s->run({{"x", x}}).is_ok());
  for (const auto& p : s->profile()) EXPECT_EQ(p.calls, 1);
}

TEST(Session, ANonConvexClaimIsRejectedAndItsNodesRunOnKernels) {
  auto env = make_claimer_env();
  g_user_data_released = 0;
  g_tanh_chain_runs = 0;
  Graph graph;
  {
    // a = Tanh(x); b = Neg(a); c = Add(a, b): {a, c} leaves through b and comes back.
    GraphBuilder b("loop");
    auto x = b.input("x", DType::kF32, {2});
    auto a = b.op1("Tanh", {x});
    auto n = b.op1("Neg", {a});
    auto c = b.op1("Add", {a, n});
    b.output(c);
    graph = b.take();
  }
  const std::vector<NodeId> order = graph.topological_order().value();
  for (NodeId id : order) {
    Node* n = graph.node(id);
    if (n->op_type == "Tanh") n->name = "loop_a";
    if (n->op_type == "Add") n->name = "loop_c";
  }
  SessionOptions opts;
  opts.devices = {"cpu"};
  auto s = Session::create(*env, std::move(graph), opts);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(g_user_data_released, 1);
  for (auto& [name, op, dev, kernel] : s.value()->placement()) EXPECT_NE(op, "Subgraph");
  auto out = s.value()->run({{"x", Tensor::f32({2}, {0.5f, -1})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(g_tanh_chain_runs, 0);
  EXPECT_NEAR(out.value()[0].data<float>()[0], 0.f, 1e-6);
}

// a = Tanh(x); n = Neg(a); y = Tanh(a), in that order: the claim {a, y} is convex, but the outside Neg reads its
// value a and comes before its last node in the graph's order. The claim still runs as one step, and Neg after it
// (before, the claim was dropped as "not convex": the side outputs of a decomposed LayerNormalization lost its chain).
TEST(Session, AnOutsideReaderOfAClaimsValueRunsAfterTheClaim) {
  auto env = make_claimer_env();
  g_tanh_pair_runs = 0;
  Graph graph;
  {
    GraphBuilder b("side_output");
    auto x = b.input("x", DType::kF32, {2});
    auto a = b.op1("Tanh", {x});
    auto n = b.op1("Neg", {a});
    auto y = b.op1("Tanh", {a});
    b.output(y);
    b.output(n);
    graph = b.take();
  }
  const std::vector<NodeId> order = graph.topological_order().value();
  ASSERT_EQ(graph.node(order[1])->op_type, "Neg");  // between the two claimed nodes
  for (NodeId id : order) {
    Node* node = graph.node(id);
    if (node->op_type == "Tanh") node->name = id == order[0] ? "pair_a" : "pair_y";
  }
  SessionOptions opts;
  opts.devices = {"cpu"};
  auto s = Session::create(*env, std::move(graph), opts);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  std::vector<std::string> ops;
  for (auto& [name, op, dev, kernel] : s.value()->placement()) ops.push_back(op);
  EXPECT_EQ(ops, (std::vector<std::string>{"Subgraph", "Neg"}));
  for (int run = 0; run < 2; ++run) {
    auto out = s.value()->run({{"x", Tensor::f32({2}, {0.5f, -1})}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    ASSERT_EQ(out.value().size(), 2u);
    EXPECT_NEAR(out.value()[0].data<float>()[0], std::tanh(std::tanh(0.5f)), 1e-6);
    EXPECT_NEAR(out.value()[1].data<float>()[1], -std::tanh(-1.f), 1e-6);
  }
  EXPECT_EQ(g_tanh_pair_runs, 2);
}

TEST(Session, BadInputsAreRefusedWithNames) {
  auto env = make_env();
  SessionOptions opts;
  opts.devices = {"cpu"};
  auto s = Session::create(*env, relu_neg_relu(), opts).value();
  auto r = s->run({});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("missing input 'x'"), std::string::npos) << r.status().message();
  r = s->run({{"y", Tensor::f32({2, 3}, std::vector<float>(6))}});
  EXPECT_NE(r.status().message().find("unknown input 'y'"), std::string::npos) << r.status().message();
  r = s->run({{"x", Tensor::f32({3, 2}, std::vector<float>(6))}});
  EXPECT_NE(r.status().message().find("shape"), std::string::npos) << r.status().message();
  r = s->run({{"x", Tensor::from_vector<int64_t>(DType::kI64, {2, 3}, std::vector<int64_t>(6))}});
  EXPECT_NE(r.status().message().find("dtype"), std::string::npos) << r.status().message();
}

TEST(Session, SteadyStateRunsDoNotAllocateRawMemory) {
  auto env = make_env();
  GraphBuilder b("mlp");
  auto x = b.input("x", DType::kF32, {8, 64});
  std::string h = x;
  for (int i = 0; i < 4; ++i) {
    auto w = b.constant("w" + std::to_string(i), Tensor::f32({64, 64}, std::vector<float>(64 * 64, 0.01f)));
    h = b.op1("Relu", {b.op1("MatMul", {h, w})});
  }
  b.output(h);
  SessionOptions opts;
  opts.devices = {"cpu"};
  auto s = Session::create(*env, b.take(), opts).value();
  Tensor in = Tensor::f32({8, 64}, std::vector<float>(8 * 64, 1.f));
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(s->run({{"x", in}}).is_ok());
  auto before = env->memory_stats().at("cpu:0");
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(s->run({{"x", in}}).is_ok());
  auto after = env->memory_stats().at("cpu:0");
  EXPECT_EQ(after.raw_allocations, before.raw_allocations);
  EXPECT_GT(s->planned_arena_bytes().at("cpu:0"), 0u);
  // Arena: 7 intermediates of 2 KiB never live more than two at a time.
  EXPECT_LE(s->planned_arena_bytes().at("cpu:0"), 3u * 8 * 64 * 4);
}

TEST(Session, ConcurrentRunsAreSafe) {
  auto env = make_env();
  SessionOptions opts;
  opts.devices = {"cpu"};
  auto s = Session::create(*env, relu_neg_relu(), opts).value();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto r = s->run({{"x", Tensor::f32({2, 3}, {1, 2, 3, 4, 5, 6})}});
        if (r.is_ok() && r.value()[0].data<float>()[5] == 0.f) ++ok;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 200);
}

}  // namespace
}  // namespace keel

namespace keel {
namespace {
TEST(Session, PerSessionThreadPool) {
  auto env = make_env();
  SessionOptions opts;
  opts.devices = {"cpu"};
  opts.threads = 3;  // the environment has 2: this session owns a pool of 3
  auto s = Session::create(*env, relu_neg_relu(), opts);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  auto out = s.value()->run({{"x", Tensor::f32({2, 3}, {-1, 2, -3, 4, -5, 6})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  opts.threads = -1;
  EXPECT_FALSE(Session::create(*env, relu_neg_relu(), opts).is_ok());
}

// ---- Shape specialisation. A claimer like the oneDNN device's: it claims a Tanh -> Tanh pair only over static
// shapes (nodes named "static_*"), and its create refuses a batch over 4 (a shape a device cannot take).
// Atomic: concurrent runs (ShapeVariants.ConcurrentRuns...) create and run the chain from several threads.
std::atomic<int> g_static_creates{0};
std::atomic<int> g_static_runs{0};
keel_status_t static_chain_create(void*, keel_kernel_context_t* ctx, void** out_state) {
  ++g_static_creates;
  const keel_tensor_t* x = g_host->kernel->input(ctx, 0);
  if (x->ndim >= 1 && x->dims[0] > 4)
    return g_host->status_create(KEEL_STATUS_INVALID_ARGUMENT, "static chain: batch over 4");
  *out_state = nullptr;
  return nullptr;
}
keel_status_t static_chain(void*, keel_kernel_context_t* ctx) {
  const keel_kernel_api_t* k = g_host->kernel;
  const keel_tensor_t* x = k->input(ctx, 0);
  keel_tensor_t* y = nullptr;
  if (keel_status_t st = k->output(ctx, 0, x->ndim, x->dims, &y)) return st;
  for (uint64_t i = 0; i < x->byte_size / 4; ++i)
    static_cast<float*>(y->data)[i] = std::tanh(std::tanh(static_cast<const float*>(x->data)[i]));
  ++g_static_runs;
  return nullptr;
}
keel_status_t claim_static(void*, const keel_graph_t* g, const keel_graph_api_t* api, keel_subgraph_sink_t* sink) {
  keel_node_id_t ids[64];
  size_t n = api->nodes(g, ids, 64);
  std::vector<keel_node_id_t> chain;
  for (size_t i = 0; i < n; ++i)
    if (std::string(api->node_name(g, ids[i])).rfind("static_", 0) == 0) chain.push_back(ids[i]);
  if (chain.empty()) return nullptr;
  int32_t dtype = 0, ndim = 0;
  int64_t dims[8];
  if (!api->value_info(g, api->node_input(g, chain[0], 0), &dtype, &ndim, dims, 8) || ndim < 0) return nullptr;
  for (int32_t d = 0; d < ndim; ++d)
    if (dims[d] < 0) return nullptr;  // symbolic: left to the single-node kernels
  keel_subgraph_def_t def{};
  def.struct_size = sizeof def;
  def.name = "static_chain";
  def.node_ids = chain.data();
  def.node_count = chain.size();
  def.create = static_chain_create;
  def.compute = static_chain;
  return sink->claim(sink, &def);
}
keel_status_t static_claimer_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  return register_cpu_claimer(host, plugin, "static_only", claim_static, "static_noop", "test.static");
}
const keel_plugin_t kStaticClaimerPlugin = {.struct_size = sizeof(keel_plugin_t),
                                            .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                            .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                                            .name = "static_claimer",
                                            .version = "1.0",
                                            .kind = KEEL_PLUGIN_KIND_DEVICE,
                                            .init = static_claimer_init,
                                            .shutdown = nullptr,
                                            .init_instance = nullptr,
                                            .shutdown_instance = nullptr};

std::unique_ptr<Environment> make_static_claimer_env() {
  return make_env_with(&kStaticClaimerPlugin, "static-shape claimer");
}

// x[N,3] -> Tanh (static_0) -> Tanh (static_1) -> Neg -> y; `batch` < 0: N is symbolic.
Graph tanh_tanh_neg(int64_t batch = -1) { return tanh_tanh_neg_named("ttn", {batch, 3}, "static_"); }

Tensor batch_input(int64_t batch, float offset = 0) {
  std::vector<float> v(static_cast<size_t>(batch * 3));
  for (size_t i = 0; i < v.size(); ++i) v[i] = offset + 0.25f * static_cast<float>(i) - 1.f;
  return Tensor::f32({batch, 3}, v);
}

// -tanh(tanh(x)) of batch_input, element by element.
void expect_ttn(const Tensor& in, const StatusOr<std::vector<Tensor>>& out) {
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ(out.value()[0].shape(), in.shape());
  for (int64_t i = 0; i < in.numel(); ++i)
    EXPECT_NEAR(out.value()[0].data<float>()[i], -std::tanh(std::tanh(in.data<float>()[i])), 1e-6) << i;
}

bool has_subgraph(const Session& s, const std::string& kernel_prefix) {
  for (const auto& [name, op, dev, kernel] : s.placement())
    if (op == "Subgraph" && kernel.rfind(kernel_prefix, 0) == 0) return true;
  return false;
}

TEST(ShapeVariants, AStaticShapeClaimerTakesADynamicBatchGraphPerBatch) {
  auto env = make_static_claimer_env();
  g_static_creates = 0;
  g_static_runs = 0;
  SessionOptions opts;
  opts.devices = {"cpu"};
  auto created = Session::create(*env, tanh_tanh_neg(), opts);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  Session& s = *created.value();
  // The generic build: N is symbolic, so the claimer took nothing.
  EXPECT_FALSE(has_subgraph(s, "static_chain"));
  EXPECT_EQ(s.shape_variant(), "");
  EXPECT_EQ(g_static_creates, 0);
  for (int round = 0; round < 3; ++round)
    for (int64_t batch : {1, 3}) {
      Tensor in = batch_input(batch, static_cast<float>(round));
      expect_ttn(in, s.run({{"x", in}}));
      EXPECT_EQ(s.shape_variant(), "x" + shape_to_string({batch, 3}));
      EXPECT_TRUE(has_subgraph(s, "static_chain")) << "batch " << batch;
    }
  EXPECT_EQ(s.shape_variant_count(), 2u);
  EXPECT_EQ(g_static_creates, 2);  // one build per shape, reused afterwards
  EXPECT_EQ(g_static_runs, 6);
  // The profile follows the build of the last run.
  for (const auto& p : s.profile()) EXPECT_EQ(p.calls, 0) << p.node;  // profiling is off
  EXPECT_FALSE(s.planned_arena_bytes().empty());
}

TEST(ShapeVariants, AVariantThatFailsToBuildRunsOnTheGenericBuildAndIsNotRetried) {
  auto env = make_static_claimer_env();
  g_static_creates = 0;
  SessionOptions opts;
  opts.devices = {"cpu"};
  auto s = Session::create(*env, tanh_tanh_neg(), opts).value();
  Tensor good = batch_input(2);
  expect_ttn(good, s->run({{"x", good}}));
  EXPECT_EQ(s->shape_variant(), "x[2, 3]");
  // Batch 5: the claimer's create refuses it while the variant is built; the run goes on with the generic build.
  const int before = g_static_creates;
  Tensor five = batch_input(5);
  expect_ttn(five, s->run({{"x", five}}));
  EXPECT_EQ(s->shape_variant(), "");
  EXPECT_FALSE(has_subgraph(*s, "static_chain"));
  EXPECT_EQ(g_static_creates, before + 1);
  EXPECT_EQ(s->shape_variant_count(), 1u);  // the failure is no variant
  // The next good run works, on its variant.
  expect_ttn(good, s->run({{"x", good}}));
  EXPECT_EQ(s->shape_variant(), "x[2, 3]");
  // The failure is remembered: the same shapes are not built again.
  expect_ttn(five, s->run({{"x", five}}));
  EXPECT_EQ(g_static_creates, before + 1);
  // Shapes the graph itself refuses build nothing: the generic build names the problem.
  auto r = s->run({{"x", Tensor::f32({2, 4}, std::vector<float>(8))}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("the model expects [?, 3]"), std::string::npos) << r.status().message();
  r = s->run({{"x", Tensor::f32({6}, std::vector<float>(6))}});
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(s->shape_variant_count(), 1u);
  expect_ttn(batch_input(3), s->run({{"x", batch_input(3)}}));
  EXPECT_EQ(s->shape_variant_count(), 2u);
}

TEST(ShapeVariants, PastTheCapRunsUseTheGenericBuild) {
  auto env = make_static_claimer_env();
  SessionOptions opts;
  opts.devices = {"cpu"};
  opts.shape_variants = 2;
  auto s = Session::create(*env, tanh_tanh_neg(), opts).value();
  for (int64_t batch : {1, 2}) {
    Tensor in = batch_input(batch);
    expect_ttn(in, s->run({{"x", in}}));
    EXPECT_TRUE(has_subgraph(*s, "static_chain"));
  }
  for (int64_t batch : {3, 4, 3}) {
    Tensor in = batch_input(batch, 0.5f);
    expect_ttn(in, s->run({{"x", in}}));
    EXPECT_EQ(s->shape_variant(), "");
    EXPECT_FALSE(has_subgraph(*s, "static_chain"));
  }
  EXPECT_EQ(s->shape_variant_count(), 2u);
  // The variants built before the cap stay.
  Tensor in = batch_input(1, 2.f);
  expect_ttn(in, s->run({{"x", in}}));
  EXPECT_EQ(s->shape_variant(), "x[1, 3]");
}

TEST(ShapeVariants, ZeroTurnsThemOffAndStaticGraphsHaveNone) {
  auto env = make_static_claimer_env();
  SessionOptions opts;
  opts.devices = {"cpu"};
  opts.shape_variants = 0;
  auto off = Session::create(*env, tanh_tanh_neg(), opts).value();
  for (int64_t batch : {1, 3}) {
    Tensor in = batch_input(batch);
    expect_ttn(in, off->run({{"x", in}}));
    EXPECT_EQ(off->shape_variant(), "");
    EXPECT_FALSE(has_subgraph(*off, "static_chain"));
  }
  EXPECT_EQ(off->shape_variant_count(), 0u);
  // Static inputs: claimed at create, as before; no variant.
  opts.shape_variants = 8;
  auto fixed = Session::create(*env, tanh_tanh_neg(3), opts).value();
  EXPECT_TRUE(has_subgraph(*fixed, "static_chain"));
  Tensor in = batch_input(3);
  expect_ttn(in, fixed->run({{"x", in}}));
  EXPECT_EQ(fixed->shape_variant(), "");
  EXPECT_EQ(fixed->shape_variant_count(), 0u);
  opts.shape_variants = -1;
  EXPECT_FALSE(Session::create(*env, tanh_tanh_neg(), opts).is_ok());
}

TEST(ShapeVariants, ConcurrentRunsWithDifferentShapesAreSafe) {
  auto env = make_static_claimer_env();
  SessionOptions opts;
  opts.devices = {"cpu"};
  opts.profile = true;
  auto s = Session::create(*env, tanh_tanh_neg(), opts).value();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      Tensor in = batch_input(t + 1);
      for (int i = 0; i < 25; ++i) {
        auto r = s->run({{"x", in}});
        bool good = r.is_ok() && r.value()[0].shape() == in.shape();
        for (int64_t j = 0; good && j < in.numel(); ++j)
          good = std::fabs(r.value()[0].data<float>()[j] + std::tanh(std::tanh(in.data<float>()[j]))) < 1e-6f;
        if (good) ++ok;
        (void)s->placement();
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 100);
  EXPECT_EQ(s->shape_variant_count(), 4u);
  s->reset_profile();
  for (const auto& p : s->profile()) EXPECT_EQ(p.calls, 0) << p.node;
}

// ---- The same with the oneDNN device (when it is built): a dynamic-batch CNN runs as one oneDNN chain per batch.
// x[N,4,8,8] -> Conv+bias -> Relu -> Conv+bias -> Add(residual) -> Relu -> GlobalAveragePool -> Flatten -> Gemm.
Graph dynamic_batch_cnn() {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 0.2f);
  auto random = [&](const Shape& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = dist(rng);
    return Tensor::f32(shape, v);
  };
  GraphBuilder b("dyn_cnn", 17);
  auto x = b.input("x", DType::kF32, {-1, 4, 8, 8});
  auto conv = [&](const std::string& in, const std::string& name) {
    return b.op1("Conv", {in, b.constant(name + "_w", random({4, 4, 3, 3})), b.constant(name + "_b", random({4}))},
                 {{"kernel_shape", Attribute::of_ints({3, 3})}, {"pads", Attribute::of_ints({1, 1, 1, 1})}});
  };
  auto r1 = b.op1("Relu", {conv(x, "c1")});
  auto r2 = b.op1("Relu", {b.op1("Add", {conv(r1, "c2"), r1})});
  auto f = b.op1("Flatten", {b.op1("GlobalAveragePool", {r2})});
  b.output(b.op1("Gemm", {f, b.constant("fc_w", random({4, 5})), b.constant("fc_b", random({5}))}));
  return b.take();
}

TEST(ShapeVariants, DynamicBatchCnnMatchesTheReferenceAndRunsAsAOneDnnChainPerBatch) {
  EnvironmentOptions ro;
  ro.discover_plugins = false;  // the reference kernels only
  ro.threads = 1;
  auto ref_env = Environment::create(ro);
  ASSERT_TRUE(ref_env.is_ok()) << ref_env.status().to_string();
  auto ref = Session::create(*ref_env.value(), dynamic_batch_cnn(), SessionOptions{});
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();

  EnvironmentOptions o;
#ifdef KEEL_PLUGIN_DIR_DEFAULT
  o.plugin_paths.push_back(KEEL_PLUGIN_DIR_DEFAULT);
#endif
  o.threads = 1;
  auto env = Environment::create(o);
  ASSERT_TRUE(env.is_ok()) << env.status().to_string();
  SessionOptions opts;
  opts.devices = {"cpu"};
  opts.profile = true;
  auto created = Session::create(*env.value(), dynamic_batch_cnn(), opts);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  Session& s = *created.value();
  bool onednn = false;  // the plugin's single-node kernels take the generic build
  for (const auto& [name, op, dev, kernel] : s.placement()) onednn = onednn || kernel.rfind("onednn", 0) == 0;

  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::map<int64_t, std::string> chain_of;  // batch -> the chain's kernel name
  for (int round = 0; round < 2; ++round)
    for (int64_t batch : {1, 3}) {
      std::vector<float> v(static_cast<size_t>(batch * 4 * 8 * 8));
      for (auto& x : v) x = dist(rng);
      Tensor in = Tensor::f32({batch, 4, 8, 8}, v);
      auto want = ref.value()->run({{"x", in}});
      ASSERT_TRUE(want.is_ok()) << want.status().to_string();
      auto got = s.run({{"x", in}});
      ASSERT_TRUE(got.is_ok()) << got.status().to_string();
      ASSERT_EQ(got.value()[0].shape(), (Shape{batch, 5}));
      for (int64_t i = 0; i < batch * 5; ++i) {
        const float w = want.value()[0].data<float>()[i];
        EXPECT_NEAR(got.value()[0].data<float>()[i], w, 1e-4f + 1e-3f * std::fabs(w)) << "batch " << batch << " " << i;
      }
      EXPECT_EQ(s.shape_variant(), "x" + shape_to_string({batch, 4, 8, 8}));
      for (const auto& [name, op, dev, kernel] : s.placement())
        if (op == "Subgraph") chain_of[batch] = kernel;
    }
  EXPECT_EQ(s.shape_variant_count(), 2u);
  // A shape the model refuses is a clear error; the next good run works.
  auto bad = s.run({{"x", Tensor::f32({2, 5, 8, 8}, std::vector<float>(2 * 5 * 64))}});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("[2, 5, 8, 8]"), std::string::npos) << bad.status().message();
  EXPECT_TRUE(s.run({{"x", Tensor::f32({2, 4, 8, 8}, std::vector<float>(2 * 4 * 64, 0.5f))}}).is_ok());
  EXPECT_EQ(s.shape_variant_count(), 3u);

  if (!onednn) GTEST_SKIP() << "the oneDNN plugin is not loaded (not built?): claimed chains not checked";
  for (int64_t batch : {1, 3}) {
    ASSERT_TRUE(chain_of.count(batch)) << "no claimed subgraph at batch " << batch;
    EXPECT_EQ(chain_of[batch].rfind("onednn_chain", 0), 0u) << chain_of[batch];
  }
  // `keel bench --profile` reads this: the profile of the last run's build has the chain and its steps.
  bool chain_steps = false;
  for (const auto& p : s.profile())
    chain_steps = chain_steps || (p.op_type == "Subgraph" && p.calls > 0 && !p.steps.empty());
  EXPECT_TRUE(chain_steps);
}

}  // namespace
}  // namespace keel

// ---- Shape values: Reshape/Slice shapes computed at run time from Shape ops (a PyTorch export without constant
// folding). Session-time inference learns the small values (shape_values.h) and gives the devices static shapes,
// without rewriting the graph.
namespace keel {
namespace {

Tensor i64_scalar(int64_t v) { return Tensor::from_vector(DType::kI64, {}, std::vector<int64_t>{v}); }

// x[N,4] -> Reshape to [N*k, 4/2] -> Slice rows [0, N*k/k) -> Tanh (static_0) -> Tanh (static_1) -> Neg -> y[N,2].
// Every shape value comes from Shape(x) through Constant nodes, Gather, Mul, Div, Unsqueeze and Concat. k = 2 is a
// valid model; k = 3 makes the Reshape's element count wrong.
Graph computed_shape_graph(int64_t batch, int64_t k = 2) {
  GraphBuilder b("computed_shapes");
  auto x = b.input("x", DType::kF32, {batch, 4});
  auto c = [&](Tensor t) { return b.op1("Constant", {}, {{"value", Attribute::of_tensor(std::move(t))}}); };
  auto axis0 = c(Tensor::from_vector(DType::kI64, {1}, std::vector<int64_t>{0}));
  auto s = b.op1("Shape", {x});
  auto m = b.op1("Mul", {b.op1("Gather", {s, c(i64_scalar(0))}), c(i64_scalar(k))});
  auto h = b.op1("Div", {b.op1("Gather", {s, c(i64_scalar(1))}), c(i64_scalar(2))});
  auto shape = b.op1("Concat", {b.op1("Unsqueeze", {m, axis0}), b.op1("Unsqueeze", {h, axis0})},
                     {{"axis", Attribute::of_int(0)}});
  auto r = b.op1("Reshape", {x, shape});
  auto end = b.op1("Unsqueeze", {b.op1("Div", {m, c(i64_scalar(k))}), axis0});
  auto sl = b.op1("Slice", {r, axis0, end, axis0});
  b.output(b.op1("Neg", {b.op1("Tanh", {b.op1("Tanh", {sl})})}));
  Graph g = b.take();
  const std::vector<NodeId> order = g.topological_order().value();
  int t = 0;
  for (NodeId id : order)
    if (g.node(id)->op_type == "Tanh") g.node(id)->name = "static_" + std::to_string(t++);
  return g;
}

// The value that feeds Tanh (static_0).
std::string sliced_value(const Graph& g) {
  for (NodeId id : g.node_ids())
    if (g.node(id)->op_type == "Slice") return g.node(id)->outputs[0];
  return "";
}

// -tanh(tanh()) of the first 2N elements of x[N,4], as y[N,2].
void expect_computed_shape_output(const Tensor& x, const StatusOr<std::vector<Tensor>>& out) {
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const int64_t n = x.shape()[0];
  ASSERT_EQ(out.value()[0].shape(), (Shape{n, 2}));
  for (int64_t i = 0; i < 2 * n; ++i)
    EXPECT_NEAR(out.value()[0].data<float>()[i], -std::tanh(std::tanh(x.data<float>()[i])), 1e-6) << i;
}

Tensor rows_of_four(int64_t batch) {
  std::vector<float> v(static_cast<size_t>(batch * 4));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.3f * static_cast<float>(i) - 1.f;
  return Tensor::f32({batch, 4}, v);
}

TEST(ShapeValues, ComputedReshapeAndSliceShapesAreStaticAfterInferenceAndTheGraphIsKept) {
  Graph g = computed_shape_graph(3);
  const size_t nodes = g.node_count();
  ASSERT_TRUE(infer_shapes(g).is_ok());
  EXPECT_EQ(g.node_count(), nodes);
  EXPECT_TRUE(g.initializers.empty());
  for (NodeId id : g.node_ids()) {
    const Node& n = *g.node(id);
    if (n.op_type != "Reshape" && n.op_type != "Slice" && n.op_type != "Neg") continue;
    const ValueInfo* vi = g.info(n.outputs[0]);
    ASSERT_TRUE(vi && vi->shape) << n.op_type << " output has no shape";
    EXPECT_EQ(*vi->shape, n.op_type == "Reshape" ? (Shape{6, 2}) : (Shape{3, 2})) << n.op_type;
  }
}

TEST(ShapeValues, TheSessionRunsTheComputedShapesAsStaticOnesAndMatchesTheReference) {
  auto env = make_static_claimer_env();
  SessionOptions opts;
  opts.devices = {"cpu"};
  auto s = Session::create(*env, computed_shape_graph(3), opts);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const Graph& g = s.value()->graph();
  ASSERT_TRUE(g.info(sliced_value(g)) && g.info(sliced_value(g))->shape);
  EXPECT_EQ(*g.info(sliced_value(g))->shape, (Shape{3, 2}));
  // The static-shape claimer took the Tanh pair: it saw a static input.
  EXPECT_TRUE(has_subgraph(*s.value(), "static_chain"));
  Tensor x = rows_of_four(3);
  expect_computed_shape_output(x, s.value()->run({{"x", x}}));
}

TEST(ShapeValues, ADynamicBatchIsSpecialisedPerShapeVariant) {
  auto env = make_static_claimer_env();
  SessionOptions opts;
  opts.devices = {"cpu"};
  auto created = Session::create(*env, computed_shape_graph(-1), opts);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  Session& s = *created.value();
  EXPECT_FALSE(has_subgraph(s, "static_chain"));  // the generic build: N is symbolic
  for (int64_t batch : {1, 3, 1}) {
    Tensor x = rows_of_four(batch);
    expect_computed_shape_output(x, s.run({{"x", x}}));
    EXPECT_EQ(s.shape_variant(), "x" + shape_to_string({batch, 4}));
    EXPECT_TRUE(has_subgraph(s, "static_chain")) << "batch " << batch;
  }
  EXPECT_EQ(s.shape_variant_count(), 2u);
}

TEST(ShapeValues, AWrongComputedShapeIsAnErrorNotACrash) {
  auto env = make_static_claimer_env();
  SessionOptions opts;
  opts.devices = {"cpu"};
  for (int64_t batch : {2, -1}) {
    auto s = Session::create(*env, computed_shape_graph(batch, 3), opts);  // Reshape [2,4] to [6,2]
    if (!s.is_ok()) {
      EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().to_string();
      continue;
    }
    auto out = s.value()->run({{"x", rows_of_four(2)}});
    ASSERT_FALSE(out.is_ok()) << "batch " << batch;
    EXPECT_NE(out.status().message().find("Reshape"), std::string::npos) << out.status().to_string();
  }
}

TEST(ShapeValues, HugeComputedShapesAreNeitherEvaluatedNorAllocated) {
  // Range(0, N * 1e12) has a computed length; ConstantOfShape(Shape(range)) would be terabytes.
  GraphBuilder b("huge");
  auto x = b.input("x", DType::kF32, {3, 4});
  auto c = [&](Tensor t) { return b.op1("Constant", {}, {{"value", Attribute::of_tensor(std::move(t))}}); };
  auto n = b.op1("Gather", {b.op1("Shape", {x}), c(i64_scalar(0))});
  auto range = b.op1("Range", {c(i64_scalar(0)), b.op1("Mul", {n, c(i64_scalar(1000000000000))}), c(i64_scalar(1))});
  auto filled = b.op1("ConstantOfShape", {b.op1("Shape", {range})});
  b.output(b.op1("Shape", {filled}));
  Graph g = b.take();
  // Such a model cannot run, and inference says so by name (check_static_sizes); learning its shapes evaluated and
  // allocated nothing on the way (24 TB for the range alone).
  Status st = infer_shapes(g);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("cannot run"), std::string::npos) << st.to_string();
  const ValueInfo* vi = g.info(range);
  ASSERT_TRUE(vi && vi->shape);
  EXPECT_EQ(*vi->shape, (Shape{3000000000000}));  // the size is known, the values are not computed
}

}  // namespace
}  // namespace keel
