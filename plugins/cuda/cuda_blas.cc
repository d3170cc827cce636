// plugins/cuda/cuda_blas.cc — MatMul, Gemm, keel.FusedMatMul and keel.FusedGemm through cuBLASLt (cublasLtMatmul).
//
//   MatMul        1-D operands (promoted and squeezed as ONNX says), batch dimensions broadcast: a shared B is one
//                 GEMM over all rows of A; equal batch shapes, or a shared A (batch stride 0), one strided-batched
//                 GEMM; any other broadcast, one GEMM per output matrix.
//   Gemm          transA / transB, alpha, beta, C: a row vector of N with beta = 1 becomes the BIAS epilogue; any
//                 other C is broadcast-copied into Y first and accumulated onto with beta.
//   FusedMatMul   act(matmul(A, B) + bias + Z): bias through the BIAS epilogue, Z as cuBLASLt's C (beta 1), Relu
//                 through the RELU(_BIAS) epilogue; the other activations (Gelu is erf-based, cuBLASLt's is the tanh
//                 form) by one epilogue kernel afterwards (cuda_dnn_kernels.cu).
//   FusedGemm     act(alpha A' B' + beta C + Z) likewise.
//
// Row-major trick: Y = A·B (row-major) is Yᵀ = Bᵀ·Aᵀ (column-major), so B is cuBLASLt's A and no data moves.
// Dtypes f32, f16, bf16 (all operands one dtype), CUBLAS_COMPUTE_32F with f32 scale (f16 / bf16 accumulate in f32);
// f32 stays true f32 unless KEEL_CUDA_TF32=1 (CUBLAS_COMPUTE_32F_FAST_TF32), so results stay within the reference's
// tolerance. The heuristic (cublasLtMatmulAlgoGetHeuristic, workspace up to kMaxWorkspace, the operands' actual
// alignments) is queried once per problem and cached in the kernel with its descriptors; the workspace comes from
// the kernel's scratch memory. cuBLASLt handles are pooled per device and destroyed at plugin shutdown. Every status
// is checked: NOT_SUPPORTED becomes UNIMPLEMENTED, ALLOC_FAILED OUT_OF_MEMORY, the rest INTERNAL, each message
// naming the call and the shapes.
#include <cublasLt.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>

#include "cuda_common.h"
#include "cuda_dnn_kernels.h"
#include "cuda_kernels.h"

namespace keel::cuda {

bool tf32_allowed() {
  static const bool allowed = [] {
    const char* e = std::getenv("KEEL_CUDA_TF32");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }();
  return allowed;
}

namespace {

constexpr size_t kMaxWorkspace = size_t(32) << 20;

void check_lt(cublasStatus_t s, const char* what, const std::string& shapes) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  int32_t code = KEEL_STATUS_INTERNAL;
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) code = KEEL_STATUS_UNIMPLEMENTED;
  else if (s == CUBLAS_STATUS_ALLOC_FAILED) code = KEEL_STATUS_OUT_OF_MEMORY;
  throw Failure{code, std::string("cuda: ") + what + " (" + shapes + "): " + cublasLtGetStatusName(s) + ": " +
                          cublasLtGetStatusString(s)};
}

std::mutex g_pool_mu;
std::vector<std::pair<int, cublasLtHandle_t>> g_free_handles;  // idle handles, by device

