// plugins/cpu_onednn/chain/chain.cc — claimed subgraphs ("chains"): connected runs of nodes that oneDNN runs
// as one, with its own memory layouts kept between ops and fused post-ops.
//
// The plugin registers a claim hook for "cpu" (keel_host_api_t.register_claimer, ABI 1.1). At session creation the
// hook (claim_chains) looks at the graph:
//   1. constants: initializers, Constant nodes, Shape of a statically shaped value, and every node all of whose
//      inputs are constants (shape arithmetic) are computed once, here (host->graph->evaluate), and run nothing;
//   2. candidates: f32 and bf16 nodes with static shapes of the ops below (bf16 ones compute in bf16, with f32
//      weights converted once into bf16 layouts, f32 bias and scale/shift; a Cast between f32 and bf16 is a reorder).
//      Patterns of several ops that mean one op (a decomposed LayerNormalization or Gelu, attention) are the fusion
//      passes' to recognise (passes/fusion: fuse_layer_norm, fuse_gelu, fuse_attention), not repeated here: without
//      the passes their ops run one by one, in the chain;
//   3. connected groups of candidates (with the constant nodes only they read) with at least two compute nodes are
//      claimed, when convex (no path leaves the group and comes back). The plan is built right there, so whatever
//      oneDNN refuses drops the node from the group (it runs on its kernel instead) before the claim is made.
//
// A plan (built once per OpenMP thread count; steady-state runs allocate nothing but the core's workspace):
//   - activations stay in the layout their producer chose (convolutions: nChw16c; Winograd for 3x3 stride 1);
//     a consumer that wants another layout gets one reorder, shared by all its readers;
//   - weights are reordered once into the primitive's layout (BatchNormalization after a Conv folded into them);
//   - post-ops: bias, Relu/Clip/LeakyRelu/Sigmoid/Tanh/SiLU (x * Sigmoid(x)), scalar Mul/Div, and the residual Add
//     as a sum post-op (in place when the residual is not read afterwards, else after one copy); pooling takes the
//     activations after it as post-ops too;
//   - a convolution's trailing SiLU runs as the plugin's own pass (steps/silu.h), with a GlobalAveragePool of its
//     output computed in the same pass; squeeze-excite's Mul in front of a small 1x1 convolution scales that
//     convolution's weights per run instead (fold_channel_scale);
//   - Reshape/Flatten/Squeeze/Unsqueeze/Identity are views of their input's memory (after a reorder to the plain
//     layout when needed); Transpose and Slice are strided views that MatMul reads directly (a reorder otherwise);
//     a scalar Mul/Div in front of a MatMul becomes the MatMul's output scale;
//   - the workspace holds every internal value, offsets planned from liveness.
//
// Ops: Conv and ConvTranspose (1-D, 2-D, 3-D), BatchNormalization, Relu, Clip, LeakyRelu, Sigmoid, Tanh, HardSwish,
// HardSigmoid, Gelu (ai.onnx 20 or keel.Gelu), Resize (linear half_pixel; nearest by integer factors), Add/Sub/Mul/Div (same shape, a broadcast constant, or a [N,C,1,1] value),
// MaxPool/AveragePool (1-D, 2-D, 3-D), GlobalAveragePool/GlobalMaxPool, Concat, MatMul, Gemm, Softmax (last axis),
// LayerNormalization (last axis; ai.onnx 17 or keel.LayerNormalization), ReduceMean, Pow (exponent 2 or 0.5), Sqrt, Transpose, Slice
// (step 1), Reshape, Flatten, Squeeze, Unsqueeze, Identity, Cast (f32 <-> bf16), Pad (constant mode: all-zero pads
// are a view; spatial pads are folded into the padding of the Conv/MaxPool/AveragePool reading them where exact).
// keel.Attention (fuse_attention's) runs as an own step (steps/attention.h) over strided views of Q, Kt, V.
// 1-D convolutions and poolings run as 2-D ones over [N,C,1,L] (lift_1d rewrites the recipe at claim time); a
// MatMul read only by a Transpose writes the transposed layout directly.
// INT8 (the section "int8 steps"): keel.QConv (1-D, 2-D, 3-D) and keel.QGemm, with the standalone kernels' set-up
// (kernels/int8.h), and the per-tensor QuantizeLinear / DequantizeLinear next to them; u8/s8 values stay
// channels-last between int8 steps, f32 ones are quantized straight from their producer's layout.
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <map>
#include <new>
#include <set>
#include <sstream>
#include <tuple>

#include "steps/attention.h"
#include "common/common.h"
#include "common/conv_pick.h"
#include "steps/convpool.h"
#include "steps/dilated.h"
#include "steps/dwsilu.h"
#include "steps/grouped.h"
#include "kernels/int8.h"
#include "steps/se.h"
#include "steps/silu.h"

namespace keel::onednn {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using alg = dnnl::algorithm;
using md_t = dnnl::memory::desc;

keel_plugin_handle_t* g_plugin_handle = nullptr;
void debug_log(const std::string& msg) {
  if (g_host && g_host->log) g_host->log(g_plugin_handle, KEEL_LOG_DEBUG, msg.c_str());
}

// ------------------------------------------------------------------------------------------ claim-time snapshot

struct Attr {
  int32_t kind = KEEL_ATTR_UNDEFINED;
  int64_t i = 0;
  float f = 0;
  std::string s;
  Dims ints;
  std::vector<float> floats;
};

struct NodeDesc {
  keel_node_id_t id = 0;
  std::string op, name;
  std::vector<std::string> in, out;
  std::map<std::string, Attr> attrs;
  int64_t ai(const char* n, int64_t d) const {
    auto it = attrs.find(n);
    return it != attrs.end() && it->second.kind == KEEL_ATTR_INT ? it->second.i : d;
  }
  float af(const char* n, float d) const {
    auto it = attrs.find(n);
    return it != attrs.end() && it->second.kind == KEEL_ATTR_FLOAT ? it->second.f : d;
  }
  std::string as(const char* n, const std::string& d) const {
    auto it = attrs.find(n);
    return it != attrs.end() && it->second.kind == KEEL_ATTR_STRING ? it->second.s : d;
  }
  Dims ais(const char* n, const Dims& d) const {
    auto it = attrs.find(n);
    return it != attrs.end() && it->second.kind == KEEL_ATTR_INTS ? it->second.ints : d;
  }
  bool has(const char* n) const { return attrs.count(n) > 0; }
  std::string in_at(size_t i) const { return i < in.size() ? in[i] : std::string(); }
};

// A constant value (host copy).
struct ConstT {
  int32_t dtype = KEEL_DTYPE_UNDEFINED;
  Dims dims;
  std::vector<char> bytes;
  int64_t count() const { return numel(dims); }
  // Element i as float / int64 (f32, f64, i32, i64 are read; others throw Reject).
  double at(int64_t i) const {
    switch (dtype) {
      case KEEL_DTYPE_F32: return reinterpret_cast<const float*>(bytes.data())[i];
      case KEEL_DTYPE_F64: return reinterpret_cast<const double*>(bytes.data())[i];
      case KEEL_DTYPE_I32: return reinterpret_cast<const int32_t*>(bytes.data())[i];
      case KEEL_DTYPE_I64: return static_cast<double>(reinterpret_cast<const int64_t*>(bytes.data())[i]);
    }
    throw Reject{"constant of an unsupported dtype"};
  }
  int64_t iat(int64_t i) const {
    if (dtype == KEEL_DTYPE_I64) return reinterpret_cast<const int64_t*>(bytes.data())[i];
    return static_cast<int64_t>(at(i));
  }
  const float* f32() const { return reinterpret_cast<const float*>(bytes.data()); }
};

// Everything a plan is built from; owned by the claim (it outlives the graph).
struct Recipe {
  std::string name;
  std::vector<NodeDesc> nodes;             // claimed nodes, topological order (constant nodes included)
  std::map<std::string, Dims> dims;        // static dims of the values the nodes read and write (when known)
  std::map<std::string, int32_t> dtypes;
  std::map<std::string, ConstT> consts;    // constant values
  std::vector<std::string> inputs, outputs;  // the boundary, in the core's order
  // int8 values the graph holds channels-last (fuse_qdq: NHWC bytes under the NCHW shape): read and written so at
  // the boundary (Builder::boundary_md).
  std::set<std::string> channels_last;
};

// ------------------------------------------------------------------------------------------------------ the plan

// Where a memory object's data lives.
enum class BufKind { kWorkspace, kInput, kOutput, kOwned };
struct Buf {
  BufKind kind = BufKind::kWorkspace;
  int index = -1;        // input/output index
  uint64_t bytes = 0;
  int first = 1 << 30, last = -1;  // exec steps that touch it
  uint64_t offset = 0;   // in the workspace
  int values = 0;        // values living in it (views included)
};

struct Bind {
  dnnl::memory mem;
  int buf;
  uint64_t offset;  // bytes from the buffer's start
};

struct Exec {
  dnnl::primitive prim;
  std::unordered_map<int, dnnl::memory> args;
  bool single = false;  // runs on one OpenMP thread (a small memory-bound step: see Builder::exec)
  // A step of the plugin's own instead of a primitive (prim is then empty), run with the exec itself.
  void (*own)(const Exec&) = nullptr;
  std::shared_ptr<const void> params;  // an own step's parameters (run_conv_pool: its ConvPoolShape)
  const char* own_kind = nullptr;  // an own step's kind in profiles ("eltwise" when null)
};

// Exec::own of a SiLU step: x * sigmoid(x) in place over its DNNL_ARG_DST memory (steps/silu.h), split over the
// OpenMP team (contiguous 16-float-aligned parts) unless the step is a single-thread one.
void run_silu(const Exec& e) {
  const dnnl::memory& m = e.args.at(DNNL_ARG_DST);
  float* p = static_cast<float*>(m.get_data_handle());
  const size_t n = m.get_desc().get_size() / sizeof(float);
  const int team = e.single ? 1 : omp_get_max_threads();
  if (team <= 1) {
    silu_inplace(p, n);
    return;
  }
#pragma omp parallel num_threads(team)
  {
    const size_t k = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
    const size_t per = (n / 16 + k - 1) / k * 16;
    const size_t b = std::min(n, t * per), end = t + 1 == k ? n : std::min(n, b + per);
    silu_inplace(p + b, end - b);
  }
}

// The pooled output of a SiLU step that also computes squeeze-excite's GlobalAveragePool (run_silu_mean).
constexpr int kArgPooled = DNNL_ARG_DST_1;

// Exec::own of a SiLU step fused with the GlobalAveragePool reading its output: DNNL_ARG_DST is nChw16c
// [N,C,H,W] (SiLU in place), kArgPooled nChw16c [N,C,1,1] (each channel's mean); the (batch, 16-channel block)
// pairs are split over the OpenMP team unless the step is a single-thread one.
void run_silu_mean(const Exec& e) {
  const dnnl::memory& m = e.args.at(DNNL_ARG_DST);
  const dnnl::memory::dims d = m.get_desc().dims();
  float* p = static_cast<float*>(m.get_data_handle());
  float* mean = static_cast<float*>(e.args.at(kArgPooled).get_data_handle());
  const int64_t blocks = d[0] * ((d[1] + 15) / 16), hw = d[2] * d[3];
  const int team = e.single ? 1 : omp_get_max_threads();
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) silu_inplace_mean16(p + b * hw * 16, static_cast<size_t>(hw), mean + b * 16);
}

// Exec::own of a squeeze-excite scale folded into a 1x1 convolution's weights (Builder::fold_channel_scale):
// DST (the primitive's weights) = SRC (the same weights unscaled) * scale[map[j]] element by element, where map
// holds each element's input channel (0 on padding, which is 0 in SRC) and kArgScale is the [1,C,1,1] scale.
// run_scale_weights16: the same where each 16 consecutive floats share one input channel (oneDNN's OIhw16i16o
// layouts of the 1x1 kernels), map holding one channel per 16 floats.
constexpr int kArgScale = DNNL_ARG_SRC_1, kArgMap = DNNL_ARG_SRC_2;
__attribute__((target("avx512f"))) void scale_gather_avx512(float* dst, const float* src, const float* scale,
                                                           const int32_t* map, size_t n) {
  size_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 g =  // the masked form: GCC 12 warns about the plain one's undefined source
        _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xffff, _mm512_loadu_si512(map + j), scale, 4);
    _mm512_storeu_ps(dst + j, _mm512_mul_ps(_mm512_loadu_ps(src + j), g));
  }
  for (; j < n; ++j) dst[j] = src[j] * scale[map[j]];
}
void run_scale_weights(const Exec& e) {
  const dnnl::memory& d = e.args.at(DNNL_ARG_DST);
  float* dst = static_cast<float*>(d.get_data_handle());
  const float* src = static_cast<const float*>(e.args.at(DNNL_ARG_SRC).get_data_handle());
  const float* scale = static_cast<const float*>(e.args.at(kArgScale).get_data_handle());
  const int32_t* map = static_cast<const int32_t*>(e.args.at(kArgMap).get_data_handle());
  const size_t n = d.get_desc().get_size() / sizeof(float);
  if (has_avx512f()) {
    scale_gather_avx512(dst, src, scale, map, n);
    return;
  }
  for (size_t j = 0; j < n; ++j) dst[j] = src[j] * scale[map[j]];
}

__attribute__((target("avx512f"))) void scale_rows_avx512(float* dst, const float* src, const float* scale,
                                                         const int32_t* map, size_t rows) {
  for (size_t r = 0; r < rows; ++r)
    _mm512_storeu_ps(dst + 16 * r, _mm512_mul_ps(_mm512_loadu_ps(src + 16 * r), _mm512_set1_ps(scale[map[r]])));
}
void run_scale_weights16(const Exec& e) {
  const dnnl::memory& d = e.args.at(DNNL_ARG_DST);
  float* dst = static_cast<float*>(d.get_data_handle());
  const float* src = static_cast<const float*>(e.args.at(DNNL_ARG_SRC).get_data_handle());
  const float* scale = static_cast<const float*>(e.args.at(kArgScale).get_data_handle());
  const int32_t* map = static_cast<const int32_t*>(e.args.at(kArgMap).get_data_handle());
  const size_t rows = d.get_desc().get_size() / sizeof(float) / 16;
  if (has_avx512f()) {
    scale_rows_avx512(dst, src, scale, map, rows);
    return;
  }
  for (size_t j = 0; j < rows * 16; ++j) dst[j] = src[j] * scale[map[j / 16]];
}

// Exec::own of a fused Conv (+ Relu) + MaxPool (Builder::conv_pool_fused, steps/convpool.h): SRC plain, WEIGHTS
// packed, BIAS, DST nChw16c, DNNL_ARG_SCRATCHPAD room for the team's rows; split over the OpenMP team.
void run_conv_pool(const Exec& e) {
  const auto& s = *static_cast<const ConvPoolShape*>(e.params.get());
  auto ptr = [&](int arg) { return static_cast<float*>(e.args.at(arg).get_data_handle()); };
  const dnnl::memory& scratch = e.args.at(DNNL_ARG_SCRATCHPAD);
  const int room = static_cast<int>(scratch.get_desc().get_size() / sizeof(float) / conv_pool_scratch_floats(s));
  const int team = std::max(1, std::min(e.single ? 1 : omp_get_max_threads(), room));
  conv_pool_run(s, ptr(DNNL_ARG_SRC), ptr(DNNL_ARG_WEIGHTS), ptr(DNNL_ARG_BIAS), ptr(DNNL_ARG_DST),
                static_cast<float*>(scratch.get_data_handle()), team);
}

// Exec::own of a depthwise convolution + SiLU (Builder::conv_dw_silu, steps/dwsilu.h): SRC and DST nChw16c,
// WEIGHTS packed, BIAS, kArgPooled (when present) the output's channel means, DNNL_ARG_SCRATCHPAD room for the team;
// split over the OpenMP team by 16-channel blocks.
void run_dw_silu(const Exec& e) {
  const auto& s = *static_cast<const DwSiluShape*>(e.params.get());
  auto ptr = [&](int arg) { return static_cast<float*>(e.args.at(arg).get_data_handle()); };
  const dnnl::memory& scratch = e.args.at(DNNL_ARG_SCRATCHPAD);
  const int room = static_cast<int>(scratch.get_desc().get_size() / sizeof(float) / dw_silu_scratch_floats(s));
  const int team = std::max(1, std::min(e.single ? 1 : omp_get_max_threads(), room));
  dw_silu_run(s, ptr(DNNL_ARG_SRC), ptr(DNNL_ARG_WEIGHTS), ptr(DNNL_ARG_BIAS), ptr(DNNL_ARG_DST),
              e.args.count(kArgPooled) ? ptr(kArgPooled) : nullptr, static_cast<float*>(scratch.get_data_handle()),
              team);
}

// Exec::own of squeeze-excite's excitation (Builder::se_excite_fused, steps/se.h): SRC the pooled channels, WEIGHTS
// packed, DST the scale; on the calling thread (a single-thread step).
void run_se(const Exec& e) {
  se_excite(*static_cast<const SeShape*>(e.params.get()),
            static_cast<const float*>(e.args.at(DNNL_ARG_WEIGHTS).get_data_handle()),
            static_cast<const float*>(e.args.at(DNNL_ARG_SRC).get_data_handle()),
            static_cast<float*>(e.args.at(DNNL_ARG_DST).get_data_handle()));
}

// Exec::own of a 3x3 convolution in groups of 4 channels (Builder::conv_grouped4, steps/grouped.h): SRC and DST
// nChw16c, WEIGHTS packed, BIAS; split over the OpenMP team unless the step is a single-thread one.
void run_grouped4(const Exec& e) {
  const auto& s = *static_cast<const Grouped4Shape*>(e.params.get());
  auto ptr = [&](int arg) { return static_cast<float*>(e.args.at(arg).get_data_handle()); };
  grouped4_run(s, ptr(DNNL_ARG_SRC), ptr(DNNL_ARG_WEIGHTS), ptr(DNNL_ARG_BIAS), ptr(DNNL_ARG_DST),
               e.single ? 1 : omp_get_max_threads());
}

// Exec::own of the phase steps of a dilated convolution (Builder::conv_dilated_phases): DNNL_ARG_SRC nChw16c
// [N,C,H,W] into DNNL_ARG_DST nChw16c [N*d*d,C,H/d,W/d] (run_to_phases), or back (run_from_phases); d is read off
// the two shapes. Split over the OpenMP team unless the step is a single-thread one.
PhaseShape phase_shape(const dnnl::memory& image, const dnnl::memory& phases) {
  const dnnl::memory::dims x = image.get_desc().dims(), p = phases.get_desc().dims();
  return {x[0], (x[1] + 15) / 16, x[2], x[3], x[2] / p[2]};
}
void run_to_phases(const Exec& e) {
  const dnnl::memory &x = e.args.at(DNNL_ARG_SRC), &p = e.args.at(DNNL_ARG_DST);
  space_to_phases16(static_cast<const float*>(x.get_data_handle()), static_cast<float*>(p.get_data_handle()),
                    phase_shape(x, p), e.single ? 1 : omp_get_max_threads());
}
void run_from_phases(const Exec& e) {
  const dnnl::memory &p = e.args.at(DNNL_ARG_SRC), &x = e.args.at(DNNL_ARG_DST);
  phases_to_space16(static_cast<const float*>(p.get_data_handle()), static_cast<float*>(x.get_data_handle()),
                    phase_shape(x, p), e.single ? 1 : omp_get_max_threads());
}

// Exec::own of keel.Attention (Builder::attention, steps/attention.h): DNNL_ARG_SRC_0..2 Q, Kt, V and SRC_3 the
// mask (when the shape has one), DST Y, each bound at its view's first element; SCRATCHPAD room for the team;
// the AttentionShape in params.
void run_attention(const Exec& e) {
  const auto& s = *static_cast<const AttentionShape*>(e.params.get());
  auto ptr = [&](int arg) { return static_cast<float*>(e.args.at(arg).get_data_handle()); };
  const dnnl::memory& scratch = e.args.at(DNNL_ARG_SCRATCHPAD);
  const int room = static_cast<int>(scratch.get_desc().get_size() / sizeof(float) / attention_scratch_floats(s));
  const int team = std::max(1, std::min(e.single ? 1 : omp_get_max_threads(), room));
  attention_run(s, ptr(DNNL_ARG_SRC_0), ptr(DNNL_ARG_SRC_1), ptr(DNNL_ARG_SRC_2),
                s.has_mask ? ptr(DNNL_ARG_SRC_3) : nullptr, ptr(DNNL_ARG_DST),
                static_cast<float*>(scratch.get_data_handle()), team);
}

// ----------------------------------------------------------------------- int8 steps' own parts (Builder::qconv)

// Exec::own of an int8 depthwise 3x3 step (steps/int8_dw.h): params the kernel, SRC / DST channels-last bytes.
void run_int8_depthwise(const Exec& e) {
  const auto& k = *static_cast<const Int8Depthwise3x3*>(e.params.get());
  k.run(e.args.at(DNNL_ARG_SRC).get_data_handle(), e.args.at(DNNL_ARG_DST).get_data_handle(),
        e.single ? 1 : omp_get_max_threads());
}

// Exec::own of the quantization of an f32 value into an int8 step's source (steps/int8_quant.h): SRC f32 plain
// ([N, C, S]: kToNhwc), nChw16c (kBlocked) or already in the destination's layout (kSame, n elements); DST bytes.
// kBlockedF32: no quantization, nChw16c f32 into channels-last f32 (an int8 step's residual Z).
struct Int8QuantizeStep {
  enum class Kind { kSame, kToNhwc, kBlocked, kBlockedF32 } kind = Kind::kSame;
  QuantizeSpec q;
  int64_t n = 0, N = 1, C = 1, S = 1;
};
void run_int8_quantize(const Exec& e) {
  const auto& k = *static_cast<const Int8QuantizeStep*>(e.params.get());
  const float* x = static_cast<const float*>(e.args.at(DNNL_ARG_SRC).get_data_handle());
  void* y = e.args.at(DNNL_ARG_DST).get_data_handle();
  const int team = e.single ? 1 : omp_get_max_threads();
  switch (k.kind) {
    case Int8QuantizeStep::Kind::kSame: quantize_f32(x, y, k.n, k.q, team); break;
    case Int8QuantizeStep::Kind::kToNhwc: quantize_f32_to_nhwc(x, y, k.N, k.C, k.S, k.q, team); break;
    case Int8QuantizeStep::Kind::kBlocked: quantize_f32_blocked16_to_nhwc(x, y, k.N, k.C, k.S, k.q, team); break;
    case Int8QuantizeStep::Kind::kBlockedF32: blocked16_to_nhwc_f32(x, static_cast<float*>(y), k.N, k.C, k.S, team); break;
  }
}

// Exec::own of the source of a merged bottleneck end (Builder::conv_residual_merged, steps/dilated.h): DNNL_ARG_SRC
// h and DNNL_ARG_SRC_1 x into DNNL_ARG_DST, params its MergedSourceShape; split over the OpenMP team by rows unless
// the step is a single-thread one.
void run_merged_source(const Exec& e) {
  merged_source16(static_cast<const float*>(e.args.at(DNNL_ARG_SRC).get_data_handle()),
                  static_cast<const float*>(e.args.at(DNNL_ARG_SRC_1).get_data_handle()),
                  static_cast<float*>(e.args.at(DNNL_ARG_DST).get_data_handle()),
                  *static_cast<const MergedSourceShape*>(e.params.get()), e.single ? 1 : omp_get_max_threads());
}

void run_step(Exec& e, dnnl::stream& s) {
  if (e.own) e.own(e);
  else execute(e.prim, s, e.args);
}

// Weights in the primitives' layouts, packed into 2 MiB-aligned chunks that the kernel may back with huge pages
// (madvise): a batch-1 network streams its weights from memory on every run (ResNet-50: 100 MB), and with 4 KiB
// pages every 4 KiB of that stream is a TLB miss and a stop for the hardware prefetcher.
class WeightArena {
 public:
  WeightArena() = default;
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;
  ~WeightArena() {
    for (auto& [p, n] : chunks_) std::free(p);
  }
  void* alloc(uint64_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    if (chunks_.empty() || used_ + bytes > chunks_.back().second) {
      uint64_t n = std::max<uint64_t>(kChunk, (bytes + kHuge - 1) / kHuge * kHuge);
      void* p = std::aligned_alloc(kHuge, n);
      if (!p) throw std::bad_alloc();
      madvise(p, n, MADV_HUGEPAGE);  // advice only: a kernel without transparent huge pages ignores it
      chunks_.emplace_back(p, n);
      used_ = 0;
    }
    void* r = static_cast<char*>(chunks_.back().first) + used_;
    used_ += bytes;
    return r;
  }

 private:
  static constexpr uint64_t kHuge = 2u << 20, kChunk = 16u << 20;
  std::vector<std::pair<void*, uint64_t>> chunks_;
  uint64_t used_ = 0;
};

// A convolution whose implementation a claim-time plan took untimed (Builder's time_convs off): the candidates and
// margins fastest_conv_remembered would have timed; the plan took the first.
struct DeferredPick {
  std::vector<dnnl::convolution_forward::primitive_desc> cands;
  std::vector<double> margins;
};

struct Plan {
  int threads = 0;
  std::vector<DeferredPick> deferred;  // a claim-time plan's untimed picks (see run_chain)
  WeightArena weights;  // declared before `owned` and the steps: freed after them
  double flops = 0;  // of the convolutions and matmuls
  std::vector<Buf> bufs;
  std::vector<Bind> binds;
  std::vector<Exec> execs;
  std::vector<dnnl::memory> owned;  // weights and constants in the primitives' layouts
  uint64_t ws_bytes = 0;
  std::vector<Dims> out_dims;
  std::vector<const ConstT*> out_consts;  // outputs that are constants (copied each run)
  std::vector<void*> last_base;           // per buffer, the pointer its binds were last set to
  std::vector<std::string> impls;         // for logs
  std::vector<std::string> what;          // per exec: the node it runs and its shapes (for the profile)
  // Per exec, for the session profile (plugin ABI 1.3 profile_step): the ONNX op type it computes ("" for a layout
  // reorder of the chain's own) and the graph nodes it covers (that node first, the nodes fused into it after).
  // The strings belong to the Recipe the plan was built from.
  std::vector<const char*> step_op;
  std::vector<std::vector<const char*>> step_nodes;
};

struct Val {
  md_t md;
  int buf = -1;
  uint64_t off = 0;
  float scale = 1.f;       // a pending scalar factor (a Mul/Div folded into the consumer MatMul)
  std::string scale_of;    // the value it scales
};

bool is_plain_dense(const md_t& md) {
  if (md.data.format_kind != dnnl_blocked) return false;
  if (md.data.format_desc.blocking.inner_nblks != 0) return false;
  const int n = md.data.ndims;
  int64_t s = 1;
  for (int i = n - 1; i >= 0; --i) {
    if (md.data.dims[i] != 1 && md.data.format_desc.blocking.strides[i] != s) return false;
    s *= md.data.dims[i];
  }
  return md.data.offset0 == 0;
}
bool is_strided(const md_t& md) {
  return md.data.format_kind == dnnl_blocked && md.data.format_desc.blocking.inner_nblks == 0;
}
Dims md_dims(const md_t& md) { return Dims(md.data.dims, md.data.dims + md.data.ndims); }
Dims md_strides(const md_t& md) {
  return Dims(md.data.format_desc.blocking.strides, md.data.format_desc.blocking.strides + md.data.ndims);
}
md_t strided_md(const Dims& d, const Dims& strides, dt t = dt::f32) {
  if (d.empty()) return md_t({1}, t, tag::a);
  return md_t(to_dnnl(d), t, to_dnnl(strides));
}
// The same layout with another data type (a Cast between f32 and bf16 keeps its input's layout).
md_t with_dtype(const md_t& md, dt t) {
  dnnl_memory_desc_t d = md.data;
  d.data_type = static_cast<dnnl_data_type_t>(t);
  return md_t(d);
}
size_t elem_size(const md_t& md) { return dnnl_data_type_size(md.data.data_type); }
std::string impl_of(const dnnl::primitive& p) {
  const char* impl = nullptr;
  dnnl_primitive_desc_query(p.get_primitive_desc(), dnnl_query_impl_info_str, 0, &impl);
  return impl ? impl : "?";
}

// Format tags by tensor rank (3: 1-D spatial, 4: 2-D, 5: 3-D): channel-blocked by 16, channels-last, plain weights.
tag blocked16_tag(size_t rank) { return rank == 5 ? tag::nCdhw16c : rank == 3 ? tag::nCw16c : tag::nChw16c; }
tag channels_last_tag(size_t rank) { return rank == 5 ? tag::ndhwc : rank == 3 ? tag::nwc : tag::nhwc; }
tag plain_tag(size_t rank) { return rank == 5 ? tag::ncdhw : rank == 3 ? tag::ncw : tag::nchw; }
tag weights_tag(size_t spatial, bool grouped, bool transposed) {
  if (spatial == 3) return grouped ? (transposed ? tag::giodhw : tag::goidhw) : (transposed ? tag::iodhw : tag::oidhw);
  return grouped ? (transposed ? tag::giohw : tag::goihw) : (transposed ? tag::iohw : tag::oihw);
}
// ONNX dilations (1 = dense) as oneDNN's (0 = dense).
dnnl::memory::dims dnnl_dilations(const Dims& d) {
  dnnl::memory::dims r;
  for (int64_t v : d) r.push_back(v - 1);
  return r;
}
int64_t prod(const Dims& d) {
  int64_t p = 1;
  for (int64_t v : d) p *= v;
  return p;
}

// Thrown when a node of the claim cannot be built: the claim is retried without it.
struct NodeReject {
  size_t node;
  std::string why;
};

class Builder {
 public:
  // time_convs off (the claim's plan, built before the session's team is known): convolutions take oneDNN's first
  // implementation instead of timing the candidates, which the plan records in Plan::deferred.
  explicit Builder(const Recipe& r, bool time_convs = true) : r_(r), time_convs_(time_convs) {}

  std::unique_ptr<Plan> build();

