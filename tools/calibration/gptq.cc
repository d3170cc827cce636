// GPTQ rounding of INT8 weights (see gptq.h).
#include "tools/calibration/gptq.h"

#include <algorithm>
#include <cmath>

#include "core/base/target_clones.h"

namespace keel::cli {
namespace {

// The hot loops, compiled for AVX-512, AVX2 and the baseline (chosen at load time) at -O3 so that they vectorise.
// No reduction is reassociated and nothing is contracted into FMAs (ISO C++ mode), so every clone gives the same bits.
#if KEEL_TARGET_CLONES
#define KEEL_GPTQ_CLONES __attribute__((target_clones("avx512f", "avx2", "default"), optimize("O3", "fp-contract=off")))
#else
#define KEEL_GPTQ_CLONES
#endif

// Σ a[i]·b[i] in 8 interleaved partial sums, added in a fixed order at the end.
KEEL_GPTQ_CLONES double dot(const double* __restrict a, const double* __restrict b, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// y[j] -= a·x[j]
KEEL_GPTQ_CLONES void sub_scaled(double* __restrict y, const double* __restrict x, double a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] -= a * x[j];
}

// h[j] += a·p[j]
KEEL_GPTQ_CLONES void add_scaled(float* __restrict h, const float* __restrict p, float a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) h[j] += a * p[j];
}

}  // namespace

HessianAccumulator::HessianAccumulator(const LayerGeometry& g, int64_t batches, int64_t max_patches)
    : geo_(g), batches_(std::max<int64_t>(1, batches)), max_patches_(max_patches) {
  h_.assign(static_cast<size_t>(geo_.groups * geo_.cols * geo_.cols), 0.f);
  block_.assign(static_cast<size_t>(geo_.groups * kBlock * geo_.cols), 0.f);
}

void HessianAccumulator::first_batch(int64_t patches_in_batch) {
  if (step_ > 0) return;
  const int64_t expected = patches_in_batch * batches_;
  step_ = max_patches_ > 0 && expected > max_patches_ ? (expected + max_patches_ - 1) / max_patches_ : 1;
}

void HessianAccumulator::flush() {
  const int64_t d = geo_.cols;
  for (int64_t g = 0; g < geo_.groups; ++g) {
    float* h = h_.data() + g * d * d;
    const float* p = block_.data() + g * kBlock * d;
    for (int64_t i = 0; i < d; ++i) {
      float* hi = h + i * d;
      for (int64_t r = 0; r < filled_; ++r) {
        const float* pr = p + r * d;
        const float a = pr[i];
        if (a == 0.f) continue;  // ReLU outputs and padding: many zeros
        add_scaled(hi + i, pr + i, a, d - i);
      }
    }
  }
  filled_ = 0;
}

