// plugins/cuda/cuda_ops.cc — host side of the CUDA plugin's own kernels: element-wise unary and binary (with
// multidirectional broadcasting), Where, Softmax/LogSoftmax, Transpose, Concat, Cast, Clip, Gelu, reductions,
// ArgMax/ArgMin, LayerNormalization, Gather, Slice, Expand, Pad, Split, Resize and the reshaping ops. The device code
// is in cuda_kernels.cu. Anything not handled is rejected at create (UNIMPLEMENTED), so the core runs it on the CPU.
#include <algorithm>
#include <cmath>
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
      else
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT,
                      "cuda: shapes do not broadcast: " + dims_str(d) + " vs " + dims_str(out)};
    }
  return out;
}

// A Strided view of `out` with operand k reading `in[k]` (right-aligned, stride 0 where broadcast).
Strided make_strided(const Dims& out, const std::vector<Dims>& in) {
  if (out.size() > static_cast<size_t>(kMaxRank))
    throw Failure{KEEL_STATUS_UNIMPLEMENTED,
                  "cuda: rank " + std::to_string(out.size()) + " > " + std::to_string(kMaxRank)};
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
      case Unary::kHardSigmoid:
        a_ = c.attr_f("alpha", 0.2f);
        b_ = c.attr_f("beta", 0.5f);
        break;
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

void reject_shape_arithmetic(const Ctx& c, int i);  // below

class ConcatK : public Kernel {
 public:
  void setup(Ctx& c) override {
    const int32_t t = c.dtype(0);
    if (dtype_size(t) == 0) throw Reject{"unsupported dtype"};
    for (int i = 1; i < c.input_count(); ++i)
      if (c.dtype(i) != t) throw Reject{"mixed dtypes"};
    for (int i = 0; i < c.input_count(); ++i) reject_shape_arithmetic(c, i);
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
      if (n)
        check_cuda(cudaMemcpyAsync(y->data, c.data(0), n * dtype_size(to_), cudaMemcpyDeviceToDevice, c.stream()),
                   "Cast copy");
      return;
    }
    check_cuda(launch_cast(c.dtype(0), c.data(0), to_, y->data, n, c.stream()), "cast kernel");
  }

 private:
  int32_t to_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// Small host-side inputs (shapes, axes, pads, starts, scales, clip bounds)
// ---------------------------------------------------------------------------------------------------------------

float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
float bf16_bits_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The elements of a host copy of a tensor as doubles (float and integer dtypes).
std::vector<double> as_doubles(int32_t dtype, const void* p, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double x = 0;
    switch (dtype) {
      case KEEL_DTYPE_F32: x = static_cast<const float*>(p)[i]; break;
      case KEEL_DTYPE_F64: x = static_cast<const double*>(p)[i]; break;
      case KEEL_DTYPE_F16: x = half_bits_to_float(static_cast<const uint16_t*>(p)[i]); break;
      case KEEL_DTYPE_BF16: x = bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]); break;
      case KEEL_DTYPE_I64: x = static_cast<double>(static_cast<const int64_t*>(p)[i]); break;
      case KEEL_DTYPE_I32: x = static_cast<const int32_t*>(p)[i]; break;
      case KEEL_DTYPE_I16: x = static_cast<const int16_t*>(p)[i]; break;
      case KEEL_DTYPE_I8: x = static_cast<const int8_t*>(p)[i]; break;
      case KEEL_DTYPE_U8:
      case KEEL_DTYPE_BOOL: x = static_cast<const uint8_t*>(p)[i]; break;
      default: throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: unsupported dtype " + std::to_string(dtype)};
    }
    v[static_cast<size_t>(i)] = x;
  }
  return v;
}
std::vector<int64_t> as_ints(int32_t dtype, const void* p, int64_t n) {
  if (dtype == KEEL_DTYPE_I64)
    return std::vector<int64_t>(static_cast<const int64_t*>(p), static_cast<const int64_t*>(p) + n);
  if (dtype == KEEL_DTYPE_I32)
    return std::vector<int64_t>(static_cast<const int32_t*>(p), static_cast<const int32_t*>(p) + n);
  throw Failure{KEEL_STATUS_INVALID_ARGUMENT,
                "cuda: expected an int64 or int32 tensor, got dtype " + std::to_string(dtype)};
}

// A small input whose values the host needs (a shape, axes, pads, scales, ...): taken from the constant the kernel
// saw at create when there was one (no device round trip per run), else copied from the device, which synchronises
// the stream; such inputs are a few bytes and usually constants.
class HostInput {
 public:
  explicit HostInput(int index) : index_(index) {}
  void capture(Ctx& c) {
    const keel_tensor_t* t = c.input(index_);
    if (!t || !t->data || t->ndim < 0) return;
    const int64_t n = numel(Dims(t->dims, t->dims + t->ndim));
    values_ = as_doubles(t->dtype, t->data, n);
    if (t->dtype == KEEL_DTYPE_I64) ints_ = as_ints(t->dtype, t->data, n);  // exact beyond 2^53
    constant_ = true;
  }
  bool constant() const { return constant_; }
  bool present(Ctx& c) const { return c.has_input(index_); }
  std::vector<double> doubles(Ctx& c) const {
    if (constant_) return values_;
    std::vector<char> h = fetch(c);
    return as_doubles(c.dtype(index_), h.data(), numel(c.dims(index_)));
  }
  std::vector<int64_t> ints(Ctx& c) const {
    if (constant_) {
      if (!ints_.empty() || values_.empty()) return ints_;
      std::vector<int64_t> v;
      for (double d : values_) v.push_back(static_cast<int64_t>(d));
      return v;
    }
    std::vector<char> h = fetch(c);
    return as_ints(c.dtype(index_), h.data(), numel(c.dims(index_)));
  }

