// keel/tools/keel/commands.h — the `keel` command line: each subcommand registers itself on the CLI11 app.
//
// Every command returns its exit status through the callback by throwing CLI::RuntimeError(code) only for
// non-zero exits; errors are printed to stderr with the reason. Exit codes: 0 ok, 1 runtime error (bad model,
// failed run), 2 usage error (CLI11), 3 conformance/regression failure.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/base/graph.h"
#include "core/base/tensor.h"
#include "core/runtime/environment.h"

namespace keel::cli {

// Flags every command shares (set on the top-level app).
struct Globals {
  std::vector<std::string> plugin_paths;  // --plugin-path (repeatable)
  std::string log_level = "warn";         // --log-level trace|debug|info|warn|error|off (or KEEL_LOG_LEVEL)
  int threads = 0;                        // --threads (0 = all cores)
};

// Validators for numeric options. CLI11 2.1's PositiveNumber / NonNegativeNumber answer "--batch: Value 0 not in
// range 0.000000 to 1797693134862315708...(309 digits).000000"; these say what is wanted ("--batch: 0 is not a
// positive number", "--epochs: -1 is not a number >= 0") and show the same type names in --help.
inline CLI::Validator number_validator(bool strictly_positive) {
  return CLI::Validator(
      [strictly_positive](std::string& in) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        if (in.empty() || end == nullptr || *end != '\0') return in + " is not a number";
        if (strictly_positive && !(v > 0)) return in + " is not a positive number";
        if (!strictly_positive && !(v >= 0)) return in + " is not a number >= 0";
        return "";
      },
      strictly_positive ? "POSITIVE" : "NONNEGATIVE");
}
inline const CLI::Validator kPositive = number_validator(true);
inline const CLI::Validator kNonNegative = number_validator(false);

// Random data for a graph input: normal floats, small non-negative integers, random bools (cmd_run.cc).
StatusOr<Tensor> random_input(DType dtype, const Shape& shape, std::mt19937& rng);

// Creates the environment from the global flags; prints the error and returns nullptr on failure.
std::unique_ptr<Environment> make_environment(const Globals& g);

// `--device` of run / bench / train (cmd_run.cc): "TYPE" or "TYPE:INDEX" ("cuda:1"), checked against the
// environment's devices (keel::DeviceSpec: a clear error for "cuda:x", an unknown type, an index past the devices).
// Returns the spec for SessionOptions::devices ("" stays "": every device by priority).
StatusOr<std::string> device_option(const Environment& env, const std::string& device);
// In a data-parallel job (more than one rank in the process environment: dist::identity_from_env), a non-CPU
// `device` given without an index takes the card of the rank's LOCAL_RANK ("cuda" -> "cuda:1" on local rank 1);
// anything else is returned as it is. INVALID_ARGUMENT for a malformed spec or rank environment.
StatusOr<std::string> device_for_local_rank(const std::string& device);

void add_plugins_command(CLI::App& app, Globals& g);
void add_demo_command(CLI::App& app, Globals& g);
// ONNX commands (cmd_run.cc, cmd_info.cc, cmd_conformance.cc).
void add_run_command(CLI::App& app, Globals& g);
void add_info_command(CLI::App& app, Globals& g);
void add_conformance_command(CLI::App& app, Globals& g);
// `keel bench` (cmd_bench.cc): latency, throughput, memory and a per-op-type profile of a model.
void add_bench_command(CLI::App& app, Globals& g);
void add_optimize_command(CLI::App& app, Globals& g);  // cmd_optimize.cc: graph pass pipelines
// The default pipeline (cmd_optimize.cc; what `keel optimize` runs without --passes/--config and what `--passes auto`
// runs on an fp32 model): canonicalise, fold BatchNormalization, fuse, clean up; only the passes installed here, the
// others named in `missing` when given.
std::vector<std::string> default_pipeline(const Environment& env, std::vector<std::string>* missing = nullptr);
void add_prune_command(CLI::App& app, Globals& g);     // cmd_prune.cc: `keel prune`
void add_quantize_command(CLI::App& app, Globals& g);  // cmd_quantize.cc: `keel quantize` (INT8 PTQ)
// The session passes of `keel run` / `keel bench` --passes (cmd_quantize.cc): "auto" = fuse_qdq when the graph has
// DequantizeLinear nodes and the pass is installed (QDQ models run on int8 kernels), else the default pipeline (as
// ONNX Runtime optimises a session by default); "none" = none, else a comma list (entries may carry options,
// "name:key=value").
std::vector<std::string> session_passes(const std::string& spec, const Graph& graph, const Environment& env);
// `--precision fp32|fp16|bf16` of `keel run` / `keel bench` (cmd_run.cc): the option, and the session passes with
// convert_fp16 / convert_bf16 (the precision pass plugin) appended; fp32 leaves them unchanged. With `--passes auto`
// (`auto_passes`), bf16 first folds BatchNormalization and fuses Conv+bias+residual+activation (fuse_conv_bn,
// fuse_conv_activation, where installed): bf16 nodes run one by one, and keel.FusedConv runs as one oneDNN primitive
// with post-ops. Fails when the precision pass is not installed.
void add_precision_option(CLI::App* cmd, std::string& precision);
Status append_precision_pass(const std::string& precision, bool auto_passes, const Environment& env,
                             std::vector<std::string>& passes);
// cmd_train.cc: `keel train` (SimpleCNN on Fashion-MNIST → trace → ONNX → INT8) and `keel plot` (scalar-log curves).
void add_train_command(CLI::App& app, Globals& g);
void add_plot_command(CLI::App& app, Globals& g);

// `keel plugin-test MANIFEST` (cmd_plugin_test.cc): the plugin conformance kit (device CTS + models, per-op report).
void add_plugin_test_command(CLI::App& app, Globals& g);

// `keel launch` (cmd_launch.cc): starts the ranks of a distributed job on this node; run_launch is the same without
// the command line (what `keel train --nproc N` can call). Returns the exit status (0, 1 failure, 2 usage,
// 128+signal when interrupted).
struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0 on one node: a free port
  int max_restarts = 0;
  std::string log_dir;  // empty: prefix lines on the launcher's stdout/stderr
  double grace_period_s = 5;
  int tail_lines = 20;
  // "auto": pin each local rank to its own share of the launcher's CPUs (whole cores, SMT siblings together) when
  // there are at least as many CPUs as local ranks; "none": do not pin.
  std::string cpu_affinity = "auto";
  std::vector<std::string> command;  // PROGRAM ARGS...
};
int run_launch(const LaunchOptions& options);
void add_launch_command(CLI::App& app, Globals& g);
// `keel serve` (cmd_serve.cc): a model repository over HTTP, KServe v2 (tools/serve).
void add_serve_command(CLI::App& app, Globals& g);

}  // namespace keel::cli
