// plugins/cpu_onednn/steps/pool_arg.cc — see pool_arg.h. The 16-channel-blocked layout (what oneDNN's f32
// convolutions write on AVX-512) takes one vector per window position: 16 channels at once, no shuffles. The plain
// layout takes 2x2 / stride-2 windows 16 at a time along the row (the stem convolution's output); every other case
// goes element by element.
#include "steps/pool_arg.h"

#include <immintrin.h>
#include <omp.h>

#include <cstdint>
#include <cstring>

#include "common/lanes.h"
#include "common/pool2x2.h"
#include "common/team.h"
#include "steps/silu.h"

namespace keel::onednn {
namespace {

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_* placeholders (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// One (image, channel block) of nChw16c.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void forward16(const PoolArgShape& s, const float* src, float* dst,
                                                                    uint8_t* arg) {
  for (int64_t oh = 0; oh < s.oh; ++oh)
    for (int64_t ow = 0; ow < s.ow; ++ow) {
      const float* base = src + ((oh * s.sh) * s.w + ow * s.sw) * 16;
      __m512 best = _mm512_loadu_ps(base);
      __m512i at = _mm512_setzero_si512();
      for (int64_t i = 0; i < s.kh; ++i)
        for (int64_t j = i == 0 ? 1 : 0; j < s.kw; ++j) {
          const __m512 v = _mm512_loadu_ps(base + (i * s.w + j) * 16);
          const __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
          best = _mm512_mask_mov_ps(best, gt, v);
          at = _mm512_mask_mov_epi32(at, gt, _mm512_set1_epi32(static_cast<int>(i * s.kw + j)));
        }
      const int64_t o = (oh * s.ow + ow) * 16;
      _mm512_storeu_ps(dst + o, best);
      if (arg) _mm_storeu_si128(reinterpret_cast<__m128i*>(arg + o), _mm512_cvtepi32_epi8(at));
    }
}

// One pooled position of 16 channels: its gradient (zero where the Relu mask is off) and window positions.
struct Window16 {
  __m512 g;
  __m512i at;
};
__attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline Window16 window16(const float* g,
                                                                                             const float* p,
                                                                                             const uint8_t* arg,
                                                                                             int64_t o, bool relu) {
  Window16 v;
  v.g = _mm512_loadu_ps(g + o);
  if (relu) v.g = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_loadu_ps(p + o), _mm512_setzero_ps(), _CMP_GT_OQ), v.g);
  v.at = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(arg + o)));
  return v;
}

// Windows that tile the plane (strides equal to the window): each position written once, by its window.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void backward16_tiled(const PoolArgShape& s, const float* g,
                                                                           const float* p, const uint8_t* arg,
                                                                           bool relu, float* dx) {
  // Streaming stores where aligned: the plane is written whole, so reading its old lines first would double the
  // traffic (LeNet-like conv2's 9.4 MB, cold: 1.14 -> 0.6 ms at 1 thread).
  const bool stream = reinterpret_cast<uintptr_t>(dx) % 64 == 0 && (s.w * 16 * sizeof(float)) % 64 == 0;
  for (int64_t oh = 0; oh < s.oh; ++oh) {
    for (int64_t ow = 0; ow < s.ow; ++ow) {
      const Window16 v = window16(g, p, arg, (oh * s.ow + ow) * 16, relu);
      const __m512 gv = v.g;
      const __m512i at = v.at;
      float* base = dx + ((oh * s.kh) * s.w + ow * s.kw) * 16;
      for (int64_t i = 0; i < s.kh; ++i)
        for (int64_t j = 0; j < s.kw; ++j) {
          const __mmask16 here = _mm512_cmpeq_epi32_mask(at, _mm512_set1_epi32(static_cast<int>(i * s.kw + j)));
          if (stream) _mm512_stream_ps(base + (i * s.w + j) * 16, _mm512_maskz_mov_ps(here, gv));
          else _mm512_storeu_ps(base + (i * s.w + j) * 16, _mm512_maskz_mov_ps(here, gv));
        }
    }
    // Columns past the last window: zero.
    for (int64_t i = 0; i < s.kh; ++i)
      if (s.ow * s.kw < s.w)
        std::memset(dx + ((oh * s.kh + i) * s.w + s.ow * s.kw) * 16, 0,
                    static_cast<size_t>((s.w - s.ow * s.kw) * 16) * sizeof(float));
  }
  // Rows past the last window: zero.
  if (s.oh * s.kh < s.h)
    std::memset(dx + s.oh * s.kh * s.w * 16, 0, static_cast<size_t>((s.h - s.oh * s.kh) * s.w * 16) * sizeof(float));
}

