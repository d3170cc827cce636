// keel/ops/reference/kernel_util.h — the small C++ layer the reference kernels are written in.
//
// The reference kernels see only the C kernel ABI (keel/plugin.h). This header wraps it for C++ on the kernel's
// side: Kctx (the SDK's kernel context, keel/kernel.hpp, with the reference kernels' errors and TViews), TView (a
// tensor view with a std::vector shape), dtype dispatch over compile-time type lists, f16/bf16 element types,
// broadcasting helpers, and KernelError. Kernels throw KernelError (or anything else) freely; the compute thunk in
// reference_kernels.cc catches everything at the C edge and turns it into a keel_status_t, so no exception crosses
// the boundary. Bodies run under Kctx::parallel catch their exceptions per chunk and rethrow on the calling thread.
//
// Header-only; no global state except g_kernel_api, set once by register_reference_kernels before any kernel runs.
#pragma once

#include <keel/plugin.h>
#include <keel/kernel.hpp>
#include <keel/shape.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/base/dtype.h"

namespace keel::ops::ref {

// The core's kernel API (host->kernel), stored by register_reference_kernels.
// Atomic: every environment created (on any thread) stores it again while other environments' kernels read it; it
// is the core's one kernel API table, the same value each time.
inline std::atomic<const keel_kernel_api_t*> g_kernel_api{nullptr};

using Shape = std::vector<int64_t>;

// ---------------------------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------------------------

class KernelError : public std::exception {
 public:
  KernelError(int32_t code, std::string message) : code_(code), message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  int32_t code() const { return code_; }

 private:
  int32_t code_;
  std::string message_;
};

template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}

inline std::string shape_str(const Shape& s) { return sdk::dims_str(s); }

// a * b and element counts saturated at INT64_MAX instead of overflowing (keel/shape.hpp): shape products of a
// hostile model stay defined (and too large for any check or allocation that follows).
using sdk::mul_sat;
inline int64_t numel_of(const Shape& s) { return sdk::numel(s); }

inline Shape strides_of(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

// ---------------------------------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------------------------------

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

template <class T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr int32_t value = KEEL_DTYPE_F32;
};
template <>
struct DTypeOf<double> {
  static constexpr int32_t value = KEEL_DTYPE_F64;
};
template <>
struct DTypeOf<Half> {
  static constexpr int32_t value = KEEL_DTYPE_F16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr int32_t value = KEEL_DTYPE_BF16;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr int32_t value = KEEL_DTYPE_I8;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr int32_t value = KEEL_DTYPE_U8;
};
template <>
struct DTypeOf<int16_t> {
  static constexpr int32_t value = KEEL_DTYPE_I16;
};
template <>
struct DTypeOf<uint16_t> {
  static constexpr int32_t value = KEEL_DTYPE_U16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr int32_t value = KEEL_DTYPE_I32;
};
template <>
struct DTypeOf<uint32_t> {
  static constexpr int32_t value = KEEL_DTYPE_U32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr int32_t value = KEEL_DTYPE_I64;
};
template <>
struct DTypeOf<uint64_t> {
  static constexpr int32_t value = KEEL_DTYPE_U64;
};
template <>
struct DTypeOf<bool> {
  static constexpr int32_t value = KEEL_DTYPE_BOOL;
};

template <class T>
constexpr bool is_half_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
template <class T>
constexpr bool is_float_v = is_half_v<T> || std::is_floating_point_v<T>;

// The type arithmetic on T is done in: float for f16/bf16, T otherwise.
template <class T>
using calc_t = std::conditional_t<is_half_v<T>, float, T>;

template <class T>
inline calc_t<T> ld(T v) {
  if constexpr (std::is_same_v<T, Half>) return f16_to_f32(v.bits);
  else if constexpr (std::is_same_v<T, BFloat16>) return bf16_to_f32(v.bits);
  else return v;
}

