// plugins/cuda/cuda_train_kernels.h — (internal) launchers of the CUDA plugin's training kernels
// (cuda_train_kernels.cu): the element-wise activation gradients, pooling backward, softmax cross-entropy forward and
// backward, batch-normalisation statistics and backward, layer-normalisation backward, Gather backward, the
// per-channel bias reduction and the dropout mask. Their semantics are those of the reference kernels
// (ops/reference/grad.cc, ops/reference/misc.cc), which the device conformance suite checks them against.
//
// Plain C++ with no Keel type in it: the host side (cuda_train_ops.cc) decides shapes and dtypes. Float tensors are
// F32, F16 or BF16 (keel_dtype_t values; anything else returns cudaErrorInvalidValue) and every value is computed in
// f32 (sums of many terms in f64 where the reference does). Integer tensors (labels, indices) are I32 or I64. Each
// call launches on the given stream of the current device, never synchronises, and returns the launch's error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace keel::cuda {

// dX = dY * f'(v) over n elements; v is Y (Relu, Sigmoid, Tanh) or X (Gelu erf form, LeakyRelu with alpha).
enum class ActGrad : int32_t { kRelu, kSigmoid, kTanh, kGelu, kLeakyRelu };
cudaError_t launch_act_grad(ActGrad op, int32_t dtype, const void* dy, const void* v, void* dx, int64_t n, float alpha,
                            cudaStream_t s);

// The window geometry of a pool over up to 3 spatial dims: x [NC, in...], y [NC, out...].
constexpr int kPoolMaxDims = 3;
struct PoolGeom {
  int32_t r = 0;  // spatial dims
  int64_t nc = 0;
  int64_t in[kPoolMaxDims] = {}, out[kPoolMaxDims] = {}, kernel[kPoolMaxDims] = {};
  int64_t strides[kPoolMaxDims] = {}, dilations[kPoolMaxDims] = {};
  int64_t pad_begin[kPoolMaxDims] = {}, pad_end[kPoolMaxDims] = {};
};
// Whether no two windows of a pool share an input position (stride >= the window's extent in every dim): then the
// backward kernels write dx directly and need no accumulator (acc may be null).
bool pool_windows_disjoint(const PoolGeom& g);
// MaxPool backward: dY of each window goes to the window's first maximum of X (scan order; positions in the pads
// skipped). acc: f32 scratch of numel(x) elements (accumulation across overlapping windows; unused, may be null, for
// F32 and for disjoint windows); dx gets the result.
cudaError_t launch_max_pool_grad(int32_t dtype, const void* dy, const void* x, void* dx, float* acc, const PoolGeom& g,
                                 cudaStream_t s);
// AveragePool backward: dY / count to each in-bounds position of its window; count = the window's positions inside
// the padded input (count_include_pad) or inside X. acc as above.
cudaError_t launch_average_pool_grad(int32_t dtype, const void* dy, void* dx, float* acc, const PoolGeom& g,
                                     bool count_include_pad, cudaStream_t s);

// SoftmaxCrossEntropyLoss over scores [N, C, D] (D = product of the trailing dims), labels [N, D], weights [C] (may
// be null; the scores' dtype). reduction: 0 none (loss [N, D]), 1 sum, 2 mean (divided by the sum of the weights of
// the counted labels; 0 when that is 0), as ONNX. A label equal to ignore_index (when has_ignore) counts nothing.
// log_prob (may be null) gets [N, C, D]. scratch: 2 * N * D floats. A label out of [0, C) sets *bad = 1 (device
// memory) and counts nothing.
cudaError_t launch_softmax_xent(int32_t dtype, const void* scores, int32_t label_dtype, const void* labels,
                                const void* weights, int64_t N, int64_t C, int64_t D, bool has_ignore,
                                int64_t ignore_index, int32_t reduction, void* loss, void* log_prob, float* scratch,
                                int32_t* bad, cudaStream_t s);
// Its backward: dScores [N, C, D] = s * w[label] * (exp(log_prob) - onehot(label)), s = dLoss[n, d] (none),
// dLoss (sum) or dLoss / sum of weights (mean). Ignored and out-of-range labels give zeros. scratch: 1 float.
cudaError_t launch_softmax_xent_grad(int32_t dtype, const void* dloss, const void* log_prob, int32_t label_dtype,
                                     const void* labels, const void* weights, int64_t N, int64_t C, int64_t D,
                                     bool has_ignore, int64_t ignore_index, int32_t reduction, void* dscores,
                                     float* scratch, cudaStream_t s);

// keel.BatchNormTraining over x [N, C, S]: batch mean and biased variance per channel (f64 sums), y = (x - mean) *
// invstd * scale + b, invstd = 1 / sqrt(var + eps); mean, invstd and the unbiased variance (may each be null) get
// C values of `dtype`. scale / b: C values of `dtype`.
cudaError_t launch_batch_norm_train(int32_t dtype, const void* x, const void* scale, const void* b, void* y, void* mean,
                                    void* invstd, void* var_unbiased, int64_t N, int64_t C, int64_t S, float eps,
                                    double* scratch /* 2 * C */, cudaStream_t s);
