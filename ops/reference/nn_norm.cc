// Reference kernels: normalisation and softmax family — BatchNormalization (inference), LayerNormalization,
// InstanceNormalization, LRN, MeanVarianceNormalization, Dropout (inference), Softmax, LogSoftmax, Hardmax.
#include "ops/reference/kernels.h"
#include "ops/reference/nn_common.h"

namespace keel::ops::ref {
namespace {

// outer x len x inner view of a tensor around `axis`; opset < 13 softmax coerces to 2-D at axis.
struct AxisSplit {
  int64_t outer = 1, len = 1, inner = 1;
};

AxisSplit split_at(const Shape& s, int axis, bool coerce_2d) {
  AxisSplit r;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (d < axis) r.outer *= s[d];
    else if (d == axis || coerce_2d) r.len *= s[d];
    else r.inner *= s[d];
  }
  return r;
}

enum class SoftKind { kSoftmax, kLogSoftmax, kHardmax };

void softmax_like(Kctx& k, SoftKind kind) {
  TView x = k.in(0);
  int r = x.ndim();
  bool legacy = k.opset() > 0 && k.opset() < 13;
  int64_t axis_attr = k.attr_i("axis", legacy ? 1 : -1);
  int axis;
  if (r == 0) {
    axis = 0;
  } else if (legacy) {
    if (axis_attr < -r || axis_attr > r) k.invalid(cat("axis ", axis_attr, " is out of range for rank ", r));
    axis = static_cast<int>(axis_attr < 0 ? axis_attr + r : axis_attr);
  } else {
    axis = k.axis(axis_attr, r);
  }
  AxisSplit sp = r == 0 ? AxisSplit{} : split_at(x.shape, axis, legacy);
  TView y = k.out(0, x.shape);
  if (y.numel == 0) return;
  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* px = x.p<T>();
    T* py = y.p<T>();
    k.parallel(sp.outer * sp.inner, std::max<int64_t>(1, 8192 / std::max<int64_t>(sp.len, 1)),
               [&](int64_t b, int64_t e) {
                 std::vector<C> buf(static_cast<size_t>(sp.len));
                 for (int64_t t = b; t < e; ++t) {
                   int64_t o = t / sp.inner, in = t % sp.inner;
                   const T* xr = px + o * sp.len * sp.inner + in;
                   T* yr = py + o * sp.len * sp.inner + in;
                   C mx = -std::numeric_limits<C>::infinity();
                   int64_t arg = 0;
                   for (int64_t i = 0; i < sp.len; ++i) {
                     C v = static_cast<C>(ld(xr[i * sp.inner]));
                     buf[i] = v;
                     if (v > mx) {
                       mx = v;
                       arg = i;
                     }
                   }
                   if (kind == SoftKind::kHardmax) {
                     for (int64_t i = 0; i < sp.len; ++i) yr[i * sp.inner] = st<T>(C(i == arg ? 1 : 0));
                     continue;
                   }
                   C sum = 0;
                   for (int64_t i = 0; i < sp.len; ++i) sum += std::exp(buf[i] - mx);
                   if (kind == SoftKind::kSoftmax) {
                     for (int64_t i = 0; i < sp.len; ++i) yr[i * sp.inner] = st<T>(std::exp(buf[i] - mx) / sum);
                   } else {
                     C ls = std::log(sum);
                     for (int64_t i = 0; i < sp.len; ++i) yr[i * sp.inner] = st<T>(buf[i] - mx - ls);
                   }
                 }
               });
  });
}

}  // namespace

void op_softmax(Kctx& k) { softmax_like(k, SoftKind::kSoftmax); }
void op_log_softmax(Kctx& k) { softmax_like(k, SoftKind::kLogSoftmax); }
void op_hardmax(Kctx& k) { softmax_like(k, SoftKind::kHardmax); }

