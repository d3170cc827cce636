// Reference kernels of the "keel" domain's fused ops (f32), produced by the fusion passes (passes/fusion):
//
//   FusedConv(X, W, [B], [Z])       Y = act(conv(X, W) + B + Z)                  Conv's attributes
//   FusedMatMul(A, B, [bias], [Z])  Y = act(matmul(A, B) + bias + Z)             bias: 1-D over the last axis
//   FusedGemm(A, B, [C], [Z])       Y = act(alpha * A' B' + beta * C + Z)        Gemm's attributes
//   Gelu(X)                         Y = 0.5 x (1 + erf(x / sqrt 2))              (the ai.onnx Gelu-20 kernel)
//   LayerNormalization(X, Scale, [B])                                          (the ai.onnx LayerNormalization-17
//   kernel) Attention(Q, Kt, V, [mask])     Y = softmax(Q @ Kt * scale + mask) @ V       attribute scale (default 1)
//   QConv(X, W, [B], x_scale, [x_zero_point], w_scale, [y_scale, y_zero_point], [Z])    (INT8, from
//   passes/quantize_int8)
//                                   Y = act(conv((X - x_zp) x_scale, W w_scale) + B + Z), then, with y_scale,
//                                   quantized: saturate(round(Y / y_scale) + y_zp) in y_zero_point's type (u8/s8);
//                                   else f32. X u8/s8, W s8 (zero point 0), w_scale scalar or per output channel, B
//                                   f32, Z f32 with the output's shape (a residual Add fuse_qdq folded in). An f32
//                                   X is quantized first, as QuantizeLinear(X, x_scale, x_zero_point) does (into
//                                   x_zero_point's type, u8 without one): a QuantizeLinear fuse_qdq folded in.
//                                   input_layout / output_layout / residual_layout (default: output_layout) =
//                                   "NHWC": X / Y / Z hold channels-last bytes under their NCHW shape (fuse_qdq sets
//                                   them inside int8 regions).
//   QGemm(A, B, [C], a_scale, [a_zero_point], b_scale, [y_scale, y_zero_point])
//                                   the same for A[..., K] x B (s8 [K, N], or [N, K] with transB = 1) + C[N]; the
//                                   int8 form of MatMul with a 2-D constant weight and of Gemm (alpha = beta = 1).
//
// act is the `activation` attribute: "" (none), Relu, Sigmoid, Tanh, HardSwish, LeakyRelu (activation_params =
// {alpha}), Clip ({min, max}), Gelu. Z has the output's shape. Batch dimensions of FusedMatMul and Attention
// broadcast as MatMul's do. They favour clarity over speed, but use the thread pool for the heavy loops.
#include <new>
#include <string>

#include "core/base/status.h"
#include "ops/reference/fused_kernels.h"
#include "ops/reference/kernels.h"
#include "ops/reference/nn_common.h"

namespace keel::ops::ref {
namespace {

// ------------------------------------------------------------------------------------------------ activation

struct Act {
  enum Kind { kNone, kRelu, kSigmoid, kTanh, kHardSwish, kLeakyRelu, kClip, kGelu } kind = kNone;
  float a = 0, b = 0;

  static Act from(const Kctx& k) {
    Act act;
    std::string s = k.attr_s("activation", "");
    std::vector<float> p = k.attr_floats("activation_params").value_or(std::vector<float>{});
    if (s.empty()) act.kind = kNone;
    else if (s == "Relu") act.kind = kRelu;
    else if (s == "Sigmoid") act.kind = kSigmoid;
    else if (s == "Tanh") act.kind = kTanh;
    else if (s == "HardSwish") act.kind = kHardSwish;
    else if (s == "Gelu") act.kind = kGelu;
    else if (s == "LeakyRelu") {
      act.kind = kLeakyRelu;
      act.a = p.empty() ? 0.01f : p[0];
    } else if (s == "Clip") {
      act.kind = kClip;
      if (p.size() != 2) k.invalid("activation Clip needs activation_params {min, max}");
      act.a = p[0];
      act.b = p[1];
    } else {
      k.unimpl(cat("unknown activation '", s, "'"));
    }
    return act;
  }
  float operator()(float x) const {
    switch (kind) {
      case kNone: return x;
      case kRelu: return x > 0 ? x : 0.f;
      case kSigmoid: return 1.f / (1.f + std::exp(-x));
      case kTanh: return std::tanh(x);
      case kHardSwish: return x * std::max(0.f, std::min(1.f, x / 6.f + 0.5f));
      case kLeakyRelu: return x >= 0 ? x : a * x;
      case kClip: return std::min(std::max(x, a), b);
      case kGelu: return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f));
    }
    return x;
  }
};

