// keel/core/runtime/eager.h — eager tensors (the dynamic graph): ops that run at once through the same kernel
// registry as the graph executor, with reverse-mode autograd, autocast to bf16/fp16, and a tracer that turns a run of
// eager ops into graph IR ("to_static").
//
// Dispatch: every op picks the highest-priority kernel for the device of its inputs (the same kernels a Session uses),
// and caches the kernel instance per (op, attributes, input dtypes/shapes, device), so a training step does not
// re-create kernels (oneDNN primitives); outputs come from the device's caching allocator of the environment.
//
// Autograd: an op whose inputs require grad records a grad_fn node; Tensor::backward() walks the graph of nodes in
// reverse topological order and accumulates gradients into the .grad of leaves. Each node keeps only the tensors its
// gradient rule reads (the rules live with the op definitions, ops/gradients.h, and emit keel-domain backward ops
// such as keel.ConvGrad that every device can implement). The graph is freed by backward (no retain_graph).
//
// Errors: every op throws eager::Error (a Status inside) on bad input — shape or dtype mismatch, no kernel for the op
// on the device, ... — with a message naming the op and the problem. Nothing aborts.
//
// Threading: the environment and the kernel cache are process-wide and internally synchronised (two threads may run
// eager ops at once; one kernel instance is never computed from two threads at once); the global generator is not
// (randn, rand_uniform and dropout draw from it: call them from one thread at a time).
// NoGradGuard, AutocastGuard and Tracer are thread-local: they affect the ops of the thread that made them.
// A Tensor is a handle: copies share data and autograd state; reading one Tensor from several threads is safe,
// mutating it (requires_grad_, set_grad, copy_, backward) needs external synchronisation.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/base/dtype.h"
#include "core/base/graph.h"
#include "core/base/status.h"
#include "core/base/tensor.h"
#include "core/runtime/environment.h"

namespace keel::eager {

// What every eager op throws on failure; what() is status().to_string().
class Error : public std::runtime_error {
 public:
  explicit Error(Status s);
  const Status& status() const { return status_; }

 private:
  Status status_;
};

// --- the runtime -------------------------------------------------------------------------------------------------

// Binds eager ops to `env` (kernel registry, devices, pools). threads > 0 sets the kernels' thread count (a pool the
// eager runtime owns); 0 uses the environment's pool. Clears the kernel cache. Call before any op runs on another
// thread. If init() is never called, the first op creates a default environment that discovers plugins like the
// `keel` CLI does (the built-in reference device plus the plugin search path: KEEL_PLUGIN_PATH, the user's
// directory, the install directory / the build tree's plugin folder next to the running binary); the default
// environment sets OMP_WAIT_POLICY=PASSIVE (unless set) before loading plugins: OpenMP threads that spin between
// eager ops' short parallel regions cost more than they save (hosts that create their own environment for eager
// training should do the same before Environment::create). An op whose inputs hold less than 4 MiB runs its kernel
// on one thread (KEEL_EAGER_SERIAL_BYTES sets that size; 0: every op on the pool), as PyTorch's parallel_for keeps
// work under its grain on one thread: a parallel region costs a wake-up and moves the op's data between cores.
void init(std::shared_ptr<Environment> env, int threads = 0);
// The bound environment (creating the default one on first use; throws Error when that fails).
Environment& environment();
// Default device for factories ("cpu" unless set): "TYPE" or "TYPE:INDEX" ("cuda:1"). Throws Error naming the spec
// when it is malformed or no such device is registered. default_device() names it as Tensor::device() does.
void set_device(const std::string& device);
const std::string& default_device();
// Seeds the global generator (used by randn, rand_uniform, dropout).
void manual_seed(uint64_t seed);
// The global generator; not synchronised (use it from one thread at a time).
std::mt19937_64& generator();

namespace detail {
struct TensorImpl;
}

// --- tensors -----------------------------------------------------------------------------------------------------

class Tensor {
 public:
  Tensor();  // undefined
  // Wraps `data` (any device of the environment). A leaf; requires_grad only for floating dtypes (else Error).
  explicit Tensor(keel::Tensor data, bool requires_grad = false);

