// Reference kernels: Conv, ConvTranspose, ConvInteger, QLinearConv (N-D, groups, dilations, pads, auto_pad) by
// im2col + GEMM in the calculation type (float for f16/bf16/f32, double for f64, int32 for the integer forms).
#include "ops/reference/kernels.h"
#include "ops/reference/nn_common.h"

namespace keel::ops::ref {
namespace {

// Kernel multi-index of flat kernel offset kidx.
inline void kernel_index(int64_t kidx, const Shape& kernel, int64_t* kk) {
  for (size_t d = kernel.size(); d-- > 0;) {
    kk[d] = kidx % kernel[d];
    kidx /= kernel[d];
  }
}

// col[(c*Ks + kidx), out_pos] = x[c, in_pos(out_pos, kidx)] or 0 in the padding, rows [r0, r1).
template <class C>
void im2col_rows(const C* x, const SpatialGeom& g, C* col, int64_t r0, int64_t r1) {
  const int r = g.r;
  const int64_t Ks = g.kernel_size(), in_size = g.in_size(), O = g.out_size();
  const int64_t out_last = g.out[r - 1], in_last = g.in[r - 1];
  const int64_t s_last = g.strides[r - 1], p_last = g.pads[r - 1], d_last = g.dilations[r - 1];
  const int64_t outer = O / std::max<int64_t>(out_last, 1);
  std::vector<int64_t> kk(r), o(r);
  for (int64_t rr = r0; rr < r1; ++rr) {
    int64_t c = rr / Ks;
    kernel_index(rr % Ks, g.kernel, kk.data());
    const C* xc = x + c * in_size;
    C* dst = col + rr * O;
    std::fill(o.begin(), o.end(), 0);
    const int64_t off_last = kk[r - 1] * d_last - p_last;
    for (int64_t ob = 0; ob < outer; ++ob) {
      bool valid = true;
      int64_t base = 0;
      for (int d = 0; d < r - 1; ++d) {
        int64_t id = o[d] * g.strides[d] - g.pads[d] + kk[d] * g.dilations[d];
        if (id < 0 || id >= g.in[d]) valid = false;
        base = base * g.in[d] + id;
      }
      C* drow = dst + ob * out_last;
      if (!valid) {
        std::fill(drow, drow + out_last, C(0));
      } else {
        const C* xrow = xc + base * in_last;
        for (int64_t ol = 0; ol < out_last; ++ol) {
          int64_t il = ol * s_last + off_last;
          drow[ol] = (il >= 0 && il < in_last) ? xrow[il] : C(0);
        }
      }
      for (int d = r - 2; d >= 0; --d) {
        if (++o[d] < g.out[d]) break;
        o[d] = 0;
      }
    }
  }
}

// Y[N, M, out...] = conv(X[N, Cin, in...], W[M, Cin/group, kernel...]) (+ bias[M] when given).
template <class C>
void conv_run(const Kctx& k, const SpatialGeom& g, int64_t N, int64_t Cin, int64_t M, int64_t group, const C* X,
              const C* W, const C* bias, C* Y) {
  const int64_t Ks = g.kernel_size(), Cg = Cin / group, Mg = M / group, K = Cg * Ks;
  const int64_t O = g.out_size(), I = g.in_size();
  bool direct = Ks == 1;
  for (int i = 0; i < g.r; ++i)
    if (g.strides[i] != 1 || g.pads[i] != 0 || g.pads[i + g.r] != 0) direct = false;
  auto finish = [&](C* yg, int64_t m0, int64_t m1, int64_t gi) {
    if (!bias) return;
    for (int64_t m = m0; m < m1; ++m) {
      C b = bias[gi * Mg + m];
      C* y = yg + m * O;
      for (int64_t j = 0; j < O; ++j) y[j] += b;
    }
  };
  const int64_t tasks = N * group;
  if (group > 1 && tasks >= 4) {
    // Many small groups (depthwise): parallel over (n, group), one im2col buffer per chunk.
    k.parallel(tasks, 1, [&](int64_t b, int64_t e) {
      std::vector<C> col(direct ? 0 : static_cast<size_t>(K * O));
      for (int64_t t = b; t < e; ++t) {
        int64_t n = t / group, gi = t % group;
        const C* xg = X + (n * Cin + gi * Cg) * I;
        const C* cp = xg;
        if (!direct) {
          im2col_rows(xg, g, col.data(), 0, K);
          cp = col.data();
        }
        C* yg = Y + (n * M + gi * Mg) * O;
        gemm_rows(0, Mg, O, K, W + gi * Mg * K, K, 1, cp, O, yg, O, false);
        finish(yg, 0, Mg, gi);
      }
    });
    return;
  }
  std::vector<C> col(direct ? 0 : static_cast<size_t>(K * O));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t gi = 0; gi < group; ++gi) {
      const C* xg = X + (n * Cin + gi * Cg) * I;
      const C* cp = xg;
      if (!direct) {
        k.parallel(K, std::max<int64_t>(1, 65536 / std::max<int64_t>(O, 1)),
                   [&](int64_t b, int64_t e) { im2col_rows(xg, g, col.data(), b, e); });
        cp = col.data();
      }
      C* yg = Y + (n * M + gi * Mg) * O;
      const C* wg = W + gi * Mg * K;
      k.parallel(Mg, std::max<int64_t>(1, 65536 / std::max<int64_t>(O * K, 1)), [&](int64_t b, int64_t e) {
        gemm_rows(b, e, O, K, wg, K, 1, cp, O, yg, O, false);
        finish(yg, b, e, gi);
      });
    }
  }
}

