// One eager op call on tensors: the kernel cache (one kernel instance per call signature), the kernel choice
// (kernel_dispatch.h, shared with sessions), run_kernel, and the CPU fallback of devices that lack a kernel.
#include "core/runtime/eager_internal.h"

#include <algorithm>
#include <cstring>
#include <ctime>

#include "core/base/log.h"
#include "core/runtime/kernel_dispatch.h"
#include "core/runtime/onnx_io.h"

namespace keel::eager::detail {

namespace {

void append_attr(std::string& key, const std::string& name, const Attribute& a) {
  key += name;
  key += '=';
  key += std::to_string(static_cast<int>(a.kind));
  key += ':';
  switch (a.kind) {
    case AttrKind::kFloat: key.append(reinterpret_cast<const char*>(&a.f), sizeof a.f); break;
    case AttrKind::kInt: key += std::to_string(a.i); break;
    case AttrKind::kString: key += a.s; break;
    case AttrKind::kInts:
      for (int64_t v : a.ints) key += std::to_string(v) + ",";
      break;
    case AttrKind::kFloats:
      key.append(reinterpret_cast<const char*>(a.floats.data()), a.floats.size() * sizeof(float));
      break;
    case AttrKind::kStrings:
      for (const auto& s : a.strings) key += s + "\x1f";
      break;
    case AttrKind::kTensor:
      key += std::to_string(static_cast<int>(a.t.dtype())) + shape_to_string(a.t.shape());
      if (a.t.defined() && a.t.location().is_host())
        key.append(static_cast<const char*>(a.t.raw_data()), a.t.byte_size());
      break;
    default: break;
  }
  key += ';';
}

}  // namespace

bool is_small_int(const keel::Tensor& t) {
  return t.defined() && (t.dtype() == DType::kI64 || t.dtype() == DType::kI32) && t.numel() <= 16 &&
         t.location().is_host();
}

// Shape-like integer inputs (a Reshape's shape, a ReduceSum's axes, Split sizes, ...): their values are part of the
// kernel-cache key, kernels see them as constants at create time (as a graph's initializers), and gradient rules
// read them. Data inputs (Gather indices, labels) are never treated so, whatever their size.
bool is_shape_input(const std::string& domain, const std::string& op_type, size_t i, const keel::Tensor& t) {
  if (!domain.empty() || !is_small_int(t)) return false;
  static const std::unordered_map<std::string, std::vector<size_t>> kShapeInputs = {{"Reshape", {1}},
                                                                                    {"ReduceSum", {1}},
                                                                                    {"ReduceMean", {1}},
                                                                                    {"ReduceMax", {1}},
                                                                                    {"ReduceMin", {1}},
                                                                                    {"ReduceProd", {1}},
                                                                                    {"ReduceL2", {1}},
                                                                                    {"ReduceL1", {1}},
                                                                                    {"ReduceLogSumExp", {1}},
                                                                                    {"ReduceSumSquare", {1}},
                                                                                    {"Split", {1}},
                                                                                    {"Expand", {1}},
                                                                                    {"Tile", {1}},
                                                                                    {"Pad", {1, 3}},
                                                                                    {"Slice", {1, 2, 3, 4}},
                                                                                    {"Squeeze", {1}},
                                                                                    {"Unsqueeze", {1}},
                                                                                    {"ConstantOfShape", {0}},
                                                                                    {"TopK", {1}}};
  auto it = kShapeInputs.find(op_type);
  return it != kShapeInputs.end() && std::find(it->second.begin(), it->second.end(), i) != it->second.end();
}

std::string op_label(const std::string& domain, const std::string& op_type) {
  return domain.empty() ? op_type : domain + "." + op_type;
}

namespace {

// The dtypes of an eager call's slots (kernel_dispatch.h): its inputs' and the inferred output dtypes.
dispatch::CallTypes call_types_of(const std::vector<keel::Tensor>& inputs, const std::vector<DType>& out_dtypes) {
  dispatch::CallTypes types;
  types.inputs.reserve(inputs.size());
  for (const auto& t : inputs) types.inputs.push_back(t.defined() ? t.dtype() : DType::kUndefined);
  types.outputs = out_dtypes;
  return types;
}

// The threads an op's kernels run with: the runtime's pool, or one thread for an op whose inputs hold fewer than
// Runtime::serial_bytes (4 MiB unless KEEL_EAGER_SERIAL_BYTES says otherwise), as PyTorch's parallel_for leaves
// work under its grain to one thread. Each parallel region of an op costs a wake-up of the other threads and moves
// the op's data between cores' caches; eager training runs a region or more per op, so a small model's ops ran
// slower on two threads than on one: SimpleCNN (batch 64, 2-vCPU host) 1.03 against 0.76 ms a step, every op ~2x
// slower, while the LeNet-like model's large convolutions and Linear still halve.
ThreadPool* pool_for(const std::vector<keel::Tensor>& inputs) {
  Runtime& r = rt();
  if (r.pool == nullptr || r.pool->thread_count() <= 1) return r.pool;
  uint64_t bytes = 0;
  for (const auto& t : inputs)
    if (t.defined()) bytes += t.byte_size();
  return bytes < r.serial_bytes ? &r.serial_pool : r.pool;
}

// Fills the create-phase context of a call to `ck`: its inputs' dtypes and shapes, and the values of shape-like
// inputs (constants, as a graph would have them).
void fill_call_context(keel_kernel_context_t& ctx, const CachedKernel& ck, const std::vector<keel::Tensor>& inputs) {
  ctx.phase = keel_kernel_context_t::Phase::kCreate;
  ctx.node = &ck.node;
  ctx.opset = ck.opset;
  ctx.device_index = ck.device_index;
  ctx.pool = pool_for(inputs);
  ctx.input_shapes.resize(inputs.size());
  ctx.input_views.resize(inputs.size());
  ctx.inputs.assign(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    keel_tensor_t view{};
    if (is_shape_input(ck.node.domain, ck.node.op_type, i, inputs[i])) {
      view = inputs[i].c_view();
    } else {
      view.struct_size = sizeof view;
      view.dtype = static_cast<int32_t>(inputs[i].dtype());
      ctx.input_shapes[i] = inputs[i].shape();
      view.ndim = static_cast<int32_t>(inputs[i].shape().size());
      view.dims = ctx.input_shapes[i].data();
    }
    ctx.input_views[i] = view;
    ctx.inputs[i] = &ctx.input_views[i];
  }
  ctx.output_dtypes = ck.out_dtypes;
}

// Makes `choice` the kernel of `ck` (releasing the state of the one it replaces).
void install(CachedKernel& ck, const dispatch::KernelChoice& choice) {
  if (ck.release && ck.state) ck.release(ck.state);
  ck.kernel_name = choice.kernel->name;
  ck.compute = choice.kernel->def.compute;
  ck.release = choice.release();
  ck.state = choice.state;
}

// Creates the kernel instance for a call (cache miss).
std::unique_ptr<CachedKernel> make_kernel(const std::string& domain, const std::string& op_type,
                                          const std::map<std::string, Attribute>& attrs,
                                          const std::vector<keel::Tensor>& inputs, size_t num_outputs,
                                          const std::vector<bool>& wanted, const std::string& device) {
  Environment& env = environment();
  auto ck = std::make_unique<CachedKernel>();
  Node& n = ck->node;
  n.name = "eager_" + op_type;
  n.domain = domain;
  n.op_type = op_type;
  n.attrs = attrs;
  ck->opset = domain.empty() ? kOpset : 1;
  // Output dtypes from ONNX type inference over a one-node graph.
  Graph g;
  g.name = "eager";
  g.opsets = {{"", kOpset}, {"keel", 1}};
  if (!domain.empty()) g.opsets[domain] = 1;  // e.g. ai.onnx.preview.training (the optimizers)
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      n.inputs.push_back("");
      continue;
    }
    std::string v = "i" + std::to_string(i);
    n.inputs.push_back(v);
    if (is_shape_input(domain, op_type, i, inputs[i])) {
      g.initializers[v] = inputs[i];
    } else {
      g.inputs.push_back(v);
    }
    g.value_info[v] = ValueInfo{inputs[i].dtype(), inputs[i].shape()};
  }
  for (size_t i = 0; i < num_outputs; ++i) {
    bool w = wanted.empty() || wanted[i];
    n.outputs.push_back(w ? "o" + std::to_string(i) : std::string());
    if (w) g.outputs.push_back(n.outputs.back());
  }
  g.add_node(n);
  Status st = infer_shapes(g);
  if (!st.is_ok()) fail(st.with_context(op_label(domain, op_type)));
  for (const auto& o : n.outputs) {
    DType dt = DType::kUndefined;
    if (!o.empty()) {
      const ValueInfo* vi = g.info(o);
      dt = vi ? vi->dtype : DType::kUndefined;
      if (dt == DType::kUndefined) {
        std::string ins;
        for (const auto& t : inputs) ins += (ins.empty() ? "" : ", ") + (t.defined() ? t.describe() : std::string("-"));
        fail(invalid_argument(op_label(domain, op_type) + ": cannot infer the dtype of output " + o.substr(1) +
                              " (inputs: " + ins + "; is the op registered at opset " + std::to_string(ck->opset) +
                              "?)"));
      }
    }
    ck->out_dtypes.push_back(dt);
  }

