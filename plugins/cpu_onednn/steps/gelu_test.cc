// plugins/cpu_onednn/steps/gelu_test.cc — the chains' GELU pass (steps/gelu.h) against the exact function.
#include "steps/gelu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace keel::onednn {
namespace {

double exact(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

// The error bound steps/gelu.h documents (absolute, growing with |x|).
double bound(double x) { return 2.5e-7 + 1.5e-7 * std::fabs(x); }

TEST(OnednnGelu, MatchesTheExactFunctionOverTheRange) {
  std::vector<float> x;
  for (double v = -12.0; v <= 12.0; v += 0.000731) x.push_back(static_cast<float>(v));
  for (float v : {0.f, -0.f, 1e-30f, -1e-30f, 1e-40f, -1e-40f, 5.6568f, -5.6568f, 5.657f, -5.657f, 1e20f, -1e20f,
                  3.4e38f, -3.4e38f})
    x.push_back(v);
  std::vector<float> y = x;
  gelu_inplace(y.data(), y.size());
  double worst = 0;  // in units of the bound
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = exact(x[i]), e = std::fabs(y[i] - want);
    worst = std::max(worst, e / bound(x[i]));
    ASSERT_LE(e, bound(x[i])) << "x = " << x[i] << ": got " << y[i] << ", want " << want;
  }
  RecordProperty("worst_error_over_bound", std::to_string(worst));
  std::printf("worst error / bound: %.3f\n", worst);
  // Where 1 + erf does not cancel, that is a relative error of a few f32 roundings.
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) < 0.5f || x[i] < -1.f || std::fabs(x[i]) > 1e6f) continue;
    ASSERT_LE(std::fabs(y[i] - exact(x[i])) / std::fabs(exact(x[i])), 1e-6) << "x = " << x[i];
  }
}

TEST(OnednnGelu, ScalarFallbackMatchesToo) {
  std::vector<float> x;
  for (double v = -9.0; v <= 9.0; v += 0.0137) x.push_back(static_cast<float>(v));
  std::vector<float> y = x;
  gelu_inplace_scalar(y.data(), y.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_LE(std::fabs(y[i] - exact(x[i])), bound(x[i])) << "x = " << x[i];
}

TEST(OnednnGelu, NanAndInfinities) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> y{std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(), inf, -inf};
  gelu_inplace(y.data(), y.size());
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_EQ(y[2], inf);
  EXPECT_EQ(y[3], 0.f);
  std::vector<float> z{std::numeric_limits<float>::quiet_NaN(), inf, -inf};
  gelu_inplace_scalar(z.data(), z.size());
  EXPECT_TRUE(std::isnan(z[0]));
  EXPECT_EQ(z[1], inf);
  EXPECT_EQ(z[2], 0.f);
}

// Every length around the 16- and 32-float steps: the tail is computed, nothing past n is touched.
TEST(OnednnGelu, TailsAndBounds) {
  for (size_t n = 0; n <= 70; ++n) {
    std::vector<float> buf(n + 8, 7.f);
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i) * 0.37f - 9.f;
    std::vector<float> want = buf;
    gelu_inplace(buf.data(), n);
    for (size_t i = 0; i < n; ++i)
      ASSERT_LE(std::fabs(buf[i] - exact(want[i])), bound(want[i])) << "n = " << n << ", i = " << i;
    for (size_t i = n; i < buf.size(); ++i) ASSERT_EQ(buf[i], 7.f) << "n = " << n << ": wrote past the end at " << i;
  }
}

TEST(OnednnGelu, UnalignedPointer) {
  std::vector<float> buf(101);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = std::sin(static_cast<float>(i)) * 6.f;
  std::vector<float> want = buf;
  gelu_inplace(buf.data() + 3, 97);
  for (size_t i = 3; i < 100; ++i) ASSERT_LE(std::fabs(buf[i] - exact(want[i])), bound(want[i])) << "i = " << i;
  EXPECT_EQ(buf[0], want[0]);
  EXPECT_EQ(buf[100], want[100]);
}

}  // namespace
}  // namespace keel::onednn
