// plugins/cpu_onednn/chain/ops/matmul.cc — MatMul and Gemm (strided views read directly, bias and scale post-ops).
#include "chain/builder.h"

namespace keel::onednn::chain {

// MatMul (batched, broadcast; B constant or a value) and Gemm (constant B, C a constant bias).
void Builder::matmul(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  const bool gemm = n.op == "Gemm";
  std::string an = n.in[0], bn = n.in_at(1);
  Dims a = dims_of(an), b = dims_of(bn);
  float scale = 1.f;
  // A scaled view (a folded scalar Mul/Div) in front: the scale moves to the output.
  for (std::string* v : {&an, &bn}) {
    auto it = vals_.find(*v);
    if (it != vals_.end() && it->second.scale != 1.f) {
      scale *= it->second.scale;
      *v = it->second.scale_of;
    }
  }
  Dims y;
  std::vector<float> gemm_bias;
  bool transB = false;
  if (gemm) {
    if (a.size() != 2 || b.size() != 2) throw Reject{"Gemm needs 2-D operands"};
    if (n.ai("transA", 0)) throw Reject{"transA"};
    transB = n.ai("transB", 0) != 0;
    float alpha = n.af("alpha", 1.f), beta = n.af("beta", 1.f);
    scale *= alpha;
    if (!is_const(bn)) throw Reject{"Gemm with a non-constant B"};
    int64_t M = a[0], K = a[1], N = transB ? b[0] : b[1];
    if ((transB ? b[1] : b[0]) != K) throw Reject{"Gemm shapes"};
    y = {M, N};
    if (!n.in_at(2).empty()) {
      const ConstT* c = cst(n.in_at(2));
      if (!c || !(c->count() == N || c->count() == 1) || (c->dims.size() == 2 && c->dims[0] != 1))
        throw Reject{"Gemm C other than a constant [N]"};
      gemm_bias.resize(N);
      for (int64_t k = 0; k < N; ++k) gemm_bias[k] = beta * static_cast<float>(c->at(c->count() == 1 ? 0 : k));
    }
  } else {
    if (a.size() < 2 || b.size() < 2) throw Reject{"1-D MatMul operands"};
    if (a.back() != b[b.size() - 2]) throw Reject{"MatMul inner dims"};
    size_t r = std::max(a.size(), b.size());
    Dims ab(r - a.size(), 1), bb(r - b.size(), 1);
    ab.insert(ab.end(), a.begin(), a.end());
    bb.insert(bb.end(), b.begin(), b.end());
    y.resize(r);
    for (size_t k = 0; k + 2 < r; ++k) {
      if (ab[k] != bb[k] && ab[k] != 1 && bb[k] != 1) throw Reject{"batch dims do not broadcast"};
      y[k] = std::max(ab[k], bb[k]);
    }
    y[r - 2] = ab[r - 2];
    y[r - 1] = bb[r - 1];
    a = ab;
    b = bb;
  }
  // A batch of rows times one matrix (B without batch dims): one [rows, K] x [K, N] product over A's plain memory.
  const Dims y_final = y;
  bool collapse = false;
  if (!gemm && y.size() > 2) {
    collapse = true;
    for (size_t k = 0; k + 2 < b.size(); ++k) collapse = collapse && b[k] == 1;
    if (collapse) {
      int64_t rows = numel(y) / y.back();
      a = {rows, a.back()};
      b = {b[b.size() - 2], b.back()};
      y = {rows, y.back()};
    }
  }
  const size_t r = y.size();
  if (r > 6) throw Reject{"rank > 6"};
  Fusion f = fuse_after(n.out[0], i, false, 0);
  f.gelu_pass = take_gelu(f);
  scale *= f.out_scale;
  if (!gemm_bias.empty()) {
    // Gemm's C is part of the product the fused factors scale: a scalar Mul before any bias (f.out_scale) and the
    // per-column ones.
    for (float& v : gemm_bias) v *= f.out_scale;
    for (size_t k = 0; k < f.col_scale.size() && k < gemm_bias.size(); ++k) gemm_bias[k] *= f.col_scale[k];
    if (!f.mm_bias.empty())
      for (size_t k = 0; k < gemm_bias.size(); ++k) gemm_bias[k] += f.mm_bias[k];
    f.mm_bias = gemm_bias;
  }
  // A: the value's memory when oneDNN reads it (strided views included), else plain.
  auto rank_to = [&](const md_t& md, size_t rr) {
    Dims d = md_dims(md), st = md_strides(md);
    while (d.size() < rr) d.insert(d.begin(), 1), st.insert(st.begin(), st.empty() ? 1 : st.front() * d[1]);
    return strided_md(d, st, md.data_type());
  };
  md_t bias_md;
  if (!f.mm_bias.empty()) {
    Dims bd(r, 1);
    bd.back() = y.back();
    bias_md = plain_md(bd, dt::f32);
  }
  // A scalar factor: into constant weights; else an output scale (applied to the product, so not with a bias).
  const ConstT* bconst = cst(bn);
  float weight_scale = 1.f;
  if (scale != 1.f && bconst) weight_scale = scale, scale = 1.f;
  if (scale != 1.f && !f.mm_bias.empty()) throw Reject{"a scale and a bias on non-constant weights"};
  if (scale == 1.f && narrow_gemm(i, f, an, a, y, bconst, transB, weight_scale)) return;
  dnnl::primitive_attr attr = user_scratchpad();
  if (scale != 1.f) attr.set_output_scales(0, {scale});
  attr.set_post_ops(f.po);
  const dt out_t = f.dst_f32 ? dt::f32 : act_;
  md_t ymd = plain_md(y, out_t);
  // A product read only by a Transpose (attention's heads, [B,H,S,Dh] -> [B,S,H,Dh], before the Reshape that joins
  // them): written straight into the transposed layout (oneDNN's brgemm matmul takes a strided destination), so the
  // Transpose is a plain value and costs nothing.
  Dims yt, ys;
  size_t tr = collapse || !f.sum_with.empty() || f.viewed || f.dst_f32 ? npos : sole_transpose(f.out, y, &yt, &ys);
  if (tr != npos) ymd = strided_md(y, ys, act_);
  // Constant weights with the factors fused after the product folded in (weight_scale, f.col_scale), their rows in the
  // order A lies in memory when A is a flattened blocked value (flatten_into_gemm); B's own layout ([..., K, N], or
  // Gemm's transposed [N, K]). Null for a B that is a value.
  const ConstT* bc = cst(bn);
  if (bc && bc->dtype != KEEL_DTYPE_F32) throw Reject{"f32 only"};
  std::vector<float> scaled;
  const float* wsrc = bc ? bc->f32() : nullptr;
  if (bc && (weight_scale != 1.f || !f.col_scale.empty())) {
    scaled.assign(bc->f32(), bc->f32() + bc->count());
    for (float& v : scaled) v *= weight_scale;
    // Output column n of element e: B is [..., K, N], or Gemm's transposed B [N, K].
    const auto n_cols = static_cast<size_t>(y.back()), k_rows = static_cast<size_t>(a.back());
    if (!f.col_scale.empty())
      for (size_t e = 0; e < scaled.size(); ++e) scaled[e] *= f.col_scale[gemm && transB ? e / k_rows : e % n_cols];
    wsrc = scaled.data();
  }
  if (auto ff = flat_folds_.find(an); bc && gemm && ff != flat_folds_.end()) {
    scaled = flat_fold_rows(wsrc, ff->second.first, ff->second.second, y[1], transB);
    wsrc = scaled.data();
  }
  // Where the product goes: a new buffer, or the residual's (a sum post-op in place; else the residual copied into
  // a new one first), defined as the fused nodes' output (through the Transpose's strides when it follows).
  md_t rows_view_md;  // the product as a permuted view (set below)
  auto place_output = [&]() -> Val& {
    // Permuted (Fusion::permuted): the output [N,C,H,W] is the product's [N,H,W,C] memory read through strides.
    md_t permuted_md;
    if (f.permuted) {
      const Dims pd4 = dims_of(f.out);  // [N,C,H,W]
      permuted_md = strided_md(pd4, {pd4[1] * pd4[2] * pd4[3], 1, pd4[3] * pd4[1], pd4[1]}, out_t);
    }
    int dbuf = -2;
    if (!f.sum_with.empty()) {
      size_t add_node = i;
      for (size_t k : f.nodes)
        if (r_.nodes[k].op == "Add") add_node = k;
      const Val rv = vals_[f.sum_with];
      // The residual in the destination's type (f32 where a Cast was fused: not the node's bf16) and layout.
      const bool in_layout = f.permuted ? rv.md == permuted_md : is_plain_dense(rv.md) && rv.md.data_type() == out_t;
      if (in_layout && rv.off == 0 && dead_after(f.sum_with, add_node)) {
        dbuf = rv.buf;
        p_->bufs[dbuf].values--;
      } else if (f.permuted) {  // copied into the destination's layout
        dbuf = new_buf(permuted_md.get_size());
        dnnl::memory s1 = mem_of(rv), d1 = mem_at(permuted_md, dbuf, 0);
        exec(reorder_prim(s1, d1), {{DNNL_ARG_FROM, s1}, {DNNL_ARG_TO, d1}});
      } else {
        Val tmp = as_md(f.sum_with, plain_md(dims_of(f.sum_with), out_t));
        dbuf = new_buf(ymd.get_size());
        dnnl::memory s1 = mem_of(tmp), d1 = mem_at(tmp.md, dbuf, 0);
        exec(reorder_prim(s1, d1), {{DNNL_ARG_FROM, s1}, {DNNL_ARG_TO, d1}});
      }
    }
    Val& out = tr != npos                ? define(r_.nodes[tr].out[0], plain_md(yt), dbuf)
               : f.permuted              ? define(f.out, permuted_md, dbuf)
               : !rows_view_md.is_zero() ? define(f.out, rows_view_md, dbuf)
                                         : define(f.out, plain_md(f.viewed ? dims_of(f.out) : y_final, out_t), dbuf);
    if (tr != npos) done_[tr] = true;
    return out;
  };
  if (scale == 1.f && tr == npos && skinny_gemm(i, f, an, a, y, wsrc, gemm && transB, place_output)) return;
  // Weights: a constant is prepacked in the primitive's layout; a value is read where it is.
  md_t bmd;
  Dims bdims = b;
  if (bc) {
    bmd = md_t(to_dnnl(bdims), act_, tag::any);
    if (gemm) bdims = {a[1], y[1]}, bmd = md_t(to_dnnl(bdims), act_, tag::any);
  }
  auto try_pd = [&](const md_t& amd, const md_t& wmd) -> std::unique_ptr<dnnl::matmul::primitive_desc> {
    try {
      dnnl::matmul::desc d(amd, wmd, bias_md, ymd);
      auto pd = std::make_unique<dnnl::matmul::primitive_desc>(d, attr, engine());
      std::string impl = pd->impl_info_str();
      if (impl.rfind("ref", 0) == 0) return nullptr;
      return pd;
    } catch (const dnnl::error&) {
      return nullptr;
    }
  };
  std::unique_ptr<dnnl::matmul::primitive_desc> pd;
  // A collapsed product over a permuted view whose rows lie whole in memory (torch's in-projection over a batch-first
  // input transposed to [S, B, E]): its rows taken in memory order, the product written in the same order and defined
  // as the view with the same permutation, instead of a reorder of A to plain (the transformer encoder at batch 8, 2
  // threads: 0.09 ms a layer).
  // Only where nothing then copies a wider product back to plain: the product no wider than A (N <= K), or read by
  // Slices alone (q/k/v, views).
  auto sliced_only = [&] {
    if (escapes(f.out) || users(f.out).empty()) return false;
    for (size_t u : users(f.out))
      if (r_.nodes[u].op != "Slice" && r_.nodes[u].op != "Shape") return false;
    return true;
  };
  if (collapse && f.sum_with.empty() && !f.permuted && !f.viewed && !f.pass_after() && tr == npos &&
      (y.back() <= a.back() || sliced_only())) {
    const Val& v = val(an);
    Dims order;
    if (is_strided(v.md) && !is_plain_dense(v.md) && v.md.data_type() == act_ &&
        md_dims(v.md).size() == y_final.size() && dense_order(v.md, &order) &&
        static_cast<size_t>(order.back()) + 1 == y_final.size()) {
      Dims od = md_dims(v.md);  // the product's dims, last replaced by N: strides of that layout in `order`
      od.back() = y.back();
      Dims st(od.size());
      int64_t stride = 1;
      for (size_t k = order.size(); k-- > 0;)
        st[static_cast<size_t>(order[k])] = stride, stride *= od[static_cast<size_t>(order[k])];
      rows_view_md = strided_md(y_final, st, out_t);
    }
  }
  Val av = collapse && rows_view_md.is_zero() ? as_plain(an) : val(an);
  if (collapse) av.md = plain_md(a);
  md_t amd_view = is_strided(av.md) ? rank_to(av.md, r) : md_t();
  md_t bmd_view;
  Val bv;
  if (!bc) {
    bv = val(bn);
    bmd_view = is_strided(bv.md) ? rank_to(bv.md, r) : md_t();
  }
  bool a_direct = false, b_direct = false;
  if (!amd_view.is_zero()) {
    pd = try_pd(amd_view, bc ? bmd : (!bmd_view.is_zero() ? bmd_view : plain_md(b)));
    if (pd) a_direct = true, b_direct = !bc && !bmd_view.is_zero();
  }
  if (!pd) pd = try_pd(plain_md(a), bc ? bmd : plain_md(b));
  if (!pd && tr != npos) {  // no jit matmul writes that transposed layout: a plain product, the Transpose after it
    tr = npos;
    ymd = plain_md(y, out_t);
    a_direct = b_direct = false;
    if (!amd_view.is_zero()) {
      pd = try_pd(amd_view, bc ? bmd : (!bmd_view.is_zero() ? bmd_view : plain_md(b)));
      if (pd) a_direct = true, b_direct = !bc && !bmd_view.is_zero();
    }
    if (!pd) pd = try_pd(plain_md(a), bc ? bmd : plain_md(b));
  }
  if (!pd) throw Reject{"oneDNN has no matmul for this case"};
  std::unordered_map<int, dnnl::memory> args;
  if (a_direct) {
    args[DNNL_ARG_SRC] = mem_at(pd->src_desc(), av.buf, av.off);
  } else {
    Val pa = as_plain(an);
    args[DNNL_ARG_SRC] = mem_at(pd->src_desc(), pa.buf, pa.off);
  }
  if (bc) {
    Dims kn = bdims;
    md_t user;
    if (gemm && transB) user = md_t(to_dnnl(kn), dt::f32, tag::ba);
    else user = plain_md(kn, dt::f32);
    dnnl::memory um(user, engine(), const_cast<float*>(wsrc));
    p_->owned.emplace_back(pd->weights_desc(), engine(), p_->weights.alloc(pd->weights_desc().get_size()));
    dnnl::reorder(um, p_->owned.back()).execute(stream(), um, p_->owned.back());
    stream().wait();
    args[DNNL_ARG_WEIGHTS] = p_->owned.back();
  } else if (b_direct) {
    args[DNNL_ARG_WEIGHTS] = mem_at(pd->weights_desc(), bv.buf, bv.off);
  } else {
    Val pb = as_plain(bn);
    args[DNNL_ARG_WEIGHTS] = mem_at(pd->weights_desc(), pb.buf, pb.off);
  }
  if (!f.mm_bias.empty()) {
    p_->owned.emplace_back(bias_md, engine());
    std::memcpy(p_->owned.back().get_data_handle(), f.mm_bias.data(), f.mm_bias.size() * sizeof(float));
    args[DNNL_ARG_BIAS] = p_->owned.back();
  }
  Val& out = place_output();
  // (Written as [rows, N] when collapsed: the same plain memory; through the Transpose's strides when it follows.)
  args[DNNL_ARG_DST] = mem_at(ymd, out.buf, out.off);
  p_->flops += 2.0 * numel(y) * a.back();
  exec(dnnl::matmul(*pd), std::move(args));
  if (f.gelu_pass) exec_gelu(out, f.gelu_tanh);
  for (size_t k : f.nodes) done_[k] = true;
}

// A product with at most 16 columns over a long K and constant weights, with at most a bias after it (a small
// CNN's classifier: Gemm or a 2-D MatMul), as the chain's own step (steps/narrow_gemm.h): oneDNN's matmul ran the
// peers' simple_cnn's [32,7200] x [7200,10] in 0.048 ms at 1 thread, about half of the FMA peak. f32 on AVX-512
// only; false, changing nothing, otherwise. `a`, `y`: the product's 2-D dims; `weight_scale`: folded into W.
bool Builder::narrow_gemm(size_t i, const Fusion& f, const std::string& an, const Dims& a, const Dims& y,
                          const ConstT* bc, bool trans_b, float weight_scale) {
  if (!has_avx512f() || act_ != dt::f32 || !bc || bc->dtype != KEEL_DTYPE_F32 || a.size() != 2 || y.size() != 2)
    return false;
  const NarrowGemmShape s{y[0], a[1], y[1]};
  if (s.n < 1 || s.n > kNarrowGemmMaxColumns || s.k < 256 || bc->count() != s.k * s.n) return false;
  if (f.po.len() != 0 || !f.sum_with.empty() || f.pass_after() || f.viewed || f.dst_f32 || !f.col_scale.empty())
    return false;
  const Dims yd = dims_of(f.out);  // [m, n], or a MatMul's [..., rows, n] collapsed to it
  if (numel(yd) != s.m * s.n) return false;
  // W as [K][N], scaled, its rows in the order A lies in memory when A is a flattened blocked value.
  std::vector<float> w(static_cast<size_t>(s.k * s.n));
  const float* b = bc->f32();
  for (int64_t k = 0; k < s.k; ++k)
    for (int64_t c = 0; c < s.n; ++c) w[k * s.n + c] = (trans_b ? b[c * s.k + k] : b[k * s.n + c]) * weight_scale;
  if (auto ff = flat_folds_.find(an); ff != flat_folds_.end())
    w = flat_fold_rows(w.data(), ff->second.first, ff->second.second, s.n, false);
  Exec e;
  const md_t packed_md({static_cast<int64_t>(narrow_gemm_packed_floats(s))}, dt::f32, tag::a);
  p_->owned.emplace_back(packed_md, engine(), p_->weights.alloc(packed_md.get_size()));
  narrow_gemm_pack(s, w.data(), static_cast<float*>(p_->owned.back().get_data_handle()));
  e.args[DNNL_ARG_WEIGHTS] = p_->owned.back();
  p_->owned.emplace_back(md_t({s.n}, dt::f32, tag::a), engine());
  float* bias = static_cast<float*>(p_->owned.back().get_data_handle());
  for (int64_t c = 0; c < s.n; ++c) bias[c] = f.mm_bias.empty() ? 0.f : f.mm_bias[c];
  e.args[DNNL_ARG_BIAS] = p_->owned.back();
  const Val pa = as_plain(an);
  e.args[DNNL_ARG_SRC] = mem_at(plain_md(a), pa.buf, pa.off);
  Val& out = define(f.out, plain_md(yd, dt::f32));
  e.args[DNNL_ARG_DST] = mem_of(out);
  e.own = run_narrow_gemm;
  e.own_kind = "matmul";
  e.params = std::make_shared<const NarrowGemmShape>(s);
  p_->flops += 2.0 * static_cast<double>(s.m * s.n * s.k);
  exec_own(std::move(e), "keel:narrow_gemm_avx512", false, r_.nodes[i].name + " " + dims_str(a) + " -> " + dims_str(y));
  for (size_t k : f.nodes) done_[k] = true;
  return true;
}

// A product of 32 to 64 rows with large constant weights (at least 8 MiB: they come from memory at every run) and at
// most a bias, a residual sum and a GELU pass after it (ConvNeXt's last-stage MLP over 7x7 pixels), as the chain's
// own step (steps/skinny_gemm.h): oneDNN's brgemm matmul ran those at 77% of the FMA peak, 9-10% slower than the step.
// Where it was measured to lose, it is not taken: 16 rows (6 layers of 2048 x 2048: -5%), weights that stay in cache
// (24 MB of them: -3 to -15%); 49 rows over 2048 x 2048 were level (docs/ONEDNN_PERFORMANCE.md, "(skinny)"). f32 on
// AVX-512; false, changing nothing, otherwise. `a`, `y`: the product's 2-D dims; `w`: the weights with the fused
// factors folded in, as [k][n] or (w_transposed) [n][k]; place_output: matmul()'s placement of the output (the
// residual's buffer for a sum).
bool Builder::skinny_gemm(size_t i, const Fusion& f, const std::string& an, const Dims& a, const Dims& y,
                          const float* w, bool w_transposed, const std::function<Val&()>& place_output) {
  if (!options().skinny_gemm || act_ != dt::f32 || !w || f.dst_f32 || a.size() != 2 || y.size() != 2) return false;
  SkinnyGemmShape s;
  s.m = y[0], s.k = a[1], s.n = y[1], s.sum = !f.sum_with.empty();
  if (!skinny_gemm_check(s).empty() || s.m < kSkinnyMinRows ||
      s.k * s.n * static_cast<int64_t>(sizeof(float)) < kSkinnyMinWeightBytes)
    return false;
  // Post-ops: none, or the residual's sum alone (a GELU runs as its pass after the step).
  if (f.po.len() > 1 || (f.po.len() == 1 && (f.po.kind(0) != dnnl::primitive::kind::sum || !s.sum))) return false;
  Exec e;
  own_weights(
      e, skinny_gemm_packed_floats(s), [&](float* p) { skinny_gemm_pack(s, w, w_transposed, p); },
      f.mm_bias.empty() ? nullptr : &f.mm_bias);
  const Val pa = as_plain(an);
  e.args[DNNL_ARG_SRC] = mem_at(plain_md(a), pa.buf, pa.off);
  Val& out = place_output();
  e.args[DNNL_ARG_DST] = mem_at(plain_md(y), out.buf, out.off);
  e.own = run_skinny_gemm;
  e.own_kind = "matmul";
  e.single = s.n <= 64;
  e.params = std::make_shared<const SkinnyGemmShape>(s);
  p_->flops += 2.0 * static_cast<double>(s.m * s.n * s.k);
  exec_own(std::move(e), "keel:skinny_gemm_avx512", false, r_.nodes[i].name + " " + dims_str(a) + " -> " + dims_str(y));
  if (f.gelu_pass) exec_gelu(out, f.gelu_tanh);
  for (size_t k : f.nodes) done_[k] = true;
  return true;
}

}  // namespace keel::onednn::chain
