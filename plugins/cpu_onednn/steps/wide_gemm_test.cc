// plugins/cpu_onednn/steps/wide_gemm_test.cc — the own wide product (steps/wide_gemm.h) against a double-precision
// reference: every row-tile tail (M 1..13), column tails (N 1, 17, 64, 100, 200), K 1..130, A plain and transposed,
// alpha 1 and not, teams of 1-3 threads; nothing written past Y.
#include "steps/wide_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "steps/silu.h"

namespace keel::onednn {
namespace {

TEST(OnednnWideGemm, MatchesADoubleReference) {
  if (!has_avx512f()) GTEST_SKIP() << "no AVX-512 on this CPU: the product does not run";
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t M : {1, 5, 6, 7, 12, 13})
    for (int64_t N : {1, 17, 64, 100, 200})
      for (int64_t K : {1, 3, 64, 130})
        for (bool ta : {false, true})
          for (float alpha : {1.f, -0.5f})
            for (int team : {1, 3}) {
              SCOPED_TRACE("M " + std::to_string(M) + " N " + std::to_string(N) + " K " + std::to_string(K) +
                           (ta ? " transA" : "") + " alpha " + std::to_string(alpha) + " team " + std::to_string(team));
              std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N));
              for (auto& v : a) v = u(rng);
              for (auto& v : b) v = u(rng);
              std::vector<float> y(static_cast<size_t>(M * N) + 32, 12345.f);
              wide_gemm_f32(a.data(), ta, b.data(), y.data(), M, K, N, alpha, team);
              for (int64_t i = 0; i < M; ++i)
                for (int64_t j = 0; j < N; ++j) {
                  double want = 0;
                  for (int64_t k = 0; k < K; ++k)
                    want += double(ta ? a[k * M + i] : a[i * K + k]) * double(b[k * N + j]);
                  want *= alpha;
                  ASSERT_NEAR(y[i * N + j], want, 1e-5 * (1 + std::abs(want)) * std::sqrt(double(K)))
                      << "row " << i << " column " << j;
                }
              for (size_t i = static_cast<size_t>(M * N); i < y.size(); ++i) ASSERT_EQ(y[i], 12345.f) << "past Y";
            }
}

}  // namespace
}  // namespace keel::onednn