 private:
  // --- values and buffers
  int new_buf(uint64_t bytes) {
    Buf b;
    b.bytes = (bytes + 63) / 64 * 64;
    p_->bufs.push_back(b);
    return static_cast<int>(p_->bufs.size()) - 1;
  }
  void touch(int buf) {
    if (buf < 0) return;
    Buf& b = p_->bufs[buf];
    int step = static_cast<int>(p_->execs.size());
    b.first = std::min(b.first, step);
    b.last = std::max(b.last, step);
  }
  // A memory object over a value's data (bound at run time), touching its buffer at the current step.
  dnnl::memory mem_of(const Val& v) { return mem_at(v.md, v.buf, v.off); }
  dnnl::memory mem_at(const md_t& md, int buf, uint64_t off) {
    if (buf >= 0 && p_->bufs[buf].kind == BufKind::kOwned)  // constants: their own memory, never rebound
      return dnnl::memory(md, engine(), static_cast<char*>(owned_of_buf_[buf].get_data_handle()) + off);
    dnnl::memory m(md, engine(), DNNL_MEMORY_NONE);
    p_->binds.push_back({m, buf, off});
    touch(buf);
    return m;
  }
  Val& define(const std::string& name, const md_t& md, int buf = -2) {
    auto known = r_.dims.find(name);
    if (known != r_.dims.end() && known->second != md_dims(md))
      throw Reject{"'" + name + "': computed shape " + dims_str(md_dims(md)) + " differs from the inferred " +
                   dims_str(known->second)};
    Val v;
    v.md = md;
    v.buf = buf == -2 ? new_buf(md.get_size()) : buf;
    // A part of a channel concatenation (batch 1, nChw16c, 16-aligned channels): written in place in the
    // concatenation's buffer, so the Concat costs nothing.
    auto part = concat_parts_.find(name);
    if (buf == -2 && part != concat_parts_.end() && md.data.ndims == 4 &&
        md == md_t(md.dims(), dt::f32, tag::nChw16c)) {
      p_->bufs.pop_back();
      v.buf = part->second.first;
      v.off = part->second.second;
      placed_parts_.insert(name);
    }
    p_->bufs[v.buf].values++;
    vals_[name] = v;
    return vals_[name];
  }
  // Memory-bound steps (reorders, element-wise, normalisation, softmax, pooling, ...) touching under 1 MiB run on
  // one thread: the work takes microseconds, a team's barrier can take a scheduler slice on a busy machine.
  // (They pick their split at run time; convolutions and matmuls keep the team they were created for.)
  void exec(dnnl::primitive prim, std::unordered_map<int, dnnl::memory> args) {
    p_->impls.push_back(impl_of(prim));
    exec_layout_.push_back(layout_reorder_);
    {
      std::string w = cur_node_ < r_.nodes.size() ? r_.nodes[cur_node_].name : std::string("(outputs)");
      auto s = args.find(DNNL_ARG_SRC);
      if (s == args.end()) s = args.find(DNNL_ARG_FROM);
      auto d = args.find(DNNL_ARG_DST);
      if (d == args.end()) d = args.find(DNNL_ARG_TO);
      if (s != args.end()) w += " " + dims_str(md_dims(s->second.get_desc()));
      if (d != args.end()) w += " -> " + dims_str(md_dims(d->second.get_desc()));
      p_->what.push_back(std::move(w));
    }
    auto kind = prim.get_kind();
    uint64_t bytes = 0;
    for (auto& [arg, m] : args) bytes += m.get_desc().get_size();
    bool single = kind != dnnl::primitive::kind::convolution && kind != dnnl::primitive::kind::matmul &&
                  bytes < (1u << 20);
    p_->execs.push_back({std::move(prim), std::move(args), single, nullptr, nullptr, nullptr});
  }
  // A step of the plugin's own (Exec::own set, with its args), named `impl` in profiles and logs, `what` its line
  // there; `layout`: whether it only moves data between layouts (as exec()'s layout reorders).
  void exec_own(Exec e, const char* impl, bool layout, std::string what) {
    p_->impls.push_back(impl);
    exec_layout_.push_back(layout);
    p_->what.push_back(std::move(what));
    p_->execs.push_back(std::move(e));
  }
  // The value as it is now (a constant gets an owned plain memory the first time it is read as data).
  const Val& val(const std::string& name) {
    auto it = vals_.find(name);
    if (it != vals_.end()) return it->second;
    auto c = r_.consts.find(name);
    if (c == r_.consts.end() || c->second.dtype != KEEL_DTYPE_F32)
      throw Reject{"value '" + name + "' is not available"};
    Val v;
    v.md = plain_md(c->second.dims, dt::f32);
    p_->owned.emplace_back(v.md, engine());
    std::memcpy(p_->owned.back().get_data_handle(), c->second.bytes.data(), c->second.bytes.size());
    if (act_ != dt::f32) {  // read by a bf16 node: converted once
      dnnl::memory f = p_->owned.back();
      v.md = plain_md(c->second.dims);
      p_->owned.emplace_back(v.md, engine());
      dnnl::reorder(f, p_->owned.back()).execute(stream(), f, p_->owned.back());
      stream().wait();
    }
    Buf b;
    b.kind = BufKind::kOwned;
    p_->bufs.push_back(b);
    v.buf = static_cast<int>(p_->bufs.size()) - 1;
    owned_of_buf_[v.buf] = p_->owned.back();
    vals_[name] = v;
    return vals_[name];
  }
  // The value in layout `want` (a reorder into a new buffer the first time; shared by later readers).
  Val as_md(const std::string& name, const md_t& want) {
    const Val& v = val(name);
    if (v.scale != 1.f) throw Reject{"a scaled view read by an op that cannot scale"};
    if (v.md == want) return v;
    std::string key = name + "#" + std::to_string(std::hash<std::string>()(
                                             std::string(reinterpret_cast<const char*>(&want.data), sizeof want.data)));
    auto it = vals_.find(key);
    if (it != vals_.end()) return it->second;
    Val src = v;
    Val& dst = define(key, want);
    dnnl::memory s = mem_of(src), d = mem_of(dst);
    layout_reorder_ = true;
    exec(dnnl::reorder(s, d), {{DNNL_ARG_FROM, s}, {DNNL_ARG_TO, d}});
    layout_reorder_ = false;
    return dst;
  }
  Val as_plain(const std::string& name) { return as_md(name, plain_md(dims_of(name))); }
  Dims dims_of(const std::string& name) {
    auto it = vals_.find(name);
    if (it != vals_.end()) return md_dims(it->second.md);
    auto c = r_.consts.find(name);
    if (c != r_.consts.end()) return c->second.dims;
    auto d = r_.dims.find(name);
    if (d != r_.dims.end()) return d->second;
    throw Reject{"shape of '" + name + "' unknown"};
  }
  const ConstT* cst(const std::string& name) const {
    auto it = r_.consts.find(name);
    return it == r_.consts.end() ? nullptr : &it->second;
  }
  bool is_const(const std::string& name) const { return !name.empty() && r_.consts.count(name) > 0; }
  // Consumers of a value among the claim's nodes (node indices), and whether it leaves the claim.
  const std::vector<size_t>& users(const std::string& v) {
    static const std::vector<size_t> none;
    auto it = users_.find(v);
    return it == users_.end() ? none : it->second;
  }
  bool escapes(const std::string& v) const { return outputs_.count(v) > 0; }
  // True when `v`'s memory may be overwritten by node `at`: a workspace value that nobody reads after `at`, nor
  // any other value in its buffer (views of it: the Transpose of a residual that an in-projection read).
  bool dead_after(const std::string& v, size_t at) {
    if (escapes(v) || !vals_.count(v)) return false;
    const Val& x = vals_[v];
    if (x.buf < 0 || p_->bufs[x.buf].kind != BufKind::kWorkspace) return false;
    auto read_later = [&](const std::string& w) {
      if (escapes(w)) return true;
      for (size_t u : users(w))
        if (u != at && !done_[u]) return true;
      return false;
    };
    if (p_->bufs[x.buf].values == 1) return !read_later(v);
    if (!g_options.view_post_ops) return false;
    for (const auto& [name, w] : vals_)
      if (w.buf == x.buf && read_later(name)) return false;
    return true;
  }
  // The single consumer of `v` that may be fused into its producer, or npos.
  size_t sole_user(const std::string& v) {
    if (escapes(v)) return npos;
    const auto& u = users(v);
    if (u.size() != 1 || done_[u[0]]) return npos;
    // The value must be read by that node once, as its data input (not as two operands).
    const NodeDesc& n = r_.nodes[u[0]];
    int reads = 0;
    for (const auto& i : n.in) reads += i == v;
    return reads == 1 ? u[0] : npos;
  }
  static constexpr size_t npos = static_cast<size_t>(-1);
  // A value of dims `y` read only by a Transpose (a valid perm, default reversed): its producer may write the
  // transposed layout directly, so that the Transpose costs nothing (matmul(), attention()). Returns the Transpose
  // (npos if none) with the transposed dims in *yt and, in *ys, the strides of `y` whose transposed view is dense.
  size_t sole_transpose(const std::string& v, const Dims& y, Dims* yt, Dims* ys) {
    const size_t tr = sole_user(v);
    if (tr == npos) return npos;
    const NodeDesc& t = r_.nodes[tr];
    Dims perm = t.ais("perm", {});
    if (perm.empty())
      for (size_t k = y.size(); k-- > 0;) perm.push_back(static_cast<int64_t>(k));
    if (t.op != "Transpose" || t.out.size() != 1 || t.in[0] != v || perm.size() != y.size()) return npos;
    std::vector<bool> seen(y.size(), false);
    for (int64_t k : perm) {
      if (k < 0 || k >= static_cast<int64_t>(y.size()) || seen[k]) return npos;
      seen[k] = true;
    }
    yt->resize(y.size());
    for (size_t k = 0; k < y.size(); ++k) (*yt)[k] = y[perm[k]];
    const Dims st = dense_strides(*yt);
    ys->resize(y.size());
    for (size_t k = 0; k < y.size(); ++k) (*ys)[perm[k]] = st[k];
    return tr;
  }
  // Whether every reader of `v` is a keel.Attention, directly or through Transposes (and `v` stays in the claim).
  bool read_by_attention_only(const std::string& v) {
    if (escapes(v) || users(v).empty()) return false;
    for (size_t u : users(v)) {
      const NodeDesc& n = r_.nodes[u];
      if (n.op == "Attention") continue;
      if (n.op != "Transpose" || n.out.size() != 1 || !read_by_attention_only(n.out[0])) return false;
    }
    return true;
  }
  // When `v` is read only by Sigmoid(v) and by Mul(v, that sigmoid) (the sigmoid read by nothing else): the Mul.
  size_t silu_after(const std::string& v) {
    if (escapes(v)) return npos;
    const auto& u = users(v);
    if (u.size() != 2 || done_[u[0]] || done_[u[1]]) return npos;
    for (int k = 0; k < 2; ++k) {
      const NodeDesc& sg = r_.nodes[u[k]];
      const NodeDesc& m = r_.nodes[u[1 - k]];
      if (sg.op != "Sigmoid" || m.op != "Mul" || sg.in.size() != 1 || sg.out.size() != 1 || m.in.size() != 2 ||
          m.out.size() != 1)
        continue;
      const std::string& s = sg.out[0];
      if (escapes(s) || users(s).size() != 1 || users(s)[0] != u[1 - k]) continue;
      if ((m.in[0] == v && m.in[1] == s) || (m.in[0] == s && m.in[1] == v)) return u[1 - k];
    }
    return npos;
  }

  // --- post-op fusion
  struct Fusion {
    dnnl::post_ops po;
    std::string out;         // the value the fused op finally writes
    std::string sum_with;    // residual added by a sum post-op
    std::vector<float> conv_bias_add;  // per-channel constant added (conv)
    std::vector<float> bn_scale, bn_shift;  // conv: folded BatchNormalization
    std::vector<float> mm_bias;        // matmul: constant bias over the last axis
    float out_scale = 1.f;             // matmul: scalar applied before the bias
    bool silu_pass = false;            // conv: a trailing SiLU runs as the chain's own step (take_silu)
    bool viewed = false;               // matmul: `out` is a view of the product with other dims (same_order_view)
    std::vector<size_t> nodes;         // fused nodes
    int count = 0;
  };
  bool eltwise_of(const NodeDesc& n, alg* a, float* alpha, float* beta);
  bool eltwise_po(const NodeDesc& n, dnnl::post_ops* po);
  Fusion fuse_after(const std::string& out, size_t at, bool conv, int64_t channels);
  bool same_order_view(const NodeDesc& n, const std::string& in);
  bool take_silu(Fusion& f);
  void exec_silu(const Val& v, const std::string& name);

  // --- ops
  void conv(size_t i);
  void deconv(size_t i);
  void conv_like_tail(size_t i, const Fusion& f, dnnl::primitive prim, const md_t& src_md, const md_t& wei_md,
                      const md_t& dmd, const md_t& wplain, std::vector<float>& w, bool has_bias,
                      const std::vector<float>& bias, double flops,
                      std::unordered_map<int, dnnl::memory> extra = {}, const std::string& src = {},
                      const std::string& chan_scale = {});
  bool fold_channel_scale(size_t i);
  bool conv_as_gemv(size_t i, const Fusion& f, const std::vector<float>& w, bool has_bias,
                    const std::vector<float>& bias);
  void exec_scale_weights(const dnnl::memory& wmem, const md_t& wplain, const std::string& chan_scale);
  // Mul outputs folded into their 1x1 convolution (fold_channel_scale): output -> (the data, the [1,C,1,1] scale).
  std::map<std::string, std::pair<std::string, std::string>> se_folds_;
  // Flattens read as they lie (flatten_into_gemm): output -> the [N,C,H,W] input's dims and whether it is nhwc
  // (else nChw16c); the Gemm reading it takes its constant B with rows in that memory order.
  std::map<std::string, std::pair<Dims, bool>> flat_folds_;
  bool flatten_into_gemm(size_t i, const Dims& x, const Dims& y);
  bool conv_residual_merged(size_t i);
  bool conv_pool_fused(size_t i);
  bool conv_grouped4(size_t i, const Fusion& f, const std::string& src, const Dims& x, const Dims& y,
                     int64_t stride, const std::vector<float>& w, const std::vector<float>& bias, double flops);
  bool conv_dilated_phases(size_t i, const Fusion& f, const std::string& src, const Dims& x, const Dims& y,
                           int64_t dil, const md_t& wany, const md_t& bmd, const dnnl::primitive_attr& attr,
                           const md_t& wplain, std::vector<float>& w, bool has_bias, const std::vector<float>& bias,
                           double flops);
  bool conv_dw_fused(size_t i, const Fusion& f, const md_t& src, const md_t& wany, const md_t& bmd,
                     const std::vector<float>& w, const std::vector<float>& bias, double flops);
  // A depthwise convolution whose output goes through SiLU as one step of the chain's own (steps/dwsilu.h), the
  // SiLU of its source too when its producer left that to it (defer_silu: deferred_silu_ holds those values).
  bool dw_silu_plan(size_t u, DwSiluShape* s, Fusion* f);
  bool defer_silu(const std::string& v, const md_t& md);
  bool conv_dw_silu(size_t i);
  std::set<std::string> deferred_silu_;
  bool se_excite_fused(size_t i);
  void matmul(size_t i);
  void pool(size_t i);
  void eltwise(size_t i);
  void binary(size_t i);
  void concat(size_t i);
  void batchnorm(size_t i);
  void softmax(size_t i);
  void reduce_mean(size_t i);
  void attention(size_t i);
  void layernorm(size_t i, const std::string& x, const std::string& out, const ConstT* scale, const ConstT* shift,
                 float eps);
  void reshape_like(size_t i);
  void transpose(size_t i);
  void slice(size_t i);
  void pad(size_t i);
  // A Pad folded into the padding of every node reading it (pad): its output -> (its input, the spatial pads added
  // at the start and at the end of each spatial axis). The Pad's output has no memory of its own.
  struct PadFold {
    std::string in;
    Dims begin, end;
  };
  std::map<std::string, PadFold> pad_folds_;
  bool pad_foldable_into(size_t u, const std::string& v, const std::string& src, const Dims& begin, const Dims& end,
                         float value);
  bool non_negative(const std::string& v) const;
  void resize(size_t i);
  // --- int8 steps (keel.QConv / keel.QGemm; defined in the int8 section below)
  void qconv(size_t i);
  void qgemm(size_t i);
  void qdq(size_t i);
  QNodeView qnode_view(const NodeDesc& n) const;
  bool qconv_x_only(const std::string& v, size_t rank);
  Val residual_last(const std::string& name, const Dims& y);
  Val quantized(const std::string& name, const QuantSetup& q, const md_t& want);
  dnnl::memory zero_point_mem(int32_t v);
  md_t boundary_md(const std::string& name, const Dims& d, dt t) const;
  void outputs();
  void plan_workspace();

  void plan_concats();
  void plan_concat_prefixes();

  // The data type the node being built computes in (its output's: f32 or bf16). Unqualified plain_md() in the
  // Builder makes memory of that type; constants (f32 here) are converted to it when read as data.
  dt act_ = dt::f32;
  md_t plain_md(const Dims& d, dt t) const { return ::keel::onednn::plain_md(d, t); }
  md_t plain_md(const Dims& d) const { return plain_md(d, act_); }
  void cast(size_t i);

  const Recipe& r_;
  bool time_convs_ = true;
  std::unique_ptr<Plan> p_;
  std::map<std::string, std::pair<int, uint64_t>> concat_parts_;  // concat input -> (buffer, byte offset)
  std::map<std::string, int> concat_bufs_;                         // concat output -> its buffer
  std::set<std::string> placed_parts_;
  std::map<std::string, Val> vals_;
  std::map<std::string, std::vector<size_t>> users_;
  std::set<std::string> outputs_;
  std::vector<bool> done_;
  std::map<int, dnnl::memory> owned_of_buf_;
  size_t cur_node_ = static_cast<size_t>(-1);  // the node being built (for the profile's step names)
  bool layout_reorder_ = false;                // the exec being added is a layout change (as_md)
  std::vector<bool> exec_layout_;              // per exec: a layout change
  void label_steps(size_t node, size_t first_exec, const std::vector<bool>& done_before);
};

// Labels the execs node `node` added (from `first_exec`) for the session profile: its op type and name, with the
// nodes it fused (those marked done while it was built); layout reorders get no op type.
void Builder::label_steps(size_t node, size_t first_exec, const std::vector<bool>& done_before) {
  std::vector<const char*> covered{r_.nodes[node].name.c_str()};
  for (size_t k = 0; k < done_.size(); ++k)
    if (k != node && done_[k] && !done_before[k]) covered.push_back(r_.nodes[k].name.c_str());
  for (size_t e = first_exec; e < p_->execs.size(); ++e) {
    const bool layout = exec_layout_[e];
    p_->step_op[e] = layout ? "" : r_.nodes[node].op.c_str();
    p_->step_nodes[e] = layout ? std::vector<const char*>{covered[0]} : covered;
  }
}

std::unique_ptr<Plan> Builder::build() {
  p_ = std::make_unique<Plan>();
  p_->threads = omp_get_max_threads();
  done_.assign(r_.nodes.size(), false);
  for (size_t i = 0; i < r_.nodes.size(); ++i)
    for (const auto& in : r_.nodes[i].in)
      if (!in.empty()) {
        auto& u = users_[in];
        if (std::find(u.begin(), u.end(), i) == u.end()) u.push_back(i);
      }
  outputs_.insert(r_.outputs.begin(), r_.outputs.end());
  plan_concats();
  for (size_t k = 0; k < r_.inputs.size(); ++k) {
    const std::string& name = r_.inputs[k];
    if (is_const(name)) continue;
    auto d = r_.dims.find(name);
    auto t = r_.dtypes.find(name);
    if (d == r_.dims.end() || t == r_.dtypes.end() || (t->second != KEEL_DTYPE_F32 && t->second != KEEL_DTYPE_BF16 &&
                                                       t->second != KEEL_DTYPE_U8 && t->second != KEEL_DTYPE_I8))
      continue;  // not read as data
    Buf b;
    b.kind = BufKind::kInput;
    b.index = static_cast<int>(k);
    p_->bufs.push_back(b);
    Val v;
    v.md = boundary_md(name, d->second, t->second == KEEL_DTYPE_BF16 ? dt::bf16 : t->second == KEEL_DTYPE_U8 ? dt::u8
                                        : t->second == KEEL_DTYPE_I8 ? dt::s8 : dt::f32);
    v.buf = static_cast<int>(p_->bufs.size()) - 1;
    p_->bufs[v.buf].values = 2;  // never written in place
    vals_[name] = v;
  }
  for (size_t i = 0; i < r_.nodes.size(); ++i) {
    if (done_[i]) continue;
    const NodeDesc& n = r_.nodes[i];
    bool folded = true;
    for (const auto& o : n.out) folded = folded && (o.empty() || is_const(o));
    if (folded) {
      done_[i] = true;
      continue;
    }
    cur_node_ = i;
    {
      auto t = n.out.empty() ? r_.dtypes.end() : r_.dtypes.find(n.out[0]);
      act_ = t != r_.dtypes.end() && t->second == KEEL_DTYPE_BF16 ? dt::bf16 : dt::f32;
    }
    const size_t first_exec = p_->execs.size();
    const std::vector<bool> done_before = done_;
    try {
      const std::string& op = n.op;
      if (op == "Conv") conv(i);
      else if (op == "ConvTranspose") deconv(i);
      else if (op == "MatMul" || op == "Gemm") matmul(i);
      else if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" || op == "GlobalMaxPool") pool(i);
      else if (op == "Relu" || op == "Clip" || op == "LeakyRelu" || op == "Sigmoid" || op == "Tanh" || op == "Gelu" ||
               op == "HardSwish" || op == "HardSigmoid" || op == "Sqrt" || op == "Pow")
        eltwise(i);
      else if (op == "ReduceMean") reduce_mean(i);
      else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") binary(i);
      else if (op == "Concat") concat(i);
      else if (op == "BatchNormalization") batchnorm(i);
      else if (op == "Softmax") softmax(i);
      else if (op == "Attention") attention(i);
      else if (op == "LayerNormalization") {
        const ConstT* s = cst(n.in_at(1));
        const ConstT* b = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
        if (!s || (!n.in_at(2).empty() && !b)) throw Reject{"non-constant scale or bias"};
        int64_t axis = n.ai("axis", -1), rank = static_cast<int64_t>(dims_of(n.in[0]).size());
        if (axis < 0) axis += rank;
        if (axis != rank - 1) throw Reject{"axis other than the last"};
        if (n.out.size() > 1) throw Reject{"Mean/InvStdDev outputs"};
        layernorm(i, n.in[0], n.out[0], s, b, n.af("epsilon", 1e-5f));
      } else if (op == "Reshape" || op == "Flatten" || op == "Squeeze" || op == "Unsqueeze" || op == "Identity" ||
                 op == "Dropout")
        reshape_like(i);
      else if (op == "Transpose") transpose(i);
      else if (op == "Slice") slice(i);
      else if (op == "Pad") pad(i);
      else if (op == "Resize") resize(i);
      else if (op == "Cast") cast(i);
      else if (op == "QConv") qconv(i);  // keel.QConv / keel.QGemm: the claim admits no ai.onnx op of these names
      else if (op == "QGemm") qgemm(i);
      else if (op == "QuantizeLinear" || op == "DequantizeLinear") qdq(i);
      else throw Reject{"op " + op};
    } catch (const Reject& e) {
      throw NodeReject{i, e.why};
    } catch (const dnnl::error& e) {
      throw NodeReject{i, std::string("oneDNN: ") + e.what()};
    }
    done_[i] = true;
    p_->step_op.resize(p_->execs.size(), "");
    p_->step_nodes.resize(p_->execs.size());
    label_steps(i, first_exec, done_before);
  }
  cur_node_ = npos;
  act_ = dt::f32;
  outputs();
  p_->step_op.resize(p_->execs.size(), "");  // the boundary outputs' reorders: the chain's own
  p_->step_nodes.resize(p_->execs.size());
  plan_workspace();
  p_->last_base.assign(p_->bufs.size(), reinterpret_cast<void*>(-1));
  return std::move(p_);
}

// Channel concatenations of batch 1 whose inputs are 16-aligned, computed here and read by the Concat only:
// reserve the output buffer; each input written as nChw16c lands in its slice of it (see define).
void Builder::plan_concats() {
  plan_concat_prefixes();
  for (const NodeDesc& n : r_.nodes) {
    if (n.op != "Concat" || n.out.size() != 1 || concat_bufs_.count(n.out[0])) continue;
    if (auto t = r_.dtypes.find(n.out[0]); t == r_.dtypes.end() || t->second != KEEL_DTYPE_F32) continue;
    auto yd = r_.dims.find(n.out[0]);
    if (yd == r_.dims.end() || yd->second.size() != 4 || yd->second[0] != 1) continue;
    int64_t axis = n.ai("axis", 0);
    if (axis < 0) axis += 4;
    if (axis != 1) continue;
    bool ok = true;
    for (const auto& in : n.in) {
      auto d = r_.dims.find(in);
      ok = ok && !in.empty() && d != r_.dims.end() && d->second.size() == 4 && d->second[1] % 16 == 0 &&
           !escapes(in) && users(in).size() == 1 && !is_const(in) && !concat_parts_.count(in) &&
           std::find(r_.inputs.begin(), r_.inputs.end(), in) == r_.inputs.end();
      int reads = 0;
      for (const auto& x : n.in) reads += x == in;
      ok = ok && reads == 1;
    }
    if (!ok) continue;
    md_t full(to_dnnl(yd->second), dt::f32, tag::nChw16c);
    int b = new_buf(full.get_size());
    uint64_t off = 0;
    for (const auto& in : n.in) {
      concat_parts_[in] = {b, off};
      off += static_cast<uint64_t>(numel(r_.dims.at(in))) * sizeof(float);
    }
    concat_bufs_[n.out[0]] = b;
  }
}

// DenseNet's blocks: Concat(x0, f1), Concat(x0, f1, f2), ..., each concatenation's inputs a prefix of the last
// one's (batch 1, 4-D f32, channel axis, 16-aligned channel counts). One buffer holds the last concatenation; each
// feature is written once into its slice (see define) and every concatenation is a view of the buffer's first
// channels (the first C channels of an nChw16c [1,C',H,W] are the bytes of an nChw16c [1,C,H,W]): no Concat copies
// anything, where each would copy all the features before it. Other readers of a feature read it in its slice; the
// buffer holds many values, so nothing writes into it in place.
void Builder::plan_concat_prefixes() {
  auto eligible = [&](const NodeDesc& n) {
    if (n.op != "Concat" || n.out.size() != 1 || n.in.empty()) return false;
    if (auto t = r_.dtypes.find(n.out[0]); t == r_.dtypes.end() || t->second != KEEL_DTYPE_F32) return false;
    auto yd = r_.dims.find(n.out[0]);
    if (yd == r_.dims.end() || yd->second.size() != 4 || yd->second[0] != 1) return false;
    int64_t axis = n.ai("axis", 0);
    if (axis < 0) axis += 4;
    if (axis != 1) return false;
    std::set<std::string> seen;
    for (const auto& in : n.in) {
      auto d = r_.dims.find(in);
      if (in.empty() || d == r_.dims.end() || d->second.size() != 4 || d->second[1] % 16 != 0 || escapes(in) ||
          is_const(in) || !seen.insert(in).second ||
          std::find(r_.inputs.begin(), r_.inputs.end(), in) != r_.inputs.end())
        return false;
    }
    return true;
  };
  std::map<std::string, std::vector<size_t>> families;  // first input -> the eligible Concats starting with it
  for (size_t i = 0; i < r_.nodes.size(); ++i)
    if (eligible(r_.nodes[i])) families[r_.nodes[i].in[0]].push_back(i);
  for (const auto& [first, members] : families) {
    if (members.size() < 2) continue;
    size_t last = members[0];
    for (size_t m : members)
      if (r_.nodes[m].in.size() > r_.nodes[last].in.size()) last = m;
    const std::vector<std::string>& all = r_.nodes[last].in;
    bool ok = true;
    for (size_t m : members) {
      const auto& in = r_.nodes[m].in;
      ok = ok && std::equal(in.begin(), in.end(), all.begin());
    }
    for (const auto& in : all) ok = ok && !concat_parts_.count(in);
    if (!ok) continue;
    md_t full(to_dnnl(r_.dims.at(r_.nodes[last].out[0])), dt::f32, tag::nChw16c);
    int b = new_buf(full.get_size());
    uint64_t off = 0;
    for (const auto& in : all) {
      concat_parts_[in] = {b, off};
      off += static_cast<uint64_t>(numel(r_.dims.at(in))) * sizeof(float);
    }
    for (size_t m : members) concat_bufs_[r_.nodes[m].out[0]] = b;
  }
}

// Boundary outputs: the value's memory in plain layout, written into the output tensor.
void Builder::outputs() {
  p_->out_dims.resize(r_.outputs.size());
  p_->out_consts.assign(r_.outputs.size(), nullptr);
  for (size_t k = 0; k < r_.outputs.size(); ++k) {
    const std::string& name = r_.outputs[k];
    if (const ConstT* c = cst(name)) {
      p_->out_consts[k] = c;
      p_->out_dims[k] = c->dims;
      continue;
    }
    auto it = vals_.find(name);
    if (it == vals_.end()) throw NodeReject{r_.nodes.size(), "output '" + name + "' not produced"};
    Val v = it->second;
    Dims d = md_dims(v.md);
    p_->out_dims[k] = d;
    Buf b;
    b.kind = BufKind::kOutput;
    b.index = static_cast<int>(k);
    p_->bufs.push_back(b);
    int ob = static_cast<int>(p_->bufs.size()) - 1;
    // Retarget the producer's writes when the value is already plain (or channels-last, where the graph holds it so)
    // and lives alone in a workspace buffer.
    const md_t want = boundary_md(name, d, v.md.data_type());
    if (v.scale == 1.f && (r_.channels_last.count(name) ? v.md == want : is_plain_dense(v.md)) && v.buf >= 0 &&
        p_->bufs[v.buf].kind == BufKind::kWorkspace && p_->bufs[v.buf].values == 1 && v.off == 0) {
      for (auto& bd : p_->binds)
        if (bd.buf == v.buf) bd.buf = ob;
      p_->bufs[ob].first = p_->bufs[v.buf].first;
      p_->bufs[ob].last = p_->bufs[v.buf].last;
      p_->bufs[v.buf].first = 1 << 30;
      p_->bufs[v.buf].last = -1;
      // Other values sharing this buffer (none: values == 1) would follow.
      continue;
    }
    if (v.scale != 1.f) throw NodeReject{r_.nodes.size(), "a scaled view leaves the claim"};
    dnnl::memory s = mem_of(v), d2 = mem_at(want, ob, 0);
    exec(dnnl::reorder(s, d2), {{DNNL_ARG_FROM, s}, {DNNL_ARG_TO, d2}});
  }
}

// Greedy offsets: biggest buffer first, lowest offset that overlaps no buffer live at the same time.
void Builder::plan_workspace() {
  std::vector<int> order;
  for (size_t b = 0; b < p_->bufs.size(); ++b)
    if (p_->bufs[b].kind == BufKind::kWorkspace && p_->bufs[b].last >= 0) order.push_back(static_cast<int>(b));
  std::sort(order.begin(), order.end(), [&](int a, int b) { return p_->bufs[a].bytes > p_->bufs[b].bytes; });
  std::vector<int> placed;
  uint64_t total = 0;
  for (int b : order) {
    Buf& x = p_->bufs[b];
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    for (int o : placed) {
      const Buf& y = p_->bufs[o];
      if (y.first <= x.last && x.first <= y.last) busy.emplace_back(y.offset, y.offset + y.bytes);
    }
    std::sort(busy.begin(), busy.end());
    uint64_t off = 0;
    for (auto& [s, e] : busy) {
      if (off + x.bytes <= s) break;
      off = std::max(off, e);
    }
    x.offset = off;
    total = std::max(total, off + x.bytes);
    placed.push_back(b);
  }
  p_->ws_bytes = total;
}

bool Builder::eltwise_of(const NodeDesc& n, alg* a, float* alpha, float* beta) {
  *alpha = 0;
  *beta = 0;
  // The post-ops a chain takes (eltwise_algorithm knows more ops): the parameterless ones, LeakyRelu, Gelu; then
  // Pow and Clip with constant inputs.
  if (n.op == "Relu" || n.op == "LeakyRelu" || n.op == "Sigmoid" || n.op == "Tanh" || n.op == "Sqrt" ||
      n.op == "HardSwish" || n.op == "Gelu") {
    if (!eltwise_algorithm(n.op, n.as("approximate", "none"), a, alpha, beta)) return false;
    if (n.op == "LeakyRelu") *alpha = n.af("alpha", 0.01f);
  } else if (n.op == "Pow") {
    // A constant exponent of 2 or 0.5 only (the decomposed normalisations'): exact for every base, as ONNX's Pow.
    const ConstT* p = n.in.size() == 2 ? cst(n.in[1]) : nullptr;
    if (!p || p->count() != 1) return false;
    if (p->at(0) == 2.0) *a = alg::eltwise_square;
    else if (p->at(0) == 0.5) *a = alg::eltwise_sqrt;
    else return false;
  }
  else if (n.op == "Clip") {
    float lo = -INFINITY, hi = INFINITY;
    if (n.has("min") || n.has("max")) {
      lo = n.af("min", -INFINITY);
      hi = n.af("max", INFINITY);
    }
    for (int k = 1; k <= 2; ++k) {
      std::string v = n.in_at(k);
      if (v.empty()) continue;
      const ConstT* c = cst(v);
      if (!c || c->count() != 1) return false;
      (k == 1 ? lo : hi) = static_cast<float>(c->at(0));
    }
    *a = alg::eltwise_clip_v2;
    *alpha = std::max(lo, -FLT_MAX);
    *beta = std::min(hi, FLT_MAX);
  } else {
    return false;
  }
  return true;
}

// The element-wise op node `n` computes, appended to `po` as eltwise post-ops: one for the ops of eltwise_of, two for
// HardSigmoid (oneDNN 2.6 has none: max(0, min(1, alpha * x + beta)) is linear, then clip to [0, 1]). False, `po`
// unchanged, when `n` is none of them.
bool Builder::eltwise_po(const NodeDesc& n, dnnl::post_ops* po) {
  if (n.op == "HardSigmoid") {
    po->append_eltwise(1.f, alg::eltwise_linear, n.af("alpha", 0.2f), n.af("beta", 0.5f));
    po->append_eltwise(1.f, alg::eltwise_clip_v2, 0.f, 1.f);
    return true;
  }
  alg a;
  float alpha, beta;
  if (!eltwise_of(n, &a, &alpha, &beta)) return false;
  po->append_eltwise(1.f, a, alpha, beta);
  return true;
}

// Whether node `n` (a Reshape, Transpose, Squeeze or Unsqueeze of plain dense `in`) only relabels or moves dims of
// size 1, keeping the last dim: its output is the same memory in the same order, so a product's post-ops (a bias
// over the last axis, a residual sum) may come after it (torch's out-projection [S*B,E] -> [S,B,E] -> [B,S,E]).
bool Builder::same_order_view(const NodeDesc& n, const std::string& in) {
  if (n.out.size() != 1 || n.in.empty() || n.in[0] != in) return false;
  if (n.op == "Reshape") {
    if (!cst(n.in_at(1)) || n.ai("allowzero", 0)) return false;
  } else if (n.op != "Transpose" && n.op != "Squeeze" && n.op != "Unsqueeze") {
    return false;
  }
  const Dims x = dims_of(in), y = dims_of(n.out[0]);
  if (x.empty() || y.empty() || x.back() != y.back() || numel(x) != numel(y)) return false;
  auto big = [](const Dims& d) {
    Dims b;
    for (int64_t k : d)
      if (k != 1) b.push_back(k);
    return b;
  };
  if (big(x) != big(y)) return false;
  if (n.op != "Transpose") return true;
  const Dims perm = n.ais("perm", {});
  if (perm.size() != x.size()) return false;  // (the default reverses the dims: in order only when one is not 1)
  int64_t last = -1;
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(x.size())) return false;
    if (x[p] == 1) continue;
    if (p < last) return false;
    last = p;
  }
  return true;
}

