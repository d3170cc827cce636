// The pruning pass plugin. Built against the SDK alone.
//
//   prune   options: ratio (0..1, default 0.5), mode ("magnitude" | "channel", default "magnitude").
//     magnitude  zeroes the smallest-|w| `ratio` fraction of every f32 weight initializer read by Conv (input 1),
//                Gemm (input 1) or MatMul (input 1). The graph keeps its shapes (unstructured sparsity).
//     channel    structured pruning (option coupled, default true): Conv output channels are grouped into channel
//                groups — every value sharing one channel index space, found transitively: Conv (group 1, private
//                f32 constant weight and bias) outputs, channel-wise ops (Relu, LeakyRelu, Sigmoid, HardSigmoid,
//                HardSwish, Clip, Tanh, Elu, Selu, Softplus, Identity, Dropout, MaxPool, AveragePool,
//                GlobalAveragePool, GlobalMaxPool, BatchNormalization with private constant parameters), Flatten
//                (axis 1) of a 1x1 map, depthwise Convs (group = channels: weight rows and `group` shrink with the
//                group), and all inputs and the output of every Add/Sum they meet (residual
//                coupling: a ResNet stage's stem/downsample Convs, its blocks' last Convs and the residual chain are
//                one group). The `ratio` fraction of the group's channels with the lowest summed L1 norm (over the
//                group's producer Convs) is removed from every producer (weight rows, bias), every
//                BatchNormalization, and every reader (Conv input channels, Gemm/MatMul input features after
//                Flatten; a Flatten (axis 1) of a C×H×W map with known spatial dims, as LeNet's conv → pool →
//                flatten → fc, removes H·W consecutive features per channel from the Gemm/MatMul readers behind it,
//                through element-wise ops such as Relu, Identity and Dropout). Grouped Convs (group G > 1, not
//                depthwise; ResNeXt/ShuffleNet style) producing or reading a group split its channels into G contiguous
//                blocks: every block loses the same number of channels (the blocks of the least common multiple of all
//                G do), so each grouped Conv keeps its `group` with fewer channels per group; a reader Conv's weight
//                keeps, per output row, the columns of its own block's kept channels. A group is skipped with a
//                "skipped: <reason>" note when it reaches a graph input or output, a constant, a broadcasting Add,
//                Mul/Sub of two computed values, unknown ops, a weight shared elsewhere, or when the ratio removes no
//                channel (e.g. one input channel per group of a depthwise-multiplier Conv). Mul/Add/Sub/Div with a
//                constant that is a scalar or one value per channel pass the group through (the constant shrinks with
//                it). A group value that is an input of a Concat (axis 1) keeps its place there: the readers behind the
//                Concat (Conv/Gemm/MatMul, through channel-wise ops, Flatten of a 1x1 map, BatchNormalization and
//                further Concats, whose offsets add up) lose the removed channels at the group's offset (SqueezeNet's
//                fire modules, DenseNet-style joins, nested Concats). A Concat's output that meets an Add/Sum couples
//                its channels to the other operands: Convs (group 1) writing those (directly or through channel-wise
//                ops and BatchNormalization) lose the group's rows at its offset and count in its score, so the same
//                channels go on both sides; the Add's own group (started from such a Conv) is left to the Concat
//                inputs' groups, with a note. coupled = false: the older per-chain mode — a Conv whose output reaches
//                exactly one following Conv through single-use channel-wise ops is pruned alone; chains that reach a
//                residual Add/Sum/Concat are left alone with a "skipped: residual-coupled" note.
// Counters: weights_zeroed, channels_removed, convs_pruned, params_removed (+ groups_pruned,
// residual_groups_pruned when coupled).
#include <keel/plugin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "common/graph_view.h"
#include "common/pass_instance.h"

namespace keel::passes {
namespace {

bool is_weight_op(GraphView& gv, keel_node_id_t n) {
  return gv.is(n, "Conv") || gv.is(n, "Gemm") || gv.is(n, "MatMul");
}

void prune_magnitude(GraphView& gv, double ratio, Report& report) {
  std::set<std::string> done;
  int64_t zeroed = 0, total = 0;
  for (keel_node_id_t n : gv.nodes()) {
    if (!is_weight_op(gv, n)) continue;
    std::string w = gv.input(n, 1);
    if (w.empty() || done.count(w)) continue;
    const keel_tensor_t* t = gv.initializer(w);
    if (!t || t->dtype != KEEL_DTYPE_F32) continue;
    done.insert(w);
    std::vector<float> v = *gv.f32_values(w);
    size_t k = static_cast<size_t>(std::floor(ratio * static_cast<double>(v.size())));
    total += static_cast<int64_t>(v.size());
    if (k == 0) continue;
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), size_t{0});
    std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k - 1), idx.end(),
                     [&](size_t a, size_t b) { return std::fabs(v[a]) < std::fabs(v[b]); });
    for (size_t i = 0; i < k; ++i) v[idx[i]] = 0.f;
    zeroed += static_cast<int64_t>(k);
    gv.set_initializer(w, HostTensor::of<float>(KEEL_DTYPE_F32, GraphView::dims_of(t), v));
  }
  report.count("weights_zeroed", zeroed);
  report.count("weights_total", total);
}

// Ops that act on each channel independently (channel removal passes through them).
bool channelwise(const std::string& op) {
  static const std::set<std::string> k = {
      "Relu",        "LeakyRelu",         "Sigmoid",       "HardSigmoid",        "HardSwish", "Clip", "MaxPool",
      "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "Identity",  "Tanh", "Elu",
      "Selu",        "Softplus",          "Dropout"};
  return k.count(op) != 0;
}
bool coupling(const std::string& op) {
  return op == "Add" || op == "Sum" || op == "Concat" || op == "Sub" || op == "Mul";
}

int64_t group_of(GraphView& gv, keel_node_id_t n) { return gv.attr_int(n, "group").value_or(1); }

std::string ratio_text(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", r);
  return buf;
}

// Keeps the listed indices along `axis` of an f32 tensor of dims `d`.
std::vector<float> select_axis(const std::vector<float>& v, const std::vector<int64_t>& d, int axis,
                               const std::vector<int64_t>& keep) {
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= d[i];
  for (size_t i = axis + 1; i < d.size(); ++i) inner *= d[i];
  std::vector<float> r;
  r.reserve(static_cast<size_t>(outer * static_cast<int64_t>(keep.size()) * inner));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c : keep)
      for (int64_t i = 0; i < inner; ++i) r.push_back(v[static_cast<size_t>((o * d[axis] + c) * inner + i)]);
  return r;
}

