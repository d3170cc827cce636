// plugins/cpu_onednn/steps/se_test.cc — squeeze-excite's excitation step (steps/se.h) against its reference over
// EfficientNet-B0's shapes and odd ones, SiLU and Relu.
#include "steps/se.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

namespace keel::onednn {
namespace {

// Returns how many outputs were exactly 0 and exactly 1 (a HardSigmoid gate's clamped ends).
std::pair<int, int> check(int64_t c, int64_t cs, int64_t c2, bool silu, bool biases, bool vector = true,
                          bool hard_gate = false) {
  SeShape s;
  s.c = c, s.cs = cs, s.c2 = c2, s.silu = silu, s.hard_gate = hard_gate, s.gate_alpha = 1.f / 6.f;
  std::mt19937 rng(static_cast<unsigned>(c * 7 + cs * 3 + c2 + silu));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> w1(static_cast<size_t>(cs * c)), b1(static_cast<size_t>(cs)), w2(static_cast<size_t>(c2 * cs)),
      b2(static_cast<size_t>(c2)), p(static_cast<size_t>(c));
  for (auto* v : {&w1, &b1, &w2, &b2})
    for (float& x : *v) x = u(rng) * 0.5f;
  for (float& x : p) x = u(rng) * 3.f;
  std::vector<float> packed(se_packed_floats(s));
  se_pack(s, w1.data(), biases ? b1.data() : nullptr, w2.data(), biases ? b2.data() : nullptr, packed.data());
  std::vector<float> want(static_cast<size_t>(c2)), got(static_cast<size_t>(c2) + 16, NAN);
  se_excite_reference(s, w1.data(), biases ? b1.data() : nullptr, w2.data(), biases ? b2.data() : nullptr, p.data(),
                      want.data());
  se_excite(s, packed.data(), p.data(), got.data(), vector);
  // f32 sums of up to 1152 products against double ones: 2e-5 on outputs in (0, 1).
  std::pair<int, int> ends{0, 0};
  for (int64_t m = 0; m < c2; ++m) {
    EXPECT_NEAR(got[m], want[m], 2e-5) << "output " << m << " of " << c2;
    ends.first += got[m] == 0.f, ends.second += got[m] == 1.f;
  }
  for (int64_t m = c2; m < c2 + 16; ++m) EXPECT_TRUE(std::isnan(got[m])) << "wrote past the end at " << m;
  return ends;
}

TEST(OnednnSe, MatchesTheReferenceOnEfficientNetShapes) {
  const int64_t shapes[][2] = {{32, 8}, {96, 4}, {144, 6}, {240, 10}, {480, 20}, {672, 28}, {1152, 48}};
  for (const auto& sh : shapes) check(sh[0], sh[1], sh[0], true, true);
}

TEST(OnednnSe, MatchesTheReferenceOnOddShapes) {
  check(40, 10, 40, true, true);    // channels not a multiple of 16 (MobileNet-V3's 40 -> 10 -> 40 pattern)
  check(72, 24, 72, false, true);   // Relu
  check(17, 3, 33, true, false);    // no biases, odd sizes, c2 != c
  check(512, 80, 512, true, true);  // cs over 64 (a second group of four chains)
  check(16, 1, 200, false, true);   // one squeezed channel, c2 past one group of eight chains
}

TEST(OnednnSe, ScalarPathMatchesTheReferenceToo) {
  check(1152, 48, 1152, true, true, false);
  check(40, 10, 40, false, false, false);
  check(96, 24, 96, false, true, false, true);
}

TEST(OnednnSe, HardSigmoidGateOnMobileNetV3Shapes) {
  // torchvision's MobileNet-V3-Small excitations (Relu, HardSigmoid with alpha 1/6): both ends of the gate's clamp
  // are reached (outputs exactly 0 and 1 among them).
  const int64_t shapes[][2] = {{16, 8}, {96, 24}, {240, 64}, {120, 32}, {144, 40}, {288, 72}, {576, 144}};
  int zeros = 0, ones = 0;
  for (const auto& sh : shapes) {
    const auto [z, o] = check(sh[0], sh[1], sh[0], false, true, true, true);
    zeros += z, ones += o;
  }
  EXPECT_GT(zeros, 0);
  EXPECT_GT(ones, 0);
  check(17, 3, 33, true, false, true, true);  // SiLU squeeze, odd sizes, no biases
}

}  // namespace
}  // namespace keel::onednn
