// The precision pass plugin (passes/precision: convert_precision, convert_fp16, convert_bf16) on small graphs made
// here: the structure after the pass (fp32 boundaries, keep-list, no redundant Cast pairs, clamping counted) and
// the outputs against the fp32 graph within a bf16/fp16 tolerance, run in sessions on the CPU (the oneDNN plugin's
// bf16 kernels where the build has them, the reference kernels otherwise); and `keel run/bench --precision`,
// `keel optimize --config` with the pass's options (the CLI).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "core/base/pass_manager.h"
#include "core/runtime/environment.h"
#include "core/runtime/host_api.h"
#include "core/runtime/kernel_context.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "tests/passes/pass_test_env.h"

namespace keel {
namespace {

Tensor randn(Shape shape, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = d(rng);
  return Tensor::f32(std::move(shape), v);
}

using Feeds = std::vector<std::pair<std::string, Tensor>>;

std::vector<Tensor> run(Graph g, const Feeds& feeds, std::vector<std::string> passes = {}) {
  SessionOptions o;
  o.devices = {"cpu"};
  o.passes = std::move(passes);
  auto s = Session::create(env(), std::move(g), o);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  if (!s.is_ok()) return {};
  auto out = s.value()->run(feeds);
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.is_ok() ? std::move(out).value() : std::vector<Tensor>{};
}

StatusOr<std::vector<PassReport>> try_convert(Graph& g, const std::string& dtype, std::vector<std::string> keep = {},
                                              const std::string& pass = "convert_precision") {
  EXPECT_TRUE(infer_shapes(g).is_ok());
  PassSpec spec;
  spec.name = pass;
  if (!dtype.empty()) spec.options.values["dtype"] = dtype;
  if (!keep.empty()) spec.options.values["keep_fp32"] = keep;
  keel_graph_s view;
  view.graph = &g;
  view.env = &env();
  return PassManager(env().registry(), graph_api()).run(g, &view, {spec}, "cpu");
}

PassReport convert(Graph& g, const std::string& dtype, std::vector<std::string> keep = {}) {
  auto r = try_convert(g, dtype, std::move(keep));
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(g.validate().is_ok());
  EXPECT_TRUE(infer_shapes(g).is_ok());
  return r.is_ok() && !r.value().empty() ? r.value()[0] : PassReport{};
}

int64_t counter(const PassReport& r, const std::string& k) {
  auto it = r.counters.find(k);
  return it == r.counters.end() ? -1 : it->second;
}

DType dtype_of(const Graph& g, const std::string& v) {
  if (auto it = g.initializers.find(v); it != g.initializers.end()) return it->second.dtype();
  const ValueInfo* vi = g.info(v);
  return vi ? vi->dtype : DType::kUndefined;
}

std::vector<const Node*> nodes_of(const Graph& g, const std::string& op) {
  std::vector<const Node*> out;
  for (NodeId id : g.node_ids())
    if (g.node(id)->op_type == op) out.push_back(g.node(id));
  return out;
}

const Node* producer_of(const Graph& g, const std::string& v) {
  for (NodeId id : g.node_ids())
    for (const auto& o : g.node(id)->outputs)
      if (o == v) return g.node(id);
  return nullptr;
}

// Graph inputs and outputs keep their fp32 types; no Cast reads a Cast that round-trips (low -> f32 -> low).
void expect_clean_boundaries(const Graph& g) {
  for (const auto& v : g.inputs) EXPECT_EQ(dtype_of(g, v), DType::kF32) << "graph input " << v;
  for (const auto& v : g.outputs) EXPECT_EQ(dtype_of(g, v), DType::kF32) << "graph output " << v;
  for (const Node* c : nodes_of(g, "Cast")) {
    const Node* p = producer_of(g, c->inputs[0]);
    if (p == nullptr || p->op_type != "Cast") continue;
    const DType a = dtype_of(g, p->inputs[0]);
    const DType to = static_cast<DType>(c->attrs.at("to").i);
    EXPECT_FALSE(a == to && (a == DType::kBF16 || a == DType::kF16)) << "redundant Cast pair into " << c->outputs[0];
  }
}

// Cosine similarity and max error relative to max|ref| of one f32 output.
void expect_close(const Tensor& got, const Tensor& ref, double min_cos, double max_rel) {
  ASSERT_EQ(got.dtype(), DType::kF32);
  ASSERT_EQ(got.shape(), ref.shape());
  double dot = 0, na = 0, nb = 0, amax = 0, err = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double a = got.data<float>()[i], b = ref.data<float>()[i];
    dot += a * b, na += a * a, nb += b * b;
    amax = std::max(amax, std::fabs(b));
    err = std::max(err, std::fabs(a - b));
  }
  const double cos = dot / std::sqrt(na * nb);
  EXPECT_GE(cos, min_cos);
  EXPECT_LE(err / amax, max_rel) << "max |err| " << err << " of max |ref| " << amax;
}

// A small residual conv net: Conv-BN-Relu-Conv-Add-Relu-GlobalAveragePool-Flatten-Gemm.
Graph conv_net() {
  GraphBuilder b("conv_net", 13);
  auto x = b.input("x", DType::kF32, {2, 8, 12, 12});
  auto attrs = std::map<std::string, Attribute>{{"kernel_shape", Attribute::of_ints({3, 3})},
                                                {"pads", Attribute::of_ints({1, 1, 1, 1})}};
  auto c1 =
      b.op1("Conv", {x, b.constant("w1", randn({16, 8, 3, 3}, 1, 0.2f)), b.constant("b1", randn({16}, 2))}, attrs);
  std::vector<float> ones(16, 1.f), var(16, 0.5f);
  auto bn = b.op1("BatchNormalization",
                  {c1, b.constant("bn_s", Tensor::f32({16}, ones)), b.constant("bn_b", randn({16}, 3)),
                   b.constant("bn_m", randn({16}, 4, 0.1f)), b.constant("bn_v", Tensor::f32({16}, var))});
  auto r1 = b.op1("Relu", {bn});
  auto c2 = b.op1("Conv", {r1, b.constant("w2", randn({16, 16, 3, 3}, 5, 0.1f))}, attrs);
  auto skip = b.op1("Conv", {x, b.constant("w3", randn({16, 8, 1, 1}, 6, 0.3f))},
                    {{"kernel_shape", Attribute::of_ints({1, 1})}});
  auto add = b.op1("Add", {c2, skip});
  auto r2 = b.op1("Relu", {add});
  auto gap = b.op1("GlobalAveragePool", {r2});
  auto flat = b.op1("Flatten", {gap});
  auto y = b.op1("Gemm", {flat, b.constant("fc_w", randn({10, 16}, 7, 0.3f)), b.constant("fc_b", randn({10}, 8))},
                 {{"transB", Attribute::of_int(1)}});
  b.output(y);
  return b.take();
}

// Single-head attention with a residual and a mean: MatMul Q/K/V, QK^T/sqrt(d), Softmax, @V, + x, ReduceMean.
Graph attention_net() {
  GraphBuilder b("attention", 13);
  auto x = b.input("x", DType::kF32, {2, 8, 16});
  auto q = b.op1("MatMul", {x, b.constant("wq", randn({16, 16}, 11, 0.25f))});
  auto k = b.op1("MatMul", {x, b.constant("wk", randn({16, 16}, 12, 0.25f))});
  auto v = b.op1("MatMul", {x, b.constant("wv", randn({16, 16}, 13, 0.25f))});
  auto kt = b.op1("Transpose", {k}, {{"perm", Attribute::of_ints({0, 2, 1})}});
  auto s = b.op1("MatMul", {q, kt});
  auto sc = b.op1("Div", {s, b.constant("sqrt_d", Tensor::f32({}, {4.f}))});
  auto p = b.op1("Softmax", {sc}, {{"axis", Attribute::of_int(-1)}});
  auto o = b.op1("MatMul", {p, v});
  auto res = b.op1("Add", {o, x});
  auto mean = b.op1("ReduceMean", {res}, {{"axes", Attribute::of_ints({-1})}});
  b.output(res);
  b.output(mean);
  return b.take();
}

// MobileNetV2's inverted residual blocks: 1x1 expansion + Clip(0, 6), 3x3 depthwise + Clip, 1x1 projection (+ the
// block's input at stride 1), then a stride-2 block; at bf16 the oneDNN plugin runs each block as its own expand_dw
// step (the 1x1s on bf16 pairs) where the CPU has AVX-512 BF16.
Graph inverted_residual_net() {
  GraphBuilder b("inverted_residual", 13);
  auto x = b.input("x", DType::kF32, {2, 16, 14, 15});
  const std::string lo = b.constant("lo", Tensor::f32({}, {0.f})), hi = b.constant("hi", Tensor::f32({}, {6.f}));
  auto clip = [&](const std::string& v) { return b.op1("Clip", {v, lo, hi}); };
  auto conv = [&](const std::string& v, const std::string& w, Shape ws, uint32_t seed, int64_t group, int64_t stride) {
    const int64_t k = ws[2];
    std::map<std::string, Attribute> a{{"kernel_shape", Attribute::of_ints({k, k})},
                                       {"pads", Attribute::of_ints({k / 2, k / 2, k / 2, k / 2})},
                                       {"strides", Attribute::of_ints({stride, stride})},
                                       {"group", Attribute::of_int(group)}};
    const float scale = 1.f / std::sqrt(static_cast<float>(ws[1] * k * k));
    return b.op1("Conv",
                 {v, b.constant(w, randn(ws, seed, scale)), b.constant(w + "_b", randn({ws[0]}, seed + 1, 0.1f))}, a);
  };
  auto e1 = clip(conv(x, "e1", {96, 16, 1, 1}, 21, 1, 1));
  auto d1 = clip(conv(e1, "d1", {96, 1, 3, 3}, 23, 96, 1));
  auto p1 = conv(d1, "p1", {16, 96, 1, 1}, 25, 1, 1);
  auto r1 = b.op1("Add", {p1, x});
  auto e2 = clip(conv(r1, "e2", {64, 16, 1, 1}, 27, 1, 1));
  auto d2 = clip(conv(e2, "d2", {64, 1, 3, 3}, 29, 64, 2));
  auto p2 = conv(d2, "p2", {24, 64, 1, 1}, 31, 1, 1);
  b.output(p2);
  return b.take();
}
Feeds inverted_residual_feeds() { return {{"x", randn({2, 16, 14, 15}, 97)}}; }

Feeds conv_feeds() { return {{"x", randn({2, 8, 12, 12}, 99)}}; }
Feeds attention_feeds() { return {{"x", randn({2, 8, 16}, 98)}}; }

TEST(ConvertPrecision, ConvNetBf16KeepsFp32BoundariesAndMatches) {
  Graph g = conv_net();
  auto ref = run(g, conv_feeds());
  PassReport r = convert(g, "bf16");
  expect_clean_boundaries(g);
  EXPECT_EQ(counter(r, "nodes_converted"), 10);  // every node: 3 Conv, BN, 2 Relu, Add, GAP, Flatten, Gemm
  EXPECT_EQ(nodes_of(g, "Cast").size(), 2u) << "one Cast in (shared by both readers of x), one Cast out";
  EXPECT_EQ(counter(r, "casts_inserted"), 2);
  EXPECT_GT(counter(r, "bytes_saved"), 0);
  for (const Node* c : nodes_of(g, "Conv")) EXPECT_EQ(dtype_of(g, c->inputs[1]), DType::kBF16);
  EXPECT_EQ(g.initializers.count("w1"), 0u) << "the f32 weights nothing reads any more are dropped";
  auto got = run(g, conv_feeds());
  ASSERT_EQ(got.size(), 1u);
  expect_close(got[0], ref[0], 0.999, 3e-2);
}

TEST(ConvertPrecision, InvertedResidualBlocksBf16Match) {
  Graph g = inverted_residual_net();
  auto ref = run(g, inverted_residual_feeds());
  convert(g, "bf16");
  expect_clean_boundaries(g);
  auto got = run(g, inverted_residual_feeds());
  ASSERT_EQ(got.size(), 1u);
  expect_close(got[0], ref[0], 0.999, 3e-2);
}

TEST(ConvertPrecision, ConvNetFp16Matches) {
  Graph g = conv_net();
  auto ref = run(g, conv_feeds());
  PassReport r = convert(g, "fp16");
  expect_clean_boundaries(g);
  for (const Node* c : nodes_of(g, "Conv")) EXPECT_EQ(dtype_of(g, c->inputs[1]), DType::kF16);
  EXPECT_EQ(counter(r, "values_clamped"), 0);
  auto got = run(g, conv_feeds());
  ASSERT_EQ(got.size(), 1u);
  expect_close(got[0], ref[0], 0.9999, 5e-3);
}

TEST(ConvertPrecision, AttentionKeepListPerDtype) {
  for (const char* dt : {"bf16", "fp16"}) {
    SCOPED_TRACE(dt);
    Graph g = attention_net();
    auto ref = run(g, attention_feeds());
    PassReport r = convert(g, dt);
    expect_clean_boundaries(g);
    const bool bf16 = std::string(dt) == "bf16";
    const DType low = bf16 ? DType::kBF16 : DType::kF16;
    for (const Node* m : nodes_of(g, "MatMul")) EXPECT_EQ(dtype_of(g, m->inputs[0]), low);
    // ReduceMean is on the keep-list for both; Softmax only for fp16 (its exponent range).
    ASSERT_EQ(nodes_of(g, "ReduceMean").size(), 1u);
    EXPECT_EQ(dtype_of(g, nodes_of(g, "ReduceMean")[0]->inputs[0]), DType::kF32);
    EXPECT_EQ(dtype_of(g, nodes_of(g, "Softmax")[0]->inputs[0]), bf16 ? DType::kBF16 : DType::kF32);
    EXPECT_GE(counter(r, "nodes_kept_fp32"), bf16 ? 1 : 2);
    bool noted = false;
    for (const auto& n : r.notes) noted = noted || n.find("ReduceMean") != std::string::npos;
    EXPECT_TRUE(noted) << "the report names the kept op";
    auto got = run(g, attention_feeds());
    ASSERT_EQ(got.size(), 2u);
    expect_close(got[0], ref[0], 0.999, bf16 ? 3e-2 : 5e-3);
    expect_close(got[1], ref[1], 0.99, bf16 ? 3e-2 : 5e-3);
  }
}

TEST(ConvertPrecision, KeepFp32OptionByOpTypeAndNodeName) {
  Graph g = conv_net();
  std::string first_conv;
  for (NodeId id : g.node_ids())
    if (g.node(id)->op_type == "Conv") {
      first_conv = g.node(id)->name;
      break;
    }
  ASSERT_FALSE(first_conv.empty());
  auto ref = run(g, conv_feeds());
  PassReport r = convert(g, "bf16", {"Gemm", first_conv});
  expect_clean_boundaries(g);
  EXPECT_EQ(counter(r, "nodes_kept_fp32"), 2);
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    if (n->op_type == "Gemm" || n->name == first_conv) {
      for (const auto& i : n->inputs) EXPECT_EQ(dtype_of(g, i), DType::kF32) << n->name;
    }
  }
  auto got = run(g, conv_feeds());
  expect_close(got[0], ref[0], 0.999, 3e-2);
}

