// Eager tensors: dispatch through the kernel registry with a kernel-instance cache, autograd (grad_fn graph whose
// nodes run the programs of ops/gradients.h), autocast, and the tracer (see eager.h).
#include "core/runtime/eager.h"

#include <onnx/defs/schema.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/base/log.h"
#include "core/base/thread_pool.h"
#include "core/runtime/kernel_context.h"
#include "core/runtime/onnx_io.h"
#include "hal/device.h"
#include "ops/gradients.h"

namespace keel::eager {

Error::Error(Status s) : std::runtime_error(s.to_string()), status_(std::move(s)) {}

namespace {

constexpr int32_t kOpset = 17;

[[noreturn]] void fail(Status s) { throw Error(std::move(s)); }
template <class T>
T check(StatusOr<T> v, const std::string& context) {
  if (!v.is_ok()) fail(v.status().with_context(context));
  return std::move(v).value();
}

// ------------------------------------------------------------------------------------------------ runtime state

struct GradNode;

struct CachedKernel {
  Node node;  // domain, op_type, attrs; inputs/outputs name the call's slots ("" = absent / not wanted)
  int32_t opset = kOpset;
  std::vector<DType> out_dtypes;
  std::string device;       // device the kernel runs on: its type, or "type:index" for an index > 0 (device_name)
  int32_t device_index = 0; // that device's index (what the kernel context reports)
  std::string memory_type;  // where its outputs live ("cpu" for host-memory devices; device_name form)
  Location memory_at;       // the same as a location
  CachingAllocator* alloc = nullptr;
  std::string kernel_name;
  keel_status_t (*compute)(void*, keel_kernel_context_t*) = nullptr;
  void (*release)(void*) = nullptr;
  void* state = nullptr;
  std::vector<const KernelEntry*> alternatives;
  std::vector<bool> needs_input_values;  // unused slot kept for future
  // The device has no kernel for this call (none registered, or every one rejected it): it runs on the CPU, inputs
  // copied to the host and outputs back to `memory_type` (node/opset filled from the CPU kernel's on first use).
  std::atomic<bool> cpu_fallback{false};
  std::mutex run_mu;
  // Gradient programs by needs-grad mask.
  std::mutex grad_mu;
  std::unordered_map<uint64_t, std::shared_ptr<const ops::GradProgram>> grads;
  std::unordered_map<uint64_t, std::string> grad_errors;
  ~CachedKernel() {
    if (release && state) release(state);
  }
};

struct Runtime {
  std::mutex mu;
  std::shared_ptr<Environment> env;
  std::unique_ptr<ThreadPool> own_pool;
  ThreadPool* pool = nullptr;
  std::string default_device = "cpu";
  std::mt19937_64 gen{0x6b65656cull};
  std::mutex cache_mu;
  std::unordered_map<std::string, std::unique_ptr<CachedKernel>> cache;
  std::atomic<uint64_t> ops{0}, hits{0}, misses{0};
  std::unordered_set<std::string> warned;
  // Device copies of small constant operands by content (device_constant); cleared with the kernel cache.
  std::mutex const_mu;
  std::unordered_map<std::string, keel::Tensor> consts;
  std::atomic<bool> profiling{std::getenv("KEEL_EAGER_PROFILE") != nullptr};
  std::mutex prof_mu;
  std::map<std::string, std::pair<double, uint64_t>> prof;  // "op kernel" -> (ms, calls)
};

Runtime& rt() {
  static Runtime* r = new Runtime();  // leaked on purpose: kernels may still be released by late tensors
  return *r;
}

Environment& env_locked(Runtime& r) {
  if (!r.env) {
    // OpenMP (oneDNN's threads) spinning between the many short parallel regions of eager training starves the
    // other threads and, on a shared machine, everyone else: sleep instead, unless the user chose otherwise. Read
    // by libgomp when the plugin loads it, so it must be set before the environment discovers plugins.
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    EnvironmentOptions o;
    auto e = Environment::create(o);
    if (!e.is_ok()) fail(e.status().with_context("eager: cannot create the default environment"));
    r.env = std::shared_ptr<Environment>(std::move(e).value());
    r.pool = &r.env->thread_pool();
  }
  return *r.env;
}

thread_local bool t_grad_enabled = true;
thread_local DType t_autocast = DType::kUndefined;
thread_local Tracer::Impl* t_tracer = nullptr;

}  // namespace

void init(std::shared_ptr<Environment> env, int threads) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  {
    std::lock_guard<std::mutex> c(r.cache_mu);
    r.cache.clear();
  }
  {
    std::lock_guard<std::mutex> c(r.const_mu);
    r.consts.clear();
  }
  r.env = std::move(env);
  r.own_pool.reset();
  if (!r.env) return;
  if (threads > 0 && threads != r.env->thread_pool().thread_count()) {
    r.own_pool = std::make_unique<ThreadPool>(threads);
    r.pool = r.own_pool.get();
  } else {
    r.pool = &r.env->thread_pool();
  }
}

Environment& environment() {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  return env_locked(r);
}

void set_device(const std::string& device) {
  Environment& e = environment();
  auto spec = e.device(device);
  if (!spec.is_ok()) fail(spec.status().with_context("set_device"));
  // Stored as eager names its devices: the type for index 0, "type:index" otherwise.
  std::string name = spec->index == 0 ? spec->type : spec->to_string();
  std::lock_guard<std::mutex> lock(rt().mu);
  rt().default_device = std::move(name);
}

const std::string& default_device() { return rt().default_device; }
void manual_seed(uint64_t seed) { rt().gen.seed(seed); }
std::mt19937_64& generator() { return rt().gen; }

DispatchStats dispatch_stats() {
  Runtime& r = rt();
  return DispatchStats{r.ops.load(), r.hits.load(), r.misses.load()};
}
void set_profiling(bool on) { rt().profiling = on; }

std::string profile_report() {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.prof_mu);
  std::vector<std::pair<std::string, std::pair<double, uint64_t>>> v(r.prof.begin(), r.prof.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::string out;
  for (const auto& [k, t] : v) {
    char line[256];
    std::snprintf(line, sizeof line, "%-60s %8llu calls %10.3f ms %9.4f ms/call\n", k.c_str(),
                  static_cast<unsigned long long>(t.second), t.first, t.first / static_cast<double>(t.second));
    out += line;
  }
  r.prof.clear();
  return out;
}

void clear_kernel_cache() {
  {
    std::lock_guard<std::mutex> c(rt().cache_mu);
    rt().cache.clear();
  }
  std::lock_guard<std::mutex> c(rt().const_mu);
  rt().consts.clear();
}

// ------------------------------------------------------------------------------------------------ tensor impl

namespace detail {

struct TensorImpl {
  keel::Tensor data;
  bool requires_grad = false;
  std::shared_ptr<GradNode> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  Tensor grad;
  std::weak_ptr<GradNode> accumulator;  // leaves: the node that accumulates into grad
  std::vector<std::pair<int64_t, Tensor::PostAccumulateGradHook>> post_accumulate_hooks;  // leaves only
  int64_t next_hook = 1;
};

}  // namespace detail

