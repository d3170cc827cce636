// plugins/cpu_onednn/common/common.h — (internal) what every oneDNN kernel of the cpu_onednn plugin shares.
//
// Built against the SDK only (<keel/plugin.h>) and oneDNN's C++ API. Nothing here crosses the plugin boundary:
// the C entries in plugin.cc catch every exception and turn it into a keel_status_t.
//
// A kernel is a class derived from `Kernel`. The core calls create once per node: `setup` reads attributes and
// constant inputs and throws `Reject` for any case the kernel does not handle (the core then falls back to the next
// kernel, normally the reference one). When every input shape is known at create time, setup also builds the
// primitive for that shape, so that oneDNN itself can reject at create time. `run` is called per inference; plans
// (primitive + memory objects + prepacked weights) are cached per input-shape signature (`PlanCache`).
#pragma once

#include <keel/plugin.h>
#include <keel/kernel.hpp>
#include <keel/shape.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/bf16.h"
#include "common/scratchpad.h"

namespace keel::onednn {

using Dims = std::vector<int64_t>;

// The core's kernel API: a table of the core library, the same for every environment (stored by each init_instance
// before it registers anything). Ctx reads it.
extern std::atomic<const keel_kernel_api_t*> g_kernel_api;
// A status made by the core's status constructor (a plain function of the core library, like g_kernel_api).
keel_status_t make_status(int32_t code, const std::string& msg);

// The SDK's C++ layer (sdk/include/keel/kernel.hpp, shape.hpp): Reject (a case the kernel does not handle: becomes
// UNIMPLEMENTED, a rejection, not an error), Failure (a real failure with its code), the saturating element count.
using sdk::dims_str;
using sdk::Failure;
using sdk::mul_sat;
using sdk::numel;
using sdk::Reject;

// The kernel context seen through the host's kernel API (g_kernel_api).
class Ctx : public sdk::KernelContext {
 public:
  explicit Ctx(keel_kernel_context_t* c) : sdk::KernelContext(c, g_kernel_api.load(std::memory_order_relaxed)) {}
};

struct Instance;

// The CPU engine (one per process) and this thread's stream.
dnnl::engine& engine();
dnnl::stream& stream();
// Sets oneDNN's (OpenMP) thread count on this thread when it differs from the last value set on it.
void set_threads(int32_t n);
// (Not used: switching the OpenMP team size between primitives, or running a primitive with another thread
// count than it was created with, makes oneDNN 2.6 10-50x slower. Plans are keyed by the thread count instead.)
inline void limit_threads_for(double) {}

// Format tags by tensor rank (3: 1-D spatial, 4: 2-D, 5: 3-D): channel-blocked by 16, channels-last, plain.
inline dnnl::memory::format_tag blocked16_tag(size_t rank) {
  using t = dnnl::memory::format_tag;
  return rank == 5 ? t::nCdhw16c : rank == 3 ? t::nCw16c : t::nChw16c;
}
inline dnnl::memory::format_tag channels_last_tag(size_t rank) {
  using t = dnnl::memory::format_tag;
  return rank == 5 ? t::ndhwc : rank == 3 ? t::nwc : t::nhwc;
}
inline dnnl::memory::format_tag plain_tag(size_t rank) {
  using t = dnnl::memory::format_tag;
  return rank == 5 ? t::ncdhw : rank == 3 ? t::ncw : t::nchw;
}

// The channel block (16 or 8) of an f32 4-D memory in nChw16c / nChw8c over `dims`; 0 for any other layout. And the tag
// of a block.
inline int64_t channel_block(const dnnl::memory::desc& md, const std::vector<int64_t>& dims) {
  using t = dnnl::memory::format_tag;
  const dnnl::memory::dims d(dims.begin(), dims.end());
  const auto f32 = dnnl::memory::data_type::f32;
  return md == dnnl::memory::desc(d, f32, t::nChw16c) ? 16 : md == dnnl::memory::desc(d, f32, t::nChw8c) ? 8 : 0;
}
inline dnnl::memory::format_tag channel_block_tag(int64_t block) {
  return block == 16 ? dnnl::memory::format_tag::nChw16c : dnnl::memory::format_tag::nChw8c;
}

// A plain row-major memory descriptor of these dims (f32 unless given).
dnnl::memory::desc plain_md(const Dims& d, dnnl::memory::data_type dt = dnnl::memory::data_type::f32);
dnnl::memory::dims to_dnnl(const Dims& d);

// Input shapes of a call, flattened into one key: (ndim, dims...) per input, -2 for absent inputs, then the
// OpenMP thread count (oneDNN primitives must run with the thread count they were created with).
Dims shape_key(const Ctx& c);

// Plans cached per shape key, with a fast path for the last one used.
template <class P>
class PlanCache {
 public:
  template <class Build>
  P& get(const Dims& key, Build&& build) {
    if (last_ && key == last_key_) return *last_;
    auto it = plans_.find(key_str(key));
    if (it == plans_.end()) it = plans_.emplace(key_str(key), build()).first;
    last_ = it->second.get();
    last_key_ = key;
    return *last_;
  }