TEST(ConvertPrecision, CollapsesRoundTripCastsButNotLossyOnes) {
  // x -> Cast(bf16) a -> Cast(f32) b -> Cast(bf16) c: c is a (exact round trip). x -> Cast(bf16) -> Cast(f32) is
  // lossy and stays.
  GraphBuilder bld("casts", 13);
  auto x = bld.input("x", DType::kF32, {4, 4});
  auto to_bf = std::map<std::string, Attribute>{{"to", Attribute::of_int(static_cast<int64_t>(DType::kBF16))}};
  auto to_f = std::map<std::string, Attribute>{{"to", Attribute::of_int(static_cast<int64_t>(DType::kF32))}};
  auto a = bld.op1("Cast", {x}, to_bf);
  auto b = bld.op1("Cast", {a}, to_f);
  auto c = bld.op1("Cast", {b}, to_bf);
  auto m = bld.op1("MatMul", {c, bld.op1("Cast", {bld.constant("w", randn({4, 4}, 3))}, to_bf)});
  auto y = bld.op1("Relu", {bld.op1("Cast", {m}, to_f)});
  bld.output(y);
  bld.output(b);
  Graph g = bld.take();
  Feeds feeds = {{"x", randn({4, 4}, 5)}};
  auto ref = run(g, feeds);
  PassReport r = convert(g, "bf16");
  EXPECT_GE(counter(r, "casts_collapsed"), 1);
  expect_clean_boundaries(g);
  ASSERT_EQ(nodes_of(g, "MatMul").size(), 1u);
  EXPECT_EQ(nodes_of(g, "MatMul")[0]->inputs[0], a) << "MatMul reads the first bf16 Cast directly";
  auto got = run(g, feeds);
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) expect_close(got[i], ref[i], 0.999, 2e-2);
}

