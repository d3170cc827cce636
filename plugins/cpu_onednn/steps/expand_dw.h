// plugins/cpu_onednn/steps/expand_dw.h — (internal) a 1x1 convolution and the 3x3 or 5x5 depthwise convolution that
// reads its output, as one step of the chains' own: MobileNet's inverted residual block (expand, activation,
// depthwise, activation; optionally the projection and the residual after them, or a network's stem instead of the
// expansion) without the expanded tensor ever leaving the core's cache.
//
// In MobileNetV2 the expansion is the block's widest tensor (144 x 56 x 56 floats: 1.8 MB). Written by one step and
// read by the next, it goes out to L3 and, at 2 threads, half of it to the other core (a step reading lines the other
// vCPU wrote pays about 3x: docs/ONEDNN_PERFORMANCE.md, "Data written by the other core"). oneDNN 2.6 fuses the two
// (append_dw) only where the 1x1 kernel's blocking suits it, at 1 thread for two of MobileNetV2's 17 blocks.
// Here each thread takes a contiguous range of output rows (or, for images of few rows, of 32-channel groups): it
// computes the expansion row by row into a ring of k rows ([m/16][w+2p][16] with zero columns at both ends, L1/L2),
// each row as register tiles of up to 14 pixels x 32 channels over the input channels with the bias and the first
// activation applied in registers, and the depthwise output row from the ring with its bias and activation, written
// once in nChw16c. Where the two 1x1s' weights would not stay in L2 from one row to the next (MobileNetV2's 7x7
// blocks: 1.2-1.8 MB), a thread takes its rows at once instead, group by group (expand_dw_rows_at_once), the next
// group's weights prefetched while a group's run. Where it pays: chain/ops/conv_own_steps.cc (Builder::conv_expand_dw)
// and docs/ONEDNN_PERFORMANCE.md, "(xdw)", "(xdw7)", "(pf)".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel::onednn {

// An activation applied in registers: none, Relu, Clip [lo, hi] (ReLU6), hard-swish x * relu6(x + 3) / 6, or SiLU.
struct ExpandDwAct {
  enum Kind : uint8_t { kNone, kRelu, kClip, kHardSwish, kSilu } kind = kNone;
  float lo = 0.f, hi = 0.f;  // kClip's bounds
};

// The geometry: source nChw16c [n, c, h, w] (c any: the lanes of a partial last block are never read), a 1x1
// convolution to m channels (any) with bias and act1, then a depthwise k x k convolution (k 3 or 5), padding k / 2,
// stride 1 or 2, with bias and act2, into nChw16c [n, m, oh, ow] (a partial last block's other lanes written 0).
//
// Optionally the projection after it too (MobileNetV2's third convolution): a 1x1 convolution from the m depthwise
// channels to proj channels with its bias, plus the source when `residual` (proj == c, stride 1), then act3, into
// nChw16c [n, proj, oh, ow] instead (a partial last block's other lanes written 0). Each depthwise output row is then
// projected as soon as it is computed, from L1, and the team always splits rows.
//
// Or the first convolution is a network's stem instead (`stem`): a 3x3 stride-2 convolution with padding 1 over a
// plain [n, c, h, w] source of at most 8 channels (MobileNetV2's 3 -> 32 at 224x224), its output of eh x ew pixels
// the ring's rows.
struct ExpandDwShape {
  int64_t n = 1, c = 0, m = 0, h = 0, w = 0;
  int64_t k = 3, stride = 1;
  ExpandDwAct act1, act2;
  int64_t proj = 0;  // 0: no projection (dst is the depthwise output)
  bool residual = false;
  ExpandDwAct act3;
  bool stem = false;
  // src and dst bf16 (nChw16c; a chain at --precision bf16): the 1x1 stages multiply bf16 pairs of channels with f32
  // sums (vdpbf16ps, weights rounded to bf16 as oneDNN's bf16 convolutions do); the ring and the depthwise stage stay
  // f32, each output rounded to bf16 once. Needs AVX-512 BF16, an even c and no stem.
  bool bf16 = false;
  // How a thread takes its output rows with the projection (f32, no stem): -1 as expand_dw_rows_at_once says for a
  // team of 2 or more; 0 one by one; 1 at once (the chain sets it from the rule for its thread count; tests force
  // both).
  int at_once = -1;
  int64_t eh() const { return stem ? (h - 1) / 2 + 1 : h; }  // the first convolution's output (the ring's rows)
  int64_t ew() const { return stem ? (w - 1) / 2 + 1 : w; }
  int64_t oh() const { return (eh() - 1) / stride + 1; }
  int64_t ow() const { return (ew() - 1) / stride + 1; }
};

