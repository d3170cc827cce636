// plugins/cpu_onednn/steps/wide_gemm.h — (internal) Y [M,N] = alpha * A' B for a wide output over a shallow inner
// dimension, B [K,N] row-major as given (not transposed), A [M,K] row-major or, transposed, stored [K,M]: the eager
// Gemm / MatMul's products that sgemm_wins picks (kernels/matmul.cc), such as a linear layer's input gradient.
//
// Why: dnnl_sgemm spent 1.53 ms a step (99 GFLOP/s, 1 thread) on the LeNet-like fc1's dX [64,128] x [128,9216], the
// eager profile's slowest product. Here 64 output columns make a block (four vectors, the last masked past N) and 6
// rows of A a tile, so 24 sums stay in registers over the whole inner dimension while the block's K x 64 floats of B
// (32 KB at K = 128) stay in the L1/L2 cache for every row tile; the blocks of columns are split over the team.
//
// Needs AVX-512 F (the caller checks steps/silu.h's has_avx512f). Thread-safety: stateless; concurrent calls with
// distinct outputs are safe.
#pragma once

#include <cstdint>

namespace keel::onednn {

// y = alpha * op(a) b over `threads` OpenMP threads; op(a) = a [M,K] row-major, or with ta a stored [K,M].
void wide_gemm_f32(const float* a, bool ta, const float* b, float* y, int64_t M, int64_t K, int64_t N, float alpha,
                   int threads);

}  // namespace keel::onednn
