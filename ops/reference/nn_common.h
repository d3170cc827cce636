// keel/ops/reference/nn_common.h — shared geometry (kernel, strides, dilations, pads, auto_pad, ceil_mode) for the
// convolution and pooling reference kernels, and a small row-range GEMM used by MatMul, Gemm and Conv.
#pragma once

#include "ops/reference/kernel_util.h"

namespace keel::ops::ref {

// Spatial geometry of a Conv/Pool node over `r` spatial dimensions.
struct SpatialGeom {
  int r = 0;
  Shape in, kernel, strides, dilations, pads /* 2r: begins then ends */, out;
  int64_t kernel_size() const { return numel_of(kernel); }
  int64_t out_size() const { return numel_of(out); }
  int64_t in_size() const { return numel_of(in); }
};

// Reads strides/dilations/pads/auto_pad (and ceil_mode when allow_ceil) the way ONNX shape inference does
// (onnx/defs/nn/defs.cc convPoolShapeInference) and computes the output spatial shape.
inline SpatialGeom spatial_geom(const Kctx& k, const Shape& in_spatial, const Shape& kernel, bool use_dilation,
                                bool allow_ceil) {
  SpatialGeom g;
  g.r = static_cast<int>(in_spatial.size());
  g.in = in_spatial;
  g.kernel = kernel;
  if (static_cast<int>(kernel.size()) != g.r)
    k.invalid(cat("kernel_shape has ", kernel.size(), " entries for ", g.r, " spatial dimensions"));
  for (int64_t v : kernel)
    if (v <= 0) k.invalid(cat("kernel_shape ", shape_str(kernel), " has a non-positive entry"));
  g.strides = k.attr_ints_or("strides", Shape(g.r, 1));
  if (static_cast<int>(g.strides.size()) != g.r)
    k.invalid(cat("strides has ", g.strides.size(), " entries, expected ", g.r));
  for (int64_t v : g.strides)
    if (v <= 0) k.invalid("strides must be positive");
  g.dilations = use_dilation ? k.attr_ints_or("dilations", Shape(g.r, 1)) : Shape(g.r, 1);
  if (static_cast<int>(g.dilations.size()) != g.r)
    k.invalid(cat("dilations has ", g.dilations.size(), " entries, expected ", g.r));
  for (int64_t v : g.dilations)
    if (v <= 0) k.invalid("dilations must be positive");
  const std::string auto_pad = k.attr_s("auto_pad", "NOTSET");
  const sdk::AutoPad ap = sdk::auto_pad_of(auto_pad);
  Shape eff(g.r);
  for (int i = 0; i < g.r; ++i) eff[i] = sdk::dilated_extent(kernel[i], g.dilations[i]);
  if (ap == sdk::AutoPad::kNotSet) {
    g.pads = k.attr_ints_or("pads", Shape(2 * g.r, 0));
    if (static_cast<int>(g.pads.size()) != 2 * g.r)
      k.invalid(cat("pads has ", g.pads.size(), " entries, expected ", 2 * g.r));
    for (int64_t v : g.pads)
      if (v < 0) k.invalid("pads must be non-negative");
  } else if (ap == sdk::AutoPad::kUnknown) {
    k.invalid(cat("unknown auto_pad '", auto_pad, "'"));
  } else {  // VALID, SAME_UPPER, SAME_LOWER
    g.pads.assign(2 * g.r, 0);
    for (int i = 0; i < g.r; ++i) sdk::same_pads(ap, in_spatial[i], eff[i], g.strides[i], &g.pads[i], &g.pads[i + g.r]);
  }
  bool ceil_mode = allow_ceil && k.attr_i("ceil_mode", 0) != 0;
  g.out.resize(g.r);
  for (int i = 0; i < g.r; ++i) {
    g.out[i] = sdk::window_output(in_spatial[i], g.pads[i] + g.pads[i + g.r], eff[i], g.strides[i], ceil_mode);
    if (g.out[i] < 0)
      k.invalid(cat("kernel ", shape_str(kernel), " (dilated) is larger than the padded input in spatial dimension ", i,
                    " (input ", in_spatial[i], ")"));
  }
  return g;
}

// Y rows [i0, i1) of Y[M×N] (row stride ldy) = A[M×K] x B[K×N]; A element (i, k) at A[i*lda + k*ak]; B rows
// contiguous with row stride ldb. When accumulate is false Y is overwritten.
template <class C>
void gemm_rows(int64_t i0, int64_t i1, int64_t N, int64_t K, const C* A, int64_t lda, int64_t ak, const C* B,
               int64_t ldb, C* Y, int64_t ldy, bool accumulate) {
  constexpr int64_t kBlockN = 1024;
  for (int64_t i = i0; i < i1; ++i) {
    C* __restrict y = Y + i * ldy;
    const C* a = A + i * lda;
    for (int64_t j0 = 0; j0 < N; j0 += kBlockN) {
      const int64_t j1 = std::min(N, j0 + kBlockN);
      if (!accumulate)
        for (int64_t j = j0; j < j1; ++j) y[j] = C(0);
      int64_t kk = 0;
      // Four rows of B per pass: a quarter of the loads and stores of y (and vectorisable: restrict pointers).
      for (; kk + 4 <= K; kk += 4) {
        const C a0 = a[kk * ak], a1 = a[(kk + 1) * ak], a2 = a[(kk + 2) * ak], a3 = a[(kk + 3) * ak];
        const C* __restrict b0 = B + kk * ldb;
        const C* __restrict b1 = b0 + ldb;
        const C* __restrict b2 = b1 + ldb;
        const C* __restrict b3 = b2 + ldb;
        for (int64_t j = j0; j < j1; ++j) y[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j];
      }
      for (; kk < K; ++kk) {
        const C av = a[kk * ak];
        const C* __restrict b = B + kk * ldb;
        for (int64_t j = j0; j < j1; ++j) y[j] += av * b[j];
      }
    }
  }
}

// Dense copy of a tensor's elements converted to C (f16/bf16 -> float, ...).
template <class C>
std::vector<C> to_calc(const TView& t, const Kctx& k, const char* what) {
  std::vector<C> r(static_cast<size_t>(t.numel));
  dispatch(
      NumTs{}, t.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* p = t.p<T>();
        for (int64_t i = 0; i < t.numel; ++i) r[i] = static_cast<C>(ld(p[i]));
      },
      what);
  return r;
}

