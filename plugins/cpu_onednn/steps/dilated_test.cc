// plugins/cpu_onednn/steps/dilated_test.cc — the layout steps of steps/dilated.h (space-to-batch / batch-to-space
// of nChw16c memory, the merged bottleneck source) against the index formula.
#include "steps/dilated.h"

#include <gtest/gtest.h>

#include <vector>

namespace keel::onednn {
namespace {

// Element (b, c, y, x) of an nChw16c [n, 16*blocks, h, w] batch.
int64_t at(const PhaseShape& p, int64_t h, int64_t w, int64_t b, int64_t c, int64_t y, int64_t x) {
  return (((b * p.blocks + c / 16) * h + y) * w + x) * 16 + c % 16;
}

void check(const PhaseShape& p, int team) {
  const int64_t n = p.n * p.blocks * 16 * p.h * p.w, ph = p.h / p.d, pw = p.w / p.d;
  std::vector<float> img(n), phases(n, -1.f), back(n, -1.f);
  for (int64_t k = 0; k < n; ++k) img[k] = static_cast<float>(k) * 0.5f + 1.f;
  space_to_phases16(img.data(), phases.data(), p, team);
  for (int64_t b = 0; b < p.n; ++b)
    for (int64_t c = 0; c < p.blocks * 16; ++c)
      for (int64_t y = 0; y < p.h; ++y)
        for (int64_t x = 0; x < p.w; ++x) {
          const int64_t image = (b * p.d + y % p.d) * p.d + x % p.d;
          ASSERT_EQ(phases[at(p, ph, pw, image, c, y / p.d, x / p.d)], img[at(p, p.h, p.w, b, c, y, x)])
              << "b " << b << " c " << c << " y " << y << " x " << x << " d " << p.d;
        }
  phases_to_space16(phases.data(), back.data(), p, team);
  EXPECT_EQ(back, img);
}

TEST(OnednnDilated, PhasesHoldEveryDthRowAndColumn) {
  check({1, 1, 4, 6, 2}, 1);
  check({2, 3, 12, 8, 4}, 1);
  check({1, 2, 9, 6, 3}, 2);
  check({3, 1, 5, 5, 1}, 2);    // d = 1: a copy
  check({1, 2, 16, 16, 4}, 4);  // more threads than needed is fine
}

// merged_source16: channel c < ch of output pixel (y, x) is h's (nhwc or nChw16c), channel ch + c is x's at
// (stride*y, stride*x); every output element is written.
void check_merged(const MergedSourceShape& s, int team) {
  std::vector<float> h(s.ch * s.h * s.w), x(s.cx * s.xh * s.xw), out((s.ch + s.cx) * s.h * s.w, -1.f);
  for (size_t k = 0; k < h.size(); ++k) h[k] = static_cast<float>(k) + 0.25f;
  for (size_t k = 0; k < x.size(); ++k) x[k] = -static_cast<float>(k) - 0.5f;
  merged_source16(h.data(), x.data(), out.data(), s, team);
  const PhaseShape o{1, (s.ch + s.cx) / 16, s.h, s.w, 1}, xs{1, s.cx / 16, s.xh, s.xw, 1};
  for (int64_t c = 0; c < s.ch + s.cx; ++c)
    for (int64_t y = 0; y < s.h; ++y)
      for (int64_t j = 0; j < s.w; ++j) {
        const float want = c < s.ch ? h[s.h_nhwc ? (y * s.w + j) * s.ch + c : at(o, s.h, s.w, 0, c, y, j)]
                                    : x[at(xs, s.xh, s.xw, 0, c - s.ch, s.stride * y, s.stride * j)];
        ASSERT_EQ(out[at(o, s.h, s.w, 0, c, y, j)], want)
            << "c " << c << " y " << y << " x " << j << " nhwc " << s.h_nhwc << " stride " << s.stride;
      }
}

TEST(OnednnDilated, MergedSourcePutsBothInputsSideBySide) {
  // {ch, cx, h, w, xh, xw, stride, h_nhwc}
  check_merged({48, 32, 8, 8, 15, 15, 2, true}, 1);  // odd input: the last row and column are the 15th
  check_merged({48, 32, 8, 8, 16, 16, 2, true}, 2);
  check_merged({16, 64, 7, 5, 14, 10, 2, false}, 2);  // h nChw16c, rows split unevenly
  check_merged({32, 16, 3, 4, 9, 12, 3, true}, 4);    // more threads than rows
  check_merged({16, 16, 5, 5, 5, 5, 1, false}, 1);
}

}  // namespace
}  // namespace keel::onednn
