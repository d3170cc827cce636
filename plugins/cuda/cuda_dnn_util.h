// plugins/cuda/cuda_dnn_util.h — (internal) what the plugin's cuDNN kernels share (cuda_dnn.cc: inference;
// cuda_train_ops.cc: training): the cuDNN status check, the per-device pool of cuDNN handles, RAII descriptors, the
// math-type policy (true f32 unless KEEL_CUDA_TF32=1), and the ONNX spatial geometry of convolutions and pools.
//
// Host code only. The handle pool is process-wide (one mutex; dnn_shutdown destroys the idle handles). Everything
// throws Failure / Reject (cuda_common.h); nothing here crosses the plugin boundary.
#pragma once

#include <algorithm>
#include <climits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_common.h"

#if KEEL_CUDA_HAVE_CUDNN
#include <cudnn.h>
#endif

namespace keel::cuda::dnn {

inline bool is_float(int32_t t) { return t == KEEL_DTYPE_F32 || t == KEEL_DTYPE_F16 || t == KEEL_DTYPE_BF16; }

inline Failure invalid(const std::string& msg) { return Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: " + msg}; }
inline Failure unimplemented(const std::string& msg) { return Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: " + msg}; }

#if KEEL_CUDA_HAVE_CUDNN

// ---------------------------------------------------------------------------------------------------------------
// cuDNN plumbing: status, handles, descriptors
// ---------------------------------------------------------------------------------------------------------------

inline constexpr size_t kMaxWorkspace = size_t(256) << 20;  // the largest algorithm workspace a kernel asks for

inline bool not_supported(cudnnStatus_t s) { return CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_NOT_SUPPORTED; }
inline bool bad_param(cudnnStatus_t s) { return CUDNN_STATUS_CATEGORY(s) == CUDNN_STATUS_BAD_PARAM; }

// Throws Failure naming `what` and `shapes` when s is not CUDNN_STATUS_SUCCESS.
inline void check_dnn(cudnnStatus_t s, const char* what, const std::string& shapes) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  char detail[512];
  detail[0] = '\0';
  cudnnGetLastErrorString(detail, sizeof detail);
  int32_t code = KEEL_STATUS_INTERNAL;
  if (not_supported(s)) code = KEEL_STATUS_UNIMPLEMENTED;
  else if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
           s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    code = KEEL_STATUS_OUT_OF_MEMORY;
  std::string msg = std::string("cuda: ") + what + (shapes.empty() ? "" : " (" + shapes + ")") + ": " +
                    cudnnGetErrorString(s) + " (" + std::to_string(static_cast<int>(s)) + ")";
  if (detail[0]) msg += ": " + std::string(detail);
  throw Failure{code, msg};
}

inline std::mutex g_dnn_mu;
inline std::vector<std::pair<int, cudnnHandle_t>> g_free_dnn;  // idle handles, by device

// A pooled cuDNN handle of `device` bound to `stream` for the lifetime of this object.
class DnnHandle {
 public:
  DnnHandle(int device, cudaStream_t stream) : device_(device) {
    {
      std::lock_guard<std::mutex> lock(g_dnn_mu);
      for (size_t i = 0; i < g_free_dnn.size(); ++i)
        if (g_free_dnn[i].first == device) {
          h_ = g_free_dnn[i].second;
          g_free_dnn.erase(g_free_dnn.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
    }
    if (!h_) check_dnn(cudnnCreate(&h_), "cudnnCreate", "device " + std::to_string(device));  // current device
    cudnnStatus_t s = cudnnSetStream(h_, stream);
    if (s != CUDNN_STATUS_SUCCESS) {
      release();
      check_dnn(s, "cudnnSetStream", "device " + std::to_string(device));
    }
  }
  ~DnnHandle() { release(); }
  DnnHandle(const DnnHandle&) = delete;
  DnnHandle& operator=(const DnnHandle&) = delete;
  cudnnHandle_t get() const { return h_; }

 private:
  void release() {
    if (!h_) return;
    std::lock_guard<std::mutex> lock(g_dnn_mu);
    g_free_dnn.emplace_back(device_, h_);
    h_ = nullptr;
  }
  int device_;
  cudnnHandle_t h_ = nullptr;
};

inline cudnnDataType_t dnn_type(int32_t t) {
  switch (t) {
    case KEEL_DTYPE_F16: return CUDNN_DATA_HALF;
    case KEEL_DTYPE_BF16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
  }
}

inline std::vector<int> to_int(const Dims& d, const char* what) {
  std::vector<int> r(d.size());
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] < 0 || d[i] > INT_MAX) throw unimplemented(std::string(what) + " " + dims_str(d) + " beyond int32");
    r[i] = static_cast<int>(d[i]);
  }
  return r;
}

// One cuDNN descriptor, created with the object and destroyed with it (not copyable); the classes below add setters.
template <typename T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class DnnDesc {
 public:
  explicit DnnDesc(const char* create_call) { check_dnn(Create(&d_), create_call, ""); }
  ~DnnDesc() {
    if (d_) Destroy(d_);
  }
  DnnDesc(const DnnDesc&) = delete;
  DnnDesc& operator=(const DnnDesc&) = delete;
  T get() const { return d_; }

 private:
  T d_ = nullptr;
};

class TensorDesc : public DnnDesc<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor> {
 public:
  TensorDesc() : DnnDesc("cudnnCreateTensorDescriptor") {}
  // A packed row-major (NCHW / NCDHW) tensor of rank 4 or 5.
  void set(int32_t dtype, const Dims& dims, const char* what) {
    const std::vector<int> d = to_int(dims, what);
    std::vector<int> strides(d.size(), 1);
    for (size_t i = d.size() - 1; i-- > 0;) {
      const int64_t s = static_cast<int64_t>(strides[i + 1]) * std::max(d[i + 1], 1);
      if (s > INT_MAX) throw unimplemented(std::string(what) + " " + dims_str(dims) + ": strides beyond int32");
      strides[i] = static_cast<int>(s);
    }
    check_dnn(cudnnSetTensorNdDescriptor(get(), dnn_type(dtype), static_cast<int>(d.size()), d.data(), strides.data()),
              "cudnnSetTensorNdDescriptor", std::string(what) + " " + dims_str(dims));
  }
};

class FilterDesc : public DnnDesc<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor> {
 public:
  FilterDesc() : DnnDesc("cudnnCreateFilterDescriptor") {}
  void set(int32_t dtype, const Dims& dims) {
    const std::vector<int> d = to_int(dims, "W");
    check_dnn(
        cudnnSetFilterNdDescriptor(get(), dnn_type(dtype), CUDNN_TENSOR_NCHW, static_cast<int>(d.size()), d.data()),
        "cudnnSetFilterNdDescriptor", "W " + dims_str(dims));
  }
};

class ConvDesc : public DnnDesc<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                                cudnnDestroyConvolutionDescriptor> {
 public:
  ConvDesc() : DnnDesc("cudnnCreateConvolutionDescriptor") {}
  // Cross-correlation (ONNX Conv) with f32 accumulation for every data type; pads symmetric per spatial dim.
  void set(const Dims& pads, const Dims& strides, const Dims& dilations, int64_t group, const std::string& shapes) {
    const std::vector<int> p = to_int(pads, "pads"), s = to_int(strides, "strides"), d = to_int(dilations, "dilations");
    check_dnn(cudnnSetConvolutionNdDescriptor(get(), static_cast<int>(p.size()), p.data(), s.data(), d.data(),
                                              CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
              "cudnnSetConvolutionNdDescriptor", shapes);
    check_dnn(cudnnSetConvolutionGroupCount(get(), static_cast<int>(group)), "cudnnSetConvolutionGroupCount", shapes);
  }
  void math(cudnnMathType_t m, const std::string& shapes) {
    check_dnn(cudnnSetConvolutionMathType(get(), m), "cudnnSetConvolutionMathType", shapes);
  }
};

class PoolDesc : public DnnDesc<cudnnPoolingDescriptor_t, cudnnCreatePoolingDescriptor, cudnnDestroyPoolingDescriptor> {
 public:
  PoolDesc() : DnnDesc("cudnnCreatePoolingDescriptor") {}
};

class ActDesc
    : public DnnDesc<cudnnActivationDescriptor_t, cudnnCreateActivationDescriptor, cudnnDestroyActivationDescriptor> {
 public:
  ActDesc() : DnnDesc("cudnnCreateActivationDescriptor") {}
};

// The math type a convolution of `dtype` is set up with before the algorithm query: true f32 (FMA) unless TF32 is
// opted in (DEFAULT math permits TF32 on sm_80+), tensor ops for f16 / bf16.
inline cudnnMathType_t math_for(int32_t dtype) {
  if (dtype == KEEL_DTYPE_F32) return tf32_allowed() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  return CUDNN_TENSOR_OP_MATH;
}
// Whether an algorithm reported with math type m may run for `dtype` (strict f32 takes FMA kernels only).
inline bool math_ok(int32_t dtype, cudnnMathType_t m) {
  return dtype != KEEL_DTYPE_F32 || tf32_allowed() || m == CUDNN_FMA_MATH;
}

// The first algorithm of a cuDNN ranking (`got` entries of `perf`, fastest first) that succeeded, fits kMaxWorkspace
// and may run for `dtype`; `cd` takes its math type (an algorithm and its math type go together). When none
// qualifies: `fallback` (one that needs no workspace and takes every configuration), `cd` on math_for(dtype).
template <typename Perf, typename Algo>
Algo pick_conv_algo(const std::vector<Perf>& perf, int got, int32_t dtype, ConvDesc& cd, Algo fallback,
                    const std::string& shapes) {
  for (int i = 0; i < got && i < static_cast<int>(perf.size()); ++i) {
    const Perf& r = perf[static_cast<size_t>(i)];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > kMaxWorkspace || !math_ok(dtype, r.mathType)) continue;
    cd.math(r.mathType, shapes);
    return r.algo;
  }
  cd.math(math_for(dtype), shapes);
  return fallback;
}

#endif  // KEEL_CUDA_HAVE_CUDNN

// ---------------------------------------------------------------------------------------------------------------
// Spatial geometry (as ops/reference/nn_common.h spatial_geom)
// ---------------------------------------------------------------------------------------------------------------

struct SpatialAttrs {
  Dims kernel_shape;  // empty: from the weights
  Dims strides, dilations, pads;
  std::string auto_pad = "NOTSET";
  bool ceil_mode = false;

