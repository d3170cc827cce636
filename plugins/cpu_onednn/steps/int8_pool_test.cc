// plugins/cpu_onednn/steps/int8_pool_test.cc — the own max pooling of channels-last bytes (steps/int8_pool.h) against a
// scalar loop: u8 and s8, channel counts around the 64-byte vector (a partial one, several, a tail), padding that
// never wins, dilation, ceil-mode windows reaching past the image, teams of 1-3 threads.
#include "steps/int8_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace keel::onednn {
namespace {

bool avx512bw() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"); }

BytePoolShape shape(int64_t n, int64_t h, int64_t w, int64_t c, int64_t k, int64_t st, int64_t pad, int64_t dil,
                    bool ceil, bool s8) {
  BytePoolShape s;
  s.n = n, s.h = h, s.w = w, s.c = c, s.kh = s.kw = k, s.sh = s.sw = st, s.dh = s.dw = dil, s.pt = s.pl = pad;
  s.s8 = s8;
  auto out = [&](int64_t in) {
    const int64_t span = in + 2 * pad - ((k - 1) * dil + 1);
    return 1 + (ceil ? (span + st - 1) / st : span / st);
  };
  s.oh = out(h), s.ow = out(w);
  return s;
}

template <typename T>
std::vector<T> reference(const BytePoolShape& s, const std::vector<T>& x) {
  std::vector<T> y(static_cast<size_t>(s.n * s.oh * s.ow * s.c));
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t oy = 0; oy < s.oh; ++oy)
      for (int64_t ox = 0; ox < s.ow; ++ox)
        for (int64_t c = 0; c < s.c; ++c) {
          T m = std::numeric_limits<T>::lowest();
          for (int64_t ky = 0; ky < s.kh; ++ky)
            for (int64_t kx = 0; kx < s.kw; ++kx) {
              const int64_t iy = oy * s.sh - s.pt + ky * s.dh, ix = ox * s.sw - s.pl + kx * s.dw;
              if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
              m = std::max(m, x[static_cast<size_t>(((n * s.h + iy) * s.w + ix) * s.c + c)]);
            }
          y[static_cast<size_t>(((n * s.oh + oy) * s.ow + ox) * s.c + c)] = m;
        }
  return y;
}

template <typename T>
void check(const BytePoolShape& s, int team) {
  std::mt19937 rng(static_cast<unsigned>(s.c * 31 + s.h * 7 + s.kh + team));
  std::uniform_int_distribution<int> u(std::numeric_limits<T>::lowest(), std::numeric_limits<T>::max());
  std::vector<T> x(static_cast<size_t>(s.n * s.h * s.w * s.c));
  for (T& v : x) v = static_cast<T>(u(rng));
  const std::vector<T> want = reference(s, x);
  std::vector<T> got(want.size() + 64, T{77});  // past the end: must stay untouched
  max_pool_nhwc_bytes(s, x.data(), got.data(), team);
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(static_cast<int>(got[i]), static_cast<int>(want[i])) << "element " << i << " of " << want.size();
  for (size_t i = want.size(); i < got.size(); ++i) ASSERT_EQ(got[i], T{77}) << "written past the output";
}

TEST(OnednnInt8Pool, MatchesTheScalarLoop) {
  if (!avx512bw()) GTEST_SKIP() << "no AVX-512 BW on this CPU: the own int8 loops do not run here";
  for (int team : {1, 2, 3})
    for (int64_t c : {1, 3, 32, 64, 100, 130})
      for (bool s8 : {false, true}) {
        SCOPED_TRACE("C " + std::to_string(c) + (s8 ? " s8" : " u8") + ", team " + std::to_string(team));
        // SimpleCNN's 2x2 / 2 over an odd size (the last column dropped).
        auto a = shape(2, 13, 11, c, 2, 2, 0, 1, false, s8);
        // ResNet's stem pooling: 3x3 / 2, padding 1.
        auto b = shape(1, 9, 10, c, 3, 2, 1, 1, false, s8);
        // Dilation 2, ceil mode (the last window reaches past the image).
        auto d = shape(3, 8, 7, c, 2, 2, 0, 2, true, s8);
        for (const BytePoolShape& s : {a, b, d}) {
          if (s8) check<int8_t>(s, team);
          else check<uint8_t>(s, team);
        }
      }
}

TEST(OnednnInt8Pool, TwoByTwoOverThePlainLayoutMatchesTheScalarLoop) {
  if (!avx512bw()) GTEST_SKIP() << "no AVX-512 BW on this CPU: the own int8 loops do not run here";
  // Planes as images of one channel; widths around the 64-byte step (an odd one drops its last column).
  for (int64_t w : {2, 9, 26, 63, 64, 65, 131})
    for (bool s8 : {false, true})
      for (int team : {1, 3}) {
        SCOPED_TRACE("W " + std::to_string(w) + (s8 ? " s8" : " u8") + ", team " + std::to_string(team));
        const BytePoolShape s = shape(70, 7, w, 1, 2, 2, 0, 1, false, s8);  // 70 planes of 7 rows
        std::mt19937 rng(static_cast<unsigned>(w * 3 + team));
        std::uniform_int_distribution<int> u(0, 255);
        std::vector<uint8_t> x(static_cast<size_t>(s.n * s.h * s.w));
        for (auto& v : x) v = static_cast<uint8_t>(u(rng));
        std::vector<uint8_t> want(static_cast<size_t>(s.n * s.oh * s.ow));
        if (s8) {
          std::vector<int8_t> xs(x.begin(), x.end());
          const std::vector<int8_t> r = reference(s, xs);
          for (size_t i = 0; i < r.size(); ++i) want[i] = static_cast<uint8_t>(r[i]);
        } else {
          want = reference(s, x);
        }
        std::vector<uint8_t> got(want.size() + 64, 77);
        max_pool2x2_plain_bytes(x.data(), got.data(), s.n, s.h, s.w, s8, team);
        for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "element " << i;
        for (size_t i = want.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 77) << "written past the output";
      }
}

TEST(OnednnInt8Pool, ALargeBatchSplitsOverTheTeam) {
  if (!avx512bw()) GTEST_SKIP() << "no AVX-512 BW on this CPU: the own int8 loops do not run here";
  check<uint8_t>(shape(40, 26, 26, 32, 2, 2, 0, 1, false, false), 3);  // past the one-thread size
}

}  // namespace
}  // namespace keel::onednn
