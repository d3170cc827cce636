// plugins/cpu_onednn/steps/expand_dw.cc — a 1x1 convolution and its 3x3 depthwise reader in one pass over nChw16c
// (steps/expand_dw.h).
//
// Per thread: output rows in order; for each, the (up to three) expanded rows it reads are computed into a ring of
// three slots unless already there (slot = input row mod 3, so consecutive rows never evict each other), then the
// depthwise output row from the slots, one 32-channel group at a time (the group's part of the slots stays in L1
// from its expansion to its depthwise convolution). Rows outside the image are skipped taps, columns outside it the
// slots' zero columns. Registers: the expansion 14 pixels x 2 vectors of accumulators (the products at the FMA rate:
// 24 -> 144 at 56x56 200 GFLOP/s on one core of the AMD EPYC host), the depthwise 8 (stride 1) or 6 (stride 2)
// output pixels with their 9 weight vectors and the input columns of each row loaded once.
#include "steps/expand_dw.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/team.h"
#include "steps/silu.h"
#include "steps/silu16.h"

namespace keel::onednn {
namespace {

constexpr int kTile = 14;                 // pixels per register tile of the expansion (14 x 2 accumulators)
constexpr int64_t kMinRowsPerThread = 7;  // fewer: the team splits channel groups instead of rows

int64_t groups(const ExpandDwShape& s) { return (s.m + 31) / 32; }
int64_t group_width(const ExpandDwShape& s, int64_t g) { return std::min<int64_t>(32, s.m - 32 * g); }
int64_t ring_row_floats(const ExpandDwShape& s) { return s.m * (s.w + 2); }
int64_t blocks_of(int64_t c) { return (c + 15) / 16; }

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

// T pixels x NV * 16 expanded channels of one row: out[v * out_stride + t * 16 + lane] = act(bias + sum over k < c
// of src[(k / 16) * block_stride + t * 16 + k % 16] * U[k * NV * 16 + v * 16 + lane]).
template <int T, int NV>
__attribute__((target("avx512f"))) void expand_tile(const float* src, int64_t block_stride, int64_t c, const float* U,
                                                    const float* bias, const ExpandDwAct& act, float* out,
                                                    int64_t out_stride) {
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
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v)
#pragma GCC unroll 14
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(out + v * out_stride + t * 16, act16(act, acc[t][v]));
}

using ExpandFn = void (*)(const float*, int64_t, int64_t, const float*, const float*, const ExpandDwAct&, float*,
                          int64_t);
template <int NV, int... T>
constexpr ExpandFn expand_of(int t, std::integer_sequence<int, T...>) {
  constexpr ExpandFn fns[] = {expand_tile<T + 1, NV>...};
  return fns[t - 1];
}
ExpandFn expand_fn(int tiles, int nv) {
  using Seq = std::make_integer_sequence<int, kTile>;
  return nv == 2 ? expand_of<2>(tiles, Seq{}) : expand_of<1>(tiles, Seq{});
}

// NX output pixels of one 16-channel block from the ring rows (null: outside the image, skipped), the input columns
// of each row loaded once: out[j * 16 + lane] = act(bias + sum over dy, dx of rows[dy][col + (j * S + dx) * 16 +
// lane] * wv[dy * 3 + dx]).
template <int NX, int S>
__attribute__((target("avx512f"), always_inline)) inline void dw_tile(const float* const* rows, int64_t col,
                                                                      const __m512* wv, __m512 bias,
                                                                      const ExpandDwAct& act, float* out) {
  constexpr int kCols = (NX - 1) * S + 3;
  __m512 acc[NX];
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) acc[j] = bias;
#pragma GCC unroll 3
  for (int dy = 0; dy < 3; ++dy) {
    if (rows[dy] == nullptr) continue;
    const float* r = rows[dy] + col;
    __m512 in[kCols];
#pragma GCC unroll 16
    for (int i = 0; i < kCols; ++i) in[i] = _mm512_loadu_ps(r + i * 16);
#pragma GCC unroll 3
    for (int dx = 0; dx < 3; ++dx)
#pragma GCC unroll 8
      for (int j = 0; j < NX; ++j) acc[j] = _mm512_fmadd_ps(in[j * S + dx], wv[dy * 3 + dx], acc[j]);
  }
#pragma GCC unroll 8
  for (int j = 0; j < NX; ++j) _mm512_storeu_ps(out + j * 16, act16(act, acc[j]));
}

// The last `rem` (< N) pixels of a row.
template <int N, int S>
__attribute__((target("avx512f"), always_inline)) inline void dw_tail(int rem, const float* const* rows, int64_t col,
                                                                      const __m512* wv, __m512 bias,
                                                                      const ExpandDwAct& act, float* out) {
  if constexpr (N > 0) {
    if (rem == N) return dw_tile<N, S>(rows, col, wv, bias, act, out);
    dw_tail<N - 1, S>(rem, rows, col, wv, bias, act, out);
  }
}

