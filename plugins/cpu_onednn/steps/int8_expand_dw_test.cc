// plugins/cpu_onednn/steps/int8_expand_dw_test.cc — the int8 expansion + depthwise 3x3 (+ projection) step
// (steps/int8_expand_dw.h) against a scalar reference that runs the three QConvs one after the other on whole tensors
// with ONNX's weight layouts and the per-element arithmetic of the own int8 kernels: register-tile tails (widths not
// multiples of 14 or 8), expanded and projected channels not multiples of 16 or 32 (masked stores, a 16-wide last
// group), strides 1 and 2 at odd and even sizes, 1x1 images, batches, zero points at both ends, u8 / s8 / f32
// outputs, the residual, teams of 1-3 threads (boundary rows computed by both neighbours).
#include "steps/int8_expand_dw.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace keel::onednn {
namespace {

DwQuant quant(int32_t x_zero, DwQuant::Out out, float y_scale, int32_t y_zero, float lo, float hi) {
  DwQuant q;
  q.x_zero = x_zero, q.out = out, q.y_inv_scale = 1.f / y_scale, q.y_zero = out == DwQuant::Out::kF32 ? 0 : y_zero;
  q.lo = lo, q.hi = hi;
  return q;
}

// One output element as the own int8 steps compute it: acc already has x_zero * sum(w) taken off.
void finish(const DwQuant& q, float scale, float bias, int32_t acc, const float* z, void* dst, int64_t at) {
  const ChannelEpilogue e = channel_epilogue(q, scale, bias);
  const bool f32 = q.out == DwQuant::Out::kF32;
  float v = std::fma(static_cast<float>(acc), e.scale, e.bias);
  if (z) v = std::fma(*z, f32 ? 1.f : q.y_inv_scale, v);
  v = std::min(std::max(v, e.lo), e.hi);
  if (f32) {
    static_cast<float*>(dst)[at] = v;
    return;
  }
  const int32_t r = static_cast<int32_t>(std::nearbyint(v)) + q.y_zero;
  if (q.out == DwQuant::Out::kU8) static_cast<uint8_t*>(dst)[at] = static_cast<uint8_t>(r);
  else static_cast<int8_t*>(dst)[at] = static_cast<int8_t>(r);
}

struct Case {
  int64_t n = 1, c = 16, m = 96, h = 9, w = 9, stride = 1, proj = 0;
  bool residual = false;
  DwQuant::Out dw_out = DwQuant::Out::kU8, proj_out = DwQuant::Out::kF32;
  int32_t x_zero = 3, e_zero = 0, d_zero = 0, p_zero = 128;
  bool x_f32 = false;  // X given as f32 (x_scale 0.05), quantized by the step
};

// callers: threads running the one step object at once, each with its own scratch and destination.
void check(const Case& k, int team, int callers = 1) {
  Int8ExpandDwShape s;
  s.n = k.n, s.c = k.c, s.m = k.m, s.h = k.h, s.w = k.w, s.stride = k.stride, s.proj = k.proj, s.residual = k.residual;
  std::mt19937 rng(static_cast<uint32_t>(k.h * 131 + k.w * 7 + k.c + k.m * 3 + k.n + k.stride * 1000 + k.proj));
  std::uniform_int_distribution<int> byte(0, 255), wt(-127, 127);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint8_t> x(static_cast<size_t>(k.n * k.h * k.w * k.c));
  for (auto& v : x) v = static_cast<uint8_t>(byte(rng));
  // An f32 X: values whose quantization (1 / 0.05, the zero point, saturated) gives x, with some out of the range
  // (saturating) and a few exact ties (x.5 steps, rounded to even).
  std::vector<float> xf;
  const QuantizeSpec xq{20.f, k.x_zero, false};
  if (k.x_f32) {
    xf.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      float v = (static_cast<float>(x[i]) - static_cast<float>(k.x_zero)) * 0.05f;
      if (i % 7 == 0) v += 0.025f;                        // a tie: rounds to even
      if (i % 11 == 0) v = (i % 2 ? 1.f : -1.f) * 100.f;  // saturates
      xf[i] = v;
      const float r = std::nearbyint(v * 20.f) + static_cast<float>(k.x_zero);
      x[i] = static_cast<uint8_t>(std::min(255.f, std::max(0.f, r)));
    }
  }
  auto weights = [&](int64_t count) {
    std::vector<int8_t> w(static_cast<size_t>(count));
    for (auto& v : w) v = static_cast<int8_t>(wt(rng));
    return w;
  };
  auto floats = [&](int64_t count, float a, float b) {
    std::vector<float> f(static_cast<size_t>(count));
    for (auto& v : f) v = a + (b - a) * (0.5f + 0.5f * u(rng));
    return f;
  };
  // Scales that keep each stage's outputs spread over the byte range (x_scale * w_scale / y_scale ~ 1 / (a sum's
  // typical size)), with a ReLU6-like clamp on the first two.
  const std::vector<int8_t> w1 = weights(k.m * k.c), w2 = weights(k.m * 9), w3 = weights(k.proj * k.m);
  const float y1 = 0.05f, y2 = 0.05f, y3 = 0.1f;
  const std::vector<float> s1 = floats(k.m, 0.3f, 0.6f), b1 = floats(k.m, -1.f, 1.f);
  std::vector<float> s1v(s1.size()), s2v, s3v;
  for (size_t i = 0; i < s1.size(); ++i) s1v[i] = s1[i] * y1 / (64.f * std::sqrt(static_cast<float>(k.c)));
  s2v = floats(k.m, 0.5f, 1.f);
  for (auto& v : s2v) v *= y2 / (64.f * 3.f);
  s3v = floats(k.proj, 0.5f, 1.f);
  for (auto& v : s3v) v *= y3 / (64.f * std::sqrt(static_cast<float>(k.m)));
  const std::vector<float> b2 = floats(k.m, -0.5f, 0.5f), b3 = floats(k.proj, -0.5f, 0.5f);
  const DwQuant q1 = quant(k.x_zero, DwQuant::Out::kU8, y1, k.e_zero, 0.f, 6.f);
  const DwQuant q2 = quant(k.e_zero, k.dw_out, y2, k.d_zero, 0.f, 6.f);
  const DwQuant q3 =
      quant(k.d_zero, k.proj_out, y3, k.p_zero, -std::numeric_limits<float>::infinity(), 8.f);  // no lower bound
  const Int8Stage st1{w1.data(), s1v.data(), b1.data(), q1}, st2{w2.data(), s2v.data(), b2.data(), q2},
      st3{w3.data(), s3v.data(), b3.data(), q3};
  const std::string why = Int8ExpandDw::check(s, q1, q2, k.proj > 0 ? &q3 : nullptr);
  if (!why.empty()) GTEST_SKIP() << why;
  const int64_t oh = s.oh(), ow = s.ow(), outc = k.proj > 0 ? k.proj : k.m;
  const DwQuant::Out last = k.proj > 0 ? k.proj_out : k.dw_out;
  const size_t ob = last == DwQuant::Out::kF32 ? 4 : 1;
  std::vector<float> z;
  if (k.residual) z = floats(k.n * oh * ow * k.proj, -4.f, 4.f);

