// plugins/cpu_onednn/kernels/int8.cc — INT8 kernels: keel.QConv and keel.QGemm (the ops the `fuse_qdq` pass of
// passes/quantize_int8 makes from QDQ models; semantics in ops/reference/fused.cc) on oneDNN's int8 convolution and
// matmul primitives: u8/s8 activations x s8 weights -> s32 accumulation (VNNI where the CPU has it), per-channel
// output scales, the activation zero point as a runtime src zero point, the f32 bias, Relu/Clip as an eltwise
// post-op, and the requantisation (output scale + dst zero point, saturation) inside the primitive; the output is
// u8/s8, or f32 when the node has no y_scale. A QConv's residual input Z (a residual Add fuse_qdq folded in) is a
// binary-add post-op before the activation; with a quantized output the output scale then stays x_scale * w_scale
// and a linear post-op divides by y_scale last. With Z the primitive computes channels-last (oneDNN's jit
// int8 kernels add a same-layout Z only): Z in another layout (attribute residual_layout, default output_layout) is
// reordered first, and a plain output is reordered after.
//
// Every quantization parameter, the weights and the bias must be constants (they are, after fuse_qdq): the weights
// are reordered into the primitive's layout once per plan. oneDNN v2 adds the bias to the s32 accumulator before
// the output scale, so the f32 bias is stored divided by x_scale * w_scale[m]. Activations are reordered from and to
// the graph's plain layout around the primitive (oneDNN picks nhwc for int8), in workspace memory.
//
// An f32 X (a QuantizeLinear fuse_qdq folded into its reader) is quantized by the reorder into the primitive's
// layout: scale 1 / x_scale, x_zero_point as its dst zero point, into x_zero_point's type.
//
// QuantizeLinear / DequantizeLinear with a per-tensor constant scale and zero point run as one oneDNN reorder (what
// fuse_qdq leaves of them: e.g. a QuantizeLinear whose value several int8 nodes read).
//
// On CPUs with AVX-512 (int8_own_kernels(); KEEL_ONEDNN_INT8_OWN=0 turns them off) the plugin's own loops replace
// oneDNN where it is slow for MobileNet-sized tensors: the quantization of an f32 X (steps/int8_quant.h, in place of
// the quantizing reorders), the transpose of an f32 output from channels-last to plain (in place of the output
// reorder) and, with VNNI + VBMI, depthwise 3x3 QConvs over channels-last bytes
// (steps/int8_dw.h, in place of the whole plan). KEEL_ONEDNN_PROFILE=1 logs each step's fastest run.
//
// Registered by register_int8_kernels (called from plugin.cc's init) for device "cpu".
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <sstream>

#include "kernels/int8.h"

#include "common/conv_pick.h"

