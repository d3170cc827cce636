// plugins/cpu_onednn/steps/expand_dw_test.cc — the fused 1x1 + depthwise 3x3 / 5x5 step (steps/expand_dw.h) against
// its double-precision reference, over the geometries its code splits on: register-tile tails (widths not multiples
// of 14, 8 or 6), input channels not a multiple of 16 (a zero-padded last block), expanded channels not a multiple of
// 16 (the padding lanes written 0) and an odd number of 16-channel blocks (a 16-wide last group), 3x3 and 5x5 at
// strides 1 and 2 with odd and even sizes, windows larger than the image, batches, every activation, teams of 1-3
// threads splitting rows or channel groups, each thread's rows one by one or at once.
#include "steps/expand_dw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace keel::onednn {
namespace {

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

ExpandDwAct clip6() {
  ExpandDwAct a;
  a.kind = ExpandDwAct::kClip, a.lo = 0.f, a.hi = 6.f;
  return a;
}
ExpandDwAct of(ExpandDwAct::Kind k) {
  ExpandDwAct a;
  a.kind = k;
  return a;
}

void check(int64_t n, int64_t c, int64_t m, int64_t h, int64_t w, int64_t stride, int team, ExpandDwAct act1 = clip6(),
           ExpandDwAct act2 = clip6(), int64_t k = 3, int64_t proj = 0, bool residual = false,
           ExpandDwAct act3 = ExpandDwAct{}, bool stem = false, bool bf16 = false, int at_once = -1) {
  ExpandDwShape s;
  s.n = n, s.c = c, s.m = m, s.h = h, s.w = w, s.k = k, s.stride = stride, s.act1 = act1, s.act2 = act2;
  s.proj = proj, s.residual = residual, s.act3 = act3, s.stem = stem, s.bf16 = bf16, s.at_once = at_once;
  if (!expand_dw_check(s).empty()) GTEST_SKIP() << expand_dw_check(s);
  const int64_t cb = (c + 15) / 16;
  std::mt19937 rng(static_cast<uint32_t>(h * 131 + w * 7 + c + m * 3 + n + stride * 1000));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  // nChw16c source with the last block's padding lanes zero, as oneDNN keeps them.
  std::vector<float> x(static_cast<size_t>(n * cb * 16 * h * w), 0.f);  // (a stem's plain source: its first part)
  for (int64_t img = 0; img < n; ++img)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t p = 0; p < h * w; ++p) x[((img * cb + k / 16) * h * w + p) * 16 + k % 16] = 2.f * u(rng);
  if (residual && c % 16 != 0)  // padding lanes the step must not pass on into its output's padding
    for (int64_t img = 0; img < n; ++img)
      for (int64_t p = 0; p < h * w; ++p) x[((img * cb + cb - 1) * h * w + p) * 16 + 15] = 1e30f;
  const int64_t c1 = stem ? c * 9 : c;
  if (stem)
    for (float& v : x) v = 2.f * u(rng);
  std::vector<float> w1(static_cast<size_t>(m * c1)), b1(static_cast<size_t>(m)), w2(static_cast<size_t>(m * k * k)),
      b2(static_cast<size_t>(m));
  for (float& v : w1) v = u(rng) * 2.f / std::sqrt(static_cast<float>(c1));
  for (float& v : b1) v = 0.5f * u(rng);
  for (float& v : w2) v = u(rng) / static_cast<float>(k);
  for (float& v : b2) v = 0.2f * u(rng);
  std::vector<float> w3(static_cast<size_t>(proj * m)), b3(static_cast<size_t>(proj));
  for (float& v : w3) v = u(rng) / std::sqrt(static_cast<float>(m));
  for (float& v : b3) v = 0.3f * u(rng);
  const int64_t outc = proj > 0 ? proj : m;
  const size_t out = static_cast<size_t>(n * ((outc + 15) / 16 * 16) * s.oh() * s.ow());  // a partial block's lanes too
  std::vector<float> want(out), got(out, NAN), packed(expand_dw_packed_floats(s));
  std::vector<float> scratch(expand_dw_scratch_floats(s) * static_cast<size_t>(team));
  expand_dw_pack(s, w1.data(), b1.data(), w2.data(), b2.data(), w3.data(), b3.data(), packed.data());
  float tolerance = 2e-5f;
  if (bf16) {
    // The reference over what the step multiplies: the source and both 1x1s' weights rounded to bf16; the step also
    // rounds its depthwise output (before the projection) and its own output to bf16 (8 bits): a tolerance of 2^-6
    // relative to the output's typical size.
    for (auto* v : {&x, &w1, &w3})
      for (float& f : *v) f = from_bf16(to_bf16(f));
    std::vector<uint16_t> x16(x.size()), got16(out, 0x7FC0);  // NaN until written
    for (size_t i = 0; i < x.size(); ++i) x16[i] = to_bf16(x[i]);
    expand_dw_run(s, reinterpret_cast<const float*>(x16.data()), packed.data(), reinterpret_cast<float*>(got16.data()),
                  scratch.data(), team);
    for (size_t i = 0; i < out; ++i) got[i] = from_bf16(got16[i]);
    tolerance = 1.f / 64;
  } else {
    expand_dw_run(s, x.data(), packed.data(), got.data(), scratch.data(), team);
  }
  expand_dw_reference(s, x.data(), w1.data(), b1.data(), w2.data(), b2.data(), w3.data(), b3.data(), want.data());
  double typical = 0;
  for (float v : want) typical += std::fabs(v) / static_cast<double>(out);
  const std::string where =
      "n=" + std::to_string(n) + " c=" + std::to_string(c) + " m=" + std::to_string(m) + " " + std::to_string(h) + "x" +
      std::to_string(w) + " k " + std::to_string(k) + " stride " + std::to_string(stride) + " proj " +
      std::to_string(proj) + (residual ? " + residual" : "") + " team " + std::to_string(team) + (bf16 ? " bf16" : "") +
      (expand_dw_splits_rows(s, team) ? " (rows)" : " (groups)") + (expand_dw_rows_at_once(s) ? " at once" : "");
  for (size_t i = 0; i < out; ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << "output " << i << " not written, " << where;
    ASSERT_NEAR(got[i], want[i],
                tolerance * (bf16 ? std::fabs(want[i]) + static_cast<float>(typical) : 1.f + std::fabs(want[i])))
        << "at " << i << ", " << where;
  }
}

