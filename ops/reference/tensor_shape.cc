// Reference kernels: data movement and shape ops — Identity, Reshape, Flatten, Squeeze, Unsqueeze, Transpose,
// Concat, Split, Slice, Gather*, Scatter*, Expand, Tile, Pad, Shape, Size, Constant*, Range, NonZero, OneHot,
// Trilu, DepthToSpace, SpaceToDepth, EyeLike. Most are dtype-agnostic and move elements by size.
#include "ops/reference/kernels.h"

namespace keel::ops::ref {
namespace {

// Axes given as an attribute (older opsets) or as input `input_index` (newer ones).
std::optional<std::vector<int64_t>> axes_attr_or_input(const Kctx& k, int input_index, const char* name = "axes") {
  if (auto a = k.attr_ints(name)) return a;
  if (input_index >= 0 && k.has_input(input_index)) return read_ints(k.in(input_index), k, name);
  return std::nullopt;
}

std::vector<int> normalize_axes(const Kctx& k, const std::vector<int64_t>& axes, int rank) {
  std::vector<int> r;
  for (int64_t a : axes) {
    int v = k.axis(a, rank);
    if (std::find(r.begin(), r.end(), v) != r.end()) k.invalid(cat("axis ", a, " is repeated"));
    r.push_back(v);
  }
  return r;
}

// Output = input data with a new shape.
void reshape_copy(Kctx& k, const TView& x, const Shape& os) {
  if (numel_of(os) != x.numel)
    k.invalid(cat("cannot reshape ", shape_str(x.shape), " (", x.numel, " elements) to ", shape_str(os)));
  TView y = k.out(0, os);
  copy_bytes(y, x);
}

// Copies x into a dense tensor of shape `os` reading x through strides `xs` (one per output dim).
template <class U>
void strided_copy(const Kctx& k, const U* src, const Shape& xs, U* dst, const Shape& os) {
  BcastPlan<1> plan(os, {xs});
  for_each_row<1>(k, plan, [&](int64_t o, const int64_t* off, const int64_t* is, int64_t n) {
    const U* s = src + off[0];
    U* d = dst + o;
    if (is[0] == 1) std::memcpy(d, s, static_cast<size_t>(n) * sizeof(U));
    else
      for (int64_t i = 0; i < n; ++i) d[i] = s[i * is[0]];
  });
}

int64_t fix_index(const Kctx& k, int64_t idx, int64_t dim, const char* what) {
  if (idx < -dim || idx >= dim) k.invalid(cat(what, " index ", idx, " is out of bounds for a dimension of size ", dim));
  return idx < 0 ? idx + dim : idx;
}

}  // namespace

void op_identity(Kctx& k) {
  TView x = k.in(0);
  TView y = k.out(0, x.shape);
  copy_bytes(y, x);
}

void op_reshape(Kctx& k) {
  TView x = k.in(0);
  std::vector<int64_t> spec;
  if (k.opset() > 0 && k.opset() < 5) {
    auto s = k.attr_ints("shape");
    if (!s) k.invalid("attribute shape is required");
    spec = *s;
  } else {
    spec = read_ints(k.in(1), k, "shape");
  }
  bool allowzero = k.attr_i("allowzero", 0) != 0;
  Shape os(spec.size());
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < spec.size(); ++i) {
    int64_t v = spec[i];
    if (v == 0 && !allowzero) {
      if (i >= x.shape.size()) k.invalid(cat("shape entry ", i, " is 0 but the input has rank ", x.ndim()));
      v = x.shape[i];
    } else if (v == -1) {
      if (infer >= 0) k.invalid("shape has more than one -1");
      infer = static_cast<int>(i);
      os[i] = -1;
      continue;
    } else if (v < 0) {
      k.invalid(cat("shape entry ", v, " is invalid"));
    }
    os[i] = v;
    known = mul_sat(known, v);
  }
  if (infer >= 0) {
    if (known == 0 || x.numel % known != 0)
      k.invalid(cat("cannot infer the -1 dimension reshaping ", shape_str(x.shape), " to ", shape_str(Shape(spec))));
    os[infer] = x.numel / known;
  }
  reshape_copy(k, x, os);
}

void op_flatten(Kctx& k) {
  TView x = k.in(0);
  int r = x.ndim();
  int64_t axis = k.attr_i("axis", 1);
  if (axis < -r || axis > r) k.invalid(cat("axis ", axis, " is out of range for rank ", r));
  if (axis < 0) axis += r;
  int64_t a = 1, b = 1;
  for (int i = 0; i < r; ++i) (i < axis ? a : b) *= x.shape[i];
  reshape_copy(k, x, {a, b});
}

