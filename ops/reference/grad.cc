// Reference kernels of the keel-domain backward (training) ops that ops/gradients.cc emits: ConvGrad, MaxPoolGrad,
// AveragePoolGrad, ReluGrad, SigmoidGrad, TanhGrad, GeluGrad, LeakyReluGrad, SoftmaxCrossEntropyLossGrad,
// BatchNormTraining, BatchNormGrad, LayerNormGrad, GatherGrad, DropoutMask, which eager dropout emits, AdamStep,
// which Adam::step runs on a device, and CheckFiniteAndUnscale, GradScaler's (schemas in ops/schemas.cc). They are the
// oracle the device conformance suite checks other devices' versions against: plain loops, f64 math for f64 tensors and
// f32 math for f32/f16/bf16.
#include "ops/reference/grad_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>

#include "core/base/status.h"
#include "core/base/target_clones.h"
#include "ops/reference/kernels.h"
#include "ops/reference/nn_common.h"

namespace keel::ops::ref {
namespace {

template <class T>
using Calc = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Loads a float tensor as C values.
template <class C>
std::vector<C> load(const TView& t, const Kctx& k, const char* what) {
  std::vector<C> r(static_cast<size_t>(t.numel));
  dispatch(
      FloatTs{}, t.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < t.numel; ++i) r[i] = static_cast<C>(ld(t.p<T>()[i]));
      },
      what);
  return r;
}
template <class C>
void store(const TView& t, const std::vector<C>& v, const Kctx& k) {
  dispatch(
      FloatTs{}, t.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < t.numel; ++i) t.p<T>()[i] = st<T>(v[i]);
      },
      "output");
}
// Runs f.template operator()<C>() with C = double for f64 inputs, float otherwise.
template <class F>
void with_calc(int32_t dt, const Kctx& k, F&& f) {
  if (dt == KEEL_DTYPE_F64) f(Tag<double>{});
  else if (dt == KEEL_DTYPE_F32 || dt == KEEL_DTYPE_F16 || dt == KEEL_DTYPE_BF16) f(Tag<float>{});
  else k.bad_dtype(dt);
}

// --- elementwise backward ---
template <class G>
void unary_grad(Kctx& k, G&& g) {
  TView dy = k.in(0), v = k.in(1);
  if (dy.shape != v.shape) k.invalid(cat("dY ", shape_str(dy.shape), " and ", shape_str(v.shape), " differ in shape"));
  if (dy.dtype != v.dtype) k.invalid("dY and its partner input differ in dtype");
  TView dx = k.out(0, dy.shape);
  with_calc(dy.dtype, k, [&](auto tag) {
    using C = typename decltype(tag)::type;
    auto a = load<C>(dy, k, "dY"), b = load<C>(v, k, "input 1");
    std::vector<C> r(a.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = g(a[i], b[i]);
    store(dx, r, k);
  });
}
void op_relu_grad(Kctx& k) {
  unary_grad(k, [](auto dy, auto y) { return y > 0 ? dy : decltype(dy)(0); });
}
void op_sigmoid_grad(Kctx& k) {
  unary_grad(k, [](auto dy, auto y) { return dy * y * (1 - y); });
}
void op_tanh_grad(Kctx& k) {
  unary_grad(k, [](auto dy, auto y) { return dy * (1 - y * y); });
}
void op_gelu_grad(Kctx& k) {
  const std::string approximate = k.attr_s("approximate", "none");
  if (approximate == "tanh") {
    // d/dx 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx.
    unary_grad(k, [](auto dy, auto x) {
      using C = decltype(dy);
      const C k0 = C(0.7978845608028654), k1 = C(0.044715);
      const C t = std::tanh(k0 * (x + k1 * x * x * x));
      return dy * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * k0 * (C(1) + C(3) * k1 * x * x));
    });
    return;
  }
  if (approximate != "none") k.invalid("GeluGrad: approximate = '" + approximate + "' (none or tanh)");
  unary_grad(k, [](auto dy, auto x) {
    using C = decltype(dy);
    const C cdf = C(0.5) * (C(1) + std::erf(x / std::sqrt(C(2))));
    const C pdf = std::exp(-x * x / C(2)) / std::sqrt(C(2) * C(3.14159265358979323846));
    return dy * (cdf + x * pdf);
  });
}
void op_leaky_relu_grad(Kctx& k) {
  const double alpha = k.attr_f("alpha", 0.01f);
  unary_grad(k, [alpha](auto dy, auto x) { return x > 0 ? dy : dy * static_cast<decltype(dy)>(alpha); });
}