 private:
  std::vector<char> fetch(Ctx& c) const {
    const int32_t es = dtype_size(c.dtype(index_));
    if (es == 0)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: input " + std::to_string(index_) + " has no fixed-size dtype"};
    const int64_t n = numel(c.dims(index_));
    std::vector<char> h(static_cast<size_t>(n * es) + 1);
    if (n) {
      check_cuda(cudaMemcpyAsync(h.data(), c.data(index_), static_cast<size_t>(n * es), cudaMemcpyDefault, c.stream()),
                 "read of a shape-like input");
      check_cuda(cudaStreamSynchronize(c.stream()), "read of a shape-like input");
    }
    return h;
  }
  int index_;
  bool constant_ = false;
  std::vector<double> values_;
  std::vector<int64_t> ints_;
};

bool is_int_dtype(int32_t t) { return t == KEEL_DTYPE_I64 || t == KEEL_DTYPE_I32; }
// Integer tensors of rank <= 1 are shape arithmetic (Shape -> Gather -> Concat -> Reshape): they stay on the
// host, where the shapes are read, instead of bouncing through the device.
void reject_shape_arithmetic(const Ctx& c, int i) {
  if (is_int_dtype(c.dtype(i)) && c.rank_known(i) && c.dims(i).size() <= 1)
    throw Reject{"integer tensor of rank <= 1 (shape arithmetic stays on the host)"};
}
int64_t norm_axis(int64_t axis, int64_t rank, const char* op) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    throw Failure{KEEL_STATUS_INVALID_ARGUMENT, std::string("cuda: ") + op + ": axis " + std::to_string(axis) +
                                                    " out of range for rank " + std::to_string(rank)};
  return a;
}
void copy_device(Ctx& c, void* dst, const void* src, int64_t bytes, const char* what) {
  if (bytes > 0 && dst != src)
    check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, c.stream()), what);
}
Dims strides_of(const Dims& d) {
  Dims s(d.size(), 1);
  for (size_t i = d.size(); i-- > 1;) s[i - 1] = s[i] * d[i];
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Reductions, ArgMax/ArgMin
// ---------------------------------------------------------------------------------------------------------------

class ReduceK : public Kernel {
 public:
  ReduceK(Reduce op, int32_t axes_input_since) : op_(op), axes_input_since_(axes_input_since) {}
  void setup(Ctx& c) override {
    require_float(c, 0);
    require_rank_fits(c, 0);
    keepdims_ = c.attr_i("keepdims", 1) != 0;
    noop_ = c.attr_i("noop_with_empty_axes", 0) != 0;
    from_input_ = c.opset() >= axes_input_since_;
    if (from_input_) axes_in_.capture(c);
    else attr_axes_ = c.attr_ints("axes", {});
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    const int64_t r = static_cast<int64_t>(d.size());
    if (r > kMaxRank) throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: reduction of rank > 8"};
    Dims axes = from_input_ ? (axes_in_.present(c) ? axes_in_.ints(c) : Dims{}) : attr_axes_;
    std::vector<bool> red(static_cast<size_t>(r), false);
    if (axes.empty()) {
      if (noop_) {
        keel_tensor_t* y = c.output(0, d);
        copy_device(c, y->data, c.data(0), numel(d) * dtype_size(c.dtype(0)), "reduce (no axes) copy");
        return;
      }
      red.assign(static_cast<size_t>(r), true);
    }
    for (int64_t a : axes) red[static_cast<size_t>(norm_axis(a, r, "reduce"))] = true;
    const Dims st = strides_of(d);
    Dims out_dims;
    Strided out, rv;
    int64_t n_red = 1, n_out = 1;
    for (int64_t i = 0; i < r; ++i) {
      if (red[i]) {
        rv.dims[rv.ndim] = d[i];
        rv.strides[rv.ndim++][0] = st[i];
        n_red *= d[i];
        if (keepdims_) out_dims.push_back(1);
      } else {
        out.dims[out.ndim] = d[i];
        out.strides[out.ndim++][0] = st[i];
        n_out *= d[i];
        out_dims.push_back(d[i]);
      }
    }
    keel_tensor_t* y = c.output(0, out_dims);
    const size_t scratch = reduce_scratch_bytes(op_, n_out, n_red);
    float* parts = scratch ? static_cast<float*>(c.workspace(scratch)) : nullptr;
    check_cuda(launch_reduce(op_, c.dtype(0), c.data(0), y->data, n_out, out, n_red, rv, parts, c.stream()),
               "reduce kernel");
  }

 private:
  Reduce op_;
  int32_t axes_input_since_;
  bool keepdims_ = true, noop_ = false, from_input_ = false;
  HostInput axes_in_{1};
  Dims attr_axes_;
};

class ArgReduceK : public Kernel {
 public:
  explicit ArgReduceK(bool is_max) : is_max_(is_max) {}
  void setup(Ctx& c) override {
    require_float(c, 0);
    require_rank_fits(c, 0);
    axis_ = c.attr_i("axis", 0);
    keepdims_ = c.attr_i("keepdims", 1) != 0;
    last_ = c.attr_i("select_last_index", 0) != 0;
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    const int64_t r = static_cast<int64_t>(d.size());
    if (r == 0 || r > kMaxRank)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: ArgMax/ArgMin of rank " + std::to_string(r)};
    const int64_t axis = norm_axis(axis_, r, "ArgMax/ArgMin");
    if (d[axis] == 0) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: ArgMax/ArgMin over an empty axis"};
    const Dims st = strides_of(d);
    Dims out_dims;
    Strided out;
    int64_t n_out = 1;
    for (int64_t i = 0; i < r; ++i) {
      if (i == axis) {
        if (keepdims_) out_dims.push_back(1);
        continue;
      }
      out.dims[out.ndim] = d[i];
      out.strides[out.ndim++][0] = st[i];
      out_dims.push_back(d[i]);
      n_out *= d[i];
    }
    keel_tensor_t* y = c.output(0, out_dims);
    check_cuda(launch_arg_reduce(is_max_, last_, c.dtype(0), c.data(0), static_cast<int64_t*>(y->data), n_out, out,
                                 d[axis], st[axis], c.stream()),
               "arg reduce kernel");
  }

 private:
  bool is_max_;
  int64_t axis_ = 0;
  bool keepdims_ = true, last_ = false;
};

// ---------------------------------------------------------------------------------------------------------------
// LayerNormalization (opset 17)
// ---------------------------------------------------------------------------------------------------------------

class LayerNormK : public Kernel {
 public:
  void setup(Ctx& c) override {
    require_float(c, 0);
    if (c.dtype(1) != c.dtype(0) || (c.has_input(2) && c.dtype(2) != c.dtype(0)))
      throw Reject{"Scale/B dtype differs from X"};
    axis_ = c.attr_i("axis", -1);
    eps_ = c.attr_f("epsilon", 1e-5f);
    for (int i = 1; i < c.output_count() && i < 3; ++i) {
      const int32_t t = c.output_dtype(i);
      if (t != KEEL_DTYPE_UNDEFINED && !is_float(t)) throw Reject{"Mean/InvStdDev dtype " + std::to_string(t)};
    }
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    const int64_t r = static_cast<int64_t>(d.size());
    if (r == 0) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: LayerNormalization of a scalar"};
    const int64_t axis = norm_axis(axis_, r, "LayerNormalization");
    int64_t rows = 1, cols = 1;
    for (int64_t i = 0; i < r; ++i) (i < axis ? rows : cols) *= d[i];
    // Scale and B: the normalised shape (or anything with as many elements laid out the same way, e.g. [cols]).
    auto check_param = [&](int i, const char* name) {
      const Dims p = c.dims(i);
      Dims want(d.begin() + axis, d.end());
      Dims pp = p;
      while (pp.size() > 1 && pp.front() == 1) pp.erase(pp.begin());
      while (want.size() > 1 && want.front() == 1) want.erase(want.begin());
      if (numel(p) != cols || (pp != want && !(pp.size() == 1 && pp[0] == cols)))
        throw Failure{KEEL_STATUS_UNIMPLEMENTED, std::string("cuda: LayerNormalization ") + name + " " + dims_str(p) +
                                                     " is not the normalised shape " +
                                                     dims_str(Dims(d.begin() + axis, d.end()))};
    };
    check_param(1, "Scale");
    if (c.has_input(2)) check_param(2, "B");
    keel_tensor_t* y = c.output(0, d);
    Dims sd(d.begin(), d.begin() + axis);
    sd.resize(static_cast<size_t>(r), 1);
    void* stats[2] = {nullptr, nullptr};
    int32_t stat_dt = KEEL_DTYPE_F32;
    for (int i = 1; i < c.output_count() && i < 3; ++i) {
      if (c.output_dtype(i) == KEEL_DTYPE_UNDEFINED) continue;  // an omitted optional output
      stat_dt = c.output_dtype(i);
      stats[i - 1] = c.output(i, sd)->data;
    }
    if (stats[0] && stats[1] && c.output_dtype(1) != c.output_dtype(2))
      throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: LayerNormalization Mean and InvStdDev of different dtypes"};
    check_cuda(launch_layer_norm(c.dtype(0), c.data(0), c.data(1), c.has_input(2) ? c.data(2) : nullptr, y->data, rows,
                                 cols, eps_, stat_dt, stats[0], stats[1], c.stream()),
               "layer norm kernel");
  }

 private:
  int64_t axis_ = -1;
  float eps_ = 1e-5f;
};

// ---------------------------------------------------------------------------------------------------------------
// Gather
// ---------------------------------------------------------------------------------------------------------------

class GatherK : public Kernel {
 public:
  ~GatherK() override {
    if (bad_) cudaFree(bad_);
    (void)cudaGetLastError();
  }
  void setup(Ctx& c) override {
    if (dtype_size(c.dtype(0)) == 0) throw Reject{"unsupported data dtype"};
    if (!is_int_dtype(c.dtype(1))) throw Reject{"indices are not int32/int64"};
    reject_shape_arithmetic(c, 0);
    axis_ = c.attr_i("axis", 0);
    idx_.capture(c);
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0), id = c.dims(1);
    const int64_t r = static_cast<int64_t>(d.size());
    if (r == 0) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Gather from a scalar"};
    const int64_t axis = norm_axis(axis_, r, "Gather");
    const int64_t len = d[axis];
    Dims out(d.begin(), d.begin() + axis);
    out.insert(out.end(), id.begin(), id.end());
    out.insert(out.end(), d.begin() + axis + 1, d.end());
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= d[i];
    for (int64_t i = axis + 1; i < r; ++i) inner *= d[i];
    const int64_t n_idx = numel(id);
    if (idx_.constant()) {  // checked on the host: no round trip
      for (int64_t v : idx_.ints(c))
        if (v < -len || v >= len)
          throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Gather index " + std::to_string(v) +
                                                          " out of range for axis " + std::to_string(axis) +
                                                          " of size " + std::to_string(len)};
    }
    keel_tensor_t* y = c.output(0, out);
    if (numel(out) == 0) return;
    int32_t* bad = nullptr;
    if (!idx_.constant()) {
      if (!bad_) check_cuda(cudaMalloc(reinterpret_cast<void**>(&bad_), sizeof(int32_t)), "Gather flag");
      bad = bad_;
      check_cuda(cudaMemsetAsync(bad, 0, sizeof(int32_t), c.stream()), "Gather flag reset");
    }
    check_cuda(launch_gather(dtype_size(c.dtype(0)), c.data(0), c.dtype(1), c.data(1), y->data, outer, len, inner,
                             n_idx, bad, c.stream()),
               "gather kernel");
    if (bad) {  // indices computed at run time: read the flag (synchronises the stream)
      int32_t h = 0;
      check_cuda(cudaMemcpyAsync(&h, bad, sizeof h, cudaMemcpyDeviceToHost, c.stream()), "Gather flag read");
      check_cuda(cudaStreamSynchronize(c.stream()), "Gather flag read");
      if (h)
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Gather: an index is out of range for axis " +
                                                        std::to_string(axis) + " of size " + std::to_string(len)};
    }
  }

 private:
  int64_t axis_ = 0;
  HostInput idx_{1};
  int32_t* bad_ = nullptr;  // device flag, allocated on first use
};