// Input `i` of node `n` (an f32 initializer of `old_numel` elements) becomes a new initializer `r` of dims `d`; the
// old one is dropped when unread. Returns the number of elements removed.
int64_t replace_input(GraphView& gv, keel_node_id_t n, size_t i, const std::vector<int64_t>& d,
                      const std::vector<float>& r, size_t old_numel) {
  std::string name = gv.input(n, i);
  std::string fresh = gv.add_f32(name + "_pruned", d, r);
  gv.set_input(n, i, fresh);
  if (gv.use_count(name) == 0) gv.remove_initializer(name);
  return static_cast<int64_t>(old_numel - r.size());
}

// Replaces input `i` of node `n` (an f32 initializer) by a new initializer of kept indices along `axis`; drops the
// old one when unread. Returns the number of elements removed.
int64_t shrink_input(GraphView& gv, keel_node_id_t n, size_t i, int axis, const std::vector<int64_t>& keep) {
  std::string name = gv.input(n, i);
  std::vector<int64_t> d = GraphView::dims_of(gv.initializer(name));
  std::vector<float> v = *gv.f32_values(name);
  std::vector<float> r = select_axis(v, d, axis, keep);
  d[static_cast<size_t>(axis)] = static_cast<int64_t>(keep.size());
  return replace_input(gv, n, i, d, r, v.size());
}

// Removes input channels of Conv `n` (weight [O, C/G, ...], `group` G): `keep` lists the kept channels among the C
// input channels, the same number in each of the G blocks of C/G. Output row o (block o / (O/G)) keeps the columns
// of its own block's kept channels. G = 1 is a plain column selection.
int64_t shrink_conv_inputs(GraphView& gv, keel_node_id_t n, const std::vector<int64_t>& keep) {
  const int64_t G = group_of(gv, n);
  if (G == 1) return shrink_input(gv, n, 1, 1, keep);
  std::string name = gv.input(n, 1);
  std::vector<int64_t> d = GraphView::dims_of(gv.initializer(name));
  std::vector<float> v = *gv.f32_values(name);
  const int64_t O = d[0], per = d[1];
  int64_t inner = 1;
  for (size_t i = 2; i < d.size(); ++i) inner *= d[i];
  std::vector<std::vector<int64_t>> cols(static_cast<size_t>(G));
  for (int64_t c : keep) cols[static_cast<size_t>(c / per)].push_back(c % per);
  for (const auto& b : cols)
    if (b.size() != cols[0].size() || b.empty())
      throw PassError(KEEL_STATUS_INTERNAL, "prune: uneven channel removal across the groups of Conv " + gv.name(n));
  std::vector<float> r;
  r.reserve(static_cast<size_t>(O * static_cast<int64_t>(cols[0].size()) * inner));
  for (int64_t o = 0; o < O; ++o)
    for (int64_t j : cols[static_cast<size_t>(o / (O / G))])
      for (int64_t i = 0; i < inner; ++i) r.push_back(v[static_cast<size_t>((o * per + j) * inner + i)]);
  d[1] = static_cast<int64_t>(cols[0].size());
  return replace_input(gv, n, 1, d, r, v.size());
}

void prune_channels(GraphView& gv, double ratio, Report& report) {
  int64_t removed_channels = 0, convs = 0, params = 0;
  std::set<keel_node_id_t> touched;
  for (keel_node_id_t c1 : gv.nodes()) {
    if (!gv.exists(c1) || !gv.is(c1, "Conv") || touched.count(c1)) continue;
    const std::string cname = gv.name(c1);
    std::string wname = gv.input(c1, 1);
    const keel_tensor_t* w = gv.initializer(wname);
    if (!w || w->dtype != KEEL_DTYPE_F32 || w->ndim < 3) {
      report.note("skipped: no f32 constant weight (" + cname + ")");
      continue;
    }
    if (group_of(gv, c1) != 1) {
      report.note("skipped: grouped Conv, which the per-chain mode leaves alone (" + cname + ")");
      continue;
    }
    if (gv.use_count(wname) != 1) {
      report.note("skipped: weight shared (" + cname + ")");
      continue;
    }
    std::string bname = gv.input(c1, 2);
    if (!bname.empty() && (!gv.initializer(bname) || gv.use_count(bname) != 1)) {
      report.note("skipped: bias not a private constant (" + cname + ")");
      continue;
    }
    // Walk forward to the next Conv.
    std::vector<keel_node_id_t> chain;
    std::string v = gv.output(c1, 0);
    std::string why;
    keel_node_id_t c2 = 0;
    bool found = false;
    while (true) {
      if (gv.is_graph_output(v)) {
        why = "output is a graph output";
        break;
      }
      auto cons = gv.consumers(v);
      bool coupled = false;
      for (auto c : cons) coupled = coupled || coupling(gv.op(c));
      if (coupled) {
        why = "residual-coupled";
        break;
      }
      if (cons.size() != 1) {
        why = "output has " + std::to_string(cons.size()) + " readers";
        break;
      }
      keel_node_id_t c = cons[0];
      if (!gv.domain(c).empty()) {
        why = "reaches " + gv.op(c) + " (custom domain)";
        break;
      }
      if (gv.is(c, "Conv")) {
        if (gv.input(c, 0) != v || group_of(gv, c) != 1 || !gv.initializer(gv.input(c, 1)) ||
            gv.initializer(gv.input(c, 1))->dtype != KEEL_DTYPE_F32 || gv.use_count(gv.input(c, 1)) != 1) {
          why = "next Conv is grouped or has no private constant weight";
          break;
        }
        c2 = c;
        found = true;
        break;
      }
      std::string op = gv.op(c);
      if (!channelwise(op)) {
        why = "reaches " + op;
        break;
      }
      if (gv.input(c, 0) != v) {
        why = "reaches " + op + " at another input";
        break;
      }
      if (op == "BatchNormalization") {
        bool ok = true;
        for (size_t i = 1; i < 5; ++i) {
          std::string p = gv.input(c, i);
          ok = ok && gv.initializer(p) && gv.initializer(p)->dtype == KEEL_DTYPE_F32 && gv.use_count(p) == 1;
        }
        if (!ok) {
          why = "BatchNormalization parameters are not private constants";
          break;
        }
      }
      if (op == "Clip" || op == "Dropout") {
        for (size_t i = 1; i < gv.inputs(c).size(); ++i)
          if (!gv.input(c, i).empty() && !gv.is_initializer(gv.input(c, i))) why = op + " with a computed operand";
        if (!why.empty()) break;
      }
      chain.push_back(c);
      v = gv.output(c, 0);
    }
    if (!found) {
      report.note("skipped: " + why + " (" + cname + ")");
      continue;
    }
    const int64_t O = w->dims[0];
    int64_t k = static_cast<int64_t>(std::floor(ratio * static_cast<double>(O)));
    k = std::min<int64_t>(k, O - 1);
    if (k <= 0) {
      if (ratio > 0)
        report.note("skipped: ratio " + ratio_text(ratio) + " removes no channel of " + std::to_string(O) + " (" +
                    cname + ")");
      continue;
    }
    std::vector<float> wv = *gv.f32_values(wname);
    const int64_t per = static_cast<int64_t>(wv.size()) / O;
    std::vector<double> l1(static_cast<size_t>(O), 0.0);
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < per; ++i) l1[o] += std::fabs(wv[static_cast<size_t>(o * per + i)]);
    // A channel whose bias/BN makes it non-zero is still ranked by its weight L1, as the option promises.
    std::vector<int64_t> order(static_cast<size_t>(O));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l1[a] < l1[b]; });
    std::vector<int64_t> keep(order.begin() + k, order.end());
    std::sort(keep.begin(), keep.end());
    params += shrink_input(gv, c1, 1, 0, keep);
    if (!bname.empty()) params += shrink_input(gv, c1, 2, 0, keep);
    for (keel_node_id_t c : chain)
      if (gv.is(c, "BatchNormalization"))
        for (size_t i = 1; i < 5; ++i) params += shrink_input(gv, c, i, 0, keep);
    params += shrink_input(gv, c2, 1, 1, keep);
    touched.insert(c1);
    removed_channels += k;
    ++convs;
    report.note("pruned " + cname + ": " + std::to_string(k) + " of " + std::to_string(O) + " output channels");
  }
  if (convs) gv.infer_shapes();
  report.count("channels_removed", removed_channels);
  report.count("convs_pruned", convs);
  report.count("params_removed", params);
}

