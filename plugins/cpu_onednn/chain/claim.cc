// plugins/cpu_onednn/chain/claim.cc — claimed subgraphs ("chains"): connected runs of nodes that oneDNN runs
// as one, with its own memory layouts kept between ops and fused post-ops. This file: claim_chains (the claim hook)
// and register_claimer; the rest of the chain is laid out in README.md ("Layout").
//
// The plugin registers a claim hook for "cpu" (keel_core_api_t.register_claimer, ABI 1.1). At session creation the
// hook (claim_chains) looks at the graph:
//   1. constants: initializers, Constant nodes, Shape of a statically shaped value, and every node all of whose
//      inputs are constants (shape arithmetic) are computed once, here (host->graph->evaluate), and run nothing;
//   2. candidates: f32 and bf16 nodes with static shapes of the table's ops (bf16 ones compute in bf16, with f32
//      weights converted once into bf16 layouts, f32 bias and scale/shift; a Cast between f32 and bf16 is a reorder),
//      the int8 steps (below), and u8/s8 max pooling and views.
//      Patterns of several ops that mean one op (a decomposed LayerNormalization or Gelu, attention) are the fusion
//      passes' to recognise (passes/fusion: fuse_layer_norm, fuse_gelu, fuse_attention), not repeated here: without
//      the passes their ops run one by one, in the chain;
//   3. connected groups of candidates (with the constant nodes only they read) with at least two compute nodes are
//      claimed, when convex (no path leaves the group and comes back). The plan is built right there, so whatever
//      oneDNN refuses drops the node from the group (it runs on its kernel instead) before the claim is made.
//
// A plan (built once per OpenMP thread count; steady-state runs allocate nothing but the core's workspace):
//   - activations stay in the layout their producer chose (convolutions: nChw16c; Winograd for 3x3 stride 1);
//     a consumer that wants another layout gets one reorder, shared by all its readers;
//   - weights are reordered once into the primitive's layout (BatchNormalization after a Conv folded into them);
//   - post-ops: bias, Relu/Clip/LeakyRelu/Sigmoid/Tanh/SiLU (x * Sigmoid(x)), scalar Mul/Div, and the residual Add
//     as a sum post-op (in place when the residual is not read afterwards, else after one copy); pooling takes the
//     activations after it as post-ops too;
//   - a convolution's trailing SiLU runs as the plugin's own pass (steps/silu.h), with a GlobalAveragePool of its
//     output computed in the same pass; squeeze-excite's Mul in front of a small 1x1 convolution scales that
//     convolution's weights per run instead (fold_channel_scale);
//   - Reshape/Flatten/Squeeze/Unsqueeze/Identity are views of their input's memory (after a reorder to the plain
//     layout when needed); Transpose and Slice are strided views that MatMul reads directly (a reorder otherwise);
//     a scalar Mul/Div in front of a MatMul becomes the MatMul's output scale;
//   - the workspace holds every internal value, offsets planned from liveness.
//
// Ops: the table in chain/ops/table.cc is the one list (op, domains, build function, role, 1-D lift); each op's
// limits are stated at its build function under chain/ops/. Pad (constant mode: all-zero pads are a view; spatial
// pads are folded into the padding of the Conv/MaxPool/AveragePool reading them where exact); keel.Attention
// (fuse_attention's) runs as an own step (steps/attention.h) over strided views of Q, Kt, V.
// 1-D convolutions and poolings run as 2-D ones over [N,C,1,L] (lift_1d rewrites the recipe at claim time); a
// MatMul read only by a Transpose writes the transposed layout directly.
// INT8 (chain/ops/int8.cc): keel.QConv (1-D, 2-D, 3-D) and keel.QGemm, with the standalone kernels' set-up
// (kernels/int8.h), and the per-tensor QuantizeLinear / DequantizeLinear next to them; u8/s8 values stay
// channels-last between int8 steps (the layout their convolutions use). u8/s8 max pooling and views (what fuse_qdq
// leaves where it moved a QuantizeLinear up) are candidates too: pooling on the plugin's own byte loop
// (steps/int8_pool.h), a first convolution over few channels with its pooling as one own step (steps/int8_stem.h).
#include "chain/runtime.h"
#include "chain/scan.h"

