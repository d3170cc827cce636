// Reference kernels of the ai.onnx.preview.training domain (opset 1): the optimizers Adagrad, Adam and Momentum
// (standard and nesterov). Inputs: R (scalar learning rate), T (scalar int64 update count), then n tensors per
// group (X..., G..., and the optimizer states); outputs: the updated X... and states. Computed in double.
#include "ops/reference/kernels.h"

namespace keel::ops::ref {
namespace {

// Reads R and T and checks the input/output counts for `groups` input groups and `groups - 1` output groups.
struct OptimArgs {
  double r = 0;
  int64_t t = 0;
  int64_t n = 0;
};

OptimArgs optim_args(Kctx& k, int groups) {
  OptimArgs a;
  a.r = get_f64(k.in(0), 0, k);
  a.t = get_i64(k.in(1), 0, k);
  const int rest = k.n_inputs() - 2;
  if (rest <= 0 || rest % groups != 0)
    k.invalid(cat("expected R, T and ", groups, " groups of equally many tensors, got ", k.n_inputs(), " inputs"));
  a.n = rest / groups;
  if (k.n_outputs() != a.n * (groups - 1))
    k.invalid(cat("expected ", a.n * (groups - 1), " outputs for ", a.n, " tensor(s), got ", k.n_outputs()));
  return a;
}

// Runs f(x, g, states..., outs...) elementwise (all doubles; outs by reference) for tensor i of each group.
template <int S, class F>
void optim_apply(Kctx& k, const OptimArgs& a, F&& f) {
  constexpr int G = 2 + S;  // X, G, states
  for (int64_t i = 0; i < a.n; ++i) {
    TView in[G];
    for (int g = 0; g < G; ++g) {
      in[g] = k.in(static_cast<int>(2 + g * a.n + i));
      if (in[g].shape != in[0].shape)
        k.invalid(cat("input ", 2 + g * a.n + i, " has shape ", shape_str(in[g].shape), ", expected ",
                      shape_str(in[0].shape)));
    }
    TView out[G - 1];
    for (int o = 0; o < G - 1; ++o) out[o] = k.out(static_cast<int>(o * a.n + i), in[0].shape);
    dispatch(FloatTs{}, in[0].dtype, k, [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (int g = 0; g < G; ++g)
        if (in[g].dtype != in[0].dtype) k.invalid("all tensors must have the same dtype");
      for (int o = 0; o < G - 1; ++o)
        if (out[o].dtype != in[0].dtype) k.invalid("outputs must have the dtype of the inputs");
      for (int64_t e = 0; e < in[0].numel; ++e) {
        double v[G], w[G - 1];
        for (int g = 0; g < G; ++g) v[g] = static_cast<double>(ld(in[g].template p<T>()[e]));
        f(v, w);
        for (int o = 0; o < G - 1; ++o) out[o].template p<T>()[e] = st<T>(w[o]);
      }
    });
  }
}

}  // namespace

void op_adagrad(Kctx& k) {
  OptimArgs a = optim_args(k, 3);
  const double decay = k.attr_f("decay_factor", 0.0f), eps = k.attr_f("epsilon", 1e-6f);
  const double norm = k.attr_f("norm_coefficient", 0.0f);
  const double r = a.r / (1.0 + static_cast<double>(a.t) * decay);
  optim_apply<1>(k, a, [&](const double* v, double* w) {
    const double x = v[0], g = norm * x + v[1];
    const double h = v[2] + g * g;
    w[0] = x - r * g / (std::sqrt(h) + eps);
    w[1] = h;
  });
}

void op_adam(Kctx& k) {
  OptimArgs a = optim_args(k, 4);
  const double alpha = k.attr_f("alpha", 0.9f), beta = k.attr_f("beta", 0.999f), eps = k.attr_f("epsilon", 1e-6f);
  const double norm = k.attr_f("norm_coefficient", 0.0f), norm_post = k.attr_f("norm_coefficient_post", 0.0f);
  const double t = static_cast<double>(a.t);
  const double r = a.t > 0 ? a.r * std::sqrt(1.0 - std::pow(beta, t)) / (1.0 - std::pow(alpha, t)) : a.r;
  optim_apply<2>(k, a, [&](const double* v, double* w) {
    const double x = v[0], g = norm * x + v[1];
    const double vn = alpha * v[2] + (1.0 - alpha) * g;
    const double hn = beta * v[3] + (1.0 - beta) * g * g;
    const double xn = x - r * (vn / (std::sqrt(hn) + eps));
    w[0] = (1.0 - norm_post) * xn;
    w[1] = vn;
    w[2] = hn;
  });
}

void op_momentum(Kctx& k) {
  OptimArgs a = optim_args(k, 3);
  auto alpha_o = k.attr_f_opt("alpha"), beta_o = k.attr_f_opt("beta"), norm_o = k.attr_f_opt("norm_coefficient");
  auto mode_o = k.attr_s_opt("mode");
  if (!alpha_o || !beta_o || !norm_o || !mode_o)
    k.invalid("attributes alpha, beta, mode and norm_coefficient are required");
  const bool nesterov = *mode_o == "nesterov";
  if (!nesterov && *mode_o != "standard") k.invalid(cat("mode must be standard or nesterov, got '", *mode_o, "'"));
  const double alpha = *alpha_o, norm = *norm_o;
  const double beta = a.t > 0 ? static_cast<double>(*beta_o) : 1.0;
  const double r = a.r;
  optim_apply<1>(k, a, [&](const double* v, double* w) {
    const double x = v[0], g = norm * x + v[1];
    const double vn = alpha * v[2] + beta * g;
    w[0] = nesterov ? x - r * (g + alpha * vn) : x - r * vn;
    w[1] = vn;
  });
}

}  // namespace keel::ops::ref
