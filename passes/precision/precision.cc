// The precision pass plugin: mixed-precision conversion of an fp32 graph to fp16 or bf16. Built against the SDK alone.
//
//   convert_precision   options: dtype = "fp16" | "bf16" (required; also float16 / bfloat16 / f16),
//                                policy = "autocast" (default) | "all",
//                                keep_fp32 = [op types or node names], default_keep = true, clamp = true (fp16)
//   convert_fp16        convert_precision with dtype = fp16 (the name SessionOptions::passes / `--precision` use,
//   convert_bf16        since a session's pass list carries names only); the other options are read the same way
//
// What it does (the model of PyTorch autocast, written into the graph as ONNX Runtime's float16 converter does):
//  - Compute ops (Conv, ConvTranspose, MatMul, Gemm and their keel fused forms, keel.Attention) run in the low type.
//  - Every other float op "follows": with policy = autocast it runs in the low type when all its non-constant float
//    inputs are already low (promotion to the widest type otherwise, as autocast does), with policy = all it runs in
//    the low type whenever it can (ONNX Runtime's converter). Initializers adapt to their readers and never decide.
//  - Ops that lose accuracy in 16 bits stay fp32 (the default keep-list: reductions, Exp/Log/Pow/Reciprocal/Sqrt and
//    friends, CumSum, losses, Resize/Upsample, Instance/Group/Lp normalisation, LogSoftmax; for fp16 also Softmax,
//    whose exponent range fp16 cannot hold), as do the ops and node names of `keep_fp32`, and every op that has no
//    kernel at the low dtype on the target device (host->kernel_exists with the low dtype, the question the fusion
//    pass asks before making a fused op). LayerNormalization/BatchNormalization run low: their kernels keep the
//    statistics in f32 (LayerNormalization's stash_type = 1 is set explicitly).
//  - Nodes with subgraph or tensor attributes (If, Loop, Scan, Constant, ConstantOfShape) stay fp32 and their bodies
//    are not converted: a value they read (explicitly or captured by a body) keeps its fp32 name.
//  - Graph inputs and outputs keep their names and fp32 types: a converted node writes a new value (NAME_fp16 /
//    NAME_bf16) and a Cast back to f32 writes the original NAME only where an fp32 reader or a graph output needs it;
//    an fp32 value read by low nodes gets one shared Cast. No existing value changes its dtype.
//  - fp32 initializers read by low nodes are converted once (fp16: values beyond ±65504 clamp to ±65504, non-zero
//    values below the smallest fp16 subnormal clamp to it; both counted); the f32 original is dropped when nothing
//    else reads it.
//  - Afterwards, Cast pairs that round-trip (low -> f32 -> low) are collapsed and Casts to the input's own type
//    removed, across the whole graph.
// Report: nodes_converted, nodes_kept_fp32 (notes give the reasons by op type), casts_inserted, casts_collapsed,
// initializers_converted, values_clamped, bytes_saved.
#include <keel/plugin.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/graph_view.h"
#include "common/pass_instance.h"

