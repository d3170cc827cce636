// Attribute validation before ONNX shape inference and before kernels (see attribute_checks.h).
#include "core/runtime/attribute_checks.h"

#include <onnx/defs/schema.h>
#include <onnx/defs/shape_inference.h>
#include <onnx/defs/tensor_proto_util.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "core/base/dtype.h"
#include "ops/schemas.h"

namespace keel {
namespace {

// Spatial extents (kernel sizes, strides, dilations, pads, block sizes, hidden sizes) above this are refused: no
// real model comes near, and products of two such values stay far from int64 overflow.
constexpr int64_t kMaxExtent = int64_t{1} << 31;

std::string ints_to_string(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i == 16 && v.size() > 20) {
      s += ", ... (" + std::to_string(v.size()) + " values)";
      break;
    }
    s += (i ? ", " : "") + std::to_string(v[i]);
  }
  return s + "]";
}

std::string float_to_string(double f) {
  std::ostringstream o;
  o << f;
  return o.str();
}

std::string attr_to_string(const Attribute& a) {
  switch (a.kind) {
    case AttrKind::kInt: return std::to_string(a.i);
    case AttrKind::kInts: return ints_to_string(a.ints);
    case AttrKind::kFloat: return float_to_string(a.f);
    case AttrKind::kFloats: {
      std::string s = "[";
      for (size_t i = 0; i < a.floats.size() && i < 16; ++i) s += (i ? ", " : "") + float_to_string(a.floats[i]);
      return s + (a.floats.size() > 16 ? ", ...]" : "]");
    }
    case AttrKind::kString: return "\"" + a.s + "\"";
    case AttrKind::kStrings: {
      std::string s = "[";
      for (size_t i = 0; i < a.strings.size() && i < 16; ++i) s += (i ? ", \"" : "\"") + a.strings[i] + "\"";
      return s + "]";
    }
    default: return "(a value of kind " + std::to_string(static_cast<int>(a.kind)) + ")";
  }
}

const char* kind_name(AttrKind k) {
  switch (k) {
    case AttrKind::kInt: return "an int";
    case AttrKind::kInts: return "a list of ints";
    case AttrKind::kFloat: return "a float";
    case AttrKind::kFloats: return "a list of floats";
    case AttrKind::kString: return "a string";
    case AttrKind::kStrings: return "a list of strings";
    case AttrKind::kTensor: return "a tensor";
    case AttrKind::kGraph: return "a graph";
    default: return "another kind";
  }
}

// One node under check: accessors over AttrCheckNode and the error builders.
class Ctx {
 public:
  explicit Ctx(const AttrCheckNode& n) : n_(n) {}
  const AttrCheckNode& node() const { return n_; }
  int32_t opset() const { return n_.opset; }

  const Attribute* attr(const std::string& name) const { return n_.attr ? n_.attr(name) : nullptr; }

  // The attribute as ints (nullptr when absent); an attribute of another kind is an error.
  Status ints(const std::string& name, const std::vector<int64_t>** out) const {
    *out = nullptr;
    const Attribute* a = attr(name);
    if (a == nullptr) return Status::ok();
    if (a->kind != AttrKind::kInts) return wrong_kind(name, *a, AttrKind::kInts);
    *out = &a->ints;
    return Status::ok();
  }
  Status int_attr(const std::string& name, std::optional<int64_t>* out) const {
    out->reset();
    const Attribute* a = attr(name);
    if (a == nullptr) return Status::ok();
    if (a->kind != AttrKind::kInt) return wrong_kind(name, *a, AttrKind::kInt);
    *out = a->i;
    return Status::ok();
  }
  Status string_attr(const std::string& name, std::optional<std::string>* out) const {
    out->reset();
    const Attribute* a = attr(name);
    if (a == nullptr) return Status::ok();
    if (a->kind != AttrKind::kString) return wrong_kind(name, *a, AttrKind::kString);
    *out = a->s;
    return Status::ok();
  }

  bool present(size_t i) const { return i < n_.input_present.size() && n_.input_present[i]; }
  // Rank of input i, -1 when unknown or absent.
  int rank(size_t i) const {
    if (i >= n_.input_shapes.size() || !n_.input_shapes[i]) return -1;
    return static_cast<int>(n_.input_shapes[i]->size());
  }
  // Dim d of input i, -1 when unknown.
  int64_t dim(size_t i, int64_t d) const {
    if (i >= n_.input_shapes.size() || !n_.input_shapes[i] || d < 0 ||
        d >= static_cast<int64_t>(n_.input_shapes[i]->size()))
      return -1;
    return (*n_.input_shapes[i])[static_cast<size_t>(d)];
  }
  const std::vector<int64_t>* const_ints(size_t i) const {
    if (i >= n_.input_ints.size() || !n_.input_ints[i]) return nullptr;
    return &*n_.input_ints[i];
  }

  std::string prefix() const { return n_.label.empty() ? std::string() : n_.label + ": "; }
  Status bad_attr(const std::string& name, const std::string& why) const {
    const Attribute* a = attr(name);
    return invalid_argument(prefix() + "attribute " + name + " = " + (a ? attr_to_string(*a) : "(absent)") + ": " +
                            why);
  }
  Status bad_attr_value(const std::string& name, const std::string& value, const std::string& why) const {
    return invalid_argument(prefix() + "attribute " + name + " = " + value + ": " + why);
  }
  Status bad_input(size_t i, const std::string& what, const std::vector<int64_t>& v, const std::string& why) const {
    return invalid_argument(prefix() + "input " + std::to_string(i) + " (" + what + ") = " + ints_to_string(v) + ": " +
                            why);
  }
  Status bad_node(const std::string& why) const { return invalid_argument(prefix() + why); }

 private:
  Status wrong_kind(const std::string& name, const Attribute& a, AttrKind want) const {
    return invalid_argument(prefix() + "attribute " + name + " is " + kind_name(a.kind) + ", expected " +
                            kind_name(want));
  }
  const AttrCheckNode& n_;
};

using Rule = std::function<Status(const Ctx&)>;

#define KEEL_CHECK_OK(expr)       \
  do {                            \
    ::keel::Status st_ = (expr);  \
    if (!st_.is_ok()) return st_; \
  } while (0)

// --- generic rules ------------------------------------------------------------------------------------------------

