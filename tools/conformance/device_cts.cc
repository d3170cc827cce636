// The device conformance suite: the case table and the runner (device_cts.h).
#include "tools/conformance/device_cts.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <latch>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "core/runtime/pipelines.h"
#include "core/runtime/session.h"
#include "tools/conformance/case_builders.h"

namespace keel::cts {
namespace {

InputSpec absent() { return InputSpec{}; }

std::string fmt_float(float f) {
  std::ostringstream os;
  os << f;
  return os.str();
}

std::string shape_label(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

void add_conv_cases(std::vector<OpCase>& v) {
  // 2-D: N C H W K k s p g d, around the 8/16-channel blocks of AVX2/AVX-512 and odd spatial sizes.
  struct P {
    int64_t N, C, H, W, K, k, s, p, g, d;
  };
  const P ps[] = {
      {1, 3, 7, 9, 5, 3, 2, 1, 1, 1},
      {1, 1, 5, 5, 1, 1, 1, 0, 1, 1},
      {1, 3, 32, 32, 16, 3, 1, 1, 1, 1},
      {2, 16, 14, 14, 16, 3, 1, 1, 1, 1},
      {1, 17, 9, 11, 33, 3, 1, 1, 1, 1},
      {1, 32, 8, 8, 64, 1, 1, 0, 1, 1},
      {1, 64, 14, 14, 64, 3, 1, 1, 1, 1},
      {1, 64, 15, 15, 128, 3, 2, 1, 1, 1},
      {1, 64, 16, 16, 128, 1, 2, 0, 1, 1},
      {1, 3, 33, 31, 24, 7, 2, 3, 1, 1},
      {1, 8, 10, 10, 8, 5, 1, 2, 1, 1},
      {1, 16, 12, 12, 16, 3, 1, 2, 1, 2},
      {1, 32, 9, 9, 32, 3, 1, 1, 32, 1},
      {2, 24, 10, 10, 24, 3, 2, 1, 24, 1},
      {1, 16, 8, 8, 32, 3, 1, 1, 4, 1},
      {1, 6, 7, 7, 9, 3, 1, 0, 3, 1},
      {3, 5, 6, 4, 7, 2, 1, 0, 1, 1},
      {1, 48, 7, 7, 48, 3, 1, 1, 1, 1},
      {1, 96, 7, 7, 576, 1, 1, 0, 1, 1},
      {1, 144, 14, 14, 144, 3, 1, 1, 144, 1},
      {1, 16, 1, 1, 16, 1, 1, 0, 1, 1},
      {1, 4, 6, 6, 8, 3, 3, 0, 1, 1},
      // One input channel, stride 1, no padding (first layers on MNIST-like images: a plain source, nChw16c output on
      // the CPU device): SimpleCNN's 3x3 -> 32, 13 channels of rows of 36 outputs, a 7x7 to 1x1.
      {2, 1, 28, 28, 32, 3, 1, 0, 1, 1},
      {1, 1, 9, 40, 13, 5, 1, 0, 1, 1},
      {1, 1, 7, 7, 4, 7, 1, 0, 1, 1},
  };
  for (const P& p : ps) {
    for (int bias = 1; bias >= 0; --bias) {
      OpCase c;
      c.op = "Conv";
      std::ostringstream l;
      l << "N=" << p.N << " C=" << p.C << " H=" << p.H << " W=" << p.W << " K=" << p.K << " k=" << p.k << " s=" << p.s
        << " p=" << p.p << " g=" << p.g << " d=" << p.d << (bias ? "" : " nobias");
      c.label = l.str();
      c.inputs = {in("X", {p.N, p.C, p.H, p.W}), in("W", {p.K, p.C / p.g, p.k, p.k}, true)};
      if (bias) c.inputs.push_back(in("B", {p.K}, true));
      c.attrs = {{"kernel_shape", Is({p.k, p.k})},
                 {"strides", Is({p.s, p.s})},
                 {"pads", Is({p.p, p.p, p.p, p.p})},
                 {"group", I(p.g)},
                 {"dilations", Is({p.d, p.d})}};
      v.push_back(c);
    }
  }
  // Asymmetric pads, auto_pad, non-constant weights, 1-D and 3-D.
  auto add = [&](std::string label, std::vector<InputSpec> ins, std::map<std::string, Attribute> attrs) {
    OpCase c;
    c.op = "Conv";
    c.label = std::move(label);
    c.inputs = std::move(ins);
    c.attrs = std::move(attrs);
    v.push_back(c);
  };
  add("N=1 C=8 H=9 W=10 K=8 k=3 pads=0,1,2,1", {in("X", {1, 8, 9, 10}), in("W", {8, 8, 3, 3}, true)},
      {{"pads", Is({0, 1, 2, 1})}});
  for (const char* ap : {"SAME_UPPER", "SAME_LOWER", "VALID"})
    for (int64_t s : {1, 2})
      add(std::string("N=1 C=16 H=11 W=12 K=16 k=4 s=") + std::to_string(s) + " auto_pad=" + ap,
          {in("X", {1, 16, 11, 12}), in("W", {16, 16, 4, 4}, true), in("B", {16}, true)},
          {{"auto_pad", S(ap)}, {"strides", Is({s, s})}});
  add("N=2 C=8 H=6 W=6 K=16 k=3 W-input B-input", {in("X", {2, 8, 6, 6}), in("W", {16, 8, 3, 3}), in("B", {16})},
      {{"pads", Is({1, 1, 1, 1})}});
  add("N=3 C=1 H=12 W=19 K=10 k=3x2 W-input B-input", {in("X", {3, 1, 12, 19}), in("W", {10, 1, 3, 2}), in("B", {10})},
      {});
  // Few input channels (an image model's first layer) with asymmetric pads, auto_pad, a row wider than 32 columns, an
  // output channel count that fills no vector.
  add("N=2 C=3 H=9 W=37 K=11 k=5x3 pads=2,0,1,2 W-input",
      {in("X", {2, 3, 9, 37}), in("W", {11, 3, 5, 3}), in("B", {11}, true)}, {{"pads", Is({2, 0, 1, 2})}});
  add("N=1 C=2 H=8 W=9 K=8 k=4 auto_pad=SAME_LOWER", {in("X", {1, 2, 8, 9}), in("W", {8, 2, 4, 4}, true)},
      {{"auto_pad", S("SAME_LOWER")}});
  add("1d N=2 C=16 L=50 K=32 k=5 s=2 p=2", {in("X", {2, 16, 50}), in("W", {32, 16, 5}, true), in("B", {32}, true)},
      {{"strides", Is({2})}, {"pads", Is({2, 2})}});
  add("1d N=1 C=3 L=17 K=5 k=3 d=2 g=1", {in("X", {1, 3, 17}), in("W", {5, 3, 3}, true)}, {{"dilations", Is({2})}});
  add("3d N=1 C=4 D=5 H=6 W=7 K=8 k=3 p=1",
      {in("X", {1, 4, 5, 6, 7}), in("W", {8, 4, 3, 3, 3}, true), in("B", {8}, true)},
      {{"pads", Is({1, 1, 1, 1, 1, 1})}});
  add("3d N=1 C=16 D=4 H=8 W=8 K=16 k=3 s=2 g=4", {in("X", {1, 16, 4, 8, 8}), in("W", {16, 4, 3, 3, 3}, true)},
      {{"strides", Is({2, 2, 2})}, {"group", I(4)}, {"pads", Is({1, 1, 1, 1, 1, 1})}});
}

void add_conv_transpose_cases(std::vector<OpCase>& v) {
  struct P {
    int64_t N, C, H, W, M, k, s, p, op, g;
  };
  const P ps[] = {{1, 4, 5, 5, 3, 3, 1, 0, 0, 1},   {1, 16, 7, 7, 8, 3, 2, 1, 1, 1},  {2, 8, 4, 6, 16, 4, 2, 1, 0, 1},
                  {1, 16, 6, 6, 16, 3, 2, 1, 1, 4}, {1, 32, 8, 8, 32, 2, 2, 0, 0, 1}, {1, 3, 9, 9, 5, 5, 3, 2, 0, 1}};
  for (const P& p : ps) {
    OpCase c;
    c.op = "ConvTranspose";
    std::ostringstream l;
    l << "N=" << p.N << " C=" << p.C << " H=" << p.H << " W=" << p.W << " M=" << p.M << " k=" << p.k << " s=" << p.s
      << " p=" << p.p << " op=" << p.op << " g=" << p.g;
    c.label = l.str();
    c.inputs = {in("X", {p.N, p.C, p.H, p.W}), in("W", {p.C, p.M / p.g, p.k, p.k}, true), in("B", {p.M}, true)};
    c.attrs = {{"strides", Is({p.s, p.s})},
               {"pads", Is({p.p, p.p, p.p, p.p})},
               {"group", I(p.g)},
               {"output_padding", Is({p.op, p.op})}};
    v.push_back(c);
  }
  OpCase c;
  c.op = "ConvTranspose";
  c.label = "1d N=1 C=8 L=9 M=4 k=3 s=2";
  c.inputs = {in("X", {1, 8, 9}), in("W", {8, 4, 3}, true)};
  c.attrs = {{"strides", Is({2})}};
  v.push_back(c);
}

void add_matmul_cases(std::vector<OpCase>& v) {
  struct P {
    Shape a, b;
    bool b_const;
  };
  const P ps[] = {
      {{1, 1}, {1, 1}, false},
      {{7, 13}, {13, 5}, false},
      {{16, 16}, {16, 16}, true},
      {{17, 33}, {33, 65}, true},
      {{64, 256}, {256, 64}, true},
      {{1, 512}, {512, 1000}, true},
      {{2, 3, 5, 7}, {2, 3, 7, 4}, false},
      {{4, 8, 16}, {16, 9}, true},
      // Rows of a batch times one matrix (computed as one 2-D product): a B input, a B with a leading 1, a 1-D B.
      {{2, 3, 5, 7}, {7, 4}, false},
      {{2, 3, 5, 7}, {1, 7, 4}, true},
      {{3, 4, 6}, {6}, false},
      {{4, 1, 5, 6}, {3, 6, 2}, false},
      {{1, 5, 6}, {4, 6, 3}, false},
      {{9}, {9, 4}, false},
      {{3, 9}, {9}, false},
      {{9}, {9}, false},
      {{2, 128, 64}, {2, 64, 128}, false},
      {{128, 256}, {256, 256}, true},
  };
  for (const P& p : ps) {
    OpCase c;
    c.op = "MatMul";
    c.label = "A=" + shape_label(p.a) + " B=" + shape_label(p.b) + (p.b_const ? " B-const" : "");
    c.inputs = {in("A", p.a), in("B", p.b, p.b_const)};
    v.push_back(c);
  }
  struct G {
    int64_t M, K, N;
    int ta, tb;
    float alpha, beta;
    Shape cshape;
    bool c_const;
  };
  const G gs[] = {
      {1, 1, 1, 0, 0, 1.f, 1.f, {1}, true},      {5, 7, 3, 0, 0, 1.f, 1.f, {3}, true},
      {5, 7, 3, 1, 0, 1.f, 1.f, {5, 3}, true},   {5, 7, 3, 0, 1, 1.f, 1.f, {1, 3}, true},
      {5, 7, 3, 1, 1, 0.5f, 2.f, {5, 3}, true},  {1, 512, 1000, 0, 1, 1.f, 1.f, {1000}, true},
      {32, 256, 10, 0, 1, 1.f, 1.f, {10}, true}, {16, 17, 33, 0, 0, 2.f, 0.f, {33}, true},
      {8, 16, 4, 0, 0, 1.f, 1.f, {}, false},     {6, 9, 4, 0, 1, 1.f, 1.f, {6, 4}, false},
      {6, 9, 4, 0, 0, 1.f, 1.f, {6, 1}, true},   {6, 9, 4, 0, 0, 1.5f, 1.5f, {4}, false},
  };
  for (const G& g : gs) {
    OpCase c;
    c.op = "Gemm";
    std::ostringstream l;
    l << "M=" << g.M << " K=" << g.K << " N=" << g.N << " transA=" << g.ta << " transB=" << g.tb << " alpha=" << g.alpha
      << " beta=" << g.beta << " C=" << (g.cshape.empty() ? "none" : shape_label(g.cshape))
      << (g.c_const ? "" : " C-input");
    c.label = l.str();
    c.inputs = {in("A", g.ta ? Shape{g.K, g.M} : Shape{g.M, g.K}),
                in("B", g.tb ? Shape{g.N, g.K} : Shape{g.K, g.N}, true)};
    if (!g.cshape.empty()) c.inputs.push_back(in("C", g.cshape, g.c_const));
    c.attrs = {{"transA", I(g.ta)}, {"transB", I(g.tb)}, {"alpha", F(g.alpha)}, {"beta", F(g.beta)}};
    v.push_back(c);
  }
  // A linear layer's forward with few outputs and its weights an input (eager training; the oneDNN device runs these
  // on its few-column product, steps/narrow_gemm.h): C an input as a bias, and C constant at [1, N] with beta.
  for (int t = 0; t < 2; ++t) {
    const int64_t M = t ? 9 : 7, K = t ? 512 : 320, N = t ? 16 : 12;
    OpCase c;
    c.op = "Gemm";
    c.label = "narrow M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
              " transB=1 B-input" + (t ? " C=[1," + std::to_string(N) + "] beta=0.5" : " C-input");
    c.inputs = {in("A", Shape{M, K}), in("B", Shape{N, K}), in("C", t ? Shape{1, N} : Shape{N}, t == 1)};
    c.attrs = {{"transB", I(1)}, {"beta", F(t ? 0.5f : 1.f)}};
    v.push_back(c);
  }
  // A wide output over a shallow inner dimension with B an input, no C (eager training's Linear backward over
  // 9216 features; the oneDNN device runs these on sgemm): every transpose, alpha != 1.
  for (int t = 0; t < 4; ++t) {
    const int64_t M = 3, K = 5, N = 8200;
    const int ta = t & 1, tb = t >> 1;
    OpCase c;
    c.op = "Gemm";
    c.label = "wide M=3 K=5 N=8200 transA=" + std::to_string(ta) + " transB=" + std::to_string(tb) + " B-input";
    c.inputs = {in("A", ta ? Shape{K, M} : Shape{M, K}), in("B", tb ? Shape{N, K} : Shape{K, N})};
    c.attrs = {{"transA", I(ta)}, {"transB", I(tb)}, {"alpha", F(t == 3 ? 0.5f : 1.f)}};
    v.push_back(c);
  }
}

void add_pool_cases(std::vector<OpCase>& v) {
  struct P {
    Shape x;
    int64_t k, s, p;
    int ceil, include_pad;
  };
  const P ps[] = {{{1, 3, 7, 7}, 2, 2, 0, 0, 0},
                  {{1, 16, 14, 14}, 3, 2, 1, 0, 0},
                  {{2, 64, 112, 112}, 3, 2, 1, 0, 0},
                  {{1, 8, 9, 11}, 3, 1, 1, 0, 1},
                  {{1, 17, 10, 10}, 3, 2, 0, 1, 0},
                  {{1, 4, 5, 5}, 5, 1, 2, 0, 0},
                  {{3, 5, 8, 6}, 2, 1, 0, 0, 0},
                  {{1, 32, 13, 13}, 3, 2, 0, 1, 0},
                  // 2x2 / stride 2 (the CPU device's own max-pooling path): rows of 37 windows (two blocks of 16 and
                  // a tail of 5) over an odd height and width, and SimpleCNN's activation
                  {{2, 5, 9, 75}, 2, 2, 0, 0, 0},
                  {{4, 32, 26, 26}, 2, 2, 0, 0, 0}};
  for (const char* op : {"MaxPool", "AveragePool"}) {
    for (const P& p : ps) {
      OpCase c;
      c.op = op;
      std::ostringstream l;
      l << "X=" << shape_label(p.x) << " k=" << p.k << " s=" << p.s << " p=" << p.p << " ceil=" << p.ceil;
      if (c.op == "AveragePool") l << " count_include_pad=" << p.include_pad;
      c.label = l.str();
      c.inputs = {in("X", p.x)};
      c.attrs = {{"kernel_shape", Is({p.k, p.k})},
                 {"strides", Is({p.s, p.s})},
                 {"pads", Is({p.p, p.p, p.p, p.p})},
                 {"ceil_mode", I(p.ceil)}};
      if (c.op == "AveragePool") c.attrs["count_include_pad"] = I(p.include_pad);
      v.push_back(c);
    }
  }
  {
    OpCase c;
    c.op = "MaxPool";
    c.label = "X=[1,8,12,12] k=3 s=1 d=2";
    c.inputs = {in("X", {1, 8, 12, 12})};
    c.attrs = {{"kernel_shape", Is({3, 3})}, {"dilations", Is({2, 2})}};
    v.push_back(c);
    c.label = "X=[1,8,11,12] k=3 s=2 auto_pad=SAME_UPPER";
    c.attrs = {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"auto_pad", S("SAME_UPPER")}};
    v.push_back(c);
    c.label = "1d X=[2,4,15] k=3 s=2";
    c.inputs = {in("X", {2, 4, 15})};
    c.attrs = {{"kernel_shape", Is({3})}, {"strides", Is({2})}};
    v.push_back(c);
    c.op = "AveragePool";
    c.label = "3d X=[1,4,6,7,8] k=2 s=2";
    c.inputs = {in("X", {1, 4, 6, 7, 8})};
    c.attrs = {{"kernel_shape", Is({2, 2, 2})}, {"strides", Is({2, 2, 2})}};
    v.push_back(c);
  }
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
    for (Shape x :
         {Shape{1, 512, 7, 7}, Shape{2, 17, 5, 3}, Shape{1, 3, 1, 1}, Shape{2, 16, 9}, Shape{1, 8, 3, 4, 5}}) {
      OpCase c;
      c.op = op;
      c.label = "X=" + shape_label(x);
      c.inputs = {in("X", x)};
      v.push_back(c);
    }
  }
}

void add_norm_cases(std::vector<OpCase>& v) {
  for (Shape x : {Shape{1, 16, 7, 7}, Shape{2, 3, 5, 9}, Shape{4, 17}, Shape{2, 32, 8}, Shape{1, 8, 3, 4, 5}}) {
    for (bool cst : {true, false}) {
      OpCase c;
      c.op = "BatchNormalization";
      c.opset = 15;
      c.label = "X=" + shape_label(x) + (cst ? "" : " params-input");
      const int64_t C = x[1];
      c.inputs = {in("X", x), in("scale", {C}, cst), in("B", {C}, cst), in("mean", {C}, cst),
                  in("var", {C}, cst, 0.1f, 2.f)};
      c.attrs = {{"epsilon", F(1e-3f)}};
      v.push_back(c);
    }
  }
  for (Shape x : {Shape{2, 5, 16}, Shape{1, 128, 256}, Shape{3, 7}, Shape{2, 3, 4, 33}}) {
    for (bool bias : {true, false}) {
      OpCase c;
      c.op = "LayerNormalization";
      c.label = "X=" + shape_label(x) + " axis=-1" + (bias ? "" : " nobias");
      c.inputs = {in("X", x, false, -3.f, 3.f), in("Scale", {x.back()}, true)};
      if (bias) c.inputs.push_back(in("B", {x.back()}, true));
      c.attrs = {{"axis", I(-1)}, {"epsilon", F(1e-5f)}};
      v.push_back(c);
    }
  }
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    struct P {
      Shape x;
      int64_t axis;
      int opset;
    };
    const P ps[] = {{{2, 10}, -1, 13},  {{4, 8, 128}, -1, 13}, {{2, 3, 4, 5}, 1, 13}, {{3, 17, 6}, 0, 13},
                    {{2, 3, 4}, 1, 11}, {{1, 1000}, 1, 11},    {{5, 33}, -1, 13}};
    for (const P& p : ps) {
      OpCase c;
      c.op = op;
      c.opset = p.opset;
      c.label = "X=" + shape_label(p.x) + " axis=" + std::to_string(p.axis) + " opset=" + std::to_string(p.opset);
      c.inputs = {in("X", p.x, false, -5.f, 5.f)};
      c.attrs = {{"axis", I(p.axis)}};
      v.push_back(c);
    }
  }
}

void add_elementwise_cases(std::vector<OpCase>& v) {
  struct U {
    const char* op;
    float lo, hi;
    std::map<std::string, Attribute> attrs;
  };
  const U us[] = {{"Relu", -2, 2, {}},
                  {"LeakyRelu", -2, 2, {{"alpha", F(0.1f)}}},
                  {"Elu", -2, 2, {{"alpha", F(0.7f)}}},
                  {"Sigmoid", -6, 6, {}},
                  {"Tanh", -4, 4, {}},
                  {"Exp", -3, 3, {}},
                  {"Log", 0.01f, 10, {}},
                  {"Sqrt", 0, 10, {}},
                  {"Abs", -3, 3, {}},
                  {"Neg", -3, 3, {}},
                  {"HardSwish", -5, 5, {}},
                  {"Round", -5, 5, {}}};
  for (const U& u : us) {
    for (Shape x : {Shape{1}, Shape{17}, Shape{2, 3, 5, 7}, Shape{1, 64, 56, 56}}) {
      OpCase c;
      c.op = u.op;
      c.label = "X=" + shape_label(x);
      c.inputs = {in("X", x, false, u.lo, u.hi)};
      c.attrs = u.attrs;
      v.push_back(c);
    }
  }
  // Where: a bool condition (random 0/1) selecting between X and Y, each of the three broadcast against the others.
  {
    struct W {
      Shape cond, x, y;
    };
    const W ws[] = {
        {{17}, {17}, {17}},          {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}}, {{2, 1, 4}, {3, 1}, {1}},
        {{4}, {2, 3, 4}, {2, 3, 1}}, {{1, 8, 1, 1}, {2, 8, 5, 5}, {}},  {{2, 64, 28, 28}, {2, 64, 28, 28}, {64, 1, 1}}};
    for (const W& w : ws) {
      OpCase c;
      c.op = "Where";
      c.opset = 16;
      c.label = "C=" + shape_label(w.cond) + " X=" + shape_label(w.x) + " Y=" + shape_label(w.y);
      InputSpec cond = in("C", w.cond, false, 0, 1);
      cond.dtype = DType::kBool;
      c.inputs = {cond, in("X", w.x, false, -3, 3), in("Y", w.y, false, -3, 3)};
      v.push_back(c);
    }
  }
  for (int mode = 0; mode < 4; ++mode) {
    OpCase c;
    c.op = "Clip";
    c.opset = 13;
    InputSpec lo = in("min", {}, true), hi = in("max", {}, true);
    lo.values = {-0.5f};
    hi.values = {0.7f};
    c.inputs = {in("X", {2, 16, 9, 9}, false, -2, 2)};
    if (mode == 0) c.label = "X=[2,16,9,9] min=-0.5 max=0.7", c.inputs.push_back(lo), c.inputs.push_back(hi);
    if (mode == 1) c.label = "X=[2,16,9,9] min=-0.5", c.inputs.push_back(lo);
    if (mode == 2) c.label = "X=[2,16,9,9] max=0.7", c.inputs.push_back(absent()), c.inputs.push_back(hi);
    if (mode == 3)
      c.label = "X=[2,16,9,9] relu6", lo.values = {0.f}, hi.values = {6.f}, c.inputs.push_back(lo),
      c.inputs.push_back(hi), c.inputs[0].lo = -8, c.inputs[0].hi = 8;
    v.push_back(c);
  }
  struct B {
    Shape a, b;
  };
  const B bs[] = {{{1}, {1}},
                  {{17}, {17}},
                  {{2, 3, 4}, {2, 3, 4}},
                  {{2, 3, 4}, {4}},
                  {{2, 3, 4}, {3, 1}},
                  {{1, 64, 56, 56}, {1, 64, 56, 56}},
                  {{2, 16, 5, 5}, {1, 16, 1, 1}},
                  {{4, 5}, {}},
                  {{3, 1, 5}, {1, 4, 5}},
                  {{5}, {2, 3, 5}},
                  {{1, 8, 128, 128}, {1, 1, 1, 128}}};
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Max", "Min"}) {
    for (const B& b : bs) {
      OpCase c;
      c.op = op;
      c.label = "A=" + shape_label(b.a) + " B=" + shape_label(b.b);
      bool div = c.op == "Div";
      c.inputs = {in("A", b.a), in("B", b.b, false, div ? 0.5f : -1.f, div ? 2.f : 1.f)};
      v.push_back(c);
    }
  }
  struct C {
    std::vector<Shape> xs;
    int64_t axis;
  };
  const C cs[] = {{{{2, 3}, {2, 5}}, 1},
                  {{{1, 16, 7, 7}, {1, 32, 7, 7}, {1, 3, 7, 7}}, 1},
                  {{{2, 4, 5}, {3, 4, 5}}, 0},
                  {{{2, 4, 5}, {2, 4, 1}, {2, 4, 7}}, -1},
                  {{{1, 64, 13, 13}, {1, 64, 13, 13}}, 1},
                  {{{7}}, 0}};
  for (const C& cc : cs) {
    OpCase c;
    c.op = "Concat";
    c.label = "axis=" + std::to_string(cc.axis);
    for (size_t i = 0; i < cc.xs.size(); ++i) {
      c.label += " " + shape_label(cc.xs[i]);
      c.inputs.push_back(in("X" + std::to_string(i), cc.xs[i]));
    }
    c.attrs = {{"axis", I(cc.axis)}};
    v.push_back(c);
  }
}

void add_layout_cases(std::vector<OpCase>& v) {
  struct T {
    Shape x;
    std::vector<int64_t> perm;
  };
  const T ts[] = {{{2, 3}, {1, 0}},
                  {{2, 3, 4}, {}},
                  {{1, 128, 4, 64}, {0, 2, 1, 3}},
                  {{2, 4, 16, 8}, {0, 1, 3, 2}},
                  {{3, 5, 7, 2}, {3, 0, 2, 1}},
                  {{17, 33}, {1, 0}}};
  for (const T& t : ts) {
    OpCase c;
    c.op = "Transpose";
    c.label = "X=" + shape_label(t.x) + " perm=" + (t.perm.empty() ? std::string("default") : shape_label(t.perm));
    c.inputs = {in("X", t.x)};
    if (!t.perm.empty()) c.attrs = {{"perm", Is(t.perm)}};
    v.push_back(c);
  }
  struct R {
    Shape x;
    std::vector<int64_t> axes;
    int keep;
  };
  const R rs[] = {{{2, 128, 256}, {-1}, 1},
                  {{2, 3, 4, 5}, {1}, 0},
                  {{4, 17}, {}, 1},
                  {{2, 16, 7, 7}, {2, 3}, 1},
                  {{3, 5, 6}, {0, 2}, 0}};
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"}) {
    for (const R& r : rs) {
      OpCase c;
      c.op = op;
      c.opset = 13;
      c.label = "X=" + shape_label(r.x) + " axes=" + shape_label(r.axes) + " keepdims=" + std::to_string(r.keep);
      c.inputs = {in("X", r.x)};
      c.attrs = {{"keepdims", I(r.keep)}};
      if (c.op == "ReduceSum") {
        if (!r.axes.empty()) {
          Tensor axes = Tensor::host(DType::kI64, {static_cast<int64_t>(r.axes.size())}).value();
          std::copy(r.axes.begin(), r.axes.end(), axes.data<int64_t>());
          c.int64_constants.emplace_back(1, axes);
          c.inputs.push_back(in("axes", {static_cast<int64_t>(r.axes.size())}, true));
        }
      } else if (!r.axes.empty()) {
        c.attrs["axes"] = Is(r.axes);
      }
      v.push_back(c);
    }
  }
  for (float e : {2.f, 0.5f, 3.f}) {
    OpCase c;
    c.op = "Pow";
    c.label = "X=[2,64,128] y=" + fmt_float(e);
    InputSpec y = in("Y", {}, true);
    y.values = {e};
    c.inputs = {in("X", {2, 64, 128}, false, 0.1f, 3.f), y};
    v.push_back(c);
  }
}

// The CUDA plugin's own kernels beyond the element-wise ones: every reduction, ArgMax/ArgMin (with ties),
// (ONNX Gelu, opset 20, is not here: the ONNX library this builds with predates it, so its output has no type.)
// LayerNormalization's extra outputs, Gather (negative and runtime indices), Slice, Expand, Pad, Split, Resize,
// Clip, the reshaping ops, and f16/bf16 variants of the common ones (tolerances for 8/11-bit mantissas).
InputSpec ints(const std::string& name, std::vector<float> values, DType dt = DType::kI64) {
  InputSpec s = in(name, {static_cast<int64_t>(values.size())}, true);
  s.dtype = dt;
  s.values = std::move(values);
  return s;
}
InputSpec scalar(const std::string& name, float v) {
  InputSpec s = in(name, {}, true);
  s.values = {v};
  return s;
}

void add_tensor_op_cases(std::vector<OpCase>& v) {
  struct R {
    Shape x;
    std::vector<float> axes;
    int keep;
  };
  const R rs[] = {
      {{2, 3, 4, 5}, {1}, 0}, {{4, 17}, {}, 1}, {{2, 96, 200}, {-1}, 1}, {{3, 5, 6}, {0, 2}, 0}, {{64, 40}, {0}, 1}};
  struct Op {
    const char* op;
    float lo, hi;
  };
  const Op ops[] = {{"ReduceSum", -1, 1},      {"ReduceMean", -1, 1},        {"ReduceMax", -1, 1},
                    {"ReduceMin", -1, 1},      {"ReduceProd", 0.97f, 1.03f}, {"ReduceSumSquare", -1, 1},
                    {"ReduceL1", -1, 1},       {"ReduceL2", -1, 1},          {"ReduceLogSum", 0.1f, 2},
                    {"ReduceLogSumExp", -3, 3}};
  for (const Op& o : ops) {
    for (const R& r : rs) {
      for (int opset : {13, 18}) {
        if (opset == 13 && std::string(o.op) != "ReduceSum" && r.x.size() != 4 && r.x.size() != 2) continue;
        OpCase c;
        c.op = o.op;
        c.opset = opset;
        c.label = "X=" + shape_label(r.x) + " axes=" + shape_label(Shape(r.axes.begin(), r.axes.end())) +
                  " keepdims=" + std::to_string(r.keep) + " opset=" + std::to_string(opset);
        c.inputs = {in("X", r.x, false, o.lo, o.hi)};
        c.attrs = {{"keepdims", I(r.keep)}};
        const bool axes_input = opset >= 18 || c.op == "ReduceSum";
        if (!r.axes.empty()) {
          if (axes_input) c.inputs.push_back(ints("axes", r.axes));
          else c.attrs["axes"] = Is(std::vector<int64_t>(r.axes.begin(), r.axes.end()));
        }
        v.push_back(c);
      }
    }
  }
  // Few long reductions (a device may split each across many workers, as the CUDA plugin does below 132 outputs of
  // 8,192 elements or more): everything into one value, four channel statistics, three columns of a tall matrix.
  for (const Op& o : ops) {
    for (const R& r : {R{{128, 96, 12}, {}, 0}, R{{4, 64, 24, 24}, {1, 2, 3}, 1}, R{{20000, 3}, {0}, 0}}) {
      if (std::string(o.op) == "ReduceProd" && r.x[0] != 20000)
        continue;  // a product of 10^5 terms under- or overflows
      OpCase c;
      c.op = o.op;
      c.opset = 18;
      c.label = "long X=" + shape_label(r.x) + " axes=" + shape_label(Shape(r.axes.begin(), r.axes.end())) +
                " keepdims=" + std::to_string(r.keep);
      const bool prod = std::string(o.op) == "ReduceProd";  // factors near 1: the product stays near 1
      c.inputs = {in("X", r.x, false, prod ? 0.9999f : o.lo, prod ? 1.0001f : o.hi)};
      c.attrs = {{"keepdims", I(r.keep)}};
      if (!r.axes.empty()) c.inputs.push_back(ints("axes", r.axes));
      v.push_back(c);
    }
  }
  {
    OpCase c;
    c.op = "ReduceSum";
    c.opset = 18;
    c.label = "X=[3,4] no axes noop_with_empty_axes=1";
    c.inputs = {in("X", {3, 4})};
    c.attrs = {{"noop_with_empty_axes", I(1)}};
    v.push_back(c);
  }
  for (const char* op : {"ArgMax", "ArgMin"}) {
    struct A {
      Shape x;
      int64_t axis;
      int keep, last;
      bool ties;
    };
    const A as[] = {{{3, 17}, 1, 1, 0, false}, {{2, 5, 7}, 0, 0, 0, false}, {{4, 1000}, -1, 1, 0, false},
                    {{6, 9}, 1, 1, 0, true},   {{6, 9}, 1, 0, 1, true},     {{5, 3, 40}, 2, 1, 1, true}};
    for (const A& a : as) {
      OpCase c;
      c.op = op;
      c.opset = 13;
      c.label = "X=" + shape_label(a.x) + " axis=" + std::to_string(a.axis) + " keepdims=" + std::to_string(a.keep) +
                " select_last_index=" + std::to_string(a.last) + (a.ties ? " ties" : "");
      InputSpec x = in("X", a.x, false, -2, 2);
      if (a.ties) x.values = {0, 1, 2, 1, 2, 0, 2, 1, 0, 2, 1};  // repeating: every row has ties
      c.inputs = {x};
      c.attrs = {{"axis", I(a.axis)}, {"keepdims", I(a.keep)}, {"select_last_index", I(a.last)}};
      c.int_tol = 0;
      v.push_back(c);
    }
  }
  for (size_t out : {1, 2}) {
    OpCase c;
    c.op = "LayerNormalization";
    c.label = std::string("X=[3,5,24] axis=1 output=") + (out == 1 ? "Mean" : "InvStdDev");
    c.inputs = {in("X", {3, 5, 24}, false, -2, 3), in("Scale", {5, 24}, true), in("B", {5, 24}, true)};
    c.attrs = {{"axis", I(1)}, {"epsilon", F(1e-4f)}};
    c.num_outputs = 3;
    c.output = out;
    v.push_back(c);
  }
  {
    struct G {
      Shape x;
      Shape idx;
      int64_t axis;
      DType it;
      bool constant;
      float lo, hi;
    };
    const G gs[] = {{{5, 4, 3}, {2, 2}, 0, DType::kI64, true, -5, 4},
                    {{5, 4, 3}, {3}, 1, DType::kI32, false, -4, 3},
                    {{2, 3, 7}, {4}, -1, DType::kI64, false, -7, 6},
                    {{1000, 64}, {2, 16}, 0, DType::kI64, false, 0, 999},
                    {{6, 8}, {}, 0, DType::kI64, true, -6, 5}};
    for (const G& g : gs) {
      OpCase c;
      c.op = "Gather";
      c.opset = 13;
      c.label = "data=" + shape_label(g.x) + " indices=" + shape_label(g.idx) + " axis=" + std::to_string(g.axis) +
                (g.it == DType::kI32 ? " int32" : " int64") + (g.constant ? " constant" : " input");
      InputSpec idx = in("I", g.idx, g.constant, g.lo, g.hi);
      idx.dtype = g.it;
      c.inputs = {in("X", g.x), idx};
      c.attrs = {{"axis", I(g.axis)}};
      v.push_back(c);
    }
  }
  {
    struct S {
      Shape x;
      std::vector<float> starts, ends, axes, steps;
    };
    const float big = 9.2e18f;  // beyond any dimension: clamped
    const S ss[] = {{{4, 10, 6}, {1, 2}, {3, 9}, {0, 1}, {1, 3}},
                    {{4, 10, 6}, {-1}, {-big}, {1}, {-2}},
                    {{2, 128, 768}, {0, 256}, {big, 512}, {0, -1}, {}},
                    {{5, 7}, {3, 0}, {1, 7}, {}, {-1, 2}},
                    {{3, 4}, {5}, {10}, {0}, {}}};
    for (const S& s : ss) {
      OpCase c;
      c.op = "Slice";
      c.opset = 13;
      auto lbl = [](const std::vector<float>& f) { return shape_label(Shape(f.begin(), f.end())); };
      c.label = "X=" + shape_label(s.x) + " starts=" + lbl(s.starts) + " ends=" + lbl(s.ends) + " axes=" + lbl(s.axes) +
                " steps=" + lbl(s.steps);
      c.inputs = {in("X", s.x), ints("starts", s.starts), ints("ends", s.ends)};
      if (!s.axes.empty() || !s.steps.empty()) c.inputs.push_back(s.axes.empty() ? absent() : ints("axes", s.axes));
      if (!s.steps.empty()) c.inputs.push_back(ints("steps", s.steps));
      v.push_back(c);
    }
  }
  for (auto [x, shape] : std::vector<std::pair<Shape, std::vector<float>>>{
           {{3, 1}, {2, 3, 4}}, {{1, 4}, {3, 1}}, {{2, 1, 5}, {2, 6, 5}}, {{7}, {1}}}) {
    OpCase c;
    c.op = "Expand";
    c.opset = 13;
    c.label = "X=" + shape_label(x) + " shape=" + shape_label(Shape(shape.begin(), shape.end()));
    c.inputs = {in("X", x), ints("shape", shape)};
    v.push_back(c);
  }
  {
    struct P {
      const char* mode;
      Shape x;
      std::vector<float> pads;
    };
    const P ps[] = {{"constant", {1, 3, 5, 6}, {0, 0, 1, 2, 0, 0, 2, 1}},
                    {"reflect", {1, 3, 5, 6}, {0, 0, 2, 3, 0, 0, 4, 1}},
                    {"edge", {1, 3, 5, 6}, {0, 1, 2, 2, 0, 0, 3, 1}},
                    {"constant", {4, 9}, {-1, 2, 1, -3}},
                    {"reflect", {2, 7}, {0, 6, 0, 6}}};
    for (const P& p : ps) {
      OpCase c;
      c.op = "Pad";
      c.opset = 13;
      c.label =
          std::string(p.mode) + " X=" + shape_label(p.x) + " pads=" + shape_label(Shape(p.pads.begin(), p.pads.end()));
      c.inputs = {in("X", p.x), ints("pads", p.pads)};
      if (std::string(p.mode) == "constant") c.inputs.push_back(scalar("value", 0.75f));
      c.attrs = {{"mode", S(p.mode)}};
      v.push_back(c);
    }
  }
  for (size_t out : {0, 1, 2}) {
    OpCase c;
    c.op = "Split";
    c.opset = 13;
    c.label = "X=[2,9,4] axis=1 split=[2,4,3] output=" + std::to_string(out);
    c.inputs = {in("X", {2, 9, 4}), ints("split", {2, 4, 3})};
    c.attrs = {{"axis", I(1)}};
    c.num_outputs = 3;
    c.output = out;
    v.push_back(c);
  }
  {
    struct Z {
      const char* mode;
      const char* coord;
      const char* nearest;
      Shape x;
      std::vector<float> scales, sizes;
    };
    const Z zs[] = {{"nearest", "asymmetric", "floor", {1, 2, 5, 7}, {1, 1, 2, 2}, {}},
                    {"nearest", "half_pixel", "round_prefer_floor", {1, 2, 5, 7}, {1, 1, 2.5f, 1.5f}, {}},
                    {"nearest", "half_pixel", "round_prefer_ceil", {2, 3, 8, 8}, {1, 1, 0.5f, 0.75f}, {}},
                    {"nearest", "align_corners", "ceil", {1, 1, 6, 4}, {}, {1, 1, 11, 9}},
                    {"nearest", "pytorch_half_pixel", "round_prefer_floor", {1, 3, 4}, {1, 1, 3}, {}},
                    {"linear", "half_pixel", "", {1, 2, 5, 7}, {1, 1, 2, 2}, {}},
                    {"linear", "pytorch_half_pixel", "", {2, 3, 9, 6}, {}, {2, 3, 4, 1}},
                    {"linear", "align_corners", "", {1, 4, 7, 7}, {}, {1, 4, 14, 5}},
                    {"linear", "asymmetric", "", {1, 2, 6}, {1, 1, 1.7f}, {}},
                    {"linear", "half_pixel", "", {1, 8, 16, 16}, {1, 1, 0.5f, 0.5f}, {}}};
    for (const Z& z : zs) {
      OpCase c;
      c.op = "Resize";
      c.opset = 13;
      auto lbl = [](const std::vector<float>& f) {
        std::string r = "[";
        for (size_t i = 0; i < f.size(); ++i) r += (i ? "," : "") + fmt_float(f[i]);
        return r + "]";
      };
      c.label = std::string(z.mode) + " " + z.coord + (*z.nearest ? std::string(" ") + z.nearest : "") +
                " X=" + shape_label(z.x) + (z.sizes.empty() ? " scales=" + lbl(z.scales) : " sizes=" + lbl(z.sizes));
      InputSpec scales = in("scales", {static_cast<int64_t>(z.scales.size())}, true);
      scales.values = z.scales;
      c.inputs = {in("X", z.x), absent()};
      if (z.sizes.empty()) c.inputs.push_back(scales);
      else c.inputs.push_back(absent()), c.inputs.push_back(ints("sizes", z.sizes));
      c.attrs = {{"mode", S(z.mode)}, {"coordinate_transformation_mode", S(z.coord)}};
      if (*z.nearest) c.attrs["nearest_mode"] = S(z.nearest);
      v.push_back(c);
    }
    OpCase c;
    c.op = "Resize";
    c.opset = 10;
    c.label = "opset 10 nearest X=[1,2,3,5] scales=[1,1,2,3]";
    InputSpec scales = in("scales", {4}, true);
    scales.values = {1, 1, 2, 3};
    c.inputs = {in("X", {1, 2, 3, 5}), scales};
    c.attrs = {{"mode", S("nearest")}};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Clip";
    c.opset = 6;
    c.label = "opset 6 X=[3,50] min=-0.25 max=0.5";
    c.inputs = {in("X", {3, 50})};
    c.attrs = {{"min", F(-0.25f)}, {"max", F(0.5f)}};
    v.push_back(c);
  }
  {
    struct M {
      const char* op;
      int opset;
      Shape x;
      std::vector<float> second;
      std::map<std::string, Attribute> attrs;
    };
    const M ms[] = {{"Reshape", 14, {2, 3, 4}, {4, 0, -1}, {}},
                    {"Reshape", 14, {2, 12}, {-1}, {}},
                    {"Reshape", 14, {2, 0, 4}, {0, 8}, {{"allowzero", I(1)}}},
                    {"Flatten", 13, {2, 3, 4, 5}, {}, {{"axis", I(2)}}},
                    {"Flatten", 13, {2, 3, 4}, {}, {{"axis", I(0)}}},
                    {"Squeeze", 13, {1, 3, 1, 5}, {0, -2}, {}},
                    {"Squeeze", 13, {1, 3, 1, 5}, {}, {}},
                    {"Unsqueeze", 13, {3, 5}, {0, -1}, {}},
                    {"Identity", 13, {2, 7, 3}, {}, {}},
                    {"Squeeze", 11, {1, 4, 1}, {}, {{"axes", Is({2})}}},
                    {"Unsqueeze", 11, {4}, {}, {{"axes", Is({1})}}}};
    for (const M& m : ms) {
      OpCase c;
      c.op = m.op;
      c.opset = m.opset;
      c.label = "X=" + shape_label(m.x) +
                (m.second.empty() ? "" : " " + shape_label(Shape(m.second.begin(), m.second.end()))) +
                " opset=" + std::to_string(m.opset) + (m.attrs.empty() ? "" : " attrs");
      c.inputs = {in("X", m.x)};
      if (!m.second.empty()) c.inputs.push_back(ints(m.op == std::string("Reshape") ? "shape" : "axes", m.second));
      c.attrs = m.attrs;
      v.push_back(c);
    }
  }
  // The fusion passes' keel.Gelu and keel.LayerNormalization (what fuse_gelu / fuse_layer_norm make for graphs
  // below ONNX opset 20 / 17), f32 and f16.
  for (DType dt : {DType::kF32, DType::kF16}) {
    const std::string tag = dt == DType::kF16 ? " f16" : "";
    const double tol = dt == DType::kF16 ? 4e-3 : 1e-3;
    OpCase g;
    g.op = "Gelu", g.domain = "keel", g.opset = 13, g.label = "keel X=[4,333]" + tag, g.dtype = dt;
    g.inputs = {in("X", {4, 333}, false, -5, 5)};
    g.rtol = g.atol = tol;
    v.push_back(g);
    g.label = "keel approximate=tanh X=[4,333]" + tag;  // GPT-2's gelu_new (fuse_gelu's second form)
    g.attrs = {{"approximate", S("tanh")}};
    v.push_back(g);
    OpCase l;
    l.op = "LayerNormalization", l.domain = "keel", l.opset = 13, l.label = "keel X=[2,128,256] axis=-1" + tag;
    l.dtype = dt;
    l.inputs = {in("X", {2, 128, 256}, false, -3, 3), in("Scale", {256}, true), in("B", {256}, true)};
    l.attrs = {{"axis", I(-1)}, {"epsilon", F(1e-5f)}};
    l.rtol = l.atol = tol;
    v.push_back(l);
  }
  // f16 / bf16 variants: inputs rounded to the dtype; both sides compute in float and round the result.
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const bool h = dt == DType::kF16;
    const std::string tag = h ? " f16" : " bf16";
    const double tol = h ? 4e-3 : 3e-2;
    auto add = [&](OpCase c) {
      c.label += tag;
      c.dtype = dt;
      c.rtol = tol;
      c.atol = tol;
      v.push_back(std::move(c));
    };
    OpCase c;
    c.op = "Add", c.label = "A=[2,16,5,5] B=[1,16,1,1]", c.inputs = {in("A", {2, 16, 5, 5}), in("B", {1, 16, 1, 1})};
    add(c);
    c = OpCase{};
    c.op = "Mul", c.label = "A=[3,1,5] B=[1,4,5]", c.inputs = {in("A", {3, 1, 5}), in("B", {1, 4, 5})};
    add(c);
    c = OpCase{};
    c.op = "Relu", c.label = "X=[2,3,5,7]", c.inputs = {in("X", {2, 3, 5, 7}, false, -2, 2)};
    add(c);
    c = OpCase{};
    c.op = "Sigmoid", c.label = "X=[1,64,9]", c.inputs = {in("X", {1, 64, 9}, false, -6, 6)};
    add(c);
    c = OpCase{};
    c.op = "Softmax", c.opset = 13, c.label = "X=[4,8,128] axis=-1", c.inputs = {in("X", {4, 8, 128}, false, -5, 5)};
    c.attrs = {{"axis", I(-1)}};
    add(c);
    c = OpCase{};
    c.op = "LayerNormalization", c.label = "X=[2,5,256] axis=-1";
    c.inputs = {in("X", {2, 5, 256}, false, -3, 3), in("Scale", {256}, true), in("B", {256}, true)};
    c.attrs = {{"axis", I(-1)}, {"epsilon", F(1e-5f)}};
    add(c);
    c = OpCase{};
    c.op = "ReduceMean", c.opset = 18, c.label = "X=[2,96,200] axes=[-1]";
    c.inputs = {in("X", {2, 96, 200}), ints("axes", {-1})};
    add(c);
    c = OpCase{};
    c.op = "ReduceMax", c.opset = 18, c.label = "X=[2,3,4,5] axes=[1,3]";
    c.inputs = {in("X", {2, 3, 4, 5}), ints("axes", {1, 3})};
    add(c);
    c = OpCase{};
    c.op = "Transpose", c.label = "X=[1,128,4,64] perm=[0,2,1,3]", c.inputs = {in("X", {1, 128, 4, 64})};
    c.attrs = {{"perm", Is({0, 2, 1, 3})}};
    add(c);
    c = OpCase{};
    c.op = "Resize", c.opset = 13, c.label = "linear half_pixel X=[1,2,5,7] sizes=[1,2,10,14]";
    c.inputs = {in("X", {1, 2, 5, 7}), absent(), absent(), ints("sizes", {1, 2, 10, 14})};
    c.attrs = {{"mode", S("linear")}};
    add(c);
    c = OpCase{};
    c.op = "Clip", c.opset = 13, c.label = "X=[2,16,9,9] min=-0.5 max=0.7";
    c.inputs = {in("X", {2, 16, 9, 9}, false, -2, 2), scalar("min", -0.5f), scalar("max", 0.7f)};
    add(c);
    c = OpCase{};
    c.op = "Gather", c.opset = 13, c.label = "data=[50,32] indices=[3,4] axis=0";
    InputSpec idx = in("I", {3, 4}, false, -50, 49);
    idx.dtype = DType::kI64;
    c.inputs = {in("X", {50, 32}), idx};
    add(c);
  }
}