  // The best kernel of the device that accepts the call; the ones ranked below it stay as its alternatives.
  const DeviceSpec dev = spec_of(device);
  ck->device = device;
  ck->device_index = dev.index;
  std::vector<const KernelEntry*> candidates = dispatch::ranked_kernels(env.registry(), n, ck->opset, dev.type);
  std::vector<std::string> rejections;
  const CachedKernel& call = *ck;
  dispatch::KernelChoice choice = check(dispatch::take_kernel(
                                            candidates, n, ck->opset, call_types_of(inputs, ck->out_dtypes),
                                            [&](keel_kernel_context_t& ctx) { fill_call_context(ctx, call, inputs); },
                                            op_label(domain, op_type), &rejections),
                                        "");
  if (choice) {
    install(*ck, choice);
    ck->alternatives = std::move(candidates);
    ck->memory_type = memory_type_of(device);
    const DeviceSpec mem = spec_of(ck->memory_type);
    ck->memory_at = Location{mem.type, mem.index};
    ck->alloc = check(env.allocator(mem), op_label(domain, op_type));
    return ck;
  }
  std::string reasons;
  for (const auto& r : rejections) reasons += (reasons.empty() ? "" : "; ") + r;
  if (reasons.empty()) reasons = "no kernel registered";
  std::string ins;
  for (const auto& t : inputs) ins += (ins.empty() ? "" : ", ") + (t.defined() ? t.describe() : std::string("-"));
  fail(unimplemented(op_label(domain, op_type) + " on " + device + " with inputs (" + ins + "): " + reasons));
}

