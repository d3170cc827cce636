// plugins/cpu_onednn/steps/convpool.cc — Conv (few input channels) + Relu + MaxPool in one pass
// (steps/convpool.h).
//
// A convolution row (all m channels, ow pixels) is computed into a thread's ring of pkh rows, laid out
// [m/16][ow][16]; a pooled row is the maximum over its window's rows (clipped), then over each window's columns.
// Rows shared by consecutive pooled rows (stride < kernel) stay in the ring. The convolution's inner tile holds NB
// 16-channel blocks by R pixels in registers (NB * R accumulators): per kernel tap it loads NB weight vectors and
// broadcasts R source values, so it does NB * R FMAs per NB + R loads. Rows whose taps leave the image horizontally
// are computed over a copy of their source band with its padding; rows take only their valid kernel rows.
// The common 2x2 stride-2 pooling (LeNet's, VGG's, the peers' simple_cnn) skips the ring's second row and the pooling
// pass: the tile of the window's lower row takes the maximum with the upper row's, then of each pair of pixels, in
// registers, and stores the pooled pixels.
#include "steps/convpool.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>

#include "common/team.h"
#include "steps/silu.h"

namespace keel::onednn {
namespace {

std::atomic<bool> g_scalar{false};  // conv_pool_force_scalar

// The valid kernel rows [lo, hi) for convolution output row oh.
void kernel_rows(const ConvPoolShape& s, int64_t oh, int64_t* lo, int64_t* hi) {
  const int64_t ih0 = oh * s.sh - s.pt;
  *lo = std::max<int64_t>(0, -ih0);
  *hi = std::min<int64_t>(s.kh, s.h - ih0);
}

// ---------------------------------------------------------------------------------------------------- AVX-512

// GCC 12 warns about its own _mm512_undefined_ps() inside max (a false positive; as in steps/silu.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// SW: the horizontal stride when 1 or 2 (constant offsets between the R pixels' sources), 0: s.sw. KW: the kernel
// width when 3 (the taps' loop unrolled), 0: s.kw.
// `pooled` null: the tile's pixels go to `row` ([NB][ow][16] from block 0 of the group). Else (2x2 stride-2
// pooling) `row` holds the window's upper convolution row, already computed: each pixel takes the maximum with it,
// each pair of pixels (ow0 is even) is pooled into `pooled` (nChw16c: block b at b * pooled_stride, pixel
// (ow0 + r) / 2); an odd last pixel belongs to no window (floor pooling) and is dropped. With `arg` (laid out as
// `pooled`, one byte a value) each window's position of its first maximum in scan order (0 1 / 2 3) goes there too,
// and the maximum is chosen by comparisons that skip NaN as steps/pool_arg.h's pooling does.
template <int NB, int R, int SW, int KW>
__attribute__((target("avx512f"))) void tile_avx512(const ConvPoolShape& s, const float* img, const float* wob,
                                                    const float* bias, int64_t oh, int64_t ow0, int64_t klo,
                                                    int64_t khi, float* row, float* pooled, int64_t pooled_stride,
                                                    uint8_t* arg) {
  // Geometry in locals: the barrier below makes the compiler reload whatever lives in memory (s's fields).
  const int64_t nc = s.c, nkh = s.kh, nkw = KW ? KW : s.kw, ih = s.h, iw = s.w, sw = SW ? SW : s.sw;
  __m512 acc[NB][R];
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
    const __m512 bv = _mm512_loadu_ps(bias + 16 * b);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) acc[b][r] = bv;
  }
  const int64_t ih0 = oh * s.sh - s.pt, iw0 = ow0 * sw - s.pl;
  for (int64_t c = 0; c < nc; ++c) {
    const float* in = img + (c * ih + ih0 + klo) * iw + iw0;
    const float* wk = wob + (c * nkh + klo) * nkw * NB * 16;
    for (int64_t kh = klo; kh < khi; ++kh, in += iw, wk += nkw * NB * 16) {
#pragma GCC unroll 7
      for (int64_t kw = 0; kw < nkw; ++kw) {
        __m512 wv[NB];
#pragma GCC unroll 4
        for (int b = 0; b < NB; ++b) wv[b] = _mm512_loadu_ps(wk + (kw * NB + b) * 16);
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
          const __m512 x = _mm512_set1_ps(in[r * sw + kw]);
#pragma GCC unroll 4
          for (int b = 0; b < NB; ++b) acc[b][r] = _mm512_fmadd_ps(wv[b], x, acc[b][r]);
          asm volatile("" ::: "memory");  // keeps each broadcast next to its FMAs: hoisted, they spill registers
        }
      }
    }
  }
  const __m512 zero = _mm512_setzero_ps();
  if (pooled) {
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) {
      const float* up = row + (b * s.ow + ow0) * 16;
      float* out = pooled + b * pooled_stride + ow0 / 2 * 16;
      if (arg) {
        uint8_t* at = arg + b * pooled_stride + ow0 / 2 * 16;
        const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2), three = _mm512_set1_epi32(3);
#pragma GCC unroll 6
        for (int r = 0; r + 1 < R; r += 2) {
          const __m512 u0 = _mm512_loadu_ps(up + r * 16), u1 = _mm512_loadu_ps(up + (r + 1) * 16);
          const __m512 l0 = s.relu ? _mm512_max_ps(acc[b][r], zero) : acc[b][r];
          const __m512 l1 = s.relu ? _mm512_max_ps(acc[b][r + 1], zero) : acc[b][r + 1];
          // As a scan in order 0, 1, 2, 3 taking a value only when greater (never NaN, never after a NaN first).
          const __mmask16 mu = _mm512_cmp_ps_mask(u1, u0, _CMP_GT_OQ);
          const __mmask16 ml = _mm512_cmp_ps_mask(l1, l0, _CMP_GT_OQ) | _mm512_cmp_ps_mask(l0, l0, _CMP_UNORD_Q);
          const __m512 vu = _mm512_mask_mov_ps(u0, mu, u1), vl = _mm512_mask_mov_ps(l0, ml, l1);
          const __mmask16 m = _mm512_cmp_ps_mask(vl, vu, _CMP_GT_OQ);
          _mm512_storeu_ps(out + r / 2 * 16, _mm512_mask_mov_ps(vu, m, vl));
          const __m512i iu = _mm512_maskz_mov_epi32(mu, one), il = _mm512_mask_mov_epi32(two, ml, three);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(at + r / 2 * 16),
                           _mm512_cvtepi32_epi8(_mm512_mask_mov_epi32(iu, m, il)));
        }
        continue;
      }
