// plugins/cpu_onednn/onednn_attention_kernel.cc — keel.Attention outside a claimed chain: the fused attention of
// onednn_attention.h over dense f32 tensors (inside a chain it runs as the chain's own step, onednn_subgraph.cc).
#include <omp.h>

#include "onednn_attention.h"
#include "onednn_common.h"

namespace keel::onednn {
namespace {

// keel.Attention(Q, Kt, V, [mask]), attribute scale: a plan per input shapes and thread count, the scores in the
// core's workspace (per thread).
class AttentionKernel : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (c.input_count() < 3) throw Reject{"keel.Attention needs Q, Kt and V"};
    const int n = std::min(c.input_count(), 4);
    for (int i = 0; i < n; ++i)
      if (c.has_input(i) && c.dtype(i) != KEEL_DTYPE_F32) throw Reject{"f32 only"};
    if (c.output_dtype(0) != KEEL_DTYPE_F32) throw Reject{"f32 only"};
    scale_ = c.attr_f("scale", 1.f);
    // Shapes known now: what does not fit goes to the reference kernel (which names the problem).
    bool known = true;
    for (int i = 0; i < n; ++i) known = known && (!c.has_input(i) || c.dims_known(i));
    if (known) {
      const bool has_mask = n > 3 && c.has_input(3);
      const Dims m = has_mask ? c.dims(3) : Dims();
      Dims out;
      std::string why;
      if (!attention_out_dims(c.dims(0), c.dims(1), c.dims(2), has_mask ? &m : nullptr, &out, &why))
        throw Reject{why};
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
    float* scratch = static_cast<float*>(c.workspace(per * sizeof(float) * static_cast<size_t>(team)));
    attention_run(p.shape, c.data<float>(0), c.data<float>(1), c.data<float>(2),
                  has_mask ? c.data<float>(3) : nullptr, static_cast<float*>(y->data), scratch, team);
  }

 private:
  struct Plan {
    Dims out;
    AttentionShape shape;
  };
  float scale_ = 1.f;
  PlanCache<Plan> plans_;
};

}  // namespace

std::vector<KernelInfo> attention_kernels() {
  return {{"Attention", 1, 0, "onednn_f32_keel_attention", []() -> Kernel* { return new AttentionKernel; }, "keel"}};
}

}  // namespace keel::onednn
