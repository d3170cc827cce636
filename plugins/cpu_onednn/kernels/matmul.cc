// plugins/cpu_onednn/kernels/matmul.cc — MatMul (batched, numpy broadcasting of batch dims, 1-D operands) and Gemm
// (transA/transB, alpha, beta, C broadcast) on oneDNN's matmul primitive, or, for the 2-D products with a wide output
// over a shallow inner dimension and no C (sgemm_wins), on the plugin's own wide product (steps/wide_gemm.h; B as
// given) or dnnl_sgemm (B transposed).
//
// A constant right-hand operand (the weights of a linear layer) is reordered once per plan into the layout the
// primitive prefers (format_tag::any); everything else stays in the graph's row-major layout.
// Gemm: Y = alpha * A' B' + beta * C is computed as linear(alpha) applied to (A' B' + bias), bias = (beta/alpha) C,
// which needs C constant unless beta == alpha.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <omp.h>

#include "common/common.h"
#include "steps/narrow_gemm.h"
#include "steps/silu.h"
#include "steps/wide_gemm.h"

namespace keel::onednn {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

struct MatMulPlan {
  Dims out_dims;
  int64_t k = 1;  // inner dimension (for the work estimate)
  // A 2-D product with a shallow inner dimension and a wide output (sgemm_wins), instead of the primitive: with B as
  // given, the own wide product (steps/wide_gemm.h), else dnnl_sgemm.
  bool wide = false, sgemm = false;
  // A Gemm with few columns, B given as [N, K] (transB): steps/narrow_gemm.h's loop over B where it lies.
  bool narrow = false;
  int64_t m = 0, n = 0;
  dnnl::matmul prim;
  dnnl::memory a, b_user, b_prim, bias, dst;
  bool reorder_b = false;
  dnnl::reorder b_reorder;
};

// Row-major strides of dims `d` where the last two dims may be swapped (a transposed view).
dnnl::memory::desc md_of(const Dims& d, bool transposed_last2) {
  if (!transposed_last2) return plain_md(d);
  Dims stored = d;
  std::swap(stored[d.size() - 1], stored[d.size() - 2]);
  dnnl::memory::dims strides(d.size());
  int64_t s = 1;
  for (size_t i = stored.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(stored[i], 1);
  }
  std::swap(strides[d.size() - 1], strides[d.size() - 2]);
  return dnnl::memory::desc(to_dnnl(d), dt::f32, strides);
}

// dnnl_sgemm against the matmul primitive (brgemm) on 2-D f32 products without C (a non-constant B: eager training),
// AMD EPYC (AVX-512), 1 and 2 threads: where the output is wide (N >= 8192) and the inner dimension shallow (K <= 256)
// sgemm took 0.70-0.80 of the time in most runs of a micro-benchmark (noisy: 0.93-1.03 in some); elsewhere the two
// were within a few percent, or the primitive ahead (a deep K: [64,9216] x [9216,128]' 1.46 against 2.07 ms). In the
// LeNet-like model's training step (eager profile, 1 thread) fc1's dW [128,64]' x [64,9216] went 2.04 -> 1.68 ms and
// its dX [64,128] x [128,9216] 1.78 -> 1.74; on the own wide product (B not transposed, steps/wide_gemm.h) dX 1.96-2.01
// -> 0.97-0.99 ms and dW 0.94-0.99 -> 0.80-0.84 (3 alternating rounds, KEEL_EAGER_PROFILE=1, 1 thread).
// KEEL_ONEDNN_SGEMM=0 / 1 turns the choice off / on everywhere (to compare; the conformance suite's Gemm and MatMul
// cases pass with either, and with 1 its Gemm cases run the wide product: they fail when it mixes up its columns).
bool sgemm_wins(int64_t m, int64_t k, int64_t n) {
  static const int forced = [] {
    const char* e = std::getenv("KEEL_ONEDNN_SGEMM");
    return e == nullptr ? -1 : std::atoi(e) != 0 ? 1 : 0;
  }();
  if (forced >= 0) return forced == 1;
  return n >= 8192 && k <= 256 && m <= 512;
}

class MatMulKernel : public Kernel {
 public:
  explicit MatMulKernel(bool gemm) : gemm_(gemm) {}