#pragma GCC unroll 6
      for (int r = 0; r + 1 < R; r += 2) {
        __m512 v = _mm512_max_ps(acc[b][r], acc[b][r + 1]);
        v = _mm512_max_ps(v, _mm512_max_ps(_mm512_loadu_ps(up + r * 16), _mm512_loadu_ps(up + (r + 1) * 16)));
        _mm512_storeu_ps(out + r / 2 * 16, s.relu ? _mm512_max_ps(v, zero) : v);
      }
    }
    return;
  }
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b)
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r)
      _mm512_storeu_ps(row + (b * s.ow + ow0 + r) * 16, s.relu ? _mm512_max_ps(acc[b][r], zero) : acc[b][r]);
}

// Pixels per tile for NB blocks: NB * R accumulators, NB weights and a broadcast within 32 registers.
template <int NB>
constexpr int kTile = NB == 4   ? 6
                      : NB == 3 ? 8
                                : 12;

template <int NB, int R, int SW, int KW>
void tile_tail(const ConvPoolShape& s, const float* img, const float* wob, const float* bias, int64_t oh, int64_t ow0,
               int64_t klo, int64_t khi, float* row, float* pooled, int64_t pooled_stride, uint8_t* arg, int64_t left) {
  if constexpr (R > 0) {
    if (left == R) tile_avx512<NB, R, SW, KW>(s, img, wob, bias, oh, ow0, klo, khi, row, pooled, pooled_stride, arg);
    else tile_tail<NB, R - 1, SW, KW>(s, img, wob, bias, oh, ow0, klo, khi, row, pooled, pooled_stride, arg, left);
  }
}

