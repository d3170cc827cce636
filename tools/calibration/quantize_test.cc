// INT8 post-training quantization (tools/calibration/quantize.h): the calibration math on synthetic data (min-max,
// percentile, entropy thresholds), quantize_graph on a small conv net (ranges, error report, exclusion, tolerance),
// the calibration folder layouts, and `keel quantize` end to end on a tiny model.
#include "tools/calibration/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "tests/passes/pass_test_env.h"
#include "tools/calibration/gptq.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using cli::Feeds;

std::vector<float> randv(size_t n, uint32_t seed, float scale = 1.f, float mean = 0.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A 2048-bin histogram over [0, 1] of 100000 uniform samples (`nonneg` as Histogram::add's).
cli::Histogram uniform01_histogram(uint32_t seed, bool nonneg) {
  std::vector<float> v(100000);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(0.f, 1.f);
  for (auto& x : v) x = d(rng);
  cli::Histogram h;
  h.init(0, 1, 2048);
  h.add(v.data(), v.size(), nonneg);
  return h;
}

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("keel_quantize_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write_npy(const fs::path& file, const Tensor& t) {
  std::string shape = "(";
  for (int64_t d : t.shape()) shape += std::to_string(d) + ",";
  shape += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(file, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(t.raw_data()), static_cast<std::streamsize>(t.byte_size()));
}

// ------------------------------------------------------------------------------------------------ calibration math

TEST(Calibration, PercentileRangeCutsBothTails) {
  std::vector<float> v(10000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);  // uniform on [0, 9999]
  cli::Histogram h;
  h.init(0, 9999, 2048);
  h.add(v.data(), v.size(), false);
  auto r = cli::percentile_range(h, 99.0);  // 1% = 100 values cut from each end
  const double w = 9999.0 / 2048;
  EXPECT_NEAR(r.first, 100, 2 * w);
  EXPECT_NEAR(r.second, 9899, 2 * w);
  auto all = cli::percentile_range(h, 100.0);
  EXPECT_DOUBLE_EQ(all.first, 0);
  EXPECT_DOUBLE_EQ(all.second, 9999);
}

TEST(Calibration, PercentileIgnoresRareOutliers) {
  std::vector<float> v = randv(100000, 7);
  v[10] = 1000.f;  // one outlier: min-max would spend the whole u8 range on it
  v[20] = -800.f;
  cli::Histogram h;
  h.init(-800, 1000, 2048);
  h.add(v.data(), v.size(), false);
  auto r = cli::percentile_range(h, 99.9);
  EXPECT_GT(r.first, -10);
  EXPECT_LT(r.first, -1);
  EXPECT_LT(r.second, 10);
  EXPECT_GT(r.second, 1);
}

TEST(Calibration, EntropyThresholdClipsTheOutliersOfAGaussian) {
  std::vector<float> v = randv(200000, 3);
  for (int i = 0; i < 20; ++i) v[static_cast<size_t>(i) * 1000] = 60.f + static_cast<float>(i);
  float amax = 0;
  for (float x : v) amax = std::max(amax, std::fabs(x));
  cli::Histogram h;
  h.init(0, amax, 2048);
  h.add(v.data(), v.size(), true);
  double t = cli::entropy_threshold(h, 128);
  // The KL optimum for a unit Gaussian at 128 levels lies a few sigma out, far below the outliers.
  EXPECT_GT(t, 2.0);
  EXPECT_LT(t, 10.0);
}

TEST(Calibration, EntropyThresholdKeepsAUniformRange) {
  cli::Histogram h = uniform01_histogram(1, true);
  // Clipping a uniform distribution costs more than it gains: the threshold stays near the maximum.
  EXPECT_GT(cli::entropy_threshold(h, 255), 0.9);
}

// The mean squared error of quantizing `v` to u8 over [lo, hi] (what QuantizeLinear -> DequantizeLinear does).
double u8_mse(const std::vector<float>& v, double lo, double hi) {
  lo = std::min(lo, 0.0);
  hi = std::max(hi, 0.0);
  const double s = (hi - lo) / 255.0, zp = std::round(-lo / s);
  double e = 0;
  for (float x : v) {
    const double q = std::clamp(std::nearbyint(x / s) + zp, 0.0, 255.0);
    e += ((q - zp) * s - x) * ((q - zp) * s - x);
  }
  return e / static_cast<double>(v.size());
}

// An activation that stays away from zero (an average-pooled feature, a sigmoid's output): TensorRT's KL search
// folded it all into the last bin of a threshold below it (KL ~ 0 there), clipping 74% of ResNet-18's fc input
// range. No threshold may clip more than 1% of the values.
TEST(Calibration, EntropyThresholdKeepsAnActivationThatStaysAwayFromZero) {
  std::vector<float> v = randv(100000, 7, 0.03f, 0.3f);
  for (auto& x : v) x = std::max(x, 0.01f);
  cli::Histogram h;
  h.init(0, *std::max_element(v.begin(), v.end()), 2048);
  h.add(v.data(), v.size(), true);
  const double t = cli::entropy_threshold(h, 255);
  std::vector<float> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_GE(t, sorted[sorted.size() * 99 / 100]) << "clips more than 1% of the values";
  EXPECT_LT(u8_mse(v, 0, t), 2 * u8_mse(v, 0, h.hi));
}

// A ReLU's output: 3/4 exact zeros. Zero is on the grid at any threshold; as a spike in P it drowned the rest of the
// distribution, and the threshold then cut the positive values harder than their own error warrants.
TEST(Calibration, EntropyThresholdLeavesExactZerosOut) {
  std::vector<float> v = randv(200000, 9);
  double zeros = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = i % 4 == 0 ? std::fabs(v[i]) : 0.f;
    zeros += v[i] == 0.f;
  }
  cli::Histogram h;
  h.init(0, *std::max_element(v.begin(), v.end()), 2048);
  h.add(v.data(), v.size(), true);
  const double with = cli::entropy_threshold(h, 255, zeros), without = cli::entropy_threshold(h, 255, 0);
  std::printf("entropy threshold: %.4f with the zeros left out, %.4f with them (max %.4f); u8 MSE %.3g vs %.3g\n", with,
              without, h.hi, u8_mse(v, 0, with), u8_mse(v, 0, without));
  EXPECT_LT(u8_mse(v, 0, with), u8_mse(v, 0, without));
}

TEST(Calibration, MseRangeClipsAGaussianWhereTheQuantizationErrorIsLeast) {
  std::vector<float> v = randv(400000, 11);
  float mn = 0, mx = 0;
  for (float x : v) mn = std::min(mn, x), mx = std::max(mx, x);
  cli::Histogram h;
  h.init(mn, mx, 2048);
  h.add(v.data(), v.size(), false);
  auto r = cli::mse_range(h, 0, false);
  // Below min-max (about +-4.5 sigma here) on both sides, but not so far that clipping dominates.
  EXPECT_GT(r.first, mn + 0.2);
  EXPECT_LT(r.second, mx - 0.2);
  EXPECT_LT(r.first, -2.5);
  EXPECT_GT(r.second, 2.5);
  // The actual error of quantizing the samples with that range beats min-max and ranges clipped further or less.
  const double e = u8_mse(v, r.first, r.second);
  EXPECT_LT(e, 0.9 * u8_mse(v, mn, mx));
  EXPECT_LT(e, u8_mse(v, 0.7 * r.first, 0.7 * r.second));
  EXPECT_LT(e, u8_mse(v, 1.2 * r.first, 1.2 * r.second));
  // Skewed (the positive side three times wider): each bound is chosen on its own, so the positive one is clipped
  // relatively less than the negative one (a common shrink factor would keep the min-max ratio).
  std::vector<float> sk = v;
  for (float& x : sk) x = x > 0 ? 3 * x : x;
  cli::Histogram hs;
  hs.init(mn, 3 * mx, 2048);
  hs.add(sk.data(), sk.size(), false);
  auto rs = cli::mse_range(hs, 0, false);
  EXPECT_GT(rs.second / -rs.first, 1.05 * (3 * mx) / -mn);
  double joint = std::numeric_limits<double>::infinity();
  for (int k = 40; k <= 100; k += 2) joint = std::min(joint, u8_mse(sk, mn * k / 100.0, 3 * mx * k / 100.0));
  EXPECT_LT(u8_mse(sk, rs.first, rs.second), joint);
  // s8: symmetric.
  auto s = cli::mse_range(h, 0, true);
  EXPECT_DOUBLE_EQ(s.first, -s.second);
  EXPECT_LT(s.second, std::max(-mn, mx));
}

TEST(Calibration, MseRangeKeepsAUniformRangeAndCountsExactZerosAsFree) {
  cli::Histogram h = uniform01_histogram(2, false);
  auto r = cli::mse_range(h, 0, false);
  EXPECT_EQ(r.first, 0);
  EXPECT_GT(r.second, 0.97);  // clipping a uniform distribution costs more than it saves
  // ReLU output: 3/4 exact zeros, the rest |N(0, 1)|. The zeros quantize without error at any range, so counting
  // them as rounding noise (zeros = 0) would clip the positive values harder than their own error warrants.
  std::vector<float> v = randv(200000, 5);
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 4 == 0 ? std::fabs(v[i]) : 0.f;
  float mx = 0;
  double zeros = 0;
  for (float x : v) mx = std::max(mx, x), zeros += x == 0.f;
  cli::Histogram hr;
  hr.init(0, mx, 2048);
  hr.add(v.data(), v.size(), false);
  auto with = cli::mse_range(hr, zeros, false), without = cli::mse_range(hr, 0, false);
  EXPECT_EQ(with.first, 0);
  EXPECT_GT(with.second, without.second * 1.05);
  EXPECT_LT(with.second, mx);
  EXPECT_LE(u8_mse(v, 0, with.second), u8_mse(v, 0, without.second));
}

// ------------------------------------------------------------------------------------------------ quantize_graph

// x[N,3,8,8] -> Conv(8) -> Relu -> Conv(8) -> Relu -> GlobalAveragePool -> Flatten -> Gemm(5) -> y
Graph small_net(int64_t n = 2) {
  GraphBuilder b("qnet", 13);
  auto x = b.input("x", DType::kF32, {n, 3, 8, 8});
  std::map<std::string, Attribute> pads = {{"pads", Attribute::of_ints({1, 1, 1, 1})}};
  auto h = b.op("Conv",
                {x, b.constant("w1", Tensor::f32({8, 3, 3, 3}, randv(216, 1, 0.3f))),
                 b.constant("b1", Tensor::f32({8}, randv(8, 2, 0.1f)))},
                pads, 1)[0];
  b.graph().node(*b.graph().producer(h))->name = "conv1";
  h = b.op1("Relu", {h});
  auto h2 = b.op1("Conv",
                  {h, b.constant("w2", Tensor::f32({8, 8, 3, 3}, randv(576, 3, 0.2f))),
                   b.constant("b2", Tensor::f32({8}, randv(8, 4, 0.1f)))},
                  pads);
  b.graph().node(*b.graph().producer(h2))->name = "conv2";
  h = b.op1("Relu", {h2});
  h = b.op1("GlobalAveragePool", {h});
  h = b.op1("Flatten", {h});
  auto y = b.op1("Gemm",
                 {h, b.constant("wf", Tensor::f32({5, 8}, randv(40, 5, 0.5f))),
                  b.constant("bf", Tensor::f32({5}, randv(5, 6, 0.1f)))},
                 {{"transB", Attribute::of_int(1)}});
  b.graph().node(*b.graph().producer(y))->name = "fc";
  b.output(y);
  return b.take();
}

std::vector<Feeds> batches(size_t n, int64_t batch = 2, uint32_t seed = 100) {
  std::vector<Feeds> v;
  for (size_t i = 0; i < n; ++i)
    v.push_back({{"x", Tensor::f32({batch, 3, 8, 8},
                                   randv(static_cast<size_t>(batch * 192), seed + static_cast<uint32_t>(i)))}});
  return v;
}

cli::QuantizeOptions quiet() {
  cli::QuantizeOptions o;
  o.progress = false;
  return o;
}

const Node* node_named(const Graph& g, const std::string& name) {
  for (NodeId id : g.node_ids())
    if (g.node(id)->name == name) return g.node(id);
  return nullptr;
}

// True when input `i` of the node comes from a DequantizeLinear.
bool reads_dq(const Graph& g, const Node* n, size_t i) {
  auto p = g.producer(n->inputs[i]);
  return p && g.node(*p)->op_type == "DequantizeLinear";
}

TEST(QuantizeGraph, MinMaxRangeOfTheInputComesFromTheCalibrationBatches) {
  auto cal = batches(5);  // 4 calibrate, 1 held out
  auto mm = quiet();
  mm.method = "minmax";
  auto r = cli::quantize_graph(env(), small_net(), cal, mm);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  double lo = 0, hi = 0;
  for (size_t b = 0; b < 4; ++b) {
    const Tensor& t = cal[b][0].second;
    for (int64_t i = 0; i < t.numel(); ++i) {
      lo = std::min<double>(lo, t.data<float>()[i]);
      hi = std::max<double>(hi, t.data<float>()[i]);
    }
  }
  const Graph& g = r->graph;
  const Node* conv1 = node_named(g, "conv1");
  ASSERT_NE(conv1, nullptr);
  ASSERT_TRUE(reads_dq(g, conv1, 0));
  const Node* dq = g.node(*g.producer(conv1->inputs[0]));
  const Tensor& scale = g.initializers.at(dq->inputs[1]);
  const Tensor& zp = g.initializers.at(dq->inputs[2]);
  EXPECT_NEAR(scale.data<float>()[0], (hi - lo) / 255.0, 1e-6);
  EXPECT_EQ(zp.dtype(), DType::kU8);
  EXPECT_NEAR(zp.data<uint8_t>()[0], std::round(-lo / ((hi - lo) / 255.0)), 0.5);
  // Weights: per-channel s8.
  ASSERT_TRUE(reads_dq(g, conv1, 1));
  const Node* wdq = g.node(*g.producer(conv1->inputs[1]));
  EXPECT_EQ(g.initializers.at(wdq->inputs[0]).dtype(), DType::kI8);
  EXPECT_EQ(g.initializers.at(wdq->inputs[1]).numel(), 8);
  // Report: three layers, close to fp32.
  ASSERT_EQ(r->layers.size(), 3u);
  EXPECT_EQ(r->layers[0].node, "conv1");
  for (const auto& l : r->layers) {
    EXPECT_FALSE(l.kept_fp32);
    EXPECT_GT(l.cosine, 0.995) << l.node;
    EXPECT_GT(l.rel_error, 0.0) << l.node;  // quantization does change something
    EXPECT_LT(l.rel_error, 0.1) << l.node;
  }
  EXPECT_GT(r->output_cosine, 0.99);
  EXPECT_EQ(r->heldout_batches, 1u);
  // The QDQ graph runs and agrees with fp32 on a held-out batch.
  SessionOptions so;
  so.devices = {"cpu"};
  auto s = Session::create(env(), r->graph, so);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  auto out = s.value()->run(cal[4]);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out.value()[0].shape(), (Shape{2, 5}));
  // The default method (mse) picks mse_range() of the calibration values (a histogram over their min-max).
  auto m = cli::quantize_graph(env(), small_net(), cal, quiet());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  cli::Histogram h;
  h.init(lo, hi, 2048);
  for (size_t b = 0; b < 4; ++b)
    h.add(cal[b][0].second.data<float>(), static_cast<size_t>(cal[b][0].second.numel()), false);
  const auto mr = cli::mse_range(h, 0, false);
  const Node* mconv1 = node_named(m->graph, "conv1");
  ASSERT_TRUE(mconv1 && reads_dq(m->graph, mconv1, 0));
  const float mscale =
      m->graph.initializers.at(m->graph.node(*m->graph.producer(mconv1->inputs[0]))->inputs[1]).data<float>()[0];
  EXPECT_NEAR(mscale, (mr.second - mr.first) / 255.0, 1e-6);
  EXPECT_LE(mscale, scale.data<float>()[0]);
  // The report carries each layer's input range: the chosen one and the observed min-max.
  EXPECT_NEAR(r->layers[0].range_lo, lo, 1e-6);
  EXPECT_NEAR(r->layers[0].range_hi, hi, 1e-6);
  EXPECT_NEAR(m->layers[0].range_lo, mr.first, 1e-6);
  EXPECT_NEAR(m->layers[0].range_hi, mr.second, 1e-6);
  EXPECT_NEAR(m->layers[0].observed_lo, lo, 1e-6);
  EXPECT_NEAR(m->layers[0].observed_hi, hi, 1e-6);
  for (const auto& l : m->layers) {
    EXPECT_GE(l.range_lo, std::min(l.observed_lo, 0.0)) << l.node;  // (ranges always hold 0)
    EXPECT_LE(l.range_hi, std::max(l.observed_hi, 0.0)) << l.node;
    EXPECT_LT(l.range_lo, l.range_hi) << l.node;
  }
  EXPECT_GT(m->output_cosine, 0.99);
}