void op_squeeze(Kctx& k) {
  TView x = k.in(0);
  auto axes = axes_attr_or_input(k, 1);
  Shape os;
  if (!axes) {
    for (int64_t d : x.shape)
      if (d != 1) os.push_back(d);
  } else {
    auto ax = normalize_axes(k, *axes, x.ndim());
    for (int i = 0; i < x.ndim(); ++i) {
      if (std::find(ax.begin(), ax.end(), i) != ax.end()) {
        if (x.shape[i] != 1) k.invalid(cat("cannot squeeze axis ", i, " of size ", x.shape[i]));
      } else {
        os.push_back(x.shape[i]);
      }
    }
  }
  reshape_copy(k, x, os);
}

void op_unsqueeze(Kctx& k) {
  TView x = k.in(0);
  auto axes = axes_attr_or_input(k, 1);
  if (!axes) k.invalid("axes are required");
  int orank = x.ndim() + static_cast<int>(axes->size());
  auto ax = normalize_axes(k, *axes, orank);
  Shape os;
  int src = 0;
  for (int i = 0; i < orank; ++i) {
    if (std::find(ax.begin(), ax.end(), i) != ax.end()) os.push_back(1);
    else os.push_back(x.shape[src++]);
  }
  reshape_copy(k, x, os);
}

void op_transpose(Kctx& k) {
  TView x = k.in(0);
  int r = x.ndim();
  std::vector<int64_t> perm;
  if (auto p = k.attr_ints("perm")) {
    perm = *p;
  } else {
    for (int i = r - 1; i >= 0; --i) perm.push_back(i);
  }
  if (static_cast<int>(perm.size()) != r) k.invalid(cat("perm has ", perm.size(), " entries for rank ", r));
  std::vector<bool> seen(r, false);
  for (int64_t p : perm) {
    if (p < 0 || p >= r || seen[p]) k.invalid(cat("perm ", shape_str(Shape(perm)), " is not a permutation"));
    seen[p] = true;
  }
  Shape os(r), xs(r), st = strides_of(x.shape);
  for (int i = 0; i < r; ++i) {
    os[i] = x.shape[perm[i]];
    xs[i] = st[perm[i]];
  }
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  dispatch_bytes(x.dtype, k, [&](auto tag) {
    using U = typename decltype(tag)::type;
    strided_copy<U>(k, x.p<U>(), xs, y.p<U>(), os);
  });
}

void op_concat(Kctx& k) {
  int n = k.n_inputs();
  std::vector<TView> xs;
  for (int i = 0; i < n; ++i)
    if (k.has_input(i)) xs.push_back(k.in(i));
  if (xs.empty()) k.invalid("needs at least one input");
  if (!k.attr_i_opt("axis")) k.invalid("attribute axis is required");
  int r = xs[0].ndim();
  int axis = k.axis(k.attr_i("axis", 0), r);
  Shape os = xs[0].shape;
  os[axis] = 0;
  for (auto& x : xs) {
    if (x.dtype != xs[0].dtype) k.invalid("inputs have different dtypes");
    if (x.ndim() != r)
      k.invalid(cat("inputs have different ranks: ", shape_str(xs[0].shape), " and ", shape_str(x.shape)));
    for (int d = 0; d < r; ++d)
      if (d != axis && x.shape[d] != xs[0].shape[d])
        k.invalid(
            cat("input shapes ", shape_str(xs[0].shape), " and ", shape_str(x.shape), " differ outside axis ", axis));
    os[axis] += x.shape[axis];
  }
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= os[d];
  for (int d = axis + 1; d < r; ++d) inner *= os[d];
  size_t es = y.elem_size();
  int64_t orow = os[axis] * inner * static_cast<int64_t>(es);
  int64_t off = 0;
  for (auto& x : xs) {
    int64_t chunk = x.shape[axis] * inner * static_cast<int64_t>(es);
    for (int64_t o = 0; o < outer; ++o)
      if (chunk) std::memcpy(y.bytes() + o * orow + off, x.bytes() + o * chunk, static_cast<size_t>(chunk));
    off += chunk;
  }
}