void op_batch_normalization(Kctx& k) {
  TView x = k.in(0), sc = k.in(1), bi = k.in(2), mean = k.in(3), var = k.in(4);
  const bool training = k.attr_i("training_mode", 0) != 0;
  if (x.ndim() < 2) k.invalid(cat("input must have rank >= 2, got ", shape_str(x.shape)));
  float eps = k.attr_f("epsilon", 1e-5f);
  const int64_t N = x.shape[0], C = x.shape[1];
  const int64_t S = C == 0 || N == 0 ? 0 : x.numel / (N * C);
  // Per channel ([C]) or, for the pre-9 spatial=0 form, per element of a sample ([C, spatial...]).
  int64_t per = sc.numel;
  if (per != C && per != C * S) k.invalid(cat("scale has ", per, " elements; expected ", C, " (channels)"));
  for (const TView* t : {&bi, &mean, &var})
    if (t->numel != per) k.invalid("scale, B, mean and var must have the same number of elements");
  auto fs = read_floats(sc, k, "scale"), fb = read_floats(bi, k, "B"), fm = read_floats(mean, k, "mean"),
       fv = read_floats(var, k, "var");
  std::vector<float> run_mean, run_var;
  if (training) {
    // Normalise with the batch statistics (population variance); running stats blend with momentum.
    if (per != C) k.invalid("training_mode needs per-channel scale");
    float momentum = k.attr_f("momentum", 0.9f);
    auto xv = read_floats(x, k, "X");
    std::vector<double> s1(C, 0), s2(C, 0);
    for (int64_t i = 0; i < x.numel; ++i) {
      int64_t c = (i / std::max<int64_t>(S, 1)) % C;
      s1[c] += xv[i];
    }
    double cnt = static_cast<double>(N * S);
    for (int64_t c = 0; c < C; ++c) s1[c] /= cnt;
    for (int64_t i = 0; i < x.numel; ++i) {
      int64_t c = (i / std::max<int64_t>(S, 1)) % C;
      double d = xv[i] - s1[c];
      s2[c] += d * d;
    }
    run_mean.resize(C);
    run_var.resize(C);
    for (int64_t c = 0; c < C; ++c) {
      double bm = s1[c], bv = s2[c] / cnt;
      run_mean[c] = static_cast<float>(fm[c] * momentum + bm * (1 - momentum));
      run_var[c] = static_cast<float>(fv[c] * momentum + bv * (1 - momentum));
      fm[c] = static_cast<float>(bm);
      fv[c] = static_cast<float>(bv);
    }
  }
  std::vector<float> mul(per), add(per);
  for (int64_t i = 0; i < per; ++i) {
    mul[i] = fs[i] / std::sqrt(fv[i] + eps);
    add[i] = fb[i] - fm[i] * mul[i];
  }
  TView y = k.out(0, x.shape);
  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.p<T>();
    T* py = y.p<T>();
    k.parallel(N * C, std::max<int64_t>(1, 16384 / std::max<int64_t>(S, 1)), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t c = t % C;
        for (int64_t s = 0; s < S; ++s) {
          int64_t pi = per == C ? c : c * S + s;
          py[t * S + s] = st<T>(static_cast<float>(ld(px[t * S + s])) * mul[pi] + add[pi]);
        }
      }
    });
  });
  if (training) {
    for (int i = 1; i <= 2; ++i) {
      if (!k.has_output(i)) continue;
      const std::vector<float>& v = i == 1 ? run_mean : run_var;
      TView o = k.out(i, {C});
      dispatch(
          FloatTs{}, o.dtype, k,
          [&](auto tag) {
            using U = typename decltype(tag)::type;
            for (int64_t c = 0; c < C; ++c) o.p<U>()[c] = st<U>(v[c]);
          },
          "running statistics");
    }
    return;
  }
  // Older opsets list running/saved statistics as optional outputs; in inference they equal the inputs.
  for (int i = 1; i < std::min(k.n_outputs(), 5); ++i) {
    if (!k.has_output(i)) continue;
    const TView& src = i == 1 || i == 3 ? mean : var;
    TView o = k.out(i, src.shape);
    if (o.dtype == src.dtype) copy_bytes(o, src);
  }
}

