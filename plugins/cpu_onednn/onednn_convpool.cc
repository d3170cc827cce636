// plugins/cpu_onednn/onednn_convpool.cc — Conv (few input channels) + Relu + MaxPool in one pass
// (onednn_convpool.h).
//
// A convolution row (all m channels, ow pixels) is computed into a thread's ring of pkh rows, laid out
// [m/16][ow][16]; a pooled row is the maximum over its window's rows (clipped), then over each window's columns.
// Rows shared by consecutive pooled rows (stride < kernel) stay in the ring. The convolution's inner tile holds NB
// 16-channel blocks by R pixels in registers (NB * R accumulators): per kernel tap it loads NB weight vectors and
// broadcasts R source values, so it does NB * R FMAs per NB + R loads. Border pixels (whose taps leave the image
// horizontally) take a per-pixel path that skips those taps; rows take only their valid kernel rows.
#include "onednn_convpool.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "onednn_silu.h"
#include "onednn_team.h"

namespace keel::onednn {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// The valid kernel rows [lo, hi) for convolution output row oh.
void kernel_rows(const ConvPoolShape& s, int64_t oh, int64_t* lo, int64_t* hi) {
  const int64_t ih0 = oh * s.sh - s.pt;
  *lo = std::max<int64_t>(0, -ih0);
  *hi = std::min<int64_t>(s.kh, s.h - ih0);
}

// ---------------------------------------------------------------------------------------------------- AVX-512

// GCC 12 warns about its own _mm512_undefined_ps() inside max (a false positive; as in onednn_silu.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// SW: the horizontal stride when 1 or 2 (constant offsets between the R pixels' sources), 0: s.sw. KW: the kernel
// width when 3 (the taps' loop unrolled), 0: s.kw.
template <int NB, int R, int SW, int KW>
__attribute__((target("avx512f"))) void tile_avx512(const ConvPoolShape& s, const float* img, const float* wob,
                                                    const float* bias, int64_t oh, int64_t ow0, int64_t klo,
                                                    int64_t khi, float* row) {
  const int64_t bstride = s.c * s.kh * s.kw * 16;
  __m512 acc[NB][R];
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
    const __m512 bv = _mm512_loadu_ps(bias + 16 * b);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) acc[b][r] = bv;
  }
  const int64_t ih0 = oh * s.sh - s.pt, iw0 = ow0 * s.sw - s.pl, sw = SW ? SW : s.sw;
  for (int64_t c = 0; c < s.c; ++c)
    for (int64_t kh = klo; kh < khi; ++kh) {
      const float* in = img + (c * s.h + ih0 + kh) * s.w + iw0;
      const float* wk = wob + (c * s.kh + kh) * s.kw * 16;
      const int64_t nkw = KW ? KW : s.kw;
#pragma GCC unroll 3
      for (int64_t kw = 0; kw < nkw; ++kw) {
        __m512 wv[NB];
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) wv[b] = _mm512_loadu_ps(wk + b * bstride + kw * 16);
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
          const __m512 x = _mm512_set1_ps(in[r * sw + kw]);
#pragma GCC unroll 4
          for (int b = 0; b < NB; ++b) acc[b][r] = _mm512_fmadd_ps(wv[b], x, acc[b][r]);
          asm volatile("" ::: "memory");  // keeps each broadcast next to its FMAs: hoisted, they spill registers
        }
      }
    }
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b)
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r)
      _mm512_storeu_ps(row + (b * s.ow + ow0 + r) * 16, s.relu ? _mm512_max_ps(acc[b][r], zero) : acc[b][r]);
}

// One pixel whose taps may leave the image horizontally (they are skipped).
template <int NB>
__attribute__((target("avx512f"))) void edge_avx512(const ConvPoolShape& s, const float* img, const float* wob,
                                                    const float* bias, int64_t oh, int64_t ow, int64_t klo,
                                                    int64_t khi, float* row) {
  const int64_t bstride = s.c * s.kh * s.kw * 16;
  __m512 acc[NB];
  for (int b = 0; b < NB; ++b) acc[b] = _mm512_loadu_ps(bias + 16 * b);
  const int64_t ih0 = oh * s.sh - s.pt, iw0 = ow * s.sw - s.pl;
  const int64_t kwlo = std::max<int64_t>(0, -iw0), kwhi = std::min<int64_t>(s.kw, s.w - iw0);
  for (int64_t c = 0; c < s.c; ++c)
    for (int64_t kh = klo; kh < khi; ++kh) {
      const float* in = img + (c * s.h + ih0 + kh) * s.w + iw0;
      const float* wk = wob + (c * s.kh + kh) * s.kw * 16;
      for (int64_t kw = kwlo; kw < kwhi; ++kw) {
        const __m512 x = _mm512_set1_ps(in[kw]);
        for (int b = 0; b < NB; ++b) acc[b] = _mm512_fmadd_ps(_mm512_loadu_ps(wk + b * bstride + kw * 16), x, acc[b]);
      }
    }
  for (int b = 0; b < NB; ++b)
    _mm512_storeu_ps(row + (b * s.ow + ow) * 16, s.relu ? _mm512_max_ps(acc[b], _mm512_setzero_ps()) : acc[b]);
}