void op_split(Kctx& k) {
  TView x = k.in(0);
  int r = x.ndim();
  int axis = k.axis(k.attr_i("axis", 0), r);
  int nout = k.n_outputs();
  std::vector<int64_t> split;
  if (auto s = k.attr_ints("split")) split = *s;
  else if (k.has_input(1)) split = read_ints(k.in(1), k, "split");
  int64_t dim = x.shape[axis];
  if (split.empty()) {
    int64_t parts = k.attr_i("num_outputs", nout);
    if (parts <= 0) k.invalid("no outputs to split into");
    if (k.attr_i_opt("num_outputs")) {  // opset 18: the last chunk may be smaller
      int64_t chunk = (dim + parts - 1) / parts;
      for (int64_t i = 0; i < parts; ++i) split.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
    } else {
      if (dim % parts != 0) k.invalid(cat("dimension ", dim, " of axis ", axis, " does not split evenly into ", parts));
      split.assign(static_cast<size_t>(parts), dim / parts);
    }
  }
  if (static_cast<int>(split.size()) != nout)
    k.invalid(cat("split has ", split.size(), " entries but the node has ", nout, " outputs"));
  int64_t sum = 0;
  for (int64_t s : split) {
    if (s < 0) k.invalid("split entries must be non-negative");
    sum += s;
  }
  if (sum != dim) k.invalid(cat("split ", shape_str(Shape(split)), " does not sum to dimension ", dim));
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int d = axis + 1; d < r; ++d) inner *= x.shape[d];
  size_t es = x.elem_size();
  int64_t irow = dim * inner * static_cast<int64_t>(es);
  int64_t off = 0;
  for (int i = 0; i < nout; ++i) {
    Shape os = x.shape;
    os[axis] = split[i];
    int64_t chunk = split[i] * inner * static_cast<int64_t>(es);
    if (k.has_output(i)) {
      TView y = k.out(i, os);
      for (int64_t o = 0; o < outer; ++o)
        if (chunk) std::memcpy(y.bytes() + o * chunk, x.bytes() + o * irow + off, static_cast<size_t>(chunk));
    }
    off += chunk;
  }
}

void op_slice(Kctx& k) {
  TView x = k.in(0);
  int r = x.ndim();
  std::vector<int64_t> starts, ends, axes, steps;
  if (k.opset() > 0 && k.opset() < 10) {
    auto s = k.attr_ints("starts"), e = k.attr_ints("ends");
    if (!s || !e) k.invalid("attributes starts and ends are required");
    starts = *s;
    ends = *e;
    axes = k.attr_ints_or("axes", {});
  } else {
    starts = read_ints(k.in(1), k, "starts");
    ends = read_ints(k.in(2), k, "ends");
    if (k.has_input(3)) axes = read_ints(k.in(3), k, "axes");
    if (k.has_input(4)) steps = read_ints(k.in(4), k, "steps");
  }
  if (starts.size() != ends.size()) k.invalid("starts and ends have different lengths");
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size())
    k.invalid("starts, ends, axes and steps must have the same length");
  auto ax = normalize_axes(k, axes, r);
  Shape st(r, 0), step(r, 1), os = x.shape;
  for (size_t i = 0; i < ax.size(); ++i) {
    int a = ax[i];
    int64_t dim = x.shape[a], s = starts[i], e = ends[i], sp = steps[i];
    if (sp == 0) k.invalid("steps must not be 0");
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    if (sp > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      os[a] = e > s ? (e - s + sp - 1) / sp : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      os[a] = s > e ? (s - e + (-sp) - 1) / (-sp) : 0;
    }
    st[a] = s;
    step[a] = sp;
  }
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  Shape xs = strides_of(x.shape), ss(r);
  int64_t base = 0;
  for (int d = 0; d < r; ++d) {
    base += st[d] * xs[d];
    ss[d] = xs[d] * step[d];
  }
  dispatch_bytes(x.dtype, k, [&](auto tag) {
    using U = typename decltype(tag)::type;
    strided_copy<U>(k, x.p<U>() + base, ss, y.p<U>(), os);
  });
}

