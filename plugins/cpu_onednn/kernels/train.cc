// plugins/cpu_onednn/kernels/train.cc — the training hot path on oneDNN: the keel-domain backward ops that the eager
// autograd emits (keel.ConvGrad on convolution backward data/weights primitives, keel.MaxPoolGrad, keel.ReluGrad) in
// f32 and bf16, and the bf16 forward ops that autocast produces (Conv, Gemm, MatMul on oneDNN's bf16 primitives,
// Relu, MaxPool), plus a fused SoftmaxCrossEntropyLoss forward (log-softmax + NLL, one pass) and its gradient.
//
// Registered by register_train_kernels (called from the plugin's init) with their own type constraints, so they
// never compete with the plugin's f32 inference kernels. Each kernel rejects (UNIMPLEMENTED) what it does not
// handle and the core falls back to the reference kernels, which are the oracle tests/device_conformance checks
// these against.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "common/common.h"
#include "common/lanes.h"
#include "common/pool2x2.h"
#include "common/team.h"
#include "steps/pool_arg.h"

namespace keel::onednn {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dt dnnl_dtype(int32_t d) {
  if (d == KEEL_DTYPE_F32) return dt::f32;
  if (d == KEEL_DTYPE_BF16) return dt::bf16;
  throw Reject{"f32 or bf16 only"};
}

// A user (plain) memory and the primitive's memory, with the reorder between them when they differ.
struct Bound {
  dnnl::memory user, prim;
  dnnl::reorder to_prim, to_user;
  bool reorder = false;
  void make(const dnnl::memory::desc& plain, const dnnl::memory::desc& want, bool input) {
    auto& eng = engine();
    user = dnnl::memory(plain, eng, nullptr);
    reorder = plain != want;
    prim = reorder ? dnnl::memory(want, eng) : user;
    if (reorder) {
      if (input) to_prim = dnnl::reorder(user, prim);
      else to_user = dnnl::reorder(prim, user);
    }
  }
  void in(const void* p) {
    bind(user, p);
    if (reorder) to_prim.execute(stream(), user, prim);
  }
  void out(void* p) { bind(user, p); }
  void finish() {
    if (reorder) to_user.execute(stream(), prim, user);
  }
};

// ---------------------------------------------------------------------------------------------- AVX-512 rows

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_* placeholders (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// One row of 2x2/stride-2 max-pool backward: windows [ow, ow+16k) of rows r0/r1 (2*OW wide), dY g, dX rows d0/d1.
// Each window's dY goes to its first maximum (a, b, c, d order; comparisons false on NaN, as the scalar code).
// Does the whole row (the last < 16 windows with masked loads and stores); returns OW.
__attribute__((target("avx512f,avx512bw,bmi2"))) int64_t pool2x2_grad_row_f32(const float* r0, const float* r1,
                                                                              const float* g, float* d0, float* d1,
                                                                              int64_t OW) {
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  for (int64_t ow = 0; ow < OW; ow += 16) {
    // 16 windows, or the n < 16 left (masked: lanes past the row are neither read nor written).
    const Windows2x2 w = load_windows_2x2(r0, r1, ow, std::min<int64_t>(16, OW - ow));
    const __mmask16 sb = _mm512_cmp_ps_mask(w.b, w.a, _CMP_GT_OQ);
    const __m512 m1 = _mm512_mask_mov_ps(w.a, sb, w.b);
    const __mmask16 sc = _mm512_cmp_ps_mask(w.c, m1, _CMP_GT_OQ);
    const __m512 m2 = _mm512_mask_mov_ps(m1, sc, w.c);
    const __mmask16 sd = _mm512_cmp_ps_mask(w.d, m2, _CMP_GT_OQ);
    const __mmask16 wd = sd, wc = static_cast<__mmask16>(sc & ~sd), wb = static_cast<__mmask16>(sb & ~sc & ~sd);
    const __mmask16 wa = static_cast<__mmask16>(~(wb | wc | wd));
    const __m512 gv = _mm512_maskz_loadu_ps(w.kw, g + ow);
    const __m512 oa = _mm512_maskz_mov_ps(wa, gv), ob = _mm512_maskz_mov_ps(wb, gv);
    const __m512 oc = _mm512_maskz_mov_ps(wc, gv), od = _mm512_maskz_mov_ps(wd, gv);
    _mm512_mask_storeu_ps(d0 + 2 * ow, w.k0, _mm512_permutex2var_ps(oa, lo, ob));
    _mm512_mask_storeu_ps(d0 + 2 * ow + 16, w.k1, _mm512_permutex2var_ps(oa, hi, ob));
    _mm512_mask_storeu_ps(d1 + 2 * ow, w.k0, _mm512_permutex2var_ps(oc, lo, od));
    _mm512_mask_storeu_ps(d1 + 2 * ow + 16, w.k1, _mm512_permutex2var_ps(oc, hi, od));
  }
  return OW;
}

__attribute__((target("avx512f,avx512bw,bmi2"))) inline __m512 bf16x16_to_f32(__m256i v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// The 2x2 / stride-2 windows [ow, ow + 16) of two bf16 rows as f32 vectors (a, b the top-left and top-right elements,
// c, d the bottom ones; only a, b, c, d are set); kin masks the row data [2ow, 2ow + 32) that exists.
__attribute__((target("avx512f,avx512bw,bmi2"), always_inline)) inline Windows2x2 load_windows_2x2_bf16(
    const uint16_t* r0, const uint16_t* r1, int64_t ow, __mmask32 kin) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const __m512i xr = _mm512_maskz_loadu_epi16(kin, r0 + 2 * ow), yr = _mm512_maskz_loadu_epi16(kin, r1 + 2 * ow);
  const __m512 x0 = bf16x16_to_f32(_mm512_castsi512_si256(xr)), x1 = bf16x16_to_f32(_mm512_extracti64x4_epi64(xr, 1));
  const __m512 y0 = bf16x16_to_f32(_mm512_castsi512_si256(yr)), y1 = bf16x16_to_f32(_mm512_extracti64x4_epi64(yr, 1));
  Windows2x2 w{};
  w.a = _mm512_permutex2var_ps(x0, even, x1), w.b = _mm512_permutex2var_ps(x0, odd, x1);
  w.c = _mm512_permutex2var_ps(y0, even, y1), w.d = _mm512_permutex2var_ps(y0, odd, y1);
  return w;
}

__attribute__((target("avx512f,avx512bw,bmi2"))) int64_t pool2x2_grad_row_bf16(const uint16_t* r0, const uint16_t* r1,
                                                                               const uint16_t* g, uint16_t* d0,
                                                                               uint16_t* d1, int64_t OW) {
  // Each of 16 dY values twice: lanes 2j and 2j+1 take g[j].
  const __m512i dup = _mm512_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8, 7, 7, 6, 6, 5, 5, 4,
                                       4, 3, 3, 2, 2, 1, 1, 0, 0);
  for (int64_t ow = 0; ow < OW; ow += 16) {
    const int64_t n = std::min<int64_t>(16, OW - ow);
    const __mmask32 kg = static_cast<__mmask32>((1u << n) - 1);
    const __mmask32 kin = static_cast<__mmask32>(n == 16 ? 0xffffffffu : (1u << (2 * n)) - 1);
    const Windows2x2 w = load_windows_2x2_bf16(r0, r1, ow, kin);
    const __m512 a = w.a, b = w.b, c = w.c, d = w.d;
    const __mmask16 sb = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ);
    const __m512 m1 = _mm512_mask_mov_ps(a, sb, b);
    const __mmask16 sc = _mm512_cmp_ps_mask(c, m1, _CMP_GT_OQ);
    const __m512 m2 = _mm512_mask_mov_ps(m1, sc, c);
    const __mmask16 sd = _mm512_cmp_ps_mask(d, m2, _CMP_GT_OQ);
    const uint32_t wd = sd, wc = sc & ~sd & 0xffffu, wb = sb & ~sc & ~sd & 0xffffu;
    const uint32_t wa = ~(wb | wc | wd) & 0xffffu;
    const __m512i gg = _mm512_permutexvar_epi16(dup, _mm512_maskz_loadu_epi16(kg, g + ow));
    const __mmask32 k0 = (_pdep_u32(wa, 0x55555555u) | _pdep_u32(wb, 0xaaaaaaaau)) & kin;
    const __mmask32 k1 = (_pdep_u32(wc, 0x55555555u) | _pdep_u32(wd, 0xaaaaaaaau)) & kin;
    _mm512_mask_storeu_epi16(d0 + 2 * ow, kin, _mm512_maskz_mov_epi16(k0, gg));
    _mm512_mask_storeu_epi16(d1 + 2 * ow, kin, _mm512_maskz_mov_epi16(k1, gg));
  }
  return OW;
}

// One row of 2x2/stride-2 bf16 max pooling: windows [0, OW) of rows r0/r1 (2*OW wide) into y. The same selection as
// the f32 row (kernels/misc.cc) and as pool2x2_grad_row_bf16 above (the first maximum, comparisons false on NaN), so
// the gradient goes where the forward's value came from; the maximum of bf16 values is one of them, so widening to
// f32 and taking the high halves back is exact.
__attribute__((target("avx512f,avx512bw,bmi2"))) void max_pool2x2_row_bf16(const uint16_t* r0, const uint16_t* r1,
                                                                           uint16_t* y, int64_t OW) {
  for (int64_t ow = 0; ow < OW; ow += 16) {
    const int64_t n = std::min<int64_t>(16, OW - ow);
    const __mmask32 kin = static_cast<__mmask32>(n == 16 ? 0xffffffffu : (1u << (2 * n)) - 1);
    const Windows2x2 w = load_windows_2x2_bf16(r0, r1, ow, kin);
    const __m512 a = w.a, b = w.b, c = w.c, d = w.d;
    __m512 m = _mm512_mask_mov_ps(a, _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ), b);
    m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(c, m, _CMP_GT_OQ), c);
    m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(d, m, _CMP_GT_OQ), d);
    const __m256i out = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(m), 16));
    _mm512_mask_storeu_epi16(y + ow, static_cast<__mmask32>((1u << n) - 1), _mm512_zextsi256_si512(out));
  }
}