  // The reference: three whole-tensor stages.
  std::vector<uint8_t> e(static_cast<size_t>(k.n * k.h * k.w * k.m));
  for (int64_t p = 0; p < k.n * k.h * k.w; ++p)
    for (int64_t o = 0; o < k.m; ++o) {
      int32_t acc = 0;
      for (int64_t i = 0; i < k.c; ++i) acc += (x[static_cast<size_t>(p * k.c + i)] - k.x_zero) * w1[o * k.c + i];
      finish(q1, s1v[o], b1[o], acc, nullptr, e.data(), p * k.m + o);
    }
  const size_t db = k.proj > 0 || k.dw_out != DwQuant::Out::kF32 ? 1 : 4;
  std::vector<uint8_t> d(static_cast<size_t>(k.n * oh * ow * k.m) * db);
  for (int64_t img = 0; img < k.n; ++img)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t xo = 0; xo < ow; ++xo)
        for (int64_t o = 0; o < k.m; ++o) {
          int32_t acc = 0;
          for (int64_t a = 0; a < 3; ++a)
            for (int64_t b = 0; b < 3; ++b) {
              const int64_t iy = y * k.stride - 1 + a, ix = xo * k.stride - 1 + b;
              if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;  // padding: the zero point, contributing 0
              acc +=
                  (e[static_cast<size_t>(((img * k.h + iy) * k.w + ix) * k.m + o)] - k.e_zero) * w2[o * 9 + a * 3 + b];
            }
          finish(q2, s2v[o], b2[o], acc, nullptr, d.data(), ((img * oh + y) * ow + xo) * k.m + o);
        }
  std::vector<uint8_t> want = d;
  if (k.proj > 0) {
    want.assign(static_cast<size_t>(k.n * oh * ow * k.proj) * ob, 0);
    for (int64_t p = 0; p < k.n * oh * ow; ++p)
      for (int64_t o = 0; o < k.proj; ++o) {
        int32_t acc = 0;
        for (int64_t i = 0; i < k.m; ++i) acc += (d[static_cast<size_t>(p * k.m + i)] - k.d_zero) * w3[o * k.m + i];
        finish(q3, s3v[o], b3[o], acc, k.residual ? &z[static_cast<size_t>(p * k.proj + o)] : nullptr, want.data(),
               p * k.proj + o);
      }
  }

  const Int8ExpandDw step(s, st1, st2, k.proj > 0 ? &st3 : nullptr, k.x_f32 ? &xq : nullptr);
  // The destination with a canary past its end; scratch not zeroed (garbage the step must not read).
  const size_t bytes = static_cast<size_t>(k.n * oh * ow * outc) * ob;
  std::vector<std::vector<uint8_t>> outs(static_cast<size_t>(callers), std::vector<uint8_t>(bytes + 64, 0xA5));
  std::vector<std::vector<uint8_t>> scratches(static_cast<size_t>(callers));
  for (auto& sc : scratches) {
    sc.resize(step.scratch_bytes() * static_cast<size_t>(std::max(1, team)));
    for (auto& v : sc) v = static_cast<uint8_t>(byte(rng));
  }
  auto run_one = [&](size_t i) {
    step.run(k.x_f32 ? static_cast<const void*>(xf.data()) : x.data(), k.residual ? z.data() : nullptr, outs[i].data(),
             scratches[i].data(), team);
  };
  if (callers == 1) {
    run_one(0);
  } else {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < outs.size(); ++i) threads.emplace_back(run_one, i);
    for (auto& t : threads) t.join();
  }
  ASSERT_EQ(bytes, want.size());
  for (const auto& got : outs) {
    for (size_t i = bytes; i < got.size(); ++i) ASSERT_EQ(got[i], 0xA5) << "written past the end at " << i;
    int64_t bad = 0;
    for (size_t i = 0; i < bytes; i += (ob == 4 ? 4 : 1)) {
      if (ob == 4) {
        float a, b;
        std::memcpy(&a, &got[i], 4);
        std::memcpy(&b, &want[i], 4);
        if (a != b && bad++ < 5) ADD_FAILURE() << "f32 element " << i / 4 << ": " << a << " vs " << b;
      } else if (got[i] != want[i] && bad++ < 5) {
        ADD_FAILURE() << "byte " << i << ": " << int(got[i]) << " vs " << int(want[i]);
      }
    }
    EXPECT_EQ(bad, 0);
  }
  // The outputs use the byte range (the test's scales are not degenerate).
  if (ob == 1 && k.proj == 0 && want.size() >= 512) {
    const auto [lo, hi] = std::minmax_element(want.begin(), want.end());
    EXPECT_LT(*lo + 20, *hi);
  }
}

