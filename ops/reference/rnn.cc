// Reference kernels: RNN, GRU, LSTM (forward / reverse / bidirectional, activation lists with alpha/beta, clip,
// sequence_lens, initial states, peepholes, GRU linear_before_reset, LSTM input_forget, layout 0 and 1).
#include "ops/reference/kernels.h"
#include "ops/reference/nn_common.h"

namespace keel::ops::ref {
namespace {

enum class Cell { kRnn, kGru, kLstm };

struct Act {
  std::string name;
  double alpha = 0, beta = 0;
  double operator()(double x) const {
    const std::string& n = name;
    if (n == "Sigmoid") return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
    if (n == "Tanh") return std::tanh(x);
    if (n == "Relu") return x > 0 ? x : 0;
    if (n == "Affine") return alpha * x + beta;
    if (n == "LeakyRelu") return x >= 0 ? x : alpha * x;
    if (n == "ThresholdedRelu") return x > alpha ? x : 0;
    if (n == "ScaledTanh") return alpha * std::tanh(beta * x);
    if (n == "HardSigmoid") return std::max(0.0, std::min(1.0, alpha * x + beta));
    if (n == "Elu") return x >= 0 ? x : alpha * (std::exp(x) - 1);
    if (n == "Softsign") return x / (1 + std::abs(x));
    if (n == "Softplus") return std::log1p(std::exp(x));
    return x;
  }
};

std::vector<Act> activations(const Kctx& k, Cell cell, int num_dir) {
  std::vector<std::string> def;
  if (cell == Cell::kRnn) def = {"Tanh"};
  else if (cell == Cell::kGru) def = {"Sigmoid", "Tanh"};
  else def = {"Sigmoid", "Tanh", "Tanh"};
  std::vector<std::string> names;
  if (auto a = k.attr_strings("activations")) names = *a;
  if (names.empty())
    for (int d = 0; d < num_dir; ++d) names.insert(names.end(), def.begin(), def.end());
  if (names.size() == def.size() && num_dir == 2) names.insert(names.end(), def.begin(), def.end());
  if (names.size() != def.size() * num_dir)
    k.invalid(cat("activations has ", names.size(), " entries; expected ", def.size() * num_dir));
  std::vector<float> alphas = k.attr_floats("activation_alpha").value_or(std::vector<float>());
  std::vector<float> betas = k.attr_floats("activation_beta").value_or(std::vector<float>());
  size_t ai = 0, bi = 0;
  std::vector<Act> r;
  static const char* kKnown[] = {"Sigmoid",    "Tanh",        "Relu", "Affine",   "LeakyRelu", "ThresholdedRelu",
                                 "ScaledTanh", "HardSigmoid", "Elu",  "Softsign", "Softplus"};
  for (auto& n0 : names) {
    Act a;
    // ONNX spells these in CamelCase; accept any case.
    for (const char* kn : kKnown) {
      std::string a1 = kn, b1 = n0;
      std::transform(a1.begin(), a1.end(), a1.begin(), ::tolower);
      std::transform(b1.begin(), b1.end(), b1.begin(), ::tolower);
      if (a1 == b1) a.name = kn;
    }
    if (a.name.empty()) k.invalid(cat("unknown activation '", n0, "'"));
    bool needs_alpha = a.name == "Affine" || a.name == "LeakyRelu" || a.name == "ThresholdedRelu" ||
                       a.name == "ScaledTanh" || a.name == "HardSigmoid" || a.name == "Elu";
    bool needs_beta = a.name == "Affine" || a.name == "ScaledTanh" || a.name == "HardSigmoid";
    double def_alpha = a.name == "LeakyRelu" ? 0.01 : a.name == "HardSigmoid" ? 0.2 : 1.0;
    double def_beta = a.name == "HardSigmoid" ? 0.5 : (a.name == "ScaledTanh" ? 1.0 : 0.0);
    a.alpha = needs_alpha ? (ai < alphas.size() ? alphas[ai++] : def_alpha) : 0;
    a.beta = needs_beta ? (bi < betas.size() ? betas[bi++] : def_beta) : 0;
    r.push_back(a);
  }
  return r;
}

void recurrent(Kctx& k, Cell cell) {
  TView x = k.in(0), w = k.in(1), rr = k.in(2);
  auto b = k.opt_in(3), seq = k.opt_in(4), h0 = k.opt_in(5);
  std::optional<TView> c0, pp;
  if (cell == Cell::kLstm) {
    c0 = k.opt_in(6);
    pp = k.opt_in(7);
  }
  const int G = cell == Cell::kRnn ? 1 : cell == Cell::kGru ? 3 : 4;
  std::string direction = k.attr_s("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    k.invalid(cat("unknown direction '", direction, "'"));
  const int D = direction == "bidirectional" ? 2 : 1;
  const int64_t layout = k.attr_i("layout", 0);
  if (x.ndim() != 3) k.invalid("X must be 3-D");
  const int64_t S = layout ? x.shape[1] : x.shape[0], B = layout ? x.shape[0] : x.shape[1], I = x.shape[2];
  if (w.ndim() != 3 || w.shape[0] != D || w.shape[2] != I || w.shape[1] % G != 0)
    k.invalid(cat("W shape ", shape_str(w.shape), " does not match X ", shape_str(x.shape), " and direction"));
  const int64_t H = k.attr_i("hidden_size", w.shape[1] / G);
  if (w.shape[1] != G * H) k.invalid("W's second dimension does not equal gates x hidden_size");
  if (rr.shape != Shape{D, G * H, H})
    k.invalid(cat("R shape ", shape_str(rr.shape), " should be [", D, ",", G * H, ",", H, "]"));
  if (b && b->shape != Shape{D, 2 * G * H}) k.invalid("B has the wrong shape");
  Shape state_shape = layout ? Shape{B, D, H} : Shape{D, B, H};
  if (h0 && h0->shape != state_shape) k.invalid("initial_h has the wrong shape");
  if (c0 && c0->shape != state_shape) k.invalid("initial_c has the wrong shape");
  if (pp && pp->shape != Shape{D, 3 * H}) k.invalid("P has the wrong shape");
  if (seq && seq->numel != B) k.invalid("sequence_lens must have batch_size entries");
  std::vector<int64_t> lens(static_cast<size_t>(B), S);
  if (seq) {
    lens = read_ints(*seq, k, "sequence_lens");
    for (int64_t l : lens)
      if (l < 0 || l > S) k.invalid(cat("sequence length ", l, " is out of range [0, ", S, "]"));
  }
  std::optional<float> clip = k.attr_f_opt("clip");
  const bool lbr = k.attr_i("linear_before_reset", 0) != 0;
  const bool input_forget = k.attr_i("input_forget", 0) != 0;
  std::vector<Act> acts = activations(k, cell, D);
  const int per_dir = static_cast<int>(acts.size()) / D;

  auto X = to_calc<double>(x, k, "X"), W = to_calc<double>(w, k, "W"), R = to_calc<double>(rr, k, "R");
  std::vector<double> Bv = b ? to_calc<double>(*b, k, "B") : std::vector<double>(static_cast<size_t>(D * 2 * G * H), 0);
  std::vector<double> Pv = pp ? to_calc<double>(*pp, k, "P") : std::vector<double>(static_cast<size_t>(D * 3 * H), 0);
  std::vector<double> H0 =
      h0 ? to_calc<double>(*h0, k, "initial_h") : std::vector<double>(static_cast<size_t>(D * B * H), 0);
  std::vector<double> C0 =
      c0 ? to_calc<double>(*c0, k, "initial_c") : std::vector<double>(static_cast<size_t>(D * B * H), 0);
  auto state_at = [&](int d, int64_t bb) { return layout ? (bb * D + d) * H : (d * B + bb) * H; };
  auto x_at = [&](int64_t t, int64_t bb) { return layout ? (bb * S + t) * I : (t * B + bb) * I; };

  Shape y_shape = layout ? Shape{B, S, D, H} : Shape{S, D, B, H};
  std::vector<double> Y(static_cast<size_t>(S * D * B * H), 0.0), YH(static_cast<size_t>(D * B * H), 0.0),
      YC(static_cast<size_t>(D * B * H), 0.0);
  auto y_at = [&](int64_t t, int d, int64_t bb) {
    return layout ? ((bb * S + t) * D + d) * H : ((t * D + d) * B + bb) * H;
  };
  auto clipv = [&](double v) {
    return clip ? std::clamp(v, -static_cast<double>(*clip), static_cast<double>(*clip)) : v;
  };

  for (int d = 0; d < D; ++d) {
    bool reverse = direction == "reverse" || d == 1;
    const double* Wd = W.data() + d * G * H * I;
    const double* Rd = R.data() + d * G * H * H;
    const double* Wb = Bv.data() + d * 2 * G * H;
    const double* Rb = Wb + G * H;
    const double* Pd = Pv.data() + d * 3 * H;
    const Act& f = acts[d * per_dir];
    const Act& g = acts[d * per_dir + (per_dir > 1 ? 1 : 0)];
    const Act& hh = acts[d * per_dir + (per_dir > 2 ? 2 : 0)];
    for (int64_t bb = 0; bb < B; ++bb) {
      std::vector<double> h(H0.begin() + state_at(d, bb), H0.begin() + state_at(d, bb) + H);
      std::vector<double> c(C0.begin() + state_at(d, bb), C0.begin() + state_at(d, bb) + H);
      std::vector<double> xw(static_cast<size_t>(G * H)), hr(static_cast<size_t>(G * H)), nh(static_cast<size_t>(H));
      int64_t L = lens[bb];
      for (int64_t s = 0; s < L; ++s) {
        int64_t t = reverse ? L - 1 - s : s;
        const double* xt = X.data() + x_at(t, bb);
        for (int64_t j = 0; j < G * H; ++j) {
          double a = Wb[j], r2 = Rb[j];
          for (int64_t i = 0; i < I; ++i) a += Wd[j * I + i] * xt[i];
          for (int64_t i = 0; i < H; ++i) r2 += Rd[j * H + i] * h[i];
          xw[j] = a;
          hr[j] = r2;
        }
        if (cell == Cell::kRnn) {
          for (int64_t j = 0; j < H; ++j) nh[j] = f(clipv(xw[j] + hr[j]));
        } else if (cell == Cell::kGru) {
          std::vector<double> z(static_cast<size_t>(H)), rg(static_cast<size_t>(H));
          for (int64_t j = 0; j < H; ++j) {
            z[j] = f(clipv(xw[j] + hr[j]));
            rg[j] = f(clipv(xw[H + j] + hr[H + j]));
          }
          for (int64_t j = 0; j < H; ++j) {
            double cand;
            if (lbr) {
              cand = g(clipv(xw[2 * H + j] + rg[j] * hr[2 * H + j]));
            } else {
              double acc = Rb[2 * H + j];
              for (int64_t i = 0; i < H; ++i) acc += Rd[(2 * H + j) * H + i] * (rg[i] * h[i]);
              cand = g(clipv(xw[2 * H + j] + acc));
            }
            nh[j] = (1 - z[j]) * cand + z[j] * h[j];
          }
        } else {
          for (int64_t j = 0; j < H; ++j) {
            double ig = f(clipv(xw[j] + hr[j] + Pd[j] * c[j]));
            double fg = input_forget ? 1 - ig : f(clipv(xw[2 * H + j] + hr[2 * H + j] + Pd[2 * H + j] * c[j]));
            double cg = g(clipv(xw[3 * H + j] + hr[3 * H + j]));
            double cn = fg * c[j] + ig * cg;
            double og = f(clipv(xw[H + j] + hr[H + j] + Pd[H + j] * cn));
            c[j] = cn;
            nh[j] = og * hh(cn);
          }
        }
        h = nh;
        for (int64_t j = 0; j < H; ++j) Y[y_at(t, d, bb) + j] = h[j];
      }
      for (int64_t j = 0; j < H; ++j) {
        YH[state_at(d, bb) + j] = h[j];
        YC[state_at(d, bb) + j] = c[j];
      }
    }
  }
  auto write = [&](int i, const Shape& shp, const std::vector<double>& v) {
    if (!k.has_output(i)) return;
    TView o = k.out(i, shp);
    dispatch(
        FloatTs{}, o.dtype, k,
        [&](auto tag) {
          using T = typename decltype(tag)::type;
          for (int64_t j = 0; j < o.numel; ++j) o.p<T>()[j] = st<T>(v[j]);
        },
        "output");
  };
  write(0, y_shape, Y);
  write(1, state_shape, YH);
  if (cell == Cell::kLstm) write(2, state_shape, YC);
}

}  // namespace

void op_rnn(Kctx& k) { recurrent(k, Cell::kRnn); }
void op_gru(Kctx& k) { recurrent(k, Cell::kGru); }
void op_lstm(Kctx& k) { recurrent(k, Cell::kLstm); }

}  // namespace keel::ops::ref
