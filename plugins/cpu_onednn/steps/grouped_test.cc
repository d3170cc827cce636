// plugins/cpu_onednn/steps/grouped_test.cc — the 3x3 convolution in groups of 4 channels (steps/grouped.h)
// against its straightforward reference, over the geometries its code paths split on (strides, tile tails, edge
// pixels, tiny images, batches, teams), on the AVX-512 and the scalar path.
#include "steps/grouped.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace keel::onednn {
namespace {

void check(int64_t n, int64_t blocks, int64_t h, int64_t w, int64_t stride, bool relu, int team) {
  Grouped4Shape s;
  s.n = n, s.blocks = blocks, s.h = h, s.w = w, s.stride = stride, s.relu = relu;
  ASSERT_EQ(grouped4_check(s), "");
  std::mt19937 rng(static_cast<uint32_t>(h * 131 + w * 7 + blocks + stride));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t C = blocks * 16;
  std::vector<float> x(static_cast<size_t>(n * C * h * w)), wt(static_cast<size_t>(C * 36)), b(static_cast<size_t>(C));
  for (float& v : x) v = u(rng);
  for (float& v : wt) v = 0.3f * u(rng);
  for (float& v : b) v = 0.2f * u(rng);
  const size_t out = static_cast<size_t>(n * C * s.oh() * s.ow());
  std::vector<float> want(out), got(out, NAN), packed(grouped4_packed_floats(s));
  grouped4_reference(s, x.data(), wt.data(), b.data(), want.data());
  grouped4_pack_weights(s, wt.data(), packed.data());
  grouped4_run(s, x.data(), packed.data(), b.data(), got.data(), team);
  for (size_t i = 0; i < out; ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5f * (1.f + std::fabs(want[i])))
        << "at " << i << " of n=" << n << " blocks=" << blocks << " " << h << "x" << w << " stride " << stride
        << " team " << team;
}

void sweep() {
  for (int64_t stride : {1, 2})
    for (int team : {1, 2, 3}) {
      check(1, 2, 19, 23, stride, true, team);  // two full tiles + a tail of the interior, odd sizes
      check(2, 1, 8, 10, stride, false, team);  // batch 2, no Relu: negative outputs stay
      check(1, 3, 1, 1, stride, true, team);    // one pixel: only the edge path, the centre tap
      check(1, 1, 2, 3, stride, false, team);   // no interior pixel
      check(1, 8, 12, 14, stride, true, team);  // ResNeXt's 128 channels, smaller
    }
}

TEST(OnednnGrouped4, MatchesTheReference) { sweep(); }

TEST(OnednnGrouped4, ScalarPathMatchesTheReference) {
  grouped4_force_scalar(true);
  sweep();
  grouped4_force_scalar(false);
}

TEST(OnednnGrouped4, PackedWeightsPutEachGroupsInputsInItsLanes) {
  // Output channel m = 16b + j reads input channel 4 * (m / 4) + i: entry (b, tap, i), lane j.
  Grouped4Shape s;
  s.blocks = 2, s.h = s.w = 3;
  std::vector<float> w(32 * 36), p(grouped4_packed_floats(s));
  for (size_t k = 0; k < w.size(); ++k) w[k] = static_cast<float>(k);
  grouped4_pack_weights(s, w.data(), p.data());
  EXPECT_EQ(p[((1 * 9 + 4) * 4 + 3) * 16 + 5], w[((16 + 5) * 4 + 3) * 9 + 4]);
}

TEST(OnednnGrouped4, RejectsWhatItDoesNotCompute) {
  Grouped4Shape s;
  s.h = s.w = 4, s.stride = 3;
  EXPECT_NE(grouped4_check(s), "");
  s.stride = 1, s.blocks = 0;
  EXPECT_NE(grouped4_check(s), "");
}

}  // namespace
}  // namespace keel::onednn
