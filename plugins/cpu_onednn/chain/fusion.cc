// plugins/cpu_onednn/chain/fusion.cc — post-op fusion: which nodes after a convolution, matmul or pooling become its
// post-ops (fuse_after), and a trailing SiLU run as the chain's own step.
#include "chain/builder.h"

namespace keel::onednn::chain {

bool Builder::eltwise_of(const NodeDesc& n, alg* a, float* alpha, float* beta) {
  *alpha = 0;
  *beta = 0;
  // The post-ops a chain takes: Pow and Clip with constant inputs (below); HardSigmoid (eltwise_po); every other op
  // the op table builds with Builder::eltwise, through eltwise_algorithm (which knows more ops than chains take).
  const ChainOp* row = find_chain_op(n.op);
  const bool table_eltwise = row != nullptr && row->build == &Builder::eltwise;
  if (table_eltwise && n.op != "Pow" && n.op != "Clip" && n.op != "HardSigmoid") {
    if (!eltwise_algorithm(n.op, n.as("approximate", "none"), a, alpha, beta)) return false;
    if (n.op == "LeakyRelu") *alpha = n.af("alpha", 0.01f);
  } else if (n.op == "Pow") {
    // A constant exponent of 2 or 0.5 only (the decomposed normalisations'): exact for every base, as ONNX's Pow.
    const ConstT* p = n.in.size() == 2 ? cst(n.in[1]) : nullptr;
    if (!p || p->count() != 1) return false;
    if (p->at(0) == 2.0) *a = alg::eltwise_square;
    else if (p->at(0) == 0.5) *a = alg::eltwise_sqrt;
    else return false;
  } else if (n.op == "Clip") {
    float lo = -INFINITY, hi = INFINITY;
    if (n.has("min") || n.has("max")) {
      lo = n.af("min", -INFINITY);
      hi = n.af("max", INFINITY);
    }
    for (int k = 1; k <= 2; ++k) {
      std::string v = n.in_at(k);
      if (v.empty()) continue;
      const ConstT* c = cst(v);
      if (!c || c->count() != 1) return false;
      (k == 1 ? lo : hi) = static_cast<float>(c->at(0));
    }
    *a = alg::eltwise_clip_v2;
    *alpha = std::max(lo, -FLT_MAX);
    *beta = std::min(hi, FLT_MAX);
  } else {
    return false;
  }
  return true;
}

// Whether `po` can take the eltwise post-op (a, alpha, beta) and compute it: false when it holds one of the same
// algorithm with other parameters. oneDNN 2.6's jit kernels run every eltwise post-op of one algorithm with the
// parameters of the first of them: a LeakyRelu(0.1) then a Relu ran as two LeakyRelus, a Clip(0,6) then
// HardSigmoid's clip to [0,1] as two Clip(0,6)s, two linears as the first twice (found by `keel-cts --random-chains`,
// then shown on oneDNN's convolutions alone). Such an op ends the fusion and runs as a step of its own.
bool Builder::eltwise_fits(const dnnl::post_ops& po, alg a, float alpha, float beta) {
  for (int k = 0; k < po.len(); ++k) {
    if (po.kind(k) != dnnl::primitive::kind::eltwise) continue;
    float scale = 0.f, al = 0.f, be = 0.f;
    alg b = alg::undef;
    po.get_params_eltwise(k, scale, b, al, be);
    if (b == a && (al != alpha || be != beta || scale != 1.f)) return false;
  }
  return true;
}

// Appends the eltwise post-op (a, alpha, beta) to `po` where it fits (eltwise_fits); false, `po` unchanged, otherwise.
bool Builder::add_eltwise(dnnl::post_ops* po, alg a, float alpha, float beta) {
  if (!eltwise_fits(*po, a, alpha, beta)) return false;
  po->append_eltwise(1.f, a, alpha, beta);
  return true;
}

// The element-wise op node `n` computes, appended to `po` as eltwise post-ops: one for the ops of eltwise_of, two for
// HardSigmoid (oneDNN 2.6 has none: max(0, min(1, alpha * x + beta)) is linear, then clip to [0, 1]). False, `po`
// unchanged, when `n` is none of them or `po` cannot take them (eltwise_fits). (A dnnl::post_ops copy shares its
// list: both are checked before either is appended.)
bool Builder::eltwise_po(const NodeDesc& n, dnnl::post_ops* po) {
  if (n.op == "HardSigmoid") {
    const float alpha = n.af("alpha", 0.2f), beta = n.af("beta", 0.5f);
    if (!eltwise_fits(*po, alg::eltwise_linear, alpha, beta) || !eltwise_fits(*po, alg::eltwise_clip_v2, 0.f, 1.f))
      return false;
    po->append_eltwise(1.f, alg::eltwise_linear, alpha, beta);
    po->append_eltwise(1.f, alg::eltwise_clip_v2, 0.f, 1.f);
    return true;
  }
  alg a;
  float alpha, beta;
  return eltwise_of(n, &a, &alpha, &beta) && add_eltwise(po, a, alpha, beta);
}

// Whether node `n` (a Reshape, Transpose, Squeeze or Unsqueeze of plain dense `in`) only relabels or moves dims of
// size 1, keeping the last dim: its output is the same memory in the same order, so a product's post-ops (a bias
// over the last axis, a residual sum) may come after it (torch's out-projection [S*B,E] -> [S,B,E] -> [B,S,E]).
bool Builder::same_order_view(const NodeDesc& n, const std::string& in) {
  if (n.out.size() != 1 || n.in.empty() || n.in[0] != in) return false;
  if (n.op == "Reshape") {
    if (!cst(n.in_at(1)) || n.ai("allowzero", 0)) return false;
  } else if (n.op != "Transpose" && n.op != "Squeeze" && n.op != "Unsqueeze") {
    return false;
  }
  const Dims x = dims_of(in), y = dims_of(n.out[0]);
  if (x.empty() || y.empty() || x.back() != y.back() || numel(x) != numel(y)) return false;
  auto big = [](const Dims& d) {
    Dims b;
    for (int64_t k : d)
      if (k != 1) b.push_back(k);
    return b;
  };
  if (big(x) != big(y)) return false;
  if (n.op != "Transpose") return true;
  const Dims perm = n.ais("perm", {});
  if (perm.size() != x.size()) return false;  // (the default reverses the dims: in order only when one is not 1)
  int64_t last = -1;
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(x.size())) return false;
    if (x[p] == 1) continue;
    if (p < last) return false;
    last = p;
  }
  return true;
}

