// keel/tools/conformance/device_cts.h — the device conformance suite (CTS): every kernel of a device
// against the reference kernels.
//
// For each case of an ordered table of op cases (sweeps of shapes around tile edges, odd sizes, broadcasting,
// padding, strides, groups), the suite builds a one-node graph with GraphBuilder, runs it in a Session placed on
// the device under test (SessionOptions.devices = {device}, fallback = error) and in a Session of an oracle
// environment that holds only the built-in reference device, and compares the outputs within tolerance. It
// records which kernel served the node (Session::placement()), so that a device type served by several plugins
// (oneDNN and the reference kernels both serve "cpu") can check that the kernels it means to test are the ones
// that ran. Each failure comes with a one-line repro:
//   keel-cts --device cpu --op Conv --case 'N=1 C=3 H=7 W=9 K=5 k=3 s=2 p=1 g=1'
//
// One library (keel_device_cts, built in every configuration, no gtest) serves `keel plugin-test`, the gtest
// (tests/device_conformance/device_conformance_test), the `keel-cts` CLI and the CUDA plugin test.
// Not thread-safe: run one suite at a time per pair of environments.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/base/graph.h"
#include "core/runtime/environment.h"

namespace keel::cts {

// One input of a case. An empty name is an absent optional input.
struct InputSpec {
  std::string name;
  Shape shape;
  bool constant = false;      // an initializer (kernels see its data at create time)
  float lo = -1.f, hi = 1.f;  // uniform random range
  std::vector<float> values;  // explicit values (override the random ones)
  DType dtype = DType::kF32;  // f32, or an integer type (random integers in [lo, hi], or the values)
};

// One node of a chain case: `inputs` name case inputs (InputSpec.name) or earlier nodes' outputs ("$0", "$1", ...:
// node k's first output; "$k:i" its output i; "" = an absent optional input).
struct ChainNode {
  std::string op;  // an ai.onnx op type, or "domain.Op" (e.g. "keel.Gelu", the fusion passes' ops)
  std::vector<std::string> inputs;
  std::map<std::string, Attribute> attrs;
  size_t num_outputs = 1;  // Split's parts
};

struct OpCase {
  std::string op;     // ONNX op type; "Chain" for a chain case (a device may claim it as one subgraph)
  std::string label;  // the case's parameters, e.g. "N=1 C=3 H=7 W=9 K=5 k=3 s=2 p=1 g=1"; unique within the op
  int32_t opset = 17;
  std::vector<InputSpec> inputs;
  std::map<std::string, Attribute> attrs;
  std::vector<std::pair<size_t, Tensor>> int64_constants;  // inputs (by index) given as these exact tensors
  size_t num_outputs = 1;                                  // outputs the node declares; only the first is compared
  double rtol = 1e-3, atol = 1e-4;                         // |out - ref| <= atol * max(1, max|ref|) + rtol * |ref|
  std::string domain;                                      // "" = ai.onnx; "keel" for Keel's own ops (opset 1)
  double int_tol = 1;         // integer outputs: |out - ref| <= int_tol (1: requantisation may round apart)
  DType dtype = DType::kF32;  // of the float inputs (f32, f16 or bf16; int64 inputs come from int64_constants)
  size_t output = 0;          // which output is compared (the others are computed but not compared)
  std::vector<size_t> unnamed_outputs;  // outputs the node leaves "" (as the autograd leaves gradients nobody needs)
  // A chain case (op "Chain"): these nodes in order instead of one node of `op`; the last one's output is
  // compared. The kernel recorded is the claimed subgraph's ("Subgraph" in the placement), "" when none ran.
  std::vector<ChainNode> chain;
  // A chain case that a device claiming chains should take whole, as one subgraph (the oneDNN plugin's test checks
  // that no node of it runs on a kernel of its own).
  bool claim_whole = false;
  // The device under test's session runs the graph passes `keel run` would (auto_pass_pipeline: the fusion passes,
  // or fuse_qdq for a QDQ graph) before placement; the reference runs the graph as written, so the passes are
  // checked too. Off: both run the graph as written.
  bool auto_passes = false;
  int32_t threads = 0;  // the device under test's session's kernel threads (0: the environment's pool)
  // A chain case's values ("$k") that are graph outputs too, after the last node's: compared as well (a fused
  // value that leaves the chain must be materialised, in the layout and with the values the graph says).
  std::vector<std::string> also_outputs;
  // A dynamic batch: when > 0, the graph declares dim 0 of every non-constant input unknown (-1, as torch exports
  // with dynamic_axes), and both sessions first run the inputs at this batch, then at the case's own: the two shape
  // variants the session builds are compared (the first's inputs are the case's at this batch).
  int64_t first_batch = 0;
  // Concurrent runs: when > 1, after its own run the device under test's session runs this many at once, from as
  // many threads: the case's inputs again and others drawn the same way with other seeds (with a dynamic batch, every
  // second one at first_batch and the third at a batch no run used before, whose shape variant is then built while
  // the others run), every second one on a second session that shares the first's build
  // (SessionOptions::share_weights_with) with a team of another size; each is compared with the reference's run of
  // the same inputs. Runs that share state they should not would swap or mix their results.
  int32_t concurrent_runs = 0;
  // A random case's generator call (random_chain_case(seed, dtype), or random_grad_case when `grads`), for its
  // repro; unset for the table's cases.
  struct Generated {
    uint64_t seed = 0;
    DType mode = DType::kF32;  // f32, bf16, or i8 (the int8 QDQ chains)
    bool grads = false;
  };
  std::optional<Generated> generated;
};

// A case as a graph, and the values of its non-constant inputs (what the suite runs). With `batch` > 0 the
// non-constant inputs' dim 0 is that instead of the case's; with `salt` their values are drawn with other seeds.
struct Built {
  Graph graph;
  std::vector<std::pair<std::string, Tensor>> feeds;
};
Built build(const OpCase& c, int64_t batch = 0, uint32_t salt = 0);

// The table of cases, in a fixed order (ops alphabetically grouped as listed in device_cts.cc).
const std::vector<OpCase>& all_cases();

// kUnsupported: the device under test has no kernel that accepts the case (session creation says UNIMPLEMENTED).
enum class Outcome { kPass, kFail, kError, kInvalid, kUnsupported };
const char* outcome_name(Outcome o);

struct CaseResult {
  const OpCase* c = nullptr;
  Outcome outcome = Outcome::kPass;
  std::string kernel;  // the kernel that ran the node on the device under test ("" when the session failed)
  double max_abs_err = 0, max_rel_err = 0;
  std::string message;  // what went wrong
  std::string repro;    // the one-line command
};

struct Options {
  std::string device = "cpu";
  std::string op;             // only this op ("" = every op)
  std::string label;          // only this case label ("" = every case)
  std::string kernel_prefix;  // when set, cases served by a kernel without this prefix are "not native"
  bool verbose = false;       // print every case, not only failures
  const std::vector<OpCase>* cases = nullptr;      // the cases to run (nullptr: all_cases())
  std::ostream* out = nullptr;                     // where to print (nullptr = silent)
  std::function<void(const CaseResult&)> on_case;  // called after every case run (a progress bar), or empty
};

struct Report {
  std::vector<CaseResult> results;
  int passed = 0, failed = 0, errors = 0, invalid = 0, unsupported = 0;
  int native = 0;  // cases served by a kernel with Options.kernel_prefix (all cases when no prefix is set)
  bool ok() const { return failed == 0 && errors == 0; }
  // "ops: Conv 40/40 native, ..." — the per-op count of cases served by a kernel with the prefix.
  std::map<std::string, std::pair<int, int>> native_by_op;
};

// Runs the suite: `dut` is the environment holding the device under test, `oracle` one with only the reference
// device (EnvironmentOptions.discover_plugins = false).
Report run(Environment& dut, Environment& oracle, const Options& options);

// Whether `options` selects case `c` (its op and label filters; every case when they are empty).
bool selected(const Options& options, const OpCase& c);

// The repro command of a case.
std::string repro(const std::string& device, const OpCase& c);

// Random chains, a differential fuzzer of what chain-claiming devices fuse (random_chains.cc): case `seed` strings
// 2 to 6 random blocks of the kinds CNNs and ConvNeXt-like models are made of (convolutions of every kind with
// BatchNormalization and activations, residuals, scales, pooling, a channels-last MLP between Transposes, Concat,
// Resize, a squeeze-and-excitation gate, a classifier head) or of transformer-like ones over sequences, run on the
// device after `keel run`'s passes (auto_passes) on a team of 1 to 3 threads. The same seed always gives the same
// case: op "RandomChain", label "seed=N: <threads> <its blocks>", repro `keel-cts --device D --random-chains 1
// --seed N`. With dtype bf16 every float input is bf16 (the graph as convert_precision leaves it;
// label "seed=N bf16: ...", repro with --bf16), compared within bf16's rounding; with dtype i8 the case is an int8
// QDQ model of convolutions instead (quantized inputs, per-channel int8 weights: "seed=N int8: ...", --int8).
OpCase random_chain_case(uint64_t seed, DType dtype = DType::kF32);

// Random gradients, a differential fuzzer of the backward ops training runs (random_grads.cc): case `seed` is one
// backward op (keel.ConvGrad of every geometry: rectangular kernels, per-axis strides, asymmetric pads, dilations,
// groups, depthwise, 1-D to 3-D; keel.FusedConvMaxPool and its gradient; max / average pooling's; BatchNorm's and
// LayerNorm's; the activations'; SoftmaxCrossEntropyLoss and its gradient; keel.GatherGrad; BatchNormTraining and
// LayerNormalization with their statistics; Momentum, keel.AdamStep and keel.CheckFiniteAndUnscale over 1-40 tensors)
// at random parameters, with a random subset of its outputs asked for, on a team of 1 to 3 threads, sometimes at
// another batch first or several runs at once. Label "seed=N: <threads> <its parameters>", op the backward op's, repro
// `keel-cts --device D
// --random-grads 1 --seed N`; with dtype bf16 ("seed=N bf16: ...", --bf16) the float inputs are bf16 (the f32-only
// ops are not drawn).
OpCase random_grad_case(uint64_t seed, DType dtype = DType::kF32);

}  // namespace keel::cts
