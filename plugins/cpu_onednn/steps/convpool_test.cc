// plugins/cpu_onednn/steps/convpool_test.cc — the fused Conv + Relu + MaxPool step (steps/convpool.h) against
// its straightforward reference, over the geometries its code paths split on.
#include "steps/convpool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace keel::onednn {
namespace {

struct Geo {
  int64_t n, c, h, w, m, k, s, p;  // convolution (square kernel, symmetric pads)
  int64_t pk, ps, pp;              // pooling
  bool ceil, relu;
};

ConvPoolShape shape_of(const Geo& g) {
  ConvPoolShape s;
  s.n = g.n, s.c = g.c, s.h = g.h, s.w = g.w, s.m = g.m;
  s.kh = s.kw = g.k, s.sh = s.sw = g.s, s.pt = s.pl = g.p;
  s.oh = (g.h + 2 * g.p - g.k) / g.s + 1;
  s.ow = (g.w + 2 * g.p - g.k) / g.s + 1;
  s.relu = g.relu;
  s.pkh = s.pkw = g.pk, s.psh = s.psw = g.ps, s.ppt = s.ppl = g.pp;
  auto out = [&](int64_t x) {
    const int64_t span = x + 2 * g.pp - g.pk;
    int64_t o = 1 + (g.ceil ? (span + g.ps - 1) / g.ps : span / g.ps);
    if (g.ceil && (o - 1) * g.ps >= x + g.pp) --o;  // the last window must start inside (ONNX / PyTorch)
    return o;
  };
  s.ph = out(s.oh), s.pw = out(s.ow);
  return s;
}

// The window positions `got` (conv_pool_run's arg) against the reference's pre-pooling values: the position taken
// holds its window's maximum (up to the kernel's rounding), and no earlier position is a certain maximum: with Relu,
// a later zero is never taken where an earlier position was clearly negative before the Relu; without, no earlier
// position is clearly larger. (Positions within rounding of each other may go either way.)
void check_arg(const ConvPoolShape& s, const std::vector<float>& x, const std::vector<float>& w,
               const std::vector<float>& b, const std::vector<uint8_t>& got) {
  const int64_t mb = s.m / 16;
  auto conv = [&](int64_t img, int64_t o, int64_t y, int64_t xx) {
    double acc = b[static_cast<size_t>(o)];
    for (int64_t c = 0; c < s.c; ++c)
      for (int64_t i = 0; i < s.kh; ++i)
        for (int64_t j = 0; j < s.kw; ++j) {
          const int64_t iy = y * s.sh - s.pt + i, ix = xx * s.sw - s.pl + j;
          if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
          acc += static_cast<double>(x[static_cast<size_t>(((img * s.c + c) * s.h + iy) * s.w + ix)]) *
                 w[static_cast<size_t>(((o * s.c + c) * s.kh + i) * s.kw + j)];
        }
    return acc;
  };
  const double tol = 1e-4;
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t o = 0; o < s.m; ++o)
      for (int64_t p = 0; p < s.ph; ++p)
        for (int64_t q = 0; q < s.pw; ++q) {
          const int at = got[static_cast<size_t>((((img * mb + o / 16) * s.ph + p) * s.pw + q) * 16 + o % 16)];
          ASSERT_LT(at, s.pkh * s.pkw);
          std::vector<double> pre(static_cast<size_t>(s.pkh * s.pkw), -INFINITY);
          double best = -INFINITY;
          for (int64_t i = 0; i < s.pkh; ++i)
            for (int64_t j = 0; j < s.pkw; ++j) {
              const int64_t y = p * s.psh - s.ppt + i, xx = q * s.psw - s.ppl + j;
              if (y < 0 || y >= s.oh || xx < 0 || xx >= s.ow) continue;
              const double v = conv(img, o, y, xx);
              pre[static_cast<size_t>(i * s.pkw + j)] = v;
              best = std::max(best, s.relu ? std::max(v, 0.0) : v);
            }
          const double taken = pre[static_cast<size_t>(at)], taken_v = s.relu ? std::max(taken, 0.0) : taken;
          ASSERT_GE(taken_v, best - tol) << "position " << at << " is not its window's maximum";
          for (int k = 0; k < at; ++k) {
            if (std::isinf(pre[k])) continue;  // in the padding: no position
            if (s.relu && taken_v == 0.0 && best == 0.0)
              ASSERT_FALSE(pre[k] < -tol) << "a later zero taken at " << at << " over position " << k;
            else
              ASSERT_FALSE((s.relu ? std::max(pre[k], 0.0) : pre[k]) > taken_v + tol)
                  << "position " << k << " is larger than the taken " << at;
          }
        }
}