TEST(OnednnExpandDw, MatchesTheReference) {
  for (int team : {1, 2, 3}) {
    check(1, 24, 144, 56, 56, 1, team);  // MobileNetV2 features.3: 24 inputs (a padded block), 4 tiles of 14
    check(1, 16, 96, 28, 28, 2, team);   // features.2 (smaller): stride 2, a 16-wide last group
    check(1, 32, 192, 14, 14, 1, team);  // 14x14: rows or groups by team
    check(1, 160, 960, 7, 7, 1, team);   // 7x7, many inputs: channel groups at 2+ threads
    check(1, 24, 48, 13, 11, 2, team);   // odd sizes at stride 2; tails of the 14- and 8-pixel tiles
    check(1, 8, 16, 1, 1, 1, team);      // one pixel: every tap but the centre outside the image
    check(1, 8, 16, 2, 3, 2, team);      // smaller than one tile
    check(2, 16, 32, 6, 5, 1, team);     // batch 2: the ring starts over with the second image
    check(3, 40, 80, 5, 9, 2, team);     // batch 3 at stride 2, few rows: groups over the team
  }
}

TEST(OnednnExpandDw, FiveByFiveAndPartialBlocks) {
  using K = ExpandDwAct::Kind;
  for (int team : {1, 2, 3}) {
    check(1, 24, 72, 28, 28, 2, team, of(K::kRelu), of(K::kRelu));  // MobileNetV3's 16 -> 72 -> s2: 4.5 blocks
    check(1, 24, 88, 14, 14, 1, team, of(K::kRelu), of(K::kRelu));  // 5.5 blocks, stride 1
    check(1, 24, 96, 28, 28, 2, team, of(K::kHardSwish), of(K::kHardSwish), 5);   // 5x5 stride 2
    check(1, 40, 120, 14, 14, 1, team, of(K::kHardSwish), of(K::kHardSwish), 5);  // 5x5, 7.5 blocks
    check(1, 96, 576, 7, 7, 1, team, of(K::kHardSwish), of(K::kHardSwish), 5);    // 5x5 at 7x7: groups at 2+
    check(2, 8, 40, 4, 3, 1, team, of(K::kNone), of(K::kSilu), 5);                // the window larger than the image
    check(1, 16, 16, 9, 10, 2, team, clip6(), clip6(), 5);
  }
}

