// plugins/cpu_onednn/steps/wino4_test.cc — Winograd F(4,3) (steps/wino4.h) against its double-precision direct
// reference, over the geometries its code splits on: tile tails (sizes not multiples of 4), windows that leave the
// image on each side, images smaller than one tile, batches, odd numbers of 16-channel output blocks (a 16-wide
// last group), several blocks of tiles per thread, teams of 1-3 threads, with and without the residual sum.
#include "steps/wino4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace keel::onednn {
namespace {

void check(int64_t n, int64_t c, int64_t m, int64_t h, int64_t w, bool relu, int team, bool sum = false,
           bool streamed = false, bool f2 = false, bool position_major = false) {
  Wino4Shape s;
  s.n = n, s.c = c, s.m = m, s.h = h, s.w = w, s.sum = sum, s.relu = relu, s.streamed = streamed, s.f2 = f2;
  s.position_major = position_major;
  if (!wino4_check(s).empty()) GTEST_SKIP() << wino4_check(s);
  std::mt19937 rng(static_cast<uint32_t>(h * 131 + w * 7 + c + m * 3 + n));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n * c * h * w)), wt(static_cast<size_t>(m * c * 9)),
      b(static_cast<size_t>(m));
  for (float& v : x) v = u(rng);
  for (float& v : wt) v = u(rng) / std::sqrt(static_cast<float>(c * 9));
  for (float& v : b) v = 0.2f * u(rng);
  const size_t out = static_cast<size_t>(n * m * h * w);
  std::vector<float> want(out), got(out, NAN), packed(wino4_packed_floats(s));
  if (sum) {  // the residual the step adds, in the destination beforehand
    for (float& v : want) v = u(rng);
    got = want;
  }
  std::vector<float> scratch(wino4_scratch_floats(s) * static_cast<size_t>(team));
  wino4_reference(s, x.data(), wt.data(), b.data(), want.data());
  wino4_pack_weights(s, wt.data(), packed.data());
  wino4_run(s, x.data(), packed.data(), b.data(), got.data(), scratch.data(), team);
  // F(4,3) in f32 loses a few bits to its transforms (entries up to 8 and 1/24): outputs here are O(1).
  double worst = 0;
  for (size_t i = 0; i < out; ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << "output " << i << " not written";
    worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
    ASSERT_NEAR(got[i], want[i], 2e-5f * (1.f + std::fabs(want[i])))
        << "at " << i << " of n=" << n << " c=" << c << " m=" << m << " " << h << "x" << w << " team " << team
        << (streamed ? " streamed" : "") << (f2 ? " F(2,3)" : "") << (position_major ? " position-major" : "");
  }
  if (relu) {
    for (float v : got) ASSERT_GE(v, 0.f);
  }
  ::testing::Test::RecordProperty("worst_abs_error_" + std::to_string(c) + "_" + std::to_string(h),
                                  std::to_string(worst));
}

TEST(OnednnWino4, MatchesTheReference) {
  for (int team : {1, 2, 3}) {
    check(1, 16, 16, 8, 8, false, team);         // 2x2 whole tiles
    check(1, 32, 48, 13, 11, true, team);        // tails of 1 and 3 rows / columns; a 16-wide last group
    check(2, 16, 32, 6, 7, false, team);         // batch 2: tiles of two images in one register tile
    check(1, 16, 16, 1, 1, true, team);          // one pixel: the window leaves the image on every side
    check(1, 16, 16, 2, 3, false, team);         // smaller than one tile
    check(1, 64, 64, 56, 56, true, team);        // ResNet-50 layer1: 196 tiles, several blocks per thread
    check(1, 256, 32, 14, 14, true, team);       // many channels: short blocks of tiles
    check(1, 48, 192, 13, 13, true, team);       // SqueezeNet's fire8 expand
    check(1, 64, 64, 21, 18, true, team, true);  // a residual block's second convolution: sum, then Relu
    check(2, 32, 16, 9, 5, false, team, true);   // sum without Relu: negative outputs stay
  }
}

TEST(OnednnWino4, StreamedWeightsMatchTheReference) {
  for (int team : {1, 2, 3}) {
    check(1, 256, 256, 14, 14, true, team, true, true);  // ResNet-50 layer3: 16 tiles, 32-wide groups, 4 chunks
    check(1, 512, 512, 7, 7, true, team, false, true);   // layer4: 4 tiles, 8 chunks of 64 channels
    check(1, 96, 80, 7, 7, false, team, false, true);    // a 16-wide last group, chunks of 64 and 32 channels
    check(1, 48, 112, 11, 9, true, team, false, true);   // 9 tiles, one chunk of 48 channels, a 16-wide last group
    check(2, 32, 48, 14, 13, false, team, true, true);   // batch 2: 32 tiles in register tiles of 11, 11 and 10
    check(1, 16, 16, 1, 1, true, team, false, true);     // one pixel, one tile
    check(3, 64, 32, 30, 30, true, team, false, true);   // 192 tiles: several blocks, the weights transformed per block
  }
}

