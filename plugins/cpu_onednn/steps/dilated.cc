// plugins/cpu_onednn/steps/dilated.cc — layout steps of the plugin's own around convolutions (steps/dilated.h).
#include "steps/dilated.h"

#include <immintrin.h>
#include <omp.h>

#include <cstring>

namespace keel::onednn {
namespace {

// One row of one phase: `count` pixels of 16 floats, every `step`-th one of the image row (to_phase) or the
// other way (from_phase). Each pixel is one 64-byte copy.
inline void gather_row(const float* src, float* dst, int64_t count, int64_t step) {
  for (int64_t j = 0; j < count; ++j) std::memcpy(dst + 16 * j, src + 16 * j * step, 16 * sizeof(float));
}
inline void scatter_row(const float* src, float* dst, int64_t count, int64_t step) {
  for (int64_t j = 0; j < count; ++j) std::memcpy(dst + 16 * j * step, src + 16 * j, 16 * sizeof(float));
}

// For every (image b, channel block c, phase row r, phase column s, phase row i): the image row d*i + r, from
// column s every d-th pixel, against phase image (b*d + r)*d + s, row i.
template <bool kToPhases>
void run(const float* src, float* dst, const PhaseShape& p, int team) {
  const int64_t d = p.d, ph = p.h / d, pw = p.w / d;
  const int64_t rows = p.n * p.blocks * d * d * ph;  // phase rows in all
#pragma omp parallel for num_threads(team > 1 ? team : 1) schedule(static) if (team > 1)
  for (int64_t k = 0; k < rows; ++k) {
    int64_t t = k;
    const int64_t i = t % ph;
    t /= ph;
    const int64_t s = t % d;
    t /= d;
    const int64_t r = t % d;
    t /= d;
    const int64_t c = t % p.blocks, b = t / p.blocks;
    const int64_t image_off = ((b * p.blocks + c) * p.h + d * i + r) * p.w * 16 + s * 16;
    const int64_t phase_off = ((((b * d + r) * d + s) * p.blocks + c) * ph + i) * pw * 16;
    if (kToPhases) gather_row(src + image_off, dst + phase_off, pw, d);
    else scatter_row(src + phase_off, dst + image_off, pw, d);
  }
}

}  // namespace

void space_to_phases16(const float* src, float* dst, const PhaseShape& s, int team) { run<true>(src, dst, s, team); }
void phases_to_space16(const float* src, float* dst, const PhaseShape& s, int team) { run<false>(src, dst, s, team); }

namespace {

// 16 floats (one pixel of one channel block), with AVX-512 or without.
__attribute__((target("avx512f"), always_inline)) inline void copy16_avx512(const float* from, float* to) {
  _mm512_storeu_ps(to, _mm512_loadu_ps(from));
}
inline void copy16_plain(const float* from, float* to) { std::memcpy(to, from, 16 * sizeof(float)); }

// Output row r of the merged source (see merged_source16): h's blocks, then x's, each a run of w pixels.
#define KEEL_MERGED_ROW(copy16)                                                                        \
  const int64_t hb = s.ch / 16, xb = s.cx / 16, plane = s.h * s.w * 16;                                \
  const int64_t hstep = s.h_nhwc ? s.ch : 16;                                                          \
  for (int64_t cb = 0; cb < hb; ++cb) {                                                                \
    const float* from = s.h_nhwc ? hsrc + r * s.w * s.ch + cb * 16 : hsrc + cb * plane + r * s.w * 16; \
    float* to = dst + cb * plane + r * s.w * 16;                                                       \
    for (int64_t j = 0; j < s.w; ++j) copy16(from + j * hstep, to + 16 * j);                           \
  }                                                                                                    \
  for (int64_t cb = 0; cb < xb; ++cb) {                                                                \
    const float* from = x + (cb * s.xh + r * s.stride) * s.xw * 16;                                    \
    float* to = dst + (hb + cb) * plane + r * s.w * 16;                                                \
    for (int64_t j = 0; j < s.w; ++j) copy16(from + 16 * j * s.stride, to + 16 * j);                   \
  }
__attribute__((target("avx512f"))) void merged_row_avx512(const float* hsrc, const float* x, float* dst,
                                                          const MergedSourceShape& s, int64_t r) {
  KEEL_MERGED_ROW(copy16_avx512)
}
void merged_row_plain(const float* hsrc, const float* x, float* dst, const MergedSourceShape& s, int64_t r) {
  KEEL_MERGED_ROW(copy16_plain)
}
#undef KEEL_MERGED_ROW

bool avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

}  // namespace

// Output rows split over the team in contiguous ranges.
void merged_source16(const float* hsrc, const float* x, float* dst, const MergedSourceShape& s, int team) {
  const bool fast = avx512();
#pragma omp parallel for num_threads(team > 1 ? team : 1) schedule(static) if (team > 1)
  for (int64_t r = 0; r < s.h; ++r) {
    if (fast) merged_row_avx512(hsrc, x, dst, s, r);
    else merged_row_plain(hsrc, x, dst, s, r);
  }
}

}  // namespace keel::onednn
