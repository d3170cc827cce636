// plugins/cpu_onednn/steps/narrow_gemm.cc — Y = X W + bias for few columns (steps/narrow_gemm.h).
#include "steps/narrow_gemm.h"

#include <immintrin.h>

#include <algorithm>

#include "common/lanes.h"
#include "common/team.h"
#include "steps/silu.h"

namespace keel::onednn {
namespace {

int64_t padded_k(const NarrowGemmShape& s) { return (s.k + 15) / 16 * 16; }

// The column groups: ceil(n / 5) groups of sizes as equal as they can be (10 -> 5 + 5, 16 -> 4 + 4 + 4 + 4).
int64_t groups_of(int64_t n) { return (n + 4) / 5; }
int64_t group_begin(int64_t n, int64_t g) { return n * g / groups_of(n); }

// GCC 12 warns about its own _mm512_undefined_ps() inside _mm512_reduce_add_ps (a false positive, as in
// steps/convpool.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// R rows by G columns from row x / column w (packed rows of kp floats): R * G accumulators, R row vectors and a
// column vector within 32 registers; the last 16 values of k masked (the packed columns are zero there, the rows
// must not be read past their end).
template <int R, int G>
__attribute__((target("avx512f"))) void tile_avx512(const float* x, int64_t k, const float* w, int64_t kp,
                                                    const float* bias, float* y, int64_t ldy) {
  __m512 acc[R][G];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 5
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= k; j += 16) {
    __m512 xv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) xv[r] = _mm512_loadu_ps(x + r * k + j);
#pragma GCC unroll 5
    for (int g = 0; g < G; ++g) {
      const __m512 wv = _mm512_loadu_ps(w + g * kp + j);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][g] = _mm512_fmadd_ps(xv[r], wv, acc[r][g]);
    }
  }
  if (j < k) {
    const __mmask16 tail = first_lanes(k - j);
    __m512 xv[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) xv[r] = _mm512_maskz_loadu_ps(tail, x + r * k + j);
#pragma GCC unroll 5
    for (int g = 0; g < G; ++g) {
      const __m512 wv = _mm512_loadu_ps(w + g * kp + j);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][g] = _mm512_fmadd_ps(xv[r], wv, acc[r][g]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 5
    for (int g = 0; g < G; ++g) y[r * ldy + g] = _mm512_reduce_add_ps(acc[r][g]) + (bias ? bias[g] : 0.f);
}

#pragma GCC diagnostic pop

template <int R>
void tile_rows(const float* x, int64_t k, const float* w, int64_t kp, const float* bias, float* y, int64_t ldy,
               int64_t cols) {
  switch (cols) {
    case 5: tile_avx512<R, 5>(x, k, w, kp, bias, y, ldy); break;
    case 4: tile_avx512<R, 4>(x, k, w, kp, bias, y, ldy); break;
    case 3: tile_avx512<R, 3>(x, k, w, kp, bias, y, ldy); break;
    case 2: tile_avx512<R, 2>(x, k, w, kp, bias, y, ldy); break;
    default: tile_avx512<R, 1>(x, k, w, kp, bias, y, ldy); break;
  }
}

void rows_avx512(const NarrowGemmShape& s, const float* x, const float* packed, const float* bias, float* y,
                 int64_t begin, int64_t end) {
  const int64_t kp = padded_k(s), ng = groups_of(s.n);
  for (int64_t i = begin; i < end; i += 4) {
    const int64_t rows = std::min<int64_t>(4, end - i);
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t c0 = group_begin(s.n, g), cols = group_begin(s.n, g + 1) - c0;
      const float* xi = x + i * s.k;
      const float* wg = packed + c0 * kp;
      const float* bg = bias ? bias + c0 : nullptr;
      float* yi = y + i * s.n + c0;
      switch (rows) {
        case 4: tile_rows<4>(xi, s.k, wg, kp, bg, yi, s.n, cols); break;
        case 3: tile_rows<3>(xi, s.k, wg, kp, bg, yi, s.n, cols); break;
        case 2: tile_rows<2>(xi, s.k, wg, kp, bg, yi, s.n, cols); break;
        default: tile_rows<1>(xi, s.k, wg, kp, bg, yi, s.n, cols); break;
      }
    }
  }
}

}  // namespace

size_t narrow_gemm_packed_floats(const NarrowGemmShape& s) { return static_cast<size_t>(s.n * padded_k(s)); }

void narrow_gemm_pack(const NarrowGemmShape& s, const float* w, float* packed) {
  const int64_t kp = padded_k(s);
  std::fill(packed, packed + s.n * kp, 0.f);
  for (int64_t j = 0; j < s.k; ++j)
    for (int64_t c = 0; c < s.n; ++c) packed[c * kp + j] = w[j * s.n + c];
}

void narrow_gemm_rows(const NarrowGemmShape& s, const float* x, const float* packed, const float* bias, float* y,
                      int64_t begin, int64_t end, bool vector) {
  if (vector && has_avx512f()) {
    rows_avx512(s, x, packed, bias, y, begin, end);
    return;
  }
  const int64_t kp = padded_k(s);
  for (int64_t i = begin; i < end; ++i)
    for (int64_t c = 0; c < s.n; ++c) {
      float acc = bias ? bias[c] : 0.f;
      for (int64_t j = 0; j < s.k; ++j) acc += x[i * s.k + j] * packed[c * kp + j];
      y[i * s.n + c] = acc;
    }
}

void narrow_gemm_run(const NarrowGemmShape& s, const float* x, const float* packed, const float* bias, float* y,
                     int team) {
  const int64_t blocks = (s.m + 3) / 4;
  split_over_team(blocks, static_cast<int>(std::min<int64_t>(team, blocks)), [&](int64_t, int64_t b, int64_t e) {
    narrow_gemm_rows(s, x, packed, bias, y, 4 * b, std::min(s.m, 4 * e));
  });
}

void narrow_gemm_reference(const NarrowGemmShape& s, const float* x, const float* w, const float* bias, float* y) {
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t c = 0; c < s.n; ++c) {
      double acc = bias ? bias[c] : 0.0;
      for (int64_t j = 0; j < s.k; ++j) acc += static_cast<double>(x[i * s.k + j]) * w[j * s.n + c];
      y[i * s.n + c] = static_cast<float>(acc);
    }
}

}  // namespace keel::onednn