void require_f32(const Kctx& k, const TView& t, const char* what) {
  if (t.dtype != KEEL_DTYPE_F32) k.bad_dtype(t.dtype, what);
}

// Z, when given, must have the output's shape.
const float* residual(const Kctx& k, const std::optional<TView>& z, const Shape& out) {
  if (!z) return nullptr;
  require_f32(k, *z, "Z");
  if (z->shape != out) k.invalid(cat("Z ", shape_str(z->shape), " must have the output's shape ", shape_str(out)));
  return z->p<float>();
}

// ------------------------------------------------------------------------------------------------ FusedConv

// col[(c*Ks + kidx), out_pos] = x[c, in_pos] (0 in the padding), for rows [r0, r1). Any number of spatial dims.
template <class T>
void im2col(const T* x, const SpatialGeom& g, T* col, int64_t r0, int64_t r1) {
  const int r = g.r;
  const int64_t Ks = g.kernel_size(), O = g.out_size(), I = g.in_size();
  std::vector<int64_t> kk(r), o(r);
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t c = row / Ks;
    int64_t kidx = row % Ks;
    for (int d = r - 1; d >= 0; --d) {
      kk[d] = kidx % g.kernel[d];
      kidx /= g.kernel[d];
    }
    const T* xc = x + c * I;
    T* dst = col + row * O;
    std::fill(o.begin(), o.end(), 0);
    for (int64_t p = 0; p < O; ++p) {
      int64_t off = 0;
      bool valid = true;
      for (int d = 0; d < r; ++d) {
        int64_t id = o[d] * g.strides[d] - g.pads[d] + kk[d] * g.dilations[d];
        valid = valid && id >= 0 && id < g.in[d];
        off = off * g.in[d] + id;
      }
      dst[p] = valid ? xc[off] : T(0);
      for (int d = r - 1; d >= 0; --d) {
        if (++o[d] < g.out[d]) break;
        o[d] = 0;
      }
    }
  }
}

// act(conv(X, W) + B + Z) of keel.FusedConv's inputs and attributes into the buffer that `out(shape)` returns
// (nullptr: an empty output, nothing to compute).
template <class Out>
void fused_conv_into(Kctx& k, Out out) {
  TView x = k.in(0), w = k.in(1);
  auto b = k.opt_in(2), z = k.opt_in(3);
  require_f32(k, x, "X");
  require_f32(k, w, "W");
  if (x.ndim() < 3 || w.ndim() != x.ndim())
    k.invalid(cat("X ", shape_str(x.shape), " and W ", shape_str(w.shape), " must have one rank >= 3"));
  const int64_t group = k.attr_i("group", 1);
  if (group <= 0) k.invalid("group must be positive");
  const int64_t N = x.shape[0], Cin = x.shape[1], M = w.shape[0];
  if (Cin != w.shape[1] * group || M % group != 0)
    k.invalid(cat("channels do not match: X ", shape_str(x.shape), ", W ", shape_str(w.shape), ", group ", group));
  Shape in(x.shape.begin() + 2, x.shape.end()), kernel(w.shape.begin() + 2, w.shape.end());
  SpatialGeom g = spatial_geom(k, in, kernel, true, false);
  if (b) {
    require_f32(k, *b, "B");
    if (b->numel != M) k.invalid(cat("B has ", b->numel, " entries; expected ", M));
  }
  Shape os = {N, M};
  os.insert(os.end(), g.out.begin(), g.out.end());
  const float* pz = residual(k, z, os);
  const Act act = Act::from(k);
  float* Y = out(os);
  if (Y == nullptr) return;
  const int64_t Ks = g.kernel_size(), Cg = Cin / group, Mg = M / group, K = Cg * Ks, O = g.out_size(), I = g.in_size();
  bool direct = Ks == 1;
  for (int i = 0; i < g.r; ++i)
    if (g.strides[i] != 1 || g.pads[i] != 0 || g.pads[i + g.r] != 0) direct = false;
  const float* X = x.p<float>();
  const float* W = w.p<float>();
  const float* B = b ? b->p<float>() : nullptr;
  auto epilogue = [&](int64_t n, int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      float bias = B ? B[m] : 0.f;
      float* yr = Y + (n * M + m) * O;
      const float* zr = pz ? pz + (n * M + m) * O : nullptr;
      for (int64_t j = 0; j < O; ++j) yr[j] = act(yr[j] + bias + (zr ? zr[j] : 0.f));
    }
  };
  std::vector<float> col(direct ? 0 : static_cast<size_t>(K * O));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t gi = 0; gi < group; ++gi) {
      const float* xg = X + (n * Cin + gi * Cg) * I;
      const float* cp = xg;
      if (!direct) {
        k.parallel(K, std::max<int64_t>(1, 65536 / std::max<int64_t>(O, 1)),
                   [&](int64_t r0, int64_t r1) { im2col(xg, g, col.data(), r0, r1); });
        cp = col.data();
      }
      float* yg = Y + (n * M + gi * Mg) * O;
      const float* wg = W + gi * Mg * K;
      k.parallel(Mg, std::max<int64_t>(1, 65536 / std::max<int64_t>(O * K, 1)),
                 [&](int64_t m0, int64_t m1) { gemm_rows(m0, m1, O, K, wg, K, 1, cp, O, yg, O, false); });
    }
    k.parallel(M, std::max<int64_t>(1, 16384 / std::max<int64_t>(O, 1)),
               [&](int64_t m0, int64_t m1) { epilogue(n, m0, m1); });
  }
}

