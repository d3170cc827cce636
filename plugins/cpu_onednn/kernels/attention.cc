// plugins/cpu_onednn/kernels/attention.cc — keel.Attention outside a claimed chain: the fused attention of
// steps/attention.h over dense f32 tensors, or bf16 ones (a mixed-precision graph: convert_precision runs
// keel.Attention in bf16) converted to f32 and back around it (inside a chain it runs as the chain's own step,
// chain/ops/attention.cc).
#include <omp.h>

#include <cstring>

#include "common/common.h"
#include "steps/attention.h"

namespace keel::onednn {
namespace {

// keel.Attention(Q, Kt, V, [mask]), attribute scale: a plan per input shapes and thread count, the scores in the
// core's workspace (per thread).
class AttentionKernel : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (c.input_count() < 3) throw Reject{"keel.Attention needs Q, Kt and V"};
    const int n = std::min(c.input_count(), 4);
    dtype_ = c.dtype(0);
    if (dtype_ != KEEL_DTYPE_F32 && dtype_ != KEEL_DTYPE_BF16) throw Reject{"f32 or bf16 only"};
    for (int i = 0; i < n; ++i)
      if (c.has_input(i) && c.dtype(i) != dtype_) throw Reject{"inputs of different dtypes"};
    if (c.output_dtype(0) != dtype_) throw Reject{"an output of another dtype"};
    scale_ = c.attr_f("scale", 1.f);
    // Shapes known now: what does not fit goes to the reference kernel (which names the problem).
    bool known = true;
    for (int i = 0; i < n; ++i) known = known && (!c.has_input(i) || c.dims_known(i));
    if (known) {
      const bool has_mask = n > 3 && c.has_input(3);
      const Dims m = has_mask ? c.dims(3) : Dims();
      Dims out;
      std::string why;
      if (!attention_out_dims(c.dims(0), c.dims(1), c.dims(2), has_mask ? &m : nullptr, &out, &why)) throw Reject{why};
    }
  }

  void run(Ctx& c) override {
    const bool has_mask = c.input_count() > 3 && c.has_input(3);
    const Dims q = c.dims(0), kt = c.dims(1), v = c.dims(2), m = has_mask ? c.dims(3) : Dims();
    const int team = omp_get_max_threads();
    Plan& p = plans_.get(shape_key(c), [&] {
      auto plan = std::make_unique<Plan>();
      std::string why;
      if (!attention_out_dims(q, kt, v, has_mask ? &m : nullptr, &plan->out, &why))
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "keel.Attention: " + why};
      const StridedView mv{m, dense_strides(m)};
      plan->shape = attention_plan({q, dense_strides(q)}, {kt, dense_strides(kt)}, {v, dense_strides(v)},
                                   has_mask ? &mv : nullptr, {plan->out, dense_strides(plan->out)}, scale_, team);
      return plan;
    });
    keel_tensor_t* y = c.output(0, p.out);
    if (numel(p.out) == 0) return;
    const size_t per = attention_scratch_floats(p.shape);
    const size_t scratch_floats = per * static_cast<size_t>(team);
    if (dtype_ == KEEL_DTYPE_F32) {
      float* scratch = static_cast<float*>(c.workspace(scratch_floats * sizeof(float)));
      attention_run(p.shape, c.data<float>(0), c.data<float>(1), c.data<float>(2),
                    has_mask ? c.data<float>(3) : nullptr, static_cast<float*>(y->data), scratch, team);
      return;
    }
    // bf16: the operands widened into the workspace (exact), the result rounded back.
    const int n_in = has_mask ? 4 : 3;
    size_t total = scratch_floats + static_cast<size_t>(numel(p.out));
    size_t counts[4] = {};
    for (int i = 0; i < n_in; ++i) total += counts[i] = static_cast<size_t>(numel(c.dims(i)));
    float* ws = static_cast<float*>(c.workspace(total * sizeof(float)));
    float* wide[4] = {};
    float* at = ws + scratch_floats;
    for (int i = 0; i < n_in; ++i) {
      wide[i] = at;
      const uint16_t* src = c.data<uint16_t>(i);
      for (size_t e = 0; e < counts[i]; ++e) at[e] = bf16_to_f32(src[e]);
      at += counts[i];
    }
    attention_run(p.shape, wide[0], wide[1], wide[2], wide[3], at, ws, team);
    uint16_t* dst = static_cast<uint16_t*>(y->data);
    for (int64_t e = 0; e < numel(p.out); ++e) dst[e] = f32_to_bf16(at[e]);
  }

 private:
  struct Plan {
    Dims out;
    AttentionShape shape;
  };
  float scale_ = 1.f;
  int32_t dtype_ = KEEL_DTYPE_F32;
  PlanCache<Plan> plans_;
};

}  // namespace

const std::vector<TypedKernelInfo>& attention_kernels() {
  static const std::vector<TypedKernelInfo> table = {
      {"keel", "Attention", 1, "onednn_keel_attention", {KEEL_DTYPE_F32, KEEL_DTYPE_BF16}, []() -> Kernel* {
         return new AttentionKernel;
       }}};
  return table;
}

}  // namespace keel::onednn