// INT8: keel.QConv and keel.QGemm (made by the fuse_qdq pass from QDQ models): u8/s8 activations with and without a
// zero point, s8 weights with per-channel (and per-tensor) scales, f32 bias, Relu/Clip, u8/s8/f32 outputs.
InputSpec qin(const std::string& name, Shape shape, DType dtype, bool constant, float lo, float hi) {
  InputSpec s = in(name, std::move(shape), constant, lo, hi);
  s.dtype = dtype;
  return s;
}
InputSpec qconst(const std::string& name, Shape shape, DType dtype, std::vector<float> values) {
  InputSpec s = in(name, std::move(shape), true);
  s.dtype = dtype;
  s.values = std::move(values);
  return s;
}

// Per-channel weight scales around `base`, varied so that a wrong channel mapping shows.
std::vector<float> channel_scales(int64_t n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = base * (0.5f + static_cast<float>(i % 7) / 6.f);
  return v;
}

// The quantization inputs 3..7 of a QConv/QGemm case.
void add_qparams(OpCase& c, int64_t channels, DType xt, float xzp, bool per_channel, DType yt, float yzp, float ys) {
  c.inputs.push_back(qconst("x_scale", {}, DType::kF32, {0.02f}));
  c.inputs.push_back(qconst("x_zero_point", {}, xt, {xzp}));
  c.inputs.push_back(per_channel ? qconst("w_scale", {channels}, DType::kF32, channel_scales(channels, 0.004f))
                                 : qconst("w_scale", {}, DType::kF32, {0.004f}));
  if (yt != DType::kF32) {
    c.inputs.push_back(qconst("y_scale", {}, DType::kF32, {ys}));
    c.inputs.push_back(qconst("y_zero_point", {}, yt, {yzp}));
  }
}

// Over a million random values some land on (or next to) a rounding tie of X / x_scale, where the kernels' x * (1 /
// x_scale), oneDNN's reorder and the reference may round apart. For such cases: x_scale 1/64 and X values on a grid
// of 1/1000 offset by 0.0003 (6007 of them, repeated), each at least 0.0008 of a step away from a tie.
void tie_free_x(OpCase& c) {
  c.inputs[3] = qconst("x_scale", {}, DType::kF32, {1.f / 64});
  std::vector<float> x(6007);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 6001) / 1000.f - 3.f + 0.0003f;
  c.inputs[0].values = std::move(x);
}

void add_int8_cases(std::vector<OpCase>& v) {
  struct P {
    int64_t N, C, H, W, K, k, s, p, g;
  };
  const P ps[] = {{1, 16, 14, 14, 32, 3, 1, 1, 1}, {2, 8, 9, 11, 16, 1, 1, 0, 1}, {1, 32, 10, 10, 32, 3, 2, 1, 32},
                  {1, 3, 17, 17, 8, 7, 2, 3, 1},   {1, 24, 8, 8, 48, 3, 1, 1, 4}, {1, 64, 7, 7, 64, 3, 1, 1, 1}};
  struct Q {
    DType xt;
    float xzp;
    DType yt;
    float yzp;
    const char* act;
    bool per_channel;
  };
  const Q qs[] = {{DType::kU8, 128, DType::kU8, 128, "", true},
                  {DType::kU8, 0, DType::kU8, 0, "Relu", true},
                  {DType::kU8, 7, DType::kF32, 0, "", true},
                  {DType::kI8, 0, DType::kI8, -3, "Clip", false},
                  {DType::kU8, 128, DType::kF32, 0, "Relu", true}};
  for (const P& p : ps) {
    for (const Q& q : qs) {
      for (int bias = 1; bias >= 0; --bias) {
        if (!bias && q.yt != DType::kU8) continue;
        OpCase c;
        c.op = "QConv";
        c.domain = "keel";
        std::ostringstream l;
        l << "N=" << p.N << " C=" << p.C << " H=" << p.H << " W=" << p.W << " K=" << p.K << " k=" << p.k << " s=" << p.s
          << " p=" << p.p << " g=" << p.g << " x=" << dtype_name(q.xt) << "/" << q.xzp << " y=" << dtype_name(q.yt)
          << "/" << q.yzp << (q.act[0] ? " act=" : "") << q.act << (q.per_channel ? "" : " per-tensor")
          << (bias ? "" : " nobias");
        c.label = l.str();
        const bool s8x = q.xt == DType::kI8;
        c.inputs = {qin("X", {p.N, p.C, p.H, p.W}, q.xt, false, s8x ? -128.f : 0.f, s8x ? 127.f : 255.f),
                    qin("W", {p.K, p.C / p.g, p.k, p.k}, DType::kI8, true, -127.f, 127.f),
                    bias ? in("B", {p.K}, true, -2.f, 2.f) : absent()};
        add_qparams(c, p.K, q.xt, q.xzp, q.per_channel, q.yt, q.yzp, 0.05f * static_cast<float>(p.k));
        c.attrs = {{"kernel_shape", Is({p.k, p.k})},
                   {"strides", Is({p.s, p.s})},
                   {"pads", Is({p.p, p.p, p.p, p.p})},
                   {"group", I(p.g)}};
        if (q.act[0]) c.attrs["activation"] = S(q.act);
        if (std::string(q.act) == "Clip") c.attrs["activation_params"] = Attribute::of_floats({-1.5f, 2.5f});
        v.push_back(c);
      }
    }
  }
  // Channels-last bytes in and out (fuse_qdq's layout between two QConvs).
  for (const char* layouts : {"in", "out", "in+out"}) {
    OpCase c;
    c.op = "QConv";
    c.domain = "keel";
    c.label = std::string("N=2 C=16 H=9 W=7 K=24 k=3 s=1 p=1 g=1 x=u8/0 y=u8/3 NHWC ") + layouts;
    c.inputs = {qin("X", {2, 16, 9, 7}, DType::kU8, false, 0.f, 255.f),
                qin("W", {24, 16, 3, 3}, DType::kI8, true, -127.f, 127.f), in("B", {24}, true, -2.f, 2.f)};
    add_qparams(c, 24, DType::kU8, 0, true, DType::kU8, 3, 0.15f);
    c.attrs = {{"pads", Is({1, 1, 1, 1})}, {"activation", S("Relu")}};
    if (std::string(layouts) != "out") c.attrs["input_layout"] = S("NHWC");
    if (std::string(layouts) != "in") c.attrs["output_layout"] = S("NHWC");
    v.push_back(c);
  }
  // A residual input Z (fuse_qdq's folded Add): added after the activation, before the requantisation; in the
  // output's layout. 1x1 projections as in MobileNetV2 (f32 out with a second reader, u8 out when the Add's only
  // reader was a QuantizeLinear), a 3x3 with Relu, a depthwise with Clip and s8 out.
  struct Z {
    int64_t C, H, W, K, k, g;
    DType yt;
    float yzp;
    const char* act;
    bool nhwc;
    const char* z_layout = nullptr;
  };
  const Z zs[] = {{32, 7, 9, 16, 1, 1, DType::kF32, 0, "", true},
                  {32, 7, 9, 16, 1, 1, DType::kU8, 120, "", true},
                  {16, 6, 6, 24, 3, 1, DType::kU8, 0, "Relu", false},
                  {24, 8, 5, 24, 3, 24, DType::kI8, 2, "Clip", true},
                  {48, 5, 5, 16, 1, 1, DType::kF32, 0, "", false},
                  {32, 6, 7, 24, 3, 1, DType::kF32, 0, "", false, "NHWC"},     // Z channels-last, Y plain
                  {32, 6, 7, 24, 1, 1, DType::kU8, 5, "Relu", true, "NCHW"}};  // Z plain, Y channels-last
  for (const Z& z : zs) {
    OpCase c;
    c.op = "QConv";
    c.domain = "keel";
    std::ostringstream l;
    l << "N=1 C=" << z.C << " H=" << z.H << " W=" << z.W << " K=" << z.K << " k=" << z.k << " g=" << z.g
      << " x=u8/9 y=" << dtype_name(z.yt) << "/" << z.yzp << (z.act[0] ? " act=" : "") << z.act << " +Z"
      << (z.nhwc ? " NHWC" : "") << (z.z_layout ? std::string(" Z:") + z.z_layout : std::string());
    c.label = l.str();
    c.inputs = {qin("X", {1, z.C, z.H, z.W}, DType::kU8, false, 0.f, 255.f),
                qin("W", {z.K, z.C / z.g, z.k, z.k}, DType::kI8, true, -127.f, 127.f), in("B", {z.K}, true, -2.f, 2.f)};
    add_qparams(c, z.K, DType::kU8, 9, true, z.yt, z.yzp, 0.2f);
    if (z.yt == DType::kF32) {  // y_scale, y_zero_point absent: Z is input 8
      c.inputs.push_back(absent());
      c.inputs.push_back(absent());
    }
    c.inputs.push_back(in("Z", {1, z.K, z.H, z.W}, false, -6.f, 6.f));
    const int64_t p = z.k / 2;
    c.attrs = {{"kernel_shape", Is({z.k, z.k})}, {"pads", Is({p, p, p, p})}, {"group", I(z.g)}};
    if (z.act[0]) c.attrs["activation"] = S(z.act);
    if (std::string(z.act) == "Clip") c.attrs["activation_params"] = Attribute::of_floats({-1.5f, 2.5f});
    if (z.nhwc) c.attrs["input_layout"] = S("NHWC"), c.attrs["output_layout"] = S("NHWC");
    if (z.z_layout) c.attrs["residual_layout"] = S(z.z_layout);
    v.push_back(c);
  }
  // An f32 X quantized by the node itself (fuse_qdq's folded QuantizeLinear): x_scale 0.02 and X in [-3, 3], so
  // that some values saturate; with and without a residual, plain and channels-last, u8 and s8.
  struct F {
    int64_t C, K, k, g;
    DType xt;
    float xzp;
    DType yt;
    bool z;
    bool nhwc;
  };
  const F fs[] = {{24, 48, 1, 1, DType::kU8, 128, DType::kU8, false, false},
                  {24, 48, 1, 1, DType::kU8, 128, DType::kU8, false, true},
                  {16, 16, 3, 16, DType::kI8, 0, DType::kF32, false, true},
                  {32, 16, 1, 1, DType::kU8, 100, DType::kU8, true, true},
                  {8, 12, 3, 1, DType::kI8, -4, DType::kF32, true, false}};
  for (const F& f : fs) {
    OpCase c;
    c.op = "QConv";
    c.domain = "keel";
    std::ostringstream l;
    l << "N=1 C=" << f.C << " H=9 W=8 K=" << f.K << " k=" << f.k << " g=" << f.g << " x=f32->" << dtype_name(f.xt)
      << "/" << f.xzp << " y=" << dtype_name(f.yt) << (f.z ? " +Z" : "") << (f.nhwc ? " NHWC" : "");
    c.label = l.str();
    c.inputs = {in("X", {1, f.C, 9, 8}, false, -3.f, 3.f),
                qin("W", {f.K, f.C / f.g, f.k, f.k}, DType::kI8, true, -127.f, 127.f), in("B", {f.K}, true, -2.f, 2.f)};
    add_qparams(c, f.K, f.xt, f.xzp, true, f.yt, 3, 0.3f);
    if (f.z) {
      if (f.yt == DType::kF32) c.inputs.push_back(absent()), c.inputs.push_back(absent());
      c.inputs.push_back(in("Z", {1, f.K, 9, 8}, false, -6.f, 6.f));
    }
    const int64_t p = f.k / 2;
    c.attrs = {{"kernel_shape", Is({f.k, f.k})}, {"pads", Is({p, p, p, p})}, {"group", I(f.g)}};
    if (f.nhwc) c.attrs["input_layout"] = S("NHWC"), c.attrs["output_layout"] = S("NHWC");
    v.push_back(c);
  }
  // The same, in sizes the cpu_onednn plugin's own quantization loops (onednn_int8_quant.cc) split differently:
  // channel counts that are multiples of 4 but not of 16 and pixel counts that are not multiples of 16 (the plain ->
  // channels-last transpose's tails), channel counts that are not multiples of 4 (a last partial group of 4: alone for
  // an RGB image, one or two channels, with pixel counts that end a block of 16 exactly, where a store that spills
  // past the block would write past the tensor; after whole groups for 6 and 13), and tensors of 2^20 elements or more
  // (quantized on the whole thread team). f32 outputs, so that one quantization step off in X
  // shows.
  struct FB {
    int64_t C, H, W, K;
    DType xt;
    float xzp;
    bool nhwc;
  };
  const FB fbs[] = {{13, 11, 11, 16, DType::kU8, 128, false}, {24, 40, 40, 16, DType::kI8, -3, false},
                    {20, 45, 40, 24, DType::kU8, 7, true},    {6, 5, 3, 8, DType::kI8, 0, false},
                    {12, 7, 5, 8, DType::kU8, 3, false},      {24, 215, 215, 16, DType::kI8, -3, false},
                    {20, 240, 220, 24, DType::kU8, 7, true},  {3, 57, 61, 8, DType::kU8, 128, false},
                    {1, 9, 9, 4, DType::kI8, 0, false},       {1, 8, 8, 4, DType::kU8, 9, false},
                    {2, 4, 8, 4, DType::kU8, 128, false}};
  for (const FB& f : fbs) {
    OpCase c;
    c.op = "QConv";
    c.domain = "keel";
    std::ostringstream l;
    l << "N=1 C=" << f.C << " H=" << f.H << " W=" << f.W << " K=" << f.K << " k=1 x=f32->" << dtype_name(f.xt) << "/"
      << f.xzp << " y=f32" << (f.nhwc ? " NHWC" : "");
    c.label = l.str();
    c.inputs = {in("X", {1, f.C, f.H, f.W}, false, -3.f, 3.f),
                qin("W", {f.K, f.C, 1, 1}, DType::kI8, true, -127.f, 127.f), in("B", {f.K}, true, -2.f, 2.f)};
    add_qparams(c, f.K, f.xt, f.xzp, true, DType::kF32, 0, 1.f);
    if (f.C * f.H * f.W >= (int64_t{1} << 20)) tie_free_x(c);
    c.attrs = {{"kernel_shape", Is({1, 1})}};
    if (f.nhwc) c.attrs["input_layout"] = S("NHWC"), c.attrs["output_layout"] = S("NHWC");
    v.push_back(c);
  }
  // An f32 output in the plain layout from a primitive that computes channels-last, which the cpu_onednn plugin
  // transposes with its own loop (onednn_int8_quant.cc, nhwc_to_nchw_f32) where the CPU has AVX-512: output channel
  // counts with a partial 16-channel block, pixel counts with a partial block of 16, batch 2, a residual Z, and
  // MobileNetV2's last 1x1 ([1,1280,7,7]), and 2^20 values (split over the thread team).
  struct T {
    int64_t N, C, H, W, K;
    bool z;
    const char* act;
  };
  const T ts[] = {{1, 320, 7, 7, 1280, false, "Clip"}, {2, 16, 5, 7, 20, false, ""},
                  {1, 24, 9, 9, 33, true, "Relu"},     {1, 8, 4, 4, 16, false, ""},
                  {2, 32, 20, 20, 48, false, "Relu"},  {1, 8, 128, 128, 64, false, ""}};
  for (const T& t : ts) {
    OpCase c;
    c.op = "QConv";
    c.domain = "keel";
    std::ostringstream l;
    l << "N=" << t.N << " C=" << t.C << " H=" << t.H << " W=" << t.W << " K=" << t.K << " k=1 x=u8/5 y=f32 plain"
      << (t.z ? " +Z" : "") << (t.act[0] ? " act=" : "") << t.act << " (transposed from channels-last)";
    c.label = l.str();
    c.inputs = {qin("X", {t.N, t.C, t.H, t.W}, DType::kU8, false, 0.f, 255.f),
                qin("W", {t.K, t.C, 1, 1}, DType::kI8, true, -127.f, 127.f), in("B", {t.K}, true, -2.f, 2.f)};
    add_qparams(c, t.K, DType::kU8, 5, true, DType::kF32, 0, 1.f);
    if (t.z) {
      c.inputs.push_back(absent());
      c.inputs.push_back(absent());
      c.inputs.push_back(in("Z", {t.N, t.K, t.H, t.W}, false, -6.f, 6.f));
    }
    c.attrs = {{"kernel_shape", Is({1, 1})}, {"input_layout", S("NHWC")}};
    if (t.act[0]) c.attrs["activation"] = S(t.act);
    if (std::string(t.act) == "Clip") c.attrs["activation_params"] = Attribute::of_floats({0.f, 6.f});
    v.push_back(c);
  }
  // Depthwise 3x3 over channels-last bytes in and out (MobileNet's int8 blocks), which the cpu_onednn plugin runs on
  // its own kernel (onednn_int8_dw.cc) where the CPU has AVX-512 VNNI: channel counts with a partial 16-channel block,
  // widths with and without a block of 8 output pixels, strides 1/2/3 and asymmetric padding, u8/s8 X with zero
  // points, u8/s8/f32 outputs, batch 2.
  struct D {
    int64_t N, C, H, W, sh, sw, pt, pl, pb, pr;
    DType xt;
    float xzp;
    DType yt;
    float yzp;
    const char* act;
    bool bias;
  };
  const D ds[] = {{1, 32, 14, 14, 1, 1, 1, 1, 1, 1, DType::kU8, 0, DType::kU8, 0, "Clip", true},
                  {2, 40, 9, 11, 2, 2, 1, 1, 1, 1, DType::kU8, 128, DType::kI8, -5, "Relu", true},
                  {1, 16, 7, 7, 1, 1, 1, 1, 1, 1, DType::kI8, -3, DType::kF32, 0, "", true},
                  {1, 24, 10, 13, 2, 1, 0, 1, 1, 0, DType::kU8, 7, DType::kU8, 3, "Clip", false},
                  {1, 64, 5, 20, 1, 1, 0, 0, 0, 0, DType::kI8, 0, DType::kU8, 128, "", true},
                  {1, 96, 16, 15, 2, 2, 0, 0, 1, 1, DType::kU8, 0, DType::kU8, 0, "Clip", true},
                  {1, 48, 28, 28, 2, 2, 1, 1, 1, 1, DType::kU8, 0, DType::kU8, 0, "Clip", true},  // oneDNN's
                  {1, 48, 33, 17, 1, 1, 1, 1, 1, 1, DType::kU8, 0, DType::kF32, 0, "Relu", true},
                  {1, 20, 12, 9, 3, 2, 1, 1, 1, 1, DType::kI8, 5, DType::kI8, 0, "", true}};
  for (const D& d : ds) {
    OpCase c;
    c.op = "QConv";
    c.domain = "keel";
    std::ostringstream l;
    l << "N=" << d.N << " C=" << d.C << " H=" << d.H << " W=" << d.W << " k=3 g=" << d.C << " s=" << d.sh << "," << d.sw
      << " p=" << d.pt << "," << d.pl << "," << d.pb << "," << d.pr << " x=" << dtype_name(d.xt) << "/" << d.xzp
      << " y=" << dtype_name(d.yt) << "/" << d.yzp << (d.act[0] ? " act=" : "") << d.act << (d.bias ? "" : " nobias")
      << " NHWC depthwise";
    c.label = l.str();
    const bool s8x = d.xt == DType::kI8;
    c.inputs = {qin("X", {d.N, d.C, d.H, d.W}, d.xt, false, s8x ? -128.f : 0.f, s8x ? 127.f : 255.f),
                qin("W", {d.C, 1, 3, 3}, DType::kI8, true, -127.f, 127.f),
                d.bias ? in("B", {d.C}, true, -2.f, 2.f) : absent()};
    add_qparams(c, d.C, d.xt, d.xzp, true, d.yt, d.yzp, 0.05f);
    c.attrs = {{"kernel_shape", Is({3, 3})},
               {"strides", Is({d.sh, d.sw})},
               {"pads", Is({d.pt, d.pl, d.pb, d.pr})},
               {"group", I(d.C)},
               {"input_layout", S("NHWC")},
               {"output_layout", S("NHWC")}};
    if (d.act[0]) c.attrs["activation"] = S(d.act);
    if (std::string(d.act) == "Clip") c.attrs["activation_params"] = Attribute::of_floats({-1.5f, 2.5f});
    v.push_back(c);
    if (&d == &ds[0]) {  // a Clip range below what u8 with zero point 3 represents: every output saturates to 0
      c.label += " clip below the range, y zero point 3";
      c.inputs[7] = qconst("y_zero_point", {}, DType::kU8, {3.f});
      c.attrs["activation_params"] = Attribute::of_floats({-3.f, -1.f});
      v.push_back(c);
    }
  }
  struct G {
    Shape a;
    int64_t N;
    int tb;
    DType xt;
    float xzp;
    DType yt;
    float yzp;
    const char* act;
    bool f32_a = false;
  };
  const G gs[] = {{{4, 64}, 32, 1, DType::kU8, 3, DType::kU8, 128, ""},
                  {{2, 5, 64}, 48, 0, DType::kU8, 128, DType::kF32, 0, ""},
                  {{1, 512}, 1000, 1, DType::kU8, 0, DType::kF32, 0, ""},
                  {{16, 96}, 40, 0, DType::kI8, 0, DType::kU8, 0, "Relu"},
                  {{7, 33}, 17, 1, DType::kU8, 90, DType::kI8, 0, "Clip"},
                  {{1, 320}, 100, 1, DType::kU8, 128, DType::kF32, 0, "", true},  // f32 A quantized by the node
                  {{6, 40}, 24, 0, DType::kI8, -2, DType::kU8, 7, "Relu", true},
                  {{37, 1000}, 20, 1, DType::kI8, 5, DType::kF32, 0, "", true},
                  {{1100, 1000}, 20, 1, DType::kU8, 17, DType::kF32, 0, "", true}};  // 1.1e6 elements to quantize
  for (const G& g : gs) {
    OpCase c;
    c.op = "QGemm";
    c.domain = "keel";
    const int64_t K = g.a.back();
    c.label = "A=" + shape_label(g.a) + " N=" + std::to_string(g.N) + " transB=" + std::to_string(g.tb) +
              " x=" + (g.f32_a ? "f32->" : "") + dtype_name(g.xt) + " y=" + dtype_name(g.yt) +
              (g.act[0] ? std::string(" act=") + g.act : "");
    const bool s8x = g.xt == DType::kI8;
    c.inputs = {
        g.f32_a ? in("A", g.a, false, -3.f, 3.f) : qin("A", g.a, g.xt, false, s8x ? -128.f : 0.f, s8x ? 127.f : 255.f),
        qin("B", g.tb ? Shape{g.N, K} : Shape{K, g.N}, DType::kI8, true, -127.f, 127.f),
        in("C", {g.N}, true, -2.f, 2.f)};
    add_qparams(c, g.N, g.xt, g.xzp, true, g.yt, g.yzp, 0.1f);
    if (g.f32_a && shape_numel(g.a) >= (int64_t{1} << 20)) tie_free_x(c);
    c.attrs = {{"transB", I(g.tb)}};
    if (g.act[0]) c.attrs["activation"] = S(g.act);
    if (std::string(g.act) == "Clip") c.attrs["activation_params"] = Attribute::of_floats({-1.f, 3.f});
    v.push_back(c);
  }
}

// QuantizeLinear / DequantizeLinear with a per-tensor scale and zero point (what QDQ models leave between int8 ops).
void add_qdq_cases(std::vector<OpCase>& v) {
  struct P {
    Shape s;
    DType t;
    float zp;
    float scale;
  };
  const P ps[] = {{{1, 64, 56, 56}, DType::kU8, 128, 0.03f},
                  {{2, 3, 7, 5}, DType::kU8, 0, 0.01f},
                  {{1000}, DType::kI8, 0, 0.02f},
                  {{4, 17}, DType::kI8, -5, 0.1f}};
  for (const P& p : ps) {
    for (int quant = 1; quant >= 0; --quant) {
      OpCase c;
      c.op = quant ? "QuantizeLinear" : "DequantizeLinear";
      c.opset = 13;
      c.label =
          "X=" + shape_label(p.s) + " " + dtype_name(p.t) + " zp=" + fmt_float(p.zp) + " scale=" + fmt_float(p.scale);
      const bool s8 = p.t == DType::kI8;
      c.inputs = {
          quant ? in("X", p.s, false, -5.f, 5.f) : qin("X", p.s, p.t, false, s8 ? -128.f : 0.f, s8 ? 127.f : 255.f),
          qconst("scale", {}, DType::kF32, {p.scale}), qconst("zero_point", {}, p.t, {p.zp})};
      v.push_back(c);
    }
  }
}

// A keel.ConvGrad case comparing output `out` (dX, dW, dB), its tolerance by dtype (f16 and bf16: 2e-2).
OpCase conv_grad_case(DType dt, size_t out) {
  OpCase o;
  o.op = "ConvGrad";
  o.domain = "keel";
  o.dtype = dt;
  o.output = out;
  o.num_outputs = 3;
  if (dt != DType::kF32) o.rtol = 2e-2, o.atol = 2e-2;
  else o.rtol = 1e-3, o.atol = 1e-4;
  return o;
}

