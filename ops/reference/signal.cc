// Reference signal-processing kernels: DFT (17), STFT (17), MelWeightMatrix (17). Direct O(n²) transforms in
// double (the reference is correct first, not fast). Complex values are a trailing dimension of size 2.
#include "ops/reference/kernels.h"

namespace keel::ops::ref {
namespace {

constexpr double kPi = 3.14159265358979323846;

// out[b] (b < bins) = sum_j in[j] * exp(∓2πi·j·b/n), in is n complex values (re, im interleaved).
void dft_1d(const double* in, int64_t n, int64_t bins, bool inverse, double* out) {
  const double sign = inverse ? 1.0 : -1.0;
  for (int64_t b = 0; b < bins; ++b) {
    double re = 0, im = 0;
    for (int64_t j = 0; j < n; ++j) {
      // (j*b) mod n keeps the angle small and exact for large n.
      double a = sign * 2.0 * kPi * static_cast<double>((j * b) % n) / static_cast<double>(n);
      double c = std::cos(a), s = std::sin(a);
      re += in[2 * j] * c - in[2 * j + 1] * s;
      im += in[2 * j] * s + in[2 * j + 1] * c;
    }
    if (inverse) {
      re /= static_cast<double>(n);
      im /= static_cast<double>(n);
    }
    out[2 * b] = re;
    out[2 * b + 1] = im;
  }
}

}  // namespace

void op_dft(Kctx& k) {
  TView x = k.in(0);
  const int r = x.ndim();
  if (r < 2 || (x.shape[r - 1] != 1 && x.shape[r - 1] != 2))
    k.invalid(cat("input must end in a dimension of 1 (real) or 2 (complex), got ", shape_str(x.shape)));
  int64_t a = k.attr_i("axis", 1);
  if (a < 0) a += r;
  if (a < 0 || a >= r - 1) k.invalid(cat("axis ", k.attr_i("axis", 1), " is out of range for rank ", r));
  const int axis = static_cast<int>(a);
  const bool inverse = k.attr_i("inverse", 0) != 0, onesided = k.attr_i("onesided", 0) != 0;
  const int64_t L = x.shape[axis];
  int64_t n = L;
  if (auto dl = k.opt_in(1); dl && dl->numel > 0) {
    n = get_i64(*dl, 0, k);
    if (n <= 0) k.invalid(cat("dft_length must be positive, got ", n));
  }
  const int64_t bins = onesided ? n / 2 + 1 : n;
  Shape os = x.shape;
  os[axis] = bins;
  os[r - 1] = 2;
  TView y = k.out(0, os);
  if (y.numel == 0) return;
  const bool cplx = x.shape[r - 1] == 2;
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int d = axis + 1; d < r - 1; ++d) inner *= x.shape[d];
  const int64_t ic = cplx ? 2 : 1;
  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch(
        FloatTs{}, y.dtype, k,
        [&](auto otag) {
          using O = typename decltype(otag)::type;
          const T* xd = x.p<T>();
          O* yd = y.p<O>();
          k.parallel(outer * inner, 1, [&](int64_t b, int64_t e) {
            std::vector<double> sig(static_cast<size_t>(2 * n)), res(static_cast<size_t>(2 * bins));
            for (int64_t oi = b; oi < e; ++oi) {
              const int64_t o = oi / inner, i = oi % inner;
              std::fill(sig.begin(), sig.end(), 0.0);
              for (int64_t j = 0; j < std::min(n, L); ++j) {
                const T* p = xd + ((o * L + j) * inner + i) * ic;
                sig[2 * j] = static_cast<double>(ld(p[0]));
                if (cplx) sig[2 * j + 1] = static_cast<double>(ld(p[1]));
              }
              dft_1d(sig.data(), n, bins, inverse, res.data());
              for (int64_t j = 0; j < bins; ++j) {
                O* q = yd + ((o * bins + j) * inner + i) * 2;
                q[0] = st<O>(res[2 * j]);
                q[1] = st<O>(res[2 * j + 1]);
              }
            }
          });
        },
        "output");
  });
}

