// INT8 post-training quantization (see quantize.h): calibration through Keel's own sessions, the quantize_int8 pass
// for the QDQ rewrite, per-layer and output error on held-out batches, tolerance-driven fp32 fallback.
#include "tools/calibration/quantize.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/base/pass_manager.h"
#include "core/runtime/host_api.h"
#include "core/runtime/kernel_context.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "tools/calibration/gptq.h"
#include "tools/keel/progress.h"

namespace keel::cli {

// ------------------------------------------------------------------------------------------------ calibration math

void Histogram::init(double lo_, double hi_, size_t n) {
  lo = lo_;
  hi = hi_ > lo_ ? hi_ : lo_ + 1e-12;
  bins.assign(std::max<size_t>(n, 1), 0.0);
}

void Histogram::add(const float* v, size_t n, bool absolute) {
  const double width = (hi - lo) / static_cast<double>(bins.size());
  const double inv = 1.0 / width;
  const int64_t last = static_cast<int64_t>(bins.size()) - 1;
  for (size_t i = 0; i < n; ++i) {
    double x = absolute ? std::fabs(static_cast<double>(v[i])) : static_cast<double>(v[i]);
    if (!std::isfinite(x)) continue;
    int64_t b = static_cast<int64_t>((x - lo) * inv);
    bins[static_cast<size_t>(std::clamp<int64_t>(b, 0, last))] += 1.0;
  }
}

std::pair<double, double> percentile_range(const Histogram& h, double percentile) {
  double total = 0;
  for (double c : h.bins) total += c;
  if (total <= 0) return {h.lo, h.hi};
  const double tail = total * (100.0 - std::clamp(percentile, 50.0, 100.0)) / 100.0;
  const double width = (h.hi - h.lo) / static_cast<double>(h.bins.size());
  const size_t n = h.bins.size();
  // Lower bound: the left edge of the first bin where the cumulative count passes the tail.
  double acc = 0, lo = h.lo, hi = h.hi;
  for (size_t i = 0; i < n; ++i) {
    if (acc + h.bins[i] > tail) {
      lo = h.lo + static_cast<double>(i) * width;
      break;
    }
    acc += h.bins[i];
  }
  acc = 0;
  for (size_t i = n; i-- > 0;) {
    if (acc + h.bins[i] > tail) {
      hi = h.lo + static_cast<double>(i + 1) * width;
      break;
    }
    acc += h.bins[i];
  }
  return {lo, hi};
}

double entropy_threshold(const Histogram& h, int levels, double zeros) {
  constexpr double kMaxClipped = 0.01;
  const size_t n = h.bins.size();
  const double width = (h.hi - h.lo) / static_cast<double>(n);
  const size_t q = static_cast<size_t>(std::max(levels, 2));
  if (n <= q) return h.hi;
  double best_kl = std::numeric_limits<double>::infinity();
  size_t best = n;
  // Exact zeros are on the grid at any threshold: in P they would be a spike that outweighs everything the threshold
  // decides (a ReLU's or a HardSigmoid's saturated part), so they are left out (pytorch-quantization flattens its
  // first bin for the same reason).
  std::vector<double> bins = h.bins;
  bins[0] = std::max(0.0, bins[0] - zeros);
  double total = 0;
  for (double c : bins) total += c;
  std::vector<double> p, qv;
  for (size_t i = q; i <= n; ++i) {
    // P: the first i bins, with the outliers folded into the last one.
    p.assign(bins.begin(), bins.begin() + static_cast<std::ptrdiff_t>(i));
    double outliers = 0;
    for (size_t j = i; j < n; ++j) outliers += bins[j];
    // KL(P || Q) does not see what clipping destroys: a threshold below the bulk of values that stay away from zero
    // (an average-pooled feature, a sigmoid's output) folds them all into one bin that Q matches exactly, KL ~ 0.
    // Thresholds that clip more than kMaxClipped of the values are therefore not candidates.
    if (outliers > kMaxClipped * total) continue;
    p[i - 1] += outliers;
    double psum = 0;
    for (double v : p) psum += v;
    if (psum <= 0) continue;
    // Q: the first i bins (without outliers) merged into q levels, each level's mass spread evenly over the bins
    // of that level that were non-zero.
    qv.assign(i, 0.0);
    for (size_t l = 0; l < q; ++l) {
      const size_t b0 = l * i / q, b1 = (l + 1) * i / q;
      double mass = 0;
      size_t nonzero = 0;
      for (size_t j = b0; j < b1; ++j) {
        mass += bins[j];
        nonzero += bins[j] != 0;
      }
      if (nonzero == 0) continue;
      for (size_t j = b0; j < b1; ++j)
        if (bins[j] != 0) qv[j] = mass / static_cast<double>(nonzero);
    }
    double qsum = 0;
    for (double v : qv) qsum += v;
    if (qsum <= 0) continue;
    double kl = 0;
    for (size_t j = 0; j < i; ++j) {
      if (p[j] == 0) continue;
      // Q is zero only where the outliers landed in an empty last bin: a small floor keeps KL finite there.
      const double qj = qv[j] > 0 ? qv[j] / qsum : 1e-10;
      kl += (p[j] / psum) * std::log((p[j] / psum) / qj);
    }
    if (kl < best_kl) {
      best_kl = kl;
      best = i;
    }
  }
  return std::min(h.hi, h.lo + static_cast<double>(best) * width);  // the right edge of the kept bins
}

std::pair<double, double> mse_range(const Histogram& h, double zeros, bool s8) {
  const size_t n = h.bins.size();
  double total = 0;
  for (double c : h.bins) total += c;
  const double lo0 = std::min(h.lo, 0.0), hi0 = std::max(h.hi, 0.0);
  if (total <= 0 || n == 0 || !(hi0 > lo0)) return {lo0, hi0};
  zeros = std::clamp(zeros, 0.0, total);
  const double width = (h.hi - h.lo) / static_cast<double>(n);
  auto center = [&](size_t b) { return h.lo + (static_cast<double>(b) + 0.5) * width; };
  // Prefix sums of count, count * x and count * x^2 over the bins (x = the bin's centre): the squared clipping error
  // of a bound is then O(1) — sum over the clipped bins of c (x - bound)^2 = S2 - 2 bound S1 + bound^2 S0.
  std::vector<double> p0(n + 1, 0.0), p1(n + 1, 0.0), p2(n + 1, 0.0);
  for (size_t b = 0; b < n; ++b) {
    const double x = center(b), c = h.bins[b];
    p0[b + 1] = p0[b] + c;
    p1[b + 1] = p1[b] + c * x;
    p2[b + 1] = p2[b] + c * x * x;
  }
  auto first_above = [&](double v) {  // the first bin whose centre lies above v
    const double f = std::floor((v - h.lo) / width - 0.5) + 1;
    return static_cast<size_t>(std::clamp(f, 0.0, static_cast<double>(n)));
  };
  auto first_at_or_above = [&](double v) {  // the first bin whose centre is >= v
    const double f = std::ceil((v - h.lo) / width - 0.5);
    return static_cast<size_t>(std::clamp(f, 0.0, static_cast<double>(n)));
  };
  // Error of the range [lo, hi] with `levels` steps: step^2 / 12 for each value inside except the exact zeros (0 is
  // always on the grid), (x - bound)^2 for each value clipped.
  auto error = [&](double lo, double hi, double levels) {
    const size_t ja = first_above(hi), jb = first_at_or_above(lo);
    const double a0 = p0[n] - p0[ja], a1 = p1[n] - p1[ja], a2 = p2[n] - p2[ja];
    const double b0 = p0[jb], b1 = p1[jb], b2 = p2[jb];
    const double step = (hi - lo) / levels;
    const double inside = std::max(total - a0 - b0 - zeros, 0.0);
    return inside * step * step / 12.0 + (a2 - 2 * hi * a1 + hi * hi * a0) + (b2 - 2 * lo * b1 + lo * lo * b0);
  };
  // Candidates: each bound shrunk towards 0 independently (an outlier on one side must not clip the other), 512
  // steps from the min-max bound down to 1/512 of it; s8: one symmetric bound.
  constexpr int kSteps = 512;
  double best_err = std::numeric_limits<double>::infinity();
  std::pair<double, double> best{lo0, hi0};
  if (s8) {
    const double amax = std::max(-lo0, hi0);
    for (int k = kSteps; k >= 1; --k) {
      const double a = amax * k / kSteps;
      const double e = error(-a, a, 254.0);
      if (e < best_err) best_err = e, best = {-a, a};
    }
    return best;
  }
  const int lo_steps = lo0 < 0 ? kSteps : 1;
  for (int i = lo_steps; i >= 1; --i) {
    const double lo = lo0 < 0 ? lo0 * i / kSteps : 0.0;
    for (int k = kSteps; k >= 1; --k) {
      const double hi = hi0 * k / kSteps;
      if (!(hi > lo)) continue;
      const double e = error(lo, hi, 255.0);
      if (e < best_err) best_err = e, best = {lo, hi};
    }
  }
  return best;
}

// ------------------------------------------------------------------------------------------------ calibration data

StatusOr<std::vector<Feeds>> read_calibration_dir(const std::string& dir, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return invalid_argument("calibration folder '" + dir + "' does not exist");
  auto is_tensor_file = [](const fs::path& p) { return p.extension() == ".npy" || p.extension() == ".pb"; };
  std::vector<fs::path> subdirs, files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_directory()) subdirs.push_back(e.path());
    else if (e.is_regular_file() && is_tensor_file(e.path())) files.push_back(e.path());
  }
  if (ec) return invalid_argument("cannot list calibration folder '" + dir + "': " + ec.message());
  std::sort(subdirs.begin(), subdirs.end());
  std::sort(files.begin(), files.end());
  std::vector<Feeds> batches;
  if (!subdirs.empty()) {
    for (const fs::path& sd : subdirs) {
      std::vector<fs::path> fl;
      for (const auto& e : fs::directory_iterator(sd, ec))
        if (e.is_regular_file() && is_tensor_file(e.path())) fl.push_back(e.path());
      std::sort(fl.begin(), fl.end());
      std::map<std::string, Tensor> found;
      for (const fs::path& f : fl) {
        std::string pb_name;
        auto t = read_tensor_file(f, &pb_name);
        if (!t.is_ok()) return t.status().with_context("calibration file " + f.string());
        std::string stem = f.stem().string(), name;
        if (std::find(inputs.begin(), inputs.end(), stem) != inputs.end()) name = stem;
        else if (!pb_name.empty() && std::find(inputs.begin(), inputs.end(), pb_name) != inputs.end()) name = pb_name;
        else if (stem.rfind("input_", 0) == 0) {
          char* end = nullptr;
          long k = std::strtol(stem.c_str() + 6, &end, 10);
          if (end && *end == 0 && k >= 0 && static_cast<size_t>(k) < inputs.size())
            name = inputs[static_cast<size_t>(k)];
        }
        if (name.empty())
          return invalid_argument("calibration file " + f.string() +
                                  " names no graph input (expected NAME.npy, NAME.pb "
                                  "or input_K.pb for one of the model's inputs)");
        found[name] = std::move(t).value();
      }
      if (found.empty()) continue;
      Feeds feeds;
      for (const std::string& in : inputs) {
        auto it = found.find(in);
        if (it == found.end())
          return invalid_argument("calibration batch " + sd.string() + " has no file for input '" + in + "'");
        feeds.emplace_back(in, it->second);
      }
      batches.push_back(std::move(feeds));
    }
  } else {
    if (inputs.size() != 1 && !files.empty())
      return invalid_argument("calibration folder '" + dir + "' holds files, but the model has " +
                              std::to_string(inputs.size()) +
                              " inputs: use one subfolder per batch with one file per input");
    for (const fs::path& f : files) {
      auto t = read_tensor_file(f);
      if (!t.is_ok()) return t.status().with_context("calibration file " + f.string());
      batches.push_back(Feeds{{inputs[0], std::move(t).value()}});
    }
  }
  if (batches.empty()) return invalid_argument("calibration folder '" + dir + "' holds no .npy/.pb batches");
  return batches;
}

