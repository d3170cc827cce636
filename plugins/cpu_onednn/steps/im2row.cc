// plugins/cpu_onednn/steps/im2row.cc — a convolution's windows as a product's rows (steps/im2row.h).
#include "steps/im2row.h"

#include <algorithm>
#include <cstring>

#include "common/team.h"

namespace keel::onednn {
namespace {

std::string part_check(const Im2RowPart& p) {
  if (p.c < 1 || p.h < 1 || p.w < 1 || p.kh < 1 || p.kw < 1 || p.stride < 1 || p.dilation < 1)
    return "empty or negative geometry";
  if (p.blocked16 && p.c % 16 != 0) return "nChw16c with channels not a multiple of 16";
  if (p.pad_top < 0 || p.pad_left < 0) return "negative padding";
  return "";
}

// Part p's values of output pixel (oy, ox) into row (kh * kw * c floats).
void part_row(const Im2RowPart& p, const float* src, int64_t oy, int64_t ox, float* row) {
  const size_t tap_bytes = static_cast<size_t>(p.c) * sizeof(float);
  for (int64_t ty = 0; ty < p.kh; ++ty) {
    const int64_t iy = oy * p.stride - p.pad_top + ty * p.dilation;
    for (int64_t tx = 0; tx < p.kw; ++tx, row += p.c) {
      const int64_t ix = ox * p.stride - p.pad_left + tx * p.dilation;
      if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) {
        std::memset(row, 0, tap_bytes);
        continue;
      }
      if (!p.blocked16) {
        std::memcpy(row, src + (iy * p.w + ix) * p.c, tap_bytes);
        continue;
      }
      const int64_t plane = p.h * p.w * 16;
      const float* at = src + (iy * p.w + ix) * 16;
      for (int64_t b = 0; b < p.c / 16; ++b) std::memcpy(row + 16 * b, at + b * plane, 16 * sizeof(float));
    }
  }
}

}  // namespace

std::string im2row_check(const Im2RowShape& s) {
  if (s.oh < 1 || s.ow < 1) return "no output pixels";
  if (s.parts < 1 || s.parts > 2) return "one or two parts";
  for (int p = 0; p < s.parts; ++p)
    if (std::string why = part_check(s.part[p]); !why.empty()) return "part " + std::to_string(p) + ": " + why;
  return "";
}

void im2row_run(const Im2RowShape& s, const float* const* src, float* x, int team) {
  const int64_t k = s.row_floats();
  split_over_team(s.oh * s.ow, team, [&](int64_t, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = x + r * k;
      for (int p = 0; p < s.parts; ++p) {
        part_row(s.part[p], src[p], r / s.ow, r % s.ow, row);
        row += s.part[p].floats();
      }
    }
  });
}

}  // namespace keel::onednn