namespace {

using detail::TensorImpl;

struct Edge {
  std::shared_ptr<GradNode> fn;
  uint32_t input_nr = 0;
};

struct GradNode {
  virtual ~GradNode() = default;
  // grads: one per forward output (undefined = no gradient flowed there). Returns one per next edge.
  virtual std::vector<keel::Tensor> apply(std::vector<keel::Tensor>& grads) = 0;
  virtual std::string name() const = 0;
  std::vector<Edge> next;
  size_t num_outputs = 1;
  std::vector<ops::TypeShape> out_types;
  bool released = false;
};

// ------------------------------------------------------------------------------------------------ device helpers

const DeviceEntry* device_entry(const std::string& type) {
  const DeviceEntry* d = environment().registry().device(type);
  if (!d) fail(not_found("no device '" + type + "'"));
  return d;
}

bool is_host_device(const std::string& type) {
  if (type == "cpu") return true;
  return hal::Device(device_entry(type), 0).host_memory();
}

// Device names inside eager: the type for index 0 ("cuda", as before indices), "type:index" otherwise ("cuda:1").
std::string device_name(const std::string& type, int32_t index) {
  return index == 0 ? type : type + ":" + std::to_string(index);
}
std::string device_name(const Location& at) { return device_name(at.device_type, at.device_index); }
// A device spec ("cuda:1", "cuda") checked against the environment (Error naming it when malformed or absent).
DeviceSpec spec_of(const std::string& device) { return check(environment().device(device), ""); }

// Where outputs of `device` live: "cpu" for host-memory devices, else the device's name.
std::string memory_type_of(const std::string& device) {
  if (device == "cpu") return "cpu";
  DeviceSpec d = spec_of(device);
  return is_host_device(d.type) ? "cpu" : device_name(d.type, d.index);
}

keel::Tensor alloc_tensor(DType dtype, const Shape& shape, const std::string& mem_type) {
  uint64_t bytes = check(checked_byte_size(dtype, shape), "allocate " + shape_to_string(shape));
  DeviceSpec at = spec_of(mem_type);
  CachingAllocator* a = check(environment().allocator(at), "allocate on " + mem_type);
  void* p = check(a->allocate(bytes), "allocate on " + mem_type);
  auto storage = std::make_shared<Storage>(p, bytes, Location{at.type, at.index}, [a](void* q) { a->free(q); });
  return keel::Tensor(dtype, shape, storage);
}

// A copy of `t` in memory of `mem_type` (host <-> device through the device table).
keel::Tensor copy_to(const keel::Tensor& t, const std::string& mem_type) {
  keel::Tensor out = alloc_tensor(t.dtype(), t.shape(), mem_type);
  if (t.byte_size() == 0) return out;
  const bool src_host = t.location().is_host(), dst_host = mem_type == "cpu";
  if (src_host && dst_host) {
    std::memcpy(out.raw_data(), t.raw_data(), t.byte_size());
    return out;
  }
  // Host <-> device through the device's table; two devices of one type by peer copy where the table has one,
  // otherwise through the host (Environment::copy).
  Status s = environment().copy(out.raw_data(), out.location(), t.raw_data(), t.location(), t.byte_size());
  if (!s.is_ok()) fail(s.with_context("copy " + t.describe() + " to " + mem_type));
  return out;
}

keel::Tensor to_host(const keel::Tensor& t) { return t.location().is_host() ? t : copy_to(t, "cpu"); }

// A read-only copy of a small host constant (a scalar operand, a gradient program's constant) in memory of
// `mem_type`, shared by every op that uses the same value there: after its first use such an operand costs no
// host-to-device copy, which on a device means no synchronisation per op. Keyed by content, so a value can never be
// stale; at most kMaxConsts entries (the cache starts over when full). Never hand the result to user code that may
// write into it (copy_): factories copy as before.
keel::Tensor device_constant(const keel::Tensor& host, const std::string& mem_type) {
  constexpr size_t kMaxBytes = 256, kMaxConsts = 4096;
  if (mem_type == "cpu" || !host.location().is_host()) return host;
  if (host.byte_size() > kMaxBytes) return copy_to(host, mem_type);
  std::string key = mem_type;
  key += '|';
  key += std::to_string(static_cast<int>(host.dtype()));
  key += shape_to_string(host.shape());
  key += '|';
  key.append(static_cast<const char*>(host.raw_data()), host.byte_size());
  Runtime& r = rt();
  {
    std::lock_guard<std::mutex> lock(r.const_mu);
    if (auto it = r.consts.find(key); it != r.consts.end()) return it->second;
  }
  keel::Tensor d = copy_to(host, mem_type);
  std::lock_guard<std::mutex> lock(r.const_mu);
  if (r.consts.size() >= kMaxConsts) r.consts.clear();
  return r.consts.emplace(std::move(key), d).first->second;
}

keel::Tensor host_scalar(double v, DType dt) {
  keel::Tensor t = check(keel::Tensor::host(dt, {}), "scalar");
  switch (dt) {
    case DType::kF32: *t.data<float>() = static_cast<float>(v); break;
    case DType::kF64: *t.data<double>() = v; break;
    case DType::kF16: *t.data<uint16_t>() = f32_to_f16(static_cast<float>(v)); break;
    case DType::kBF16: *t.data<uint16_t>() = f32_to_bf16(static_cast<float>(v)); break;
    case DType::kI64: *t.data<int64_t>() = static_cast<int64_t>(v); break;
    case DType::kI32: *t.data<int32_t>() = static_cast<int32_t>(v); break;
    default: fail(invalid_argument(std::string("scalar of dtype ") + dtype_name(dt)));
  }
  return t;
}

// ------------------------------------------------------------------------------------------------ dispatch

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
    case AttrKind::kFloats: key.append(reinterpret_cast<const char*>(a.floats.data()), a.floats.size() * sizeof(float)); break;
    case AttrKind::kStrings:
      for (const auto& s : a.strings) key += s + "\x1f";
      break;
    case AttrKind::kTensor:
      key += std::to_string(static_cast<int>(a.t.dtype())) + shape_to_string(a.t.shape());
      if (a.t.defined() && a.t.location().is_host()) key.append(static_cast<const char*>(a.t.raw_data()), a.t.byte_size());
      break;
    default: break;
  }
  key += ';';
}

bool is_small_int(const keel::Tensor& t) {
  return t.defined() && (t.dtype() == DType::kI64 || t.dtype() == DType::kI32) && t.numel() <= 16 &&
         t.location().is_host();
}

// Shape-like integer inputs (a Reshape's shape, a ReduceSum's axes, Split sizes, ...): their values are part of the
// kernel-cache key, kernels see them as constants at create time (as a graph's initializers), and gradient rules
// read them. Data inputs (Gather indices, labels) are never treated so, whatever their size.
bool is_shape_input(const std::string& domain, const std::string& op_type, size_t i, const keel::Tensor& t) {
  if (!domain.empty() || !is_small_int(t)) return false;
  static const std::unordered_map<std::string, std::vector<size_t>> kShapeInputs = {
      {"Reshape", {1}},   {"ReduceSum", {1}}, {"ReduceMean", {1}}, {"ReduceMax", {1}}, {"ReduceMin", {1}},
      {"ReduceProd", {1}}, {"ReduceL2", {1}}, {"ReduceL1", {1}},   {"ReduceLogSumExp", {1}},
      {"ReduceSumSquare", {1}}, {"Split", {1}}, {"Expand", {1}}, {"Tile", {1}}, {"Pad", {1, 3}},
      {"Slice", {1, 2, 3, 4}}, {"Squeeze", {1}}, {"Unsqueeze", {1}}, {"ConstantOfShape", {0}}, {"TopK", {1}}};
  auto it = kShapeInputs.find(op_type);
  return it != kShapeInputs.end() && std::find(it->second.begin(), it->second.end(), i) != it->second.end();
}

bool kernel_accepts(const KernelEntry& k, const Node& node, int32_t opset, const std::vector<DType>& in,
                    const std::vector<DType>& out, std::string* why) {
  if (k.constraints.empty()) return true;
  const onnx::OpSchema* schema =
      onnx::OpSchemaRegistry::Schema(node.op_type, opset, node.domain.empty() ? onnx::ONNX_DOMAIN : node.domain);
  if (schema == nullptr) return true;
  auto check_side = [&](const std::vector<onnx::OpSchema::FormalParameter>& formals, const std::vector<DType>& actual) {
    for (size_t i = 0; i < actual.size(); ++i) {
      if (formals.empty()) return true;
      const auto& f = formals[std::min(i, formals.size() - 1)];
      if (actual[i] == DType::kUndefined) continue;
      const auto* allowed = k.allowed(f.GetTypeStr());
      if (allowed && std::find(allowed->begin(), allowed->end(), actual[i]) == allowed->end()) {
        *why = "kernel " + k.name + " does not take " + dtype_name(actual[i]) + " for " + f.GetTypeStr();
        return false;
      }
    }
    return true;
  };
  return check_side(schema->inputs(), in) && check_side(schema->outputs(), out);
}

std::string op_label(const std::string& domain, const std::string& op_type) {
  return domain.empty() ? op_type : domain + "." + op_type;
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
  std::vector<DType> in_dtypes;
  for (const auto& t : inputs) in_dtypes.push_back(t.defined() ? t.dtype() : DType::kUndefined);
  for (const auto& o : n.outputs) {
    DType dt = DType::kUndefined;
    if (!o.empty()) {
      const ValueInfo* vi = g.info(o);
      dt = vi ? vi->dtype : DType::kUndefined;
      if (dt == DType::kUndefined) {
        std::string ins;
        for (const auto& t : inputs) ins += (ins.empty() ? "" : ", ") + (t.defined() ? t.describe() : std::string("-"));
        fail(invalid_argument(op_label(domain, op_type) + ": cannot infer the dtype of output " + o.substr(1) +
                              " (inputs: " + ins + "; is the op registered at opset " + std::to_string(ck->opset) + "?)"));
      }
    }
    ck->out_dtypes.push_back(dt);
  }
  // The highest-priority kernel of the device that accepts the call.
  const Registry& reg = env.registry();
  auto kernels = reg.kernels_for(domain, op_type, ck->opset, spec_of(device).type);
  std::string reasons;
  for (size_t ki = 0; ki < kernels.size(); ++ki) {
    const KernelEntry* k = kernels[ki];
    std::string why;
    if (!kernel_accepts(*k, n, ck->opset, in_dtypes, ck->out_dtypes, &why)) {
      reasons += (reasons.empty() ? "" : "; ") + why;
      continue;
    }
    void* state = k->def.user_data;
    if (k->def.create) {
      keel_kernel_context_t ctx;
      ctx.phase = keel_kernel_context_t::Phase::kCreate;
      ctx.node = &ck->node;
      ctx.opset = ck->opset;
      ctx.device_index = spec_of(device).index;
      ctx.pool = rt().pool;
      ctx.input_shapes.resize(inputs.size());
      ctx.input_views.resize(inputs.size());
      ctx.inputs.assign(inputs.size(), nullptr);
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (!inputs[i].defined()) continue;
        keel_tensor_t view{};
        if (is_shape_input(domain, op_type, i, inputs[i])) {
          view = inputs[i].c_view();  // shape/axes values: constants, as a graph would have them
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
      ctx.output_dtypes = ck->out_dtypes;
      Status cs = Status::from_c(k->def.create(k->def.user_data, &ctx, &state));
      if (!cs.is_ok()) {
        if (cs.code() != StatusCode::kUnimplemented) fail(cs.with_context(op_label(domain, op_type) + " kernel " + k->name));
        reasons += (reasons.empty() ? "" : "; ") + k->name + ": " + cs.message();
        continue;
      }
    }
    ck->kernel_name = k->name;
    ck->compute = k->def.compute;
    ck->release = k->def.create ? k->def.release : nullptr;
    ck->state = state;
    ck->alternatives.assign(kernels.begin() + static_cast<std::ptrdiff_t>(ki) + 1, kernels.end());
    ck->device = device;
    ck->device_index = spec_of(device).index;
    ck->memory_type = memory_type_of(device);
    const DeviceSpec mem = spec_of(ck->memory_type);
    ck->memory_at = Location{mem.type, mem.index};
    ck->alloc = check(env.allocator(mem), op_label(domain, op_type));
    return ck;
  }
  if (reasons.empty()) reasons = "no kernel registered";
  std::string ins;
  for (const auto& t : inputs) ins += (ins.empty() ? "" : ", ") + (t.defined() ? t.describe() : std::string("-"));
  fail(unimplemented(op_label(domain, op_type) + " on " + device + " with inputs (" + ins + "): " + reasons));
}

// Replaces the kernel by the next alternative that accepts the call (after a run-time rejection).
bool switch_alternative(CachedKernel& ck, const std::vector<keel::Tensor>& inputs) {
  while (!ck.alternatives.empty()) {
    const KernelEntry* k = ck.alternatives.front();
    ck.alternatives.erase(ck.alternatives.begin());
    void* state = k->def.user_data;
    if (k->def.create) {
      keel_kernel_context_t ctx;
      ctx.node = &ck.node;
      ctx.opset = ck.opset;
      ctx.device_index = ck.device_index;
      ctx.pool = rt().pool;
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
      Status cs = Status::from_c(k->def.create(k->def.user_data, &ctx, &state));
      if (!cs.is_ok()) continue;
    }
    if (ck.release && ck.state) ck.release(ck.state);
    ck.kernel_name = k->name;
    ck.compute = k->def.compute;
    ck.release = k->def.create ? k->def.release : nullptr;
    ck.state = state;
    return true;
  }
  return false;
}

std::string device_of(const std::string& domain, const std::string& op_type, const std::vector<keel::Tensor>& inputs,
                      const std::string& what) {
  std::string dev;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const keel::Tensor& t = inputs[i];
    if (!t.defined() || is_shape_input(domain, op_type, i, t)) continue;
    const std::string d = device_name(t.location());
    if (dev.empty()) dev = d;
    else if (d != dev) fail(invalid_argument(what + ": inputs on different devices (" + dev + " and " + d + "); move them with .to()"));
  }
  if (dev.empty()) dev = default_device();
  // Host-memory tensors run on the default device when it is a host-memory device, else on the CPU.
  if (dev == "cpu" && default_device() != "cpu" && memory_type_of(default_device()) == "cpu") dev = default_device();
  return dev;
}

