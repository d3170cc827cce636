// The prune and quantize_int8 pass plugins (passes/prune, passes/quantize_int8), loaded from the build tree: magnitude
// pruning reaches its ratio, channel pruning shrinks Conv weights (and keeps the outputs when the pruned channels
// were all zero), and the QDQ model stays close (cosine >= 0.99) to fp32 on a small random conv net.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
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

std::vector<float> randv(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

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

std::vector<PassReport> run_pass(Graph& g, const std::string& name, Options opts) {
  EXPECT_TRUE(infer_shapes(g).is_ok());
  keel_graph_s view;
  view.graph = &g;
  view.env = &env();
  auto r = PassManager(env().registry(), graph_api()).run(g, &view, {PassSpec{name, std::move(opts)}}, "cpu");
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(g.validate().is_ok());
  return r.is_ok() ? std::move(r).value() : std::vector<PassReport>{};
}

size_t count_op(const Graph& g, const std::string& op) {
  size_t n = 0;
  for (NodeId id : g.node_ids()) n += g.node(id)->op_type == op;
  return n;
}

// x[1,3,8,8] -> Conv(c1 channels, 3x3, pad 1) -> Relu -> Conv(4, 3x3, pad 1) -> y. Channels listed in `zero` of the
// first Conv have all-zero weights and bias.
Graph conv_relu_conv(int64_t c1, const std::vector<int64_t>& zero = {}) {
  GraphBuilder b("crc", 13);
  auto x = b.input("x", DType::kF32, {1, 3, 8, 8});
  auto w1 = randv(static_cast<size_t>(c1 * 27), 1, 0.3f);
  auto b1 = randv(static_cast<size_t>(c1), 2, 0.1f);
  for (int64_t c : zero) {
    for (int64_t i = 0; i < 27; ++i) w1[static_cast<size_t>(c * 27 + i)] = 0.f;
    b1[static_cast<size_t>(c)] = 0.f;
  }
  std::map<std::string, Attribute> pads = {{"pads", Attribute::of_ints({1, 1, 1, 1})}};
  auto h = b.op1("Conv", {x, b.constant("w1", Tensor::f32({c1, 3, 3, 3}, w1)), b.constant("b1", Tensor::f32({c1}, b1))},
                 pads);
  h = b.op1("Relu", {h});
  auto y = b.op1("Conv",
                 {h, b.constant("w2", Tensor::f32({4, c1, 3, 3}, randv(static_cast<size_t>(4 * c1 * 9), 3, 0.3f))),
                  b.constant("b2", Tensor::f32({4}, randv(4, 4, 0.1f)))},
                 pads);
  b.output(y);
  return b.take();
}

int64_t param_count(const Graph& g) {
  int64_t n = 0;
  for (const auto& [k, t] : g.initializers) n += t.numel();
  return n;
}

double cosine(const Tensor& a, const Tensor& b) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.data<float>()[i], y = b.data<float>()[i];
    ab += x * y, aa += x * x, bb += y * y;
  }
  return ab / std::sqrt(aa * bb + 1e-30);
}

TEST(Prune, MagnitudeHitsTheRatio) {
  Graph g = conv_relu_conv(8);
  Options o;
  o.values["ratio"] = 0.5;
  o.values["mode"] = std::string("magnitude");
  auto r = run_pass(g, "prune", o);
  for (const char* w : {"w1", "w2"}) {
    const Tensor& t = g.initializers.at(w);
    int64_t zeros = 0;
    for (int64_t i = 0; i < t.numel(); ++i) zeros += t.data<float>()[i] == 0.f;
    EXPECT_EQ(zeros, t.numel() / 2) << w;
  }
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["weights_zeroed"], (8 * 27 + 4 * 8 * 9) / 2);
}

TEST(Prune, ChannelPruningShrinksWeightsAndKeepsOutputsWhenPrunedChannelsWereZero) {
  Graph g = conv_relu_conv(8, {1, 4, 6, 7});
  Feeds feeds = {{"x", Tensor::f32({1, 3, 8, 8}, randv(192, 9))}};
  auto before = run(g, feeds);
  const int64_t p0 = param_count(g);
  Options o;
  o.values["ratio"] = 0.5;
  o.values["mode"] = std::string("channel");
  auto r = run_pass(g, "prune", o);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["channels_removed"], 4);
  EXPECT_LT(param_count(g), p0);
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    if (n->op_type != "Conv") continue;
    const Tensor& w = g.initializers.at(n->inputs[1]);
    if (w.shape()[1] == 3) EXPECT_EQ(w.shape()[0], 4);  // first Conv: 4 output channels left
    else EXPECT_EQ(w.shape()[1], 4);                    // second Conv: 4 input channels left
  }
  auto after = run(g, feeds);
  ASSERT_EQ(after.size(), 1u);
  ASSERT_EQ(after[0].shape(), before[0].shape());
  for (int64_t i = 0; i < after[0].numel(); ++i)
    EXPECT_NEAR(after[0].data<float>()[i], before[0].data<float>()[i], 1e-4f);
}

TEST(Prune, ResidualCoupledChannelsAreSkipped) {
  GraphBuilder b("res", 13);
  auto x = b.input("x", DType::kF32, {1, 4, 8, 8});
  std::map<std::string, Attribute> pads = {{"pads", Attribute::of_ints({1, 1, 1, 1})}};
  auto h = b.op1("Conv", {x, b.constant("w1", Tensor::f32({4, 4, 3, 3}, randv(144, 1)))}, pads);
  auto s = b.op1("Add", {h, x});
  b.output(b.op1("Conv", {s, b.constant("w2", Tensor::f32({4, 4, 3, 3}, randv(144, 2)))}, pads));
  Graph g = b.take();
  for (bool coupled : {false, true}) {
    Graph gc = g;
    Options o;
    o.values["ratio"] = 0.5;
    o.values["mode"] = std::string("channel");
    o.values["coupled"] = coupled;
    auto r = run_pass(gc, "prune", o);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].counters["channels_removed"], 0);
    // The per-chain mode leaves coupled channels alone; the group mode cannot prune a group that reaches a graph
    // input (the Add reads x itself).
    const std::string want = coupled ? "skipped: reaches graph input x" : "skipped: residual-coupled";
    bool noted = false;
    for (const auto& n : r[0].notes) noted = noted || n.find(want) != std::string::npos;
    EXPECT_TRUE(noted) << want;
  }
}

// x[1,3,8,8] -> ConvA(8) -> BN -> Relu = r0 -> ConvB1(6) -> Relu -> ConvB2(8) -> Add(., r0) -> Relu ->
// GlobalAveragePool
// -> Flatten -> Gemm(5, transB) -> y. {ConvA, ConvB2} (with the BN, the Add and the Gemm's input features) is one
// residual-coupled group of 8 channels; {ConvB1} a plain group of 6. Channels in `zero_a` are zero in both ConvA and
// ConvB2 (weights, bias, and BN beta/mean), channels in `zero_b` are zero in ConvB1.
Graph residual_block(const std::vector<int64_t>& zero_a = {}, const std::vector<int64_t>& zero_b = {}) {
  GraphBuilder b("resblock", 13);
  auto x = b.input("x", DType::kF32, {1, 3, 8, 8});
  std::map<std::string, Attribute> pads = {{"pads", Attribute::of_ints({1, 1, 1, 1})}};
  auto wa = randv(8 * 27, 11, 0.3f), ba = randv(8, 12, 0.1f);
  auto wb1 = randv(6 * 8 * 9, 13, 0.3f), bb1 = randv(6, 14, 0.1f);
  auto wb2 = randv(8 * 6 * 9, 15, 0.3f), bb2 = randv(8, 16, 0.1f);
  auto scale = randv(8, 17, 0.2f), beta = randv(8, 18, 0.1f), mean = randv(8, 19, 0.1f), var = randv(8, 20, 0.2f);
  for (auto& v : scale) v += 1.f;
  for (auto& v : var) v = 1.f + std::fabs(v);
  for (int64_t c : zero_a) {
    for (int64_t i = 0; i < 27; ++i) wa[static_cast<size_t>(c * 27 + i)] = 0.f;
    for (int64_t i = 0; i < 54; ++i) wb2[static_cast<size_t>(c * 54 + i)] = 0.f;
    ba[static_cast<size_t>(c)] = bb2[static_cast<size_t>(c)] = 0.f;
    beta[static_cast<size_t>(c)] = mean[static_cast<size_t>(c)] = 0.f;
  }
  for (int64_t c : zero_b) {
    for (int64_t i = 0; i < 72; ++i) wb1[static_cast<size_t>(c * 72 + i)] = 0.f;
    bb1[static_cast<size_t>(c)] = 0.f;
  }
  auto h =
      b.op1("Conv", {x, b.constant("wa", Tensor::f32({8, 3, 3, 3}, wa)), b.constant("ba", Tensor::f32({8}, ba))}, pads);
  h = b.op1("BatchNormalization",
            {h, b.constant("bn_scale", Tensor::f32({8}, scale)), b.constant("bn_beta", Tensor::f32({8}, beta)),
             b.constant("bn_mean", Tensor::f32({8}, mean)), b.constant("bn_var", Tensor::f32({8}, var))});
  auto r0 = b.op1("Relu", {h});
  h = b.op1("Conv", {r0, b.constant("wb1", Tensor::f32({6, 8, 3, 3}, wb1)), b.constant("bb1", Tensor::f32({6}, bb1))},
            pads);
  h = b.op1("Relu", {h});
  h = b.op1("Conv", {h, b.constant("wb2", Tensor::f32({8, 6, 3, 3}, wb2)), b.constant("bb2", Tensor::f32({8}, bb2))},
            pads);
  h = b.op1("Relu", {b.op1("Add", {h, r0})});
  h = b.op1("Flatten", {b.op1("GlobalAveragePool", {h})});
  auto y = b.op1("Gemm",
                 {h, b.constant("wfc", Tensor::f32({5, 8}, randv(40, 21, 0.3f))),
                  b.constant("bfc", Tensor::f32({5}, randv(5, 22, 0.1f)))},
                 {{"transB", Attribute::of_int(1)}});
  b.output(y);
  return b.take();
}