// Looks at what reads `out` and folds what it can into the op that writes it. A matmul's (!conv) product may be
// followed through same_order_view nodes when an op fused after them (f.viewed; f.out then has the view's dims).
Builder::Fusion Builder::fuse_after(const std::string& out, size_t at, bool conv, int64_t channels) {
  Fusion f;
  f.out = out;
  bool has_eltwise = false;
  std::string before_views;  // f.out before the views followed since the last fused op (dropped without one)
  size_t views = 0;
  auto fused_past_views = [&] {  // an op was fused after the views followed so far: they stay
    f.viewed = f.viewed || views > 0;
    views = 0;
  };
  for (;;) {
    // SiLU written as x * Sigmoid(x) (how torch exports it): one swish post-op.
    if (size_t m = silu_after(f.out); m != npos) {
      f.po.append_eltwise(1.f, alg::eltwise_swish, 1.f, 0.f);
      has_eltwise = true;
      f.nodes.push_back(users(f.out)[0] == m ? users(f.out)[1] : users(f.out)[0]);
      f.nodes.push_back(m);
      f.count++;
      f.out = r_.nodes[m].out[0];
      fused_past_views();
      continue;
    }
    size_t u = sole_user(f.out);
    if (u == npos) break;
    const NodeDesc& n = r_.nodes[u];
    if (!conv && g_options.view_post_ops && same_order_view(n, f.out)) {
      if (views++ == 0) before_views = f.out;
      f.nodes.push_back(u);
      f.out = n.out[0];
      continue;
    }
    if (n.out.size() != 1 && !(n.op == "BatchNormalization")) break;
    if (n.op == "Clip" && n.in[0] != f.out) break;
    if (eltwise_po(n, &f.po)) {
      has_eltwise = true;
    } else if (conv && n.op == "BatchNormalization" && f.count == 0 && n.in.size() == 5 && n.in[0] == f.out &&
               n.ai("training_mode", 0) == 0) {
      bool extra = false;
      for (size_t k = 1; k < n.out.size(); ++k) extra = extra || !n.out[k].empty();
      const ConstT *s = cst(n.in[1]), *b = cst(n.in[2]), *m = cst(n.in[3]), *v = cst(n.in[4]);
      if (extra || !s || !b || !m || !v || s->count() != channels || b->count() != channels ||
          m->count() != channels || v->count() != channels)
        break;
      float eps = n.af("epsilon", 1e-5f);
      f.bn_scale.resize(channels);
      f.bn_shift.resize(channels);
      for (int64_t c = 0; c < channels; ++c) {
        double k = s->at(c) / std::sqrt(v->at(c) + eps);
        f.bn_scale[c] = static_cast<float>(k);
        f.bn_shift[c] = static_cast<float>(b->at(c) - m->at(c) * k);
      }
    } else if (n.op == "Add" || ((n.op == "Mul" || n.op == "Div" || n.op == "Sub") && !conv)) {
      if (n.in.size() != 2) break;
      std::string other = n.in[0] == f.out ? n.in[1] : n.in[0];
      const ConstT* c = cst(other);
      Dims od = dims_of(f.out);
      if (c && (n.op == "Mul" || n.op == "Div")) {
        if (c->count() != 1 || n.in[0] != f.out || has_eltwise) break;
        float k = static_cast<float>(c->at(0));
        if (n.op == "Div") k = 1.f / k;
        // Before any bias: scale the product; after: a linear post-op.
        if (f.count == 0) f.out_scale *= k;
        else f.po.append_eltwise(1.f, alg::eltwise_linear, k, 0.f);
      } else if (c && n.op == "Add") {
        if (has_eltwise || !f.sum_with.empty()) break;
        if (conv) {
          // Per-channel [C,1,1] / [1,C,1,1] or a scalar.
          Dims cd = c->dims;
          while (!cd.empty() && cd.front() == 1 && cd.size() > 3) cd.erase(cd.begin());
          bool per_channel = c->count() == channels && cd.size() == 3 && cd[0] == channels;
          if (!per_channel && c->count() != 1) break;
          if (f.conv_bias_add.empty()) f.conv_bias_add.assign(channels, 0.f);
          for (int64_t k = 0; k < channels; ++k) f.conv_bias_add[k] += static_cast<float>(c->at(per_channel ? k : 0));
        } else {
          const int64_t N = od.back();
          bool last_axis = c->count() == N && !c->dims.empty() && c->dims.back() == N;
          if (!last_axis || f.out_scale != 1.f || !f.mm_bias.empty() || f.po.len() > 0) break;
          f.mm_bias.resize(N);
          for (int64_t k = 0; k < N; ++k) f.mm_bias[k] = static_cast<float>(c->at(k));
        }
      } else if (!c && n.op == "Add") {
        // A residual: same shape, already computed, and no post-op before it (sum must come first here).
        if (!f.sum_with.empty() || f.po.len() > 0 || !vals_.count(other) || dims_of(other) != od) break;
        if (vals_[other].scale != 1.f) break;
        f.sum_with = other;
        f.po.append_sum(1.f);
      } else {
        break;
      }
    } else {
      break;
    }
    f.nodes.push_back(u);
    f.count++;
    f.out = n.out[0];
    fused_past_views();
  }
  if (views > 0) {
    f.nodes.resize(f.nodes.size() - views);
    f.out = before_views;
  }
  (void)at;
  return f;
}

// A SiLU (swish post-op) at the end of a convolution's fusion runs as the chain's own step after the primitive
// (exec_silu) instead: oneDNN 2.6's swish costs more than a 1x1 convolution's arithmetic on EfficientNet's shapes
// (steps/silu.h, PERFORMANCE.md). Strips it from f.po and returns true; false, changing nothing, when the option is
// off, the CPU lacks AVX-512 (the pass would be scalar), the node computes in bf16, or the chain holds post-op kinds
// other than eltwise and sum before it.
bool Builder::take_silu(Fusion& f) {
  if (!g_options.silu_pass || !has_avx512f() || act_ != dt::f32) return false;
  const int last = f.po.len() - 1;
  if (last < 0 || f.po.kind(last) != dnnl::primitive::kind::eltwise) return false;
  float scale, alpha, beta;
  alg a;
  f.po.get_params_eltwise(last, scale, a, alpha, beta);
  if (a != alg::eltwise_swish || scale != 1.f || alpha != 1.f) return false;
  dnnl::post_ops po;
  for (int k = 0; k < last; ++k) {
    if (f.po.kind(k) == dnnl::primitive::kind::eltwise) {
      f.po.get_params_eltwise(k, scale, a, alpha, beta);
      po.append_eltwise(scale, a, alpha, beta);
    } else if (f.po.kind(k) == dnnl::primitive::kind::sum) {
      f.po.get_params_sum(k, scale);
      po.append_sum(scale);
    } else {
      return false;
    }
  }
  f.po = po;
  return true;
}

// The chain's own SiLU step, in place over value `v` named `name` (f32, any dense layout: blocked padding is 0 and
// stays 0). Under 128 KiB it runs on one thread: it is compute-bound (about 1.75 ns per 16 floats on one core), so
// unlike the memory-bound steps (exec) a second thread pays off from a few microseconds of work.
// When `v` is nChw16c and read by a GlobalAveragePool (squeeze-excite after EfficientNet's depthwise convolutions),
// the same pass computes the pooling too (each channel's mean, as nChw16c [N,C,1,1]) and that node is done: its
// step and a second read of the tensor saved.
void Builder::exec_silu(const Val& v, const std::string& name) {
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_DST, mem_of(v)}};
  const Dims d = md_dims(v.md);
  std::string what = " SiLU ";
  if (d.size() == 4 && v.md == md_t(v.md.dims(), dt::f32, tag::nChw16c)) {
    for (size_t u : users(name)) {
      const NodeDesc& pn = r_.nodes[u];
      if (done_[u] || pn.op != "GlobalAveragePool" || pn.in.size() != 1 || pn.in[0] != name || pn.out.size() != 1)
        continue;
      Val& pv = define(pn.out[0], md_t({d[0], d[1], 1, 1}, dt::f32, tag::nChw16c));
      args[kArgPooled] = mem_of(pv);
      done_[u] = true;
      what = " SiLU + GlobalAveragePool ";
      break;
    }
  }
  const bool pooled = args.count(kArgPooled) != 0;
  Exec e;
  e.single = v.md.get_size() < (128u << 10);
  e.own = pooled ? run_silu_mean : run_silu;
  e.args = std::move(args);
  exec_own(std::move(e), pooled ? "keel:silu_mean_avx512" : "keel:silu_avx512", false,
           (cur_node_ < r_.nodes.size() ? r_.nodes[cur_node_].name : std::string("(outputs)")) + what + dims_str(d));
}

// Squeeze-excite's Mul(x, s), s a [1,C,1,1] value computed here and x [1,C,H,W], whose only reader is a 1x1
// convolution (stride 1, no pads, group 1, constant f32 weights [M,C,1,1]) with M <= H*W/4: instead of a binary
// step over x (C*H*W products and a pass over memory) that convolution reads x and its weights are scaled by s each
// run (exec_scale_weights: M*C products). EfficientNet-B0's first five projections (M = 16..40 at 112..28 px). True
// when folded (the Mul then runs nothing; conv() finds it in se_folds_); false, changing nothing, otherwise.
bool Builder::fold_channel_scale(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (act_ != dt::f32 || n.out.size() != 1 || is_const(n.in[0]) || is_const(n.in[1])) return false;
  if (!vals_.count(n.in[0]) || !vals_.count(n.in[1])) return false;
  std::string x = n.in[0], s = n.in[1];
  if (dims_of(x).size() != 4 || numel(dims_of(x)) < numel(dims_of(s))) std::swap(x, s);
  const Dims xd = dims_of(x), sd = dims_of(s);
  if (xd.size() != 4 || xd[0] != 1 || dims_of(n.out[0]) != xd) return false;
  if (sd != Dims{1, xd[1], 1, 1} && sd != Dims{xd[1], 1, 1}) return false;
  const Val &xv = vals_[x], &sv = vals_[s];
  if (xv.scale != 1.f || sv.scale != 1.f || xv.md.data_type() != dt::f32 || sv.md.data_type() != dt::f32) return false;
  // s's element c must sit at offset c: plain, or nChw16c of [1,C,1,1].
  if (!is_plain_dense(sv.md) && sv.md != md_t({1, xd[1], 1, 1}, dt::f32, tag::nChw16c)) return false;
  const size_t u = sole_user(n.out[0]);
  if (u == npos) return false;
  const NodeDesc& cn = r_.nodes[u];
  if (cn.op != "Conv" || cn.in[0] != n.out[0] || cn.out.size() != 1) return false;
  const ConstT* W = cst(cn.in_at(1));
  if (!W || W->dtype != KEEL_DTYPE_F32 || W->dims.size() != 4 || W->dims[1] != xd[1] || W->dims[2] != 1 ||
      W->dims[3] != 1 || cn.ai("group", 1) != 1)
    return false;
  if (cn.ais("strides", {1, 1}) != Dims{1, 1} || cn.ais("pads", {0, 0, 0, 0}) != Dims{0, 0, 0, 0} ||
      cn.ais("dilations", {1, 1}) != Dims{1, 1})
    return false;
  const std::string ap = cn.as("auto_pad", "NOTSET");
  if (ap != "NOTSET" && ap != "VALID" && !ap.empty()) return false;
  if (W->dims[0] * 4 > xd[2] * xd[3]) return false;
  se_folds_[n.out[0]] = {x, s};
  return true;
}

// The per-run step of a folded squeeze-excite scale: the convolution's weights `wmem` (in its layout, reordered
// once from `wplain` [M,C,1,1]) are kept unscaled in a copy, and each run writes copy * scale[c] into `wmem`, c
// being each element's input channel, found once by reordering a plain image of channel numbers into the layout.
void Builder::exec_scale_weights(const dnnl::memory& wmem, const md_t& wplain, const std::string& chan_scale) {
  const md_t wmd = wmem.get_desc();
  const Dims wd = md_dims(wplain);
  const int64_t M = wd[0], C = wd[1];
  dnnl::memory orig(wmd, engine(), p_->weights.alloc(wmd.get_size()));
  std::memcpy(orig.get_data_handle(), wmem.get_data_handle(), wmd.get_size());
  std::vector<float> image(static_cast<size_t>(M * C));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) image[m * C + c] = static_cast<float>(c + 1);  // exact: C < 2^24
  dnnl::memory img(wplain, engine(), image.data()), blocked(wmd, engine());
  dnnl::reorder(img, blocked).execute(stream(), img, blocked);
  stream().wait();
  const size_t n = wmd.get_size() / sizeof(float);
  const float* b = static_cast<const float*>(blocked.get_data_handle());
  std::vector<int32_t> chan(n);
  for (size_t j = 0; j < n; ++j) chan[j] = b[j] > 0.f ? static_cast<int32_t>(b[j]) - 1 : -1;  // -1: padding
  // One channel per 16 floats (padding aside)? Then one map entry per 16 floats, else one per float.
  bool rows = n % 16 == 0;
  std::vector<int32_t> row_chan(rows ? n / 16 : 0, 0);
  for (size_t r = 0; rows && r < n / 16; ++r) {
    int32_t c = -1;
    for (size_t k = 16 * r; k < 16 * r + 16; ++k) {
      if (chan[k] < 0) continue;
      if (c >= 0 && c != chan[k]) rows = false;
      c = chan[k];
    }
    row_chan[r] = std::max(c, 0);  // an all-padding row: 0 * s[0]
  }
  const size_t len = rows ? n / 16 : n;
  dnnl::memory map(md_t({static_cast<int64_t>(len)}, dt::s32, tag::a), engine());
  int32_t* mp = static_cast<int32_t*>(map.get_data_handle());
  for (size_t j = 0; j < len; ++j) mp[j] = rows ? row_chan[j] : std::max(chan[j], 0);  // padding: 0 * s[0]
  p_->owned.push_back(orig);
  p_->owned.push_back(map);
  const Val& sv = val(chan_scale);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_DST, wmem}, {DNNL_ARG_SRC, orig}, {kArgMap, map},
                                             {kArgScale, mem_of(sv)}};
  Exec e;
  e.single = true;
  e.own = rows ? run_scale_weights16 : run_scale_weights;
  e.args = std::move(args);
  exec_own(std::move(e), rows ? "keel:scale_weights16" : "keel:scale_weights", false,
           r_.nodes[cur_node_].name + " weights x " + chan_scale + " " + dims_str(wd));
}

// A 1x1 convolution over a [1,C,1,1] value expanding to M >= 512 >= 4*C channels (squeeze-excite's excitation in
// EfficientNet's later blocks) is a vector-matrix product that oneDNN's matmul (brgemm) runs faster than its 1x1
// convolution kernel: 48 -> 1152 in 10 us instead of 15-17 (weights cold, in the network, 1 thread), 28 -> 672 in
// 5-7 instead of 8. Not for the squeeze (1152 -> 48: 10 against 5 us) nor small ones (level or slower). The input
// is read where it is (element c at offset c: plain, or nChw16c of [1,C,1,1]), the output is plain [1,M,1,1];
// post-ops as the convolution's (and the SiLU pass). False, changing nothing, when the input sits otherwise or
// oneDNN refuses.
bool Builder::conv_as_gemv(size_t i, const Fusion& f, const std::vector<float>& w, bool has_bias,
                           const std::vector<float>& bias) {
  const NodeDesc& n = r_.nodes[i];
  const Val& xv = val(n.in[0]);
  const int64_t C = dims_of(n.in[0])[1], M = static_cast<int64_t>(bias.size());
  if (M < 512 || M < 4 * C || xv.scale != 1.f || xv.md.data_type() != dt::f32) return false;
  if (!is_plain_dense(xv.md) && xv.md != md_t({1, C, 1, 1}, dt::f32, tag::nChw16c)) return false;
  const md_t a({1, C}, dt::f32, tag::ab), b({C, M}, dt::f32, tag::any), bm({1, M}, dt::f32, tag::ab),
      d({1, M}, dt::f32, tag::ab);
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(f.po);
  std::unique_ptr<dnnl::matmul::primitive_desc> pd;
  try {
    pd = std::make_unique<dnnl::matmul::primitive_desc>(dnnl::matmul::desc(a, b, has_bias ? bm : md_t(), d), attr,
                                                        engine());
  } catch (const dnnl::error&) {
    return false;
  }
  dnnl::memory wuser(md_t({C, M}, dt::f32, tag::ba), engine(), const_cast<float*>(w.data()));  // w is [M][C]
  p_->owned.emplace_back(pd->weights_desc(), engine(), p_->weights.alloc(pd->weights_desc().get_size()));
  dnnl::memory wmem = p_->owned.back();
  dnnl::reorder(wuser, wmem).execute(stream(), wuser, wmem);
  stream().wait();
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_WEIGHTS, wmem}};
  if (has_bias) {
    p_->owned.emplace_back(bm, engine());
    std::memcpy(p_->owned.back().get_data_handle(), bias.data(), bias.size() * sizeof(float));
    args[DNNL_ARG_BIAS] = p_->owned.back();
  }
  args[DNNL_ARG_SRC] = mem_at(a, xv.buf, xv.off);
  Val& out = define(f.out, md_t({1, M, 1, 1}, dt::f32, tag::nchw));
  args[DNNL_ARG_DST] = mem_at(d, out.buf, out.off);
  p_->flops += 2.0 * static_cast<double>(C * M);
  exec(dnnl::matmul(*pd), std::move(args));
  if (f.silu_pass) exec_silu(out, f.out);
  for (size_t k : f.nodes) done_[k] = true;
  return true;
}

// Conv, 2-D, constant weights (and bias).
void Builder::conv(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (conv_residual_merged(i)) return;
  if (conv_pool_fused(i)) return;
  if (conv_dw_silu(i)) return;
  if (se_excite_fused(i)) return;
  if (deferred_silu_.erase(n.in[0])) exec_silu(val(n.in[0]), n.in[0]);  // (not reached: defer_silu checked the plan)
  Dims x = dims_of(n.in[0]);
  const ConstT* W = cst(n.in_at(1));
  const ConstT* B = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (!W || W->dtype != KEEL_DTYPE_F32 || (!n.in_at(2).empty() && !B)) throw Reject{"non-constant weights"};
  // 2-D and 3-D (1-D ones arrive lifted to 2-D: lift_1d).
  if ((x.size() != 4 && x.size() != 5) || W->dims.size() != x.size()) throw Reject{"2-D and 3-D convolutions only"};
  const size_t sp = x.size() - 2;
  const int64_t N = x[0], C = x[1], M = W->dims[0];
  int64_t g = n.ai("group", 1);
  if (g <= 0 || C != W->dims[1] * g || M % g != 0) throw Reject{"channels do not match weights and group"};
  Dims ks(W->dims.begin() + 2, W->dims.end());
  if (n.ais("kernel_shape", ks) != ks) throw Reject{"kernel_shape differs from the weights"};
  Dims s = n.ais("strides", Dims(sp, 1)), d = n.ais("dilations", Dims(sp, 1)), pads = n.ais("pads", Dims(2 * sp, 0));
  if (s.size() != sp || d.size() != sp || pads.size() != 2 * sp) throw Reject{"attribute ranks"};
  std::string ap = n.as("auto_pad", "NOTSET");
  const sdk::AutoPad apk = sdk::auto_pad_of(ap);
  Dims pl(pads.begin(), pads.begin() + sp), pr(pads.begin() + sp, pads.end());
  if (sdk::is_same(apk)) {
    for (size_t k = 0; k < sp; ++k) sdk::same_pads(apk, x[2 + k], sdk::dilated_extent(ks[k], d[k]), s[k], &pl[k], &pr[k]);
  } else if (apk == sdk::AutoPad::kValid) {
    pl = pr = Dims(sp, 0);
  } else if (apk == sdk::AutoPad::kUnknown) {
    throw Reject{"auto_pad " + ap};
  }
  Dims y{N, M};
  y.resize(x.size(), 0);
  for (size_t k = 0; k < sp; ++k) {
    if (s[k] <= 0 || d[k] <= 0 || pl[k] < 0 || pr[k] < 0) throw Reject{"bad geometry"};
    y[2 + k] = sdk::window_output(x[2 + k], pl[k] + pr[k], sdk::dilated_extent(ks[k], d[k]), s[k]);
    if (y[2 + k] < 0) throw Reject{"kernel larger than the padded input"};
  }
  // A Pad folded into this convolution (pad): read its input, with the Pad's pads added to the convolution's.
  std::string src_name = n.in[0], chan_scale;
  if (auto pf = pad_folds_.find(n.in[0]); pf != pad_folds_.end()) {
    src_name = pf->second.in;
    x = dims_of(src_name);
    for (size_t k = 0; k < sp; ++k) pl[k] += pf->second.begin[k], pr[k] += pf->second.end[k];
  }
  Fusion f = fuse_after(n.out[0], i, true, M);
  f.silu_pass = take_silu(f);
  // Weights and bias with folds applied.
  std::vector<float> w(W->f32(), W->f32() + W->count());
  std::vector<float> bias(M, 0.f);
  bool has_bias = B != nullptr || !f.conv_bias_add.empty() || !f.bn_shift.empty();
  if (B) {
    if (B->count() != M) throw Reject{"bias size"};
    for (int64_t k = 0; k < M; ++k) bias[k] = static_cast<float>(B->at(k));
  }
  if (!f.bn_scale.empty()) {
    const int64_t per = W->count() / M;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < per; ++k) w[m * per + k] *= f.bn_scale[m];
      bias[m] = bias[m] * f.bn_scale[m] + f.bn_shift[m];
    }
  }
  for (size_t k = 0; k < f.conv_bias_add.size(); ++k) bias[k] += f.conv_bias_add[k];

  // A squeeze-excite Mul folded into this convolution (fold_channel_scale): read its data operand, scale weights.
  if (auto fd = se_folds_.find(n.in[0]); fd != se_folds_.end()) std::tie(src_name, chan_scale) = fd->second;
  const double conv_flops = 2.0 * numel(y) * (C / g) * prod(ks);
  // Groups of 4 channels run as the chain's own step where it takes them (conv_grouped4: f32, 3x3, stride 1 or 2,
  // pads 1, at most a Relu after). Otherwise groups of 4 or 8 channels (ResNeXt's 32 groups, RegNet's 8-channel
  // ones) run merged into groups of 16 in and 16
  // out, the weights block-diagonal within each merged group (zeros across the original groups): 2-4x the
  // multiply-adds, but oneDNN's jit kernel over nChw16c, with no reorders to its blocked-by-4/8 layout and back.
  // Measured alone at 1 thread (fastest of 60, with those reorders): 128 channels in 32 groups at 56x56 0.57 ms
  // instead of 0.94 ms; 256 at 56x56 stride 2 0.30 ms instead of 0.41 ms; 256 at 28x28 0.29 ms instead of 0.32 ms.
  const int64_t cg = C / g;
  if (g > 1 && cg == 4 && M == C && sp == 2 && ks == Dims{3, 3} && s[0] == s[1] && (s[0] == 1 || s[0] == 2) &&
      d == Dims{1, 1} && pl == Dims{1, 1} && pr == Dims{1, 1} && f.sum_with.empty() && chan_scale.empty() &&
      !f.silu_pass && act_ == dt::f32 && has_avx512f() && conv_grouped4(i, f, src_name, x, y, s[0], w, bias, conv_flops))
    return;
  if (g > 1 && M == C && cg >= 4 && cg < 16 && 16 % cg == 0 && g % (16 / cg) == 0 && chan_scale.empty()) {
    const int64_t k = 16 / cg, g2 = g / k, kk = prod(ks);
    std::vector<float> w2(static_cast<size_t>(M * 16 * kk), 0.f);
    for (int64_t m = 0; m < M; ++m) {    // output channel m of group m / cg
      const int64_t j = (m / cg) % k;    // its place in the merged group
      for (int64_t c = 0; c < cg; ++c)
        std::copy_n(&w[(m * cg + c) * kk], kk, &w2[(m * 16 + j * cg + c) * kk]);
    }
    w = std::move(w2);
    g = g2;
  }
  Dims wd = g > 1 ? Dims{g, M / g, C / g} : Dims{M, C};
  wd.insert(wd.end(), ks.begin(), ks.end());
  md_t wany(to_dnnl(wd), act_, tag::any), bmd({M}, dt::f32, tag::a), none;
  const Val& xv = val(src_name);
  // Source: the producer's layout when blocked and of this node's type; the plain layout only for few channels (the
  // first layer). An nhwc source (from a brgemm convolution, below) is not kept: this convolution takes its own choice.
  // Nor is one blocked by other than 16 channels (a grouped convolution's own choice, below): kept, it sends a 1x1
  // convolution to oneDNN's gemm kernel (ResNeXt's conv3 after nChw4c: 11 ms instead of 0.9 ms).
  const auto& blk = xv.md.data.format_desc.blocking;
  const bool odd_block = xv.md.data.format_kind == dnnl_blocked && blk.inner_nblks > 0 && blk.inner_blks[0] != 16;
  bool keep_src = ((!is_plain_dense(xv.md) && xv.md != md_t(to_dnnl(x), act_, channels_last_tag(x.size()))) || C < 8) &&
                  !odd_block && xv.md.data_type() == act_;
  md_t src = keep_src ? xv.md : md_t(to_dnnl(x), act_, tag::any);
  md_t dst = M % 16 == 0 ? md_t(to_dnnl(y), act_, blocked16_tag(y.size())) : md_t(to_dnnl(y), act_, tag::any);
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(f.po);
  bool wino = g_options.winograd && sp == 2 && ks[0] == 3 && ks[1] == 3 && g == 1 && s[0] == 1 && s[1] == 1 &&
              d[0] == 1 && d[1] == 1 && C >= 16 && M >= 16;
  std::unique_ptr<dnnl::convolution_forward::primitive_desc> pd;
  auto make = [&](alg a, const md_t& sm, const md_t& dm) {
    try {
      dnnl::convolution_forward::desc cd(dnnl::prop_kind::forward_inference, a, sm, wany, has_bias ? bmd : none, dm,
                                         to_dnnl(s), dnnl_dilations(d), to_dnnl(pl), to_dnnl(pr));
      pd = std::make_unique<dnnl::convolution_forward::primitive_desc>(cd, attr, engine());
    } catch (const dnnl::error&) {
      pd.reset();
    }
  };
  md_t src_any(to_dnnl(x), act_, tag::any), dst_any(to_dnnl(y), act_, tag::any);
  auto is_ref = [&] { return pd && std::string(pd->impl_info_str()).rfind("ref", 0) == 0; };
  if (sp == 2 && g == 1 && N == 1 && ks == Dims{1, 1} && x[2] == 1 && x[3] == 1 && y[2] == 1 && y[3] == 1 &&
      f.sum_with.empty() && chan_scale.empty() && act_ == dt::f32 && conv_as_gemv(i, f, w, has_bias, bias))
    return;
  if (sp == 2 && g == 1 && ks[0] == 1 && ks[1] == 1 && s[0] == 1 && s[1] == 1 && pl == Dims{0, 0} && pr == Dims{0, 0} &&
      M % 16 == 0 && f.sum_with.empty() && act_ == dt::f32 && chan_scale.empty() &&
      conv_dw_fused(i, f, src, wany, bmd, w, bias, conv_flops))
    return;
  if (g_options.winograd && sp == 2 && g == 1 && ks == Dims{3, 3} && s == Dims{1, 1} && d[0] == d[1] && d[0] > 1 &&
      pl == Dims{d[0], d[0]} && pr == pl && x[2] % d[0] == 0 && x[3] % d[0] == 0 && x[2] / d[0] >= 4 &&
      x[3] / d[0] >= 4 && C % 16 == 0 && M % 16 == 0 && C * M <= 256 * 256 && act_ == dt::f32 &&
      chan_scale.empty() && f.sum_with.empty() &&
      conv_dilated_phases(i, f, src_name, x, y, d[0], wany, bmd, attr,
                          md_t(to_dnnl(wd), dt::f32, weights_tag(sp, false, false)), w, has_bias, bias, conv_flops))
    return;
  if (wino) make(alg::convolution_winograd, src, dst);
  // oneDNN's Winograd kernels (F(2,3), F(4,3): another must win by a third) and, at 2+ threads over at most 14x14
  // pixels, its direct one over the same layouts (by 5%), timed here: the fastest runs (common/conv_pick.h).
  if (wino && pd && !is_ref()) {
    auto cands = conv_impls_like(*pd, engine());
    std::vector<double> margins(cands.size(), 1.0 / 3);
    if (p_->threads > 1 && y[2] * y[3] <= 196 && keep_src && M % 16 == 0) {
      auto wpd = std::move(pd);
      make(alg::convolution_direct, src, dst);
      if (pd && !is_ref() && pd->src_desc() == wpd->src_desc() && pd->dst_desc() == wpd->dst_desc())
        cands.push_back(*pd), margins.push_back(0.05);
      pd = std::move(wpd);
    }
    size_t pick = 0;
    if (time_convs_) pick = fastest_conv_remembered(cands, engine(), stream(), margins);
    else if (cands.size() > 1) p_->deferred.push_back({cands, margins});
    pd = std::make_unique<dnnl::convolution_forward::primitive_desc>(cands[pick]);
  }
  // Other spatial convolutions (strided 3x3s, dilated ones, 3x3s Winograd leaves): oneDNN's brgemm kernel over nhwc
  // beats its nChw16c jit one here, the reorders in and out included. Measured in ResNet-50 at 1 thread (fastest
  // run of each step over 4 interleaved rounds, KEEL_ONEDNN_PROFILE): the 3x3 stride-2 convolutions at 56/28/14 px
  // went from 1.27/1.41/1.77 ms to 1.15/1.19/1.60 ms with their reorders; on its own at 2 threads brgemm is level or
  // ahead. Only when oneDNN picks brgemm for it (nhwc with a jit kernel is no better than nChw16c).
  if (!pd && g == 1 && prod(ks) > 1 && C >= 32 && M >= 32 && C % 16 == 0 && M % 16 == 0) {
    make(alg::convolution_direct, md_t(to_dnnl(x), act_, channels_last_tag(x.size())),
         md_t(to_dnnl(y), act_, channels_last_tag(y.size())));
    if (pd && std::string(pd->impl_info_str()).rfind("brg", 0) != 0) pd.reset();
  }
  if (!pd) make(alg::convolution_direct, src, dst);
  if (!pd) make(alg::convolution_direct, src_any, dst_any);
  // oneDNN's reference convolution is orders of magnitude slower than its jit ones (measured: a pruned SqueezeNet's
  // 3x3 expand with 8 input channels read as padded nChw16c took ref:any, ~1.2 s of a 2.4 ms model). The jit kernels
  // take fewer than 16 input channels only from plain memory (their first-layer path): try that, then oneDNN's own
  // choice of layouts, before settling for the reference.
  if (is_ref()) {
    auto ref_pd = std::move(pd);
    md_t src_plain(to_dnnl(x), act_, plain_tag(x.size()));
    // A depthwise convolution: oneDNN's jit kernels want source and destination alike, nChw16c (jit_dw, a partial
    // last block padded: MobileNet-V3's 72 or 200 channels) or nhwc (brdgmm_dw: kept when the source is nhwc, as in
    // ConvNeXt's blocks); a blocked source with an `any` destination, or any source with an nChw16c one, gets
    // ref:any, and plain memory only the gemm kernel (measured at 56x56: 72 channels 0.04 ms vs 0.7 ms, ConvNeXt's
    // 7x7 over 96 channels 0.17 ms vs 5.1 ms).
    if (g == C && g == M) {
      const bool nhwc = xv.md == md_t(to_dnnl(x), act_, channels_last_tag(x.size()));
      const tag t = nhwc ? channels_last_tag(x.size()) : blocked16_tag(x.size());
      make(alg::convolution_direct, md_t(to_dnnl(x), act_, t), md_t(to_dnnl(y), act_, t));
    }
    // A grouped convolution whose groups are not whole 16-channel blocks (ResNeXt's 4 and 8 channels per group,
    // RegNet's 8): oneDNN's jit kernel takes it in a layout of its own choice (blocked by 4 or 8), behind a reorder,
    // where plain memory would get its gemm kernel (measured 128 channels in 32 groups at 56x56: 0.56 ms vs 1.39 ms).
    if ((is_ref() || !pd) && g > 1 && g < C && (C / g) % 16 != 0) make(alg::convolution_direct, src_any, dst_any);
    if (is_ref() || !pd) make(alg::convolution_direct, src_plain, dst);
    if (is_ref() || !pd) make(alg::convolution_direct, src_plain, dst_any);
    if (is_ref() || !pd) make(alg::convolution_direct, src_any, dst_any);
    if (is_ref() || !pd) pd = std::move(ref_pd);
  }
  if (!pd) throw Reject{"oneDNN has no convolution for this case"};
  md_t wplain(to_dnnl(wd), dt::f32, weights_tag(sp, g > 1, false));
  conv_like_tail(i, f, dnnl::convolution_forward(*pd), pd->src_desc(), pd->weights_desc(), pd->dst_desc(), wplain,
                 w, has_bias, bias, conv_flops, {}, src_name, chan_scale);
}

// Node u as the chain's own depthwise convolution + SiLU step (steps/dwsilu.h): a Conv with constant f32 weights
// [C,1,k,k], group C, k 3 or 5, equal strides 1 or 2, the same padding on every side, no dilation, its output through
// the SiLU pass (take_silu) and nothing else after the constant bias, BatchNormalization or Add folds; with AVX-512,
// f32, and the silu_pass and dw_silu options on. True with its geometry and fusion; false otherwise. Changes
// nothing.
bool Builder::dw_silu_plan(size_t u, DwSiluShape* s, Fusion* f) {
  if (!g_options.dw_silu || !g_options.silu_pass || !has_avx512f() || act_ != dt::f32) return false;
  const NodeDesc& n = r_.nodes[u];
  if (n.op != "Conv" || done_[u] || n.out.size() != 1 || n.in.size() < 2) return false;
  if (pad_folds_.count(n.in[0]) || se_folds_.count(n.in[0])) return false;
  const ConstT* W = cst(n.in_at(1));
  const ConstT* B = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (!W || W->dtype != KEEL_DTYPE_F32 || W->dims.size() != 4 || (!n.in_at(2).empty() && !B)) return false;
  const Dims x = dims_of(n.in[0]);
  if (x.size() != 4) return false;
  s->n = x[0], s->c = x[1], s->h = x[2], s->w = x[3], s->k = W->dims[2];
  if (W->dims != Dims{s->c, 1, s->k, s->k} || n.ai("group", 1) != s->c || (B && B->count() != s->c)) return false;
  if (n.ais("kernel_shape", {s->k, s->k}) != Dims{s->k, s->k} || n.ais("dilations", {1, 1}) != Dims{1, 1})
    return false;
  const Dims st = n.ais("strides", {1, 1}), pads = n.ais("pads", {0, 0, 0, 0});
  const std::string ap = n.as("auto_pad", "NOTSET");
  if (st.size() != 2 || st[0] != st[1] || st[0] < 1 || pads.size() != 4 || (ap != "NOTSET" && !ap.empty()))
    return false;
  if (pads[1] != pads[0] || pads[2] != pads[0] || pads[3] != pads[0]) return false;
  s->s = st[0], s->p = pads[0];
  if (s->h + 2 * s->p < s->k || s->w + 2 * s->p < s->k) return false;
  s->oh = (s->h + 2 * s->p - s->k) / s->s + 1;
  s->ow = (s->w + 2 * s->p - s->k) / s->s + 1;
  if (!dw_silu_check(*s).empty()) return false;
  if (auto known = r_.dims.find(n.out[0]); known != r_.dims.end() && known->second != Dims{s->n, s->c, s->oh, s->ow})
    return false;
  *f = fuse_after(n.out[0], u, true, s->c);
  return take_silu(*f) && f->po.len() == 0 && f->sum_with.empty();
}

// Called where a convolution's trailing SiLU pass would run over value v (memory md): when v's only reader is a
// depthwise convolution the chain's own step takes (dw_silu_plan) over nChw16c memory, that step applies the SiLU
// to its source rows as it reads them instead (the pass's read and write of v saved: 4.8 MB at EfficientNet-B0's
// 112-px expansion). True when deferred (v in deferred_silu_); false, changing nothing, otherwise.
bool Builder::defer_silu(const std::string& v, const md_t& md) {
  if (escapes(v) || users(v).size() != 1) return false;
  const size_t u = users(v)[0];
  DwSiluShape s;
  Fusion f;
  if (!dw_silu_plan(u, &s, &f) || r_.nodes[u].in[0] != v) return false;
  if (md != md_t(to_dnnl(Dims{s.n, s.c, s.h, s.w}), dt::f32, tag::nChw16c)) return false;
  deferred_silu_.insert(v);
  return true;
}

