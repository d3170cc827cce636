// A throwaway smoke test for the reference kernels, runnable without the executor:
//   g++ -std=c++20 -O1 -I. -Isdk/include ops/reference/*.cc ops/reference/testing/smoke_test.cc
//       core/base/dtype.cc core/base/status.cc -o /tmp/keel_ref_smoke
//   /tmp/keel_ref_smoke                      # hand-computed checks (exit 1 on failure)
//   /tmp/keel_ref_smoke /tmp/ktests [-v] [--as-f64|--as-f16|--as-bf16] [filter]
//       # also ONNX backend node tests converted by onnx_node_to_ktest.py; --as-* reruns the f32 tests in that dtype
//   /tmp/keel_ref_smoke /tmp/ktests --fuzz 50   # random shape/attribute mutations: must never crash (use ASan)
// The ONNX node tests report PASS / FAIL / NO_KERNEL / UNIMPL counts; they never change the exit code unless
// --strict is given.
#include <dirent.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/base/dtype.h"
#include "ops/reference/testing/fake_context.h"

using keel::ops::testing::FakeAttr;
using keel::ops::testing::FakeNode;
using keel::ops::testing::FakeRegistry;
using keel::ops::testing::FakeTensor;

namespace {

int g_failures = 0;

#define CHECK(cond, msg)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::printf("FAIL %s:%d: %s (%s)\n", __FILE__, __LINE__, msg, #cond); \
      ++g_failures;                                                         \
    }                                                                       \
  } while (0)

std::string run_status(const FakeRegistry& reg, FakeNode& n, int32_t* code = nullptr) {
  keel_status_t s = reg.run(n);
  if (code) *code = s ? s->code : 0;
  std::string m = s ? std::string(s->message ? s->message : "") : "";
  keel_status_release(s);
  return m;
}

void expect_f32(const FakeRegistry& reg, FakeNode& n, const std::vector<int64_t>& shape, const std::vector<float>& want,
                const char* what, int out = 0, float tol = 1e-4f) {
  std::string err = run_status(reg, n);
  if (!err.empty()) {
    std::printf("FAIL %s: kernel error: %s\n", what, err.c_str());
    ++g_failures;
    return;
  }
  const FakeTensor& t = n.outputs[out];
  if (t.dims != shape) {
    std::printf("FAIL %s: shape mismatch\n", what);
    ++g_failures;
    return;
  }
  auto got = t.values<float>();
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::fabs(got[i] - want[i]) > tol * (1 + std::fabs(want[i]))) {
      std::printf("FAIL %s: element %zu = %g, want %g\n", what, i, got[i], want[i]);
      ++g_failures;
      return;
    }
  }
  std::printf("ok   %s\n", what);
}