// The keel-domain backward ops of training (ops/gradients.cc emits them) and the fused cross-entropy, in f32 and
// bf16 (autocast): every output of each is compared, one case per output.
void add_training_cases(std::vector<OpCase>& v) {
  struct Cv {
    int64_t N, C, H, W, M, k, s, p, g;
  };
  const Cv cs[] = {{4, 1, 28, 28, 32, 3, 1, 0, 1},
                   {2, 3, 9, 11, 8, 3, 2, 1, 1},
                   {1, 4, 8, 8, 6, 3, 1, 1, 2},
                   {2, 16, 7, 7, 16, 1, 1, 0, 1},
                   {1, 8, 10, 9, 5, 5, 1, 2, 1},
                   // 3x3 stride 1 with 16+ channels: oneDNN's Winograd backward kernels in f32 (the LeNet-like conv2)
                   {2, 32, 14, 14, 64, 3, 1, 0, 1},
                   {3, 16, 9, 7, 32, 3, 1, 1, 1},
                   // Few input channels, stride 1: the oneDNN plugin's own weight gradient (padded, odd widths, rows
                   // longer than 16 columns, kernels 1-7 wide)
                   {2, 3, 9, 21, 8, 3, 1, 1, 1},
                   {3, 1, 13, 17, 5, 5, 1, 2, 1},
                   {2, 2, 10, 40, 16, 7, 1, 3, 1},
                   {2, 4, 6, 5, 3, 1, 1, 0, 1},
                   {3, 1, 130, 130, 4, 3, 1, 0, 1}};  // planes large enough that the images go in two chunks
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const Cv& c : cs) {
      const int64_t oh = (c.H + 2 * c.p - c.k) / c.s + 1, ow = (c.W + 2 * c.p - c.k) / c.s + 1;
      for (size_t out = 0; out < 3; ++out) {
        OpCase o = conv_grad_case(dt, out);
        std::ostringstream l;
        l << dtype_name(dt) << " N=" << c.N << " C=" << c.C << " H=" << c.H << " W=" << c.W << " M=" << c.M
          << " k=" << c.k << " s=" << c.s << " p=" << c.p << " g=" << c.g << " output=" << out;
        o.label = l.str();
        o.inputs = {in("dY", {c.N, c.M, oh, ow}), in("X", {c.N, c.C, c.H, c.W}), in("W", {c.M, c.C / c.g, c.k, c.k})};
        o.attrs = {{"kernel_shape", Is({c.k, c.k})},
                   {"strides", Is({c.s, c.s})},
                   {"pads", Is({c.p, c.p, c.p, c.p})},
                   {"group", I(c.g)}};
        v.push_back(o);
        // The other two output sets the autograd asks for: no dX (a first layer: X is the input) and dX alone (a
        // frozen layer: --freeze, fine-tuning).
        o.unnamed_outputs = out == 0 ? std::vector<size_t>{1, 2} : std::vector<size_t>{0};
        o.label += out == 0 ? " alone" : " without dX";
        v.push_back(o);
      }
    }
    // Asymmetric pads (what TensorFlow's SAME padding exports), 3x3 stride 1 with 16+ channels: random gradients
    // (keel-cts --random-grads 1 --seed 9854) found oneDNN 2.6's Winograd backward data ignoring the end pads.
    for (const std::vector<int64_t>& pads : {std::vector<int64_t>{0, 0, 1, 0}, std::vector<int64_t>{1, 0, 2, 1}}) {
      for (size_t out = 0; out < 3; ++out) {
        OpCase o = conv_grad_case(dt, out);
        const int64_t oh = 17 + pads[0] + pads[2] - 2, ow = 15 + pads[1] + pads[3] - 2;
        o.label = std::string(dtype_name(dt)) + " N=1 C=32 H=17 W=15 M=32 k=3 s=1 pads=" + std::to_string(pads[0]) +
                  "," + std::to_string(pads[1]) + "," + std::to_string(pads[2]) + "," + std::to_string(pads[3]) +
                  " output=" + std::to_string(out);
        o.inputs = {in("dY", {1, 32, oh, ow}), in("X", {1, 32, 17, 15}), in("W", {32, 32, 3, 3})};
        o.attrs = {{"kernel_shape", Is({3, 3})}, {"pads", Is(pads)}};
        v.push_back(o);
      }
    }
    struct Pl {
      Shape x;
      int64_t k, s, p;
    };
    for (const Pl& p : {Pl{{4, 32, 26, 26}, 2, 2, 0}, Pl{{2, 3, 7, 9}, 2, 2, 0}, Pl{{2, 3, 35, 69}, 2, 2, 0},
                        Pl{{1, 4, 9, 9}, 3, 2, 1}, Pl{{2, 2, 6, 6}, 3, 1, 0}}) {
      OpCase o;
      o.op = "MaxPoolGrad";
      o.domain = "keel";
      o.dtype = dt;
      Shape y = {p.x[0], p.x[1], (p.x[2] + 2 * p.p - p.k) / p.s + 1, (p.x[3] + 2 * p.p - p.k) / p.s + 1};
      o.label = std::string(dtype_name(dt)) + " X=" + shape_label(p.x) + " k=" + std::to_string(p.k) +
                " s=" + std::to_string(p.s) + " p=" + std::to_string(p.p);
      o.inputs = {in("dY", y), in("X", p.x)};
      o.attrs = {{"kernel_shape", Is({p.k, p.k})}, {"strides", Is({p.s, p.s})}, {"pads", Is({p.p, p.p, p.p, p.p})}};
      o.atol = 0, o.rtol = 0;  // dY is routed, not computed: exact (up to bf16 sums where windows overlap)
      if (dt == DType::kBF16 && p.k > p.s) o.rtol = 1e-2, o.atol = 1e-2;
      v.push_back(o);
    }
    for (Shape s : {Shape{4, 32, 26, 26}, Shape{3, 7}, Shape{1000}}) {
      OpCase o;
      o.op = "ReluGrad";
      o.domain = "keel";
      o.dtype = dt;
      o.label = std::string(dtype_name(dt)) + " " + shape_label(s);
      o.inputs = {in("dY", s), in("Y", s, false, -1.f, 1.f)};
      o.atol = 0, o.rtol = 0;
      v.push_back(o);
    }
  }
  {  // keel.FusedConvMaxPool (the pooled output; its window positions feed the gradient cases below) and its gradient
    struct Cp {
      int64_t N, C, H, W, M, k, p, pk, ps;
      bool relu;
    };
    const Cp cs[] = {// Winograd, 16-channel blocks, windows tiling the plane
                     {2, 32, 14, 14, 64, 3, 0, 2, 2, true},
                     // a half-filled channel block, a row and a column no window covers
                     {2, 16, 11, 11, 24, 3, 0, 2, 2, true},
                     // the oneDNN plugin's stem kernel (plain layout), odd width, padded
                     {3, 1, 12, 13, 8, 3, 1, 2, 2, true},
                     {2, 3, 9, 11, 5, 3, 1, 2, 2, true},
                     // overlapping 3x3 windows at stride 2, no activation
                     {1, 16, 10, 10, 16, 3, 1, 3, 2, false},
                     // 8 channels
                     {1, 8, 9, 9, 8, 3, 0, 2, 2, true},
                     // the SimpleCNN's first layer (1 -> 32, 28x28), smaller batch
                     {4, 1, 28, 28, 32, 3, 0, 2, 2, true},
                     // the oneDNN plugin's stem pooled in registers (steps/convpool.h): 48 channels (a group of 3
                     // blocks), padded, an odd width whose last column no window covers, no activation
                     {2, 3, 12, 13, 48, 3, 1, 2, 2, false},
                     // pooled rows past 16 columns (three steps, the last partial), an odd channel count, no activation
                     {2, 2, 10, 70, 3, 3, 1, 2, 2, false}};
    for (const Cp& c : cs) {
      const int64_t oh = c.H + 2 * c.p - c.k + 1, ow = c.W + 2 * c.p - c.k + 1;
      const int64_t ph = (oh - c.pk) / c.ps + 1, pw = (ow - c.pk) / c.ps + 1;
      std::ostringstream l;
      l << "N=" << c.N << " C=" << c.C << " H=" << c.H << " W=" << c.W << " M=" << c.M << " k=" << c.k << " p=" << c.p
        << " pool=" << c.pk << "/" << c.ps << (c.relu ? " relu" : "");
      std::map<std::string, Attribute> attrs = {{"kernel_shape", Is({c.k, c.k})},
                                                {"pads", Is({c.p, c.p, c.p, c.p})},
                                                {"pool_kernel_shape", Is({c.pk, c.pk})},
                                                {"pool_strides", Is({c.ps, c.ps})}};
      if (c.relu) attrs["activation"] = Attribute::of_string("Relu");
      OpCase f;
      f.op = "FusedConvMaxPool";
      f.domain = "keel";
      f.label = l.str();
      f.inputs = {in("X", {c.N, c.C, c.H, c.W}), in("W", {c.M, c.C, c.k, c.k}, false, -0.5f, 0.5f), in("B", {c.M})};
      f.attrs = attrs;
      v.push_back(f);
      // Its window positions (what the gradient reads), exactly as the reference's (first maximum in scan order).
      f.output = 1;
      f.num_outputs = 2;
      f.label += " output=1";
      v.push_back(f);
      for (size_t out = 0; out < 3; ++out) {
        OpCase o;
        o.op = "FusedConvMaxPoolGrad";
        o.domain = "keel";
        o.output = out;
        o.num_outputs = 3;
        o.label = l.str() + " output=" + std::to_string(out);
        InputSpec arg = in("Arg", {c.N, c.M, ph, pw}, false, 0.f, static_cast<float>(c.pk * c.pk - 1));
        arg.dtype = DType::kU8;
        o.inputs = {in("dP", {c.N, c.M, ph, pw}), in("X", {c.N, c.C, c.H, c.W}), in("W", {c.M, c.C, c.k, c.k}),
                    in("P", {c.N, c.M, ph, pw}), arg};
        o.attrs = attrs;
        o.rtol = 1e-3, o.atol = 1e-4;
        v.push_back(o);
        // Without dX, as the autograd asks for a network's first layer (X is the input): the oneDNN plugin's dW
        // and dB from dP straight (no dY) where the pooling is 2x2 / 2 and the input has few channels.
        if (out > 0) {
          o.unnamed_outputs = {0};
          o.label += " without dX";
          v.push_back(o);
        }
      }
    }
  }
  for (DType from : {DType::kF32, DType::kBF16}) {  // autocast's casts
    for (Shape s : {Shape{10, 5408}, Shape{3, 5}}) {
      OpCase o;
      o.op = "Cast";
      o.dtype = from;
      DType to = from == DType::kF32 ? DType::kBF16 : DType::kF32;
      o.label = std::string(dtype_name(from)) + "->" + dtype_name(to) + " " + shape_label(s);
      o.inputs = {in("X", s, false, -100.f, 100.f)};
      o.attrs = {{"to", I(static_cast<int64_t>(to))}};
      o.atol = 0, o.rtol = 0;  // round to nearest even, both sides
      v.push_back(o);
    }
  }
  for (const char* red : {"mean", "sum", "none"}) {
    for (Shape s : {Shape{64, 10}, Shape{5, 3}}) {
      std::vector<int64_t> labels(static_cast<size_t>(s[0]));
      for (size_t i = 0; i < labels.size(); ++i)
        labels[i] = static_cast<int64_t>((i * 7 + 3) % static_cast<size_t>(s[1]));
      Tensor lt = Tensor::from_vector(DType::kI64, {s[0]}, labels);
      for (size_t out = 0; out < 2; ++out) {
        OpCase o;
        o.op = "SoftmaxCrossEntropyLoss";
        o.label = std::string("reduction=") + red + " scores=" + shape_label(s) + " output=" + std::to_string(out);
        o.inputs = {in("scores", s, false, -4.f, 4.f), in("labels", {s[0]}, true)};
        o.int64_constants = {{1, lt}};
        o.attrs = {{"reduction", S(red)}};
        o.num_outputs = 2;
        o.output = out;
        v.push_back(o);
      }
      OpCase o;
      o.op = "SoftmaxCrossEntropyLossGrad";
      o.domain = "keel";
      o.label = std::string("reduction=") + red + " log_prob=" + shape_label(s);
      o.inputs = {in("dLoss", std::string(red) == "none" ? Shape{s[0]} : Shape{}),
                  in("log_prob", s, false, -5.f, -0.01f), in("labels", {s[0]}, true)};
      o.int64_constants = {{2, lt}};
      o.attrs = {{"reduction", S(red)}};
      v.push_back(o);
    }
  }
}

// The rest of the backward ops the gradient rules emit (ops/gradients.cc), in f32, f16 and bf16 where the schemas
// allow: what a device needs to train SimpleCNN, LeNet-like and transformer models (the CUDA plugin's
// cuda_train_ops.cc). Integer inputs (labels, indices) are fed at run time, as a training step feeds them.
InputSpec ints(const std::string& name, Shape shape, std::vector<float> values) {
  InputSpec s = in(name, std::move(shape));
  s.dtype = DType::kI64;
  s.values = std::move(values);
  return s;
}
void half_tolerance(OpCase& o) {
  if (o.dtype != DType::kF32) o.rtol = 2e-2, o.atol = 2e-2;
}
void add_training_device_cases(std::vector<OpCase>& v) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::string dn = dtype_name(dt);
    for (const char* op : {"SigmoidGrad", "TanhGrad", "GeluGrad", "LeakyReluGrad", "ReluGrad"}) {
      if (dt != DType::kF16 && std::string(op) == "ReluGrad") continue;  // f32 / bf16 in add_training_cases
      for (Shape sh : {Shape{4, 32, 26, 26}, Shape{3, 7}, Shape{1000}}) {
        OpCase o;
        o.op = op;
        o.domain = "keel";
        o.dtype = dt;
        o.label = dn + " " + shape_label(sh);
        const bool on_y = std::string(op) != "GeluGrad" && std::string(op) != "LeakyReluGrad";
        o.inputs = {in("dY", sh), on_y ? in("Y", sh, false, -1.f, 1.f) : in("X", sh, false, -3.f, 3.f)};
        if (std::string(op) == "LeakyReluGrad") o.attrs = {{"alpha", F(0.1f)}};
        half_tolerance(o);
        v.push_back(o);
      }
    }
    // DropoutMask (eager dropout's mask): odd and even element counts, ratios from 0 to 0.9, seeds with the high bit
    // set and a small one; the seed as an initializer (int64) and as an int32 run-time input. Values are exactly 0 or
    // 1 / (1 - ratio) in the dtype: compared exactly.
    struct Dm {
      Shape x;
      float ratio;
      uint64_t seed;
      bool i32;
    };
    for (const Dm& d : {Dm{{1}, 0.5f, 0x9e3779b97f4a7c15ull, false}, Dm{{7}, 0.25f, 12345, false},
                        Dm{{64, 64, 12, 12}, 0.25f, 0xfedcba9876543210ull, false}, Dm{{3, 1001}, 0.9f, 42, false},
                        Dm{{64, 128}, 0.5f, 7, true}, Dm{{5, 5}, 0.f, 99, false}}) {
      OpCase o;
      o.op = "DropoutMask";
      o.domain = "keel";
      o.dtype = dt;
      o.label = dn + " X=" + shape_label(d.x) + " ratio=" + std::to_string(d.ratio) +
                " seed=" + std::to_string(d.seed) + (d.i32 ? " (int32 input)" : "");
      if (d.i32) {
        InputSpec seed = in("seed", {}, false);
        seed.dtype = DType::kI32;
        seed.values = {static_cast<float>(d.seed)};
        o.inputs = {in("X", d.x), seed};
      } else {
        o.inputs = {in("X", d.x), in("seed", {}, true)};
        o.int64_constants = {
            {1, Tensor::from_vector(DType::kI64, {}, std::vector<int64_t>{static_cast<int64_t>(d.seed)})}};
      }
      o.attrs = {{"ratio", F(d.ratio)}};
      o.atol = 0, o.rtol = 0;
      v.push_back(o);
    }
    // AveragePoolGrad: LeNet's 2x2 / 2 and overlapping padded windows with and without the pads counted.
    struct Ap {
      Shape x;
      int64_t k, s, p, include_pad;
    };
    for (const Ap& a : {Ap{{4, 6, 28, 28}, 2, 2, 0, 0}, Ap{{2, 3, 7, 9}, 3, 2, 1, 0}, Ap{{2, 3, 7, 9}, 3, 2, 1, 1},
                        Ap{{1, 4, 5, 5}, 3, 1, 1, 0}}) {
      OpCase o;
      o.op = "AveragePoolGrad";
      o.domain = "keel";
      o.dtype = dt;
      const Shape y = {a.x[0], a.x[1], (a.x[2] + 2 * a.p - a.k) / a.s + 1, (a.x[3] + 2 * a.p - a.k) / a.s + 1};
      o.label = dn + " X=" + shape_label(a.x) + " k=" + std::to_string(a.k) + " s=" + std::to_string(a.s) +
                " p=" + std::to_string(a.p) + " count_include_pad=" + std::to_string(a.include_pad);
      o.inputs = {in("dY", y)};
      o.attrs = {{"kernel_shape", Is({a.k, a.k})},
                 {"strides", Is({a.s, a.s})},
                 {"pads", Is({a.p, a.p, a.p, a.p})},
                 {"count_include_pad", I(a.include_pad)},
                 {"input_shape", Is(a.x)}};
      half_tolerance(o);
      v.push_back(o);
    }
    if (dt == DType::kF16) {  // MaxPoolGrad and ConvGrad in f16 (f32 / bf16 in add_training_cases)
      OpCase o;
      o.op = "MaxPoolGrad";
      o.domain = "keel";
      o.dtype = dt;
      o.label = dn + " X=[4,32,26,26] k=2 s=2 p=0";
      o.inputs = {in("dY", {4, 32, 13, 13}), in("X", {4, 32, 26, 26})};
      o.attrs = {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}, {"pads", Is({0, 0, 0, 0})}};
      o.atol = 0, o.rtol = 0;
      v.push_back(o);
      for (size_t out = 0; out < 3; ++out) {
        OpCase c = conv_grad_case(dt, out);
        c.label = dn + " N=2 C=3 H=9 W=11 M=8 k=3 s=2 p=1 g=1 output=" + std::to_string(out);
        c.inputs = {in("dY", {2, 8, 5, 6}), in("X", {2, 3, 9, 11}), in("W", {8, 3, 3, 3})};
        c.attrs = {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}, {"group", I(1)}};
        v.push_back(c);
      }
    }
    // BatchNormTraining (Y, mean, invstd, unbiased var) and BatchNormGrad (dX, dScale, dB), conv and linear layouts.
    for (Shape x : {Shape{8, 16, 12, 12}, Shape{4, 3, 5, 7}, Shape{32, 10}}) {
      const int64_t C = x[1];
      for (size_t out = 0; out < 4; ++out) {
        OpCase o;
        o.op = "BatchNormTraining";
        o.domain = "keel";
        o.dtype = dt;
        o.num_outputs = 4;
        o.output = out;
        o.label = dn + " X=" + shape_label(x) + " output=" + std::to_string(out);
        o.inputs = {in("X", x, false, -2.f, 3.f), in("scale", {C}), in("B", {C})};
        o.attrs = {{"epsilon", F(1e-5f)}};
        half_tolerance(o);
        v.push_back(o);
      }
      for (size_t out = 0; out < 3; ++out) {
        OpCase o;
        o.op = "BatchNormGrad";
        o.domain = "keel";
        o.dtype = dt;
        o.num_outputs = 3;
        o.output = out;
        o.label = dn + " X=" + shape_label(x) + " output=" + std::to_string(out);
        o.inputs = {in("dY", x), in("X", x, false, -2.f, 2.f), in("scale", {C}), in("mean", {C}, false, -0.5f, 0.5f),
                    in("invstd", {C}, false, 0.5f, 2.f)};
        half_tolerance(o);
        if (dt != DType::kF32) o.atol = 5e-2;  // sums over a batch of rounded terms
        v.push_back(o);
      }
    }
    // LayerNormGrad over the last dim and over the last two (axis 1 of a rank-3 X).
    struct Ln {
      Shape x;
      int64_t axis;
      Shape scale, stats;
    };
    for (const Ln& l :
         {Ln{{8, 64}, -1, {64}, {8, 1}}, Ln{{2, 5, 24}, 1, {5, 24}, {2, 1, 1}}, Ln{{4, 7, 33}, -1, {33}, {4, 7, 1}}}) {
      for (size_t out = 0; out < 3; ++out) {
        OpCase o;
        o.op = "LayerNormGrad";
        o.domain = "keel";
        o.dtype = dt;
        o.num_outputs = 3;
        o.output = out;
        o.label = dn + " X=" + shape_label(l.x) + " axis=" + std::to_string(l.axis) + " output=" + std::to_string(out);
        o.inputs = {in("dY", l.x), in("X", l.x, false, -2.f, 2.f), in("scale", l.scale),
                    in("mean", l.stats, false, -0.5f, 0.5f), in("invstd", l.stats, false, 0.5f, 2.f)};
        o.attrs = {{"axis", I(l.axis)}};
        half_tolerance(o);
        if (dt != DType::kF32) o.atol = 5e-2;
        v.push_back(o);
      }
    }
    // GatherGrad: an embedding's backward (repeated and negative indices) and a middle axis.
    {
      OpCase o;
      o.op = "GatherGrad";
      o.domain = "keel";
      o.dtype = dt;
      o.label = dn + " data=[10,3] indices=[5,4] axis=0";
      o.inputs = {in("dY", {5, 4, 3}), ints("indices", {5, 4}, {0, 3, 3, 9, -1, 2, 0, 0, 7, 5})};
      o.attrs = {{"axis", I(0)}, {"data_shape", Is({10, 3})}};
      half_tolerance(o);
      v.push_back(o);
      OpCase m = o;
      m.label = dn + " data=[2,7,3] indices=[4] axis=1";
      m.inputs = {in("dY", {2, 4, 3}), ints("indices", {4}, {6, 1, 1, -7})};
      m.attrs = {{"axis", I(1)}, {"data_shape", Is({2, 7, 3})}};
      v.push_back(m);
    }
  }
  // SoftmaxCrossEntropyLoss and its gradient with spatial dims, class weights and ignore_index; labels fed at run time.
  for (const char* red : {"mean", "sum", "none"}) {
    for (bool weighted : {false, true}) {
      const Shape s = {4, 5, 3};
      const std::vector<float> labels = {0, 4, 2, 1, -100, 3, 4, 4, 0, 2, -100, 1};
      const std::string label =
          std::string("reduction=") + red + " scores=[4,5,3] ignore_index=-100" + (weighted ? " weights" : "");
      for (size_t out = 0; out < 2; ++out) {
        OpCase o;
        o.op = "SoftmaxCrossEntropyLoss";
        o.label = label + " output=" + std::to_string(out);
        o.inputs = {in("scores", s, false, -4.f, 4.f), ints("labels", {4, 3}, labels)};
        if (weighted) o.inputs.push_back(in("weights", {5}, true, 0.2f, 2.f));
        o.attrs = {{"reduction", S(red)}, {"ignore_index", I(-100)}};
        o.num_outputs = 2;
        o.output = out;
        v.push_back(o);
      }
      OpCase g;
      g.op = "SoftmaxCrossEntropyLossGrad";
      g.domain = "keel";
      g.label = label;
      g.inputs = {in("dLoss", std::string(red) == "none" ? Shape{4, 3} : Shape{}),
                  in("log_prob", s, false, -5.f, -0.01f), ints("labels", {4, 3}, labels)};
      if (weighted) g.inputs.push_back(in("weights", {5}, true, 0.2f, 2.f));
      g.attrs = {{"reduction", S(red)}, {"ignore_index", I(-100)}};
      v.push_back(g);
    }
  }
  // SGD with momentum (ai.onnx.preview.training Momentum, which SGD::step runs on a device): one tensor and three in
  // one call (a multi-tensor update), standard and nesterov, with and without weight decay, the first update (T = 0:
  // beta is 1) and a later one; the parameters and the momenta are compared.
  struct Mo {
    std::vector<Shape> xs;
    const char* mode;
    float norm;
    int64_t t;
  };
  for (const Mo& m :
       {Mo{{{10, 5408}}, "standard", 0.f, 1}, Mo{{{64, 32, 3, 3}, {64}, {1000, 13}}, "nesterov", 1e-4f, 1},
        Mo{{{128, 9}, {7}}, "standard", 5e-4f, 0}}) {
    const int64_t n = static_cast<int64_t>(m.xs.size());
    for (int64_t out : std::set<int64_t>{0, n - 1, n}) {  // the first and last parameters, the first momentum
      OpCase o;
      o.op = "Momentum";
      o.domain = "ai.onnx.preview.training";
      o.opset = 1;
      std::string shapes;
      for (const Shape& x : m.xs) shapes += shape_label(x);
      o.label = std::string(m.mode) + " " + shapes + " norm=" + std::to_string(m.norm) + " T=" + std::to_string(m.t) +
                " output=" + std::to_string(out);
      InputSpec r = in("R", {}, true);
      r.values = {0.05f};
      o.inputs = {r, in("T", {}, true)};
      o.int64_constants = {{1, Tensor::from_vector(DType::kI64, {}, std::vector<int64_t>{m.t})}};
      for (int64_t i = 0; i < n; ++i) o.inputs.push_back(in("X" + std::to_string(i), m.xs[static_cast<size_t>(i)]));
      for (int64_t i = 0; i < n; ++i) o.inputs.push_back(in("G" + std::to_string(i), m.xs[static_cast<size_t>(i)]));
      for (int64_t i = 0; i < n; ++i)
        o.inputs.push_back(in("V" + std::to_string(i), m.xs[static_cast<size_t>(i)], false, -0.1f, 0.1f));
      o.attrs = {{"alpha", F(0.9f)}, {"beta", F(0.7f)}, {"norm_coefficient", F(m.norm)}, {"mode", S(m.mode)}};
      o.num_outputs = static_cast<size_t>(2 * n);
      o.output = static_cast<size_t>(out);
      o.rtol = 1e-5, o.atol = 1e-6;  // f32 against the reference's f64: a few ulps
      v.push_back(o);
    }
  }
  // Adam / AdamW (keel.AdamStep, which Adam::step runs on a device): one tensor and three in one call, with and without
  // (decoupled) weight decay, the first step and a later one; the parameters and both moments are compared. The
  // reference rounds every operation to f32 as the device must: compared to a few ulps (sqrt and division may differ
  // in the last bit on another device).
  struct Ad {
    std::vector<Shape> ps;
    float decay_scale, wd;
    int64_t t;
  };
  for (const Ad& a : {Ad{{{10, 5408}}, 1.f, 0.f, 1}, Ad{{{64, 32, 3, 3}, {64}, {1000, 13}}, 1.f, 1e-2f, 4},
                      Ad{{{128, 9}, {7}}, 1.f - 1e-5f, 0.f, 2}}) {
    const int64_t n = static_cast<int64_t>(a.ps.size());
    const double b1 = 0.9, b2 = 0.999, lr = 1e-3;
    const double bc1 = 1 - std::pow(b1, static_cast<double>(a.t)), bc2 = 1 - std::pow(b2, static_cast<double>(a.t));
    for (int64_t out : std::set<int64_t>{0, n - 1, n, 2 * n}) {  // parameters, first and second moments
      OpCase o;
      o.op = "AdamStep";
      o.domain = "keel";
      std::string shapes;
      for (const Shape& x : a.ps) shapes += shape_label(x);
      o.label = shapes + " decay_scale=" + std::to_string(a.decay_scale) + " wd=" + std::to_string(a.wd) +
                " t=" + std::to_string(a.t) + " output=" + std::to_string(out);
      InputSpec sc = in("scalars", {9}, true);
      sc.values = {a.decay_scale,
                   a.wd,
                   static_cast<float>(b1),
                   1 - static_cast<float>(b1),
                   static_cast<float>(b2),
                   1 - static_cast<float>(b2),
                   static_cast<float>(std::sqrt(bc2)),
                   1e-8f,
                   static_cast<float>(lr / bc1)};
      o.inputs = {sc};
      for (const char* g : {"P", "G", "M", "V"})
        for (int64_t i = 0; i < n; ++i)
          o.inputs.push_back(in(g + std::to_string(i), a.ps[static_cast<size_t>(i)], false,
                                std::string(g) == "V" ? 0.f : -1.f, std::string(g) == "V" ? 0.01f : 1.f));
      o.num_outputs = static_cast<size_t>(3 * n);
      o.output = static_cast<size_t>(out);
      o.rtol = 1e-5, o.atol = 1e-6;
      v.push_back(o);
    }
  }
  // GradScaler's unscale and inf/NaN check (keel.CheckFiniteAndUnscale): one gradient, three, and 17 (two launches of
  // the CUDA plugin's 16-tensor batches), chunks of 4096 elements crossed; finite gradients, a NaN, an inf, and an
  // inv_scale above 1 that overflows a finite value; the flag and unscaled gradients are compared.
  struct Un {
    std::vector<Shape> gs;
    float inv;
    int poison;  // 0: none, 1: a NaN in the last gradient, 2: -inf in the first, 3: 3e38 with inv_scale 4
  };
  std::vector<Shape> many;
  for (int64_t i = 0; i < 17; ++i) many.push_back({i % 3 == 0 ? 4097 : 5 + i});
  for (const Un& u :
       {Un{{{10, 5408}}, 1.f / 65536, 0}, Un{{{64, 32, 3, 3}, {64}, {9000}}, 0.25f, 1},
        Un{{{128, 9}, {7}}, 1.f / 1024, 2}, Un{{{33}, {4096}}, 4.f, 3}, Un{many, 1.f / 8, 0}, Un{many, 1.f / 8, 1}}) {
    const int64_t n = static_cast<int64_t>(u.gs.size());
    for (int64_t out : std::set<int64_t>{0, 1, n}) {  // found_inf, the first and the last unscaled gradient
      OpCase o;
      o.op = "CheckFiniteAndUnscale";
      o.domain = "keel";
      std::string shapes;
      for (const Shape& x : u.gs) shapes += shape_label(x);
      o.label = (n > 3 ? std::to_string(n) + " tensors" : shapes) + " inv=" + std::to_string(u.inv) +
                " poison=" + std::to_string(u.poison) + " output=" + std::to_string(out);
      InputSpec is = in("inv_scale", {}, false);
      is.values = {u.inv};
      o.inputs = {is};
      for (int64_t i = 0; i < n; ++i) {
        InputSpec g = in("G" + std::to_string(i), u.gs[static_cast<size_t>(i)], false, -1000.f, 1000.f);
        int64_t count = 1;
        for (int64_t d : u.gs[static_cast<size_t>(i)]) count *= d;
        const bool last = i == n - 1, first = i == 0;
        if ((u.poison == 1 && last) || (u.poison == 2 && first) || (u.poison == 3 && last)) {
          g.values.resize(static_cast<size_t>(count));
          for (int64_t e = 0; e < count; ++e) g.values[static_cast<size_t>(e)] = static_cast<float>(e % 97) - 48.f;
          const float bad = u.poison == 1   ? std::nanf("")
                            : u.poison == 2 ? -std::numeric_limits<float>::infinity()
                                            : 3.e38f;
          g.values[static_cast<size_t>(count / 2)] = bad;
        }
        o.inputs.push_back(g);
      }
      o.num_outputs = static_cast<size_t>(n + 1);
      o.output = static_cast<size_t>(out);
      o.rtol = 0, o.atol = 0;  // one rounded multiplication: exact
      v.push_back(o);
    }
  }
}

