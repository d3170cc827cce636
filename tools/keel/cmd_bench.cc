// `keel bench MODEL.onnx` — latency of a model: median, p90, mean, min, throughput, peak resident memory, planned
// activation arena, the per-device memory pools (CachingAllocator statistics; --trim gives their cached segments
// back and reports the release), and (--profile) a per-op-type time breakdown from Session::profile().
//
// Inputs are random (normal floats, small non-negative integers), made once before the timed runs. `--batch N`
// sets the first dimension of every input whose first dimension is dynamic or 1, and re-infers the shapes.
// `--threads` is the global flag (the environment's thread count; the oneDNN plugin follows it).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/base/thread_pool.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "tools/keel/commands.h"
#include "tools/keel/memory_report.h"

namespace keel::cli {
namespace {

struct BenchArgs {
  std::string model;
  std::string precision = "fp32";
  std::string device;
  int batch = 0;
  int warmup = 5;
  int iters = 50;
  double max_seconds = 0;  // stop the timed runs after this long (0 = no limit)
  bool json = false;
  bool profile = false;
  bool trim = false;  // after the runs, give the pools' cached segments back and report what that released
  std::string passes = "auto";
};


double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // Linux: kilobytes
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double pos = q * (v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

int bench(const BenchArgs& a, Globals& g) {
  auto loaded = load_onnx(a.model);
  if (!loaded.is_ok()) {
    std::cerr << "keel bench: " << loaded.status().to_string() << "\n";
    return 1;
  }
  Graph graph = std::move(loaded).value();
  int64_t batch = 0;
  if (a.batch > 0) {
    // Only the inputs' first dimension changes; every other shape is inferred again.
    bool changed = false;
    for (const auto& name : graph.inputs) {
      ValueInfo& vi = graph.value_info[name];
      if (!vi.shape || vi.shape->empty()) continue;
      if ((*vi.shape)[0] < 0 || (*vi.shape)[0] == 1 || (*vi.shape)[0] == a.batch) {
        (*vi.shape)[0] = a.batch;
        changed = true;
      }
    }
    if (!changed) {
      std::cerr << "keel bench: --batch: no input has a dynamic or unit first dimension\n";
      return 1;
    }
    std::unordered_map<std::string, bool> keep;
    for (const auto& n : graph.inputs) keep[n] = true;
    for (const auto& [n, t] : graph.initializers) keep[n] = true;
    for (auto& [n, vi] : graph.value_info)
      if (!keep.count(n)) vi.shape.reset();
    batch = a.batch;
  }
  std::mt19937 rng(0);
  std::vector<std::pair<std::string, Tensor>> inputs;
  for (const auto& name : graph.inputs) {
    const ValueInfo* vi = graph.info(name);
    if (!vi || vi->dtype == DType::kUndefined) {
      std::cerr << "keel bench: input '" << name << "' has no known tensor type\n";
      return 1;
    }
    Shape shape = vi->shape.value_or(Shape{});
    for (auto& d : shape)
      if (d < 0) d = 1;
    if (batch == 0 && !shape.empty()) batch = shape[0];
    auto t = random_input(vi->dtype, shape, rng);
    if (!t.is_ok()) {
      std::cerr << "keel bench: input '" << name << "': " << t.status().to_string() << "\n";
      return 1;
    }
    inputs.emplace_back(name, std::move(t).value());
  }
  if (batch <= 0) batch = 1;

  auto env = make_environment(g);
  if (!env) return 1;
  SessionOptions so;
  if (!a.device.empty()) so.devices = {a.device};
  so.passes = session_passes(a.passes, graph, *env);
  if (Status st = append_precision_pass(a.precision, a.passes == "auto", *env, so.passes); !st.is_ok()) {
    std::cerr << "keel bench: " << st.to_string() << "\n";
    return 1;
  }
  so.profile = a.profile;
  auto t_create = std::chrono::steady_clock::now();
  auto session = Session::create(*env, std::move(graph), so);
  double create_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_create).count();
  if (!session.is_ok()) {
    std::cerr << "keel bench: " << session.status().to_string() << "\n";
    return 1;
  }
  Session& s = **session;
  auto run_once = [&]() -> bool {
    auto r = s.run(inputs);
    if (!r.is_ok()) {
      std::cerr << "keel bench: " << r.status().to_string() << "\n";
      return false;
    }
    return true;
  };
  for (int i = 0; i < a.warmup; ++i)
    if (!run_once()) return 1;
  std::vector<double> times;
  auto t_start = std::chrono::steady_clock::now();
  for (int i = 0; i < a.iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    if (!run_once()) return 1;
    auto t1 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (a.max_seconds > 0 && std::chrono::duration<double>(t1 - t_start).count() > a.max_seconds) break;
  }
  double sum = 0;
  for (double t : times) sum += t;
  const double median = percentile(times, 0.5), p90 = percentile(times, 0.9), mean = sum / times.size();
  const double minimum = *std::min_element(times.begin(), times.end());
  const double throughput = median > 0 ? batch * 1000.0 / median : 0;
  uint64_t arena = 0;
  auto arenas = s.planned_arena_bytes();
  for (const auto& [k, v] : arenas) arena += v;
  uint64_t workspace = 0;
  auto workspaces = s.workspace_bytes();
  for (const auto& [k, v] : workspaces) workspace += v;
  int threads = env->thread_pool().thread_count();

  // Kernels per op type (where oneDNN ran and where the reference did) and the profile.
  std::map<std::string, std::map<std::string, int>> kernels;  // op -> kernel -> nodes
  for (const auto& [node, op, dev, kernel] : s.placement()) kernels[op][dev + ":" + kernel]++;
  struct OpTime { double ms = 0; int nodes = 0; };
  std::map<std::string, OpTime> by_op;
  double profiled_total = 0;
  if (a.profile) {
    for (const auto& p : s.profile()) {
      if (p.calls == 0) continue;
      double per_run = p.total_ms / p.calls;
      by_op[p.op_type].ms += per_run;
      by_op[p.op_type].nodes++;
      profiled_total += per_run;
    }
  }
  const nlohmann::json memory = memory_stats_json(*env);  // the device pools after the runs
  const int64_t trimmed = a.trim ? static_cast<int64_t>(env->trim_memory()) : -1;
  std::vector<std::pair<std::string, OpTime>> ops(by_op.begin(), by_op.end());
  std::sort(ops.begin(), ops.end(), [](const auto& x, const auto& y) { return x.second.ms > y.second.ms; });

  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model;
    j["device"] = a.device.empty() ? "auto" : a.device;
    j["precision"] = a.precision;
    j["threads"] = threads;
    j["batch"] = batch;
    j["warmup"] = a.warmup;
    j["iters"] = times.size();
    j["session_create_ms"] = create_ms;
    j["median_ms"] = median;
    j["p90_ms"] = p90;
    j["mean_ms"] = mean;
    j["min_ms"] = minimum;
    j["throughput_per_s"] = throughput;
    j["peak_rss_mib"] = peak_rss_mib();
    j["planned_arena_bytes"] = arena;
    j["kernel_workspace_bytes"] = workspace;
    j["fallbacks"] = s.fallbacks().size();
    nlohmann::json jk;
    for (const auto& [op, m] : kernels)
      for (const auto& [k, n] : m) jk[op][k] = n;
    j["kernels"] = jk;
    j["memory"] = memory;
    if (trimmed >= 0) {
      j["trim_released_bytes"] = trimmed;
      j["memory_after_trim"] = memory_stats_json(*env);
    }
    if (a.profile) {
      nlohmann::json jp = nlohmann::json::array();
      for (const auto& [op, t] : ops) jp.push_back({{"op_type", op}, {"ms", t.ms}, {"nodes", t.nodes}});
      j["profile"] = jp;
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << std::fixed << std::setprecision(3);
  std::cout << "model      " << a.model << "\n";
  std::cout << "device     " << (a.device.empty() ? "auto" : a.device) << ", " << threads << " thread(s), batch " << batch
            << "\n";
  std::cout << "session    created in " << create_ms << " ms; " << s.fallbacks().size() << " fallback(s)\n";
  std::cout << "latency    median " << median << " ms, p90 " << p90 << " ms, mean " << mean << " ms, min " << minimum
            << " ms (" << times.size() << " runs after " << a.warmup << " warm-up)\n";
  std::cout << "throughput " << std::setprecision(1) << throughput << " samples/s\n";
  std::cout << "memory     peak resident " << peak_rss_mib() << " MiB; planned activation arena "
            << std::setprecision(3) << arena / (1024.0 * 1024.0) << " MiB";
  for (const auto& [k, v] : arenas) std::cout << " (" << k << " " << v << " B)";
  std::cout << " + kernel workspace " << workspace / (1024.0 * 1024.0) << " MiB";
  for (const auto& [k, v] : workspaces) std::cout << " (" << k << " " << v << " B)";
  std::cout << "\npools (per device, after the runs):\n";
  print_memory_stats(std::cout, memory, "  ");
  if (trimmed >= 0) {
    std::cout << "trim       released " << std::setprecision(1) << trimmed / 1048576.0 << " MiB; now:\n"
              << std::setprecision(3);
    print_memory_stats(std::cout, memory_stats_json(*env), "  ");
  }
  std::cout << "kernels   ";
  for (const auto& [op, m] : kernels)
    for (const auto& [k, n] : m) std::cout << " " << op << "=" << k << "x" << n;
  std::cout << "\n";
  if (a.profile) {
    std::cout << "profile (per run, by op type; timings include the profiler's overhead):\n";
    for (const auto& [op, t] : ops)
      std::cout << "  " << std::left << std::setw(24) << op << std::right << std::setw(10) << t.ms << " ms "
                << std::setw(6) << std::setprecision(1) << (profiled_total > 0 ? 100 * t.ms / profiled_total : 0)
                << "%  " << t.nodes << " node(s)\n"
                << std::setprecision(3);
    std::cout << "  " << std::left << std::setw(24) << "total" << std::right << std::setw(10) << profiled_total << " ms\n";
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, Globals& g) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand("bench", "Measure a model's latency, throughput and memory on random inputs");
  cmd->add_option("model", a->model, "The model (.onnx)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--passes", a->passes,
                  "Session passes: auto (fuse_qdq for QDQ models: int8 kernels), none, or a comma list");
  add_precision_option(cmd, a->precision);
  cmd->add_option("--device,-d", a->device, "Preferred device type (cpu, cuda, ...); default: every device by priority");
  cmd->add_option("--threads", g.threads, "Worker threads for kernels (0 = all cores)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch,-b", a->batch, "Batch size, where an input's first dimension is dynamic or 1")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--warmup", a->warmup, "Untimed runs first")->check(CLI::NonNegativeNumber);
  cmd->add_option("--iters,-n", a->iters, "Timed runs")->check(CLI::PositiveNumber);
  cmd->add_option("--max-seconds", a->max_seconds, "Stop the timed runs after this many seconds (0 = no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--json", a->json, "Print the results as JSON");
  cmd->add_flag("--profile", a->profile, "Per-op-type time breakdown (Session profile)");
  cmd->add_flag("--trim", a->trim, "After the runs, trim the device memory pools and report what was released");
  cmd->callback([a, &g] {
    int rc = bench(*a, g);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace keel::cli
