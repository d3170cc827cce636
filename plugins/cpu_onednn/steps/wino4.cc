// plugins/cpu_onednn/steps/wino4.cc — Winograd F(4x4,3x3), and F(2x2,3x3) for few tiles, over nChw16c
// (steps/wino4.h). The code is written for an A x A input tile (A = 6: F(4,3); A = 4: F(2,3)) of A * A positions and
// an O x O output tile, O = A - 2; the comments speak of F(4,3).
//
// Tiles: output rows 4i..4i+3 and columns 4j..4j+3 of one image, read from input rows 4i-1..4i+4 and columns
// 4j-1..4j+4 (zeros outside the image). Each thread takes a contiguous range of tiles (or, for large weights, of
// output channel groups over every tile) and works through its tiles in blocks of up to kBlockTiles (fewer for many
// channels, so the block's transformed input stays in L2):
//  1. input transform of the block: V[p][t][c] for the 36 positions p = 6 * row frequency + column frequency;
//  2. per group of 32 output channels (16 for a last odd block) and per register tile of up to kRegTiles tiles,
//     36 products M[p] = V[p] (tiles x c) * U[p] (c x 32), accumulated in registers (tiles x 2 vectors) and stored to
//     a small buffer, then the output transform of those tiles, bias, residual sum and Relu, written to dst.
// Transforms (Lavin & Gray, interpolation points 0, +-1, +-2, infinity), correlation as ONNX's Conv:
//   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
//   G   = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
//   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
// and for F(2,3) (interpolation points 0, +-1, infinity):
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1]
#include "steps/wino4.h"

#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>

#include "common/team.h"
#include "steps/silu.h"

