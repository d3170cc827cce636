// device_conformance_test — the device conformance suite (device_cts.h) on every device type present.
//
// "cpu" is served by the reference kernels and, when the cpu_onednn plugin is loaded, by oneDNN kernels of higher
// priority: the test then checks (through Session::placement()) that the oneDNN kernels are the ones it tested.
// Other device types (cuda, ...) run when present and skip with a message when absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "core/runtime/environment.h"
#include "core/runtime/session.h"
#include "tools/conformance/case_builders.h"
#include "tools/conformance/device_cts.h"

namespace keel::cts {
namespace {

struct Envs {
  std::unique_ptr<Environment> dut, oracle;
};

Envs& envs() {
  static Envs e = [] {
    Envs r;
    auto dut = Environment::create();
    EnvironmentOptions o;
    o.discover_plugins = false;
    auto oracle = Environment::create(o);
    if (dut.is_ok()) r.dut = std::move(dut).value();
    if (oracle.is_ok()) r.oracle = std::move(oracle).value();
    return r;
  }();
  return e;
}

bool plugin_loaded(const Environment& env, const std::string& name) {
  for (const auto& p : env.plugins())
    if (p.name == name && p.state == PluginState::kLoaded) return true;
  return false;
}

// oneDNN's binary primitive broadcasts only its second operand: the plugin swaps the operands of commutative ops
// and leaves to the reference kernels the cases where that does not help.
bool binary_falls_back(const OpCase& c) {
  static const std::set<std::string> kBinary = {"Add", "Sub", "Mul", "Div", "Max", "Min"};
  if (!kBinary.count(c.op) || c.inputs.size() != 2) return false;
  Shape a = c.inputs[0].shape, b = c.inputs[1].shape;
  size_t r = std::max(a.size(), b.size());
  while (a.size() < r) a.insert(a.begin(), 1);
  while (b.size() < r) b.insert(b.begin(), 1);
  Shape out(r);
  for (size_t i = 0; i < r; ++i) out[i] = std::max(a[i], b[i]);
  if (a == out) return false;
  return c.op == "Sub" || c.op == "Div" || b != out;
}

// Cases the oneDNN plugin does not take by design: its kernels are f32 only (the f16 / bf16 cases run on the reference
// kernels), it has no kernels for the keel-domain fused ops FusedConv / FusedMatMul / FusedGemm (the CUDA plugin
// does; on the CPU their reference kernels run), and its ConvTranspose leaves output_shape and SAME auto_pad to them.
bool not_for_onednn(const OpCase& c) {
  static const std::set<std::string> kFusedOps = {"FusedConv", "FusedMatMul", "FusedGemm"};
  static const std::set<std::string> kF32Only = {"Conv", "ConvTranspose", "MatMul", "Gemm", "BatchNormalization"};
  if (c.domain == "keel" && kFusedOps.count(c.op)) return true;
  if (c.op == "ConvTranspose" && (c.attrs.count("output_shape") || c.attrs.count("auto_pad"))) return true;
  // oneDNN's loss kernels take [N, C] scores without class weights; spatial dims and weights run on the reference.
  if (c.op == "SoftmaxCrossEntropyLoss" || c.op == "SoftmaxCrossEntropyLossGrad") {
    const size_t scores = c.op == "SoftmaxCrossEntropyLoss" ? 0 : 1, weights = scores + 2;
    if (c.inputs.size() > weights || (c.inputs.size() > scores && c.inputs[scores].shape.size() != 2)) return true;
  }
  return c.dtype != DType::kF32 && kF32Only.count(c.op);
}

TEST(DeviceConformance, Cpu) {
  Envs& e = envs();
  ASSERT_TRUE(e.dut && e.oracle);
  Options o;
  o.device = "cpu";
  o.out = &std::cout;
  const bool onednn = plugin_loaded(*e.dut, "cpu_onednn");
  if (onednn) o.kernel_prefix = "onednn_";
  else std::cout << "cpu_onednn is not loaded: testing the reference kernels against themselves\n";
  Report r = run(*e.dut, *e.oracle, o);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.errors, 0);
  EXPECT_EQ(r.invalid, 0) << "cases the reference cannot run: fix the case table";
  if (onednn) {
    std::cout << "cases served by oneDNN, per op:";
    for (const auto& [op, n] : r.native_by_op) std::cout << " " << op << " " << n.first << "/" << n.second;
    std::cout << "\n";
    // oneDNN 2.6 has only reference implementations for some shapes of these ops on plain layouts; the plugin
    // leaves those cases to Keel's reference kernels (they must still pass, on whichever kernel ran).
    static const std::set<std::string> kMayFallBack = {
        "LayerNormalization", "Softmax",   "LogSoftmax", "ReduceMean",  "ReduceSum",         "ReduceMax",
        "ReduceMin",          "Transpose", "MaxPool",    "AveragePool", "GlobalAveragePool", "GlobalMaxPool"};
    // Ops the oneDNN plugin has no kernel for at all (the table also serves other devices' kernels, e.g. cuda's
    // Gather/Resize/Pad), and cases in other float dtypes than f32, run on the reference kernels.
    // A oneDNN kernel serves a case when it is registered for the op and, where it declares dtypes, the case's.
    auto onednn_serves = [&](const OpCase& c) {
      for (const KernelEntry* k : e.dut->registry().kernels_for(c.domain, c.op, c.opset, "cpu")) {
        if (k->name.rfind("onednn_", 0) != 0) continue;
        bool typed = false, takes = false;
        for (const auto& con : k->constraints) {
          if (con.dtypes.empty()) continue;
          typed = true;
          for (DType d : con.dtypes) takes = takes || d == c.dtype;
        }
        if (!typed || takes) return true;
      }
      return false;
    };
    std::set<std::string> served_ops;
    for (const auto& res : r.results)
      if (onednn_serves(*res.c)) served_ops.insert(res.c->op);
    for (const auto& [op, n] : r.native_by_op) {
      if (!kMayFallBack.count(op) && served_ops.count(op) && op != "FusedConv" && op != "FusedMatMul" &&
          op != "FusedGemm") {
        EXPECT_GT(n.first, 0) << "no " << op << " case ran on oneDNN";
      }
    }
    // The bf16 kernels cover the shapes mixed-precision models use (2-D convs with explicit pads, same-batch
    // matmuls, ...); their other bf16 cases run on the reference kernels (and must still pass). Each bf16 op has
    // at least one case on oneDNN.
    std::map<std::string, int> bf16_native;
    for (const auto& res : r.results)
      if (res.c->dtype == DType::kBF16 && res.c->domain.empty() && onednn_serves(*res.c))
        bf16_native[res.c->op] += res.kernel.rfind("onednn_", 0) == 0 ? 1 : 0;
    for (const auto& [op, n] : bf16_native) EXPECT_GT(n, 0) << "no bf16 " << op << " case ran on oneDNN";
    // Every other case of the table is one that the oneDNN plugin is meant to take.
    for (const auto& res : r.results) {
      if (res.kernel.rfind("onednn_", 0) == 0) continue;
      if (binary_falls_back(*res.c) || kMayFallBack.count(res.c->op) || not_for_onednn(*res.c)) continue;
      if (!onednn_serves(*res.c) || res.c->dtype != DType::kF32) continue;
      ADD_FAILURE() << res.c->op << " '" << res.c->label << "' ran on " << res.kernel << ", not on oneDNN";
    }
  }
}

// Steady state: once a shape has run twice (the first run records sizes, the second plans the arena), further runs
// of every chain case take no new memory from the system (raw allocations of every pool stay put) and give back
// all they take but their outputs.
TEST(DeviceConformance, ChainsAllocateNothingInSteadyState) {
  Envs& e = envs();
  ASSERT_TRUE(e.dut);
  int chains = 0;
  uint64_t workspace = 0;
  for (const OpCase& c : all_cases()) {
    if (c.chain.empty()) continue;
    Built b = build(c);
    SessionOptions so;
    so.devices = {"cpu"};
    auto s = Session::create(*e.dut, std::move(b.graph), so);
    ASSERT_TRUE(s.is_ok()) << c.label << ": " << s.status().to_string();
    for (int k = 0; k < 2; ++k) ASSERT_TRUE((*s)->run(b.feeds).is_ok()) << c.label;
    auto before = e.dut->memory_stats();
    for (int k = 0; k < 5; ++k) {
      auto out = (*s)->run(b.feeds);
      ASSERT_TRUE(out.is_ok()) << c.label;
    }
    auto after = e.dut->memory_stats();
    for (const auto& [pool, st] : after) {
      const AllocatorStats& was = before[pool];
      EXPECT_EQ(st.raw_allocations, was.raw_allocations) << c.label << ": " << pool << " grew in steady state";
      EXPECT_EQ(st.in_use_bytes, was.in_use_bytes) << c.label << ": " << pool << " keeps memory after runs";
    }
    for (const auto& [node, op, dev, kernel] : (*s)->placement()) {
      if (op == "Subgraph") ++chains;
    }
    for (const auto& [pool, bytes] : (*s)->workspace_bytes()) workspace = std::max(workspace, bytes);
  }
  if (plugin_loaded(*e.dut, "cpu_onednn")) {
    EXPECT_GT(chains, 0) << "no chain case ran as a claimed subgraph";
    // Chains keep their internal values in the kernel workspace, which the session reports beside its arena.
    EXPECT_GT(workspace, 0u) << "Session::workspace_bytes saw no chain workspace";
  }
}

// Chain cases marked claim_whole (1-D and 3-D convolution blocks, ...) run as one claimed oneDNN subgraph: no node
// of theirs on a kernel of its own.
TEST(DeviceConformance, ChainsClaimedWhole) {
  Envs& e = envs();
  ASSERT_TRUE(e.dut);
  if (!plugin_loaded(*e.dut, "cpu_onednn")) GTEST_SKIP() << "cpu_onednn is not loaded";
  int cases = 0;
  for (const OpCase& c : all_cases()) {
    if (c.chain.empty() || !c.claim_whole) continue;
    ++cases;
    Built b = build(c);
    SessionOptions so;
    so.devices = {"cpu"};
    auto s = Session::create(*e.dut, std::move(b.graph), so);
    ASSERT_TRUE(s.is_ok()) << c.label << ": " << s.status().to_string();
    int subgraphs = 0;
    for (const auto& [node, op, dev, kernel] : (*s)->placement()) {
      if (op == "Subgraph" && kernel.rfind("onednn_chain(", 0) == 0) ++subgraphs;
      else ADD_FAILURE() << c.label << ": node " << node << " (" << op << ") ran on " << kernel << ", not in the chain";
    }
    EXPECT_EQ(subgraphs, 1) << c.label;
  }
  EXPECT_GT(cases, 0);
}

// Concurrent runs of one session (what `keel serve`'s instances and a host's threads do) compute what sequential runs
// compute, for every chain case of the table in f32 and in bf16, and for the case the random chains found (a bf16
// BatchNormalization after a convolution whose output is a graph output too: the BatchNormalization's primitive, made
// in oneDNN's library scratchpad mode, kept one scratchpad that concurrent runs shared, and its outputs mixed). Each
// of 3 threads runs its own inputs 12 times at once with the others (one of them on a second session that shares
// the first's build with a team of another size); compared with that input's sequential run on the same session.
TEST(DeviceConformance, ConcurrentRunsOfChainsMatchSequentialOnes) {
  Envs& e = envs();
  ASSERT_TRUE(e.dut);
  std::vector<OpCase> cases;
  for (const OpCase& c : all_cases()) {
    if (c.chain.empty() || c.dtype != DType::kF32) continue;
    cases.push_back(c);
    cases.push_back(c);
    cases.back().dtype = DType::kBF16;
    cases.back().label += " (bf16)";
  }
  OpCase found;  // random chains, seed 484 --bf16, as of 15b6722 (cut down)
  found.op = "Chain";
  found.label = "conv3x3/2(32->48) -> bn, the conv's output an output too (bf16)";
  found.dtype = DType::kBF16;
  found.inputs = {in("X", {1, 32, 17, 17}),         in("W", {48, 32, 3, 3}, true, -0.1f, 0.1f),
                  in("S", {48}, true, 0.5f, 1.5f),  in("T", {48}, true, -0.5f, 0.5f),
                  in("M", {48}, true, -0.5f, 0.5f), in("V", {48}, true, 0.5f, 2.f)};
  found.chain = {{"Conv",
                  {"X", "W"},
                  {{"kernel_shape", Attribute::of_ints({3, 3})},
                   {"strides", Attribute::of_ints({2, 2})},
                   {"pads", Attribute::of_ints({1, 1, 1, 1})}}},
                 {"BatchNormalization", {"$0", "S", "T", "M", "V"}, {}}};
  found.also_outputs = {"$0"};
  cases.push_back(found);
  constexpr int kThreads = 3, kRounds = 12;
  int checked = 0;
  for (const OpCase& c : cases) {
    Built b = build(c);
    SessionOptions so;
    so.devices = {"cpu"};
    so.threads = 2;
    auto s = Session::create(*e.dut, std::move(b.graph), so);
    if (!s.is_ok()) continue;  // (a bf16 variant no kernel takes)
    // Thread 1 runs on a second session sharing the build (keel serve's instances), with a team of 1.
    SessionOptions so2 = so;
    so2.threads = 1;
    so2.share_weights_with = s->get();
    auto s2 = Session::create(*e.dut, build(c).graph, so2);
    ASSERT_TRUE(s2.is_ok()) << c.label << ": " << s2.status().to_string();
    auto session = [&](int t) -> Session& { return t == 1 ? **s2 : **s; };
    std::vector<std::vector<std::pair<std::string, Tensor>>> feeds;
    std::vector<std::vector<Tensor>> want;
    for (int t = 0; t < kThreads; ++t) {
      feeds.push_back(build(c, 0, static_cast<uint32_t>(t)).feeds);
      auto r = session(t).run(feeds.back());
      if (!r.is_ok()) break;  // (a bf16 variant that is no valid model: a Resize's scales in bf16)
      want.push_back(std::move(r).value());
    }
    if (want.size() != kThreads) {
      EXPECT_EQ(c.dtype, DType::kBF16) << c.label;
      continue;
    }
    std::vector<std::string> failures(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < kRounds && failures[t].empty(); ++round) {
          auto r = session(t).run(feeds[t]);
          if (!r.is_ok()) {
            failures[t] = r.status().to_string();
            break;
          }
          for (size_t o = 0; o < r->size(); ++o) {
            const Tensor& got = (*r)[o];
            const Tensor& ref = want[t][o];
            if (got.byte_size() != ref.byte_size() || std::memcmp(got.raw_data(), ref.raw_data(), got.byte_size()) != 0)
              failures[t] = "output " + std::to_string(o) + " of round " + std::to_string(round) +
                            " differs from its sequential run";
          }
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << c.label << ", thread " << t;
    ++checked;
  }
  EXPECT_GE(checked, static_cast<int>(cases.size() * 9 / 10));  // all but a few bf16 variants
}

// Runs case `c` once on the cpu of `env`, claimed subgraphs on or off; `chained` (when given) says whether a claimed
// subgraph ran.
void run_case(Environment& env, const OpCase& c, bool claims, std::vector<Tensor>& outs, bool* chained = nullptr) {
  Built b = build(c);
  SessionOptions so;
  so.devices = {"cpu"};
  so.claims = claims;
  auto s = Session::create(env, std::move(b.graph), so);
  ASSERT_TRUE(s.is_ok()) << c.label << ": " << s.status().to_string();
  if (chained) {
    *chained = false;
    for (const auto& [node, op, dev, kernel] : (*s)->placement()) *chained = *chained || op == "Subgraph";
  }
  auto r = (*s)->run(b.feeds);
  ASSERT_TRUE(r.is_ok()) << c.label << ": " << r.status().to_string();
  outs = std::move(r).value();
}

// INT8 chain cases (keel.QConv / keel.QGemm nodes) claimed as one oneDNN subgraph compute what the standalone int8
// kernels compute node by node (SessionOptions::claims = false): the same primitives and loops, so integer outputs
// are equal and f32 ones equal up to the f32 steps' summation order (pooling over another layout; the fp32 prefix's
// convolutions, whose algorithm may differ outside a chain, can move a value across a rounding boundary of the
// quantization after them: one step, x_scale 0.02, times a few weights).
TEST(DeviceConformance, Int8ChainsMatchTheStandaloneKernels) {
  Envs& e = envs();
  ASSERT_TRUE(e.dut);
  if (!plugin_loaded(*e.dut, "cpu_onednn")) GTEST_SKIP() << "cpu_onednn is not loaded";
  int cases = 0;
  for (const OpCase& c : all_cases()) {
    bool int8 = false, f32_conv = false;
    for (const ChainNode& n : c.chain) {
      int8 = int8 || n.op == "keel.QConv" || n.op == "keel.QGemm";
      f32_conv = f32_conv || n.op == "Conv";
    }
    if (!int8) continue;
    ++cases;
    std::vector<Tensor> outs[2];
    for (int claims = 0; claims < 2; ++claims) {
      bool chain = false;
      ASSERT_NO_FATAL_FAILURE(run_case(*e.dut, c, claims != 0, outs[claims], &chain));
      EXPECT_EQ(chain, claims != 0) << c.label;
    }
    ASSERT_EQ(outs[0].size(), outs[1].size());
    for (size_t k = 0; k < outs[0].size(); ++k) {
      const Tensor &a = outs[0][k], &b = outs[1][k];
      ASSERT_EQ(a.dtype(), b.dtype()) << c.label;
      ASSERT_EQ(a.shape(), b.shape()) << c.label;
      if (a.dtype() != DType::kF32) {
        EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.byte_size()), 0) << c.label << ": integer outputs differ";
        continue;
      }
      const float* x = a.data<float>();
      const float* y = b.data<float>();
      double worst = 0, scale = 1;
      for (int64_t i = 0; i < a.numel(); ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(x[i] - y[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(x[i])));
      }
      EXPECT_LE(worst, (f32_conv ? 1e-2 : 1e-5) * scale) << c.label << ": chain and standalone kernels differ";
    }
  }
  EXPECT_GT(cases, 0);
}

