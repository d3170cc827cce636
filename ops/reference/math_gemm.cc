// Reference kernels: Gemm, MatMul (numpy batching/broadcast, 1-D operands), MatMulInteger, QLinearMatMul, Einsum.
#include <map>

#include "ops/reference/kernels.h"
#include "ops/reference/nn_common.h"

namespace keel::ops::ref {
namespace {

// Shapes of a numpy matmul: batch broadcast plus (M, K) x (K, N).
struct MatMulPlan {
  int64_t M = 1, K = 1, N = 1;
  Shape batch;           // broadcast batch shape
  Shape a_bstr, b_bstr;  // batch strides (in matrices) of A and B over `batch`, 0 when broadcast
  Shape out;             // output shape (1-D operands' dims removed)
  int64_t batch_count() const { return numel_of(batch); }
};

MatMulPlan matmul_plan(const Kctx& k, const Shape& as0, const Shape& bs0) {
  if (as0.empty() || bs0.empty()) k.invalid("MatMul operands must have rank >= 1");
  Shape as = as0, bs = bs0;
  bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  MatMulPlan p;
  p.M = as[as.size() - 2];
  p.K = as.back();
  p.N = bs.back();
  if (bs[bs.size() - 2] != p.K)
    k.invalid(cat("inner dimensions do not match: A ", shape_str(as0), " x B ", shape_str(bs0)));
  Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  p.batch = broadcast_shapes({ab, bb}, k);
  p.a_bstr = broadcast_strides(ab, p.batch);
  p.b_bstr = broadcast_strides(bb, p.batch);
  p.out = p.batch;
  if (!a1) p.out.push_back(p.M);
  if (!b1) p.out.push_back(p.N);
  return p;
}

// Y[batch, M, N] = A x B with dense C arrays laid out as the (promoted) operand shapes.
template <class C>
void matmul_run(const Kctx& k, const MatMulPlan& p, const C* A, const C* B, C* Y) {
  const int64_t nb = p.batch_count();
  const Shape bst = strides_of(p.batch);
  const int64_t rows = nb * p.M;
  k.parallel(rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(p.N * p.K, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e;) {
      int64_t bi = r / p.M, i0 = r % p.M;
      int64_t i1 = std::min<int64_t>(p.M, i0 + (e - r));
      int64_t aoff = 0, boff = 0, rem = bi;
      for (size_t d = 0; d < p.batch.size(); ++d) {
        int64_t idx = rem / bst[d];
        rem %= bst[d];
        aoff += idx * p.a_bstr[d];
        boff += idx * p.b_bstr[d];
      }
      gemm_rows(i0, i1, p.N, p.K, A + aoff * p.M * p.K, p.K, 1, B + boff * p.K * p.N, p.N, Y + bi * p.M * p.N, p.N,
                false);
      r += i1 - i0;
    }
  });
}

// Requantizes int32 accumulators: saturate(round(acc * scale) + zero_point).
template <class T>
T requant(double acc, double scale, int32_t zp) {
  double v = std::nearbyint(acc * scale) + zp;
  if (!(v == v)) return T(0);
  v = std::min<double>(std::max<double>(v, std::numeric_limits<T>::lowest()), std::numeric_limits<T>::max());
  return static_cast<T>(v);
}

}  // namespace

void op_matmul(Kctx& k) {
  TView a = k.in(0), b = k.in(1);
  if (a.dtype != b.dtype)
    k.invalid(cat("A and B have different dtypes ", dtype_str(a.dtype), " and ", dtype_str(b.dtype)));
  MatMulPlan p = matmul_plan(k, a.shape, b.shape);
  TView y = k.out(0, p.out);
  if (y.numel == 0) return;
  if (p.K == 0) {
    std::memset(y.data, 0, static_cast<size_t>(y.numel) * y.elem_size());
    return;
  }
  dispatch(FloatTs{} + TL<int32_t, int64_t, uint32_t, uint64_t>{}, a.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_half_v<T>) {
      auto af = to_calc<float>(a, k, "A"), bf = to_calc<float>(b, k, "B");
      std::vector<float> yf(static_cast<size_t>(y.numel));
      matmul_run<float>(k, p, af.data(), bf.data(), yf.data());
      for (int64_t i = 0; i < y.numel; ++i) y.p<T>()[i] = st<T>(yf[i]);
    } else {
      matmul_run<T>(k, p, a.p<T>(), b.p<T>(), y.p<T>());
    }
  });
}