// Validates X/W shapes for a Conv-like node and returns its geometry; fills N, Cin, M.
SpatialGeom conv_geom(const Kctx& k, const TView& x, const TView& w, int64_t group, int64_t& N, int64_t& Cin,
                      int64_t& M) {
  if (x.ndim() < 3) k.invalid(cat("input X must have rank >= 3 (N, C, spatial...), got ", shape_str(x.shape)));
  if (w.ndim() != x.ndim())
    k.invalid(cat("input rank ", x.ndim(), " does not match weight rank ", w.ndim(), " (X ", shape_str(x.shape), ", W ",
                  shape_str(w.shape), ")"));
  if (group <= 0) k.invalid(cat("group must be positive, got ", group));
  N = x.shape[0];
  Cin = x.shape[1];
  M = w.shape[0];
  if (Cin != w.shape[1] * group)
    k.invalid(cat("input channels ", Cin, " != weight channels ", w.shape[1], " x group ", group, " (X ",
                  shape_str(x.shape), ", W ", shape_str(w.shape), ")"));
  if (M % group != 0) k.invalid(cat("output channels ", M, " are not divisible by group ", group));
  Shape in(x.shape.begin() + 2, x.shape.end());
  Shape kernel(w.shape.begin() + 2, w.shape.end());
  if (auto ks = k.attr_ints("kernel_shape"))
    if (*ks != kernel)
      k.invalid(cat("kernel_shape ", shape_str(*ks), " does not match the weight's spatial shape ", shape_str(kernel)));
  return spatial_geom(k, in, kernel, true, false);
}

Shape conv_out_shape(int64_t N, int64_t M, const SpatialGeom& g) {
  Shape s = {N, M};
  s.insert(s.end(), g.out.begin(), g.out.end());
  return s;
}

// Zero point of a quantized tensor at index i (scalar or per-channel), as int32.
int32_t zero_point_at(const std::optional<TView>& zp, int64_t i, const Kctx& k) {
  if (!zp || zp->numel == 0) return 0;
  return static_cast<int32_t>(get_i64(*zp, zp->numel == 1 ? 0 : i, k));
}

