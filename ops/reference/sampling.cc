// Reference kernels that sample an image at computed positions: GridSample (16; 4-D, bilinear/nearest/bicubic,
// zeros/border/reflection padding, align_corners) and RoiAlign (10/16; avg/max, half_pixel/output_half_pixel).
// Both compute in double and follow the ONNX reference / onnxruntime formulas (including their rounding and the
// max-mode quirk of RoiAlign: the max of the weighted corner values).
#include "ops/reference/kernels.h"

namespace keel::ops::ref {
namespace {

enum class GsMode { kBilinear, kNearest, kBicubic };
enum class GsPad { kZeros, kBorder, kReflection };

double gs_denormalize(double n, int64_t len, bool align_corners) {
  if (align_corners) return (n + 1) / 2.0 * static_cast<double>(len - 1);
  return ((n + 1) * static_cast<double>(len) - 1) / 2.0;
}

// Reflects x into [lo, hi] (repeatedly, like a mirror pair).
double gs_reflect(double x, double lo, double hi) {
  double range = hi - lo;
  if (range <= 0) return lo;
  if (x < lo) {
    double dx = lo - x;
    int64_t n = static_cast<int64_t>(dx / range);
    double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    double dx = x - hi;
    int64_t n = static_cast<int64_t>(dx / range);
    double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? hi - r : lo + r;
  }
  return x;
}

void gs_cubic_coeffs(double x, double c[4]) {
  constexpr double A = -0.75;
  x = std::abs(x);
  c[0] = ((A * (x + 1) - 5 * A) * (x + 1) + 8 * A) * (x + 1) - 4 * A;
  c[1] = ((A + 2) * x - (A + 3)) * x * x + 1;
  c[2] = ((A + 2) * (1 - x) - (A + 3)) * (1 - x) * (1 - x) + 1;
  c[3] = ((A * (2 - x) - 5 * A) * (2 - x) + 8 * A) * (2 - x) - 4 * A;
}

}  // namespace

void op_grid_sample(Kctx& k) {
  TView x = k.in(0), grid = k.in(1);
  if (x.ndim() != 4) k.unimpl(cat("only 4-D input (N, C, H, W) is handled, got ", shape_str(x.shape)));
  if (grid.ndim() != 4 || grid.shape[3] != 2 || grid.shape[0] != x.shape[0])
    k.invalid(cat("grid ", shape_str(grid.shape), " must be (N, H_out, W_out, 2) with N the batch of X ",
                  shape_str(x.shape),
                  grid.ndim() != 4     ? ": it is not 4-D"
                  : grid.shape[3] != 2 ? ": its last dim is not 2"
                                       : ": its batch differs"));
  std::string mode_s = k.attr_s("mode", "bilinear");
  GsMode mode;
  if (mode_s == "bilinear" || mode_s == "linear") mode = GsMode::kBilinear;
  else if (mode_s == "nearest") mode = GsMode::kNearest;
  else if (mode_s == "bicubic" || mode_s == "cubic") mode = GsMode::kBicubic;
  else k.invalid(cat("unknown mode '", mode_s, "'"));
  std::string pad_s = k.attr_s("padding_mode", "zeros");
  GsPad pad;
  if (pad_s == "zeros") pad = GsPad::kZeros;
  else if (pad_s == "border") pad = GsPad::kBorder;
  else if (pad_s == "reflection") pad = GsPad::kReflection;
  else k.invalid(cat("unknown padding_mode '", pad_s, "'"));
  const bool align = k.attr_i("align_corners", 0) != 0;

  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t Ho = grid.shape[1], Wo = grid.shape[2];
  TView y = k.out(0, {N, C, Ho, Wo});
  if (y.numel == 0) return;
  if (H == 0 || W == 0) k.invalid("input has an empty spatial dimension");
  if (y.dtype != x.dtype) k.invalid("output dtype must equal the input dtype");
  const double x_min = align ? 0.0 : -0.5, x_max = align ? static_cast<double>(W - 1) : static_cast<double>(W) - 0.5;
  const double y_min = align ? 0.0 : -0.5, y_max = align ? static_cast<double>(H - 1) : static_cast<double>(H) - 0.5;

  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch(
        FloatTs{}, grid.dtype, k,
        [&](auto gtag) {
          using G = typename decltype(gtag)::type;
          const T* xd = x.p<T>();
          const G* gd = grid.p<G>();
          T* yd = y.p<T>();
          k.parallel(N * C, 1, [&](int64_t b, int64_t e) {
            for (int64_t nc = b; nc < e; ++nc) {
              const int64_t n = nc / C;
              const T* img = xd + nc * H * W;
              auto pixel = [&](int64_t r, int64_t c) -> double {
                if (pad == GsPad::kZeros) {
                  if (c < 0 || c >= W || r < 0 || r >= H) return 0.0;
                } else if (pad == GsPad::kBorder) {
                  c = std::clamp<int64_t>(c, 0, W - 1);
                  r = std::clamp<int64_t>(r, 0, H - 1);
                } else {
                  c = static_cast<int64_t>(gs_reflect(static_cast<double>(c), x_min, x_max));
                  r = static_cast<int64_t>(gs_reflect(static_cast<double>(r), y_min, y_max));
                  c = std::clamp<int64_t>(c, 0, W - 1);
                  r = std::clamp<int64_t>(r, 0, H - 1);
                }
                return static_cast<double>(ld(img[r * W + c]));
              };
              const G* g = gd + n * Ho * Wo * 2;
              T* out = yd + nc * Ho * Wo;
              for (int64_t o = 0; o < Ho * Wo; ++o) {
                double gx = static_cast<double>(ld(g[2 * o])), gy = static_cast<double>(ld(g[2 * o + 1]));
                double px = gs_denormalize(gx, W, align), py = gs_denormalize(gy, H, align);
                if (mode == GsMode::kNearest) {
                  px = std::nearbyint(px);
                  py = std::nearbyint(py);
                }
                if (px < x_min || px > x_max || py < y_min || py > y_max) {
                  if (pad == GsPad::kBorder) {
                    px = std::clamp(px, 0.0, static_cast<double>(W - 1));
                    py = std::clamp(py, 0.0, static_cast<double>(H - 1));
                  } else if (pad == GsPad::kReflection) {
                    px = gs_reflect(px, x_min, x_max);
                    py = gs_reflect(py, y_min, y_max);
                  }
                }
                double v = 0;
                if (!std::isfinite(px) || !std::isfinite(py)) {
                  v = pad == GsPad::kZeros ? 0.0 : std::numeric_limits<double>::quiet_NaN();
                } else if (mode == GsMode::kNearest) {
                  v = pixel(static_cast<int64_t>(std::nearbyint(py)), static_cast<int64_t>(std::nearbyint(px)));
                } else if (mode == GsMode::kBilinear) {
                  int64_t x1 = static_cast<int64_t>(std::floor(px)), y1 = static_cast<int64_t>(std::floor(py));
                  int64_t x2 = x1 + 1, y2 = y1 + 1;
                  double dx2 = static_cast<double>(x2) - px, dx1 = px - static_cast<double>(x1);
                  double dy2 = static_cast<double>(y2) - py, dy1 = py - static_cast<double>(y1);
                  v = dy2 * (dx2 * pixel(y1, x1) + dx1 * pixel(y1, x2)) +
                      dy1 * (dx2 * pixel(y2, x1) + dx1 * pixel(y2, x2));
                } else {
                  int64_t x0 = static_cast<int64_t>(std::floor(px)) - 1, y0 = static_cast<int64_t>(std::floor(py)) - 1;
                  double cx[4], cy[4];
                  gs_cubic_coeffs(px - static_cast<double>(x0) - 1, cx);
                  gs_cubic_coeffs(py - static_cast<double>(y0) - 1, cy);
                  for (int64_t h = 0; h < 4; ++h) {
                    double row = 0;
                    for (int64_t w = 0; w < 4; ++w) row += cx[w] * pixel(y0 + h, x0 + w);
                    v += cy[h] * row;
                  }
                }
                out[o] = st<T>(v);
              }
            }
          });
        },
        "grid");
  });
}

