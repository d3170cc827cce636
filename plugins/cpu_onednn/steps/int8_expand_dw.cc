// plugins/cpu_onednn/steps/int8_expand_dw.cc — the int8 expansion, depthwise 3x3 and projection in one pass over
// channels-last bytes (steps/int8_expand_dw.h). The AVX-512 code is compiled with target attributes (the rest of the
// plugin keeps the build's baseline ISA) and only called where check() found the CPU has it.
#include "steps/int8_expand_dw.h"

#include "common/lanes.h"
#include "common/team.h"
#include "steps/pack_groups.h"

// GCC 12 reports its own AVX-512 intrinsics (their _mm512_undefined_* self-initialisation) as "may be used
// uninitialized" (and _mm512_cvtepi32_epi8's as "used uninitialized") once inlined here: a known false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <utility>

#define KEEL_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi")))

namespace keel::onednn {
namespace {

constexpr int kTile = 14;  // pixels per register tile of a 1x1 stage (14 x 2 accumulators)
constexpr int kDwPix = 8;  // output pixels per step of the depthwise stage

// Output rows whose depthwise outputs the projection takes at once: as many as fill a 14-pixel tile (2 at 7x7, whose
// rows alone would make 7-pixel tiles, each loading the projection's weights for half the pixels); the rows are
// consecutive in the channels-last output, so they are one run of pixels.
int64_t rows_per_projection(int64_t ow) { return std::max<int64_t>(1, kTile / ow); }

int64_t up16(int64_t v) { return (v + 15) / 16 * 16; }
int64_t out_bytes(DwQuant::Out o) { return o == DwQuant::Out::kF32 ? 4 : 1; }

// A 1x1's weights w [outs][ins] in the tile kernel's layout (steps/pack_groups.h, K = 4: one 64-byte load is 4 input
// channels of 16 outputs), outs rounded up to 16 and ins to ins_padded (a multiple of 4) with zeros.
std::vector<int8_t> pack_1x1(const int8_t* w, int64_t outs, int64_t ins, int64_t ins_padded) {
  std::vector<int8_t> to(static_cast<size_t>(up16(outs) * ins_padded), 0);
  pack_groups<4>(w, outs, ins, ins_padded, to.data(), [](int8_t v) { return v; });
  return to;
}

// acc += the dot products of a's u8 and b's s8 quadruples (vpdpbusd). Written in asm: GCC 12 compiles the intrinsic
// with a register copy in and out of each accumulator and spills a 28-accumulator tile to the stack every step
// (half the speed of this form, measured on MobileNetV2's blocks).
KEEL_VNNI inline void dpbusd(__m512i& acc, __m512i a, __m512i b) {
  asm("vpdpbusd %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "v"(b));
}

struct EpiRef {
  const int32_t* comp;
  const float *scale, *bias, *lo, *hi;
  float z_mul;
  int32_t zero;
  bool f32;
};

// One stage's epilogue constants for 16 outputs, in registers.
struct EpiV {
  __m512i comp, zero;
  __m512 scale, bias, lo, hi, z_mul;
};

KEEL_VNNI inline EpiV load_epi(const EpiRef& e, int64_t o) {
  return {_mm512_loadu_si512(e.comp + o), _mm512_set1_epi32(e.zero), _mm512_loadu_ps(e.scale + o),
          _mm512_loadu_ps(e.bias + o),    _mm512_loadu_ps(e.lo + o), _mm512_loadu_ps(e.hi + o),
          _mm512_set1_ps(e.z_mul)};
}

// 16 outputs (lanes m) from their s32 sums: clamp((acc - comp) * scale + bias (+ z * z_mul), lo, hi), stored as f32
// (F32) or, rounded half to even (the default MXCSR mode, as std::nearbyint) plus the zero point, as bytes.
template <bool F32>
KEEL_VNNI __attribute__((always_inline)) inline void finish(const EpiV& v, __m512i acc, const float* z, __mmask16 m,
                                                            uint8_t* dst) {
  __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc, v.comp)), v.scale, v.bias);
  if (z != nullptr) f = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, z), v.z_mul, f);
  f = _mm512_min_ps(_mm512_max_ps(f, v.lo), v.hi);
  if constexpr (F32) {
    if (m == 0xFFFF) _mm512_storeu_ps(dst, f);
    else _mm512_mask_storeu_ps(dst, m, f);
  } else {
    // f is already within the output type's range less the zero point (channel_epilogue): narrow in a register.
    const __m128i b = _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(f), v.zero));
    if (m == 0xFFFF) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), b);
    else _mm_mask_storeu_epi8(dst, m, b);
  }
}