const Tensor& weight_of(const Graph& g, const std::string& op, size_t input, int nth = 0) {
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    if (n->op_type == op && nth-- == 0) return g.initializers.at(n->inputs[input]);
  }
  static const Tensor none;
  ADD_FAILURE() << "no " << op;
  return none;
}

TEST(Prune, ResidualCoupledGroupIsPrunedConsistently) {
  Graph g = residual_block({1, 4, 6, 7}, {0, 2, 5});
  Feeds feeds = {{"x", Tensor::f32({1, 3, 8, 8}, randv(192, 23))}};
  auto before = run(g, feeds);
  const int64_t p0 = param_count(g);
  Options o;
  o.values["ratio"] = 0.5;
  o.values["mode"] = std::string("channel");
  auto r = run_pass(g, "prune", o);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["channels_removed"], 4 + 3);
  EXPECT_EQ(r[0].counters["groups_pruned"], 2);
  EXPECT_EQ(r[0].counters["residual_groups_pruned"], 1);
  EXPECT_EQ(r[0].counters["convs_pruned"], 3);
  EXPECT_EQ(r[0].counters["params_removed"], p0 - param_count(g));
  // The coupled group: ConvA and ConvB2 outputs, the BN, ConvB1's input channels and the Gemm's features.
  EXPECT_EQ(weight_of(g, "Conv", 1, 0).shape(), (Shape{4, 3, 3, 3}));
  EXPECT_EQ(weight_of(g, "Conv", 2, 0).shape(), (Shape{4}));
  for (size_t i = 1; i < 5; ++i) EXPECT_EQ(weight_of(g, "BatchNormalization", i).shape(), (Shape{4})) << i;
  EXPECT_EQ(weight_of(g, "Conv", 1, 1).shape(), (Shape{3, 4, 3, 3}));
  EXPECT_EQ(weight_of(g, "Conv", 1, 2).shape(), (Shape{4, 3, 3, 3}));
  EXPECT_EQ(weight_of(g, "Conv", 2, 2).shape(), (Shape{4}));
  EXPECT_EQ(weight_of(g, "Gemm", 1).shape(), (Shape{5, 4}));
  // The kept channels are the non-zero ones (0, 2, 3, 5 of ConvA): ConvA's first kept row is its old row 0.
  Graph ref = residual_block({1, 4, 6, 7}, {0, 2, 5});
  EXPECT_EQ(weight_of(g, "Conv", 1, 0).data<float>()[27], weight_of(ref, "Conv", 1, 0).data<float>()[2 * 27]);
  EXPECT_EQ(weight_of(g, "Gemm", 1).data<float>()[1], weight_of(ref, "Gemm", 1).data<float>()[2]);
  auto after = run(g, feeds);
  ASSERT_EQ(after.size(), 1u);
  ASSERT_EQ(after[0].shape(), before[0].shape());
  for (int64_t i = 0; i < after[0].numel(); ++i)
    EXPECT_NEAR(after[0].data<float>()[i], before[0].data<float>()[i], 1e-4f) << i;
}

TEST(Prune, CoupledFalseKeepsThePerChainBehaviour) {
  Graph g = residual_block();
  Options o;
  o.values["ratio"] = 0.5;
  o.values["mode"] = std::string("channel");
  o.values["coupled"] = false;
  auto r = run_pass(g, "prune", o);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["channels_removed"], 3);  // only ConvB1
  EXPECT_EQ(weight_of(g, "Conv", 1, 0).shape(), (Shape{8, 3, 3, 3}));
  EXPECT_EQ(weight_of(g, "Gemm", 1).shape(), (Shape{5, 8}));
  EXPECT_EQ(weight_of(g, "Conv", 1, 1).shape(), (Shape{3, 8, 3, 3}));
  Feeds feeds = {{"x", Tensor::f32({1, 3, 8, 8}, randv(192, 23))}};
  EXPECT_EQ(run(g, feeds).size(), 1u);
}

TEST(Prune, CoupledGroupReachingAGraphOutputIsSkipped) {
  // The residual sum is also a graph output: its channels cannot change, so the coupled group stays whole.
  Graph g = residual_block();
  for (NodeId id : g.node_ids())
    if (g.node(id)->op_type == "Add") g.outputs.push_back(g.node(id)->outputs[0]);
  Options o;
  o.values["ratio"] = 0.5;
  o.values["mode"] = std::string("channel");
  auto r = run_pass(g, "prune", o);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["channels_removed"], 3);
  EXPECT_EQ(weight_of(g, "Conv", 1, 0).shape(), (Shape{8, 3, 3, 3}));
  bool noted = false;
  for (const auto& n : r[0].notes) noted = noted || n.find("is a graph output") != std::string::npos;
  EXPECT_TRUE(noted);
}

// LeNet's tail: x[2,1,8,8] -> Conv(6, 3x3) -> Relu -> MaxPool(2) -> Flatten (6 channels x 3x3 positions) -> Identity
// -> Gemm(5) -> y, the Gemm's weight [5, 54] (transB) or [54, 5]. Channels 1, 3, 4 are zero in the Conv: removing
// them takes their 9 features each out of the Gemm, and the output does not change.
Graph conv_flatten_gemm(bool trans_b) {
  GraphBuilder b("lenet_tail", 13);
  auto x = b.input("x", DType::kF32, {2, 1, 8, 8});
  auto w = randv(6 * 9, 41, 0.3f), bias = randv(6, 42, 0.1f);
  for (int64_t c : {1, 3, 4}) {
    for (int64_t i = 0; i < 9; ++i) w[static_cast<size_t>(c * 9 + i)] = 0.f;
    bias[static_cast<size_t>(c)] = 0.f;
  }
  auto h = b.op1("Conv", {x, b.constant("w", Tensor::f32({6, 1, 3, 3}, w)), b.constant("b", Tensor::f32({6}, bias))});
  h = b.op1("MaxPool", {b.op1("Relu", {h})},
            {{"kernel_shape", Attribute::of_ints({2, 2})}, {"strides", Attribute::of_ints({2, 2})}});
  h = b.op1("Identity", {b.op1("Flatten", {h})});
  auto wfc = randv(5 * 54, 43, 0.3f);
  auto y = b.op1("Gemm",
                 {h, b.constant("wfc", Tensor::f32(trans_b ? Shape{5, 54} : Shape{54, 5}, wfc)),
                  b.constant("bfc", Tensor::f32({5}, randv(5, 44, 0.1f)))},
                 {{"transB", Attribute::of_int(trans_b ? 1 : 0)}});
  b.output(y);
  return b.take();
}

TEST(Prune, FlattenOfASpatialMapTakesEachChannelsFeaturesOutOfTheGemm) {
  for (bool trans_b : {true, false}) {
    Graph g = conv_flatten_gemm(trans_b);
    Feeds feeds = {{"x", Tensor::f32({2, 1, 8, 8}, randv(128, 45))}};
    auto before = run(g, feeds);
    const int64_t p0 = param_count(g);
    Options o;
    o.values["ratio"] = 0.5;
    o.values["mode"] = std::string("channel");
    auto r = run_pass(g, "prune", o);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].counters["channels_removed"], 3) << trans_b;
    EXPECT_EQ(r[0].counters["params_removed"], 3 * 9 + 3 + 3 * 9 * 5) << trans_b;
    EXPECT_EQ(p0 - param_count(g), 3 * 9 + 3 + 3 * 9 * 5) << trans_b;
    EXPECT_EQ(weight_of(g, "Conv", 1).shape(), (Shape{3, 1, 3, 3}));
    EXPECT_EQ(weight_of(g, "Gemm", 1).shape(), trans_b ? (Shape{5, 27}) : (Shape{27, 5}));
    auto after = run(g, feeds);
    ASSERT_EQ(after.size(), 1u);
    ASSERT_EQ(after[0].shape(), before[0].shape());
    for (int64_t i = 0; i < after[0].numel(); ++i)
      EXPECT_NEAR(after[0].data<float>()[i], before[0].data<float>()[i], 1e-4f) << trans_b << " " << i;
  }
}

