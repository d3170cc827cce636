// Reference kernels: elementwise unary and binary ops, activations, comparisons, logic, Where, variadic
// Min/Max/Sum/Mean, Clip, Cast/CastLike, Pow, Mod, BitShift, PRelu, IsNaN, IsInf.
#include "ops/reference/kernels.h"

namespace keel::ops::ref {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Unary
// ---------------------------------------------------------------------------------------------------------------

// Applies Op (constructed from the context, so it can read attributes) to every element; output dtype = input's.
template <class Op, class Types>
void unary(Kctx& k, Types types) {
  TView x = k.in(0);
  TView y = k.out(0, x.shape);
  Op op(k);
  dispatch(types, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* a = x.p<T>();
    T* o = y.p<T>();
    k.parallel(x.numel, 16384, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = st<T>(op(ld(a[i])));
    });
  });
}

struct NoAttr {
  explicit NoAttr(const Kctx&) {}
};

#define KEEL_UNARY_OP(Name, expr)  \
  struct Name : NoAttr {           \
    using NoAttr::NoAttr;          \
    template <class C>             \
    C operator()(C x) const {      \
      return static_cast<C>(expr); \
    }                              \
  };

KEEL_UNARY_OP(ExpOp, std::exp(x))
KEEL_UNARY_OP(LogOp, std::log(x))
KEEL_UNARY_OP(SqrtOp, std::sqrt(x))
KEEL_UNARY_OP(ReciprocalOp, C(1) / x)
KEEL_UNARY_OP(ErfOp, std::erf(x))
KEEL_UNARY_OP(TanhOp, std::tanh(x))
KEEL_UNARY_OP(SinOp, std::sin(x))
KEEL_UNARY_OP(CosOp, std::cos(x))
KEEL_UNARY_OP(TanOp, std::tan(x))
KEEL_UNARY_OP(AsinOp, std::asin(x))
KEEL_UNARY_OP(AcosOp, std::acos(x))
KEEL_UNARY_OP(AtanOp, std::atan(x))
KEEL_UNARY_OP(SinhOp, std::sinh(x))
KEEL_UNARY_OP(CoshOp, std::cosh(x))
KEEL_UNARY_OP(AsinhOp, std::asinh(x))
KEEL_UNARY_OP(AcoshOp, std::acosh(x))
KEEL_UNARY_OP(AtanhOp, std::atanh(x))
KEEL_UNARY_OP(FloorOp, std::floor(x))
KEEL_UNARY_OP(CeilOp, std::ceil(x))
KEEL_UNARY_OP(RoundOp, std::nearbyint(x))  // half to even under the default rounding mode
KEEL_UNARY_OP(SoftsignOp, x / (C(1) + std::abs(x)))
KEEL_UNARY_OP(SigmoidOp, x >= C(0) ? C(1) / (C(1) + std::exp(-x)) : std::exp(x) / (C(1) + std::exp(x)))
KEEL_UNARY_OP(SoftplusOp, x > C(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)))
KEEL_UNARY_OP(MishOp, x* std::tanh(x > C(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x))))
KEEL_UNARY_OP(ReluOp, x > C(0) ? x : C(0))
#undef KEEL_UNARY_OP

struct NegOp : NoAttr {
  using NoAttr::NoAttr;
  template <class C>
  C operator()(C x) const {
    if constexpr (std::is_integral_v<C>)
      return static_cast<C>(static_cast<std::make_unsigned_t<C>>(0) - static_cast<std::make_unsigned_t<C>>(x));
    else return -x;
  }
};
struct AbsOp : NoAttr {
  using NoAttr::NoAttr;
  template <class C>
  C operator()(C x) const {
    if constexpr (std::is_unsigned_v<C>) return x;
    else if constexpr (std::is_integral_v<C>)
      return x < C(0)
                 ? static_cast<C>(static_cast<std::make_unsigned_t<C>>(0) - static_cast<std::make_unsigned_t<C>>(x))
                 : x;
    else return std::abs(x);
  }
};
struct SignOp : NoAttr {
  using NoAttr::NoAttr;
  template <class C>
  C operator()(C x) const {
    if constexpr (std::is_floating_point_v<C>)
      if (std::isnan(x)) return x;
    return x > C(0) ? C(1) : (x < C(0) ? static_cast<C>(-1) : C(0));
  }
};

