// plugins/cuda/cuda_ops.cc — host side of the CUDA plugin's own kernels: element-wise unary and binary (with
// multidirectional broadcasting), Where, Softmax/LogSoftmax, Transpose, Concat, Cast. The device code is in
// cuda_kernels.cu. Anything not handled is rejected at create (UNIMPLEMENTED), so the core runs it on the CPU.
#include <algorithm>
#include <cstring>

#include "cuda_common.h"
#include "cuda_kernels.h"

namespace keel::cuda {
namespace {

bool is_float(int32_t t) { return t == KEEL_DTYPE_F32 || t == KEEL_DTYPE_F16 || t == KEEL_DTYPE_BF16; }

void require_float(const Ctx& c, int i) {
  if (!is_float(c.dtype(i)))
    throw Reject{"input " + std::to_string(i) + " dtype " + std::to_string(c.dtype(i)) + " (only f32, f16, bf16)"};
}
void require_rank_fits(const Ctx& c, int i) {
  if (c.rank_known(i) && c.dims(i).size() > static_cast<size_t>(kMaxRank))
    throw Reject{"rank > " + std::to_string(kMaxRank)};
}

// Multidirectional (numpy) broadcast of up to 3 shapes; throws Failure on incompatible shapes.
Dims broadcast_dims(const std::vector<Dims>& in) {
  size_t r = 0;
  for (const auto& d : in) r = std::max(r, d.size());
  Dims out(r, 1);
  for (const auto& d : in)
    for (size_t i = 0; i < d.size(); ++i) {
      int64_t& o = out[r - d.size() + i];
      const int64_t v = d[i];
      if (v == o || v == 1) continue;
      if (o == 1) o = v;
      else throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: shapes do not broadcast: " + dims_str(d) + " vs " + dims_str(out)};
    }
  return out;
}

// A Strided view of `out` with operand k reading `in[k]` (right-aligned, stride 0 where broadcast).
Strided make_strided(const Dims& out, const std::vector<Dims>& in) {
  if (out.size() > static_cast<size_t>(kMaxRank))
    throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: rank " + std::to_string(out.size()) + " > " + std::to_string(kMaxRank)};
  Strided s;
  s.ndim = static_cast<int32_t>(out.size());
  for (size_t d = 0; d < out.size(); ++d) s.dims[d] = out[d];
  for (size_t k = 0; k < in.size(); ++k) {
    const Dims& d = in[k];
    int64_t stride = 1;
    for (size_t j = d.size(); j-- > 0;) {
      const size_t od = out.size() - d.size() + j;
      s.strides[od][k] = d[j] == 1 ? 0 : stride;
      stride *= d[j];
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------------------------

class UnaryK : public Kernel {
 public:
  UnaryK(Unary op, float a, float b, float g) : op_(op), a_(a), b_(b), g_(g) {}
  void setup(Ctx& c) override {
    require_float(c, 0);
    switch (op_) {  // attributes with ONNX defaults
      case Unary::kLeakyRelu: a_ = c.attr_f("alpha", 0.01f); break;
      case Unary::kElu: a_ = c.attr_f("alpha", 1.0f); break;
      case Unary::kHardSigmoid: a_ = c.attr_f("alpha", 0.2f); b_ = c.attr_f("beta", 0.5f); break;
      case Unary::kSelu:
        a_ = c.attr_f("alpha", 1.67326319217681884765625f);
        g_ = c.attr_f("gamma", 1.05070102214813232421875f);
        break;
      default: break;
    }
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    keel_tensor_t* y = c.output(0, d);
    check_cuda(launch_unary(op_, c.dtype(0), c.data(0), y->data, numel(d), a_, b_, g_, c.stream()), "unary kernel");
  }

 private:
  Unary op_;
  float a_, b_, g_;
};

class BinaryK : public Kernel {
 public:
  explicit BinaryK(Binary op) : op_(op) {}
  void setup(Ctx& c) override {
    if (c.input_count() != 2) throw Reject{"only 2 inputs"};
    require_float(c, 0);
    if (c.dtype(1) != c.dtype(0)) throw Reject{"mixed dtypes"};
    require_rank_fits(c, 0);
    require_rank_fits(c, 1);
  }
  void run(Ctx& c) override {
    const Dims a = c.dims(0), b = c.dims(1);
    const Dims out = broadcast_dims({a, b});
    keel_tensor_t* y = c.output(0, out);
    const bool same = a == b;
    const Strided st = same ? Strided{} : make_strided(out, {a, b});
    check_cuda(launch_binary(op_, c.dtype(0), c.data(0), c.data(1), y->data, numel(out), st, same, c.stream()),
               "binary kernel");
  }

 private:
  Binary op_;
};

class WhereK : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (c.dtype(0) != KEEL_DTYPE_BOOL) throw Reject{"condition is not bool"};
    if (c.dtype(1) != c.dtype(2) || dtype_size(c.dtype(1)) == 0) throw Reject{"unsupported value dtype"};
    for (int i = 0; i < 3; ++i) require_rank_fits(c, i);
  }
  void run(Ctx& c) override {
    const Dims d0 = c.dims(0), d1 = c.dims(1), d2 = c.dims(2);
    const Dims out = broadcast_dims({d0, d1, d2});
    keel_tensor_t* y = c.output(0, out);
    check_cuda(launch_where(dtype_size(c.dtype(1)), static_cast<const uint8_t*>(c.data(0)), c.data(1), c.data(2),
                            y->data, numel(out), make_strided(out, {d0, d1, d2}), c.stream()),
               "where kernel");
  }
};

class SoftmaxK : public Kernel {
 public:
  explicit SoftmaxK(bool log) : log_(log) {}
  void setup(Ctx& c) override {
    require_float(c, 0);
    legacy_ = c.opset() < 13;
    axis_ = c.attr_i("axis", legacy_ ? 1 : -1);
    if (!legacy_ && axis_ != -1) {
      if (!c.rank_known(0)) throw Reject{"axis " + std::to_string(axis_) + " with unknown rank (only the last axis)"};
      if (axis_ != static_cast<int64_t>(c.dims(0).size()) - 1) throw Reject{"only the last axis"};
    }
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    const int64_t r = static_cast<int64_t>(d.size());
    int64_t axis = axis_ < 0 ? axis_ + r : axis_;
    if (r == 0) axis = 0;
    if (axis < 0 || (r > 0 && axis >= r))
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: softmax axis " + std::to_string(axis_) + " out of range"};
    if (!legacy_ && r > 0 && axis != r - 1)
      throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: softmax over a non-last axis"};
    int64_t rows = 1, cols = 1;
    for (int64_t i = 0; i < r; ++i) (i < axis ? rows : cols) *= d[i];
    keel_tensor_t* y = c.output(0, d);
    check_cuda(launch_softmax(c.dtype(0), c.data(0), y->data, rows, cols, log_, c.stream()), "softmax kernel");
  }

 private:
  bool log_;
  bool legacy_ = false;
  int64_t axis_ = -1;
};

class TransposeK : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (dtype_size(c.dtype(0)) == 0) throw Reject{"unsupported dtype"};
    require_rank_fits(c, 0);
    perm_ = c.attr_ints("perm", {});
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    const size_t r = d.size();
    Dims perm = perm_;
    if (perm.empty())
      for (size_t i = 0; i < r; ++i) perm.push_back(static_cast<int64_t>(r - 1 - i));
    if (perm.size() != r) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Transpose perm size != rank"};
    Dims in_strides(r, 1), out(r);
    for (size_t i = r; i-- > 1;) in_strides[i - 1] = in_strides[i] * d[i];
    Strided s;
    if (r > static_cast<size_t>(kMaxRank)) throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: Transpose rank > 8"};
    s.ndim = static_cast<int32_t>(r);
    for (size_t i = 0; i < r; ++i) {
      const int64_t p = perm[i] < 0 ? perm[i] + static_cast<int64_t>(r) : perm[i];
      if (p < 0 || p >= static_cast<int64_t>(r)) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: bad perm"};
      out[i] = d[p];
      s.dims[i] = d[p];
      s.strides[i][0] = in_strides[p];
    }
    keel_tensor_t* y = c.output(0, out);
    check_cuda(launch_strided_copy(dtype_size(c.dtype(0)), c.data(0), y->data, numel(out), s, c.stream()),
               "transpose kernel");
  }

