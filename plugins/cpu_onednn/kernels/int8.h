// plugins/cpu_onednn/kernels/int8.h — (internal) what the standalone INT8 kernels (kernels/int8.cc: keel.QConv,
// keel.QGemm) and the claimed chains' int8 steps (chain/ops/int8.cc, Builder::qconv / qgemm) share: reading a
// node's quantization parameters, the convolution's geometry, the oneDNN primitive descriptors with their scales,
// zero points and post-ops, the own depthwise kernel's set-up, and the prepacked weights. Both callers build the
// same primitives from the same node, so a chain computes what the standalone kernels compute, bit for bit where
// the layouts agree.
//
// Thread-safety: the functions are reentrant; objects are not shared between threads while being built.
#pragma once

#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/common.h"
#include "steps/int8_dw.h"
#include "steps/int8_pool.h"
#include "steps/int8_quant.h"

namespace keel::onednn {

// A node's inputs as the int8 set-up reads them, filled from a kernel context (standalone kernels) or from a
// claimed chain's recipe.
struct QInputView {
  bool present = false;
  int32_t dtype = KEEL_DTYPE_UNDEFINED;
  bool dims_known = false;
  Dims dims;
  const void* data = nullptr;  // a constant's values (null: computed at run time)
};
struct QNodeView {
  std::vector<QInputView> in;
  int32_t out_dtype = KEEL_DTYPE_UNDEFINED;
  std::string activation;                // attribute "activation": "", "Relu" or "Clip"
  std::vector<float> activation_params;  // attribute "activation_params" (Clip: {min, max})
  bool has_activation_params = false;

  bool has_input(int i) const { return i < static_cast<int>(in.size()) && in[static_cast<size_t>(i)].present; }
  int32_t dtype(int i) const { return has_input(i) ? in[static_cast<size_t>(i)].dtype : KEEL_DTYPE_UNDEFINED; }
  bool is_constant(int i) const { return has_input(i) && in[static_cast<size_t>(i)].data != nullptr; }
  bool dims_known(int i) const { return has_input(i) && in[static_cast<size_t>(i)].dims_known; }
  const Dims& dims(int i) const { return in.at(static_cast<size_t>(i)).dims; }
  template <class T>
  const T* data(int i) const {
    return static_cast<const T*>(in.at(static_cast<size_t>(i)).data);
  }
};

// oneDNN's type of a keel u8 / s8 / f32 (Reject otherwise).
dnnl::memory::data_type int8_dnnl_type(int32_t keel_dtype);

// What QConv and QGemm share: the quantization parameters (inputs 3..7), the fused activation and the primitive
// attributes built from them.
struct QuantSetup {
  int32_t x_type = KEEL_DTYPE_U8, y_type = KEEL_DTYPE_F32;  // x_type: the quantized X's type
  bool x_f32 = false;                                       // X arrives in f32 and is quantized first
  float x_scale = 1, y_scale = 1;
  int32_t x_zero = 0, y_zero = 0;
  std::vector<float> w_scale;
  std::vector<float> bias;      // f32, already divided by x_scale * w_scale[m]; empty = none
  std::vector<float> bias_f32;  // the bias as given (the own depthwise kernel's epilogue); empty = none
  std::string act;
  float act_lo = 0, act_hi = 0;
  bool residual = false;  // QConv input 8 (Z, f32, the output's shape; its layout: residual_layout)
  // Z added as a sum post-op (the caller puts Z in the destination first; an f32 output only) instead of a binary add:
  // oneDNN's brgemm int8 convolution and its int8 Winograd take a sum, not a binary add.
  bool residual_sum = false;