void op_stft(Kctx& k) {
  TView x = k.in(0);
  if (x.ndim() != 3 || (x.shape[2] != 1 && x.shape[2] != 2))
    k.invalid(cat("signal must be [batch, signal_length, 1 or 2], got ", shape_str(x.shape)));
  const int64_t step = get_i64(k.in(1), 0, k);
  if (step <= 0) k.invalid(cat("frame_step must be positive, got ", step));
  auto win_t = k.opt_in(2);
  auto fl_t = k.opt_in(3);
  int64_t fl = -1;
  if (fl_t && fl_t->numel > 0) fl = get_i64(*fl_t, 0, k);
  else if (win_t) fl = win_t->numel;
  else k.invalid("either window or frame_length must be given");
  if (fl <= 0) k.invalid(cat("frame_length must be positive, got ", fl));
  std::vector<double> win(static_cast<size_t>(fl), 1.0);
  if (win_t) {
    if (win_t->numel != fl) k.invalid(cat("window has ", win_t->numel, " values, frame_length is ", fl));
    std::vector<float> w = read_floats(*win_t, k, "window");
    for (int64_t i = 0; i < fl; ++i) win[i] = w[i];
  }
  const bool onesided = k.attr_i("onesided", 1) != 0;
  const int64_t B = x.shape[0], L = x.shape[1];
  const bool cplx = x.shape[2] == 2;
  if (fl > L) k.invalid(cat("frame_length ", fl, " is longer than the signal (", L, ")"));
  const int64_t frames = (L - fl) / step + 1;
  const int64_t bins = onesided ? fl / 2 + 1 : fl;
  TView y = k.out(0, {B, frames, bins, 2});
  if (y.numel == 0) return;
  const int64_t ic = cplx ? 2 : 1;
  dispatch(FloatTs{}, x.dtype, k, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch(
        FloatTs{}, y.dtype, k,
        [&](auto otag) {
          using O = typename decltype(otag)::type;
          const T* xd = x.p<T>();
          O* yd = y.p<O>();
          k.parallel(B * frames, 1, [&](int64_t b, int64_t e) {
            std::vector<double> sig(static_cast<size_t>(2 * fl)), res(static_cast<size_t>(2 * bins));
            for (int64_t bf = b; bf < e; ++bf) {
              const int64_t bi = bf / frames, f = bf % frames;
              for (int64_t j = 0; j < fl; ++j) {
                const T* p = xd + (bi * L + f * step + j) * ic;
                sig[2 * j] = static_cast<double>(ld(p[0])) * win[j];
                sig[2 * j + 1] = cplx ? static_cast<double>(ld(p[1])) * win[j] : 0.0;
              }
              dft_1d(sig.data(), fl, bins, false, res.data());
              O* q = yd + bf * bins * 2;
              for (int64_t j = 0; j < 2 * bins; ++j) q[j] = st<O>(res[j]);
            }
          });
        },
        "output");
  });
}

void op_mel_weight_matrix(Kctx& k) {
  const int64_t mel = get_i64(k.in(0), 0, k), dft_length = get_i64(k.in(1), 0, k);
  const int64_t rate = get_i64(k.in(2), 0, k);
  const float lo = static_cast<float>(get_f64(k.in(3), 0, k)), hi = static_cast<float>(get_f64(k.in(4), 0, k));
  if (mel <= 0 || dft_length <= 0 || rate <= 0) k.invalid("num_mel_bins, dft_length and sample_rate must be positive");
  const int64_t spec_bins = dft_length / 2 + 1;
  TView y = k.out(0, {spec_bins, mel});
  // The ONNX formula (mel scale 2595·log10(1 + f/700), mel_step over num_mel_bins + 2 points); the mel edges are
  // computed in float like the reference, the rest in double.
  const float lo_mel = 2595.0f * std::log10(1.0f + lo / 700.0f), hi_mel = 2595.0f * std::log10(1.0f + hi / 700.0f);
  const float mel_step = (hi_mel - lo_mel) / static_cast<float>(mel + 2);
  std::vector<int64_t> fb(static_cast<size_t>(mel + 2));
  for (int64_t i = 0; i < mel + 2; ++i) {
    double f = static_cast<double>(i) * static_cast<double>(mel_step) + static_cast<double>(lo_mel);
    f = 700.0 * (std::pow(10.0, f / 2595.0) - 1.0);
    fb[i] = static_cast<int64_t>(std::floor(static_cast<double>(dft_length + 1) * f / static_cast<double>(rate)));
  }
  // Written straight into the output (no scratch matrix of the output's size: a huge num_mel_bins x dft_length
  // fails at the output's allocation as OUT_OF_MEMORY, not in a second, unchecked one).
  dispatch(
      NumTs{}, y.dtype, k,
      [&](auto tag) {
        using T = typename decltype(tag)::type;
        T* out = y.p<T>();
        for (int64_t i = 0; i < y.numel; ++i) out[i] = st<T>(0.0);
        auto set = [&](int64_t j, int64_t i, double v) {
          if (j < 0 || j >= spec_bins) k.invalid("the mel band edges fall outside the spectrogram bins");
          out[j * mel + i] = st<T>(v);
        };
        for (int64_t i = 0; i < mel; ++i) {
          const int64_t l = fb[i], c = fb[i + 1], h = fb[i + 2];
          const int64_t lc = c - l;
          if (lc == 0) set(c, i, 1.0);
          else
            for (int64_t j = l; j <= c; ++j) set(j, i, static_cast<double>(j - l) / static_cast<double>(lc));
          const int64_t ch = h - c;
          if (ch > 0)
            for (int64_t j = c; j < h; ++j) set(j, i, static_cast<double>(h - j) / static_cast<double>(ch));
        }
      },
      "output");
}

}  // namespace keel::ops::ref
