// Reference kernels outside the main families: Compress, ReverseSequence, Unique, NonMaxSuppression, MaxUnpool,
// Det, Hann/Hamming/BlackmanWindow, NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.
#include <map>
#include <numeric>

#include "ops/reference/kernels.h"
#include "ops/reference/nn_common.h"

namespace keel::ops::ref {

void op_compress(Kctx& k) {
  TView x = k.in(0), cond = k.in(1);
  if (cond.dtype != KEEL_DTYPE_BOOL) k.invalid("condition must be bool");
  if (cond.ndim() != 1) k.invalid("condition must be 1-D");
  const bool* c = cond.p<bool>();
  size_t es = x.elem_size();
  if (auto a = k.attr_i_opt("axis")) {
    int r = x.ndim();
    int axis = k.axis(*a, r);
    int64_t dim = x.shape[axis];
    if (cond.numel > dim) k.invalid("condition is longer than the axis");
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < std::min(dim, cond.numel); ++i)
      if (c[i]) keep.push_back(i);
    Shape os = x.shape;
    os[axis] = static_cast<int64_t>(keep.size());
    TView y = k.out(0, os);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= x.shape[d];
    for (int d = axis + 1; d < r; ++d) inner *= x.shape[d];
    size_t chunk = static_cast<size_t>(inner) * es;
    if (chunk == 0) return;
    for (int64_t o = 0; o < outer; ++o)
      for (size_t j = 0; j < keep.size(); ++j)
        std::memcpy(y.bytes() + (o * static_cast<int64_t>(keep.size()) + static_cast<int64_t>(j)) * chunk,
                    x.bytes() + (o * dim + keep[j]) * chunk, chunk);
  } else {
    if (cond.numel > x.numel) k.invalid("condition is longer than the flattened input");
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < cond.numel; ++i)
      if (c[i]) keep.push_back(i);
    TView y = k.out(0, {static_cast<int64_t>(keep.size())});
    for (size_t j = 0; j < keep.size(); ++j) std::memcpy(y.bytes() + j * es, x.bytes() + keep[j] * es, es);
  }
}

void op_reverse_sequence(Kctx& k) {
  TView x = k.in(0), lens_t = k.in(1);
  int r = x.ndim();
  if (r < 2) k.invalid("input must have rank >= 2");
  int ta = k.axis(k.attr_i("time_axis", 0), r), ba = k.axis(k.attr_i("batch_axis", 1), r);
  if (ta == ba || ta > 1 || ba > 1) k.invalid("time_axis and batch_axis must be 0 and 1 in some order");
  auto lens = read_ints(lens_t, k, "sequence_lens");
  int64_t T = x.shape[ta], B = x.shape[ba];
  if (static_cast<int64_t>(lens.size()) != B) k.invalid("sequence_lens must have batch_size entries");
  for (int64_t l : lens)
    if (l < 0 || l > T) k.invalid(cat("sequence length ", l, " is out of range"));
  TView y = k.out(0, x.shape);
  int64_t inner = 1;
  for (int d = 2; d < r; ++d) inner *= x.shape[d];
  size_t chunk = static_cast<size_t>(inner) * x.elem_size();
  if (chunk == 0) return;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b) {
      int64_t src_t = t < lens[b] ? lens[b] - 1 - t : t;
      auto off = [&](int64_t tt) { return ta == 0 ? tt * B + b : b * T + tt; };
      std::memcpy(y.bytes() + off(t) * chunk, x.bytes() + off(src_t) * chunk, chunk);
    }
}