void op_gemm(Kctx& k) {
  TView a = k.in(0), b = k.in(1);
  auto c = k.opt_in(2);
  if (a.ndim() != 2 || b.ndim() != 2)
    k.invalid(cat("A and B must be 2-D, got ", shape_str(a.shape), " and ", shape_str(b.shape)));
  if (a.dtype != b.dtype) k.invalid("A and B have different dtypes");
  bool ta = k.attr_i("transA", 0) != 0, tb = k.attr_i("transB", 0) != 0;
  float alpha = k.attr_f("alpha", 1.0f), beta = k.attr_f("beta", 1.0f);
  int64_t M = ta ? a.shape[1] : a.shape[0], K = ta ? a.shape[0] : a.shape[1];
  int64_t K2 = tb ? b.shape[1] : b.shape[0], N = tb ? b.shape[0] : b.shape[1];
  if (K != K2)
    k.invalid(cat("inner dimensions do not match: A ", shape_str(a.shape), (ta ? "^T" : ""), " x B ",
                  shape_str(b.shape), (tb ? "^T" : "")));
  Shape os = {M, N};
  if (c) {
    if (c->dtype != a.dtype) k.invalid("C has a different dtype than A");
    Shape bs = broadcast_shapes({c->shape, os}, k);
    if (bs != os)
      k.invalid(cat("C ", shape_str(c->shape), " is not unidirectionally broadcastable to ", shape_str(os)));
  }
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = std::conditional_t<is_half_v<T>, float, T>;
    std::vector<C> abuf, bbuf, ybuf;
    const C* A;
    const C* B;
    C* Y;
    if constexpr (is_half_v<T>) {
      abuf = to_calc<float>(a, k, "A");
      bbuf = to_calc<float>(b, k, "B");
      ybuf.resize(static_cast<size_t>(y.numel));
      A = abuf.data();
      B = bbuf.data();
      Y = ybuf.data();
    } else {
      A = a.p<T>();
      B = b.p<T>();
      Y = y.p<T>();
    }
    if (tb) {  // B^T packed so that rows of B' are contiguous
      std::vector<C> bt(static_cast<size_t>(K * N));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t kk = 0; kk < K; ++kk) bt[kk * N + n] = B[n * K + kk];
      bbuf.swap(bt);
      B = bbuf.data();
    }
    int64_t lda = ta ? 1 : K, ak = ta ? M : 1;
    k.parallel(M, std::max<int64_t>(1, 32768 / std::max<int64_t>(N * K, 1)),
               [&](int64_t b0, int64_t e0) { gemm_rows(b0, e0, N, K, A, lda, ak, B, N, Y, N, false); });
    std::vector<C> cb;
    if (c) {
      cb = to_calc<C>(*c, k, "C");
      cb = broadcast_to(cb.data(), c->shape, os);
    }
    const C ca = static_cast<C>(alpha), cbeta = static_cast<C>(beta);
    for (int64_t i = 0; i < M * N; ++i) {
      C v = Y[i];
      if (alpha != 1.0f) v = static_cast<C>(v * ca);
      if (c && beta != 0.0f) v = static_cast<C>(v + cbeta * cb[i]);
      Y[i] = v;
    }
    if constexpr (is_half_v<T>)
      for (int64_t i = 0; i < y.numel; ++i) y.p<T>()[i] = st<T>(ybuf[i]);
  };
  dispatch(FloatTs{} + TL<int32_t, int64_t, uint32_t, uint64_t>{}, a.dtype, k, run);
}

void op_matmul_integer(Kctx& k) {
  TView a = k.in(0), b = k.in(1);
  auto azp = k.opt_in(2), bzp = k.opt_in(3);
  MatMulPlan p = matmul_plan(k, a.shape, b.shape);
  TView y = k.out(0, p.out);
  if (y.dtype != KEEL_DTYPE_I32) k.bad_dtype(y.dtype, "output");
  if (y.numel == 0) return;
  // Zero points: scalar, or per row of A (size M) / per column of B (size N).
  auto to_i32 = [&](const TView& t, const std::optional<TView>& zp, bool per_row, int64_t count, const char* what) {
    std::vector<int32_t> r(static_cast<size_t>(t.numel));
    std::vector<int64_t> z = zp ? read_ints(*zp, k, what) : std::vector<int64_t>{0};
    if (z.empty()) z = {0};
    if (z.size() != 1 && static_cast<int64_t>(z.size()) != count)
      k.invalid(cat(what, " zero point has ", z.size(), " entries; expected 1 or ", count));
    dispatch(
        TL<uint8_t, int8_t>{}, t.dtype, k,
        [&](auto tag) {
          using T = typename decltype(tag)::type;
          int64_t cols = t.shape.back();
          for (int64_t i = 0; i < t.numel; ++i) {
            int64_t zi = z.size() == 1 ? 0 : (per_row ? (i / cols) % count : i % cols);
            r[i] = static_cast<int32_t>(t.p<T>()[i]) - static_cast<int32_t>(z[zi]);
          }
        },
        what);
    return r;
  };
  auto ai = to_i32(a, azp, true, p.M, "a");
  auto bi = to_i32(b, bzp, false, p.N, "b");
  matmul_run<int32_t>(k, p, ai.data(), bi.data(), y.p<int32_t>());
}

