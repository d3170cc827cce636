// plugins/cpu_onednn/steps/skinny_gemm.cc — Y = X W + bias for few rows and large weights (steps/skinny_gemm.h).
#include "steps/skinny_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "common/team.h"
#include "steps/silu.h"

namespace keel::onednn {
namespace {

// Column blocks of 64, the last one zero-padded (and masked where Y is written).
int64_t blocks(const SkinnyGemmShape& s) { return (s.n + 63) / 64; }

// Rows of a register tile: 6 x 4 sums, 4 weight vectors and a broadcast (7 rows would spill one sum).
constexpr int kMaxTileRows = 6;
constexpr int64_t kChunk = 768;      // k per chunk: the block's part read per row tile (192 KB) stays in L2
constexpr int64_t kLineFloats = 16;  // a cache line

// GCC 12 warns about its own _mm512_undefined_ps() inside max (a false positive; as in steps/silu.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Rows [0, R) of the tile at x (rows `ldx` apart) times the block's k range [k0, k1) (b: the block, 64 floats per k),
// into y (rows `ldy` apart, the block's four 16-column vectors `ldv` apart): started from y when `from_y`, else from
// the bias (b64: the block's 64, or null for 0); `then_bias` adds the block's bias at the end too (the first chunk of
// a sum into y), `relu` then clamps at 0 and at `relu_max` (the last chunk). While it runs it prefetches `lines` cache
// lines from `pf` on, one every `every` k.
template <int R>
__attribute__((target("avx512f"))) void tile(const float* x, int64_t ldx, const float* b, int64_t k0, int64_t k1,
                                             float* y, int64_t ldy, int64_t ldv, bool from_y, const float* b64,
                                             bool then_bias, bool relu, float relu_max, const char* pf, int64_t lines,
                                             int64_t every, int valid) {
  // The block's columns [0, valid) exist (64 but in a last, narrower block): masks per 16-column vector.
  __mmask16 mask[4];
  for (int j = 0; j < 4; ++j) {
    const int v = std::clamp(valid - 16 * j, 0, 16);
    mask[j] = static_cast<__mmask16>((1u << v) - 1);
  }
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j)
      acc[r][j] = from_y ? _mm512_maskz_loadu_ps(mask[j], y + r * ldy + ldv * j)
                  : b64  ? _mm512_maskz_loadu_ps(mask[j], b64 + 16 * j)
                         : _mm512_setzero_ps();
  const float* bp = b + k0 * 64;
  int64_t until = lines > 0 ? every : INT64_MAX;
  for (int64_t k = k0; k < k1; ++k, bp += 64) {
    if (--until == 0) {
      _mm_prefetch(pf, _MM_HINT_T1);
      pf += 64;
      until = --lines > 0 ? every : INT64_MAX;
    }
    const __m512 w0 = _mm512_loadu_ps(bp), w1 = _mm512_loadu_ps(bp + 16), w2 = _mm512_loadu_ps(bp + 32),
                 w3 = _mm512_loadu_ps(bp + 48);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * ldx + k]);
      acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(xv, w2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(xv, w3, acc[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 4; ++j) {
      __m512 v = acc[r][j];
      if (then_bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask[j], b64 + 16 * j));
      if (relu) v = _mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), _mm512_set1_ps(relu_max));
      _mm512_mask_storeu_ps(y + r * ldy + ldv * j, mask[j], v);
    }
}

#pragma GCC diagnostic pop

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, int64_t, bool,
                        const float*, bool, bool, float, const char*, int64_t, int64_t, int);
constexpr TileFn kTiles[kMaxTileRows] = {tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>};