void op_gather(Kctx& k) {
  TView x = k.in(0), ind = k.in(1);
  int r = x.ndim();
  if (r == 0) k.invalid("data must have rank >= 1");
  int axis = k.axis(k.attr_i("axis", 0), r);
  auto idx = read_ints(ind, k, "indices");
  int64_t dim = x.shape[axis];
  for (auto& i : idx) i = fix_index(k, i, dim, "Gather");
  Shape os(x.shape.begin(), x.shape.begin() + axis);
  os.insert(os.end(), ind.shape.begin(), ind.shape.end());
  os.insert(os.end(), x.shape.begin() + axis + 1, x.shape.end());
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int d = axis + 1; d < r; ++d) inner *= x.shape[d];
  size_t bytes = static_cast<size_t>(inner) * x.elem_size();
  int64_t ni = static_cast<int64_t>(idx.size());
  k.parallel(outer * ni, std::max<int64_t>(1, 65536 / std::max<size_t>(bytes, 1)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t / ni, j = t % ni;
      std::memcpy(y.bytes() + t * bytes, x.bytes() + (o * dim + idx[j]) * bytes, bytes);
    }
  });
}

void op_gather_elements(Kctx& k) {
  TView x = k.in(0), ind = k.in(1);
  int r = x.ndim();
  if (ind.ndim() != r) k.invalid("data and indices must have the same rank");
  int axis = k.axis(k.attr_i("axis", 0), r);
  auto idx = read_ints(ind, k, "indices");
  TView y = k.out(0, ind.shape);
  if (y.numel == 0) return;
  Shape xs = strides_of(x.shape), is = strides_of(ind.shape);
  for (int d = 0; d < r; ++d)
    if (d != axis && ind.shape[d] > x.shape[d]) k.invalid("indices shape exceeds data shape outside axis");
  dispatch_bytes(x.dtype, k, [&](auto tag) {
    using U = typename decltype(tag)::type;
    for (int64_t i = 0; i < y.numel; ++i) {
      int64_t rem = i, off = 0;
      for (int d = 0; d < r; ++d) {
        int64_t c = rem / is[d];
        rem %= is[d];
        if (d == axis) c = fix_index(k, idx[i], x.shape[d], "GatherElements");
        off += c * xs[d];
      }
      y.p<U>()[i] = x.p<U>()[off];
    }
  });
}

void op_scatter_elements(Kctx& k) {
  TView x = k.in(0), ind = k.in(1), upd = k.in(2);
  int r = x.ndim();
  if (ind.ndim() != r || upd.shape != ind.shape) k.invalid("indices and updates must have data's rank and one shape");
  int axis = k.axis(k.attr_i("axis", 0), r);
  std::string red = k.attr_s("reduction", "none");
  auto idx = read_ints(ind, k, "indices");
  TView y = k.out(0, x.shape);
  copy_bytes(y, x);
  Shape xs = strides_of(x.shape), is = strides_of(ind.shape);
  dispatch(AllTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t i = 0; i < upd.numel; ++i) {
      int64_t rem = i, off = 0;
      for (int d = 0; d < r; ++d) {
        int64_t c = rem / is[d];
        rem %= is[d];
        if (d == axis) c = fix_index(k, idx[i], x.shape[d], "ScatterElements");
        else if (c >= x.shape[d]) k.invalid("indices shape exceeds data shape");
        off += c * xs[d];
      }
      T* dst = y.p<T>() + off;
      T u = upd.p<T>()[i];
      if (red == "none") *dst = u;
      else if constexpr (!std::is_same_v<T, bool>) {
        auto a = ld(*dst), b = ld(u);
        if (red == "add") *dst = st<T>(a + b);
        else if (red == "mul") *dst = st<T>(a * b);
        else if (red == "max") *dst = st<T>(a > b ? a : b);
        else if (red == "min") *dst = st<T>(a < b ? a : b);
        else k.invalid(cat("unknown reduction '", red, "'"));
      } else {
        k.unimpl("reductions on bool");
      }
    }
  });
}

