// plugins/cpu_onednn/onednn_conv_select_test.cc — oneDNN's alternative convolution implementations over the same
// layouts, and the timing that picks among them (onednn_conv_select.h).
#include "onednn_conv_select.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace keel::onednn {
namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using pd_t = dnnl::convolution_forward::primitive_desc;

struct Fixture {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  // ResNet-50's layer1 3x3: 64 -> 64 channels at 56x56, nChw16c in and out, bias and Relu.
  dnnl::memory::desc src{{1, 64, 56, 56}, dt::f32, tag::nChw16c}, dst{{1, 64, 56, 56}, dt::f32, tag::nChw16c};
  dnnl::memory::desc wany{{64, 64, 3, 3}, dt::f32, tag::any}, bias{{64}, dt::f32, tag::a};
  dnnl::primitive_attr attr() const {
    dnnl::post_ops po;
    po.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    dnnl::primitive_attr a;
    a.set_post_ops(po);
    return a;
  }
  dnnl::convolution_forward::desc desc(dnnl::algorithm a) const {
    return {dnnl::prop_kind::forward_inference, a, src, wany, bias, dst, {1, 1}, {1, 1}, {1, 1}};
  }
  // Runs `pd` on fixed inputs (plain weights reordered into its layout) and returns its nChw16c output.
  std::vector<float> run(const pd_t& pd) {
    dnnl::memory x(src, eng), wp({{64, 64, 3, 3}, dt::f32, tag::oihw}, eng), w(pd.weights_desc(), eng),
        b(bias, eng), y(dst, eng);
    auto* xs = static_cast<float*>(x.get_data_handle());
    for (size_t k = 0; k < src.get_size() / 4; ++k) xs[k] = std::sin(0.37f * static_cast<float>(k)) * 0.5f;
    auto* ws = static_cast<float*>(wp.get_data_handle());
    for (size_t k = 0; k < 64 * 64 * 9; ++k) ws[k] = std::cos(0.11f * static_cast<float>(k)) * 0.05f;
    auto* bs = static_cast<float*>(b.get_data_handle());
    for (int k = 0; k < 64; ++k) bs[k] = 0.01f * static_cast<float>(k % 7) - 0.03f;
    dnnl::reorder(wp, w).execute(strm, wp, w);
    dnnl::convolution_forward(pd).execute(
        strm, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, y}});
    strm.wait();
    const auto* ys = static_cast<const float*>(y.get_data_handle());
    return std::vector<float>(ys, ys + dst.get_size() / 4);
  }
};

TEST(OnednnConvSelect, AlternativesKeepLayoutsAndComputeTheSame) {
  Fixture f;
  const auto cd = f.desc(dnnl::algorithm::convolution_winograd);
  pd_t pd;
  try {
    pd = pd_t(cd, f.attr(), f.eng);
  } catch (const dnnl::error&) {
    GTEST_SKIP() << "no Winograd convolution on this CPU";
  }
  const std::string own = pd.impl_info_str();
  const auto alts = conv_alternatives(pd, "wino");
  EXPECT_EQ(std::string(pd.impl_info_str()), own);  // pd keeps its implementation
  const std::vector<float> want = f.run(pd);
  for (const pd_t& a : alts) {
    const std::string name = a.impl_info_str();
    EXPECT_NE(name, own);
    EXPECT_NE(name.find("wino"), std::string::npos) << name;
    EXPECT_TRUE(a.src_desc() == f.src && a.dst_desc() == f.dst) << name;
    const std::vector<float> got = f.run(a);
    ASSERT_EQ(got.size(), want.size());
    size_t off = 0;
    for (size_t k = 0; k < got.size(); ++k) off += std::fabs(got[k] - want[k]) > 1e-4f * (1.f + std::fabs(want[k]));
    EXPECT_EQ(off, 0u) << name << " against " << own;
  }
  // Asking for a name no implementation has gives nothing.
  EXPECT_TRUE(conv_alternatives(pd, "no-such-kernel").empty());
}

TEST(OnednnConvSelect, FastestNeedsItsMargin) {
  Fixture f;
  pd_t wino, direct;
  try {
    wino = pd_t(f.desc(dnnl::algorithm::convolution_winograd), f.attr(), f.eng);
    direct = pd_t(f.desc(dnnl::algorithm::convolution_direct), f.attr(), f.eng);
  } catch (const dnnl::error&) {
    GTEST_SKIP() << "no Winograd convolution on this CPU";
  }
  // Winograd does about half the direct kernel's multiplications here (measured 2x faster).
  EXPECT_EQ(fastest_conv({direct, wino}, {0.0, 0.05}, f.eng, f.strm), 1u);
  EXPECT_EQ(fastest_conv({wino, direct}, {0.0, 0.05}, f.eng, f.strm), 0u);
  EXPECT_EQ(fastest_conv({direct, wino}, {0.0, 0.99}, f.eng, f.strm), 0u);  // not 100x faster
  EXPECT_EQ(fastest_conv({direct}, {0.0}, f.eng, f.strm), 0u);
  EXPECT_EQ(fastest_conv({direct, wino}, {0.0}, f.eng, f.strm), 0u);  // margins do not match: the default
}

}  // namespace
}  // namespace keel::onednn