// ---------------------------------------------------------------------------------------------------------------
// Layout: Slice, Expand, Pad, Split, Reshape/Flatten/Squeeze/Unsqueeze/Identity
// ---------------------------------------------------------------------------------------------------------------

class SliceK : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (dtype_size(c.dtype(0)) == 0) throw Reject{"unsupported dtype"};
    require_rank_fits(c, 0);
    reject_shape_arithmetic(c, 0);
    legacy_ = c.opset() < 10;
    if (legacy_) {
      starts_a_ = c.attr_ints("starts", {});
      ends_a_ = c.attr_ints("ends", {});
      axes_a_ = c.attr_ints("axes", {});
    } else {
      for (auto* h : {&starts_, &ends_, &axes_, &steps_}) h->capture(c);
    }
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    const int64_t r = static_cast<int64_t>(d.size());
    if (r > kMaxRank) throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: Slice of rank > 8"};
    Dims starts = legacy_ ? starts_a_ : starts_.ints(c);
    Dims ends = legacy_ ? ends_a_ : ends_.ints(c);
    Dims axes = legacy_ ? axes_a_ : (axes_.present(c) ? axes_.ints(c) : Dims{});
    Dims steps = !legacy_ && steps_.present(c) ? steps_.ints(c) : Dims{};
    if (axes.empty())
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    if (steps.empty()) steps.assign(starts.size(), 1);
    if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Slice starts/ends/axes/steps of different lengths"};
    Dims b(static_cast<size_t>(r), 0), step(static_cast<size_t>(r), 1), out = d;
    std::vector<bool> seen(static_cast<size_t>(r), false);
    for (size_t k = 0; k < starts.size(); ++k) {
      const int64_t a = norm_axis(axes[k], r, "Slice");
      if (seen[a]) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Slice axis repeated"};
      seen[a] = true;
      const int64_t dim = d[a], s = steps[k];
      if (s == 0) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Slice step 0"};
      int64_t st = starts[k], en = ends[k];
      if (st < 0) st += dim;
      if (en < 0) en += dim;
      if (s > 0) {
        st = std::clamp<int64_t>(st, 0, dim);
        en = std::clamp<int64_t>(en, 0, dim);
        out[a] = en > st ? 1 + (en - st - 1) / s : 0;  // no overflow for huge steps
      } else {
        st = std::clamp<int64_t>(st, 0, dim - 1);
        en = std::clamp<int64_t>(en, -1, dim - 1);
        out[a] = st > en ? 1 + (st - en - 1) / (s == INT64_MIN ? INT64_MAX : -s) : 0;
      }
      b[a] = st;
      step[a] = s;
    }
    keel_tensor_t* y = c.output(0, out);
    const int64_t n = numel(out);
    if (n == 0) return;
    const Dims ist = strides_of(d);
    Strided sv;
    sv.ndim = static_cast<int32_t>(r);
    int64_t base = 0;
    for (int64_t i = 0; i < r; ++i) {
      sv.dims[i] = out[i];
      sv.strides[i][0] = ist[i] * step[i];
      base += b[i] * ist[i];
    }
    const int32_t es = dtype_size(c.dtype(0));
    check_cuda(launch_strided_copy(es, static_cast<const char*>(c.data(0)) + base * es, y->data, n, sv, c.stream()),
               "slice kernel");
  }

 private:
  bool legacy_ = false;
  HostInput starts_{1}, ends_{2}, axes_{3}, steps_{4};
  Dims starts_a_, ends_a_, axes_a_;
};

