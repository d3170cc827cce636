// plugins/cpu_onednn/steps/int8_stem_test.cc — the own int8 stem convolution + max pooling (steps/int8_stem.h) against
// a scalar convolution (exact s32 sums, the same epilogue) followed by pooling of its outputs: SimpleCNN's 1-channel
// 3x3 with 2x2 pooling, an RGB 7x7 stride-2 stem with ResNet's overlapping padded 3x3 pooling, a 2-channel 5x5 without
// pooling, 2x2 stride-2 poolings (done in registers) over every channel-block count; u8 / s8 inputs and outputs, f32
// outputs, teams of 1-3 threads.
#include "steps/int8_stem.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace keel::onednn {
namespace {

StemShape stem(int64_t n, int64_t c, int64_t h, int64_t w, int64_t m, int64_t k, int64_t st, int64_t pad) {
  StemShape s;
  s.N = n, s.C = c, s.H = h, s.W = w, s.M = m, s.KH = s.KW = k, s.SH = s.SW = st, s.PT = s.PL = pad;
  s.OH = (h + 2 * pad - k) / st + 1;
  s.OW = (w + 2 * pad - k) / st + 1;
  return s;
}

StemShape pooled(StemShape s, int64_t k, int64_t st, int64_t pad, bool ceil = false) {
  s.pool = true;
  s.PKH = s.PKW = k, s.PSH = s.PSW = st, s.PPT = s.PPL = pad;
  const int64_t up = ceil ? st - 1 : 0;  // ceil_mode: a last window that starts inside the output (here: no padding)
  s.PH = (s.OH + 2 * pad - k + up) / st + 1;
  s.PW = (s.OW + 2 * pad - k + up) / st + 1;
  return s;
}

// The convolution's outputs [N, OH, OW, M] as the kernel's epilogue computes them (f32 values, or bytes in floats),
// then the pooling of those (padding is not a value).
std::vector<float> reference(const StemShape& s, const DwQuant& q, const std::vector<uint8_t>& x,
                             const std::vector<int8_t>& w, const std::vector<float>& scale,
                             const std::vector<float>& bias) {
  const bool f32 = q.out == DwQuant::Out::kF32;
  const float inv = f32 ? 1.f : q.y_inv_scale;
  const float qmin = q.out == DwQuant::Out::kS8 ? -128.f : 0.f, qmax = q.out == DwQuant::Out::kS8 ? 127.f : 255.f;
  std::vector<float> conv(static_cast<size_t>(s.N * s.OH * s.OW * s.M));
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t oy = 0; oy < s.OH; ++oy)
      for (int64_t ox = 0; ox < s.OW; ++ox)
        for (int64_t m = 0; m < s.M; ++m) {
          int32_t acc = 0;
          for (int64_t c = 0; c < s.C; ++c)
            for (int64_t ky = 0; ky < s.KH; ++ky)
              for (int64_t kx = 0; kx < s.KW; ++kx) {
                const int64_t iy = oy * s.SH - s.PT + ky, ix = ox * s.SW - s.PL + kx;
                if (iy < 0 || iy >= s.H || ix < 0 || ix >= s.W) continue;
                const uint8_t b = x[static_cast<size_t>(((n * s.C + c) * s.H + iy) * s.W + ix)];
                const int32_t xv = q.x_signed ? static_cast<int8_t>(b) : b;
                acc += (xv - q.x_zero) * w[static_cast<size_t>(((m * s.C + c) * s.KH + ky) * s.KW + kx)];
              }
          float v = std::fma(static_cast<float>(acc), scale[m] * inv, bias[m] * inv);
          float lo = q.lo * inv, hi = q.hi * inv;
          if (!f32) {
            lo = std::clamp(lo, qmin - q.y_zero, qmax - q.y_zero);
            hi = std::clamp(hi, qmin - q.y_zero, qmax - q.y_zero);
          }
          v = std::min(std::max(v, lo), hi);
          if (!f32) v = std::nearbyint(v) + static_cast<float>(q.y_zero);
          conv[static_cast<size_t>(((n * s.OH + oy) * s.OW + ox) * s.M + m)] = v;
        }
  if (!s.pool) return conv;
  std::vector<float> y(static_cast<size_t>(s.N * s.PH * s.PW * s.M), -std::numeric_limits<float>::infinity());
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t py = 0; py < s.PH; ++py)
      for (int64_t px = 0; px < s.PW; ++px)
        for (int64_t ky = 0; ky < s.PKH; ++ky)
          for (int64_t kx = 0; kx < s.PKW; ++kx) {
            const int64_t oy = py * s.PSH - s.PPT + ky, ox = px * s.PSW - s.PPL + kx;
            if (oy < 0 || oy >= s.OH || ox < 0 || ox >= s.OW) continue;
            for (int64_t m = 0; m < s.M; ++m) {
              float& d = y[static_cast<size_t>(((n * s.PH + py) * s.PW + px) * s.M + m)];
              d = std::max(d, conv[static_cast<size_t>(((n * s.OH + oy) * s.OW + ox) * s.M + m)]);
            }
          }
  return y;
}

