// plugins/cpu_onednn/onednn_int8_dw.cc — the own int8 depthwise 3x3 kernel (onednn_int8_dw.h). The AVX-512 code is
// compiled with target attributes (the rest of the plugin keeps the build's baseline ISA) and only called when
// available() says the CPU has it.
#include "onednn_int8_dw.h"

#include "onednn_int8_quant.h"

// GCC 12 reports its own AVX-512 intrinsics (their _mm512_undefined_* self-initialisation) as "may be used
// uninitialized" once inlined here: a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#define KEEL_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

namespace keel::onednn {
namespace {

constexpr int64_t kBlock = 16;              // channels per vector
constexpr int64_t kBufferBytes = 32 * 1024;  // a band's widened input rows (L1-sized)
constexpr int kOutPix = 8;                   // output pixels per inner step (8 accumulators hide the FMA latency)

// Lanes of a 16-channel block that exist (the last block may be partial).
inline uint16_t lane_mask(int64_t valid) {
  return valid >= kBlock ? static_cast<uint16_t>(0xFFFF) : static_cast<uint16_t>((1u << valid) - 1u);
}

struct Epilogue {
  __m512 scale, bias, lo, hi, inv;
  __m512i zero, qlo, qhi;
};

KEEL_AVX512 inline void store(const Epilogue& e, DwQuant::Out out, __m512 acc, void* dst, __mmask16 m) {
  __m512 v = _mm512_fmadd_ps(acc, e.scale, e.bias);
  v = _mm512_min_ps(_mm512_max_ps(v, e.lo), e.hi);
  if (out == DwQuant::Out::kF32) {
    if (m == 0xFFFF) _mm512_storeu_ps(dst, v);
    else _mm512_mask_storeu_ps(dst, m, v);
    return;
  }
  // Round half to even (the default MXCSR mode), as std::nearbyint does.
  __m512i i = _mm512_cvtps_epi32(_mm512_mul_ps(v, e.inv));
  i = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(i, e.zero), e.qlo), e.qhi);
  // Narrowed in a register, then stored (vpmovdb to memory is slow on some CPUs).
  const __m128i b = _mm512_cvtepi32_epi8(i);
  if (m == 0xFFFF) _mm_storeu_si128(static_cast<__m128i*>(dst), b);
  else _mm_mask_storeu_epi8(dst, m, b);
}

// One row of outputs of a 16-channel block: `rows` points at the first of the three widened input rows it reads
// (row stride `row_stride` floats, 16 floats per column).
template <int J, int SW>
KEEL_AVX512 inline void row_step(const float* rows, int64_t row_stride, const __m512* w, __m512* acc, int64_t ow) {
  for (int j = 0; j < J; ++j) acc[j] = _mm512_setzero_ps();
#pragma GCC unroll 3
  for (int kh = 0; kh < 3; ++kh) {
    const float* r = rows + kh * row_stride + ow * SW * kBlock;
#pragma GCC unroll 3
    for (int kw = 0; kw < 3; ++kw) {
      const __m512 wv = w[kh * 3 + kw];
#pragma GCC unroll 8
      for (int j = 0; j < J; ++j) acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(r + (j * SW + kw) * kBlock), wv, acc[j]);
    }
  }
}

// Widens the in-range columns [c0, c1) of input row `src` (channels-last, `C` bytes per pixel, this block's first
// channel already applied) into `dst` (16 floats per column), less the zero point.
template <bool Signed>
KEEL_AVX512 void widen_row(const uint8_t* src, int64_t C, float* dst, int64_t n, __mmask16 m, __m512 zp) {
  for (int64_t i = 0; i < n; ++i) {
    const __m128i b = _mm_maskz_loadu_epi8(m, src + i * C);
    const __m512i d = Signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
    _mm512_storeu_ps(dst + i * kBlock, _mm512_sub_ps(_mm512_cvtepi32_ps(d), zp));
  }
}