std::vector<float> iota_f(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

void hand_tests(const FakeRegistry& reg) {
  {  // Conv 3x3 input, 2x2 ones kernel, no padding, bias 1.
    FakeNode n("Conv", 11);
    n.add_input(FakeTensor::f32({1, 1, 3, 3}, iota_f(9)));
    n.add_input(FakeTensor::f32({1, 1, 2, 2}, {1, 1, 1, 1}));
    n.add_input(FakeTensor::f32({1}, {1}));
    n.output_dtypes = {KEEL_DTYPE_F32};
    expect_f32(reg, n, {1, 1, 2, 2}, {9, 13, 21, 25}, "Conv 2x2 + bias");
  }
  {  // Conv with pads 1 and stride 2.
    FakeNode n("Conv", 11);
    n.add_input(FakeTensor::f32({1, 1, 3, 3}, iota_f(9)));
    n.add_input(FakeTensor::f32({1, 1, 2, 2}, {1, 1, 1, 1}));
    n.attrs["pads"] = FakeAttr::int_list({1, 1, 1, 1});
    n.attrs["strides"] = FakeAttr::int_list({2, 2});
    n.output_dtypes = {KEEL_DTYPE_F32};
    expect_f32(reg, n, {1, 1, 2, 2}, {0, 3, 9, 24}, "Conv pads+strides");
  }
  {  // Depthwise conv (group = 2), SAME_UPPER.
    FakeNode n("Conv", 11);
    std::vector<float> x = iota_f(8);  // 2 channels of 2x2
    n.add_input(FakeTensor::f32({1, 2, 2, 2}, x));
    n.add_input(FakeTensor::f32({2, 1, 2, 2}, {1, 0, 0, 0, 0, 0, 0, 1}));
    n.attrs["group"] = FakeAttr::integer(2);
    n.attrs["auto_pad"] = FakeAttr::str("SAME_UPPER");
    n.output_dtypes = {KEEL_DTYPE_F32};
    // ch0 picks x[h][w] (top-left tap); ch1 picks x[h+1][w+1] (zero outside).
    expect_f32(reg, n, {1, 2, 2, 2}, {0, 1, 2, 3, 7, 0, 0, 0}, "Conv group=2 SAME_UPPER");
  }
  {  // Conv rank mismatch -> INVALID_ARGUMENT naming the op.
    FakeNode n("Conv", 11);
    n.add_input(FakeTensor::f32({1, 3, 3}, iota_f(9)));
    n.add_input(FakeTensor::f32({1, 1, 2, 2}, {1, 1, 1, 1}));
    n.output_dtypes = {KEEL_DTYPE_F32};
    int32_t code = 0;
    std::string m = run_status(reg, n, &code);
    CHECK(code == KEEL_STATUS_INVALID_ARGUMENT && m.find("Conv") == 0, "Conv rank mismatch is an error");
    std::printf("ok   Conv error: %s\n", m.c_str());
  }
  {  // MaxPool 2x2/2 with Indices.
    FakeNode n("MaxPool", 12);
    n.add_input(FakeTensor::f32({1, 1, 4, 4}, iota_f(16)));
    n.attrs["kernel_shape"] = FakeAttr::int_list({2, 2});
    n.attrs["strides"] = FakeAttr::int_list({2, 2});
    n.output_dtypes = {KEEL_DTYPE_F32, KEEL_DTYPE_I64};
    expect_f32(reg, n, {1, 1, 2, 2}, {5, 7, 13, 15}, "MaxPool 2x2/2");
    CHECK(n.outputs[1].values<int64_t>() == (std::vector<int64_t>{5, 7, 13, 15}), "MaxPool indices");
  }
  {  // MaxPool ceil_mode 3x3/2 on 4x4 -> 2x2.
    FakeNode n("MaxPool", 12);
    n.add_input(FakeTensor::f32({1, 1, 4, 4}, iota_f(16)));
    n.attrs["kernel_shape"] = FakeAttr::int_list({3, 3});
    n.attrs["strides"] = FakeAttr::int_list({2, 2});
    n.attrs["ceil_mode"] = FakeAttr::integer(1);
    n.output_dtypes = {KEEL_DTYPE_F32};
    expect_f32(reg, n, {1, 1, 2, 2}, {10, 11, 14, 15}, "MaxPool ceil_mode");
  }
  // A kernel far larger than its input (SAME padding makes up the rest): only the taps inside the input are visited,
  // so this finishes at once instead of walking 2^40 taps per output (hours).
  for (const char* op : {"LpPool", "AveragePool", "MaxPool"}) {
    FakeNode n(op, 18);
    n.add_input(FakeTensor::f32({1, 1, 1, 3}, {0, 1, 2}));
    n.attrs["kernel_shape"] = FakeAttr::int_list({1, int64_t{1} << 40});
    n.attrs["auto_pad"] = FakeAttr::str("SAME_UPPER");
    if (std::string(op) == "LpPool") n.attrs["p"] = FakeAttr::integer(1);
    n.output_dtypes = {KEEL_DTYPE_F32};
    const float want = std::string(op) == "LpPool" ? 3.f : std::string(op) == "AveragePool" ? 1.f : 2.f;
    expect_f32(reg, n, {1, 1, 1, 3}, {want, want, want}, (std::string(op) + " kernel 2^40 SAME_UPPER").c_str());
  }
  {  // Gemm transB, alpha, beta, C broadcast over rows.
    FakeNode n("Gemm", 13);
    n.add_input(FakeTensor::f32({2, 3}, {1, 2, 3, 4, 5, 6}));
    n.add_input(FakeTensor::f32({2, 3}, {1, 0, 0, 0, 1, 1}));  // B^T
    n.add_input(FakeTensor::f32({2}, {10, 20}));
    n.attrs["transB"] = FakeAttr::integer(1);
    n.attrs["alpha"] = FakeAttr::real(2.0f);
    n.attrs["beta"] = FakeAttr::real(0.5f);
    n.output_dtypes = {KEEL_DTYPE_F32};
    // A*B = [[1, 5], [4, 11]] -> 2x + 0.5*C
    expect_f32(reg, n, {2, 2}, {7, 20, 13, 32}, "Gemm transB alpha beta");
  }
  {  // MatMul batched with broadcast: [2,2,3] x [3,2].
    FakeNode n("MatMul", 13);
    n.add_input(FakeTensor::f32({2, 2, 3}, iota_f(12)));
    n.add_input(FakeTensor::f32({3, 2}, {1, 0, 0, 1, 1, 1}));
    n.output_dtypes = {KEEL_DTYPE_F32};
    // row [a,b,c] -> [a + c, b + c]
    expect_f32(reg, n, {2, 2, 2}, {2, 3, 8, 9, 14, 15, 20, 21}, "MatMul batched broadcast");
  }
  {  // MatMul 1-D x 2-D.
    FakeNode n("MatMul", 13);
    n.add_input(FakeTensor::f32({3}, {1, 2, 3}));
    n.add_input(FakeTensor::f32({3, 2}, {1, 0, 0, 1, 1, 1}));
    n.output_dtypes = {KEEL_DTYPE_F32};
    expect_f32(reg, n, {2}, {4, 5}, "MatMul 1-D x 2-D");
  }
  {  // Add [2,1] + [1,3].
    FakeNode n("Add", 14);
    n.add_input(FakeTensor::f32({2, 1}, {10, 20}));
    n.add_input(FakeTensor::f32({1, 3}, {1, 2, 3}));
    n.output_dtypes = {KEEL_DTYPE_F32};
    expect_f32(reg, n, {2, 3}, {11, 12, 13, 21, 22, 23}, "Add broadcast [2,1]+[1,3]");
  }
  {  // Mul [2,3,2] * [3,1].
    FakeNode n("Mul", 14);
    n.add_input(FakeTensor::f32({2, 3, 2}, iota_f(12)));
    n.add_input(FakeTensor::f32({3, 1}, {1, 2, 3}));
    n.output_dtypes = {KEEL_DTYPE_F32};
    expect_f32(reg, n, {2, 3, 2}, {0, 1, 4, 6, 12, 15, 6, 7, 16, 18, 30, 33}, "Mul broadcast [2,3,2]*[3,1]");
  }
  {  // Incompatible broadcast is an error.
    FakeNode n("Add", 14);
    n.add_input(FakeTensor::f32({2, 3}, iota_f(6)));
    n.add_input(FakeTensor::f32({2}, {1, 2}));
    n.output_dtypes = {KEEL_DTYPE_F32};
    int32_t code = 0;
    std::string m = run_status(reg, n, &code);
    CHECK(code == KEEL_STATUS_INVALID_ARGUMENT, "Add bad broadcast is an error");
    std::printf("ok   Add error: %s\n", m.c_str());
  }
  {  // Softmax, opset 13 (last axis) and opset 11 (2-D coercion at axis 1).
    FakeNode n("Softmax", 13);
    n.add_input(FakeTensor::f32({1, 3}, {1, 2, 3}));
    n.output_dtypes = {KEEL_DTYPE_F32};
    expect_f32(reg, n, {1, 3}, {0.09003057f, 0.24472847f, 0.66524096f}, "Softmax opset 13");
    FakeNode m("Softmax", 11);
    m.add_input(FakeTensor::f32({1, 2, 2}, {1, 2, 3, 4}));
    m.output_dtypes = {KEEL_DTYPE_F32};
    expect_f32(reg, m, {1, 2, 2}, {0.0320586f, 0.08714432f, 0.23688282f, 0.64391426f}, "Softmax opset 11 coercion");
  }
  {  // Reshape with 0 and -1; Flatten.
    FakeNode n("Reshape", 14);
    n.add_input(FakeTensor::f32({2, 3, 4}, iota_f(24)));
    n.add_input(FakeTensor::i64({3}, {0, -1, 2}));
    n.output_dtypes = {KEEL_DTYPE_F32};
    std::string e = run_status(reg, n);
    CHECK(e.empty() && n.outputs[0].dims == (std::vector<int64_t>{2, 6, 2}), "Reshape 0/-1");
    FakeNode f("Flatten", 13);
    f.add_input(FakeTensor::f32({2, 3, 4}, iota_f(24)));
    f.output_dtypes = {KEEL_DTYPE_F32};
    e = run_status(reg, f);
    CHECK(e.empty() && f.outputs[0].dims == (std::vector<int64_t>{2, 12}), "Flatten axis 1");
    std::printf("ok   Reshape/Flatten\n");
  }
  {  // Relu, Identity.
    FakeNode n("Relu", 14);
    n.add_input(FakeTensor::f32({4}, {-1, 0, 2, -3}));
    n.output_dtypes = {KEEL_DTYPE_F32};
    expect_f32(reg, n, {4}, {0, 0, 2, 0}, "Relu");
    FakeNode i("Identity", 16);
    i.add_input(FakeTensor::f32({2}, {1.5f, -2}));
    i.output_dtypes = {KEEL_DTYPE_F32};
    expect_f32(reg, i, {2}, {1.5f, -2}, "Identity");
  }
  {  // Gather out of bounds -> error; negative index ok.
    FakeNode n("Gather", 13);
    n.add_input(FakeTensor::f32({3}, {1, 2, 3}));
    n.add_input(FakeTensor::i64({2}, {-1, 0}));
    n.output_dtypes = {KEEL_DTYPE_F32};
    expect_f32(reg, n, {2}, {3, 1}, "Gather negative index");
    FakeNode b("Gather", 13);
    b.add_input(FakeTensor::f32({3}, {1, 2, 3}));
    b.add_input(FakeTensor::i64({1}, {3}));
    b.output_dtypes = {KEEL_DTYPE_F32};
    int32_t code = 0;
    std::string m = run_status(reg, b, &code);
    CHECK(code == KEEL_STATUS_INVALID_ARGUMENT, "Gather out of bounds is an error");
    std::printf("ok   Gather error: %s\n", m.c_str());
  }
  {  // f16 Add.
    FakeNode n("Add", 14);
    std::vector<uint16_t> a = {keel::f32_to_f16(1.5f), keel::f32_to_f16(-2.0f)};
    std::vector<uint16_t> b = {keel::f32_to_f16(0.25f)};
    n.add_input(FakeTensor::of(KEEL_DTYPE_F16, {2}, a));
    n.add_input(FakeTensor::of(KEEL_DTYPE_F16, {1}, b));
    n.output_dtypes = {KEEL_DTYPE_F16};
    std::string e = run_status(reg, n);
    auto r = n.outputs.empty() ? std::vector<uint16_t>() : n.outputs[0].values<uint16_t>();
    CHECK(e.empty() && r.size() == 2 && keel::f16_to_f32(r[0]) == 1.75f && keel::f16_to_f32(r[1]) == -1.75f, "f16 Add");
    std::printf("ok   f16 Add\n");
  }
}

// ------------------------------------------------------------------------------------------------------------
// ONNX node tests (.ktest)
// ------------------------------------------------------------------------------------------------------------

std::vector<uint8_t> unhex(const std::string& h) {
  std::vector<uint8_t> r;
  if (h == "-") return r;
  r.reserve(h.size() / 2);
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    r.push_back(static_cast<uint8_t>(std::stoul(h.substr(i, 2), nullptr, 16)));
  return r;
}

FakeTensor read_tensor(std::istringstream& is) {
  FakeTensor t;
  int ndim;
  is >> t.dtype >> ndim;
  t.dims.resize(ndim);
  for (auto& d : t.dims) is >> d;
  std::string hex;
  is >> hex;
  t.data = unhex(hex);
  return t;
}

double elem(const FakeTensor& t, int64_t i) {
  switch (t.dtype) {
    case KEEL_DTYPE_F32: return t.as<float>()[i];
    case KEEL_DTYPE_F64: return t.as<double>()[i];
    case KEEL_DTYPE_F16: return keel::f16_to_f32(t.as<uint16_t>()[i]);
    case KEEL_DTYPE_BF16: return keel::bf16_to_f32(t.as<uint16_t>()[i]);
    case KEEL_DTYPE_I8: return t.as<int8_t>()[i];
    case KEEL_DTYPE_U8: return t.as<uint8_t>()[i];
    case KEEL_DTYPE_BOOL: return t.as<uint8_t>()[i];
    case KEEL_DTYPE_I16: return t.as<int16_t>()[i];
    case KEEL_DTYPE_U16: return t.as<uint16_t>()[i];
    case KEEL_DTYPE_I32: return t.as<int32_t>()[i];
    case KEEL_DTYPE_U32: return t.as<uint32_t>()[i];
    case KEEL_DTYPE_I64: return static_cast<double>(t.as<int64_t>()[i]);
    case KEEL_DTYPE_U64: return static_cast<double>(t.as<uint64_t>()[i]);
  }
  return 0;
}

// Converts an f32 tensor to dtype `to` (f64, f16 or bf16) for the dtype sweep (--as).
void convert_f32(FakeTensor& t, int32_t to) {
  if (t.dtype != KEEL_DTYPE_F32 || to == KEEL_DTYPE_F32) return;
  auto v = t.values<float>();
  if (to == KEEL_DTYPE_F64) {
    std::vector<double> d(v.begin(), v.end());
    t = FakeTensor::of(to, t.dims, d);
  } else {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      h[i] = to == KEEL_DTYPE_F16 ? keel::f32_to_f16(v[i]) : keel::f32_to_bf16(v[i]);
    t = FakeTensor::of(to, t.dims, h);
  }
}

int32_t g_as = KEEL_DTYPE_F32;
int g_fuzz = 0;  // --fuzz N: run N random mutations of each test (shapes, attributes); only crashes matter

uint64_t g_rng = 0x9E3779B97F4A7C15ull;
uint64_t rnd() {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}
int64_t rnd_in(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rnd() % static_cast<uint64_t>(hi - lo + 1)); }