// Chains of ops a device may claim as one subgraph (oneDNN: layouts kept between ops, post-ops): ResNet, MobileNet
// and SqueezeNet blocks, odd channel counts, and a transformer encoder layer with its decomposed LayerNorm.
void add_chain_cases(std::vector<OpCase>& v) {
  auto i64 = [](std::vector<int64_t> vals) {
    Tensor t = Tensor::host(DType::kI64, {static_cast<int64_t>(vals.size())}).value();
    std::copy(vals.begin(), vals.end(), t.data<int64_t>());
    return t;
  };
  auto scalar = [](const std::string& name, float value) {
    InputSpec s = in(name, {}, true);
    s.values = {value};
    return s;
  };
  auto conv = [](std::vector<std::string> ins, int64_t k, int64_t s, int64_t p, int64_t g = 1) {
    return ChainNode{
        "Conv",
        std::move(ins),
        {{"kernel_shape", Is({k, k})}, {"strides", Is({s, s})}, {"pads", Is({p, p, p, p})}, {"group", I(g)}}};
  };
  // ResNet's basic block at 14x14 and 7x7. At C=160 (3.7 MB of F(4,3)-transformed weights) oneDNN's plugin runs both
  // 3x3s as its own Winograd step position by position (steps/wino4.h, Wino4Shape::position_major): at 14x14 in
  // F(4,3) (16 tiles), at 7x7 in F(2,3) (4 tiles of F(4,3), 16 of F(2,3)); at 28x28 with C=128 and C=96 (2.4 and 1.3
  // MB) in F(4,3) over 49 tiles (three output groups at C=96).
  for (const auto& [ch, hw, range] : {std::tuple<int64_t, int64_t, float>{16, 14, 0.3f},
                                      {160, 14, 0.05f},
                                      {160, 7, 0.05f},
                                      {128, 28, 0.06f},
                                      {96, 28, 0.07f}}) {
    OpCase c;
    c.op = "Chain";
    c.label = "resnet basic block C=" + std::to_string(ch) + " " + std::to_string(hw) + "x" + std::to_string(hw);
    c.inputs = {in("X", {1, ch, hw, hw}), in("W1", {ch, ch, 3, 3}, true, -range, range), in("B1", {ch}, true),
                in("W2", {ch, ch, 3, 3}, true, -range, range), in("B2", {ch}, true)};
    c.chain = {conv({"X", "W1", "B1"}, 3, 1, 1),
               {"Relu", {"$0"}, {}},
               conv({"$1", "W2", "B2"}, 3, 1, 1),
               {"Add", {"$2", "X"}, {}},
               {"Relu", {"$3"}, {}}};
    v.push_back(c);
  }
  {
    // ConvNeXt's stem LayerNorm (channels-last through a Transpose pair), then a block head: depthwise 7x7,
    // Transpose to channels-last, LayerNorm (oneDNN's plugin: one own step, steps/dw_ln.h), strips of 8 and 3 pixels.
    OpCase c;
    c.op = "Chain";
    c.label = "convnext block head: depthwise 7x7 + LayerNorm, channels-last";
    c.inputs = {
        in("X", {2, 32, 9, 11}), in("G0", {32}, true, 0.5f, 1.5f), in("B0", {32}, true), in("W", {32, 1, 7, 7}, true),
        in("BW", {32}, true),    in("G1", {32}, true, 0.5f, 1.5f), in("B1", {32}, true)};
    const std::map<std::string, Attribute> ln = {{"axis", I(-1)}, {"epsilon", F(1e-6f)}};
    c.chain = {{"Transpose", {"X"}, {{"perm", Is({0, 2, 3, 1})}}},  {"LayerNormalization", {"$0", "G0", "B0"}, ln},
               {"Transpose", {"$1"}, {{"perm", Is({0, 3, 1, 2})}}}, conv({"$2", "W", "BW"}, 7, 1, 3, 32),
               {"Transpose", {"$3"}, {{"perm", Is({0, 2, 3, 1})}}}, {"LayerNormalization", {"$4", "G1", "B1"}, ln}};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Chain";
    c.label = "resnet downsample block with BatchNormalization C=16->32 stride 2, batch 2";
    c.inputs = {in("X", {2, 16, 15, 15}),
                in("W1", {32, 16, 3, 3}, true, -0.3f, 0.3f),
                in("S1", {32}, true, 0.5f, 1.5f),
                in("T1", {32}, true),
                in("M1", {32}, true),
                in("V1", {32}, true, 0.5f, 2.f),
                in("W2", {32, 32, 3, 3}, true, -0.2f, 0.2f),
                in("S2", {32}, true, 0.5f, 1.5f),
                in("T2", {32}, true),
                in("M2", {32}, true),
                in("V2", {32}, true, 0.5f, 2.f),
                in("WD", {32, 16, 1, 1}, true, -0.5f, 0.5f)};
    c.chain = {conv({"X", "W1"}, 3, 2, 1),
               {"BatchNormalization", {"$0", "S1", "T1", "M1", "V1"}, {}},
               {"Relu", {"$1"}, {}},
               conv({"$2", "W2"}, 3, 1, 1),
               {"BatchNormalization", {"$3", "S2", "T2", "M2", "V2"}, {}},
               conv({"X", "WD"}, 1, 2, 0),
               {"Add", {"$4", "$5"}, {}},
               {"Relu", {"$6"}, {}}};
    v.push_back(c);
  }
  {
    // ResNet-50's strided bottleneck: the 3x3 stride-2 convolution over >= 32 channels runs on oneDNN's brgemm kernel
    // in nhwc between nChw16c neighbours (reorders in and out); its output also read by an Add and a pool.
    OpCase c;
    c.op = "Chain";
    c.label = "bottleneck with a 3x3 stride-2 conv over 32 channels (nhwc brgemm), batch 2";
    c.inputs = {in("X", {2, 32, 15, 15}),
                in("W0", {32, 32, 1, 1}, true, -0.4f, 0.4f),
                in("B0", {32}, true),
                in("W1", {48, 32, 3, 3}, true, -0.2f, 0.2f),
                in("S1", {48}, true, 0.5f, 1.5f),
                in("T1", {48}, true),
                in("M1", {48}, true),
                in("V1", {48}, true, 0.5f, 2.f),
                in("W2", {64, 48, 1, 1}, true, -0.3f, 0.3f),
                in("WD", {64, 32, 1, 1}, true, -0.3f, 0.3f),
                in("WX", {48, 64, 1, 1}, true, -0.3f, 0.3f)};
    c.chain = {conv({"X", "W0", "B0"}, 1, 1, 0),
               {"Relu", {"$0"}, {}},
               conv({"$1", "W1"}, 3, 2, 1),  // [2,48,8,8]
               {"BatchNormalization", {"$2", "S1", "T1", "M1", "V1"}, {}},
               {"Relu", {"$3"}, {}},
               conv({"$4", "W2"}, 1, 1, 0),
               conv({"$1", "WD"}, 1, 2, 0),
               {"Add", {"$5", "$6"}, {}},
               {"Relu", {"$7"}, {}},
               conv({"$8", "WX"}, 1, 1, 0),
               {"Add", {"$9", "$4"}, {}},
               {"MaxPool", {"$10"}, {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}}}};
    v.push_back(c);
  }
  {
    // ResNet-50's strided bottleneck at batch 1: the block's last 1x1 convolution and the stride-2 projection
    // shortcut added after it run as one 1x1 convolution over both sources side by side (the oneDNN device's
    // conv_residual_merged), odd spatial size (every other row and column of 15), then Relu and a second block.
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label = "bottleneck stride 2, batch 1: last 1x1 and the strided projection shortcut as one convolution";
    c.inputs = {in("X", {1, 32, 15, 15}), in("W0", {32, 32, 1, 1}, true, -0.4f, 0.4f),
                in("B0", {32}, true),     in("W1", {48, 32, 3, 3}, true, -0.2f, 0.2f),
                in("B1", {48}, true),     in("W2", {64, 48, 1, 1}, true, -0.3f, 0.3f),
                in("B2", {64}, true),     in("WD", {64, 32, 1, 1}, true, -0.3f, 0.3f),
                in("BD", {64}, true),     in("WX", {64, 64, 1, 1}, true, -0.3f, 0.3f)};
    c.chain = {conv({"X", "W0", "B0"}, 1, 1, 0),
               {"Relu", {"$0"}, {}},
               conv({"$1", "W1", "B1"}, 3, 2, 1),  // [1,48,8,8]
               {"Relu", {"$2"}, {}},
               conv({"$3", "W2", "B2"}, 1, 1, 0),
               conv({"$1", "WD", "BD"}, 1, 2, 0),  // [1,64,8,8]
               {"Add", {"$4", "$5"}, {}},
               {"Relu", {"$6"}, {}},
               conv({"$7", "WX"}, 1, 1, 0),
               {"Add", {"$8", "$7"}, {}}};
    v.push_back(c);
  }
  {
    // ResNet-50's layer4.0 at batch 1 and the next block's 1x1s: few output pixels (7x7) and weights of 8-9.4 MB, the
    // oneDNN device's windows-times-weights steps (steps/im2row.h, steps/skinny_gemm.h): the stride-2 3x3 + Relu, the
    // bottleneck end merged with its strided projection + Relu, a 1x1 without post-ops, a 1x1 + residual + Relu.
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label = "resnet-50 layer4.0 at batch 1: 7x7 convolutions with 8-9.4 MB of weights";
    c.inputs = {in("X", {1, 256, 14, 14}),
                in("W0", {512, 256, 1, 1}, true, -0.1f, 0.1f),
                in("B0", {512}, true),
                in("W1", {512, 512, 3, 3}, true, -0.03f, 0.03f),
                in("B1", {512}, true),
                in("W2", {2048, 512, 1, 1}, true, -0.06f, 0.06f),
                in("B2", {2048}, true),
                in("WD", {2048, 512, 1, 1}, true, -0.06f, 0.06f),
                in("BD", {2048}, true),
                in("WY", {1024, 2048, 1, 1}, true, -0.03f, 0.03f),
                in("WX", {2048, 1024, 1, 1}, true, -0.04f, 0.04f)};
    c.chain = {conv({"X", "W0", "B0"}, 1, 1, 0),
               {"Relu", {"$0"}, {}},
               conv({"$1", "W1", "B1"}, 3, 2, 1),  // [1,512,7,7]
               {"Relu", {"$2"}, {}},
               conv({"$3", "W2", "B2"}, 1, 1, 0),
               conv({"$1", "WD", "BD"}, 1, 2, 0),  // [1,2048,7,7]
               {"Add", {"$4", "$5"}, {}},
               {"Relu", {"$6"}, {}},
               conv({"$7", "WY"}, 1, 1, 0),  // [1,1024,7,7]
               conv({"$8", "WX"}, 1, 1, 0),
               {"Add", {"$9", "$7"}, {}},
               {"Relu", {"$10"}, {}}};
    v.push_back(c);
  }
  {
    // The same steps from 4 MiB of weights: ResNet-18's layer4.0 stride-2 3x3 (256 -> 512, 4.5 MiB) + Relu, then
    // ResNet-50's later layer4 1x1s (2048 x 512, 4 MiB each: 2048 -> 512 + Relu, 512 -> 2048 + residual + Relu).
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label =
        "resnet-18 layer4.0 3x3 and resnet-50 layer4.1 1x1s at batch 1: 7x7 convolutions with 4-4.5 MiB of weights";
    c.inputs = {in("X", {1, 256, 14, 14}), in("W0", {512, 256, 3, 3}, true, -0.03f, 0.03f),
                in("B0", {512}, true),     in("W1", {2048, 512, 1, 1}, true, -0.06f, 0.06f),
                in("B1", {2048}, true),    in("W2", {512, 2048, 1, 1}, true, -0.03f, 0.03f),
                in("B2", {512}, true),     in("W3", {2048, 512, 1, 1}, true, -0.06f, 0.06f)};
    c.chain = {conv({"X", "W0", "B0"}, 3, 2, 1),  // [1,512,7,7]
               {"Relu", {"$0"}, {}},
               conv({"$1", "W1", "B1"}, 1, 1, 0),  // [1,2048,7,7]
               {"Relu", {"$2"}, {}},
               conv({"$3", "W2", "B2"}, 1, 1, 0),  // [1,512,7,7]
               {"Relu", {"$4"}, {}},
               conv({"$5", "W3"}, 1, 1, 0),
               {"Add", {"$6", "$3"}, {}},
               {"Relu", {"$7"}, {}}};
    v.push_back(c);
  }
  {
    // SqueezeNet's fire module then its 3x3 / stride-2 max pooling (ceil mode adds no window here): at 2+ threads the
    // oneDNN device's own pooling split by output rows (steps/pool_arg.h's pool_max16_rows), over the concatenated
    // expands in nChw16c, at batch 2; then a 2x2 / stride-2 pooling of a 1x1's output, and one at stride 1.
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label = "fire module, 3x3 stride-2 max pooling (ceil), 2x2 stride-2 and 2x2 stride-1 poolings, batch 2";
    c.inputs = {in("X", {2, 32, 27, 27}), in("WS", {16, 32, 1, 1}, true, -0.3f, 0.3f),
                in("BS", {16}, true),     in("WE", {32, 16, 1, 1}, true, -0.3f, 0.3f),
                in("BE", {32}, true),     in("WT", {32, 16, 3, 3}, true, -0.1f, 0.1f),
                in("BT", {32}, true),     in("W2", {48, 64, 1, 1}, true, -0.2f, 0.2f)};
    c.chain = {conv({"X", "WS", "BS"}, 1, 1, 0),
               {"Relu", {"$0"}, {}},
               conv({"$1", "WE", "BE"}, 1, 1, 0),
               {"Relu", {"$2"}, {}},
               conv({"$1", "WT", "BT"}, 3, 1, 1),
               {"Relu", {"$4"}, {}},
               {"Concat", {"$3", "$5"}, {{"axis", I(1)}}},  // [2,64,27,27]
               {"MaxPool", {"$6"}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"ceil_mode", I(1)}}},
               conv({"$7", "W2"}, 1, 1, 0),  // [2,48,13,13]
               {"MaxPool", {"$8"}, {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}}},
               {"MaxPool", {"$9"}, {{"kernel_shape", Is({2, 2})}, {"strides", Is({1, 1})}}}};
    v.push_back(c);
  }
  {
    // The same few pixels and large weights with an activation the chain applies as a pass after the convolution
    // (SiLU as exported, x * Sigmoid(x)): the windows-times-weights path declines it (random chains, seed 2641, where
    // the product once ran without its SiLU).
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label = "7x7 stride-2 3x3 with 9.4 MB of weights, then SiLU";
    c.inputs = {in("X", {1, 512, 13, 13}), in("W", {512, 512, 3, 3}, true, -0.03f, 0.03f), in("B", {512}, true)};
    c.chain = {conv({"X", "W", "B"}, 3, 2, 1), {"Sigmoid", {"$0"}, {}}, {"Mul", {"$0", "$1"}, {}}};
    v.push_back(c);
  }
  {
    // The same merged bottleneck end with the 3x3 over 16 channels (oneDNN's jit kernel, nChw16c, not brgemm's
    // nhwc): the merged source's own step copies h from nChw16c; even spatial size, no bias on the shortcut.
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label = "bottleneck stride 2, batch 1, 16-channel 3x3 (nChw16c): last 1x1 and the shortcut as one convolution";
    c.inputs = {in("X", {1, 16, 14, 14}),
                in("WI", {32, 16, 1, 1}, true, -0.4f, 0.4f),
                in("W0", {16, 32, 1, 1}, true, -0.4f, 0.4f),
                in("B0", {16}, true),
                in("W1", {16, 16, 3, 3}, true, -0.3f, 0.3f),
                in("B1", {16}, true),
                in("W2", {48, 16, 1, 1}, true, -0.3f, 0.3f),
                in("B2", {48}, true),
                in("WD", {48, 32, 1, 1}, true, -0.3f, 0.3f)};
    c.chain = {conv({"X", "WI"}, 1, 1, 0),  // the block's input x, [1,32,14,14] in nChw16c
               conv({"$0", "W0", "B0"}, 1, 1, 0),
               {"Relu", {"$1"}, {}},
               conv({"$2", "W1", "B1"}, 3, 2, 1),  // [1,16,7,7]
               {"Relu", {"$3"}, {}},
               conv({"$4", "W2", "B2"}, 1, 1, 0),
               conv({"$0", "WD"}, 1, 2, 0),  // [1,48,7,7]
               {"Add", {"$5", "$6"}, {}},
               {"Relu", {"$7"}, {}}};
    v.push_back(c);
  }
  {
    // A dilated 3x3 (no Winograd) over 32 channels: brgemm in nhwc, read by an Add with its own input and a global
    // average pool.
    OpCase c;
    c.op = "Chain";
    c.label = "dilated 3x3 conv over 32 channels (nhwc brgemm), residual add, global average pool";
    c.inputs = {in("X", {1, 16, 13, 11}), in("W0", {32, 16, 1, 1}, true, -0.4f, 0.4f),
                in("W1", {32, 32, 3, 3}, true, -0.2f, 0.2f), in("B1", {32}, true)};
    ChainNode dil = conv({"$1", "W1", "B1"}, 3, 1, 2);
    dil.attrs["dilations"] = Is({2, 2});
    c.chain = {conv({"X", "W0"}, 1, 1, 0),
               {"Relu", {"$0"}, {}},
               dil,
               {"Add", {"$2", "$1"}, {}},
               {"GlobalAveragePool", {"$3"}, {}}};
    v.push_back(c);
  }
  {
    // Dilated 3x3s whose padding equals the dilation and whose spatial sizes divide by it run as Winograd over the
    // input's phases (plugins/cpu_onednn/chain/ops/conv_variants.cc, conv_dilated_phases), batch 2: dilation 2 over
    // 16x16 (phases 8x8) with BatchNormalization and Relu folded, dilation 3 (16 does not divide by 3: brgemm),
    // dilation 4 (phases 4x4) with a Relu and a residual Add after it (not a sum post-op: the Relu comes first), and
    // dilation 2 without bias.
    OpCase c;
    c.op = "Chain";
    c.label = "dilated 3x3 convs as Winograd over the input's phases: dilation 2 and 4, BN + relu, batch 2, residual";
    c.inputs = {in("X", {2, 16, 16, 16}),
                in("W0", {32, 16, 1, 1}, true, -0.4f, 0.4f),
                in("W1", {32, 32, 3, 3}, true, -0.2f, 0.2f),
                in("S1", {32}, true, 0.5f, 1.5f),
                in("T1", {32}, true),
                in("M1", {32}, true),
                in("V1", {32}, true, 0.5f, 2.f),
                in("W2", {32, 32, 3, 3}, true, -0.2f, 0.2f),
                in("B2", {32}, true),
                in("W3", {32, 32, 3, 3}, true, -0.2f, 0.2f),
                in("B3", {32}, true),
                in("W4", {32, 32, 3, 3}, true, -0.2f, 0.2f)};
    auto dilated = [&](std::vector<std::string> ins, int64_t d) {
      ChainNode n = conv(std::move(ins), 3, 1, d);
      n.attrs["dilations"] = Is({d, d});
      return n;
    };
    c.chain = {conv({"X", "W0"}, 1, 1, 0), {"Relu", {"$0"}, {}},
               dilated({"$1", "W1"}, 2),   {"BatchNormalization", {"$2", "S1", "T1", "M1", "V1"}, {}},
               {"Relu", {"$3"}, {}},       dilated({"$4", "W2", "B2"}, 3),
               {"Relu", {"$5"}, {}},       dilated({"$6", "W3", "B3"}, 4),
               {"Relu", {"$7"}, {}},       {"Add", {"$8", "$6"}, {}},
               dilated({"$9", "W4"}, 2)};
    v.push_back(c);
  }
  {
    // DeepLabV3's ASPP over a small map (batch 2, 5x5, 32 channels): 3x3 convolutions with dilation 6 and 5 (every
    // off-centre tap reads padding only: the oneDNN device runs them as 1x1 convolutions of the centre tap), one with
    // dilation 2 (taps inside: a real dilated convolution), the global-pool branch (GAP, 1x1, Relu, Resize back to
    // 5x5), the channel Concat and the 1x1 projection; then a 3x7 map with dilation 4, centre-only along H but not
    // along W (not a 1x1).
    OpCase c;
    c.op = "Chain";
    c.label = "ASPP: dilated 3x3s whose off-centre taps read only padding (d=6, d=5), d=2, pooled branch, concat";
    c.inputs = {in("X", {2, 32, 5, 5}), in("W0", {32, 32, 1, 1}, true, -0.3f, 0.3f),
                in("B0", {32}, true),   in("W1", {32, 32, 3, 3}, true, -0.2f, 0.2f),
                in("B1", {32}, true),   in("W2", {32, 32, 3, 3}, true, -0.2f, 0.2f),
                in("B2", {32}, true),   in("W3", {32, 32, 3, 3}, true, -0.2f, 0.2f),
                in("B3", {32}, true),   in("W4", {32, 32, 1, 1}, true, -0.3f, 0.3f),
                in("SZ", {4}, true),    in("WP", {32, 160, 1, 1}, true, -0.15f, 0.15f),
                in("Y", {1, 32, 3, 7}), in("W5", {16, 32, 3, 3}, true, -0.2f, 0.2f)};
    c.int64_constants = {{10, i64({2, 32, 5, 5})}};
    auto dilated = [&](std::vector<std::string> ins, int64_t dv) {
      ChainNode n = conv(std::move(ins), 3, 1, dv);
      n.attrs["dilations"] = Is({dv, dv});
      return n;
    };
    c.chain = {conv({"X", "W0", "B0"}, 1, 1, 0),
               {"Relu", {"$0"}, {}},  // $0 $1
               dilated({"X", "W1", "B1"}, 6),
               {"Relu", {"$2"}, {}},  // $2 $3
               dilated({"X", "W2", "B2"}, 2),
               {"Relu", {"$4"}, {}},  // $4 $5
               dilated({"X", "W3", "B3"}, 5),
               {"Relu", {"$6"}, {}},  // $6 $7
               {"GlobalAveragePool", {"X"}, {}},
               conv({"$8", "W4"}, 1, 1, 0),                                    // $8 $9
               {"Relu", {"$9"}, {}},                                           // $10
               {"Resize", {"$10", "", "", "SZ"}, {{"mode", S("linear")}}},     // $11
               {"Concat", {"$1", "$3", "$5", "$7", "$11"}, {{"axis", I(1)}}},  // $12
               conv({"$12", "WP"}, 1, 1, 0),
               {"Relu", {"$13"}, {}},  // $13 $14
               dilated({"Y", "W5"}, 4),
               {"Relu", {"$15"}, {}},                                                   // $15 $16 [1,16,3,7]
               {"ReduceMean", {"$14"}, {{"axes", Is({1})}, {"keepdims", I(1)}}},        // $17 [2,1,5,5]
               {"ReduceMean", {"$16"}, {{"axes", Is({1, 2, 3})}, {"keepdims", I(1)}}},  // $18 [1,1,1,1]
               {"Add", {"$17", "$18"}, {}}};
    v.push_back(c);
  }
  {
    // A 1-D (temporal) convolution block as audio and TCN models have it: dilated convs with BatchNormalization, a
    // 1x1 skip, residual add, pooling, global average pool and a classifier.
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label = "1-D conv block: conv k3, BN, relu, dilated conv, BN, 1x1 skip, add, relu, maxpool, GAP, gemm, batch 2";
    c.inputs = {in("X", {2, 16, 37}),
                in("W1", {32, 16, 3}, true, -0.3f, 0.3f),
                in("S1", {32}, true, 0.5f, 1.5f),
                in("T1", {32}, true),
                in("M1", {32}, true),
                in("V1", {32}, true, 0.5f, 2.f),
                in("W2", {32, 32, 3}, true, -0.2f, 0.2f),
                in("S2", {32}, true, 0.5f, 1.5f),
                in("T2", {32}, true),
                in("M2", {32}, true),
                in("V2", {32}, true, 0.5f, 2.f),
                in("WD", {32, 16, 1}, true, -0.4f, 0.4f),
                in("G", {10, 32}, true),
                in("C", {10}, true)};
    c.chain = {{"Conv", {"X", "W1"}, {{"kernel_shape", Is({3})}, {"pads", Is({1, 1})}}},
               {"BatchNormalization", {"$0", "S1", "T1", "M1", "V1"}, {}},
               {"Relu", {"$1"}, {}},
               {"Conv", {"$2", "W2"}, {{"kernel_shape", Is({3})}, {"pads", Is({2, 2})}, {"dilations", Is({2})}}},
               {"BatchNormalization", {"$3", "S2", "T2", "M2", "V2"}, {}},
               {"Conv", {"X", "WD"}, {}},
               {"Add", {"$4", "$5"}, {}},
               {"Relu", {"$6"}, {}},
               {"MaxPool", {"$7"}, {{"kernel_shape", Is({3})}, {"strides", Is({2})}, {"pads", Is({1, 1})}}},
               {"GlobalAveragePool", {"$8"}, {}},
               {"Flatten", {"$9"}, {}},
               {"Gemm", {"$10", "G", "C"}, {{"transB", I(1)}}}};
    v.push_back(c);
  }
  {
    // 1-D text/audio front end: strided conv, a per-channel constant scale ([C,1]), ConvTranspose upsampling,
    // average pool, concatenation along the length, then the sequence read by a Transpose and a MatMul (the
    // rank-3 value itself).
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label = "1-D conv s2, channel scale, ConvTranspose s2, avgpool, concat on length, transpose, matmul";
    c.inputs = {in("X", {1, 8, 42}),
                in("W1", {16, 8, 5}, true, -0.3f, 0.3f),
                in("B1", {16}, true),
                in("K", {16, 1}, true, 0.5f, 1.5f),
                in("WT", {16, 16, 4}, true, -0.2f, 0.2f),
                in("BT", {16}, true),
                in("P", {16, 12}, true, -0.3f, 0.3f)};
    c.chain = {{"Conv", {"X", "W1", "B1"}, {{"kernel_shape", Is({5})}, {"strides", Is({2})}, {"pads", Is({2, 2})}}},
               {"Mul", {"$0", "K"}, {}},
               {"Relu", {"$1"}, {}},
               {"ConvTranspose", {"$2", "WT", "BT"}, {{"strides", Is({2})}, {"pads", Is({1, 1})}}},
               {"AveragePool", {"$3"}, {{"kernel_shape", Is({3})}, {"pads", Is({1, 1})}}},
               {"Concat", {"$2", "$4"}, {{"axis", I(-1)}}},
               {"Transpose", {"$5"}, {{"perm", Is({0, 2, 1})}}},
               {"MatMul", {"$6", "P"}, {}}};
    v.push_back(c);
  }
  {
    // A text CNN (Kim 2014) as torch exports it: embeddings [N,L,E] transposed to [N,E,L], parallel Conv1d of
    // widths 3/4/5 with Relu, global max pooling over time, the features concatenated, a classifier; batch 1.
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label = "text CNN: transpose, parallel 1-D convs k3/k4/k5, relu, global max pool, concat, flatten, gemm";
    c.inputs = {in("X", {1, 19, 24}), in("W3", {16, 24, 3}, true, -0.3f, 0.3f),
                in("B3", {16}, true), in("W4", {16, 24, 4}, true, -0.3f, 0.3f),
                in("B4", {16}, true), in("W5", {32, 24, 5}, true, -0.3f, 0.3f),
                in("B5", {32}, true), in("G", {5, 64}, true),
                in("C", {5}, true)};
    c.chain = {{"Transpose", {"X"}, {{"perm", Is({0, 2, 1})}}},  // $0 [1,24,19]
               {"Conv", {"$0", "W3", "B3"}, {}},
               {"Relu", {"$1"}, {}},  // $2 [1,16,17]
               {"Conv", {"$0", "W4", "B4"}, {}},
               {"Relu", {"$3"}, {}},  // $4 [1,16,16]
               {"Conv", {"$0", "W5", "B5"}, {}},
               {"Relu", {"$5"}, {}},                              // $6 [1,32,15]
               {"GlobalMaxPool", {"$2"}, {}},                     // $7 [1,16,1]
               {"GlobalMaxPool", {"$4"}, {}},                     // $8
               {"GlobalMaxPool", {"$6"}, {}},                     // $9 [1,32,1]
               {"Concat", {"$7", "$8", "$9"}, {{"axis", I(1)}}},  // $10 [1,64,1]
               {"Flatten", {"$10"}, {}},                          // $11 [1,64]
               {"Gemm", {"$11", "G", "C"}, {{"transB", I(1)}}}};
    v.push_back(c);
  }
  {
    // A 3-D (video) convolution block: conv3d with BatchNormalization, maxpool3d, a 1x1x1 conv with a residual add,
    // average pool, global average pool; batch 2.
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label = "3-D conv block: conv 3x3x3, BN, relu, maxpool 1x2x2, 1x1x1 conv, add, relu, pad 0, avgpool, GAP, N=2";
    c.inputs = {in("X", {2, 3, 6, 12, 12}),
                in("W1", {16, 3, 3, 3, 3}, true, -0.3f, 0.3f),
                in("S1", {16}, true, 0.5f, 1.5f),
                in("T1", {16}, true),
                in("M1", {16}, true),
                in("V1", {16}, true, 0.5f, 2.f),
                in("W2", {16, 16, 1, 1, 1}, true, -0.3f, 0.3f),
                in("B2", {16}, true),
                in("W3", {32, 16, 3, 3, 3}, true, -0.1f, 0.1f),
                in("B3", {32}, true),
                in("PADS", {10}, true)};
    c.int64_constants = {{10, i64({0, 0, 0, 0, 0, 0, 0, 0, 0, 0})}};  // torch exports AvgPool3d behind a zero Pad
    c.chain = {{"Conv", {"X", "W1"}, {{"kernel_shape", Is({3, 3, 3})}, {"pads", Is({1, 1, 1, 1, 1, 1})}}},
               {"BatchNormalization", {"$0", "S1", "T1", "M1", "V1"}, {}},
               {"Relu", {"$1"}, {}},
               {"MaxPool", {"$2"}, {{"kernel_shape", Is({1, 2, 2})}, {"strides", Is({1, 2, 2})}}},
               {"Conv", {"$3", "W2", "B2"}, {}},
               {"Add", {"$4", "$3"}, {}},
               {"Relu", {"$5"}, {}},
               {"Conv",
                {"$6", "W3", "B3"},
                {{"kernel_shape", Is({3, 3, 3})}, {"strides", Is({2, 2, 2})}, {"pads", Is({1, 1, 1, 1, 1, 1})}}},
               {"Pad", {"$7", "PADS"}, {}},
               {"AveragePool", {"$8"}, {{"kernel_shape", Is({2, 2, 2})}, {"strides", Is({1, 1, 1})}}},
               {"GlobalAveragePool", {"$9"}, {}}};
    v.push_back(c);
  }
  {
    // TF/Keras exports: ZeroPadding2D (asymmetric, SAME made explicit) in front of a strided convolution, a max pool
    // over Relu output, an average pool without pads of its own, and a convolution with pads of its own; the oneDNN
    // device folds every Pad into its reader's padding (the chain is claimed whole: no Pad runs on its own).
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label = "zero Pads folded: asymmetric pad + conv 3x3 s2, relu, pad + maxpool, pad + avgpool, pad + padded conv";
    c.inputs = {in("X", {1, 8, 15, 17}), in("W1", {16, 8, 3, 3}, true, -0.3f, 0.3f),
                in("B1", {16}, true),    in("W2", {16, 16, 3, 3}, true, -0.2f, 0.2f),
                in("B2", {16}, true),    in("PA", {8}, true),
                in("PB", {8}, true),     in("PC", {8}, true),
                in("PD", {8}, true)};
    c.int64_constants = {{5, i64({0, 0, 0, 1, 0, 0, 1, 0})},
                         {6, i64({0, 0, 1, 1, 0, 0, 1, 1})},
                         {7, i64({0, 0, 1, 0, 0, 0, 0, 1})},
                         {8, i64({0, 0, 0, 2, 0, 0, 1, 0})}};
    c.chain = {{"Pad", {"X", "PA"}, {}},                                                               // $0 [1,8,16,18]
               {"Conv", {"$0", "W1", "B1"}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}}},  // [1,16,7,8]
               {"Relu", {"$1"}, {}},
               {"Pad", {"$2", "PB"}, {}},                                                     // $3 [1,16,9,10]
               {"MaxPool", {"$3"}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}}},  // $4 [1,16,4,4]
               {"Pad", {"$4", "PC"}, {}},                                                     // $5 [1,16,5,5]
               {"AveragePool", {"$5"}, {{"kernel_shape", Is({2, 2})}}},                       // $6 [1,16,4,4]
               {"Pad", {"$6", "PD"}, {}},                                                     // $7 [1,16,5,6]
               conv({"$7", "W2", "B2"}, 3, 1, 1)};                                            // $8 [1,16,5,6]
    v.push_back(c);
  }
  {
    // A -inf Pad in front of a max pool is its padding whatever the sign of the values; a 1-D Pad in front of a
    // Conv1d (lifted to 2-D with the convolution); both folded (claimed whole).
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label = "1-D zero Pad + conv1d, -inf Pad + maxpool1d over signed values";
    c.inputs = {in("X", {1, 6, 24}),
                in("W1", {16, 6, 3}, true, -0.3f, 0.3f),
                in("B1", {16}, true, -2.f, 0.f),
                in("PA", {6}, true),
                in("PB", {6}, true),
                scalar("NEG", -std::numeric_limits<float>::infinity())};
    c.int64_constants = {{3, i64({0, 0, 2, 0, 0, 1})}, {4, i64({0, 0, 1, 0, 0, 1})}};
    c.chain = {{"Pad", {"X", "PA"}, {}},                                                 // $0 [1,6,27]
               {"Conv", {"$0", "W1", "B1"}, {{"kernel_shape", Is({3})}}},                // $1 [1,16,25], mostly < 0
               {"Pad", {"$1", "PB", "NEG"}, {}},                                         // $2 [1,16,27]
               {"MaxPool", {"$2"}, {{"kernel_shape", Is({3})}, {"strides", Is({2})}}}};  // $3 [1,16,13]
    v.push_back(c);
  }
  {
    // Pads that are not their reader's padding stay Pads (a non-zero value before a convolution, reflect mode, a
    // zero Pad before a max pool over values that may be negative, before an average pool that does not count
    // its own pads): the results must still match.
    OpCase c;
    c.op = "Chain";
    c.label = "Pads not folded: value 0.5 + conv, reflect + conv, zero pad + maxpool over negatives, + avgpool";
    c.inputs = {in("X", {1, 8, 11, 12}),
                in("W1", {16, 8, 3, 3}, true, -0.3f, 0.3f),
                in("B1", {16}, true, -2.f, -1.f),
                in("W2", {16, 16, 3, 3}, true, -0.2f, 0.2f),
                in("B2", {16}, true),
                in("PA", {8}, true),
                scalar("HALF", 0.5f),
                in("PB", {8}, true)};
    c.int64_constants = {{5, i64({0, 0, 1, 0, 0, 0, 1, 2})}, {7, i64({0, 0, 1, 1, 0, 0, 0, 1})}};
    c.chain = {{"Pad", {"X", "PA", "HALF"}, {}},                                              // $0 [1,8,13,14]
               conv({"$0", "W1", "B1"}, 3, 1, 0),                                             // $1 [1,16,11,12] < 0
               {"Pad", {"$1", "PB"}, {}},                                                     // $2 [1,16,12,14]
               {"MaxPool", {"$2"}, {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}}},  // $3 [1,16,6,7]
               {"Pad", {"$3", "PB"}, {{"mode", S("reflect")}}},                               // $4 [1,16,7,9]
               conv({"$4", "W2", "B2"}, 3, 1, 0),                                             // $5 [1,16,5,7]
               {"Pad", {"$5", "PB"}, {}},                                                     // $6 [1,16,6,9]
               {"AveragePool", {"$6"}, {{"kernel_shape", Is({3, 3})}, {"pads", Is({1, 1, 1, 1})}}}};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Chain";
    c.label = "stem: conv 7x7 s2, relu, maxpool, global average pool, flatten, gemm";
    c.inputs = {in("X", {1, 3, 33, 31}), in("W", {16, 3, 7, 7}, true, -0.2f, 0.2f), in("B", {16}, true),
                in("G", {10, 16}, true), in("C", {10}, true)};
    c.chain = {conv({"X", "W", "B"}, 7, 2, 3),
               {"Relu", {"$0"}, {}},
               {"MaxPool", {"$1"}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}}},
               {"GlobalAveragePool", {"$2"}, {}},
               {"Flatten", {"$3"}, {}},
               {"Gemm", {"$4", "G", "C"}, {{"transB", I(1)}}}};
    v.push_back(c);
  }
  {
    // SqueezeNet 1.1's stem, smaller: conv 3->48 3x3 s2 without padding, relu, MaxPool 3x3 s2 ceil_mode (the last
    // window clipped), batch 2, as one fused step of the oneDNN device (onednn_convpool.h: 3 channel blocks; taken
    // for outputs over 1 MiB per image), read by a 1x1 convolution in nChw16c.
    OpCase c;
    c.op = "Chain";
    c.label = "fused stem: conv 3->48 3x3 s2, relu, maxpool 3x3 s2 ceil_mode, 1x1 conv, batch 2";
    c.inputs = {in("X", {2, 3, 150, 159}), in("W", {48, 3, 3, 3}, true, -0.3f, 0.3f), in("B", {48}, true),
                in("W2", {16, 48, 1, 1}, true, -0.3f, 0.3f)};
    c.chain = {conv({"X", "W", "B"}, 3, 2, 0),
               {"Relu", {"$0"}, {}},
               {"MaxPool", {"$1"}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"ceil_mode", I(1)}}},
               conv({"$2", "W2"}, 1, 1, 0)};
    v.push_back(c);
  }
  {
    // The fused stem without Relu (negative maxima), asymmetric convolution pads, a 5x3 kernel with strides 2x1
    // (border columns through the step's zero-padded source band), a one-channel image and a padded 2x3 MaxPool
    // with strides 2x1.
    OpCase c;
    c.op = "Chain";
    c.label = "fused stem: 1 channel, conv 5x3 s2x1 asymmetric pads, maxpool 2x3 s2x1 padded, no relu";
    c.inputs = {in("X", {1, 1, 255, 129}), in("W", {64, 1, 5, 3}, true, -0.5f, 0.5f), in("B", {64}, true)};
    c.chain = {
        {"Conv", {"X", "W", "B"}, {{"kernel_shape", Is({5, 3})}, {"strides", Is({2, 1})}, {"pads", Is({1, 2, 2, 0})}}},
        {"MaxPool", {"$0"}, {{"kernel_shape", Is({2, 3})}, {"strides", Is({2, 1})}, {"pads", Is({0, 1, 1, 1})}}}};
    v.push_back(c);
  }
  {
    // ResNet's and GoogLeNet's stem, smaller: conv 7x7 s2 pads 3 (the 7-tap tile, padded source bands at both
    // edges) over an odd-sized image, 80 channels (a group of four 16-channel blocks and one of one), Relu,
    // MaxPool 3x3 s2 pads 1, read by a 1x1 convolution: one fused step of the oneDNN device (1.9 MB per image).
    OpCase c;
    c.op = "Chain";
    c.label = "fused stem: conv 3->80 7x7 s2 pads 3, relu, maxpool 3x3 s2 pads 1, 1x1 conv";
    c.inputs = {in("X", {1, 3, 160, 147}), in("W", {80, 3, 7, 7}, true, -0.2f, 0.2f), in("B", {80}, true),
                in("W2", {16, 80, 1, 1}, true, -0.3f, 0.3f)};
    c.chain = {conv({"X", "W", "B"}, 7, 2, 3),
               {"Relu", {"$0"}, {}},
               {"MaxPool", {"$1"}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}}},
               conv({"$2", "W2"}, 1, 1, 0)};
    v.push_back(c);
  }
  {
    // A Flatten of a spatial [N,C,H,W] value read only by a Gemm (a small CNN's classifier): oneDNN may keep the
    // convolution's blocked layout and feed the Gemm with rows of B in that order.
    OpCase c;
    c.op = "Chain";
    c.label = "small cnn head: conv 32 channels, relu, maxpool, flatten, gemm transB, batch 2";
    c.inputs = {in("X", {2, 3, 12, 12}), in("W", {32, 3, 3, 3}, true, -0.3f, 0.3f), in("B", {32}, true),
                in("G", {10, 800}, true, -0.1f, 0.1f), in("C", {10}, true)};
    c.chain = {conv({"X", "W", "B"}, 3, 1, 0),
               {"Relu", {"$0"}, {}},
               {"MaxPool", {"$1"}, {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}}},
               {"Flatten", {"$2"}, {}},
               {"Gemm", {"$3", "G", "C"}, {{"transB", I(1)}}}};
    v.push_back(c);
  }
  {
    // A Linear head exported as MatMul + Add over a 3-D value (its rows collapsed into one product), 12 columns and
    // a K of 300 (18 vectors and a tail of 12): oneDNN's chains run such few-column products as their own step
    // (steps/narrow_gemm.h), as the small cnn heads' Gemms above and below.
    OpCase c;
    c.op = "Chain";
    c.label = "relu, matmul [2,3,300] x [300,12], add bias (a narrow product)";
    c.inputs = {in("X", {2, 3, 300}), in("W", {300, 12}, true, -0.1f, 0.1f), in("B", {12}, true)};
    c.chain = {{"Relu", {"X"}, {}}, {"MatMul", {"$0", "W"}, {}}, {"Add", {"$1", "B"}, {}}};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Chain";
    c.label = "strided conv 32->32 3x3 s2, flatten, gemm, batch 2";
    c.inputs = {in("X", {2, 32, 9, 9}), in("W", {32, 32, 3, 3}, true, -0.2f, 0.2f),
                in("G", {800, 7}, true, -0.1f, 0.1f)};
    c.chain = {conv({"X", "W"}, 3, 2, 1), {"Flatten", {"$0"}, {}}, {"Gemm", {"$1", "G"}, {}}};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.label = "mobilenet inverted residual C=16 expand 6, Clip(0,6) from constant inputs";
    c.inputs = {in("X", {1, 16, 10, 10}), in("WE", {96, 16, 1, 1}, true, -0.4f, 0.4f),
                in("BE", {96}, true),     in("WD", {96, 1, 3, 3}, true, -0.5f, 0.5f),
                in("BD", {96}, true),     in("WP", {16, 96, 1, 1}, true, -0.2f, 0.2f),
                in("BP", {16}, true),     scalar("LO", 0.f),
                scalar("HI", 6.f)};
    c.chain = {conv({"X", "WE", "BE"}, 1, 1, 0),      {"Clip", {"$0", "LO", "HI"}, {}},
               conv({"$1", "WD", "BD"}, 3, 1, 1, 96), {"Clip", {"$2", "LO", "HI"}, {}},
               conv({"$3", "WP", "BP"}, 1, 1, 0),     {"Add", {"X", "$4"}, {}}};
    v.push_back(c);
  }
  {
    // GoogLeNet's inception4a branch at 14x14: 1x1 reduce, 3x3 96->208 (13 channel blocks) + relu, concatenated in
    // place with a 1x1 branch. At 2+ threads the oneDNN device times Winograd against direct for this 3x3 when it
    // builds the plan (direct wins by about 2x here) and keeps the faster; both must match the reference.
    OpCase c;
    c.op = "Chain";
    c.label = "inception branch at 14x14: 3x3 96->208 (winograd or direct, timed), 1x1 branch, concat";
    c.inputs = {in("X", {1, 64, 14, 14}), in("WR", {96, 64, 1, 1}, true, -0.3f, 0.3f),
                in("BR", {96}, true),     in("W3", {208, 96, 3, 3}, true, -0.1f, 0.1f),
                in("B3", {208}, true),    in("W1", {32, 64, 1, 1}, true, -0.3f, 0.3f),
                in("B1", {32}, true)};
    c.chain = {conv({"X", "WR", "BR"}, 1, 1, 0),          {"Relu", {"$0"}, {}},
               conv({"$1", "W3", "B3"}, 3, 1, 1),         {"Relu", {"$2"}, {}},
               conv({"X", "W1", "B1"}, 1, 1, 0),          {"Relu", {"$4"}, {}},
               {"Concat", {"$3", "$5"}, {{"axis", I(1)}}}};
    v.push_back(c);
  }
  {
    // ResNet-50's layer1 3x3 (64->64 at 56x56) behind a 1x1, with a residual: oneDNN offers Winograd F(2,3) first
    // and F(4,3) second for it; the plan times them (onednn_conv_pick.h) and keeps the faster (F(4,3) with its own
    // weight layout, reordered at plan time); either must match the reference.
    OpCase c;
    c.op = "Chain";
    c.label = "resnet block at 56x56: 1x1, 3x3 64->64 (winograd F(2,3) or F(4,3), timed), 1x1, residual add";
    c.inputs = {in("X", {1, 64, 56, 56}), in("WA", {64, 64, 1, 1}, true, -0.3f, 0.3f),
                in("BA", {64}, true),     in("W3", {64, 64, 3, 3}, true, -0.1f, 0.1f),
                in("B3", {64}, true),     in("WB", {64, 64, 1, 1}, true, -0.3f, 0.3f),
                in("BB", {64}, true)};
    c.chain = {conv({"X", "WA", "BA"}, 1, 1, 0),
               {"Relu", {"$0"}, {}},
               conv({"$1", "W3", "B3"}, 3, 1, 1),
               {"Relu", {"$2"}, {}},
               conv({"$3", "WB", "BB"}, 1, 1, 0),
               {"Add", {"$4", "X"}, {}},
               {"Relu", {"$5"}, {}}};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Chain";
    c.label = "squeezenet fire: squeeze, two expands, concat, maxpool ceil_mode";
    c.inputs = {in("X", {1, 32, 13, 13}), in("WS", {16, 32, 1, 1}, true, -0.4f, 0.4f),
                in("BS", {16}, true),     in("W1", {32, 16, 1, 1}, true, -0.4f, 0.4f),
                in("B1", {32}, true),     in("W3", {32, 16, 3, 3}, true, -0.2f, 0.2f),
                in("B3", {32}, true)};
    c.chain = {conv({"X", "WS", "BS"}, 1, 1, 0),
               {"Relu", {"$0"}, {}},
               conv({"$1", "W1", "B1"}, 1, 1, 0),
               {"Relu", {"$2"}, {}},
               conv({"$1", "W3", "B3"}, 3, 1, 1),
               {"Relu", {"$4"}, {}},
               {"Concat", {"$3", "$5"}, {{"axis", I(1)}}},
               {"MaxPool", {"$6"}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"ceil_mode", I(1)}}}};
    v.push_back(c);
  }
  {
    // A fire module as the channel pruner leaves it, behind a 32-channel convolution (so its input is nChw16c, as
    // behind SqueezeNet's Concats): an 8-channel squeeze (kept nChw16c, padded), expands of 24 (not a multiple of
    // 16, so the Concat's second part starts at channel 24), a 3x3 expand reading 8 channels (oneDNN's jit kernels
    // take that only from plain memory; read as padded nChw16c it ran on ref:any, ~500x slower).
    OpCase c;
    c.op = "Chain";
    c.label = "pruned squeezenet fire: squeeze to 8, expands of 24 from 8, concat at channel 24, maxpool";
    c.inputs = {in("X", {1, 16, 15, 15}), in("W0", {32, 16, 1, 1}, true, -0.4f, 0.4f),
                in("B0", {32}, true),     in("WS", {8, 32, 1, 1}, true, -0.4f, 0.4f),
                in("BS", {8}, true),      in("W1", {24, 8, 1, 1}, true, -0.4f, 0.4f),
                in("B1", {24}, true),     in("W3", {24, 8, 3, 3}, true, -0.3f, 0.3f),
                in("B3", {24}, true),     in("WN", {16, 48, 1, 1}, true, -0.3f, 0.3f),
                in("BN", {16}, true)};
    c.chain = {conv({"X", "W0", "B0"}, 1, 1, 0),
               {"Relu", {"$0"}, {}},
               conv({"$1", "WS", "BS"}, 1, 1, 0),
               {"Relu", {"$2"}, {}},
               conv({"$3", "W1", "B1"}, 1, 1, 0),
               {"Relu", {"$4"}, {}},
               conv({"$3", "W3", "B3"}, 3, 1, 1),
               {"Relu", {"$6"}, {}},
               {"Concat", {"$5", "$7"}, {{"axis", I(1)}}},
               {"MaxPool", {"$8"}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"ceil_mode", I(1)}}},
               conv({"$9", "WN", "BN"}, 1, 1, 0),
               {"Relu", {"$10"}, {}}};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Chain";
    c.label = "pooling with activations after it: conv, maxpool, relu, average pool, SiLU";
    c.inputs = {in("X", {1, 8, 12, 12}), in("W", {16, 8, 3, 3}, true, -0.3f, 0.3f), in("B", {16}, true)};
    c.chain = {
        conv({"X", "W", "B"}, 3, 1, 1),
        {"MaxPool", {"$0"}, {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}}},
        {"Relu", {"$1"}, {}},
        {"AveragePool", {"$2"}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({1, 1})}, {"pads", Is({1, 1, 1, 1})}}},
        {"Sigmoid", {"$3"}, {}},
        {"Mul", {"$3", "$4"}, {}}};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Chain";
    c.label = "decoder: conv s2, relu, ConvTranspose s2 with BatchNormalization, relu, skip add";
    c.inputs = {in("X", {1, 16, 11, 11}),      in("W", {32, 16, 3, 3}, true, -0.3f, 0.3f),
                in("B", {32}, true),           in("WT", {32, 16, 3, 3}, true, -0.3f, 0.3f),
                in("BT", {16}, true),          in("S", {16}, true, 0.5f, 1.5f),
                in("T", {16}, true),           in("M", {16}, true),
                in("V", {16}, true, 0.5f, 2.f)};
    c.chain = {conv({"X", "W", "B"}, 3, 2, 1),  // [1,32,6,6]
               {"Relu", {"$0"}, {}},
               {"ConvTranspose",
                {"$1", "WT", "BT"},
                {{"kernel_shape", Is({3, 3})},
                 {"strides", Is({2, 2})},
                 {"pads", Is({1, 1, 1, 1})},
                 {"output_padding", Is({0, 0})}}},  // [1,16,11,11]
               {"BatchNormalization", {"$2", "S", "T", "M", "V"}, {}},
               {"Add", {"$3", "X"}, {}},
               {"Relu", {"$4"}, {}}};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Chain";
    c.label = "grouped ConvTranspose g=2 s2 output_padding 1, sigmoid, after a conv";
    c.inputs = {in("X", {1, 8, 7, 7}), in("W", {16, 8, 1, 1}, true, -0.4f, 0.4f),
                in("WT", {16, 4, 3, 3}, true, -0.3f, 0.3f)};
    c.chain = {conv({"X", "W"}, 1, 1, 0),
               {"ConvTranspose",
                {"$0", "WT"},
                {{"kernel_shape", Is({3, 3})},
                 {"strides", Is({2, 2})},
                 {"pads", Is({1, 1, 1, 1})},
                 {"output_padding", Is({1, 1})},
                 {"group", I(2)}}},  // [1,8,14,14]
               {"Sigmoid", {"$1"}, {}}};
    v.push_back(c);
  }
  // MobileNet-V2's 7x7 inverted residual (160 -> 960 -> depthwise -> 160, + the block's input): 1.2 MB of 1x1 weights,
  // which the cpu_onednn expand_dw step takes with the projection and each thread's rows at once (steps/expand_dw.h)
  // at 1 thread, and at 2 threads without the projection, its channel groups split.
  for (int threads : {1, 2}) {
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.threads = threads;
    c.concurrent_runs = 3;  // and three runs at once, from as many threads
    c.label = "mobilenet-v2 inverted residual 160->960->160 at 7x7 with its residual, " + std::to_string(threads) +
              (threads == 1 ? " thread" : " threads");
    c.inputs = {in("X", {1, 160, 7, 7}), in("WE", {960, 160, 1, 1}, true, -0.1f, 0.1f),
                in("BE", {960}, true),   in("WD", {960, 1, 3, 3}, true, -0.5f, 0.5f),
                in("BD", {960}, true),   in("WP", {160, 960, 1, 1}, true, -0.05f, 0.05f),
                in("BP", {160}, true),   scalar("LO", 0.f),
                scalar("HI", 6.f)};
    c.chain = {conv({"X", "WE", "BE"}, 1, 1, 0),       {"Clip", {"$0", "LO", "HI"}, {}},
               conv({"$1", "WD", "BD"}, 3, 1, 1, 960), {"Clip", {"$2", "LO", "HI"}, {}},
               conv({"$3", "WP", "BP"}, 1, 1, 0),      {"Add", {"$4", "X"}, {}}};
    v.push_back(c);
  }
  // MobileNet-V2's last 1x1 (320 -> 1280 at 7x7, ReLU6, 1.6 MB of weights): cpu_onednn's few-row product
  // (steps/skinny_gemm.h) with the Clip as its cap; the weights large enough that sums pass 6.
  {
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.label = "mobilenet-v2 last 1x1 320->1280 at 7x7 with ReLU6 (few-row product)";
    c.inputs = {in("X", {1, 320, 7, 7}, false, -1.f, 3.f), in("W", {1280, 320, 1, 1}, true, -0.3f, 0.3f),
                in("B", {1280}, true), scalar("LO", 0.f), scalar("HI", 6.f)};
    c.chain = {conv({"X", "W", "B"}, 1, 1, 0), {"Clip", {"$0", "LO", "HI"}, {}}};
    v.push_back(c);
  }
  // A residual read again after its Add: the sum's destination starts as a copy of it, made after the step's source
  // was bound, so the source must still count as live at the step (a source bound before the copy let the buffer plan
  // give the destination the source's memory: 5,534 of 8,192 outputs wrong for the Winograd case). One case per own
  // step that sums a residual: Winograd (3x3), the 1x1 step (cpu_onednn's at 1 thread), the few-row convolution and
  // matmul; and oneDNN's matmul, whose operands are bound the same way. (The convolutions failed with their sources
  // bound first; the two matmuls, whose plans placed source and destination apart, passed either way: they cover the
  // copy.)
  for (int kind = 0; kind < 5; ++kind) {
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    std::string op = "$0", res = "R";  // the product's output, the residual
    if (kind == 0) {
      c.label = "residual read again after its Add: 3x3 32->32 at 16x16 (Winograd)";
      c.inputs = {in("X", {1, 32, 16, 16}), in("W", {32, 32, 3, 3}, true, -0.2f, 0.2f), in("B", {32}, true),
                  in("R", {1, 32, 16, 16})};
      c.chain = {conv({"X", "W", "B"}, 3, 1, 1)};
    } else if (kind == 1) {
      c.label = "residual read again after its Add: 1x1 64->256 at 28x28, 1 thread";
      c.threads = 1;
      c.inputs = {in("X", {1, 64, 28, 28}), in("W", {256, 64, 1, 1}, true, -0.2f, 0.2f), in("B", {256}, true),
                  in("R", {1, 256, 28, 28})};
      c.chain = {conv({"X", "W", "B"}, 1, 1, 0)};
    } else if (kind == 2) {
      c.label = "residual read again after its Add: 1x1 512->1024 at 7x7 (few-row product)";
      c.inputs = {in("X", {1, 512, 7, 7}), in("W", {1024, 512, 1, 1}, true, -0.05f, 0.05f), in("B", {1024}, true),
                  in("R", {1, 1024, 7, 7})};
      c.chain = {conv({"X", "W", "B"}, 1, 1, 0)};
    } else {
      // The product's source an intermediate (a graph input is never the plan's memory), as large as its output; the
      // residual transposed, so that it takes a reorder before its copy. No Relu between the Adds: the few-row
      // product takes the sum alone.
      const int64_t k = kind == 3 ? 2048 : 96, n = kind == 3 ? 2048 : 96, m = kind == 3 ? 49 : 8;
      c.label = std::string("residual read again after its Add: MatMul [") + std::to_string(m) + "," +
                std::to_string(k) + "] x [" + std::to_string(k) + "," + std::to_string(n) + "] after a Relu" +
                (kind == 3 ? " (few-row product)" : " (oneDNN's matmul)");
      c.inputs = {in("X", {m, k}), in("W", {k, n}, true, -6.f / static_cast<float>(k), 6.f / static_cast<float>(k)),
                  in("RT", {n, m})};
      c.chain = {{"Relu", {"X"}, {}}, {"Transpose", {"RT"}, {{"perm", Is({1, 0})}}}, {"MatMul", {"$0", "W"}, {}}};
      op = "$2", res = "$1";
    }
    const int at = static_cast<int>(c.chain.size());  // the first Add's place in the chain
    c.chain.push_back({"Add", {op, res}, {}});
    if (kind < 3) c.chain.push_back({"Relu", {"$" + std::to_string(at)}, {}});
    c.chain.push_back({"Add", {"$" + std::to_string(static_cast<int>(c.chain.size()) - 1), res}, {}});
    v.push_back(c);
  }
  // 1x1 stride-1 convolutions, which cpu_onednn runs as its own step (steps/pointwise.h): a ResNet bottleneck's end
  // with its residual and Relu at 1 and 2 threads (three runs at once), a SqueezeNet squeeze over two 13x13 images at
  // 2 threads (tiles of 13 + 13 + ... pixels, one image after the other, split between the threads), and an odd number
  // of 16-channel output blocks with ReLU6 whose sums pass the cap.
  for (int threads : {1, 2}) {
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.threads = threads;
    c.concurrent_runs = 3;
    c.label = "resnet bottleneck end 1x1 64->256 at 28x28 + residual + relu, " + std::to_string(threads) +
              (threads == 1 ? " thread" : " threads") + " (own 1x1 step)";
    c.inputs = {in("X", {1, 64, 28, 28}), in("W", {256, 64, 1, 1}, true, -0.2f, 0.2f), in("B", {256}, true),
                in("R", {1, 256, 28, 28})};
    c.chain = {conv({"X", "W", "B"}, 1, 1, 0), {"Add", {"$0", "R"}, {}}, {"Relu", {"$1"}, {}}};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.threads = 2;
    c.label = "squeezenet squeeze 1x1 512->64 over two 13x13 images + relu, 2 threads (own 1x1 step)";
    c.inputs = {in("X", {2, 512, 13, 13}), in("W", {64, 512, 1, 1}, true, -0.1f, 0.1f), in("B", {64}, true)};
    c.chain = {conv({"X", "W", "B"}, 1, 1, 0), {"Relu", {"$0"}, {}}};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.threads = 1;
    c.label = "1x1 96->48 at 9x9 with ReLU6, 1 thread (own 1x1 step, a 16-wide last group)";
    c.inputs = {in("X", {1, 96, 9, 9}, false, -1.f, 3.f), in("W", {48, 96, 1, 1}, true, -0.5f, 0.5f),
                in("B", {48}, true), scalar("LO", 0.f), scalar("HI", 6.f)};
    c.chain = {conv({"X", "W", "B"}, 1, 1, 0), {"Clip", {"$0", "LO", "HI"}, {}}};
    v.push_back(c);
  }
  // A stride-2 inverted-residual head at MobileNet-V2's/EfficientNet's first expansion size (16 -> 96 at 112x112):
  // oneDNN may run the 3x3 depthwise convolution as a post-op of the 1x1 (the expanded tensor stays in cache). Clip
  // on both (MobileNet), then SiLU on both (EfficientNet), with BatchNormalization after the depthwise one.
  for (bool silu : {false, true}) {
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.label = std::string("inverted residual s2 16->96 at 112x112, depthwise 3x3 fused into the 1x1, ") +
              (silu ? "SiLU, BatchNormalization" : "Clip(0,6)");
    c.inputs = {in("X", {1, 16, 112, 112}),
                in("WE", {96, 16, 1, 1}, true, -0.4f, 0.4f),
                in("BE", {96}, true),
                in("WD", {96, 1, 3, 3}, true, -0.5f, 0.5f),
                in("BD", {96}, true),
                in("S", {96}, true, 0.5f, 1.5f),
                in("SH", {96}, true),
                in("MU", {96}, true),
                in("VAR", {96}, true, 0.5f, 2.f),
                scalar("LO", 0.f),
                scalar("HI", 6.f)};
    if (silu)
      c.chain = {conv({"X", "WE", "BE"}, 1, 1, 0),
                 {"Sigmoid", {"$0"}, {}},
                 {"Mul", {"$0", "$1"}, {}},
                 conv({"$2", "WD", "BD"}, 3, 2, 1, 96),
                 {"BatchNormalization", {"$3", "S", "SH", "MU", "VAR"}, {}},
                 {"Sigmoid", {"$4"}, {}},
                 {"Mul", {"$4", "$5"}, {}}};
    else
      c.chain = {conv({"X", "WE", "BE"}, 1, 1, 0),
                 {"Clip", {"$0", "LO", "HI"}, {}},
                 conv({"$1", "WD", "BD"}, 3, 2, 1, 96),
                 {"Clip", {"$2", "LO", "HI"}, {}}};
    v.push_back(c);
  }
  // EfficientNet's MBConv as torch exports it: SiLU as x * Sigmoid(x), a 5x5 depthwise convolution, squeeze-excite
  // (GlobalAveragePool, 1x1 conv, SiLU, 1x1 conv, Sigmoid, Mul broadcast over [N,C,1,1]), projection, residual.
  // E = 32 keeps nChw16c through the broadcast Mul; E = 24 takes the plain path.
  for (int64_t e : {32, 24}) {
    OpCase c;
    c.op = "Chain";
    c.label = "efficientnet mbconv C=16 expand " + std::to_string(e) + ", SiLU, depthwise 5x5, squeeze-excite";
    c.inputs = {in("X", {1, 16, 9, 9}), in("WE", {e, 16, 1, 1}, true, -0.4f, 0.4f),
                in("BE", {e}, true),    in("WD", {e, 1, 5, 5}, true, -0.3f, 0.3f),
                in("BD", {e}, true),    in("WS", {4, e, 1, 1}, true, -0.4f, 0.4f),
                in("BS", {4}, true),    in("WX", {e, 4, 1, 1}, true, -0.4f, 0.4f),
                in("BX", {e}, true),    in("WP", {16, e, 1, 1}, true, -0.2f, 0.2f),
                in("BP", {16}, true)};
    c.chain = {conv({"X", "WE", "BE"}, 1, 1, 0),     {"Sigmoid", {"$0"}, {}},  {"Mul", {"$0", "$1"}, {}},
               conv({"$2", "WD", "BD"}, 5, 1, 2, e), {"Sigmoid", {"$3"}, {}},  {"Mul", {"$4", "$3"}, {}},
               {"GlobalAveragePool", {"$5"}, {}},  // $6
               conv({"$6", "WS", "BS"}, 1, 1, 0),    {"Sigmoid", {"$7"}, {}},  {"Mul", {"$7", "$8"}, {}},
               conv({"$9", "WX", "BX"}, 1, 1, 0),    {"Sigmoid", {"$10"}, {}}, {"Mul", {"$5", "$11"}, {}},
               conv({"$12", "WP", "BP"}, 1, 1, 0),   {"Add", {"$13", "X"}, {}}};
    v.push_back(c);
  }
  // The oneDNN device's own depthwise + SiLU step (onednn_dwsilu.h) at batch 2: a 5x5 stride-2 depthwise convolution
  // over an even-sized image (its last tap column is padding) whose source is no convolution's (no SiLU deferred to
  // it), SiLU, the squeeze-excite pooling of its output computed by the same step, then a 3x3 stride-1 one whose
  // source SiLU is deferred from the 1x1 before it.
  {
    OpCase c;
    c.op = "Chain";
    c.label = "depthwise 5x5 s2 + SiLU + pooling at batch 2, then 1x1 + SiLU into depthwise 3x3 + SiLU";
    c.inputs = {in("X", {2, 32, 12, 10}),
                in("WD", {32, 1, 5, 5}, true, -0.3f, 0.3f),
                in("BD", {32}, true),
                in("WE", {32, 32, 1, 1}, true, -0.3f, 0.3f),
                in("WD2", {32, 1, 3, 3}, true, -0.4f, 0.4f),
                in("BD2", {32}, true)};
    c.chain = {conv({"X", "WD", "BD"}, 5, 2, 2, 32),
               {"Sigmoid", {"$0"}, {}},
               {"Mul", {"$0", "$1"}, {}},
               {"GlobalAveragePool", {"$2"}, {}},  // $3
               conv({"$2", "WE"}, 1, 1, 0),
               {"Sigmoid", {"$4"}, {}},
               {"Mul", {"$4", "$5"}, {}},
               conv({"$6", "WD2", "BD2"}, 3, 1, 1, 32),
               {"Sigmoid", {"$7"}, {}},
               {"Mul", {"$8", "$7"}, {}},
               {"Add", {"$9", "$3"}, {}}};
    v.push_back(c);
  }
  // SiLU as the chain's own pass after a convolution whose residual Add is a sum post-op, over 40 channels (nChw16c
  // padded to 48) at batch 2; the squeeze-excite GlobalAveragePool computed by that same pass (all batches and
  // channel blocks), then the excitation and the projection.
  {
    OpCase c;
    c.op = "Chain";
    c.label = "SiLU pass after conv + residual, fused squeeze-excite pooling, C=40 batch 2";
    c.inputs = {in("X", {2, 16, 10, 10}),
                in("W1", {40, 16, 3, 3}, true, -0.3f, 0.3f),
                in("B1", {40}, true),
                in("R", {2, 40, 10, 10}),
                in("WS", {10, 40, 1, 1}, true, -0.4f, 0.4f),
                in("BS", {10}, true),
                in("WX", {40, 10, 1, 1}, true, -0.4f, 0.4f),
                in("BX", {40}, true),
                in("WP", {16, 40, 1, 1}, true, -0.2f, 0.2f)};
    c.chain = {conv({"X", "W1", "B1"}, 3, 1, 1),  {"Add", {"$0", "R"}, {}}, {"Sigmoid", {"$1"}, {}},
               {"Mul", {"$1", "$2"}, {}},          // $3
               {"GlobalAveragePool", {"$3"}, {}},  // $4
               conv({"$4", "WS", "BS"}, 1, 1, 0), {"Sigmoid", {"$5"}, {}},  {"Mul", {"$5", "$6"}, {}},
               conv({"$7", "WX", "BX"}, 1, 1, 0), {"Sigmoid", {"$8"}, {}},  {"Mul", {"$3", "$9"}, {}},
               conv({"$10", "WP"}, 1, 1, 0)};
    v.push_back(c);
  }
  // Squeeze-excite with a wide excitation (32 -> 512: run as a vector-matrix product, reading the squeeze's nChw16c
  // output in place and writing plain [1,512,1,1], which the broadcast Mul reads).
  {
    OpCase c;
    c.op = "Chain";
    c.label = "squeeze-excite 512 -> 32 -> 512 (excitation as a matmul), Mul, projection";
    c.inputs = {in("X", {1, 64, 5, 5}), in("W0", {512, 64, 1, 1}, true, -0.2f, 0.2f),
                in("B0", {512}, true),  in("WS", {32, 512, 1, 1}, true, -0.1f, 0.1f),
                in("BS", {32}, true),   in("WX", {512, 32, 1, 1}, true, -0.3f, 0.3f),
                in("BX", {512}, true),  in("WP", {16, 512, 1, 1}, true, -0.1f, 0.1f)};
    c.chain = {conv({"X", "W0", "B0"}, 1, 1, 0),  {"Relu", {"$0"}, {}},                                // $1
               {"GlobalAveragePool", {"$1"}, {}},                                                      // $2
               conv({"$2", "WS", "BS"}, 1, 1, 0), {"Sigmoid", {"$3"}, {}}, {"Mul", {"$3", "$4"}, {}},  // $5
               conv({"$5", "WX", "BX"}, 1, 1, 0), {"Sigmoid", {"$6"}, {}}, {"Mul", {"$1", "$7"}, {}},
               conv({"$8", "WP"}, 1, 1, 0)};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Chain";
    c.label = "odd channels C=5->7->24, average pool, sigmoid, batch 2";
    c.inputs = {in("X", {2, 5, 9, 7}), in("W1", {7, 5, 3, 3}, true, -0.3f, 0.3f),
                in("W2", {24, 7, 3, 3}, true, -0.3f, 0.3f), in("B2", {24}, true)};
    c.chain = {conv({"X", "W1"}, 3, 1, 1),
               {"Relu", {"$0"}, {}},
               {"AveragePool", {"$1"}, {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}}},
               conv({"$2", "W2", "B2"}, 3, 1, 1),
               {"Sigmoid", {"$3"}, {}}};
    v.push_back(c);
  }
  {
    // Shape arithmetic on a claimed value (as torch exports q/k/v splits): the device folds Shape -> Gather ->
    // Add -> Div -> Mul into constants at session creation and slices by them.
    OpCase c;
    c.op = "Chain";
    c.label = "slices sized by shape arithmetic (Shape, Gather, Add, Div, Mul) on a matmul's output";
    c.inputs = {in("X", {1, 16, 32}),  in("W", {32, 96}, true, -0.3f, 0.3f),
                in("B", {96}, true),   in("IDX", {1}, true),
                in("TWO", {1}, true),  in("THREE", {1}, true),
                in("ZERO", {1}, true), in("AX", {1}, true)};
    c.int64_constants = {{3, i64({-1})}, {4, i64({2})}, {5, i64({3})}, {6, i64({0})}, {7, i64({-1})}};
    c.chain = {
        {"MatMul", {"X", "W"}, {}},                        // $0 [1,16,96]
        {"Add", {"$0", "B"}, {}},                          // $1
        {"Shape", {"$1"}, {}},                             // $2 [1,16,96]
        {"Gather", {"$2", "IDX"}, {{"axis", I(0)}}},       // $3 [96]
        {"Add", {"$3", "TWO"}, {}},                        // $4 98
        {"Div", {"$4", "THREE"}, {}},                      // $5 32
        {"Slice", {"$1", "ZERO", "$5", "AX"}, {}},         // $6 [1,16,32]
        {"Mul", {"$5", "TWO"}, {}},                        // $7 64
        {"Slice", {"$1", "$5", "$7", "AX"}, {}},           // $8 [1,16,32]
        {"Transpose", {"$8"}, {{"perm", Is({0, 2, 1})}}},  // $9 [1,32,16]
        {"MatMul", {"$6", "$9"}, {}},                      // $10 [1,16,16]
        {"Softmax", {"$10"}, {{"axis", I(-1)}}},           // $11
    };
    v.push_back(c);
  }
  {
    // Attention's heads joined again: the probabilities times V ([B,H,S,Dh]) read only by Transpose(0,2,1,3) and a
    // Reshape to [B,S,H*Dh] (oneDNN: the MatMul writes the transposed layout directly), then the out-projection.
    OpCase c;
    c.op = "Chain";
    c.claim_whole = true;
    c.label = "attention output: matmul into Transpose(0,2,1,3) and Reshape, out-projection, batch 2";
    c.inputs = {in("Q", {2, 4, 8, 16}),
                in("K", {2, 4, 16, 8}),
                in("V", {2, 4, 8, 16}),
                in("shp", {3}, true),
                in("WO", {64, 24}, true, -0.3f, 0.3f),
                scalar("SCALE", 4.f)};
    c.int64_constants = {{3, i64({2, 8, 64})}};
    c.chain = {{"MatMul", {"Q", "K"}, {}},                           // $0 [2,4,8,8]
               {"Div", {"$0", "SCALE"}, {}},                         // $1
               {"Softmax", {"$1"}, {{"axis", I(-1)}}},               // $2
               {"MatMul", {"$2", "V"}, {}},                          // $3 [2,4,8,16]
               {"Transpose", {"$3"}, {{"perm", Is({0, 2, 1, 3})}}},  // $4 [2,8,4,16]
               {"Reshape", {"$4", "shp"}, {}},                       // $5 [2,8,64]
               {"MatMul", {"$5", "WO"}, {}},                         // $6 [2,8,24]
               {"Relu", {"$6"}, {}}};
    v.push_back(c);
  }
  {
    // One post-norm encoder layer as torch.onnx exports nn.TransformerEncoderLayer (seq 16, 1 sequence, d 32,
    // 4 heads): in-projection, slices, head reshapes/transposes, scaled attention, out-projection, residual, the
    // decomposed LayerNorm, feed-forward with Relu, residual, LayerNorm.
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.label = "transformer encoder layer L=16 d=32 heads=4 ff=64";
    c.inputs = {in("X", {1, 16, 32}),
                in("WQKV", {32, 96}, true, -0.3f, 0.3f),
                in("BQKV", {96}, true),
                in("s0", {1}, true),
                in("s1", {1}, true),
                in("s2", {1}, true),
                in("s3", {1}, true),
                in("ax", {1}, true),
                in("shp", {3}, true),
                scalar("SCALE", 2.828427f),
                in("shp2", {2}, true),
                in("WO", {32, 32}, true, -0.3f, 0.3f),
                in("BO", {32}, true),
                in("shp3", {3}, true),
                scalar("TWO", 2.f),
                scalar("EPS", 1e-5f),
                in("G1", {32}, true, 0.5f, 1.5f),
                in("N1", {32}, true),
                in("W1", {32, 64}, true, -0.3f, 0.3f),
                in("B1", {64}, true),
                in("W2", {64, 32}, true, -0.2f, 0.2f),
                in("B2", {32}, true),
                in("G2", {32}, true, 0.5f, 1.5f),
                in("N2", {32}, true)};
    c.int64_constants = {{3, i64({0})},  {4, i64({32})},       {5, i64({64})},      {6, i64({96})},
                         {7, i64({-1})}, {8, i64({16, 4, 8})}, {10, i64({16, 32})}, {13, i64({16, 1, 32})}};
    auto perm = [](std::vector<int64_t> p) { return std::map<std::string, Attribute>{{"perm", Is(std::move(p))}}; };
    auto mean = std::map<std::string, Attribute>{{"axes", Is({-1})}};
    c.chain = {
        {"Transpose", {"X"}, perm({1, 0, 2})},              // $0 [16,1,32]
        {"MatMul", {"$0", "WQKV"}, {}},                     // $1 [16,1,96]
        {"Add", {"BQKV", "$1"}, {}},                        // $2
        {"Slice", {"$2", "s0", "s1", "ax"}, {}},            // $3 q
        {"Slice", {"$2", "s1", "s2", "ax"}, {}},            // $4 k
        {"Slice", {"$2", "s2", "s3", "ax"}, {}},            // $5 v
        {"Reshape", {"$3", "shp"}, {}},                     // $6 [16,4,8]
        {"Transpose", {"$6"}, perm({1, 0, 2})},             // $7 [4,16,8]
        {"Reshape", {"$4", "shp"}, {}},                     // $8
        {"Reshape", {"$5", "shp"}, {}},                     // $9
        {"Transpose", {"$9"}, perm({1, 0, 2})},             // $10 v [4,16,8]
        {"Div", {"$7", "SCALE"}, {}},                       // $11
        {"Transpose", {"$8"}, perm({1, 2, 0})},             // $12 kT [4,8,16]
        {"MatMul", {"$11", "$12"}, {}},                     // $13 [4,16,16]
        {"Softmax", {"$13"}, {{"axis", I(-1)}}},            // $14
        {"MatMul", {"$14", "$10"}, {}},                     // $15 [4,16,8]
        {"Transpose", {"$15"}, perm({1, 0, 2})},            // $16 [16,4,8]
        {"Reshape", {"$16", "shp2"}, {}},                   // $17 [16,32]
        {"Gemm", {"$17", "WO", "BO"}, {{"transB", I(1)}}},  // $18
        {"Reshape", {"$18", "shp3"}, {}},                   // $19 [16,1,32]
        {"Transpose", {"$19"}, perm({1, 0, 2})},            // $20 [1,16,32]
        {"Add", {"X", "$20"}, {}},                          // $21
        {"ReduceMean", {"$21"}, mean},                      // $22
        {"Sub", {"$21", "$22"}, {}},                        // $23
        {"Pow", {"$23", "TWO"}, {}},                        // $24
        {"ReduceMean", {"$24"}, mean},                      // $25
        {"Add", {"$25", "EPS"}, {}},                        // $26
        {"Sqrt", {"$26"}, {}},                              // $27
        {"Div", {"$23", "$27"}, {}},                        // $28
        {"Mul", {"$28", "G1"}, {}},                         // $29
        {"Add", {"$29", "N1"}, {}},                         // $30
        {"MatMul", {"$30", "W1"}, {}},                      // $31
        {"Add", {"B1", "$31"}, {}},                         // $32
        {"Relu", {"$32"}, {}},                              // $33
        {"MatMul", {"$33", "W2"}, {}},                      // $34
        {"Add", {"B2", "$34"}, {}},                         // $35
        {"Add", {"$30", "$35"}, {}},                        // $36
        {"ReduceMean", {"$36"}, mean},                      // $37
        {"Sub", {"$36", "$37"}, {}},                        // $38
        {"Pow", {"$38", "TWO"}, {}},                        // $39
        {"ReduceMean", {"$39"}, mean},                      // $40
        {"Add", {"$40", "EPS"}, {}},                        // $41
        {"Sqrt", {"$41"}, {}},                              // $42
        {"Div", {"$38", "$42"}, {}},                        // $43
        {"Mul", {"$43", "G2"}, {}},                         // $44
        {"Add", {"$44", "N2"}, {}},                         // $45
    };
    v.push_back(c);
  }
  {
    // The element-wise and reduction ops of decomposed normalisations, without the passes' fusion: an RMSNorm as
    // exported (Pow 2 of values of both signs, ReduceMean keepdims 1, Add eps, Sqrt, Div by the broadcast [.., 1]
    // value, Mul gamma), then a mean over the middle axis with keepdims 0, Relu, Pow 0.5, a product.
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.label = "decomposed RMSNorm + ReduceMean(axis 1, keepdims 0) + Pow 0.5 L=6 d=24";
    c.inputs = {in("X", {2, 6, 40}),
                in("W", {40, 24}, true, -0.3f, 0.3f),
                scalar("TWO", 2.f),
                scalar("EPS", 1e-5f),
                in("G", {24}, true, 0.5f, 1.5f),
                scalar("HALF", 0.5f),
                in("W2", {24, 8}, true, -0.3f, 0.3f)};
    c.chain = {
        {"MatMul", {"X", "W"}, {}},                                       // $0 [2,6,24]
        {"Pow", {"$0", "TWO"}, {}},                                       // $1
        {"ReduceMean", {"$1"}, {{"axes", Is({-1})}}},                     // $2 [2,6,1]
        {"Add", {"$2", "EPS"}, {}},                                       // $3
        {"Sqrt", {"$3"}, {}},                                             // $4
        {"Div", {"$0", "$4"}, {}},                                        // $5
        {"Mul", {"$5", "G"}, {}},                                         // $6
        {"ReduceMean", {"$6"}, {{"axes", Is({1})}, {"keepdims", I(0)}}},  // $7 [2,24]
        {"Relu", {"$7"}, {}},                                             // $8
        {"Pow", {"$8", "HALF"}, {}},                                      // $9
        {"MatMul", {"$9", "W2"}, {}},                                     // $10 [2,8]
    };
    v.push_back(c);
  }
  // An MLP as ConvNeXt and transformer encoders have it: MatMul + bias + GELU (keel.Gelu, what fuse_gelu makes),
  // MatMul + bias + the residual. The oneDNN chain runs the GELU as its own pass after the product (steps/gelu.h):
  // one output under 128 KiB (one thread), one above (split over the team), one whose length is no multiple of 16.
  // Each also with GELU's tanh approximation (the chain's tanh pass).
  for (const auto& [rows, c, hidden, tanh] : {std::tuple<int64_t, int64_t, int64_t, bool>{49, 64, 256, false},
                                              {392, 96, 384, false},
                                              {7, 40, 37, false},
                                              {49, 64, 256, true},
                                              {392, 96, 384, true},
                                              {7, 40, 37, true}}) {
    OpCase c_;
    c_.op = "Chain";
    c_.label = std::string("MLP matmul + bias + keel.Gelu") + (tanh ? " (tanh)" : "") + " + matmul + residual, [" +
               std::to_string(rows) + "," + std::to_string(c) + "] hidden " + std::to_string(hidden);
    c_.inputs = {in("X", {1, rows, c}, false, -2.f, 2.f), in("W1", {c, hidden}, true, -0.3f, 0.3f),
                 in("B1", {hidden}, true), in("W2", {hidden, c}, true, -0.3f, 0.3f), in("B2", {c}, true)};
    c_.chain = {
        {"MatMul", {"X", "W1"}, {}},  // $0 [1,rows,hidden]
        {"Add", {"$0", "B1"}, {}},    // $1
        {"keel.Gelu",
         {"$1"},
         tanh ? std::map<std::string, Attribute>{{"approximate", S("tanh")}}
              : std::map<std::string, Attribute>{}},  // $2
        {"MatMul", {"$2", "W2"}, {}},                 // $3 [1,rows,c]
        {"Add", {"$3", "B2"}, {}},                    // $4
        {"Add", {"X", "$4"}, {}},                     // $5
    };
    v.push_back(c_);
  }
  {
    // Convolutions followed by GELU (timm's ConvNeXt with conv_mlp, conv stems): the oneDNN chain runs the GELU as its
    // own pass after each convolution path that can take it, and keeps it a post-op where the path cannot (grouped
    // 4-channel step, a 1x1 with its depthwise consumer fused).
    OpCase c;
    c.op = "Chain";
    c.label = "conv + keel.Gelu on every conv path: 3x3, 1x1, 1x1 into depthwise, 4-channel groups, 1x1 over [1,C,1,1]";
    c.inputs = {in("X", {1, 16, 14, 14}, false, -2.f, 2.f),
                in("W0", {32, 16, 3, 3}, true, -0.3f, 0.3f),
                in("B0", {32}, true),
                in("W1", {64, 32, 1, 1}, true, -0.3f, 0.3f),
                in("B1", {64}, true),
                in("WD", {64, 1, 3, 3}, true, -0.3f, 0.3f),
                in("WG", {64, 4, 3, 3}, true, -0.3f, 0.3f),
                in("WS", {48, 64, 1, 1}, true, -0.3f, 0.3f),
                in("BS", {48}, true)};
    c.chain = {
        {"Conv", {"X", "W0", "B0"}, {{"kernel_shape", Is({3, 3})}, {"pads", Is({1, 1, 1, 1})}}},  // $0 [1,32,14,14]
        {"keel.Gelu", {"$0"}, {}},                                                                // $1
        {"Conv", {"$1", "W1", "B1"}, {{"kernel_shape", Is({1, 1})}}},                             // $2 [1,64,14,14]
        {"keel.Gelu", {"$2"}, {}},                                                                // $3
        {"Conv", {"$3", "WD"}, {{"kernel_shape", Is({3, 3})}, {"pads", Is({1, 1, 1, 1})}, {"group", I(64)}}},  // $4
        {"keel.Gelu", {"$4"}, {}},                                                                             // $5
        {"Conv", {"$5", "WG"}, {{"kernel_shape", Is({3, 3})}, {"pads", Is({1, 1, 1, 1})}, {"group", I(16)}}},  // $6
        {"keel.Gelu", {"$6"}, {}},                                                                             // $7
        {"GlobalAveragePool", {"$7"}, {}},                             // $8 [1,64,1,1]
        {"Conv", {"$8", "WS", "BS"}, {{"kernel_shape", Is({1, 1})}}},  // $9 [1,48,1,1]
        {"keel.Gelu", {"$9"}, {}},                                     // $10
    };
    v.push_back(c);
  }
  {
    // A product's post-ops past views of size-1 dims (the oneDNN chain's fuse_after): torch's out-projection
    // [S,E] -> Reshape [S,1,E] -> Transpose(1,0,2) [1,S,E], then the residual Add (a sum post-op written over the
    // residual, whose buffer also holds the Transpose view an earlier product read) and Relu; then a Transpose that
    // moves non-1 dims before an Add (must stay a step), and a Reshape with nothing fused after it.
    OpCase c;
    c.op = "Chain";
    c.label = "matmul post-ops through Reshape/Transpose of size-1 dims: bias, residual sum, relu";
    c.inputs = {in("X", {1, 16, 32}),
                in("W", {32, 32}, true, -0.3f, 0.3f),
                in("B", {32}, true),
                in("s2", {2}, true),
                in("s3", {3}, true),
                in("W2", {32, 16}, true, -0.3f, 0.3f),
                in("Y", {1, 16, 16}),
                in("W3", {16, 32}, true, -0.3f, 0.3f),
                in("W4", {32, 8}, true, -0.3f, 0.3f),
                in("W0", {32, 32}, true, -0.3f, 0.3f)};
    c.int64_constants = {{3, i64({16, 32})}, {4, i64({16, 1, 32})}};
    auto perm = [](std::vector<int64_t> p) { return std::map<std::string, Attribute>{{"perm", Is(std::move(p))}}; };
    c.chain = {
        {"Relu", {"X"}, {}},                      // $0 [1,16,32] the residual
        {"Transpose", {"$0"}, perm({1, 0, 2})},   // $1 [16,1,32] a view in $0's buffer
        {"Reshape", {"$1", "s2"}, {}},            // $2 [16,32]
        {"MatMul", {"$2", "W0"}, {}},             // $3 [16,32] (the in-projection: reads the view)
        {"Relu", {"$3"}, {}},                     // $4
        {"MatMul", {"$4", "W"}, {}},              // $5 [16,32] (the out-projection)
        {"Add", {"$5", "B"}, {}},                 // $6 bias
        {"Reshape", {"$6", "s3"}, {}},            // $7 [16,1,32]
        {"Transpose", {"$7"}, perm({1, 0, 2})},   // $8 [1,16,32]
        {"Add", {"$0", "$8"}, {}},                // $9 residual: a sum post-op, written over $0
        {"Relu", {"$9"}, {}},                     // $10
        {"MatMul", {"$10", "W2"}, {}},            // $11 [1,16,16]
        {"Transpose", {"$11"}, perm({0, 2, 1})},  // $12 moves the 16s: no post-op past it
        {"Add", {"$12", "Y"}, {}},                // $13
        {"MatMul", {"$13", "W3"}, {}},            // $14 [1,16,32]
        {"Reshape", {"$14", "s2"}, {}},           // $15 [16,32], nothing fused after it
        {"MatMul", {"$15", "W4"}, {}},            // $16 [16,8]
    };
    v.push_back(c);
  }
  {
    // As above, the product reading a view of its own residual: the sum post-op must not write over that buffer.
    OpCase c;
    c.op = "Chain";
    c.label = "matmul residual sum through Reshape/Transpose views, its source a view of the residual";
    c.inputs = {in("X", {1, 64, 256}), in("W", {256, 256}, true, -0.1f, 0.1f), in("s2", {2}, true),
                in("s3", {3}, true)};
    c.int64_constants = {{2, i64({64, 256})}, {3, i64({64, 1, 256})}};
    auto perm = [](std::vector<int64_t> p) { return std::map<std::string, Attribute>{{"perm", Is(std::move(p))}}; };
    c.chain = {
        {"Relu", {"X"}, {}},                     // $0 [1,64,256] the residual
        {"Transpose", {"$0"}, perm({1, 0, 2})},  // $1 [64,1,256] a view in $0's buffer
        {"Reshape", {"$1", "s2"}, {}},           // $2 [64,256]
        {"MatMul", {"$2", "W"}, {}},             // $3 [64,256]
        {"Reshape", {"$3", "s3"}, {}},           // $4 [64,1,256]
        {"Transpose", {"$4"}, perm({1, 0, 2})},  // $5 [1,64,256]
        {"Add", {"$0", "$5"}, {}},               // $6 a sum post-op, into a copy of $0
    };
    v.push_back(c);
  }
  {
    // A BERT-style feed-forward block after the fusion passes (opset 13: keel.Gelu, keel.LayerNormalization):
    // MatMul + bias + Gelu, MatMul + bias, residual, LayerNorm; claimed whole, Gelu a post-op of its MatMul.
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.label = "keel.Gelu feed-forward + keel.LayerNormalization L=24 d=48 ff=96";
    c.inputs = {in("X", {1, 24, 48}), in("W1", {48, 96}, true, -0.3f, 0.3f),
                in("B1", {96}, true), in("W2", {96, 48}, true, -0.2f, 0.2f),
                in("B2", {48}, true), in("G", {48}, true, 0.5f, 1.5f),
                in("N", {48}, true)};
    c.chain = {
        {"MatMul", {"X", "W1"}, {}},                                       // $0
        {"Add", {"$0", "B1"}, {}},                                         // $1
        {"keel.Gelu", {"$1"}, {}},                                         // $2
        {"MatMul", {"$2", "W2"}, {}},                                      // $3
        {"Add", {"$3", "B2"}, {}},                                         // $4
        {"Add", {"X", "$4"}, {}},                                          // $5
        {"keel.LayerNormalization", {"$5", "G", "N"}, {{"axis", I(-1)}}},  // $6
    };
    v.push_back(c);
  }
  {
    // ResNeXt's bottleneck: a 3x3 convolution in 8 groups of 4 channels (oneDNN's jit kernel only in a layout
    // blocked by 4 or 8 of its own choice; nChw16c or plain get ref or gemm) between 1x1s in nChw16c, the second with
    // the residual sum; then RegNet's 8 channels per group with stride 2.
    OpCase c;
    c.op = "Chain";
    c.label = "resnext bottleneck: grouped 3x3 with 4 and 8 channels per group, residual, stride 2";
    c.inputs = {in("X", {1, 32, 12, 12}), in("W0", {32, 32, 1, 1}, true, -0.4f, 0.4f),
                in("B0", {32}, true),     in("WG", {32, 4, 3, 3}, true, -0.4f, 0.4f),
                in("BG", {32}, true),     in("W2", {32, 32, 1, 1}, true, -0.3f, 0.3f),
                in("B2", {32}, true),     in("WS", {48, 8, 3, 3}, true, -0.4f, 0.4f),
                in("BS", {48}, true),     in("W3", {16, 48, 1, 1}, true, -0.3f, 0.3f)};
    c.chain = {conv({"X", "W0", "B0"}, 1, 1, 0),     {"Relu", {"$0"}, {}},  // $1
               conv({"$1", "WG", "BG"}, 3, 1, 1, 8), {"Relu", {"$2"}, {}},  // $3: 8 groups of 4
               conv({"$3", "W2", "B2"}, 1, 1, 0),    {"Add", {"$4", "X"}, {}}, {"Relu", {"$5"}, {}},  // $6
               conv({"$6", "WS", "BS"}, 3, 2, 1, 4), {"Relu", {"$7"}, {}},  // $8: 4 groups of 8 -> 12 each
               conv({"$8", "W3"}, 1, 1, 0)};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // Grouped 3x3s of 4 channels per group run as the oneDNN device's own step (onednn_grouped.h) over nChw16c:
    // stride 2 with odd sizes, no Relu (negative outputs), batch 2, BatchNormalization folded, read by a 1x1.
    OpCase c;
    c.op = "Chain";
    c.label = "grouped 3x3 in groups of 4 as an own step: stride 2, odd sizes, no relu, batch norm, batch 2";
    c.inputs = {in("X", {2, 32, 13, 11}),
                in("W0", {32, 32, 1, 1}, true, -0.3f, 0.3f),
                in("WG", {32, 4, 3, 3}, true, -0.4f, 0.4f),
                in("S", {32}, true, 0.5f, 1.5f),
                in("T", {32}, true),
                in("MU", {32}, true),
                in("VAR", {32}, true, 0.5f, 2.f),
                in("W2", {16, 32, 1, 1}, true, -0.3f, 0.3f)};
    c.chain = {conv({"X", "W0"}, 1, 1, 0),
               conv({"$0", "WG"}, 3, 2, 1, 8),
               {"BatchNormalization", {"$1", "S", "T", "MU", "VAR"}, {}},
               conv({"$2", "W2"}, 1, 1, 0)};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // Grouped 3x3s of 8 and 4 channels per group run merged into 16-channel groups with block-diagonal weights
    // (plugins/cpu_onednn/chain/ops/conv.cc, conv()): 6 groups of 8 at stride 2 (merged into 3), 12 groups of 4 (on the
    // f32 device the own step of onednn_grouped.h; merged into 3 in bf16), and 3 groups of 8 over 24 channels (not a
    // whole number of merged groups: left as it is), in nChw16c between 1x1s.
    OpCase c;
    c.op = "Chain";
    c.label = "grouped 3x3 merged into 16-channel groups: 8 and 4 channels per group, stride 2, odd group count";
    c.inputs = {in("X", {1, 48, 11, 11}),
                in("W0", {48, 48, 1, 1}, true, -0.3f, 0.3f),
                in("B0", {48}, true),
                in("WA", {48, 8, 3, 3}, true, -0.4f, 0.4f),
                in("BA", {48}, true),
                in("WB", {48, 4, 3, 3}, true, -0.4f, 0.4f),
                in("W2", {24, 48, 1, 1}, true, -0.3f, 0.3f),
                in("B2", {24}, true),
                in("WC", {24, 8, 3, 3}, true, -0.4f, 0.4f),
                in("BC", {24}, true)};
    c.chain = {conv({"X", "W0", "B0"}, 1, 1, 0),     {"Relu", {"$0"}, {}},  // $1
               conv({"$1", "WA", "BA"}, 3, 2, 1, 6), {"Relu", {"$2"}, {}},  // $3: 6 groups of 8, stride 2
               conv({"$3", "WB"}, 3, 1, 1, 12),      {"Relu", {"$4"}, {}},  // $5: 12 groups of 4, no bias
               conv({"$5", "W2", "B2"}, 1, 1, 0),    {"Relu", {"$6"}, {}},  // $7
               conv({"$7", "WC", "BC"}, 3, 1, 1, 3)};                       // 3 groups of 8
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // Two ConvNeXt blocks: a 7x7 depthwise convolution (oneDNN's jit kernels want source and destination alike:
    // nChw16c from plain input, nhwc in the second block), permute to channels-last, LayerNorm over channels, two
    // Linear layers with Gelu between, permute back (an nhwc view), the per-channel layer scale and the residual read
    // in nhwc; claimed whole.
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.label = "convnext blocks: depthwise 7x7, permute, LayerNorm over channels, MLP, layer scale, residual C=32";
    c.inputs = {in("X", {1, 32, 9, 11})};
    const Attribute to_last = Is({0, 2, 3, 1}), to_first = Is({0, 3, 1, 2});
    c.chain = {};
    std::string x = "X";
    for (int b = 0; b < 2; ++b) {
      const std::string k = std::to_string(b);
      c.inputs.push_back(in("WD" + k, {32, 1, 7, 7}, true, -0.3f, 0.3f));
      c.inputs.push_back(in("BD" + k, {32}, true));
      c.inputs.push_back(in("G" + k, {32}, true, 0.5f, 1.5f));
      c.inputs.push_back(in("N" + k, {32}, true));
      c.inputs.push_back(in("W1" + k, {32, 64}, true, -0.3f, 0.3f));
      c.inputs.push_back(in("B1" + k, {64}, true));
      c.inputs.push_back(in("W2" + k, {64, 32}, true, -0.2f, 0.2f));
      c.inputs.push_back(in("B2" + k, {32}, true));
      c.inputs.push_back(in("LS" + k, {32, 1, 1}, true, 0.1f, 0.5f));
      const size_t at = c.chain.size();
      auto ref = [&](size_t j) { return "$" + std::to_string(at + j); };
      c.chain.push_back(conv({x, "WD" + k, "BD" + k}, 7, 1, 3, 32));                                  // 0
      c.chain.push_back({"Transpose", {ref(0)}, {{"perm", to_last}}});                                // 1
      c.chain.push_back({"keel.LayerNormalization", {ref(1), "G" + k, "N" + k}, {{"axis", I(-1)}}});  // 2
      c.chain.push_back({"MatMul", {ref(2), "W1" + k}, {}});                                          // 3
      c.chain.push_back({"Add", {ref(3), "B1" + k}, {}});                                             // 4
      c.chain.push_back({"keel.Gelu", {ref(4)}, {}});                                                 // 5
      c.chain.push_back({"MatMul", {ref(5), "W2" + k}, {}});                                          // 6
      c.chain.push_back({"Add", {ref(6), "B2" + k}, {}});                                             // 7
      c.chain.push_back({"Transpose", {ref(7)}, {{"perm", to_first}}});                               // 8
      c.chain.push_back({"Mul", {ref(8), "LS" + k}, {}});                                             // 9
      c.chain.push_back({"Add", {x, ref(9)}, {}});                                                    // 10
      x = ref(10);
    }
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // Per-column factors after a product fold into its constant weights (chain/fusion.cc, fuse_after): a Gemm with
    // transposed B and its bias C, a scalar Mul (which scales C too), a [N] scale written constant-first, then Relu;
    // a MatMul with a [1,N] scale and a residual Add.
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.label =
        "matmul scales folded into the weights: Gemm transB + C + scalar + column scale, MatMul + scale + residual";
    c.inputs = {in("X", {6, 20}),
                in("WT", {12, 20}, true, -0.3f, 0.3f),
                in("C", {12}, true),
                in("K", {1}, true, 1.5f, 2.5f),
                in("S1", {12}, true, -1.5f, 1.5f),
                in("W2", {12, 8}, true, -0.3f, 0.3f),
                in("S2", {1, 8}, true, 0.5f, 2.f),
                in("W3", {20, 8}, true, -0.3f, 0.3f)};
    c.chain = {{"Gemm", {"X", "WT", "C"}, {{"transB", I(1)}}},  // $0
               {"Mul", {"$0", "K"}, {}},                        // $1
               {"Mul", {"S1", "$1"}, {}},                       // $2
               {"Relu", {"$2"}, {}},                            // $3
               {"MatMul", {"X", "W3"}, {}},                     // $4
               {"MatMul", {"$3", "W2"}, {}},                    // $5
               {"Mul", {"$5", "S2"}, {}},                       // $6
               {"Add", {"$6", "$4"}, {}}};                      // $7
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // A product permuted from [N,H,W,C] to [N,C,H,W] takes a [C,1,1] bias, a [1,C,1,1] scale (folded into its
    // weights) and a residual in plain NCHW (copied into the product's layout) as post-ops; a second one reads the
    // first's output through its strides and takes it as its residual in place.
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.label = "matmul permuted to NCHW: bias, scale and residual after the Transpose, twice, batch 2";
    c.inputs = {in("Y", {2, 3, 5, 16}),
                in("W4", {16, 16}, true, -0.3f, 0.3f),
                in("B4", {16, 1, 1}, true),
                in("S4", {1, 16, 1, 1}, true, 0.1f, 0.5f),
                in("R", {2, 16, 3, 5}),
                in("W5", {16, 16}, true, -0.3f, 0.3f),
                in("S5", {16, 1, 1}, true, 0.1f, 0.5f)};
    const Attribute to_last = Is({0, 2, 3, 1}), to_first = Is({0, 3, 1, 2});
    c.chain = {{"MatMul", {"Y", "W4"}, {}},                  // $0
               {"Transpose", {"$0"}, {{"perm", to_first}}},  // $1
               {"Add", {"$1", "B4"}, {}},                    // $2
               {"Mul", {"$2", "S4"}, {}},                    // $3
               {"Add", {"R", "$3"}, {}},                     // $4
               {"Transpose", {"$4"}, {{"perm", to_last}}},   // $5
               {"MatMul", {"$5", "W5"}, {}},                 // $6
               {"Transpose", {"$6"}, {{"perm", to_first}}},  // $7
               {"Mul", {"S5", "$7"}, {}},                    // $8
               {"Add", {"$8", "$4"}, {}}};                   // $9
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // A permuted product squeezed to 3-D before its residual Add: the fusion must not follow the Squeeze as a view of
    // plain memory after the permute (the Add stays a step of its own, reading the permuted view).
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.label = "matmul permuted to NCHW then squeezed: the residual Add after the Squeeze";
    c.inputs = {in("Y", {1, 3, 5, 16}), in("W", {16, 16}, true, -0.3f, 0.3f), in("R", {16, 3, 5})};
    c.chain = {{"MatMul", {"Y", "W"}, {}},                           // $0
               {"Transpose", {"$0"}, {{"perm", Is({0, 3, 1, 2})}}},  // $1
               {"Squeeze", {"$1"}, {}},                              // $2
               {"Add", {"$2", "R"}, {}}};                            // $3
    v.push_back(c);
  }
  {
    // A DenseNet block: each layer (BatchNormalization, Relu, 1x1, BatchNormalization, Relu, 3x3 to 16 channels)
    // reads the Concat of the block input and every feature before it (a 1-input Concat first); the Concats are
    // views of one buffer each feature is written into once. A transition (1x1, average pool) after the block's last
    // Concat.
    OpCase c;
    c.op = "Chain";
    c.label = "densenet block: 3 layers of growth 16 over Concat prefixes, transition";
    c.inputs = {in("X", {1, 8, 10, 10}), in("W0", {32, 8, 3, 3}, true, -0.3f, 0.3f)};
    c.chain = {conv({"X", "W0"}, 3, 1, 1), {"Relu", {"$0"}, {}}};  // $1: the block input, 32 channels
    std::vector<std::string> feats{"$1"};
    for (int l = 0; l < 3; ++l) {
      const std::string k = std::to_string(l);
      const int64_t C = 32 + 16 * l;
      for (const char* p : {"S", "T", "M", "V"})
        c.inputs.push_back(in(p + k + "a", {C}, true, p[0] == 'V' || p[0] == 'S' ? 0.5f : -0.5f, 1.5f));
      for (const char* p : {"S", "T", "M", "V"})
        c.inputs.push_back(in(p + k + "b", {32}, true, p[0] == 'V' || p[0] == 'S' ? 0.5f : -0.5f, 1.5f));
      c.inputs.push_back(in("WA" + k, {32, C, 1, 1}, true, -0.3f, 0.3f));
      c.inputs.push_back(in("WB" + k, {16, 32, 3, 3}, true, -0.2f, 0.2f));
      auto ref = [&](size_t j) { return "$" + std::to_string(j); };
      c.chain.push_back({"Concat", feats, {{"axis", I(1)}}});  // the first: torch.cat of one tensor
      const std::string x = ref(c.chain.size() - 1);
      c.chain.push_back({"BatchNormalization", {x, "S" + k + "a", "T" + k + "a", "M" + k + "a", "V" + k + "a"}, {}});
      c.chain.push_back({"Relu", {ref(c.chain.size() - 1)}, {}});
      c.chain.push_back(conv({ref(c.chain.size() - 1), "WA" + k}, 1, 1, 0));
      c.chain.push_back({"BatchNormalization",
                         {ref(c.chain.size() - 1), "S" + k + "b", "T" + k + "b", "M" + k + "b", "V" + k + "b"},
                         {}});
      c.chain.push_back({"Relu", {ref(c.chain.size() - 1)}, {}});
      c.chain.push_back(conv({ref(c.chain.size() - 1), "WB" + k}, 3, 1, 1));
      feats.push_back(ref(c.chain.size() - 1));
    }
    c.chain.push_back({"Concat", feats, {{"axis", I(1)}}});  // [1,80,10,10]
    c.inputs.push_back(in("WT", {32, 80, 1, 1}, true, -0.2f, 0.2f));
    c.chain.push_back(conv({"$" + std::to_string(c.chain.size() - 1), "WT"}, 1, 1, 0));
    c.chain.push_back({"AveragePool",
                       {"$" + std::to_string(c.chain.size() - 1)},
                       {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}}});
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // Two ShuffleNet-V2 units at batch 2 with 24-channel halves (partial nChw16c blocks): the channel split as
    // Slices, the second half through 1x1 / depthwise 3x3 / 1x1, Concat of the untouched half (a strided view) and
    // the branch (nChw16c), each reordered straight into its slice of the output; then the channel shuffle as
    // Reshape [N,2,24,H,W], Transpose(0,2,1,3,4), Reshape back.
    OpCase c;
    c.op = "Chain";
    c.label = "shufflenet units: split by Slice, branch, Concat of a view and nChw16c, channel shuffle, batch 2";
    c.inputs = {in("X", {2, 8, 9, 9}), in("W0", {48, 8, 3, 3}, true, -0.3f, 0.3f),
                in("ST", {1}, true),   in("MID", {1}, true),
                in("END", {1}, true),  in("AX", {1}, true),
                in("S5", {5}, true),   in("S4", {4}, true)};
    c.int64_constants = {
        {2, i64({0})},          {3, i64({24})}, {4, i64({48})}, {5, i64({1})}, {6, i64({2, 2, 24, 9, 9})},
        {7, i64({2, 48, 9, 9})}};
    c.chain = {conv({"X", "W0"}, 3, 1, 1), {"Relu", {"$0"}, {}}};  // $1 [2,48,9,9]
    std::string x = "$1";
    for (int u = 0; u < 2; ++u) {
      const std::string k = std::to_string(u);
      c.inputs.push_back(in("WA" + k, {24, 24, 1, 1}, true, -0.4f, 0.4f));
      c.inputs.push_back(in("WD" + k, {24, 1, 3, 3}, true, -0.4f, 0.4f));
      c.inputs.push_back(in("WB" + k, {24, 24, 1, 1}, true, -0.4f, 0.4f));
      auto ref = [&](size_t j) { return "$" + std::to_string(j); };
      const size_t a = c.chain.size();
      c.chain.push_back({"Slice", {x, "ST", "MID", "AX"}, {}});                   // a+0: first half
      c.chain.push_back({"Slice", {x, "MID", "END", "AX"}, {}});                  // a+1: second half
      c.chain.push_back(conv({ref(a + 1), "WA" + k}, 1, 1, 0));                   // a+2
      c.chain.push_back({"Relu", {ref(a + 2)}, {}});                              // a+3
      c.chain.push_back(conv({ref(a + 3), "WD" + k}, 3, 1, 1, 24));               // a+4
      c.chain.push_back(conv({ref(a + 4), "WB" + k}, 1, 1, 0));                   // a+5
      c.chain.push_back({"Relu", {ref(a + 5)}, {}});                              // a+6
      c.chain.push_back({"Concat", {ref(a + 0), ref(a + 6)}, {{"axis", I(1)}}});  // a+7
      c.chain.push_back({"Reshape", {ref(a + 7), "S5"}, {}});                     // a+8
      c.chain.push_back({"Transpose", {ref(a + 8)}, {{"perm", Is({0, 2, 1, 3, 4})}}});
      c.chain.push_back({"Reshape", {ref(a + 9), "S4"}, {}});  // a+10
      x = ref(a + 10);
    }
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // A channel shuffle of three groups straight after their Concat (8 channels each: not all nChw16c, so each source
    // is reordered into its interleaved channels of the shuffled output): the model's plain input, a 1x1
    // convolution's output (nChw16c, a partial block) and a 3x3's; then a 1x1 over the shuffled channels.
    OpCase c;
    c.op = "Chain";
    c.label = "channel shuffle of 3 groups folded into their Concat (input, nChw16c sources), then a 1x1";
    c.inputs = {in("X", {1, 8, 7, 7}),
                in("W1", {8, 8, 1, 1}, true, -0.4f, 0.4f),
                in("W2", {8, 8, 3, 3}, true, -0.3f, 0.3f),
                in("S5", {5}, true),
                in("S4", {4}, true),
                in("W3", {16, 24, 1, 1}, true, -0.3f, 0.3f)};
    c.int64_constants = {{3, i64({1, 3, 8, 7, 7})}, {4, i64({1, 24, 7, 7})}};
    c.chain = {conv({"X", "W1"}, 1, 1, 0),                              // $0
               conv({"X", "W2"}, 3, 1, 1),                              // $1
               {"Concat", {"X", "$0", "$1"}, {{"axis", I(1)}}},         // $2
               {"Reshape", {"$2", "S5"}, {}},                           // $3
               {"Transpose", {"$3"}, {{"perm", Is({0, 2, 1, 3, 4})}}},  // $4
               {"Reshape", {"$4", "S4"}, {}},                           // $5
               conv({"$5", "W3"}, 1, 1, 0)};                            // $6
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // MobileNet-V3's inverted residual with squeeze-excite: HardSwish after the 1x1 expansion and after a depthwise
    // 3x3 over 72 channels (a partial last block of nChw16c: oneDNN's jit depthwise kernel only with a blocked
    // destination), HardSigmoid closing the squeeze-excite (two eltwise post-ops: linear, clip), its Mul by the
    // [1,72,1,1] scale, the projection and the residual; claimed whole.
    OpCase c;
    c.op = "Chain";
    c.label = "mobilenet-v3 block: HardSwish, depthwise over 72 channels, squeeze-excite with HardSigmoid";
    c.inputs = {in("X", {1, 24, 14, 14}), in("WE", {72, 24, 1, 1}, true, -0.4f, 0.4f),
                in("BE", {72}, true),     in("WD", {72, 1, 3, 3}, true, -0.5f, 0.5f),
                in("BD", {72}, true),     in("W1", {24, 72, 1, 1}, true, -0.4f, 0.4f),
                in("B1", {24}, true),     in("W2", {72, 24, 1, 1}, true, -0.4f, 0.4f),
                in("B2", {72}, true),     in("WP", {24, 72, 1, 1}, true, -0.2f, 0.2f),
                in("BP", {24}, true)};
    c.chain = {conv({"X", "WE", "BE"}, 1, 1, 0),                                     // $0
               {"HardSwish", {"$0"}, {}},                                            // $1
               conv({"$1", "WD", "BD"}, 3, 1, 1, 72),                                // $2
               {"HardSwish", {"$2"}, {}},                                            // $3
               {"GlobalAveragePool", {"$3"}, {}},                                    // $4
               conv({"$4", "W1", "B1"}, 1, 1, 0),                                    // $5
               {"Relu", {"$5"}, {}},                                                 // $6
               conv({"$6", "W2", "B2"}, 1, 1, 0),                                    // $7
               {"HardSigmoid", {"$7"}, {{"alpha", F(1.f / 6)}, {"beta", F(0.5f)}}},  // $8
               {"Mul", {"$3", "$8"}, {}},                                            // $9
               conv({"$9", "WP", "BP"}, 1, 1, 0),                                    // $10
               {"Add", {"$10", "X"}, {}}};                                           // $11
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // A 1x1 expansion and the depthwise 3x3 reading it, as the oneDNN device's own fused step (steps/expand_dw.h):
    // MobileNetV2's 24 -> 144 (a partial last input block of nChw16c), Clip(0,6) on both, at batch 2 (the step's ring
    // starts over with each image), the projection and the residual after it.
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.label = "1x1 + depthwise 3x3 as one step: 24 -> 144 (a partial input block), Clip(0,6), batch 2, residual";
    c.inputs = {in("X", {2, 24, 14, 14}), in("WE", {144, 24, 1, 1}, true, -0.4f, 0.4f),
                in("BE", {144}, true),    in("WD", {144, 1, 3, 3}, true, -0.5f, 0.5f),
                in("BD", {144}, true),    in("WP", {24, 144, 1, 1}, true, -0.2f, 0.2f),
                in("BP", {24}, true),     scalar("LO", 0.f),
                scalar("HI", 6.f)};
    c.chain = {conv({"X", "WE", "BE"}, 1, 1, 0),       {"Clip", {"$0", "LO", "HI"}, {}},
               conv({"$1", "WD", "BD"}, 3, 1, 1, 144), {"Clip", {"$2", "LO", "HI"}, {}},
               conv({"$3", "WP", "BP"}, 1, 1, 0),      {"Add", {"X", "$4"}, {}}};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // The same step with hard-swish written as torch exports it (x * HardSigmoid(x)) after the 1x1 and after a
    // stride-2 depthwise at an odd size with BatchNormalization (folded), 40 -> 240 channels; then a second one at 7x7
    // (few rows: the team splits channel groups) with Relu after the 1x1 and nothing after a depthwise without bias.
    OpCase c;
    c.op = "Chain";
    c.label =
        "1x1 + depthwise 3x3 as one step: hard-swish, stride 2 at 13x13 with BatchNormalization, then Relu / none at "
        "7x7";
    c.inputs = {in("X", {1, 40, 13, 13}),
                in("WE", {240, 40, 1, 1}, true, -0.4f, 0.4f),
                in("BE", {240}, true),
                in("WD", {240, 1, 3, 3}, true, -0.5f, 0.5f),
                in("BD", {240}, true),
                in("S", {240}, true, 0.5f, 1.5f),
                in("SH", {240}, true),
                in("MU", {240}, true),
                in("VAR", {240}, true, 0.5f, 2.f),
                in("W2", {96, 240, 1, 1}, true, -0.2f, 0.2f),
                in("WD2", {96, 1, 3, 3}, true, -0.5f, 0.5f)};
    c.chain = {conv({"X", "WE", "BE"}, 1, 1, 0),                                     // $0
               {"HardSigmoid", {"$0"}, {{"alpha", F(1.f / 6)}, {"beta", F(0.5f)}}},  // $1
               {"Mul", {"$0", "$1"}, {}},                                            // $2
               conv({"$2", "WD", "BD"}, 3, 2, 1, 240),                               // $3
               {"BatchNormalization", {"$3", "S", "SH", "MU", "VAR"}, {}},           // $4
               {"HardSigmoid", {"$4"}, {{"alpha", F(1.f / 6)}, {"beta", F(0.5f)}}},  // $5
               {"Mul", {"$4", "$5"}, {}},                                            // $6
               conv({"$6", "W2"}, 1, 1, 0),                                          // $7
               {"Relu", {"$7"}, {}},                                                 // $8
               conv({"$8", "WD2"}, 3, 1, 1, 96)};                                    // $9
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // The same step with a 5x5 depthwise convolution (MobileNet-V3's later blocks): 40 -> 120 channels (7.5 blocks of
    // nChw16c: the padding lanes must come out zero for the projection after it), HardSwish on both, stride 2.
    OpCase c;
    c.op = "Chain";
    c.label = "1x1 + depthwise 5x5 as one step: 40 -> 120 (a partial block), HardSwish, stride 2, projection";
    c.inputs = {in("X", {1, 40, 14, 14}), in("WE", {120, 40, 1, 1}, true, -0.4f, 0.4f),
                in("BE", {120}, true),    in("WD", {120, 1, 5, 5}, true, -0.3f, 0.3f),
                in("BD", {120}, true),    in("WP", {48, 120, 1, 1}, true, -0.2f, 0.2f),
                in("BP", {48}, true)};
    c.chain = {conv({"X", "WE", "BE"}, 1, 1, 0),
               {"HardSwish", {"$0"}, {}},
               conv({"$1", "WD", "BD"}, 5, 2, 2, 120),
               {"HardSwish", {"$2"}, {}},
               conv({"$3", "WP", "BP"}, 1, 1, 0)};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // MobileNetV2's first two layers as one step: the 3x3 stride-2 stem over 3 plain channels (at an odd size), its
    // depthwise reader and the projection to 16, Clip(0,6) after the first two, at batch 2.
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.label = "stem 3x3 s2 3 -> 32 + depthwise 3x3 + 1x1 -> 16 as one step, Clip(0,6), 33x31, batch 2";
    c.inputs = {in("X", {2, 3, 33, 31}), in("W0", {32, 3, 3, 3}, true, -0.4f, 0.4f),
                in("B0", {32}, true),    in("WD", {32, 1, 3, 3}, true, -0.5f, 0.5f),
                in("BD", {32}, true),    in("WP", {16, 32, 1, 1}, true, -0.3f, 0.3f),
                in("BP", {16}, true),    scalar("LO", 0.f),
                scalar("HI", 6.f)};
    c.chain = {conv({"X", "W0", "B0"}, 3, 2, 1),
               {"Clip", {"$0", "LO", "HI"}, {}},
               conv({"$1", "WD", "BD"}, 3, 1, 1, 32),
               {"Clip", {"$2", "LO", "HI"}, {}},
               conv({"$3", "WP", "BP"}, 1, 1, 0)};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // What the expand_dw step must not take whole: the depthwise output read twice (by the projection and by a pooled
    // branch, as squeeze-excite does), so it is written out and the projection stays a step of its own; and a
    // projection whose Add is of another tensor than the block's input (no residual of the step's source).
    for (bool other_residual : {false, true}) {
      OpCase c;
      c.op = "Chain";
      c.opset = 13;
      c.label = other_residual ? "1x1 + depthwise + projection whose Add is of another input (not the step's residual)"
                               : "1x1 + depthwise whose output is read twice (projection and a pooled branch)";
      c.inputs = {in("X", {1, 24, 14, 14}),
                  in("Y", {1, 24, 14, 14}),
                  in("WE", {144, 24, 1, 1}, true, -0.4f, 0.4f),
                  in("BE", {144}, true),
                  in("WD", {144, 1, 3, 3}, true, -0.5f, 0.5f),
                  in("BD", {144}, true),
                  in("WP", {24, 144, 1, 1}, true, -0.2f, 0.2f),
                  in("W2", {24, 144, 1, 1}, true, -0.2f, 0.2f),
                  scalar("LO", 0.f),
                  scalar("HI", 6.f)};
      c.chain = {conv({"X", "WE", "BE"}, 1, 1, 0),
                 {"Clip", {"$0", "LO", "HI"}, {}},  // $1
                 conv({"$1", "WD", "BD"}, 3, 1, 1, 144),
                 {"Clip", {"$2", "LO", "HI"}, {}},  // $3
                 conv({"$3", "WP"}, 1, 1, 0)};      // $4
      if (other_residual) {
        c.chain.push_back({"Add", {"$4", "Y"}, {}});  // $5
      } else {
        c.chain.push_back({"GlobalAveragePool", {"$3"}, {}});  // $5
        c.chain.push_back(conv({"$5", "W2"}, 1, 1, 0));        // $6
        c.chain.push_back({"Add", {"$4", "$6"}, {}});          // $7
      }
      v.push_back(c);
    }
  }
  {
    // HardSigmoid and HardSwish with nothing to fuse into (after a Mul of two values): their own steps, HardSigmoid
    // as two (linear, then clip in place), with ONNX's default alpha 0.2.
    OpCase c;
    c.op = "Chain";
    c.label = "HardSigmoid (default alpha) and HardSwish as steps of their own, odd sizes";
    c.inputs = {in("X", {1, 5, 7, 9}, false, -4.f, 4.f), in("W", {8, 5, 3, 3}, true, -0.4f, 0.4f), in("B", {8}, true),
                in("W2", {3, 8, 1, 1}, true, -0.5f, 0.5f)};
    c.chain = {conv({"X", "W", "B"}, 3, 1, 1), {"Mul", {"$0", "$0"}, {}}, {"HardSigmoid", {"$1"}, {}},
               {"Mul", {"$2", "$0"}, {}},      {"HardSwish", {"$3"}, {}}, conv({"$4", "W2"}, 1, 1, 0)};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // Hard-swish as torch exports it below opset 14: x * HardSigmoid(x) with alpha 1/6, beta 0.5 (the oneDNN device:
    // one hardswish post-op of the convolution, and of a pooling), in both operand orders; then the same shape with
    // alpha 0.2 (not a hard-swish: must stay HardSigmoid and Mul), and a squeeze-excite gate
    // x * HardSigmoid(conv(pool(x))) (MobileNetV3's), batch 2.
    OpCase c;
    c.op = "Chain";
    c.label = "hard-swish written x * HardSigmoid(x) (alpha 1/6) after conv and pool, alpha 0.2 not, SE gate, batch 2";
    c.inputs = {in("X", {2, 8, 9, 7}, false, -5.f, 5.f),
                in("W0", {32, 8, 3, 3}, true, -0.6f, 0.6f),
                in("B0", {32}, true),
                in("W1", {32, 32, 1, 1}, true, -0.5f, 0.5f),
                in("B1", {32}, true),
                in("WS", {8, 32, 1, 1}, true, -0.5f, 0.5f),
                in("BS", {8}, true),
                in("WE", {32, 8, 1, 1}, true, -0.5f, 0.5f),
                in("BE", {32}, true),
                in("W2", {16, 32, 1, 1}, true, -0.5f, 0.5f)};
    const std::map<std::string, Attribute> sixth = {{"alpha", F(1.f / 6.f)}, {"beta", F(0.5f)}};
    c.chain = {conv({"X", "W0", "B0"}, 3, 1, 1),                                               // $0
               {"HardSigmoid", {"$0"}, sixth},                                                 // $1
               {"Mul", {"$0", "$1"}, {}},                                                      // $2 hard-swish
               conv({"$2", "W1", "B1"}, 1, 1, 0),                                              // $3
               {"HardSigmoid", {"$3"}, {{"alpha", F(0.2f)}}},                                  // $4
               {"Mul", {"$4", "$3"}, {}},                                                      // $5 not a hard-swish
               {"GlobalAveragePool", {"$5"}, {}},                                              // $6
               conv({"$6", "WS", "BS"}, 1, 1, 0),                                              // $7
               {"Relu", {"$7"}, {}},                                                           // $8
               conv({"$8", "WE", "BE"}, 1, 1, 0),                                              // $9
               {"HardSigmoid", {"$9"}, sixth},                                                 // $10 the gate
               {"Mul", {"$5", "$10"}, {}},                                                     // $11
               {"MaxPool", {"$11"}, {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}}},  // $12
               {"HardSigmoid", {"$12"}, sixth},                                                // $13
               {"Mul", {"$13", "$12"}, {}},  // $14 hard-swish after a pool
               conv({"$14", "W2"}, 1, 1, 0)};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // A segmentation head (LR-ASPP / FCN): bilinear Resize (linear, half_pixel) by sizes of a 32-channel nChw16c map,
    // added to a lateral convolution, a 21-class classifier (a partial block: resized from plain memory), then a
    // pytorch_half_pixel Resize by 2 x 1.5 to the output (sizes only, so the bf16 variant runs too).
    OpCase c;
    c.op = "Chain";
    c.label = "segmentation head: linear Resize by sizes (nChw16c), then by 2x1.5 (21 classes, plain)";
    c.inputs = {in("X", {1, 16, 6, 5}),
                in("L", {1, 16, 12, 10}),
                in("W0", {32, 16, 1, 1}, true, -0.4f, 0.4f),
                in("B0", {32}, true),
                in("WL", {32, 16, 1, 1}, true, -0.4f, 0.4f),
                in("WC", {21, 32, 3, 3}, true, -0.2f, 0.2f),
                in("BC", {21}, true),
                in("SZ", {4}, true),
                in("SZ2", {4}, true)};
    c.int64_constants = {{7, i64({1, 32, 12, 10})}, {8, i64({1, 21, 24, 15})}};
    c.chain = {conv({"X", "W0", "B0"}, 1, 1, 0),                           // $0
               {"Relu", {"$0"}, {}},                                       // $1
               {"Resize", {"$1", "", "", "SZ"}, {{"mode", S("linear")}}},  // $2
               conv({"L", "WL"}, 1, 1, 0),                                 // $3
               {"Add", {"$2", "$3"}, {}},                                  // $4
               conv({"$4", "WC", "BC"}, 3, 1, 1),                          // $5
               {"Resize",
                {"$5", "", "", "SZ2"},
                {{"mode", S("linear")}, {"coordinate_transformation_mode", S("pytorch_half_pixel")}}}};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // Bilinear Resizes torch exports with align_corners=True (align_corners) and ONNX's asymmetric mode inside a
    // chain (the oneDNN device: its own bilinear step, steps/resize.h, where oneDNN's resampling has half_pixel
    // only): x2 of a 32-channel nChw16c map by scales, then a 21-class map (a partial block: plain) by sizes to an
    // odd size, batch 2; then asymmetric x1.5 of a Relu.
    OpCase c;
    c.op = "Chain";
    c.label = "bilinear Resize align_corners x2 (nChw16c), align_corners by sizes (21 classes, plain), asymmetric";
    c.inputs = {in("X", {2, 16, 5, 6}), in("W0", {32, 16, 1, 1}, true, -0.4f, 0.4f),
                in("B0", {32}, true),   in("WC", {21, 32, 3, 3}, true, -0.2f, 0.2f),
                in("BC", {21}, true),   in("S2", {4}, true),
                in("SZ", {4}, true),    in("S15", {4}, true)};
    c.inputs[5].values = {1.f, 1.f, 2.f, 2.f};
    c.inputs[7].values = {1.f, 1.f, 1.5f, 1.5f};
    c.int64_constants = {{6, i64({2, 21, 23, 17})}};
    const Attribute ac = S("align_corners");
    c.chain = {conv({"X", "W0", "B0"}, 1, 1, 0),                                                               // $0
               {"Relu", {"$0"}, {}},                                                                           // $1
               {"Resize", {"$1", "", "S2"}, {{"mode", S("linear")}, {"coordinate_transformation_mode", ac}}},  // $2
               conv({"$2", "WC", "BC"}, 3, 1, 1),  // $3 [2,21,10,12]
               {"Resize", {"$3", "", "", "SZ"}, {{"mode", S("linear")}, {"coordinate_transformation_mode", ac}}},
               {"Relu", {"$4"}, {}},  // $5
               {"Resize",
                {"$5", "", "S15"},
                {{"mode", S("linear")}, {"coordinate_transformation_mode", S("asymmetric")}}}};  // $6 [2,21,34,25]
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // An FPN top-down step: nearest Resize x2 (asymmetric, floor: torch's nearest) of a blocked map added to the
    // lateral 1x1; a nearest x3 (half_pixel, round_prefer_floor) and a linear downsampling by 0.5 after it.
    OpCase c;
    c.op = "Chain";
    c.label = "FPN: nearest Resize x2 (asymmetric floor) + lateral, nearest x3 (half_pixel), linear x0.5";
    c.inputs = {in("X", {1, 32, 5, 7}),
                in("L", {1, 16, 10, 14}),
                in("WL", {32, 16, 1, 1}, true, -0.4f, 0.4f),
                in("W", {32, 32, 3, 3}, true, -0.2f, 0.2f),
                in("S2", {4}, true),
                in("S3", {4}, true),
                in("SH", {4}, true)};
    c.inputs[4].values = {1.f, 1.f, 2.f, 2.f};
    c.inputs[5].values = {1.f, 1.f, 3.f, 3.f};
    c.inputs[6].values = {1.f, 1.f, 0.5f, 0.5f};
    c.chain = {{"Resize",
                {"X", "", "S2"},
                {{"mode", S("nearest")},
                 {"coordinate_transformation_mode", S("asymmetric")},
                 {"nearest_mode", S("floor")}}},                        // $0 [1,32,10,14]
               conv({"L", "WL"}, 1, 1, 0),                              // $1
               {"Add", {"$0", "$1"}, {}},                               // $2
               conv({"$2", "W"}, 3, 1, 1),                              // $3
               {"Resize", {"$3", "", "S3"}, {{"mode", S("nearest")}}},  // $4 [1,32,30,42]
               {"Relu", {"$4"}, {}},                                    // $5
               {"Resize", {"$5", "", "SH"}, {{"mode", S("linear")}}}};  // $6 [1,32,15,21]
    c.claim_whole = true;
    v.push_back(c);
  }
  // Two eltwise post-ops of one algorithm with different parameters: oneDNN 2.6's jit kernels ran the second with
  // the first's parameters (LeakyRelu then Relu as two LeakyRelus: negative outputs). Found by the random chains
  // (keel-cts --random-chains as of 4171da9, seeds 416, 629, 1616, 2220, 2687, 4153).
  {
    OpCase c;
    c.op = "Chain";
    c.label = "two post-ops of one algorithm: conv + LeakyRelu + Relu, conv + Clip(0,6) + HardSigmoid";
    c.inputs = {in("X", {1, 16, 6, 7}), in("W1", {32, 16, 3, 3}, true, -0.3f, 0.3f),
                in("B1", {32}, true),   in("W2", {32, 32, 1, 1}, true, -0.5f, 0.5f),
                scalar("lo", 0.f),      scalar("hi", 6.f)};
    c.chain = {conv({"X", "W1", "B1"}, 3, 1, 1),
               {"LeakyRelu", {"$0"}, {{"alpha", F(0.1f)}}},
               {"Relu", {"$1"}, {}},
               conv({"$2", "W2"}, 1, 1, 0),
               {"Clip", {"$3", "lo", "hi"}, {}},
               {"HardSigmoid", {"$4"}, {{"alpha", F(0.4f)}, {"beta", F(0.2f)}}}};
    v.push_back(c);
  }
  {
    OpCase c;
    c.op = "Chain";
    c.label = "two post-ops of one algorithm: MatMul + bias + scalar Mul + HardSigmoid (two linears)";
    c.inputs = {in("X", {2, 5, 32}), in("W", {32, 48}, true, -0.3f, 0.3f), in("B", {48}, true), scalar("k", 3.f)};
    c.chain = {{"MatMul", {"X", "W"}, {}},
               {"Add", {"$0", "B"}, {}},
               {"Mul", {"$1", "k"}, {}},
               {"HardSigmoid", {"$2"}, {{"alpha", F(0.25f)}, {"beta", F(0.5f)}}}};
    v.push_back(c);
  }
  // A view (Unsqueeze, Squeeze) of a value's plain copy, scaled in place, while the value is read again later through
  // the same copy: the scaling overwrote the copy (random chain seed 8899 as of 61c47fd).
  {
    OpCase c;
    c.op = "Chain";
    c.label = "conv -> Unsqueeze -> Squeeze -> Mul(scalar) -> Add(with the conv)";
    c.inputs = {in("X", {1, 16, 6, 6}), in("W", {16, 16, 3, 3}, true, -0.3f, 0.3f), in("A", {1}, true),
                in("A2", {1}, true), scalar("k", 0.75f)};
    c.inputs[2].dtype = DType::kI64;
    c.inputs[3].dtype = DType::kI64;
    c.int64_constants = {{2, i64({2})}, {3, i64({2})}};
    c.chain = {conv({"X", "W"}, 3, 1, 1),
               {"Unsqueeze", {"$0", "A"}, {}},
               {"Squeeze", {"$1", "A2"}, {}},
               {"Mul", {"$2", "k"}, {}},
               {"Add", {"$3", "$0"}, {}}};
    v.push_back(c);
  }
  // A bilinear Resize of a 1x1 map (a global pool's, nChw16c) of channels that are no whole 16-channel block: read
  // plain, and a plain [N,C,1,1] also compares equal to channels-last (oneDNN ignores the strides of dims of 1), so
  // the resized copy was written channels-last into a plain destination (random chain seed 4838 as of 4171da9).
  {
    OpCase c;
    c.op = "Chain";
    c.label = "bilinear Resize of a global pool's 1x1 map, 8 channels, align_corners";
    c.inputs = {in("X", {1, 3, 7, 5}), in("W0", {8, 3, 3, 3}, true, -0.5f, 0.5f),
                in("W", {8, 1, 3, 3}, true, -0.5f, 0.5f), in("S", {4}, true)};
    c.inputs[3].values = {1.f, 1.f, 2.f, 2.f};
    c.chain = {
        conv({"X", "W0"}, 3, 1, 1),  // nChw16c out, so the depthwise one and the pool stay so
        conv({"$0", "W"}, 3, 1, 1, 8),
        {"GlobalAveragePool", {"$1"}, {}},
        {"Resize", {"$2", "", "S"}, {{"mode", S("linear")}, {"coordinate_transformation_mode", S("align_corners")}}}};
    v.push_back(c);
  }
}