// The output rows [oh0, oh1) of one 16-channel block (first channel c0) of image n, from the band's widened rows.
template <int SW>
KEEL_AVX512 void rows_block(const DwShape& s, const DwQuant& q, const Epilogue& e, const float* buf, int64_t row_stride,
                            const __m512* w, __mmask16 m, int64_t n, int64_t c0, int64_t oh0, int64_t oh1, uint8_t* y,
                            size_t out_bytes) {
  const int64_t C = s.C;
  for (int64_t oh = oh0; oh < oh1; ++oh) {
    const float* rows = buf + (oh - oh0) * s.stride_h * row_stride;
    uint8_t* yrow = y + ((n * s.OH + oh) * s.OW * C + c0) * static_cast<int64_t>(out_bytes);
    const int64_t pix_stride = C * static_cast<int64_t>(out_bytes);
    __m512 acc[kOutPix];
    // Blocks of 8 output pixels; the rest (fewer than 8, e.g. a 7x7 output) as one block of its own width, so that
    // every block has independent accumulators.
    int64_t ow = 0;
    for (; ow + kOutPix <= s.OW; ow += kOutPix) {
      row_step<kOutPix, SW>(rows, row_stride, w, acc, ow);
      for (int j = 0; j < kOutPix; ++j) store(e, q.out, acc[j], yrow + (ow + j) * pix_stride, m);
    }
    const int rest = static_cast<int>(s.OW - ow);
    switch (rest) {
      case 7: row_step<7, SW>(rows, row_stride, w, acc, ow); break;
      case 6: row_step<6, SW>(rows, row_stride, w, acc, ow); break;
      case 5: row_step<5, SW>(rows, row_stride, w, acc, ow); break;
      case 4: row_step<4, SW>(rows, row_stride, w, acc, ow); break;
      case 3: row_step<3, SW>(rows, row_stride, w, acc, ow); break;
      case 2: row_step<2, SW>(rows, row_stride, w, acc, ow); break;
      case 1: row_step<1, SW>(rows, row_stride, w, acc, ow); break;
      default: break;
    }
    for (int j = 0; j < rest; ++j) store(e, q.out, acc[j], yrow + (ow + j) * pix_stride, m);
  }
}

KEEL_AVX512 void work_avx512(const DwShape& s, const DwQuant& q, int64_t cb_count, int64_t band, int64_t bands,
                             int64_t cols, const float* wpack, const float* scale, const float* bias, const uint8_t* x,
                             uint8_t* y, int64_t begin, int64_t end) {
  const int64_t sh = s.stride_h, sw = s.stride_w, C = s.C;
  const int64_t in_rows_max = (band - 1) * sh + 3;
  thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(in_rows_max * cols * kBlock))
    buffer.resize(static_cast<size_t>(in_rows_max * cols * kBlock));
  float* buf = buffer.data();
  const int64_t row_stride = cols * kBlock;
  const size_t out_bytes = q.out == DwQuant::Out::kF32 ? 4 : 1;
  const __m512 zp = _mm512_set1_ps(static_cast<float>(q.x_zero));
  Epilogue e;
  e.lo = _mm512_set1_ps(q.lo);
  e.hi = _mm512_set1_ps(q.hi);
  e.inv = _mm512_set1_ps(q.y_inv_scale);
  e.zero = _mm512_set1_epi32(q.y_zero);
  e.qlo = _mm512_set1_epi32(q.out == DwQuant::Out::kS8 ? -128 : 0);
  e.qhi = _mm512_set1_epi32(q.out == DwQuant::Out::kS8 ? 127 : 255);
  // The input columns a row of outputs reads: iw = c - pad_l for c in [0, cols); in range: [c_lo, c_hi).
  const int64_t c_lo = std::min(cols, std::max<int64_t>(0, s.pad_l)),
                c_hi = std::max(c_lo, std::min(cols, s.W + s.pad_l));
  for (int64_t item = begin; item < end; ++item) {
    const int64_t cb = item % cb_count, rest = item / cb_count, bi = rest % bands, n = rest / bands;
    const int64_t c0 = cb * kBlock;
    const __mmask16 m = lane_mask(C - c0);
    const int64_t oh0 = bi * band, oh1 = std::min(s.OH, oh0 + band);
    const int64_t in_rows = (oh1 - oh0 - 1) * sh + 3, ih0 = oh0 * sh - s.pad_t;
    // Widen the band's input rows (padding: 0, i.e. x_zero less x_zero).
    for (int64_t r = 0; r < in_rows; ++r) {
      float* dst = buf + r * row_stride;
      const int64_t ih = ih0 + r;
      if (ih < 0 || ih >= s.H) {
        std::memset(dst, 0, static_cast<size_t>(row_stride) * sizeof(float));
        continue;
      }
      if (c_lo > 0) std::memset(dst, 0, static_cast<size_t>(c_lo * kBlock) * sizeof(float));
      if (c_hi < cols) std::memset(dst + c_hi * kBlock, 0, static_cast<size_t>((cols - c_hi) * kBlock) * sizeof(float));
      const uint8_t* src = x + ((n * s.H + ih) * s.W + (c_lo - s.pad_l)) * C + c0;
      if (q.x_signed) widen_row<true>(src, C, dst + c_lo * kBlock, c_hi - c_lo, m, zp);
      else widen_row<false>(src, C, dst + c_lo * kBlock, c_hi - c_lo, m, zp);
    }
    __m512 w[9];
    for (int t = 0; t < 9; ++t) w[t] = _mm512_loadu_ps(wpack + (cb * 9 + t) * kBlock);
    e.scale = _mm512_loadu_ps(scale + c0);
    e.bias = _mm512_loadu_ps(bias + c0);
    if (sw == 1) rows_block<1>(s, q, e, buf, row_stride, w, m, n, c0, oh0, oh1, y, out_bytes);
    else rows_block<2>(s, q, e, buf, row_stride, w, m, n, c0, oh0, oh1, y, out_bytes);
  }
}

}  // namespace

