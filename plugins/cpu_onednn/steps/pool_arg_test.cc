// plugins/cpu_onednn/steps/pool_arg_test.cc — max pooling with window positions and its gradient's scatter
// (steps/pool_arg.h) against scalar loops over the plain layout: blocks 1, 8 and 16 (channels filling their blocks or
// not), 2x2 windows tiling the plane and leaving a row and a column over, 3x2 windows, overlapping 3x3 windows at
// stride 2, with and without the Relu mask; the gradient's buffer starts dirty (every position must be written).
#include "steps/pool_arg.h"

#include "steps/silu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace keel::onednn {
namespace {

// Index of (n, c, y, x) in s.block's layout over a plane of h x w.
int64_t at(const PoolArgShape& s, int64_t n, int64_t c, int64_t y, int64_t x, int64_t h, int64_t w) {
  const int64_t b = s.block;
  return (((n * s.blocks() + c / b) * h + y) * w + x) * b + c % b;
}

// Aligned (the gradient's streaming stores need 64 bytes), filled with `v`.
template <typename T>
T* buffer(size_t n, T v) {
  auto* p = static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64));
  for (size_t i = 0; i < n; ++i) p[i] = v;
  return p;
}

TEST(OnednnPoolArg, MatchesScalarLoopsInEveryLayout) {
  struct Case {
    int64_t c, h, w, kh, kw, sh, sw, block;
  };
  const Case cases[] = {{32, 24, 24, 2, 2, 2, 2, 16}, {24, 9, 11, 2, 2, 2, 2, 16}, {16, 10, 10, 3, 2, 3, 2, 16},
                        {16, 9, 9, 3, 3, 2, 2, 16},   {8, 9, 9, 2, 2, 2, 2, 8},    {12, 7, 10, 3, 3, 2, 2, 8},
                        {5, 26, 26, 2, 2, 2, 2, 1},   {3, 13, 35, 2, 2, 2, 2, 1},  {4, 10, 9, 3, 3, 2, 2, 1}};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const Case& k : cases)
    for (bool relu : {false, true}) {
      PoolArgShape s;
      s.n = 2, s.c = k.c, s.h = k.h, s.w = k.w, s.kh = k.kh, s.kw = k.kw, s.sh = k.sh, s.sw = k.sw, s.block = k.block;
      s.oh = (k.h - k.kh) / k.sh + 1, s.ow = (k.w - k.kw) / k.sw + 1;
      const std::string what = "c=" + std::to_string(k.c) + " " + std::to_string(k.h) + "x" + std::to_string(k.w) +
                               " window " + std::to_string(k.kh) + "x" + std::to_string(k.kw) + " stride " +
                               std::to_string(k.sh) + "x" + std::to_string(k.sw) + " block " + std::to_string(k.block) +
                               (relu ? " relu" : "");
      const size_t in = static_cast<size_t>(s.n * s.blocks() * s.block * s.h * s.w),
                   out = static_cast<size_t>(s.n * s.blocks() * s.block * s.oh * s.ow);
      float* src = buffer(in, 0.f);
      for (size_t i = 0; i < in; ++i) src[i] = u(rng);
      float* dst = buffer(out, 0.f);
      uint8_t* arg = buffer<uint8_t>(out, 0);
      pool_arg_forward(s, src, dst, arg);
      float* g = buffer(out, 0.f);
      for (size_t i = 0; i < out; ++i) g[i] = u(rng);
      float* dx = buffer(in, 7.f);  // dirty
      pool_arg_backward(s, g, dst, arg, relu, dx);
      std::vector<float> want_dx(in, 0.f);
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t c = 0; c < s.c; ++c)
          for (int64_t oy = 0; oy < s.oh; ++oy)
            for (int64_t ox = 0; ox < s.ow; ++ox) {
              float best = 0.f;
              int64_t pos = -1;
              for (int64_t i = 0; i < s.kh; ++i)
                for (int64_t j = 0; j < s.kw; ++j) {
                  const float v = src[at(s, n, c, oy * s.sh + i, ox * s.sw + j, s.h, s.w)];
                  if (pos < 0 || v > best) best = v, pos = i * s.kw + j;
                }
              const int64_t o = at(s, n, c, oy, ox, s.oh, s.ow);
              ASSERT_EQ(dst[o], best) << what << " at " << n << "," << c << "," << oy << "," << ox;
              ASSERT_EQ(arg[o], pos) << what << " at " << n << "," << c << "," << oy << "," << ox;
              if (!relu || best > 0.f)
                want_dx[at(s, n, c, oy * s.sh + pos / s.kw, ox * s.sw + pos % s.kw, s.h, s.w)] += g[o];
            }
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t c = 0; c < s.c; ++c)
          for (int64_t y = 0; y < s.h; ++y)
            for (int64_t x = 0; x < s.w; ++x) {
              const int64_t i = at(s, n, c, y, x, s.h, s.w);
              ASSERT_FLOAT_EQ(dx[i], want_dx[static_cast<size_t>(i)])
                  << what << " at " << n << "," << c << "," << y << "," << x;
            }
      for (void* p : {static_cast<void*>(src), static_cast<void*>(dst), static_cast<void*>(arg), static_cast<void*>(g),
                      static_cast<void*>(dx)})
        std::free(p);
    }
}