namespace keel::onednn {

// ------------------------------------------------------------------------------------ shared (kernels/int8.h)

dnnl::memory::data_type int8_dnnl_type(int32_t keel_dtype) {
  using dt = dnnl::memory::data_type;
  switch (keel_dtype) {
    case KEEL_DTYPE_U8: return dt::u8;
    case KEEL_DTYPE_I8: return dt::s8;
    case KEEL_DTYPE_F32: return dt::f32;
  }
  throw Reject{"unsupported dtype " + std::to_string(keel_dtype)};
}

namespace {

// A constant scalar input of a node, read through a QNodeView (the shared set-up) or a kernel context (the
// standalone QuantizeLinear / DequantizeLinear): both have the same accessors.
template <class Node>
float scalar_f32(const Node& c, int i, const char* what) {
  if (!c.is_constant(i) || numel(c.dims(i)) != 1 || c.dtype(i) != KEEL_DTYPE_F32)
    throw Reject{std::string(what) + " must be a constant f32 scalar"};
  return c.template data<float>(i)[0];
}

template <class Node>
int32_t scalar_zp(const Node& c, int i, const char* what) {
  if (!c.has_input(i)) return 0;
  if (!c.is_constant(i) || numel(c.dims(i)) != 1) throw Reject{std::string(what) + " must be a constant scalar"};
  if (c.dtype(i) == KEEL_DTYPE_U8) return c.template data<uint8_t>(i)[0];
  if (c.dtype(i) == KEEL_DTYPE_I8) return c.template data<int8_t>(i)[0];
  throw Reject{std::string(what) + " must be u8 or s8"};
}

}  // namespace

void QuantSetup::read(const QNodeView& c, int64_t channels) {
  x_f32 = c.dtype(0) == KEEL_DTYPE_F32;
  x_type = x_f32 ? (c.has_input(4) ? c.dtype(4) : KEEL_DTYPE_U8) : c.dtype(0);
  if (x_type != KEEL_DTYPE_U8 && x_type != KEEL_DTYPE_I8) throw Reject{"X must be u8, s8 or f32"};
  if (c.has_input(4) && c.dtype(4) != x_type) throw Reject{"x_zero_point's type differs from X's"};
  if (c.dtype(1) != KEEL_DTYPE_I8 || !c.is_constant(1) || !c.dims_known(1)) throw Reject{"W must be a constant s8"};
  x_scale = scalar_f32(c, 3, "x_scale");
  if (x_f32 && !(x_scale > 0 && std::isfinite(x_scale))) throw Reject{"x_scale must be positive to quantize an f32 X"};
  x_zero = scalar_zp(c, 4, "x_zero_point");
  if (!c.is_constant(5) || c.dtype(5) != KEEL_DTYPE_F32) throw Reject{"w_scale must be a constant f32"};
  const int64_t nws = numel(c.dims(5));
  if (nws != 1 && nws != channels) throw Reject{"w_scale must be a scalar or per output channel"};
  w_scale.assign(c.data<float>(5), c.data<float>(5) + nws);
  if (c.has_input(6) != c.has_input(7)) throw Reject{"y_scale without y_zero_point"};
  if (c.has_input(6)) {
    y_scale = scalar_f32(c, 6, "y_scale");
    y_zero = scalar_zp(c, 7, "y_zero_point");
    y_type = c.dtype(7);
    if (!(y_scale > 0)) throw Reject{"y_scale must be positive"};
  }
  if (c.out_dtype != y_type) throw Reject{"output dtype differs from y_zero_point's"};
  if (c.has_input(2)) {
    if (!c.is_constant(2) || c.dtype(2) != KEEL_DTYPE_F32 || numel(c.dims(2)) != channels)
      throw Reject{"bias must be a constant f32 with one entry per output channel"};
    const float* b = c.data<float>(2);
    bias_f32.assign(b, b + channels);
    bias.resize(static_cast<size_t>(channels));
    for (int64_t m = 0; m < channels; ++m) {
      const float s = x_scale * w_scale[nws == 1 ? 0 : m];
      bias[static_cast<size_t>(m)] = s != 0 ? b[m] / s : 0.f;
    }
  }
  act = c.activation;
  if (act == "Clip") {
    if (!c.has_activation_params || c.activation_params.size() != 2)
      throw Reject{"Clip needs activation_params {min, max}"};
    act_lo = c.activation_params[0];
    act_hi = c.activation_params[1];
  } else if (!act.empty() && act != "Relu") {
    throw Reject{"activation " + act};
  }
}

dnnl::primitive_attr QuantSetup::attr(int channel_dim, const dnnl::memory::desc& residual_md) const {
  dnnl::primitive_attr a = user_scratchpad();
  const bool quantized = y_type != KEEL_DTYPE_F32;
  // Post-ops see y / out_div; with a residual the division by y_scale moves behind the addition.
  const float out_div = quantized && !residual ? y_scale : 1.f;
  std::vector<float> scales(w_scale.size());
  for (size_t m = 0; m < w_scale.size(); ++m) scales[m] = x_scale * w_scale[m] / out_div;
  a.set_output_scales(w_scale.size() == 1 ? 0 : (1 << channel_dim), scales);
  if (x_zero != 0) a.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  if (y_zero != 0) a.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
  dnnl::post_ops po;
  // Post-ops see the scaled value: y (f32 output, or any output with Z) or y / y_scale (quantized output).
  if (residual && residual_sum) po.append_sum(1.f);
  else if (residual) po.append_binary(dnnl::algorithm::binary_add, residual_md);
  if (act == "Relu") po.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
  if (act == "Clip") po.append_eltwise(1.f, dnnl::algorithm::eltwise_clip, act_lo / out_div, act_hi / out_div);
  if (residual && quantized) po.append_eltwise(1.f, dnnl::algorithm::eltwise_linear, 1.f / y_scale, 0.f);
  a.set_post_ops(po);
  return a;
}

void ZeroPoints::make(const QuantSetup& q) {
  src = q.x_zero;
  dst = q.y_zero;
  dnnl::memory::desc md({1}, dnnl::memory::data_type::s32, dnnl::memory::format_tag::a);
  if (src != 0) src_mem = dnnl::memory(md, engine(), &src);
  if (dst != 0) dst_mem = dnnl::memory(md, engine(), &dst);
}

void ZeroPoints::add_to(std::unordered_map<int, dnnl::memory>& args) const {
  if (src != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC] = src_mem;
  if (dst != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST] = dst_mem;
}

void QConvGeom::read(const Dims& w, int64_t grp, const std::string& auto_pad, const Dims& s, const Dims& d,
                     const Dims& p) {
  w_dims = w;
  rank = w.size();
  if (rank < 3 || rank > 5) throw Reject{"rank"};
  group = grp;
  if (group <= 0) throw Reject{"group <= 0"};
  if (auto_pad != "NOTSET" && auto_pad != "VALID" && !auto_pad.empty()) throw Reject{"auto_pad " + auto_pad};
  const size_t r = rank - 2;
  strides = s;
  dilations = d;
  pads = auto_pad == "VALID" ? Dims(2 * r, 0) : p;
  if (strides.size() != r || dilations.size() != r || pads.size() != 2 * r) throw Reject{"attribute rank"};
}

Dims QConvGeom::out_dims(const Dims& x) const {
  if (x.size() != rank) throw Reject{"input rank changed"};
  const size_t r = rank - 2;
  const int64_t C = x[1], M = w_dims[0];
  if (C != w_dims[1] * group || M % group != 0) throw Reject{"channels do not match the weights and group"};
  Dims y{x[0], M};
  for (size_t i = 0; i < r; ++i) {
    const int64_t eff = (w_dims[2 + i] - 1) * dilations[i] + 1;
    const int64_t span = x[2 + i] + pads[i] + pads[i + r] - eff;
    if (span < 0 || strides[i] <= 0 || dilations[i] <= 0) throw Reject{"geometry"};
    y.push_back(span / strides[i] + 1);
  }
  if (numel(y) == 0) throw Reject{"empty output"};
  return y;
}

Dims QConvGeom::dnnl_weight_dims(int64_t C) const {
  const int64_t M = w_dims[0];
  Dims wei = group > 1 ? Dims{group, M / group, C / group} : Dims{M, C};
  for (size_t i = 2; i < rank; ++i) wei.push_back(w_dims[i]);
  return wei;
}

dnnl::memory::format_tag QConvGeom::plain_weight_tag() const {
  using tag = dnnl::memory::format_tag;
  static const tag wtag[2][3] = {{tag::oiw, tag::oihw, tag::oidhw}, {tag::goiw, tag::goihw, tag::goidhw}};
  return wtag[group > 1][rank - 3];
}

dnnl::convolution_forward::primitive_desc qconv_primitive_desc(const QuantSetup& q, const QConvGeom& g, const Dims& x,
                                                               const Dims& y, dnnl::memory::format_tag dst_tag) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const size_t r = g.rank - 2;
  static const tag last[3] = {tag::nwc, tag::nhwc, tag::ndhwc};
  Dims dil(r);
  for (size_t i = 0; i < r; ++i) dil[i] = g.dilations[i] - 1;
  const dt xt = int8_dnnl_type(q.x_type), yt = int8_dnnl_type(q.y_type);
  dnnl::memory::desc src_any(to_dnnl(x), xt, tag::any), dst(to_dnnl(y), yt, dst_tag),
      wei_any(to_dnnl(g.dnnl_weight_dims(x[1])), dt::s8, tag::any), bias_md({g.w_dims[0]}, dt::f32, tag::a), none,
      z_md = q.residual ? dnnl::memory::desc(to_dnnl(y), dt::f32, last[r - 1]) : none;
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_any,
                                    wei_any, q.bias.empty() ? none : bias_md, dst, to_dnnl(g.strides), to_dnnl(dil),
                                    to_dnnl(g.pads_begin()), to_dnnl(g.pads_end()));
  return dnnl::convolution_forward::primitive_desc(d, q.attr(1, z_md), engine());
}