// Converts a value of any arithmetic type to T (f16/bf16 round to nearest even; bool is v != 0).
template <class T, class C>
inline T st(C v) {
  if constexpr (std::is_same_v<T, Half>) return Half{f32_to_f16(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, BFloat16>) return BFloat16{f32_to_bf16(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, bool>) return v != C(0);
  else if constexpr (std::is_integral_v<T> && std::is_floating_point_v<C>) {
    // Saturating, NaN -> 0: an out-of-range float-to-integer cast is undefined behaviour in C++.
    if (!(v == v)) return T(0);
    if (v <= static_cast<C>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
    if (v >= static_cast<C>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    return static_cast<T>(v);
  } else return static_cast<T>(v);
}

inline const char* dtype_str(int32_t dt) { return dtype_name(static_cast<DType>(dt)); }
inline size_t dtype_bytes(int32_t dt) { return dtype_size(static_cast<DType>(dt)); }

template <class T>
struct Tag {
  using type = T;
};
template <class... Ts>
struct TL {};
template <class... A, class... B>
TL<A..., B...> operator+(TL<A...>, TL<B...>) {
  return {};
}

using FloatTs = TL<float, double, Half, BFloat16>;
using SIntTs = TL<int8_t, int16_t, int32_t, int64_t>;
using UIntTs = TL<uint8_t, uint16_t, uint32_t, uint64_t>;
using IntTs = decltype(SIntTs{} + UIntTs{});
using NumTs = decltype(FloatTs{} + IntTs{});
using SignedNumTs = decltype(FloatTs{} + SIntTs{});
using AllTs = decltype(NumTs{} + TL<bool>{});

// ---------------------------------------------------------------------------------------------------------------
// Tensor view
// ---------------------------------------------------------------------------------------------------------------

struct TView {
  int32_t dtype = KEEL_DTYPE_UNDEFINED;
  Shape shape;
  void* data = nullptr;
  int64_t numel = 0;

  int ndim() const { return static_cast<int>(shape.size()); }
  template <class T>
  T* p() const {
    return static_cast<T*>(data);
  }
  uint8_t* bytes() const { return static_cast<uint8_t*>(data); }
  size_t elem_size() const { return dtype_bytes(dtype); }
};

inline TView view_of(const keel_tensor_t* t) {
  TView v;
  v.dtype = t->dtype;
  v.shape.assign(t->dims, t->dims + t->ndim);
  v.data = t->data;
  v.numel = numel_of(v.shape);
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// Kernel context
// ---------------------------------------------------------------------------------------------------------------

// The SDK's kernel context (keel/kernel.hpp) with the reference kernels' error policy: every error names the op and
// the node, and what the kernels read and write are TViews.
class Kctx : public sdk::KernelContext {
 public:
  Kctx(keel_kernel_context_t* ctx, const char* op)
      : sdk::KernelContext(ctx, g_kernel_api.load(std::memory_order_relaxed)), op_(op) {}

  const char* op() const { return op_; }

  // --- errors: the message names the op (and the node when it has a name) ---
  std::string where() const {
    const char* n = node_name();
    if (*n) return cat(op_, " (node '", n, "')");
    return op_;
  }
  [[noreturn]] void fail(int32_t code, const std::string& msg) const {
    throw KernelError(code, cat(where(), ": ", msg));
  }
  [[noreturn]] void invalid(const std::string& msg) const { fail(KEEL_STATUS_INVALID_ARGUMENT, msg); }
  [[noreturn]] void unimpl(const std::string& msg) const { fail(KEEL_STATUS_UNIMPLEMENTED, msg); }
  void check(bool ok, const std::string& msg) const {
    if (!ok) invalid(msg);
  }
  [[noreturn]] void bad_dtype(int32_t dt, const char* what = "input") const {
    unimpl(cat("the reference kernel does not handle dtype ", dtype_str(dt), " for ", what));
  }

  // --- inputs (has_input: present; an input out of range is absent) ---
  int n_inputs() const { return input_count(); }
  TView in(int i) const {
    const keel_tensor_t* t = input(i);
    if (t == nullptr) invalid(cat("required input ", i, " is missing"));
    TView v = view_of(t);
    if (v.data == nullptr && v.numel != 0) invalid(cat("input ", i, " has no data"));
    return v;
  }
  std::optional<TView> opt_in(int i) const {
    if (!has_input(i)) return std::nullopt;
    return in(i);
  }

  // --- outputs ---
  int n_outputs() const { return output_count(); }
  // True when output i exists in the node (an omitted optional output has dtype UNDEFINED).
  bool has_output(int i) const { return i < n_outputs() && output_dtype(i) != KEEL_DTYPE_UNDEFINED; }
  int32_t out_dtype(int i) const { return output_dtype(i); }
  TView out(int i, const Shape& shape) const {
    for (int64_t d : shape)
      if (d < 0) invalid(cat("computed a negative output dimension for output ", i, ": ", shape_str(shape)));
    keel_tensor_t* t = nullptr;
    keel_status_t s = api()->output(raw(), i, static_cast<int32_t>(shape.size()), shape.data(), &t);
    if (s != nullptr) {
      int32_t code = s->code == KEEL_STATUS_OK ? KEEL_STATUS_INTERNAL : s->code;
      std::string m = s->message ? s->message : "";
      keel_status_release(s);
      fail(code, cat("allocating output ", i, " ", shape_str(shape), ": ", m));
    }
    if (t == nullptr) fail(KEEL_STATUS_INTERNAL, cat("output ", i, " allocation returned no tensor"));
    TView v = view_of(t);
    if (v.data == nullptr && v.numel != 0) fail(KEEL_STATUS_INTERNAL, cat("output ", i, " has no data"));
    return v;
  }

  // --- attributes (ONNX defaults when absent): attr_i, attr_f, attr_s, the *_opt forms, attr_tensor from the SDK;
  // the lists as optionals ---
  std::optional<std::vector<int64_t>> attr_ints(const char* n) const { return attr_ints_opt(n); }
  std::vector<int64_t> attr_ints_or(const char* n, const std::vector<int64_t>& def) const {
    return sdk::KernelContext::attr_ints(n, def);
  }
  std::optional<std::vector<float>> attr_floats(const char* n) const { return attr_floats_opt(n); }
  std::optional<std::vector<std::string>> attr_strings(const char* n) const { return attr_strings_opt(n); }

  // Runs f(begin, end) over [0, n) in chunks of at least min_chunk on the core's pool (sdk parallel_for: the first
  // exception of a chunk is rethrown here).
  template <class F>
  void parallel(int64_t n, int64_t min_chunk, F&& f) const {
    parallel_for(n, min_chunk, std::forward<F>(f));
  }

  // Normalises an axis in [-rank, rank) to [0, rank); a rank-0 tensor has no axis.
  int axis(int64_t a, int rank, const char* what = "axis") const {
    if (a < -rank || a >= rank) invalid(cat(what, " ", a, " is out of range for rank ", rank));
    return static_cast<int>(a < 0 ? a + rank : a);
  }

 private:
  const char* op_;
};

// ---------------------------------------------------------------------------------------------------------------
// Dtype dispatch
// ---------------------------------------------------------------------------------------------------------------

// Calls f(Tag<T>{}) for the T in the list whose dtype is dt; UNIMPLEMENTED for any other dtype.
template <class... Ts, class F>
void dispatch(TL<Ts...>, int32_t dt, const Kctx& k, F&& f, const char* what = "input") {
  bool hit = ((dt == DTypeOf<Ts>::value ? (f(Tag<Ts>{}), true) : false) || ...);
  if (!hit) k.bad_dtype(dt, what);
}

// Calls f(Tag<U>{}) with an unsigned integer U of the element size of dt (for data movement).
template <class F>
void dispatch_bytes(int32_t dt, const Kctx& k, F&& f) {
  switch (dtype_bytes(dt)) {
    case 1: f(Tag<uint8_t>{}); break;
    case 2: f(Tag<uint16_t>{}); break;
    case 4: f(Tag<uint32_t>{}); break;
    case 8: f(Tag<uint64_t>{}); break;
    default: k.bad_dtype(dt);
  }
}

// Element i of a numeric tensor as double / int64 (any dtype).
inline double get_f64(const TView& t, int64_t i, const Kctx& k) {
  if (i < 0 || i >= t.numel)
    k.invalid(cat("expected a tensor with at least ", i + 1, " element(s), got ", shape_str(t.shape)));
  double r = 0;
  dispatch(AllTs{}, t.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    r = static_cast<double>(ld(t.p<T>()[i]));
  });
  return r;
}
inline int64_t get_i64(const TView& t, int64_t i, const Kctx& k) {
  if (i < 0 || i >= t.numel)
    k.invalid(cat("expected a tensor with at least ", i + 1, " element(s), got ", shape_str(t.shape)));
  int64_t r = 0;
  dispatch(AllTs{}, t.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_float_v<T>) r = static_cast<int64_t>(ld(t.p<T>()[i]));
    else r = static_cast<int64_t>(t.p<T>()[i]);
  });
  return r;
}
// All elements of an integer tensor (shape, axes, indices inputs) as int64.
inline std::vector<int64_t> read_ints(const TView& t, const Kctx& k, const char* what) {
  std::vector<int64_t> r(static_cast<size_t>(t.numel));
  if (t.dtype == KEEL_DTYPE_I64) {
    if (t.numel) std::memcpy(r.data(), t.data, sizeof(int64_t) * r.size());
    return r;
  }
  if (t.dtype == KEEL_DTYPE_I32) {
    for (int64_t i = 0; i < t.numel; ++i) r[i] = t.p<int32_t>()[i];
    return r;
  }
  dispatch(
      IntTs{}, t.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < t.numel; ++i) r[i] = static_cast<int64_t>(t.p<T>()[i]);
      },
      what);
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Broadcasting
// ---------------------------------------------------------------------------------------------------------------

// The multidirectional (numpy) broadcast of shapes; INVALID_ARGUMENT when they are incompatible.
inline Shape broadcast_shapes(const std::vector<Shape>& shapes, const Kctx& k) {
  size_t rank = 0;
  for (auto& s : shapes) rank = std::max(rank, s.size());
  Shape out(rank, 1);
  for (size_t d = 0; d < rank; ++d) {
    int64_t r = 1;
    for (auto& s : shapes) {
      if (d + s.size() < rank) continue;
      int64_t v = s[d + s.size() - rank];
      if (v == 1) continue;
      if (r == 1) r = v;
      else if (v != r) {
        std::string all;
        for (auto& x : shapes) all += (all.empty() ? "" : " and ") + shape_str(x);
        k.invalid(cat("shapes ", all, " cannot be broadcast together (dimension ", d, ")"));
      }
    }
    out[d] = r;
  }
  return out;
}

// Strides of `in` aligned to `out` (right-aligned), 0 on broadcast dimensions. Assumes compatibility.
inline Shape broadcast_strides(const Shape& in, const Shape& out) {
  Shape st(out.size(), 0);
  Shape is = strides_of(in);
  size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) st[off + i] = in[i] == 1 ? 0 : is[i];
  return st;
}

