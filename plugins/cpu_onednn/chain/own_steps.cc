// plugins/cpu_onednn/chain/own_steps.cc — the plugin's own steps (Exec::own) of a plan: thin adapters from an
// Exec's memory arguments to the hand-written steps in steps/ (declared in chain/plan.h).
#include "chain/plan.h"

namespace keel::onednn::chain {

namespace {

// `fn` in place over an own step's DNNL_ARG_DST memory (f32), split over the OpenMP team (contiguous 16-float-aligned
// parts) unless the step is a single-thread one.
void run_inplace(const Exec& e, void (*fn)(float*, size_t)) {
  const dnnl::memory& m = e.args.at(DNNL_ARG_DST);
  float* p = static_cast<float*>(m.get_data_handle());
  const size_t n = m.get_desc().get_size() / sizeof(float);
  const int team = e.single ? 1 : omp_get_max_threads();
  if (team <= 1) {
    fn(p, n);
    return;
  }
#pragma omp parallel num_threads(team)
  {
    const size_t k = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
    const size_t per = (n / 16 + k - 1) / k * 16;
    const size_t b = std::min(n, t * per), end = t + 1 == k ? n : std::min(n, b + per);
    fn(p + b, end - b);
  }
}

// Floats from one thread's part of an own step's scratch to the next: the plan's stride, the same for every own step
// (Builder::bind_scratchpads); 0, the step's own need, where none was set.
size_t stride_floats(const Exec& e) { return e.scratch_stride / sizeof(float); }

// The team an own step runs with: the OpenMP team (1 for a single-thread step), but no more threads than its scratch
// has parts for (`own`: the floats one thread needs, where no stride was set).
int team_in(const Exec& e, size_t own) {
  const int want = e.single ? 1 : omp_get_max_threads();
  const auto it = e.args.find(DNNL_ARG_SCRATCHPAD);
  if (it == e.args.end()) return want;
  const size_t per = std::max<size_t>(e.scratch_stride ? e.scratch_stride : own * sizeof(float), 1);
  return std::max(1, std::min(want, static_cast<int>(it->second.get_desc().get_size() / per)));
}

}  // namespace

// Exec::own of a SiLU step: x * sigmoid(x) in place (steps/silu.h).
void run_silu(const Exec& e) { run_inplace(e, silu_inplace); }

// Exec::own of a GELU step: 0.5 x (1 + erf(x / sqrt 2)) in place (steps/gelu.h).
void run_gelu(const Exec& e) { run_inplace(e, gelu_inplace); }
void run_gelu_tanh(const Exec& e) { run_inplace(e, gelu_tanh_inplace); }

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
  const int team = team_in(e, conv_pool_scratch_floats(s));
  conv_pool_run(s, ptr(DNNL_ARG_SRC), ptr(DNNL_ARG_WEIGHTS), ptr(DNNL_ARG_BIAS), ptr(DNNL_ARG_DST),
                static_cast<float*>(scratch.get_data_handle()), team, nullptr, stride_floats(e));
}

// Exec::own of a product with few columns (Builder::narrow_gemm, steps/narrow_gemm.h): SRC plain [m,k], WEIGHTS
// packed, BIAS [n], DST plain [m,n]; blocks of rows split over the OpenMP team.
void run_narrow_gemm(const Exec& e) {
  const auto& s = *static_cast<const NarrowGemmShape*>(e.params.get());
  auto ptr = [&](int arg) { return static_cast<float*>(e.args.at(arg).get_data_handle()); };
  narrow_gemm_run(s, ptr(DNNL_ARG_SRC), ptr(DNNL_ARG_WEIGHTS), ptr(DNNL_ARG_BIAS), ptr(DNNL_ARG_DST),
                  e.single ? 1 : omp_get_max_threads());
}