TEST(Prune, FlattenOfASpatialMapIntoSomethingElseIsSkippedWithAReason) {
  // The flattened features reach a Softmax (not a Gemm/MatMul reader): the Conv's channels stay.
  GraphBuilder b("flatten_softmax", 13);
  auto x = b.input("x", DType::kF32, {1, 1, 6, 6});
  auto h = b.op1("Conv", {x, b.constant("w", Tensor::f32({4, 1, 3, 3}, randv(36, 46, 0.3f)))});
  h = b.op1("Flatten", {b.op1("Relu", {h})});
  h = b.op1("Gemm", {b.op1("Softmax", {h}), b.constant("wfc", Tensor::f32({64, 3}, randv(192, 47, 0.3f)))});
  b.output(h);
  Graph g = b.take();
  Options o;
  o.values["ratio"] = 0.5;
  o.values["mode"] = std::string("channel");
  auto r = run_pass(g, "prune", o);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["channels_removed"], 0);
  bool noted = false;
  for (const auto& n : r[0].notes) noted = noted || n.find("output reaches Softmax") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(Prune, DepthwiseConvPassesTheGroupThrough) {
  // x -> Conv(8, 1x1) -> Relu -> depthwise Conv(8, group 8, 3x3) -> Relu -> Conv(4, 1x1) -> y: one group of 8
  // channels; the depthwise Conv keeps its kept channels' filters and its `group` follows. Channels 0, 3, 5, 6 are
  // zero in the first Conv (and the depthwise bias), so the output does not change.
  GraphBuilder b("dw", 13);
  auto x = b.input("x", DType::kF32, {1, 3, 8, 8});
  auto w1 = randv(8 * 3, 31, 0.3f), b1 = randv(8, 32, 0.1f), bd = randv(8, 34, 0.1f);
  for (int64_t c : {0, 3, 5, 6}) {
    for (int64_t i = 0; i < 3; ++i) w1[static_cast<size_t>(c * 3 + i)] = 0.f;
    b1[static_cast<size_t>(c)] = bd[static_cast<size_t>(c)] = 0.f;
  }
  auto h = b.op1(
      "Relu",
      {b.op1("Conv", {x, b.constant("w1", Tensor::f32({8, 3, 1, 1}, w1)), b.constant("b1", Tensor::f32({8}, b1))})});
  h = b.op1("Relu", {b.op1("Conv",
                           {h, b.constant("wd", Tensor::f32({8, 1, 3, 3}, randv(72, 33, 0.3f))),
                            b.constant("bd", Tensor::f32({8}, bd))},
                           {{"group", Attribute::of_int(8)}, {"pads", Attribute::of_ints({1, 1, 1, 1})}})});
  b.output(b.op1("Conv", {h, b.constant("w2", Tensor::f32({4, 8, 1, 1}, randv(32, 35, 0.3f)))}));
  Graph g = b.take();
  Feeds feeds = {{"x", Tensor::f32({1, 3, 8, 8}, randv(192, 36))}};
  auto before = run(g, feeds);
  Options o;
  o.values["ratio"] = 0.5;
  o.values["mode"] = std::string("channel");
  auto r = run_pass(g, "prune", o);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["channels_removed"], 4);
  EXPECT_EQ(weight_of(g, "Conv", 1, 0).shape(), (Shape{4, 3, 1, 1}));
  EXPECT_EQ(weight_of(g, "Conv", 1, 1).shape(), (Shape{4, 1, 3, 3}));
  EXPECT_EQ(weight_of(g, "Conv", 2, 1).shape(), (Shape{4}));
  EXPECT_EQ(weight_of(g, "Conv", 1, 2).shape(), (Shape{4, 4, 1, 1}));
  for (NodeId id : g.node_ids()) {
    if (g.node(id)->inputs.size() > 1 && g.node(id)->inputs[1].rfind("wd", 0) == 0) {
      EXPECT_EQ(g.node(id)->attr_int("group", 0), 4);
    }
  }
  auto after = run(g, feeds);
  ASSERT_EQ(after.size(), 1u);
  ASSERT_EQ(after[0].shape(), before[0].shape());
  for (int64_t i = 0; i < after[0].numel(); ++i)
    EXPECT_NEAR(after[0].data<float>()[i], before[0].data<float>()[i], 1e-4f) << i;
}

TEST(Prune, ConcatReadersLoseTheGroupsChannelsAtTheirOffset) {
  // A SqueezeNet fire module: x -> Conv s(6, 1x1) -> Relu -> {Conv e1(4, 1x1), Conv e3(6, 3x3)} -> Relu each ->
  // Concat(axis 1, 10 channels) -> MaxPool -> Conv y(3, 1x1). Three groups: s (read by e1 and e3), e1 and e3 (each
  // read by y at its offset in the Concat: 0 and 4). Zero channels everywhere pruning removes: the output stays.
  GraphBuilder b("fire", 13);
  auto x = b.input("x", DType::kF32, {1, 3, 8, 8});
  auto zero_rows = [](std::vector<float> w, std::vector<float>& bias, int64_t per, std::vector<int64_t> rows) {
    for (int64_t c : rows) {
      for (int64_t i = 0; i < per; ++i) w[static_cast<size_t>(c * per + i)] = 0.f;
      bias[static_cast<size_t>(c)] = 0.f;
    }
    return w;
  };
  auto bs = randv(6, 41, 0.1f), b1 = randv(4, 42, 0.1f), b3 = randv(6, 43, 0.1f);
  auto ws = zero_rows(randv(18, 44, 0.3f), bs, 3, {1, 2, 4});
  auto w1 = zero_rows(randv(24, 45, 0.3f), b1, 6, {0, 3});
  auto w3 = zero_rows(randv(6 * 6 * 9, 46, 0.3f), b3, 54, {1, 2, 5});
  auto s = b.op1(
      "Relu",
      {b.op1("Conv", {x, b.constant("ws", Tensor::f32({6, 3, 1, 1}, ws)), b.constant("bs", Tensor::f32({6}, bs))})});
  auto e1 = b.op1(
      "Relu",
      {b.op1("Conv", {s, b.constant("w1", Tensor::f32({4, 6, 1, 1}, w1)), b.constant("b1", Tensor::f32({4}, b1))})});
  auto e3 =
      b.op1("Relu",
            {b.op1("Conv", {s, b.constant("w3", Tensor::f32({6, 6, 3, 3}, w3)), b.constant("b3", Tensor::f32({6}, b3))},
                   {{"pads", Attribute::of_ints({1, 1, 1, 1})}})});
  auto cat = b.op1("Concat", {e1, e3}, {{"axis", Attribute::of_int(1)}});
  auto p =
      b.op1("MaxPool", {cat}, {{"kernel_shape", Attribute::of_ints({2, 2})}, {"strides", Attribute::of_ints({2, 2})}});
  auto wy = randv(30, 47, 0.3f);
  b.output(b.op1("Conv", {p, b.constant("wy", Tensor::f32({3, 10, 1, 1}, wy))}));
  Graph g = b.take();
  Feeds feeds = {{"x", Tensor::f32({1, 3, 8, 8}, randv(192, 48))}};
  auto before = run(g, feeds);
  const int64_t p0 = param_count(g);
  Options o;
  o.values["ratio"] = 0.5;
  o.values["mode"] = std::string("channel");
  auto r = run_pass(g, "prune", o);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["groups_pruned"], 3);
  EXPECT_EQ(r[0].counters["channels_removed"], 3 + 2 + 3);
  EXPECT_EQ(r[0].counters["params_removed"], p0 - param_count(g));
  EXPECT_EQ(weight_of(g, "Conv", 1, 0).shape(), (Shape{3, 3, 1, 1}));
  EXPECT_EQ(weight_of(g, "Conv", 1, 1).shape(), (Shape{2, 3, 1, 1}));
  EXPECT_EQ(weight_of(g, "Conv", 1, 2).shape(), (Shape{3, 3, 3, 3}));
  EXPECT_EQ(weight_of(g, "Conv", 1, 3).shape(), (Shape{3, 5, 1, 1}));
  // y's kept input channels: e1's 1, 2 (offset 0) and e3's 0, 3, 4 (offset 4): old columns 1, 2, 4, 7, 8.
  const float* ny = weight_of(g, "Conv", 1, 3).data<float>();
  const int64_t cols[] = {1, 2, 4, 7, 8};
  for (int64_t o2 = 0; o2 < 3; ++o2)
    for (int64_t i = 0; i < 5; ++i)
      EXPECT_EQ(ny[o2 * 5 + i], wy[static_cast<size_t>(o2 * 10 + cols[i])]) << o2 << "," << i;
  auto after = run(g, feeds);
  ASSERT_EQ(after.size(), 1u);
  ASSERT_EQ(after[0].shape(), before[0].shape());
  for (int64_t i = 0; i < after[0].numel(); ++i)
    EXPECT_NEAR(after[0].data<float>()[i], before[0].data<float>()[i], 1e-4f) << i;
}

TEST(Prune, PerChannelConstantsShrinkWithTheGroup) {
  // x -> Conv(8) -> Mul(k [8,1,1]) -> Sub(m [1,8,1,1]) -> Add(scalar) -> Relu -> Conv(4) -> y: the constants pass the
  // group through and lose the pruned channels. A Mul of two computed values stops a group (the second Conv's).
  GraphBuilder b("affine", 13);
  auto x = b.input("x", DType::kF32, {1, 3, 8, 8});
  auto w1 = randv(24, 51, 0.3f), b1 = randv(8, 52, 0.1f), k = randv(8, 53, 1.f), m = randv(8, 54, 0.1f);
  for (int64_t c : {1, 2, 6, 7}) {
    for (int64_t i = 0; i < 3; ++i) w1[static_cast<size_t>(c * 3 + i)] = 0.f;
    b1[static_cast<size_t>(c)] = m[static_cast<size_t>(c)] = 0.f;
  }
  auto h = b.op1("Conv", {x, b.constant("w1", Tensor::f32({8, 3, 1, 1}, w1)), b.constant("b1", Tensor::f32({8}, b1))});
  h = b.op1("Mul", {h, b.constant("k", Tensor::f32({8, 1, 1}, k))});
  h = b.op1("Sub", {h, b.constant("m", Tensor::f32({1, 8, 1, 1}, m))});
  h = b.op1("Relu", {b.op1("Add", {b.constant("c", Tensor::f32({}, {0.f})), h})});
  auto y = b.op1("Conv", {h, b.constant("w2", Tensor::f32({4, 8, 1, 1}, randv(32, 55, 0.3f)))});
  b.output(b.op1("Mul", {y, y}));
  Graph g = b.take();
  Feeds feeds = {{"x", Tensor::f32({1, 3, 8, 8}, randv(192, 56))}};
  auto before = run(g, feeds);
  Options o;
  o.values["ratio"] = 0.5;
  o.values["mode"] = std::string("channel");
  auto r = run_pass(g, "prune", o);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["groups_pruned"], 1);
  EXPECT_EQ(r[0].counters["channels_removed"], 4);
  EXPECT_EQ(weight_of(g, "Mul", 1).shape(), (Shape{4, 1, 1}));
  EXPECT_EQ(weight_of(g, "Sub", 1).shape(), (Shape{1, 4, 1, 1}));
  EXPECT_EQ(weight_of(g, "Conv", 1, 1).shape(), (Shape{4, 4, 1, 1}));
  EXPECT_EQ(weight_of(g, "Mul", 1).data<float>()[1], k[3]);  // kept channels 0, 3, 4, 5
  auto after = run(g, feeds);
  ASSERT_EQ(after.size(), 1u);
  for (int64_t i = 0; i < after[0].numel(); ++i)
    EXPECT_NEAR(after[0].data<float>()[i], before[0].data<float>()[i], 1e-4f) << i;
}

