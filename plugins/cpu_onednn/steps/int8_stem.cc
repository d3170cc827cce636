// plugins/cpu_onednn/steps/int8_stem.cc — the own int8 convolution over few input channels with the max pooling
// after it fused (steps/int8_stem.h).
#include "steps/int8_stem.h"

#include "common/team.h"
#include "steps/int8_quant.h"

// GCC 12 reports its own AVX-512 intrinsics (their _mm512_undefined_* self-initialisation) as "may be used
// uninitialized" (or "is used uninitialized") once inlined here: a known false positive (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cstring>

#define KEEL_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

namespace keel::onednn {
namespace {

constexpr int kPix = 4;  // conv pixels per inner step (independent accumulators: kPix x M / 16)

struct Packed {
  const int8_t* w;
  const int64_t* off;  // [groups]: each vpdpbusd operand's offset in the copied rows (its row and 4-column chunk)
  const int32_t* comp;
  const float *scale, *bias, *lo, *hi;
};

// J conv pixels from ox of one row (its input rows copied into `buf`, one padded row per (c, ky), `row_len` bytes
// apart) into acc [OW][M] s32, the zero point's part not yet subtracted. MB: 16-channel blocks of M.
template <int MB, int J>
KEEL_AVX512_VNNI inline void conv_step(const StemShape& s, int64_t groups, const int64_t* off, const int8_t* w,
                                       const uint8_t* buf, int32_t* acc, int64_t ox) {
  // Unrolled so that the J x MB accumulators stay in registers.
  __m512i a[J][MB];
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j)
#pragma GCC unroll 4
    for (int b = 0; b < MB; ++b) a[j][b] = _mm512_setzero_si512();
  const uint8_t* px = buf + ox * s.SW;
  const int64_t sw = s.SW;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* p = px + off[g];
    const int8_t* wg = w + g * MB * 64;
    __m512i wv[MB];
#pragma GCC unroll 4
    for (int b = 0; b < MB; ++b) wv[b] = _mm512_loadu_si512(wg + b * 64);
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) {
      int32_t x4;
      std::memcpy(&x4, p + j * sw, 4);
      const __m512i xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 4
      for (int b = 0; b < MB; ++b) a[j][b] = _mm512_dpbusd_epi32(a[j][b], xb, wv[b]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j)
#pragma GCC unroll 4
    for (int b = 0; b < MB; ++b) _mm512_storeu_si512(acc + (ox + j) * MB * 16 + b * 16, a[j][b]);
}

template <int MB>
KEEL_AVX512_VNNI void conv_row(const StemShape& s, int64_t groups, const int64_t* off, const int8_t* w,
                               const uint8_t* buf, int32_t* acc) {
  int64_t ox = 0;
  for (; ox + kPix <= s.OW; ox += kPix) conv_step<MB, kPix>(s, groups, off, w, buf, acc, ox);
  for (; ox < s.OW; ++ox) conv_step<MB, 1>(s, groups, off, w, buf, acc, ox);
}

// The epilogue of the sums `a` of channels b..b+15 (lanes past M masked off by k) into the pixel's values at y (f32, or
// u8 / s8 bytes; channel b's value is y's b-th).
KEEL_AVX512_VNNI inline void epilogue_block(const Packed& pk, int64_t b, __mmask16 k, DwQuant::Out out, int32_t y_zero,
                                            __m512i a, void* y) {
  a = _mm512_sub_epi32(a, _mm512_loadu_si512(pk.comp + b));
  __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), _mm512_loadu_ps(pk.scale + b), _mm512_loadu_ps(pk.bias + b));
  v = _mm512_min_ps(_mm512_max_ps(v, _mm512_loadu_ps(pk.lo + b)), _mm512_loadu_ps(pk.hi + b));
  // Whole blocks with plain stores (masked ones cost more on some CPUs), the last partial one masked.
  if (out == DwQuant::Out::kF32) {
    if (k == 0xFFFF) _mm512_storeu_ps(static_cast<float*>(y) + b, v);
    else _mm512_mask_storeu_ps(static_cast<float*>(y) + b, k, v);
  } else {  // v is within [qmin - y_zero, qmax - y_zero] (the bounds): round half to even, add the zero point
    const __m128i q = _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(y_zero)));
    if (k == 0xFFFF) _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint8_t*>(y) + b), q);
    else _mm_mask_storeu_epi8(static_cast<uint8_t*>(y) + b, k, q);
  }
}

