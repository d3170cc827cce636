// plugins/cpu_onednn/chain/ops/elementwise.cc — unary element-wise ops (the eltwise algorithm map, common/common.h) and
// the binary Add/Sub/Mul/Div.
#include "chain/builder.h"

namespace keel::onednn::chain {

// An element-wise op on its own: one eltwise primitive per post-op eltwise_po gives (HardSigmoid: two, the second in
// place over the first one's output; oneDNN's eltwise primitive with a post-op is its reference kernel).
void Builder::eltwise(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  dnnl::post_ops ops;
  if (!eltwise_po(n, &ops))
    throw Reject{"non-constant Clip bounds, unknown Gelu approximation or a Pow exponent other than 2 and 0.5"};
  const Val xv = val(n.in[0]);
  if (xv.scale != 1.f) throw Reject{"scaled input"};
  md_t md = xv.md;
  if (!is_plain_dense(md) && is_strided(md)) md = plain_md(md_dims(md));
  Val sv = as_md(n.in[0], md);
  int buf = dead_after(n.in[0], i) && sv.off == 0 && vals_[n.in[0]].buf == sv.buf ? sv.buf : -2;
  if (buf >= 0) p_->bufs[buf].values--;
  dnnl::memory sm = mem_of(sv);
  Val& o = define(n.out[0], md, buf);
  dnnl::memory dm = mem_of(o);
  for (int k = 0; k < ops.len(); ++k) {
    float scale, alpha, beta;
    alg a;
    ops.get_params_eltwise(k, scale, a, alpha, beta);
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, a, md, alpha, beta);
    dnnl::eltwise_forward::primitive_desc pd(d, user_scratchpad(), engine());
    exec(dnnl::eltwise_forward(pd), {{DNNL_ARG_SRC, k == 0 ? sm : dm}, {DNNL_ARG_DST, dm}});
  }
}

// Add/Sub/Mul/Div: two values of one shape, or a value and a broadcast constant. A scalar Mul/Div read only by a
// MatMul becomes a scaled view.
void Builder::binary(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.in.size() != 2) throw Reject{"two inputs"};
  if (n.op == "Mul" && fold_channel_scale(i)) return;
  const ConstT* c0 = cst(n.in[0]);
  const ConstT* c1 = cst(n.in[1]);
  if ((n.op == "Mul" || n.op == "Div") && c1 && c1->count() == 1 && !c0) {
    float k = static_cast<float>(c1->at(0));
    if (n.op == "Div") k = 1.f / k;
    size_t u = sole_user(n.out[0]);
    if (u != npos && r_.nodes[u].op == "MatMul" && vals_.count(n.in[0]) && vals_[n.in[0]].scale == 1.f) {
      Val v = vals_[n.in[0]];
      v.scale = k;
      v.scale_of = n.in[0];
      vals_[n.out[0]] = v;
      return;
    }
  }
  alg a = n.op == "Add"   ? alg::binary_add
          : n.op == "Sub" ? alg::binary_sub
          : n.op == "Mul" ? alg::binary_mul
                          : alg::binary_div;
  Dims y = dims_of(n.out[0]);
  std::string x0 = n.in[0], x1 = n.in[1];
  Dims d0 = dims_of(x0), d1 = dims_of(x1);
  if (d0 != y || c0) {
    if (a == alg::binary_sub || a == alg::binary_div) throw Reject{"the first operand broadcasts"};
    std::swap(x0, x1);
    std::swap(d0, d1);
  }
  if (d0 != y || is_const(x0)) throw Reject{"neither operand has the output's shape"};
  const Val v0 = val(x0);
  if (v0.scale != 1.f) throw Reject{"scaled input"};
  // A channels-last operand (a transposed view, ConvNeXt's blocks after their permute back) is read as such.
  const bool cl0 = (y.size() == 4 || y.size() == 5) && v0.md == md_t(to_dnnl(y), act_, channels_last_tag(y.size()));
  md_t m0 = is_strided(v0.md) && !is_plain_dense(v0.md) && !cl0 ? plain_md(y) : v0.md;
  md_t m1;
  Dims e;
  if (d1 == y) {
    m1 = m0;
  } else {
    if (d1.size() > y.size()) throw Reject{"rank"};
    e.assign(y.size() - d1.size(), 1);
    e.insert(e.end(), d1.begin(), d1.end());
    for (size_t k = 0; k < y.size(); ++k)
      if (e[k] != y[k] && e[k] != 1) throw Reject{"broadcast"};
    m1 = plain_md(e);
    if (cl0) {
      // Over nhwc a per-channel [1,C,1,1] operand (its plain bytes are nhwc's) runs on the jit kernel; other
      // broadcasts over plain memory.
      bool per_channel = e[1] == y[1] && (e[0] == 1 || e[0] == y[0]);
      for (size_t k = 2; k < e.size() && per_channel; ++k) per_channel = e[k] == 1;
      if (!per_channel) m0 = plain_md(y);
    } else if (!is_plain_dense(m0)) {
      // Per-channel over nChw16c: oneDNN's jit kernel wants the [N,C,1,1] second source blocked the same way (for
      // C % 16 == 0 the same bytes as the plain one); any other broadcast runs over plain memory.
      // (3-D: [N,C,1,1,1] over nCdhw16c alike.)
      bool per_channel = (y.size() == 4 || y.size() == 5) && (e[0] == 1 || e[0] == y[0]) && e[1] == y[1] &&
                         y[1] % 16 == 0 && m0 == md_t(to_dnnl(y), act_, blocked16_tag(y.size()));
      for (size_t k = 2; k < e.size() && per_channel; ++k) per_channel = e[k] == 1;
      if (per_channel) m1 = md_t(to_dnnl(e), act_, blocked16_tag(e.size()));
      else m0 = plain_md(y);
    }
  }
  Val s0 = as_md(x0, m0);
  // The second source in the first one's layout, or (broadcast) plain, read with the rank-extended dims; a
  // [N,C,1,1] value already blocked as nChw16c (C % 16 == 0) is read where it is.
  Val s1;
  if (d1 == y) {
    s1 = as_md(x1, m0);
  } else {
    s1 = val(x1);
    bool same_bytes = s1.scale == 1.f && m1 != plain_md(e) && numel(d1) == numel(e) &&
                      (is_plain_dense(s1.md) ||
                       (md_dims(s1.md).size() == e.size() && s1.md == md_t(to_dnnl(e), act_, blocked16_tag(e.size()))));
    if (!same_bytes) s1 = as_plain(x1);
  }
  if (s1.md.data_type() != m1.data_type() || m0.data_type() != act_) throw Reject{"operands of different dtypes"};
  dnnl::binary::desc d(a, m0, m1, m0);
  dnnl::binary::primitive_desc pd(d, user_scratchpad(), engine());
  int buf = dead_after(x0, i) && s0.buf == vals_[x0].buf && s0.off == 0 ? s0.buf : -2;
  if (buf >= 0) p_->bufs[buf].values--;
  dnnl::memory a0 = mem_of(s0), a1 = mem_at(m1, s1.buf, s1.off);
  Val& o = define(n.out[0], m0, buf);
  dnnl::memory dm = mem_of(o);
  exec(dnnl::binary(pd), {{DNNL_ARG_SRC_0, a0}, {DNNL_ARG_SRC_1, a1}, {DNNL_ARG_DST, dm}});
}

}  // namespace keel::onednn::chain