// pool_max16_rows (nChw16c, split by output rows) against the same scalar maxima: windows tiling the plane or
// overlapping, strides 1-3, batches crossing a thread's rows, channels not filling their last block, teams of 1-3
// (more threads than rows included).
TEST(OnednnPoolArg, MaxByRowsMatchesScalarLoops) {
  if (!has_avx512f()) GTEST_SKIP() << "no AVX-512 on this CPU";
  struct Case {
    int64_t n, c, h, w, kh, kw, sh, sw;
  };
  const Case cases[] = {{1, 128, 55, 55, 3, 3, 2, 2}, {2, 24, 9, 11, 2, 2, 2, 2}, {3, 16, 10, 10, 3, 2, 3, 2},
                        {1, 64, 5, 7, 3, 3, 1, 1},    {2, 32, 4, 4, 4, 4, 1, 1},  {1, 16, 3, 9, 3, 3, 2, 3}};
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const Case& k : cases)
    for (int team = 1; team <= 3; ++team) {
      PoolArgShape s;
      s.n = k.n, s.c = k.c, s.h = k.h, s.w = k.w, s.kh = k.kh, s.kw = k.kw, s.sh = k.sh, s.sw = k.sw, s.block = 16;
      s.oh = (k.h - k.kh) / k.sh + 1, s.ow = (k.w - k.kw) / k.sw + 1;
      const std::string what = "n=" + std::to_string(k.n) + " c=" + std::to_string(k.c) + " " + std::to_string(k.h) +
                               "x" + std::to_string(k.w) + " window " + std::to_string(k.kh) + "x" +
                               std::to_string(k.kw) + " stride " + std::to_string(k.sh) + "x" + std::to_string(k.sw) +
                               " team " + std::to_string(team);
      const size_t in = static_cast<size_t>(s.n * s.blocks() * 16 * s.h * s.w),
                   out = static_cast<size_t>(s.n * s.blocks() * 16 * s.oh * s.ow);
      std::vector<float> src(in), dst(out, NAN);
      for (float& v : src) v = u(rng);
      pool_max16_rows(s, src.data(), dst.data(), team);
      for (int64_t n = 0; n < s.n; ++n)
        for (int64_t c = 0; c < s.blocks() * 16; ++c)  // the padding lanes are pooled like the others
          for (int64_t oy = 0; oy < s.oh; ++oy)
            for (int64_t ox = 0; ox < s.ow; ++ox) {
              float best = -INFINITY;
              for (int64_t i = 0; i < s.kh; ++i)
                for (int64_t j = 0; j < s.kw; ++j)
                  best = std::max(best, src[at(s, n, c, oy * s.sh + i, ox * s.sw + j, s.h, s.w)]);
              ASSERT_EQ(dst[at(s, n, c, oy, ox, s.oh, s.ow)], best)
                  << what << " at " << n << "," << c << "," << oy << "," << ox;
            }
    }
}

}  // namespace
}  // namespace keel::onednn