// --- convolution ---
// ConvGrad(dY, X, W) -> dX, dW, dB. The output spatial size is dY's (so ConvTranspose can reuse it with roles
// swapped); positions that fall outside X are skipped.
void conv_grad(Kctx& k, const TView& dy, const TView& x, const TView& w) {
  if (x.ndim() < 3 || w.ndim() != x.ndim() || dy.ndim() != x.ndim())
    k.invalid(cat("expected dY, X, W of equal rank >= 3, got ", shape_str(dy.shape), ", ", shape_str(x.shape), ", ",
                  shape_str(w.shape)));
  const int64_t group = k.attr_i("group", 1);
  const int64_t N = x.shape[0], Cin = x.shape[1], M = w.shape[0];
  if (group <= 0 || Cin != w.shape[1] * group || M % group != 0)
    k.invalid(cat("channels of X ", shape_str(x.shape), " and W ", shape_str(w.shape), " do not match group ", group));
  if (dy.shape[0] != N || dy.shape[1] != M)
    k.invalid(cat("dY ", shape_str(dy.shape), " does not match N of X and M of W"));
  Shape in(x.shape.begin() + 2, x.shape.end()), kernel(w.shape.begin() + 2, w.shape.end());
  SpatialGeom g = spatial_geom(k, in, kernel, true, false);
  g.out.assign(dy.shape.begin() + 2, dy.shape.end());
  const int r = g.r;
  const int64_t O = g.out_size(), K = g.kernel_size(), I = g.in_size();
  const int64_t Cg = Cin / group, Mg = M / group;
  // Input offset of (output position o, kernel position kk), or -1 outside X.
  std::vector<int64_t> off(static_cast<size_t>(O * K));
  std::vector<int64_t> oi(r), ki(r);
  for (int64_t o = 0; o < O; ++o) {
    int64_t rem = o;
    for (int d = r - 1; d >= 0; --d) {
      oi[d] = rem % g.out[d];
      rem /= g.out[d];
    }
    for (int64_t kk = 0; kk < K; ++kk) {
      int64_t rk = kk, flat = 0;
      bool inside = true;
      for (int d = r - 1; d >= 0; --d) {
        ki[d] = rk % g.kernel[d];
        rk /= g.kernel[d];
      }
      for (int d = 0; d < r; ++d) {
        int64_t id = oi[d] * g.strides[d] - g.pads[d] + ki[d] * g.dilations[d];
        if (id < 0 || id >= g.in[d]) inside = false;
        flat = flat * g.in[d] + id;
      }
      off[o * K + kk] = inside ? flat : -1;
    }
  }
  const bool want_dx = k.has_output(0), want_dw = k.has_output(1), want_db = k.has_output(2);
  with_calc(x.dtype, k, [&](auto tag) {
    using C = typename decltype(tag)::type;
    auto vdy = load<C>(dy, k, "dY"), vx = load<C>(x, k, "X"), vw = load<C>(w, k, "W");
    if (want_dx) {
      std::vector<C> dx(static_cast<size_t>(x.numel), C(0));
      k.parallel(N, 1, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t m = 0; m < M; ++m) {
            const int64_t gi = m / Mg;
            const C* gy = vdy.data() + (n * M + m) * O;
            for (int64_t c = 0; c < Cg; ++c) {
              C* gx = dx.data() + (n * Cin + gi * Cg + c) * I;
              const C* wk = vw.data() + (m * Cg + c) * K;
              for (int64_t o = 0; o < O; ++o) {
                const C v = gy[o];
                if (v == C(0)) continue;
                for (int64_t kk = 0; kk < K; ++kk)
                  if (int64_t p = off[o * K + kk]; p >= 0) gx[p] += v * wk[kk];
              }
            }
          }
      });
      store(k.out(0, x.shape), dx, k);
    }
    if (want_dw) {
      std::vector<C> dw(static_cast<size_t>(w.numel), C(0));
      k.parallel(M, 1, [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m) {
          const int64_t gi = m / Mg;
          for (int64_t n = 0; n < N; ++n) {
            const C* gy = vdy.data() + (n * M + m) * O;
            for (int64_t c = 0; c < Cg; ++c) {
              const C* xc = vx.data() + (n * Cin + gi * Cg + c) * I;
              C* gw = dw.data() + (m * Cg + c) * K;
              for (int64_t o = 0; o < O; ++o) {
                const C v = gy[o];
                for (int64_t kk = 0; kk < K; ++kk)
                  if (int64_t p = off[o * K + kk]; p >= 0) gw[kk] += v * xc[p];
              }
            }
          }
        }
      });
      store(k.out(1, w.shape), dw, k);
    }
    if (want_db) {
      std::vector<C> db(static_cast<size_t>(M), C(0));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t m = 0; m < M; ++m)
          for (int64_t o = 0; o < O; ++o) db[m] += vdy[(n * M + m) * O + o];
      store(k.out(2, {M}), db, k);
    }
  });
}

void op_conv_grad(Kctx& k) { conv_grad(k, k.in(0), k.in(1), k.in(2)); }

