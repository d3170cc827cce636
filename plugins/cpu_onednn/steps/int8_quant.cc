// plugins/cpu_onednn/steps/int8_quant.cc — the own f32 -> u8/s8 quantization loops (steps/int8_quant.h). AVX-512
// code is compiled with target attributes and only called where int8_own_kernels() holds.
#include "steps/int8_quant.h"

#include "common/team.h"

// GCC 12 reports its own AVX-512 intrinsics (their _mm512_undefined_* self-initialisation) as "may be used
// uninitialized" once inlined here: a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#define KEEL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

namespace keel::onednn {
namespace {

// Elements below which the loops run on the calling thread alone. Their input was usually just written by the
// previous step, much of it by the calling thread (an fp32 chain's last reorder runs on one thread), and a second
// thread reading lines that sit modified in the other core's cache costs more than it saves: [1,24,56,56] plain ->
// channels-last quantization (MobileNetV2's fp32 -> int8 boundary) 14 us on one thread, 55 us on two, standalone
// with the input hot in the first core's cache; in the model at 2 threads 0.022 -> 0.018-0.022 ms.
constexpr int64_t kParallelMin = int64_t{1} << 20;
// The same-layout quantization (quantize_f32) lower: in an int8 chain its input is mostly a convolution's output that
// the whole team wrote, so one thread alone reads half of it from the other core: ResNet-18's block inputs
// [1,64,56,56] at 2 threads 0.025-0.029 ms on one thread, 0.012-0.017 split.
constexpr int64_t kSameLayoutParallelMin = int64_t{1} << 16;
// The same for the transpose, lower: ResNet-18's first convolution, [1,64,112,112] f32, transposed on one thread took
// 0.23-0.37 ms against 0.24-0.27 for oneDNN's reorder on two.
constexpr int64_t kTransposeParallelMin = int64_t{1} << 18;

struct Consts {
  __m512 inv;
  __m512i zero, lo, hi;
};

KEEL_AVX512 inline Consts consts(const QuantizeSpec& q) {
  return {_mm512_set1_ps(q.inv_scale), _mm512_set1_epi32(q.zero), _mm512_set1_epi32(q.s8 ? -128 : 0),
          _mm512_set1_epi32(q.s8 ? 127 : 255)};
}

// 16 floats -> 16 saturated s32 values in the quantized range. NaN: vcvtps2dq gives INT_MIN, replaced by the zero
// point.
KEEL_AVX512 inline __m512i quantize16(__m512 v, const Consts& k) {
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  __m512i i = _mm512_cvtps_epi32(_mm512_mul_ps(v, k.inv));
  i = _mm512_add_epi32(i, k.zero);
  // cvtps2dq saturates out-of-range values to INT_MIN; adding the zero point must not wrap it: clamp in a wide way.
  const __mmask16 big = _mm512_cmp_ps_mask(_mm512_mul_ps(v, k.inv), _mm512_set1_ps(2147483520.f), _CMP_GE_OQ);
  i = _mm512_mask_mov_epi32(i, big, k.hi);
  i = _mm512_min_epi32(_mm512_max_epi32(i, k.lo), k.hi);
  return _mm512_mask_mov_epi32(i, nan, _mm512_max_epi32(_mm512_min_epi32(k.zero, k.hi), k.lo));
}

KEEL_AVX512 void quantize_range(const float* x, uint8_t* y, int64_t begin, int64_t end, const QuantizeSpec& q) {
  const Consts k = consts(q);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm512_cvtepi32_epi8(quantize16(_mm512_loadu_ps(x + i), k)));
  if (i < end) {
    const __mmask16 m = static_cast<__mmask16>((1u << (end - i)) - 1u);
    _mm_mask_storeu_epi8(y + i, m, _mm512_cvtepi32_epi8(quantize16(_mm512_maskz_loadu_ps(m, x + i), k)));
  }
}

// Pixel blocks [b0, b1) (16 pixels each, over all images: block b = image b / blocks, pixels 16 * (b % blocks)...)
// of x [N, C, S] into y [N, S, C], any C: four channels at a time, their 16 quantized bytes interleaved into 4-byte
// groups (one per pixel) and stored at the pixel's channels; a last group of 1-3 channels (a 3-channel image) reads
// only its own channels and stores their bytes one by one.
KEEL_AVX512 void to_nhwc_range(const float* x, uint8_t* y, int64_t C, int64_t S, int64_t b0, int64_t b1,
                               const QuantizeSpec& q) {
  const Consts k = consts(q);
  const int64_t blocks = (S + 15) / 16;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n = b / blocks, p0 = (b % blocks) * 16, np = std::min<int64_t>(16, S - p0);
    const __mmask16 m = static_cast<__mmask16>(np >= 16 ? 0xFFFF : (1u << np) - 1u);
    const float* xs = x + n * C * S + p0;
    uint8_t* yd = y + (n * S + p0) * C;
    for (int64_t c = 0; c < C; c += 4) {
      const int64_t have = std::min<int64_t>(4, C - c);
      __m128i r[4];
      for (int j = 0; j < 4; ++j)
        r[j] = j < have ? _mm512_cvtepi32_epi8(quantize16(_mm512_maskz_loadu_ps(m, xs + (c + j) * S), k))
                        : _mm_setzero_si128();
      const __m128i ab_lo = _mm_unpacklo_epi8(r[0], r[1]), ab_hi = _mm_unpackhi_epi8(r[0], r[1]);
      const __m128i cd_lo = _mm_unpacklo_epi8(r[2], r[3]), cd_hi = _mm_unpackhi_epi8(r[2], r[3]);
      alignas(16) uint32_t px[16];  // pixel i: channels c..c+3
      _mm_store_si128(reinterpret_cast<__m128i*>(px), _mm_unpacklo_epi16(ab_lo, cd_lo));
      _mm_store_si128(reinterpret_cast<__m128i*>(px + 4), _mm_unpackhi_epi16(ab_lo, cd_lo));
      _mm_store_si128(reinterpret_cast<__m128i*>(px + 8), _mm_unpacklo_epi16(ab_hi, cd_hi));
      _mm_store_si128(reinterpret_cast<__m128i*>(px + 12), _mm_unpackhi_epi16(ab_hi, cd_hi));
      if (have == 4) {
        for (int64_t i = 0; i < np; ++i) std::memcpy(yd + i * C + c, &px[i], 4);
      } else if (have == C) {
        // One partial group (C < 4): a pixel's 4-byte store spills into the following pixels of this block, which
        // are stored after it; the pixels whose 4 bytes would reach past the block get theirs one by one.
        int64_t i = 0;
        for (; i * C + 4 <= np * C; ++i) std::memcpy(yd + i * C, &px[i], 4);
        for (; i < np; ++i)
          for (int64_t j = 0; j < C; ++j) yd[i * C + j] = static_cast<uint8_t>(px[i] >> (8 * j));
      } else {
        for (int64_t i = 0; i < np; ++i)
          for (int64_t j = 0; j < have; ++j) yd[i * C + c + j] = static_cast<uint8_t>(px[i] >> (8 * j));
      }
    }
  }
}