struct LeakyReluOp {
  float alpha;
  explicit LeakyReluOp(const Kctx& k) : alpha(k.attr_f("alpha", 0.01f)) {}
  template <class C>
  C operator()(C x) const {
    return x >= C(0) ? x : static_cast<C>(alpha) * x;
  }
};
struct EluOp {
  float alpha;
  explicit EluOp(const Kctx& k) : alpha(k.attr_f("alpha", 1.0f)) {}
  template <class C>
  C operator()(C x) const {
    return x >= C(0) ? x : static_cast<C>(alpha) * (std::exp(x) - C(1));
  }
};
struct CeluOp {
  float alpha;
  explicit CeluOp(const Kctx& k) : alpha(k.attr_f("alpha", 1.0f)) {}
  template <class C>
  C operator()(C x) const {
    C a = static_cast<C>(alpha);
    return std::max(C(0), x) + std::min(C(0), a * (std::exp(x / a) - C(1)));
  }
};
struct SeluOp {
  float alpha, gamma;
  explicit SeluOp(const Kctx& k)
      : alpha(k.attr_f("alpha", 1.67326319217681884765625f)), gamma(k.attr_f("gamma", 1.05070102214813232421875f)) {}
  template <class C>
  C operator()(C x) const {
    return static_cast<C>(gamma) * (x > C(0) ? x : static_cast<C>(alpha) * (std::exp(x) - C(1)));
  }
};
struct HardSigmoidOp {
  float alpha, beta;
  explicit HardSigmoidOp(const Kctx& k) : alpha(k.attr_f("alpha", 0.2f)), beta(k.attr_f("beta", 0.5f)) {}
  template <class C>
  C operator()(C x) const {
    return std::max(C(0), std::min(C(1), static_cast<C>(alpha) * x + static_cast<C>(beta)));
  }
};
struct HardSwishOp : NoAttr {
  using NoAttr::NoAttr;
  template <class C>
  C operator()(C x) const {
    return x * std::max(C(0), std::min(C(1), x / C(6) + static_cast<C>(0.5)));
  }
};
struct ThresholdedReluOp {
  float alpha;
  explicit ThresholdedReluOp(const Kctx& k) : alpha(k.attr_f("alpha", 1.0f)) {}
  template <class C>
  C operator()(C x) const {
    return x > static_cast<C>(alpha) ? x : C(0);
  }
};
struct ShrinkOp {
  float bias, lambd;
  explicit ShrinkOp(const Kctx& k) : bias(k.attr_f("bias", 0.0f)), lambd(k.attr_f("lambd", 0.5f)) {}
  template <class C>
  C operator()(C x) const {
    double v = static_cast<double>(x);
    if (v < -lambd) return static_cast<C>(v + bias);
    if (v > lambd) return static_cast<C>(v - bias);
    return C(0);
  }
};
struct GeluOp {
  bool tanh_approx;
  explicit GeluOp(const Kctx& k) : tanh_approx(k.attr_s("approximate", "none") == "tanh") {}
  template <class C>
  C operator()(C x) const {
    if (tanh_approx) {
      const C k0 = static_cast<C>(0.7978845608028654);  // sqrt(2/pi)
      return static_cast<C>(0.5) * x * (C(1) + std::tanh(k0 * (x + static_cast<C>(0.044715) * x * x * x)));
    }
    return static_cast<C>(0.5) * x * (C(1) + std::erf(x * static_cast<C>(0.7071067811865476)));
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Binary with multidirectional broadcasting
// ---------------------------------------------------------------------------------------------------------------

template <class C>
using wide_u = std::make_unsigned_t<std::conditional_t<std::is_integral_v<C>, C, int>>;

struct AddOp {
  template <class C>
  static C apply(C a, C b, const Kctx&) {
    if constexpr (std::is_integral_v<C>) return static_cast<C>(static_cast<wide_u<C>>(a) + static_cast<wide_u<C>>(b));
    else return a + b;
  }
};
struct SubOp {
  template <class C>
  static C apply(C a, C b, const Kctx&) {
    if constexpr (std::is_integral_v<C>) return static_cast<C>(static_cast<wide_u<C>>(a) - static_cast<wide_u<C>>(b));
    else return a - b;
  }
};
struct MulOp {
  template <class C>
  static C apply(C a, C b, const Kctx&) {
    if constexpr (std::is_integral_v<C>) return static_cast<C>(static_cast<wide_u<C>>(a) * static_cast<wide_u<C>>(b));
    else return a * b;
  }
};
struct DivOp {
  template <class C>
  static C apply(C a, C b, const Kctx& k) {
    if constexpr (std::is_integral_v<C>) {
      if (b == C(0)) k.invalid("integer division by zero");
      if constexpr (std::is_signed_v<C>)
        if (b == C(-1)) return static_cast<C>(static_cast<wide_u<C>>(0) - static_cast<wide_u<C>>(a));
    }
    return static_cast<C>(a / b);
  }
};
struct ModOp {  // fmod=0: result has the sign of the divisor (Python); fmod=1: sign of the dividend (C fmod)
  template <class C>
  static C apply(C a, C b, const Kctx& k, bool fmod) {
    if constexpr (std::is_integral_v<C>) {
      if (b == C(0)) k.invalid("integer modulo by zero");
      if constexpr (std::is_signed_v<C>) {
        if (b == C(-1)) return C(0);
        C r = static_cast<C>(a % b);
        if (!fmod && r != C(0) && ((r < C(0)) != (b < C(0)))) r = static_cast<C>(r + b);
        return r;
      } else {
        return static_cast<C>(a % b);
      }
    } else {
      C r = std::fmod(a, b);
      if (!fmod && r != C(0) && ((r < C(0)) != (b < C(0)))) r += b;
      return r;
    }
  }
};
struct MaxOp {
  template <class C>
  static C apply(C a, C b, const Kctx&) {
    if constexpr (std::is_floating_point_v<C>)
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
    return a > b ? a : b;
  }
};
struct MinOp {
  template <class C>
  static C apply(C a, C b, const Kctx&) {
    if constexpr (std::is_floating_point_v<C>)
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
    return a < b ? a : b;
  }
};
struct PReluOp {
  template <class C>
  static C apply(C x, C s, const Kctx&) {
    return x < C(0) ? static_cast<C>(x * s) : x;
  }
};
struct EqualOp {
  template <class C>
  static bool apply(C a, C b, const Kctx&) {
    return a == b;
  }
};
struct LessOp {
  template <class C>
  static bool apply(C a, C b, const Kctx&) {
    return a < b;
  }
};
struct GreaterOp {
  template <class C>
  static bool apply(C a, C b, const Kctx&) {
    return a > b;
  }
};
struct LessOrEqualOp {
  template <class C>
  static bool apply(C a, C b, const Kctx&) {
    return a <= b;
  }
};
struct GreaterOrEqualOp {
  template <class C>
  static bool apply(C a, C b, const Kctx&) {
    return a >= b;
  }
};
struct AndOp {
  template <class C>
  static bool apply(C a, C b, const Kctx&) {
    return a && b;
  }
};
struct OrOp {
  template <class C>
  static bool apply(C a, C b, const Kctx&) {
    return a || b;
  }
};
struct XorOp {
  template <class C>
  static bool apply(C a, C b, const Kctx&) {
    return (a != 0) != (b != 0);
  }
};

// Broadcast-binary loop: out[o] = f(a[...], b[...]) with element types A, B, O.
template <class A, class B, class O, class F>
void binary_loop(const Kctx& k, const TView& a, const TView& b, const TView& y, F&& f) {
  BcastPlan<2> plan(y.shape, {broadcast_strides(a.shape, y.shape), broadcast_strides(b.shape, y.shape)});
  const A* pa0 = a.p<A>();
  const B* pb0 = b.p<B>();
  O* py0 = y.p<O>();
  for_each_row<2>(k, plan, [&](int64_t o, const int64_t* off, const int64_t* is, int64_t n) {
    const A* pa = pa0 + off[0];
    const B* pb = pb0 + off[1];
    O* py = py0 + o;
    if (is[0] == 1 && is[1] == 1) {
      for (int64_t i = 0; i < n; ++i) py[i] = st<O>(f(ld(pa[i]), ld(pb[i])));
    } else if (is[0] == 1 && is[1] == 0) {
      auto vb = ld(*pb);
      for (int64_t i = 0; i < n; ++i) py[i] = st<O>(f(ld(pa[i]), vb));
    } else if (is[0] == 0 && is[1] == 1) {
      auto va = ld(*pa);
      for (int64_t i = 0; i < n; ++i) py[i] = st<O>(f(va, ld(pb[i])));
    } else {
      for (int64_t i = 0; i < n; ++i) py[i] = st<O>(f(ld(pa[i * is[0]]), ld(pb[i * is[1]])));
    }
  });
}

template <class Op, bool kBoolOut, class Types>
void binary(Kctx& k, Types types) {
  TView a = k.in(0), b = k.in(1);
  if (a.dtype != b.dtype)
    k.invalid(cat("inputs have different dtypes ", dtype_str(a.dtype), " and ", dtype_str(b.dtype)));
  Shape os = broadcast_shapes({a.shape, b.shape}, k);
  TView y = k.out(0, os);
  dispatch(types, a.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using O = std::conditional_t<kBoolOut, bool, T>;
    binary_loop<T, T, O>(k, a, b, y, [&](auto va, auto vb) { return Op::apply(va, vb, k); });
  });
}

// Variadic Max/Min/Sum/Mean: folds all inputs (broadcast together) into the output.
enum class Fold { kMax, kMin, kSum, kMean };
template <Fold kFold>
void variadic(Kctx& k) {
  int n = k.n_inputs();
  std::vector<TView> xs;
  for (int i = 0; i < n; ++i)
    if (k.has_input(i)) xs.push_back(k.in(i));
  if (xs.empty()) k.invalid("needs at least one input");
  std::vector<Shape> shapes;
  for (auto& x : xs) {
    if (x.dtype != xs[0].dtype) k.invalid("inputs have different dtypes");
    shapes.push_back(x.shape);
  }
  Shape os = broadcast_shapes(shapes, k);
  TView y = k.out(0, os);
  dispatch(NumTs{}, xs[0].dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = calc_t<T>;
    std::vector<C> acc(static_cast<size_t>(y.numel));
    TView accv{DTypeOf<C>::value, os, acc.data(), y.numel};
    for (size_t j = 0; j < xs.size(); ++j) {
      binary_loop<C, T, C>(k, accv, xs[j], accv, [&](C a, C b) -> C {
        if (j == 0) return b;
        if constexpr (kFold == Fold::kMax) return MaxOp::apply(a, b, k);
        else if constexpr (kFold == Fold::kMin) return MinOp::apply(a, b, k);
        else return AddOp::apply(a, b, k);
      });
    }
    T* py = y.p<T>();
    for (int64_t i = 0; i < y.numel; ++i) {
      if constexpr (kFold == Fold::kMean) py[i] = st<T>(acc[i] / static_cast<C>(xs.size()));
      else py[i] = st<T>(acc[i]);
    }
  });
}