// One convolution row's pixels [0, ow) for the group's NB blocks, in tiles of kTile<NB> (even: pooled pairs never
// straddle two tiles).
template <int NB, int SW, int KW>
void blocks_avx512(const ConvPoolShape& s, const float* img, const float* wob, const float* bias, int64_t oh,
                   int64_t klo, int64_t khi, float* row, float* pooled, int64_t pooled_stride, uint8_t* arg,
                   int64_t ow) {
  constexpr int R = kTile<NB>;
  static_assert(R % 2 == 0);
  int64_t x = 0;
  for (; x + R <= ow; x += R)
    tile_avx512<NB, R, SW, KW>(s, img, wob, bias, oh, x, klo, khi, row, pooled, pooled_stride, arg);
  if (x < ow) tile_tail<NB, R - 1, SW, KW>(s, img, wob, bias, oh, x, klo, khi, row, pooled, pooled_stride, arg, ow - x);
}

template <int NB>
void blocks_avx512(const ConvPoolShape& s, const float* img, const float* wob, const float* bias, int64_t oh,
                   int64_t klo, int64_t khi, float* row, float* pooled, int64_t pooled_stride, uint8_t* arg,
                   int64_t ow) {
  const bool k3 = s.kw == 3;
  auto run = [&](auto sw, auto kw) {
    blocks_avx512<NB, decltype(sw)::value, decltype(kw)::value>(s, img, wob, bias, oh, klo, khi, row, pooled,
                                                                pooled_stride, arg, ow);
  };
  using C0 = std::integral_constant<int, 0>;
  using C1 = std::integral_constant<int, 1>;
  using C2 = std::integral_constant<int, 2>;
  if (s.sw == 1 && k3) run(C1{}, std::integral_constant<int, 3>{});
  else if (s.sw == 1) run(C1{}, C0{});
  else if (s.sw == 2 && k3) run(C2{}, std::integral_constant<int, 3>{});
  else if (s.sw == 2 && s.kw == 7) run(C2{}, std::integral_constant<int, 7>{});
  else if (s.sw == 2) run(C2{}, C0{});
  else run(C0{}, C0{});
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
      const int64_t x0 = std::max<int64_t>(0, p * s.psw - s.ppl),
                    x1 = std::min<int64_t>(s.ow, p * s.psw - s.ppl + s.pkw);
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
  const int64_t mb = s.m / 16, per = s.c * s.kh * s.kw;
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
            const int64_t g = b / 4, nbg = std::min<int64_t>(4, mb - 4 * g);  // as conv_pool_pack_weights
            const float* wk = packed + (g * 4 * per + ((c * s.kh + kh) * s.kw + kw) * nbg + b % 4) * 16;
            for (int j = 0; j < 16; ++j) acc[j] += wk[j] * v;
          }
      for (int j = 0; j < 16; ++j) row[(b * s.ow + x) * 16 + j] = s.relu ? std::max(acc[j], 0.f) : acc[j];
    }
}

// The padded source row band of one convolution row: per channel, kh rows of (ow - 1) * sw + kw columns.
int64_t padded_band_floats(const ConvPoolShape& s) { return s.c * s.kh * ((s.ow - 1) * s.sw + s.kw); }

bool avx512_path() { return has_avx512f() && !g_scalar.load(std::memory_order_relaxed); }