std::optional<dnnl::convolution_forward::primitive_desc> qconv_winograd_desc(
    const QuantSetup& q, const QConvGeom& g, const Dims& x, const Dims& y,
    const dnnl::convolution_forward::primitive_desc& direct) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const Dims& w = g.w_dims;
  const Dims& p = g.pads;
  if (options().int8_winograd == Options::Choice::kOff || g.rank != 4 || g.group != 1 || w[2] != 3 || w[3] != 3 ||
      x[1] % 16 != 0 || w[0] % 16 != 0 || g.strides != Dims{1, 1} || g.dilations != Dims{1, 1} || p[0] != p[2] ||
      p[1] != p[3] || p[0] < 0 || p[0] > 1 || p[1] < 0 || p[1] > 1 || q.x_type != KEEL_DTYPE_U8 || q.x_zero != 0 ||
      q.y_zero != 0 || (q.residual && !q.residual_sum) || (!q.act.empty() && q.act != "Relu"))
    return std::nullopt;
  const dnnl::memory::desc src(to_dnnl(x), dt::u8, tag::nhwc);
  if (direct.src_desc() != src ||
      direct.dst_desc() != dnnl::memory::desc(to_dnnl(y), int8_dnnl_type(q.y_type), tag::nhwc))
    return std::nullopt;
  const dnnl::memory::desc wei_any(to_dnnl(w), dt::s8, tag::any), bias_md({w[0]}, dt::f32, tag::a), none;
  try {
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_winograd, src,
                                      wei_any, q.bias.empty() ? none : bias_md, direct.dst_desc(), {1, 1}, {0, 0},
                                      {p[0], p[1]}, {p[2], p[3]});
    dnnl::convolution_forward::primitive_desc pd(d, q.attr(1), engine());
    if (std::string(pd.impl_info_str()).rfind("jit_int8_wino", 0) != 0) return std::nullopt;
    return pd;
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

dnnl::matmul::primitive_desc qgemm_primitive_desc(const QuantSetup& q, int64_t M, int64_t K, int64_t N) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::memory::desc src_md({M, K}, int8_dnnl_type(q.x_type), tag::ab),
      dst_md({M, N}, int8_dnnl_type(q.y_type), tag::ab), wei_any({K, N}, dt::s8, tag::any),
      bias_md({1, N}, dt::f32, tag::ab), none;
  dnnl::matmul::desc d(src_md, wei_any, q.bias.empty() ? none : bias_md, dst_md);
  return dnnl::matmul::primitive_desc(d, q.attr(1), engine());
}

std::unique_ptr<Int8Depthwise3x3> int8_own_depthwise(const QuantSetup& q, const QConvGeom& g, const int8_t* w,
                                                     const Dims& x, const Dims& y, bool nhwc_in, bool nhwc_out) {
  const Dims& wd = g.w_dims;
  if (g.rank != 4 || g.group != x[1] || wd[0] != g.group || wd[1] != 1 || wd[2] != 3 || wd[3] != 3 || q.x_f32 ||
      q.residual || !nhwc_in || !nhwc_out || !Int8Depthwise3x3::available())
    return nullptr;
  if (g.dilations[0] != 1 || g.dilations[1] != 1 || (g.strides[1] != 1 && g.strides[1] != 2)) return nullptr;
  // A stride-2 row copies twice the input columns per output; over wide inputs that costs more than oneDNN's
  // direct kernel saves (MobileNetV2, 2 threads, per-step minima: 144 channels 56x56 -> 28x28 0.036 vs 0.022 ms,
  // 192 at 28x28 -> 14x14 level, 576 at 14x14 -> 7x7 1.1-1.5x faster).
  if (g.strides[1] == 2 && x[3] > 16) return nullptr;
  DwShape s;
  s.N = x[0], s.C = x[1], s.H = x[2], s.W = x[3], s.OH = y[2], s.OW = y[3];
  s.stride_h = g.strides[0], s.stride_w = g.strides[1], s.pad_t = g.pads[0], s.pad_l = g.pads[1];
  const std::vector<float> scale = own_int8_scales(q, s.C);
  return std::make_unique<Int8Depthwise3x3>(s, own_int8_quant(q), w, scale.data(),
                                            q.bias_f32.empty() ? nullptr : q.bias_f32.data());
}

DwQuant own_int8_quant(const QuantSetup& q) {
  DwQuant dq;
  dq.x_signed = q.x_type == KEEL_DTYPE_I8;
  dq.x_zero = q.x_zero;
  dq.out = q.y_type == KEEL_DTYPE_U8   ? DwQuant::Out::kU8
           : q.y_type == KEEL_DTYPE_I8 ? DwQuant::Out::kS8
                                       : DwQuant::Out::kF32;
  dq.y_inv_scale = 1.f / q.y_scale;
  dq.y_zero = q.y_zero;
  if (q.act == "Relu") dq.lo = 0;
  if (q.act == "Clip") dq.lo = q.act_lo, dq.hi = q.act_hi;
  return dq;
}

std::vector<float> own_int8_scales(const QuantSetup& q, int64_t channels) {
  std::vector<float> scale(static_cast<size_t>(channels));
  for (size_t m = 0; m < scale.size(); ++m) scale[m] = q.x_scale * q.w_scale[q.w_scale.size() == 1 ? 0 : m];
  return scale;
}

dnnl::memory int8_prepack(const dnnl::memory::desc& plain, const dnnl::memory::desc& want, const int8_t* w,
                          void* where) {
  auto& eng = engine();
  dnnl::memory packed = where ? dnnl::memory(want, eng, where) : dnnl::memory(want, eng);
  if (want.data.format_kind == dnnl_format_kind_wino) {
    // oneDNN transforms Winograd weights from f32 only: the s8 values as floats (exact), scale 1. (Only 2-D
    // ungrouped convolutions have such weights: plain is oihw.)
    std::vector<float> wf(plain.get_size());
    for (size_t i = 0; i < wf.size(); ++i) wf[i] = static_cast<float>(w[i]);
    dnnl::memory user(dnnl::memory::desc(plain.dims(), dnnl::memory::data_type::f32, dnnl::memory::format_tag::oihw),
                      eng, wf.data());
    dnnl::reorder(user, packed).execute(stream(), user, packed);
  } else {
    dnnl::memory user(plain, eng, const_cast<int8_t*>(w));
    dnnl::reorder(user, packed).execute(stream(), user, packed);
  }
  stream().wait();
  return packed;
}

