// plugins/cpu_onednn/steps/attention.cc — fused scaled dot-product attention (steps/attention.h).
//
// One task = one batch entry (a head) x one block of query rows. Per task, on one thread:
//   1. scores S[r][t] = sum_d Q[i0+r][d] * Kt[d][t] for the block's rows, into the thread's scratch (rows x Tp,
//      Tp = T rounded up to 16): register tiles of MR rows x 64 columns, Q's elements broadcast, Kt's rows loaded as
//      vectors (Kt packed once per batch entry into [D][Tp] when its columns are not contiguous: the transpose of K
//      that attention's Kt usually is);
//   2. per row: x = S * scale + mask, its max, e = exp(x - max) in place, 1 / sum(e) kept for step 3 (a row of
//      -inf only gives 0, as the reference kernel's);
//   3. Y[i0+r][:] = (sum_t e[r][t] * V[t][:]) / sum: register tiles of MR rows x 64 columns of V, V's rows loaded
//      as vectors where they are (packed once per batch entry when its columns are not contiguous), stored into Y
//      through its strides.
// The scores never leave the thread's cache. The team splits the tasks into contiguous ranges (batch entry major),
// so a thread packs each Kt it needs once.
#include "steps/attention.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/lanes.h"
#include "common/team.h"
#include "steps/silu.h"