// Saturating numeric conversion between any two element types (NaN -> 0 for integer targets), avoiding the
// undefined behaviour of out-of-range float-to-integer casts.
template <class To, class From>
To convert(From v) {
  auto c = ld(v);
  if constexpr (std::is_same_v<To, bool>) {
    return c != decltype(c)(0);
  } else if constexpr (std::is_integral_v<To> && is_float_v<From>) {
    double d = static_cast<double>(c);
    if (std::isnan(d)) return To(0);
    if (d <= static_cast<double>(std::numeric_limits<To>::lowest())) return std::numeric_limits<To>::lowest();
    if (d >= static_cast<double>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return static_cast<To>(d);
  } else if constexpr (is_half_v<To>) {
    return st<To>(static_cast<float>(c));
  } else {
    return static_cast<To>(c);
  }
}

void cast_impl(Kctx& k, const TView& x, int32_t to) {
  TView y = k.out(0, x.shape);
  if (y.dtype != to && to != KEEL_DTYPE_UNDEFINED)
    k.fail(KEEL_STATUS_INTERNAL, cat("output dtype ", dtype_str(y.dtype), " differs from 'to' ", dtype_str(to)));
  if (x.dtype == y.dtype) {
    copy_bytes(y, x);
    return;
  }
  dispatch(AllTs{}, x.dtype, k, [&](auto ftag) {
    using F = typename decltype(ftag)::type;
    dispatch(
        AllTs{}, y.dtype, k,
        [&](auto ttag) {
          using T = typename decltype(ttag)::type;
          const F* a = x.p<F>();
          T* o = y.p<T>();
          k.parallel(x.numel, 16384, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) o[i] = convert<T>(a[i]);
          });
        },
        "output");
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------------------------

void op_relu(Kctx& k) { unary<ReluOp>(k, SignedNumTs{}); }
void op_sigmoid(Kctx& k) { unary<SigmoidOp>(k, FloatTs{}); }
void op_tanh(Kctx& k) { unary<TanhOp>(k, FloatTs{}); }
void op_exp(Kctx& k) { unary<ExpOp>(k, FloatTs{}); }
void op_log(Kctx& k) { unary<LogOp>(k, FloatTs{}); }
void op_sqrt(Kctx& k) { unary<SqrtOp>(k, FloatTs{}); }
void op_reciprocal(Kctx& k) { unary<ReciprocalOp>(k, FloatTs{}); }
void op_erf(Kctx& k) { unary<ErfOp>(k, FloatTs{}); }
void op_sin(Kctx& k) { unary<SinOp>(k, FloatTs{}); }
void op_cos(Kctx& k) { unary<CosOp>(k, FloatTs{}); }
void op_tan(Kctx& k) { unary<TanOp>(k, FloatTs{}); }
void op_asin(Kctx& k) { unary<AsinOp>(k, FloatTs{}); }
void op_acos(Kctx& k) { unary<AcosOp>(k, FloatTs{}); }
void op_atan(Kctx& k) { unary<AtanOp>(k, FloatTs{}); }
void op_sinh(Kctx& k) { unary<SinhOp>(k, FloatTs{}); }
void op_cosh(Kctx& k) { unary<CoshOp>(k, FloatTs{}); }
void op_asinh(Kctx& k) { unary<AsinhOp>(k, FloatTs{}); }
void op_acosh(Kctx& k) { unary<AcoshOp>(k, FloatTs{}); }
void op_atanh(Kctx& k) { unary<AtanhOp>(k, FloatTs{}); }
void op_floor(Kctx& k) { unary<FloorOp>(k, FloatTs{}); }
void op_ceil(Kctx& k) { unary<CeilOp>(k, FloatTs{}); }
void op_round(Kctx& k) { unary<RoundOp>(k, FloatTs{}); }
void op_softsign(Kctx& k) { unary<SoftsignOp>(k, FloatTs{}); }
void op_softplus(Kctx& k) { unary<SoftplusOp>(k, FloatTs{}); }
void op_mish(Kctx& k) { unary<MishOp>(k, FloatTs{}); }
void op_neg(Kctx& k) { unary<NegOp>(k, SignedNumTs{}); }
void op_abs(Kctx& k) { unary<AbsOp>(k, NumTs{}); }
void op_sign(Kctx& k) { unary<SignOp>(k, NumTs{}); }
void op_leaky_relu(Kctx& k) { unary<LeakyReluOp>(k, FloatTs{}); }
void op_elu(Kctx& k) { unary<EluOp>(k, FloatTs{}); }
void op_celu(Kctx& k) { unary<CeluOp>(k, FloatTs{}); }
void op_selu(Kctx& k) { unary<SeluOp>(k, FloatTs{}); }
void op_hard_sigmoid(Kctx& k) { unary<HardSigmoidOp>(k, FloatTs{}); }
void op_hard_swish(Kctx& k) { unary<HardSwishOp>(k, FloatTs{}); }
void op_thresholded_relu(Kctx& k) { unary<ThresholdedReluOp>(k, FloatTs{}); }
void op_shrink(Kctx& k) { unary<ShrinkOp>(k, NumTs{}); }
void op_gelu(Kctx& k) { unary<GeluOp>(k, FloatTs{}); }

void op_not(Kctx& k) {
  TView x = k.in(0);
  if (x.dtype != KEEL_DTYPE_BOOL) k.bad_dtype(x.dtype);
  TView y = k.out(0, x.shape);
  for (int64_t i = 0; i < x.numel; ++i) y.p<bool>()[i] = !x.p<bool>()[i];
}

void op_isnan(Kctx& k) {
  TView x = k.in(0);
  TView y = k.out(0, x.shape);
  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t i = 0; i < x.numel; ++i) y.p<bool>()[i] = std::isnan(ld(x.p<T>()[i]));
  });
}