// ------------------------------------------------------------------------------------------------ quantize_graph

namespace {

struct Layer {
  std::string node, op_type, input, output;
  bool user_excluded = false;
  bool trans_a = false;  // Gemm's transA
};

// The axis of an activation that a layer's weight contracts over channel by channel: Conv's input channels (axis 1),
// the last axis of MatMul's A, axis 1 of Gemm's A (transA = 0). -1 when the layer reads it otherwise (Gemm transA).
int64_t channel_axis(const std::string& op_type, bool trans_a, int64_t rank) {
  if (rank < 2) return -1;
  if (op_type == "Conv") return 1;
  if (op_type == "MatMul") return rank - 1;
  if (op_type == "Gemm") return !trans_a && rank == 2 ? 1 : -1;
  return -1;
}

// Per-channel means of activations along one axis, accumulated over calibration batches.
struct ChannelMean {
  int64_t axis = -1;
  std::vector<double> sum;
  double count = 0;  // elements per channel seen
  bool ok = true;
  void add(const Tensor& t) {
    if (!ok || axis < 0 || axis >= t.rank()) {
      ok = false;
      return;
    }
    const int64_t c = t.shape()[static_cast<size_t>(axis)];
    int64_t inner = 1;
    for (int64_t d = axis + 1; d < t.rank(); ++d) inner *= t.shape()[static_cast<size_t>(d)];
    const int64_t outer = c * inner == 0 ? 0 : t.numel() / (c * inner);
    if (sum.empty()) sum.assign(static_cast<size_t>(c), 0.0);
    if (static_cast<int64_t>(sum.size()) != c) {
      ok = false;
      return;
    }
    const float* p = t.data<float>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* q = p + (o * c + ch) * inner;
        double acc = 0;
        for (int64_t i = 0; i < inner; ++i)
          if (std::isfinite(q[i])) acc += q[i];
        sum[static_cast<size_t>(ch)] += acc;
      }
    count += static_cast<double>(outer * inner);
  }
  std::vector<double> mean() const {
    std::vector<double> m(sum.size(), 0.0);
    if (count > 0)
      for (size_t i = 0; i < m.size(); ++i) m[i] = sum[i] / count;
    return m;
  }
};