namespace keel::onednn {

Dims dense_strides(const Dims& d) {
  Dims s(d.size(), 1);
  for (size_t k = d.size(); k-- > 1;) s[k - 1] = s[k] * std::max<int64_t>(d[k], 1);
  return s;
}

bool reshape_strides(const Dims& dims, const Dims& strides, const Dims& to, Dims* to_strides) {
  int64_t n = 1, m = 1;
  for (int64_t d : dims) n *= d;
  for (int64_t d : to) m *= d;
  if (n != m || n == 0 || dims.size() != strides.size()) return false;
  Dims od, os;  // the source without its dims of 1
  for (size_t k = 0; k < dims.size(); ++k)
    if (dims[k] != 1) od.push_back(dims[k]), os.push_back(strides[k]);
  to_strides->assign(to.size(), 0);
  size_t oi = 0, ni = 0;
  while (ni < to.size() && oi < od.size()) {
    if (to[ni] == 1) {  // a dim of 1: any stride (set below)
      ++ni;
      continue;
    }
    size_t oj = oi + 1, nj = ni + 1;
    int64_t op = od[oi], np = to[ni];
    while (op != np) {
      if (np < op) {
        if (nj >= to.size()) return false;
        np *= to[nj++];
      } else {
        if (oj >= od.size()) return false;
        op *= od[oj++];
      }
    }
    for (size_t k = oi; k + 1 < oj; ++k)
      if (os[k] != od[k + 1] * os[k + 1]) return false;  // merged source dims must be contiguous
    (*to_strides)[nj - 1] = os[oj - 1];
    for (size_t k = nj - 1; k > ni; --k) (*to_strides)[k - 1] = (*to_strides)[k] * to[k];
    ni = nj;
    oi = oj;
  }
  for (; ni < to.size(); ++ni)
    if (to[ni] != 1) return false;
  if (oi != od.size()) return false;
  // Dims of 1: the stride a dense layout would give them (what oneDNN's descriptors expect to see).
  for (size_t k = to.size(); k-- > 0;)
    if (to[k] == 1) (*to_strides)[k] = k + 1 < to.size() ? (*to_strides)[k + 1] * to[k + 1] : 1;
  return true;
}

bool reshape_atoms(const Dims& dims, const Dims& strides, const Dims& to, Dims* atoms, Dims* atom_strides,
                   std::vector<Dims>* groups) {
  int64_t n = 1, m = 1;
  for (int64_t d : dims) n *= d;
  for (int64_t d : to) m *= d;
  if (n != m || dims.empty() || to.empty() || dims.size() != strides.size()) return false;
  for (int64_t d : dims)
    if (d <= 1) return false;
  for (int64_t d : to)
    if (d <= 1) return false;
  atoms->clear(), atom_strides->clear();
  groups->assign(to.size(), Dims{});
  // Both shapes walked outermost first: each atom is what is left of the current dim of `dims` or of `to`, whichever
  // is smaller and divides the other; its stride is the source dim's times the part of that dim still inside it.
  size_t i = 0, j = 0;
  int64_t ri = dims[0], rj = to[0];
  while (i < dims.size() && j < to.size()) {
    int64_t a;
    if (ri % rj == 0) a = rj;
    else if (rj % ri == 0) a = ri;
    else return false;
    ri /= a, rj /= a;
    (*groups)[j].push_back(static_cast<int64_t>(atoms->size()));
    atoms->push_back(a);
    atom_strides->push_back(strides[i] * ri);
    if (ri == 1 && ++i < dims.size()) ri = dims[i];
    if (rj == 1 && ++j < to.size()) rj = to[j];
  }
  return i == dims.size() && j == to.size();
}

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

std::string str(const Dims& d) {
  std::string s = "[";
  for (size_t k = 0; k < d.size(); ++k) s += (k ? "," : "") + std::to_string(d[k]);
  return s + "]";
}

// Right-aligned broadcast of two shapes (equal dims, or one of them 1); false when they do not broadcast.
bool broadcast(const Dims& a, const Dims& b, Dims* out) {
  const size_t r = std::max(a.size(), b.size());
  out->assign(r, 1);
  for (size_t k = 0; k < r; ++k) {
    const int64_t x = k + a.size() >= r ? a[k + a.size() - r] : 1;
    const int64_t y = k + b.size() >= r ? b[k + b.size() - r] : 1;
    if (x != y && x != 1 && y != 1) return false;
    (*out)[k] = x == 1 ? y : x;
  }
  return true;
}

// Per batch entry (row-major over `batch`), the element offset of an operand whose leading dims (all but its last
// `trailing`) are right-aligned against `batch`: dims of 1 and missing dims broadcast (stride 0).
std::vector<int64_t> batch_offsets(const Dims& batch, const StridedView& v, size_t trailing) {
  const size_t nb = batch.size(), vb = v.dims.size() - std::min(trailing, v.dims.size());
  Dims st(nb, 0);
  for (size_t k = 0; k < nb; ++k) {
    if (k + vb < nb) continue;
    const size_t j = k + vb - nb;
    st[k] = v.dims[j] == 1 ? 0 : v.strides[j];
  }
  int64_t n = 1;
  for (int64_t d : batch) n *= d;
  std::vector<int64_t> off(static_cast<size_t>(n), 0);
  for (int64_t b = 0; b < n; ++b) {
    int64_t rem = b, o = 0;
    for (size_t k = nb; k-- > 0;) {
      o += (rem % batch[k]) * st[k];
      rem /= batch[k];
    }
    off[static_cast<size_t>(b)] = o;
  }
  return off;
}

// The stride of dim `k` counted from the end (1 = last) of a view, 0 when that dim is 1 or absent (broadcast).
int64_t stride_from_end(const StridedView& v, size_t k) {
  if (v.dims.size() < k) return 0;
  const size_t j = v.dims.size() - k;
  return v.dims[j] == 1 ? 0 : v.strides[j];
}

// ------------------------------------------------------------------------------------------------ AVX-512

#pragma GCC diagnostic push
// GCC 12 warns about its own _mm512_undefined_ps() inside max/min/div and the reductions (false positives).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// exp(x) for x <= 88: 2^n * p(r), n = round(x log2 e), r = x - n ln 2, p oneDNN's degree-5 minimax polynomial
// (relative error under 3e-7); 0 below -87 (-inf included), NaN kept. steps/silu16.h's one_plus_exp_neg16 (SiLU's
// and Sigmoid's) computes exp(-x) the same way with the negation folded into the coefficients (one instruction fewer
// in loops their count bounds); exp(x) through it would lose precision (1 + exp(-(-x)) - 1) where exp(x) is small.
__attribute__((target("avx512f"), always_inline)) inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.f), l2e = _mm512_set1_ps(1.44269504088896f);
  const __m512 magic = _mm512_set1_ps(12582912.f);  // 1.5 * 2^23
  const __m512 ln2 = _mm512_set1_ps(0.693147180559945f), one = _mm512_set1_ps(1.f);
  const __m512 p1 = _mm512_set1_ps(0.999999701f), p2 = _mm512_set1_ps(0.499991506f), p3 = _mm512_set1_ps(0.166676521f),
               p4 = _mm512_set1_ps(0.0418978221f), p5 = _mm512_set1_ps(0.00828929059f);
  const __m512 xc = _mm512_max_ps(lo, x);            // NaN stays (max returns its second operand then)
  const __m512 z = _mm512_fmadd_ps(xc, l2e, magic);  // 1.5 * 2^23 + n
  const __m512 n = _mm512_sub_ps(z, magic);
  const __m512 r = _mm512_fnmadd_ps(n, ln2, xc);  // xc - n ln 2
  __m512 p = _mm512_fmadd_ps(p5, r, p4);
  p = _mm512_fmadd_ps(p, r, p3);
  p = _mm512_fmadd_ps(p, r, p2);
  p = _mm512_fmadd_ps(p, r, p1);
  p = _mm512_fmadd_ps(p, r, one);
  const __m512 pow2n =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_castps_si512(z), _mm512_set1_epi32(127)), 23));
  return _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), p, pow2n);
}