// Builds node i as the depthwise convolution + SiLU step when dw_silu_plan takes it and its source is nChw16c:
// the SiLU of the source too when deferred to it (defer_silu), and a GlobalAveragePool reading the output (squeeze-
// excite) computed on the way. Measured in EfficientNet-B0 at 1 thread: PERFORMANCE.md, "(sq2)". True when built;
// false, changing nothing, otherwise.
bool Builder::conv_dw_silu(size_t i) {
  DwSiluShape s;
  Fusion f;
  if (!dw_silu_plan(i, &s, &f)) return false;
  const NodeDesc& n = r_.nodes[i];
  const Dims x{s.n, s.c, s.h, s.w}, y{s.n, s.c, s.oh, s.ow};
  auto xv = vals_.find(n.in[0]);
  if (xv == vals_.end() || xv->second.scale != 1.f || xv->second.md != md_t(to_dnnl(x), dt::f32, tag::nChw16c))
    return false;
  s.in_silu = deferred_silu_.erase(n.in[0]) > 0;
  const ConstT* W = cst(n.in_at(1));
  const ConstT* B = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  const int64_t kk = s.k * s.k;
  std::vector<float> w(W->f32(), W->f32() + W->count()), bias(static_cast<size_t>(s.c), 0.f);
  for (int64_t c = 0; c < s.c; ++c) {
    if (B) bias[c] = static_cast<float>(B->at(c));
    if (!f.bn_scale.empty()) {
      for (int64_t t = 0; t < kk; ++t) w[c * kk + t] *= f.bn_scale[c];
      bias[c] = bias[c] * f.bn_scale[c] + f.bn_shift[c];
    }
    if (!f.conv_bias_add.empty()) bias[c] += f.conv_bias_add[c];
  }
  Exec e;
  p_->owned.emplace_back(md_t({s.c * kk}, dt::f32, tag::a), engine(), p_->weights.alloc(w.size() * sizeof(float)));
  dw_silu_pack_weights(s, w.data(), static_cast<float*>(p_->owned.back().get_data_handle()));
  e.args[DNNL_ARG_WEIGHTS] = p_->owned.back();
  p_->owned.emplace_back(md_t({s.c}, dt::f32, tag::a), engine());
  std::memcpy(p_->owned.back().get_data_handle(), bias.data(), bias.size() * sizeof(float));
  e.args[DNNL_ARG_BIAS] = p_->owned.back();
  const int64_t scratch = static_cast<int64_t>(dw_silu_scratch_floats(s)) * std::max(1, p_->threads);
  e.args[DNNL_ARG_SCRATCHPAD] = mem_at(md_t({scratch}, dt::f32, tag::a), new_buf(scratch * sizeof(float)), 0);
  e.args[DNNL_ARG_SRC] = mem_of(xv->second);
  Val& o = define(f.out, md_t(to_dnnl(y), dt::f32, tag::nChw16c));
  e.args[DNNL_ARG_DST] = mem_of(o);
  std::string what = " + SiLU ";
  for (size_t u : users(f.out)) {
    const NodeDesc& pn = r_.nodes[u];
    if (done_[u] || pn.op != "GlobalAveragePool" || pn.in.size() != 1 || pn.in[0] != f.out || pn.out.size() != 1)
      continue;
    e.args[kArgPooled] = mem_of(define(pn.out[0], md_t({s.n, s.c, 1, 1}, dt::f32, tag::nChw16c)));
    done_[u] = true;
    what = " + SiLU + GlobalAveragePool ";
    break;
  }
  e.own = run_dw_silu;
  e.own_kind = "convolution";
  e.params = std::make_shared<const DwSiluShape>(s);
  p_->flops += 2.0 * static_cast<double>(numel(y) * kk);
  exec_own(std::move(e), "keel:dw_silu_avx512", false,
           (s.in_silu ? "SiLU + " : "") + n.name + what + dims_str(x) + " -> " + dims_str(y));
  for (size_t k : f.nodes) done_[k] = true;
  return true;
}

// Squeeze-excite's excitation from node i on, s = Sigmoid(Conv1x1_2(act(Conv1x1_1(p)))) over a pooled [1,C,1,1]
// value p (act SiLU or Relu, each convolution with constant f32 weights and an optional bias, group 1, no strides,
// pads or dilations; nothing else fused), as one single-thread step of the chain's own (steps/se.h) writing s as
// plain [1,C2,1,1]. EfficientNet-B0's 16 excitations were 64 steps (fc1, SiLU pass, fc2 + logistic): PERFORMANCE.md,
// "(sq2)". With AVX-512, f32, the se_step option on; true when built, false (changing nothing) otherwise.
bool Builder::se_excite_fused(size_t i) {
  if (!g_options.se_step || !has_avx512f() || act_ != dt::f32) return false;
  auto unit_conv = [&](const NodeDesc& c, const ConstT** W, const ConstT** B) {
    if (c.op != "Conv" || c.out.size() != 1 || c.in.size() < 2 || done_[&c - r_.nodes.data()]) return false;
    *W = cst(c.in_at(1));
    *B = c.in_at(2).empty() ? nullptr : cst(c.in_at(2));
    if (!*W || (*W)->dtype != KEEL_DTYPE_F32 || (*W)->dims.size() != 4 || (*W)->dims[2] != 1 || (*W)->dims[3] != 1 ||
        (!c.in_at(2).empty() && !*B))
      return false;
    const std::string ap = c.as("auto_pad", "NOTSET");
    return c.ai("group", 1) == 1 && c.ais("strides", {1, 1}) == Dims{1, 1} && c.ais("pads", {0, 0, 0, 0}) == Dims{0, 0, 0, 0} &&
           c.ais("dilations", {1, 1}) == Dims{1, 1} && (ap == "NOTSET" || ap.empty() || ap == "VALID");
  };
  auto sole_eltwise = [](const Fusion& f, alg* a, float* alpha) {
    if (f.po.len() != 1 || f.po.kind(0) != dnnl::primitive::kind::eltwise || !f.sum_with.empty() ||
        !f.bn_scale.empty() || !f.conv_bias_add.empty())
      return false;
    float scale, beta;
    f.po.get_params_eltwise(0, scale, *a, *alpha, beta);
    return scale == 1.f;
  };
  const NodeDesc& n = r_.nodes[i];
  const ConstT *W1, *B1, *W2, *B2;
  if (!unit_conv(n, &W1, &B1)) return false;
  const Dims x = dims_of(n.in[0]);
  if (x.size() != 4 || x[0] != 1 || x[2] != 1 || x[3] != 1) return false;
  SeShape s;
  s.c = x[1], s.cs = W1->dims[0];
  if (W1->dims[1] != s.c || (B1 && B1->count() != s.cs)) return false;
  const Fusion f1 = fuse_after(n.out[0], i, true, s.cs);
  alg a;
  float alpha;
  if (!sole_eltwise(f1, &a, &alpha)) return false;
  if (a == alg::eltwise_swish && alpha == 1.f) s.silu = true;
  else if (a == alg::eltwise_relu && alpha == 0.f) s.silu = false;
  else return false;
  const size_t u = sole_user(f1.out);
  if (u == npos || !unit_conv(r_.nodes[u], &W2, &B2) || r_.nodes[u].in[0] != f1.out) return false;
  s.c2 = W2->dims[0];
  if (W2->dims[1] != s.cs || (B2 && B2->count() != s.c2)) return false;
  const Fusion f2 = fuse_after(r_.nodes[u].out[0], u, true, s.c2);
  if (!sole_eltwise(f2, &a, &alpha) || a != alg::eltwise_logistic) return false;
  // The source as C consecutive floats: plain, or nChw16c (one pixel: channel c at c, the padding after).
  auto xv = vals_.find(n.in[0]);
  if (xv == vals_.end() || xv->second.scale != 1.f || xv->second.md.data_type() != dt::f32 ||
      (!is_plain_dense(xv->second.md) && xv->second.md != md_t({1, s.c, 1, 1}, dt::f32, tag::nChw16c)))
    return false;
  const Dims y{1, s.c2, 1, 1};
  if (auto known = r_.dims.find(f2.out); known != r_.dims.end() && known->second != y) return false;
  auto floats = [](const ConstT* c) {
    std::vector<float> v;
    if (c)
      for (int64_t k = 0; k < c->count(); ++k) v.push_back(static_cast<float>(c->at(k)));
    return v;
  };
  const std::vector<float> b1 = floats(B1), b2 = floats(B2);
  Exec e;
  p_->owned.emplace_back(md_t({static_cast<int64_t>(se_packed_floats(s))}, dt::f32, tag::a), engine(),
                         p_->weights.alloc(se_packed_floats(s) * sizeof(float)));
  se_pack(s, W1->f32(), B1 ? b1.data() : nullptr, W2->f32(), B2 ? b2.data() : nullptr,
          static_cast<float*>(p_->owned.back().get_data_handle()));
  e.args[DNNL_ARG_WEIGHTS] = p_->owned.back();
  e.args[DNNL_ARG_SRC] = mem_of(xv->second);
  e.args[DNNL_ARG_DST] = mem_of(define(f2.out, md_t(to_dnnl(y), dt::f32, tag::nchw)));
  e.single = true;
  e.own = run_se;
  e.own_kind = "convolution";
  e.params = std::make_shared<const SeShape>(s);
  p_->flops += 2.0 * static_cast<double>(s.c * s.cs + s.cs * s.c2);
  exec_own(std::move(e), "keel:se_excite_avx512", false,
           n.name + " + " + r_.nodes[u].name + " (squeeze-excite) " + dims_str(x) + " -> " + dims_str(y));
  for (size_t k : f1.nodes) done_[k] = true;
  done_[u] = true;
  for (size_t k : f2.nodes) done_[k] = true;
  return true;
}

// A convolution over at most 4 channels read plain (a network's first layer, on the image), followed by a Relu
// (or not) and a MaxPool that alone read it, as one step of the chain's own (steps/convpool.h): each thread
// computes the convolution rows its pooled rows need into a ring in its cache and pools them there, so the
// convolution's output never goes to memory. SqueezeNet 1.1's stem (3->64, 3x3 s2 at 224x224, MaxPool 3x3 s2 ceil)
// at 2 threads: 0.17 ms against oneDNN's 0.21-0.27 ms convolution plus 0.09-0.11 ms pooling (PERFORMANCE.md,
// "(sqz)"). f32, group 1, no dilation, output channels a multiple of 16, 2-D pooling without dilation or indices;
// false, changing nothing, otherwise (or without AVX-512).
bool Builder::conv_pool_fused(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (!has_avx512f() || act_ != dt::f32 || n.out.size() != 1 || n.in.size() < 2) return false;
  if (pad_folds_.count(n.in[0]) || se_folds_.count(n.in[0])) return false;
  const ConstT* W = cst(n.in_at(1));
  const ConstT* B = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (!W || W->dtype != KEEL_DTYPE_F32 || W->dims.size() != 4 || (!n.in_at(2).empty() && !B)) return false;
  auto xv = vals_.find(n.in[0]);
  if (xv == vals_.end() || xv->second.scale != 1.f || xv->second.md.data_type() != dt::f32 ||
      !is_plain_dense(xv->second.md) || xv->second.md.data.ndims != 4)
    return false;
  const Dims x = md_dims(xv->second.md);
  ConvPoolShape s;
  s.n = x[0], s.c = x[1], s.h = x[2], s.w = x[3], s.m = W->dims[0];
  s.kh = W->dims[2], s.kw = W->dims[3];
  if (s.c > 4 || W->dims[1] != s.c || s.m % 16 != 0 || n.ai("group", 1) != 1 || (B && B->count() != s.m)) return false;
  if (n.ais("kernel_shape", {s.kh, s.kw}) != Dims{s.kh, s.kw} || n.ais("dilations", {1, 1}) != Dims{1, 1})
    return false;
  const Dims st = n.ais("strides", {1, 1}), pads = n.ais("pads", {0, 0, 0, 0});
  const std::string ap = n.as("auto_pad", "NOTSET");
  if (st.size() != 2 || pads.size() != 4 || (ap != "NOTSET" && !ap.empty())) return false;
  s.sh = st[0], s.sw = st[1], s.pt = pads[0], s.pl = pads[1];
  if (s.sh < 1 || s.sw < 1) return false;
  s.oh = (s.h + pads[0] + pads[2] - s.kh) / s.sh + 1;
  s.ow = (s.w + pads[1] + pads[3] - s.kw) / s.sw + 1;
  if (s.h + pads[0] + pads[2] < s.kh || s.w + pads[1] + pads[3] < s.kw) return false;
  // Relu, then the MaxPool.
  std::vector<size_t> fused;
  std::string cur = n.out[0];
  size_t u = sole_user(cur);
  if (u != npos && r_.nodes[u].op == "Relu" && r_.nodes[u].out.size() == 1) {
    s.relu = true;
    fused.push_back(u);
    cur = r_.nodes[u].out[0];
    u = sole_user(cur);
  }
  if (u == npos || r_.nodes[u].op != "MaxPool" || r_.nodes[u].in[0] != cur) return false;
  const NodeDesc& pn = r_.nodes[u];
  if (pn.out.empty() || (pn.out.size() > 1 && !pn.out[1].empty()) || pn.ai("storage_order", 0) != 0) return false;
  const Dims pk = pn.ais("kernel_shape", {}), ps = pn.ais("strides", {1, 1}), pp = pn.ais("pads", {0, 0, 0, 0});
  const std::string pap = pn.as("auto_pad", "NOTSET");
  if (pk.size() != 2 || ps.size() != 2 || pp.size() != 4 || pn.ais("dilations", {1, 1}) != Dims{1, 1}) return false;
  if (pap != "NOTSET" && !pap.empty() && pap != "VALID") return false;
  const bool valid = pap == "VALID", ceil = pn.ai("ceil_mode", 0) != 0;
  s.pkh = pk[0], s.pkw = pk[1], s.psh = ps[0], s.psw = ps[1];
  s.ppt = valid ? 0 : pp[0], s.ppl = valid ? 0 : pp[1];
  if (s.psh < 1 || s.psw < 1) return false;
  auto pooled = [&](int64_t in, int64_t k, int64_t str, int64_t before, int64_t after) -> int64_t {
    const int64_t span = in + before + after - k;  // as pool()
    return span < 0 ? 0 : 1 + (ceil ? (span + str - 1) / str : span / str);
  };
  s.ph = pooled(s.oh, s.pkh, s.psh, s.ppt, valid ? 0 : pp[2]);
  s.pw = pooled(s.ow, s.pkw, s.psw, s.ppl, valid ? 0 : pp[3]);
  if (!conv_pool_check(s).empty()) return false;
  // Only where the convolution's output per image is past the L2 cache (SqueezeNet's 3.1 MB, ResNet's and
  // GoogLeNet's 7x7 stems' 3.2 MB): simple_cnn_b32's 3x3 over 32x32 images (115 KB each, batch 32) was 10% slower
  // fused. The 7x7 stems gain since the step pads its source rows instead of taking a per-pixel path at the
  // edges (ResNet-50, 1 thread: 1.19 against 1.31 + 0.15 ms; PERFORMANCE.md "(r50f)").
  if (s.m * s.oh * s.ow * static_cast<int64_t>(sizeof(float)) < (1 << 20)) return false;
  const Dims y{s.n, s.m, s.ph, s.pw};
  if (auto known = r_.dims.find(pn.out[0]); known != r_.dims.end() && known->second != y) return false;
  fused.push_back(u);

  Exec e;
  p_->owned.emplace_back(md_t({static_cast<int64_t>(conv_pool_packed_floats(s))}, dt::f32, tag::a), engine(),
                         p_->weights.alloc(conv_pool_packed_floats(s) * sizeof(float)));
  conv_pool_pack_weights(s, W->f32(), static_cast<float*>(p_->owned.back().get_data_handle()));
  e.args[DNNL_ARG_WEIGHTS] = p_->owned.back();
  p_->owned.emplace_back(md_t({s.m}, dt::f32, tag::a), engine());
  float* bias = static_cast<float*>(p_->owned.back().get_data_handle());
  for (int64_t k = 0; k < s.m; ++k) bias[k] = B ? static_cast<float>(B->at(k)) : 0.f;
  e.args[DNNL_ARG_BIAS] = p_->owned.back();
  const int64_t scratch = static_cast<int64_t>(conv_pool_scratch_floats(s)) * std::max(1, p_->threads);
  e.args[DNNL_ARG_SCRATCHPAD] = mem_at(md_t({scratch}, dt::f32, tag::a), new_buf(scratch * sizeof(float)), 0);
  e.args[DNNL_ARG_SRC] = mem_of(xv->second);
  Val& o = define(pn.out[0], md_t(to_dnnl(y), dt::f32, tag::nChw16c));
  e.args[DNNL_ARG_DST] = mem_of(o);
  e.own = run_conv_pool;
  e.own_kind = "convolution";
  e.params = std::make_shared<const ConvPoolShape>(s);
  p_->flops += 2.0 * static_cast<double>(s.n * s.m * s.oh * s.ow * s.c * s.kh * s.kw);
  exec_own(std::move(e), "keel:conv_pool_avx512", false,
           n.name + (s.relu ? " + Relu" : "") + " + MaxPool " + dims_str(x) + " -> " + dims_str(y));
  for (size_t k : fused) done_[k] = true;
  return true;
}

// A 3x3 convolution in groups of 4 channels (ResNeXt-50 32x4d's layer1) over an nChw16c source, with at most a Relu
// after it, as the chain's own step (steps/grouped.h): a quarter of the multiply-adds of the merged 16-channel
// groups below. `w` [M][4][3][3] and `bias` with folds applied. False, changing nothing, for anything else.
bool Builder::conv_grouped4(size_t i, const Fusion& f, const std::string& src, const Dims& x, const Dims& y,
                            int64_t stride, const std::vector<float>& w, const std::vector<float>& bias,
                            double flops) {
  bool relu = false;
  if (f.po.len() > 1) return false;
  if (f.po.len() == 1) {
    float scale = 0.f, alpha = 0.f, beta = 0.f;
    alg a = alg::undef;
    if (f.po.kind(0) != dnnl::primitive::kind::eltwise) return false;
    f.po.get_params_eltwise(0, scale, a, alpha, beta);
    if (a != alg::eltwise_relu || alpha != 0.f || scale != 1.f) return false;
    relu = true;
  }
  if (x.size() != 4 || x[1] % 16 != 0) return false;
  const Val& xv = val(src);
  if (xv.scale != 1.f || xv.md != md_t(to_dnnl(x), dt::f32, tag::nChw16c)) return false;
  Grouped4Shape s;
  s.n = x[0], s.blocks = x[1] / 16, s.h = x[2], s.w = x[3], s.stride = stride, s.relu = relu;
  if (!grouped4_check(s).empty() || y != Dims{s.n, x[1], s.oh(), s.ow()}) return false;
  if (w.size() != static_cast<size_t>(x[1] * 36) || bias.size() != static_cast<size_t>(x[1])) return false;
  Exec e;
  const size_t packed = grouped4_packed_floats(s);
  p_->owned.emplace_back(md_t({static_cast<int64_t>(packed)}, dt::f32, tag::a), engine(),
                         p_->weights.alloc(packed * sizeof(float)));
  grouped4_pack_weights(s, w.data(), static_cast<float*>(p_->owned.back().get_data_handle()));
  e.args[DNNL_ARG_WEIGHTS] = p_->owned.back();
  p_->owned.emplace_back(md_t({x[1]}, dt::f32, tag::a), engine());
  std::memcpy(p_->owned.back().get_data_handle(), bias.data(), bias.size() * sizeof(float));
  e.args[DNNL_ARG_BIAS] = p_->owned.back();
  e.args[DNNL_ARG_SRC] = mem_of(xv);
  Val& o = define(f.out, md_t(to_dnnl(y), dt::f32, tag::nChw16c));
  e.args[DNNL_ARG_DST] = mem_of(o);
  e.own = run_grouped4;
  e.own_kind = "convolution";
  e.params = std::make_shared<const Grouped4Shape>(s);
  p_->flops += flops;
  exec_own(std::move(e), "keel:grouped4_avx512", false,
           r_.nodes[i].name + (relu ? " + Relu " : " ") + dims_str(x) + " -> " + dims_str(y));
  for (size_t k : f.nodes) done_[k] = true;
  return true;
}

// ResNet's strided bottleneck end, y = Conv1x1(h) + Conv1x1_s2(x) (the last convolution of the block and the
// stride-2 projection shortcut, both without padding, read only by that Add), as one 1x1 convolution over the
// channels of h and of x (every other row and column) side by side, with the weights [W_h | W_x] and the biases
// summed: the shortcut's output never goes to memory and back for a sum post-op, oneDNN's strided 1x1 (which
// gathers the strided source per thread) is not used, and the reduction is longer. h is reordered into the first
// channels of an nChw16c buffer, x subsampled into the rest (one own step, steps/dilated.h). Post-ops:
// what follows the Add (Relu). Batch 1, f32, channels multiples of 16, node `i` being the first of the two
// convolutions; false, changing nothing, otherwise or when oneDNN offers no jit kernel. (With a stride-1 shortcut,
// ResNet-50's layer1.0, h and x copied into one buffer made it slower: PERFORMANCE.md.)
bool Builder::conv_residual_merged(size_t i) {
  if (act_ != dt::f32) return false;
  auto unit_conv = [&](const NodeDesc& c, int64_t* stride) {
    if (c.op != "Conv" || c.in.size() < 2 || c.out.size() != 1 || c.ai("group", 1) != 1) return false;
    const ConstT* W = cst(c.in_at(1));
    if (!W || W->dtype != KEEL_DTYPE_F32 || W->dims.size() != 4 || W->dims[2] != 1 || W->dims[3] != 1) return false;
    if (!c.in_at(2).empty() && (!cst(c.in_at(2)) || cst(c.in_at(2))->count() != W->dims[0])) return false;
    const std::string ap = c.as("auto_pad", "NOTSET");
    if ((ap != "NOTSET" && !ap.empty() && ap != "VALID") || c.ais("pads", {0, 0, 0, 0}) != Dims{0, 0, 0, 0} ||
        c.ais("dilations", {1, 1}) != Dims{1, 1})
      return false;
    Dims st = c.ais("strides", {1, 1});
    if (st.size() != 2 || st[0] != st[1] || (st[0] != 1 && st[0] != 2)) return false;
    *stride = st[0];
    const std::string& in = c.in[0];
    return vals_.count(in) > 0 && !pad_folds_.count(in) && !se_folds_.count(in) && vals_[in].scale == 1.f &&
           vals_[in].md.data_type() == dt::f32;
  };
  const NodeDesc& n = r_.nodes[i];
  int64_t si = 0, sj = 0;
  if (!unit_conv(n, &si) || si != 1) return false;
  const size_t a = sole_user(n.out[0]);
  if (a == npos) return false;
  const NodeDesc& an = r_.nodes[a];
  if (an.op != "Add" || an.in.size() != 2 || an.out.size() != 1 || an.in[0] == an.in[1]) return false;
  const std::string& other = an.in[0] == n.out[0] ? an.in[1] : an.in[0];
  size_t j = npos;
  for (size_t k = 0; k < r_.nodes.size(); ++k)
    if (!r_.nodes[k].out.empty() && r_.nodes[k].out[0] == other) j = k;
  if (j == npos || j == i || done_[j] || sole_user(other) != a) return false;
  const NodeDesc& jn = r_.nodes[j];
  if (!unit_conv(jn, &sj) || sj != 2) return false;
  const Dims h = dims_of(n.in[0]), x = dims_of(jn.in[0]), y = dims_of(an.out[0]);
  if (h.size() != 4 || x.size() != 4 || h[0] != 1 || x[0] != 1) return false;
  const ConstT *Wi = cst(n.in_at(1)), *Wj = cst(jn.in_at(1));
  const int64_t M = Wi->dims[0], Ch = h[1], Cx = x[1];
  if (Wj->dims[0] != M || Wi->dims[1] != Ch || Wj->dims[1] != Cx || Ch % 16 || Cx % 16 || M % 16) return false;
  if ((x[2] - 1) / sj + 1 != h[2] || (x[3] - 1) / sj + 1 != h[3] || y != Dims{1, M, h[2], h[3]}) return false;
  const Val xv = vals_[jn.in[0]];
  const md_t xblocked(to_dnnl(x), dt::f32, tag::nChw16c);
  if (xv.md != xblocked) return false;  // the strided view is of nChw16c memory
  Fusion f = fuse_after(an.out[0], a, true, M);
  if (f.silu_pass) return false;
  // Weights [M, Ch + Cx] and the summed bias, with the folds after the Add applied.
  const int64_t K = Ch + Cx;
  std::vector<float> w(M * K), bias(M, 0.f);
  for (int64_t m = 0; m < M; ++m) {
    std::copy(Wi->f32() + m * Ch, Wi->f32() + (m + 1) * Ch, w.begin() + m * K);
    std::copy(Wj->f32() + m * Cx, Wj->f32() + (m + 1) * Cx, w.begin() + m * K + Ch);
  }
  for (const NodeDesc* c : {&n, &jn})
    if (const ConstT* B = c->in_at(2).empty() ? nullptr : cst(c->in_at(2)))
      for (int64_t m = 0; m < M; ++m) bias[m] += static_cast<float>(B->at(m));
  if (!f.bn_scale.empty())
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) w[m * K + k] *= f.bn_scale[m];
      bias[m] = bias[m] * f.bn_scale[m] + f.bn_shift[m];
    }
  for (size_t k = 0; k < f.conv_bias_add.size(); ++k) bias[k] += f.conv_bias_add[k];
  const Dims cat{1, K, h[2], h[3]};
  const md_t cmd(to_dnnl(cat), dt::f32, tag::nChw16c), hmd(to_dnnl(h), dt::f32, tag::nChw16c),
      xsmd(to_dnnl(Dims{1, Cx, h[2], h[3]}), dt::f32, tag::nChw16c);
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(f.po);
  std::unique_ptr<dnnl::convolution_forward::primitive_desc> pd;
  try {
    dnnl::convolution_forward::desc cd(dnnl::prop_kind::forward_inference, alg::convolution_direct, cmd,
                                       md_t({M, K, 1, 1}, dt::f32, tag::any), md_t({M}, dt::f32, tag::a),
                                       md_t(to_dnnl(y), dt::f32, tag::nChw16c), {1, 1}, {0, 0}, {0, 0});
    pd = std::make_unique<dnnl::convolution_forward::primitive_desc>(cd, attr, engine());
  } catch (const dnnl::error&) {
    return false;
  }
  if (std::string(pd->impl_info_str()).rfind("jit_1x1", 0) != 0 || pd->src_desc() != cmd) return false;
  // The side-by-side source: h reordered into its first Ch channels, x (subsampled) into the next Cx.
  const std::string key = n.out[0] + "#merged_source";
  Val& cv = define(key, cmd);
  const int cbuf = cv.buf;
  const uint64_t coff = cv.off, xoff = coff + static_cast<uint64_t>(Ch) * h[2] * h[3] * sizeof(float);
  const Val hv = vals_[n.in[0]];
  const md_t hnhwc(to_dnnl(h), dt::f32, tag::nhwc);
  if (hv.md == hnhwc || hv.md == hmd) {
    // One own step (steps/dilated.h) for both: at 2 threads oneDNN's two reorders took 0.091 / 0.047 / 0.033 ms
    // in ResNet-50's layer2.0 / 3.0 / 4.0, this 0.068 / 0.031 / 0.030 (level at 1 thread): PERFORMANCE.md, (r50e).
    MergedSourceShape ms;
    ms.ch = Ch, ms.cx = Cx, ms.h = h[2], ms.w = h[3], ms.xh = x[2], ms.xw = x[3], ms.stride = sj;
    ms.h_nhwc = hv.md == hnhwc;
    Exec e;
    e.own = run_merged_source;
    e.own_kind = "reorder";
    e.args = {{DNNL_ARG_SRC, mem_of(hv)}, {DNNL_ARG_SRC_1, mem_of(xv)}, {DNNL_ARG_DST, mem_at(cmd, cbuf, coff)}};
    e.params = std::make_shared<const MergedSourceShape>(ms);
    exec_own(std::move(e), "keel:merged_source", true,
             n.name + " " + dims_str(h) + " + " + dims_str(x) + " -> " + dims_str(cat));
  } else {
    dnnl::memory s1 = mem_of(hv), d1 = mem_at(hmd, cbuf, coff);
    layout_reorder_ = true;
    exec(dnnl::reorder(s1, d1), {{DNNL_ARG_FROM, s1}, {DNNL_ARG_TO, d1}});
    dnnl_memory_desc_t vd = xblocked.data;  // every sj-th row and column: the strides times sj
    vd.dims[2] = vd.padded_dims[2] = h[2];
    vd.dims[3] = vd.padded_dims[3] = h[3];
    vd.format_desc.blocking.strides[2] *= sj;
    vd.format_desc.blocking.strides[3] *= sj;
    dnnl::memory s2 = mem_at(md_t(vd), xv.buf, xv.off), d2 = mem_at(xsmd, cbuf, xoff);
    exec(dnnl::reorder(s2, d2), {{DNNL_ARG_FROM, s2}, {DNNL_ARG_TO, d2}});
    layout_reorder_ = false;
  }
  f.nodes.insert(f.nodes.begin(), {j, a});  // before the fused nodes: an Add among those is a sum post-op's
  md_t wplain(to_dnnl(Dims{M, K, 1, 1}), dt::f32, tag::oihw);
  conv_like_tail(i, f, dnnl::convolution_forward(*pd), cmd, pd->weights_desc(), pd->dst_desc(), wplain, w, true,
                 bias, 2.0 * M * K * h[2] * h[3], {}, key, "");
  return true;
}

// A 3x3 convolution with dilation d and padding d (stride 1, group 1; DeepLab's and FCN's atrous layers) is a plain
// 3x3 convolution with padding 1 over the d*d phases of its input (every d-th row and column, from each of the d*d
// offsets), whose outputs are the phases of its output: oneDNN has no Winograd kernel for the dilated one, and runs
// the plain one over the phases as a batch of d*d images. So: the source (nChw16c) is split into its phases (an
// own step), Winograd runs over them with the node's post-ops, and the phases of the result are put back in place
// (a second own step). FCN-ResNet50's layer3 at 128x128 input (256 channels, 16x16, dilation 2), 1 thread: alone
// 0.51-0.62 ms against 1.20-1.25 ms for the dilated convolution on brgemm over nhwc; in the network, where the
// weights (4x larger in Winograd's domain: 9.4 MB) come from memory, the five steps with their layout steps 6.4
// against 6.6 ms. With 512 channels (layer4, dilation 2 and 4; 38 MB of Winograd weights) no faster, hence the
// caller's limit of C*M <= 256*256 (PERFORMANCE.md, r50c). False, changing nothing, when oneDNN offers no Winograd
// kernel for the phases in nChw16c.
bool Builder::conv_dilated_phases(size_t i, const Fusion& f, const std::string& src, const Dims& x, const Dims& y,
                                  int64_t dil, const md_t& wany, const md_t& bmd, const dnnl::primitive_attr& attr,
                                  const md_t& wplain, std::vector<float>& w, bool has_bias,
                                  const std::vector<float>& bias, double flops) {
  const int64_t ph = x[2] / dil, pw = x[3] / dil, batch = x[0] * dil * dil;
  const md_t image(to_dnnl(x), dt::f32, tag::nChw16c), out(to_dnnl(y), dt::f32, tag::nChw16c),
      pin(to_dnnl(Dims{batch, x[1], ph, pw}), dt::f32, tag::nChw16c),
      pout(to_dnnl(Dims{batch, y[1], ph, pw}), dt::f32, tag::nChw16c);
  std::unique_ptr<dnnl::convolution_forward::primitive_desc> pd;
  try {
    dnnl::convolution_forward::desc cd(dnnl::prop_kind::forward_inference, alg::convolution_winograd, pin, wany,
                                       has_bias ? bmd : md_t(), pout, {1, 1}, {0, 0}, {1, 1}, {1, 1});
    pd = std::make_unique<dnnl::convolution_forward::primitive_desc>(cd, attr, engine());
  } catch (const dnnl::error&) {
    return false;
  }
  if (std::string(pd->impl_info_str()).find("wino") == std::string::npos || pd->src_desc() != pin ||
      pd->dst_desc() != pout)
    return false;
  const std::string& name = r_.nodes[i].out[0];
  auto own = [&](void (*fn)(const Exec&), const Val& from, const Val& to, const char* impl, const char* what) {
    Exec e;
    e.single = from.md.get_size() + to.md.get_size() < (1u << 20);  // memory-bound, as Builder::exec's reorders
    e.own = fn;
    e.own_kind = "reorder";
    e.args = {{DNNL_ARG_SRC, mem_of(from)}, {DNNL_ARG_DST, mem_of(to)}};
    exec_own(std::move(e), impl, true,
             r_.nodes[i].name + what + dims_str(md_dims(from.md)) + " -> " + dims_str(md_dims(to.md)));
  };
  const Val xv = as_md(src, image);
  const Val& phases_in = define(name + "#phases", pin);
  own(run_to_phases, xv, phases_in, "keel:space_to_phases", " phases ");
  Fusion fp = f;
  fp.out = name + "#phase_out";
  conv_like_tail(i, fp, dnnl::convolution_forward(*pd), pin, pd->weights_desc(), pout, wplain, w, has_bias, bias,
                 flops, {}, name + "#phases", "");
  const Val phases_out = vals_[fp.out];
  const Val& o = define(f.out, out);
  own(run_from_phases, phases_out, o, "keel:phases_to_space", " from phases ");
  return true;
}