// Dequantized values of a DequantizeLinear(q s8, scale, [zero points]) on a constant, per tensor or along `axis`.
std::optional<std::vector<float>> dequantized_weight(const Graph& g, const Node& dq) {
  if (dq.inputs.size() < 2) return std::nullopt;
  auto q = g.initializers.find(dq.inputs[0]);
  auto sc = g.initializers.find(dq.inputs[1]);
  if (q == g.initializers.end() || sc == g.initializers.end() || q->second.dtype() != DType::kI8 ||
      sc->second.dtype() != DType::kF32)
    return std::nullopt;
  const Tensor& qt = q->second;
  const Tensor& st = sc->second;
  std::vector<int64_t> zp(static_cast<size_t>(st.numel()), 0);
  if (dq.inputs.size() > 2 && !dq.inputs[2].empty()) {
    auto z = g.initializers.find(dq.inputs[2]);
    if (z == g.initializers.end() || z->second.dtype() != DType::kI8 || z->second.numel() != st.numel())
      return std::nullopt;
    for (size_t i = 0; i < zp.size(); ++i) zp[i] = z->second.data<int8_t>()[i];
  }
  int64_t axis = dq.attr_int("axis", 1), len = 1, inner = 1;
  if (st.numel() != 1) {
    if (axis < 0) axis += qt.rank();
    if (axis < 0 || axis >= qt.rank() || qt.shape()[static_cast<size_t>(axis)] != st.numel()) return std::nullopt;
    len = st.numel();
    for (int64_t d = axis + 1; d < qt.rank(); ++d) inner *= qt.shape()[static_cast<size_t>(d)];
  }
  std::vector<float> w(static_cast<size_t>(qt.numel()));
  const int8_t* qp = qt.data<int8_t>();
  const float* sp = st.data<float>();
  for (size_t i = 0; i < w.size(); ++i) {
    const size_t c = static_cast<size_t>((static_cast<int64_t>(i) / inner) % len);
    w[i] = static_cast<float>((static_cast<int64_t>(qp[i]) - zp[c]) * static_cast<double>(sp[c]));
  }
  return w;
}

// Bias correction (Nagel et al., "Data-Free Quantization", section 4.2, with the input means measured on the
// calibration batches): rounding the weights shifts each output channel's mean by dW . E[x], the same at every
// position, and such shifts add up through a deep network. For each quantized Conv/Gemm/MatMul it subtracts
// dW . E[x] from the layer's f32 bias: Conv's input 2 (added when absent), Gemm's C (1-D over the outputs, beta 1),
// or the 1-D constant of the Add right after a MatMul. Returns the number of layers corrected; `notes` gets the ones
// it could not correct and why.
size_t correct_biases(Graph& q, const Graph& fp32, const std::vector<Layer>& layers, const std::set<std::string>& keep,
                      const std::map<std::string, ChannelMean>& means, std::vector<std::string>* notes) {
  std::map<std::string, NodeId> by_name;
  for (NodeId id : q.node_ids()) by_name[q.node(id)->name] = id;
  std::map<std::string, NodeId> fp_by_name;
  for (NodeId id : fp32.node_ids()) fp_by_name[fp32.node(id)->name] = id;
  size_t corrected = 0;
  for (const Layer& l : layers) {
    if (keep.count(l.node)) continue;
    auto skip = [&](const std::string& why) { notes->push_back("bias correction skipped for " + l.node + ": " + why); };
    auto m = means.find(l.input);
    auto qi = by_name.find(l.node);
    auto fi = fp_by_name.find(l.node);
    if (m == means.end() || !m->second.ok || m->second.count <= 0 || qi == by_name.end() || fi == fp_by_name.end())
      continue;  // not quantized (no range) or no statistics: nothing to correct
    Node* n = q.node(qi->second);
    const Node* fn = fp32.node(fi->second);
    if (n->inputs.size() < 2 || fn->inputs.size() < 2) continue;
    auto dq = q.producer(n->inputs[1]);
    auto w = fp32.initializers.find(fn->inputs[1]);
    if (!dq || q.node(*dq)->op_type != "DequantizeLinear" || w == fp32.initializers.end()) continue;
    auto wq = dequantized_weight(q, *q.node(*dq));
    const Tensor& wt = w->second;
    if (!wq || static_cast<int64_t>(wq->size()) != wt.numel()) continue;
    const std::vector<double> mu = m->second.mean();
    const float* wf = wt.data<float>();
    const Shape& wd = wt.shape();
    std::vector<double> shift;
    if (n->op_type == "Conv") {
      if (wd.size() < 3) continue;
      const int64_t out = wd[0], cin_g = wd[1], groups = n->attr_int("group", 1);
      int64_t k = 1;
      for (size_t d = 2; d < wd.size(); ++d) k *= wd[d];
      if (groups <= 0 || out % groups != 0 || static_cast<int64_t>(mu.size()) != cin_g * groups) {
        skip("channel counts do not match");
        continue;
      }
      shift.assign(static_cast<size_t>(out), 0.0);
      for (int64_t o = 0; o < out; ++o) {
        const int64_t g0 = (o / (out / groups)) * cin_g;
        double acc = 0;
        for (int64_t i = 0; i < cin_g; ++i)
          for (int64_t j = 0; j < k; ++j) {
            const size_t at = static_cast<size_t>((o * cin_g + i) * k + j);
            acc += (static_cast<double>((*wq)[at]) - wf[at]) * mu[static_cast<size_t>(g0 + i)];
          }
        shift[static_cast<size_t>(o)] = acc;
      }
    } else {
      if (wd.size() != 2) continue;
      const bool trans_b = n->op_type == "Gemm" && n->attr_int("transB", 0) != 0;
      const int64_t kdim = trans_b ? wd[1] : wd[0], out = trans_b ? wd[0] : wd[1];
      if (static_cast<int64_t>(mu.size()) != kdim) {
        skip("feature counts do not match");
        continue;
      }
      shift.assign(static_cast<size_t>(out), 0.0);
      for (int64_t kk = 0; kk < kdim; ++kk)
        for (int64_t o = 0; o < out; ++o) {
          const size_t at = static_cast<size_t>(trans_b ? o * kdim + kk : kk * out + o);
          shift[static_cast<size_t>(o)] += (static_cast<double>((*wq)[at]) - wf[at]) * mu[static_cast<size_t>(kk)];
        }
    }
    // Where the bias lives.
    Node* holder = n;
    size_t slot = 2;
    if (n->op_type == "Gemm") {
      if (n->attr_float("alpha", 1.f) != 1.f || n->attr_float("beta", 1.f) != 1.f) {
        skip("Gemm with alpha/beta != 1");
        continue;
      }
    } else if (n->op_type == "MatMul") {
      auto cs = q.consumers(n->outputs[0]);
      if (cs.size() != 1 || q.is_graph_output(n->outputs[0]) || q.node(cs[0])->op_type != "Add" ||
          q.node(cs[0])->inputs.size() != 2) {
        skip("no constant bias Add after the MatMul");
        continue;
      }
      holder = q.node(cs[0]);
      slot = holder->inputs[0] == n->outputs[0] ? 1 : 0;
    }
    std::vector<float> bias(shift.size(), 0.f);
    if (holder->inputs.size() > slot && !holder->inputs[slot].empty()) {
      auto b = q.initializers.find(holder->inputs[slot]);
      if (b == q.initializers.end() || b->second.dtype() != DType::kF32 ||
          b->second.numel() != static_cast<int64_t>(shift.size()) ||
          (n->op_type == "MatMul" && b->second.rank() != 1)) {
        skip("the bias is not a 1-D f32 constant over the outputs");
        continue;
      }
      std::copy(b->second.data<float>(), b->second.data<float>() + bias.size(), bias.begin());
    } else if (n->op_type == "MatMul") {
      continue;
    }
    for (size_t o = 0; o < bias.size(); ++o) bias[o] = static_cast<float>(bias[o] - shift[o]);
    const std::string name = q.unique_name(l.node + "_bias_corrected");
    q.initializers[name] = Tensor::f32({static_cast<int64_t>(bias.size())}, bias);
    q.value_info[name] = ValueInfo(DType::kF32, Shape{static_cast<int64_t>(bias.size())});
    const std::string old = holder->inputs.size() > slot ? holder->inputs[slot] : "";
    if (holder->inputs.size() <= slot) holder->inputs.resize(slot + 1);
    holder->inputs[slot] = name;
    if (!old.empty() && q.consumers(old).empty() && !q.is_graph_output(old)) {
      q.initializers.erase(old);
      q.value_info.erase(old);
    }
    ++corrected;
  }
  return corrected;
}

