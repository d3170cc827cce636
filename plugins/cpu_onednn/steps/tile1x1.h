// plugins/cpu_onednn/steps/tile1x1.h — (internal) a register tile of a 1x1 convolution over nChw16c-like source rows
// with its bias, an optional residual and one activation: the inner kernel of the chains' own expand_dw step (its
// expansion and projection, steps/expand_dw.h) and of the 1x1 step (steps/pointwise.h). Include only from files
// compiled for x86-64; the functions carry their own target attribute, so callers check has_avx512f() first.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "steps/expand_dw.h"
#include "steps/silu16.h"

namespace keel::onednn {

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // the arrays of vectors, set in full by the unrolled loops

__attribute__((target("avx512f"), always_inline)) inline __m512 act16(const ExpandDwAct& a, __m512 x) {
  switch (a.kind) {
    case ExpandDwAct::kNone: return x;
    case ExpandDwAct::kRelu: return _mm512_max_ps(x, _mm512_setzero_ps());
    case ExpandDwAct::kClip: return _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(a.lo)), _mm512_set1_ps(a.hi));
    case ExpandDwAct::kHardSwish: {
      const __m512 r =
          _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(x, _mm512_set1_ps(3.f)), _mm512_setzero_ps()), _mm512_set1_ps(6.f));
      return _mm512_mul_ps(_mm512_mul_ps(x, r), _mm512_set1_ps(1.f / 6.f));
    }
    case ExpandDwAct::kSilu: return silu16(x);
  }
  return x;
}

// T pixels x NV * 16 output channels of a 1x1 convolution over one row (the expansion, or the projection):
// out[v * out_stride + t * 16 + lane] = act(bias + sum over k < c of src[(k / 16) * block_stride + t * 16 + k % 16] *
// U[k * NV * 16 + v * 16 + lane] (+ res[v * out_stride + t * 16 + lane] when res is not null)).
// With PF, `pf_lines` cache lines from `pf` on are prefetched into L2 meanwhile, spread over the input channels (the
// weights a later tile reads first, which would otherwise come from memory when it starts: Prefetch). expand_tile and
// expand_tile_pf below are its two instances: in one kernel the prefetch's bookkeeping, even unused, cost 9% on
// MobileNetV2's 16-channel expansion, whose tiles are short.
template <int T, int NV, bool PF>
__attribute__((target("avx512f"), always_inline)) inline void expand_tile_body(
    const float* src, int64_t block_stride, int64_t c, const float* U, const float* bias, const ExpandDwAct& act,
    float* out, int64_t out_stride, const float* res, const char* pf, int64_t pf_lines) {
  const int64_t pf_per_block = PF && pf_lines > 0 ? (pf_lines + (c + 15) / 16 - 1) / ((c + 15) / 16) : 0;
  __m512 acc[T][NV];
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v) {
    const __m512 b = _mm512_loadu_ps(bias + v * 16);
#pragma GCC unroll 14
    for (int t = 0; t < T; ++t) acc[t][v] = b;
  }
  for (int64_t k0 = 0; k0 < c; k0 += 16) {
    const float* a = src + (k0 / 16) * block_stride;
    const float* u = U + k0 * NV * 16;
    const int kn = static_cast<int>(std::min<int64_t>(16, c - k0));
    if constexpr (PF)
      for (int64_t i = 0; i < pf_per_block && pf_lines > 0; ++i, --pf_lines, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
#pragma GCC unroll 2
    for (int k = 0; k < kn; ++k) {
      __m512 b[NV];
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(u + (k * NV + v) * 16);
#pragma GCC unroll 14
      for (int t = 0; t < T; ++t) {
        const __m512 x = _mm512_set1_ps(a[t * 16 + k]);
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) acc[t][v] = _mm512_fmadd_ps(x, b[v], acc[t][v]);
      }
    }
  }
  if (res != nullptr) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
#pragma GCC unroll 14
      for (int t = 0; t < T; ++t) acc[t][v] = _mm512_add_ps(acc[t][v], _mm512_loadu_ps(res + v * out_stride + t * 16));
  }
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v)
#pragma GCC unroll 14
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + v * out_stride + t * 16, act16(act, acc[t][v]));
}

