// plugins/cpu_onednn/onednn_relu_sparse_test.cc — the zero-skipping product (onednn_relu_sparse.h) against its
// double-precision reference over densities 0..1, odd row counts (an unpaired last row), K around the block edges,
// column counts around the 128-column tile, with and without bias and a residual, over teams of 1-3, on the
// AVX-512 and the scalar path.
#include "onednn_relu_sparse.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace keel::onednn {
namespace {

void check(int64_t m, int64_t k, int64_t n, double density, bool bias, bool accumulate, int team) {
  ReluSparseShape s;
  s.m = m, s.k = k, s.n = n, s.lda = k + 3, s.accumulate = accumulate;  // a row stride above k
  ASSERT_EQ(relu_sparse_check(s), "");
  std::mt19937 rng(static_cast<uint32_t>(m * 7919 + k * 131 + n + int(density * 10)));
  std::uniform_real_distribution<float> u(-1.f, 1.f), p(0.f, 1.f);
  std::vector<float> a(static_cast<size_t>(m * s.lda)), b(static_cast<size_t>(k * n)), bs(static_cast<size_t>(n));
  for (float& v : a) v = p(rng) < density ? std::fabs(u(rng)) + 1e-3f : (p(rng) < 0.5f ? 0.f : -0.f);
  for (float& v : b) v = u(rng);
  for (float& v : bs) v = u(rng);
  std::vector<float> want(static_cast<size_t>(m * n)), got(want.size()), packed(relu_sparse_packed_floats(s));
  for (size_t i = 0; i < want.size(); ++i) want[i] = got[i] = accumulate ? u(rng) : NAN;
  if (!accumulate) std::fill(got.begin(), got.end(), NAN);  // every output must be written
  relu_sparse_reference(s, a.data(), b.data(), bias ? bs.data() : nullptr, want.data());
  relu_sparse_pack(s, b.data(), packed.data());
  relu_sparse_run(s, a.data(), packed.data(), bias ? bs.data() : nullptr, got.data(), team);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 2e-5f * (1.f + std::sqrt(float(k)))) << "at " << i << " of m=" << m << " k=" << k
                                                                     << " n=" << n << " density " << density
                                                                     << " bias " << bias << " acc " << accumulate
                                                                     << " team " << team;
}

void sweep() {
  for (double d : {0.0, 0.3, 0.5, 1.0})
    for (int team : {1, 2, 3}) {
      check(7, 100, 128, d, true, true, team);     // odd rows: an unpaired last row; K: a block of 64 + a tail of 36
      check(33, 64, 256, d, true, false, team);    // two full tiles; one block of K exactly; a row block + 1
      check(4, 1, 16, d, false, false, team);      // K = 1, the narrowest tile
      check(10, 1030, 400, d, false, true, team);  // 3 tiles + a tail of 16 columns, K across many blocks + 6
    }
  check(0, 8, 16, 0.5, true, true, 2);  // no rows
}

TEST(OnednnReluSparse, MatchesTheReference) { sweep(); }

TEST(OnednnReluSparse, ScalarPathMatchesTheReference) {
  relu_sparse_force_scalar(true);
  sweep();
  relu_sparse_force_scalar(false);
}

TEST(OnednnReluSparse, NaNInAReachesItsRow) {
  ReluSparseShape s;
  s.m = 3, s.k = 40, s.n = 32, s.lda = 40;
  std::vector<float> a(120, 0.f), b(40 * 32, 1.f), c(96), packed(relu_sparse_packed_floats(s));
  a[40 + 17] = std::numeric_limits<float>::quiet_NaN();
  relu_sparse_pack(s, b.data(), packed.data());
  for (bool scalar : {false, true}) {
    relu_sparse_force_scalar(scalar);
    relu_sparse_run(s, a.data(), packed.data(), nullptr, c.data(), 1);
    for (int64_t i = 0; i < 96; ++i) EXPECT_EQ(std::isnan(c[i]), i / 32 == 1) << i;
  }
  relu_sparse_force_scalar(false);
}

TEST(OnednnReluSparse, DensityCountsNonzerosOfTheSampledRows) {
  ReluSparseShape s;
  s.m = 4, s.k = 20, s.n = 16, s.lda = 24;
  std::vector<float> a(96, 0.f);
  for (int k = 0; k < 10; ++k) a[k] = 1.f;        // row 0: half
  for (int k = 0; k < 20; ++k) a[24 + k] = 2.f;   // row 1: all
  a[48 + 3] = -0.f;                               // row 2: none (-0 is a zero)
  a[72 + 19] = NAN;                               // row 3: one (NaN is not)
  EXPECT_DOUBLE_EQ(relu_sparse_density(s, a.data(), 1), 31.0 / 80);
  EXPECT_DOUBLE_EQ(relu_sparse_density(s, a.data(), 2), 10.0 / 40);
}

TEST(OnednnReluSparse, RejectsWhatItDoesNotCompute) {
  ReluSparseShape s;
  s.m = 2, s.k = 8, s.n = 24, s.lda = 8;
  EXPECT_NE(relu_sparse_check(s), "");
  s.n = 32, s.lda = 4;
  EXPECT_NE(relu_sparse_check(s), "");
  s.lda = 8, s.k = 0;
  EXPECT_NE(relu_sparse_check(s), "");
}

}  // namespace
}  // namespace keel::onednn
