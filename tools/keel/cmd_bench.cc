// `keel bench MODEL.onnx` — latency of a model: median, p90, mean, min, throughput, peak resident memory, planned
// activation arena, the per-device memory pools (CachingAllocator statistics; --trim gives their cached segments
// back and reports the release), and (--profile) a per-op-type time breakdown from Session::profile(): steps that a
// claimed subgraph reported (plugin ABI 1.3, e.g. the oneDNN chains' primitives) count under the ONNX op types they
// compute (profile_by_op_type); --profile-nodes N adds the N slowest nodes / reported steps. The work of a run
// (model_work.h: GFLOP of Conv/Gemm/MatMul) gives GFLOP/s, and with keel-host-limits' JSON the fraction of the host's
// peak at the threads used (fraction_of_peak; a --precision bf16 run against the bf16 dot products' peak where the
// host has no AMX).
//
// Inputs are random (normal floats, small non-negative integers), made once before the timed runs. `--batch N`
// sets the first dimension of every input whose first dimension is dynamic or 1, and re-infers the shapes;
// `--shape NAME=D0,D1,...` picks the run shape of an input with dynamic dims and leaves the model dynamic.
// `--threads` is the global flag (the environment's thread count; the oneDNN plugin follows it).
// `--concurrency N` runs the one session from N threads at once (each run with `--threads` threads, as a server's N
// instances would): every caller makes one untimed run first (its OpenMP team), then they start together and share
// the `--iters` budget; throughput is then the completed runs over the wall time, latency percentiles are per run.
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <latch>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "core/base/thread_pool.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "tools/host_limits/host_limits_file.h"
#include "tools/keel/commands.h"
#include "tools/keel/memory_report.h"
#include "tools/keel/model_work.h"

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
  int concurrency = 1;     // callers running the session at once
  bool json = false;
  bool profile = false;
  int profile_nodes = 0;  // with the profile: the N slowest nodes / reported steps
  bool trim = false;      // after the runs, give the pools' cached segments back and report what that released
  std::string passes = "auto";
  int shape_variants = SessionOptions{}.shape_variants;
  std::vector<std::string> shapes;  // NAME=D0,D1,...: the shape of an input's random tensor (dynamic dims)
  std::string host_limits;          // keel-host-limits' JSON ("" = $KEEL_HOST_LIMITS, then its default file)
};

// The host's peaks as keel-host-limits saved them, for "fraction_of_peak" (empty when there is no such file).
struct HostLimits {
  std::string file;
  double fp32_per_core = 0, fp32_all = 0, int8_per_core = 0, int8_all = 0;
  double bf16_per_core = 0, bf16_all = 0;  // vdpbf16ps (0 where the CPU has no AVX-512 BF16 or the file predates it)
  bool amx_bf16 = false;                   // AMX present: bf16's peak is its (not measured)
  int cpus = 0;

  bool known() const { return fp32_per_core > 0; }
  // The peak at `threads` threads: per core x threads, but never above what every core together reached; past the
  // CPUs the file was measured on (keel-host-limits under a narrower affinity mask), per core x threads.
  double fp32_at(int threads) const { return at(fp32_per_core, fp32_all, threads); }
  double int8_at(int threads) const { return at(int8_per_core, int8_all, threads); }
  // The peak a --precision bf16 run's float work is held to: the bf16 dot products' where they were measured and
  // the CPU has no AMX, else fp32's (AMX's is not measured; without AVX-512 BF16 oneDNN converts to fp32).
  double bf16_at(int threads) const {
    return bf16_per_core > 0 && !amx_bf16 ? at(bf16_per_core, bf16_all, threads) : fp32_at(threads);
  }
  bool extrapolated(int threads) const { return cpus > 0 && threads > cpus; }

 private:
  double at(double one, double all, int threads) const {
    if (extrapolated(threads) || all <= 0) return one * threads;
    return threads >= cpus ? all : std::min(one * threads, all);
  }
};

