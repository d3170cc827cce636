// plugins/cpu_onednn/steps/dwsilu.cc — depthwise convolution + SiLU (+ SiLU of its source, + channel means) in one
// pass (steps/dwsilu.h).
//
// Per (image, 16-channel block): a ring of k source rows, each padded to wp = max(w + 2p, (ow-1)*s + k) pixels of 16
// floats with zeros at both ends, filled row by row as the output rows advance (SiLU applied on the way when asked);
// rows above or below the image are one shared zero row. An output row is computed in tiles of up to 8 pixels held
// in registers: per tap one weight vector and one source load per pixel (an FMA with a memory operand).
#include "steps/dwsilu.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/team.h"
#include "steps/silu.h"
#include "steps/silu16.h"

namespace keel::onednn {
namespace {

int64_t padded_width(const DwSiluShape& s) { return std::max(s.w + 2 * s.p, (s.ow - 1) * s.s + s.k); }

float silu1(float x) { return x < -87.f ? 0.f : x / (1.f + std::exp(-x)); }  // as silu_inplace_scalar

// ---------------------------------------------------------------------------------------------------- AVX-512

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// NP output pixels from ox0 of one output row: rows[ky] point at the ring rows (padded; pixel 0 is the left pad).
template <int K, int S, int NP>
__attribute__((target("avx512f"), always_inline)) inline void tile(const float* const* rows, int64_t ox0,
                                                                   const float* wb, __m512 b, float* out, __m512& sum) {
  __m512 acc[NP];  // fully unrolled: the accumulators stay in registers
#pragma GCC unroll 8
  for (int j = 0; j < NP; ++j) acc[j] = b;
  for (int ky = 0; ky < K; ++ky) {
    const float* r = rows[ky] + ox0 * S * 16;
#pragma GCC unroll 5
    for (int kx = 0; kx < K; ++kx) {
      const __m512 w = _mm512_loadu_ps(wb + (ky * K + kx) * 16);
#pragma GCC unroll 8
      for (int j = 0; j < NP; ++j) acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(r + (j * S + kx) * 16), w, acc[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NP; ++j) {
    const __m512 v = silu16(acc[j]);
    _mm512_storeu_ps(out + j * 16, v);
    sum = _mm512_add_ps(sum, v);
  }
}

template <int K, int S>
__attribute__((target("avx512f"))) void block_avx512(const DwSiluShape& s, const float* src, const float* wb,
                                                     const float* bias, float* dst, float* mean, float* scratch) {
  const int64_t wp = padded_width(s), rowf = wp * 16;
  const float* zero = scratch + K * rowf;  // scratch is zero but for the ring rows' pixels [p, p + w)
  const float* rows[K];
  int64_t next = 0;  // the next source row to fill into the ring
  const __m512 b = _mm512_loadu_ps(bias);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t oy = 0; oy < s.oh; ++oy) {
    const int64_t iy0 = oy * S - s.p;
    for (int ky = 0; ky < K; ++ky) {
      const int64_t iy = iy0 + ky;
      if (iy < 0 || iy >= s.h) {
        rows[ky] = zero;
        continue;
      }
      float* slot = scratch + (iy % K) * rowf;
      if (iy >= next) {  // rows arrive in order: fill iy now
        const float* in = src + iy * s.w * 16;
        float* o = slot + s.p * 16;
        if (s.in_silu)
          for (int64_t x = 0; x < s.w; ++x) _mm512_storeu_ps(o + x * 16, silu16(_mm512_loadu_ps(in + x * 16)));
        else std::memcpy(o, in, static_cast<size_t>(s.w) * 16 * sizeof(float));
        next = iy + 1;
      }
      rows[ky] = slot;
    }
    float* out = dst + oy * s.ow * 16;
    int64_t ox = 0;
    for (; ox + 8 <= s.ow; ox += 8) tile<K, S, 8>(rows, ox, wb, b, out + ox * 16, sum);
    switch (s.ow - ox) {
      case 7: tile<K, S, 7>(rows, ox, wb, b, out + ox * 16, sum); break;
      case 6: tile<K, S, 6>(rows, ox, wb, b, out + ox * 16, sum); break;
      case 5: tile<K, S, 5>(rows, ox, wb, b, out + ox * 16, sum); break;
      case 4: tile<K, S, 4>(rows, ox, wb, b, out + ox * 16, sum); break;
      case 3: tile<K, S, 3>(rows, ox, wb, b, out + ox * 16, sum); break;
      case 2: tile<K, S, 2>(rows, ox, wb, b, out + ox * 16, sum); break;
      case 1: tile<K, S, 1>(rows, ox, wb, b, out + ox * 16, sum); break;
      default: break;
    }
  }
  if (mean) _mm512_storeu_ps(mean, _mm512_mul_ps(sum, _mm512_set1_ps(1.f / static_cast<float>(s.oh * s.ow))));
}

#pragma GCC diagnostic pop

// ----------------------------------------------------------------------------------------------------- scalar

void block_scalar(const DwSiluShape& s, const float* src, const float* wb, const float* bias, float* dst, float* mean) {
  double sum[16] = {};
  for (int64_t oy = 0; oy < s.oh; ++oy)
    for (int64_t ox = 0; ox < s.ow; ++ox) {
      float acc[16];
      for (int l = 0; l < 16; ++l) acc[l] = bias[l];
      for (int64_t ky = 0; ky < s.k; ++ky) {
        const int64_t iy = oy * s.s - s.p + ky;
        if (iy < 0 || iy >= s.h) continue;
        for (int64_t kx = 0; kx < s.k; ++kx) {
          const int64_t ix = ox * s.s - s.p + kx;
          if (ix < 0 || ix >= s.w) continue;
          const float* in = src + (iy * s.w + ix) * 16;
          const float* w = wb + (ky * s.k + kx) * 16;
          for (int l = 0; l < 16; ++l) acc[l] += (s.in_silu ? silu1(in[l]) : in[l]) * w[l];
        }
      }
      for (int l = 0; l < 16; ++l) {
        const float v = silu1(acc[l]);
        dst[(oy * s.ow + ox) * 16 + l] = v;
        sum[l] += v;
      }
    }
  if (mean)
    for (int l = 0; l < 16; ++l) mean[l] = static_cast<float>(sum[l] / static_cast<double>(s.oh * s.ow));
}

}  // namespace

std::string dw_silu_check(const DwSiluShape& s) {
  if (s.k != 3 && s.k != 5) return "kernel size " + std::to_string(s.k) + " (3 or 5 only)";
  if (s.s != 1 && s.s != 2) return "stride " + std::to_string(s.s) + " (1 or 2 only)";
  if (s.p < 0 || s.p >= s.k) return "padding " + std::to_string(s.p);
  if (s.n < 1 || s.c < 16 || s.c % 16 != 0 || s.h < 1 || s.w < 1) return "channels (a multiple of 16) or image size";
  if (s.h + 2 * s.p < s.k || s.w + 2 * s.p < s.k) return "kernel larger than the padded image";
  if (s.oh != (s.h + 2 * s.p - s.k) / s.s + 1 || s.ow != (s.w + 2 * s.p - s.k) / s.s + 1) return "output size";
  return "";
}

size_t dw_silu_scratch_floats(const DwSiluShape& s) { return static_cast<size_t>((s.k + 1) * padded_width(s) * 16); }

void dw_silu_pack_weights(const DwSiluShape& s, const float* w, float* packed) {
  const int64_t kk = s.k * s.k;
  for (int64_t c = 0; c < s.c; ++c)
    for (int64_t t = 0; t < kk; ++t) packed[((c / 16) * kk + t) * 16 + c % 16] = w[c * kk + t];
}

void dw_silu_blocks(const DwSiluShape& s, const float* src, const float* packed, const float* bias, float* dst,
                    float* mean, int64_t begin, int64_t end, float* scratch, bool vector) {
  const int64_t cb = s.c / 16, kk = s.k * s.k;
  const bool fast = vector && has_avx512f();
  // The ring's pads and the zero row stay zero: each block's rows fill pixels [p, p + w) only.
  if (fast && begin < end) std::memset(scratch, 0, dw_silu_scratch_floats(s) * sizeof(float));
  for (int64_t blk = begin; blk < end; ++blk) {
    const int64_t c0 = (blk % cb) * 16;
    const float* x = src + blk * s.h * s.w * 16;
    const float* wb = packed + (blk % cb) * kk * 16;
    float* y = dst + blk * s.oh * s.ow * 16;
    float* m = mean ? mean + blk * 16 : nullptr;  // nChw16c [n,c,1,1] with c % 16 == 0: image-major, then channel
    if (!fast) {
      block_scalar(s, x, wb, bias + c0, y, m);
      continue;
    }
    if (s.k == 3 && s.s == 1) block_avx512<3, 1>(s, x, wb, bias + c0, y, m, scratch);
    else if (s.k == 3) block_avx512<3, 2>(s, x, wb, bias + c0, y, m, scratch);
    else if (s.s == 1) block_avx512<5, 1>(s, x, wb, bias + c0, y, m, scratch);
    else block_avx512<5, 2>(s, x, wb, bias + c0, y, m, scratch);
  }
}

void dw_silu_run(const DwSiluShape& s, const float* src, const float* packed, const float* bias, float* dst,
                 float* mean, float* scratch, int team, bool vector, size_t stride) {
  const size_t per = stride ? stride : dw_silu_scratch_floats(s);
  split_over_team(s.n * (s.c / 16), team, [&](int64_t t, int64_t begin, int64_t end) {
    dw_silu_blocks(s, src, packed, bias, dst, mean, begin, end, scratch + static_cast<size_t>(t) * per, vector);
  });
}

void dw_silu_reference(const DwSiluShape& s, const float* src, const float* w, const float* bias, float* dst,
                       float* mean) {
  auto at = [](int64_t c, int64_t hw, int64_t pix) { return ((c / 16) * hw + pix) * 16 + c % 16; };  // nChw16c
  auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t c = 0; c < s.c; ++c) {
      const float* x = src + img * s.c * s.h * s.w;
      float* y = dst + img * s.c * s.oh * s.ow;
      double total = 0;
      for (int64_t oy = 0; oy < s.oh; ++oy)
        for (int64_t ox = 0; ox < s.ow; ++ox) {
          double acc = bias[c];
          for (int64_t ky = 0; ky < s.k; ++ky)
            for (int64_t kx = 0; kx < s.k; ++kx) {
              const int64_t iy = oy * s.s - s.p + ky, ix = ox * s.s - s.p + kx;
              if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
              const double v = x[at(c, s.h * s.w, iy * s.w + ix)];
              acc += (s.in_silu ? silu(v) : v) * w[(c * s.k + ky) * s.k + kx];
            }
          const double v = silu(acc);
          y[at(c, s.oh * s.ow, oy * s.ow + ox)] = static_cast<float>(v);
          total += v;
        }
      if (mean) mean[img * s.c + c] = static_cast<float>(total / static_cast<double>(s.oh * s.ow));
    }
}

}  // namespace keel::onednn
