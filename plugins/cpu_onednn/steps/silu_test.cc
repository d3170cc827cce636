// plugins/cpu_onednn/steps/silu_test.cc — the chains' SiLU pass (steps/silu.h) against the exact function.
#include "steps/silu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace keel::onednn {
namespace {

double exact(double x) { return x / (1.0 + std::exp(-x)); }

// Relative error.
double err(float got, double want) { return std::fabs(got - want) / std::max(std::fabs(want), 1e-30); }

TEST(OnednnSilu, MatchesTheExactFunctionOverTheRange) {
  std::vector<float> x;
  for (double v = -100.0; v <= 100.0; v += 0.00731) x.push_back(static_cast<float>(v));
  for (float v : {0.f, -0.f, 1e-30f, -1e-30f, 1e-40f, 87.f, -87.f, 88.7f, -88.7f, 1e20f, -1e20f, 3.4e38f, -3.4e38f})
    x.push_back(v);
  std::vector<float> y = x;
  silu_inplace(y.data(), y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double want = exact(x[i]);
    // Far below zero SiLU is a denormal or 0 in f32: compare absolutely there.
    double e = std::fabs(want) < 1e-30 ? std::fabs(y[i] - want) : err(y[i], want);
    worst = std::max(worst, e);
    ASSERT_LE(e, 1e-6) << "x = " << x[i] << ": got " << y[i] << ", want " << want;
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
}

TEST(OnednnSilu, ScalarFallbackMatchesToo) {
  std::vector<float> x;
  for (double v = -50.0; v <= 50.0; v += 0.0137) x.push_back(static_cast<float>(v));
  std::vector<float> y = x;
  silu_inplace_scalar(y.data(), y.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_LE(err(y[i], exact(x[i])), 1e-6) << "x = " << x[i];
}

TEST(OnednnSilu, NanAndInfinities) {
  std::vector<float> y{std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()};
  silu_inplace(y.data(), y.size());
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], std::numeric_limits<float>::infinity());
  std::vector<float> z{-std::numeric_limits<float>::infinity()};
  silu_inplace(z.data(), 1);
  EXPECT_EQ(z[0], 0.f);
}

// Every length around the 16- and 32-float steps: the tail is computed, nothing past n is touched.
TEST(OnednnSilu, TailsAndBounds) {
  for (size_t n = 0; n <= 70; ++n) {
    std::vector<float> buf(n + 8, 7.f);
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i) * 0.37f - 9.f;
    std::vector<float> want = buf;
    silu_inplace(buf.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_LE(err(buf[i], exact(want[i])), 1e-6) << "n = " << n << ", i = " << i;
    for (size_t i = n; i < buf.size(); ++i) ASSERT_EQ(buf[i], 7.f) << "n = " << n << ": wrote past the end at " << i;
  }
}

TEST(OnednnSilu, UnalignedPointer) {
  std::vector<float> buf(101);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = std::sin(static_cast<float>(i)) * 6.f;
  std::vector<float> want = buf;
  silu_inplace(buf.data() + 3, 97);
  for (size_t i = 3; i < 100; ++i) ASSERT_LE(err(buf[i], exact(want[i])), 1e-6) << "i = " << i;
  EXPECT_EQ(buf[0], want[0]);
  EXPECT_EQ(buf[100], want[100]);
}

// The fused SiLU + per-channel mean over one nChw16c block: the same SiLU, and each channel's mean of it.
TEST(OnednnSilu, MeanOverABlock) {
  for (size_t hw : {0ul, 1ul, 2ul, 3ul, 49ul, 196ul, 3136ul}) {
    std::vector<float> x(hw * 16 + 5, 3.f), mean(17, -1.f);
    for (size_t i = 0; i < hw * 16; ++i) x[i] = std::sin(static_cast<float>(i) * 0.37f) * 8.f;
    std::vector<float> y = x;
    silu_inplace_mean16(y.data(), hw, mean.data());
    for (int c = 0; c < 16; ++c) {
      double sum = 0;
      for (size_t i = 0; i < hw; ++i) {
        double want = exact(x[16 * i + c]);
        ASSERT_LE(std::fabs(y[16 * i + c] - want), 1e-6 * std::max(1.0, std::fabs(want))) << "hw " << hw;
        sum += want;
      }
      const double m = hw ? sum / static_cast<double>(hw) : 0.0;
      EXPECT_NEAR(mean[c], m, 1e-5 * std::max(1.0, std::fabs(m))) << "hw " << hw << ", channel " << c;
    }
    EXPECT_EQ(mean[16], -1.f) << "wrote past the 16 means";
    for (size_t i = hw * 16; i < x.size(); ++i) ASSERT_EQ(y[i], 3.f) << "wrote past the block";
  }
}

}  // namespace
}  // namespace keel::onednn