inline __mmask16 block_mask(int64_t M, int64_t b) {
  return M - b >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (M - b)) - 1u);
}

// The epilogue of one pixel's M sums (acc holds them in blocks of 16, the last one padded) into y's M values.
KEEL_AVX512_VNNI inline void epilogue(const Packed& pk, int64_t M, DwQuant::Out out, int32_t y_zero, const int32_t* acc,
                                      void* y) {
  for (int64_t b = 0; b < M; b += 16)
    epilogue_block(pk, b, block_mask(M, b), out, y_zero, _mm512_loadu_si512(acc + b), y);
}

// PJ pooled pixels of a 2x2 stride-2 pooling from pooled column px: the 2 x 2 PJ conv pixels under them summed in
// registers (their input rows copied into `buf` as for a pair of conv rows: row 1's operands `row1` bytes after row
// 0's), each window's maximum taken there, then the epilogue into y's pixels px.. (M values each, out_bytes a value).
// A window's second row or column past the conv output repeats its first (the maximum is unchanged).
template <int MB, int PJ>
KEEL_AVX512_VNNI inline void pool2_step(const StemShape& s, const DwQuant& q, int64_t groups, const int64_t* off,
                                        const Packed& pk, const uint8_t* buf, int64_t row1, int64_t px, uint8_t* y,
                                        int64_t out_bytes) {
  int64_t col[2 * PJ];
#pragma GCC unroll 8
  for (int j = 0; j < 2 * PJ; ++j) col[j] = std::min<int64_t>(2 * px + j, s.OW - 1) * s.SW;
  __m512i a[2][2 * PJ][MB];
#pragma GCC unroll 2
  for (int r = 0; r < 2; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < 2 * PJ; ++j)
#pragma GCC unroll 4
      for (int b = 0; b < MB; ++b) a[r][j][b] = _mm512_setzero_si512();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* p = buf + off[g];
    const int8_t* wg = pk.w + g * MB * 64;
    __m512i wv[MB];
#pragma GCC unroll 4
    for (int b = 0; b < MB; ++b) wv[b] = _mm512_loadu_si512(wg + b * 64);
#pragma GCC unroll 2
    for (int r = 0; r < 2; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < 2 * PJ; ++j) {
        int32_t x4;
        std::memcpy(&x4, p + r * row1 + col[j], 4);
        const __m512i xb = _mm512_set1_epi32(x4);
#pragma GCC unroll 4
        for (int b = 0; b < MB; ++b) a[r][j][b] = _mm512_dpbusd_epi32(a[r][j][b], xb, wv[b]);
      }
  }
#pragma GCC unroll 4
  for (int j = 0; j < PJ; ++j)
#pragma GCC unroll 4
    for (int b = 0; b < MB; ++b) {
      const __m512i m = _mm512_max_epi32(_mm512_max_epi32(a[0][2 * j][b], a[0][2 * j + 1][b]),
                                         _mm512_max_epi32(a[1][2 * j][b], a[1][2 * j + 1][b]));
      epilogue_block(pk, b * 16, block_mask(s.M, b * 16), q.out, q.y_zero, m, y + (px + j) * s.M * out_bytes);
    }
}

