// concurrent_bench — throughput of one session run by 1 thread vs by 2 threads at once, each run at 1 intra-op thread
// (session threads = 1), through the host C API: what concurrent runs on one session buy (issue 26, item 1).
//
//   concurrent_bench [--benchmark_* flags] [MODEL.onnx ...]
//
// Models: the given ONNX files; without any, the peers' SimpleCNN batch 32 and ResNet-18
// (/tmp/keel-peers/models/{simple_cnn_b32,resnet18}/model.onnx; regenerate with
// `/usr/bin/python3 /work/shared/peers/make_models.py --out /tmp/keel-peers/models`), or SimpleCNN batch 32 built in
// code when those are missing. Inputs are random, with the shapes the model declares (dynamic dims = 1).
// Each model gets BM_Runs/<model>/threads:1 and threads:2 (real time; items = runs), then one line per model (from
// items_per_second; the median with --benchmark_repetitions):
//   ratio <model>: 2 concurrent runs/s / 1-at-a-time runs/s = R (arena sets S, one copy of the weights)
// On a shared machine the ratio measures the other load as much as Keel: run it more than once
// (--benchmark_repetitions), or for a few seconds at real-time priority (`chrt -f 10 concurrent_bench`), which
// gives the 2 runs the cores the other processes were holding.
#include <benchmark/benchmark.h>
#include <keel/keel.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/base/graph.h"
#include "core/runtime/onnx_io.h"

namespace {

void check(keel_status_t s, const char* what) {
  if (s == nullptr) return;
  std::fprintf(stderr, "%s: %s: %s\n", what, keel_status_code_name(s->code), s->message);
  keel_status_release(s);
  std::exit(1);
}

std::string simple_cnn_b32() {
  using keel::Attribute;
  keel::GraphBuilder g("simple_cnn_b32", 17);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.f, 0.05f);
  auto rnd = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
  };
  auto x = g.input("x", keel::DType::kF32, {32, 3, 32, 32});
  auto c = g.op1("Conv",
                 {x, g.constant("w", keel::Tensor::f32({32, 3, 3, 3}, rnd(864))),
                  g.constant("b", keel::Tensor::f32({32}, rnd(32)))},
                 {{"kernel_shape", Attribute::of_ints({3, 3})}});
  auto p = g.op1("MaxPool", {g.op1("Relu", {c})},
                 {{"kernel_shape", Attribute::of_ints({2, 2})}, {"strides", Attribute::of_ints({2, 2})}});
  auto y = g.op1("Gemm",
                 {g.op1("Flatten", {p}), g.constant("fw", keel::Tensor::f32({10, 7200}, rnd(72000))),
                  g.constant("fb", keel::Tensor::f32({10}, rnd(10)))},
                 {{"transB", Attribute::of_int(1)}});
  g.output(y);
  auto s = keel::serialize_onnx(g.take());
  if (!s.is_ok()) {
    std::fprintf(stderr, "%s\n", s.status().to_string().c_str());
    std::exit(1);
  }
  return s.value();
}

struct Bench {
  std::string name;
  keel_model_t model = nullptr;
  keel_session_t session = nullptr;
  std::vector<std::string> input_names;
  std::vector<keel_host_tensor_t> inputs;
  size_t outputs = 0;
  std::map<int, double> runs_per_s;  // by benchmark threads: items_per_second as Google Benchmark reports it
};

keel_environment_t g_env = nullptr;
std::vector<std::unique_ptr<Bench>> g_benches;

void setup(Bench& b) {
  keel_session_options_t o = nullptr;
  check(keel_session_options_create(&o), "session options");
  check(keel_session_options_set_threads(o, 1), "threads");
  check(keel_session_create(g_env, b.model, o, &b.session), b.name.c_str());
  keel_session_options_release(o);
  size_t n = 0;
  check(keel_session_input_count(b.session, &n), "inputs");
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 1.f);
  for (size_t i = 0; i < n; ++i) {
    keel_value_info_t v{};
    v.struct_size = sizeof v;
    check(keel_session_input_info(b.session, i, &v), "input info");
    std::vector<int64_t> dims(v.dims, v.dims + std::max(v.ndim, 0));
    for (auto& x : dims) x = x < 0 ? 1 : x;
    keel_host_tensor_t t = nullptr;
    check(keel_host_tensor_create(v.dtype, dims.data(), static_cast<int32_t>(dims.size()), nullptr, 0, &t), "input");
    if (v.dtype == KEEL_DTYPE_F32) {
      float* p = static_cast<float*>(keel_host_tensor_data(t));
      for (int64_t k = 0; k < keel_host_tensor_element_count(t); ++k) p[k] = d(rng);
    }
    b.input_names.push_back(v.name);
    b.inputs.push_back(t);
  }
  check(keel_session_output_count(b.session, &b.outputs), "outputs");
}

