// keel/core/runtime/control_flow.cc — the executor-native ops: If, Loop, Scan, SequenceMap, sequence and optional
// ops. See control_flow.h.
#include "core/runtime/control_flow.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_map>

#include "core/runtime/session.h"

namespace keel {
namespace {

const std::set<std::string>& native_ops() {
  static const std::set<std::string> kOps = {"If",
                                             "Loop",
                                             "Scan",
                                             "SequenceMap",
                                             "SequenceConstruct",
                                             "SequenceEmpty",
                                             "SequenceInsert",
                                             "SequenceAt",
                                             "SequenceErase",
                                             "SequenceLength",
                                             "SplitToSequence",
                                             "ConcatFromSequence",
                                             "Optional",
                                             "OptionalHasElement",
                                             "OptionalGetElement"};
  return kOps;
}

std::string who(const Node& n) { return "node '" + n.name + "' (" + n.op_type + ")"; }

Status need_host(const Tensor& t, const std::string& what) {
  if (!t.location().is_host()) return internal_error(what + " is on " + t.location().to_string() + ", not the host");
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor helpers (host, dense, row-major)

// Scalar of any integer type as int64.
StatusOr<int64_t> scalar_int(const Tensor& t, const std::string& what) {
  KEEL_RETURN_IF_ERROR(need_host(t, what), "");
  if (t.numel() != 1)
    return invalid_argument(what + " must hold one value, it has shape " + shape_to_string(t.shape()));
  switch (t.dtype()) {
    case DType::kI64: return t.data<int64_t>()[0];
    case DType::kI32: return static_cast<int64_t>(t.data<int32_t>()[0]);
    case DType::kI16: return static_cast<int64_t>(t.data<int16_t>()[0]);
    case DType::kI8: return static_cast<int64_t>(t.data<int8_t>()[0]);
    case DType::kU8: return static_cast<int64_t>(t.data<uint8_t>()[0]);
    default: return invalid_argument(what + " must be an integer tensor, it is " + std::string(dtype_name(t.dtype())));
  }
}

StatusOr<bool> scalar_bool(const Tensor& t, const std::string& what) {
  KEEL_RETURN_IF_ERROR(need_host(t, what), "");
  if (t.numel() != 1)
    return invalid_argument(what + " must hold one value, it has shape " + shape_to_string(t.shape()));
  if (t.dtype() != DType::kBool)
    return invalid_argument(what + " must be bool, it is " + std::string(dtype_name(t.dtype())));
  return t.data<uint8_t>()[0] != 0;
}

Tensor make_scalar_i64(int64_t v, Shape shape = {}) {
  return Tensor::from_vector<int64_t>(DType::kI64, std::move(shape), {v});
}
Tensor make_scalar_bool(bool v, Shape shape = {}) {
  return Tensor::from_vector<uint8_t>(DType::kBool, std::move(shape), {static_cast<uint8_t>(v ? 1 : 0)});
}

// Normalises `axis` for rank `rank` (accepting -rank..rank-1, or -rank-1..rank when `extra` is set).
StatusOr<int64_t> norm_axis(int64_t axis, int64_t rank, const std::string& what, bool extra = false) {
  const int64_t r = rank + (extra ? 1 : 0);
  if (axis < -r || axis >= r) {
    return invalid_argument(what + " " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  }
  return axis < 0 ? axis + r : axis;
}

struct AxisSplit {
  int64_t outer = 1, len = 1, inner_bytes = 0;
};
AxisSplit split_at(const Tensor& t, int64_t axis) {
  AxisSplit s;
  for (int64_t i = 0; i < axis; ++i) s.outer *= t.shape()[i];
  s.len = t.shape()[axis];
  int64_t inner = 1;
  for (int64_t i = axis + 1; i < t.rank(); ++i) inner *= t.shape()[i];
  s.inner_bytes = inner * static_cast<int64_t>(dtype_size(t.dtype()));
  return s;
}

// Elements [begin, begin + count) along `axis` (kept when `keep`, else removed: count must be 1).
StatusOr<Tensor> slice_axis(const Tensor& t, int64_t axis, int64_t begin, int64_t count, bool keep) {
  KEEL_RETURN_IF_ERROR(need_host(t, "input"), "");
  Shape shape = t.shape();
  if (keep) {
    shape[axis] = count;
  } else {
    shape.erase(shape.begin() + axis);
  }
  KEEL_ASSIGN_OR_RETURN(Tensor out, Tensor::host(t.dtype(), shape), "slice");
  const AxisSplit s = split_at(t, axis);
  const auto* src = static_cast<const char*>(t.raw_data());
  auto* dst = static_cast<char*>(out.raw_data());
  const int64_t chunk = count * s.inner_bytes;
  for (int64_t o = 0; o < s.outer; ++o) {
    if (chunk > 0) std::memcpy(dst + o * chunk, src + (o * s.len + begin) * s.inner_bytes, static_cast<size_t>(chunk));
  }
  return out;
}

// Concatenates `items` along `axis` (new_axis: stacks them along a new axis at that position).
StatusOr<Tensor> concat_axis(const std::vector<Tensor>& items, int64_t axis, bool new_axis, const std::string& what) {
  if (items.empty()) return invalid_argument(what + ": nothing to concatenate");
  const Tensor& first = items[0];
  const int64_t rank = first.rank();
  KEEL_ASSIGN_OR_RETURN(int64_t a, norm_axis(axis, rank, what + ": axis", new_axis), "");
  std::vector<Tensor> parts;
  parts.reserve(items.size());
  for (const auto& it : items) {
    KEEL_RETURN_IF_ERROR(need_host(it, what + " element"), "");
    if (it.dtype() != first.dtype()) {
      return invalid_argument(what + ": elements have dtypes " + dtype_name(first.dtype()) + " and " +
                              dtype_name(it.dtype()));
    }
    if (it.rank() != rank) {
      return invalid_argument(what + ": elements have shapes " + shape_to_string(first.shape()) + " and " +
                              shape_to_string(it.shape()));
    }
    for (int64_t d = 0; d < rank; ++d) {
      if ((new_axis || d != a) && it.shape()[d] != first.shape()[d]) {
        return invalid_argument(what + ": elements have shapes " + shape_to_string(first.shape()) + " and " +
                                shape_to_string(it.shape()));
      }
    }
    if (new_axis) {
      Shape s = it.shape();
      s.insert(s.begin() + a, 1);
      KEEL_ASSIGN_OR_RETURN(Tensor r, it.reshaped(s), what);
      parts.push_back(std::move(r));
    } else {
      parts.push_back(it);
    }
  }
  Shape shape = parts[0].shape();
  shape[a] = 0;
  for (const auto& p : parts) shape[a] += p.shape()[a];
  KEEL_ASSIGN_OR_RETURN(Tensor out, Tensor::host(first.dtype(), shape), what);
  const AxisSplit total = split_at(out, a);
  auto* dst = static_cast<char*>(out.raw_data());
  int64_t offset = 0;  // along the axis
  for (const auto& p : parts) {
    const AxisSplit s = split_at(p, a);
    const auto* src = static_cast<const char*>(p.raw_data());
    const int64_t chunk = s.len * s.inner_bytes;
    for (int64_t o = 0; o < s.outer; ++o) {
      if (chunk > 0) {
        std::memcpy(dst + (o * total.len + offset) * total.inner_bytes, src + o * chunk, static_cast<size_t>(chunk));
      }
    }
    offset += s.len;
  }
  return out;
}

StatusOr<RunValue> owned_value(const RunValue& v) {
  if (v.is_tensor()) {
    KEEL_ASSIGN_OR_RETURN(Tensor t, owned_tensor(v.tensor), "");
    return RunValue(std::move(t));
  }
  if (v.is_sequence()) {
    RunValue out = v;
    for (auto& t : out.sequence) {
      KEEL_ASSIGN_OR_RETURN(t, owned_tensor(t), "");
    }
    return out;
  }
  return v;
}

const RunValue& need(const std::vector<const RunValue*>& in, size_t i) {
  static const RunValue kUnset;
  return i < in.size() && in[i] ? *in[i] : kUnset;
}

StatusOr<Tensor> need_tensor(const std::vector<const RunValue*>& in, size_t i, const std::string& what) {
  const RunValue& v = need(in, i);
  if (!v.is_tensor()) return invalid_argument(what + " must be a tensor, it is " + v.describe());
  return v.tensor;
}

StatusOr<RunValue> need_sequence(const std::vector<const RunValue*>& in, size_t i, const std::string& what) {
  const RunValue& v = need(in, i);
  if (!v.is_sequence()) return invalid_argument(what + " must be a sequence, it is " + v.describe());
  return v;
}

// ---------------------------------------------------------------------------------------------------------------
// Nested graphs

// A branch or body as a child session. Its inputs: the graph's own (formal) inputs, then the outer-scope values it
// reads that are not constants, each taken from the enclosing node's input list at `outer_index`.
struct Nested {
  std::unique_ptr<Session> session;
  std::vector<std::string> formal;
  std::vector<ValueInfo> formal_info;
  std::vector<std::pair<std::string, size_t>> outer;  // child input name -> index in the node's full input list
  std::vector<std::string> outputs;
  std::vector<ValueInfo> output_info;

  StatusOr<std::vector<RunValue>> run(const std::vector<RunValue>& formal_values,
                                      const std::vector<const RunValue*>& node_inputs) const {
    std::vector<std::pair<std::string, RunValue>> feeds;
    feeds.reserve(formal.size() + outer.size());
    for (size_t i = 0; i < formal.size() && i < formal_values.size(); ++i)
      feeds.emplace_back(formal[i], formal_values[i]);
    for (const auto& [name, idx] : outer) feeds.emplace_back(name, need(node_inputs, idx));
    KEEL_ASSIGN_OR_RETURN(std::vector<RunValue> out, session->run_values(feeds), "");
    for (size_t i = 0; i < out.size(); ++i) {
      if (!out[i].defined()) return invalid_argument("output '" + outputs[i] + "' was not produced");
    }
    return out;
  }
};

StatusOr<Nested> make_nested(const Node& node, const std::string& attr, const Graph& parent, Environment& env,
                             const SessionOptions& options) {
  const Attribute* a = node.attr(attr);
  if (!a || a->kind != AttrKind::kGraph || !a->g)
    return invalid_argument(who(node) + " has no graph attribute '" + attr + "'");
  const std::vector<std::string> implicit = implicit_inputs(node);
  Graph child = *a->g;
  child.opsets = parent.opsets;
  if (child.name.empty()) child.name = node.name + "." + attr;
  Nested n;
  n.formal = child.inputs;
  for (const auto& f : n.formal) n.formal_info.push_back(child.info(f) ? *child.info(f) : ValueInfo{});
  n.outputs = child.outputs;
  for (const auto& o : n.outputs) n.output_info.push_back(child.info(o) ? *child.info(o) : ValueInfo{});
  for (const auto& r : outer_scope_reads(*a->g)) {
    if (auto it = parent.initializers.find(r); it != parent.initializers.end()) {
      child.initializers[r] = it->second;
      child.value_info[r] = ValueInfo{it->second.dtype(), it->second.shape(), {}};
      continue;
    }
    auto pos = std::find(implicit.begin(), implicit.end(), r);
    if (pos == implicit.end()) return internal_error(who(node) + ": outer value '" + r + "' is not an implicit input");
    child.inputs.push_back(r);
    if (const ValueInfo* vi = parent.info(r)) child.value_info[r] = *vi;
    n.outer.emplace_back(r, node.inputs.size() + static_cast<size_t>(pos - implicit.begin()));
  }
  auto s = Session::create(env, std::move(child), options);
  if (!s.is_ok()) {
    return s.status().with_context(who(node) + " attribute '" + attr + "'");
  }
  n.session = std::move(s).value();
  return n;
}

// A formal scalar input (iteration number, condition): shaped [] or [1] as the body declares it.
Shape scalar_shape(const ValueInfo& declared) {
  if (declared.shape && declared.shape->size() == 1) return Shape{1};
  return Shape{};
}

// ---------------------------------------------------------------------------------------------------------------
// If

class IfOp : public NativeOp {
 public:
  Nested then_, else_;
  std::string name_;
  Status run(const std::vector<const RunValue*>& in, std::vector<RunValue>& out) override {
    KEEL_ASSIGN_OR_RETURN(Tensor c, need_tensor(in, 0, "cond"), "");
    KEEL_ASSIGN_OR_RETURN(bool cond, scalar_bool(c, "cond"), "");
    const Nested& branch = cond ? then_ : else_;
    KEEL_ASSIGN_OR_RETURN(std::vector<RunValue> r, branch.run({}, in), cond ? "then_branch" : "else_branch");
    if (r.size() != out.size()) {
      return invalid_argument(std::string(cond ? "then_branch" : "else_branch") + " has " + std::to_string(r.size()) +
                              " outputs, the node " + std::to_string(out.size()));
    }
    for (size_t i = 0; i < r.size(); ++i) {
      KEEL_ASSIGN_OR_RETURN(out[i], owned_value(r[i]), "");
    }
    return Status::ok();
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Loop

class LoopOp : public NativeOp {
 public:
  Nested body_;
  size_t n_carried_ = 0;
  Status run(const std::vector<const RunValue*>& in, std::vector<RunValue>& out) override {
    int64_t trip = -1;
    bool cond = true;
    if (need(in, 0).defined()) {
      KEEL_ASSIGN_OR_RETURN(Tensor m, need_tensor(in, 0, "M"), "");
      KEEL_ASSIGN_OR_RETURN(trip, scalar_int(m, "M (trip count)"), "");
      if (trip < 0) trip = 0;
    }
    if (need(in, 1).defined()) {
      KEEL_ASSIGN_OR_RETURN(Tensor c, need_tensor(in, 1, "cond"), "");
      KEEL_ASSIGN_OR_RETURN(cond, scalar_bool(c, "cond"), "");
    }
    if (trip < 0 && !need(in, 1).defined()) {
      return invalid_argument("Loop has neither a trip count (M) nor a condition: it would never end");
    }
    std::vector<RunValue> state(n_carried_);
    for (size_t i = 0; i < n_carried_; ++i) {
      const RunValue& v = need(in, 2 + i);
      if (!v.defined()) return invalid_argument("loop-carried input " + std::to_string(i) + " is missing");
      KEEL_ASSIGN_OR_RETURN(state[i], owned_value(v), "");
    }
    const size_t n_scan = body_.outputs.size() - 1 - n_carried_;
    std::vector<std::vector<Tensor>> scans(n_scan);
    const Shape iter_shape = scalar_shape(body_.formal_info[0]);
    const Shape cond_shape = scalar_shape(body_.formal_info[1]);
    std::vector<RunValue> feeds(2 + n_carried_);
    for (int64_t i = 0; (trip < 0 || i < trip) && cond; ++i) {
      feeds[0] = make_scalar_i64(i, iter_shape);
      feeds[1] = make_scalar_bool(cond, cond_shape);
      for (size_t k = 0; k < n_carried_; ++k) feeds[2 + k] = state[k];
      KEEL_ASSIGN_OR_RETURN(std::vector<RunValue> r, body_.run(feeds, in), "iteration " + std::to_string(i));
      if (!r[0].is_tensor()) return invalid_argument("the body's condition output is " + r[0].describe());
      KEEL_ASSIGN_OR_RETURN(cond, scalar_bool(r[0].tensor, "the body's condition output"), "");
      for (size_t k = 0; k < n_carried_; ++k) {
        KEEL_ASSIGN_OR_RETURN(state[k], owned_value(r[1 + k]), "");
      }
      for (size_t k = 0; k < n_scan; ++k) {
        const RunValue& v = r[1 + n_carried_ + k];
        if (!v.is_tensor()) return invalid_argument("scan output " + std::to_string(k) + " is " + v.describe());
        if (!scans[k].empty() && v.tensor.shape() != scans[k][0].shape()) {
          return invalid_argument("scan output " + std::to_string(k) + " changes shape from " +
                                  shape_to_string(scans[k][0].shape()) + " to " + shape_to_string(v.tensor.shape()) +
                                  " in iteration " + std::to_string(i));
        }
        scans[k].push_back(v.tensor);
      }
    }
    for (size_t k = 0; k < n_carried_ && k < out.size(); ++k) out[k] = state[k];
    for (size_t k = 0; k < n_scan && n_carried_ + k < out.size(); ++k) {
      if (scans[k].empty()) {
        // No iteration: an empty tensor of the declared element type.
        const ValueInfo& vi = body_.output_info[1 + n_carried_ + k];
        Shape shape{0};
        if (vi.shape)
          for (int64_t d : *vi.shape) shape.push_back(std::max<int64_t>(d, 0));
        KEEL_ASSIGN_OR_RETURN(Tensor e, Tensor::host(vi.dtype == DType::kUndefined ? DType::kF32 : vi.dtype, shape),
                              "");
        out[n_carried_ + k] = e;
        continue;
      }
      KEEL_ASSIGN_OR_RETURN(Tensor t, concat_axis(scans[k], 0, true, "scan output " + std::to_string(k)), "");
      out[n_carried_ + k] = std::move(t);
    }
    return Status::ok();
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Scan (opset 9+; opset 8 runs the same per batch entry)

class ScanOp : public NativeOp {
 public:
  Nested body_;
  bool opset8_ = false;
  size_t n_state_ = 0, n_scan_in_ = 0, n_scan_out_ = 0;
  std::vector<int64_t> in_axes_, in_dirs_, out_axes_, out_dirs_;

  // One scan over state values and scan inputs (no batch axis).
  Status scan(const std::vector<Tensor>& state_in, const std::vector<Tensor>& scan_in,
              const std::vector<const RunValue*>& node_in, std::vector<Tensor>& state_out,
              std::vector<Tensor>& scan_out) {
    std::vector<int64_t> axes(n_scan_in_);
    int64_t len = -1;
    for (size_t k = 0; k < n_scan_in_; ++k) {
      KEEL_ASSIGN_OR_RETURN(axes[k], norm_axis(in_axes_[k], scan_in[k].rank(), "scan_input_axes"), "");
      const int64_t l = scan_in[k].shape()[axes[k]];
      if (len >= 0 && l != len) {
        return invalid_argument("scan inputs have different lengths (" + std::to_string(len) + " and " +
                                std::to_string(l) + ")");
      }
      len = l;
    }
    if (len < 0) len = 0;
    std::vector<RunValue> state(state_in.begin(), state_in.end());
    std::vector<std::vector<Tensor>> outs(n_scan_out_);
    std::vector<RunValue> feeds(n_state_ + n_scan_in_);
    for (int64_t i = 0; i < len; ++i) {
      for (size_t k = 0; k < n_state_; ++k) feeds[k] = state[k];
      for (size_t k = 0; k < n_scan_in_; ++k) {
        const int64_t at = in_dirs_[k] ? len - 1 - i : i;
        KEEL_ASSIGN_OR_RETURN(Tensor s, slice_axis(scan_in[k], axes[k], at, 1, false),
                              "scan input " + std::to_string(k));
        feeds[n_state_ + k] = std::move(s);
      }
      KEEL_ASSIGN_OR_RETURN(std::vector<RunValue> r, body_.run(feeds, node_in), "iteration " + std::to_string(i));
      for (size_t k = 0; k < n_state_; ++k) {
        if (!r[k].is_tensor()) return invalid_argument("state output " + std::to_string(k) + " is " + r[k].describe());
        KEEL_ASSIGN_OR_RETURN(Tensor t, owned_tensor(r[k].tensor), "");
        state[k] = std::move(t);
      }
      for (size_t k = 0; k < n_scan_out_; ++k) {
        const RunValue& v = r[n_state_ + k];
        if (!v.is_tensor()) return invalid_argument("scan output " + std::to_string(k) + " is " + v.describe());
        outs[k].push_back(v.tensor);
      }
    }
    state_out.clear();
    for (auto& s : state) state_out.push_back(s.tensor);
    scan_out.clear();
    for (size_t k = 0; k < n_scan_out_; ++k) {
      if (outs[k].empty()) {
        const ValueInfo& vi = body_.output_info[n_state_ + k];
        Shape shape{0};
        if (vi.shape)
          for (int64_t d : *vi.shape) shape.push_back(std::max<int64_t>(d, 0));
        KEEL_ASSIGN_OR_RETURN(Tensor e, Tensor::host(vi.dtype == DType::kUndefined ? DType::kF32 : vi.dtype, shape),
                              "");
        scan_out.push_back(std::move(e));
        continue;
      }
      if (out_dirs_[k]) std::reverse(outs[k].begin(), outs[k].end());
      KEEL_ASSIGN_OR_RETURN(Tensor t, concat_axis(outs[k], out_axes_[k], true, "scan output " + std::to_string(k)), "");
      scan_out.push_back(std::move(t));
    }
    return Status::ok();
  }

  Status run(const std::vector<const RunValue*>& in, std::vector<RunValue>& out) override {
    const size_t first = opset8_ ? 1 : 0;  // opset 8: sequence_lens comes first
    std::vector<Tensor> state, scan_in;
    for (size_t k = 0; k < n_state_ + n_scan_in_; ++k) {
      KEEL_ASSIGN_OR_RETURN(Tensor t, need_tensor(in, first + k, "Scan input " + std::to_string(first + k)), "");
      KEEL_RETURN_IF_ERROR(need_host(t, "Scan input"), "");
      (k < n_state_ ? state : scan_in).push_back(std::move(t));
    }
    std::vector<Tensor> state_out, scan_out;
    if (!opset8_) {
      KEEL_RETURN_IF_ERROR(scan(state, scan_in, in, state_out, scan_out), "");
    } else {
      // Opset 8: axis 0 of every input is the batch; each batch entry is one scan along axis 1 (axis 0 after the
      // batch is taken off). sequence_lens, when given, must cover the whole length (shorter ones: unsupported).
      int64_t batch = -1;
      for (const auto& t : state) batch = t.rank() > 0 ? t.shape()[0] : batch;
      for (const auto& t : scan_in) batch = t.rank() > 0 ? t.shape()[0] : batch;
      if (batch < 0) return invalid_argument("opset-8 Scan needs a batch axis");
      if (need(in, 0).defined()) {
        KEEL_ASSIGN_OR_RETURN(Tensor lens, need_tensor(in, 0, "sequence_lens"), "");
        const int64_t full = scan_in.empty() ? 0 : scan_in[0].shape()[1];
        for (int64_t b = 0; b < lens.numel(); ++b) {
          const int64_t l = lens.dtype() == DType::kI32 ? lens.data<int32_t>()[b] : lens.data<int64_t>()[b];
          if (l != full) return unimplemented("opset-8 Scan with sequence_lens shorter than the input");
        }
      }
      std::vector<std::vector<Tensor>> so(n_state_), sc(n_scan_out_);
      for (int64_t b = 0; b < batch; ++b) {
        std::vector<Tensor> st, si, sto, sco;
        for (const auto& t : state) {
          KEEL_ASSIGN_OR_RETURN(Tensor x, slice_axis(t, 0, b, 1, false), "");
          st.push_back(std::move(x));
        }
        for (const auto& t : scan_in) {
          KEEL_ASSIGN_OR_RETURN(Tensor x, slice_axis(t, 0, b, 1, false), "");
          si.push_back(std::move(x));
        }
        KEEL_RETURN_IF_ERROR(scan(st, si, in, sto, sco), "batch " + std::to_string(b));
        for (size_t k = 0; k < n_state_; ++k) so[k].push_back(sto[k]);
        for (size_t k = 0; k < n_scan_out_; ++k) sc[k].push_back(sco[k]);
      }
      for (size_t k = 0; k < n_state_; ++k) {
        KEEL_ASSIGN_OR_RETURN(Tensor t, concat_axis(so[k], 0, true, "state output"), "");
        state_out.push_back(std::move(t));
      }
      for (size_t k = 0; k < n_scan_out_; ++k) {
        KEEL_ASSIGN_OR_RETURN(Tensor t, concat_axis(sc[k], 0, true, "scan output"), "");
        scan_out.push_back(std::move(t));
      }
    }
    for (size_t k = 0; k < n_state_ && k < out.size(); ++k) {
      KEEL_ASSIGN_OR_RETURN(Tensor t, owned_tensor(state_out[k]), "");
      out[k] = std::move(t);
    }
    for (size_t k = 0; k < n_scan_out_ && n_state_ + k < out.size(); ++k) out[n_state_ + k] = scan_out[k];
    return Status::ok();
  }
};

// ---------------------------------------------------------------------------------------------------------------
// SequenceMap

class SequenceMapOp : public NativeOp {
 public:
  Nested body_;
  size_t n_inputs_ = 0;
  Status run(const std::vector<const RunValue*>& in, std::vector<RunValue>& out) override {
    KEEL_ASSIGN_OR_RETURN(RunValue first, need_sequence(in, 0, "input_sequence"), "");
    const size_t len = first.sequence.size();
    for (size_t k = 1; k < n_inputs_; ++k) {
      const RunValue& v = need(in, k);
      if (v.is_sequence() && v.sequence.size() != len) {
        return invalid_argument("additional input " + std::to_string(k) + " is a sequence of " +
                                std::to_string(v.sequence.size()) + " items, input_sequence has " +
                                std::to_string(len));
      }
      if (!v.is_sequence() && !v.is_tensor())
        return invalid_argument("input " + std::to_string(k) + " is " + v.describe());
    }
    std::vector<std::vector<Tensor>> results(out.size());
    std::vector<RunValue> feeds(n_inputs_);
    for (size_t i = 0; i < len; ++i) {
      for (size_t k = 0; k < n_inputs_; ++k) {
        const RunValue& v = need(in, k);
        feeds[k] = v.is_sequence() ? RunValue(v.sequence[i]) : v;
      }
      KEEL_ASSIGN_OR_RETURN(std::vector<RunValue> r, body_.run(feeds, in), "item " + std::to_string(i));
      for (size_t k = 0; k < r.size() && k < out.size(); ++k) {
        if (!r[k].is_tensor()) return invalid_argument("body output " + std::to_string(k) + " is " + r[k].describe());
        KEEL_ASSIGN_OR_RETURN(Tensor t, owned_tensor(r[k].tensor), "");
        results[k].push_back(std::move(t));
      }
    }
    for (size_t k = 0; k < out.size(); ++k) {
      DType dt = k < body_.output_info.size() ? body_.output_info[k].dtype : DType::kUndefined;
      if (!results[k].empty()) dt = results[k][0].dtype();
      out[k] = RunValue::of_sequence(std::move(results[k]), dt);
    }
    return Status::ok();
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Sequence and optional ops (no nested graph)

class SimpleOp : public NativeOp {
 public:
  std::string op_;
  const Node* node_ = nullptr;  // owned by the session's graph, which outlives the op
  DType dtype_ = DType::kF32;   // SequenceEmpty
  int64_t axis_ = 0, keepdims_ = 1, new_axis_ = 0;

  Status run(const std::vector<const RunValue*>& in, std::vector<RunValue>& out) override {
    if (out.empty()) return Status::ok();
    if (op_ == "SequenceEmpty") {
      out[0] = RunValue::of_sequence({}, dtype_);
    } else if (op_ == "SequenceConstruct") {
      std::vector<Tensor> items;
      for (size_t i = 0; i < in.size(); ++i) {
        KEEL_ASSIGN_OR_RETURN(Tensor t, need_tensor(in, i, "input " + std::to_string(i)), "");
        if (!items.empty() && t.dtype() != items[0].dtype()) {
          return invalid_argument("inputs have dtypes " + std::string(dtype_name(items[0].dtype())) + " and " +
                                  dtype_name(t.dtype()));
        }
        KEEL_ASSIGN_OR_RETURN(t, owned_tensor(t), "");
        items.push_back(std::move(t));
      }
      const DType dt = items.empty() ? DType::kUndefined : items[0].dtype();
      out[0] = RunValue::of_sequence(std::move(items), dt);
    } else if (op_ == "SequenceInsert") {
      KEEL_ASSIGN_OR_RETURN(RunValue seq, need_sequence(in, 0, "input_sequence"), "");
      KEEL_ASSIGN_OR_RETURN(Tensor t, need_tensor(in, 1, "tensor"), "");
      if (seq.sequence_dtype != DType::kUndefined && t.dtype() != seq.sequence_dtype) {
        return invalid_argument("inserting a " + std::string(dtype_name(t.dtype())) + " tensor into a sequence of " +
                                dtype_name(seq.sequence_dtype));
      }
      const int64_t n = static_cast<int64_t>(seq.sequence.size());
      int64_t pos = n;
      if (need(in, 2).defined()) {
        KEEL_ASSIGN_OR_RETURN(Tensor p, need_tensor(in, 2, "position"), "");
        KEEL_ASSIGN_OR_RETURN(pos, scalar_int(p, "position"), "");
        if (pos < -n || pos > n)
          return invalid_argument("position " + std::to_string(pos) + " is out of range for " + std::to_string(n) +
                                  " items");
        if (pos < 0) pos += n;
      }
      KEEL_ASSIGN_OR_RETURN(t, owned_tensor(t), "");
      seq.sequence.insert(seq.sequence.begin() + pos, std::move(t));
      seq.sequence_dtype = seq.sequence[0].dtype();
      out[0] = std::move(seq);
    } else if (op_ == "SequenceAt" || op_ == "SequenceErase") {
      KEEL_ASSIGN_OR_RETURN(RunValue seq, need_sequence(in, 0, "input_sequence"), "");
      const int64_t n = static_cast<int64_t>(seq.sequence.size());
      int64_t pos = n - 1;
      if (op_ == "SequenceAt" || need(in, 1).defined()) {
        KEEL_ASSIGN_OR_RETURN(Tensor p, need_tensor(in, 1, "position"), "");
        KEEL_ASSIGN_OR_RETURN(pos, scalar_int(p, "position"), "");
        if (pos < 0) pos += n;
      }
      if (pos < 0 || pos >= n) {
        return invalid_argument("position is out of range for a sequence of " + std::to_string(n) + " items");
      }
      if (op_ == "SequenceAt") {
        out[0] = seq.sequence[static_cast<size_t>(pos)];
      } else {
        seq.sequence.erase(seq.sequence.begin() + pos);
        out[0] = std::move(seq);
      }
    } else if (op_ == "SequenceLength") {
      KEEL_ASSIGN_OR_RETURN(RunValue seq, need_sequence(in, 0, "input_sequence"), "");
      out[0] = make_scalar_i64(static_cast<int64_t>(seq.sequence.size()));
    } else if (op_ == "SplitToSequence") {
      KEEL_RETURN_IF_ERROR(split_to_sequence(in, out), "");
    } else if (op_ == "ConcatFromSequence") {
      KEEL_ASSIGN_OR_RETURN(RunValue seq, need_sequence(in, 0, "input_sequence"), "");
      KEEL_ASSIGN_OR_RETURN(Tensor t, concat_axis(seq.sequence, axis_, new_axis_ != 0, "ConcatFromSequence"), "");
      out[0] = std::move(t);
    } else if (op_ == "Optional") {
      const RunValue& v = need(in, 0);
      if (v.defined()) {
        KEEL_ASSIGN_OR_RETURN(out[0], owned_value(v), "");
      } else {
        out[0] = RunValue::none();
      }
    } else if (op_ == "OptionalHasElement") {
      const RunValue& v = need(in, 0);
      out[0] = make_scalar_bool(v.defined() && !v.is_none());
    } else if (op_ == "OptionalGetElement") {
      const RunValue& v = need(in, 0);
      if (!v.defined() || v.is_none()) return invalid_argument("the optional input holds no element");
      out[0] = v;
    } else if (op_ == "Identity") {
      KEEL_ASSIGN_OR_RETURN(out[0], owned_value(need(in, 0)), "");
    } else {
      return unimplemented("no executor-native implementation of " + op_);
    }
    return Status::ok();
  }

  Status split_to_sequence(const std::vector<const RunValue*>& in, std::vector<RunValue>& out) const {
    KEEL_ASSIGN_OR_RETURN(Tensor x, need_tensor(in, 0, "input"), "");
    KEEL_RETURN_IF_ERROR(need_host(x, "input"), "");
    KEEL_ASSIGN_OR_RETURN(int64_t axis, norm_axis(axis_, x.rank(), "axis"), "");
    const int64_t len = x.shape()[axis];
    std::vector<int64_t> sizes;
    bool keep = true;
    if (!need(in, 1).defined()) {
      sizes.assign(static_cast<size_t>(len), 1);
      keep = keepdims_ != 0;
    } else {
      KEEL_ASSIGN_OR_RETURN(Tensor split, need_tensor(in, 1, "split"), "");
      KEEL_RETURN_IF_ERROR(need_host(split, "split"), "");
      auto at = [&](int64_t i) {
        return split.dtype() == DType::kI32 ? static_cast<int64_t>(split.data<int32_t>()[i]) : split.data<int64_t>()[i];
      };
      if (split.dtype() != DType::kI32 && split.dtype() != DType::kI64)
        return invalid_argument("split must be int32 or int64");
      if (split.rank() == 0) {
        const int64_t chunk = at(0);
        if (chunk <= 0) return invalid_argument("split must be positive, it is " + std::to_string(chunk));
        for (int64_t done = 0; done < len; done += chunk) sizes.push_back(std::min(chunk, len - done));
      } else {
        int64_t total = 0;
        for (int64_t i = 0; i < split.numel(); ++i) {
          if (at(i) < 0) return invalid_argument("split sizes must not be negative");
          sizes.push_back(at(i));
          total += at(i);
        }
        if (total != len) {
          return invalid_argument("split sizes add up to " + std::to_string(total) + ", the axis has " +
                                  std::to_string(len));
        }
      }
    }
    std::vector<Tensor> items;
    int64_t begin = 0;
    for (int64_t s : sizes) {
      KEEL_ASSIGN_OR_RETURN(Tensor t, slice_axis(x, axis, begin, s, keep), "");
      items.push_back(std::move(t));
      begin += s;
    }
    out[0] = RunValue::of_sequence(std::move(items), x.dtype());
    return Status::ok();
  }
};

std::vector<int64_t> ints_or(const Node& n, const std::string& name, size_t count, int64_t dflt) {
  const Attribute* a = n.attr(name);
  std::vector<int64_t> v = a && a->kind == AttrKind::kInts ? a->ints : std::vector<int64_t>{};
  v.resize(std::max(v.size(), count), dflt);
  return v;
}

}  // namespace

StatusOr<Tensor> owned_tensor(const Tensor& t) {
  if (!t.defined() || !t.storage() || t.storage()->owns_memory()) return t;
  KEEL_RETURN_IF_ERROR(need_host(t, "tensor"), "");
  return t.clone();
}

bool is_native_op(const Node& node, const Graph& graph) {
  if (!node.domain.empty()) return false;
  if (native_ops().count(node.op_type)) return true;
  if (node.op_type == "Identity" && !node.inputs.empty()) {
    const ValueInfo* vi = graph.info(node.inputs[0]);
    return vi && !vi->is_tensor();
  }
  return false;
}

StatusOr<std::shared_ptr<NativeOp>> make_native_op(const Node& node, const Graph& graph, Environment& env,
                                                   const SessionOptions& options) {
  if (!is_native_op(node, graph)) return unimplemented(who(node) + " is not run by the executor");
  const std::string& op = node.op_type;
  int32_t opset = 0;
  if (auto it = graph.opsets.find(""); it != graph.opsets.end()) opset = it->second;
  if (op == "If") {
    auto r = std::make_shared<IfOp>();
    KEEL_ASSIGN_OR_RETURN(r->then_, make_nested(node, "then_branch", graph, env, options), "");
    KEEL_ASSIGN_OR_RETURN(r->else_, make_nested(node, "else_branch", graph, env, options), "");
    if (r->then_.outputs.size() != node.outputs.size() || r->else_.outputs.size() != node.outputs.size()) {
      return invalid_argument(who(node) + ": its branches have " + std::to_string(r->then_.outputs.size()) + " and " +
                              std::to_string(r->else_.outputs.size()) + " outputs, the node " +
                              std::to_string(node.outputs.size()));
    }
    return std::shared_ptr<NativeOp>(r);
  }
  if (op == "Loop") {
    auto r = std::make_shared<LoopOp>();
    KEEL_ASSIGN_OR_RETURN(r->body_, make_nested(node, "body", graph, env, options), "");
    if (node.inputs.size() < 2) return invalid_argument(who(node) + " needs inputs M and cond (either may be empty)");
    r->n_carried_ = node.inputs.size() - 2;
    if (r->body_.formal.size() != 2 + r->n_carried_) {
      return invalid_argument(who(node) + ": the body has " + std::to_string(r->body_.formal.size()) +
                              " inputs, expected 2 + " + std::to_string(r->n_carried_) + " loop-carried");
    }
    if (r->body_.outputs.size() < 1 + r->n_carried_ || r->body_.outputs.size() - 1 != node.outputs.size()) {
      return invalid_argument(who(node) + ": the body has " + std::to_string(r->body_.outputs.size()) +
                              " outputs; expected the condition, " + std::to_string(r->n_carried_) +
                              " loop-carried values and the node's scan outputs");
    }
    return std::shared_ptr<NativeOp>(r);
  }
  if (op == "Scan") {
    auto r = std::make_shared<ScanOp>();
    KEEL_ASSIGN_OR_RETURN(r->body_, make_nested(node, "body", graph, env, options), "");
    r->opset8_ = opset < 9;
    const Attribute* ns = node.attr("num_scan_inputs");
    if (!ns || ns->kind != AttrKind::kInt || ns->i < 1)
      return invalid_argument(who(node) + " needs num_scan_inputs >= 1");
    const size_t first = r->opset8_ ? 1 : 0;
    if (node.inputs.size() < first + static_cast<size_t>(ns->i))
      return invalid_argument(who(node) + " has too few inputs");
    r->n_scan_in_ = static_cast<size_t>(ns->i);
    r->n_state_ = node.inputs.size() - first - r->n_scan_in_;
    if (node.outputs.size() < r->n_state_) return invalid_argument(who(node) + " has too few outputs");
    r->n_scan_out_ = node.outputs.size() - r->n_state_;
    if (r->body_.formal.size() != r->n_state_ + r->n_scan_in_ || r->body_.outputs.size() != node.outputs.size()) {
      return invalid_argument(who(node) + ": the body's inputs and outputs do not match the node's");
    }
    if (r->opset8_) {
      r->in_axes_.assign(r->n_scan_in_, 0);
      r->out_axes_.assign(r->n_scan_out_, 0);
      r->in_dirs_ = ints_or(node, "directions", r->n_scan_in_, 0);
      r->out_dirs_.assign(r->n_scan_out_, 0);
    } else {
      r->in_axes_ = ints_or(node, "scan_input_axes", r->n_scan_in_, 0);
      r->in_dirs_ = ints_or(node, "scan_input_directions", r->n_scan_in_, 0);
      r->out_axes_ = ints_or(node, "scan_output_axes", r->n_scan_out_, 0);
      r->out_dirs_ = ints_or(node, "scan_output_directions", r->n_scan_out_, 0);
    }
    return std::shared_ptr<NativeOp>(r);
  }
  if (op == "SequenceMap") {
    auto r = std::make_shared<SequenceMapOp>();
    KEEL_ASSIGN_OR_RETURN(r->body_, make_nested(node, "body", graph, env, options), "");
    r->n_inputs_ = node.inputs.size();
    if (r->body_.formal.size() != r->n_inputs_ || r->body_.outputs.size() != node.outputs.size()) {
      return invalid_argument(who(node) + ": the body's inputs and outputs do not match the node's");
    }
    return std::shared_ptr<NativeOp>(r);
  }
  auto r = std::make_shared<SimpleOp>();
  r->op_ = op;
  r->node_ = &node;
  if (op == "SequenceEmpty") {
    const int64_t dt = node.attr_int("dtype", static_cast<int64_t>(DType::kF32));
    if (!dtype_is_valid(static_cast<int32_t>(dt)))
      return invalid_argument(who(node) + ": unknown dtype " + std::to_string(dt));
    r->dtype_ = static_cast<DType>(dt);
  }
  if (op == "ConcatFromSequence") {
    const Attribute* a = node.attr("axis");
    if (!a || a->kind != AttrKind::kInt) return invalid_argument(who(node) + " needs attribute 'axis'");
    r->axis_ = a->i;
    r->new_axis_ = node.attr_int("new_axis", 0);
  }
  if (op == "SplitToSequence") {
    r->axis_ = node.attr_int("axis", 0);
    r->keepdims_ = node.attr_int("keepdims", 1);
  }
  return std::shared_ptr<NativeOp>(r);
}

Status run_native_step(NativeOp& op, const std::vector<int>& inputs, const std::vector<int>& outputs,
                       std::vector<RunValue>& live) {
  std::vector<const RunValue*> in(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i] >= 0 && live[inputs[i]].defined()) in[i] = &live[inputs[i]];
  std::vector<RunValue> out(outputs.size());
  KEEL_RETURN_IF_ERROR(op.run(in, out), "");
  for (size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i] >= 0 && out[i].defined()) live[outputs[i]] = std::move(out[i]);
  return Status::ok();
}

Status check_input_kind(const std::string& name, const RunValue& value, const ValueInfo* declared) {
  if (!value.defined()) return invalid_argument("input '" + name + "' has no value");
  if (!declared || (declared->dtype == DType::kUndefined && declared->is_tensor())) return Status::ok();
  auto expected = [&] {
    return "input '" + name + "' is " + value.describe() + ", the model expects " + declared->to_string();
  };
  size_t level = 0;
  if (!declared->containers.empty() && declared->containers[0] == ValueKind::kOptional) {
    if (value.is_none()) return Status::ok();
    level = 1;
  } else if (value.is_none()) {
    return invalid_argument(expected());
  }
  const bool want_seq = level < declared->containers.size() && declared->containers[level] == ValueKind::kSequence;
  if (want_seq != value.is_sequence()) return invalid_argument(expected());
  const DType elem = value.is_sequence() ? value.sequence_dtype : value.tensor.dtype();
  if (declared->dtype != DType::kUndefined && elem != DType::kUndefined && elem != declared->dtype) {
    return invalid_argument(expected());
  }
  if (value.is_tensor() && !value.tensor.location().is_host())
    return invalid_argument("input '" + name + "' must be a host tensor");
  return Status::ok();
}

}  // namespace keel