// The chain cases in bf16 (every float input and weight bf16, as convert_precision leaves a model): a device may
// claim them as bf16 chains (oneDNN: bf16 primitives, f32 accumulation, layouts kept between ops). Both sides round
// every op's output to bf16 (8 significant bits), in different places: a few rounding steps apart after a chain.
void add_bf16_chain_cases(std::vector<OpCase>& v) {
  std::vector<OpCase> extra;
  for (const OpCase& f : v) {
    if (f.chain.empty() || f.dtype != DType::kF32) continue;
    // A Resize's scales are float32 in ONNX whatever the data's type; converted with the other float inputs they
    // would make the graph invalid.
    bool resize_scales = false;
    for (const ChainNode& n : f.chain)
      resize_scales = resize_scales || (n.op == "Resize" && n.inputs.size() > 2 && !n.inputs[2].empty());
    if (resize_scales) continue;
    OpCase c = f;
    c.dtype = DType::kBF16;
    c.label = "bf16 " + f.label;
    c.rtol = 4e-2;
    c.atol = 4e-2;
    extra.push_back(std::move(c));
  }
  v.insert(v.end(), extra.begin(), extra.end());
}

// What the GPU plugins serve beyond the f32 tables above: the keel-domain fused ops the fusion passes produce
// (FusedConv, FusedMatMul, FusedGemm: every activation, bias, residual Z; f32, as their reference kernels), f16 and
// bf16 cases of the convolution / pooling / normalisation / GEMM ops (an f16 or bf16 output rounds: tolerances of a
// few ulps), and the pads, ConvTranspose and pooling forms cuDNN handles specially (asymmetric pads, output_shape).
void add_fused_and_half_cases(std::vector<OpCase>& v) {
  auto act_attrs = [](const std::string& act, std::vector<float> params = {}) {
    std::map<std::string, Attribute> a;
    if (!act.empty()) a["activation"] = S(act);
    if (!params.empty()) a["activation_params"] = Attribute::of_floats(std::move(params));
    return a;
  };
  auto fused = [&](const std::string& op, std::string label, std::vector<InputSpec> ins,
                   std::map<std::string, Attribute> attrs) {
    OpCase c;
    c.op = op;
    c.domain = "keel";
    c.opset = 1;
    c.label = std::move(label);
    c.inputs = std::move(ins);
    c.attrs = std::move(attrs);
    v.push_back(c);
  };
  {  // FusedConv: act(conv(X, W) + B + Z)
    struct P {
      std::string act;
      std::vector<float> params;
      Shape x;
      int64_t K, k, s, p, g;
      bool bias, z;
    };
    const P ps[] = {
        {"Relu", {}, {2, 16, 14, 14}, 32, 3, 1, 1, 1, true, false},
        {"Relu", {}, {1, 16, 14, 14}, 16, 3, 1, 1, 1, true, true},
        {"Relu", {}, {1, 8, 9, 9}, 8, 3, 1, 1, 1, false, true},
        {"", {}, {1, 16, 8, 8}, 32, 1, 1, 0, 1, true, true},
        {"Sigmoid", {}, {1, 8, 10, 10}, 12, 3, 2, 1, 1, false, false},
        {"LeakyRelu", {0.2f}, {1, 8, 11, 11}, 16, 3, 2, 0, 1, true, false},
        {"Clip", {0.f, 6.f}, {1, 32, 9, 9}, 32, 3, 1, 1, 32, true, false},
        {"Gelu", {}, {1, 16, 7, 7}, 24, 3, 1, 1, 1, true, true},
        {"HardSwish", {}, {2, 12, 6, 6}, 12, 3, 1, 1, 4, true, false},
        {"Tanh", {}, {1, 4, 5, 5}, 6, 3, 1, 0, 1, true, true},
    };
    for (const P& p : ps) {
      const int64_t oh = (p.x[2] + 2 * p.p - p.k) / p.s + 1, ow = (p.x[3] + 2 * p.p - p.k) / p.s + 1;
      std::ostringstream l;
      l << "act=" << (p.act.empty() ? "none" : p.act) << " X=" << shape_label(p.x) << " K=" << p.K << " k=" << p.k
        << " s=" << p.s << " p=" << p.p << " g=" << p.g << (p.bias ? " bias" : "") << (p.z ? " Z" : "");
      std::vector<InputSpec> ins = {in("X", p.x), in("W", {p.K, p.x[1] / p.g, p.k, p.k}, true, -0.5f, 0.5f)};
      ins.push_back(p.bias ? in("B", {p.K}, true) : absent());
      if (p.z) ins.push_back(in("Z", {p.x[0], p.K, oh, ow}));
      auto attrs = act_attrs(p.act, p.params);
      attrs["kernel_shape"] = Is({p.k, p.k});
      attrs["strides"] = Is({p.s, p.s});
      attrs["pads"] = Is({p.p, p.p, p.p, p.p});
      attrs["group"] = I(p.g);
      fused("FusedConv", l.str(), ins, attrs);
    }
    auto a = act_attrs("Relu");
    a["pads"] = Is({0, 1, 2, 1});
    fused("FusedConv", "act=Relu X=[1,8,9,10] K=8 k=3 pads=0,1,2,1 bias",
          {in("X", {1, 8, 9, 10}), in("W", {8, 8, 3, 3}, true), in("B", {8}, true)}, a);
    a = act_attrs("Relu");
    a["strides"] = Is({2});
    a["pads"] = Is({1, 1});
    fused("FusedConv", "act=Relu 1d X=[2,8,20] K=16 k=3 s=2 p=1 bias Z",
          {in("X", {2, 8, 20}), in("W", {16, 8, 3}, true), in("B", {16}, true), in("Z", {2, 16, 10})}, a);
    a = act_attrs("Relu");
    a["pads"] = Is({1, 1, 1, 1, 1, 1});
    fused("FusedConv", "act=Relu 3d X=[1,4,5,6,7] K=8 k=3 p=1 bias",
          {in("X", {1, 4, 5, 6, 7}), in("W", {8, 4, 3, 3, 3}, true), in("B", {8}, true)}, a);
  }
  {  // FusedMatMul: act(matmul(A, B) + bias + Z)
    struct P {
      std::string act;
      Shape a, b, out;
      bool bias, z;
    };
    const P ps[] = {
        {"Relu", {4, 8, 16}, {16, 9}, {4, 8, 9}, true, false},
        {"Relu", {64, 32}, {32, 48}, {64, 48}, true, true},
        {"Gelu", {2, 3, 5, 7}, {2, 3, 7, 4}, {2, 3, 5, 4}, true, true},
        {"Sigmoid", {1, 5, 6}, {4, 6, 3}, {4, 5, 3}, false, true},
        {"LeakyRelu", {4, 1, 5, 6}, {3, 6, 2}, {4, 3, 5, 2}, true, false},
        {"Relu", {9}, {9, 4}, {4}, true, false},
        {"", {3, 16, 32}, {32, 8}, {3, 16, 8}, true, true},
    };
    for (const P& p : ps) {
      std::string l = "act=" + (p.act.empty() ? std::string("none") : p.act) + " A=" + shape_label(p.a) +
                      " B=" + shape_label(p.b) + (p.bias ? " bias" : "") + (p.z ? " Z" : "");
      std::vector<InputSpec> ins = {in("A", p.a), in("B", p.b, true)};
      ins.push_back(p.bias ? in("bias", {p.b.back()}, true) : absent());
      if (p.z) ins.push_back(in("Z", p.out));
      fused("FusedMatMul", l, ins,
            act_attrs(p.act, p.act == "LeakyRelu" ? std::vector<float>{0.1f} : std::vector<float>{}));
    }
  }
  {  // FusedGemm: act(alpha A' B' + beta C + Z)
    struct P {
      std::string act;
      std::vector<float> params;
      int64_t M, K, N;
      int ta, tb;
      float alpha, beta;
      Shape c;
      bool z;
    };
    const P ps[] = {
        {"Relu", {}, 32, 64, 16, 0, 1, 1.f, 1.f, {16}, false},
        {"Tanh", {}, 5, 7, 3, 1, 0, 0.5f, 2.f, {5, 3}, true},
        {"Relu", {}, 6, 9, 4, 0, 0, 1.f, 1.f, {6, 1}, true},
        {"HardSwish", {}, 8, 16, 4, 0, 0, 1.f, 1.f, {}, true},
        {"Relu", {}, 16, 17, 33, 0, 0, 1.f, 1.f, {1, 33}, true},
        {"Clip", {-0.5f, 0.5f}, 10, 12, 7, 1, 1, 1.5f, 0.5f, {7}, false},
        {"", {}, 4, 8, 5, 0, 1, 1.f, 1.f, {5}, true},
    };
    for (const P& p : ps) {
      std::ostringstream l;
      l << "act=" << (p.act.empty() ? "none" : p.act) << " M=" << p.M << " K=" << p.K << " N=" << p.N
        << " transA=" << p.ta << " transB=" << p.tb << " alpha=" << p.alpha << " beta=" << p.beta
        << " C=" << (p.c.empty() ? "none" : shape_label(p.c)) << (p.z ? " Z" : "");
      std::vector<InputSpec> ins = {in("A", p.ta ? Shape{p.K, p.M} : Shape{p.M, p.K}),
                                    in("B", p.tb ? Shape{p.N, p.K} : Shape{p.K, p.N}, true)};
      ins.push_back(p.c.empty() ? absent() : in("C", p.c, true));
      if (p.z) ins.push_back(in("Z", {p.M, p.N}));
      auto attrs = act_attrs(p.act, p.params);
      attrs["transA"] = I(p.ta);
      attrs["transB"] = I(p.tb);
      attrs["alpha"] = F(p.alpha);
      attrs["beta"] = F(p.beta);
      fused("FusedGemm", l.str(), ins, attrs);
    }
  }
  // f16 and bf16 forms of the convolution / GEMM / pooling / normalisation ops.
  for (DType dt : {DType::kF16, DType::kBF16}) {
    const std::string tn = dtype_name(dt);
    const double tol = dt == DType::kF16 ? 1e-2 : 2e-2;
    auto add = [&](const std::string& op, std::string label, std::vector<InputSpec> ins,
                   std::map<std::string, Attribute> attrs, int32_t opset = 17) {
      OpCase c;
      c.op = op;
      c.opset = opset;
      c.dtype = dt;
      c.label = tn + " " + label;
      c.inputs = std::move(ins);
      c.attrs = std::move(attrs);
      c.rtol = tol;
      c.atol = tol;
      v.push_back(c);
    };
    add("Conv", "N=2 C=16 H=14 W=14 K=32 k=3 s=1 p=1",
        {in("X", {2, 16, 14, 14}), in("W", {32, 16, 3, 3}, true, -0.3f, 0.3f), in("B", {32}, true)},
        {{"kernel_shape", Is({3, 3})}, {"pads", Is({1, 1, 1, 1})}});
    add("Conv", "N=1 C=64 H=8 W=8 K=128 k=1 nobias",
        {in("X", {1, 64, 8, 8}), in("W", {128, 64, 1, 1}, true, -0.2f, 0.2f)}, {{"kernel_shape", Is({1, 1})}});
    add("Conv", "N=1 C=32 H=15 W=15 K=32 k=3 s=2 p=1 g=32",
        {in("X", {1, 32, 15, 15}), in("W", {32, 1, 3, 3}, true), in("B", {32}, true)},
        {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}, {"group", I(32)}});
    add("Conv", "N=1 C=8 H=9 W=10 K=8 k=3 pads=0,1,2,1",
        {in("X", {1, 8, 9, 10}), in("W", {8, 8, 3, 3}, true, -0.3f, 0.3f)}, {{"pads", Is({0, 1, 2, 1})}});
    add("Conv", "1d N=2 C=16 L=50 K=32 k=5 s=2 p=2",
        {in("X", {2, 16, 50}), in("W", {32, 16, 5}, true, -0.3f, 0.3f), in("B", {32}, true)},
        {{"strides", Is({2})}, {"pads", Is({2, 2})}});
    add("Conv", "3d N=1 C=4 D=5 H=6 W=7 K=8 k=3 p=1",
        {in("X", {1, 4, 5, 6, 7}), in("W", {8, 4, 3, 3, 3}, true, -0.3f, 0.3f), in("B", {8}, true)},
        {{"pads", Is({1, 1, 1, 1, 1, 1})}});
    add("ConvTranspose", "N=1 C=16 H=7 W=7 M=8 k=3 s=2 p=1 op=1",
        {in("X", {1, 16, 7, 7}), in("W", {16, 8, 3, 3}, true, -0.3f, 0.3f), in("B", {8}, true)},
        {{"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}, {"output_padding", Is({1, 1})}});
    add("MatMul", "A=[64,256] B=[256,64] B-const", {in("A", {64, 256}), in("B", {256, 64}, true, -0.2f, 0.2f)}, {});
    add("MatMul", "A=[2,128,64] B=[2,64,128]", {in("A", {2, 128, 64}), in("B", {2, 64, 128}, false, -0.3f, 0.3f)}, {});
    add("MatMul", "A=[4,8,16] B=[16,9] B-const", {in("A", {4, 8, 16}), in("B", {16, 9}, true)}, {});
    add("MatMul", "A=[4,1,5,6] B=[3,6,2]", {in("A", {4, 1, 5, 6}), in("B", {3, 6, 2})}, {});
    add("MatMul", "A=[9] B=[9,4]", {in("A", {9}), in("B", {9, 4})}, {});
    add("Gemm", "M=32 K=256 N=10 transB=1 C=[10]",
        {in("A", {32, 256}), in("B", {10, 256}, true, -0.2f, 0.2f), in("C", {10}, true)}, {{"transB", I(1)}});
    add("Gemm", "M=5 K=7 N=3 transA=1 transB=1 alpha=0.5 beta=2 C=[5,3]",
        {in("A", {7, 5}), in("B", {3, 7}, true), in("C", {5, 3}, true)},
        {{"transA", I(1)}, {"transB", I(1)}, {"alpha", F(0.5f)}, {"beta", F(2.f)}});
    add("MaxPool", "X=[1,16,14,14] k=3 s=2 p=1", {in("X", {1, 16, 14, 14})},
        {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}});
    add("AveragePool", "X=[1,17,10,10] k=3 s=2 p=1 count_include_pad=1", {in("X", {1, 17, 10, 10})},
        {{"kernel_shape", Is({3, 3})},
         {"strides", Is({2, 2})},
         {"pads", Is({1, 1, 1, 1})},
         {"count_include_pad", I(1)}});
    add("AveragePool", "X=[1,17,10,10] k=3 s=2 p=1 count_include_pad=0", {in("X", {1, 17, 10, 10})},
        {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}});
    add("GlobalAveragePool", "X=[2,64,7,7]", {in("X", {2, 64, 7, 7})}, {});
    add("GlobalMaxPool", "X=[2,64,7,7]", {in("X", {2, 64, 7, 7})}, {});
    add("BatchNormalization", "X=[2,16,7,7]",
        {in("X", {2, 16, 7, 7}), in("scale", {16}, true), in("B", {16}, true), in("mean", {16}, true),
         in("var", {16}, true, 0.1f, 2.f)},
        {{"epsilon", F(1e-3f)}}, 15);
  }
  // f32 forms cuDNN handles specially.
  auto add32 = [&](const std::string& op, std::string label, std::vector<InputSpec> ins,
                   std::map<std::string, Attribute> attrs) {
    OpCase c;
    c.op = op;
    c.label = std::move(label);
    c.inputs = std::move(ins);
    c.attrs = std::move(attrs);
    v.push_back(c);
  };
  add32("MaxPool", "X=[1,8,9,10] k=3 s=2 pads=0,1,1,0", {in("X", {1, 8, 9, 10})},
        {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({0, 1, 1, 0})}});
  add32(
      "AveragePool", "X=[1,8,9,10] k=3 s=2 pads=0,1,1,0 count_include_pad=1", {in("X", {1, 8, 9, 10})},
      {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({0, 1, 1, 0})}, {"count_include_pad", I(1)}});
  add32("AveragePool", "X=[1,8,9,10] k=3 s=2 pads=0,1,1,0 count_include_pad=0", {in("X", {1, 8, 9, 10})},
        {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({0, 1, 1, 0})}});
  add32("MaxPool", "3d X=[1,4,6,7,8] k=2 s=2", {in("X", {1, 4, 6, 7, 8})},
        {{"kernel_shape", Is({2, 2, 2})}, {"strides", Is({2, 2, 2})}});
  add32("AveragePool", "1d X=[2,4,15] k=3 s=1 p=1 count_include_pad=1", {in("X", {2, 4, 15})},
        {{"kernel_shape", Is({3})}, {"pads", Is({1, 1})}, {"count_include_pad", I(1)}});
  add32("ConvTranspose", "N=1 C=8 H=5 W=5 M=4 k=3 s=2 output_shape=10,10",
        {in("X", {1, 8, 5, 5}), in("W", {8, 4, 3, 3}, true), in("B", {4}, true)},
        {{"strides", Is({2, 2})}, {"output_shape", Is({10, 10})}});
  add32("ConvTranspose", "N=1 C=8 H=5 W=6 M=4 k=4 s=2 auto_pad=SAME_UPPER",
        {in("X", {1, 8, 5, 6}), in("W", {8, 4, 4, 4}, true)}, {{"strides", Is({2, 2})}, {"auto_pad", S("SAME_UPPER")}});
  add32("ConvTranspose", "3d N=1 C=4 D=3 H=4 W=5 M=6 k=3 s=2 p=1",
        {in("X", {1, 4, 3, 4, 5}), in("W", {4, 6, 3, 3, 3}, true), in("B", {6}, true)},
        {{"strides", Is({2, 2, 2})}, {"pads", Is({1, 1, 1, 1, 1, 1})}});
  add32("ConvTranspose", "N=2 C=6 H=5 W=5 M=6 k=3 s=1 p=2 d=2 g=3",
        {in("X", {2, 6, 5, 5}), in("W", {6, 2, 3, 3}, true), in("B", {6}, true)},
        {{"pads", Is({2, 2, 2, 2})}, {"dilations", Is({2, 2})}, {"group", I(3)}});
  add32("Conv", "3d N=2 C=8 D=4 H=6 W=6 K=8 k=3 p=1 g=8",
        {in("X", {2, 8, 4, 6, 6}), in("W", {8, 1, 3, 3, 3}, true), in("B", {8}, true)},
        {{"pads", Is({1, 1, 1, 1, 1, 1})}, {"group", I(8)}});
}

