// plugins/cpu_onednn/steps/int8_dw.cc — the own int8 depthwise 3x3 kernel (steps/int8_dw.h). The AVX-512 code is
// compiled with target attributes (the rest of the plugin keeps the build's baseline ISA) and only called when
// available() says the CPU has it.
#include "steps/int8_dw.h"

#include "common/lanes.h"
#include "common/team.h"
#include "steps/int8_quant.h"

// GCC 12 reports its own AVX-512 intrinsics (their _mm512_undefined_* self-initialisation) as "may be used
// uninitialized" once inlined here: a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#define KEEL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi")))

namespace keel::onednn {
namespace {

constexpr int64_t kBlock = 16;               // channels per item
constexpr int64_t kBufferBytes = 16 * 1024;  // a band's copied input rows
constexpr int kOutPix = 8;                   // output pixels per inner step (independent accumulators)

struct Epilogue {
  __m512i comp;  // x_zero' * sum of the channel's 9 weights (subtracted from the u8 x s8 sums)
  __m512 scale, bias, lo, hi;
  __m512i zero;
};

KEEL_AVX512 inline void store(const Epilogue& e, bool f32, __m512i acc, void* dst, __mmask16 m) {
  __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, e.comp)), e.scale, e.bias);
  v = _mm512_min_ps(_mm512_max_ps(v, e.lo), e.hi);
  if (f32) {
    if (m == 0xFFFF) _mm512_storeu_ps(dst, v);
    else _mm512_mask_storeu_ps(dst, m, v);
    return;
  }
  // v is already within [qmin - y_zero, qmax - y_zero]: round half to even (the default MXCSR mode, as
  // std::nearbyint), add the zero point, narrow in a register (vpmovdb to memory is slow on some CPUs), store.
  const __m128i b = _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(v), e.zero));
  if (m == 0xFFFF) _mm_storeu_si128(static_cast<__m128i*>(dst), b);
  else _mm_mask_storeu_epi8(dst, m, b);
}

// J output pixels from ow of one output row: `rows` points at the first of the three copied input rows it reads
// (`row_stride` bytes apart, 16 bytes per column). For each kernel row, the 64 bytes at the pixel's first column
// (its columns ow*SW .. ow*SW+3) are permuted into [x0, x1, x2, x3] per channel and multiplied with that row's
// weights [w0, w1, w2, 0] by one vpdpbusd.
template <int J, int SW>
KEEL_AVX512 inline void row_step(const uint8_t* rows, int64_t row_stride, const __m512i* w, __m512i perm, __m512i* acc,
                                 int64_t ow) {
  for (int j = 0; j < J; ++j) acc[j] = _mm512_setzero_si512();
#pragma GCC unroll 3
  for (int kh = 0; kh < 3; ++kh) {
    const uint8_t* r = rows + kh * row_stride + ow * SW * kBlock;
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) {
      const __m512i x = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(r + j * SW * kBlock));
      acc[j] = _mm512_dpbusd_epi32(acc[j], x, w[kh]);
    }
  }
}