// A pooled cuBLASLt handle of `device` for the lifetime of this object (the stream goes with each call).
class LtHandle {
 public:
  explicit LtHandle(int device) : device_(device) {
    {
      std::lock_guard<std::mutex> lock(g_pool_mu);
      for (size_t i = 0; i < g_free_handles.size(); ++i)
        if (g_free_handles[i].first == device) {
          h_ = g_free_handles[i].second;
          g_free_handles.erase(g_free_handles.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
    }
    if (!h_) check_lt(cublasLtCreate(&h_), "cublasLtCreate", "device " + std::to_string(device));
  }
  ~LtHandle() {
    std::lock_guard<std::mutex> lock(g_pool_mu);
    g_free_handles.emplace_back(device_, h_);
  }
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  cublasLtHandle_t get() const { return h_; }

 private:
  int device_;
  cublasLtHandle_t h_ = nullptr;
};

cudaDataType_t cuda_type(int32_t t) {
  switch (t) {
    case KEEL_DTYPE_F16: return CUDA_R_16F;
    case KEEL_DTYPE_BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}
bool is_float(int32_t t) { return t == KEEL_DTYPE_F32 || t == KEEL_DTYPE_F16 || t == KEEL_DTYPE_BF16; }

// Alignment in bytes (up to 256) that a pointer and the byte strides reached from it all keep.
uint32_t alignment(const void* p, int64_t stride_bytes_a, int64_t stride_bytes_b) {
  uint64_t v = reinterpret_cast<uintptr_t>(p) | 256u | static_cast<uint64_t>(stride_bytes_a) |
               static_cast<uint64_t>(stride_bytes_b);
  return static_cast<uint32_t>(v & (~v + 1));  // lowest set bit
}

// One GEMM problem, row-major: D[b][m][n] = alpha * op(A)[b][m][k] · op(B)[b][k][n] + beta * C[b] (+ bias[n], relu).
// lda / ldb / ldd: row strides as stored (A is [m][k], or [k][m] when ta; B is [k][n], or [n][k] when tb). C, when
// given, has D's layout (it may be D itself, or another buffer such as a residual).
struct Gemm {
  int32_t dtype = KEEL_DTYPE_F32;
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  const void* c = nullptr;
  void* d = nullptr;
  int64_t ldd = 0, stride_d = 0;
  float alpha = 1.f, beta = 0.f;
  const void* bias = nullptr;
  bool relu = false;
};

// The cached heuristic and descriptors of one problem shape (including the operands' alignments).
class LtPlan {
 public:
  struct Key {
    int32_t dtype;
    bool ta, tb, has_c, has_bias, relu;
    int64_t m, n, k, batch, lda, ldb, ldd, sa, sb, sd;
    uint32_t al_a, al_b, al_c, al_d, al_bias;
    bool operator==(const Key& o) const {
      return dtype == o.dtype && ta == o.ta && tb == o.tb && has_c == o.has_c && has_bias == o.has_bias &&
             relu == o.relu && m == o.m && n == o.n && k == o.k && batch == o.batch && lda == o.lda && ldb == o.ldb &&
             ldd == o.ldd && sa == o.sa && sb == o.sb && sd == o.sd && al_a == o.al_a && al_b == o.al_b &&
             al_c == o.al_c && al_d == o.al_d && al_bias == o.al_bias;
    }
  };

  static Key key_of(const Gemm& g) {
    Key key{};
    const int64_t es = dtype_size(g.dtype);
    key.dtype = g.dtype;
    key.ta = g.ta;
    key.tb = g.tb;
    key.has_c = g.c != nullptr && g.beta != 0.f;
    key.has_bias = g.bias != nullptr;
    key.relu = g.relu;
    key.m = g.m;
    key.n = g.n;
    key.k = g.k;
    key.batch = g.batch;
    key.lda = g.lda;
    key.ldb = g.ldb;
    key.ldd = g.ldd;
    key.sa = g.stride_a;
    key.sb = g.stride_b;
    key.sd = g.stride_d;
    key.al_a = alignment(g.a, g.lda * es, g.stride_a * es);
    key.al_b = alignment(g.b, g.ldb * es, g.stride_b * es);
    key.al_d = alignment(g.d, g.ldd * es, g.stride_d * es);
    key.al_c = key.has_c ? alignment(g.c, g.ldd * es, g.stride_d * es) : key.al_d;
    key.al_bias = g.bias ? alignment(g.bias, 0, 0) : 256;
    return key;
  }

  LtPlan(cublasLtHandle_t h, const Gemm& g, const Key& key, const std::string& shapes) : key_(key) {
    try {
      init(h, g, shapes);
    } catch (...) {
      destroy();  // the destructor does not run for a constructor that throws
      throw;
    }
  }
  ~LtPlan() { destroy(); }
  LtPlan(const LtPlan&) = delete;
  LtPlan& operator=(const LtPlan&) = delete;

  const Key& key() const { return key_; }

  void run(cublasLtHandle_t h, const Gemm& g, void* workspace, cudaStream_t s, const std::string& shapes) {
    if (g.bias) set_desc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias, shapes);
    const float beta = g.c ? g.beta : 0.f;
    const void* c = g.c ? g.c : g.d;
    check_lt(cublasLtMatmul(h, op_, &g.alpha, g.b, a_, g.a, b_, &beta, c, d_, g.d, d_, &algo_, workspace, ws_, s),
             "cublasLtMatmul", shapes);
  }
  size_t workspace_size() const { return ws_; }

 private:
  void init(cublasLtHandle_t h, const Gemm& g, const std::string& shapes) {
    const Key& key = key_;
    const cudaDataType_t t = cuda_type(g.dtype);
    const cublasComputeType_t compute =
        g.dtype == KEEL_DTYPE_F32 && tf32_allowed() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    check_lt(cublasLtMatmulDescCreate(&op_, compute, CUDA_R_32F), "cublasLtMatmulDescCreate", shapes);
    // cuBLASLt's A is our B, its B our A (column-major view of row-major data).
    const cublasOperation_t op_a = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    set_desc(CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a, shapes);
    set_desc(CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b, shapes);
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (g.bias) epi = g.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    else if (g.relu) epi = CUBLASLT_EPILOGUE_RELU;
    set_desc(CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, shapes);
    if (g.bias) set_desc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias, shapes);
    // Stored shapes (rows x cols, column-major) of cuBLASLt's A (our B), B (our A) and C / D.
    const uint64_t a_rows = static_cast<uint64_t>(g.tb ? g.k : g.n), a_cols = static_cast<uint64_t>(g.tb ? g.n : g.k);
    const uint64_t b_rows = static_cast<uint64_t>(g.ta ? g.m : g.k), b_cols = static_cast<uint64_t>(g.ta ? g.k : g.m);
    layout(&a_, t, a_rows, a_cols, g.ldb, g.batch, g.stride_b, shapes);
    layout(&b_, t, b_rows, b_cols, g.lda, g.batch, g.stride_a, shapes);
    layout(&d_, t, static_cast<uint64_t>(g.n), static_cast<uint64_t>(g.m), g.ldd, g.batch, g.stride_d, shapes);

    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate", shapes);
    std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, cublasStatus_t (*)(cublasLtMatmulPreference_t)> pref_guard(
        pref, cublasLtMatmulPreferenceDestroy);
    const uint64_t max_ws = kMaxWorkspace;
    check_lt(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws),
        "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", shapes);
    // Our B is cuBLASLt's A and the other way round.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.al_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.al_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.al_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.al_d}};
    for (const auto& [attr, value] : aligns)
      check_lt(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value),
               "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)", shapes);
    cublasLtMatmulHeuristicResult_t result[4];
    std::memset(result, 0, sizeof result);
    int got = 0;
    check_lt(cublasLtMatmulAlgoGetHeuristic(h, op_, a_, b_, d_, d_, pref, 4, result, &got),
             "cublasLtMatmulAlgoGetHeuristic", shapes);
    for (int i = 0; i < got; ++i)
      if (result[i].state == CUBLAS_STATUS_SUCCESS && result[i].workspaceSize <= kMaxWorkspace) {
        algo_ = result[i].algo;
        ws_ = result[i].workspaceSize;
        found_ = true;
        break;
      }
    if (!found_) throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: cuBLASLt has no algorithm for " + shapes};
  }
  void destroy() {
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (b_) cublasLtMatrixLayoutDestroy(b_);
    if (d_) cublasLtMatrixLayoutDestroy(d_);
    if (op_) cublasLtMatmulDescDestroy(op_);
    a_ = b_ = d_ = nullptr;
    op_ = nullptr;
  }
  void set_desc(cublasLtMatmulDescAttributes_t attr, const void* v, size_t size, const std::string& shapes) {
    check_lt(cublasLtMatmulDescSetAttribute(op_, attr, v, size), "cublasLtMatmulDescSetAttribute", shapes);
  }
  static void layout(cublasLtMatrixLayout_t* out, cudaDataType_t t, uint64_t rows, uint64_t cols, int64_t ld,
                     int64_t batch, int64_t stride, const std::string& shapes) {
    check_lt(cublasLtMatrixLayoutCreate(out, t, rows, cols, ld), "cublasLtMatrixLayoutCreate", shapes);
    if (batch > 1) {
      const int32_t count = static_cast<int32_t>(batch);
      check_lt(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
               "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)", shapes);
      check_lt(
          cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
          "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)", shapes);
    }
  }

  Key key_;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  size_t ws_ = 0;
  bool found_ = false;
};