// The bf16 inference ops of a mixed-precision graph (convert_precision; plugins/cpu_onednn/onednn_bf16.cc): the
// f32 cases of those ops again with bf16 inputs. Tolerance: both sides compute in f32 and round the output to
// bf16 (8 significant bits), so they may differ by a rounding step or two.
void add_bf16_inference_cases(std::vector<OpCase>& v) {  // also Conv/MatMul/Gemm/Relu/MaxPool in bf16
  static const std::set<std::string> ops = {
      "Add", "Sub", "Mul", "Div", "Max", "Min", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
      "BatchNormalization", "LayerNormalization", "Softmax", "LogSoftmax", "Clip", "LeakyRelu", "Sigmoid", "Tanh",
      "HardSwish", "Abs", "Neg", "Elu", "Concat", "Transpose",
      // onednn_train.cc's bf16 forward ops (autocast) and onednn_bf16.cc's inference Conv (constant weights)
      "Conv", "MatMul", "Gemm", "Relu", "MaxPool"};
  static const std::set<std::string> dot_ops = {"Conv", "MatMul", "Gemm"};
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) {
    const OpCase& f = v[i];
    if (f.dtype != DType::kF32 || !f.domain.empty() || !f.chain.empty() || !ops.count(f.op)) continue;
    OpCase c = f;
    c.dtype = DType::kBF16;
    c.label = "bf16 " + f.label;
    // Long dot products: the two sides sum in different orders before rounding to bf16.
    c.rtol = dot_ops.count(f.op) ? 2e-2 : 1e-2;
    c.atol = dot_ops.count(f.op) ? 2e-2 : 1e-2;
    v.push_back(std::move(c));
  }
  // (keel.FusedConv in bf16 has no case here: the reference keel-domain fused kernels are f32-only. The oneDNN
  // bf16 FusedConv is checked end to end against the fp32 graph in tests/passes/precision_test.cc.)
  for (Shape x : {Shape{17}, Shape{2, 8, 64}, Shape{1, 64, 56, 56}}) {  // keel.Gelu (the fusion pass makes it)
    OpCase c;
    c.op = "Gelu";
    c.domain = "keel";
    c.opset = 1;
    c.dtype = DType::kBF16;
    c.label = "bf16 X=" + shape_label(x);
    c.inputs = {in("X", x, false, -4.f, 4.f)};
    c.rtol = 1e-2;
    c.atol = 1e-2;
    v.push_back(c);
  }
}