// Weight (and bias) gradient of a stride-1, undilated f32 convolution with few input channels (an image model's first
// layer), for the MB output channels [m0, m0 + MB): dW[m][c][i][j] = sum over n, oh, ow of dY[n][m][oh][ow] *
// Xp[n][c][oh + i][ow + j], Xp the zero-padded input (HP x WP planes). One pass over the block's dY rows per (c, i):
// each loaded tap of X serves MB channels, each loaded row of dY the KW taps, in 2 * KW * MB accumulators (registers:
// the loops over taps and channels unroll), 32 output columns a step (masked past the row: those lanes are neither
// read nor used). db (nullable) gets the sums of dY[., m].
template <int KW, int MB>
__attribute__((target("avx512f"))) void conv_dw_channels_f32(const float* dy, const float* xp, float* dw, float* db,
                                                             int64_t m0, int64_t N, int64_t M, int64_t C, int64_t KH,
                                                             int64_t OH, int64_t OW, int64_t HP, int64_t WP) {
  const int64_t S = OH * OW;
  // Images in chunks whose dY rows of the block stay in L2 (512 KiB) across the C * KH passes over them.
  const int64_t chunk = std::max<int64_t>(1, (int64_t{512} << 10) / (MB * S * static_cast<int64_t>(sizeof(float))));
  for (int64_t n0 = 0; n0 < N; n0 += chunk)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < KH; ++i) {
        // Columns [ow, ow + 16) in a0, [ow + 16, ow + 32) in a1.
        __m512 a0[MB][KW], a1[MB][KW];
#pragma GCC unroll 8
        for (int b = 0; b < MB; ++b)
#pragma GCC unroll 8
          for (int j = 0; j < KW; ++j) a0[b][j] = a1[b][j] = _mm512_setzero_ps();
        for (int64_t n = n0; n < std::min(N, n0 + chunk); ++n) {
          const float* g = dy + (n * M + m0) * S;
          const float* x = xp + ((n * C + c) * HP + i) * WP;
          for (int64_t oh = 0; oh < OH; ++oh, g += OW, x += WP)
            for (int64_t ow = 0; ow < OW; ow += 32) {
              const __mmask16 k0 = first_lanes(OW - ow), k1 = first_lanes(OW - ow - 16);
              __m512 t0[KW], t1[KW];
#pragma GCC unroll 8
              for (int j = 0; j < KW; ++j) {
                t0[j] = _mm512_maskz_loadu_ps(k0, x + ow + j);
                t1[j] = _mm512_maskz_loadu_ps(k1, x + ow + 16 + j);
              }
#pragma GCC unroll 8
              for (int b = 0; b < MB; ++b) {
                const __m512 g0 = _mm512_maskz_loadu_ps(k0, g + b * S + ow);
                const __m512 g1 = _mm512_maskz_loadu_ps(k1, g + b * S + ow + 16);
#pragma GCC unroll 8
                for (int j = 0; j < KW; ++j) {
                  a0[b][j] = _mm512_fmadd_ps(g0, t0[j], a0[b][j]);
                  a1[b][j] = _mm512_fmadd_ps(g1, t1[j], a1[b][j]);
                }
              }
            }
        }
#pragma GCC unroll 8
        for (int b = 0; b < MB; ++b)
#pragma GCC unroll 8
          for (int j = 0; j < KW; ++j) {
            float& out = dw[(((m0 + b) * C + c) * KH + i) * KW + j];
            const float sum = _mm512_reduce_add_ps(_mm512_add_ps(a0[b][j], a1[b][j]));
            out = n0 == 0 ? sum : out + sum;
          }
      }
  if (db)
    for (int64_t b = 0; b < MB; ++b) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t n = 0; n < N; ++n) {
        const float* g = dy + (n * M + m0 + b) * S;
        for (int64_t o = 0; o < S; o += 16) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(first_lanes(S - o), g + o));
      }
      db[m0 + b] = _mm512_reduce_add_ps(acc);
    }
}

// keel.FusedConvMaxPoolGrad's weight (and bias) gradient where the pooling is 2x2 / stride 2 and the convolution an
// image model's first layer (conv_dw_channels_f32's cases, kernels at most 3x3), straight from the pooled gradient: a
// window's gradient reaches one convolution output, the one at its window position, so dW[m][c][i][j] = sum over
// pooled positions (n, ph, pw) and window positions a = 2 dy + dx of dP[n][m][ph][pw] (where Arg is a, and P > 0 with
// the Relu) * Xp[n][c][2 ph + dy + i][2 pw + dx + j]. The convolution's output gradient (four times dP's size, three
// quarters zeros) is never made: the SimpleCNN's 5.5 MB of it were written, then read back once per kernel row.
// `e` holds Xp's rows at stride 2 (stride2_rows), so that 16 pooled columns' sources are one vector load. Channels in
// blocks of MB, 16 pooled columns a step (masked past the row), MB * KH * KW accumulators; db (nullable) gets the sums
// of the masked dP (each window's gradient lands once in dY).
template <int KH, int KW, int MB>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void pooled_dw_2x2_f32(const float* dp, const float* pv,
                                                                            const uint8_t* arg, const float* e,
                                                                            float* dw, float* db, int64_t m0, int64_t N,
                                                                            int64_t M, int64_t C, int64_t PH,
                                                                            int64_t PW, int64_t HP, bool relu) {
  const int64_t T = (PW + 15) / 16;
  for (int64_t c = 0; c < C; ++c) {
    __m512 acc[MB][KH][KW], bsum[MB];
#pragma GCC unroll 4
    for (int b = 0; b < MB; ++b) {
      bsum[b] = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int i = 0; i < KH; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < KW; ++j) acc[b][i][j] = _mm512_setzero_ps();
    }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t ph = 0; ph < PH; ++ph)
        for (int64_t t = 0; t < T; ++t) {
          const __mmask16 k = first_lanes(PW - 16 * t);
          __m512 g[MB];
          __m512i at[MB];
#pragma GCC unroll 4
          for (int b = 0; b < MB; ++b) {
            const int64_t o = ((n * M + m0 + b) * PH + ph) * PW + 16 * t;
            g[b] = _mm512_maskz_loadu_ps(k, dp + o);
            if (relu)
              g[b] = _mm512_maskz_mov_ps(
                  _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(k, pv + o), _mm512_setzero_ps(), _CMP_GT_OQ), g[b]);
            at[b] = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, arg + o));
            bsum[b] = _mm512_add_ps(bsum[b], g[b]);
          }
          // Rows 2 ph .. 2 ph + KH of (n, c) in e: [row][offset 0..KW][tile][16].
          const float* rows = e + (((n * C + c) * HP + 2 * ph) * (KW + 1) * T + t) * 16;
          // Each window position's lanes add their products (masked FMAs: the lanes of other positions keep the sum).
#pragma GCC unroll 4
          for (int a = 0; a < 4; ++a) {
            const int dy = a >> 1, dx = a & 1;
            __mmask16 ka[MB];
#pragma GCC unroll 4
            for (int b = 0; b < MB; ++b) ka[b] = _mm512_cmpeq_epi32_mask(at[b], _mm512_set1_epi32(a));
#pragma GCC unroll 4
            for (int i = 0; i < KH; ++i)
#pragma GCC unroll 4
              for (int j = 0; j < KW; ++j) {
                const __m512 x = _mm512_loadu_ps(rows + ((dy + i) * (KW + 1) + dx + j) * T * 16);
#pragma GCC unroll 4
                for (int b = 0; b < MB; ++b) acc[b][i][j] = _mm512_mask3_fmadd_ps(g[b], x, acc[b][i][j], ka[b]);
              }
          }
        }
#pragma GCC unroll 4
    for (int b = 0; b < MB; ++b) {
#pragma GCC unroll 4
      for (int i = 0; i < KH; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < KW; ++j) dw[(((m0 + b) * C + c) * KH + i) * KW + j] = _mm512_reduce_add_ps(acc[b][i][j]);
      if (db && c == 0) db[m0 + b] = _mm512_reduce_add_ps(bsum[b]);
    }
  }
}

using PooledDwFn = void (*)(const float*, const float*, const uint8_t*, const float*, float*, float*, int64_t, int64_t,
                            int64_t, int64_t, int64_t, int64_t, int64_t, bool);
// pooled_dw_2x2_f32 for a KH x KW kernel (1..3 each) and MB channels a task.
template <int MB>
PooledDwFn pooled_dw_fn(int64_t KH, int64_t KW) {
  static constexpr PooledDwFn kTable[3][3] = {
      {pooled_dw_2x2_f32<1, 1, MB>, pooled_dw_2x2_f32<1, 2, MB>, pooled_dw_2x2_f32<1, 3, MB>},
      {pooled_dw_2x2_f32<2, 1, MB>, pooled_dw_2x2_f32<2, 2, MB>, pooled_dw_2x2_f32<2, 3, MB>},
      {pooled_dw_2x2_f32<3, 1, MB>, pooled_dw_2x2_f32<3, 2, MB>, pooled_dw_2x2_f32<3, 3, MB>}};
  return kTable[KH - 1][KW - 1];
}

// e[row][o][t][l] = xp_row[o + 2 (16 t + l)] for each of the `rows` rows of xp (WP wide), offsets o in [0, O), tiles
// t of 16 (T of them): lanes whose source is past the row are 0.
__attribute__((target("avx512f"))) void stride2_row_range(const float* xp, float* e, int64_t r0, int64_t r1, int64_t WP,
                                                          int64_t O, int64_t T) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t base = o + 32 * t, left = WP - base;
        const float* src = xp + r * WP + base;
        const __m512 lo = _mm512_maskz_loadu_ps(first_lanes(left), src);
        const __m512 hi = _mm512_maskz_loadu_ps(first_lanes(left - 16), src + 16);
        _mm512_storeu_ps(e + ((r * O + o) * T + t) * 16, _mm512_permutex2var_ps(lo, even, hi));
      }
}
void stride2_rows(const float* xp, float* e, int64_t rows, int64_t WP, int64_t O, int64_t T) {
  split_over_team(rows, omp_get_max_threads(),
                  [&](int64_t, int64_t r0, int64_t r1) { stride2_row_range(xp, e, r0, r1, WP, O, T); });
}

#pragma GCC diagnostic pop

const bool kHaveAvx512 =
    __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("bmi2");
const bool kHaveAvx512Vl = kHaveAvx512 && __builtin_cpu_supports("avx512vl");  // pooled_dw_2x2_f32's byte loads

// ---------------------------------------------------------------------------------------------- ConvGrad

