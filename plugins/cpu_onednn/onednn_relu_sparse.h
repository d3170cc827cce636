// plugins/cpu_onednn/onednn_relu_sparse.h — (internal) C = A x B (+ bias) (+ C) that skips A's exact zeros: a
// feed-forward block's second product, whose A is a Relu's output (about half of it 0), as a step of the chains' own.
//
// oneDNN's matmul runs such a product at about the FMA peak whatever A holds. Here, per row of A and block of K whose
// B rows stay in L1, the nonzeros of A are found by one compare per 16 entries and compressed into a short list; each
// nonzero then costs one broadcast and width/16 FMAs against its B row, with the output row (up to 256 columns) held
// in registers across the block. Dense rows cost about what oneDNN does; the step (onednn_subgraph.cc) measures A's
// density per run and takes oneDNN's primitive above relu_sparse_max_density(). See PERFORMANCE.md, "(rsp)".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel::onednn {

// C [m, n] (row stride n) = A [m, k] (row stride lda >= k) x B [k, n] + bias [n] (optional), plus C's own contents
// when `accumulate` (a residual already in place, as oneDNN's sum post-op).
struct ReluSparseShape {
  int64_t m = 0, k = 0, n = 0, lda = 0;
  bool accumulate = false;
};

// "" when the step computes this shape, else what it does not take (n a positive multiple of 16, k >= 1, m >= 0,
// lda >= k).
std::string relu_sparse_check(const ReluSparseShape& s);

// Packs B [k][n] (row-major) into the step's layout: column tiles of up to 256 columns, each [k][tile width].
// relu_sparse_packed_floats(s) floats at `packed`.
size_t relu_sparse_packed_floats(const ReluSparseShape& s);
void relu_sparse_pack(const ReluSparseShape& s, const float* b, float* packed);

// Computes the rows [begin, end) of C. A zero of A (+0 or -0) contributes nothing, which is exact for finite B:
// the caller takes this step only for finite weights (relu_sparse_finite). A NaN in A reaches its row as in a dense
// product. Thread-safe for disjoint ranges; AVX-512 when the CPU has it (onednn_silu.h's has_avx512f), else scalar
// code (also taken after relu_sparse_force_scalar(true)).
void relu_sparse_rows(const ReluSparseShape& s, const float* a, const float* packed, const float* bias, float* c,
                      int64_t begin, int64_t end);

// The whole of it over `team` OpenMP threads (contiguous ranges of rows).
void relu_sparse_run(const ReluSparseShape& s, const float* a, const float* packed, const float* bias, float* c,
                     int team);

// The fraction of nonzero entries in every `row_step`-th row of A (rows 0, row_step, ...): the per-run estimate that
// chooses between this step and the dense product. Runs on the calling thread; reads about m * k / row_step floats.
double relu_sparse_density(const ReluSparseShape& s, const float* a, int64_t row_step);

// The density above which the dense product is faster on this machine's measurements (PERFORMANCE.md, "(rsp)").
double relu_sparse_max_density();

// True when every entry of w [count] is finite (skipping 0 * w is exact only then).
bool relu_sparse_finite(const float* w, size_t count);

// Test hook: true makes relu_sparse_rows take its scalar code from now on; false restores the dispatch by CPU.
void relu_sparse_force_scalar(bool on);

// The same in double precision by straightforward loops over B [k][n] (the reference the step is tested against);
// C as in the step (its contents added when s.accumulate).
void relu_sparse_reference(const ReluSparseShape& s, const float* a, const float* b, const float* bias, float* c);

}  // namespace keel::onednn