void run_once(Bench& b) {
  std::vector<const char*> names;
  for (const auto& s : b.input_names) names.push_back(s.c_str());
  std::vector<keel_host_tensor_t> outs(b.outputs, nullptr);
  check(keel_session_run(b.session, names.data(), b.inputs.data(), b.inputs.size(), nullptr, outs.data(), outs.size()),
        b.name.c_str());
  for (auto t : outs) keel_host_tensor_release(t);
}

void BM_Runs(benchmark::State& state, Bench* b) {
  int64_t runs = 0;
  for (auto _ : state) {
    run_once(*b);
    ++runs;
  }
  state.SetItemsProcessed(runs);
}

// The console output, and each benchmark's runs/s (items_per_second, all threads) kept for the ratio lines.
class Capture : public benchmark::ConsoleReporter {
 public:
  Capture() : ConsoleReporter(OO_Tabular) {}  // no colour codes (the output usually goes to a log)
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      // A repetition's value, then (with --benchmark_repetitions) the median, which is reported after them.
      if (r.error_occurred || (r.run_type == Run::RT_Aggregate && r.aggregate_name != "median")) continue;
      auto c = r.counters.find("items_per_second");
      if (c == r.counters.end()) continue;
      for (auto& b : g_benches)
        if (r.run_name.function_name == "BM_Runs/" + b->name) b->runs_per_s[static_cast<int>(r.threads)] = c->second;
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  keel_environment_options_t eo = nullptr;
  check(keel_environment_options_create(&eo), "environment options");
#ifdef KEEL_PLUGIN_DIR_DEFAULT
  if (std::filesystem::exists(KEEL_PLUGIN_DIR_DEFAULT))
    check(keel_environment_options_add_plugin_path(eo, KEEL_PLUGIN_DIR_DEFAULT), "plugin path");
#endif
  check(keel_environment_create(eo, &g_env), "environment");
  keel_environment_options_release(eo);

  std::vector<std::string> paths(argv + 1, argv + argc);
  if (paths.empty())
    for (const char* p :
         {"/tmp/keel-peers/models/simple_cnn_b32/model.onnx", "/tmp/keel-peers/models/resnet18/model.onnx"})
      if (std::filesystem::exists(p)) paths.emplace_back(p);
  if (paths.empty()) {
    auto b = std::make_unique<Bench>();
    b->name = "simple_cnn_b32(in code)";
    const std::string bytes = simple_cnn_b32();
    check(keel_model_load_from_memory(bytes.data(), bytes.size(), &b->model), "model");
    g_benches.push_back(std::move(b));
  }
  for (const auto& p : paths) {
    auto b = std::make_unique<Bench>();
    std::filesystem::path fp(p);
    b->name = fp.filename() == "model.onnx" ? fp.parent_path().filename().string() : fp.stem().string();
    check(keel_model_load_from_file(p.c_str(), &b->model), p.c_str());
    g_benches.push_back(std::move(b));
  }
  for (auto& b : g_benches) {
    setup(*b);
    run_once(*b);  // the first run plans memory (and oneDNN picks implementations)
    benchmark::RegisterBenchmark(("BM_Runs/" + b->name).c_str(), BM_Runs, b.get())
        ->Threads(1)
        ->Threads(2)
        ->UseRealTime()
        ->MinTime(2.0);
  }
  Capture capture;
  benchmark::RunSpecifiedBenchmarks(&capture);
  for (auto& b : g_benches) {
    keel_session_memory_info_t m{};
    m.struct_size = sizeof m;
    check(keel_session_memory_info(b->session, &m), "memory info");
    if (b->runs_per_s.count(1) && b->runs_per_s.count(2))
      std::printf(
          "ratio %s: 2 concurrent runs/s %.2f / 1-at-a-time runs/s %.2f = %.2fx (arena sets %llu, one "
          "copy of the weights)\n",
          b->name.c_str(), b->runs_per_s[2], b->runs_per_s[1], b->runs_per_s[2] / b->runs_per_s[1],
          static_cast<unsigned long long>(m.arena_sets));
    for (auto t : b->inputs) keel_host_tensor_release(t);
    keel_session_release(b->session);
    keel_model_release(b->model);
  }
  keel_environment_release(g_env);
  benchmark::Shutdown();
  return 0;
}
