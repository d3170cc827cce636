// plugins/cpu_onednn/steps/se.cc — squeeze-excite's excitation in one step (steps/se.h).
#include "steps/se.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "steps/silu.h"
#include "steps/silu16.h"

namespace keel::onednn {
namespace {

int64_t up16(int64_t v) { return (v + 15) / 16 * 16; }

// GCC 12 warns about its own _mm512_undefined_ps() inside max (a false positive; as in steps/silu.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// acc[0..NV) = b + sum over k < n of rows[k * stride ..][0..16*NV) * x[k]: two sets of accumulators (even and odd
// k) so that the FMA chains overlap; unrolled, the accumulators stay in registers.
template <int NV>
__attribute__((target("avx512f"), always_inline)) inline void axpy_rows(const float* rows, int64_t stride,
                                                                        const float* x, int64_t n, const float* b,
                                                                        __m512* out) {
  __m512 a0[NV], a1[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) a0[v] = _mm512_loadu_ps(b + 16 * v), a1[v] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 2 <= n; k += 2) {
    const __m512 x0 = _mm512_set1_ps(x[k]), x1 = _mm512_set1_ps(x[k + 1]);
    const float* r0 = rows + k * stride;
    const float* r1 = r0 + stride;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      a0[v] = _mm512_fmadd_ps(_mm512_loadu_ps(r0 + 16 * v), x0, a0[v]);
      a1[v] = _mm512_fmadd_ps(_mm512_loadu_ps(r1 + 16 * v), x1, a1[v]);
    }
  }
  if (k < n) {
    const __m512 x0 = _mm512_set1_ps(x[k]);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) a0[v] = _mm512_fmadd_ps(_mm512_loadu_ps(rows + k * stride + 16 * v), x0, a0[v]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) out[v] = _mm512_add_ps(a0[v], a1[v]);
}

// The same for a runtime count of vectors (1..8).
__attribute__((target("avx512f"))) void axpy_rows_n(int nv, const float* rows, int64_t stride, const float* x,
                                                    int64_t n, const float* b, __m512* out) {
  switch (nv) {
    case 1: return axpy_rows<1>(rows, stride, x, n, b, out);
    case 2: return axpy_rows<2>(rows, stride, x, n, b, out);
    case 3: return axpy_rows<3>(rows, stride, x, n, b, out);
    case 4: return axpy_rows<4>(rows, stride, x, n, b, out);
    case 5: return axpy_rows<5>(rows, stride, x, n, b, out);
    case 6: return axpy_rows<6>(rows, stride, x, n, b, out);
    case 7: return axpy_rows<7>(rows, stride, x, n, b, out);
    default: return axpy_rows<8>(rows, stride, x, n, b, out);
  }
}