void op_fused_conv(Kctx& k) {
  fused_conv_into(k, [&](const Shape& s) -> float* {
    TView y = k.out(0, s);
    return y.numel == 0 ? nullptr : y.p<float>();
  });
}

// keel.FusedConvMaxPool: MaxPool(act(conv(X, W) + B)) over 2-D windows pool_kernel_shape at pool_strides (default:
// the window; no padding, the windows that fit), and, as the optional uint8 output Arg, where each window's first
// maximum is (kh * window width + kw): what its gradient (keel.FusedConvMaxPoolGrad) routes dY by.
void op_fused_conv_max_pool(Kctx& k) {
  if (k.in(0).ndim() != 4) k.invalid(cat("X must be 4-D (N, C, H, W), got ", shape_str(k.in(0).shape)));
  const PoolWindow pw = PoolWindow::from(k);
  std::vector<float> y;
  Shape ys;
  fused_conv_into(k, [&](const Shape& s) -> float* {
    ys = s;
    y.assign(static_cast<size_t>(numel_of(s)), 0.f);
    return y.empty() ? nullptr : y.data();
  });
  const Shape ps = pw.pooled(k, ys);
  const int64_t NC = ys[0] * ys[1], H = ys[2], W = ys[3], OH = ps[2], OW = ps[3];
  TView p = k.out(0, ps);
  uint8_t* arg = k.has_output(1) ? k.out(1, ps).p<uint8_t>() : nullptr;
  if (p.numel == 0) return;
  float* P = p.p<float>();
  for (int64_t nc = 0; nc < NC; ++nc)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const float* base = y.data() + (nc * H + oh * pw.sh) * W + ow * pw.sw;
        float best = base[0];
        int64_t at = 0;
        for (int64_t i = 0; i < pw.kh; ++i)
          for (int64_t j = 0; j < pw.kw; ++j)
            if (base[i * W + j] > best) best = base[i * W + j], at = i * pw.kw + j;
        const int64_t o = (nc * OH + oh) * OW + ow;
        P[o] = best;
        if (arg) arg[o] = static_cast<uint8_t>(at);
      }
}

// ------------------------------------------------------------------------------------------------ batched matmul

// Y[batch..., M, N] = A[batch_a..., M, K] @ B[batch_b..., K, N] with broadcast batch dims (1-D A/B as MatMul).
struct BatchedMatMul {
  Shape out;    // output shape
  Shape batch;  // broadcast batch shape
  int64_t M = 0, K = 0, N = 0, batches = 1;
  std::vector<int64_t> a_off, b_off;  // element offset of each batch's matrix in A and B