// Scores of MR rows x NV vectors of 16 columns: x[r][16 j + l] = scale * sum_d q[r * q_row + d * q_col] *
// k[d * ldk + 16 j + l] (+ the mask), the last vector's columns limited by `last` (the others read as 0); all NV * 16
// columns stored at s[r * lds], and each row's running maximum over its valid columns kept in rmax[16 r .. 16 r + 15].
// The mask: none (m null), a row of contiguous columns (m_vec: m[r * m_row + 16 j + l]) or one value per row
// (m[r * m_row]).
template <int MR, int NV>
__attribute__((target("avx512f"))) void qk_tile(const float* q, int64_t q_row, int64_t q_col, const float* k,
                                                int64_t ldk, int64_t D, __mmask16 last, float scale, const float* m,
                                                int64_t m_row, bool m_vec, float* s, int64_t lds, float* rmax) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_setzero_ps();
  const float* qr[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) qr[r] = q + r * q_row;
  for (int64_t d = 0; d < D; ++d) {
    const float* kd = k + d * ldk;
    __m512 kv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j)
      kv[j] = j + 1 == NV ? _mm512_maskz_loadu_ps(last, kd + 16 * j) : _mm512_loadu_ps(kd + 16 * j);
    const int64_t qo = d * q_col;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 qb = _mm512_set1_ps(qr[r][qo]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_fmadd_ps(qb, kv[j], acc[r][j]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    __m512 mx = _mm512_loadu_ps(rmax + 16 * r);
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      const __mmask16 valid = j + 1 == NV ? last : static_cast<__mmask16>(0xffff);
      __m512 x = _mm512_mul_ps(acc[r][j], sc);
      if (m) {
        x = _mm512_add_ps(x,
                          m_vec ? _mm512_maskz_loadu_ps(valid, m + r * m_row + 16 * j) : _mm512_set1_ps(m[r * m_row]));
      }
      _mm512_storeu_ps(s + r * lds + 16 * j, x);
      mx = _mm512_mask_max_ps(mx, valid, mx, x);
    }
    _mm512_storeu_ps(rmax + 16 * r, mx);
  }
}

// Output of MR rows x NV vectors of 16 columns: y[r][c] = inv[r] * sum_{t < T} p[r * ldp + t] * v[t * ldv + c],
// the last vector's columns limited by `last`; stored through y's strides (vector stores where y_col is 1).
template <int MR, int NV>
__attribute__((target("avx512f"))) void pv_tile(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t T,
                                                __mmask16 last, const float* inv, float* y, int64_t y_row,
                                                int64_t y_col) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t t = 0; t < T; ++t) {
    const float* vt = v + t * ldv;
    __m512 vv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j)
      vv[j] = j + 1 == NV ? _mm512_maskz_loadu_ps(last, vt + 16 * j) : _mm512_loadu_ps(vt + 16 * j);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 pb = _mm512_set1_ps(p[r * ldp + t]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_fmadd_ps(pb, vv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    const __m512 sc = _mm512_set1_ps(inv[r]);
    float* yr = y + r * y_row;
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      const __m512 out = _mm512_mul_ps(acc[r][j], sc);
      const __mmask16 m = j + 1 == NV ? last : static_cast<__mmask16>(0xffff);
      if (y_col == 1) {
        _mm512_mask_storeu_ps(yr + 16 * j, m, out);
      } else {
        alignas(64) float tmp[16];
        _mm512_store_ps(tmp, out);
        const int n = __builtin_popcount(m);
        for (int l = 0; l < n; ++l) yr[(16 * j + l) * y_col] = tmp[l];
      }
    }
  }
}

using QkFn = void (*)(const float*, int64_t, int64_t, const float*, int64_t, int64_t, __mmask16, float, const float*,
                      int64_t, bool, float*, int64_t, float*);
using PvFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, __mmask16, const float*, float*, int64_t,
                      int64_t);

template <int MR>
QkFn qk_for(int nv) {
  switch (nv) {
    case 1: return qk_tile<MR, 1>;
    case 2: return qk_tile<MR, 2>;
    case 3: return qk_tile<MR, 3>;
    default: return qk_tile<MR, 4>;
  }
}
QkFn qk_fn(int mr, int nv) {
  switch (mr) {
    case 1: return qk_for<1>(nv);
    case 2: return qk_for<2>(nv);
    case 3: return qk_for<3>(nv);
    case 4: return qk_for<4>(nv);
    case 5: return qk_for<5>(nv);
    case 6: return qk_for<6>(nv);
    case 7: return qk_for<7>(nv);
    default: return qk_for<8>(nv);
  }
}
template <int MR>
PvFn pv_for(int nv) {
  switch (nv) {
    case 1: return pv_tile<MR, 1>;
    case 2: return pv_tile<MR, 2>;
    case 3: return pv_tile<MR, 3>;
    default: return pv_tile<MR, 4>;
  }
}
PvFn pv_fn(int mr, int nv) {
  switch (mr) {
    case 1: return pv_for<1>(nv);
    case 2: return pv_for<2>(nv);
    case 3: return pv_for<3>(nv);
    case 4: return pv_for<4>(nv);
    case 5: return pv_for<5>(nv);
    case 6: return pv_for<6>(nv);
    case 7: return pv_for<7>(nv);
    default: return pv_for<8>(nv);
  }
}