// A cpu_onednn option that is a flag or "timed" (int8_winograd, wino_few_tiles_f2) set to `value`, anything else:
// the plugin does not load in that environment, and its reason names the option and the value.
void expect_choice_refused(const std::string& option, const std::string& value) {
  EnvironmentOptions bad;
  bad.plugin_options["cpu_onednn"][option] = value;
  auto refused = Environment::create(bad);
  ASSERT_TRUE(refused.is_ok()) << refused.status().to_string();
  bool seen = false;
  for (const auto& p : (*refused)->plugins())
    if (p.name == "cpu_onednn") {
      seen = true;
      EXPECT_NE(p.state, PluginState::kLoaded) << option << " = " << value;
      EXPECT_NE(p.reason.find(option + " must be true, false or \"timed\", not \"" + value + "\""), std::string::npos)
          << p.reason;
    }
  EXPECT_TRUE(seen) << "cpu_onednn not listed with " << option << " = " << value;
}

// The cpu_onednn option int8_winograd (plugins/cpu_onednn/README.md): in an environment that sets it, the QConv cases
// oneDNN's int8 Winograd takes (3x3, stride 1, no groups, channels multiples of 16, u8 X and output without zero
// points, Relu or none) run on it, as standalone kernels and in chains. Winograd requantizes in the transformed domain
// (the input's bytes / 4, the weights * 4/9), so the outputs stay within a few quantization steps of the direct
// kernel's but are not bit-equal to them: a case whose outputs are equal means the option did nothing. A value that is
// not a flag or "timed" keeps the plugin from loading in that environment alone, with a reason naming the option.
TEST(DeviceConformance, Int8WinogradOptionRunsTheQConvsItTakes) {
  Envs& e = envs();
  ASSERT_TRUE(e.dut);
  if (!plugin_loaded(*e.dut, "cpu_onednn")) GTEST_SKIP() << "cpu_onednn is not loaded";
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "oneDNN's int8 Winograd needs AVX-512";
  ASSERT_NO_FATAL_FAILURE(expect_choice_refused("int8_winograd", "sometimes"));
  EnvironmentOptions o;
  o.plugin_options["cpu_onednn"]["int8_winograd"] = "true";
  auto wino = Environment::create(o);
  ASSERT_TRUE(wino.is_ok()) << wino.status().to_string();
  ASSERT_TRUE(plugin_loaded(**wino, "cpu_onednn"));
  auto attr_ints = [](const OpCase& c, const char* k) {
    auto a = c.attrs.find(k);
    return a == c.attrs.end() ? std::vector<int64_t>{} : a->second.ints;
  };
  auto takes = [&](const OpCase& c) {
    if (c.op != "QConv" || c.inputs.size() != 8 || c.attrs.count("activation_params")) return false;
    const Shape& x = c.inputs[0].shape;
    const Shape& w = c.inputs[1].shape;
    return attr_ints(c, "kernel_shape") == std::vector<int64_t>{3, 3} &&
           attr_ints(c, "strides") == std::vector<int64_t>{1, 1} && c.attrs.count("group") &&
           c.attrs.at("group").i == 1 && x[1] % 16 == 0 && w[0] % 16 == 0 && c.inputs[0].dtype == DType::kU8 &&
           c.inputs[4].values == std::vector<float>{0.f} && c.inputs[7].values == std::vector<float>{0.f} &&
           c.inputs[7].dtype == DType::kU8;
  };
  // ResNet's basic block in a chain (device_cts.cc): its 3x3s with the residual stream as Z, as a sum under an f32
  // output, computed in f32 and requantized by a step of its own under a u8 one (chains only: the standalone kernel
  // keeps its binary add).
  auto block = [](const OpCase& c) { return c.label.rfind("int8 ResNet basic block", 0) == 0; };
  int runs = 0, differ = 0;
  for (const OpCase& c : all_cases()) {
    const bool chain_only = block(c);
    if (!takes(c) && !chain_only) continue;
    for (int claims = chain_only ? 1 : 0; claims < 2; ++claims) {
      ++runs;
      std::vector<Tensor> outs[2];
      for (int k = 0; k < 2; ++k) ASSERT_NO_FATAL_FAILURE(run_case(k ? **wino : *e.dut, c, claims != 0, outs[k]));
      const Tensor &a = outs[0].at(0), &b = outs[1].at(0);
      ASSERT_EQ(a.dtype(), b.dtype()) << c.label;
      ASSERT_EQ(a.shape(), b.shape()) << c.label;
      // In output units: quantization steps for u8, values for f32.
      auto at = [](const Tensor& t, int64_t i) {
        return t.dtype() == DType::kU8 ? static_cast<double>(static_cast<const uint8_t*>(t.raw_data())[i])
                                       : static_cast<double>(t.data<float>()[i]);
      };
      ASSERT_TRUE(a.dtype() == DType::kU8 || a.dtype() == DType::kF32) << c.label;
      double worst = 0, sum = 0, sq = 0, ref = 0;
      for (int64_t i = 0; i < a.numel(); ++i) {
        const double d = std::fabs(at(a, i) - at(b, i));
        worst = std::max(worst, d);
        sum += d;
        sq += d * d;
        ref += at(a, i) * at(a, i);
      }
      const double mean = sum / static_cast<double>(a.numel()), rel = std::sqrt(sq / std::max(ref, 1e-30));
      std::cout << c.label << (claims ? " (chain)" : " (kernel)") << ": Winograd vs direct, worst " << worst
                << ", mean " << mean << (a.dtype() == DType::kU8 ? " steps" : "") << ", relative L2 " << rel << "\n";
      // Measured: one layer (the QConv cases, full-range random bytes and weights) relative L2 0.014-0.018, mean
      // 0.3-0.7 steps, worst 4-11 of 255; the block's two stacked 3x3s 0.035 (f32) and 0.040 (u8: mean 1.6, worst 16).
      const int layers = chain_only ? 2 : 1;
      EXPECT_LE(rel, 0.03 * layers) << c.label;
      if (a.dtype() == DType::kU8) {
        EXPECT_LE(mean, 1.25 * layers) << c.label;
        EXPECT_LE(worst, 16 * layers) << c.label;
      }
      if (worst > 0) ++differ;
    }
  }
  EXPECT_GE(runs, 6) << "fewer cases that the int8 Winograd takes than expected: fix the case table";
  EXPECT_EQ(differ, runs) << "a case ran on the direct kernel with int8_winograd = true";
}