dnnl::memory int8_bias_memory(const std::vector<float>& b, const dnnl::memory::desc& md) {
  dnnl::memory m(md, engine());
  std::copy(b.begin(), b.end(), static_cast<float*>(m.get_data_handle()));
  return m;
}

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// KEEL_ONEDNN_PROFILE=1: each int8 kernel keeps the fastest run of its plan (reorders included) and logs it, with what
// ran, when it is released (at info): per-step minima, comparable with the claimed chains' "fastest run of each".
struct StepProfile {
  std::string what;
  double best_ms = 1e30;
  double part_ms[3] = {1e30, 1e30, 1e30};  // execute(): the input reorders, the primitive, the output reorder
  int64_t runs = 0;
  static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void part(int i, double t0) { part_ms[i] = std::min(part_ms[i], now_ms() - t0); }
  template <class F>
  void time(F&& f) {
    if (!options().profile) return f();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    best_ms = std::min(best_ms, ms);
    ++runs;
  }
  ~StepProfile() {
    if (!runs) return;
    std::ostringstream os;
    os << "int8 step " << what << ": fastest " << best_ms << " ms of " << runs << " runs (input reorders "
       << (part_ms[0] < 1e30 ? part_ms[0] : 0) << ", kernel " << part_ms[1] << ", output reorder "
       << (part_ms[2] < 1e30 ? part_ms[2] : 0) << ")";
    host_log(KEEL_LOG_INFO, os.str());
  }
};

// The node's inputs and activation as the shared set-up (kernels/int8.h) reads them.
QNodeView view_of(const Ctx& c) {
  QNodeView v;
  v.in.resize(static_cast<size_t>(c.input_count()));
  for (int i = 0; i < c.input_count(); ++i) {
    QInputView& x = v.in[static_cast<size_t>(i)];
    x.present = c.has_input(i);
    if (!x.present) continue;
    x.dtype = c.dtype(i);
    x.dims_known = c.dims_known(i);
    if (c.rank_known(i)) x.dims = c.dims(i);
    x.data = c.is_constant(i) ? c.input(i)->data : nullptr;
  }
  v.out_dtype = c.output_dtype(0);
  v.activation = c.attr_s("activation", "");
  const float* f = nullptr;
  size_t n = 0;
  if (g_kernel_api.load(std::memory_order_relaxed)->attr_floats(c.raw(), "activation_params", &f, &n)) {
    v.has_activation_params = true;
    v.activation_params.assign(f, f + n);
  }
  return v;
}

struct QPlan {
  Dims out_dims;
  // The plugin's own depthwise 3x3 kernel (steps/int8_dw.h) in place of everything below, where it applies.
  std::unique_ptr<Int8Depthwise3x3> dw;
  dnnl::primitive prim;
  dnnl::memory src_user, src_prim, dst_user, dst_prim, wei, bias;
  bool residual = false;  // a QConv's Z (input 8) as a binary-add post-op
  bool reorder_src = false, reorder_dst = false;
  bool quantize_src = false;      // src_reorder quantizes an f32 X (dst zero point: zp->src_mem)
  size_t residual_post_op = 0;    // the binary add's index among the post-ops
  bool reorder_residual = false;  // Z is reordered into residual_prim (workspace) first
  dnnl::memory residual_user, residual_prim;
  dnnl::reorder residual_reorder;
  dnnl::reorder src_reorder, dst_reorder;
  // An f32 X whose layout differs from the primitive's is first reordered to f32 in the primitive's layout
  // (src_mid, workspace), then quantized without a transpose: two jit reorders, about half the time of one
  // quantizing transpose (oneDNN 2.6, e.g. 1x24x56x56: 65 -> 34 us at 1 thread).
  bool transpose_src = false;
  dnnl::memory src_mid;
  dnnl::reorder transpose_reorder;
  // The plugin's own quantization of an f32 X (steps/int8_quant.h) in place of src_reorder / transpose_reorder:
  // kSame when X has the primitive's layout, kToNhwc from plain [N, C, spatial] into the primitive's channels-last.
  enum class OwnQuant { kNone, kSame, kToNhwc } own_quant = OwnQuant::kNone;
  QuantizeSpec own_q;
  int64_t own_n = 1, own_c = 1, own_s = 1;  // kSame: own_n elements; kToNhwc: [own_n, own_c, own_s]
  // The plugin's own transpose of an f32 output from the primitive's channels-last layout to plain
  // (nhwc_to_nchw_f32) in place of dst_reorder: [own_dst_n, own_dst_c, own_dst_s].
  bool own_dst = false;
  int64_t own_dst_n = 1, own_dst_c = 1, own_dst_s = 1;
  std::unique_ptr<ZeroPoints> zp = std::make_unique<ZeroPoints>();  // stable addresses for the memories
  // The primitive's arguments, built once per plan (finish()); execute() only rebinds the data handles, which the
  // map's memory objects share.
  std::unordered_map<int, dnnl::memory> args, src_reorder_args;

  void finish(bool has_bias) {
    args = {{DNNL_ARG_SRC, src_prim}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst_prim}};
    if (has_bias) args[DNNL_ARG_BIAS] = bias;
    if (residual)
      args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(static_cast<int>(residual_post_op)) | DNNL_ARG_SRC_1] = residual_prim;
    zp->add_to(args);
    src_reorder_args = {{DNNL_ARG_FROM, transpose_src ? src_mid : src_user}, {DNNL_ARG_TO, src_prim}};
    if (quantize_src && zp->src != 0) src_reorder_args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST] = zp->src_mem;
  }
};