Status run_pipeline(Environment& env, Graph& g, const std::vector<PassSpec>& specs, const std::string& device,
                    std::vector<PassReport>* reports = nullptr) {
  keel_graph_s view;
  view.graph = &g;
  view.env = &env;
  auto r = PassManager(env.registry(), graph_api()).run(g, &view, specs, device);
  if (!r.is_ok()) return r.status();
  if (reports) *reports = std::move(r).value();
  return Status::ok();
}

// Sums that give cosine and relative L2 error over several tensors.
struct ErrorAcc {
  double dot = 0, ff = 0, qq = 0, dd = 0;
  void add(const Tensor& f, const Tensor& q) {
    if (f.dtype() != DType::kF32 || q.dtype() != DType::kF32 || f.numel() != q.numel()) return;
    const float* a = f.data<float>();
    const float* b = q.data<float>();
    for (int64_t i = 0; i < f.numel(); ++i) {
      double x = a[i], y = b[i];
      dot += x * y, ff += x * x, qq += y * y, dd += (x - y) * (x - y);
    }
  }
  double cosine() const { return ff == 0 && qq == 0 ? 1.0 : dot / std::sqrt(ff * qq + 1e-300); }
  double rel_error() const { return ff == 0 ? (dd == 0 ? 0.0 : 1.0) : std::sqrt(dd / ff); }
};

StatusOr<std::unique_ptr<Session>> make_session(Environment& env, Graph g, const std::string& device,
                                                std::vector<std::string> passes = {}) {
  SessionOptions o;
  o.devices = {device};
  o.passes = std::move(passes);
  return Session::create(env, std::move(g), o);
}

bool is_float_output(const Graph& g, const std::string& v) {
  const ValueInfo* vi = g.info(v);
  return vi == nullptr || vi->dtype == DType::kF32 || vi->dtype == DType::kUndefined;
}

// ---- GPTQ weight rounding (gptq.h) ----

// How layer `n` (fp32 graph) reads its input, or an empty optional with the reason.
std::optional<LayerGeometry> layer_geometry(const Node& n, const Tensor& w, bool trans_a, std::string* why) {
  LayerGeometry g;
  const Shape& ws = w.shape();
  if (n.op_type == "Conv") {
    if (ws.size() != 4) return *why = "not a 2-D convolution", std::nullopt;
    const std::string pad = n.attr("auto_pad") ? n.attr("auto_pad")->s : "NOTSET";
    if (pad != "NOTSET" && pad != "VALID") return *why = "auto_pad " + pad, std::nullopt;
    auto ints = [&](const char* a, size_t k, int64_t dflt) {
      std::vector<int64_t> v(k, dflt);
      if (const Attribute* at = n.attr(a); at && at->ints.size() == k) v = at->ints;
      return v;
    };
    const auto st = ints("strides", 2, 1), di = ints("dilations", 2, 1), pads = ints("pads", 4, 0);
    g.conv = true;
    g.groups = n.attr_int("group", 1);
    if (g.groups <= 0 || ws[0] % g.groups != 0) return *why = "bad group count", std::nullopt;
    g.rows = ws[0] / g.groups;
    g.cin_g = ws[1], g.kh = ws[2], g.kw = ws[3];
    g.cols = g.cin_g * g.kh * g.kw;
    g.stride_h = st[0], g.stride_w = st[1], g.dil_h = di[0], g.dil_w = di[1];
    if (pad == "NOTSET") g.pad_top = pads[0], g.pad_left = pads[1], g.pad_bottom = pads[2], g.pad_right = pads[3];
    return g;
  }
  if (ws.size() != 2) return *why = "a weight of rank " + std::to_string(ws.size()), std::nullopt;
  if (trans_a) return *why = "Gemm with transA", std::nullopt;
  const bool trans_b = n.op_type == "Gemm" && n.attr_int("transB", 0) != 0;
  g.cols = trans_b ? ws[1] : ws[0];
  g.rows = trans_b ? ws[0] : ws[1];
  g.weight_k_major = !trans_b;
  return g;
}

// The int8 values GPTQ chose for each layer's weight tensor (in the tensor's own layout), by node name.
using GptqWeights = std::map<std::string, std::vector<int8_t>>;

// Replaces, in the QDQ graph q, the s8 weight of every layer in `weights` (and not in `keep`) with GPTQ's values,
// keeping its scales. A layer whose weight the pass did not quantize the expected way is left alone.
void apply_gptq(Graph& q, const GptqWeights& weights, const std::set<std::string>& keep) {
  for (NodeId id : q.node_ids()) {
    Node* n = q.node(id);
    auto it = weights.find(n->name);
    if (it == weights.end() || keep.count(n->name) || n->inputs.size() < 2) continue;
    auto dq = q.producer(n->inputs[1]);
    if (!dq || q.node(*dq)->op_type != "DequantizeLinear") continue;
    Node* d = q.node(*dq);
    auto w = q.initializers.find(d->inputs[0]);
    if (w == q.initializers.end() || w->second.dtype() != DType::kI8 ||
        w->second.numel() != static_cast<int64_t>(it->second.size()))
      continue;
    const Shape shape = w->second.shape();
    const std::string name = q.unique_name(n->name + "_weight_gptq");
    q.initializers[name] = Tensor::from_vector(DType::kI8, shape, it->second);
    q.value_info[name] = ValueInfo(DType::kI8, shape);
    const std::string old = d->inputs[0];
    d->inputs[0] = name;
    if (q.consumers(old).empty() && !q.is_graph_output(old)) {
      q.initializers.erase(old);
      q.value_info.erase(old);
    }
  }
}

