// Random chains (device_cts.h, random_chain_case): a differential fuzzer of what chain-claiming devices fuse.
//
// A case strings 2 to 6 blocks of the kinds CNNs and ConvNeXt-like models are made of, each reading the block before
// it (so that the last node, the one compared, depends on every node): convolutions (1x1, 3x3, dilated, grouped,
// depthwise 3x3 / 5x5 / 7x7, stride 1 or 2, with or without bias) with BatchNormalization and activations after them,
// activations on their own (Relu, Clip, LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish, x * HardSigmoid(x),
// x * Sigmoid(x), Elu, GELU as its Erf formula), residual Adds with an earlier value, per-channel and scalar scales
// and offsets, pooling, a channels-last MLP between Transposes (LayerNorm, MatMul + bias, layer scale, the residual
// around it), Concat with an earlier value, bilinear Resize (three coordinate modes), a squeeze-and-excitation gate,
// and sometimes a classifier head (GlobalAveragePool or not, Flatten, Gemm). A third of the cases are sequences
// instead ([B,S,E], transformer-like): MatMul + bias (either operand order) with scalar factors and activations, Gemm
// over the flattened rows (transB, alpha, beta, C or none) between Reshapes, LayerNormalization or its decomposed
// form, residual Adds, self-attention (MatMul with the transposed value, scale, Softmax, MatMul), vector and scalar
// affine ops, and sometimes a mean over the sequence and a classifier. Channel counts mix multiples of 16 with odd
// ones; images are small (5 to 20 pixels a side, batch 1 or 2) so that the reference stays quick. Weights are
// uniform with the variance of their fan-in, so that values neither vanish nor grow along the chain.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tools/conformance/case_builders.h"
#include "tools/conformance/device_cts.h"

namespace keel::cts {
namespace {

class Gen {
 public:
  explicit Gen(uint64_t seed)
      : rng_(seed * 0x9E3779B97F4A7C15ull + 0x5851F42D4C957F2Dull), extra_rng_(seed * 0xD1B54A32D192ED03ull + 17) {}

  OpCase make(uint64_t seed, DType dtype) {
    c_.op = "RandomChain";
    c_.rtol = 1e-3, c_.atol = 1e-4;
    c_.auto_passes = true;                              // what `keel run` does: the passes' rewrites are checked too
    c_.threads = static_cast<int32_t>(1 + uniform(3));  // teams of 1 to 3 (the work split in odd and even parts)
    c_.dtype = dtype;
    const std::string tag = "seed=" + std::to_string(seed) + (dtype == DType::kBF16 ? " bf16" : "") + ": " +
                            std::to_string(c_.threads) + "t";
    // 8 significant bits, rounded after every op of up to a dozen (in the reference at other places than the device)
    if (dtype == DType::kBF16) c_.rtol = 5e-2, c_.atol = 8e-2;
    // What later generator versions added draws from a stream of its own, so that a seed's blocks stay the ones it
    // drew before: a dynamic batch, earlier values as outputs too, and 1-D signals.
    dynamic_ = extra_chance(25);
    if (dtype == DType::kI8) {
      c_.dtype = DType::kF32;
      if (extra_chance(35)) qdq_sequence();
      else qdq_chain();
      c_.label = "seed=" + std::to_string(seed) + " int8: " + std::to_string(c_.threads) + "t" + what_;
      return finish();
    }
    if (extra_chance(15)) {
      signal();
      c_.label = tag + " 1d" + what_;
      return finish();
    }
    if (extra_chance(6)) {
      volume();
      c_.label = tag + " 3d" + what_;
      return finish();
    }
    if (chance(33)) {
      sequence();
      c_.label = tag + " seq" + what_;
      return finish();
    }
    const int64_t n = pick({1, 1, 2}), ch = pick({3, 4, 8, 16, 16, 24, 32, 40}), h = 5 + uniform(16),
                  w = chance(60) ? h : 5 + uniform(16);
    c_.inputs.push_back(in("X", {n, ch, h, w}));
    cur_ = {"X", {n, ch, h, w}};
    history_.push_back(cur_);
    const int blocks = 2 + static_cast<int>(uniform(5));
    for (int b = 0; b < blocks; ++b) block();
    if (c_.chain.empty()) activation();  // every block declined (a pool over too small a map, ...)
    if (chance(30)) head();
    c_.label = tag + what_;
    return finish();
  }

 private:
  struct Val {
    std::string ref;  // "X" or "$k"
    Shape shape;      // NCHW, [N,H,W,C] while channels-last inside the MLP block, or [N,K] after a head
  };

  // The case as drawn, with what the extra stream adds: the dynamic batch (the inputs' dim 0 unknown to the graph,
  // a first run at another batch) and one or two earlier values as outputs too (a value the device fuses past must
  // still leave the chain as the graph says). Not as outputs: constants' dequantizations (int8 weights) and
  // QuantizeLinear's u8 codes, whose rounding flips the comparison would count against the device.
  OpCase finish() {
    if (c_.chain.empty()) {  // every block declined (a 1-D chain's global pools, each too early in it, say)
      const size_t said = what_.size();
      activation();
      c_.label += what_.substr(said);
    }
    if (dynamic_) {
      const int64_t n = c_.inputs[0].shape[0];
      c_.first_batch = n == 1 ? (extra_chance(50) ? 2 : 3) : 1;
    }
    if (extra_chance(20)) {
      c_.concurrent_runs = static_cast<int32_t>(2 + extra_uniform(3));
      c_.label += " x" + std::to_string(c_.concurrent_runs) + " concurrent";
    }
    if (extra_chance(30) && c_.chain.size() > 1) {
      std::vector<size_t> candidates;
      for (size_t k = 0; k + 1 < c_.chain.size(); ++k) {
        const ChainNode& nd = c_.chain[k];
        const bool reads_value = std::any_of(nd.inputs.begin(), nd.inputs.end(), [](const std::string& r) {
          return r == "X" || r == "ids" || r.rfind("$", 0) == 0;
        });
        if (reads_value && nd.op != "QuantizeLinear") candidates.push_back(k);
      }
      const int64_t count = std::min<int64_t>(static_cast<int64_t>(candidates.size()), 1 + extra_uniform(2));
      std::string names;
      for (int64_t i = 0; i < count; ++i) {
        const size_t at = static_cast<size_t>(extra_uniform(static_cast<int64_t>(candidates.size())));
        const std::string ref = "$" + std::to_string(candidates[at]);
        candidates.erase(candidates.begin() + static_cast<std::ptrdiff_t>(at));
        c_.also_outputs.push_back(ref);
        names += (names.empty() ? "" : ",") + ref;
      }
      if (!names.empty()) c_.label += " +out(" + names + ")";
    }
    // (Drawn last, so that the draws above stay those of earlier generator versions.) A first run at a batch of 5 to
    // 8: the blocked kernels' and the chains' loops over more images than teams of threads.
    if (dynamic_ && extra_chance(30)) c_.first_batch = 5 + extra_uniform(4);
    if (dynamic_) c_.label += " dyn(first b=" + std::to_string(c_.first_batch) + ")";
    return c_;
  }
  int64_t extra_uniform(int64_t n) { return static_cast<int64_t>(extra_rng_() % static_cast<uint64_t>(n)); }
  bool extra_chance(int pct) { return extra_uniform(100) < pct; }
  // A Reshape's target: as given, or with the batch (dim 0, `batch_kept`: the input's dim 0 too) as 0 or -1 when
  // the batch is dynamic (what torch's exports with dynamic_axes compute at run time).
  std::string reshape_to(Shape dims, bool batch_kept) {
    if (dynamic_) dims[0] = batch_kept ? 0 : -1;
    return ints(dims);
  }
  int64_t uniform(int64_t n) { return static_cast<int64_t>(rng_() % static_cast<uint64_t>(n)); }
  bool chance(int pct) { return uniform(100) < pct; }
  int64_t pick(std::initializer_list<int64_t> v) { return *(v.begin() + uniform(static_cast<int64_t>(v.size()))); }
  void note(const std::string& s) { what_ += " " + s; }