size_t dtype_bytes_of(int32_t dt) { return keel::dtype_size(static_cast<keel::DType>(dt)); }

// Refills a tensor after a shape change: small random values (indices in [-8, 8], floats in [-3, 3]).
void refill(FakeTensor& t) {
  size_t es = dtype_bytes_of(t.dtype);
  int64_t n = t.numel();
  t.data.assign(static_cast<size_t>(n) * es, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t v = rnd_in(-8, 8);
    uint8_t* p = t.data.data() + i * es;
    switch (t.dtype) {
      case KEEL_DTYPE_F32: {
        float f = static_cast<float>(v) * 0.37f;
        std::memcpy(p, &f, 4);
        break;
      }
      case KEEL_DTYPE_F64: {
        double f = static_cast<double>(v) * 0.37;
        std::memcpy(p, &f, 8);
        break;
      }
      case KEEL_DTYPE_F16: {
        uint16_t h = keel::f32_to_f16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case KEEL_DTYPE_BOOL: p[0] = static_cast<uint8_t>(v & 1); break;
      default: std::memcpy(p, &v, std::min<size_t>(es, 8)); break;  // little-endian truncation
    }
  }
}

void mutate(FakeNode& n) {
  int kind = static_cast<int>(rnd() % 4);
  if (kind <= 1 && !n.inputs.empty()) {
    auto& in = n.inputs[rnd() % n.inputs.size()];
    if (!in) return;
    if (kind == 0 && !in->dims.empty()) in->dims[rnd() % in->dims.size()] = rnd_in(0, 6);
    else if (rnd() % 2 && !in->dims.empty()) in->dims.pop_back();
    else in->dims.push_back(rnd_in(1, 3));
    refill(*in);
  } else if (kind == 2 && !n.attrs.empty()) {
    auto it = n.attrs.begin();
    std::advance(it, rnd() % n.attrs.size());
    FakeAttr& a = it->second;
    if (a.kind == KEEL_ATTR_INT) a.i = rnd_in(-3, 6);
    else if (a.kind == KEEL_ATTR_INTS && !a.ints.empty()) a.ints[rnd() % a.ints.size()] = rnd_in(-3, 6);
    else if (a.kind == KEEL_ATTR_INTS) a.ints.push_back(rnd_in(-1, 3));
  } else if (!n.inputs.empty()) {  // drop an optional-looking trailing input
    if (n.inputs.size() > 1) n.inputs.back().reset();
  }
}

// "" when equal, else a reason.
std::string compare(const FakeTensor& got, const FakeTensor& want) {
  if (got.dims != want.dims) {
    std::string g, w;
    for (auto d : got.dims) g += std::to_string(d) + ",";
    for (auto d : want.dims) w += std::to_string(d) + ",";
    return "shape [" + g + "] != [" + w + "]";
  }
  bool swept = want.dtype == KEEL_DTYPE_F32 && got.dtype == g_as;
  if (got.dtype != want.dtype && !swept) return "dtype differs";
  bool is_float = want.dtype == KEEL_DTYPE_F32 || want.dtype == KEEL_DTYPE_F64 || want.dtype == KEEL_DTYPE_F16 ||
                  want.dtype == KEEL_DTYPE_BF16;
  int32_t eff = swept ? g_as : want.dtype;
  double rtol = eff == KEEL_DTYPE_F16 ? 2e-2 : eff == KEEL_DTYPE_BF16 ? 6e-2 : 1e-3;
  double atol = eff == KEEL_DTYPE_F16 ? 2e-2 : eff == KEEL_DTYPE_BF16 ? 6e-2 : 1e-5;
  for (int64_t i = 0; i < want.numel(); ++i) {
    double g = elem(got, i), w = elem(want, i);
    if (is_float) {
      if (std::isnan(w) && std::isnan(g)) continue;
      if (std::isinf(w) && g == w) continue;
      if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w)))
        return "element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
    } else if (g != w) {
      return "element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
    }
  }
  return "";
}