namespace keel::passes {
namespace {

// ------------------------------------------------------------------------------------------------ conversions

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                                      // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// IEEE binary16, round to nearest even; overflow to inf (callers clamp first), NaN stays NaN.
uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                               // below the smallest normal: subnormal or 0
    if (a < 0x33000000u) return sign;                                  // < 2^-25: rounds to 0
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(a >> 23);  // value / 2^-24 = mant * 2^(e - 126), e the biased exponent
    const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    uint32_t r = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = a - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

constexpr float kF16Max = 65504.0f;
constexpr float kF16MinSub = 5.9604645e-08f;  // 2^-24

// ------------------------------------------------------------------------------------------------ op tables

bool in(const std::set<std::string>& s, const std::string& v) { return s.count(v) != 0; }

// Ops that compute in the low type whenever they can (autocast's "lower precision" list).
const std::set<std::string> kComputeOps = {"Conv",           "ConvTranspose",    "MatMul",         "Gemm",
                                           "keel.FusedConv", "keel.FusedMatMul", "keel.FusedGemm", "keel.Attention"};

// Ops that stay fp32 by default (autocast's fp32 list, in ONNX terms).
const std::set<std::string> kKeepAlways = {"ReduceSum",
                                           "ReduceMean",
                                           "ReduceProd",
                                           "ReduceL1",
                                           "ReduceL2",
                                           "ReduceLogSum",
                                           "ReduceLogSumExp",
                                           "ReduceSumSquare",
                                           "CumSum",
                                           "Exp",
                                           "Log",
                                           "Pow",
                                           "Reciprocal",
                                           "Sqrt",
                                           "Softplus",
                                           "Sinh",
                                           "Cosh",
                                           "Tan",
                                           "Asin",
                                           "Acos",
                                           "Atanh",
                                           "LogSoftmax",
                                           "SoftmaxCrossEntropyLoss",
                                           "NegativeLogLikelihoodLoss",
                                           "Resize",
                                           "Upsample",
                                           "InstanceNormalization",
                                           "GroupNormalization",
                                           "LpNormalization",
                                           "MeanVarianceNormalization",
                                           "Einsum",
                                           "TopK",
                                           "Det"};
// Kept for fp16 only: bf16 has f32's exponent range.
const std::set<std::string> kKeepF16 = {"Softmax", "keel.Attention"};

// Never converted: type-changing, quantization, random and constant-making ops (not counted as kept).
const std::set<std::string> kNeverOps = {"Cast",
                                         "CastLike",
                                         "QuantizeLinear",
                                         "DequantizeLinear",
                                         "DynamicQuantizeLinear",
                                         "keel.QConv",
                                         "keel.QGemm",
                                         "Constant",
                                         "ConstantOfShape",
                                         "Range",
                                         "RandomNormal",
                                         "RandomUniform",
                                         "RandomNormalLike",
                                         "RandomUniformLike",
                                         "Multinomial",
                                         "EyeLike",
                                         "Bernoulli",
                                         "Dropout",
                                         "Shape",
                                         "Size",
                                         "If",
                                         "Loop",
                                         "Scan",
                                         "SequenceMap"};

// Ops that read any dtype without computing on it: they read a low value directly rather than through a Cast.
const std::set<std::string> kDtypeBlindReaders = {"Shape", "Size"};

std::string full_op(const GraphView& gv, keel_node_id_t n) {
  std::string d = gv.domain(n);
  return d.empty() ? gv.op(n) : d + "." + gv.op(n);
}

bool is_f32(const GraphView& gv, const std::string& v) {
  if (v.empty()) return false;
  if (const keel_tensor_t* t = gv.initializer(v)) return t->dtype == KEEL_DTYPE_F32;
  auto t = gv.value_type(v);
  return t && t->dtype == KEEL_DTYPE_F32;
}

struct Config {
  int32_t dtype = KEEL_DTYPE_UNDEFINED;
  std::string suffix;  // "fp16" | "bf16"
  bool autocast = true;
  bool default_keep = true;
  bool clamp = true;
  std::set<std::string> keep;  // op types or node names
};

Config read_config(const PassOptions& o, const std::string& fixed_dtype) {
  Config c;
  std::string dt = fixed_dtype.empty() ? o.get_string("dtype", "") : fixed_dtype;
  std::string low;
  for (char ch : dt) low += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (low == "fp16" || low == "f16" || low == "float16" || low == "half") {
    c.dtype = KEEL_DTYPE_F16;
    c.suffix = "fp16";
  } else if (low == "bf16" || low == "bfloat16") {
    c.dtype = KEEL_DTYPE_BF16;
    c.suffix = "bf16";
  } else {
    throw PassError(KEEL_STATUS_INVALID_ARGUMENT,
                    dt.empty() ? "convert_precision: option 'dtype' is required (fp16 or bf16)"
                               : "convert_precision: option dtype = '" + dt + "' is not fp16 or bf16");
  }
  std::string policy = o.get_string("policy", "autocast");
  if (policy != "autocast" && policy != "all")
    throw PassError(KEEL_STATUS_INVALID_ARGUMENT,
                    "convert_precision: option policy = '" + policy + "' is not 'autocast' or 'all'");
  c.autocast = policy == "autocast";
  c.default_keep = o.get_bool("default_keep", true);
  c.clamp = o.get_bool("clamp", true);
  for (auto& s : o.get_strings("keep_fp32")) c.keep.insert(s);
  return c;
}

// ------------------------------------------------------------------------------------------------ the pass

class Converter {
 public:
  Converter(GraphView& gv, Report& report, Config cfg, const char* device)
      : gv_(gv), report_(report), cfg_(std::move(cfg)), device_(device && *device ? device : "cpu") {}