// The cpu_onednn option wino_few_tiles_f2 (plugins/cpu_onednn/README.md): ResNet's basic block at 14x14 (16 tiles
// of F(4,3), transformed weights past 3 MiB: the own Winograd step position by position) runs in F(2,3) with `true`,
// in F(4,3) with `false`, and in whichever timed faster with "timed" (the default; a claim's plan times it at its
// first run, chain/runtime.cc). Each within Winograd's rounding of the reference kernels; the two forms round
// differently, so equal outputs under `true` and `false` mean the option did nothing. A value that is not a flag or
// "timed" keeps the plugin from loading in that environment, with a reason naming the option.
TEST(DeviceConformance, WinoFewTilesF2OptionPicksTheForm) {
  Envs& e = envs();
  ASSERT_TRUE(e.dut && e.oracle);
  if (!plugin_loaded(*e.dut, "cpu_onednn")) GTEST_SKIP() << "cpu_onednn is not loaded";
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "the own Winograd step needs AVX-512";
  ASSERT_NO_FATAL_FAILURE(expect_choice_refused("wino_few_tiles_f2", "often"));
  const OpCase* block = nullptr;
  const auto cases = all_cases();
  for (const OpCase& c : cases)
    if (c.label == "resnet basic block C=160 14x14") block = &c;
  ASSERT_NE(block, nullptr) << "the case table lost ResNet's basic block at 14x14";
  std::vector<Tensor> want;
  ASSERT_NO_FATAL_FAILURE(run_case(*e.oracle, *block, false, want));
  // The outputs live in their environment's memory: the environments are declared first, to be destroyed last.
  std::vector<std::unique_ptr<Environment>> envs_of;
  std::map<std::string, std::vector<Tensor>> got;
  for (const char* v : {"true", "false", "timed"}) {
    EnvironmentOptions o;
    o.plugin_options["cpu_onednn"]["wino_few_tiles_f2"] = v;
    auto env = Environment::create(o);
    ASSERT_TRUE(env.is_ok()) << env.status().to_string();
    envs_of.push_back(std::move(env).value());
    ASSERT_TRUE(plugin_loaded(*envs_of.back(), "cpu_onednn")) << v;
    bool chained = false;
    ASSERT_NO_FATAL_FAILURE(run_case(*envs_of.back(), *block, true, got[v], &chained));
    EXPECT_TRUE(chained) << v;
    const Tensor &a = want.at(0), &b = got[v].at(0);
    ASSERT_EQ(a.shape(), b.shape()) << v;
    double sq = 0, ref = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double d = static_cast<double>(a.data<float>()[i]) - b.data<float>()[i];
      sq += d * d;
      ref += static_cast<double>(a.data<float>()[i]) * a.data<float>()[i];
    }
    EXPECT_LE(std::sqrt(sq / std::max(ref, 1e-30)), 1e-5) << "wino_few_tiles_f2 = " << v;
  }
  const Tensor &f2 = got["true"].at(0), &f4 = got["false"].at(0);
  EXPECT_NE(std::memcmp(f2.raw_data(), f4.raw_data(), static_cast<size_t>(f2.numel()) * sizeof(float)), 0)
      << "F(2,3) and F(4,3) gave bit-equal outputs: the option changed nothing";
}

TEST(DeviceConformance, OtherDevices) {
  Envs& e = envs();
  ASSERT_TRUE(e.dut && e.oracle);
  int tested = 0;
  for (const std::string& dev : e.dut->registry().device_types()) {
    if (dev == "cpu" || dev == "null") continue;  // cpu: above; null: the skeleton, which runs nothing
    Options o;
    o.device = dev;
    o.out = &std::cout;
    Report r = run(*e.dut, *e.oracle, o);
    EXPECT_EQ(r.failed, 0) << dev;
    EXPECT_EQ(r.errors, 0) << dev;
    ++tested;
  }
  if (tested == 0) GTEST_SKIP() << "no device type besides cpu present (no GPU plugin loaded)";
}

}  // namespace
}  // namespace keel::cts
