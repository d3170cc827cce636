// plugins/cpu_onednn/kernels/conv.cc — Conv and ConvTranspose (f32, 1-D/2-D/3-D, groups, depthwise, dilations,
// pads, auto_pad, bias) on oneDNN convolution/deconvolution primitives, and keel.FusedConv without a residual (the
// activation as an eltwise post-op: eager's conv2d_relu runs on it).
//
// The primitive chooses its own layouts (format_tag::any): activations usually go to nChw16c / nChw8c and weights
// to a blocked layout. Constant weights are reordered into that layout once per plan (per input shape); the
// activations are reordered from and to the graph's plain nchw around the primitive, in workspace memory.
// 3x3 stride-1 convolutions try Winograd first (options().winograd), falling back to direct when oneDNN refuses;
// weights given at run time keep their last Winograd transform while they stay the same (ConvPlan::cache_wei), and
// weights that change (training) switch to a primitive that transforms them itself (ConvPlan::varying).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "common/common.h"
#include "common/lanes.h"
#include "common/team.h"
#include "steps/convpool.h"
#include "steps/pool_arg.h"

namespace keel::onednn {
namespace {

// --- the stem convolution's own kernel (an image model's first layer: 1-4 input channels)
//
// oneDNN's jit convolution over a plain 1-channel input writes nChw16c, which the next op's plain layout then costs a
// reorder of the whole output (the LeNet-like conv1 at batch 64: 0.70 ms + 0.34 ms for the 5.5 MB output, 1 thread).
// Few input channels fill no vector lanes anyway, so a direct loop that writes the plain output once (bias and a Relu
// fused) does the same work without the second pass: stride 1, no dilation, one group, C <= 4, kernel at most 7 wide.
// KEEL_ONEDNN_STEM_CONV=0 / 1 turns it off / on (to compare).
bool stem_conv_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KEEL_ONEDNN_STEM_CONV");
    return __builtin_cpu_supports("avx512f") && (e == nullptr || std::atoi(e) != 0);
  }();
  return on;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 on _mm512_setzero_ps inside _mm512_max_ps

// Y[n][m0 .. m0 + MB) = act(conv(Xp[n], W) + B) over the zero-padded input Xp (HP x WP planes), 16 output columns a
// step (rows under 16 wide masked: those lanes are neither read nor written); each loaded tap of X serves the MB
// channels. `w` is the block's weights packed tap by tap, [C][KH][KW][MB] (stem_conv packs them), so that the MB
// broadcasts of a tap come off one base register (with W's own layout the compiler ran out of registers for the MB
// channel offsets and spilled them). `y` points at plane (n, m0): the MB planes follow it, OH x OW each.
template <int KW, int MB>
__attribute__((target("avx512f"))) void stem_conv_f32(const float* xp, const float* w, const float* bias, float* y,
                                                      int64_t n, int64_t m0, int64_t C, int64_t KH, int64_t OH,
                                                      int64_t OW, int64_t HP, int64_t WP, bool relu) {
  for (int64_t oh = 0; oh < OH; ++oh)
    for (int64_t ow0 = 0; ow0 < OW; ow0 += 16) {
      // A row's last partial step moves back to end at the row's end (recomputing a few columns), so that every
      // step of a row at least 16 wide loads and stores whole vectors: masked stores cost several times as much on
      // some CPUs (AMD Zen).
      const int64_t ow = OW >= 16 && OW - ow0 < 16 ? OW - 16 : ow0;
      const __mmask16 k = first_lanes(OW - ow);
      __m512 acc[MB];
#pragma GCC unroll 8
      for (int b = 0; b < MB; ++b) acc[b] = _mm512_set1_ps(bias ? bias[m0 + b] : 0.f);
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < KH; ++i) {
          const float* x = xp + ((n * C + c) * HP + oh + i) * WP + ow;
          const float* wr = w + (c * KH + i) * KW * MB;
#pragma GCC unroll 8
          for (int j = 0; j < KW; ++j) {
            const __m512 xv = _mm512_maskz_loadu_ps(k, x + j);
#pragma GCC unroll 8
            for (int b = 0; b < MB; ++b) acc[b] = _mm512_fmadd_ps(_mm512_set1_ps(wr[j * MB + b]), xv, acc[b]);
          }
        }
#pragma GCC unroll 8
      for (int b = 0; b < MB; ++b) {
        const __m512 v = relu ? _mm512_max_ps(acc[b], _mm512_setzero_ps()) : acc[b];
        if (k == 0xffff) _mm512_storeu_ps(y + (b * OH + oh) * OW + ow, v);
        else _mm512_mask_storeu_ps(y + (b * OH + oh) * OW + ow, k, v);
      }
    }
}

#pragma GCC diagnostic pop