TEST(ConvertPrecision, Fp16ClampsOutOfRangeInitializersAndCountsThem) {
  GraphBuilder b("clamp", 13);
  auto x = b.input("x", DType::kF32, {1, 4});
  std::vector<float> w = {1e6f, -2e5f, 1e-9f, 0.5f, 0.f, -1e-10f, 2.f, 3.f};
  auto y = b.op1("MatMul", {x, b.constant("w", Tensor::f32({4, 2}, w))});
  b.output(y);
  Graph g = b.take();
  PassReport r = convert(g, "fp16");
  EXPECT_EQ(counter(r, "values_clamped"), 4) << "two beyond ±65504, two non-zero below 2^-24 (0 stays 0)";
  const Node* mm = nodes_of(g, "MatMul")[0];
  const Tensor& t = g.initializers.at(mm->inputs[1]);
  ASSERT_EQ(t.dtype(), DType::kF16);
  EXPECT_EQ(f16_to_f32(t.data<uint16_t>()[0]), 65504.f);
  EXPECT_EQ(f16_to_f32(t.data<uint16_t>()[1]), -65504.f);
  EXPECT_GT(f16_to_f32(t.data<uint16_t>()[2]), 0.f);
  EXPECT_EQ(f16_to_f32(t.data<uint16_t>()[4]), 0.f);
  EXPECT_LT(f16_to_f32(t.data<uint16_t>()[5]), 0.f);
  EXPECT_EQ(f16_to_f32(t.data<uint16_t>()[3]), 0.5f);
  bool noted = false;
  for (const auto& n : r.notes) noted = noted || n.find("clamped") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(ConvertPrecision, SubgraphNodesStayFp32AndCapturedValuesKeepTheirNames) {
  // xw = MatMul(x, w) (converted); y = If(cond) then Relu(xw) else Neg(x): the body reads xw in fp32.
  GraphBuilder b("if", 17);
  b.input("cond", DType::kBool, {});
  auto x = b.input("x", DType::kF32, {2, 3});
  b.constant("w", randn({3, 3}, 21));
  Node mm;
  mm.op_type = "MatMul";
  mm.name = "mm";
  mm.inputs = {x, "w"};
  mm.outputs = {"xw"};
  b.graph().add_node(mm);
  auto body = [](const std::string& name, const std::string& op, const std::string& in, const std::string& out) {
    auto sg = std::make_shared<Graph>();
    sg->name = name;
    Node n;
    n.op_type = op;
    n.name = name + "_node";
    n.inputs = {in};
    n.outputs = {out};
    sg->add_node(std::move(n));
    sg->outputs = {out};
    Attribute a;
    a.kind = AttrKind::kGraph;
    a.g = sg;
    return a;
  };
  Node ifn;
  ifn.op_type = "If";
  ifn.name = "if";
  ifn.inputs = {"cond"};
  ifn.outputs = {"y"};
  ifn.attrs = {{"then_branch", body("then", "Relu", "xw", "then_y")},
               {"else_branch", body("else", "Neg", "x", "else_y")}};
  b.graph().add_node(ifn);
  b.output("y");
  Graph g = b.take();
  for (bool cond : {true, false}) {
    Feeds feeds = {{"cond", Tensor::from_vector<uint8_t>(DType::kBool, {}, {static_cast<uint8_t>(cond)})},
                   {"x", randn({2, 3}, 22)}};
    Graph g2 = g;
    auto ref = run(g2, feeds);
    PassReport r = convert(g2, "bf16");
    EXPECT_EQ(counter(r, "nodes_converted"), 1);
    ASSERT_EQ(nodes_of(g2, "If").size(), 1u);
    ASSERT_NE(producer_of(g2, "xw"), nullptr);
    EXPECT_EQ(producer_of(g2, "xw")->op_type, "Cast") << "xw keeps its name, in fp32, for the captured read";
    auto got = run(g2, feeds);
    ASSERT_EQ(got.size(), 1u);
    expect_close(got[0], ref[0], 0.999, 3e-2);
  }
}

TEST(ConvertPrecision, BadOptionsAreClearErrors) {
  Graph g = conv_net();
  auto r = try_convert(g, "");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("dtype"), std::string::npos) << r.status().to_string();
  Graph g2 = conv_net();
  r = try_convert(g2, "int4");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("int4"), std::string::npos) << r.status().to_string();
}

