// plugins/cpu_onednn/steps/attention.h — (internal) fused scaled dot-product attention, keel.Attention
// (ops/schemas.cc): Y = softmax(Q @ Kt * scale + mask, last axis) @ V, as one pass per (batch entry, block of query
// rows): the block's scores are computed into the thread's scratch (in its L1/L2 cache), scaled, masked and
// normalised there, and multiplied by V straight away; the [.., S, T] scores never go to memory.
//
// The operands are strided views (element strides, any order), so a claimed chain (chain/ops/attention.cc) reads Q, K
// and V where the in-projection wrote them (the graph's Slice / Reshape / Transpose are views) and writes Y into the
// layout its Transpose wants; the standalone kernel passes dense row-major strides. Batch dimensions broadcast as
// MatMul's (size 1 or absent: stride 0), the mask as Add's against the scores [batch..., S, T].
//
// AVX-512 (runtime-checked, steps/silu.h's has_avx512f): Kt is packed per batch entry into [D][T rounded up to 16]
// (once per thread and batch entry), the scores come from a 6-8 rows x 64 columns register tile, exp from a
// degree-5 polynomial (relative error below 1e-6), and the product with V from a rows x 64 tile that applies
// 1 / sum at the store. Without AVX-512: the same blocks in scalar loops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace keel::onednn {

using Dims = std::vector<int64_t>;  // as common/common.h's
struct TypedKernelInfo;             // common/common.h

// An operand: its dims and element strides (same rank; a stride may be anything, including 0).
struct StridedView {
  Dims dims, strides;
};

// Dense row-major strides of `dims`.
Dims dense_strides(const Dims& dims);

// The strides under which a view of `dims` with `strides` reads as `to` (same element count) without moving data,
// as numpy's reshape without a copy: each group of source dims that `to` splits or merges must be contiguous
// within itself (e.g. [128,1,256] strides [768,768,1] as [128,4,64]: [768,64,1]). False when no such strides
// exist (or an element count is 0). The chains' Reshape of a strided view (the heads' split of a q/k/v slice).
bool reshape_strides(const Dims& dims, const Dims& strides, const Dims& to, Dims* to_strides);

// The reshape of a strided view that reshape_strides cannot express as one view (a batched [S, B, E] q/k/v slice of a
// packed in-projection split into heads, [S, B, H, Dh] merged into [S, B*H, Dh]: B and H are not contiguous with
// each other): the finest dims that both `dims` and `to` are made of, `atoms` (each within one dim of `dims`, so with
// one stride: `atom_strides`), and for each dim of `to` the atoms it merges, outermost first (`groups`, indices into
// atoms). False where no such refinement exists (a dim of `to` cuts a dim of `dims` unevenly), counts differ, or a
// dim is 0 or 1 (reshape_strides takes those cases). Thread-safe.
bool reshape_atoms(const Dims& dims, const Dims& strides, const Dims& to, Dims* atoms, Dims* atom_strides,
                   std::vector<Dims>* groups);

// What one run computes, in elements. Operand p of batch entry b, row r, column c is at
// p + p_off[b] + r * p_row + c * p_col.
struct AttentionShape {
  int64_t batches = 1;
  int64_t S = 0, T = 0, D = 0, Dv = 0;                     // query rows, key columns, head dim of Q/K, of V
  int64_t q_row = 0, q_col = 0;                            // Q [S, D]
  int64_t k_row = 0, k_col = 0;                            // Kt [D, T]
  int64_t v_row = 0, v_col = 0;                            // V [T, Dv]
  int64_t m_row = 0, m_col = 0;                            // mask [S, T] (broadcast: 0)
  int64_t o_row = 0, o_col = 0;                            // Y [S, Dv]
  std::vector<int64_t> q_off, k_off, v_off, m_off, o_off;  // per batch entry (m_off empty without a mask)
  bool has_mask = false;
  float scale = 1.f;
  int64_t rows = 1;  // query rows per task (attention_plan)
  int64_t tasks() const { return batches * ((S + rows - 1) / rows); }
};

// The output dims of Attention(Q, Kt, V, [mask]) for these operand dims (the reference kernel's rules: ranks >= 2,
// batch dims broadcast as MatMul's, V's batch dims within the scores', the mask broadcasting to the scores), or ""
// in *why with the reason when they do not fit. Thread-safe.
bool attention_out_dims(const Dims& q, const Dims& kt, const Dims& v, const Dims* mask, Dims* out, std::string* why);

// The shape of a run over these views (their dims must have passed attention_out_dims; `out` has its dims), with
// the row block chosen for a team of `team` threads (at least 2 tasks per thread where the rows allow, the block
// of scores within 64 KiB). Thread-safe.
AttentionShape attention_plan(const StridedView& q, const StridedView& kt, const StridedView& v,
                              const StridedView* mask, const StridedView& out, float scale, int team);

// Floats of scratch one thread needs.
size_t attention_scratch_floats(const AttentionShape& s);

// Runs tasks [begin, end) (task = batch entry * row blocks + row block) with `scratch` (attention_scratch_floats(s)
// floats, no alignment needed). Thread-safe for disjoint task ranges with their own scratch and disjoint outputs.
// `mask` may be null when !s.has_mask.
void attention_tasks(const AttentionShape& s, const float* q, const float* kt, const float* v, const float* mask,
                     float* y, int64_t begin, int64_t end, float* scratch);

// All tasks over `team` OpenMP threads (contiguous task ranges: a thread packs each batch entry's Kt once);
// scratch holds `team` times attention_scratch_floats(s) floats (with a stride, floats from one thread's part to the
// next: team * stride).
void attention_run(const AttentionShape& s, const float* q, const float* kt, const float* v, const float* mask,
                   float* y, float* scratch, int team, size_t stride = 0);

// attention_tasks' scalar path (what runs without AVX-512), callable on any CPU for its test.
void attention_tasks_scalar(const AttentionShape& s, const float* q, const float* kt, const float* v, const float* mask,
                            float* y, int64_t begin, int64_t end, float* scratch);

// The same by straightforward loops in double precision (the reference the fast path is tested against); a row
// whose scores are all -inf gives 0, as the reference kernel's.
void attention_reference(const AttentionShape& s, const float* q, const float* kt, const float* v, const float* mask,
                         float* y);

// The keel.Attention kernel outside a chain (dense inputs, f32 or bf16 computed in f32; kernels/attention.cc),
// registered by plugin.cc (the table lives as long as the process).
const std::vector<TypedKernelInfo>& attention_kernels();

}  // namespace keel::onednn
