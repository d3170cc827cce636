// plugins/cpu_onednn/chain/ops/attention.cc — keel.Attention as the chain's own step (steps/attention.h).
#include "chain/builder.h"

namespace keel::onednn::chain {

// keel.Attention(Q, Kt, V, [mask]) as the chain's own step (steps/attention.h): Q, Kt, V and the mask read where
// they lie (strided views: the heads' Slice / Reshape / Transpose of the in-projection move nothing), the output
// written straight into the layout of a Transpose that alone reads it (the heads joined again, as matmul() does);
// the scores stay in each thread's cache. It computes in f32: a bf16 node (a mixed-precision graph) reads its operands
// converted to plain f32 and writes f32 memory that one reorder rounds into its bf16 output.
void Builder::attention(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  const dt out_dt = act_;
  if (out_dt != dt::f32 && out_dt != dt::bf16) throw Reject{"keel.Attention in f32 or bf16 only"};
  if (n.in.size() < 3 || n.out.size() != 1) throw Reject{"keel.Attention needs Q, Kt, V and one output"};
  const bool has_mask = !n.in_at(3).empty();
  float scale = n.af("scale", 1.f);
  Val v[4];
  StridedView views[4];
  for (int k = 0; k < (has_mask ? 4 : 3); ++k) {
    v[k] = val(n.in[k]);
    if (v[k].scale != 1.f) throw Reject{"scaled input"};
    if (v[k].md.data_type() == dt::bf16) v[k] = as_md(n.in[k], plain_md(md_dims(v[k].md), dt::f32));
    else if (v[k].md.data_type() != dt::f32) throw Reject{"f32 or bf16 operands only"};
    if (!is_strided(v[k].md)) v[k] = as_plain(n.in[k]);
    views[k] = {md_dims(v[k].md), md_strides(v[k].md)};
  }
  Dims y;
  std::string why;
  if (!attention_out_dims(views[0].dims, views[1].dims, views[2].dims, has_mask ? &views[3].dims : nullptr, &y, &why))
    throw Reject{why};
  // The output: plain, or transposed for a Transpose that alone reads it.
  StridedView out{y, dense_strides(y)};
  std::string out_name = n.out[0];
  Dims yt, ys;
  const size_t tr = sole_transpose(n.out[0], y, &yt, &ys);
  if (tr != npos) {
    out.strides = ys;
    out_name = r_.nodes[tr].out[0];
    y = yt;
  }
  AttentionShape s = attention_plan(views[0], views[1], views[2], has_mask ? &views[3] : nullptr, out, scale,
                                    std::max(1, p_->threads));
  Exec e;
  const int args[4] = {DNNL_ARG_SRC_0, DNNL_ARG_SRC_1, DNNL_ARG_SRC_2, DNNL_ARG_SRC_3};
  for (int k = 0; k < (has_mask ? 4 : 3); ++k) e.args[args[k]] = mem_of(v[k]);
  team_scratch(e, attention_scratch_floats(s));
  // f32 output memory: the value itself, or (bf16) a buffer of the step's own, rounded into the value after it.
  const int f32_buf = out_dt == dt::f32 ? -1 : new_buf(static_cast<uint64_t>(numel(y)) * sizeof(float));
  Val* o = out_dt == dt::f32 ? &define(out_name, plain_md(y)) : nullptr;
  e.args[DNNL_ARG_DST] = mem_at(strided_md(out.dims, out.strides), o ? o->buf : f32_buf, o ? o->off : 0);
  e.own = run_attention;
  e.own_kind = "attention";
  const double flops = 2.0 * static_cast<double>(s.batches * s.S * s.T * (s.D + s.Dv));
  e.params = std::make_shared<const AttentionShape>(std::move(s));
  p_->flops += flops;
  exec_own(std::move(e), has_avx512f() ? "keel:attention_avx512" : "keel:attention_scalar", false,
           n.name + " Q " + dims_str(views[0].dims) + " Kt " + dims_str(views[1].dims) + " V " +
               dims_str(views[2].dims) + (has_mask ? " mask " + dims_str(views[3].dims) : "") + " -> " + dims_str(y) +
               (tr != npos ? " (transposed)" : ""));
  if (out_dt != dt::f32) {
    dnnl::memory from = mem_at(plain_md(y, dt::f32), f32_buf, 0);
    Val& ob = define(out_name, plain_md(y, out_dt));
    dnnl::memory to = mem_of(ob);
    exec(reorder_prim(from, to), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
  }
  if (tr != npos) done_[tr] = true;
}

}  // namespace keel::onednn::chain