// keel.Attention (fuse_attention's op: softmax(Q @ Kt * scale + mask) @ V): heads 1..16, head dims 32/64/80, sequences
// of 1, 7, 128 and 197 (ViT's), masks of every broadcast form (key padding with -inf, a causal mask, a row masked
// entirely), batches > 1 and broadcast batch dimensions; then as a claimed chain reads it, Q/K/V strided views of one
// in-projection (Slice, Reshape, Transpose) and its output written into the Transpose that joins the heads.
void add_attention_cases(std::vector<OpCase>& v) {
  const float inf = std::numeric_limits<float>::infinity();
  auto attn = [&](std::string label, std::vector<InputSpec> ins, float scale) {
    OpCase c;
    c.op = "Attention";
    c.domain = "keel";
    c.opset = 1;
    c.label = std::move(label);
    c.inputs = std::move(ins);
    c.attrs = {{"scale", F(scale)}};
    v.push_back(c);
  };
  const int64_t heads[] = {1, 4, 16};
  int k = 0;
  for (int64_t D : {32, 64, 80})
    for (int64_t S : {1, 7, 128, 197}) {
      const int64_t H = heads[k++ % 3];
      if (H * S * S * D > 16 * 128 * 128 * 64) continue;  // the reference kernel's time
      attn("H=" + std::to_string(H) + " S=" + std::to_string(S) + " D=" + std::to_string(D),
           {in("Q", {H, S, D}, false, -2, 2), in("Kt", {H, D, S}, false, -2, 2), in("V", {H, S, D})},
           1.f / std::sqrt(static_cast<float>(D)));
    }
  attn("B=2 H=4 S=7 T=33 D=64 Dv=80 mask [S,T] constant",
       {in("Q", {2, 4, 7, 64}), in("Kt", {2, 4, 64, 33}), in("V", {2, 4, 33, 80}), in("mask", {7, 33}, true, -4, 0)},
       0.125f);
  {
    // Key padding: batch entry 1's last 5 keys masked with -inf ([B,1,1,T]).
    InputSpec m = in("mask", {2, 1, 1, 19}, false);
    m.values.assign(38, 0.f);
    for (int t = 14; t < 19; ++t) m.values[19 + t] = -inf;
    attn("B=2 H=3 S=19 D=32 key-padding mask [B,1,1,T] -inf",
         {in("Q", {2, 3, 19, 32}, false, -2, 2), in("Kt", {2, 3, 32, 19}, false, -2, 2), in("V", {2, 3, 19, 32}), m},
         0.2f);
  }
  {
    // Causal ([S,S], -inf above the diagonal) over 4 heads of 64, S = 37.
    const int64_t S = 37;
    InputSpec m = in("mask", {S, S}, true);
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = 0; j < S; ++j) m.values.push_back(j > i ? -inf : 0.f);
    attn("H=4 S=37 D=64 causal mask",
         {in("Q", {4, S, 64}, false, -2, 2), in("Kt", {4, 64, S}, false, -2, 2), in("V", {4, S, 64}), m}, 0.125f);
  }
  {
    // A row masked entirely (gives 0) and a mask that varies per head ([B,H,S,T]).
    InputSpec m = in("mask", {1, 2, 5, 9}, false, -3, 3);
    m.values.resize(90);
    for (int64_t i = 0; i < 90; ++i) m.values[i] = static_cast<float>((i * 7) % 11) * 0.5f - 2.f;
    for (int t = 0; t < 9; ++t) m.values[9 * 3 + t] = -inf;
    attn("B=1 H=2 S=5 T=9 D=16 mask [B,H,S,T] with a fully masked row",
         {in("Q", {1, 2, 5, 16}), in("Kt", {1, 2, 16, 9}), in("V", {1, 2, 9, 24}), m}, 1.f);
  }
  attn("broadcast batch Q [2,1,7,32] Kt [1,3,32,9] V [3,9,16] mask [9]",
       {in("Q", {2, 1, 7, 32}), in("Kt", {1, 3, 32, 9}), in("V", {3, 9, 16}), in("mask", {9}, false, -2, 0)}, 0.5f);
  attn("2-D S=1 T=300 D=80 (one query)", {in("Q", {1, 80}), in("Kt", {80, 300}), in("V", {300, 80})}, 0.11f);

  // As the fusion passes leave a torch encoder's self-attention (opset 13): in-projection, q/k/v slices, the heads'
  // Reshape/Transpose (views in a chain), keel.Attention, the Transpose and Reshape joining the heads, out-projection.
  auto i64 = [](std::vector<int64_t> vals) {
    Tensor t = Tensor::host(DType::kI64, {static_cast<int64_t>(vals.size())}).value();
    std::copy(vals.begin(), vals.end(), t.data<int64_t>());
    return t;
  };
  struct L {
    int64_t S, H, Dh, B;
    bool mask;
  };
  // At a batch above 1 no one view splits the heads out of a slice ([S, B, H*Dh] as [S, B*H, Dh]); the cpu_onednn
  // chain reads it as the atoms [S, B, H, Dh] (batch 8 here: rows 24 KiB apart, packed per task by the step).
  for (const L& l : {L{128, 4, 64, 1, false}, L{197, 12, 64, 1, false}, L{7, 16, 32, 1, true}, L{33, 2, 80, 2, true},
                     L{64, 8, 32, 8, false}}) {
    const int64_t E = l.H * l.Dh;
    OpCase c;
    c.op = "Chain";
    c.opset = 13;
    c.claim_whole = true;
    c.label = "self-attention via keel.Attention S=" + std::to_string(l.S) + " heads=" + std::to_string(l.H) +
              " Dh=" + std::to_string(l.Dh) + " batch=" + std::to_string(l.B) + (l.mask ? " key-padding mask" : "");
    c.inputs = {in("X", {l.S, l.B, E}),
                in("W", {E, 3 * E}, true, -0.2f, 0.2f),
                in("Bi", {3 * E}, true),
                in("s0", {1}, true),
                in("s1", {1}, true),
                in("s2", {1}, true),
                in("s3", {1}, true),
                in("ax", {1}, true),
                in("shp", {3}, true),
                in("shp2", {3}, true),
                in("WO", {E, E}, true, -0.2f, 0.2f)};
    c.int64_constants = {{3, i64({0})},          {4, i64({E})},  {5, i64({2 * E})},
                         {6, i64({3 * E})},      {7, i64({-1})}, {8, i64({l.S, l.B * l.H, l.Dh})},
                         {9, i64({l.S, l.B, E})}};
    auto perm = [](std::vector<int64_t> p) { return std::map<std::string, Attribute>{{"perm", Is(std::move(p))}}; };
    std::vector<std::string> ains = {"$7", "$8", "$10"};
    if (l.mask) {
      InputSpec m = in("M", {l.B * l.H, 1, l.S}, true);
      for (int64_t b = 0; b < l.B * l.H; ++b)
        for (int64_t t = 0; t < l.S; ++t) m.values.push_back(t >= l.S - 2 && b % 2 == 1 ? -inf : 0.f);
      c.inputs.push_back(m);
      ains.push_back("M");
    }
    c.chain = {
        {"MatMul", {"X", "W"}, {}},               // $0 [S,B,3E]
        {"Add", {"Bi", "$0"}, {}},                // $1
        {"Slice", {"$1", "s0", "s1", "ax"}, {}},  // $2 q
        {"Slice", {"$1", "s1", "s2", "ax"}, {}},  // $3 k
        {"Slice", {"$1", "s2", "s3", "ax"}, {}},  // $4 v
        {"Reshape", {"$2", "shp"}, {}},           // $5 [S,B*H,Dh]
        {"Reshape", {"$3", "shp"}, {}},           // $6
        {"Transpose", {"$5"}, perm({1, 0, 2})},   // $7 q [B*H,S,Dh]
        {"Transpose", {"$6"}, perm({1, 2, 0})},   // $8 kT [B*H,Dh,S]
        {"Reshape", {"$4", "shp"}, {}},           // $9
        {"Transpose", {"$9"}, perm({1, 0, 2})},   // $10 v [B*H,S,Dh]
    };
    c.chain.push_back({"keel.Attention", ains, {{"scale", F(1.f / std::sqrt(static_cast<float>(l.Dh)))}}});  // $11
    c.chain.push_back({"Transpose", {"$11"}, perm({1, 0, 2})});  // $12 [S,B*H,Dh]
    c.chain.push_back({"Reshape", {"$12", "shp2"}, {}});         // $13 [S,B,E]
    c.chain.push_back({"MatMul", {"$13", "WO"}, {}});            // $14
    v.push_back(c);
  }
}

