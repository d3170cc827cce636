// The pass plugins (passes/canonicalize, passes/fusion) loaded as plugins from the build tree, each pass on small
// GraphBuilder graphs: the structure after the pass, and the outputs before/after equal when both graphs run in
// sessions on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "core/base/pass_manager.h"
#include "core/runtime/environment.h"
#include "core/runtime/host_api.h"
#include "core/runtime/kernel_context.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "tests/passes/pass_test_env.h"

namespace keel {
namespace {

Tensor randn(Shape shape, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  return Tensor::f32(std::move(shape), v);
}
Tensor i64(Shape shape, std::vector<int64_t> v) { return Tensor::from_vector(DType::kI64, std::move(shape), v); }

using Feeds = std::vector<std::pair<std::string, Tensor>>;

std::vector<Tensor> run(Graph g, const Feeds& feeds) {
  SessionOptions o;
  o.devices = {"cpu"};
  auto s = Session::create(env(), std::move(g), o);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  if (!s.is_ok()) return {};
  auto out = s.value()->run(feeds);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.is_ok() ? std::move(out).value() : std::vector<Tensor>{};
}

// Runs a pipeline the way a session does (shapes inferred first). Returns the reports.
std::vector<PassReport> run_passes(Graph& g, const std::vector<PassSpec>& pipeline, const std::string& device = "cpu") {
  EXPECT_TRUE(infer_shapes(g).is_ok());
  keel_graph_s view;
  view.graph = &g;
  view.env = &env();
  auto r = PassManager(env().registry(), graph_api()).run(g, &view, pipeline, device);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(g.validate().is_ok());
  return r.is_ok() ? std::move(r).value() : std::vector<PassReport>{};
}
// The fusion passes get any_kernel = true: these tests check the rewrites themselves, which on the oneDNN CPU (its
// Conv/MatMul ranked above the reference keel ops) the default ranking rule would skip; the rule has its own test.
std::vector<PassReport> run_passes(Graph& g, const std::string& list, const std::string& device = "cpu") {
  std::vector<PassSpec> specs = parse_pipeline_list(list).value();
  for (PassSpec& s : specs)
    if (s.name.rfind("fuse_", 0) == 0 && s.name != "fuse_conv_bn") s.options.values["any_kernel"] = true;
  return run_passes(g, specs, device);
}

// The priority of the kernel a session would pick for an op on the cpu (INT32_MIN when none).
// The priority of the best cpu kernel for f32 data (the fusion passes' question: a bf16-only kernel does not count).
int32_t best_priority(const std::string& domain, const std::string& op, int32_t opset) {
  for (const KernelEntry* k : env().registry().kernels_for(domain, op, opset, "cpu")) {
    bool f32 = k->constraints.empty();
    for (const auto& c : k->constraints)
      for (DType d : c.dtypes) f32 = f32 || d == DType::kF32;
    if (f32) return k->priority;
  }
  return INT32_MIN;
}

size_t count_op(const Graph& g, const std::string& op, const std::string& domain = "") {
  size_t n = 0;
  for (NodeId id : g.node_ids()) n += g.node(id)->op_type == op && g.node(id)->domain == domain;
  return n;
}

void expect_near(const std::vector<Tensor>& a, const std::vector<Tensor>& b, float tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].shape(), b[k].shape()) << "output " << k;
    ASSERT_EQ(a[k].dtype(), b[k].dtype());
    if (a[k].dtype() != DType::kF32) {
      EXPECT_EQ(0, std::memcmp(a[k].raw_data(), b[k].raw_data(), a[k].byte_size()));
      continue;
    }
    float worst = 0;
    for (int64_t i = 0; i < a[k].numel(); ++i) {
      float x = a[k].data<float>()[i], y = b[k].data<float>()[i];
      worst = std::max(worst, std::fabs(x - y) / std::max(1.f, std::fabs(y)));
    }
    EXPECT_LE(worst, tol) << "output " << k;
  }
}

// Runs `g` before and after `pipeline` on `feeds` and checks the outputs agree.
Graph check_pipeline(Graph g, const std::string& pipeline, const Feeds& feeds, float tol = 1e-5f,
                     std::vector<PassReport>* reports = nullptr) {
  auto before = run(g, feeds);
  auto r = run_passes(g, pipeline);
  if (reports) *reports = r;
  auto after = run(g, feeds);
  expect_near(after, before, tol);
  return g;
}

