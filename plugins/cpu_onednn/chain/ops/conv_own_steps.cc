// plugins/cpu_onednn/chain/ops/conv_own_steps.cc — convolutions run as the plugin's own steps: depthwise + SiLU,
// squeeze-excite's excitation, Conv + Relu + MaxPool over few channels, 3x3 convolutions in groups of 4.
#include "chain/builder.h"

#include <cmath>
#include <limits>
#include <new>
#include <sstream>
#include <utility>

namespace keel::onednn::chain {

// Node u as the chain's own depthwise convolution + SiLU step (steps/dwsilu.h): a Conv with constant f32 weights
// [C,1,k,k], group C, k 3 or 5, equal strides 1 or 2, the same padding on every side, no dilation, its output through
// the SiLU pass (take_silu) and nothing else after the constant bias, BatchNormalization or Add folds; with AVX-512,
// f32, and the silu_pass and dw_silu options on. True with its geometry and fusion; false otherwise. Changes
// nothing.
bool Builder::dw_silu_plan(size_t u, DwSiluShape* s, Fusion* f) {
  if (!options().dw_silu || !options().silu_pass || !has_avx512f() || act_ != dt::f32) return false;
  const NodeDesc& n = r_.nodes[u];
  if (n.op != "Conv" || done_[u] || n.out.size() != 1 || n.in.size() < 2) return false;
  if (pad_folds_.count(n.in[0]) || se_folds_.count(n.in[0])) return false;
  const ConstT* W = cst(n.in_at(1));
  const ConstT* B = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (!W || W->dtype != KEEL_DTYPE_F32 || W->dims.size() != 4 || (!n.in_at(2).empty() && !B)) return false;
  const Dims x = dims_of(n.in[0]);
  if (x.size() != 4) return false;
  s->n = x[0], s->c = x[1], s->h = x[2], s->w = x[3], s->k = W->dims[2];
  if (W->dims != Dims{s->c, 1, s->k, s->k} || n.ai("group", 1) != s->c || (B && B->count() != s->c)) return false;
  if (n.ais("kernel_shape", {s->k, s->k}) != Dims{s->k, s->k} || n.ais("dilations", {1, 1}) != Dims{1, 1}) return false;
  const Dims st = n.ais("strides", {1, 1}), pads = n.ais("pads", {0, 0, 0, 0});
  const std::string ap = n.as("auto_pad", "NOTSET");
  if (st.size() != 2 || st[0] != st[1] || st[0] < 1 || pads.size() != 4 || (ap != "NOTSET" && !ap.empty()))
    return false;
  if (pads[1] != pads[0] || pads[2] != pads[0] || pads[3] != pads[0]) return false;
  s->s = st[0], s->p = pads[0];
  if (s->h + 2 * s->p < s->k || s->w + 2 * s->p < s->k) return false;
  s->oh = (s->h + 2 * s->p - s->k) / s->s + 1;
  s->ow = (s->w + 2 * s->p - s->k) / s->s + 1;
  if (!dw_silu_check(*s).empty()) return false;
  if (auto known = r_.dims.find(n.out[0]); known != r_.dims.end() && known->second != Dims{s->n, s->c, s->oh, s->ow})
    return false;
  *f = fuse_after(n.out[0], u, true, s->c);
  return take_silu(*f) && f->po.len() == 0 && f->sum_with.empty();
}

// Called where a convolution's trailing SiLU pass would run over value v (memory md): when v's only reader is a
// depthwise convolution the chain's own step takes (dw_silu_plan) over nChw16c memory, that step applies the SiLU
// to its source rows as it reads them instead (the pass's read and write of v saved: 4.8 MB at EfficientNet-B0's
// 112-px expansion). True when deferred (v in deferred_silu_); false, changing nothing, otherwise.
bool Builder::defer_silu(const std::string& v, const md_t& md) {
  if (escapes(v) || users(v).size() != 1) return false;
  const size_t u = users(v)[0];
  DwSiluShape s;
  Fusion f;
  if (!dw_silu_plan(u, &s, &f) || r_.nodes[u].in[0] != v) return false;
  if (md != md_t(to_dnnl(Dims{s.n, s.c, s.h, s.w}), dt::f32, tag::nChw16c)) return false;
  deferred_silu_.insert(v);
  return true;
}

// Builds node i as the depthwise convolution + SiLU step when dw_silu_plan takes it and its source is nChw16c:
// the SiLU of the source too when deferred to it (defer_silu), and a GlobalAveragePool reading the output (squeeze-
// excite) computed on the way. Measured in EfficientNet-B0 at 1 thread: docs/ONEDNN_PERFORMANCE.md, "(sq2)". True when
// built; false, changing nothing, otherwise.
bool Builder::conv_dw_silu(size_t i) {
  DwSiluShape s;
  Fusion f;
  if (!dw_silu_plan(i, &s, &f)) return false;
  const NodeDesc& n = r_.nodes[i];
  const Dims x{s.n, s.c, s.h, s.w}, y{s.n, s.c, s.oh, s.ow};
  auto xv = vals_.find(n.in[0]);
  if (xv == vals_.end() || xv->second.scale != 1.f || xv->second.md != md_t(to_dnnl(x), dt::f32, tag::nChw16c))
    return false;
  s.in_silu = deferred_silu_.erase(n.in[0]) > 0;
  const ConstT* W = cst(n.in_at(1));
  const ConstT* B = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  const int64_t kk = s.k * s.k;
  std::vector<float> w, bias;
  folded_weights(f, *W, B, s.c, &w, &bias);
  Exec e;
  own_weights(
      e, w.size(), [&](float* to) { dw_silu_pack_weights(s, w.data(), to); }, &bias);
  team_scratch(e, dw_silu_scratch_floats(s));
  e.args[DNNL_ARG_SRC] = mem_of(xv->second);
  Val& o = define(f.out, md_t(to_dnnl(y), dt::f32, tag::nChw16c));
  e.args[DNNL_ARG_DST] = mem_of(o);
  std::string what = " + SiLU ";
  for (size_t u : users(f.out)) {
    const NodeDesc& pn = r_.nodes[u];
    if (done_[u] || pn.op != "GlobalAveragePool" || pn.in.size() != 1 || pn.in[0] != f.out || pn.out.size() != 1)
      continue;
    e.args[kArgPooled] = mem_of(define(pn.out[0], md_t({s.n, s.c, 1, 1}, dt::f32, tag::nChw16c)));
    done_[u] = true;
    what = " + SiLU + GlobalAveragePool ";
    break;
  }
  e.own = run_dw_silu;
  e.own_kind = "convolution";
  e.params = std::make_shared<const DwSiluShape>(s);
  p_->flops += 2.0 * static_cast<double>(numel(y) * kk);
  exec_own(std::move(e), "keel:dw_silu_avx512", false,
           (s.in_silu ? "SiLU + " : "") + n.name + what + dims_str(x) + " -> " + dims_str(y));
  for (size_t k : f.nodes) done_[k] = true;
  return true;
}

// ConvNeXt's block head as the chain's own step (steps/dw_ln.h): node i a depthwise k x k convolution (k 3, 5 or 7,
// stride 1, padding k / 2, constant f32 weights and bias) over channels-last f32 memory, read only by a Transpose to
// channels-last (perm 0,2,3,1), read only by a LayerNormalization over its last axis with constant scale (and bias)
// and one output. The three nodes become one step writing the LayerNormalization's output; the convolution's output
// is never stored. Measured in ConvNeXt-Tiny: docs/ONEDNN_PERFORMANCE.md, "(dwln)". True when built; false, changing
// nothing, otherwise.
bool Builder::conv_dw_ln(size_t i) {
  if (!options().dw_ln || act_ != dt::f32) return false;
  const NodeDesc& n = r_.nodes[i];
  if (n.out.size() != 1 || n.in.size() < 2 || pad_folds_.count(n.in[0]) || se_folds_.count(n.in[0])) return false;
  const ConstT* W = cst(n.in_at(1));
  const ConstT* B = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (!W || W->dtype != KEEL_DTYPE_F32 || W->dims.size() != 4 || (!n.in_at(2).empty() && !B) ||
      (B && B->dtype != KEEL_DTYPE_F32))
    return false;
  const Dims x = dims_of(n.in[0]);
  if (x.size() != 4) return false;
  DwLnShape s;
  s.n = x[0], s.c = x[1], s.h = x[2], s.w = x[3], s.k = W->dims[2];
  const int64_t p = s.k / 2;
  if (W->dims != Dims{s.c, 1, s.k, s.k} || n.ai("group", 1) != s.c || (B && B->count() != s.c)) return false;
  const std::string ap = n.as("auto_pad", "NOTSET");
  if ((ap != "NOTSET" && !ap.empty()) || n.ais("kernel_shape", {s.k, s.k}) != Dims{s.k, s.k} ||
      n.ais("dilations", {1, 1}) != Dims{1, 1} || n.ais("strides", {1, 1}) != Dims{1, 1} ||
      n.ais("pads", {0, 0, 0, 0}) != Dims{p, p, p, p})
    return false;
  const size_t tu = sole_user(n.out[0]);
  if (tu == npos) return false;
  const NodeDesc& t = r_.nodes[tu];
  if (t.op != "Transpose" || t.out.size() != 1 || t.ais("perm", {}) != Dims{0, 2, 3, 1}) return false;
  const size_t lu = sole_user(t.out[0]);
  if (lu == npos) return false;
  const NodeDesc& l = r_.nodes[lu];
  if (l.op != "LayerNormalization" || l.out.size() != 1 || l.in.size() < 2 || l.in[0] != t.out[0]) return false;
  const int64_t axis = l.ai("axis", -1);
  const ConstT* scale = cst(l.in_at(1));
  const ConstT* shift = l.in_at(2).empty() ? nullptr : cst(l.in_at(2));
  if ((axis != -1 && axis != 3) || !scale || scale->dtype != KEEL_DTYPE_F32 || scale->count() != s.c ||
      (!l.in_at(2).empty() && !shift) || (shift && (shift->dtype != KEEL_DTYPE_F32 || shift->count() != s.c)))
    return false;
  s.eps = l.af("epsilon", 1e-5f);
  if (!dw_ln_check(s).empty()) return false;
  // Only over a source already channels-last (ConvNeXt's residual stream): a reorder in front would cost what the
  // step saves.
  const md_t nhwc(to_dnnl(x), dt::f32, tag::nhwc);
  auto xv = vals_.find(n.in[0]);
  if (xv == vals_.end() || xv->second.scale != 1.f || xv->second.md != nhwc) return false;
  Exec e;
  own_weights(
      e, dw_ln_packed_floats(s),
      [&](float* to) {
        dw_ln_pack(s, W->f32(), B ? B->f32() : nullptr, scale->f32(), shift ? shift->f32() : nullptr, to);
      },
      nullptr);
  team_scratch(e, dw_ln_scratch_floats(s));
  e.args[DNNL_ARG_SRC] = mem_of(xv->second);
  Val& o = define(l.out[0], plain_md(Dims{s.n, s.h, s.w, s.c}));
  e.args[DNNL_ARG_DST] = mem_of(o);
  e.own = run_dw_ln;
  e.own_kind = "convolution";
  e.params = std::make_shared<const DwLnShape>(s);
  p_->flops += 2.0 * static_cast<double>(s.n * s.c * s.h * s.w * s.k * s.k);
  exec_own(std::move(e), "keel:dw_ln_avx512", false,
           n.name + " + " + l.name + " " + dims_str(x) + " -> " + dims_str(Dims{s.n, s.h, s.w, s.c}));
  done_[i] = done_[tu] = done_[lu] = true;
  return true;
}

// Squeeze-excite's excitation from node i on, s = gate(Conv1x1_2(act(Conv1x1_1(p)))) over a pooled [1,C,1,1]
// value p (gate Sigmoid or HardSigmoid, act SiLU or Relu, each convolution with constant f32 weights and an optional
// bias, group 1, no strides, pads or dilations; nothing else fused), as one single-thread step of the chain's own
// (steps/se.h) writing s as plain [1,C2,1,1]. EfficientNet-B0's 16 excitations were 64 steps (fc1, SiLU pass, fc2 +
// logistic): docs/ONEDNN_PERFORMANCE.md, "(sq2)"; MobileNet-V3's two 1x1 convolutions on the team (steps/se.h). With
// AVX-512, f32, the se_step option on; true when built, false (changing nothing) otherwise.
bool Builder::se_excite_fused(size_t i) {
  if (!options().se_step || !has_avx512f() || act_ != dt::f32) return false;
  auto unit_conv = [&](const NodeDesc& c, const ConstT** W, const ConstT** B) {
    if (c.op != "Conv" || c.out.size() != 1 || c.in.size() < 2 || done_[&c - r_.nodes.data()]) return false;
    *W = cst(c.in_at(1));
    *B = c.in_at(2).empty() ? nullptr : cst(c.in_at(2));
    if (!*W || (*W)->dtype != KEEL_DTYPE_F32 || (*W)->dims.size() != 4 || (*W)->dims[2] != 1 || (*W)->dims[3] != 1 ||
        (!c.in_at(2).empty() && !*B))
      return false;
    const std::string ap = c.as("auto_pad", "NOTSET");
    return c.ai("group", 1) == 1 && c.ais("strides", {1, 1}) == Dims{1, 1} &&
           c.ais("pads", {0, 0, 0, 0}) == Dims{0, 0, 0, 0} && c.ais("dilations", {1, 1}) == Dims{1, 1} &&
           (ap == "NOTSET" || ap.empty() || ap == "VALID");
  };
  auto sole_eltwise = [](const Fusion& f, alg* a, float* alpha) {
    if (f.po.len() != 1 || f.po.kind(0) != dnnl::primitive::kind::eltwise || !f.sum_with.empty() ||
        !f.bn_scale.empty() || !f.conv_bias_add.empty())
      return false;
    float scale, beta;
    f.po.get_params_eltwise(0, scale, *a, *alpha, beta);
    return scale == 1.f;
  };
  const NodeDesc& n = r_.nodes[i];
  const ConstT *W1, *B1, *W2, *B2;
  if (!unit_conv(n, &W1, &B1)) return false;
  const Dims x = dims_of(n.in[0]);
  if (x.size() != 4 || x[0] != 1 || x[2] != 1 || x[3] != 1) return false;
  SeShape s;
  s.c = x[1], s.cs = W1->dims[0];
  if (W1->dims[1] != s.c || (B1 && B1->count() != s.cs)) return false;
  const Fusion f1 = fuse_after(n.out[0], i, true, s.cs);
  alg a;
  float alpha;
  if (!sole_eltwise(f1, &a, &alpha)) return false;
  if (a == alg::eltwise_swish && alpha == 1.f) s.silu = true;
  else if (a == alg::eltwise_relu && alpha == 0.f) s.silu = false;
  else return false;
  const size_t u = sole_user(f1.out);
  if (u == npos || !unit_conv(r_.nodes[u], &W2, &B2) || r_.nodes[u].in[0] != f1.out) return false;
  s.c2 = W2->dims[0];
  if (W2->dims[1] != s.cs || (B2 && B2->count() != s.c2)) return false;
  const Fusion f2 = fuse_after(r_.nodes[u].out[0], u, true, s.c2);
  // The gate: a Sigmoid (logistic), or a HardSigmoid (eltwise_po's linear, then clip to [0, 1]).
  if (f2.po.len() == 2 && f2.sum_with.empty() && f2.bn_scale.empty() && f2.conv_bias_add.empty() &&
      f2.po.kind(0) == dnnl::primitive::kind::eltwise && f2.po.kind(1) == dnnl::primitive::kind::eltwise) {
    float scale0, scale1, lo, hi;
    alg a1;
    f2.po.get_params_eltwise(0, scale0, a, s.gate_alpha, s.gate_beta);
    f2.po.get_params_eltwise(1, scale1, a1, lo, hi);
    if (scale0 != 1.f || scale1 != 1.f || a != alg::eltwise_linear || a1 != alg::eltwise_clip_v2 || lo != 0.f ||
        hi != 1.f)
      return false;
    s.hard_gate = true;
  } else if (!sole_eltwise(f2, &a, &alpha) || a != alg::eltwise_logistic) {
    return false;
  }
  // The source as C consecutive floats: plain, or nChw16c (one pixel: channel c at c, the padding after).
  auto xv = vals_.find(n.in[0]);
  if (xv == vals_.end() || xv->second.scale != 1.f || xv->second.md.data_type() != dt::f32 ||
      (!is_plain_dense(xv->second.md) && xv->second.md != md_t({1, s.c, 1, 1}, dt::f32, tag::nChw16c)))
    return false;
  const Dims y{1, s.c2, 1, 1};
  if (auto known = r_.dims.find(f2.out); known != r_.dims.end() && known->second != y) return false;
  auto floats = [](const ConstT* c) {
    std::vector<float> v;
    if (c)
      for (int64_t k = 0; k < c->count(); ++k) v.push_back(static_cast<float>(c->at(k)));
    return v;
  };
  const std::vector<float> b1 = floats(B1), b2 = floats(B2);
  Exec e;
  own_weights(
      e, se_packed_floats(s),
      [&](float* to) { se_pack(s, W1->f32(), B1 ? b1.data() : nullptr, W2->f32(), B2 ? b2.data() : nullptr, to); },
      nullptr);
  e.args[DNNL_ARG_SRC] = mem_of(xv->second);
  e.args[DNNL_ARG_DST] = mem_of(define(f2.out, md_t(to_dnnl(y), dt::f32, tag::nchw)));
  e.single = true;
  e.own = run_se;
  e.own_kind = "convolution";
  e.params = std::make_shared<const SeShape>(s);
  p_->flops += 2.0 * static_cast<double>(s.c * s.cs + s.cs * s.c2);
  exec_own(std::move(e), "keel:se_excite_avx512", false,
           n.name + " + " + r_.nodes[u].name + " (squeeze-excite) " + dims_str(x) + " -> " + dims_str(y));
  for (size_t k : f1.nodes) done_[k] = true;
  done_[u] = true;
  for (size_t k : f2.nodes) done_[k] = true;
  return true;
}

// A convolution over at most 4 channels read plain (a network's first layer, on the image), followed by a Relu
// (or not) and a MaxPool that alone read it, as one step of the chain's own (steps/convpool.h): each thread
// computes the convolution rows its pooled rows need into a ring in its cache and pools them there, so the
// convolution's output never goes to memory. SqueezeNet 1.1's stem (3->64, 3x3 s2 at 224x224, MaxPool 3x3 s2 ceil)
// at 2 threads: 0.17 ms against oneDNN's 0.21-0.27 ms convolution plus 0.09-0.11 ms pooling
// (docs/ONEDNN_PERFORMANCE.md,
// "(sqz)"). f32, group 1, no dilation, output channels a multiple of 16, 2-D pooling without dilation or indices;
// false, changing nothing, otherwise (or without AVX-512).
bool Builder::conv_pool_fused(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (!has_avx512f() || act_ != dt::f32 || n.out.size() != 1 || n.in.size() < 2) return false;
  if (pad_folds_.count(n.in[0]) || se_folds_.count(n.in[0])) return false;
  const ConstT* W = cst(n.in_at(1));
  const ConstT* B = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (!W || W->dtype != KEEL_DTYPE_F32 || W->dims.size() != 4 || (!n.in_at(2).empty() && !B)) return false;
  auto xv = vals_.find(n.in[0]);
  if (xv == vals_.end() || xv->second.scale != 1.f || xv->second.md.data_type() != dt::f32 ||
      !is_plain_dense(xv->second.md) || xv->second.md.data.ndims != 4)
    return false;
  const Dims x = md_dims(xv->second.md);
  ConvPoolShape s;
  s.n = x[0], s.c = x[1], s.h = x[2], s.w = x[3], s.m = W->dims[0];
  s.kh = W->dims[2], s.kw = W->dims[3];
  if (s.c > 4 || W->dims[1] != s.c || s.m % 16 != 0 || n.ai("group", 1) != 1 || (B && B->count() != s.m)) return false;
  if (n.ais("kernel_shape", {s.kh, s.kw}) != Dims{s.kh, s.kw} || n.ais("dilations", {1, 1}) != Dims{1, 1}) return false;
  const Dims st = n.ais("strides", {1, 1}), pads = n.ais("pads", {0, 0, 0, 0});
  const std::string ap = n.as("auto_pad", "NOTSET");
  if (st.size() != 2 || pads.size() != 4 || (ap != "NOTSET" && !ap.empty())) return false;
  s.sh = st[0], s.sw = st[1], s.pt = pads[0], s.pl = pads[1];
  if (s.sh < 1 || s.sw < 1) return false;
  s.oh = (s.h + pads[0] + pads[2] - s.kh) / s.sh + 1;
  s.ow = (s.w + pads[1] + pads[3] - s.kw) / s.sw + 1;
  if (s.h + pads[0] + pads[2] < s.kh || s.w + pads[1] + pads[3] < s.kw) return false;
  // Relu, then the MaxPool.
  std::vector<size_t> fused;
  std::string cur = n.out[0];
  size_t u = sole_user(cur);
  if (u != npos && r_.nodes[u].op == "Relu" && r_.nodes[u].out.size() == 1) {
    s.relu = true;
    fused.push_back(u);
    cur = r_.nodes[u].out[0];
    u = sole_user(cur);
  }
  if (u == npos || r_.nodes[u].op != "MaxPool" || r_.nodes[u].in[0] != cur) return false;
  const NodeDesc& pn = r_.nodes[u];
  if (pn.out.empty() || (pn.out.size() > 1 && !pn.out[1].empty()) || pn.ai("storage_order", 0) != 0) return false;
  const Dims pk = pn.ais("kernel_shape", {}), ps = pn.ais("strides", {1, 1}), pp = pn.ais("pads", {0, 0, 0, 0});
  const std::string pap = pn.as("auto_pad", "NOTSET");
  if (pk.size() != 2 || ps.size() != 2 || pp.size() != 4 || pn.ais("dilations", {1, 1}) != Dims{1, 1}) return false;
  if (pap != "NOTSET" && !pap.empty() && pap != "VALID") return false;
  const bool valid = pap == "VALID", ceil = pn.ai("ceil_mode", 0) != 0;
  s.pkh = pk[0], s.pkw = pk[1], s.psh = ps[0], s.psw = ps[1];
  s.ppt = valid ? 0 : pp[0], s.ppl = valid ? 0 : pp[1];
  if (s.psh < 1 || s.psw < 1) return false;
  s.ph = pooled_extent(s.oh, s.pkh, s.psh, s.ppt, valid ? 0 : pp[2], ceil);
  s.pw = pooled_extent(s.ow, s.pkw, s.psw, s.ppl, valid ? 0 : pp[3], ceil);
  if (!conv_pool_check(s).empty()) return false;
  // Only where the convolution's output is past the caches: per image past L2 (SqueezeNet's 3.1 MB, ResNet's and
  // GoogLeNet's 7x7 stems' 3.2 MB), or the batch's past 8 MiB; and over a single channel on one thread. The 7x7
  // stems gain since the step pads its source rows instead of taking a per-pixel path at the edges (ResNet-50, 1
  // thread: 1.19 against 1.31 + 0.15 ms; docs/ONEDNN_PERFORMANCE.md "(r50f)"). 2026-12-04, paired rounds: the peers'
  // simple_cnn (3x3 over 3 x 32x32, 115 KB an image) at batch 32 0.72 fused against 0.61 ms (1 thread), at batch 128
  // 3.34 against 4.00 (1 thread) and 1.29-1.44 against 1.37-2.14 ms (2); Fashion-MNIST's SimpleCNN (3x3 over 1 x
  // 28x28, 86 KB) at batch 1 and 8 level, at 32 0.23 against 0.31 ms on one thread but 0.17-0.20 against 0.16-0.18
  // on two, at 128 0.90 against 3.0-3.3 ms, at 1000 (`keel train`'s evaluation batch) 9.2 against 15-18 ms (1) and
  // 6.4-6.6 against 9.4-12.4 ms (2).
  // A 2x2 stride-2 pooling is taken in registers (conv_pool_2x2) and pays at every size: 2026-12-05 (AMD EPYC, 1 /
  // 2 threads, median of 400 runs, two rounds), the peers' simple_cnn at batch 32 0.30-0.31 against 0.38 ms and
  // 0.16 against 0.21-0.25 ms, at batch 1 0.020-0.021 against 0.023-0.027; Fashion-MNIST's SimpleCNN at batch 32 on
  // two threads 0.092-0.095 against 0.150-0.159 ms, level at batch 1 and 8; 3->64 at 64x64, batch 8, 0.78 against
  // 0.85-0.92 (1) and 0.47-0.60 against 0.60-0.70 (2). Not over 16 output channels: one block's tile loads about as
  // much as it multiplies (3->16 at 32x32, batch 32: level at 1 thread, 0.24-0.27 against 0.21-0.24 ms at 2).
  const int64_t out_bytes = s.m * s.oh * s.ow * static_cast<int64_t>(sizeof(float));
  if (!(conv_pool_2x2(s) && s.m >= 32) && out_bytes < (int64_t{1} << 20) && s.n * out_bytes < (int64_t{8} << 20) &&
      (s.c > 1 || p_->threads > 1))
    return false;
  const Dims y{s.n, s.m, s.ph, s.pw};
  if (auto known = r_.dims.find(pn.out[0]); known != r_.dims.end() && known->second != y) return false;
  fused.push_back(u);

  Exec e;
  std::vector<float> bias(static_cast<size_t>(s.m), 0.f);
  for (int64_t k = 0; B && k < s.m; ++k) bias[k] = static_cast<float>(B->at(k));
  own_weights(
      e, conv_pool_packed_floats(s), [&](float* to) { conv_pool_pack_weights(s, W->f32(), to); }, &bias);
  team_scratch(e, conv_pool_scratch_floats(s));
  e.args[DNNL_ARG_SRC] = mem_of(xv->second);
  Val& o = define(pn.out[0], md_t(to_dnnl(y), dt::f32, tag::nChw16c));
  e.args[DNNL_ARG_DST] = mem_of(o);
  e.own = run_conv_pool;
  e.own_kind = "convolution";
  e.params = std::make_shared<const ConvPoolShape>(s);
  p_->flops += 2.0 * static_cast<double>(s.n * s.m * s.oh * s.ow * s.c * s.kh * s.kw);
  exec_own(std::move(e), "keel:conv_pool_avx512", false,
           n.name + (s.relu ? " + Relu" : "") + " + MaxPool " + dims_str(x) + " -> " + dims_str(y));
  for (size_t k : fused) done_[k] = true;
  return true;
}

// What an own convolution step applies after its bias, read off f's post-ops: at most a residual sum (f.sum_with,
// scale 1) first, when `sum` is non-null, then at most a Relu or, when `relu_max` is non-null, a Clip(0, hi) (*relu
// and *relu_max = hi). False when they hold anything else.
bool Builder::sum_relu_of(const Fusion& f, bool* sum, bool* relu, float* relu_max) {
  if (sum) *sum = false;
  *relu = false;
  if (relu_max) *relu_max = std::numeric_limits<float>::infinity();
  for (int k = 0; k < f.po.len(); ++k) {
    if (k == 0 && sum && f.po.kind(0) == dnnl::primitive::kind::sum) {
      float scale = 0.f;
      f.po.get_params_sum(0, scale);
      if (scale != 1.f || f.sum_with.empty()) return false;
      *sum = true;
      continue;
    }
    float scale = 0.f, alpha = 0.f, beta = 0.f;
    alg a = alg::undef;
    if (*relu || f.po.kind(k) != dnnl::primitive::kind::eltwise) return false;
    f.po.get_params_eltwise(k, scale, a, alpha, beta);
    if (scale != 1.f || alpha != 0.f) return false;
    const bool relu6 = relu_max && (a == alg::eltwise_clip || a == alg::eltwise_clip_v2) && beta >= 0.f;
    if (a != alg::eltwise_relu && !relu6) return false;
    if (relu6) *relu_max = beta;
    *relu = true;
  }
  return (sum && *sum) == !f.sum_with.empty();
}

// A 3x3 convolution in groups of 4 channels (ResNeXt-50 32x4d's layer1) over an nChw16c source, with at most a Relu
// after it, as the chain's own step (steps/grouped.h): a quarter of the multiply-adds of the merged 16-channel
// groups below. `w` [M][4][3][3] and `bias` with folds applied. False, changing nothing, for anything else.
bool Builder::conv_grouped4(size_t i, const Fusion& f, const std::string& src, const Dims& x, const Dims& y,
                            int64_t stride, const std::vector<float>& w, const std::vector<float>& bias, double flops) {
  bool relu = false;
  if (!sum_relu_of(f, nullptr, &relu)) return false;
  if (x.size() != 4 || x[1] % 16 != 0) return false;
  const Val& xv = val(src);
  if (xv.scale != 1.f || xv.md != md_t(to_dnnl(x), dt::f32, tag::nChw16c)) return false;
  Grouped4Shape s;
  s.n = x[0], s.blocks = x[1] / 16, s.h = x[2], s.w = x[3], s.stride = stride, s.relu = relu;
  if (!grouped4_check(s).empty() || y != Dims{s.n, x[1], s.oh(), s.ow()}) return false;
  if (w.size() != static_cast<size_t>(x[1] * 36) || bias.size() != static_cast<size_t>(x[1])) return false;
  Exec e;
  own_weights(
      e, grouped4_packed_floats(s), [&](float* to) { grouped4_pack_weights(s, w.data(), to); }, &bias);
  e.args[DNNL_ARG_SRC] = mem_of(xv);
  Val& o = define(f.out, md_t(to_dnnl(y), dt::f32, tag::nChw16c));
  e.args[DNNL_ARG_DST] = mem_of(o);
  e.own = run_grouped4;
  e.own_kind = "convolution";
  e.params = std::make_shared<const Grouped4Shape>(s);
  p_->flops += flops;
  exec_own(std::move(e), "keel:grouped4_avx512", false,
           r_.nodes[i].name + (relu ? " + Relu " : " ") + dims_str(x) + " -> " + dims_str(y));
  for (size_t k : f.nodes) done_[k] = true;
  return true;
}

// A convolution over 32 to 64 output pixels with at least 4 MiB of constant weights (ResNet-50's layer4 at batch 1: the
// stride-2 3x3, 9.4 MB, the bottleneck end merged with its projection, 12.6 MB, the later 1x1s, 4.2 MB; ResNet-18's
// stride-2 3x3 in layer4.0, 4.7 MB) and at most a residual sum
// and a Relu after it, as the product of its windows and its weights: the windows gathered into rows (steps/im2row.h,
// each part's source read where it is when nhwc or nChw16c, else reordered to nChw16c first), then the chain's
// few-row product (steps/skinny_gemm.h) writing the nChw16c output. oneDNN ran these at 67% / 76% of the FMA peak at
// 1 thread (brgconv / jit_1x1), its kernels reading weights that come from memory at every run in several passes;
// see docs/ONEDNN_PERFORMANCE.md, "(skc)". `rows`: the windows' geometry (the parts' layouts are set here), `srcs`
// the parts' sources; `w` [M][rows.row_floats()] in the rows' order and `bias` [M], folds applied. f32 on AVX-512;
// false, changing nothing, otherwise.
bool Builder::conv_skinny(size_t i, const Fusion& f, Im2RowShape rows, const std::vector<std::string>& srcs, int64_t M,
                          const std::vector<float>& w, const std::vector<float>& bias, double flops) {
  bool sum = false, relu = false;
  float relu_max = 0.f;
  // (An activation left to a pass after the step, SiLU or GELU, is not the step's: random chains, seed 2641.)
  if (!options().skinny_conv || act_ != dt::f32 || f.pass_after() || !sum_relu_of(f, &sum, &relu, &relu_max))
    return false;
  SkinnyGemmShape s;
  s.m = rows.oh * rows.ow, s.k = rows.row_floats(), s.n = M, s.sum = sum, s.relu = relu, s.relu_max = relu_max;
  s.y_blocked16 = true;
  if (!skinny_gemm_check(s).empty() || s.m < kSkinnyMinRows ||
      s.k * s.n * static_cast<int64_t>(sizeof(float)) < kSkinnyConvMinWeightBytes)
    return false;
  if (static_cast<int>(srcs.size()) != rows.parts || w.size() != static_cast<size_t>(s.k * s.n) ||
      bias.size() != static_cast<size_t>(M))
    return false;
  for (int p = 0; p < rows.parts; ++p) {
    Im2RowPart& part = rows.part[p];
    const Val& v = val(srcs[p]);
    const Dims x{1, part.c, part.h, part.w};
    if (v.scale != 1.f || v.md.data_type() != dt::f32 || md_dims(v.md) != x) return false;
    part.blocked16 = v.md != md_t(to_dnnl(x), dt::f32, tag::nhwc);
    if (part.blocked16 && part.c % 16 != 0) return false;
  }
  if (!im2row_check(rows).empty()) return false;
  Exec g;
  for (int p = 0; p < rows.parts; ++p) {
    const Dims x{1, rows.part[p].c, rows.part[p].h, rows.part[p].w};
    const Val v = rows.part[p].blocked16 ? as_md(srcs[p], md_t(to_dnnl(x), dt::f32, tag::nChw16c)) : val(srcs[p]);
    g.args[p == 0 ? DNNL_ARG_SRC : DNNL_ARG_SRC_1] = mem_of(v);
  }
  const NodeDesc& n = r_.nodes[i];
  Val& rv = define(n.out[0] + "#rows", md_t({s.m, s.k}, dt::f32, tag::ab));
  g.args[DNNL_ARG_DST] = mem_of(rv);
  g.own = run_im2row;
  g.own_kind = "convolution";
  g.single = false;
  g.params = std::make_shared<const Im2RowShape>(rows);
  exec_own(std::move(g), "keel:im2row", false, n.name + " windows -> " + dims_str(Dims{s.m, s.k}));
  const Val rows_val = rv;
  Exec e;
  own_weights(
      e, skinny_gemm_packed_floats(s), [&](float* p) { skinny_gemm_pack(s, w.data(), true, p); }, &bias);
  const md_t dmd(to_dnnl(Dims{1, M, rows.oh, rows.ow}), dt::f32, tag::nChw16c);
  Val& o = define(f.out, dmd, residual_destination(i, f, dmd));  // the residual first, as for oneDNN's sum
  e.args[DNNL_ARG_SRC] = mem_of(rows_val);
  e.args[DNNL_ARG_DST] = mem_of(o);
  e.own = run_skinny_gemm;
  e.own_kind = "convolution";
  e.single = s.n <= 64;
  e.params = std::make_shared<const SkinnyGemmShape>(s);
  p_->flops += flops;
  const char* act = !relu ? " " : std::isinf(relu_max) ? " + Relu " : " + Clip ";
  exec_own(std::move(e), "keel:skinny_conv_avx512", false,
           n.name + (sum ? " + Add" : "") + act + dims_str(Dims{s.m, s.k}) + " x " + dims_str(Dims{s.k, s.n}));
  for (size_t k : f.nodes) done_[k] = true;
  return true;
}

// A 3x3 stride-1 convolution with padding 1 (its f32 source reordered to nChw16c when in another layout, as
// oneDNN's Winograd kernels would have it), channels in multiples of 16, then at most a residual sum and a Relu, as the
// chain's own Winograd F(4,3) step (steps/wino4.h). `w` [M][C][3][3] and `bias` with folds applied; `mode` the
// step's flags (streamed, position_major, f2); with `pick_f2`, F(2,3) where wino_few_tiles_pick times it faster.
// False, changing nothing, for anything else.
bool Builder::conv_wino4(size_t i, const Fusion& f, const std::string& src, const Dims& x, const Dims& y,
                         const std::vector<float>& w, const std::vector<float>& bias, double flops,
                         const Wino4Shape& mode, bool pick_f2) {
  bool sum = false, relu = false;
  if (!sum_relu_of(f, &sum, &relu)) return false;
  if (x.size() != 4 || y.size() != 4) return false;
  if (val(src).scale != 1.f || val(src).md.data_type() != dt::f32) return false;
  Wino4Shape s = mode;
  s.n = x[0], s.c = x[1], s.m = y[1], s.h = x[2], s.w = x[3], s.sum = sum, s.relu = relu;
  if (!wino4_check(s).empty() || y != Dims{s.n, s.m, s.h, s.w}) return false;
  if (w.size() != static_cast<size_t>(s.m * s.c * 9) || bias.size() != static_cast<size_t>(s.m)) return false;
  if (pick_f2 && !s.f2 && wino_few_tiles_pick(s, w) == 1) s.f2 = true;
  const Val xv = as_md(src, md_t(to_dnnl(x), dt::f32, tag::nChw16c));  // a reorder first unless nChw16c already
  Exec e;
  own_weights(
      e, wino4_packed_floats(s), [&](float* to) { wino4_pack_weights(s, w.data(), to); }, &bias);
  team_scratch(e, wino4_scratch_floats(s));
  const md_t dmd(to_dnnl(y), dt::f32, tag::nChw16c);
  Val& o = define(f.out, dmd, residual_destination(i, f, dmd));  // the residual first, as for oneDNN's sum
  e.args[DNNL_ARG_SRC] = mem_of(xv);
  e.args[DNNL_ARG_DST] = mem_of(o);
  e.own = run_wino4;
  e.own_kind = "convolution";
  e.params = std::make_shared<const Wino4Shape>(s);
  p_->flops += flops;
  exec_own(std::move(e),
           s.f2               ? "keel:wino2_avx512"
           : s.streamed       ? "keel:wino4_streamed_avx512"
           : s.position_major ? "keel:wino4_by_position_avx512"
                              : "keel:wino4_avx512",
           false,
           r_.nodes[i].name + (sum ? " + Add" : "") + (relu ? " + Relu " : " ") + dims_str(x) + " -> " + dims_str(y));
  for (size_t k : f.nodes) done_[k] = true;
  return true;
}

namespace {

// wino_few_tiles_pick's timing: F(4,3) against F(2,3) for `s` with weights `w` on `team` threads, each run with both
// forms' transformed weights flushed from the caches and the source read through them, remembered under `key`.
// Throws std::bad_alloc without the buffers.
size_t timed_pick(const std::string& key, const Wino4Shape& s, const std::vector<float>& w, int team) {
  return remembered_pick(key, [&]() -> size_t {
    Wino4Shape f2 = s;
    f2.f2 = true;
    auto floats = [](size_t n) { return zeroed_host(n * sizeof(float)); };
    auto f = [](const HostBuffer& p) { return static_cast<float*>(p.get()); };
    const size_t per_thread = std::max(wino4_scratch_floats(s), wino4_scratch_floats(f2));
    const size_t src_floats = static_cast<size_t>(s.n * s.c * s.h * s.w);
    const HostBuffer p4 = floats(wino4_packed_floats(s)), p2 = floats(wino4_packed_floats(f2));
    wino4_pack_weights(s, w.data(), f(p4));
    wino4_pack_weights(f2, w.data(), f(p2));
    const HostBuffer src = floats(src_floats), dst = floats(static_cast<size_t>(s.n * s.m * s.h * s.w)),
                     bias = floats(static_cast<size_t>(s.m)), scratch = floats(static_cast<size_t>(team) * per_thread);
    // Before each run: both forms' weights out of every cache (in a network the other layers' weights evict them
    // between runs: the path is taken for weights too large to stay), then the source read through the caches, as
    // its producer just wrote it (read_lines: split over the team, a byte per cache line).
    uint64_t sink = 0;
    auto cool = [&] {
      flush_lines(p4.get(), wino4_packed_floats(s) * sizeof(float), team);
      flush_lines(p2.get(), wino4_packed_floats(f2) * sizeof(float), team);
      sink += read_lines(src.get(), src_floats * sizeof(float), team);
    };
    auto run = [&](const Wino4Shape& v, const float* packed) {
      return [&, v, packed] { wino4_run(v, f(src), packed, f(bias), f(dst), f(scratch), team, per_thread); };
    };
    std::vector<double> took;
    const size_t best = fastest_run({run(s, f(p4)), run(f2, f(p2))}, cool, 4, {}, &took);
    std::ostringstream m;
    m << "wino_few_tiles: " << s.c << "->" << s.m << " at " << s.h << "x" << s.w << " on " << team
      << " thread(s): F(4,3) " << took[0] * 1e3 << " ms, F(2,3) " << took[1] * 1e3
      << " ms (weights from memory): " << (best ? "F(2,3)" : "F(4,3)");
    debug_log(m.str());
    return best;
  });
}

}  // namespace

// F(4,3) (0) or F(2,3) (1) for a 3x3 of few tiles whose transformed weights do not stay in cache between runs (`s`,
// position by position; ResNet's 14x14 at batch 1: 16 tiles of F(4,3), 49 of F(2,3)), whichever runs faster on this
// host at the plan's team. F(4,3) computes 2.25 products per output against F(2,3)'s 4 but reads 36/16 the weights
// (ResNet's 256->256: 9.4 MB against 4.2 MB per run); which wins depends on the memory bandwidth a core gets.
// Measured in ResNet-50 (docs/ONEDNN_PERFORMANCE.md, "(wft)"): on an Intel Xeon host whose core streams 10 GB/s from
// memory F(2,3) won at 1 and 2 threads; on the AMD EPYC hosts of earlier sessions F(4,3) had won at 2. So both are
// timed, each run with both forms' weights flushed from the caches (in a network its other layers' weights evict
// them between runs; timed hot, F(4,3) won on the Intel host too), and the answer is remembered per shape and team
// (common/conv_pick.h remembered_pick). Flushed rather than evicted by reading the network's other constants through
// the caches, as before "(wftf)": on the Intel host's 260 MiB last-level cache, shared with other VMs, part of the
// timed weights survived those 97 MiB of reads and the 2-thread timing kept F(4,3) where the model ran F(2,3) 15%
// faster. A claim-time plan (time_convs_ off) takes F(4,3) and leaves the timing to its first run (Plan::deferred,
// chain/runtime.cc run_chain).
size_t Builder::wino_few_tiles_pick(const Wino4Shape& s, const std::vector<float>& w) {
  if (options().wino_few_tiles_f2 != Options::Choice::kTimed)
    return options().wino_few_tiles_f2 == Options::Choice::kOn ? 1 : 0;
  const int team = std::max(1, p_->threads);
  std::ostringstream k;
  k << "wino_few_tiles|" << team << '|' << s.n << ',' << s.c << ',' << s.m << ',' << s.h << ',' << s.w << ',' << s.sum
    << s.relu;
  // What the closure holds outlives this builder (a claim-time plan's runs evaluate a deferred pick): the weights a
  // copy. Where the timing's buffers (the two forms' weights: 13.6 MB for ResNet's 256->256) cannot be had, F(4,3),
  // as without the timing: the plan itself allocates its weights later and reports a failure there.
  auto pick = [key = k.str(), s, w, team]() -> size_t {
    try {
      return timed_pick(key, s, w, team);
    } catch (const std::bad_alloc&) {
      debug_log("wino_few_tiles: no memory to time F(2,3) against F(4,3); F(4,3)");
      return 0;
    }
  };
  if (!time_convs_) {
    p_->deferred.push_back({{}, {}, pick});
    return 0;
  }
  return pick();
}

// A 1x1 stride-1 convolution without padding (its f32 source reordered to nChw16c when in another layout), channels
// in multiples of 16, then at most a residual sum and a Relu (or Clip(0, hi)), as the chain's own step
// (steps/pointwise.h). `w` [M][C] and `bias` with folds applied. False, changing nothing, for anything else.
bool Builder::conv_pointwise(size_t i, const Fusion& f, const std::string& src, const Dims& x, const Dims& y,
                             const std::vector<float>& w, const std::vector<float>& bias, double flops) {
  bool sum = false, relu = false;
  float relu_max = 0;
  if (!sum_relu_of(f, &sum, &relu, &relu_max)) return false;
  if (x.size() != 4 || y.size() != 4) return false;
  if (val(src).scale != 1.f || val(src).md.data_type() != dt::f32) return false;
  PointwiseShape s;
  s.n = x[0], s.c = x[1], s.m = y[1], s.h = x[2], s.w = x[3], s.sum = sum, s.relu = relu, s.relu_max = relu_max;
  if (!pointwise_check(s).empty() || y != Dims{s.n, s.m, s.h, s.w}) return false;
  if (w.size() != static_cast<size_t>(s.m * s.c) || bias.size() != static_cast<size_t>(s.m)) return false;
  const Val xv = as_md(src, md_t(to_dnnl(x), dt::f32, tag::nChw16c));  // a reorder first unless nChw16c already
  Exec e;
  own_weights(
      e, pointwise_packed_floats(s), [&](float* to) { pointwise_pack_weights(s, w.data(), to); }, &bias);
  const md_t dmd(to_dnnl(y), dt::f32, tag::nChw16c);
  Val& o = define(f.out, dmd, residual_destination(i, f, dmd));  // the residual first, as for oneDNN's sum
  e.args[DNNL_ARG_SRC] = mem_of(xv);
  e.args[DNNL_ARG_DST] = mem_of(o);
  e.own = run_pointwise;
  e.own_kind = "convolution";
  e.single = s.n * s.h * s.w < 28;  // fewer than two tiles: one thread
  e.params = std::make_shared<const PointwiseShape>(s);
  p_->flops += flops;
  const char* act = !relu ? " " : std::isinf(relu_max) ? " + Relu " : " + Clip ";
  exec_own(std::move(e), "keel:pointwise_avx512", false,
           r_.nodes[i].name + (sum ? " + Add" : "") + act + dims_str(x) + " -> " + dims_str(y));
  for (size_t k : f.nodes) done_[k] = true;
  return true;
}

// A fusion's post-ops as the activation the chain's own kernels apply in registers (steps/expand_dw.h): none, or
// one eltwise post-op of scale 1 that is Relu (alpha 0), Clip (v1 or v2), hard-swish or SiLU (swish, alpha 1). False
// for anything else.
static bool expand_dw_act_of(const dnnl::post_ops& po, ExpandDwAct* a) {
  *a = ExpandDwAct{};
  if (po.len() == 0) return true;
  if (po.len() != 1 || po.kind(0) != dnnl::primitive::kind::eltwise) return false;
  float scale = 0.f, alpha = 0.f, beta = 0.f;
  alg k = alg::undef;
  po.get_params_eltwise(0, scale, k, alpha, beta);
  if (scale != 1.f) return false;
  if (k == alg::eltwise_relu && alpha == 0.f) a->kind = ExpandDwAct::kRelu;
  else if (k == alg::eltwise_clip || k == alg::eltwise_clip_v2)
    a->kind = ExpandDwAct::kClip, a->lo = alpha, a->hi = beta;
  else if (k == alg::eltwise_hardswish) a->kind = ExpandDwAct::kHardSwish;
  else if (k == alg::eltwise_swish && alpha == 1.f) a->kind = ExpandDwAct::kSilu;
  else return false;
  return true;
}

// A 1x1 convolution (stride 1, no padding; `w` [M][C] and `bias` with folds applied, its activation in f.po), or with
// `stem` a 3x3 stride-2 one with padding 1 over at most 8 plain channels (`w` [M][C][3][3]: a network's first), whose
// sole reader is a 3x3 or 5x5 depthwise convolution with padding k / 2 and stride 1 or 2 (dw_reader_of), each followed
// by at most one activation expand_dw_act_of takes, as one step of the chain's own (steps/expand_dw.h): MobileNet's
// expansion never leaves the cache. The source is read as nChw16c (reordered first when in another layout). Measured:
// docs/ONEDNN_PERFORMANCE.md, "(xdw)". With AVX-512, f32 or bf16 (a chain at --precision bf16: AVX-512 BF16, no
// stem), the expand_dw option on; false, changing nothing, otherwise.
bool Builder::conv_expand_dw(size_t i, const Fusion& f, const std::string& src, const Dims& x,
                             const std::vector<float>& w, const std::vector<float>& bias, double flops, bool stem) {
  if (!options().expand_dw || (stem && !options().expand_dw_stem) || f.pass_after() || f.viewed ||
      !f.sum_with.empty() || x.size() != 4)
    return false;
  if (act_ != dt::f32 && act_ != dt::bf16) return false;
  ExpandDwShape s;
  s.n = x[0], s.c = x[1], s.h = x[2], s.w = x[3], s.stem = stem, s.bf16 = act_ == dt::bf16;
  const Dims y1 = dims_of(f.out);
  if (y1.size() != 4 || y1[0] != s.n || y1[2] != s.eh() || y1[3] != s.ew()) return false;
  s.m = y1[1];
  if (!expand_dw_act_of(f.po, &s.act1)) return false;
  DwReader d;
  if (!dw_reader_of(f, s.m, &d)) return false;
  const Fusion& g = d.fusion;
  s.k = d.k, s.stride = d.stride;
  if (g.pass_after() || g.viewed || !expand_dw_act_of(g.po, &s.act2) || !expand_dw_check(s).empty()) return false;
  const Dims y{s.n, s.m, s.oh(), s.ow()};
  if (dims_of(g.out) != y) return false;
  if (w.size() != static_cast<size_t>(s.m * s.c * (stem ? 9 : 1)) || bias.size() != static_cast<size_t>(s.m))
    return false;
  if (val(src).scale != 1.f || val(src).md.data_type() != act_) return false;
  // The projection after the depthwise convolution, taken into the step where its team splits rows anyway (below 7
  // rows a thread it splits channel groups, and a projection needs every channel of a row).
  Projection pr;
  const bool project = options().expand_dw_project && expand_dw_splits_rows(s, p_->threads) &&
                       projection_of(g.out, s.m, stem ? std::string() : src, Dims{s.n, s.c, s.h, s.w}, s.stride, &pr) &&
                       expand_dw_act_of(pr.act_po, &s.act3);
  if (project) s.proj = pr.out_channels, s.residual = pr.residual;
  s.at_once = expand_dw_rows_at_once(s, p_->threads) ? 1 : 0;  // fixed for the plan's team (its scratch follows)
  if (!expand_dw_check(s).empty()) return false;
  const Dims yo = project ? Dims{s.n, s.proj, s.oh(), s.ow()} : y;
  // A reorder first unless nChw16c already (a stem: unless plain).
  const Val xv = as_md(src, stem ? plain_md(x, dt::f32) : md_t(to_dnnl(x), act_, tag::nChw16c));
  Exec e;
  own_weights(
      e, expand_dw_packed_floats(s),
      [&](float* to) {
        expand_dw_pack(s, w.data(), bias.data(), d.w.data(), d.bias.data(), project ? pr.w.data() : nullptr,
                       project ? pr.bias.data() : nullptr, to);
      },
      nullptr);
  team_scratch(e, expand_dw_scratch_floats(s));
  e.args[DNNL_ARG_SRC] = mem_of(xv);
  const std::string& out = project ? pr.fusion.out : g.out;
  e.args[DNNL_ARG_DST] = mem_of(define(out, md_t(to_dnnl(yo), act_, tag::nChw16c)));
  e.own = run_expand_dw;
  e.own_kind = "convolution";
  e.params = std::make_shared<const ExpandDwShape>(s);
  p_->flops += flops + 2.0 * static_cast<double>(numel(y) * s.k * s.k) +
               (project ? 2.0 * static_cast<double>(numel(yo) * s.m) : 0.0);
  exec_own(std::move(e), "keel:expand_dw_avx512", false,
           r_.nodes[i].name + " + " + r_.nodes[d.node].name + (project ? " + " + r_.nodes[pr.node].name : "") +
               (s.residual ? " + Add " : " ") + dims_str(x) + " -> " + dims_str(yo));
  for (size_t k : f.nodes) done_[k] = true;
  done_[d.node] = true;
  for (size_t k : g.nodes) done_[k] = true;
  if (project) {
    done_[pr.node] = true;
    for (size_t k : pr.fusion.nodes) done_[k] = true;
  }
  return true;
}

// The 1x1 convolution that is the sole reader of `v` (M channels): constant f32 weights [P,M,1,1] (and bias [P]),
// group 1, no strides, padding or dilation; its fusion with at most a residual sum of `residual_src` (whose dims
// `rdims` must equal the output's, the step having stride 1) and one eltwise post-op; its weights and bias with the
// fusion's folds applied. False, changing nothing, otherwise.
bool Builder::projection_of(const std::string& v, int64_t M, const std::string& residual_src, const Dims& rdims,
                            int64_t stride, Projection* p) {
  const size_t u = sole_user(v);
  if (u == npos || pad_folds_.count(v) || se_folds_.count(v)) return false;
  const NodeDesc& n = r_.nodes[u];
  if (n.op != "Conv" || n.in[0] != v || n.out.size() != 1 || n.ai("group", 1) != 1) return false;
  const ConstT* W = cst(n.in_at(1));
  const ConstT* B = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (!W || W->dtype != KEEL_DTYPE_F32 || W->dims.size() != 4 || W->dims[1] != M || W->dims[2] != 1 || W->dims[3] != 1)
    return false;
  const int64_t P = W->dims[0];
  if ((!n.in_at(2).empty() && (!B || B->count() != P))) return false;
  if (n.ais("kernel_shape", {1, 1}) != Dims{1, 1} || n.ais("strides", {1, 1}) != Dims{1, 1} ||
      n.ais("dilations", {1, 1}) != Dims{1, 1} || n.ais("pads", {0, 0, 0, 0}) != Dims{0, 0, 0, 0})
    return false;
  const std::string ap = n.as("auto_pad", "NOTSET");
  if (ap != "NOTSET" && !ap.empty()) return false;
  Fusion h = fuse_after(n.out[0], u, true, P);
  if (h.pass_after() || h.viewed) return false;
  p->residual = !h.sum_with.empty();
  int first = 0;
  if (p->residual) {
    float scale = 0.f;
    if (h.sum_with != residual_src || stride != 1 || rdims[1] != P || h.po.len() < 1 ||
        h.po.kind(0) != dnnl::primitive::kind::sum)
      return false;
    h.po.get_params_sum(0, scale);
    if (scale != 1.f) return false;
    first = 1;
  }
  p->act_po = dnnl::post_ops();
  for (int k = first; k < h.po.len(); ++k) {
    if (h.po.kind(k) != dnnl::primitive::kind::eltwise) return false;
    float sc, al, be;
    alg a;
    h.po.get_params_eltwise(k, sc, a, al, be);
    p->act_po.append_eltwise(sc, a, al, be);
  }
  p->node = u;
  p->out_channels = P;
  folded_weights(h, *W, B, P, &p->w, &p->bias);
  p->fusion = std::move(h);
  return true;
}

}  // namespace keel::onednn::chain