struct ConvGeom {
  Dims strides, dil, pl, pr;
};

// keel.ConvGrad, and (pooled) keel.FusedConvMaxPoolGrad(dP, X, W, P, Arg): the convolution output's gradient made
// from the pooled one by the window positions (steps/pool_arg.h) straight into the layout the backward primitives
// read it in, instead of MaxPoolGrad writing it plain and a reorder blocking it (the LeNet-like model's conv2: 9.4 MB
// written, read and written again each step).
class ConvGradKernel : public Kernel {
 public:
  explicit ConvGradKernel(bool pooled = false) : pooled_(pooled) {}

  void setup(Ctx& c) override {
    const int inputs = pooled_ ? 5 : 3;
    if (c.input_count() != inputs) throw Reject{pooled_ ? "needs dP, X, W, P, Arg" : "ConvGrad needs dY, X, W"};
    dtype_ = c.dtype(0);
    (void)dnnl_dtype(dtype_);
    for (int i = 1; i < (pooled_ ? 4 : 3); ++i)
      if (c.dtype(i) != dtype_) throw Reject{"mixed dtypes"};
    for (int i = 0; i < inputs; ++i)
      if (!c.rank_known(i) || c.dims(i).size() != 4) throw Reject{"2-D convolutions only"};
    if (pooled_) {
      if (dtype_ != KEEL_DTYPE_F32 || c.dtype(4) != KEEL_DTYPE_U8) throw Reject{"f32 with uint8 window positions only"};
      const FusedActivation act = read_fused_activation(c);
      if (act.set && (act.alg != dnnl::algorithm::eltwise_relu || act.alpha != 0.f)) throw Reject{"activation"};
      relu_ = act.set;
      const Dims ks = c.attr_ints("pool_kernel_shape", Dims{});
      if (!read_pool_window(ks, c.attr_ints("pool_strides", ks), &pool_)) throw Reject{"pool window"};
    }
    if (c.attr_s("auto_pad", "NOTSET") != "NOTSET") throw Reject{"auto_pad"};
    group_ = c.attr_i("group", 1);
    if (group_ <= 0) throw Reject{"group <= 0"};
    want_dx_ = c.output_count() > 0 && c.output_dtype(0) != KEEL_DTYPE_UNDEFINED;
    want_dw_ = c.output_count() > 1 && c.output_dtype(1) != KEEL_DTYPE_UNDEFINED;
    want_db_ = c.output_count() > 2 && c.output_dtype(2) != KEEL_DTYPE_UNDEFINED;
    strides_ = c.attr_ints("strides", {1, 1});
    dil_ = c.attr_ints("dilations", {1, 1});
    pads_ = c.attr_ints("pads", {0, 0, 0, 0});
    if (strides_.size() != 2 || dil_.size() != 2 || pads_.size() != 4) throw Reject{"attribute ranks"};
  }

  // FusedConvMaxPoolGrad's reorders of dP, P and Arg from plain to the channel-blocked layout of dY.
  struct PooledInputs {
    int64_t block = 0;  // 16 or 8
    dnnl::memory g_plain, g_blk, p_plain, p_blk, a_plain, a_blk;
    dnnl::reorder g_to_blk, p_to_blk, a_to_blk;
  };

  struct Plan {
    std::unique_ptr<PooledInputs> pooled;
    std::unique_ptr<dnnl::convolution_backward_weights> bwd_w;
    std::unique_ptr<dnnl::convolution_backward_data> bwd_d;
    Bound w_src, w_ddst, w_dwei, d_ddst, d_wei, d_dsrc;
    dnnl::memory dbias;
    bool bias_in_prim = false;
    // Both primitives read dY in the same blocked layout: backward data takes the one reorder backward weights made
    // (the LeNet-like model's conv2: 9.4 MB, 1.7 ms a step at 1 thread on a 9.8 GB/s host).
    bool share_ddst = false;
    bool direct_dw = false;  // dW (and dB) by conv_dw_channels_f32 instead of bwd_w (direct_dw_applies)
    Dims x, w, dy;
  };

  void run(Ctx& c) override {
    if (pooled_) return run_pooled(c);
    Dims dy = c.dims(0), x = c.dims(1), w = c.dims(2);
    Plan& p = plans_.get(shape_key(c), [&] { return build(dy, x, w); });
    compute(c, p, dy, x, w, c.input(0)->data);
  }

 private:
  // The gradients from dY: plain at `dy_plain`, or (dy_plain null) already in the primitives' own memory for it
  // (ddst_target).
  void compute(Ctx& c, Plan& p, const Dims& dy, const Dims& x, const Dims& w, const void* dy_plain) {
    auto& s = stream();
    keel_tensor_t* out_dx = want_dx_ ? c.output(0, x) : nullptr;
    keel_tensor_t* out_dw = want_dw_ ? c.output(1, w) : nullptr;
    keel_tensor_t* out_db = want_db_ ? c.output(2, {w[0]}) : nullptr;
    if (p.direct_dw) direct_weights_grad(dy_plain, c.input(1), out_dw, out_db, dy, x, w);
    if (p.bwd_w) {
      p.w_src.in(c.input(1)->data);
      if (dy_plain) p.w_ddst.in(dy_plain);
      p.w_dwei.out(out_dw->data);
      std::unordered_map<int, dnnl::memory> args = {
          {DNNL_ARG_SRC, p.w_src.prim}, {DNNL_ARG_DIFF_DST, p.w_ddst.prim}, {DNNL_ARG_DIFF_WEIGHTS, p.w_dwei.prim}};
      if (p.bias_in_prim) {
        bind(p.dbias, out_db->data);
        args[DNNL_ARG_DIFF_BIAS] = p.dbias;
      }
      execute(*p.bwd_w, s, args);
      p.w_dwei.finish();
    }
    if (p.bwd_d) {
      if (!p.share_ddst && dy_plain) p.d_ddst.in(dy_plain);
      p.d_wei.in(c.input(2)->data);
      p.d_dsrc.out(out_dx->data);
      execute(*p.bwd_d, s,
              {{DNNL_ARG_DIFF_DST, p.share_ddst ? p.w_ddst.prim : p.d_ddst.prim},
               {DNNL_ARG_WEIGHTS, p.d_wei.prim},
               {DNNL_ARG_DIFF_SRC, p.d_dsrc.prim}});
      p.d_dsrc.finish();
    }
    s.wait();
    if (want_db_ && !p.bias_in_prim && !p.direct_dw) bias_sum(dy_plain, out_db, dy);
  }

  // Where dY can be made in place: the blocked memory both primitives read it from (nChw16c / nChw8c), or null
  // (then it is made plain and goes the ConvGrad way).
  static dnnl::memory* ddst_target(Plan& p, const Dims& dy, bool want_db) {
    if (p.direct_dw || (want_db && !p.bias_in_prim)) return nullptr;
    dnnl::memory* m = nullptr;
    if (p.bwd_w) {
      if (!p.w_ddst.reorder || (p.bwd_d && !p.share_ddst)) return nullptr;
      m = &p.w_ddst.prim;
    } else if (p.bwd_d) {
      if (!p.d_ddst.reorder) return nullptr;
      m = &p.d_ddst.prim;
    } else {
      return nullptr;
    }
    return channel_block(m->get_desc(), dy) != 0 ? m : nullptr;
  }

