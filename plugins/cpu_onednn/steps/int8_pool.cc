// plugins/cpu_onednn/steps/int8_pool.cc — the own max pooling of channels-last bytes (steps/int8_pool.h).
#include "steps/int8_pool.h"

#include "common/team.h"

// GCC 12 reports its own AVX-512 intrinsics (their _mm512_undefined_* self-initialisation) as "may be used
// uninitialized" once inlined here: a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

#define KEEL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace keel::onednn {
namespace {

// The maximum of the window at `x` (its top-left pixel's bytes; rows `row_step` bytes apart, columns `col_step`) over
// [ky0, ky1) x [kx0, kx1), each pixel's C bytes in 64-byte vectors (the last one masked), stored at y.
template <bool kS8>
KEEL_AVX512 inline void window_max(const uint8_t* x, uint8_t* y, int64_t C, int64_t ky0, int64_t ky1, int64_t kx0,
                                   int64_t kx1, int64_t row_step, int64_t col_step) {
  for (int64_t b = 0; b < C; b += 64) {
    const __mmask64 m = C - b >= 64 ? ~__mmask64{0} : (~__mmask64{0}) >> (64 - (C - b));
    __m512i acc = _mm512_set1_epi8(kS8 ? static_cast<char>(-128) : 0);
    for (int64_t ky = ky0; ky < ky1; ++ky)
      for (int64_t kx = kx0; kx < kx1; ++kx) {
        const __m512i v = _mm512_maskz_loadu_epi8(m, x + ky * row_step + kx * col_step + b);
        if constexpr (kS8) acc = _mm512_max_epi8(acc, v);
        else acc = _mm512_max_epu8(acc, v);
      }
    _mm512_mask_storeu_epi8(y + b, m, acc);
  }
}

// Output rows [begin, end) of the flattened [n, oh] range. The windows that lie inside the image (all but the edges)
// run without bounds checks; the edge windows find their pixels inside the image first.
template <bool kS8>
KEEL_AVX512 void pool_rows(const BytePoolShape& s, const uint8_t* x, uint8_t* y, int64_t begin, int64_t end) {
  const int64_t C = s.c, row_step = s.dh * s.w * C, col_step = s.dw * C;
  // Interior columns: [ox_lo, ox_hi) have x0 >= 0 and their last column inside the image.
  int64_t ox_lo = 0, ox_hi = s.ow;
  while (ox_lo < s.ow && ox_lo * s.sw - s.pl < 0) ++ox_lo;
  while (ox_hi > ox_lo && (ox_hi - 1) * s.sw - s.pl + (s.kw - 1) * s.dw >= s.w) --ox_hi;
  for (int64_t row = begin; row < end; ++row) {
    const int64_t n = row / s.oh, oy = row % s.oh;
    const int64_t y0 = oy * s.sh - s.pt;
    // Window rows inside the image: ky in [ky0, ky1).
    int64_t ky0 = 0, ky1 = s.kh;
    while (ky0 < ky1 && y0 + ky0 * s.dh < 0) ++ky0;
    while (ky1 > ky0 && y0 + (ky1 - 1) * s.dh >= s.h) --ky1;
    // The window's top-left pixel (possibly outside the image: only offsets inside it are read).
    const int64_t top = (n * s.h + y0) * s.w;
    uint8_t* yr = y + row * s.ow * C;
    auto edge = [&](int64_t ox) {
      const int64_t x0 = ox * s.sw - s.pl;
      int64_t kx0 = 0, kx1 = s.kw;
      while (kx0 < kx1 && x0 + kx0 * s.dw < 0) ++kx0;
      while (kx1 > kx0 && x0 + (kx1 - 1) * s.dw >= s.w) --kx1;
      const int64_t first = top + ky0 * s.dh * s.w + x0 + kx0 * s.dw;  // inside the image
      window_max<kS8>(x + first * C, yr + ox * C, C, 0, ky1 - ky0, 0, kx1 - kx0, row_step, col_step);
    };
    for (int64_t ox = 0; ox < ox_lo; ++ox) edge(ox);
    const uint8_t* xr = x + (top + ky0 * s.dh * s.w) * C;
    for (int64_t ox = ox_lo; ox < ox_hi; ++ox)
      window_max<kS8>(xr + (ox * s.sw - s.pl) * C, yr + ox * C, C, 0, ky1 - ky0, 0, s.kw, row_step, col_step);
    for (int64_t ox = std::max(ox_hi, ox_lo); ox < s.ow; ++ox) edge(ox);
  }
}

// Output rows [begin, end) of the flattened [planes, H / 2] range.
template <bool kS8>
KEEL_AVX512 void pool2x2_rows(const uint8_t* x, uint8_t* y, int64_t H, int64_t W, int64_t begin, int64_t end) {
  const int64_t OH = H / 2, OW = W / 2;
  for (int64_t row = begin; row < end; ++row) {
    const int64_t p = row / OH, oy = row % OH;
    const uint8_t* r0 = x + (p * H + 2 * oy) * W;
    const uint8_t* r1 = r0 + W;
    uint8_t* o = y + row * OW;
    for (int64_t ox = 0; ox < OW; ox += 32) {
      const int64_t n = std::min<int64_t>(32, OW - ox);  // windows this step
      const __mmask64 m = n == 32 ? ~__mmask64{0} : (~__mmask64{0}) >> (64 - 2 * n);
      const __m512i a = _mm512_maskz_loadu_epi8(m, r0 + 2 * ox), b = _mm512_maskz_loadu_epi8(m, r1 + 2 * ox);
      __m512i v;
      if constexpr (kS8) v = _mm512_max_epi8(a, b);
      else v = _mm512_max_epu8(a, b);
      // Each 16-bit lane holds one window's two columns: its low byte against its high byte.
      const __m512i hi = _mm512_srli_epi16(v, 8);
      if constexpr (kS8) v = _mm512_max_epi8(v, hi);
      else v = _mm512_max_epu8(v, hi);
      _mm256_mask_storeu_epi8(o + ox, static_cast<__mmask32>(n == 32 ? ~0u : (1u << n) - 1u), _mm512_cvtepi16_epi8(v));
    }
  }
}

}  // namespace

void max_pool2x2_plain_bytes(const void* x, void* y, int64_t planes, int64_t H, int64_t W, bool s8, int threads) {
  const auto* xp = static_cast<const uint8_t*>(x);
  auto* yp = static_cast<uint8_t*>(y);
  const int team = planes * H * W < (int64_t{1} << 18) ? 1 : threads;
  split_over_team(planes * (H / 2), team, [&](int64_t, int64_t b, int64_t e) {
    if (s8) pool2x2_rows<true>(xp, yp, H, W, b, e);
    else pool2x2_rows<false>(xp, yp, H, W, b, e);
  });
}

void max_pool_nhwc_bytes(const BytePoolShape& s, const void* x, void* y, int threads) {
  const auto* xp = static_cast<const uint8_t*>(x);
  auto* yp = static_cast<uint8_t*>(y);
  // A small pooling (batch 1) on the calling thread: its input was just written by the convolution before it.
  const int team = s.n * s.h * s.w * s.c < (int64_t{1} << 18) ? 1 : threads;
  split_over_team(s.n * s.oh, team, [&](int64_t, int64_t b, int64_t e) {
    if (s.s8) pool_rows<true>(s, xp, yp, b, e);
    else pool_rows<false>(s, xp, yp, b, e);
  });
}

}  // namespace keel::onednn
