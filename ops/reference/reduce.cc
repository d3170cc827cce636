// Reference kernels: Reduce* (axes as attribute or input, keepdims, noop_with_empty_axes), ArgMax/ArgMin, CumSum,
// TopK.
#include <numeric>

#include "ops/reference/kernels.h"

namespace keel::ops::ref {
namespace {

enum class Red { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

struct ReducePlan {
  std::vector<bool> reduced;
  Shape out_shape;            // with keepdims applied
  Shape out_strides_in_dims;  // per input dim: stride into the output (0 when reduced)
  int64_t out_numel = 1;
  bool noop = false;
};

ReducePlan reduce_plan(const Kctx& k, const TView& x, bool axes_from_input) {
  int r = x.ndim();
  std::optional<std::vector<int64_t>> axes = k.attr_ints("axes");
  if (!axes && axes_from_input && k.has_input(1)) axes = read_ints(k.in(1), k, "axes");
  bool keepdims = k.attr_i("keepdims", 1) != 0;
  bool noop_empty = k.attr_i("noop_with_empty_axes", 0) != 0;
  ReducePlan p;
  p.reduced.assign(r, false);
  if (!axes || axes->empty()) {
    if (noop_empty) {
      p.noop = true;
      p.out_shape = x.shape;
      return p;
    }
    std::fill(p.reduced.begin(), p.reduced.end(), true);
  } else {
    for (int64_t a : *axes) p.reduced[k.axis(a, r)] = true;
  }
  Shape kept;
  for (int d = 0; d < r; ++d) {
    if (!p.reduced[d]) kept.push_back(x.shape[d]);
    if (keepdims) p.out_shape.push_back(p.reduced[d] ? 1 : x.shape[d]);
  }
  if (!keepdims) p.out_shape = kept;
  Shape ks = strides_of(kept);
  p.out_strides_in_dims.assign(r, 0);
  int kd = 0;
  for (int d = 0; d < r; ++d)
    if (!p.reduced[d]) p.out_strides_in_dims[d] = ks[kd++];
  p.out_numel = numel_of(kept);
  return p;
}

// Calls f(input index, output index) for every input element.
template <class F>
void for_each_mapped(const TView& x, const ReducePlan& p, F&& f) {
  int r = x.ndim();
  if (x.numel == 0) return;
  if (r == 0) {
    f(0, 0);
    return;
  }
  std::vector<int64_t> idx(r, 0);
  int64_t o = 0;
  for (int64_t i = 0; i < x.numel; ++i) {
    f(i, o);
    for (int d = r - 1; d >= 0; --d) {
      o += p.out_strides_in_dims[d];
      if (++idx[d] < x.shape[d]) break;
      o -= p.out_strides_in_dims[d] * x.shape[d];
      idx[d] = 0;
    }
  }
}

template <Red kRed>
void reduce(Kctx& k) {
  TView x = k.in(0);
  bool from_input = (k.opset() >= 13 && kRed == Red::kSum) || k.opset() >= 18 || k.opset() == 0;
  ReducePlan p = reduce_plan(k, x, from_input);
  TView y = k.out(0, p.out_shape);
  if (p.noop) {
    copy_bytes(y, x);
    return;
  }
  int64_t count = p.out_numel == 0 ? 0 : x.numel / p.out_numel;
  dispatch(NumTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A =
        std::conditional_t<std::is_integral_v<T>, std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>, double>;
    A init = 0;
    if constexpr (kRed == Red::kProd) init = 1;
    if constexpr (kRed == Red::kMax) {
      if constexpr (std::is_integral_v<T>) init = static_cast<A>(std::numeric_limits<T>::lowest());
      else init = -std::numeric_limits<A>::infinity();
    }
    if constexpr (kRed == Red::kMin) {
      if constexpr (std::is_integral_v<T>) init = static_cast<A>(std::numeric_limits<T>::max());
      else init = std::numeric_limits<A>::infinity();
    }
    std::vector<A> acc(static_cast<size_t>(p.out_numel), init);
    std::vector<A> mx;
    const T* px = x.p<T>();
    if constexpr (kRed == Red::kLogSumExp) {
      mx.assign(static_cast<size_t>(p.out_numel), std::numeric_limits<A>::lowest());
      for_each_mapped(x, p, [&](int64_t i, int64_t o) { mx[o] = std::max<A>(mx[o], static_cast<A>(ld(px[i]))); });
      for (auto& m : mx)
        if (m == std::numeric_limits<A>::lowest() || std::isinf(static_cast<double>(m))) m = 0;
    }
    for_each_mapped(x, p, [&](int64_t i, int64_t o) {
      A v = static_cast<A>(ld(px[i]));
      A& a = acc[o];
      if constexpr (kRed == Red::kSum || kRed == Red::kMean || kRed == Red::kLogSum) a += v;
      else if constexpr (kRed == Red::kProd) a *= v;
      else if constexpr (kRed == Red::kMax) a = (v > a || (std::is_floating_point_v<A> && v != v)) ? v : a;
      else if constexpr (kRed == Red::kMin) a = (v < a || (std::is_floating_point_v<A> && v != v)) ? v : a;
      else if constexpr (kRed == Red::kL1) a += v < A(0) ? A(0) - v : v;
      else if constexpr (kRed == Red::kL2 || kRed == Red::kSumSquare) a += v * v;
      else if constexpr (kRed == Red::kLogSumExp)
        a += static_cast<A>(std::exp(static_cast<double>(v) - static_cast<double>(mx[o])));
    });
    T* py = y.p<T>();
    for (int64_t o = 0; o < p.out_numel; ++o) {
      A a = acc[o];
      if constexpr (kRed == Red::kMean) {
        py[o] = st<T>(static_cast<double>(a) / static_cast<double>(count));
      } else if constexpr (kRed == Red::kL2) {
        py[o] = st<T>(std::sqrt(static_cast<double>(a)));
      } else if constexpr (kRed == Red::kLogSum) {
        py[o] = st<T>(std::log(static_cast<double>(a)));
      } else if constexpr (kRed == Red::kLogSumExp) {
        py[o] = st<T>(std::log(static_cast<double>(a)) + static_cast<double>(mx[o]));
      } else {
        py[o] = st<T>(a);
      }
    }
  });
}

template <bool kMax>
void arg_reduce(Kctx& k) {
  TView x = k.in(0);
  int r = x.ndim();
  if (r == 0) k.invalid("input must have rank >= 1");
  int axis = k.axis(k.attr_i("axis", 0), r);
  bool keepdims = k.attr_i("keepdims", 1) != 0;
  bool last = k.attr_i("select_last_index", 0) != 0;
  int64_t outer = 1, len = x.shape[axis], inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int d = axis + 1; d < r; ++d) inner *= x.shape[d];
  if (len == 0) k.invalid("cannot take the arg of an empty axis");
  Shape os = x.shape;
  if (keepdims) os[axis] = 1;
  else os.erase(os.begin() + axis);
  TView y = k.out(0, os);
  if (y.dtype != KEEL_DTYPE_I64) k.bad_dtype(y.dtype, "output");
  dispatch(NumTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.p<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const T* base = px + o * len * inner + in;
        auto best = ld(base[0]);
        int64_t bi = 0;
        for (int64_t i = 1; i < len; ++i) {
          auto v = ld(base[i * inner]);
          bool better = kMax ? (last ? v >= best : v > best) : (last ? v <= best : v < best);
          if (better) {
            best = v;
            bi = i;
          }
        }
        y.p<int64_t>()[o * inner + in] = bi;
      }
  });
}

}  // namespace