// ---- residual-coupled channel groups (coupled = true) ----
//
// A group is the set of values that share one channel index space (axis 1): the outputs of the Convs that produce
// them, everything that passes channels through unchanged (channel-wise ops, Flatten of a 1x1 map) and every value an
// Add/Sum meets (all its inputs and its output, so a ResNet stage — stem/downsample Convs, every block's last Conv and
// the residual chain between them — is one group). Readers are the ops that consume the channels: Conv input channels,
// Gemm/MatMul input features after Flatten. Removing channel c removes it from every producer, BN and reader at once.
struct ChannelGroup {
  std::set<std::string> values;
  std::set<keel_node_id_t> passed;        // channel-wise / Add / Flatten nodes inside the group
  std::vector<keel_node_id_t> producers;  // Convs writing a group value: weight axis 0 and bias shrink
  std::vector<keel_node_id_t> norms;      // BatchNormalization on a group value: parameters 1..4 shrink
  std::vector<keel_node_id_t> depthwise;  // depthwise Convs inside the group: weight axis 0, bias, `group`
  std::vector<std::pair<keel_node_id_t, int>> readers;  // (node, weight axis) for input input channels / features
  // Gemm/MatMul reading a Flatten (axis 1) of a [N, C, spatial...] group value: channel c is the `spatial` features
  // c·spatial .. (c+1)·spatial − 1 of the weight's input axis.
  struct FlatReader {
    keel_node_id_t node;
    int axis;
    int64_t spatial;
  };
  std::vector<FlatReader> flat_readers;
  // Per-channel constant operands of Mul/Add/Sub/Div on a group value ([C,1,..] or [1,C,1,..]): (node, input).
  std::vector<std::pair<keel_node_id_t, size_t>> constants;
  // Readers behind a Concat (axis 1) the group's values feed: the group's channels sit at an offset of the Concat's
  // output (input `input` of `concat`), found when pruning from the current shapes of the Concat's inputs.
  // Through nested Concats the offset is the sum over the chain of (Concat, input) links, outermost last.
  struct OffsetReader {
    keel_node_id_t node;
    // weight axis (Conv: 1; Gemm/MatMul: 0 or 1); -1: a BatchNormalization (parameters 1..4); -2: a Conv writing
    // the Concat's channel space (an operand of an Add/Sum there): weight rows and bias, also scored with the group.
    int axis;
    std::vector<std::pair<keel_node_id_t, size_t>> chain;
  };
  std::vector<OffsetReader> offset_readers;
  // Grouped (not depthwise) Convs producing or reading the group split its channels into `group` contiguous blocks
  // each; every block must lose the same number of channels (the blocks of their least common multiple do).
  std::vector<int64_t> blocks;
  int64_t channels = -1;
  bool residual = false;
  std::string why;  // non-empty: the group cannot be pruned
};

bool private_f32(GraphView& gv, const std::string& v) {
  const keel_tensor_t* t = gv.initializer(v);
  return t && t->dtype == KEEL_DTYPE_F32 && gv.use_count(v) == 1;
}

// A depthwise Conv (group = input channels = output channels, weight [C, 1, ...], private constants) maps channel c
// to channel c: it passes the group through, its weight rows and `group` shrink with it.
bool depthwise_conv(GraphView& gv, keel_node_id_t n) {
  if (!gv.is(n, "Conv") || !gv.domain(n).empty()) return false;
  const keel_tensor_t* w = gv.initializer(gv.input(n, 1));
  if (!w || w->ndim < 3 || w->dims[1] != 1 || group_of(gv, n) != w->dims[0] || w->dims[0] < 2) return false;
  std::string b = gv.input(n, 2);
  return private_f32(gv, gv.input(n, 1)) && (b.empty() || private_f32(gv, b));
}

class GroupBuilder {
 public:
  GroupBuilder(GraphView& gv, ChannelGroup& g) : gv_(gv), g_(g) {}

  void build(keel_node_id_t conv) {
    if (!add_producer(conv)) return;
    add_value(gv_.output(conv, 0));
    while (!work_.empty() && g_.why.empty()) {
      std::string v = work_.back();
      work_.pop_back();
      visit(v);
    }
  }