void op_unique(Kctx& k) {
  TView x = k.in(0);
  bool sorted = k.attr_i("sorted", 1) != 0;
  auto axis_attr = k.attr_i_opt("axis");
  int r = x.ndim();
  int axis = axis_attr ? k.axis(*axis_attr, r) : -1;
  // Slices to compare: the whole flattened tensor element by element, or the slices along `axis`.
  int64_t n = axis < 0 ? x.numel : x.shape[axis];
  int64_t outer = 1, inner = 1;
  if (axis >= 0) {
    for (int d = 0; d < axis; ++d) outer *= x.shape[d];
    for (int d = axis + 1; d < r; ++d) inner *= x.shape[d];
  }
  std::vector<std::vector<double>> keys(static_cast<size_t>(n));
  dispatch(NumTs{} + TL<bool>{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t i = 0; i < n; ++i) {
      if (axis < 0) {
        keys[i] = {static_cast<double>(ld(x.p<T>()[i]))};
      } else {
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t in = 0; in < inner; ++in)
            keys[i].push_back(static_cast<double>(ld(x.p<T>()[(o * n + i) * inner + in])));
      }
    }
  });
  std::vector<int64_t> first;  // first occurrence of each unique slice, in order of appearance
  std::vector<int64_t> inverse(static_cast<size_t>(n));
  std::map<std::vector<double>, int64_t> seen;
  for (int64_t i = 0; i < n; ++i) {
    auto it = seen.find(keys[i]);
    if (it == seen.end()) {
      seen.emplace(keys[i], static_cast<int64_t>(first.size()));
      inverse[i] = static_cast<int64_t>(first.size());
      first.push_back(i);
    } else {
      inverse[i] = it->second;
    }
  }
  std::vector<int64_t> order(first.size());
  std::iota(order.begin(), order.end(), 0);
  if (sorted)
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[first[a]] < keys[first[b]]; });
  std::vector<int64_t> rank_of(first.size());
  for (size_t j = 0; j < order.size(); ++j) rank_of[order[j]] = static_cast<int64_t>(j);
  int64_t u = static_cast<int64_t>(first.size());
  Shape ys = axis < 0 ? Shape{u} : x.shape;
  if (axis >= 0) ys[axis] = u;
  TView y = k.out(0, ys);
  size_t es = x.elem_size();
  for (int64_t j = 0; j < u; ++j) {
    int64_t src = first[order[j]];
    if (axis < 0) {
      std::memcpy(y.bytes() + j * es, x.bytes() + src * es, es);
    } else {
      if (inner > 0)
        for (int64_t o = 0; o < outer; ++o)
          std::memcpy(y.bytes() + (o * u + j) * inner * es, x.bytes() + (o * n + src) * inner * es, inner * es);
    }
  }
  if (k.has_output(1)) {
    TView t = k.out(1, {u});
    for (int64_t j = 0; j < u; ++j) t.p<int64_t>()[j] = first[order[j]];
  }
  if (k.has_output(2)) {
    TView t = k.out(2, {n});
    for (int64_t i = 0; i < n; ++i) t.p<int64_t>()[i] = rank_of[inverse[i]];
  }
  if (k.has_output(3)) {
    TView t = k.out(3, {u});
    std::vector<int64_t> cnt(static_cast<size_t>(u), 0);
    for (int64_t i = 0; i < n; ++i) cnt[rank_of[inverse[i]]]++;
    for (int64_t j = 0; j < u; ++j) t.p<int64_t>()[j] = cnt[j];
  }
}