// Rows [r0, r1) (a row: one image's pixel, all its channel blocks) of x nChw16c [N, CB, S, 16] into y [N, S, C]:
// quantized to bytes by `q` (kQuantize), or copied as floats (`q` unused).
template <bool kQuantize>
KEEL_AVX512 void blocked16_to_nhwc_rows(const float* x, void* y, int64_t C, int64_t S, int64_t r0, int64_t r1,
                                        const QuantizeSpec* q) {
  [[maybe_unused]] Consts k{};
  if constexpr (kQuantize) k = consts(*q);
  const int64_t cb = (C + 15) / 16;
  const __mmask16 tail = static_cast<__mmask16>(C % 16 == 0 ? 0xFFFF : (1u << (C % 16)) - 1u);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / S, s = r % S;
    const float* xs = x + (n * cb * S + s) * 16;
    for (int64_t b = 0; b < cb; ++b) {
      const __m512 v = _mm512_loadu_ps(xs + b * S * 16);
      const __mmask16 m = b + 1 < cb ? static_cast<__mmask16>(0xFFFF) : tail;
      const int64_t at = r * C + b * 16;
      if constexpr (kQuantize)
        _mm_mask_storeu_epi8(static_cast<uint8_t*>(y) + at, m, _mm512_cvtepi32_epi8(quantize16(v, k)));
      else _mm512_mask_storeu_ps(static_cast<float*>(y) + at, m, v);
    }
  }
}

// r[i] (16 floats each) <- column i of the 16x16 matrix whose rows r holds: unpack pairs, then 4-float groups, then
// 128-bit lanes twice.
KEEL_AVX512 inline void transpose16x16(__m512 r[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
#pragma GCC unroll 2
  for (int h = 0; h < 16; h += 8)
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xDD);
    }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
  }
}

