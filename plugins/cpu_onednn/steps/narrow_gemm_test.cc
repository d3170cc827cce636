// plugins/cpu_onednn/steps/narrow_gemm_test.cc — the few-column product step (steps/narrow_gemm.h) against its
// double-precision reference, over the row and column counts its tiles split on.
#include "steps/narrow_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace keel::onednn {
namespace {

void check(const NarrowGemmShape& s, bool with_bias, bool vector, int team) {
  std::mt19937 rng(static_cast<uint32_t>(s.m * 1000 + s.k * 7 + s.n));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  // x sized exactly: the tiles must not read a row past its end (an ASan build catches a masked tail that does).
  std::vector<float> x(static_cast<size_t>(s.m * s.k)), w(static_cast<size_t>(s.k * s.n)), b(static_cast<size_t>(s.n));
  for (float& v : x) v = u(rng);
  for (float& v : w) v = u(rng) / std::sqrt(static_cast<float>(s.k));
  for (float& v : b) v = u(rng);
  const float* bias = with_bias ? b.data() : nullptr;
  std::vector<float> want(static_cast<size_t>(s.m * s.n)), got(want.size(), NAN), packed(narrow_gemm_packed_floats(s));
  narrow_gemm_reference(s, x.data(), w.data(), bias, want.data());
  narrow_gemm_pack(s, w.data(), packed.data());
  if (vector) {
    narrow_gemm_run(s, x.data(), packed.data(), bias, got.data(), team);
  } else {
    narrow_gemm_rows(s, x.data(), packed.data(), bias, got.data(), 0, s.m, false);
  }
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-4f * (1.f + std::fabs(want[i])))
        << "at " << i << " of m=" << s.m << " k=" << s.k << " n=" << s.n << (vector ? "" : " (scalar)") << " team "
        << team;
}

const NarrowGemmShape kShapes[] = {
    {32, 7200, 10},  // the peers' simple_cnn at batch 32: 8 blocks of 4 rows, two groups of 5 columns
    {1, 5408, 10},   // Fashion-MNIST's SimpleCNN at batch 1: one row
    {7, 100, 16},    // 4 + 3 rows, 4 groups of 4 columns, a tail of 4 values of k
    {6, 17, 1},      // one column, a tail of 1
    {3, 33, 6},      // 3 rows, 3 + 3 columns
    {9, 16, 11},     // 4 + 4 + 1 rows, 3 + 4 + 4 columns, k one vector
    {2, 5, 13},      // k shorter than a vector
};

TEST(OnednnNarrowGemm, MatchesTheReference) {
  for (const auto& s : kShapes)
    for (int team : {1, 2, 3}) check(s, team != 2, true, team);
}

TEST(OnednnNarrowGemm, ScalarPathMatchesTheReference) {
  for (const auto& s : kShapes) check(s, true, false, 1);
}

}  // namespace
}  // namespace keel::onednn