TEST(QuantizeGraph, BiasCorrectionRemovesTheMeanShiftOfRoundedWeights) {
  // On the calibration batches (whose input means the correction uses) the outputs' per-output mean error against
  // fp32 shrinks with bias correction; the biases of the quantized layers change, the fp32 model's do not.
  auto cal = batches(5);
  auto on = cli::quantize_graph(env(), small_net(), cal, quiet());
  auto o = quiet();
  o.bias_correction = false;
  auto off = cli::quantize_graph(env(), small_net(), cal, o);
  ASSERT_TRUE(on.is_ok()) << on.status().to_string();
  ASSERT_TRUE(off.is_ok()) << off.status().to_string();
  for (const char* n : {"conv1", "conv2", "fc"}) {
    const Node* a = node_named(on->graph, n);
    const Node* b = node_named(off->graph, n);
    ASSERT_TRUE(a && b && a->inputs.size() == 3 && b->inputs.size() == 3) << n;
    const Tensor& ba = on->graph.initializers.at(a->inputs[2]);
    const Tensor& bb = off->graph.initializers.at(b->inputs[2]);
    ASSERT_EQ(ba.numel(), bb.numel()) << n;
    double diff = 0;
    for (int64_t i = 0; i < ba.numel(); ++i) diff += std::fabs(ba.data<float>()[i] - bb.data<float>()[i]);
    EXPECT_GT(diff, 0) << n;
  }
  SessionOptions so;
  so.devices = {"cpu"};
  auto mean_error = [&](const Graph& q) {
    auto sf = Session::create(env(), small_net(), so);
    auto sq = Session::create(env(), q, so);
    EXPECT_TRUE(sf.is_ok() && sq.is_ok());
    std::vector<double> d(5, 0.0);
    for (size_t b = 0; b < 4; ++b) {
      auto f = sf.value()->run(cal[b]);
      auto y = sq.value()->run(cal[b]);
      EXPECT_TRUE(f.is_ok() && y.is_ok());
      for (int64_t i = 0; i < 10; ++i)
        d[static_cast<size_t>(i % 5)] += y.value()[0].data<float>()[i] - f.value()[0].data<float>()[i];
    }
    double s = 0;
    for (double v : d) s += std::fabs(v / 8);
    return s;
  };
  EXPECT_LT(mean_error(on->graph), mean_error(off->graph));
}