// Column blocks [b0, b1) on the calling thread, chunk by chunk of k: each chunk's rows of X (49 x 768 floats: 150 KB)
// stay in L2 while every block multiplies them (block by block over the whole of k, the whole of X came through the
// cache again for each block: 7 MB for ResNet's 49 x 4608 over 8 blocks); the sums accumulate in y over the chunks.
void run_blocks(const SkinnyGemmShape& s, const float* x, const float* packed, const float* bias, float* y, int64_t b0,
                int64_t b1) {
  // Row tiles of near-equal size (49 rows: 4 x 6 + 5 x 5; 10: 5 + 5).
  const int64_t n_tiles = (s.m + kMaxTileRows - 1) / kMaxTileRows;
  // Plain Y: rows of n floats, a block's vectors side by side; nChw16c: a pixel's 16 channels, planes of m pixels.
  const int64_t ldy = s.y_blocked16 ? 16 : s.n, ldv = s.y_blocked16 ? 16 * s.m : 16;
  for (int64_t k0 = 0; k0 < s.k; k0 += kChunk) {
    const int64_t k1 = std::min(s.k, k0 + kChunk);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const float* b = packed + blk * s.k * 64;
      const float* b64 = bias ? bias + blk * 64 : nullptr;
      float* yb = y + blk * 4 * ldv;
      // What comes next from memory, its lines shared out over the row tiles: the next block's part of this chunk,
      // or after the last block the first block's part of the next chunk.
      const char* next = nullptr;
      int64_t lines = 0;
      if (blk + 1 < b1) {
        next = reinterpret_cast<const char*>(packed + ((blk + 1) * s.k + k0) * 64);
        lines = (k1 - k0) * 64 / kLineFloats;
      } else if (k1 < s.k) {
        next = reinterpret_cast<const char*>(packed + (b0 * s.k + k1) * 64);
        lines = (std::min(s.k, k1 + kChunk) - k1) * 64 / kLineFloats;
      }
      for (int64_t t = 0; t < n_tiles; ++t) {
        const int64_t m0 = s.m * t / n_tiles;
        const int r = static_cast<int>(s.m * (t + 1) / n_tiles - m0);
        const int64_t l0 = lines * t / n_tiles, l1 = lines * (t + 1) / n_tiles;
        const int64_t every = l1 > l0 ? std::max<int64_t>(1, (k1 - k0) / (l1 - l0)) : 1;
        const bool from_y = k0 > 0 || s.sum;
        kTiles[r - 1](x + m0 * s.k, s.k, b, k0, k1, yb + m0 * ldy, ldy, ldv, from_y, b64, k0 == 0 && s.sum && b64,
                      s.relu && k1 == s.k, s.relu_max, next ? next + l0 * kLineFloats * sizeof(float) : nullptr,
                      l1 - l0, every, static_cast<int>(std::min<int64_t>(64, s.n - blk * 64)));
      }
    }
  }
}

}  // namespace

std::string skinny_gemm_check(const SkinnyGemmShape& s) {
  if (!has_avx512f()) return "no AVX-512";
  if (s.m < 1 || s.m > kSkinnyGemmMaxRows) return "rows outside 1.." + std::to_string(kSkinnyGemmMaxRows);
  if (s.n < 1) return "no columns";
  if (s.y_blocked16 && s.n % 16 != 0) return "nChw16c output with columns not a multiple of 16";
  if (s.k < 1) return "empty inner dimension";
  return "";
}

size_t skinny_gemm_packed_floats(const SkinnyGemmShape& s) { return static_cast<size_t>(s.k * 64 * blocks(s)); }

void skinny_gemm_pack(const SkinnyGemmShape& s, const float* w, bool transposed, float* packed) {
  for (int64_t blk = 0; blk < blocks(s); ++blk)
    for (int64_t k = 0; k < s.k; ++k)
      for (int64_t j = 0; j < 64; ++j) {
        const int64_t col = blk * 64 + j;
        packed[(blk * s.k + k) * 64 + j] = col >= s.n ? 0.f : transposed ? w[col * s.k + k] : w[k * s.n + col];
      }
}

void skinny_gemm_run(const SkinnyGemmShape& s, const float* x, const float* packed, const float* bias, float* y,
                     int team) {
  split_over_team(blocks(s), team, [&](int64_t, int64_t b0, int64_t b1) {
    if (b1 > b0) run_blocks(s, x, packed, bias, y, b0, b1);
  });
}

void skinny_gemm_reference(const SkinnyGemmShape& s, const float* x, const float* w, const float* bias, float* y) {
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double acc = bias ? bias[j] : 0.0;
      for (int64_t k = 0; k < s.k; ++k) acc += static_cast<double>(x[i * s.k + k]) * w[k * s.n + j];
      float& out = s.y_blocked16 ? y[(j / 16) * s.m * 16 + i * 16 + j % 16] : y[i * s.n + j];
      const double v = acc + (s.sum ? out : 0.0);
      out = static_cast<float>(s.relu ? std::min(std::max(v, 0.0), static_cast<double>(s.relu_max)) : v);
    }
}

}  // namespace keel::onednn