// Rows per register tile for NV vectors of columns: 24 accumulators at most (of 32 registers).
int tile_rows(int nv) { return nv >= 3 ? 6 : 8; }

// The height of the next register tile with `left` rows to go and tiles of `mr`: mr, except that a short last tile
// (few rows: loads outnumber FMAs) is avoided by splitting the last mr + rest rows into two even tiles.
int64_t tile_height(int64_t left, int mr) {
  if (left <= mr) return left;
  if (left < 2 * mr && left % mr != 0 && left % mr < mr / 2 + 1) return (left + 1) / 2;
  return mr;
}

// One row of scaled, masked scores x (T of them, at s) with their maximum's 16 partial maxima at mx16: e = exp(x -
// max) in place; returns 1 / sum e, or 0 (the row zeroed) when every x is -inf.
__attribute__((target("avx512f"))) float softmax_row_avx512(float* s, int64_t T, const float* mx16) {
  const float top = _mm512_reduce_max_ps(_mm512_loadu_ps(mx16));
  if (top == kNegInf || std::isnan(top)) {
    for (int64_t t = 0; t < T; ++t) s[t] = 0.f;
    return 0.f;
  }
  const __m512 tv = _mm512_set1_ps(top);
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  int64_t t = 0;
  for (; t + 32 <= T; t += 32) {  // two independent chains
    const __m512 a = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t), tv));
    const __m512 b = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t + 16), tv));
    _mm512_storeu_ps(s + t, a);
    _mm512_storeu_ps(s + t + 16, b);
    sum0 = _mm512_add_ps(sum0, a);
    sum1 = _mm512_add_ps(sum1, b);
  }
  for (; t < T; t += 16) {
    const __mmask16 k = first_lanes(T - t);
    const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), tv)));
    _mm512_mask_storeu_ps(s + t, k, e);
    sum0 = _mm512_add_ps(sum0, e);
  }
  const float total = _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
  return total > 0.f ? 1.f / total : 0.f;
}

// Transposes 16 vectors (rows) in place: r[c] gets column c.
__attribute__((target("avx512f"), always_inline)) inline void transpose16(__m512 r[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + k], 128-bit lane L: element 4L + k of rows 4i .. 4i + 3.
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  // Column 4L + k = lane L of r[k], r[4 + k], r[8 + k], r[12 + k].
  __m512 out[16];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m512 u0 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x44), u1 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xee);
    const __m512 u2 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x44),
                 u3 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xee);
    out[k] = _mm512_shuffle_f32x4(u0, u2, 0x88);
    out[4 + k] = _mm512_shuffle_f32x4(u0, u2, 0xdd);
    out[8 + k] = _mm512_shuffle_f32x4(u1, u3, 0x88);
    out[12 + k] = _mm512_shuffle_f32x4(u1, u3, 0xdd);
  }
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) r[k] = out[k];
}

// Kt of one batch entry stored as K rows (k_row 1: Kt[d][t] = kt[t * k_col + d]) into [D][Tp]: 16 x 16 blocks
// transposed in registers (rows past T read as 0, columns past D not stored).
__attribute__((target("avx512f"))) void pack_kt_rows_avx512(const float* kt, int64_t k_col, int64_t T, int64_t D,
                                                            float* kp, int64_t Tp) {
  for (int64_t t0 = 0; t0 < T; t0 += 16) {
    const int64_t nt = std::min<int64_t>(16, T - t0);
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      const int64_t nd = std::min<int64_t>(16, D - d0);
      const __mmask16 dm = first_lanes(nd);
      __m512 r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        r[i] = i < nt ? _mm512_maskz_loadu_ps(dm, kt + (t0 + i) * k_col + d0) : _mm512_setzero_ps();
      transpose16(r);
      for (int64_t j = 0; j < nd; ++j) _mm512_storeu_ps(kp + (d0 + j) * Tp + t0, r[j]);
    }
  }
}

#pragma GCC diagnostic pop

// Kt [D, T] of one batch entry into [D][Tp], columns contiguous (the padding past T may hold anything: the tiles
// read the last vector masked).
void pack_kt(const AttentionShape& s, const float* kt, float* kp, int64_t Tp) {
  if (s.k_row == 1) {
    pack_kt_rows_avx512(kt, s.k_col, s.T, s.D, kp, Tp);
    return;
  }
  for (int64_t d = 0; d < s.D; ++d)
    for (int64_t t = 0; t < s.T; ++t) kp[d * Tp + t] = kt[d * s.k_row + t * s.k_col];
}