void op_roi_align(Kctx& k) {
  TView x = k.in(0), rois = k.in(1), bidx_t = k.in(2);
  if (x.ndim() != 4) k.invalid(cat("X must be 4-D (N, C, H, W), got ", shape_str(x.shape)));
  if (rois.ndim() != 2 || rois.shape[1] != 4) k.invalid(cat("rois must be (num_rois, 4), got ", shape_str(rois.shape)));
  const int64_t R = rois.shape[0];
  if (bidx_t.numel != R) k.invalid("batch_indices must have num_rois entries");
  auto bidx = read_ints(bidx_t, k, "batch_indices");
  std::string ctm = k.opset() != 0 && k.opset() < 16 ? std::string("output_half_pixel")
                                                     : k.attr_s("coordinate_transformation_mode", "half_pixel");
  bool half_pixel;
  if (ctm == "half_pixel") half_pixel = true;
  else if (ctm == "output_half_pixel") half_pixel = false;
  else k.invalid(cat("unknown coordinate_transformation_mode '", ctm, "'"));
  std::string mode_s = k.attr_s("mode", "avg");
  bool max_mode;
  if (mode_s == "avg") max_mode = false;
  else if (mode_s == "max") max_mode = true;
  else k.invalid(cat("unknown mode '", mode_s, "'"));
  const int64_t PH = k.attr_i("output_height", 1), PW = k.attr_i("output_width", 1);
  const int64_t sampling_ratio = k.attr_i("sampling_ratio", 0);
  const double scale = k.attr_f("spatial_scale", 1.0f);
  if (PH <= 0 || PW <= 0) k.invalid("output_height and output_width must be positive");
  if (sampling_ratio < 0) k.invalid("sampling_ratio must be >= 0");
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  for (int64_t b : bidx)
    if (b < 0 || b >= N) k.invalid(cat("batch index ", b, " is out of range for batch ", N));
  TView y = k.out(0, {R, C, PH, PW});
  if (y.numel == 0) return;
  std::vector<float> rv = read_floats(rois, k, "rois");

  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xd = x.p<T>();
    T* yd = y.p<T>();
    k.parallel(R, 1, [&](int64_t b, int64_t e) {
      struct Pc {
        int64_t p1, p2, p3, p4;
        double w1, w2, w3, w4;
      };
      std::vector<Pc> pcs;
      for (int64_t r = b; r < e; ++r) {
        const double off = half_pixel ? 0.5 : 0.0;
        double sw = rv[r * 4 + 0] * scale - off, sh = rv[r * 4 + 1] * scale - off;
        double ew = rv[r * 4 + 2] * scale - off, eh = rv[r * 4 + 3] * scale - off;
        double rw = ew - sw, rh = eh - sh;
        if (!half_pixel) {
          rw = std::max(rw, 1.0);
          rh = std::max(rh, 1.0);
        }
        const double bh = rh / static_cast<double>(PH), bw = rw / static_cast<double>(PW);
        const int64_t gh = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(rh / PH));
        const int64_t gw = sampling_ratio > 0 ? sampling_ratio : static_cast<int64_t>(std::ceil(rw / PW));
        const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
        // Precomputed bilinear taps of every sample of every bin (shared by all channels).
        pcs.clear();
        for (int64_t ph = 0; ph < PH; ++ph)
          for (int64_t pw = 0; pw < PW; ++pw)
            for (int64_t iy = 0; iy < gh; ++iy) {
              double yy = sh + ph * bh + (iy + 0.5) * bh / static_cast<double>(gh);
              for (int64_t ix = 0; ix < gw; ++ix) {
                double xx = sw + pw * bw + (ix + 0.5) * bw / static_cast<double>(gw);
                Pc pc{0, 0, 0, 0, 0, 0, 0, 0};
                if (yy < -1.0 || yy > static_cast<double>(H) || xx < -1.0 || xx > static_cast<double>(W)) {
                  pcs.push_back(pc);
                  continue;
                }
                if (yy <= 0) yy = 0;
                if (xx <= 0) xx = 0;
                int64_t yl = static_cast<int64_t>(yy), xl = static_cast<int64_t>(xx), yhi, xhi;
                if (yl >= H - 1) {
                  yhi = yl = H - 1;
                  yy = static_cast<double>(yl);
                } else {
                  yhi = yl + 1;
                }
                if (xl >= W - 1) {
                  xhi = xl = W - 1;
                  xx = static_cast<double>(xl);
                } else {
                  xhi = xl + 1;
                }
                double ly = yy - yl, lx = xx - xl, hy = 1 - ly, hx = 1 - lx;
                pc = {yl * W + xl, yl * W + xhi, yhi * W + xl, yhi * W + xhi, hy * hx, hy * lx, ly * hx, ly * lx};
                pcs.push_back(pc);
              }
            }
        for (int64_t c = 0; c < C; ++c) {
          const T* img = xd + (bidx[r] * C + c) * H * W;
          T* out = yd + (r * C + c) * PH * PW;
          size_t i = 0;
          for (int64_t p = 0; p < PH * PW; ++p) {
            double acc = max_mode ? -std::numeric_limits<double>::infinity() : 0.0;
            for (int64_t s = 0; s < gh * gw; ++s, ++i) {
              const Pc& pc = pcs[i];
              double v1 = pc.w1 * ld(img[pc.p1]), v2 = pc.w2 * ld(img[pc.p2]);
              double v3 = pc.w3 * ld(img[pc.p3]), v4 = pc.w4 * ld(img[pc.p4]);
              if (max_mode) acc = std::max(acc, std::max(std::max(v1, v2), std::max(v3, v4)));
              else acc += v1 + v2 + v3 + v4;
            }
            out[p] = st<T>(max_mode ? (gh * gw > 0 ? acc : 0.0) : acc / count);
          }
        }
      }
    });
  });
}

}  // namespace keel::ops::ref
