// Reference kernels: MaxPool (with Indices), AveragePool, LpPool and their Global forms, N-D.
#include "ops/reference/kernels.h"
#include "ops/reference/nn_common.h"

namespace keel::ops::ref {
namespace {

enum class PoolKind { kMax, kAvg, kLp };

// floor(a / b) and ceil(a / b) for b > 0 and any sign of a.
int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// Visits the valid input positions of the window of output position `o` (flat, row-major over g.out):
// f(flat input offset, multi-index) for positions inside the input, in row-major kernel order; returns the number of
// positions inside the padded input ([-pad_begin, in + pad_end)) for count_include_pad. Only the taps that land
// inside the input are visited (per axis a range of kernel indices), so the cost is the window's overlap with the
// input, not the kernel's size: a kernel far larger than its input (mostly padding) stays cheap.
struct Window {
  explicit Window(int r) : oi(r), ki(r), ii(r), lo(r), hi(r) {}
  std::vector<int64_t> oi, ki, ii, lo, hi;  // output index, kernel index, input index, tap range per axis
};

template <class F>
int64_t visit_window(const SpatialGeom& g, int64_t o, Window& w, F&& f) {
  const int r = g.r;
  auto &oi = w.oi, &ki = w.ki, &ii = w.ii, &lo = w.lo, &hi = w.hi;
  int64_t rem = o;
  for (int d = r - 1; d >= 0; --d) {
    oi[d] = rem % g.out[d];
    rem /= g.out[d];
  }
  // Per axis: taps [lo, hi) inside the input; the count of taps inside the padded input.
  int64_t padded_count = 1;
  bool empty = false;
  for (int d = 0; d < r; ++d) {
    const int64_t base = oi[d] * g.strides[d] - g.pads[d], dil = g.dilations[d], K = g.kernel[d];
    lo[d] = std::max<int64_t>(0, ceil_div(-base, dil));
    hi[d] = std::min<int64_t>(K, floor_div(g.in[d] - 1 - base, dil) + 1);
    const int64_t padded_hi = std::min<int64_t>(K, floor_div(g.in[d] + g.pads[d + r] - 1 - base, dil) + 1);
    const int64_t padded_lo = std::max<int64_t>(0, ceil_div(-g.pads[d] - base, dil));
    padded_count *= std::max<int64_t>(0, padded_hi - padded_lo);
    if (hi[d] <= lo[d]) empty = true;
  }
  if (empty) return padded_count;
  for (int d = 0; d < r; ++d) ki[d] = lo[d];
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < r; ++d) {
      ii[d] = oi[d] * g.strides[d] - g.pads[d] + ki[d] * g.dilations[d];
      off = off * g.in[d] + ii[d];
    }
    f(off, ii);
    int d = r - 1;
    for (; d >= 0; --d) {
      if (++ki[d] < hi[d]) break;
      ki[d] = lo[d];
    }
    if (d < 0) break;
  }
  return padded_count;
}