void op_gather_nd(Kctx& k) {
  TView x = k.in(0), ind = k.in(1);
  int64_t b = k.attr_i("batch_dims", 0);
  int r = x.ndim(), q = ind.ndim();
  if (q < 1) k.invalid("indices must have rank >= 1");
  int64_t last = ind.shape.back();
  if (b < 0 || b >= std::min(r, q) || last > r - b) k.invalid("batch_dims or the last dimension of indices is invalid");
  for (int d = 0; d < b; ++d)
    if (x.shape[d] != ind.shape[d]) k.invalid("batch dimensions of data and indices differ");
  Shape os(ind.shape.begin(), ind.shape.end() - 1);
  os.insert(os.end(), x.shape.begin() + b + last, x.shape.end());
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  auto idx = read_ints(ind, k, "indices");
  int64_t batch = 1;
  for (int d = 0; d < b; ++d) batch *= x.shape[d];
  int64_t per_batch_x = 1, slice = 1;
  for (int d = static_cast<int>(b); d < r; ++d) per_batch_x *= x.shape[d];
  for (int d = static_cast<int>(b + last); d < r; ++d) slice *= x.shape[d];
  int64_t n_tuples = numel_of(Shape(ind.shape.begin(), ind.shape.end() - 1));
  int64_t per_batch_t = n_tuples / std::max<int64_t>(batch, 1);
  Shape xs = strides_of(x.shape);
  size_t bytes = static_cast<size_t>(slice) * x.elem_size();
  for (int64_t t = 0; t < n_tuples; ++t) {
    int64_t bi = t / std::max<int64_t>(per_batch_t, 1);
    int64_t off = bi * per_batch_x;
    for (int64_t j = 0; j < last; ++j) off += fix_index(k, idx[t * last + j], x.shape[b + j], "GatherND") * xs[b + j];
    std::memcpy(y.bytes() + t * bytes, x.bytes() + off * static_cast<int64_t>(x.elem_size()), bytes);
  }
}

void op_scatter_nd(Kctx& k) {
  TView x = k.in(0), ind = k.in(1), upd = k.in(2);
  int r = x.ndim(), q = ind.ndim();
  if (q < 1) k.invalid("indices must have rank >= 1");
  int64_t last = ind.shape.back();
  if (last > r) k.invalid("last dimension of indices exceeds data rank");
  Shape expect(ind.shape.begin(), ind.shape.end() - 1);
  expect.insert(expect.end(), x.shape.begin() + last, x.shape.end());
  if (upd.shape != expect) k.invalid(cat("updates shape ", shape_str(upd.shape), " should be ", shape_str(expect)));
  std::string red = k.attr_s("reduction", "none");
  TView y = k.out(0, x.shape);
  copy_bytes(y, x);
  auto idx = read_ints(ind, k, "indices");
  int64_t slice = 1;
  for (int d = static_cast<int>(last); d < r; ++d) slice *= x.shape[d];
  int64_t n_tuples = numel_of(Shape(ind.shape.begin(), ind.shape.end() - 1));
  Shape xs = strides_of(x.shape);
  dispatch(AllTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t t = 0; t < n_tuples; ++t) {
      int64_t off = 0;
      for (int64_t j = 0; j < last; ++j) off += fix_index(k, idx[t * last + j], x.shape[j], "ScatterND") * xs[j];
      T* dst = y.p<T>() + off;
      const T* src = upd.p<T>() + t * slice;
      for (int64_t i = 0; i < slice; ++i) {
        if (red == "none") dst[i] = src[i];
        else if constexpr (!std::is_same_v<T, bool>) {
          auto a = ld(dst[i]), b = ld(src[i]);
          if (red == "add") dst[i] = st<T>(a + b);
          else if (red == "mul") dst[i] = st<T>(a * b);
          else if (red == "max") dst[i] = st<T>(a > b ? a : b);
          else if (red == "min") dst[i] = st<T>(a < b ? a : b);
          else k.invalid(cat("unknown reduction '", red, "'"));
        } else {
          k.unimpl("reductions on bool");
        }
      }
    }
  });
}

void op_expand(Kctx& k) {
  TView x = k.in(0);
  auto shape = read_ints(k.in(1), k, "shape");
  Shape os = broadcast_shapes({x.shape, Shape(shape)}, k);
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  dispatch_bytes(x.dtype, k, [&](auto tag) {
    using U = typename decltype(tag)::type;
    strided_copy<U>(k, x.p<U>(), broadcast_strides(x.shape, os), y.p<U>(), os);
  });
}

void op_tile(Kctx& k) {
  TView x = k.in(0);
  auto rep = read_ints(k.in(1), k, "repeats");
  int r = x.ndim();
  if (static_cast<int>(rep.size()) != r) k.invalid(cat("repeats has ", rep.size(), " entries for rank ", r));
  Shape os(r);
  for (int d = 0; d < r; ++d) {
    if (rep[d] < 0) k.invalid("repeats must be non-negative");
    os[d] = x.shape[d] * rep[d];
  }
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  Shape xs = strides_of(x.shape), ys = strides_of(os);
  dispatch_bytes(x.dtype, k, [&](auto tag) {
    using U = typename decltype(tag)::type;
    k.parallel(y.numel, 16384, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        int64_t rem = i, off = 0;
        for (int d = 0; d < r; ++d) {
          int64_t c = rem / ys[d];
          rem %= ys[d];
          off += (c % x.shape[d]) * xs[d];
        }
        y.p<U>()[i] = x.p<U>()[off];
      }
    });
  });
}