  bool defined() const;
  const keel::Tensor& data() const;  // storage on its device; Error when undefined
  const Shape& shape() const;
  int64_t dim(int i) const;  // negative i counts from the end; Error when out of range
  int64_t rank() const;
  int64_t numel() const;
  DType dtype() const;
  // Where the data is: the device type for index 0 ("cpu", "cuda"), "type:index" for another index ("cuda:1").
  std::string device() const;

  // A copy on another device, "TYPE" (index 0) or "TYPE:INDEX" ("cuda:1", keel::DeviceSpec); differentiable (the
  // gradient goes back to this device). Same device: *this. Between two devices of one type the copy is a peer copy
  // where the device table has one, else it goes through the host. Error naming the spec when it is malformed or
  // the device does not exist. Ops on tensors of two different devices (also two indices of one type) are an Error.
  Tensor to(const std::string& device) const;
  // Cast (ONNX Cast); differentiable between floating dtypes. Same dtype: *this.
  Tensor to(DType dtype) const;

  bool requires_grad() const;
  // Marks a leaf as requiring grad (Error on a non-leaf or a non-floating tensor when on = true).
  Tensor& requires_grad_(bool on = true);
  // True for tensors not produced by a recorded op (user-made tensors, parameters, detach()ed tensors).
  bool is_leaf() const;
  Tensor grad() const;             // undefined until a backward reached it
  void set_grad(const Tensor& g);  // g must match shape and dtype (or be undefined)
  void zero_grad();                // grad becomes undefined (PyTorch set_to_none=True)
  // Reverse-mode autograd from this tensor. grad_output defaults to ones for a one-element tensor (Error otherwise).
  // Gradients are accumulated (added) into .grad of the leaves that require grad. The graph behind this tensor is
  // released afterwards: a second backward through it is an Error.
  void backward(const Tensor& grad_output = {}) const;
  // Same data, no autograd history, requires_grad false.
  Tensor detach() const;

  // Post-accumulate-grad hooks (PyTorch's register_post_accumulate_grad_hook): on a leaf that requires grad, `hook`
  // runs on the backward's thread once that backward has added every contribution of the pass to this leaf's .grad
  // (it sees the accumulated grad, gradient accumulation included). It does not run when no gradient reached the
  // leaf in that backward. Hooks run in registration order, under the backward's NoGradGuard; an exception a hook
  // throws leaves backward (the rest of the graph is not walked). Returns a handle for remove; the hook lives with
  // the tensor's shared state (every handle copy of it). Error on a non-leaf or a tensor that does not require grad.
  using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;
  int64_t register_post_accumulate_grad_hook(PostAccumulateGradHook hook);
  // Removes a hook by its handle; false when the handle is unknown (already removed). Safe inside a hook.
  bool remove_post_accumulate_grad_hook(int64_t handle);

  float item() const;  // one element of any float dtype (or integer), copied to the host
  template <class T>
  std::vector<T> to_vector() const;  // host copy; T must match dtype's size (float for f32, int64_t for i64, ...)
  // Copies src's values into this tensor's storage (same shape; dtype converted between floating types, device
  // copied). Into a device from the host or from the same device the copy is queued on the device and the host goes
  // on (what eager queues next reads the copied values); into the host it is complete on return. No autograd: for
  // optimizers and load_state_dict. Error on a non-leaf that requires grad.
  void copy_(const Tensor& src);
  // Makes this tensor hold src's storage instead of its own (no copy; PyTorch's `p.data = src`): src must have this
  // tensor's shape, dtype and device (else Error). Every handle of this tensor sees the new values; a tensor that
  // shares the old storage (detach() taken before) keeps the old ones. For optimizers that compute new values out of
  // place (saves copy_'s copy). Error on a non-leaf that requires grad.
  void set_data_(const Tensor& src);