// keel.FusedConvMaxPoolGrad(dP, X, W, P, Arg) -> dX, dW, dB of keel.FusedConvMaxPool (its attributes): each window's
// dP goes to the position Arg names (dP * (P > 0) under a Relu), then ConvGrad.
void op_fused_conv_max_pool_grad(Kctx& k) {
  TView dp = k.in(0), x = k.in(1), w = k.in(2), p = k.in(3), arg = k.in(4);
  for (const auto& [t, what] : {std::pair{&dp, "dP"}, {&x, "X"}, {&w, "W"}, {&p, "P"}})
    if (t->dtype != KEEL_DTYPE_F32) k.bad_dtype(t->dtype, what);
  if (arg.dtype != KEEL_DTYPE_U8) k.invalid("Arg must be uint8");
  if (x.ndim() != 4 || w.ndim() != 4)
    k.invalid(cat("X and W must be 4-D, got ", shape_str(x.shape), ", ", shape_str(w.shape)));
  const std::string act = k.attr_s("activation", "");
  if (!act.empty() && act != "Relu") k.unimpl("activation " + act + " (only none and Relu)");
  const PoolWindow pw = PoolWindow::from(k);
  SpatialGeom g = spatial_geom(k, Shape(x.shape.begin() + 2, x.shape.end()), Shape(w.shape.begin() + 2, w.shape.end()),
                               true, false);
  const Shape ys = {x.shape[0], w.shape[0], g.out[0], g.out[1]};
  const Shape ps = pw.pooled(k, ys);
  if (dp.shape != ps || p.shape != ps || arg.shape != ps)
    k.invalid(cat("dP ", shape_str(dp.shape), ", P ", shape_str(p.shape), " and Arg ", shape_str(arg.shape),
                  " must have the pooled shape ", shape_str(ps)));
  std::vector<float> dy(static_cast<size_t>(numel_of(ys)), 0.f);
  const int64_t NC = ys[0] * ys[1], H = ys[2], W = ys[3], OH = ps[2], OW = ps[3];
  const float* gp = dp.p<float>();
  const float* pv = p.p<float>();
  const uint8_t* at = arg.p<uint8_t>();
  for (int64_t nc = 0; nc < NC; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t o = (nc * OH + oh) * OW + ow;
        if (at[o] >= pw.kh * pw.kw)
          k.invalid(cat("Arg ", int{at[o]}, " is outside the ", pw.kh, "x", pw.kw, " window"));
        if (!act.empty() && !(pv[o] > 0.f)) continue;
        dy[static_cast<size_t>((nc * H + oh * pw.sh + at[o] / pw.kw) * W + ow * pw.sw + at[o] % pw.kw)] += gp[o];
      }
  TView dyv;
  dyv.dtype = KEEL_DTYPE_F32;
  dyv.shape = ys;
  dyv.data = dy.data();
  dyv.numel = numel_of(ys);
  conv_grad(k, dyv, x, w);
}

// --- pooling ---
// Calls f(o, input offset) for every in-bounds window position of output o; returns the padded count.
template <class F>
int64_t window(const SpatialGeom& g, int64_t o, F&& f) {
  const int r = g.r;
  std::vector<int64_t> oi(r), ki(r, 0);
  int64_t rem = o;
  for (int d = r - 1; d >= 0; --d) {
    oi[d] = rem % g.out[d];
    rem /= g.out[d];
  }
  int64_t padded = 0;
  for (int64_t kk = 0; kk < g.kernel_size(); ++kk) {
    bool inside = true, inside_padded = true;
    int64_t flat = 0;
    for (int d = 0; d < r; ++d) {
      int64_t id = oi[d] * g.strides[d] - g.pads[d] + ki[d] * g.dilations[d];
      if (id < 0 || id >= g.in[d]) inside = false;
      if (id < -g.pads[d] || id >= g.in[d] + g.pads[d + r]) inside_padded = false;
      flat = flat * g.in[d] + id;
    }
    if (inside_padded) ++padded;
    if (inside) f(flat);
    for (int d = r - 1; d >= 0; --d) {
      if (++ki[d] < g.kernel[d]) break;
      ki[d] = 0;
    }
  }
  return padded;
}

SpatialGeom pool_geom(Kctx& k, const Shape& x_shape, const Shape& dy_shape) {
  if (x_shape.size() < 3 || dy_shape.size() != x_shape.size() || dy_shape[0] != x_shape[0] || dy_shape[1] != x_shape[1])
    k.invalid(cat("dY ", shape_str(dy_shape), " does not match the pooled input ", shape_str(x_shape)));
  auto ks = k.attr_ints("kernel_shape");
  if (!ks) k.invalid("attribute kernel_shape is required");
  SpatialGeom g = spatial_geom(k, Shape(x_shape.begin() + 2, x_shape.end()), *ks, true, true);
  if (Shape(dy_shape.begin() + 2, dy_shape.end()) != g.out)
    k.invalid(cat("dY ", shape_str(dy_shape), " does not match the pooling output ", shape_str(g.out)));
  return g;
}