void op_isinf(Kctx& k) {
  TView x = k.in(0);
  TView y = k.out(0, x.shape);
  bool neg = k.attr_i("detect_negative", 1) != 0, pos = k.attr_i("detect_positive", 1) != 0;
  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int64_t i = 0; i < x.numel; ++i) {
      auto v = ld(x.p<T>()[i]);
      y.p<bool>()[i] = std::isinf(v) && ((v > 0 && pos) || (v < 0 && neg));
    }
  });
}

void op_add(Kctx& k) { binary<AddOp, false>(k, NumTs{}); }
void op_sub(Kctx& k) { binary<SubOp, false>(k, NumTs{}); }
void op_mul(Kctx& k) { binary<MulOp, false>(k, NumTs{}); }
void op_div(Kctx& k) { binary<DivOp, false>(k, NumTs{}); }
void op_equal(Kctx& k) { binary<EqualOp, true>(k, AllTs{}); }
void op_less(Kctx& k) { binary<LessOp, true>(k, NumTs{}); }
void op_greater(Kctx& k) { binary<GreaterOp, true>(k, NumTs{}); }
void op_less_or_equal(Kctx& k) { binary<LessOrEqualOp, true>(k, NumTs{}); }
void op_greater_or_equal(Kctx& k) { binary<GreaterOrEqualOp, true>(k, NumTs{}); }
void op_and(Kctx& k) { binary<AndOp, true>(k, TL<bool>{}); }
void op_or(Kctx& k) { binary<OrOp, true>(k, TL<bool>{}); }
void op_xor(Kctx& k) { binary<XorOp, true>(k, TL<bool>{}); }