  BatchedMatMul(const Kctx& k, Shape as, Shape bs) {
    if (as.empty() || bs.empty()) k.invalid("MatMul operands must have rank >= 1");
    bool a1 = as.size() == 1, b1 = bs.size() == 1;
    if (a1) as.insert(as.begin(), 1);
    if (b1) bs.push_back(1);
    M = as[as.size() - 2];
    K = as.back();
    N = bs.back();
    if (bs[bs.size() - 2] != K) k.invalid(cat("inner dimensions do not match: ", shape_str(as), " x ", shape_str(bs)));
    Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
    batch = broadcast_shapes({ab, bb}, k);
    batches = numel_of(batch);
    Shape sa = broadcast_strides(ab, batch), sb = broadcast_strides(bb, batch), os = strides_of(batch);
    a_off.resize(static_cast<size_t>(batches));
    b_off.resize(static_cast<size_t>(batches));
    for (int64_t i = 0; i < batches; ++i) {
      int64_t rem = i, oa = 0, ob = 0;
      for (size_t d = 0; d < batch.size(); ++d) {
        int64_t idx = rem / os[d];
        rem %= os[d];
        oa += idx * sa[d];
        ob += idx * sb[d];
      }
      a_off[i] = oa * M * K;
      b_off[i] = ob * K * N;
    }
    out = batch;
    if (!a1) out.push_back(M);
    if (!b1) out.push_back(N);
  }
  // Y = A @ B for all batches, rows in parallel.
  void run(const Kctx& k, const float* A, const float* B, float* Y) const {
    const int64_t rows = batches * M;
    k.parallel(rows, std::max<int64_t>(1, 65536 / std::max<int64_t>(K * N, 1)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1;) {
        int64_t bi = r / M, m0 = r % M, m1 = std::min(M, m0 + (r1 - r));
        gemm_rows(m0, m1, N, K, A + a_off[bi], K, 1, B + b_off[bi], N, Y + bi * M * N, N, false);
        r += m1 - m0;
      }
    });
  }
};

void op_fused_matmul(Kctx& k) {
  TView a = k.in(0), b = k.in(1);
  auto bias = k.opt_in(2), z = k.opt_in(3);
  require_f32(k, a, "A");
  require_f32(k, b, "B");
  BatchedMatMul p(k, a.shape, b.shape);
  if (bias) {
    require_f32(k, *bias, "bias");
    if (bias->numel != p.N) k.invalid(cat("bias has ", bias->numel, " entries; expected ", p.N));
  }
  const float* pz = residual(k, z, p.out);
  const Act act = Act::from(k);
  TView y = k.out(0, p.out);
  if (y.numel == 0) return;
  float* Y = y.p<float>();
  if (p.K == 0) std::fill(Y, Y + y.numel, 0.f);
  else p.run(k, a.p<float>(), b.p<float>(), Y);
  const float* pb = bias ? bias->p<float>() : nullptr;
  const int64_t N = p.N, rows = y.numel / std::max<int64_t>(N, 1);
  k.parallel(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(N, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t j = 0; j < N; ++j) {
        int64_t i = r * N + j;
        Y[i] = act(Y[i] + (pb ? pb[j] : 0.f) + (pz ? pz[i] : 0.f));
      }
  });
}

// ------------------------------------------------------------------------------------------------ FusedGemm

void op_fused_gemm(Kctx& k) {
  TView a = k.in(0), b = k.in(1);
  auto c = k.opt_in(2), z = k.opt_in(3);
  require_f32(k, a, "A");
  require_f32(k, b, "B");
  if (a.ndim() != 2 || b.ndim() != 2) k.invalid("A and B must be 2-D");
  const bool ta = k.attr_i("transA", 0) != 0, tb = k.attr_i("transB", 0) != 0;
  const float alpha = k.attr_f("alpha", 1.f), beta = k.attr_f("beta", 1.f);
  const int64_t M = ta ? a.shape[1] : a.shape[0], K = ta ? a.shape[0] : a.shape[1];
  const int64_t K2 = tb ? b.shape[1] : b.shape[0], N = tb ? b.shape[0] : b.shape[1];
  if (K != K2) k.invalid(cat("inner dimensions do not match: ", shape_str(a.shape), " x ", shape_str(b.shape)));
  Shape os = {M, N};
  std::vector<float> cb;
  if (c) {
    require_f32(k, *c, "C");
    if (broadcast_shapes({c->shape, os}, k) != os) k.invalid("C does not broadcast to the output");
    cb = broadcast_to(c->p<float>(), c->shape, os);
  }
  const float* pz = residual(k, z, os);
  const Act act = Act::from(k);
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  // Dense row-major A[M,K] and B[K,N].
  std::vector<float> at, bt;
  const float* A = a.p<float>();
  const float* B = b.p<float>();
  if (ta) {
    at.resize(static_cast<size_t>(M * K));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < K; ++j) at[i * K + j] = A[j * M + i];
    A = at.data();
  }
  if (tb) {
    bt.resize(static_cast<size_t>(K * N));
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < N; ++j) bt[i * N + j] = B[j * K + i];
    B = bt.data();
  }
  float* Y = y.p<float>();
  k.parallel(M, std::max<int64_t>(1, 65536 / std::max<int64_t>(K * N, 1)), [&](int64_t r0, int64_t r1) {
    gemm_rows(r0, r1, N, K, A, K, 1, B, N, Y, N, false);
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = 0; j < N; ++j) {
        int64_t o = i * N + j;
        Y[o] = act(alpha * Y[o] + (c ? beta * cb[o] : 0.f) + (pz ? pz[o] : 0.f));
      }
  });
}