class ExpandK : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (dtype_size(c.dtype(0)) == 0) throw Reject{"unsupported dtype"};
    require_rank_fits(c, 0);
    reject_shape_arithmetic(c, 0);
    shape_.capture(c);
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    const Dims out = broadcast_dims({d, shape_.ints(c)});
    keel_tensor_t* y = c.output(0, out);
    check_cuda(
        launch_strided_copy(dtype_size(c.dtype(0)), c.data(0), y->data, numel(out), make_strided(out, {d}), c.stream()),
        "expand kernel");
  }

 private:
  HostInput shape_{1};
};

class PadK : public Kernel {
 public:
  void setup(Ctx& c) override {
    const int32_t t = c.dtype(0);
    if (dtype_size(t) == 0 || t == KEEL_DTYPE_U16 || t == KEEL_DTYPE_U32 || t == KEEL_DTYPE_U64)
      throw Reject{"unsupported dtype"};
    require_rank_fits(c, 0);
    const std::string mode = c.attr_s("mode", "constant");
    if (mode == "constant") mode_ = 0;
    else if (mode == "reflect") mode_ = 1;
    else if (mode == "edge") mode_ = 2;
    else throw Reject{"mode '" + mode + "'"};
    legacy_ = c.opset() < 11;
    if (legacy_) {
      pads_a_ = c.attr_ints("pads", {});
      value_a_ = c.attr_f("value", 0.f);
    } else {
      for (auto* h : {&pads_, &value_, &axes_}) h->capture(c);
    }
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    const int64_t r = static_cast<int64_t>(d.size());
    if (r > kMaxRank) throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: Pad of rank > 8"};
    const Dims pads = legacy_ ? pads_a_ : pads_.ints(c);
    double value = value_a_;
    if (!legacy_ && value_.present(c)) {
      const std::vector<double> v = value_.doubles(c);
      if (!v.empty()) value = v[0];
    }
    Dims axes;
    if (!legacy_ && axes_.present(c)) axes = axes_.ints(c);
    if (axes.empty())
      for (int64_t i = 0; i < r; ++i) axes.push_back(i);
    if (pads.size() != 2 * axes.size())
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT,
                    "cuda: Pad: " + std::to_string(pads.size()) + " pads for " + std::to_string(axes.size()) + " axes"};
    PadDesc p;
    p.ndim = static_cast<int32_t>(r);
    Dims out = d;
    for (size_t k = 0; k < axes.size(); ++k) {
      const int64_t a = norm_axis(axes[k], r, "Pad");
      p.begin[a] = pads[k];
      out[a] = d[a] + pads[k] + pads[k + axes.size()];
      if (out[a] < 0) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Pad: negative output dimension"};
      if (mode_ != 0 && d[a] == 0 && out[a] > 0)
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Pad: reflect/edge padding of an empty dimension"};
    }
    for (int64_t i = 0; i < r; ++i) p.in_dims[i] = d[i], p.out_dims[i] = out[i];
    keel_tensor_t* y = c.output(0, out);
    check_cuda(
        launch_pad(c.dtype(0), dtype_size(c.dtype(0)), c.data(0), y->data, numel(out), p, mode_, value, c.stream()),
        "pad kernel");
  }

 private:
  int32_t mode_ = 0;
  bool legacy_ = false;
  HostInput pads_{1}, value_{2}, axes_{3};
  Dims pads_a_;
  float value_a_ = 0.f;
};

