// The work a model does per run (model_work.h), counted by hand for each op it counts, and `keel bench`'s GFLOP/s
// and fraction of the host's peak with keel-host-limits' JSON (measured here with --quick).
#include "tools/keel/model_work.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/runtime/onnx_io.h"

namespace keel::cli {
namespace {

namespace fs = std::filesystem;

Tensor filled(const Shape& shape, float v = 0.01f) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Tensor::f32(shape, std::vector<float>(static_cast<size_t>(n), v));
}

Attribute ints(std::vector<int64_t> v) { return Attribute::of_ints(std::move(v)); }

// x[2,3,8,8] -> Conv 3x3 (4 out) -> depthwise Conv 3x3 (group 4) -> ConvTranspose 2x2 s2 (2 out) -> Flatten ->
// Gemm (transA) -> MatMul; each op's multiply-adds by hand below. `batch` -1: a dynamic batch dimension.
Graph every_counted_op(int64_t batch = 2) {
  GraphBuilder b("work", 17);
  auto x = b.input("x", DType::kF32, {batch, 3, 8, 8});
  auto c1 = b.op1("Conv", {x, b.constant("w1", filled({4, 3, 3, 3}))},
                  {{"kernel_shape", ints({3, 3})}, {"pads", ints({1, 1, 1, 1})}});
  auto c2 = b.op1("Conv", {c1, b.constant("w2", filled({4, 1, 3, 3}))},
                  {{"kernel_shape", ints({3, 3})}, {"pads", ints({1, 1, 1, 1})}, {"group", Attribute::of_int(4)}});
  auto ct = b.op1("ConvTranspose", {c2, b.constant("wt", filled({4, 2, 2, 2}))},
                  {{"kernel_shape", ints({2, 2})}, {"strides", ints({2, 2})}});  // [2, 2, 16, 16]
  auto f = b.op1("Flatten", {ct});                                               // [2, 512]
  auto t = b.op1("Transpose", {f});                                              // [512, 2]
  auto g = b.op1("Gemm", {t, b.constant("wg", filled({512, 10}))}, {{"transA", Attribute::of_int(1)}});  // [2, 10]
  b.output(b.op1("MatMul", {g, b.constant("wm", filled({10, 3}))}));                                     // [2, 3]
  Graph graph = b.take();
  EXPECT_TRUE(infer_shapes(graph).is_ok());
  return graph;
}

TEST(ModelWork, CountsEachOpsMultiplyAddsTwice) {
  const int64_t conv = 2 * 4 * 8 * 8 * (3 * 3 * 3);        // every output element: C x kh x kw
  const int64_t depthwise = 2 * 4 * 8 * 8 * (1 * 3 * 3);   // C/group = 1
  const int64_t transposed = 2 * 4 * 8 * 8 * (2 * 2 * 2);  // every input element reaches M/group x kh x kw outputs
  const int64_t gemm = 2 * 10 * 512, matmul = 2 * 3 * 10;
  ModelWork w = model_work(every_counted_op());
  EXPECT_EQ(w.flops, 2 * (conv + depthwise + transposed + gemm + matmul));
  EXPECT_EQ(w.int8_flops, 0);
  EXPECT_EQ(w.nodes, 5);
  EXPECT_EQ(w.unknown, 0);
}

TEST(ModelWork, QdqAndQuantizedOpsCountAsInt8AndUnknownShapesAreCountedApart) {
  GraphBuilder b("qdq", 17);
  auto x = b.input("x", DType::kF32, {1, 4, 6, 6});
  auto scale = b.constant("s", Tensor::f32({}, {0.05f}));
  auto zp = b.constant("z", Tensor::from_vector<uint8_t>(DType::kU8, {}, {128}));
  auto xq = b.op1("DequantizeLinear", {b.op1("QuantizeLinear", {x, scale, zp}), scale, zp});
  auto y = b.op1("Conv", {xq, b.constant("w", filled({8, 4, 1, 1}))}, {{"kernel_shape", ints({1, 1})}});
  auto z = b.op1("Conv", {y, b.constant("w2", filled({8, 8, 1, 1}))}, {{"kernel_shape", ints({1, 1})}});
  b.output(z);
  Graph g = b.take();
  ASSERT_TRUE(infer_shapes(g).is_ok());
  ModelWork w = model_work(g);
  const int64_t first = 2 * (36 * 8 * 4), second = 2 * (36 * 8 * 8);
  EXPECT_EQ(w.flops, first + second);
  EXPECT_EQ(w.int8_flops, first) << "only the Conv fed by DequantizeLinear runs on int8 kernels";

  g.value_info[z].shape.reset();  // a node whose output shape is not known
  w = model_work(g);
  EXPECT_EQ(w.flops, first);
  EXPECT_EQ(w.unknown, 1);
}

#if defined(KEEL_CLI_BINARY) && defined(KEEL_HOST_LIMITS_BINARY)
std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) out = "exit " + std::to_string(rc) + ": " + out;
  return out;
}

