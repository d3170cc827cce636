// plugins/cpu_onednn/steps/dw_ln.cc — a depthwise convolution and the LayerNormalization after it (steps/dw_ln.h).
#include "steps/dw_ln.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/team.h"
#include "steps/silu.h"

namespace keel::onednn {
namespace {

constexpr int kStrip = 16;  // output pixels of a register tile at most (16 sums, 7 taps and a source vector)

int64_t pad_of(const DwLnShape& s) { return s.k / 2; }
int64_t ring_row_floats(const DwLnShape& s) { return (s.w + 2 * pad_of(s)) * s.c; }

// GCC 12 warns about its own _mm512_undefined_ps() inside _mm512_reduce_add_ps (a false positive, as in
// steps/narrow_gemm.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Sums of P output pixels of one 16-channel block: rows[r] is the block's part of the ring row of kernel row r (its
// pixel 0 the strip's first window column, pixels 16 floats apart; null: outside the image, skipped), taps the
// block's [k*k][16], bias at this block; written to out with `out_stride` floats from pixel to pixel.
template <int K, int P>
__attribute__((target("avx512f"))) void strip(const float* const* rows, int64_t out_stride, const float* taps,
                                              const float* bias, float* out) {
  __m512 acc[P];
  const __m512 b = _mm512_loadu_ps(bias);
#pragma GCC unroll 16
  for (int i = 0; i < P; ++i) acc[i] = b;
  for (int r = 0; r < K; ++r) {
    if (!rows[r]) continue;
    // The kernel row's K taps in registers; each source vector loaded once and added into every output it reaches.
    __m512 w[K];
#pragma GCC unroll 7
    for (int q = 0; q < K; ++q) w[q] = _mm512_loadu_ps(taps + (r * K + q) * 16);
#pragma GCC unroll 22
    for (int j = 0; j < P + K - 1; ++j) {
      const __m512 x = _mm512_loadu_ps(rows[r] + j * 16);
#pragma GCC unroll 7
      for (int q = 0; q < K; ++q) {
        const int i = j - q;
        if (i >= 0 && i < P) acc[i] = _mm512_fmadd_ps(x, w[q], acc[i]);
      }
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < P; ++i) _mm512_storeu_ps(out + i * out_stride, acc[i]);
}

// LayerNorm of one pixel's c values in place: mean, then the mean of squared deviations, as ONNX defines it. The sums
// run in two chains (c is a multiple of 16: an odd number of vectors leaves the second one short), so that a pixel of
// 384 channels does not wait 24 additions' latency twice.
__attribute__((target("avx512f"))) void normalize(float* x, int64_t c, const float* scale, const float* shift,
                                                  float eps) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 32 <= c; j += 32) {
    s0 = _mm512_add_ps(s0, _mm512_loadu_ps(x + j));
    s1 = _mm512_add_ps(s1, _mm512_loadu_ps(x + j + 16));
  }
  if (j < c) s0 = _mm512_add_ps(s0, _mm512_loadu_ps(x + j));
  const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) / static_cast<float>(c));
  __m512 q0 = _mm512_setzero_ps(), q1 = _mm512_setzero_ps();
  for (j = 0; j + 32 <= c; j += 32) {
    const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + j), mean);
    const __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(x + j + 16), mean);
    q0 = _mm512_fmadd_ps(d0, d0, q0);
    q1 = _mm512_fmadd_ps(d1, d1, q1);
  }
  if (j < c) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + j), mean);
    q0 = _mm512_fmadd_ps(d, d, q0);
  }
  const __m512 rstd =
      _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(_mm512_add_ps(q0, q1)) / static_cast<float>(c) + eps));
  for (j = 0; j < c; j += 16) {
    const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), mean), rstd);
    _mm512_storeu_ps(x + j, _mm512_fmadd_ps(d, _mm512_loadu_ps(scale + j), _mm512_loadu_ps(shift + j)));
  }
}

// A channels-last source row of w pixels and c channels into a ring row by 16-channel blocks: block b's pixel x at
// to + b * seg + 16 x. Vector loads and stores (not memcpy's `rep movsb`, which was slower for the plain row copy
// this used to be: docs/ONEDNN_PERFORMANCE.md, "(dwln)").
__attribute__((target("avx512f"))) void copy_row(const float* from, int64_t w, int64_t c, int64_t seg, float* to) {
  for (int64_t x = 0; x < w; ++x)
    for (int64_t cb = 0; cb < c; cb += 16)
      _mm512_storeu_ps(to + cb / 16 * seg + x * 16, _mm512_loadu_ps(from + x * c + cb));
}

#pragma GCC diagnostic pop

using StripFn = void (*)(const float* const*, int64_t, const float*, const float*, float*);

template <int K>
StripFn strip_fn(int p) {
  static constexpr StripFn fns[kStrip] = {
      strip<K, 1>, strip<K, 2>,  strip<K, 3>,  strip<K, 4>,  strip<K, 5>,  strip<K, 6>,  strip<K, 7>,  strip<K, 8>,
      strip<K, 9>, strip<K, 10>, strip<K, 11>, strip<K, 12>, strip<K, 13>, strip<K, 14>, strip<K, 15>, strip<K, 16>};
  return fns[p - 1];
}
StripFn strip_of(int64_t k, int p) { return k == 3 ? strip_fn<3>(p) : k == 5 ? strip_fn<5>(p) : strip_fn<7>(p); }