TEST(QuantizeGraph, MethodsExclusionAndS8Activations) {
  auto cal = batches(4);
  for (const char* m : {"percentile", "entropy", "mse"}) {
    auto o = quiet();
    o.method = m;
    o.exclude = {"fc"};
    o.activation_type = "s8";
    auto r = cli::quantize_graph(env(), small_net(), cal, o);
    ASSERT_TRUE(r.is_ok()) << m << ": " << r.status().to_string();
    EXPECT_GT(r->output_cosine, 0.98) << m;
    const Node* fc = node_named(r->graph, "fc");
    ASSERT_NE(fc, nullptr);
    EXPECT_FALSE(reads_dq(r->graph, fc, 0)) << m;
    EXPECT_TRUE(r->layers[2].kept_fp32);
    const Node* conv2 = node_named(r->graph, "conv2");
    ASSERT_TRUE(reads_dq(r->graph, conv2, 0));
    const Node* dq = r->graph.node(*r->graph.producer(conv2->inputs[0]));
    EXPECT_EQ(r->graph.initializers.at(dq->inputs[2]).dtype(), DType::kI8) << m;
  }
  auto o = quiet();
  o.method = "kl";
  EXPECT_FALSE(cli::quantize_graph(env(), small_net(), cal, o).is_ok());
  o = quiet();
  o.method = "percentile";
  o.percentile = 20;
  EXPECT_FALSE(cli::quantize_graph(env(), small_net(), cal, o).is_ok());
  EXPECT_FALSE(cli::quantize_graph(env(), small_net(), {}, quiet()).is_ok());
}