TEST(ConvertPrecision, SessionPassNamesConvertFp16AndBf16) {
  // SessionOptions::passes (and keel_session_options_add_pass) carry names only: convert_bf16 / convert_fp16.
  Graph g = conv_net();
  auto ref = run(g, conv_feeds());
  for (const char* p : {"convert_bf16", "convert_fp16"}) {
    SCOPED_TRACE(p);
    auto got = run(g, conv_feeds(), {p});
    ASSERT_EQ(got.size(), 1u);
    expect_close(got[0], ref[0], 0.999, 3e-2);
  }
}

// Converting to a dtype whose kernels rank below the f32 ones on the device is said (a note and a warning), not
// undone: with the oneDNN plugin, fp16 on the CPU runs on the reference kernels (ResNet-18 at 1 thread: 214 ms
// against 14 in fp32), bf16 on oneDNN's own.
TEST(ConvertPrecision, AConversionOntoSlowerKernelsIsSaid) {
  bool onednn_conv = false;
  for (const KernelEntry* k : env().registry().kernels_for("", "Conv", 13, "cpu"))
    onednn_conv = onednn_conv || k->name == "onednn_f32_conv";
  if (!onednn_conv) GTEST_SKIP() << "no oneDNN Conv kernel (the oneDNN plugin is not built)";
  auto slower_note = [](const PassReport& r) {
    for (const auto& n : r.notes)
      if (n.find("expect this model slower than in fp32") != std::string::npos) return n;
    return std::string();
  };
  Graph g16 = conv_net(), g_bf16 = conv_net();
  const std::string note = slower_note(convert(g16, "fp16"));
  EXPECT_NE(note.find("fp16 on cpu runs"), std::string::npos) << note;
  EXPECT_NE(note.find("Conv x3"), std::string::npos) << note;
  EXPECT_EQ(slower_note(convert(g_bf16, "bf16")), "");
  EXPECT_EQ(nodes_of(g16, "Conv").size(), 3u);
  for (const Node* c : nodes_of(g16, "Conv")) EXPECT_EQ(dtype_of(g16, c->inputs[1]), DType::kF16) << "not undone";
}