void pack_v(const AttentionShape& s, const float* v, float* vp) {
  if (s.v_col == 1) {
    for (int64_t t = 0; t < s.T; ++t)
      std::memcpy(vp + t * s.Dv, v + t * s.v_row, static_cast<size_t>(s.Dv) * sizeof(float));
    return;
  }
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t e = 0; e < s.Dv; ++e) vp[t * s.Dv + e] = v[t * s.v_row + e * s.v_col];
}

// V is packed per batch entry (into [T][Dv], rows contiguous) when its columns are not contiguous, or when its rows
// lie pages apart: the product with V walks all T rows for every block of query rows, and rows 24 KiB apart (torch's
// packed in-projection at batch 8 read in place: [S, B, 3 * E]) cost a TLB miss each (the transformer encoder at
// batch 8, 1 thread: its four attention steps 3.4 -> 5.2 ms read in place, before this).
bool packs_v(const AttentionShape& s) { return s.v_col != 1 || s.v_row > 1024; }
// Q's block of rows likewise, per task, when its rows lie that far apart (and its columns are contiguous).
bool packs_q(const AttentionShape& s) { return s.q_col == 1 && s.q_row > 1024; }

// A mask of contiguous columns (m_col 1) or of one value per row (m_col 0) is read where it is; another one is
// copied per block into rows of contiguous columns.
bool mask_copied(const AttentionShape& s) { return s.has_mask && s.m_col != 0 && s.m_col != 1; }

struct Scratch {
  float *kp, *vp, *qp, *mb, *sb, *rmax, *inv;
};
Scratch carve(const AttentionShape& s, float* base) {
  const int64_t Tp = round16(s.T);
  Scratch c;
  c.kp = base;
  base += s.k_col == 1 ? 0 : round16(s.D * Tp);
  c.vp = base;
  base += packs_v(s) ? round16(s.T * s.Dv) : 0;
  c.qp = base;
  base += packs_q(s) ? round16(s.rows * s.D) : 0;
  c.mb = base;
  base += mask_copied(s) ? round16(s.rows * Tp) : 0;
  c.sb = base;
  base += round16(s.rows * Tp);
  c.rmax = base;
  base += 16 * s.rows;
  c.inv = base;
  return c;
}

// Which batch entry's Kt and V a thread's scratch holds packed (by their offsets; -1: none), kept over the tasks
// one thread runs in one call of attention_run.
struct Packed {
  int64_t k = -1, v = -1;
};