  void run() {
    std::vector<keel_node_id_t> order = gv_.nodes();
    classify(order);
    int64_t init_bytes_before = initializer_bytes();
    std::map<std::string, int64_t> slower;  // converted nodes whose low-precision kernel ranks below f32's, by op
    for (keel_node_id_t n : order)
      if (low_.count(n) && ranks_below_f32(n)) ++slower[full_op(gv_, n)];
    for (keel_node_id_t n : order)
      if (low_.count(n)) rewrite(n);
    // Dtype-blind readers of values that became low read the low value (no Cast up just for Shape).
    for (keel_node_id_t n : gv_.nodes()) {
      if (!gv_.exists(n) || !gv_.domain(n).empty() || !in(kDtypeBlindReaders, gv_.op(n))) continue;
      std::string v = gv_.input(n, 0);
      auto it = low_name_.find(v);
      if (it != low_name_.end() && gv_.producer(it->second)) gv_.set_input(n, 0, it->second);
    }
    drop_unused_casts();
    collapse_casts();
    for (const auto& v : converted_inits_)
      if (gv_.initializer(v) && gv_.use_count(v) == 0) gv_.remove_initializer(v);
    for (const auto& v : converted_consts_)  // Constant nodes nothing reads any more
      if (auto p = gv_.producer(v); p && gv_.use_count(v) == 0) gv_.remove_node(*p);
    gv_.infer_shapes();
    int64_t saved = init_bytes_before - initializer_bytes();
    report_.count("nodes_converted", converted_);
    report_.count("nodes_kept_fp32", kept_);
    report_.count("casts_inserted", casts_inserted_);
    report_.count("casts_collapsed", casts_collapsed_);
    report_.count("initializers_converted", static_cast<int64_t>(converted_inits_.size() + converted_consts_.size()));
    if (cfg_.dtype == KEEL_DTYPE_F16) report_.count("values_clamped", clamped_);
    report_.count("bytes_saved", saved);
    for (const auto& [why, ops] : kept_why_) {
      std::string s;
      for (const auto& [op, k] : ops) s += (s.empty() ? "" : ", ") + op + " x" + std::to_string(k);
      report_.note("kept fp32 (" + why + "): " + s);
    }
    if (clamped_)
      report_.note(std::to_string(clamped_) + " initializer value(s) outside the fp16 range clamped (" +
                   std::to_string(clamped_over_) + " beyond ±65504, " + std::to_string(clamped_under_) +
                   " non-zero below 2^-24)");
    if (subgraph_nodes_)
      report_.note(std::to_string(subgraph_nodes_) + " node(s) with subgraphs left fp32, bodies not converted");
    if (!slower.empty()) {
      // Said, not undone: the caller asked for this dtype (to compare numerics with another device, say).
      std::string s;
      for (const auto& [op, k] : slower) s += (s.empty() ? "" : ", ") + op + " x" + std::to_string(k);
      const std::string msg = std::string(cfg_.dtype == KEEL_DTYPE_F16 ? "fp16" : "bf16") + " on " + device_ +
                              " runs " + s +
                              " on kernels ranked below their f32 ones: expect this model slower than in fp32";
      report_.note(msg);
      if (g_host->log) g_host->log(g_plugin, KEEL_LOG_WARN, ("convert_precision: " + msg).c_str());
    }
  }

 private:
  int64_t initializer_bytes() const {
    // The graph API has no initializer list: the values nodes read are the ones that matter.
    int64_t b = 0;
    std::set<std::string> seen;
    for (keel_node_id_t n : gv_.nodes())
      for (const auto& v : gv_.inputs(n))
        if (!v.empty() && seen.insert(v).second)
          if (const keel_tensor_t* t = gv_.initializer(v)) b += static_cast<int64_t>(t->byte_size);
    return b;
  }

  void keep(keel_node_id_t n, const std::string& why) {
    ++kept_;
    ++kept_why_[why][full_op(gv_, n)];
  }

  bool has_kernel(keel_node_id_t n) const {
    if (!g_host->kernel_exists) return true;
    std::string dom = gv_.domain(n);
    int32_t opset = gv_.opset(dom.c_str());
    if (opset <= 0 && !dom.empty()) opset = 1;
    const int32_t dts[1] = {cfg_.dtype};
    return g_host->kernel_exists(g_plugin, dom.c_str(), gv_.op(n).c_str(), opset, device_.c_str(), dts, 1) != 0;
  }