namespace keel::onednn::chain {

keel_status_t claim_chains(void* user_data, const G* g, const keel_graph_api_t* api, keel_subgraph_sink_t* sink) {
  const Instance* instance = static_cast<const Instance*>(user_data);
  InstanceScope scope(instance);
  try {
    GraphScan sc{g, api, {}, {}};
    size_t nn = api->nodes(g, nullptr, 0);
    sc.order.resize(nn);
    api->nodes(g, sc.order.data(), nn);
    for (size_t k = 0; k < nn; ++k) sc.pos[sc.order[k]] = k;

    // 1. Constants.
    std::map<std::string, ConstT> consts;
    std::set<std::string> const_vals;  // known constant (values computed below)
    std::set<keel_node_id_t> const_nodes;
    std::vector<std::string> feed_names;
    std::vector<ConstT> feeds;
    auto is_init = [&](const std::string& v) {
      const keel_tensor_t* t = nullptr;
      return !v.empty() && api->initializer(g, v.c_str(), &t) && t;
    };
    for (keel_node_id_t n : sc.order) {
      std::string op = sc.op(n);
      if (!claimable_domain(api->node_domain(g, n), op)) continue;
      auto ins = sc.ins(n), outs = sc.outs(n);
      if (outs.size() != 1 || outs[0].empty()) continue;
      bool c = false;
      if (op == "Constant") {
        c = true;
      } else if (op == "Shape") {
        int32_t t;
        Dims d;
        if (!ins.empty() && sc.info(ins[0], &t, &d) && api->node_attr_count(g, n) == 0) {
          ConstT s;
          s.dtype = KEEL_DTYPE_I64;
          s.dims = {static_cast<int64_t>(d.size())};
          s.bytes.assign(reinterpret_cast<const char*>(d.data()), reinterpret_cast<const char*>(d.data() + d.size()));
          consts[outs[0]] = s;
          feed_names.push_back(outs[0]);
          feeds.push_back(s);
          const_vals.insert(outs[0]);
          const_nodes.insert(n);
          continue;
        }
      } else if (!ins.empty() && op != "RandomNormal" && op != "RandomUniform" && op != "RandomNormalLike" &&
                 op != "RandomUniformLike" && op != "Loop" && op != "If" && op != "Scan") {
        c = true;
        for (const auto& in : ins) c = c && (in.empty() || is_init(in) || const_vals.count(in));
        int32_t t;
        Dims d;
        c = c && sc.info(outs[0], &t, &d) && numel(d) <= 4096;  // shape arithmetic, not weight transforms
      }
      if (c) {
        const_vals.insert(outs[0]);
        const_nodes.insert(n);
      }
    }
    {
      std::vector<std::string> want;
      for (const auto& v : const_vals)
        if (!consts.count(v)) want.push_back(v);
      if (!want.empty()) {
        std::vector<keel_tensor_t> views(feeds.size());
        std::vector<const keel_tensor_t*> ptrs;
        std::vector<const char*> fnames, wnames;
        for (size_t k = 0; k < feeds.size(); ++k) {
          keel_tensor_t& t = views[k];
          std::memset(&t, 0, sizeof t);
          t.struct_size = sizeof t;
          t.dtype = feeds[k].dtype;
          t.ndim = static_cast<int32_t>(feeds[k].dims.size());
          t.dims = feeds[k].dims.data();
          t.data = feeds[k].bytes.data();
          t.byte_size = feeds[k].bytes.size();
          ptrs.push_back(&t);
          fnames.push_back(feed_names[k].c_str());
        }
        for (const auto& w : want) wnames.push_back(w.c_str());
        std::vector<keel_tensor_t*> outs(want.size(), nullptr);
        keel_status_t st =
            api->evaluate(g, fnames.data(), ptrs.data(), ptrs.size(), wnames.data(), wnames.size(), outs.data());
        if (st) {
          // Could not fold: treat none of them as constants.
          keel_status_release(st);
          for (const auto& w : want) const_vals.erase(w);
          for (auto it = const_nodes.begin(); it != const_nodes.end();) {
            auto o = sc.outs(*it);
            it = const_vals.count(o[0]) ? std::next(it) : const_nodes.erase(it);
          }
        } else {
          for (size_t k = 0; k < want.size(); ++k) {
            if (outs[k]) consts[want[k]] = const_of(outs[k]);
            api->release_tensor(outs[k]);
          }
        }
      }
    }

    // 2. Candidates: f32 data, static shapes.
    std::set<keel_node_id_t> cand;
    std::set<std::string> channels_last;  // int8 values the graph holds channels-last
    for (keel_node_id_t n : sc.order) {
      if (const_nodes.count(n)) continue;
      if (int8_op(api->node_domain(g, n), sc.op(n))) {  // int8 steps (Builder::qconv / qgemm)
        if (int8_candidate(sc, n, [&](const std::string& v) { return is_init(v) || consts.count(v) > 0; }))
          cand.insert(n);
        if (channels_last.empty()) channels_last = channels_last_values(sc);
        continue;
      }
      if (!claimable_domain(api->node_domain(g, n), sc.op(n))) continue;
      std::string op = sc.op(n);
      if (!compute_ops().count(op)) continue;
      if (op == "Pad") {  // constant mode, constant pads (and value): a view, or folded into its readers (pad)
        auto ins = sc.ins(n);
        auto constant = [&](const std::string& v) {
          const keel_tensor_t* t = nullptr;
          return consts.count(v) > 0 || (api->initializer(g, v.c_str(), &t) && t);
        };
        const ConstT* pads = nullptr;
        ConstT init;
        const keel_tensor_t* t = nullptr;
        if (ins.size() >= 2 && consts.count(ins[1])) pads = &consts[ins[1]];
        else if (ins.size() >= 2 && api->initializer(g, ins[1].c_str(), &t) && t) init = const_of(t), pads = &init;
        bool ok = pads && (pads->dtype == KEEL_DTYPE_I64 || pads->dtype == KEEL_DTYPE_I32) &&
                  api->node_attr_count(g, n) <= 1 && ins.size() <= 3 &&
                  (ins.size() < 3 || ins[2].empty() || constant(ins[2]));
        for (int64_t k = 0; ok && k < pads->count(); ++k) ok = pads->iat(k) >= 0;
        const char* mode = nullptr;
        if (ok && api->node_attr_string(g, n, "mode", &mode) && mode && std::strcmp(mode, "constant") != 0) ok = false;
        if (!ok) continue;
      }
      bool ok = true;
      auto outs = sc.outs(n);
      // u8 / s8 data: max pooling and views (fuse_qdq moves a QuantizeLinear in front of them), next to int8 steps.
      const bool bytes_ok = op == "MaxPool" || op == "GlobalMaxPool" || is_view_op(op);
      auto data_type = [&](int32_t t) {
        return t == KEEL_DTYPE_F32 || t == KEEL_DTYPE_BF16 || (bytes_ok && (t == KEEL_DTYPE_U8 || t == KEEL_DTYPE_I8));
      };
      int32_t out_t = KEEL_DTYPE_UNDEFINED;
      for (size_t k = 0; k < outs.size() && ok; ++k) {
        if (outs[k].empty()) continue;
        int32_t t;
        Dims d;
        // Slice outputs may have unknown shapes (dynamic starts folded here): computed by the builder.
        if (!sc.info(outs[k], &t, &d))
          ok = k == 0 && (op == "Slice" || op == "Reshape") && sc.dtype(outs[k], &t) &&
               (t == KEEL_DTYPE_F32 || t == KEEL_DTYPE_BF16);
        else ok = data_type(t) && numel(d) > 0;
        if (k == 0) out_t = t;
      }
      auto ins = sc.ins(n);
      if (ok && !ins.empty() && !ins[0].empty() && !const_vals.count(ins[0]) && !is_init(ins[0])) {
        int32_t t = 0;
        Dims d;
        if (!sc.dtype(ins[0], &t) || !data_type(t)) ok = false;
        // A 1-byte node keeps its type (the builder computes in the output's type).
        if ((t == KEEL_DTYPE_U8 || t == KEEL_DTYPE_I8 || out_t == KEEL_DTYPE_U8 || out_t == KEEL_DTYPE_I8) &&
            t != out_t)
          ok = false;
      }
      if (ok) cand.insert(n);
    }

    // 3. Groups: union of candidates through values; constant nodes join when only the group reads them.
    std::map<keel_node_id_t, keel_node_id_t> parent;
    std::function<keel_node_id_t(keel_node_id_t)> find = [&](keel_node_id_t x) {
      while (parent[x] != x) x = parent[x] = parent[parent[x]];
      return x;
    };
    for (auto n : cand) parent[n] = n;
    for (auto n : cand)
      for (const auto& in : sc.ins(n)) {
        keel_node_id_t p;
        if (sc.producer(in, &p) && cand.count(p)) parent[find(n)] = find(p);
      }
    std::set<keel_node_id_t> excluded;
    for (int round = 0; round < 8; ++round) {
      std::map<keel_node_id_t, std::vector<keel_node_id_t>> groups;
      for (auto n : sc.order)
        if (cand.count(n) && !excluded.count(n)) groups[find(n)].push_back(n);
      bool retry = false;
      std::vector<std::pair<std::vector<keel_node_id_t>, std::unique_ptr<Chain>>> ready;
      for (auto& [root, members] : groups) {
        int work = 0;
        for (auto n : members) work += !is_view_op(sc.op(n));
        if (work < 2) continue;
        std::set<keel_node_id_t> mset(members.begin(), members.end());
        // Constant nodes read only by the group (transitively) join it.
        for (size_t k = sc.order.size(); k-- > 0;) {
          keel_node_id_t n = sc.order[k];
          if (!const_nodes.count(n)) continue;
          auto outs = sc.outs(n);
          bool all = !sc.api->value_is_graph_output(g, outs[0].c_str());
          auto cons = sc.consumers(outs[0]);
          all = all && !cons.empty();
          for (auto u : cons) all = all && mset.count(u);
          if (all) mset.insert(n);
        }
        // Convexity: nothing outside reachable from the group may lead back into it.
        std::set<keel_node_id_t> reach;
        std::vector<keel_node_id_t> stack;
        for (auto n : mset)
          for (const auto& o : sc.outs(n))
            for (auto u : sc.consumers(o))
              if (!mset.count(u) && reach.insert(u).second) stack.push_back(u);
        bool convex = true;
        while (!stack.empty() && convex) {
          auto x = stack.back();
          stack.pop_back();
          for (const auto& o : sc.outs(x))
            for (auto u : sc.consumers(o)) {
              if (mset.count(u)) convex = false;
              else if (reach.insert(u).second) stack.push_back(u);
            }
        }
        if (!convex) {
          // Drop the members an outside path comes back to (and retry the rest).
          for (auto x : reach)
            for (const auto& o : sc.outs(x))
              for (auto u : sc.consumers(o))
                if (cand.count(u) && mset.count(u)) excluded.insert(u);
          retry = true;
          continue;
        }
        auto chain = std::make_unique<Chain>();
        chain->instance = instance;
        Recipe& r = chain->recipe;
        std::vector<keel_node_id_t> ordered(mset.begin(), mset.end());
        std::sort(ordered.begin(), ordered.end(), [&](auto a, auto b) { return sc.pos[a] < sc.pos[b]; });
        std::set<std::string> produced;
        for (auto n : ordered)
          for (const auto& o : sc.outs(n)) produced.insert(o);
        std::map<std::string, int> counts;
        for (auto n : ordered) {
          NodeDesc d = sc.desc(n);
          if (!const_nodes.count(n)) counts[d.op]++;
          for (const auto& v : d.in) {
            if (v.empty()) continue;
            if (!produced.count(v) && std::find(r.inputs.begin(), r.inputs.end(), v) == r.inputs.end())
              r.inputs.push_back(v);
          }
          for (const auto& v : d.out) {
            if (v.empty()) continue;
            bool outside = sc.api->value_is_graph_output(g, v.c_str()) != 0;
            for (auto u : sc.consumers(v)) outside = outside || !mset.count(u);
            if (outside) r.outputs.push_back(v);
          }
          for (const auto& v : d.in) {
            if (v.empty()) continue;
            int32_t t;
            Dims dd;
            const keel_tensor_t* it = nullptr;
            if (api->initializer(g, v.c_str(), &it) && it) {
              if (!r.consts.count(v)) r.consts[v] = const_of(it);
            } else if (consts.count(v)) {
              r.consts[v] = consts[v];
            } else if (sc.info(v, &t, &dd)) {
              r.dims[v] = dd;
              r.dtypes[v] = t;
            } else if (sc.dtype(v, &t)) {
              r.dtypes[v] = t;
            }
          }
          for (const auto& v : d.out) {
            int32_t t;
            Dims dd;
            if (consts.count(v)) r.consts[v] = consts[v];
            else if (!v.empty() && sc.info(v, &t, &dd)) r.dims[v] = dd, r.dtypes[v] = t;
          }
          r.nodes.push_back(std::move(d));
        }
        std::ostringstream nm;
        nm << "onednn_chain(";
        bool first = true;
        for (auto& [op, cnt] : counts) {
          nm << (first ? "" : ",") << op << "x" << cnt;
          first = false;
        }
        nm << ")";
        r.name = nm.str();
        r.channels_last = channels_last;
        lift_1d(r);
        try {
          chain->plan = Builder(r, /*time_convs=*/false).build();
        } catch (const NodeReject& e) {
          if (e.node < r.nodes.size()) {
            std::string msg =
                "claim: node '" + r.nodes[e.node].name + "' (" + r.nodes[e.node].op + ") stays on its kernel: " + e.why;
            debug_log(msg);
            excluded.insert(r.nodes[e.node].id);
            retry = true;
          }
          continue;
        }
        ready.emplace_back(ordered, std::move(chain));
      }
      if (retry && round + 1 < 8) {
        // Rebuild the groups without the excluded nodes.
        parent.clear();
        for (auto n : cand)
          if (!excluded.count(n)) parent[n] = n;
        for (auto n : cand) {
          if (excluded.count(n)) continue;
          for (const auto& in : sc.ins(n)) {
            keel_node_id_t p;
            if (sc.producer(in, &p) && cand.count(p) && !excluded.count(p)) parent[find(n)] = find(p);
          }
        }
        continue;
      }
      for (auto& [ids, chain] : ready) {
        keel_subgraph_def_t def;
        std::memset(&def, 0, sizeof def);
        def.struct_size = sizeof def;
        def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
        def.abi_minor = KEEL_PLUGIN_ABI_MINOR;
        std::string name = chain->recipe.name;
        def.name = name.c_str();
        def.node_ids = ids.data();
        def.node_count = ids.size();
        def.user_data = chain.release();
        def.compute = chain_compute;
        def.release = chain_release;
        def.release_user_data = chain_release;
        def.flags = KEEL_KERNEL_FLAG_REENTRANT;  // runs bind their own memory objects (chain/runtime.h)
        keel_status_t st = sink->claim(sink, &def);
        if (st) {
          std::string msg = std::string("claim refused: ") + (st->message ? st->message : "");
          debug_log(msg);
          keel_status_release(st);
        }
      }
      break;
    }
    return nullptr;
  } catch (const std::exception& e) {
    return status_of(KEEL_STATUS_UNIMPLEMENTED, std::string("claim_chains: ") + e.what());
  } catch (const Reject& r) {
    return status_of(KEEL_STATUS_UNIMPLEMENTED, "claim_chains: " + r.why);
  }
}

}  // namespace keel::onednn::chain

namespace keel::onednn {

keel_status_t register_claimer(Instance& instance) {
  const keel_core_api_t* host = instance.host;
  if (!KEEL_HAS_MEMBER(host, keel_core_api_t, register_claimer) || !host->register_claimer) return nullptr;
  if (!instance.options.claims) return nullptr;
  keel_claimer_def_t def;
  std::memset(&def, 0, sizeof def);
  def.struct_size = sizeof def;
  def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  def.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  def.name = "onednn_chains";
  def.device_type = "cpu";
  def.user_data = &instance;
  def.claim_subgraphs = chain::claim_chains;
  return host->register_claimer(instance.handle, &def);
}

}  // namespace keel::onednn