// The per-row scales of a layer's s8 weight in the QDQ graph `probe` (rows = output channels), or empty.
std::vector<float> row_scales(const Graph& probe, const std::string& node_name, const LayerGeometry& g) {
  for (NodeId id : probe.node_ids()) {
    const Node* n = probe.node(id);
    if (n->name != node_name || n->inputs.size() < 2) continue;
    auto dq = probe.producer(n->inputs[1]);
    if (!dq || probe.node(*dq)->op_type != "DequantizeLinear") return {};
    const Node* d = probe.node(*dq);
    if (d->inputs.size() < 2) return {};
    if (d->inputs.size() > 2 && !d->inputs[2].empty()) {  // symmetric weights only: zero points all 0
      auto z = probe.initializers.find(d->inputs[2]);
      if (z == probe.initializers.end() || z->second.dtype() != DType::kI8) return {};
      for (int64_t i = 0; i < z->second.numel(); ++i)
        if (z->second.data<int8_t>()[i] != 0) return {};
    }
    auto q = probe.initializers.find(d->inputs[0]);
    auto sc = probe.initializers.find(d->inputs[1]);
    if (q == probe.initializers.end() || sc == probe.initializers.end() || sc->second.dtype() != DType::kF32) return {};
    const int64_t total_rows = g.rows * g.groups;
    std::vector<float> out(static_cast<size_t>(total_rows));
    const float* sp = sc->second.data<float>();
    if (sc->second.numel() == 1) {
      std::fill(out.begin(), out.end(), sp[0]);
      return out;
    }
    int64_t axis = d->attr_int("axis", 1);
    if (axis < 0) axis += q->second.rank();
    const int64_t out_axis = g.conv || !g.weight_k_major ? 0 : 1;
    if (axis != out_axis || sc->second.numel() != total_rows) return {};
    std::copy(sp, sp + total_rows, out.begin());
    return out;
  }
  return {};
}

}  // namespace