void tasks_avx512(const AttentionShape& s, const float* q, const float* kt, const float* v, const float* mask, float* y,
                  int64_t begin, int64_t end, float* scratch, Packed& packed) {
  const int64_t Tp = round16(s.T), nblk = (s.S + s.rows - 1) / s.rows;
  const Scratch sc = carve(s, scratch);
  const bool packk = s.k_col != 1, packv = packs_v(s), packq = packs_q(s), copym = mask_copied(s);
  int64_t& k_packed = packed.k;
  int64_t& v_packed = packed.v;
  for (int64_t task = begin; task < end; ++task) {
    const int64_t b = task / nblk, i0 = (task % nblk) * s.rows, R = std::min(s.rows, s.S - i0);
    const size_t bi = static_cast<size_t>(b);
    const float* kb = kt + s.k_off[bi];
    int64_t ldk = s.k_row;
    if (packk) {
      if (k_packed != s.k_off[bi]) pack_kt(s, kb, sc.kp, Tp), k_packed = s.k_off[bi];
      kb = sc.kp, ldk = Tp;
    }
    const float* vb = v + s.v_off[bi];
    int64_t ldv = s.v_row;
    if (packv) {
      if (v_packed != s.v_off[bi]) pack_v(s, vb, sc.vp), v_packed = s.v_off[bi];
      vb = sc.vp, ldv = s.Dv;
    }
    const float* mb = s.has_mask ? mask + s.m_off[bi] + i0 * s.m_row : nullptr;
    int64_t m_row = s.m_row;
    if (copym) {
      for (int64_t r = 0; r < R; ++r)
        for (int64_t t = 0; t < s.T; ++t) sc.mb[r * Tp + t] = mb[r * s.m_row + t * s.m_col];
      mb = sc.mb, m_row = Tp;
    }
    const bool m_vec = s.has_mask && s.m_col != 0;
    for (int64_t k = 0; k < 16 * R; ++k) sc.rmax[k] = kNegInf;
    // 1. Scaled, masked scores and their row maxima, 64 columns at a time (the Kt panel stays in L1 over the row
    // tiles).
    const float* qb = q + s.q_off[bi] + i0 * s.q_row;
    int64_t ldq = s.q_row;
    if (packq) {
      for (int64_t r = 0; r < R; ++r)
        std::memcpy(sc.qp + r * s.D, qb + r * s.q_row, static_cast<size_t>(s.D) * sizeof(float));
      qb = sc.qp, ldq = s.D;
    }
    for (int64_t t0 = 0; t0 < s.T; t0 += 64) {
      const int nv = static_cast<int>(std::min<int64_t>(4, (s.T - t0 + 15) / 16));
      const __mmask16 last = first_lanes(s.T - t0 - 16 * (nv - 1));
      const int mr = tile_rows(nv);
      for (int64_t r0 = 0, m; r0 < R; r0 += m) {
        m = tile_height(R - r0, mr);
        qk_fn(static_cast<int>(m), nv)(qb + r0 * ldq, ldq, s.q_col, kb + t0, ldk, s.D, last, s.scale,
                                       mb ? mb + r0 * m_row + (m_vec ? t0 : 0) : nullptr, m_row, m_vec,
                                       sc.sb + r0 * Tp + t0, Tp, sc.rmax + 16 * r0);
      }
    }
    // 2. exp(x - max) of each row, 1 / sum.
    for (int64_t r = 0; r < R; ++r) sc.inv[r] = softmax_row_avx512(sc.sb + r * Tp, s.T, sc.rmax + 16 * r);
    // 3. Times V, 64 output columns at a time.
    float* yb = y + s.o_off[bi] + i0 * s.o_row;
    for (int64_t e0 = 0; e0 < s.Dv; e0 += 64) {
      const int nv = static_cast<int>(std::min<int64_t>(4, (s.Dv - e0 + 15) / 16));
      const __mmask16 last = first_lanes(s.Dv - e0 - 16 * (nv - 1));
      const int mr = tile_rows(nv);
      for (int64_t r0 = 0, m; r0 < R; r0 += m) {
        m = tile_height(R - r0, mr);
        pv_fn(static_cast<int>(m), nv)(sc.sb + r0 * Tp, Tp, vb + e0, ldv, s.T, last, sc.inv + r0,
                                       yb + r0 * s.o_row + e0 * s.o_col, s.o_row, s.o_col);
      }
    }
  }
}

// The same blocks in scalar code (CPUs without AVX-512).
void tasks_scalar_impl(const AttentionShape& s, const float* q, const float* kt, const float* v, const float* mask,
                       float* y, int64_t begin, int64_t end, float* scratch) {
  const int64_t Tp = round16(s.T), nblk = (s.S + s.rows - 1) / s.rows;
  const Scratch sc = carve(s, scratch);
  for (int64_t task = begin; task < end; ++task) {
    const int64_t b = task / nblk, i0 = (task % nblk) * s.rows, R = std::min(s.rows, s.S - i0);
    const size_t bi = static_cast<size_t>(b);
    const float* kb = kt + s.k_off[bi];
    const float* vb = v + s.v_off[bi];
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = q + s.q_off[bi] + (i0 + r) * s.q_row;
      float* sr = sc.sb + r * Tp;
      for (int64_t t = 0; t < s.T; ++t) sr[t] = 0.f;
      for (int64_t d = 0; d < s.D; ++d) {
        const float qd = qr[d * s.q_col];
        const float* kd = kb + d * s.k_row;
        for (int64_t t = 0; t < s.T; ++t) sr[t] += qd * kd[t * s.k_col];
      }
      const float* mr = s.has_mask ? mask + s.m_off[bi] + (i0 + r) * s.m_row : nullptr;
      float top = kNegInf;
      for (int64_t t = 0; t < s.T; ++t) {
        sr[t] = sr[t] * s.scale + (mr ? mr[t * s.m_col] : 0.f);
        top = std::max(top, sr[t]);
      }
      float sum = 0.f;
      for (int64_t t = 0; t < s.T; ++t) {
        sr[t] = top == kNegInf ? 0.f : std::exp(sr[t] - top);
        sum += sr[t];
      }
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      float* yr = y + s.o_off[bi] + (i0 + r) * s.o_row;
      for (int64_t e = 0; e < s.Dv; ++e) {
        float acc = 0.f;
        for (int64_t t = 0; t < s.T; ++t) acc += sr[t] * vb[t * s.v_row + e * s.v_col];
        yr[e * s.o_col] = acc * inv;
      }
    }
  }
}

}  // namespace