// Units [u0, u1) of x [N, S, C] -> y [N, C, S] (a unit: one image's block of 16 channels), 16x16 tiles transposed in
// registers (partial tiles: masked loads of the channels, masked stores of the pixels).
KEEL_AVX512 void to_nchw_range(const float* x, float* y, int64_t C, int64_t S, int64_t u0, int64_t u1) {
  const int64_t cblocks = (C + 15) / 16;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t n = u / cblocks, c0 = (u % cblocks) * 16, nc = std::min<int64_t>(16, C - c0);
    const __mmask16 cm = static_cast<__mmask16>(nc >= 16 ? 0xFFFF : (1u << nc) - 1u);
    const float* xs = x + n * S * C + c0;
    float* yd = y + (n * C + c0) * S;
    for (int64_t p0 = 0; p0 < S; p0 += 16) {
      const int64_t np = std::min<int64_t>(16, S - p0);
      const __mmask16 pm = static_cast<__mmask16>(np >= 16 ? 0xFFFF : (1u << np) - 1u);
      __m512 r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) r[i] = i < np ? _mm512_maskz_loadu_ps(cm, xs + (p0 + i) * C) : _mm512_setzero_ps();
      transpose16x16(r);
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j)
        if (j < nc) _mm512_mask_storeu_ps(yd + j * S + p0, pm, r[j]);
    }
  }
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

}  // namespace

bool int8_own_kernels() {
  static const bool ok = [] {
    const char* e = std::getenv("KEEL_ONEDNN_INT8_OWN");
    if (e && std::strcmp(e, "0") == 0) return false;
    return cpu_has_avx512();
  }();
  return ok;
}

void quantize_f32(const float* x, void* y, int64_t n, const QuantizeSpec& q, int threads) {
  const int team = n >= kSameLayoutParallelMin ? std::max(1, threads) : 1;
  // Ranges in whole vectors, so that only the last range has a partial one.
  const int64_t vecs = (n + 15) / 16;
  split_over_team(vecs, team, [&](int64_t, int64_t v0, int64_t v1) {
    quantize_range(x, static_cast<uint8_t*>(y), v0 * 16, std::min(n, v1 * 16), q);
  });
}

void quantize_f32_to_nhwc(const float* x, void* y, int64_t N, int64_t C, int64_t S, const QuantizeSpec& q,
                          int threads) {
  const int64_t blocks = N * ((S + 15) / 16);
  const int team = N * C * S >= kParallelMin ? static_cast<int>(std::min<int64_t>(std::max(1, threads), blocks)) : 1;
  split_over_team(blocks, team, [&](int64_t, int64_t b0, int64_t b1) {
    to_nhwc_range(x, static_cast<uint8_t*>(y), C, S, b0, b1, q);
  });
}

void quantize_f32_blocked16_to_nhwc(const float* x, void* y, int64_t N, int64_t C, int64_t S, const QuantizeSpec& q,
                                    int threads) {
  const int64_t rows = N * S;
  const int team = N * C * S >= kParallelMin ? static_cast<int>(std::min<int64_t>(std::max(1, threads), rows)) : 1;
  split_over_team(rows, team,
                  [&](int64_t, int64_t r0, int64_t r1) { blocked16_to_nhwc_rows<true>(x, y, C, S, r0, r1, &q); });
}

void blocked16_to_nhwc_f32(const float* x, float* y, int64_t N, int64_t C, int64_t S, int threads) {
  const int64_t rows = N * S;
  const int team =
      N * C * S >= kTransposeParallelMin ? static_cast<int>(std::min<int64_t>(std::max(1, threads), rows)) : 1;
  split_over_team(rows, team,
                  [&](int64_t, int64_t r0, int64_t r1) { blocked16_to_nhwc_rows<false>(x, y, C, S, r0, r1, nullptr); });
}

void nhwc_to_nchw_f32(const float* x, float* y, int64_t N, int64_t C, int64_t S, int threads) {
  const int64_t units = N * ((C + 15) / 16);
  const int team =
      N * C * S >= kTransposeParallelMin ? static_cast<int>(std::min<int64_t>(std::max(1, threads), units)) : 1;
  split_over_team(units, team, [&](int64_t, int64_t u0, int64_t u1) { to_nchw_range(x, y, C, S, u0, u1); });
}

}  // namespace keel::onednn