void op_layer_normalization(Kctx& k) {
  TView x = k.in(0), sc = k.in(1);
  auto bi = k.opt_in(2);
  int r = x.ndim();
  if (r == 0) k.invalid("input must have rank >= 1");
  int axis = k.axis(k.attr_i("axis", -1), r);
  float eps = k.attr_f("epsilon", 1e-5f);
  int64_t outer = 1, len = 1;
  for (int d = 0; d < r; ++d) (d < axis ? outer : len) *= x.shape[d];
  Shape norm_shape(x.shape.begin() + axis, x.shape.end());
  auto check_bcast = [&](const TView& t, const char* what) {
    Shape b = broadcast_shapes({t.shape, norm_shape}, k);
    if (b != norm_shape)
      k.invalid(cat(what, " ", shape_str(t.shape), " does not broadcast to ", shape_str(norm_shape)));
  };
  check_bcast(sc, "Scale");
  if (bi) check_bcast(*bi, "B");
  auto fs = read_floats(sc, k, "Scale");
  fs = broadcast_to(fs.data(), sc.shape, norm_shape);
  std::vector<float> fb;
  if (bi) {
    fb = read_floats(*bi, k, "B");
    fb = broadcast_to(fb.data(), bi->shape, norm_shape);
  }
  TView y = k.out(0, x.shape);
  Shape stat_shape = x.shape;
  for (int d = axis; d < r; ++d) stat_shape[d] = 1;
  TView mean_out, inv_out;
  bool want_mean = k.has_output(1), want_inv = k.has_output(2);
  if (want_mean) mean_out = k.out(1, stat_shape);
  if (want_inv) inv_out = k.out(2, stat_shape);
  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.p<T>();
    T* py = y.p<T>();
    k.parallel(outer, std::max<int64_t>(1, 8192 / std::max<int64_t>(len, 1)), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        double mean = 0, sq = 0;
        for (int64_t i = 0; i < len; ++i) mean += static_cast<double>(ld(px[o * len + i]));
        mean /= static_cast<double>(len);
        for (int64_t i = 0; i < len; ++i) {
          double d = static_cast<double>(ld(px[o * len + i])) - mean;
          sq += d * d;
        }
        double var = sq / static_cast<double>(len);
        double inv = 1.0 / std::sqrt(var + eps);
        for (int64_t i = 0; i < len; ++i) {
          double v = (static_cast<double>(ld(px[o * len + i])) - mean) * inv * fs[i] + (bi ? fb[i] : 0.0f);
          py[o * len + i] = st<T>(v);
        }
        if (want_mean) {
          dispatch(
              FloatTs{}, mean_out.dtype, k,
              [&](auto t2) {
                using U = typename decltype(t2)::type;
                mean_out.p<U>()[o] = st<U>(mean);
              },
              "Mean");
        }
        if (want_inv) {
          dispatch(
              FloatTs{}, inv_out.dtype, k,
              [&](auto t2) {
                using U = typename decltype(t2)::type;
                inv_out.p<U>()[o] = st<U>(inv);
              },
              "InvStdDev");
        }
      }
    });
  });
}

void op_instance_normalization(Kctx& k) {
  TView x = k.in(0), sc = k.in(1), bi = k.in(2);
  if (x.ndim() < 3) k.invalid("input must have rank >= 3");
  float eps = k.attr_f("epsilon", 1e-5f);
  int64_t N = x.shape[0], C = x.shape[1], S = numel_of(Shape(x.shape.begin() + 2, x.shape.end()));
  if (sc.numel != C || bi.numel != C) k.invalid(cat("scale and B must have ", C, " elements"));
  auto fs = read_floats(sc, k, "scale"), fb = read_floats(bi, k, "B");
  TView y = k.out(0, x.shape);
  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.p<T>();
    T* py = y.p<T>();
    k.parallel(N * C, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t c = t % C;
        double mean = 0, sq = 0;
        for (int64_t s = 0; s < S; ++s) mean += static_cast<double>(ld(px[t * S + s]));
        mean /= static_cast<double>(std::max<int64_t>(S, 1));
        for (int64_t s = 0; s < S; ++s) {
          double d = static_cast<double>(ld(px[t * S + s])) - mean;
          sq += d * d;
        }
        double inv = 1.0 / std::sqrt(sq / static_cast<double>(std::max<int64_t>(S, 1)) + eps);
        for (int64_t s = 0; s < S; ++s)
          py[t * S + s] = st<T>((static_cast<double>(ld(px[t * S + s])) - mean) * inv * fs[c] + fb[c]);
      }
    });
  });
}

