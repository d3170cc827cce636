// plugins/cuda/cuda_common.h — (internal) what the host-side sources of the CUDA plugin share.
//
// Built against the SDK only (<keel/plugin.h>) and the CUDA toolkit (runtime, cuBLAS). Nothing here crosses the
// plugin boundary: the C entries in cuda_plugin.cc catch every exception and turn it into a keel_status_t.
// A kernel is a class derived from `Kernel`: `setup` (at create) throws Reject for anything it does not handle, so
// the core falls back to the next kernel (normally the CPU); `run` (per inference) throws Failure on errors.
#pragma once

#include <cuda_runtime.h>
#include <keel/plugin.h>

#include <cstdint>
#include <string>
#include <vector>

namespace keel::cuda {

using Dims = std::vector<int64_t>;

extern const keel_host_api_t* g_host;

struct Reject {
  std::string why;
};
struct Failure {
  int32_t code;
  std::string message;
};

keel_status_t make_status(int32_t code, const std::string& msg);
// Throws Failure (INTERNAL, or OUT_OF_MEMORY for allocation errors) naming `what` when e is not cudaSuccess.
void check_cuda(cudaError_t e, const char* what);
int64_t numel(const Dims& d);
std::string dims_str(const Dims& d);
int32_t dtype_size(int32_t dtype);  // 0 for dtypes without a fixed size (STRING, UNDEFINED)

class Ctx {
 public:
  explicit Ctx(keel_kernel_context_t* c) : c_(c), api_(g_host->kernel) {}
  int input_count() const { return api_->input_count(c_); }
  const keel_tensor_t* input(int i) const { return api_->input(c_, i); }
  bool has_input(int i) const { return input(i) != nullptr; }
  int32_t dtype(int i) const { const keel_tensor_t* t = input(i); return t ? t->dtype : KEEL_DTYPE_UNDEFINED; }
  bool rank_known(int i) const { const keel_tensor_t* t = input(i); return t && t->ndim >= 0; }
  Dims dims(int i) const;
  const void* data(int i) const { return input(i)->data; }
  int output_count() const { return api_->output_count(c_); }
  int32_t output_dtype(int i) const { return api_->output_dtype(c_, i); }
  keel_tensor_t* output(int i, const Dims& d);
  int32_t opset() const { return api_->opset(c_); }
  int32_t device() const { return api_->device_index(c_); }
  cudaStream_t stream() const { return reinterpret_cast<cudaStream_t>(api_->stream(c_)); }
  int64_t attr_i(const char* name, int64_t dflt) const;
  float attr_f(const char* name, float dflt) const;
  bool has_attr_ints(const char* name) const;
  Dims attr_ints(const char* name, const Dims& dflt) const;
  std::string attr_s(const char* name, const std::string& dflt) const {
    const char* v = nullptr;
    return api_->attr_string(c_, name, &v) && v ? std::string(v) : dflt;
  }

 private:
  keel_kernel_context_t* c_;
  const keel_kernel_api_t* api_;
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
  const char* domain = "";  // "" (ONNX) or "keel" (the fusion passes' ops)
};
std::vector<KernelInfo> elementwise_kernels();  // cuda_ops.cc
std::vector<KernelInfo> blas_kernels();         // cuda_blas.cc
void blas_shutdown();                           // destroys the pooled cuBLAS handles

}  // namespace keel::cuda
