// plugins/cpu_onednn/steps/silu.cc — SiLU in place (steps/silu.h).
//
// x / (1 + exp(-x)) with exp(-x) = 2^n * exp(-r): x clamped to [-87, 87] (so 2^n stays a normal float and 1 + exp(-x)
// finite), n = round(-x*log2(e)) by the 1.5*2^23 trick (which also leaves n's bits where 2^n is built by an integer
// add and shift), r = x + n*ln(2) in one fused step (ln 2 rounded to f32 costs at most 126 * 2e-9 in r), |r| <=
// ln(2)/2; exp(-r) by oneDNN's degree-5 minimax polynomial: relative error of the whole under 3e-7. 14 vector
// instructions per 16 floats, and their count is what bounds it (1.75 ns per 16 floats, in L1 or not, on the AMD
// EPYC (Zen 5) this was measured on; without the division 1.65): one vdivps is cheaper there than vrcp14ps plus a
// Newton step (2.6 ns), and the integer 2^n cheaper than vrndscaleps/vscalefps (3.0 ns).
// Below x = -87 the result is 0 (the exact value is under 1e-35); NaN stays NaN, +inf gives +inf, -inf gives 0.
#include "steps/silu.h"
#include "steps/map16.h"
#include "steps/silu16.h"

#include <immintrin.h>

#include <cmath>

namespace keel::onednn {
namespace {

__attribute__((target("avx512f"))) void silu_avx512(float* p, size_t n) { map16_inplace<silu16>(p, n); }

__attribute__((target("avx512f"))) void silu_mean16_avx512(float* p, size_t hw, float* mean) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 2 <= hw; i += 2) {
    const __m512 a = silu16(_mm512_loadu_ps(p + 16 * i)), b = silu16(_mm512_loadu_ps(p + 16 * i + 16));
    _mm512_storeu_ps(p + 16 * i, a);
    _mm512_storeu_ps(p + 16 * i + 16, b);
    s0 = _mm512_add_ps(s0, a);
    s1 = _mm512_add_ps(s1, b);
  }
  if (i < hw) {
    const __m512 a = silu16(_mm512_loadu_ps(p + 16 * i));
    _mm512_storeu_ps(p + 16 * i, a);
    s0 = _mm512_add_ps(s0, a);
  }
  _mm512_storeu_ps(mean, _mm512_mul_ps(_mm512_add_ps(s0, s1), _mm512_set1_ps(1.f / static_cast<float>(hw))));
}

}  // namespace

bool has_avx512f() {
  static const bool fast = __builtin_cpu_supports("avx512f");
  return fast;
}

void silu_inplace(float* p, size_t n) {
  if (has_avx512f()) silu_avx512(p, n);
  else silu_inplace_scalar(p, n);
}

void silu_inplace_mean16(float* p, size_t hw, float* mean) {
  if (hw == 0) {
    for (int c = 0; c < 16; ++c) mean[c] = 0.f;
    return;
  }
  if (has_avx512f()) {
    silu_mean16_avx512(p, hw, mean);
    return;
  }
  silu_inplace_scalar(p, hw * 16);
  for (int c = 0; c < 16; ++c) {
    double sum = 0;
    for (size_t i = 0; i < hw; ++i) sum += p[16 * i + c];
    mean[c] = static_cast<float>(sum / static_cast<double>(hw));
  }
}

void silu_inplace_scalar(float* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = p[i] < -87.f ? 0.f : p[i] / (1.f + std::exp(-p[i]));  // as the fast path
}

}  // namespace keel::onednn