  // Whether node n's op has a kernel in the target dtype on the device that ranks below its f32 one (the reference
  // fp16 Conv beside oneDNN's f32 one on a CPU): converting it makes it slower, not faster. Without the core's
  // kernel_priority (ABI 1.2), false.
  bool ranks_below_f32(keel_node_id_t n) {
    if (!KEEL_HAS_MEMBER(g_host, keel_core_api_t, kernel_priority) || g_host->kernel_priority == nullptr) return false;
    const std::string dom = gv_.domain(n), key = full_op(gv_, n);
    if (auto it = ranks_below_.find(key); it != ranks_below_.end()) return it->second;
    int32_t opset = gv_.opset(dom.c_str());
    if (opset <= 0 && !dom.empty()) opset = 1;
    const int32_t low[1] = {cfg_.dtype}, f32[1] = {KEEL_DTYPE_F32};
    const int32_t pl =
        g_host->kernel_priority(g_plugin, dom.c_str(), gv_.op(n).c_str(), opset, device_.c_str(), low, 1);
    const int32_t pf =
        g_host->kernel_priority(g_plugin, dom.c_str(), gv_.op(n).c_str(), opset, device_.c_str(), f32, 1);
    return ranks_below_[key] = pl != INT32_MIN && pf != INT32_MIN && pl < pf;
  }

  void classify(const std::vector<keel_node_id_t>& order) {
    std::set<std::string> low_values;  // values the low nodes will write
    for (keel_node_id_t n : order) {
      const std::string op = full_op(gv_, n), dom = gv_.domain(n);
      bool float_out = false;
      for (const auto& o : gv_.outputs(n)) float_out = float_out || is_f32(gv_, o);
      if (!float_out) continue;  // integer/bool results (and Shape-like readers): nothing to convert
      if (!dom.empty() && dom != "keel") {
        keep(n, "unknown domain");
        continue;
      }
      Attrs attrs = gv_.attrs(n);
      if (!GraphView::all_readable(attrs)) {
        bool sub = gv_.op(n) == "If" || gv_.op(n) == "Loop" || gv_.op(n) == "Scan" || gv_.op(n) == "SequenceMap";
        if (sub) {
          ++subgraph_nodes_;
          keep(n, "subgraph");
        }
        continue;  // Constant and friends: a constant, not a computation
      }
      if (in(kNeverOps, op)) continue;
      if (in(cfg_.keep, gv_.op(n)) || in(cfg_.keep, op) || (!gv_.name(n).empty() && in(cfg_.keep, gv_.name(n)))) {
        keep(n, "keep_fp32 option");
        continue;
      }
      if (cfg_.default_keep && (in(kKeepAlways, op) || (cfg_.dtype == KEEL_DTYPE_F16 && in(kKeepF16, op)))) {
        keep(n, "keep-list: accuracy");
        continue;
      }
      bool want = in(kComputeOps, op) || !cfg_.autocast;
      if (!want) {
        // Follow: low when every non-constant float input is low (and there is one).
        bool any = false, all = true;
        for (const auto& v : gv_.inputs(n)) {
          if (v.empty() || is_constant(v) || !is_f32(gv_, v)) continue;
          any = true;
          all = all && low_values.count(v);
        }
        want = any && all;
        if (!want) continue;  // promotion: runs where its inputs are (fp32), not a "kept" decision
      }
      if (!has_kernel(n)) {
        keep(n, "no " + cfg_.suffix + " kernel on '" + device_ + "'");
        continue;
      }
      low_.insert(n);
      for (const auto& o : gv_.outputs(n))
        if (is_f32(gv_, o)) low_values.insert(o);
    }
  }

  // An initializer, or the output of an ai.onnx Constant node (models exported without constant folding have
  // many: Clip bounds, scale factors).
  bool is_constant(const std::string& v) const {
    if (gv_.is_initializer(v)) return true;
    auto p = gv_.producer(v);
    return p && gv_.is(*p, "Constant");
  }

  // The value of a Constant node's output, evaluated through the graph API (a new host tensor; nullptr if not).
  keel_tensor_t* evaluate_constant(const std::string& v) {
    auto p = gv_.producer(v);
    if (!p || !gv_.is(*p, "Constant") || !gv_.api()->evaluate) return nullptr;
    const char* nm = v.c_str();
    keel_tensor_t* t = nullptr;
    keel_status_t st = gv_.api()->evaluate(gv_.raw(), nullptr, nullptr, 0, &nm, 1, &t);
    if (st) {
      keel_status_release(st);
      return nullptr;
    }
    if (t && t->dtype != KEEL_DTYPE_F32) {
      gv_.api()->release_tensor(t);
      return nullptr;
    }
    return t;
  }

