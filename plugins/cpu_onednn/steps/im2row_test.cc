// plugins/cpu_onednn/steps/im2row_test.cc — the windows-as-rows step (steps/im2row.h) against a direct reading of
// the ONNX definition (a tap outside the source reads 0), for both layouts, strides, pads, dilations, two parts and
// teams of 1 to 3; then the step followed by the few-row product with an nChw16c output and a Relu against a direct
// convolution, the path Builder::conv_skinny builds.
#include "steps/im2row.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "steps/skinny_gemm.h"

namespace keel::onednn {
namespace {

// A source [1, c, h, w] with values that name their place, stored nhwc or nChw16c.
std::vector<float> source(const Im2RowPart& p) {
  std::vector<float> v(static_cast<size_t>(p.c * p.h * p.w));
  for (int64_t c = 0; c < p.c; ++c)
    for (int64_t y = 0; y < p.h; ++y)
      for (int64_t x = 0; x < p.w; ++x) {
        const float value = static_cast<float>(1 + (c * p.h + y) * p.w + x);
        const int64_t at = p.blocked16 ? ((c / 16) * p.h * p.w + y * p.w + x) * 16 + c % 16 : (y * p.w + x) * p.c + c;
        v[at] = value;
      }
  return v;
}

// The value of channel c at (y, x), 0 outside: what every row element must hold.
float at(const Im2RowPart& p, int64_t c, int64_t y, int64_t x) {
  if (y < 0 || y >= p.h || x < 0 || x >= p.w) return 0.f;
  return static_cast<float>(1 + (c * p.h + y) * p.w + x);
}

void check(const Im2RowShape& s, int team) {
  ASSERT_EQ(im2row_check(s), "");
  std::vector<std::vector<float>> srcs;
  const float* ptrs[2] = {nullptr, nullptr};
  for (int p = 0; p < s.parts; ++p) srcs.push_back(source(s.part[p]));
  for (int p = 0; p < s.parts; ++p) ptrs[p] = srcs[p].data();
  const int64_t k = s.row_floats();
  std::vector<float> x(static_cast<size_t>(s.oh * s.ow * k), NAN);
  im2row_run(s, ptrs, x.data(), team);
  for (int64_t oy = 0; oy < s.oh; ++oy)
    for (int64_t ox = 0; ox < s.ow; ++ox) {
      const float* row = x.data() + (oy * s.ow + ox) * k;
      for (int p = 0; p < s.parts; ++p) {
        const Im2RowPart& q = s.part[p];
        for (int64_t ty = 0; ty < q.kh; ++ty)
          for (int64_t tx = 0; tx < q.kw; ++tx)
            for (int64_t c = 0; c < q.c; ++c, ++row) {
              const int64_t y = oy * q.stride - q.pad_top + ty * q.dilation,
                            xx = ox * q.stride - q.pad_left + tx * q.dilation;
              ASSERT_EQ(*row, at(q, c, y, xx)) << "pixel (" << oy << ", " << ox << ") part " << p << " tap (" << ty
                                               << ", " << tx << ") channel " << c << ", team " << team;
            }
      }
    }
}

Im2RowPart part(int64_t c, int64_t h, int64_t w, bool blocked, int64_t k, int64_t stride, int64_t pad,
                int64_t dilation = 1) {
  Im2RowPart p;
  p.c = c, p.h = h, p.w = w, p.blocked16 = blocked, p.kh = p.kw = k, p.stride = stride, p.pad_top = p.pad_left = pad;
  p.dilation = dilation;
  return p;
}

TEST(Im2Row, RowsHoldEachWindowTapByTap) {
  for (int team : {1, 2, 3})
    for (bool blocked : {false, true}) {
      Im2RowShape s;
      s.oh = s.ow = 7;
      s.part[0] = part(32, 14, 14, blocked, 3, 2, 1);  // ResNet's stride-2 3x3: the top and left taps in the padding
      check(s, team);
      s.oh = 5, s.ow = 6;
      s.part[0] = part(16, 5, 6, blocked, 3, 1, 2, 2);  // dilation 2, pads 2: most taps outside
      check(s, team);
      s.oh = s.ow = 3;
      s.part[0] = part(48, 3, 3, blocked, 1, 1, 0);  // a 1x1: each pixel's channels
      check(s, team);
    }
}

TEST(Im2Row, TwoPartsSideBySide) {
  for (int team : {1, 2}) {
    Im2RowShape s;
    s.oh = s.ow = 7, s.parts = 2;
    s.part[0] = part(32, 7, 7, false, 1, 1, 0);   // the bottleneck's end, nhwc
    s.part[1] = part(48, 14, 14, true, 1, 2, 0);  // the projection's source at every other pixel, nChw16c
    check(s, team);
    s.part[0].blocked16 = true, s.part[1].blocked16 = false;
    check(s, team);
  }
}

TEST(Im2Row, RefusesWhatItDoesNotTake) {
  Im2RowShape s;
  s.part[0] = part(24, 4, 4, true, 1, 1, 0);
  EXPECT_NE(im2row_check(s), "");  // nChw16c of 24 channels
  s.part[0] = part(16, 4, 4, true, 1, 0, 0);
  EXPECT_NE(im2row_check(s), "");  // stride 0
  s.part[0] = part(16, 4, 4, true, 1, 1, 0);
  s.parts = 3;
  EXPECT_NE(im2row_check(s), "");
}

// Rows then the few-row product into nChw16c with the bias and a Relu: a stride-2 3x3 convolution, checked against
// direct summation in double precision.
TEST(Im2Row, WithTheFewRowProductIsTheConvolution) {
  const int64_t C = 32, H = 11, M = 128, OH = 6;  // 36 output pixels, pads 1
  Im2RowShape r;
  r.oh = r.ow = OH;
  r.part[0] = part(C, H, H, true, 3, 2, 1);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> src(static_cast<size_t>(C * H * H)), w(static_cast<size_t>(M * C * 9)), bias(M);
  for (float& v : src) v = u(rng);  // nChw16c
  for (float& v : w) v = u(rng);    // [M][C][3][3]
  for (float& v : bias) v = u(rng);
  SkinnyGemmShape s;
  s.m = OH * OH, s.k = r.row_floats(), s.n = M, s.relu = true, s.y_blocked16 = true;
  ASSERT_EQ(skinny_gemm_check(s), "");
  std::vector<float> wr(w.size());  // [M][tap][C]
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t t = 0; t < 9; ++t) wr[(m * 9 + t) * C + c] = w[(m * C + c) * 9 + t];
  std::vector<float> packed(skinny_gemm_packed_floats(s)), rows(static_cast<size_t>(s.m * s.k));
  skinny_gemm_pack(s, wr.data(), true, packed.data());
  const float* sp[2] = {src.data(), nullptr};
  for (int team : {1, 2}) {
    im2row_run(r, sp, rows.data(), team);
    std::vector<float> got(static_cast<size_t>(M * s.m), NAN);
    skinny_gemm_run(s, rows.data(), packed.data(), bias.data(), got.data(), team);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OH; ++ox) {
          double acc = bias[m];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t ty = 0; ty < 3; ++ty)
              for (int64_t tx = 0; tx < 3; ++tx) {
                const int64_t y = oy * 2 - 1 + ty, x = ox * 2 - 1 + tx;
                if (y < 0 || y >= H || x < 0 || x >= H) continue;
                acc += static_cast<double>(w[(m * C + c) * 9 + ty * 3 + tx]) *
                       src[((c / 16) * H * H + y * H + x) * 16 + c % 16];
              }
          const double want = std::max(acc, 0.0);
          const float g = got[((m / 16) * s.m + oy * OH + ox) * 16 + m % 16];
          ASSERT_NEAR(g, want, 1e-4 * (1 + std::fabs(want)))
              << "channel " << m << " at (" << oy << ", " << ox << "), team " << team;
        }
  }
}

}  // namespace
}  // namespace keel::onednn