// ------------------------------------------------------------------------------------------------ Attention

void op_attention(Kctx& k) {
  TView q = k.in(0), kt = k.in(1), v = k.in(2);
  auto mask = k.opt_in(3);
  require_f32(k, q, "Q");
  require_f32(k, kt, "Kt");
  require_f32(k, v, "V");
  if (q.ndim() < 2 || kt.ndim() < 2 || v.ndim() < 2) k.invalid("Q, Kt and V must have rank >= 2");
  const float scale = k.attr_f("scale", 1.f);
  BatchedMatMul s(k, q.shape, kt.shape);  // scores [batch..., S, T]
  BatchedMatMul o(k, s.out, v.shape);     // output [batch..., S, Dv]
  if (o.batch != s.batch)
    k.unimpl(cat("V ", shape_str(v.shape), " has batch dimensions that the scores ", shape_str(s.out), " do not"));
  std::vector<float> mk;
  if (mask) {
    if (mask->dtype != KEEL_DTYPE_F32) k.bad_dtype(mask->dtype, "mask");
    if (broadcast_shapes({mask->shape, s.out}, k) != s.out) k.invalid("mask does not broadcast to the scores");
    mk = broadcast_to(mask->p<float>(), mask->shape, s.out);
  }
  TView y = k.out(0, o.out);
  if (y.numel == 0) return;
  const int64_t S = s.M, T = s.N, D = s.K, Dv = o.N;
  const float* Q = q.p<float>();
  const float* Kt = kt.p<float>();
  const float* V = v.p<float>();
  float* Y = y.p<float>();
  // One (batch, query row) per task: scores row, softmax, times V.
  k.parallel(s.batches * S, std::max<int64_t>(1, 4096 / std::max<int64_t>(T * (D + Dv), 1)),
             [&](int64_t r0, int64_t r1) {
               std::vector<float> p(static_cast<size_t>(T));
               for (int64_t r = r0; r < r1; ++r) {
                 const int64_t bi = r / S, i = r % S;
                 gemm_rows(0, 1, T, D, Q + s.a_off[bi] + i * D, D, 1, Kt + s.b_off[bi], T, p.data(), T, false);
                 float mx = -std::numeric_limits<float>::infinity();
                 for (int64_t t = 0; t < T; ++t) {
                   p[t] = p[t] * scale + (mask ? mk[(bi * S + i) * T + t] : 0.f);
                   mx = std::max(mx, p[t]);
                 }
                 double sum = 0;
                 for (int64_t t = 0; t < T; ++t) {
                   p[t] = mx == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(p[t] - mx);
                   sum += p[t];
                 }
                 const float inv = sum > 0 ? static_cast<float>(1.0 / sum) : 0.f;
                 for (int64_t t = 0; t < T; ++t) p[t] *= inv;
                 float* yr = Y + bi * S * Dv + i * Dv;
                 gemm_rows(0, 1, Dv, T, p.data(), T, 1, V + o.b_off[bi], Dv, yr, Dv, false);
               }
             });
}

// ------------------------------------------------------------------------------------------------ QConv, QGemm

// The quantization parameters of a QConv/QGemm node: inputs 3..7.
struct QParams {
  float x_scale = 1;
  int32_t x_zero = 0;
  int32_t x_type = KEEL_DTYPE_U8;  // the quantized X's type (X itself may be f32)
  std::vector<float> w_scale;      // 1 or M entries
  bool quantized_out = false;
  float y_scale = 1;
  int32_t y_zero = 0;
};