Options channel_options(double ratio) {
  Options o;
  o.values["ratio"] = ratio;
  o.values["mode"] = std::string("channel");
  return o;
}

bool has_note(const PassReport& r, const std::string& text) {
  for (const auto& n : r.notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

std::string notes_of(const PassReport& r) {
  std::string s;
  for (const auto& n : r.notes) s += n + "\n";
  return s;
}

void expect_same_outputs(const std::vector<Tensor>& before, const std::vector<Tensor>& after, float tol = 1e-4f) {
  ASSERT_EQ(after.size(), before.size());
  for (size_t k = 0; k < before.size(); ++k) {
    ASSERT_EQ(after[k].shape(), before[k].shape()) << k;
    for (int64_t i = 0; i < after[k].numel(); ++i)
      ASSERT_NEAR(after[k].data<float>()[i], before[k].data<float>()[i], tol) << "output " << k << " at " << i;
  }
}

// Runs g on a random input x of `shape`, then prunes it (channel mode at `ratio`): the report, the outputs and the
// parameter count before pruning, and the feeds to run the pruned graph on.
struct Pruned {
  PassReport report;
  Feeds feeds;
  std::vector<Tensor> before;
  int64_t params_before = 0;
};
Pruned prune_channels(Graph& g, const Shape& shape, uint32_t seed, double ratio = 0.5) {
  Pruned p;
  p.feeds = {{"x", Tensor::f32(shape, randv(static_cast<size_t>(shape_numel(shape)), seed))}};
  p.before = run(g, p.feeds);
  p.params_before = param_count(g);
  auto r = run_pass(g, "prune", channel_options(ratio));
  EXPECT_EQ(r.size(), 1u);
  if (!r.empty()) p.report = std::move(r[0]);
  return p;
}

// Zeroes rows `rows` (of `per` elements each) of w and the same entries of bias.
std::vector<float> zero_rows(std::vector<float> w, std::vector<float>* bias, int64_t per,
                             const std::vector<int64_t>& rows) {
  for (int64_t c : rows) {
    for (int64_t i = 0; i < per; ++i) w[static_cast<size_t>(c * per + i)] = 0.f;
    if (bias) (*bias)[static_cast<size_t>(c)] = 0.f;
  }
  return w;
}

// A ResNeXt-style bottleneck: x[1,4,8,8] -> Conv a(8, 1x1) -> Relu -> Conv g(8, 3x3, group 4: weight [8,2,3,3]) ->
// Relu -> Conv y(4, 1x1) -> y. Two groups: {a} read by the grouped g (4 blocks of 2 input channels) and {g} (4 blocks
// of 2 output rows) read by y. a's channels 1, 2, 5, 6 and g's rows 0, 3, 4, 7 are zero: one per block each.
Graph resnext_block() {
  GraphBuilder b("resnext", 13);
  auto x = b.input("x", DType::kF32, {1, 4, 8, 8});
  auto ba = randv(8, 61, 0.1f), bg = randv(8, 62, 0.1f);
  auto wa = zero_rows(randv(32, 63, 0.3f), &ba, 4, {1, 2, 5, 6});
  auto wg = zero_rows(randv(8 * 2 * 9, 64, 0.3f), &bg, 18, {0, 3, 4, 7});
  auto h = b.op1(
      "Relu",
      {b.op1("Conv", {x, b.constant("wa", Tensor::f32({8, 4, 1, 1}, wa)), b.constant("ba", Tensor::f32({8}, ba))})});
  h = b.op1("Relu",
            {b.op1("Conv", {h, b.constant("wg", Tensor::f32({8, 2, 3, 3}, wg)), b.constant("bg", Tensor::f32({8}, bg))},
                   {{"group", Attribute::of_int(4)}, {"pads", Attribute::of_ints({1, 1, 1, 1})}})});
  b.output(b.op1("Conv", {h, b.constant("wy", Tensor::f32({4, 8, 1, 1}, randv(32, 65, 0.3f)))}));
  return b.take();
}

TEST(Prune, GroupedConvsLoseTheSameCountInEachGroup) {
  Graph g = resnext_block();
  const Graph ref = resnext_block();
  Pruned p = prune_channels(g, Shape{1, 4, 8, 8}, 66);
  PassReport& r = p.report;
  EXPECT_EQ(r.counters["groups_pruned"], 2) << notes_of(r);
  EXPECT_EQ(r.counters["channels_removed"], 4 + 4);
  // a: 4 rows of 4 + 4 biases; g: [8,2,3,3] -> [4,1,3,3] + 4 biases; y: 4 of its 8 input columns.
  const int64_t expect_removed = (16 + 4) + (144 - 36 + 4) + 16;
  EXPECT_EQ(r.counters["params_removed"], expect_removed);
  EXPECT_EQ(p.params_before - param_count(g), expect_removed);
  EXPECT_EQ(weight_of(g, "Conv", 1, 0).shape(), (Shape{4, 4, 1, 1}));
  EXPECT_EQ(weight_of(g, "Conv", 1, 1).shape(), (Shape{4, 1, 3, 3}));
  EXPECT_EQ(weight_of(g, "Conv", 2, 1).shape(), (Shape{4}));
  EXPECT_EQ(weight_of(g, "Conv", 1, 2).shape(), (Shape{4, 4, 1, 1}));
  for (NodeId id : g.node_ids()) {
    if (g.node(id)->op_type == "Conv" && g.node(id)->inputs[1].rfind("wg", 0) == 0) {
      EXPECT_EQ(g.node(id)->attr_int("group", 0), 4);
    }
  }
  // g kept rows 1, 2, 5, 6 (one per block); its input blocks kept a's channels 0, 3, 4, 7, i.e. column 0 in blocks
  // 0 and 2, column 1 in blocks 1 and 3. New row 1 (old row 2, block 1) is old row 2's column 1.
  const float* ng = weight_of(g, "Conv", 1, 1).data<float>();
  const float* og = weight_of(ref, "Conv", 1, 1).data<float>();
  const int64_t rows[] = {1, 2, 5, 6}, cols[] = {0, 1, 0, 1};
  for (int64_t o = 0; o < 4; ++o)
    for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(ng[o * 9 + i], og[(rows[o] * 2 + cols[o]) * 9 + i]) << o << "," << i;
  expect_same_outputs(p.before, run(g, p.feeds));
}

TEST(Prune, RatioZeroChangesNothing) {
  const std::pair<Graph, Shape> cases[] = {{resnext_block(), Shape{1, 4, 8, 8}},
                                           {residual_block({1, 4}, {0}), Shape{1, 3, 8, 8}}};
  for (const auto& [model, shape] : cases) {
    Graph g = model;
    Pruned p = prune_channels(g, shape, 67, 0.0);
    EXPECT_EQ(p.report.counters["channels_removed"], 0);
    EXPECT_EQ(p.report.counters["params_removed"], 0);
    EXPECT_EQ(param_count(g), p.params_before);
    expect_same_outputs(p.before, run(g, p.feeds), 0.f);
  }
}

TEST(Prune, DepthwiseMultiplierConvPrunesItsRowsPerGroupAndReportsItsInput) {
  // x -> Conv a(4, 1x1) -> Relu -> Conv m(8, 3x3, group 4: two outputs per input channel) -> Relu -> Conv y(2, 1x1).
  // a's group: m reads one channel per group, so no channel can go (a note says why); m's group: 4 blocks of 2 rows,
  // one row each removed (rows 1, 2, 4, 7 are zero).
  GraphBuilder b("dwmul", 13);
  auto x = b.input("x", DType::kF32, {1, 3, 8, 8});
  auto bm = randv(8, 71, 0.1f);
  auto wm = zero_rows(randv(72, 72, 0.3f), &bm, 9, {1, 2, 4, 7});
  auto h = b.op1("Relu", {b.op1("Conv", {x, b.constant("wa", Tensor::f32({4, 3, 1, 1}, randv(12, 73, 0.3f)))})});
  h = b.op1("Relu",
            {b.op1("Conv", {h, b.constant("wm", Tensor::f32({8, 1, 3, 3}, wm)), b.constant("bm", Tensor::f32({8}, bm))},
                   {{"group", Attribute::of_int(4)}, {"pads", Attribute::of_ints({1, 1, 1, 1})}})});
  b.output(b.op1("Conv", {h, b.constant("wy", Tensor::f32({2, 8, 1, 1}, randv(16, 74, 0.3f)))}));
  Graph g = b.take();
  Pruned p = prune_channels(g, Shape{1, 3, 8, 8}, 75);
  PassReport& r = p.report;
  EXPECT_EQ(r.counters["groups_pruned"], 1) << notes_of(r);
  EXPECT_TRUE(has_note(r, "removes no channel of 4 blocks of 1")) << notes_of(r);
  EXPECT_EQ(weight_of(g, "Conv", 1, 0).shape(), (Shape{4, 3, 1, 1}));
  EXPECT_EQ(weight_of(g, "Conv", 1, 1).shape(), (Shape{4, 1, 3, 3}));
  EXPECT_EQ(weight_of(g, "Conv", 1, 2).shape(), (Shape{2, 4, 1, 1}));
  EXPECT_EQ(p.params_before - param_count(g), 36 + 4 + 8);
  expect_same_outputs(p.before, run(g, p.feeds));
}

TEST(Prune, NestedConcatReadersGetTheSummedOffset) {
  // Convs a(4), b(4), c(6) on x, each -> Relu; cat1 = Concat(a, b) -> Conv z(2) -> z; cat2 = Concat(c, cat1) -> Relu
  // -> Conv y(3) -> y. a's channels sit at 0 in cat1 and at 6 in cat2, b's at 4 and 10, c's at 0 in cat2.
  GraphBuilder b("nested", 13);
  auto x = b.input("x", DType::kF32, {1, 3, 8, 8});
  auto ba = randv(4, 81, 0.1f), bb = randv(4, 82, 0.1f), bc = randv(6, 83, 0.1f);
  auto wa = zero_rows(randv(12, 84, 0.3f), &ba, 3, {0, 3});
  auto wb = zero_rows(randv(12, 85, 0.3f), &bb, 3, {1, 2});
  auto wc = zero_rows(randv(18, 86, 0.3f), &bc, 3, {0, 2, 4});
  auto conv = [&](const std::string& n, const std::vector<float>& w, const std::vector<float>& bias, int64_t o) {
    return b.op1("Relu", {b.op1("Conv", {x, b.constant("w" + n, Tensor::f32({o, 3, 1, 1}, w)),
                                         b.constant("b" + n, Tensor::f32({o}, bias))})});
  };
  auto a = conv("a", wa, ba, 4), bv = conv("b", wb, bb, 4), c = conv("c", wc, bc, 6);
  auto cat1 = b.op1("Concat", {a, bv}, {{"axis", Attribute::of_int(1)}});
  auto wz = randv(16, 87, 0.3f), wy = randv(42, 88, 0.3f);
  b.output(b.op1("Conv", {cat1, b.constant("wz", Tensor::f32({2, 8, 1, 1}, wz))}));
  auto cat2 = b.op1("Concat", {c, cat1}, {{"axis", Attribute::of_int(1)}});
  b.output(b.op1("Conv", {b.op1("Relu", {cat2}), b.constant("wy", Tensor::f32({3, 14, 1, 1}, wy))}));
  Graph g = b.take();
  Pruned p = prune_channels(g, Shape{1, 3, 8, 8}, 89);
  PassReport& r = p.report;
  EXPECT_EQ(r.counters["groups_pruned"], 3) << notes_of(r);
  EXPECT_EQ(r.counters["channels_removed"], 2 + 2 + 3);
  EXPECT_EQ(r.counters["params_removed"], p.params_before - param_count(g));
  EXPECT_EQ(p.params_before - param_count(g), 7 * 4 + 2 * 4 + 3 * 7);  // producer rows + biases, z's and y's columns
  const Tensor& nz = weight_of(g, "Conv", 1, 3);
  const Tensor& ny = weight_of(g, "Conv", 1, 4);
  ASSERT_EQ(nz.shape(), (Shape{2, 4, 1, 1}));
  ASSERT_EQ(ny.shape(), (Shape{3, 7, 1, 1}));
  const int64_t zcols[] = {1, 2, 4, 7}, ycols[] = {1, 3, 5, 7, 8, 10, 13};
  for (int64_t o = 0; o < 2; ++o)
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(nz.data<float>()[o * 4 + i], wz[static_cast<size_t>(o * 8 + zcols[i])]);
  for (int64_t o = 0; o < 3; ++o)
    for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(ny.data<float>()[o * 7 + i], wy[static_cast<size_t>(o * 14 + ycols[i])]);
  expect_same_outputs(p.before, run(g, p.feeds));
}

// x -> Conv s(5) -> Relu = h; Convs a(4), b(4) and r(8) read h; Add(Concat(a, b), r) -> Relu -> Conv y(3) -> y.
// a's channels are r's 0..3, b's are r's 4..7: the groups of a and b take r's rows at their offsets along. Zero:
// s's channels 0, 3; a's rows 1, 2 and r's rows 1, 2; b's rows 0, 3 and r's rows 4, 7. `extra` feeds r's output to
// a second reader too (an Add operand's other readers are readers of the space).
Graph concat_add(bool extra = false) {
  GraphBuilder b("catadd", 13);
  auto x = b.input("x", DType::kF32, {1, 3, 8, 8});
  auto bs = randv(5, 91, 0.1f);
  auto ws = zero_rows(randv(15, 92, 0.3f), &bs, 3, {0, 3});
  auto h = b.op1(
      "Relu",
      {b.op1("Conv", {x, b.constant("ws", Tensor::f32({5, 3, 1, 1}, ws)), b.constant("bs", Tensor::f32({5}, bs))})});
  auto conv = [&](const std::string& n, int64_t o, uint32_t seed, const std::vector<int64_t>& zero) {
    auto w = zero_rows(randv(static_cast<size_t>(o * 5), seed, 0.3f), nullptr, 5, zero);
    return b.op1("Conv", {h, b.constant("w" + n, Tensor::f32({o, 5, 1, 1}, w))});
  };
  auto cat = b.op1("Concat", {conv("a", 4, 93, {1, 2}), conv("b", 4, 94, {0, 3})}, {{"axis", Attribute::of_int(1)}});
  auto r = b.op1("Relu", {conv("r", 8, 95, {1, 2, 4, 7})});
  auto s = b.op1("Relu", {b.op1("Add", {cat, r})});
  b.output(b.op1("Conv", {s, b.constant("wy", Tensor::f32({3, 8, 1, 1}, randv(24, 96, 0.3f)))}));
  if (extra) b.output(b.op1("Conv", {r, b.constant("wz", Tensor::f32({2, 8, 1, 1}, randv(16, 98, 0.3f)))}));
  return b.take();
}

TEST(Prune, ConcatCoupledIntoAResidualLosesTheSameChannelsOnBothSides) {
  for (bool extra : {false, true}) {
    Graph g = concat_add(extra);
    Pruned p = prune_channels(g, Shape{1, 3, 8, 8}, 97);
    PassReport& r = p.report;
    EXPECT_EQ(r.counters["groups_pruned"], 3) << notes_of(r);
    EXPECT_EQ(r.counters["channels_removed"], 2 + 2 + 2);
    EXPECT_TRUE(has_note(r, "is the output of Concat")) << notes_of(r);  // r's own group: left to a's and b's
    EXPECT_TRUE(has_note(r, "with 1 Conv(s) adding to the Concat's channels")) << notes_of(r);
    // s: 2 rows + 2 biases; a, b: 2 columns and 2 rows each; r: 2 columns of 8 rows, then 4 rows of 3; y: 4 columns
    // of 3 rows; z (extra): 4 columns of 2 rows.
    const int64_t expect = (6 + 2) + 2 * (8 + 6) + (16 + 12) + 12 + (extra ? 8 : 0);
    EXPECT_EQ(p.params_before - param_count(g), expect);
    EXPECT_EQ(r.counters["params_removed"], expect);
    EXPECT_EQ(weight_of(g, "Conv", 1, 0).shape(), (Shape{3, 3, 1, 1}));
    EXPECT_EQ(weight_of(g, "Conv", 1, 1).shape(), (Shape{2, 3, 1, 1}));
    EXPECT_EQ(weight_of(g, "Conv", 1, 2).shape(), (Shape{2, 3, 1, 1}));
    EXPECT_EQ(weight_of(g, "Conv", 1, 3).shape(), (Shape{4, 3, 1, 1}));
    EXPECT_EQ(weight_of(g, "Conv", 1, 4).shape(), (Shape{3, 4, 1, 1}));
    if (extra) {
      EXPECT_EQ(weight_of(g, "Conv", 1, 5).shape(), (Shape{2, 4, 1, 1}));
    }
    expect_same_outputs(p.before, run(g, p.feeds));
  }
}

TEST(Prune, ConvsAddingToAConcatCountInTheGroupsScore) {
  // Add(Concat(a, b), r) -> Conv y, a, b, r reading x. a's rows 0 and 3 are small but r's rows 0 and 3 (the same
  // channels) are large: ranked jointly, a's group keeps channels 0 and 3 and drops 1 and 2 (by a alone it would be
  // the other way round).
  GraphBuilder b("catscore", 13);
  auto x = b.input("x", DType::kF32, {1, 3, 4, 4});
  auto wa = randv(12, 111, 0.3f), wr = randv(24, 112, 0.3f);
  for (int64_t c : {0, 3})
    for (int64_t i = 0; i < 3; ++i)
      wa[static_cast<size_t>(c * 3 + i)] *= 0.01f, wr[static_cast<size_t>(c * 3 + i)] *= 10.f;
  auto cat = b.op1("Concat",
                   {b.op1("Conv", {x, b.constant("wa", Tensor::f32({4, 3, 1, 1}, wa))}),
                    b.op1("Conv", {x, b.constant("wb", Tensor::f32({4, 3, 1, 1}, randv(12, 113, 0.3f)))})},
                   {{"axis", Attribute::of_int(1)}});
  auto s = b.op1("Add", {cat, b.op1("Conv", {x, b.constant("wr", Tensor::f32({8, 3, 1, 1}, wr))})});
  b.output(b.op1("Conv", {s, b.constant("wy", Tensor::f32({2, 8, 1, 1}, randv(16, 114, 0.3f)))}));
  Graph g = b.take();
  Pruned p = prune_channels(g, Shape{1, 3, 4, 4}, 115);
  EXPECT_EQ(p.report.counters["groups_pruned"], 2) << notes_of(p.report);
  const Tensor& na = weight_of(g, "Conv", 1, 0);
  ASSERT_EQ(na.shape(), (Shape{2, 3, 1, 1}));
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(na.data<float>()[i], wa[static_cast<size_t>(i)]);          // kept row 0
    EXPECT_EQ(na.data<float>()[3 + i], wa[static_cast<size_t>(9 + i)]);  // kept row 3
  }
  EXPECT_EQ(weight_of(g, "Conv", 1, 2).shape(), (Shape{4, 3, 1, 1}));
  EXPECT_EQ(run(g, p.feeds).size(), 1u);
}

TEST(Prune, ConcatIntoAnAddWithAGraphInputIsSkippedWithAReason) {
  // Add(Concat(a, b), x): the Concat's channels meet a graph input, so a's and b's groups stay whole.
  GraphBuilder b("catx", 13);
  auto x = b.input("x", DType::kF32, {1, 8, 4, 4});
  auto conv = [&](const std::string& n, uint32_t seed) {
    return b.op1("Conv", {x, b.constant("w" + n, Tensor::f32({4, 8, 1, 1}, randv(32, seed, 0.3f)))});
  };
  auto cat = b.op1("Concat", {conv("a", 101), conv("b", 102)}, {{"axis", Attribute::of_int(1)}});
  b.output(b.op1("Conv", {b.op1("Add", {cat, x}), b.constant("wy", Tensor::f32({3, 8, 1, 1}, randv(24, 103, 0.3f)))}));
  Graph g = b.take();
  Pruned p = prune_channels(g, Shape{1, 8, 4, 4}, 104);
  EXPECT_EQ(p.report.counters["groups_pruned"], 0) << notes_of(p.report);
  EXPECT_TRUE(has_note(p.report, "channels meet graph input x in an Add")) << notes_of(p.report);
  EXPECT_EQ(param_count(g), p.params_before);
  expect_same_outputs(p.before, run(g, p.feeds), 0.f);
}

TEST(QuantizeInt8, QdqModelIsCloseToFp32) {
  Graph g = conv_relu_conv(8);
  ASSERT_TRUE(infer_shapes(g).is_ok());
  // Calibration: the Conv inputs as extra graph outputs.
  std::vector<std::string> acts;
  for (NodeId id : g.node_ids())
    if (g.node(id)->op_type == "Conv") acts.push_back(g.node(id)->inputs[0]);
  Graph calib = g;
  for (const auto& a : acts)
    if (std::find(calib.outputs.begin(), calib.outputs.end(), a) == calib.outputs.end()) calib.outputs.push_back(a);
  Options o;
  std::vector<float> lo(acts.size(), 1e30f), hi(acts.size(), -1e30f);
  for (uint32_t k = 0; k < 8; ++k) {
    auto out = run(calib, {{"x", Tensor::f32({1, 3, 8, 8}, randv(192, 100 + k))}});
    ASSERT_EQ(out.size(), 1 + acts.size());
    for (size_t a = 0; a < acts.size(); ++a) {
      const Tensor& t = out[1 + a];
      for (int64_t i = 0; i < t.numel(); ++i)
        lo[a] = std::min(lo[a], t.data<float>()[i]), hi[a] = std::max(hi[a], t.data<float>()[i]);
    }
  }
  for (size_t a = 0; a < acts.size(); ++a)
    o.values["range." + acts[a]] = std::to_string(lo[a]) + "," + std::to_string(hi[a]);
  Graph q = g;
  auto r = run_pass(q, "quantize_int8", o);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["nodes_quantized"], 2);
  EXPECT_EQ(count_op(q, "QuantizeLinear"), 2u);
  EXPECT_EQ(count_op(q, "DequantizeLinear"), 4u);
  for (uint32_t k = 0; k < 4; ++k) {
    Feeds f = {{"x", Tensor::f32({1, 3, 8, 8}, randv(192, 500 + k))}};  // held out from calibration
    auto a = run(g, f), b = run(q, f);
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_GE(cosine(a[0], b[0]), 0.99);
  }
  // Excluding a node keeps it fp32.
  Graph q2 = g;
  o.values["exclude"] = std::vector<std::string>{g.node(g.node_ids().front())->name};
  auto r2 = run_pass(q2, "quantize_int8", o);
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_EQ(r2[0].counters["nodes_quantized"], 1);
  EXPECT_EQ(r2[0].counters["nodes_excluded"], 1);
}