int run_ktests(const FakeRegistry& reg, const std::string& dir, bool verbose, const std::string& filter, bool strict) {
  DIR* d = opendir(dir.c_str());
  if (!d) {
    std::printf("cannot open %s\n", dir.c_str());
    return 1;
  }
  std::vector<std::string> files;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 6 && n.substr(n.size() - 6) == ".ktest" && n.find(filter) != std::string::npos) files.push_back(n);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  int pass = 0, fail = 0, nokernel = 0, unimpl = 0;
  std::vector<std::string> failed, missing;
  for (auto& f : files) {
    std::ifstream in(dir + "/" + f);
    FakeNode n;
    std::vector<std::optional<FakeTensor>> expected;
    std::vector<bool> check;
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream is(line);
      std::string kind;
      is >> kind;
      if (kind == "op") {
        is >> n.op_type >> n.domain >> n.opset;
        if (n.domain == "-") n.domain = "";
      } else if (kind == "attr") {
        std::string name, t;
        is >> name >> t;
        FakeAttr a;
        if (t == "i") {
          a.kind = KEEL_ATTR_INT;
          is >> a.i;
        } else if (t == "f") {
          std::string v;
          is >> v;
          a.kind = KEEL_ATTR_FLOAT;
          a.f = std::strtof(v.c_str(), nullptr);
        } else if (t == "s") {
          std::string v;
          is >> v;
          auto b = unhex(v);
          a.kind = KEEL_ATTR_STRING;
          a.s.assign(b.begin(), b.end());
        } else if (t == "ints") {
          size_t c;
          is >> c;
          a.kind = KEEL_ATTR_INTS;
          a.ints.resize(c);
          for (auto& v : a.ints) is >> v;
        } else if (t == "floats") {
          size_t c;
          is >> c;
          a.kind = KEEL_ATTR_FLOATS;
          for (size_t i = 0; i < c; ++i) {
            std::string v;
            is >> v;
            a.floats.push_back(std::strtof(v.c_str(), nullptr));
          }
        } else if (t == "strings") {
          size_t c;
          is >> c;
          a.kind = KEEL_ATTR_STRINGS;
          for (size_t i = 0; i < c; ++i) {
            std::string v;
            is >> v;
            auto b = unhex(v);
            a.strings.emplace_back(b.begin(), b.end());
          }
        } else if (t == "t") {
          a.kind = KEEL_ATTR_TENSOR;
          a.t = read_tensor(is);
        }
        n.attrs[name] = a;
      } else if (kind == "in") {
        std::string peek;
        if (line == "in -") n.add_absent_input();
        else n.add_input(read_tensor(is));
      } else if (kind == "out") {
        if (line == "out -") {
          n.output_dtypes.push_back(KEEL_DTYPE_UNDEFINED);
          expected.emplace_back(std::nullopt);
          check.push_back(false);
        } else {
          FakeTensor t = read_tensor(is);
          int c = 0;
          is >> c;
          n.output_dtypes.push_back(t.dtype);
          expected.emplace_back(t);
          check.push_back(c != 0);
        }
      }
    }
    if (g_as != KEEL_DTYPE_F32) {  // dtype sweep: run f32 tests in another float dtype
      bool any = false;
      for (auto& in : n.inputs)
        if (in && in->dtype == KEEL_DTYPE_F32) {
          convert_f32(*in, g_as);
          any = true;
        }
      for (auto& [name, a] : n.attrs)
        if (a.kind == KEEL_ATTR_TENSOR) convert_f32(a.t, g_as);
      for (auto& dt : n.output_dtypes)
        if (dt == KEEL_DTYPE_F32) dt = g_as;
      if (!any) continue;
    }
    if (g_fuzz > 0) {
      if (!reg.find(n.op_type, n.domain, n.opset)) continue;
      for (int it = 0; it < g_fuzz; ++it) {
        FakeNode m = n;
        int steps = 1 + static_cast<int>(rnd() % 3);
        for (int j = 0; j < steps; ++j) mutate(m);
        if (verbose) {
          std::printf("fuzz %s #%d\n", f.c_str(), it);
          std::fflush(stdout);
        }
        int32_t code = 0;
        std::string err = run_status(reg, m, &code);
        if (code == KEEL_STATUS_INTERNAL) std::printf("INTERNAL %s #%d: %s\n", f.c_str(), it, err.c_str());
      }
      ++pass;
      continue;
    }
    if (!reg.find(n.op_type, n.domain, n.opset)) {
      ++nokernel;
      missing.push_back(f + " (" + n.op_type + " v" + std::to_string(n.opset) + ")");
      continue;
    }
    int32_t code = 0;
    std::string err = run_status(reg, n, &code);
    std::string why;
    if (!err.empty()) {
      if (code == KEEL_STATUS_UNIMPLEMENTED) {
        ++unimpl;
        if (verbose) std::printf("UNIMPL %s: %s\n", f.c_str(), err.c_str());
        continue;
      }
      why = "error: " + err;
    } else {
      for (size_t i = 0; i < expected.size() && why.empty(); ++i) {
        if (!check[i]) continue;
        if (i >= n.outputs.size() || !n.output_written[i]) {
          why = "output " + std::to_string(i) + " not written";
          break;
        }
        std::string c = compare(n.outputs[i], *expected[i]);
        if (!c.empty()) why = "output " + std::to_string(i) + " " + c;
      }
    }
    if (why.empty()) {
      ++pass;
      if (verbose) std::printf("PASS %s\n", f.c_str());
    } else {
      ++fail;
      failed.push_back(f + ": " + why);
    }
  }
  for (auto& s : failed) std::printf("FAIL %s\n", s.c_str());
  if (verbose)
    for (auto& s : missing) std::printf("NO_KERNEL %s\n", s.c_str());
  std::printf("ONNX node tests: %d pass, %d fail, %d unimplemented, %d without a kernel (of %zu)\n", pass, fail, unimpl,
              nokernel, files.size());
  return strict && fail ? 1 : 0;
}

}  // namespace