void check(const Geo& g, int team) {
  const ConvPoolShape s = shape_of(g);
  ASSERT_EQ(conv_pool_check(s), "");
  std::mt19937 rng(static_cast<uint32_t>(g.h * 131 + g.w * 7 + g.m + g.k));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(static_cast<size_t>(s.n * s.c * s.h * s.w)), w(static_cast<size_t>(s.m * s.c * s.kh * s.kw)),
      b(static_cast<size_t>(s.m));
  for (float& v : x) v = u(rng);
  for (float& v : w) v = 0.3f * u(rng);
  for (float& v : b) v = 0.2f * u(rng);
  const size_t out = static_cast<size_t>(s.n * s.m * s.ph * s.pw);
  std::vector<float> want(out), got(out, NAN), packed(conv_pool_packed_floats(s)),
      scratch(conv_pool_scratch_floats(s) * static_cast<size_t>(team));
  conv_pool_reference(s, x.data(), w.data(), b.data(), want.data());
  conv_pool_pack_weights(s, w.data(), packed.data());
  std::vector<uint8_t> arg(out, 0xff);
  conv_pool_run(s, x.data(), packed.data(), b.data(), got.data(), scratch.data(), team, arg.data());
  {
    SCOPED_TRACE("n=" + std::to_string(g.n) + " c=" + std::to_string(g.c) + " " + std::to_string(g.h) + "x" +
                 std::to_string(g.w) + " m=" + std::to_string(g.m) + " k=" + std::to_string(g.k) + " pool " +
                 std::to_string(g.pk) + "/" + std::to_string(g.ps) + "/" + std::to_string(g.pp) + " team " +
                 std::to_string(team));
    check_arg(s, x, w, b, arg);
  }
  for (size_t i = 0; i < out; ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4f * (1.f + std::fabs(want[i])))
        << "at " << i << " of n=" << g.n << " c=" << g.c << " " << g.h << "x" << g.w << " m=" << g.m << " k=" << g.k
        << " s=" << g.s << " p=" << g.p << " pool " << g.pk << "/" << g.ps << "/" << g.pp << " team " << team;
}

TEST(OnednnConvPool, MatchesTheReference) {
  const Geo geos[] = {
      {1, 3, 35, 33, 64, 3, 2, 0, 3, 2, 0, true, true},    // SqueezeNet 1.1's stem, smaller (ceil pooling)
      {2, 3, 29, 30, 48, 7, 2, 3, 3, 2, 1, false, true},   // a 7x7 stem with padding, 3 blocks, batch 2
      {1, 1, 17, 19, 16, 5, 1, 2, 2, 2, 0, false, false},  // one channel, one block, no Relu (negative maxima)
      {3, 3, 12, 12, 32, 3, 1, 0, 2, 2, 0, false, true},   // simple_cnn's head: 2 blocks, batch 3
      {1, 4, 9, 40, 80, 3, 1, 1, 3, 1, 1, false, true},    // 5 blocks (4 + 1), pooling stride 1
      {1, 2, 8, 8, 16, 11, 4, 5, 3, 3, 0, true, false},    // a kernel wider than the interior
      {1, 3, 37, 34, 80, 7, 2, 3, 3, 2, 1, false, true},   // ResNet's stem, smaller: a group of 4 blocks + 1
      {1, 3, 23, 26, 128, 7, 2, 2, 3, 2, 1, true, true},   // asymmetric right padding, 2 groups of 4
      // 2x2 stride-2 pooling, taken in registers: padded (the band path) over an odd width, whose last column is
      // in no window; 4 blocks without Relu; 5 blocks (a group of 4 + 1) over odd rows and columns.
      {2, 1, 28, 27, 32, 3, 1, 1, 2, 2, 0, false, true},
      {1, 3, 32, 32, 64, 3, 1, 0, 2, 2, 0, false, false},
      {2, 2, 15, 21, 80, 3, 1, 0, 2, 2, 0, false, true},
  };
  for (const Geo& g : geos)
    for (int team : {1, 2, 3}) check(g, team);
}

TEST(OnednnConvPool, ScalarPathMatchesTheReference) {
  conv_pool_force_scalar(true);
  for (const Geo& g :
       {Geo{1, 3, 37, 34, 80, 7, 2, 3, 3, 2, 1, false, true}, Geo{2, 3, 29, 30, 48, 7, 2, 3, 3, 2, 1, false, true},
        Geo{1, 3, 35, 33, 64, 3, 2, 0, 3, 2, 0, true, true}, Geo{2, 1, 28, 27, 32, 3, 1, 1, 2, 2, 0, false, true}})
    check(g, 2);
  conv_pool_force_scalar(false);
}

TEST(OnednnConvPool, RejectsWhatItDoesNotCompute) {
  ConvPoolShape s = shape_of({1, 3, 20, 20, 16, 3, 1, 0, 2, 2, 0, false, true});
  EXPECT_EQ(conv_pool_check(s), "");
  ConvPoolShape t = s;
  t.m = 24;
  EXPECT_NE(conv_pool_check(t), "");
  t = s;
  t.ppt = 2;  // a pad as large as the pooling kernel
  EXPECT_NE(conv_pool_check(t), "");
  t = s;
  t.ph += 2;  // windows past the convolution output
  EXPECT_NE(conv_pool_check(t), "");
}

}  // namespace
}  // namespace keel::onednn