// A 1x1 convolution (stride 1, its post-ops in `f`) whose sole consumer is a 3x3 depthwise convolution (stride 1
// or 2, pad 1): one oneDNN primitive with the depthwise one as a post-op, so the expanded tensor (MobileNet's and
// EfficientNet's widest) never goes out to memory. False, changing nothing, when the pattern or oneDNN says no;
// also when oneDNN offers only ref_fused_convolution (the two kernels one after the other, nothing saved): oneDNN
// 2.6 fuses for real only where the 1x1's blocking suits it (MobileNet-V2: the 112x112 stride-2 block at 2 threads,
// the 112x112 and two 56x56 ones at 1). Option dw_fusion (KEEL_ONEDNN_DW_FUSION=0) turns it off (for A/B runs).
bool Builder::conv_dw_fused(size_t i, const Fusion& f, const md_t& src, const md_t& wany, const md_t& bmd,
                            const std::vector<float>& w, const std::vector<float>& bias, double flops) {
  // With the 1x1's SiLU as the chain's own pass the depthwise one cannot read its output inside the kernel; and
  // unfused is faster then anyway (EfficientNet-B0's 24->144 block at 56x56: 541 us fused with oneDNN's swish, 405 us
  // as two convolutions each followed by the SiLU pass).
  if (!g_options.dw_fusion || f.silu_pass) return false;
  const size_t u = sole_user(f.out);
  if (u == npos) return false;
  const NodeDesc& dn = r_.nodes[u];
  if (dn.op != "Conv" || dn.in[0] != f.out || dn.out.size() != 1) return false;
  Dims y1 = dims_of(f.out);
  if (y1.size() != 4) return false;
  const int64_t M = y1[1];
  const ConstT* W = cst(dn.in_at(1));
  const ConstT* B = dn.in_at(2).empty() ? nullptr : cst(dn.in_at(2));
  if (!W || W->dtype != KEEL_DTYPE_F32 || (!dn.in_at(2).empty() && (!B || B->count() != M))) return false;
  if (dn.ai("group", 1) != M || W->dims != Dims{M, 1, 3, 3}) return false;
  if (dn.ais("kernel_shape", {3, 3}) != Dims{3, 3} || dn.ais("dilations", {1, 1}) != Dims{1, 1} ||
      dn.ais("pads", {0, 0, 0, 0}) != Dims{1, 1, 1, 1})
    return false;
  std::string ap = dn.as("auto_pad", "NOTSET");
  if (ap != "NOTSET" && !ap.empty()) return false;
  Dims ds = dn.ais("strides", {1, 1});
  if (ds != Dims{1, 1} && ds != Dims{2, 2}) return false;
  Fusion g = fuse_after(dn.out[0], u, true, M);
  if (!g.sum_with.empty()) return false;
  dnnl::post_ops po = f.po;
  if (ds[0] == 1) po.append_dw_k3s1p1(dt::f32, dt::f32, dt::f32, 0, {});
  else po.append_dw_k3s2p1(dt::f32, dt::f32, dt::f32, 0, {});
  for (int k = 0; k < g.po.len(); ++k) {
    if (g.po.kind(k) != dnnl::primitive::kind::eltwise) return false;
    float sc, al, be;
    alg a;
    g.po.get_params_eltwise(k, sc, a, al, be);
    po.append_eltwise(sc, a, al, be);
  }
  // Depthwise weights and bias with the folds of its own fusion applied.
  std::vector<float> dw(W->f32(), W->f32() + W->count()), db(M, 0.f);
  if (B)
    for (int64_t k = 0; k < M; ++k) db[k] = static_cast<float>(B->at(k));
  if (!g.bn_scale.empty())
    for (int64_t m = 0; m < M; ++m) {
      for (int k = 0; k < 9; ++k) dw[m * 9 + k] *= g.bn_scale[m];
      db[m] = db[m] * g.bn_scale[m] + g.bn_shift[m];
    }
  for (size_t k = 0; k < g.conv_bias_add.size(); ++k) db[k] += g.conv_bias_add[k];
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(po);
  Dims x = dims_of(r_.nodes[i].in[0]);
  std::unique_ptr<dnnl::convolution_forward::primitive_desc> pd;
  try {
    dnnl::convolution_forward::desc cd(dnnl::prop_kind::forward_inference, alg::convolution_direct, src, wany, bmd,
                                       md_t(to_dnnl(y1), dt::f32, tag::nChw16c), {1, 1}, {0, 0}, {0, 0}, {0, 0});
    pd = std::make_unique<dnnl::convolution_forward::primitive_desc>(cd, attr, engine());
  } catch (const dnnl::error&) {
    return false;
  }
  if (std::string(pd->impl_info_str()).rfind("jit_1x1", 0) != 0) return false;
  Dims y2 = dims_of(g.out);
  if (md_dims(pd->dst_desc()) != y2) return false;
  const int dw_w = DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS, dw_b = DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS;
  md_t dwmd = pd->query_md(dnnl::query::exec_arg_md, dw_w), dbmd = pd->query_md(dnnl::query::exec_arg_md, dw_b);
  if (dwmd.is_zero()) return false;
  std::unordered_map<int, dnnl::memory> extra;
  {
    dnnl::memory wuser(md_t({M, 1, 1, 3, 3}, dt::f32, tag::goihw), engine(), dw.data());
    p_->owned.emplace_back(dwmd, engine(), p_->weights.alloc(dwmd.get_size()));
    dnnl::reorder(wuser, p_->owned.back()).execute(stream(), wuser, p_->owned.back());
    stream().wait();
    extra[dw_w] = p_->owned.back();
  }
  {
    md_t bm = dbmd.is_zero() ? md_t({M}, dt::f32, tag::a) : dbmd;
    p_->owned.emplace_back(bm, engine());
    std::memcpy(p_->owned.back().get_data_handle(), db.data(), std::min<size_t>(bm.get_size(), db.size() * 4));
    extra[dw_b] = p_->owned.back();
  }
  Fusion all = f;
  all.out = g.out;
  all.nodes.push_back(u);
  all.nodes.insert(all.nodes.end(), g.nodes.begin(), g.nodes.end());
  done_[u] = true;
  md_t wplain(to_dnnl(Dims{M, x[1], 1, 1}), dt::f32, tag::oihw);
  std::vector<float> wc = w;
  conv_like_tail(i, all, dnnl::convolution_forward(*pd), pd->src_desc(), pd->weights_desc(), pd->dst_desc(), wplain,
                 wc, true, bias, flops + 2.0 * numel(y2) * 9, std::move(extra));
  return true;
}

// The rest of a convolution or deconvolution once its primitive is chosen: the weights reordered once (from `w` in
// layout `wplain`), the bias, the residual placed in the destination for a sum post-op, the step.
void Builder::conv_like_tail(size_t i, const Fusion& f, dnnl::primitive prim, const md_t& src_md, const md_t& wei_md,
                             const md_t& dmd, const md_t& wplain, std::vector<float>& w, bool has_bias,
                             const std::vector<float>& bias, double flops,
                             std::unordered_map<int, dnnl::memory> extra, const std::string& src,
                             const std::string& chan_scale) {
  const NodeDesc& n = r_.nodes[i];
  Val sv = as_md(src.empty() ? n.in[0] : src, src_md);
  dnnl::memory wuser(wplain, engine(), w.data());
  p_->owned.emplace_back(wei_md, engine(), p_->weights.alloc(wei_md.get_size()));
  dnnl::memory wmem = p_->owned.back();
  dnnl::reorder(wuser, wmem).execute(stream(), wuser, wmem);
  stream().wait();
  std::unordered_map<int, dnnl::memory> args = std::move(extra);
  args[DNNL_ARG_WEIGHTS] = wmem;
  if (has_bias) {
    p_->owned.emplace_back(md_t({static_cast<int64_t>(bias.size())}, dt::f32, tag::a), engine());
    std::memcpy(p_->owned.back().get_data_handle(), bias.data(), bias.size() * sizeof(float));
    args[DNNL_ARG_BIAS] = p_->owned.back();
  }
  int dbuf = -2;
  if (!f.sum_with.empty()) {
    // The residual must sit in the destination first: take its buffer when nobody reads it afterwards.
    size_t add_node = f.nodes.empty() ? i : f.nodes.back();
    for (size_t k : f.nodes)
      if (r_.nodes[k].op == "Add") add_node = k;
    const Val rv = vals_[f.sum_with];
    if (rv.md == dmd && dead_after(f.sum_with, add_node)) {
      dbuf = rv.buf;
      p_->bufs[dbuf].values--;  // the residual dies here; the output takes its place
    } else {
      Val tmp = as_md(f.sum_with, dmd);
      dbuf = new_buf(dmd.get_size());
      dnnl::memory a = mem_of(tmp), b = mem_at(dmd, dbuf, 0);
      exec(dnnl::reorder(a, b), {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}});
    }
  }
  if (!chan_scale.empty()) exec_scale_weights(wmem, wplain, chan_scale);
  Val& out = define(f.out, dmd, dbuf);
  args[DNNL_ARG_SRC] = mem_of(sv);
  args[DNNL_ARG_DST] = mem_of(out);
  p_->flops += flops;
  exec(std::move(prim), std::move(args));
  if (f.silu_pass && !defer_silu(f.out, out.md)) exec_silu(out, f.out);
  for (size_t k : f.nodes) done_[k] = true;
}

// ConvTranspose, 2-D, constant weights (and bias); output_padding within the end pads; post-ops as for Conv.
void Builder::deconv(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  Dims x = dims_of(n.in[0]);
  const ConstT* W = cst(n.in_at(1));
  const ConstT* B = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (!W || W->dtype != KEEL_DTYPE_F32 || (!n.in_at(2).empty() && !B)) throw Reject{"non-constant weights"};
  // 2-D and 3-D (1-D ones arrive lifted to 2-D: lift_1d).
  if ((x.size() != 4 && x.size() != 5) || W->dims.size() != x.size())
    throw Reject{"2-D and 3-D transposed convolutions only"};
  if (n.has("output_shape")) throw Reject{"output_shape"};
  const size_t sp = x.size() - 2;
  const int64_t N = x[0], C = x[1], g = n.ai("group", 1);
  if (g <= 0 || C != W->dims[0] || C % g != 0) throw Reject{"channels do not match weights and group"};
  const int64_t M = W->dims[1] * g;
  Dims ks(W->dims.begin() + 2, W->dims.end());
  if (n.ais("kernel_shape", ks) != ks) throw Reject{"kernel_shape differs from the weights"};
  Dims s = n.ais("strides", Dims(sp, 1)), d = n.ais("dilations", Dims(sp, 1)), pads = n.ais("pads", Dims(2 * sp, 0)),
       opad = n.ais("output_padding", Dims(sp, 0));
  if (s.size() != sp || d.size() != sp || pads.size() != 2 * sp || opad.size() != sp) throw Reject{"attribute ranks"};
  std::string ap = n.as("auto_pad", "NOTSET");
  if (ap == "VALID") pads = Dims(2 * sp, 0);
  else if (ap != "NOTSET" && !ap.empty()) throw Reject{"auto_pad " + ap};
  Dims pl(pads.begin(), pads.begin() + sp), pr(sp), y{N, M};
  y.resize(x.size(), 0);
  for (size_t k = 0; k < sp; ++k) {
    if (s[k] <= 0 || d[k] <= 0 || pads[k] < 0 || pads[k + sp] < 0 || opad[k] < 0) throw Reject{"bad geometry"};
    y[2 + k] = s[k] * (x[2 + k] - 1) + opad[k] + (ks[k] - 1) * d[k] + 1 - pads[k] - pads[k + sp];
    pr[k] = pads[k + sp] - opad[k];
    if (y[2 + k] <= 0) throw Reject{"empty output"};
    if (pr[k] < 0) throw Reject{"output_padding larger than the end pad"};
  }
  Fusion f = fuse_after(n.out[0], i, true, M);
  // ONNX weights [C, M/g, kh, kw] = [g, C/g, M/g, kh, kw]; output channel m = (c / (C/g)) * (M/g) + o.
  std::vector<float> w(W->f32(), W->f32() + W->count());
  std::vector<float> bias(M, 0.f);
  bool has_bias = B != nullptr || !f.conv_bias_add.empty() || !f.bn_shift.empty();
  if (B) {
    if (B->count() != M) throw Reject{"bias size"};
    for (int64_t k = 0; k < M; ++k) bias[k] = static_cast<float>(B->at(k));
  }
  if (!f.bn_scale.empty()) {
    const int64_t per = prod(ks), mg = M / g, cg = C / g;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t o = 0; o < mg; ++o) {
        const int64_t m = (c / cg) * mg + o;
        for (int64_t k = 0; k < per; ++k) w[(c * mg + o) * per + k] *= f.bn_scale[m];
      }
    for (int64_t m = 0; m < M; ++m) bias[m] = bias[m] * f.bn_scale[m] + f.bn_shift[m];
  }
  for (size_t k = 0; k < f.conv_bias_add.size(); ++k) bias[k] += f.conv_bias_add[k];
  Dims wd = g > 1 ? Dims{g, M / g, C / g} : Dims{M, C};
  wd.insert(wd.end(), ks.begin(), ks.end());
  md_t wany(to_dnnl(wd), act_, tag::any), bmd({M}, dt::f32, tag::a), none;
  const Val& xv = val(n.in[0]);
  bool keep_src = ((!is_plain_dense(xv.md) && xv.md != md_t(to_dnnl(x), act_, channels_last_tag(x.size()))) || C < 8) &&
                  xv.md.data_type() == act_;
  md_t src = keep_src ? xv.md : md_t(to_dnnl(x), act_, tag::any);
  md_t dst = M % 16 == 0 ? md_t(to_dnnl(y), act_, blocked16_tag(y.size())) : md_t(to_dnnl(y), act_, tag::any);
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(f.po);
  std::unique_ptr<dnnl::deconvolution_forward::primitive_desc> pd;
  for (int attempt = 0; attempt < 2 && !pd; ++attempt) {
    md_t sm = attempt == 0 ? src : md_t(to_dnnl(x), act_, tag::any);
    md_t dm = attempt == 0 ? dst : md_t(to_dnnl(y), act_, tag::any);
    try {
      dnnl::deconvolution_forward::desc dd(dnnl::prop_kind::forward_inference, alg::deconvolution_direct, sm, wany,
                                           has_bias ? bmd : none, dm, to_dnnl(s), dnnl_dilations(d),
                                           to_dnnl(pl), to_dnnl(pr));
      pd = std::make_unique<dnnl::deconvolution_forward::primitive_desc>(dd, attr, engine());
    } catch (const dnnl::error&) {
      pd.reset();
    }
  }
  if (!pd) throw Reject{"oneDNN has no deconvolution for this case"};
  md_t wplain(to_dnnl(wd), dt::f32, weights_tag(sp, g > 1, true));
  conv_like_tail(i, f, dnnl::deconvolution_forward(*pd), pd->src_desc(), pd->weights_desc(), pd->dst_desc(), wplain,
                 w, has_bias, bias, 2.0 * numel(x) * (M / g) * prod(ks));
}

// MatMul (batched, broadcast; B constant or a value) and Gemm (constant B, C a constant bias).
void Builder::matmul(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  const bool gemm = n.op == "Gemm";
  std::string an = n.in[0], bn = n.in_at(1);
  Dims a = dims_of(an), b = dims_of(bn);
  float scale = 1.f;
  // A scaled view (a folded scalar Mul/Div) in front: the scale moves to the output.
  for (std::string* v : {&an, &bn}) {
    auto it = vals_.find(*v);
    if (it != vals_.end() && it->second.scale != 1.f) {
      scale *= it->second.scale;
      *v = it->second.scale_of;
    }
  }
  Dims y;
  std::vector<float> gemm_bias;
  bool transB = false;
  if (gemm) {
    if (a.size() != 2 || b.size() != 2) throw Reject{"Gemm needs 2-D operands"};
    if (n.ai("transA", 0)) throw Reject{"transA"};
    transB = n.ai("transB", 0) != 0;
    float alpha = n.af("alpha", 1.f), beta = n.af("beta", 1.f);
    scale *= alpha;
    if (!is_const(bn)) throw Reject{"Gemm with a non-constant B"};
    int64_t M = a[0], K = a[1], N = transB ? b[0] : b[1];
    if ((transB ? b[1] : b[0]) != K) throw Reject{"Gemm shapes"};
    y = {M, N};
    if (!n.in_at(2).empty()) {
      const ConstT* c = cst(n.in_at(2));
      if (!c || !(c->count() == N || c->count() == 1) || (c->dims.size() == 2 && c->dims[0] != 1))
        throw Reject{"Gemm C other than a constant [N]"};
      gemm_bias.resize(N);
      for (int64_t k = 0; k < N; ++k) gemm_bias[k] = beta * static_cast<float>(c->at(c->count() == 1 ? 0 : k));
    }
  } else {
    if (a.size() < 2 || b.size() < 2) throw Reject{"1-D MatMul operands"};
    if (a.back() != b[b.size() - 2]) throw Reject{"MatMul inner dims"};
    size_t r = std::max(a.size(), b.size());
    Dims ab(r - a.size(), 1), bb(r - b.size(), 1);
    ab.insert(ab.end(), a.begin(), a.end());
    bb.insert(bb.end(), b.begin(), b.end());
    y.resize(r);
    for (size_t k = 0; k + 2 < r; ++k) {
      if (ab[k] != bb[k] && ab[k] != 1 && bb[k] != 1) throw Reject{"batch dims do not broadcast"};
      y[k] = std::max(ab[k], bb[k]);
    }
    y[r - 2] = ab[r - 2];
    y[r - 1] = bb[r - 1];
    a = ab;
    b = bb;
  }
  // A batch of rows times one matrix (B without batch dims): one [rows, K] x [K, N] product over A's plain memory.
  const Dims y_final = y;
  bool collapse = false;
  if (!gemm && y.size() > 2) {
    collapse = true;
    for (size_t k = 0; k + 2 < b.size(); ++k) collapse = collapse && b[k] == 1;
    if (collapse) {
      int64_t rows = numel(y) / y.back();
      a = {rows, a.back()};
      b = {b[b.size() - 2], b.back()};
      y = {rows, y.back()};
    }
  }
  const size_t r = y.size();
  if (r > 6) throw Reject{"rank > 6"};
  Fusion f = fuse_after(n.out[0], i, false, 0);
  scale *= f.out_scale;
  if (!gemm_bias.empty()) {
    if (!f.mm_bias.empty())
      for (size_t k = 0; k < gemm_bias.size(); ++k) gemm_bias[k] += f.mm_bias[k];
    f.mm_bias = gemm_bias;
  }
  // A: the value's memory when oneDNN reads it (strided views included), else plain.
  auto rank_to = [&](const md_t& md, size_t rr) {
    Dims d = md_dims(md), st = md_strides(md);
    while (d.size() < rr) d.insert(d.begin(), 1), st.insert(st.begin(), st.empty() ? 1 : st.front() * d[1]);
    return strided_md(d, st, md.data_type());
  };
  md_t bias_md;
  if (!f.mm_bias.empty()) {
    Dims bd(r, 1);
    bd.back() = y.back();
    bias_md = plain_md(bd, dt::f32);
  }
  // A scalar factor: into constant weights; else an output scale (applied to the product, so not with a bias).
  const ConstT* bconst = cst(bn);
  float weight_scale = 1.f;
  if (scale != 1.f && bconst) weight_scale = scale, scale = 1.f;
  if (scale != 1.f && !f.mm_bias.empty()) throw Reject{"a scale and a bias on non-constant weights"};
  dnnl::primitive_attr attr = user_scratchpad();
  if (scale != 1.f) attr.set_output_scales(0, {scale});
  attr.set_post_ops(f.po);
  md_t ymd = plain_md(y);
  // A product read only by a Transpose (attention's heads, [B,H,S,Dh] -> [B,S,H,Dh], before the Reshape that joins
  // them): written straight into the transposed layout (oneDNN's brgemm matmul takes a strided destination), so the
  // Transpose is a plain value and costs nothing.
  Dims yt, ys;
  size_t tr = collapse || !f.sum_with.empty() || f.viewed ? npos : sole_transpose(f.out, y, &yt, &ys);
  if (tr != npos) ymd = strided_md(y, ys, act_);
  // Weights: a constant is prepacked in the primitive's layout; a value is read where it is.
  const ConstT* bc = cst(bn);
  md_t bmd;
  Dims bdims = b;
  if (bc) {
    if (bc->dtype != KEEL_DTYPE_F32) throw Reject{"f32 only"};
    bmd = md_t(to_dnnl(bdims), act_, tag::any);
    if (gemm) bdims = {a[1], y[1]}, bmd = md_t(to_dnnl(bdims), act_, tag::any);
  }
  auto try_pd = [&](const md_t& amd, const md_t& wmd) -> std::unique_ptr<dnnl::matmul::primitive_desc> {
    try {
      dnnl::matmul::desc d(amd, wmd, bias_md, ymd);
      auto pd = std::make_unique<dnnl::matmul::primitive_desc>(d, attr, engine());
      std::string impl = pd->impl_info_str();
      if (impl.rfind("ref", 0) == 0) return nullptr;
      return pd;
    } catch (const dnnl::error&) {
      return nullptr;
    }
  };
  std::unique_ptr<dnnl::matmul::primitive_desc> pd;
  Val av = collapse ? as_plain(an) : val(an);
  if (collapse) av.md = plain_md(a);
  md_t amd_view = is_strided(av.md) ? rank_to(av.md, r) : md_t();
  md_t bmd_view;
  Val bv;
  if (!bc) {
    bv = val(bn);
    bmd_view = is_strided(bv.md) ? rank_to(bv.md, r) : md_t();
  }
  bool a_direct = false, b_direct = false;
  if (!amd_view.is_zero()) {
    pd = try_pd(amd_view, bc ? bmd : (!bmd_view.is_zero() ? bmd_view : plain_md(b)));
    if (pd) a_direct = true, b_direct = !bc && !bmd_view.is_zero();
  }
  if (!pd) pd = try_pd(plain_md(a), bc ? bmd : plain_md(b));
  if (!pd && tr != npos) {  // no jit matmul writes that transposed layout: a plain product, the Transpose after it
    tr = npos;
    ymd = plain_md(y);
    a_direct = b_direct = false;
    if (!amd_view.is_zero()) {
      pd = try_pd(amd_view, bc ? bmd : (!bmd_view.is_zero() ? bmd_view : plain_md(b)));
      if (pd) a_direct = true, b_direct = !bc && !bmd_view.is_zero();
    }
    if (!pd) pd = try_pd(plain_md(a), bc ? bmd : plain_md(b));
  }
  if (!pd) throw Reject{"oneDNN has no matmul for this case"};
  std::unordered_map<int, dnnl::memory> args;
  if (a_direct) {
    args[DNNL_ARG_SRC] = mem_at(pd->src_desc(), av.buf, av.off);
  } else {
    Val pa = as_plain(an);
    args[DNNL_ARG_SRC] = mem_at(pd->src_desc(), pa.buf, pa.off);
  }
  if (bc) {
    Dims kn = bdims;
    md_t user;
    if (gemm && transB) user = md_t(to_dnnl(kn), dt::f32, tag::ba);
    else user = plain_md(kn, dt::f32);
    std::vector<float> scaled;
    const void* wsrc = bc->bytes.data();
    if (weight_scale != 1.f) {
      scaled.assign(bc->f32(), bc->f32() + bc->count());
      for (float& v : scaled) v *= weight_scale;
      wsrc = scaled.data();
    }
    // A read as its producer's nChw16c or nhwc memory (flatten_into_gemm): B's rows (its K index) in that order.
    if (auto ff = flat_folds_.find(an); gemm && ff != flat_folds_.end()) {
      const Dims& x = ff->second.first;
      const int64_t C = x[1], HW = x[2] * x[3], K = C * HW, N = y[1];
      const float* src = static_cast<const float*>(wsrc);
      std::vector<float> perm(static_cast<size_t>(K * N));
      for (int64_t c = 0; c < C; ++c)
        for (int64_t p = 0; p < HW; ++p) {
          const int64_t from = c * HW + p;
          const int64_t to = ff->second.second ? p * C + c : ((c / 16) * HW + p) * 16 + c % 16;
          for (int64_t j = 0; j < N; ++j) {
            if (transB) perm[j * K + to] = src[j * K + from];
            else perm[to * N + j] = src[from * N + j];
          }
        }
      scaled = std::move(perm);
      wsrc = scaled.data();
    }
    dnnl::memory um(user, engine(), const_cast<void*>(wsrc));
    p_->owned.emplace_back(pd->weights_desc(), engine(), p_->weights.alloc(pd->weights_desc().get_size()));
    dnnl::reorder(um, p_->owned.back()).execute(stream(), um, p_->owned.back());
    stream().wait();
    args[DNNL_ARG_WEIGHTS] = p_->owned.back();
  } else if (b_direct) {
    args[DNNL_ARG_WEIGHTS] = mem_at(pd->weights_desc(), bv.buf, bv.off);
  } else {
    Val pb = as_plain(bn);
    args[DNNL_ARG_WEIGHTS] = mem_at(pd->weights_desc(), pb.buf, pb.off);
  }
  if (!f.mm_bias.empty()) {
    p_->owned.emplace_back(bias_md, engine());
    std::memcpy(p_->owned.back().get_data_handle(), f.mm_bias.data(), f.mm_bias.size() * sizeof(float));
    args[DNNL_ARG_BIAS] = p_->owned.back();
  }
  int dbuf = -2;
  if (!f.sum_with.empty()) {
    size_t add_node = i;
    for (size_t k : f.nodes)
      if (r_.nodes[k].op == "Add") add_node = k;
    const Val rv = vals_[f.sum_with];
    if (is_plain_dense(rv.md) && rv.off == 0 && dead_after(f.sum_with, add_node)) {
      dbuf = rv.buf;
      p_->bufs[dbuf].values--;
    } else {
      Val tmp = as_plain(f.sum_with);
      dbuf = new_buf(ymd.get_size());
      dnnl::memory s1 = mem_of(tmp), d1 = mem_at(tmp.md, dbuf, 0);
      exec(dnnl::reorder(s1, d1), {{DNNL_ARG_FROM, s1}, {DNNL_ARG_TO, d1}});
    }
  }
  Val& out = tr != npos ? define(r_.nodes[tr].out[0], plain_md(yt), dbuf)
                        : define(f.out, plain_md(f.viewed ? dims_of(f.out) : y_final), dbuf);
  // (Written as [rows, N] when collapsed: the same plain memory; through the Transpose's strides when it follows.)
  args[DNNL_ARG_DST] = mem_at(ymd, out.buf, out.off);
  if (tr != npos) done_[tr] = true;
  p_->flops += 2.0 * numel(y) * a.back();
  exec(dnnl::matmul(*pd), std::move(args));
  for (size_t k : f.nodes) done_[k] = true;
}

void Builder::pool(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  Dims x = dims_of(n.in[0]);
  // 2-D and 3-D (1-D ones arrive lifted to 2-D: lift_1d).
  if (x.size() != 4 && x.size() != 5) throw Reject{"2-D and 3-D pooling only"};
  if (n.out.size() > 1 && !n.out[1].empty()) throw Reject{"Indices output"};
  const size_t sp = x.size() - 2;
  const bool global = n.op.rfind("Global", 0) == 0, mx = n.op.find("Max") != std::string::npos;
  Dims k(x.begin() + 2, x.end()), s(sp, 1), dl(sp, 1), pl(sp, 0), pr(sp, 0), out(sp, 1);
  if (!global) {
    k = n.ais("kernel_shape", {});
    s = n.ais("strides", Dims(sp, 1));
    dl = mx ? n.ais("dilations", Dims(sp, 1)) : Dims(sp, 1);
    Dims pads = n.ais("pads", Dims(2 * sp, 0));
    if (k.size() != sp || s.size() != sp || dl.size() != sp || pads.size() != 2 * sp) throw Reject{"attribute ranks"};
    if (mx && n.ai("storage_order", 0) != 0) throw Reject{"storage_order"};
    std::string ap = n.as("auto_pad", "NOTSET");
    if (ap != "NOTSET" && !ap.empty() && ap != "VALID") throw Reject{"auto_pad " + ap};
    if (ap != "VALID") pl.assign(pads.begin(), pads.begin() + sp), pr.assign(pads.begin() + sp, pads.end());
    bool ceil = n.ai("ceil_mode", 0) != 0;
    if (!mx && ceil && n.ai("count_include_pad", 0)) throw Reject{"ceil_mode with count_include_pad"};
    for (size_t j = 0; j < sp; ++j) {
      int64_t eff = (k[j] - 1) * dl[j] + 1;
      int64_t span = x[2 + j] + pl[j] + pr[j] - eff;
      if (span < 0 || s[j] <= 0) throw Reject{"bad geometry"};
      out[j] = 1 + (ceil ? (span + s[j] - 1) / s[j] : span / s[j]);
      if (ceil) pr[j] = std::max(pr[j], (out[j] - 1) * s[j] + eff - x[2 + j] - pl[j]);
    }
  }
  Dims y{x[0], x[1]};
  y.insert(y.end(), out.begin(), out.end());
  // A Pad folded into this pooling (pad): read its input, the Pad's pads added to the pooling's (counted by an
  // average: pad_foldable_into admits only that case).
  std::string src_name = n.in[0];
  const auto pf = global ? pad_folds_.end() : pad_folds_.find(n.in[0]);
  if (pf != pad_folds_.end()) {
    src_name = pf->second.in;
    for (size_t j = 0; j < sp; ++j) pl[j] += pf->second.begin[j], pr[j] += pf->second.end[j];
  }
  alg a = mx ? alg::pooling_max
             : (global || n.ai("count_include_pad", 0) || pf != pad_folds_.end() ? alg::pooling_avg_include_padding
                                                                                  : alg::pooling_avg_exclude_padding);
  const Val xv = val(src_name);
  // Activations after the pool (Relu, Clip, LeakyRelu, Sigmoid, Tanh, SiLU) run as its eltwise post-ops.
  Fusion f;
  f.out = n.out[0];
  for (;;) {
    if (size_t m = silu_after(f.out); m != npos) {
      f.po.append_eltwise(1.f, alg::eltwise_swish, 1.f, 0.f);
      f.nodes.push_back(users(f.out)[0] == m ? users(f.out)[1] : users(f.out)[0]);
      f.nodes.push_back(m);
      f.out = r_.nodes[m].out[0];
      continue;
    }
    size_t u = sole_user(f.out);
    if (u == npos || r_.nodes[u].out.size() != 1 || r_.nodes[u].in[0] != f.out || !eltwise_po(r_.nodes[u], &f.po))
      break;
    f.nodes.push_back(u);
    f.out = r_.nodes[u].out[0];
  }
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(f.po);
  dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, a, xv.md, md_t(to_dnnl(y), act_, tag::any),
                                   to_dnnl(s), to_dnnl(k), dnnl_dilations(dl), to_dnnl(pl), to_dnnl(pr));
  dnnl::pooling_v2_forward::primitive_desc pd;
  try {
    pd = dnnl::pooling_v2_forward::primitive_desc(d, attr, engine());
  } catch (const dnnl::error&) {  // no pooling with these post-ops: the activations run as their own steps
    f.nodes.clear();
    f.out = n.out[0];
    pd = dnnl::pooling_v2_forward::primitive_desc(d, engine());
  }
  Val sv = as_md(src_name, pd.src_desc());
  Val& o = define(f.out, pd.dst_desc());
  dnnl::memory sm = mem_of(sv), dm = mem_of(o);
  exec(dnnl::pooling_v2_forward(pd), {{DNNL_ARG_SRC, sm}, {DNNL_ARG_DST, dm}});
  for (size_t k2 : f.nodes) done_[k2] = true;
}

// An element-wise op on its own: one eltwise primitive per post-op eltwise_po gives (HardSigmoid: two, the second in
// place over the first one's output; oneDNN's eltwise primitive with a post-op is its reference kernel).
void Builder::eltwise(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  dnnl::post_ops ops;
  if (!eltwise_po(n, &ops)) throw Reject{"non-constant Clip bounds, unknown Gelu approximation or a Pow exponent other than 2 and 0.5"};
  const Val xv = val(n.in[0]);
  if (xv.scale != 1.f) throw Reject{"scaled input"};
  md_t md = xv.md;
  if (!is_plain_dense(md) && is_strided(md)) md = plain_md(md_dims(md));
  Val sv = as_md(n.in[0], md);
  int buf = dead_after(n.in[0], i) && sv.off == 0 && vals_[n.in[0]].buf == sv.buf ? sv.buf : -2;
  if (buf >= 0) p_->bufs[buf].values--;
  dnnl::memory sm = mem_of(sv);
  Val& o = define(n.out[0], md, buf);
  dnnl::memory dm = mem_of(o);
  for (int k = 0; k < ops.len(); ++k) {
    float scale, alpha, beta;
    alg a;
    ops.get_params_eltwise(k, scale, a, alpha, beta);
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, a, md, alpha, beta);
    dnnl::eltwise_forward::primitive_desc pd(d, engine());
    exec(dnnl::eltwise_forward(pd), {{DNNL_ARG_SRC, k == 0 ? sm : dm}, {DNNL_ARG_DST, dm}});
  }
}