// Bytes in nChw16c [n][m / 16][hw][16] to plain [n][m][hw] (m a multiple of 16), each (image, block) pair a task of
// the OpenMP team, 16 pixels at a time as a 16 x 16 byte transpose in registers: the window positions of
// keel.FusedConvMaxPool (oneDNN's u8 reorder of this layout took 0.10 ms for SimpleCNN's 346 K positions at batch 64,
// three times its f32 reorder of the pooled values).
void blocked16_to_plain(const uint8_t* src, uint8_t* dst, int64_t n, int64_t m, int64_t hw) {
  const int64_t blocks = m / 16;
  parallel_for(n * blocks, [&](int64_t t) {
    const uint8_t* s = src + t * hw * 16;
    uint8_t* d = dst + t * 16 * hw;
    int64_t q = 0;
    for (; q + 16 <= hw; q += 16) {
      __m128i r[16], a[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + (q + i) * 16));
      for (int i = 0; i < 8; ++i) {  // pairs of pixels, byte by byte
        a[2 * i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
      }
      for (int g = 0; g < 4; ++g) {  // fours of pixels, two bytes at a time: channels 0-3, 4-7, 8-11, 12-15
        const __m128i lo = a[4 * g], hi = a[4 * g + 1], lo2 = a[4 * g + 2], hi2 = a[4 * g + 3];
        r[4 * g] = _mm_unpacklo_epi16(lo, lo2);
        r[4 * g + 1] = _mm_unpackhi_epi16(lo, lo2);
        r[4 * g + 2] = _mm_unpacklo_epi16(hi, hi2);
        r[4 * g + 3] = _mm_unpackhi_epi16(hi, hi2);
      }
      for (int h = 0; h < 2; ++h)  // eights of pixels: two channels each
        for (int k = 0; k < 4; ++k) {
          a[8 * h + 2 * k] = _mm_unpacklo_epi32(r[8 * h + k], r[8 * h + 4 + k]);
          a[8 * h + 2 * k + 1] = _mm_unpackhi_epi32(r[8 * h + k], r[8 * h + 4 + k]);
        }
      for (int k = 0; k < 8; ++k) {  // all 16 pixels: one channel each
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * k) * hw + q), _mm_unpacklo_epi64(a[k], a[8 + k]));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + (2 * k + 1) * hw + q), _mm_unpackhi_epi64(a[k], a[8 + k]));
      }
    }
    for (int64_t j = 0; j < 16; ++j)
      for (int64_t p = q; p < hw; ++p) d[j * hw + p] = s[p * 16 + j];
  });
}

// The whole convolution (x [N, C, H, W], w [M, C, KH, KW], pads {top, left, bottom, right}) into y [N, M, OH, OW];
// or, with `pool` (keel.FusedConvMaxPool: its n, c, h, w unused), each task's planes into a buffer of the thread's
// (L1/L2-sized) and pooled from there into pooled [N, M, PH, PW] and arg (may be null), so that the convolution's
// output never goes to memory (SimpleCNN: 5.5 MB a step).
void stem_conv(const float* x, const float* w, const float* bias, float* y, const Dims& xd, const Dims& wd,
               const Dims& pads, const Dims& yd, bool relu, const PoolArgShape* pool = nullptr, float* pooled = nullptr,
               uint8_t* arg = nullptr) {
  const int64_t N = xd[0], C = xd[1], H = xd[2], W = xd[3], M = wd[0], KH = wd[2], KW = wd[3], OH = yd[2], OW = yd[3];
  const int64_t HP = OH + KH - 1, WP = OW + KW - 1;
  std::vector<float> padded;
  const float* xp = x;
  if (HP != H || WP != W || pads[0] != 0 || pads[1] != 0) {  // zeros around X: every tap reads inside its row
    padded.assign(static_cast<size_t>(N * C * HP * WP), 0.f);
    for (int64_t nc = 0; nc < N * C; ++nc)
      for (int64_t h = 0; h < H && h + pads[0] < HP; ++h)
        std::memcpy(&padded[static_cast<size_t>((nc * HP + h + pads[0]) * WP + pads[1])], x + (nc * H + h) * W,
                    static_cast<size_t>(std::min(W, WP - pads[1])) * sizeof(float));
    xp = padded.data();
  }
  using Fn = void (*)(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                      int64_t, int64_t, int64_t, bool);
  static constexpr Fn kBlocked[] = {stem_conv_f32<1, 8>, stem_conv_f32<2, 8>, stem_conv_f32<3, 8>, stem_conv_f32<4, 8>,
                                    stem_conv_f32<5, 8>, stem_conv_f32<6, 8>, stem_conv_f32<7, 8>};
  static constexpr Fn kSingle[] = {stem_conv_f32<1, 1>, stem_conv_f32<2, 1>, stem_conv_f32<3, 1>, stem_conv_f32<4, 1>,
                                   stem_conv_f32<5, 1>, stem_conv_f32<6, 1>, stem_conv_f32<7, 1>};
  const int64_t blocks = M / 8, per_n = blocks + M % 8, per_m = C * KH * KW;
  // Each block of 8 channels' weights tap by tap ([C][KH][KW][8], at m0 * per_m); the single channels after the blocks
  // keep W's layout (which is that with one channel).
  std::vector<float> packed(w, w + M * per_m);
  for (int64_t t = 0; t < blocks; ++t)
    for (int64_t b = 0; b < 8; ++b)
      for (int64_t tap = 0; tap < per_m; ++tap)
        packed[static_cast<size_t>(t * 8 * per_m + tap * 8 + b)] = w[(t * 8 + b) * per_m + tap];
  const int64_t plane = OH * OW;
  parallel_for(N * per_n, [&](int64_t t) {
    const int64_t n = t / per_n, r = t % per_n, m0 = r < blocks ? r * 8 : blocks * 8 + (r - blocks);
    const int64_t planes = r < blocks ? 8 : 1;
    thread_local std::vector<float> own;
    if (pool) own.resize(static_cast<size_t>(8 * plane));
    float* dst = pool ? own.data() : y + (n * M + m0) * plane;
    const float* wb = packed.data() + m0 * per_m;
    if (r < blocks) kBlocked[KW - 1](xp, wb, bias, dst, n, m0, C, KH, OH, OW, HP, WP, relu);
    else kSingle[KW - 1](xp, wb, bias, dst, n, m0, C, KH, OH, OW, HP, WP, relu);
    if (pool) {
      PoolArgShape ps = *pool;
      ps.n = 1, ps.c = planes, ps.h = OH, ps.w = OW, ps.block = 1;
      const int64_t out = (n * M + m0) * ps.oh * ps.ow;
      pool_arg_forward_here(ps, dst, pooled + out, arg ? arg + out : nullptr);
    }
  });
}

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

