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
  const AtomView* atoms[4] = {};  // an operand that is an atom view (shape.cc reshape_like): its dims and groups
  for (int k = 0; k < (has_mask ? 4 : 3); ++k) {
    v[k] = val(n.in[k]);
    if (v[k].scale != 1.f) throw Reject{"scaled input"};
    if (auto av = atom_views_.find(n.in[k]); av != atom_views_.end()) {  // f32, refined below
      atoms[k] = &av->second;
      views[k].dims = av->second.dims;
      continue;
    }
    if (v[k].md.data_type() == dt::bf16) v[k] = as_md(n.in[k], plain_md(md_dims(v[k].md), dt::f32));
    else if (v[k].md.data_type() != dt::f32) throw Reject{"f32 or bf16 operands only"};
    if (!is_strided(v[k].md)) v[k] = as_plain(n.in[k]);
    views[k] = {md_dims(v[k].md), md_strides(v[k].md)};
  }
  Dims y;
  std::string why;
  if (!attention_out_dims(views[0].dims, views[1].dims, views[2].dims, has_mask ? &views[3].dims : nullptr, &y, &why))
    throw Reject{why};
  // Batch dims that an atom view merges (its heads and the batch) are split into those atoms in every operand and
  // the output alike, so that each batch entry gets its own offset in each (attention_plan's batch_offsets).
  const size_t R = y.size();
  std::vector<Dims> parts(R - 2);
  for (int k = 0; k < 4; ++k) {
    if (!atoms[k]) continue;
    const Dims ad = md_dims(v[k].md);
    const size_t rk = atoms[k]->dims.size();
    for (size_t d = 0; d < rk; ++d) {
      const Dims& g = atoms[k]->groups[d];
      if (g.size() == 1) continue;
      if (d + 2 >= rk) throw Reject{"merged dims as attention rows or columns"};
      Dims ps;
      for (int64_t a : g) ps.push_back(ad[static_cast<size_t>(a)]);
      Dims& want = parts[d + R - rk];
      if (!want.empty() && want != ps) throw Reject{"operands merge other dims"};
      want = ps;
    }
  }
  // Appends a dim of `size` and `stride` to `r`, split into *ps where given (the split's product is the size, or the
  // dim is 1: broadcast, parts of 1 with stride 0).
  auto push = [](StridedView& r, int64_t size, int64_t stride, const Dims* ps) {
    if (!ps) {
      r.dims.push_back(size), r.strides.push_back(stride);
      return;
    }
    const size_t at = r.dims.size();
    for (int64_t p : *ps) r.dims.push_back(size == 1 ? 1 : p);
    r.strides.resize(r.dims.size(), 0);
    if (size == 1) return;
    for (size_t q = ps->size(); q-- > 0;) r.strides[at + q] = stride, stride *= (*ps)[q];
  };
  // The split of an operand's dim d of rank rk (batch dims align with the output's from the end), or null.
  auto split_of = [&](size_t d, size_t rk) -> const Dims* {
    return d + 2 < rk && !parts[d + R - rk].empty() ? &parts[d + R - rk] : nullptr;
  };
  for (int k = 0; k < 4; ++k) {
    StridedView r;
    const size_t rk = views[k].dims.size();
    if (!atoms[k]) {
      for (size_t d = 0; d < rk; ++d) push(r, views[k].dims[d], views[k].strides[d], split_of(d, rk));
    } else {
      // The atoms of each dim in turn (a dim of several atoms is their split already).
      const Dims ad = md_dims(v[k].md), as = md_strides(v[k].md);
      for (size_t d = 0; d < rk; ++d) {
        const Dims& g = atoms[k]->groups[d];
        if (g.size() == 1) push(r, ad[static_cast<size_t>(g[0])], as[static_cast<size_t>(g[0])], split_of(d, rk));
        else
          for (int64_t a : g) push(r, ad[static_cast<size_t>(a)], as[static_cast<size_t>(a)], nullptr);
      }
    }
    views[k] = std::move(r);
  }
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
  {
    StridedView r;
    for (size_t d = 0; d < R; ++d) push(r, out.dims[d], out.strides[d], split_of(d, R));
    out = std::move(r);
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