// The output rows [oh0, oh1) of one 16-channel block (first channel c0) of image n, from the band's copied rows.
template <int SW>
KEEL_AVX512 void rows_block(const DwShape& s, bool f32, const Epilogue& e, const uint8_t* buf, int64_t row_stride,
                            const __m512i* w, __mmask16 m, int64_t n, int64_t c0, int64_t oh0, int64_t oh1,
                            uint8_t* y) {
  const int64_t out_bytes = f32 ? 4 : 1, pix_stride = s.C * out_bytes;
  // Byte 4i + t of the permuted vector: channel i of column t (t = 3: any byte, its weight is 0).
  alignas(64) uint8_t idx[64];
  for (int i = 0; i < 16; ++i)
    for (int t = 0; t < 4; ++t) idx[4 * i + t] = static_cast<uint8_t>(16 * t + i);
  const __m512i perm = _mm512_load_si512(idx);
  for (int64_t oh = oh0; oh < oh1; ++oh) {
    const uint8_t* rows = buf + (oh - oh0) * s.stride_h * row_stride;
    uint8_t* yrow = y + ((n * s.OH + oh) * s.OW * s.C + c0) * out_bytes;
    __m512i acc[kOutPix];
    // Blocks of 8 output pixels; the rest (fewer than 8, e.g. a 7x7 output) as one block of its own width.
    int64_t ow = 0;
    for (; ow + kOutPix <= s.OW; ow += kOutPix) {
      row_step<kOutPix, SW>(rows, row_stride, w, perm, acc, ow);
      for (int j = 0; j < kOutPix; ++j) store(e, f32, acc[j], yrow + (ow + j) * pix_stride, m);
    }
    const int rest = static_cast<int>(s.OW - ow);
    switch (rest) {
      case 7: row_step<7, SW>(rows, row_stride, w, perm, acc, ow); break;
      case 6: row_step<6, SW>(rows, row_stride, w, perm, acc, ow); break;
      case 5: row_step<5, SW>(rows, row_stride, w, perm, acc, ow); break;
      case 4: row_step<4, SW>(rows, row_stride, w, perm, acc, ow); break;
      case 3: row_step<3, SW>(rows, row_stride, w, perm, acc, ow); break;
      case 2: row_step<2, SW>(rows, row_stride, w, perm, acc, ow); break;
      case 1: row_step<1, SW>(rows, row_stride, w, perm, acc, ow); break;
      default: break;
    }
    for (int j = 0; j < rest; ++j) store(e, f32, acc[j], yrow + (ow + j) * pix_stride, m);
  }
}

struct Packed {
  const int8_t* w;                      // [cb][3][64]: per kernel row, [w0, w1, w2, 0] per channel
  const int32_t* comp;                  // [cb * 16]
  const float *scale, *bias, *lo, *hi;  // [cb * 16] (quantized outputs: divided by y_scale, bounds in the range)
};

KEEL_AVX512 void work_avx512(const DwShape& s, const DwQuant& q, int64_t cb_count, int64_t band, int64_t bands,
                             int64_t cols, const Packed& pk, const uint8_t* x, uint8_t* y, int64_t begin, int64_t end) {
  const int64_t sh = s.stride_h, C = s.C;
  const int64_t in_rows_max = (band - 1) * sh + 3, row_stride = (cols + 1) * kBlock;  // + 1: the 4th column read
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < static_cast<size_t>(in_rows_max * row_stride))
    buffer.resize(static_cast<size_t>(in_rows_max * row_stride));
  uint8_t* buf = buffer.data();
  const bool f32 = q.out == DwQuant::Out::kF32;
  // X's bytes as u8: s8 values are offset by 128 (xor 0x80), the zero point with them; padding is the zero point.
  const uint8_t flip = q.x_signed ? 0x80 : 0;
  const uint8_t pad = static_cast<uint8_t>(q.x_zero + (q.x_signed ? 128 : 0));
  const __m128i flipv = _mm_set1_epi8(static_cast<char>(flip)), padv = _mm_set1_epi8(static_cast<char>(pad));
  Epilogue e;
  e.zero = _mm512_set1_epi32(f32 ? 0 : q.y_zero);
  const int64_t c_lo = std::min(cols, std::max<int64_t>(0, s.pad_l)),
                c_hi = std::max(c_lo, std::min(cols, s.W + s.pad_l));
  for (int64_t item = begin; item < end; ++item) {
    const int64_t cb = item % cb_count, rest = item / cb_count, bi = rest % bands, n = rest / bands;
    const int64_t c0 = cb * kBlock;
    const __mmask16 m = first_lanes(C - c0);
    const int64_t oh0 = bi * band, oh1 = std::min(s.OH, oh0 + band);
    const int64_t in_rows = (oh1 - oh0 - 1) * sh + 3, ih0 = oh0 * sh - s.pad_t;
    // Copy the band's input rows of this block (16 bytes per column), padding as the zero point.
    for (int64_t r = 0; r < in_rows; ++r) {
      uint8_t* dst = buf + r * row_stride;
      const int64_t ih = ih0 + r;
      if (ih < 0 || ih >= s.H) {
        for (int64_t i = 0; i <= cols; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i * kBlock), padv);
        continue;
      }
      for (int64_t i = 0; i < c_lo; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i * kBlock), padv);
      for (int64_t i = c_hi; i <= cols; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i * kBlock), padv);
      const uint8_t* src = x + ((n * s.H + ih) * s.W + (c_lo - s.pad_l)) * C + c0;
      if (m == 0xFFFF) {
        for (int64_t i = 0; i < c_hi - c_lo; ++i)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (c_lo + i) * kBlock),
                           _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * C)), flipv));
      } else {
        for (int64_t i = 0; i < c_hi - c_lo; ++i)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (c_lo + i) * kBlock),
                           _mm_xor_si128(_mm_maskz_loadu_epi8(m, src + i * C), flipv));
      }
    }
    __m512i w[3];
    for (int t = 0; t < 3; ++t) w[t] = _mm512_loadu_si512(pk.w + (cb * 3 + t) * 64);
    e.comp = _mm512_loadu_si512(pk.comp + c0);
    e.scale = _mm512_loadu_ps(pk.scale + c0);
    e.bias = _mm512_loadu_ps(pk.bias + c0);
    e.lo = _mm512_loadu_ps(pk.lo + c0);
    e.hi = _mm512_loadu_ps(pk.hi + c0);
    if (s.stride_w == 1) rows_block<1>(s, f32, e, buf, row_stride, w, m, n, c0, oh0, oh1, y);
    else rows_block<2>(s, f32, e, buf, row_stride, w, m, n, c0, oh0, oh1, y);
  }
}

