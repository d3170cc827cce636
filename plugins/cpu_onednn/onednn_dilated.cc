// plugins/cpu_onednn/onednn_dilated.cc — space-to-batch and batch-to-space of nChw16c memory (onednn_dilated.h).
#include "onednn_dilated.h"

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
    if (kToPhases)
      gather_row(src + image_off, dst + phase_off, pw, d);
    else
      scatter_row(src + phase_off, dst + image_off, pw, d);
  }
}

}  // namespace

void space_to_phases16(const float* src, float* dst, const PhaseShape& s, int team) { run<true>(src, dst, s, team); }
void phases_to_space16(const float* src, float* dst, const PhaseShape& s, int team) { run<false>(src, dst, s, team); }

}  // namespace keel::onednn
