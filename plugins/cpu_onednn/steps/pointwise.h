// plugins/cpu_onednn/steps/pointwise.h — (internal) a 1x1 stride-1 convolution over nChw16c memory, with its bias,
// an optional residual sum and Relu (or Clip(0, hi)), as one step of the chains' own: the product of the pixels and
// the weights that oneDNN's jit_1x1 kernel computes.
//
// A register tile of 14 pixels by 32 output channels keeps 28 sums in registers over every input channel (per channel
// 2 weight vectors loaded, 14 pixel values broadcast, 28 FMAs); a thread goes group by group over its range of
// tiles, so each group's weights ([c][32]) stay in L2 across them. Standalone at 1 thread it runs ResNet-50's 1x1s
// at 181-207 GFLOP/s (75-85% of the host's FMA peak), as jit_1x1 does. In the chain (per-step sums of the fastest
// runs) SqueezeNet 1.1's 1x1s took 1.40-1.42 ms instead of 1.49-1.54 at 1 thread and 0.91-0.92 instead of 1.02-1.15 at
// 2 (its small squeezes and expands, where jit_1x1's per-call cost shows), DeepLabV3's 1-5% less, ResNet-50's level
// (docs/ONEDNN_PERFORMANCE.md, "(pw)"). While a group's tiles run, the next group's weights are prefetched into L2
// (ResNet-50's 1x1s 1-4% less, DeepLabV3's large ones 5-7%: "(pf)").
//
// Needs AVX-512 F (pointwise_check says so). Thread-safety: stateless; concurrent calls with distinct outputs are
// safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace keel::onednn {

struct PointwiseShape {
  int64_t n = 1, c = 16, m = 16, h = 1, w = 1;  // source nChw16c [n, c, h, w], destination nChw16c [n, m, h, w]
  bool sum = false;                             // the destination holds a residual: the product and bias added to it
  bool relu = false;                            // then max(0, .)
  float relu_max = std::numeric_limits<float>::infinity();  // with relu, then min(., relu_max) (ReLU6: 6)
};

// "" when the step computes this shape on this CPU (AVX-512; c and m multiples of 16; a non-empty image), else what it
// does not take.
std::string pointwise_check(const PointwiseShape& s);

// Floats of the packed weights: c * m.
size_t pointwise_packed_floats(const PointwiseShape& s);

// Packs ONNX weights [m][c] (OIHW with 1x1 taps) into the step's layout: per group of 32 output channels (the last
// 16 wide when m is an odd number of 16-channel blocks), [c][group width].
void pointwise_pack_weights(const PointwiseShape& s, const float* w, float* packed);

// dst = src * weights + bias (+ dst when s.sum; then Relu, capped at s.relu_max, when s.relu) over `team` OpenMP
// threads (team <= 1: the calling thread), each on its own range of tiles, or of output groups where the weights
// outweigh the source. Reads src, packed and bias [m] (null: zeros); writes every element of dst.
void pointwise_run(const PointwiseShape& s, const float* src, const float* packed, const float* bias, float* dst,
                   int team);

// The same by direct summation in double precision over ONNX weights [m][c] (the reference the step is tested
// against), into nChw16c dst (read first when s.sum).
void pointwise_reference(const PointwiseShape& s, const float* src, const float* w, const float* bias, float* dst);

}  // namespace keel::onednn