class SplitK : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (dtype_size(c.dtype(0)) == 0) throw Reject{"unsupported dtype"};
    reject_shape_arithmetic(c, 0);
    axis_ = c.attr_i("axis", 0);
    if (c.opset() >= 13) split_.capture(c);
    else split_a_ = c.attr_ints("split", {});
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    const int64_t r = static_cast<int64_t>(d.size());
    const int64_t axis = norm_axis(axis_, r, "Split");
    const int n = c.output_count();
    Dims split = c.opset() >= 13 ? (split_.present(c) ? split_.ints(c) : Dims{}) : split_a_;
    if (split.empty()) {
      const int64_t chunk = (d[axis] + n - 1) / n;
      if (d[axis] % n != 0 && c.opset() < 18)
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Split: dimension " + std::to_string(d[axis]) +
                                                        " does not split evenly into " + std::to_string(n)};
      for (int i = 0; i < n; ++i) split.push_back(std::max<int64_t>(0, std::min(chunk, d[axis] - chunk * i)));
    }
    int64_t total = 0;
    for (int64_t s : split) total += s;
    if (static_cast<int>(split.size()) != n || total != d[axis])
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Split: sizes " + dims_str(split) + " do not split " +
                                                      std::to_string(d[axis]) + " into " + std::to_string(n)};
    const int64_t es = dtype_size(c.dtype(0));
    int64_t outer = 1, inner = es;
    for (int64_t i = 0; i < axis; ++i) outer *= d[i];
    for (int64_t i = axis + 1; i < r; ++i) inner *= d[i];
    const size_t spitch = static_cast<size_t>(d[axis] * inner);
    int64_t offset = 0;
    for (int i = 0; i < n; ++i) {
      Dims od = d;
      od[axis] = split[i];
      keel_tensor_t* y = c.output(i, od);
      const size_t width = static_cast<size_t>(split[i] * inner);
      if (width && outer)
        check_cuda(cudaMemcpy2DAsync(y->data, width, static_cast<const char*>(c.data(0)) + offset, spitch, width,
                                     static_cast<size_t>(outer), cudaMemcpyDeviceToDevice, c.stream()),
                   "Split copy");
      offset += static_cast<int64_t>(width);
    }
  }

 private:
  int64_t axis_ = 0;
  HostInput split_{1};
  Dims split_a_;
};