  // Internal: the shared implementation (autograd state, data). Equal impls mean the same tensor.
  const std::shared_ptr<detail::TensorImpl>& impl() const { return impl_; }
  explicit Tensor(std::shared_ptr<detail::TensorImpl> impl);

 private:
  std::shared_ptr<detail::TensorImpl> impl_;
};

// Elementwise arithmetic with ONNX (numpy) broadcasting; a float operand becomes a scalar of the tensor's dtype.
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, float b);
Tensor operator-(const Tensor& a, float b);
Tensor operator*(const Tensor& a, float b);
Tensor operator/(const Tensor& a, float b);
Tensor operator+(float a, const Tensor& b);
Tensor operator-(float a, const Tensor& b);
Tensor operator*(float a, const Tensor& b);
Tensor operator/(float a, const Tensor& b);
Tensor operator-(const Tensor& a);

// --- factories (on default_device() unless `device` is given) -----------------------------------------------------

Tensor zeros(const Shape& shape, DType dtype = DType::kF32, const std::string& device = "");
Tensor ones(const Shape& shape, DType dtype = DType::kF32, const std::string& device = "");
Tensor full(const Shape& shape, float value, DType dtype = DType::kF32, const std::string& device = "");
// Uninitialised memory from the device's pool (torch.empty): for a buffer that is written in full before it is read.
Tensor empty(const Shape& shape, DType dtype = DType::kF32, const std::string& device = "");
Tensor randn(const Shape& shape, float stddev = 1.f, DType dtype = DType::kF32);  // global generator
Tensor rand_uniform(const Shape& shape, float lo, float hi, DType dtype = DType::kF32);
Tensor from_vector(const std::vector<float>& v, const Shape& shape);    // f32; v.size() must equal the numel
Tensor from_vector(const std::vector<int64_t>& v, const Shape& shape);  // i64
// A read-only copy of a small tensor (at most 256 bytes, e.g. a step's scalars) on `device`, shared with every other
// use of the same value there (cached by content): after its first use a value costs no upload, which on a device
// means no wait for the device. Larger tensors are plain copies. Never write into the result (copy_, set_data_).
Tensor cached_constant(const Tensor& t, const std::string& device);

// --- autograd and autocast scopes (thread-local, nestable) --------------------------------------------------------

// Computes the values conv2d calls deferred (see conv2d; of any thread) that read `written`'s storage, or (no
// argument) every one still alive: before writing into a tensor's storage other than through copy_ / set_data_
// (which do it themselves).
void compute_deferred(const Tensor& written);
void compute_deferred();

// While alive, ops record no autograd history.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
bool grad_enabled();

// While alive, ops follow the autocast policy: Conv, ConvTranspose, MatMul and Gemm (conv2d, conv2d_relu,
// conv_transpose2d, matmul, linear) run in `low` (their floating inputs are cast, differentiably); reductions,
// softmax/log_softmax, norms and losses run in fp32 (low-precision inputs are cast up); other ops run in the dtype of
// their inputs (mixed inputs promote to the widest). When the device has no kernel for `low`, or only one that ranks
// below its f32 kernel (the reference f16 Gemm beside the CPU plugin's f32 one), the op runs in fp32 (logged once).
// `low` must be kBF16 or kF16 (Error otherwise). A nested guard replaces the policy until it goes.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType low);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType prev_;
};
// kUndefined when no autocast is active on this thread.
DType autocast_dtype();

// --- ops (ONNX semantics; every op dispatches through the kernel registry) ----------------------------------------