 private:
  Dims perm_;
};

class ConcatK : public Kernel {
 public:
  void setup(Ctx& c) override {
    const int32_t t = c.dtype(0);
    if (dtype_size(t) == 0) throw Reject{"unsupported dtype"};
    for (int i = 1; i < c.input_count(); ++i)
      if (c.dtype(i) != t) throw Reject{"mixed dtypes"};
    axis_ = c.attr_i("axis", 0);
  }
  void run(Ctx& c) override {
    const int n = c.input_count();
    Dims out = c.dims(0);
    const int64_t r = static_cast<int64_t>(out.size());
    const int64_t axis = axis_ < 0 ? axis_ + r : axis_;
    if (axis < 0 || axis >= r) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Concat axis out of range"};
    out[axis] = 0;
    for (int i = 0; i < n; ++i) {
      const Dims d = c.dims(i);
      if (static_cast<int64_t>(d.size()) != r)
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Concat inputs of different ranks"};
      out[axis] += d[axis];
    }
    keel_tensor_t* y = c.output(0, out);
    const int64_t es = dtype_size(c.dtype(0));
    int64_t outer = 1, inner = es;
    for (int64_t i = 0; i < axis; ++i) outer *= out[i];
    for (int64_t i = axis + 1; i < r; ++i) inner *= out[i];
    if (outer == 0 || inner == 0) return;
    const size_t dpitch = static_cast<size_t>(out[axis] * inner);
    size_t offset = 0;
    for (int i = 0; i < n; ++i) {
      const size_t width = static_cast<size_t>(c.dims(i)[axis] * inner);
      if (width == 0) continue;
      check_cuda(cudaMemcpy2DAsync(static_cast<char*>(y->data) + offset, dpitch, c.data(i), width, width,
                                   static_cast<size_t>(outer), cudaMemcpyDeviceToDevice, c.stream()),
                 "Concat copy");
      offset += width;
    }
  }