// The epilogue of a 1x1 stage's register tile (tile_1x1).
template <int T, int NV, bool F32>
KEEL_VNNI __attribute__((always_inline)) inline void tile_epilogue(const __m512i (&acc)[T][NV], const EpiRef& e,
                                                                   int64_t o0, int64_t valid, const float* z,
                                                                   int64_t z_pix, uint8_t* out, int64_t out_pix,
                                                                   int64_t out_vec) {
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v) {
    const EpiV ev = load_epi(e, o0 + 16 * v);
    const __mmask16 m = first_lanes(valid - 16 * v);
#pragma GCC unroll 14
    for (int t = 0; t < T; ++t)
      finish<F32>(ev, acc[t][v], z ? z + t * z_pix + 16 * v : nullptr, m, out + t * out_pix + v * out_vec);
  }
}

// T pixels x NV * 16 outputs (first output o0, `valid` of them real) of a 1x1 stage: pixel t's input bytes at
// x + t * x_pix (k4n groups of 4 channels), U the group's weights [k4n][NV * 16][4]; output vector v of pixel t at
// out + t * out_pix + v * out_vec bytes, Z (when not null) at z + t * z_pix + 16 v floats.
template <int T, int NV>
KEEL_VNNI void tile_1x1(const uint8_t* x, int64_t x_pix, int64_t k4n, const int8_t* U, const EpiRef& e, int64_t o0,
                        int64_t valid, const float* z, int64_t z_pix, uint8_t* out, int64_t out_pix, int64_t out_vec) {
  __m512i acc[T][NV];
#pragma GCC unroll 14
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) acc[t][v] = _mm512_setzero_si512();
  for (int64_t k = 0; k < k4n; ++k) {
    __m512i b[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_si512(U + (k * NV + v) * 64);
#pragma GCC unroll 14
    for (int t = 0; t < T; ++t) {
      int32_t four;
      std::memcpy(&four, x + t * x_pix + 4 * k, 4);
      const __m512i xb = _mm512_set1_epi32(four);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) dpbusd(acc[t][v], xb, b[v]);
    }
  }
  if (e.f32) tile_epilogue<T, NV, true>(acc, e, o0, valid, z, z_pix, out, out_pix, out_vec);
  else tile_epilogue<T, NV, false>(acc, e, o0, valid, z, z_pix, out, out_pix, out_vec);
}

using TileFn = void (*)(const uint8_t*, int64_t, int64_t, const int8_t*, const EpiRef&, int64_t, int64_t, const float*,
                        int64_t, uint8_t*, int64_t, int64_t);
template <int NV, int... T>
constexpr TileFn tile_of(int t, std::integer_sequence<int, T...>) {
  constexpr TileFn fns[] = {tile_1x1<T + 1, NV>...};
  return fns[t - 1];
}
TileFn tile_fn(int tiles, int nv) {
  using Seq = std::make_integer_sequence<int, kTile>;
  return nv == 2 ? tile_of<2>(tiles, Seq{}) : tile_of<1>(tiles, Seq{});
}

// J depthwise outputs of one 16-channel block from output column ox: rows[kh] point at the block's column 0 of the
// three ring rows (16 bytes a column); per kernel row, the 64 bytes of the pixel's columns ox*S .. ox*S+3 permuted
// into [x0, x1, x2, x3] per channel and one vpdpbusd with that row's [w0, w1, w2, 0].
template <int J, int S>
KEEL_VNNI __attribute__((always_inline)) inline void dw_step(const uint8_t* const* rows, int64_t ox, const __m512i* w,
                                                             __m512i perm, __m512i* acc) {
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j) acc[j] = _mm512_setzero_si512();
#pragma GCC unroll 3
  for (int kh = 0; kh < 3; ++kh) {
    const uint8_t* r = rows[kh] + ox * S * 16;
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) {
      const __m512i x = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(r + j * S * 16));
      dpbusd(acc[j], x, w[kh]);
    }
  }
}

template <int J, int S, bool F32>
KEEL_VNNI __attribute__((always_inline)) inline void dw_tail(int rem, const uint8_t* const* rows, int64_t ox,
                                                             const __m512i* w, __m512i perm, const EpiV& ev,
                                                             __mmask16 m, uint8_t* out, int64_t out_pix) {
  if constexpr (J > 0) {
    if (rem != J) return dw_tail<J - 1, S, F32>(rem, rows, ox, w, perm, ev, m, out, out_pix);
    __m512i acc[J];
    dw_step<J, S>(rows, ox, w, perm, acc);
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) finish<F32>(ev, acc[j], nullptr, m, out + (ox + j) * out_pix);
  }
}

