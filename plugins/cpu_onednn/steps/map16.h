// plugins/cpu_onednn/steps/map16.h — (internal) an element-wise function over f32 memory in place, 16 floats at a time
// in AVX-512 registers: the loop of the chains' own activation passes (steps/silu.cc, steps/gelu.cc). Include only
// from files compiled for x86-64; callers check has_avx512f() (steps/silu.h) first.
#pragma once

#include <immintrin.h>

#include <cstddef>

namespace keel::onednn {

// p[i] = F(p[i]) for i < n: two independent chains per iteration, then one, then the tail masked (lanes past n are
// neither read nor written). F is an always_inline function compiled for avx512f (silu16, gelu16), inlined here.
template <__m512 (*F)(__m512)>
__attribute__((target("avx512f"))) inline void map16_inplace(float* p, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(p + i), b = _mm512_loadu_ps(p + i + 16);
    _mm512_storeu_ps(p + i, F(a));
    _mm512_storeu_ps(p + i + 16, F(b));
  }
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(p + i, F(_mm512_loadu_ps(p + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(p + i, m, F(_mm512_maskz_loadu_ps(m, p + i)));
  }
}

}  // namespace keel::onednn
