// plugins/cpu_onednn/steps/grouped.cc — 3x3 convolution in groups of 4 channels over nChw16c
// (steps/grouped.h).
//
// One task is an output row of one 16-channel block: its 36 weight vectors (9 taps x 4 input channels) stay in L1.
// Inner tile: R pixels of the row in registers; per tap it loads R source vectors and the tap's 4 weight vectors,
// and per input channel i permutes each source vector in-lane (lane i of each 128-bit lane spread over it) and
// FMAs it with weight vector i. Pixels whose taps leave the image (the row's first and last) take a per-pixel
// path that skips those taps.
#include "steps/grouped.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>

#include "common/team.h"
#include "steps/silu.h"

namespace keel::onednn {
namespace {

std::atomic<bool> g_scalar{false};  // grouped4_force_scalar

// The kernel rows [lo, hi) whose source row lies inside the image for output row o.
void rows_in(const Grouped4Shape& s, int64_t o, int64_t* lo, int64_t* hi) {
  const int64_t i0 = o * s.stride - 1;
  *lo = std::max<int64_t>(0, -i0);
  *hi = std::min<int64_t>(3, s.h - i0);
}

// GCC 12 warns about its own _mm512_undefined_ps() inside max (a false positive; as in steps/silu.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

__attribute__((target("avx512f"))) inline __m512 lane(__m512 x, int i) {
  switch (i) {
    case 0: return _mm512_permute_ps(x, 0x00);
    case 1: return _mm512_permute_ps(x, 0x55);
    case 2: return _mm512_permute_ps(x, 0xAA);
    default: return _mm512_permute_ps(x, 0xFF);
  }
}

// R interior pixels from x0 of output row o (every tap inside the row). SW: the stride.
template <int R, int SW>
__attribute__((target("avx512f"))) void tile_avx512(const float* sb, const float* wb, const float* bias, int64_t w,
                                                    int64_t o, int64_t x0, int64_t klo, int64_t khi, bool relu,
                                                    float* out) {
  __m512 acc[R];
  const __m512 bv = _mm512_loadu_ps(bias);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = bv;
  const float* row = sb + ((o * SW - 1 + klo) * w + x0 * SW - 1) * 16;
  const float* wk = wb + klo * 3 * 64;
  for (int64_t kh = klo; kh < khi; ++kh, row += w * 16, wk += 3 * 64) {
#pragma GCC unroll 3
    for (int kw = 0; kw < 3; ++kw) {
      __m512 wv[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) wv[i] = _mm512_loadu_ps(wk + (kw * 4 + i) * 16);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_loadu_ps(row + (r * SW + kw) * 16);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) acc[r] = _mm512_fmadd_ps(wv[i], lane(x, i), acc[r]);
      }
    }
  }
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + (x0 + r) * 16, relu ? _mm512_max_ps(acc[r], zero) : acc[r]);
}

// One pixel, taps outside the image skipped.
__attribute__((target("avx512f"))) void pixel_avx512(const Grouped4Shape& s, const float* sb, const float* wb,
                                                     const float* bias, int64_t o, int64_t x, int64_t klo, int64_t khi,
                                                     float* out) {
  __m512 acc = _mm512_loadu_ps(bias);
  const int64_t ix0 = x * s.stride - 1;
  for (int64_t kh = klo; kh < khi; ++kh) {
    const float* row = sb + (o * s.stride - 1 + kh) * s.w * 16;
    for (int64_t kw = 0; kw < 3; ++kw) {
      const int64_t ix = ix0 + kw;
      if (ix < 0 || ix >= s.w) continue;
      const __m512 v = _mm512_loadu_ps(row + ix * 16);
      const float* wk = wb + (kh * 3 + kw) * 64;
      for (int i = 0; i < 4; ++i) acc = _mm512_fmadd_ps(_mm512_loadu_ps(wk + i * 16), lane(v, i), acc);
    }
  }
  _mm512_storeu_ps(out + x * 16, s.relu ? _mm512_max_ps(acc, _mm512_setzero_ps()) : acc);
}

#pragma GCC diagnostic pop

constexpr int kTile = 8;

template <int R, int SW>
void tile_tail(const float* sb, const float* wb, const float* bias, int64_t w, int64_t o, int64_t x0, int64_t klo,
               int64_t khi, bool relu, float* out, int64_t left) {
  if constexpr (R > 0) {
    if (left == R) tile_avx512<R, SW>(sb, wb, bias, w, o, x0, klo, khi, relu, out);
    else tile_tail<R - 1, SW>(sb, wb, bias, w, o, x0, klo, khi, relu, out, left);
  }
}