std::vector<keel::Tensor> run_kernel(const std::string& domain, const std::string& op_type,
                                     const std::map<std::string, Attribute>& attrs,
                                     const std::vector<keel::Tensor>& inputs, size_t num_outputs,
                                     const std::vector<bool>& wanted, CachedKernel** out_kernel = nullptr,
                                     bool on_cpu = false);

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
  ctx.pool = r.pool;
  ctx.bind_inputs(inputs);
  ctx.output_dtypes = ck->out_dtypes;
  ctx.outputs.assign(num_outputs, keel::Tensor());
  ctx.output_views.assign(num_outputs, keel_tensor_t{});
  CachingAllocator* alloc = ck->alloc;
  const Location& mem_at = ck->memory_at;
  ctx.allocate_output = [alloc, &mem_at](int32_t, DType dtype, const Shape& shape) -> StatusOr<keel::Tensor> {
    KEEL_ASSIGN_OR_RETURN(uint64_t bytes, checked_byte_size(dtype, shape), "output");
    KEEL_ASSIGN_OR_RETURN(void* p, alloc->allocate(bytes), "output");
    return keel::Tensor(dtype, shape, std::make_shared<Storage>(p, bytes, mem_at, [alloc](void* q) { alloc->free(q); }));
  };
  std::vector<void*> workspace;
  ctx.allocate_workspace = [alloc, &workspace](uint64_t bytes) -> StatusOr<void*> {
    KEEL_ASSIGN_OR_RETURN(void* p, alloc->allocate(bytes), "workspace");
    workspace.push_back(p);
    return p;
  };
  const bool prof = r.profiling.load(std::memory_order_relaxed);
  // Process CPU time: wall time is meaningless on a loaded machine; every kernel thread's work counts.
  auto cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  };
  const double t0 = prof ? cpu_ms() : 0.0;
  Status st = Status::from_c(ck->compute(ck->state, &ctx));
  while (st.code() == StatusCode::kUnimplemented && switch_alternative(*ck, inputs)) {
    for (void* p : workspace) alloc->free(p);
    workspace.clear();
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
                  const std::map<std::string, Attribute>& attrs = {}, const std::string& domain = "") {
  return run_kernel(domain, op_type, attrs, inputs, 1, {})[0];
}

// ------------------------------------------------------------------------------------------------ autograd nodes

keel::Tensor zeros_like_type(const ops::TypeShape& ts, const std::string& mem) {
  keel::Tensor h = check(keel::Tensor::host(ts.dtype, ts.shape), "zeros");
  return mem == "cpu" ? h : copy_to(h, mem);
}

// Runs a gradient program.
struct OpBackward : GradNode {
  std::string op;
  std::shared_ptr<const ops::GradProgram> prog;
  std::vector<keel::Tensor> saved_x, saved_y;
  std::string mem;  // where the forward ran ("cpu" or a device memory type)

  std::string name() const override { return op + "Backward"; }

  std::vector<keel::Tensor> apply(std::vector<keel::Tensor>& grads) override {
    std::unordered_map<std::string, keel::Tensor> vals;
    auto lookup = [&](const std::string& v) -> keel::Tensor {
      if (v.empty()) return keel::Tensor();
      auto colon = v.find(':');
      if (colon != std::string::npos) {
        size_t i = std::stoul(v.substr(colon + 1));
        char kind = v[0];
        if (kind == 'x') return saved_x.at(i);
        if (kind == 'y') return saved_y.at(i);
        if (!grads.at(i).defined()) grads[i] = zeros_like_type(out_types.at(i), mem);
        return grads[i];
      }
      if (auto it = vals.find(v); it != vals.end()) return it->second;
      if (auto c = prog->constants.find(v); c != prog->constants.end()) {
        keel::Tensor t = c->second;
        if (mem != "cpu" && !is_small_int(t)) t = device_constant(t, mem);
        vals[v] = t;
        return t;
      }
      fail(internal_error(name() + ": gradient program reads unknown value '" + v + "'"));
    };
    for (const auto& s : prog->steps) {
      std::vector<keel::Tensor> ins;
      for (const auto& v : s.inputs) ins.push_back(lookup(v));
      if (s.domain.empty() && s.op_type == "Reshape" && ins.size() == 2 && is_small_int(ins[1])) {
        Shape shape(ins[1].data<int64_t>(), ins[1].data<int64_t>() + ins[1].numel());
        vals[s.outputs[0]] = check(ins[0].reshaped(shape), name());
        continue;
      }
      std::vector<bool> wanted;
      for (const auto& o : s.outputs) wanted.push_back(!o.empty());
      auto outs = run_kernel(s.domain, s.op_type, s.attrs, ins, s.outputs.size(), wanted);
      for (size_t i = 0; i < outs.size(); ++i)
        if (!s.outputs[i].empty()) vals[s.outputs[i]] = std::move(outs[i]);
    }
    std::vector<keel::Tensor> result;
    for (const auto& g : prog->input_grads) result.push_back(g.empty() ? keel::Tensor() : lookup(g));
    saved_x.clear();
    saved_y.clear();
    return result;
  }
};

// A node whose backward is an error (no gradient rule, or the rule rejected the case): reported at backward time.
struct ErrorBackward : GradNode {
  std::string op, message;
  std::string name() const override { return op + "Backward"; }
  std::vector<keel::Tensor> apply(std::vector<keel::Tensor>&) override { fail(unimplemented(message)); }
};

// A node with a C++ backward (device copies).
struct FnBackward : GradNode {
  std::string nm;
  std::function<std::vector<keel::Tensor>(std::vector<keel::Tensor>&)> fn;
  std::string name() const override { return nm; }
  std::vector<keel::Tensor> apply(std::vector<keel::Tensor>& g) override { return fn(g); }
};

struct AccumulateGrad : GradNode {
  std::shared_ptr<TensorImpl> leaf;
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<keel::Tensor> apply(std::vector<keel::Tensor>&) override { return {}; }
};

std::shared_ptr<GradNode> accumulator_of(const std::shared_ptr<TensorImpl>& leaf) {
  if (auto a = leaf->accumulator.lock()) return a;
  auto a = std::make_shared<AccumulateGrad>();
  a->leaf = leaf;
  a->out_types = {ops::TypeShape{leaf->data.dtype(), leaf->data.shape()}};
  leaf->accumulator = a;
  return a;
}

Edge edge_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return Edge{};
  const auto& impl = t.impl();
  if (impl->grad_fn) return Edge{impl->grad_fn, impl->output_nr};
  return Edge{accumulator_of(impl), 0};
}

}  // namespace

// ------------------------------------------------------------------------------------------------ Tensor

Tensor::Tensor() = default;
Tensor::Tensor(std::shared_ptr<detail::TensorImpl> impl) : impl_(std::move(impl)) {}
Tensor::Tensor(keel::Tensor data, bool requires_grad) : impl_(std::make_shared<detail::TensorImpl>()) {
  if (requires_grad && !dtype_is_float(data.dtype()))
    fail(invalid_argument(std::string("requires_grad needs a floating tensor, got ") + dtype_name(data.dtype())));
  impl_->data = std::move(data);
  impl_->requires_grad = requires_grad;
}