// Reshape, Flatten, Squeeze, Unsqueeze, Identity: the data is unchanged; the output (the core allocates every
// output: no aliasing across the ABI) is a device-to-device copy with the new shape.
class ReshapeLikeK : public Kernel {
 public:
  enum Kind { kReshape, kFlatten, kSqueeze, kUnsqueeze, kIdentity };
  explicit ReshapeLikeK(Kind k) : kind_(k) {}
  void setup(Ctx& c) override {
    if (dtype_size(c.dtype(0)) == 0) throw Reject{"unsupported dtype"};
    reject_shape_arithmetic(c, 0);
    axes_from_input_ = c.opset() >= 13;
    if (kind_ == kReshape) allowzero_ = c.attr_i("allowzero", 0) != 0;
    if (kind_ == kFlatten) axis_ = c.attr_i("axis", 1);
    if ((kind_ == kSqueeze || kind_ == kUnsqueeze) && !axes_from_input_) axes_a_ = c.attr_ints("axes", {});
    if (kind_ == kReshape || axes_from_input_) second_.capture(c);
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    const int64_t r = static_cast<int64_t>(d.size());
    const int64_t n = numel(d);
    Dims out;
    switch (kind_) {
      case kIdentity: out = d; break;
      case kReshape: {
        const Dims shape = second_.ints(c);
        int64_t known = 1, infer = -1;
        for (size_t i = 0; i < shape.size(); ++i) {
          int64_t v = shape[i];
          if (v == 0 && !allowzero_) {
            if (static_cast<int64_t>(i) >= r)
              throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Reshape: 0 beyond the input's rank"};
            v = d[i];
          }
          if (v == -1) {
            if (infer >= 0) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Reshape: more than one -1"};
            infer = static_cast<int64_t>(i);
          } else if (v < 0) {
            throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Reshape: negative dimension " + std::to_string(v)};
          } else if (__builtin_mul_overflow(known, v, &known)) {
            throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Reshape: " + dims_str(shape) + " has too many elements"};
          }
          out.push_back(v);
        }
        if (infer >= 0) {
          if (known == 0 || n % known != 0)
            throw Failure{KEEL_STATUS_INVALID_ARGUMENT,
                          "cuda: Reshape: cannot infer -1 of " + dims_str(shape) + " for " + dims_str(d)};
          out[infer] = n / known;
        }
        break;
      }
      case kFlatten: {
        const int64_t a = axis_ < 0 ? axis_ + r : axis_;
        if (a < 0 || a > r) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Flatten axis out of range"};
        int64_t outer = 1;
        for (int64_t i = 0; i < a; ++i) outer *= d[i];
        out = {outer, outer ? n / outer : numel(Dims(d.begin() + a, d.end()))};
        break;
      }
      case kSqueeze: {
        Dims axes = axes_from_input_ ? (second_.present(c) ? second_.ints(c) : Dims{}) : axes_a_;
        std::vector<bool> drop(static_cast<size_t>(r), false);
        if (axes.empty())
          for (int64_t i = 0; i < r; ++i) drop[i] = d[i] == 1;
        for (int64_t a : axes) {
          const int64_t x = norm_axis(a, r, "Squeeze");
          if (d[x] != 1) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Squeeze of a dimension that is not 1"};
          drop[x] = true;
        }
        for (int64_t i = 0; i < r; ++i)
          if (!drop[i]) out.push_back(d[i]);
        break;
      }
      case kUnsqueeze: {
        const Dims axes = axes_from_input_ ? second_.ints(c) : axes_a_;
        const int64_t orank = r + static_cast<int64_t>(axes.size());
        std::vector<bool> ins(static_cast<size_t>(orank), false);
        for (int64_t a : axes) {
          const int64_t x = norm_axis(a, orank, "Unsqueeze");
          if (ins[x]) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Unsqueeze axis repeated"};
          ins[x] = true;
        }
        size_t k = 0;
        for (int64_t i = 0; i < orank; ++i) out.push_back(ins[i] ? 1 : d[k++]);
        break;
      }
    }
    if (numel(out) != n)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: cannot reshape " + dims_str(d) + " to " + dims_str(out)};
    keel_tensor_t* y = c.output(0, out);
    copy_device(c, y->data, c.data(0), n * dtype_size(c.dtype(0)), "reshape copy");
  }

 private:
  Kind kind_;
  bool allowzero_ = false, axes_from_input_ = false;
  int64_t axis_ = 1;
  HostInput second_{1};
  Dims axes_a_;
};

// ---------------------------------------------------------------------------------------------------------------
// Clip, Gelu, Resize
// ---------------------------------------------------------------------------------------------------------------