Tensor matmul(const Tensor& a, const Tensor& b);
// x [..., in] · w[out, in]ᵀ + b[out]; b may be undefined.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);
// NCHW; w [out, in/groups, kh, kw]; b [out] or undefined.
// Deferred fusion: on a CPU device (f32 operands, or under autocast its dtype), outside a Tracer, conv2d returns a
// tensor whose value is computed at its first use, so that relu(conv2d(...)) and max_pool2d(relu(conv2d(...)), k)
// (windows at their own stride, no padding) written as separate calls, as PaddlePaddle's and PyTorch's users write a
// layer's forward, run as conv2d_relu and conv2d_relu_max_pool2d: the same values and gradients, one kernel (under
// autocast, the pooled form's f32 first layer is cast to the dtype the separate calls give). Shape, dtype, device and
// requires_grad are known at once; anything else (data, item, another op, backward) computes it first, from the
// inputs' values at that moment and under the guards the call was made with. Writes into an input through copy_ or
// set_data_, and optimizer steps, compute the deferred values that read it first; code that writes into a tensor's
// storage itself (through data()) calls compute_deferred(t) before. KEEL_EAGER_DEFER=0 turns it off.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, std::array<int64_t, 2> stride = {1, 1},
              std::array<int64_t, 2> padding = {0, 0}, std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1);
// relu(conv2d(...)) as one kernel where the device has one (keel.FusedConv with its Relu fused: the convolution's
// output is written once, already rectified), else as the two ops; same values and gradients either way, and a
// max_pool2d over it still takes the Relu's backward over the pooled tensor. A Tracer records Conv and Relu.
Tensor conv2d_relu(const Tensor& x, const Tensor& w, const Tensor& b, std::array<int64_t, 2> stride = {1, 1},
                   std::array<int64_t, 2> padding = {0, 0}, std::array<int64_t, 2> dilation = {1, 1},
                   int64_t groups = 1);
// max_pool2d(conv2d_relu(...), pool) (windows `pool` at stride `pool`, no padding) as one kernel on a CPU device
// (keel.FusedConvMaxPool: the convolution's output is pooled where it is made and never stored whole; the backward
// routes the pooled gradient straight into the convolution's, in the layout its kernels want), else as the separate
// ops; same values and gradients either way. The separate ops also run under a Tracer (an export stays plain ONNX)
// and for f64; under autocast, over more than 4 input channels (over fewer the fused op runs in f32: a first layer's
// few MFLOP gain nothing in 16 bits, and its output, what bounds it, is pooled before it is stored).
Tensor conv2d_relu_max_pool2d(const Tensor& x, const Tensor& w, const Tensor& b, std::array<int64_t, 2> pool,
                              std::array<int64_t, 2> stride = {1, 1}, std::array<int64_t, 2> padding = {0, 0},
                              std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1);
// NCHW; w [in, out/groups, kh, kw]; b [out] or undefined.
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& b, std::array<int64_t, 2> stride = {1, 1},
                        std::array<int64_t, 2> padding = {0, 0}, std::array<int64_t, 2> output_padding = {0, 0},
                        int64_t groups = 1);
// stride {0,0} = kernel. Padding counts on both sides (PyTorch); avg_pool2d counts padded cells (count_include_pad).
Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                  std::array<int64_t, 2> padding = {0, 0});
Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride = {0, 0},
                  std::array<int64_t, 2> padding = {0, 0});
Tensor global_avg_pool2d(const Tensor& x);  // [N,C,H,W] -> [N,C,1,1]
Tensor relu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor gelu(const Tensor& x);  // exact (erf) form
Tensor leaky_relu(const Tensor& x, float slope = 0.01f);
Tensor softmax(const Tensor& x, int64_t axis = -1);
Tensor log_softmax(const Tensor& x, int64_t axis = -1);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor pow(const Tensor& x, float exponent);
Tensor clamp(const Tensor& x, float lo, float hi);
// NCHW / NC. training = true uses batch statistics and updates running_mean/var in place (new = (1-m)*old +
// m*batch, the unbiased variance for the running estimate; not recorded by autograd); training = false uses the
// running ones. weight/bias may be undefined (then 1 and 0).
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& running_mean, Tensor& running_var,
                  bool training, float momentum = 0.1f, float eps = 1e-5f);
// Normalises over the trailing `normalized_dims` dims; weight/bias (shape = those dims) may be undefined.
Tensor layer_norm(const Tensor& x, int64_t normalized_dims, const Tensor& weight, const Tensor& bias,
                  float eps = 1e-5f);