// Add/Sub/Mul/Div: two values of one shape, or a value and a broadcast constant. A scalar Mul/Div read only by a
// MatMul becomes a scaled view.
void Builder::binary(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.in.size() != 2) throw Reject{"two inputs"};
  if (n.op == "Mul" && fold_channel_scale(i)) return;
  const ConstT* c0 = cst(n.in[0]);
  const ConstT* c1 = cst(n.in[1]);
  if ((n.op == "Mul" || n.op == "Div") && c1 && c1->count() == 1 && !c0) {
    float k = static_cast<float>(c1->at(0));
    if (n.op == "Div") k = 1.f / k;
    size_t u = sole_user(n.out[0]);
    if (u != npos && r_.nodes[u].op == "MatMul" && vals_.count(n.in[0]) && vals_[n.in[0]].scale == 1.f) {
      Val v = vals_[n.in[0]];
      v.scale = k;
      v.scale_of = n.in[0];
      vals_[n.out[0]] = v;
      return;
    }
  }
  alg a = n.op == "Add" ? alg::binary_add : n.op == "Sub" ? alg::binary_sub : n.op == "Mul" ? alg::binary_mul
                                                                                             : alg::binary_div;
  Dims y = dims_of(n.out[0]);
  std::string x0 = n.in[0], x1 = n.in[1];
  Dims d0 = dims_of(x0), d1 = dims_of(x1);
  if (d0 != y || c0) {
    if (a == alg::binary_sub || a == alg::binary_div) throw Reject{"the first operand broadcasts"};
    std::swap(x0, x1);
    std::swap(d0, d1);
  }
  if (d0 != y || is_const(x0)) throw Reject{"neither operand has the output's shape"};
  const Val v0 = val(x0);
  if (v0.scale != 1.f) throw Reject{"scaled input"};
  // A channels-last operand (a transposed view, ConvNeXt's blocks after their permute back) is read as such.
  const bool cl0 = (y.size() == 4 || y.size() == 5) && v0.md == md_t(to_dnnl(y), act_, channels_last_tag(y.size()));
  md_t m0 = is_strided(v0.md) && !is_plain_dense(v0.md) && !cl0 ? plain_md(y) : v0.md;
  md_t m1;
  Dims e;
  if (d1 == y) {
    m1 = m0;
  } else {
    if (d1.size() > y.size()) throw Reject{"rank"};
    e.assign(y.size() - d1.size(), 1);
    e.insert(e.end(), d1.begin(), d1.end());
    for (size_t k = 0; k < y.size(); ++k)
      if (e[k] != y[k] && e[k] != 1) throw Reject{"broadcast"};
    m1 = plain_md(e);
    if (cl0) {
      // Over nhwc a per-channel [1,C,1,1] operand (its plain bytes are nhwc's) runs on the jit kernel; other
      // broadcasts over plain memory.
      bool per_channel = e[1] == y[1] && (e[0] == 1 || e[0] == y[0]);
      for (size_t k = 2; k < e.size() && per_channel; ++k) per_channel = e[k] == 1;
      if (!per_channel) m0 = plain_md(y);
    } else if (!is_plain_dense(m0)) {
      // Per-channel over nChw16c: oneDNN's jit kernel wants the [N,C,1,1] second source blocked the same way (for
      // C % 16 == 0 the same bytes as the plain one); any other broadcast runs over plain memory.
      // (3-D: [N,C,1,1,1] over nCdhw16c alike.)
      bool per_channel = (y.size() == 4 || y.size() == 5) && (e[0] == 1 || e[0] == y[0]) && e[1] == y[1] &&
                         y[1] % 16 == 0 && m0 == md_t(to_dnnl(y), act_, blocked16_tag(y.size()));
      for (size_t k = 2; k < e.size() && per_channel; ++k) per_channel = e[k] == 1;
      if (per_channel) m1 = md_t(to_dnnl(e), act_, blocked16_tag(e.size()));
      else m0 = plain_md(y);
    }
  }
  Val s0 = as_md(x0, m0);
  // The second source in the first one's layout, or (broadcast) plain, read with the rank-extended dims; a
  // [N,C,1,1] value already blocked as nChw16c (C % 16 == 0) is read where it is.
  Val s1;
  if (d1 == y) {
    s1 = as_md(x1, m0);
  } else {
    s1 = val(x1);
    bool same_bytes = s1.scale == 1.f && m1 != plain_md(e) && numel(d1) == numel(e) &&
                      (is_plain_dense(s1.md) ||
                       (md_dims(s1.md).size() == e.size() && s1.md == md_t(to_dnnl(e), act_, blocked16_tag(e.size()))));
    if (!same_bytes) s1 = as_plain(x1);
  }
  if (s1.md.data_type() != m1.data_type() || m0.data_type() != act_) throw Reject{"operands of different dtypes"};
  dnnl::binary::desc d(a, m0, m1, m0);
  dnnl::binary::primitive_desc pd(d, engine());
  int buf = dead_after(x0, i) && s0.buf == vals_[x0].buf && s0.off == 0 ? s0.buf : -2;
  if (buf >= 0) p_->bufs[buf].values--;
  dnnl::memory a0 = mem_of(s0), a1 = mem_at(m1, s1.buf, s1.off);
  Val& o = define(n.out[0], m0, buf);
  dnnl::memory dm = mem_of(o);
  exec(dnnl::binary(pd), {{DNNL_ARG_SRC_0, a0}, {DNNL_ARG_SRC_1, a1}, {DNNL_ARG_DST, dm}});
}

void Builder::concat(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  Dims y = dims_of(n.out[0]);
  if (auto cb = concat_bufs_.find(n.out[0]); cb != concat_bufs_.end()) {
    bool all = true;
    for (const auto& in : n.in) all = all && placed_parts_.count(in) && vals_.count(in) && vals_[in].scale == 1.f;
    if (all) {
      // Every input already sits in its slice: the output is that buffer.
      Val v;
      v.md = md_t(to_dnnl(y), dt::f32, tag::nChw16c);
      v.buf = cb->second;
      p_->bufs[v.buf].values++;
      vals_[n.out[0]] = v;
      return;
    }
  }
  int64_t axis = n.ai("axis", 0);
  if (axis < 0) axis += static_cast<int64_t>(y.size());
  std::vector<md_t> mds;
  std::vector<Val> srcs;
  bool blocked = true;
  for (const auto& in : n.in) {
    if (in.empty() || numel(dims_of(in)) == 0) throw Reject{"empty input"};
    const Val& v = val(in);
    if (v.scale != 1.f) throw Reject{"scaled input"};
    blocked = blocked && !is_strided(v.md);
  }
  md_t first = val(n.in[0]).md;
  bool all_blocked = true;
  for (const auto& in : n.in) {
    const Val& v = val(in);
    all_blocked = all_blocked && blocked && axis == 1 &&
                  v.md.data.format_desc.blocking.inner_nblks == first.data.format_desc.blocking.inner_nblks &&
                  v.md.data.dims[1] % 16 == 0;
  }
  if (!all_blocked) {
    // ShuffleNet's channel shuffle after the Concat of its g halves (C/g channels each): Reshape [N,g,C/g,H,W] ->
    // Transpose(0,2,1,3,4) -> Reshape [N,C,H,W]. Each source is reordered straight into its interleaved channels of
    // the shuffled output (source k's channel j is channel j*g+k): one reorder per source, none for the shuffle.
    auto sole = [&](const std::string& v, const char* op) -> size_t {
      const size_t u = sole_user(v);
      return u != npos && r_.nodes[u].op == op && r_.nodes[u].out.size() == 1 && r_.nodes[u].in[0] == v ? u : npos;
    };
    // Reorders source `in` into buffer `obuf` at `byte_off`, through a view of the output with strides `strides`.
    auto place = [&](const std::string& in, const Dims& strides, int obuf, uint64_t byte_off) {
      Val sv = val(in);
      if (sv.md.data_type() != act_) throw Reject{"Concat of mixed dtypes"};
      dnnl::memory sm = mem_of(sv), dm = mem_at(strided_md(dims_of(in), strides, act_), obuf, byte_off);
      exec(dnnl::reorder(sm, dm), {{DNNL_ARG_FROM, sm}, {DNNL_ARG_TO, dm}});
    };
    const int64_t g = static_cast<int64_t>(n.in.size());
    const size_t r1 = sole(n.out[0], "Reshape"), tr = r1 == npos ? npos : sole(r_.nodes[r1].out[0], "Transpose"),
                 r2 = tr == npos ? npos : sole(r_.nodes[tr].out[0], "Reshape");
    bool shuffle = r2 != npos && axis == 1 && y.size() == 4 && g > 1 && y[1] % g == 0;
    if (shuffle) {
      shuffle = dims_of(r_.nodes[r1].out[0]) == Dims{y[0], g, y[1] / g, y[2], y[3]} &&
                r_.nodes[tr].ais("perm", {}) == Dims{0, 2, 1, 3, 4} && dims_of(r_.nodes[r2].out[0]) == y;
      for (const auto& in : n.in) shuffle = shuffle && dims_of(in) == Dims{y[0], y[1] / g, y[2], y[3]};
    }
    if (shuffle) {
      Val& o = define(r_.nodes[r2].out[0], plain_md(y));
      const int obuf = o.buf;
      const uint64_t ooff = o.off;
      const size_t esize = elem_size(o.md);
      const int64_t hw = y[2] * y[3];
      const Dims ds{y[1] * hw, g * hw, y[3], 1};
      for (int64_t k = 0; k < g; ++k)
        place(n.in[static_cast<size_t>(k)], ds, obuf, ooff + static_cast<uint64_t>(k * hw) * esize);
      done_[r1] = done_[tr] = done_[r2] = true;
      return;
    }
    // A plain output, each source reordered straight into its slice (any layout in, a strided view of the output
    // out): oneDNN's concat over plain memory is its simple kernel, measured 10x slower than the reorders (ShuffleNet's
    // [1,58,28,28] halves: 0.15 ms against 0.014 ms each), and it needed its sources plain first.
    Val& o = define(n.out[0], plain_md(y));
    const int obuf = o.buf;
    const uint64_t ooff = o.off;
    const Dims ys = md_strides(o.md);
    const size_t esize = elem_size(o.md);
    uint64_t at = 0;  // elements into the output
    for (const auto& in : n.in) {
      place(in, ys, obuf, ooff + at * esize);
      at += static_cast<uint64_t>(dims_of(in)[axis] * ys[axis]);
    }
    return;
  }
  for (const auto& in : n.in) {
    // One layout for every source: the first one's, all blocked alike.
    const Val& v = val(in);
    md_t want = v.md;
    srcs.push_back(as_md(in, want));
    mds.push_back(want);
  }
  dnnl::concat::primitive_desc pd(static_cast<int>(axis), mds, engine());
  Val& o = define(n.out[0], pd.dst_desc());
  std::unordered_map<int, dnnl::memory> args;
  for (size_t k = 0; k < srcs.size(); ++k) args[DNNL_ARG_MULTIPLE_SRC + static_cast<int>(k)] = mem_of(srcs[k]);
  args[DNNL_ARG_DST] = mem_of(o);
  exec(dnnl::concat(pd), std::move(args));
}

void Builder::batchnorm(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.in.size() != 5 || n.ai("training_mode", 0) != 0) throw Reject{"training BatchNormalization"};
  for (size_t k = 1; k < n.out.size(); ++k)
    if (!n.out[k].empty()) throw Reject{"training outputs"};
  Dims x = dims_of(n.in[0]);
  if (x.size() < 2) throw Reject{"rank"};
  const int64_t C = x[1];
  std::vector<float> ss[4];
  for (int k = 0; k < 4; ++k) {
    const ConstT* c = cst(n.in[1 + k]);
    if (!c || c->count() != C) throw Reject{"non-constant or mis-sized scale/bias/mean/var"};
    for (int64_t j = 0; j < C; ++j) ss[k].push_back(static_cast<float>(c->at(j)));
  }
  const Val xv = val(n.in[0]);
  md_t md = is_strided(xv.md) && !is_plain_dense(xv.md) ? plain_md(x) : xv.md;
  Val sv = as_md(n.in[0], md);
  // A Relu after it (DenseNet's pre-activation BatchNormalization-Relu in front of each convolution): oneDNN's
  // fused flag, one pass instead of two.
  auto flags = dnnl::normalization_flags::use_global_stats | dnnl::normalization_flags::use_scale |
               dnnl::normalization_flags::use_shift;
  std::string out = n.out[0];
  const size_t relu = sole_user(out);
  if (relu != npos && r_.nodes[relu].op == "Relu" && r_.nodes[relu].out.size() == 1) {
    flags |= dnnl::normalization_flags::fuse_norm_relu;
    out = r_.nodes[relu].out[0];
    done_[relu] = true;
  }
  dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_inference, md, n.af("epsilon", 1e-5f), flags);
  dnnl::batch_normalization_forward::primitive_desc pd(d, engine());
  std::unordered_map<int, dnnl::memory> args;
  const int arg[4] = {DNNL_ARG_SCALE, DNNL_ARG_SHIFT, DNNL_ARG_MEAN, DNNL_ARG_VARIANCE};
  for (int k = 0; k < 4; ++k) {
    p_->owned.emplace_back(md_t({C}, dt::f32, tag::a), engine());
    std::memcpy(p_->owned.back().get_data_handle(), ss[k].data(), C * sizeof(float));
    args[arg[k]] = p_->owned.back();
  }
  args[DNNL_ARG_SRC] = mem_of(sv);
  Val& o = define(out, md);
  args[DNNL_ARG_DST] = mem_of(o);
  exec(dnnl::batch_normalization_forward(pd), std::move(args));
}

void Builder::softmax(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  Dims x = dims_of(n.in[0]);
  int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = n.ai("axis", -1);
  if (axis < 0) axis += rank;
  if (axis != rank - 1) throw Reject{"Softmax over an axis other than the last"};  // equal for every opset
  Val sv = as_plain(n.in[0]);
  md_t md = plain_md(x);
  dnnl::softmax_forward::desc d(dnnl::prop_kind::forward_inference, md, static_cast<int>(axis));
  dnnl::softmax_forward::primitive_desc pd(d, engine());
  int buf = dead_after(n.in[0], i) && vals_[n.in[0]].buf == sv.buf ? sv.buf : -2;
  if (buf >= 0) p_->bufs[buf].values--;
  dnnl::memory sm = mem_of(sv);
  Val& o = define(n.out[0], md, buf);
  dnnl::memory dm = mem_of(o);
  exec(dnnl::softmax_forward(pd), {{DNNL_ARG_SRC, sm}, {DNNL_ARG_DST, dm}});
}

// ReduceMean over constant axes (attribute, or input 1 from opset 18) as oneDNN's reduction over plain memory;
// keepdims 0 is the same bytes under the squeezed dims.
void Builder::reduce_mean(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  const Dims xd = dims_of(n.in[0]);
  const int64_t rank = static_cast<int64_t>(xd.size());
  Dims axes = n.ais("axes", {});
  if (n.in.size() > 1 && !n.in[1].empty()) {
    const ConstT* c = cst(n.in[1]);
    if (!c) throw Reject{"non-constant axes"};
    for (int64_t k = 0; k < c->count(); ++k) axes.push_back(static_cast<int64_t>(c->at(k)));
  }
  if (axes.empty()) {
    if (n.ai("noop_with_empty_axes", 0) != 0) throw Reject{"noop_with_empty_axes"};
    for (int64_t k = 0; k < rank; ++k) axes.push_back(k);
  }
  Dims kept = xd;
  for (int64_t a : axes) {
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) throw Reject{"axis out of range"};
    kept[a] = 1;
  }
  if (numel(kept) == numel(xd)) throw Reject{"nothing to reduce"};
  const Val& xv = val(n.in[0]);
  if (xv.scale != 1.f) throw Reject{"scaled input"};
  Val sv = as_plain(n.in[0]);
  const md_t src = plain_md(xd), dst = plain_md(kept);
  dnnl::reduction::desc d(alg::reduction_mean, src, dst, 0.f, 0.f);
  dnnl::reduction::primitive_desc pd(d, engine());
  Val& o = define(n.out[0], plain_md(dims_of(n.out[0])));
  dnnl::memory dm = mem_at(dst, o.buf, o.off);
  exec(dnnl::reduction(pd), {{DNNL_ARG_SRC, mem_of(sv)}, {DNNL_ARG_DST, dm}});
}

// keel.Attention(Q, Kt, V, [mask]) as the chain's own step (steps/attention.h): Q, Kt, V and the mask read where
// they lie (strided views: the heads' Slice / Reshape / Transpose of the in-projection move nothing), the output
// written straight into the layout of a Transpose that alone reads it (the heads joined again, as matmul() does);
// the scores stay in each thread's cache. It computes in f32: a bf16 node (a mixed-precision graph) reads its operands
// converted to plain f32 and writes f32 memory that one reorder rounds into its bf16 output.
void Builder::attention(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  const dt out_dt = act_;
  if (out_dt != dt::f32 && out_dt != dt::bf16) throw Reject{"keel.Attention in f32 or bf16 only"};
  if (n.in.size() < 3 || n.out.size() != 1) throw Reject{"keel.Attention needs Q, Kt, V and one output"};
  const bool has_mask = !n.in_at(3).empty();
  float scale = n.af("scale", 1.f);
  Val v[4];
  StridedView views[4];
  for (int k = 0; k < (has_mask ? 4 : 3); ++k) {
    v[k] = val(n.in[k]);
    if (v[k].scale != 1.f) throw Reject{"scaled input"};
    if (v[k].md.data_type() == dt::bf16) v[k] = as_md(n.in[k], plain_md(md_dims(v[k].md), dt::f32));
    else if (v[k].md.data_type() != dt::f32) throw Reject{"f32 or bf16 operands only"};
    if (!is_strided(v[k].md)) v[k] = as_plain(n.in[k]);
    views[k] = {md_dims(v[k].md), md_strides(v[k].md)};
  }
  Dims y;
  std::string why;
  if (!attention_out_dims(views[0].dims, views[1].dims, views[2].dims, has_mask ? &views[3].dims : nullptr, &y, &why))
    throw Reject{why};
  // The output: plain, or transposed for a Transpose that alone reads it.
  StridedView out{y, dense_strides(y)};
  std::string out_name = n.out[0];
  Dims yt, ys;
  const size_t tr = sole_transpose(n.out[0], y, &yt, &ys);
  if (tr != npos) {
    out.strides = ys;
    out_name = r_.nodes[tr].out[0];
    y = yt;
  }
  AttentionShape s = attention_plan(views[0], views[1], views[2], has_mask ? &views[3] : nullptr, out, scale,
                                    std::max(1, p_->threads));
  Exec e;
  const int args[4] = {DNNL_ARG_SRC_0, DNNL_ARG_SRC_1, DNNL_ARG_SRC_2, DNNL_ARG_SRC_3};
  for (int k = 0; k < (has_mask ? 4 : 3); ++k) e.args[args[k]] = mem_of(v[k]);
  const int64_t scratch = static_cast<int64_t>(attention_scratch_floats(s)) * std::max(1, p_->threads);
  e.args[DNNL_ARG_SCRATCHPAD] = mem_at(md_t({scratch}, dt::f32, tag::a), new_buf(scratch * sizeof(float)), 0);
  // f32 output memory: the value itself, or (bf16) a buffer of the step's own, rounded into the value after it.
  const int f32_buf = out_dt == dt::f32 ? -1 : new_buf(static_cast<uint64_t>(numel(y)) * sizeof(float));
  Val* o = out_dt == dt::f32 ? &define(out_name, plain_md(y)) : nullptr;
  e.args[DNNL_ARG_DST] =
      mem_at(strided_md(out.dims, out.strides), o ? o->buf : f32_buf, o ? o->off : 0);
  e.own = run_attention;
  e.own_kind = "attention";
  const double flops = 2.0 * static_cast<double>(s.batches * s.S * s.T * (s.D + s.Dv));
  e.params = std::make_shared<const AttentionShape>(std::move(s));
  p_->flops += flops;
  exec_own(std::move(e), has_avx512f() ? "keel:attention_avx512" : "keel:attention_scalar", false,
           n.name + " Q " + dims_str(views[0].dims) + " Kt " + dims_str(views[1].dims) + " V " +
               dims_str(views[2].dims) + (has_mask ? " mask " + dims_str(views[3].dims) : "") + " -> " +
               dims_str(y) + (tr != npos ? " (transposed)" : ""));
  if (out_dt != dt::f32) {
    dnnl::memory from = mem_at(plain_md(y, dt::f32), f32_buf, 0);
    Val& ob = define(out_name, plain_md(y, out_dt));
    dnnl::memory to = mem_of(ob);
    exec(dnnl::reorder(from, to), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
  }
  if (tr != npos) done_[tr] = true;
}

void Builder::layernorm(size_t i, const std::string& x, const std::string& out, const ConstT* scale,
                        const ConstT* shift, float eps) {
  (void)i;
  Dims xd = dims_of(x);
  const int64_t D = xd.back();
  if (!scale || scale->count() != D || (shift && shift->count() != D)) throw Reject{"scale/bias size"};
  Val sv = as_plain(x);
  md_t md = plain_md(xd);
  auto flags = dnnl::normalization_flags::use_scale;
  if (shift) flags |= dnnl::normalization_flags::use_shift;
  dnnl::layer_normalization_forward::desc d(dnnl::prop_kind::forward_inference, md, eps, flags);
  dnnl::layer_normalization_forward::primitive_desc pd(d, engine());
  std::unordered_map<int, dnnl::memory> args;
  auto vec = [&](const ConstT* c) {
    p_->owned.emplace_back(md_t({D}, dt::f32, tag::a), engine());
    float* p = static_cast<float*>(p_->owned.back().get_data_handle());
    for (int64_t k = 0; k < D; ++k) p[k] = static_cast<float>(c->at(k));
    return p_->owned.back();
  };
  args[DNNL_ARG_SCALE] = vec(scale);
  if (shift) args[DNNL_ARG_SHIFT] = vec(shift);
  args[DNNL_ARG_SRC] = mem_of(sv);
  Val& o = define(out, md);
  args[DNNL_ARG_DST] = mem_of(o);
  exec(dnnl::layer_normalization_forward(pd), std::move(args));
}

// Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout (inference): a view of the input's plain memory.
void Builder::reshape_like(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.op == "Dropout") {
    for (size_t k = 1; k < n.out.size(); ++k)
      if (!n.out[k].empty()) throw Reject{"Dropout mask output"};
  }
  Dims x = dims_of(n.in[0]);
  Dims y;
  auto dit = r_.dims.find(n.out[0]);
  if (n.op == "Reshape") {
    const ConstT* s = cst(n.in_at(1));
    if (!s) throw Reject{"non-constant shape"};
    if (n.ai("allowzero", 0)) throw Reject{"allowzero"};
    int64_t known = 1, neg = -1;
    for (int64_t k = 0; k < s->count(); ++k) {
      int64_t v = s->iat(k);
      if (v == 0) v = k < static_cast<int64_t>(x.size()) ? x[k] : throw Reject{"0 past the input rank"};
      if (v == -1) neg = k;
      else known = mul_sat(known, v);
      y.push_back(v);
    }
    if (neg >= 0) y[neg] = known ? numel(x) / known : 0;
  } else if (n.op == "Flatten") {
    int64_t axis = n.ai("axis", 1);
    if (axis < 0) axis += static_cast<int64_t>(x.size());
    int64_t a = 1, b = 1;
    for (int64_t k = 0; k < static_cast<int64_t>(x.size()); ++k) (k < axis ? a : b) *= x[k];
    y = {a, b};
  } else if (dit != r_.dims.end()) {
    y = dit->second;
  } else if (n.op == "Identity" || n.op == "Dropout") {
    y = x;
  } else {
    throw Reject{"output shape unknown"};
  }
  if (numel(y) != numel(x)) throw Reject{"element count changes"};
  if (dit != r_.dims.end() && dit->second != y) throw Reject{"shape differs from the inferred one"};
  const Val& v = val(n.in[0]);
  if (v.scale != 1.f) throw Reject{"scaled input"};
  if (flatten_into_gemm(i, x, y)) return;
  // A strided view (a q/k/v slice of an in-projection) read only by keel.Attention (through Transposes) is
  // reshaped as a view where its strides allow: the heads' split moves nothing. (Not for MatMul readers: oneDNN's
  // batched matmul over such views ran slower at 1 thread than the reorder plus the plain product.)
  Dims ys;
  if (is_strided(v.md) && !is_plain_dense(v.md) && read_by_attention_only(n.out[0]) &&
      reshape_strides(x, md_strides(v.md), y, &ys)) {
    Val o = v;
    o.md = strided_md(y, ys, v.md.data_type());
    if (is_plain_dense(o.md)) o.md = plain_md(y, v.md.data_type());
    p_->bufs[o.buf].values++;
    vals_[n.out[0]] = o;
    return;
  }
  Val pv = as_plain(n.in[0]);
  Val o = pv;
  o.md = plain_md(y);
  p_->bufs[o.buf].values++;
  vals_[n.out[0]] = o;
}

// A Flatten (or Reshape) of [N,C,H,W] to [N,C*H*W] whose only reader is a Gemm with a constant B (a small CNN's
// classifier after its last pooling), over a value in nChw16c (C a multiple of 16: no padded channels) or nhwc:
// each sample's C*H*W floats lie contiguous in that layout, only in another order, so the Gemm reads them where
// they are and takes B's rows in the same order (permuted once, when it is prepacked) instead of a reorder to the
// plain layout on every run (simple_cnn at batch 32, [32,32,15,15]: 0.03 ms of 0.43 at 1 thread).
bool Builder::flatten_into_gemm(size_t i, const Dims& x, const Dims& y) {
  const NodeDesc& n = r_.nodes[i];
  if (x.size() != 4 || y.size() != 2 || y[0] != x[0] || x[2] * x[3] == 1 || act_ != dt::f32) return false;
  const size_t u = sole_user(n.out[0]);
  if (u == npos) return false;
  const NodeDesc& g = r_.nodes[u];
  if (g.op != "Gemm" || g.in[0] != n.out[0] || g.ai("transA", 0) != 0 || g.in.size() < 2 || g.in[1] == n.out[0])
    return false;
  const ConstT* b = cst(g.in[1]);
  if (!b || b->dtype != KEEL_DTYPE_F32 || b->dims.size() != 2) return false;
  const Val& v = val(n.in[0]);
  const bool nhwc = v.md == md_t(to_dnnl(x), act_, channels_last_tag(4));
  const bool blocked = x[1] % 16 == 0 && v.md == md_t(to_dnnl(x), act_, blocked16_tag(4));
  if (!nhwc && !blocked) return false;
  Val o = v;
  o.md = plain_md(y);
  p_->bufs[o.buf].values++;
  vals_[n.out[0]] = o;
  flat_folds_[n.out[0]] = {x, nhwc};
  return true;
}

// Pad, constant mode. All-zero pads (torch exports AvgPool3d/AvgPool1d with one): a view of its input. Otherwise
// (TF/Keras exports: ZeroPadding2D before a convolution or pooling, SAME padding made explicit) the pads, all on the
// spatial axes and not negative, are folded into the padding of every node that reads the output, when that is
// exactly what the Pad computes (pad_foldable_into): the Pad costs nothing and its output never exists. Anything
// else (reflect/edge modes, a non-zero value before a convolution, another reader) is rejected: the Pad runs on
// its own kernel.
void Builder::pad(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.as("mode", "constant") != "constant") throw Reject{"Pad mode other than constant"};
  const ConstT* p = cst(n.in_at(1));
  if (!p) throw Reject{"non-constant pads"};
  if (n.has("pads") || n.in.size() > 3) throw Reject{"Pad form"};
  bool zero = true;
  for (int64_t k = 0; k < p->count(); ++k) zero = zero && p->iat(k) == 0;
  if (zero) {
    if (dims_of(n.in[0]) != dims_of(n.out[0])) throw Reject{"shape changes"};
    const Val v = val(n.in[0]);
    if (v.scale != 1.f) throw Reject{"scaled input"};
    vals_[n.out[0]] = v;
    p_->bufs[v.buf].values++;
    return;
  }
  const Dims x = dims_of(n.in[0]), y = dims_of(n.out[0]);
  const int64_t rank = static_cast<int64_t>(x.size());
  if (rank != 4 && rank != 5) throw Reject{"Pad of a rank other than 4 or 5"};
  // A rank-3 Pad lifted to [N,C,1,L] (lift_1d) keeps its 6 pads: none on the inserted axis.
  Dims pads(2 * rank, 0);
  if (p->count() == 2 * rank) {
    for (int64_t k = 0; k < 2 * rank; ++k) pads[k] = p->iat(k);
  } else if (rank == 4 && p->count() == 6 && x[2] == 1) {
    pads = {p->iat(0), p->iat(1), 0, p->iat(2), p->iat(3), p->iat(4), 0, p->iat(5)};
  } else {
    throw Reject{"Pad: " + std::to_string(p->count()) + " pads for rank " + std::to_string(rank)};
  }
  if (pads[0] || pads[1] || pads[rank] || pads[rank + 1]) throw Reject{"Pad on the batch or channel axis"};
  Dims begin(pads.begin() + 2, pads.begin() + rank), end(pads.begin() + rank + 2, pads.end());
  for (size_t k = 0; k < begin.size(); ++k) {
    if (begin[k] < 0 || end[k] < 0) throw Reject{"negative pads (a crop)"};
    if (y[2 + k] != x[2 + k] + begin[k] + end[k]) throw Reject{"Pad output shape"};
  }
  float value = 0.f;
  if (!n.in_at(2).empty()) {
    const ConstT* c = cst(n.in_at(2));
    if (!c || c->count() != 1 || c->dtype != KEEL_DTYPE_F32) throw Reject{"Pad value not a constant f32 scalar"};
    value = c->f32()[0];
  }
  const std::string& out = n.out[0];
  if (escapes(out) || users(out).empty()) throw Reject{"Pad output read outside the claim"};
  for (size_t u : users(out))
    if (done_[u] || !pad_foldable_into(u, out, n.in[0], begin, end, value))
      throw Reject{"Pad not foldable into " + r_.nodes[u].op + " '" + r_.nodes[u].name + "'"};
  val(n.in[0]);  // the input must be available
  pad_folds_[out] = {n.in[0], begin, end};
}

// Whether node `u`, reading the output `v` of a Pad of `src` (pads `begin`/`end` of value `value` on the spatial
// axes), computes the same with the pads added to its own padding: a Conv when the value is 0 (its padding is
// zeros); an AveragePool when the value is 0 and it counts the padding (count_include_pad, or no pads of its own),
// without ceil_mode; a MaxPool when the value is -inf (or the lowest float), or 0 over a value known not to be
// negative (a Relu's output: a window that holds at least one element of the input, as each does when every pad is
// smaller than the window, then has the same maximum), without ceil_mode. The node's own auto_pad must be NOTSET
// (or VALID for the poolings).
bool Builder::pad_foldable_into(size_t u, const std::string& v, const std::string& src, const Dims& begin,
                                const Dims& end, float value) {
  const NodeDesc& n = r_.nodes[u];
  if (n.in.empty() || n.in[0] != v) return false;
  for (size_t k = 1; k < n.in.size(); ++k)
    if (n.in[k] == v) return false;
  const size_t sp = begin.size();
  const std::string ap = n.as("auto_pad", "NOTSET");
  if (n.op == "Conv") return value == 0.f && (ap == "NOTSET" || ap.empty() || ap == "VALID");
  if (n.op != "MaxPool" && n.op != "AveragePool") return false;
  if (ap != "NOTSET" && !ap.empty() && ap != "VALID") return false;
  if (n.ai("ceil_mode", 0) != 0) return false;
  Dims own = ap == "VALID" ? Dims(2 * sp, 0) : n.ais("pads", Dims(2 * sp, 0));
  if (own.size() != 2 * sp) return false;
  if (n.op == "AveragePool") {
    if (value != 0.f) return false;
    bool own_zero = std::all_of(own.begin(), own.end(), [](int64_t q) { return q == 0; });
    return own_zero || n.ai("count_include_pad", 0) != 0;
  }
  const bool lowest = std::isinf(value) ? value < 0 : value <= -std::numeric_limits<float>::max();
  if (!lowest && !(value == 0.f && non_negative(src))) return false;
  Dims k = n.ais("kernel_shape", {}), d = n.ais("dilations", Dims(sp, 1));
  if (k.size() != sp || d.size() != sp) return false;
  for (size_t j = 0; j < sp; ++j) {
    const int64_t eff = (k[j] - 1) * d[j] + 1;
    if (own[j] + begin[j] >= eff || own[sp + j] + end[j] >= eff) return false;
  }
  return true;
}

// Whether value `v` is known not to be negative: the output of a Relu (or of a Clip with a constant min >= 0) in
// this claim.
bool Builder::non_negative(const std::string& v) const {
  for (const NodeDesc& n : r_.nodes) {
    if (n.out.empty() || n.out[0] != v) continue;
    if (n.op == "Relu") return true;
    if (n.op == "Clip") {
      if (n.has("min")) return n.af("min", -1.f) >= 0.f;
      const ConstT* lo = n.in_at(1).empty() ? nullptr : cst(n.in_at(1));
      return lo && lo->count() == 1 && lo->at(0) >= 0.0;
    }
    return false;
  }
  return false;
}

// Resize (opset 11+: X, roi, scales, sizes; constant scales or sizes) of the spatial axes of a 3-D to 5-D value, as
// oneDNN's resampling (the layout kept: nChw16c in, nChw16c out):
//   - linear with coordinate_transformation_mode half_pixel (pytorch_half_pixel where no output axis is 1): what
//     torch exports for bilinear/trilinear interpolation with align_corners=False; oneDNN computes the same
//     (x + 0.5) / scale - 0.5, clamped at the edges;
//   - nearest with integer upscale factors and asymmetric + floor (torch's nearest) or half_pixel +
//     round_prefer_floor/ceil: each output pixel then reads source pixel floor(x / scale), oneDNN's
//     floor((x + 0.5) / scale) for an integer scale.
// Anything else (cubic, align_corners, asymmetric linear, tf_crop_and_resize, antialias, axes, N or C resized)
// stays with the Resize kernel.
void Builder::resize(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.in.size() < 3) throw Reject{"Resize-10 form (X, scales)"};
  const Dims x = dims_of(n.in[0]), y = dims_of(n.out[0]);
  const size_t rank = x.size();
  if (rank < 3 || rank > 5 || y.size() != rank || x[0] != y[0] || x[1] != y[1]) throw Reject{"not a spatial resize"};
  if (n.has("axes") || n.ai("antialias", 0) != 0 || n.as("keep_aspect_ratio_policy", "stretch") != "stretch")
    throw Reject{"axes, antialias or keep_aspect_ratio_policy"};
  const std::string mode = n.as("mode", "nearest"), ctm = n.as("coordinate_transformation_mode", "half_pixel"),
                    nm = n.as("nearest_mode", "round_prefer_floor");
  const ConstT* sc = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  const ConstT* sz = n.in_at(3).empty() ? nullptr : cst(n.in_at(3));
  if ((!n.in_at(2).empty() && !sc) || (!n.in_at(3).empty() && !sz)) throw Reject{"non-constant scales or sizes"};
  if (sc && sc->count() == 0) sc = nullptr;
  if (sz && sz->count() == 0) sz = nullptr;
  if (!sc && !sz) throw Reject{"neither scales nor sizes"};
  std::vector<float> factors;
  for (size_t k = 2; k < rank; ++k) {
    if (sc) {
      if (sc->count() != static_cast<int64_t>(rank) || sc->at(0) != 1 || sc->at(1) != 1) throw Reject{"scales"};
      factors.push_back(static_cast<float>(sc->at(static_cast<int64_t>(k))));
    } else {
      if (sz->count() != static_cast<int64_t>(rank) || sz->iat(static_cast<int64_t>(k)) != y[k]) throw Reject{"sizes"};
      factors.push_back(static_cast<float>(y[k]) / static_cast<float>(x[k]));
    }
    if (!(factors.back() > 0) || y[k] != static_cast<int64_t>(std::floor(x[k] * static_cast<double>(factors.back()))))
      throw Reject{"output size does not follow from the scales"};
  }
  alg a;
  if (mode == "linear") {
    bool one = false;
    for (size_t k = 2; k < rank; ++k) one = one || y[k] == 1;
    if (ctm != "half_pixel" && !(ctm == "pytorch_half_pixel" && !one))
      throw Reject{"linear Resize with coordinate_transformation_mode " + ctm};
    a = alg::resampling_linear;
  } else if (mode == "nearest") {
    const bool floor_mode = ctm == "asymmetric" && nm == "floor";
    const bool round_mode = (ctm == "half_pixel" || ctm == "pytorch_half_pixel") &&
                            (nm == "round_prefer_floor" || nm == "round_prefer_ceil");
    if (!floor_mode && !round_mode) throw Reject{"nearest Resize with " + ctm + " / " + nm};
    for (size_t k = 2; k < rank; ++k) {
      const float f = factors[k - 2];
      if (f < 1 || f != std::floor(f) || y[k] != x[k] * static_cast<int64_t>(f)) throw Reject{"nearest Resize by a non-integer factor"};
    }
    a = alg::resampling_nearest;
  } else {
    throw Reject{"Resize mode " + mode};
  }
  const Val& v = val(n.in[0]);
  if (v.scale != 1.f) throw Reject{"scaled input"};
  // The producer's layout when it is plain or channel-blocked with whole blocks; else plain (a blocked value with a
  // partial last block, e.g. a 21-class segmentation map, is read plain: the resized copy is the big one).
  md_t src = plain_md(x), dst = plain_md(y);
  if (v.md == md_t(to_dnnl(x), act_, blocked16_tag(rank)) && x[1] % 16 == 0) {
    src = v.md;
    dst = md_t(to_dnnl(y), act_, blocked16_tag(rank));
  } else if (v.md == md_t(to_dnnl(x), act_, channels_last_tag(rank))) {
    src = v.md;
    dst = md_t(to_dnnl(y), act_, channels_last_tag(rank));
  }
  dnnl::resampling_forward::desc d(dnnl::prop_kind::forward_inference, a, factors, src, dst);
  dnnl::resampling_forward::primitive_desc pd(d, engine());
  Val sv = as_md(n.in[0], src);
  dnnl::memory sm = mem_of(sv);
  Val& o = define(n.out[0], dst);
  dnnl::memory dm = mem_of(o);
  exec(dnnl::resampling_forward(pd), {{DNNL_ARG_SRC, sm}, {DNNL_ARG_DST, dm}});
}