// Any strides (windows may overlap or leave gaps): zeros, then each window's gradient added at its maximum.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void backward16(const PoolArgShape& s, const float* g,
                                                                     const float* p, const uint8_t* arg, bool relu,
                                                                     float* dx) {
  std::memset(dx, 0, static_cast<size_t>(s.h * s.w * 16) * sizeof(float));
  for (int64_t oh = 0; oh < s.oh; ++oh)
    for (int64_t ow = 0; ow < s.ow; ++ow) {
      const Window16 v = window16(g, p, arg, (oh * s.ow + ow) * 16, relu);
      const __m512 gv = v.g;
      const __m512i at = v.at;
      float* base = dx + ((oh * s.sh) * s.w + ow * s.sw) * 16;
      for (int64_t i = 0; i < s.kh; ++i)
        for (int64_t j = 0; j < s.kw; ++j) {
          const __mmask16 here = _mm512_cmpeq_epi32_mask(at, _mm512_set1_epi32(static_cast<int>(i * s.kw + j)));
          if (here == 0) continue;
          float* d = base + (i * s.w + j) * 16;
          _mm512_storeu_ps(d, _mm512_mask_add_ps(_mm512_loadu_ps(d), here, _mm512_loadu_ps(d), gv));
        }
    }
}

// One (image, channel) plane of the plain layout, 2x2 / stride-2 windows, 16 along the row at a time.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void forward_plain2x2(const PoolArgShape& s, const float* src,
                                                                           float* dst, uint8_t* arg) {
  for (int64_t oh = 0; oh < s.oh; ++oh) {
    const float* r0 = src + 2 * oh * s.w;
    for (int64_t ow = 0; ow < s.ow; ow += 16) {
      const int64_t n = s.ow - ow < 16 ? s.ow - ow : 16;
      const Windows2x2 v = load_windows_2x2(r0, r0 + s.w, ow, n);
      // First maximum in a, b, c, d order (strictly greater replaces).
      __m512 best = v.a;
      __m512i at = _mm512_setzero_si512();
      const __m512 cand[3] = {v.b, v.c, v.d};
      for (int k = 0; k < 3; ++k) {
        const __mmask16 gt = _mm512_cmp_ps_mask(cand[k], best, _CMP_GT_OQ);
        best = _mm512_mask_mov_ps(best, gt, cand[k]);
        at = _mm512_mask_mov_epi32(at, gt, _mm512_set1_epi32(k + 1));
      }
      _mm512_mask_storeu_ps(dst + oh * s.ow + ow, v.kw, best);
      if (arg) _mm_mask_storeu_epi8(arg + oh * s.ow + ow, v.kw, _mm512_cvtepi32_epi8(at));
    }
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void backward_plain2x2(const PoolArgShape& s, const float* g,
                                                                            const float* p, const uint8_t* arg,
                                                                            bool relu, float* dx) {
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  for (int64_t oh = 0; oh < s.oh; ++oh) {
    float* d0 = dx + 2 * oh * s.w;
    float* d1 = d0 + s.w;
    for (int64_t ow = 0; ow < s.ow; ow += 16) {
      const int64_t n = s.ow - ow < 16 ? s.ow - ow : 16;
      const __mmask16 kw = first_lanes(n), k0 = first_lanes(2 * n), k1 = first_lanes(2 * n - 16);
      const int64_t o = oh * s.ow + ow;
      __m512 gv = _mm512_maskz_loadu_ps(kw, g + o);
      if (relu)
        gv = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(kw, p + o), _mm512_setzero_ps(), _CMP_GT_OQ),
                                 gv);
      const __m512i at = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(kw, arg + o));
      __m512 q[4];
      for (int k = 0; k < 4; ++k) q[k] = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, _mm512_set1_epi32(k)), gv);
      _mm512_mask_storeu_ps(d0 + 2 * ow, k0, _mm512_permutex2var_ps(q[0], lo, q[1]));
      _mm512_mask_storeu_ps(d0 + 2 * ow + 16, k1, _mm512_permutex2var_ps(q[0], hi, q[1]));
      _mm512_mask_storeu_ps(d1 + 2 * ow, k0, _mm512_permutex2var_ps(q[2], lo, q[3]));
      _mm512_mask_storeu_ps(d1 + 2 * ow + 16, k1, _mm512_permutex2var_ps(q[2], hi, q[3]));
    }
  }
  // Rows and columns no window covers (an odd size): zero.
  for (int64_t h = 2 * s.oh; h < s.h; ++h) std::memset(dx + h * s.w, 0, static_cast<size_t>(s.w) * sizeof(float));
  if (2 * s.ow < s.w)
    for (int64_t h = 0; h < 2 * s.oh; ++h) dx[h * s.w + s.w - 1] = 0.f;
}

