// plugins/cuda/cuda_common.h — (internal) what the host-side sources of the CUDA plugin share.
//
// Built against the SDK only (<keel/plugin.h>) and the CUDA toolkit (runtime, cuBLASLt, cuDNN). Nothing here crosses
// the plugin boundary: the C entries in cuda_plugin.cc catch every exception and turn it into a keel_status_t.
// A kernel is a class derived from `Kernel`: `setup` (at create) throws Reject for anything it does not handle, so
// the core falls back to the next kernel (normally the CPU); `run` (per inference) throws Failure on errors (a
// Failure with KEEL_STATUS_UNIMPLEMENTED at run time makes the core try the next kernel of the same device, if any;
// the CPU only takes nodes rejected at create).
#pragma once

#include <cuda_runtime.h>
#include <keel/plugin.h>
#include <keel/kernel.hpp>
#include <keel/shape.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace keel::cuda {

using Dims = std::vector<int64_t>;

// The host's table (set by init, cleared by shutdown). Atomic: each environment's init stores its table while
// sessions of other environments read it (the status and kernel functions are the same in every table).
extern std::atomic<const keel_core_api_t*> g_host;
inline const keel_core_api_t* host_api() { return g_host.load(std::memory_order_acquire); }

// The SDK's C++ layer (sdk/include/keel/kernel.hpp, shape.hpp): Reject, Failure, element counts, dims_str.
using sdk::dims_str;
using sdk::Failure;
using sdk::numel;
using sdk::Reject;

keel_status_t make_status(int32_t code, const std::string& msg);
// A line in the host's log (level: KEEL_LOG_*) through the handle of the plugin's last init; dropped after shutdown.
void log_line(int32_t level, const std::string& msg);
// Throws Failure (INTERNAL, or OUT_OF_MEMORY for allocation errors) naming `what` when e is not cudaSuccess.
void check_cuda(cudaError_t e, const char* what);
// Bytes of one element (sdk::dtype_size as int32_t); 0 for dtypes without a fixed size (STRING, UNDEFINED).
inline int32_t dtype_size(int32_t dtype) { return static_cast<int32_t>(sdk::dtype_size(dtype)); }

// The kernel context (host_api()->kernel) with the CUDA view of its device, stream and workspace.
class Ctx : public sdk::KernelContext {
 public:
  explicit Ctx(keel_kernel_context_t* c) : sdk::KernelContext(c, host_api()->kernel) {}
  int32_t device() const { return device_index(); }
  cudaStream_t stream() const { return reinterpret_cast<cudaStream_t>(sdk::KernelContext::stream()); }
  // Scratch memory on the kernel's device for this compute call (the core frees it, stream-ordered, when compute
  // returns); throws Failure when it cannot be had. 0 bytes gives nullptr.
  void* workspace(uint64_t bytes) const;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void setup(Ctx& c) = 0;
  virtual void run(Ctx& c) = 0;
};

struct KernelInfo {
  const char* op_type;
  int32_t since_version;
  int32_t end_version;
  const char* name;  // "cuda_relu"
  Kernel* (*make)();
  const char* domain = "";  // "" (ai.onnx) or "keel" (the fused ops)
};
std::vector<KernelInfo> elementwise_kernels();  // cuda_ops.cc
std::vector<KernelInfo> blas_kernels();         // cuda_blas.cc
std::vector<KernelInfo> train_kernels();        // cuda_train_ops.cc: backward ops, losses, batch-norm training
void blas_shutdown();                           // destroys the pooled cuBLASLt handles

// --- cuDNN kernels and the TF32 opt-in (cuda_dnn.cc, cuda_blas.cc) ---
std::vector<KernelInfo> dnn_kernels();  // cuda_dnn.cc: Conv, ConvTranspose, pools, BatchNormalization, keel.FusedConv
void dnn_shutdown();                    // destroys the pooled cuDNN handles
// f32 convolutions and GEMMs may use TF32 tensor cores only when the environment sets KEEL_CUDA_TF32=1 (read once);
// otherwise they compute in true f32 (cuDNN FMA math, CUBLAS_COMPUTE_32F).
bool tf32_allowed();
// The `activation` / `activation_params` attributes of the keel fused ops (ops/reference/fused.cc): kind is a
// FusedAct value (cuda_dnn_kernels.h), a / b LeakyRelu's alpha or Clip's min / max. Throws Reject for an unknown
// activation (cuda_dnn.cc).
struct FusedActivation {
  int32_t kind = 0;  // FusedAct::kNone
  float a = 0.f, b = 0.f;
};
FusedActivation read_fused_activation(const Ctx& c);

}  // namespace keel::cuda
