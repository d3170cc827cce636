// Random gradients (device_cts.h, random_grad_case): a differential fuzzer of the backward ops training runs.
//
// The case table holds each backward op at the geometries keel train's models and a few others use (square kernels,
// symmetric pads, no dilation). Models a user fine-tunes (--init) bring the rest: rectangular kernels, strides that
// differ per axis, asymmetric pads, dilations, groups and depthwise layers, 1-D and 3-D signals, pooling windows
// that overlap or skip, normalisation over any axis, losses over spatial dims with ignored labels and class weights,
// embeddings with repeated and negative indices. A case is one backward op (keel.ConvGrad, keel.MaxPoolGrad,
// keel.AveragePoolGrad, keel.FusedConvMaxPool and its gradient, keel.BatchNormGrad, keel.LayerNormGrad, the
// activations' gradients, SoftmaxCrossEntropyLoss and its gradient, keel.GatherGrad; from a second random stream,
// BatchNormTraining, LayerNormalization's stashed statistics and the optimizers' multi-tensor steps) at random
// parameters, with a random subset of its outputs asked for (the autograd leaves "" for gradients nobody needs: a
// network's first layer has no dX, a frozen one only dX), on a team of 1 to 3 threads; some run at another batch
// first and some run several at once from threads (OpCase::first_batch, concurrent_runs). Sizes stay small so that
// the reference is quick.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tools/conformance/case_builders.h"
#include "tools/conformance/device_cts.h"

namespace keel::cts {
namespace {

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : "x") + std::to_string(x);
  return s;
}

class GradGen {
 public:
  explicit GradGen(uint64_t seed)
      : rng_(seed * 0xA0761D6478BD642Full + 0xE7037ED1A0B428DBull), extra_rng_(seed * 0x8BB84B93962EACC9ull + 29) {}

  OpCase make(uint64_t seed, DType dtype) {
    c_.domain = "keel";
    c_.dtype = dtype;
    c_.rtol = 1e-3, c_.atol = 1e-4;
    c_.threads = static_cast<int32_t>(1 + uniform(3));
    // What later generator versions added draws from a stream of its own, so that a seed's earlier case stays the
    // one it drew (the repros in the docs): the forward ops that stash what the backward reads.
    const int64_t extra = extra_uniform(100);
    if (extra < 12) {
      if (extra_uniform(2) == 0) batch_norm_training();
      else layer_norm_forward();
      return finish(seed, dtype);
    }
    if (extra < 18 && dtype == DType::kF32) {  // the optimizers' multi-tensor steps and GradScaler's check
      const int64_t which = extra_uniform(3);
      if (which == 0) momentum();
      else if (which == 1) adam_step();
      else check_finite_and_unscale();
      return finish(seed, dtype);
    }
    int64_t kind = uniform(100);
    // FusedConvMaxPool, its gradient and the cross-entropy ops are f32 only: a bf16 case draws a convolution's
    // gradient or an activation's instead.
    if (dtype != DType::kF32 && ((kind >= 34 && kind < 42) || (kind >= 86 && kind < 95))) kind = kind < 42 ? 0 : 62;
    if (kind < 34) conv_grad();
    else if (kind < 42) fused_conv_max_pool();
    else if (kind < 54) pool_grad(true);
    else if (kind < 62) pool_grad(false);
    else if (kind < 72) activation_grad();
    else if (kind < 79) batch_norm_grad();
    else if (kind < 86) layer_norm_grad();
    else if (kind < 95) cross_entropy();
    else gather_grad();
    return finish(seed, dtype);
  }