struct Geometry {
  Dims strides, dilations, pads_l, pads_r, out;
};

// Spatial geometry of a convolution (ONNX convPoolShapeInference semantics, as the reference kernels).
Geometry conv_geometry(const Ctx& c, const Dims& in, const Dims& kernel) {
  const size_t r = in.size();
  Geometry g;
  g.strides = c.attr_ints("strides", Dims(r, 1));
  g.dilations = c.attr_ints("dilations", Dims(r, 1));
  if (g.strides.size() != r || g.dilations.size() != r) throw Reject{"strides/dilations rank mismatch"};
  for (size_t i = 0; i < r; ++i)
    if (g.strides[i] <= 0 || g.dilations[i] <= 0) throw Reject{"non-positive stride or dilation"};
  const std::string auto_pad = c.attr_s("auto_pad", "NOTSET");
  const sdk::AutoPad ap = sdk::auto_pad_of(auto_pad);
  g.pads_l.assign(r, 0);
  g.pads_r.assign(r, 0);
  if (ap == sdk::AutoPad::kNotSet) {
    Dims p = c.attr_ints("pads", Dims(2 * r, 0));
    if (p.size() != 2 * r) throw Reject{"pads rank mismatch"};
    for (size_t i = 0; i < r; ++i) {
      g.pads_l[i] = p[i];
      g.pads_r[i] = p[i + r];
      if (p[i] < 0 || p[i + r] < 0) throw Reject{"negative pads"};
    }
  } else if (ap == sdk::AutoPad::kUnknown) {
    throw Reject{"auto_pad " + auto_pad};
  }
  g.out.resize(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t eff = sdk::dilated_extent(kernel[i], g.dilations[i]);
    if (sdk::is_same(ap)) sdk::same_pads(ap, in[i], eff, g.strides[i], &g.pads_l[i], &g.pads_r[i]);
    g.out[i] = sdk::window_output(in[i], g.pads_l[i] + g.pads_r[i], eff, g.strides[i]);  // oneDNN's integer division
    if (g.out[i] < 0) throw Reject{"kernel larger than the padded input"};
  }
  return g;
}

dnnl::memory::dims minus_one(const Dims& d) {
  dnnl::memory::dims r(d.size());
  for (size_t i = 0; i < d.size(); ++i) r[i] = d[i] - 1;
  return r;
}

// keel.FusedConvMaxPool's reorders of its pooled output and window positions from a channel-blocked layout to plain.
struct PooledReorders {
  dnnl::memory p_blk, p_plain, a_blk, a_plain;
  dnnl::reorder p_to_plain, a_to_plain;
};

// One primitive with its reorders, for one input shape.
struct ConvPlan {
  Dims out_dims;
  dnnl::primitive prim;
  dnnl::memory src_user, src_prim, dst_user, dst_prim, wei_user, wei_prim, bias;
  bool reorder_src = false, reorder_dst = false, reorder_wei = false;
  dnnl::reorder src_reorder, dst_reorder, wei_reorder;
  std::string impl;
  // Weights given at run time into Winograd's layout: oneDNN 2.6's transform runs as plain C++ (about 1.3 ms for the
  // LeNet-like model's 64x32x3x3 at 1 thread, a sixth of the convolution), so the plan keeps the last transform and
  // the weights it was made from, and reuses it while the weights are bit for bit the same (an evaluation pass, or
  // micro-batches between two optimizer steps); a training step's new weights differ at once and are transformed.
  bool cache_wei = false;
  std::vector<float> wei_seen;  // the weights wei_prim was made from (empty: none yet)
  // Weights that changed since their transform (a training loop's, every step) switch the plan for good to Winograd's
  // forward_training primitive, which takes the weights blocked (a cheap jit reorder) and transforms them inside its
  // own jit code: measured here at 1 thread, the LeNet-like conv2 5.86 ms against 5.82 ms + 0.49 ms for the separate
  // transform, 256->256 at 14x14 1.75 ms against 0.93 + 8.35 ms. Unchanged weights keep the cached transform, which
  // wins when it is reused (0.93 against 1.75 ms there). Built at the first change; absent if oneDNN refuses it.
  std::optional<dnnl::convolution_forward::desc> varying_desc;
  bool varying = false;
  // The stem convolution's own kernel runs this plan instead of the primitive (stem_conv above); pads as
  // {top, left, bottom, right}.
  bool stem = false;
  Dims stem_pads;
  dnnl::primitive varying_prim;
  dnnl::memory varying_wei;
  dnnl::reorder varying_wei_reorder;
  std::unique_ptr<PooledReorders> pooled;  // keel.FusedConvMaxPool over a blocked layout (made at its first run)
};

// Conv (is_transpose = false) and ConvTranspose (true).
class ConvKernel : public Kernel {
 public:
  // fused: keel.FusedConv (act(conv(X, W) + B)), the activation as an eltwise post-op; a residual Z is left to the
  // chains and the reference kernel.
  // pooled: keel.FusedConvMaxPool (fused, then max pooling with window positions: steps/pool_arg.h), 2-D only.
  explicit ConvKernel(bool transpose, bool fused = false, bool pooled = false)
      : transpose_(transpose), fused_(fused), pooled_(pooled) {}

