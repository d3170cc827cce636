// plugins/cpu_onednn/steps/gelu_test.cc — the chains' GELU passes (steps/gelu.h), the erf form and the tanh
// approximation, against their exact functions.
#include "steps/gelu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace keel::onednn {
namespace {

double exact_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double exact_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

// One form of the pass: its fast path, its scalar fallback and the exact function.
struct Form {
  const char* name;
  void (*fast)(float*, size_t);
  void (*scalar)(float*, size_t);
  double (*exact)(double);
};
const Form kForms[] = {{"erf", gelu_inplace, gelu_inplace_scalar, exact_erf},
                       {"tanh", gelu_tanh_inplace, gelu_tanh_inplace_scalar, exact_tanh}};

// The error bound steps/gelu.h documents for both forms (absolute, growing with |x|).
double bound(double x) { return 2.5e-7 + 1.5e-7 * std::fabs(x); }

TEST(OnednnGelu, MatchesTheExactFunctionOverTheRange) {
  std::vector<float> x;
  for (double v = -12.0; v <= 12.0; v += 0.000731) x.push_back(static_cast<float>(v));
  for (float v : {0.f, -0.f, 1e-30f, -1e-30f, 1e-40f, -1e-40f, 5.6568f, -5.6568f, 5.657f, -5.657f, 1e20f, -1e20f,
                  3.4e38f, -3.4e38f})
    x.push_back(v);
  for (const Form& f : kForms) {
    std::vector<float> y = x;
    f.fast(y.data(), y.size());
    double worst = 0;  // in units of the bound
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = f.exact(x[i]), e = std::fabs(y[i] - want);
      worst = std::max(worst, e / bound(x[i]));
      ASSERT_LE(e, bound(x[i])) << f.name << ": x = " << x[i] << ": got " << y[i] << ", want " << want;
    }
    RecordProperty(std::string("worst_error_over_bound_") + f.name, std::to_string(worst));
    std::printf("%s: worst error / bound: %.3f\n", f.name, worst);
    // Where 1 + erf (1 + tanh) does not cancel, that is a relative error of a few f32 roundings.
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::fabs(x[i]) < 0.5f || x[i] < -1.f || std::fabs(x[i]) > 1e6f) continue;
      ASSERT_LE(std::fabs(y[i] - f.exact(x[i])) / std::fabs(f.exact(x[i])), 1e-6) << f.name << ": x = " << x[i];
    }
  }
}

TEST(OnednnGelu, ScalarFallbackMatchesToo) {
  std::vector<float> x;
  for (double v = -9.0; v <= 9.0; v += 0.0137) x.push_back(static_cast<float>(v));
  for (const Form& f : kForms) {
    std::vector<float> y = x;
    f.scalar(y.data(), y.size());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_LE(std::fabs(y[i] - f.exact(x[i])), bound(x[i])) << f.name << ": x = " << x[i];
  }
}

TEST(OnednnGelu, NanAndInfinities) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const Form& f : kForms) {
    std::vector<float> y{std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(), inf, -inf};
    f.fast(y.data(), y.size());
    EXPECT_TRUE(std::isnan(y[0])) << f.name;
    EXPECT_TRUE(std::isnan(y[1])) << f.name;
    EXPECT_EQ(y[2], inf) << f.name;
    EXPECT_EQ(y[3], 0.f) << f.name;
    std::vector<float> z{std::numeric_limits<float>::quiet_NaN(), inf, -inf};
    f.scalar(z.data(), z.size());
    EXPECT_TRUE(std::isnan(z[0])) << f.name;
    EXPECT_EQ(z[1], inf) << f.name;
    EXPECT_EQ(z[2], 0.f) << f.name;
  }
}

// Every length around the 16- and 32-float steps: the tail is computed, nothing past n is touched.
TEST(OnednnGelu, TailsAndBounds) {
  for (const Form& f : kForms) {
    for (size_t n = 0; n <= 70; ++n) {
      std::vector<float> buf(n + 8, 7.f);
      for (size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(i) * 0.37f - 9.f;
      std::vector<float> want = buf;
      f.fast(buf.data(), n);
      for (size_t i = 0; i < n; ++i)
        ASSERT_LE(std::fabs(buf[i] - f.exact(want[i])), bound(want[i])) << f.name << ": n = " << n << ", i = " << i;
      for (size_t i = n; i < buf.size(); ++i)
        ASSERT_EQ(buf[i], 7.f) << f.name << ": n = " << n << ": wrote past the end at " << i;
    }
  }
}

TEST(OnednnGelu, UnalignedPointer) {
  for (const Form& f : kForms) {
    std::vector<float> buf(101);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = std::sin(static_cast<float>(i)) * 6.f;
    std::vector<float> want = buf;
    f.fast(buf.data() + 3, 97);
    for (size_t i = 3; i < 100; ++i)
      ASSERT_LE(std::fabs(buf[i] - f.exact(want[i])), bound(want[i])) << f.name << ": i = " << i;
    EXPECT_EQ(buf[0], want[0]);
    EXPECT_EQ(buf[100], want[100]);
  }
}

}  // namespace
}  // namespace keel::onednn