TEST(Int8ExpandDw, DepthwiseOutputAtStrides1And2) {
  for (int team : {1, 2, 3}) {
    check({.n = 1, .c = 16, .m = 96, .h = 9, .w = 9, .stride = 1}, team);
    check({.n = 1, .c = 24, .m = 144, .h = 10, .w = 17, .stride = 2}, team);
    check({.n = 2, .c = 8, .m = 40, .h = 7, .w = 15, .stride = 1}, team);  // 40: a masked last block
    check({.n = 1, .c = 4, .m = 16, .h = 1, .w = 1, .stride = 2}, team);
  }
}

TEST(Int8ExpandDw, DepthwiseOutputTypes) {
  Case k{.n = 1, .c = 32, .m = 48, .h = 6, .w = 29, .stride = 1};
  k.dw_out = DwQuant::Out::kS8, k.d_zero = -5;
  check(k, 2);
  k.dw_out = DwQuant::Out::kF32;
  check(k, 2);
}

TEST(Int8ExpandDw, ProjectionWithAndWithoutResidual) {
  for (int team : {1, 2, 3}) {
    check({.n = 1, .c = 24, .m = 144, .h = 14, .w = 14, .stride = 1, .proj = 24, .residual = true}, team);
    check({.n = 1, .c = 16, .m = 96, .h = 15, .w = 16, .stride = 2, .proj = 24}, team);
    check({.n = 2, .c = 32, .m = 80, .h = 7, .w = 7, .stride = 1, .proj = 40}, team);  // a 16-wide last group
    // 40 expanded channels (the projection over a partial block) into 12 (a masked store).
    check({.n = 1, .c = 8, .m = 40, .h = 6, .w = 9, .stride = 1, .proj = 12}, team);
    // 4-pixel rows: the projection takes 3 at a time, across the images of the batch and the thread's last rows.
    check({.n = 3, .c = 16, .m = 32, .h = 5, .w = 4, .stride = 1, .proj = 16, .residual = true}, team);
  }
}