// Byte 4i + t of the permuted vector: channel i of column t (t = 3: any byte, its weight is 0).
struct PermIndex {
  alignas(64) uint8_t b[64];
  constexpr PermIndex() : b() {
    for (int i = 0; i < 16; ++i)
      for (int t = 0; t < 4; ++t) b[4 * i + t] = static_cast<uint8_t>(16 * t + i);
  }
};
constexpr PermIndex kPerm;

// One output row of one 16-channel block (first channel o0, lanes m real): wb its packed weights [3][64]; pixel ox
// to out + ox * out_pix bytes.
template <int S, bool F32>
KEEL_VNNI void dw_row(const uint8_t* const* rows, const int8_t* wb, const EpiRef& e, int64_t o0, __mmask16 m,
                      int64_t ow, uint8_t* out, int64_t out_pix) {
  const __m512i perm = _mm512_load_si512(kPerm.b);
  __m512i w[3];
  for (int t = 0; t < 3; ++t) w[t] = _mm512_loadu_si512(wb + t * 64);
  const EpiV ev = load_epi(e, o0);
  int64_t ox = 0;
  for (; ox + kDwPix <= ow; ox += kDwPix) {
    __m512i acc[kDwPix];
    dw_step<kDwPix, S>(rows, ox, w, perm, acc);
#pragma GCC unroll 8
    for (int j = 0; j < kDwPix; ++j) finish<F32>(ev, acc[j], nullptr, m, out + (ox + j) * out_pix);
  }
  if (ox < ow) dw_tail<kDwPix - 1, S, F32>(static_cast<int>(ow - ox), rows, ox, w, perm, ev, m, out, out_pix);
}
using DwRowFn = void (*)(const uint8_t* const*, const int8_t*, const EpiRef&, int64_t, __mmask16, int64_t, uint8_t*,
                         int64_t);
DwRowFn dw_row_fn(int64_t stride, bool f32) {
  if (f32) return stride == 1 ? dw_row<1, true> : dw_row<2, true>;
  return stride == 1 ? dw_row<1, false> : dw_row<2, false>;
}

// The kernels' view of a stage's epilogue (Int8ExpandDw::Epi: its vectors and constants).
template <class Epi>
EpiRef ref_of(const Epi& e) {
  return {e.comp.data(), e.scale.data(), e.bias.data(), e.lo.data(),
          e.hi.data(),   e.z_mul,        e.zero,        e.out == DwQuant::Out::kF32};
}

}  // namespace

std::string Int8ExpandDw::check(const Int8ExpandDwShape& s, const DwQuant& expand, const DwQuant& dw,
                                const DwQuant* project) {
  // (available(): AVX-512 F, BW, VL, DQ, VNNI and VBMI, and the own int8 kernels not turned off.)
  if (!Int8Depthwise3x3::available()) return "no AVX-512 VNNI/VBMI (or KEEL_ONEDNN_INT8_OWN=0)";
  if (s.n < 1 || s.h < 1 || s.w < 1 || s.c < 1 || s.m < 1) return "empty source or no expanded channels";
  if (s.c % 4 != 0) return "input channels not a multiple of 4";
  if (s.stride != 1 && s.stride != 2) return "depthwise stride not 1 or 2";
  if ((project != nullptr) != (s.proj > 0)) return "projection constants without a projection or the reverse";
  if (s.residual && (s.proj != s.c || s.stride != 1)) return "a residual of another shape";
  if (expand.x_signed || expand.out != DwQuant::Out::kU8) return "the expansion is not u8 -> u8";
  if (dw.x_signed || dw.x_zero != expand.y_zero) return "the depthwise does not read the expansion's bytes";
  if (project != nullptr) {
    if (dw.out != DwQuant::Out::kU8) return "the depthwise output is not u8";
    if (project->x_signed || project->x_zero != dw.y_zero) return "the projection does not read the depthwise bytes";
  }
  return "";
}