 private:
  static std::string key_str(const Dims& k) {
    return std::string(reinterpret_cast<const char*>(k.data()), k.size() * 8);
  }
  std::unordered_map<std::string, std::unique_ptr<P>> plans_;
  P* last_ = nullptr;
  Dims last_key_;
};

class Kernel {
 public:
  const Instance* instance = nullptr;  // the environment's plugin state it was created for (set by create_kernel)
  virtual ~Kernel() = default;
  // At create: read attributes and constants; throw Reject for unhandled cases.
  virtual void setup(Ctx& c) = 0;
  // At compute: run the node.
  virtual void run(Ctx& c) = 0;
};

// The one map from an ONNX element-wise op to the oneDNN eltwise algorithm computing it, for the node kernels
// (kernels/misc.cc), the bf16 fused activations (kernels/bf16.cc) and the chains' post-ops (chain/fusion.cc); each
// of those takes the subset it handles. Sets *alpha / *beta to the op's fixed parameters (Neg: linear, -1 and 0;
// every other op 0 and 0): the caller sets those that come from attributes or inputs (LeakyRelu's and Elu's alpha,
// Clip's bounds). `approximate` is Gelu's attribute ("none": erf, "tanh"). False for an op, or a Gelu
// approximation, without an algorithm here.
inline bool eltwise_algorithm(const std::string& op, const std::string& approximate, dnnl::algorithm* alg, float* alpha,
                              float* beta) {
  using a = dnnl::algorithm;
  *alpha = 0.f;
  *beta = 0.f;
  if (op == "Relu" || op == "LeakyRelu") *alg = a::eltwise_relu;
  else if (op == "Elu") *alg = a::eltwise_elu;
  else if (op == "Sigmoid") *alg = a::eltwise_logistic;
  else if (op == "Tanh") *alg = a::eltwise_tanh;
  else if (op == "Exp") *alg = a::eltwise_exp;
  else if (op == "Log") *alg = a::eltwise_log;
  else if (op == "Sqrt") *alg = a::eltwise_sqrt;
  else if (op == "Abs") *alg = a::eltwise_abs;
  else if (op == "HardSwish") *alg = a::eltwise_hardswish;  // oneDNN 2.6: x * relu6(x + 3) / 6, no parameters
  else if (op == "Neg") *alg = a::eltwise_linear, *alpha = -1.f;
  else if (op == "Softplus") *alg = a::eltwise_soft_relu;
  else if (op == "Round") *alg = a::eltwise_round;  // half to even, as ONNX
  else if (op == "Clip") *alg = a::eltwise_clip_v2;
  else if (op == "Gelu" && approximate == "none") *alg = a::eltwise_gelu_erf;
  else if (op == "Gelu" && approximate == "tanh") *alg = a::eltwise_gelu_tanh;
  else return false;
  return true;
}

// The activation of a fused op (keel.FusedConv's `activation` / `activation_params`, ops/reference/fused.cc) as one
// eltwise post-op: "" (none), Relu, Sigmoid, Tanh, HardSwish, Gelu (erf), LeakyRelu {alpha}, Clip {min, max}.
// Throws Reject for any other.
struct FusedActivation {
  bool set = false;
  dnnl::algorithm alg = dnnl::algorithm::eltwise_relu;
  float alpha = 0.f, beta = 0.f;
  void append_to(dnnl::post_ops& po) const {
    if (set) po.append_eltwise(1.f, alg, alpha, beta);
  }
  // A primitive's attributes with a user scratchpad (scratchpad.h) and this activation as its only post-op.
  dnnl::primitive_attr attr() const {
    dnnl::primitive_attr a = user_scratchpad();
    if (set) {
      dnnl::post_ops po;
      append_to(po);
      a.set_post_ops(po);
    }
    return a;
  }
};
inline FusedActivation read_fused_activation(const Ctx& c) {
  FusedActivation act;
  const std::string a = c.attr_s("activation", "");
  if (a.empty()) return act;
  const keel_kernel_api_t* api = g_kernel_api.load(std::memory_order_relaxed);
  const float* pv = nullptr;
  size_t pn = 0;
  std::vector<float> params;
  if (api->attr_floats(c.raw(), "activation_params", &pv, &pn)) params.assign(pv, pv + pn);
  if (a != "Relu" && a != "Sigmoid" && a != "Tanh" && a != "HardSwish" && a != "Gelu" && a != "LeakyRelu" &&
      a != "Clip")
    throw Reject{"activation " + a};
  if (a == "Clip" && params.size() != 2) throw Reject{"Clip activation without {min, max}"};
  act.set = true;
  eltwise_algorithm(a, "none", &act.alg, &act.alpha, &act.beta);
  if (a == "LeakyRelu") act.alpha = params.empty() ? 0.01f : params[0];
  if (a == "Clip") act.alpha = params[0], act.beta = params[1];
  return act;
}

// A memory object bound to a (possibly changing) user pointer.
inline void bind(dnnl::memory& m, const void* p) { m.set_data_handle(const_cast<void*>(p)); }

// Registration tables of each source file: op type, first opset, factory.
struct KernelInfo {
  const char* op_type;
  int32_t since_version;
  int32_t end_version;
  const char* name;  // "onednn_f32_conv"
  Kernel* (*make)();
  const char* domain = "";  // "" (ai.onnx) or "keel" (the fused ops of ops/schemas.cc)
  uint32_t flags = 0;       // keel_kernel_def_t.flags (KEEL_KERNEL_FLAG_SECONDARY)
};
// One kernel registration of one environment: the user_data of its keel_kernel_def_t (held by the Instance).
struct KernelEntry {
  const Instance* instance;
  Kernel* (*make)();
};
// The C entries of every oneDNN kernel (plugin.cc), each inside an InstanceScope of the kernel's instance.
// create_kernel (user_data: the KernelEntry) makes the kernel with the entry's `make` and runs its setup; anything it
// throws becomes UNIMPLEMENTED, so the next kernel takes the node. compute_kernel_* run it; a Failure keeps its code,
// a Reject is UNIMPLEMENTED, a oneDNN error is UNIMPLEMENTED with compute_kernel_falling_back (the next kernel runs
// this case) and INTERNAL with compute_kernel_failing. release_kernel deletes it.
keel_status_t create_kernel(void* user_data, keel_kernel_context_t* ctx, void** out_state);
keel_status_t compute_kernel_falling_back(void* state, keel_kernel_context_t* ctx);
keel_status_t compute_kernel_failing(void* state, keel_kernel_context_t* ctx);
void release_kernel(void* state);
std::vector<KernelInfo> conv_kernels();
std::vector<KernelInfo> matmul_kernels();
std::vector<KernelInfo> misc_kernels();

// Plugin options of one environment (its plugin options: the manifest's [options] with the host's merged over them;
// then the KEEL_ONEDNN_* variables), read once by its init_instance.
struct Options {
  bool winograd = true;   // KEEL_ONEDNN_WINOGRAD=0 or [options] winograd = false turns it off
  bool claims = true;     // KEEL_ONEDNN_CLAIMS=0 or [options] claims = false: no claimed subgraphs (kernels only)
  bool dw_fusion = true;  // KEEL_ONEDNN_DW_FUSION=0 or [options] dw_fusion = false: a 1x1 conv's depthwise consumer
                          // stays a step of its own (Builder::conv_dw_fused)
  bool silu_pass = true;  // KEEL_ONEDNN_SILU_PASS=0 or [options] silu_pass = false: a convolution's trailing SiLU runs
                          // as oneDNN's swish post-op instead of the chain's own pass (steps/silu.h)
  bool gelu_pass = true;  // KEEL_ONEDNN_GELU_PASS=0 or [options] gelu_pass = false: a matrix product's trailing GELU
                          // runs as oneDNN's gelu_erf post-op instead of the chain's own pass (steps/gelu.h)
  bool dw_silu = true;  // KEEL_ONEDNN_DW_SILU=0 or [options] dw_silu = false: a depthwise convolution followed by SiLU
                        // stays oneDNN's primitive and SiLU passes instead of the chain's own step (steps/dwsilu.h)
  bool expand_dw_project = true;  // KEEL_ONEDNN_EXPAND_DW_PROJECT=0: the expand_dw step leaves the 1x1 projection
                                  // after it to oneDNN (for A/B runs)
  bool expand_dw_stem = true;     // KEEL_ONEDNN_EXPAND_DW_STEM=0: a network's 3x3 stride-2 first convolution is not the
                                  // expand_dw step's first stage (for A/B runs)
  bool expand_dw = true;  // KEEL_ONEDNN_EXPAND_DW=0 or [options] expand_dw = false: a 1x1 convolution and its 3x3 /
                          // 5x5 depthwise reader run as oneDNN's primitives (fused by append_dw where it can), not as
                          // the chain's own step (steps/expand_dw.h)
  bool int8_expand_dw = true;  // KEEL_ONEDNN_INT8_EXPAND_DW=0 or [options] int8_expand_dw = false: an int8 expansion
                               // QConv, its depthwise reader (and projection) stay separate steps, not the chain's own
                               // int8 step (steps/int8_expand_dw.h); the projection obeys expand_dw_project
  bool wino4 = true;  // KEEL_ONEDNN_WINO4=0 or [options] wino4 = false: no 3x3 convolution runs as the chain's own
                      // Winograd F(4,3) step (steps/wino4.h), only oneDNN's kernels
  bool dw_ln = true;  // KEEL_ONEDNN_DW_LN=0 or [options] dw_ln = false: a depthwise convolution and the
                      // LayerNormalization after its permute to channels-last (ConvNeXt) run as oneDNN's two steps, not
                      // as the chain's own one (steps/dw_ln.h)

