// plugins/cpu_onednn/steps/expand_dw.cc — a 1x1 convolution and its k x k depthwise reader in one pass over nChw16c
// (steps/expand_dw.h).
//
// Per thread: output rows in order; for each, the (up to k) expanded rows it reads are computed into a ring of k
// slots unless already there (slot = input row mod k, so the rows of one output row never evict each other), then the
// depthwise output row from the slots, one 32-channel group at a time (the group's part of the slots stays in L1
// from its expansion to its depthwise convolution). Rows outside the image are skipped taps, columns outside it the
// slots' zero columns. Registers: the expansion 14 pixels x 2 vectors of accumulators (the products at the FMA rate:
// 24 -> 144 at 56x56 200 GFLOP/s on one core of the AMD EPYC host), the depthwise 8 (stride 1) or 6 (stride 2)
// output pixels with the input columns of each row loaded once (and, for 3x3, the 9 weight vectors). Expanded
// channels past m (to the next multiple of 16) get zero weights and biases, so they hold act(0) = 0 throughout.
#include "steps/expand_dw.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "common/bf16.h"
#include "common/team.h"
#include "steps/pack_groups.h"
#include "steps/silu.h"
#include "steps/silu16.h"
#include "steps/tile1x1.h"

namespace keel::onednn {
namespace {

constexpr int kTile = 14;                             // pixels per register tile of the expansion (14 x 2 accumulators)
constexpr int64_t kMinRowsPerThread = 7;              // fewer: the team splits channel groups instead of rows
constexpr int64_t kAtOnceMinWeightBytes = 640 << 10;  // rows at once: the two 1x1s' weights more than this
constexpr int64_t kAtOnceMinWeightBytesOneThread = 384 << 10;  // (this for a team of one),
constexpr int64_t kAtOnceMaxOutBytes = 512 << 10;              // the image's depthwise output at most this

int64_t blocks_of(int64_t c) { return (c + 15) / 16; }
int64_t padded_m(const ExpandDwShape& s) { return 16 * blocks_of(s.m); }
int64_t padded_proj(const ExpandDwShape& s) { return 16 * blocks_of(s.proj); }
// A 1x1's (or a stem's) weights w [outs][ins] into the f32 tile kernels' layout (steps/pack_groups.h, K = 1).
void pack_groups_f32(const float* w, int64_t outs, int64_t ins, float* to) {
  pack_groups<1>(w, outs, ins, ins, to, [](float v) { return v; });
}
int64_t pad_of(const ExpandDwShape& s) { return s.k / 2; }
int64_t ring_width(const ExpandDwShape& s) { return s.ew() + 2 * pad_of(s); }    // zero columns on both sides
int64_t first_inputs(const ExpandDwShape& s) { return s.stem ? 9 * s.c : s.c; }  // the first weights' inputs
int64_t stem_row_floats(const ExpandDwShape& s) { return s.stem ? 3 * s.c * (s.w + 2) : 0; }
int64_t ring_row_floats(const ExpandDwShape& s) { return padded_m(s) * ring_width(s); }

float act_scalar(const ExpandDwAct& a, float x) {
  switch (a.kind) {
    case ExpandDwAct::kNone: return x;
    case ExpandDwAct::kRelu: return x > 0.f ? x : 0.f;
    case ExpandDwAct::kClip: return std::min(std::max(x, a.lo), a.hi);
    case ExpandDwAct::kHardSwish: return x * std::min(std::max(x + 3.f, 0.f), 6.f) * (1.f / 6.f);
    case ExpandDwAct::kSilu: return static_cast<float>(x / (1.0 + std::exp(-static_cast<double>(x))));
  }
  return x;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// T pixels x NV * 16 channels of a stem row (3x3, stride 2, over the zero-padded input rows buf [c][3][w+2], buf
// pointing at the first pixel's leftmost column): out[v * out_stride + t * 16 + lane] = act(bias + sum over ci, dy,
// dx of buf[(ci * 3 + dy) * bstride + 2 t + dx] * U[((ci * 3 + dy) * 3 + dx) * NV * 16 + v * 16 + lane]).
template <int T, int NV>
__attribute__((target("avx512f"))) void stem_tile(const float* buf, int64_t bstride, int64_t c, const float* U,
                                                  const float* bias, const ExpandDwAct& act, float* out,
                                                  int64_t out_stride) {
  __m512 acc[T][NV];
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v) {
    const __m512 b = _mm512_loadu_ps(bias + v * 16);
#pragma GCC unroll 14
    for (int t = 0; t < T; ++t) acc[t][v] = b;
  }
  for (int64_t r = 0; r < 3 * c; ++r) {  // (input channel, dy)
    const float* a = buf + r * bstride;
    const float* u = U + r * 3 * NV * 16;
#pragma GCC unroll 3
    for (int dx = 0; dx < 3; ++dx) {
      __m512 b[NV];
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(u + (dx * NV + v) * 16);
#pragma GCC unroll 14
      for (int t = 0; t < T; ++t) {
        const __m512 x = _mm512_set1_ps(a[2 * t + dx]);
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) acc[t][v] = _mm512_fmadd_ps(x, b[v], acc[t][v]);
      }
    }
  }
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v)
#pragma GCC unroll 14
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + v * out_stride + t * 16, act16(act, acc[t][v]));
}