// An iteration plan over an output shape with N inputs read through (broadcast) strides. Adjacent dimensions are
// merged where every operand allows, so the innermost loop is as long as possible.
template <int N>
struct BcastPlan {
  Shape shape;                 // coalesced output shape (at least rank 1)
  std::vector<Shape> strides;  // N stride vectors over `shape`
  int64_t inner = 1;           // shape.back()
  int64_t rows = 1;            // numel / inner

  BcastPlan(const Shape& out, const std::vector<Shape>& in_strides) {
    Shape s = out;
    std::vector<Shape> st = in_strides;
    if (s.empty()) {
      s = {1};
      for (auto& x : st) x = {0};
    }
    // Drop size-1 dims (they contribute nothing), then merge.
    Shape ns;
    std::vector<Shape> nst(N);
    for (size_t d = 0; d < s.size(); ++d) {
      if (s[d] == 1 && s.size() > 1) continue;
      ns.push_back(s[d]);
      for (int j = 0; j < N; ++j) nst[j].push_back(st[j][d]);
    }
    if (ns.empty()) {
      ns = {1};
      for (int j = 0; j < N; ++j) nst[j] = {0};
    }
    Shape ms = {ns[0]};
    std::vector<Shape> mst(N);
    for (int j = 0; j < N; ++j) mst[j] = {nst[j][0]};
    for (size_t d = 1; d < ns.size(); ++d) {
      bool can = true;
      for (int j = 0; j < N; ++j)
        if (mst[j].back() != nst[j][d] * ns[d]) can = false;
      if (can) {
        ms.back() *= ns[d];
        for (int j = 0; j < N; ++j) mst[j].back() = nst[j][d];
      } else {
        ms.push_back(ns[d]);
        for (int j = 0; j < N; ++j) mst[j].push_back(nst[j][d]);
      }
    }
    shape = ms;
    strides = mst;
    inner = shape.back();
    rows = numel_of(shape) / std::max<int64_t>(inner, 1);
    if (numel_of(shape) == 0) rows = 0;
  }