void op_reduce_sum(Kctx& k) { reduce<Red::kSum>(k); }
void op_reduce_mean(Kctx& k) { reduce<Red::kMean>(k); }
void op_reduce_max(Kctx& k) { reduce<Red::kMax>(k); }
void op_reduce_min(Kctx& k) { reduce<Red::kMin>(k); }
void op_reduce_prod(Kctx& k) { reduce<Red::kProd>(k); }
void op_reduce_l1(Kctx& k) { reduce<Red::kL1>(k); }
void op_reduce_l2(Kctx& k) { reduce<Red::kL2>(k); }
void op_reduce_log_sum(Kctx& k) { reduce<Red::kLogSum>(k); }
void op_reduce_log_sum_exp(Kctx& k) { reduce<Red::kLogSumExp>(k); }
void op_reduce_sum_square(Kctx& k) { reduce<Red::kSumSquare>(k); }
void op_argmax(Kctx& k) { arg_reduce<true>(k); }
void op_argmin(Kctx& k) { arg_reduce<false>(k); }

void op_cumsum(Kctx& k) {
  TView x = k.in(0), ax = k.in(1);
  if (ax.numel != 1) k.invalid("axis must be a scalar");
  int r = x.ndim();
  int axis = k.axis(get_i64(ax, 0, k), r);
  bool exclusive = k.attr_i("exclusive", 0) != 0, reverse = k.attr_i("reverse", 0) != 0;
  int64_t outer = 1, len = x.shape[axis], inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int d = axis + 1; d < r; ++d) inner *= x.shape[d];
  TView y = k.out(0, x.shape);
  dispatch(NumTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = std::conditional_t<std::is_integral_v<T>, T, double>;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        A acc = 0;
        for (int64_t s = 0; s < len; ++s) {
          int64_t i = reverse ? len - 1 - s : s;
          int64_t off = (o * len + i) * inner + in;
          A v = static_cast<A>(ld(x.p<T>()[off]));
          if (exclusive) {
            y.p<T>()[off] = st<T>(acc);
            acc = static_cast<A>(acc + v);
          } else {
            acc = static_cast<A>(acc + v);
            y.p<T>()[off] = st<T>(acc);
          }
        }
      }
  });
}