// The tile kernels by pixel count (1..kTile) and 16-channel vectors (1 or 2): Kernel::fn<T, NV> is the instance.
template <class Kernel, int NV, int... T>
constexpr auto tile_of(int t, std::integer_sequence<int, T...>) {
  constexpr decltype(Kernel::template fn<1, NV>) fns[] = {Kernel::template fn<T + 1, NV>...};
  return fns[t - 1];
}
template <class Kernel>
auto tile_fn(int tiles, int nv) {
  using Seq = std::make_integer_sequence<int, kTile>;
  return nv == 2 ? tile_of<Kernel, 2>(tiles, Seq{}) : tile_of<Kernel, 1>(tiles, Seq{});
}
struct StemTiles {
  template <int T, int NV>
  static constexpr auto fn = stem_tile<T, NV>;
};
auto stem_fn(int tiles, int nv) { return tile_fn<StemTiles>(tiles, nv); }

#define KEEL_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// acc += the products of a's and b's bf16 pairs (vdpbf16ps). Written in asm: GCC 12 compiles the intrinsic over an
// array of accumulators with a register copy in and out of each (as it does vpdpbusd: steps/int8_expand_dw.cc).
KEEL_BF16 inline void dpbf16(__m512& acc, __m512i a, __m512i b) {
  asm("vdpbf16ps %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "v"(b));
}
KEEL_BF16 inline __m512 load_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
KEEL_BF16 inline void store_bf16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// expand_tile over bf16: src and res bf16, U the group's weights as bf16 pairs [c/2][NV * 16][2] (c even), out f32
// (a ring row) or, with OutBf16, bf16.
template <int T, int NV, bool OutBf16>
KEEL_BF16 void expand_tile_bf16(const uint16_t* src, int64_t block_stride, int64_t c, const uint16_t* U,
                                const float* bias, const ExpandDwAct& act, void* out, int64_t out_stride,
                                const uint16_t* res) {
  __m512 acc[T][NV];
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v) {
    const __m512 b = _mm512_loadu_ps(bias + v * 16);
#pragma GCC unroll 14
    for (int t = 0; t < T; ++t) acc[t][v] = b;
  }
  for (int64_t k0 = 0; k0 < c; k0 += 16) {
    const uint16_t* a = src + (k0 / 16) * block_stride;
    const uint16_t* u = U + k0 * NV * 16;
    const int pairs = static_cast<int>(std::min<int64_t>(16, c - k0) / 2);
    for (int k = 0; k < pairs; ++k) {
      __m512i b[NV];
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_si512(u + (k * NV + v) * 32);
#pragma GCC unroll 14
      for (int t = 0; t < T; ++t) {
        int32_t two;
        std::memcpy(&two, a + t * 16 + 2 * k, 4);
        const __m512i x = _mm512_set1_epi32(two);
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) dpbf16(acc[t][v], x, b[v]);
      }
    }
  }
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v)
#pragma GCC unroll 14
    for (int t = 0; t < T; ++t) {
      __m512 r = acc[t][v];
      if (res != nullptr) r = _mm512_add_ps(r, load_bf16(res + v * out_stride + t * 16));
      r = act16(act, r);
      if constexpr (OutBf16) store_bf16(static_cast<uint16_t*>(out) + v * out_stride + t * 16, r);
      else _mm512_storeu_ps(static_cast<float*>(out) + v * out_stride + t * 16, r);
    }
}
template <bool OutBf16>
struct ExpandTilesBf16 {
  template <int T, int NV>
  static constexpr auto fn = expand_tile_bf16<T, NV, OutBf16>;
};
auto expand_bf16_fn(int tiles, int nv) { return tile_fn<ExpandTilesBf16<false>>(tiles, nv); }
auto project_bf16_fn(int tiles, int nv) { return tile_fn<ExpandTilesBf16<true>>(tiles, nv); }

bool cpu_has_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

