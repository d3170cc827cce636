// keel_microbench — Google Benchmark microbenchmarks of the hot kernels and of per-op dispatch.
//
//   BM_Conv/<impl>/...      a 3x3 convolution (ResNet-18's 64- and 256-channel layers) as a one-node session
//   BM_MatMul/<impl>/...    M x K x N matmul with constant weights (a linear layer)
//   BM_Dispatch/<impl>/100  a chain of 100 Relu nodes on an 8-float tensor: per-op overhead of the executor
// <impl> 0 = the reference kernels only (an environment without plugins), 1 = with plugins (oneDNN when built).
// Counters: FLOP/s for the kernels, ns/op for the dispatch chain. Keep runs short on shared machines:
//   keel_microbench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <memory>
#include <random>

#include "core/base/graph.h"
#include "core/runtime/environment.h"
#include "core/runtime/session.h"

namespace keel {
namespace {

Environment& env(bool plugins) {
  static std::unique_ptr<Environment> with, without;
  auto& e = plugins ? with : without;
  if (!e) {
    EnvironmentOptions o;
    o.discover_plugins = plugins;
    e = std::move(Environment::create(o)).value();
  }
  return *e;
}

Tensor random(Shape s, uint32_t seed) {
  Tensor t = Tensor::host(DType::kF32, s).value();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

void run_session(benchmark::State& state, Graph g, std::vector<std::pair<std::string, Tensor>> feeds, bool plugins) {
  SessionOptions so;
  so.devices = {"cpu"};
  auto s = Session::create(env(plugins), std::move(g), so);
  if (!s.is_ok()) {
    state.SkipWithError(s.status().to_string().c_str());
    return;
  }
  std::string kernel;
  for (const auto& [n, op, dev, k] : (*s)->placement()) kernel = k;
  state.SetLabel(kernel);
  for (auto _ : state) {
    auto r = (*s)->run(feeds);
    if (!r.is_ok()) {
      state.SkipWithError(r.status().to_string().c_str());
      return;
    }
  }
}

void BM_Conv(benchmark::State& state) {
  const bool plugins = state.range(0) != 0;
  const int64_t C = state.range(1), H = state.range(2);
  GraphBuilder b("conv");
  auto x = b.input("X", DType::kF32, {1, C, H, H});
  auto w = b.constant("W", random({C, C, 3, 3}, 1));
  auto bias = b.constant("B", random({C}, 2));
  b.output(b.op1("Conv", {x, w, bias}, {{"pads", Attribute::of_ints({1, 1, 1, 1})}}));
  run_session(state, b.take(), {{"X", random({1, C, H, H}, 3)}}, plugins);
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * C * C * 9 * H * H, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Conv)
    ->ArgNames({"impl", "C", "H"})
    ->Args({0, 64, 56})
    ->Args({1, 64, 56})
    ->Args({0, 256, 14})
    ->Args({1, 256, 14})
    ->Unit(benchmark::kMillisecond);

void BM_MatMul(benchmark::State& state) {
  const bool plugins = state.range(0) != 0;
  const int64_t M = state.range(1), K = state.range(2), N = state.range(3);
  GraphBuilder b("matmul");
  auto a = b.input("A", DType::kF32, {M, K});
  auto w = b.constant("B", random({K, N}, 1));
  b.output(b.op1("MatMul", {a, w}));
  run_session(state, b.take(), {{"A", random({M, K}, 2)}}, plugins);
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * M * K * N, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MatMul)
    ->ArgNames({"impl", "M", "K", "N"})
    ->Args({0, 128, 256, 256})
    ->Args({1, 128, 256, 256})
    ->Args({0, 1, 512, 1000})
    ->Args({1, 1, 512, 1000})
    ->Unit(benchmark::kMicrosecond);

void BM_Dispatch(benchmark::State& state) {
  const bool plugins = state.range(0) != 0;
  const int64_t nodes = state.range(1);
  GraphBuilder b("relu_chain");
  std::string v = b.input("X", DType::kF32, {8});
  for (int64_t i = 0; i < nodes; ++i) v = b.op1("Relu", {v});
  b.output(v);
  run_session(state, b.take(), {{"X", random({8}, 1)}}, plugins);
  // Inverted rate of (nodes * 1e-9) per iteration = nanoseconds per node.
  state.counters["ns/op"] = benchmark::Counter(
      static_cast<double>(nodes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_Dispatch)->ArgNames({"impl", "nodes"})->Args({0, 100})->Args({1, 100})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace keel

BENCHMARK_MAIN();