// Converts an 8-bit quantized tensor to int32 minus its zero point; per_channel_block > 0 applies zero points
// per slice of that many elements (W's output-channel axis).
std::vector<int32_t> dequant_i32(const TView& t, const std::optional<TView>& zp, int64_t block, const Kctx& k,
                                 const char* what) {
  std::vector<int32_t> r(static_cast<size_t>(t.numel));
  if (zp && zp->numel > 1 && (block <= 0 || zp->numel * block != t.numel))
    k.invalid(cat(what, " zero point has ", zp->numel, " entries, which does not match its tensor"));
  std::vector<int64_t> zps = zp ? read_ints(*zp, k, what) : std::vector<int64_t>();
  dispatch(
      TL<uint8_t, int8_t>{}, t.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* p = t.p<T>();
        for (int64_t i = 0; i < t.numel; ++i) {
          int64_t z = zps.empty() ? 0 : zps[zps.size() == 1 ? 0 : i / block];
          r[i] = static_cast<int32_t>(p[i]) - static_cast<int32_t>(z);
        }
      },
      what);
  return r;
}

}  // namespace

void op_conv(Kctx& k) {
  TView x = k.in(0), w = k.in(1);
  auto b = k.opt_in(2);
  int64_t group = k.attr_i("group", 1), N, Cin, M;
  SpatialGeom g = conv_geom(k, x, w, group, N, Cin, M);
  if (x.dtype != w.dtype) k.invalid("X and W have different dtypes");
  if (b && (b->numel != M || b->ndim() != 1))
    k.invalid(cat("bias shape ", shape_str(b->shape), " does not match output channels ", M));
  TView y = k.out(0, conv_out_shape(N, M, g));
  if (y.numel == 0) return;
  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      conv_run<T>(k, g, N, Cin, M, group, x.p<T>(), w.p<T>(), b ? b->template p<T>() : nullptr, y.p<T>());
    } else {
      auto xf = to_calc<float>(x, k, "X"), wf = to_calc<float>(w, k, "W");
      std::vector<float> bf = b ? to_calc<float>(*b, k, "B") : std::vector<float>();
      std::vector<float> yf(static_cast<size_t>(y.numel));
      conv_run<float>(k, g, N, Cin, M, group, xf.data(), wf.data(), b ? bf.data() : nullptr, yf.data());
      for (int64_t i = 0; i < y.numel; ++i) y.p<T>()[i] = st<T>(yf[i]);
    }
  });
}

void op_conv_integer(Kctx& k) {
  TView x = k.in(0), w = k.in(1);
  auto xzp = k.opt_in(2), wzp = k.opt_in(3);
  int64_t group = k.attr_i("group", 1), N, Cin, M;
  SpatialGeom g = conv_geom(k, x, w, group, N, Cin, M);
  if (xzp && xzp->numel != 1) k.invalid("x_zero_point must be a scalar");
  TView y = k.out(0, conv_out_shape(N, M, g));
  if (y.dtype != KEEL_DTYPE_I32) k.bad_dtype(y.dtype, "output");
  if (y.numel == 0) return;
  auto xi = dequant_i32(x, xzp, 0, k, "x");
  auto wi = dequant_i32(w, wzp, M > 0 ? w.numel / M : 0, k, "w");
  conv_run<int32_t>(k, g, N, Cin, M, group, xi.data(), wi.data(), nullptr, y.p<int32_t>());
}

