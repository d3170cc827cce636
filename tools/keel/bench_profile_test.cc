// `keel bench --profile` end to end on a model the oneDNN device claims as one chain: the profile splits the chain
// into the ONNX op types it runs (plugin ABI 1.3 profile steps), with node counts and non-zero times that add up
// to the chain's time. Skips when the oneDNN plugin is not built.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "core/base/graph.h"
#include "core/runtime/onnx_io.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

Tensor random_f32(const Shape& shape, std::mt19937& rng) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::normal_distribution<float> dist(0.f, 0.1f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return Tensor::f32(shape, v);
}

// x[1,16,24,24] -> Conv+bias -> Relu -> Conv+bias -> Add(residual) -> Relu -> MaxPool -> GlobalAveragePool ->
// Flatten -> Gemm -> Softmax.
// `batch` < 0: a dynamic batch.
Graph small_cnn(int64_t batch = 1) {
  std::mt19937 rng(1);
  GraphBuilder b("cnn", 17);
  auto x = b.input("x", DType::kF32, {batch, 16, 24, 24});
  auto conv = [&](const std::string& in, const std::string& name) {
    auto w = b.constant(name + "_w", random_f32({16, 16, 3, 3}, rng));
    auto bias = b.constant(name + "_b", random_f32({16}, rng));
    return b.op1("Conv", {in, w, bias},
                 {{"kernel_shape", Attribute::of_ints({3, 3})}, {"pads", Attribute::of_ints({1, 1, 1, 1})}});
  };
  auto r1 = b.op1("Relu", {conv(x, "c1")});
  auto r2 = b.op1("Relu", {b.op1("Add", {conv(r1, "c2"), r1})});
  auto p =
      b.op1("MaxPool", {r2}, {{"kernel_shape", Attribute::of_ints({2, 2})}, {"strides", Attribute::of_ints({2, 2})}});
  auto f = b.op1("Flatten", {b.op1("GlobalAveragePool", {p})});
  auto w = b.constant("fc_w", random_f32({16, 10}, rng));
  auto bias = b.constant("fc_b", random_f32({10}, rng));
  b.output(b.op1("Softmax", {b.op1("Gemm", {f, w, bias})}));
  return b.take();
}