void op_pad(Kctx& k) {
  TView x = k.in(0);
  int r = x.ndim();
  std::string mode = k.attr_s("mode", "constant");
  std::vector<int64_t> pads;
  double value = 0;
  bool have_value_tensor = false;
  TView vt;
  if (k.opset() > 0 && k.opset() < 11) {
    auto p = k.attr_ints("pads");
    if (!p) p = k.attr_ints("paddings");
    if (!p) k.invalid("attribute pads is required");
    pads = *p;
    value = k.attr_f("value", 0.0f);
  } else {
    pads = read_ints(k.in(1), k, "pads");
    if (k.has_input(2)) {
      vt = k.in(2);
      if (vt.numel > 0) {
        have_value_tensor = true;
        value = get_f64(vt, 0, k);
      }
    }
    if (k.has_input(3)) {  // opset 18 axes
      auto axes = normalize_axes(k, read_ints(k.in(3), k, "axes"), r);
      if (pads.size() != 2 * axes.size()) k.invalid("pads must have 2 entries per axis");
      std::vector<int64_t> full(2 * r, 0);
      for (size_t i = 0; i < axes.size(); ++i) {
        full[axes[i]] = pads[i];
        full[axes[i] + r] = pads[i + axes.size()];
      }
      pads = full;
    }
  }
  if (static_cast<int>(pads.size()) != 2 * r) k.invalid(cat("pads has ", pads.size(), " entries for rank ", r));
  Shape os(r);
  for (int d = 0; d < r; ++d) {
    os[d] = x.shape[d] + pads[d] + pads[d + r];
    if (os[d] < 0) k.invalid(cat("negative pads remove more than dimension ", d, " holds"));
    if (mode != "constant" && x.shape[d] == 0 && os[d] > 0) k.invalid(cat(mode, " padding of an empty dimension"));
  }
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    k.invalid(cat("unknown mode '", mode, "'"));
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  Shape xs = strides_of(x.shape), ys = strides_of(os);
  dispatch(AllTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T fill = have_value_tensor && vt.dtype == x.dtype ? vt.p<T>()[0] : st<T>(value);
    k.parallel(y.numel, 16384, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        int64_t rem = i, off = 0;
        bool outside = false;
        for (int d = 0; d < r; ++d) {
          int64_t c = rem / ys[d] - pads[d];
          rem %= ys[d];
          int64_t n = x.shape[d];
          if (c < 0 || c >= n) {
            if (mode == "constant") {
              outside = true;
              break;
            }
            if (mode == "edge") c = c < 0 ? 0 : n - 1;
            else if (mode == "wrap") c = ((c % n) + n) % n;
            else if (n == 1) c = 0;
            else {
              int64_t period = 2 * (n - 1);
              c = ((c % period) + period) % period;
              if (c >= n) c = period - c;
            }
          }
          off += c * xs[d];
        }
        y.p<T>()[i] = outside ? fill : x.p<T>()[off];
      }
    });
  });
}

void op_shape(Kctx& k) {
  TView x = k.in(0);
  int64_t r = x.ndim();
  int64_t s = k.attr_i("start", 0), e = k.attr_i("end", r);
  if (s < 0) s += r;
  if (e < 0) e += r;
  s = std::clamp<int64_t>(s, 0, r);
  e = std::clamp<int64_t>(e, 0, r);
  int64_t n = std::max<int64_t>(0, e - s);
  TView y = k.out(0, {n});
  if (y.dtype != KEEL_DTYPE_I64) k.bad_dtype(y.dtype, "output");
  for (int64_t i = 0; i < n; ++i) y.p<int64_t>()[i] = x.shape[s + i];
}

void op_size(Kctx& k) {
  TView x = k.in(0);
  TView y = k.out(0, {});
  if (y.dtype != KEEL_DTYPE_I64) k.bad_dtype(y.dtype, "output");
  y.p<int64_t>()[0] = x.numel;
}