// Exec::own of a product of few rows and large weights (Builder::skinny_gemm, steps/skinny_gemm.h): SRC plain
// [m,k], WEIGHTS packed by 64-column blocks, BIAS (when present), DST plain [m,n] (holding the residual when the
// shape sums); split over the team by column blocks.
void run_skinny_gemm(const Exec& e) {
  const auto& s = *static_cast<const SkinnyGemmShape*>(e.params.get());
  auto ptr = [&](int arg) { return static_cast<float*>(e.args.at(arg).get_data_handle()); };
  skinny_gemm_run(s, ptr(DNNL_ARG_SRC), ptr(DNNL_ARG_WEIGHTS),
                  e.args.count(DNNL_ARG_BIAS) ? ptr(DNNL_ARG_BIAS) : nullptr, ptr(DNNL_ARG_DST),
                  e.single ? 1 : omp_get_max_threads());
}

// Exec::own of a convolution's windows gathered as rows (Builder::conv_skinny, steps/im2row.h): DNNL_ARG_SRC part
// 0's source, DNNL_ARG_SRC_1 part 1's (two parts), DST plain rows; params the Im2RowShape; rows split over the team.
void run_im2row(const Exec& e) {
  const auto& s = *static_cast<const Im2RowShape*>(e.params.get());
  const float* src[2] = {static_cast<const float*>(e.args.at(DNNL_ARG_SRC).get_data_handle()), nullptr};
  if (s.parts > 1) src[1] = static_cast<const float*>(e.args.at(DNNL_ARG_SRC_1).get_data_handle());
  im2row_run(s, src, static_cast<float*>(e.args.at(DNNL_ARG_DST).get_data_handle()),
             e.single ? 1 : omp_get_max_threads());
}

// Exec::own of a depthwise convolution + SiLU (Builder::conv_dw_silu, steps/dwsilu.h): SRC and DST nChw16c,
// WEIGHTS packed, BIAS, kArgPooled (when present) the output's channel means, DNNL_ARG_SCRATCHPAD room for the team;
// split over the OpenMP team by 16-channel blocks.
void run_dw_silu(const Exec& e) {
  const auto& s = *static_cast<const DwSiluShape*>(e.params.get());
  auto ptr = [&](int arg) { return static_cast<float*>(e.args.at(arg).get_data_handle()); };
  const dnnl::memory& scratch = e.args.at(DNNL_ARG_SCRATCHPAD);
  const int team = team_in(e, dw_silu_scratch_floats(s));
  dw_silu_run(s, ptr(DNNL_ARG_SRC), ptr(DNNL_ARG_WEIGHTS), ptr(DNNL_ARG_BIAS), ptr(DNNL_ARG_DST),
              e.args.count(kArgPooled) ? ptr(kArgPooled) : nullptr, static_cast<float*>(scratch.get_data_handle()),
              team, true, stride_floats(e));
}