// INT8 chains: consecutive keel.QConv / keel.QGemm nodes as fuse_qdq leaves them (channels-last bytes between
// QConvs, f32 residual streams quantized by their readers, a folded residual Add as Z), which a device may claim as
// one subgraph (the cpu_onednn plugin does: chain/ops/int8.cc, Builder::qconv / qgemm). The default tolerances:
// requantisation may round apart from the reference at a tie (x * (1 / scale) against a division), rare with these
// random values, and then one step in one inner value.
void add_int8_chain_cases(std::vector<OpCase>& v) {
  auto qc = [](std::vector<std::string> ins, int64_t k, int64_t s, int64_t g, const char* act,
               std::map<std::string, Attribute> extra = {}) {
    const int64_t p = k / 2;
    std::map<std::string, Attribute> a = {
        {"kernel_shape", Is({k, k})}, {"strides", Is({s, s})}, {"pads", Is({p, p, p, p})}, {"group", I(g)}};
    if (act[0]) a["activation"] = S(act);
    if (std::string(act) == "Clip") a["activation_params"] = Attribute::of_floats({0.f, 6.f});
    for (auto& [key, val] : extra) a[key] = val;
    return ChainNode{"keel.QConv", std::move(ins), std::move(a)};
  };
  // Weights, bias, per-channel weight scales of a layer `k` ([M, C/g, k, k]).
  auto layer = [](OpCase& c, const std::string& k, int64_t M, int64_t Cg, int64_t ks, float wscale) {
    c.inputs.push_back(qin("W" + k, {M, Cg, ks, ks}, DType::kI8, true, -127.f, 127.f));
    c.inputs.push_back(in("B" + k, {M}, true, -0.5f, 0.5f));
    c.inputs.push_back(qconst("WS" + k, {M}, DType::kF32, channel_scales(M, wscale)));
  };
  auto act_q = [](OpCase& c, const std::string& k, float scale, float zp, DType t = DType::kU8) {
    c.inputs.push_back(qconst("S" + k, {}, DType::kF32, {scale}));
    c.inputs.push_back(qconst("Z" + k, {}, t, {zp}));
  };
  const std::map<std::string, Attribute> nhwc_io = {{"input_layout", S("NHWC")}, {"output_layout", S("NHWC")}};
  // ResNet's basic block as fuse_qdq leaves it: a 1x1 QConv writes the f32 residual stream channels-last, a 3x3 QConv
  // +Relu quantizes it, a 3x3 QConv adds it back as Z (+Relu), the stream's last reader, writing f32 (a block inside
  // a stage) or requantizing to u8 (a stage's last block, read by QConvs only). 16 channels: shapes the cpu_onednn
  // option int8_winograd takes (DeviceConformance.Int8WinogradOptionRunsTheQConvsItTakes).
  for (const bool quantized_out : {false, true}) {
    OpCase c;
    c.op = "Chain";
    c.label =
        std::string("int8 ResNet basic block: QConv 1x1 -> f32 stream -> QConv 3x3 +Relu -> QConv 3x3 +Z +Relu -> ") +
        (quantized_out ? "u8" : "f32");
    c.inputs = {in("X", {1, 8, 10, 10}, false, -2.f, 2.f)};
    act_q(c, "x", 0.02f, 128);
    layer(c, "s", 16, 8, 1, 0.004f);
    act_q(c, "r", 0.02f, 0);  // the stream's quantization (its readers' X)
    layer(c, "a", 16, 16, 3, 0.004f);
    act_q(c, "a", 0.03f, 0);
    layer(c, "b", 16, 16, 3, 0.004f);
    act_q(c, "b", 0.05f, 0);
    std::vector<std::string> b_in = {"$1", "Wb", "Bb", "Sa", "Za", "WSb", "", "", "$0"};
    if (quantized_out) b_in[6] = "Sb", b_in[7] = "Zb";
    c.chain = {qc({"X", "Ws", "Bs", "Sx", "Zx", "WSs"}, 1, 1, 1, "", {{"output_layout", S("NHWC")}}),
               qc({"$0", "Wa", "Ba", "Sr", "Zr", "WSa", "Sa", "Za"}, 3, 1, 1, "Relu", nhwc_io),
               qc(b_in, 3, 1, 1, "Relu", {{"input_layout", S("NHWC")}, {"residual_layout", S("NHWC")}})};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // MobileNetV2's inverted residual from an f32 input: X quantized by the expand 1x1 (u8, Clip), the depthwise
    // 3x3 over channels-last bytes, the project 1x1 with X as Z (f32 out, channels-last), the next expand quantizing
    // that residual again and writing u8 channels-last bytes as the graph's output.
    OpCase c;
    c.op = "Chain";
    c.label = "int8 inverted residual: f32 X -> QConv 1x1 expand -> depthwise 3x3 -> project 1x1 +Z -> QConv u8 NHWC";
    c.inputs = {in("X", {1, 24, 14, 14}, false, -3.f, 3.f)};
    act_q(c, "x", 0.03f, 128);  // X's quantization: 6/256 per step
    layer(c, "e", 96, 24, 1, 0.004f);
    act_q(c, "e", 0.03f, 0);
    layer(c, "d", 96, 1, 3, 0.004f);
    act_q(c, "d", 0.03f, 0);
    layer(c, "p", 24, 96, 1, 0.002f);
    layer(c, "n", 32, 24, 1, 0.004f);
    act_q(c, "n", 0.05f, 3);
    c.chain = {qc({"X", "We", "Be", "Sx", "Zx", "WSe", "Se", "Ze"}, 1, 1, 1, "Clip", {{"output_layout", S("NHWC")}}),
               qc({"$0", "Wd", "Bd", "Se", "Ze", "WSd", "Sd", "Zd"}, 3, 1, 96, "Clip", nhwc_io),
               qc({"$1", "Wp", "Bp", "Sd", "Zd", "WSp", "", "", "X"}, 1, 1, 1, "",
                  {{"input_layout", S("NHWC")}, {"output_layout", S("NHWC")}, {"residual_layout", S("NCHW")}}),
               qc({"$2", "Wn", "Bn", "Sx", "Zx", "WSn", "Sn", "Zn"}, 1, 1, 1, "Relu", nhwc_io)};
    c.claim_whole = true;
    v.push_back(c);
  }
  // The same block at stride 2 over a batch of 2 odd-sized images, 40 expanded channels (a partial 16-channel block),
  // zero points off 0 and the projection requantized to u8 (a block no residual Add reads: MobileNetV2's stage ends);
  // and a block whose depthwise output two 1x1 QConvs read (the cpu_onednn plugin's own step then stops at the
  // depthwise convolution: chain/ops/int8.cc, Builder::qconv_expand_dw).
  for (const bool two_readers : {false, true}) {
    OpCase c;
    c.op = "Chain";
    c.label = two_readers ? "int8 expand 16->40 -> depthwise 3x3 read by two QConvs 1x1 -> their f32 outputs"
                          : "int8 block at stride 2, batch 2, 15x13: expand 16->40 -> depthwise s2 -> project -> u8";
    c.inputs = {in("X", {2, 16, 15, 13}, false, -3.f, 3.f)};
    act_q(c, "x", 0.03f, 120);
    layer(c, "e", 40, 16, 1, 0.005f);
    act_q(c, "e", 0.03f, 3);
    layer(c, "d", 40, 1, 3, 0.004f);
    act_q(c, "d", 0.03f, 5);
    layer(c, "p", 24, 40, 1, 0.003f);
    act_q(c, "p", 0.04f, 131);
    c.chain = {qc({"X", "We", "Be", "Sx", "Zx", "WSe", "Se", "Ze"}, 1, 1, 1, "Clip", {{"output_layout", S("NHWC")}}),
               qc({"$0", "Wd", "Bd", "Se", "Ze", "WSd", "Sd", "Zd"}, 3, two_readers ? 1 : 2, 40, "Clip", nhwc_io)};
    if (two_readers) {
      layer(c, "q", 8, 40, 1, 0.003f);
      c.chain.push_back(qc({"$1", "Wp", "Bp", "Sd", "Zd", "WSp"}, 1, 1, 1, "", {{"input_layout", S("NHWC")}}));
      c.chain.push_back(qc({"$1", "Wq", "Bq", "Sd", "Zd", "WSq"}, 1, 1, 1, "Relu", {{"input_layout", S("NHWC")}}));
    } else {
      c.chain.push_back(qc({"$1", "Wp", "Bp", "Sd", "Zd", "WSp", "Sp", "Zp"}, 1, 1, 1, "", nhwc_io));
    }
    c.claim_whole = true;
    v.push_back(c);
  }
  // An image's stem: f32 X with fewer channels than a group of 4 (3, an RGB image) or a partial group after whole
  // ones (6), quantized by the chain into the first QConv's channels-last bytes (the plugin's own loop, any channel
  // count), a 7x7 / 3x3 stride-2 QConv with Relu, then a 1x1 to f32; batch 2 and a spatial size that is not a multiple
  // of 16 (a masked tail).
  for (const int64_t channels : {int64_t{3}, int64_t{6}}) {
    OpCase c;
    c.op = "Chain";
    c.label = "int8 stem: f32 image with " + std::to_string(channels) +
              " channels -> QConv s2 +Relu (X quantized into channels-last) -> QConv 1x1 -> f32";
    const int64_t k = channels == 3 ? 7 : 3;
    c.inputs = {in("X", {2, channels, 19, 21}, false, -2.f, 2.f)};
    act_q(c, "x", 0.02f, 128);
    layer(c, "s", 16, channels, k, 0.004f);
    act_q(c, "s", 0.03f, 0);
    layer(c, "p", 8, 16, 1, 0.004f);
    c.chain = {qc({"X", "Ws", "Bs", "Sx", "Zx", "WSs", "Ss", "Zs"}, k, 2, 1, "Relu", {{"output_layout", S("NHWC")}}),
               qc({"$0", "Wp", "Bp", "Ss", "Zs", "WSp"}, 1, 1, 1, "", {{"input_layout", S("NHWC")}})};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // The fp32 -> int8 boundary inside one chain: an f32 Conv over 24 channels (oneDNN's nChw16c after a blocked
    // producer, a partial last block) quantized straight into the expand's layout, a residual block with it as Z, a
    // stride-2 block whose project writes f32, then GlobalAveragePool, Flatten and a QGemm quantizing its f32 A
    // (MobileNetV2's tail).
    OpCase c;
    c.op = "Chain";
    c.label =
        "int8 after an fp32 prefix: Conv+Relu, Conv -> int8 block +Z -> stride-2 depthwise -> GlobalAveragePool -> "
        "QGemm";
    c.inputs = {in("X", {1, 16, 14, 14}), in("W0", {32, 16, 3, 3}, true, -0.3f, 0.3f), in("B0", {32}, true),
                in("W1", {24, 32, 1, 1}, true, -0.3f, 0.3f), in("B1", {24}, true)};
    act_q(c, "x", 0.02f, 128);
    layer(c, "e", 96, 24, 1, 0.004f);
    act_q(c, "e", 0.03f, 0);
    layer(c, "d", 96, 1, 3, 0.004f);
    act_q(c, "d", 0.03f, 0);
    layer(c, "p", 24, 96, 1, 0.002f);
    layer(c, "e2", 64, 24, 1, 0.004f);
    act_q(c, "e2", 0.03f, 0);
    layer(c, "d2", 64, 1, 3, 0.004f);
    act_q(c, "d2", 0.03f, 0);
    layer(c, "p2", 40, 64, 1, 0.003f);
    c.inputs.push_back(qin("G", {10, 40}, DType::kI8, true, -127.f, 127.f));
    c.inputs.push_back(in("GB", {10}, true));
    c.inputs.push_back(qconst("GS", {10}, DType::kF32, channel_scales(10, 0.003f)));
    act_q(c, "g", 0.01f, 128);
    c.chain = {{"Conv", {"X", "W0", "B0"}, {{"kernel_shape", Is({3, 3})}, {"pads", Is({1, 1, 1, 1})}}},
               {"Relu", {"$0"}, {}},
               {"Conv", {"$1", "W1", "B1"}, {{"kernel_shape", Is({1, 1})}}},
               qc({"$2", "We", "Be", "Sx", "Zx", "WSe", "Se", "Ze"}, 1, 1, 1, "Clip", {{"output_layout", S("NHWC")}}),
               qc({"$3", "Wd", "Bd", "Se", "Ze", "WSd", "Sd", "Zd"}, 3, 1, 96, "Clip", nhwc_io),
               qc({"$4", "Wp", "Bp", "Sd", "Zd", "WSp", "", "", "$2"}, 1, 1, 1, "",
                  {{"input_layout", S("NHWC")}, {"output_layout", S("NHWC")}, {"residual_layout", S("NCHW")}}),
               qc({"$5", "We2", "Be2", "Sx", "Zx", "WSe2", "Se2", "Ze2"}, 1, 1, 1, "Clip", nhwc_io),
               qc({"$6", "Wd2", "Bd2", "Se2", "Ze2", "WSd2", "Sd2", "Zd2"}, 3, 2, 64, "Clip", nhwc_io),
               qc({"$7", "Wp2", "Bp2", "Sd2", "Zd2", "WSp2"}, 1, 1, 1, "", {{"input_layout", S("NHWC")}}),
               {"GlobalAveragePool", {"$8"}, {}},
               {"Flatten", {"$9"}, {}},
               {"keel.QGemm", {"$10", "G", "GB", "Sg", "Zg", "GS"}, {{"transB", I(1)}}}};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // What fuse_qdq leaves of QuantizeLinear / DequantizeLinear: a QuantizeLinear two QConvs read (not folded into
    // either), DequantizeLinears of the QConvs' u8 outputs read by an f32 Add.
    OpCase c;
    c.op = "Chain";
    c.label = "int8 QuantizeLinear read by two QConvs -> DequantizeLinear of each -> Add";
    c.inputs = {in("X", {1, 20, 9, 11}, false, -2.f, 2.f)};
    act_q(c, "x", 0.015f, 120);
    layer(c, "a", 32, 20, 3, 0.003f);
    act_q(c, "a", 0.04f, 5);
    layer(c, "b", 32, 20, 1, 0.004f);
    act_q(c, "b", 0.03f, -2, DType::kI8);
    c.chain = {{"QuantizeLinear", {"X", "Sx", "Zx"}, {}},
               qc({"$0", "Wa", "Ba", "Sx", "Zx", "WSa", "Sa", "Za"}, 3, 1, 1, "Relu"),
               qc({"$0", "Wb", "Bb", "Sx", "Zx", "WSb", "Sb", "Zb"}, 1, 1, 1, ""),
               {"DequantizeLinear", {"$1", "Sa", "Za"}, {}},
               {"DequantizeLinear", {"$2", "Sb", "Zb"}, {}},
               {"Add", {"$3", "$4"}, {}}};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // ResNet's int8 basic block, batch 2: channels-last u8 bytes as the chain's input (input_layout NHWC), s8
    // activations with a zero point, a 3x3 stride 2, the downsampling 1x1 as the second 3x3's Z, MaxPool of the f32
    // output.
    OpCase c;
    c.op = "Chain";
    c.label = "int8 downsampling basic block, batch 2: u8 NHWC in -> 3x3 s2 (s8) -> 3x3 +Z (1x1 s2) -> MaxPool";
    c.inputs = {qin("X", {2, 32, 10, 10}, DType::kU8, false, 0.f, 255.f)};
    act_q(c, "x", 0.02f, 7);
    layer(c, "a", 48, 32, 3, 0.002f);
    act_q(c, "a", 0.05f, -3, DType::kI8);
    layer(c, "b", 48, 48, 3, 0.002f);
    layer(c, "s", 48, 32, 1, 0.004f);
    c.chain = {qc({"X", "Wa", "Ba", "Sx", "Zx", "WSa", "Sa", "Za"}, 3, 2, 1, "Relu", nhwc_io),
               qc({"X", "Ws", "Bs", "Sx", "Zx", "WSs"}, 1, 2, 1, "", nhwc_io),
               qc({"$0", "Wb", "Bb", "Sa", "Za", "WSb", "", "", "$1"}, 3, 1, 1, "Relu",
                  {{"input_layout", S("NHWC")}, {"residual_layout", S("NHWC")}}),
               {"MaxPool", {"$2"}, {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}}}};
    c.claim_whole = true;
    v.push_back(c);
  }
  // A small CNN's int8 tail as fuse_qdq leaves it once the QuantizeLinear in front of the classifier has moved over
  // Flatten and MaxPool (hoist_quantize): the first QConv (one input channel, an image) requantizes with Relu into
  // bytes, the max pooling and the Flatten run on the bytes, the QGemm reads them. u8 with SimpleCNN's 2x2 pooling
  // over odd sizes (the last column dropped); s8 with a zero point and a padded 3x3 stride-2 pooling (padding never
  // wins: it is not a value) then a global one.
  for (const bool s8 : {false, true}) {
    OpCase c;
    c.op = "Chain";
    c.label = std::string("int8 small CNN, ") + (s8 ? "s8" : "u8") +
              ": f32 image -> QConv +Relu (requantized) -> MaxPool -> " + (s8 ? "GlobalMaxPool -> " : "") +
              "Flatten -> QGemm, pooling on bytes";
    c.inputs = {in("X", {3, 1, 15, 13}, false, 0.f, 1.f)};
    act_q(c, "x", 1.f / 255.f, 0);
    layer(c, "c", s8 ? 24 : 32, 1, 3, 0.004f);
    act_q(c, "c", 0.02f, s8 ? -5.f : 0.f, s8 ? DType::kI8 : DType::kU8);
    const int64_t M = s8 ? 24 : 32, K = s8 ? M : M * 6 * 5;  // u8: 13x11 pooled 2x2 to 6x5
    c.inputs.push_back(qin("G", {10, K}, DType::kI8, true, -127.f, 127.f));
    c.inputs.push_back(in("GB", {10}, true));
    c.inputs.push_back(qconst("GS", {10}, DType::kF32, channel_scales(10, 0.003f)));
    std::map<std::string, Attribute> conv = {{"kernel_shape", Is({3, 3})}, {"activation", S("Relu")}};
    c.chain = {{"keel.QConv", {"X", "Wc", "Bc", "Sx", "Zx", "WSc", "Sc", "Zc"}, conv}};
    if (s8) {
      c.chain.push_back(
          {"MaxPool", {"$0"}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}}});
      c.chain.push_back({"GlobalMaxPool", {"$1"}, {}});
    } else {
      c.chain.push_back({"MaxPool", {"$0"}, {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}}});
    }
    const std::string pooled = s8 ? "$2" : "$1", flat = s8 ? "$3" : "$2";
    c.chain.push_back({"Flatten", {pooled}, {}});
    c.chain.push_back({"keel.QGemm", {flat, "G", "GB", "Sc", "Zc", "GS"}, {{"transB", I(1)}}});
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // ResNet's int8 stem as fuse_qdq leaves it: an RGB image quantized by a 7x7 stride-2 QConv with Relu that
    // requantizes, the 3x3 / 2 padded max pooling on its bytes (windows overlapping by a row), a 1x1 QConv after it.
    OpCase c;
    c.op = "Chain";
    c.label = "int8 RGB stem: f32 image -> QConv 7x7 s2 +Relu (requantized) -> MaxPool 3x3 s2 p1 -> QConv 1x1 -> f32";
    c.inputs = {in("X", {2, 3, 21, 19}, false, -2.f, 2.f)};
    act_q(c, "x", 0.02f, 128);
    layer(c, "s", 32, 3, 7, 0.004f);
    act_q(c, "s", 0.03f, 4);
    layer(c, "p", 16, 32, 1, 0.004f);
    c.chain = {qc({"X", "Ws", "Bs", "Sx", "Zx", "WSs", "Ss", "Zs"}, 7, 2, 1, "Relu"),
               {"MaxPool", {"$0"}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}}},
               qc({"$1", "Wp", "Bp", "Ss", "Zs", "WSp"}, 1, 1, 1, "")};
    c.claim_whole = true;
    v.push_back(c);
  }
  // QConvs of any spatial rank (1-D: TCN / audio, 3-D: video), kernel k per spatial axis, stride s, pads p, dilation
  // d; weights [M, C/g, k...] (layer_n).
  auto qcn = [](std::vector<std::string> ins, size_t rank, int64_t k, int64_t s, int64_t p, int64_t d, int64_t g,
                const char* act, std::map<std::string, Attribute> extra = {}) {
    std::map<std::string, Attribute> a = {{"kernel_shape", Is(std::vector<int64_t>(rank, k))},
                                          {"strides", Is(std::vector<int64_t>(rank, s))},
                                          {"pads", Is(std::vector<int64_t>(2 * rank, p))},
                                          {"dilations", Is(std::vector<int64_t>(rank, d))},
                                          {"group", I(g)}};
    if (act[0]) a["activation"] = S(act);
    if (std::string(act) == "Clip") a["activation_params"] = Attribute::of_floats({0.f, 6.f});
    for (auto& [key, val] : extra) a[key] = val;
    return ChainNode{"keel.QConv", std::move(ins), std::move(a)};
  };
  auto layer_n = [](OpCase& c, const std::string& k, int64_t M, int64_t Cg, size_t rank, int64_t ks, float wscale) {
    Shape w{M, Cg};
    for (size_t i = 0; i < rank; ++i) w.push_back(ks);
    c.inputs.push_back(qin("W" + k, w, DType::kI8, true, -127.f, 127.f));
    c.inputs.push_back(in("B" + k, {M}, true, -0.5f, 0.5f));
    c.inputs.push_back(qconst("WS" + k, {M}, DType::kF32, channel_scales(M, wscale)));
  };
  {
    // A 1-D (temporal) int8 block, batch 2, behind an fp32 Conv1d (which the chain lifts to 2-D): a QuantizeLinear
    // read by two QConvs (written channels-last for them), a dilated k3, a depthwise k3 stride 2, the strided 1x1
    // shortcut as the project's Z, a plain f32 output.
    OpCase c;
    c.op = "Chain";
    c.label =
        "int8 1-D block, batch 2: Conv1d+Relu -> QuantizeLinear -> dilated QConv k3, depthwise s2, 1x1 +Z (1x1 s2)";
    c.inputs = {in("X", {2, 12, 40}), in("W0", {16, 12, 3}, true, -0.3f, 0.3f), in("B0", {16}, true)};
    act_q(c, "x", 0.02f, 10);
    layer_n(c, "e", 24, 16, 1, 3, 0.003f);
    act_q(c, "e", 0.03f, 0);
    layer_n(c, "d", 24, 1, 1, 3, 0.004f);
    act_q(c, "d", 0.03f, 0);
    layer_n(c, "s", 20, 16, 1, 1, 0.004f);
    layer_n(c, "p", 20, 24, 1, 1, 0.002f);
    c.chain = {{"Conv", {"X", "W0", "B0"}, {{"kernel_shape", Is({3})}, {"pads", Is({1, 1})}}},
               {"Relu", {"$0"}, {}},
               {"QuantizeLinear", {"$1", "Sx", "Zx"}, {}},
               qcn({"$2", "We", "Be", "Sx", "Zx", "WSe", "Se", "Ze"}, 1, 3, 1, 2, 2, 1, "Relu",
                   {{"output_layout", S("NHWC")}}),
               qcn({"$3", "Wd", "Bd", "Se", "Ze", "WSd", "Sd", "Zd"}, 1, 3, 2, 1, 1, 24, "Clip", nhwc_io),
               qcn({"$2", "Ws", "Bs", "Sx", "Zx", "WSs"}, 1, 1, 2, 0, 1, 1, "", {{"output_layout", S("NHWC")}}),
               qcn({"$4", "Wp", "Bp", "Sd", "Zd", "WSp", "", "", "$5"}, 1, 1, 1, 0, 1, 1, "",
                   {{"input_layout", S("NHWC")}, {"residual_layout", S("NHWC")}})};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // A 3-D (video) int8 block behind an fp32 Conv3d over 24 channels (nCdhw16c with a partial block): the
    // QuantizeLinear two QConvs read quantized straight from that layout into channels-last; an expand 1x1x1, a
    // depthwise 3x3x3 stride 2, a project with the strided 3x3x3 as Z, GlobalAveragePool of the f32 output.
    OpCase c;
    c.op = "Chain";
    c.label = "int8 3-D block: Conv3d -> QuantizeLinear -> QConv 1x1x1, depthwise 3x3x3 s2, 1x1x1 +Z (3x3x3 s2) -> GAP";
    c.inputs = {in("X", {1, 8, 6, 10, 10}), in("W0", {24, 8, 3, 3, 3}, true, -0.2f, 0.2f), in("B0", {24}, true)};
    act_q(c, "x", 0.02f, 128);
    layer_n(c, "e", 32, 24, 3, 1, 0.004f);
    act_q(c, "e", 0.03f, 0);
    layer_n(c, "d", 32, 1, 3, 3, 0.003f);
    act_q(c, "d", 0.03f, 0);
    layer_n(c, "s", 16, 24, 3, 3, 0.001f);
    layer_n(c, "p", 16, 32, 3, 1, 0.002f);
    c.chain = {{"Conv", {"X", "W0", "B0"}, {{"kernel_shape", Is({3, 3, 3})}, {"pads", Is({1, 1, 1, 1, 1, 1})}}},
               {"QuantizeLinear", {"$0", "Sx", "Zx"}, {}},
               qcn({"$1", "We", "Be", "Sx", "Zx", "WSe", "Se", "Ze"}, 3, 1, 1, 0, 1, 1, "Clip",
                   {{"output_layout", S("NHWC")}}),
               qcn({"$2", "Wd", "Bd", "Se", "Ze", "WSd", "Sd", "Zd"}, 3, 3, 2, 1, 1, 32, "Clip", nhwc_io),
               qcn({"$1", "Ws", "Bs", "Sx", "Zx", "WSs"}, 3, 3, 2, 1, 1, 1, "", {{"output_layout", S("NHWC")}}),
               qcn({"$3", "Wp", "Bp", "Sd", "Zd", "WSp", "", "", "$4"}, 3, 1, 1, 0, 1, 1, "",
                   {{"input_layout", S("NHWC")}, {"residual_layout", S("NHWC")}}),
               {"GlobalAveragePool", {"$5"}, {}}};
    c.claim_whole = true;
    v.push_back(c);
  }
  {
    // The fp32 -> int8 boundary in front of a depthwise layer (fuse_qdq folded the QuantizeLinear into it: f32 X):
    // an fp32 1x1 over 48 channels, the depthwise 3x3 quantizing its X (u8 with a zero point, then the own kernel),
    // a 1x1 project with f32 output; then the same with s8 and a stride-2 depthwise over 14 columns.
    for (int s8 = 0; s8 < 2; ++s8) {
      OpCase c;
      c.op = "Chain";
      c.label = std::string("int8 boundary at a depthwise 3x3: Conv 1x1 -> QConv dw (f32 X -> ") +
                (s8 ? "s8, s2" : "u8") + ") -> QConv 1x1";
      c.inputs = {in("X", {1, 24, 14, 14}), in("W0", {48, 24, 1, 1}, true, -0.3f, 0.3f), in("B0", {48}, true)};
      act_q(c, "x", 0.025f, s8 ? 3.f : 100.f, s8 ? DType::kI8 : DType::kU8);
      layer(c, "d", 48, 1, 3, 0.004f);
      act_q(c, "d", 0.03f, 0);
      layer(c, "p", 16, 48, 1, 0.002f);
      c.chain = {{"Conv", {"X", "W0", "B0"}, {{"kernel_shape", Is({1, 1})}}},
                 qc({"$0", "Wd", "Bd", "Sx", "Zx", "WSd", "Sd", "Zd"}, 3, s8 ? 2 : 1, 48, "Clip",
                    {{"output_layout", S("NHWC")}}),
                 qc({"$1", "Wp", "Bp", "Sd", "Zd", "WSp"}, 1, 1, 1, "", {{"input_layout", S("NHWC")}})};
      c.claim_whole = true;
      v.push_back(c);
    }
  }
  {
    // The same QuantizeLinear in 2-D behind an fp32 Conv over 40 channels (nChw16c, a partial block), read by the
    // own depthwise 3x3 and a 1x1 (s8 activations with a zero point).
    OpCase c;
    c.op = "Chain";
    c.label = "int8 Conv -> QuantizeLinear (s8) -> depthwise 3x3 and 1x1 QConvs -> 1x1 +Z";
    c.inputs = {in("X", {1, 16, 12, 12}), in("W0", {40, 16, 3, 3}, true, -0.2f, 0.2f), in("B0", {40}, true)};
    act_q(c, "x", 0.02f, -5, DType::kI8);
    layer(c, "d", 40, 1, 3, 0.004f);
    act_q(c, "d", 0.03f, 0);
    layer(c, "s", 24, 40, 1, 0.002f);
    layer(c, "p", 24, 40, 1, 0.002f);
    c.chain = {{"Conv", {"X", "W0", "B0"}, {{"kernel_shape", Is({3, 3})}, {"pads", Is({1, 1, 1, 1})}}},
               {"QuantizeLinear", {"$0", "Sx", "Zx"}, {}},
               qc({"$1", "Wd", "Bd", "Sx", "Zx", "WSd", "Sd", "Zd"}, 3, 1, 40, "Clip", {{"output_layout", S("NHWC")}}),
               qc({"$1", "Ws", "Bs", "Sx", "Zx", "WSs"}, 1, 1, 1, "", {{"output_layout", S("NHWC")}}),
               qc({"$2", "Wp", "Bp", "Sd", "Zd", "WSp", "", "", "$3"}, 1, 1, 1, "Relu",
                  {{"input_layout", S("NHWC")}, {"residual_layout", S("NHWC")}})};
    c.claim_whole = true;
    v.push_back(c);
  }
}

std::vector<OpCase> make_cases() {
  std::vector<OpCase> v;
  add_conv_cases(v);
  add_conv_transpose_cases(v);
  add_matmul_cases(v);
  add_pool_cases(v);
  add_norm_cases(v);
  add_elementwise_cases(v);
  add_layout_cases(v);
  add_tensor_op_cases(v);
  add_int8_cases(v);
  add_qdq_cases(v);
  add_training_cases(v);
  add_chain_cases(v);
  add_bf16_chain_cases(v);
  add_int8_chain_cases(v);      // after the bf16 copies: int8 chains have none
  add_bf16_inference_cases(v);  // before the GPU cases: bf16 copies of the f32 tables above only
  add_fused_and_half_cases(v);
  add_attention_cases(v);
  add_training_device_cases(v);
  return v;
}

Tensor make_input(const InputSpec& s, uint32_t seed) {
  if (s.dtype != DType::kF32) {
    // Integers: the values, or uniform integers in [lo, hi].
    Tensor t = Tensor::host(s.dtype, s.shape).value();
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> u(static_cast<int>(s.lo), static_cast<int>(s.hi));
    for (int64_t i = 0; i < t.numel(); ++i) {
      const int v = s.values.empty() ? u(rng) : static_cast<int>(s.values[static_cast<size_t>(i) % s.values.size()]);
      switch (s.dtype) {
        case DType::kU8: t.data<uint8_t>()[i] = static_cast<uint8_t>(v); break;
        case DType::kI8: t.data<int8_t>()[i] = static_cast<int8_t>(v); break;
        case DType::kI32: t.data<int32_t>()[i] = v; break;
        case DType::kBool: t.data<bool>()[i] = v != 0; break;
        default: t.data<int64_t>()[i] = v; break;
      }
    }
    return t;
  }
  Tensor t = Tensor::host(DType::kF32, s.shape).value();
  float* p = t.data<float>();
  if (!s.values.empty()) {
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = s.values[static_cast<size_t>(i) % s.values.size()];
    return t;
  }
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(s.lo, s.hi);
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = u(rng);
  return t;
}

uint32_t seed_of(const OpCase& c, size_t input) {
  return static_cast<uint32_t>(std::hash<std::string>{}(c.op + "|" + c.label) + 7919 * input);
}

}  // namespace

Built build(const OpCase& c, int64_t batch, uint32_t salt) {
  Built b;
  GraphBuilder gb("cts_" + c.op, c.opset);
  std::vector<std::string> names;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    InputSpec s = c.inputs[i];
    if (s.name.empty()) {
      names.push_back("");
      continue;
    }
    if (batch > 0 && !s.constant && !s.shape.empty()) s.shape[0] = batch;
    Tensor t = make_input(s, seed_of(c, i) + (s.constant ? 0 : salt * 104729u));
    for (const auto& [index, value] : c.int64_constants)
      if (index == i) t = value;
    if (t.dtype() == DType::kF32 && (c.dtype == DType::kBF16 || c.dtype == DType::kF16)) {
      Tensor h = Tensor::host(c.dtype, t.shape()).value();
      for (int64_t j = 0; j < t.numel(); ++j)
        h.data<uint16_t>()[j] =
            c.dtype == DType::kBF16 ? f32_to_bf16(t.data<float>()[j]) : f32_to_f16(t.data<float>()[j]);
      t = h;
    } else if (t.dtype() == DType::kF32 && c.dtype == DType::kF16) {
      Tensor h = Tensor::host(DType::kF16, t.shape()).value();
      for (int64_t j = 0; j < t.numel(); ++j) h.data<uint16_t>()[j] = f32_to_f16(t.data<float>()[j]);
      t = h;
    }
    if (s.constant) {
      names.push_back(gb.constant(s.name, t));
    } else {
      Shape declared = s.shape;
      if (c.first_batch > 0 && !declared.empty()) declared[0] = -1;
      names.push_back(gb.input(s.name, t.dtype(), declared));
      b.feeds.emplace_back(s.name, t);
    }
  }
  if (!c.chain.empty()) {
    std::map<std::string, std::string> by_name;
    for (size_t i = 0; i < c.inputs.size(); ++i)
      if (!c.inputs[i].name.empty()) by_name[c.inputs[i].name] = names[i];
    std::vector<std::vector<std::string>> produced;  // each node's outputs
    auto value = [&](const std::string& r) {         // "$k" or "$k:i"
      const size_t colon = r.find(':');
      return produced.at(std::stoul(r.substr(1, colon == std::string::npos ? std::string::npos : colon - 1)))
          .at(colon == std::string::npos ? 0 : std::stoul(r.substr(colon + 1)));
    };
    for (const ChainNode& n : c.chain) {
      std::vector<std::string> ins;
      for (const auto& r : n.inputs) {
        if (r.empty()) ins.push_back("");
        else if (r[0] == '$') ins.push_back(value(r));
        else ins.push_back(by_name.at(r));
      }
      const size_t dot = n.op.find('.');
      const std::string domain = dot == std::string::npos ? "" : n.op.substr(0, dot);
      if (!domain.empty()) gb.graph().opsets[domain] = 1;
      produced.push_back(
          gb.op(n.op.substr(dot == std::string::npos ? 0 : dot + 1), ins, n.attrs, n.num_outputs, domain));
    }
    gb.output(produced.back()[0]);
    for (const std::string& r : c.also_outputs) gb.output(value(r));
    b.graph = gb.take();
    return b;
  }
  if (!c.domain.empty()) gb.graph().opsets[c.domain] = 1;
  auto outs = gb.op(c.op, names, c.attrs, c.num_outputs, c.domain);
  gb.output(outs[c.output]);
  for (size_t i : c.unnamed_outputs) gb.graph().node(*gb.graph().producer(outs[c.output]))->outputs.at(i).clear();
  b.graph = gb.take();
  return b;
}

namespace {

struct RunOut {
  Status status = Status::ok();
  // The compared outputs: the case's output and its also_outputs, of the run at first_batch (when set) then of the
  // run at the case's batch.
  std::vector<Tensor> outputs;
  std::vector<std::string> names;  // what each is ("$3 at batch 2", ...), for the report
  std::string kernel;
};

// One run's inputs and what its outputs are called in the report ("", " at batch 2", " (concurrent run 3)").
struct FeedSet {
  std::string at;
  std::vector<std::pair<std::string, Tensor>> feeds;
};

RunOut run_one(Environment& env, const OpCase& c, const std::string& device, bool oracle) {
  RunOut r;
  Built b = build(c);
  // In order: the run at first_batch, the case's run; then, with concurrent_runs, that many runs of other inputs
  // (with a dynamic batch some at other batches, one of them new) and the case's again, from as many threads at once on
  // the device under test (one after the other on the reference), every second one on a session sharing the build.
  std::vector<FeedSet> sequential, together;
  if (c.first_batch > 0)
    sequential.push_back({" at batch " + std::to_string(c.first_batch), build(c, c.first_batch).feeds});
  sequential.push_back({"", b.feeds});
  for (int32_t k = 1; k < c.concurrent_runs; ++k) {
    // With a dynamic batch: odd runs at first_batch (a variant built before), run 2 at a batch no run has used (a
    // variant built while the others run).
    int64_t batch = k % 2 == 1 ? c.first_batch : 0;
    if (k == 2 && c.first_batch > 0 && !c.inputs.empty() && !c.inputs[0].shape.empty())
      batch = std::max(c.first_batch, c.inputs[0].shape[0]) + 1;
    together.push_back(
        {" (concurrent run " + std::to_string(k) + (batch > 0 ? " at batch " + std::to_string(batch) : "") + ")",
         build(c, batch, static_cast<uint32_t>(k)).feeds});
  }
  if (c.concurrent_runs > 1) together.push_back({" (concurrent run 0)", b.feeds});
  SessionOptions so;
  so.devices = {device};
  so.fallback = Fallback::kError;
  if (c.auto_passes && !oracle) so.passes = auto_pass_pipeline(b.graph, env.registry());
  if (!oracle) so.threads = c.threads;
  auto s = Session::create(env, std::move(b.graph), so);
  if (!s.is_ok()) {
    r.status = s.status();
    return r;
  }
  auto take = [&](const FeedSet& set, StatusOr<std::vector<Tensor>>& out) {
    if (!out.is_ok()) {
      if (r.status.is_ok()) r.status = Status(out.status().code(), "run" + set.at + ": " + out.status().message());
      return;
    }
    for (size_t k = 0; k < out->size(); ++k) {
      r.outputs.push_back((*out)[k]);
      r.names.push_back((k == 0 ? std::string("output") : c.also_outputs.at(k - 1)) + set.at);
    }
  };
  for (const FeedSet& set : sequential) {
    auto out = (*s)->run(set.feeds);
    take(set, out);
    if (!r.status.is_ok()) return r;
  }
  // The build the case's run used (with a dynamic batch, its shape variant: what a device claiming chains claims).
  for (const auto& [node, op, dev, kernel] : (*s)->placement())
    if (op == (c.chain.empty() ? c.op : std::string("Subgraph")) && r.kernel.empty()) r.kernel = kernel;
  std::vector<StatusOr<std::vector<Tensor>>> outs(together.size(), Status(StatusCode::kInternal, "not run"));
  if (oracle) {
    for (size_t k = 0; k < together.size(); ++k) outs[k] = (*s)->run(together[k].feeds);
  } else if (!together.empty()) {
    // Every second concurrent run goes to a second session sharing the first's build (what `keel serve`'s instances
    // are) with a team of another size: one claim computed at once for two sessions with two plans.
    SessionOptions so2 = so;
    so2.threads = c.threads % 3 + 1;
    so2.share_weights_with = s->get();
    Built b2 = build(c);
    auto s2 = Session::create(env, std::move(b2.graph), so2);
    if (!s2.is_ok()) {
      r.status = Status(s2.status().code(), "a session sharing the build: " + s2.status().message());
      return r;
    }
    std::latch start(static_cast<std::ptrdiff_t>(together.size()));
    std::vector<std::thread> threads;
    for (size_t k = 0; k < together.size(); ++k)
      threads.emplace_back([&, k] {
        start.arrive_and_wait();
        outs[k] = (k % 2 == 1 ? *s2 : *s)->run(together[k].feeds);
      });
    for (std::thread& t : threads) t.join();
  }
  for (size_t k = 0; k < together.size(); ++k) take(together[k], outs[k]);
  return r;
}

std::string fmt(double v) {
  std::ostringstream os;
  os << std::setprecision(3) << v;
  return os.str();
}

// Compares one output of the device under test with the reference's (as doubles: f32/f16/bf16, or integer outputs
// of int8 kernels within c.int_tol); the first failure of a case sets r's outcome and message (prefixed with
// `what`); the largest errors are over all its outputs.
void compare(const Tensor& got, const Tensor& ref, const OpCase& c, const std::string& what, CaseResult& r) {
  if (got.shape() != ref.shape() || got.dtype() != ref.dtype()) {
    if (r.outcome != Outcome::kPass) return;
    r.outcome = Outcome::kFail;
    r.message = what + "output " + std::string(dtype_name(got.dtype())) + " " + shape_label(got.shape()) +
                ", reference " + dtype_name(ref.dtype()) + " " + shape_label(ref.shape());
    return;
  }
  auto as_double = [](const Tensor& t) {
    std::vector<double> d(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      switch (t.dtype()) {
        case DType::kU8: d[static_cast<size_t>(i)] = t.data<uint8_t>()[i]; break;
        case DType::kI8: d[static_cast<size_t>(i)] = t.data<int8_t>()[i]; break;
        case DType::kI32: d[static_cast<size_t>(i)] = t.data<int32_t>()[i]; break;
        case DType::kI64: d[static_cast<size_t>(i)] = static_cast<double>(t.data<int64_t>()[i]); break;
        case DType::kBF16: d[static_cast<size_t>(i)] = bf16_to_f32(t.data<uint16_t>()[i]); break;
        case DType::kF16: d[static_cast<size_t>(i)] = f16_to_f32(t.data<uint16_t>()[i]); break;
        default: d[static_cast<size_t>(i)] = t.data<float>()[i]; break;
      }
    }
    return d;
  };
  const bool integer = ref.dtype() != DType::kF32 && ref.dtype() != DType::kBF16 && ref.dtype() != DType::kF16;
  const std::vector<double> a = as_double(got), e = as_double(ref);
  const size_t n = e.size();
  double max_ref = 0;
  for (size_t i = 0; i < n; ++i) max_ref = std::max(max_ref, std::fabs(e[i]));
  const double atol = integer ? c.int_tol : c.atol * std::max(1.0, max_ref);
  size_t worst = 0, bad = 0;
  double worst_excess = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(a[i] - e[i]);
    const bool nan_mismatch = std::isnan(a[i]) != std::isnan(e[i]);
    r.max_abs_err = std::max(r.max_abs_err, d);
    if (e[i] != 0) r.max_rel_err = std::max(r.max_rel_err, d / std::fabs(e[i]));
    const double lim = atol + (integer ? 0.0 : c.rtol * std::fabs(e[i]));
    if (nan_mismatch || d > lim) {
      ++bad;
      const double excess = nan_mismatch ? 1e30 : d / lim;
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  if (bad && r.outcome == Outcome::kPass) {
    r.outcome = Outcome::kFail;
    r.message = what + std::to_string(bad) + "/" + std::to_string(n) + " elements off; worst at " +
                std::to_string(worst) + ": " + fmt(a[worst]) + " vs " + fmt(e[worst]) + " (max abs err " +
                fmt(r.max_abs_err) + ")";
  }
}

}  // namespace

const std::vector<OpCase>& all_cases() {
  static const std::vector<OpCase> cases = make_cases();
  return cases;
}

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kPass: return "pass";
    case Outcome::kFail: return "FAIL";
    case Outcome::kError: return "ERROR";
    case Outcome::kInvalid: return "invalid";
    case Outcome::kUnsupported: return "unsupported";
  }
  return "?";
}

std::string repro(const std::string& device, const OpCase& c) {
  if (c.generated) {
    return "keel-cts --device " + device + (c.generated->grads ? " --random-grads" : " --random-chains") +
           " 1 --seed " + std::to_string(c.generated->seed) + (c.generated->mode == DType::kBF16 ? " --bf16" : "") +
           (c.generated->mode == DType::kI8 ? " --int8" : "");
  }
  return "keel-cts --device " + device + " --op " + c.op + " --case '" + c.label + "'";
}

bool selected(const Options& o, const OpCase& c) {
  return (o.op.empty() || c.op == o.op) && (o.label.empty() || c.label == o.label);
}

Report run(Environment& dut, Environment& oracle, const Options& o) {
  Report rep;
  for (const OpCase& c : o.cases ? *o.cases : all_cases()) {
    if (!selected(o, c)) continue;
    CaseResult r;
    r.c = &c;
    r.repro = repro(o.device, c);
    RunOut ref = run_one(oracle, c, "cpu", true);
    if (!ref.status.is_ok()) {
      // The reference cannot run it: the case itself is wrong (a bug in the table), not the device.
      r.outcome = Outcome::kInvalid;
      r.message = "reference: " + ref.status.to_string();
    } else {
      RunOut got = run_one(dut, c, o.device, false);
      r.kernel = got.kernel;
      if (!got.status.is_ok()) {
        r.outcome = got.status.code() == StatusCode::kUnimplemented ? Outcome::kUnsupported : Outcome::kError;
        r.message = got.status.to_string();
      } else if (got.outputs.size() != ref.outputs.size()) {
        r.outcome = Outcome::kFail;
        r.message = std::to_string(got.outputs.size()) + " outputs, reference " + std::to_string(ref.outputs.size());
      } else {
        for (size_t k = 0; k < ref.outputs.size(); ++k)
          compare(got.outputs[k], ref.outputs[k], c, ref.outputs.size() > 1 ? ref.names[k] + ": " : "", r);
      }
    }
    bool native = o.kernel_prefix.empty() || r.kernel.rfind(o.kernel_prefix, 0) == 0;
    auto& nb = rep.native_by_op[c.op];
    nb.second++;
    if (native && (r.outcome == Outcome::kPass || r.outcome == Outcome::kFail)) {
      rep.native++;
      nb.first++;
    }
    switch (r.outcome) {
      case Outcome::kPass: rep.passed++; break;
      case Outcome::kFail: rep.failed++; break;
      case Outcome::kError: rep.errors++; break;
      case Outcome::kInvalid: rep.invalid++; break;
      case Outcome::kUnsupported: rep.unsupported++; break;
    }
    if (o.out && (o.verbose || (r.outcome != Outcome::kPass && r.outcome != Outcome::kUnsupported))) {
      *o.out << outcome_name(r.outcome) << "  " << c.op << " '" << c.label
             << "' kernel=" << (r.kernel.empty() ? "-" : r.kernel) << " max_abs_err=" << fmt(r.max_abs_err);
      if (!r.message.empty()) *o.out << "  " << r.message;
      if (r.outcome != Outcome::kPass) *o.out << "\n    repro: " << r.repro;
      *o.out << "\n";
    }
    if (o.on_case) o.on_case(r);
    rep.results.push_back(std::move(r));
  }
  if (o.out) {
    *o.out << "device " << o.device << ": " << rep.passed << " passed, " << rep.failed << " failed, " << rep.errors
           << " errors, " << rep.unsupported << " unsupported, " << rep.invalid << " invalid cases, of "
           << rep.results.size();
    if (!o.kernel_prefix.empty()) *o.out << "; " << rep.native << " ran on " << o.kernel_prefix << "* kernels";
    *o.out << "\n";
  }
  return rep;
}

}  // namespace keel::cts