void execute(Ctx& c, QPlan& p, StepProfile& prof) {
  keel_tensor_t* y = c.output(0, p.out_dims);
  const bool timed = options().profile;
  double t0 = timed ? StepProfile::now_ms() : 0;
  if (p.dw) {
    p.dw->run(c.input(0)->data, y->data, omp_get_max_threads());
    if (timed) prof.part(1, t0);
    return;
  }
  auto& s = stream();
  bind(p.src_user, c.input(0)->data);
  bind(p.dst_user, y->data);
  if (p.reorder_src && p.own_quant != QPlan::OwnQuant::kNone) {
    void* q = c.workspace(p.src_prim.get_desc().get_size());
    bind(p.src_prim, q);
    const float* xf = static_cast<const float*>(c.input(0)->data);
    if (p.own_quant == QPlan::OwnQuant::kSame) quantize_f32(xf, q, p.own_n, p.own_q, omp_get_max_threads());
    else quantize_f32_to_nhwc(xf, q, p.own_n, p.own_c, p.own_s, p.own_q, omp_get_max_threads());
  } else if (p.reorder_src) {
    bind(p.src_prim, c.workspace(p.src_prim.get_desc().get_size()));
    if (p.transpose_src) {
      bind(p.src_mid, c.workspace(p.src_mid.get_desc().get_size()));
      p.transpose_reorder.execute(s, p.src_user, p.src_mid);
    }
    p.src_reorder.execute(s, p.src_reorder_args);
  }
  if (p.reorder_dst) bind(p.dst_prim, c.workspace(p.dst_prim.get_desc().get_size()));
  if (p.residual) {
    if (p.reorder_residual) {
      bind(p.residual_user, c.input(8)->data);
      bind(p.residual_prim, c.workspace(p.residual_prim.get_desc().get_size()));
      p.residual_reorder.execute(s, p.residual_user, p.residual_prim);
    } else {
      bind(p.residual_prim, c.input(8)->data);
    }
  }
  if (timed) {
    s.wait();
    if (p.reorder_src || p.reorder_residual) prof.part(0, t0);
    t0 = StepProfile::now_ms();
  }
  onednn::execute(p.prim, s, p.args);  // the scratchpad-aware one (common/scratchpad.h), not this file's
  if (timed) {
    s.wait();
    prof.part(1, t0);
    t0 = StepProfile::now_ms();
  }
  if (p.reorder_dst && p.own_dst) {
    s.wait();
    nhwc_to_nchw_f32(static_cast<const float*>(p.dst_prim.get_data_handle()), static_cast<float*>(y->data), p.own_dst_n,
                     p.own_dst_c, p.own_dst_s, omp_get_max_threads());
  } else if (p.reorder_dst) {
    p.dst_reorder.execute(s, p.dst_prim, p.dst_user);
  }
  s.wait();
  if (timed && p.reorder_dst) prof.part(2, t0);
}

// Plain memory + primitive memory (+ a reorder between them when the layouts differ; for an f32 X, the reorder
// quantizes). `src_mid`, when not empty: the f32 X in the primitive's layout, the transpose's target before the
// quantizing reorder (QPlan::transpose_src).
void wire(QPlan& p, const QuantSetup& q, const dnnl::memory::desc& src_plain, const dnnl::memory::desc& src_md,
          const dnnl::memory::desc& dst_plain, const dnnl::memory::desc& dst_md,
          const dnnl::memory::desc& src_mid = {}) {
  auto& eng = engine();
  p.src_user = dnnl::memory(src_plain, eng, nullptr);
  p.dst_user = dnnl::memory(dst_plain, eng, nullptr);
  p.reorder_src = src_md != src_plain;
  p.reorder_dst = dst_md != dst_plain;
  p.src_prim = p.reorder_src ? dnnl::memory(src_md, eng, nullptr) : p.src_user;
  p.dst_prim = p.reorder_dst ? dnnl::memory(dst_md, eng, nullptr) : p.dst_user;
  p.quantize_src = q.x_f32;
  if (p.quantize_src) {
    dnnl::primitive_attr a;
    a.set_output_scales(0, {1.f / q.x_scale});
    if (q.x_zero != 0) a.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
    p.transpose_src = p.reorder_src && !src_mid.is_zero() && src_mid != src_plain;
    if (p.transpose_src) {
      p.src_mid = dnnl::memory(src_mid, eng, nullptr);
      p.transpose_reorder = dnnl::reorder(p.src_user, p.src_mid);
    }
    p.src_reorder =
        dnnl::reorder(dnnl::reorder::primitive_desc(eng, p.transpose_src ? src_mid : src_plain, eng, src_md, a));
  } else if (p.reorder_src) {
    p.src_reorder = dnnl::reorder(p.src_user, p.src_prim);
  }
  if (p.reorder_dst) p.dst_reorder = dnnl::reorder(p.dst_prim, p.dst_user);
}

// Lets the plan quantize its f32 X with the plugin's own loop (`kind`; shape as QPlan::own_n/c/s) where the CPU runs
// it.
void own_quantize(QPlan& p, const QuantSetup& q, QPlan::OwnQuant kind, int64_t n, int64_t c = 1, int64_t s = 1) {
  if (!q.x_f32 || !p.reorder_src || !int8_own_kernels()) return;
  p.own_quant = kind;
  p.own_q = QuantizeSpec{1.f / q.x_scale, q.x_zero, q.x_type == KEEL_DTYPE_I8};
  p.own_n = n;
  p.own_c = c;
  p.own_s = s;
}

// ------------------------------------------------------------------------------------------------ QConv