constexpr int64_t kIntMax = 2147483647;

// Workspace of one compute call, reused by its GEMMs (they run in order on the one stream).
struct Scratch {
  void* p = nullptr;
  size_t size = 0;
  void* get(Ctx& c, size_t bytes) {
    if (bytes > size) {
      p = c.workspace(bytes);
      size = bytes;
    }
    return bytes ? p : nullptr;
  }
};

// The plans of one kernel, most recent first (a node sees few shapes; the broadcast loop a few alignments).
class LtCache {
 public:
  void gemm(Ctx& c, Scratch& scratch, const Gemm& g, const std::string& shapes) {
    if (g.batch > kIntMax) throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: batch beyond int32 (" + shapes + ")"};
    LtHandle h(c.device());
    const LtPlan::Key key = LtPlan::key_of(g);
    LtPlan* plan = nullptr;
    for (auto it = plans_.begin(); it != plans_.end(); ++it)
      if ((*it)->key() == key) {
        if (it != plans_.begin()) {
          std::unique_ptr<LtPlan> p = std::move(*it);
          plans_.erase(it);
          plans_.push_front(std::move(p));
        }
        plan = plans_.front().get();
        break;
      }
    if (!plan) {
      plans_.push_front(std::make_unique<LtPlan>(h.get(), g, key, shapes));
      if (plans_.size() > kMaxPlans) plans_.pop_back();
      plan = plans_.front().get();
    }
    void* ws = scratch.get(c, plan->workspace_size());
    plan->run(h.get(), g, ws, c.stream(), shapes);
  }

