// onednn_relu_sparse_bench — times the zero-skipping product (onednn_relu_sparse.h) against oneDNN's matmul with
// the same bias and sum post-op (transformer_enc's second feed-forward product by default), on the same data:
//   onednn_relu_sparse_bench TEAM [M K N]      random A at densities 0..1 (nonzeros |N(0,1)| + 1e-3)
//   HFILE=h.bin onednn_relu_sparse_bench 1      A read from a file of M*K floats (a Relu output, e.g. from `keel run -o`)
// Env: REPS (200), DENS (one density only). Prints medians / minima in us, the ratio dense/sparse of medians, the
// time of a full density count and the largest difference between the two results.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <random>
#include <vector>

#include "onednn_relu_sparse.h"

using namespace keel::onednn;
using clk = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const int team = argc > 1 ? atoi(argv[1]) : 1;
  int64_t M = 128, K = 1024, N = 256;
  if (argc > 4) M = atoll(argv[2]), K = atoll(argv[3]), N = atoll(argv[4]);
  omp_set_num_threads(team);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<float> B(K * N), bias(N), R(M * N), A(M * K), C1(M * N), C2(M * N);
  for (auto& v : B) v = nd(rng) * 0.03f;
  for (auto& v : bias) v = nd(rng);
  for (auto& v : R) v = nd(rng);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  using tg = dnnl::memory::format_tag;
  md amd({M, K}, dt::f32, tg::ab), bany({K, N}, dt::f32, tg::any), bmd({1, N}, dt::f32, tg::ab),
      cmd({M, N}, dt::f32, tg::ab);
  dnnl::post_ops po;
  po.append_sum(1.f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(po);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(amd, bany, bmd, cmd), attr, eng);
  fprintf(stderr, "oneDNN: %s\n", pd.impl_info_str());
  dnnl::memory bu({{K, N}, dt::f32, tg::ab}, eng, B.data()), bw(pd.weights_desc(), eng);
  dnnl::reorder(bu, bw).execute(st, bu, bw);
  st.wait();
  ReluSparseShape s;
  s.m = M, s.k = K, s.n = N, s.lda = K, s.accumulate = true;
  float* packed = static_cast<float*>(std::aligned_alloc(64, (relu_sparse_packed_floats(s) * 4 + 63) / 64 * 64));
  relu_sparse_pack(s, B.data(), packed);
  dnnl::memory am(amd, eng, A.data()), biasm(bmd, eng, bias.data()), cm(cmd, eng, C1.data());
  dnnl::matmul mm(pd);
  const int reps = getenv("REPS") ? atoi(getenv("REPS")) : 200;
  std::vector<double> ds = {0.0, 0.1, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
  if (getenv("DENS")) ds = {atof(getenv("DENS"))};
  if (getenv("HFILE")) ds = {0.0};  // replaced by the file's density
  for (double dens : ds) {
    for (auto& v : A) v = u(rng) < dens ? std::abs(nd(rng)) + 1e-3f : 0.f;
    if (const char* h = getenv("HFILE")) {
      FILE* f = fopen(h, "rb");
      if (!f || fread(A.data(), 4, A.size(), f) != A.size()) return 1;
      fclose(f);
      dens = relu_sparse_density(s, A.data(), 1);
    }
    std::vector<double> td, ts, tc;
    for (int r = 0; r < reps; ++r) {
      std::memcpy(C1.data(), R.data(), R.size() * 4);
      auto t0 = clk::now();
      mm.execute(st, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bw}, {DNNL_ARG_BIAS, biasm}, {DNNL_ARG_DST, cm}});
      st.wait();
      auto t1 = clk::now();
      std::memcpy(C2.data(), R.data(), R.size() * 4);
      auto t2 = clk::now();
      relu_sparse_run(s, A.data(), packed, bias.data(), C2.data(), team);
      auto t3 = clk::now();
      volatile double d = relu_sparse_density(s, A.data(), 1);
      (void)d;
      auto t4 = clk::now();
      td.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      ts.push_back(std::chrono::duration<double, std::micro>(t3 - t2).count());
      tc.push_back(std::chrono::duration<double, std::micro>(t4 - t3).count());
    }
    double err = 0;
    for (size_t i = 0; i < C1.size(); ++i) err = std::max(err, double(std::abs(C1[i] - C2[i])));
    auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    auto mn = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
    printf("team %d %ldx%ldx%ld density %.3f: dense med %.1f min %.1f | sparse med %.1f min %.1f | dense/sparse %.2f"
           " | count %.1f us | max diff %.2g\n",
           team, long(M), long(K), long(N), dens, med(td), mn(td), med(ts), mn(ts), med(td) / med(ts), med(tc), err);
  }
  std::free(packed);
}
