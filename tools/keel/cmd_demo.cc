// `keel demo` — the main job before `keel train` took over: list the plugins, build PaddlePaddle's introductory
// SimpleCNN in code (Conv2D(3,32,3) → ReLU → MaxPool2D(2) → flatten → Linear(32·15·15,10)), run it on every device
// type that can, and check each against the reference CPU device.
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <random>

#include "core/runtime/session.h"
#include "tools/keel/commands.h"

namespace keel::cli {
namespace {

Tensor random_tensor(Shape shape, float scale, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (auto& x : v) x = dist(rng);
  return Tensor::f32(std::move(shape), v);
}

}  // namespace

// Built with random weights (fixed seed) at batch `batch`.
Graph build_simple_cnn(int64_t batch) {
  std::mt19937 rng(42);
  GraphBuilder b("simple_cnn", 17);
  auto x = b.input("image", DType::kF32, {batch, 3, 32, 32});
  auto w = b.constant("conv.weight", random_tensor({32, 3, 3, 3}, 0.2f, rng));
  auto bias = b.constant("conv.bias", random_tensor({32}, 0.1f, rng));
  auto conv = b.op1("Conv", {x, w, bias}, {{"kernel_shape", Attribute::of_ints({3, 3})}});
  auto relu = b.op1("Relu", {conv});
  auto pool =
      b.op1("MaxPool", {relu}, {{"kernel_shape", Attribute::of_ints({2, 2})}, {"strides", Attribute::of_ints({2, 2})}});
  auto flat = b.op1("Flatten", {pool}, {{"axis", Attribute::of_int(1)}});
  auto fw = b.constant("fc.weight", random_tensor({10, 32 * 15 * 15}, 0.01f, rng));
  auto fb = b.constant("fc.bias", random_tensor({10}, 0.1f, rng));
  auto logits = b.op1("Gemm", {flat, fw, fb}, {{"transB", Attribute::of_int(1)}});
  b.output(logits);
  return b.take();
}

void add_demo_command(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("demo", "Build the SimpleCNN in code and run it on every device (the main job)");
  auto batch = std::make_shared<int64_t>(1);
  auto iters = std::make_shared<int>(20);
  cmd->add_option("--batch", *batch, "Batch size")->check(kPositive);
  cmd->add_option("--iters", *iters, "Timed iterations per device")->check(kPositive);
  cmd->callback([&g, batch, iters] {
    auto env = make_environment(g);
    if (!env) throw CLI::RuntimeError(1);
    std::cout << "Plugins:\n";
    for (const auto& p : env->plugins()) {
      std::cout << "  " << std::left << std::setw(16) << p.name << std::setw(8) << plugin_state_name(p.state)
                << (p.reason.empty() ? "" : "  " + p.reason) << "\n";
    }
    std::mt19937 rng(7);
    Tensor image = random_tensor({*batch, 3, 32, 32}, 1.0f, rng);
    std::cout << "\nSimpleCNN: Conv2D(3,32,3) -> ReLU -> MaxPool2D(2) -> flatten -> Linear(7200,10), batch " << *batch
              << "\n";
    // The oracle: the same model on the reference kernels alone (no plugins).
    std::vector<float> reference;
    {
      EnvironmentOptions ref_opts;
      ref_opts.discover_plugins = false;
      ref_opts.threads = g.threads;
      auto ref_env = Environment::create(ref_opts);
      if (!ref_env.is_ok()) throw CLI::RuntimeError(1);
      auto ref = Session::create(*ref_env.value(), build_simple_cnn(*batch));
      auto out = ref.is_ok() ? ref.value()->run({{"image", image}}) : StatusOr<std::vector<Tensor>>(ref.status());
      if (!out.is_ok()) {
        std::cout << "  reference kernels cannot run the model: " << out.status().to_string() << "\n";
        throw CLI::RuntimeError(1);
      }
      const float* y = out.value()[0].data<float>();
      reference.assign(y, y + out.value()[0].numel());
    }
    int failures = 0;
    // The CPU first: its output is what every other device is compared with.
    std::vector<std::string> devices = {"cpu"};
    for (const auto& d : env->registry().device_types())
      if (d != "cpu") devices.push_back(d);
    for (const auto& dev : devices) {
      SessionOptions opts;
      opts.devices = {dev};
      auto session = Session::create(*env, build_simple_cnn(*batch), opts);
      // A device that cannot run the model (a skeleton plugin, a missing kernel) is reported, not fatal; only
      // the reference CPU must run, and every device that runs must agree with it.
      if (!session.is_ok()) {
        std::cout << "  " << std::left << std::setw(8) << dev << " cannot run: " << session.status().to_string()
                  << "\n";
        if (dev == "cpu") ++failures;
        continue;
      }
      auto& s = *session.value();
      auto first = s.run({{"image", image}});
      if (!first.is_ok()) {
        std::cout << "  " << std::left << std::setw(8) << dev << " cannot run: " << first.status().to_string() << "\n";
        if (dev == "cpu") ++failures;
        continue;
      }
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < *iters; ++i) {
        auto r = s.run({{"image", image}});
        if (!r.is_ok()) throw CLI::RuntimeError(1);
      }
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / *iters;
      const Tensor& out = first.value()[0];
      const float* y = out.data<float>();
      std::vector<float> values(y, y + out.numel());
      double max_diff = 0;
      for (size_t i = 0; i < values.size(); ++i)
        max_diff = std::max(max_diff, (double)std::fabs(values[i] - reference[i]));
      int argmax = static_cast<int>(std::max_element(y, y + 10) - y);
      std::cout << "  " << std::left << std::setw(8) << dev << " output " << out.describe() << "  class " << argmax
                << "  " << std::fixed << std::setprecision(3) << ms << " ms/run"
                << "  max |diff| vs reference " << std::scientific << std::setprecision(2) << max_diff
                << std::defaultfloat << "  fallbacks " << s.fallbacks().size() << "\n           kernels:";
      for (const auto& [node, op, device, kernel] : s.placement()) std::cout << " " << kernel;
      std::cout << "\n";
      if (max_diff > 1e-3) ++failures;
    }
    auto stats = env->memory_stats();
    for (const auto& [k, st] : stats) {
      std::cout << "memory " << k << ": in use " << st.in_use_bytes << " B, reserved " << st.reserved_bytes
                << " B, peak " << st.peak_in_use_bytes << " B, cache hits " << st.cache_hits << "/" << st.allocations
                << "\n";
    }
    if (failures) throw CLI::RuntimeError(1);
  });
}

}  // namespace keel::cli
