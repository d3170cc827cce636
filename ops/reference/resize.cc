// Reference kernels: Resize (opset 10 and 11+; nearest / linear / cubic, every coordinate transformation mode,
// tf_crop_and_resize extrapolation, exclude_outside) and Upsample (opset 7-9).
//
// Each output dimension is interpolated separately: for each output index we list (input index, weight) taps, and
// an output element is the sum over the product of its per-dimension taps (N-D linear/cubic = separable).
#include "ops/reference/kernels.h"

namespace keel::ops::ref {
namespace {

struct Tap {
  int64_t index;
  double weight;
};

struct DimTaps {
  std::vector<std::vector<Tap>> taps;  // per output index
  std::vector<bool> outside;           // per output index: extrapolate (tf_crop_and_resize)
};

enum class Mode { kNearest, kLinear, kCubic };

struct ResizeParams {
  Mode mode = Mode::kNearest;
  std::string coord = "half_pixel";
  std::string nearest = "round_prefer_floor";
  double cubic_a = -0.75;
  bool exclude_outside = false;
  double extrapolation = 0.0;
};

// Input coordinate of output index o, as the ONNX reference computes it (onnx/backend/test/case/node/resize.py):
// the "output width" in align_corners / tf_crop_and_resize / pytorch_half_pixel is scale * in_len (unfloored).
double transform(const ResizeParams& p, int64_t o, double scale, int64_t in_len, double roi_start, double roi_end) {
  double x = static_cast<double>(o);
  double out_w = scale * static_cast<double>(in_len);
  double in_m1 = static_cast<double>(in_len - 1);
  const std::string& c = p.coord;
  if (c == "pytorch_half_pixel") return out_w == 1.0 ? -0.5 : (x + 0.5) / scale - 0.5;
  if (c == "align_corners") return out_w == 1.0 ? 0.0 : x * in_m1 / (out_w - 1.0);
  if (c == "asymmetric") return x / scale;
  if (c == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (c == "tf_crop_and_resize") {
    double v = out_w == 1.0 ? (roi_end - roi_start) * in_m1 / 2.0 : x * (roi_end - roi_start) * in_m1 / (out_w - 1.0);
    return v + roi_start * in_m1;
  }
  return (x + 0.5) / scale - 0.5;  // half_pixel
}

DimTaps dim_taps(const Kctx& k, const ResizeParams& p, int64_t in_len, int64_t out_len, double scale, double roi_start,
                 double roi_end) {
  DimTaps d;
  d.taps.resize(static_cast<size_t>(out_len));
  d.outside.assign(static_cast<size_t>(out_len), false);
  const bool crop = p.coord == "tf_crop_and_resize";
  auto clampi = [&](int64_t i) { return std::clamp<int64_t>(i, 0, in_len - 1); };
  for (int64_t o = 0; o < out_len; ++o) {
    double x = transform(p, o, scale, in_len, roi_start, roi_end);
    if (crop && (x < 0 || x > static_cast<double>(in_len - 1))) {
      d.outside[o] = true;
      continue;
    }
    auto& t = d.taps[o];
    // Keep the coordinate in a range where integer casts are defined; taps are clamped to the edges anyway.
    x = std::clamp(x, -8.0, static_cast<double>(in_len) + 8.0);
    if (!(x == x)) x = 0;
    if (p.mode == Mode::kNearest) {
      double f = std::floor(x);
      int64_t i;
      const std::string& nm = p.nearest;
      if (nm == "simple") i = scale < 1.0 ? static_cast<int64_t>(std::ceil(x)) : static_cast<int64_t>(f);
      else if (nm == "floor") i = static_cast<int64_t>(f);
      else if (nm == "ceil") i = static_cast<int64_t>(std::ceil(x));
      else if (nm == "round_prefer_ceil")
        i = x == f + 0.5 ? static_cast<int64_t>(f + 1) : static_cast<int64_t>(std::round(x));
      else i = x == f + 0.5 ? static_cast<int64_t>(f) : static_cast<int64_t>(std::round(x));
      t.push_back({clampi(i), 1.0});
    } else if (p.mode == Mode::kLinear) {
      double xc = std::clamp(x, 0.0, static_cast<double>(in_len - 1));
      int64_t i0 = static_cast<int64_t>(std::floor(xc));
      double r = xc - static_cast<double>(i0);
      t.push_back({clampi(i0), 1.0 - r});
      if (r != 0.0) t.push_back({clampi(i0 + 1), r});
    } else {
      int64_t i0 = static_cast<int64_t>(std::floor(x));
      double r = x - static_cast<double>(i0);
      const double A = p.cubic_a;
      double c[4] = {((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A, ((A + 2) * r - (A + 3)) * r * r + 1,
                     ((A + 2) * (1 - r) - (A + 3)) * (1 - r) * (1 - r) + 1,
                     ((A * ((1 - r) + 1) - 5 * A) * ((1 - r) + 1) + 8 * A) * ((1 - r) + 1) - 4 * A};
      double sum = 0;
      for (int j = 0; j < 4; ++j) {
        int64_t idx = i0 - 1 + j;
        if (p.exclude_outside && (idx < 0 || idx >= in_len)) c[j] = 0;
        sum += c[j];
      }
      for (int j = 0; j < 4; ++j) {
        if (c[j] == 0) continue;
        double w = p.exclude_outside && sum != 0 ? c[j] / sum : c[j];
        t.push_back({clampi(i0 - 1 + j), w});
      }
    }
  }
  (void)k;
  return d;
}

void resize_run(Kctx& k, const TView& x, const ResizeParams& p, const std::vector<double>& scales, const Shape& os,
                const std::vector<double>& roi) {
  int r = x.ndim();
  for (int d = 0; d < r; ++d)
    if (x.shape[d] == 0 && os[d] > 0) k.invalid("cannot resize an empty dimension to a non-empty one");
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  std::vector<DimTaps> dims;
  for (int d = 0; d < r; ++d) {
    double rs = roi.empty() ? 0.0 : roi[d], re = roi.empty() ? 1.0 : roi[d + r];
    dims.push_back(dim_taps(k, p, x.shape[d], os[d], scales[d], rs, re));
  }
  Shape xs = strides_of(x.shape), ys = strides_of(os);
  dispatch(NumTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.p<T>();
    T* py = y.p<T>();
    k.parallel(y.numel, 4096, [&](int64_t b, int64_t e) {
      std::vector<int64_t> oi(r), ti(r);
      for (int64_t i = b; i < e; ++i) {
        int64_t rem = i;
        bool outside = false;
        for (int d = 0; d < r; ++d) {
          oi[d] = rem / ys[d];
          rem %= ys[d];
          if (dims[d].outside[oi[d]]) outside = true;
        }
        if (outside) {
          py[i] = st<T>(p.extrapolation);
          continue;
        }
        // Sum over the product of the per-dimension taps.
        double acc = 0;
        std::fill(ti.begin(), ti.end(), 0);
        while (true) {
          double w = 1;
          int64_t off = 0;
          for (int d = 0; d < r; ++d) {
            const Tap& t = dims[d].taps[oi[d]][ti[d]];
            w *= t.weight;
            off += t.index * xs[d];
          }
          acc += w * static_cast<double>(ld(px[off]));
          int d = r - 1;
          for (; d >= 0; --d) {
            if (++ti[d] < static_cast<int64_t>(dims[d].taps[oi[d]].size())) break;
            ti[d] = 0;
          }
          if (d < 0) break;
        }
        if constexpr (std::is_integral_v<T>) {
          if (p.mode == Mode::kNearest) py[i] = static_cast<T>(acc);
          else {
            double v = std::nearbyint(acc);
            v = std::clamp(v, static_cast<double>(std::numeric_limits<T>::lowest()),
                           static_cast<double>(std::numeric_limits<T>::max()));
            py[i] = static_cast<T>(v);
          }
        } else {
          py[i] = st<T>(acc);
        }
      }
    });
  });
}

Mode parse_mode(const Kctx& k, const std::string& m) {
  if (m == "nearest") return Mode::kNearest;
  if (m == "linear" || m == "bilinear" || m == "trilinear") return Mode::kLinear;
  if (m == "cubic" || m == "bicubic") return Mode::kCubic;
  k.invalid(cat("unknown mode '", m, "'"));
}

// Opset 7-10 semantics: asymmetric coordinates, nearest rounds down ("simple"), output = floor(in * scale).
void legacy_upsample(Kctx& k, const TView& x, const std::vector<float>& sc) {
  if (static_cast<int>(sc.size()) != x.ndim()) k.invalid(cat("scales has ", sc.size(), " entries for rank ", x.ndim()));
  ResizeParams p;
  p.mode = parse_mode(k, k.attr_s("mode", "nearest"));
  if (p.mode == Mode::kCubic) k.invalid("cubic mode needs opset 11");
  p.coord = "asymmetric";
  p.nearest = "simple";
  std::vector<double> scales(sc.begin(), sc.end());
  Shape os(x.ndim());
  for (int d = 0; d < x.ndim(); ++d) {
    double len = std::floor(static_cast<double>(x.shape[d]) * sc[d]);
    if (!(sc[d] > 0) || !(len < 9.0e15)) k.invalid("scales must be positive and finite");
    os[d] = static_cast<int64_t>(len);
  }
  resize_run(k, x, p, scales, os, {});
}

}  // namespace

void op_upsample(Kctx& k) {
  TView x = k.in(0);
  std::vector<float> sc;
  if (auto a = k.attr_floats("scales")) sc = *a;
  else sc = read_floats(k.in(1), k, "scales");
  legacy_upsample(k, x, sc);
}

void op_resize(Kctx& k) {
  TView x = k.in(0);
  int r = x.ndim();
  if (k.opset() == 10) {
    legacy_upsample(k, x, read_floats(k.in(1), k, "scales"));
    return;
  }
  if (k.attr_i("antialias", 0) != 0) k.unimpl("antialias=1 is not handled");
  if (k.attr_ints("axes")) k.unimpl("the axes attribute (opset 18) is not handled");
  ResizeParams p;
  p.mode = parse_mode(k, k.attr_s("mode", "nearest"));
  p.coord = k.attr_s("coordinate_transformation_mode", "half_pixel");
  p.nearest = k.attr_s("nearest_mode", "round_prefer_floor");
  p.cubic_a = k.attr_f("cubic_coeff_a", -0.75f);
  p.exclude_outside = k.attr_i("exclude_outside", 0) != 0;
  p.extrapolation = k.attr_f("extrapolation_value", 0.0f);
  static const char* kCoords[] = {"half_pixel", "pytorch_half_pixel",   "align_corners",
                                  "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"};
  if (std::find_if(std::begin(kCoords), std::end(kCoords), [&](const char* c) { return p.coord == c; }) ==
      std::end(kCoords))
    k.invalid(cat("unknown coordinate_transformation_mode '", p.coord, "'"));
  std::vector<double> roi;
  if (p.coord == "tf_crop_and_resize") {
    if (!k.has_input(1)) k.invalid("tf_crop_and_resize needs roi");
    auto rv = read_floats(k.in(1), k, "roi");
    if (static_cast<int>(rv.size()) != 2 * r) k.invalid(cat("roi has ", rv.size(), " entries; expected ", 2 * r));
    roi.assign(rv.begin(), rv.end());
  }
  std::optional<TView> scales_t = k.opt_in(2), sizes_t = k.opt_in(3);
  if (scales_t && scales_t->numel == 0) scales_t.reset();
  if (sizes_t && sizes_t->numel == 0) sizes_t.reset();
  if (!!scales_t == !!sizes_t) k.invalid("exactly one of scales and sizes must be given");
  std::vector<double> scales(r);
  Shape os(r);
  if (scales_t) {
    auto sc = read_floats(*scales_t, k, "scales");
    if (static_cast<int>(sc.size()) != r) k.invalid(cat("scales has ", sc.size(), " entries for rank ", r));
    for (int d = 0; d < r; ++d) {
      scales[d] = sc[d];
      double len = std::floor(static_cast<double>(x.shape[d]) * (roi.empty() ? 1.0 : roi[d + r] - roi[d]) *
                              static_cast<double>(sc[d]));
      if (!(sc[d] > 0) || !(len < 9.0e15)) k.invalid("scales must be positive and finite");
      os[d] = static_cast<int64_t>(std::max(len, 0.0));
    }
  } else {
    auto sz = read_ints(*sizes_t, k, "sizes");
    if (static_cast<int>(sz.size()) != r) k.invalid(cat("sizes has ", sz.size(), " entries for rank ", r));
    std::string policy = k.attr_s("keep_aspect_ratio_policy", "stretch");
    if (policy != "stretch") k.unimpl("keep_aspect_ratio_policy other than stretch");
    for (int d = 0; d < r; ++d) {
      if (sz[d] < 0) k.invalid("sizes must be non-negative");
      os[d] = sz[d];
      scales[d] =
          x.shape[d] == 0 ? 1.0 : static_cast<double>(static_cast<float>(sz[d]) / static_cast<float>(x.shape[d]));
    }
  }
  resize_run(k, x, p, scales, os, roi);
}

}  // namespace keel::ops::ref