bool cpu_has_vnni_vbmi() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
}

}  // namespace

bool Int8Depthwise3x3::available() {
  static const bool ok = int8_own_kernels() && cpu_has_vnni_vbmi();
  return ok;
}

Int8Depthwise3x3::Int8Depthwise3x3(const DwShape& s, const DwQuant& q, const int8_t* w, const float* scale,
                                   const float* bias)
    : s_(s), q_(q) {
  cb_ = (s.C + kBlock - 1) / kBlock;
  cols_ = (s.OW - 1) * s.stride_w + 3;
  // As many output rows per item as keep the copied rows small, and at least 8 items where the output has the rows.
  const int64_t row_bytes = (cols_ + 1) * kBlock;
  band_ = 1;
  while (band_ < s.OH && band_ < 8 && (band_ * s.stride_h + 3) * row_bytes <= kBufferBytes) ++band_;
  while (band_ > 1 && s.N * cb_ * ((s.OH + band_ - 1) / band_) < 8) --band_;
  bands_ = (s.OH + band_ - 1) / band_;
  const size_t lanes = static_cast<size_t>(cb_ * kBlock);
  w_.assign(static_cast<size_t>(cb_ * 3 * 64), 0);
  comp_.assign(lanes, 0);
  scale_.assign(lanes, 0.f);
  bias_.assign(lanes, 0.f);
  lo_.assign(lanes, 0.f);
  hi_.assign(lanes, 0.f);
  const int32_t zp = x_zero_as_u8(q);
  for (int64_t c = 0; c < s.C; ++c) {
    const int64_t b = c / kBlock, l = c % kBlock;
    int32_t sum = 0;
    for (int kh = 0; kh < 3; ++kh)
      for (int kw = 0; kw < 3; ++kw) {
        const int8_t v = w[c * 9 + kh * 3 + kw];
        w_[static_cast<size_t>((b * 3 + kh) * 64 + l * 4 + kw)] = v;
        sum += v;
      }
    comp_[static_cast<size_t>(c)] = zp * sum;
    const ChannelEpilogue e = channel_epilogue(q, scale[c], bias ? bias[c] : 0.f);
    scale_[static_cast<size_t>(c)] = e.scale, bias_[static_cast<size_t>(c)] = e.bias;
    lo_[static_cast<size_t>(c)] = e.lo, hi_[static_cast<size_t>(c)] = e.hi;
  }
}

void Int8Depthwise3x3::work(const void* x, void* y, int64_t begin, int64_t end) const {
  const Packed pk{w_.data(), comp_.data(), scale_.data(), bias_.data(), lo_.data(), hi_.data()};
  work_avx512(s_, q_, cb_, band_, bands_, cols_, pk, static_cast<const uint8_t*>(x), static_cast<uint8_t*>(y), begin,
              end);
}

void Int8Depthwise3x3::run(const void* x, void* y, int threads) const {
  const int64_t items = s_.N * bands_ * cb_;
  const int team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, items)));
  split_over_team(items, team, [&](int64_t, int64_t begin, int64_t end) { work(x, y, begin, end); });
}

}  // namespace keel::onednn