  void run_pooled(Ctx& c) {
    const Dims pd = c.dims(0), x = c.dims(1), w = c.dims(2);
    if (c.dims(3) != pd || c.dims(4) != pd)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "dP, P and Arg differ in shape"};
    // The convolution's output size (ONNX: floor).
    Dims dy{x[0], w[0], 0, 0};
    for (int i = 0; i < 2; ++i) {
      const int64_t eff = (w[2 + i] - 1) * dil_[i] + 1, span = x[2 + i] + pads_[i] + pads_[i + 2] - eff;
      if (span < 0) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "the kernel is larger than the padded input"};
      dy[2 + i] = span / strides_[i] + 1;
    }
    const int64_t pk[2] = {pool_.kh, pool_.kw}, ps[2] = {pool_.sh, pool_.sw};
    for (int i = 0; i < 2; ++i)
      if (dy[2 + i] < pk[i] || (dy[2 + i] - pk[i]) / ps[i] + 1 != pd[2 + i] || pd[0] != dy[0] || pd[1] != dy[1])
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "dP does not have the pooled convolution output's shape"};
    Plan& p = plans_.get(shape_key(c), [&] { return build(dy, x, w); });
    if (pooled_dw_applies(p, w)) return pooled_weights_grad(c, pd, dy, x, w);
    PoolArgShape sh;
    sh.n = dy[0], sh.c = dy[1], sh.h = dy[2], sh.w = dy[3], sh.kh = pool_.kh, sh.kw = pool_.kw, sh.sh = pool_.sh;
    sh.sw = pool_.sw, sh.oh = pd[2], sh.ow = pd[3];
    const auto* g = static_cast<const float*>(c.input(0)->data);
    const auto* pv = static_cast<const float*>(c.input(3)->data);
    const auto* at = static_cast<const uint8_t*>(c.input(4)->data);
    dnnl::memory* target = ddst_target(p, dy, want_db_);
    if (target == nullptr) {  // dY plain, then as ConvGrad
      auto* plain = static_cast<float*>(c.workspace(static_cast<uint64_t>(numel(dy)) * sizeof(float)));
      sh.block = 1;
      pool_arg_backward(sh, g, pv, at, relu_, plain);
      compute(c, p, dy, x, w, plain);
      return;
    }
    if (!p.pooled) {
      auto r = std::make_unique<PooledInputs>();
      r->block = channel_block(target->get_desc(), dy);
      const tag bt = channel_block_tag(r->block);
      auto& eng = engine();
      r->g_plain = dnnl::memory({to_dnnl(pd), dt::f32, tag::nchw}, eng, nullptr);
      r->g_blk = dnnl::memory({to_dnnl(pd), dt::f32, bt}, eng, nullptr);
      r->p_plain = dnnl::memory({to_dnnl(pd), dt::f32, tag::nchw}, eng, nullptr);
      r->p_blk = dnnl::memory({to_dnnl(pd), dt::f32, bt}, eng, nullptr);
      r->a_plain = dnnl::memory({to_dnnl(pd), dt::u8, tag::nchw}, eng, nullptr);
      r->a_blk = dnnl::memory({to_dnnl(pd), dt::u8, bt}, eng, nullptr);
      r->g_to_blk = dnnl::reorder(r->g_plain, r->g_blk);
      r->p_to_blk = dnnl::reorder(r->p_plain, r->p_blk);
      r->a_to_blk = dnnl::reorder(r->a_plain, r->a_blk);
      p.pooled = std::move(r);
    }
    PooledInputs& r = *p.pooled;
    sh.block = r.block;
    auto& s = stream();
    auto blocked = [&](dnnl::memory& plain, dnnl::memory& blk, dnnl::reorder& re, const void* data) {
      bind(plain, data);
      bind(blk, c.workspace(blk.get_desc().get_size()));
      re.execute(s, plain, blk);
    };
    blocked(r.g_plain, r.g_blk, r.g_to_blk, g);
    if (relu_) blocked(r.p_plain, r.p_blk, r.p_to_blk, pv);
    blocked(r.a_plain, r.a_blk, r.a_to_blk, at);
    s.wait();
    pool_arg_backward(sh, static_cast<const float*>(r.g_blk.get_data_handle()),
                      relu_ ? static_cast<const float*>(r.p_blk.get_data_handle()) : nullptr,
                      static_cast<const uint8_t*>(r.a_blk.get_data_handle()), relu_,
                      static_cast<float*>(target->get_data_handle()));
    compute(c, p, dy, x, w, nullptr);
  }
  // The first layer of an image model (the SimpleCNN's Conv(1->32, 3x3) over 28x28: 0.83 ms a step at 1 thread for
  // oneDNN's backward weights, about half of it reordering the 5.5 MB dY into its blocked layout): f32, stride 1, no
  // dilation, one group, at most 4 input channels and a kernel at most 7 wide. Larger inputs keep oneDNN (its
  // blocked and Winograd kernels win where channels fill the vector lanes).
  bool direct_dw_applies(const Dims& x, const Dims& w) const {
    return kHaveAvx512 && dtype_ == KEEL_DTYPE_F32 && group_ == 1 && strides_ == Dims{1, 1} && dil_ == Dims{1, 1} &&
           x[1] <= 4 && w[3] >= 1 && w[3] <= 7;
  }
  // X with zeros around it, HP x WP planes (x and both pads: the end ones from dY's size, as build's pr), so that
  // every tap reads inside its row: X itself where it has no padding, else a copy in `buf`.
  const float* padded_input(const float* x, const Dims& xd, int64_t HP, int64_t WP, std::vector<float>* buf) const {
    const int64_t NC = xd[0] * xd[1], H = xd[2], W = xd[3];
    if (HP == H && WP == W) return x;
    buf->assign(static_cast<size_t>(NC * HP * WP), 0.f);
    for (int64_t nc = 0; nc < NC; ++nc)
      for (int64_t h = 0; h < H; ++h)
        std::memcpy(buf->data() + (nc * HP + h + pads_[0]) * WP + pads_[1], x + (nc * H + h) * W,
                    static_cast<size_t>(W) * sizeof(float));
    return buf->data();
  }

  // Whether pooled_weights_grad computes this FusedConvMaxPoolGrad: dW (and dB) only, the direct weight gradient's
  // cases with a kernel at most 3x3, a 2x2 / stride-2 pooling.
  bool pooled_dw_applies(const Plan& p, const Dims& w) const {
    return kHaveAvx512Vl && p.direct_dw && !want_dx_ && w[2] <= 3 && w[3] <= 3 && pool_.kh == 2 && pool_.kw == 2 &&
           pool_.sh == 2 && pool_.sw == 2;
  }
  void pooled_weights_grad(Ctx& c, const Dims& pd, const Dims& dy, const Dims& x, const Dims& w) {
    const int64_t N = x[0], C = x[1], M = w[0], KH = w[2], KW = w[3], PH = pd[2], PW = pd[3];
    const int64_t HP = dy[2] + KH - 1, WP = dy[3] + KW - 1, T = (PW + 15) / 16;
    std::vector<float> padded;
    const float* xp = padded_input(static_cast<const float*>(c.input(1)->data), x, HP, WP, &padded);
    auto* e = static_cast<float*>(c.workspace(static_cast<uint64_t>(N * C * HP * (KW + 1) * T * 16) * sizeof(float)));
    stride2_rows(xp, e, N * C * HP, WP, KW + 1, T);
    const auto* g = static_cast<const float*>(c.input(0)->data);
    const auto* pv = static_cast<const float*>(c.input(3)->data);
    const auto* at = static_cast<const uint8_t*>(c.input(4)->data);
    auto* dw = static_cast<float*>(c.output(1, w)->data);
    float* db = want_db_ ? static_cast<float*>(c.output(2, {M})->data) : nullptr;
    // Pairs of channels, and a single one for an odd M.
    const PooledDwFn pair = pooled_dw_fn<2>(KH, KW), one = pooled_dw_fn<1>(KH, KW);
    const int64_t pairs = M / 2;
    const bool relu = relu_;
    parallel_for(pairs + M % 2, [&](int64_t t) {
      if (t < pairs) pair(g, pv, at, e, dw, db, 2 * t, N, M, C, PH, PW, HP, relu);
      else one(g, pv, at, e, dw, db, M - 1, N, M, C, PH, PW, HP, relu);
    });
  }

  void direct_weights_grad(const void* dyp, const keel_tensor_t* xt, keel_tensor_t* dwt, keel_tensor_t* dbt,
                           const Dims& dy, const Dims& x, const Dims& w) const {
    const int64_t N = x[0], C = x[1], M = w[0], KH = w[2], KW = w[3], OH = dy[2], OW = dy[3];
    const int64_t HP = OH + KH - 1, WP = OW + KW - 1;
    std::vector<float> padded;
    const float* xp = padded_input(static_cast<const float*>(xt->data), x, HP, WP, &padded);
    const float* g = static_cast<const float*>(dyp);
    float* dw = static_cast<float*>(dwt->data);
    float* db = dbt ? static_cast<float*>(dbt->data) : nullptr;
    using Fn = void (*)(const float*, const float*, float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                        int64_t, int64_t, int64_t, int64_t);
    // Blocks of 4 output channels for kernels up to 3 wide (24 accumulators), of 2 up to 7 (28); single channels for
    // the rest of M.
    static constexpr Fn kBlocked[] = {
        conv_dw_channels_f32<1, 4>, conv_dw_channels_f32<2, 4>, conv_dw_channels_f32<3, 4>, conv_dw_channels_f32<4, 2>,
        conv_dw_channels_f32<5, 2>, conv_dw_channels_f32<6, 2>, conv_dw_channels_f32<7, 2>};
    static constexpr Fn kSingle[] = {conv_dw_channels_f32<1, 1>, conv_dw_channels_f32<2, 1>, conv_dw_channels_f32<3, 1>,
                                     conv_dw_channels_f32<4, 1>, conv_dw_channels_f32<5, 1>, conv_dw_channels_f32<6, 1>,
                                     conv_dw_channels_f32<7, 1>};
    const int64_t MB = KW <= 3 ? 4 : 2, blocks = M / MB;
    const Fn blocked = kBlocked[KW - 1], single = kSingle[KW - 1];
    parallel_for(blocks + M % MB, [&](int64_t t) {
      if (t < blocks) blocked(g, xp, dw, db, t * MB, N, M, C, KH, OH, OW, HP, WP);
      else single(g, xp, dw, db, blocks * MB + (t - blocks), N, M, C, KH, OH, OW, HP, WP);
    });
  }

  void bias_sum(const void* dy, keel_tensor_t* db, const Dims& d) const {
    const int64_t N = d[0], M = d[1], S = d[2] * d[3];
    std::vector<float> acc(static_cast<size_t>(M), 0.f);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t m = 0; m < M; ++m) {
        float sacc = 0;
        if (dtype_ == KEEL_DTYPE_F32) {
          const float* p = static_cast<const float*>(dy) + (n * M + m) * S;
          for (int64_t i = 0; i < S; ++i) sacc += p[i];
        } else {
          const uint16_t* p = static_cast<const uint16_t*>(dy) + (n * M + m) * S;
          for (int64_t i = 0; i < S; ++i) sacc += bf16_to_f32(p[i]);
        }
        acc[m] += sacc;
      }
    for (int64_t m = 0; m < M; ++m) {
      if (dtype_ == KEEL_DTYPE_F32) static_cast<float*>(db->data)[m] = acc[m];
      else static_cast<uint16_t*>(db->data)[m] = f32_to_bf16(acc[m]);
    }
  }

  std::unique_ptr<Plan> build(const Dims& dy, const Dims& x, const Dims& w) {
    auto p = std::make_unique<Plan>();
    const int64_t N = x[0], C = x[1], M = w[0];
    if (dy[0] != N || dy[1] != M || C != w[1] * group_ || M % group_ != 0)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "ConvGrad: dY, X and W do not match"};
    Dims wei = group_ > 1 ? Dims{group_, M / group_, w[1], w[2], w[3]} : w;
    // The output size is dY's: the end padding follows from it (ConvTranspose reuses ConvGrad with roles swapped).
    // Where the last window ends before X does (a stride that does not divide the rest), the least end padding is
    // negative and 0 gives the same output size: oneDNN rounds down as ONNX does, and the rows past the last window
    // get no gradient either way.
    Dims pr(2);
    for (int i = 0; i < 2; ++i) {
      int64_t eff = (w[2 + i] - 1) * dil_[i] + 1;
      pr[i] = (dy[2 + i] - 1) * strides_[i] + eff - x[2 + i] - pads_[i];
      if (pr[i] < 0 && pr[i] + strides_[i] > 0) pr[i] = 0;
      if (pr[i] < 0) throw Reject{"dY smaller than the convolution output"};
    }
    const dt d = dnnl_dtype(dtype_);
    auto& eng = engine();
    dnnl::memory::dims st = to_dnnl(strides_), dl = {dil_[0] - 1, dil_[1] - 1}, pl = {pads_[0], pads_[1]},
                       prr = to_dnnl(pr);
    dnnl::memory::desc src_any(to_dnnl(x), d, tag::any), dst_any(to_dnnl(dy), d, tag::any),
        wei_any(to_dnnl(wei), d, tag::any), bias_md({M}, d, tag::a), none;
    dnnl::memory::desc src_plain(to_dnnl(x), d, tag::nchw), dst_plain(to_dnnl(dy), d, tag::nchw),
        wei_plain(to_dnnl(wei), d, group_ > 1 ? tag::goihw : tag::oihw);
    // The forward primitive each backward one is built against (oneDNN's hint), for one algorithm; null when oneDNN
    // has no such forward convolution.
    auto hint = [&](dnnl::algorithm alg) -> std::unique_ptr<dnnl::convolution_forward::primitive_desc> {
      try {
        dnnl::convolution_forward::desc fd(dnnl::prop_kind::forward_training, alg, src_any, wei_any,
                                           want_db_ ? bias_md : none, dst_any, st, dl, pl, prr);
        return std::make_unique<dnnl::convolution_forward::primitive_desc>(fd, user_scratchpad(), eng);
      } catch (const dnnl::error&) {
        return nullptr;
      }
    };
    auto fpd = hint(dnnl::algorithm::convolution_direct);
    if (!fpd) throw Reject{"oneDNN has no convolution for this case"};
    // 3x3 stride-1 f32 convolutions with 16+ channels try Winograd first, as the forward kernel does
    // (options().winograd), falling back to direct when oneDNN refuses. The LeNet-like model's conv2 (64x32x26x26 ->
    // 64 channels) at 1 thread on a 9.8 GB/s host: backward weights 5.8 ms instead of 8.3-11.6, backward data 7.1-9.3
    // instead of 9.3-12.9; a training step 16% faster.
    // Only with the same padding at both ends of each axis: oneDNN 2.6's jit_wino_4x3 backward data ignores the end
    // padding (random gradients, seed 9854: pads 0,0,1,0 gave dX off by up to 14.6 on 9,240 of 9,248 elements).
    const bool wino_shape = options().winograd && dtype_ == KEEL_DTYPE_F32 && group_ == 1 && w[2] == 3 && w[3] == 3 &&
                            strides_ == Dims{1, 1} && dil_ == Dims{1, 1} && C >= 16 && M >= 16 && pr[0] == pads_[0] &&
                            pr[1] == pads_[1];
    auto wino_fpd = wino_shape ? hint(dnnl::algorithm::convolution_winograd) : nullptr;
    // The algorithms to try, in order, each with its forward hint.
    std::vector<std::pair<dnnl::algorithm, const dnnl::convolution_forward::primitive_desc*>> algs;
    if (wino_fpd) algs.emplace_back(dnnl::algorithm::convolution_winograd, wino_fpd.get());
    algs.emplace_back(dnnl::algorithm::convolution_direct, fpd.get());
    if (want_dw_ && direct_dw_applies(x, w)) {
      p->direct_dw = true;
    } else if (want_dw_) {  // (dB without dW: summed from dY by bias_sum, as a frozen layer's trainable bias asks)
      // The primitive's layout for dY first (measured on the SimpleCNN's first layer: the blocked implementation plus
      // the reorder of dY costs 25% less CPU time than gemm:jit on the plain layout, and bf16 has no fast plain
      // one); the plain layout when oneDNN refuses, then without the bias; in each, the algorithms in order.
      auto weights_pd = [&](const dnnl::memory::desc& ddst, bool with_bias, dnnl::algorithm alg,
                            const dnnl::convolution_forward::primitive_desc& fwd)
          -> std::unique_ptr<dnnl::convolution_backward_weights::primitive_desc> {
        try {
          auto wd = with_bias ? dnnl::convolution_backward_weights::desc(alg, src_any, wei_any, bias_md, ddst, st, dl,
                                                                         pl, prr)
                              : dnnl::convolution_backward_weights::desc(alg, src_any, wei_any, ddst, st, dl, pl, prr);
          return std::make_unique<dnnl::convolution_backward_weights::primitive_desc>(wd, user_scratchpad(), eng, fwd);
        } catch (const dnnl::error&) {
          return nullptr;
        }
      };
      std::unique_ptr<dnnl::convolution_backward_weights::primitive_desc> wpd;
      for (const dnnl::memory::desc* ddst : {&dst_any, &dst_plain})
        for (bool with_bias : {want_db_, false})
          for (const auto& [alg, fwd] : algs)
            if (!wpd && (wpd = weights_pd(*ddst, with_bias, alg, *fwd))) p->bias_in_prim = with_bias;
      if (!wpd) throw Reject{"oneDNN has no backward-weights convolution for this case"};
      p->w_src.make(src_plain, wpd->src_desc(), true);
      p->w_ddst.make(dst_plain, wpd->diff_dst_desc(), true);
      p->w_dwei.make(wei_plain, wpd->diff_weights_desc(), false);
      if (p->bias_in_prim) p->dbias = dnnl::memory(bias_md, eng, nullptr);
      p->bwd_w = std::make_unique<dnnl::convolution_backward_weights>(*wpd);
    }
    if (want_dx_) {
      std::unique_ptr<dnnl::convolution_backward_data::primitive_desc> dpdp;
      for (const auto& [alg, fwd] : algs) {
        if (dpdp) break;
        try {
          dnnl::convolution_backward_data::desc dd(alg, src_any, wei_any, dst_any, st, dl, pl, prr);
          dpdp = std::make_unique<dnnl::convolution_backward_data::primitive_desc>(dd, user_scratchpad(), eng, *fwd);
        } catch (const dnnl::error&) {}
      }
      if (!dpdp) throw Reject{"oneDNN has no backward-data convolution for this case"};
      auto& dpd = *dpdp;
      p->d_ddst.make(dst_plain, dpd.diff_dst_desc(), true);
      p->d_wei.make(wei_plain, dpd.weights_desc(), true);
      p->d_dsrc.make(src_plain, dpd.diff_src_desc(), false);
      p->bwd_d = std::make_unique<dnnl::convolution_backward_data>(dpd);
      p->share_ddst =
          p->bwd_w && p->w_ddst.reorder && p->d_ddst.reorder && p->w_ddst.prim.get_desc() == p->d_ddst.prim.get_desc();
    }
    return p;
  }

  bool pooled_;
  bool relu_ = false;
  PoolArgShape pool_;  // kh, kw, sh, sw: the pool window (pooled_)
  int32_t dtype_ = KEEL_DTYPE_F32;
  int64_t group_ = 1;
  bool want_dx_ = false, want_dw_ = false, want_db_ = false;
  Dims strides_, dil_, pads_;
  PlanCache<Plan> plans_;
};