template <int T, int NV>
__attribute__((target("avx512f"))) void expand_tile(const float* src, int64_t block_stride, int64_t c, const float* U,
                                                    const float* bias, const ExpandDwAct& act, float* out,
                                                    int64_t out_stride, const float* res) {
  expand_tile_body<T, NV, false>(src, block_stride, c, U, bias, act, out, out_stride, res, nullptr, 0);
}
template <int T, int NV>
__attribute__((target("avx512f"))) void expand_tile_pf(const float* src, int64_t block_stride, int64_t c,
                                                       const float* U, const float* bias, const ExpandDwAct& act,
                                                       float* out, int64_t out_stride, const float* res, const char* pf,
                                                       int64_t pf_lines) {
  expand_tile_body<T, NV, true>(src, block_stride, c, U, bias, act, out, out_stride, res, pf, pf_lines);
}

#pragma GCC diagnostic pop

// Cache lines to prefetch into L2 while tiles run (the weights a later tile reads first): `lines` lines from `at` on.
struct Prefetch {
  const char* at = nullptr;
  int64_t lines = 0;
  // (n + 63) / 64 lines from p on, the n bytes where p is 64-byte aligned as packed weights are (none for a null p).
  static Prefetch bytes(const void* p, int64_t n) { return {static_cast<const char*>(p), p ? (n + 63) / 64 : 0}; }
  // Part i of `parts` in order (part i starts where part i - 1 ended), for the i-th of `parts` calls to share them.
  Prefetch part(int64_t i, int64_t parts) const {
    if (lines <= 0 || parts <= 0) return {};
    const int64_t l0 = lines * i / parts, l1 = lines * (i + 1) / parts;
    return {at + l0 * 64, l1 - l0};
  }
  // All of them now.
  void now() const {
    for (int64_t l = 0; l < lines; ++l) _mm_prefetch(at + l * 64, _MM_HINT_T1);
  }
};

// expand_tile's instance for `tiles` pixels (1..14) by `nv` 16-channel vectors (1 or 2), and expand_tile_pf's.
using ExpandTileFn = decltype(&expand_tile<1, 1>);
using ExpandTilePfFn = decltype(&expand_tile_pf<1, 1>);
template <int NV, int... T>
constexpr ExpandTileFn expand_tile_of(int t, std::integer_sequence<int, T...>) {
  constexpr ExpandTileFn fns[] = {expand_tile<T + 1, NV>...};
  return fns[t - 1];
}
template <int NV, int... T>
constexpr ExpandTilePfFn expand_tile_pf_of(int t, std::integer_sequence<int, T...>) {
  constexpr ExpandTilePfFn fns[] = {expand_tile_pf<T + 1, NV>...};
  return fns[t - 1];
}
inline ExpandTileFn expand_tile_fn(int tiles, int nv) {
  using Seq = std::make_integer_sequence<int, 14>;
  return nv == 2 ? expand_tile_of<2>(tiles, Seq{}) : expand_tile_of<1>(tiles, Seq{});
}
inline ExpandTilePfFn expand_tile_pf_fn(int tiles, int nv) {
  using Seq = std::make_integer_sequence<int, 14>;
  return nv == 2 ? expand_tile_pf_of<2>(tiles, Seq{}) : expand_tile_pf_of<1>(tiles, Seq{});
}

// One tile of `tiles` pixels by `nv` vectors: expand_tile_pf's instance where `pf` has lines to prefetch, else
// expand_tile's.
inline void expand_tile_run(int tiles, int nv, const float* src, int64_t block_stride, int64_t c, const float* U,
                            const float* bias, const ExpandDwAct& act, float* out, int64_t out_stride, const float* res,
                            const Prefetch& pf) {
  if (pf.lines > 0)
    expand_tile_pf_fn(tiles, nv)(src, block_stride, c, U, bias, act, out, out_stride, res, pf.at, pf.lines);
  else expand_tile_fn(tiles, nv)(src, block_stride, c, U, bias, act, out, out_stride, res);
}

}  // namespace keel::onednn