namespace {
const detail::TensorImpl& need(const std::shared_ptr<detail::TensorImpl>& p) {
  if (!p) fail(failed_precondition("use of an undefined tensor"));
  return *p;
}
}  // namespace

bool Tensor::defined() const { return impl_ != nullptr; }
const keel::Tensor& Tensor::data() const { return need(impl_).data; }
const Shape& Tensor::shape() const { return need(impl_).data.shape(); }
int64_t Tensor::rank() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::dim(int i) const {
  int64_t r = rank();
  if (i < -r || i >= r) fail(invalid_argument("dim " + std::to_string(i) + " out of range for rank " + std::to_string(r)));
  return shape()[static_cast<size_t>(i < 0 ? i + r : i)];
}
int64_t Tensor::numel() const { return shape_numel(shape()); }
DType Tensor::dtype() const { return need(impl_).data.dtype(); }
std::string Tensor::device() const { return device_name(need(impl_).data.location()); }
bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }
bool Tensor::is_leaf() const { return need(impl_).grad_fn == nullptr; }
Tensor Tensor::grad() const { return need(impl_).grad; }

Tensor& Tensor::requires_grad_(bool on) {
  need(impl_);
  if (impl_->grad_fn) fail(failed_precondition("requires_grad_ on a non-leaf tensor (use detach())"));
  if (on && !dtype_is_float(dtype()))
    fail(invalid_argument(std::string("requires_grad needs a floating tensor, got ") + dtype_name(dtype())));
  impl_->requires_grad = on;
  return *this;
}

void Tensor::set_grad(const Tensor& g) {
  need(impl_);
  if (g.defined() && (g.shape() != shape() || g.dtype() != dtype()))
    fail(invalid_argument("set_grad: gradient " + g.data().describe() + " does not match " + data().describe()));
  impl_->grad = g;
}
void Tensor::zero_grad() {
  need(impl_);
  impl_->grad = Tensor();
}

Tensor Tensor::detach() const { return Tensor(data(), false); }

float Tensor::item() const {
  if (numel() != 1) fail(invalid_argument("item() of a tensor with " + std::to_string(numel()) + " elements"));
  keel::Tensor h = to_host(data());
  switch (h.dtype()) {
    case DType::kF32: return *h.data<float>();
    case DType::kF64: return static_cast<float>(*h.data<double>());
    case DType::kF16: return f16_to_f32(*h.data<uint16_t>());
    case DType::kBF16: return bf16_to_f32(*h.data<uint16_t>());
    case DType::kI64: return static_cast<float>(*h.data<int64_t>());
    case DType::kI32: return static_cast<float>(*h.data<int32_t>());
    case DType::kBool: case DType::kU8: return static_cast<float>(*h.data<uint8_t>());
    default: fail(invalid_argument(std::string("item() of dtype ") + dtype_name(h.dtype())));
  }
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  if (sizeof(T) != dtype_size(dtype()))
    fail(invalid_argument(std::string("to_vector: element size ") + std::to_string(sizeof(T)) + " does not match " +
                          dtype_name(dtype())));
  keel::Tensor h = to_host(data());
  std::vector<T> v(static_cast<size_t>(h.numel()));
  if (!v.empty()) std::memcpy(v.data(), h.raw_data(), h.byte_size());
  return v;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<uint16_t> Tensor::to_vector<uint16_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

void Tensor::copy_(const Tensor& src) {
  need(impl_);
  if (impl_->grad_fn && impl_->requires_grad) fail(failed_precondition("copy_ into a non-leaf tensor that requires grad"));
  if (src.shape() != shape())
    fail(invalid_argument("copy_: source " + src.data().describe() + " does not match " + data().describe()));
  keel::Tensor s = src.data();
  if (s.dtype() != dtype()) {
    NoGradGuard ng;
    s = src.to(dtype()).data();
  }
  const std::string mem = device_name(data().location());
  if (s.location() != data().location()) s = copy_to(s, mem);
  if (s.raw_data() == data().raw_data() || s.byte_size() == 0) return;
  if (mem == "cpu") {
    std::memcpy(data().raw_data(), s.raw_data(), s.byte_size());
  } else {
    Status st = environment().copy(data().raw_data(), data().location(), s.raw_data(), s.location(), s.byte_size());
    if (!st.is_ok()) fail(st.with_context("copy_"));
  }
}

// ------------------------------------------------------------------------------------------------ scopes

NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }
bool grad_enabled() { return t_grad_enabled; }

AutocastGuard::AutocastGuard(DType low) : prev_(t_autocast) {
  if (low != DType::kBF16 && low != DType::kF16)
    fail(invalid_argument(std::string("autocast to ") + dtype_name(low) + ": only bf16 and f16"));
  t_autocast = low;
}
AutocastGuard::~AutocastGuard() { t_autocast = prev_; }
DType autocast_dtype() { return t_autocast; }

// ------------------------------------------------------------------------------------------------ tracer impl

struct Tracer::Impl {
  Graph graph;
  int32_t opset = kOpset;
  std::vector<std::shared_ptr<TensorImpl>> keep;  // tensors seen (their addresses name values)
  std::unordered_map<const TensorImpl*, std::string> names;
  std::unordered_map<const TensorImpl*, std::string> param_names;
  std::set<std::string> used;
  bool stopped = false;
  bool uses_keel = false;
  int counter = 0;

  std::string fresh(const std::string& prefix) {
    std::string n;
    do n = prefix + std::to_string(counter++);
    while (used.count(n));
    used.insert(n);
    return n;
  }
  std::string name_of(const Tensor& t) {
    auto it = names.find(t.impl().get());
    if (it != names.end()) return it->second;
    // Not produced by a recorded op: an initializer (parameter, buffer, constant).
    std::string n;
    if (auto p = param_names.find(t.impl().get()); p != param_names.end()) n = p->second;
    else n = fresh("const_");
    used.insert(n);
    graph.initializers[n] = to_host(t.data());
    graph.value_info[n] = ValueInfo{t.dtype(), t.shape()};
    keep.push_back(t.impl());
    names[t.impl().get()] = n;
    return n;
  }
  void record(const std::string& domain, const std::string& op_type, const std::map<std::string, Attribute>& attrs,
              const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
    if (stopped) return;
    Node n;
    n.domain = domain;
    n.op_type = op_type;
    n.attrs = attrs;
    n.name = fresh(op_type + "_");
    for (const auto& t : inputs) n.inputs.push_back(t.defined() ? name_of(t) : std::string());
    for (const auto& t : outputs) {
      if (!t.defined()) {
        n.outputs.push_back("");
        continue;
      }
      std::string v = fresh("v");
      n.outputs.push_back(v);
      names[t.impl().get()] = v;
      keep.push_back(t.impl());
      graph.value_info[v] = ValueInfo{t.dtype(), t.shape()};
    }
    if (domain == "keel") uses_keel = true;
    graph.add_node(std::move(n));
  }
};

namespace {

void trace_record(const std::string& domain, const std::string& op_type, const std::map<std::string, Attribute>& attrs,
                  const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) {
  if (t_tracer) t_tracer->record(domain, op_type, attrs, inputs, outputs);
}

// ------------------------------------------------------------------------------------------------ op application

const std::set<std::string>& autocast_low_ops() {
  static const std::set<std::string> s = {"Conv", "ConvTranspose", "MatMul", "Gemm"};
  return s;
}
const std::set<std::string>& autocast_f32_ops() {
  static const std::set<std::string> s = {
      "ReduceSum", "ReduceMean", "Softmax", "LogSoftmax", "BatchNormalization", "LayerNormalization",
      "SoftmaxCrossEntropyLoss", "BatchNormTraining", "Exp", "Log", "Pow", "Sqrt", "GlobalAveragePool",
      "AveragePool"};
  return s;
}

bool device_takes_dtype(const std::string& domain, const std::string& op_type, const std::string& device, DType dt) {
  const Registry& reg = environment().registry();
  for (const KernelEntry* k : reg.kernels_for(domain, op_type, domain.empty() ? kOpset : 1, device)) {
    if (k->constraints.empty()) return true;
    const auto* allowed = k->allowed("T");
    if (!allowed || std::find(allowed->begin(), allowed->end(), dt) != allowed->end()) return true;
  }
  return false;
}

Tensor cast_to(const Tensor& t, DType dt);

// Autocast and type promotion: the dtypes the float inputs of this op run in.
std::vector<Tensor> adjust_inputs(const std::string& domain, const std::string& op_type, std::vector<Tensor> inputs) {
  std::vector<size_t> fl;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && dtype_is_float(inputs[i].dtype())) fl.push_back(i);
  if (fl.empty()) return inputs;
  DType target = DType::kUndefined;
  const DType low = t_autocast;
  const bool onnx = domain.empty();
  if (low != DType::kUndefined && onnx && autocast_low_ops().count(op_type)) {
    std::string dev = inputs[fl[0]].data().location().device_type;
    if (device_takes_dtype(domain, op_type, dev, low)) {
      target = low;
    } else {
      std::string key = op_type + "@" + dev;
      std::lock_guard<std::mutex> lock(rt().mu);
      if (rt().warned.insert(key).second)
        log::info("autocast: no {} kernel for {} on {}; it runs in f32", dtype_name(low), op_type, dev);
      target = DType::kF32;
    }
  } else if (low != DType::kUndefined && (autocast_f32_ops().count(op_type) || (!onnx && op_type == "BatchNormTraining"))) {
    target = DType::kF32;
    for (size_t i : fl)
      if (inputs[i].dtype() == DType::kF64) target = DType::kF64;
  } else {
    // Mixed float inputs promote to the widest.
    auto rank = [](DType d) { return d == DType::kF64 ? 3 : d == DType::kF32 ? 2 : 1; };
    DType first = inputs[fl[0]].dtype();
    bool mixed = false;
    target = first;
    for (size_t i : fl) {
      DType d = inputs[i].dtype();
      if (d != first) mixed = true;
      if (rank(d) > rank(target)) target = d;
    }
    if (!mixed) return inputs;
  }
  for (size_t i : fl)
    if (inputs[i].dtype() != target) inputs[i] = cast_to(inputs[i], target);
  return inputs;
}