class ClipK : public Kernel {
 public:
  void setup(Ctx& c) override {
    require_float(c, 0);
    legacy_ = c.opset() < 11;
    if (legacy_) {
      lo_ = c.attr_f("min", -3.402823466e38f);
      hi_ = c.attr_f("max", 3.402823466e38f);
    } else {
      min_.capture(c);
      max_.capture(c);
    }
  }
  void run(Ctx& c) override {
    float lo = lo_, hi = hi_;
    if (!legacy_) {
      lo = -INFINITY, hi = INFINITY;
      if (min_.present(c)) {
        const auto v = min_.doubles(c);
        if (!v.empty()) lo = static_cast<float>(v[0]);
      }
      if (max_.present(c)) {
        const auto v = max_.doubles(c);
        if (!v.empty()) hi = static_cast<float>(v[0]);
      }
    }
    const Dims d = c.dims(0);
    keel_tensor_t* y = c.output(0, d);
    check_cuda(launch_unary(Unary::kClip, c.dtype(0), c.data(0), y->data, numel(d), lo, hi, 0.f, c.stream()),
               "clip kernel");
  }

 private:
  bool legacy_ = false;
  float lo_ = 0, hi_ = 0;
  HostInput min_{1}, max_{2};
};

class GeluK : public Kernel {
 public:
  void setup(Ctx& c) override {
    require_float(c, 0);
    const std::string a = c.attr_s("approximate", "none");
    if (a == "none") op_ = Unary::kGeluErf;
    else if (a == "tanh") op_ = Unary::kGeluTanh;
    else throw Reject{"approximate '" + a + "'"};
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    keel_tensor_t* y = c.output(0, d);
    check_cuda(launch_unary(op_, c.dtype(0), c.data(0), y->data, numel(d), 0.f, 0.f, 0.f, c.stream()), "gelu kernel");
  }

 private:
  Unary op_ = Unary::kGeluErf;
};

class ResizeK : public Kernel {
 public:
  void setup(Ctx& c) override {
    require_float(c, 0);
    legacy_ = c.opset() < 11;
    const std::string mode = c.attr_s("mode", "nearest");
    if (mode == "linear" || mode == "bilinear") linear_ = true;
    else if (mode != "nearest") throw Reject{"mode '" + mode + "'"};
    if (legacy_) {
      coord_ = 3;
      nearest_ = 4;
      scales_.capture(c);
      return;
    }
    if (c.attr_i("antialias", 0) != 0) throw Reject{"antialias"};
    if (c.has_attr_ints("axes")) throw Reject{"the axes attribute"};
    if (c.attr_s("keep_aspect_ratio_policy", "stretch") != "stretch") throw Reject{"keep_aspect_ratio_policy"};
    static const char* kCoords[] = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"};
    static const char* kNearest[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
    const std::string coord = c.attr_s("coordinate_transformation_mode", "half_pixel");
    const std::string nearest = c.attr_s("nearest_mode", "round_prefer_floor");
    coord_ = -1;
    for (int i = 0; i < 4; ++i) {
      if (coord == kCoords[i]) coord_ = i;
      if (nearest == kNearest[i]) nearest_ = i;
    }
    if (coord_ < 0) throw Reject{"coordinate_transformation_mode '" + coord + "'"};
    if (!linear_ && nearest != kNearest[nearest_]) throw Reject{"nearest_mode '" + nearest + "'"};
    scales_ = HostInput(2);
    scales_.capture(c);
    sizes_.capture(c);
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    const int64_t r = static_cast<int64_t>(d.size());
    if (r == 0) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Resize of a scalar"};
    std::vector<double> scales(static_cast<size_t>(r), 1.0);
    Dims out(static_cast<size_t>(r));
    const bool have_scales = scales_.present(c) && numel(c.dims(legacy_ ? 1 : 2)) > 0;
    const bool have_sizes = !legacy_ && sizes_.present(c) && numel(c.dims(3)) > 0;
    if (have_scales == have_sizes)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Resize: exactly one of scales and sizes must be given"};
    if (have_scales) {
      const std::vector<double> sc = scales_.doubles(c);
      if (static_cast<int64_t>(sc.size()) != r)
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT,
                      "cuda: Resize: " + std::to_string(sc.size()) + " scales for rank " + std::to_string(r)};
      for (int64_t i = 0; i < r; ++i) {
        const double s =
            static_cast<double>(static_cast<float>(sc[i]));  // scales are float: as the reference reads them
        const double len = std::floor(static_cast<double>(d[i]) * s);
        if (!(s > 0) || !(len < 9.0e15))
          throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Resize: scales must be positive and finite"};
        scales[i] = s;
        out[i] = static_cast<int64_t>(std::max(len, 0.0));
      }
    } else {
      const Dims sz = sizes_.ints(c);
      if (static_cast<int64_t>(sz.size()) != r)
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT,
                      "cuda: Resize: " + std::to_string(sz.size()) + " sizes for rank " + std::to_string(r)};
      for (int64_t i = 0; i < r; ++i) {
        if (sz[i] < 0) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Resize: negative size"};
        out[i] = sz[i];
        scales[i] = d[i] == 0 ? 1.0 : static_cast<double>(static_cast<float>(sz[i]) / static_cast<float>(d[i]));
      }
    }
    ResizeDesc rd;
    rd.coord = coord_;
    rd.nearest = nearest_;
    rd.linear = linear_;
    const int64_t sp = r >= 2 ? r - 2 : 0;  // the resized (spatial) dims are the last one or two
    for (int64_t i = 0; i < sp; ++i) {
      if (out[i] != d[i] || scales[i] != 1.0)
        throw Failure{KEEL_STATUS_UNIMPLEMENTED, "cuda: Resize of a dimension other than the last two"};
      rd.outer *= d[i];
    }
    if (r >= 2) rd.in_h = d[r - 2], rd.out_h = out[r - 2], rd.scale_h = scales[r - 2];
    rd.in_w = d[r - 1], rd.out_w = out[r - 1], rd.scale_w = scales[r - 1];
    keel_tensor_t* y = c.output(0, out);
    if (numel(out) == 0) return;
    if (numel(d) == 0)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "cuda: Resize: cannot resize an empty dimension to a non-empty one"};
    check_cuda(launch_resize(c.dtype(0), c.data(0), y->data, rd, c.stream()), "resize kernel");
  }

 private:
  bool legacy_ = false, linear_ = false;
  int32_t coord_ = 0, nearest_ = 0;
  HostInput scales_{1}, sizes_{3};
};