// One output row of one 16-channel block: rows[dy] point at the block's ring column 0 (the zero column left of the
// image), wd its 9 weight vectors, b its bias; ow pixels into out.
template <int S>
__attribute__((target("avx512f"))) void dw_row(const float* const* rows, const float* wd, const float* b,
                                               const ExpandDwAct& act, float* out, int64_t ow) {
  constexpr int NX = S == 1 ? 8 : 6;  // registers: NX accumulators, (NX - 1) S + 3 columns, 9 weights
  __m512 wv[9];
#pragma GCC unroll 9
  for (int t = 0; t < 9; ++t) wv[t] = _mm512_loadu_ps(wd + t * 16);
  const __m512 bias = _mm512_loadu_ps(b);
  int64_t ox = 0;
  for (; ox + NX <= ow; ox += NX) dw_tile<NX, S>(rows, ox * S * 16, wv, bias, act, out + ox * 16);
  if (ox < ow) dw_tail<NX - 1, S>(static_cast<int>(ow - ox), rows, ox * S * 16, wv, bias, act, out + ox * 16);
}

#pragma GCC diagnostic pop

struct Packed {
  const float *u, *wd, *b1, *b2;
};
Packed parts(const ExpandDwShape& s, const float* packed) {
  const float* wd = packed + s.c * s.m;
  return {packed, wd, wd + 9 * s.m, wd + 10 * s.m};
}

// Expanded row iy of image img, channel group g, into ring slot `row` ([m/16][w+2][16], columns 1..w).
void expand_row(const ExpandDwShape& s, const float* src, const Packed& p, int64_t img, int64_t iy, int64_t g,
                float* row) {
  const int64_t cb = blocks_of(s.c), wp = s.w + 2;
  const float* in = src + (img * cb * s.h + iy) * s.w * 16;
  const int nv = static_cast<int>(group_width(s, g) / 16);
  const float* U = p.u + 32 * s.c * g;  // groups before g are all 32 wide
  float* out = row + 2 * g * wp * 16 + 16;
  for (int64_t x0 = 0; x0 < s.w; x0 += kTile) {
    const int t = static_cast<int>(std::min<int64_t>(kTile, s.w - x0));
    expand_fn(t, nv)(in + x0 * 16, s.h * s.w * 16, s.c, U, p.b1 + 32 * g, s.act1, out + x0 * 16, wp * 16);
  }
}

// Output rows [r0, r1) of the n * oh (image-major), channel groups [g0, g1), on the calling thread; ring: three
// slots of ring_row_floats(s). Per output row and group, the group's missing expanded rows, then its two depthwise
// output rows: the group's part of the three slots (3 x (w+2) x 32 floats) stays in L1 between the two.
void run_part(const ExpandDwShape& s, const float* src, const Packed& p, float* dst, float* ring, int64_t r0,
              int64_t r1, int64_t g0, int64_t g1) {
  const int64_t rowf = ring_row_floats(s), wp = s.w + 2, oh = s.oh(), ow = s.ow(), mb = s.m / 16;
  for (int slot = 0; slot < 3; ++slot)
    for (int64_t ob = 2 * g0; ob < std::min(2 * g1, mb); ++ob) {
      float* r = ring + slot * rowf + ob * wp * 16;
      std::fill(r, r + 16, 0.f);
      std::fill(r + (s.w + 1) * 16, r + (s.w + 2) * 16, 0.f);
    }
  int64_t have_img[3] = {-1, -1, -1}, have_row[3] = {-1, -1, -1};
  for (int64_t flat = r0; flat < r1; ++flat) {
    const int64_t img = flat / oh, oy = flat % oh;
    float* slot_of[3] = {nullptr, nullptr, nullptr};
    int64_t compute_row[3] = {-1, -1, -1};  // per dy: the input row to expand into its slot first, or -1
    for (int dy = 0; dy < 3; ++dy) {
      const int64_t iy = oy * s.stride - 1 + dy;
      if (iy < 0 || iy >= s.h) continue;
      const int slot = static_cast<int>(iy % 3);
      slot_of[dy] = ring + slot * rowf;
      if (have_img[slot] != img || have_row[slot] != iy) {
        compute_row[dy] = iy;
        have_img[slot] = img, have_row[slot] = iy;
      }
    }
    for (int64_t g = g0; g < g1; ++g) {
      for (int dy = 0; dy < 3; ++dy)
        if (compute_row[dy] >= 0) expand_row(s, src, p, img, compute_row[dy], g, slot_of[dy]);
      for (int64_t ob = 2 * g; ob < std::min(2 * g + 2, mb); ++ob) {
        const float* rows[3];
        for (int dy = 0; dy < 3; ++dy) rows[dy] = slot_of[dy] ? slot_of[dy] + ob * wp * 16 : nullptr;
        float* out = dst + ((img * mb + ob) * oh + oy) * ow * 16;
        if (s.stride == 2) dw_row<2>(rows, p.wd + ob * 9 * 16, p.b2 + ob * 16, s.act2, out, ow);
        else dw_row<1>(rows, p.wd + ob * 9 * 16, p.b2 + ob * 16, s.act2, out, ow);
      }
    }
  }
}

}  // namespace