void op_non_max_suppression(Kctx& k) {
  TView boxes = k.in(0), scores = k.in(1);
  if (boxes.ndim() != 3 || boxes.shape[2] != 4) k.invalid("boxes must be [num_batches, spatial_dimension, 4]");
  if (scores.ndim() != 3 || scores.shape[0] != boxes.shape[0] || scores.shape[2] != boxes.shape[1])
    k.invalid("scores must be [num_batches, num_classes, spatial_dimension] matching boxes");
  int64_t max_out = k.has_input(2) && k.in(2).numel > 0 ? get_i64(k.in(2), 0, k) : 0;
  double iou_th = k.has_input(3) && k.in(3).numel > 0 ? get_f64(k.in(3), 0, k) : 0.0;
  bool has_score_th = k.has_input(4) && k.in(4).numel > 0;
  double score_th = has_score_th ? get_f64(k.in(4), 0, k) : 0.0;
  bool center = k.attr_i("center_point_box", 0) != 0;
  auto bv = read_floats(boxes, k, "boxes");
  auto sv = read_floats(scores, k, "scores");
  const int64_t NB = boxes.shape[0], NC = scores.shape[1], NS = boxes.shape[1];
  auto corners = [&](int64_t b, int64_t i, double* c) {  // y1, x1, y2, x2 with y1<=y2, x1<=x2
    const float* p = bv.data() + (b * NS + i) * 4;
    if (center) {
      c[0] = p[1] - p[3] / 2.0;
      c[1] = p[0] - p[2] / 2.0;
      c[2] = p[1] + p[3] / 2.0;
      c[3] = p[0] + p[2] / 2.0;
    } else {
      c[0] = std::min(p[0], p[2]);
      c[1] = std::min(p[1], p[3]);
      c[2] = std::max(p[0], p[2]);
      c[3] = std::max(p[1], p[3]);
    }
  };
  auto suppress = [&](int64_t b, int64_t i, int64_t j) {
    double a[4], c[4];
    corners(b, i, a);
    corners(b, j, c);
    double area_a = (a[2] - a[0]) * (a[3] - a[1]), area_c = (c[2] - c[0]) * (c[3] - c[1]);
    if (area_a <= 0 || area_c <= 0) return false;
    double ih = std::min(a[2], c[2]) - std::max(a[0], c[0]), iw = std::min(a[3], c[3]) - std::max(a[1], c[1]);
    if (ih <= 0 || iw <= 0) return false;
    double inter = ih * iw;
    return inter / (area_a + area_c - inter) > iou_th;
  };
  std::vector<int64_t> sel;
  if (max_out > 0) {
    for (int64_t b = 0; b < NB; ++b)
      for (int64_t c = 0; c < NC; ++c) {
        const float* s = sv.data() + (b * NC + c) * NS;
        std::vector<int64_t> cand;
        for (int64_t i = 0; i < NS; ++i)
          if (!has_score_th || s[i] > score_th) cand.push_back(i);
        std::stable_sort(cand.begin(), cand.end(), [&](int64_t a, int64_t b2) { return s[a] > s[b2]; });
        std::vector<int64_t> kept;
        for (int64_t i : cand) {
          if (static_cast<int64_t>(kept.size()) >= max_out) break;
          bool drop = false;
          for (int64_t j : kept)
            if (suppress(b, i, j)) {
              drop = true;
              break;
            }
          if (!drop) kept.push_back(i);
        }
        for (int64_t i : kept) sel.insert(sel.end(), {b, c, i});
      }
  }
  TView y = k.out(0, {static_cast<int64_t>(sel.size() / 3), 3});
  std::copy(sel.begin(), sel.end(), y.p<int64_t>());
}

void op_max_unpool(Kctx& k) {
  TView x = k.in(0), ind = k.in(1);
  if (x.ndim() < 3) k.invalid("input must have rank >= 3");
  if (ind.shape != x.shape) k.invalid("indices must have the shape of X");
  int r = x.ndim() - 2;
  auto ks = k.attr_ints("kernel_shape");
  if (!ks || static_cast<int>(ks->size()) != r) k.invalid("kernel_shape must have one entry per spatial dimension");
  Shape strides = k.attr_ints_or("strides", Shape(r, 1)), pads = k.attr_ints_or("pads", Shape(2 * r, 0));
  if (static_cast<int>(strides.size()) != r || static_cast<int>(pads.size()) != 2 * r) k.invalid("bad strides or pads");
  // The default output shape is the MaxPool input shape the indices were computed on.
  Shape ds = {x.shape[0], x.shape[1]};
  for (int d = 0; d < r; ++d) ds.push_back((x.shape[d + 2] - 1) * strides[d] + (*ks)[d] - pads[d] - pads[d + r]);
  Shape os = ds;
  if (k.has_input(2)) {
    auto o = read_ints(k.in(2), k, "output_shape");
    if (static_cast<int>(o.size()) != r + 2) k.invalid("output_shape must have the rank of X");
    os = Shape(o);
    if (os[0] != ds[0] || os[1] != ds[1]) k.invalid("output_shape must keep N and C");
  }
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  std::memset(y.data, 0, static_cast<size_t>(y.numel) * y.elem_size());
  auto idx = read_ints(ind, k, "indices");
  size_t es = x.elem_size();
  int64_t dplane = numel_of(Shape(ds.begin() + 2, ds.end())), oplane = numel_of(Shape(os.begin() + 2, os.end()));
  int64_t dtotal = numel_of(ds);
  Shape dstr = strides_of(Shape(ds.begin() + 2, ds.end())), ostr = strides_of(Shape(os.begin() + 2, os.end()));
  // MaxPool indices are flat over the whole (N, C, spatial...) tensor of the default shape; re-encode them in the
  // requested output shape (which may be larger, as with padding lost to flooring).
  for (int64_t i = 0; i < x.numel; ++i) {
    if (idx[i] < 0 || idx[i] >= dtotal) k.invalid(cat("index ", idx[i], " is out of range"));
    int64_t plane = idx[i] / dplane, rem = idx[i] % dplane, o = plane * oplane;
    for (int d = 0; d < r; ++d) {
      int64_t c = rem / dstr[d];
      rem %= dstr[d];
      if (c >= os[d + 2]) k.invalid("index does not fit the output shape");
      o += c * ostr[d];
    }
    std::memcpy(y.bytes() + o * static_cast<int64_t>(es), x.bytes() + i * static_cast<int64_t>(es), es);
  }
}