TEST(Int8ExpandDw, ProjectionOutputTypesAndZeroPoints) {
  Case k{.n = 1, .c = 64, .m = 64, .h = 5, .w = 33, .stride = 1, .proj = 64, .residual = true};
  k.x_zero = 255, k.e_zero = 7, k.d_zero = 250;
  k.proj_out = DwQuant::Out::kU8, k.p_zero = 0;
  check(k, 2);
  k.proj_out = DwQuant::Out::kS8, k.p_zero = -128;
  check(k, 1);
  k.residual = false, k.proj_out = DwQuant::Out::kU8, k.p_zero = 255;
  check(k, 3);
}

TEST(Int8ExpandDw, AnF32SourceQuantizedRowByRow) {
  for (int team : {1, 2}) {
    Case k{.n = 2, .c = 24, .m = 144, .h = 9, .w = 15, .stride = 1, .proj = 24, .residual = true};
    k.x_f32 = true, k.x_zero = 128;
    check(k, team);
    k = Case{.n = 1, .c = 32, .m = 64, .h = 8, .w = 7, .stride = 2};
    k.x_f32 = true, k.x_zero = 0;
    check(k, team);
  }
}

TEST(Int8ExpandDw, OneStepFromSeveralThreadsAtOnce) {
  Case k{.n = 1, .c = 24, .m = 144, .h = 14, .w = 14, .stride = 1, .proj = 24, .residual = true};
  k.x_f32 = true;
  check(k, 1, 4);
  check(k, 2, 2);
}

TEST(Int8ExpandDw, Declines) {
  Int8ExpandDwShape s;
  s.c = 6, s.m = 16, s.h = 4, s.w = 4;
  DwQuant q;
  EXPECT_NE(Int8ExpandDw::check(s, q, q, nullptr), "");  // c % 4
  s.c = 8;
  DwQuant signed_x = q;
  signed_x.x_signed = true;
  EXPECT_NE(Int8ExpandDw::check(s, signed_x, q, nullptr), "");
  DwQuant other = q;
  other.x_zero = 1;
  EXPECT_NE(Int8ExpandDw::check(s, q, other, nullptr), "");  // the depthwise reads other bytes
  s.residual = true, s.proj = 16;
  EXPECT_NE(Int8ExpandDw::check(s, q, q, &q), "");  // a residual of another shape
}

}  // namespace
}  // namespace keel::onednn