 private:
  static constexpr size_t kMaxPlans = 8;
  std::deque<std::unique_ptr<LtPlan>> plans_;
};

FusedActivation read_act_or_none(const Ctx& c, bool fused) {
  return fused ? read_fused_activation(c) : FusedActivation{};
}

// y = act(y + z) over [rows, n] when something is left after cuBLASLt.
void post_epilogue(Ctx& c, int32_t dt, void* y, const void* z, int64_t total, int64_t n, const FusedActivation& act,
                   const std::string& shapes) {
  check_cuda(launch_bias_act(dt, y, nullptr, z, total, 1, std::max<int64_t>(n, 1), static_cast<FusedAct>(act.kind),
                             act.a, act.b, c.stream()),
             ("GEMM epilogue, " + shapes).c_str());
}

// ---------------------------------------------------------------------------------------------------------------
// MatMul, keel.FusedMatMul
// ---------------------------------------------------------------------------------------------------------------

class MatMulK : public Kernel {
 public:
  explicit MatMulK(bool fused) : fused_(fused) {}
  void setup(Ctx& c) override {
    dt_ = c.dtype(0);
    if (!is_float(dt_)) throw Reject{"A dtype " + std::to_string(dt_) + " (only f32, f16, bf16)"};
    for (int i = 1; i < c.input_count() && i < (fused_ ? 4 : 2); ++i)
      if (c.has_input(i) && c.dtype(i) != dt_) throw Reject{"inputs of different dtypes (only one of f32, f16, bf16)"};
    act_ = read_act_or_none(c, fused_);
  }
  void run(Ctx& c) override {
    const Dims a0 = c.dims(0), b0 = c.dims(1);
    const std::string op = fused_ ? "FusedMatMul" : "MatMul";
    if (a0.empty() || b0.empty()) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: " + op + " of a scalar"};
    Dims a = a0, b = b0;
    const bool a1 = a.size() == 1, b1 = b.size() == 1;
    if (a1) a.insert(a.begin(), 1);
    if (b1) b.push_back(1);
    const int64_t m = a[a.size() - 2], k = a.back(), n = b.back();
    const std::string shapes = op + " A " + dims_str(a0) + ", B " + dims_str(b0);
    if (b[b.size() - 2] != k) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: inner dims differ: " + shapes};
    const Dims ba(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
    const size_t r = std::max(ba.size(), bb.size());
    Dims bo(r, 1), pa(r, 1), pb(r, 1);
    for (size_t i = 0; i < ba.size(); ++i) pa[r - ba.size() + i] = ba[i];
    for (size_t i = 0; i < bb.size(); ++i) pb[r - bb.size() + i] = bb[i];
    for (size_t i = 0; i < r; ++i) {
      if (pa[i] != pb[i] && pa[i] != 1 && pb[i] != 1)
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: batch dims do not broadcast: " + shapes};
      bo[i] = (pa[i] == 0 || pb[i] == 0) ? 0 : std::max(pa[i], pb[i]);
    }
    Dims out = bo;
    if (!a1) out.push_back(m);
    if (!b1) out.push_back(n);
    const bool has_bias = fused_ && c.input_count() > 2 && c.has_input(2);
    const bool has_z = fused_ && c.input_count() > 3 && c.has_input(3);
    if (has_bias && numel(c.dims(2)) != n)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT,
                    "cuda: FusedMatMul bias " + dims_str(c.dims(2)) + " needs " + std::to_string(n) + " entries"};
    if (has_z && c.dims(3) != out)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT,
                    "cuda: FusedMatMul Z " + dims_str(c.dims(3)) + " must have the output's shape " + dims_str(out)};
    keel_tensor_t* y = c.output(0, out);
    const int64_t batch = numel(bo), na = numel(pa), nb = numel(pb);
    const int64_t es = dtype_size(dt_);
    const int64_t total = batch * m * n;
    if (total == 0) return;
    const void* bias = has_bias ? c.data(2) : nullptr;
    const void* z = has_z ? c.data(3) : nullptr;
    const bool relu_in_lt = act_.kind == static_cast<int32_t>(FusedAct::kRelu);
    const bool post_act = act_.kind != static_cast<int32_t>(FusedAct::kNone) && !relu_in_lt;
    if (k == 0) {  // Y = act(bias + Z)
      check_cuda(cudaMemsetAsync(y->data, 0, static_cast<size_t>(total * es), c.stream()), "MatMul memset");
      if (bias || z || act_.kind != static_cast<int32_t>(FusedAct::kNone))
        check_cuda(launch_bias_act(dt_, y->data, bias, z, total, 1, n, static_cast<FusedAct>(act_.kind), act_.a, act_.b,
                                   c.stream()),
                   ("MatMul epilogue, " + shapes).c_str());
      return;
    }
    Scratch scratch;
    Gemm g;
    g.dtype = dt_;
    g.k = k;
    g.n = n;
    g.lda = k;
    g.ldb = n;
    g.ldd = n;
    g.bias = bias;
    g.relu = relu_in_lt;
    g.beta = z ? 1.f : 0.f;
    if (nb == 1) {  // shared B: one GEMM over all rows of A
      g.m = na * m;
      g.a = c.data(0);
      g.b = c.data(1);
      g.c = z;
      g.d = y->data;
      cache_.gemm(c, scratch, g, shapes);
    } else if (na == 1 || pa == pb) {  // strided batched, A shared (stride 0) or not
      g.m = m;
      g.batch = batch;
      g.a = c.data(0);
      g.stride_a = na == 1 ? 0 : m * k;
      g.b = c.data(1);
      g.stride_b = k * n;
      g.c = z;
      g.d = y->data;
      g.stride_d = m * n;
      cache_.gemm(c, scratch, g, shapes);
    } else {  // general broadcast of the batch dims: one GEMM per output matrix
      Dims sa(r, 0), sb(r, 0);
      int64_t s1 = m * k, s2 = k * n;
      for (size_t i = r; i-- > 0;) {
        sa[i] = pa[i] == 1 ? 0 : s1;
        sb[i] = pb[i] == 1 ? 0 : s2;
        s1 *= pa[i];
        s2 *= pb[i];
      }
      g.m = m;
      for (int64_t bi = 0; bi < batch; ++bi) {
        int64_t rem = bi, oa = 0, ob = 0;
        for (size_t i = r; i-- > 0;) {
          const int64_t idx = rem % bo[i];
          rem /= bo[i];
          oa += idx * sa[i];
          ob += idx * sb[i];
        }
        g.a = static_cast<const char*>(c.data(0)) + oa * es;
        g.b = static_cast<const char*>(c.data(1)) + ob * es;
        g.c = z ? static_cast<const char*>(z) + bi * m * n * es : nullptr;
        g.d = static_cast<char*>(y->data) + bi * m * n * es;
        cache_.gemm(c, scratch, g, shapes);
      }
    }
    if (post_act) post_epilogue(c, dt_, y->data, nullptr, total, n, act_, shapes);
  }

 private:
  bool fused_;
  int32_t dt_ = KEEL_DTYPE_F32;
  FusedActivation act_;
  LtCache cache_;
};