 private:
  OpCase finish(uint64_t seed, DType dtype) {
    if (dtype != DType::kF32) {
      c_.rtol = std::max(c_.rtol, 2e-2);
      c_.atol = std::max(c_.atol, sums_ ? 5e-2 : 2e-2);  // a gradient summed over a batch of rounded terms
    }
    if (batch_ && chance(20)) {
      c_.first_batch = c_.inputs[0].shape[0] == 1 ? 2 : 1;
      what_ += " dyn(first b=" + std::to_string(c_.first_batch) + ")";
    }
    if (chance(20)) {
      c_.concurrent_runs = static_cast<int32_t>(2 + uniform(3));
      what_ += " x" + std::to_string(c_.concurrent_runs) + " concurrent";
    }
    c_.label = "seed=" + std::to_string(seed) + (dtype == DType::kBF16 ? " bf16" : "") + ": " +
               std::to_string(c_.threads) + "t" + what_;
    return c_;
  }

  int64_t extra_uniform(int64_t n) { return static_cast<int64_t>(extra_rng_() % static_cast<uint64_t>(n)); }
  int64_t uniform(int64_t n) { return static_cast<int64_t>(rng_() % static_cast<uint64_t>(n)); }
  int64_t range(int64_t lo, int64_t hi) { return lo + uniform(hi - lo + 1); }
  bool chance(int pct) { return uniform(100) < pct; }
  int64_t pick(std::initializer_list<int64_t> v) { return *(v.begin() + uniform(static_cast<int64_t>(v.size()))); }
  void note(const std::string& s) { what_ += " " + s; }

  // Which of `n` outputs the case compares, and which others the node leaves unnamed: every output, or a random
  // subset holding the compared one.
  // (`required`: outputs before it are required by the schema and always asked for.)
  void outputs(size_t n, size_t required = 0) {
    c_.num_outputs = n;
    c_.output = static_cast<size_t>(uniform(static_cast<int64_t>(n)));
    std::string asked;
    const bool subset = chance(50);
    for (size_t i = 0; i < n; ++i) {
      if (subset && i >= required && i != c_.output && chance(50)) {
        c_.unnamed_outputs.push_back(i);
        continue;
      }
      asked += (asked.empty() ? "" : ",") + std::to_string(i);
    }
    note("outputs " + asked + " (compared " + std::to_string(c_.output) + ")");
  }

  // A spatial rank: mostly 2-D, the oneDNN plugin's; 1-D and 3-D go to the reference kernels there (or a device's
  // own).
  int spatial_rank() { return chance(80) ? 2 : chance(50) ? 1 : 3; }

  // Per spatial axis: the kernel, stride, dilation and both pads of a convolution or pooling window over `in`,
  // drawn so that at least one output position exists; returns the output size per axis.
  struct Window {
    std::vector<int64_t> in, k, s, d, pads, out;
  };
  Window window(int r, bool pooling, bool dilate) {
    Window w;
    for (int i = 0; i < r; ++i) {
      // (3-D: kernels up to 3, undilated, so that the reference stays quick)
      const int64_t k = r == 3 ? range(1, 3) : pooling ? range(1, 4) : pick({1, 2, 3, 3, 3, 5, 7});
      const int64_t d = dilate && r < 3 && k > 1 && chance(35) ? range(2, 3) : 1;
      const int64_t eff = (k - 1) * d + 1;
      const int64_t in = std::max<int64_t>(eff, range(r == 3 ? 3 : 4, r == 3 ? 9 : r == 1 ? 40 : 17));
      const int64_t s = chance(55) ? 1 : range(2, 3);
      // Pads below the window (pooling: at most half of it, as PyTorch has them), each side on its own.
      const int64_t pmax = pooling ? k / 2 : eff - 1;
      const int64_t pb = chance(50) ? 0 : range(0, pmax), pe = chance(60) ? pb : range(0, pmax);
      w.in.push_back(in), w.k.push_back(k), w.s.push_back(s), w.d.push_back(d);
      w.pads.push_back(pb), w.pads.push_back(pe);
      w.out.push_back((in + pb + pe - eff) / s + 1);
    }
    // ONNX orders pads as all the begins, then all the ends.
    std::vector<int64_t> ordered(w.pads.size());
    for (int i = 0; i < r; ++i) ordered[i] = w.pads[2 * i], ordered[r + i] = w.pads[2 * i + 1];
    w.pads = ordered;
    return w;
  }
  void window_attrs(const Window& w, bool dilations) {
    c_.attrs["kernel_shape"] = Is(w.k);
    c_.attrs["strides"] = Is(w.s);
    c_.attrs["pads"] = Is(w.pads);
    if (dilations) c_.attrs["dilations"] = Is(w.d);
    note("k=" + join(w.k) + " s=" + join(w.s) + " p=" + join(w.pads) + (dilations ? " d=" + join(w.d) : ""));
  }
  static Shape nc(int64_t n, int64_t c, const std::vector<int64_t>& spatial) {
    Shape s = {n, c};
    s.insert(s.end(), spatial.begin(), spatial.end());
    return s;
  }