  // The low-type name of fp32 value `v` (a converted initializer or constant, the renamed output of a low node,
  // or a Cast).
  std::string low_name(const std::string& v) {
    auto it = low_name_.find(v);
    if (it != low_name_.end()) return it->second;
    std::string name;
    if (const keel_tensor_t* t = gv_.initializer(v)) {
      name = gv_.unique_name(v + "_" + cfg_.suffix);
      gv_.set_initializer(name, convert(t));
      converted_inits_.insert(v);
    } else if (keel_tensor_t* c = evaluate_constant(v)) {
      name = gv_.unique_name(v + "_" + cfg_.suffix);
      HostTensor h;
      try {
        h = convert(c);
      } catch (...) {
        gv_.api()->release_tensor(c);
        throw;
      }
      gv_.api()->release_tensor(c);
      gv_.set_initializer(name, h);
      converted_consts_.insert(v);
    } else {
      name = gv_.unique_name(v + "_" + cfg_.suffix);
      gv_.add_node("", "Cast", gv_.unique_name("cast_" + cfg_.suffix), {v}, {name},
                   {{"to", AttrValue::of_int(cfg_.dtype)}});
      own_casts_.insert(name);
      ++casts_inserted_;
    }
    low_name_[v] = name;
    return name;
  }

  HostTensor convert(const keel_tensor_t* t) {
    const int64_t n = GraphView::numel_of(t);
    const float* p = static_cast<const float*>(t->data);
    std::vector<uint16_t> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float x = p[i];
      if (cfg_.dtype == KEEL_DTYPE_BF16) {
        out[i] = f32_to_bf16(x);
        continue;
      }
      if (cfg_.clamp && std::isfinite(x)) {
        if (std::fabs(x) > kF16Max) {
          x = std::copysign(kF16Max, x);
          ++clamped_;
          ++clamped_over_;
        } else if (x != 0.f && std::fabs(x) < kF16MinSub) {
          x = std::copysign(kF16MinSub, x);
          ++clamped_;
          ++clamped_under_;
        }
      }
      out[i] = f32_to_f16(x);
    }
    return HostTensor::of<uint16_t>(cfg_.dtype, GraphView::dims_of(t), out);
  }

  void rewrite(keel_node_id_t n) {
    const std::string dom = gv_.domain(n), op = gv_.op(n), name = gv_.name(n);
    Attrs attrs = gv_.attrs(n);
    if (op == "LayerNormalization") attrs["stash_type"] = AttrValue::of_int(1);
    std::vector<std::string> ins = gv_.inputs(n), outs = gv_.outputs(n);
    for (auto& v : ins)
      if (is_f32(gv_, v)) v = low_name(v);
    std::vector<std::pair<std::string, std::string>> back;  // (low, f32) outputs that need an f32 copy
    for (auto& o : outs) {
      if (!is_f32(gv_, o)) continue;
      std::string lo = gv_.unique_name(o + "_" + cfg_.suffix);
      bool f32_reader = gv_.is_graph_output(o);
      for (keel_node_id_t c : gv_.consumers(o))
        f32_reader = f32_reader || (!low_.count(c) && !(gv_.domain(c).empty() && in(kDtypeBlindReaders, gv_.op(c))));
      if (f32_reader) back.emplace_back(lo, o);
      low_name_[o] = lo;
      o = lo;
    }
    gv_.remove_node(n);
    gv_.add_node(dom, op, name, ins, outs, attrs);
    for (const auto& [lo, f] : back) {
      gv_.add_node("", "Cast", gv_.unique_name("cast_fp32"), {lo}, {f}, {{"to", AttrValue::of_int(KEEL_DTYPE_F32)}});
      own_casts_.insert(f);
      ++casts_inserted_;
    }
    ++converted_;
  }

  // Casts this pass added whose result nobody reads (a low value's f32 copy whose readers all went low later).
  void drop_unused_casts() {
    bool again = true;
    while (again) {
      again = false;
      for (keel_node_id_t n : gv_.nodes()) {
        if (!gv_.exists(n) || !gv_.is(n, "Cast")) continue;
        std::string o = gv_.output(n, 0);
        if (gv_.use_count(o) != 0 || !own_casts_.count(o)) continue;
        gv_.remove_node(n);
        --casts_inserted_;
        again = true;
      }
    }
  }