TEST(ConvertPrecision, FusedConvGraphInBf16MatchesFp32) {
  // What `--precision bf16` runs for ResNets: BN folded, Conv+bias+residual+Relu fused, then converted.
  Graph g = conv_net();
  auto ref = run(g, conv_feeds());
  ASSERT_TRUE(infer_shapes(g).is_ok());
  {
    keel_graph_s view;
    view.graph = &g;
    view.env = &env();
    auto r = PassManager(env().registry(), graph_api())
                 .run(g, &view, parse_pipeline_list("fuse_conv_bn,fuse_conv_activation:dtype=bf16").value(), "cpu");
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  }
  size_t fused = 0;
  for (NodeId id : g.node_ids()) fused += g.node(id)->op_type == "FusedConv";
  ASSERT_GE(fused, 2u);
  bool onednn_bf16 = false;
  for (const KernelEntry* k : env().registry().kernels_for("keel", "FusedConv", 1, "cpu"))
    onednn_bf16 = onednn_bf16 || k->name == "onednn_bf16_keel_fusedconv";
  if (!onednn_bf16) GTEST_SKIP() << "no bf16 keel.FusedConv kernel (the oneDNN plugin is not built)";
  EXPECT_GT(counter(convert(g, "bf16"), "nodes_converted"), 0);
  expect_clean_boundaries(g);
  for (NodeId id : g.node_ids()) {
    if (g.node(id)->op_type == "FusedConv") {
      EXPECT_EQ(dtype_of(g, g.node(id)->inputs[0]), DType::kBF16);
    }
  }
  SessionOptions o;
  o.devices = {"cpu"};
  auto s = Session::create(env(), g, o);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  size_t on_onednn = 0;
  for (const auto& [node, op, dev, kernel] : s.value()->placement())
    on_onednn += kernel == "onednn_bf16_keel_fusedconv";
  EXPECT_EQ(on_onednn, fused);
  auto got = s.value()->run(conv_feeds());
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  expect_close(got.value()[0], ref[0], 0.999, 3e-2);
}