  // keel.ConvGrad(dY, X, W) -> dX, dW, dB.
  void conv_grad() {
    c_.op = "ConvGrad";
    sums_ = true;
    const int r = spatial_rank();
    const Window w = window(r, false, true);
    const int64_t n = pick({1, 2, 3});
    int64_t g = 1, cg, mg;
    const int64_t form = uniform(100);
    if (form < 15) {  // depthwise, sometimes with a channel multiplier
      g = pick({3, 8, 16, 17});
      cg = 1, mg = pick({1, 1, 2});
      note("depthwise");
    } else if (form < 30) {  // grouped
      g = pick({2, 3, 4});
      cg = pick({1, 2, 3, 4, 8}), mg = pick({1, 2, 3, 8});
    } else if (form < 55) {  // few input channels: an image model's first layer
      cg = range(1, 4), mg = pick({4, 5, 8, 16, 32});
    } else {
      cg = pick({5, 8, 16, 16, 24, 32}), mg = pick({3, 8, 16, 16, 24, 32});
    }
    const int64_t cin = g * cg, m = g * mg;
    Shape wshape = {m, cg};
    wshape.insert(wshape.end(), w.k.begin(), w.k.end());
    c_.inputs = {in("dY", nc(n, m, w.out)), in("X", nc(n, cin, w.in)), in("W", wshape, false, -0.5f, 0.5f)};
    note("N=" + std::to_string(n) + " C=" + std::to_string(cin) + " M=" + std::to_string(m) + " in=" + join(w.in) +
         " g=" + std::to_string(g));
    c_.attrs["group"] = I(g);
    window_attrs(w, true);
    outputs(3);
  }