TEST(QuantizeGraph, ToleranceKeepsTheWorstLayersInFp32) {
  auto cal = batches(3);
  auto full = cli::quantize_graph(env(), small_net(), cal, quiet());
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  ASSERT_GT(full->output_rel_error, 0);
  auto o = quiet();
  o.tolerance = full->output_rel_error / 2;
  auto r = cli::quantize_graph(env(), small_net(), cal, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_LE(r->output_rel_error, o.tolerance);
  size_t kept = 0, worst = 0;
  for (size_t i = 0; i < r->layers.size(); ++i) {
    kept += r->layers[i].kept_fp32;
    EXPECT_GT(r->layers[i].sensitivity, 0) << r->layers[i].node;
    EXPECT_LE(r->layers[i].sensitivity, full->output_rel_error * 1.5) << "one layer alone errs less than all";
    if (r->layers[i].sensitivity > r->layers[worst].sensitivity) worst = i;
  }
  EXPECT_GE(kept, 1u);
  EXPECT_TRUE(r->layers[worst].kept_fp32) << "the most sensitive layer goes first";
  o.tolerance = 1e-12;
  r = cli::quantize_graph(env(), small_net(), cal, o);
  ASSERT_TRUE(r.is_ok());
  for (const auto& l : r->layers) EXPECT_TRUE(l.kept_fp32);
  EXPECT_LE(r->output_rel_error, 1e-12);
}

TEST(QuantizeGraph, PrefixFallbackKeepsTheFewestLeadingLayersInFp32) {
  auto cal = batches(3);
  auto full = cli::quantize_graph(env(), small_net(), cal, quiet());
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  ASSERT_GT(full->output_rel_error, 0);
  auto o = quiet();
  o.fallback = "prefix";
  o.tolerance = full->output_rel_error / 2;
  auto r = cli::quantize_graph(env(), small_net(), cal, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_LE(r->output_rel_error, o.tolerance);
  size_t kept = 0;
  for (size_t i = 0; i < r->layers.size(); ++i) {
    kept += r->layers[i].kept_fp32;
    if (i > 0 && r->layers[i].kept_fp32) {
      EXPECT_TRUE(r->layers[i - 1].kept_fp32) << "fp32 layers form a prefix";
    }
    // Kept layers read fp32 activations; the rest read a DequantizeLinear.
    const Node* n = node_named(r->graph, r->layers[i].node);
    ASSERT_NE(n, nullptr);
    EXPECT_EQ(reads_dq(r->graph, n, 0), !r->layers[i].kept_fp32) << r->layers[i].node;
  }
  EXPECT_GE(kept, 1u);
  // The fewest leading layers that reach the tolerance, by brute force: the search keeps that many, or at most two
  // more (where the boundary activation is smaller).
  size_t fewest = r->layers.size();
  for (size_t k = 0; k < r->layers.size() && fewest == r->layers.size(); ++k) {
    auto p = quiet();
    for (size_t i = 0; i < k; ++i) p.exclude.push_back(r->layers[i].node);
    auto f = cli::quantize_graph(env(), small_net(), cal, p);
    ASSERT_TRUE(f.is_ok());
    if (f->output_rel_error <= o.tolerance) fewest = k;
  }
  EXPECT_GE(kept, fewest);
  EXPECT_LE(kept, fewest + 2);
  o.tolerance = 1e-12;
  r = cli::quantize_graph(env(), small_net(), cal, o);
  ASSERT_TRUE(r.is_ok());
  for (const auto& l : r->layers) EXPECT_TRUE(l.kept_fp32);
  o.fallback = "random";
  EXPECT_FALSE(cli::quantize_graph(env(), small_net(), cal, o).is_ok());
}

// The layers kept in fp32 measured as `--precision bf16` runs them (fuse_qdq, then convert_bf16): with every layer
// kept, the output error is 0 evaluated as is and bf16's rounding so; a prefix search under bf16 meets its tolerance
// as measured in bf16; another precision is an error naming it.
TEST(QuantizeGraph, Bf16FallbackPrecisionMeasuresTheFp32LayersInBf16) {
  auto cal = batches(3);
  auto o = quiet();
  auto full = cli::quantize_graph(env(), small_net(), cal, o);
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  for (const auto& l : full->layers) o.exclude.push_back(l.node);
  auto fp32 = cli::quantize_graph(env(), small_net(), cal, o);
  ASSERT_TRUE(fp32.is_ok()) << fp32.status().to_string();
  EXPECT_EQ(fp32->output_rel_error, 0);
  o.fallback_precision = "bf16";
  auto bf16 = cli::quantize_graph(env(), small_net(), cal, o);
  ASSERT_TRUE(bf16.is_ok()) << bf16.status().to_string();
  EXPECT_GT(bf16->output_rel_error, 1e-4) << "the fp32 layers did not run in bf16";
  EXPECT_LT(bf16->output_rel_error, 0.05);
  EXPECT_GT(bf16->output_cosine, 0.999);
  o.exclude.clear();
  auto int8_bf16 = cli::quantize_graph(env(), small_net(), cal, o);
  ASSERT_TRUE(int8_bf16.is_ok()) << int8_bf16.status().to_string();
  o.fallback = "prefix";
  o.tolerance = std::max(int8_bf16->output_rel_error / 2, 2 * bf16->output_rel_error);
  auto r = cli::quantize_graph(env(), small_net(), cal, o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_LE(r->output_rel_error, o.tolerance);
  o.fallback_precision = "fp16";
  auto bad = cli::quantize_graph(env(), small_net(), cal, o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("unknown fallback precision 'fp16'"), std::string::npos);
}

// ------------------------------------------------------------------------------------------------ data + CLI

// ---- GPTQ (gptq.h) ----

std::vector<int8_t> nearest_rows(const std::vector<float>& w, int64_t cols, const std::vector<float>& sc) {
  std::vector<int8_t> q(w.size());
  for (size_t i = 0; i < w.size(); ++i)
    q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(w[i] / sc[i / static_cast<size_t>(cols)]), -127.f, 127.f));
  return q;
}

// Correlated inputs: x = smooth random walks (neighbouring features alike, as an image's pixels), 2000 of them.
std::vector<double> correlated_hessian(int64_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0, 1);
  std::vector<double> h(static_cast<size_t>(d * d), 0.0), x(static_cast<size_t>(d));
  for (int s = 0; s < 2000; ++s) {
    double v = n(rng);
    for (int64_t i = 0; i < d; ++i) x[static_cast<size_t>(i)] = v = 0.9 * v + 0.3 * n(rng);
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j)
        h[static_cast<size_t>(i * d + j)] += x[static_cast<size_t>(i)] * x[static_cast<size_t>(j)];
  }
  return h;
}