// ---------------------------------------------------------------------------------------------- bf16 Conv forward

// Also keel.FusedConv without a residual (fused = true; the activation as an eltwise post-op): eager's conv2d_relu
// under bf16 autocast.
class ConvBf16Kernel : public Kernel {
 public:
  explicit ConvBf16Kernel(bool fused = false) : fused_(fused) {}
  void setup(Ctx& c) override {
    for (int i = 0; i < c.input_count(); ++i)
      if (c.has_input(i) && c.dtype(i) != KEEL_DTYPE_BF16) throw Reject{"bf16 only"};
    if (fused_) {
      if (c.input_count() > 3 && c.has_input(3)) throw Reject{"residual Z"};
      act_ = read_fused_activation(c);
    }
    if (!c.rank_known(0) || c.dims(0).size() != 4 || !c.dims_known(1) || c.dims(1).size() != 4)
      throw Reject{"2-D only"};
    if (c.attr_s("auto_pad", "NOTSET") != "NOTSET") throw Reject{"auto_pad"};
    group_ = c.attr_i("group", 1);
    strides_ = c.attr_ints("strides", {1, 1});
    dil_ = c.attr_ints("dilations", {1, 1});
    pads_ = c.attr_ints("pads", {0, 0, 0, 0});
    if (group_ <= 0 || strides_.size() != 2 || dil_.size() != 2 || pads_.size() != 4) throw Reject{"attributes"};
    has_bias_ = c.has_input(2);
  }
  struct Plan {
    std::unique_ptr<dnnl::convolution_forward> prim;
    Bound src, wei, dst;
    dnnl::memory bias;
  };
  void run(Ctx& c) override {
    Dims x = c.dims(0), w = c.dims(1);
    const int64_t M = w[0];
    Dims y = {x[0], M, 0, 0};
    for (int i = 0; i < 2; ++i) {
      int64_t eff = (w[2 + i] - 1) * dil_[i] + 1, span = x[2 + i] + pads_[i] + pads_[i + 2] - eff;
      if (span < 0) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "Conv: kernel larger than the padded input"};
      y[2 + i] = span / strides_[i] + 1;
    }
    if (x[1] != w[1] * group_ || M % group_ != 0)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "Conv: channels do not match"};
    Plan& p = plans_.get(shape_key(c), [&] {
      auto pl = std::make_unique<Plan>();
      Dims wei = group_ > 1 ? Dims{group_, M / group_, w[1], w[2], w[3]} : w;
      auto& eng = engine();
      dnnl::memory::desc src_any(to_dnnl(x), dt::bf16, tag::any), dst_any(to_dnnl(y), dt::bf16, tag::any),
          wei_any(to_dnnl(wei), dt::bf16, tag::any), bias_md({M}, dt::bf16, tag::a), none;
      dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src_any,
                                        wei_any, has_bias_ ? bias_md : none, dst_any, to_dnnl(strides_),
                                        {dil_[0] - 1, dil_[1] - 1}, {pads_[0], pads_[1]}, {pads_[2], pads_[3]});
      dnnl::convolution_forward::primitive_desc pd(d, act_.attr(), eng);
      pl->src.make(dnnl::memory::desc(to_dnnl(x), dt::bf16, tag::nchw), pd.src_desc(), true);
      pl->wei.make(dnnl::memory::desc(to_dnnl(wei), dt::bf16, group_ > 1 ? tag::goihw : tag::oihw), pd.weights_desc(),
                   true);
      pl->dst.make(dnnl::memory::desc(to_dnnl(y), dt::bf16, tag::nchw), pd.dst_desc(), false);
      if (has_bias_) pl->bias = dnnl::memory(bias_md, eng, nullptr);
      pl->prim = std::make_unique<dnnl::convolution_forward>(pd);
      return pl;
    });
    keel_tensor_t* out = c.output(0, y);
    p.src.in(c.input(0)->data);
    p.wei.in(c.input(1)->data);
    p.dst.out(out->data);
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, p.src.prim}, {DNNL_ARG_WEIGHTS, p.wei.prim}, {DNNL_ARG_DST, p.dst.prim}};
    if (has_bias_) {
      bind(p.bias, c.input(2)->data);
      args[DNNL_ARG_BIAS] = p.bias;
    }
    execute(*p.prim, stream(), args);
    p.dst.finish();
    stream().wait();
  }

 private:
  bool fused_;
  FusedActivation act_;
  int64_t group_ = 1;
  Dims strides_, dil_, pads_;
  bool has_bias_ = false;
  PlanCache<Plan> plans_;
};