void op_qlinear_matmul(Kctx& k) {
  TView a = k.in(0), as = k.in(1), b = k.in(3), bs = k.in(4), ys = k.in(6);
  auto azp = k.opt_in(2), bzp = k.opt_in(5), yzp = k.opt_in(7);
  MatMulPlan p = matmul_plan(k, a.shape, b.shape);
  TView y = k.out(0, p.out);
  if (y.numel == 0) return;
  auto to_i32 = [&](const TView& t, const std::optional<TView>& zp, const char* what) {
    std::vector<int32_t> r(static_cast<size_t>(t.numel));
    std::vector<int64_t> z = zp ? read_ints(*zp, k, what) : std::vector<int64_t>{0};
    if (z.size() != 1) k.unimpl(cat(what, " zero point must be a scalar in the reference kernel"));
    dispatch(
        TL<uint8_t, int8_t>{}, t.dtype, k,
        [&](auto tag) {
          using T = typename decltype(tag)::type;
          for (int64_t i = 0; i < t.numel; ++i) r[i] = static_cast<int32_t>(t.p<T>()[i]) - static_cast<int32_t>(z[0]);
        },
        what);
    return r;
  };
  if (as.numel != 1 || bs.numel != 1 || ys.numel != 1)
    k.unimpl("only per-tensor scales are handled by the reference QLinearMatMul");
  auto ai = to_i32(a, azp, "a");
  auto bi = to_i32(b, bzp, "b");
  std::vector<int32_t> acc(static_cast<size_t>(y.numel));
  matmul_run<int32_t>(k, p, ai.data(), bi.data(), acc.data());
  double scale = static_cast<double>(static_cast<float>(get_f64(as, 0, k)) * static_cast<float>(get_f64(bs, 0, k)) /
                                     static_cast<float>(get_f64(ys, 0, k)));
  int32_t z = yzp ? static_cast<int32_t>(get_i64(*yzp, 0, k)) : 0;
  dispatch(
      TL<uint8_t, int8_t>{}, y.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < y.numel; ++i) y.p<T>()[i] = requant<T>(static_cast<double>(acc[i]), scale, z);
      },
      "output");
}