void op_qlinear_conv(Kctx& k) {
  TView x = k.in(0), xs = k.in(1), w = k.in(3), ws = k.in(4), ys = k.in(6);
  auto xzp = k.opt_in(2), wzp = k.opt_in(5), yzp = k.opt_in(7), b = k.opt_in(8);
  int64_t group = k.attr_i("group", 1), N, Cin, M;
  SpatialGeom g = conv_geom(k, x, w, group, N, Cin, M);
  if (xs.numel != 1 || ys.numel != 1) k.invalid("x_scale and y_scale must be scalars");
  if (ws.numel != 1 && ws.numel != M) k.invalid(cat("w_scale must be a scalar or have ", M, " entries"));
  if (b && b->numel != M) k.invalid(cat("bias must have ", M, " entries"));
  TView y = k.out(0, conv_out_shape(N, M, g));
  if (y.numel == 0) return;
  auto xi = dequant_i32(x, xzp, 0, k, "x");
  auto wi = dequant_i32(w, wzp, M > 0 ? w.numel / M : 0, k, "w");
  std::vector<int32_t> acc(static_cast<size_t>(y.numel));
  std::vector<int32_t> bias;
  if (b) {
    if (b->dtype != KEEL_DTYPE_I32) k.invalid("bias must be int32");
    bias.assign(b->p<int32_t>(), b->p<int32_t>() + M);
  }
  conv_run<int32_t>(k, g, N, Cin, M, group, xi.data(), wi.data(), b ? bias.data() : nullptr, acc.data());
  float x_scale = static_cast<float>(get_f64(xs, 0, k)), y_scale = static_cast<float>(get_f64(ys, 0, k));
  int32_t y_zero = zero_point_at(yzp, 0, k);
  const int64_t O = g.out_size();
  dispatch(
      TL<uint8_t, int8_t>{}, y.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        T* py = y.p<T>();
        for (int64_t i = 0; i < y.numel; ++i) {
          int64_t m = (i / O) % M;
          float w_scale = static_cast<float>(get_f64(ws, ws.numel == 1 ? 0 : m, k));
          float v =
              std::nearbyint(static_cast<float>(acc[i]) * (x_scale * w_scale / y_scale)) + static_cast<float>(y_zero);
          if (!(v == v)) v = 0;
          v = std::min<float>(std::max<float>(v, std::numeric_limits<T>::lowest()), std::numeric_limits<T>::max());
          py[i] = static_cast<T>(v);
        }
      },
      "output");
}