// ---------------------------------------------------------------------------------------------- bf16 Gemm / MatMul

// Y = op(A) op(B) (+ C) on dnnl::matmul; operands as strided memory descriptors (transposes cost nothing).
class MatMulBf16Kernel : public Kernel {
 public:
  explicit MatMulBf16Kernel(bool gemm) : gemm_(gemm) {}
  void setup(Ctx& c) override {
    for (int i = 0; i < c.input_count(); ++i)
      if (c.has_input(i) && c.dtype(i) != KEEL_DTYPE_BF16) throw Reject{"bf16 only"};
    if (!c.rank_known(0) || !c.rank_known(1)) throw Reject{"ranks unknown"};
    if (gemm_) {
      ta_ = c.attr_i("transA", 0) != 0;
      tb_ = c.attr_i("transB", 0) != 0;
      if (c.attr_f("alpha", 1.f) != 1.f) throw Reject{"alpha != 1"};
      has_c_ = c.has_input(2);
      if (has_c_ && c.attr_f("beta", 1.f) != 1.f) throw Reject{"beta != 1"};
      if (c.dims(0).size() != 2 || c.dims(1).size() != 2) throw Reject{"Gemm operands must be 2-D"};
    } else {
      if (c.dims(0).size() < 2 || c.dims(1).size() < 2) throw Reject{"1-D operand"};
      if (c.dims(1).size() != 2 && c.dims(1).size() != c.dims(0).size()) throw Reject{"batch broadcast"};
    }
  }
  struct Plan {
    std::unique_ptr<dnnl::matmul> prim;
    dnnl::memory a, b, bias, y;
    Dims out;
  };
  void run(Ctx& c) override {
    Dims ad = c.dims(0), bd = c.dims(1);
    Plan& p = plans_.get(shape_key(c), [&] { return build(c, ad, bd); });
    keel_tensor_t* out = c.output(0, p.out);
    bind(p.a, c.input(0)->data);
    bind(p.b, c.input(1)->data);
    bind(p.y, out->data);
    std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.y}};
    if (has_c_) {
      bind(p.bias, c.input(2)->data);
      args[DNNL_ARG_BIAS] = p.bias;
    }
    execute(*p.prim, stream(), args);
    stream().wait();
  }

 private:
  std::unique_ptr<Plan> build(Ctx& c, const Dims& ad, const Dims& bd) {
    auto p = std::make_unique<Plan>();
    auto& eng = engine();
    dnnl::memory::desc a_md, b_md, y_md, bias_md;
    if (gemm_) {
      int64_t M = ta_ ? ad[1] : ad[0], K = ta_ ? ad[0] : ad[1], K2 = tb_ ? bd[1] : bd[0], N = tb_ ? bd[0] : bd[1];
      if (K != K2) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "Gemm: inner dimensions differ"};
      a_md = dnnl::memory::desc({M, K}, dt::bf16, ta_ ? dnnl::memory::dims{1, M} : dnnl::memory::dims{K, 1});
      b_md = dnnl::memory::desc({K, N}, dt::bf16, tb_ ? dnnl::memory::dims{1, K} : dnnl::memory::dims{N, 1});
      y_md = dnnl::memory::desc({M, N}, dt::bf16, tag::ab);
      p->out = {M, N};
      if (has_c_) {
        Dims cd = c.dims(2);
        if (cd.size() == 1 && cd[0] == N) bias_md = dnnl::memory::desc({1, N}, dt::bf16, tag::ab);
        else if (cd.size() == 2 && (cd[0] == 1 || cd[0] == M) && cd[1] == N)
          bias_md = dnnl::memory::desc({cd[0], N}, dt::bf16, tag::ab);
        else throw Reject{"C shape"};
      }
    } else {
      // [B..., M, K] x [K, N] or [B..., K, N] (same batch): collapse the batch.
      int64_t M = ad[ad.size() - 2], K = ad.back(), N = bd.back();
      if (bd[bd.size() - 2] != K) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "MatMul: inner dimensions differ"};
      int64_t B = 1;
      for (size_t i = 0; i + 2 < ad.size(); ++i) B *= ad[i];
      int64_t Bb = 1;
      for (size_t i = 0; i + 2 < bd.size(); ++i) Bb *= bd[i];
      if (bd.size() > 2 && !std::equal(ad.begin(), ad.end() - 2, bd.begin())) throw Reject{"batch broadcast"};
      a_md = dnnl::memory::desc({B, M, K}, dt::bf16, tag::abc);
      b_md = dnnl::memory::desc({Bb, K, N}, dt::bf16, tag::abc);
      y_md = dnnl::memory::desc({B, M, N}, dt::bf16, tag::abc);
      p->out = Dims(ad.begin(), ad.end() - 1);
      p->out.push_back(N);
    }
    dnnl::matmul::desc d =
        has_c_ ? dnnl::matmul::desc(a_md, b_md, bias_md, y_md) : dnnl::matmul::desc(a_md, b_md, y_md);
    dnnl::matmul::primitive_desc pd(d, user_scratchpad(), eng);
    p->a = dnnl::memory(a_md, eng, nullptr);
    p->b = dnnl::memory(b_md, eng, nullptr);
    p->y = dnnl::memory(y_md, eng, nullptr);
    if (has_c_) p->bias = dnnl::memory(bias_md, eng, nullptr);
    p->prim = std::make_unique<dnnl::matmul>(pd);
    return p;
  }
  bool gemm_, ta_ = false, tb_ = false, has_c_ = false;
  PlanCache<Plan> plans_;
};

// ---------------------------------------------------------------------------------------------- elementwise

template <class T>
T* out_ptr(keel_tensor_t* t) {
  return static_cast<T*>(t->data);
}

// ReluGrad(dY, Y) = dY * (Y > 0), f32 / bf16.
class ReluGradKernel : public Kernel {
 public:
  void setup(Ctx& c) override {
    dtype_ = c.dtype(0);
    (void)dnnl_dtype(dtype_);
    if (c.dtype(1) != dtype_) throw Reject{"mixed dtypes"};
  }
  void run(Ctx& c) override {
    Dims d = c.dims(0);
    if (d != c.dims(1)) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "ReluGrad: dY and Y differ in shape"};
    const int64_t n = numel(d);
    keel_tensor_t* o = c.output(0, d);
    if (dtype_ == KEEL_DTYPE_F32) {
      // On the bits, branch-free (the sign of y is data-dependent: a branch mispredicts half the time):
      // y > 0 <=> as int32 in (0, +inf]; NaN (above +inf) and negatives give 0.
      const uint32_t* dy = c.data<uint32_t>(0);
      const int32_t* y = c.data<int32_t>(1);
      uint32_t* dx = out_ptr<uint32_t>(o);
      split_over_team(n, n > 65536 ? omp_get_max_threads() : 1, [&](int64_t, int64_t b, int64_t e) {
#pragma omp simd
        for (int64_t i = b; i < e; ++i) dx[i] = dy[i] & (0u - static_cast<uint32_t>((y[i] > 0) & (y[i] <= 0x7f800000)));
      });
    } else {
      const uint16_t* dy = c.data<uint16_t>(0);
      const uint16_t* y = c.data<uint16_t>(1);
      uint16_t* dx = out_ptr<uint16_t>(o);
      // bf16 y > 0: sign bit clear and not +0.
      split_over_team(n, n > 65536 ? omp_get_max_threads() : 1, [&](int64_t, int64_t b, int64_t e) {
#pragma omp simd
        for (int64_t i = b; i < e; ++i)
          dx[i] = static_cast<uint16_t>(dy[i] & -static_cast<uint16_t>(static_cast<int16_t>(y[i]) > 0));
      });
    }
  }

 private:
  int32_t dtype_ = KEEL_DTYPE_F32;
};

// Pooling geometry shared by MaxPool (bf16 forward) and MaxPoolGrad: 2-D, no dilation, explicit pads.
struct Pool2d {
  int64_t kh, kw, sh, sw, pt, pl, pb, pr;
  void read(Ctx& c) {
    if (c.attr_s("auto_pad", "NOTSET") != "NOTSET") throw Reject{"auto_pad"};
    if (c.attr_i("ceil_mode", 0) != 0) throw Reject{"ceil_mode"};
    if (c.attr_i("storage_order", 0) != 0) throw Reject{"storage_order"};
    Dims k = c.attr_ints("kernel_shape", {}), s = c.attr_ints("strides", {1, 1}), p = c.attr_ints("pads", {0, 0, 0, 0});
    Dims d = c.attr_ints("dilations", {1, 1});
    if (k.size() != 2 || s.size() != 2 || p.size() != 4 || d != Dims{1, 1})
      throw Reject{"2-D pooling without dilation"};
    kh = k[0], kw = k[1], sh = s[0], sw = s[1], pt = p[0], pl = p[1], pb = p[2], pr = p[3];
  }
  Dims out(const Dims& x) const {
    int64_t oh = (x[2] + pt + pb - kh) / sh + 1, ow = (x[3] + pl + pr - kw) / sw + 1;
    if (x[2] + pt + pb < kh || x[3] + pl + pr < kw)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "pooling kernel larger than the padded input"};
    return {x[0], x[1], oh, ow};
  }
};

