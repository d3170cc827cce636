// The memory pools' statistics as keel reports them: memory_report.{h,cc} on an Environment's CPU pool, and
// `keel bench --json --trim` end to end (pools after the runs, the trim's release, the pools after it).
#include "tools/keel/memory_report.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "core/base/graph.h"
#include "core/runtime/onnx_io.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Environment> bare_env() {
  EnvironmentOptions o;
  o.discover_plugins = false;
  auto env = Environment::create(o);
  EXPECT_TRUE(env.is_ok());
  return std::move(env).value();
}

TEST(MemoryReport, JsonAndTextFollowThePool) {
  auto env = bare_env();
  EXPECT_TRUE(cli::memory_stats_json(*env).empty());
  CachingAllocator* pool = env->allocator("cpu", 0).value();
  void* a = pool->allocate(1000).value();
  void* b = pool->allocate(2000).value();
  nlohmann::json j = cli::memory_stats_json(*env);
  ASSERT_TRUE(j.contains("cpu:0")) << j.dump();
  const auto& c = j["cpu:0"];
  EXPECT_EQ(c["allocations"], 2u);
  EXPECT_EQ(c["cache_misses"], 1u);
  EXPECT_EQ(c["cache_hits"], 1u);
  EXPECT_EQ(c["segments"], 1u);
  EXPECT_EQ(c["blocks_in_use"], 2u);
  EXPECT_EQ(c["in_use_bytes"], 1024u + 2048u);
  EXPECT_EQ(c["reserved_bytes"], CachingAllocator::kSegmentSize);
  EXPECT_DOUBLE_EQ(c["hit_rate"].get<double>(), 0.5);
  std::ostringstream os;
  cli::print_memory_stats(os, j, "");
  EXPECT_NE(os.str().find("cpu:0  reserved 2.0 MiB"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("1 hit(s), 1 miss(es) (50.0% hits)"), std::string::npos) << os.str();
  pool->free(a);
  EXPECT_EQ(env->trim_memory(), 0u) << "a segment with a block in use stays";
  pool->free(b);
  EXPECT_EQ(env->trim_memory(), CachingAllocator::kSegmentSize);
  j = cli::memory_stats_json(*env);
  EXPECT_EQ(j["cpu:0"]["segments"], 0u);
  EXPECT_EQ(j["cpu:0"]["reserved_bytes"], 0u);
  EXPECT_EQ(j["cpu:0"]["peak_reserved_bytes"], CachingAllocator::kSegmentSize);
  EXPECT_EQ(j["cpu:0"]["raw_frees"], 1u);
}

TEST(MemoryReport, BenchPrintsPoolsAndTrims) {
  const fs::path d = fs::temp_directory_path() / ("keel_memory_report_" + std::to_string(::getpid()));
  fs::create_directories(d);
  GraphBuilder gb("mem", 17);
  std::string x = gb.input("x", DType::kF32, {1, 64, 32});
  std::string y = gb.op1("Relu", {gb.op1("Add", {x, x})});
  gb.output(gb.op1("Softmax", {y}));
  Graph g = gb.take();
  ASSERT_TRUE(save_onnx(g, d / "m.onnx").is_ok());
  const std::string cmd = std::string(KEEL_CLI_BINARY) + " bench " + (d / "m.onnx").string() +
                          " --device cpu --batch 4 --warmup 1 --iters 3 --json --trim > " + (d / "out.json").string() +
                          " 2> " + (d / "err.txt").string();
  const int rc = std::system(cmd.c_str());
  std::ifstream errf(d / "err.txt");
  std::string err((std::istreambuf_iterator<char>(errf)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << err;
  std::ifstream f(d / "out.json");
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  ASSERT_TRUE(j.contains("memory") && j["memory"].contains("cpu:0")) << j.dump(2);
  const auto& m = j["memory"]["cpu:0"];
  EXPECT_GT(m["allocations"].get<uint64_t>(), 0u);
  EXPECT_GT(m["cache_hits"].get<uint64_t>(), 0u) << "runs after the first reuse the pooled blocks";
  EXPECT_GT(m["reserved_bytes"].get<uint64_t>(), 0u);
  ASSERT_TRUE(j.contains("trim_released_bytes") && j.contains("memory_after_trim")) << j.dump(2);
  const auto& after = j["memory_after_trim"]["cpu:0"];
  EXPECT_EQ(after["reserved_bytes"].get<uint64_t>() + j["trim_released_bytes"].get<uint64_t>(),
            m["reserved_bytes"].get<uint64_t>());
  EXPECT_LE(after["segments"].get<uint64_t>(), m["segments"].get<uint64_t>());
  fs::remove_all(d);
}

}  // namespace
}  // namespace keel