void op_topk(Kctx& k) {
  TView x = k.in(0);
  int r = x.ndim();
  if (r == 0) k.invalid("input must have rank >= 1");
  int axis = k.axis(k.attr_i("axis", -1), r);
  int64_t kk;
  if (k.opset() > 0 && k.opset() < 10) {
    kk = k.attr_i("k", -1);
  } else {
    TView kt = k.in(1);
    if (kt.numel != 1) k.invalid("K must have one element");
    kk = get_i64(kt, 0, k);
  }
  int64_t len = x.shape[axis];
  if (kk < 0 || kk > len) k.invalid(cat("k = ", kk, " is out of range for axis of size ", len));
  bool largest = k.attr_i("largest", 1) != 0;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int d = axis + 1; d < r; ++d) inner *= x.shape[d];
  Shape os = x.shape;
  os[axis] = kk;
  TView vals = k.out(0, os);
  TView idx = k.out(1, os);
  if (idx.dtype != KEEL_DTYPE_I64) k.bad_dtype(idx.dtype, "Indices");
  dispatch(NumTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<int64_t> order(static_cast<size_t>(len));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        const T* base = x.p<T>() + o * len * inner + in;
        std::iota(order.begin(), order.end(), 0);
        auto cmp = [&](int64_t a, int64_t b) {
          auto va = ld(base[a * inner]), vb = ld(base[b * inner]);
          if (va == vb) return a < b;
          return largest ? va > vb : va < vb;
        };
        std::partial_sort(order.begin(), order.begin() + kk, order.end(), cmp);
        for (int64_t j = 0; j < kk; ++j) {
          int64_t off = (o * kk + j) * inner + in;
          vals.p<T>()[off] = base[order[j] * inner];
          idx.p<int64_t>()[off] = order[j];
        }
      }
  });
}

}  // namespace keel::ops::ref