// x -> Conv -> Relu -> Conv -> GlobalAveragePool -> Flatten -> Gemm(transB) -> y, quantized to QDQ with the given
// activation ranges (inputs of the three layers).
Graph qdq_net(Graph* fp32_out, bool first_fp32 = false) {
  GraphBuilder b("qnet", 13);
  auto x = b.input("x", DType::kF32, {2, 3, 8, 8});
  std::map<std::string, Attribute> pads = {{"pads", Attribute::of_ints({1, 1, 1, 1})}};
  auto h = b.op1("Conv",
                 {x, b.constant("w1", Tensor::f32({8, 3, 3, 3}, randv(216, 1, 0.3f))),
                  b.constant("b1", Tensor::f32({8}, randv(8, 2, 0.1f)))},
                 pads);
  auto h1 = b.op1("Relu", {h});
  h = b.op1("Conv", {h1, b.constant("w2", Tensor::f32({8, 8, 3, 3}, randv(576, 3, 0.2f)))}, pads);
  h = b.op1("GlobalAveragePool", {h});
  auto f = b.op1("Flatten", {h});
  b.output(b.op1("Gemm",
                 {f, b.constant("wf", Tensor::f32({5, 8}, randv(40, 5, 0.5f))),
                  b.constant("bf", Tensor::f32({5}, randv(5, 6, 0.1f)))},
                 {{"transB", Attribute::of_int(1)}}));
  Graph g = b.take();
  *fp32_out = g;
  Options o;
  o.values["range." + x] = std::string("-4,4");
  o.values["range." + h1] = std::string("0,3");
  o.values["range." + f] = std::string("-1,1");
  if (first_fp32) o.values["exclude"] = std::vector<std::string>{g.node(g.node_ids().front())->name};
  run_pass(g, "quantize_int8", o);
  return g;
}

