// The ordered registration list of the reference CPU kernels, and the compute thunk that is the C edge: every
// exception a kernel throws stops here and becomes a keel_status_t.
#include "ops/reference/reference_kernels.h"

#include <new>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "ops/reference/kernels.h"

namespace keel::ops {
namespace {

using ref::KernelFn;

struct Entry {
  const char* op_type;
  int32_t since_version;  // first opset implemented
  int32_t end_version;    // last opset (inclusive); 0 = open-ended
  KernelFn fn;
  const char* domain = "";  // "" is ai.onnx
};

// ONNX (domain "") kernels, by family. Opset ranges start where the semantics the kernel implements begin
// (older opsets whose attributes differ are handled inside the kernel where noted in ops/STATUS.md); models older
// than opset 7 are upgraded by the core on load.
const Entry kEntries[] = {
    // --- the SimpleCNN set ---
    {"Conv", 1, 0, ref::op_conv},
    {"Relu", 1, 0, ref::op_relu},
    {"MaxPool", 1, 0, ref::op_max_pool},
    {"Flatten", 1, 0, ref::op_flatten},
    {"Gemm", 7, 0, ref::op_gemm},
    {"MatMul", 1, 0, ref::op_matmul},
    {"Add", 7, 0, ref::op_add},
    {"Sub", 7, 0, ref::op_sub},
    {"Mul", 7, 0, ref::op_mul},
    {"Div", 7, 0, ref::op_div},
    {"Reshape", 1, 0, ref::op_reshape},
    {"Softmax", 1, 0, ref::op_softmax},
    {"Identity", 1, 0, ref::op_identity},
    // --- elementwise math and activations ---
    {"Sigmoid", 1, 0, ref::op_sigmoid},
    {"Tanh", 1, 0, ref::op_tanh},
    {"Exp", 1, 0, ref::op_exp},
    {"Log", 1, 0, ref::op_log},
    {"Sqrt", 1, 0, ref::op_sqrt},
    {"Reciprocal", 1, 0, ref::op_reciprocal},
    {"Erf", 9, 0, ref::op_erf},
    {"Sin", 7, 0, ref::op_sin},
    {"Cos", 7, 0, ref::op_cos},
    {"Tan", 7, 0, ref::op_tan},
    {"Asin", 7, 0, ref::op_asin},
    {"Acos", 7, 0, ref::op_acos},
    {"Atan", 7, 0, ref::op_atan},
    {"Sinh", 9, 0, ref::op_sinh},
    {"Cosh", 9, 0, ref::op_cosh},
    {"Asinh", 9, 0, ref::op_asinh},
    {"Acosh", 9, 0, ref::op_acosh},
    {"Atanh", 9, 0, ref::op_atanh},
    {"Floor", 1, 0, ref::op_floor},
    {"Ceil", 1, 0, ref::op_ceil},
    {"Round", 11, 0, ref::op_round},
    {"Neg", 1, 0, ref::op_neg},
    {"Abs", 1, 0, ref::op_abs},
    {"Sign", 9, 0, ref::op_sign},
    {"Softsign", 1, 0, ref::op_softsign},
    {"Softplus", 1, 0, ref::op_softplus},
    {"Mish", 18, 0, ref::op_mish},
    {"LeakyRelu", 1, 0, ref::op_leaky_relu},
    {"Elu", 1, 0, ref::op_elu},
    {"Celu", 12, 0, ref::op_celu},
    {"Selu", 1, 0, ref::op_selu},
    {"HardSigmoid", 1, 0, ref::op_hard_sigmoid},
    {"HardSwish", 14, 0, ref::op_hard_swish},
    {"ThresholdedRelu", 10, 0, ref::op_thresholded_relu},
    {"Shrink", 9, 0, ref::op_shrink},
    {"Gelu", 20, 0, ref::op_gelu},
    {"PRelu", 7, 0, ref::op_prelu},
    {"Pow", 7, 0, ref::op_pow},
    {"Mod", 10, 0, ref::op_mod},
    {"BitShift", 11, 0, ref::op_bitshift},
    {"Max", 6, 0, ref::op_max},
    {"Min", 6, 0, ref::op_min},
    {"Sum", 6, 0, ref::op_sum},
    {"Mean", 6, 0, ref::op_mean},
    {"Clip", 6, 0, ref::op_clip},
    {"Cast", 6, 0, ref::op_cast},
    {"CastLike", 15, 0, ref::op_cast_like},
    {"IsNaN", 9, 0, ref::op_isnan},
    {"IsInf", 10, 0, ref::op_isinf},
    // --- comparison and logic ---
    {"Equal", 7, 0, ref::op_equal},
    {"Less", 7, 0, ref::op_less},
    {"Greater", 7, 0, ref::op_greater},
    {"LessOrEqual", 12, 0, ref::op_less_or_equal},
    {"GreaterOrEqual", 12, 0, ref::op_greater_or_equal},
    {"And", 7, 0, ref::op_and},
    {"Or", 7, 0, ref::op_or},
    {"Xor", 7, 0, ref::op_xor},
    {"Not", 1, 0, ref::op_not},
    {"Where", 9, 0, ref::op_where},
    // --- normalisation, softmax family, pooling ---
    {"BatchNormalization", 7, 0, ref::op_batch_normalization},
    {"LayerNormalization", 17, 0, ref::op_layer_normalization},
    {"InstanceNormalization", 1, 0, ref::op_instance_normalization},
    {"LRN", 1, 0, ref::op_lrn},
    {"MeanVarianceNormalization", 9, 0, ref::op_mean_variance_normalization},
    {"Dropout", 7, 0, ref::op_dropout},
    {"LogSoftmax", 1, 0, ref::op_log_softmax},
    {"Hardmax", 1, 0, ref::op_hardmax},
    {"AveragePool", 1, 0, ref::op_average_pool},
    {"LpPool", 2, 0, ref::op_lp_pool},
    {"GlobalAveragePool", 1, 0, ref::op_global_average_pool},
    {"GlobalMaxPool", 1, 0, ref::op_global_max_pool},
    {"GlobalLpPool", 2, 0, ref::op_global_lp_pool},
    {"ConvTranspose", 1, 0, ref::op_conv_transpose},
    // --- reductions ---
    {"ReduceSum", 1, 0, ref::op_reduce_sum},
    {"ReduceMean", 1, 0, ref::op_reduce_mean},
    {"ReduceMax", 1, 0, ref::op_reduce_max},
    {"ReduceMin", 1, 0, ref::op_reduce_min},
    {"ReduceProd", 1, 0, ref::op_reduce_prod},
    {"ReduceL1", 1, 0, ref::op_reduce_l1},
    {"ReduceL2", 1, 0, ref::op_reduce_l2},
    {"ReduceLogSum", 1, 0, ref::op_reduce_log_sum},
    {"ReduceLogSumExp", 1, 0, ref::op_reduce_log_sum_exp},
    {"ReduceSumSquare", 1, 0, ref::op_reduce_sum_square},
    {"ArgMax", 1, 0, ref::op_argmax},
    {"ArgMin", 1, 0, ref::op_argmin},
    {"CumSum", 11, 0, ref::op_cumsum},
    {"TopK", 1, 0, ref::op_topk},
    // --- tensor and shape ---
    {"Squeeze", 1, 0, ref::op_squeeze},
    {"Unsqueeze", 1, 0, ref::op_unsqueeze},
    {"Transpose", 1, 0, ref::op_transpose},
    {"Concat", 4, 0, ref::op_concat},
    {"Split", 2, 0, ref::op_split},
    {"Slice", 1, 0, ref::op_slice},
    {"Gather", 1, 0, ref::op_gather},
    {"GatherElements", 11, 0, ref::op_gather_elements},
    {"GatherND", 11, 0, ref::op_gather_nd},
    {"Scatter", 9, 10, ref::op_scatter_elements},
    {"ScatterElements", 11, 0, ref::op_scatter_elements},
    {"ScatterND", 11, 0, ref::op_scatter_nd},
    {"Expand", 8, 0, ref::op_expand},
    {"Tile", 6, 0, ref::op_tile},
    {"Pad", 2, 0, ref::op_pad},
    {"Shape", 1, 0, ref::op_shape},
    {"Size", 1, 0, ref::op_size},
    {"Constant", 1, 0, ref::op_constant},
    {"ConstantOfShape", 9, 0, ref::op_constant_of_shape},
    {"Range", 11, 0, ref::op_range},
    {"NonZero", 9, 0, ref::op_nonzero},
    {"OneHot", 9, 0, ref::op_onehot},
    {"Trilu", 14, 0, ref::op_trilu},
    {"DepthToSpace", 1, 0, ref::op_depth_to_space},
    {"SpaceToDepth", 1, 0, ref::op_space_to_depth},
    {"EyeLike", 9, 0, ref::op_eye_like},
    {"Einsum", 12, 0, ref::op_einsum},
    {"Resize", 10, 0, ref::op_resize},
    {"Upsample", 7, 10, ref::op_upsample},
    // --- misc ---
    {"Compress", 9, 0, ref::op_compress},
    {"ReverseSequence", 10, 0, ref::op_reverse_sequence},
    {"Unique", 11, 0, ref::op_unique},
    {"NonMaxSuppression", 10, 0, ref::op_non_max_suppression},
    {"MaxUnpool", 9, 0, ref::op_max_unpool},
    {"Det", 11, 0, ref::op_det},
    {"HannWindow", 17, 0, ref::op_hann_window},
    {"HammingWindow", 17, 0, ref::op_hamming_window},
    {"BlackmanWindow", 17, 0, ref::op_blackman_window},
    {"NegativeLogLikelihoodLoss", 12, 0, ref::op_negative_log_likelihood_loss},
    {"SoftmaxCrossEntropyLoss", 12, 0, ref::op_softmax_cross_entropy_loss},
    // --- quantization ---
    {"QuantizeLinear", 10, 0, ref::op_quantize_linear},
    {"DequantizeLinear", 10, 0, ref::op_dequantize_linear},
    {"DynamicQuantizeLinear", 11, 0, ref::op_dynamic_quantize_linear},
    {"MatMulInteger", 10, 0, ref::op_matmul_integer},
    {"QLinearMatMul", 10, 0, ref::op_qlinear_matmul},
    {"ConvInteger", 10, 0, ref::op_conv_integer},
    {"QLinearConv", 10, 0, ref::op_qlinear_conv},
    // --- recurrent ---
    {"RNN", 7, 0, ref::op_rnn},
    {"GRU", 7, 0, ref::op_gru},
    {"LSTM", 7, 0, ref::op_lstm},
    // --- sampling, text, signal ---
    {"GridSample", 16, 0, ref::op_grid_sample},
    {"RoiAlign", 10, 0, ref::op_roi_align},
    {"TfIdfVectorizer", 9, 0, ref::op_tfidf_vectorizer},
    {"DFT", 17, 0, ref::op_dft},
    {"STFT", 17, 0, ref::op_stft},
    {"MelWeightMatrix", 17, 0, ref::op_mel_weight_matrix},
    // --- training optimizers (domain ai.onnx.preview.training, opset 1) ---
    {"Adagrad", 1, 0, ref::op_adagrad, "ai.onnx.preview.training"},
    {"Adam", 1, 0, ref::op_adam, "ai.onnx.preview.training"},
    {"Momentum", 1, 0, ref::op_momentum, "ai.onnx.preview.training"},
};

keel_status_t compute_thunk(void* state, keel_kernel_context_t* ctx) {
  const Entry* e = static_cast<const Entry*>(state);
  return ref::run_kernel(e->op_type, e->fn, ctx);
}

}  // namespace

size_t reference_kernel_count() { return sizeof(kEntries) / sizeof(kEntries[0]); }

keel_status_t register_reference_kernels(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  if (host == nullptr || host->register_kernel == nullptr || host->kernel == nullptr)
    return make_c_status(KEEL_STATUS_INVALID_ARGUMENT, "register_reference_kernels: core API without kernel tables");
  const keel_kernel_api_t* api = host->kernel;
  if (api->abi_major != KEEL_PLUGIN_ABI_MAJOR || !KEEL_HAS_MEMBER(api, keel_kernel_api_t, thread_count))
    return make_c_status(KEEL_STATUS_ABI_MISMATCH, "register_reference_kernels: kernel API too old or mismatched");
  ref::g_kernel_api.store(api, std::memory_order_relaxed);
  try {
    for (const Entry& e : kEntries) {
      std::string name = "ref_";
      for (const char* c = e.op_type; *c; ++c) name += static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
      keel_kernel_def_t def{};
      def.struct_size = sizeof(def);
      def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
      def.abi_minor = KEEL_PLUGIN_ABI_MINOR;
      def.name = name.c_str();
      def.domain = e.domain;
      def.op_type = e.op_type;
      def.since_version = e.since_version;
      def.end_version = e.end_version;
      def.device_type = "cpu";
      def.constraints = nullptr;
      def.constraint_count = 0;
      def.user_data = const_cast<Entry*>(&e);
      def.create = nullptr;
      def.compute = compute_thunk;
      def.release = nullptr;
      if (keel_status_t s = host->register_kernel(plugin, &def)) return s;
    }
  } catch (const std::bad_alloc&) {
    return make_c_status(KEEL_STATUS_OUT_OF_MEMORY, "register_reference_kernels");
  }
  return nullptr;
}

}  // namespace keel::ops