#pragma GCC diagnostic pop

// Any block, any window: element by element. One (image, channel block).
void forward_any(const PoolArgShape& s, const float* src, float* dst, uint8_t* arg) {
  const int64_t b = s.block;
  for (int64_t oh = 0; oh < s.oh; ++oh)
    for (int64_t ow = 0; ow < s.ow; ++ow)
      for (int64_t ci = 0; ci < b; ++ci) {
        const float* base = src + ((oh * s.sh) * s.w + ow * s.sw) * b + ci;
        float best = base[0];
        int at = 0;
        for (int64_t i = 0; i < s.kh; ++i)
          for (int64_t j = 0; j < s.kw; ++j)
            if (base[(i * s.w + j) * b] > best) best = base[(i * s.w + j) * b], at = static_cast<int>(i * s.kw + j);
        const int64_t o = (oh * s.ow + ow) * b + ci;
        dst[o] = best;
        if (arg) arg[o] = static_cast<uint8_t>(at);
      }
}

void backward_any(const PoolArgShape& s, const float* g, const float* p, const uint8_t* arg, bool relu, float* dx) {
  const int64_t b = s.block;
  std::memset(dx, 0, static_cast<size_t>(s.h * s.w * b) * sizeof(float));
  for (int64_t oh = 0; oh < s.oh; ++oh)
    for (int64_t ow = 0; ow < s.ow; ++ow)
      for (int64_t ci = 0; ci < b; ++ci) {
        const int64_t o = (oh * s.ow + ow) * b + ci;
        if (relu && !(p[o] > 0.f)) continue;
        const int64_t i = arg[o] / s.kw, j = arg[o] % s.kw;
        dx[((oh * s.sh + i) * s.w + ow * s.sw + j) * b + ci] += g[o];
      }
}

bool have_avx512() {
  static const bool yes =
      has_avx512f() && __builtin_cpu_supports("avx512bw") != 0 && __builtin_cpu_supports("avx512vl") != 0;
  return yes;
}

bool plain2x2(const PoolArgShape& s) { return s.block == 1 && s.kh == 2 && s.kw == 2 && s.sh == 2 && s.sw == 2; }

}  // namespace

