// plugins/cpu_onednn/steps/skinny_gemm_test.cc — the few-row product step (steps/skinny_gemm.h) against its
// double-precision reference: row tiles of every size, k across chunks, a residual summed in place, the bias absent,
// Relu and ReLU6, weights given transposed, teams of 1 to 3 and several threads at once.
#include "steps/skinny_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace keel::onednn {
namespace {

struct Data {
  std::vector<float> x, w, wt, bias, y0, want;
};

Data make(const SkinnyGemmShape& s, bool with_bias) {
  std::mt19937 rng(static_cast<uint32_t>(s.m * 1000 + s.k * 7 + s.n + (s.sum ? 1 : 0)));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Data d;
  d.x.resize(static_cast<size_t>(s.m * s.k));
  d.w.resize(static_cast<size_t>(s.k * s.n));
  d.wt.resize(d.w.size());
  d.y0.resize(static_cast<size_t>(s.m * s.n));
  for (float& v : d.x) v = u(rng);
  for (float& v : d.w) v = u(rng);
  for (float& v : d.y0) v = s.sum ? u(rng) : NAN;  // without a sum, whatever y held must not matter
  if (with_bias) {
    d.bias.resize(static_cast<size_t>(s.n));
    for (float& v : d.bias) v = u(rng);
  }
  for (int64_t k = 0; k < s.k; ++k)
    for (int64_t j = 0; j < s.n; ++j) d.wt[j * s.k + k] = d.w[k * s.n + j];
  d.want = d.y0;
  skinny_gemm_reference(s, d.x.data(), d.w.data(), with_bias ? d.bias.data() : nullptr, d.want.data());
  return d;
}

void expect_match(const SkinnyGemmShape& s, const Data& d, const std::vector<float>& got, const std::string& what) {
  // Sums of k products of values in [-1, 1]: f32 rounding grows with sqrt(k).
  const float tol = 2e-6f * std::sqrt(static_cast<float>(s.k)) + 1e-6f;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], d.want[i], tol * (1.f + std::fabs(d.want[i])))
        << what << " at row " << i / s.n << " column " << i % s.n << ": m=" << s.m << " k=" << s.k << " n=" << s.n
        << (s.sum ? " sum" : "");
}

void check(const SkinnyGemmShape& s, bool with_bias, bool transposed, int team) {
  if (!skinny_gemm_check(s).empty()) GTEST_SKIP() << skinny_gemm_check(s);
  const Data d = make(s, with_bias);
  std::vector<float> packed(skinny_gemm_packed_floats(s));
  skinny_gemm_pack(s, transposed ? d.wt.data() : d.w.data(), transposed, packed.data());
  std::vector<float> got = d.y0;
  skinny_gemm_run(s, d.x.data(), packed.data(), with_bias ? d.bias.data() : nullptr, got.data(), team);
  expect_match(s, d, got, "team " + std::to_string(team));
}

SkinnyGemmShape shape(int64_t m, int64_t k, int64_t n, bool sum = false) {
  SkinnyGemmShape s;
  s.m = m, s.k = k, s.n = n, s.sum = sum;
  return s;
}

TEST(SkinnyGemm, MatchesTheReference) {
  for (int team : {1, 2, 3}) {
    check(shape(49, 768, 256), true, false, team);         // ConvNeXt's last stage, narrower: 7 tiles of 7
    check(shape(49, 1700, 128, true), true, false, team);  // k over three chunks, a residual summed
    check(shape(1, 100, 64), true, false, team);           // one row, one block
    check(shape(10, 37, 192), false, false, team);         // 5 + 5 rows, no bias, 3 blocks over the team
    check(shape(64, 300, 320, true), false, true, team);   // 10 tiles of 6 and 7 rows; sum without bias; transB
    check(shape(13, 1, 64), true, false, team);            // k = 1
  }
}

TEST(SkinnyGemm, ColumnsNotAMultipleOf64) {  // the last block zero-padded, its columns past n masked
  for (int team : {1, 2, 3}) {
    check(shape(1, 2048, 1000), true, true, team);  // ResNet-50's classifier at batch 1 (transB)
    check(shape(3, 300, 40, true), true, false, team);
    check(shape(7, 100, 129), false, false, team);
    SkinnyGemmShape s = shape(49, 200, 80);
    s.y_blocked16 = true, s.relu = true;  // 5 channel blocks: the second column block's last 2 vectors masked
    check(s, true, false, team);
  }
}

TEST(SkinnyGemm, ReluAndAnNChw16cOutput) {
  for (int team : {1, 2}) {
    SkinnyGemmShape s = shape(49, 1700, 192, true);  // a residual summed, k over three chunks: Relu after the last
    s.relu = true;
    check(s, true, false, team);
    s.y_blocked16 = true;  // a convolution's 7x7 output: planes of 49 pixels per 16 channels
    check(s, true, true, team);
    s.sum = false, s.m = 36;
    check(s, false, false, team);
    s.relu_max = 6.f, s.m = 49, s.k = 320, s.n = 1280;  // ReLU6: MobileNetV2's last 1x1 at 7x7 (values past 6 here)
    check(s, true, false, team);
    s.relu_max = 0.5f, s.sum = true, s.y_blocked16 = false;  // capped below most sums, after a residual
    check(s, true, true, team);
  }
}

TEST(SkinnyGemm, OneStepFromSeveralThreadsAtOnce) {
  const SkinnyGemmShape s = shape(20, 400, 256, true);
  if (!skinny_gemm_check(s).empty()) GTEST_SKIP() << skinny_gemm_check(s);
  const Data d = make(s, true);
  std::vector<float> packed(skinny_gemm_packed_floats(s));
  skinny_gemm_pack(s, d.w.data(), false, packed.data());
  std::vector<std::vector<float>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 10; ++r) {
        got[t] = d.y0;
        skinny_gemm_run(s, d.x.data(), packed.data(), d.bias.data(), got[t].data(), 1);
      }
    });
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < got.size(); ++t) expect_match(s, d, got[t], "thread " + std::to_string(t));
}

TEST(SkinnyGemm, Declines) {
  EXPECT_NE(skinny_gemm_check(shape(0, 16, 64)), "");
  EXPECT_NE(skinny_gemm_check(shape(kSkinnyGemmMaxRows + 1, 16, 64)), "");
  EXPECT_NE(skinny_gemm_check(shape(4, 16, 0)), "");
  SkinnyGemmShape blocked = shape(4, 16, 40);
  blocked.y_blocked16 = true;  // nChw16c wants whole 16-channel blocks
  EXPECT_NE(skinny_gemm_check(blocked), "");
  EXPECT_NE(skinny_gemm_check(shape(4, 0, 64)), "");
}

}  // namespace
}  // namespace keel::onednn