void op_det(Kctx& k) {
  TView x = k.in(0);
  int r = x.ndim();
  if (r < 2 || x.shape[r - 1] != x.shape[r - 2]) k.invalid("input must be [..., M, M]");
  int64_t M = x.shape[r - 1];
  Shape os(x.shape.begin(), x.shape.end() - 2);
  TView y = k.out(0, os);
  auto v = to_calc<double>(x, k, "X");
  std::vector<double> dets(static_cast<size_t>(y.numel));
  for (int64_t m = 0; m < y.numel; ++m) {
    std::vector<double> a(v.begin() + m * M * M, v.begin() + (m + 1) * M * M);
    double det = 1;
    for (int64_t c = 0; c < M; ++c) {
      int64_t piv = c;
      for (int64_t i = c + 1; i < M; ++i)
        if (std::abs(a[i * M + c]) > std::abs(a[piv * M + c])) piv = i;
      if (a[piv * M + c] == 0) {
        det = 0;
        break;
      }
      if (piv != c) {
        for (int64_t j = 0; j < M; ++j) std::swap(a[c * M + j], a[piv * M + j]);
        det = -det;
      }
      det *= a[c * M + c];
      for (int64_t i = c + 1; i < M; ++i) {
        double f = a[i * M + c] / a[c * M + c];
        for (int64_t j = c; j < M; ++j) a[i * M + j] -= f * a[c * M + j];
      }
    }
    dets[m] = det;
  }
  dispatch(
      FloatTs{}, y.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < y.numel; ++i) y.p<T>()[i] = st<T>(dets[i]);
      },
      "output");
}

namespace {
enum class Window { kHann, kHamming, kBlackman };
void window(Kctx& k, Window w) {
  TView s = k.in(0);
  if (s.numel != 1) k.invalid("size must be a scalar");
  int64_t n = get_i64(s, 0, k);
  if (n < 0) k.invalid("size must be non-negative");
  bool periodic = k.attr_i("periodic", 1) != 0;
  TView y = k.out(0, {n});
  double N = static_cast<double>(periodic ? n : n - 1);
  const double pi = 3.14159265358979323846;
  dispatch(
      NumTs{}, y.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < n; ++i) {
          double a = N == 0 ? 0 : 2 * pi * static_cast<double>(i) / N;
          double v = w == Window::kHann      ? 0.5 - 0.5 * std::cos(a)
                     : w == Window::kHamming ? 25.0 / 46.0 - 21.0 / 46.0 * std::cos(a)
                                             : 0.42 - 0.5 * std::cos(a) + 0.08 * std::cos(2 * a);
          y.p<T>()[i] = st<T>(v);
        }
      },
      "output");
}

