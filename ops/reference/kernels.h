// keel/ops/reference/kernels.h — the reference kernel functions, one per ONNX op (internal to ops/reference).
//
// Each function reads inputs/attributes and writes outputs through Kctx and reports errors by throwing
// KernelError; reference_kernels.cc wraps them into keel_kernel_def_t entries (the ordered registration list).
#pragma once

#include "ops/reference/kernel_util.h"

namespace keel::ops::ref {

using KernelFn = void (*)(Kctx&);

// Runs `fn` as the kernel of `op_type` on `ctx` and turns what it throws into a status: KernelError keeps its code,
// bad_alloc becomes OUT_OF_MEMORY, anything else INTERNAL, each naming the op. Every table of reference kernels
// (reference_kernels.cc, fused.cc, grad.cc) computes through it; defined in reference_kernels.cc.
keel_status_t run_kernel(const char* op_type, KernelFn fn, keel_kernel_context_t* ctx) noexcept;

// A keel-domain reference kernel (opset 1 onwards, "cpu"), as the fused and backward tables list them.
struct KeelKernel {
  const char* op_type;
  KernelFn fn;
};
// Registers `table[0..count)` as "ref_keel_<op>" kernels; `who` names the caller in errors. The table must outlive
// the registration (it is static data). Defined in reference_kernels.cc.
keel_status_t register_keel_kernels(const keel_core_api_t* host, keel_plugin_handle_t* plugin, const KeelKernel* table,
                                    size_t count, const char* who);

// elementwise.cc
void op_relu(Kctx&);
void op_sigmoid(Kctx&);
void op_tanh(Kctx&);
void op_exp(Kctx&);
void op_log(Kctx&);
void op_sqrt(Kctx&);
void op_reciprocal(Kctx&);
void op_erf(Kctx&);
void op_sin(Kctx&);
void op_cos(Kctx&);
void op_tan(Kctx&);
void op_asin(Kctx&);
void op_acos(Kctx&);
void op_atan(Kctx&);
void op_sinh(Kctx&);
void op_cosh(Kctx&);
void op_asinh(Kctx&);
void op_acosh(Kctx&);
void op_atanh(Kctx&);
void op_floor(Kctx&);
void op_ceil(Kctx&);
void op_round(Kctx&);
void op_softsign(Kctx&);
void op_softplus(Kctx&);
void op_mish(Kctx&);
void op_neg(Kctx&);
void op_abs(Kctx&);
void op_sign(Kctx&);
void op_leaky_relu(Kctx&);
void op_elu(Kctx&);
void op_celu(Kctx&);
void op_selu(Kctx&);
void op_hard_sigmoid(Kctx&);
void op_hard_swish(Kctx&);
void op_thresholded_relu(Kctx&);
void op_shrink(Kctx&);
void op_gelu(Kctx&);
void op_not(Kctx&);
void op_isnan(Kctx&);
void op_isinf(Kctx&);
void op_add(Kctx&);
void op_sub(Kctx&);
void op_mul(Kctx&);
void op_div(Kctx&);
void op_equal(Kctx&);
void op_less(Kctx&);
void op_greater(Kctx&);
void op_less_or_equal(Kctx&);
void op_greater_or_equal(Kctx&);
void op_and(Kctx&);
void op_or(Kctx&);
void op_xor(Kctx&);
void op_mod(Kctx&);
void op_bitshift(Kctx&);
void op_pow(Kctx&);
void op_prelu(Kctx&);
void op_max(Kctx&);
void op_min(Kctx&);
void op_sum(Kctx&);
void op_mean(Kctx&);
void op_where(Kctx&);
void op_clip(Kctx&);
void op_cast(Kctx&);
void op_cast_like(Kctx&);

// math_gemm.cc
void op_gemm(Kctx&);
void op_matmul(Kctx&);
void op_matmul_integer(Kctx&);
void op_qlinear_matmul(Kctx&);
void op_einsum(Kctx&);

// nn_conv.cc
void op_conv(Kctx&);
void op_conv_integer(Kctx&);
void op_qlinear_conv(Kctx&);
void op_conv_transpose(Kctx&);

// nn_pool.cc
void op_max_pool(Kctx&);
void op_average_pool(Kctx&);
void op_lp_pool(Kctx&);
void op_global_average_pool(Kctx&);
void op_global_max_pool(Kctx&);
void op_global_lp_pool(Kctx&);

// nn_norm.cc
void op_batch_normalization(Kctx&);
void op_layer_normalization(Kctx&);
void op_instance_normalization(Kctx&);
void op_lrn(Kctx&);
void op_mean_variance_normalization(Kctx&);
void op_dropout(Kctx&);
void op_softmax(Kctx&);
void op_log_softmax(Kctx&);
void op_hardmax(Kctx&);

// reduce.cc
void op_reduce_sum(Kctx&);
void op_reduce_mean(Kctx&);
void op_reduce_max(Kctx&);
void op_reduce_min(Kctx&);
void op_reduce_prod(Kctx&);
void op_reduce_l1(Kctx&);
void op_reduce_l2(Kctx&);
void op_reduce_log_sum(Kctx&);
void op_reduce_log_sum_exp(Kctx&);
void op_reduce_sum_square(Kctx&);
void op_argmax(Kctx&);
void op_argmin(Kctx&);
void op_cumsum(Kctx&);
void op_topk(Kctx&);

// tensor_shape.cc
void op_identity(Kctx&);
void op_reshape(Kctx&);
void op_flatten(Kctx&);
void op_squeeze(Kctx&);
void op_unsqueeze(Kctx&);
void op_transpose(Kctx&);
void op_concat(Kctx&);
void op_split(Kctx&);
void op_slice(Kctx&);
void op_gather(Kctx&);
void op_gather_elements(Kctx&);
void op_gather_nd(Kctx&);
void op_scatter_elements(Kctx&);
void op_scatter_nd(Kctx&);
void op_expand(Kctx&);
void op_tile(Kctx&);
void op_pad(Kctx&);
void op_shape(Kctx&);
void op_size(Kctx&);
void op_constant(Kctx&);
void op_constant_of_shape(Kctx&);
void op_range(Kctx&);
void op_nonzero(Kctx&);
void op_onehot(Kctx&);
void op_trilu(Kctx&);
void op_depth_to_space(Kctx&);
void op_space_to_depth(Kctx&);
void op_resize(Kctx&);
void op_upsample(Kctx&);
void op_eye_like(Kctx&);

// quant.cc
void op_quantize_linear(Kctx&);
void op_dequantize_linear(Kctx&);
void op_dynamic_quantize_linear(Kctx&);

// misc.cc
void op_compress(Kctx&);
void op_reverse_sequence(Kctx&);
void op_unique(Kctx&);
void op_non_max_suppression(Kctx&);
void op_max_unpool(Kctx&);
void op_det(Kctx&);
void op_hann_window(Kctx&);
void op_hamming_window(Kctx&);
void op_blackman_window(Kctx&);
void op_negative_log_likelihood_loss(Kctx&);
void op_softmax_cross_entropy_loss(Kctx&);

// rnn.cc
void op_rnn(Kctx&);
void op_gru(Kctx&);
void op_lstm(Kctx&);

// sampling.cc
void op_grid_sample(Kctx&);
void op_roi_align(Kctx&);

// text.cc
void op_tfidf_vectorizer(Kctx&);

// signal.cc
void op_dft(Kctx&);
void op_stft(Kctx&);
void op_mel_weight_matrix(Kctx&);

// training.cc (domain ai.onnx.preview.training)
void op_adagrad(Kctx&);
void op_adam(Kctx&);
void op_momentum(Kctx&);

}  // namespace keel::ops::ref