void op_mod(Kctx& k) {
  TView a = k.in(0), b = k.in(1);
  if (a.dtype != b.dtype) k.invalid("inputs have different dtypes");
  bool fmod = k.attr_i("fmod", 0) != 0;
  Shape os = broadcast_shapes({a.shape, b.shape}, k);
  TView y = k.out(0, os);
  dispatch(NumTs{}, a.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    binary_loop<T, T, T>(k, a, b, y, [&](auto va, auto vb) { return ModOp::apply(va, vb, k, fmod); });
  });
}

void op_bitshift(Kctx& k) {
  TView a = k.in(0), b = k.in(1);
  if (a.dtype != b.dtype) k.invalid("inputs have different dtypes");
  std::string dir = k.attr_s("direction", "");
  if (dir != "LEFT" && dir != "RIGHT") k.invalid(cat("direction must be LEFT or RIGHT, got '", dir, "'"));
  bool left = dir == "LEFT";
  Shape os = broadcast_shapes({a.shape, b.shape}, k);
  TView y = k.out(0, os);
  dispatch(UIntTs{}, a.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    binary_loop<T, T, T>(k, a, b, y, [&](T va, T vb) -> T {
      if (vb >= sizeof(T) * 8) return T(0);
      return left ? static_cast<T>(va << vb) : static_cast<T>(va >> vb);
    });
  });
}