void op_conv_transpose(Kctx& k) {
  TView x = k.in(0), w = k.in(1);
  auto b = k.opt_in(2);
  if (x.ndim() < 3) k.invalid(cat("input X must have rank >= 3, got ", shape_str(x.shape)));
  if (w.ndim() != x.ndim()) k.invalid(cat("input rank ", x.ndim(), " does not match weight rank ", w.ndim()));
  if (x.dtype != w.dtype) k.invalid("X and W have different dtypes");
  const int r = x.ndim() - 2;
  int64_t group = k.attr_i("group", 1);
  if (group <= 0) k.invalid("group must be positive");
  const int64_t N = x.shape[0], Cin = x.shape[1];
  if (w.shape[0] != Cin) k.invalid(cat("weight dim 0 (", w.shape[0], ") must equal input channels ", Cin));
  if (Cin % group != 0) k.invalid(cat("input channels ", Cin, " are not divisible by group ", group));
  const int64_t Mg = w.shape[1], M = Mg * group, Cg = Cin / group;
  SpatialGeom g;
  g.r = r;
  g.in.assign(x.shape.begin() + 2, x.shape.end());
  g.kernel.assign(w.shape.begin() + 2, w.shape.end());
  if (auto ks = k.attr_ints("kernel_shape"))
    if (*ks != g.kernel) k.invalid("kernel_shape does not match the weight's spatial shape");
  g.strides = k.attr_ints_or("strides", Shape(r, 1));
  g.dilations = k.attr_ints_or("dilations", Shape(r, 1));
  Shape out_pad = k.attr_ints_or("output_padding", Shape(r, 0));
  if (static_cast<int>(g.strides.size()) != r || static_cast<int>(g.dilations.size()) != r ||
      static_cast<int>(out_pad.size()) != r)
    k.invalid("strides, dilations and output_padding must have one entry per spatial dimension");
  for (int i = 0; i < r; ++i)
    if (g.strides[i] <= 0 || g.dilations[i] <= 0) k.invalid("strides and dilations must be positive");
  std::string auto_pad = k.attr_s("auto_pad", "NOTSET");
  const sdk::AutoPad ap = sdk::auto_pad_of(auto_pad);
  auto out_shape_attr = k.attr_ints("output_shape");
  g.pads.assign(2 * r, 0);
  g.out.resize(r);
  if (out_shape_attr || sdk::is_same(ap)) {
    Shape target(r);
    if (out_shape_attr) {
      Shape os = *out_shape_attr;
      if (static_cast<int>(os.size()) == r + 2) os.erase(os.begin(), os.begin() + 2);
      if (static_cast<int>(os.size()) != r) k.invalid("output_shape must have one entry per spatial dimension");
      target = os;
    } else {
      for (int i = 0; i < r; ++i) target[i] = g.in[i] * g.strides[i];
    }
    for (int i = 0; i < r; ++i) {
      const int64_t full =
          sdk::transposed_extent(g.in[i], g.strides[i], out_pad[i], sdk::dilated_extent(g.kernel[i], g.dilations[i]));
      sdk::transposed_pads(ap, full - target[i], &g.pads[i], &g.pads[i + r]);
      g.out[i] = target[i];
    }
  } else {
    if (auto_pad != "VALID") g.pads = k.attr_ints_or("pads", Shape(2 * r, 0));
    if (static_cast<int>(g.pads.size()) != 2 * r) k.invalid("pads must have 2 entries per spatial dimension");
    for (int i = 0; i < r; ++i) {
      g.out[i] =
          sdk::transposed_extent(g.in[i], g.strides[i], out_pad[i], sdk::dilated_extent(g.kernel[i], g.dilations[i])) -
          g.pads[i] - g.pads[i + r];
      if (g.out[i] <= 0) k.invalid(cat("computed output spatial size ", g.out[i], " is not positive"));
    }
  }
  if (b && b->numel != M) k.invalid(cat("bias must have ", M, " entries"));
  TView y = k.out(0, conv_out_shape(N, M, g));
  if (y.numel == 0) return;
  const int64_t Ks = g.kernel_size(), I = g.in_size(), O = g.out_size();
  auto run = [&](auto* X, auto* W, auto* B, auto* Y) {
    using C = std::remove_const_t<std::remove_pointer_t<decltype(X)>>;
    std::fill(Y, Y + y.numel, C(0));
    std::vector<C> col(static_cast<size_t>(Mg * Ks * I));
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t gi = 0; gi < group; ++gi) {
        const C* xg = X + (n * Cin + gi * Cg) * I;
        const C* wg = W + gi * Cg * Mg * Ks;
        // col[mk, i] = sum_c W[c, mk] * X[c, i]
        k.parallel(Mg * Ks, 1, [&](int64_t b0, int64_t e0) {
          gemm_rows(b0, e0, I, Cg, wg, 1, Mg * Ks, xg, I, col.data(), I, false);
        });
        C* yg = Y + (n * M + gi * Mg) * O;
        k.parallel(Mg, 1, [&](int64_t b0, int64_t e0) {
          std::vector<int64_t> kk(r), ii(r);
          for (int64_t m = b0; m < e0; ++m) {
            C* ym = yg + m * O;
            for (int64_t kidx = 0; kidx < Ks; ++kidx) {
              kernel_index(kidx, g.kernel, kk.data());
              const C* src = col.data() + (m * Ks + kidx) * I;
              std::fill(ii.begin(), ii.end(), 0);
              for (int64_t ip = 0; ip < I; ++ip) {
                int64_t off = 0;
                bool ok = true;
                for (int d = 0; d < r; ++d) {
                  int64_t od = ii[d] * g.strides[d] - g.pads[d] + kk[d] * g.dilations[d];
                  if (od < 0 || od >= g.out[d]) {
                    ok = false;
                    break;
                  }
                  off = off * g.out[d] + od;
                }
                if (ok) ym[off] += src[ip];
                for (int d = r - 1; d >= 0; --d) {
                  if (++ii[d] < g.in[d]) break;
                  ii[d] = 0;
                }
              }
            }
            if (B)
              for (int64_t j = 0; j < O; ++j) ym[j] += B[gi * Mg + m];
          }
        });
      }
    }
  };
  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      run(x.p<T>(), w.p<T>(), b ? b->template p<T>() : static_cast<T*>(nullptr), y.p<T>());
    } else {
      auto xf = to_calc<float>(x, k, "X"), wf = to_calc<float>(w, k, "W");
      std::vector<float> bf = b ? to_calc<float>(*b, k, "B") : std::vector<float>();
      std::vector<float> yf(static_cast<size_t>(y.numel));
      run(xf.data(), wf.data(), b ? bf.data() : static_cast<float*>(nullptr), yf.data());
      for (int64_t i = 0; i < y.numel; ++i) y.p<T>()[i] = st<T>(yf[i]);
    }
  });
}

}  // namespace keel::ops::ref
