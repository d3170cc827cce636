// plugins/cpu_onednn/steps/wide_gemm.cc — the own product for a wide output over a shallow inner dimension
// (steps/wide_gemm.h).
#include "steps/wide_gemm.h"

#include <immintrin.h>

#include <algorithm>

#include "common/lanes.h"
#include "common/team.h"

namespace keel::onednn {
namespace {

template <int R, bool TA>
__attribute__((target("avx512f"))) inline void wide_tile(const float* a, const float* b, float* y, int64_t M, int64_t K,
                                                         int64_t N, int64_t m0, int64_t n0, float alpha) {
  __mmask16 k4[4];
  for (int v = 0; v < 4; ++v) k4[v] = first_lanes(N - n0 - 16 * v);
  __m512 acc[R][4];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = b + k * N + n0;
    __m512 bv[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) bv[v] = _mm512_maskz_loadu_ps(k4[v], bk + 16 * v);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(TA ? a[k * M + m0 + r] : a[(m0 + r) * K + k]);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
  const __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512 o = alpha == 1.f ? acc[r][v] : _mm512_mul_ps(acc[r][v], al);
      if (k4[v] == 0xFFFF) _mm512_storeu_ps(y + (m0 + r) * N + n0 + 16 * v, o);
      else if (k4[v]) _mm512_mask_storeu_ps(y + (m0 + r) * N + n0 + 16 * v, k4[v], o);
    }
}

template <bool TA>
__attribute__((target("avx512f"))) void wide_columns(const float* a, const float* b, float* y, int64_t M, int64_t K,
                                                     int64_t N, float alpha, int64_t nb0, int64_t nb1) {
  using Tile = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, float);
  static constexpr Tile kTail[6] = {nullptr,          wide_tile<1, TA>, wide_tile<2, TA>,
                                    wide_tile<3, TA>, wide_tile<4, TA>, wide_tile<5, TA>};
  for (int64_t nb = nb0; nb < nb1; ++nb) {
    int64_t m0 = 0;
    for (; m0 + 6 <= M; m0 += 6) wide_tile<6, TA>(a, b, y, M, K, N, m0, nb * 64, alpha);
    if (m0 < M) kTail[M - m0](a, b, y, M, K, N, m0, nb * 64, alpha);
  }
}

}  // namespace

void wide_gemm_f32(const float* a, bool ta, const float* b, float* y, int64_t M, int64_t K, int64_t N, float alpha,
                   int threads) {
  const int64_t blocks = (N + 63) / 64;
  split_over_team(blocks, static_cast<int>(std::min<int64_t>(threads, blocks)), [&](int64_t, int64_t b0, int64_t b1) {
    if (ta) wide_columns<true>(a, b, y, M, K, N, alpha, b0, b1);
    else wide_columns<false>(a, b, y, M, K, N, alpha, b0, b1);
  });
}

}  // namespace keel::onednn