// Pixels per tile for NB blocks: NB * R accumulators, NB weights and a broadcast within 32 registers.
template <int NB>
constexpr int kTile = NB == 4 ? 6 : NB == 3 ? 8 : 12;

template <int NB, int R, int SW, int KW>
void tile_tail(const ConvPoolShape& s, const float* img, const float* wob, const float* bias, int64_t oh, int64_t ow0,
               int64_t klo, int64_t khi, float* row, int64_t left) {
  if constexpr (R > 0) {
    if (left == R) tile_avx512<NB, R, SW, KW>(s, img, wob, bias, oh, ow0, klo, khi, row);
    else tile_tail<NB, R - 1, SW, KW>(s, img, wob, bias, oh, ow0, klo, khi, row, left);
  }
}

template <int NB, int SW, int KW>
void blocks_avx512(const ConvPoolShape& s, const float* img, const float* wob, const float* bias, int64_t oh,
                   int64_t klo, int64_t khi, int64_t ow_lo, int64_t ow_hi, float* row) {
  constexpr int R = kTile<NB>;
  for (int64_t x = 0; x < ow_lo; ++x) edge_avx512<NB>(s, img, wob, bias, oh, x, klo, khi, row);
  int64_t x = ow_lo;
  for (; x + R <= ow_hi; x += R) tile_avx512<NB, R, SW, KW>(s, img, wob, bias, oh, x, klo, khi, row);
  if (x < ow_hi) tile_tail<NB, R - 1, SW, KW>(s, img, wob, bias, oh, x, klo, khi, row, ow_hi - x);
  for (x = ow_hi; x < s.ow; ++x) edge_avx512<NB>(s, img, wob, bias, oh, x, klo, khi, row);
}

template <int NB>
void blocks_avx512(const ConvPoolShape& s, const float* img, const float* wob, const float* bias, int64_t oh,
                   int64_t klo, int64_t khi, int64_t ow_lo, int64_t ow_hi, float* row) {
  const bool k3 = s.kw == 3;
  if (s.sw == 1 && k3) blocks_avx512<NB, 1, 3>(s, img, wob, bias, oh, klo, khi, ow_lo, ow_hi, row);
  else if (s.sw == 1) blocks_avx512<NB, 1, 0>(s, img, wob, bias, oh, klo, khi, ow_lo, ow_hi, row);
  else if (s.sw == 2 && k3) blocks_avx512<NB, 2, 3>(s, img, wob, bias, oh, klo, khi, ow_lo, ow_hi, row);
  else if (s.sw == 2) blocks_avx512<NB, 2, 0>(s, img, wob, bias, oh, klo, khi, ow_lo, ow_hi, row);
  else blocks_avx512<NB, 0, 0>(s, img, wob, bias, oh, klo, khi, ow_lo, ow_hi, row);
}

__attribute__((target("avx512f"))) void pool_row_avx512(const ConvPoolShape& s, const float* const* rows, int nrows,
                                                        float* tmp, float* out, int64_t out_block_stride) {
  const int64_t mb = s.m / 16;
  for (int64_t b = 0; b < mb; ++b) {
    for (int64_t x = 0; x < s.ow; ++x) {
      __m512 v = _mm512_loadu_ps(rows[0] + (b * s.ow + x) * 16);
      for (int k = 1; k < nrows; ++k) v = _mm512_max_ps(v, _mm512_loadu_ps(rows[k] + (b * s.ow + x) * 16));
      _mm512_storeu_ps(tmp + x * 16, v);
    }
    float* o = out + b * out_block_stride;
    for (int64_t p = 0; p < s.pw; ++p) {
      const int64_t x0 = std::max<int64_t>(0, p * s.psw - s.ppl), x1 = std::min<int64_t>(s.ow, p * s.psw - s.ppl + s.pkw);
      __m512 v = _mm512_loadu_ps(tmp + x0 * 16);
      for (int64_t x = x0 + 1; x < x1; ++x) v = _mm512_max_ps(v, _mm512_loadu_ps(tmp + x * 16));
      _mm512_storeu_ps(o + p * 16, v);
    }
  }
}

#pragma GCC diagnostic pop

