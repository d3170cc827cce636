// eager_bench — a timing driver (not a test): per-batch forward+backward of the SimpleCNN
// (Conv2D(1,32,3) -> ReLU -> MaxPool2D(2) -> Linear(5408,10) -> cross-entropy, batch 64) or, with `--model lenet`,
// of `keel train --model lenet`'s LeNet-like network (Conv2D(1,32,3) -> ReLU -> Conv2D(32,64,3) -> ReLU ->
// MaxPool2D(2) -> Dropout(0.25) -> Linear(9216,128) -> ReLU -> Dropout(0.5) -> Linear(128,10)), in fp32 and under
// bf16 autocast, and the per-op dispatch overhead of eager ops. Environment as `keel` builds it (plugins discovered).
// KEEL_EAGER_PROFILE=1 adds the time of every op by kernel and shapes. `--form apart` writes the forward as
// PaddlePaddle's users write it, conv2d, relu and max_pool2d called one by one (fused on the CPU all the same: conv2d
// defers its computation, eager_deferred.cc; KEEL_EAGER_DEFER=0 runs them apart).
//
//   eager_bench [--model simple|lenet] [--form fused|apart] [--threads N] [--iters N] [--batch N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "core/runtime/eager.h"

using keel::DType;
using keel::Environment;
using keel::EnvironmentOptions;
using namespace keel::eager;

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// Process CPU time (all threads): on a shared, loaded machine the wall clock also counts time others took.
double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

// Parameters (weights, biases) in order; with 4 the SimpleCNN, with 8 the LeNet-like network.
struct Model {
  std::vector<Tensor> p;
  bool apart = false;  // --form apart
  Tensor forward(const Tensor& x) const {
    if (apart) {
      if (p.size() == 4) return linear(flatten(max_pool2d(relu(conv2d(x, p[0], p[1])), {2, 2})), p[2], p[3]);
      Tensor h = relu(conv2d(x, p[0], p[1]));
      h = dropout(max_pool2d(relu(conv2d(h, p[2], p[3])), {2, 2}), 0.25f, true);
      h = dropout(relu(linear(flatten(h), p[4], p[5])), 0.5f, true);
      return linear(h, p[6], p[7]);
    }
    // As keel train's models: the convolutions' ReLUs fused (conv2d_relu), and a max pooling after one
    // (conv2d_relu_max_pool2d).
    if (p.size() == 4) return linear(flatten(conv2d_relu_max_pool2d(x, p[0], p[1], {2, 2})), p[2], p[3]);
    Tensor h = conv2d_relu(x, p[0], p[1]);
    h = dropout(conv2d_relu_max_pool2d(h, p[2], p[3], {2, 2}), 0.25f, true);
    h = dropout(relu(linear(flatten(h), p[4], p[5])), 0.5f, true);
    return linear(h, p[6], p[7]);
  }
};

// Uniform in ±1/sqrt(fan_in), as PyTorch's default initialisation bounds it; requires grad.
Tensor param(std::vector<int64_t> shape, int64_t fan_in) {
  const float b = 1.0f / std::sqrt(static_cast<float>(fan_in));
  return rand_uniform(std::move(shape), -b, b).requires_grad_();
}