  void setup(Ctx& c) override {
    for (int i = 0; i < c.input_count(); ++i)
      if (c.has_input(i) && c.dtype(i) != KEEL_DTYPE_F32) throw Reject{"f32 only"};
    if (!c.rank_known(0) || !c.rank_known(1)) throw Reject{"operand rank unknown"};
    if (gemm_) {
      trans_a_ = c.attr_i("transA", 0) != 0;
      trans_b_ = c.attr_i("transB", 0) != 0;
      alpha_ = c.attr_f("alpha", 1.f);
      beta_ = c.attr_f("beta", 1.f);
      if (c.dims(0).size() != 2 || c.dims(1).size() != 2) throw Reject{"Gemm operands must be 2-D"};
      if (alpha_ == 0.f) throw Reject{"alpha = 0"};
      if (c.has_input(2) && beta_ != 0.f) {
        if (!c.rank_known(2) || c.dims(2).size() > 2) throw Reject{"C rank"};
        if (c.is_constant(2)) {
          c_dims_ = c.dims(2);
          const float* p = c.data<float>(2);
          c_const_.assign(p, p + numel(c_dims_));
          for (float& v : c_const_) v *= beta_ / alpha_;
        } else if (beta_ != alpha_) {
          throw Reject{"non-constant C with beta != alpha"};
        }
        has_c_ = true;
      }
    } else {
      if (c.dims(0).empty() || c.dims(1).empty()) throw Reject{"scalar operand"};
      if (c.dims(0).size() > 8 || c.dims(1).size() > 8) throw Reject{"rank > 8"};
    }
    if (c.is_constant(1)) {
      const float* p = c.data<float>(1);
      b_const_.assign(p, p + numel(c.dims(1)));
    }
    bool known = c.dims_known(0) && c.dims_known(1) && (!has_c_ || c.dims_known(2));
    if (known) {
      if (numel(c.dims(0)) == 0 || numel(c.dims(1)) == 0) throw Reject{"empty operand"};
      plans_.get(shape_key(c), [&] { return build(c); });
    }
  }