// Input row iy of channel c of image n into dst (row_len bytes) as the kernels read it: PL bytes of padding, the row,
// padding to row_len; the whole row padding when iy is outside the image. X's bytes as u8: s8 values offset by 128
// (xor 0x80), the zero point with them; padding is the zero point.
inline void copy_input_row(const StemShape& s, const DwQuant& q, const uint8_t* x, int64_t n, int64_t c, int64_t iy,
                           int64_t row_len, uint8_t* dst) {
  const uint8_t flip = q.x_signed ? 0x80 : 0;
  const uint8_t pad = static_cast<uint8_t>(x_zero_as_u8(q));
  if (iy < 0 || iy >= s.H) {
    std::memset(dst, pad, static_cast<size_t>(row_len));
    return;
  }
  const uint8_t* src = x + ((n * s.C + c) * s.H + iy) * s.W;
  std::memset(dst, pad, static_cast<size_t>(s.PL));
  if (flip) {
    for (int64_t i = 0; i < s.W; ++i) dst[s.PL + i] = src[i] ^ flip;
  } else {
    std::memcpy(dst + s.PL, src, static_cast<size_t>(s.W));
  }
  std::memset(dst + s.PL + s.W, pad, static_cast<size_t>(row_len - s.PL - s.W));
}

template <int MB>
KEEL_AVX512_VNNI void work(const StemShape& s, const DwQuant& q, int64_t groups, int64_t row_len, const Packed& pk,
                           const uint8_t* x, uint8_t* y, int64_t begin, int64_t end) {
  const int64_t M = s.M, Mp = MB * 16, out_bytes = q.out == DwQuant::Out::kF32 ? 4 : 1;  // Mp: acc's stride
  const int64_t PW = s.pool ? s.PW : s.OW, OHp = s.pool ? s.PH : s.OH;
  // Per-thread buffers, taken as plain pointers once (a thread_local in a shared library costs a call per access).
  // With pooling, the conv rows of the current window stay in a ring of PKH rows (row oy in slot oy % PKH), so that
  // rows shared by overlapping windows (ResNet's 3x3 / 2) are computed once per thread.
  const int64_t ring = s.pool ? s.PKH : 1, row_sums = s.OW * Mp;
  thread_local std::vector<uint8_t> rows_buf;
  thread_local std::vector<int32_t> acc_buf;
  rows_buf.resize(static_cast<size_t>(s.C * s.KH * row_len));
  acc_buf.resize(static_cast<size_t>(ring * row_sums));
  uint8_t* const rows = rows_buf.data();
  int32_t* const acc = acc_buf.data();
  // Conv row oy of image n into its ring slot.
  auto compute_row = [&](int64_t n, int64_t oy) {
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t ky = 0; ky < s.KH; ++ky)
        copy_input_row(s, q, x, n, c, oy * s.SH - s.PT + ky, row_len, rows + (c * s.KH + ky) * row_len);
    conv_row<MB>(s, groups, pk.off, pk.w, rows, acc + (oy % ring) * row_sums);
  };
  alignas(64) int32_t win[64];            // one pooled pixel's M sums
  int64_t cached_n = -1, cached_end = 0;  // conv rows [cached_end - ring, cached_end) of image cached_n are in the ring
  for (int64_t item = begin; item < end; ++item) {
    const int64_t n = item / OHp, r = item % OHp;
    uint8_t* yrow = y + (n * OHp + r) * PW * M * out_bytes;
    if (!s.pool) {
      compute_row(n, r);
      for (int64_t ox = 0; ox < s.OW; ++ox) epilogue(pk, M, q.out, q.y_zero, acc + ox * Mp, yrow + ox * M * out_bytes);
      continue;
    }
    // The window's conv rows (those the previous window computed are in the ring), then each pooled pixel's maximum.
    const int64_t oy0 = std::max<int64_t>(0, r * s.PSH - s.PPT), oy1 = std::min(s.OH, r * s.PSH - s.PPT + s.PKH);
    for (int64_t oy = oy0; oy < oy1; ++oy)
      if (n != cached_n || oy >= cached_end || oy < cached_end - ring) compute_row(n, oy);
    if (n != cached_n) cached_n = n, cached_end = 0;
    cached_end = std::max(cached_end, oy1);
    for (int64_t px = 0; px < s.PW; ++px) {
      const int64_t x0 = std::max<int64_t>(0, px * s.PSW - s.PPL), x1 = std::min(s.OW, px * s.PSW - s.PPL + s.PKW);
      for (int64_t b = 0; b < M; b += 16) {
        __m512i m = _mm512_set1_epi32(INT_MIN);
        for (int64_t oy = oy0; oy < oy1; ++oy) {
          const int32_t* row = acc + (oy % ring) * row_sums + b;
          for (int64_t ox = x0; ox < x1; ++ox) m = _mm512_max_epi32(m, _mm512_loadu_si512(row + ox * Mp));
        }
        _mm512_store_si512(win + b, m);
      }
      epilogue(pk, M, q.out, q.y_zero, win, yrow + px * M * out_bytes);
    }
  }
}