namespace {
void forward_planes(const PoolArgShape& s, const float* src, float* dst, uint8_t* arg, int64_t t0, int64_t t1) {
  const bool avx = have_avx512() && (s.block == 16 || plain2x2(s));
  const int64_t in = s.h * s.w * s.block, out = s.oh * s.ow * s.block;
  for (int64_t t = t0; t < t1; ++t) {
    uint8_t* a = arg ? arg + t * out : nullptr;
    if (!avx) forward_any(s, src + t * in, dst + t * out, a);
    else if (s.block == 16) forward16(s, src + t * in, dst + t * out, a);
    else forward_plain2x2(s, src + t * in, dst + t * out, a);
  }
}
}  // namespace

namespace {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as above
// Rows [r0, r1) of the n * oh (image, output row) pairs, every channel block of nChw16c.
__attribute__((target("avx512f"))) void max16_rows(const PoolArgShape& s, const float* src, float* dst, int64_t r0,
                                                   int64_t r1) {
  const int64_t nb = s.blocks(), in = s.h * s.w * 16, out = s.oh * s.ow * 16;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t img = r / s.oh, oh = r % s.oh;
    for (int64_t b = 0; b < nb; ++b) {
      const float* rows = src + (img * nb + b) * in + oh * s.sh * s.w * 16;
      float* o = dst + (img * nb + b) * out + oh * s.ow * 16;
      for (int64_t ow = 0; ow < s.ow; ++ow) {
        const float* base = rows + ow * s.sw * 16;
        __m512 best = _mm512_loadu_ps(base);
        for (int64_t i = 0; i < s.kh; ++i)
          for (int64_t j = i == 0 ? 1 : 0; j < s.kw; ++j)
            best = _mm512_max_ps(best, _mm512_loadu_ps(base + (i * s.w + j) * 16));
        _mm512_storeu_ps(o + ow * 16, best);
      }
    }
  }
}
#pragma GCC diagnostic pop
}  // namespace

void pool_max16_rows(const PoolArgShape& s, const float* src, float* dst, int team) {
  split_over_team(s.n * s.oh, team, [&](int64_t, int64_t r0, int64_t r1) { max16_rows(s, src, dst, r0, r1); });
}

bool read_pool_window(const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides, PoolArgShape* s) {
  if (kernel.size() != 2 || strides.size() != 2 || kernel[0] <= 0 || kernel[1] <= 0 || strides[0] <= 0 ||
      strides[1] <= 0 || kernel[0] * kernel[1] > 256)
    return false;
  s->kh = kernel[0], s->kw = kernel[1], s->sh = strides[0], s->sw = strides[1];
  return true;
}

void pool_arg_forward(const PoolArgShape& s, const float* src, float* dst, uint8_t* arg) {
  const int64_t planes = s.n * s.blocks();
  parallel_for(planes, [&](int64_t t) { forward_planes(s, src, dst, arg, t, t + 1); });
}

void pool_arg_forward_here(const PoolArgShape& s, const float* src, float* dst, uint8_t* arg) {
  forward_planes(s, src, dst, arg, 0, s.n * s.blocks());
}

void pool_arg_backward(const PoolArgShape& s, const float* g, const float* p, const uint8_t* arg, bool relu,
                       float* dx) {
  const bool avx = have_avx512() && (s.block == 16 || plain2x2(s));
  const int64_t planes = s.n * s.blocks(), in = s.h * s.w * s.block, out = s.oh * s.ow * s.block;
  parallel_for(planes, [&](int64_t t) {
    const float* pt = relu ? p + t * out : nullptr;
    if (!avx) backward_any(s, g + t * out, pt, arg + t * out, relu, dx + t * in);
    else if (s.block == 16 && s.sh == s.kh && s.sw == s.kw)
      backward16_tiled(s, g + t * out, pt, arg + t * out, relu, dx + t * in);
    else if (s.block == 16) backward16(s, g + t * out, pt, arg + t * out, relu, dx + t * in);
    else backward_plain2x2(s, g + t * out, pt, arg + t * out, relu, dx + t * in);
  });
  _mm_sfence();  // the streaming stores are visible before whoever reads dx next
}

}  // namespace keel::onednn