// Output rows [begin, end) of the n * h, on the calling thread, with its ring at `ring`.
void run_rows(const DwLnShape& s, const float* src, const float* packed, float* dst, float* ring, int64_t begin,
              int64_t end) {
  const int64_t p = pad_of(s), rf = ring_row_floats(s), kk = s.k * s.k, seg = (s.w + 2 * p) * 16;
  const float* taps = packed;
  const float *bias = packed + kk * s.c, *scale = bias + s.c, *shift = scale + s.c;
  // The padding columns of every ring row's channel blocks stay zero; the middle is the source row.
  for (int64_t r = 0; r < s.k; ++r)
    for (int64_t cb = 0; cb < s.c / 16; ++cb) {
      float* at = ring + r * rf + cb * seg;
      std::fill(at, at + p * 16, 0.f);
      std::fill(at + (p + s.w) * 16, at + seg, 0.f);
    }
  constexpr int kMaxK = 7;
  int64_t held[kMaxK];  // the source row (img * h + y) each ring row holds
  std::fill(held, held + kMaxK, -1);
  const float* rows[kMaxK] = {};
  for (int64_t q = begin; q < end; ++q) {
    const int64_t img = q / s.h, y = q % s.h;
    for (int64_t r = 0; r < s.k; ++r) {
      const int64_t sy = y + r - p;
      if (sy < 0 || sy >= s.h) {
        rows[r] = nullptr;
        continue;
      }
      const int64_t key = img * s.h + sy, slot = key % s.k;
      float* at = ring + slot * rf;
      if (held[slot] != key) {
        copy_row(src + key * s.w * s.c, s.w, s.c, seg, at + p * 16);
        held[slot] = key;
      }
      rows[r] = at;
    }
    float* out = dst + q * s.w * s.c;
    const float* at[kMaxK];
    for (int64_t cb = 0; cb < s.c; cb += 16) {
      for (int64_t x0 = 0; x0 < s.w;) {
        // Strips of near-equal width (56 pixels: 4 x 14, not 3 x 16 + 8).
        const int64_t left = s.w - x0, strips = (left + kStrip - 1) / kStrip;
        const int np = static_cast<int>((left + strips - 1) / strips);
        for (int64_t r = 0; r < s.k; ++r) at[r] = rows[r] ? rows[r] + cb / 16 * seg + x0 * 16 : nullptr;
        strip_of(s.k, np)(at, s.c, taps + cb * kk, bias + cb, out + x0 * s.c + cb);
        x0 += np;
      }
    }
    for (int64_t x = 0; x < s.w; ++x) normalize(out + x * s.c, s.c, scale, shift, s.eps);
  }
}

}  // namespace

std::string dw_ln_check(const DwLnShape& s) {
  if (!has_avx512f()) return "no AVX-512";
  if (s.k != 3 && s.k != 5 && s.k != 7) return "kernel other than 3x3, 5x5 or 7x7";
  if (s.c < 16 || s.c % 16 != 0) return "channels not a multiple of 16";
  if (s.n < 1 || s.h < 1 || s.w < 1) return "empty image";
  if (!(s.eps >= 0.f)) return "negative epsilon";
  return "";
}

size_t dw_ln_packed_floats(const DwLnShape& s) { return static_cast<size_t>((s.k * s.k + 3) * s.c); }

void dw_ln_pack(const DwLnShape& s, const float* w, const float* bias, const float* scale, const float* shift,
                float* packed) {
  const int64_t kk = s.k * s.k;
  for (int64_t ch = 0; ch < s.c; ++ch) {
    for (int64_t t = 0; t < kk; ++t) packed[(ch / 16 * kk + t) * 16 + ch % 16] = w[ch * kk + t];
    packed[kk * s.c + ch] = bias ? bias[ch] : 0.f;
    packed[(kk + 1) * s.c + ch] = scale[ch];
    packed[(kk + 2) * s.c + ch] = shift ? shift[ch] : 0.f;
  }
}

size_t dw_ln_scratch_floats(const DwLnShape& s) { return static_cast<size_t>(s.k * ring_row_floats(s)) + 16; }

void dw_ln_run(const DwLnShape& s, const float* src, const float* packed, float* dst, float* scratch, int team,
               size_t stride) {
  const size_t per = stride ? stride : dw_ln_scratch_floats(s);
  split_over_team(s.n * s.h, team, [&](int64_t t, int64_t begin, int64_t end) {
    if (end > begin) run_rows(s, src, packed, dst, scratch + static_cast<size_t>(t) * per, begin, end);
  });
}

void dw_ln_reference(const DwLnShape& s, const float* src, const float* w, const float* bias, const float* scale,
                     const float* shift, float* dst) {
  const int64_t p = pad_of(s);
  std::vector<double> v(static_cast<size_t>(s.c));
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t y = 0; y < s.h; ++y)
      for (int64_t x = 0; x < s.w; ++x) {
        double mean = 0;
        for (int64_t ch = 0; ch < s.c; ++ch) {
          double acc = bias ? bias[ch] : 0.0;
          for (int64_t a = 0; a < s.k; ++a)
            for (int64_t b = 0; b < s.k; ++b) {
              const int64_t iy = y + a - p, ix = x + b - p;
              if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
              acc += static_cast<double>(src[((img * s.h + iy) * s.w + ix) * s.c + ch]) * w[(ch * s.k + a) * s.k + b];
            }
          v[ch] = acc;
          mean += acc;
        }
        mean /= static_cast<double>(s.c);
        double var = 0;
        for (double e : v) var += (e - mean) * (e - mean);
        var /= static_cast<double>(s.c);
        const double rstd = 1.0 / std::sqrt(var + s.eps);
        for (int64_t ch = 0; ch < s.c; ++ch)
          dst[((img * s.h + y) * s.w + x) * s.c + ch] =
              static_cast<float>((v[ch] - mean) * rstd * scale[ch] + (shift ? shift[ch] : 0.0));
      }
}

}  // namespace keel::onednn
