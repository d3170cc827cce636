// plugins/cpu_onednn/steps/pointwise.cc — a 1x1 stride-1 convolution over nChw16c (steps/pointwise.h).
//
// Tiles: each image's pixels in near-equal runs of at most kTile (a 7x7 image as 13 + 12 + 12 + 12, not 14 + 14 + 14
// + 7: a run of 7 leaves the FMA units waiting on too few sums). A thread takes a range of tiles (or of output groups);
// per output group and per tile of its range, the sums of the tile's pixels and the group's channels over every input
// channel stay in registers (steps/tile1x1.h's expand_tile, the expand_dw step's kernel), then get the bias, the
// residual, Relu and its cap, and go to dst; a group's weights ([c][32]) stay in L2 over the range's tiles.
#include "steps/pointwise.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/team.h"
#include "steps/silu.h"
#include "steps/tile1x1.h"

namespace keel::onednn {
namespace {

constexpr int kTile = 14;                   // pixels per register tile (14 x 2 accumulators)
constexpr int64_t kMinPrefetchPixels = 28;  // pixels per group a thread takes, at least, to prefetch the next group

int64_t groups(const PointwiseShape& s) { return (s.m + 31) / 32; }
int64_t group_width(const PointwiseShape& s, int64_t g) { return std::min<int64_t>(32, s.m - 32 * g); }
int64_t hw(const PointwiseShape& s) { return s.h * s.w; }
int64_t tiles_per_image(const PointwiseShape& s) { return (hw(s) + kTile - 1) / kTile; }

// Tiles [begin, end) of the whole batch (tiles_per_image(s) per image) by output groups [g0, g1), on the calling
// thread, group by group.
void run_tiles(const PointwiseShape& s, const float* src, const float* packed, const float* bias, float* dst,
               int64_t begin, int64_t end, int64_t g0, int64_t g1) {
  ExpandDwAct act;  // Relu, or Clip(0, hi) for a capped one
  if (s.relu) act.kind = std::isinf(s.relu_max) ? ExpandDwAct::kRelu : ExpandDwAct::kClip, act.hi = s.relu_max;
  static constexpr float kNoBias[32] = {};
  const int64_t n_hw = hw(s), tpi = tiles_per_image(s), plane = n_hw * 16, cb_n = s.c / 16, mb_n = s.m / 16;
  const int64_t pixels = (end - begin) * n_hw / tpi;  // about: the range's tiles times a tile's pixels
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t wg = group_width(s, g);
    const float* W = packed + s.c * 32 * g;  // groups before g are all 32 wide
    // While the group's tiles run, the next group's weights are prefetched into L2 (its first tile would wait for
    // them), where the range has pixels enough to hide it (not SE's 1x1 images: there the step only streams the
    // weights, and prefetching the next group's slowed it by a third).
    const Prefetch next = g + 1 < g1 && pixels >= kMinPrefetchPixels
                              ? Prefetch::bytes(W + 32 * s.c, s.c * group_width(s, g + 1) * 4)
                              : Prefetch{};
    for (int64_t q = begin; q < end; ++q) {
      const int64_t img = q / tpi, j = q % tpi, p0 = n_hw * j / tpi, p1 = n_hw * (j + 1) / tpi;
      float* o = dst + (img * mb_n + 2 * g) * plane + p0 * 16;
      const float* x = src + img * cb_n * plane + p0 * 16;
      const int t = static_cast<int>(p1 - p0), nv = static_cast<int>(wg / 16);
      const float* b = bias ? bias + 32 * g : kNoBias;
      expand_tile_run(t, nv, x, plane, s.c, W, b, act, o, plane, s.sum ? o : nullptr,
                      next.part(q - begin, end - begin));
    }
  }
}

}  // namespace

std::string pointwise_check(const PointwiseShape& s) {
  if (!has_avx512f()) return "no AVX-512";
  if (s.n < 1 || s.h < 1 || s.w < 1) return "empty image";
  if (s.c < 16 || s.c % 16 != 0 || s.m < 16 || s.m % 16 != 0) return "channels not a multiple of 16";
  if (s.relu_max < 0) return "a Relu cap below zero";
  return "";
}

size_t pointwise_packed_floats(const PointwiseShape& s) { return static_cast<size_t>(s.c * s.m); }

void pointwise_pack_weights(const PointwiseShape& s, const float* w, float* packed) {
  for (int64_t o = 0; o < s.m; ++o) {
    const int64_t g = o / 32, wg = group_width(s, g);
    for (int64_t c = 0; c < s.c; ++c) packed[s.c * 32 * g + c * wg + o % 32] = w[o * s.c + c];
  }
}

void pointwise_run(const PointwiseShape& s, const float* src, const float* packed, const float* bias, float* dst,
                   int team) {
  const int64_t tiles = s.n * tiles_per_image(s), ng = groups(s);
  const size_t weight_bytes = pointwise_packed_floats(s) * sizeof(float),
               src_bytes = static_cast<size_t>(s.n * s.c * hw(s)) * sizeof(float);
  // More weights than source: each thread its own output groups over every tile (its groups' weights read once, the
  // source whole); else its own tiles over every group.
  if (weight_bytes > src_bytes && ng >= 2 * team) {
    split_over_team(ng, team, [&](int64_t, int64_t g0, int64_t g1) {
      if (g1 > g0) run_tiles(s, src, packed, bias, dst, 0, tiles, g0, g1);
    });
  } else {
    split_over_team(tiles, team, [&](int64_t, int64_t begin, int64_t end) {
      if (end > begin) run_tiles(s, src, packed, bias, dst, begin, end, 0, ng);
    });
  }
}

void pointwise_reference(const PointwiseShape& s, const float* src, const float* w, const float* bias, float* dst) {
  const int64_t n_hw = hw(s), cb_n = s.c / 16, mb_n = s.m / 16;
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t o = 0; o < s.m; ++o)
      for (int64_t p = 0; p < n_hw; ++p) {
        double acc = bias ? bias[o] : 0.0;
        for (int64_t c = 0; c < s.c; ++c)
          acc += static_cast<double>(src[((img * cb_n + c / 16) * n_hw + p) * 16 + c % 16]) * w[o * s.c + c];
        float& d = dst[((img * mb_n + o / 16) * n_hw + p) * 16 + o % 16];
        float v = static_cast<float>(acc + (s.sum ? d : 0.0));
        if (s.relu) v = std::min(std::max(v, 0.f), s.relu_max);
        d = v;
      }
}

}  // namespace keel::onednn