__attribute__((target("avx512f"))) void excite_avx512(const SeShape& s, const float* packed, const float* p,
                                                      float* out) {
  const int64_t cs16 = up16(s.cs), c2p = up16(s.c2);
  const float* w1 = packed;
  const float* b1 = w1 + s.c * cs16;
  const float* w2 = b1 + cs16;
  const float* b2 = w2 + s.cs * c2p;
  alignas(64) float h[64 * 16];  // cs16 <= 1024 (se_excite checks)
  __m512 acc[8];
  // h = act(W1 p + b1): the rows of W1 (as [c][cs16]) weighted by p, up to 8 vectors of outputs at a time.
  for (int64_t j = 0; j < cs16; j += 128) {
    const int nv = static_cast<int>(std::min<int64_t>(8, (cs16 - j) / 16));
    axpy_rows_n(nv, w1 + j, cs16, p, s.c, b1 + j, acc);
    for (int v = 0; v < nv; ++v)
      _mm512_storeu_ps(h + j + 16 * v, s.silu ? silu16(acc[v]) : _mm512_max_ps(acc[v], _mm512_setzero_ps()));
  }
  // out = gate(W2 h + b2): the rows of W2 (as [cs][c2p]) weighted by h.
  const __m512 ga = _mm512_set1_ps(s.gate_alpha), gb = _mm512_set1_ps(s.gate_beta);
  for (int64_t m = 0; m < c2p; m += 128) {
    const int nv = static_cast<int>(std::min<int64_t>(8, (c2p - m) / 16));
    axpy_rows_n(nv, w2 + m, c2p, h, s.cs, b2 + m, acc);
    for (int v = 0; v < nv; ++v) {
      const int64_t at = m + 16 * v;
      const __m512 y = s.hard_gate ? _mm512_min_ps(_mm512_max_ps(_mm512_fmadd_ps(acc[v], ga, gb), _mm512_setzero_ps()),
                                                   _mm512_set1_ps(1.f))
                                   : sigmoid16(acc[v]);
      if (at + 16 <= s.c2) _mm512_storeu_ps(out + at, y);
      else _mm512_mask_storeu_ps(out + at, static_cast<__mmask16>((1u << (s.c2 - at)) - 1), y);
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace

size_t se_packed_floats(const SeShape& s) {
  const int64_t cs16 = up16(s.cs), c2p = up16(s.c2);
  return static_cast<size_t>(s.c * cs16 + cs16 + s.cs * c2p + c2p);
}

void se_pack(const SeShape& s, const float* w1, const float* b1, const float* w2, const float* b2, float* packed) {
  const int64_t cs16 = up16(s.cs), c2p = up16(s.c2);
  std::fill(packed, packed + se_packed_floats(s), 0.f);
  float* pw1 = packed;
  float* pb1 = pw1 + s.c * cs16;
  float* pw2 = pb1 + cs16;
  float* pb2 = pw2 + s.cs * c2p;
  for (int64_t j = 0; j < s.cs; ++j) {
    for (int64_t c = 0; c < s.c; ++c) pw1[c * cs16 + j] = w1[j * s.c + c];
    pb1[j] = b1 ? b1[j] : 0.f;
  }
  for (int64_t m = 0; m < s.c2; ++m) {
    for (int64_t j = 0; j < s.cs; ++j) pw2[j * c2p + m] = w2[m * s.cs + j];
    pb2[m] = b2 ? b2[m] : 0.f;
  }
}

void se_excite(const SeShape& s, const float* packed, const float* p, float* out, bool vector) {
  if (vector && has_avx512f() && up16(s.cs) <= 1024) {
    excite_avx512(s, packed, p, out);
    return;
  }
  const int64_t cs16 = up16(s.cs), c2p = up16(s.c2);
  const float* w1 = packed;
  const float* b1 = w1 + s.c * cs16;
  const float* w2 = b1 + cs16;
  const float* b2 = w2 + s.cs * c2p;
  std::vector<float> h(static_cast<size_t>(s.cs));
  for (int64_t j = 0; j < s.cs; ++j) {
    float a = b1[j];
    for (int64_t c = 0; c < s.c; ++c) a += w1[c * cs16 + j] * p[c];
    h[j] = s.silu ? (a < -87.f ? 0.f : a / (1.f + std::exp(-a))) : std::max(a, 0.f);
  }
  for (int64_t m = 0; m < s.c2; ++m) {
    float a = b2[m];
    for (int64_t j = 0; j < s.cs; ++j) a += w2[j * c2p + m] * h[j];
    out[m] = s.hard_gate ? std::min(std::max(s.gate_alpha * a + s.gate_beta, 0.f), 1.f)
             : a < -87.f ? 0.f
                         : 1.f / (1.f + std::exp(-a));
  }
}

void se_excite_reference(const SeShape& s, const float* w1, const float* b1, const float* w2, const float* b2,
                         const float* p, float* out) {
  std::vector<double> h(static_cast<size_t>(s.cs));
  for (int64_t j = 0; j < s.cs; ++j) {
    double a = b1 ? b1[j] : 0.0;
    for (int64_t c = 0; c < s.c; ++c) a += static_cast<double>(w1[j * s.c + c]) * p[c];
    h[j] = s.silu ? a / (1.0 + std::exp(-a)) : std::max(a, 0.0);
  }
  for (int64_t m = 0; m < s.c2; ++m) {
    double a = b2 ? b2[m] : 0.0;
    for (int64_t j = 0; j < s.cs; ++j) a += static_cast<double>(w2[m * s.cs + j]) * h[j];
    out[m] = static_cast<float>(s.hard_gate ? std::min(std::max(s.gate_alpha * a + s.gate_beta, 0.0), 1.0)
                                            : 1.0 / (1.0 + std::exp(-a)));
  }
}

}  // namespace keel::onednn