// The core of every op: autocast, dispatch, autograd recording, tracing.
std::vector<Tensor> apply(const std::string& domain, const std::string& op_type, std::vector<Tensor> inputs,
                          const std::map<std::string, Attribute>& attrs, size_t num_outputs,
                          std::vector<bool> wanted = {}, bool differentiable = true) {
  if (op_type != "Cast") inputs = adjust_inputs(domain, op_type, std::move(inputs));
  std::vector<keel::Tensor> datas;
  datas.reserve(inputs.size());
  for (const auto& t : inputs) datas.push_back(t.defined() ? t.data() : keel::Tensor());
  CachedKernel* ck = nullptr;
  auto outs = run_kernel(domain, op_type, attrs, datas, num_outputs, wanted, &ck);
  std::vector<Tensor> result;
  result.reserve(outs.size());
  for (auto& o : outs) result.push_back(o.defined() ? Tensor(std::move(o), false) : Tensor());
  trace_record(domain, op_type, attrs, inputs, result);

  bool any = false;
  if (t_grad_enabled && differentiable)
    for (const auto& t : inputs) any = any || t.requires_grad();
  if (!any) return result;
  uint64_t mask = 0;
  std::vector<bool> needs(inputs.size(), false);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].requires_grad()) {
      needs[i] = true;
      mask |= 1ull << std::min<size_t>(i, 63);
    }
  std::vector<ops::TypeShape> in_types, out_types;
  for (const auto& t : inputs) in_types.push_back(t.defined() ? ops::TypeShape{t.dtype(), t.shape()} : ops::TypeShape{});
  for (const auto& t : result) out_types.push_back(t.defined() ? ops::TypeShape{t.dtype(), t.shape()} : ops::TypeShape{});
  std::shared_ptr<GradNode> node;
  std::shared_ptr<const ops::GradProgram> prog;
  std::string error;
  {
    std::lock_guard<std::mutex> lock(ck->grad_mu);
    if (auto it = ck->grads.find(mask); it != ck->grads.end()) prog = it->second;
    else if (auto e = ck->grad_errors.find(mask); e != ck->grad_errors.end()) error = e->second;
    else {
      ops::GradRule rule = ops::gradient_rule(domain, op_type);
      if (rule == nullptr) {
        error = "no gradient rule for " + op_label(domain, op_type) + " (ops/gradients.cc)";
      } else {
        ops::GradBuilder b(ck->node, ck->opset, in_types, out_types, needs);
        std::vector<keel::Tensor> values;
        for (size_t i = 0; i < datas.size(); ++i)
          values.push_back(is_shape_input(domain, op_type, i, datas[i]) ? datas[i] : keel::Tensor());
        b.set_values(values);
        Status st = rule(b);
        if (st.is_ok()) prog = std::make_shared<const ops::GradProgram>(b.take());
        else error = st.message();
      }
      if (prog) ck->grads[mask] = prog;
      else ck->grad_errors[mask] = error;
    }
  }
  if (prog) {
    auto ob = std::make_shared<OpBackward>();
    ob->op = op_type;
    ob->prog = prog;
    ob->mem = ck->memory_type;
    ob->saved_x.resize(inputs.size());
    ob->saved_y.resize(result.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (prog->reads_x[i]) ob->saved_x[i] = datas[i];
    for (size_t j = 0; j < result.size(); ++j)
      if (prog->reads_y[j] && result[j].defined()) ob->saved_y[j] = result[j].data();
    node = ob;
  } else {
    auto eb = std::make_shared<ErrorBackward>();
    eb->op = op_type;
    eb->message = error;
    node = eb;
  }
  node->num_outputs = result.size();
  node->out_types = out_types;
  for (size_t i = 0; i < inputs.size(); ++i) node->next.push_back(needs[i] ? edge_of(inputs[i]) : Edge{});
  for (size_t j = 0; j < result.size(); ++j) {
    if (!result[j].defined() || !dtype_is_float(result[j].dtype())) continue;
    result[j].impl()->requires_grad = true;
    result[j].impl()->grad_fn = node;
    result[j].impl()->output_nr = static_cast<uint32_t>(j);
  }
  return result;
}

Tensor apply1(const std::string& op_type, std::vector<Tensor> inputs, const std::map<std::string, Attribute>& attrs = {},
              const std::string& domain = "") {
  return apply(domain, op_type, std::move(inputs), attrs, 1)[0];
}

Tensor cast_to(const Tensor& t, DType dt) {
  if (t.dtype() == dt) return t;
  return apply1("Cast", {t}, {{"to", Attribute::of_int(static_cast<int64_t>(dt))}});
}

Attribute ai(int64_t v) { return Attribute::of_int(v); }
Attribute ais(std::vector<int64_t> v) { return Attribute::of_ints(std::move(v)); }
Attribute af(float v) { return Attribute::of_float(v); }

Tensor wrap_const(keel::Tensor host, const std::string& device) {
  std::string mem = memory_type_of(device);
  return Tensor(mem == "cpu" ? std::move(host) : copy_to(host, mem), false);
}
Tensor scalar_like(const Tensor& t, double v) {
  return Tensor(device_constant(host_scalar(v, t.dtype()), memory_type_of(t.device())), false);
}
Tensor ints_const(const std::vector<int64_t>& v) {
  return Tensor(keel::Tensor::from_vector(DType::kI64, {static_cast<int64_t>(v.size())}, v), false);
}

// ------------------------------------------------------------------------------------------------ backward engine

void accumulate(TensorImpl& leaf, keel::Tensor g) {
  if (g.dtype() != leaf.data.dtype()) g = run1("Cast", {g}, {{"to", ai(static_cast<int64_t>(leaf.data.dtype()))}});
  if (g.shape() != leaf.data.shape()) g = check(g.reshaped(leaf.data.shape()), "accumulate grad");
  if (!leaf.grad.defined()) {
    // The gradient may alias another leaf's (Add passes dY through) or a saved value: own a copy.
    leaf.grad = Tensor(copy_to(g, device_name(g.location())), false);
  } else {
    leaf.grad = Tensor(run1("Add", {leaf.grad.data(), g}), false);
  }
}

// Runs a leaf's post-accumulate-grad hooks on a copy of the list (a hook may remove itself or others).
void run_post_accumulate_hooks(const std::shared_ptr<TensorImpl>& leaf) {
  if (leaf->post_accumulate_hooks.empty()) return;
  auto hooks = leaf->post_accumulate_hooks;
  const Tensor handle(leaf);
  for (const auto& [id, hook] : hooks) hook(handle);
}

void run_backward(const Tensor& root, keel::Tensor root_grad) {
  NoGradGuard no_grad;
  const auto& impl = root.impl();
  if (!impl->grad_fn) {
    accumulate(*impl, std::move(root_grad));
    run_post_accumulate_hooks(impl);
    return;
  }
  // Dependencies: how many edges point at each node from nodes reachable from the root.
  std::unordered_map<GradNode*, int> deps;
  std::vector<GradNode*> stack = {impl->grad_fn.get()};
  std::unordered_set<GradNode*> seen = {impl->grad_fn.get()};
  while (!stack.empty()) {
    GradNode* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next) {
      if (!e.fn) continue;
      deps[e.fn.get()]++;
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }
  std::unordered_map<GradNode*, std::vector<keel::Tensor>> buffers;
  std::unordered_map<GradNode*, std::shared_ptr<GradNode>> owners;
  auto add_grad = [&](const std::shared_ptr<GradNode>& n, uint32_t slot, keel::Tensor g) {
    auto& buf = buffers[n.get()];
    owners[n.get()] = n;
    if (buf.size() < n->num_outputs) buf.resize(n->num_outputs);
    if (!buf[slot].defined()) buf[slot] = std::move(g);
    else buf[slot] = run1("Add", {buf[slot], g});
  };
  add_grad(impl->grad_fn, impl->output_nr, std::move(root_grad));
  std::vector<GradNode*> ready = {impl->grad_fn.get()};
  while (!ready.empty()) {
    GradNode* n = ready.back();
    ready.pop_back();
    std::vector<keel::Tensor> grads = std::move(buffers[n]);
    buffers.erase(n);
    std::shared_ptr<GradNode> hold = owners[n];
    owners.erase(n);
    if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) {
      if (!grads.empty() && grads[0].defined()) {
        accumulate(*acc->leaf, std::move(grads[0]));
        run_post_accumulate_hooks(acc->leaf);
      }
      continue;
    }
    if (n->released)
      fail(failed_precondition("backward through " + n->name() +
                               " a second time: the graph was freed by the first backward"));
    grads.resize(n->num_outputs);
    bool any = false;
    for (const auto& g : grads) any = any || g.defined();
    std::vector<keel::Tensor> in_grads;
    if (any) in_grads = n->apply(grads);
    n->released = true;
    for (size_t i = 0; i < n->next.size(); ++i) {
      const Edge& e = n->next[i];
      if (!e.fn) continue;
      if (i < in_grads.size() && in_grads[i].defined()) add_grad(e.fn, e.input_nr, std::move(in_grads[i]));
      if (--deps[e.fn.get()] == 0) ready.push_back(e.fn.get());
    }
  }
}

}  // namespace

