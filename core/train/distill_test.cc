// Knowledge distillation's loss (core/train/nn.h): distillation_kl against a hand computation in double, its gradient
// against central finite differences and against the closed form T * (q - p) / N, the teacher left without a
// gradient, DistillationLoss's weighting of the soft and the label loss, and clear errors. Values computed by the f32
// kernels (their exp/log approximations) agree with the double references to a relative 2e-4.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/train/nn.h"

namespace keel::train {
namespace {

using eager::Tensor;

std::vector<double> softmax_row(const std::vector<float>& v, size_t row, size_t c, double t) {
  double mx = -1e300, sum = 0;
  for (size_t j = 0; j < c; ++j) mx = std::max(mx, v[row * c + j] / t);
  std::vector<double> r(c);
  for (size_t j = 0; j < c; ++j) sum += r[j] = std::exp(v[row * c + j] / t - mx);
  for (auto& x : r) x /= sum;
  return r;
}

// T^2 * sum over rows of KL(p || q), in double.
double kl_reference(const std::vector<float>& s, const std::vector<float>& t, size_t n, size_t c, double temp) {
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    auto p = softmax_row(t, i, c, temp), q = softmax_row(s, i, c, temp);
    for (size_t j = 0; j < c; ++j) total += p[j] * (std::log(p[j]) - std::log(q[j]));
  }
  return temp * temp * total;
}

std::vector<float> randv(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Distillation, KlMatchesAHandComputation) {
  // Row 0: student (1, 2, 3), teacher (3, 1, 0); row 1: equal logits, no divergence.
  const std::vector<float> s = {1, 2, 3, 0.5f, -1, 2}, t = {3, 1, 0, 0.5f, -1, 2};
  for (float temp : {1.f, 2.f, 4.f}) {
    const double row0 = kl_reference(s, t, 1, 3, temp);
    ASSERT_GT(row0, 0.01);
    auto st = eager::from_vector(s, {2, 3}), tt = eager::from_vector(t, {2, 3});
    EXPECT_NEAR(nn::distillation_kl(st, tt, temp).item(), row0 / 2, 2e-4 * std::max(1.0, row0)) << temp;
    EXPECT_NEAR(nn::distillation_kl(st, tt, temp, "sum").item(), row0, 2e-4 * std::max(1.0, row0)) << temp;
    auto rows = nn::distillation_kl(st, tt, temp, "none").to_vector<float>();
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_NEAR(rows[0], row0, 2e-4 * std::max(1.0, row0));
    EXPECT_NEAR(rows[1], 0.0, 1e-6);
  }
  // T = 2 by hand: p = softmax(1.5, 0.5, 0), q = softmax(0.5, 1, 1.5), KL * 4.
  const double zp = std::exp(1.5) + std::exp(0.5) + 1, zq = std::exp(0.5) + std::exp(1.0) + std::exp(1.5);
  const double p[3] = {std::exp(1.5) / zp, std::exp(0.5) / zp, 1 / zp};
  const double q[3] = {std::exp(0.5) / zq, std::exp(1.0) / zq, std::exp(1.5) / zq};
  double kl = 0;
  for (int j = 0; j < 3; ++j) kl += p[j] * std::log(p[j] / q[j]);
  EXPECT_NEAR(nn::distillation_kl(eager::from_vector(std::vector<float>{1, 2, 3}, {1, 3}),
                                  eager::from_vector(std::vector<float>{3, 1, 0}, {1, 3}), 2.f)
                  .item(),
              4 * kl, 2e-4 * 4 * kl);
}

TEST(Distillation, GradientMatchesFiniteDifferencesAndTheClosedForm) {
  const size_t n = 3, c = 5;
  const float temp = 3.f;
  std::vector<float> s = randv(n * c, 1, 2.f), t = randv(n * c, 2, 3.f);
  Tensor student = eager::from_vector(s, {3, 5});
  student.requires_grad_();
  Tensor teacher = eager::from_vector(t, {3, 5});
  teacher.requires_grad_();  // a teacher that could take a gradient gets none
  nn::distillation_kl(student, teacher, temp).backward();
  ASSERT_TRUE(student.grad().defined());
  EXPECT_FALSE(teacher.grad().defined());
  auto g = student.grad().to_vector<float>();
  for (size_t i = 0; i < n; ++i) {
    auto p = softmax_row(t, i, c, temp), q = softmax_row(s, i, c, temp);
    for (size_t j = 0; j < c; ++j) {
      const size_t k = i * c + j;
      EXPECT_NEAR(g[k], temp * (q[j] - p[j]) / n, 1e-5) << "closed form at " << k;
      // Central differences of the double reference, batchmean.
      const double h = 1e-3;
      std::vector<float> plus = s, minus = s;
      plus[k] += static_cast<float>(h), minus[k] -= static_cast<float>(h);
      const double fd = (kl_reference(plus, t, n, c, temp) - kl_reference(minus, t, n, c, temp)) / n / (2 * h);
      EXPECT_NEAR(g[k], fd, 2e-4) << "finite difference at " << k;
    }
  }
}

TEST(Distillation, LossWeighsTheSoftAndTheLabelLoss) {
  const size_t n = 4, c = 3;
  std::vector<float> s = randv(n * c, 3, 1.5f), t = randv(n * c, 4, 1.5f);
  auto target = eager::from_vector(std::vector<int64_t>{0, 2, 1, 2}, {4});
  const float temp = 2.f, alpha = 0.7f;
  Tensor student = eager::from_vector(s, {4, 3});
  student.requires_grad_();
  nn::DistillationLoss loss(temp, alpha);
  EXPECT_EQ(loss.temperature(), temp);
  EXPECT_EQ(loss.alpha(), alpha);
  auto parts = loss.parts(student, eager::from_vector(t, {4, 3}), target);
  const double soft = kl_reference(s, t, n, c, temp) / n;
  double hard = 0;
  const int64_t y[4] = {0, 2, 1, 2};
  for (size_t i = 0; i < n; ++i) hard -= std::log(softmax_row(s, i, c, 1)[static_cast<size_t>(y[i])]) / n;
  EXPECT_NEAR(parts.soft.item(), soft, 2e-4 * soft);
  EXPECT_NEAR(parts.hard.item(), hard, 2e-4 * hard);
  EXPECT_NEAR(parts.loss.item(), alpha * soft + (1 - alpha) * hard, 2e-4 * (soft + hard));
  parts.loss.backward();
  auto g = student.grad().to_vector<float>();
  for (size_t i = 0; i < n; ++i) {
    auto p = softmax_row(t, i, c, temp), q = softmax_row(s, i, c, temp), q1 = softmax_row(s, i, c, 1);
    for (size_t j = 0; j < c; ++j) {
      const double want =
          alpha * temp * (q[j] - p[j]) / n + (1 - alpha) * (q1[j] - (static_cast<int64_t>(j) == y[i] ? 1.0 : 0.0)) / n;
      EXPECT_NEAR(g[i * c + j], want, 1e-5) << i << "," << j;
    }
  }
  // alpha 0 is the label loss alone, alpha 1 the soft loss alone.
  EXPECT_NEAR(nn::DistillationLoss(temp, 0.f)(student, eager::from_vector(t, {4, 3}), target).item(), hard,
              2e-4 * hard);
  EXPECT_NEAR(nn::DistillationLoss(temp, 1.f)(student, eager::from_vector(t, {4, 3}), target).item(), soft,
              2e-4 * soft);
}

TEST(Distillation, BadArgumentsAreClearErrors) {
  auto a = eager::zeros({2, 3}), b = eager::zeros({2, 4});
  auto expect_error = [](auto f, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "no error; wanted " << want;
    } catch (const eager::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error([&] { nn::distillation_kl(a, b, 2.f); }, "must both be [N, C] of one shape");
  expect_error([&] { nn::distillation_kl(eager::zeros({6}), eager::zeros({6}), 2.f); }, "[N, C]");
  expect_error([&] { nn::distillation_kl(a, a, 0.f); }, "temperature must be a positive number");
  expect_error([&] { nn::distillation_kl(a, a, NAN); }, "temperature");
  expect_error([&] { nn::distillation_kl(a, a, 1.f, "mean"); }, "reduction must be batchmean, sum or none");
  expect_error([&] { nn::DistillationLoss(4.f, 1.5f); }, "alpha must be in [0, 1]");
  expect_error([&] { nn::DistillationLoss(-1.f, 0.5f); }, "temperature");
}

}  // namespace
}  // namespace keel::train
