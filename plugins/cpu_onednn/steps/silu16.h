// plugins/cpu_onednn/steps/silu16.h — (internal) SiLU and Sigmoid of 16 floats in AVX-512 registers over one
// exp(-x) (one_plus_exp_neg16): the inner function of steps/silu.cc's pass, shared with the chains' other own
// kernels that apply them on the way (steps/dwsilu.cc, steps/se.cc). The method and its accuracy: steps/silu.cc's
// header comment. Include only from files compiled for x86-64; the functions carry their own target attribute, so
// callers must check has_avx512f() (steps/silu.h) first.
#pragma once

#include <immintrin.h>

namespace keel::onednn {

// GCC 12 warns about its own _mm512_undefined_ps() inside max/min/div (a false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// 1 + exp(-x) for x clamped to [-87, 87] (the caller masks the lanes below -87): exp(-r) = 1 - p1 r + p2 r^2 - ...,
// oneDNN's minimax coefficients for exp with the odd ones negated, times 2^n.
__attribute__((target("avx512f"), always_inline)) inline __m512 one_plus_exp_neg16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.f), hi = _mm512_set1_ps(87.f), nl2e = _mm512_set1_ps(-1.44269504088896f);
  const __m512 magic = _mm512_set1_ps(12582912.f);  // 1.5 * 2^23
  const __m512 ln2 = _mm512_set1_ps(0.693147180559945f);
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 p1 = _mm512_set1_ps(-0.999999701f), p2 = _mm512_set1_ps(0.499991506f),
               p3 = _mm512_set1_ps(-0.166676521f), p4 = _mm512_set1_ps(0.0418978221f),
               p5 = _mm512_set1_ps(-0.00828929059f);
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 z = _mm512_fmadd_ps(xc, nl2e, magic);  // 1.5 * 2^23 + n, n = round(-x * log2(e))
  const __m512 n = _mm512_sub_ps(z, magic);
  const __m512 r = _mm512_fmadd_ps(n, ln2, xc);
  __m512 q = _mm512_fmadd_ps(p5, r, p4);
  q = _mm512_fmadd_ps(q, r, p3);
  q = _mm512_fmadd_ps(q, r, p2);
  q = _mm512_fmadd_ps(q, r, p1);
  q = _mm512_fmadd_ps(q, r, one);
  // 2^n: n + 127 shifted into the exponent field (the integer part of z's bits above them shifts out).
  const __m512 pow2n =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(z), _mm512_set1_epi32(127)), 23));
  return _mm512_fmadd_ps(q, pow2n, one);
}

// x / (1 + exp(-x)), 0 below -87 (NaN kept).
__attribute__((target("avx512f"), always_inline)) inline __m512 silu16(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_NLT_UQ);
  return _mm512_maskz_div_ps(live, x, one_plus_exp_neg16(x));
}

// 1 / (1 + exp(-x)) by silu16's method (the same exp, the division's numerator 1): relative error under 3e-7; 0
// below x = -87 (the exact value is under 2e-38), NaN kept.
__attribute__((target("avx512f"), always_inline)) inline __m512 sigmoid16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_NLT_UQ);
  // NaN x: the mask keeps the lane, and 1 / (NaN) is NaN.
  const __m512 num = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), one, x);
  return _mm512_maskz_div_ps(live, num, one_plus_exp_neg16(x));
}
#pragma GCC diagnostic pop

}  // namespace keel::onednn
