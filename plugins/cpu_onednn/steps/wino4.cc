// plugins/cpu_onednn/steps/wino4.cc — Winograd F(4x4,3x3) over nChw16c (steps/wino4.h).
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
#include "steps/wino4.h"

#include <immintrin.h>

#include <algorithm>
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

int64_t block_tiles(const Wino4Shape& s) {
  const int64_t fit =
      (s.streamed ? kStreamedBlockBytes : kBlockBytes) / (36 * s.c * static_cast<int64_t>(sizeof(float)));
  // Streamed weights are transformed once per block: every tile in one block where the transformed input fits.
  if (s.streamed) return std::clamp<int64_t>(fit, std::min<int64_t>(kRegTiles, s.tiles()), s.tiles());
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
int64_t products_floats(const Wino4Shape& s) { return 36 * padded((s.streamed ? block_tiles(s) : kRegTiles) * 32); }

// Streamed weights: input channels per chunk transformed at once ([36][chunk][32] floats within
// kStreamedChunkBytes), a multiple of 16.
int64_t chunk_channels(const Wino4Shape& s) {
  const int64_t fit = kStreamedChunkBytes / (36 * 32 * static_cast<int64_t>(sizeof(float)));
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

// Input transform of tile q (image img, tile row ti, column tj) for every channel block into V[p][t][c] (block of
// `bt` tiles, this tile the t-th).
__attribute__((target("avx512f"))) void input_tile(const Wino4Shape& s, const float* src, int64_t img, int64_t ti,
                                                   int64_t tj, float* V, int64_t bt, int64_t t) {
  const int64_t cb_n = s.c / 16, y0 = 4 * ti - 1, x0 = 4 * tj - 1;
  const bool inside = y0 >= 0 && x0 >= 0 && y0 + 6 <= s.h && x0 + 6 <= s.w;
  int rlo = 0, rhi = 6, clo = 0, chi = 6;  // the rows / columns of the 6x6 window inside the image
  if (!inside) {
    rlo = static_cast<int>(std::max<int64_t>(0, -y0)), rhi = static_cast<int>(std::min<int64_t>(6, s.h - y0));
    clo = static_cast<int>(std::max<int64_t>(0, -x0)), chi = static_cast<int>(std::min<int64_t>(6, s.w - x0));
  }
  const __m512 zero = _mm512_setzero_ps();
  alignas(64) float tmp[6][6][16];
  for (int64_t cb = 0; cb < cb_n; ++cb) {
    const float* base = src + ((img * cb_n + cb) * s.h * s.w) * 16;
    for (int r = 0; r < 6; ++r) {
      __m512 d[6], t6[6];
      if (r < rlo || r >= rhi) {
        for (int k = 0; k < 6; ++k) _mm512_store_ps(tmp[r][k], zero);
        continue;
      }
      const float* row = base + ((y0 + r) * s.w + x0) * 16;
      if (inside) {
#pragma GCC unroll 6
        for (int k = 0; k < 6; ++k) d[k] = _mm512_loadu_ps(row + k * 16);
      } else {
        for (int k = 0; k < 6; ++k) d[k] = (k >= clo && k < chi) ? _mm512_loadu_ps(row + k * 16) : zero;
      }
      bt6(d, t6);
#pragma GCC unroll 6
      for (int k = 0; k < 6; ++k) _mm512_store_ps(tmp[r][k], t6[k]);
    }
#pragma GCC unroll 6
    for (int k = 0; k < 6; ++k) {
      __m512 d[6], t6[6];
#pragma GCC unroll 6
      for (int r = 0; r < 6; ++r) d[r] = _mm512_load_ps(tmp[r][k]);
      bt6(d, t6);
#pragma GCC unroll 6
      for (int i = 0; i < 6; ++i) _mm512_storeu_ps(V + (i * 6 + k) * padded(bt * s.c) + t * s.c + cb * 16, t6[i]);
    }
  }
}

// out[t][0..NV*16) = sum over k < K of A[t * lda + k] * B[k * NV * 16 + ..] for T tiles, added to what out holds
// when `add` (a streamed chunk after the first).
template <int T, int NV>
__attribute__((target("avx512f"))) void product(const float* A, int64_t lda, const float* B, int64_t K, float* out,
                                                bool add) {
  __m512 acc[T][NV];
#pragma GCC unroll 14
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[t][v] = add ? _mm512_load_ps(out + (t * NV + v) * 16) : _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t k = 0; k < K; ++k) {
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

using ProductFn = void (*)(const float*, int64_t, const float*, int64_t, float*, bool);

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

// Streamed weights: G g G^T of input channels [c0, c0 + kc) of group g (plain taps [c][9][wg] at `P`) into
// U[p][kc][wg], the layout the products read.
__attribute__((target("avx512f"))) void transform_weights(const float* P, int64_t wg, int64_t c0, int64_t kc,
                                                          float* U) {
  for (int64_t c = 0; c < kc; ++c)
    for (int64_t v = 0; v < wg / 16; ++v) {
      const float* k = P + (c0 + c) * 9 * wg + v * 16;
      __m512 col[3][6];  // G g: col[b][i] = row i of G times column b of the taps
#pragma GCC unroll 3
      for (int b = 0; b < 3; ++b)
        g3(_mm512_loadu_ps(k + b * wg), _mm512_loadu_ps(k + (3 + b) * wg), _mm512_loadu_ps(k + (6 + b) * wg), col[b]);
#pragma GCC unroll 6
      for (int i = 0; i < 6; ++i) {
        __m512 r[6];
        g3(col[0][i], col[1][i], col[2][i], r);
#pragma GCC unroll 6
        for (int j = 0; j < 6; ++j) _mm512_store_ps(U + (i * 6 + j) * padded(kc * wg) + c * wg + v * 16, r[j]);
      }
    }
}

// Output transform of `nt` tiles from M[p][t][nv * 16] (output channels 16 ob0 ..), bias, Relu, into dst.
__attribute__((target("avx512f"))) void output_tiles(const Wino4Shape& s, const float* M, int nt, int nv, int64_t q0,
                                                     int64_t ob0, const float* bias, float* dst) {
  const int64_t tw = s.tiles_w(), tpi = s.tiles_h() * tw, mb_n = s.m / 16;
  const __m512 zero = _mm512_setzero_ps();
  const int64_t stride_p = padded(static_cast<int64_t>(nt) * nv * 16);
  for (int t = 0; t < nt; ++t) {
    const int64_t q = q0 + t, img = q / tpi, ti = (q % tpi) / tw, tj = q % tw;
    const int64_t y0 = 4 * ti, x0 = 4 * tj;
    const int rows = static_cast<int>(std::min<int64_t>(4, s.h - y0)),
              cols = static_cast<int>(std::min<int64_t>(4, s.w - x0));
    for (int v = 0; v < nv; ++v) {
      const float* m0 = M + (t * nv + v) * 16;
      __m512 tmp[6][4];
#pragma GCC unroll 6
      for (int i = 0; i < 6; ++i) {
        __m512 m[6];
#pragma GCC unroll 6
        for (int k = 0; k < 6; ++k) m[k] = _mm512_load_ps(m0 + (i * 6 + k) * stride_p);
        at6(m, tmp[i]);
      }
      const int64_t ob = ob0 + v;
      const __m512 b = _mm512_loadu_ps(bias + ob * 16);
      float* out = dst + (((img * mb_n + ob) * s.h + y0) * s.w + x0) * 16;
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        __m512 col[6], o[4];
#pragma GCC unroll 6
        for (int i = 0; i < 6; ++i) col[i] = tmp[i][k];
        at6(col, o);
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
void run_tiles(const Wino4Shape& s, const float* src, const float* packed, const float* bias, float* dst,
               float* scratch, int64_t begin, int64_t end, int64_t g0, int64_t g1) {
  const int64_t bt_max = block_tiles(s), tw = s.tiles_w(), tpi = s.tiles_h() * tw;
  const int64_t kc_max = s.streamed ? chunk_channels(s) : s.c;
  float* V = scratch;                        // [36][bt][c]
  float* M = V + 36 * padded(bt_max * s.c);  // [36][kRegTiles][32]; streamed: [36][bt][32]
  float* U = M + products_floats(s);         // streamed: [36][chunk][32]
  for (int64_t b0 = begin; b0 < end; b0 += bt_max) {
    const int64_t bt = std::min(bt_max, end - b0);
    for (int64_t t = 0; t < bt; ++t) {
      const int64_t q = b0 + t;
      input_tile(s, src, q / tpi, (q % tpi) / tw, q % tw, V, bt, t);
    }
    // Register tiles of near-equal size (16 tiles as 8 + 8, not 14 + 2: a tile of 2 leaves the FMA units waiting).
    const int64_t n_rt = (bt + kRegTiles - 1) / kRegTiles, rt = (bt + n_rt - 1) / n_rt;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t wg = group_width(s, g);
      const int nv = static_cast<int>(wg / 16);
      if (!s.streamed) {
        const float* W = packed + 36 * s.c * 32 * g;  // groups before g are all 32 wide
        for (int64_t r0 = 0; r0 < bt; r0 += rt) {
          const int nt = static_cast<int>(std::min(rt, bt - r0));
          const ProductFn f = product_fn(nt, nv);
          for (int p = 0; p < 36; ++p)
            f(V + p * padded(bt * s.c) + r0 * s.c, s.c, W + p * s.c * wg, s.c, M + p * padded(nt * wg), false);
          output_tiles(s, M, nt, nv, b0 + r0, 2 * g, bias, dst);
        }
        continue;
      }
      // Streamed: per chunk of input channels, its weights transformed into U, then the block's products over the
      // chunk added into M ([36][bt][wg]). The next chunk's taps (this group's or the next one's first) are
      // prefetched into L2 during the products, so that its transform does not wait for memory.
      for (int64_t c0 = 0; c0 < s.c; c0 += kc_max) {
        const int64_t kc = std::min(kc_max, s.c - c0);
        transform_weights(packed + 9 * s.c * 32 * g, wg, c0, kc, U);
        const char* next = nullptr;
        int64_t next_lines = 0;
        if (c0 + kc < s.c) {
          next = reinterpret_cast<const char*>(packed + 9 * s.c * 32 * g + (c0 + kc) * 9 * wg);
          next_lines = std::min(kc_max, s.c - c0 - kc) * 9 * wg * 4 / 64;
        } else if (g + 1 < g1) {
          next = reinterpret_cast<const char*>(packed + 9 * s.c * 32 * (g + 1));
          next_lines = std::min(kc_max, s.c) * 9 * group_width(s, g + 1) * 4 / 64;
        }
        for (int p = 0; p < 36; ++p) {
          for (int64_t l = p * next_lines / 36; l < (p + 1) * next_lines / 36; ++l)
            _mm_prefetch(next + l * 64, _MM_HINT_T1);
          for (int64_t r0 = 0; r0 < bt; r0 += rt) {
            const int nt = static_cast<int>(std::min(rt, bt - r0));
            product_fn(nt, nv)(V + p * padded(bt * s.c) + r0 * s.c + c0, s.c, U + p * padded(kc * wg), kc,
                               M + p * padded(bt * wg) + r0 * wg, c0 > 0);
          }
        }
      }
      output_tiles(s, M, static_cast<int>(bt), nv, b0, 2 * g, bias, dst);
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

size_t wino4_packed_floats(const Wino4Shape& s) { return static_cast<size_t>((s.streamed ? 9 : 36) * s.c * s.m); }

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
  for (int64_t o = 0; o < s.m; ++o) {
    const int64_t g = o / 32, wg = group_width(s, g), lane = o % 32;
    float* U = packed + 36 * s.c * 32 * g;
    for (int64_t c = 0; c < s.c; ++c) {
      const float* k = w + (o * s.c + c) * 9;
      double gk[6][3];  // G g
      for (int i = 0; i < 6; ++i)
        for (int b = 0; b < 3; ++b) gk[i][b] = G[i][0] * k[b] + G[i][1] * k[3 + b] + G[i][2] * k[6 + b];
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 6; ++j)
          U[((i * 6 + j) * s.c + c) * wg + lane] =
              static_cast<float>(gk[i][0] * G[j][0] + gk[i][1] * G[j][1] + gk[i][2] * G[j][2]);
    }
  }
}

size_t wino4_scratch_floats(const Wino4Shape& s) {
  return static_cast<size_t>(36 * padded(block_tiles(s) * s.c) + products_floats(s) +
                             (s.streamed ? 36 * padded(chunk_channels(s) * 32) : 0)) +
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
  const bool by_groups =
      team > 1 &&
      (s.streamed ? ng >= team : ng >= 2 * team && wino4_packed_floats(s) * sizeof(float) > kSharedWeightBytes);
  if (by_groups) {
    split_over_team(ng, team, [&](int64_t t, int64_t g0, int64_t g1) {
      if (g1 > g0) run_tiles(s, src, packed, bias, dst, own_scratch(t), 0, tiles, g0, g1);
    });
  } else {
    split_over_team(tiles, team, [&](int64_t t, int64_t begin, int64_t end) {
      if (end > begin) run_tiles(s, src, packed, bias, dst, own_scratch(t), begin, end, 0, ng);
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