// Convolution row oh into `row` ([m/16][ow][16]). `band`: padded_band_floats(s) floats of scratch, used when taps leave
// the image horizontally. With `pooled` (AVX-512 only; 2x2 stride-2 pooling, see tile_avx512), `row` holds the upper
// row of the windows and the row's first 2 * pw pixels are pooled with it into `pooled` (its pooled row in block 0;
// block b at b * pooled_stride).
void conv_row(const ConvPoolShape& s, const float* img, const float* packed, const float* bias, int64_t oh, float* row,
              float* band, float* pooled = nullptr, int64_t pooled_stride = 0, uint8_t* arg = nullptr) {
  if (!avx512_path()) {
    conv_row_scalar(s, img, packed, bias, oh, row);
    return;
  }
  int64_t klo, khi;
  kernel_rows(s, oh, &klo, &khi);
  // Pixels whose taps leave the image horizontally would need a path of their own (a chain of dependent FMAs per
  // accumulator: ResNet's 7x7 stem spent 14% of its time on its 3 edge pixels of 112). With such pixels the row's
  // source band is copied with its zero padding and every pixel is a tile: a view of the band as an image of kh
  // rows from row oh * sh.
  const int64_t pwid = (s.ow - 1) * s.sw + s.kw;
  ConvPoolShape band_view;
  const ConvPoolShape* v = &s;
  if (s.pl > 0 || s.w - s.pl < pwid) {
    const int64_t ih0 = oh * s.sh - s.pt;
    for (int64_t c = 0; c < s.c; ++c)
      for (int64_t kh = klo; kh < khi; ++kh) {
        const float* src = img + (c * s.h + ih0 + kh) * s.w;
        float* d = band + (c * s.kh + kh) * pwid;
        const int64_t lo = std::min(pwid, s.pl), hi = std::max(lo, std::min(pwid, s.pl + s.w));
        std::fill(d, d + lo, 0.f);
        std::copy(src + (lo - s.pl), src + (hi - s.pl), d + lo);
        std::fill(d + hi, d + pwid, 0.f);
      }
    band_view = s;
    band_view.h = s.kh, band_view.w = pwid, band_view.pt = oh * s.sh, band_view.pl = 0;
    v = &band_view, img = band;
  }
  const int64_t mb = s.m / 16, per = s.c * s.kh * s.kw;
  const int64_t ow = conv_pool_2x2(s) ? 2 * s.pw : s.ow;  // a last odd pixel belongs to no window
  for (int64_t b = 0; b < mb; b += 4) {
    const float* wob = packed + b * per * 16;
    const float* bb = bias + b * 16;
    float* rb = row + b * s.ow * 16;
    float* pb = pooled ? pooled + b * pooled_stride : nullptr;
    uint8_t* ab = arg ? arg + b * pooled_stride : nullptr;
    switch (std::min<int64_t>(4, mb - b)) {
      case 4: blocks_avx512<4>(*v, img, wob, bb, oh, klo, khi, rb, pb, pooled_stride, ab, ow); break;
      case 3: blocks_avx512<3>(*v, img, wob, bb, oh, klo, khi, rb, pb, pooled_stride, ab, ow); break;
      case 2: blocks_avx512<2>(*v, img, wob, bb, oh, klo, khi, rb, pb, pooled_stride, ab, ow); break;
      default: blocks_avx512<1>(*v, img, wob, bb, oh, klo, khi, rb, pb, pooled_stride, ab, ow); break;
    }
  }
}

void pool_row(const ConvPoolShape& s, const float* const* rows, int nrows, float* tmp, float* out,
              int64_t out_block_stride) {
  if (has_avx512f() && !g_scalar.load(std::memory_order_relaxed)) {
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
      const int64_t x0 = std::max<int64_t>(0, p * s.psw - s.ppl),
                    x1 = std::min<int64_t>(s.ow, p * s.psw - s.ppl + s.pkw);
      for (int j = 0; j < 16; ++j) {
        float v = tmp[x0 * 16 + j];
        for (int64_t x = x0 + 1; x < x1; ++x) v = std::max(v, tmp[x * 16 + j]);
        out[b * out_block_stride + p * 16 + j] = v;
      }
    }
  }
}

