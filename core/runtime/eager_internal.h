// keel/core/runtime/eager_internal.h — (internal) what the pieces of the eager runtime share. The public API is
// eager.h; this header is for its implementation files only:
//
//   eager_runtime.cc   the process-wide runtime (environment, default device, generator, statistics), device
//                      helpers (names, memory types, allocation, copies, small device constants)
//   eager_dispatch.cc  one op call on tensors: the kernel cache, kernel choice (kernel_dispatch.h), run_kernel, the
//                      CPU fallback of devices that lack a kernel
//   eager_autograd.cc  op application (autocast, dispatch, recording), grad_fn nodes, backward, leaf hooks
//   eager_tensor.cc    Tensor's methods, the thread-local guards, conversions and arithmetic operators
//   eager_ops.cc       factories, the functional ops, losses
//   eager_tracer.cc    the tracer (eager ops to graph IR)
//   eager_deferred.cc  deferred convolutions (conv2d waits for the relu / max_pool2d that reads it, to fuse them)
//
// Thread-safety as eager.h states it: the runtime and the kernel cache are guarded by their mutexes (Runtime below);
// a CachedKernel computes under its run_mu; the thread-locals are the calling thread's guards and tracer.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/base/registry.h"
#include "core/base/thread_pool.h"
#include "core/runtime/eager.h"
#include "core/runtime/kernel_context.h"
#include "hal/device.h"
#include "ops/gradients.h"