QParams read_qparams(const Kctx& k, const TView& x, const TView& w, int64_t M) {
  QParams q;
  if (x.dtype != KEEL_DTYPE_U8 && x.dtype != KEEL_DTYPE_I8 && x.dtype != KEEL_DTYPE_F32)
    k.bad_dtype(x.dtype, "X (u8, s8 or f32)");
  if (w.dtype != KEEL_DTYPE_I8) k.bad_dtype(w.dtype, "W (s8)");
  TView xs = k.in(3), ws = k.in(5);
  auto xzp = k.opt_in(4), ys = k.opt_in(6), yzp = k.opt_in(7);
  if (xs.numel != 1) k.invalid("x_scale must be a scalar");
  q.x_scale = static_cast<float>(get_f64(xs, 0, k));
  q.x_type = x.dtype == KEEL_DTYPE_F32 ? (xzp ? xzp->dtype : KEEL_DTYPE_U8) : x.dtype;
  if (xzp) {
    if (xzp->numel != 1 || xzp->dtype != q.x_type) k.invalid("x_zero_point must be a scalar of X's (quantized) type");
    if (q.x_type != KEEL_DTYPE_U8 && q.x_type != KEEL_DTYPE_I8) k.bad_dtype(q.x_type, "x_zero_point (u8 or s8)");
    q.x_zero = static_cast<int32_t>(get_i64(*xzp, 0, k));
  }
  if (x.dtype == KEEL_DTYPE_F32 && !(q.x_scale > 0)) k.invalid("x_scale must be positive to quantize an f32 X");
  if (ws.numel != 1 && ws.numel != M) k.invalid(cat("w_scale must be a scalar or have ", M, " entries"));
  q.w_scale = read_floats(ws, k, "w_scale");
  if (ys.has_value() != yzp.has_value()) k.invalid("y_scale and y_zero_point come together");
  if (ys) {
    if (ys->numel != 1 || yzp->numel != 1) k.invalid("y_scale and y_zero_point must be scalars");
    if (yzp->dtype != KEEL_DTYPE_U8 && yzp->dtype != KEEL_DTYPE_I8) k.bad_dtype(yzp->dtype, "y_zero_point (u8 or s8)");
    if (k.out_dtype(0) != yzp->dtype) k.invalid("the output's type differs from y_zero_point's");
    q.quantized_out = true;
    q.y_scale = static_cast<float>(get_f64(*ys, 0, k));
    q.y_zero = static_cast<int32_t>(get_i64(*yzp, 0, k));
    if (!(q.y_scale > 0)) k.invalid("y_scale must be positive");
  } else if (k.out_dtype(0) != KEEL_DTYPE_F32) {
    k.bad_dtype(k.out_dtype(0), "output (f32 without y_scale)");
  }
  return q;
}

std::vector<int32_t> widen(const TView& t, int32_t zero, const Kctx& k) {
  std::vector<int32_t> r(static_cast<size_t>(t.numel));
  if (t.dtype == KEEL_DTYPE_F32) k.bad_dtype(t.dtype, "quantized input");
  dispatch(
      TL<uint8_t, int8_t>{}, t.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* p = t.p<T>();
        for (int64_t i = 0; i < t.numel; ++i) r[static_cast<size_t>(i)] = static_cast<int32_t>(p[i]) - zero;
      },
      "quantized input");
  return r;
}

// X quantized and less its zero point: an f32 X first goes through QuantizeLinear's arithmetic (x / x_scale in
// float, rounded half to even, plus the zero point, saturated to the quantized type).
std::vector<int32_t> widen_x(const TView& x, const QParams& q, const Kctx& k) {
  if (x.dtype != KEEL_DTYPE_F32) return widen(x, q.x_zero, k);
  const float* p = x.p<float>();
  const float lo = q.x_type == KEEL_DTYPE_U8 ? 0.f : -128.f, hi = q.x_type == KEEL_DTYPE_U8 ? 255.f : 127.f;
  std::vector<int32_t> r(static_cast<size_t>(x.numel));
  for (int64_t i = 0; i < x.numel; ++i) {
    float v = std::nearbyint(p[i] / q.x_scale) + static_cast<float>(q.x_zero);
    if (!(v == v)) v = static_cast<float>(q.x_zero);
    r[static_cast<size_t>(i)] = static_cast<int32_t>(std::clamp(v, lo, hi)) - q.x_zero;
  }
  return r;
}