class QConvKernel : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (!c.rank_known(0) || !c.dims_known(1)) throw Reject{"shapes unknown"};
    const Dims w_dims = c.dims(1);
    const size_t r = w_dims.size() >= 2 ? w_dims.size() - 2 : 0;
    g_.read(w_dims, c.attr_i("group", 1), c.attr_s("auto_pad", "NOTSET"), c.attr_ints("strides", Dims(r, 1)),
            c.attr_ints("dilations", Dims(r, 1)), c.attr_ints("pads", Dims(2 * r, 0)));
    if (c.dims(0).size() != g_.rank) throw Reject{"rank"};
    q_.read(view_of(c), w_dims[0]);
    q_.residual = c.has_input(8);
    if (q_.residual && c.dtype(8) != KEEL_DTYPE_F32) throw Reject{"Z must be f32"};
    const int8_t* w = c.data<int8_t>(1);
    w_.assign(w, w + numel(w_dims));
    nhwc_in_ = c.attr_s("input_layout", "NCHW") == "NHWC";
    nhwc_out_ = c.attr_s("output_layout", "NCHW") == "NHWC";
    nhwc_z_ = c.attr_s("residual_layout", nhwc_out_ ? "NHWC" : "NCHW") == "NHWC";
    if (c.output_count() > 1) throw Reject{"extra outputs"};
    if (c.dims_known(0)) plans_.get(shape_key(c), [&] { return build(c.dims(0)); });
  }

  void run(Ctx& c) override {
    const Dims x = c.dims(0);
    QPlan& p = plans_.get(shape_key(c), [&] { return build(x); });
    if (q_.residual && c.dims(8) != p.out_dims)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT,
                    "QConv: Z " + dims_str(c.dims(8)) + " must have the output's shape " + dims_str(p.out_dims)};
    prof_.time([&] { execute(c, p, prof_); });
  }

 private:
  std::unique_ptr<QPlan> build(const Dims& x) {
    const Dims y = g_.out_dims(x);
    const size_t r = g_.rank - 2;
    const int64_t N = x[0], C = x[1], M = g_.w_dims[0];
    auto p = std::make_unique<QPlan>();
    p->out_dims = y;
    if (auto dw = int8_own_depthwise(q_, g_, w_.data(), x, y, nhwc_in_, nhwc_out_)) {
      p->dw = std::move(dw);
      prof_.what = "QConv " + dims_str(x) + " -> " + dims_str(y) + " k3 s" + std::to_string(g_.strides[0]) + " g" +
                   std::to_string(g_.group) + " own depthwise (avx512 vnni)";
      return p;
    }
    const dt xt = int8_dnnl_type(q_.x_type), yt = int8_dnnl_type(q_.y_type);
    static const tag plain[3] = {tag::ncw, tag::nchw, tag::ncdhw}, last[3] = {tag::nwc, tag::nhwc, tag::ndhwc};
    const tag y_tag = nhwc_out_ ? last[r - 1] : plain[r - 1];
    // With a residual the primitive computes channels-last, Z read in that layout.
    const dnnl::memory::desc none, z_md = q_.residual ? dnnl::memory::desc(to_dnnl(y), dt::f32, last[r - 1]) : none;
    auto pd = qconv_primitive_desc(q_, g_, x, y, q_.residual ? last[r - 1] : tag::any);
    if (auto wino = qconv_winograd_desc(q_, g_, x, y, pd)) {  // the option int8_winograd: always, or if faster
      std::vector<dnnl::convolution_forward::primitive_desc> cands{pd, *wino};
      const bool timed = options().int8_winograd == Options::Choice::kTimed;
      pd = cands[timed ? fastest_conv_remembered(cands, engine(), stream(), {0, 0.05}) : 1];
    }
    p->prim = dnnl::convolution_forward(pd);
    prof_.what = "QConv " + dims_str(x) + " -> " + dims_str(y) + " k" + std::to_string(g_.w_dims.back()) + " s" +
                 std::to_string(g_.strides[0]) + " g" + std::to_string(g_.group) + " " + pd.impl_info_str();
    // An f32 X in the plain layout for a channels-last primitive: transposed in f32, then quantized.
    const dnnl::memory::desc src_last(to_dnnl(x), xt, last[r - 1]),
        src_mid = q_.x_f32 && !nhwc_in_ && pd.src_desc() == src_last
                      ? dnnl::memory::desc(to_dnnl(x), dt::f32, last[r - 1])
                      : none;
    wire(*p, q_, dnnl::memory::desc(to_dnnl(x), q_.x_f32 ? dt::f32 : xt, nhwc_in_ ? last[r - 1] : plain[r - 1]),
         pd.src_desc(), dnnl::memory::desc(to_dnnl(y), yt, y_tag), pd.dst_desc(), src_mid);
    if (pd.src_desc() == src_last) {
      const int64_t S = numel(x) / std::max<int64_t>(N * C, 1);
      if (nhwc_in_) own_quantize(*p, q_, QPlan::OwnQuant::kSame, numel(x));
      // (Any channel count: a 3-channel image is one partial group of 4, ResNet-18's input quantized in 0.09 ms
      // against 0.29 for oneDNN's reorder at 1 thread.)
      else own_quantize(*p, q_, QPlan::OwnQuant::kToNhwc, N, C, S);
    }
    if (p->own_quant != QPlan::OwnQuant::kNone) prof_.what += " +own quantize";
    if (q_.y_type == KEEL_DTYPE_F32 && !nhwc_out_ && p->reorder_dst && int8_own_kernels() &&
        pd.dst_desc() == dnnl::memory::desc(to_dnnl(y), dt::f32, last[r - 1])) {
      p->own_dst = true;
      p->own_dst_n = N;
      p->own_dst_c = M;
      p->own_dst_s = numel(y) / std::max<int64_t>(N * M, 1);
      prof_.what += " +own transpose";
    }
    if (q_.residual) {
      p->residual = true;
      p->residual_post_op = 0;
      p->residual_prim = dnnl::memory(z_md, engine(), nullptr);
      p->reorder_residual = !nhwc_z_;
      if (p->reorder_residual) {
        p->residual_user = dnnl::memory(dnnl::memory::desc(to_dnnl(y), dt::f32, plain[r - 1]), engine(), nullptr);
        p->residual_reorder = dnnl::reorder(p->residual_user, p->residual_prim);
      }
    }
    p->wei = int8_prepack(dnnl::memory::desc(to_dnnl(g_.dnnl_weight_dims(C)), dt::s8, g_.plain_weight_tag()),
                          pd.weights_desc(), w_.data());
    if (!q_.bias.empty()) p->bias = int8_bias_memory(q_.bias, dnnl::memory::desc({M}, dt::f32, tag::a));
    p->zp->make(q_);
    p->finish(!q_.bias.empty());
    return p;
  }

  bool nhwc_in_ = false, nhwc_out_ = false, nhwc_z_ = false;  // channels-last bytes under the NCHW shape (fuse_qdq)
  QConvGeom g_;
  std::vector<int8_t> w_;
  QuantSetup q_;
  PlanCache<QPlan> plans_;
  StepProfile prof_;
};

// ------------------------------------------------------------------------------------------------ QGemm