// Transpose: a strided view when the input is plain-strided (normalised to plain when it is dense), else a
// reorder into the plain layout.
void Builder::transpose(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  Dims x = dims_of(n.in[0]);
  Dims perm = n.ais("perm", {});
  if (perm.empty())
    for (size_t k = x.size(); k-- > 0;) perm.push_back(static_cast<int64_t>(k));
  if (perm.size() != x.size()) throw Reject{"perm rank"};
  const Val v = val(n.in[0]);
  if (v.scale != 1.f) throw Reject{"scaled input"};
  for (int64_t p : perm)
    if (p < 0 || p >= static_cast<int64_t>(x.size())) throw Reject{"perm out of range"};
  // A blocked value is reordered once, straight into the strided layout whose transposed view is dense (nChw16c
  // read as [N,H,W,C], ConvNeXt's permute in front of its LayerNorm: into nhwc), not to plain and again after.
  Val src = v;
  if (!is_strided(v.md)) {
    Dims xs(x.size());
    int64_t stride = 1;
    for (size_t k = perm.size(); k-- > 0;) {
      xs[perm[k]] = stride;
      stride *= x[perm[k]];
    }
    src = as_md(n.in[0], strided_md(x, xs, v.md.data_type()));
  }
  Dims st = md_strides(src.md), yd(x.size()), ys(x.size());
  for (size_t k = 0; k < perm.size(); ++k) {
    yd[k] = x[perm[k]];
    ys[k] = st[perm[k]];
  }
  Val o = src;
  o.md = strided_md(yd, ys, src.md.data_type());
  if (is_plain_dense(o.md)) o.md = plain_md(yd);
  p_->bufs[o.buf].values++;
  vals_[n.out[0]] = o;
}

// Cast between f32 and bf16: the value converted in its own layout (a strided view: into plain memory).
void Builder::cast(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  const Val v = val(n.in[0]);
  if (v.scale != 1.f) throw Reject{"scaled input"};
  const dt from = v.md.data_type();
  if ((from != dt::f32 && from != dt::bf16) || n.out.size() != 1) throw Reject{"Cast other than f32 <-> bf16"};
  if (from == act_) {  // a no-op Cast: a view
    p_->bufs[v.buf].values++;
    vals_[n.out[0]] = v;
    return;
  }
  md_t out = is_strided(v.md) ? plain_md(md_dims(v.md)) : with_dtype(v.md, act_);
  Val& o = define(n.out[0], out);
  dnnl::memory a = mem_of(v), b = mem_of(o);
  exec(dnnl::reorder(a, b), {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}});
}

// Slice with constant starts/ends/axes and step 1: a strided view.
void Builder::slice(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  Dims x = dims_of(n.in[0]);
  const int64_t rank = static_cast<int64_t>(x.size());
  const ConstT *st = cst(n.in_at(1)), *en = cst(n.in_at(2));
  const ConstT* ax = n.in_at(3).empty() ? nullptr : cst(n.in_at(3));
  const ConstT* sp = n.in_at(4).empty() ? nullptr : cst(n.in_at(4));
  if (!st || !en || (!n.in_at(3).empty() && !ax) || (!n.in_at(4).empty() && !sp)) throw Reject{"non-constant Slice"};
  Dims y = x, off(rank, 0);
  for (int64_t k = 0; k < st->count(); ++k) {
    int64_t a = ax ? ax->iat(k) : k;
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) throw Reject{"axis"};
    if (sp && sp->iat(k) != 1) throw Reject{"step other than 1"};
    int64_t b = st->iat(k), e = en->iat(k), d = x[a];
    if (b < 0) b += d;
    if (e < 0) e += d;
    b = std::clamp<int64_t>(b, 0, d);
    e = std::clamp<int64_t>(e, 0, d);
    if (e <= b) throw Reject{"empty slice"};
    y[a] = e - b;
    off[a] = b;
  }
  const Val v = val(n.in[0]);
  if (v.scale != 1.f) throw Reject{"scaled input"};
  Val src = is_strided(v.md) ? v : as_plain(n.in[0]);
  Dims sst = md_strides(src.md);
  int64_t offset = 0;
  for (int64_t k = 0; k < rank; ++k) offset += off[k] * sst[k];
  Val o = src;
  o.md = strided_md(y, sst, src.md.data_type());
  o.off = src.off + static_cast<uint64_t>(offset) * elem_size(src.md);
  if (is_plain_dense(o.md)) o.md = plain_md(y);
  p_->bufs[o.buf].values++;
  vals_[n.out[0]] = o;
}

// ------------------------------------------------------------------------------------------------- int8 steps
//
// keel.QConv and keel.QGemm (what fuse_qdq makes of QDQ models) as steps of the chain, built with the set-up of the
// standalone kernels (kernels/int8.h: the same parameters, primitive descriptors, post-ops, own depthwise kernel and
// quantization loops), so that consecutive int8 layers run without a dispatch per node:
//   - u8/s8 activations stay in the primitives' channels-last layout from step to step;
//   - an f32 X (a QuantizeLinear fuse_qdq folded into its reader: the fp32 -> int8 boundary, a residual stream) is
//     quantized straight from its producer's layout (the plugin's own loops from plain, channels-last or nChw16c
//     memory; else one oneDNN quantizing reorder), once for all readers with the same scale and zero point;
//   - Z (a folded residual Add) is read channels-last, the layout the primitive adds it in; an f32 output stays in
//     the primitive's layout for its readers in the chain (GlobalAveragePool, MaxPool read it there);
//   - values the graph holds channels-last (Recipe::channels_last) cross the chain's boundary in that layout.

QNodeView Builder::qnode_view(const NodeDesc& n) const {
  QNodeView v;
  v.in.resize(n.in.size());
  for (size_t k = 0; k < n.in.size(); ++k) {
    const std::string& name = n.in[k];
    QInputView& x = v.in[k];
    if (name.empty()) continue;
    x.present = true;
    if (const ConstT* c = cst(name)) {
      x.dtype = c->dtype;
      x.dims = c->dims;
      x.dims_known = true;
      x.data = c->bytes.empty() ? nullptr : c->bytes.data();
      continue;
    }
    if (auto t = r_.dtypes.find(name); t != r_.dtypes.end()) x.dtype = t->second;
    if (auto d = r_.dims.find(name); d != r_.dims.end()) x.dims = d->second, x.dims_known = true;
  }
  if (auto t = r_.dtypes.find(n.out.empty() ? std::string() : n.out[0]); t != r_.dtypes.end()) v.out_dtype = t->second;
  v.activation = n.as("activation", "");
  if (auto a = n.attrs.find("activation_params"); a != n.attrs.end() && a->second.kind == KEEL_ATTR_FLOATS) {
    v.has_activation_params = true;
    v.activation_params = a->second.floats;
  }
  return v;
}

// A boundary value's layout: channels-last where the graph holds it so (an int8 region's value), else plain.
md_t Builder::boundary_md(const std::string& name, const Dims& d, dt t) const {
  if (r_.channels_last.count(name) && d.size() >= 3 && d.size() <= 5)
    return md_t(to_dnnl(d), t, channels_last_tag(d.size()));
  return plain_md(d, t);
}

// An s32 scalar the plan owns (a primitive's runtime zero point).
dnnl::memory Builder::zero_point_mem(int32_t v) {
  p_->owned.emplace_back(md_t({1}, dt::s32, tag::a), engine());
  *static_cast<int32_t*>(p_->owned.back().get_data_handle()) = v;
  return p_->owned.back();
}

// Whether every reader of `v` in the claim is a QConv of rank `rank` reading it as its X only (and there is one).
bool Builder::qconv_x_only(const std::string& v, size_t rank) {
  const auto& us = users(v);
  for (size_t u : us) {
    const NodeDesc& c = r_.nodes[u];
    if (c.op != "QConv" || c.in.empty() || c.in[0] != v || std::count(c.in.begin(), c.in.end(), v) != 1) return false;
    const ConstT* w = cst(c.in_at(1));
    if (!w || w->dims.size() != rank) return false;
  }
  return !us.empty();
}

// The f32 value `name` quantized with q's x_scale and x_zero_point into `want` (u8/s8): one step the first time,
// shared by later readers with the same parameters and layout. The arithmetic is the standalone kernels' (x * (1 /
// x_scale), rounded half to even, plus the zero point, saturated), so the bytes are theirs.
Val Builder::quantized(const std::string& name, const QuantSetup& q, const md_t& want) {
  const Val v = val(name);
  if (v.scale != 1.f) throw Reject{"a scaled view read by an int8 step"};
  if (v.md.data_type() != dt::f32) throw Reject{"X is not f32"};
  const QuantizeSpec spec = q.quantize_spec();
  std::string key = name + "#q";
  key.append(reinterpret_cast<const char*>(&spec), sizeof spec);
  key.append(reinterpret_cast<const char*>(&want.data), sizeof want.data);
  key = name + "#q" + std::to_string(std::hash<std::string>()(key));
  if (auto it = vals_.find(key); it != vals_.end()) return it->second;
  const Dims d = md_dims(want);
  const int64_t n = numel(d), N = d.empty() ? 1 : d[0], C = d.size() > 1 ? d[1] : 1;
  const int64_t S = N * C > 0 ? n / (N * C) : 0;
  const bool to_last = d.size() >= 3 && want == md_t(want.dims(), want.data_type(), channels_last_tag(d.size()));
  Int8QuantizeStep st;
  st.q = spec;
  st.n = n, st.N = N, st.C = C, st.S = S;
  const char* how = nullptr;
  if (int8_own_kernels()) {
    if (with_dtype(v.md, want.data_type()) == want && v.md.get_size() == static_cast<size_t>(n) * sizeof(float)) {
      st.kind = Int8QuantizeStep::Kind::kSame, how = "own_quantize:avx512";
    } else if (to_last && is_plain_dense(v.md) && C % 4 == 0) {
      // (Whole groups of 4 channels only: see kernels/int8.cc.)
      st.kind = Int8QuantizeStep::Kind::kToNhwc, how = "own_quantize_to_nhwc:avx512";
    } else if (to_last && v.md == md_t(v.md.dims(), dt::f32, blocked16_tag(d.size()))) {
      st.kind = Int8QuantizeStep::Kind::kBlocked, how = "own_quantize_nChw16c_to_nhwc:avx512";
    }
  }
  Val& dst = define(key, want);
  if (how) {
    Exec e;
    e.own = run_int8_quantize;
    e.own_kind = "reorder";
    e.params = std::make_shared<const Int8QuantizeStep>(st);
    e.args = {{DNNL_ARG_SRC, mem_of(v)}, {DNNL_ARG_DST, mem_of(dst)}};
    exec_own(std::move(e), how, false, r_.nodes[cur_node_].name + " quantize " + dims_str(d));
    return dst;
  }
  dnnl::primitive_attr a = user_scratchpad();
  a.set_output_scales(0, {spec.inv_scale});
  if (spec.zero != 0) a.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
  dnnl::reorder::primitive_desc pd(engine(), v.md, engine(), want, a);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_FROM, mem_of(v)}, {DNNL_ARG_TO, mem_of(dst)}};
  if (spec.zero != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST] = zero_point_mem(spec.zero);
  exec(dnnl::reorder(pd), std::move(args));
  return dst;
}

// A QConv's f32 residual Z in channels-last (the layout the int8 primitive adds it in): from an fp32 step's
// nChw16c / nCdhw16c / nCw16c by the plugin's own copy (blocked16_to_nhwc_f32, one step shared by later readers),
// else as as_md() reorders it.
Val Builder::residual_last(const std::string& name, const Dims& y) {
  const md_t want(to_dnnl(y), dt::f32, channels_last_tag(y.size()));
  const Val v = val(name);
  if (v.scale != 1.f || v.md == want || !int8_own_kernels() || v.md != md_t(to_dnnl(y), dt::f32, blocked16_tag(y.size())))
    return as_md(name, want);
  const std::string key = name + "#z_last";
  if (auto it = vals_.find(key); it != vals_.end()) return it->second;
  Int8QuantizeStep st;
  st.N = y[0], st.C = y[1], st.S = numel(y) / std::max<int64_t>(1, y[0] * y[1]);
  st.kind = Int8QuantizeStep::Kind::kBlockedF32;
  Val& dst = define(key, want);
  Exec e;
  e.own = run_int8_quantize;
  e.own_kind = "reorder";
  e.params = std::make_shared<const Int8QuantizeStep>(st);
  e.args = {{DNNL_ARG_SRC, mem_of(v)}, {DNNL_ARG_DST, mem_of(dst)}};
  layout_reorder_ = true;
  exec_own(std::move(e), "own_nChw16c_to_nhwc_f32:avx512", true, r_.nodes[cur_node_].name + " Z " + dims_str(y));
  layout_reorder_ = false;
  return dst;
}

// keel.QConv (1-D, 2-D or 3-D; lift_1d leaves QConvs alone, a 1-D one runs as a 1-D primitive): the own depthwise
// kernel where it applies (as the standalone kernel decides), else oneDNN's int8 convolution with the standalone
// kernel's primitive descriptor, over channels-last nwc / nhwc / ndhwc bytes.
void Builder::qconv(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.out.size() != 1 || n.in.size() < 6 || n.in.size() > 9 || n.in[0].empty() || is_const(n.in[0]))
    throw Reject{"QConv's inputs"};
  const ConstT* W = cst(n.in_at(1));
  if (!W || W->dtype != KEEL_DTYPE_I8) throw Reject{"non-constant weights"};
  const size_t sp = W->dims.size() >= 2 ? W->dims.size() - 2 : 0;
  QConvGeom g;
  g.read(W->dims, n.ai("group", 1), n.as("auto_pad", "NOTSET"), n.ais("strides", Dims(sp, 1)),
         n.ais("dilations", Dims(sp, 1)), n.ais("pads", Dims(2 * sp, 0)));
  // 1-D, 2-D and 3-D: the same primitive over channels-last nwc / nhwc / ndhwc bytes (the own depthwise kernel is
  // 2-D only: int8_own_depthwise declines the others).
  if (g.rank < 3 || g.rank > 5) throw Reject{"1-D, 2-D or 3-D int8 convolutions only"};
  QuantSetup q;
  q.read(qnode_view(n), W->dims[0]);
  q.residual = !n.in_at(8).empty();
  if (q.residual && (r_.dtypes.count(n.in[8]) == 0 || r_.dtypes.at(n.in[8]) != KEEL_DTYPE_F32))
    throw Reject{"Z must be f32"};
  const Dims x = dims_of(n.in[0]);
  const Dims y = g.out_dims(x);
  const int8_t* w = reinterpret_cast<const int8_t*>(W->bytes.data());
  const dt xt = int8_dnnl_type(q.x_type), yt = int8_dnnl_type(q.y_type);
  const int64_t M = W->dims[0];
  const tag last = channels_last_tag(g.rank);
  double taps = 1;
  for (size_t k = 2; k < W->dims.size(); ++k) taps *= static_cast<double>(W->dims[k]);
  p_->flops += 2.0 * static_cast<double>(numel(y)) * static_cast<double>(x[1] / g.group) * taps;
  // An f32 X (the fp32 -> int8 boundary in front of a depthwise layer) is quantized into channels-last bytes by a
  // step of its own first (quantized()), so that the own kernel serves it too (the standalone kernel leaves it to
  // oneDNN's brdgmm_dw, 1.5-2x slower at 56x56).
  QuantSetup qk = q;
  qk.x_f32 = false;
  if (auto dw = int8_own_depthwise(qk, g, w, x, y, true, true)) {
    const md_t x_last(to_dnnl(x), xt, tag::nhwc);
    const Val sv = q.x_f32 ? quantized(n.in[0], q, x_last) : as_md(n.in[0], x_last);
    Val& out = define(n.out[0], md_t(to_dnnl(y), yt, tag::nhwc));
    Exec e;
    e.own = run_int8_depthwise;
    e.own_kind = "convolution";
    e.params = std::shared_ptr<const Int8Depthwise3x3>(std::move(dw));
    e.args = {{DNNL_ARG_SRC, mem_of(sv)}, {DNNL_ARG_DST, mem_of(out)}};
    exec_own(std::move(e), "own_int8_dw:avx512_vnni", false, n.name + " " + dims_str(x) + " -> " + dims_str(y));
    return;
  }
  auto pd = qconv_primitive_desc(q, g, x, y, q.residual ? last : tag::any);
  const Val sv = q.x_f32 ? quantized(n.in[0], q, pd.src_desc()) : as_md(n.in[0], pd.src_desc());
  std::unordered_map<int, dnnl::memory> args;
  const md_t wplain(to_dnnl(g.dnnl_weight_dims(x[1])), dt::s8, g.plain_weight_tag());
  p_->owned.push_back(int8_prepack(wplain, pd.weights_desc(), w, p_->weights.alloc(pd.weights_desc().get_size())));
  args[DNNL_ARG_WEIGHTS] = p_->owned.back();
  if (!q.bias.empty()) {
    p_->owned.push_back(int8_bias_memory(q.bias, md_t({M}, dt::f32, tag::a)));
    args[DNNL_ARG_BIAS] = p_->owned.back();
  }
  if (q.residual) {
    const Val zv = residual_last(n.in[8], y);
    args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1] = mem_of(zv);
  }
  if (q.x_zero != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC] = zero_point_mem(q.x_zero);
  if (q.y_zero != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST] = zero_point_mem(q.y_zero);
  Val& out = define(n.out[0], pd.dst_desc());
  args[DNNL_ARG_SRC] = mem_of(sv);
  args[DNNL_ARG_DST] = mem_of(out);
  exec(dnnl::convolution_forward(pd), std::move(args));
}

// keel.QGemm: A [..., K] (plain; quantized first when f32) x constant B -> [..., N] (plain), the standalone kernel's
// matmul.
void Builder::qgemm(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.out.size() != 1 || n.in.size() < 6 || n.in.size() > 8 || n.in[0].empty() || is_const(n.in[0]))
    throw Reject{"QGemm's inputs"};
  const ConstT* B = cst(n.in_at(1));
  if (!B || B->dtype != KEEL_DTYPE_I8 || B->dims.size() != 2) throw Reject{"non-constant 2-D B"};
  const bool tb = n.ai("transB", 0) != 0;
  const int64_t K = tb ? B->dims[1] : B->dims[0], N = tb ? B->dims[0] : B->dims[1];
  QuantSetup q;
  q.read(qnode_view(n), N);
  const Dims a = dims_of(n.in[0]);
  if (a.size() < 2 || a.back() != K) throw Reject{"A's last dimension differs from B's K"};
  const int64_t M = numel(a) / K;
  Dims yd(a.begin(), a.end() - 1);
  yd.push_back(N);
  const dt xt = int8_dnnl_type(q.x_type), yt = int8_dnnl_type(q.y_type);
  auto pd = qgemm_primitive_desc(q, M, K, N);
  if (pd.src_desc() != md_t({M, K}, xt, tag::ab) || pd.dst_desc() != md_t({M, N}, yt, tag::ab))
    throw Reject{"the int8 matmul wants other layouts"};
  const md_t a_plain = plain_md(a, xt);
  const Val sv = q.x_f32 ? quantized(n.in[0], q, a_plain) : as_md(n.in[0], a_plain);
  std::unordered_map<int, dnnl::memory> args;
  p_->owned.push_back(int8_prepack(md_t({K, N}, dt::s8, tb ? tag::ba : tag::ab), pd.weights_desc(),
                                   reinterpret_cast<const int8_t*>(B->bytes.data()),
                                   p_->weights.alloc(pd.weights_desc().get_size())));
  args[DNNL_ARG_WEIGHTS] = p_->owned.back();
  if (!q.bias.empty()) {
    p_->owned.push_back(int8_bias_memory(q.bias, md_t({1, N}, dt::f32, tag::ab)));
    args[DNNL_ARG_BIAS] = p_->owned.back();
  }
  if (q.x_zero != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC] = zero_point_mem(q.x_zero);
  if (q.y_zero != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST] = zero_point_mem(q.y_zero);
  Val& out = define(n.out[0], plain_md(yd, yt));
  args[DNNL_ARG_SRC] = mem_at(pd.src_desc(), sv.buf, sv.off);
  args[DNNL_ARG_DST] = mem_at(pd.dst_desc(), out.buf, out.off);
  p_->flops += 2.0 * M * K * N;
  exec(dnnl::matmul(pd), std::move(args));
}

// QuantizeLinear / DequantizeLinear with a constant scalar scale and zero point (what fuse_qdq leaves of a QDQ
// model: a QuantizeLinear several int8 nodes read, a DequantizeLinear in front of an fp32 reader), element-wise in
// the layout their input has: the arithmetic of the standalone kernel (kernels/int8.cc's QdqKernel, a oneDNN
// reorder; a QuantizeLinear on the plugin's own loop where quantized() takes it, the same rounding).
void Builder::qdq(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  const bool quant = n.op == "QuantizeLinear";
  const ConstT* s = cst(n.in_at(1));
  const ConstT* z = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (n.out.size() != 1 || !s || s->dtype != KEEL_DTYPE_F32 || s->count() != 1 || (!n.in_at(2).empty() && !z) ||
      (z && z->count() != 1))
    throw Reject{"a per-tensor constant scale and zero point only"};
  const float scale = s->f32()[0];
  if (!(scale > 0) || !std::isfinite(scale)) throw Reject{"scale must be positive"};
  int32_t zero = 0, qtype = z ? z->dtype : KEEL_DTYPE_U8;
  if (qtype == KEEL_DTYPE_U8 && z) zero = static_cast<uint8_t>(z->bytes[0]);
  else if (qtype == KEEL_DTYPE_I8 && z) zero = static_cast<int8_t>(z->bytes[0]);
  else if (qtype != KEEL_DTYPE_U8 && qtype != KEEL_DTYPE_I8) throw Reject{"zero point of another type than u8/s8"};
  const Val xv = val(n.in[0]);
  auto ot = r_.dtypes.find(n.out[0]);
  if (quant) {
    if (ot == r_.dtypes.end() || ot->second != qtype) throw Reject{"output type differs from the zero point's"};
    QuantSetup q;
    q.x_scale = scale, q.x_zero = zero, q.x_type = qtype;
    // Read only by QConvs, as their X (fuse_qdq leaves such a QuantizeLinear where several QConvs read it, e.g. a
    // ResNet block's input read by its first 3x3 and the downsampling 1x1): written channels-last straight away, the
    // layout the int8 convolutions read, instead of in X's layout and then reordered for them.
    md_t want = with_dtype(xv.md, int8_dnnl_type(qtype));
    const Dims d = md_dims(xv.md);
    if (d.size() >= 3 && d.size() <= 5 && qconv_x_only(n.out[0], d.size()) &&
        (!escapes(n.out[0]) || r_.channels_last.count(n.out[0])))
      want = md_t(to_dnnl(d), int8_dnnl_type(qtype), channels_last_tag(d.size()));
    Val v = quantized(n.in[0], q, want);
    p_->bufs[v.buf].values++;  // the node's output is that value
    vals_[n.out[0]] = v;
    return;
  }
  if (xv.md.data_type() != int8_dnnl_type(qtype) || ot == r_.dtypes.end() || ot->second != KEEL_DTYPE_F32)
    throw Reject{"u8/s8 -> f32 only, the zero point's type"};
  dnnl::primitive_attr a = user_scratchpad();
  a.set_output_scales(0, {scale});
  if (zero != 0) a.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  Val& out = define(n.out[0], with_dtype(xv.md, dt::f32));
  dnnl::reorder::primitive_desc pd(engine(), xv.md, engine(), out.md, a);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_FROM, mem_of(xv)}, {DNNL_ARG_TO, mem_of(out)}};
  if (zero != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC] = zero_point_mem(zero);
  exec(dnnl::reorder(pd), std::move(args));
}

// ------------------------------------------------------------------------------------------- the claim's state

const char* kind_name(dnnl::primitive::kind k);
// The kind of a step for logs and the profile: the primitive's; for the plugin's own steps their own_kind, else
// "eltwise".
const char* step_kind(const Exec& e) {
  return e.own ? (e.own_kind ? e.own_kind : "eltwise") : kind_name(e.prim.get_kind());
}

struct Chain {
  Recipe recipe;
  std::unique_ptr<Plan> plan;
  // KEEL_ONEDNN_PROFILE=1: time per primitive kind and implementation, and each step's fastest run (robust on a
  // busy machine), logged (info) when the session goes.
  std::map<std::string, std::pair<double, int64_t>> profile;
  std::vector<double> step_min;
  std::vector<std::vector<double>> step_ms;  // every run's time per step (the medians)
  int64_t runs = 0;
  ~Chain() {
    if (profile.empty() || runs == 0) return;
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (auto& [k, v] : profile) rows.emplace_back(v.first, k), total += v.first;
    std::sort(rows.rbegin(), rows.rend());
    std::ostringstream os;
    os.setf(std::ios::fixed);
    os.precision(3);
    os << recipe.name << ": " << total / runs << " ms per run in primitives (" << runs << " runs)";
    for (auto& [ms, k] : rows)
      os << "\n  " << ms / runs << " ms  " << 100.0 * ms / total << "%  x" << profile[k].second / runs << "  " << k;
    if (plan && step_min.size() == plan->execs.size()) {
      std::vector<double> med(step_min.size(), 0.0);
      for (size_t k = 0; k < step_ms.size() && k < med.size(); ++k)
        if (!step_ms[k].empty()) {
          auto& v = step_ms[k];
          std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
          med[k] = v[v.size() / 2];
        }
      double sum = 0, msum = 0;
      for (size_t k = 0; k < step_min.size(); ++k) sum += step_min[k], msum += med[k];
      os << "\n  steps, fastest / median run of each (sums " << sum << " / " << msum << " ms):";
      for (size_t k = 0; k < step_min.size(); ++k)
        os << "\n  " << std::setw(3) << k << " " << std::setw(8) << step_min[k] << " " << std::setw(8) << med[k]
           << " ms  " << (plan->execs[k].single ? "1t " : "   ") << step_kind(plan->execs[k]) << " "
           << plan->impls[k] << "  " << plan->what[k];
    }
    if (g_host && g_host->log) g_host->log(g_plugin_handle, KEEL_LOG_INFO, os.str().c_str());
  }
};

const char* kind_name(dnnl::primitive::kind k) {
  switch (k) {
    case dnnl::primitive::kind::reorder: return "reorder";
    case dnnl::primitive::kind::concat: return "concat";
    case dnnl::primitive::kind::convolution: return "convolution";
    case dnnl::primitive::kind::eltwise: return "eltwise";
    case dnnl::primitive::kind::softmax:
    case dnnl::primitive::kind::softmax_v2: return "softmax";
    case dnnl::primitive::kind::pooling:
    case dnnl::primitive::kind::pooling_v2: return "pooling";
    case dnnl::primitive::kind::batch_normalization: return "batch_normalization";
    case dnnl::primitive::kind::layer_normalization: return "layer_normalization";
    case dnnl::primitive::kind::matmul: return "matmul";
    case dnnl::primitive::kind::binary: return "binary";
    case dnnl::primitive::kind::resampling: return "resampling";
    default: return "other";
  }
}

// A chain this small runs on one thread: a team of two waits for its second thread longer than the work takes
// whenever the machine is busy (measured: 0.05 ms runs turning into 30 ms ones on a loaded 2-core machine).
constexpr double kOneThreadFlops = 8e6;

void run_chain(Chain& ch, Ctx& c) {
  const int team = omp_get_max_threads();
  const bool one = ch.plan && ch.plan->flops < kOneThreadFlops && team > 1;
  if (one) omp_set_num_threads(1);
  struct Restore {
    bool on;
    int n;
    ~Restore() {
      if (on) omp_set_num_threads(n);
    }
  } restore{one, team};
  // The claim's plan took its convolutions untimed (the session's team was not known then): on the team it was built
  // for, time them now and rebuild only when one of them picks another implementation; on another team, rebuild.
  // (A 1-thread session used to time every such convolution twice, once for the claim's default team.)
  if (ch.plan && ch.plan->threads == omp_get_max_threads() && !ch.plan->deferred.empty()) {
    bool same = true;
    for (const DeferredPick& d : ch.plan->deferred)
      same = fastest_conv_remembered(d.cands, engine(), stream(), d.margins) == 0 && same;
    if (same) ch.plan->deferred.clear();
    else ch.plan.reset();
  }
  if (!ch.plan || ch.plan->threads != omp_get_max_threads()) ch.plan = Builder(ch.recipe).build();
  Plan& p = *ch.plan;
  std::vector<void*> base(p.bufs.size(), nullptr);
  void* ws = p.ws_bytes ? c.workspace(p.ws_bytes) : nullptr;
  for (size_t b = 0; b < p.bufs.size(); ++b) {
    const Buf& x = p.bufs[b];
    switch (x.kind) {
      case BufKind::kWorkspace: base[b] = static_cast<char*>(ws) + x.offset; break;
      case BufKind::kInput: {
        const keel_tensor_t* t = c.input(x.index);
        if (!t || !t->data) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "claimed subgraph: input missing"};
        base[b] = t->data;
        break;
      }
      case BufKind::kOutput: base[b] = c.output(x.index, p.out_dims[x.index])->data; break;
      case BufKind::kOwned: base[b] = nullptr; break;
    }
  }
  for (size_t k = 0; k < p.out_consts.size(); ++k)
    if (const ConstT* cst = p.out_consts[k]) {
      keel_tensor_t* t = c.output(static_cast<int>(k), cst->dims);
      std::memcpy(t->data, cst->bytes.data(), std::min<uint64_t>(t->byte_size, cst->bytes.size()));
    }
  bool changed = false;
  for (size_t b = 0; b < base.size(); ++b) changed = changed || base[b] != p.last_base[b];
  if (changed) {
    for (auto& bd : p.binds)
      if (bd.buf >= 0 && p.bufs[bd.buf].kind != BufKind::kOwned)
        bd.mem.set_data_handle(static_cast<char*>(base[bd.buf]) + bd.offset);
    p.last_base = base;
  }
  auto& s = stream();
  const int team_n = omp_get_max_threads();
  int cur = team_n;
  auto threads_for = [&](const Exec& e) {
    int want = e.single ? 1 : team_n;
    if (want != cur) {
      s.wait();
      omp_set_num_threads(want);
      cur = want;
    }
  };
  struct Back {
    int& cur;
    int team_n;
    ~Back() {
      if (cur != team_n) omp_set_num_threads(team_n);
    }
  } back{cur, team_n};
  // The session profiles this run (ABI 1.3): time each primitive and report it with the nodes it computes.
  const keel_kernel_api_t* kapi = g_host->kernel;
  const bool report = KEEL_HAS_MEMBER(kapi, keel_kernel_api_t, profile_step) && kapi->profiling &&
                      kapi->profile_step && kapi->profiling(c.raw()) != 0;
  if (g_options.profile || report) {
    for (size_t k = 0; k < p.execs.size(); ++k) {
      threads_for(p.execs[k]);
      auto t0 = std::chrono::steady_clock::now();
      run_step(p.execs[k], s);
      s.wait();
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (report) {
        keel_profile_step_t st;
        std::memset(&st, 0, sizeof st);
        st.struct_size = sizeof st;
        st.kind = step_kind(p.execs[k]);
        st.implementation = p.impls[k].c_str();
        st.op_type = k < p.step_op.size() ? p.step_op[k] : "";
        if (k < p.step_nodes.size()) {
          st.node_names = p.step_nodes[k].data();
          st.node_count = p.step_nodes[k].size();
        }
        st.time_ms = ms;
        keel_status_release(kapi->profile_step(c.raw(), &st));
      }
      if (!g_options.profile) continue;
      auto& row = ch.profile[std::string(step_kind(p.execs[k])) + " " + p.impls[k]];
      row.first += ms;
      row.second++;
      if (ch.step_min.size() != p.execs.size()) ch.step_min.assign(p.execs.size(), 1e30), ch.step_ms.clear();
      ch.step_min[k] = std::min(ch.step_min[k], ms);
      ch.step_ms.resize(p.execs.size());
      ch.step_ms[k].push_back(ms);
    }
    if (g_options.profile) ch.runs++;
    return;
  }
  for (auto& e : p.execs) {
    threads_for(e);
    run_step(e, s);
  }
  s.wait();
}