  // A node reading `ins`; its output becomes the current value, of shape `shape`.
  Val node(const std::string& op, std::vector<std::string> ins, std::map<std::string, Attribute> attrs, Shape shape) {
    c_.chain.push_back({op, std::move(ins), std::move(attrs)});
    cur_ = {"$" + std::to_string(c_.chain.size() - 1), std::move(shape)};
    return cur_;
  }
  // A constant input, uniform in [lo, hi].
  std::string constant(const std::string& stem, Shape shape, float lo, float hi) {
    const std::string name = stem + std::to_string(c_.inputs.size());
    c_.inputs.push_back(in(name, std::move(shape), true, lo, hi));
    return name;
  }
  // Weights keeping the variance of what they sum over.
  std::string weights(const std::string& stem, Shape shape, int64_t fan_in) {
    const float a = std::sqrt(3.f / static_cast<float>(std::max<int64_t>(fan_in, 1)));
    return constant(stem, std::move(shape), -a, a);
  }
  std::string scalar(float v) {
    const std::string name = "s" + std::to_string(c_.inputs.size());
    InputSpec s = in(name, {}, true);
    s.values = {v};
    c_.inputs.push_back(s);
    return name;
  }
  // An int64 constant (a Reshape's shape).
  std::string ints(const std::vector<int64_t>& v) {
    const std::string name = "i" + std::to_string(c_.inputs.size());
    InputSpec s = in(name, {static_cast<int64_t>(v.size())}, true);
    s.dtype = DType::kI64;
    s.values.assign(v.begin(), v.end());
    c_.inputs.push_back(s);
    return name;
  }
  bool nchw() const { return cur_.shape.size() == 4; }
  // Whether a LayerNorm of the current value over `axis_len` values tests the device rather than bf16's rounding:
  // always in f32; in bf16 over 8 values or more of a linear op's output (a product, a convolution, a sum, past
  // Transposes and Reshapes), not of a squashing one (Softmax, Sigmoid, HardSigmoid, attention's averages), whose
  // nearly equal values the normalization magnifies with their rounding.
  bool norm_is_fair(int64_t axis_len) const {
    if (c_.dtype == DType::kF32) return true;
    if (axis_len < 8) return false;
    for (size_t k = c_.chain.size(); k-- > 0;) {
      const std::string& op = c_.chain[k].op;
      if (op == "Transpose" || op == "Reshape") continue;
      return op == "MatMul" || op == "Gemm" || op == "Conv" || op == "Add" || op == "BatchNormalization" ||
             op == "LayerNormalization";
    }
    return true;  // the input itself
  }
  int64_t C() const { return cur_.shape[1]; }

  void block() {
    if (extra_chance(8)) {  // (a later generator's blocks: drawn from the extra stream, see make())
      split_block();
      history_.push_back(cur_);
      return;
    }
    if (extra_chance(8)) {
      rarer_ops();
      history_.push_back(cur_);
      return;
    }
    switch (uniform(11)) {
      case 0:
      case 1:
      case 2: conv_block(); break;
      case 3: activation(); break;
      case 4: residual_or_affine(); break;
      case 5: pool(); break;
      case 6: mlp(); break;
      case 7: concat_or_resize(); break;
      case 8: squeeze_excite(); break;
      case 9: misc(); break;
      default: conv_block(); break;
    }
    history_.push_back(cur_);
  }