// "" when the step computes this shape on this CPU (AVX-512), else what it does not take (besides the geometry: with
// m not a multiple of 16, a Clip whose range leaves out 0, which would turn the padding lanes non-zero).
std::string expand_dw_check(const ExpandDwShape& s);

// The packed constants, m rounded up to mp, a multiple of 16 (zeros past m): the 1x1 weights per group of 32 output
// channels ([group][c][32], the last group 16 wide when mp is an odd number of 16-channel blocks), the depthwise
// weights [mp/16][k*k][16], the two biases [mp] each, then the projection's weights the same way over proj rounded
// up to 16 ([group][m][32]) and its bias; for bf16, then both 1x1s' weights again as bf16 pairs ([group][c/2][32][2],
// [group][m16/2][32][2]).
size_t expand_dw_packed_floats(const ExpandDwShape& s);
// From ONNX's first weights w1 [m][c][1][1] (a stem's [m][c][3][3], packed as c * 9 input channels), b1 [m], depthwise
// weights w2 [m][1][k][k] and b2 [m], and the projection's w3 [proj][m][1][1] and b3 [proj] (null without one).
void expand_dw_pack(const ExpandDwShape& s, const float* w1, const float* b1, const float* w2, const float* b2,
                    const float* w3, const float* b3, float* packed);

// Floats of scratch one thread of the team needs (its ring of k expanded rows, and a depthwise row to project; rows
// at once: every expanded row of one group, and the image's depthwise output).
size_t expand_dw_scratch_floats(const ExpandDwShape& s);

// Whether each thread takes its output rows at once instead of one by one: per 32-channel group, every expanded row
// they read (the group's 1x1 weights read once) and their depthwise output, kept whole; then the projection over all
// their pixels (its weights read once per 14 pixels). Where the two 1x1s' weights would not stay in L2 between rows
// (MobileNetV2's 7x7 blocks; for a team of one thread, `team`, its 14x14 ones too) and the depthwise output would:
// with the projection, f32, no stem.
bool expand_dw_rows_at_once(const ExpandDwShape& s, int team = 2);

// Whether a team of `team` threads splits the output rows (true) or the 32-channel groups (false: images of fewer
// than 7 output rows per thread, where recomputing the expansion's boundary rows would cost more than a quarter, and
// no projection, which needs every channel of a row).
bool expand_dw_splits_rows(const ExpandDwShape& s, int team);

// The whole step over `team` OpenMP threads (team <= 1: on the calling thread). Reads src and packed; writes every
// element of dst. scratch: team * expand_dw_scratch_floats(s) floats, thread t using the t-th part (best memory no
// value shares: the chain passes the run's scratchpad region; with a stride, floats from one thread's part to the
// next, team * stride: Exec::scratch_stride). Thread-safe for distinct scratch and dst. For bf16, src and dst hold bf16
// values (uint16_t) and are cast.
void expand_dw_run(const ExpandDwShape& s, const float* src, const float* packed, float* dst, float* scratch, int team,
                   size_t stride = 0);

// The same by direct summation in double precision (each convolution's output rounded to float, as two steps
// would), the reference the step is tested against; ONNX weights as expand_dw_pack takes them.
void expand_dw_reference(const ExpandDwShape& s, const float* src, const float* w1, const float* b1, const float* w2,
                         const float* b2, const float* w3, const float* b3, float* dst);

}  // namespace keel::onednn
