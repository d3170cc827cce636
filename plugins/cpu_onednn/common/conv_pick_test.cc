// plugins/cpu_onednn/common/conv_pick_test.cc — the implementations conv_impls_like lists compute the convolution
// (each against a direct sum, rtol 1e-3, Winograd F(4,3) included), and fastest_conv picks the fast one of a jit and
// a slow implementation whichever comes first (common/conv_pick.h).
#include "common/conv_pick.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace keel::onednn {
namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

struct Shape {
  int64_t c, m, h;  // 3x3, pad 1, stride 1, square h x h, batch 1
};

// The first implementation oneDNN lists for this convolution (3x3, Relu post-op) whose name passes `want` (or the
// first one: want null); an empty descriptor when none does. (The operation descriptor must outlive the iteration.)
dnnl::convolution_forward::primitive_desc make(const Shape& s, dnnl::algorithm a, tag t, const dnnl::engine& eng,
                                               bool (*want)(const std::string&) = nullptr) {
  dnnl::memory::desc src({1, s.c, s.h, s.h}, dt::f32, t), dst({1, s.m, s.h, s.h}, dt::f32, t),
      w({s.m, s.c, 3, 3}, dt::f32, tag::any), b({s.m}, dt::f32, tag::a);
  dnnl::post_ops po;
  po.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(po);
  dnnl::convolution_forward::desc cd(dnnl::prop_kind::forward_inference, a, src, w, b, dst, {1, 1}, {1, 1}, {1, 1});
  dnnl::convolution_forward::primitive_desc pd(cd, attr, eng);
  while (want && !want(pd.impl_info_str()))
    if (!pd.next_impl()) return {};
  return pd;
}

// Runs `pd` on plain data x [c,h,h], w [m,c,3,3], bias [m] (reordered into its layouts); y [m,h,h].
std::vector<float> run(const dnnl::convolution_forward::primitive_desc& pd, const Shape& s, std::vector<float>& x,
                       std::vector<float>& w, std::vector<float>& bias, const dnnl::engine& eng, dnnl::stream& strm) {
  dnnl::memory xp({{1, s.c, s.h, s.h}, dt::f32, tag::nchw}, eng, x.data());
  dnnl::memory wp({{s.m, s.c, 3, 3}, dt::f32, tag::oihw}, eng, w.data());
  dnnl::memory bm({{s.m}, dt::f32, tag::a}, eng, bias.data());
  std::vector<float> y(static_cast<size_t>(s.m * s.h * s.h));
  dnnl::memory yp({{1, s.m, s.h, s.h}, dt::f32, tag::nchw}, eng, y.data());
  dnnl::memory xm(pd.src_desc(), eng), wm(pd.weights_desc(), eng), ym(pd.dst_desc(), eng),
      sm(pd.scratchpad_desc(), eng);
  dnnl::reorder(xp, xm).execute(strm, xp, xm);
  dnnl::reorder(wp, wm).execute(strm, wp, wm);
  dnnl::convolution_forward(pd).execute(
      strm,
      {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_BIAS, bm}, {DNNL_ARG_DST, ym}, {DNNL_ARG_SCRATCHPAD, sm}});
  dnnl::reorder(ym, yp).execute(strm, ym, yp);
  strm.wait();
  return y;
}