// Einsum by direct summation over all labels: correct for every equation, O(product of all label sizes).
void op_einsum(Kctx& k) {
  std::string eq = k.attr_s("equation", "");
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  int n = k.n_inputs();
  std::vector<TView> xs;
  for (int i = 0; i < n; ++i) xs.push_back(k.in(i));
  if (xs.empty()) k.invalid("needs at least one input");
  for (auto& x : xs)
    if (x.dtype != xs[0].dtype) k.invalid("inputs have different dtypes");
  std::string lhs = eq, rhs;
  bool explicit_out = false;
  if (auto pos = eq.find("->"); pos != std::string::npos) {
    lhs = eq.substr(0, pos);
    rhs = eq.substr(pos + 2);
    explicit_out = true;
  }
  std::vector<std::string> terms;
  {
    size_t s = 0;
    for (size_t i = 0; i <= lhs.size(); ++i)
      if (i == lhs.size() || lhs[i] == ',') {
        terms.push_back(lhs.substr(s, i - s));
        s = i + 1;
      }
  }
  if (static_cast<int>(terms.size()) != n)
    k.invalid(cat("equation '", eq, "' has ", terms.size(), " operands but the node has ", n, " inputs"));
  // Ellipsis dims get labels 'A'.. (uppercase are not valid user labels in our parser's ellipsis expansion).
  int ell_rank = 0;
  for (int i = 0; i < n; ++i) {
    int letters = 0;
    bool has_ell = terms[i].find("...") != std::string::npos;
    for (char ch : terms[i])
      if (std::isalpha(static_cast<unsigned char>(ch))) ++letters;
    if (has_ell) ell_rank = std::max(ell_rank, xs[i].ndim() - letters);
    else if (letters != xs[i].ndim())
      k.invalid(cat("operand ", i, " term '", terms[i], "' does not match its rank ", xs[i].ndim()));
  }
  auto expand = [&](const std::string& t, int rank_here) {
    std::vector<int> labels;  // label ids: letters 0..127, ellipsis dims 200+
    for (size_t i = 0; i < t.size(); ++i) {
      if (t.compare(i, 3, "...") == 0) {
        for (int e = ell_rank - rank_here; e < ell_rank; ++e) labels.push_back(200 + e);
        i += 2;
      } else if (std::isalpha(static_cast<unsigned char>(t[i]))) {
        labels.push_back(static_cast<unsigned char>(t[i]));
      } else {
        k.invalid(cat("unexpected character '", t[i], "' in equation '", eq, "'"));
      }
    }
    return labels;
  };
  std::vector<std::vector<int>> in_labels(n);
  std::map<int, int64_t> size;
  for (int i = 0; i < n; ++i) {
    int letters = 0;
    for (char ch : terms[i])
      if (std::isalpha(static_cast<unsigned char>(ch))) ++letters;
    in_labels[i] = expand(terms[i], xs[i].ndim() - letters);
    if (static_cast<int>(in_labels[i].size()) != xs[i].ndim())
      k.invalid(cat("operand ", i, " term '", terms[i], "' does not match its rank ", xs[i].ndim()));
    for (int d = 0; d < xs[i].ndim(); ++d) {
      int l = in_labels[i][d];
      int64_t v = xs[i].shape[d];
      auto it = size.find(l);
      if (it == size.end() || it->second == 1) size[l] = v;
      else if (v != 1 && v != it->second)
        k.invalid(cat("label '", static_cast<char>(l < 128 ? l : '.'), "' has sizes ", it->second, " and ", v));
    }
  }
  std::vector<int> out_labels;
  if (explicit_out) {
    out_labels = expand(rhs, ell_rank);
  } else {
    for (int e = 0; e < ell_rank; ++e) out_labels.push_back(200 + e);
    std::map<int, int> count;
    for (auto& ls : in_labels)
      for (int l : ls) count[l]++;
    for (auto& [l, c] : count)
      if (l < 128 && c == 1) out_labels.push_back(l);
  }
  std::vector<int> all = out_labels;
  for (auto& [l, s] : size)
    if (std::find(all.begin(), all.end(), l) == all.end()) all.push_back(l);
  for (int l : out_labels)
    if (!size.count(l)) k.invalid(cat("output label '", static_cast<char>(l), "' does not appear in any input"));
  Shape os;
  for (int l : out_labels) os.push_back(size[l]);
  TView y = k.out(0, os);
  const size_t L = all.size();
  Shape dims(L);
  for (size_t i = 0; i < L; ++i) dims[i] = size[all[i]];
  // Strides of each input over the `all` label order (0 where the input lacks the label or has size 1).
  std::vector<Shape> istr(n, Shape(L, 0));
  for (int i = 0; i < n; ++i) {
    Shape s = strides_of(xs[i].shape);
    for (int d = 0; d < xs[i].ndim(); ++d) {
      size_t pos = std::find(all.begin(), all.end(), in_labels[i][d]) - all.begin();
      if (xs[i].shape[d] != 1) istr[i][pos] += s[d];
    }
  }
  const int64_t out_n = numel_of(os);
  int64_t red_n = 1;
  for (size_t i = out_labels.size(); i < L; ++i) red_n *= dims[i];
  dispatch(NumTs{}, xs[0].dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = std::conditional_t<std::is_integral_v<T>, T, double>;
    for (int64_t o = 0; o < out_n; ++o) {
      C acc = 0;
      std::vector<int64_t> idx(L, 0);
      int64_t rem = o;
      for (size_t d = out_labels.size(); d-- > 0;) {
        idx[d] = rem % dims[d];
        rem /= dims[d];
      }
      for (int64_t r = 0; r < red_n; ++r) {
        C prod = 1;
        for (int i = 0; i < n; ++i) {
          int64_t off = 0;
          for (size_t d = 0; d < L; ++d) off += idx[d] * istr[i][d];
          prod = static_cast<C>(prod * static_cast<C>(ld(xs[i].p<T>()[off])));
        }
        acc = static_cast<C>(acc + prod);
        for (size_t d = L; d-- > out_labels.size();) {
          if (++idx[d] < dims[d]) break;
          idx[d] = 0;
        }
      }
      y.p<T>()[o] = st<T>(acc);
    }
  });
}

}  // namespace keel::ops::ref