struct CliRun {
  int rc = -1;
  std::string out, err;
};
CliRun keel_cli(const std::string& args, const fs::path& dir) {
  const std::string cmd = std::string(KEEL_CLI_BINARY) + " " + args + " > " + (dir / "out.txt").string() + " 2> " +
                          (dir / "err.txt").string();
  CliRun r;
  r.rc = std::system(cmd.c_str());
  std::ifstream o(dir / "out.txt"), e(dir / "err.txt");
  r.out.assign(std::istreambuf_iterator<char>(o), std::istreambuf_iterator<char>());
  r.err.assign(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
  return r;
}

class BenchProfile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("keel_bench_profile_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    ASSERT_TRUE(save_onnx(small_cnn(), dir_ / "cnn.onnx").is_ok());
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(BenchProfile, ChainTimeIsSplitIntoTheOnnxOpTypesItRuns) {
  CliRun r = keel_cli("--threads 1 bench " + (dir_ / "cnn.onnx").string() +
                          " --device cpu --warmup 2 --iters 5 --json --profile --profile-nodes 4",
                      dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_TRUE(j.contains("profile_subgraphs")) << j.dump(2);
  if (j["profile_subgraphs"].empty()) GTEST_SKIP() << "no claimed subgraph (oneDNN plugin not built?)";
  ASSERT_EQ(j["profile_subgraphs"].size(), 1u) << j["profile_subgraphs"].dump(2);
  const auto& chain = j["profile_subgraphs"][0];
  EXPECT_EQ(chain["device"], "cpu");
  EXPECT_EQ(chain["nodes"].get<int>(), 10);
  ASSERT_FALSE(chain["steps"].empty());
  double steps_ms = 0;
  std::map<std::string, double> step_ms;
  for (const auto& st : chain["steps"]) {
    steps_ms += st["ms"].get<double>();
    step_ms[st["op_type"].get<std::string>()] += st["ms"].get<double>();
    EXPECT_FALSE(st["kind"].get<std::string>().empty());
    EXPECT_FALSE(st["implementation"].get<std::string>().empty());
  }
  const double chain_ms = chain["ms"].get<double>();
  // The steps are timed inside the chain's run: their sum is positive and never more than the chain's time (how much
  // of it they take depends on the host and the build, e.g. far less under ThreadSanitizer, so it is not asserted).
  EXPECT_GT(steps_ms, 0.0);
  EXPECT_LE(steps_ms, chain_ms * 1.0001);

  // By op type: the chain's op types, each with time, node counts; no "Subgraph" row; the rows add up to the total.
  std::map<std::string, nlohmann::json> rows;
  double sum = 0;
  for (const auto& row : j["profile"]) {
    rows[row["op_type"].get<std::string>()] = row;
    sum += row["ms"].get<double>();
  }
  EXPECT_NEAR(sum, j["profile_total_ms"].get<double>(), 1e-6 * sum + 1e-9);
  EXPECT_FALSE(rows.count("Subgraph")) << j["profile"].dump(2);
  for (const char* op : {"Conv", "MaxPool", "GlobalAveragePool", "Gemm", "Softmax"}) {
    ASSERT_TRUE(rows.count(op)) << op << " missing in " << j["profile"].dump(2);
    EXPECT_GT(rows[op]["ms"].get<double>(), 0) << op;
    EXPECT_EQ(rows[op]["where"].size(), 1u) << op;
    EXPECT_NE(rows[op]["where"][0].get<std::string>().find("cpu:onednn_chain"), std::string::npos) << op;
  }
  EXPECT_EQ(rows["Conv"]["nodes"].get<int>(), 2);
  // Relu and Add run as post-ops of the convolutions: counted as nodes, their time in Conv's row.
  ASSERT_TRUE(rows.count("Relu") && rows.count("Add")) << j["profile"].dump(2);
  EXPECT_EQ(rows["Relu"]["nodes"].get<int>(), 2);
  EXPECT_EQ(rows["Relu"]["fused"].get<int>(), 2);
  EXPECT_EQ(rows["Add"]["fused"].get<int>(), 1);
  EXPECT_EQ(rows["Conv"]["fused_in"]["Relu"].get<int>(), 2);
  EXPECT_EQ(rows["Flatten"]["no_step"].get<int>(), 1) << "a view runs no step";
  int nodes = 0;
  for (const auto& [op, row] : rows) nodes += row["nodes"].get<int>();
  EXPECT_EQ(nodes, 10);
  ASSERT_EQ(j["profile_nodes"].size(), 4u);
  EXPECT_GE(j["profile_nodes"][0]["ms"].get<double>(), j["profile_nodes"][3]["ms"].get<double>());

  // The text report names the op types and the chain.
  r = keel_cli(
      "--threads 1 bench " + (dir_ / "cnn.onnx").string() + " --device cpu --warmup 1 --iters 3 --profile-nodes 3",
      dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("chain 1 = cpu:onednn_chain("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("with Add x1 Relu x2 fused"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("slowest nodes / steps"), std::string::npos) << r.out;
}

TEST_F(BenchProfile, WithoutProfileTheChainIsNotTimedStepByStep) {
  CliRun r =
      keel_cli("--threads 1 bench " + (dir_ / "cnn.onnx").string() + " --device cpu --warmup 1 --iters 2 --json", dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_FALSE(j.contains("profile"));
  EXPECT_FALSE(j.contains("profile_subgraphs"));
}

// --concurrency N: N callers share the --iters budget (every run counted once), the throughput is what they completed
// over the wall time, and the profile (one run at a time) is refused rather than mixed.
TEST_F(BenchProfile, ConcurrentCallersShareTheRunBudgetAndReportWallThroughput) {
  const std::string model = (dir_ / "cnn.onnx").string();
  CliRun r =
      keel_cli("--threads 1 bench " + model + " --device cpu --warmup 1 --iters 13 --concurrency 3 --json", dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["concurrency"], 3);
  EXPECT_EQ(j["iters"], 13);
  const double wall = j["wall_s"].get<double>();
  ASSERT_GT(wall, 0);
  EXPECT_NEAR(j["throughput_per_s"].get<double>(), 13 / wall, 1e-6 * 13 / wall);
  EXPECT_EQ(j["throughput_per_s"], j["wall_throughput_per_s"]);
  // One caller keeps the median-based throughput.
  r = keel_cli("--threads 1 bench " + model + " --device cpu --warmup 1 --iters 5 --json", dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["concurrency"], 1);
  EXPECT_NEAR(j["throughput_per_s"].get<double>(), 1000.0 / j["median_ms"].get<double>(), 1e-6);
  r = keel_cli("bench " + model + " --concurrency 2 --profile", dir_);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--profile times one run at a time"), std::string::npos) << r.err;
}

// A dynamic-batch model: the runs use the shape variant for the --shape given, and the profile shows its chain.
TEST_F(BenchProfile, ADynamicBatchModelProfilesTheChainOfItsShapeVariant) {
  ASSERT_TRUE(save_onnx(small_cnn(-1), dir_ / "dyn.onnx").is_ok());
  const std::string model = (dir_ / "dyn.onnx").string();
  CliRun r = keel_cli(
      "--threads 1 bench " + model + " --device cpu --warmup 1 --iters 2 --json --profile " + "--shape x=2,16,24,24",
      dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["shape_variant"], "x[2, 16, 24, 24]");
  EXPECT_EQ(j["batch"], 2);
  // --shape-variants 0: the generic build, which still runs.
  r = keel_cli("--threads 1 bench " + model + " --device cpu --warmup 0 --iters 1 --json --shape-variants 0", dir_);
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json off = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(off.is_discarded()) << r.out;
  EXPECT_EQ(off["shape_variant"], "");
  // A shape the model does not take, or no such input: a clear usage error.
  r = keel_cli("bench " + model + " --shape x=2,3,24,24", dir_);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("not a shape the model takes for 'x' ([?, 16, 24, 24])"), std::string::npos) << r.err;
  r = keel_cli("bench " + model + " --shape y=2", dir_);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("naming a model input"), std::string::npos) << r.err;

  if (j["profile_subgraphs"].empty()) GTEST_SKIP() << "no claimed subgraph (oneDNN plugin not built?)";
  ASSERT_EQ(j["profile_subgraphs"].size(), 1u) << j["profile_subgraphs"].dump(2);
  EXPECT_EQ(j["profile_subgraphs"][0]["nodes"].get<int>(), 10);
  EXPECT_FALSE(j["profile_subgraphs"][0]["steps"].empty());
}

}  // namespace
// A bad number on the command line is a usage error: exit code 2 (README: "2 usage error"), and the message says what
// is wanted instead of CLI11's "Value 0 not in range 0.000000 to <a 309-digit number>".
TEST_F(BenchProfile, ABadNumberIsAUsageErrorThatSaysWhatIsWanted) {
  const std::string model = (dir_ / "cnn.onnx").string();
  struct Case {
    std::string args, says;
  };
  for (const Case& c : {Case{"bench " + model + " --batch 0", "--batch: 0 is not a positive number"},
                        Case{"--threads -1 bench " + model, "--threads: -1 is not a number >= 0"},
                        Case{"bench " + model + " --iters many", "--iters: many is not a number"}}) {
    CliRun r = keel_cli(c.args, dir_);
    ASSERT_TRUE(WIFEXITED(r.rc)) << c.args;
    EXPECT_EQ(WEXITSTATUS(r.rc), 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(r.err.find("000000"), std::string::npos) << r.err;
  }
  // A model file that does not exist (CLI11's own check) is one too; --help still exits 0.
  CliRun r = keel_cli("bench " + (dir_ / "missing.onnx").string(), dir_);
  ASSERT_TRUE(WIFEXITED(r.rc));
  EXPECT_EQ(WEXITSTATUS(r.rc), 2) << r.err;
  r = keel_cli("bench --help", dir_);
  ASSERT_TRUE(WIFEXITED(r.rc));
  EXPECT_EQ(WEXITSTATUS(r.rc), 0) << r.err;
}

}  // namespace keel