std::string expand_dw_check(const ExpandDwShape& s) {
  if (!has_avx512f()) return "no AVX-512";
  if (s.n < 1 || s.h < 1 || s.w < 1 || s.c < 1) return "empty source";
  if (s.m < 16 || s.m % 16 != 0) return "expanded channels not a multiple of 16";
  if (s.stride != 1 && s.stride != 2) return "depthwise stride not 1 or 2";
  for (const ExpandDwAct* a : {&s.act1, &s.act2})
    if (a->kind == ExpandDwAct::kClip && !(a->lo <= a->hi)) return "clip bounds out of order";
  return "";
}

size_t expand_dw_packed_floats(const ExpandDwShape& s) { return static_cast<size_t>(s.c * s.m + 11 * s.m); }

void expand_dw_pack(const ExpandDwShape& s, const float* w1, const float* b1, const float* w2, const float* b2,
                    float* packed) {
  for (int64_t o = 0; o < s.m; ++o) {
    const int64_t g = o / 32, wg = group_width(s, g), lane = o % 32;
    float* U = packed + 32 * s.c * g;
    for (int64_t k = 0; k < s.c; ++k) U[k * wg + lane] = w1[o * s.c + k];
  }
  float* wd = packed + s.c * s.m;
  for (int64_t o = 0; o < s.m; ++o)
    for (int t = 0; t < 9; ++t) wd[((o / 16) * 9 + t) * 16 + o % 16] = w2[o * 9 + t];
  std::copy(b1, b1 + s.m, wd + 9 * s.m);
  std::copy(b2, b2 + s.m, wd + 10 * s.m);
}

size_t expand_dw_scratch_floats(const ExpandDwShape& s) { return static_cast<size_t>(3 * ring_row_floats(s) + 16); }

bool expand_dw_splits_rows(const ExpandDwShape& s, int team) {
  return team <= 1 || s.n * s.oh() >= kMinRowsPerThread * team || groups(s) < team;
}

void expand_dw_run(const ExpandDwShape& s, const float* src, const float* packed, float* dst, float* scratch,
                   int team) {
  const size_t per = expand_dw_scratch_floats(s);
  auto own_scratch = [&](int64_t t) {
    float* own = scratch + static_cast<size_t>(t) * per;
    return own + (64 - reinterpret_cast<uintptr_t>(own) % 64) % 64 / sizeof(float);  // 64-byte aligned
  };
  const Packed p = parts(s, packed);
  const int64_t rows = s.n * s.oh(), ng = groups(s);
  if (expand_dw_splits_rows(s, team)) {
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
                         const float* b2, float* dst) {
  const int64_t cb = blocks_of(s.c), mb = s.m / 16, oh = s.oh(), ow = s.ow();
  std::vector<float> e(static_cast<size_t>(s.n * s.m * s.h * s.w));  // [n][m][h][w]
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t o = 0; o < s.m; ++o)
      for (int64_t y = 0; y < s.h; ++y)
        for (int64_t x = 0; x < s.w; ++x) {
          double acc = b1[o];
          for (int64_t k = 0; k < s.c; ++k)
            acc +=
                static_cast<double>(src[(((img * cb + k / 16) * s.h + y) * s.w + x) * 16 + k % 16]) * w1[o * s.c + k];
          e[((img * s.m + o) * s.h + y) * s.w + x] = act_scalar(s.act1, static_cast<float>(acc));
        }
  for (int64_t img = 0; img < s.n; ++img)
    for (int64_t o = 0; o < s.m; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x) {
          double acc = b2[o];
          for (int64_t a = 0; a < 3; ++a)
            for (int64_t b = 0; b < 3; ++b) {
              const int64_t iy = y * s.stride - 1 + a, ix = x * s.stride - 1 + b;
              if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
              acc += static_cast<double>(e[((img * s.m + o) * s.h + iy) * s.w + ix]) * w2[o * 9 + a * 3 + b];
            }
          dst[(((img * mb + o / 16) * oh + y) * ow + x) * 16 + o % 16] = act_scalar(s.act2, static_cast<float>(acc));
        }
}

}  // namespace keel::onednn