// work() for a 2x2 stride-2 pooling without padding (SimpleCNN's): per pooled row, the KH + SH input rows of its two
// conv rows copied once per channel ([c][KH + SH][row_len]), then pool2_step over its pixels, nothing stored between.
template <int MB>
KEEL_AVX512_VNNI void work_pool2(const StemShape& s, const DwQuant& q, int64_t groups, int64_t row_len,
                                 const int64_t* off, const Packed& pk, const uint8_t* x, uint8_t* y, int64_t begin,
                                 int64_t end) {
  constexpr int PJ = MB == 1 ? 4 : MB == 2 ? 2 : 1;  // 16 accumulators
  const int64_t out_bytes = q.out == DwQuant::Out::kF32 ? 4 : 1, in_rows = s.KH + s.SH;
  thread_local std::vector<uint8_t> rows_buf;
  rows_buf.resize(static_cast<size_t>(s.C * in_rows * row_len));
  uint8_t* const rows = rows_buf.data();
  for (int64_t item = begin; item < end; ++item) {
    const int64_t n = item / s.PH, r = item % s.PH;
    const int64_t iy0 = 2 * r * s.SH - s.PT;
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t t = 0; t < in_rows; ++t)
        copy_input_row(s, q, x, n, c, iy0 + t, row_len, rows + (c * in_rows + t) * row_len);
    const int64_t row1 = 2 * r + 1 < s.OH ? s.SH * row_len : 0;  // a second conv row past the output repeats the first
    uint8_t* yrow = y + (n * s.PH + r) * s.PW * s.M * out_bytes;
    int64_t px = 0;
    for (; px + PJ <= s.PW; px += PJ) pool2_step<MB, PJ>(s, q, groups, off, pk, rows, row1, px, yrow, out_bytes);
    for (; px < s.PW; ++px) pool2_step<MB, 1>(s, q, groups, off, pk, rows, row1, px, yrow, out_bytes);
  }
}

}  // namespace