// An int attribute within [lo, hi] (when present).
Rule int_in(std::string name, int64_t lo, int64_t hi) {
  return [=](const Ctx& c) -> Status {
    std::optional<int64_t> v;
    KEEL_CHECK_OK(c.int_attr(name, &v));
    if (v && (*v < lo || *v > hi)) {
      return c.bad_attr(name, hi == INT64_MAX ? "must be >= " + std::to_string(lo)
                                              : "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return Status::ok();
  };
}
Rule flag(std::string name) { return int_in(std::move(name), 0, 1); }

// A string attribute from a fixed set (when present).
Rule one_of(std::string name, std::vector<std::string> allowed) {
  return [=](const Ctx& c) -> Status {
    std::optional<std::string> v;
    KEEL_CHECK_OK(c.string_attr(name, &v));
    if (v && std::find(allowed.begin(), allowed.end(), *v) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      return c.bad_attr(name, "must be one of " + list);
    }
    return Status::ok();
  };
}

// Every value of an ints attribute within [lo, hi] (when present).
Rule ints_in(std::string name, int64_t lo, int64_t hi, std::string what) {
  return [=](const Ctx& c) -> Status {
    const std::vector<int64_t>* v = nullptr;
    KEEL_CHECK_OK(c.ints(name, &v));
    if (v)
      for (int64_t x : *v)
        if (x < lo || x > hi) return c.bad_attr(name, what);
    return Status::ok();
  };
}

// A float attribute (or each of a floats attribute) finite and > 0 (when present).
Rule positive_float(std::string name) {
  return [=](const Ctx& c) -> Status {
    const Attribute* a = c.attr(name);
    if (a == nullptr) return Status::ok();
    if (a->kind == AttrKind::kFloat && !(std::isfinite(a->f) && a->f > 0))
      return c.bad_attr(name, "must be finite and > 0");
    if (a->kind == AttrKind::kFloats)
      for (float f : a->floats)
        if (!(std::isfinite(f) && f > 0)) return c.bad_attr(name, "every value must be finite and > 0");
    return Status::ok();
  };
}

// A dtype attribute (Cast's `to`, EyeLike's `dtype`, ...) that names a tensor type Keel has.
Rule dtype_attr(std::string name) {
  return [=](const Ctx& c) -> Status {
    std::optional<int64_t> v;
    KEEL_CHECK_OK(c.int_attr(name, &v));
    if (v && (*v < INT32_MIN || *v > INT32_MAX || !dtype_is_valid(static_cast<int32_t>(*v)) || *v == 0))
      return c.bad_attr(name, "is not a known tensor element type");
    return Status::ok();
  };
}

// Whether an axis is in [-rank - lo_extra, rank - 1 + hi_extra] (OneHot's axis counts the output's new axis: 1, 1;
// Flatten's may equal the rank: 0, 1).
bool axis_ok(int64_t axis, int64_t rank, int64_t lo_extra, int64_t hi_extra) {
  return axis >= -rank - lo_extra && axis <= rank - 1 + hi_extra;
}
bool axis_ok(int64_t axis, int64_t rank, int64_t extra) { return axis_ok(axis, rank, extra, extra); }

std::string axis_range(int64_t rank, int64_t lo_extra, int64_t hi_extra) {
  return "[" + std::to_string(-rank - lo_extra) + ", " + std::to_string(rank - 1 + hi_extra) + "]";
}
std::string axis_range(int64_t rank, int64_t extra) { return axis_range(rank, extra, extra); }

// A single axis attribute against input `in`'s rank, in [-rank - lo_extra, rank - 1 + hi_extra]. `dflt`: the value an
// absent attribute means (nullopt: absent is not checked).
Rule axis_attr(std::string name, size_t in, std::optional<int64_t> dflt = std::nullopt, int64_t lo_extra = 0,
               int64_t hi_extra = 0) {
  return [=](const Ctx& c) -> Status {
    std::optional<int64_t> v;
    KEEL_CHECK_OK(c.int_attr(name, &v));
    const bool given = v.has_value();
    if (!v) v = dflt;
    const int r = c.rank(in);
    if (!v || r < 0) return Status::ok();
    if (!axis_ok(*v, r, lo_extra, hi_extra)) {
      const std::string why = "out of range for input " + std::to_string(in) + " of rank " + std::to_string(r) +
                              (r + lo_extra + hi_extra > 0 ? " (valid: " + axis_range(r, lo_extra, hi_extra) + ")"
                                                           : " (a scalar has no axis)");
      return given ? c.bad_attr(name, why) : c.bad_attr_value(name, std::to_string(*v) + " (the default)", why);
    }
    return Status::ok();
  };
}

// Softmax/LogSoftmax/Hardmax: axis defaults to 1 before opset 13 and to -1 from 13.
Rule softmax_axis() {
  return [](const Ctx& c) -> Status {
    const int64_t dflt = c.opset() != 0 && c.opset() < 13 ? 1 : -1;
    return axis_attr("axis", 0, dflt)(c);
  };
}

// A list of axes (attribute `name`, or constant input `in_idx` when the attribute is absent) against input `in`'s
// rank plus `grow` (Unsqueeze: the output rank, the input's plus the number of axes). Unique when `unique`.
Rule axes_list(std::string name, std::optional<size_t> in_idx, size_t in, bool grow = false, bool unique = true) {
  return [=](const Ctx& c) -> Status {
    const std::vector<int64_t>* v = nullptr;
    KEEL_CHECK_OK(c.ints(name, &v));
    bool from_input = false;
    if (!v && in_idx) {
      v = c.const_ints(*in_idx);
      from_input = v != nullptr;
    }
    if (!v) return Status::ok();
    auto fail = [&](const std::string& why) {
      return from_input ? c.bad_input(*in_idx, "axes", *v, why) : c.bad_attr(name, why);
    };
    int64_t r = c.rank(in);
    if (r >= 0) {
      if (grow) r += static_cast<int64_t>(v->size());
      std::set<int64_t> seen;
      for (int64_t a : *v) {
        if (!axis_ok(a, r, 0)) {
          return fail("axis " + std::to_string(a) + " is out of range for " +
                      (grow ? "the output" : "input " + std::to_string(in)) + " of rank " + std::to_string(r) +
                      " (valid: " + axis_range(r, 0) + ")");
        }
        if (unique && !seen.insert(a < 0 ? a + r : a).second) return fail("axis " + std::to_string(a) + " is repeated");
      }
    } else if (v->size() > 64 * 1024) {
      return fail("too many axes");
    }
    return Status::ok();
  };
}

// --- conv / pool geometry -----------------------------------------------------------------------------------------

enum class ConvKind { kConv, kConvTranspose, kPool, kUnpool };

// Conv, ConvTranspose, ConvInteger, QLinearConv, the pools, MaxUnpool, keel.FusedConv and the conv backward ops:
// x = the data input, w = the weight input (or none), bias = the bias input (or none: one value per output channel;
// kernels read as many as there are output channels).
Rule conv_like(ConvKind kind, size_t x, std::optional<size_t> w, std::optional<size_t> bias = std::nullopt) {
  return [=](const Ctx& c) -> Status {
    const std::vector<int64_t>*ks = nullptr, *strides = nullptr, *dil = nullptr, *pads = nullptr, *outpad = nullptr,
          *outshape = nullptr;
    KEEL_CHECK_OK(c.ints("kernel_shape", &ks));
    KEEL_CHECK_OK(c.ints("strides", &strides));
    KEEL_CHECK_OK(c.ints("dilations", &dil));
    KEEL_CHECK_OK(c.ints("pads", &pads));
    KEEL_CHECK_OK(c.ints("output_padding", &outpad));
    KEEL_CHECK_OK(c.ints("output_shape", &outshape));
    std::optional<std::string> auto_pad;
    KEEL_CHECK_OK(c.string_attr("auto_pad", &auto_pad));
    if (auto_pad && *auto_pad != "NOTSET" && *auto_pad != "SAME_UPPER" && *auto_pad != "SAME_LOWER" &&
        *auto_pad != "VALID")
      return c.bad_attr("auto_pad", "must be one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
    const bool explicit_pads = !auto_pad || *auto_pad == "NOTSET";

    const int xr = c.rank(x), wr = w ? c.rank(*w) : -1;
    if (xr >= 0 && xr < 3)
      return c.bad_node("input " + std::to_string(x) + " has rank " + std::to_string(xr) +
                        "; it needs rank 3 or more ([N, C, spatial...])");
    if (wr >= 0 && wr < 3)
      return c.bad_node("the weight (input " + std::to_string(*w) + ") has rank " + std::to_string(wr) +
                        "; it needs rank 3 or more");
    if (xr >= 0 && wr >= 0 && xr != wr)
      return c.bad_node("input " + std::to_string(x) + " has rank " + std::to_string(xr) + " but the weight has rank " +
                        std::to_string(wr));
    int64_t spatial = xr >= 0 ? xr - 2 : wr >= 0 ? wr - 2 : -1;
    if (spatial < 0 && ks) spatial = static_cast<int64_t>(ks->size());

    auto check_list = [&](const char* name, const std::vector<int64_t>* v, int64_t lo, int64_t count,
                          const std::string& what) -> Status {
      if (!v) return Status::ok();
      for (int64_t e : *v) {
        if (e < lo) return c.bad_attr(name, what);
        if (e > kMaxExtent) return c.bad_attr(name, "every value must be at most 2^31");
      }
      if (spatial >= 0 && static_cast<int64_t>(v->size()) != count) {
        return c.bad_attr(name, "has " + std::to_string(v->size()) + " values; input " + std::to_string(x) + " has " +
                                    std::to_string(spatial) + " spatial axes, so it needs " + std::to_string(count));
      }
      return Status::ok();
    };
    KEEL_CHECK_OK(check_list("kernel_shape", ks, 1, spatial, "every kernel dim must be >= 1"));
    KEEL_CHECK_OK(check_list("strides", strides, 1, spatial, "every stride must be >= 1"));
    KEEL_CHECK_OK(check_list("dilations", dil, 1, spatial, "every dilation must be >= 1"));
    KEEL_CHECK_OK(check_list("pads", pads, 0, 2 * spatial, "every pad must be >= 0"));
    if (kind == ConvKind::kConvTranspose) {
      KEEL_CHECK_OK(check_list("output_padding", outpad, 0, spatial, "every output padding must be >= 0"));
      if (outshape) {
        for (int64_t e : *outshape)
          if (e < 0 || e > kMaxExtent) return c.bad_attr("output_shape", "every dim must be in [0, 2^31]");
        if (spatial >= 0 && static_cast<int64_t>(outshape->size()) != spatial &&
            static_cast<int64_t>(outshape->size()) != spatial + 2)
          return c.bad_attr("output_shape", "needs " + std::to_string(spatial) + " values (one per spatial axis)");
      }
    }
    if ((kind == ConvKind::kPool || kind == ConvKind::kUnpool) && !ks)
      return c.bad_node("attribute kernel_shape is required");
    if (kind == ConvKind::kUnpool) {
      // MaxUnpool's indices (input 1) have X's shape (ONNX 1.12's inference reads them by X's rank); a constant
      // output_shape (input 2) has one non-negative value per axis of X.
      const int ir = c.rank(1);
      if (xr >= 0 && ir >= 0 && ir != xr)
        return c.bad_node("the indices (input 1) have rank " + std::to_string(ir) + " but X has rank " +
                          std::to_string(xr));
      for (int d = 0; xr >= 0 && ir >= 0 && d < xr; ++d)
        if (c.dim(0, d) >= 0 && c.dim(1, d) >= 0 && c.dim(0, d) != c.dim(1, d))
          return c.bad_node("the indices (input 1) must have X's shape");
      if (const auto* os = c.const_ints(2)) {
        if (xr >= 0 && static_cast<int64_t>(os->size()) != xr)
          return c.bad_input(2, "output_shape", *os, "needs " + std::to_string(xr) + " values (X's rank)");
        for (int64_t e : *os)
          if (e < 0 || e > (int64_t{1} << 40)) return c.bad_input(2, "output_shape", *os, "every dim must be >= 0");
      }
    }
    KEEL_CHECK_OK(flag("ceil_mode")(c));
    KEEL_CHECK_OK(flag("storage_order")(c));
    KEEL_CHECK_OK(flag("count_include_pad")(c));

    std::optional<int64_t> group;
    KEEL_CHECK_OK(c.int_attr("group", &group));
    if (group && (*group < 1 || *group > kMaxExtent)) return c.bad_attr("group", "must be >= 1");
    const int64_t g = group.value_or(1);
    const int64_t cin = c.dim(x, 1);
    if (group && cin >= 0 && cin % g != 0)
      return c.bad_attr("group", "must divide the " + std::to_string(cin) + " input channels");
    if (w) {
      const int64_t w0 = c.dim(*w, 0), w1 = c.dim(*w, 1);
      if (kind == ConvKind::kConv) {
        if (group && w0 >= 0 && w0 % g != 0)
          return c.bad_attr("group", "must divide the " + std::to_string(w0) + " output channels (the weight's dim 0)");
        if (cin >= 0 && w1 >= 0 && w1 * g != cin)
          return c.bad_node("the weight's dim 1 (" + std::to_string(w1) + ") times group (" + std::to_string(g) +
                            ") must equal the input channels (" + std::to_string(cin) + ")");
      } else if (kind == ConvKind::kConvTranspose) {
        if (cin >= 0 && w0 >= 0 && w0 != cin)
          return c.bad_node("the weight's dim 0 (" + std::to_string(w0) + ") must equal the input channels (" +
                            std::to_string(cin) + ")");
      }
      const int br = bias ? c.rank(*bias) : -1;
      if (br >= 0) {
        const int64_t m = kind == ConvKind::kConv ? w0 : w1 >= 0 ? w1 * g : -1, bl = c.dim(*bias, 0);
        if (br != 1 || (m >= 0 && bl >= 0 && bl != m))
          return c.bad_node("the bias (input " + std::to_string(*bias) + ") must hold one value per output channel (" +
                            (m >= 0 ? std::to_string(m) : std::string("[M]")) + "), got rank " + std::to_string(br) +
                            (br == 1 ? " with " + std::to_string(bl) + " values" : std::string()));
      }
    }
    if (spatial < 0) return Status::ok();

    // Per spatial axis: kernel vs weight, output extent >= 0, output padding below stride or dilation.
    for (int64_t i = 0; i < spatial; ++i) {
      const size_t si = static_cast<size_t>(i);
      int64_t k = ks ? (*ks)[si] : -1;
      const int64_t wk = w ? c.dim(*w, 2 + i) : -1;
      if (ks && wk >= 0 && k != wk)
        return c.bad_attr("kernel_shape",
                          "dim " + std::to_string(i) + " differs from the weight's (" + std::to_string(wk) + ")");
      if (k < 0) k = wk;
      const int64_t s = strides ? (*strides)[si] : 1, d = dil ? (*dil)[si] : 1;
      const int64_t pb = pads ? (*pads)[si] : 0, pe = pads ? (*pads)[si + static_cast<size_t>(spatial)] : 0;
      if (outpad && (*outpad)[si] >= std::max(s, d))
        return c.bad_attr("output_padding", "every output padding must be smaller than its stride or dilation");
      if (k < 0) continue;
      const int64_t eff = (k - 1) * d + 1;
      if (kind == ConvKind::kPool && explicit_pads && (pb >= eff || pe >= eff))
        return c.bad_attr("pads", "a pad must be smaller than the kernel (" + std::to_string(eff) + " along axis " +
                                      std::to_string(i) + ")");
      const int64_t in = c.dim(x, 2 + i);
      if (in < 0 || !explicit_pads) continue;
      if (kind == ConvKind::kConv || kind == ConvKind::kPool) {
        if (in + pb + pe < eff)
          return c.bad_node("the kernel spans " + std::to_string(eff) + " elements (kernel " + std::to_string(k) +
                            ", dilation " + std::to_string(d) + ") along spatial axis " + std::to_string(i) +
                            ", more than the padded input (" + std::to_string(in) + " + " + std::to_string(pb) + " + " +
                            std::to_string(pe) + ")");
      } else if (kind == ConvKind::kConvTranspose && !outshape) {
        const int64_t op = outpad ? (*outpad)[si] : 0;
        if (in > 0 && s * (in - 1) + op + eff - pb - pe < 0)
          return c.bad_attr("pads", "the pads remove more than the output has along spatial axis " + std::to_string(i));
      }
    }
    return Status::ok();
  };
}

// --- op-specific rules --------------------------------------------------------------------------------------------

Rule transpose_perm() {
  return [](const Ctx& c) -> Status {
    const std::vector<int64_t>* p = nullptr;
    KEEL_CHECK_OK(c.ints("perm", &p));
    if (!p) return Status::ok();
    const int r = c.rank(0);
    const int64_t n = r >= 0 ? r : static_cast<int64_t>(p->size());
    if (r >= 0 && static_cast<int64_t>(p->size()) != r)
      return c.bad_attr("perm", "needs " + std::to_string(r) + " values (the input's rank)");
    std::vector<bool> seen(static_cast<size_t>(std::min<int64_t>(n, 1 << 20)), false);
    for (int64_t a : *p) {
      if (a < 0 || a >= n || a >= static_cast<int64_t>(seen.size()))
        return c.bad_attr("perm", "is not a permutation of 0.." + std::to_string(n - 1));
      if (seen[static_cast<size_t>(a)])
        return c.bad_attr("perm", "is not a permutation (" + std::to_string(a) + " repeats)");
      seen[static_cast<size_t>(a)] = true;
    }
    return Status::ok();
  };
}

// DepthToSpace / SpaceToDepth: blocksize >= 1; rank 4; the channels (or H, W) divisible.
Rule block_size(bool depth_to_space) {
  return [=](const Ctx& c) -> Status {
    std::optional<int64_t> b;
    KEEL_CHECK_OK(c.int_attr("blocksize", &b));
    if (!b) return c.bad_node("attribute blocksize is required");
    if (*b < 1 || *b > 65536) return c.bad_attr("blocksize", "must be in [1, 65536]");
    const int r = c.rank(0);
    if (r >= 0 && r != 4) return c.bad_node("input 0 has rank " + std::to_string(r) + "; it needs rank 4 (N, C, H, W)");
    if (depth_to_space) {
      const int64_t ch = c.dim(0, 1);
      if (ch >= 0 && ch % (*b * *b) != 0)
        return c.bad_attr("blocksize", "its square must divide the " + std::to_string(ch) + " input channels");
    } else {
      for (int64_t d : {c.dim(0, 2), c.dim(0, 3)})
        if (d >= 0 && d % *b != 0)
          return c.bad_attr("blocksize", "must divide the input's height and width (" + std::to_string(d) + ")");
    }
    return Status::ok();
  };
}

// Split: the axis, and the split sizes (attribute, or constant input 1) >= 0, summing to the axis' dim, one per output.
Rule split_rule() {
  return [](const Ctx& c) -> Status {
    KEEL_CHECK_OK(axis_attr("axis", 0, 0)(c));
    const std::vector<int64_t>* v = nullptr;
    KEEL_CHECK_OK(c.ints("split", &v));
    bool from_input = false;
    if (!v) {
      v = c.const_ints(1);
      from_input = v != nullptr;
    }
    if (!v) return Status::ok();
    auto fail = [&](const std::string& why) {
      return from_input ? c.bad_input(1, "split", *v, why) : c.bad_attr("split", why);
    };
    int64_t sum = 0;
    for (int64_t s : *v) {
      if (s < 0 || s > (int64_t{1} << 40)) return fail("every size must be >= 0");
      sum += s;
    }
    if (c.node().num_outputs != 0 && v->size() != c.node().num_outputs)
      return fail("has " + std::to_string(v->size()) + " sizes for " + std::to_string(c.node().num_outputs) +
                  " outputs");
    std::optional<int64_t> axis;
    KEEL_CHECK_OK(c.int_attr("axis", &axis));
    const int r = c.rank(0);
    if (r > 0) {
      const int64_t a = axis.value_or(0) < 0 ? axis.value_or(0) + r : axis.value_or(0);
      const int64_t d = c.dim(0, a);
      if (d >= 0 && sum != d)
        return fail("the sizes sum to " + std::to_string(sum) + ", but the axis has " + std::to_string(d));
    }
    return Status::ok();
  };
}

// Squeeze: axes in range, unique, and of dim 1 where known.
Rule squeeze_rule() {
  return [](const Ctx& c) -> Status {
    KEEL_CHECK_OK(axes_list("axes", 1, 0)(c));
    const std::vector<int64_t>* v = nullptr;
    KEEL_CHECK_OK(c.ints("axes", &v));
    const bool from_input = !v && c.const_ints(1);
    if (!v) v = c.const_ints(1);
    const int r = c.rank(0);
    if (!v || r < 0) return Status::ok();
    for (int64_t a : *v) {
      const int64_t d = c.dim(0, a < 0 ? a + r : a);
      if (d >= 0 && d != 1) {
        const std::string why = "axis " + std::to_string(a) + " has dim " + std::to_string(d) + ", not 1";
        return from_input ? c.bad_input(1, "axes", *v, why) : c.bad_attr("axes", why);
      }
    }
    return Status::ok();
  };
}

// A constant integer input whose values must be >= lo (Tile's repeats, ConstantOfShape's shape, TopK's K, ...).
Rule input_min(size_t i, std::string what, int64_t lo, int64_t hi = INT64_MAX) {
  return [=](const Ctx& c) -> Status {
    const std::vector<int64_t>* v = c.const_ints(i);
    if (!v) return Status::ok();
    for (int64_t x : *v)
      if (x < lo || x > hi)
        return c.bad_input(i, what, *v,
                           hi == INT64_MAX
                               ? "every value must be >= " + std::to_string(lo)
                               : "every value must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return Status::ok();
  };
}

// Tile: one repeat per input axis, each >= 0.
Rule tile_rule() {
  return [](const Ctx& c) -> Status {
    KEEL_CHECK_OK(input_min(1, "repeats", 0)(c));
    const std::vector<int64_t>* v = c.const_ints(1);
    const int r = c.rank(0);
    if (v && r >= 0 && static_cast<int64_t>(v->size()) != r)
      return c.bad_input(1, "repeats", *v, "needs " + std::to_string(r) + " values (the input's rank)");
    return Status::ok();
  };
}

// TopK: axis in range; K (input 1, or the attribute before opset 10) in [0, dim].
Rule topk_rule() {
  return [](const Ctx& c) -> Status {
    KEEL_CHECK_OK(axis_attr("axis", 0, -1)(c));
    KEEL_CHECK_OK(flag("largest")(c));
    KEEL_CHECK_OK(flag("sorted")(c));
    std::optional<int64_t> k;
    KEEL_CHECK_OK(c.int_attr("k", &k));
    bool from_input = false;
    if (!k && c.const_ints(1) && c.const_ints(1)->size() == 1) {
      k = c.const_ints(1)->front();
      from_input = true;
    }
    if (!k) return Status::ok();
    std::optional<int64_t> axis;
    KEEL_CHECK_OK(c.int_attr("axis", &axis));
    const int r = c.rank(0);
    const int64_t a = axis.value_or(-1) < 0 ? axis.value_or(-1) + r : axis.value_or(-1);
    const int64_t d = r > 0 ? c.dim(0, a) : -1;
    if (*k < 0 || (d >= 0 && *k > d)) {
      const std::string why = d >= 0 ? "K must be in [0, " + std::to_string(d) + "] (the axis' dim)" : "K must be >= 0";
      return from_input ? c.bad_input(1, "K", {*k}, why) : c.bad_attr("k", why);
    }
    return Status::ok();
  };
}

// Pad: the mode, the pads (attribute before opset 11, constant input 1 after): 2 x rank values; negative pads crop at
// most the dim; reflect needs pads below the dim, edge a non-empty axis.
Rule pad_rule() {
  return [](const Ctx& c) -> Status {
    std::optional<std::string> mode;
    KEEL_CHECK_OK(c.string_attr("mode", &mode));
    if (mode && *mode != "constant" && *mode != "reflect" && *mode != "edge")
      return c.bad_attr("mode", "must be one of constant, reflect, edge");
    const std::vector<int64_t>* v = nullptr;
    KEEL_CHECK_OK(c.ints("pads", &v));
    bool from_input = false;
    if (!v) {
      v = c.const_ints(1);
      from_input = v != nullptr;
    }
    if (!v || c.const_ints(3)) return Status::ok();  // axes (opset 18) are not in Keel's opsets
    auto fail = [&](const std::string& why) {
      return from_input ? c.bad_input(1, "pads", *v, why) : c.bad_attr("pads", why);
    };
    const int r = c.rank(0);
    if (r < 0) return Status::ok();
    if (static_cast<int64_t>(v->size()) != 2 * r)
      return fail("needs " + std::to_string(2 * r) + " values (2 x the input's rank)");
    for (int i = 0; i < r; ++i) {
      const int64_t b = (*v)[static_cast<size_t>(i)], e = (*v)[static_cast<size_t>(i + r)], d = c.dim(0, i);
      if (b > kMaxExtent || e > kMaxExtent || b < -kMaxExtent || e < -kMaxExtent)
        return fail("a pad is out of range (|pad| <= 2^31)");
      if (d < 0) continue;
      if (d + b + e < 0)
        return fail("the pads of axis " + std::to_string(i) + " remove more than its " + std::to_string(d) +
                    " elements");
      const std::string m = mode.value_or("constant");
      if (m == "reflect" && (b >= d || e >= d) && (b > 0 || e > 0))
        return fail("reflect padding of axis " + std::to_string(i) + " must be smaller than its dim (" +
                    std::to_string(d) + ")");
      if (m == "edge" && d == 0 && (b > 0 || e > 0)) return fail("edge padding of the empty axis " + std::to_string(i));
    }
    return Status::ok();
  };
}

// Slice: axes (attribute before opset 10, constant input 3 after) in range and unique; steps (input 4) non-zero;
// starts/ends as many as the axes.
Rule slice_rule() {
  return [](const Ctx& c) -> Status {
    KEEL_CHECK_OK(axes_list("axes", 3, 0)(c));
    if (const auto* steps = c.const_ints(4))
      for (int64_t s : *steps)
        if (s == 0) return c.bad_input(4, "steps", *steps, "a step must not be 0");
    const std::vector<int64_t>*starts = nullptr, *ends = nullptr, *axes = nullptr;
    KEEL_CHECK_OK(c.ints("starts", &starts));
    KEEL_CHECK_OK(c.ints("ends", &ends));
    KEEL_CHECK_OK(c.ints("axes", &axes));
    if (!starts) starts = c.const_ints(1);
    if (!ends) ends = c.const_ints(2);
    if (!axes) axes = c.const_ints(3);
    if (starts && ends && starts->size() != ends->size())
      return c.bad_node("starts has " + std::to_string(starts->size()) + " values but ends has " +
                        std::to_string(ends->size()));
    if (starts && axes && starts->size() != axes->size())
      return c.bad_node("starts has " + std::to_string(starts->size()) + " values but axes has " +
                        std::to_string(axes->size()));
    const int r = c.rank(0);
    if (starts && !axes && r >= 0 && static_cast<int64_t>(starts->size()) > r)
      return c.bad_node("starts has " + std::to_string(starts->size()) + " values for an input of rank " +
                        std::to_string(r));
    return Status::ok();
  };
}

// Recurrent ops: hidden_size, direction, and as many activations as the op and the directions need.
Rule rnn_rule(int activations_per_direction) {
  return [=](const Ctx& c) -> Status {
    std::optional<int64_t> hidden;
    KEEL_CHECK_OK(c.int_attr("hidden_size", &hidden));
    if (hidden && (*hidden < 1 || *hidden > (int64_t{1} << 24)))
      return c.bad_attr("hidden_size", "must be in [1, 2^24]");
    std::optional<std::string> dir;
    KEEL_CHECK_OK(c.string_attr("direction", &dir));
    if (dir && *dir != "forward" && *dir != "reverse" && *dir != "bidirectional")
      return c.bad_attr("direction", "must be one of forward, reverse, bidirectional");
    KEEL_CHECK_OK(flag("layout")(c));
    KEEL_CHECK_OK(flag("input_forget")(c));
    const Attribute* acts = c.attr("activations");
    const size_t dirs = dir && *dir == "bidirectional" ? 2 : 1;
    if (acts) {
      if (acts->kind != AttrKind::kStrings) return c.bad_attr("activations", "must be a list of strings");
      if (acts->strings.size() != static_cast<size_t>(activations_per_direction) * dirs)
        return c.bad_attr("activations", "needs " + std::to_string(activations_per_direction * dirs) + " names (" +
                                             std::to_string(activations_per_direction) + " per direction)");
      static const std::set<std::string> kKnown = {
          "Relu",       "Tanh",        "Sigmoid", "Affine",   "LeakyRelu", "ThresholdedRelu",
          "ScaledTanh", "HardSigmoid", "Elu",     "Softsign", "Softplus"};
      for (const auto& a : acts->strings)
        if (!kKnown.count(a)) return c.bad_attr("activations", "'" + a + "' is not an activation ONNX defines");
    }
    for (const char* name : {"activation_alpha", "activation_beta"}) {
      const Attribute* a = c.attr(name);
      if (a && a->kind == AttrKind::kFloats && acts && a->floats.size() > acts->strings.size())
        return c.bad_attr(name, "has more values than there are activations");
    }
    // The weight's dim 1 is (gates x hidden_size): inference and kernels slice it by hidden_size.
    const int64_t gates = activations_per_direction == 1 ? 1 : activations_per_direction == 2 ? 3 : 4;
    const int64_t w1 = c.dim(1, 1);
    if (hidden && w1 >= 0 && w1 != gates * *hidden)
      return c.bad_attr("hidden_size", "the weight's dim 1 (" + std::to_string(w1) + ") must be " +
                                           std::to_string(gates) + " x hidden_size");
    const int64_t w0 = c.dim(1, 0);
    if (w0 >= 0 && w0 != static_cast<int64_t>(dirs))
      return c.bad_node("the weight's dim 0 (" + std::to_string(w0) + ") must be the number of directions (" +
                        std::to_string(dirs) + ")");
    return Status::ok();
  };
}

// Resize / Upsample: modes, and constant scales > 0 (Upsample-7's scales attribute: one per input axis).
Rule resize_rule() {
  return [](const Ctx& c) -> Status {
    KEEL_CHECK_OK(one_of("mode", {"nearest", "linear", "cubic", "bilinear"})(c));
    KEEL_CHECK_OK(
        one_of("coordinate_transformation_mode", {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                                  "tf_half_pixel_for_nn", "tf_crop_and_resize"})(c));
    KEEL_CHECK_OK(one_of("nearest_mode", {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})(c));
    KEEL_CHECK_OK(flag("exclude_outside")(c));
    KEEL_CHECK_OK(positive_float("scales")(c));
    const Attribute* s = c.attr("scales");
    const int r = c.rank(0);
    if (s && s->kind == AttrKind::kFloats && r >= 0 && static_cast<int64_t>(s->floats.size()) != r)
      return c.bad_attr("scales", "needs " + std::to_string(r) + " values (the input's rank)");
    return Status::ok();
  };
}

// OneHot: axis against the output rank (input rank + 1); a constant depth >= 1.
Rule onehot_rule() {
  return [](const Ctx& c) -> Status {
    KEEL_CHECK_OK(axis_attr("axis", 0, std::nullopt, 1, 1)(c));
    const std::vector<int64_t>* d = c.const_ints(1);
    if (d && d->size() == 1 && d->front() < 1) return c.bad_input(1, "depth", *d, "depth must be >= 1");
    return Status::ok();
  };
}

// GatherND / ScatterND: batch_dims in [0, min(rank data, rank indices)).
Rule batch_dims_rule() {
  return [](const Ctx& c) -> Status {
    std::optional<int64_t> b;
    KEEL_CHECK_OK(c.int_attr("batch_dims", &b));
    if (!b) return Status::ok();
    if (*b < 0) return c.bad_attr("batch_dims", "must be >= 0");
    const int r0 = c.rank(0), r1 = c.rank(1);
    if (r0 >= 0 && r1 >= 0 && *b >= std::min(r0, r1))
      return c.bad_attr("batch_dims", "must be smaller than the ranks of data (" + std::to_string(r0) +
                                          ") and indices (" + std::to_string(r1) + ")");
    return Status::ok();
  };
}

// ReverseSequence: rank >= 2, batch_axis and time_axis in {0, 1} and different.
Rule reverse_sequence_rule() {
  return [](const Ctx& c) -> Status {
    std::optional<int64_t> b, t;
    KEEL_CHECK_OK(c.int_attr("batch_axis", &b));
    KEEL_CHECK_OK(c.int_attr("time_axis", &t));
    if (b && *b != 0 && *b != 1) return c.bad_attr("batch_axis", "must be 0 or 1");
    if (t && *t != 0 && *t != 1) return c.bad_attr("time_axis", "must be 0 or 1");
    if (b.value_or(1) == t.value_or(0)) return c.bad_attr("time_axis", "must differ from batch_axis");
    const int r = c.rank(0);
    if (r >= 0 && r < 2) return c.bad_node("input 0 has rank " + std::to_string(r) + "; it needs rank 2 or more");
    return Status::ok();
  };
}

// Range: a constant delta of 0 would divide by zero (in inference and in the kernel).
Rule range_rule() {
  return [](const Ctx& c) -> Status {
    const std::vector<int64_t>* d = c.const_ints(2);
    if (d && d->size() == 1 && d->front() == 0) return c.bad_input(2, "delta", *d, "delta must not be 0");
    return Status::ok();
  };
}

// CumSum: the constant axis input in range.
Rule cumsum_rule() {
  return [](const Ctx& c) -> Status {
    KEEL_CHECK_OK(flag("exclusive")(c));
    KEEL_CHECK_OK(flag("reverse")(c));
    const std::vector<int64_t>* a = c.const_ints(1);
    const int r = c.rank(0);
    if (a && a->size() == 1 && r >= 0 && !axis_ok(a->front(), r, 0))
      return c.bad_input(
          1, "axis", *a,
          "out of range for input 0 of rank " + std::to_string(r) + " (valid: " + axis_range(r, 0) + ")");
    return Status::ok();
  };
}

// QuantizeLinear / DequantizeLinear: the axis matters (and is checked) only for a per-axis (1-D) scale.
Rule per_axis_quant() {
  return [](const Ctx& c) -> Status {
    if (c.rank(1) != 1) return Status::ok();
    KEEL_CHECK_OK(axis_attr("axis", 0, 1)(c));
    std::optional<int64_t> axis;
    KEEL_CHECK_OK(c.int_attr("axis", &axis));
    const int r = c.rank(0);
    const int64_t n = c.dim(1, 0);
    if (r > 0 && n >= 0) {
      const int64_t a = axis.value_or(1) < 0 ? axis.value_or(1) + r : axis.value_or(1);
      const int64_t d = c.dim(0, a);
      if (d >= 0 && n != d)
        return c.bad_node("the scale has " + std::to_string(n) + " values but axis " + std::to_string(a) + " has " +
                          std::to_string(d));
    }
    return Status::ok();
  };
}

// A scalar constant input that must be >= 1 (frame_step, frame_length, dft_length): rank 0 (or one value) when known.
Status positive_scalar_input(const Ctx& c, size_t i, const std::string& what) {
  if (!c.present(i)) return Status::ok();
  const int r = c.rank(i);
  if (r > 1 || (r == 1 && c.dim(i, 0) > 1))
    return c.bad_node("input " + std::to_string(i) + " (" + what + ") must be a scalar");
  const std::vector<int64_t>* v = c.const_ints(i);
  if (v && v->size() == 1 && v->front() < 1) return c.bad_input(i, what, *v, "must be >= 1");
  return Status::ok();
}

// A signal of DFT / STFT: [batch, ..., 1 or 2] (real or complex).
Status signal_input(const Ctx& c, int want_rank) {
  const int r = c.rank(0);
  if (r < 0) return Status::ok();
  if (want_rank > 0 ? r != want_rank : r < 2)
    return c.bad_node("the signal (input 0) has rank " + std::to_string(r) + "; it needs " +
                      (want_rank > 0 ? "rank " + std::to_string(want_rank) + " ([batch, length, 1 or 2])"
                                     : std::string("rank 2 or more ([batch, ..., 1 or 2])")));
  const int64_t last = c.dim(0, r - 1);
  if (last >= 0 && last != 1 && last != 2)
    return c.bad_node("the signal's last dim is " + std::to_string(last) + "; it must be 1 (real) or 2 (complex)");
  return Status::ok();
}

Rule stft_rule() {
  return [](const Ctx& c) -> Status {
    KEEL_CHECK_OK(flag("onesided")(c));
    KEEL_CHECK_OK(signal_input(c, 3));
    KEEL_CHECK_OK(positive_scalar_input(c, 1, "frame_step"));
    KEEL_CHECK_OK(positive_scalar_input(c, 3, "frame_length"));
    if (c.present(2) && c.rank(2) >= 0 && c.rank(2) != 1)
      return c.bad_node("the window (input 2) has rank " + std::to_string(c.rank(2)) + "; it needs rank 1");
    const int64_t len = c.dim(0, 1);
    int64_t frame = c.present(2) ? c.dim(2, 0) : -1;
    if (const auto* v = c.const_ints(3); v && v->size() == 1) frame = v->front();
    if (len >= 0 && frame > len)
      return c.bad_node("the frame (" + std::to_string(frame) + ") is longer than the signal (" + std::to_string(len) +
                        ")");
    return Status::ok();
  };
}

Rule dft_rule() {
  return [](const Ctx& c) -> Status {
    KEEL_CHECK_OK(flag("onesided")(c));
    KEEL_CHECK_OK(flag("inverse")(c));
    KEEL_CHECK_OK(signal_input(c, 0));
    KEEL_CHECK_OK(positive_scalar_input(c, 1, "dft_length"));
    // The axis is one of the signal axes: not the batch... nor the last (real/imaginary) one.
    const int r = c.rank(0);
    std::optional<int64_t> axis;
    KEEL_CHECK_OK(c.int_attr("axis", &axis));
    if (axis && r >= 2 && (*axis < -r || *axis > r - 2 || *axis == -1))
      return c.bad_attr("axis", "out of range for a signal of rank " + std::to_string(r) + " (valid: [" +
                                    std::to_string(-r) + ", -2] and [0, " + std::to_string(r - 2) + "])");
    return Status::ok();
  };
}

// A `shape` attribute (RandomNormal, RandomUniform) of dims in [0, 2^40].
Rule shape_attr() { return ints_in("shape", 0, int64_t{1} << 40, "every dim must be >= 0"); }

// The rule table: ai.onnx ops by name, keel-domain ops as "keel.Name".
const std::unordered_map<std::string, std::vector<Rule>>& rules() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string, std::vector<Rule>>();
    auto& r = *t;
    r["Conv"] = {conv_like(ConvKind::kConv, 0, 1, 2)};
    r["ConvInteger"] = {conv_like(ConvKind::kConv, 0, 1)};
    r["QLinearConv"] = {conv_like(ConvKind::kConv, 0, 3, 8)};
    r["ConvTranspose"] = {conv_like(ConvKind::kConvTranspose, 0, 1, 2)};
    r["keel.FusedConv"] = {conv_like(ConvKind::kConv, 0, 1, 2)};
    r["keel.FusedConvMaxPool"] = {conv_like(ConvKind::kConv, 0, 1, 2),
                                  ints_in("pool_kernel_shape", 1, 256, "every pool window dim must be in [1, 256]"),
                                  ints_in("pool_strides", 1, kMaxExtent, "every pool stride must be >= 1")};
    for (const char* p : {"MaxPool", "AveragePool", "LpPool"}) r[p] = {conv_like(ConvKind::kPool, 0, std::nullopt)};
    r["LpPool"].push_back(int_in("p", 1, 64));
    r["GlobalLpPool"] = {int_in("p", 1, 64)};
    r["MaxUnpool"] = {conv_like(ConvKind::kUnpool, 0, std::nullopt)};
    r["MaxRoiPool"] = {ints_in("pooled_shape", 1, kMaxExtent, "every pooled dim must be >= 1"),
                       positive_float("spatial_scale")};
    r["RoiAlign"] = {int_in("output_height", 1, kMaxExtent), int_in("output_width", 1, kMaxExtent),
                     int_in("sampling_ratio", 0, 1 << 16), one_of("mode", {"avg", "max"}),
                     one_of("coordinate_transformation_mode", {"half_pixel", "output_half_pixel"})};
    for (const char* p : {"Softmax", "LogSoftmax", "Hardmax"}) r[p] = {softmax_axis()};
    r["Concat"] = {axis_attr("axis", 0)};
    r["Gather"] = {axis_attr("axis", 0, 0)};
    r["GatherElements"] = {axis_attr("axis", 0, 0)};
    r["ScatterElements"] = {axis_attr("axis", 0, 0), one_of("reduction", {"none", "add", "mul"})};
    r["Scatter"] = {axis_attr("axis", 0, 0)};
    r["ScatterND"] = {one_of("reduction", {"none", "add", "mul"})};
    r["GatherND"] = {batch_dims_rule()};
    r["Flatten"] = {axis_attr("axis", 0, 1, 0, 1)};
    r["Split"] = {split_rule()};
    r["SplitToSequence"] = {axis_attr("axis", 0, 0), flag("keepdims")};
    for (const char* p : {"ArgMax", "ArgMin"})
      r[p] = {axis_attr("axis", 0, 0), flag("keepdims"), flag("select_last_index")};
    r["Compress"] = {axis_attr("axis", 0)};
    r["LayerNormalization"] = {axis_attr("axis", 0, -1)};
    r["keel.LayerNormalization"] = {axis_attr("axis", 0, -1)};
    for (const char* p : {"QuantizeLinear", "DequantizeLinear"}) r[p] = {per_axis_quant()};
    r["LpNormalization"] = {axis_attr("axis", 0, -1), int_in("p", 1, 2)};
    r["OneHot"] = {onehot_rule()};
    r["ReverseSequence"] = {reverse_sequence_rule()};
    r["Unsqueeze"] = {axes_list("axes", 1, 0, /*grow=*/true)};
    r["Squeeze"] = {squeeze_rule()};
    for (const char* p : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                          "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})
      r[p] = {axes_list("axes", 1, 0), flag("keepdims"), flag("noop_with_empty_axes")};
    r["MeanVarianceNormalization"] = {axes_list("axes", std::nullopt, 0)};
    r["Transpose"] = {transpose_perm()};
    r["DepthToSpace"] = {block_size(true), one_of("mode", {"DCR", "CRD"})};
    r["SpaceToDepth"] = {block_size(false)};
    r["LRN"] = {int_in("size", 1, 1 << 20)};
    r["Upsample"] = {resize_rule()};
    r["Resize"] = {resize_rule()};
    r["Tile"] = {tile_rule()};
    r["Expand"] = {input_min(1, "shape", 0, int64_t{1} << 40)};
    r["ConstantOfShape"] = {input_min(0, "shape", 0, int64_t{1} << 40)};
    r["TopK"] = {topk_rule()};
    r["Pad"] = {pad_rule()};
    r["Slice"] = {slice_rule()};
    r["CumSum"] = {cumsum_rule()};
    r["Range"] = {range_rule()};
    r["RNN"] = {rnn_rule(1)};
    r["GRU"] = {rnn_rule(2), flag("linear_before_reset")};
    r["LSTM"] = {rnn_rule(3)};
    r["Cast"] = {dtype_attr("to"), flag("saturate")};
    for (const char* p : {"EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                          "Multinomial", "Bernoulli"})
      r[p] = {dtype_attr("dtype")};
    r["RandomNormal"].push_back(shape_attr());
    r["RandomUniform"].push_back(shape_attr());
    r["Multinomial"].push_back(int_in("sample_size", 1, 1 << 24));
    r["Gemm"] = {int_in("transA", 0, 1), int_in("transB", 0, 1)};
    r["keel.FusedGemm"] = {int_in("transA", 0, 1), int_in("transB", 0, 1)};
    r["Mod"] = {flag("fmod")};
    r["BitShift"] = {one_of("direction", {"LEFT", "RIGHT"})};
    r["NonMaxSuppression"] = {flag("center_point_box")};
    r["GridSample"] = {one_of("mode", {"bilinear", "nearest", "bicubic"}),
                       one_of("padding_mode", {"zeros", "border", "reflection"}), flag("align_corners")};
    r["DFT"] = {dft_rule()};
    r["STFT"] = {stft_rule()};
    r["Trilu"] = {flag("upper")};
    r["Reshape"] = {flag("allowzero")};
    r["ConcatFromSequence"] = {flag("new_axis")};
    return t;
  }();
  return *table;
}

std::string table_key(const std::string& domain, const std::string& op) {
  return domain.empty() || domain == "ai.onnx" ? op : domain + "." + op;
}

std::string node_label(const std::string& name, const std::string& op, size_t index) {
  return name.empty() ? "node #" + std::to_string(index) + " (" + op + ")" : "node \"" + name + "\" (" + op + ")";
}

// --- ONNX adapters ------------------------------------------------------------------------------------------------

// Attribute from an AttributeProto (the scalar and list kinds the rules read; others stay kUndefined-free stubs).
Attribute from_proto(const onnx::AttributeProto& a) {
  Attribute out;
  switch (a.type()) {
    case onnx::AttributeProto::INT:
      out.kind = AttrKind::kInt;
      out.i = a.i();
      break;
    case onnx::AttributeProto::FLOAT:
      out.kind = AttrKind::kFloat;
      out.f = a.f();
      break;
    case onnx::AttributeProto::STRING:
      out.kind = AttrKind::kString;
      out.s = a.s();
      break;
    case onnx::AttributeProto::INTS:
      out.kind = AttrKind::kInts;
      out.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case onnx::AttributeProto::FLOATS:
      out.kind = AttrKind::kFloats;
      out.floats.assign(a.floats().begin(), a.floats().end());
      break;
    case onnx::AttributeProto::STRINGS:
      out.kind = AttrKind::kStrings;
      out.strings.assign(a.strings().begin(), a.strings().end());
      break;
    case onnx::AttributeProto::TENSOR: out.kind = AttrKind::kTensor; break;
    case onnx::AttributeProto::GRAPH: out.kind = AttrKind::kGraph; break;
    default: out.kind = static_cast<AttrKind>(a.type()); break;
  }
  return out;
}

std::optional<Shape> shape_from_type(const onnx::TypeProto& t) {
  if (!t.has_tensor_type() || !t.tensor_type().has_shape()) return std::nullopt;
  Shape s;
  for (const auto& d : t.tensor_type().shape().dim()) s.push_back(d.has_dim_value() ? d.dim_value() : -1);
  return s;
}

// Small int32/int64 constants (the values the rules read); nullopt otherwise or when the data is malformed.
std::optional<std::vector<int64_t>> ints_from_proto(const onnx::TensorProto& t) {
  if (t.data_type() != onnx::TensorProto::INT64 && t.data_type() != onnx::TensorProto::INT32) return std::nullopt;
  if (t.data_location() == onnx::TensorProto::EXTERNAL) return std::nullopt;
  int64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0 || d > 64) return std::nullopt;
    n *= d;
  }
  if (n > 64) return std::nullopt;
  std::vector<int64_t> out;
  const size_t elem = t.data_type() == onnx::TensorProto::INT64 ? 8 : 4;
  if (t.has_raw_data()) {
    if (t.raw_data().size() != static_cast<size_t>(n) * elem) return std::nullopt;
    for (int64_t i = 0; i < n; ++i) {
      if (elem == 8) {
        int64_t v;
        std::memcpy(&v, t.raw_data().data() + i * 8, 8);
        out.push_back(v);
      } else {
        int32_t v;
        std::memcpy(&v, t.raw_data().data() + i * 4, 4);
        out.push_back(v);
      }
    }
  } else if (elem == 8) {
    if (t.int64_data_size() != n) return std::nullopt;
    out.assign(t.int64_data().begin(), t.int64_data().end());
  } else {
    if (t.int32_data_size() != n) return std::nullopt;
    out.assign(t.int32_data().begin(), t.int32_data().end());
  }
  return out;
}

std::optional<std::vector<int64_t>> ints_from_tensor(const Tensor& t) {
  if (!t.defined() || !t.location().is_host() || t.numel() > 64) return std::nullopt;
  std::vector<int64_t> out;
  if (t.dtype() == DType::kI64) {
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.data<int64_t>()[i]);
  } else if (t.dtype() == DType::kI32) {
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.data<int32_t>()[i]);
  } else {
    return std::nullopt;
  }
  return out;
}

struct ProtoScope {
  std::unordered_map<std::string, std::optional<Shape>> shapes;
  std::unordered_map<std::string, std::vector<int64_t>> ints;
};

Status check_proto_graph(const onnx::GraphProto& gp, const std::function<int32_t(const std::string&)>& opset,
                         ProtoScope& scope, int depth) {
  if (depth > 64) return invalid_argument("subgraphs nested too deeply");
  for (const auto& v : gp.input()) scope.shapes[v.name()] = shape_from_type(v.type());
  for (const auto& v : gp.value_info()) scope.shapes[v.name()] = shape_from_type(v.type());
  for (const auto& v : gp.output()) scope.shapes.emplace(v.name(), shape_from_type(v.type()));
  for (const auto& t : gp.initializer()) {
    scope.shapes[t.name()] = Shape(t.dims().begin(), t.dims().end());
    if (auto v = ints_from_proto(t)) scope.ints[t.name()] = std::move(*v);
  }
  for (int ni = 0; ni < gp.node_size(); ++ni) {
    const auto& n = gp.node(ni);
    const std::string domain = n.domain() == "ai.onnx" ? std::string() : n.domain();
    if (n.op_type() == "Constant" && domain.empty() && n.output_size() == 1) {
      for (const auto& a : n.attribute())
        if (a.name() == "value" && a.has_t())
          if (auto v = ints_from_proto(a.t())) scope.ints[n.output(0)] = std::move(*v);
    }
    if (rules().count(table_key(domain, n.op_type()))) {
      std::map<std::string, Attribute> attrs;
      for (const auto& a : n.attribute()) attrs[a.name()] = from_proto(a);
      AttrCheckNode view;
      view.op_type = n.op_type();
      view.domain = domain;
      view.opset = opset ? opset(domain) : 0;
      view.label = node_label(n.name(), n.op_type(), static_cast<size_t>(ni));
      view.attr = [&attrs](const std::string& name) -> const Attribute* {
        auto it = attrs.find(name);
        return it == attrs.end() ? nullptr : &it->second;
      };
      for (const auto& in : n.input()) {
        view.input_present.push_back(!in.empty());
        auto s = scope.shapes.find(in);
        view.input_shapes.push_back(in.empty() || s == scope.shapes.end() ? std::nullopt : s->second);
        auto v = scope.ints.find(in);
        view.input_ints.push_back(in.empty() || v == scope.ints.end() ? std::nullopt : std::optional(v->second));
      }
      view.num_outputs = static_cast<size_t>(n.output_size());
      KEEL_RETURN_IF_ERROR(check_node_attributes(view), "");
    }
    for (const auto& a : n.attribute()) {
      if (a.has_g())
        KEEL_RETURN_IF_ERROR(check_proto_graph(a.g(), opset, scope, depth + 1), node_label(n.name(), n.op_type(), ni));
      for (const auto& g : a.graphs())
        KEEL_RETURN_IF_ERROR(check_proto_graph(g, opset, scope, depth + 1), node_label(n.name(), n.op_type(), ni));
    }
  }
  return Status::ok();
}

Status check_ir_graph(const Graph& g, std::vector<const Graph*>& outer, int depth, bool inferred_shapes) {
  if (depth > 64) return invalid_argument("subgraphs nested too deeply");
  // Without inferred shapes only graph inputs count: the value_info of other values may be stale (a pass that
  // shrank a weight has not re-inferred its consumers yet).
  auto usable = [&](const Graph& owner, const std::string& v) {
    return inferred_shapes || std::find(owner.inputs.begin(), owner.inputs.end(), v) != owner.inputs.end();
  };
  auto lookup_info = [&](const std::string& v) -> const ValueInfo* {
    if (const ValueInfo* vi = g.info(v)) return usable(g, v) ? vi : nullptr;
    for (auto it = outer.rbegin(); it != outer.rend(); ++it)
      if (const ValueInfo* vi = (*it)->info(v)) return usable(**it, v) ? vi : nullptr;
    return nullptr;
  };
  auto lookup_init = [&](const std::string& v) -> const Tensor* {
    if (auto it = g.initializers.find(v); it != g.initializers.end()) return &it->second;
    for (auto it = outer.rbegin(); it != outer.rend(); ++it)
      if (auto jt = (*it)->initializers.find(v); jt != (*it)->initializers.end()) return &jt->second;
    return nullptr;
  };
  ops::register_keel_schemas();
  const auto ids = g.node_ids();
  for (size_t ni = 0; ni < ids.size(); ++ni) {
    const Node* n = g.node(ids[ni]);
    // A required output left "" (ONNX allows that of optional ones only): a kernel writes every output its op
    // requires, and one without a value has no type to be made with (random gradients: LayerNormalization asked for
    // its Mean alone failed at run time with "output 0 of 'LayerNormalization_0' has no known dtype").
    if (std::any_of(n->outputs.begin(), n->outputs.end(), [](const std::string& o) { return o.empty(); })) {
      auto version = g.opsets.find(n->domain);
      const int32_t opset = version != g.opsets.end() ? version->second : (n->domain.empty() ? 17 : 1);
      if (const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(n->op_type, opset, n->domain)) {
        const auto& formal = schema->outputs();
        for (size_t i = 0; i < n->outputs.size() && i < formal.size(); ++i) {
          if (n->outputs[i].empty() && formal[i].GetOption() == onnx::OpSchema::Single)
            return invalid_argument(node_label(n->name, n->op_type, ni) + ": output " + std::to_string(i) + " (" +
                                    formal[i].GetName() + ") is required and has no name");
        }
      }
    }
    if (rules().count(table_key(n->domain, n->op_type))) {
      AttrCheckNode view;
      view.op_type = n->op_type;
      view.domain = n->domain;
      auto it = g.opsets.find(n->domain);
      view.opset = it != g.opsets.end() ? it->second : 0;
      view.label = node_label(n->name, n->op_type, ni);
      view.attr = [n](const std::string& name) { return n->attr(name); };
      for (const auto& in : n->inputs) {
        view.input_present.push_back(!in.empty());
        const Tensor* t = in.empty() ? nullptr : lookup_init(in);
        const ValueInfo* vi = in.empty() ? nullptr : lookup_info(in);
        if (t) {
          view.input_shapes.push_back(t->shape());
        } else {
          view.input_shapes.push_back(vi && vi->is_tensor() ? vi->shape : std::nullopt);
        }
        view.input_ints.push_back(t ? ints_from_tensor(*t) : std::nullopt);
      }
      view.num_outputs = n->outputs.size();
      KEEL_RETURN_IF_ERROR(check_node_attributes(view), "");
    }
    for (const auto& [name, a] : n->attrs) {
      if (a.kind == AttrKind::kGraph && a.g) {
        outer.push_back(&g);
        Status st = check_ir_graph(*a.g, outer, depth + 1, inferred_shapes);
        outer.pop_back();
        KEEL_RETURN_IF_ERROR(std::move(st), node_label(n->name, n->op_type, ni));
      }
    }
  }
  return Status::ok();
}

// The inference-time check: the node as ONNX's InferenceContext shows it.
void check_in_inference(const std::string& op, const std::string& domain, int32_t opset, onnx::InferenceContext& ctx) {
  std::map<std::string, Attribute> cache;
  AttrCheckNode view;
  view.op_type = op;
  view.domain = domain;
  view.opset = opset;
  view.attr = [&](const std::string& name) -> const Attribute* {
    auto it = cache.find(name);
    if (it != cache.end()) return &it->second;
    const onnx::AttributeProto* a = ctx.getAttribute(name);
    if (a == nullptr) return nullptr;
    return &cache.emplace(name, from_proto(*a)).first->second;
  };
  for (size_t i = 0; i < ctx.getNumInputs(); ++i) {
    const onnx::TypeProto* t = ctx.getInputType(i);
    view.input_present.push_back(t != nullptr);
    view.input_shapes.push_back(t ? shape_from_type(*t) : std::nullopt);
    const onnx::TensorProto* data = ctx.getInputData(i);
    view.input_ints.push_back(data ? ints_from_proto(*data) : std::nullopt);
  }
  view.num_outputs = ctx.getNumOutputs();
  Status st = check_node_attributes(view);
  if (!st.is_ok()) fail_shape_inference(st.message());
}

}  // namespace