  // keel.FusedConvMaxPool (a convolution with stride 1, its activation and a max pooling; the pooled output or its
  // window positions compared) or its gradient from random window positions.
  void fused_conv_max_pool() {
    const int64_t n = pick({1, 2, 3}), cin = pick({1, 2, 3, 4, 8, 16}), m = pick({3, 8, 16, 24, 32, 48});
    const int64_t k = pick({1, 3, 3, 5}), p = range(0, k / 2), h = range(k + 1, 20), wd = range(k + 1, 24);
    const int64_t pk = pick({2, 2, 3}), ps = range(1, pk);
    const int64_t oh = h + 2 * p - k + 1, ow = wd + 2 * p - k + 1;
    if (oh < pk || ow < pk) return conv_grad();
    const int64_t ph = (oh - pk) / ps + 1, pw = (ow - pk) / ps + 1;
    c_.attrs = {{"kernel_shape", Is({k, k})},
                {"pads", Is({p, p, p, p})},
                {"pool_kernel_shape", Is({pk, pk})},
                {"pool_strides", Is({ps, ps})}};
    const bool relu = chance(60);
    if (relu) c_.attrs["activation"] = S("Relu");
    note("N=" + std::to_string(n) + " C=" + std::to_string(cin) + " M=" + std::to_string(m) +
         " in=" + std::to_string(h) + "x" + std::to_string(wd) + " k=" + std::to_string(k) + " p=" + std::to_string(p) +
         " pool=" + std::to_string(pk) + "/" + std::to_string(ps) + (relu ? " relu" : ""));
    const InputSpec x = in("X", {n, cin, h, wd}), wt = in("W", {m, cin, k, k}, false, -0.5f, 0.5f);
    if (chance(40)) {
      c_.op = "FusedConvMaxPool";
      c_.inputs = {x, wt, in("B", {m})};
      c_.num_outputs = 2;
      c_.output = static_cast<size_t>(uniform(2));
      // (A 3x3 convolution over 16+ channels runs as Winograd on the oneDNN plugin, whose transforms round even
      // integer sums: there the pooled values are compared, within tolerance, and not the positions.)
      if (k == 3 && cin >= 16 && m >= 16) c_.output = 0;
      note(c_.output == 0 ? "forward" : "forward positions");
      if (c_.output == 1) {
        // The window positions are compared exactly, so the maxima must not be a rounding apart (seed 96699: two
        // outputs of a window 1 ulp apart, 6.8113192, the device and the reference picked different ones): small
        // integers and quarters, whose products and sums f32 holds exactly whatever the order, make every tie exact
        // (and frequent), so that the rule "the first maximum in scan order" is what the case checks.
        for (InputSpec* spec : {&c_.inputs[0], &c_.inputs[1], &c_.inputs[2]}) {
          const bool weights = spec->name != "X";
          spec->values.resize(static_cast<size_t>(shape_numel(spec->shape)));
          for (float& v : spec->values)
            v = static_cast<float>(extra_uniform(weights ? 9 : 7) - (weights ? 4 : 3)) / (weights ? 4.f : 1.f);
        }
        note("exact");
      }
      return;
    }
    c_.op = "FusedConvMaxPoolGrad";
    sums_ = true;
    InputSpec arg = in("Arg", {n, m, ph, pw}, false, 0.f, static_cast<float>(pk * pk - 1));
    arg.dtype = DType::kU8;
    c_.inputs = {in("dP", {n, m, ph, pw}), x, wt, in("P", {n, m, ph, pw}), arg};
    outputs(3);
  }

  // keel.MaxPoolGrad(dY, X) or keel.AveragePoolGrad(dY) (input_shape, count_include_pad).
  void pool_grad(bool max) {
    const int r = spatial_rank();
    const bool dilate = max && chance(15);
    Window w = window(r, true, dilate);
    const int64_t n = pick({1, 2, 3}), c = pick({1, 3, 4, 8, 16, 17, 32});
    const Shape xs = nc(n, c, w.in), ys = nc(n, c, w.out);
    note("X=" + join(xs));
    batch_ = true;
    if (max) {
      c_.op = "MaxPoolGrad";
      c_.inputs = {in("dY", ys), in("X", xs)};
      window_attrs(w, dilate);
      // dY is routed to one position per window: exact, up to sums where windows overlap (rounded in bf16)
      c_.rtol = 0, c_.atol = 0;
      bool overlap = false;
      for (int i = 0; i < r; ++i) overlap |= w.k[i] * w.d[i] > w.s[i];
      if (overlap) c_.rtol = 1e-6, c_.atol = 1e-6;
      sums_ = overlap;
    } else {
      c_.op = "AveragePoolGrad";
      c_.inputs = {in("dY", ys)};
      window_attrs(w, false);
      const bool include = chance(50);
      c_.attrs["count_include_pad"] = I(include ? 1 : 0);
      c_.attrs["input_shape"] = Is(xs);
      if (include) note("count_include_pad");
      batch_ = false;  // input_shape is fixed
    }
  }