bool attention_out_dims(const Dims& q, const Dims& kt, const Dims& v, const Dims* mask, Dims* out, std::string* why) {
  if (q.size() < 2 || kt.size() < 2 || v.size() < 2) {
    *why = "Q, Kt and V must have rank >= 2";
    return false;
  }
  const int64_t S = q[q.size() - 2], D = q.back(), T = kt.back(), Dv = v.back();
  if (kt[kt.size() - 2] != D) {
    *why = "Q " + str(q) + " and Kt " + str(kt) + ": inner dimensions differ";
    return false;
  }
  if (v[v.size() - 2] != T) {
    *why = "V " + str(v) + " has other than Kt's " + std::to_string(T) + " rows";
    return false;
  }
  Dims batch, vb;
  if (!broadcast(Dims(q.begin(), q.end() - 2), Dims(kt.begin(), kt.end() - 2), &batch)) {
    *why = "batch dimensions of Q " + str(q) + " and Kt " + str(kt) + " do not broadcast";
    return false;
  }
  if (!broadcast(batch, Dims(v.begin(), v.end() - 2), &vb) || vb != batch) {
    *why = "V " + str(v) + " has batch dimensions that the scores do not";
    return false;
  }
  Dims scores = batch;
  scores.push_back(S);
  scores.push_back(T);
  if (mask) {
    Dims mb;
    if (mask->size() > scores.size() || !broadcast(*mask, scores, &mb) || mb != scores) {
      *why = "mask " + str(*mask) + " does not broadcast to the scores " + str(scores);
      return false;
    }
  }
  *out = batch;
  out->push_back(S);
  out->push_back(Dv);
  return true;
}

AttentionShape attention_plan(const StridedView& q, const StridedView& kt, const StridedView& v,
                              const StridedView* mask, const StridedView& out, float scale, int team) {
  AttentionShape s;
  const Dims batch(out.dims.begin(), out.dims.end() - 2);
  s.batches = 1;
  for (int64_t d : batch) s.batches *= d;
  s.S = q.dims[q.dims.size() - 2];
  s.D = q.dims.back();
  s.T = kt.dims.back();
  s.Dv = v.dims.back();
  s.q_row = stride_from_end(q, 2), s.q_col = stride_from_end(q, 1);
  s.k_row = stride_from_end(kt, 2), s.k_col = stride_from_end(kt, 1);
  s.v_row = stride_from_end(v, 2), s.v_col = stride_from_end(v, 1);
  s.o_row = stride_from_end(out, 2), s.o_col = stride_from_end(out, 1);
  // A column stride of 0 (a dim of 1) reads as contiguous: one element, no packing.
  if (s.k_col == 0) s.k_col = 1;
  if (s.v_col == 0) s.v_col = 1;
  if (s.o_col == 0) s.o_col = 1;
  s.q_off = batch_offsets(batch, q, 2);
  s.k_off = batch_offsets(batch, kt, 2);
  s.v_off = batch_offsets(batch, v, 2);
  s.o_off = batch_offsets(batch, out, 2);
  if (mask) {
    s.has_mask = true;
    s.m_row = stride_from_end(*mask, 2), s.m_col = stride_from_end(*mask, 1);
    s.m_off = batch_offsets(batch, *mask, 2);
  }
  s.scale = scale;
  // Rows per task: the block of scores within 64 KiB, at most 48 rows; halved down to 8 while the team would get
  // fewer than 2 tasks per thread; then the blocks evened out, in multiples of 6 (the register tile) where that fits.
  const int64_t Tp = round16(std::max<int64_t>(s.T, 1));
  int64_t rows = std::clamp<int64_t>(16384 / Tp, 6, 48);
  rows = std::max<int64_t>(1, std::min(rows, s.S));
  while (rows > 8 && s.batches * ((s.S + rows - 1) / rows) < 2 * std::max(team, 1)) rows = (rows + 1) / 2;
  const int64_t nblk = (s.S + rows - 1) / rows;
  rows = (s.S + nblk - 1) / std::max<int64_t>(nblk, 1);
  if (rows > 6 && (rows + 5) / 6 * 6 * (nblk - 1) < s.S) rows = (rows + 5) / 6 * 6;
  s.rows = std::max<int64_t>(rows, 1);
  return s;
}

size_t attention_scratch_floats(const AttentionShape& s) {
  const int64_t Tp = round16(s.T);
  int64_t n = round16(s.rows * Tp) + 16 * s.rows + round16(s.rows) + 16;
  if (s.k_col != 1) n += round16(s.D * Tp);
  if (packs_v(s)) n += round16(s.T * s.Dv);
  if (packs_q(s)) n += round16(s.rows * s.D);
  if (mask_copied(s)) n += round16(s.rows * Tp);
  return static_cast<size_t>(n);
}