  bool pointwise = true;  // KEEL_ONEDNN_POINTWISE=0 or [options] pointwise = false: an f32 1x1 stride-1 convolution
                          // runs on oneDNN's jit_1x1 kernel, not as the chain's own step (steps/pointwise.h)

  bool wino_few_tiles = true;  // KEEL_ONEDNN_WINO_FEW_TILES=0 or [options] wino_few_tiles = false: a 3x3 of few
                               // tiles and large weights (ResNet's 14x14 and 7x7) is not the own step position by
                               // position (Wino4Shape::position_major, F(2,3) for the 7x7) but as before:
  bool wino4_streamed = true;  // KEEL_ONEDNN_WINO4_STREAMED=0 or [options] wino4_streamed = false: then a 3x3 of 16-31
                               // tiles and large weights stays on oneDNN's Winograd instead of the own F(4,3) step with
                               // its weights transformed at run time (Wino4Shape::streamed)
  bool wino4_position_major = true;  // KEEL_ONEDNN_WINO4_POSITION_MAJOR=0 or [options] wino4_position_major = false:
                                     // a 3x3 the own Winograd step takes with over 1 MiB of transformed weights
                                     // (ResNet's 28x28 128->128) goes register tile by register tile over all 36
                                     // positions, each reading the group's weights again, not position by position
  bool se_step = true;        // KEEL_ONEDNN_SE_STEP=0 or [options] se_step = false: squeeze-excite's excitation runs as
                              // oneDNN steps instead of the chain's own one (steps/se.h)
  bool view_post_ops = true;  // KEEL_ONEDNN_VIEW_POST_OPS=0 or [options] view_post_ops = false: a matmul's post-ops
                              // (the residual sum) stop at a Reshape/Transpose of size-1 dims (fuse_after)
  bool skinny_gemm = true;    // KEEL_ONEDNN_SKINNY_GEMM=0 or [options] skinny_gemm = false: a product of <= 64 rows
                              // and >= 1 MiB of constant weights stays on oneDNN's matmul, not the own step
                              // (steps/skinny_gemm.h)
  bool skinny_conv = true;    // KEEL_ONEDNN_SKINNY_CONV=0 or [options] skinny_conv = false: a convolution over 32-64
                              // output pixels with >= 8 MiB of weights stays on oneDNN's kernels, not the own
                              // windows-times-weights steps (steps/im2row.h, steps/skinny_gemm.h)
  bool maxpool_rows = true;   // KEEL_ONEDNN_MAXPOOL_ROWS=0 or [options] maxpool_rows = false: an f32 nChw16c max
                              // pooling without padding stays on oneDNN's kernel, not the own step split by output
                              // rows (steps/pool_arg.h's pool_max16_rows)
  bool permuted_post_ops = true;  // KEEL_ONEDNN_PERMUTED_POST_OPS=0 or [options] permuted_post_ops = false: a
                                  // matmul's post-ops stop at a Transpose from [N,H,W,C] to [N,C,H,W] (ConvNeXt's
                                  // block tail: the layer scale and the residual Add then run as binary steps)
  // [options] int8_winograd = true / "timed" (KEEL_ONEDNN_INT8_WINOGRAD=1 / timed): a QConv that oneDNN's int8
  // Winograd F(2x2,3x3) takes (qconv_winograd_desc, kernels/int8.h) runs on it always (the same outputs every run), or
  // where it times faster than the direct kernel. Off by default: it requantizes in the transformed domain (the
  // input's bytes / 4, the weights * 4/9), so its outputs are not the QDQ model's to within one rounding.
  enum class Choice { kOff, kOn, kTimed };  // an option that is a flag or "timed"
  Choice int8_winograd = Choice::kOff;
  // [options] wino_few_tiles_f2 = "timed" / true / false (KEEL_ONEDNN_WINO_FEW_TILES_F2=timed / 1 / 0): a 3x3 of 16-31
  // F(4,3) tiles that wino_few_tiles takes (ResNet's 14x14 at batch 1) runs in F(2,3) where it times faster when the
  // plan is built (Builder::wino_few_tiles_pick), always, or never (F(4,3))
  Choice wino_few_tiles_f2 = Choice::kTimed;
  bool profile = false;  // KEEL_ONEDNN_PROFILE=1: claimed subgraphs time their primitives (logged at info)
};

// One environment's state of this plugin (ABI 1.5 instances): that environment's host table and handle (its log),
// the options it read, and the user_data of its kernel registrations. Made by init_instance, deleted by
// shutdown_instance after every session of the environment is gone. Two environments with different options each
// run with their own.
struct Instance {
  const keel_core_api_t* host = nullptr;
  keel_plugin_handle_t* handle = nullptr;
  Options options;
  std::deque<KernelEntry> kernels;  // stable addresses: registered as user_data
};

// Every entry of the plugin (a kernel's create / compute / release, the claim hook, a claimed chain's compute and
// release) runs inside an InstanceScope of the instance it belongs to; the code under it reads that instance's
// options() and logs to its environment (host_log). Scopes nest (an entry entered from another restores it).
class InstanceScope {
 public:
  explicit InstanceScope(const Instance* instance);
  ~InstanceScope();
  InstanceScope(const InstanceScope&) = delete;
  InstanceScope& operator=(const InstanceScope&) = delete;