  // The activations' gradients on a random shape of rank 1 to 5.
  void activation_grad() {
    const int64_t which = uniform(5);
    const char* ops[] = {"ReluGrad", "SigmoidGrad", "TanhGrad", "GeluGrad", "LeakyReluGrad"};
    c_.op = ops[which];
    Shape s;
    const int64_t rank = range(1, 5);
    for (int64_t i = 0; i < rank; ++i) s.push_back(i == 0 ? range(1, 5) : pick({1, 2, 3, 7, 16, 17, 33}));
    if (rank == 1) s[0] = pick({1, 15, 16, 17, 1000, 4099});
    const bool on_x = which >= 3;
    c_.inputs = {in("dY", s), on_x ? in("X", s, false, -3.f, 3.f) : in("Y", s, false, -1.f, 1.f)};
    if (which == 4) c_.attrs["alpha"] = F(pick({1, 10, 20}) / 100.f);
    if (which == 3 && extra_uniform(3) == 0) {  // GELU's tanh form (torch's approximate='tanh')
      c_.attrs["approximate"] = S("tanh");
      note("tanh");
    }
    if (which == 0) c_.rtol = 0, c_.atol = 0;
    note(join(s));
    batch_ = true;
  }

  // keel.BatchNormGrad(dY, X, scale, mean, invstd) over X of rank 2 to 5.
  void batch_norm_grad() {
    c_.op = "BatchNormGrad";
    sums_ = true;
    const int64_t rank = range(2, 5), ch = pick({1, 3, 8, 16, 17, 32});
    Shape x = {pick({1, 2, 4, 7}), ch};
    for (int64_t i = 2; i < rank; ++i) x.push_back(range(1, rank == 5 ? 5 : 12));
    c_.inputs = {in("dY", x), in("X", x, false, -2.f, 2.f), in("scale", {ch}), in("mean", {ch}, false, -0.5f, 0.5f),
                 in("invstd", {ch}, false, 0.5f, 2.f)};
    note("X=" + join(x));
    outputs(3);
  }

  // keel.LayerNormGrad(dY, X, scale, mean, invstd) over the axes from `axis` on.
  void layer_norm_grad() {
    c_.op = "LayerNormGrad";
    sums_ = true;
    const int64_t rank = range(2, 4);
    Shape x;
    for (int64_t i = 0; i < rank; ++i) x.push_back(pick({1, 2, 3, 5, 8, 16, 24, 33, 64}));
    const int64_t axis = range(1, rank - 1);
    Shape scale(x.begin() + axis, x.end()), stats(x.begin(), x.begin() + axis);
    stats.resize(x.size(), 1);
    c_.inputs = {in("dY", x), in("X", x, false, -2.f, 2.f), in("scale", scale), in("mean", stats, false, -0.5f, 0.5f),
                 in("invstd", stats, false, 0.5f, 2.f)};
    const bool negative = chance(50);
    c_.attrs["axis"] = I(negative ? axis - rank : axis);
    note("X=" + join(x) + " axis=" + std::to_string(negative ? axis - rank : axis));
    outputs(3);
  }

  // SoftmaxCrossEntropyLoss (loss or log_prob compared) or keel.SoftmaxCrossEntropyLossGrad, over [N, C] or
  // [N, C, d1, ...], with class weights and an ignored label sometimes; labels drawn at run time.
  void cross_entropy() {
    const int64_t n = pick({1, 2, 5, 16}), cls = pick({2, 3, 10, 17, 100});
    Shape scores = {n, cls}, labels = {n};
    const int64_t extra = chance(30) ? range(1, 2) : 0;
    for (int64_t i = 0; i < extra; ++i) {
      const int64_t d = range(1, 6);
      scores.push_back(d), labels.push_back(d);
    }
    const char* reductions[] = {"mean", "sum", "none"};
    const std::string red = reductions[uniform(3)];
    const bool ignore = chance(40), weighted = chance(30);
    InputSpec lab = in("labels", labels, false, ignore ? -1.f : 0.f, static_cast<float>(cls - 1));
    lab.dtype = DType::kI64;
    c_.attrs["reduction"] = S(red);
    if (ignore) c_.attrs["ignore_index"] = I(-1);
    note("scores=" + join(scores) + " reduction=" + red + (ignore ? " ignore_index=-1" : "") +
         (weighted ? " weights" : ""));
    if (chance(50)) {
      c_.op = "SoftmaxCrossEntropyLoss";
      c_.domain.clear();
      c_.inputs = {in("scores", scores, false, -4.f, 4.f), lab};
      if (weighted) c_.inputs.push_back(in("weights", {cls}, true, 0.2f, 2.f));
      c_.num_outputs = 2;
      c_.output = static_cast<size_t>(uniform(2));
      note(c_.output == 0 ? "loss" : "log_prob");
      sums_ = true;
      return;
    }
    c_.op = "SoftmaxCrossEntropyLossGrad";
    Shape dloss = red == "none" ? labels : Shape{};
    c_.inputs = {in("dLoss", dloss), in("log_prob", scores, false, -5.f, -0.01f), lab};
    if (weighted) c_.inputs.push_back(in("weights", {cls}, true, 0.2f, 2.f));
  }