// Zeroes elements with probability p and scales the rest by 1/(1-p); identity when !training or p == 0. p must be in
// [0, 1). Each call takes one value of the global generator as the seed of its mask (a SplitMix64 stream over the
// elements), so manual_seed makes masks repeat, on any CPU.
Tensor dropout(const Tensor& x, float p, bool training);
Tensor embedding(const Tensor& weight /*[V,D]*/, const Tensor& indices /*int64, any shape*/);  // -> [..., D]
// Views (no copy; the result shares storage with x). -1 in shape: inferred.
Tensor reshape(const Tensor& x, const std::vector<int64_t>& shape);
Tensor flatten(const Tensor& x, int64_t axis = 1);  // -> 2-D [prod(dims < axis), prod(dims >= axis)]
Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm);
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes = {} /*all*/, bool keepdims = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false);
Tensor argmax(const Tensor& x, int64_t axis, bool keepdims = false);  // int64, never requires grad

// Losses. reduction: "mean" | "sum" | "none" (Error otherwise).
// logits [N,C] (or [N,C,d...]), target int64 [N] (or [N,d...]); fused log-softmax + NLL (one kernel).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const std::string& reduction = "mean");
Tensor mse_loss(const Tensor& input, const Tensor& target, const std::string& reduction = "mean");
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        const std::string& reduction = "mean");

// Runs any registered op (domain "" = ONNX, "keel" = Keel's own) on eager tensors at the eager opset, with autograd
// when ops/gradients.h has a rule for it. `num_outputs` outputs are returned; absent optional inputs are undefined
// Tensors. The escape hatch for ops without a wrapper above.
std::vector<Tensor> call_op(const std::string& domain, const std::string& op_type, const std::vector<Tensor>& inputs,
                            const std::map<std::string, Attribute>& attrs = {}, size_t num_outputs = 1);

// A differentiable function the caller defines, for what no op expresses (a collective across processes, a call into
// another library): y = forward(x) runs outside autograd and returns y's storage; when x requires grad, backward
// maps dL/dy to dL/dx (same shape and dtype as x) during Tensor::backward(). torch.autograd.Function for one input and
// one output. `name` names the node in errors. Both may throw Error.
using CustomFn = std::function<keel::Tensor(const keel::Tensor&)>;
Tensor custom_function(const Tensor& x, const CustomFn& forward, CustomFn backward, const std::string& name);

// Dispatch statistics (process-wide): kernel-cache hits and misses (a miss creates a kernel instance).
struct DispatchStats {
  uint64_t ops = 0, cache_hits = 0, cache_misses = 0;
};
DispatchStats dispatch_stats();
void clear_kernel_cache();  // releases every cached kernel instance
// Per-kernel timing of eager ops (off by default; KEEL_EAGER_PROFILE=1 turns it on at start-up, =sync times each op
// on an asynchronous device in wall time between two waits for the device, so that the GPU's own time shows).
void set_profiling(bool on);
bool profiling();  // whether it is on
// One line per (op, kernel, input types): calls, total and mean process-CPU milliseconds (all threads; wall
// milliseconds of device ops under KEEL_EAGER_PROFILE=sync), slowest first; clears the counters.
std::string profile_report();

// --- tracing ("to_static") ----------------------------------------------------------------------------------------

// While a Tracer is alive on this thread, every eager op is recorded as a graph node (autocast casts included).
// Tensors given to input() become graph inputs; tensors that were not produced by a recorded op (parameters,
// buffers) become initializers (copied to the host when traced), named by name_parameter() or automatically;
// output() marks graph outputs. One tracer per thread at a time (a second one is an Error).
class Tracer {
 public:
  explicit Tracer(std::string graph_name = "traced", int32_t opset = 17);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  void input(const Tensor& t, const std::string& name);
  void name_parameter(const Tensor& t, const std::string& name);
  void output(const Tensor& t, const std::string& name);
  // Stops recording; returns the graph: validated, shapes inferred, exportable with save_onnx (core/runtime/onnx_io.h).
  // Only the nodes the outputs depend on are kept. Input dims stay as traced (fixed shapes).
  StatusOr<Graph> graph();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::eager