// Runs `g` on the CPU with profiling, checks its output against `ref` within bf16's error, and returns the kinds of
// the oneDNN chain steps that compute each of `names` (a name without a step of its own maps to none); nullopt when
// no chain reported steps (the oneDNN plugin is not built) or the run failed (reported).
std::optional<std::map<std::string, std::vector<std::string>>> chain_steps_of(const Graph& g, const Feeds& feeds,
                                                                              const Tensor& ref,
                                                                              const std::set<std::string>& names) {
  SessionOptions o;
  o.devices = {"cpu"};
  o.profile = true;
  auto s = Session::create(env(), g, o);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  if (!s.is_ok()) return std::nullopt;
  auto got = s.value()->run(feeds);
  EXPECT_TRUE(got.is_ok()) << got.status().to_string();
  if (!got.is_ok()) return std::nullopt;
  expect_close(got.value()[0], ref, 0.999, 3e-2);
  std::map<std::string, std::vector<std::string>> kinds;
  for (const auto& n : names) kinds[n];
  bool chain = false;
  for (const auto& p : s.value()->profile()) {
    if (p.op_type != "Subgraph" || p.steps.empty()) continue;
    chain = true;
    for (const auto& st : p.steps)
      for (const auto& n : st.nodes)
        if (names.count(n)) kinds[n].push_back(st.kind);
  }
  if (!chain) return std::nullopt;
  return kinds;
}

