// plugins/cpu_onednn/onednn_relu_sparse.cc — a product that skips A's exact zeros (onednn_relu_sparse.h).
//
// Column tiles of W <= 128 columns (8 accumulators per row); per tile, kRowBlock rows at a time over blocks of K
// whose B rows (k_block(W) rows x W floats, 32 KB) stay in L1; rows in pairs. Per pair and block, one compare per
// 16 entries of each row and vcompressps / vpcompressd split the nonzeros into three lists: indices where both rows
// are nonzero (each B vector loaded once into a register for both rows' FMAs), and values + indices where only one
// is (one loop walks the two lists side by side, the shorter padded with zeros, B read as FMA memory operands).
// The loops' only data-dependent branches are their exits, once per (pair, block).
#include "onednn_relu_sparse.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "onednn_silu.h"
#include "onednn_team.h"

namespace keel::onednn {
namespace {

std::atomic<bool> g_scalar{false};  // relu_sparse_force_scalar

constexpr int64_t kTile = 128;  // columns per tile: 8 accumulators per row, two rows at a time
constexpr int64_t kRowBlock = 32;  // rows whose outputs stay in L1 / L2 while the blocks of K pass (even: pairs)

// Rows of B per block for a tile of w columns: 32 KB of B, a multiple of 16, at most 512.
constexpr int64_t k_block(int64_t w) { return std::min<int64_t>(512, std::max<int64_t>(16, 8192 / w / 16 * 16)); }

// The nonzeros of two rows of A in one block of K, split three ways: the indices where both rows are nonzero (one
// list: the values are read from A), and the values and indices where only row 0 or only row 1 is.
struct PairLists {
  int both = 0, only0 = 0, only1 = 0;
};

__attribute__((target("avx512f"))) PairLists compress_pair(const float* a0, const float* a1, int64_t kn, int32_t* bi,
                                                            float* ov0, int32_t* oi0, float* ov1, int32_t* oi1) {
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 zero = _mm512_setzero_ps();
  PairLists n;
  for (int64_t k = 0; k < kn; k += 16) {
    const __mmask16 in = kn - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (kn - k)) - 1);
    const __m512 v0 = _mm512_maskz_loadu_ps(in, a0 + k), v1 = _mm512_maskz_loadu_ps(in, a1 + k);
    // NaN compares unequal to 0: it counts as nonzero and reaches its row.
    const __mmask16 z0 = _mm512_mask_cmp_ps_mask(in, v0, zero, _CMP_NEQ_UQ);
    const __mmask16 z1 = _mm512_mask_cmp_ps_mask(in, v1, zero, _CMP_NEQ_UQ);
    const __mmask16 both = z0 & z1, only0 = z0 & ~z1, only1 = z1 & ~z0;
    const __m512i ix = _mm512_add_epi32(iota, _mm512_set1_epi32(int(k)));
    _mm512_storeu_si512(bi + n.both, _mm512_maskz_compress_epi32(both, ix));
    _mm512_storeu_ps(ov0 + n.only0, _mm512_maskz_compress_ps(only0, v0));
    _mm512_storeu_si512(oi0 + n.only0, _mm512_maskz_compress_epi32(only0, ix));
    _mm512_storeu_ps(ov1 + n.only1, _mm512_maskz_compress_ps(only1, v1));
    _mm512_storeu_si512(oi1 + n.only1, _mm512_maskz_compress_epi32(only1, ix));
    n.both += __builtin_popcount(both);
    n.only0 += __builtin_popcount(only0);
    n.only1 += __builtin_popcount(only1);
  }
  return n;
}

// Pads the shorter of the two "only" lists with zero entries (value 0, B row 0) up to the longer one's length, so
// that one loop walks both.
__attribute__((target("avx512f"))) void pad_shorter(PairLists& n, float* ov0, int32_t* oi0, float* ov1,
                                                    int32_t* oi1) {
  float* v = n.only0 < n.only1 ? ov0 : ov1;
  int32_t* i = n.only0 < n.only1 ? oi0 : oi1;
  for (int p = std::min(n.only0, n.only1); p < std::max(n.only0, n.only1); p += 16) {
    _mm512_storeu_ps(v + p, _mm512_setzero_ps());
    _mm512_storeu_si512(i + p, _mm512_setzero_si512());
  }
}

template <int NT>
__attribute__((target("avx512f"))) inline void start_row(const ReluSparseShape& s, const float* bias, float* cr,
                                                         bool first, __m512* acc) {
#pragma GCC unroll 8
  for (int j = 0; j < NT; ++j) {
    if (!first) {
      acc[j] = _mm512_loadu_ps(cr + 16 * j);
      continue;
    }
    acc[j] = bias ? _mm512_loadu_ps(bias + 16 * j) : _mm512_setzero_ps();
    if (s.accumulate) acc[j] = _mm512_add_ps(acc[j], _mm512_loadu_ps(cr + 16 * j));
  }
}