// keel.BatchNormGrad: dX = scale * invstd / M * (M * dY - sum dY - xhat * sum dY xhat), dScale = sum dY xhat,
// dB = sum dY (per channel, M = N * S). dx / dscale / db may each be null. scratch: 2 * C doubles.
cudaError_t launch_batch_norm_grad(int32_t dtype, const void* dy, const void* x, const void* scale, const void* mean,
                                   const void* invstd, void* dx, void* dscale, void* db, int64_t N, int64_t C,
                                   int64_t S, double* scratch, cudaStream_t s);
// keel.LayerNormGrad over [rows, cols] (normalised over cols): mean / invstd have `rows` values of stat_dtype,
// scale `cols` values of dtype. dx / dscale / db may each be null.
cudaError_t launch_layer_norm_grad(int32_t dtype, int32_t stat_dtype, const void* dy, const void* x, const void* scale,
                                   const void* mean, const void* invstd, void* dx, void* dscale, void* db, int64_t rows,
                                   int64_t cols, cudaStream_t s);

// keel.GatherGrad: dData [outer, A, inner] = 0, then dY [outer, J, inner] added at the indices (negative ones count
// from the end; out-of-range ones are skipped). acc: f32 scratch of outer * A * inner elements for F16 / BF16
// (unused for F32, which accumulates in place).
cudaError_t launch_gather_grad(int32_t dtype, const void* dy, int32_t index_dtype, const void* indices, void* ddata,
                               float* acc, int64_t outer, int64_t A, int64_t inner, int64_t J, cudaStream_t s);

// db[c] = sum of dy over [N, C, S] at channel c (f64 sums): a convolution's bias gradient.
cudaError_t launch_channel_sum(int32_t dtype, const void* dy, void* db, int64_t N, int64_t C, int64_t S,
                               cudaStream_t s);

// keel.DropoutMask: mask[i] = kept where element i's uniform is at least `cut`, else 0, over n elements of `dtype`.
// The uniforms: value i / 2 of the SplitMix64 stream *seed (device memory; I64, or I32 sign-extended), its low 32
// bits for even i and high for odd, as the reference kernel (ops/reference/grad.cc) computes them.
// ai.onnx.preview.training Momentum over up to kMomentumTensors f32 tensors in one launch (a multi-tensor update):
// for tensor i, with gr = g + norm * x (norm != 0), b = v * alpha + gr * beta (beta = 1 when *t is 0), x_out =
// x - (nesterov ? gr + b * alpha : b) * *r, v_out = b, each operation rounded to f32 as the CPU's SGD loop rounds
// them. r: f32 scalar and t: i64 scalar, both in device memory (read on the device: no host sync).
constexpr int kMomentumTensors = 16;
struct MomentumTensors {
  const float* x[kMomentumTensors];
  const float* g[kMomentumTensors];
  const float* v[kMomentumTensors];
  float* x_out[kMomentumTensors];
  float* v_out[kMomentumTensors];
  int64_t n[kMomentumTensors];
  int32_t count = 0;
};
cudaError_t launch_momentum(const MomentumTensors& ts, const float* r, const int64_t* t, float alpha, float beta,
                            float norm, bool nesterov, cudaStream_t s);

// keel.AdamStep over up to kMomentumTensors f32 tensors in one launch: PyTorch's Adam / AdamW, each operation rounded
// to f32 as the CPU loop rounds them (see ops/schemas.cc). scalars: f32[9] in device memory (decay_scale, weight
// decay, beta1, 1 - beta1, beta2, 1 - beta2, sqrt(1 - beta2^t), eps, lr / (1 - beta1^t)).
struct AdamTensors {
  const float* p[kMomentumTensors];
  const float* g[kMomentumTensors];
  const float* m[kMomentumTensors];
  const float* v[kMomentumTensors];
  float* p_out[kMomentumTensors];
  float* m_out[kMomentumTensors];
  float* v_out[kMomentumTensors];
  int64_t n[kMomentumTensors];
  int32_t count = 0;
};
cudaError_t launch_adam_step(const AdamTensors& ts, const float* scalars, cudaStream_t s);

// keel.CheckFiniteAndUnscale over up to kMomentumTensors gradients of one dtype (f32, f16, bf16) in one launch: u = g *
// *inv_scale computed in f32 and rounded to the dtype; *found (f32, device memory) is set to 1 when a u holds an inf
// or NaN and left as it is otherwise (the caller zeroes it once before the first launch of a call).
struct UnscaleTensors {
  const void* g[kMomentumTensors];
  void* u[kMomentumTensors];
  int64_t n[kMomentumTensors];
  int32_t count = 0;
};
cudaError_t launch_check_finite_and_unscale(const UnscaleTensors& ts, int32_t dtype, const float* inv_scale,
                                            float* found, cudaStream_t s);

cudaError_t launch_dropout_mask(int32_t dtype, void* mask, int64_t n, int32_t seed_dtype, const void* seed,
                                uint32_t cut, float kept, cudaStream_t s);

}  // namespace keel::cuda