bool Int8Depthwise3x3::available() { return int8_own_kernels(); }

Int8Depthwise3x3::Int8Depthwise3x3(const DwShape& s, const DwQuant& q, const int8_t* w, const float* scale,
                                   const float* bias)
    : s_(s), q_(q) {
  cb_ = (s.C + kBlock - 1) / kBlock;
  cols_ = (s.OW - 1) * s.stride_w + 3;
  // As many output rows per item as keep the widened rows within the buffer, and at least four items per thread pair
  // where the output has the rows for it.
  const int64_t row_bytes = cols_ * kBlock * static_cast<int64_t>(sizeof(float));
  band_ = 1;
  while (band_ < s.OH && ((band_) * s.stride_h + 3) * row_bytes <= kBufferBytes && band_ < 8) ++band_;
  while (band_ > 1 && s.N * cb_ * ((s.OH + band_ - 1) / band_) < 8) --band_;
  bands_ = (s.OH + band_ - 1) / band_;
  w_.assign(static_cast<size_t>(cb_ * 9 * kBlock), 0.f);
  scale_.assign(static_cast<size_t>(cb_ * kBlock), 0.f);
  bias_.assign(static_cast<size_t>(cb_ * kBlock), 0.f);
  for (int64_t c = 0; c < s.C; ++c) {
    const int64_t b = c / kBlock, l = c % kBlock;
    for (int t = 0; t < 9; ++t) w_[static_cast<size_t>((b * 9 + t) * kBlock + l)] = static_cast<float>(w[c * 9 + t]);
    scale_[static_cast<size_t>(c)] = scale[c];
    if (bias) bias_[static_cast<size_t>(c)] = bias[c];
  }
}

void Int8Depthwise3x3::work(const void* x, void* y, int64_t begin, int64_t end) const {
  work_avx512(s_, q_, cb_, band_, bands_, cols_, w_.data(), scale_.data(), bias_.data(), static_cast<const uint8_t*>(x),
              static_cast<uint8_t*>(y), begin, end);
}

void Int8Depthwise3x3::run(const void* x, void* y, int threads) const {
  const int64_t items = s_.N * bands_ * cb_;
  const int team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, items)));
  if (team == 1) {
    work(x, y, 0, items);
    return;
  }
#pragma omp parallel num_threads(team)
  {
    const int64_t t = omp_get_thread_num(), k = omp_get_num_threads();
    work(x, y, items * t / k, items * (t + 1) / k);
  }
}

}  // namespace keel::onednn