 private:
  void fail(const std::string& why) {
    if (g_.why.empty()) g_.why = why;
  }
  void add_value(const std::string& v) {
    if (g_.values.insert(v).second) work_.push_back(v);
  }
  // Channel count of value v (axis 1) if known.
  void check_channels(const std::string& v, int64_t c) {
    if (c < 0) return;
    if (g_.channels < 0) g_.channels = c;
    else if (g_.channels != c) fail("channel counts disagree at " + v);
  }
  bool add_producer(keel_node_id_t n) {
    std::string w = gv_.input(n, 1), b = gv_.input(n, 2);
    if (!private_f32(gv_, w) || gv_.initializer(w)->ndim < 3)
      return fail("Conv " + gv_.name(n) + " has no private f32 constant weight"), false;
    if (!b.empty() && !private_f32(gv_, b))
      return fail("Conv " + gv_.name(n) + " bias is not a private constant"), false;
    const int64_t G = group_of(gv_, n), O = gv_.initializer(w)->dims[0];
    if (G < 1 || O % G != 0)
      return fail("Conv " + gv_.name(n) + " has " + std::to_string(O) + " outputs in " + std::to_string(G) + " groups"),
             false;
    if (G > 1) g_.blocks.push_back(G);  // its output rows: G blocks of O/G
    check_channels(gv_.output(n, 0), O);
    if (std::find(g_.producers.begin(), g_.producers.end(), n) == g_.producers.end()) g_.producers.push_back(n);
    return true;
  }
  // Only output 0 of a pass-through node may be read.
  bool extra_outputs_unused(keel_node_id_t n) {
    auto outs = gv_.outputs(n);
    for (size_t i = 1; i < outs.size(); ++i)
      if (!outs[i].empty() && gv_.use_count(outs[i]) != 0) return false;
    return true;
  }
  bool spatial_is_one(const std::string& v) {
    auto t = gv_.value_type(v);
    if (!t || t->ndim < 2) return false;
    for (int32_t d = 2; d < t->ndim; ++d)
      if (t->dims[static_cast<size_t>(d)] != 1) return false;
    return true;
  }
  // Mul/Add/Sub/Div of a group value and a constant that is a scalar or one value per channel ([C,1,..] over the
  // spatial axes, or [1,C,1,..]): the index of the constant operand, or -1.
  int constant_operand(keel_node_id_t n) {
    const std::string op = gv_.op(n);
    if (op != "Mul" && op != "Add" && op != "Sub" && op != "Div") return -1;
    auto ins = gv_.inputs(n);
    if (ins.size() != 2) return -1;
    const bool c0 = gv_.is_initializer(ins[0]), c1 = gv_.is_initializer(ins[1]);
    if (c0 == c1) return -1;
    return c0 ? 0 : 1;
  }
  bool per_channel_constant(keel_node_id_t n, int k, const std::string& x) {
    const std::string c = gv_.input(n, static_cast<size_t>(k));
    const keel_tensor_t* t = gv_.initializer(c);
    auto xt = gv_.value_type(x);
    if (!t || t->dtype != KEEL_DTYPE_F32 || !xt || xt->ndim < 2) return false;
    std::vector<int64_t> d = GraphView::dims_of(t);
    if (GraphView::numel_of(t) == 1) return static_cast<int32_t>(d.size()) <= xt->ndim;
    // Right-aligned against x: the channel axis (1) must hold C and every other axis 1.
    if (static_cast<int32_t>(d.size()) > xt->ndim || static_cast<int32_t>(d.size()) < xt->ndim - 1) return false;
    const size_t ch = d.size() - static_cast<size_t>(xt->ndim - 1);  // index of x's axis 1 in d
    for (size_t i = 0; i < d.size(); ++i)
      if (i != ch && d[i] != 1) return false;
    if (g_.channels >= 0 && d[ch] != g_.channels) return false;
    if (gv_.use_count(c) != 1) return false;  // shrunk in place: must be private
    g_.constants.emplace_back(n, static_cast<size_t>(k));
    return true;
  }
  // Concat `concat` (axis 1) reads the group's channels at input `j`: its inputs' shapes must be known, the input
  // read once, and the group may reach each Concat only once (one offset per Concat).
  bool concat_link(keel_node_id_t concat, size_t j) {
    auto out_t = gv_.value_type(gv_.output(concat, 0));
    if (!out_t || out_t->ndim < 2) return fail("Concat " + gv_.name(concat) + " has an unknown shape"), false;
    int64_t axis = gv_.attr_int(concat, "axis").value_or(0);
    if (axis < 0) axis += out_t->ndim;
    if (axis != 1)
      return fail("Concat " + gv_.name(concat) + " joins along axis " + std::to_string(axis) + ", not channels"), false;
    auto ins = gv_.inputs(concat);
    if (std::count(ins.begin(), ins.end(), ins[j]) != 1)
      return fail("Concat " + gv_.name(concat) + " reads a value twice"), false;
    if (!concats_.insert(concat).second)
      return fail("the group reaches Concat " + gv_.name(concat) + " along two paths"), false;
    for (const std::string& in : ins) {
      auto t = gv_.value_type(in);
      if (!t || t->ndim != out_t->ndim || t->dims[1] < 0)
        return fail("Concat " + gv_.name(concat) + " input shapes unknown"), false;
    }
    return true;
  }
  // The Concat (axis 1) output a group value feeds at input `j`: its readers take the group's channels at an offset.
  // Followed through channel-wise ops (and Flatten of a 1x1 map) and further Concats (axis 1; the offsets add up) to
  // Conv (group 1) / Gemm / MatMul readers and BatchNormalizations. Anything else stops the group with a reason: an
  // Add/Sum (the Concat's channels would be coupled to another value's), a graph output, grouped or depthwise Convs.
  using Chain = std::vector<std::pair<keel_node_id_t, size_t>>;
  using SpaceWork = std::vector<std::pair<std::string, Chain>>;
  // An Add/Sum in a Concat's channel space: all its operands and its output share the space (same offsets).
  bool space_join(keel_node_id_t n, const Chain& chain, SpaceWork& work) {
    auto out_t = gv_.value_type(gv_.output(n, 0));
    for (const std::string& in : gv_.inputs(n)) {
      auto t = gv_.value_type(in);
      if (!t || !out_t || t->ndim != out_t->ndim || t->ndim < 2 || t->dims[1] != out_t->dims[1])
        return fail(gv_.op(n) + " " + gv_.name(n) + " behind a Concat broadcasts channels or has unknown shapes"),
               false;
      work.emplace_back(in, chain);
    }
    if (!extra_outputs_unused(n)) return fail(gv_.op(n) + " " + gv_.name(n) + " has a second output in use"), false;
    work.emplace_back(gv_.output(n, 0), chain);
    g_.residual = true;
    return true;
  }
  // A value u of a Concat's channel space that the Concat itself did not write (an operand of an Add/Sum there, and
  // what leads to it): its producer works on the same channels at the same offset. Conv (group 1) producers lose the
  // group's rows at the offset; channel-wise ops, BatchNormalization and Flatten lead further up; Add/Sum join more
  // operands; anything else (a graph input, another Concat, a depthwise Conv, ...) stops the group.
  void space_producer(const std::string& u, const Chain& chain, SpaceWork& work) {
    const std::string cat = gv_.name(chain.back().first);
    if (g_.values.count(u)) return fail("Concat " + cat + " leads the group's own channels back to " + u);
    if (gv_.is_graph_input(u)) return fail("Concat " + cat + "'s channels meet graph input " + u + " in an Add");
    if (gv_.is_initializer(u)) return fail("Concat " + cat + "'s channels meet constant " + u + " in an Add");
    auto p = gv_.producer(u);
    if (!p) return fail("no producer for " + u);
    const std::string op = gv_.op(*p);
    if (!gv_.domain(*p).empty()) return fail("reaches " + op + " (custom domain) behind a Concat");
    if (op == "Add" || op == "Sum") {
      space_join(*p, chain, work);
      return;
    }
    if (gv_.output(*p, 0) != u || !extra_outputs_unused(*p))
      return fail(op + " " + gv_.name(*p) + " writes " + u + " as a secondary output or has one in use");
    if (op == "Conv" && !depthwise_conv(gv_, *p)) {
      const std::string w = gv_.input(*p, 1), b = gv_.input(*p, 2);
      if (group_of(gv_, *p) != 1 || !private_f32(gv_, w) || gv_.initializer(w)->ndim < 3 ||
          (!b.empty() && !private_f32(gv_, b)))
        return fail("Conv " + gv_.name(*p) + " adding to Concat " + cat +
                    "'s channels is grouped or has no private f32 weight and bias");
      if (std::find(g_.producers.begin(), g_.producers.end(), *p) != g_.producers.end())
        return fail("Conv " + gv_.name(*p) + " writes the group's channels twice");
      g_.offset_readers.push_back({*p, -2, chain});
      return;
    }
    if (op == "Flatten") {
      if (gv_.attr_int(*p, "axis").value_or(1) != 1 || !spatial_is_one(gv_.input(*p, 0)))
        return fail("Flatten " + gv_.name(*p) + " mixes channels with spatial positions");
    } else if (!channelwise(op) || op == "Conv") {
      return fail("Concat " + cat + "'s channels meet " + op + " " + gv_.name(*p) + " through an Add");
    } else if (op == "BatchNormalization") {
      for (size_t i = 1; i < 5; ++i)
        if (!private_f32(gv_, gv_.input(*p, i)))
          return fail("BatchNormalization " + gv_.name(*p) + " parameters are not private constants");
      g_.offset_readers.push_back({*p, -1, chain});
    }
    work.emplace_back(gv_.input(*p, 0), chain);
  }
  void behind_concat(keel_node_id_t concat, size_t j) {
    if (!concat_link(concat, j)) return;
    SpaceWork work = {{gv_.output(concat, 0), Chain{{concat, j}}}};
    std::set<std::string> seen;
    while (!work.empty() && g_.why.empty()) {
      auto [u, chain] = work.back();
      work.pop_back();
      if (!seen.insert(u).second) continue;
      const std::string cat = gv_.name(chain.back().first);
      if (gv_.is_graph_output(u)) return fail("Concat " + cat + " reaches graph output " + u);
      if (auto p = gv_.producer(u); !p || *p != chain.back().first) {
        space_producer(u, chain, work);
        if (!g_.why.empty()) return;
      }
      for (keel_node_id_t c : gv_.consumers(u)) {
        const std::string op = gv_.op(c);
        if (!gv_.domain(c).empty()) return fail("reaches " + op + " (custom domain) behind a Concat");
        auto cin = gv_.inputs(c);
        if (op == "Add" || op == "Sum") {
          if (!space_join(c, chain, work)) return;
          continue;
        }
        if (op == "Concat") {
          const size_t k = static_cast<size_t>(std::find(cin.begin(), cin.end(), u) - cin.begin());
          if (!concat_link(c, k)) return;
          Chain next = chain;
          next.emplace_back(c, k);
          work.emplace_back(gv_.output(c, 0), std::move(next));
          continue;
        }
        if (cin.empty() || cin[0] != u || std::count(cin.begin(), cin.end(), u) != 1)
          return fail(op + " " + gv_.name(c) + " reads the Concat's channels at another input");
        if (op == "Conv") {
          std::string w = gv_.input(c, 1);
          if (group_of(gv_, c) != 1)
            return fail("Conv " + gv_.name(c) + " behind Concat " + cat +
                        " is grouped (its groups would straddle the "
                        "Concat's inputs)");
          if (!private_f32(gv_, w) || gv_.initializer(w)->ndim < 3)
            return fail("Conv " + gv_.name(c) + " behind a Concat has no private f32 weight");
          g_.offset_readers.push_back({c, 1, chain});
        } else if (op == "Gemm" || op == "MatMul") {
          std::string w = gv_.input(c, 1);
          auto t = gv_.value_type(u);
          if (!private_f32(gv_, w) || gv_.initializer(w)->ndim != 2 || !t || t->ndim != 2 ||
              (op == "Gemm" && gv_.attr_int(c, "transA").value_or(0)))
            return fail(op + " " + gv_.name(c) + " behind a Concat has no private 2-D f32 weight on [N, C]");
          g_.offset_readers.push_back({c, op == "Gemm" && gv_.attr_int(c, "transB").value_or(0) ? 1 : 0, chain});
        } else if (op == "Flatten") {
          if (gv_.attr_int(c, "axis").value_or(1) != 1 || !spatial_is_one(u))
            return fail("Flatten " + gv_.name(c) + " mixes channels with spatial positions");
          work.emplace_back(gv_.output(c, 0), chain);
        } else if (channelwise(op) && !depthwise_conv(gv_, c)) {
          if (!extra_outputs_unused(c)) return fail(op + " " + gv_.name(c) + " has a second output in use");
          if (op == "BatchNormalization") {
            for (size_t i = 1; i < 5; ++i)
              if (!private_f32(gv_, gv_.input(c, i)))
                return fail("BatchNormalization " + gv_.name(c) + " parameters are not private constants");
            g_.offset_readers.push_back({c, -1, chain});
          }
          work.emplace_back(gv_.output(c, 0), chain);
        } else {
          return fail("Concat " + cat + " output reaches " + op + " " + gv_.name(c));
        }
      }
    }
  }
  // Node n passes the group's channels from input 0 (which must be `from`, when given) to output 0.
  void pass_through(keel_node_id_t n) {
    if (!g_.passed.insert(n).second) return;
    const std::string op = gv_.op(n);
    if (!gv_.domain(n).empty()) return fail("reaches " + op + " (custom domain)");
    if (int k = constant_operand(n); k >= 0) {
      const std::string x = gv_.input(n, static_cast<size_t>(1 - k));
      if (!per_channel_constant(n, k, x))
        return fail(op + " " + gv_.name(n) + " has a constant that is neither a scalar nor one value per channel");
      add_value(x);
      add_value(gv_.output(n, 0));
      return;
    }
    if (op == "Add" || op == "Sum") {
      auto out_t = gv_.value_type(gv_.output(n, 0));
      for (const std::string& in : gv_.inputs(n)) {
        auto t = gv_.value_type(in);
        if (!t || !out_t || t->ndim != out_t->ndim || t->ndim < 2 || t->dims[1] != out_t->dims[1])
          return fail(op + " " + gv_.name(n) + " broadcasts or has unknown shapes");
        add_value(in);
      }
      g_.residual = true;
      add_value(gv_.output(n, 0));
      return;
    }
    if (!extra_outputs_unused(n)) return fail(op + " " + gv_.name(n) + " has a second output in use");
    if (depthwise_conv(gv_, n)) {
      g_.depthwise.push_back(n);
    } else if (op == "Flatten") {
      if (gv_.attr_int(n, "axis").value_or(1) != 1)
        return fail("Flatten " + gv_.name(n) + " mixes channels with the batch axis");
      if (!spatial_is_one(gv_.input(n, 0))) return flatten_spatial(n);
    } else if (!channelwise(op)) {
      return fail("reaches " + op);
    }
    if (op == "BatchNormalization") {
      for (size_t i = 1; i < 5; ++i)
        if (!private_f32(gv_, gv_.input(n, i)))
          return fail("BatchNormalization " + gv_.name(n) + " parameters are not private constants");
      g_.norms.push_back(n);
    }
    // Clip's min/max and Dropout's ratio/training_mode are scalars by the spec: computed or not, they act on every
    // channel alike.
    add_value(gv_.input(n, 0));
    add_value(gv_.output(n, 0));
  }
  // Flatten (axis 1) of a [N, C, spatial...] group value with known spatial dims (LeNet's conv → pool → flatten →
  // fc): the flattened features are channel-major, so the readers lose `spatial` consecutive weight columns per
  // removed channel. Element-wise ops between the Flatten and the readers (Relu, Identity, Dropout, ...) keep the
  // feature positions; the readers must be Gemm/MatMul with a private 2-D f32 weight on [N, C·spatial].
  void flatten_spatial(keel_node_id_t n) {
    auto t = gv_.value_type(gv_.input(n, 0));
    if (!t || t->ndim < 3) return fail("Flatten " + gv_.name(n) + " input shape unknown");
    int64_t spatial = 1;
    for (int32_t d = 2; d < t->ndim; ++d) {
      if (t->dims[static_cast<size_t>(d)] < 1)
        return fail("Flatten " + gv_.name(n) + " input has unknown spatial dims");
      spatial *= t->dims[static_cast<size_t>(d)];
    }
    add_value(gv_.input(n, 0));
    std::vector<std::string> work = {gv_.output(n, 0)};
    std::set<std::string> seen;
    while (!work.empty()) {
      const std::string u = work.back();
      work.pop_back();
      if (!seen.insert(u).second) continue;
      if (gv_.is_graph_output(u)) return fail("Flatten " + gv_.name(n) + " reaches graph output " + u);
      for (keel_node_id_t c : gv_.consumers(u)) {
        const std::string op = gv_.op(c);
        auto cin = gv_.inputs(c);
        if (!gv_.domain(c).empty()) return fail("reaches " + op + " (custom domain) behind Flatten " + gv_.name(n));
        if (cin.empty() || cin[0] != u || std::count(cin.begin(), cin.end(), u) != 1)
          return fail(op + " " + gv_.name(c) + " reads the flattened channels at another input");
        if (op == "Gemm" || op == "MatMul") {
          const std::string w = gv_.input(c, 1);
          if (!private_f32(gv_, w) || gv_.initializer(w)->ndim != 2 ||
              (op == "Gemm" && gv_.attr_int(c, "transA").value_or(0)))
            return fail(op + " " + gv_.name(c) + " behind Flatten " + gv_.name(n) + " has no private 2-D f32 weight");
          const int axis = op == "Gemm" && gv_.attr_int(c, "transB").value_or(0) ? 1 : 0;
          if (g_.channels < 0 || gv_.initializer(w)->dims[axis] != g_.channels * spatial)
            return fail(op + " " + gv_.name(c) + " weight does not match the flattened channels");
          g_.flat_readers.push_back({c, axis, spatial});
        } else if (channelwise(op) && op != "BatchNormalization" && op.find("Pool") == std::string::npos) {
          if (!extra_outputs_unused(c)) return fail(op + " " + gv_.name(c) + " has a second output in use");
          work.push_back(gv_.output(c, 0));
        } else {
          return fail("Flatten " + gv_.name(n) + " output reaches " + op + " " + gv_.name(c));
        }
      }
    }
  }
  void visit(const std::string& v) {
    if (gv_.is_graph_output(v)) return fail(v + " is a graph output");
    if (gv_.is_graph_input(v)) return fail("reaches graph input " + v);
    if (gv_.is_initializer(v)) return fail("meets constant " + v);
    if (auto t = gv_.value_type(v); t && t->ndim >= 2) check_channels(v, t->dims[1]);
    auto p = gv_.producer(v);
    if (!p) return fail("no producer for " + v);
    if (gv_.is(*p, "Conv") && gv_.domain(*p).empty() && !depthwise_conv(gv_, *p)) {
      if (!add_producer(*p)) return;
    } else {
      if (gv_.is(*p, "Concat"))
        return fail(v + " is the output of Concat " + gv_.name(*p) +
                    " (these channels belong to the groups of the "
                    "Concat's inputs and are pruned with them)");
      if (!(gv_.is(*p, "Add") || gv_.is(*p, "Sum")) && gv_.output(*p, 0) != v)
        return fail(gv_.op(*p) + " " + gv_.name(*p) + " writes it as a secondary output");
      pass_through(*p);
    }
    for (keel_node_id_t c : gv_.consumers(v)) {
      const std::string op = gv_.op(c);
      if (!gv_.domain(c).empty()) return fail("reaches " + op + " (custom domain)");
      if (op == "Add" || op == "Sum" || constant_operand(c) >= 0) {
        pass_through(c);
        if (!g_.why.empty()) return;
        continue;
      }
      auto ins = gv_.inputs(c);
      if (op == "Concat") {
        for (size_t j = 0; j < ins.size(); ++j)
          if (ins[j] == v) behind_concat(c, j);
        if (!g_.why.empty()) return;
        continue;
      }
      for (size_t i = 1; i < ins.size(); ++i)
        if (ins[i] == v) return fail(v + " is operand " + std::to_string(i) + " of " + op + " " + gv_.name(c));
      if (op == "Conv" && depthwise_conv(gv_, c)) {
        pass_through(c);
      } else if (op == "Conv") {
        std::string w = gv_.input(c, 1);
        const int64_t G = group_of(gv_, c);
        if (!private_f32(gv_, w) || gv_.initializer(w)->ndim < 3)
          return fail("reader Conv " + gv_.name(c) + " has no private f32 weight");
        const keel_tensor_t* wt = gv_.initializer(w);
        if (G < 1 || wt->dims[0] % G != 0 || (g_.channels >= 0 && wt->dims[1] * G != g_.channels))
          return fail("reader Conv " + gv_.name(c) + " weight does not match the channels");
        if (G > 1) g_.blocks.push_back(G);  // its input channels: G blocks of C/G, each read by its own outputs
        g_.readers.emplace_back(c, 1);
      } else if (op == "Gemm" || op == "MatMul") {
        std::string w = gv_.input(c, 1);
        if (!private_f32(gv_, w) || gv_.initializer(w)->ndim != 2 ||
            (op == "Gemm" && gv_.attr_int(c, "transA").value_or(0)))
          return fail(op + " " + gv_.name(c) + " has no private 2-D f32 weight");
        auto t = gv_.value_type(v);
        if (!t || t->ndim != 2) return fail(op + " " + gv_.name(c) + " reads a value that is not [N, C]");
        int axis = op == "Gemm" && gv_.attr_int(c, "transB").value_or(0) ? 1 : 0;
        if (g_.channels >= 0 && gv_.initializer(w)->dims[axis] != g_.channels)
          return fail(op + " " + gv_.name(c) + " weight does not match the channels");
        g_.readers.emplace_back(c, axis);
      } else {
        pass_through(c);
      }
      if (!g_.why.empty()) return;
    }
  }