void op_constant(Kctx& k) {
  if (const keel_tensor_t* t = k.attr_tensor("value")) {
    TView v = view_of(t);
    TView y = k.out(0, v.shape);
    if (y.dtype != v.dtype) k.fail(KEEL_STATUS_INTERNAL, "output dtype differs from the value attribute's");
    copy_bytes(y, v);
    return;
  }
  if (auto f = k.attr_f_opt("value_float")) {
    TView y = k.out(0, {});
    y.p<float>()[0] = *f;
    return;
  }
  if (auto i = k.attr_i_opt("value_int")) {
    TView y = k.out(0, {});
    y.p<int64_t>()[0] = *i;
    return;
  }
  if (auto fs = k.attr_floats("value_floats")) {
    TView y = k.out(0, {static_cast<int64_t>(fs->size())});
    std::copy(fs->begin(), fs->end(), y.p<float>());
    return;
  }
  if (auto is = k.attr_ints("value_ints")) {
    TView y = k.out(0, {static_cast<int64_t>(is->size())});
    std::copy(is->begin(), is->end(), y.p<int64_t>());
    return;
  }
  k.unimpl("Constant without value, value_float(s) or value_int(s) (strings and sparse values are not handled)");
}

void op_constant_of_shape(Kctx& k) {
  auto shape = read_ints(k.in(0), k, "shape");
  for (int64_t d : shape)
    if (d < 0) k.invalid("shape entries must be non-negative");
  TView y = k.out(0, Shape(shape));
  const keel_tensor_t* t = k.attr_tensor("value");
  if (t) {
    TView v = view_of(t);
    if (v.numel != 1) k.invalid("value must have one element");
    if (v.dtype != y.dtype) k.fail(KEEL_STATUS_INTERNAL, "output dtype differs from the value attribute's");
    size_t es = y.elem_size();
    for (int64_t i = 0; i < y.numel; ++i) std::memcpy(y.bytes() + i * es, v.data, es);
  } else if (y.numel > 0) {
    std::memset(y.data, 0, static_cast<size_t>(y.numel) * y.elem_size());
  }
}

void op_range(Kctx& k) {
  TView s = k.in(0), l = k.in(1), d = k.in(2);
  if (s.numel != 1 || l.numel != 1 || d.numel != 1) k.invalid("start, limit and delta must be scalars");
  dispatch(NumTs{}, s.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = calc_t<T>;
    C start = ld(s.p<T>()[0]), limit = ld(l.p<T>()[0]), delta = ld(d.p<T>()[0]);
    if (delta == C(0)) k.invalid("delta must not be 0");
    double q = std::ceil((static_cast<double>(limit) - static_cast<double>(start)) / static_cast<double>(delta));
    if (!(q < 9.0e15)) k.invalid("the range has too many elements (or a NaN bound)");
    int64_t n = static_cast<int64_t>(std::max(q, 0.0));
    TView y = k.out(0, {n});
    for (int64_t i = 0; i < n; ++i) y.p<T>()[i] = st<T>(static_cast<C>(start + static_cast<C>(i) * delta));
  });
}

void op_nonzero(Kctx& k) {
  TView x = k.in(0);
  int r = std::max(1, x.ndim());
  Shape shp = x.ndim() == 0 ? Shape{1} : x.shape;
  std::vector<int64_t> hits;
  dispatch(AllTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t i = 0; i < x.numel; ++i)
      if (ld(x.p<T>()[i]) != calc_t<T>(0)) hits.push_back(i);
  });
  int64_t nnz = static_cast<int64_t>(hits.size());
  TView y = k.out(0, {r, nnz});
  Shape xs = strides_of(shp);
  for (int64_t j = 0; j < nnz; ++j) {
    int64_t rem = hits[j];
    for (int d = 0; d < r; ++d) {
      y.p<int64_t>()[d * nnz + j] = rem / xs[d];
      rem %= xs[d];
    }
  }
}

void op_onehot(Kctx& k) {
  TView ind = k.in(0), dep = k.in(1), vals = k.in(2);
  if (dep.numel != 1) k.invalid("depth must be a scalar");
  if (vals.numel != 2) k.invalid("values must have two elements [off, on]");
  double depth_f = get_f64(dep, 0, k);
  if (!(depth_f >= 1 && depth_f < 9.0e15)) k.invalid("depth must be positive");
  int64_t depth = static_cast<int64_t>(depth_f);
  int r = ind.ndim();
  int axis = k.axis(k.attr_i("axis", -1), r + 1);
  Shape os = ind.shape;
  os.insert(os.begin() + axis, depth);
  TView y = k.out(0, os);
  std::vector<double> idx(static_cast<size_t>(ind.numel));
  for (int64_t i = 0; i < ind.numel; ++i) idx[i] = get_f64(ind, i, k);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= ind.shape[d];
  for (int d = axis; d < r; ++d) inner *= ind.shape[d];
  dispatch_bytes(vals.dtype, k, [&](auto tag) {
    using U = typename decltype(tag)::type;
    U off = vals.p<U>()[0], on = vals.p<U>()[1];
    for (int64_t i = 0; i < y.numel; ++i) y.p<U>()[i] = off;
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        double dv = idx[o * inner + in];
        if (!(dv >= -static_cast<double>(depth) && dv < static_cast<double>(depth))) continue;  // also NaN
        auto v = static_cast<int64_t>(dv);
        if (v < 0) v += depth;
        if (v >= 0 && v < depth) y.p<U>()[(o * depth + v) * inner + in] = on;
      }
  });
}