Status HessianAccumulator::add(const Tensor& x) {
  if (x.dtype() != DType::kF32) return invalid_argument("the layer's input is not f32");
  const float* p = x.data<float>();
  const int64_t d = geo_.cols;
  if (!geo_.conv) {
    if (x.rank() < 1 || x.shape().back() != d)
      return invalid_argument("input " + shape_to_string(x.shape()) + " does not end in the weight's " +
                              std::to_string(d) + " features");
    const int64_t m = x.numel() / d;
    first_batch(m);
    for (int64_t r = 0; r < m; ++r, ++index_) {
      if (index_ != next_) continue;
      next_ += step_;
      std::copy(p + r * d, p + (r + 1) * d, slot(0));
      if (++filled_ == kBlock) flush();
      ++patches_;
    }
    return Status::ok();
  }
  const LayerGeometry& g = geo_;
  if (x.rank() != 4 || x.shape()[1] != g.groups * g.cin_g)
    return invalid_argument("input " + shape_to_string(x.shape()) + " is not [N, " +
                            std::to_string(g.groups * g.cin_g) + ", H, W]");
  const int64_t n = x.shape()[0], c = x.shape()[1], hh = x.shape()[2], ww = x.shape()[3];
  const int64_t oh = (hh + g.pad_top + g.pad_bottom - g.dil_h * (g.kh - 1) - 1) / g.stride_h + 1;
  const int64_t ow = (ww + g.pad_left + g.pad_right - g.dil_w * (g.kw - 1) - 1) / g.stride_w + 1;
  if (oh <= 0 || ow <= 0) return invalid_argument("the convolution has no output position");
  first_batch(n * oh * ow);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t y = 0; y < oh; ++y)
      for (int64_t xo = 0; xo < ow; ++xo, ++index_) {
        if (index_ != next_) continue;
        next_ += step_;
        for (int64_t gr = 0; gr < g.groups; ++gr) {
          float* v = slot(gr);
          int64_t at = 0;
          for (int64_t ci = 0; ci < g.cin_g; ++ci) {
            const float* plane = p + ((b * c) + gr * g.cin_g + ci) * hh * ww;
            for (int64_t ky = 0; ky < g.kh; ++ky) {
              const int64_t iy = y * g.stride_h - g.pad_top + ky * g.dil_h;
              for (int64_t kx = 0; kx < g.kw; ++kx, ++at) {
                const int64_t ix = xo * g.stride_w - g.pad_left + kx * g.dil_w;
                v[at] = iy >= 0 && iy < hh && ix >= 0 && ix < ww ? plane[iy * ww + ix] : 0.f;
              }
            }
          }
        }
        if (++filled_ == kBlock) flush();
        ++patches_;
      }
  return Status::ok();
}

std::vector<double> HessianAccumulator::hessian(int64_t g) {
  if (filled_ > 0) flush();
  const int64_t d = geo_.cols;
  std::vector<double> out(static_cast<size_t>(d * d));
  const float* h = h_.data() + g * d * d;
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = i; j < d; ++j)
      out[static_cast<size_t>(i * d + j)] = out[static_cast<size_t>(j * d + i)] = h[i * d + j];
  return out;
}

namespace {

int8_t nearest(double w, float scale) {
  const double q = std::nearbyint(w / scale);
  return std::isnan(q) ? int8_t{0} : static_cast<int8_t>(std::clamp(q, -127.0, 127.0));
}

// Lower Cholesky factor of the d × d symmetric matrix a, in place (the upper triangle is left as it was). False when
// a is not positive definite.
bool cholesky_lower(std::vector<double>& a, int64_t d) {
  for (int64_t i = 0; i < d; ++i) {
    double* ai = a.data() + i * d;
    for (int64_t j = 0; j <= i; ++j) {
      const double* aj = a.data() + j * d;
      const double s = ai[j] - dot(ai, aj, j);
      if (i == j) {
        if (!(s > 0)) return false;
        ai[i] = std::sqrt(s);
      } else {
        ai[j] = s / aj[j];
      }
    }
  }
  return true;
}

}  // namespace

std::vector<int8_t> nearest_round(const std::vector<float>& w, int64_t rows, int64_t cols,
                                  const std::vector<float>& row_scales) {
  std::vector<int8_t> q(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < q.size(); ++i) {
    const float r = std::nearbyint(w[i] / row_scales[i / static_cast<size_t>(cols)]);
    q[i] = std::isnan(r) ? int8_t{0} : static_cast<int8_t>(std::clamp(r, -127.f, 127.f));
  }
  return q;
}