TEST(OnednnExpandDw, WithTheProjectionAndResidual) {
  using K = ExpandDwAct::Kind;
  for (int team : {1, 2, 3}) {
    check(1, 24, 144, 28, 28, 1, team, clip6(), clip6(), 3, 24, true);  // MobileNetV2's features.3, smaller
    check(1, 16, 96, 28, 28, 2, team, clip6(), clip6(), 3, 24);         // features.2: stride 2, no residual
    check(1, 160, 960, 7, 7, 1, team, clip6(), clip6(), 3, 160, true);  // 7x7: rows over the team
    check(1, 160, 960, 7, 7, 1, team, clip6(), clip6(), 3, 320);        // features.17: 10 projected groups
    check(2, 40, 120, 9, 11, 1, team, of(K::kHardSwish), of(K::kRelu), 5, 40, true);  // partial blocks, batch 2
    check(1, 32, 64, 12, 12, 1, team, of(K::kRelu), of(K::kNone), 3, 48, false, of(K::kHardSwish));  // act after it
  }
}

// Each thread's rows at once (per group every expanded row, then the projection over all the rows' pixels): forced
// on and off over the geometries the row ranges split on, and by the rule for MobileNetV2's 7x7 and 14x14 blocks.
TEST(OnednnExpandDw, RowsAtOnce) {
  using K = ExpandDwAct::Kind;
  ExpandDwShape seven;
  seven.c = 160, seven.m = 960, seven.h = seven.w = 7, seven.proj = 160, seven.residual = true;
  EXPECT_TRUE(expand_dw_rows_at_once(seven));  // 1.2 MB of 1x1 weights
  ExpandDwShape fourteen = seven;
  fourteen.c = fourteen.proj = 96, fourteen.m = 576, fourteen.h = fourteen.w = 14;
  EXPECT_TRUE(expand_dw_rows_at_once(fourteen, 1));   // 442 KB at 1 thread: from memory, the next group's prefetched
  EXPECT_FALSE(expand_dw_rows_at_once(fourteen, 2));  // at 2 threads row after row
  ExpandDwShape small = fourteen;
  small.c = small.proj = 64, small.m = 384;
  EXPECT_FALSE(expand_dw_rows_at_once(small, 1));  // 210 KB: row after row, from L2
  seven.proj = 0, seven.residual = false;
  EXPECT_FALSE(expand_dw_rows_at_once(seven));  // nothing to project
  for (int team : {1, 2, 3}) {
    const ExpandDwAct none{};
    check(1, 160, 960, 7, 7, 1, team, clip6(), clip6(), 3, 160, true);  // MobileNetV2's features.15, by the rule
    check(1, 160, 960, 7, 7, 1, team, clip6(), clip6(), 3, 320);        // features.17
    check(1, 96, 576, 14, 14, 1, team, clip6(), clip6(), 3, 96, true);  // features.12, row by row by the rule
    for (int at_once : {1, 0}) {
      check(1, 96, 576, 14, 14, 2, team, clip6(), clip6(), 3, 160, false, none, false, false, at_once);  // into 7x7
      check(2, 40, 120, 9, 11, 1, team, of(K::kHardSwish), of(K::kRelu), 5, 40, true, none, false, false,
            at_once);  // batch 2 (a thread's rows in two images), partial blocks, 5x5
      check(3, 24, 72, 6, 5, 2, team, of(K::kRelu), clip6(), 3, 20, false, of(K::kRelu), false, false,
            at_once);  // batch 3 at stride 2, a partial projected block, an activation after it
      check(1, 16, 48, 1, 3, 1, team, clip6(), clip6(), 5, 16, true, none, false, false, at_once);  // one row
    }
  }
}

TEST(OnednnExpandDw, AStemFirst) {
  for (int team : {1, 2, 3}) {
    check(1, 3, 32, 224, 224, 1, team, clip6(), clip6(), 3, 16, false, ExpandDwAct{}, true);  // MobileNetV2's first two
    check(1, 3, 32, 37, 29, 1, team, clip6(), clip6(), 3, 0, false, ExpandDwAct{}, true);  // odd sizes, no projection
    check(2, 4, 24, 10, 9, 2, team, of(ExpandDwAct::kRelu), clip6(), 5, 8, false, ExpandDwAct{}, true);
    check(1, 1, 16, 1, 2, 1, team, clip6(), clip6(), 3, 0, false, ExpandDwAct{}, true);  // one input row
  }
}