  // Less common shapes: a zero Pad (folded into the next convolution's padding) then a convolution without its own,
  // a convolution with asymmetric pads, a channel Slice, a Concat of three values, a nearest Resize (torch's),
  // AveragePool 2x2 stride 2, MaxPool with ceil_mode, Sub and Div by per-channel constants.
  void misc() {
    const Shape x = cur_.shape;
    const int64_t n = x[0], c = x[1], h = x[2], w = x[3];
    switch (uniform(10)) {
      case 8: {  // ConvTranspose: kernel 2-4, stride 1-2, pads, an output padding at stride 2 (torch's upsampling)
        const int64_t k = pick({2, 3, 4}), st = pick({1, 2}), p = k >= 3 && chance(60) ? 1 : 0,
                      op = st == 2 && chance(40) ? 1 : 0, m = pick({8, 16, 24});
        const int64_t oh = (h - 1) * st - 2 * p + k + op, ow = (w - 1) * st - 2 * p + k + op;
        if (oh < 1 || ow < 1 || oh * ow > 1600) return;
        std::vector<std::string> ins = {cur_.ref, weights("T", {c, m, k, k}, c * k * k / (st * st))};
        if (chance(70)) ins.push_back(constant("TB", {m}, -0.5f, 0.5f));
        node("ConvTranspose", ins,
             {{"kernel_shape", Is({k, k})},
              {"strides", Is({st, st})},
              {"pads", Is({p, p, p, p})},
              {"output_padding", Is({op, op})}},
             {n, m, oh, ow});
        note("convT" + std::to_string(k) + "x" + std::to_string(k) + "/" + std::to_string(st) + "(" +
             std::to_string(c) + "->" + std::to_string(m) + ")");
        if (chance(50)) activation();
        break;
      }
      case 9: {  // views: Unsqueeze + Squeeze, Identity, Dropout (inference: identity)
        node("Unsqueeze", {cur_.ref, ints({2})}, {}, {n, c, 1, h, w});
        node("Squeeze", {cur_.ref, ints({2})}, {}, x);
        if (chance(50)) node("Identity", {cur_.ref}, {}, x);
        else node("Dropout", {cur_.ref}, {}, x);
        note("views");
        break;
      }
      case 0: {
        const int64_t p = pick({1, 2});
        node("Pad", {cur_.ref, ints({0, 0, p, p, 0, 0, p, p})}, {{"mode", S("constant")}},
             {n, c, h + 2 * p, w + 2 * p});
        const int64_t k = 2 * p + 1, m = pick({8, 16, 32});
        node("Conv", {cur_.ref, weights("W", {m, c, k, k}, c * k * k), constant("B", {m}, -0.5f, 0.5f)},
             {{"kernel_shape", Is({k, k})}}, {n, m, h, w});
        note("pad" + std::to_string(p) + "+conv" + std::to_string(k) + "x" + std::to_string(k) + "(" +
             std::to_string(c) + "->" + std::to_string(m) + ")");
        break;
      }
      case 1: {  // pads top 0, left 1, bottom 1, right 0 (TF's SAME at stride 2 made explicit)
        if (h < 2 || w < 2) return;
        const int64_t m = pick({8, 16, 24});
        node("Conv", {cur_.ref, weights("W", {m, c, 3, 3}, c * 9)},
             {{"kernel_shape", Is({3, 3})}, {"pads", Is({0, 1, 1, 0})}, {"strides", Is({2, 2})}},
             {n, m, (h + 1 - 3) / 2 + 1, (w + 1 - 3) / 2 + 1});
        note("conv3x3/2 pads(0,1,1,0)(" + std::to_string(c) + "->" + std::to_string(m) + ")");
        break;
      }
      case 2: {
        if (c < 2) return;
        const int64_t b = uniform(c / 2), e = b + 1 + uniform(c - b - 1);
        node("Slice", {cur_.ref, ints({b}), ints({e}), ints({1})}, {}, {n, e - b, h, w});
        note("slice(c " + std::to_string(b) + ".." + std::to_string(e) + ")");
        break;
      }
      case 3: {
        const std::vector<const Val*> found = earlier_same_pixels();
        if (found.size() < 2) return;
        const Val* a = any_of(found);
        const Val* b = any_of(found);
        node("Concat", {a->ref, cur_.ref, b->ref}, {{"axis", I(1)}}, {n, a->shape[1] + c + b->shape[1], h, w});
        note("concat3");
        break;
      }
      case 4: {
        if (h * w > 144 || c_.dtype != DType::kF32) return;
        InputSpec sc = in("R" + std::to_string(c_.inputs.size()), {4}, true);
        sc.values = {1.f, 1.f, 2.f, 2.f};
        c_.inputs.push_back(sc);
        node(
            "Resize", {cur_.ref, "", sc.name},
            {{"mode", S("nearest")}, {"coordinate_transformation_mode", S("asymmetric")}, {"nearest_mode", S("floor")}},
            {n, c, 2 * h, 2 * w});
        note("resize2x(nearest)");
        break;
      }
      case 5:
        if (h < 2 || w < 2) return;
        node("AveragePool", {cur_.ref}, {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}}, {n, c, h / 2, w / 2});
        note("avgpool2/2");
        break;
      case 6:
        if (h < 3 || w < 3) return;
        node("MaxPool", {cur_.ref}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"ceil_mode", I(1)}},
             {n, c, (h - 3 + 1) / 2 + 1, (w - 3 + 1) / 2 + 1});
        note("maxpool3/2(ceil)");
        break;
      default: {
        const bool sub = chance(50);
        node(sub ? "Sub" : "Div", {cur_.ref, constant("D", {c, 1, 1}, sub ? -0.5f : 0.5f, sub ? 0.5f : 2.f)}, {}, x);
        note(sub ? "-channel" : "/channel");
        break;
      }
    }
  }

  // int8 as a QDQ model (what `keel quantize` and ONNX Runtime's quantizer write): every convolution's input
  // quantized and dequantized (u8, one scale), its weights int8 per output channel behind a DequantizeLinear, an f32
  // bias; Relu or Clip after; residual Adds in f32; max pooling; a global pool and a quantized Gemm head. The device
  // fuses it (fuse_qdq: int8 kernels), the reference runs the QDQ graph as written. A rounding that falls the other
  // way moves a value by one step of its scale, so outputs are compared within a few steps of the last scale.
  void qdq_chain() {
    const int64_t n = pick({1, 1, 2}), ch = pick({3, 8, 16, 24, 32}), h = 5 + uniform(14),
                  w = chance(60) ? h : 5 + uniform(14);
    c_.inputs.push_back(in("X", {n, ch, h, w}, false, -2.f, 2.f));
    cur_ = {"X", {n, ch, h, w}};
    history_.push_back(cur_);
    c_.rtol = 2e-2, c_.atol = 0.1;  // two or three steps of 0.04 (a flip changes a sum by one step times a weight)
    const int blocks = 2 + static_cast<int>(uniform(4));
    for (int b = 0; b < blocks; ++b) {
      switch (uniform(6)) {
        case 0:
        case 1:
        case 2: qconv(); break;
        case 3: {
          const Shape x = cur_.shape;
          if (const Val* e = same_shape_earlier(); e && chance(70)) {
            node("Add", {cur_.ref, e->ref}, {}, x), note("+residual");
            if (chance(50)) node("Relu", {cur_.ref}, {}, x), note("relu");
          } else {
            qconv();
          }
          break;
        }
        case 4:
          if (cur_.shape[2] >= 3 && cur_.shape[3] >= 3) {
            const Shape x = cur_.shape;
            quantize_current();
            node("MaxPool", {cur_.ref},
                 {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}},
                 {x[0], x[1], (x[2] - 1) / 2 + 1, (x[3] - 1) / 2 + 1});
            note("maxpool3/2");
          }
          break;
        default: qconv(); break;
      }
      history_.push_back(cur_);
    }
    if (chance(40)) {  // global pool, Flatten, a quantized Gemm
      const Shape x = cur_.shape;
      node("GlobalAveragePool", {cur_.ref}, {}, {x[0], x[1], 1, 1});
      node("Flatten", {cur_.ref}, {{"axis", I(1)}}, {x[0], x[1]});
      quantize_current();
      const int64_t k = pick({10, 16});
      node("Gemm", {cur_.ref, qweights({k, x[1]}, x[1], 0), constant("HB", {k}, -0.5f, 0.5f)}, {{"transB", I(1)}},
           {x[0], k});
      note("gap qgemm(" + std::to_string(x[1]) + "->" + std::to_string(k) + ")");
    }
  }

  // int8 sequences [B,S,E] as quantized transformers' feed-forward parts are: MatMul of the quantized value with
  // per-channel int8 weights [E,E2] (axis 1) and an f32 bias, Relu or GELU after (fuse_qdq: QGemm over the rows),
  // Gemm over the rows between Reshapes, LayerNormalization and residual Adds in f32, and sometimes a mean over the
  // sequence and a quantized classifier.
  void qdq_sequence() {
    const int64_t b = pick({1, 1, 2}), sl = pick({1, 4, 7, 16, 33}), e = pick({8, 16, 24, 32, 48, 64});
    c_.inputs.push_back(in("X", {b, sl, e}, false, -2.f, 2.f));
    cur_ = {"X", {b, sl, e}};
    history_.push_back(cur_);
    c_.rtol = 2e-2, c_.atol = 0.1;
    note("seq");
    const int blocks = 2 + static_cast<int>(uniform(4));
    for (int k = 0; k < blocks; ++k) {
      const Shape x = cur_.shape;
      switch (uniform(5)) {
        case 0:
        case 1: {
          const int64_t e2 = pick({16, 24, 32, 48, 64});
          Shape y = x;
          y.back() = e2;
          quantize_current();
          node("MatMul", {cur_.ref, qweights({x.back(), e2}, x.back(), 1)}, {}, y);
          const bool first = chance(50);
          const std::string bias = constant("PB", {e2}, -0.5f, 0.5f);
          node("Add", {first ? bias : cur_.ref, first ? cur_.ref : bias}, {}, y);
          std::string what = "qlinear(" + std::to_string(x.back()) + "->" + std::to_string(e2) + ")";
          if (chance(50)) node("Relu", {cur_.ref}, {}, y), what += " relu";
          note(what);
          break;
        }
        case 2: {  // Gemm over the rows [B*S, E]
          const int64_t rows = x[0] * x[1], e2 = pick({16, 32, 40});
          node("Reshape", {cur_.ref, reshape_to({rows, x[2]}, false)}, {}, {rows, x[2]});
          quantize_current();
          node("Gemm", {cur_.ref, qweights({e2, x[2]}, x[2], 0), constant("GC", {e2}, -0.5f, 0.5f)}, {{"transB", I(1)}},
               {rows, e2});
          if (chance(50)) node("Relu", {cur_.ref}, {}, {rows, e2});
          node("Reshape", {cur_.ref, reshape_to({x[0], x[1], e2}, false)}, {}, {x[0], x[1], e2});
          note("qgemm rows(" + std::to_string(x[2]) + "->" + std::to_string(e2) + ")");
          break;
        }
        case 3:
          if (const Val* v = same_shape_earlier(); v && chance(70)) add_residual(*v);
          else activation();
          break;
        default: layer_norm(); break;
      }
      history_.push_back(cur_);
    }
    if (chance(30)) {
      const Shape x = cur_.shape;
      node("ReduceMean", {cur_.ref}, {{"axes", Is({1})}, {"keepdims", I(0)}}, {x[0], x[2]});
      quantize_current();
      const int64_t k = pick({10, 16});
      node("Gemm", {cur_.ref, qweights({k, x[2]}, x[2], 0), constant("HB", {k}, -0.5f, 0.5f)}, {{"transB", I(1)}},
           {x[0], k});
      note("mean qgemm(" + std::to_string(x[2]) + "->" + std::to_string(k) + ")");
    }
  }

  // QuantizeLinear + DequantizeLinear of the current value: u8, zero point 128, a scale for about +-5.
  void quantize_current() {
    const Shape x = cur_.shape;
    InputSpec sc = in("qs" + std::to_string(c_.inputs.size()), {}, true);
    sc.values = {0.04f};
    c_.inputs.push_back(sc);
    InputSpec zp = in("qz" + std::to_string(c_.inputs.size()), {}, true);
    zp.dtype = DType::kU8;
    zp.values = {128.f};
    c_.inputs.push_back(zp);
    node("QuantizeLinear", {cur_.ref, sc.name, zp.name}, {}, x);
    node("DequantizeLinear", {cur_.ref, sc.name, zp.name}, {}, x);
  }
  // int8 weights behind a DequantizeLinear with one scale per output channel (`axis`), keeping the variance of
  // their fan-in.
  std::string qweights(Shape shape, int64_t fan_in, int64_t axis) {
    const int64_t m = shape[static_cast<size_t>(axis)];
    const float a = std::sqrt(3.f / static_cast<float>(std::max<int64_t>(fan_in, 1)));
    InputSpec wq = in("qw" + std::to_string(c_.inputs.size()), shape, true, -127.f, 127.f);
    wq.dtype = DType::kI8;
    c_.inputs.push_back(wq);
    InputSpec ws = in("qws" + std::to_string(c_.inputs.size()), {m}, true);
    for (int64_t k = 0; k < m; ++k) ws.values.push_back(a / 127.f * (0.75f + 0.5f * static_cast<float>(k % 5) / 4));
    c_.inputs.push_back(ws);
    InputSpec wz = in("qwz" + std::to_string(c_.inputs.size()), {m}, true);
    wz.dtype = DType::kI8;
    wz.values = {0.f};
    c_.inputs.push_back(wz);
    const Val d = node("DequantizeLinear", {wq.name, ws.name, wz.name}, {{"axis", I(axis)}}, shape);
    return d.ref;
  }

  void qconv() {
    const Shape x = cur_.shape;
    const int64_t c = x[1], h = x[2], w = x[3];
    int64_t k = pick({1, 3, 3}), group = 1, m = pick({8, 16, 24, 32, 40, 64});
    if (c > 3 && chance(25)) k = 3, group = c, m = c;  // depthwise
    if (c <= 4 && h >= 7 && w >= 7 && chance(50)) k = 7;
    const int64_t pad = k / 2, stride = h >= 6 && w >= 6 && chance(30) ? 2 : 1;
    const int64_t oh = (h + 2 * pad - k) / stride + 1, ow = (w + 2 * pad - k) / stride + 1;
    quantize_current();
    const std::string xq = cur_.ref;
    const std::string wd = qweights({m, c / group, k, k}, c / group * k * k, 0);
    node("Conv", {xq, wd, constant("B", {m}, -0.5f, 0.5f)},
         {{"kernel_shape", Is({k, k})},
          {"strides", Is({stride, stride})},
          {"pads", Is({pad, pad, pad, pad})},
          {"group", I(group)}},
         {x[0], m, oh, ow});
    std::string what = "qconv" + std::to_string(k) + "x" + std::to_string(k) + (stride > 1 ? "/2" : "") +
                       (group > 1 ? "dw" : "") + "(" + std::to_string(c) + "->" + std::to_string(m) + ")";
    const int64_t act = uniform(3);
    if (act == 0) node("Relu", {cur_.ref}, {}, cur_.shape), what += " relu";
    if (act == 1) node("Clip", {cur_.ref, scalar(0.f), scalar(6.f)}, {}, cur_.shape), what += " clip";
    note(what);
  }

  // Split into two parts along the channels (ops a chain-claiming device may not take, so chains end and start around
  // them): a gated linear unit (one half times the sigmoid of the other), ShuffleNetV2's unit (half through a
  // convolution, concatenated with the other half, channels shuffled), or the parts concatenated the other way round;
  // or a channel shuffle alone (Reshape into groups, Transpose, Reshape back).
  void split_block() {
    const Shape x = cur_.shape;
    const int64_t c = x[1];
    if (c < 2) return activation();
    Shape half = x, rest = x;
    const int64_t first = extra_chance(70) && c % 2 == 0 ? c / 2 : 1 + extra_uniform(c - 1);
    half[1] = first, rest[1] = c - first;
    const int64_t kind = extra_uniform(4);
    if (kind == 3) {
      if (c % 2 != 0 || x.size() != 4) return activation();
      shuffle_channels();
      return;
    }
    c_.chain.push_back({"Split", {cur_.ref, ints({first, c - first})}, {{"axis", I(1)}}, 2});
    const std::string k = "$" + std::to_string(c_.chain.size() - 1);
    const Val a{k, half}, b{k + ":1", rest};
    cur_ = a;
    if (kind == 0 && first == c - first) {
      const Val g = node("Sigmoid", {b.ref}, {}, rest);
      node("Mul", {a.ref, g.ref}, {}, half);
      note("split glu(" + std::to_string(c) + "->" + std::to_string(first) + ")");
    } else if (kind == 1 && x.size() == 4 && c % 2 == 0 && first == c / 2) {
      const Val r = node("Conv", {b.ref, weights("W", {first, first, 3, 3}, first * 9)},
                         {{"kernel_shape", Is({3, 3})}, {"pads", Is({1, 1, 1, 1})}}, rest);
      node("Relu", {r.ref}, {}, rest);
      node("Concat", {a.ref, cur_.ref}, {{"axis", I(1)}}, x);
      note("shufflenet unit(" + std::to_string(c) + ")");
      shuffle_channels();
    } else {
      node("Concat", {b.ref, a.ref}, {{"axis", I(1)}}, x);
      note("split swap(" + std::to_string(first) + "+" + std::to_string(c - first) + ")");
    }
  }
  void shuffle_channels() {
    const Shape x = cur_.shape;
    const int64_t n = x[0], c = x[1], h = x[2], w = x[3];
    node("Reshape", {cur_.ref, reshape_to({n, 2, c / 2, h, w}, true)}, {}, {n, 2, c / 2, h, w});
    node("Transpose", {cur_.ref}, {{"perm", Is({0, 2, 1, 3, 4})}}, {n, c / 2, 2, h, w});
    node("Reshape", {cur_.ref, reshape_to({n, c, h, w}, true)}, {}, x);
    note("shuffle");
  }

  // Ops models have less often: Softmax over the channels (a segmentation head's), a gate from the spatial mean
  // (ReduceMean over H and W, kept, times the value), Clip with a lower bound only (ReLU6's half), a spatial crop
  // (Slice of H and W), Pow by 2 and Sqrt of a positive value, a round trip through f16 (Cast). (Not Round after
  // computed values: a last-bit difference before it moves a value by a whole step.)
  void rarer_ops() {
    const Shape x = cur_.shape;
    const int64_t n = x[0], c = x[1], h = x[2], w = x[3];
    switch (extra_uniform(7)) {
      case 0: node("Softmax", {cur_.ref}, {{"axis", I(1)}}, x), note("softmax(channels)"); break;
      case 1: {
        const std::string in_ref = cur_.ref;
        const Val m = node("ReduceMean", {in_ref}, {{"axes", Is({2, 3})}, {"keepdims", I(1)}}, {n, c, 1, 1});
        const Val g = node("Sigmoid", {m.ref}, {}, m.shape);
        node("Mul", {in_ref, g.ref}, {}, x), note("mean gate");
        break;
      }
      case 2: node("Clip", {cur_.ref, scalar(0.f)}, {}, x), note("clip(min)"); break;
      case 3: {
        if (h < 3 || w < 3) return activation();
        const int64_t top = 1, left = extra_uniform(2);
        node("Slice", {cur_.ref, ints({top, left}), ints({h - 1, w}), ints({2, 3})}, {}, {n, c, h - 2, w - left});
        note("crop");
        break;
      }
      case 4: {  // (not a higher power: x^6 under the root, twice in a chain, raised errors to the 9th power)
        const Val p = node("Pow", {cur_.ref, scalar(2.f)}, {}, x);
        const Val a = node("Add", {p.ref, scalar(1.f)}, {}, x);
        node("Sqrt", {a.ref}, {}, x), note("sqrt(x^2+1)");
        break;
      }
      case 5: {
        if (c_.dtype != DType::kF32) return activation();
        const Val h16 = node("Cast", {cur_.ref}, {{"to", I(10)}}, x);  // FLOAT16
        node("Cast", {h16.ref}, {{"to", I(1)}}, x), note("f16 round trip");
        // A value the device and the reference compute a rounding apart can round to neighbouring halves, an f16
        // step (5e-4 relative) that later ops may grow (seed 4079: a LayerNorm MLP after it, 1 of 600 outputs 1% off).
        c_.rtol = std::max(c_.rtol, 1e-2), c_.atol = std::max(c_.atol, 1e-3);
        break;
      }
      default: {
        // Wide: 512 channels over a small map, then a 3x3 over them (9.4 MB of weights at few pixels: ResNet's
        // layer4), its post-ops as a conv block's. Up to 10x10 at stride 1 (the oneDNN device's Winograd F(2,3) step
        // from 7x7), 11x11 to 16x16 at stride 2 (36-64 output pixels: its windows times weights).
        if (h > 16 || w > 16) return activation();
        const int64_t wide = 512, stride = h > 10 || w > 10 ? 2 : 1, oh = (h - 1) / stride + 1,
                      ow = (w - 1) / stride + 1;
        const Val e = node("Conv", {cur_.ref, weights("W", {wide, c, 1, 1}, c), constant("B", {wide}, -0.5f, 0.5f)},
                           {{"kernel_shape", Is({1, 1})}}, {n, wide, h, w});
        node("Relu", {e.ref}, {}, e.shape);
        node("Conv", {cur_.ref, weights("W", {wide, wide, 3, 3}, wide * 9), constant("B", {wide}, -0.5f, 0.5f)},
             {{"kernel_shape", Is({3, 3})}, {"strides", Is({stride, stride})}, {"pads", Is({1, 1, 1, 1})}},
             {n, wide, oh, ow});
        note("wide(" + std::to_string(c) + "->512, 3x3" + (stride > 1 ? "/2" : "") + ")");
        bn_and_activation();
        break;
      }
    }
  }

  // 3-D volumes [N,C,D,H,W] (video, medical images: C3D, 3-D U-Nets): Conv3d (1x1x1, 3x3x3, stride 2), BatchNorm,
  // activations, residuals, MaxPool3d, AveragePool3d, and sometimes a head.
  void volume() {
    const int64_t n = pick({1, 1, 2}), ch = pick({1, 3, 8, 16}), d = 2 + uniform(6), h = 3 + uniform(8),
                  w = chance(60) ? h : 3 + uniform(8);
    c_.inputs.push_back(in("X", {n, ch, d, h, w}));
    cur_ = {"X", {n, ch, d, h, w}};
    history_.push_back(cur_);
    const int blocks = 2 + static_cast<int>(uniform(4));
    for (int b = 0; b < blocks; ++b) {
      const Shape x = cur_.shape;
      switch (uniform(5)) {
        case 0:
        case 1: {
          const int64_t k = pick({1, 3, 3}), m = pick({8, 16, 24}), p = k / 2;
          const int64_t st = k == 3 && x[2] >= 4 && x[3] >= 4 && x[4] >= 4 && chance(25) ? 2 : 1;
          const Shape y{x[0], m, (x[2] + 2 * p - k) / st + 1, (x[3] + 2 * p - k) / st + 1, (x[4] + 2 * p - k) / st + 1};
          std::vector<std::string> ins = {cur_.ref, weights("W", {m, x[1], k, k, k}, x[1] * k * k * k)};
          if (chance(70)) ins.push_back(constant("B", {m}, -0.5f, 0.5f));
          node("Conv", ins,
               {{"kernel_shape", Is({k, k, k})}, {"strides", Is({st, st, st})}, {"pads", Is({p, p, p, p, p, p})}}, y);
          note("conv3d k" + std::to_string(k) + (st > 1 ? "/2" : "") + "(" + std::to_string(x[1]) + "->" +
               std::to_string(m) + ")");
          bn_and_activation();
          break;
        }
        case 2: activation(); break;
        case 3:
          if (const Val* e = same_shape_earlier(); e && chance(70)) add_residual(*e);
          else activation();
          break;
        default:
          if (x[2] >= 2 && x[3] >= 2 && x[4] >= 2) {
            const bool mx = chance(60);
            node(mx ? "MaxPool" : "AveragePool", {cur_.ref},
                 {{"kernel_shape", Is({2, 2, 2})}, {"strides", Is({2, 2, 2})}},
                 {x[0], x[1], x[2] / 2, x[3] / 2, x[4] / 2});
            note(mx ? "maxpool3d" : "avgpool3d");
          }
          break;
      }
      history_.push_back(cur_);
    }
    if (chance(30)) pooled_head();
  }

  // 1-D signals [N,C,L] (audio, time series: wav2vec's feature encoder, TCNs, Conformer's convolution module):
  // Conv1d of every kind (kernel 1 to 9, stride 2, dilation 2 or 4, grouped, depthwise), BatchNormalization,
  // activations, residuals, per-channel scales, pooling, a channels-last feed-forward between Transposes, Concat,
  // ConvTranspose upsampling, and sometimes a classifier head. The device lifts them to 2-D images of one row.
  void signal() {
    const int64_t n = pick({1, 1, 2}), ch = pick({1, 3, 8, 16, 24, 40, 64}), len = 8 + uniform(57);
    c_.inputs.push_back(in("X", {n, ch, len}));
    cur_ = {"X", {n, ch, len}};
    history_.push_back(cur_);
    const int blocks = 2 + static_cast<int>(uniform(5));
    for (int b = 0; b < blocks; ++b) {
      if (extra_chance(12)) {  // Conformer's convolution module gates by a GLU (and others split or swap)
        split_block();
        history_.push_back(cur_);
        continue;
      }
      switch (uniform(9)) {
        case 0:
        case 1:
        case 2: conv1d(); break;
        case 3: activation(); break;
        case 4: {
          const Shape x = cur_.shape;
          if (const Val* e = same_shape_earlier(); e && chance(60)) {
            add_residual(*e);
          } else if (chance(50)) {
            node("Mul", {cur_.ref, constant("K", {x[1], 1}, 0.5f, 1.5f)}, {}, x), note("*channel");
          } else {
            node("Add", {constant("A", {x[1], 1}, -0.5f, 0.5f), cur_.ref}, {}, x), note("+channel");
          }
          break;
        }
        case 5: pool1d(); break;
        case 6: feed_forward1d(); break;
        case 7: {
          const Shape x = cur_.shape;
          std::vector<const Val*> found;
          for (const Val& v : history_)
            if (v.ref != cur_.ref && v.shape.size() == 3 && v.shape[0] == x[0] && v.shape[2] == x[2])
              found.push_back(&v);
          if (const Val* e = any_of(found)) {
            const bool first = chance(50);
            node("Concat", {first ? cur_.ref : e->ref, first ? e->ref : cur_.ref}, {{"axis", I(1)}},
                 {x[0], x[1] + e->shape[1], x[2]});
            note("concat(" + std::to_string(x[1]) + "+" + std::to_string(e->shape[1]) + ")");
          } else {
            conv1d();
          }
          break;
        }
        default: {  // ConvTranspose1d: kernel 2 or 4, stride 2 (an upsampling decoder's)
          const Shape x = cur_.shape;
          const int64_t k = pick({2, 4}), p = k == 4 ? 1 : 0, m = pick({8, 16, 24});
          const int64_t ol = (x[2] - 1) * 2 - 2 * p + k;
          if (ol > 256) return conv1d();
          std::vector<std::string> ins = {cur_.ref, weights("T", {x[1], m, k}, x[1] * k / 2)};
          if (chance(70)) ins.push_back(constant("TB", {m}, -0.5f, 0.5f));
          node("ConvTranspose", ins, {{"kernel_shape", Is({k})}, {"strides", Is({2})}, {"pads", Is({p, p})}},
               {x[0], m, ol});
          note("convT" + std::to_string(k) + "/2(" + std::to_string(x[1]) + "->" + std::to_string(m) + ")");
          if (chance(50)) activation();
          break;
        }
      }
      history_.push_back(cur_);
    }
    if (chance(30)) pooled_head();
  }

  void conv1d() {
    const Shape x = cur_.shape;
    const int64_t c = x[1], len = x[2];
    int64_t k = pick({1, 3, 3, 5, 7, 9}), group = 1, dil = 1, m = pick({8, 16, 24, 32, 48, 64});
    const int64_t kind = uniform(6);
    if (kind == 1 && k > 1) dil = pick({2, 4});
    if (kind == 2) group = pick({2, 4});
    if (c % group != 0 || m % group != 0) group = 1;
    if (kind == 3 && c > 1) group = c, m = chance(80) ? c : 2 * c;  // depthwise (Conformer's, multiplier 1 or 2)
    const bool same = chance(75);
    const int64_t pad = same ? dil * (k - 1) / 2 : 0;
    const int64_t stride = dil == 1 && len >= 8 && chance(30) ? 2 : 1;
    // (A kernel longer than the padded input: no output, and the span's negative quotient rounds toward 0, so
    // check the span itself: seed 38845 drew a kernel of 9 over 8 unpadded.)
    const int64_t span = len + 2 * pad - dil * (k - 1) - 1;
    if (span < 0) return activation();
    const int64_t ol = span / stride + 1;
    std::vector<std::string> ins = {cur_.ref, weights("W", {m, c / group, k}, c / group * k)};
    if (chance(80)) ins.push_back(constant("B", {m}, -0.5f, 0.5f));
    node("Conv", ins,
         {{"kernel_shape", Is({k})},
          {"strides", Is({stride})},
          {"pads", Is({pad, pad})},
          {"dilations", Is({dil})},
          {"group", I(group)}},
         {x[0], m, ol});
    note("conv1d k" + std::to_string(k) + (stride > 1 ? "/2" : "") + (dil > 1 ? "d" + std::to_string(dil) : "") +
         (group > 1 ? (group == c ? "dw" : "g" + std::to_string(group)) : "") + "(" + std::to_string(c) + "->" +
         std::to_string(m) + ")");
    bn_and_activation();
  }

  // BatchNormalization of the current value's channels (sometimes), then an activation (mostly).
  void bn_and_activation() {
    if (chance(30)) {
      const int64_t m = C();
      node("BatchNormalization",
           {cur_.ref, constant("S", {m}, 0.5f, 1.5f), constant("T", {m}, -0.5f, 0.5f), constant("M", {m}, -0.5f, 0.5f),
            constant("V", {m}, 0.5f, 2.f)},
           {}, cur_.shape);
      note("bn");
    }
    if (chance(70)) activation();
  }
  // A classifier over an [N,C,...] value of any rank: GlobalAveragePool, Flatten, Gemm.
  void pooled_head() {
    const Shape x = cur_.shape;
    Shape pooled(x.size(), 1);
    pooled[0] = x[0], pooled[1] = x[1];
    node("GlobalAveragePool", {cur_.ref}, {}, pooled);
    node("Flatten", {cur_.ref}, {{"axis", I(1)}}, {x[0], x[1]});
    const int64_t k = pick({10, 16});
    node("Gemm", {cur_.ref, weights("H", {k, x[1]}, x[1]), constant("HB", {k}, -0.5f, 0.5f)}, {{"transB", I(1)}},
         {x[0], k});
    note("gap gemm(" + std::to_string(x[1]) + "->" + std::to_string(k) + ")");
  }

  void pool1d() {
    const Shape x = cur_.shape;
    const int64_t len = x[2];
    switch (uniform(4)) {
      case 0:
        if (len < 3) return;
        node("MaxPool", {cur_.ref}, {{"kernel_shape", Is({3})}, {"strides", Is({2})}, {"pads", Is({1, 1})}},
             {x[0], x[1], (len - 1) / 2 + 1});
        note("maxpool3/2");
        break;
      case 1:
        if (len < 2) return;
        node("MaxPool", {cur_.ref}, {{"kernel_shape", Is({2})}, {"strides", Is({2})}}, {x[0], x[1], len / 2});
        note("maxpool2/2");
        break;
      case 2:
        node("AveragePool", {cur_.ref}, {{"kernel_shape", Is({3})}, {"pads", Is({1, 1})}}, x);
        note("avgpool3");
        break;
      default:
        if (history_.size() <= 2) return;  // late in a chain only
        node("GlobalAveragePool", {cur_.ref}, {}, {x[0], x[1], 1});
        note("gap");
        break;
    }
  }

  // Conformer's feed-forward module over [N,L,C]: Transpose, LayerNorm, MatMul + bias, activation, MatMul + bias,
  // Transpose back, the residual around it.
  void feed_forward1d() {
    const Shape x = cur_.shape;
    const Val in_val = cur_;
    const int64_t n = x[0], c = x[1], len = x[2], hidden = pick({16, 32, 64});
    node("Transpose", {cur_.ref}, {{"perm", Is({0, 2, 1})}}, {n, len, c});
    std::string what = "ff(";
    if (chance(70) && norm_is_fair(c) && c > 1) {
      node("LayerNormalization", {cur_.ref, constant("G", {c}, 0.5f, 1.5f), constant("L", {c}, -0.5f, 0.5f)},
           {{"axis", I(-1)}, {"epsilon", F(1e-5f)}}, cur_.shape);
      what += "ln ";
    }
    node("MatMul", {cur_.ref, weights("P", {c, hidden}, c)}, {}, {n, len, hidden});
    if (chance(80)) node("Add", {cur_.ref, constant("PB", {hidden}, -0.5f, 0.5f)}, {}, cur_.shape);
    note(what + std::to_string(c) + "->" + std::to_string(hidden));
    what = "";
    activation();
    node("MatMul", {cur_.ref, weights("Q", {hidden, c}, hidden)}, {}, {n, len, c});
    if (chance(80)) node("Add", {cur_.ref, constant("QB", {c}, -0.5f, 0.5f)}, {}, cur_.shape);
    node("Transpose", {cur_.ref}, {{"perm", Is({0, 2, 1})}}, x);
    if (chance(70)) node("Add", {in_val.ref, cur_.ref}, {}, x), what = " +residual";
    note("->" + std::to_string(c) + what + ")");
  }

  // Sequences [B,S,E]: transformer-like blocks, each reading the one before.
  void sequence() {
    const int64_t b = pick({1, 1, 2}), sl = pick({1, 4, 7, 16, 33}), e = pick({8, 16, 24, 32, 48, 64});
    if (extra_chance(25)) {  // token ids through an embedding table (and learned positions), as language models start
      const int64_t vocab = 50 + extra_uniform(200);
      InputSpec ids = in("ids", {b, sl}, false, 0.f, static_cast<float>(vocab - 1));
      ids.dtype = DType::kI64;
      c_.inputs.push_back(ids);
      node("Gather", {constant("E", {vocab, e}, -1.f, 1.f), "ids"}, {{"axis", I(0)}}, {b, sl, e});
      std::string what = "embedding(" + std::to_string(vocab) + ")";
      if (extra_chance(50))
        node("Add", {cur_.ref, constant("PE", {sl, e}, -0.5f, 0.5f)}, {}, cur_.shape), what += "+pos";
      note(what);
    } else {
      c_.inputs.push_back(in("X", {b, sl, e}));
      cur_ = {"X", {b, sl, e}};
    }
    history_.push_back(cur_);
    const int blocks = 2 + static_cast<int>(uniform(5));
    // Not a LayerNorm or a Softmax right after a Softmax: rows of nearly equal values, whose normalization magnifies
    // rounding (in bf16 beyond any tolerance) rather than testing the device.
    bool after_softmax = false;
    for (int k = 0; k < blocks; ++k) {
      int64_t kind = uniform(8);
      if (after_softmax && (kind == 3 || kind == 7)) kind = 0;
      // Attention in bf16: scores of unnormalized projections make it so sensitive that rounding the inputs to bf16
      // alone moved outputs by 1.2 (seeds 4898, 8035 as of 55e8c89, the device and the reference alike).
      if (kind == 5 && c_.dtype == DType::kBF16) kind = 0;
      after_softmax = kind == 7;
      switch (kind) {
        case 0:
        case 1: linear(); break;
        case 2: gemm_rows(); break;
        case 3: layer_norm(); break;
        case 4: residual_or_affine_seq(); break;
        case 5:
          if (chance(50)) attention();
          else if (extra_chance(40)) packed_multi_head_attention();
          else multi_head_attention();
          break;
        case 6: activation(); break;
        default: node("Softmax", {cur_.ref}, {{"axis", I(-1)}}, cur_.shape), note("softmax"); break;
      }
      history_.push_back(cur_);
    }
    if (chance(30)) {  // mean over the sequence, a classifier
      const Shape x = cur_.shape;
      node("ReduceMean", {cur_.ref}, {{"axes", Is({1})}, {"keepdims", I(0)}}, {x[0], x[2]});
      const int64_t k = pick({10, 16});
      node("Gemm", {cur_.ref, weights("H", {k, x[2]}, x[2]), constant("HB", {k}, -0.5f, 0.5f)}, {{"transB", I(1)}},
           {x[0], k});
      note("mean gemm(" + std::to_string(x[2]) + "->" + std::to_string(k) + ")");
    }
  }

  // MatMul with constant weights [E, E2], a bias (either operand order), a scalar factor, an activation.
  void linear() {
    const Shape x = cur_.shape;
    const int64_t e = x.back(), e2 = pick({16, 24, 32, 48, 64, 96});
    Shape y = x;
    y.back() = e2;
    node("MatMul", {cur_.ref, weights("P", {e, e2}, e)}, {}, y);
    std::string what = "linear(" + std::to_string(e) + "->" + std::to_string(e2);
    if (chance(80)) {
      const std::string bias = constant("PB", {e2}, -0.5f, 0.5f);
      const bool first = chance(50);
      node("Add", {first ? bias : cur_.ref, first ? cur_.ref : bias}, {}, y);
      what += " +bias";
    }
    if (chance(25)) {
      const bool div = chance(50);
      node(div ? "Div" : "Mul", {cur_.ref, scalar(div ? 2.f : 0.5f)}, {}, y);
      what += div ? " /2" : " *0.5";
    }
    note(what + ")");
    if (chance(50)) activation();
  }

  // Gemm over the rows [B*S, E] between Reshapes: transB, alpha, beta, C (a row vector) or none.
  void gemm_rows() {
    const Shape x = cur_.shape;
    const int64_t rows = x[0] * x[1], e = x[2], e2 = pick({16, 32, 40, 64});
    node("Reshape", {cur_.ref, reshape_to({rows, e}, false)}, {}, {rows, e});
    const bool tb = chance(50), with_c = chance(70);
    const float alpha = chance(30) ? 0.5f : 1.f, beta = with_c && chance(30) ? 2.f : 1.f;
    std::vector<std::string> ins = {cur_.ref, weights("G", tb ? Shape{e2, e} : Shape{e, e2}, e)};
    if (with_c) ins.push_back(constant("GC", {e2}, -0.5f, 0.5f));
    node("Gemm", ins, {{"transB", I(tb ? 1 : 0)}, {"alpha", F(alpha)}, {"beta", F(beta)}}, {rows, e2});
    if (chance(40)) activation();
    node("Reshape", {cur_.ref, reshape_to({x[0], x[1], e2}, false)}, {}, {x[0], x[1], e2});
    note(std::string("gemm(") + (tb ? "transB " : "") + (alpha != 1.f ? "alpha " : "") +
         (with_c ? (beta != 1.f ? "C*2 " : "C ") : "") + std::to_string(e) + "->" + std::to_string(e2) + ")");
  }

  // LayerNormalization over the last axis, or the decomposition torch exported before opset 17.
  void layer_norm() {
    const Shape x = cur_.shape;
    const int64_t e = x.back();
    if (!norm_is_fair(e)) return linear();
    const std::string g = constant("G", {e}, 0.5f, 1.5f), bt = constant("L", {e}, -0.5f, 0.5f);
    if (chance(50)) {
      node("LayerNormalization", {cur_.ref, g, bt}, {{"axis", I(-1)}, {"epsilon", F(1e-5f)}}, x);
      note("layernorm");
      return;
    }
    Shape r = x;
    r.back() = 1;
    const std::string in_ref = cur_.ref;
    const Val m = node("ReduceMean", {in_ref}, {{"axes", Is({-1})}}, r);
    const Val d = node("Sub", {in_ref, m.ref}, {}, x);
    const Val p = node("Pow", {d.ref, scalar(2.f)}, {}, x);
    const Val v = node("ReduceMean", {p.ref}, {{"axes", Is({-1})}}, r);
    const Val ve = node("Add", {v.ref, scalar(1e-5f)}, {}, r);
    const Val sd = node("Sqrt", {ve.ref}, {}, r);
    const Val nv = node("Div", {d.ref, sd.ref}, {}, x);
    const Val sc = node("Mul", {nv.ref, g}, {}, x);
    node("Add", {sc.ref, bt}, {}, x);
    note("layernorm(decomposed)");
  }

  void residual_or_affine_seq() {
    const Shape x = cur_.shape;
    if (const Val* e = same_shape_earlier(); e && chance(60)) {
      add_residual(*e);
      if (chance(40)) layer_norm();
      return;
    }
    switch (uniform(4)) {
      case 0: node("Mul", {cur_.ref, constant("K", {x.back()}, 0.5f, 1.5f)}, {}, x), note("*vector"); break;
      case 1: node("Add", {constant("A", {x.back()}, -0.5f, 0.5f), cur_.ref}, {}, x), note("+vector"); break;
      case 2: node("Sub", {cur_.ref, scalar(0.25f)}, {}, x), note("-scalar"); break;
      default: node("Div", {cur_.ref, scalar(1.5f)}, {}, x), note("/scalar"); break;
    }
  }

  // Multi-head self-attention as torch's nn.MultiheadAttention exports it: Q, K, V projections, heads split by Reshape
  // and Transpose, scores scaled, Softmax, the heads merged back, the output projection (the fuse_attention pass's
  // pattern; the device may run it as one step).
  void multi_head_attention() {
    const Shape x = cur_.shape;
    const int64_t b = x[0], sl = x[1], e = x[2];
    int64_t heads = pick({1, 2, 4});
    while (e % heads != 0) heads /= 2;
    const int64_t d = e / heads;
    const std::string in_ref = cur_.ref;
    auto proj = [&](const std::string& stem) {
      const Val m = node("MatMul", {in_ref, weights(stem, {e, e}, e)}, {}, x);
      const Val a = node("Add", {m.ref, constant(stem + "B", {e}, -0.5f, 0.5f)}, {}, x);
      return node("Reshape", {a.ref, reshape_to({b, sl, heads, d}, true)}, {}, {b, sl, heads, d});
    };
    const Val q = proj("Q"), k = proj("K"), v = proj("V");
    const Val qt = node("Transpose", {q.ref}, {{"perm", Is({0, 2, 1, 3})}}, {b, heads, sl, d});
    const Val kt = node("Transpose", {k.ref}, {{"perm", Is({0, 2, 3, 1})}}, {b, heads, d, sl});
    const Val vt = node("Transpose", {v.ref}, {{"perm", Is({0, 2, 1, 3})}}, {b, heads, sl, d});
    const Val s = node("MatMul", {qt.ref, kt.ref}, {}, {b, heads, sl, sl});
    const Val ss = node("Div", {s.ref, scalar(std::sqrt(static_cast<float>(d)))}, {}, {b, heads, sl, sl});
    const Val p = node("Softmax", {ss.ref}, {{"axis", I(-1)}}, {b, heads, sl, sl});
    const Val o = node("MatMul", {p.ref, vt.ref}, {}, {b, heads, sl, d});
    const Val ot = node("Transpose", {o.ref}, {{"perm", Is({0, 2, 1, 3})}}, {b, sl, heads, d});
    const Val om = node("Reshape", {ot.ref, reshape_to({b, sl, e}, true)}, {}, x);
    const Val out = node("MatMul", {om.ref, weights("O", {e, e}, e)}, {}, x);
    node("Add", {out.ref, constant("OB", {e}, -0.5f, 0.5f)}, {}, x);
    note("mha(" + std::to_string(heads) + " heads)");
  }

  // nn.MultiheadAttention as torch exports it with its packed in-projection: the batch-first input transposed to
  // [S, B, E], one product with [E, 3E], the q/k/v Slices, the heads split by Reshape [S, B*H, Dh] (at a batch above 1
  // no one view of a slice: the cpu_onednn chain reads the atoms [S, B, H, Dh]) and Transposes, the query scaled,
  // Softmax, the heads joined back, the out-projection as a Gemm over [S*B, E], the batch-first layout again.
  void packed_multi_head_attention() {
    const Shape x = cur_.shape;
    const int64_t b = x[0], sl = x[1], e = x[2];
    int64_t heads = pick({1, 2, 4});
    while (e % heads != 0) heads /= 2;
    const int64_t d = e / heads, bh = b * heads;
    auto perm = [](std::vector<int64_t> p) { return std::map<std::string, Attribute>{{"perm", Is(std::move(p))}}; };
    const Val xt = node("Transpose", {cur_.ref}, perm({1, 0, 2}), {sl, b, e});
    const Val m = node("MatMul", {xt.ref, weights("QKV", {e, 3 * e}, e)}, {}, {sl, b, 3 * e});
    const Val a = node("Add", {constant("QKVB", {3 * e}, -0.5f, 0.5f), m.ref}, {}, {sl, b, 3 * e});
    auto head_split = [&](int64_t k) {
      const Val part = node("Slice", {a.ref, ints({k * e}), ints({(k + 1) * e}), ints({-1})}, {}, {sl, b, e});
      return node("Reshape", {part.ref, ints({sl, -1, d})}, {}, {sl, bh, d});
    };
    const Val q = head_split(0), k = head_split(1), v = head_split(2);
    const Val qt = node("Transpose", {q.ref}, perm({1, 0, 2}), {bh, sl, d});
    const Val qs = node("Div", {qt.ref, scalar(std::sqrt(static_cast<float>(d)))}, {}, {bh, sl, d});
    const Val kt = node("Transpose", {k.ref}, perm({1, 2, 0}), {bh, d, sl});
    const Val vt = node("Transpose", {v.ref}, perm({1, 0, 2}), {bh, sl, d});
    const Val sc = node("MatMul", {qs.ref, kt.ref}, {}, {bh, sl, sl});
    const Val p = node("Softmax", {sc.ref}, {{"axis", I(-1)}}, {bh, sl, sl});
    const Val o = node("MatMul", {p.ref, vt.ref}, {}, {bh, sl, d});
    const Val ot = node("Transpose", {o.ref}, perm({1, 0, 2}), {sl, bh, d});
    const Val om = node("Reshape", {ot.ref, ints({-1, e})}, {}, {sl * b, e});
    const Val g = node("Gemm", {om.ref, weights("O", {e, e}, e), constant("OB", {e}, -0.5f, 0.5f)}, {{"transB", I(1)}},
                       {sl * b, e});
    const Val gr = node("Reshape", {g.ref, ints({sl, -1, e})}, {}, {sl, b, e});
    node("Transpose", {gr.ref}, perm({1, 0, 2}), x);
    note("packed mha(" + std::to_string(heads) + " heads)");
  }

  // Self-attention of one head on the value itself (or on a linear projection of it): softmax(x x^T * k) x.
  void attention() {
    const Shape x = cur_.shape;
    const int64_t b = x[0], sl = x[1], e = x[2];
    const std::string v = cur_.ref;
    const Val kt = node("Transpose", {v}, {{"perm", Is({0, 2, 1})}}, {b, e, sl});
    const Val sc = node("MatMul", {v, kt.ref}, {}, {b, sl, sl});
    const bool div = chance(50);
    node(div ? "Div" : "Mul",
         {sc.ref, scalar(div ? std::sqrt(static_cast<float>(e)) : 1.f / std::sqrt(static_cast<float>(e)))}, {},
         {b, sl, sl});
    const Val p = node("Softmax", {cur_.ref}, {{"axis", I(-1)}}, {b, sl, sl});
    node("MatMul", {p.ref, v}, {}, x);
    note("attention");
  }

  void conv_block() {
    const Shape x = cur_.shape;
    const int64_t c = x[1], h = x[2], w = x[3];
    int64_t k = 1, group = 1, dil = 1, m = pick({8, 12, 16, 24, 32, 48, 64, 96});
    const int64_t kind = uniform(7);
    if (kind == 1 || kind == 2) k = 3;
    if (kind == 3) k = 3, dil = 2;
    if (kind == 4) k = 3, group = pick({2, 4});
    if (c % group != 0 || m % group != 0) group = 1;
    if (kind >= 5) k = pick({3, 3, 5, 7}), group = c, m = chance(80) ? c : 2 * c;  // depthwise (multiplier 1 or 2)
    const int64_t pad = dil * (k - 1) / 2;
    const int64_t stride = dil == 1 && h >= 6 && w >= 6 && chance(30) ? 2 : 1;
    const int64_t oh = (h + 2 * pad - dil * (k - 1) - 1) / stride + 1,
                  ow = (w + 2 * pad - dil * (k - 1) - 1) / stride + 1;
    if (oh < 1 || ow < 1) return;
    std::vector<std::string> ins = {cur_.ref, weights("W", {m, c / group, k, k}, c / group * k * k)};
    if (chance(80)) ins.push_back(constant("B", {m}, -0.5f, 0.5f));
    node("Conv", ins,
         {{"kernel_shape", Is({k, k})},
          {"strides", Is({stride, stride})},
          {"pads", Is({pad, pad, pad, pad})},
          {"dilations", Is({dil, dil})},
          {"group", I(group)}},
         {x[0], m, oh, ow});
    note("conv" + std::to_string(k) + "x" + std::to_string(k) + (stride > 1 ? "/2" : "") + (dil > 1 ? "d2" : "") +
         (group > 1 ? (group == c ? "dw" : "g" + std::to_string(group)) : "") + "(" + std::to_string(c) + "->" +
         std::to_string(m) + ")");
    bn_and_activation();
  }

  void activation() {
    const Shape s = cur_.shape;
    const std::string x = cur_.ref;
    switch (uniform(11)) {
      case 0: node("Relu", {x}, {}, s), note("relu"); break;
      case 1: node("Clip", {x, scalar(0.f), scalar(6.f)}, {}, s), note("clip"); break;
      case 2: node("LeakyRelu", {x}, {{"alpha", F(0.1f)}}, s), note("leakyrelu"); break;
      case 3: node("Sigmoid", {x}, {}, s), note("sigmoid"); break;
      case 4: node("Tanh", {x}, {}, s), note("tanh"); break;
      case 5: node("HardSigmoid", {x}, {{"alpha", F(1.f / 6)}, {"beta", F(0.5f)}}, s), note("hardsigmoid"); break;
      case 6: node("HardSwish", {x}, {}, s), note("hardswish"); break;
      case 7: {  // MobileNetV3's hard-swish as exported: x * HardSigmoid(x)
        const Val hs = node("HardSigmoid", {x}, {{"alpha", F(1.f / 6)}, {"beta", F(0.5f)}}, s);
        node("Mul", {x, hs.ref}, {}, s), note("x*hardsigmoid");
        break;
      }
      case 8: {  // SiLU as exported: x * Sigmoid(x)
        const Val sg = node("Sigmoid", {x}, {}, s);
        node("Mul", {sg.ref, x}, {}, s), note("silu");
        break;
      }
      case 9: node("Elu", {x}, {{"alpha", F(1.f)}}, s), note("elu"); break;
      default: {  // GELU as its Erf formula: x * 0.5 * (1 + erf(x / sqrt(2)))
        const Val d = node("Div", {x, scalar(std::sqrt(2.f))}, {}, s);
        const Val e = node("Erf", {d.ref}, {}, s);
        const Val a = node("Add", {e.ref, scalar(1.f)}, {}, s);
        const Val m = node("Mul", {x, a.ref}, {}, s);
        node("Mul", {m.ref, scalar(0.5f)}, {}, s), note("gelu");
        break;
      }
    }
  }

  // One of `vals` drawn at random, or null when there is none.
  const Val* any_of(const std::vector<const Val*>& vals) {
    return vals.empty() ? nullptr : vals[static_cast<size_t>(uniform(static_cast<int64_t>(vals.size())))];
  }
  // An earlier value of the current shape (not the current one), or null.
  const Val* same_shape_earlier() {
    std::vector<const Val*> found;
    for (const Val& v : history_)
      if (v.shape == cur_.shape && v.ref != cur_.ref) found.push_back(&v);
    return any_of(found);
  }
  // The earlier 4-D values (not the current one) of the current batch and pixels: what a Concat can join.
  std::vector<const Val*> earlier_same_pixels() const {
    const Shape& x = cur_.shape;
    std::vector<const Val*> found;
    for (const Val& v : history_)
      if (v.ref != cur_.ref && v.shape.size() == 4 && v.shape[0] == x[0] && v.shape[2] == x[2] && v.shape[3] == x[3])
        found.push_back(&v);
    return found;
  }
  // The current value plus the earlier value `e` (operands in a random order).
  void add_residual(const Val& e) {
    const bool first = chance(50);
    node("Add", {first ? cur_.ref : e.ref, first ? e.ref : cur_.ref}, {}, cur_.shape);
    note("+residual");
  }

  void residual_or_affine() {
    const Shape s = cur_.shape;
    if (const Val* e = same_shape_earlier(); e && chance(60)) {
      add_residual(*e);
      if (chance(50)) node("Relu", {cur_.ref}, {}, s), note("relu");
      return;
    }
    if (!nchw()) return;
    const int64_t c = C();
    switch (uniform(3)) {
      case 0: node("Mul", {cur_.ref, constant("K", {c, 1, 1}, 0.5f, 1.5f)}, {}, s), note("*channel"); break;
      case 1: node("Add", {constant("A", {c, 1, 1}, -0.5f, 0.5f), cur_.ref}, {}, s), note("+channel"); break;
      default: node("Mul", {cur_.ref, scalar(0.75f)}, {}, s), note("*scalar"); break;
    }
  }

  void pool() {
    const Shape x = cur_.shape;
    const int64_t h = x[2], w = x[3];
    const int64_t kind = uniform(4);
    if (kind == 0 && h >= 3 && w >= 3) {
      node("MaxPool", {cur_.ref}, {{"kernel_shape", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}},
           {x[0], x[1], (h - 1) / 2 + 1, (w - 1) / 2 + 1});
      note("maxpool3/2");
    } else if (kind == 1 && h >= 2 && w >= 2) {
      node("MaxPool", {cur_.ref}, {{"kernel_shape", Is({2, 2})}, {"strides", Is({2, 2})}}, {x[0], x[1], h / 2, w / 2});
      note("maxpool2/2");
    } else if (kind == 2) {
      const int64_t inc = uniform(2);
      node("AveragePool", {cur_.ref},
           {{"kernel_shape", Is({3, 3})}, {"pads", Is({1, 1, 1, 1})}, {"count_include_pad", I(inc)}}, x);
      note(inc ? "avgpool3(pad counted)" : "avgpool3");
    } else if (history_.size() > 2) {  // late in a chain only: nothing spatial follows a global pool
      const bool avg = chance(70);
      node(avg ? "GlobalAveragePool" : "GlobalMaxPool", {cur_.ref}, {}, {x[0], x[1], 1, 1});
      note(avg ? "gap" : "gmp");
    }
  }

  // ConvNeXt's inverted bottleneck in channels-last: Transpose, LayerNorm, MatMul + bias, GELU, MatMul + bias,
  // layer scale, Transpose back, the residual around it.
  void mlp() {
    const Shape x = cur_.shape;
    const Val in_val = cur_;
    const int64_t n = x[0], c = x[1], h = x[2], w = x[3], hidden = pick({16, 32, 48, 64, 96});
    node("Transpose", {cur_.ref}, {{"perm", Is({0, 2, 3, 1})}}, {n, h, w, c});
    std::string what = "mlp(";
    if (chance(70) && norm_is_fair(c)) {
      node("LayerNormalization", {cur_.ref, constant("G", {c}, 0.5f, 1.5f), constant("L", {c}, -0.5f, 0.5f)},
           {{"axis", I(-1)}, {"epsilon", F(1e-6f)}}, cur_.shape);
      what += "ln ";
    }
    node("MatMul", {cur_.ref, weights("P", {c, hidden}, c)}, {}, {n, h, w, hidden});
    if (chance(80)) node("Add", {cur_.ref, constant("PB", {hidden}, -0.5f, 0.5f)}, {}, cur_.shape);
    what += std::to_string(c) + "->" + std::to_string(hidden);
    if (chance(80)) {
      note(what);
      what = "";
      activation();
    }
    const int64_t out = chance(70) ? c : pick({16, 24, 32});
    node("MatMul", {cur_.ref, weights("Q", {hidden, out}, hidden)}, {}, {n, h, w, out});
    if (chance(80)) node("Add", {cur_.ref, constant("QB", {out}, -0.5f, 0.5f)}, {}, cur_.shape);
    what += "->" + std::to_string(out);
    if (chance(50)) node("Mul", {cur_.ref, constant("LS", {out}, 0.1f, 1.f)}, {}, cur_.shape), what += " scaled";
    node("Transpose", {cur_.ref}, {{"perm", Is({0, 3, 1, 2})}}, {n, out, h, w});
    if (out == c && chance(70)) {
      node("Add", {in_val.ref, cur_.ref}, {}, cur_.shape);
      what += " +residual";
    }
    note(what + ")");
  }

  void concat_or_resize() {
    const Shape x = cur_.shape;
    if (chance(50)) {
      if (const Val* e = any_of(earlier_same_pixels())) {
        const bool first = chance(50);
        node("Concat", {first ? cur_.ref : e->ref, first ? e->ref : cur_.ref}, {{"axis", I(1)}},
             {x[0], x[1] + e->shape[1], x[2], x[3]});
        note("concat(" + std::to_string(x[1]) + "+" + std::to_string(e->shape[1]) + ")");
        return;
      }
    }
    if (x[2] * x[3] > 144 || c_.dtype != DType::kF32) return;  // (a Resize's scales stay f32 in a bf16 graph)
    static const char* const kModes[] = {"half_pixel", "align_corners", "pytorch_half_pixel"};
    const char* mode = kModes[uniform(3)];
    InputSpec sc = in("R" + std::to_string(c_.inputs.size()), {4}, true);
    sc.values = {1.f, 1.f, 2.f, 2.f};
    c_.inputs.push_back(sc);
    node("Resize", {cur_.ref, "", sc.name}, {{"mode", S("linear")}, {"coordinate_transformation_mode", S(mode)}},
         {x[0], x[1], 2 * x[2], 2 * x[3]});
    note(std::string("resize2x(") + mode + ")");
  }

  // MobileNetV3's squeeze-and-excitation: a gate from the channel means scales the channels.
  void squeeze_excite() {
    const Shape x = cur_.shape;
    const Val in_val = cur_;
    const int64_t c = x[1], r = std::max<int64_t>(4, c / 4);
    node("GlobalAveragePool", {cur_.ref}, {}, {x[0], c, 1, 1});
    node("Conv", {cur_.ref, weights("E", {r, c, 1, 1}, c), constant("EB", {r}, -0.5f, 0.5f)},
         {{"kernel_shape", Is({1, 1})}}, {x[0], r, 1, 1});
    node("Relu", {cur_.ref}, {}, cur_.shape);
    node("Conv", {cur_.ref, weights("F", {c, r, 1, 1}, r), constant("FB", {c}, -0.5f, 0.5f)},
         {{"kernel_shape", Is({1, 1})}}, {x[0], c, 1, 1});
    const bool hard = chance(50);
    if (hard) node("HardSigmoid", {cur_.ref}, {{"alpha", F(1.f / 6)}, {"beta", F(0.5f)}}, cur_.shape);
    else node("Sigmoid", {cur_.ref}, {}, cur_.shape);
    node("Mul", {in_val.ref, cur_.ref}, {}, x);
    note(std::string("se(") + (hard ? "hardsigmoid" : "sigmoid") + ")");
  }

  // A classifier: GlobalAveragePool (or the whole map when small), Flatten, Gemm with weights [K, features].
  void head() {
    const Shape x = cur_.shape;
    if (x[2] * x[3] > 1 && (chance(60) || x[1] * x[2] * x[3] > 4096)) {
      node("GlobalAveragePool", {cur_.ref}, {}, {x[0], x[1], 1, 1});
      note("gap");
    }
    const int64_t f = cur_.shape[1] * cur_.shape[2] * cur_.shape[3], k = pick({10, 16, 37});
    node("Flatten", {cur_.ref}, {{"axis", I(1)}}, {x[0], f});
    node("Gemm", {cur_.ref, weights("H", {k, f}, f), constant("HB", {k}, -0.5f, 0.5f)}, {{"transB", I(1)}}, {x[0], k});
    note("gemm(" + std::to_string(f) + "->" + std::to_string(k) + ")");
    if (chance(50)) activation();
  }

  std::mt19937_64 rng_, extra_rng_;
  bool dynamic_ = false;
  OpCase c_;
  Val cur_;
  std::vector<Val> history_;
  std::string what_;
};

}  // namespace

OpCase random_chain_case(uint64_t seed, DType dtype) {
  OpCase c = Gen(seed).make(seed, dtype);
  c.generated = OpCase::Generated{seed, dtype};
  return c;
}

}  // namespace keel::cts