template <int SW>
void row_avx512(const Grouped4Shape& s, const float* sb, const float* wb, const float* bias, int64_t o, float* out) {
  int64_t klo, khi;
  rows_in(s, o, &klo, &khi);
  const int64_t ow = s.ow();
  // Interior pixels [1, xhi): x * SW - 1 >= 0 and x * SW + 1 < w.
  const int64_t xhi = std::max<int64_t>(1, std::min<int64_t>(ow, (s.w - 2) / SW + 1));
  pixel_avx512(s, sb, wb, bias, o, 0, klo, khi, out);
  int64_t x = 1;
  for (; x + kTile <= xhi; x += kTile) tile_avx512<kTile, SW>(sb, wb, bias, s.w, o, x, klo, khi, s.relu, out);
  if (x < xhi) tile_tail<kTile - 1, SW>(sb, wb, bias, s.w, o, x, klo, khi, s.relu, out, xhi - x);
  for (x = xhi; x < ow; ++x) pixel_avx512(s, sb, wb, bias, o, x, klo, khi, out);
}

void row_scalar(const Grouped4Shape& s, const float* sb, const float* wb, const float* bias, int64_t o, float* out) {
  int64_t klo, khi;
  rows_in(s, o, &klo, &khi);
  for (int64_t x = 0; x < s.ow(); ++x) {
    float acc[16];
    for (int j = 0; j < 16; ++j) acc[j] = bias[j];
    for (int64_t kh = klo; kh < khi; ++kh)
      for (int64_t kw = 0; kw < 3; ++kw) {
        const int64_t ix = x * s.stride - 1 + kw;
        if (ix < 0 || ix >= s.w) continue;
        const float* v = sb + ((o * s.stride - 1 + kh) * s.w + ix) * 16;
        const float* wk = wb + (kh * 3 + kw) * 64;
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 16; ++j) acc[j] += wk[i * 16 + j] * v[(j / 4) * 4 + i];
      }
    for (int j = 0; j < 16; ++j) out[x * 16 + j] = s.relu ? std::max(acc[j], 0.f) : acc[j];
  }
}

}  // namespace

void grouped4_force_scalar(bool on) { g_scalar.store(on, std::memory_order_relaxed); }

std::string grouped4_check(const Grouped4Shape& s) {
  if (s.n < 1 || s.blocks < 1 || s.h < 1 || s.w < 1) return "empty source";
  if (s.stride != 1 && s.stride != 2) return "stride other than 1 or 2";
  return "";
}

size_t grouped4_packed_floats(const Grouped4Shape& s) { return static_cast<size_t>(s.blocks * 9 * 4 * 16); }

void grouped4_pack_weights(const Grouped4Shape& s, const float* w, float* packed) {
  for (int64_t m = 0; m < s.blocks * 16; ++m)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t t = 0; t < 9; ++t) packed[(((m / 16) * 9 + t) * 4 + i) * 16 + m % 16] = w[(m * 4 + i) * 9 + t];
}

void grouped4_rows(const Grouped4Shape& s, const float* src, const float* packed, const float* bias, float* dst,
                   int64_t begin, int64_t end) {
  const int64_t oh = s.oh(), ow = s.ow();
  const bool vec = has_avx512f() && !g_scalar.load(std::memory_order_relaxed);
  for (int64_t q = begin; q < end; ++q) {
    // Row-major over the blocks: a thread's range is a band of rows of every block, as the 1x1s around it split.
    const int64_t b = q % s.blocks, o = (q / s.blocks) % oh, ib = q / (s.blocks * oh) * s.blocks + b;
    const float* sb = src + ib * s.h * s.w * 16;
    const float* wb = packed + b * 9 * 64;
    float* out = dst + (ib * oh + o) * ow * 16;
    if (!vec) row_scalar(s, sb, wb, bias + b * 16, o, out);
    else if (s.stride == 1) row_avx512<1>(s, sb, wb, bias + b * 16, o, out);
    else row_avx512<2>(s, sb, wb, bias + b * 16, o, out);
  }
}

void grouped4_run(const Grouped4Shape& s, const float* src, const float* packed, const float* bias, float* dst,
                  int team) {
  split_over_team(s.n * s.blocks * s.oh(), team,
                  [&](int64_t, int64_t begin, int64_t end) { grouped4_rows(s, src, packed, bias, dst, begin, end); });
}

void grouped4_reference(const Grouped4Shape& s, const float* src, const float* w, const float* bias, float* dst) {
  const int64_t oh = s.oh(), ow = s.ow(), C = s.blocks * 16;
  auto at = [&](int64_t img, int64_t c, int64_t y, int64_t x) {
    return src[(((img * s.blocks + c / 16) * s.h + y) * s.w + x) * 16 + c % 16];
  };
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t m = 0; m < C; ++m)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x) {
          double acc = bias[m];
          for (int64_t i = 0; i < 4; ++i)
            for (int64_t a = 0; a < 3; ++a)
              for (int64_t b = 0; b < 3; ++b) {
                const int64_t iy = y * s.stride - 1 + a, ix = x * s.stride - 1 + b;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                acc += static_cast<double>(at(img, (m / 4) * 4 + i, iy, ix)) * w[((m * 4 + i) * 3 + a) * 3 + b];
              }
          float v = static_cast<float>(acc);
          if (s.relu) v = std::max(v, 0.f);
          dst[(((img * s.blocks + m / 16) * oh + y) * ow + x) * 16 + m % 16] = v;
        }
}

}  // namespace keel::onednn
