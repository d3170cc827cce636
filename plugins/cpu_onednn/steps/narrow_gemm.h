// plugins/cpu_onednn/steps/narrow_gemm.h — (internal) a product with few output columns, Y [m,n] = X [m,k] W [k,n]
// + bias with n <= 16 and a long k (a small CNN's classifier over its flattened features), as one step of the
// chains' own.
//
// oneDNN's matmul runs such a product at about half of the FMA peak (the peers' simple_cnn at batch 32, [32,7200] x
// [7200,10]: 0.048 ms at 1 thread, 20-30% of the model after its fused convolution and pooling): its kernels block
// the columns by 16 or more, so 10 columns leave most of each vector idle or ask a load per FMA. Here W is packed
// column by column ([n][k rounded up to 16], zero padded) and each tile keeps up to 4 rows by up to 5 columns of
// 16-float partial sums in registers: per 16 values of k it loads 4 row vectors and 5 column vectors for 20 FMAs,
// and sums each accumulator's lanes at the end (0.027 ms for the product above).
#pragma once

#include <cstddef>
#include <cstdint>

namespace keel::onednn {

struct NarrowGemmShape {
  int64_t m = 0, k = 0, n = 0;  // X [m,k] plain (rows of k floats), W [k,n], Y [m,n] plain
};

// The widest product the step takes (its columns in groups of at most 5).
constexpr int64_t kNarrowGemmMaxColumns = 16;

// Floats of the packed weights: n * (k rounded up to 16).
size_t narrow_gemm_packed_floats(const NarrowGemmShape& s);

// Packs W [k][n] (row-major, as ONNX's Gemm B without transB) into packed (narrow_gemm_packed_floats(s) floats):
// column c's k values at c * kp, zeros up to kp (k rounded up to 16). So W given as [n][k] (Gemm's transB) with k a
// multiple of 16 is packed already (the eager Gemm kernel reads it so, kernels/matmul.cc).
void narrow_gemm_pack(const NarrowGemmShape& s, const float* w, float* packed);

// Rows [begin, end) of Y = X W + bias (bias [n], null: none). AVX-512 when the CPU has it (steps/silu.h's
// has_avx512f) and `vector` is true, else scalar code (vector = false: for tests). Thread-safe for disjoint row
// ranges (reads x, packed and bias; writes those rows of y).
void narrow_gemm_rows(const NarrowGemmShape& s, const float* x, const float* packed, const float* bias, float* y,
                      int64_t begin, int64_t end, bool vector = true);

// The whole of it over `team` OpenMP threads (contiguous ranges of rows, in blocks of 4).
void narrow_gemm_run(const NarrowGemmShape& s, const float* x, const float* packed, const float* bias, float* y,
                     int team);

// The same by straightforward loops over the unpacked W [k][n] in double precision (the reference for tests).
void narrow_gemm_reference(const NarrowGemmShape& s, const float* x, const float* w, const float* bias, float* y);

}  // namespace keel::onednn