TEST(OnednnConvPick, EveryListedImplementationComputesTheConvolution) {
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  size_t listed = 0, shapes = 0;
  for (const Shape& s : {Shape{16, 64, 13}, Shape{48, 192, 13}, Shape{32, 32, 27}, Shape{96, 208, 14}}) {
    std::vector<float> x(static_cast<size_t>(s.c * s.h * s.h)), w(static_cast<size_t>(s.m * s.c * 9)),
        bias(static_cast<size_t>(s.m));
    for (size_t k = 0; k < x.size(); ++k) x[k] = static_cast<float>((k * 37) % 101) / 50.f - 0.5f;
    for (size_t k = 0; k < w.size(); ++k) w[k] = static_cast<float>((k * 53) % 97) / 97.f - 0.45f;
    for (size_t k = 0; k < bias.size(); ++k) bias[k] = static_cast<float>(k % 7) * 0.1f - 0.3f;
    std::vector<double> ref(static_cast<size_t>(s.m * s.h * s.h));
    for (int64_t m = 0; m < s.m; ++m)
      for (int64_t i = 0; i < s.h; ++i)
        for (int64_t j = 0; j < s.h; ++j) {
          double acc = bias[m];
          for (int64_t c = 0; c < s.c; ++c)
            for (int64_t u = 0; u < 3; ++u)
              for (int64_t v = 0; v < 3; ++v) {
                const int64_t yi = i + u - 1, xj = j + v - 1;
                if (yi < 0 || yi >= s.h || xj < 0 || xj >= s.h) continue;
                acc += static_cast<double>(x[(c * s.h + yi) * s.h + xj]) * w[((m * s.c + c) * 3 + u) * 3 + v];
              }
          ref[(m * s.h + i) * s.h + j] = acc > 0 ? acc : 0;
        }
    auto cands = conv_impls_like(make(s, dnnl::algorithm::convolution_winograd, tag::nChw16c, eng), eng);
    ASSERT_FALSE(cands.empty());
    listed += cands.size(), ++shapes;
    for (const auto& pd : cands) {
      const std::string impl = pd.impl_info_str();
      EXPECT_NE(impl.rfind("ref", 0), 0u) << impl;
      EXPECT_TRUE(pd.src_desc() == cands[0].src_desc() && pd.dst_desc() == cands[0].dst_desc()) << impl;
      const std::vector<float> y = run(pd, s, x, w, bias, eng, strm);
      double worst = 0;
      for (size_t k = 0; k < y.size(); ++k)
        worst = std::max(worst, std::fabs(y[k] - ref[k]) / (1e-3 * std::fabs(ref[k]) + 1e-4));
      EXPECT_LE(worst, 1.0) << impl << " " << s.c << "->" << s.m << " at " << s.h << "x" << s.h;
    }
  }
  // With AVX-512 oneDNN 2.6 offers F(4,3) beside F(2,3) for these shapes: the further implementations were listed.
  if (dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core) {
    EXPECT_GT(listed, shapes);
  }
}

// Two implementations of one direct convolution: oneDNN's jit one over nChw16c, and a slow one over the same shape,
// its SSE4.1 or reference kernel for channels-last memory (its later entries; 6x slower or more than the AVX-512 jit
// one here). `slow` is empty where oneDNN lists neither.
std::pair<dnnl::convolution_forward::primitive_desc, dnnl::convolution_forward::primitive_desc> jit_and_slow(
    const dnnl::engine& eng) {
  const Shape s{16, 32, 14};
  return {make(s, dnnl::algorithm::convolution_direct, tag::nChw16c, eng),
          make(s, dnnl::algorithm::convolution_direct, tag::nhwc, eng, [](const std::string& impl) {
            return impl.find("sse41") != std::string::npos || impl.rfind("ref", 0) == 0;
          })};
}

// The timing tests: one thread (a team of two on a busy machine waits for its second thread longer than these runs
// take), the jit and slow candidates of jit_and_slow; skipped where oneDNN lists no slow one.
class OnednnConvPickTiming : public ::testing::Test {
 protected:
  void SetUp() override {
    omp_set_num_threads(1);
    std::tie(jit, slow) = jit_and_slow(eng);
    if (!slow) GTEST_SKIP() << "no SSE4.1 or reference kernel listed";
  }
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::convolution_forward::primitive_desc jit, slow;
};

TEST_F(OnednnConvPickTiming, FastestPicksTheJitKernelOverASlowOne) {
  ASSERT_NE(std::string(jit.impl_info_str()).rfind("ref", 0), 0u);
  EXPECT_EQ(fastest_conv({slow, jit}, eng, strm, 3), 1u);
  EXPECT_EQ(fastest_conv({jit, slow}, eng, strm, 3), 0u);
  EXPECT_EQ(fastest_conv({jit}, eng, strm, 3), 0u);
  // A margin the faster one cannot beat keeps the first.
  EXPECT_EQ(fastest_conv({slow, jit}, eng, strm, 3, {0.0, 0.999}), 0u);
}