  void setup(Ctx& c) override {
    if (c.dtype(0) != KEEL_DTYPE_F32 || c.dtype(1) != KEEL_DTYPE_F32) throw Reject{"f32 only"};
    if (c.has_input(2) && c.dtype(2) != KEEL_DTYPE_F32) throw Reject{"f32 bias only"};
    if (fused_) {
      if (c.input_count() > 3 && c.has_input(3)) throw Reject{"residual Z"};
      act_ = read_fused_activation(c);
    }
    if (!c.rank_known(0)) throw Reject{"input rank unknown"};
    if (!c.dims_known(1)) throw Reject{"weight shape unknown"};
    rank_ = static_cast<int>(c.dims(0).size());
    if (rank_ < 3 || rank_ > 5) throw Reject{"rank " + std::to_string(rank_)};
    w_dims_ = c.dims(1);
    if (static_cast<int>(w_dims_.size()) != rank_) throw Reject{"weight rank differs from input rank"};
    group_ = c.attr_i("group", 1);
    if (group_ <= 0) throw Reject{"group <= 0"};
    Dims ks(w_dims_.begin() + 2, w_dims_.end());
    Dims kattr = c.attr_ints("kernel_shape", ks);
    if (kattr != ks) throw Reject{"kernel_shape differs from the weights"};
    if (transpose_) {
      if (c.has_attr_ints("output_shape")) throw Reject{"output_shape"};
      std::string ap = c.attr_s("auto_pad", "NOTSET");
      if (ap != "NOTSET" && ap != "VALID" && !ap.empty()) throw Reject{"auto_pad " + ap};
    }
    if (c.is_constant(1)) {
      const float* w = c.data<float>(1);
      w_const_.assign(w, w + numel(w_dims_));
    }
    if (c.has_input(2)) {
      if (c.dims(2).size() != 1) throw Reject{"bias rank"};
      has_bias_ = true;
      if (c.is_constant(2)) {
        const float* b = c.data<float>(2);
        b_const_.assign(b, b + numel(c.dims(2)));
      }
    }
    if (pooled_) {
      if (rank_ != 4) throw Reject{"2-D only"};
      const Dims ks = c.attr_ints("pool_kernel_shape", Dims{});
      if (!read_pool_window(ks, c.attr_ints("pool_strides", ks), &pool_)) throw Reject{"pool window"};
    }
    if (c.output_count() > (pooled_ ? 2 : 1)) throw Reject{"extra outputs"};
    if (c.dims_known(0)) {
      Dims x = c.dims(0);
      if (numel(x) == 0) throw Reject{"empty input"};
      plans_.get(shape_key(c), [&] { return build(c, x); });
    }
  }

  void run(Ctx& c) override {
    const Dims x = c.dims(0);
    ConvPlan& p = plans_.get(shape_key(c), [&] { return build(c, x); });
    limit_threads_for(static_cast<double>(numel(p.out_dims)) * numel(w_dims_) / std::max<int64_t>(w_dims_[0], 1));
    if (pooled_) return run_pooled(c, p);
    convolve(c, p, c.output(0, p.out_dims)->data, true);
  }

