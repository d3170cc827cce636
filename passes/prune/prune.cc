// The pruning pass plugin. Built against the SDK alone.
//
//   prune   options: ratio (0..1, default 0.5), mode ("magnitude" | "channel", default "magnitude").
//     magnitude  zeroes the smallest-|w| `ratio` fraction of every f32 weight initializer read by Conv (input 1),
//                Gemm (input 1) or MatMul (input 1). The graph keeps its shapes (unstructured sparsity).
//     channel    structured pruning: for a Conv (group 1) with an f32 weight initializer whose output reaches exactly
//                one following Conv (group 1, input 0) through single-use channel-wise ops only (Relu, LeakyRelu,
//                Sigmoid, HardSigmoid, HardSwish, Clip, MaxPool, AveragePool, GlobalAveragePool,
//                GlobalMaxPool, BatchNormalization with constant parameters), removes the `ratio` fraction of its
//                output channels with the lowest L1 norm: the weight and bias rows, the BatchNormalization
//                parameters and the matching input channels of the next Conv's weight. Chains that reach a
//                residual Add/Sum/Concat (channels coupled with another branch) are left alone with a
//                "skipped: residual-coupled" note; other readers (graph outputs, several readers, unknown ops) are
//                skipped with their reason.
// Counters: weights_zeroed, channels_removed, convs_pruned, params_removed.
#include <keel/plugin.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "common/graph_view.h"

namespace keel::passes {
namespace {

const keel_host_api_t* g_host = nullptr;

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
  static const std::set<std::string> k = {"Relu",     "LeakyRelu",   "Sigmoid",           "HardSigmoid",
                                          "HardSwish", "Clip",       "MaxPool",           "AveragePool",
                                          "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "Identity",
                                          "Tanh",     "Elu",         "Selu",              "Softplus", "Dropout"};
  return k.count(op) != 0;
}
bool coupling(const std::string& op) { return op == "Add" || op == "Sum" || op == "Concat" || op == "Sub" || op == "Mul"; }

int64_t group_of(GraphView& gv, keel_node_id_t n) { return gv.attr_int(n, "group").value_or(1); }

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

// Replaces input `i` of node `n` (an f32 initializer) by a new initializer of kept indices along `axis`; drops the
// old one when unread. Returns the number of elements removed.
int64_t shrink_input(GraphView& gv, keel_node_id_t n, size_t i, int axis, const std::vector<int64_t>& keep) {
  std::string name = gv.input(n, i);
  const keel_tensor_t* t = gv.initializer(name);
  std::vector<int64_t> d = GraphView::dims_of(t);
  std::vector<float> v = *gv.f32_values(name);
  std::vector<float> r = select_axis(v, d, axis, keep);
  d[axis] = static_cast<int64_t>(keep.size());
  std::string fresh = gv.add_f32(name + "_pruned", d, r);
  gv.set_input(n, i, fresh);
  if (gv.use_count(name) == 0) gv.remove_initializer(name);
  return static_cast<int64_t>(v.size() - r.size());
}

void prune_channels(GraphView& gv, double ratio, Report& report) {
  int64_t removed_channels = 0, convs = 0, params = 0;
  std::set<keel_node_id_t> touched;
  for (keel_node_id_t c1 : gv.nodes()) {
    if (!gv.exists(c1) || !gv.is(c1, "Conv") || touched.count(c1)) continue;
    const std::string cname = gv.name(c1);
    std::string wname = gv.input(c1, 1);
    const keel_tensor_t* w = gv.initializer(wname);
    if (!w || w->dtype != KEEL_DTYPE_F32 || w->ndim < 3 || group_of(gv, c1) != 1) continue;
    if (gv.use_count(wname) != 1) { report.note("skipped: weight shared (" + cname + ")"); continue; }
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
      if (gv.is_graph_output(v)) { why = "output is a graph output"; break; }
      auto cons = gv.consumers(v);
      bool coupled = false;
      for (auto c : cons) coupled = coupled || coupling(gv.op(c));
      if (coupled) { why = "residual-coupled"; break; }
      if (cons.size() != 1) { why = "output has " + std::to_string(cons.size()) + " readers"; break; }
      keel_node_id_t c = cons[0];
      if (!gv.domain(c).empty()) { why = "reaches " + gv.op(c) + " (custom domain)"; break; }
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
      if (!channelwise(op)) { why = "reaches " + op; break; }
      if (gv.input(c, 0) != v) { why = "reaches " + op + " at another input"; break; }
      if (op == "BatchNormalization") {
        bool ok = true;
        for (size_t i = 1; i < 5; ++i) {
          std::string p = gv.input(c, i);
          ok = ok && gv.initializer(p) && gv.initializer(p)->dtype == KEEL_DTYPE_F32 && gv.use_count(p) == 1;
        }
        if (!ok) { why = "BatchNormalization parameters are not private constants"; break; }
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
    if (k <= 0) continue;
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

keel_status_t prune(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_pass_options_t* o, const char*,
                    keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    PassOptions opts(g_host->options, o);
    double ratio = opts.get_float("ratio", 0.5);
    std::string mode = opts.get_string("mode", "magnitude");
    if (!(ratio >= 0.0 && ratio <= 1.0)) throw PassError(KEEL_STATUS_INVALID_ARGUMENT, "prune: ratio must be in 0..1");
    if (mode == "magnitude") prune_magnitude(gv, ratio, report);
    else if (mode == "channel") prune_channels(gv, ratio, report);
    else throw PassError(KEEL_STATUS_INVALID_ARGUMENT, "prune: mode must be 'magnitude' or 'channel', not '" + mode + "'");
  });
}

keel_status_t init(const keel_host_api_t* host, keel_plugin_handle_t* plugin) {
  if (host == nullptr || host->abi_major != KEEL_PLUGIN_ABI_MAJOR || !KEEL_HAS_MEMBER(host, keel_host_api_t, options))
    return nullptr == host ? nullptr : host->status_create(KEEL_STATUS_ABI_MISMATCH, "host API too old");
  g_host = host;
  if (host->graph == nullptr) return host->status_create(KEEL_STATUS_ABI_MISMATCH, "no graph API");
  return register_pass(host, plugin, "prune",
                       "magnitude sparsity (options ratio, mode=magnitude) or structured Conv channel pruning "
                       "(mode=channel)",
                       prune);
}

const keel_plugin_t kPlugin = {sizeof(keel_plugin_t), KEEL_PLUGIN_ABI_MAJOR, KEEL_PLUGIN_ABI_MINOR, "prune", "0.1.0",
                               KEEL_PLUGIN_KIND_PASS, init, nullptr};

}  // namespace
}  // namespace keel::passes

extern "C" KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &keel::passes::kPlugin; }