  // keel.GatherGrad(dY, indices): an embedding's backward and Gather along other axes, repeated and negative
  // indices.
  void gather_grad() {
    c_.op = "GatherGrad";
    sums_ = true;
    const int64_t rank = range(1, 3);
    Shape data;
    for (int64_t i = 0; i < rank; ++i) data.push_back(pick({1, 2, 3, 7, 10, 64}));
    const int64_t axis = uniform(rank);
    Shape idx;
    const int64_t irank = range(0, 2);
    for (int64_t i = 0; i < irank; ++i) idx.push_back(pick({1, 2, 4, 5, 9}));
    Shape dy(data.begin(), data.begin() + axis);
    dy.insert(dy.end(), idx.begin(), idx.end());
    dy.insert(dy.end(), data.begin() + axis + 1, data.end());
    InputSpec ind = in("indices", idx, false, static_cast<float>(-data[axis]), static_cast<float>(data[axis] - 1));
    ind.dtype = DType::kI64;
    c_.inputs = {in("dY", dy), ind};
    c_.attrs["axis"] = I(axis);
    c_.attrs["data_shape"] = Is(data);
    note("data=" + join(data) + " indices=" + (idx.empty() ? "scalar" : join(idx)) + " axis=" + std::to_string(axis));
  }

  // keel.BatchNormTraining(X, scale, B) -> Y, mean, invstd, var: batch statistics over every axis but 1.
  void batch_norm_training() {
    c_.op = "BatchNormTraining";
    sums_ = true;
    const int64_t rank = 2 + extra_uniform(4), ch = std::vector<int64_t>{1, 3, 8, 16, 17, 32}[extra_uniform(6)];
    Shape x = {1 + extra_uniform(7), ch};
    for (int64_t i = 2; i < rank; ++i) x.push_back(1 + extra_uniform(rank == 5 ? 5 : 12));
    c_.inputs = {in("X", x, false, -2.f, 3.f), in("scale", {ch}), in("B", {ch})};
    c_.attrs["epsilon"] = F(extra_uniform(2) ? 1e-5f : 1e-3f);
    note("X=" + join(x));
    batch_ = false;  // the statistics' inputs are per channel
    outputs(4, 1);
  }

  // LayerNormalization(X, scale, B) -> Y, Mean, InvStdDev over the axes from `axis` on (what the autograd stashes
  // for keel.LayerNormGrad), with or without B.
  void layer_norm_forward() {
    c_.op = "LayerNormalization";
    c_.domain.clear();
    sums_ = true;
    const int64_t rank = 2 + extra_uniform(3);
    Shape x;
    for (int64_t i = 0; i < rank; ++i)
      x.push_back(std::vector<int64_t>{1, 2, 3, 5, 8, 16, 24, 33, 64}[extra_uniform(9)]);
    const int64_t axis = 1 + extra_uniform(rank - 1);
    const bool negative = extra_uniform(2) == 0;
    Shape scale(x.begin() + axis, x.end());
    c_.inputs = {in("X", x, false, -2.f, 3.f), in("scale", scale)};
    if (extra_uniform(3) != 0) c_.inputs.push_back(in("B", scale));
    c_.attrs["axis"] = I(negative ? axis - rank : axis);
    note("X=" + join(x) + " axis=" + std::to_string(negative ? axis - rank : axis) +
         (c_.inputs.size() == 3 ? "" : " no B"));
    outputs(3, 1);
  }