StatusOr<QuantizeResult> quantize_graph(Environment& env, const Graph& fp32, const std::vector<Feeds>& calibration,
                                        const QuantizeOptions& options) {
  if (options.method != "minmax" && options.method != "percentile" && options.method != "entropy" &&
      options.method != "mse")
    return invalid_argument("unknown calibration method '" + options.method + "' (minmax, percentile, entropy, mse)");
  if (options.method == "percentile" && !(options.percentile > 50 && options.percentile <= 100))
    return invalid_argument("percentile must be in (50, 100], got " + std::to_string(options.percentile));
  if (options.activation_type != "u8" && options.activation_type != "s8")
    return invalid_argument("activation type must be u8 or s8, got '" + options.activation_type + "'");
  if (!(options.tolerance >= 0)) return invalid_argument("tolerance must be >= 0");
  if (options.fallback != "sensitivity" && options.fallback != "prefix")
    return invalid_argument("unknown fallback '" + options.fallback + "' (sensitivity, prefix)");
  if (options.fallback_precision != "fp32" && options.fallback_precision != "bf16")
    return invalid_argument("unknown fallback precision '" + options.fallback_precision + "' (fp32, bf16)");
  if (options.weight_rounding != "nearest" && options.weight_rounding != "gptq")
    return invalid_argument("unknown weight rounding '" + options.weight_rounding + "' (nearest, gptq)");
  if (calibration.empty()) return invalid_argument("no calibration batches");
  const Registry& reg = env.registry();
  if (!reg.pass("quantize_int8"))
    return failed_precondition("the quantize_int8 pass plugin is not installed (see `keel plugins`)");
  // How the quantized model is evaluated (the output error): as is, or as `--precision bf16` runs it.
  std::vector<std::string> eval_passes;
  if (options.fallback_precision == "bf16") {
    for (const char* pass : {"fuse_qdq", "convert_bf16"})
      if (!reg.pass(pass))
        return failed_precondition(std::string("fallback precision bf16 needs the ") + pass +
                                   " pass, which is not installed (see `keel plugins`)");
    eval_passes = {"fuse_qdq", "convert_bf16"};
  }

  QuantizeResult result;
  // 1. Prepare.
  Graph prepared = fp32;
  KEEL_RETURN_IF_ERROR(infer_shapes(prepared), "shape inference");
  {
    std::vector<PassSpec> specs;
    for (const char* p :
         {"fold_constants", "remove_identity", "eliminate_dead_code", "fuse_conv_bn", "eliminate_dead_code"})
      if (reg.pass(p)) specs.push_back(PassSpec{p, {}});
      else result.notes.push_back(std::string("pass ") + p + " not installed: skipped");
    KEEL_RETURN_IF_ERROR(run_pipeline(env, prepared, specs, options.device), "preparing the fp32 graph");
    KEEL_RETURN_IF_ERROR(infer_shapes(prepared), "shape inference after preparation");
  }
  // Quantizable layers: Conv/MatMul/Gemm reading an f32 activation at input 0 and an f32 constant at input 1.
  std::set<std::string> exclude(options.exclude.begin(), options.exclude.end());
  std::set<std::string> node_names;
  for (NodeId id : prepared.node_ids()) node_names.insert(prepared.node(id)->name);
  std::vector<Layer> layers;
  KEEL_ASSIGN_OR_RETURN(auto order, prepared.topological_order(), "quantize");
  for (NodeId id : order) {
    Node* n = prepared.node(id);
    if (!n->domain.empty() || (n->op_type != "Conv" && n->op_type != "MatMul" && n->op_type != "Gemm")) continue;
    if (n->inputs.size() < 2 || n->outputs.empty()) continue;
    const std::string& x = n->inputs[0];
    auto w = prepared.initializers.find(n->inputs[1]);
    if (prepared.is_initializer(x) || w == prepared.initializers.end() || w->second.dtype() != DType::kF32) continue;
    const ValueInfo* xi = prepared.info(x);
    if (xi && xi->dtype != DType::kF32) continue;
    if (n->name.empty()) {
      std::string name = n->op_type + "_" + std::to_string(id);
      while (node_names.count(name)) name += "_";
      n->name = name;
      node_names.insert(name);
    }
    Layer l{n->name, n->op_type, x, n->outputs[0], exclude.count(n->name) != 0, n->attr_int("transA", 0) != 0};
    exclude.erase(n->name);
    layers.push_back(l);
  }
  for (const auto& e : exclude) result.notes.push_back("--exclude names no quantizable node: " + e);
  if (layers.empty()) return invalid_argument("the model has no quantizable Conv/MatMul/Gemm (f32 constant weight)");

  // Batches: the last fifth held out for evaluation (at least one); with one batch, it serves both.
  const size_t nb = calibration.size();
  const size_t held = nb >= 2 ? std::max<size_t>(1, nb / 5) : 1;
  const size_t ncal = nb >= 2 ? nb - held : 1;
  std::vector<const Feeds*> cal, eval;
  for (size_t i = 0; i < ncal; ++i) cal.push_back(&calibration[i]);
  for (size_t i = nb - held; i < nb; ++i) eval.push_back(&calibration[i]);
  if (nb < 2) result.notes.push_back("one calibration batch: the error report uses the calibration batch itself");
  result.heldout_batches = eval.size();

  // 2. Calibrate.
  std::vector<std::string> acts;
  for (const Layer& l : layers)
    if (!l.user_excluded && std::find(acts.begin(), acts.end(), l.input) == acts.end()) acts.push_back(l.input);
  std::map<std::string, std::string> ranges;
  std::map<std::string, std::array<double, 4>> range_info;  // activation -> chosen lo, hi; observed min, max
  std::map<std::string, ChannelMean> means;                 // per-channel input means, for bias correction
  if (!acts.empty()) {
    Graph cg = prepared;
    const size_t base = cg.outputs.size();
    for (const auto& a : acts) cg.outputs.push_back(a);
    KEEL_ASSIGN_OR_RETURN(auto session, make_session(env, std::move(cg), options.device), "calibration session");
    const bool hist = options.method != "minmax";
    ProgressBar bar("calibrating (" + options.method + ")", static_cast<int64_t>(cal.size() * (hist ? 2 : 1)), "batch",
                    options.progress);
    std::vector<double> mn(acts.size(), std::numeric_limits<double>::infinity()),
        mx(acts.size(), -std::numeric_limits<double>::infinity());
    std::vector<double> zeros(acts.size(), 0.0);  // exact zeros seen (mse: they quantize without error)
    auto run_batch = [&](const Feeds& f) -> StatusOr<std::vector<Tensor>> {
      KEEL_ASSIGN_OR_RETURN(auto out, session->run(f), "calibration run");
      for (size_t a = 0; a < acts.size(); ++a)
        if (out[base + a].dtype() != DType::kF32)
          return invalid_argument("activation '" + acts[a] + "' is not f32 at run time");
      return out;
    };
    for (const Feeds* f : cal) {
      KEEL_ASSIGN_OR_RETURN(auto out, run_batch(*f), "calibration");
      for (size_t a = 0; a < acts.size(); ++a) {
        const Tensor& t = out[base + a];
        if (options.bias_correction) {
          ChannelMean& cm = means[acts[a]];
          if (cm.sum.empty() && cm.ok) {
            // The axis the readers contract over; readers that disagree leave the activation uncorrected.
            for (const Layer& l : layers) {
              if (l.input != acts[a] || l.user_excluded) continue;
              const int64_t ax = channel_axis(l.op_type, l.trans_a, t.rank());
              if (cm.axis == -1) cm.axis = ax;
              if (ax != cm.axis || ax < 0) cm.ok = false;
            }
          }
          cm.add(t);
        }
        const float* p = t.data<float>();
        for (int64_t i = 0; i < t.numel(); ++i) {
          if (!std::isfinite(p[i])) continue;
          zeros[a] += p[i] == 0.f;
          mn[a] = std::min<double>(mn[a], p[i]);
          mx[a] = std::max<double>(mx[a], p[i]);
        }
      }
      bar.tick(1);
    }
    for (size_t a = 0; a < acts.size(); ++a)
      if (!(mn[a] <= mx[a])) mn[a] = mx[a] = 0;  // no finite value seen
    std::vector<double> lo = mn, hi = mx;
    if (hist) {
      const bool entropy = options.method == "entropy";
      std::vector<Histogram> h(acts.size());
      for (size_t a = 0; a < acts.size(); ++a) {
        if (entropy) h[a].init(0, std::max(std::fabs(mn[a]), std::fabs(mx[a])), 2048);
        else h[a].init(mn[a], mx[a], 2048);
      }
      for (const Feeds* f : cal) {
        KEEL_ASSIGN_OR_RETURN(auto out, run_batch(*f), "calibration (histograms)");
        for (size_t a = 0; a < acts.size(); ++a) {
          const Tensor& t = out[base + a];
          h[a].add(t.data<float>(), static_cast<size_t>(t.numel()), entropy);
        }
        bar.tick(1);
      }
      for (size_t a = 0; a < acts.size(); ++a) {
        if (entropy) {
          const bool nonneg = mn[a] >= 0;
          const int levels = options.activation_type == "u8" && nonneg ? 255 : 128;
          double t = entropy_threshold(h[a], levels, zeros[a]);
          lo[a] = nonneg ? 0.0 : std::max(mn[a], -t);
          hi[a] = std::min(mx[a], t);
        } else if (options.method == "mse") {
          auto r = mse_range(h[a], zeros[a], options.activation_type == "s8");
          lo[a] = r.first;
          hi[a] = r.second;
        } else {
          auto r = percentile_range(h[a], options.percentile);
          lo[a] = r.first;
          hi[a] = r.second;
        }
      }
    }
    for (size_t a = 0; a < acts.size(); ++a) {
      std::ostringstream os;
      os.precision(9);
      os << lo[a] << "," << hi[a];
      ranges[acts[a]] = os.str();
      range_info[acts[a]] = {lo[a], hi[a], mn[a], mx[a]};
    }
    bar.finish(std::to_string(acts.size()) + " activations");
  }

  auto quantize_pass = [&](const std::set<std::string>& keep) -> StatusOr<Graph> {
    Graph g = prepared;
    PassSpec spec{"quantize_int8", {}};
    for (const auto& [v, r] : ranges) spec.options.values["range." + v] = r;
    spec.options.values["exclude"] = std::vector<std::string>(keep.begin(), keep.end());
    spec.options.values["calibration"] = options.method;
    spec.options.values["activation_type"] = options.activation_type;
    spec.options.values["per_channel"] = options.per_channel;
    KEEL_RETURN_IF_ERROR(run_pipeline(env, g, {spec}, options.device), "quantize_int8");
    return g;
  };

  // 3b. GPTQ: each layer's input Hessian over the calibration batches, then its weight rounded against it. The
  // Hessians of several layers are collected in one pass over the batches, as many as fit in the memory budget.
  GptqWeights gptq;
  if (options.weight_rounding == "gptq" && !acts.empty()) {
    std::set<std::string> user_keep;
    for (const Layer& l : layers)
      if (l.user_excluded) user_keep.insert(l.node);
    KEEL_ASSIGN_OR_RETURN(Graph probe, quantize_pass(user_keep), "quantize");
    struct Job {
      const Layer* layer;
      LayerGeometry geo;
      std::vector<float> scales;
      const Tensor* weight;
    };
    std::vector<Job> jobs;
    std::map<std::string, NodeId> fp_by_name;
    for (NodeId id : prepared.node_ids()) fp_by_name[prepared.node(id)->name] = id;
    for (const Layer& l : layers) {
      if (l.user_excluded) continue;
      const Node* n = prepared.node(fp_by_name.at(l.node));
      const Tensor& w = prepared.initializers.at(n->inputs[1]);
      std::string why;
      auto geo = layer_geometry(*n, w, l.trans_a, &why);
      if (geo && geo->cols > options.gptq_max_columns)
        why = std::to_string(geo->cols) + " columns (over " + std::to_string(options.gptq_max_columns) + ")";
      std::vector<float> sc = geo && why.empty() ? row_scales(probe, l.node, *geo) : std::vector<float>{};
      if (why.empty() && sc.empty()) why = "its weight is not quantized per output channel or per tensor";
      if (!why.empty()) {
        result.notes.push_back("gptq: " + l.node + " keeps nearest rounding: " + why);
        continue;
      }
      jobs.push_back({&l, *geo, std::move(sc), &w});
    }
    Graph hg = prepared;
    const size_t base = hg.outputs.size();
    for (const auto& a : acts) hg.outputs.push_back(a);
    KEEL_ASSIGN_OR_RETURN(auto session, make_session(env, std::move(hg), options.device), "GPTQ session");
    constexpr size_t kBudget = size_t{512} << 20;  // bytes of Hessians held at once
    ProgressBar bar("gptq", static_cast<int64_t>(jobs.size()), "layer", options.progress);
    std::vector<double> gains;
    for (size_t first = 0; first < jobs.size();) {
      size_t last = first, bytes = 0;
      while (last < jobs.size()) {
        const auto& g = jobs[last].geo;
        const size_t b = static_cast<size_t>(g.groups * g.cols * g.cols) * sizeof(float);
        if (last > first && bytes + b > kBudget) break;
        bytes += b;
        ++last;
      }
      std::vector<HessianAccumulator> acc;
      for (size_t j = first; j < last; ++j)
        acc.emplace_back(jobs[j].geo, static_cast<int64_t>(cal.size()), options.gptq_max_patches);
      for (const Feeds* f : cal) {
        KEEL_ASSIGN_OR_RETURN(auto out, session->run(*f), "GPTQ calibration run");
        for (size_t j = first; j < last; ++j) {
          const size_t a =
              static_cast<size_t>(std::find(acts.begin(), acts.end(), jobs[j].layer->input) - acts.begin());
          KEEL_RETURN_IF_ERROR(acc[j - first].add(out[base + a]), "GPTQ: the input of " + jobs[j].layer->node);
        }
      }
      for (size_t j = first; j < last; ++j) {
        const Job& job = jobs[j];
        const LayerGeometry& g = job.geo;
        const float* wp = job.weight->data<float>();
        const int64_t total_rows = g.rows * g.groups;
        std::vector<int8_t> q(static_cast<size_t>(job.weight->numel()));
        double err_nearest = 0, err_gptq = 0;
        for (int64_t gr = 0; gr < g.groups; ++gr) {
          // The group's rows, row-major (a [K, N] weight is read column by column).
          std::vector<float> w(static_cast<size_t>(g.rows * g.cols)), sc(static_cast<size_t>(g.rows));
          for (int64_t r = 0; r < g.rows; ++r) {
            const int64_t o = gr * g.rows + r;
            sc[static_cast<size_t>(r)] = job.scales[static_cast<size_t>(o)];
            for (int64_t c = 0; c < g.cols; ++c)
              w[static_cast<size_t>(r * g.cols + c)] = g.weight_k_major ? wp[c * total_rows + o] : wp[o * g.cols + c];
          }
          std::vector<double> h = acc[j - first].hessian(gr);
          std::vector<int8_t> qg = gptq_round(w, g.rows, g.cols, sc, h);
          const std::vector<int8_t> qn = nearest_round(w, g.rows, g.cols, sc);
          err_nearest += output_error(w, qn, g.rows, g.cols, sc, h);
          err_gptq += output_error(w, qg, g.rows, g.cols, sc, h);
          for (int64_t r = 0; r < g.rows; ++r) {
            const int64_t o = gr * g.rows + r;
            for (int64_t c = 0; c < g.cols; ++c)
              q[static_cast<size_t>(g.weight_k_major ? c * total_rows + o : o * g.cols + c)] =
                  qg[static_cast<size_t>(r * g.cols + c)];
          }
        }
        // Keep GPTQ's rounding only where it lowers the layer's output error on the calibration patches.
        if (err_gptq < err_nearest) {
          gptq[job.layer->node] = std::move(q);
          gains.push_back(err_nearest > 0 ? err_gptq / err_nearest : 1.0);
        }
        bar.tick(1);
      }
      first = last;
    }
    std::sort(gains.begin(), gains.end());
    std::ostringstream os;
    os.precision(3);
    os << "gptq: " << gptq.size() << " of " << jobs.size() << " layers rounded against their input Hessian";
    if (!gains.empty())
      os << "; their weight-rounding output error (calibration patches) is " << gains[gains.size() / 2]
         << "x nearest rounding's (median; best " << gains.front() << "x, worst " << gains.back() << "x)";
    bar.finish(std::to_string(gptq.size()) + " layers");
    result.notes.push_back(os.str());
  }

  bool bias_notes_done = false;
  auto quantize_with = [&](const std::set<std::string>& keep) -> StatusOr<Graph> {
    KEEL_ASSIGN_OR_RETURN(Graph g, quantize_pass(keep), "quantize");
    if (!gptq.empty()) apply_gptq(g, gptq, keep);
    if (options.bias_correction) {
      std::vector<std::string> notes;
      correct_biases(g, prepared, layers, keep, means, &notes);
      if (!bias_notes_done) result.notes.insert(result.notes.end(), notes.begin(), notes.end());
      bias_notes_done = true;
    }
    return g;
  };

  // 4. Evaluate: fp32 reference values for the held-out batches.
  std::vector<std::string> outs;
  for (const auto& o : prepared.outputs)
    if (is_float_output(prepared, o)) outs.push_back(o);
  std::vector<std::unordered_map<std::string, Tensor>> ref(eval.size());
  {
    Graph eg = prepared;
    std::vector<std::string> extra;
    for (const Layer& l : layers)
      for (const std::string& v : {l.input, l.output})
        if (std::find(eg.outputs.begin(), eg.outputs.end(), v) == eg.outputs.end() &&
            std::find(extra.begin(), extra.end(), v) == extra.end())
          extra.push_back(v);
    for (const auto& v : extra) eg.outputs.push_back(v);
    std::vector<std::string> names = eg.outputs;
    KEEL_ASSIGN_OR_RETURN(auto session, make_session(env, std::move(eg), options.device), "fp32 evaluation session");
    for (size_t b = 0; b < eval.size(); ++b) {
      KEEL_ASSIGN_OR_RETURN(auto out, session->run(*eval[b]), "fp32 evaluation");
      for (size_t i = 0; i < names.size(); ++i) ref[b][names[i]] = out[i];
    }
  }
  std::set<std::string> keep;
  for (const Layer& l : layers)
    if (l.user_excluded) keep.insert(l.node);
  KEEL_ASSIGN_OR_RETURN(Graph qdq, quantize_with(keep), "quantize");
  // Each layer's own error: its QDQ form fed with the fp32 activation.
  result.layers.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const Layer& l = layers[i];
    LayerReport& r = result.layers[i];
    r.node = l.node;
    r.op_type = l.op_type;
    if (auto ri = range_info.find(l.input); ri != range_info.end()) {
      r.range_lo = ri->second[0];
      r.range_hi = ri->second[1];
      r.observed_lo = ri->second[2];
      r.observed_hi = ri->second[3];
    }
    r.kept_fp32 = l.user_excluded;
    if (l.user_excluded) continue;
    ErrorAcc acc;
    std::unique_ptr<Session> s;
    for (size_t b = 0; b < eval.size(); ++b) {
      Feeds f = {{l.input, ref[b].at(l.input)}};
      if (!s) {
        KEEL_ASSIGN_OR_RETURN(Graph sub, extract_subgraph(qdq, f, {l.output}), "layer " + l.node);
        KEEL_ASSIGN_OR_RETURN(s, make_session(env, std::move(sub), options.device), "layer " + l.node);
      }
      KEEL_ASSIGN_OR_RETURN(auto out, s->run(f), "layer " + l.node);
      acc.add(ref[b].at(l.output), out[0]);
    }
    r.cosine = acc.cosine();
    r.rel_error = acc.rel_error();
  }
  auto output_error = [&](const Graph& g, double* cosine, double* rel) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto s, make_session(env, g, options.device, eval_passes), "quantized evaluation session");
    std::vector<ErrorAcc> acc(g.outputs.size());
    for (size_t b = 0; b < eval.size(); ++b) {
      KEEL_ASSIGN_OR_RETURN(auto out, s->run(*eval[b]), "quantized evaluation");
      for (size_t i = 0; i < g.outputs.size(); ++i)
        if (std::find(outs.begin(), outs.end(), g.outputs[i]) != outs.end())
          acc[i].add(ref[b].at(g.outputs[i]), out[i]);
    }
    *cosine = 1;
    *rel = 0;
    for (size_t i = 0; i < g.outputs.size(); ++i) {
      if (std::find(outs.begin(), outs.end(), g.outputs[i]) == outs.end()) continue;
      *cosine = std::min(*cosine, acc[i].cosine());
      *rel = std::max(*rel, acc[i].rel_error());
    }
    return Status::ok();
  };
  KEEL_RETURN_IF_ERROR(output_error(qdq, &result.output_cosine, &result.output_rel_error), "output error");
  // 5. Tolerance: keep the worst layers in fp32 until the output error is within it.
  if (options.tolerance > 0 && result.output_rel_error > options.tolerance && options.fallback == "prefix") {
    // The fewest leading layers in fp32: bisection over the prefix length k (error(n) is all-fp32).
    std::vector<size_t> cand;
    for (size_t i = 0; i < layers.size(); ++i)
      if (!layers[i].user_excluded) cand.push_back(i);
    ProgressBar bar("prefix search", static_cast<int64_t>(std::bit_width(cand.size()) + 3), "try", options.progress);
    std::map<size_t, std::pair<double, double>> tried;  // k -> (cosine, rel. error)
    auto error_at = [&](size_t k) -> StatusOr<std::pair<double, double>> {
      auto it = tried.find(k);
      if (it != tried.end()) return it->second;
      std::set<std::string> kk = keep;
      for (size_t j = 0; j < k; ++j) kk.insert(layers[cand[j]].node);
      KEEL_ASSIGN_OR_RETURN(Graph g, quantize_with(kk), "quantize");
      std::pair<double, double> e{1, 0};
      KEEL_RETURN_IF_ERROR(output_error(g, &e.first, &e.second), "output error");
      std::ostringstream msg;
      msg << k << " fp32: error " << e.second;
      bar.tick(1, msg.str());
      return tried[k] = e;
    };
    size_t lo = 0, hi = cand.size();  // error(lo) > tolerance (measured above); error(hi) is taken as within it
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      KEEL_ASSIGN_OR_RETURN(auto e, error_at(mid), "prefix search");
      (e.second <= options.tolerance ? hi : lo) = mid;
    }
    // The boundary: layer k's input is the value quantized where the fp32 prefix ends. Up to two layers further, a
    // smaller one (a bottleneck between blocks rather than an expanded activation) makes the boundary cheaper.
    auto boundary = [&](size_t k) -> int64_t {
      if (k >= cand.size()) return 0;
      const ValueInfo* vi = prepared.info(layers[cand[k]].input);
      if (!vi || !vi->shape) return std::numeric_limits<int64_t>::max();
      int64_t n = 1;
      for (int64_t d : *vi->shape) {
        if (d < 0) return std::numeric_limits<int64_t>::max();
        n *= d;
      }
      return n;
    };
    size_t best = hi;
    for (size_t k = hi + 1; k <= std::min(cand.size(), hi + 2); ++k)
      if (boundary(k) < boundary(best)) best = k;
    if (best != hi) {
      KEEL_ASSIGN_OR_RETURN(auto e, error_at(best), "prefix search");
      if (e.second > options.tolerance) best = hi;
    }
    for (size_t j = 0; j < best; ++j) {
      keep.insert(layers[cand[j]].node);
      result.layers[cand[j]].kept_fp32 = true;
    }
    KEEL_ASSIGN_OR_RETURN(qdq, quantize_with(keep), "quantize");
    KEEL_RETURN_IF_ERROR(output_error(qdq, &result.output_cosine, &result.output_rel_error), "output error");
    bar.finish(std::to_string(best) + " leading layer(s) in fp32");
    if (result.output_rel_error > options.tolerance)
      result.notes.push_back("tolerance not reached even with every layer in fp32");
  } else if (options.tolerance > 0 && result.output_rel_error > options.tolerance) {
    std::vector<size_t> by_error;
    std::set<std::string> all = keep;
    for (size_t i = 0; i < layers.size(); ++i)
      if (!layers[i].user_excluded) {
        by_error.push_back(i);
        all.insert(layers[i].node);
      }
    {
      ProgressBar sb("layer sensitivity", static_cast<int64_t>(by_error.size()), "layer", options.progress);
      for (size_t i : by_error) {
        std::set<std::string> others = all;
        others.erase(layers[i].node);
        KEEL_ASSIGN_OR_RETURN(Graph one, quantize_with(others), "quantize");
        double cos_i = 1;
        KEEL_RETURN_IF_ERROR(output_error(one, &cos_i, &result.layers[i].sensitivity), "sensitivity");
        sb.tick(1);
      }
    }
    std::stable_sort(by_error.begin(), by_error.end(),
                     [&](size_t a, size_t b) { return result.layers[a].sensitivity > result.layers[b].sensitivity; });
    ProgressBar bar("tolerance search", static_cast<int64_t>(by_error.size()), "layer", options.progress);
    for (size_t i : by_error) {
      keep.insert(layers[i].node);
      result.layers[i].kept_fp32 = true;
      KEEL_ASSIGN_OR_RETURN(qdq, quantize_with(keep), "quantize");
      KEEL_RETURN_IF_ERROR(output_error(qdq, &result.output_cosine, &result.output_rel_error), "output error");
      std::ostringstream msg;
      msg << "error " << result.output_rel_error;
      bar.tick(1, msg.str());
      if (result.output_rel_error <= options.tolerance) break;
    }
    bar.finish();
    if (result.output_rel_error > options.tolerance)
      result.notes.push_back("tolerance not reached even with every layer in fp32");
  }
  result.graph = std::move(qdq);
  return result;
}

}  // namespace keel::cli