void op_max_pool_grad(Kctx& k) {
  TView dy = k.in(0), x = k.in(1);
  if (k.attr_i("storage_order", 0) != 0) k.unimpl("storage_order = 1");
  SpatialGeom g = pool_geom(k, x.shape, dy.shape);
  const int64_t NC = x.shape[0] * x.shape[1], O = g.out_size(), I = g.in_size();
  TView dx = k.out(0, x.shape);
  with_calc(x.dtype, k, [&](auto tag) {
    using C = typename decltype(tag)::type;
    auto vdy = load<C>(dy, k, "dY"), vx = load<C>(x, k, "X");
    std::vector<C> r(static_cast<size_t>(x.numel), C(0));
    for (int64_t nc = 0; nc < NC; ++nc)
      for (int64_t o = 0; o < O; ++o) {
        int64_t best = -1;
        C bv = C(0);
        window(g, o, [&](int64_t p) {
          C v = vx[nc * I + p];
          if (best < 0 || v > bv) {
            best = p;
            bv = v;
          }
        });
        if (best >= 0) r[nc * I + best] += vdy[nc * O + o];
      }
    store(dx, r, k);
  });
}

void op_average_pool_grad(Kctx& k) {
  TView dy = k.in(0);
  auto xs = k.attr_ints("input_shape");
  if (!xs) k.invalid("attribute input_shape is required");
  SpatialGeom g = pool_geom(k, *xs, dy.shape);
  const bool include_pad = k.attr_i("count_include_pad", 0) != 0;
  const int64_t NC = (*xs)[0] * (*xs)[1], O = g.out_size(), I = g.in_size();
  TView dx = k.out(0, *xs);
  with_calc(dy.dtype, k, [&](auto tag) {
    using C = typename decltype(tag)::type;
    auto vdy = load<C>(dy, k, "dY");
    std::vector<C> r(static_cast<size_t>(dx.numel), C(0));
    std::vector<int64_t> pos;
    for (int64_t o = 0; o < O; ++o) {
      pos.clear();
      int64_t padded = window(g, o, [&](int64_t p) { pos.push_back(p); });
      int64_t cnt = include_pad ? padded : static_cast<int64_t>(pos.size());
      if (cnt == 0) continue;
      for (int64_t nc = 0; nc < NC; ++nc) {
        C v = vdy[nc * O + o] / static_cast<C>(cnt);
        for (int64_t p : pos) r[nc * I + p] += v;
      }
    }
    store(dx, r, k);
  });
}

// --- losses ---
void op_softmax_cross_entropy_loss_grad(Kctx& k) {
  TView dl = k.in(0), lp = k.in(1), t = k.in(2);
  auto w = k.opt_in(3);
  if (lp.ndim() < 2) k.invalid("log_prob must have rank >= 2 ([N, C, ...])");
  const int64_t N = lp.shape[0], C = lp.shape[1], D = lp.numel / std::max<int64_t>(N * C, 1);
  Shape tshape = lp.shape;
  tshape.erase(tshape.begin() + 1);
  if (t.shape != tshape) k.invalid(cat("labels shape ", shape_str(t.shape), " should be ", shape_str(tshape)));
  std::string red = k.attr_s("reduction", "mean");
  if (red != "mean" && red != "sum" && red != "none") k.invalid(cat("unknown reduction '", red, "'"));
  if ((red == "none" && dl.shape != tshape) || (red != "none" && dl.numel != 1))
    k.invalid(cat("dLoss shape ", shape_str(dl.shape), " does not match reduction '", red, "'"));
  auto labels = read_ints(t, k, "labels");
  auto ignore = k.attr_i_opt("ignore_index");
  std::vector<float> wv;
  if (w) {
    if (w->numel != C) k.invalid("weights must have C entries");
    wv = read_floats(*w, k, "weights");
  }
  TView dx = k.out(0, lp.shape);
  with_calc(lp.dtype, k, [&](auto tag) {
    using Cc = typename decltype(tag)::type;
    auto vl = load<Cc>(lp, k, "log_prob"), vd = load<Cc>(dl, k, "dLoss");
    Cc wsum = 0;
    for (int64_t i = 0; i < N * D; ++i) {
      int64_t c = labels[i];
      if (ignore && c == *ignore) continue;
      if (c < 0 || c >= C) k.invalid(cat("label ", c, " is out of range [0, ", C, ")"));
      wsum += w ? static_cast<Cc>(wv[c]) : Cc(1);
    }
    std::vector<Cc> r(static_cast<size_t>(lp.numel), Cc(0));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t d = 0; d < D; ++d) {
        int64_t c = labels[n * D + d];
        if (ignore && c == *ignore) continue;
        Cc wt = w ? static_cast<Cc>(wv[c]) : Cc(1);
        Cc s = red == "none" ? vd[n * D + d] : red == "sum" ? vd[0] : (wsum == 0 ? Cc(0) : vd[0] / wsum);
        s *= wt;
        for (int64_t j = 0; j < C; ++j) {
          int64_t i = (n * C + j) * D + d;
          r[i] = s * (std::exp(vl[i]) - (j == c ? Cc(1) : Cc(0)));
        }
      }
    store(dx, r, k);
  });
}