// Asks for the source rows that convolution row oh + 1 reads and row oh does not (sh rows per channel): a row's
// source comes from memory (the network's input; the rows are too many interleaved streams for the hardware
// prefetcher), and waiting for it cost ResNet's stem 0.1 ms of 1.3 at 1 thread.
void prefetch_next_rows(const ConvPoolShape& s, const float* img, int64_t oh) {
  const int64_t first = std::max<int64_t>(0, (oh + 1) * s.sh - s.pt + s.kh - s.sh);
  const int64_t last = std::min<int64_t>(s.h, (oh + 1) * s.sh - s.pt + s.kh);
  for (int64_t c = 0; c < s.c; ++c)
    for (int64_t y = first; y < last; ++y) {
      const char* row = reinterpret_cast<const char*>(img + (c * s.h + y) * s.w);
      for (int64_t b = 0; b < s.w * static_cast<int64_t>(sizeof(float)); b += 64) __builtin_prefetch(row + b);
    }
}

constexpr int64_t kMaxPoolRows = 16;  // the ring's slots are tracked in a fixed array

}  // namespace

void conv_pool_force_scalar(bool on) { g_scalar.store(on, std::memory_order_relaxed); }

// Each convolution row and pixel is in at most one window (floor: an odd last row or column is in none).
bool conv_pool_2x2(const ConvPoolShape& s) {
  return s.pkh == 2 && s.pkw == 2 && s.psh == 2 && s.psw == 2 && s.ppt == 0 && s.ppl == 0 && s.ph == s.oh / 2 &&
         s.pw == s.ow / 2;
}

std::string conv_pool_check(const ConvPoolShape& s) {
  if (s.n < 1 || s.c < 1 || s.h < 1 || s.w < 1) return "empty source";
  if (s.m < 16 || s.m % 16 != 0) return "output channels not a multiple of 16";
  if (s.kh < 1 || s.kw < 1 || s.sh < 1 || s.sw < 1 || s.pt < 0 || s.pl < 0) return "convolution geometry";
  if (s.oh < 1 || s.ow < 1) return "convolution output size";
  if (s.pkh < 1 || s.pkw < 1 || s.psh < 1 || s.psw < 1 || s.ppt < 0 || s.ppl < 0 || s.ppt >= s.pkh || s.ppl >= s.pkw ||
      s.pkh > kMaxPoolRows)
    return "pooling geometry";
  if (s.ph < 1 || s.pw < 1 || (s.ph - 1) * s.psh - s.ppt >= s.oh || (s.pw - 1) * s.psw - s.ppl >= s.ow)
    return "pooling output size";
  return "";
}

size_t conv_pool_scratch_floats(const ConvPoolShape& s) {
  return static_cast<size_t>((s.pkh * s.m + 16) * s.ow + padded_band_floats(s));
}

size_t conv_pool_packed_floats(const ConvPoolShape& s) { return static_cast<size_t>(s.m * s.c * s.kh * s.kw); }

void conv_pool_pack_weights(const ConvPoolShape& s, const float* w, float* packed) {
  const int64_t per = s.c * s.kh * s.kw, mb = s.m / 16;  // taps per output channel, 16-channel blocks
  for (int64_t o = 0; o < s.m; ++o) {
    const int64_t b = o / 16, g = b / 4, nbg = std::min<int64_t>(4, mb - 4 * g);
    for (int64_t t = 0; t < per; ++t) packed[(g * 4 * per + t * nbg + b % 4) * 16 + o % 16] = w[o * per + t];
  }
}

// The window positions of pooled row (img, p) from its convolution rows (rows[k]: window row k, clipped at the top
// when p's window starts above row 0), by the scan pool_arg.h's pooling does (first maximum, NaN never taken).
void pool_row_arg(const ConvPoolShape& s, const float* const* rows, int64_t p, uint8_t* arg, int64_t block_stride) {
  const int64_t mb = s.m / 16, r0 = p * s.psh - s.ppt;
  for (int64_t b = 0; b < mb; ++b)
    for (int64_t q = 0; q < s.pw; ++q)
      for (int j = 0; j < 16; ++j) {
        float best = 0.f;
        int at = -1;
        for (int64_t i = 0; i < s.pkh; ++i)
          for (int64_t k = 0; k < s.pkw; ++k) {
            const int64_t y = r0 + i, x = q * s.psw - s.ppl + k;
            if (y < 0 || y >= s.oh || x < 0 || x >= s.ow) continue;
            const float v = rows[y - std::max<int64_t>(0, r0)][(b * s.ow + x) * 16 + j];
            if (at < 0 || v > best) best = v, at = static_cast<int>(i * s.pkw + k);
          }
        arg[b * block_stride + q * 16 + j] = static_cast<uint8_t>(at);
      }
}