// ------------------------------------------------------------------------------------------------ canonicalize

TEST(FoldConstants, StaticShapeChainLeavesOneReshapeWithAConstantShape) {
  GraphBuilder b("shape_chain", 13);
  auto x = b.input("x", DType::kF32, {2, 3, 4});
  auto s = b.op1("Shape", {x});
  auto g0 = b.op1("Gather", {s, b.constant("zero", i64({}, {0}))}, {{"axis", Attribute::of_int(0)}});
  auto u0 = b.op1("Unsqueeze", {g0, b.constant("axes", i64({1}, {0}))});
  auto cat = b.op1("Concat", {u0, b.constant("minus1", i64({1}, {-1}))}, {{"axis", Attribute::of_int(0)}});
  auto y = b.op1("Reshape", {x, cat});
  b.output(b.op1("Relu", {y}));
  std::vector<PassReport> reports;
  Graph g = check_pipeline(b.take(), "fold_constants", {{"x", randn({2, 3, 4}, 1)}}, 0, &reports);
  EXPECT_EQ(g.node_count(), 2u);
  ASSERT_EQ(count_op(g, "Reshape"), 1u);
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    if (n->op_type != "Reshape") continue;
    ASSERT_TRUE(g.is_initializer(n->inputs[1]));
    const Tensor& t = g.initializers.at(n->inputs[1]);
    ASSERT_EQ(t.numel(), 2);
    EXPECT_EQ(t.data<int64_t>()[0], 2);
    EXPECT_EQ(t.data<int64_t>()[1], -1);
  }
  EXPECT_GE(reports[0].counters.at("shapes_folded"), 1);
  EXPECT_EQ(g.initializers.count("zero"), 0u) << "constants only the folded nodes read are dropped";
}

TEST(FoldConstants, MaxBytesFromATomlPipelineKeepsBigResults) {
  auto make = [] {
    GraphBuilder b("expand");
    auto x = b.input("x", DType::kF32, {64, 64});
    auto big = b.op1("Expand", {b.constant("one", Tensor::f32({1}, {1.f})), b.constant("shape", i64({2}, {64, 64}))});
    b.output(b.op1("Add", {x, big}));
    return b.take();
  };
  Feeds feeds = {{"x", randn({64, 64}, 2)}};
  Graph folded = check_pipeline(make(), "fold_constants", feeds);
  EXPECT_EQ(folded.node_count(), 1u);
  auto pipeline = parse_pipeline_toml(R"([[pass]]
name = "fold_constants"
[pass.options]
max_bytes = 1024
[[pass]]
name = "eliminate_dead_code"
)",
                                      "test.toml");
  ASSERT_TRUE(pipeline.is_ok()) << pipeline.status().to_string();
  Graph kept = make();
  auto before = run(kept, feeds);
  auto reports = run_passes(kept, pipeline.value());
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(kept.node_count(), 2u) << "a 16 KiB result stays computed under max_bytes = 1024";
  expect_near(run(kept, feeds), before, 0);
}

TEST(FoldConstants, RandomOpsStay) {
  GraphBuilder b("random");
  auto x = b.input("x", DType::kF32, {2, 2});
  auto r = b.op1("RandomUniform", {}, {{"shape", Attribute::of_ints({2, 2})}, {"dtype", Attribute::of_int(1)}});
  b.output(b.op1("Add", {x, r}));
  Graph g = b.take();
  run_passes(g, "fold_constants");
  EXPECT_EQ(count_op(g, "RandomUniform"), 1u);
}

TEST(EliminateDeadCode, RemovesUnreachableNodesAndTheirConstants) {
  GraphBuilder b("dead");
  auto x = b.input("x", DType::kF32, {4});
  auto w = b.constant("w", Tensor::f32({4}, {1, 2, 3, 4}));
  auto dead = b.op1("Mul", {x, w});
  b.op1("Sigmoid", {dead});
  b.output(b.op1("Relu", {x}));
  std::vector<PassReport> reports;
  Graph g = check_pipeline(b.take(), "eliminate_dead_code", {{"x", randn({4}, 3)}}, 0, &reports);
  EXPECT_EQ(g.node_count(), 1u);
  EXPECT_EQ(g.initializers.count("w"), 0u);
  EXPECT_EQ(reports[0].counters.at("nodes_removed"), 2);
  EXPECT_EQ(reports[0].counters.at("bytes_saved"), 16);
}