  void run(Ctx& c) override {
    MatMulPlan& p = plans_.get(shape_key(c), [&] { return build(c); });
    keel_tensor_t* y = c.output(0, p.out_dims);
    limit_threads_for(static_cast<double>(numel(p.out_dims)) * p.k);
    if (p.narrow) {
      const float* b = b_const_.empty() ? static_cast<const float*>(c.input(1)->data) : b_const_.data();
      const float* bias = !has_c_            ? nullptr
                          : c_const_.empty() ? static_cast<const float*>(c.input(2)->data)
                                             : c_const_.data();
      narrow_gemm_run({p.m, p.k, p.n}, static_cast<const float*>(c.input(0)->data), b, bias,
                      static_cast<float*>(y->data), omp_get_max_threads());
      return;
    }
    if (p.wide) {
      wide_gemm_f32(static_cast<const float*>(c.input(0)->data), trans_a_, static_cast<const float*>(c.input(1)->data),
                    static_cast<float*>(y->data), p.m, p.k, p.n, alpha_, omp_get_max_threads());
      return;
    }
    if (p.sgemm) {  // row-major: A [M,K] (stored [K,M] when transposed), B [K,N] (stored [N,K]), Y [M,N]
      const dnnl_status_t st = dnnl_sgemm(trans_a_ ? 'T' : 'N', trans_b_ ? 'T' : 'N', p.m, p.n, p.k, alpha_,
                                          static_cast<const float*>(c.input(0)->data), trans_a_ ? p.m : p.k,
                                          static_cast<const float*>(c.input(1)->data), trans_b_ ? p.k : p.n, 0.f,
                                          static_cast<float*>(y->data), p.n);
      if (st != dnnl_success) throw Failure{KEEL_STATUS_INTERNAL, "dnnl_sgemm failed (" + std::to_string(st) + ")"};
      return;
    }
    auto& s = stream();
    bind(p.a, c.input(0)->data);
    bind(p.dst, y->data);
    if (b_const_.empty()) {
      bind(p.b_user, c.input(1)->data);
      if (p.reorder_b) {
        bind(p.b_prim, c.workspace(p.b_prim.get_desc().get_size()));
        p.b_reorder.execute(s, p.b_user, p.b_prim);
      }
    }
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b_prim}, {DNNL_ARG_DST, p.dst}};
    if (has_c_) {
      if (c_const_.empty()) bind(p.bias, c.input(2)->data);
      args[DNNL_ARG_BIAS] = p.bias;
    }
    execute(p.prim, s, args);
    s.wait();
  }

 private:
  std::unique_ptr<MatMulPlan> build(const Ctx& c) {
    Dims a = c.dims(0), b = c.dims(1);
    auto p = std::make_unique<MatMulPlan>();
    Dims out;
    bool ta = trans_a_, tb = trans_b_;
    if (gemm_) {
      int64_t M = ta ? a[1] : a[0], K = ta ? a[0] : a[1], Kb = tb ? b[1] : b[0], N = tb ? b[0] : b[1];
      if (K != Kb) throw Reject{"inner dimensions differ"};
      a = {M, K};
      b = {K, N};
      out = {M, N};
    } else {
      bool a1 = a.size() == 1, b1 = b.size() == 1;
      if (a1) a.insert(a.begin(), 1);
      if (b1) b.push_back(1);
      size_t r = std::max(a.size(), b.size());
      while (a.size() < r) a.insert(a.begin(), 1);
      while (b.size() < r) b.insert(b.begin(), 1);
      if (a[r - 1] != b[r - 2]) throw Reject{"inner dimensions differ: " + dims_str(a) + " x " + dims_str(b)};
      Dims full(r);
      for (size_t i = 0; i + 2 < r; ++i) {
        if (a[i] != b[i] && a[i] != 1 && b[i] != 1) throw Reject{"batch dims do not broadcast"};
        full[i] = std::max(a[i], b[i]);
      }
      full[r - 2] = a[r - 2];
      full[r - 1] = b[r - 1];
      // The graph's output shape drops the dims that 1-D operands added.
      for (size_t i = 0; i < r; ++i) {
        if (a1 && i == r - 2) continue;
        if (b1 && i == r - 1) continue;
        out.push_back(full[i]);
      }
      p->out_dims = out;
      out = full;
    }
    if (gemm_) p->out_dims = out;
    // A batch of rows times one matrix ([..., M, K] x [K, N], the linear layers of a transformer): one 2-D product
    // [B*M, K] x [K, N] over the same bytes. oneDNN's batched matmul with a broadcast B runs each batch on its own,
    // several times slower at M = 128.
    if (!gemm_ && a.size() > 2) {
      bool b_single = true;
      for (size_t i = 0; i + 2 < b.size(); ++i) b_single = b_single && b[i] == 1;
      if (b_single) {
        int64_t rows = 1;
        for (size_t i = 0; i + 1 < a.size(); ++i) rows *= a[i];
        a = {rows, a.back()};
        b = {b[b.size() - 2], b.back()};
        out = {rows, out.back()};
      }
    }
    p->k = a.back();
    // A linear layer's forward with few outputs (SimpleCNN's 5408 -> 10 in eager training: B is the [N, K] weight
    // itself, transB): the chains' few-column product (steps/narrow_gemm.h), which reads B as its packed layout when
    // K is a multiple of 16; C only as a bias ([N] or [1, N]). At batch 64, 0.068-0.070 ms a call on oneDNN's matmul,
    // 0.052-0.054 here (KEEL_EAGER_PROFILE=1, 3 alternating rounds).
    if (gemm_ && !ta && tb && alpha_ == 1.f && out[1] <= kNarrowGemmMaxColumns && p->k >= 256 && p->k % 16 == 0 &&
        has_avx512f()) {
      const Dims cd = !has_c_ ? Dims{} : c_const_.empty() ? c.dims(2) : c_dims_;
      if (!has_c_ || (numel(cd) == out[1] && (cd.size() == 1 || cd[0] == 1))) {
        p->narrow = true;
        p->m = out[0];
        p->n = out[1];
        return p;
      }
    }
    if (a.size() == 2 && !has_c_ && b_const_.empty() && sgemm_wins(out[0], p->k, out[1])) {
      p->wide = !tb && has_avx512f();
      p->sgemm = !p->wide;
      p->m = out[0];
      p->n = out[1];
      return p;
    }
    auto& eng = engine();
    dnnl::memory::desc a_md = md_of(a, ta), b_user_md = md_of(b, tb), dst_md = plain_md(out);
    dnnl::memory::desc b_any = b_const_.empty() ? b_user_md : dnnl::memory::desc(to_dnnl(b), dt::f32, tag::any);
    dnnl::memory::desc bias_md;
    if (has_c_) {
      Dims cd = c_const_.empty() ? c.dims(2) : c_dims_;
      while (cd.size() < 2) cd.insert(cd.begin(), 1);
      if ((cd[0] != 1 && cd[0] != out[0]) || (cd[1] != 1 && cd[1] != out[1])) throw Reject{"C does not broadcast"};
      bias_md = plain_md(cd);
    }
    dnnl::primitive_attr attr = user_scratchpad();
    if (gemm_ && alpha_ != 1.f) {
      dnnl::post_ops po;
      po.append_eltwise(1.f, dnnl::algorithm::eltwise_linear, alpha_, 0.f);
      attr.set_post_ops(po);
    }
    dnnl::matmul::desc d(a_md, b_any, bias_md, dst_md);
    dnnl::matmul::primitive_desc pd(d, attr, eng);
    p->prim = dnnl::matmul(pd);
    p->a = dnnl::memory(a_md, eng, nullptr);
    p->dst = dnnl::memory(dst_md, eng, nullptr);
    p->reorder_b = pd.weights_desc() != b_user_md;
    if (!b_const_.empty()) {
      dnnl::memory user(b_user_md, eng, b_const_.data());
      p->b_prim = dnnl::memory(pd.weights_desc(), eng);
      dnnl::reorder(user, p->b_prim).execute(stream(), user, p->b_prim);
      stream().wait();
    } else {
      p->b_user = dnnl::memory(b_user_md, eng, nullptr);
      p->b_prim = p->reorder_b ? dnnl::memory(pd.weights_desc(), eng, nullptr) : p->b_user;
      if (p->reorder_b) p->b_reorder = dnnl::reorder(p->b_user, p->b_prim);
    }
    if (has_c_) {
      if (!c_const_.empty()) {
        p->bias = dnnl::memory(bias_md, eng);
        std::copy(c_const_.begin(), c_const_.end(), static_cast<float*>(p->bias.get_data_handle()));
      } else {
        p->bias = dnnl::memory(bias_md, eng, nullptr);
      }
    }
    return p;
  }

  bool gemm_;
  bool trans_a_ = false, trans_b_ = false, has_c_ = false;
  float alpha_ = 1.f, beta_ = 1.f;
  Dims c_dims_;
  std::vector<float> b_const_, c_const_;
  PlanCache<MatMulPlan> plans_;
};

}  // namespace

std::vector<KernelInfo> matmul_kernels() {
  return {
      {"MatMul", 1, 0, "onednn_f32_matmul", [] { return static_cast<Kernel*>(new MatMulKernel(false)); }},
      {"Gemm", 7, 0, "onednn_f32_gemm", [] { return static_cast<Kernel*>(new MatMulKernel(true)); }},
  };
}

}  // namespace keel::onednn