  // Reads inputs 0..7 and the activation; `channels`: output channels. Throws Reject for what the kernels do not do.
  void read(const QNodeView& c, int64_t channels);
  // Output scales (per channel when w_scale is), zero points (runtime), the residual (`residual_md`, when
  // `residual`) as a binary add or a sum (residual_sum), the activation as a post-op.
  dnnl::primitive_attr attr(int channel_dim, const dnnl::memory::desc& residual_md = {}) const;
  // The own quantization of an f32 X (1 / x_scale, x_zero, x_type).
  QuantizeSpec quantize_spec() const { return QuantizeSpec{1.f / x_scale, x_zero, x_type == KEEL_DTYPE_I8}; }
};

// Runtime zero-point memories (s32 scalars) a primitive binds at execution. Keep the object at a stable address
// (the memories point into it).
struct ZeroPoints {
  int32_t src = 0, dst = 0;
  dnnl::memory src_mem, dst_mem;
  void make(const QuantSetup& q);
  void add_to(std::unordered_map<int, dnnl::memory>& args) const;
};

// A QConv's geometry: weights [M, C/group, k...], strides, dilations (ONNX: 1 = dense), pads (begin..., end...).
struct QConvGeom {
  size_t rank = 0;  // of X and W: 3..5
  int64_t group = 1;
  Dims w_dims, strides, dilations, pads;
  // The attributes (auto_pad NOTSET or VALID only); Reject otherwise.
  void read(const Dims& w, int64_t group, const std::string& auto_pad, const Dims& strides, const Dims& dilations,
            const Dims& pads);
  // The output's dims for input dims x (Reject when they do not fit).
  Dims out_dims(const Dims& x) const;
  // The weights' dims as oneDNN takes them ([g, M/g, C/g, k...] when grouped) and their plain tag.
  Dims dnnl_weight_dims(int64_t C) const;
  dnnl::memory::format_tag plain_weight_tag() const;
  Dims pads_begin() const { return Dims(pads.begin(), pads.begin() + static_cast<int64_t>(rank - 2)); }
  Dims pads_end() const { return Dims(pads.begin() + static_cast<int64_t>(rank - 2), pads.end()); }
};

// The int8 convolution's primitive descriptor: source `x` in oneDNN's choice of layout (channels-last for int8),
// destination `dst_tag` (any, or channels-last when the node has a residual: the primitive then adds Z in that
// layout), weights in oneDNN's choice, bias, attributes from q. Throws dnnl::error when oneDNN has none.
dnnl::convolution_forward::primitive_desc qconv_primitive_desc(const QuantSetup& q, const QConvGeom& g, const Dims& x,
                                                               const Dims& y, dnnl::memory::format_tag dst_tag);

// oneDNN's int8 Winograd F(2x2,3x3) convolution (`jit_int8_wino`) of what `direct` (qconv_primitive_desc's)
// computes, over the same source and destination layouts: a candidate for the caller to time against `direct`
// (conv_pick.h). Nullopt where the option int8_winograd is off (common.h: its numerics are not the direct kernel's)
// or it does not apply: 2-D 3x3, stride and dilation 1, pads 0 or 1 alike on both sides, no groups, input and output
// channels multiples of 16, a u8 X with zero point 0, an output zero point 0, a residual only as a sum (residual_sum),
// no activation or Relu.
// Its weights (format_kind wino) are prepacked by int8_prepack as any others.
std::optional<dnnl::convolution_forward::primitive_desc> qconv_winograd_desc(
    const QuantSetup& q, const QConvGeom& g, const Dims& x, const Dims& y,
    const dnnl::convolution_forward::primitive_desc& direct);

// The int8 matmul of a QGemm: [M, K] u8/s8 (plain) x [K, N] s8 (oneDNN's layout) -> [M, N] (plain).
dnnl::matmul::primitive_desc qgemm_primitive_desc(const QuantSetup& q, int64_t M, int64_t K, int64_t N);

// The own int8 steps' quantization (steps/int8_dw.h's DwQuant: X's type and zero point, the output's type, scale and
// zero point, Relu / Clip bounds) and per-channel scales x_scale * w_scale[m] of a QConv's QuantSetup.
DwQuant own_int8_quant(const QuantSetup& q);
std::vector<float> own_int8_scales(const QuantSetup& q, int64_t channels);

// The own depthwise 3x3 kernel for this geometry, or null where it does not apply: a 2-D depthwise 3x3 convolution
// (one input and output channel per group, dilation 1, width stride 1, or 2 over at most 16 columns) over a
// quantized channels-last X into a channels-last output, with no residual and Relu / Clip / no activation, on a CPU
// with AVX-512 VNNI + VBMI (KEEL_ONEDNN_INT8_OWN=0 turns it off). w: the node's [C, 1, 3, 3] weights.
std::unique_ptr<Int8Depthwise3x3> int8_own_depthwise(const QuantSetup& q, const QConvGeom& g, const int8_t* w,
                                                     const Dims& x, const Dims& y, bool nhwc_in, bool nhwc_out);

// Constant weights from `plain` into `want` (Winograd's format too: transformed from the s8 values in f32, then
// requantized by oneDNN's reorder), into memory at `where` (null: memory the returned object owns).
dnnl::memory int8_prepack(const dnnl::memory::desc& plain, const dnnl::memory::desc& want, const int8_t* w,
                          void* where = nullptr);
// An f32 vector as memory of descriptor md (owned by the returned object).
dnnl::memory int8_bias_memory(const std::vector<float>& b, const dnnl::memory::desc& md);

}  // namespace keel::onednn
