// plugins/cpu_onednn/steps/gelu.cc — GELU in place (steps/gelu.h).
//
// erf(z) for z = x / sqrt 2 clamped to [-4, 4] (erf(4) is 1 in f32) as z P(z^2) / Q(z^2), the rational minimax
// approximation of degrees 13 / 8 that TensorFlow, XLA and Eigen use for f32 erf (coefficients as published there);
// then 0.5 x + 0.5 x erf(z) in one fused step. 20 vector instructions per 16 floats, one a division (a vrcp14ps and
// a Newton step cost the same here and round less exactly). Lanes below z = -4 are 0 (the formula would leave x times
// the approximation's residual at z = -4 there, growing with |x|), NaN lanes keep x (the clamp would have made them
// numbers).
#include "steps/gelu.h"

#include <immintrin.h>

#include <cmath>

#include "steps/map16.h"
#include "steps/silu.h"

namespace keel::onednn {
namespace {

// GCC 12 warns about its own _mm512_undefined_ps() inside max/min/div (a false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"), always_inline)) inline __m512 gelu16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-4.f), hi = _mm512_set1_ps(4.f);
  const __m512 z = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.707106781186547524f)), lo), hi);
  const __m512 z2 = _mm512_mul_ps(z, z);
  __m512 p = _mm512_fmadd_ps(z2, _mm512_set1_ps(-2.72614225801306e-10f), _mm512_set1_ps(2.77068142495902e-08f));
  p = _mm512_fmadd_ps(z2, p, _mm512_set1_ps(-2.10102402082508e-06f));
  p = _mm512_fmadd_ps(z2, p, _mm512_set1_ps(-5.69250639462346e-05f));
  p = _mm512_fmadd_ps(z2, p, _mm512_set1_ps(-7.34990630326855e-04f));
  p = _mm512_fmadd_ps(z2, p, _mm512_set1_ps(-2.95459980854025e-03f));
  p = _mm512_fmadd_ps(z2, p, _mm512_set1_ps(-1.60960333262415e-02f));
  p = _mm512_mul_ps(z, p);
  __m512 q = _mm512_fmadd_ps(z2, _mm512_set1_ps(-1.45660718464996e-05f), _mm512_set1_ps(-2.13374055278905e-04f));
  q = _mm512_fmadd_ps(z2, q, _mm512_set1_ps(-1.68282697438203e-03f));
  q = _mm512_fmadd_ps(z2, q, _mm512_set1_ps(-7.37332916720468e-03f));
  q = _mm512_fmadd_ps(z2, q, _mm512_set1_ps(-1.42647390514189e-02f));
  const __m512 erf = _mm512_div_ps(p, q);
  const __m512 h = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
  // Lanes kept: x >= -4 sqrt 2 (NaN compares unordered: kept, and restored below).
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-5.65685424949238f), _CMP_NLT_UQ);
  const __m512 y = _mm512_maskz_mov_ps(live, _mm512_fmadd_ps(h, erf, h));
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}
// The tanh approximation: u = sqrt(2/pi) x (1 + 0.044715 x^2) clamped to [-7.90531, 7.90531], tanh(u) as Eigen's
// u P(u^2) / Q(u^2) (f32 coefficients as published there), then 0.5 x + 0.5 x tanh(u). Below u = -7.9 the result is
// 0.5 x (1 + tanh) with tanh within an ulp of -1: at most |x| * 1.2e-7, inside the error bound; -inf lanes are 0 and
// NaN lanes keep x (the clamp would have made them numbers), as gelu16's.
__attribute__((target("avx512f"), always_inline)) inline __m512 gelu_tanh16(__m512 x) {
  const __m512 c = _mm512_set1_ps(7.90531110763549805f), nc = _mm512_set1_ps(-7.90531110763549805f);
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 u = _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.7978845608028654f)),
                           _mm512_fmadd_ps(x2, _mm512_set1_ps(0.044715f), _mm512_set1_ps(1.f)));
  u = _mm512_min_ps(_mm512_max_ps(u, nc), c);
  const __m512 u2 = _mm512_mul_ps(u, u);
  __m512 p = _mm512_fmadd_ps(u2, _mm512_set1_ps(-2.76076847742355e-16f), _mm512_set1_ps(2.00018790482477e-13f));
  p = _mm512_fmadd_ps(u2, p, _mm512_set1_ps(-8.60467152213735e-11f));
  p = _mm512_fmadd_ps(u2, p, _mm512_set1_ps(5.12229709037114e-08f));
  p = _mm512_fmadd_ps(u2, p, _mm512_set1_ps(1.48572235717979e-05f));
  p = _mm512_fmadd_ps(u2, p, _mm512_set1_ps(6.37261928875436e-04f));
  p = _mm512_fmadd_ps(u2, p, _mm512_set1_ps(4.89352455891786e-03f));
  p = _mm512_mul_ps(u, p);
  __m512 q = _mm512_fmadd_ps(u2, _mm512_set1_ps(1.19825839466702e-06f), _mm512_set1_ps(1.18534705686654e-04f));
  q = _mm512_fmadd_ps(u2, q, _mm512_set1_ps(2.26843463243900e-03f));
  q = _mm512_fmadd_ps(u2, q, _mm512_set1_ps(4.89352518554385e-03f));
  const __m512 t = _mm512_div_ps(p, q);
  const __m512 h = _mm512_mul_ps(x, _mm512_set1_ps(0.5f));
  // -inf: h * (1 + t) would be -inf * 0 = NaN; the limit is 0.
  const __mmask16 neg_inf = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
  const __m512 y = _mm512_maskz_mov_ps(static_cast<__mmask16>(~neg_inf), _mm512_fmadd_ps(h, t, h));
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}
#pragma GCC diagnostic pop

__attribute__((target("avx512f"))) void gelu_avx512(float* p, size_t n) { map16_inplace<gelu16>(p, n); }
__attribute__((target("avx512f"))) void gelu_tanh_avx512(float* p, size_t n) { map16_inplace<gelu_tanh16>(p, n); }

}  // namespace

void gelu_inplace(float* p, size_t n) {
  if (has_avx512f()) gelu_avx512(p, n);
  else gelu_inplace_scalar(p, n);
}

void gelu_tanh_inplace(float* p, size_t n) {
  if (has_avx512f()) gelu_tanh_avx512(p, n);
  else gelu_tanh_inplace_scalar(p, n);
}

void gelu_tanh_inplace_scalar(float* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double x = p[i];
    p[i] = static_cast<float>(
        std::isinf(x) && x < 0 ? 0.0 : 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))));
  }
}

void gelu_inplace_scalar(float* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double x = p[i];
    p[i] = static_cast<float>(std::isinf(x) && x < 0 ? 0.0 : 0.5 * x * (1.0 + std::erf(x * 0.707106781186547524)));
  }
}

}  // namespace keel::onednn