// Reads `asked` (an error when it cannot), else $KEEL_HOST_LIMITS, else keel-host-limits' default file (absent:
// no limits, no error).
StatusOr<HostLimits> read_host_limits(const std::string& asked) {
  std::string file = asked;
  if (file.empty())
    if (const char* e = std::getenv("KEEL_HOST_LIMITS"); e && *e) file = e;
  const bool required = !file.empty();
  if (file.empty()) {
    file = default_host_limits_file().string();
    if (file.empty() || !std::filesystem::exists(file)) return HostLimits{};
  }
  std::ifstream in(file);
  if (!in)
    return required ? not_found("host limits file '" + file + "' cannot be read") : StatusOr<HostLimits>(HostLimits{});
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    HostLimits h;
    h.file = file;
    h.cpus = j.value("cpus", 0);
    h.fp32_per_core = j.value("fp32_gflops_per_core", 0.0);
    h.fp32_all = j.value("fp32_gflops_all_cores", 0.0);
    h.int8_per_core = j.value("int8_gops_per_core", 0.0);
    h.int8_all = j.value("int8_gops_all_cores", 0.0);
    h.bf16_per_core = j.value("bf16_gflops_per_core", 0.0);
    h.bf16_all = j.value("bf16_gflops_all_cores", 0.0);
    h.amx_bf16 = j.value("amx_bf16", false);
    if (!h.known()) return invalid_argument("host limits file '" + file + "' has no fp32_gflops_per_core");
    return h;
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument("host limits file '" + file + "' is not keel-host-limits' JSON: " + e.what());
  }
}