// Whether node `n` is a Transpose of a 4-D `in` with perm (0, 3, 1, 2): channels-last [N,H,W,C] read as [N,C,H,W]
// (ConvNeXt's permute back after its MLP). A product's post-ops may come after it, its last axis then being axis 1
// (fuse_after: Fusion::permuted).
bool Builder::channels_first_view(const NodeDesc& n, const std::string& in) {
  if (n.op != "Transpose" || n.out.size() != 1 || n.in.empty() || n.in[0] != in) return false;
  return dims_of(in).size() == 4 && n.ais("perm", {}) == Dims{0, 3, 1, 2};
}

// Looks at what reads `out` and folds what it can into the op that writes it. A matmul's (!conv) product may be
// followed through same_order_view nodes when an op fused after them (f.viewed; f.out then has the view's dims), and
// through one channels_first_view (f.permuted as well): a per-channel constant Mul after it (a layer scale) folds into
// the constant weights and the bias (f.col_scale), a per-channel constant Add is the bias, a residual Add the sum.
Builder::Fusion Builder::fuse_after(const std::string& out, size_t at, bool conv, int64_t channels) {
  Fusion f;
  f.out = out;
  bool has_eltwise = false;
  std::string before_views;  // f.out before the views followed since the last fused op (dropped without one)
  size_t views = 0;
  bool permuting = false;        // one of those views is a channels_first_view
  auto fused_past_views = [&] {  // an op was fused after the views followed so far: they stay
    f.viewed = f.viewed || views > 0;
    f.permuted = f.permuted || permuting;
    permuting = false;
    views = 0;
  };
  // Only constant weights can take a per-column factor (MatMul's and Gemm's B).
  const bool const_weights = !conv && at < r_.nodes.size() && cst(r_.nodes[at].in_at(1)) != nullptr;
  // A constant holding one value per output channel of the product: along the last axis, or along axis 1 once
  // permuted (dims [C,1,1] or [1,C,1,1]); that count, else 0.
  auto channel_vector = [&](const ConstT* c, const Dims& od) -> int64_t {
    if (conv || od.empty()) return 0;
    if (!(f.permuted || permuting))
      return c->count() == od.back() && !c->dims.empty() && c->dims.back() == od.back() ? od.back() : 0;
    Dims cd = c->dims;
    while (cd.size() > 3 && cd.front() == 1) cd.erase(cd.begin());
    return od.size() == 4 && cd.size() == 3 && cd[0] == od[1] && cd[1] == 1 && cd[2] == 1 ? od[1] : 0;
  };
  for (;;) {
    // SiLU written as x * Sigmoid(x) (how torch exports it): one swish post-op; hard-swish written as
    // x * HardSigmoid(x) (alpha 1/6, beta 0.5): one hardswish post-op.
    bool hard = false;
    if (size_t m = silu_after(f.out, &hard);
        m != npos && add_eltwise(&f.po, hard ? alg::eltwise_hardswish : alg::eltwise_swish, hard ? 0.f : 1.f, 0.f)) {
      has_eltwise = true;
      f.nodes.push_back(users(f.out)[0] == m ? users(f.out)[1] : users(f.out)[0]);
      f.nodes.push_back(m);
      f.count++;
      f.out = r_.nodes[m].out[0];
      fused_past_views();
      continue;
    }
    size_t u = sole_user(f.out);
    if (u == npos) break;
    const NodeDesc& n = r_.nodes[u];
    // Views to follow: none after a permute (same_order_view reads f.out as plain memory, and the permuted output
    // stays 4-D), at most one permute.
    if (!conv && !f.permuted && !permuting) {
      const bool permute = options().permuted_post_ops && channels_first_view(n, f.out);
      if (permute || (options().view_post_ops && same_order_view(n, f.out))) {
        if (views++ == 0) before_views = f.out;
        permuting = permute;
        f.nodes.push_back(u);
        f.out = n.out[0];
        continue;
      }
    }
    if (n.out.size() != 1 && !(n.op == "BatchNormalization")) break;
    if (n.op == "Clip" && n.in[0] != f.out) break;
    if (eltwise_po(n, &f.po)) {
      has_eltwise = true;
    } else if (!conv && n.op == "Cast" && act_ == dt::bf16 && !f.dst_f32 && n.ai("to", 0) == KEEL_DTYPE_F32) {
      // A bf16 product cast to f32 (mixed precision runs residual Adds and norms in f32): written in f32 directly,
      // so that a residual Add after it becomes a sum post-op instead of a reorder and a binary step.
      f.dst_f32 = true;
    } else if (conv && n.op == "BatchNormalization" && f.count == 0 && n.in.size() == 5 && n.in[0] == f.out &&
               n.ai("training_mode", 0) == 0) {
      bool extra = false;
      for (size_t k = 1; k < n.out.size(); ++k) extra = extra || !n.out[k].empty();
      const ConstT *s = cst(n.in[1]), *b = cst(n.in[2]), *m = cst(n.in[3]), *v = cst(n.in[4]);
      if (extra || !s || !b || !m || !v || s->count() != channels || b->count() != channels || m->count() != channels ||
          v->count() != channels)
        break;
      float eps = n.af("epsilon", 1e-5f);
      f.bn_scale.resize(channels);
      f.bn_shift.resize(channels);
      for (int64_t c = 0; c < channels; ++c) {
        double k = s->at(c) / std::sqrt(v->at(c) + eps);
        f.bn_scale[c] = static_cast<float>(k);
        f.bn_shift[c] = static_cast<float>(b->at(c) - m->at(c) * k);
      }
    } else if (n.op == "Add" || ((n.op == "Mul" || n.op == "Div" || n.op == "Sub") && !conv)) {
      if (n.in.size() != 2) break;
      std::string other = n.in[0] == f.out ? n.in[1] : n.in[0];
      const ConstT* c = cst(other);
      Dims od = dims_of(f.out);
      if (const int64_t cols = c && n.op == "Mul" && c->count() > 1 ? channel_vector(c, od) : 0; cols > 0) {
        // A factor per output channel (a layer scale): into the weights' columns and the bias, before anything
        // but a bias and a scalar factor.
        if (!const_weights || has_eltwise || !f.sum_with.empty() || f.po.len() > 0) break;
        if (f.col_scale.empty()) f.col_scale.assign(cols, 1.f);
        for (int64_t k = 0; k < cols; ++k) {
          const float v = static_cast<float>(c->at(k));
          f.col_scale[k] *= v;
          if (!f.mm_bias.empty()) f.mm_bias[k] *= v;
        }
      } else if (c && (n.op == "Mul" || n.op == "Div")) {
        if (c->count() != 1 || n.in[0] != f.out || has_eltwise) break;
        float k = static_cast<float>(c->at(0));
        if (n.op == "Div") k = 1.f / k;
        // Before any bias: scale the product; after: a linear post-op.
        if (f.count == 0) f.out_scale *= k;
        else if (!add_eltwise(&f.po, alg::eltwise_linear, k, 0.f)) break;
      } else if (c && n.op == "Add") {
        if (has_eltwise || !f.sum_with.empty()) break;
        if (conv) {
          // Per-channel [C,1,1] / [1,C,1,1] or a scalar.
          Dims cd = c->dims;
          while (!cd.empty() && cd.front() == 1 && cd.size() > 3) cd.erase(cd.begin());
          bool per_channel = c->count() == channels && cd.size() == 3 && cd[0] == channels;
          if (!per_channel && c->count() != 1) break;
          if (f.conv_bias_add.empty()) f.conv_bias_add.assign(channels, 0.f);
          for (int64_t k = 0; k < channels; ++k) f.conv_bias_add[k] += static_cast<float>(c->at(per_channel ? k : 0));
        } else {
          const int64_t N = channel_vector(c, od);
          if (N == 0 || f.out_scale != 1.f || !f.mm_bias.empty() || f.po.len() > 0) break;
          f.mm_bias.resize(N);
          for (int64_t k = 0; k < N; ++k) f.mm_bias[k] = static_cast<float>(c->at(k));
        }
      } else if (!c && n.op == "Add") {
        // A residual: same shape, already computed, and no post-op before it (sum must come first here).
        if (!f.sum_with.empty() || f.po.len() > 0 || !vals_.count(other) || dims_of(other) != od) break;
        if (vals_[other].scale != 1.f) break;
        f.sum_with = other;
        f.po.append_sum(1.f);
      } else {
        break;
      }
    } else {
      break;
    }
    f.nodes.push_back(u);
    f.count++;
    f.out = n.out[0];
    fused_past_views();
  }
  if (views > 0) {
    f.nodes.resize(f.nodes.size() - views);
    f.out = before_views;
  }
  (void)at;
  return f;
}