// Exec::own of a depthwise convolution with its LayerNormalization (Builder::conv_dw_ln, steps/dw_ln.h): SRC and
// DST channels-last, WEIGHTS the packed constants, SCRATCHPAD a team's rings.
void run_dw_ln(const Exec& e) {
  const auto& s = *static_cast<const DwLnShape*>(e.params.get());
  auto ptr = [&](int arg) { return static_cast<float*>(e.args.at(arg).get_data_handle()); };
  dw_ln_run(s, ptr(DNNL_ARG_SRC), ptr(DNNL_ARG_WEIGHTS), ptr(DNNL_ARG_DST), ptr(DNNL_ARG_SCRATCHPAD),
            team_in(e, dw_ln_scratch_floats(s)), stride_floats(e));
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

// Exec::own of a 3x3 convolution as Winograd F(4,3) (Builder::conv_wino4, steps/wino4.h): SRC and DST nChw16c,
// WEIGHTS the transformed weights, BIAS, SCRATCHPAD a team's scratch.
void run_wino4(const Exec& e) {
  const auto& s = *static_cast<const Wino4Shape*>(e.params.get());
  auto ptr = [&](int arg) { return static_cast<float*>(e.args.at(arg).get_data_handle()); };
  wino4_run(s, ptr(DNNL_ARG_SRC), ptr(DNNL_ARG_WEIGHTS), ptr(DNNL_ARG_BIAS), ptr(DNNL_ARG_DST),
            ptr(DNNL_ARG_SCRATCHPAD), team_in(e, wino4_scratch_floats(s)), stride_floats(e));
}

// Exec::own of a 1x1 convolution (Builder::conv_pointwise, steps/pointwise.h): SRC and DST nChw16c, WEIGHTS packed,
// BIAS; split over the OpenMP team unless the step is a single-thread one.
void run_pointwise(const Exec& e) {
  const auto& s = *static_cast<const PointwiseShape*>(e.params.get());
  auto ptr = [&](int arg) { return static_cast<float*>(e.args.at(arg).get_data_handle()); };
  pointwise_run(s, ptr(DNNL_ARG_SRC), ptr(DNNL_ARG_WEIGHTS), ptr(DNNL_ARG_BIAS), ptr(DNNL_ARG_DST),
                e.single ? 1 : omp_get_max_threads());
}

// Exec::own of a 1x1 convolution (or a stem) with its 3x3 / 5x5 depthwise reader and maybe the projection after it
// (Builder::conv_expand_dw, steps/expand_dw.h): SRC nChw16c (a stem's plain), DST nChw16c, WEIGHTS the packed
// constants, SCRATCHPAD a team's rings.
void run_expand_dw(const Exec& e) {
  const auto& s = *static_cast<const ExpandDwShape*>(e.params.get());
  auto ptr = [&](int arg) { return static_cast<float*>(e.args.at(arg).get_data_handle()); };
  expand_dw_run(s, ptr(DNNL_ARG_SRC), ptr(DNNL_ARG_WEIGHTS), ptr(DNNL_ARG_DST), ptr(DNNL_ARG_SCRATCHPAD),
                team_in(e, expand_dw_scratch_floats(s)), stride_floats(e));
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
  attention_run(s, ptr(DNNL_ARG_SRC_0), ptr(DNNL_ARG_SRC_1), ptr(DNNL_ARG_SRC_2),
                s.has_mask ? ptr(DNNL_ARG_SRC_3) : nullptr, ptr(DNNL_ARG_DST),
                static_cast<float*>(scratch.get_data_handle()), team_in(e, attention_scratch_floats(s)),
                stride_floats(e));
}

// ----------------------------------------------------------------------- int8 steps' own parts (Builder::qconv)

// Exec::own of an int8 depthwise 3x3 step (steps/int8_dw.h): params the kernel, SRC / DST channels-last bytes.
void run_int8_depthwise(const Exec& e) {
  const auto& k = *static_cast<const Int8Depthwise3x3*>(e.params.get());
  k.run(e.args.at(DNNL_ARG_SRC).get_data_handle(), e.args.at(DNNL_ARG_DST).get_data_handle(),
        e.single ? 1 : omp_get_max_threads());
}

// Exec::own of the int8 expansion + depthwise (+ projection) step (steps/int8_expand_dw.h): SRC u8 channels-last (or
// f32, quantized by the step),
// SRC_1 the projection's residual Z (f32 channels-last) when it has one, DST, the team's SCRATCHPAD.
void run_int8_expand_dw(const Exec& e) {
  const auto& k = *static_cast<const Int8ExpandDw*>(e.params.get());
  const auto z = e.args.find(DNNL_ARG_SRC_1);
  k.run(e.args.at(DNNL_ARG_SRC).get_data_handle(),
        z == e.args.end() ? nullptr : static_cast<const float*>(z->second.get_data_handle()),
        e.args.at(DNNL_ARG_DST).get_data_handle(),
        static_cast<uint8_t*>(e.args.at(DNNL_ARG_SCRATCHPAD).get_data_handle()),
        team_in(e, (k.scratch_bytes() + sizeof(float) - 1) / sizeof(float)), e.scratch_stride);
}

// Exec::own of the quantization of an f32 value into an int8 step's source (steps/int8_quant.h): SRC f32 plain
// ([N, C, S]: kToNhwc), nChw16c (kBlocked) or already in the destination's layout (kSame, n elements); DST bytes.
// kBlockedF32: no quantization, nChw16c f32 into channels-last f32 (an int8 step's residual Z).

void run_int8_quantize(const Exec& e) {
  const auto& k = *static_cast<const Int8QuantizeStep*>(e.params.get());
  const float* x = static_cast<const float*>(e.args.at(DNNL_ARG_SRC).get_data_handle());
  void* y = e.args.at(DNNL_ARG_DST).get_data_handle();
  const int team = e.single ? 1 : omp_get_max_threads();
  switch (k.kind) {
    case Int8QuantizeStep::Kind::kSame: quantize_f32(x, y, k.n, k.q, team); break;
    case Int8QuantizeStep::Kind::kToNhwc: quantize_f32_to_nhwc(x, y, k.N, k.C, k.S, k.q, team); break;
    case Int8QuantizeStep::Kind::kBlocked: quantize_f32_blocked16_to_nhwc(x, y, k.N, k.C, k.S, k.q, team); break;
    case Int8QuantizeStep::Kind::kBlockedF32:
      blocked16_to_nhwc_f32(x, static_cast<float*>(y), k.N, k.C, k.S, team);
      break;
  }
}

// Exec::own of a max pooling of channels-last bytes (Builder::pool, steps/int8_pool.h): DNNL_ARG_SRC into
// DNNL_ARG_DST, params its BytePoolShape; split over the OpenMP team unless the step is a single-thread one.
void run_int8_pool(const Exec& e) {
  max_pool_nhwc_bytes(*static_cast<const BytePoolShape*>(e.params.get()), e.args.at(DNNL_ARG_SRC).get_data_handle(),
                      e.args.at(DNNL_ARG_DST).get_data_handle(), e.single ? 1 : omp_get_max_threads());
}

// Exec::own of a max pooling of nChw16c f32 by output rows (Builder::pool, steps/pool_arg.h's pool_max16_rows):
// DNNL_ARG_SRC into DNNL_ARG_DST, params its PoolArgShape; split over the OpenMP team unless the step is a
// single-thread one.
void run_max_pool16(const Exec& e) {
  pool_max16_rows(*static_cast<const PoolArgShape*>(e.params.get()),
                  static_cast<const float*>(e.args.at(DNNL_ARG_SRC).get_data_handle()),
                  static_cast<float*>(e.args.at(DNNL_ARG_DST).get_data_handle()), e.single ? 1 : omp_get_max_threads());
}

// Exec::own of an int8 stem convolution (+ max pooling) (Builder::qconv_stem, steps/int8_stem.h): DNNL_ARG_SRC into
// DNNL_ARG_DST, params the Int8StemConv; split over the OpenMP team unless the step is a single-thread one.
void run_int8_stem(const Exec& e) {
  static_cast<const Int8StemConv*>(e.params.get())
      ->run(e.args.at(DNNL_ARG_SRC).get_data_handle(), e.args.at(DNNL_ARG_DST).get_data_handle(),
            e.single ? 1 : omp_get_max_threads());
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

// Exec::own of a bilinear Resize (Builder::resize, steps/resize.h): DNNL_ARG_SRC into DNNL_ARG_DST, params its
// BilinearShape; split over the OpenMP team unless the step is a single-thread one.
void run_bilinear(const Exec& e) {
  bilinear_resize(*static_cast<const BilinearShape*>(e.params.get()),
                  static_cast<const float*>(e.args.at(DNNL_ARG_SRC).get_data_handle()),
                  static_cast<float*>(e.args.at(DNNL_ARG_DST).get_data_handle()), e.single ? 1 : omp_get_max_threads());
}

void run_step(Exec& e, dnnl::stream& s) {
  if (e.own) e.own(e);
  else if (e.scratchpad_bound) e.prim.execute(s, e.args);
  else execute(e.prim, s, e.args);
}

}  // namespace keel::onednn::chain