 private:
  const Instance* previous_;
};
// The options of the instance of the entry this thread is in (the defaults outside every entry, which no kernel or
// chain code is).
const Options& options();
// Logs to the current instance's environment (dropped outside every entry).
void host_log(int32_t level, const std::string& msg);

// An entry of a registration table (kernels/train.cc, kernels/bf16.cc, and the f32 tables above as plugin.cc
// converts them): the allowed dtypes of type parameter "T". register_kernel_table (kernels/train.cc) registers a table
// (which must outlive the plugin) for "cpu", its kernels computing with compute_kernel_falling_back or _failing.
struct TypedKernelInfo {
  const char* domain;
  const char* op_type;
  int32_t since_version;
  const char* name;
  std::vector<int32_t> dtypes;
  Kernel* (*make)();
  int32_t end_version = 0;  // 0: every later opset version too
  uint32_t flags = 0;       // keel_kernel_def_t.flags (KEEL_KERNEL_FLAG_SECONDARY)
};
keel_status_t register_kernel_table(Instance& instance, const std::vector<TypedKernelInfo>& table,
                                    bool dnnl_error_falls_back);
// The training kernels of kernels/train.cc (keel-domain backward ops, bf16 forward ops), registered from init.
keel_status_t register_train_kernels(Instance& instance);
// The bf16 inference kernels of kernels/bf16.cc (binary, pooling, normalisation, softmax, eltwise, concat, transpose).
keel_status_t register_bf16_kernels(Instance& instance);
// The int8 kernels of kernels/int8.cc (keel.QConv, keel.QGemm, u8/s8 pooling).
keel_status_t register_int8_kernels(Instance& instance);
// Registers the claim hook for "cpu" (chain/claim.cc) when the core offers register_claimer (ABI 1.1).
keel_status_t register_claimer(Instance& instance);

}  // namespace keel::onednn