  // 1 to 40 tensors of random shapes (ranks 1-4, up to about 70,000 elements; 300,000 in all): the multi-tensor
  // kernels' batches and chunks.
  std::vector<Shape> tensor_list() {
    const int64_t n = extra_uniform(4) == 0 ? 17 + extra_uniform(24) : 1 + extra_uniform(6);
    std::vector<Shape> out;
    int64_t total = 0;
    for (int64_t i = 0; i < n && total < 300000; ++i) {
      Shape s;
      const int64_t rank = 1 + extra_uniform(4);
      int64_t count = 1;
      for (int64_t d = 0; d < rank; ++d) {
        const int64_t dim = std::vector<int64_t>{1, 3, 7, 16, 33, 64, 127, 4097}[extra_uniform(8)];
        if (count * dim > 70000) break;
        s.push_back(dim), count *= dim;
      }
      out.push_back(s);  // (never empty: every dim drawn is at most 4,097)
      total += count;
    }
    return out;
  }
  std::string list_label(const std::vector<Shape>& xs) {
    int64_t total = 0;
    for (const Shape& x : xs) total += shape_numel(x);
    return std::to_string(xs.size()) + " tensors, " + std::to_string(total) + " elements";
  }
  // Which of `n` outputs to compare: drawn from the extra stream (the main one's outputs() would move later cases).
  void pick_output(size_t n) {
    c_.num_outputs = n;
    c_.output = static_cast<size_t>(extra_uniform(static_cast<int64_t>(n)));
    note("output " + std::to_string(c_.output) + " of " + std::to_string(n));
  }

  // SGD's step on a device (ai.onnx.preview.training Momentum over n tensors: X, G, V in, X and V out).
  void momentum() {
    c_.op = "Momentum";
    c_.domain = "ai.onnx.preview.training";
    c_.opset = 1;
    const auto xs = tensor_list();
    const int64_t n = static_cast<int64_t>(xs.size());
    InputSpec r = in("R", {}, true);
    r.values = {0.05f};
    const int64_t t = extra_uniform(3);
    c_.inputs = {r, in("T", {}, true)};
    c_.int64_constants = {{1, Tensor::from_vector(DType::kI64, {}, std::vector<int64_t>{t})}};
    for (const char* g : {"X", "G", "V"})
      for (int64_t i = 0; i < n; ++i)
        c_.inputs.push_back(in(g + std::to_string(i), xs[static_cast<size_t>(i)], false, g[0] == 'V' ? -0.1f : -1.f,
                               g[0] == 'V' ? 0.1f : 1.f));
    const bool nesterov = extra_uniform(2) == 0;
    const float norm = extra_uniform(2) == 0 ? 0.f : 1e-4f;
    c_.attrs = {{"alpha", F(0.9f)},
                {"beta", F(0.7f)},
                {"norm_coefficient", F(norm)},
                {"mode", S(nesterov ? "nesterov" : "standard")}};
    note(list_label(xs) + (nesterov ? " nesterov" : " standard") + " T=" + std::to_string(t) +
         (norm > 0 ? " decay" : ""));
    c_.rtol = 1e-5, c_.atol = 1e-6;
    pick_output(static_cast<size_t>(2 * n));
  }