TEST(Gptq, UncorrelatedInputsGiveNearestRounding) {
  // With H diagonal no error moves to other columns: GPTQ is nearest rounding, for any scales.
  const int64_t rows = 6, d = 20;
  const auto w = randv(static_cast<size_t>(rows * d), 11, 0.5f);
  std::vector<float> sc(rows);
  for (int64_t r = 0; r < rows; ++r) sc[static_cast<size_t>(r)] = 0.004f * static_cast<float>(r + 1);
  std::vector<double> h(static_cast<size_t>(d * d), 0.0);
  for (int64_t i = 0; i < d; ++i) h[static_cast<size_t>(i * d + i)] = 1.0 + 0.1 * static_cast<double>(i);
  EXPECT_EQ(cli::gptq_round(w, rows, d, sc, h), nearest_rows(w, d, sc));
}

TEST(Gptq, CorrelatedInputsLowerTheOutputErrorOfRounding) {
  const int64_t rows = 16, d = 48;
  const auto w = randv(static_cast<size_t>(rows * d), 12, 0.3f);
  std::vector<float> sc(rows);
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0;
    for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(w[static_cast<size_t>(r * d + i)]));
    sc[static_cast<size_t>(r)] = amax / 127.f;
  }
  const auto h = correlated_hessian(d, 13);
  const auto qg = cli::gptq_round(w, rows, d, sc, h);
  const auto qn = nearest_rows(w, d, sc);
  const double eg = cli::output_error(w, qg, rows, d, sc, h), en = cli::output_error(w, qn, rows, d, sc, h);
  EXPECT_LT(eg, 0.5 * en) << "gptq " << eg << ", nearest " << en;
  // The levels stay the caller's: each value within one level of its nearest rounding, none outside [-127, 127].
  for (size_t i = 0; i < qg.size(); ++i) {
    EXPECT_LE(std::abs(static_cast<int>(qg[i]) - static_cast<int>(qn[i])), 3) << i;
    EXPECT_GE(qg[i], -127);
  }
}