bool Int8StemConv::available() {
  static const bool ok = int8_own_kernels() && [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  return ok;
}

std::string Int8StemConv::check(const StemShape& s) {
  if (s.C < 1 || s.C > 4) return "more than 4 input channels";
  if (s.KW < 1 || s.KW > 8 || s.KH < 1) return "kernel width past 8";
  if (s.M < 1 || s.M > 64) return "more than 64 output channels";
  if (s.SH < 1 || s.SW < 1 || s.PT < 0 || s.PL < 0) return "stride or padding";
  if (s.OH < 1 || s.OW < 1 || s.N < 1) return "output size";
  if (!s.pool) return "";
  if (s.PSH < 1 || s.PSW < 1 || s.PPT < 0 || s.PPL < 0 || s.PH < 1 || s.PW < 1) return "pooling geometry";
  // Every window holds a conv pixel: its first row / column inside the conv output.
  if ((s.PH - 1) * s.PSH - s.PPT >= s.OH || (s.PW - 1) * s.PSW - s.PPL >= s.OW || s.PKH - s.PPT < 1 ||
      s.PKW - s.PPL < 1)
    return "a pooling window past the convolution's output";
  return "";
}

Int8StemConv::Int8StemConv(const StemShape& s, const DwQuant& q, const int8_t* w, const float* scale, const float* bias)
    : s_(s), q_(q) {
  const int64_t Q = (s.KW + 3) / 4, MB = (s.M + 15) / 16, Mp = MB * 16;  // the per-channel vectors padded to Mp
  groups_ = s.C * s.KH * Q;
  // A row is read up to column (OW - 1) * SW + 4 Q - 1; it holds the padding before, the image, the padding after.
  row_len_ = std::max(s.PL + s.W, (s.OW - 1) * s.SW + 4 * Q);
  row_len_ = (row_len_ + 63) / 64 * 64;
  off_.resize(static_cast<size_t>(groups_));
  for (int64_t g = 0; g < groups_; ++g) off_[static_cast<size_t>(g)] = (g / Q) * row_len_ + 4 * (g % Q);
  pool2_ = s.pool && s.PKH == 2 && s.PKW == 2 && s.PSH == 2 && s.PSW == 2 && s.PPT == 0 && s.PPL == 0;
  if (pool2_) {  // operands in rows [c][KH + SH]: group g = (c * KH + ky) * Q + q
    for (int64_t g = 0; g < groups_; ++g) {
      const int64_t c = g / Q / s.KH, ky = g / Q % s.KH;
      off_[static_cast<size_t>(g)] = (c * (s.KH + s.SH) + ky) * row_len_ + 4 * (g % Q);
    }
  }
  w_.assign(static_cast<size_t>(groups_ * MB * 64), 0);
  comp_.assign(static_cast<size_t>(Mp), 0);
  scale_.assign(static_cast<size_t>(Mp), 0.f);
  bias_.assign(static_cast<size_t>(Mp), 0.f);
  lo_.assign(static_cast<size_t>(Mp), 0.f);
  hi_.assign(static_cast<size_t>(Mp), 0.f);
  const int32_t zp = x_zero_as_u8(q);
  for (int64_t m = 0; m < s.M; ++m) {
    int32_t sum = 0;
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t ky = 0; ky < s.KH; ++ky)
        for (int64_t kx = 0; kx < s.KW; ++kx) {
          const int8_t v = w[((m * s.C + c) * s.KH + ky) * s.KW + kx];
          const int64_t g = (c * s.KH + ky) * Q + kx / 4;
          w_[static_cast<size_t>((g * MB + m / 16) * 64 + (m % 16) * 4 + kx % 4)] = v;
          sum += v;
        }
    comp_[static_cast<size_t>(m)] = zp * sum;
    const ChannelEpilogue e = channel_epilogue(q, scale[m], bias ? bias[m] : 0.f);
    scale_[static_cast<size_t>(m)] = e.scale, bias_[static_cast<size_t>(m)] = e.bias;
    lo_[static_cast<size_t>(m)] = e.lo, hi_[static_cast<size_t>(m)] = e.hi;
  }
}

void Int8StemConv::run(const void* x, void* y, int threads) const {
  const Packed pk{w_.data(), off_.data(), comp_.data(), scale_.data(), bias_.data(), lo_.data(), hi_.data()};
  const auto* xp = static_cast<const uint8_t*>(x);
  auto* yp = static_cast<uint8_t*>(y);
  const int64_t items = s_.N * (s_.pool ? s_.PH : s_.OH);
  // A small one (batch 1) on the calling thread: a second thread's start costs more than its share.
  const int team = items * s_.OW * s_.M < (int64_t{1} << 16) ? 1 : threads;
  split_over_team(items, team, [&](int64_t, int64_t b, int64_t e) {
    if (pool2_) {
      switch ((s_.M + 15) / 16) {
        case 1: work_pool2<1>(s_, q_, groups_, row_len_, off_.data(), pk, xp, yp, b, e); break;
        case 2: work_pool2<2>(s_, q_, groups_, row_len_, off_.data(), pk, xp, yp, b, e); break;
        case 3: work_pool2<3>(s_, q_, groups_, row_len_, off_.data(), pk, xp, yp, b, e); break;
        default: work_pool2<4>(s_, q_, groups_, row_len_, off_.data(), pk, xp, yp, b, e); break;
      }
      return;
    }
    switch ((s_.M + 15) / 16) {
      case 1: work<1>(s_, q_, groups_, row_len_, pk, xp, yp, b, e); break;
      case 2: work<2>(s_, q_, groups_, row_len_, pk, xp, yp, b, e); break;
      case 3: work<3>(s_, q_, groups_, row_len_, pk, xp, yp, b, e); break;
      default: work<4>(s_, q_, groups_, row_len_, pk, xp, yp, b, e); break;
    }
  });
}

}  // namespace keel::onednn