// Answers outlive the test: under --gtest_repeat its later repetitions ask the same questions again, and each is
// answered without a new entry.
TEST_F(OnednnConvPickTiming, RemembersEachAnswerPerCandidatesAndTeam) {
  static int repetition = 0;
  const size_t fresh = repetition++ == 0 ? 1 : 0;  // entries a new question adds in this repetition
  const size_t before = remembered_conv_picks();
  EXPECT_EQ(fastest_conv_remembered({slow, jit}, eng, strm, {0.0, 0.05}), 1u);
  EXPECT_EQ(remembered_conv_picks(), before + fresh);
  EXPECT_EQ(fastest_conv_remembered({slow, jit}, eng, strm, {0.0, 0.05}), 1u);  // the same question: answered
  EXPECT_EQ(remembered_conv_picks(), before + fresh);
  EXPECT_EQ(fastest_conv_remembered({jit, slow}, eng, strm, {0.0, 0.05}), 0u);  // another order: another question
  EXPECT_EQ(remembered_conv_picks(), before + 2 * fresh);
  EXPECT_EQ(fastest_conv_remembered({slow, jit}, eng, strm, {0.0, 0.999}), 0u);  // another margin too
  EXPECT_EQ(remembered_conv_picks(), before + 3 * fresh);
  omp_set_num_threads(2);  // another team
  fastest_conv_remembered({slow, jit}, eng, strm, {0.0, 0.05});
  EXPECT_EQ(remembered_conv_picks(), before + 4 * fresh);
  omp_set_num_threads(1);
}

// fastest_run over computations of known cost (a busy loop of so many steps): the cheaper one wins when it comes
// second, the first stays when it is the cheaper one or when the margin asks more than the other can give; `cool`
// runs before every timed run (one warm run each, then reps of each).
TEST(OnednnOwnPick, FastestRunPicksTheCheaperComputation) {
  auto busy = [](int64_t steps) {
    return [steps] {
      volatile double x = 1.0;
      for (int64_t i = 0; i < steps; ++i) x = x * 1.0000001 + 1e-9;
    };
  };
  const auto slow = busy(4'000'000), quick = busy(400'000);  // about 10x apart
  int cools = 0;
  const std::function<void()> cool = [&] { ++cools; };
  std::vector<double> took;
  EXPECT_EQ(fastest_run({slow, quick}, cool, 3, {}, &took), 1u);
  EXPECT_EQ(cools, 2 * (1 + 3));
  ASSERT_EQ(took.size(), 2u);
  EXPECT_GT(took[0], 2 * took[1]);
  EXPECT_EQ(fastest_run({quick, slow}, nullptr, 3), 0u);
  EXPECT_EQ(fastest_run({slow, quick}, nullptr, 3, {0.0, 0.999}), 0u);  // a margin it cannot beat
  EXPECT_EQ(fastest_run({quick}, nullptr, 3, {}, &took), 0u);           // nothing to choose: not timed
  EXPECT_EQ(took, std::vector<double>{1e30});
}

// remembered_pick asks its question once per key, and answers it again without asking (keys of their own for each
// repetition of the test: answers outlive it).
TEST(OnednnOwnPick, RememberedPickAsksOncePerKey) {
  static int repetition = 0;
  const std::string a = "own pick test " + std::to_string(repetition) + "|a",
                    b = "own pick test " + std::to_string(repetition++) + "|b";
  const size_t before = remembered_conv_picks();
  int asked = 0;
  auto ask = [&](size_t answer) {
    return [&asked, answer] {
      ++asked;
      return answer;
    };
  };
  EXPECT_EQ(remembered_pick(a, ask(1)), 1u);
  EXPECT_EQ(remembered_pick(a, ask(0)), 1u);  // remembered: not asked again
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(remembered_pick(b, ask(0)), 0u);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(remembered_conv_picks(), before + 2);
}

}  // namespace
}  // namespace keel::onednn
