// plugins/cpu_onednn/chain/runtime.cc — a claimed chain at run time: the Chain (recipe, plan, profile), running
// its plan (rebuilt when the thread count changes) and the kernel entry points the core calls.
#include "chain/runtime.h"

namespace keel::onednn::chain {

const char* kind_name(dnnl::primitive::kind k) {
  switch (k) {
    case dnnl::primitive::kind::reorder: return "reorder";
    case dnnl::primitive::kind::concat: return "concat";
    case dnnl::primitive::kind::convolution: return "convolution";
    case dnnl::primitive::kind::eltwise: return "eltwise";
    case dnnl::primitive::kind::softmax:
    case dnnl::primitive::kind::softmax_v2: return "softmax";
    case dnnl::primitive::kind::pooling:
    case dnnl::primitive::kind::pooling_v2: return "pooling";
    case dnnl::primitive::kind::batch_normalization: return "batch_normalization";
    case dnnl::primitive::kind::layer_normalization: return "layer_normalization";
    case dnnl::primitive::kind::matmul: return "matmul";
    case dnnl::primitive::kind::binary: return "binary";
    case dnnl::primitive::kind::resampling: return "resampling";
    default: return "other";
  }
}

// A chain this small runs on one thread: a team of two waits for its second thread longer than the work takes
// whenever the machine is busy (measured: 0.05 ms runs turning into 30 ms ones on a loaded 2-core machine).
constexpr double kOneThreadFlops = 8e6;

namespace {

// A run binding of `p` for one run: a free one, else a copy of the plan's binds and steps (new memory objects).
std::unique_ptr<RunBinding> take_binding(Plan& p) {
  {
    std::lock_guard<std::mutex> lock(p.bindings_mu);
    if (!p.free_bindings.empty()) {
      auto rb = std::move(p.free_bindings.back());
      p.free_bindings.pop_back();
      return rb;
    }
  }
  auto rb = std::make_unique<RunBinding>();
  std::unordered_map<dnnl_memory_t, dnnl::memory> remap;
  rb->binds.reserve(p.binds.size());
  for (const Bind& b : p.binds) {
    dnnl::memory m(b.mem.get_desc(), engine(), DNNL_MEMORY_NONE);
    remap.emplace(b.mem.get(), m);
    rb->binds.push_back({m, b.buf, b.offset});
  }
  rb->execs = p.execs;
  for (Exec& e : rb->execs)
    for (auto& [arg, mem] : e.args)
      if (auto it = remap.find(mem.get(true)); it != remap.end()) mem = it->second;
  rb->last_base.assign(p.bufs.size(), reinterpret_cast<void*>(-1));
  return rb;
}

}  // namespace

void run_chain(Chain& ch, Ctx& c) {
  const int team = omp_get_max_threads();
  struct Restore {
    bool on = false;
    int n;
    ~Restore() {
      if (on) omp_set_num_threads(n);
    }
  } restore{false, team};
  std::shared_ptr<Plan> plan;
  {
    std::lock_guard<std::mutex> lock(ch.mu);
    if (ch.plan && !ch.plans.count(ch.plan->threads)) ch.plans[ch.plan->threads] = ch.plan;
    const bool one = ch.plan && ch.plan->flops < kOneThreadFlops && team > 1;
    if (one) {
      omp_set_num_threads(1);  // this thread's OpenMP setting only
      restore.on = true;
    }
    const int threads = omp_get_max_threads();
    // The claim's plan took its convolutions untimed (the session's team was not known then): on the team it was
    // built for, time them now and rebuild only when one of them picks another implementation; on another team,
    // rebuild. (A 1-thread session used to time every such convolution twice, once for the claim's default team.)
    auto it = ch.plans.find(threads);
    if (it != ch.plans.end() && !it->second->deferred.empty()) {
      bool same = true;
      for (const DeferredPick& d : it->second->deferred)
        same = (d.own ? d.own() : fastest_conv_remembered(d.cands, engine(), stream(), d.margins)) == 0 && same;
      if (same) {
        it->second->deferred.clear();
      } else {
        ch.plans.erase(it);
        it = ch.plans.end();
      }
    }
    if (it == ch.plans.end()) it = ch.plans.emplace(threads, std::shared_ptr<Plan>(Builder(ch.recipe).build())).first;
    ch.plan = it->second;
    plan = it->second;
  }
  Plan& p = *plan;
  std::unique_ptr<RunBinding> rb = take_binding(p);
  struct GiveBack {
    Plan& p;
    std::unique_ptr<RunBinding>& rb;
    ~GiveBack() {
      std::lock_guard<std::mutex> lock(p.bindings_mu);
      p.free_bindings.push_back(std::move(rb));
    }
  } give_back{p, rb};
  std::vector<void*> base(p.bufs.size(), nullptr);
  void* ws = p.ws_bytes ? c.workspace(p.ws_bytes) : nullptr;
  for (size_t b = 0; b < p.bufs.size(); ++b) {
    const Buf& x = p.bufs[b];
    switch (x.kind) {
      case BufKind::kWorkspace: base[b] = static_cast<char*>(ws) + x.offset; break;
      case BufKind::kInput: {
        const keel_tensor_t* t = c.input(x.index);
        if (!t || !t->data) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "claimed subgraph: input missing"};
        base[b] = t->data;
        break;
      }
      case BufKind::kOutput: base[b] = c.output(x.index, p.out_dims[x.index])->data; break;
      case BufKind::kOwned: base[b] = nullptr; break;
    }
  }
  for (size_t k = 0; k < p.out_consts.size(); ++k)
    if (const ConstT* cst = p.out_consts[k]) {
      keel_tensor_t* t = c.output(static_cast<int>(k), cst->dims);
      std::memcpy(t->data, cst->bytes.data(), std::min<uint64_t>(t->byte_size, cst->bytes.size()));
    }
  bool changed = false;
  for (size_t b = 0; b < base.size(); ++b) changed = changed || base[b] != rb->last_base[b];
  if (changed) {
    for (auto& bd : rb->binds)
      if (bd.buf >= 0 && p.bufs[bd.buf].kind != BufKind::kOwned)
        bd.mem.set_data_handle(static_cast<char*>(base[bd.buf]) + bd.offset);
    rb->last_base = base;
  }
  std::vector<Exec>& execs = rb->execs;
  auto& s = stream();
  const int team_n = omp_get_max_threads();
  int cur = team_n;
  auto threads_for = [&](const Exec& e) {
    int want = e.single ? 1 : team_n;
    if (want != cur) {
      s.wait();
      omp_set_num_threads(want);
      cur = want;
    }
  };
  struct Back {
    int& cur;
    int team_n;
    ~Back() {
      if (cur != team_n) omp_set_num_threads(team_n);
    }
  } back{cur, team_n};
  // The session profiles this run (ABI 1.3): time each primitive and report it with the nodes it computes.
  const keel_kernel_api_t* kapi = g_kernel_api.load(std::memory_order_relaxed);
  const bool report = KEEL_HAS_MEMBER(kapi, keel_kernel_api_t, profile_step) && kapi->profiling && kapi->profile_step &&
                      kapi->profiling(c.raw()) != 0;
  if (options().profile || report) {
    for (size_t k = 0; k < execs.size(); ++k) {
      threads_for(execs[k]);
      auto t0 = std::chrono::steady_clock::now();
      run_step(execs[k], s);
      s.wait();
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (report) {
        keel_profile_step_t st;
        std::memset(&st, 0, sizeof st);
        st.struct_size = sizeof st;
        st.kind = step_kind(p.execs[k]);
        st.implementation = p.impls[k].c_str();
        st.op_type = k < p.step_op.size() ? p.step_op[k] : "";
        if (k < p.step_nodes.size()) {
          st.node_names = p.step_nodes[k].data();
          st.node_count = p.step_nodes[k].size();
        }
        st.time_ms = ms;
        keel_status_release(kapi->profile_step(c.raw(), &st));
      }
      if (!options().profile) continue;
      std::lock_guard<std::mutex> lock(ch.profile_mu);
      auto& row = ch.profile[std::string(step_kind(p.execs[k])) + " " + p.impls[k]];
      row.first += ms;
      row.second++;
      if (ch.step_min.size() != p.execs.size()) ch.step_min.assign(p.execs.size(), 1e30), ch.step_ms.clear();
      ch.step_min[k] = std::min(ch.step_min[k], ms);
      ch.step_ms.resize(p.execs.size());
      ch.step_ms[k].push_back(ms);
    }
    if (options().profile) {
      std::lock_guard<std::mutex> lock(ch.profile_mu);
      ch.runs++;
    }
    return;
  }
  for (auto& e : execs) {
    threads_for(e);
    run_step(e, s);
  }
  s.wait();
}

keel_status_t status_of(int32_t code, const std::string& msg) { return make_status(code, msg); }

keel_status_t chain_compute(void* state, keel_kernel_context_t* ctx) {
  InstanceScope scope(static_cast<Chain*>(state)->instance);
  try {
    Ctx c(ctx);
    set_threads(c.thread_count());
    run_chain(*static_cast<Chain*>(state), c);
    return nullptr;
  } catch (const Failure& f) {
    return status_of(f.code, f.message);
  } catch (const Reject& r) {
    return status_of(KEEL_STATUS_INTERNAL, "claimed subgraph: " + r.why);
  } catch (const NodeReject& r) {
    return status_of(KEEL_STATUS_INTERNAL, "claimed subgraph: " + r.why);
  } catch (const dnnl::error& e) {
    return status_of(KEEL_STATUS_INTERNAL, std::string("oneDNN: ") + e.what());
  } catch (const std::exception& e) {
    return status_of(KEEL_STATUS_INTERNAL, e.what());
  }
}
void chain_release(void* state) {
  Chain* ch = static_cast<Chain*>(state);
  InstanceScope scope(ch->instance);  // its destructor logs the KEEL_ONEDNN_PROFILE table
  delete ch;
}

}  // namespace keel::onednn::chain