void conv_pool_rows(const ConvPoolShape& s, const float* src, const float* packed, const float* bias, float* dst,
                    int64_t begin, int64_t end, float* scratch, uint8_t* arg) {
  const int64_t row_floats = s.m * s.ow;
  float* tmp = scratch + s.pkh * row_floats;
  int64_t held[kMaxPoolRows];  // the (image, convolution row) each ring slot holds, -1: none
  std::fill(held, held + kMaxPoolRows, int64_t{-1});
  const float* rows[kMaxPoolRows];
  const int64_t mb = s.m / 16;
  if (conv_pool_2x2(s) && avx512_path()) {
    // Each pooled row from its two convolution rows: the upper one into the ring's first slot, the lower one
    // pooled with it in registers (conv_row with `pooled`).
    for (int64_t q = begin; q < end; ++q) {
      const int64_t img = q / s.ph, p = q % s.ph;
      const float* in = src + img * s.c * s.h * s.w;
      const int64_t at = (img * mb * s.ph + p) * s.pw * 16;
      prefetch_next_rows(s, in, 2 * p);
      conv_row(s, in, packed, bias, 2 * p, scratch, tmp + 16 * s.ow);
      prefetch_next_rows(s, in, 2 * p + 1);
      conv_row(s, in, packed, bias, 2 * p + 1, scratch, tmp + 16 * s.ow, dst + at, s.ph * s.pw * 16,
               arg ? arg + at : nullptr);
    }
    return;
  }
  for (int64_t q = begin; q < end; ++q) {
    const int64_t img = q / s.ph, p = q % s.ph;
    const float* in = src + img * s.c * s.h * s.w;
    const int64_t r0 = std::max<int64_t>(0, p * s.psh - s.ppt), r1 = std::min(s.oh, p * s.psh - s.ppt + s.pkh);
    int nrows = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t slot = r % s.pkh, key = img * s.oh + r;
      float* ring = scratch + slot * row_floats;
      if (held[slot] != key) {
        prefetch_next_rows(s, in, r);
        conv_row(s, in, packed, bias, r, ring, tmp + 16 * s.ow);
        held[slot] = key;
      }
      rows[nrows++] = ring;
    }
    pool_row(s, rows, nrows, tmp, dst + (img * mb * s.ph + p) * s.pw * 16, s.ph * s.pw * 16);
    if (arg) pool_row_arg(s, rows, p, arg + (img * mb * s.ph + p) * s.pw * 16, s.ph * s.pw * 16);
  }
}

void conv_pool_run(const ConvPoolShape& s, const float* src, const float* packed, const float* bias, float* dst,
                   float* scratch, int team, uint8_t* arg, size_t stride) {
  const size_t per = stride ? stride : conv_pool_scratch_floats(s);
  split_over_team(s.n * s.ph, team, [&](int64_t t, int64_t begin, int64_t end) {
    conv_pool_rows(s, src, packed, bias, dst, begin, end, scratch + static_cast<size_t>(t) * per, arg);
  });
}

void conv_pool_reference(const ConvPoolShape& s, const float* src, const float* w, const float* bias, float* dst,
                         uint8_t* arg) {
  const int64_t mb = s.m / 16;
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t o = 0; o < s.m; ++o)
      for (int64_t p = 0; p < s.ph; ++p)
        for (int64_t q = 0; q < s.pw; ++q) {
          float best = 0.f;
          bool any = false;
          int at = 0;
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
              if (!any || v > best) best = v, at = static_cast<int>(i * s.pkw + j);
              any = true;
            }
          const int64_t k = (((img * mb + o / 16) * s.ph + p) * s.pw + q) * 16 + o % 16;
          dst[k] = best;
          if (arg) arg[k] = static_cast<uint8_t>(at);
        }
}

}  // namespace keel::onednn