namespace keel::onednn {
namespace {

constexpr int kRegTiles = 14;                   // tiles per register tile (14 x 2 accumulators)
constexpr int64_t kBlockTiles = 56;             // most tiles per block
constexpr int64_t kBlockBytes = 640 << 10;      // the block's transformed input at most (unless a single register tile)
constexpr size_t kSharedWeightBytes = 1 << 20;  // transformed weights every thread may read whole

constexpr int64_t kStreamedBlockBytes = 1 << 20;    // streamed weights: the block's transformed input at most
constexpr int64_t kStreamedChunkBytes = 288 << 10;  // streamed weights: one chunk of input channels, transformed

// Winograd positions: A * A.
int64_t positions(const Wino4Shape& s) { return s.f2 ? 16 : 36; }

// Whether the tiles go through in blocks whose products accumulate in a [positions][tiles][32] buffer, position by
// position, each group's weights read (or transformed) once per block: streamed weights, and position_major.
bool by_blocks(const Wino4Shape& s) { return s.streamed || s.position_major; }

int64_t block_tiles(const Wino4Shape& s) {
  const int64_t fit =
      (by_blocks(s) ? kStreamedBlockBytes : kBlockBytes) / (positions(s) * s.c * static_cast<int64_t>(sizeof(float)));
  // Every tile in one block where the transformed input fits.
  if (by_blocks(s)) return std::clamp<int64_t>(fit, std::min<int64_t>(kRegTiles, s.tiles()), s.tiles());
  return std::clamp<int64_t>(fit / kRegTiles * kRegTiles, kRegTiles, kBlockTiles);
}

// Output channel groups: 32 wide, the last 16 wide when m is an odd number of 16-channel blocks.
int64_t groups(const Wino4Shape& s) { return (s.m + 31) / 32; }
int64_t group_width(const Wino4Shape& s, int64_t g) { return std::min<int64_t>(32, s.m - 32 * g); }
// The buffers hold 36 positions one after the other; each position's part takes one cache line more than its
// values, so that the 36 stores or loads of one tile or channel (one per position) do not fall into one set of L1
// (parts of 4 KiB multiples: ResNet's 16 tiles x 256 channels).
inline int64_t padded(int64_t floats) { return floats + 16; }
// Floats of one thread's products buffer: a register tile's, or (streamed weights) the whole block's.
int64_t products_floats(const Wino4Shape& s) {
  return positions(s) * padded((by_blocks(s) ? block_tiles(s) : kRegTiles) * 32);
}

// Streamed weights: input channels per chunk transformed at once ([36][chunk][32] floats within
// kStreamedChunkBytes), a multiple of 16.
int64_t chunk_channels(const Wino4Shape& s) {
  const int64_t fit = kStreamedChunkBytes / (positions(s) * 32 * static_cast<int64_t>(sizeof(float)));
  return std::clamp<int64_t>(fit / 16 * 16, 16, s.c);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// 1-D input transform of six vectors.
__attribute__((target("avx512f"))) inline void bt6(const __m512 d[6], __m512 t[6]) {
  const __m512 four = _mm512_set1_ps(4.f), five = _mm512_set1_ps(5.f), two = _mm512_set1_ps(2.f);
  // t0 = 4 d0 - 5 d2 + d4; t5 = 4 d1 - 5 d3 + d5
  t[0] = _mm512_fmadd_ps(four, d[0], _mm512_fnmadd_ps(five, d[2], d[4]));
  t[5] = _mm512_fmadd_ps(four, d[1], _mm512_fnmadd_ps(five, d[3], d[5]));
  // t1 = -4 (d1 + d2) + d3 + d4; t2 = 4 (d1 - d2) - d3 + d4
  const __m512 s12 = _mm512_add_ps(d[1], d[2]), d12 = _mm512_sub_ps(d[1], d[2]);
  t[1] = _mm512_fnmadd_ps(four, s12, _mm512_add_ps(d[3], d[4]));
  t[2] = _mm512_fmadd_ps(four, d12, _mm512_sub_ps(d[4], d[3]));
  // t3 = 2 (d3 - d1) + d4 - d2; t4 = 2 (d1 - d3) + d4 - d2
  const __m512 d31 = _mm512_sub_ps(d[3], d[1]), d42 = _mm512_sub_ps(d[4], d[2]);
  t[3] = _mm512_fmadd_ps(two, d31, d42);
  t[4] = _mm512_fnmadd_ps(two, d31, d42);
}

// 1-D output transform of six vectors into four.
__attribute__((target("avx512f"))) inline void at6(const __m512 m[6], __m512 o[4]) {
  const __m512 two = _mm512_set1_ps(2.f), four = _mm512_set1_ps(4.f), eight = _mm512_set1_ps(8.f);
  const __m512 s12 = _mm512_add_ps(m[1], m[2]), d12 = _mm512_sub_ps(m[1], m[2]);
  const __m512 s34 = _mm512_add_ps(m[3], m[4]), d34 = _mm512_sub_ps(m[3], m[4]);
  o[0] = _mm512_add_ps(_mm512_add_ps(m[0], s12), s34);
  o[1] = _mm512_fmadd_ps(two, d34, d12);
  o[2] = _mm512_fmadd_ps(four, s34, s12);
  o[3] = _mm512_add_ps(_mm512_fmadd_ps(eight, d34, d12), m[5]);
}

// F(2,3)'s 1-D input transform of four vectors.
__attribute__((target("avx512f"))) inline void bt4(const __m512 d[4], __m512 t[4]) {
  t[0] = _mm512_sub_ps(d[0], d[2]);
  t[1] = _mm512_add_ps(d[1], d[2]);
  t[2] = _mm512_sub_ps(d[2], d[1]);
  t[3] = _mm512_sub_ps(d[1], d[3]);
}

// F(2,3)'s 1-D output transform of four vectors into two.
__attribute__((target("avx512f"))) inline void at4(const __m512 m[4], __m512 o[2]) {
  o[0] = _mm512_add_ps(_mm512_add_ps(m[0], m[1]), m[2]);
  o[1] = _mm512_sub_ps(_mm512_sub_ps(m[1], m[2]), m[3]);
}

// The 1-D transforms of an A-point tile.
template <int A>
__attribute__((target("avx512f"))) inline void bt(const __m512 d[A], __m512 t[A]) {
  if constexpr (A == 6) bt6(d, t);
  else bt4(d, t);
}
template <int A>
__attribute__((target("avx512f"))) inline void at(const __m512 m[A], __m512 o[A - 2]) {
  if constexpr (A == 6) at6(m, o);
  else at4(m, o);
}

// Input transform of tile q (image img, tile row ti, column tj) for every channel block into V[p][t][c] (block of
// `bt` tiles, this tile the t-th).
template <int A>
__attribute__((target("avx512f"))) void input_tile(const Wino4Shape& s, const float* src, int64_t img, int64_t ti,
                                                   int64_t tj, float* V, int64_t bt_n, int64_t t) {
  constexpr int O = A - 2;
  const int64_t cb_n = s.c / 16, y0 = O * ti - 1, x0 = O * tj - 1;
  const bool inside = y0 >= 0 && x0 >= 0 && y0 + A <= s.h && x0 + A <= s.w;
  int rlo = 0, rhi = A, clo = 0, chi = A;  // the rows / columns of the A x A window inside the image
  if (!inside) {
    rlo = static_cast<int>(std::max<int64_t>(0, -y0)), rhi = static_cast<int>(std::min<int64_t>(A, s.h - y0));
    clo = static_cast<int>(std::max<int64_t>(0, -x0)), chi = static_cast<int>(std::min<int64_t>(A, s.w - x0));
  }
  const __m512 zero = _mm512_setzero_ps();
  alignas(64) float tmp[A][A][16];
  for (int64_t cb = 0; cb < cb_n; ++cb) {
    const float* base = src + ((img * cb_n + cb) * s.h * s.w) * 16;
    for (int r = 0; r < A; ++r) {
      __m512 d[A], tr[A];
      if (r < rlo || r >= rhi) {
        for (int k = 0; k < A; ++k) _mm512_store_ps(tmp[r][k], zero);
        continue;
      }
      const float* row = base + ((y0 + r) * s.w + x0) * 16;
      if (inside) {
#pragma GCC unroll 6
        for (int k = 0; k < A; ++k) d[k] = _mm512_loadu_ps(row + k * 16);
      } else {
        for (int k = 0; k < A; ++k) d[k] = (k >= clo && k < chi) ? _mm512_loadu_ps(row + k * 16) : zero;
      }
      bt<A>(d, tr);
#pragma GCC unroll 6
      for (int k = 0; k < A; ++k) _mm512_store_ps(tmp[r][k], tr[k]);
    }
#pragma GCC unroll 6
    for (int k = 0; k < A; ++k) {
      __m512 d[A], tr[A];
#pragma GCC unroll 6
      for (int r = 0; r < A; ++r) d[r] = _mm512_load_ps(tmp[r][k]);
      bt<A>(d, tr);
#pragma GCC unroll 6
      for (int i = 0; i < A; ++i) _mm512_storeu_ps(V + (i * A + k) * padded(bt_n * s.c) + t * s.c + cb * 16, tr[i]);
    }
  }
}

// out[t][0..NV*16) = sum over k < K of A[t * lda + k] * B[k * NV * 16 + ..] for T tiles, added to what out holds
// when `add` (a streamed chunk after the first). Prefetches `lines` cache lines from `pf` on into L2 meanwhile, one
// every `every` k.
template <int T, int NV>
__attribute__((target("avx512f"))) void product(const float* A, int64_t lda, const float* B, int64_t K, float* out,
                                                bool add, const char* pf, int64_t lines, int64_t every) {
  __m512 acc[T][NV];
#pragma GCC unroll 14
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[t][v] = add ? _mm512_load_ps(out + (t * NV + v) * 16) : _mm512_setzero_ps();
  int64_t until = lines > 0 ? every : INT64_MAX;
#pragma GCC unroll 2
  for (int64_t k = 0; k < K; ++k) {
    if (--until == 0) {
      _mm_prefetch(pf, _MM_HINT_T1);
      pf += 64;
      until = --lines > 0 ? every : INT64_MAX;
    }
    __m512 b[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(B + (k * NV + v) * 16);
#pragma GCC unroll 14
    for (int t = 0; t < T; ++t) {
      const __m512 a = _mm512_set1_ps(A[t * lda + k]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[t][v] = _mm512_fmadd_ps(a, b[v], acc[t][v]);
    }
  }
#pragma GCC unroll 14
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) _mm512_store_ps(out + (t * NV + v) * 16, acc[t][v]);
}

using ProductFn = void (*)(const float*, int64_t, const float*, int64_t, float*, bool, const char*, int64_t, int64_t);

template <int NV, int... T>
constexpr ProductFn product_of(int t, std::integer_sequence<int, T...>) {
  constexpr ProductFn fns[] = {product<T + 1, NV>...};
  return fns[t - 1];
}
ProductFn product_fn(int tiles, int nv) {
  using Seq = std::make_integer_sequence<int, kRegTiles>;
  return nv == 2 ? product_of<2>(tiles, Seq{}) : product_of<1>(tiles, Seq{});
}

// G k of three vectors (one column or row of 3x3 taps) into six: the 1-D weight transform.
__attribute__((target("avx512f"))) inline void g3(__m512 k0, __m512 k1, __m512 k2, __m512 r[6]) {
  const __m512 a = _mm512_add_ps(k0, k2);
  const __m512 b = _mm512_fmadd_ps(k0, _mm512_set1_ps(1.f / 24), _mm512_mul_ps(k2, _mm512_set1_ps(1.f / 6)));
  const __m512 c = _mm512_mul_ps(k1, _mm512_set1_ps(1.f / 12));
  r[0] = _mm512_mul_ps(k0, _mm512_set1_ps(1.f / 4));
  r[1] = _mm512_mul_ps(_mm512_add_ps(a, k1), _mm512_set1_ps(-1.f / 6));
  r[2] = _mm512_mul_ps(_mm512_sub_ps(a, k1), _mm512_set1_ps(-1.f / 6));
  r[3] = _mm512_add_ps(b, c);
  r[4] = _mm512_sub_ps(b, c);
  r[5] = k2;
}

// F(2,3)'s G k of three vectors into four.
__attribute__((target("avx512f"))) inline void g3f2(__m512 k0, __m512 k1, __m512 k2, __m512 r[4]) {
  const __m512 half = _mm512_set1_ps(0.5f), a = _mm512_mul_ps(_mm512_add_ps(k0, k2), half);
  const __m512 b = _mm512_mul_ps(k1, half);
  r[0] = k0;
  r[1] = _mm512_add_ps(a, b);
  r[2] = _mm512_sub_ps(a, b);
  r[3] = k2;
}

template <int A>
__attribute__((target("avx512f"))) inline void gk(__m512 k0, __m512 k1, __m512 k2, __m512 r[A]) {
  if constexpr (A == 6) g3(k0, k1, k2, r);
  else g3f2(k0, k1, k2, r);
}

// Streamed weights: G g G^T of input channels [c0, c0 + kc) of group g (plain taps [c][9][wg] at `P`) into
// U[p][kc][wg], the layout the products read.
template <int A>
__attribute__((target("avx512f"))) void transform_weights(const float* P, int64_t wg, int64_t c0, int64_t kc,
                                                          float* U) {
  for (int64_t c = 0; c < kc; ++c)
    for (int64_t v = 0; v < wg / 16; ++v) {
      const float* k = P + (c0 + c) * 9 * wg + v * 16;
      __m512 col[3][A];  // G g: col[b][i] = row i of G times column b of the taps
#pragma GCC unroll 3
      for (int b = 0; b < 3; ++b)
        gk<A>(_mm512_loadu_ps(k + b * wg), _mm512_loadu_ps(k + (3 + b) * wg), _mm512_loadu_ps(k + (6 + b) * wg),
              col[b]);
#pragma GCC unroll 6
      for (int i = 0; i < A; ++i) {
        __m512 r[A];
        gk<A>(col[0][i], col[1][i], col[2][i], r);
#pragma GCC unroll 6
        for (int j = 0; j < A; ++j) _mm512_store_ps(U + (i * A + j) * padded(kc * wg) + c * wg + v * 16, r[j]);
      }
    }
}

// Output transform of `nt` tiles from M[p][t][nv * 16] (output channels 16 ob0 ..), bias, Relu, into dst.
template <int A>
__attribute__((target("avx512f"))) void output_tiles(const Wino4Shape& s, const float* M, int nt, int nv, int64_t q0,
                                                     int64_t ob0, const float* bias, float* dst) {
  constexpr int O = A - 2;
  const int64_t tw = s.tiles_w(), tpi = s.tiles_h() * tw, mb_n = s.m / 16;
  const __m512 zero = _mm512_setzero_ps();
  const int64_t stride_p = padded(static_cast<int64_t>(nt) * nv * 16);
  for (int t = 0; t < nt; ++t) {
    const int64_t q = q0 + t, img = q / tpi, ti = (q % tpi) / tw, tj = q % tw;
    const int64_t y0 = O * ti, x0 = O * tj;
    const int rows = static_cast<int>(std::min<int64_t>(O, s.h - y0)),
              cols = static_cast<int>(std::min<int64_t>(O, s.w - x0));
    for (int v = 0; v < nv; ++v) {
      const float* m0 = M + (t * nv + v) * 16;
      __m512 tmp[A][O];
#pragma GCC unroll 6
      for (int i = 0; i < A; ++i) {
        __m512 m[A];
#pragma GCC unroll 6
        for (int k = 0; k < A; ++k) m[k] = _mm512_load_ps(m0 + (i * A + k) * stride_p);
        at<A>(m, tmp[i]);
      }
      const int64_t ob = ob0 + v;
      const __m512 b = _mm512_loadu_ps(bias + ob * 16);
      float* out = dst + (((img * mb_n + ob) * s.h + y0) * s.w + x0) * 16;
#pragma GCC unroll 4
      for (int k = 0; k < O; ++k) {
        __m512 col[A], o[O];
#pragma GCC unroll 6
        for (int i = 0; i < A; ++i) col[i] = tmp[i][k];
        at<A>(col, o);
        if (k >= cols) continue;
        for (int r = 0; r < rows; ++r) {
          __m512 y = _mm512_add_ps(o[r], b);
          if (s.sum) y = _mm512_add_ps(y, _mm512_loadu_ps(out + (r * s.w + k) * 16));
          if (s.relu) y = _mm512_max_ps(y, zero);
          _mm512_storeu_ps(out + (r * s.w + k) * 16, y);
        }
      }
    }
  }
}

#pragma GCC diagnostic pop

// Tiles [begin, end), output channel groups [g0, g1), on the calling thread.
template <int A>
void run_tiles(const Wino4Shape& s, const float* src, const float* packed, const float* bias, float* dst,
               float* scratch, int64_t begin, int64_t end, int64_t g0, int64_t g1) {
  const int64_t bt_max = block_tiles(s), tw = s.tiles_w(), tpi = s.tiles_h() * tw;
  const int64_t kc_max = s.streamed ? chunk_channels(s) : s.c;
  constexpr int P = A * A;
  float* V = scratch;                       // [P][bt][c]
  float* M = V + P * padded(bt_max * s.c);  // [P][kRegTiles][32]; streamed: [P][bt][32]
  float* U = M + products_floats(s);        // streamed: [P][chunk][32]
  for (int64_t b0 = begin; b0 < end; b0 += bt_max) {
    const int64_t bt = std::min(bt_max, end - b0);
    for (int64_t t = 0; t < bt; ++t) {
      const int64_t q = b0 + t;
      input_tile<A>(s, src, q / tpi, (q % tpi) / tw, q % tw, V, bt, t);
    }
    // Register tiles of near-equal size (16 tiles as 8 + 8, not 14 + 2: a tile of 2 leaves the FMA units waiting).
    const int64_t n_rt = (bt + kRegTiles - 1) / kRegTiles, rt = (bt + n_rt - 1) / n_rt;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t wg = group_width(s, g);
      const int nv = static_cast<int>(wg / 16);
      if (!by_blocks(s)) {
        const float* W = packed + P * s.c * 32 * g;  // groups before g are all 32 wide
        for (int64_t r0 = 0; r0 < bt; r0 += rt) {
          const int nt = static_cast<int>(std::min(rt, bt - r0));
          const ProductFn f = product_fn(nt, nv);
          for (int p = 0; p < P; ++p)
            f(V + p * padded(bt * s.c) + r0 * s.c, s.c, W + p * s.c * wg, s.c, M + p * padded(nt * wg), false, nullptr,
              0, 1);
          output_tiles<A>(s, M, nt, nv, b0 + r0, 2 * g, bias, dst);
        }
        continue;
      }
      // By blocks: the block's products accumulate in M ([P][bt][wg]), position by position over every tile, so each
      // position's weights are read once per block. Streamed: per chunk of input channels, its weights transformed
      // into U first, and the next chunk's taps (this group's or the next one's first) prefetched into L2 during the
      // products, so that its transform does not wait for memory. Else (position_major: transformed at plan time,
      // [group][P][c][wg]) the weights are read in order, one chunk of all c, the next position's prefetched.
      for (int64_t c0 = 0; c0 < s.c; c0 += kc_max) {
        const int64_t kc = std::min(kc_max, s.c - c0);
        const float* Ug = packed + P * s.c * 32 * g;
        int64_t ustride = s.c * wg;
        if (s.streamed) {
          transform_weights<A>(packed + 9 * s.c * 32 * g, wg, c0, kc, U);
          Ug = U, ustride = padded(kc * wg);
        }
        const char* next = nullptr;
        int64_t next_lines = 0;
        if (s.streamed && c0 + kc < s.c) {
          next = reinterpret_cast<const char*>(packed + 9 * s.c * 32 * g + (c0 + kc) * 9 * wg);
          next_lines = std::min(kc_max, s.c - c0 - kc) * 9 * wg * 4 / 64;
        } else if (s.streamed && g + 1 < g1) {
          next = reinterpret_cast<const char*>(packed + 9 * s.c * 32 * (g + 1));
          next_lines = std::min(kc_max, s.c) * 9 * group_width(s, g + 1) * 4 / 64;
        }
        for (int p = 0; p < P; ++p) {
          // Weights transformed at plan time: the next position's (or the next group's first), spread over this
          // position's products, one line every few k.
          const char* pf = nullptr;
          int64_t pf_lines = 0;
          if (!s.streamed && (p + 1 < P || g + 1 < g1)) {
            pf = reinterpret_cast<const char*>(Ug + (p + 1) * ustride);  // the next group's follows the last position
            pf_lines = (p + 1 < P ? wg : group_width(s, g + 1)) * s.c * 4 / 64;
          }
          for (int64_t l = p * next_lines / P; l < (p + 1) * next_lines / P; ++l)
            _mm_prefetch(next + l * 64, _MM_HINT_T1);
          const int64_t n_rt_here = (bt + rt - 1) / rt;
          for (int64_t r0 = 0, j = 0; r0 < bt; r0 += rt, ++j) {
            const int nt = static_cast<int>(std::min(rt, bt - r0));
            const int64_t l0 = pf_lines * j / n_rt_here, l1 = pf_lines * (j + 1) / n_rt_here;
            product_fn(nt, nv)(V + p * padded(bt * s.c) + r0 * s.c + c0, s.c, Ug + p * ustride, kc,
                               M + p * padded(bt * wg) + r0 * wg, c0 > 0, pf ? pf + l0 * 64 : nullptr, l1 - l0,
                               l1 > l0 ? std::max<int64_t>(1, kc / (l1 - l0)) : 1);
          }
        }
      }
      output_tiles<A>(s, M, static_cast<int>(bt), nv, b0, 2 * g, bias, dst);
    }
  }
}

}  // namespace

std::string wino4_check(const Wino4Shape& s) {
  if (!has_avx512f()) return "no AVX-512";
  if (s.n < 1 || s.h < 1 || s.w < 1) return "empty image";
  if (s.c < 16 || s.c % 16 != 0 || s.m < 16 || s.m % 16 != 0) return "channels not a multiple of 16";
  return "";
}

size_t wino4_packed_floats(const Wino4Shape& s) {
  return static_cast<size_t>((s.streamed ? 9 : positions(s)) * s.c * s.m);
}

void wino4_pack_weights(const Wino4Shape& s, const float* w, float* packed) {
  static const double G[6][3] = {{1.0 / 4, 0, 0},
                                 {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                 {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                 {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                 {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                 {0, 0, 1}};
  if (s.streamed) {  // the plain taps, [group][c][9][group width]
    for (int64_t o = 0; o < s.m; ++o) {
      const int64_t g = o / 32, wg = group_width(s, g);
      for (int64_t c = 0; c < s.c; ++c)
        for (int k = 0; k < 9; ++k) packed[9 * s.c * 32 * g + (c * 9 + k) * wg + o % 32] = w[(o * s.c + c) * 9 + k];
    }
    return;
  }
  static const double G2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
  const int A = s.f2 ? 4 : 6;
  auto g_at = [&](int i, int b) { return s.f2 ? G2[i][b] : G[i][b]; };
  for (int64_t o = 0; o < s.m; ++o) {
    const int64_t g = o / 32, wg = group_width(s, g), lane = o % 32;
    float* U = packed + positions(s) * s.c * 32 * g;
    for (int64_t c = 0; c < s.c; ++c) {
      const float* k = w + (o * s.c + c) * 9;
      double gk[6][3];  // G g
      for (int i = 0; i < A; ++i)
        for (int b = 0; b < 3; ++b) gk[i][b] = g_at(i, 0) * k[b] + g_at(i, 1) * k[3 + b] + g_at(i, 2) * k[6 + b];
      for (int i = 0; i < A; ++i)
        for (int j = 0; j < A; ++j)
          U[((i * A + j) * s.c + c) * wg + lane] =
              static_cast<float>(gk[i][0] * g_at(j, 0) + gk[i][1] * g_at(j, 1) + gk[i][2] * g_at(j, 2));
    }
  }
}

size_t wino4_scratch_floats(const Wino4Shape& s) {
  return static_cast<size_t>(positions(s) * padded(block_tiles(s) * s.c) + products_floats(s) +
                             (s.streamed ? positions(s) * padded(chunk_channels(s) * 32) : 0)) +
         16;
}

void wino4_run(const Wino4Shape& s, const float* src, const float* packed, const float* bias, float* dst,
               float* scratch, int team, size_t stride) {
  const size_t per = stride ? stride : wino4_scratch_floats(s);
  auto own_scratch = [&](int64_t t) {
    float* own = scratch + static_cast<size_t>(t) * per;
    return own + (64 - reinterpret_cast<uintptr_t>(own) % 64) % 64 / sizeof(float);  // 64-byte aligned
  };
  const int64_t tiles = s.tiles(), ng = groups(s);
  // Each thread its own range of output channel groups over every tile (its share of the transformed weights read
  // once, or with streamed weights transformed once; the input transform repeated on every thread) where the weights
  // are too large to be read whole by each thread, else its own range of tiles over every group.
  const auto tiles_fn = s.f2 ? run_tiles<4> : run_tiles<6>;
  const bool by_groups =
      team > 1 &&
      (by_blocks(s) ? ng >= team : ng >= 2 * team && wino4_packed_floats(s) * sizeof(float) > kSharedWeightBytes);
  if (by_groups) {
    split_over_team(ng, team, [&](int64_t t, int64_t g0, int64_t g1) {
      if (g1 > g0) tiles_fn(s, src, packed, bias, dst, own_scratch(t), 0, tiles, g0, g1);
    });
  } else {
    split_over_team(tiles, team, [&](int64_t t, int64_t begin, int64_t end) {
      if (end > begin) tiles_fn(s, src, packed, bias, dst, own_scratch(t), begin, end, 0, ng);
    });
  }
}

void wino4_reference(const Wino4Shape& s, const float* src, const float* w, const float* bias, float* dst) {
  const int64_t cb_n = s.c / 16, mb_n = s.m / 16;
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t o = 0; o < s.m; ++o)
      for (int64_t y = 0; y < s.h; ++y)
        for (int64_t x = 0; x < s.w; ++x) {
          double acc = bias[o];
          for (int64_t c = 0; c < s.c; ++c)
            for (int64_t a = 0; a < 3; ++a)
              for (int64_t b = 0; b < 3; ++b) {
                const int64_t iy = y - 1 + a, ix = x - 1 + b;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                acc += static_cast<double>(src[(((img * cb_n + c / 16) * s.h + iy) * s.w + ix) * 16 + c % 16]) *
                       w[((o * s.c + c) * 3 + a) * 3 + b];
              }
          float& d = dst[(((img * mb_n + o / 16) * s.h + y) * s.w + x) * 16 + o % 16];
          float v = static_cast<float>(acc + (s.sum ? d : 0.0));
          if (s.relu) v = std::max(v, 0.f);
          d = v;
        }
}

}  // namespace keel::onednn