// ----------------------------------------------------------------------------------------------------- scalar

void conv_row_scalar(const ConvPoolShape& s, const float* img, const float* packed, const float* bias, int64_t oh,
                     float* row) {
  int64_t klo, khi;
  kernel_rows(s, oh, &klo, &khi);
  const int64_t mb = s.m / 16, bstride = s.c * s.kh * s.kw * 16;
  for (int64_t b = 0; b < mb; ++b)
    for (int64_t x = 0; x < s.ow; ++x) {
      float acc[16];
      for (int j = 0; j < 16; ++j) acc[j] = bias[b * 16 + j];
      const int64_t ih0 = oh * s.sh - s.pt, iw0 = x * s.sw - s.pl;
      for (int64_t c = 0; c < s.c; ++c)
        for (int64_t kh = klo; kh < khi; ++kh)
          for (int64_t kw = 0; kw < s.kw; ++kw) {
            const int64_t iw = iw0 + kw;
            if (iw < 0 || iw >= s.w) continue;
            const float v = img[(c * s.h + ih0 + kh) * s.w + iw];
            const float* wk = packed + b * bstride + ((c * s.kh + kh) * s.kw + kw) * 16;
            for (int j = 0; j < 16; ++j) acc[j] += wk[j] * v;
          }
      for (int j = 0; j < 16; ++j) row[(b * s.ow + x) * 16 + j] = s.relu ? std::max(acc[j], 0.f) : acc[j];
    }
}

void conv_row(const ConvPoolShape& s, const float* img, const float* packed, const float* bias, int64_t oh,
              float* row) {
  if (!has_avx512f()) {
    conv_row_scalar(s, img, packed, bias, oh, row);
    return;
  }
  int64_t klo, khi;
  kernel_rows(s, oh, &klo, &khi);
  // Pixels whose taps all lie inside the row: [ow_lo, ow_hi).
  const int64_t ow_lo = std::min(s.ow, ceil_div(s.pl, s.sw));
  const int64_t ow_hi = std::max(ow_lo, std::min(s.ow, s.w - s.kw + s.pl >= 0 ? (s.w - s.kw + s.pl) / s.sw + 1 : 0));
  const int64_t mb = s.m / 16, bstride = s.c * s.kh * s.kw * 16;
  for (int64_t b = 0; b < mb; b += 4) {
    const float* wob = packed + b * bstride;
    const float* bb = bias + b * 16;
    float* rb = row + b * s.ow * 16;
    switch (std::min<int64_t>(4, mb - b)) {
      case 4: blocks_avx512<4>(s, img, wob, bb, oh, klo, khi, ow_lo, ow_hi, rb); break;
      case 3: blocks_avx512<3>(s, img, wob, bb, oh, klo, khi, ow_lo, ow_hi, rb); break;
      case 2: blocks_avx512<2>(s, img, wob, bb, oh, klo, khi, ow_lo, ow_hi, rb); break;
      default: blocks_avx512<1>(s, img, wob, bb, oh, klo, khi, ow_lo, ow_hi, rb); break;
    }
  }
}

void pool_row(const ConvPoolShape& s, const float* const* rows, int nrows, float* tmp, float* out,
              int64_t out_block_stride) {
  if (has_avx512f()) {
    pool_row_avx512(s, rows, nrows, tmp, out, out_block_stride);
    return;
  }
  const int64_t mb = s.m / 16;
  for (int64_t b = 0; b < mb; ++b) {
    for (int64_t x = 0; x < s.ow * 16; ++x) {
      float v = rows[0][b * s.ow * 16 + x];
      for (int k = 1; k < nrows; ++k) v = std::max(v, rows[k][b * s.ow * 16 + x]);
      tmp[x] = v;
    }
    for (int64_t p = 0; p < s.pw; ++p) {
      const int64_t x0 = std::max<int64_t>(0, p * s.psw - s.ppl), x1 = std::min<int64_t>(s.ow, p * s.psw - s.ppl + s.pkw);
      for (int j = 0; j < 16; ++j) {
        float v = tmp[x0 * 16 + j];
        for (int64_t x = x0 + 1; x < x1; ++x) v = std::max(v, tmp[x * 16 + j]);
        out[b * out_block_stride + p * 16 + j] = v;
      }
    }
  }
}

constexpr int64_t kMaxPoolRows = 16;  // the ring's slots are tracked in a fixed array

}  // namespace