void op_pow(Kctx& k) {
  TView a = k.in(0), b = k.in(1);
  Shape os = broadcast_shapes({a.shape, b.shape}, k);
  TView y = k.out(0, os);
  std::vector<double> exps(static_cast<size_t>(b.numel));
  dispatch(
      NumTs{}, b.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < b.numel; ++i) exps[i] = static_cast<double>(ld(b.p<T>()[i]));
      },
      "exponent");
  TView bv{KEEL_DTYPE_F64, b.shape, exps.data(), b.numel};
  dispatch(NumTs{}, a.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    binary_loop<T, double, T>(k, a, bv, y, [&](auto va, double vb) {
      if constexpr (std::is_same_v<T, float> || is_half_v<T>) {
        return std::pow(static_cast<float>(va), static_cast<float>(vb));
      } else {
        return std::pow(static_cast<double>(va), vb);
      }
    });
  });
}

void op_prelu(Kctx& k) {
  TView x = k.in(0), s = k.in(1);
  if (x.dtype != s.dtype) k.invalid("X and slope have different dtypes");
  Shape os = broadcast_shapes({x.shape, s.shape}, k);
  if (os != x.shape)
    k.invalid(cat("slope ", shape_str(s.shape), " is not unidirectionally broadcastable to X ", shape_str(x.shape)));
  TView y = k.out(0, os);
  dispatch(SignedNumTs{} + UIntTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    binary_loop<T, T, T>(k, x, s, y, [&](auto va, auto vb) { return PReluOp::apply(va, vb, k); });
  });
}