TEST(RemoveIdentity, RemovesNoOpsAndKeepsGraphOutputNames) {
  GraphBuilder b("ids");
  auto x = b.input("x", DType::kF32, {2, 3});
  auto a = b.op1("Identity", {x});
  auto d = b.op("Dropout", {a}, {}, 2)[0];  // mask unused
  auto c = b.op1("Cast", {d}, {{"to", Attribute::of_int(1)}});
  auto r = b.op1("Reshape", {c, b.constant("shape", i64({2}, {2, 3}))});
  auto t = b.op1("Transpose", {r}, {{"perm", Attribute::of_ints({0, 1})}});
  auto e = b.op1("Exp", {t});
  auto out = b.op1("Identity", {e});
  b.output(out);
  Graph g = check_pipeline(b.take(), "remove_identity", {{"x", randn({2, 3}, 4)}}, 0);
  EXPECT_EQ(g.node_count(), 1u) << "only Exp stays";
  ASSERT_EQ(g.outputs.size(), 1u);
  EXPECT_EQ(g.outputs[0], out) << "the graph output keeps its name";
  EXPECT_EQ(g.initializers.count("shape"), 0u);
}

// Values that only a subgraph reads (an If branch) are live: dead-code elimination keeps their producers, identity
// removal renames the read inside the branch, and folding and CSE leave the If alone.
TEST(Canonicalize, ValuesReadOnlyInsideSubgraphsStay) {
  auto make = [] {
    GraphBuilder b("if_outer", 17);
    auto x = b.input("x", DType::kF32, {4});
    b.input("cond", DType::kBool, {});
    auto w = b.constant("w", Tensor::f32({4}, {1, 2, 3, 4}));
    Node mul;
    mul.name = "mul";
    mul.op_type = "Mul";
    mul.inputs = {x, w};
    mul.outputs = {"xw"};
    b.graph().add_node(mul);
    Node id = mul;
    id.name = "id";
    id.op_type = "Identity";
    id.inputs = {"xw"};
    id.outputs = {"xw_id"};
    b.graph().add_node(id);
    auto branch = [](const std::string& name, const std::string& op, const std::string& in) {
      auto g = std::make_shared<Graph>();
      g->name = name;
      Node n;
      n.name = name + "_node";
      n.op_type = op;
      n.inputs = {in};
      n.outputs = {name + "_y"};
      g->add_node(n);
      g->outputs = {name + "_y"};
      Attribute a;
      a.kind = AttrKind::kGraph;
      a.g = g;
      return a;
    };
    Node iff;
    iff.name = "if";
    iff.op_type = "If";
    iff.inputs = {"cond"};
    iff.outputs = {"y"};
    iff.attrs = {{"then_branch", branch("then", "Relu", "xw_id")}, {"else_branch", branch("else", "Neg", "x")}};
    b.graph().add_node(iff);
    b.output("y");
    return b.take();
  };
  for (bool cond : {true, false}) {
    Feeds feeds = {{"x", randn({4}, 11)}, {"cond", Tensor::from_vector<uint8_t>(DType::kBool, {}, {cond})}};
    Graph g = check_pipeline(
        make(), "fold_constants,remove_identity,eliminate_common_subexpressions,eliminate_dead_code", feeds, 0);
    EXPECT_EQ(count_op(g, "Mul"), 1u) << "the Mul feeds only the then branch";
    EXPECT_EQ(count_op(g, "Identity"), 0u);
    EXPECT_EQ(count_op(g, "If"), 1u);
    EXPECT_EQ(g.initializers.count("w"), 1u);
  }
}

TEST(RemoveIdentity, KeepsAnIdentityFromAGraphInputToAGraphOutput) {
  GraphBuilder b("passthrough");
  auto x = b.input("x", DType::kF32, {2});
  b.output(b.op1("Identity", {x}));
  Graph g = b.take();
  auto reports = run_passes(g, "remove_identity");
  EXPECT_EQ(g.node_count(), 1u);
  EXPECT_FALSE(reports[0].notes.empty());
}

