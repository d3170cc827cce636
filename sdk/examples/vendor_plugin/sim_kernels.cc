// sim_kernels.cc — the sim device's kernels, written in C++ over the SDK's kernel layer.
//
// <keel/kernel.hpp> is header-only C++17 over <keel/plugin.h>: KernelContext reads inputs and attributes and
// allocates outputs with std:: types, a kernel throws Reject ("not this case": the core tries the next kernel, here
// the CPU's) or Failure (an error with its code), and keel::sdk::guard turns whatever a body throws into a
// keel_status_t at the C edge, so no exception crosses into the core. The device table stays in C (sim_device.c).
//
// Three f32 kernels: Relu, Add (ONNX multidirectional broadcasting, rank <= 8) and MatMul (A of rank >= 2 times a 2-D
// B; anything else is rejected at create time and runs on the CPU). Each checks that the memory it is given lies in
// the sim arena, so that a bug in the core's copies shows up as an error naming the problem.
#include <keel/kernel.hpp>
#include <keel/shape.hpp>

#include <initializer_list>
#include <string>

#include "sim_device.h"

namespace {

using keel::sdk::Dims;
using keel::sdk::Failure;
using keel::sdk::KernelContext;
using keel::sdk::Reject;
using keel::sdk::Stage;

const keel_core_api_t* g_host = nullptr;
constexpr int kMaxRank = 8;

// Throws INTERNAL unless every tensor's data lies inside the sim arena.
void check_in_arena(const char* op, std::initializer_list<const keel_tensor_t*> tensors) {
  for (const keel_tensor_t* t : tensors)
    if (!sim_owns(t->data, t->byte_size))
      throw Failure{KEEL_STATUS_INTERNAL, std::string("sim: ") + op + " was given memory outside the sim arena"};
}

void relu(KernelContext& c) {
  const keel_tensor_t* x = c.input(0);
  keel_tensor_t* y = c.output(0, c.dims(0));
  check_in_arena("Relu", {x, y});
  const float* px = static_cast<const float*>(x->data);
  float* py = static_cast<float*>(y->data);
  for (int64_t i = 0, n = keel::sdk::numel(*x); i < n; ++i) py[i] = px[i] > 0.f ? px[i] : 0.f;
}

void add(KernelContext& c) {
  const keel_tensor_t* a = c.input(0);
  const keel_tensor_t* b = c.input(1);
  const int rank = a->ndim > b->ndim ? a->ndim : b->ndim;
  if (rank > kMaxRank) throw Failure{KEEL_STATUS_UNIMPLEMENTED, "sim: Add of rank > 8"};
  // Right-aligned broadcasting: a dim of 1 (or a missing one) repeats; a stride of 0 repeats it.
  Dims dims(rank), sa(rank), sb(rank), idx(rank, 0);
  int64_t stride_a = 1, stride_b = 1;
  for (int d = rank - 1; d >= 0; --d) {
    const int da = d - (rank - a->ndim), db = d - (rank - b->ndim);
    const int64_t xa = da >= 0 ? a->dims[da] : 1, xb = db >= 0 ? b->dims[db] : 1;
    if (xa != xb && xa != 1 && xb != 1) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "sim: Add shapes do not broadcast"};
    dims[d] = xa > xb ? xa : xb;
    sa[d] = xa == 1 ? 0 : stride_a;
    sb[d] = xb == 1 ? 0 : stride_b;
    stride_a *= xa;
    stride_b *= xb;
  }
  keel_tensor_t* y = c.output(0, dims);
  check_in_arena("Add", {a, b, y});
  const float* pa = static_cast<const float*>(a->data);
  const float* pb = static_cast<const float*>(b->data);
  float* py = static_cast<float*>(y->data);
  int64_t oa = 0, ob = 0;
  for (int64_t i = 0, n = keel::sdk::numel(dims); i < n; ++i) {
    py[i] = pa[oa] + pb[ob];
    for (int d = rank - 1; d >= 0; --d) {  // odometer increment over the output index
      oa += sa[d];
      ob += sb[d];
      if (++idx[d] < dims[d]) break;
      oa -= sa[d] * dims[d];
      ob -= sb[d] * dims[d];
      idx[d] = 0;
    }
  }
}