TEST(Gptq, InputsThatAreAlwaysZeroGetZeroWeights) {
  const int64_t rows = 3, d = 8;
  const auto w = randv(static_cast<size_t>(rows * d), 14, 0.5f);
  const std::vector<float> sc(rows, 0.01f);
  auto h = correlated_hessian(d, 15);
  for (int64_t j = 0; j < d; ++j) h[static_cast<size_t>(2 * d + j)] = h[static_cast<size_t>(j * d + 2)] = 0;  // input 2
  const auto q = cli::gptq_round(w, rows, d, sc, h);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(q[static_cast<size_t>(r * d + 2)], 0) << r;
}

TEST(Gptq, ConvHessianEqualsTheSumOverExplicitPatches) {
  // Two groups of 3 channels, a 3x2 kernel with stride (2, 1), dilation (1, 2) and uneven padding, 2 batches of
  // [2, 6, 7, 9]: the accumulator's H against patches gathered by hand in the weight's (channel, ky, kx) order.
  cli::LayerGeometry g;
  g.conv = true;
  g.groups = 2, g.rows = 4, g.cin_g = 3, g.kh = 3, g.kw = 2;
  g.cols = g.cin_g * g.kh * g.kw;
  g.stride_h = 2, g.stride_w = 1, g.dil_h = 1, g.dil_w = 2;
  g.pad_top = 1, g.pad_left = 2, g.pad_bottom = 0, g.pad_right = 1;
  const int64_t N = 2, C = 6, H = 7, W = 9;
  const int64_t OH = (H + 1 + 0 - 2 - 1) / 2 + 1, OW = (W + 2 + 1 - 2 - 1) / 1 + 1;
  cli::HessianAccumulator acc(g, 2, 0);
  std::vector<std::vector<double>> want(2, std::vector<double>(static_cast<size_t>(g.cols * g.cols), 0.0));
  for (uint32_t b = 0; b < 2; ++b) {
    const auto xv = randv(static_cast<size_t>(N * C * H * W), 20 + b);
    ASSERT_TRUE(acc.add(Tensor::f32({N, C, H, W}, xv)).is_ok());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t y = 0; y < OH; ++y)
        for (int64_t x = 0; x < OW; ++x)
          for (int64_t gr = 0; gr < 2; ++gr) {
            std::vector<double> p;
            for (int64_t c = 0; c < 3; ++c)
              for (int64_t ky = 0; ky < 3; ++ky)
                for (int64_t kx = 0; kx < 2; ++kx) {
                  const int64_t iy = y * 2 - 1 + ky, ix = x - 2 + kx * 2;
                  p.push_back(iy >= 0 && iy < H && ix >= 0 && ix < W
                                  ? xv[static_cast<size_t>(((n * C + gr * 3 + c) * H + iy) * W + ix)]
                                  : 0.0);
                }
            for (size_t i = 0; i < p.size(); ++i)
              for (size_t j = 0; j < p.size(); ++j) want[static_cast<size_t>(gr)][i * p.size() + j] += p[i] * p[j];
          }
  }
  EXPECT_EQ(acc.patches(), 2 * N * OH * OW);
  for (int64_t gr = 0; gr < 2; ++gr) {
    const auto got = acc.hessian(gr);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[static_cast<size_t>(gr)][i], 1e-3 * (1 + std::fabs(want[static_cast<size_t>(gr)][i])))
          << "group " << gr << " entry " << i;
  }
  EXPECT_FALSE(acc.add(Tensor::f32({1, 5, 4, 4}, randv(80, 1))).is_ok());  // 5 channels, not 6
  // Capped: every k-th patch over the batches.
  cli::HessianAccumulator few(g, 2, 50);
  for (uint32_t b = 0; b < 2; ++b)
    ASSERT_TRUE(few.add(Tensor::f32({N, C, H, W}, randv(static_cast<size_t>(N * C * H * W), 20 + b))).is_ok());
  EXPECT_LE(few.patches(), 50);
  EXPECT_GE(few.patches(), 40);
}