TEST(EliminateCommonSubexpressions, MergesEqualNodesAndConstants) {
  GraphBuilder b("cse");
  auto x = b.input("x", DType::kF32, {3});
  auto c1 = b.constant("c1", Tensor::f32({1}, {2.f}));
  auto c2 = b.constant("c2", Tensor::f32({1}, {2.f}));
  auto m1 = b.op1("Mul", {x, c1});
  auto m2 = b.op1("Mul", {x, c2});
  auto s1 = b.op1("Sigmoid", {m1});
  auto s2 = b.op1("Sigmoid", {m2});
  auto lr1 = b.op1("LeakyRelu", {x}, {{"alpha", Attribute::of_float(0.1f)}});
  auto lr2 = b.op1("LeakyRelu", {x}, {{"alpha", Attribute::of_float(0.2f)}});
  b.output(b.op1("Sum", {s1, s2, lr1, lr2}));
  std::vector<PassReport> reports;
  Graph g = check_pipeline(b.take(), "eliminate_common_subexpressions", {{"x", randn({3}, 5)}}, 0, &reports);
  EXPECT_EQ(count_op(g, "Mul"), 1u);
  EXPECT_EQ(count_op(g, "Sigmoid"), 1u);
  EXPECT_EQ(count_op(g, "LeakyRelu"), 2u) << "different attributes are different expressions";
  EXPECT_EQ(reports[0].counters.at("nodes_merged"), 2);
  EXPECT_EQ(reports[0].counters.at("initializers_merged"), 1);
}

// ------------------------------------------------------------------------------------------------ fusion