Int8ExpandDw::Int8ExpandDw(const Int8ExpandDwShape& s, const Int8Stage& expand, const Int8Stage& dw,
                           const Int8Stage* project, const QuantizeSpec* x_f32)
    : s_(s) {
  if (x_f32 != nullptr) x_f32_ = true, xq_ = *x_f32;
  mp_ = up16(s.m), pp_ = up16(s.proj), cols_ = s.w + 3;
  x2_zero_ = static_cast<uint8_t>(expand.q.y_zero);
  auto epilogue = [](const Int8Stage& st, int64_t outs, int64_t ins, int64_t padded, const int8_t* w, Epi* e) {
    e->comp.assign(static_cast<size_t>(padded), 0);
    e->scale.assign(static_cast<size_t>(padded), 0.f);
    e->bias.assign(static_cast<size_t>(padded), 0.f);
    e->lo.assign(static_cast<size_t>(padded), 0.f);
    e->hi.assign(static_cast<size_t>(padded), 0.f);
    for (int64_t o = 0; o < outs; ++o) {
      int32_t sum = 0;
      for (int64_t k = 0; k < ins; ++k) sum += w[o * ins + k];
      e->comp[static_cast<size_t>(o)] = st.q.x_zero * sum;
      const ChannelEpilogue ce = channel_epilogue(st.q, st.scale[o], st.bias ? st.bias[o] : 0.f);
      e->scale[static_cast<size_t>(o)] = ce.scale, e->bias[static_cast<size_t>(o)] = ce.bias;
      e->lo[static_cast<size_t>(o)] = ce.lo, e->hi[static_cast<size_t>(o)] = ce.hi;
    }
    e->out = st.q.out;
    e->zero = st.q.out == DwQuant::Out::kF32 ? 0 : st.q.y_zero;
    e->z_mul = st.q.out == DwQuant::Out::kF32 ? 1.f : st.q.y_inv_scale;
  };
  w1_ = pack_1x1(expand.w, s.m, s.c, s.c);  // c is a multiple of 4 (check())
  epilogue(expand, s.m, s.c, mp_, expand.w, &e1_);
  w2_.assign(static_cast<size_t>(mp_ / 16 * 3 * 64), 0);
  for (int64_t c = 0; c < s.m; ++c)
    for (int kh = 0; kh < 3; ++kh)
      for (int kw = 0; kw < 3; ++kw)
        w2_[static_cast<size_t>(((c / 16) * 3 + kh) * 64 + (c % 16) * 4 + kw)] = dw.w[c * 9 + kh * 3 + kw];
  epilogue(dw, s.m, 9, mp_, dw.w, &e2_);
  if (project != nullptr) {
    // The projection reads the depthwise row's mp bytes a pixel: its weights over m rounded up to 16 (zeros past m).
    w3_ = pack_1x1(project->w, s.proj, s.m, mp_);
    epilogue(*project, s.proj, s.m, pp_, project->w, &e3_);
  }
}

size_t Int8ExpandDw::scratch_bytes() const {
  const int64_t slot = mp_ * cols_;                                // one ring row: [m16/16][w+3][16]
  const int64_t xrow = x_f32_ ? (s_.w * s_.c + 63) / 64 * 64 : 0;  // a quantized input row
  const int64_t dw_rows = s_.proj > 0 ? (rows_per_projection(s_.ow()) * s_.ow() * mp_ + 63) / 64 * 64 : 0;
  return static_cast<size_t>(4 * slot + dw_rows + xrow + 64);
}

// Expanded row iy of image img into a ring slot (columns 1..w of each block; the padding columns are the caller's).
void Int8ExpandDw::expand_row(const void* x, int64_t img, int64_t iy, uint8_t* slot, uint8_t* xrow) const {
  const EpiRef e = ref_of(e1_);
  const int64_t k4 = s_.c / 4;
  const int64_t at = (img * s_.h + iy) * s_.w * s_.c;
  const uint8_t* in = static_cast<const uint8_t*>(x) + at;
  if (x_f32_) {
    quantize_f32(static_cast<const float*>(x) + at, xrow, s_.w * s_.c, xq_, 1);
    in = xrow;
  }
  for (int64_t g = 0; g < groups_of(mp_); ++g) {
    const int nv = static_cast<int>(group_width(mp_, g) / 16);
    const int8_t* U = w1_.data() + g * 32 * k4 * 4;
    uint8_t* out = slot + (2 * g * cols_ + 1) * 16;
    for (int64_t x0 = 0; x0 < s_.w; x0 += kTile) {
      const int t = static_cast<int>(std::min<int64_t>(kTile, s_.w - x0));
      tile_fn(t, nv)(in + x0 * s_.c, s_.c, k4, U, e, 32 * g, mp_ - 32 * g, nullptr, 0, out + x0 * 16, 16, cols_ * 16);
    }
  }
}