TEST(QuantizeGraph, GptqRoundingLowersTheOutputError) {
  auto cal = batches(10);
  auto o = quiet();
  auto nearest = cli::quantize_graph(env(), small_net(), cal, o);
  o.weight_rounding = "gptq";
  auto gptq = cli::quantize_graph(env(), small_net(), cal, o);
  ASSERT_TRUE(nearest.is_ok()) << nearest.status().to_string();
  ASSERT_TRUE(gptq.is_ok()) << gptq.status().to_string();
  EXPECT_LT(gptq->output_rel_error, nearest->output_rel_error);
  // The same scales, other int8 values in at least one layer; the note says how many layers.
  bool differs = false;
  for (const char* n : {"conv1", "conv2", "fc"}) {
    const Node* a = node_named(gptq->graph, n);
    const Node* b = node_named(nearest->graph, n);
    ASSERT_TRUE(a && b && reads_dq(gptq->graph, a, 1) && reads_dq(nearest->graph, b, 1)) << n;
    const Node* da = gptq->graph.node(*gptq->graph.producer(a->inputs[1]));
    const Node* db = nearest->graph.node(*nearest->graph.producer(b->inputs[1]));
    const Tensor& sa = gptq->graph.initializers.at(da->inputs[1]);
    const Tensor& sb = nearest->graph.initializers.at(db->inputs[1]);
    ASSERT_EQ(sa.numel(), sb.numel());
    for (int64_t i = 0; i < sa.numel(); ++i) EXPECT_EQ(sa.data<float>()[i], sb.data<float>()[i]) << n;
    const Tensor& qa = gptq->graph.initializers.at(da->inputs[0]);
    const Tensor& qb = nearest->graph.initializers.at(db->inputs[0]);
    for (int64_t i = 0; i < qa.numel(); ++i) differs |= qa.data<int8_t>()[i] != qb.data<int8_t>()[i];
  }
  EXPECT_TRUE(differs);
  bool noted = false;
  for (const auto& n : gptq->notes) noted |= n.rfind("gptq: ", 0) == 0 && n.find("layers rounded") != std::string::npos;
  EXPECT_TRUE(noted);
  o.weight_rounding = "best";
  EXPECT_FALSE(cli::quantize_graph(env(), small_net(), cal, o).is_ok());
}