// A SiLU (swish post-op) at the end of a convolution's fusion runs as the chain's own step after the primitive
// (exec_silu) instead: oneDNN 2.6's swish costs more than a 1x1 convolution's arithmetic on EfficientNet's shapes
// (steps/silu.h, docs/ONEDNN_PERFORMANCE.md). Strips it from f.po and returns true; false, changing nothing, when the
// option is off, the CPU lacks AVX-512 (the pass would be scalar), the node computes in bf16, or the chain holds
// post-op kinds other than eltwise and sum before it.
bool Builder::take_silu(Fusion& f) {
  if (!options().silu_pass || !has_avx512f() || act_ != dt::f32) return false;
  return take_trailing_eltwise(f, alg::eltwise_swish);
}

// The same for a matrix product's or a convolution's trailing GELU (gelu_erf post-op; ONNX Gelu and keel.Gelu with
// approximate "none"):
// oneDNN 2.6's gelu_erf costs half as much again as ConvNeXt's MLP products it follows (1.44 -> 2.14 ms at 1 thread);
// the chain's own pass after the product about half of that (1.82 ms; exec_gelu, steps/gelu.h).
// GELU's tanh approximation (keel.Gelu approximate = "tanh", GPT-2's gelu_new) likewise: oneDNN's gelu_tanh post-op
// costs as much as its gelu_erf; f.gelu_tanh then says which pass runs.
bool Builder::take_gelu(Fusion& f) {
  if (!options().gelu_pass || !has_avx512f() || act_ != dt::f32) return false;
  if (take_trailing_eltwise(f, alg::eltwise_gelu_erf)) return true;
  f.gelu_tanh = take_trailing_eltwise(f, alg::eltwise_gelu_tanh);
  return f.gelu_tanh;
}