namespace keel::eager::detail {

// The opset eager ops run at (ai.onnx; keel-domain ops at 1).
constexpr int32_t kOpset = 17;

[[noreturn]] void fail(Status s);
template <class T>
T check(StatusOr<T> v, const std::string& context) {
  if (!v.is_ok()) fail(v.status().with_context(context));
  return std::move(v).value();
}

// ------------------------------------------------------------------------------------------------ runtime state

// A kernel instance for one call signature (device, op, attributes, input dtypes/shapes, wanted outputs).
struct CachedKernel {
  Node node;  // domain, op_type, attrs; inputs/outputs name the call's slots ("" = absent / not wanted)
  int32_t opset = kOpset;
  std::vector<DType> out_dtypes;
  std::string device;        // device the kernel runs on: its type, or "type:index" for an index > 0 (device_name)
  int32_t device_index = 0;  // that device's index (what the kernel context reports)
  std::string memory_type;   // where its outputs live ("cpu" for host-memory devices; device_name form)
  Location memory_at;        // the same as a location
  CachingAllocator* alloc = nullptr;
  std::string kernel_name;
  keel_status_t (*compute)(void*, keel_kernel_context_t*) = nullptr;
  void (*release)(void*) = nullptr;
  void* state = nullptr;
  // Lower-ranked kernels of the device, tried in order when this one rejects a call at run time (under run_mu).
  std::vector<const KernelEntry*> alternatives;
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

// Eager's copies into a device that leave the host free (copy_async, eager_runtime.cc: uploads, and copies within the
// device): a device's stream for them and the two events that order it after, and then before, the work eager queues
// on the device's default stream.
struct CopyStream {
  bool usable = false;  // false: the device has no streams or events (copies complete on return instead)
  hal::Stream stream;
  hal::Event before, after;
};

struct Runtime {
  std::mutex mu;
  std::shared_ptr<Environment> env;
  std::unique_ptr<ThreadPool> own_pool;
  ThreadPool* pool = nullptr;
  // Ops whose inputs hold fewer bytes than this run on one thread (serial_pool): see pool_for() in
  // eager_dispatch.cc. KEEL_EAGER_SERIAL_BYTES overrides it (0: every op on `pool`).
  ThreadPool serial_pool{1};
  const uint64_t serial_bytes = [] {
    const char* v = std::getenv("KEEL_EAGER_SERIAL_BYTES");
    return v ? std::strtoull(v, nullptr, 10) : uint64_t{4} << 20;
  }();
  std::string default_device = "cpu";
  std::mt19937_64 gen{0x6b65656cull};
  std::mutex cache_mu;
  std::unordered_map<std::string, std::unique_ptr<CachedKernel>> cache;
  std::atomic<uint64_t> ops{0}, hits{0}, misses{0};
  std::unordered_set<std::string> warned;
  // Device copies of small constant operands by content (device_constant); cleared with the kernel cache.
  std::mutex const_mu;
  std::unordered_map<std::string, keel::Tensor> consts;
  // One CopyStream per device ("cuda:0"), made at its first copy; released before the environment changes.
  std::mutex copy_mu;
  std::map<std::string, std::unique_ptr<CopyStream>> copy_streams;
  std::atomic<bool> profiling{std::getenv("KEEL_EAGER_PROFILE") != nullptr};
  // KEEL_EAGER_PROFILE=sync: each op's wall time with its device waited for before and after it (what the op costs
  // on an asynchronous device such as a GPU, launch and kernel together) instead of the process's CPU time.
  const bool profile_sync =
      std::getenv("KEEL_EAGER_PROFILE") != nullptr && std::string(std::getenv("KEEL_EAGER_PROFILE")) == "sync";
  std::mutex prof_mu;
  std::map<std::string, std::pair<double, uint64_t>> prof;  // "op kernel" -> (ms, calls)
};

// The process-wide runtime (never destroyed: kernels may still be released by late tensors).
Runtime& rt();

// This thread's NoGradGuard, AutocastGuard and Tracer state.
extern thread_local bool t_grad_enabled;
extern thread_local DType t_autocast;
extern thread_local Tracer::Impl* t_tracer;

// ------------------------------------------------------------------------------------------------ tensor impl

struct GradNode;
struct DeferredConv;

struct TensorImpl {
  // Set from creation while the value is a deferred conv2d (eager_deferred.cc) not computed yet: `data` and
  // `grad_fn` are empty until need() computes it (under deferred->mu; `pending` cleared last, with release order).
  // `deferred` itself never changes after creation, so shape queries may read it while pending.
  std::shared_ptr<DeferredConv> deferred;
  std::atomic<bool> pending{false};
  keel::Tensor data;
  bool requires_grad = false;
  std::shared_ptr<GradNode> grad_fn;  // null for leaves
  uint32_t output_nr = 0;
  Tensor grad;
  std::weak_ptr<GradNode> accumulator;  // leaves: the node that accumulates into grad
  std::vector<std::pair<int64_t, Tensor::PostAccumulateGradHook>> post_accumulate_hooks;  // leaves only
  int64_t next_hook = 1;
};

// The impl of a defined tensor (Error for an undefined one), computed first if it was deferred.
const TensorImpl& need(const std::shared_ptr<TensorImpl>& p);
// Errors naming the op and the argument: `t` undefined, or not of rank r.
void need_defined(const Tensor& t, const char* op, const char* what);
void need_rank(const Tensor& t, int64_t r, const char* op, const char* what);

// ------------------------------------------------------------------------------------------------ device helpers

// Device names inside eager: the type for index 0 ("cuda", as before indices), "type:index" otherwise ("cuda:1").
std::string device_name(const std::string& type, int32_t index);
std::string device_name(const Location& at);
// A device spec ("cuda:1", "cuda") checked against the environment (Error naming it when malformed or absent).
DeviceSpec spec_of(const std::string& device);
// Where outputs of `device` live: "cpu" for host-memory devices, else the device's name.
std::string memory_type_of(const std::string& device);
// A new tensor in memory of `mem_type`, from that memory's caching allocator.
keel::Tensor alloc_tensor(DType dtype, const Shape& shape, const std::string& mem_type);
// A copy of `t` in memory of `mem_type` (host <-> device through the device table).
keel::Tensor copy_to(const keel::Tensor& t, const std::string& mem_type);
// Copies src's bytes into dst (same byte size), dst in a device's memory and src on the host or in the same device,
// without the host waiting for the device: on the device's copy stream, ordered after the work eager has queued there
// and before what it queues next. False, with nothing done, where the device cannot order such a copy (no streams or
// events), for other pairs of locations, or under KEEL_EAGER_COPY=sync: the caller then copies on the default stream,
// which completes before it returns.
bool copy_async(const keel::Tensor& dst, const keel::Tensor& src);
keel::Tensor to_host(const keel::Tensor& t);
// Waits for the work queued on `device` (a device name as above; nothing to wait for on host-memory devices).
void synchronize_device(const std::string& device);
// A read-only copy of a small host constant in memory of `mem_type`, shared by every op that uses the same value
// there (see eager_runtime.cc). Never hand the result to user code that may write into it.
keel::Tensor device_constant(const keel::Tensor& host, const std::string& mem_type);
// A rank-0 host tensor of dtype `dt` holding v (ops::scalar_constant; Error for a dtype without numbers).
keel::Tensor host_scalar(double v, DType dt);

// ------------------------------------------------------------------------------------------------ dispatch

// Small host integer tensors (at most 16 elements): candidates for shape-like inputs.
bool is_small_int(const keel::Tensor& t);
// Shape-like integer inputs (a Reshape's shape, a ReduceSum's axes, Split sizes, ...): their values are part of the
// kernel-cache key, kernels see them as constants at create time (as a graph's initializers), and gradient rules
// read them. Data inputs (Gather indices, labels) are never treated so, whatever their size.
bool is_shape_input(const std::string& domain, const std::string& op_type, size_t i, const keel::Tensor& t);
// "Op" for ai.onnx, "domain.Op" otherwise.
std::string op_label(const std::string& domain, const std::string& op_type);

// Runs one op on the given tensors (no autograd). Returns num_outputs tensors (undefined where not wanted). A device
// whose memory is its own falls back to the CPU for a call it has no kernel for. *out_kernel receives the cached
// kernel the call ran (its node, opset and gradient programs); on_cpu runs it on the CPU whatever its inputs' device.
std::vector<keel::Tensor> run_kernel(const std::string& domain, const std::string& op_type,
                                     const std::map<std::string, Attribute>& attrs,
                                     const std::vector<keel::Tensor>& inputs, size_t num_outputs,
                                     const std::vector<bool>& wanted, CachedKernel** out_kernel = nullptr,
                                     bool on_cpu = false);
keel::Tensor run1(const std::string& op_type, const std::vector<keel::Tensor>& inputs,
                  const std::map<std::string, Attribute>& attrs = {}, const std::string& domain = "");

// ------------------------------------------------------------------------------------------------ autograd

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

// A node with a C++ backward (device copies, views).
struct FnBackward : GradNode {
  std::string nm;
  std::function<std::vector<keel::Tensor>(std::vector<keel::Tensor>&)> fn;
  std::string name() const override { return nm; }
  std::vector<keel::Tensor> apply(std::vector<keel::Tensor>& g) override { return fn(g); }
};

// The edge a gradient of `t` flows along: its grad_fn, or its leaf accumulator; empty when it needs no gradient.
Edge edge_of(const Tensor& t);
// For an op made outside apply() from one input (a device copy, a view, a custom function): records on `out` a grad_fn
// named `name` that maps out's gradient to x's with `fn`; nothing when grad mode is off or x needs no gradient.
void record_unary_grad(Tensor& out, const Tensor& x, const std::string& name,
                       std::function<keel::Tensor(const keel::Tensor&)> fn);

// The core of every op: autocast, dispatch, autograd recording, tracing.
std::vector<Tensor> apply(const std::string& domain, const std::string& op_type, std::vector<Tensor> inputs,
                          const std::map<std::string, Attribute>& attrs, size_t num_outputs,
                          std::vector<bool> wanted = {}, bool differentiable = true);
Tensor apply1(const std::string& op_type, std::vector<Tensor> inputs,
              const std::map<std::string, Attribute>& attrs = {}, const std::string& domain = "");
Tensor cast_to(const Tensor& t, DType dt);
// Under autocast (t_autocast set): whether apply() would run `op_type` of `domain` in the autocast dtype for these
// inputs on their device, i.e. a kernel takes it there ranked at least as high as the f32 one (else the op runs in
// f32, as on a CPU whose only f16 convolution is the reference kernel). False without autocast.
bool autocast_runs_low(const std::string& domain, const std::string& op_type, const std::vector<Tensor>& inputs);
// Runs backward from `root` with the gradient `root_grad` of it.
void run_backward(const Tensor& root, keel::Tensor root_grad);

// Attribute and constant helpers of the ops.
inline Attribute ai(int64_t v) { return Attribute::of_int(v); }
inline Attribute ais(std::vector<int64_t> v) { return Attribute::of_ints(std::move(v)); }
inline Attribute af(float v) { return Attribute::of_float(v); }
// A constant (no grad) on `device` from a host tensor.
Tensor wrap_const(keel::Tensor host, const std::string& device);
// A rank-0 constant of t's dtype on t's device.
Tensor scalar_like(const Tensor& t, double v);
// A host int64 1-D constant.
Tensor ints_const(const std::vector<int64_t>& v);

// ------------------------------------------------------------------------------------------------ deferred convs

// A conv2d() whose computation waits until the op that reads its output is known, so that `relu(conv2d(...))` and
// `max_pool2d(relu(conv2d(...)), k)` written one call at a time (PaddlePaddle's and PyTorch's layer-by-layer
// forward) run as conv2d_relu / conv2d_relu_max_pool2d: one kernel, the convolution's output never stored whole for
// the pooled form. Only on a host device, for f32 operands (or under autocast, operands in its dtype), outside a
// tracer. The result is the same as the separate calls' (the fused ops are documented to give the same values and
// gradients; under autocast the pooled form may compute a first layer in f32, its result then cast to the dtype the
// separate calls give). Any other use of a deferred tensor (its data, its grad_fn, another op) computes it first, under
// the guards it was called with, from its inputs' values at that time; writers into tensors' storage (copy_, set_data_,
// optimizer steps) compute those that read that storage before writing (compute_pending_reading below,
// eager::compute_deferred). Deferred tensors are thread-safe as other tensors: need() computes one once, under its
// mutex.
// The conv2d call itself: what a relu over it copies and a fused pooling calls again.
struct ConvCall {
  Tensor x, w, b;
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
  bool grad_enabled = true;            // t_grad_enabled at the call
  DType autocast = DType::kUndefined;  // t_autocast at the call
  Shape shape;                         // the output's
  DType dtype = DType::kF32;           // the output's (the autocast dtype where the convolution runs in it)
};
struct DeferredConv : ConvCall {
  bool relu = false;               // a relu() over the convolution folded in
  std::weak_ptr<TensorImpl> conv;  // relu: the convolution's own tensor (once computed, relu reads it)
  std::mutex mu;                   // guards x, w, b (released once computed) and the computation
};

// conv2d's deferred form: a pending tensor, or an undefined one where the call is not deferred (then run it now).
Tensor defer_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, std::array<int64_t, 2> stride,
                    std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups);
// relu(x) of a pending convolution without one: the same convolution with its relu, pending. Else undefined.
Tensor defer_relu(const Tensor& x);
// max_pool2d(x) of a pending convolution with its relu, where the pooling is conv2d_relu_max_pool2d's: that op's
// result (computed now). Else undefined.
Tensor fuse_max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                       std::array<int64_t, 2> padding);
// Computes a pending tensor (need() calls it); nothing when it is not pending.
void compute_pending(TensorImpl& t);
// Computes the pending tensors (of any thread) that read memory overlapping `storage`, before it is written in place.
void compute_pending_reading(const keel::Tensor& storage);
// While alive, this thread defers nothing (inside the fused ops and while a deferred tensor is computed).
class NoDeferGuard {
 public:
  NoDeferGuard();
  ~NoDeferGuard();
  NoDeferGuard(const NoDeferGuard&) = delete;
  NoDeferGuard& operator=(const NoDeferGuard&) = delete;
};

// ------------------------------------------------------------------------------------------------ tracer

// Records an op on this thread's tracer, if one is recording.
void trace_record(const std::string& domain, const std::string& op_type, const std::map<std::string, Attribute>& attrs,
                  const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs);

}  // namespace keel::eager::detail