TEST(OnednnExpandDw, EveryActivation) {
  using K = ExpandDwAct::Kind;
  for (K a : {K::kNone, K::kRelu, K::kHardSwish, K::kSilu})
    for (int team : {1, 2}) {
      check(1, 16, 48, 10, 15, 1, team, of(a), clip6());
      check(1, 16, 48, 10, 15, 2, team, clip6(), of(a));
    }
  ExpandDwAct odd;
  odd.kind = ExpandDwAct::kClip, odd.lo = -0.5f, odd.hi = 0.25f;
  check(1, 16, 32, 9, 9, 1, 2, odd, odd);
}

TEST(OnednnExpandDw, Bf16SourceAndDestination) {
  using K = ExpandDwAct::Kind;
  for (int team : {1, 2, 3}) {
    const ExpandDwAct none{};
    check(1, 24, 144, 28, 28, 1, team, clip6(), clip6(), 3, 24, true, none, false, true);  // features.3, smaller
    check(1, 16, 96, 29, 27, 2, team, clip6(), clip6(), 3, 24, false, none, false, true);  // features.2, odd sizes
    check(1, 24, 144, 14, 14, 2, team, clip6(), clip6(), 3, 0, false, none, false, true);  // no projection
    check(1, 160, 960, 7, 7, 1, team, clip6(), clip6(), 3, 0, false, none, false, true);   // groups at 2+ threads
    check(2, 40, 120, 9, 11, 1, team, of(K::kHardSwish), of(K::kRelu), 5, 40, true, none, false, true);  // partial
    check(1, 8, 40, 5, 6, 1, team, of(K::kRelu), of(K::kSilu), 3, 20, false, of(K::kRelu), false, true);
  }
}

TEST(OnednnExpandDw, PacksGroupsOf32AndTheDepthwiseBlocks) {
  ExpandDwShape s;
  s.c = 3, s.m = 48, s.h = 4, s.w = 4;
  std::vector<float> w1(48 * 3), b1(48), w2(48 * 9), b2(48), packed(expand_dw_packed_floats(s), NAN);
  s.proj = 0;
  for (size_t i = 0; i < w1.size(); ++i) w1[i] = static_cast<float>(i);
  for (size_t i = 0; i < w2.size(); ++i) w2[i] = 1000.f + static_cast<float>(i);
  for (int i = 0; i < 48; ++i) b1[i] = -1.f - i, b2[i] = -100.f - i;
  expand_dw_pack(s, w1.data(), b1.data(), w2.data(), b2.data(), nullptr, nullptr, packed.data());
  ASSERT_EQ(packed.size(), 3u * 48 + 11u * 48);
  EXPECT_EQ(packed[1 * 32 + 5], w1[5 * 3 + 1]);            // group 0: [k][32]
  EXPECT_EQ(packed[32 * 3 + 2 * 16 + 7], w1[39 * 3 + 2]);  // group 1 (16 wide): [k][16]
  EXPECT_EQ(packed[144 + (1 * 9 + 4) * 16 + 3], w2[19 * 9 + 4]);
  EXPECT_EQ(packed[144 + 9 * 48 + 47], b1[47]);
  EXPECT_EQ(packed[144 + 10 * 48], b2[0]);
}

TEST(OnednnExpandDw, RejectsWhatItDoesNotCompute) {
  ExpandDwShape s;
  s.c = 16, s.m = 24, s.h = 8, s.w = 8;
  EXPECT_EQ(expand_dw_check(s), "");
  s.act2.kind = ExpandDwAct::kClip, s.act2.lo = 1.f, s.act2.hi = 6.f;
  EXPECT_NE(expand_dw_check(s), "");  // a partial block's padding would become 1
  s.m = 32;
  EXPECT_EQ(expand_dw_check(s), "");
  s.act2 = ExpandDwAct{};
  s.k = 7;
  EXPECT_NE(expand_dw_check(s), "");
  s.k = 3, s.stride = 3;
  EXPECT_NE(expand_dw_check(s), "");
  s.stride = 2, s.proj = 16, s.residual = true;
  EXPECT_NE(expand_dw_check(s), "");  // a residual after a stride-2 depthwise
  s.stride = 1, s.proj = 24;
  EXPECT_NE(expand_dw_check(s), "");  // a residual of 24 channels onto a 16-channel source
  s.proj = 16, s.stem = true;
  EXPECT_NE(expand_dw_check(s), "");  // a residual after a stem
  s.stride = 1, s.h = 0;
  EXPECT_NE(expand_dw_check(s), "");
  s.h = 8;
  s.act1.kind = ExpandDwAct::kClip, s.act1.lo = 1.f, s.act1.hi = 0.f;
  EXPECT_NE(expand_dw_check(s), "");
}

}  // namespace
}  // namespace keel::onednn