void check(const StemShape& s, const DwQuant& q, int team) {
  ASSERT_EQ(Int8StemConv::check(s), "");
  std::mt19937 rng(static_cast<unsigned>(s.C * 131 + s.H * 7 + s.KH + s.M + team));
  std::uniform_int_distribution<int> byte(0, 255), wt(-127, 127);
  std::uniform_real_distribution<float> u(0.5f, 1.5f), bu(-0.5f, 0.5f);
  std::vector<uint8_t> x(static_cast<size_t>(s.N * s.C * s.H * s.W));
  for (auto& v : x) v = static_cast<uint8_t>(byte(rng));
  std::vector<int8_t> w(static_cast<size_t>(s.M * s.C * s.KH * s.KW));
  for (auto& v : w) v = static_cast<int8_t>(wt(rng));
  std::vector<float> scale(static_cast<size_t>(s.M)), bias(static_cast<size_t>(s.M));
  for (int64_t m = 0; m < s.M; ++m) scale[m] = 2e-4f * u(rng), bias[m] = bu(rng);
  const std::vector<float> want = reference(s, q, x, w, scale, bias);
  Int8StemConv k(s, q, w.data(), scale.data(), bias.data());
  const bool f32 = q.out == DwQuant::Out::kF32;
  std::vector<uint8_t> got(want.size() * (f32 ? 4 : 1) + 64, 0xAB);
  k.run(x.data(), got.data(), team);
  for (size_t i = 0; i < want.size(); ++i) {
    float g;
    if (f32) std::memcpy(&g, got.data() + 4 * i, 4);
    else g = q.out == DwQuant::Out::kS8 ? static_cast<int8_t>(got[i]) : got[i];
    ASSERT_EQ(g, want[i]) << "element " << i << " of " << want.size();
  }
  for (size_t i = want.size() * (f32 ? 4 : 1); i < got.size(); ++i) ASSERT_EQ(got[i], 0xAB) << "written past the end";
}

bool supported() { return Int8StemConv::available(); }

TEST(OnednnInt8Stem, MatchesConvolutionThenPooling) {
  if (!supported()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU (or KEEL_ONEDNN_INT8_OWN=0): the step does not run";
  DwQuant u8;  // u8 in and out, Relu
  u8.x_zero = 3, u8.y_inv_scale = 1.f / 0.05f, u8.y_zero = 2, u8.lo = 0.f;
  DwQuant s8 = u8;  // s8 in and out, Clip(0, 6)
  s8.x_signed = true, s8.x_zero = -4, s8.out = DwQuant::Out::kS8, s8.y_zero = -7, s8.hi = 6.f;
  DwQuant f32 = u8;  // f32 out, no activation
  f32.out = DwQuant::Out::kF32, f32.lo = -std::numeric_limits<float>::infinity();
  for (int team : {1, 2, 3}) {
    SCOPED_TRACE("team " + std::to_string(team));
    for (const DwQuant& q : {u8, s8, f32}) {
      check(pooled(stem(3, 1, 13, 11, 32, 3, 1, 0), 2, 2, 0), q, team);   // SimpleCNN's
      check(pooled(stem(1, 3, 23, 21, 64, 7, 2, 3), 3, 2, 1), q, team);   // ResNet's stem and pooling
      check(stem(2, 2, 9, 10, 16, 5, 1, 2), q, team);                     // no pooling
      check(pooled(stem(2, 4, 10, 9, 48, 3, 2, 1), 2, 1, 0), q, team);    // overlapping 2x2 / 1 windows
      check(pooled(stem(40, 1, 28, 28, 32, 3, 1, 0), 2, 2, 0), q, team);  // past the one-thread size
      check(pooled(stem(2, 1, 12, 12, 20, 5, 1, 0), 2, 2, 0), q, team);   // 20 channels (a pruned layer): masked
      check(stem(1, 1, 9, 8, 6, 3, 1, 1), q, team);                       // LeNet-5's 6
      // 2x2 / 2 pooling in registers, every block count and pixel-group tail: 16, 48, 64 channels, 2 channels
      // padded, a strided conv, ceil_mode's last windows of one row or column (odd conv outputs 11 x 9 and 5 x 5).
      check(pooled(stem(2, 1, 13, 11, 16, 3, 1, 0), 2, 2, 0), q, team);
      check(pooled(stem(2, 1, 13, 11, 16, 3, 1, 0), 2, 2, 0, true), q, team);
      check(pooled(stem(2, 2, 12, 19, 48, 3, 1, 1), 2, 2, 0), q, team);
      check(pooled(stem(1, 3, 11, 11, 64, 3, 2, 1), 2, 2, 0, true), q, team);
      check(pooled(stem(3, 1, 13, 11, 30, 5, 1, 2), 2, 2, 0, true), q, team);
    }
  }
}

TEST(OnednnInt8Stem, CheckNamesWhatIsOutOfReach) {
  EXPECT_NE(Int8StemConv::check(stem(1, 5, 8, 8, 16, 3, 1, 1)), "");    // 5 channels
  EXPECT_NE(Int8StemConv::check(stem(1, 1, 12, 12, 16, 9, 1, 0)), "");  // 9 columns
  EXPECT_NE(Int8StemConv::check(stem(1, 1, 8, 8, 80, 3, 1, 1)), "");    // 80 output channels
  EXPECT_EQ(Int8StemConv::check(stem(1, 1, 8, 8, 64, 3, 1, 1)), "");
}

}  // namespace
}  // namespace keel::onednn
