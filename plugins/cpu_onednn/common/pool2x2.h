// plugins/cpu_onednn/common/pool2x2.h — (internal) the 2x2 / stride-2 windows of two f32 rows as four AVX-512 vectors:
// what the MaxPool forward (kernels/misc.cc) and its gradient (kernels/train.cc) both start from.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "common/lanes.h"

namespace keel::onednn {

// Windows [ow, ow + n) of rows r0 / r1 (n <= 16; lanes past n are neither read nor set): a, b the top-left and
// top-right elements, c, d the bottom ones; k0 / k1 the masks of the row data [2ow, 2ow + 16) / [2ow + 16, 2ow + 32),
// kw the mask of the n windows.
struct Windows2x2 {
  __m512 a, b, c, d;
  __mmask16 k0, k1, kw;
};

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_* placeholders (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"), always_inline)) inline Windows2x2 load_windows_2x2(const float* r0, const float* r1,
                                                                                     int64_t ow, int64_t n) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  Windows2x2 w;
  w.kw = first_lanes(n);
  w.k0 = first_lanes(2 * n);
  w.k1 = first_lanes(2 * n - 16);
  const __m512 x0 = _mm512_maskz_loadu_ps(w.k0, r0 + 2 * ow), x1 = _mm512_maskz_loadu_ps(w.k1, r0 + 2 * ow + 16);
  const __m512 y0 = _mm512_maskz_loadu_ps(w.k0, r1 + 2 * ow), y1 = _mm512_maskz_loadu_ps(w.k1, r1 + 2 * ow + 16);
  w.a = _mm512_permutex2var_ps(x0, even, x1), w.b = _mm512_permutex2var_ps(x0, odd, x1);
  w.c = _mm512_permutex2var_ps(y0, even, y1), w.d = _mm512_permutex2var_ps(y0, odd, y1);
  return w;
}
#pragma GCC diagnostic pop

}  // namespace keel::onednn