// The B row of index i in a block (W floats), as one base register: GCC would otherwise address it as base + index,
// and indexed memory operands cost an extra uop each on Intel cores.
template <int64_t W>
__attribute__((always_inline)) inline const float* brow(const float* bb, int32_t i) {
  const float* br = bb + int64_t(i) * W;
  asm("" : "+r"(br));
  return br;
}

// One tile of W = 16 * NT <= 128 columns (B packed [k][W]), rows [begin, end) in pairs, kRowBlock rows at a time
// over each block of K. Per pair and block: where both rows are nonzero, each B vector is loaded once into a register
// for both rows' FMAs; where only one is, one loop walks both rows' lists side by side (the shorter padded with
// zeros), with B as FMA memory operands.
template <int NT>
__attribute__((target("avx512f"))) void tile_avx512(const ReluSparseShape& s, const float* a, const float* bt,
                                                    const float* bias, float* c, int64_t begin, int64_t end) {
  constexpr int64_t W = NT * 16, KB = k_block(W);
  alignas(64) static const float kZeros[KB] = {};  // the partner of an unpaired row
  // 16 entries of slack: each compare's compressed vector, and each pad, is stored whole.
  alignas(64) float ov0[KB + 16], ov1[KB + 16];
  alignas(64) int32_t bi[KB + 16], oi0[KB + 16], oi1[KB + 16];
  for (int64_t m0 = begin; m0 < end; m0 += kRowBlock) {
    const int64_t m1 = std::min(end, m0 + kRowBlock);
    for (int64_t k0 = 0; k0 < s.k; k0 += KB) {
      const int64_t kn = std::min(s.k - k0, KB);
      const float* bb = bt + k0 * W;
      for (int64_t m = m0; m < m1; m += 2) {
        const bool pair = m + 1 < m1;
        const float* a0 = a + m * s.lda + k0;
        const float* a1 = pair ? a0 + s.lda : kZeros;
        PairLists n = compress_pair(a0, a1, kn, bi, ov0, oi0, ov1, oi1);
        float* c0 = c + m * s.n;
        float* c1 = c0 + s.n;
        __m512 acc0[NT];
        start_row<NT>(s, bias, c0, k0 == 0, acc0);
        if (!pair) {  // all of the row's nonzeros are in its "only" list
          for (int p = 0; p < n.only0; ++p) {
            const __m512 x = _mm512_set1_ps(ov0[p]);
            const float* br = brow<W>(bb, oi0[p]);
#pragma GCC unroll 8
            for (int j = 0; j < NT; ++j) acc0[j] = _mm512_fmadd_ps(x, _mm512_loadu_ps(br + 16 * j), acc0[j]);
          }
        } else {
          __m512 acc1[NT];
          start_row<NT>(s, bias, c1, k0 == 0, acc1);
          for (int p = 0; p < n.both; ++p) {
            const int32_t i = bi[p];
            const __m512 x0 = _mm512_set1_ps(a0[i]), x1 = _mm512_set1_ps(a1[i]);
            const float* br = brow<W>(bb, i);
#pragma GCC unroll 8
            for (int j = 0; j < NT; ++j) {
              __m512 w = _mm512_loadu_ps(br + 16 * j);
              asm("" : "+v"(w));  // one load for both FMAs: keeps GCC from folding it into each as a memory operand
              acc0[j] = _mm512_fmadd_ps(x0, w, acc0[j]);
              acc1[j] = _mm512_fmadd_ps(x1, w, acc1[j]);
            }
          }
          pad_shorter(n, ov0, oi0, ov1, oi1);
          for (int p = 0, e = std::max(n.only0, n.only1); p < e; ++p) {
            const __m512 x0 = _mm512_set1_ps(ov0[p]), x1 = _mm512_set1_ps(ov1[p]);
            const float* br0 = brow<W>(bb, oi0[p]);
            const float* br1 = brow<W>(bb, oi1[p]);
#pragma GCC unroll 8
            for (int j = 0; j < NT; ++j) {
              acc0[j] = _mm512_fmadd_ps(x0, _mm512_loadu_ps(br0 + 16 * j), acc0[j]);
              acc1[j] = _mm512_fmadd_ps(x1, _mm512_loadu_ps(br1 + 16 * j), acc1[j]);
            }
          }
#pragma GCC unroll 8
          for (int j = 0; j < NT; ++j) _mm512_storeu_ps(c1 + 16 * j, acc1[j]);
        }
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) _mm512_storeu_ps(c0 + 16 * j, acc0[j]);
      }
    }
  }
}

using TileFn = void (*)(const ReluSparseShape&, const float*, const float*, const float*, float*, int64_t, int64_t);

template <int... NT>
constexpr TileFn pick(int nt, std::integer_sequence<int, NT...>) {
  TileFn f = nullptr;
  ((f = nt == NT + 1 ? tile_avx512<NT + 1> : f), ...);
  return f;
}

