// plugins/cpu_onednn/steps/skinny_gemm.h — (internal) a product of few rows and large constant weights,
// Y [m,n] = X [m,k] W [k,n] + bias (+ Y's previous values: a residual summed in place), m <= 64, as one step of the
// chains' own: ConvNeXt's last-stage MLP ([49,768] x [768,3072] and [49,3072] x [3072,768], 9.4 MB of weights each).
//
// With so few rows the weights are the traffic: each of their floats serves m FMAs, read once from memory per run.
// oneDNN's brgemm matmul ran these at 164 GFLOP/s on one core of the 2-vCPU AMD EPYC host (77% of its FMA peak;
// 1.41-1.43 ms, against 1.13-1.19 ms for the same arithmetic with 196-3136 rows). Here the weights are packed in
// blocks of 64 columns ([n/64][k][64], each block contiguous) and a tile keeps up to 6 rows by 64 columns of sums in
// 24 registers over a chunk of k (7 rows need 33 registers: one sum spilled to the stack cost 10%): per k it loads the
// block's 4 vectors and broadcasts 6 values of X for 24 FMAs, the block's chunk staying in L2 for every row tile;
// while a block is multiplied, each row tile prefetches its share of the next block's chunk (one line every few k),
// so the next block arrives from memory spread over the current one's work instead of in a burst. Standalone with the
// weights evicted before every run: 1.16-1.19 / 1.25-1.27 ms at 1 thread for ConvNeXt's two shapes. It is not a
// general win: with weights that stay in cache, or 16 rows, oneDNN's kernels were faster (the chain's rule,
// Builder::skinny_gemm, takes 32-64 rows and 8 MiB of weights or more). See docs/ONEDNN_PERFORMANCE.md, "(skinny)".
//
// Needs AVX-512 F (skinny_gemm_check says so). Thread-safety: stateless; concurrent calls with distinct outputs are
// safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace keel::onednn {

struct SkinnyGemmShape {
  int64_t m = 0, k = 0, n = 0;  // X [m,k] plain (rows of k floats), W [k,n], Y [m,n] plain
  bool sum = false;             // Y holds a residual before the run: the product and bias are added to it
  bool relu = false;            // then max(0, .)
  float relu_max = std::numeric_limits<float>::infinity();  // with relu, then min(., relu_max) (ReLU6: 6)
  bool y_blocked16 = false;  // Y as nChw16c [1, n, m pixels] (a convolution's output, steps/im2row.h), n's 16
};                           // channels of a pixel together, planes of m pixels; else plain [m][n]

constexpr int64_t kSkinnyGemmMaxRows = 64;

// "" when the step computes this shape on this CPU (AVX-512, 1 <= m <= kSkinnyGemmMaxRows, n >= 1 (a multiple of 16
// for y_blocked16), k >= 1), else what it does not take.
std::string skinny_gemm_check(const SkinnyGemmShape& s);

// Floats of the packed weights: k * n, n rounded up to 64.
size_t skinny_gemm_packed_floats(const SkinnyGemmShape& s);

// Packs W into blocks of 64 columns ([n/64][k][64], the last zero-padded): W as [k][n] row-major, or (`transposed`,
// ONNX Gemm's transB) as [n][k].
void skinny_gemm_pack(const SkinnyGemmShape& s, const float* w, bool transposed, float* packed);

// Y = X W + bias (+ Y, when s.sum; then Relu, capped at s.relu_max, when s.relu) over `team` OpenMP threads (team <= 1:
// the calling thread), each on its own range of column blocks. bias [n] or null.
void skinny_gemm_run(const SkinnyGemmShape& s, const float* x, const float* packed, const float* bias, float* y,
                     int team);

// The same by straightforward loops over W [k][n] in double precision (the reference for tests).
void skinny_gemm_reference(const SkinnyGemmShape& s, const float* x, const float* w, const float* bias, float* y);

}  // namespace keel::onednn