// A weight that is NaN (a broken model) quantizes to 0 with either rounding, never to an undefined conversion (UBSan
// reports one), and the run reports the outputs' error instead of failing.
TEST(QuantizeGraph, NanWeightsQuantizeToZero) {
  Graph g = small_net();
  for (NodeId id : g.node_ids()) {
    Node* n = g.node(id);
    if (n->name != "conv2") continue;
    Tensor w = g.initializers.at(n->inputs[1]).clone().value();
    w.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
    g.initializers[n->inputs[1]] = w;
  }
  for (const char* rounding : {"nearest", "gptq"}) {
    auto o = quiet();
    o.weight_rounding = rounding;
    auto r = cli::quantize_graph(env(), g, batches(5), o);
    ASSERT_TRUE(r.is_ok()) << rounding << ": " << r.status().to_string();
    const Node* n = node_named(r->graph, "conv2");
    ASSERT_TRUE(n && reads_dq(r->graph, n, 1)) << rounding;
    const Node* dq = r->graph.node(*r->graph.producer(n->inputs[1]));
    EXPECT_EQ(r->graph.initializers.at(dq->inputs[0]).data<int8_t>()[5], 0) << rounding;
  }
}

TEST(CalibrationDir, SubfoldersPerBatchAndFlatFiles) {
  fs::path d = temp_dir("layout");
  auto cal = batches(3);
  for (size_t b = 0; b < 3; ++b) {
    fs::path sd = d / ("batch_" + std::to_string(b));
    fs::create_directories(sd);
    if (b == 1) ASSERT_TRUE(write_tensor_pb(cal[b][0].second, sd / "input_0.pb").is_ok());
    else write_npy(sd / "x.npy", cal[b][0].second);
  }
  auto r = cli::read_calibration_dir(d.string(), {"x"});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[1][0].first, "x");
  EXPECT_EQ((*r)[2][0].second.data<float>()[7], cal[2][0].second.data<float>()[7]);
  // A two-input model needs both files per batch.
  auto bad = cli::read_calibration_dir(d.string(), {"x", "y"});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("'y'"), std::string::npos) << bad.status().to_string();
  // Flat folder: one file per batch.
  fs::path flat = temp_dir("flat");
  for (size_t b = 0; b < 2; ++b) write_npy(flat / ("b" + std::to_string(b) + ".npy"), cal[b][0].second);
  r = cli::read_calibration_dir(flat.string(), {"x"});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->size(), 2u);
  EXPECT_FALSE(cli::read_calibration_dir((d / "missing").string(), {"x"}).is_ok());
  EXPECT_FALSE(cli::read_calibration_dir(flat.string(), {"x", "y"}).is_ok());
  fs::remove_all(d);
  fs::remove_all(flat);
}

TEST(QuantizeCli, WritesAQdqModelThatRuns) {
  fs::path d = temp_dir("cli");
  Graph g = small_net(1);
  ASSERT_TRUE(save_onnx(g, d / "model.onnx").is_ok());
  auto cal = batches(5, 1);
  fs::create_directories(d / "calib");
  for (size_t b = 0; b < cal.size(); ++b) write_npy(d / "calib" / ("b" + std::to_string(b) + ".npy"), cal[b][0].second);
  std::string cmd = std::string(KEEL_CLI_BINARY) + " --plugin-path " + KEEL_PASSES_PLUGIN_DIR_DEFAULT + " quantize " +
                    (d / "model.onnx").string() + " --calib " + (d / "calib").string() + " -o " +
                    (d / "q.onnx").string() + " --method entropy --exclude conv2 -q > " + (d / "log.txt").string() +
                    " 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream logf(d / "log.txt");
  std::string log((std::istreambuf_iterator<char>(logf)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("conv1"), std::string::npos) << log;
  EXPECT_NE(log.find("2 of 3 layers quantized"), std::string::npos) << log;
  EXPECT_NE(log.find("input range (of min-max)"), std::string::npos) << log;
  auto q = load_onnx(d / "q.onnx");
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  size_t ql = 0;
  for (NodeId id : q->node_ids()) ql += q->node(id)->op_type == "QuantizeLinear";
  EXPECT_EQ(ql, 2u);  // conv1's and fc's inputs
  // --fallback-precision bf16: the report measures conv2 in bf16 and says how to run the model.
  cmd = std::string(KEEL_CLI_BINARY) + " --plugin-path " + KEEL_PASSES_PLUGIN_DIR_DEFAULT + " quantize " +
        (d / "model.onnx").string() + " --calib " + (d / "calib").string() + " -o " + (d / "q3.onnx").string() +
        " --exclude conv2 --fallback-precision bf16 -q > " + (d / "log3.txt").string() + " 2>&1";
  rc = std::system(cmd.c_str());
  std::ifstream log3f(d / "log3.txt");
  std::string log3((std::istreambuf_iterator<char>(log3f)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << log3;
  EXPECT_NE(log3.find("outputs vs fp32 (held-out, fp32 layers in bf16)"), std::string::npos) << log3;
  EXPECT_NE(log3.find("run it with --precision bf16"), std::string::npos) << log3;
  // A missing calibration folder is a clear error (exit 1), not a crash.
  cmd = std::string(KEEL_CLI_BINARY) + " --plugin-path " + KEEL_PASSES_PLUGIN_DIR_DEFAULT + " quantize " +
        (d / "model.onnx").string() + " --calib " + (d / "nope").string() + " -o " + (d / "q2.onnx").string() +
        " > /dev/null 2>&1";
  rc = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << rc;
  fs::remove_all(d);
}

}  // namespace
}  // namespace keel