// Y[i] for accumulator `acc` of output channel m: act(acc * x_scale * w_scale[m] + bias[m] + z[i]), then quantized
// or not.
struct QEpilogue {
  const QParams& q;
  const float* bias;
  Act act;
  const float* z = nullptr;  // QConv's residual, indexed like Y's bytes
  void store(const TView& y, int64_t i, int64_t m, int32_t acc) const {
    float v = static_cast<float>(acc) * (q.x_scale * q.w_scale[q.w_scale.size() == 1 ? 0 : static_cast<size_t>(m)]);
    if (bias) v += bias[m];
    if (z) v += z[i];
    v = act(v);
    if (!q.quantized_out) {
      y.p<float>()[i] = v;
      return;
    }
    float r = std::nearbyint(v / q.y_scale) + static_cast<float>(q.y_zero);
    if (!(r == r)) r = 0;
    if (y.dtype == KEEL_DTYPE_U8) y.p<uint8_t>()[i] = static_cast<uint8_t>(std::clamp(r, 0.f, 255.f));
    else y.p<int8_t>()[i] = static_cast<int8_t>(std::clamp(r, -128.f, 127.f));
  }
};

void op_qconv(Kctx& k) {
  TView x = k.in(0), w = k.in(1);
  auto b = k.opt_in(2);
  if (x.ndim() < 3 || w.ndim() != x.ndim())
    k.invalid(cat("X ", shape_str(x.shape), " and W ", shape_str(w.shape), " must have one rank >= 3"));
  const int64_t group = k.attr_i("group", 1);
  if (group <= 0) k.invalid("group must be positive");
  const int64_t N = x.shape[0], Cin = x.shape[1], M = w.shape[0];
  if (Cin != w.shape[1] * group || M % group != 0)
    k.invalid(cat("channels do not match: X ", shape_str(x.shape), ", W ", shape_str(w.shape), ", group ", group));
  Shape in(x.shape.begin() + 2, x.shape.end()), kernel(w.shape.begin() + 2, w.shape.end());
  SpatialGeom g = spatial_geom(k, in, kernel, true, false);
  if (b) {
    require_f32(k, *b, "B");
    if (b->numel != M) k.invalid(cat("B has ", b->numel, " entries; expected ", M));
  }
  QParams q = read_qparams(k, x, w, M);
  QEpilogue ep{q, b ? b->p<float>() : nullptr, Act::from(k)};
  Shape os = {N, M};
  os.insert(os.end(), g.out.begin(), g.out.end());
  const bool nhwc_out = k.attr_s("output_layout", "NCHW") == "NHWC";
  std::vector<float> z_conv;  // Z in the output's layout, where its own differs
  if (auto z = k.opt_in(8)) {
    require_f32(k, *z, "Z");
    if (z->shape != os) k.invalid(cat("Z ", shape_str(z->shape), " must have the output's shape ", shape_str(os)));
    ep.z = z->p<float>();
    const bool nhwc_z = k.attr_s("residual_layout", nhwc_out ? "NHWC" : "NCHW") == "NHWC";
    if (nhwc_z != nhwc_out) {
      const int64_t C = os[1], S = z->numel / std::max<int64_t>(os[0] * C, 1);
      z_conv.resize(static_cast<size_t>(z->numel));
      for (int64_t n = 0; n < os[0]; ++n)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t i = 0; i < S; ++i) {
            const int64_t plain = (n * C + c) * S + i, last = (n * S + i) * C + c;
            z_conv[static_cast<size_t>(nhwc_out ? last : plain)] = ep.z[nhwc_z ? last : plain];
          }
      ep.z = z_conv.data();
    }
  }
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  std::vector<int32_t> X = widen_x(x, q, k), W = widen(w, 0, k);
  const int64_t Ks = g.kernel_size(), Cg = Cin / group, Mg = M / group, K = Cg * Ks, O = g.out_size(), I = g.in_size();
  // Channels-last data (input_layout / output_layout = "NHWC", set by fuse_qdq between two QConvs): the shapes stay
  // NCHW, the bytes are [N, spatial..., C].
  if (k.attr_s("input_layout", "NCHW") == "NHWC") {
    std::vector<int32_t> t(X.size());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t ci = 0; ci < Cin; ++ci)
        for (int64_t i = 0; i < I; ++i)
          t[static_cast<size_t>((n * Cin + ci) * I + i)] = X[static_cast<size_t>((n * I + i) * Cin + ci)];
    X.swap(t);
  }
  auto out_index = [&](int64_t n, int64_t m, int64_t j) {
    return nhwc_out ? (n * O + j) * M + m : (n * M + m) * O + j;
  };
  std::vector<int32_t> col(static_cast<size_t>(K * O)), acc(static_cast<size_t>(Mg * O));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t gi = 0; gi < group; ++gi) {
      const int32_t* xg = X.data() + (n * Cin + gi * Cg) * I;
      k.parallel(K, std::max<int64_t>(1, 65536 / std::max<int64_t>(O, 1)),
                 [&](int64_t r0, int64_t r1) { im2col(xg, g, col.data(), r0, r1); });
      const int32_t* wg = W.data() + gi * Mg * K;
      k.parallel(Mg, std::max<int64_t>(1, 65536 / std::max<int64_t>(O * K, 1)), [&](int64_t m0, int64_t m1) {
        gemm_rows(m0, m1, O, K, wg, K, 1, col.data(), O, acc.data(), O, false);
        for (int64_t m = m0; m < m1; ++m) {
          const int64_t mm = gi * Mg + m;
          for (int64_t j = 0; j < O; ++j) ep.store(y, out_index(n, mm, j), mm, acc[static_cast<size_t>(m * O + j)]);
        }
      });
    }
  }
}