double step_ms(const Model& m, const Tensor& x, const Tensor& y, DType amp, int iters, bool print_phases) {
  std::vector<double> t;
  double fwd = 0, bwd = 0, cpu = 0;
  for (int i = 0; i < iters + 3; ++i) {
    for (const Tensor& p : m.p) const_cast<Tensor&>(p).zero_grad();
    double t0 = now_ms(), c0 = cpu_ms();
    Tensor loss;
    if (amp != DType::kUndefined) {
      AutocastGuard ac(amp);
      loss = cross_entropy(m.forward(x), y);
    } else {
      loss = cross_entropy(m.forward(x), y);
    }
    double t1 = now_ms();
    loss.backward();
    double t2 = now_ms(), c2 = cpu_ms();
    if (i >= 3) {
      cpu += c2 - c0;
      t.push_back(t2 - t0);
      fwd += t1 - t0;
      bwd += t2 - t1;
    }
  }
  std::sort(t.begin(), t.end());
  if (print_phases)
    std::printf("    (mean wall: forward %.3f ms, backward %.3f ms; mean process CPU time %.3f ms per batch)\n",
                fwd / iters, bwd / iters, cpu / iters);
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 50, batch = 64;
  std::string model = "simple", form = "fused";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
    else if (!std::strcmp(argv[i], "--form")) form = argv[i + 1];
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batch")) batch = std::atoi(argv[i + 1]);
  }
  if (model != "simple" && model != "lenet") {
    std::fprintf(stderr, "eager_bench: --model is simple or lenet, not '%s'\n", model.c_str());
    return 2;
  }
  if (form != "fused" && form != "apart") {
    std::fprintf(stderr, "eager_bench: --form is fused or apart, not '%s'\n", form.c_str());
    return 2;
  }
  try {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);  // as eager's default environment does (eager.h)
    EnvironmentOptions o;
    o.threads = threads;
    auto env = Environment::create(o);
    if (!env.is_ok()) {
      std::fprintf(stderr, "%s\n", env.status().to_string().c_str());
      return 1;
    }
    init(std::shared_ptr<Environment>(std::move(env).value()), threads);
    manual_seed(0);
    Model m;
    m.apart = form == "apart";
    if (model == "simple") m.p = {param({32, 1, 3, 3}, 9), param({32}, 9), param({10, 5408}, 5408), param({10}, 5408)};
    else
      m.p = {param({32, 1, 3, 3}, 9),  param({32}, 9),     param({64, 32, 3, 3}, 288), param({64}, 288),
             param({128, 9216}, 9216), param({128}, 9216), param({10, 128}, 128),      param({10}, 128)};
    Tensor x = randn({batch, 1, 28, 28});
    std::vector<int64_t> labels(static_cast<size_t>(batch));
    for (int i = 0; i < batch; ++i) labels[i] = i % 10;
    Tensor y = from_vector(labels, {batch});
    std::printf("%s forward+backward (%s), batch %d, %d threads, median of %d steps:\n",
                model == "simple" ? "SimpleCNN" : "LeNet-like",
                m.apart ? "conv2d, relu, max_pool2d called apart" : "fused ops", batch, threads, iters);
    double f32 = step_ms(m, x, y, DType::kUndefined, iters, true);
    std::printf("  fp32           %.3f ms/batch\n", f32);
    double bf16 = step_ms(m, x, y, DType::kBF16, iters, true);
    std::printf("  bf16 autocast  %.3f ms/batch\n", bf16);
    if (profiling()) std::printf("%s", profile_report().c_str());
    // Dispatch overhead: a tiny op, kernel instance cached.
    Tensor s = rand_uniform({8}, -1, 1);
    const int n = 20000;
    relu(s);
    DispatchStats d0 = dispatch_stats();
    double t0 = now_ms();
    for (int i = 0; i < n; ++i) relu(s);
    double t1 = now_ms();
    DispatchStats d1 = dispatch_stats();
    Tensor g = rand_uniform({8}, -1, 1).requires_grad_();
    double t2 = now_ms();
    for (int i = 0; i < n; ++i) relu(g);
    double t3 = now_ms();
    // The same through a reference kernel (no OpenMP region to wake): the dispatch path alone.
    call_op("", "Floor", {s});
    double c4 = cpu_ms(), t4 = now_ms();
    for (int i = 0; i < n; ++i) call_op("", "Floor", {s});
    double c5 = cpu_ms(), t5 = now_ms();
    std::printf(
        "dispatch overhead (Relu on 8 floats, oneDNN kernel): %.2f us/op without autograd, %.2f us/op recording "
        "a grad_fn (cache hits %llu of %llu)\n",
        (t1 - t0) * 1000.0 / n, (t3 - t2) * 1000.0 / n, static_cast<unsigned long long>(d1.cache_hits - d0.cache_hits),
        static_cast<unsigned long long>(d1.ops - d0.ops));
    std::printf("dispatch overhead (Floor on 8 floats, reference kernel): %.2f us/op wall, %.2f us/op CPU\n",
                (t5 - t4) * 1000.0 / n, (c5 - c4) * 1000.0 / n);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "eager_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
