// plugins/cpu_onednn/steps/pointwise_test.cc — the 1x1 convolution step (steps/pointwise.h) against its
// double-precision reference over what its code splits on: pixel counts that are not multiples of the 14-pixel tile
// (and images of one pixel), batches (tiles of several images in one chunk), an odd number of 16-channel output
// blocks (a 16-wide last group), teams of 1-3 threads (each its range of tiles or of output groups), the residual sum,
// Relu and its cap, no bias; and the register tile's two instances (steps/tile1x1.h: with and without the prefetch of
// the next weights) against each other.
#include "steps/pointwise.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "steps/silu.h"
#include "steps/tile1x1.h"

namespace keel::onednn {
namespace {

void check(int64_t n, int64_t c, int64_t m, int64_t h, int64_t w, int team, bool sum = false, bool relu = false,
           float relu_max = INFINITY, bool with_bias = true) {
  PointwiseShape s;
  s.n = n, s.c = c, s.m = m, s.h = h, s.w = w, s.sum = sum, s.relu = relu, s.relu_max = relu_max;
  if (!pointwise_check(s).empty()) GTEST_SKIP() << pointwise_check(s);
  std::mt19937 rng(static_cast<uint32_t>(h * 131 + w * 7 + c + m * 3 + n + team));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n * c * h * w)), wt(static_cast<size_t>(m * c)), b(static_cast<size_t>(m));
  for (float& v : x) v = u(rng);
  for (float& v : wt) v = u(rng) / std::sqrt(static_cast<float>(c));
  for (float& v : b) v = 0.2f * u(rng);
  const size_t out = static_cast<size_t>(n * m * h * w);
  std::vector<float> want(out), got(out, NAN), packed(pointwise_packed_floats(s));
  if (sum) {  // the residual the step adds, in the destination beforehand
    for (float& v : want) v = u(rng);
    got = want;
  }
  const float* bias = with_bias ? b.data() : nullptr;
  pointwise_reference(s, x.data(), wt.data(), bias, want.data());
  pointwise_pack_weights(s, wt.data(), packed.data());
  pointwise_run(s, x.data(), packed.data(), bias, got.data(), team);
  for (size_t i = 0; i < out; ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << "output " << i << " not written";
    ASSERT_NEAR(got[i], want[i], 2e-5f * (1.f + std::fabs(want[i])))
        << "at " << i << " of n=" << n << " c=" << c << " m=" << m << " " << h << "x" << w << " team " << team
        << (sum ? " sum" : "") << (relu ? " relu" : "") << " cap " << relu_max;
  }
}

TEST(OnednnPointwise, MatchesTheReference) {
  for (int team : {1, 2, 3}) {
    check(1, 16, 16, 1, 1, team);                      // one pixel, one block each way
    check(1, 32, 48, 7, 7, team, false, true);         // 49 pixels as 13 + 12 + 12 + 12; a 16-wide last group
    check(2, 48, 32, 5, 3, team, true, true);          // two images of 15 pixels (8 + 7); the residual
    check(3, 64, 80, 13, 11, team, true);              // 143 pixels a image, three images
    check(1, 16, 64, 14, 14, team, false, true, 6.f);  // ReLU6
    check(1, 96, 16, 9, 9, team, false, false, INFINITY, false);  // no bias
  }
}

// Large weights (more bytes than the source: each thread its output groups) over many tiles, as ResNet-50's 1x1s, at
// 1-3 threads; the next group's weights prefetched while a group's tiles run.
TEST(OnednnPointwise, LargeWeights) {
  for (int team : {1, 2, 3}) {
    check(1, 512, 160, 14, 14, team, true, true);
    check(1, 256, 288, 28, 28, team, false, true);
  }
}

// The cap below most sums: every output either the cap, zero or between, as Clip(0, hi) after the sum.
TEST(OnednnPointwise, CapBelowTheSums) { check(1, 64, 32, 6, 6, 2, true, true, 0.25f); }

// expand_tile_pf (prefetching `lines` cache lines meanwhile) writes what expand_tile writes, to the bit, for every tile
// width, one or two output vectors, input channels that end within a 16-channel block, with and without a residual,
// however many lines it is given (none, fewer than the blocks, more); and Prefetch's parts cover its lines once, in
// order.
TEST(OnednnPointwise, PrefetchingTileWritesWhatThePlainOneWrites) {
  const std::vector<char> range(1000);
  const Prefetch whole = Prefetch::bytes(range.data(), 1000);  // 16 lines
  EXPECT_EQ(whole.lines, 16);
  for (int parts : {1, 3, 16, 40}) {
    int64_t next = 0;
    for (int i = 0; i < parts; ++i) {
      const Prefetch p = whole.part(i, parts);
      if (p.lines == 0) continue;
      EXPECT_EQ(p.at, whole.at + next * 64) << "part " << i << " of " << parts;
      next += p.lines;
    }
    EXPECT_EQ(next, whole.lines) << parts << " parts";
  }
  EXPECT_EQ(Prefetch::bytes(nullptr, 4096).lines, 0);
  if (!has_avx512f()) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<char> lines(64 * 64);  // what the tile prefetches (never read through)
  for (int64_t c : {16, 40, 96})
    for (int nv : {1, 2})
      for (int t = 1; t <= 14; ++t)
        for (bool residual : {false, true})
          for (int64_t pf_lines : {0, 3, 64}) {
            const int64_t blocks = (c + 15) / 16, block_stride = t * 16;
            std::vector<float> src(static_cast<size_t>(blocks * block_stride)), w(static_cast<size_t>(c * nv * 16)),
                bias(32), res(static_cast<size_t>(nv * t * 16)), plain(res.size(), NAN), pf(res.size(), NAN);
            for (auto* v : {&src, &w, &bias, &res})
              for (float& f : *v) f = u(rng);
            ExpandDwAct act;
            act.kind = ExpandDwAct::kRelu;
            const float* r = residual ? res.data() : nullptr;
            expand_tile_fn(t, nv)(src.data(), block_stride, c, w.data(), bias.data(), act, plain.data(), t * 16, r);
            expand_tile_pf_fn(t, nv)(src.data(), block_stride, c, w.data(), bias.data(), act, pf.data(), t * 16, r,
                                     lines.data(), pf_lines);
            for (size_t i = 0; i < plain.size(); ++i)
              ASSERT_EQ(std::memcmp(&plain[i], &pf[i], sizeof(float)), 0)
                  << "output " << i << ": c " << c << " nv " << nv << " tile " << t << (residual ? " residual" : "")
                  << " lines " << pf_lines;
          }
}

}  // namespace
}  // namespace keel::onednn