 private:
  int64_t axis_ = 0;
};

class CastK : public Kernel {
 public:
  void setup(Ctx& c) override {
    to_ = static_cast<int32_t>(c.attr_i("to", 0));
    if (!cast_supported(c.dtype(0)) || !cast_supported(to_))
      throw Reject{"cast " + std::to_string(c.dtype(0)) + " -> " + std::to_string(to_) + " not handled"};
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    keel_tensor_t* y = c.output(0, d);
    const int64_t n = numel(d);
    if (c.dtype(0) == to_) {
      if (n) check_cuda(cudaMemcpyAsync(y->data, c.data(0), n * dtype_size(to_), cudaMemcpyDeviceToDevice, c.stream()),
                        "Cast copy");
      return;
    }
    check_cuda(launch_cast(c.dtype(0), c.data(0), to_, y->data, n, c.stream()), "cast kernel");
  }

 private:
  int32_t to_ = 0;
};

template <Unary op>
Kernel* make_unary() { return new UnaryK(op, 0.f, 0.f, 0.f); }
template <Binary op>
Kernel* make_binary() { return new BinaryK(op); }

}  // namespace

std::vector<KernelInfo> elementwise_kernels() {
  return {
      {"Relu", 6, 0, "cuda_relu", make_unary<Unary::kRelu>},
      {"Sigmoid", 6, 0, "cuda_sigmoid", make_unary<Unary::kSigmoid>},
      {"Tanh", 6, 0, "cuda_tanh", make_unary<Unary::kTanh>},
      {"Exp", 6, 0, "cuda_exp", make_unary<Unary::kExp>},
      {"Log", 6, 0, "cuda_log", make_unary<Unary::kLog>},
      {"Neg", 6, 0, "cuda_neg", make_unary<Unary::kNeg>},
      {"Abs", 6, 0, "cuda_abs", make_unary<Unary::kAbs>},
      {"Sqrt", 6, 0, "cuda_sqrt", make_unary<Unary::kSqrt>},
      {"Reciprocal", 6, 0, "cuda_reciprocal", make_unary<Unary::kReciprocal>},
      {"Erf", 9, 0, "cuda_erf", make_unary<Unary::kErf>},
      {"LeakyRelu", 6, 0, "cuda_leaky_relu", make_unary<Unary::kLeakyRelu>},
      {"Elu", 6, 0, "cuda_elu", make_unary<Unary::kElu>},
      {"HardSigmoid", 6, 0, "cuda_hard_sigmoid", make_unary<Unary::kHardSigmoid>},
      {"Softplus", 1, 0, "cuda_softplus", make_unary<Unary::kSoftplus>},
      {"Softsign", 1, 0, "cuda_softsign", make_unary<Unary::kSoftsign>},
      {"Sin", 7, 0, "cuda_sin", make_unary<Unary::kSin>},
      {"Cos", 7, 0, "cuda_cos", make_unary<Unary::kCos>},
      {"Floor", 6, 0, "cuda_floor", make_unary<Unary::kFloor>},
      {"Ceil", 6, 0, "cuda_ceil", make_unary<Unary::kCeil>},
      {"HardSwish", 14, 0, "cuda_hard_swish", make_unary<Unary::kHardSwish>},
      {"Selu", 6, 0, "cuda_selu", make_unary<Unary::kSelu>},
      {"Add", 7, 0, "cuda_add", make_binary<Binary::kAdd>},
      {"Sub", 7, 0, "cuda_sub", make_binary<Binary::kSub>},
      {"Mul", 7, 0, "cuda_mul", make_binary<Binary::kMul>},
      {"Div", 7, 0, "cuda_div", make_binary<Binary::kDiv>},
      {"Pow", 7, 0, "cuda_pow", make_binary<Binary::kPow>},
      {"Max", 8, 0, "cuda_max", make_binary<Binary::kMax>},
      {"Min", 8, 0, "cuda_min", make_binary<Binary::kMin>},
      {"Where", 9, 0, "cuda_where", [] () -> Kernel* { return new WhereK; }},
      {"Softmax", 1, 0, "cuda_softmax", [] () -> Kernel* { return new SoftmaxK(false); }},
      {"LogSoftmax", 1, 0, "cuda_log_softmax", [] () -> Kernel* { return new SoftmaxK(true); }},
      {"Transpose", 1, 0, "cuda_transpose", [] () -> Kernel* { return new TransposeK; }},
      {"Concat", 4, 0, "cuda_concat", [] () -> Kernel* { return new ConcatK; }},
      {"Cast", 6, 0, "cuda_cast", [] () -> Kernel* { return new CastK; }},
  };
}

}  // namespace keel::cuda