namespace keel::ops::ref {

keel_status_t run_kernel(const char* op_type, KernelFn fn, keel_kernel_context_t* ctx) noexcept {
  try {
    Kctx k(ctx, op_type);
    fn(k);
    return nullptr;
  } catch (const KernelError& err) {
    return make_c_status(err.code(), err.what());
  } catch (const std::bad_alloc&) {
    try {
      return make_c_status(KEEL_STATUS_OUT_OF_MEMORY, (std::string(op_type) + ": out of memory").c_str());
    } catch (...) {
      return make_c_status(KEEL_STATUS_OUT_OF_MEMORY, op_type);
    }
  } catch (const std::exception& ex) {
    try {
      return make_c_status(KEEL_STATUS_INTERNAL, (std::string(op_type) + ": " + ex.what()).c_str());
    } catch (...) {
      return make_c_status(KEEL_STATUS_INTERNAL, op_type);
    }
  } catch (...) {
    return make_c_status(KEEL_STATUS_INTERNAL, op_type);
  }
}

keel_status_t register_keel_kernels(const keel_core_api_t* host, keel_plugin_handle_t* plugin, const KeelKernel* table,
                                    size_t count, const char* who) {
  if (host == nullptr || host->register_kernel == nullptr || host->kernel == nullptr)
    return make_c_status(KEEL_STATUS_INVALID_ARGUMENT, (std::string(who) + ": core API without kernel tables").c_str());
  const keel_kernel_api_t* unset = nullptr;
  g_kernel_api.compare_exchange_strong(unset, host->kernel, std::memory_order_relaxed);
  auto thunk = [](void* state, keel_kernel_context_t* ctx) {
    const KeelKernel* e = static_cast<const KeelKernel*>(state);
    return run_kernel(e->op_type, e->fn, ctx);
  };
  try {
    for (size_t i = 0; i < count; ++i) {
      const KeelKernel& e = table[i];
      std::string name = std::string("ref_keel_") + e.op_type;
      keel_kernel_def_t def{};
      def.struct_size = sizeof(def);
      def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
      def.abi_minor = KEEL_PLUGIN_ABI_MINOR;
      def.name = name.c_str();
      def.domain = "keel";
      def.op_type = e.op_type;
      def.since_version = 1;
      def.end_version = 0;
      def.device_type = "cpu";
      def.user_data = const_cast<KeelKernel*>(&e);
      def.compute = thunk;
      if (keel_status_t s = host->register_kernel(plugin, &def)) return s;
    }
  } catch (const std::bad_alloc&) {
    return make_c_status(KEEL_STATUS_OUT_OF_MEMORY, who);
  }
  return nullptr;
}

}  // namespace keel::ops::ref