int64_t Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) {
  need(impl_);
  if (impl_->grad_fn || !impl_->requires_grad)
    fail(failed_precondition("register_post_accumulate_grad_hook: only on a leaf that requires grad"));
  if (!hook) fail(invalid_argument("register_post_accumulate_grad_hook: empty hook"));
  const int64_t id = impl_->next_hook++;
  impl_->post_accumulate_hooks.emplace_back(id, std::move(hook));
  return id;
}

bool Tensor::remove_post_accumulate_grad_hook(int64_t handle) {
  if (!impl_) return false;
  auto& hooks = impl_->post_accumulate_hooks;
  for (auto it = hooks.begin(); it != hooks.end(); ++it) {
    if (it->first == handle) {
      hooks.erase(it);
      return true;
    }
  }
  return false;
}

void Tensor::backward(const Tensor& grad_output) const {
  need(impl_);
  if (!impl_->requires_grad) fail(failed_precondition("backward() on a tensor that does not require grad"));
  keel::Tensor g;
  if (grad_output.defined()) {
    if (grad_output.shape() != shape())
      fail(invalid_argument("backward: grad_output " + grad_output.data().describe() + " does not match " + data().describe()));
    g = grad_output.data();
    if (g.dtype() != dtype()) g = run1("Cast", {g}, {{"to", ai(static_cast<int64_t>(dtype()))}});
  } else {
    if (numel() != 1) fail(invalid_argument("backward() without grad_output needs a one-element tensor, got " + data().describe()));
    g = wrap_const(check(keel::Tensor::host(dtype(), shape()), "ones"), device()).data();
    keel::Tensor one = host_scalar(1.0, dtype());
    if (g.location().is_host()) std::memcpy(g.raw_data(), one.raw_data(), one.byte_size());
    else g = copy_to(check(one.reshaped(shape()), "ones"), device_name(g.location()));
  }
  run_backward(*this, std::move(g));
}

// ------------------------------------------------------------------------------------------------ conversions

Tensor Tensor::to(DType dt) const {
  need(impl_);
  return cast_to(*this, dt);
}

Tensor Tensor::to(const std::string& device_type) const {
  need(impl_);
  const std::string mem = memory_type_of(device_type);
  const std::string here = device_name(data().location());
  if (mem == here) return *this;
  Tensor out(copy_to(data(), mem), false);
  trace_record("", "Identity", {}, {*this}, {out});
  if (t_grad_enabled && requires_grad()) {
    auto n = std::make_shared<FnBackward>();
    n->nm = "ToDeviceBackward";
    n->fn = [here](std::vector<keel::Tensor>& g) { return std::vector<keel::Tensor>{copy_to(g[0], here)}; };
    n->out_types = {ops::TypeShape{dtype(), shape()}};
    n->next.push_back(edge_of(*this));
    out.impl()->requires_grad = true;
    out.impl()->grad_fn = n;
  }
  return out;
}

// ------------------------------------------------------------------------------------------------ arithmetic

Tensor operator+(const Tensor& a, const Tensor& b) { return apply1("Add", {a, b}); }
Tensor operator-(const Tensor& a, const Tensor& b) { return apply1("Sub", {a, b}); }
Tensor operator*(const Tensor& a, const Tensor& b) { return apply1("Mul", {a, b}); }
Tensor operator/(const Tensor& a, const Tensor& b) { return apply1("Div", {a, b}); }
Tensor operator+(const Tensor& a, float b) { return a + scalar_like(a, b); }
Tensor operator-(const Tensor& a, float b) { return a - scalar_like(a, b); }
Tensor operator*(const Tensor& a, float b) { return a * scalar_like(a, b); }
Tensor operator/(const Tensor& a, float b) { return a / scalar_like(a, b); }
Tensor operator+(float a, const Tensor& b) { return scalar_like(b, a) + b; }
Tensor operator-(float a, const Tensor& b) { return scalar_like(b, a) - b; }
Tensor operator*(float a, const Tensor& b) { return scalar_like(b, a) * b; }
Tensor operator/(float a, const Tensor& b) { return scalar_like(b, a) / b; }
Tensor operator-(const Tensor& a) { return apply1("Neg", {a}); }

// ------------------------------------------------------------------------------------------------ factories

namespace {
std::string dev_or_default(const std::string& d) {
  if (d.empty()) return default_device();
  if (!environment().registry().device(d)) fail(not_found("no device '" + d + "'"));
  return d;
}
keel::Tensor host_filled(const Shape& shape, DType dt, const std::function<double()>& value) {
  keel::Tensor t = check(keel::Tensor::host(dt, shape), "factory " + shape_to_string(shape));
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    double v = value();
    switch (dt) {
      case DType::kF32: t.data<float>()[i] = static_cast<float>(v); break;
      case DType::kF64: t.data<double>()[i] = v; break;
      case DType::kF16: t.data<uint16_t>()[i] = f32_to_f16(static_cast<float>(v)); break;
      case DType::kBF16: t.data<uint16_t>()[i] = f32_to_bf16(static_cast<float>(v)); break;
      case DType::kI64: t.data<int64_t>()[i] = static_cast<int64_t>(v); break;
      case DType::kI32: t.data<int32_t>()[i] = static_cast<int32_t>(v); break;
      case DType::kBool: case DType::kU8: t.data<uint8_t>()[i] = static_cast<uint8_t>(v); break;
      default: fail(invalid_argument(std::string("factory of dtype ") + dtype_name(dt)));
    }
  }
  return t;
}
void check_shape(const Shape& s, const char* what) {
  for (int64_t d : s)
    if (d < 0) fail(invalid_argument(std::string(what) + ": negative dimension in " + shape_to_string(s)));
}
}  // namespace

Tensor full(const Shape& shape, float value, DType dtype, const std::string& device) {
  check_shape(shape, "full");
  return wrap_const(host_filled(shape, dtype, [value] { return static_cast<double>(value); }), dev_or_default(device));
}
Tensor zeros(const Shape& shape, DType dtype, const std::string& device) { return full(shape, 0.f, dtype, device); }
Tensor ones(const Shape& shape, DType dtype, const std::string& device) { return full(shape, 1.f, dtype, device); }
Tensor randn(const Shape& shape, float stddev, DType dtype) {
  check_shape(shape, "randn");
  std::normal_distribution<double> d(0.0, stddev);
  auto& g = generator();
  return wrap_const(host_filled(shape, dtype, [&] { return d(g); }), default_device());
}
Tensor rand_uniform(const Shape& shape, float lo, float hi, DType dtype) {
  check_shape(shape, "rand_uniform");
  if (!(hi >= lo)) fail(invalid_argument("rand_uniform: hi < lo"));
  std::uniform_real_distribution<double> d(lo, hi);
  auto& g = generator();
  return wrap_const(host_filled(shape, dtype, [&] { return d(g); }), default_device());
}
Tensor from_vector(const std::vector<float>& v, const Shape& shape) {
  check_shape(shape, "from_vector");
  if (static_cast<int64_t>(v.size()) != shape_numel(shape))
    fail(invalid_argument("from_vector: " + std::to_string(v.size()) + " values for shape " + shape_to_string(shape)));
  return wrap_const(keel::Tensor::from_vector(DType::kF32, shape, v), default_device());
}
Tensor from_vector(const std::vector<int64_t>& v, const Shape& shape) {
  check_shape(shape, "from_vector");
  if (static_cast<int64_t>(v.size()) != shape_numel(shape))
    fail(invalid_argument("from_vector: " + std::to_string(v.size()) + " values for shape " + shape_to_string(shape)));
  return wrap_const(keel::Tensor::from_vector(DType::kI64, shape, v), default_device());
}

// ------------------------------------------------------------------------------------------------ ops

std::vector<Tensor> call_op(const std::string& domain, const std::string& op_type, const std::vector<Tensor>& inputs,
                            const std::map<std::string, Attribute>& attrs, size_t num_outputs) {
  return apply(domain == "ai.onnx" ? std::string() : domain, op_type, inputs, attrs, num_outputs);
}