class QGemmKernel : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (!c.rank_known(0) || !c.dims_known(1)) throw Reject{"shapes unknown"};
    w_dims_ = c.dims(1);
    if (w_dims_.size() != 2 || c.dims(0).size() < 2) throw Reject{"A rank >= 2 and a 2-D B"};
    trans_b_ = c.attr_i("transB", 0) != 0;
    K_ = trans_b_ ? w_dims_[1] : w_dims_[0];
    N_ = trans_b_ ? w_dims_[0] : w_dims_[1];
    q_.read(view_of(c), N_);
    if (c.input_count() > 8) throw Reject{"QGemm has 8 inputs at most"};
    const int8_t* w = c.data<int8_t>(1);
    w_.assign(w, w + numel(w_dims_));
    if (c.output_count() > 1) throw Reject{"extra outputs"};
    if (c.dims_known(0)) plans_.get(shape_key(c), [&] { return build(c.dims(0)); });
  }

  void run(Ctx& c) override {
    const Dims x = c.dims(0);
    QPlan& p = plans_.get(shape_key(c), [&] { return build(x); });
    prof_.time([&] { execute(c, p, prof_); });
  }

 private:
  std::unique_ptr<QPlan> build(const Dims& a) {
    if (a.size() < 2 || a.back() != K_) throw Reject{"A's last dimension differs from B's K"};
    const int64_t M = numel(a) / K_;
    auto p = std::make_unique<QPlan>();
    p->out_dims = Dims(a.begin(), a.end() - 1);
    p->out_dims.push_back(N_);
    if (M == 0) throw Reject{"empty input"};
    const dt xt = int8_dnnl_type(q_.x_type), yt = int8_dnnl_type(q_.y_type);
    const dnnl::memory::desc src_md({M, K_}, xt, tag::ab), dst_md({M, N_}, yt, tag::ab);
    auto pd = qgemm_primitive_desc(q_, M, K_, N_);
    p->prim = dnnl::matmul(pd);
    prof_.what = "QGemm " + dims_str(a) + " N" + std::to_string(N_) + " " + pd.impl_info_str();
    wire(*p, q_, q_.x_f32 ? dnnl::memory::desc({M, K_}, dt::f32, tag::ab) : src_md, pd.src_desc(), dst_md,
         pd.dst_desc());
    if (pd.src_desc() == src_md) own_quantize(*p, q_, QPlan::OwnQuant::kSame, M * K_);
    if (p->own_quant != QPlan::OwnQuant::kNone) prof_.what += " +own quantize";
    p->wei =
        int8_prepack(dnnl::memory::desc({K_, N_}, dt::s8, trans_b_ ? tag::ba : tag::ab), pd.weights_desc(), w_.data());
    if (!q_.bias.empty()) p->bias = int8_bias_memory(q_.bias, dnnl::memory::desc({1, N_}, dt::f32, tag::ab));
    p->zp->make(q_);
    p->finish(!q_.bias.empty());
    return p;
  }

  Dims w_dims_;
  bool trans_b_ = false;
  int64_t K_ = 0, N_ = 0;
  std::vector<int8_t> w_;
  QuantSetup q_;
  PlanCache<QPlan> plans_;
  StepProfile prof_;
};

// ------------------------------------------------------------------------------------------------ Q / DQ

// QuantizeLinear (f32 -> u8/s8) and DequantizeLinear (u8/s8 -> f32) with a per-tensor constant scale and zero
// point, as one oneDNN reorder: y = saturate(round(x * (1 / scale)) + zp), or y = (x - zp) * scale.
class QdqKernel : public Kernel {
 public:
  explicit QdqKernel(bool quantize) : quantize_(quantize) {}

  void setup(Ctx& c) override {
    if (!c.rank_known(0)) throw Reject{"rank unknown"};
    scale_ = scalar_f32(c, 1, quantize_ ? "y_scale" : "x_scale");
    if (!(scale_ > 0) || !std::isfinite(scale_)) throw Reject{"scale must be positive"};
    zero_ = scalar_zp(c, 2, "zero point");
    q_type_ = quantize_ ? (c.has_input(2) ? c.dtype(2) : KEEL_DTYPE_U8) : c.dtype(0);
    if (q_type_ != KEEL_DTYPE_U8 && q_type_ != KEEL_DTYPE_I8) throw Reject{"u8/s8 only"};
    if (quantize_ ? (c.dtype(0) != KEEL_DTYPE_F32 || c.output_dtype(0) != q_type_)
                  : c.output_dtype(0) != KEEL_DTYPE_F32)
      throw Reject{"f32 <-> u8/s8 only"};
    if (c.has_input(2) && c.dtype(2) != q_type_) throw Reject{"zero point type"};
    if (c.output_count() > 1) throw Reject{"extra outputs"};
    if (c.dims_known(0)) plans_.get(shape_key(c), [&] { return build(c.dims(0)); });
  }

  void run(Ctx& c) override {
    const Dims x = c.dims(0);
    Plan& p = plans_.get(shape_key(c), [&] { return build(x); });
    keel_tensor_t* y = c.output(0, x);
    if (p.empty) return;
    bind(p.src, c.input(0)->data);
    bind(p.dst, y->data);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_FROM, p.src}, {DNNL_ARG_TO, p.dst}};
    p.zp->add_to(args);
    p.prim.execute(stream(), args);
    stream().wait();
  }

 private:
  struct Plan {
    dnnl::reorder prim;
    dnnl::memory src, dst;
    bool empty = false;
    std::unique_ptr<ZeroPoints> zp = std::make_unique<ZeroPoints>();
  };

  std::unique_ptr<Plan> build(const Dims& x) {
    auto p = std::make_unique<Plan>();
    const int64_t n = numel(x);
    if (n == 0) {
      p->empty = true;
      return p;
    }
    const dt qt = int8_dnnl_type(q_type_);
    // One flat dimension: the op is element-wise.
    dnnl::memory::desc f32_md({n}, dt::f32, tag::a), q_md({n}, qt, tag::a);
    dnnl::primitive_attr attr;
    attr.set_output_scales(0, {quantize_ ? 1.f / scale_ : scale_});
    QuantSetup q;  // only its zero points
    if (quantize_) q.y_zero = zero_;
    else q.x_zero = zero_;
    if (zero_ != 0) attr.set_zero_points(quantize_ ? DNNL_ARG_DST : DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
    const auto& src_md = quantize_ ? f32_md : q_md;
    const auto& dst_md = quantize_ ? q_md : f32_md;
    p->src = dnnl::memory(src_md, engine(), nullptr);
    p->dst = dnnl::memory(dst_md, engine(), nullptr);
    dnnl::reorder::primitive_desc pd(engine(), src_md, engine(), dst_md, attr);
    p->prim = dnnl::reorder(pd);
    p->zp->make(q);
    return p;
  }

  bool quantize_;
  float scale_ = 1;
  int32_t zero_ = 0, q_type_ = KEEL_DTYPE_U8;
  PlanCache<Plan> plans_;
};

// ------------------------------------------------------------------------------------------------ byte pooling

