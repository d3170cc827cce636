// plugins/cpu_onednn/steps/resize.cc — bilinear resizing (steps/resize.h).
#include "steps/resize.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "steps/silu.h"

namespace keel::onednn {

bool resize_coords_of(const std::string& mode, ResizeCoords* out) {
  if (mode == "half_pixel") *out = ResizeCoords::kHalfPixel;
  else if (mode == "pytorch_half_pixel") *out = ResizeCoords::kPytorchHalfPixel;
  else if (mode == "align_corners") *out = ResizeCoords::kAlignCorners;
  else if (mode == "asymmetric") *out = ResizeCoords::kAsymmetric;
  else return false;
  return true;
}

ResizeAxis resize_axis(int64_t in, int64_t out, double scale, ResizeCoords coords) {
  ResizeAxis a;
  a.i0.resize(out);
  a.i1.resize(out);
  a.w1.resize(out);
  for (int64_t x = 0; x < out; ++x) {
    double src = 0;
    switch (coords) {
      case ResizeCoords::kHalfPixel: src = (x + 0.5) / scale - 0.5; break;
      case ResizeCoords::kPytorchHalfPixel: src = out > 1 ? (x + 0.5) / scale - 0.5 : 0.0; break;
      case ResizeCoords::kAlignCorners:
        src = out > 1 ? static_cast<double>(x) * static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0;
        break;
      case ResizeCoords::kAsymmetric: src = x / scale; break;
    }
    src = std::clamp(src, 0.0, static_cast<double>(in - 1));
    const int64_t f = std::min<int64_t>(static_cast<int64_t>(std::floor(src)), in - 1);
    a.i0[x] = static_cast<int32_t>(f);
    a.i1[x] = static_cast<int32_t>(std::min<int64_t>(f + 1, in - 1));
    a.w1[x] = a.i1[x] == a.i0[x] ? 0.f : static_cast<float>(src - static_cast<double>(f));
  }
  return a;
}

namespace {

// d[j] = a[j] + w * (b[j] - a[j]) for j < n.
void lerp_scalar(const float* a, const float* b, float w, float* d, int64_t n) {
  for (int64_t j = 0; j < n; ++j) d[j] = a[j] + w * (b[j] - a[j]);
}

__attribute__((target("avx512f"))) void lerp_avx512(const float* a, const float* b, float w, float* d, int64_t n) {
  const __m512 vw = _mm512_set1_ps(w);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 va = _mm512_loadu_ps(a + j);
    _mm512_storeu_ps(d + j, _mm512_fmadd_ps(vw, _mm512_sub_ps(_mm512_loadu_ps(b + j), va), va));
  }
  if (j < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 va = _mm512_maskz_loadu_ps(m, a + j);
    _mm512_mask_storeu_ps(d + j, m, _mm512_fmadd_ps(vw, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, b + j), va), va));
  }
}

// Output rows [y_begin, y_end) of image p.
void resize_rows(const BilinearShape& s, const float* src, float* dst, int64_t p, int64_t y_begin, int64_t y_end,
                 bool avx512, std::vector<float>& buf) {
  auto lerp = avx512 ? lerp_avx512 : lerp_scalar;
  const int64_t first = s.y.i0[y_begin], last = s.y.i1[y_end - 1];  // the source rows this block reads
  const int64_t row = s.ow * s.vec;
  const size_t need = static_cast<size_t>((last - first + 1) * row);
  if (buf.size() < need) buf.resize(need);
  const float* img = src + p * s.h * s.w * s.vec;
  for (int64_t r = first; r <= last; ++r) {
    const float* in = img + r * s.w * s.vec;
    float* t = buf.data() + (r - first) * row;
    if (s.vec == 1) {
      for (int64_t x = 0; x < s.ow; ++x) {
        const float a = in[s.x.i0[x]];
        t[x] = a + s.x.w1[x] * (in[s.x.i1[x]] - a);
      }
    } else {
      for (int64_t x = 0; x < s.ow; ++x)
        lerp(in + s.x.i0[x] * s.vec, in + s.x.i1[x] * s.vec, s.x.w1[x], t + x * s.vec, s.vec);
    }
  }
  float* out = dst + p * s.oh * row;
  for (int64_t y = y_begin; y < y_end; ++y)
    lerp(buf.data() + (s.y.i0[y] - first) * row, buf.data() + (s.y.i1[y] - first) * row, s.y.w1[y], out + y * row, row);
}

}  // namespace

void bilinear_resize(const BilinearShape& s, const float* src, float* dst, int team, bool vector) {
  const bool avx512 = vector && has_avx512f();
  team = std::max(team, 1);
  // Blocks of output rows: whole images when there are enough of them for the team, else each image's rows in
  // about 4 * team / planes parts (at least 4 rows each).
  int64_t rows = s.oh;
  if (s.planes < 4 * team) {
    const int64_t parts = std::min<int64_t>((4 * team + s.planes - 1) / s.planes, std::max<int64_t>(1, s.oh / 4));
    rows = (s.oh + parts - 1) / parts;
  }
  const int64_t per = (s.oh + rows - 1) / rows, items = s.planes * per;
  auto run = [&](int64_t k) {
    thread_local std::vector<float> buf;
    const int64_t p = k / per, b = (k % per) * rows;
    resize_rows(s, src, dst, p, b, std::min(s.oh, b + rows), avx512, buf);
  };
  if (team <= 1 || items <= 1) {
    for (int64_t k = 0; k < items; ++k) run(k);
    return;
  }
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t k = 0; k < items; ++k) run(k);
}

}  // namespace keel::onednn