// Replaces the kernel of `ck` by the next alternative that accepts the call (after a run-time rejection); false when
// none is left. Under ck.run_mu.
bool switch_alternative(CachedKernel& ck, const std::vector<keel::Tensor>& inputs) {
  if (ck.alternatives.empty()) return false;
  dispatch::KernelChoice choice = check(dispatch::take_kernel(
                                            ck.alternatives, ck.node, ck.opset, call_types_of(inputs, ck.out_dtypes),
                                            [&](keel_kernel_context_t& ctx) { fill_call_context(ctx, ck, inputs); },
                                            op_label(ck.node.domain, ck.node.op_type), nullptr),
                                        "");
  if (!choice) return false;
  install(ck, choice);
  return true;
}
std::string device_of(const std::string& domain, const std::string& op_type, const std::vector<keel::Tensor>& inputs,
                      const std::string& what) {
  std::string dev;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const keel::Tensor& t = inputs[i];
    if (!t.defined() || is_shape_input(domain, op_type, i, t)) continue;
    const std::string d = device_name(t.location());
    if (dev.empty()) dev = d;
    else if (d != dev)
      fail(invalid_argument(what + ": inputs on different devices (" + dev + " and " + d + "); move them with .to()"));
  }
  if (dev.empty()) dev = default_device();
  // Host-memory tensors run on the default device when it is a host-memory device, else on the CPU.
  if (dev == "cpu" && default_device() != "cpu" && memory_type_of(default_device()) == "cpu") dev = default_device();
  return dev;
}

// One warning per op type and device type for the CPU fallback of eager ops (with the first reason).
void warn_cpu_fallback(const std::string& what, const std::string& device, const std::string& why) {
  const std::string type = device.substr(0, device.find(':'));
  {
    std::lock_guard<std::mutex> lock(rt().mu);
    if (!rt().warned.insert("cpu-fallback:" + what + "@" + type).second) return;
  }
  log::warn(
      "eager: {} has no kernel on {} for this call; it runs on the CPU, copying its inputs to the host and its "
      "outputs back ({})",
      what, type, why);
}