void op_trilu(Kctx& k) {
  TView x = k.in(0);
  if (x.ndim() < 2) k.invalid("input must have rank >= 2");
  int64_t kk = k.has_input(1) ? get_i64(k.in(1), 0, k) : 0;
  bool upper = k.attr_i("upper", 1) != 0;
  TView y = k.out(0, x.shape);
  int64_t R = x.shape[x.ndim() - 2], C = x.shape[x.ndim() - 1];
  int64_t mats = R * C == 0 ? 0 : x.numel / (R * C);
  dispatch_bytes(x.dtype, k, [&](auto tag) {
    using U = typename decltype(tag)::type;
    for (int64_t m = 0; m < mats; ++m)
      for (int64_t i = 0; i < R; ++i)
        for (int64_t j = 0; j < C; ++j) {
          int64_t o = (m * R + i) * C + j;
          bool keep = upper ? (j - i >= kk) : (j - i <= kk);
          y.p<U>()[o] = keep ? x.p<U>()[o] : U(0);
        }
  });
}

void op_depth_to_space(Kctx& k) {
  TView x = k.in(0);
  if (x.ndim() != 4) k.invalid("input must be 4-D");
  int64_t b = k.attr_i("blocksize", 0);
  if (b <= 0) k.invalid("blocksize must be positive");
  bool crd = k.attr_s("mode", "DCR") == "CRD";
  int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  if (C % (b * b) != 0) k.invalid(cat("channels ", C, " are not divisible by blocksize^2 ", b * b));
  int64_t Co = C / (b * b);
  TView y = k.out(0, {N, Co, H * b, W * b});
  dispatch_bytes(x.dtype, k, [&](auto tag) {
    using U = typename decltype(tag)::type;
    int64_t i = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < Co; ++c)
        for (int64_t h = 0; h < H * b; ++h)
          for (int64_t w = 0; w < W * b; ++w, ++i) {
            int64_t bh = h % b, bw = w % b;
            int64_t ic = crd ? c * b * b + bh * b + bw : (bh * b + bw) * Co + c;
            y.p<U>()[i] = x.p<U>()[((n * C + ic) * H + h / b) * W + w / b];
          }
  });
}

void op_space_to_depth(Kctx& k) {
  TView x = k.in(0);
  if (x.ndim() != 4) k.invalid("input must be 4-D");
  int64_t b = k.attr_i("blocksize", 0);
  if (b <= 0) k.invalid("blocksize must be positive");
  int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  if (H % b != 0 || W % b != 0) k.invalid("spatial dimensions are not divisible by blocksize");
  int64_t Ho = H / b, Wo = W / b;
  TView y = k.out(0, {N, C * b * b, Ho, Wo});
  dispatch_bytes(x.dtype, k, [&](auto tag) {
    using U = typename decltype(tag)::type;
    int64_t i = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t oc = 0; oc < C * b * b; ++oc)
        for (int64_t h = 0; h < Ho; ++h)
          for (int64_t w = 0; w < Wo; ++w, ++i) {
            int64_t c = oc % C, blk = oc / C, bh = blk / b, bw = blk % b;
            y.p<U>()[i] = x.p<U>()[((n * C + c) * H + h * b + bh) * W + w * b + bw];
          }
  });
}

void op_eye_like(Kctx& k) {
  TView x = k.in(0);
  if (x.ndim() != 2) k.invalid("input must be 2-D");
  int64_t kk = k.attr_i("k", 0);
  TView y = k.out(0, x.shape);
  dispatch(
      AllTs{}, y.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < x.shape[0]; ++i)
          for (int64_t j = 0; j < x.shape[1]; ++j) y.p<T>()[i * x.shape[1] + j] = st<T>(j - i == kk ? 1 : 0);
      },
      "output");
}

}  // namespace keel::ops::ref