 private:
  // The convolution of the run's inputs. Its output goes to `y` (plain) when reorder_out or when the plan's layout is
  // plain; otherwise it stays in p.dst_prim (bound to the run's workspace), in the primitive's layout.
  void convolve(Ctx& c, ConvPlan& p, void* y, bool reorder_out) {
    if (p.stem) {
      stem_conv(static_cast<const float*>(c.input(0)->data), stem_weights(c), stem_bias(c), static_cast<float*>(y),
                c.dims(0), w_dims_, p.stem_pads, p.out_dims, act_.set);
      return;
    }
    auto& s = stream();
    bind(p.src_user, c.input(0)->data);
    bind(p.dst_user, y);
    if (p.reorder_src) {
      bind(p.src_prim, c.workspace(p.src_prim.get_desc().get_size()));
      p.src_reorder.execute(s, p.src_user, p.src_prim);
    }
    if (p.reorder_dst) bind(p.dst_prim, c.workspace(p.dst_prim.get_desc().get_size()));
    if (w_const_.empty()) {
      bind(p.wei_user, c.input(1)->data);
      if (p.cache_wei && !p.varying) {
        const auto* w = static_cast<const float*>(c.input(1)->data);
        const size_t n = static_cast<size_t>(numel(w_dims_));
        if (p.wei_seen.empty() || std::memcmp(p.wei_seen.data(), w, n * sizeof(float)) != 0) {
          if (!p.wei_seen.empty()) start_varying(p);
          if (!p.varying) {
            p.wei_seen.clear();  // recorded only once the transform is made (a failure leaves no stale record)
            p.wei_reorder.execute(s, p.wei_user, p.wei_prim);
            p.wei_seen.assign(w, w + n);
          }
        }
      }
      if (p.varying) {
        bind(p.varying_wei, c.workspace(p.varying_wei.get_desc().get_size()));
        p.varying_wei_reorder.execute(s, p.wei_user, p.varying_wei);
      } else if (p.reorder_wei && !p.cache_wei) {
        bind(p.wei_prim, c.workspace(p.wei_prim.get_desc().get_size()));
        p.wei_reorder.execute(s, p.wei_user, p.wei_prim);
      }
    }
    if (has_bias_ && b_const_.empty()) bind(p.bias, c.input(2)->data);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, p.src_prim},
                                               {DNNL_ARG_WEIGHTS, p.varying ? p.varying_wei : p.wei_prim},
                                               {DNNL_ARG_DST, p.dst_prim}};
    if (has_bias_) args[DNNL_ARG_BIAS] = p.bias;
    execute(p.varying ? p.varying_prim : p.prim, s, args);
    if (p.reorder_dst && reorder_out) p.dst_reorder.execute(s, p.dst_prim, p.dst_user);
    s.wait();
  }

  const float* stem_weights(Ctx& c) const {
    return w_const_.empty() ? static_cast<const float*>(c.input(1)->data) : w_const_.data();
  }
  const float* stem_bias(Ctx& c) const {
    return !has_bias_ ? nullptr : b_const_.empty() ? static_cast<const float*>(c.input(2)->data) : b_const_.data();
  }

  // keel.FusedConvMaxPool: the stem kernel pools each task's planes while they are in its cache (stem_conv). A
  // primitive's output stays in the workspace in the layout it was made in (nChw16c / nChw8c, or plain); the pooling
  // reads it there and writes the pooled output and window positions in that layout; only those quarter-size
  // results are reordered to plain. No reorder of the whole output, no output tensor for it.
  void run_pooled(Ctx& c, ConvPlan& p) {
    const Dims& y = p.out_dims;
    if (y[2] < pool_.kh || y[3] < pool_.kw) throw Reject{"the pool window does not fit the convolution output"};
    const Dims pd{y[0], y[1], (y[2] - pool_.kh) / pool_.sh + 1, (y[3] - pool_.kw) / pool_.sw + 1};
    keel_tensor_t* out = c.output(0, pd);
    keel_tensor_t* arg = c.output_count() > 1 && c.output_dtype(1) == KEEL_DTYPE_U8 ? c.output(1, pd) : nullptr;
    // The layout the convolution leaves its output in.
    int64_t block = 1;
    if (!p.stem && p.reorder_dst) block = channel_block(p.dst_prim.get_desc(), y);
    PoolArgShape ps;
    ps.n = y[0], ps.c = y[1], ps.h = y[2], ps.w = y[3], ps.kh = pool_.kh, ps.kw = pool_.kw, ps.sh = pool_.sh;
    ps.sw = pool_.sw, ps.oh = pd[2], ps.ow = pd[3], ps.block = block;
    if (p.stem && stem_pool_in_registers(c, p, ps, pd, out, arg)) return;
    if (p.stem) {  // pooled inside the stem kernel, per task
      stem_conv(static_cast<const float*>(c.input(0)->data), stem_weights(c), stem_bias(c), nullptr, c.dims(0), w_dims_,
                p.stem_pads, y, act_.set, &ps, static_cast<float*>(out->data),
                arg ? static_cast<uint8_t*>(arg->data) : nullptr);
      return;
    }
    void* plain = block == 1 || block == 0 ? c.workspace(static_cast<uint64_t>(numel(y)) * sizeof(float)) : nullptr;
    convolve(c, p, plain, block == 0);  // another layout: reordered to plain
    if (block == 0) block = 1;
    ps.block = block;
    const float* src = static_cast<const float*>(block == 1 ? plain : p.dst_prim.get_data_handle());
    if (block == 1) {
      pool_arg_forward(ps, src, static_cast<float*>(out->data), arg ? static_cast<uint8_t*>(arg->data) : nullptr);
      return;
    }
    // Blocked: pooled into the workspace, then reordered to the plain outputs.
    PooledReorders& r = pooled_reorders(p, pd, block);
    const uint64_t elems = static_cast<uint64_t>(ps.n * ps.blocks() * block * ps.oh * ps.ow);
    bind(r.p_blk, c.workspace(elems * sizeof(float)));
    if (arg) bind(r.a_blk, c.workspace(elems));
    pool_arg_forward(ps, src, static_cast<float*>(r.p_blk.get_data_handle()),
                     arg ? static_cast<uint8_t*>(r.a_blk.get_data_handle()) : nullptr);
    auto& s = stream();
    bind(r.p_plain, out->data);
    r.p_to_plain.execute(s, r.p_blk, r.p_plain);
    if (arg) {
      bind(r.a_plain, arg->data);
      r.a_to_plain.execute(s, r.a_blk, r.a_plain);
    }
    s.wait();
  }

  // A stem convolution with a 2x2 stride-2 pooling over 32 or more channels (a multiple of 16), as the chains' own
  // step computes it (steps/convpool.h): 16 channels to a vector and several pixels in registers, each window pooled
  // as its lower row is computed, with the window positions; into the workspace in nChw16c, then the pooled output and
  // positions reordered to plain. SimpleCNN's forward at batch 64 (1 -> 32, 3x3 over 28x28): the stem kernel (8
  // channels to a register, one broadcast load per FMA, 6 of 26 columns computed twice) and its pooling took 0.45-0.60
  // ms a call (`KEEL_EAGER_PROFILE=1`, 3 alternating rounds), this 0.36-0.47; the step itself ~0.20, the reorders of
  // the pooled values 0.034 and of the positions 0.042 (blocked16_to_plain; oneDNN's u8 reorder took 0.10). The
  // values are those of the stem kernel bit for bit (the same FMAs in the same order: trained weights identical);
  // false, doing nothing, where the step does not apply.
  bool stem_pool_in_registers(Ctx& c, ConvPlan& p, const PoolArgShape& ps, const Dims& pd, keel_tensor_t* out,
                              keel_tensor_t* arg) {
    const Dims& x = c.dims(0);
    const Dims& y = p.out_dims;
    ConvPoolShape s;
    s.n = x[0], s.c = x[1], s.h = x[2], s.w = x[3], s.m = y[1], s.kh = w_dims_[2], s.kw = w_dims_[3];
    s.pt = p.stem_pads[0], s.pl = p.stem_pads[1], s.oh = y[2], s.ow = y[3], s.relu = act_.set;
    s.pkh = ps.kh, s.pkw = ps.kw, s.psh = ps.sh, s.psw = ps.sw, s.ph = ps.oh, s.pw = ps.ow;
    if (s.m < 32 || !conv_pool_check(s).empty() || !conv_pool_2x2(s)) return false;  // (p.stem: AVX-512 present)
    const int team = std::max(1, omp_get_max_threads());
    auto* packed = static_cast<float*>(c.workspace(conv_pool_packed_floats(s) * sizeof(float)));
    conv_pool_pack_weights(s, stem_weights(c), packed);
    auto* bias = static_cast<float*>(c.workspace(static_cast<uint64_t>(s.m) * sizeof(float)));
    const float* b = stem_bias(c);
    for (int64_t k = 0; k < s.m; ++k) bias[k] = b ? b[k] : 0.f;
    auto* scratch = static_cast<float*>(c.workspace(conv_pool_scratch_floats(s) * team * sizeof(float)));
    PooledReorders& r = pooled_reorders(p, pd, 16);
    const uint64_t elems = static_cast<uint64_t>(s.n * s.m * s.ph * s.pw);
    bind(r.p_blk, c.workspace(elems * sizeof(float)));
    if (arg) bind(r.a_blk, c.workspace(elems));
    conv_pool_run(s, static_cast<const float*>(c.input(0)->data), packed, bias,
                  static_cast<float*>(r.p_blk.get_data_handle()), scratch, team,
                  arg ? static_cast<uint8_t*>(r.a_blk.get_data_handle()) : nullptr);
    auto& st = stream();
    bind(r.p_plain, out->data);
    r.p_to_plain.execute(st, r.p_blk, r.p_plain);
    st.wait();
    if (arg) {
      blocked16_to_plain(static_cast<const uint8_t*>(r.a_blk.get_data_handle()), static_cast<uint8_t*>(arg->data), s.n,
                         s.m, s.ph * s.pw);
    }
    return true;
  }

  PooledReorders& pooled_reorders(ConvPlan& p, const Dims& pd, int64_t block) {
    if (!p.pooled) {
      auto r = std::make_unique<PooledReorders>();
      const tag bt = channel_block_tag(block);
      auto& eng = engine();
      r->p_blk = dnnl::memory({to_dnnl(pd), dt::f32, bt}, eng, nullptr);
      r->p_plain = dnnl::memory({to_dnnl(pd), dt::f32, tag::nchw}, eng, nullptr);
      r->a_blk = dnnl::memory({to_dnnl(pd), dt::u8, bt}, eng, nullptr);
      r->a_plain = dnnl::memory({to_dnnl(pd), dt::u8, tag::nchw}, eng, nullptr);
      r->p_to_plain = dnnl::reorder(r->p_blk, r->p_plain);
      r->a_to_plain = dnnl::reorder(r->a_blk, r->a_plain);
      p.pooled = std::move(r);
    }
    return *p.pooled;
  }

  // Switches `p` to its forward_training primitive (ConvPlan::varying); stays on the cached transform if refused.
  void start_varying(ConvPlan& p) const {
    if (!p.varying_desc) return;
    try {
      dnnl::convolution_forward::primitive_desc pd(*p.varying_desc, act_.attr(), engine());
      if (pd.src_desc() != p.src_prim.get_desc() || pd.dst_desc() != p.dst_prim.get_desc()) throw Reject{"layouts"};
      p.varying_prim = dnnl::convolution_forward(pd);
      p.varying_wei = dnnl::memory(pd.weights_desc(), engine(), nullptr);
      p.varying_wei_reorder = dnnl::reorder(p.wei_user, p.varying_wei);
      p.varying = true;
      p.wei_seen = {};
      p.wei_prim = dnnl::memory();  // the cached transform is not used again
    } catch (const dnnl::error&) {
    } catch (const Reject&) {}
    p.varying_desc.reset();
  }

  std::unique_ptr<ConvPlan> build(const Ctx& c, const Dims& x) {
    if (static_cast<int>(x.size()) != rank_) throw Reject{"input rank changed"};
    const int64_t N = x[0], C = x[1];
    const size_t r = rank_ - 2;
    Dims in(x.begin() + 2, x.end()), ks(w_dims_.begin() + 2, w_dims_.end());
    auto p = std::make_unique<ConvPlan>();
    int64_t M;
    Dims wei;  // oneDNN weights dims: [g,] O, I, k...
    Geometry g;
    if (!transpose_) {
      M = w_dims_[0];
      if (C != w_dims_[1] * group_ || M % group_ != 0) throw Reject{"channels do not match the weights and group"};
      g = conv_geometry(c, in, ks);
      wei = group_ > 1 ? Dims{group_, M / group_, C / group_} : Dims{M, C};
    } else {
      if (C != w_dims_[0] || C % group_ != 0) throw Reject{"channels do not match the weights and group"};
      M = w_dims_[1] * group_;
      g.strides = c.attr_ints("strides", Dims(r, 1));
      g.dilations = c.attr_ints("dilations", Dims(r, 1));
      Dims pads = c.attr_ints("pads", Dims(2 * r, 0));
      if (c.attr_s("auto_pad", "NOTSET") == "VALID") pads.assign(2 * r, 0);
      Dims opad = c.attr_ints("output_padding", Dims(r, 0));
      if (g.strides.size() != r || g.dilations.size() != r || pads.size() != 2 * r || opad.size() != r)
        throw Reject{"attribute rank mismatch"};
      g.pads_l.assign(pads.begin(), pads.begin() + r);
      g.pads_r.resize(r);
      g.out.resize(r);
      for (size_t i = 0; i < r; ++i) {
        int64_t eff = (ks[i] - 1) * g.dilations[i] + 1;
        g.out[i] = g.strides[i] * (in[i] - 1) + opad[i] + eff - pads[i] - pads[i + r];
        g.pads_r[i] = pads[i + r] - opad[i];
        if (g.out[i] <= 0) throw Reject{"empty output"};
        if (g.pads_r[i] < 0) throw Reject{"output_padding larger than the end pad"};
      }
      wei = group_ > 1 ? Dims{group_, M / group_, C / group_} : Dims{M, C};
    }
    for (int64_t k : ks) wei.push_back(k);
    Dims y{N, M};
    for (int64_t o : g.out) y.push_back(o);
    p->out_dims = y;
    if (numel(y) == 0) throw Reject{"empty output"};
    // An image model's first layer: the stem convolution's own kernel, no primitive (stem_conv).
    if (!transpose_ && r == 2 && group_ == 1 && C <= 4 && ks[0] <= 7 && ks[1] <= 7 && g.strides == Dims{1, 1} &&
        g.dilations == Dims{1, 1} && (!act_.set || (act_.alg == dnnl::algorithm::eltwise_relu && act_.alpha == 0.f)) &&
        stem_conv_enabled()) {
      p->stem = true;
      p->stem_pads = {g.pads_l[0], g.pads_l[1], g.pads_r[0], g.pads_r[1]};
      p->impl = "keel_stem_conv";
      return p;
    }

    dnnl::memory::desc src_any(to_dnnl(x), dt::f32, tag::any), dst_any(to_dnnl(y), dt::f32, tag::any),
        wei_any(to_dnnl(wei), dt::f32, tag::any), bias_md({M}, dt::f32, tag::a), none;
    auto& eng = engine();
    dnnl::primitive_desc_base pd_base;
    dnnl::memory::desc src_md, dst_md, wei_md;
    if (!transpose_) {
      std::unique_ptr<dnnl::convolution_forward::primitive_desc> pd;
      bool wino = options().winograd && r == 2 && ks[0] == 3 && ks[1] == 3 && group_ == 1 && g.strides[0] == 1 &&
                  g.strides[1] == 1 && g.dilations[0] == 1 && g.dilations[1] == 1 && C >= 16 && M >= 16;
      if (wino) {
        try {
          dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_winograd,
                                            src_any, wei_any, has_bias_ ? bias_md : none, dst_any, to_dnnl(g.strides),
                                            minus_one(g.dilations), to_dnnl(g.pads_l), to_dnnl(g.pads_r));
          pd = std::make_unique<dnnl::convolution_forward::primitive_desc>(d, act_.attr(), eng);
        } catch (const dnnl::error&) {
          pd.reset();
        }
      }
      auto direct = [&](const dnnl::memory::desc& sm, const dnnl::memory::desc& dm) {
        dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, sm,
                                          wei_any, has_bias_ ? bias_md : none, dm, to_dnnl(g.strides),
                                          minus_one(g.dilations), to_dnnl(g.pads_l), to_dnnl(g.pads_r));
        return std::make_unique<dnnl::convolution_forward::primitive_desc>(d, act_.attr(), eng);
      };
      // The activations arrive and leave in the plain layout, so the primitive's own layouts cost reorders around it.
      // Left to choose (`any`), oneDNN 2.6 takes brgconv over nhwc, whose reorders from and to nchw are plain
      // transposes (jit:uni, ~3 GB/s here); its jit kernel over nChw16c (a plain source below 16 channels, as a first
      // layer's) reorders through jit:blk instead. Measured here, 1 thread, plain in and out, reorders included:
      // SimpleCNN's 1->32 3x3 at batch 64 2.48 -> 0.89 ms, 3->32 3x3 pad 1 at 32x32 4.37 -> 1.82 ms, 32->64 3x3 at
      // 13x13 2.52 -> 2.24 ms, 16->32 5x5 1.74 -> 1.28 ms, a 7x7 stride-2 stem at 224x224 2.02 -> 1.84 ms, a 1x1
      // 64->64 at 8x56x56 3.10 -> 2.67 ms (2 threads: 1.24 -> 0.46, 2.29 -> 0.95, 2.81 -> 2.40 ms). So the blocked
      // layouts are asked for first, and `any` is the fallback.
      if (!pd && M % 16 == 0) {
        try {
          pd = direct(dnnl::memory::desc(to_dnnl(x), dt::f32, C < 16 ? plain_tag(x.size()) : blocked16_tag(x.size())),
                      dnnl::memory::desc(to_dnnl(y), dt::f32, blocked16_tag(y.size())));
          const std::string impl = pd->impl_info_str();
          if (impl.rfind("ref", 0) == 0 || impl.find("gemm") != std::string::npos) pd.reset();
        } catch (const dnnl::error&) {
          pd.reset();
        }
      }
      if (!pd) pd = direct(src_any, dst_any);
      src_md = pd->src_desc();
      dst_md = pd->dst_desc();
      wei_md = pd->weights_desc();
      p->impl = pd->impl_info_str();
      p->prim = dnnl::convolution_forward(*pd);
    } else {
      dnnl::deconvolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct,
                                          src_any, wei_any, has_bias_ ? bias_md : none, dst_any, to_dnnl(g.strides),
                                          minus_one(g.dilations), to_dnnl(g.pads_l), to_dnnl(g.pads_r));
      dnnl::deconvolution_forward::primitive_desc pd(d, user_scratchpad(), eng);
      src_md = pd.src_desc();
      dst_md = pd.dst_desc();
      wei_md = pd.weights_desc();
      p->impl = pd.impl_info_str();
      p->prim = dnnl::deconvolution_forward(pd);
    }
    dnnl::memory::desc src_plain(to_dnnl(x), dt::f32, plain_tag(x.size()));
    dnnl::memory::desc dst_plain(to_dnnl(y), dt::f32, plain_tag(y.size()));
    // User weights: Conv W is [M, C/g, k...] = [g, M/g, C/g, k...] (goihw); ConvTranspose W is [C, M/g, k...] =
    // [g, C/g, M/g, k...], i.e. giohw with oneDNN's (O = M/g, I = C/g) order.
    tag wtag;
    if (!transpose_) {
      static const tag t[2][3] = {{tag::oiw, tag::oihw, tag::oidhw}, {tag::goiw, tag::goihw, tag::goidhw}};
      wtag = t[group_ > 1][r - 1];
    } else {
      static const tag t[2][3] = {{tag::bac, tag::iohw, tag::iodhw}, {tag::acbd, tag::giohw, tag::giodhw}};
      wtag = t[group_ > 1][r - 1];
    }
    dnnl::memory::desc wei_plain(to_dnnl(wei), dt::f32, wtag);

    p->src_user = dnnl::memory(src_plain, eng, nullptr);
    p->dst_user = dnnl::memory(dst_plain, eng, nullptr);
    p->reorder_src = src_md != src_plain;
    p->reorder_dst = dst_md != dst_plain;
    p->src_prim = p->reorder_src ? dnnl::memory(src_md, eng, nullptr) : p->src_user;
    p->dst_prim = p->reorder_dst ? dnnl::memory(dst_md, eng, nullptr) : p->dst_user;
    if (p->reorder_src) p->src_reorder = dnnl::reorder(p->src_user, p->src_prim);
    if (p->reorder_dst) p->dst_reorder = dnnl::reorder(p->dst_prim, p->dst_user);
    p->reorder_wei = wei_md != wei_plain;
    if (!w_const_.empty()) {
      // Weights reordered once, into memory the plan owns.
      dnnl::memory user(wei_plain, eng, w_const_.data());
      p->wei_prim = dnnl::memory(wei_md, eng);
      if (p->reorder_wei) {
        dnnl::reorder(user, p->wei_prim).execute(stream(), user, p->wei_prim);
        stream().wait();
      } else {
        std::copy(w_const_.begin(), w_const_.end(), static_cast<float*>(p->wei_prim.get_data_handle()));
      }
    } else {
      p->wei_user = dnnl::memory(wei_plain, eng, nullptr);
      p->cache_wei = p->reorder_wei && wei_md.data.format_kind == dnnl_format_kind_wino;
      if (p->cache_wei)
        p->varying_desc.emplace(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_winograd, src_md,
                                dnnl::memory::desc(to_dnnl(wei), dt::f32, tag::any),
                                has_bias_ ? dnnl::memory::desc({M}, dt::f32, tag::a) : dnnl::memory::desc(), dst_md,
                                to_dnnl(g.strides), minus_one(g.dilations), to_dnnl(g.pads_l), to_dnnl(g.pads_r));
      // A cached transform lives in memory the plan owns; other layouts go through the run's workspace.
      p->wei_prim =
          p->reorder_wei ? dnnl::memory(wei_md, eng, p->cache_wei ? DNNL_MEMORY_ALLOCATE : nullptr) : p->wei_user;
      if (p->reorder_wei) p->wei_reorder = dnnl::reorder(p->wei_user, p->wei_prim);
    }
    if (has_bias_) {
      if (!b_const_.empty()) {
        if (static_cast<int64_t>(b_const_.size()) != M) throw Reject{"bias size differs from output channels"};
        p->bias = dnnl::memory(bias_md, eng);
        std::copy(b_const_.begin(), b_const_.end(), static_cast<float*>(p->bias.get_data_handle()));
      } else {
        p->bias = dnnl::memory(bias_md, eng, nullptr);
      }
    }
    return p;
  }

  bool transpose_, fused_, pooled_;
  PoolArgShape pool_;  // kh, kw, sh, sw: the pool window (pooled_)
  FusedActivation act_;
  int rank_ = 0;
  int64_t group_ = 1;
  Dims w_dims_;
  std::vector<float> w_const_, b_const_;
  bool has_bias_ = false;
  PlanCache<ConvPlan> plans_;
};

}  // namespace

std::vector<KernelInfo> conv_kernels() {
  return {
      {"Conv", 1, 0, "onednn_f32_conv", [] { return static_cast<Kernel*>(new ConvKernel(false)); }},
      {"ConvTranspose", 1, 0, "onednn_f32_convtranspose", [] { return static_cast<Kernel*>(new ConvKernel(true)); }},
      // Secondary (KEEL_KERNEL_FLAG_SECONDARY): ranked below Conv, so that fuse_conv_activation leaves sessions' Conv +
      // activation to the chains, which fuse them in their own layouts; eager's conv2d_relu runs on it.
      {"FusedConv", 1, 0, "onednn_f32_keel_fusedconv", [] { return static_cast<Kernel*>(new ConvKernel(false, true)); },
       "keel", KEEL_KERNEL_FLAG_SECONDARY},
      // eager's conv2d_relu_max_pool2d.
      {"FusedConvMaxPool", 1, 0, "onednn_f32_keel_fusedconvmaxpool",
       [] { return static_cast<Kernel*>(new ConvKernel(false, true, true)); }, "keel"},
  };
}

}  // namespace keel::onednn