// Runs a call whose device has no kernel for it on the CPU: inputs to the host, outputs back to the device's memory.
std::vector<keel::Tensor> run_on_cpu(CachedKernel& ck, const std::string& domain, const std::string& op_type,
                                     const std::map<std::string, Attribute>& attrs,
                                     const std::vector<keel::Tensor>& inputs, size_t num_outputs,
                                     const std::vector<bool>& wanted) {
  std::vector<keel::Tensor> host;
  host.reserve(inputs.size());
  for (const auto& t : inputs) host.push_back(t.defined() ? to_host(t) : keel::Tensor());
  CachedKernel* cpu = nullptr;
  auto outs = run_kernel(domain, op_type, attrs, host, num_outputs, wanted, &cpu, /*on_cpu=*/true);
  {
    // Gradient rules read the node and opset of the call's kernel (apply() reads them under grad_mu).
    std::lock_guard<std::mutex> lock(ck.grad_mu);
    if (ck.node.op_type.empty() && cpu != nullptr) {
      ck.node = cpu->node;
      ck.opset = cpu->opset;
      ck.out_dtypes = cpu->out_dtypes;
      ck.kernel_name = "cpu fallback: " + cpu->kernel_name;
    }
  }
  for (auto& o : outs)
    if (o.defined()) o = copy_to(o, ck.memory_type);
  return outs;
}

}  // namespace