  // Offsets of each operand at the start of row r.
  void row_offsets(int64_t r, int64_t* offs) const {
    for (int j = 0; j < N; ++j) offs[j] = 0;
    for (size_t d = shape.size() - 1; d-- > 0;) {
      int64_t i = r % shape[d];
      r /= shape[d];
      for (int j = 0; j < N; ++j) offs[j] += i * strides[j][d];
    }
  }
};

// Runs f(out_index, offs...) in row chunks; f(int64_t o, const int64_t* offs, const int64_t* inner_strides,
// int64_t count) processes `count` consecutive outputs starting at o.
template <int N, class F>
void for_each_row(const Kctx& k, const BcastPlan<N>& plan, F&& f) {
  int64_t min_rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(plan.inner, 1));
  int64_t istr[N];
  for (int j = 0; j < N; ++j) istr[j] = plan.strides[j].back();
  k.parallel(plan.rows, min_rows, [&](int64_t b, int64_t e) {
    int64_t offs[N];
    for (int64_t r = b; r < e; ++r) {
      plan.row_offsets(r, offs);
      f(r * plan.inner, offs, istr, plan.inner);
    }
  });
}

// Gathers `src` broadcast to `out_shape` into a new contiguous buffer of T (used where a kernel wants dense data).
template <class T>
std::vector<T> broadcast_to(const T* src, const Shape& src_shape, const Shape& out_shape) {
  std::vector<T> r(static_cast<size_t>(numel_of(out_shape)));
  if (r.empty()) return r;
  Shape st = broadcast_strides(src_shape, out_shape);
  Shape os = strides_of(out_shape);
  for (int64_t i = 0; i < static_cast<int64_t>(r.size()); ++i) {
    int64_t off = 0, rem = i;
    for (size_t d = 0; d < out_shape.size(); ++d) {
      int64_t idx = rem / os[d];
      rem %= os[d];
      off += idx * st[d];
    }
    r[i] = src[off];
  }
  return r;
}

// Copies a tensor's bytes into an output.
inline void copy_bytes(const TView& dst, const TView& src) {
  size_t n = static_cast<size_t>(src.numel) * src.elem_size();
  if (n && dst.data != src.data) std::memmove(dst.data, src.data, n);
}

// Float values of a tensor converted to float (any float dtype), for small parameter tensors.
inline std::vector<float> read_floats(const TView& t, const Kctx& k, const char* what) {
  std::vector<float> r(static_cast<size_t>(t.numel));
  dispatch(
      NumTs{}, t.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < t.numel; ++i) r[i] = static_cast<float>(ld(t.p<T>()[i]));
      },
      what);
  return r;
}

}  // namespace keel::ops::ref
