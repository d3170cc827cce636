// plugins/cpu_onednn/chain/builder.cc — the Builder's core: build() walks the recipe and dispatches each node through
// the op table; concatenation planning, the boundary outputs and the workspace plan.
#include "chain/builder.h"

#include "common/bf16_speed.h"

namespace keel::onednn::chain {

// Labels the execs node `node` added (from `first_exec`) for the session profile: its op type and name, with the
// nodes it fused (those marked done while it was built); layout reorders get no op type.
void Builder::label_steps(size_t node, size_t first_exec, const std::vector<bool>& done_before) {
  std::vector<const char*> covered{r_.nodes[node].name.c_str()};
  for (size_t k = 0; k < done_.size(); ++k)
    if (k != node && done_[k] && !done_before[k]) covered.push_back(r_.nodes[k].name.c_str());
  for (size_t e = first_exec; e < p_->execs.size(); ++e) {
    const bool layout = exec_layout_[e];
    p_->step_op[e] = layout ? "" : r_.nodes[node].op.c_str();
    p_->step_nodes[e] = layout ? std::vector<const char*>{covered[0]} : covered;
  }
}

std::unique_ptr<Plan> Builder::build() {
  p_ = std::make_unique<Plan>();
  p_->threads = omp_get_max_threads();
  done_.assign(r_.nodes.size(), false);
  for (size_t i = 0; i < r_.nodes.size(); ++i)
    for (const auto& in : r_.nodes[i].in)
      if (!in.empty()) {
        auto& u = users_[in];
        if (std::find(u.begin(), u.end(), i) == u.end()) u.push_back(i);
      }
  outputs_.insert(r_.outputs.begin(), r_.outputs.end());
  plan_concats();
  for (size_t k = 0; k < r_.inputs.size(); ++k) {
    const std::string& name = r_.inputs[k];
    if (is_const(name)) continue;
    auto d = r_.dims.find(name);
    auto t = r_.dtypes.find(name);
    if (d == r_.dims.end() || t == r_.dtypes.end() ||
        (t->second != KEEL_DTYPE_F32 && t->second != KEEL_DTYPE_BF16 && t->second != KEEL_DTYPE_U8 &&
         t->second != KEEL_DTYPE_I8))
      continue;  // not read as data
    Buf b;
    b.kind = BufKind::kInput;
    b.index = static_cast<int>(k);
    p_->bufs.push_back(b);
    Val v;
    v.md = boundary_md(name, d->second,
                       t->second == KEEL_DTYPE_BF16 ? dt::bf16
                       : t->second == KEEL_DTYPE_U8 ? dt::u8
                       : t->second == KEEL_DTYPE_I8 ? dt::s8
                                                    : dt::f32);
    v.buf = static_cast<int>(p_->bufs.size()) - 1;
    p_->bufs[v.buf].values = 2;  // never written in place
    vals_[name] = v;
  }
  for (size_t i = 0; i < r_.nodes.size(); ++i) {
    if (done_[i]) continue;
    const NodeDesc& n = r_.nodes[i];
    bool folded = true;
    for (const auto& o : n.out) folded = folded && (o.empty() || is_const(o));
    if (folded) {
      done_[i] = true;
      continue;
    }
    cur_node_ = i;
    {
      auto t = n.out.empty() ? r_.dtypes.end() : r_.dtypes.find(n.out[0]);
      const int32_t ot = t != r_.dtypes.end() ? t->second : KEEL_DTYPE_F32;
      const ChainOp* op = find_chain_op(n.op);
      const bool int8_step = op != nullptr && op->role == ChainRole::kInt8;
      // bf16 nodes compute in bf16; u8 / s8 max pooling and views (the claim admits no other 1-byte node outside
      // the int8 steps, which choose their types themselves) in their bytes.
      act_ = ot == KEEL_DTYPE_BF16               ? dt::bf16
             : !int8_step && ot == KEEL_DTYPE_U8 ? dt::u8
             : !int8_step && ot == KEEL_DTYPE_I8 ? dt::s8
                                                 : dt::f32;
      if (act_ == dt::bf16) warn_if_bf16_slow();  // once per process (common/bf16_speed.h)
    }
    const size_t first_exec = p_->execs.size();
    const std::vector<bool> done_before = done_;
    try {
      const ChainOp* op = find_chain_op(n.op);  // the claim admits no ai.onnx QConv / QGemm
      if (op == nullptr) throw Reject{"op " + n.op};
      (this->*op->build)(i);
    } catch (const Reject& e) {
      throw NodeReject{i, e.why};
    } catch (const dnnl::error& e) {
      throw NodeReject{i, std::string("oneDNN: ") + e.what()};
    }
    done_[i] = true;
    p_->step_op.resize(p_->execs.size(), "");
    p_->step_nodes.resize(p_->execs.size());
    label_steps(i, first_exec, done_before);
  }
  cur_node_ = npos;
  act_ = dt::f32;
  outputs();
  p_->step_op.resize(p_->execs.size(), "");  // the boundary outputs' reorders: the chain's own
  p_->step_nodes.resize(p_->execs.size());
  bind_scratchpads();
  plan_workspace();
  p_->last_base.assign(p_->bufs.size(), reinterpret_cast<void*>(-1));
  return std::move(p_);
}

// The activation type a channel concatenation can be planned in (its output's and every input's: f32 or bf16), or
// dt::undef.
dt Builder::concat_type(const NodeDesc& n) const {
  auto t = r_.dtypes.find(n.out[0]);
  if (t == r_.dtypes.end() || (t->second != KEEL_DTYPE_F32 && t->second != KEEL_DTYPE_BF16)) return dt::undef;
  for (const auto& in : n.in)
    if (auto ti = r_.dtypes.find(in); ti == r_.dtypes.end() || ti->second != t->second) return dt::undef;
  return t->second == KEEL_DTYPE_BF16 ? dt::bf16 : dt::f32;
}

// Channel concatenations of batch 1 whose inputs are 16-aligned, computed here and read by the Concat only (f32, or
// bf16 in a bf16 chain): reserve the output buffer; each input written as nChw16c lands in its slice of it (see
// define).
void Builder::plan_concats() {
  plan_concat_prefixes();
  for (const NodeDesc& n : r_.nodes) {
    if (n.op != "Concat" || n.out.size() != 1 || concat_bufs_.count(n.out[0])) continue;
    const dt type = concat_type(n);
    if (type == dt::undef) continue;
    auto yd = r_.dims.find(n.out[0]);
    if (yd == r_.dims.end() || yd->second.size() != 4 || yd->second[0] != 1) continue;
    int64_t axis = n.ai("axis", 0);
    if (axis < 0) axis += 4;
    if (axis != 1) continue;
    bool ok = true;
    for (const auto& in : n.in) {
      auto d = r_.dims.find(in);
      ok = ok && !in.empty() && d != r_.dims.end() && d->second.size() == 4 && d->second[1] % 16 == 0 && !escapes(in) &&
           users(in).size() == 1 && !is_const(in) && !concat_parts_.count(in) &&
           std::find(r_.inputs.begin(), r_.inputs.end(), in) == r_.inputs.end();
      int reads = 0;
      for (const auto& x : n.in) reads += x == in;
      ok = ok && reads == 1;
    }
    if (!ok) continue;
    md_t full(to_dnnl(yd->second), type, tag::nChw16c);
    int b = new_buf(full.get_size());
    concat_buf_types_[b] = type;
    uint64_t off = 0;
    for (const auto& in : n.in) {
      concat_parts_[in] = {b, off};
      off += static_cast<uint64_t>(numel(r_.dims.at(in))) * dnnl::memory::data_type_size(type);
    }
    concat_bufs_[n.out[0]] = b;
  }
}

// DenseNet's blocks: Concat(x0, f1), Concat(x0, f1, f2), ..., each concatenation's inputs a prefix of the last
// one's (batch 1, 4-D f32, channel axis, 16-aligned channel counts). One buffer holds the last concatenation; each
// feature is written once into its slice (see define) and every concatenation is a view of the buffer's first
// channels (the first C channels of an nChw16c [1,C',H,W] are the bytes of an nChw16c [1,C,H,W]): no Concat copies
// anything, where each would copy all the features before it. Other readers of a feature read it in its slice; the
// buffer holds many values, so nothing writes into it in place.
void Builder::plan_concat_prefixes() {
  auto eligible = [&](const NodeDesc& n) {
    if (n.op != "Concat" || n.out.size() != 1 || n.in.empty() || concat_type(n) == dt::undef) return false;
    auto yd = r_.dims.find(n.out[0]);
    if (yd == r_.dims.end() || yd->second.size() != 4 || yd->second[0] != 1) return false;
    int64_t axis = n.ai("axis", 0);
    if (axis < 0) axis += 4;
    if (axis != 1) return false;
    std::set<std::string> seen;
    for (const auto& in : n.in) {
      auto d = r_.dims.find(in);
      if (in.empty() || d == r_.dims.end() || d->second.size() != 4 || d->second[1] % 16 != 0 || escapes(in) ||
          is_const(in) || !seen.insert(in).second ||
          std::find(r_.inputs.begin(), r_.inputs.end(), in) != r_.inputs.end())
        return false;
    }
    return true;
  };
  std::map<std::string, std::vector<size_t>> families;  // first input -> the eligible Concats starting with it
  for (size_t i = 0; i < r_.nodes.size(); ++i)
    if (eligible(r_.nodes[i])) families[r_.nodes[i].in[0]].push_back(i);
  for (const auto& [first, members] : families) {
    if (members.size() < 2) continue;
    size_t last = members[0];
    for (size_t m : members)
      if (r_.nodes[m].in.size() > r_.nodes[last].in.size()) last = m;
    const std::vector<std::string>& all = r_.nodes[last].in;
    bool ok = true;
    for (size_t m : members) {
      const auto& in = r_.nodes[m].in;
      ok = ok && std::equal(in.begin(), in.end(), all.begin());
    }
    for (const auto& in : all) ok = ok && !concat_parts_.count(in);
    const dt type = concat_type(r_.nodes[last]);
    for (size_t m : members) ok = ok && concat_type(r_.nodes[m]) == type;
    if (!ok) continue;
    md_t full(to_dnnl(r_.dims.at(r_.nodes[last].out[0])), type, tag::nChw16c);
    int b = new_buf(full.get_size());
    concat_buf_types_[b] = type;
    uint64_t off = 0;
    for (const auto& in : all) {
      concat_parts_[in] = {b, off};
      off += static_cast<uint64_t>(numel(r_.dims.at(in))) * dnnl::memory::data_type_size(type);
    }
    for (size_t m : members) concat_bufs_[r_.nodes[m].out[0]] = b;
  }
}

// Boundary outputs: the value's memory in plain layout, written into the output tensor.
void Builder::outputs() {
  p_->out_dims.resize(r_.outputs.size());
  p_->out_consts.assign(r_.outputs.size(), nullptr);
  for (size_t k = 0; k < r_.outputs.size(); ++k) {
    const std::string& name = r_.outputs[k];
    if (const ConstT* c = cst(name)) {
      p_->out_consts[k] = c;
      p_->out_dims[k] = c->dims;
      continue;
    }
    auto it = vals_.find(name);
    if (it == vals_.end()) throw NodeReject{r_.nodes.size(), "output '" + name + "' not produced"};
    Val v = it->second;
    Dims d = md_dims(v.md);
    p_->out_dims[k] = d;
    Buf b;
    b.kind = BufKind::kOutput;
    b.index = static_cast<int>(k);
    p_->bufs.push_back(b);
    int ob = static_cast<int>(p_->bufs.size()) - 1;
    // Retarget the producer's writes when the value is already plain (or channels-last, where the graph holds it so)
    // and lives alone in a workspace buffer.
    const md_t want = boundary_md(name, d, v.md.data_type());
    if (v.scale == 1.f && (r_.channels_last.count(name) ? v.md == want : is_plain_dense(v.md)) && v.buf >= 0 &&
        p_->bufs[v.buf].kind == BufKind::kWorkspace && p_->bufs[v.buf].values == 1 && v.off == 0) {
      for (auto& bd : p_->binds)
        if (bd.buf == v.buf) bd.buf = ob;
      p_->bufs[ob].first = p_->bufs[v.buf].first;
      p_->bufs[ob].last = p_->bufs[v.buf].last;
      p_->bufs[v.buf].first = 1 << 30;
      p_->bufs[v.buf].last = -1;
      // Other values sharing this buffer (none: values == 1) would follow.
      continue;
    }
    if (v.scale != 1.f) throw NodeReject{r_.nodes.size(), "a scaled view leaves the claim"};
    dnnl::memory s = mem_of(v), d2 = mem_at(want, ob, 0);
    exec(reorder_prim(s, d2), {{DNNL_ARG_FROM, s}, {DNNL_ARG_TO, d2}});
  }
}

// The primitives' scratchpads (user mode, common/scratchpad.h) in the run's workspace: one region as large as the
// largest step's, live for the whole run (the steps run one after another; a step's OpenMP team shares it), bound
// like any workspace buffer. Own steps that asked for scratch (Exec::run_scratch, per thread) get a region of their
// own, as DNNL_ARG_SCRATCHPAD: one part per thread at the same stride for every own step (the largest part, rounded
// to 4 KiB, plus a gap: Exec::scratch_stride), so that thread t's part of every own step lies in the same memory,
// last written by that thread and no other (with each step's parts at its own stride, thread 1's part of one step
// overlapped thread 0's of the next, and the primitives' scratchpads overlapped both: MobileNetV2's steps, whose 17
// expand_dw steps need 17 sizes, 2.10-2.17 -> 1.96-2.00 ms at 2 threads without the gap below).
// Being no value's memory, it is not shared with values either (the own Winograd step's scratch in a buffer that
// values share cost SqueezeNet's expands 10-25% at 2 threads: "(w4)"). A run then needs no memory of the calling
// thread's: the thread-local scratchpad that a standalone kernel uses grows on every thread that ever runs it, and a
// host's pool of threads faulted in one each (ResNet-18: ~630 page faults and 2.5 MiB on each HTTP thread's first run
// in `keel serve`).
void Builder::bind_scratchpads() {
  uint64_t most = 0, stride = 0;
  std::vector<std::pair<size_t, md_t>> need;
  std::vector<size_t> own;
  for (size_t k = 0; k < p_->execs.size(); ++k) {
    const Exec& e = p_->execs[k];
    if (e.own && e.run_scratch > 0) {
      own.push_back(k);
      stride = std::max(stride, e.run_scratch);
      continue;
    }
    if (e.own || !e.prim) continue;
    const_dnnl_primitive_desc_t pd = e.prim.get_primitive_desc();
    // A primitive in the library's scratchpad mode would keep its scratchpad to itself (oneDNN 2.6 is built without
    // DNNL_ENABLE_CONCURRENT_EXEC), and concurrent runs of one session execute each step's primitive at once: a
    // bf16 BatchNormalization so created mixed the outputs of two runs (random chains, seed 484 --bf16 as of
    // 15b6722). Every chain primitive is made with user_scratchpad(); one that is not, and needs a scratchpad, is
    // refused here rather than shared.
    const_dnnl_primitive_attr_t attr = nullptr;
    dnnl_scratchpad_mode_t mode = dnnl_scratchpad_mode_user;
    if (dnnl_primitive_desc_get_attr(pd, &attr) == dnnl_success) dnnl_primitive_attr_get_scratchpad_mode(attr, &mode);
    if (mode == dnnl_scratchpad_mode_library) {
      int64_t library_bytes = 0;
      dnnl_primitive_desc_query(pd, dnnl_query_memory_consumption_s64, 0, &library_bytes);
      if (library_bytes > 0)
        throw Reject{"a step's primitive (" + p_->impls[k] +
                     ") has a scratchpad of its own, shared by concurrent runs"};
      continue;
    }
    const dnnl_memory_desc_t* md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    const uint64_t bytes = md ? dnnl_memory_desc_get_size(md) : 0;
    if (bytes == 0) continue;
    need.emplace_back(k, md_t(*md));
    most = std::max(most, bytes);
  }
  auto region = [&](uint64_t bytes) {
    const int buf = new_buf(bytes);
    p_->bufs[buf].first = 0;
    p_->bufs[buf].last = static_cast<int>(p_->execs.size()) - 1;
    p_->bufs[buf].values = 1;
    return buf;
  };
  if (!need.empty()) {
    const int buf = region(most);
    for (const auto& [k, md] : need) {
      dnnl::memory m(md, engine(), DNNL_MEMORY_NONE);
      p_->binds.push_back({m, buf, 0});
      p_->execs[k].args[DNNL_ARG_SCRATCHPAD] = m;
      p_->execs[k].scratchpad_bound = true;
    }
  }
  if (own.empty()) return;
  // 256 KiB between one thread's part and the next: measured, not understood. ConvNeXt's depthwise + LayerNorm steps
  // (steps/dw_ln.h) at 2 threads took 2.2-2.6 ms with the parts adjacent and 1.7-2.0 with this gap (1 MiB: no
  // better); MobileNetV2's steps 1.96-2.00 -> 1.84-1.95 ms; the Winograd steps did not move. "(dwln)" in
  // docs/ONEDNN_PERFORMANCE.md.
  constexpr uint64_t kGap = uint64_t{256} << 10;
  stride = (stride + 4095) / 4096 * 4096 + kGap;
  const uint64_t bytes = stride * static_cast<uint64_t>(std::max(1, p_->threads));
  const int buf = region(bytes);
  const md_t md({static_cast<int64_t>(bytes / sizeof(float))}, dt::f32, tag::a);
  for (size_t k : own) {
    dnnl::memory m(md, engine(), DNNL_MEMORY_NONE);
    p_->binds.push_back({m, buf, 0});
    p_->execs[k].args[DNNL_ARG_SCRATCHPAD] = m;
    p_->execs[k].scratchpad_bound = true;
    p_->execs[k].scratch_stride = stride;
  }
}

// Greedy offsets: biggest buffer first, lowest offset that overlaps no buffer live at the same time.
void Builder::plan_workspace() {
  std::vector<int> order;
  for (size_t b = 0; b < p_->bufs.size(); ++b)
    if (p_->bufs[b].kind == BufKind::kWorkspace && p_->bufs[b].last >= 0) order.push_back(static_cast<int>(b));
  std::sort(order.begin(), order.end(), [&](int a, int b) { return p_->bufs[a].bytes > p_->bufs[b].bytes; });
  std::vector<int> placed;
  uint64_t total = 0;
  for (int b : order) {
    Buf& x = p_->bufs[b];
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    for (int o : placed) {
      const Buf& y = p_->bufs[o];
      if (y.first <= x.last && x.first <= y.last) busy.emplace_back(y.offset, y.offset + y.bytes);
    }
    std::sort(busy.begin(), busy.end());
    uint64_t off = 0;
    for (auto& [s, e] : busy) {
      if (off + x.bytes <= s) break;
      off = std::max(off, e);
    }
    x.offset = off;
    total = std::max(total, off + x.bytes);
    placed.push_back(b);
  }
  p_->ws_bytes = total;
}

}  // namespace keel::onednn::chain