// NX output pixels of one 16-channel block from the K ring rows (null: outside the image, skipped), the input columns
// of each row loaded once: out[j * 16 + lane] = act(bias + sum over dy, dx of rows[dy][col + (j * S + dx) * 16 +
// lane] * w[dy * K + dx]), the weights from registers (wv, 3x3) or memory (wd, 5x5: 25 would not fit beside them).
template <int NX, int S, int K>
__attribute__((target("avx512f"), always_inline)) inline void dw_tile(const float* const* rows, int64_t col,
                                                                      const __m512* wv, const float* wd, __m512 bias,
                                                                      const ExpandDwAct& act, float* out) {
  constexpr int kCols = (NX - 1) * S + K;
  __m512 acc[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) acc[j] = bias;
#pragma GCC unroll 5
  for (int dy = 0; dy < K; ++dy) {
    if (rows[dy] == nullptr) continue;
    const float* r = rows[dy] + col;
    __m512 in[kCols];
#pragma GCC unroll 16
    for (int i = 0; i < kCols; ++i) in[i] = _mm512_loadu_ps(r + i * 16);
#pragma GCC unroll 5
    for (int dx = 0; dx < K; ++dx) {
      const __m512 w = K == 3 ? wv[dy * 3 + dx] : _mm512_loadu_ps(wd + (dy * K + dx) * 16);
#pragma GCC unroll 8
      for (int j = 0; j < NX; ++j) acc[j] = _mm512_fmadd_ps(in[j * S + dx], w, acc[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) _mm512_storeu_ps(out + j * 16, act16(act, acc[j]));
}

// The last `rem` (< N) pixels of a row.
template <int N, int S, int K>
__attribute__((target("avx512f"), always_inline)) inline void dw_tail(int rem, const float* const* rows, int64_t col,
                                                                      const __m512* wv, const float* wd, __m512 bias,
                                                                      const ExpandDwAct& act, float* out) {
  if constexpr (N > 0) {
    if (rem == N) return dw_tile<N, S, K>(rows, col, wv, wd, bias, act, out);
    dw_tail<N - 1, S, K>(rem, rows, col, wv, wd, bias, act, out);
  }
}

// One output row of one 16-channel block: rows[dy] point at the block's ring column 0 (the first zero column left of
// the image), wd its K * K weight vectors, b its bias; ow pixels into out.
template <int S, int K>
__attribute__((target("avx512f"))) void dw_row(const float* const* rows, const float* wd, const float* b,
                                               const ExpandDwAct& act, float* out, int64_t ow) {
  constexpr int NX = S == 1 ? 8 : 6;  // registers: NX accumulators, (NX - 1) S + K columns, 9 weights for 3x3
  __m512 wv[9];
  if constexpr (K == 3) {
#pragma GCC unroll 9
    for (int t = 0; t < 9; ++t) wv[t] = _mm512_loadu_ps(wd + t * 16);
  }
  const __m512 bias = _mm512_loadu_ps(b);
  int64_t ox = 0;
  for (; ox + NX <= ow; ox += NX) dw_tile<NX, S, K>(rows, ox * S * 16, wv, wd, bias, act, out + ox * 16);
  if (ox < ow) dw_tail<NX - 1, S, K>(static_cast<int>(ow - ox), rows, ox * S * 16, wv, wd, bias, act, out + ox * 16);
}

using DwRowFn = void (*)(const float* const*, const float*, const float*, const ExpandDwAct&, float*, int64_t);
DwRowFn dw_row_fn(int64_t stride, int64_t k) {
  if (k == 5) return stride == 2 ? dw_row<2, 5> : dw_row<1, 5>;
  return stride == 2 ? dw_row<2, 3> : dw_row<1, 3>;
}

#pragma GCC diagnostic pop

struct Packed {
  const float *u, *wd, *b1, *b2, *up, *b3;
  const uint16_t *u16, *up16;  // bf16: the 1x1s' weights as bf16 pairs
};
size_t f32_packed_floats(const ExpandDwShape& s) {
  return static_cast<size_t>((first_inputs(s) + s.k * s.k + 2) * padded_m(s) + (s.m + 1) * padded_proj(s));
}
Packed parts(const ExpandDwShape& s, const float* packed) {
  const int64_t mp = padded_m(s);
  const float* wd = packed + first_inputs(s) * mp;
  const float* up = wd + (s.k * s.k + 2) * mp;
  const uint16_t* u16 = reinterpret_cast<const uint16_t*>(packed + f32_packed_floats(s));
  return {packed,        wd, wd + s.k * s.k * mp, wd + (s.k * s.k + 1) * mp, up, up + s.m * padded_proj(s), u16,
          u16 + s.c * mp};
}

KEEL_BF16 void zero_bf16_lanes(uint16_t* p, __mmask16 m) { _mm256_mask_storeu_epi16(p, m, _mm256_setzero_si256()); }
// f32 -> bf16, n values (a multiple of 16).
KEEL_BF16 void to_bf16_row(const float* from, uint16_t* to, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) store_bf16(to + i, _mm512_loadu_ps(from + i));
}

// The projection of one depthwise output row (row: [mp/16][ow][16]) into output row oy of image img of dst, the
// source row added when s.residual; a partial last block's padding lanes written 0.
__attribute__((target("avx512f"))) void project_row(const ExpandDwShape& s, const float* src, const Packed& p,
                                                    const float* row, int64_t img, int64_t oy, float* dst) {
  const int64_t oh = s.oh(), ow = s.ow(), pb = blocks_of(s.proj);
  if (s.bf16) {  // row: the depthwise row as bf16 [mp/16][ow][16]; src, dst bf16
    const uint16_t* src16 = reinterpret_cast<const uint16_t*>(src);
    uint16_t* dst16 = reinterpret_cast<uint16_t*>(dst);
    const uint16_t* row16 = reinterpret_cast<const uint16_t*>(row);
    const int64_t mp = padded_m(s);
    for (int64_t g = 0; g < groups_of(padded_proj(s)); ++g) {
      const int nv = static_cast<int>(group_width(padded_proj(s), g) / 16);
      const uint16_t* U = p.up16 + 32 * mp * g;  // groups before g are all 32 wide
      uint16_t* out = dst16 + ((img * pb + 2 * g) * oh + oy) * ow * 16;
      const uint16_t* res = s.residual ? src16 + ((img * pb + 2 * g) * s.h + oy) * s.w * 16 : nullptr;
      for (int64_t x0 = 0; x0 < ow; x0 += kTile) {
        const int t = static_cast<int>(std::min<int64_t>(kTile, ow - x0));
        project_bf16_fn(t, nv)(row16 + x0 * 16, ow * 16, mp, U, p.b3 + 32 * g, s.act3, out + x0 * 16, oh * ow * 16,
                               res ? res + x0 * 16 : nullptr);
      }
    }
    if (s.proj % 16 != 0) {
      const __mmask16 pad = static_cast<__mmask16>(0xFFFFu << (s.proj % 16));
      uint16_t* out = dst16 + ((img * pb + pb - 1) * oh + oy) * ow * 16;
      for (int64_t x = 0; x < ow; ++x) zero_bf16_lanes(out + x * 16, pad);
    }
    return;
  }
  for (int64_t g = 0; g < groups_of(padded_proj(s)); ++g) {
    const int nv = static_cast<int>(group_width(padded_proj(s), g) / 16);
    const float* U = p.up + 32 * s.m * g;  // groups before g are all 32 wide
    float* out = dst + ((img * pb + 2 * g) * oh + oy) * ow * 16;
    const float* res = s.residual ? src + ((img * pb + 2 * g) * s.h + oy) * s.w * 16 : nullptr;
    for (int64_t x0 = 0; x0 < ow; x0 += kTile) {
      const int t = static_cast<int>(std::min<int64_t>(kTile, ow - x0));
      expand_tile_fn(t, nv)(row + x0 * 16, ow * 16, s.m, U, p.b3 + 32 * g, s.act3, out + x0 * 16, oh * ow * 16,
                            res ? res + x0 * 16 : nullptr);
    }
  }
  if (s.proj % 16 != 0) {  // nChw16c's padding: the residual's lanes there are not ours to trust
    const __mmask16 pad = static_cast<__mmask16>(0xFFFFu << (s.proj % 16));
    float* out = dst + ((img * pb + pb - 1) * oh + oy) * ow * 16;
    for (int64_t x = 0; x < ow; ++x) _mm512_mask_storeu_ps(out + x * 16, pad, _mm512_setzero_ps());
  }
}

// Stem row iy of image img, channel group g, into ring slot `row`: the three input rows it reads, zero-padded, into
// buf first ([c][3][w+2]).
void stem_row(const ExpandDwShape& s, const float* src, const Packed& p, int64_t img, int64_t iy, int64_t g, float* row,
              float* buf) {
  const int64_t wb = s.w + 2, wp = ring_width(s), ew = s.ew();
  for (int64_t ci = 0; ci < s.c; ++ci)
    for (int64_t dy = 0; dy < 3; ++dy) {
      float* b = buf + (ci * 3 + dy) * wb;
      const int64_t y = 2 * iy - 1 + dy;
      if (y < 0 || y >= s.h) {
        std::fill(b, b + wb, 0.f);
        continue;
      }
      b[0] = 0.f, b[wb - 1] = 0.f;
      std::copy_n(src + ((img * s.c + ci) * s.h + y) * s.w, s.w, b + 1);
    }
  const int nv = static_cast<int>(group_width(padded_m(s), g) / 16);
  const float* U = p.u + 32 * first_inputs(s) * g;
  float* out = row + (2 * g * wp + pad_of(s)) * 16;
  for (int64_t x0 = 0; x0 < ew; x0 += kTile) {
    const int t = static_cast<int>(std::min<int64_t>(kTile, ew - x0));
    stem_fn(t, nv)(buf + 2 * x0, wb, s.c, U, p.b1 + 32 * g, s.act1, out + x0 * 16, wp * 16);
  }
}

// Expanded row iy of image img, channel group g, into ring slot `row` ([m/16][w+2p][16], columns p..p+w-1), the
// group's channels where group `at` (>= 0; else g) lies in it; prefetching `pf` meanwhile (f32 only).
void expand_row(const ExpandDwShape& s, const float* src, const Packed& p, int64_t img, int64_t iy, int64_t g,
                float* row, float* buf, int64_t at = -1, const Prefetch& pf = {}) {
  if (s.stem) return stem_row(s, src, p, img, iy, g, row, buf);  // (never with `at`)
  const int64_t cb = blocks_of(s.c), wp = ring_width(s);
  if (s.bf16) {
    const uint16_t* in = reinterpret_cast<const uint16_t*>(src) + (img * cb * s.h + iy) * s.w * 16;
    const int nv = static_cast<int>(group_width(padded_m(s), g) / 16);
    const uint16_t* U = p.u16 + 32 * s.c * g;
    float* out = row + (2 * (at < 0 ? g : at) * wp + pad_of(s)) * 16;
    for (int64_t x0 = 0; x0 < s.w; x0 += kTile) {
      const int t = static_cast<int>(std::min<int64_t>(kTile, s.w - x0));
      expand_bf16_fn(t, nv)(in + x0 * 16, s.h * s.w * 16, s.c, U, p.b1 + 32 * g, s.act1, out + x0 * 16, wp * 16,
                            nullptr);
    }
    return;
  }
  const float* in = src + (img * cb * s.h + iy) * s.w * 16;
  const int nv = static_cast<int>(group_width(padded_m(s), g) / 16);
  const float* U = p.u + 32 * s.c * g;  // groups before g are all 32 wide
  float* out = row + (2 * (at < 0 ? g : at) * wp + pad_of(s)) * 16;
  const int64_t tiles = (s.w + kTile - 1) / kTile;
  for (int64_t x0 = 0, i = 0; x0 < s.w; x0 += kTile, ++i) {
    const int t = static_cast<int>(std::min<int64_t>(kTile, s.w - x0));
    expand_tile_run(t, nv, in + x0 * 16, s.h * s.w * 16, s.c, U, p.b1 + 32 * g, s.act1, out + x0 * 16, wp * 16, nullptr,
                    pf.part(i, tiles));
  }
}

// Output rows [r0, r1) of the n * oh (image-major), channel groups [g0, g1), on the calling thread; ring: k slots
// of ring_row_floats(s). Per output row and group, the group's missing expanded rows, then its two depthwise output
// rows: the group's part of the k slots (k x (w+2p) x 32 floats) stays in L1 between the two.
void run_part(const ExpandDwShape& s, const float* src, const Packed& p, float* dst, float* ring, int64_t r0,
              int64_t r1, int64_t g0, int64_t g1) {
  constexpr int kMaxK = 5;
  const int64_t rowf = ring_row_floats(s), wp = ring_width(s), pad = pad_of(s), oh = s.oh(), ow = s.ow();
  const int64_t mb = blocks_of(s.m), k = s.k;
  // [mp/16][ow][16]: the depthwise row to project (bf16: every depthwise row, rounded from here into dst or, as bf16
  // again, into row16 for the projection).
  float* proj_row = s.proj > 0 || s.bf16 ? ring + k * rowf : nullptr;
  uint16_t* row16 = reinterpret_cast<uint16_t*>(ring + k * rowf + padded_m(s) * ow);
  float* stem_buf = ring + k * rowf + (proj_row ? padded_m(s) * ow : 0);  // [c][3][w+2]: a stem's input rows
  for (int64_t slot = 0; slot < k; ++slot)
    for (int64_t ob = 2 * g0; ob < std::min(2 * g1, mb); ++ob) {
      float* r = ring + slot * rowf + ob * wp * 16;
      std::fill(r, r + pad * 16, 0.f);
      std::fill(r + (pad + s.ew()) * 16, r + wp * 16, 0.f);
    }
  int64_t have_img[kMaxK], have_row[kMaxK];
  std::fill(have_img, have_img + kMaxK, -1);
  std::fill(have_row, have_row + kMaxK, -1);
  const DwRowFn dw = dw_row_fn(s.stride, k);
  for (int64_t flat = r0; flat < r1; ++flat) {
    const int64_t img = flat / oh, oy = flat % oh;
    float* slot_of[kMaxK] = {};
    int64_t compute_row[kMaxK];  // per dy: the input row to expand into its slot first, or -1
    for (int64_t dy = 0; dy < k; ++dy) {
      compute_row[dy] = -1;
      const int64_t iy = oy * s.stride - pad + dy;
      if (iy < 0 || iy >= s.eh()) continue;
      const int64_t slot = iy % k;
      slot_of[dy] = ring + slot * rowf;
      if (have_img[slot] != img || have_row[slot] != iy) {
        compute_row[dy] = iy;
        have_img[slot] = img, have_row[slot] = iy;
      }
    }
    for (int64_t g = g0; g < g1; ++g) {
      for (int64_t dy = 0; dy < k; ++dy)
        if (compute_row[dy] >= 0) expand_row(s, src, p, img, compute_row[dy], g, slot_of[dy], stem_buf);
      for (int64_t ob = 2 * g; ob < std::min(2 * g + 2, mb); ++ob) {
        const float* rows[kMaxK];
        for (int64_t dy = 0; dy < k; ++dy) rows[dy] = slot_of[dy] ? slot_of[dy] + ob * wp * 16 : nullptr;
        float* out = proj_row ? proj_row + ob * ow * 16 : dst + ((img * mb + ob) * oh + oy) * ow * 16;
        dw(rows, p.wd + ob * k * k * 16, p.b2 + ob * 16, s.act2, out, ow);
        if (s.bf16 && s.proj == 0)
          to_bf16_row(out, reinterpret_cast<uint16_t*>(dst) + ((img * mb + ob) * oh + oy) * ow * 16, ow * 16);
      }
    }
    if (s.proj > 0 && s.bf16) {
      to_bf16_row(proj_row, row16, padded_m(s) * ow);
      project_row(s, src, p, reinterpret_cast<const float*>(row16), img, oy, dst);
    } else if (s.proj > 0) {
      project_row(s, src, p, proj_row, img, oy, dst);
    }
  }
}

// Floats of one expanded row of one group (two 16-channel blocks) in run_rows_at_once.
int64_t group_row_floats(const ExpandDwShape& s) { return 32 * ring_width(s); }

// Output rows [oy0, oy1) of image img at once (expand_dw_rows_at_once), on the calling thread: per 32-channel group,
// every expanded row they read (the group's weights from memory once, then from L1) into a ring of the group's rows
// alone, and the group's depthwise output rows; then the projection over their pixels as register tiles of up to 14
// (each output group's weights read once per tile, from L2). scratch: eh rows of group_row_floats, then the depthwise
// output [mp/16][(oy1 - oy0) * ow][16].
__attribute__((target("avx512f"))) void run_rows_at_once(const ExpandDwShape& s, const float* src, const Packed& p,
                                                         float* dst, float* scratch, int64_t img, int64_t oy0,
                                                         int64_t oy1) {
  constexpr int kMaxK = 5;
  const int64_t rowf = group_row_floats(s), wp = ring_width(s), pad = pad_of(s), oh = s.oh(), ow = s.ow();
  const int64_t mb = blocks_of(s.m), k = s.k, pix = oh * ow, p0 = oy0 * ow, np = (oy1 - oy0) * ow;
  const int64_t iy0 = std::max<int64_t>(0, oy0 * s.stride - pad),
                iy1 = std::min<int64_t>(s.eh(), (oy1 - 1) * s.stride - pad + k);  // expanded rows [iy0, iy1)
  float* dwo = scratch + s.eh() * rowf;
  for (int64_t r = 0; r < iy1 - iy0; ++r)
    for (int64_t ob = 0; ob < 2; ++ob) {
      float* z = scratch + r * rowf + ob * wp * 16;
      std::fill(z, z + pad * 16, 0.f);
      std::fill(z + (pad + s.ew()) * 16, z + wp * 16, 0.f);
    }
  const DwRowFn dw = dw_row_fn(s.stride, k);
  // The weights come from memory at every run (they do not stay in L2: expand_dw_rows_at_once), a group at a time:
  // while a group's rows are expanded, the next group's expansion weights are prefetched, and before its depthwise rows
  // a share of the projection's first group; while an output group is projected, the next one's weights.
  const int64_t ng = groups_of(padded_m(s)), npg = groups_of(padded_proj(s));
  const Prefetch proj0 = Prefetch::bytes(p.up, s.m * group_width(padded_proj(s), 0) * 4);
  for (int64_t g = 0; g < ng; ++g) {
    const Prefetch next_u =
        g + 1 < ng ? Prefetch::bytes(p.u + 32 * s.c * (g + 1), s.c * group_width(padded_m(s), g + 1) * 4) : Prefetch{};
    for (int64_t iy = iy0; iy < iy1; ++iy)
      expand_row(s, src, p, img, iy, g, scratch + (iy - iy0) * rowf, nullptr, 0, next_u.part(iy - iy0, iy1 - iy0));
    proj0.part(g, ng).now();
    for (int64_t ob = 2 * g; ob < std::min(2 * g + 2, mb); ++ob)
      for (int64_t oy = oy0; oy < oy1; ++oy) {
        const float* rows[kMaxK];
        for (int64_t dy = 0; dy < k; ++dy) {
          const int64_t iy = oy * s.stride - pad + dy;
          rows[dy] = iy < iy0 || iy >= iy1 ? nullptr : scratch + (iy - iy0) * rowf + (ob - 2 * g) * wp * 16;
        }
        dw(rows, p.wd + ob * k * k * 16, p.b2 + ob * 16, s.act2, dwo + (ob * np + (oy - oy0) * ow) * 16, ow);
      }
  }
  const int64_t pb = blocks_of(s.proj), tiles = (np + kTile - 1) / kTile;
  for (int64_t g = 0; g < npg; ++g) {
    const int nv = static_cast<int>(group_width(padded_proj(s), g) / 16);
    const float* U = p.up + 32 * s.m * g;  // groups before g are all 32 wide
    float* out = dst + ((img * pb + 2 * g) * pix + p0) * 16;
    const float* res = s.residual ? src + ((img * pb + 2 * g) * pix + p0) * 16 : nullptr;  // the same geometry
    const Prefetch next =
        g + 1 < npg ? Prefetch::bytes(U + 32 * s.m, s.m * group_width(padded_proj(s), g + 1) * 4) : Prefetch{};
    for (int64_t x0 = 0, i = 0; x0 < np; x0 += kTile, ++i) {
      const int t = static_cast<int>(std::min<int64_t>(kTile, np - x0));
      expand_tile_run(t, nv, dwo + x0 * 16, np * 16, s.m, U, p.b3 + 32 * g, s.act3, out + x0 * 16, pix * 16,
                      res ? res + x0 * 16 : nullptr, next.part(i, tiles));
    }
  }
  if (s.proj % 16 != 0) {  // nChw16c's padding: the residual's lanes there are not ours to trust
    const __mmask16 lanes = static_cast<__mmask16>(0xFFFFu << (s.proj % 16));
    float* out = dst + ((img * pb + pb - 1) * pix + p0) * 16;
    for (int64_t x = 0; x < np; ++x) _mm512_mask_storeu_ps(out + x * 16, lanes, _mm512_setzero_ps());
  }
}

}  // namespace

std::string expand_dw_check(const ExpandDwShape& s) {
  if (!has_avx512f()) return "no AVX-512";
  if (s.n < 1 || s.h < 1 || s.w < 1 || s.c < 1 || s.m < 1) return "empty source or no expanded channels";
  if (s.k != 3 && s.k != 5) return "depthwise kernel not 3x3 or 5x5";
  if (s.stride != 1 && s.stride != 2) return "depthwise stride not 1 or 2";
  if (s.proj < 0 || (s.residual && (s.proj != s.c || s.stride != 1 || s.stem))) return "a residual of another shape";
  if (s.stem && s.c > 8) return "a stem over more than 8 channels";
  if (s.bf16 && !cpu_has_bf16()) return "no AVX-512 BF16";
  if (s.bf16 && (s.stem || s.c % 2 != 0)) return "bf16 with a stem or an odd number of input channels";
  for (const ExpandDwAct* a : {&s.act1, &s.act2, &s.act3}) {
    if (a->kind == ExpandDwAct::kClip && !(a->lo <= a->hi)) return "clip bounds out of order";
    // The channels past m up to the next multiple of 16 must stay zero (nChw16c's padding).
    if (a != &s.act3 && s.m % 16 != 0 && a->kind == ExpandDwAct::kClip && !(a->lo <= 0.f && 0.f <= a->hi))
      return "a clip without 0 in its range over a partial channel block";
  }
  return "";
}

size_t expand_dw_packed_floats(const ExpandDwShape& s) {
  // bf16: c * mp and mp * pp bf16 values (halves of floats; both products are even).
  return f32_packed_floats(s) +
         (s.bf16 ? static_cast<size_t>(s.c * padded_m(s) + padded_m(s) * padded_proj(s)) / 2 : 0);
}

void expand_dw_pack(const ExpandDwShape& s, const float* w1, const float* b1, const float* w2, const float* b2,
                    const float* w3, const float* b3, float* packed) {
  const int64_t mp = padded_m(s), kk = s.k * s.k, c1 = first_inputs(s);
  std::fill(packed, packed + expand_dw_packed_floats(s), 0.f);
  pack_groups_f32(w1, s.m, c1, packed);
  float* wd = packed + c1 * mp;
  for (int64_t o = 0; o < s.m; ++o)
    for (int64_t t = 0; t < kk; ++t) wd[((o / 16) * kk + t) * 16 + o % 16] = w2[o * kk + t];
  std::copy(b1, b1 + s.m, wd + kk * mp);
  std::copy(b2, b2 + s.m, wd + (kk + 1) * mp);
  float* up = wd + (kk + 2) * mp;
  if (s.proj > 0) {
    pack_groups_f32(w3, s.proj, s.m, up);
    std::copy(b3, b3 + s.proj, up + s.m * padded_proj(s));
  }
  if (!s.bf16) return;
  // The same weights as bf16 pairs (K = 2); the projection's over the depthwise row's mp channels (zeros past m).
  uint16_t* u16 = reinterpret_cast<uint16_t*>(packed + f32_packed_floats(s));
  pack_groups<2>(w1, s.m, s.c, s.c, u16, f32_to_bf16);
  if (s.proj > 0) pack_groups<2>(w3, s.proj, s.m, mp, u16 + s.c * mp, f32_to_bf16);
}

size_t expand_dw_scratch_floats(const ExpandDwShape& s) {
  const int64_t row = padded_m(s) * s.ow();  // the depthwise row (f32), and for bf16 its bf16 copy
  if (expand_dw_rows_at_once(s))             // a group's expanded rows of an image, and the image's depthwise output
    return static_cast<size_t>(s.eh() * group_row_floats(s) + row * s.oh() + 16);
  return static_cast<size_t>(s.k * ring_row_floats(s) + (s.proj > 0 || s.bf16 ? row : 0) + (s.bf16 ? row / 2 : 0) +
                             stem_row_floats(s) + 16);
}

// The rule: the two 1x1s' weights more than fit in L2 beside the rows (kAtOnceMinWeightBytes: one by one, every row
// read them from L3 or memory again) and the image's depthwise output small enough to stay in L2 for the projection
// (kAtOnceMaxOutBytes). MobileNetV2's 7x7 blocks (1.2-1.8 MB of weights, 188 KB of depthwise output) 16-18% faster
// alone with the weights in L3, 7-24% with them in memory ("(xdw7)"). Since the next group's weights are prefetched
// ("(pf)"), at 1 thread also its 14x14 blocks of 96 -> 576 channels (442 KB of weights; in the model 2-3% faster at 1
// thread, 2-3% slower at 2) and its stride-2 block into 7x7 (590 KB; 5-8% faster alone, level at 2 threads in the
// model); its blocks of 64 -> 384 (210-260 KB) level either way, so they stay row by row (docs/ONEDNN_PERFORMANCE.md,
// "(pf)").
bool expand_dw_rows_at_once(const ExpandDwShape& s, int team) {
  if (s.bf16 || s.stem || s.proj == 0 || s.at_once == 0) return false;
  const int64_t weights = (s.c * padded_m(s) + s.m * padded_proj(s)) * 4, out = padded_m(s) * s.oh() * s.ow() * 4;
  const int64_t floor = team <= 1 ? kAtOnceMinWeightBytesOneThread : kAtOnceMinWeightBytes;
  return s.at_once == 1 || (weights > floor && out <= kAtOnceMaxOutBytes);
}

bool expand_dw_splits_rows(const ExpandDwShape& s, int team) {
  return team <= 1 || s.proj > 0 || s.n * s.oh() >= kMinRowsPerThread * team || groups_of(padded_m(s)) < team;
}

void expand_dw_run(const ExpandDwShape& s, const float* src, const float* packed, float* dst, float* scratch, int team,
                   size_t stride) {
  const size_t per = stride ? stride : expand_dw_scratch_floats(s);
  auto own_scratch = [&](int64_t t) {
    float* own = scratch + static_cast<size_t>(t) * per;
    return own + (64 - reinterpret_cast<uintptr_t>(own) % 64) % 64 / sizeof(float);  // 64-byte aligned
  };
  const Packed p = parts(s, packed);
  const int64_t rows = s.n * s.oh(), ng = groups_of(padded_m(s));
  if (expand_dw_rows_at_once(s)) {  // (the rows split: a projection)
    const int64_t oh = s.oh();
    split_over_team(rows, team, [&](int64_t t, int64_t r0, int64_t r1) {
      for (int64_t img = r0 / oh; r1 > r0 && img * oh < r1; ++img)
        run_rows_at_once(s, src, p, dst, own_scratch(t), img, std::max(r0 - img * oh, int64_t{0}),
                         std::min(r1 - img * oh, oh));
    });
  } else if (expand_dw_splits_rows(s, team)) {
    split_over_team(rows, team, [&](int64_t t, int64_t r0, int64_t r1) {
      if (r1 > r0) run_part(s, src, p, dst, own_scratch(t), r0, r1, 0, ng);
    });
  } else {
    split_over_team(ng, team, [&](int64_t t, int64_t g0, int64_t g1) {
      if (g1 > g0) run_part(s, src, p, dst, own_scratch(t), 0, rows, g0, g1);
    });
  }
}

void expand_dw_reference(const ExpandDwShape& s, const float* src, const float* w1, const float* b1, const float* w2,
                         const float* b2, const float* w3, const float* b3, float* dst) {
  const int64_t cb = blocks_of(s.c), mb = blocks_of(s.m), oh = s.oh(), ow = s.ow(), kk = s.k * s.k, pad = pad_of(s);
  std::vector<float> dw_out;  // the depthwise output, nChw16c, when a projection follows
  if (s.proj > 0) dw_out.resize(static_cast<size_t>(s.n * mb * 16 * oh * ow));
  float* dwd = s.proj > 0 ? dw_out.data() : dst;
  std::fill(dwd, dwd + s.n * mb * 16 * oh * ow, 0.f);  // nChw16c's padding channels
  const int64_t eh = s.eh(), ew = s.ew();
  std::vector<float> e(static_cast<size_t>(s.n * s.m * eh * ew));  // [n][m][eh][ew]
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t o = 0; o < s.m; ++o)
      for (int64_t y = 0; y < eh; ++y)
        for (int64_t x = 0; x < ew; ++x) {
          double acc = b1[o];
          if (s.stem) {  // 3x3, stride 2, padding 1 over plain [n][c][h][w]
            for (int64_t ci = 0; ci < s.c; ++ci)
              for (int64_t a = 0; a < 3; ++a)
                for (int64_t b = 0; b < 3; ++b) {
                  const int64_t iy = 2 * y - 1 + a, ix = 2 * x - 1 + b;
                  if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                  acc += static_cast<double>(src[((img * s.c + ci) * s.h + iy) * s.w + ix]) *
                         w1[((o * s.c + ci) * 3 + a) * 3 + b];
                }
          } else {
            for (int64_t k = 0; k < s.c; ++k)
              acc +=
                  static_cast<double>(src[(((img * cb + k / 16) * s.h + y) * s.w + x) * 16 + k % 16]) * w1[o * s.c + k];
          }
          e[((img * s.m + o) * eh + y) * ew + x] = act_scalar(s.act1, static_cast<float>(acc));
        }
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t o = 0; o < s.m; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x) {
          double acc = b2[o];
          for (int64_t a = 0; a < s.k; ++a)
            for (int64_t b = 0; b < s.k; ++b) {
              const int64_t iy = y * s.stride - pad + a, ix = x * s.stride - pad + b;
              if (iy < 0 || iy >= eh || ix < 0 || ix >= ew) continue;
              acc += static_cast<double>(e[((img * s.m + o) * eh + iy) * ew + ix]) * w2[o * kk + a * s.k + b];
            }
          dwd[(((img * mb + o / 16) * oh + y) * ow + x) * 16 + o % 16] = act_scalar(s.act2, static_cast<float>(acc));
        }
  if (s.proj == 0) return;
  const int64_t pb = blocks_of(s.proj);
  std::fill(dst, dst + s.n * pb * 16 * oh * ow, 0.f);
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t o = 0; o < s.proj; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x) {
          double acc = b3[o];
          for (int64_t k = 0; k < s.m; ++k)
            acc += static_cast<double>(dwd[(((img * mb + k / 16) * oh + y) * ow + x) * 16 + k % 16]) * w3[o * s.m + k];
          const int64_t at = (((img * pb + o / 16) * oh + y) * ow + x) * 16 + o % 16;
          if (s.residual) acc += src[at];  // the same nChw16c geometry (stride 1, proj == c)
          dst[at] = act_scalar(s.act3, static_cast<float>(acc));
        }
}

}  // namespace keel::onednn