  void read(const Ctx& c, bool dilations_attr) {
    kernel_shape = c.attr_ints("kernel_shape", {});
    strides = c.attr_ints("strides", {});
    dilations = dilations_attr ? c.attr_ints("dilations", {}) : Dims{};
    pads = c.attr_ints("pads", {});
    auto_pad = c.attr_s("auto_pad", "NOTSET");
    if (auto_pad.empty()) auto_pad = "NOTSET";
    if (sdk::auto_pad_of(auto_pad) == sdk::AutoPad::kUnknown) throw Reject{"unknown auto_pad '" + auto_pad + "'"};
    ceil_mode = c.attr_i("ceil_mode", 0) != 0;
  }
};

struct Geom {
  int r = 0;
  Dims in, kernel, strides, dilations, pads, out;  // pads: r begins, then r ends
  bool ceil_changes = false;                       // ceil_mode made an output dimension larger than floor would
};

inline Geom make_geom(const SpatialAttrs& a, const Dims& in, const Dims& kernel, const std::string& op) {
  Geom g;
  g.r = static_cast<int>(in.size());
  g.in = in;
  g.kernel = kernel;
  const size_t r = in.size();
  if (kernel.size() != r)
    throw invalid(op + ": kernel " + dims_str(kernel) + " for " + std::to_string(r) + " spatial dimensions");
  for (int64_t v : kernel)
    if (v <= 0) throw invalid(op + ": kernel " + dims_str(kernel) + " has a non-positive entry");
  g.strides = a.strides.empty() ? Dims(r, 1) : a.strides;
  g.dilations = a.dilations.empty() ? Dims(r, 1) : a.dilations;
  if (g.strides.size() != r || g.dilations.size() != r)
    throw invalid(op + ": strides / dilations need " + std::to_string(r) + " entries");
  for (size_t i = 0; i < r; ++i)
    if (g.strides[i] <= 0 || g.dilations[i] <= 0) throw invalid(op + ": strides and dilations must be positive");
  Dims eff(r);
  for (size_t i = 0; i < r; ++i) eff[i] = sdk::dilated_extent(kernel[i], g.dilations[i]);
  const sdk::AutoPad ap = sdk::auto_pad_of(a.auto_pad);
  if (ap == sdk::AutoPad::kNotSet) {
    g.pads = a.pads.empty() ? Dims(2 * r, 0) : a.pads;
    if (g.pads.size() != 2 * r)
      throw invalid(op + ": pads " + dims_str(g.pads) + " needs " + std::to_string(2 * r) + " entries");
    for (int64_t v : g.pads)
      if (v < 0) throw invalid(op + ": negative pads " + dims_str(g.pads));
  } else {
    g.pads.assign(2 * r, 0);
    for (size_t i = 0; i < r; ++i) sdk::same_pads(ap, in[i], eff[i], g.strides[i], &g.pads[i], &g.pads[i + r]);
  }
  g.out.resize(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t pads = g.pads[i] + g.pads[i + r];
    g.out[i] = sdk::window_output(in[i], pads, eff[i], g.strides[i], a.ceil_mode);
    if (g.out[i] < 0)
      throw invalid(op + ": kernel " + dims_str(kernel) + " (dilated) larger than the padded input " + dims_str(in));
    if (g.out[i] != sdk::window_output(in[i], pads, eff[i], g.strides[i])) g.ceil_changes = true;
  }
  return g;
}

// 1-D problems run as 2-D with a leading spatial dimension of 1; rank 4 / 5 (2-D / 3-D) as they are.
inline Dims lift(const Dims& d, int64_t fill) {
  if (d.size() != 3) return d;
  return {d[0], d[1], fill, d[2]};
}
inline Dims lift_spatial(const Dims& v, int64_t fill) {
  if (v.size() != 1) return v;
  return {fill, v[0]};
}

// Whether input i has a known shape at kernel creation (no unknown rank or dimension).
inline bool shape_known(const Ctx& c, int i) {
  if (!c.rank_known(i)) return false;
  for (int64_t d : c.dims(i))
    if (d < 0) return false;
  return true;
}

// Runs `check` (which throws Failure) at kernel creation: UNIMPLEMENTED becomes a Reject (the core places the node
// elsewhere); anything else (a malformed shape) is left for compute to report.
template <class F>
inline void reject_unsupported(F&& check) {
  try {
    check();
  } catch (const Failure& f) {
    if (f.code == KEEL_STATUS_UNIMPLEMENTED) throw Reject{f.message};
  }
}

inline std::string shapes3(const Dims& x, const Dims& w, const Dims& y) {
  return "X " + dims_str(x) + ", W " + dims_str(w) + ", Y " + dims_str(y);
}

}  // namespace keel::cuda::dnn