  // Adam / AdamW's step (keel.AdamStep: scalars, then P, G, M, V of n tensors; P, M, V out).
  void adam_step() {
    c_.op = "AdamStep";
    const auto ps = tensor_list();
    const int64_t n = static_cast<int64_t>(ps.size()), t = 1 + extra_uniform(10);
    const double b1 = 0.9, b2 = 0.999, lr = 1e-3;
    const double bc1 = 1 - std::pow(b1, static_cast<double>(t)), bc2 = 1 - std::pow(b2, static_cast<double>(t));
    const float decay = extra_uniform(2) == 0 ? 1.f : 1.f - 1e-5f, wd = extra_uniform(2) == 0 ? 0.f : 1e-2f;
    InputSpec sc = in("scalars", {9}, true);
    sc.values = {decay,
                 wd,
                 0.9f,
                 0.1f,
                 0.999f,
                 1 - 0.999f,
                 static_cast<float>(std::sqrt(bc2)),
                 1e-8f,
                 static_cast<float>(lr / bc1)};
    c_.inputs = {sc};
    for (const char* g : {"P", "G", "M", "V"})
      for (int64_t i = 0; i < n; ++i)
        c_.inputs.push_back(in(g + std::to_string(i), ps[static_cast<size_t>(i)], false, g[0] == 'V' ? 0.f : -1.f,
                               g[0] == 'V' ? 0.01f : 1.f));
    note(list_label(ps) + " t=" + std::to_string(t) + (decay != 1.f ? " decoupled decay" : "") + (wd > 0 ? " wd" : ""));
    c_.rtol = 1e-5, c_.atol = 1e-6;
    pick_output(static_cast<size_t>(3 * n));
  }

  // GradScaler's unscale and inf/NaN check (keel.CheckFiniteAndUnscale: inv_scale, then n gradients; the flag and
  // the unscaled gradients out), sometimes with a NaN or an infinity somewhere.
  void check_finite_and_unscale() {
    c_.op = "CheckFiniteAndUnscale";
    const auto gs = tensor_list();
    const int64_t n = static_cast<int64_t>(gs.size());
    InputSpec is = in("inv_scale", {}, false);
    is.values = {std::vector<float>{1.f / 65536, 1.f / 8, 0.5f, 4.f}[extra_uniform(4)]};
    c_.inputs = {is};
    const int64_t poison = extra_uniform(3);  // 0: none, 1: a NaN, 2: an infinity
    const int64_t bad_tensor = extra_uniform(n);
    for (int64_t i = 0; i < n; ++i) {
      InputSpec g = in("G" + std::to_string(i), gs[static_cast<size_t>(i)], false, -1000.f, 1000.f);
      if (poison != 0 && i == bad_tensor) {
        const int64_t count = shape_numel(gs[static_cast<size_t>(i)]);
        g.values.resize(static_cast<size_t>(count));
        for (int64_t e = 0; e < count; ++e) g.values[static_cast<size_t>(e)] = static_cast<float>(e % 97) - 48.f;
        g.values[static_cast<size_t>(extra_uniform(count))] =
            poison == 1 ? std::nanf("") : (extra_uniform(2) ? 1.f : -1.f) * std::numeric_limits<float>::infinity();
      }
      c_.inputs.push_back(g);
    }
    note(list_label(gs) + " inv=" + std::to_string(is.values[0]) +
         (poison == 0   ? ""
          : poison == 1 ? " NaN in "
                        : " inf in ") +
         (poison == 0 ? "" : std::to_string(bad_tensor)));
    c_.rtol = 0, c_.atol = 0;  // one rounded multiplication: exact
    pick_output(static_cast<size_t>(n + 1));
  }

  std::mt19937_64 rng_, extra_rng_;
  OpCase c_;
  std::string what_;
  bool batch_ = false;  // every input's dim 0 is the batch (a first run at another batch is possible)
  bool sums_ = false;   // the outputs sum many rounded terms
};

}  // namespace

OpCase random_grad_case(uint64_t seed, DType dtype) {
  OpCase c = GradGen(seed).make(seed, dtype);
  c.generated = OpCase::Generated{seed, dtype, /*grads=*/true};
  return c;
}

}  // namespace keel::cts