  GraphView& gv_;
  ChannelGroup& g_;
  std::vector<std::string> work_;
  std::set<keel_node_id_t> concats_;
};

void prune_coupled(GraphView& gv, double ratio, Report& report) {
  gv.infer_shapes();
  int64_t removed_channels = 0, convs = 0, params = 0, groups = 0, residual_groups = 0;
  std::set<keel_node_id_t> assigned;
  for (keel_node_id_t c1 : gv.nodes()) {
    if (!gv.exists(c1) || !gv.is(c1, "Conv") || !gv.domain(c1).empty() || assigned.count(c1)) continue;
    if (depthwise_conv(gv, c1)) continue;  // a member of its input's group, not a producer
    ChannelGroup g;
    GroupBuilder(gv, g).build(c1);
    for (keel_node_id_t p : g.producers) assigned.insert(p);
    assigned.insert(c1);
    std::string names;
    for (keel_node_id_t p : g.producers) names += (names.empty() ? "" : ", ") + gv.name(p);
    if (names.empty()) names = gv.name(c1);
    if (g.why.empty() && g.readers.empty() && g.offset_readers.empty() && g.flat_readers.empty())
      g.why = "nothing reads the channels";
    if (g.why.empty() && g.channels < 1) g.why = "channel count unknown";
    if (!g.why.empty()) {
      report.note("skipped: " + g.why + " (" + names + ")");
      continue;
    }
    const int64_t C = g.channels;
    // Grouped Convs: the channels fall into L blocks of M (L the least common multiple of their group counts); each
    // block loses the same number kb, so every grouped Conv keeps the same count in each of its groups.
    int64_t L = 1;
    for (int64_t b : g.blocks) L = std::lcm(L, b);
    if (C % L != 0) {
      report.note("skipped: grouped Convs split the " + std::to_string(C) + " channels into " + std::to_string(L) +
                  " uneven blocks (" + names + ")");
      continue;
    }
    const int64_t M = C / L;
    const int64_t kb = std::min<int64_t>(static_cast<int64_t>(std::floor(ratio * static_cast<double>(M))), M - 1);
    if (kb <= 0) {
      if (ratio > 0)
        report.note("skipped: ratio " + ratio_text(ratio) + " removes no channel of " +
                    (L > 1 ? std::to_string(L) + " blocks of " + std::to_string(M) +
                                 " (grouped Convs need the same "
                                 "count per group)"
                           : std::to_string(C)) +
                    " (" + names + ")");
      continue;
    }
    const int64_t k = kb * L;
    // The group's channels inside a Concat's channel space: their offset and the space's width, from the current
    // channel counts of the Concats' inputs (other groups may have shrunk them).
    auto concat_offset = [&](const ChannelGroup::OffsetReader& r) {
      int64_t off = 0, total = 0;
      for (auto [concat, input] : r.chain) {
        auto ins = gv.inputs(concat);
        total = 0;
        for (size_t i = 0; i < ins.size(); ++i) {
          const int64_t c = gv.value_type(ins[i])->dims[1];
          if (i < input) off += c;
          total += c;
        }
      }
      return std::make_pair(off, total);
    };
    // Joint score: the sum over the group's producers (and Convs writing its channels in a Concat's space, at the
    // offset) of each output channel's L1 norm.
    std::vector<double> l1(static_cast<size_t>(C), 0.0);
    auto score = [&](keel_node_id_t p, int64_t off) {
      std::vector<float> wv = *gv.f32_values(gv.input(p, 1));
      const int64_t per = static_cast<int64_t>(wv.size()) / gv.initializer(gv.input(p, 1))->dims[0];
      for (int64_t o = 0; o < C; ++o)
        for (int64_t i = 0; i < per; ++i)
          l1[static_cast<size_t>(o)] += std::fabs(wv[static_cast<size_t>((off + o) * per + i)]);
    };
    for (keel_node_id_t p : g.producers) score(p, 0);
    for (const auto& r : g.offset_readers)
      if (r.axis == -2) score(r.node, concat_offset(r).first);
    std::vector<int64_t> keep;
    for (int64_t blk = 0; blk < L; ++blk) {
      std::vector<int64_t> order(static_cast<size_t>(M));
      std::iota(order.begin(), order.end(), blk * M);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l1[a] < l1[b]; });
      keep.insert(keep.end(), order.begin() + kb, order.end());
    }
    std::sort(keep.begin(), keep.end());
    for (keel_node_id_t p : g.producers) {
      params += shrink_input(gv, p, 1, 0, keep);
      if (!gv.input(p, 2).empty()) params += shrink_input(gv, p, 2, 0, keep);
    }
    for (keel_node_id_t n : g.norms)
      for (size_t i = 1; i < 5; ++i) params += shrink_input(gv, n, i, 0, keep);
    for (keel_node_id_t n : g.depthwise) {
      params += shrink_input(gv, n, 1, 0, keep);
      if (!gv.input(n, 2).empty()) params += shrink_input(gv, n, 2, 0, keep);
      gv.set_attr(n, "group", AttrValue::of_int(static_cast<int64_t>(keep.size())));
    }
    for (auto [n, axis] : g.readers)
      params += gv.is(n, "Conv") ? shrink_conv_inputs(gv, n, keep) : shrink_input(gv, n, 1, axis, keep);
    for (const auto& r : g.flat_readers) {
      std::vector<int64_t> features;
      features.reserve(keep.size() * static_cast<size_t>(r.spatial));
      for (int64_t c : keep)
        for (int64_t s = 0; s < r.spatial; ++s) features.push_back(c * r.spatial + s);
      params += shrink_input(gv, r.node, 1, r.axis, features);
    }
    for (auto [n, i] : g.constants) {
      const keel_tensor_t* t = gv.initializer(gv.input(n, i));
      if (GraphView::numel_of(t) == 1) continue;
      const std::vector<int64_t> d = GraphView::dims_of(t);
      int axis = 0;
      while (d[static_cast<size_t>(axis)] == 1) ++axis;
      params += shrink_input(gv, n, i, axis, keep);
    }
    if (!g.offset_readers.empty()) {
      // The group's channels inside each Concat: its inputs' current channel counts give the offset.
      std::set<keel_node_id_t> done;
      for (const auto& r : g.offset_readers) {
        const auto [off, total] = concat_offset(r);
        std::vector<int64_t> kept;
        for (int64_t i = 0; i < off; ++i) kept.push_back(i);
        for (int64_t c : keep) kept.push_back(off + c);
        for (int64_t i = off + C; i < total; ++i) kept.push_back(i);
        if (r.axis >= 0) {
          params += shrink_input(gv, r.node, 1, r.axis, kept);
        } else if (r.axis == -2) {
          params += shrink_input(gv, r.node, 1, 0, kept);
          if (!gv.input(r.node, 2).empty()) params += shrink_input(gv, r.node, 2, 0, kept);
        } else if (done.insert(r.node).second) {
          for (size_t i = 1; i < 5; ++i) params += shrink_input(gv, r.node, i, 0, kept);
        }
      }
    }
    // Later groups feeding the same Concat compute their offsets from the shapes as they are now.
    if (!g.offset_readers.empty()) gv.infer_shapes();
    removed_channels += k;
    convs += static_cast<int64_t>(g.producers.size());
    ++groups;
    residual_groups += g.residual;
    size_t adders = 0;
    for (const auto& r : g.offset_readers) adders += r.axis == -2;
    const size_t nreaders = g.readers.size() + g.flat_readers.size() + g.offset_readers.size() - adders;
    report.note("pruned " + std::to_string(k) + " of " + std::to_string(C) + " channels of " +
                (g.residual ? "residual-coupled group {" : "{") + names + "} (" + std::to_string(nreaders) +
                (nreaders == 1 ? " reader" : " readers") + (g.offset_readers.empty() ? "" : ", behind a Concat") +
                (adders ? ", with " + std::to_string(adders) + " Conv(s) adding to the Concat's channels" : "") +
                (L > 1 ? "; " + std::to_string(kb) + " from each of " + std::to_string(L) + " blocks for grouped Convs)"
                       : ")"));
  }
  if (groups) gv.infer_shapes();
  report.count("channels_removed", removed_channels);
  report.count("convs_pruned", convs);
  report.count("groups_pruned", groups);
  report.count("residual_groups_pruned", residual_groups);
  report.count("params_removed", params);
}