void attention_tasks(const AttentionShape& s, const float* q, const float* kt, const float* v, const float* mask,
                     float* y, int64_t begin, int64_t end, float* scratch) {
  Packed packed;
  if (has_avx512f()) tasks_avx512(s, q, kt, v, mask, y, begin, end, scratch, packed);
  else tasks_scalar_impl(s, q, kt, v, mask, y, begin, end, scratch);
}

void attention_tasks_scalar(const AttentionShape& s, const float* q, const float* kt, const float* v, const float* mask,
                            float* y, int64_t begin, int64_t end, float* scratch) {
  tasks_scalar_impl(s, q, kt, v, mask, y, begin, end, scratch);
}

void attention_run(const AttentionShape& s, const float* q, const float* kt, const float* v, const float* mask,
                   float* y, float* scratch, int team, size_t stride) {
  const size_t per = stride ? stride : attention_scratch_floats(s);
  const int64_t tasks = s.tasks();
  team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(team, tasks)));
  if (team <= 1 || !has_avx512f()) {
    split_over_team(tasks, team, [&](int64_t t, int64_t b, int64_t e) {
      if (b < e) attention_tasks(s, q, kt, v, mask, y, b, e, scratch + static_cast<size_t>(t) * per);
    });
    return;
  }
  // Each thread takes tasks from the front of its own contiguous range (batch entry major: it packs each Kt once),
  // then from the back of the range with the most left: a thread slowed down (a busy core) holds no one up.
  // A range is (next, end) in one atomic word.
  struct alignas(64) Range {
    std::atomic<uint64_t> v;
  };
  std::vector<Range> ranges(static_cast<size_t>(team));
  for (int t = 0; t < team; ++t)
    ranges[static_cast<size_t>(t)].v.store(static_cast<uint64_t>(tasks * t / team) << 32 |
                                           static_cast<uint64_t>(tasks * (t + 1) / team));
  auto take = [](Range& r, bool front) -> int64_t {
    uint64_t cur = r.v.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t b = cur >> 32, e = cur & 0xffffffffu;
      if (b >= e) return -1;
      const uint64_t next = front ? (b + 1) << 32 | e : b << 32 | (e - 1);
      if (r.v.compare_exchange_weak(cur, next, std::memory_order_relaxed))
        return static_cast<int64_t>(front ? b : e - 1);
    }
  };
#pragma omp parallel num_threads(team)
  {
    const int t = omp_get_thread_num();
    float* mine = scratch + static_cast<size_t>(t) * per;
    Packed packed;
    for (int64_t task; (task = take(ranges[static_cast<size_t>(t)], true)) >= 0;)
      tasks_avx512(s, q, kt, v, mask, y, task, task + 1, mine, packed);
    for (;;) {  // (also the ranges of threads the runtime did not start)
      size_t victim = 0;
      uint64_t most = 0;
      for (size_t r = 0; r < ranges.size(); ++r) {
        const uint64_t cur = ranges[r].v.load(std::memory_order_relaxed);
        const uint64_t b = cur >> 32, e = cur & 0xffffffffu;
        if (e > b && e - b > most) most = e - b, victim = r;
      }
      if (most == 0) break;
      const int64_t task = take(ranges[victim], false);
      if (task >= 0) tasks_avx512(s, q, kt, v, mask, y, task, task + 1, mine, packed);
    }
  }
}

void attention_reference(const AttentionShape& s, const float* q, const float* kt, const float* v, const float* mask,
                         float* y) {
  std::vector<double> p(static_cast<size_t>(s.T));
  for (int64_t b = 0; b < s.batches; ++b) {
    const size_t bi = static_cast<size_t>(b);
    for (int64_t i = 0; i < s.S; ++i) {
      double top = -std::numeric_limits<double>::infinity();
      for (int64_t t = 0; t < s.T; ++t) {
        double acc = 0;
        for (int64_t d = 0; d < s.D; ++d)
          acc += static_cast<double>(q[s.q_off[bi] + i * s.q_row + d * s.q_col]) *
                 kt[s.k_off[bi] + d * s.k_row + t * s.k_col];
        acc *= s.scale;
        if (s.has_mask) acc += mask[s.m_off[bi] + i * s.m_row + t * s.m_col];
        p[t] = acc;
        top = std::max(top, acc);
      }
      double sum = 0;
      for (int64_t t = 0; t < s.T; ++t) {
        p[t] = std::isinf(top) && top < 0 ? 0.0 : std::exp(p[t] - top);
        sum += p[t];
      }
      for (int64_t e = 0; e < s.Dv; ++e) {
        double acc = 0;
        for (int64_t t = 0; t < s.T; ++t) acc += p[t] * v[s.v_off[bi] + t * s.v_row + e * s.v_col];
        y[s.o_off[bi] + i * s.o_row + e * s.o_col] = static_cast<float>(sum > 0 ? acc / sum : 0.0);
      }
    }
  }
}

}  // namespace keel::onednn