void op_max(Kctx& k) { variadic<Fold::kMax>(k); }
void op_min(Kctx& k) { variadic<Fold::kMin>(k); }
void op_sum(Kctx& k) { variadic<Fold::kSum>(k); }
void op_mean(Kctx& k) { variadic<Fold::kMean>(k); }

void op_where(Kctx& k) {
  TView c = k.in(0), a = k.in(1), b = k.in(2);
  if (c.dtype != KEEL_DTYPE_BOOL) k.invalid(cat("condition must be bool, got ", dtype_str(c.dtype)));
  if (a.dtype != b.dtype) k.invalid("X and Y have different dtypes");
  Shape os = broadcast_shapes({c.shape, a.shape, b.shape}, k);
  TView y = k.out(0, os);
  BcastPlan<3> plan(os,
                    {broadcast_strides(c.shape, os), broadcast_strides(a.shape, os), broadcast_strides(b.shape, os)});
  dispatch_bytes(a.dtype, k, [&](auto tag) {
    using U = typename decltype(tag)::type;
    const bool* pc0 = c.p<bool>();
    const U* pa0 = a.p<U>();
    const U* pb0 = b.p<U>();
    U* py0 = y.p<U>();
    for_each_row<3>(k, plan, [&](int64_t o, const int64_t* off, const int64_t* is, int64_t n) {
      for (int64_t i = 0; i < n; ++i)
        py0[o + i] = pc0[off[0] + i * is[0]] ? pa0[off[1] + i * is[1]] : pb0[off[2] + i * is[2]];
    });
  });
}

void op_clip(Kctx& k) {
  TView x = k.in(0);
  TView y = k.out(0, x.shape);
  dispatch(NumTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = calc_t<T>;
    C lo = std::numeric_limits<C>::lowest(), hi = std::numeric_limits<C>::max();
    if (k.opset() > 0 && k.opset() < 11) {
      lo = static_cast<C>(k.attr_f("min", -std::numeric_limits<float>::max()));
      hi = static_cast<C>(k.attr_f("max", std::numeric_limits<float>::max()));
    } else {
      auto mn = k.opt_in(1), mx = k.opt_in(2);
      if (mn) {
        if (mn->numel != 1) k.invalid("min must be a scalar");
        if (mn->dtype != x.dtype) k.invalid("min has a different dtype than input");
        lo = ld(mn->template p<T>()[0]);
      }
      if (mx) {
        if (mx->numel != 1) k.invalid("max must be a scalar");
        if (mx->dtype != x.dtype) k.invalid("max has a different dtype than input");
        hi = ld(mx->template p<T>()[0]);
      }
    }
    const T* a = x.p<T>();
    T* o = y.p<T>();
    k.parallel(x.numel, 16384, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        C v = ld(a[i]);
        if constexpr (std::is_floating_point_v<C>)
          if (std::isnan(v)) {
            o[i] = a[i];
            continue;
          }
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
        o[i] = st<T>(v);
      }
    });
  });
}

void op_cast(Kctx& k) {
  TView x = k.in(0);
  int32_t to = static_cast<int32_t>(k.attr_i("to", k.out_dtype(0)));
  cast_impl(k, x, to);
}

void op_cast_like(Kctx& k) {
  TView x = k.in(0);
  TView target = k.in(1);
  cast_impl(k, x, target.dtype);
}

}  // namespace keel::ops::ref