void tile_scalar(const ReluSparseShape& s, const float* a, const float* bt, const float* bias, float* c, int64_t w,
                 int64_t begin, int64_t end) {
  const int64_t KB = k_block(w);
  for (int64_t k0 = 0; k0 < s.k; k0 += KB) {
    const int64_t k1 = std::min(s.k, k0 + KB);
    for (int64_t m = begin; m < end; ++m) {
      float* cr = c + m * s.n;
      if (k0 == 0)
        for (int64_t j = 0; j < w; ++j) cr[j] = (bias ? bias[j] : 0.f) + (s.accumulate ? cr[j] : 0.f);
      const float* ar = a + m * s.lda;
      for (int64_t k = k0; k < k1; ++k) {
        const float x = ar[k];
        if (x == 0.f) continue;  // NaN is not 0: it reaches the row
        const float* br = bt + k * w;
        for (int64_t j = 0; j < w; ++j) cr[j] += x * br[j];
      }
    }
  }
}

}  // namespace

std::string relu_sparse_check(const ReluSparseShape& s) {
  if (s.n <= 0 || s.n % 16 != 0) return "columns not a positive multiple of 16";
  if (s.k <= 0) return "empty inner dimension";
  if (s.m < 0) return "negative rows";
  if (s.lda < s.k) return "row stride of A below its width";
  return "";
}

size_t relu_sparse_packed_floats(const ReluSparseShape& s) { return static_cast<size_t>(s.k * s.n); }

void relu_sparse_pack(const ReluSparseShape& s, const float* b, float* packed) {
  for (int64_t t0 = 0; t0 < s.n; t0 += kTile) {
    const int64_t w = std::min(kTile, s.n - t0);
    float* tile = packed + t0 * s.k;
    for (int64_t k = 0; k < s.k; ++k) std::copy(b + k * s.n + t0, b + k * s.n + t0 + w, tile + k * w);
  }
}

void relu_sparse_rows(const ReluSparseShape& s, const float* a, const float* packed, const float* bias, float* c,
                      int64_t begin, int64_t end) {
  const bool vec = has_avx512f() && !g_scalar.load(std::memory_order_relaxed);
  for (int64_t t0 = 0; t0 < s.n; t0 += kTile) {
    const int64_t w = std::min(kTile, s.n - t0);
    const float* bt = packed + t0 * s.k;
    const float* bs = bias ? bias + t0 : nullptr;
    if (vec) pick(int(w / 16), std::make_integer_sequence<int, kTile / 16>())(s, a, bt, bs, c + t0, begin, end);
    else tile_scalar(s, a, bt, bs, c + t0, w, begin, end);
  }
}

void relu_sparse_run(const ReluSparseShape& s, const float* a, const float* packed, const float* bias, float* c,
                     int team) {
  split_over_team(s.m, team, [&](int64_t, int64_t begin, int64_t end) {
    relu_sparse_rows(s, a, packed, bias, c, begin, end);
  });
}

namespace {
__attribute__((target("avx512f"))) int64_t count_nonzero_avx512(const float* p, int64_t n) {
  int64_t cnt = 0;
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) cnt += __builtin_popcount(_mm512_cmp_ps_mask(_mm512_loadu_ps(p + i), zero, _CMP_NEQ_UQ));
  for (; i < n; ++i) cnt += p[i] != 0.f;
  return cnt;
}
}  // namespace

double relu_sparse_density(const ReluSparseShape& s, const float* a, int64_t row_step) {
  const bool vec = has_avx512f() && !g_scalar.load(std::memory_order_relaxed);
  int64_t nz = 0, all = 0;
  for (int64_t m = 0; m < s.m; m += std::max<int64_t>(1, row_step)) {
    const float* r = a + m * s.lda;
    if (vec) {
      nz += count_nonzero_avx512(r, s.k);
    } else {
      for (int64_t k = 0; k < s.k; ++k) nz += r[k] != 0.f;
    }
    all += s.k;
  }
  return all ? static_cast<double>(nz) / static_cast<double>(all) : 0.0;
}

double relu_sparse_max_density() { return 0.75; }

bool relu_sparse_finite(const float* w, size_t count) {
  for (size_t i = 0; i < count; ++i)
    if (!std::isfinite(w[i])) return false;
  return true;
}

void relu_sparse_force_scalar(bool on) { g_scalar.store(on, std::memory_order_relaxed); }

void relu_sparse_reference(const ReluSparseShape& s, const float* a, const float* b, const float* bias, float* c) {
  for (int64_t m = 0; m < s.m; ++m)
    for (int64_t j = 0; j < s.n; ++j) {
      double acc = (bias ? bias[j] : 0.0) + (s.accumulate ? c[m * s.n + j] : 0.0);
      for (int64_t k = 0; k < s.k; ++k) acc += static_cast<double>(a[m * s.lda + k]) * b[k * s.n + j];
      c[m * s.n + j] = static_cast<float>(acc);
    }
}

}  // namespace keel::onednn