// --- normalisation ---
// Per-channel sums over all axes but 1 of an [N, C, ...] tensor.
void op_batch_norm_training(Kctx& k) {
  TView x = k.in(0), sc = k.in(1), b = k.in(2);
  if (x.ndim() < 2) k.invalid(cat("X must have rank >= 2, got ", shape_str(x.shape)));
  const int64_t N = x.shape[0], C = x.shape[1], S = x.numel / std::max<int64_t>(N * C, 1), cnt = N * S;
  if (sc.numel != C || b.numel != C) k.invalid(cat("scale and B must have ", C, " entries"));
  if (cnt == 0) k.invalid("batch statistics over an empty batch");
  const double eps = k.attr_f("epsilon", 1e-5f);
  with_calc(x.dtype, k, [&](auto tag) {
    using Cc = typename decltype(tag)::type;
    auto vx = load<Cc>(x, k, "X"), vs = load<Cc>(sc, k, "scale"), vb = load<Cc>(b, k, "B");
    std::vector<Cc> mean(C, 0), var(C, 0), inv(C), unb(C), y(vx.size());
    for (int64_t c = 0; c < C; ++c) {
      double s = 0, s2 = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < S; ++i) s += vx[(n * C + c) * S + i];
      double m = s / static_cast<double>(cnt);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < S; ++i) {
          double d = vx[(n * C + c) * S + i] - m;
          s2 += d * d;
        }
      double v = s2 / static_cast<double>(cnt);
      mean[c] = static_cast<Cc>(m);
      var[c] = static_cast<Cc>(v);
      inv[c] = static_cast<Cc>(1.0 / std::sqrt(v + eps));
      unb[c] = static_cast<Cc>(cnt > 1 ? s2 / static_cast<double>(cnt - 1) : v);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < S; ++i) {
          int64_t j = (n * C + c) * S + i;
          y[j] = (vx[j] - mean[c]) * inv[c] * vs[c] + vb[c];
        }
    }
    store(k.out(0, x.shape), y, k);
    if (k.has_output(1)) store(k.out(1, {C}), mean, k);
    if (k.has_output(2)) store(k.out(2, {C}), inv, k);
    if (k.has_output(3)) store(k.out(3, {C}), unb, k);
  });
}

void op_batch_norm_grad(Kctx& k) {
  TView dy = k.in(0), x = k.in(1), sc = k.in(2), mean = k.in(3), inv = k.in(4);
  if (x.ndim() < 2 || dy.shape != x.shape)
    k.invalid(cat("dY ", shape_str(dy.shape), " and X ", shape_str(x.shape), " must match, rank >= 2"));
  const int64_t N = x.shape[0], C = x.shape[1], S = x.numel / std::max<int64_t>(N * C, 1);
  const double cnt = static_cast<double>(N * S);
  if (sc.numel != C || mean.numel != C || inv.numel != C)
    k.invalid(cat("scale, mean, invstd must have ", C, " entries"));
  with_calc(x.dtype, k, [&](auto tag) {
    using Cc = typename decltype(tag)::type;
    auto vdy = load<Cc>(dy, k, "dY"), vx = load<Cc>(x, k, "X"), vs = load<Cc>(sc, k, "scale");
    auto vm = load<Cc>(mean, k, "mean"), vi = load<Cc>(inv, k, "invstd");
    std::vector<Cc> dx(vx.size()), ds(C), db(C);
    for (int64_t c = 0; c < C; ++c) {
      double sdy = 0, sdyx = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < S; ++i) {
          int64_t j = (n * C + c) * S + i;
          sdy += vdy[j];
          sdyx += vdy[j] * (vx[j] - vm[c]) * vi[c];
        }
      ds[c] = static_cast<Cc>(sdyx);
      db[c] = static_cast<Cc>(sdy);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < S; ++i) {
          int64_t j = (n * C + c) * S + i;
          double xh = (vx[j] - vm[c]) * vi[c];
          dx[j] = static_cast<Cc>(vs[c] * vi[c] / cnt * (cnt * vdy[j] - sdy - xh * sdyx));
        }
    }
    if (k.has_output(0)) store(k.out(0, x.shape), dx, k);
    if (k.has_output(1)) store(k.out(1, sc.shape), ds, k);
    if (k.has_output(2)) store(k.out(2, sc.shape), db, k);
  });
}