// SqueezeNet's fire module and a DenseNet-like pair of concatenations (batch 1, 16-aligned channels) in bf16: the
// convolutions write their outputs into their slices of the concatenation (as in f32), so no Concat has a step of its
// own. (In bf16 they were oneDNN's generic concat: SqueezeNet 1.1's two at 55x55 took 0.49-0.56 ms each, the model
// 4.35 ms against 3.76 in f32; and from 27x27 on, its 3x3 expands over 32+ channels wrote nhwc, reordered into a plain
// Concat: 2.31 ms, now 1.88.)
TEST(ConvertPrecision, Bf16ConcatenationsAreWrittenInPlace) {
  GraphBuilder b("fire", 13);
  auto x = b.input("x", DType::kF32, {1, 32, 20, 20});
  auto conv = [&](const std::string& in, int64_t cin, int64_t cout, int64_t k, uint32_t seed) {
    const int64_t pad = k / 2;
    return b.op1(
        "Relu",
        {b.op1("Conv",
               {in, b.constant("w" + std::to_string(seed), randn({cout, cin, k, k}, seed, 0.2f)),
                b.constant("b" + std::to_string(seed), randn({cout}, seed + 100, 0.1f))},
               {{"kernel_shape", Attribute::of_ints({k, k})}, {"pads", Attribute::of_ints({pad, pad, pad, pad})}})});
  };
  auto sq = conv(x, 32, 32, 1, 1);  // 32 channels into the 3x3: where an f32 3x3 outside Winograd takes nhwc
  auto fire = b.op1("Concat", {conv(sq, 32, 32, 1, 2), conv(sq, 32, 32, 3, 3)}, {{"axis", Attribute::of_int(1)}});
  auto x0 = conv(fire, 64, 32, 1, 7);
  auto f1 = conv(x0, 32, 16, 3, 4);
  auto c1 = b.op1("Concat", {x0, f1}, {{"axis", Attribute::of_int(1)}});
  auto f2 = conv(c1, 48, 16, 3, 5);
  auto c2 = b.op1("Concat", {x0, f1, f2}, {{"axis", Attribute::of_int(1)}});
  b.output(conv(c2, 64, 16, 1, 6));
  Graph g = b.take();
  const Feeds feeds{{"x", randn({1, 32, 20, 20}, 77)}};
  auto ref = run(g, feeds);
  ASSERT_EQ(ref.size(), 1u);
  convert(g, "bf16");
  std::set<std::string> concats;
  for (const Node* c : nodes_of(g, "Concat")) {
    EXPECT_EQ(dtype_of(g, c->outputs[0]), DType::kBF16);
    concats.insert(c->name);
  }
  ASSERT_EQ(concats.size(), 3u);
  const auto kinds = chain_steps_of(g, feeds, ref[0], concats);
  if (!kinds) GTEST_SKIP() << "no oneDNN chain reported its steps (the oneDNN plugin is not built)";
  for (const auto& [name, ks] : *kinds)
    EXPECT_TRUE(ks.empty()) << "a step of its own (" << ks.front() << ") for " << name;
}

// A bf16 product cast back to f32 for a residual Add (what the pass leaves around a transformer's keep-listed norms):
// the matmul writes f32 and the Add is its sum post-op, with the graph's input as the residual (copied into the
// destination in f32: copied in the node's bf16, the sum read garbage). No step of its own for the Cast or the Add.
TEST(ConvertPrecision, Bf16ProductCastForAResidualAddIsOneMatmul) {
  GraphBuilder b("residual", 17);
  auto x = b.input("x", DType::kF32, {1, 8, 32});
  auto h = b.op1("Relu", {b.op1("MatMul", {x, b.constant("w1", randn({32, 32}, 21, 0.2f))})});
  auto o = b.op1("MatMul", {h, b.constant("w2", randn({32, 32}, 22, 0.2f))});
  auto y = b.op1("Add", {o, x});
  b.output(b.op1("LayerNormalization",
                 {y, b.constant("g", Tensor::f32({32}, std::vector<float>(32, 1.f))),
                  b.constant("bt", Tensor::f32({32}, std::vector<float>(32, 0.f)))},
                 {{"axis", Attribute::of_int(-1)}}));
  Graph g = b.take();
  const Feeds feeds{{"x", randn({1, 8, 32}, 23)}};
  auto ref = run(g, feeds);
  ASSERT_EQ(ref.size(), 1u);
  convert(g, "bf16");
  std::set<std::string> apart;  // the residual Add
  for (const Node* n : nodes_of(g, "Add")) apart.insert(n->name);
  ASSERT_EQ(apart.size(), 1u);
  const auto kinds = chain_steps_of(g, feeds, ref[0], apart);
  if (!kinds) GTEST_SKIP() << "no oneDNN chain reported its steps (the oneDNN plugin is not built)";
  const std::vector<std::string>& ks = kinds->begin()->second;
  EXPECT_EQ(std::count(ks.begin(), ks.end(), "binary"), 0) << "the Add in a step of its own";
  EXPECT_NE(std::find(ks.begin(), ks.end(), "matmul"), ks.end()) << "the Add is not the product's sum post-op";
}