namespace {
void need_defined(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) fail(invalid_argument(std::string(op) + ": " + what + " is undefined"));
}
void need_rank(const Tensor& t, int64_t r, const char* op, const char* what) {
  need_defined(t, op, what);
  if (t.rank() != r)
    fail(invalid_argument(std::string(op) + ": " + what + " must have rank " + std::to_string(r) + ", got " +
                          t.data().describe()));
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  need_defined(a, "matmul", "a");
  need_defined(b, "matmul", "b");
  return apply1("MatMul", {a, b});
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  need_rank(w, 2, "linear", "weight");
  need_defined(x, "linear", "x");
  if (x.dim(-1) != w.dim(1))
    fail(invalid_argument("linear: x " + x.data().describe() + " does not match weight " + w.data().describe()));
  if (b.defined() && (b.rank() != 1 || b.dim(0) != w.dim(0)))
    fail(invalid_argument("linear: bias " + b.data().describe() + " must be [" + std::to_string(w.dim(0)) + "]"));
  if (x.rank() == 2) return apply1("Gemm", {x, w, b}, {{"transB", ai(1)}});
  Tensor y = matmul(x, transpose(w, {1, 0}));
  return b.defined() ? y + b : y;
}

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, std::array<int64_t, 2> stride,
              std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  need_rank(x, 4, "conv2d", "input");
  need_rank(w, 4, "conv2d", "weight");
  if (groups <= 0) fail(invalid_argument("conv2d: groups must be positive"));
  return apply1("Conv", {x, w, b},
                {{"strides", ais({stride[0], stride[1]})},
                 {"pads", ais({padding[0], padding[1], padding[0], padding[1]})},
                 {"dilations", ais({dilation[0], dilation[1]})},
                 {"group", ai(groups)},
                 {"kernel_shape", ais({w.dim(2), w.dim(3)})}});
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& b, std::array<int64_t, 2> stride,
                        std::array<int64_t, 2> padding, std::array<int64_t, 2> output_padding, int64_t groups) {
  need_rank(x, 4, "conv_transpose2d", "input");
  need_rank(w, 4, "conv_transpose2d", "weight");
  if (groups <= 0) fail(invalid_argument("conv_transpose2d: groups must be positive"));
  return apply1("ConvTranspose", {x, w, b},
                {{"strides", ais({stride[0], stride[1]})},
                 {"pads", ais({padding[0], padding[1], padding[0], padding[1]})},
                 {"output_padding", ais({output_padding[0], output_padding[1]})},
                 {"group", ai(groups)},
                 {"kernel_shape", ais({w.dim(2), w.dim(3)})}});
}

namespace {
std::map<std::string, Attribute> pool_attrs(std::array<int64_t, 2> k, std::array<int64_t, 2> s, std::array<int64_t, 2> p) {
  if (s[0] == 0) s[0] = k[0];
  if (s[1] == 0) s[1] = k[1];
  return {{"kernel_shape", ais({k[0], k[1]})}, {"strides", ais({s[0], s[1]})}, {"pads", ais({p[0], p[1], p[0], p[1]})}};
}
}  // namespace

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  need_rank(x, 4, "max_pool2d", "input");
  return apply1("MaxPool", {x}, pool_attrs(kernel, stride, padding));
}
Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  need_rank(x, 4, "avg_pool2d", "input");
  auto a = pool_attrs(kernel, stride, padding);
  a["count_include_pad"] = ai(1);
  return apply1("AveragePool", {x}, a);
}
Tensor global_avg_pool2d(const Tensor& x) {
  need_rank(x, 4, "global_avg_pool2d", "input");
  return apply1("GlobalAveragePool", {x});
}

Tensor relu(const Tensor& x) { return apply1("Relu", {x}); }
Tensor sigmoid(const Tensor& x) { return apply1("Sigmoid", {x}); }
Tensor tanh(const Tensor& x) { return apply1("Tanh", {x}); }
Tensor gelu(const Tensor& x) { return apply1("Gelu", {x}, {}, "keel"); }
Tensor leaky_relu(const Tensor& x, float slope) { return apply1("LeakyRelu", {x}, {{"alpha", af(slope)}}); }
Tensor softmax(const Tensor& x, int64_t axis) { return apply1("Softmax", {x}, {{"axis", ai(axis)}}); }
Tensor log_softmax(const Tensor& x, int64_t axis) { return apply1("LogSoftmax", {x}, {{"axis", ai(axis)}}); }
Tensor exp(const Tensor& x) { return apply1("Exp", {x}); }
Tensor log(const Tensor& x) { return apply1("Log", {x}); }
Tensor sqrt(const Tensor& x) { return apply1("Sqrt", {x}); }
Tensor abs(const Tensor& x) { return apply1("Abs", {x}); }
Tensor pow(const Tensor& x, float exponent) {
  need_defined(x, "pow", "x");
  return apply1("Pow", {x, scalar_like(x, exponent)});
}
Tensor clamp(const Tensor& x, float lo, float hi) {
  need_defined(x, "clamp", "x");
  if (hi < lo) fail(invalid_argument("clamp: hi < lo"));
  return apply1("Clip", {x, scalar_like(x, lo), scalar_like(x, hi)});
}

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& running_mean, Tensor& running_var,
                  bool training, float momentum, float eps) {
  need_defined(x, "batch_norm", "input");
  if (x.rank() < 2) fail(invalid_argument("batch_norm: input must be [N, C, ...], got " + x.data().describe()));
  const int64_t C = x.dim(1);
  DType pdt = t_autocast != DType::kUndefined && x.dtype() != DType::kF64 ? DType::kF32 : x.dtype();
  Tensor w = weight.defined() ? weight : ones({C}, pdt, x.device());
  Tensor b = bias.defined() ? bias : zeros({C}, pdt, x.device());
  for (const Tensor* t : {&w, &b})
    if (t->shape() != Shape{C}) fail(invalid_argument("batch_norm: weight/bias must be [" + std::to_string(C) + "]"));
  if (training) {
    auto outs = apply("keel", "BatchNormTraining", {x, w, b}, {{"epsilon", af(eps)}}, 4);
    if (running_mean.defined() && running_var.defined()) {
      NoGradGuard ng;
      Tensor m = outs[1].detach(), v = outs[3].detach();
      if (m.dtype() != running_mean.dtype()) m = m.to(running_mean.dtype());
      if (v.dtype() != running_var.dtype()) v = v.to(running_var.dtype());
      running_mean.copy_(running_mean * (1.f - momentum) + m * momentum);
      running_var.copy_(running_var * (1.f - momentum) + v * momentum);
    }
    return outs[0];
  }
  if (!running_mean.defined() || !running_var.defined())
    fail(invalid_argument("batch_norm: evaluation mode needs running_mean and running_var"));
  return apply1("BatchNormalization", {x, w, b, running_mean, running_var}, {{"epsilon", af(eps)}});
}

Tensor layer_norm(const Tensor& x, int64_t normalized_dims, const Tensor& weight, const Tensor& bias, float eps) {
  need_defined(x, "layer_norm", "input");
  if (normalized_dims <= 0 || normalized_dims > x.rank())
    fail(invalid_argument("layer_norm: normalized_dims " + std::to_string(normalized_dims) + " for " + x.data().describe()));
  Shape ns(x.shape().end() - normalized_dims, x.shape().end());
  DType pdt = t_autocast != DType::kUndefined && x.dtype() != DType::kF64 ? DType::kF32 : x.dtype();
  Tensor w = weight.defined() ? weight : ones(ns, pdt, x.device());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&w, &bias})
    if (t->defined() && t->shape() != ns) fail(invalid_argument("layer_norm: weight/bias must be " + shape_to_string(ns)));
  std::map<std::string, Attribute> a = {{"axis", ai(x.rank() - normalized_dims)}, {"epsilon", af(eps)}};
  if (x.dtype() == DType::kF64) a["stash_type"] = ai(static_cast<int64_t>(DType::kF64));  // statistics in f64
  auto outs = apply("", "LayerNormalization", {x, w, bias}, a, 3);
  return outs[0];
}

Tensor dropout(const Tensor& x, float p, bool training) {
  need_defined(x, "dropout", "input");
  if (!(p >= 0.f && p < 1.f)) fail(invalid_argument("dropout: p must be in [0, 1), got " + std::to_string(p)));
  if (!training || p == 0.f) return x;
  std::bernoulli_distribution keep(1.0 - p);
  auto& g = generator();
  const double scale = 1.0 / (1.0 - p);
  Tensor mask = wrap_const(host_filled(x.shape(), x.dtype(), [&] { return keep(g) ? scale : 0.0; }), x.device());
  return x * mask;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  need_rank(weight, 2, "embedding", "weight");
  need_defined(indices, "embedding", "indices");
  if (indices.dtype() != DType::kI64 && indices.dtype() != DType::kI32)
    fail(invalid_argument("embedding: indices must be int64 or int32, got " + indices.data().describe()));
  return apply1("Gather", {weight, indices}, {{"axis", ai(0)}});
}

namespace {
// A view of `x` with shape `s` (same element count, checked by the callers), differentiable. The tracer records it
// as `traced` (Reshape to the constant shape, or Flatten with its axis so a traced batch dimension stays free).
Tensor reshaped_view(const Tensor& x, const Shape& s, const char* traced, int64_t flatten_axis);
}  // namespace

Tensor reshape(const Tensor& x, const std::vector<int64_t>& shape) {
  need_defined(x, "reshape", "input");
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) fail(invalid_argument("reshape: more than one -1 in " + shape_to_string(shape)));
      infer = static_cast<int64_t>(i);
    } else if (s[i] < 0) {
      fail(invalid_argument("reshape: negative dimension in " + shape_to_string(shape)));
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || x.numel() % known != 0)
      fail(invalid_argument("reshape: cannot reshape " + x.data().describe() + " to " + shape_to_string(shape)));
    s[static_cast<size_t>(infer)] = x.numel() / known;
  }
  if (shape_numel(s) != x.numel())
    fail(invalid_argument("reshape: cannot reshape " + x.data().describe() + " to " + shape_to_string(shape)));
  return reshaped_view(x, s, "Reshape", 0);
}