TEST(FuseConvBn, FoldsBatchNormIntoTheConvWithin1e5) {
  GraphBuilder b("conv_bn");
  auto x = b.input("x", DType::kF32, {2, 3, 8, 8});
  auto c = b.op1("Conv", {x, b.constant("w", randn({4, 3, 3, 3}, 6)), b.constant("b", randn({4}, 7))},
                 {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
  auto y = b.op("BatchNormalization",
                {c, b.constant("scale", randn({4}, 8, 0.5f, 1.5f)), b.constant("shift", randn({4}, 9)),
                 b.constant("mean", randn({4}, 10)), b.constant("var", randn({4}, 11, 0.2f, 2.f))},
                {{"epsilon", Attribute::of_float(1e-3f)}})[0];
  b.output(y);
  std::vector<PassReport> reports;
  Graph g = check_pipeline(b.take(), "fuse_conv_bn", {{"x", randn({2, 3, 8, 8}, 12)}}, 1e-5f, &reports);
  EXPECT_EQ(g.node_count(), 1u);
  EXPECT_EQ(count_op(g, "Conv"), 1u);
  EXPECT_EQ(g.outputs[0], y);
  EXPECT_EQ(reports[0].counters.at("ops_fused"), 1);
  EXPECT_EQ(g.initializers.count("w"), 0u);
  EXPECT_EQ(g.initializers.count("var"), 0u);
}

Graph conv_residual_relu() {
  GraphBuilder b("conv_res");
  auto x = b.input("x", DType::kF32, {1, 4, 6, 6});
  auto c = b.op1("Conv", {x, b.constant("w", randn({4, 4, 3, 3}, 13))}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
  auto bias = b.op1("Add", {c, b.constant("bias", randn({1, 4, 1, 1}, 14))});
  auto res = b.op1("Add", {bias, x});
  b.output(b.op1("Relu", {res}));
  return b.take();
}

TEST(FuseConvActivation, ConvBiasResidualReluBecomesOneFusedConv) {
  std::vector<PassReport> reports;
  Graph g =
      check_pipeline(conv_residual_relu(), "fuse_conv_activation", {{"x", randn({1, 4, 6, 6}, 15)}}, 1e-5f, &reports);
  EXPECT_EQ(g.node_count(), 1u);
  ASSERT_EQ(count_op(g, "FusedConv", "keel"), 1u);
  EXPECT_EQ(reports[0].counters.at("ops_fused"), 1);
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    EXPECT_EQ(n->inputs.size(), 4u);
    EXPECT_EQ(n->inputs[3], "x");
    EXPECT_EQ(n->attr("activation")->s, "Relu");
  }
}

TEST(FuseConvActivation, SkippedWhenTheTargetDeviceHasNoKernel) {
  Graph g = conv_residual_relu();
  auto reports = run_passes(g, "fuse_conv_activation", "fake_accelerator");
  EXPECT_EQ(g.node_count(), 4u) << "the nodes stay as they were";
  EXPECT_EQ(count_op(g, "FusedConv", "keel"), 0u);
  ASSERT_EQ(reports[0].notes.size(), 1u);
  EXPECT_NE(reports[0].notes[0].find("no kernel"), std::string::npos) << reports[0].notes[0];
}

TEST(FuseMatMulActivation, MatMulBiasReluAndGemmClip) {
  GraphBuilder b("mm");
  auto x = b.input("x", DType::kF32, {2, 5, 8});
  auto m = b.op1("MatMul", {x, b.constant("w", randn({8, 6}, 16))});
  auto a = b.op1("Add", {m, b.constant("bias", randn({6}, 17))});
  auto r = b.op1("Relu", {a});
  auto flat = b.op1("Reshape", {r, b.constant("shape", i64({2}, {10, 6}))});
  auto gm = b.op1("Gemm", {flat, b.constant("w2", randn({3, 6}, 18)), b.constant("c2", randn({3}, 19))},
                  {{"transB", Attribute::of_int(1)}, {"alpha", Attribute::of_float(0.5f)}});
  b.output(b.op1("Clip", {gm, b.constant("lo", Tensor::f32({}, {-0.2f})), b.constant("hi", Tensor::f32({}, {0.3f}))}));
  Graph g = check_pipeline(b.take(), "fuse_matmul_activation", {{"x", randn({2, 5, 8}, 20)}}, 1e-5f);
  EXPECT_EQ(count_op(g, "FusedMatMul", "keel"), 1u);
  EXPECT_EQ(count_op(g, "FusedGemm", "keel"), 1u);
  EXPECT_EQ(g.node_count(), 3u);
}

TEST(FuseGelu, ErfPatternBecomesKeelGelu) {
  GraphBuilder b("gelu");
  auto x = b.input("x", DType::kF32, {3, 7});
  auto d = b.op1("Div", {x, b.constant("sqrt2", Tensor::f32({}, {1.4142135f}))});
  auto e = b.op1("Erf", {d});
  auto a = b.op1("Add", {e, b.constant("one", Tensor::f32({}, {1.f}))});
  auto m = b.op1("Mul", {x, a});
  b.output(b.op1("Mul", {m, b.constant("half", Tensor::f32({}, {0.5f}))}));
  Graph g = check_pipeline(b.take(), "fuse_gelu", {{"x", randn({3, 7}, 21, -3, 3)}}, 1e-5f);
  EXPECT_EQ(g.node_count(), 1u);
  EXPECT_EQ(count_op(g, "Gelu", "keel"), 1u);
}

// The tanh approximation as torch exports F.gelu(approximate="tanh"): x * (x * x) for the cube, x * (1 + tanh) * 0.5.
TEST(FuseGelu, TorchTanhPatternBecomesKeelGeluTanh) {
  GraphBuilder b("gelu_tanh");
  auto x = b.input("x", DType::kF32, {3, 7});
  auto sq = b.op1("Mul", {x, x});
  auto cube = b.op1("Mul", {x, sq});
  auto kc = b.op1("Mul", {b.constant("kappa", Tensor::f32({}, {0.044715f})), cube});
  auto in = b.op1("Add", {x, kc});
  auto u = b.op1("Mul", {b.constant("beta", Tensor::f32({}, {0.7978845608f})), in});
  auto t = b.op1("Tanh", {u});
  auto a = b.op1("Add", {b.constant("one", Tensor::f32({}, {1.f})), t});
  auto m = b.op1("Mul", {x, a});
  b.output(b.op1("Mul", {b.constant("half", Tensor::f32({}, {0.5f})), m}));
  Graph g = check_pipeline(b.take(), "fuse_gelu", {{"x", randn({3, 7}, 25, -4, 4)}}, 1e-5f);
  ASSERT_EQ(g.node_count(), 1u);
  EXPECT_EQ(count_op(g, "Gelu", "keel"), 1u);
  const Node& n = *g.node(g.node_ids()[0]);
  ASSERT_NE(n.attr("approximate"), nullptr);
  EXPECT_EQ(n.attr("approximate")->s, "tanh");
}

// Hugging Face's gelu_new (GPT-2): 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3)))), operands reversed;
// a wrong constant (0.05 instead of 0.044715) is left alone.
TEST(FuseGelu, PowTanhPatternBecomesKeelGeluTanhAndAWrongConstantDoesNot) {
  for (float kappa : {0.044715f, 0.05f}) {
    GraphBuilder b("gelu_new");
    auto x = b.input("x", DType::kF32, {2, 9});
    auto hx = b.op1("Mul", {b.constant("half", Tensor::f32({}, {0.5f})), x});
    auto cube = b.op1("Pow", {x, b.constant("three", Tensor::f32({}, {3.f}))});
    auto kc = b.op1("Mul", {cube, b.constant("kappa", Tensor::f32({}, {kappa}))});
    auto in = b.op1("Add", {kc, x});
    auto u = b.op1("Mul", {in, b.constant("beta", Tensor::f32({}, {0.7978845608f}))});
    auto a = b.op1("Add", {b.op1("Tanh", {u}), b.constant("one", Tensor::f32({}, {1.f}))});
    b.output(b.op1("Mul", {hx, a}));
    Graph g = check_pipeline(b.take(), "fuse_gelu", {{"x", randn({2, 9}, 26, -4, 4)}}, 1e-5f);
    EXPECT_EQ(count_op(g, "Gelu", "keel"), kappa == 0.044715f ? 1u : 0u) << kappa;
    EXPECT_EQ(g.node_count(), kappa == 0.044715f ? 1u : 8u) << kappa;
  }
}

Graph decomposed_layer_norm(int32_t opset) {
  GraphBuilder b("ln", opset);
  auto x = b.input("x", DType::kF32, {2, 5, 16});
  auto axes = Attribute::of_ints({-1});
  auto mean = b.op1("ReduceMean", {x}, {{"axes", axes}});
  auto d = b.op1("Sub", {x, mean});
  auto p = b.op1("Pow", {d, b.constant("two", Tensor::f32({}, {2.f}))});
  auto var = b.op1("ReduceMean", {p}, {{"axes", axes}});
  auto ve = b.op1("Add", {var, b.constant("eps", Tensor::f32({}, {1e-5f}))});
  auto sd = b.op1("Sqrt", {ve});
  auto n = b.op1("Div", {d, sd});
  auto s = b.op1("Mul", {n, b.constant("gamma", randn({16}, 22))});
  b.output(b.op1("Add", {s, b.constant("beta", randn({16}, 23))}));
  return b.take();
}

TEST(FuseLayerNorm, DecomposedPatternBecomesOnnxLayerNormalizationAtOpset17) {
  Graph g = check_pipeline(decomposed_layer_norm(17), "fuse_layer_norm", {{"x", randn({2, 5, 16}, 24)}}, 1e-5f);
  EXPECT_EQ(g.node_count(), 1u);
  EXPECT_EQ(count_op(g, "LayerNormalization"), 1u);
}

TEST(FuseLayerNorm, OlderOpsetsGetTheKeelOp) {
  Graph g = check_pipeline(decomposed_layer_norm(13), "fuse_layer_norm", {{"x", randn({2, 5, 16}, 25)}}, 1e-5f);
  EXPECT_EQ(g.node_count(), 1u);
  EXPECT_EQ(count_op(g, "LayerNormalization", "keel"), 1u);
}

TEST(FuseAttention, ScaledDotProductBecomesKeelAttention) {
  GraphBuilder b("attn");
  auto q = b.input("q", DType::kF32, {2, 4, 6, 8});
  auto k = b.input("k", DType::kF32, {2, 4, 6, 8});
  auto v = b.input("v", DType::kF32, {2, 4, 6, 8});
  auto kt = b.op1("Transpose", {k}, {{"perm", Attribute::of_ints({0, 1, 3, 2})}});
  auto s = b.op1("MatMul", {q, kt});
  auto sc = b.op1("Div", {s, b.constant("scale", Tensor::f32({}, {std::sqrt(8.f)}))});
  auto masked = b.op1("Add", {sc, b.constant("mask", randn({1, 1, 6, 6}, 26, -2, 0))});
  auto p = b.op1("Softmax", {masked}, {{"axis", Attribute::of_int(-1)}});
  b.output(b.op1("MatMul", {p, v}));
  Feeds feeds = {{"q", randn({2, 4, 6, 8}, 27)}, {"k", randn({2, 4, 6, 8}, 28)}, {"v", randn({2, 4, 6, 8}, 29)}};
  Graph g = check_pipeline(b.take(), "fuse_attention", feeds, 1e-5f);
  EXPECT_EQ(count_op(g, "Attention", "keel"), 1u);
  EXPECT_EQ(g.node_count(), 2u) << "Transpose + Attention";
}

// torch's export of nn.MultiheadAttention: q scaled (Div by sqrt(d)) before q @ k^T; another export scales k by a
// Mul. Both factors go into the scale attribute and their nodes away.
Graph prescaled_attention() {
  GraphBuilder b("attn_prescaled", 13);
  auto q = b.input("q", DType::kF32, {4, 7, 8});
  auto k = b.input("k", DType::kF32, {4, 7, 8});
  auto v = b.input("v", DType::kF32, {4, 7, 8});
  auto qs = b.op1("Div", {q, b.constant("eight", Tensor::f32({}, {std::sqrt(8.f)}))});
  auto kt = b.op1("Transpose", {k}, {{"perm", Attribute::of_ints({0, 2, 1})}});
  auto ks = b.op1("Mul", {b.constant("half", Tensor::f32({}, {0.5f})), kt});
  auto p = b.op1("Softmax", {b.op1("MatMul", {qs, ks})}, {{"axis", Attribute::of_int(-1)}});
  b.output(b.op1("MatMul", {p, v}));
  return b.take();
}

TEST(FuseAttention, ScalesOfQueryAndKeyFoldIntoTheAttention) {
  Feeds feeds = {{"q", randn({4, 7, 8}, 40, -3, 3)}, {"k", randn({4, 7, 8}, 41, -3, 3)}, {"v", randn({4, 7, 8}, 42)}};
  Graph g = check_pipeline(prescaled_attention(), "fuse_attention", feeds, 1e-5f);
  EXPECT_EQ(count_op(g, "Attention", "keel"), 1u);
  EXPECT_EQ(g.node_count(), 2u) << "Transpose + Attention";
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    if (n->op_type != "Attention") continue;
    auto it = n->attrs.find("scale");
    ASSERT_NE(it, n->attrs.end());
    EXPECT_NEAR(it->second.f, 0.5f / std::sqrt(8.f), 1e-6f);
  }
}

// Without any_kernel the rule holds: keel.Attention where its best cpu kernel ranks at least as high as MatMul's
// (the oneDNN plugin's, when it is loaded), else the nodes stay.
TEST(FuseAttention, FiresWhereTheDeviceRanksItsKernelAsHighAsMatMul) {
  const int32_t fused = best_priority("keel", "Attention", 1), mm = best_priority("", "MatMul", 13);
  Graph g = prescaled_attention();
  auto reports = run_passes(g, std::vector<PassSpec>{PassSpec{"fuse_attention", {}}});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(count_op(g, "Attention", "keel"), fused >= mm ? 1u : 0u)
      << "keel.Attention priority " << fused << ", MatMul " << mm;
  if (fused < mm) {
    bool noted = false;
    for (const auto& n : reports[0].notes) noted = noted || n.find("ranks below") != std::string::npos;
    EXPECT_TRUE(noted);
  }
}

// ------------------------------------------------------------------------------------------------ pipelines

TEST(Pipeline, DefaultPipelineInASessionGivesTheSameOutputs) {
  auto make = [] {
    GraphBuilder b("net", 13);
    auto x = b.input("x", DType::kF32, {1, 3, 8, 8});
    auto id = b.op1("Identity", {x});
    auto c =
        b.op1("Conv", {id, b.constant("w", randn({4, 3, 3, 3}, 30))}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
    auto bn =
        b.op("BatchNormalization", {c, b.constant("s", randn({4}, 31, 0.5f, 1.5f)), b.constant("t", randn({4}, 32)),
                                    b.constant("m", randn({4}, 33)), b.constant("v", randn({4}, 34, 0.5f, 1.5f))})[0];
    auto r = b.op1("Relu", {bn});
    auto shape = b.op1("Shape", {r});
    auto n0 = b.op1("Gather", {shape, b.constant("i0", i64({1}, {0}))}, {{"axis", Attribute::of_int(0)}});
    auto cat = b.op1("Concat", {n0, b.constant("m1", i64({1}, {-1}))}, {{"axis", Attribute::of_int(0)}});
    auto flat = b.op1("Reshape", {r, cat});
    auto m = b.op1("MatMul", {flat, b.constant("fc", randn({256, 10}, 35))});
    b.output(b.op1("Add", {m, b.constant("fcb", randn({10}, 36))}));
    return b.take();
  };
  Feeds feeds = {{"x", randn({1, 3, 8, 8}, 37)}};
  auto before = run(make(), feeds);
  SessionOptions o;
  o.devices = {"cpu"};
  o.passes = {"fold_constants",         "remove_identity",    "eliminate_common_subexpressions",
              "eliminate_dead_code",    "fuse_conv_bn",       "fuse_gelu",
              "fuse_layer_norm",        "fuse_attention",     "fuse_conv_activation",
              "fuse_matmul_activation", "eliminate_dead_code"};
  auto s = Session::create(env(), make(), o);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const Graph& g = s.value()->graph();
  // Fused only where the keel ops' kernels rank at least as high as Conv's / MatMul's (not on the oneDNN CPU).
  const bool conv_fuses = best_priority("keel", "FusedConv", 1) >= best_priority("", "Conv", 17);
  const bool mm_fuses = best_priority("keel", "FusedMatMul", 1) >= best_priority("", "MatMul", 17);
  EXPECT_EQ(count_op(g, "FusedConv", "keel"), conv_fuses ? 1u : 0u);
  EXPECT_EQ(count_op(g, "FusedMatMul", "keel"), mm_fuses ? 1u : 0u);
  EXPECT_EQ(count_op(g, "Reshape"), 1u);
  if (conv_fuses && mm_fuses) {
    EXPECT_EQ(g.node_count(), 3u);
  }
  auto after = s.value()->run(feeds);
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  expect_near(after.value(), before, 1e-5f);
}

TEST(FuseConvActivation, KeepsTheDevicesHigherRankedKernels) {
  // Without any_kernel, keel.FusedConv is produced only where its kernel ranks at least as high as Conv's.
  const int32_t fused = best_priority("keel", "FusedConv", 1), conv = best_priority("", "Conv", 17);
  if (fused >= conv) GTEST_SKIP() << "no Conv kernel ranked above keel.FusedConv's here (oneDNN not loaded)";
  Graph g = conv_residual_relu();
  auto reports = run_passes(g, std::vector<PassSpec>{PassSpec{"fuse_conv_activation", {}}});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(count_op(g, "FusedConv", "keel"), 0u);
  EXPECT_EQ(count_op(g, "Conv"), 1u);
  bool noted = false;
  for (const auto& n : reports[0].notes) noted = noted || n.find("ranks below Conv's") != std::string::npos;
  EXPECT_TRUE(noted);
}

// A pass asks the registry of the environment it runs in, whatever environment was created last: beside this one
// (oneDNN's Conv ranked above keel.FusedConv's reference kernel), an environment with the fusion pass alone (reference
// kernels only: keel.FusedConv ranks as Conv there) fuses, and this one still does not. (The pass plugins kept one
// global plugin handle, the last initialised environment's, so this pass asked the other environment's registry.)
TEST(FuseConvActivation, AsksTheRegistryOfTheEnvironmentItRunsIn) {
  const int32_t fused = best_priority("keel", "FusedConv", 1), conv = best_priority("", "Conv", 17);
  if (fused >= conv) GTEST_SKIP() << "no Conv kernel ranked above keel.FusedConv's here (oneDNN not loaded)";
  EnvironmentOptions o;
  o.discover_plugins = false;
  const char* dir = std::getenv("KEEL_PASSES_PLUGIN_DIR");
  o.libraries.emplace_back(std::filesystem::path(dir ? dir : KEEL_PASSES_PLUGIN_DIR_DEFAULT) /
                           "libkeel_pass_fusion.so");
  auto other = Environment::create(o);
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  const std::vector<PassSpec> pipeline{PassSpec{"fuse_conv_activation", {}}};
  Graph there = conv_residual_relu();
  ASSERT_TRUE(infer_shapes(there).is_ok());
  keel_graph_s view;
  view.graph = &there;
  view.env = other.value().get();
  auto r = PassManager(other.value()->registry(), graph_api()).run(there, &view, pipeline, "cpu");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(count_op(there, "FusedConv", "keel"), 1u) << "reference kernels only: keel.FusedConv ranks as Conv";
  Graph here = conv_residual_relu();
  run_passes(here, pipeline);
  EXPECT_EQ(count_op(here, "FusedConv", "keel"), 0u) << "this environment's oneDNN Conv ranks above keel.FusedConv";
}

TEST(Pipeline, OptimizedGraphSavesAndReloadsAsOnnx) {
  Graph g = conv_residual_relu();
  run_passes(g, "fuse_conv_activation");
  auto bytes = serialize_onnx(g);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  auto back = load_onnx_from_memory(bytes->data(), bytes->size(), {});
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(count_op(back.value(), "FusedConv", "keel"), 1u);
  Feeds feeds = {{"x", randn({1, 4, 6, 6}, 38)}};
  expect_near(run(std::move(back).value(), feeds), run(conv_residual_relu(), feeds), 1e-5f);
}

}  // namespace
}  // namespace keel
