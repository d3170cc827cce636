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
  auto y = b.op1("Conv", {h, b.constant("w2", Tensor::f32({4, c1, 3, 3}, randv(static_cast<size_t>(4 * c1 * 9), 3, 0.3f))),
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
    if (w.shape()[1] == 3) EXPECT_EQ(w.shape()[0], 4);    // first Conv: 4 output channels left
    else EXPECT_EQ(w.shape()[1], 4);                      // second Conv: 4 input channels left
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

// x[1,3,8,8] -> ConvA(8) -> BN -> Relu = r0 -> ConvB1(6) -> Relu -> ConvB2(8) -> Add(., r0) -> Relu -> GlobalAveragePool
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
  auto h = b.op1("Conv", {x, b.constant("wa", Tensor::f32({8, 3, 3, 3}, wa)), b.constant("ba", Tensor::f32({8}, ba))},
                 pads);
  h = b.op1("BatchNormalization", {h, b.constant("bn_scale", Tensor::f32({8}, scale)),
                                   b.constant("bn_beta", Tensor::f32({8}, beta)),
                                   b.constant("bn_mean", Tensor::f32({8}, mean)),
                                   b.constant("bn_var", Tensor::f32({8}, var))});
  auto r0 = b.op1("Relu", {h});
  h = b.op1("Conv", {r0, b.constant("wb1", Tensor::f32({6, 8, 3, 3}, wb1)), b.constant("bb1", Tensor::f32({6}, bb1))},
            pads);
  h = b.op1("Relu", {h});
  h = b.op1("Conv", {h, b.constant("wb2", Tensor::f32({8, 6, 3, 3}, wb2)), b.constant("bb2", Tensor::f32({8}, bb2))},
            pads);
  h = b.op1("Relu", {b.op1("Add", {h, r0})});
  h = b.op1("Flatten", {b.op1("GlobalAveragePool", {h})});
  auto y = b.op1("Gemm", {h, b.constant("wfc", Tensor::f32({5, 8}, randv(40, 21, 0.3f))),
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
  auto h = b.op1("Relu", {b.op1("Conv", {x, b.constant("w1", Tensor::f32({8, 3, 1, 1}, w1)),
                                         b.constant("b1", Tensor::f32({8}, b1))})});
  h = b.op1("Relu", {b.op1("Conv", {h, b.constant("wd", Tensor::f32({8, 1, 3, 3}, randv(72, 33, 0.3f))),
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
  auto s = b.op1("Relu", {b.op1("Conv", {x, b.constant("ws", Tensor::f32({6, 3, 1, 1}, ws)), b.constant("bs", Tensor::f32({6}, bs))})});
  auto e1 = b.op1("Relu", {b.op1("Conv", {s, b.constant("w1", Tensor::f32({4, 6, 1, 1}, w1)), b.constant("b1", Tensor::f32({4}, b1))})});
  auto e3 = b.op1("Relu", {b.op1("Conv", {s, b.constant("w3", Tensor::f32({6, 6, 3, 3}, w3)), b.constant("b3", Tensor::f32({6}, b3))},
                                 {{"pads", Attribute::of_ints({1, 1, 1, 1})}})});
  auto cat = b.op1("Concat", {e1, e3}, {{"axis", Attribute::of_int(1)}});
  auto p = b.op1("MaxPool", {cat}, {{"kernel_shape", Attribute::of_ints({2, 2})}, {"strides", Attribute::of_ints({2, 2})}});
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
    for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(ny[o2 * 5 + i], wy[static_cast<size_t>(o2 * 10 + cols[i])]) << o2 << "," << i;
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
Graph qdq_net(Graph* fp32_out) {
  GraphBuilder b("qnet", 13);
  auto x = b.input("x", DType::kF32, {2, 3, 8, 8});
  std::map<std::string, Attribute> pads = {{"pads", Attribute::of_ints({1, 1, 1, 1})}};
  auto h = b.op1("Conv", {x, b.constant("w1", Tensor::f32({8, 3, 3, 3}, randv(216, 1, 0.3f))),
                          b.constant("b1", Tensor::f32({8}, randv(8, 2, 0.1f)))}, pads);
  auto h1 = b.op1("Relu", {h});
  h = b.op1("Conv", {h1, b.constant("w2", Tensor::f32({8, 8, 3, 3}, randv(576, 3, 0.2f)))}, pads);
  h = b.op1("GlobalAveragePool", {h});
  auto f = b.op1("Flatten", {h});
  b.output(b.op1("Gemm", {f, b.constant("wf", Tensor::f32({5, 8}, randv(40, 5, 0.5f))),
                          b.constant("bf", Tensor::f32({5}, randv(5, 6, 0.1f)))},
                 {{"transB", Attribute::of_int(1)}}));
  Graph g = b.take();
  *fp32_out = g;
  Options o;
  o.values["range." + x] = std::string("-4,4");
  o.values["range." + h1] = std::string("0,3");
  o.values["range." + f] = std::string("-1,1");
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
  EXPECT_EQ(r[0].counters["activations_fused"], 1);   // the Relu after the first Conv
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
    EXPECT_GE(cosine(c[0], b[0]), 0.95);  // hand-picked ranges: near fp32, not calibrated
  }
}

// A residual block in QDQ form: x -> Conv1 -> y1; y1 -> Conv2 -> y2; Add(y1, y2) -> s -> Conv3 -> GlobalAveragePool.
// After fuse_qdq the whole int8 region (y1, y2, s and the QuantizeLinear outputs in front of Conv2 and Conv3) stays
// channels-last; Conv3's output, read by GlobalAveragePool, and the graph input stay plain.
TEST(FuseQdq, ResidualRegionsStayChannelsLast) {
  GraphBuilder b("qres", 13);
  auto x = b.input("x", DType::kF32, {1, 3, 6, 5});
  std::map<std::string, Attribute> pads = {{"pads", Attribute::of_ints({1, 1, 1, 1})}};
  auto y1 = b.op1("Conv", {x, b.constant("w1", Tensor::f32({8, 3, 3, 3}, randv(216, 11, 0.3f)))}, pads);
  auto y2 = b.op1("Conv", {y1, b.constant("w2", Tensor::f32({8, 8, 3, 3}, randv(576, 12, 0.2f)))}, pads);
  auto sum = b.op1("Add", {y1, y2});
  auto y3 = b.op1("Conv", {sum, b.constant("w3", Tensor::f32({4, 8, 1, 1}, randv(32, 13, 0.3f)))});
  b.output(b.op1("GlobalAveragePool", {y3}));
  Graph fp32 = b.take();
  Graph q = fp32;
  Options o;
  o.values["range." + x] = std::string("-4,4");
  o.values["range." + y1] = std::string("-3,3");
  o.values["range." + sum] = std::string("-5,5");
  run_pass(q, "quantize_int8", o);
  Graph fused = q;
  auto r = run_pass(fused, "fuse_qdq", {});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].counters["conv_fused"], 3);
  EXPECT_EQ(r[0].counters["channels_last_edges"], 5);
  std::map<std::string, std::pair<std::string, std::string>> layouts;  // QConv name -> (input, output) layout
  for (NodeId id : fused.node_ids()) {
    const Node* n = fused.node(id);
    auto layout = [&](const char* a) { return n->attr(a) ? n->attr(a)->s : std::string("NCHW"); };
    if (n->op_type == "QConv") layouts[n->outputs[0]] = {layout("input_layout"), layout("output_layout")};
  }
  ASSERT_EQ(layouts.size(), 3u);
  EXPECT_EQ(layouts[y1], std::make_pair(std::string("NCHW"), std::string("NHWC")));
  EXPECT_EQ(layouts[y2], std::make_pair(std::string("NHWC"), std::string("NHWC")));
  EXPECT_EQ(layouts[y3], std::make_pair(std::string("NHWC"), std::string("NCHW")));
  for (uint32_t k = 0; k < 3; ++k) {
    Feeds f = {{"x", Tensor::f32({1, 3, 6, 5}, randv(90, 800 + k))}};
    auto a = run(q, f), c = run(fused, f);
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_GE(cosine(a[0], c[0]), 0.999);
  }
  // Without the option nothing is channels-last.
  Graph plain = q;
  Options off;
  off.values["channels_last"] = false;
  auto r2 = run_pass(plain, "fuse_qdq", off);
  EXPECT_EQ(r2[0].counters["channels_last_edges"], 0);
}

TEST(FuseQdq, LeavesWhatItCannotFuse) {
  Graph fp32;
  Graph q = qdq_net(&fp32);
  // A weight with a non-zero zero point is not symmetric: that Conv stays in QDQ form.
  for (NodeId id : q.node_ids()) {
    Node* n = q.node(id);
    if (n->op_type != "DequantizeLinear" || !q.is_initializer(n->inputs[0])) continue;
    if (q.initializers.at(n->inputs[0]).shape().size() != 4 || q.initializers.at(n->inputs[0]).shape()[1] != 3) continue;
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