// CPU seconds (user + system) this process has used so far, every thread included.
double process_cpu_s() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

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
  if (a.concurrency > 1 && (a.profile || a.profile_nodes > 0)) {
    std::cerr << "keel bench: --profile times one run at a time: drop --concurrency " << a.concurrency
              << " or --profile\n";
    return 1;
  }
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
  // --shape: run shapes for inputs with dynamic dims (the model stays dynamic: the session specialises to them).
  std::map<std::string, Shape> run_shapes;
  for (const auto& spec : a.shapes) {
    const auto eq = spec.find('=');
    const std::string name = spec.substr(0, eq);
    const ValueInfo* vi = graph.info(name);
    if (eq == std::string::npos || !graph.is_graph_input(name) || vi == nullptr) {
      std::cerr << "keel bench: --shape " << spec << ": expected NAME=D0,D1,... naming a model input\n";
      return 1;
    }
    Shape shape;
    std::stringstream ss(spec.substr(eq + 1));
    std::string item;
    bool ok = true;
    while (std::getline(ss, item, ',')) {
      try {
        size_t used = 0;
        shape.push_back(std::stoll(item, &used));
        ok = ok && used == item.size() && shape.back() >= 0;
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (ok && vi->shape) {
      ok = vi->shape->size() == shape.size();
      for (size_t i = 0; ok && i < shape.size(); ++i) ok = (*vi->shape)[i] < 0 || (*vi->shape)[i] == shape[i];
    }
    if (!ok) {
      std::cerr << "keel bench: --shape " << spec << ": not a shape the model takes for '" << name << "' ("
                << (vi->shape ? shape_to_string(*vi->shape) : std::string("any rank")) << ")\n";
      return 1;
    }
    run_shapes[name] = shape;
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
    if (auto it = run_shapes.find(name); it != run_shapes.end()) shape = it->second;
    bool dynamic = false;
    for (auto& d : shape)
      if (d < 0) d = 1, dynamic = true;
    if (dynamic) run_shapes[name] = shape;  // the work is counted on the shapes the runs use
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
  auto device = device_option(*env, a.device);
  if (!device.is_ok()) {
    std::cerr << "keel bench: --device: " << device.status().to_string() << "\n";
    return 1;
  }
  if (!device->empty()) so.devices = {*device};
  so.passes = session_passes(a.passes, graph, *env);
  if (Status st = append_precision_pass(a.precision, a.passes == "auto", *env, so.passes); !st.is_ok()) {
    std::cerr << "keel bench: " << st.to_string() << "\n";
    return 1;
  }
  so.profile = a.profile || a.profile_nodes > 0;
  so.shape_variants = a.shape_variants;
  auto limits = read_host_limits(a.host_limits);
  if (!limits.is_ok()) {
    std::cerr << "keel bench: --host-limits: " << limits.status().to_string() << "\n";
    return 1;
  }
  // The work of one run, counted on the shapes the runs use (the weights are shared, not copied).
  ModelWork work;
  {
    Graph counted = graph;
    bool reinfer = a.batch > 0;
    for (const auto& [name, shape] : run_shapes) {
      counted.value_info[name].shape = shape;
      reinfer = true;
    }
    if (!reinfer || infer_shapes(counted).is_ok()) work = model_work(counted);
  }
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
  s.reset_profile();  // the profile covers the timed runs only (a first run may build plans)
  using Clock = std::chrono::steady_clock;
  // The timed runs of one caller: claimed from one budget (--iters counts every run once, whatever the callers),
  // until it is spent, --max-seconds has passed since t_start, or a run failed.
  std::atomic<int> claimed{0};
  std::atomic<bool> stop{false}, failed{false};
  Clock::time_point t_start;
  double cpu_start = 0;
  auto timed_runs = [&](std::vector<double>& out) {
    while (!stop && !failed && claimed.fetch_add(1) < a.iters) {
      auto t0 = Clock::now();
      if (!run_once()) {
        failed = true;
        break;
      }
      auto t1 = Clock::now();
      out.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      if (a.max_seconds > 0 && std::chrono::duration<double>(t1 - t_start).count() > a.max_seconds) stop = true;
    }
  };
  std::vector<double> times;
  if (a.concurrency <= 1) {
    t_start = Clock::now();
    cpu_start = process_cpu_s();
    timed_runs(times);
  } else {
    // N callers on the one session, started together once each has made an untimed run (its OpenMP team).
    std::latch warmed(a.concurrency), go(1);
    std::mutex mu;  // guards times
    std::vector<std::thread> callers;
    callers.reserve(static_cast<size_t>(a.concurrency));
    for (int c = 0; c < a.concurrency; ++c)
      callers.emplace_back([&] {
        if (!run_once()) failed = true;
        warmed.count_down();
        go.wait();
        std::vector<double> mine;
        timed_runs(mine);
        std::lock_guard<std::mutex> lk(mu);
        times.insert(times.end(), mine.begin(), mine.end());
      });
    warmed.wait();
    t_start = Clock::now();  // the callers read it after go releases them
    cpu_start = process_cpu_s();
    go.count_down();
    for (auto& t : callers) t.join();
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  // What a run costs in CPU time, all threads together (OpenMP threads spinning between regions count too), over the
  // timed runs: comparable with a server's CPU time per request (tools/serve_load.sh's srv_cpu_ms).
  const double cpu_s = process_cpu_s() - cpu_start;
  if (failed) return 1;
  double sum = 0;
  for (double t : times) sum += t;
  const double median = percentile(times, 0.5), p90 = percentile(times, 0.9), mean = sum / times.size();
  const double minimum = *std::min_element(times.begin(), times.end());
  // One caller: from the median run (steady against a stray slow run). Several: what they completed together.
  const double wall_throughput = wall_s > 0 ? static_cast<double>(batch * times.size()) / wall_s : 0;
  const double throughput = a.concurrency <= 1 ? (median > 0 ? batch * 1000.0 / median : 0) : wall_throughput;
  uint64_t arena = 0;
  auto arenas = s.planned_arena_bytes();
  for (const auto& [k, v] : arenas) arena += v;
  uint64_t workspace = 0;
  auto workspaces = s.workspace_bytes();
  for (const auto& [k, v] : workspaces) workspace += v;
  int threads = env->thread_pool().thread_count();
  // Kernels per op type (where oneDNN ran and where the reference did) and the profile.
  std::map<std::string, std::map<std::string, int>> kernels;  // op -> kernel -> nodes
  std::string variant;     // the shape variant the runs used ("" = the graph as created)
  bool all_on_cpu = true;  // the host's limits describe its CPUs: no fraction for a run on another device
  for (const auto& [node, op, dev, kernel] : s.placement(&variant)) {
    kernels[op][dev + ":" + kernel]++;
    all_on_cpu = all_on_cpu && (dev == "cpu" || dev.rfind("cpu:", 0) == 0);
  }
  // Achieved GFLOP/s, and the share of the host's peak: the time the counted work would take at the float (fp32, or
  // bf16's for a --precision bf16 run) and int8 peaks of this many threads over the median.
  const double gflop = work.flops / 1e9, gflops = median > 0 ? gflop / (median / 1000.0) : 0;
  const bool bf16_run = a.precision == "bf16";
  const double float_peak = !limits->known() ? 0 : bf16_run ? limits->bf16_at(threads) : limits->fp32_at(threads);
  double fraction = -1;
  if (limits->known() && all_on_cpu && median > 0 && work.flops > 0) {
    const double float_s = (work.flops - work.int8_flops) / (float_peak * 1e9);
    const double int8_peak = limits->int8_at(threads);
    const double int8_s = work.int8_flops == 0 ? 0
                          : int8_peak > 0      ? work.int8_flops / (int8_peak * 1e9)
                                               : work.int8_flops / (limits->fp32_at(threads) * 1e9);
    fraction = (float_s + int8_s) / (median / 1000.0);
  }

  const bool profiling = so.profile;
  const std::vector<NodeProfile> prof = profiling ? s.profile() : std::vector<NodeProfile>{};
  const std::vector<OpTypeProfile> ops = profile_by_op_type(prof);
  double profiled_total = 0;
  for (const auto& p : prof)
    if (p.calls > 0) profiled_total += p.total_ms / p.calls;
  // Claimed subgraphs by name ("chain K" in the table; a legend lists them), and the slowest nodes / steps.
  std::map<std::string, int> chain_no;
  struct Chain {
    std::string where;
    double ms = 0, steps_ms = 0;
    int count = 0, members = 0, steps = 0;
  };
  std::vector<Chain> chains;
  struct NodeRow {
    std::string node, op_type, where, detail;
    double ms;
  };
  std::vector<NodeRow> node_rows;
  for (const auto& p : prof) {
    if (p.calls == 0) continue;
    const std::string at = p.device_type + ":" + p.kernel;
    const double per_run = p.total_ms / p.calls;
    if (p.op_type == "Subgraph") {
      auto [it, fresh] = chain_no.emplace(at, static_cast<int>(chains.size()) + 1);
      if (fresh) chains.push_back({at});
      Chain& c = chains[it->second - 1];
      c.ms += per_run;
      c.count++;
      c.members += static_cast<int>(p.members.size());
      c.steps += static_cast<int>(p.steps.size());
      for (const auto& st : p.steps) c.steps_ms += st.total_ms / p.calls;
    }
    if (p.steps.empty()) {
      node_rows.push_back({p.node, p.op_type, at, "", per_run});
      continue;
    }
    for (const auto& st : p.steps) {
      std::string node = st.nodes.empty() ? std::string("(") + p.node + ")" : st.nodes[0];
      if (st.nodes.size() > 1) node += " +" + std::to_string(st.nodes.size() - 1) + " fused";
      node_rows.push_back({node, st.op_type.empty() ? "(" + st.kind + ")" : st.op_type, at,
                           st.kind + (st.implementation.empty() ? "" : " " + st.implementation),
                           st.total_ms / p.calls});
    }
  }
  std::stable_sort(node_rows.begin(), node_rows.end(), [](const auto& x, const auto& y) { return x.ms > y.ms; });
  if (static_cast<int>(node_rows.size()) > a.profile_nodes) node_rows.resize(std::max(a.profile_nodes, 0));
  auto where_label = [&](const std::string& w) {
    auto it = chain_no.find(w);
    return it == chain_no.end() ? w : "chain " + std::to_string(it->second);
  };
  const nlohmann::json memory = memory_stats_json(*env);  // the device pools after the runs
  const int64_t trimmed = a.trim ? static_cast<int64_t>(env->trim_memory()) : -1;

  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model;
    j["device"] = a.device.empty() ? "auto" : a.device;
    j["precision"] = a.precision;
    j["threads"] = threads;
    j["concurrency"] = std::max(1, a.concurrency);
    j["batch"] = batch;
    j["warmup"] = a.warmup;
    j["iters"] = times.size();
    j["session_create_ms"] = create_ms;
    j["median_ms"] = median;
    j["p90_ms"] = p90;
    j["mean_ms"] = mean;
    j["min_ms"] = minimum;
    j["throughput_per_s"] = throughput;
    j["wall_s"] = wall_s;
    j["wall_throughput_per_s"] = wall_throughput;
    j["cpu_ms_per_run"] = times.empty() ? 0.0 : cpu_s * 1000.0 / static_cast<double>(times.size());
    j["cpu_utilization"] = wall_s > 0 ? cpu_s / wall_s : 0.0;
    j["peak_rss_mib"] = peak_rss_mib();
    j["planned_arena_bytes"] = arena;
    j["kernel_workspace_bytes"] = workspace;
    j["fallbacks"] = s.fallbacks().size();
    j["shape_variant"] = variant;
    j["gflop_per_run"] = gflop;
    j["int8_gflop_per_run"] = work.int8_flops / 1e9;
    j["gflops"] = gflops;
    j["work_nodes_unknown"] = work.unknown;
    if (fraction >= 0) {
      j["host_limits"] = {{"file", limits->file},
                          {"fp32_peak_gflops", limits->fp32_at(threads)},
                          {"float_peak_gflops", float_peak},  // the fraction's: bf16's for a bf16 run
                          {"int8_peak_gops", limits->int8_at(threads)}};
      j["fraction_of_peak"] = fraction;
    }
    nlohmann::json jk;
    for (const auto& [op, m] : kernels)
      for (const auto& [k, n] : m) jk[op][k] = n;
    j["kernels"] = jk;
    j["memory"] = memory;
    if (trimmed >= 0) {
      j["trim_released_bytes"] = trimmed;
      j["memory_after_trim"] = memory_stats_json(*env);
    }
    if (profiling) {
      nlohmann::json jp = nlohmann::json::array();
      for (const auto& t : ops) {
        nlohmann::json r = {{"op_type", t.op_type}, {"ms", t.ms},           {"nodes", t.nodes},
                            {"fused", t.fused},     {"no_step", t.no_step}, {"where", t.where}};
        r["fused_in"] = nlohmann::json::object();
        for (const auto& [op, n] : t.fused_in) r["fused_in"][op] = n;
        jp.push_back(std::move(r));
      }
      j["profile"] = jp;
      j["profile_total_ms"] = profiled_total;
      nlohmann::json jc = nlohmann::json::array();
      for (const auto& p : prof) {
        if (p.op_type != "Subgraph" || p.calls == 0) continue;
        nlohmann::json c = {{"name", p.node},
                            {"device", p.device_type},
                            {"kernel", p.kernel},
                            {"ms", p.total_ms / p.calls},
                            {"nodes", p.members.size()}};
        nlohmann::json steps = nlohmann::json::array();
        for (const auto& st : p.steps)
          steps.push_back({{"kind", st.kind},
                           {"implementation", st.implementation},
                           {"op_type", st.op_type},
                           {"nodes", st.nodes},
                           {"ms", st.total_ms / p.calls}});
        c["steps"] = steps;
        jc.push_back(std::move(c));
      }
      j["profile_subgraphs"] = jc;
      if (a.profile_nodes > 0) {
        nlohmann::json jn = nlohmann::json::array();
        for (const auto& r : node_rows)
          jn.push_back(
              {{"node", r.node}, {"op_type", r.op_type}, {"where", r.where}, {"detail", r.detail}, {"ms", r.ms}});
        j["profile_nodes"] = jn;
      }
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << std::fixed << std::setprecision(3);
  std::cout << "model      " << a.model << "\n";
  std::cout << "device     " << (a.device.empty() ? "auto" : a.device) << ", " << threads << " thread(s), batch "
            << batch;
  if (a.concurrency > 1) std::cout << ", " << a.concurrency << " concurrent runs";
  std::cout << "\n";
  std::cout << "session    created in " << create_ms << " ms; " << s.fallbacks().size() << " fallback(s)";
  if (!variant.empty()) std::cout << "; runs specialised to " << variant << " (shape variant)";
  std::cout << "\n";
  std::cout << "latency    median " << median << " ms, p90 " << p90 << " ms, mean " << mean << " ms, min " << minimum
            << " ms (" << times.size() << " runs after " << a.warmup << " warm-up)\n";
  std::cout << "throughput " << std::setprecision(1) << throughput << " samples/s";
  if (a.concurrency > 1)
    std::cout << " (" << times.size() << " runs by " << a.concurrency << " callers in " << std::setprecision(3)
              << wall_s << " s)";
  std::cout << "\n";
  std::cout << "cpu        " << std::setprecision(3) << (times.empty() ? 0.0 : cpu_s * 1000.0 / times.size())
            << " ms of CPU time per run (all threads; " << std::setprecision(2) << (wall_s > 0 ? cpu_s / wall_s : 0.0)
            << " CPUs busy on average)\n";
  if (work.flops > 0) {
    // Three significant digits (a small model's batch 1 is well under 0.001 GFLOP), then fixed again.
    std::cout << "compute    " << std::defaultfloat << std::setprecision(3) << gflop << std::fixed
              << " GFLOP per run (Conv/Gemm/MatMul"
              << (work.int8_flops > 0
                      ? ", " + std::to_string(static_cast<int>(100.0 * work.int8_flops / work.flops)) + "% int8"
                      : std::string())
              << (work.unknown > 0 ? "; " + std::to_string(work.unknown) + " node(s) of unknown shape not counted" : "")
              << "): " << std::setprecision(1) << gflops << " GFLOP/s";
    if (fraction >= 0)
      std::cout << ", " << 100 * fraction << "% of this host's peak at " << threads << " thread(s) (" << float_peak
                << " GFLOP/s " << (bf16_run && float_peak != limits->fp32_at(threads) ? "bf16 dot products" : "fp32")
                << (work.int8_flops > 0
                        ? ", " + std::to_string(static_cast<int>(limits->int8_at(threads))) + " GOP/s int8"
                        : std::string())
                << "; " << limits->file
                << (limits->extrapolated(threads)
                        ? "; measured on " + std::to_string(limits->cpus) + " CPU(s), per core x threads here"
                        : std::string())
                << ")";
    else if (!limits->known() && all_on_cpu)
      std::cout << " (run keel-host-limits for the fraction of this host's peak)";
    std::cout << "\n";
  }
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
  if (profiling) {
    std::cout << "profile (per timed run, by op type; timings include the profiler's overhead, which waits for every "
                 "step):\n";
    for (const auto& t : ops) {
      std::cout << "  " << std::left << std::setw(24) << t.op_type << std::right << std::setw(10) << t.ms << " ms "
                << std::setw(6) << std::setprecision(1) << (profiled_total > 0 ? 100 * t.ms / profiled_total : 0)
                << "% " << std::setw(5) << t.nodes << " node(s)  " << std::setprecision(3);
      std::string where;
      for (const auto& w : t.where) where += (where.empty() ? "" : ", ") + where_label(w);
      std::cout << where;
      std::string notes;
      if (!t.fused_in.empty()) {
        notes += "with";
        for (const auto& [op, n] : t.fused_in) notes += " " + op + " x" + std::to_string(n);
        notes += " fused";
      }
      if (t.fused > 0) notes += (notes.empty() ? "" : "; ") + std::to_string(t.fused) + " fused into other ops";
      if (t.no_step > 0)
        notes += (notes.empty() ? "" : "; ") + std::to_string(t.no_step) + " without a step (views, constants)";
      if (!notes.empty()) std::cout << "  (" << notes << ")";
      std::cout << "\n";
    }
    std::cout << "  " << std::left << std::setw(24) << "total" << std::right << std::setw(10) << profiled_total
              << " ms\n";
    for (size_t k = 0; k < chains.size(); ++k) {
      const Chain& c = chains[k];
      std::cout << "  chain " << k + 1 << " = " << c.where << (c.count > 1 ? " x" + std::to_string(c.count) : "")
                << ": " << c.ms << " ms, " << c.members << " node(s), ";
      if (c.steps > 0) std::cout << c.steps << " reported step(s) " << c.steps_ms << " ms\n";
      else std::cout << "no steps reported (its time is its op type's)\n";
    }
    if (a.profile_nodes > 0) {
      std::cout << "slowest nodes / steps (per run):\n";
      for (const auto& r : node_rows)
        std::cout << "  " << std::right << std::setw(10) << r.ms << " ms  " << std::left << std::setw(20) << r.op_type
                  << " " << r.node << "  [" << where_label(r.where) << (r.detail.empty() ? "" : "; " + r.detail)
                  << "]\n"
                  << std::right;
    }
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, Globals& g) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand("bench", "Measure a model's latency, throughput and memory on random inputs");
  cmd->add_option("model", a->model, "The model (.onnx)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--passes", a->passes,
                  "Session passes: auto (the default pipeline of `keel optimize`; fuse_qdq for QDQ models: int8 "
                  "kernels), none, or a comma list (name:key=value gives a pass options)");
  add_precision_option(cmd, a->precision);
  cmd->add_option("--device,-d", a->device,
                  "Preferred device: TYPE or TYPE:INDEX (cpu, cuda, cuda:1, ...); default: every device by priority");
  cmd->add_option("--threads", g.threads, "Worker threads for kernels (0 = all cores)")->check(kNonNegative);
  cmd->add_option("--batch,-b", a->batch, "Batch size, where an input's first dimension is dynamic or 1")
      ->check(kPositive);
  cmd->add_option("--warmup", a->warmup, "Untimed runs first")->check(kNonNegative);
  cmd->add_option("--iters,-n", a->iters, "Timed runs")->check(kPositive);
  cmd->add_option("--max-seconds", a->max_seconds, "Stop the timed runs after this many seconds (0 = no limit)")
      ->check(kNonNegative);
  cmd->add_option("--concurrency,-c", a->concurrency,
                  "Callers running the session at once, each run with --threads threads (as a server's instances); "
                  "throughput is then completed runs over wall time")
      ->check(CLI::Range(1, 256));
  cmd->add_flag("--json", a->json, "Print the results as JSON");
  cmd->add_flag("--profile", a->profile,
                "Per-op-type time breakdown (Session profile; claimed subgraphs split into the op types they run)");
  cmd->add_option("--profile-nodes", a->profile_nodes, "With the profile: also list the N slowest nodes / steps")
      ->check(kNonNegative);
  cmd->add_option("--shape", a->shapes,
                  "NAME=D0,D1,...: the shape of an input's random tensor where the model leaves dims dynamic "
                  "(default 1; repeatable); the model stays dynamic (see --shape-variants)");
  cmd->add_option("--shape-variants", a->shape_variants,
                  "Shape variants a session builds for a model whose inputs have dynamic dims: each run shape gets "
                  "the graph specialised to it, up to N of them (0 = off)")
      ->check(kNonNegative);
  cmd->add_option("--host-limits", a->host_limits,
                  "keel-host-limits' JSON, for the fraction of the host's peak (default: $KEEL_HOST_LIMITS, then "
                  "~/.cache/keel/host_limits.json when it exists)");
  cmd->add_flag("--trim", a->trim, "After the runs, trim the device memory pools and report what was released");
  cmd->callback([a, &g] {
    int rc = bench(*a, g);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace keel::cli