TEST(FuseQdq, Int8OpsReplaceTheQdqPatternsAndMatchTheQdqGraph) {
  Graph fp32;
  Graph q = qdq_net(&fp32);
  Graph fused = q;
  auto r = run_pass(fused, "fuse_qdq", {});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["conv_fused"], 2);
  EXPECT_EQ(r[0].counters["gemm_fused"], 1);
  EXPECT_EQ(r[0].counters["activations_fused"], 1);    // the Relu after the first Conv
  EXPECT_EQ(r[0].counters["outputs_requantized"], 1);  // ... and the QuantizeLinear after it
  EXPECT_EQ(r[0].counters["channels_last_edges"], 1);  // the u8 value from the first QConv to the second
  EXPECT_EQ(count_op(fused, "QConv"), 2u);
  EXPECT_EQ(count_op(fused, "QGemm"), 1u);
  EXPECT_EQ(count_op(fused, "Conv") + count_op(fused, "Gemm") + count_op(fused, "Relu"), 0u);
  EXPECT_EQ(count_op(fused, "DequantizeLinear"), 0u);  // weights and activations are read as int8
  for (uint32_t k = 0; k < 3; ++k) {
    Feeds f = {{"x", Tensor::f32({2, 3, 8, 8}, randv(384, 700 + k))}};
    auto a = run(q, f), b = run(fused, f), c = run(fp32, f);
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_GE(cosine(a[0], b[0]), 0.999);  // the same arithmetic up to rounding
    EXPECT_GE(cosine(c[0], b[0]), 0.95);   // hand-picked ranges: near fp32, not calibrated
  }
}