// MaxPoolGrad(dY, X): dY goes to the first maximum of each window (the forward's choice), f32 / bf16.
class MaxPoolGradKernel : public Kernel {
 public:
  void setup(Ctx& c) override {
    dtype_ = c.dtype(0);
    (void)dnnl_dtype(dtype_);
    if (c.dtype(1) != dtype_) throw Reject{"mixed dtypes"};
    if (!c.rank_known(1) || c.dims(1).size() != 4) throw Reject{"2-D pooling only"};
    g_.read(c);
  }
  void run(Ctx& c) override {
    Dims dyd = c.dims(0), x = c.dims(1);
    if (g_.out(x) != dyd) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "MaxPoolGrad: dY does not match the pooled X"};
    keel_tensor_t* o = c.output(0, x);
    if (dtype_ == KEEL_DTYPE_F32) go<float>(c.data<float>(0), c.data<float>(1), out_ptr<float>(o), x, dyd);
    else go<uint16_t>(c.data<uint16_t>(0), c.data<uint16_t>(1), out_ptr<uint16_t>(o), x, dyd);
  }

 private:
  template <class T>
  static float val(T v) {
    if constexpr (std::is_same_v<T, float>) return v;
    else return bf16_to_f32(v);
  }
  // 2x2 windows, stride 2, no padding (the SimpleCNN's pool): branch-free, every dX cell written once.
  template <class T>
  void go2x2(const T* dy, const T* x, T* dx, const Dims& xd, const Dims& yd) const {
    const int64_t NC = xd[0] * xd[1], H = xd[2], W = xd[3], OH = yd[2], OW = yd[3];
    parallel_for(NC, [&](int64_t nc) {
      const T* xp = x + nc * H * W;
      const T* gp = dy + nc * OH * OW;
      T* dp = dx + nc * H * W;
      for (int64_t oh = 0; oh < OH; ++oh) {
        const T* r0 = xp + 2 * oh * W;
        const T* r1 = r0 + W;
        T* d0 = dp + 2 * oh * W;
        T* d1 = d0 + W;
        const T* g = gp + oh * OW;
        using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;  // stores as bit masks: branch-free
        const U* gb = reinterpret_cast<const U*>(g);
        U* e0 = reinterpret_cast<U*>(d0);
        U* e1 = reinterpret_cast<U*>(d1);
        int64_t ow0 = 0;
        if (kHaveAvx512) {
          if constexpr (std::is_same_v<T, float>) ow0 = pool2x2_grad_row_f32(r0, r1, g, d0, d1, OW);
          else ow0 = pool2x2_grad_row_bf16(r0, r1, g, d0, d1, OW);
        }
        for (int64_t ow = ow0; ow < OW; ++ow) {
          const float a = val(r0[2 * ow]), b = val(r0[2 * ow + 1]), c = val(r1[2 * ow]), d = val(r1[2 * ow + 1]);
          // The first maximum in window order (a, b, c, d), as the forward and the reference pick it.
          const U sb = static_cast<U>(0u - static_cast<U>(b > a));
          const float m1 = b > a ? b : a;
          const U sc = static_cast<U>(0u - static_cast<U>(c > m1));
          const float m2 = c > m1 ? c : m1;
          const U sd = static_cast<U>(0u - static_cast<U>(d > m2));
          const U gv = gb[ow];
          // Winner masks: d wins if sd; else c if sc; else b if sb; else a.
          const U wd = sd, wc = static_cast<U>(sc & ~sd), wb = static_cast<U>(sb & ~sc & ~sd);
          const U wa = static_cast<U>(~(wb | wc | wd));
          e0[2 * ow] = gv & wa;
          e0[2 * ow + 1] = gv & wb;
          e1[2 * ow] = gv & wc;
          e1[2 * ow + 1] = gv & wd;
        }
        if (W > 2 * OW) {  // a last column no window covers
          d0[W - 1] = T(0);
          d1[W - 1] = T(0);
        }
      }
      if (H > 2 * OH) std::memset(dp + (H - 1) * W, 0, sizeof(T) * W);
    });
  }

  template <class T>
  void go(const T* dy, const T* x, T* dx, const Dims& xd, const Dims& yd) const {
    if (g_.kh == 2 && g_.kw == 2 && g_.sh == 2 && g_.sw == 2 && g_.pt == 0 && g_.pl == 0 && g_.pb == 0 && g_.pr == 0)
      return go2x2(dy, x, dx, xd, yd);
    const int64_t NC = xd[0] * xd[1], H = xd[2], W = xd[3], OH = yd[2], OW = yd[3];
    const bool tiled = g_.kh == g_.sh && g_.kw == g_.sw;  // windows do not overlap: every dX cell written once
    parallel_for(NC, [&](int64_t nc) {
      const T* xp = x + nc * H * W;
      const T* gp = dy + nc * OH * OW;
      T* dp = dx + nc * H * W;
      std::memset(dp, 0, sizeof(T) * H * W);
      for (int64_t oh = 0; oh < OH; ++oh) {
        const int64_t h0 = std::max<int64_t>(oh * g_.sh - g_.pt, 0),
                      h1 = std::min<int64_t>(oh * g_.sh - g_.pt + g_.kh, H);
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t w0 = std::max<int64_t>(ow * g_.sw - g_.pl, 0),
                        w1 = std::min<int64_t>(ow * g_.sw - g_.pl + g_.kw, W);
          int64_t best = -1;
          float bv = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) {
              float v = val(xp[h * W + w]);
              if (best < 0 || v > bv) {
                best = h * W + w;
                bv = v;
              }
            }
          if (best < 0) continue;
          if (tiled) {
            dp[best] = gp[oh * OW + ow];
          } else if constexpr (std::is_same_v<T, float>) {
            dp[best] += gp[oh * OW + ow];
          } else {
            dp[best] = f32_to_bf16(bf16_to_f32(dp[best]) + bf16_to_f32(gp[oh * OW + ow]));
          }
        }
      }
    });
  }
  int32_t dtype_ = KEEL_DTYPE_F32;
  Pool2d g_{};
};

// bf16 Relu and MaxPool forward on oneDNN eltwise / pooling (the f32 ones are the plugin's inference kernels).
class EltPoolBf16Kernel : public Kernel {
 public:
  explicit EltPoolBf16Kernel(bool pool) : pool_(pool) {}
  void setup(Ctx& c) override {
    if (c.dtype(0) != KEEL_DTYPE_BF16) throw Reject{"bf16 only"};
    if (pool_) {
      if (!c.rank_known(0) || c.dims(0).size() != 4) throw Reject{"2-D pooling only"};
      if (c.output_count() > 1 && c.output_dtype(1) != KEEL_DTYPE_UNDEFINED) throw Reject{"Indices output"};
      g_.read(c);
    }
  }
  struct Plan {
    std::unique_ptr<dnnl::primitive> prim;
    dnnl::memory src, dst;
    Dims out;
  };
  void run(Ctx& c) override {
    Dims x = c.dims(0);
    if (pool_ && pool2x2()) return max_pool2x2(c, x);
    Plan& p = plans_.get(shape_key(c), [&] {
      auto pl = std::make_unique<Plan>();
      auto& eng = engine();
      dnnl::memory::desc src = plain_md(x, dt::bf16);
      if (pool_) {
        pl->out = g_.out(x);
        dnnl::memory::desc dst = plain_md(pl->out, dt::bf16);
        dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::pooling_max, src, dst,
                                         {g_.sh, g_.sw}, {g_.kh, g_.kw}, {0, 0}, {g_.pt, g_.pl}, {g_.pb, g_.pr});
        pl->prim = std::make_unique<dnnl::pooling_v2_forward>(dnnl::pooling_v2_forward::primitive_desc(d, eng));
        pl->dst = dnnl::memory(dst, eng, nullptr);
      } else {
        pl->out = x;
        dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::eltwise_relu, src, 0.f);
        pl->prim = std::make_unique<dnnl::eltwise_forward>(dnnl::eltwise_forward::primitive_desc(d, eng));
        pl->dst = dnnl::memory(src, eng, nullptr);
      }
      pl->src = dnnl::memory(src, eng, nullptr);
      return pl;
    });
    keel_tensor_t* o = c.output(0, p.out);
    bind(p.src, c.input(0)->data);
    bind(p.dst, o->data);
    p.prim->execute(stream(), {{DNNL_ARG_SRC, p.src}, {DNNL_ARG_DST, p.dst}});
    stream().wait();
  }

 private:
  // 2x2 windows, stride 2, no padding (the SimpleCNN's and LeNet-like model's pools) on AVX-512, one pass over the
  // input: oneDNN's pooling over the plain bf16 layout took 0.31 ms for the SimpleCNN's [64, 32, 26, 26] at 1 thread,
  // twice the f32 kernel's time for half the bytes.
  bool pool2x2() const {
    return kHaveAvx512 && g_.kh == 2 && g_.kw == 2 && g_.sh == 2 && g_.sw == 2 && g_.pt == 0 && g_.pl == 0 &&
           g_.pb == 0 && g_.pr == 0;
  }
  void max_pool2x2(Ctx& c, const Dims& x) const {
    const Dims y = g_.out(x);
    keel_tensor_t* out = c.output(0, y);
    const int64_t H = x[2], W = x[3], OH = y[2], OW = y[3], rows = x[0] * x[1] * OH;
    if (rows * OW == 0) return;
    const auto* xp = static_cast<const uint16_t*>(c.input(0)->data);
    auto* yp = static_cast<uint16_t*>(out->data);
    parallel_for(rows, [&](int64_t row) {
      const int64_t nc = row / OH, oh = row % OH;
      const uint16_t* r0 = xp + (nc * H + 2 * oh) * W;
      max_pool2x2_row_bf16(r0, r0 + W, yp + row * OW, OW);
    });
  }

  bool pool_;
  Pool2d g_{};
  PlanCache<Plan> plans_;
};

// Cast between f32 and bf16 (autocast casts weights and activations every step) on a oneDNN reorder; every other
// pair of dtypes is left to the next kernel.
class CastBf16Kernel : public Kernel {
 public:
  void setup(Ctx& c) override {
    const int32_t in = c.dtype(0), out = c.output_dtype(0);
    if (!((in == KEEL_DTYPE_F32 && out == KEEL_DTYPE_BF16) || (in == KEEL_DTYPE_BF16 && out == KEEL_DTYPE_F32)))
      throw Reject{"f32 <-> bf16 only"};
    in_ = dnnl_dtype(in);
    out_ = dnnl_dtype(out);
  }
  struct Plan {
    std::unique_ptr<dnnl::reorder> prim;
    dnnl::memory src, dst;
  };
  void run(Ctx& c) override {
    Dims d = c.dims(0);
    keel_tensor_t* o = c.output(0, d);
    if (numel(d) == 0) return;
    Dims flat = {numel(d)};
    Plan& p = plans_.get(shape_key(c), [&] {
      auto pl = std::make_unique<Plan>();
      auto& eng = engine();
      pl->src = dnnl::memory(plain_md(flat, in_), eng, nullptr);
      pl->dst = dnnl::memory(plain_md(flat, out_), eng, nullptr);
      pl->prim = std::make_unique<dnnl::reorder>(pl->src, pl->dst);
      return pl;
    });
    bind(p.src, c.input(0)->data);
    bind(p.dst, o->data);
    p.prim->execute(stream(), p.src, p.dst);
    stream().wait();
  }

