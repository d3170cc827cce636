// Reference kernels: QuantizeLinear, DequantizeLinear (per-tensor and per-axis), DynamicQuantizeLinear.
// (MatMulInteger / QLinearMatMul live in math_gemm.cc, ConvInteger / QLinearConv in nn_conv.cc.)
#include "ops/reference/kernels.h"

namespace keel::ops::ref {
namespace {

// Index into a per-axis parameter for element i of x (0 for per-tensor parameters).
struct AxisIndexer {
  int64_t inner = 1, len = 1;
  bool per_axis = false;
  int64_t operator()(int64_t i) const { return per_axis ? (i / inner) % len : 0; }
};

AxisIndexer axis_indexer(const Kctx& k, const TView& x, const TView& scale, const std::optional<TView>& zp) {
  AxisIndexer ix;
  if (scale.numel == 1 && scale.ndim() <= 1) {
    if (zp && zp->numel != 1) k.invalid("zero point must be a scalar when the scale is");
    return ix;
  }
  if (scale.ndim() != 1) k.unimpl("blocked quantization (scale of rank > 1) is not handled");
  int axis = k.axis(k.attr_i("axis", 1), x.ndim());
  ix.per_axis = true;
  ix.len = x.shape[axis];
  for (int d = axis + 1; d < x.ndim(); ++d) ix.inner *= x.shape[d];
  if (scale.numel != ix.len) k.invalid(cat("scale has ", scale.numel, " entries; axis ", axis, " of x has ", ix.len));
  if (zp && zp->numel != ix.len) k.invalid("zero point and scale have different lengths");
  return ix;
}

template <class Q>
Q saturate_round(double v) {
  if (!(v == v)) return Q(0);
  v = std::nearbyint(v);
  v = std::min<double>(std::max<double>(v, static_cast<double>(std::numeric_limits<Q>::lowest())),
                       static_cast<double>(std::numeric_limits<Q>::max()));
  return static_cast<Q>(v);
}

}  // namespace

void op_quantize_linear(Kctx& k) {
  TView x = k.in(0), scale = k.in(1);
  auto zp = k.opt_in(2);
  AxisIndexer ix = axis_indexer(k, x, scale, zp);
  auto sc = read_floats(scale, k, "y_scale");
  TView y = k.out(0, x.shape);
  std::vector<int64_t> z = zp ? read_ints(*zp, k, "y_zero_point") : std::vector<int64_t>();
  if (zp && zp->dtype != y.dtype) k.invalid("y_zero_point dtype differs from the output dtype");
  dispatch(
      TL<uint8_t, int8_t, uint16_t, int16_t, int32_t>{}, y.dtype, k,
      [&](auto qtag) {
        using Q = typename decltype(qtag)::type;
        dispatch(FloatTs{} + TL<int32_t>{}, x.dtype, k, [&](auto tag) {
          using T = typename decltype(tag)::type;
          const T* px = x.p<T>();
          Q* py = y.p<Q>();
          for (int64_t i = 0; i < x.numel; ++i) {
            int64_t a = ix(i);
            // Division in float, as ONNX Runtime and the ONNX reference do.
            float q = static_cast<float>(ld(px[i])) / sc[a];
            double v = std::nearbyint(static_cast<double>(q)) + static_cast<double>(z.empty() ? 0 : z[a]);
            py[i] = saturate_round<Q>(v);
          }
        });
      },
      "output");
}

void op_dequantize_linear(Kctx& k) {
  TView x = k.in(0), scale = k.in(1);
  auto zp = k.opt_in(2);
  AxisIndexer ix = axis_indexer(k, x, scale, zp);
  auto sc = read_floats(scale, k, "x_scale");
  std::vector<int64_t> z = zp ? read_ints(*zp, k, "x_zero_point") : std::vector<int64_t>();
  if (zp && zp->dtype != x.dtype) k.invalid("x_zero_point dtype differs from x");
  TView y = k.out(0, x.shape);
  dispatch(TL<uint8_t, int8_t, uint16_t, int16_t, int32_t>{}, x.dtype, k, [&](auto qtag) {
    using Q = typename decltype(qtag)::type;
    const Q* px = x.p<Q>();
    dispatch(
        FloatTs{}, y.dtype, k,
        [&](auto tag) {
          using T = typename decltype(tag)::type;
          for (int64_t i = 0; i < x.numel; ++i) {
            int64_t a = ix(i);
            int64_t d = static_cast<int64_t>(px[i]) - (z.empty() ? 0 : z[a]);
            y.p<T>()[i] = st<T>(static_cast<float>(d) * sc[a]);
          }
        },
        "output");
  });
}

void op_dynamic_quantize_linear(Kctx& k) {
  TView x = k.in(0);
  if (x.dtype != KEEL_DTYPE_F32) k.bad_dtype(x.dtype);
  TView y = k.out(0, x.shape), ys = k.out(1, {}), yz = k.out(2, {});
  if (y.dtype != KEEL_DTYPE_U8 || yz.dtype != KEEL_DTYPE_U8) k.unimpl("only uint8 output is handled");
  const float* px = x.p<float>();
  float mn = 0, mx = 0;
  for (int64_t i = 0; i < x.numel; ++i) {
    mn = std::min(mn, px[i]);
    mx = std::max(mx, px[i]);
  }
  float scale = (mx - mn) / 255.0f;
  uint8_t zero = 0;
  if (scale != 0.0f) zero = saturate_round<uint8_t>(static_cast<double>((0.0f - mn) / scale));
  ys.p<float>()[0] = scale;
  yz.p<uint8_t>()[0] = zero;
  for (int64_t i = 0; i < x.numel; ++i) {
    if (scale == 0.0f) {
      y.p<uint8_t>()[i] = zero;
      continue;
    }
    double v = std::nearbyint(static_cast<double>(px[i] / scale)) + zero;
    y.p<uint8_t>()[i] = saturate_round<uint8_t>(v);
  }
}

}  // namespace keel::ops::ref