// ------------------------------------------------------------------------------------------------ the CLI

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

int keel_cli(const std::string& args, const std::filesystem::path& log) {
  std::string cmd = std::string(KEEL_CLI_BINARY) + " --plugin-path " + KEEL_PASSES_PLUGIN_DIR_DEFAULT + " " + args +
                    " > " + log.string() + " 2>&1";
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(ConvertPrecisionCli, RunBenchAndOptimizeWithPrecision) {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / ("keel_precision_cli_" + std::to_string(::getpid()));
  fs::create_directories(d);
  Graph g = conv_net();
  ASSERT_TRUE(save_onnx(g, d / "model.onnx").is_ok());
  ASSERT_TRUE(write_tensor_pb(conv_feeds()[0].second, d / "x.pb", "x").is_ok());
  // keel run --precision: fp32 (unchanged), bf16, fp16; outputs written and compared.
  std::map<std::string, Tensor> outs;
  for (const char* p : {"fp32", "bf16", "fp16"}) {
    fs::path od = d / p;
    int rc = keel_cli("run " + (d / "model.onnx").string() + " -i x=" + (d / "x.pb").string() + " --precision " + p +
                          " -o " + od.string(),
                      d / "log.txt");
    ASSERT_EQ(rc, 0) << p << ": " << slurp(d / "log.txt");
    auto t = read_tensor_file(od / "output_0.pb");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    outs[p] = std::move(t).value();
  }
  expect_close(outs["bf16"], outs["fp32"], 0.999, 3e-2);
  expect_close(outs["fp16"], outs["fp32"], 0.9999, 5e-3);
  bool differs = false;
  for (int64_t i = 0; i < outs["fp32"].numel(); ++i)
    differs = differs || outs["bf16"].data<float>()[i] != outs["fp32"].data<float>()[i];
  EXPECT_TRUE(differs) << "--precision bf16 must change the computation";
  // keel bench --precision fp16 --json reports it.
  ASSERT_EQ(
      keel_cli("bench " + (d / "model.onnx").string() + " --precision fp16 --json --warmup 0 --iters 2", d / "log.txt"),
      0)
      << slurp(d / "log.txt");
  EXPECT_NE(slurp(d / "log.txt").find("\"precision\": \"fp16\""), std::string::npos) << slurp(d / "log.txt");
  // A precision that does not exist is a usage error (CLI11's validation exit code), naming the choices.
  const int bad = keel_cli("run " + (d / "model.onnx").string() + " --precision int4", d / "log.txt");
  EXPECT_TRUE(bad != 0 && bad != 1 && bad < 128) << bad;
  EXPECT_NE(slurp(d / "log.txt").find("fp16"), std::string::npos) << slurp(d / "log.txt");
  // keel optimize --config: convert_precision with its options from TOML.
  {
    std::ofstream f(d / "pipeline.toml");
    f << "[[pass]]\nname = \"convert_precision\"\n[pass.options]\ndtype = \"bf16\"\nkeep_fp32 = [\"Gemm\"]\n";
  }
  ASSERT_EQ(keel_cli("optimize " + (d / "model.onnx").string() + " -o " + (d / "bf16.onnx").string() + " --config " +
                         (d / "pipeline.toml").string(),
                     d / "log.txt"),
            0)
      << slurp(d / "log.txt");
  const std::string log = slurp(d / "log.txt");
  EXPECT_NE(log.find("nodes_converted"), std::string::npos) << log;
  EXPECT_NE(log.find("keep_fp32 option"), std::string::npos) << log;
  auto saved = load_onnx(d / "bf16.onnx");
  ASSERT_TRUE(saved.is_ok()) << saved.status().to_string();
  for (const Node* c : nodes_of(*saved, "Conv")) EXPECT_EQ(dtype_of(*saved, c->inputs[1]), DType::kBF16);
  for (const Node* c : nodes_of(*saved, "Gemm")) EXPECT_EQ(dtype_of(*saved, c->inputs[1]), DType::kF32);
  fs::remove_all(d);
}

}  // namespace
}  // namespace keel