TEST(OnednnWino4, F2StreamedMatchesTheReference) {
  for (int team : {1, 2, 3}) {
    check(1, 512, 512, 7, 7, true, team, false, true, true);  // ResNet's layer4: 16 tiles (a tail of 1 row / column)
    check(1, 512, 512, 7, 7, true, team, true, true, true);   // its second 3x3: the residual summed, then Relu
    check(1, 96, 80, 7, 7, false, team, false, true, true);   // a 16-wide last group, one chunk (512: 144 x 3 + 80)
    check(1, 48, 112, 11, 9, true, team, false, true, true);  // 30 tiles, tails, a 16-wide last group
    check(2, 32, 48, 8, 6, false, team, true, true, true);    // batch 2: whole tiles only
    check(1, 16, 16, 1, 1, true, team, false, true, true);    // one pixel: the window leaves the image on every side
    check(3, 64, 32, 30, 30, true, team, false, true, true);  // 675 tiles: several blocks
  }
}

TEST(OnednnWino4, PositionMajorMatchesTheReference) {  // the weights transformed at plan time, read by positions
  for (int team : {1, 2, 3}) {
    check(1, 256, 256, 14, 14, true, team, true, false, false, true);  // ResNet-50 layer3: 16 tiles, sum, Relu
    check(1, 96, 80, 13, 11, false, team, false, false, false, true);  // tails, a 16-wide last group
    check(3, 64, 32, 30, 30, true, team, false, false, false, true);   // 192 tiles: several blocks
    // F(2,3), as the chain takes it for 7x7 images.
    check(1, 512, 512, 7, 7, true, team, true, false, true, true);   // ResNet's layer4: the residual summed, Relu
    check(1, 96, 80, 7, 7, false, team, false, false, true, true);   // a 16-wide last group
    check(2, 32, 48, 9, 6, true, team, true, false, true, true);     // batch 2, a tail row
    check(1, 16, 16, 1, 1, true, team, false, false, true, true);    // one pixel
    check(3, 64, 32, 30, 30, true, team, false, false, true, true);  // 675 tiles: several blocks
  }
}

TEST(OnednnWino4, F2ByRegisterTilesMatchesTheReference) {  // F(2,3) in the cached path (not taken by the chain)
  for (int team : {1, 2}) {
    check(1, 32, 48, 13, 11, true, team, false, false, true);
    check(2, 16, 32, 6, 7, false, team, true, false, true);
  }
}

TEST(OnednnWino4, PacksGgGtPerPosition) {
  // A kernel with a single 1 at the centre tap transforms to G e1 e1^T G^T: position (i, j) = G[i][1] * G[j][1].
  Wino4Shape s;
  s.c = 16, s.m = 16, s.h = s.w = 4;
  std::vector<float> w(16 * 16 * 9, 0.f), p(wino4_packed_floats(s));
  w[(3 * 16 + 5) * 9 + 4] = 1.f;  // output 3, input 5, centre
  wino4_pack_weights(s, w.data(), p.data());
  const double g1[6] = {0, -1.0 / 6, 1.0 / 6, 1.0 / 12, -1.0 / 12, 0};
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) EXPECT_NEAR(p[((i * 6 + j) * 16 + 5) * 16 + 3], g1[i] * g1[j], 1e-7);
}

TEST(OnednnWino4, PacksF2GgGtPerPosition) {
  // F(2,3): G's middle column is (0, 1/2, -1/2, 0).
  Wino4Shape s;
  s.c = 16, s.m = 16, s.h = s.w = 4, s.f2 = true;
  std::vector<float> w(16 * 16 * 9, 0.f), p(wino4_packed_floats(s));
  ASSERT_EQ(p.size(), 16u * 16 * 16);
  w[(3 * 16 + 5) * 9 + 4] = 1.f;
  wino4_pack_weights(s, w.data(), p.data());
  const double g1[4] = {0, 0.5, -0.5, 0};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(p[((i * 4 + j) * 16 + 5) * 16 + 3], g1[i] * g1[j], 1e-7);
}

TEST(OnednnWino4, RejectsWhatItDoesNotCompute) {
  Wino4Shape s;
  s.h = s.w = 4, s.c = 8;
  EXPECT_NE(wino4_check(s), "");
  s.c = 16, s.m = 24;
  EXPECT_NE(wino4_check(s), "");
  s.m = 16, s.h = 0;
  EXPECT_NE(wino4_check(s), "");
}

}  // namespace
}  // namespace keel::onednn