void pool(Kctx& k, PoolKind kind, bool global) {
  TView x = k.in(0);
  if (x.ndim() < 3) k.invalid(cat("input must have rank >= 3 (N, C, spatial...), got ", shape_str(x.shape)));
  const int r = x.ndim() - 2;
  Shape in(x.shape.begin() + 2, x.shape.end());
  SpatialGeom g;
  if (global) {
    g.r = r;
    g.in = in;
    g.kernel = in;
    g.strides.assign(r, 1);
    g.dilations.assign(r, 1);
    g.pads.assign(2 * r, 0);
    g.out.assign(r, 1);
    for (int64_t v : in)
      if (v == 0) k.invalid("global pooling over an empty spatial dimension");
  } else {
    auto ks = k.attr_ints("kernel_shape");
    if (!ks) k.invalid("attribute kernel_shape is required");
    g = spatial_geom(k, in, *ks, true, true);
  }
  const int64_t N = x.shape[0], C = x.shape[1];
  Shape os = {N, C};
  os.insert(os.end(), g.out.begin(), g.out.end());
  TView y = k.out(0, os);
  bool want_idx = kind == PoolKind::kMax && k.has_output(1);
  TView idx;
  if (want_idx) {
    idx = k.out(1, os);
    if (idx.dtype != KEEL_DTYPE_I64) k.bad_dtype(idx.dtype, "Indices");
  }
  if (y.numel == 0) return;
  const bool include_pad = k.attr_i("count_include_pad", 0) != 0;
  const float p = static_cast<float>(k.attr_i("p", 2));
  const int64_t storage_order = k.attr_i("storage_order", 0);
  const int64_t I = g.in_size(), O = g.out_size();
  Shape col_strides(r);  // column-major strides for storage_order = 1
  {
    int64_t acc = 1;
    for (int d = 0; d < r; ++d) {
      col_strides[d] = acc;
      acc *= g.in[d];
    }
  }
  auto body = [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Cc = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* px = x.p<T>();
    T* py = y.p<T>();
    k.parallel(N * C, std::max<int64_t>(1, 4096 / std::max<int64_t>(O * g.kernel_size(), 1)),
               [&](int64_t b, int64_t e) {
                 Window w(r);
                 for (int64_t plane = b; plane < e; ++plane) {
                   const T* xp = px + plane * I;
                   for (int64_t o = 0; o < O; ++o) {
                     if (kind == PoolKind::kMax) {
                       bool any = false;
                       Cc best = 0;
                       int64_t best_i = -1;
                       visit_window(g, o, w, [&](int64_t off, const std::vector<int64_t>& pos) {
                         Cc v = static_cast<Cc>(ld(xp[off]));
                         if (!any || v > best) {
                           any = true;
                           best = v;
                           if (want_idx) {
                             if (storage_order == 0) {
                               best_i = off;
                             } else {
                               best_i = 0;
                               for (int d = 0; d < r; ++d) best_i += pos[d] * col_strides[d];
                             }
                           }
                         }
                       });
                       py[plane * O + o] = any ? st<T>(best) : st<T>(Cc(0));
                       if (want_idx) idx.p<int64_t>()[plane * O + o] = any ? plane * I + best_i : -1;
                     } else if (kind == PoolKind::kAvg) {
                       Cc sum = 0;
                       int64_t cnt = 0;
                       int64_t padded = visit_window(g, o, w, [&](int64_t off, const std::vector<int64_t>&) {
                         sum += static_cast<Cc>(ld(xp[off]));
                         ++cnt;
                       });
                       int64_t div = include_pad ? padded : cnt;
                       py[plane * O + o] = st<T>(div > 0 ? sum / static_cast<Cc>(div) : Cc(0));
                     } else {
                       Cc sum = 0;
                       visit_window(g, o, w, [&](int64_t off, const std::vector<int64_t>&) {
                         sum += std::pow(std::abs(static_cast<Cc>(ld(xp[off]))), static_cast<Cc>(p));
                       });
                       py[plane * O + o] = st<T>(std::pow(sum, static_cast<Cc>(1) / static_cast<Cc>(p)));
                     }
                   }
                 }
               });
  };
  if (kind == PoolKind::kMax) dispatch(FloatTs{} + TL<int8_t, uint8_t>{}, x.dtype, k, body);
  else dispatch(FloatTs{}, x.dtype, k, body);
}

}  // namespace

void op_max_pool(Kctx& k) { pool(k, PoolKind::kMax, false); }
void op_average_pool(Kctx& k) { pool(k, PoolKind::kAvg, false); }
void op_lp_pool(Kctx& k) { pool(k, PoolKind::kLp, false); }
void op_global_average_pool(Kctx& k) { pool(k, PoolKind::kAvg, true); }
void op_global_max_pool(Kctx& k) { pool(k, PoolKind::kMax, true); }
void op_global_lp_pool(Kctx& k) { pool(k, PoolKind::kLp, true); }

}  // namespace keel::ops::ref