void op_layer_norm_grad(Kctx& k) {
  TView dy = k.in(0), x = k.in(1), sc = k.in(2), mean = k.in(3), inv = k.in(4);
  if (dy.shape != x.shape) k.invalid(cat("dY ", shape_str(dy.shape), " and X ", shape_str(x.shape), " differ"));
  const int axis = k.axis(k.attr_i("axis", -1), x.ndim());
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < x.ndim(); ++d) (d < axis ? outer : inner) *= x.shape[d];
  if (sc.numel != inner) k.invalid(cat("scale must have ", inner, " entries (the normalised dims)"));
  if (mean.numel != outer || inv.numel != outer) k.invalid(cat("mean and invstd must have ", outer, " entries"));
  with_calc(x.dtype, k, [&](auto tag) {
    using Cc = typename decltype(tag)::type;
    auto vdy = load<Cc>(dy, k, "dY"), vx = load<Cc>(x, k, "X"), vs = load<Cc>(sc, k, "scale");
    auto vm = load<Cc>(mean, k, "mean"), vi = load<Cc>(inv, k, "invstd");
    std::vector<Cc> dx(vx.size()), ds(inner, 0), db(inner, 0);
    for (int64_t o = 0; o < outer; ++o) {
      double sg = 0, sgx = 0;
      for (int64_t i = 0; i < inner; ++i) {
        int64_t j = o * inner + i;
        double xh = (vx[j] - vm[o]) * vi[o];
        double g = vdy[j] * vs[i];
        sg += g;
        sgx += g * xh;
        ds[i] += static_cast<Cc>(vdy[j] * xh);
        db[i] += vdy[j];
      }
      for (int64_t i = 0; i < inner; ++i) {
        int64_t j = o * inner + i;
        double xh = (vx[j] - vm[o]) * vi[o];
        double g = vdy[j] * vs[i];
        dx[j] = static_cast<Cc>(vi[o] * (g - sg / inner - xh * sgx / inner));
      }
    }
    if (k.has_output(0)) store(k.out(0, x.shape), dx, k);
    if (k.has_output(1)) store(k.out(1, sc.shape), ds, k);
    if (k.has_output(2)) store(k.out(2, sc.shape), db, k);
  });
}

// --- gather ---
void op_gather_grad(Kctx& k) {
  TView dy = k.in(0), idx = k.in(1);
  auto ds = k.attr_ints("data_shape");
  if (!ds) k.invalid("attribute data_shape is required");
  const Shape& data = *ds;
  const int axis = k.axis(k.attr_i("axis", 0), static_cast<int>(data.size()));
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= data[d];
  for (size_t d = axis + 1; d < data.size(); ++d) inner *= data[d];
  const int64_t A = data[axis], J = idx.numel;
  if (dy.numel != outer * J * inner)
    k.invalid(cat("dY ", shape_str(dy.shape), " does not match data_shape and indices"));
  auto ind = read_ints(idx, k, "indices");
  TView dx = k.out(0, data);
  with_calc(dy.dtype, k, [&](auto tag) {
    using C = typename decltype(tag)::type;
    auto vdy = load<C>(dy, k, "dY");
    std::vector<C> r(static_cast<size_t>(dx.numel), C(0));
    for (int64_t j = 0; j < J; ++j) {
      int64_t a = ind[j] < 0 ? ind[j] + A : ind[j];
      if (a < 0 || a >= A) k.invalid(cat("index ", ind[j], " is out of range for axis size ", A));
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) r[(o * A + a) * inner + i] += vdy[(o * J + j) * inner + i];
    }
    store(dx, r, k);
  });
}

// --- dropout mask ---
// The loops, compiled twice on x86-64: for AVX-512 (vectorised; chosen at load time where the CPU has it) and the
// baseline. Both compute the same values. This is the CPU's dropout (eager training runs it on the host), so it is
// kept fast: in the LeNet-like model's training step (0.6 M elements) the mask went from 5.7% of perf's samples (one
// std::mt19937_64 draw per two elements and a scalar select loop) to 0.7%.
#if KEEL_TARGET_CLONES
#define KEEL_DROPOUT_CLONES __attribute__((target_clones("avx512f", "default"), optimize("O3")))
#else
#define KEEL_DROPOUT_CLONES
#endif