// Strips f.po's last post-op when it is eltwise `want` with scale 1 (and alpha 1 for swish) and every one before it
// is eltwise or sum; true then. False, changing nothing, otherwise.
bool Builder::take_trailing_eltwise(Fusion& f, alg want) {
  const int last = f.po.len() - 1;
  if (last < 0 || f.po.kind(last) != dnnl::primitive::kind::eltwise) return false;
  float scale, alpha, beta;
  alg a;
  f.po.get_params_eltwise(last, scale, a, alpha, beta);
  if (a != want || scale != 1.f || (want == alg::eltwise_swish && alpha != 1.f)) return false;
  dnnl::post_ops po;
  for (int k = 0; k < last; ++k) {
    if (f.po.kind(k) == dnnl::primitive::kind::eltwise) {
      f.po.get_params_eltwise(k, scale, a, alpha, beta);
      po.append_eltwise(scale, a, alpha, beta);
    } else if (f.po.kind(k) == dnnl::primitive::kind::sum) {
      f.po.get_params_sum(k, scale);
      po.append_sum(scale);
    } else {
      return false;
    }
  }
  f.po = po;
  return true;
}

// The chain's own SiLU step, in place over value `v` named `name` (f32, any dense layout: blocked padding is 0 and
// stays 0). Under 128 KiB it runs on one thread: it is compute-bound (about 1.75 ns per 16 floats on one core), so
// unlike the memory-bound steps (exec) a second thread pays off from a few microseconds of work.
// When `v` is nChw16c and read by a GlobalAveragePool (squeeze-excite after EfficientNet's depthwise convolutions),
// the same pass computes the pooling too (each channel's mean, as nChw16c [N,C,1,1]) and that node is done: its
// step and a second read of the tensor saved.
void Builder::exec_silu(const Val& v, const std::string& name) {
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_DST, mem_of(v)}};
  const Dims d = md_dims(v.md);
  std::string what = " SiLU ";
  if (d.size() == 4 && v.md == md_t(v.md.dims(), dt::f32, tag::nChw16c)) {
    for (size_t u : users(name)) {
      const NodeDesc& pn = r_.nodes[u];
      if (done_[u] || pn.op != "GlobalAveragePool" || pn.in.size() != 1 || pn.in[0] != name || pn.out.size() != 1)
        continue;
      Val& pv = define(pn.out[0], md_t({d[0], d[1], 1, 1}, dt::f32, tag::nChw16c));
      args[kArgPooled] = mem_of(pv);
      done_[u] = true;
      what = " SiLU + GlobalAveragePool ";
      break;
    }
  }
  const bool pooled = args.count(kArgPooled) != 0;
  Exec e;
  e.single = v.md.get_size() < (128u << 10);
  e.own = pooled ? run_silu_mean : run_silu;
  e.args = std::move(args);
  exec_own(std::move(e), pooled ? "keel:silu_mean_avx512" : "keel:silu_avx512", false,
           (cur_node_ < r_.nodes.size() ? r_.nodes[cur_node_].name : std::string("(outputs)")) + what + dims_str(d));
}

// The chain's own GELU step, in place over value `v` (f32, dense; elementwise, so any layout). Compute-bound like the
// SiLU step (about 5 ns per 16 floats on one core), so split over the team from 128 KiB on.
void Builder::exec_gelu(const Val& v, bool tanh) {
  Exec e;
  e.single = v.md.get_size() < (128u << 10);
  e.own = tanh ? run_gelu_tanh : run_gelu;
  e.args = {{DNNL_ARG_DST, mem_of(v)}};
  exec_own(std::move(e), tanh ? "keel:gelu_tanh_avx512" : "keel:gelu_avx512", false,
           (cur_node_ < r_.nodes.size() ? r_.nodes[cur_node_].name : std::string("(outputs)")) +
               (tanh ? " GELU (tanh) " : " GELU ") + dims_str(md_dims(v.md)));
}

}  // namespace keel::onednn::chain
