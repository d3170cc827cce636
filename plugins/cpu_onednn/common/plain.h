// plugins/cpu_onednn/common/plain.h — (internal) the plain-layout kernels of kernels/misc.cc for one data type: one
// oneDNN primitive on the graph's row-major tensors (pooling, BatchNormalization, LayerNormalization,
// Softmax/LogSoftmax, element-wise unary ops, binary ops with broadcasting, Concat, Transpose).
//
// kernels/misc.cc registers them for f32, kernels/bf16.cc for bf16 (its mixed-precision inference kernels). With
// `dt` = bf16 the data inputs and the output are bf16 and oneDNN computes in f32 inside each primitive; the
// normalisation parameters (BatchNormalization scale/bias/mean/var, LayerNormalization scale/bias) and Clip's bounds
// may then be bf16 or f32 and are widened to f32 (per run, they are [C] / [D] vectors). With f32 every input is f32.
// Each kernel rejects (setup throws Reject) what it does not handle, so the next kernel takes the node.
#pragma once

#include "common/common.h"

namespace keel::onednn {

// Element-wise unary ops (Gelu: keel.Gelu, attribute `approximate` none | tanh).
enum class Unary {
  kRelu,
  kLeakyRelu,
  kElu,
  kSigmoid,
  kTanh,
  kExp,
  kLog,
  kSqrt,
  kAbs,
  kHardSwish,
  kClip,
  kNeg,
  kSoftplus,
  kGelu,
  kRound
};

// Max/Average pooling (global: GlobalMax/GlobalAveragePool). bf16 rejects ceil_mode, SAME auto_pad and dilations.
Kernel* make_pool_kernel(dnnl::memory::data_type dt, bool max, bool global);
Kernel* make_batch_norm_kernel(dnnl::memory::data_type dt);  // inference
Kernel* make_layer_norm_kernel(dnnl::memory::data_type dt);  // last axis
Kernel* make_softmax_kernel(dnnl::memory::data_type dt, bool log);
Kernel* make_unary_kernel(dnnl::memory::data_type dt, Unary u);
// Binary ops with numpy broadcasting; the first operand must have the output's shape (commutative ops swap).
Kernel* make_binary_kernel(dnnl::memory::data_type dt, dnnl::algorithm a, bool commutative);
Kernel* make_concat_kernel(dnnl::memory::data_type dt);
Kernel* make_transpose_kernel(dnnl::memory::data_type dt);

}  // namespace keel::onednn