namespace {
Tensor reshaped_view(const Tensor& x, const Shape& s, const char* traced, int64_t flatten_axis) {
  Tensor out(check(x.data().reshaped(s), "reshape"), false);
  if (std::string(traced) == "Flatten")
    trace_record("", "Flatten", {{"axis", Attribute::of_int(flatten_axis)}}, {x}, {out});
  else
    trace_record("", "Reshape", {}, {x, ints_const(s)}, {out});
  if (t_grad_enabled && x.requires_grad()) {
    Shape from = x.shape();
    auto n = std::make_shared<FnBackward>();
    n->nm = "ReshapeBackward";
    n->fn = [from](std::vector<keel::Tensor>& g) { return std::vector<keel::Tensor>{check(g[0].reshaped(from), "reshape backward")}; };
    n->out_types = {ops::TypeShape{x.dtype(), s}};
    n->next.push_back(edge_of(x));
    out.impl()->requires_grad = true;
    out.impl()->grad_fn = n;
  }
  return out;
}
}  // namespace

Tensor flatten(const Tensor& x, int64_t axis) {
  need_defined(x, "flatten", "input");
  int64_t r = x.rank();
  if (axis < 0) axis += r;
  if (axis < 0 || axis > r) fail(invalid_argument("flatten: axis out of range for " + x.data().describe()));
  int64_t a = 1, b = 1;
  for (int64_t i = 0; i < r; ++i) (i < axis ? a : b) *= x.shape()[static_cast<size_t>(i)];
  return reshaped_view(x, {a, b}, "Flatten", axis);
}

Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm) {
  need_defined(x, "transpose", "input");
  if (static_cast<int64_t>(perm.size()) != x.rank())
    fail(invalid_argument("transpose: perm has " + std::to_string(perm.size()) + " entries for " + x.data().describe()));
  return apply1("Transpose", {x}, {{"perm", ais(perm)}});
}

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  if (xs.empty()) fail(invalid_argument("concat of no tensors"));
  for (const auto& t : xs) need_defined(t, "concat", "an input");
  return apply1("Concat", xs, {{"axis", ai(axis)}});
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  need_defined(x, "sum", "input");
  std::vector<Tensor> ins = {x};
  if (!axes.empty()) ins.push_back(ints_const(axes));
  return apply1("ReduceSum", ins, {{"keepdims", ai(keepdims ? 1 : 0)}});
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& axes, bool keepdims) {
  need_defined(x, "mean", "input");
  std::map<std::string, Attribute> a = {{"keepdims", ai(keepdims ? 1 : 0)}};
  if (!axes.empty()) a["axes"] = ais(axes);
  return apply1("ReduceMean", {x}, a);
}

Tensor argmax(const Tensor& x, int64_t axis, bool keepdims) {
  need_defined(x, "argmax", "input");
  return apply("", "ArgMax", {x}, {{"axis", ai(axis)}, {"keepdims", ai(keepdims ? 1 : 0)}}, 1, {}, false)[0];
}

namespace {
void check_reduction(const std::string& r, const char* op) {
  if (r != "mean" && r != "sum" && r != "none")
    fail(invalid_argument(std::string(op) + ": reduction must be mean, sum or none, got '" + r + "'"));
}
Tensor reduce_loss(const Tensor& l, const std::string& reduction) {
  if (reduction == "mean") return mean(l);
  if (reduction == "sum") return sum(l);
  return l;
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const std::string& reduction) {
  check_reduction(reduction, "cross_entropy");
  need_defined(logits, "cross_entropy", "logits");
  need_defined(target, "cross_entropy", "target");
  if (target.dtype() != DType::kI64 && target.dtype() != DType::kI32)
    fail(invalid_argument("cross_entropy: target must be int64 class indices, got " + target.data().describe()));
  if (logits.rank() < 2 || target.rank() != logits.rank() - 1 || target.dim(0) != logits.dim(0))
    fail(invalid_argument("cross_entropy: logits " + logits.data().describe() + " and target " + target.data().describe() +
                          " do not match ([N, C] and [N])"));
  auto outs = apply("", "SoftmaxCrossEntropyLoss", {logits, target}, {{"reduction", Attribute::of_string(reduction)}}, 2);
  return outs[0];
}

Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction) {
  check_reduction(reduction, "mse_loss");
  need_defined(input, "mse_loss", "input");
  need_defined(target, "mse_loss", "target");
  if (input.shape() != target.shape())
    fail(invalid_argument("mse_loss: input " + input.data().describe() + " and target " + target.data().describe() + " differ in shape"));
  Tensor d = input - target;
  return reduce_loss(d * d, reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, const std::string& reduction) {
  check_reduction(reduction, "binary_cross_entropy_with_logits");
  need_defined(logits, "binary_cross_entropy_with_logits", "logits");
  need_defined(target, "binary_cross_entropy_with_logits", "target");
  if (logits.shape() != target.shape())
    fail(invalid_argument("binary_cross_entropy_with_logits: logits " + logits.data().describe() + " and target " +
                          target.data().describe() + " differ in shape"));
  // max(x, 0) - x t + log(1 + exp(-|x|)), stable for large |x|.
  Tensor l = relu(logits) - logits * target + apply1("Softplus", {-abs(logits)});
  return reduce_loss(l, reduction);
}

// ------------------------------------------------------------------------------------------------ Tracer

Tracer::Tracer(std::string graph_name, int32_t opset) : impl_(std::make_unique<Impl>()) {
  if (t_tracer) fail(failed_precondition("a Tracer is already recording on this thread"));
  if (opset != kOpset)
    fail(invalid_argument("Tracer: eager ops run at opset " + std::to_string(kOpset) + "; opset " +
                          std::to_string(opset) + " requested"));
  impl_->graph.name = std::move(graph_name);
  impl_->opset = opset;
  impl_->graph.opsets = {{"", opset}};
  t_tracer = impl_.get();
}

Tracer::~Tracer() {
  if (t_tracer == impl_.get()) t_tracer = nullptr;
}

void Tracer::input(const Tensor& t, const std::string& name) {
  need_defined(t, "Tracer::input", "tensor");
  if (name.empty() || impl_->used.count(name)) fail(invalid_argument("Tracer::input: name '" + name + "' is empty or taken"));
  impl_->used.insert(name);
  impl_->names[t.impl().get()] = name;
  impl_->keep.push_back(t.impl());
  impl_->graph.inputs.push_back(name);
  impl_->graph.value_info[name] = ValueInfo{t.dtype(), t.shape()};
}

void Tracer::name_parameter(const Tensor& t, const std::string& name) {
  need_defined(t, "Tracer::name_parameter", "tensor");
  if (name.empty() || impl_->used.count(name))
    fail(invalid_argument("Tracer::name_parameter: name '" + name + "' is empty or taken"));
  if (impl_->names.count(t.impl().get()))
    fail(failed_precondition("Tracer::name_parameter('" + name + "'): the tensor was already used under another name"));
  impl_->used.insert(name);
  impl_->param_names[t.impl().get()] = name;
  impl_->keep.push_back(t.impl());
}

void Tracer::output(const Tensor& t, const std::string& name) {
  need_defined(t, "Tracer::output", "tensor");
  std::string v = impl_->name_of(t);
  if (!name.empty() && name != v) {
    if (impl_->used.count(name)) fail(invalid_argument("Tracer::output: name '" + name + "' is taken"));
    impl_->used.insert(name);
    Node n;
    n.op_type = "Identity";
    n.name = impl_->fresh("Identity_");
    n.inputs = {v};
    n.outputs = {name};
    impl_->graph.add_node(std::move(n));
    impl_->graph.value_info[name] = ValueInfo{t.dtype(), t.shape()};
    v = name;
  }
  impl_->graph.outputs.push_back(v);
}

StatusOr<Graph> Tracer::graph() {
  if (t_tracer == impl_.get()) t_tracer = nullptr;
  impl_->stopped = true;
  Graph& g = impl_->graph;
  if (g.outputs.empty()) return failed_precondition("Tracer::graph: no outputs were marked (Tracer::output)");
  if (impl_->uses_keel) g.opsets["keel"] = 1;
  // Keep only what the outputs need: walk back from them.
  KEEL_ASSIGN_OR_RETURN(auto order, g.topological_order(), "Tracer::graph");
  std::unordered_set<std::string> needed(g.outputs.begin(), g.outputs.end());
  std::unordered_set<NodeId> keep;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node* n = g.node(*it);
    bool wanted = false;
    for (const auto& o : n->outputs) wanted = wanted || (!o.empty() && needed.count(o));
    if (!wanted) continue;
    keep.insert(*it);
    for (const auto& in : n->inputs)
      if (!in.empty()) needed.insert(in);
  }
  for (NodeId id : order)
    if (!keep.count(id)) KEEL_RETURN_IF_ERROR(g.remove_node(id), "Tracer::graph");
  for (auto it = g.initializers.begin(); it != g.initializers.end();) {
    if (!needed.count(it->first)) it = g.initializers.erase(it);
    else ++it;
  }
  std::vector<std::string> inputs;
  for (const auto& in : g.inputs)
    if (needed.count(in)) inputs.push_back(in);
  g.inputs = inputs;
  // Recorded shapes are exact; ONNX inference checks them and fills what was not recorded.
  for (auto it = g.value_info.begin(); it != g.value_info.end();) {
    if (!needed.count(it->first)) it = g.value_info.erase(it);
    else ++it;
  }
  KEEL_RETURN_IF_ERROR(g.validate(), "Tracer::graph");
  KEEL_RETURN_IF_ERROR(infer_shapes(g), "Tracer::graph");
  return g;
}

}  // namespace keel::eager