void op_qgemm(Kctx& k) {
  TView a = k.in(0), bw = k.in(1);
  auto c = k.opt_in(2);
  if (a.ndim() < 2 || bw.ndim() != 2) k.invalid(cat("A ", shape_str(a.shape), " must have rank >= 2 and B rank 2"));
  const bool tb = k.attr_i("transB", 0) != 0;
  const int64_t K = a.shape.back(), N = tb ? bw.shape[0] : bw.shape[1];
  if ((tb ? bw.shape[1] : bw.shape[0]) != K)
    k.invalid(cat("A ", shape_str(a.shape), " and B ", shape_str(bw.shape), " do not multiply (transB ", tb, ")"));
  const int64_t M = K > 0 ? a.numel / K : 0;
  if (c) {
    require_f32(k, *c, "C");
    if (c->numel != N) k.invalid(cat("C has ", c->numel, " entries; expected ", N));
  }
  QParams q = read_qparams(k, a, bw, N);
  QEpilogue ep{q, c ? c->p<float>() : nullptr, Act::from(k)};
  Shape os(a.shape.begin(), a.shape.end() - 1);
  os.push_back(N);
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  std::vector<int32_t> A = widen_x(a, q, k), B = widen(bw, 0, k);
  if (tb) {
    std::vector<int32_t> t(B.size());
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < N; ++j) t[static_cast<size_t>(i * N + j)] = B[static_cast<size_t>(j * K + i)];
    B.swap(t);
  }
  k.parallel(M, std::max<int64_t>(1, 65536 / std::max<int64_t>(K * N, 1)), [&](int64_t r0, int64_t r1) {
    std::vector<int32_t> acc(static_cast<size_t>((r1 - r0) * N));
    gemm_rows(0, r1 - r0, N, K, A.data() + r0 * K, K, 1, B.data(), N, acc.data(), N, false);
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = 0; j < N; ++j) ep.store(y, i * N + j, j, acc[static_cast<size_t>((i - r0) * N + j)]);
  });
}

// ------------------------------------------------------------------------------------------------ registration

const KeelKernel kFused[] = {
    {"FusedConv", op_fused_conv},
    {"FusedConvMaxPool", op_fused_conv_max_pool},
    {"FusedMatMul", op_fused_matmul},
    {"FusedGemm", op_fused_gemm},
    {"Attention", op_attention},
    {"Gelu", op_gelu},
    {"LayerNormalization", op_layer_normalization},
    {"QConv", op_qconv},
    {"QGemm", op_qgemm},
};

}  // namespace
}  // namespace keel::ops::ref

namespace keel::ops {

size_t fused_reference_kernel_count() { return sizeof(ref::kFused) / sizeof(ref::kFused[0]); }

keel_status_t register_fused_reference_kernels(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  return ref::register_keel_kernels(host, plugin, ref::kFused, fused_reference_kernel_count(),
                                    "register_fused_reference_kernels");
}

}  // namespace keel::ops
