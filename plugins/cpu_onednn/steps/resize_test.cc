// plugins/cpu_onednn/steps/resize_test.cc — bilinear_resize (steps/resize.h) against ONNX Resize's linear formula
// evaluated point by point (neighbours floor(src) and floor(src) + 1 read with edge padding, as ONNX's reference
// implementation does), in the plain, nChw16c and nhwc pixel shapes, every coordinate mode, up and down, with the
// vector and scalar code and OpenMP teams.
#include "steps/resize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace keel::onednn {
namespace {

double source_coordinate(int64_t x, int64_t in, int64_t out, double scale, ResizeCoords c) {
  switch (c) {
    case ResizeCoords::kHalfPixel: return (x + 0.5) / scale - 0.5;
    case ResizeCoords::kPytorchHalfPixel: return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
    case ResizeCoords::kAlignCorners: return out > 1 ? x * double(in - 1) / double(out - 1) : 0.0;
    case ResizeCoords::kAsymmetric: return x / scale;
  }
  return 0;
}

// The value at output pixel (y, x), element v of image p.
double expected(const std::vector<float>& src, int64_t h, int64_t w, int64_t vec, int64_t p, int64_t v, int64_t y,
                int64_t x, int64_t oh, int64_t ow, double sh, double sw, ResizeCoords c) {
  auto at = [&](int64_t r, int64_t q) {
    r = std::clamp<int64_t>(r, 0, h - 1);
    q = std::clamp<int64_t>(q, 0, w - 1);
    return double(src[((p * h + r) * w + q) * vec + v]);
  };
  const double sy = source_coordinate(y, h, oh, sh, c), sx = source_coordinate(x, w, ow, sw, c);
  const double fy = std::floor(sy), fx = std::floor(sx);
  const double ry = sy - fy, rx = sx - fx;
  const int64_t y0 = int64_t(fy), x0 = int64_t(fx);
  const double top = at(y0, x0) * (1 - rx) + at(y0, x0 + 1) * rx;
  const double bottom = at(y0 + 1, x0) * (1 - rx) + at(y0 + 1, x0 + 1) * rx;
  return top * (1 - ry) + bottom * ry;
}

void check(int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t vec, ResizeCoords c, int team,
           bool vector) {
  const double sh = double(oh) / h, sw = double(ow) / w;
  BilinearShape s;
  s.planes = planes, s.h = h, s.w = w, s.oh = oh, s.ow = ow, s.vec = vec;
  s.y = resize_axis(h, oh, sh, c);
  s.x = resize_axis(w, ow, sw, c);
  std::vector<float> src(planes * h * w * vec), dst(planes * oh * ow * vec, -7.f);
  for (size_t k = 0; k < src.size(); ++k) src[k] = std::sin(0.37f * float(k)) * 2.f + 0.01f * float(k % 13);
  bilinear_resize(s, src.data(), dst.data(), team, vector);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t x = 0; x < ow; ++x)
        for (int64_t v = 0; v < vec; ++v) {
          const double e = expected(src, h, w, vec, p, v, y, x, oh, ow, sh, sw, c);
          ASSERT_NEAR(dst[((p * oh + y) * ow + x) * vec + v], e, 1e-5 * (1 + std::fabs(e)))
              << "mode " << int(c) << " " << h << "x" << w << " -> " << oh << "x" << ow << " vec " << vec << " at p "
              << p << " y " << y << " x " << x << " v " << v << " team " << team;
        }
}

const ResizeCoords kModes[] = {ResizeCoords::kHalfPixel, ResizeCoords::kPytorchHalfPixel, ResizeCoords::kAlignCorners,
                               ResizeCoords::kAsymmetric};

TEST(OnednnResize, PlainImagesEveryModeUpAndDown) {
  for (ResizeCoords c : kModes)
    for (bool vector : {true, false}) {
      check(3, 10, 10, 160, 160, 1, c, 1, vector);  // DeepLabV3's class map, x16
      check(2, 5, 7, 11, 13, 1, c, 2, vector);      // odd factors
      check(2, 12, 9, 5, 4, 1, c, 2, vector);       // downsampling
      check(1, 6, 6, 1, 9, 1, c, 3, vector);        // an output axis of length 1
      check(1, 1, 1, 4, 5, 1, c, 1, vector);        // a 1x1 source (the ASPP's pooled branch)
    }
}

TEST(OnednnResize, BlockedAndChannelsLastPixels) {
  for (ResizeCoords c : kModes) {
    check(4, 6, 5, 12, 10, 16, c, 2, true);  // nChw16c: 16 floats a pixel
    check(2, 7, 3, 14, 9, 16, c, 1, false);
    check(2, 5, 6, 9, 11, 21, c, 2, true);  // nhwc with 21 channels: a masked tail
    check(1, 8, 8, 3, 3, 48, c, 4, true);
  }
}

TEST(OnednnResize, AxisTableAlignCorners) {
  const ResizeAxis a = resize_axis(3, 5, 5.0 / 3.0, ResizeCoords::kAlignCorners);
  // Sources 0, 0.5, 1, 1.5, 2: the corners map to the corners.
  EXPECT_EQ(a.i0, (std::vector<int32_t>{0, 0, 1, 1, 2}));
  EXPECT_EQ(a.i1, (std::vector<int32_t>{1, 1, 2, 2, 2}));
  EXPECT_EQ(a.w1, (std::vector<float>{0.f, 0.5f, 0.f, 0.5f, 0.f}));
  ResizeCoords c;
  EXPECT_TRUE(resize_coords_of("align_corners", &c));
  EXPECT_EQ(c, ResizeCoords::kAlignCorners);
  EXPECT_FALSE(resize_coords_of("tf_crop_and_resize", &c));
}

}  // namespace
}  // namespace keel::onednn