// SplitMix64's output for counter k of the stream `seed` (state seed + (k + 1) * golden ratio).
inline uint64_t splitmix64_at(uint64_t seed, uint64_t k) {
  uint64_t z = seed + (k + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// n (even, or the last chunk) 32-bit uniforms: u[2j] and u[2j + 1] are the low and high halves of the stream's value
// number first_pair + j.
KEEL_DROPOUT_CLONES void dropout_uniforms(uint32_t* u, int64_t n, uint64_t seed, uint64_t first_pair) {
  const int64_t pairs = n / 2;
  for (int64_t j = 0; j < pairs; ++j) {
    const uint64_t r = splitmix64_at(seed, first_pair + static_cast<uint64_t>(j));
    u[2 * j] = static_cast<uint32_t>(r);
    u[2 * j + 1] = static_cast<uint32_t>(r >> 32);
  }
  if (n % 2) u[n - 1] = static_cast<uint32_t>(splitmix64_at(seed, first_pair + static_cast<uint64_t>(pairs)));
}

// out[i] = kept where u[i] >= cut, else zero (cloned: a masked move per 16 elements). f32, and the 16-bit floats as
// their bit patterns (a select of two constants needs no arithmetic; as bf16 / f16 structs the loop stayed scalar,
// 3.7x slower than f32's for the same mask).
KEEL_DROPOUT_CLONES void keep_where_at_least(float* out, const uint32_t* u, int64_t n, uint32_t cut, float kept,
                                             float zero) {
  for (int64_t i = 0; i < n; ++i) out[i] = u[i] >= cut ? kept : zero;
}
KEEL_DROPOUT_CLONES void keep_where_at_least(uint16_t* out, const uint32_t* u, int64_t n, uint32_t cut, uint16_t kept,
                                             uint16_t zero) {
  for (int64_t i = 0; i < n; ++i) out[i] = u[i] >= cut ? kept : zero;
}
template <class T>
void keep_where_at_least(T* out, const uint32_t* u, int64_t n, uint32_t cut, T kept, T zero) {
  if constexpr (sizeof(T) == 2 && std::is_trivially_copyable_v<T>) {
    uint16_t k16, z16;
    std::memcpy(&k16, &kept, 2);
    std::memcpy(&z16, &zero, 2);
    keep_where_at_least(reinterpret_cast<uint16_t*>(out), u, n, cut, k16, z16);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = u[i] >= cut ? kept : zero;
  }
}

void op_dropout_mask(Kctx& k) {
  TView x = k.in(0), seed_t = k.in(1);
  if (seed_t.numel != 1) k.invalid(cat("seed must hold one value, got ", shape_str(seed_t.shape)));
  uint64_t seed = 0;
  if (seed_t.dtype == KEEL_DTYPE_I64) seed = static_cast<uint64_t>(*seed_t.p<int64_t>());
  else if (seed_t.dtype == KEEL_DTYPE_I32) seed = static_cast<uint64_t>(static_cast<int64_t>(*seed_t.p<int32_t>()));
  else k.invalid(cat("seed must be int64 or int32, got ", dtype_str(seed_t.dtype)));
  const float ratio = k.attr_f("ratio", 0.5f);
  if (!(ratio >= 0.f && ratio < 1.f)) k.invalid(cat("ratio must be in [0, 1), got ", ratio));
  // ratio < 1, so ratio * 2^32 rounds to at most 2^32 - 256 (the largest float below 1): the cut fits 32 bits.
  const auto cut = static_cast<uint32_t>(std::llround(static_cast<double>(ratio) * 4294967296.0));
  const double scale = 1.0 / (1.0 - static_cast<double>(ratio));
  TView m = k.out(0, x.shape);
  dispatch(
      FloatTs{}, x.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T kept = st<T>(static_cast<Calc<T>>(scale)), zero = st<T>(Calc<T>(0));
        T* out = m.p<T>();
        // Chunks of uniforms in L1: the two loops vectorise.
        k.parallel(m.numel, 1 << 16, [&](int64_t begin, int64_t end) {
          constexpr int64_t kChunk = 4096;  // even: a chunk starts on a pair
          uint32_t u[kChunk];
          for (int64_t at = begin; at < end;) {
            // Chunks begin at even elements (a pair's low half); a range that begins odd takes one element first.
            const int64_t len = at % 2 ? 1 : std::min(kChunk, end - at);
            if (at % 2) {
              u[0] = static_cast<uint32_t>(splitmix64_at(seed, static_cast<uint64_t>(at / 2)) >> 32);
            } else {
              dropout_uniforms(u, len, seed, static_cast<uint64_t>(at / 2));
            }
            keep_where_at_least(out + at, u, len, cut, kept, zero);
            at += len;
          }
        });
      },
      "X");
}

// --- Adam / AdamW step (keel.AdamStep, ops/schemas.cc): PyTorch's formulas, each operation rounded to f32 ---
void op_adam_step(Kctx& k) {
  TView sc = k.in(0);
  if (sc.dtype != KEEL_DTYPE_F32 || sc.numel != 9) k.invalid(cat("scalars must be f32[9], got ", shape_str(sc.shape)));
  const float* s = sc.p<float>();
  const float decay_scale = s[0], wd = s[1], b1 = s[2], k1 = s[3], b2 = s[4], k2 = s[5], sqrt_bc2 = s[6], eps = s[7],
              step_size = s[8];
  const int rest = k.n_inputs() - 1;
  if (rest <= 0 || rest % 4 != 0)
    k.invalid(cat("expected scalars and 4 groups of tensors, got ", k.n_inputs(), " inputs"));
  const int n = rest / 4;
  if (k.n_outputs() != 3 * n) k.invalid(cat("expected ", 3 * n, " outputs for ", n, " tensor(s), got ", k.n_outputs()));
  for (int i = 0; i < n; ++i) {
    TView p = k.in(1 + i), g = k.in(1 + n + i), m = k.in(1 + 2 * n + i), v = k.in(1 + 3 * n + i);
    for (const TView* t : {&p, &g, &m, &v}) {
      if (t->dtype != KEEL_DTYPE_F32) k.invalid("every tensor must be f32");
      if (t->shape != p.shape) k.invalid(cat("tensor ", i + 1, ": its gradient and moments differ in shape"));
    }
    TView po = k.out(i, p.shape), mo = k.out(n + i, p.shape), vo = k.out(2 * n + i, p.shape);
    for (int64_t e = 0; e < p.numel; ++e) {
      float pe = p.p<float>()[e];
      if (decay_scale != 1.f) pe = pe * decay_scale;
      float ge = g.p<float>()[e];
      if (wd != 0.f) ge = ge + pe * wd;
      const float me = m.p<float>()[e] * b1 + ge * k1;
      const float ve = v.p<float>()[e] * b2 + (ge * ge) * k2;
      mo.p<float>()[e] = me;
      vo.p<float>()[e] = ve;
      const float denom = std::sqrt(ve) / sqrt_bc2 + eps;
      po.p<float>()[e] = pe - (me / denom) * step_size;
    }
  }
}

// --- GradScaler's unscale and inf/NaN check (keel.CheckFiniteAndUnscale, ops/schemas.cc) ---
void op_check_finite_and_unscale(Kctx& k) {
  TView is = k.in(0);
  if (is.dtype != KEEL_DTYPE_F32 || is.numel != 1)
    k.invalid(cat("inv_scale must be one f32 value, got ", dtype_str(is.dtype), shape_str(is.shape)));
  const float inv = *is.p<float>();
  const int n = k.n_inputs() - 1;
  if (n < 1 || k.n_outputs() != n + 1)
    k.invalid(cat("expected found_inf and one output per gradient: ", n, " gradient(s), ", k.n_outputs(), " outputs"));
  bool found = false;
  for (int i = 0; i < n; ++i) {
    TView g = k.in(1 + i);
    if (g.dtype != k.in(1).dtype) k.invalid("the gradients of one call must have one dtype");
    TView u = k.out(1 + i, g.shape);
    dispatch(
        TL<float, Half, BFloat16>{}, g.dtype, k,
        [&](auto tag) {
          using T = typename decltype(tag)::type;
          const T* src = g.p<T>();
          T* dst = u.p<T>();
          bool bad = false;
          for (int64_t e = 0; e < g.numel; ++e) {
            const T v = st<T>(static_cast<float>(ld(src[e])) * inv);
            dst[e] = v;
            bad |= !std::isfinite(static_cast<float>(ld(v)));
          }
          found |= bad;
        },
        "G");
  }
  TView f = k.out(0, {});
  *f.p<float>() = found ? 1.f : 0.f;
}

const KeelKernel kGrad[] = {
    {"ConvGrad", op_conv_grad},
    {"FusedConvMaxPoolGrad", op_fused_conv_max_pool_grad},
    {"MaxPoolGrad", op_max_pool_grad},
    {"AveragePoolGrad", op_average_pool_grad},
    {"ReluGrad", op_relu_grad},
    {"SigmoidGrad", op_sigmoid_grad},
    {"TanhGrad", op_tanh_grad},
    {"GeluGrad", op_gelu_grad},
    {"LeakyReluGrad", op_leaky_relu_grad},
    {"SoftmaxCrossEntropyLossGrad", op_softmax_cross_entropy_loss_grad},
    {"BatchNormTraining", op_batch_norm_training},
    {"BatchNormGrad", op_batch_norm_grad},
    {"LayerNormGrad", op_layer_norm_grad},
    {"GatherGrad", op_gather_grad},
    {"DropoutMask", op_dropout_mask},
    {"AdamStep", op_adam_step},
    {"CheckFiniteAndUnscale", op_check_finite_and_unscale},
};

}  // namespace
}  // namespace keel::ops::ref

namespace keel::ops {

size_t grad_reference_kernel_count() { return sizeof(ref::kGrad) / sizeof(ref::kGrad[0]); }

keel_status_t register_grad_reference_kernels(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  return ref::register_keel_kernels(host, plugin, ref::kGrad, grad_reference_kernel_count(),
                                    "register_grad_reference_kernels");
}

}  // namespace keel::ops