template <Unary op>
Kernel* make_unary() {
  return new UnaryK(op, 0.f, 0.f, 0.f);
}
template <Binary op>
Kernel* make_binary() {
  return new BinaryK(op);
}
template <Reduce op, int32_t axes_input_since>
Kernel* make_reduce() {
  return new ReduceK(op, axes_input_since);
}
template <ReshapeLikeK::Kind k>
Kernel* make_reshape() {
  return new ReshapeLikeK(k);
}

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
      {"Where", 9, 0, "cuda_where", []() -> Kernel* { return new WhereK; }},
      {"Softmax", 1, 0, "cuda_softmax", []() -> Kernel* { return new SoftmaxK(false); }},
      {"LogSoftmax", 1, 0, "cuda_log_softmax", []() -> Kernel* { return new SoftmaxK(true); }},
      {"Transpose", 1, 0, "cuda_transpose", []() -> Kernel* { return new TransposeK; }},
      {"Concat", 4, 0, "cuda_concat", []() -> Kernel* { return new ConcatK; }},
      {"Cast", 6, 0, "cuda_cast", []() -> Kernel* { return new CastK; }},
      {"Clip", 6, 0, "cuda_clip", []() -> Kernel* { return new ClipK; }},
      {"Gelu", 20, 0, "cuda_gelu", []() -> Kernel* { return new GeluK; }},
      {"ReduceSum", 1, 0, "cuda_reduce_sum", make_reduce<Reduce::kSum, 13>},
      {"ReduceMean", 1, 0, "cuda_reduce_mean", make_reduce<Reduce::kMean, 18>},
      {"ReduceMax", 1, 0, "cuda_reduce_max", make_reduce<Reduce::kMax, 18>},
      {"ReduceMin", 1, 0, "cuda_reduce_min", make_reduce<Reduce::kMin, 18>},
      {"ReduceProd", 1, 0, "cuda_reduce_prod", make_reduce<Reduce::kProd, 18>},
      {"ReduceSumSquare", 1, 0, "cuda_reduce_sum_square", make_reduce<Reduce::kSumSquare, 18>},
      {"ReduceL1", 1, 0, "cuda_reduce_l1", make_reduce<Reduce::kL1, 18>},
      {"ReduceL2", 1, 0, "cuda_reduce_l2", make_reduce<Reduce::kL2, 18>},
      {"ReduceLogSum", 1, 0, "cuda_reduce_log_sum", make_reduce<Reduce::kLogSum, 18>},
      {"ReduceLogSumExp", 1, 0, "cuda_reduce_log_sum_exp", make_reduce<Reduce::kLogSumExp, 18>},
      {"ArgMax", 1, 0, "cuda_arg_max", []() -> Kernel* { return new ArgReduceK(true); }},
      {"ArgMin", 1, 0, "cuda_arg_min", []() -> Kernel* { return new ArgReduceK(false); }},
      {"LayerNormalization", 17, 0, "cuda_layer_norm", []() -> Kernel* { return new LayerNormK; }},
      // The fusion passes' ops (keel domain, opset 1) for graphs below ONNX opset 17 / 20: same semantics.
      {"LayerNormalization", 1, 0, "cuda_keel_layer_norm", []() -> Kernel* { return new LayerNormK; }, "keel"},
      {"Gelu", 1, 0, "cuda_keel_gelu", []() -> Kernel* { return new GeluK; }, "keel"},
      {"Gather", 1, 0, "cuda_gather", []() -> Kernel* { return new GatherK; }},
      {"Slice", 1, 0, "cuda_slice", []() -> Kernel* { return new SliceK; }},
      {"Expand", 8, 0, "cuda_expand", []() -> Kernel* { return new ExpandK; }},
      {"Pad", 2, 0, "cuda_pad", []() -> Kernel* { return new PadK; }},
      {"Split", 2, 0, "cuda_split", []() -> Kernel* { return new SplitK; }},
      {"Resize", 10, 0, "cuda_resize", []() -> Kernel* { return new ResizeK; }},
      {"Reshape", 5, 0, "cuda_reshape", make_reshape<ReshapeLikeK::kReshape>},
      {"Flatten", 1, 0, "cuda_flatten", make_reshape<ReshapeLikeK::kFlatten>},
      {"Squeeze", 1, 0, "cuda_squeeze", make_reshape<ReshapeLikeK::kSqueeze>},
      {"Unsqueeze", 1, 0, "cuda_unsqueeze", make_reshape<ReshapeLikeK::kUnsqueeze>},
      {"Identity", 1, 0, "cuda_identity", make_reshape<ReshapeLikeK::kIdentity>},
  };
}

}  // namespace keel::cuda