keel_status_t status_of(int32_t code, const std::string& msg) { return g_host->status_create(code, msg.c_str()); }

keel_status_t chain_compute(void* state, keel_kernel_context_t* ctx) {
  try {
    Ctx c(ctx);
    set_threads(c.thread_count());
    run_chain(*static_cast<Chain*>(state), c);
    return nullptr;
  } catch (const Failure& f) {
    return status_of(f.code, f.message);
  } catch (const Reject& r) {
    return status_of(KEEL_STATUS_INTERNAL, "claimed subgraph: " + r.why);
  } catch (const NodeReject& r) {
    return status_of(KEEL_STATUS_INTERNAL, "claimed subgraph: " + r.why);
  } catch (const dnnl::error& e) {
    return status_of(KEEL_STATUS_INTERNAL, std::string("oneDNN: ") + e.what());
  } catch (const std::exception& e) {
    return status_of(KEEL_STATUS_INTERNAL, e.what());
  }
}
void chain_release(void* state) { delete static_cast<Chain*>(state); }

// ------------------------------------------------------------------------------------------------ claim time

using G = keel_graph_t;

struct GraphScan {
  const G* g;
  const keel_graph_api_t* api;
  std::vector<keel_node_id_t> order;
  std::map<keel_node_id_t, size_t> pos;

  std::string op(keel_node_id_t n) const { return api->node_op_type(g, n); }
  std::vector<std::string> ins(keel_node_id_t n) const {
    std::vector<std::string> v;
    for (size_t i = 0; i < api->node_input_count(g, n); ++i) v.emplace_back(api->node_input(g, n, i));
    return v;
  }
  std::vector<std::string> outs(keel_node_id_t n) const {
    std::vector<std::string> v;
    for (size_t i = 0; i < api->node_output_count(g, n); ++i) v.emplace_back(api->node_output(g, n, i));
    return v;
  }
  bool info(const std::string& v, int32_t* dtype, Dims* d) const {
    int64_t buf[16];
    int32_t nd = -1;
    if (!api->value_info(g, v.c_str(), dtype, &nd, buf, 16)) return false;
    if (nd < 0 || nd > 16) return false;
    d->assign(buf, buf + nd);
    for (int64_t x : *d)
      if (x < 0) return false;
    return true;
  }
  std::vector<keel_node_id_t> consumers(const std::string& v) const {
    std::vector<keel_node_id_t> ids(64);
    size_t n = api->value_consumers(g, v.c_str(), ids.data(), ids.size());
    if (n > ids.size()) {
      ids.resize(n);
      api->value_consumers(g, v.c_str(), ids.data(), ids.size());
    }
    ids.resize(n);
    return ids;
  }
  bool dtype(const std::string& v, int32_t* t) const {
    int64_t buf[16];
    int32_t nd = -1;
    return api->value_info(g, v.c_str(), t, &nd, buf, 16) != 0;
  }
  bool producer(const std::string& v, keel_node_id_t* p) const { return !v.empty() && api->value_producer(g, v.c_str(), p); }
  NodeDesc desc(keel_node_id_t n) const {
    NodeDesc d;
    d.id = n;
    d.op = op(n);
    d.name = api->node_name(g, n);
    d.in = ins(n);
    d.out = outs(n);
    for (size_t i = 0; i < api->node_attr_count(g, n); ++i) {
      std::string name = api->node_attr_name(g, n, i);
      Attr a;
      a.kind = api->node_attr_kind(g, n, name.c_str());
      const int64_t* is;
      const float* fs;
      const char* s;
      size_t cnt;
      switch (a.kind) {
        case KEEL_ATTR_INT: api->node_attr_int(g, n, name.c_str(), &a.i); break;
        case KEEL_ATTR_FLOAT: api->node_attr_float(g, n, name.c_str(), &a.f); break;
        case KEEL_ATTR_STRING: if (api->node_attr_string(g, n, name.c_str(), &s)) a.s = s; break;
        case KEEL_ATTR_INTS: if (api->node_attr_ints(g, n, name.c_str(), &is, &cnt)) a.ints.assign(is, is + cnt); break;
        case KEEL_ATTR_FLOATS: if (api->node_attr_floats(g, n, name.c_str(), &fs, &cnt)) a.floats.assign(fs, fs + cnt); break;
        default: break;
      }
      d.attrs[name] = a;
    }
    return d;
  }
};

const std::set<std::string>& compute_ops() {
  static const std::set<std::string> s{
      "Conv", "ConvTranspose", "BatchNormalization", "Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "Add", "Sub",
      "Mul", "Div", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Concat", "MatMul", "Gemm", "Softmax",
      "LayerNormalization", "Transpose", "Slice", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity",
      "Dropout", "ReduceMean", "Pow", "Sqrt", "Gelu", "Cast", "Pad", "HardSwish", "HardSigmoid", "Resize",
      "Attention"};
  return s;
}
// ai.onnx nodes (but "Attention", which only keel.Attention is here), and the keel ops (ops/schemas.cc) that mean
// what their ai.onnx namesakes mean: keel.Gelu is Gelu-20, keel.LayerNormalization is LayerNormalization-17 for
// older opsets (what fuse_gelu / fuse_layer_norm produce); and keel.Attention (fuse_attention's; Builder::attention).
bool claimable_domain(const char* domain, const std::string& op) {
  if (domain == nullptr || *domain == 0) return op != "Attention";
  return std::strcmp(domain, "keel") == 0 && (op == "Gelu" || op == "LayerNormalization" || op == "Attention");
}
// Ops that only move or view data: a claim needs real work besides them.
bool is_view_op(const std::string& op) {
  return op == "Transpose" || op == "Slice" || op == "Reshape" || op == "Flatten" || op == "Squeeze" ||
         op == "Unsqueeze" || op == "Identity" || op == "Dropout" || op == "Pad";
}

// A constant's host copy; bf16 values are widened to f32 (exactly), which the builder converts back where a bf16
// primitive reads them (weights reordered into its layout, constants read as data).
ConstT const_of(const keel_tensor_t* t) {
  ConstT c;
  c.dtype = t->dtype;
  c.dims.assign(t->dims, t->dims + t->ndim);
  const char* p = static_cast<const char*>(t->data);
  if (t->dtype == KEEL_DTYPE_BF16) {
    c.dtype = KEEL_DTYPE_F32;
    const size_t n = t->byte_size / 2;
    c.bytes.resize(n * sizeof(float));
    for (size_t k = 0; k < n; ++k) {
      const float v = bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[k]);
      std::memcpy(c.bytes.data() + k * sizeof(float), &v, sizeof v);
    }
    return c;
  }
  c.bytes.assign(p, p + t->byte_size);
  return c;
}

// --- int8 nodes at claim time (Builder::qconv / qgemm)

bool int8_op(const char* domain, const std::string& op) {
  if (domain && *domain == 0) return op == "QuantizeLinear" || op == "DequantizeLinear";
  return domain && std::strcmp(domain, "keel") == 0 && (op == "QConv" || op == "QGemm");
}

// An int8 node the chain may take: static shapes, X and Y u8/s8/f32, a 1-D/2-D/3-D QConv with an f32 Z if any; a
// QuantizeLinear / DequantizeLinear of an activation (not of a constant: weights stay constants for the
// convolutions reading them) with a constant scalar scale and zero point. The builder checks the rest; what it cannot
// build stays on the standalone kernel. `is_const`: whether a value is an initializer or a folded constant.
bool int8_candidate(const GraphScan& sc, keel_node_id_t n, const std::function<bool(const std::string&)>& is_const) {
  auto ins = sc.ins(n), outs = sc.outs(n);
  if (outs.size() != 1 || outs[0].empty() || ins.empty() || ins[0].empty()) return false;
  auto ok = [](int32_t t) { return t == KEEL_DTYPE_U8 || t == KEEL_DTYPE_I8 || t == KEEL_DTYPE_F32; };
  int32_t t = 0;
  Dims d;
  if (!sc.info(outs[0], &t, &d) || !ok(t) || numel(d) == 0) return false;
  if (!sc.info(ins[0], &t, &d) || !ok(t)) return false;
  if (sc.op(n) == "QuantizeLinear" || sc.op(n) == "DequantizeLinear") {
    if (is_const(ins[0]) || ins.size() < 2 || ins.size() > 3 || !is_const(ins[1])) return false;
    if (ins.size() == 3 && !ins[2].empty() && !is_const(ins[2])) return false;
    // Only next to an int8 node (a QuantizeLinear a QConv / QGemm reads, a DequantizeLinear of one's output): a QDQ
    // graph run as it is (fuse_qdq off) keeps its fp32 chains as they were.
    auto int8_node = [&](keel_node_id_t m) { return sc.op(m) == "QConv" || sc.op(m) == "QGemm"; };
    if (sc.op(n) == "QuantizeLinear") {
      for (auto u : sc.consumers(outs[0]))
        if (int8_node(u)) return true;
      return false;
    }
    keel_node_id_t p = 0;
    return sc.producer(ins[0], &p) && int8_node(p);
  }
  if (sc.op(n) == "QConv" && (d.size() < 3 || d.size() > 5)) return false;
  if (ins.size() > 8 && !ins[8].empty() && (!sc.info(ins[8], &t, &d) || t != KEEL_DTYPE_F32)) return false;
  return true;
}

// The values fuse_qdq holds channels-last (NHWC bytes under the NCHW shape): a QConv's output with output_layout
// NHWC, its X with input_layout NHWC, its Z with residual_layout NHWC, and the values of the element-wise Add /
// QuantizeLinear nodes such values pass through (fuse_qdq keeps all of those channels-last together).
std::set<std::string> channels_last_values(const GraphScan& sc) {
  std::set<std::string> cl;
  auto attr = [&](keel_node_id_t n, const char* name) {
    const char* v = nullptr;
    return sc.api->node_attr_string(sc.g, n, name, &v) && v ? std::string(v) : std::string();
  };
  for (keel_node_id_t n : sc.order) {
    const char* dom = sc.api->node_domain(sc.g, n);
    if (!dom || std::strcmp(dom, "keel") != 0 || sc.op(n) != "QConv") continue;
    auto ins = sc.ins(n), outs = sc.outs(n);
    const std::string out_l = attr(n, "output_layout");
    if (out_l == "NHWC" && !outs.empty()) cl.insert(outs[0]);
    if (attr(n, "input_layout") == "NHWC" && !ins.empty()) cl.insert(ins[0]);
    const std::string z_l = attr(n, "residual_layout");
    if (ins.size() > 8 && !ins[8].empty() && (z_l == "NHWC" || (z_l.empty() && out_l == "NHWC"))) cl.insert(ins[8]);
  }
  if (cl.empty()) return cl;
  for (bool grew = true; grew;) {
    grew = false;
    for (keel_node_id_t n : sc.order) {
      const char* dom = sc.api->node_domain(sc.g, n);
      const std::string op = sc.op(n);
      if ((dom && *dom) || (op != "Add" && op != "QuantizeLinear")) continue;
      auto vals = sc.ins(n);
      vals.resize(op == "Add" ? std::min<size_t>(vals.size(), 2) : std::min<size_t>(vals.size(), 1));
      for (const auto& o : sc.outs(n)) vals.push_back(o);
      bool any = false;
      for (const auto& v : vals) any = any || cl.count(v);
      if (!any) continue;
      for (const auto& v : vals) grew = cl.insert(v).second || grew;
    }
  }
  return cl;
}

// 1-D convolutions, transposed convolutions and poolings run as 2-D ones: [N,C,L] is [N,C,1,L] (the same bytes, plain
// or blocked), kernel 1xk, stride 1xs, pads (0,b)/(0,e). The lift rewrites the recipe before the plan is built, so
// the 2-D code (algorithms, layouts, post-ops, the residual sum) serves 1-D networks unchanged:
//   - the rank-3 values connected to a 1-D Conv/ConvTranspose/pool through ops that do not care about the rank
//     (BatchNormalization, activations, Add/Sub/Mul/Div, Concat, Identity, Dropout) get rank-4 twins "v@2d";
//   - those nodes read and write the twins; their attributes (kernel_shape, strides, dilations, pads,
//     output_padding, Concat's axis) and constant operands (weights [M,C/g,k] -> [M,C/g,1,k], broadcast constants
//     [C,1] -> [C,1,1]) are lifted with them;
//   - where the rank-3 value itself is needed (a boundary input or output, a reader such as MatMul, Transpose,
//     Softmax), an Identity view joins the two (a reorder to the plain layout when the value is blocked).
void lift_1d(Recipe& r) {
  auto rank3 = [&](const std::string& v) {
    auto d = r.dims.find(v);
    return !v.empty() && !r.consts.count(v) && d != r.dims.end() && d->second.size() == 3;
  };
  auto seed = [&](const NodeDesc& n) {
    static const std::set<std::string> ops{"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
                                           "GlobalMaxPool"};
    if (!ops.count(n.op) || n.in.empty() || n.out.empty() || !rank3(n.in[0]) || !rank3(n.out[0])) return false;
    if (n.op == "Conv" || n.op == "ConvTranspose") {
      auto w = r.consts.find(n.in_at(1));
      if (w == r.consts.end() || w->second.dims.size() != 3) return false;
    }
    return true;
  };
  // The data values (not constants) a liftable node reads and writes; empty when the node is not liftable.
  auto data_of = [&](const NodeDesc& n) -> std::vector<std::string> {
    static const std::set<std::string> unary{"BatchNormalization", "Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh",
                                             "Gelu", "HardSwish", "HardSigmoid", "Identity", "Dropout", "Pad"};
    if (seed(n) || unary.count(n.op)) {
      if (n.in.empty() || n.out.empty() || !rank3(n.in[0]) || !rank3(n.out[0])) return {};
      for (size_t k = 1; k < n.in.size(); ++k)
        if (!n.in[k].empty() && !r.consts.count(n.in[k])) return {};
      for (size_t k = 1; k < n.out.size(); ++k)
        if (!n.out[k].empty()) return {};
      return {n.in[0], n.out[0]};
    }
    if (n.op == "Add" || n.op == "Sub" || n.op == "Mul" || n.op == "Div" || n.op == "Concat") {
      std::vector<std::string> d;
      if (n.out.size() != 1 || !rank3(n.out[0])) return {};
      for (const auto& v : n.in) {
        if (v.empty()) return {};
        if (auto c = r.consts.find(v); c != r.consts.end()) {
          if (n.op == "Concat" || c->second.dims.size() > 3) return {};
          continue;
        }
        if (!rank3(v)) return {};
        d.push_back(v);
      }
      d.push_back(n.out[0]);
      return d;
    }
    return {};
  };
  std::set<std::string> lifted;
  for (const NodeDesc& n : r.nodes)
    if (seed(n) && !data_of(n).empty()) lifted.insert({n.in[0], n.out[0]});
  if (lifted.empty()) return;
  for (bool grew = true; grew;) {
    grew = false;
    for (const NodeDesc& n : r.nodes) {
      auto d = data_of(n);
      bool any = false;
      for (const auto& v : d) any = any || lifted.count(v);
      if (any)
        for (const auto& v : d) grew = lifted.insert(v).second || grew;
    }
  }
  auto twin = [](const std::string& v) { return v + "@2d"; };
  auto up = [](Dims d) {  // [N,C,L] -> [N,C,1,L]
    d.insert(d.begin() + 2, 1);
    return d;
  };
  for (const auto& v : lifted) {
    r.dims[twin(v)] = up(r.dims.at(v));
    if (auto t = r.dtypes.find(v); t != r.dtypes.end()) r.dtypes[twin(v)] = t->second;
  }
  auto lift_const = [&](const std::string& c, bool weights) {
    const ConstT& k = r.consts.at(c);
    Dims d = k.dims;
    if (weights) {
      d.insert(d.begin() + 2, 1);
    } else {  // a broadcast operand of a rank-3 value
      if (d.size() < 2) return c;
      while (d.size() < 3) d.insert(d.begin(), 1);
      d = up(d);
    }
    std::string name = c + (weights ? "@2dw" : "@2d");
    if (!r.consts.count(name)) {
      ConstT t = k;
      t.dims = d;
      r.consts[name] = std::move(t);
    }
    return name;
  };
  auto lift_ints = [](NodeDesc& n, const char* name, int64_t fill, bool pads) {
    auto it = n.attrs.find(name);
    if (it == n.attrs.end() || it->second.kind != KEEL_ATTR_INTS) return;
    Dims& a = it->second.ints;
    if (pads && a.size() == 2) a = {fill, a[0], fill, a[1]};
    else if (!pads && a.size() == 1) a.insert(a.begin(), fill);
  };
  std::set<std::string> produced_by_lifted, needs_rank3;
  std::vector<bool> rewrite(r.nodes.size(), false);
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    auto d = data_of(r.nodes[i]);
    rewrite[i] = !d.empty() && lifted.count(d.front());
    if (rewrite[i])
      for (const auto& o : r.nodes[i].out) produced_by_lifted.insert(o);
    else
      for (const auto& v : r.nodes[i].in)
        if (lifted.count(v)) needs_rank3.insert(v);
  }
  for (const auto& o : r.outputs)
    if (lifted.count(o)) needs_rank3.insert(o);
  std::vector<NodeDesc> out;
  auto view = [&](const NodeDesc& near, const std::string& from, const std::string& to) {
    NodeDesc v;
    v.id = near.id;
    v.op = "Identity";
    v.name = near.name + "/rank";
    v.in = {from};
    v.out = {to};
    out.push_back(std::move(v));
  };
  // Lifted values nobody in the claim produces (boundary inputs): a view at the start.
  for (const auto& v : lifted)
    if (!produced_by_lifted.count(v) && std::find(r.inputs.begin(), r.inputs.end(), v) != r.inputs.end())
      view(r.nodes.front(), v, twin(v));
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    NodeDesc n = r.nodes[i];
    if (rewrite[i]) {
      const bool w = n.op == "Conv" || n.op == "ConvTranspose";
      for (size_t k = 0; k < n.in.size(); ++k) {
        if (lifted.count(n.in[k])) n.in[k] = twin(n.in[k]);
        else if (!n.in[k].empty() && r.consts.count(n.in[k]) && ((w && k == 1) || n.op == "Add" || n.op == "Sub" ||
                                                                 n.op == "Mul" || n.op == "Div"))
          n.in[k] = lift_const(n.in[k], w);
      }
      for (auto& o : n.out)
        if (lifted.count(o)) o = twin(o);
      for (const char* a : {"kernel_shape", "strides", "dilations"}) lift_ints(n, a, 1, false);
      lift_ints(n, "output_padding", 0, false);
      lift_ints(n, "pads", 0, true);
      if (n.op == "Concat") {
        int64_t axis = n.ai("axis", 0);
        if (axis < 0) axis += 3;
        n.attrs["axis"].kind = KEEL_ATTR_INT;
        n.attrs["axis"].i = axis == 2 ? 3 : axis;
      }
    }
    out.push_back(n);
    for (const auto& o : r.nodes[i].out) {
      if (!lifted.count(o)) continue;
      if (rewrite[i] && needs_rank3.count(o)) view(r.nodes[i], twin(o), o);
      else if (!rewrite[i]) view(r.nodes[i], o, twin(o));
    }
  }
  r.nodes = std::move(out);
}

keel_status_t claim_chains(void*, const G* g, const keel_graph_api_t* api, keel_subgraph_sink_t* sink) {
  try {
    GraphScan sc{g, api, {}, {}};
    size_t nn = api->nodes(g, nullptr, 0);
    sc.order.resize(nn);
    api->nodes(g, sc.order.data(), nn);
    for (size_t k = 0; k < nn; ++k) sc.pos[sc.order[k]] = k;

    // 1. Constants.
    std::map<std::string, ConstT> consts;
    std::set<std::string> const_vals;  // known constant (values computed below)
    std::set<keel_node_id_t> const_nodes;
    std::vector<std::string> feed_names;
    std::vector<ConstT> feeds;
    auto is_init = [&](const std::string& v) {
      const keel_tensor_t* t = nullptr;
      return !v.empty() && api->initializer(g, v.c_str(), &t) && t;
    };
    for (keel_node_id_t n : sc.order) {
      std::string op = sc.op(n);
      if (!claimable_domain(api->node_domain(g, n), op)) continue;
      auto ins = sc.ins(n), outs = sc.outs(n);
      if (outs.size() != 1 || outs[0].empty()) continue;
      bool c = false;
      if (op == "Constant") {
        c = true;
      } else if (op == "Shape") {
        int32_t t;
        Dims d;
        if (!ins.empty() && sc.info(ins[0], &t, &d) && api->node_attr_count(g, n) == 0) {
          ConstT s;
          s.dtype = KEEL_DTYPE_I64;
          s.dims = {static_cast<int64_t>(d.size())};
          s.bytes.assign(reinterpret_cast<const char*>(d.data()), reinterpret_cast<const char*>(d.data() + d.size()));
          consts[outs[0]] = s;
          feed_names.push_back(outs[0]);
          feeds.push_back(s);
          const_vals.insert(outs[0]);
          const_nodes.insert(n);
          continue;
        }
      } else if (!ins.empty() && op != "RandomNormal" && op != "RandomUniform" && op != "RandomNormalLike" &&
                 op != "RandomUniformLike" && op != "Loop" && op != "If" && op != "Scan") {
        c = true;
        for (const auto& in : ins) c = c && (in.empty() || is_init(in) || const_vals.count(in));
        int32_t t;
        Dims d;
        c = c && sc.info(outs[0], &t, &d) && numel(d) <= 4096;  // shape arithmetic, not weight transforms
      }
      if (c) {
        const_vals.insert(outs[0]);
        const_nodes.insert(n);
      }
    }
    {
      std::vector<std::string> want;
      for (const auto& v : const_vals)
        if (!consts.count(v)) want.push_back(v);
      if (!want.empty()) {
        std::vector<keel_tensor_t> views(feeds.size());
        std::vector<const keel_tensor_t*> ptrs;
        std::vector<const char*> fnames, wnames;
        for (size_t k = 0; k < feeds.size(); ++k) {
          keel_tensor_t& t = views[k];
          std::memset(&t, 0, sizeof t);
          t.struct_size = sizeof t;
          t.dtype = feeds[k].dtype;
          t.ndim = static_cast<int32_t>(feeds[k].dims.size());
          t.dims = feeds[k].dims.data();
          t.data = feeds[k].bytes.data();
          t.byte_size = feeds[k].bytes.size();
          ptrs.push_back(&t);
          fnames.push_back(feed_names[k].c_str());
        }
        for (const auto& w : want) wnames.push_back(w.c_str());
        std::vector<keel_tensor_t*> outs(want.size(), nullptr);
        keel_status_t st = api->evaluate(g, fnames.data(), ptrs.data(), ptrs.size(), wnames.data(), wnames.size(),
                                         outs.data());
        if (st) {
          // Could not fold: treat none of them as constants.
          keel_status_release(st);
          for (const auto& w : want) const_vals.erase(w);
          for (auto it = const_nodes.begin(); it != const_nodes.end();) {
            auto o = sc.outs(*it);
            it = const_vals.count(o[0]) ? std::next(it) : const_nodes.erase(it);
          }
        } else {
          for (size_t k = 0; k < want.size(); ++k) {
            if (outs[k]) consts[want[k]] = const_of(outs[k]);
            api->release_tensor(outs[k]);
          }
        }
      }
    }

    // 2. Candidates: f32 data, static shapes.
    std::set<keel_node_id_t> cand;
    std::set<std::string> channels_last;  // int8 values the graph holds channels-last
    for (keel_node_id_t n : sc.order) {
      if (const_nodes.count(n)) continue;
      if (int8_op(api->node_domain(g, n), sc.op(n))) {  // int8 steps (Builder::qconv / qgemm)
        if (int8_candidate(sc, n, [&](const std::string& v) { return is_init(v) || consts.count(v) > 0; }))
          cand.insert(n);
        if (channels_last.empty()) channels_last = channels_last_values(sc);
        continue;
      }
      if (!claimable_domain(api->node_domain(g, n), sc.op(n))) continue;
      std::string op = sc.op(n);
      if (!compute_ops().count(op)) continue;
      if (op == "Pad") {  // constant mode, constant pads (and value): a view, or folded into its readers (pad)
        auto ins = sc.ins(n);
        auto constant = [&](const std::string& v) {
          const keel_tensor_t* t = nullptr;
          return consts.count(v) > 0 || (api->initializer(g, v.c_str(), &t) && t);
        };
        const ConstT* pads = nullptr;
        ConstT init;
        const keel_tensor_t* t = nullptr;
        if (ins.size() >= 2 && consts.count(ins[1])) pads = &consts[ins[1]];
        else if (ins.size() >= 2 && api->initializer(g, ins[1].c_str(), &t) && t) init = const_of(t), pads = &init;
        bool ok = pads && (pads->dtype == KEEL_DTYPE_I64 || pads->dtype == KEEL_DTYPE_I32) &&
                  api->node_attr_count(g, n) <= 1 && ins.size() <= 3 && (ins.size() < 3 || ins[2].empty() ||
                                                                        constant(ins[2]));
        for (int64_t k = 0; ok && k < pads->count(); ++k) ok = pads->iat(k) >= 0;
        const char* mode = nullptr;
        if (ok && api->node_attr_string(g, n, "mode", &mode) && mode && std::strcmp(mode, "constant") != 0)
          ok = false;
        if (!ok) continue;
      }
      bool ok = true;
      auto outs = sc.outs(n);
      for (size_t k = 0; k < outs.size() && ok; ++k) {
        if (outs[k].empty()) continue;
        int32_t t;
        Dims d;
        // Slice outputs may have unknown shapes (dynamic starts folded here): computed by the builder.
        if (!sc.info(outs[k], &t, &d))
          ok = k == 0 && (op == "Slice" || op == "Reshape") && sc.dtype(outs[k], &t) &&
               (t == KEEL_DTYPE_F32 || t == KEEL_DTYPE_BF16);
        else ok = (t == KEEL_DTYPE_F32 || t == KEEL_DTYPE_BF16) && numel(d) > 0;
      }
      auto ins = sc.ins(n);
      if (ok && !ins.empty() && !ins[0].empty() && !const_vals.count(ins[0]) && !is_init(ins[0])) {
        int32_t t = 0;
        Dims d;
        if (!sc.dtype(ins[0], &t) || (t != KEEL_DTYPE_F32 && t != KEEL_DTYPE_BF16)) ok = false;
      }
      if (ok) cand.insert(n);
    }

    // 3. Groups: union of candidates through values; constant nodes join when only the group reads them.
    std::map<keel_node_id_t, keel_node_id_t> parent;
    std::function<keel_node_id_t(keel_node_id_t)> find = [&](keel_node_id_t x) {
      while (parent[x] != x) x = parent[x] = parent[parent[x]];
      return x;
    };
    for (auto n : cand) parent[n] = n;
    for (auto n : cand)
      for (const auto& in : sc.ins(n)) {
        keel_node_id_t p;
        if (sc.producer(in, &p) && cand.count(p)) parent[find(n)] = find(p);
      }
    std::set<keel_node_id_t> excluded;
    for (int round = 0; round < 8; ++round) {
      std::map<keel_node_id_t, std::vector<keel_node_id_t>> groups;
      for (auto n : sc.order)
        if (cand.count(n) && !excluded.count(n)) groups[find(n)].push_back(n);
      bool retry = false;
      std::vector<std::pair<std::vector<keel_node_id_t>, std::unique_ptr<Chain>>> ready;
      for (auto& [root, members] : groups) {
        int work = 0;
        for (auto n : members) work += !is_view_op(sc.op(n));
        if (work < 2) continue;
        std::set<keel_node_id_t> mset(members.begin(), members.end());
        // Constant nodes read only by the group (transitively) join it.
        for (size_t k = sc.order.size(); k-- > 0;) {
          keel_node_id_t n = sc.order[k];
          if (!const_nodes.count(n)) continue;
          auto outs = sc.outs(n);
          bool all = !sc.api->value_is_graph_output(g, outs[0].c_str());
          auto cons = sc.consumers(outs[0]);
          all = all && !cons.empty();
          for (auto u : cons) all = all && mset.count(u);
          if (all) mset.insert(n);
        }
        // Convexity: nothing outside reachable from the group may lead back into it.
        std::set<keel_node_id_t> reach;
        std::vector<keel_node_id_t> stack;
        for (auto n : mset)
          for (const auto& o : sc.outs(n))
            for (auto u : sc.consumers(o))
              if (!mset.count(u) && reach.insert(u).second) stack.push_back(u);
        bool convex = true;
        while (!stack.empty() && convex) {
          auto x = stack.back();
          stack.pop_back();
          for (const auto& o : sc.outs(x))
            for (auto u : sc.consumers(o)) {
              if (mset.count(u)) convex = false;
              else if (reach.insert(u).second) stack.push_back(u);
            }
        }
        if (!convex) {
          // Drop the members an outside path comes back to (and retry the rest).
          for (auto x : reach)
            for (const auto& o : sc.outs(x))
              for (auto u : sc.consumers(o))
                if (cand.count(u) && mset.count(u)) excluded.insert(u);
          retry = true;
          continue;
        }
        auto chain = std::make_unique<Chain>();
        Recipe& r = chain->recipe;
        std::vector<keel_node_id_t> ordered(mset.begin(), mset.end());
        std::sort(ordered.begin(), ordered.end(), [&](auto a, auto b) { return sc.pos[a] < sc.pos[b]; });
        std::set<std::string> produced;
        for (auto n : ordered)
          for (const auto& o : sc.outs(n)) produced.insert(o);
        std::map<std::string, int> counts;
        for (auto n : ordered) {
          NodeDesc d = sc.desc(n);
          if (!const_nodes.count(n)) counts[d.op]++;
          for (const auto& v : d.in) {
            if (v.empty()) continue;
            if (!produced.count(v) && std::find(r.inputs.begin(), r.inputs.end(), v) == r.inputs.end())
              r.inputs.push_back(v);
          }
          for (const auto& v : d.out) {
            if (v.empty()) continue;
            bool outside = sc.api->value_is_graph_output(g, v.c_str()) != 0;
            for (auto u : sc.consumers(v)) outside = outside || !mset.count(u);
            if (outside) r.outputs.push_back(v);
          }
          for (const auto& v : d.in) {
            if (v.empty()) continue;
            int32_t t;
            Dims dd;
            const keel_tensor_t* it = nullptr;
            if (api->initializer(g, v.c_str(), &it) && it) {
              if (!r.consts.count(v)) r.consts[v] = const_of(it);
            } else if (consts.count(v)) {
              r.consts[v] = consts[v];
            } else if (sc.info(v, &t, &dd)) {
              r.dims[v] = dd;
              r.dtypes[v] = t;
            } else if (sc.dtype(v, &t)) {
              r.dtypes[v] = t;
            }
          }
          for (const auto& v : d.out) {
            int32_t t;
            Dims dd;
            if (consts.count(v)) r.consts[v] = consts[v];
            else if (!v.empty() && sc.info(v, &t, &dd)) r.dims[v] = dd, r.dtypes[v] = t;
          }
          r.nodes.push_back(std::move(d));
        }
        std::ostringstream nm;
        nm << "onednn_chain(";
        bool first = true;
        for (auto& [op, cnt] : counts) {
          nm << (first ? "" : ",") << op << "x" << cnt;
          first = false;
        }
        nm << ")";
        r.name = nm.str();
        r.channels_last = channels_last;
        lift_1d(r);
        try {
          chain->plan = Builder(r, /*time_convs=*/false).build();
        } catch (const NodeReject& e) {
          if (e.node < r.nodes.size()) {
            std::string msg = "claim: node '" + r.nodes[e.node].name + "' (" + r.nodes[e.node].op +
                              ") stays on its kernel: " + e.why;
            debug_log(msg);
            excluded.insert(r.nodes[e.node].id);
            retry = true;
          }
          continue;
        }
        ready.emplace_back(ordered, std::move(chain));
      }
      if (retry && round + 1 < 8) {
        // Rebuild the groups without the excluded nodes.
        parent.clear();
        for (auto n : cand)
          if (!excluded.count(n)) parent[n] = n;
        for (auto n : cand) {
          if (excluded.count(n)) continue;
          for (const auto& in : sc.ins(n)) {
            keel_node_id_t p;
            if (sc.producer(in, &p) && cand.count(p) && !excluded.count(p)) parent[find(n)] = find(p);
          }
        }
        continue;
      }
      for (auto& [ids, chain] : ready) {
        keel_subgraph_def_t def;
        std::memset(&def, 0, sizeof def);
        def.struct_size = sizeof def;
        std::string name = chain->recipe.name;
        def.name = name.c_str();
        def.node_ids = ids.data();
        def.node_count = ids.size();
        def.user_data = chain.release();
        def.compute = chain_compute;
        def.release = chain_release;
        def.release_user_data = chain_release;
        keel_status_t st = sink->claim(sink, &def);
        if (st) {
          std::string msg = std::string("claim refused: ") + (st->message ? st->message : "");
          debug_log(msg);
          keel_status_release(st);
        }
      }
      break;
    }
    return nullptr;
  } catch (const std::exception& e) {
    return status_of(KEEL_STATUS_UNIMPLEMENTED, std::string("claim_chains: ") + e.what());
  } catch (const Reject& r) {
    return status_of(KEEL_STATUS_UNIMPLEMENTED, "claim_chains: " + r.why);
  }
}

}  // namespace

keel_status_t register_claimer(const keel_host_api_t* host, keel_plugin_handle_t* plugin) {
  if (!KEEL_HAS_MEMBER(host, keel_host_api_t, register_claimer) || !host->register_claimer) return nullptr;
  if (!g_options.claims) return nullptr;
  g_plugin_handle = plugin;
  keel_claimer_def_t def;
  std::memset(&def, 0, sizeof def);
  def.struct_size = sizeof def;
  def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  def.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  def.name = "onednn_chains";
  def.device_type = "cpu";
  def.claim_subgraphs = claim_chains;
  return host->register_claimer(plugin, &def);
}

}  // namespace keel::onednn