  int32_t dtype_of(const std::string& v) const {
    if (const keel_tensor_t* t = gv_.initializer(v)) return t->dtype;
    auto t = gv_.value_type(v);
    return t ? t->dtype : KEEL_DTYPE_UNDEFINED;
  }
  // The dtype a value has after this pass (new values have no value info until shapes are inferred).
  int32_t dtype_now(const std::string& v) const {
    if (auto p = gv_.producer(v); p && gv_.is(*p, "Cast")) {
      if (auto to = gv_.attr_int(*p, "to")) return static_cast<int32_t>(*to);
    }
    for (const auto& [f, lo] : low_name_)
      if (lo == v) return cfg_.dtype;
    return dtype_of(v);
  }

  // Cast(Cast(a: A -> f32) -> A) is a; Cast(a: A -> A) is a. Graph outputs keep their Cast (their name is theirs).
  void collapse_casts() {
    for (keel_node_id_t n : gv_.nodes()) {
      if (!gv_.exists(n) || !gv_.is(n, "Cast")) continue;
      const std::string y = gv_.output(n, 0), x = gv_.input(n, 0);
      if (gv_.is_graph_output(y)) continue;
      auto to = gv_.attr_int(n, "to");
      if (!to) continue;
      std::string src;
      const int32_t xd = dtype_now(x);
      if (xd == *to) {
        src = x;
      } else if (auto p = gv_.producer(x); p && gv_.is(*p, "Cast")) {
        const std::string a = gv_.input(*p, 0);
        const int32_t ad = dtype_now(a);
        const bool widening = xd == KEEL_DTYPE_F32 && (ad == KEEL_DTYPE_F16 || ad == KEEL_DTYPE_BF16);
        if (ad == *to && widening) src = a;
      }
      if (src.empty()) continue;
      gv_.replace_uses(y, src);
      gv_.remove_node(n);
      ++casts_collapsed_;
      if (auto p = gv_.producer(x); p && gv_.is(*p, "Cast") && gv_.use_count(x) == 0) {
        gv_.remove_node(*p);
        ++casts_collapsed_;
      }
    }
  }

  GraphView& gv_;
  Report& report_;
  Config cfg_;
  std::string device_;
  std::set<keel_node_id_t> low_;
  std::map<std::string, std::string> low_name_;
  std::set<std::string> converted_inits_;
  std::set<std::string> own_casts_;
  std::set<std::string>
      converted_consts_;  // Constant-node outputs given a low initializer  // outputs of the Casts this pass added
  std::map<std::string, std::map<std::string, int64_t>> kept_why_;
  std::map<std::string, bool> ranks_below_;  // ranks_below_f32's answers by op
  int64_t converted_ = 0, kept_ = 0, casts_inserted_ = 0, casts_collapsed_ = 0, subgraph_nodes_ = 0;
  int64_t clamped_ = 0, clamped_over_ = 0, clamped_under_ = 0;
};

keel_status_t run_with(const char* fixed, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* options,
                       const char* device, keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    PassOptions o(g_host->options, options);
    Converter(gv, report, read_config(o, fixed), device).run();
  });
}

keel_status_t convert_precision(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* o,
                                const char* device, keel_pass_report_t* r) {
  return run_with("", g, api, o, device, r);
}
keel_status_t convert_fp16(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* o,
                           const char* device, keel_pass_report_t* r) {
  return run_with("fp16", g, api, o, device, r);
}
keel_status_t convert_bf16(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* o,
                           const char* device, keel_pass_report_t* r) {
  return run_with("bf16", g, api, o, device, r);
}

keel_status_t init_instance(const keel_core_api_t* host, keel_plugin_handle_t* plugin, void** out_instance) {
  static const PassSpec kPasses[] = {
      {"convert_precision",
       "mixed precision: fp32 compute to fp16/bf16 (option dtype), fp32 boundaries, keep-list in fp32",
       convert_precision},
      {"convert_fp16", "convert_precision with dtype = fp16", convert_fp16},
      {"convert_bf16", "convert_precision with dtype = bf16", convert_bf16},
  };
  return init_pass_instance(host, plugin, out_instance, kPasses);
}

const keel_plugin_t kPlugin = {.struct_size = sizeof(keel_plugin_t),
                               .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                               .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                               .name = "precision",
                               .version = "0.1.0",
                               .kind = KEEL_PLUGIN_KIND_PASS,
                               .init = nullptr,
                               .shutdown = nullptr,
                               .init_instance = init_instance,
                               .shutdown_instance = shutdown_pass_instance};

}  // namespace
}  // namespace keel::passes

extern "C" KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &keel::passes::kPlugin; }