std::string conv_pool_check(const ConvPoolShape& s) {
  if (s.n < 1 || s.c < 1 || s.h < 1 || s.w < 1) return "empty source";
  if (s.m < 16 || s.m % 16 != 0) return "output channels not a multiple of 16";
  if (s.kh < 1 || s.kw < 1 || s.sh < 1 || s.sw < 1 || s.pt < 0 || s.pl < 0) return "convolution geometry";
  if (s.oh < 1 || s.ow < 1) return "convolution output size";
  if (s.pkh < 1 || s.pkw < 1 || s.psh < 1 || s.psw < 1 || s.ppt < 0 || s.ppl < 0 || s.ppt >= s.pkh ||
      s.ppl >= s.pkw || s.pkh > kMaxPoolRows)
    return "pooling geometry";
  if (s.ph < 1 || s.pw < 1 || (s.ph - 1) * s.psh - s.ppt >= s.oh || (s.pw - 1) * s.psw - s.ppl >= s.ow)
    return "pooling output size";
  return "";
}

size_t conv_pool_scratch_floats(const ConvPoolShape& s) {
  return static_cast<size_t>((s.pkh * s.m + 16) * s.ow);
}

size_t conv_pool_packed_floats(const ConvPoolShape& s) { return static_cast<size_t>(s.m * s.c * s.kh * s.kw); }

void conv_pool_pack_weights(const ConvPoolShape& s, const float* w, float* packed) {
  const int64_t per = s.c * s.kh * s.kw;  // taps per output channel
  for (int64_t o = 0; o < s.m; ++o)
    for (int64_t t = 0; t < per; ++t) packed[((o / 16) * per + t) * 16 + o % 16] = w[o * per + t];
}

void conv_pool_rows(const ConvPoolShape& s, const float* src, const float* packed, const float* bias, float* dst,
                    int64_t begin, int64_t end, float* scratch) {
  const int64_t row_floats = s.m * s.ow;
  float* tmp = scratch + s.pkh * row_floats;
  int64_t held[kMaxPoolRows];  // the (image, convolution row) each ring slot holds, -1: none
  std::fill(held, held + kMaxPoolRows, int64_t{-1});
  const float* rows[kMaxPoolRows];
  for (int64_t q = begin; q < end; ++q) {
    const int64_t img = q / s.ph, p = q % s.ph;
    const float* in = src + img * s.c * s.h * s.w;
    const int64_t r0 = std::max<int64_t>(0, p * s.psh - s.ppt), r1 = std::min(s.oh, p * s.psh - s.ppt + s.pkh);
    int nrows = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t slot = r % s.pkh, key = img * s.oh + r;
      float* ring = scratch + slot * row_floats;
      if (held[slot] != key) {
        conv_row(s, in, packed, bias, r, ring);
        held[slot] = key;
      }
      rows[nrows++] = ring;
    }
    const int64_t mb = s.m / 16;
    pool_row(s, rows, nrows, tmp, dst + (img * mb * s.ph + p) * s.pw * 16, s.ph * s.pw * 16);
  }
}

void conv_pool_run(const ConvPoolShape& s, const float* src, const float* packed, const float* bias, float* dst,
                   float* scratch, int team) {
  const size_t per = conv_pool_scratch_floats(s);
  split_over_team(s.n * s.ph, team, [&](int64_t t, int64_t begin, int64_t end) {
    conv_pool_rows(s, src, packed, bias, dst, begin, end, scratch + static_cast<size_t>(t) * per);
  });
}

void conv_pool_reference(const ConvPoolShape& s, const float* src, const float* w, const float* bias, float* dst) {
  const int64_t mb = s.m / 16;
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t o = 0; o < s.m; ++o)
      for (int64_t p = 0; p < s.ph; ++p)
        for (int64_t q = 0; q < s.pw; ++q) {
          float best = 0.f;
          bool any = false;
          for (int64_t i = 0; i < s.pkh; ++i)
            for (int64_t j = 0; j < s.pkw; ++j) {
              const int64_t y = p * s.psh - s.ppt + i, x = q * s.psw - s.ppl + j;
              if (y < 0 || y >= s.oh || x < 0 || x >= s.ow) continue;
              double acc = bias[o];
              for (int64_t c = 0; c < s.c; ++c)
                for (int64_t a = 0; a < s.kh; ++a)
                  for (int64_t b = 0; b < s.kw; ++b) {
                    const int64_t iy = y * s.sh - s.pt + a, ix = x * s.sw - s.pl + b;
                    if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                    acc += static_cast<double>(src[((img * s.c + c) * s.h + iy) * s.w + ix]) *
                           w[((o * s.c + c) * s.kh + a) * s.kw + b];
                  }
              float v = static_cast<float>(acc);
              if (s.relu) v = std::max(v, 0.f);
              best = any ? std::max(best, v) : v;
              any = true;
            }
          dst[(((img * mb + o / 16) * s.ph + p) * s.pw + q) * 16 + o % 16] = best;
        }
}

}  // namespace keel::onednn