void op_lrn(Kctx& k) {
  TView x = k.in(0);
  if (x.ndim() < 3) k.invalid("input must have rank >= 3");
  int64_t size = k.attr_i("size", 0);
  if (size <= 0) k.invalid("attribute size must be positive");
  float alpha = k.attr_f("alpha", 1e-4f), beta = k.attr_f("beta", 0.75f), bias = k.attr_f("bias", 1.0f);
  int64_t N = x.shape[0], C = x.shape[1], S = numel_of(Shape(x.shape.begin() + 2, x.shape.end()));
  int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
  TView y = k.out(0, x.shape);
  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.p<T>();
    T* py = y.p<T>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t s = 0; s < S; ++s) {
          double sum = 0;
          for (int64_t cc = std::max<int64_t>(0, c - lo); cc <= std::min<int64_t>(C - 1, c + hi); ++cc) {
            double v = static_cast<double>(ld(px[(n * C + cc) * S + s]));
            sum += v * v;
          }
          double v = static_cast<double>(ld(px[(n * C + c) * S + s]));
          py[(n * C + c) * S + s] = st<T>(v / std::pow(bias + alpha / static_cast<double>(size) * sum, beta));
        }
  });
}

void op_mean_variance_normalization(Kctx& k) {
  TView x = k.in(0);
  int r = x.ndim();
  auto axes_v = k.attr_ints_or("axes", {0, 2, 3});
  std::vector<bool> red(r, false);
  for (int64_t a : axes_v) red[k.axis(a, r)] = true;
  TView y = k.out(0, x.shape);
  if (y.numel == 0) return;
  // Group elements by their coordinates on the kept axes.
  Shape xs = strides_of(x.shape);
  Shape kept_shape;
  for (int d = 0; d < r; ++d)
    if (!red[d]) kept_shape.push_back(x.shape[d]);
  Shape ks = strides_of(kept_shape);
  int64_t groups = numel_of(kept_shape);
  std::vector<int64_t> gid(static_cast<size_t>(x.numel));
  for (int64_t i = 0; i < x.numel; ++i) {
    int64_t rem = i, g = 0, kd = 0;
    for (int d = 0; d < r; ++d) {
      int64_t c = rem / xs[d];
      rem %= xs[d];
      if (!red[d]) g += c * ks[kd++];
    }
    gid[i] = g;
  }
  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<double> s1(groups, 0), s2(groups, 0), cnt(groups, 0);
    for (int64_t i = 0; i < x.numel; ++i) {
      double v = static_cast<double>(ld(x.p<T>()[i]));
      s1[gid[i]] += v;
      s2[gid[i]] += v * v;
      cnt[gid[i]] += 1;
    }
    for (int64_t i = 0; i < x.numel; ++i) {
      int64_t g = gid[i];
      double m = s1[g] / cnt[g], var = s2[g] / cnt[g] - m * m;
      double v = static_cast<double>(ld(x.p<T>()[i]));
      y.p<T>()[i] = st<T>((v - m) / (std::sqrt(std::max(var, 0.0)) + 1e-9));
    }
  });
}

void op_dropout(Kctx& k) {
  TView x = k.in(0);
  bool training = false;
  double ratio = k.attr_f("ratio", 0.5f);
  if (k.opset() >= 12 || k.opset() == 0) {
    if (k.has_input(1)) ratio = get_f64(k.in(1), 0, k);
    if (k.has_input(2)) training = get_i64(k.in(2), 0, k) != 0;
  }
  if (training && ratio != 0.0) k.unimpl("training-mode Dropout (random masks) is not in the reference kernels");
  TView y = k.out(0, x.shape);
  copy_bytes(y, x);
  if (k.has_output(1)) {
    TView m = k.out(1, x.shape);
    dispatch(
        AllTs{}, m.dtype, k,
        [&](auto tag) {
          using T = typename decltype(tag)::type;
          for (int64_t i = 0; i < m.numel; ++i) m.p<T>()[i] = st<T>(1);
        },
        "mask");
  }
}

}  // namespace keel::ops::ref