// MatMul: only A[..., M, K] x B[K, N].
void matmul_check(KernelContext& c) {
  const keel_tensor_t* a = c.input(0);
  const keel_tensor_t* b = c.input(1);
  if (a == nullptr || b == nullptr || a->ndim < 2 || b->ndim != 2)
    throw Reject{"sim: MatMul needs A of rank >= 2 and a 2-D B"};
}

void matmul(KernelContext& c) {
  const keel_tensor_t* a = c.input(0);
  const keel_tensor_t* b = c.input(1);
  if (a->ndim < 2 || a->ndim > kMaxRank || b->ndim != 2 || a->dims[a->ndim - 1] != b->dims[0])
    throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "sim: MatMul shapes do not match"};
  Dims dims = c.dims(0);
  dims.back() = b->dims[1];
  keel_tensor_t* y = c.output(0, dims);
  check_in_arena("MatMul", {a, b, y});
  const int64_t kk = b->dims[0], nn = b->dims[1];
  const int64_t rows = keel::sdk::numel(*a) / (kk ? kk : 1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = static_cast<const float*>(a->data) + r * kk;
    float* yr = static_cast<float*>(y->data) + r * nn;
    for (int64_t j = 0; j < nn; ++j) yr[j] = 0.f;
    for (int64_t p = 0; p < kk; ++p) {
      const float av = ar[p];
      const float* br = static_cast<const float*>(b->data) + p * nn;
      for (int64_t j = 0; j < nn; ++j) yr[j] += av * br[j];
    }
  }
}

// The C entries: a kernel body runs under guard, so what it throws becomes a status.
template <void (*Body)(KernelContext&)>
keel_status_t compute(void*, keel_kernel_context_t* ctx) {
  return keel::sdk::guard(g_host, Stage::kCompute, [&] {
    KernelContext c(ctx, g_host->kernel);
    Body(c);
  });
}
template <void (*Check)(KernelContext&)>
keel_status_t create(void* user_data, keel_kernel_context_t* ctx, void** out_state) {
  *out_state = user_data;
  return keel::sdk::guard(g_host, Stage::kCreate, [&] {
    KernelContext c(ctx, g_host->kernel);
    Check(c);
  });
}

const int32_t kF32[] = {KEEL_DTYPE_F32};
const keel_type_constraint_t kT[] = {{KEEL_TYPE_CONSTRAINT_HEADER, "T", kF32, 1}};

keel_status_t register_kernel(keel_plugin_handle_t* plugin, const char* name, const char* op, int32_t since,
                              keel_status_t (*create_fn)(void*, keel_kernel_context_t*, void**),
                              keel_status_t (*compute_fn)(void*, keel_kernel_context_t*)) {
  keel_kernel_def_t def{};
  def.struct_size = sizeof def;
  def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  def.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  def.name = name;
  def.domain = "";
  def.op_type = op;
  def.since_version = since;
  def.end_version = 0;
  def.device_type = "sim";
  def.constraints = kT;
  def.constraint_count = 1;
  def.create = create_fn;
  def.compute = compute_fn;
  return g_host->register_kernel(plugin, &def);
}

}  // namespace

extern "C" keel_status_t sim_register_kernels(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  g_host = host;
  if (keel_status_t st = register_kernel(plugin, "sim_f32_relu", "Relu", 6, nullptr, compute<relu>)) return st;
  if (keel_status_t st = register_kernel(plugin, "sim_f32_add", "Add", 7, nullptr, compute<add>)) return st;
  return register_kernel(plugin, "sim_f32_matmul", "MatMul", 1, create<matmul_check>, compute<matmul>);
}
