// plugins/cuda/cuda_blas.cc — MatMul and Gemm through cuBLAS (cublasGemmStridedBatchedEx, fp32 accumulation for
// f32, f16 and bf16; no TF32, so f32 results stay within the reference's tolerance).
//
// Row-major trick: Y = A·B (row-major) is Yᵀ = Bᵀ·Aᵀ (column-major), so B goes first and no data moves.
// cuBLAS handles are pooled per device (a handle is bound to one stream at a time; two sessions computing at once
// each take their own handle) and destroyed at plugin shutdown.
#include <cublas_v2.h>

#include <algorithm>
#include <mutex>
#include <utility>

#include "cuda_common.h"
#include "cuda_kernels.h"

namespace keel::cuda {
namespace {

std::mutex g_pool_mu;
std::vector<std::pair<int, cublasHandle_t>> g_free_handles;

void check_blas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  const int32_t code = s == CUBLAS_STATUS_ALLOC_FAILED ? KEEL_STATUS_OUT_OF_MEMORY : KEEL_STATUS_INTERNAL;
  throw Failure{code, std::string("cuda: ") + what + ": " + cublasGetStatusName(s) + ": " + cublasGetStatusString(s)};
}

class Handle {
 public:
  Handle(int device, cudaStream_t s) : device_(device) {
    {
      std::lock_guard<std::mutex> lock(g_pool_mu);
      for (size_t i = 0; i < g_free_handles.size(); ++i)
        if (g_free_handles[i].first == device) {
          h_ = g_free_handles[i].second;
          g_free_handles.erase(g_free_handles.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
    }
    if (!h_) check_blas(cublasCreate(&h_), "cublasCreate");  // on the current device (set by the compute edge)
    check_blas(cublasSetStream(h_, s), "cublasSetStream");
  }
  ~Handle() {
    std::lock_guard<std::mutex> lock(g_pool_mu);
    g_free_handles.emplace_back(device_, h_);
  }
  cublasHandle_t get() const { return h_; }

 private:
  int device_;
  cublasHandle_t h_ = nullptr;
};

cudaDataType_t cuda_type(int32_t t) {
  switch (t) {
    case KEEL_DTYPE_F16: return CUDA_R_16F;
    case KEEL_DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}
bool is_float(int32_t t) { return t == KEEL_DTYPE_F32 || t == KEEL_DTYPE_F16 || t == KEEL_DTYPE_BF16; }

// Row-major C[batch][m][n] = alpha * opA(A)[m][k] · opB(B)[k][n] + beta * C, strides in elements.
void gemm(cublasHandle_t h, int32_t dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
          const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, float beta,
          void* c, int64_t ldc, int64_t stride_c, int64_t batch) {
  const cudaDataType_t t = cuda_type(dtype);
  check_blas(cublasGemmStridedBatchedEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, t,
                                        static_cast<int>(ldb), stride_b, a, t, static_cast<int>(lda), stride_a, &beta,
                                        c, t, static_cast<int>(ldc), stride_c, static_cast<int>(batch),
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmStridedBatchedEx");
}

constexpr int64_t kIntMax = 2147483647;

class MatMulK : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (!is_float(c.dtype(0)) || c.dtype(1) != c.dtype(0)) throw Reject{"only f32, f16, bf16 with equal dtypes"};
  }
  void run(Ctx& c) override {
    Dims a = c.dims(0), b = c.dims(1);
    if (a.empty() || b.empty()) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: MatMul of a scalar"};
    const bool a1 = a.size() == 1, b1 = b.size() == 1;
    if (a1) a.insert(a.begin(), 1);
    if (b1) b.push_back(1);
    const int64_t m = a[a.size() - 2], k = a.back(), n = b.back();
    if (b[b.size() - 2] != k)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: MatMul inner dims differ: " + dims_str(c.dims(0)) + " x " +
                                                      dims_str(c.dims(1))};
    const Dims ba(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
    // Broadcast the batch dims.
    const size_t r = std::max(ba.size(), bb.size());
    Dims bo(r, 1), pa(r, 1), pb(r, 1);
    for (size_t i = 0; i < ba.size(); ++i) pa[r - ba.size() + i] = ba[i];
    for (size_t i = 0; i < bb.size(); ++i) pb[r - bb.size() + i] = bb[i];
    for (size_t i = 0; i < r; ++i) {
      if (pa[i] != pb[i] && pa[i] != 1 && pb[i] != 1)
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: MatMul batch dims do not broadcast"};
      bo[i] = std::max(pa[i], pb[i]);
      if (pa[i] == 0 || pb[i] == 0) bo[i] = 0;
    }
    Dims out = bo;
    if (!a1) out.push_back(m);
    if (!b1) out.push_back(n);
    keel_tensor_t* y = c.output(0, out);
    const int64_t batch = numel(bo), na = numel(pa), nb = numel(pb);
    const int32_t dt = c.dtype(0);
    const int64_t es = dtype_size(dt);
    if (batch == 0 || m == 0 || n == 0) return;
    if (k == 0) {
      check_cuda(cudaMemsetAsync(y->data, 0, static_cast<size_t>(batch * m * n * es), c.stream()), "MatMul memset");
      return;
    }
    if (std::max({m, n, k}) > kIntMax) throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: MatMul dims beyond int32"};
    Handle h(c.device(), c.stream());
    if (nb == 1 && na * m <= kIntMax) {  // shared B: one GEMM over all rows of A
      gemm(h.get(), dt, false, false, na * m, n, k, 1.f, c.data(0), k, 0, c.data(1), n, 0, 0.f, y->data, n, 0, 1);
    } else if (na == 1 || nb == 1 || pa == pb) {
      gemm(h.get(), dt, false, false, m, n, k, 1.f, c.data(0), k, na == 1 ? 0 : m * k, c.data(1), n,
           nb == 1 ? 0 : k * n, 0.f, y->data, n, m * n, batch);
    } else {  // general broadcast of the batch dims: one GEMM per output matrix
      Dims sa(r, 0), sb(r, 0);
      int64_t s1 = m * k, s2 = k * n;
      for (size_t i = r; i-- > 0;) {
        sa[i] = pa[i] == 1 ? 0 : s1;
        sb[i] = pb[i] == 1 ? 0 : s2;
        s1 *= pa[i];
        s2 *= pb[i];
      }
      for (int64_t bi = 0; bi < batch; ++bi) {
        int64_t rem = bi, oa = 0, ob = 0;
        for (size_t i = r; i-- > 0;) {
          const int64_t idx = rem % bo[i];
          rem /= bo[i];
          oa += idx * sa[i];
          ob += idx * sb[i];
        }
        gemm(h.get(), dt, false, false, m, n, k, 1.f, static_cast<const char*>(c.data(0)) + oa * es, k, 0,
             static_cast<const char*>(c.data(1)) + ob * es, n, 0, 0.f, static_cast<char*>(y->data) + bi * m * n * es,
             n, 0, 1);
      }
    }
    check_cuda(cudaGetLastError(), "MatMul");
  }
};

class GemmK : public Kernel {
 public:
  void setup(Ctx& c) override {
    const int32_t t = c.dtype(0);
    if (!is_float(t) || c.dtype(1) != t || (c.has_input(2) && c.dtype(2) != t))
      throw Reject{"only f32, f16, bf16 with equal dtypes"};
    alpha_ = c.attr_f("alpha", 1.f);
    beta_ = c.attr_f("beta", 1.f);
    ta_ = c.attr_i("transA", 0) != 0;
    tb_ = c.attr_i("transB", 0) != 0;
  }
  void run(Ctx& c) override {
    const Dims a = c.dims(0), b = c.dims(1);
    if (a.size() != 2 || b.size() != 2) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Gemm needs 2-D A and B"};
    const int64_t m = ta_ ? a[1] : a[0], k = ta_ ? a[0] : a[1];
    const int64_t kb = tb_ ? b[1] : b[0], n = tb_ ? b[0] : b[1];
    if (k != kb) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Gemm inner dims differ"};
    keel_tensor_t* y = c.output(0, {m, n});
    if (m == 0 || n == 0) return;
    const int32_t dt = c.dtype(0);
    float beta = 0.f;
    if (c.has_input(2) && beta_ != 0.f) {  // Y = C broadcast to [m, n], then GEMM accumulates onto it
      const Dims cd = c.dims(2);
      if (cd.size() > 2) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Gemm C of rank > 2"};
      Strided s;
      s.ndim = 2;
      s.dims[0] = m;
      s.dims[1] = n;
      Dims c2 = cd;
      while (c2.size() < 2) c2.insert(c2.begin(), 1);
      if ((c2[0] != 1 && c2[0] != m) || (c2[1] != 1 && c2[1] != n))
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Gemm C " + dims_str(cd) + " does not broadcast"};
      s.strides[0][0] = c2[0] == 1 ? 0 : c2[1];
      s.strides[1][0] = c2[1] == 1 ? 0 : 1;
      check_cuda(launch_strided_copy(dtype_size(dt), c.data(2), y->data, m * n, s, c.stream()), "Gemm bias");
      beta = beta_;
    }
    if (k == 0) {
      if (beta == 0.f)
        check_cuda(cudaMemsetAsync(y->data, 0, static_cast<size_t>(m * n * dtype_size(dt)), c.stream()), "memset");
      else if (beta != 1.f)
        throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: Gemm with K = 0 and beta != 1"};
      return;
    }
    Handle h(c.device(), c.stream());
    gemm(h.get(), dt, ta_, tb_, m, n, k, alpha_, c.data(0), a[1], 0, c.data(1), b[1], 0, beta, y->data, n, 0, 1);
  }

 private:
  float alpha_ = 1.f, beta_ = 1.f;
  bool ta_ = false, tb_ = false;
};

}  // namespace

std::vector<KernelInfo> blas_kernels() {
  return {
      {"MatMul", 1, 0, "cuda_cublas_matmul", []() -> Kernel* { return new MatMulK; }},
      {"Gemm", 7, 0, "cuda_cublas_gemm", []() -> Kernel* { return new GemmK; }},
  };
}

void blas_shutdown() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  for (auto& [dev, h] : g_free_handles) {
    cudaSetDevice(dev);
    cublasDestroy(h);
  }
  g_free_handles.clear();
}

}  // namespace keel::cuda