 private:
  dt in_ = dt::f32, out_ = dt::bf16;
  PlanCache<Plan> plans_;
};

// ---------------------------------------------------------------------------------------------- cross-entropy

// SoftmaxCrossEntropyLoss (scores [N, C] f32, int64 labels, no weights) fused: one pass per row computes the
// log-softmax (written as log_prob when wanted) and the NLL term.
class SoftmaxCrossEntropyKernel : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (c.dtype(0) != KEEL_DTYPE_F32 || c.dtype(1) != KEEL_DTYPE_I64) throw Reject{"f32 scores, int64 labels"};
    if (c.has_input(2)) throw Reject{"class weights"};
    if (!c.rank_known(0) || c.dims(0).size() != 2) throw Reject{"[N, C] scores only"};
    red_ = c.attr_s("reduction", "mean");
    if (red_ != "mean" && red_ != "sum" && red_ != "none") throw Reject{"reduction " + red_};
    has_ignore_ = c.has_attr("ignore_index");
    ignore_ = c.attr_i("ignore_index", -1);
  }
  void run(Ctx& c) override {
    Dims s = c.dims(0);
    const int64_t N = s[0], C = s[1];
    if (c.dims(1) != Dims{N})
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "SoftmaxCrossEntropyLoss: labels must be [N]"};
    const float* x = c.data<float>(0);
    const int64_t* t = c.data<int64_t>(1);
    const bool want_lp = c.output_count() > 1 && c.output_dtype(1) != KEEL_DTYPE_UNDEFINED;
    keel_tensor_t* lo = c.output(0, red_ == "none" ? Dims{N} : Dims{});
    float* lp = want_lp ? out_ptr<float>(c.output(1, s)) : nullptr;
    std::vector<float> row(static_cast<size_t>(C));
    double sum = 0;
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C;
      float mx = xr[0];
      for (int64_t j = 1; j < C; ++j) mx = std::max(mx, xr[j]);
      float se = 0;
      for (int64_t j = 0; j < C; ++j) se += std::exp(xr[j] - mx);
      const float lse = mx + std::log(se);
      if (lp)
        for (int64_t j = 0; j < C; ++j) lp[n * C + j] = xr[j] - lse;
      const int64_t k = t[n];
      float l = 0;
      if (!(has_ignore_ && k == ignore_)) {
        if (k < 0 || k >= C)
          throw Failure{KEEL_STATUS_INVALID_ARGUMENT,
                        "SoftmaxCrossEntropyLoss: label " + std::to_string(k) + " out of range"};
        l = lse - xr[k];
        ++count;
      }
      sum += l;
      if (red_ == "none") out_ptr<float>(lo)[n] = l;
    }
    if (red_ == "sum") *out_ptr<float>(lo) = static_cast<float>(sum);
    if (red_ == "mean") *out_ptr<float>(lo) = count ? static_cast<float>(sum / static_cast<double>(count)) : 0.f;
  }

 private:
  std::string red_;
  bool has_ignore_ = false;
  int64_t ignore_ = -1;
};

// keel.SoftmaxCrossEntropyLossGrad(dLoss, log_prob [N, C], labels [N]) -> dScores = s * (softmax - onehot).
class SoftmaxCrossEntropyGradKernel : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (c.dtype(0) != KEEL_DTYPE_F32 || c.dtype(1) != KEEL_DTYPE_F32 || c.dtype(2) != KEEL_DTYPE_I64)
      throw Reject{"f32 / int64 only"};
    if (c.input_count() > 3 && c.has_input(3)) throw Reject{"class weights"};
    if (!c.rank_known(1) || c.dims(1).size() != 2) throw Reject{"[N, C] only"};
    red_ = c.attr_s("reduction", "mean");
    if (red_ != "mean" && red_ != "sum" && red_ != "none") throw Reject{"reduction " + red_};
    has_ignore_ = c.has_attr("ignore_index");
    ignore_ = c.attr_i("ignore_index", -1);
  }
  void run(Ctx& c) override {
    Dims s = c.dims(1);
    const int64_t N = s[0], C = s[1];
    if (c.dims(2) != Dims{N}) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "labels must be [N]"};
    if (numel(c.dims(0)) != (red_ == "none" ? N : 1)) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "dLoss shape"};
    const float* dl = c.data<float>(0);
    const float* lp = c.data<float>(1);
    const int64_t* t = c.data<int64_t>(2);
    float* dx = out_ptr<float>(c.output(0, s));
    int64_t count = 0;
    for (int64_t n = 0; n < N; ++n) count += !(has_ignore_ && t[n] == ignore_);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t k = t[n];
      float sc = red_ == "none" ? dl[n] : red_ == "sum" ? dl[0] : (count ? dl[0] / static_cast<float>(count) : 0.f);
      if (has_ignore_ && k == ignore_) sc = 0;
      else if (k < 0 || k >= C) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "label out of range"};
      for (int64_t j = 0; j < C; ++j) dx[n * C + j] = sc * (std::exp(lp[n * C + j]) - (j == k ? 1.f : 0.f));
    }
  }

 private:
  std::string red_;
  bool has_ignore_ = false;
  int64_t ignore_ = -1;
};

// ---------------------------------------------------------------------------------------------- registration

const std::vector<TypedKernelInfo>& train_kernels() {
  static const std::vector<TypedKernelInfo> k = {
      {"keel",
       "ConvGrad",
       1,
       "onednn_keel_convgrad",
       {KEEL_DTYPE_F32, KEEL_DTYPE_BF16},
       [] { return static_cast<Kernel*>(new ConvGradKernel); }},
      {"keel",
       "FusedConvMaxPoolGrad",
       1,
       "onednn_keel_fusedconvmaxpoolgrad",
       {KEEL_DTYPE_F32},
       [] { return static_cast<Kernel*>(new ConvGradKernel(true)); }},
      {"keel",
       "ReluGrad",
       1,
       "onednn_keel_relugrad",
       {KEEL_DTYPE_F32, KEEL_DTYPE_BF16},
       [] { return static_cast<Kernel*>(new ReluGradKernel); }},
      {"keel",
       "MaxPoolGrad",
       1,
       "onednn_keel_maxpoolgrad",
       {KEEL_DTYPE_F32, KEEL_DTYPE_BF16},
       [] { return static_cast<Kernel*>(new MaxPoolGradKernel); }},
      {"keel",
       "SoftmaxCrossEntropyLossGrad",
       1,
       "onednn_keel_softmaxcrossentropylossgrad",
       {KEEL_DTYPE_F32},
       [] { return static_cast<Kernel*>(new SoftmaxCrossEntropyGradKernel); }},
      {"",
       "SoftmaxCrossEntropyLoss",
       13,
       "onednn_f32_softmaxcrossentropyloss",
       {KEEL_DTYPE_F32},
       [] { return static_cast<Kernel*>(new SoftmaxCrossEntropyKernel); }},
      {"", "Conv", 1, "onednn_bf16_conv", {KEEL_DTYPE_BF16}, [] { return static_cast<Kernel*>(new ConvBf16Kernel); }},
      // Runtime weights (eager's conv2d_relu under bf16 autocast); secondary as the f32 one
      // (KEEL_KERNEL_FLAG_SECONDARY), so a session's bf16 keel.FusedConv goes to kernels/bf16.cc's constant-weight
      // kernel first whatever the order.
      {"keel",
       "FusedConv",
       1,
       "onednn_bf16_keel_fusedconv_train",
       {KEEL_DTYPE_BF16},
       [] { return static_cast<Kernel*>(new ConvBf16Kernel(true)); },
       0,
       KEEL_KERNEL_FLAG_SECONDARY},
      {"",
       "Gemm",
       7,
       "onednn_bf16_gemm",
       {KEEL_DTYPE_BF16},
       [] { return static_cast<Kernel*>(new MatMulBf16Kernel(true)); }},
      {"",
       "MatMul",
       1,
       "onednn_bf16_matmul",
       {KEEL_DTYPE_BF16},
       [] { return static_cast<Kernel*>(new MatMulBf16Kernel(false)); }},
      {"",
       "Relu",
       1,
       "onednn_bf16_relu",
       {KEEL_DTYPE_BF16},
       [] { return static_cast<Kernel*>(new EltPoolBf16Kernel(false)); }},
      {"",
       "MaxPool",
       1,
       "onednn_bf16_maxpool",
       {KEEL_DTYPE_BF16},
       [] { return static_cast<Kernel*>(new EltPoolBf16Kernel(true)); }},
      // Cast's type parameters are T1/T2 (no "T"): the kernel itself rejects other dtype pairs at create.
      {"",
       "Cast",
       13,
       "onednn_bf16_cast",
       {KEEL_DTYPE_F32, KEEL_DTYPE_BF16},
       [] { return static_cast<Kernel*>(new CastBf16Kernel); }},
  };
  return k;
}

}  // namespace

keel_status_t register_kernel_table(Instance& instance, const std::vector<TypedKernelInfo>& table,
                                    bool dnnl_error_falls_back) {
  for (const auto& info : table) {
    keel_kernel_def_t def;
    std::memset(&def, 0, sizeof def);
    def.struct_size = sizeof def;
    def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
    def.abi_minor = KEEL_PLUGIN_ABI_MINOR;
    def.name = info.name;
    def.domain = info.domain;
    def.op_type = info.op_type;
    def.since_version = info.since_version;
    def.end_version = info.end_version;
    def.device_type = "cpu";
    keel_type_constraint_t tc{KEEL_TYPE_CONSTRAINT_HEADER, "T", info.dtypes.data(), info.dtypes.size()};
    def.constraints = &tc;
    def.constraint_count = 1;
    def.user_data = &instance.kernels.emplace_back(KernelEntry{&instance, info.make});
    def.create = create_kernel;
    def.compute = dnnl_error_falls_back ? compute_kernel_falling_back : compute_kernel_failing;
    def.release = release_kernel;
    def.flags = info.flags;
    if (keel_status_t st = instance.host->register_kernel(instance.handle, &def)) return st;
  }
  return nullptr;
}

keel_status_t register_train_kernels(Instance& instance) {
  return register_kernel_table(instance, train_kernels(), true);
}

}  // namespace keel::onednn