// A model whose first layer stays fp32 (as `keel quantize --fallback prefix` leaves MobileNetV2's first ones) under
// `--precision bf16`: after fuse_qdq, convert_precision (what the CLI appends) runs that layer in bf16 and leaves the
// int8 ops as they are, and the outputs stay the fp32-prefix model's up to bf16's rounding. (tools/compare_int8.py
// --int8-precision bf16 measures it on MobileNetV2.)
TEST(FuseQdq, AMixedModelRunsItsFp32LayersInBf16) {
  Graph fp32;
  Graph mixed = qdq_net(&fp32, true);
  auto r = run_pass(mixed, "fuse_qdq", {});
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(count_op(mixed, "Conv"), 1u);
  ASSERT_EQ(count_op(mixed, "QConv"), 1u);
  ASSERT_EQ(count_op(mixed, "QGemm"), 1u);
  Graph bf16 = mixed;
  Options o;
  o.values["dtype"] = std::string("bf16");
  auto c = run_pass(bf16, "convert_precision", o);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_GT(c[0].counters["nodes_converted"], 0);
  ASSERT_TRUE(infer_shapes(bf16).is_ok());
  EXPECT_EQ(count_op(bf16, "QConv"), 1u);
  EXPECT_EQ(count_op(bf16, "QGemm"), 1u);
  for (NodeId id : bf16.node_ids()) {
    const Node* n = bf16.node(id);
    const ValueInfo* in = bf16.info(n->inputs[0]);
    ASSERT_TRUE(in) << n->name;
    if (n->op_type == "Conv") {
      EXPECT_EQ(in->dtype, DType::kBF16) << n->name;
    } else if (n->op_type == "QConv" || n->op_type == "QGemm") {
      EXPECT_NE(in->dtype, DType::kBF16) << n->name;
    }
  }
  for (uint32_t k = 0; k < 3; ++k) {
    Feeds f = {{"x", Tensor::f32({2, 3, 8, 8}, randv(384, 900 + k))}};
    auto a = run(mixed, f), b = run(bf16, f), ref = run(fp32, f);
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(b[0].dtype(), DType::kF32);
    EXPECT_GE(cosine(a[0], b[0]), 0.999);
    EXPECT_GE(cosine(ref[0], b[0]), 0.95);
  }
}

// A residual block in QDQ form: x -> Conv1 -> y1; y1 -> Conv2 -> y2; Add(y1, y2) -> s -> Conv3 -> GlobalAveragePool
// (with `second_reader`, s is also read by a Relu that is a graph output; with `relu`, s = Relu(Add(y1, y2)) as in
// ResNet).
Graph residual_qdq(Graph* fp32_out, std::string* y1, std::string* y2, std::string* y3, bool second_reader = false,
                   bool relu = false) {
  GraphBuilder b("qres", 13);
  auto x = b.input("x", DType::kF32, {1, 3, 6, 5});
  std::map<std::string, Attribute> pads = {{"pads", Attribute::of_ints({1, 1, 1, 1})}};
  *y1 = b.op1("Conv", {x, b.constant("w1", Tensor::f32({8, 3, 3, 3}, randv(216, 11, 0.3f)))}, pads);
  *y2 = b.op1("Conv", {*y1, b.constant("w2", Tensor::f32({8, 8, 3, 3}, randv(576, 12, 0.2f)))}, pads);
  auto sum = b.op1("Add", {*y1, *y2});
  if (relu) sum = b.op1("Relu", {sum});
  *y3 = b.op1("Conv", {sum, b.constant("w3", Tensor::f32({4, 8, 1, 1}, randv(32, 13, 0.3f)))});
  b.output(b.op1("GlobalAveragePool", {*y3}));
  if (second_reader) b.output(b.op1("Relu", {sum}));
  *fp32_out = b.take();
  Graph q = *fp32_out;
  Options o;
  o.values["range." + x] = std::string("-4,4");
  o.values["range." + *y1] = std::string("-3,3");
  o.values["range." + sum] = std::string("-5,5");
  run_pass(q, "quantize_int8", o);
  return q;
}

std::map<std::string, std::pair<std::string, std::string>> qconv_layouts(const Graph& g) {
  std::map<std::string, std::pair<std::string, std::string>> layouts;  // QConv output -> (input, output) layout
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    auto layout = [&](const char* a) { return n->attr(a) ? n->attr(a)->s : std::string("NCHW"); };
    if (n->op_type == "QConv") layouts[n->outputs[0]] = {layout("input_layout"), layout("output_layout")};
  }
  return layouts;
}

// The QConv that reads `z` as its residual input (nullptr when none does).
const Node* qconv_with_z(const Graph& g, const std::string& z) {
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    if (n->op_type == "QConv" && n->inputs.size() > 8 && n->inputs[8] == z) return n;
  }
  return nullptr;
}

void expect_same_outputs(const Graph& a, const Graph& b, uint32_t seed, double min_cosine = 0.999) {
  for (uint32_t k = 0; k < 3; ++k) {
    Feeds f = {{"x", Tensor::f32({1, 3, 6, 5}, randv(90, seed + k))}};
    auto ra = run(a, f), rb = run(b, f);
    ASSERT_EQ(ra.size(), rb.size());
    for (size_t i = 0; i < ra.size(); ++i) EXPECT_GE(cosine(ra[i], rb[i]), min_cosine) << "output " << i;
  }
}

// After fuse_qdq the residual Add is Conv2's input Z and the QuantizeLinear after it Conv2's requantisation: Conv2
// writes u8 straight for Conv3. The QuantizeLinears in front of Conv1 (the graph input) and Conv2 (y1) are folded
// into them: they read f32 and quantize. The int8 region (y1, Conv2's output) stays channels-last; Conv3's output,
// read by GlobalAveragePool, and the graph input stay plain.
TEST(FuseQdq, ResidualAddFoldsIntoTheConvAndRegionsStayChannelsLast) {
  Graph fp32;
  std::string y1, y2, y3;
  Graph q = residual_qdq(&fp32, &y1, &y2, &y3);
  Graph fused = q;
  auto r = run_pass(fused, "fuse_qdq", {});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["conv_fused"], 3);
  EXPECT_EQ(r[0].counters["adds_fused"], 1);
  EXPECT_EQ(r[0].counters["outputs_requantized"], 1);  // Conv2 (Conv1 has two readers and stays f32)
  EXPECT_EQ(r[0].counters["quantize_folded"], 2);
  EXPECT_EQ(r[0].counters["channels_last_edges"], 2);
  EXPECT_EQ(count_op(fused, "Add"), 0u);
  EXPECT_EQ(count_op(fused, "QuantizeLinear"), 0u);
  const Node* c2 = qconv_with_z(fused, y1);
  ASSERT_NE(c2, nullptr);
  EXPECT_EQ(c2->inputs[0], y1);  // y1 is both X (quantized by Conv2 itself) and Z
  ASSERT_NE(fused.info(c2->outputs[0]), nullptr);
  EXPECT_EQ(fused.info(c2->outputs[0])->dtype, DType::kU8);
  auto layouts = qconv_layouts(fused);
  ASSERT_EQ(layouts.size(), 3u);
  EXPECT_EQ(layouts[y1], std::make_pair(std::string("NCHW"), std::string("NHWC")));
  EXPECT_EQ(layouts[c2->outputs[0]], std::make_pair(std::string("NHWC"), std::string("NHWC")));
  EXPECT_EQ(layouts[y3], std::make_pair(std::string("NHWC"), std::string("NCHW")));
  expect_same_outputs(q, fused, 800);
  // Without channels-last values Z is read plain, as the output is written.
  Graph plain = q;
  Options off;
  off.values["channels_last"] = false;
  auto r2 = run_pass(plain, "fuse_qdq", off);
  EXPECT_EQ(r2[0].counters["channels_last_edges"], 0);
  EXPECT_EQ(r2[0].counters["adds_fused"], 1);
  expect_same_outputs(q, plain, 810);
  // fuse_add = false keeps the Add as a node, still channels-last (y1, y2, the sum).
  Graph kept = q;
  Options no_add;
  no_add.values["fuse_add"] = false;
  auto r3 = run_pass(kept, "fuse_qdq", no_add);
  EXPECT_EQ(r3[0].counters["adds_fused"], 0);
  EXPECT_EQ(r3[0].counters["quantize_folded"], 3);
  EXPECT_EQ(r3[0].counters["channels_last_edges"], 3);
  EXPECT_EQ(count_op(kept, "Add"), 1u);
  auto kl = qconv_layouts(kept);
  EXPECT_EQ(kl[y2], std::make_pair(std::string("NHWC"), std::string("NHWC")));
  expect_same_outputs(q, kept, 820);
  // ... and fold_quantize = false keeps the QuantizeLinears too (channels-last: also their outputs).
  Graph qdq = q;
  no_add.values["fold_quantize"] = false;
  auto r4 = run_pass(qdq, "fuse_qdq", no_add);
  EXPECT_EQ(r4[0].counters["quantize_folded"], 0);
  EXPECT_EQ(r4[0].counters["channels_last_edges"], 5);
  EXPECT_EQ(count_op(qdq, "QuantizeLinear"), 3u);
  expect_same_outputs(q, qdq, 850);
}

// The Add's output has a second reader: the QConv writes it in f32 (with the residual added) and Conv3 quantizes it
// (its QuantizeLinear folded in); the value read by the graph output's Relu stays plain, Z (y1) channels-last: the
// QConv reads it in its own layout (residual_layout).
TEST(FuseQdq, ResidualAddWithTwoReadersKeepsAnF32Output) {
  Graph fp32;
  std::string y1, y2, y3;
  Graph q = residual_qdq(&fp32, &y1, &y2, &y3, true);
  Graph fused = q;
  auto r = run_pass(fused, "fuse_qdq", {});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["adds_fused"], 1);
  EXPECT_EQ(count_op(fused, "Add"), 0u);
  EXPECT_EQ(r[0].counters["quantize_folded"], 3);
  EXPECT_EQ(count_op(fused, "QuantizeLinear"), 0u);
  const Node* c2 = qconv_with_z(fused, y1);
  ASSERT_NE(c2, nullptr);
  ASSERT_NE(fused.info(c2->outputs[0]), nullptr);
  EXPECT_EQ(fused.info(c2->outputs[0])->dtype, DType::kF32);
  auto layouts = qconv_layouts(fused);
  EXPECT_EQ(layouts[c2->outputs[0]].second, "NCHW");  // read by Relu
  EXPECT_EQ(layouts[y1].second, "NHWC");
  ASSERT_NE(c2->attr("residual_layout"), nullptr);
  EXPECT_EQ(c2->attr("residual_layout")->s, "NHWC");
  expect_same_outputs(q, fused, 830);
}

