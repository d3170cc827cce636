// plugins/cpu_onednn/onednn_dilated_test.cc — space-to-batch / batch-to-space of nChw16c memory (onednn_dilated.h)
// against the index formula.
#include "onednn_dilated.h"

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
  check({3, 1, 5, 5, 1}, 2);   // d = 1: a copy
  check({1, 2, 16, 16, 4}, 4);  // more threads than needed is fine
}

}  // namespace
}  // namespace keel::onednn