// ---------------------------------------------------------------------------------------------------------------
// Gemm, keel.FusedGemm
// ---------------------------------------------------------------------------------------------------------------

class GemmK : public Kernel {
 public:
  explicit GemmK(bool fused) : fused_(fused) {}
  void setup(Ctx& c) override {
    dt_ = c.dtype(0);
    if (!is_float(dt_)) throw Reject{"A dtype " + std::to_string(dt_) + " (only f32, f16, bf16)"};
    for (int i = 1; i < c.input_count() && i < (fused_ ? 4 : 3); ++i)
      if (c.has_input(i) && c.dtype(i) != dt_) throw Reject{"inputs of different dtypes (only one of f32, f16, bf16)"};
    alpha_ = c.attr_f("alpha", 1.f);
    beta_ = c.attr_f("beta", 1.f);
    ta_ = c.attr_i("transA", 0) != 0;
    tb_ = c.attr_i("transB", 0) != 0;
    act_ = read_act_or_none(c, fused_);
  }
  void run(Ctx& c) override {
    const Dims a = c.dims(0), b = c.dims(1);
    const std::string op = fused_ ? "FusedGemm" : "Gemm";
    std::string shapes = op + " A " + dims_str(a) + ", B " + dims_str(b);
    if (a.size() != 2 || b.size() != 2)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: needs 2-D A and B: " + shapes};
    const int64_t m = ta_ ? a[1] : a[0], k = ta_ ? a[0] : a[1];
    const int64_t kb = tb_ ? b[1] : b[0], n = tb_ ? b[0] : b[1];
    if (k != kb) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: inner dims differ: " + shapes};
    const bool has_c = c.input_count() > 2 && c.has_input(2);
    const bool has_z = fused_ && c.input_count() > 3 && c.has_input(3);
    Dims cd;
    if (has_c) {
      cd = c.dims(2);
      shapes += ", C " + dims_str(cd);
      Dims c2 = cd;
      while (c2.size() < 2) c2.insert(c2.begin(), 1);
      if (cd.size() > 2 || (c2[0] != 1 && c2[0] != m) || (c2[1] != 1 && c2[1] != n))
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT,
                      "cuda: C does not broadcast to [" + std::to_string(m) + "," + std::to_string(n) + "]: " + shapes};
    }
    if (has_z && c.dims(3) != Dims{m, n})
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT,
                    "cuda: Z " + dims_str(c.dims(3)) + " must have the output's shape: " + shapes};
    keel_tensor_t* y = c.output(0, {m, n});
    if (m == 0 || n == 0) return;
    const int64_t es = dtype_size(dt_);
    const void* z = has_z ? c.data(3) : nullptr;
    // C: a row vector of N with beta 1 is the BIAS epilogue; any other C is copied into Y and scaled by beta there.
    const bool use_c = has_c && beta_ != 0.f;
    const bool c_is_bias =
        use_c && beta_ == 1.f && numel(cd) == n && (cd.size() == 1 || (cd.size() == 2 && cd[0] == 1));
    const void* bias = c_is_bias ? c.data(2) : nullptr;
    const void* gemm_c = nullptr;
    float gemm_beta = 0.f;
    if (use_c && !c_is_bias) {
      Dims c2 = cd;
      while (c2.size() < 2) c2.insert(c2.begin(), 1);
      Strided s;
      s.ndim = 2;
      s.dims[0] = m;
      s.dims[1] = n;
      s.strides[0][0] = c2[0] == 1 ? 0 : c2[1];
      s.strides[1][0] = c2[1] == 1 ? 0 : 1;
      check_cuda(launch_strided_copy(static_cast<int32_t>(es), c.data(2), y->data, m * n, s, c.stream()),
                 ("Gemm C broadcast, " + shapes).c_str());
      gemm_c = y->data;
      gemm_beta = beta_;
    }
    bool z_done = !has_z;
    if (has_z && !gemm_c) {  // the residual as cuBLASLt's C
      gemm_c = z;
      gemm_beta = 1.f;
      z_done = true;
    }
    const FusedAct act = static_cast<FusedAct>(act_.kind);
    const bool relu_in_lt = act == FusedAct::kRelu && z_done;
    FusedActivation post = act_;
    if (relu_in_lt) post = FusedActivation{};
    const bool need_post = !z_done || post.kind != static_cast<int32_t>(FusedAct::kNone);
    if (k == 0) {  // Y = act(beta C + Z)
      if (!gemm_c) {
        check_cuda(cudaMemsetAsync(y->data, 0, static_cast<size_t>(m * n * es), c.stream()), "Gemm memset");
      } else if (gemm_c == z) {
        check_cuda(cudaMemcpyAsync(y->data, z, static_cast<size_t>(m * n * es), cudaMemcpyDeviceToDevice, c.stream()),
                   "Gemm copy");
      } else if (gemm_beta != 1.f) {
        throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: K = 0 with beta != 1: " + shapes};
      }
      if (bias || !z_done || act != FusedAct::kNone)
        check_cuda(
            launch_bias_act(dt_, y->data, bias, z_done ? nullptr : z, m * n, 1, n, act, act_.a, act_.b, c.stream()),
            ("Gemm epilogue, " + shapes).c_str());
      return;
    }
    Scratch scratch;
    Gemm g;
    g.dtype = dt_;
    g.ta = ta_;
    g.tb = tb_;
    g.m = m;
    g.n = n;
    g.k = k;
    g.a = c.data(0);
    g.lda = a[1];
    g.b = c.data(1);
    g.ldb = b[1];
    g.c = gemm_c;
    g.d = y->data;
    g.ldd = n;
    g.alpha = alpha_;
    g.beta = gemm_beta;
    g.bias = bias;
    g.relu = relu_in_lt;
    cache_.gemm(c, scratch, g, shapes);
    if (need_post) post_epilogue(c, dt_, y->data, z_done ? nullptr : z, m * n, n, post, shapes);
  }

 private:
  bool fused_;
  int32_t dt_ = KEEL_DTYPE_F32;
  float alpha_ = 1.f, beta_ = 1.f;
  bool ta_ = false, tb_ = false;
  FusedActivation act_;
  LtCache cache_;
};

}  // namespace

std::vector<KernelInfo> blas_kernels() {
  return {
      {"MatMul", 1, 0, "cuda_cublaslt_matmul", []() -> Kernel* { return new MatMulK(false); }},
      {"Gemm", 7, 0, "cuda_cublaslt_gemm", []() -> Kernel* { return new GemmK(false); }},
      {"FusedMatMul", 1, 0, "cuda_cublaslt_fused_matmul", []() -> Kernel* { return new MatMulK(true); }, "keel"},
      {"FusedGemm", 1, 0, "cuda_cublaslt_fused_gemm", []() -> Kernel* { return new GemmK(true); }, "keel"},
  };
}

void blas_shutdown() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  for (auto& [dev, h] : g_free_handles) {
    cudaSetDevice(dev);
    cublasLtDestroy(h);
  }
  g_free_handles.clear();
  (void)cudaGetLastError();
}

}  // namespace keel::cuda