// ResNet's Add -> Relu: the Relu folds too (QConv's activation applies after Z is added), then the requantisation.
TEST(FuseQdq, ResidualAddThenReluFoldsBoth) {
  Graph fp32;
  std::string y1, y2, y3;
  Graph q = residual_qdq(&fp32, &y1, &y2, &y3, false, true);
  Graph fused = q;
  auto r = run_pass(fused, "fuse_qdq", {});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["adds_fused"], 1);
  EXPECT_EQ(r[0].counters["activations_fused"], 1);
  EXPECT_EQ(count_op(fused, "Add") + count_op(fused, "Relu") + count_op(fused, "QuantizeLinear"), 0u);
  const Node* c2 = qconv_with_z(fused, y1);
  ASSERT_NE(c2, nullptr);
  ASSERT_NE(c2->attr("activation"), nullptr);
  EXPECT_EQ(c2->attr("activation")->s, "Relu");
  expect_same_outputs(q, fused, 860);
}

// An Add that broadcasts is not a residual: it stays a node.
TEST(FuseQdq, BroadcastingAddIsNotFolded) {
  GraphBuilder b("qbcast", 13);
  auto x = b.input("x", DType::kF32, {1, 3, 6, 5});
  auto y = b.op1("Conv", {x, b.constant("w", Tensor::f32({8, 3, 3, 3}, randv(216, 21, 0.3f)))},
                 {{"pads", Attribute::of_ints({1, 1, 1, 1})}});
  b.output(b.op1("Add", {y, b.constant("c", Tensor::f32({8, 1, 1}, randv(8, 22, 0.3f)))}));
  Graph fp32 = b.take();
  Graph q = fp32;
  Options o;
  o.values["range." + x] = std::string("-4,4");
  run_pass(q, "quantize_int8", o);
  Graph fused = q;
  auto r = run_pass(fused, "fuse_qdq", {});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["conv_fused"], 1);
  EXPECT_EQ(r[0].counters["adds_fused"], 0);
  EXPECT_EQ(count_op(fused, "Add"), 1u);
  expect_same_outputs(q, fused, 840);
}

// SimpleCNN in QDQ form: x -> Conv -> Relu -> MaxPool -> Flatten -> QuantizeLinear/DequantizeLinear -> Gemm. The
// QuantizeLinear moves over Flatten and MaxPool (hoist_quantize: exact), so the Conv requantizes with its Relu into
// u8, the pooling and the Flatten run on bytes and the QGemm reads them: no f32 activation is left between the two
// int8 nodes. With `second_reader`, the Relu's output is a graph output too: the QuantizeLinear stops after Flatten.
Graph small_cnn_qdq(Graph* fp32_out, int64_t opset = 13, bool second_reader = false) {
  GraphBuilder b("qcnn", opset);
  auto x = b.input("x", DType::kF32, {2, 1, 11, 9});
  auto h = b.op1("Conv", {x, b.constant("w", Tensor::f32({8, 1, 3, 3}, randv(72, 31, 0.5f))),
                          b.constant("b", Tensor::f32({8}, randv(8, 32, 0.1f)))});
  auto r = b.op1("Relu", {h});
  if (second_reader) b.output(r);
  h = b.op1("MaxPool", {r}, {{"kernel_shape", Attribute::of_ints({2, 2})}, {"strides", Attribute::of_ints({2, 2})}});
  auto f = b.op1("Flatten", {h});
  b.output(b.op1("Gemm",
                 {f, b.constant("wf", Tensor::f32({5, 8 * 4 * 3}, randv(480, 33, 0.2f))),
                  b.constant("bf", Tensor::f32({5}, randv(5, 34, 0.1f)))},
                 {{"transB", Attribute::of_int(1)}}));
  *fp32_out = b.take();
  Graph q = *fp32_out;
  Options o;
  o.values["range." + x] = std::string("0,1");
  o.values["range." + f] = std::string("0,3");
  run_pass(q, "quantize_int8", o);
  return q;
}

TEST(FuseQdq, QuantizeMovesOverMaxPoolAndFlattenSoTheConvRequantizes) {
  Graph fp32;
  Graph q = small_cnn_qdq(&fp32);
  Graph fused = q;
  auto r = run_pass(fused, "fuse_qdq", {});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["quantize_hoisted"], 2);
  EXPECT_EQ(r[0].counters["conv_fused"], 1);
  EXPECT_EQ(r[0].counters["gemm_fused"], 1);
  EXPECT_EQ(r[0].counters["activations_fused"], 1);
  EXPECT_EQ(r[0].counters["outputs_requantized"], 1);
  EXPECT_EQ(count_op(fused, "QuantizeLinear") + count_op(fused, "DequantizeLinear") + count_op(fused, "Relu"), 0u);
  for (NodeId id : fused.node_ids()) {
    const Node* n = fused.node(id);
    if (n->op_type != "MaxPool" && n->op_type != "Flatten") continue;
    ASSERT_NE(fused.info(n->outputs[0]), nullptr);
    EXPECT_EQ(fused.info(n->outputs[0])->dtype, DType::kU8) << n->op_type << " runs on bytes";
  }
  // Where the QuantizeLinear stayed (hoist_quantize = false) the QGemm reads f32 and quantizes it (folded).
  Graph kept = q;
  Options off;
  off.values["hoist_quantize"] = false;
  auto r2 = run_pass(kept, "fuse_qdq", off);
  EXPECT_EQ(r2[0].counters["quantize_hoisted"], 0);
  EXPECT_EQ(r2[0].counters["outputs_requantized"], 0);
  for (uint32_t k = 0; k < 3; ++k) {
    std::vector<float> img = randv(198, 900 + k, 0.5f);
    for (float& v : img) v = std::fabs(v);
    Feeds f = {{"x", Tensor::f32({2, 1, 11, 9}, img)}};
    auto a = run(q, f), b = run(fused, f), c = run(kept, f);
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(b.size(), 1u);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_GE(cosine(a[0], b[0]), 0.9999);  // the QDQ graph's arithmetic: moving the QuantizeLinear is exact
    EXPECT_GE(cosine(c[0], b[0]), 0.9999);
  }
}

// The QuantizeLinear stays where moving it would not pay: it could pass the Flatten only (MaxPool's input has a
// second reader; before opset 12 MaxPool has no 8-bit types), which would split it from the QGemm it folds into.
TEST(FuseQdq, QuantizeStaysWhereMovingItDoesNotPay) {
  Graph fp32;
  for (const bool second_reader : {true, false}) {
    Graph q = small_cnn_qdq(&fp32, second_reader ? 13 : 11, second_reader);
    auto r = run_pass(q, "fuse_qdq", {});
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].counters["quantize_hoisted"], 0);
    EXPECT_EQ(r[0].counters["outputs_requantized"], 0);
    EXPECT_EQ(r[0].counters["quantize_folded"], 2);  // the image's into the QConv, this one into the QGemm
    EXPECT_EQ(count_op(q, "QuantizeLinear"), 0u);
  }
  // MobileNetV2's and ResNet's tail: GlobalAveragePool -> Flatten -> QuantizeLinear -> Gemm. Passing the Flatten
  // alone gains nothing: the QuantizeLinear stays and folds into the QGemm.
  GraphBuilder b("qtail", 13);
  auto x = b.input("x", DType::kF32, {2, 8, 5, 5});
  auto f = b.op1("Flatten", {b.op1("GlobalAveragePool", {x})});
  b.output(b.op1("Gemm", {f, b.constant("w", Tensor::f32({4, 8}, randv(32, 41, 0.3f)))},
                 {{"transB", Attribute::of_int(1)}}));
  Graph tail = b.take();
  Options o;
  o.values["range." + f] = std::string("0,2");
  run_pass(tail, "quantize_int8", o);
  auto r = run_pass(tail, "fuse_qdq", {});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["quantize_hoisted"], 0);
  EXPECT_EQ(r[0].counters["gemm_fused"], 1);
  EXPECT_EQ(r[0].counters["quantize_folded"], 1);
}

TEST(FuseQdq, LeavesWhatItCannotFuse) {
  Graph fp32;
  Graph q = qdq_net(&fp32);
  // A weight with a non-zero zero point is not symmetric: that Conv stays in QDQ form.
  for (NodeId id : q.node_ids()) {
    Node* n = q.node(id);
    if (n->op_type != "DequantizeLinear" || !q.is_initializer(n->inputs[0])) continue;
    if (q.initializers.at(n->inputs[0]).shape().size() != 4 || q.initializers.at(n->inputs[0]).shape()[1] != 3)
      continue;
    Tensor z = q.initializers.at(n->inputs[2]).clone().value();
    z.data<int8_t>()[0] = 1;
    q.initializers[n->inputs[2]] = z;
  }
  auto r = run_pass(q, "fuse_qdq", {});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["conv_fused"], 1);
  EXPECT_EQ(count_op(q, "Conv"), 1u);
  // An fp32 graph has nothing to fuse.
  auto r2 = run_pass(fp32, "fuse_qdq", {});
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_EQ(r2[0].counters["conv_fused"], 0);
}

}  // namespace
}  // namespace keel