keel_status_t prune(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* o, const char*,
                    keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    PassOptions opts(g_host->options, o);
    double ratio = opts.get_float("ratio", 0.5);
    std::string mode = opts.get_string("mode", "magnitude");
    bool coupled = opts.get_bool("coupled", true);
    if (!(ratio >= 0.0 && ratio <= 1.0)) throw PassError(KEEL_STATUS_INVALID_ARGUMENT, "prune: ratio must be in 0..1");
    if (mode == "magnitude") prune_magnitude(gv, ratio, report);
    else if (mode == "channel" && coupled) prune_coupled(gv, ratio, report);
    else if (mode == "channel") prune_channels(gv, ratio, report);
    else
      throw PassError(KEEL_STATUS_INVALID_ARGUMENT, "prune: mode must be 'magnitude' or 'channel', not '" + mode + "'");
  });
}

keel_status_t init_instance(const keel_core_api_t* host, keel_plugin_handle_t* plugin, void** out_instance) {
  static const PassSpec kPasses[] = {
      {"prune", "magnitude sparsity (options ratio, mode=magnitude) or structured Conv channel pruning (mode=channel)",
       prune},
  };
  return init_pass_instance(host, plugin, out_instance, kPasses, [](const keel_core_api_t* h) -> const char* {
    return h->graph == nullptr ? "no graph API" : nullptr;
  });
}

const keel_plugin_t kPlugin = {.struct_size = sizeof(keel_plugin_t),
                               .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                               .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                               .name = "prune",
                               .version = "0.1.0",
                               .kind = KEEL_PLUGIN_KIND_PASS,
                               .init = nullptr,
                               .shutdown = nullptr,
                               .init_instance = init_instance,
                               .shutdown_instance = shutdown_pass_instance};

}  // namespace
}  // namespace keel::passes

extern "C" KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &keel::passes::kPlugin; }
