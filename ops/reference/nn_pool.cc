// Reference kernels: MaxPool (with Indices), AveragePool, LpPool and their Global forms, N-D.
#include "ops/reference/kernels.h"
#include "ops/reference/nn_common.h"

namespace keel::ops::ref {
namespace {

enum class PoolKind { kMax, kAvg, kLp };

// Visits the valid input positions of the window of output position `o` (flat, row-major over g.out):
// f(flat input offset, multi-index) for positions inside the input; returns the number of positions inside the
// padded input ([-pad_begin, in + pad_end)) for count_include_pad.
template <class F>
int64_t visit_window(const SpatialGeom& g, int64_t o, std::vector<int64_t>& oi, std::vector<int64_t>& ki,
                     std::vector<int64_t>& ii, F&& f) {
  const int r = g.r;
  int64_t rem = o;
  for (int d = r - 1; d >= 0; --d) {
    oi[d] = rem % g.out[d];
    rem /= g.out[d];
  }
  int64_t padded_count = 0;
  std::fill(ki.begin(), ki.end(), 0);
  const int64_t Ks = g.kernel_size();
  for (int64_t kidx = 0; kidx < Ks; ++kidx) {
    bool inside = true, inside_padded = true;
    int64_t off = 0;
    for (int d = 0; d < r; ++d) {
      int64_t id = oi[d] * g.strides[d] - g.pads[d] + ki[d] * g.dilations[d];
      ii[d] = id;
      if (id < 0 || id >= g.in[d]) inside = false;
      if (id < -g.pads[d] || id >= g.in[d] + g.pads[d + r]) inside_padded = false;
      off = off * g.in[d] + id;
    }
    if (inside_padded) ++padded_count;
    if (inside) f(off, ii);
    for (int d = r - 1; d >= 0; --d) {
      if (++ki[d] < g.kernel[d]) break;
      ki[d] = 0;
    }
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
      std::vector<int64_t> oi(r), ki(r), ii(r);
      for (int64_t plane = b; plane < e; ++plane) {
        const T* xp = px + plane * I;
        for (int64_t o = 0; o < O; ++o) {
          if (kind == PoolKind::kMax) {
            bool any = false;
            Cc best = 0;
            int64_t best_i = -1;
            visit_window(g, o, oi, ki, ii, [&](int64_t off, const std::vector<int64_t>& pos) {
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
            int64_t padded = visit_window(g, o, oi, ki, ii, [&](int64_t off, const std::vector<int64_t>&) {
              sum += static_cast<Cc>(ld(xp[off]));
              ++cnt;
            });
            int64_t div = include_pad ? padded : cnt;
            py[plane * O + o] = st<T>(div > 0 ? sum / static_cast<Cc>(div) : Cc(0));
          } else {
            Cc sum = 0;
            visit_window(g, o, oi, ki, ii, [&](int64_t off, const std::vector<int64_t>&) {
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
