// plugins/cpu_onednn/steps/dwsilu_test.cc — the fused depthwise convolution + SiLU step (steps/dwsilu.h) against
// its reference over EfficientNet's geometries and odd ones, on teams of 1-3 threads.
#include "steps/dwsilu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace keel::onednn {
namespace {

DwSiluShape shape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t s, int64_t p, bool in_silu) {
  DwSiluShape d;
  d.n = n, d.c = c, d.h = h, d.w = w, d.k = k, d.s = s, d.p = p, d.in_silu = in_silu;
  d.oh = (h + 2 * p - k) / s + 1;
  d.ow = (w + 2 * p - k) / s + 1;
  return d;
}

void check(const DwSiluShape& s, int team, bool vector = true) {
  ASSERT_EQ(dw_silu_check(s), "");
  std::mt19937 rng(static_cast<unsigned>(s.c * 131 + s.h * 7 + s.k + s.s * 3 + team));
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::vector<float> x(static_cast<size_t>(s.n * s.c * s.h * s.w)), w(static_cast<size_t>(s.c * s.k * s.k)),
      b(static_cast<size_t>(s.c));
  for (float& v : x) v = u(rng);
  for (float& v : w) v = u(rng) * 0.3f;
  for (float& v : b) v = u(rng);
  std::vector<float> packed(w.size());
  dw_silu_pack_weights(s, w.data(), packed.data());
  const size_t out = static_cast<size_t>(s.n * s.c * s.oh * s.ow);
  std::vector<float> want(out), got(out, NAN), want_mean(static_cast<size_t>(s.n * s.c)),
      got_mean(want_mean.size(), NAN);
  dw_silu_reference(s, x.data(), w.data(), b.data(), want.data(), want_mean.data());
  std::vector<float> scratch(dw_silu_scratch_floats(s) * static_cast<size_t>(team), NAN);  // must not be read unset
  dw_silu_run(s, x.data(), packed.data(), b.data(), got.data(), got_mean.data(), scratch.data(), team, vector);
  for (size_t i = 0; i < out; ++i)
    ASSERT_NEAR(got[i], want[i], 2e-5 + 2e-5 * std::fabs(want[i])) << "element " << i << " of " << out;
  for (size_t i = 0; i < want_mean.size(); ++i) ASSERT_NEAR(got_mean[i], want_mean[i], 2e-5) << "mean " << i;
  // Without the mean output, the same values.
  std::vector<float> again(out, NAN);
  dw_silu_run(s, x.data(), packed.data(), b.data(), again.data(), nullptr, scratch.data(), team, vector);
  ASSERT_EQ(again, got);
}

TEST(OnednnDwSilu, MatchesTheReferenceOnEfficientNetShapes) {
  for (int team : {1, 2, 3}) {
    check(shape(1, 32, 112, 112, 3, 1, 1, false), team);  // block 1: no expansion, SiLU after the stem's pass
    check(shape(1, 96, 112, 112, 3, 2, 1, true), team);
    check(shape(1, 144, 56, 56, 5, 2, 2, true), team);
    check(shape(1, 240, 28, 28, 3, 2, 1, true), team);
    check(shape(1, 480, 14, 14, 5, 1, 2, true), team);
    check(shape(1, 1152, 7, 7, 3, 1, 1, true), team);
  }
}

TEST(OnednnDwSilu, MatchesTheReferenceOnOddGeometries) {
  for (int team : {1, 2}) {
    check(shape(2, 16, 5, 9, 3, 1, 1, true), team);   // batch 2, one block per image
    check(shape(1, 32, 7, 6, 5, 2, 2, false), team);  // even width, stride 2: the last tap column is padding
    check(shape(1, 16, 3, 3, 5, 1, 2, true), team);   // kernel larger than the image
    check(shape(1, 48, 9, 17, 3, 2, 0, true), team);  // no padding
    check(shape(3, 32, 1, 1, 3, 1, 1, false), team);  // one pixel
  }
}

TEST(OnednnDwSilu, ScalarPathMatchesTheReferenceToo) {
  check(shape(1, 32, 14, 14, 3, 2, 1, true), 2, false);
  check(shape(2, 16, 9, 8, 5, 1, 2, false), 1, false);
  check(shape(1, 48, 7, 7, 5, 2, 2, true), 3, false);
}

TEST(OnednnDwSilu, RefusesWhatItDoesNotCompute) {
  EXPECT_NE(dw_silu_check(shape(1, 24, 8, 8, 3, 1, 1, false)), "");  // channels not a multiple of 16
  EXPECT_NE(dw_silu_check(shape(1, 32, 8, 8, 7, 1, 3, false)), "");  // 7x7
  EXPECT_NE(dw_silu_check(shape(1, 32, 8, 8, 3, 3, 1, false)), "");  // stride 3
  DwSiluShape bad = shape(1, 32, 8, 8, 3, 1, 1, false);
  bad.ow = 9;
  EXPECT_NE(dw_silu_check(bad), "");
}

}  // namespace
}  // namespace keel::onednn