// The pooling window of keel.FusedConvMaxPool and its gradient: attributes pool_kernel_shape (2 entries, at most 256
// positions, so that a window position fits the uint8 Arg) and pool_strides (default: the window); no padding, the
// windows that fit (floor).
struct PoolWindow {
  int64_t kh = 1, kw = 1, sh = 1, sw = 1;
  static PoolWindow from(const Kctx& k) {
    auto ks = k.attr_ints("pool_kernel_shape");
    if (!ks || ks->size() != 2) k.invalid("attribute pool_kernel_shape must have 2 entries");
    const Shape st = k.attr_ints_or("pool_strides", *ks);
    if (st.size() != 2) k.invalid("attribute pool_strides must have 2 entries");
    PoolWindow w{(*ks)[0], (*ks)[1], st[0], st[1]};
    if (w.kh <= 0 || w.kw <= 0 || w.sh <= 0 || w.sw <= 0 || w.kh * w.kw > 256)
      k.invalid(cat("pool window ", shape_str(*ks), " at strides ", shape_str(st),
                    ": entries must be positive and the window at most 256 positions"));
    return w;
  }
  // The pooled shape of a convolution output `y` (N, M, H, W); an error where the window does not fit in it.
  Shape pooled(const Kctx& k, const Shape& y) const {
    if (y.size() != 4 || y[2] < kh || y[3] < kw)
      k.invalid(cat("the convolution's output ", shape_str(y), " is smaller than the pool window ", kh, "x", kw));
    return {y[0], y[1], (y[2] - kh) / sh + 1, (y[3] - kw) / sw + 1};
  }
};

}  // namespace keel::ops::ref