std::vector<int8_t> gptq_round(const std::vector<float>& w, int64_t rows, int64_t cols,
                               const std::vector<float>& row_scales, std::vector<double> h, double damp) {
  const int64_t d = cols;
  std::vector<int8_t> q(static_cast<size_t>(rows * cols));
  if (d == 0 || rows == 0) return q;
  // Inputs that were always zero: their weights never matter (quantized as zeros) and their rows of H are empty.
  std::vector<char> dead(static_cast<size_t>(d), 0);
  double mean_diag = 0;
  for (int64_t i = 0; i < d; ++i) {
    double& hii = h[static_cast<size_t>(i * d + i)];
    if (!(hii > 0)) {
      dead[static_cast<size_t>(i)] = 1;
      for (int64_t j = 0; j < d; ++j) h[static_cast<size_t>(i * d + j)] = h[static_cast<size_t>(j * d + i)] = 0;
      hii = 1;
    }
    mean_diag += hii;
  }
  mean_diag /= static_cast<double>(d);
  // U, upper triangular with H⁻¹ = Uᵀ·U (GPTQ's "Cholesky of the inverse, upper"): with J the reversal, L the lower
  // Cholesky factor of J·H·J gives H = (J·L·J)(J·L·J)ᵀ with J·L·J upper triangular, so U = (J·L·J)⁻¹ = J·L⁻¹·J.
  std::vector<double> l;
  for (double extra = damp;; extra *= 10) {
    l.assign(static_cast<size_t>(d * d), 0.0);
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j <= i; ++j)
        l[static_cast<size_t>(i * d + j)] =
            h[static_cast<size_t>((d - 1 - i) * d + (d - 1 - j))] + (i == j ? extra * mean_diag : 0.0);
    if (cholesky_lower(l, d)) break;
    if (extra > 1e3)
      return nearest_round(w, rows, cols, row_scales);  // not even a heavily damped H is positive definite (NaN inputs)
  }
  // M = L⁻¹ (lower), one column at a time by forward substitution: rows of L and the column are contiguous.
  std::vector<double> u(static_cast<size_t>(d * d), 0.0), m(static_cast<size_t>(d));
  for (int64_t j = 0; j < d; ++j) {
    m[static_cast<size_t>(j)] = 1.0 / l[static_cast<size_t>(j * d + j)];
    for (int64_t i = j + 1; i < d; ++i) {
      const double* li = l.data() + i * d;
      m[static_cast<size_t>(i)] = -dot(li + j, m.data() + j, i - j) / li[i];
    }
    // U[d-1-i][d-1-j] = M[i][j]
    for (int64_t i = j; i < d; ++i) u[static_cast<size_t>((d - 1 - i) * d + (d - 1 - j))] = m[static_cast<size_t>(i)];
  }
  // Inputs with infinities make H infinite and U not finite: nearest rounding then.
  for (double x : u)
    if (!std::isfinite(x)) return nearest_round(w, rows, cols, row_scales);
  std::vector<double> row(static_cast<size_t>(d));
  for (int64_t r = 0; r < rows; ++r) {
    const float s = row_scales[static_cast<size_t>(r)];
    for (int64_t i = 0; i < d; ++i)
      row[static_cast<size_t>(i)] = dead[static_cast<size_t>(i)] ? 0.0 : w[static_cast<size_t>(r * d + i)];
    for (int64_t i = 0; i < d; ++i) {
      const int8_t qi = nearest(row[static_cast<size_t>(i)], s);
      q[static_cast<size_t>(r * d + i)] = qi;
      const double* ui = u.data() + i * d;
      const double err = (row[static_cast<size_t>(i)] - static_cast<double>(qi) * s) / ui[i];
      sub_scaled(row.data() + i + 1, ui + i + 1, err, d - i - 1);
    }
  }
  return q;
}

double output_error(const std::vector<float>& w, const std::vector<int8_t>& q, int64_t rows, int64_t cols,
                    const std::vector<float>& row_scales, const std::vector<double>& h) {
  double total = 0;
  std::vector<double> e(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols; ++i) {
      const size_t at = static_cast<size_t>(r * cols + i);
      e[static_cast<size_t>(i)] = w[at] - static_cast<double>(q[at]) * row_scales[static_cast<size_t>(r)];
    }
    for (int64_t i = 0; i < cols; ++i) total += e[static_cast<size_t>(i)] * dot(h.data() + i * cols, e.data(), cols);
  }
  return total;
}

}  // namespace keel::cli