// Shared NLL over log-probabilities lp [N, C, D] (D = product of extra dims) and targets [N, D].
void nll(Kctx& k, const std::vector<double>& lp, const Shape& in_shape, const TView& target,
         const std::optional<TView>& weight, int out_index) {
  if (in_shape.size() < 2) k.invalid("input must have rank >= 2 ([N, C, ...])");
  int64_t N = in_shape[0], C = in_shape[1];
  int64_t D = numel_of(Shape(in_shape.begin() + 2, in_shape.end()));
  Shape tshape = in_shape;
  tshape.erase(tshape.begin() + 1);
  if (target.shape != tshape)
    k.invalid(cat("target shape ", shape_str(target.shape), " should be ", shape_str(tshape)));
  auto tg = read_ints(target, k, "target");
  std::vector<float> wv;
  if (weight) {
    if (weight->numel != C) k.invalid("weight must have C entries");
    wv = read_floats(*weight, k, "weight");
  }
  std::string red = k.attr_s("reduction", "mean");
  if (red != "mean" && red != "sum" && red != "none") k.invalid(cat("unknown reduction '", red, "'"));
  auto ignore = k.attr_i_opt("ignore_index");
  std::vector<double> loss(static_cast<size_t>(N * D), 0.0);
  double wsum = 0, lsum = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) {
      int64_t t = tg[n * D + d];
      if (ignore && t == *ignore) continue;
      if (t < 0 || t >= C) k.invalid(cat("target ", t, " is out of range [0, ", C, ")"));
      double wt = weight ? wv[t] : 1.0;
      double l = -lp[(n * C + t) * D + d] * wt;
      loss[n * D + d] = l;
      wsum += wt;
      lsum += l;
    }
  Shape os = red == "none" ? tshape : Shape{};
  TView y = k.out(out_index, os);
  dispatch(
      FloatTs{}, y.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        if (red == "none") {
          for (int64_t i = 0; i < N * D; ++i) y.p<T>()[i] = st<T>(loss[i]);
        } else if (red == "sum") {
          y.p<T>()[0] = st<T>(lsum);
        } else {
          y.p<T>()[0] = st<T>(wsum == 0 ? 0.0 : lsum / wsum);
        }
      },
      "output");
}
}  // namespace

void op_hann_window(Kctx& k) { window(k, Window::kHann); }
void op_hamming_window(Kctx& k) { window(k, Window::kHamming); }
void op_blackman_window(Kctx& k) { window(k, Window::kBlackman); }

void op_negative_log_likelihood_loss(Kctx& k) {
  TView x = k.in(0), t = k.in(1);
  auto w = k.opt_in(2);
  nll(k, to_calc<double>(x, k, "input"), x.shape, t, w, 0);
}

void op_softmax_cross_entropy_loss(Kctx& k) {
  TView x = k.in(0), t = k.in(1);
  auto w = k.opt_in(2);
  if (x.ndim() < 2) k.invalid("scores must have rank >= 2 ([N, C, ...])");
  int64_t N = x.shape[0], C = x.shape[1], D = numel_of(Shape(x.shape.begin() + 2, x.shape.end()));
  auto v = to_calc<double>(x, k, "scores");
  std::vector<double> lp(v.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < C; ++c) mx = std::max(mx, v[(n * C + c) * D + d]);
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += std::exp(v[(n * C + c) * D + d] - mx);
      double ls = std::log(s);
      for (int64_t c = 0; c < C; ++c) lp[(n * C + c) * D + d] = v[(n * C + c) * D + d] - mx - ls;
    }
  nll(k, lp, x.shape, t, w, 0);
  if (k.has_output(1)) {
    TView o = k.out(1, x.shape);
    dispatch(
        FloatTs{}, o.dtype, k,
        [&](auto tag) {
          using T = typename decltype(tag)::type;
          for (int64_t i = 0; i < o.numel; ++i) o.p<T>()[i] = st<T>(lp[i]);
        },
        "log_prob");
  }
}

}  // namespace keel::ops::ref