TEST(HostLimits, BenchReportsGflopsAndTheFractionOfTheMeasuredPeak) {
  const fs::path dir = fs::temp_directory_path() / ("keel_model_work_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path limits = dir / "limits.json", model = dir / "model.onnx";
  const std::string printed =
      run(std::string(KEEL_HOST_LIMITS_BINARY) + " --quick --array-mib 4 --json " + limits.string());
  ASSERT_TRUE(fs::exists(limits)) << printed;
  EXPECT_NE(printed.find("fp32 FMA"), std::string::npos) << printed;
  const nlohmann::json h = nlohmann::json::parse(std::ifstream(limits));
  EXPECT_GT(h.value("cpus", 0), 0);
  EXPECT_GT(h.value("fp32_gflops_per_core", 0.0), 0.1) << h.dump();
  EXPECT_GE(h.value("fp32_gflops_all_cores", 0.0), 0.1) << h.dump();
  EXPECT_GT(h.value("memory_gbs_all_cores", 0.0), 0.01) << h.dump();
  // The bf16 dot products' peak where the CPU has AVX-512 BF16 (what oneDNN's bf16 layers use without AMX), and
  // whether it has AMX.
  __builtin_cpu_init();
  const bool bf16_dot = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  EXPECT_EQ(h.value("bf16_gflops_per_core", 0.0) > 0.1, bf16_dot) << h.dump();
  EXPECT_EQ(h.value("amx_bf16", true), static_cast<bool>(__builtin_cpu_supports("amx-bf16"))) << h.dump();
  EXPECT_NE(printed.find("bf16 dot"), std::string::npos) << printed;

  Graph g = every_counted_op();
  const ModelWork want = model_work(g);
  ASSERT_TRUE(save_onnx(g, model).is_ok());
  const std::string bench = run(std::string(KEEL_CLI_BINARY) + " bench " + model.string() +
                                " --iters 3 --warmup 1 --json --host-limits " + limits.string());
  const auto start = bench.find('{');
  ASSERT_NE(start, std::string::npos) << bench;
  const nlohmann::json j = nlohmann::json::parse(bench.substr(start));
  EXPECT_DOUBLE_EQ(j.value("gflop_per_run", 0.0), want.flops / 1e9);
  EXPECT_GT(j.value("gflops", 0.0), 0.0);
  ASSERT_TRUE(j.contains("fraction_of_peak")) << j.dump();
  EXPECT_GT(j["fraction_of_peak"].get<double>(), 0.0);
  EXPECT_EQ(j["host_limits"].value("file", ""), limits.string());

  // A file measured on fewer CPUs than the run's threads (keel-host-limits under taskset): the peak is per core x
  // threads, not that file's "all cores" (which was one CPU's).
  const fs::path narrow = dir / "narrow.json";
  std::ofstream(narrow) << R"({"cpus": 1, "fp32_gflops_per_core": 100.0, "fp32_gflops_all_cores": 100.0})";
  const std::string wide = run(std::string(KEEL_CLI_BINARY) + " bench " + model.string() +
                               " --threads 3 --iters 2 --warmup 1 --json --host-limits " + narrow.string());
  const auto wstart = wide.find('{');
  ASSERT_NE(wstart, std::string::npos) << wide;
  const nlohmann::json jw = nlohmann::json::parse(wide.substr(wstart));
  EXPECT_DOUBLE_EQ(jw["host_limits"].value("fp32_peak_gflops", 0.0), 300.0) << jw.dump();

  // A --precision bf16 run is held to the bf16 dot products' peak, unless the host has AMX (whose peak is not
  // measured: fp32's then) or the file has no bf16 peak.
  auto float_peak = [&](const std::string& file_text) {
    const fs::path f = dir / "bf16.json";
    std::ofstream(f) << file_text;
    const std::string out =
        run(std::string(KEEL_CLI_BINARY) + " bench " + model.string() +
            " --precision bf16 --threads 1 --iters 2 --warmup 1 --json --host-limits " + f.string());
    const auto at = out.find('{');
    if (at == std::string::npos) return -1.0;
    return nlohmann::json::parse(out.substr(at))["host_limits"].value("float_peak_gflops", -2.0);
  };
  EXPECT_DOUBLE_EQ(
      float_peak(R"({"cpus": 1, "fp32_gflops_per_core": 100.0, "bf16_gflops_per_core": 50.0, "amx_bf16": false})"),
      50.0);
  EXPECT_DOUBLE_EQ(
      float_peak(R"({"cpus": 1, "fp32_gflops_per_core": 100.0, "bf16_gflops_per_core": 50.0, "amx_bf16": true})"),
      100.0);
  EXPECT_DOUBLE_EQ(float_peak(R"({"cpus": 1, "fp32_gflops_per_core": 100.0})"), 100.0);

  // A dynamic batch is counted at the batch the runs use (1 without --batch), not left unknown.
  const fs::path dynamic = dir / "dynamic.onnx";
  ASSERT_TRUE(save_onnx(every_counted_op(-1), dynamic).is_ok());
  const std::string dyn = run(std::string(KEEL_CLI_BINARY) + " bench " + dynamic.string() +
                              " --iters 3 --warmup 1 --json --host-limits " + limits.string());
  const auto dstart = dyn.find('{');
  ASSERT_NE(dstart, std::string::npos) << dyn;
  const nlohmann::json jd = nlohmann::json::parse(dyn.substr(dstart));
  EXPECT_DOUBLE_EQ(jd.value("gflop_per_run", 0.0), model_work(every_counted_op(1)).flops / 1e9) << jd.dump();
  EXPECT_GT(jd.value("gflops", 0.0), 0.0);

  // A file that is not keel-host-limits' JSON is an error naming it, not a silent zero.
  std::ofstream(dir / "bad.json") << "{\"cpus\": 2}";
  const std::string bad = run(std::string(KEEL_CLI_BINARY) + " bench " + model.string() + " --iters 1 --host-limits " +
                              (dir / "bad.json").string());
  EXPECT_NE(bad.find("exit"), std::string::npos) << bad;
  EXPECT_NE(bad.find("bad.json"), std::string::npos) << bad;
  fs::remove_all(dir);
}

// A run of keel-host-limits under a narrower affinity mask (taskset) leaves a default file measured on more CPUs,
// which `keel bench` reads for every thread count, alone.
TEST(HostLimits, ANarrowerAffinityMaskDoesNotOverwriteAWiderMeasurement) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2 || std::system("taskset -V > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "needs 2 CPUs and taskset";
  const fs::path home = fs::temp_directory_path() / ("keel_host_limits_home_" + std::to_string(getpid()));
  fs::create_directories(home);
  const fs::path file = home / ".cache/keel/host_limits.json";
  const std::string env = "HOME=" + home.string() + " XDG_CACHE_HOME= ";
  const std::string wide = run(env + std::string(KEEL_HOST_LIMITS_BINARY) + " --quick --array-mib 4 --reps 1");
  ASSERT_TRUE(fs::exists(file)) << wide;
  const int cpus = nlohmann::json::parse(std::ifstream(file)).value("cpus", 0);
  if (cpus < 2) GTEST_SKIP() << "this process may use one CPU only";
  const std::string narrow =
      run(env + "taskset -c 0 " + std::string(KEEL_HOST_LIMITS_BINARY) + " --quick --array-mib 4 --reps 1");
  EXPECT_NE(narrow.find("not saved"), std::string::npos) << narrow;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(file)).value("cpus", 0), cpus);
  fs::remove_all(home);
}
#endif

}  // namespace
}  // namespace keel::cli