// MaxPool / GlobalMaxPool over u8 / s8 in the graph's plain layout (what fuse_qdq leaves where it moved a
// QuantizeLinear over a MaxPool and no chain claims the node: claims off, or a rejected chain), on the own byte
// pooling loop (steps/int8_pool.h) with each [H, W] plane as an image of one channel. oneDNN 2.6's int8 pooling has
// only its reference kernel for the plain layout, and the core's reference kernel took 350 ms for SimpleCNN's [1000,
// 32, 26, 26] 2x2 pooling. 2-D, no ceil_mode (the reference handles those), no Indices.
class BytePoolKernel : public Kernel {
 public:
  explicit BytePoolKernel(bool global) : global_(global) {}
  void setup(Ctx& c) override {
    if (!int8_own_kernels()) throw Reject{"no AVX-512 BW here"};
    if (c.dtype(0) != KEEL_DTYPE_U8 && c.dtype(0) != KEEL_DTYPE_I8) throw Reject{"u8 / s8 only"};
    if (!c.rank_known(0) || c.dims(0).size() != 4) throw Reject{"2-D pooling only"};
    if (c.output_count() > 1 && c.output_dtype(1) != KEEL_DTYPE_UNDEFINED) throw Reject{"Indices output"};
    if (global_) return;
    k_ = c.attr_ints("kernel_shape", {});
    s_ = c.attr_ints("strides", {1, 1});
    d_ = c.attr_ints("dilations", {1, 1});
    const std::string ap = c.attr_s("auto_pad", "NOTSET");
    p_ = ap == "VALID" ? Dims{0, 0, 0, 0} : c.attr_ints("pads", {0, 0, 0, 0});
    if (k_.size() != 2 || s_.size() != 2 || d_.size() != 2 || p_.size() != 4) throw Reject{"attribute ranks"};
    if (ap != "NOTSET" && !ap.empty() && ap != "VALID") throw Reject{"auto_pad " + ap};
    if (c.attr_i("ceil_mode", 0) != 0 || c.attr_i("storage_order", 0) != 0) throw Reject{"ceil_mode / storage_order"};
    for (int j = 0; j < 2; ++j)
      if (k_[j] < 1 || s_[j] < 1 || d_[j] < 1 || p_[j] < 0 || p_[j + 2] < 0) throw Reject{"geometry"};
  }
  void run(Ctx& c) override {
    const Dims x = c.dims(0);
    BytePoolShape s;
    s.n = x[0] * x[1], s.h = x[2], s.w = x[3], s.c = 1, s.s8 = c.dtype(0) == KEEL_DTYPE_I8;
    if (global_) {
      s.kh = x[2], s.kw = x[3];
    } else {
      s.kh = k_[0], s.kw = k_[1], s.sh = s_[0], s.sw = s_[1], s.dh = d_[0], s.dw = d_[1], s.pt = p_[0], s.pl = p_[1];
    }
    const int64_t sh = s.h + (global_ ? 0 : p_[0] + p_[2]) - ((s.kh - 1) * s.dh + 1),
                  sw = s.w + (global_ ? 0 : p_[1] + p_[3]) - ((s.kw - 1) * s.dw + 1);
    if (sh < 0 || sw < 0) throw std::runtime_error("MaxPool: the window is larger than the padded input");
    s.oh = sh / s.sh + 1, s.ow = sw / s.sw + 1;
    keel_tensor_t* out = c.output(0, Dims{x[0], x[1], s.oh, s.ow});
    if (s.n * s.oh * s.ow == 0) return;
    if (s.kh == 2 && s.kw == 2 && s.sh == 2 && s.sw == 2 && s.dh == 1 && s.dw == 1 && s.pt == 0 && s.pl == 0 &&
        (global_ || (p_[2] == 0 && p_[3] == 0)))
      return max_pool2x2_plain_bytes(c.input(0)->data, out->data, s.n, s.h, s.w, s.s8, omp_get_max_threads());
    max_pool_nhwc_bytes(s, c.input(0)->data, out->data, omp_get_max_threads());
  }

 private:
  bool global_;
  Dims k_, s_, d_, p_;
};

// ------------------------------------------------------------------------------------------------ registration

struct Int8Kernel {
  const char* domain;
  const char* op_type;
  int32_t since_version;
  const char* name;
  Kernel* (*make)();
};

const Int8Kernel kInt8[] = {
    {"keel", "QConv", 1, "onednn_int8_qconv", [] { return static_cast<Kernel*>(new QConvKernel); }},
    {"keel", "QGemm", 1, "onednn_int8_qgemm", [] { return static_cast<Kernel*>(new QGemmKernel); }},
    {"", "QuantizeLinear", 10, "onednn_int8_quantizelinear", [] { return static_cast<Kernel*>(new QdqKernel(true)); }},
    {"", "DequantizeLinear", 10, "onednn_int8_dequantizelinear",
     [] { return static_cast<Kernel*>(new QdqKernel(false)); }},
};

}  // namespace

keel_status_t register_int8_kernels(Instance& instance) {
  using K = Kernel*;
  static const std::vector<TypedKernelInfo> byte_pools = {
      {"",
       "MaxPool",
       12,
       "onednn_u8s8_maxpool",
       {KEEL_DTYPE_U8, KEEL_DTYPE_I8},
       []() -> K { return new BytePoolKernel(false); }},
      {"", "GlobalMaxPool", 1, "onednn_u8s8_globalmaxpool", {KEEL_DTYPE_U8, KEEL_DTYPE_I8}, []() -> K {
         return new BytePoolKernel(true);
       }}};
  if (keel_status_t st = register_kernel_table(instance, byte_pools, false)) return st;
  for (const Int8Kernel& k : kInt8) {
    keel_kernel_def_t def;
    std::memset(&def, 0, sizeof def);
    def.struct_size = sizeof def;
    def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
    def.abi_minor = KEEL_PLUGIN_ABI_MINOR;
    def.name = k.name;
    def.domain = k.domain;
    def.op_type = k.op_type;
    def.since_version = k.since_version;
    def.end_version = 0;
    def.device_type = "cpu";
    def.user_data = &instance.kernels.emplace_back(KernelEntry{&instance, k.make});
    def.create = create_kernel;
    def.compute = compute_kernel_failing;
    def.release = release_kernel;
    if (keel_status_t st = instance.host->register_kernel(instance.handle, &def)) return st;
  }
  return nullptr;
}

}  // namespace keel::onednn
