// plugins/cpu_onednn/steps/dw_ln_test.cc — the depthwise convolution + LayerNormalization step (steps/dw_ln.h)
// against its double-precision reference: kernels 3, 5 and 7, strips with tails (widths not multiples of 8), images
// smaller than the kernel (rows and columns of the window outside the image), batches (a thread's rows crossing
// images), several 16-channel blocks, no bias or shift, teams of 1-3, and one step run from several threads at once.
#include "steps/dw_ln.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace keel::onednn {
namespace {

struct Case {
  DwLnShape s;
  bool bias = true, shift = true;
};

struct Data {
  std::vector<float> x, w, b, g, t, want, packed;
};

Data make(const Case& k) {
  const DwLnShape& s = k.s;
  std::mt19937 rng(static_cast<uint32_t>(s.c * 31 + s.h * 7 + s.w + s.k * 1000 + s.n));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Data d;
  d.x.resize(static_cast<size_t>(s.n * s.h * s.w * s.c));
  d.w.resize(static_cast<size_t>(s.c * s.k * s.k));
  d.b.resize(static_cast<size_t>(s.c));
  d.g.resize(static_cast<size_t>(s.c));
  d.t.resize(static_cast<size_t>(s.c));
  for (float& v : d.x) v = u(rng);
  for (float& v : d.w) v = u(rng) / static_cast<float>(s.k);
  for (float& v : d.b) v = 0.5f * u(rng);
  for (float& v : d.g) v = 1.f + 0.5f * u(rng);
  for (float& v : d.t) v = 0.3f * u(rng);
  const float* bias = k.bias ? d.b.data() : nullptr;
  const float* shift = k.shift ? d.t.data() : nullptr;
  d.want.resize(d.x.size());
  dw_ln_reference(s, d.x.data(), d.w.data(), bias, d.g.data(), shift, d.want.data());
  d.packed.resize(dw_ln_packed_floats(s));
  dw_ln_pack(s, d.w.data(), bias, d.g.data(), shift, d.packed.data());
  return d;
}

void expect_match(const Case& k, const Data& d, const std::vector<float>& got, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << what << ": output " << i << " not written";
    ASSERT_NEAR(got[i], d.want[i], 2e-5f * (1.f + std::fabs(d.want[i])))
        << what << " at " << i << ": n=" << k.s.n << " c=" << k.s.c << " " << k.s.h << "x" << k.s.w << " k=" << k.s.k;
  }
}

void check(const Case& k, int team) {
  if (!dw_ln_check(k.s).empty()) GTEST_SKIP() << dw_ln_check(k.s);
  const Data d = make(k);
  std::vector<float> got(d.x.size(), NAN), scratch(dw_ln_scratch_floats(k.s) * static_cast<size_t>(team));
  dw_ln_run(k.s, d.x.data(), d.packed.data(), got.data(), scratch.data(), team);
  expect_match(k, d, got, "team " + std::to_string(team));
}

Case shape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t kk, float eps = 1e-6f) {
  Case k;
  k.s.n = n, k.s.c = c, k.s.h = h, k.s.w = w, k.s.k = kk, k.s.eps = eps;
  return k;
}

TEST(DwLn, MatchesTheReference) {
  for (int team : {1, 2, 3}) {
    check(shape(1, 96, 56, 56, 7), team);       // ConvNeXt-Tiny's first stage: 4 strips of 14 a row
    check(shape(1, 48, 14, 13, 7), team);       // one strip of 13; 3 channel blocks
    check(shape(1, 32, 4, 37, 5), team);        // strips of 13, 12 and 12
    check(shape(2, 32, 7, 7, 7), team);         // ConvNeXt's last stage size: every window leaves the image
    check(shape(1, 16, 3, 2, 7), team);         // smaller than the kernel
    check(shape(3, 16, 5, 9, 5, 1e-5f), team);  // 5x5, batch 3: rows of one thread cross images
    check(shape(1, 64, 9, 17, 3), team);        // 3x3; a strip of 1
    check(shape(1, 16, 1, 1, 3), team);         // one pixel
  }
}

TEST(DwLn, WithoutBiasOrShift) {
  Case k = shape(1, 32, 6, 11, 7);
  k.bias = false, k.shift = false;
  check(k, 2);
}

TEST(DwLn, ConstantPixelsNormalizeToTheShift) {
  // All channels of a pixel equal: variance 0, so the output is the shift (epsilon keeps it finite).
  DwLnShape s;
  s.c = 32, s.h = 4, s.w = 4, s.k = 3, s.eps = 1e-5f;
  if (!dw_ln_check(s).empty()) GTEST_SKIP() << dw_ln_check(s);
  std::vector<float> x(static_cast<size_t>(s.h * s.w * s.c), 1.f), w(static_cast<size_t>(s.c * 9), 0.25f),
      g(static_cast<size_t>(s.c), 2.f), t(static_cast<size_t>(s.c)), packed(dw_ln_packed_floats(s));
  for (int64_t ch = 0; ch < s.c; ++ch) t[ch] = static_cast<float>(ch) * 0.1f;
  dw_ln_pack(s, w.data(), nullptr, g.data(), t.data(), packed.data());
  std::vector<float> got(x.size(), NAN), scratch(dw_ln_scratch_floats(s));
  dw_ln_run(s, x.data(), packed.data(), got.data(), scratch.data(), 1);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], t[i % s.c], 1e-6f) << i;
}

TEST(DwLn, OneStepFromSeveralThreadsAtOnce) {
  const Case k = shape(1, 48, 12, 10, 7);
  if (!dw_ln_check(k.s).empty()) GTEST_SKIP() << dw_ln_check(k.s);
  const Data d = make(k);
  std::vector<std::vector<float>> got(4, std::vector<float>(d.x.size(), NAN));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      std::vector<float> scratch(dw_ln_scratch_floats(k.s));
      for (int r = 0; r < 20; ++r) dw_ln_run(k.s, d.x.data(), d.packed.data(), got[t].data(), scratch.data(), 1);
    });
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < got.size(); ++t) expect_match(k, d, got[t], "thread " + std::to_string(t));
}

TEST(DwLn, Declines) {
  DwLnShape s;
  s.k = 4;
  EXPECT_NE(dw_ln_check(s), "");
  s.k = 7, s.c = 24;
  EXPECT_NE(dw_ln_check(s), "");
  s.c = 16, s.h = 0;
  EXPECT_NE(dw_ln_check(s), "");
  s.h = 1, s.eps = -1.f;
  EXPECT_NE(dw_ln_check(s), "");
}

}  // namespace
}  // namespace keel::onednn