// Output rows [r0, r1) of the n * oh (image-major) on the calling thread.
void Int8ExpandDw::rows(const void* x, const float* z, uint8_t* dst, uint8_t* scratch, int64_t r0, int64_t r1) const {
  const int64_t mb = mp_ / 16, slot_bytes = mp_ * cols_, oh = s_.oh(), ow = s_.ow();
  uint8_t* ring = scratch;
  uint8_t* pad = ring + 3 * slot_bytes;  // a row outside the image: the zero point everywhere
  const int64_t batch = rows_per_projection(ow);
  uint8_t* dwrows = pad + slot_bytes;  // [batch * ow][m16]: the depthwise rows the projection reads
  uint8_t* xrow = dwrows + (s_.proj > 0 ? (batch * ow * mp_ + 63) / 64 * 64 : 0);  // [w][c]: a quantized input row
  std::memset(pad, x2_zero_, static_cast<size_t>(slot_bytes));
  for (int64_t slot = 0; slot < 3; ++slot)
    for (int64_t b = 0; b < mb; ++b) {
      uint8_t* r = ring + slot * slot_bytes + b * cols_ * 16;
      std::memset(r, x2_zero_, 16);
      std::memset(r + (s_.w + 1) * 16, x2_zero_, 32);
    }
  const EpiRef e2 = ref_of(e2_), e3 = ref_of(e3_);
  const int64_t ob2 = out_bytes(e2_.out), ob3 = out_bytes(e3_.out);
  const DwRowFn dw = dw_row_fn(s_.stride, e2.f32);
  int64_t have_img[3] = {-1, -1, -1}, have_row[3] = {-1, -1, -1};
  for (int64_t flat = r0; flat < r1; ++flat) {
    const int64_t img = flat / oh, oy = flat % oh;
    const uint8_t* rp[3];
    for (int64_t dy = 0; dy < 3; ++dy) {
      const int64_t iy = oy * s_.stride - 1 + dy;
      if (iy < 0 || iy >= s_.h) {
        rp[dy] = pad;
        continue;
      }
      const int64_t slot = iy % 3;
      uint8_t* sl = ring + slot * slot_bytes;
      if (have_img[slot] != img || have_row[slot] != iy) {
        expand_row(x, img, iy, sl, xrow);
        have_img[slot] = img, have_row[slot] = iy;
      }
      rp[dy] = sl;
    }
    const int64_t pix0 = (img * oh + oy) * ow;     // the row's first output pixel
    const int64_t in_batch = (flat - r0) % batch;  // this row's place among the rows projected together
    uint8_t* dwrow = dwrows + in_batch * ow * mp_;
    for (int64_t b = 0; b < mb; ++b) {
      const uint8_t* br[3] = {rp[0] + b * cols_ * 16, rp[1] + b * cols_ * 16, rp[2] + b * cols_ * 16};
      const int8_t* wb = w2_.data() + b * 3 * 64;
      uint8_t* out = s_.proj > 0 ? dwrow + b * 16 : dst + (pix0 * s_.m + b * 16) * ob2;
      const int64_t out_pix = s_.proj > 0 ? mp_ : s_.m * ob2;
      const __mmask16 m = s_.proj > 0 ? static_cast<__mmask16>(0xFFFF) : first_lanes(s_.m - b * 16);
      dw(br, wb, e2, b * 16, m, ow, out, out_pix);
    }
    if (s_.proj == 0 || (in_batch + 1 < batch && flat + 1 < r1)) continue;
    // Project the batch's rows: pixels p0 .. p0 + n - 1 of the output.
    const int64_t p0 = pix0 - in_batch * ow, n = (in_batch + 1) * ow, k4 = mp_ / 4;
    for (int64_t g = 0; g < groups_of(pp_); ++g) {
      const int nv = static_cast<int>(group_width(pp_, g) / 16);
      const int8_t* U = w3_.data() + g * 32 * k4 * 4;
      for (int64_t x0 = 0; x0 < n; x0 += kTile) {
        const int t = static_cast<int>(std::min<int64_t>(kTile, n - x0));
        const float* zp = s_.residual ? z + (p0 + x0) * s_.proj + 32 * g : nullptr;
        tile_fn(t, nv)(dwrows + x0 * mp_, mp_, k4, U, e3, 32 * g, s_.proj - 32 * g, zp, s_.proj,
                       dst + ((p0 + x0) * s_.proj + 32 * g) * ob3, s_.proj * ob3, 16 * ob3);
      }
    }
  }
}

void Int8ExpandDw::run(const void* x, const float* z, void* dst, uint8_t* scratch, int team, size_t stride) const {
  const size_t per = stride ? stride : scratch_bytes();
  split_over_team(s_.n * s_.oh(), team, [&](int64_t t, int64_t r0, int64_t r1) {
    if (r1 <= r0) return;
    uint8_t* own = scratch + static_cast<size_t>(t) * per;
    own += (64 - reinterpret_cast<uintptr_t>(own) % 64) % 64;
    rows(x, z, static_cast<uint8_t*>(dst), own, r0, r1);
  });
}

}  // namespace keel::onednn