// Runs one op on the given tensors (no autograd). Returns num_outputs tensors (undefined where not wanted).
// A device whose memory is its own falls back to the CPU for a call it has no kernel for (warn_cpu_fallback).
std::vector<keel::Tensor> run_kernel(const std::string& domain, const std::string& op_type,
                                     const std::map<std::string, Attribute>& attrs,
                                     const std::vector<keel::Tensor>& inputs, size_t num_outputs,
                                     const std::vector<bool>& wanted, CachedKernel** out_kernel, bool on_cpu) {
  Runtime& r = rt();
  const std::string what = op_label(domain, op_type);
  std::string device = on_cpu ? std::string("cpu") : device_of(domain, op_type, inputs, what);
  // The cache key: device, op, attributes, input dtypes/shapes (values of small integer inputs), wanted outputs.
  std::string key;
  key.reserve(128);
  key += device;
  key += '|';
  key += domain;
  key += '|';
  key += op_type;
  key += '|';
  for (const auto& [name, a] : attrs) append_attr(key, name, a);
  key += '|';
  for (size_t i = 0; i < inputs.size(); ++i) {
    const keel::Tensor& t = inputs[i];
    if (!t.defined()) {
      key += "-;";
      continue;
    }
    key += std::to_string(static_cast<int>(t.dtype()));
    for (int64_t d : t.shape()) {
      key += ',';
      key += std::to_string(d);
    }
    if (is_shape_input(domain, op_type, i, t)) {
      key += '=';
      key.append(static_cast<const char*>(t.raw_data()), t.byte_size());
    }
    key += ';';
  }
  key += std::to_string(num_outputs);
  for (size_t i = 0; i < wanted.size(); ++i) key += wanted[i] ? '1' : '0';
  CachedKernel* ck = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.cache_mu);
    auto it = r.cache.find(key);
    if (it != r.cache.end()) ck = it->second.get();
  }
  r.ops.fetch_add(1, std::memory_order_relaxed);
  if (ck == nullptr) {
    std::unique_ptr<CachedKernel> made;
    try {
      made = make_kernel(domain, op_type, attrs, inputs, num_outputs, wanted, device);
    } catch (const Error& e) {
      // A device in its own memory without a kernel for the call: the CPU runs it (warned once per op type).
      if (e.status().code() != StatusCode::kUnimplemented || memory_type_of(device) == "cpu") throw;
      made = std::make_unique<CachedKernel>();
      made->cpu_fallback = true;
      made->device = device;
      made->memory_type = memory_type_of(device);
      warn_cpu_fallback(what, device, e.status().message());
    }
    std::lock_guard<std::mutex> lock(r.cache_mu);
    auto [it, inserted] = r.cache.emplace(key, std::move(made));
    ck = it->second.get();
    r.misses.fetch_add(1, std::memory_order_relaxed);
  } else {
    r.hits.fetch_add(1, std::memory_order_relaxed);
  }
  if (out_kernel) *out_kernel = ck;
  if (ck->cpu_fallback) return run_on_cpu(*ck, domain, op_type, attrs, inputs, num_outputs, wanted);

  std::unique_lock<std::mutex> run_lock(ck->run_mu);
  keel_kernel_context_t ctx;
  ctx.phase = keel_kernel_context_t::Phase::kCompute;
  ctx.node = &ck->node;
  ctx.opset = ck->opset;
  ctx.device_index = ck->device_index;
  ctx.pool = pool_for(inputs);
  ctx.bind_inputs(inputs);
  ctx.output_dtypes = ck->out_dtypes;
  ctx.outputs.assign(num_outputs, keel::Tensor());
  ctx.output_views.assign(num_outputs, keel_tensor_t{});
  CachingAllocator* alloc = ck->alloc;
  const Location& mem_at = ck->memory_at;
  ctx.allocate_output = [alloc, &mem_at](int32_t, DType dtype, const Shape& shape) -> StatusOr<keel::Tensor> {
    KEEL_ASSIGN_OR_RETURN(uint64_t bytes, checked_byte_size(dtype, shape), "output");
    KEEL_ASSIGN_OR_RETURN(void* p, alloc->allocate(bytes), "output");
    return keel::Tensor(dtype, shape,
                        std::make_shared<Storage>(p, bytes, mem_at, [alloc](void* q) { alloc->free(q); }));
  };
  std::vector<void*> workspace;
  ctx.allocate_workspace = [alloc, &workspace](uint64_t bytes) -> StatusOr<void*> {
    KEEL_ASSIGN_OR_RETURN(void* p, alloc->allocate(bytes), "workspace");
    workspace.push_back(p);
    return p;
  };
  const bool prof = r.profiling.load(std::memory_order_relaxed);
  // Process CPU time: wall time is meaningless on a loaded machine; every kernel thread's work counts. With
  // KEEL_EAGER_PROFILE=sync, wall time between two waits for the device (its queue drained before, the op done after).
  const bool sync = prof && r.profile_sync && ck->memory_type != "cpu";
  auto cpu_ms = [sync] {
    timespec ts{};
    clock_gettime(sync ? CLOCK_MONOTONIC : CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  };
  if (sync) synchronize_device(ck->device);
  const double t0 = prof ? cpu_ms() : 0.0;
  Status st = Status::from_c(ck->compute(ck->state, &ctx));
  while (st.code() == StatusCode::kUnimplemented) {
    for (void* p : workspace) alloc->free(p);
    workspace.clear();
    if (!switch_alternative(*ck, inputs)) break;
    ctx.outputs.assign(num_outputs, keel::Tensor());
    ctx.output_views.assign(num_outputs, keel_tensor_t{});
    ctx.attr_tensor_views.clear();
    ctx.attr_string_lists.clear();
    st = Status::from_c(ck->compute(ck->state, &ctx));
  }
  for (void* p : workspace) alloc->free(p);
  if (st.code() == StatusCode::kUnimplemented && ck->memory_type != "cpu") {
    // Every kernel of the device rejected the call at run time: the CPU runs it, now and for the same call later.
    ck->cpu_fallback = true;
    run_lock.unlock();
    warn_cpu_fallback(what, device, st.message());
    return run_on_cpu(*ck, domain, op_type, attrs, inputs, num_outputs, wanted);
  }
  if (prof) {
    if (sync && st.is_ok()) synchronize_device(ck->device);
    double ms = cpu_ms() - t0;
    std::string pk = what + " " + ck->kernel_name;
    for (const auto& t : inputs)
      if (t.defined()) pk += " " + std::string(dtype_name(t.dtype())) + shape_to_string(t.shape());
    std::lock_guard<std::mutex> lock(r.prof_mu);
    auto& e = r.prof[pk];
    e.first += ms;
    e.second += 1;
  }
  if (!st.is_ok()) fail(st.with_context(what + " (kernel " + ck->kernel_name + ")"));
  for (size_t i = 0; i < num_outputs; ++i)
    if ((wanted.empty() || wanted[i]) && !ctx.outputs[i].defined())
      fail(internal_error(what + ": kernel " + ck->kernel_name + " did not write output " + std::to_string(i)));
  return std::move(ctx.outputs);
}

keel::Tensor run1(const std::string& op_type, const std::vector<keel::Tensor>& inputs,
                  const std::map<std::string, Attribute>& attrs, const std::string& domain) {
  return run_kernel(domain, op_type, attrs, inputs, 1, {})[0];
}

}  // namespace keel::eager::detail