Status check_node_attributes(const AttrCheckNode& node) {
  auto it = rules().find(table_key(node.domain, node.op_type));
  if (it == rules().end()) return Status::ok();
  Ctx c(node);
  for (const Rule& r : it->second) KEEL_CHECK_OK(r(c));
  return Status::ok();
}

Status check_graph_attributes(const Graph& graph, bool inferred_shapes) {
  std::vector<const Graph*> outer;
  return check_ir_graph(graph, outer, 0, inferred_shapes);
}

Status check_model_attributes(const onnx::GraphProto& graph, const std::function<int32_t(const std::string&)>& opset) {
  ProtoScope scope;
  return check_proto_graph(graph, opset, scope, 0);
}

void guard_onnx_inference_attributes() {
  static std::once_flag once;
  std::call_once(once, [] {
    ops::register_keel_schemas();
    for (const auto& [key, unused] : rules()) {
      const auto dot = key.find('.');
      const std::string domain = dot == std::string::npos ? std::string() : key.substr(0, dot);
      const std::string op = dot == std::string::npos ? key : key.substr(dot + 1);
      std::set<const onnx::OpSchema*> seen;
      const int last = domain.empty() ? 17 : 1;
      for (int v = 1; v <= last; ++v) {
        const onnx::OpSchema* schema =
            onnx::OpSchemaRegistry::Schema(op, v, domain.empty() ? onnx::ONNX_DOMAIN : domain);
        if (schema == nullptr || !seen.insert(schema).second || !schema->has_type_and_shape_inference_function())
          continue;
        const auto inner = schema->GetTypeAndShapeInferenceFunction();
        const int32_t since = schema->SinceVersion();
        // The registry keeps its schemas as (non-const) values; it only hands out const pointers.
        const_cast<onnx::OpSchema*>(schema)->TypeAndShapeInferenceFunction(
            [inner, op, domain, since](onnx::InferenceContext& ctx) {
              check_in_inference(op, domain, since, ctx);
              inner(ctx);
            });
      }
    }
  });
}

std::vector<std::string> attribute_checked_ops() {
  std::vector<std::string> out;
  for (const auto& [key, unused] : rules()) out.push_back(key);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace keel