// --bench: rough single-thread timings of the heavy kernels (the fake parallel_for is sequential).
void bench(const FakeRegistry& reg) {
  auto time_node = [&](FakeNode& n, const char* what, double flops) {
    auto t0 = std::chrono::steady_clock::now();
    std::string e = run_status(reg, n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("bench %-40s %8.1f ms  %6.2f GFLOP/s %s\n", what, s * 1e3, flops / s / 1e9, e.c_str());
  };
  std::vector<float> x(64 * 56 * 56, 0.5f), w(64 * 64 * 9, 0.25f);
  FakeNode c("Conv", 13);
  c.add_input(FakeTensor::f32({1, 64, 56, 56}, x));
  c.add_input(FakeTensor::f32({64, 64, 3, 3}, w));
  c.attrs["pads"] = FakeAttr::int_list({1, 1, 1, 1});
  c.output_dtypes = {KEEL_DTYPE_F32};
  time_node(c, "Conv 1x64x56x56 k3 64", 2.0 * 64 * 56 * 56 * 64 * 9);
  std::vector<float> dw(64 * 9, 0.25f);
  FakeNode d("Conv", 13);
  d.add_input(FakeTensor::f32({1, 64, 56, 56}, x));
  d.add_input(FakeTensor::f32({64, 1, 3, 3}, dw));
  d.attrs["pads"] = FakeAttr::int_list({1, 1, 1, 1});
  d.attrs["group"] = FakeAttr::integer(64);
  d.output_dtypes = {KEEL_DTYPE_F32};
  time_node(d, "Conv depthwise 1x64x56x56 k3", 2.0 * 64 * 56 * 56 * 9);
  std::vector<float> a(512 * 512, 0.5f);
  FakeNode m("MatMul", 13);
  m.add_input(FakeTensor::f32({512, 512}, a));
  m.add_input(FakeTensor::f32({512, 512}, a));
  m.output_dtypes = {KEEL_DTYPE_F32};
  time_node(m, "MatMul 512^3", 2.0 * 512 * 512 * 512);
  FakeNode g("Gemm", 13);
  g.add_input(FakeTensor::f32({512, 512}, a));
  g.add_input(FakeTensor::f32({512, 512}, a));
  g.attrs["transB"] = FakeAttr::integer(1);
  g.output_dtypes = {KEEL_DTYPE_F32};
  time_node(g, "Gemm 512^3 transB", 2.0 * 512 * 512 * 512);
  FakeNode p("MaxPool", 13);
  p.add_input(FakeTensor::f32({1, 64, 56, 56}, x));
  p.attrs["kernel_shape"] = FakeAttr::int_list({3, 3});
  p.attrs["pads"] = FakeAttr::int_list({1, 1, 1, 1});
  p.attrs["strides"] = FakeAttr::int_list({2, 2});
  p.output_dtypes = {KEEL_DTYPE_F32};
  time_node(p, "MaxPool 1x64x56x56 k3 s2", 64.0 * 28 * 28 * 9);
}

int main(int argc, char** argv) {
  FakeRegistry reg;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--bench") {
      bench(reg);
      return 0;
    }
  if (reg.init_status()) {
    std::printf("registration failed: %s\n", reg.init_status()->message);
    return 1;
  }
  std::printf("%zu reference kernels registered\n", reg.defs().size());
  hand_tests(reg);
  int rc = g_failures ? 1 : 0;
  std::printf("hand-computed checks: %s (%d failures)\n", g_failures ? "FAILED" : "passed", g_failures);
  if (argc > 1) {
    bool verbose = false, strict = false;
    std::string filter;
    for (int i = 2; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "-v") verbose = true;
      else if (a == "--strict") strict = true;
      else if (a == "--fuzz" && i + 1 < argc) g_fuzz = std::atoi(argv[++i]);
      else if (a == "--seed" && i + 1 < argc) g_rng ^= std::strtoull(argv[++i], nullptr, 10) * 0x2545F4914F6CDD1Dull;
      else if (a == "--as-f64") g_as = KEEL_DTYPE_F64;
      else if (a == "--as-f16") g_as = KEEL_DTYPE_F16;
      else if (a == "--as-bf16") g_as = KEEL_DTYPE_BF16;
      else filter = a;
    }
    rc |= run_ktests(reg, argv[1], verbose, filter, strict);
  }
  return rc;
}
