// `keel quantize MODEL.onnx --calib DIR -o OUT.onnx [--method mse|minmax|percentile|entropy] [--exclude NODES]
// [--tolerance T [--fallback sensitivity|prefix]] [--fallback-precision fp32|bf16]` — INT8 post-training quantization
// (tools/calibration/quantize.h):
// calibrates on the batches in DIR (layout in quantize.h and the README), writes standard QDQ ONNX, and prints each
// quantized layer's error (cosine and relative L2 error of its output vs fp32 on held-out batches, its input's
// calibrated range) and the error of the model's outputs.
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "core/runtime/onnx_io.h"
#include "core/runtime/pipelines.h"
#include "tools/calibration/quantize.h"
#include "tools/keel/commands.h"

namespace keel::cli {
namespace {

struct QuantizeArgs {
  std::string model, output, calib;
  QuantizeOptions opts;
  std::vector<std::string> exclude;
  bool per_tensor = false, quiet = false, no_bias_correction = false;
};

int quantize(QuantizeArgs& a, Globals& g) {
  for (const auto& e : a.exclude) {
    std::stringstream ss(e);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) a.opts.exclude.push_back(item);
  }
  a.opts.per_channel = !a.per_tensor;
  a.opts.bias_correction = !a.no_bias_correction;
  a.opts.progress = !a.quiet;
  auto env = make_environment(g);
  if (!env) return 1;
  auto loaded = load_onnx(a.model);
  if (!loaded.is_ok()) {
    std::cerr << "keel quantize: " << loaded.status().to_string() << "\n";
    return 1;
  }
  Graph graph = std::move(loaded).value();
  auto batches = read_calibration_dir(a.calib, graph.inputs);
  if (!batches.is_ok()) {
    std::cerr << "keel quantize: " << batches.status().to_string() << "\n";
    return 1;
  }
  std::cout << "calibration: " << batches->size() << " batches from " << a.calib << ", method " << a.opts.method
            << "\n";
  auto r = quantize_graph(*env, graph, *batches, a.opts);
  if (!r.is_ok()) {
    std::cerr << "keel quantize: " << r.status().to_string() << "\n";
    return 1;
  }
  QuantizeResult& res = r.value();
  size_t width = 4;
  for (const auto& l : res.layers) width = std::max(width, l.node.size());
  std::cout << "per-layer error (each layer alone, on " << res.heldout_batches << " held-out batch"
            << (res.heldout_batches == 1 ? "" : "es") << "):\n";
  std::cout << "  " << std::left << std::setw(static_cast<int>(width)) << "node"
            << "  " << std::setw(7) << "op" << std::right << std::setw(10) << "cosine" << std::setw(11) << "rel.err"
            << std::setw(26) << "input range (of min-max)"
            << (a.opts.tolerance > 0 && a.opts.fallback == "sensitivity" ? "  sensitivity" : "") << "  status\n";
  size_t quantized = 0;
  for (const auto& l : res.layers) {
    quantized += !l.kept_fp32;
    std::cout << "  " << std::left << std::setw(static_cast<int>(width)) << l.node << "  " << std::setw(7) << l.op_type
              << std::right << std::fixed << std::setprecision(5) << std::setw(10) << l.cosine << std::setw(11)
              << l.rel_error;
    {
      // The input's calibrated range and how much of the observed min-max width it keeps (below 100%: clipped).
      std::ostringstream rs;
      const double seen = std::max(l.observed_hi, 0.0) - std::min(l.observed_lo, 0.0);
      const double kept = std::max(l.range_hi, 0.0) - std::min(l.range_lo, 0.0);
      rs << std::fixed << std::setprecision(2) << "[" << l.range_lo << ", " << l.range_hi << "] ";
      if (seen > 0) rs << std::setprecision(0) << 100 * kept / seen << "%";
      else rs << "-";
      std::cout << std::setw(26) << (l.range_lo == 0 && l.range_hi == 0 && seen == 0 ? std::string("-") : rs.str());
    }
    if (a.opts.tolerance > 0 && a.opts.fallback == "sensitivity") std::cout << std::setw(13) << l.sensitivity;
    std::cout << "  " << (l.kept_fp32 ? "fp32" : "int8") << "\n";
  }
  std::cout << "outputs vs fp32 (held-out" << (a.opts.fallback_precision == "bf16" ? ", fp32 layers in bf16" : "")
            << "): cosine " << std::setprecision(5) << res.output_cosine << ", relative error " << res.output_rel_error
            << "\n";
  std::cout << quantized << " of " << res.layers.size() << " layers quantized\n";
  for (const auto& n : res.notes) std::cout << "note: " << n << "\n";
  Status st = save_onnx(res.graph, a.output);
  if (!st.is_ok()) {
    std::cerr << "keel quantize: " << st.to_string() << "\n";
    return 1;
  }
  std::cout << "wrote " << a.output << " (" << std::filesystem::file_size(a.output) << " bytes)\n";
  if (a.opts.fallback_precision == "bf16" && quantized < res.layers.size())
    std::cout << "run it with --precision bf16 (its fp32 layers in bf16, as measured above)\n";
  return 0;
}

}  // namespace

std::vector<std::string> session_passes(const std::string& spec, const Graph& graph, const Environment& env) {
  std::vector<std::string> out;
  if (spec == "none" || spec.empty()) return out;
  if (spec == "auto") return auto_pass_pipeline(graph, env.registry());  // as keel_session_options_set_pipeline
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

void add_quantize_command(CLI::App& app, Globals& g) {
  auto a = std::make_shared<QuantizeArgs>();
  auto* cmd = app.add_subcommand("quantize",
                                 "INT8 post-training quantization to QDQ ONNX: calibration, per-layer "
                                 "error report, fp32 fallback for layers that lose too much");
  cmd->add_option("model", a->model, "The fp32 model (.onnx)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--calib,-c", a->calib,
                  "Calibration data: one subfolder per batch holding NAME.npy/NAME.pb (or input_K.pb) per input; for a "
                  "single-input model also a flat folder of .npy/.pb files. The last fifth is held out for the report")
      ->required();
  cmd->add_option("--output,-o", a->output, "Where to write the QDQ model (.onnx)")->required();
  cmd->add_option("--method,-m", a->opts.method,
                  "Calibration: mse (default: each activation's range with the least expected squared error, rounding "
                  "plus clipping), minmax, percentile or entropy (KL, TensorRT-style)")
      ->check(CLI::IsMember({"minmax", "percentile", "entropy", "mse"}));
  cmd->add_option("--percentile", a->opts.percentile, "Percentile kept on each tail by --method percentile (99.99)");
  cmd->add_option("--exclude,-x", a->exclude, "Node names to keep in fp32 (comma-separated, repeatable)");
  cmd->add_option("--tolerance,-t", a->opts.tolerance,
                  "Keep the worst layers in fp32 until the outputs' relative L2 error is at most T (0 = off)")
      ->check(kNonNegative);
  cmd->add_option("--fallback", a->opts.fallback,
                  "How --tolerance picks the fp32 layers: sensitivity (the most sensitive first) or prefix (the fewest "
                  "leading layers, one cheap fp32 -> int8 boundary)")
      ->check(CLI::IsMember({"sensitivity", "prefix"}));
  cmd->add_option("--fallback-precision", a->opts.fallback_precision,
                  "What the layers kept in fp32 will run in: fp32 (default) or bf16 (run the model with --precision "
                  "bf16: the error report and --tolerance then measure it so, on the int8 kernels)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--activations", a->opts.activation_type, "Activation type: u8 (asymmetric) or s8 (symmetric)")
      ->check(CLI::IsMember({"u8", "s8"}));
  cmd->add_flag("--per-tensor", a->per_tensor, "Weights per tensor instead of per output channel");
  cmd->add_flag("--no-bias-correction", a->no_bias_correction,
                "Keep the biases as they are (default: subtract each layer's weight-rounding shift dW.E[x])");
  cmd->add_option("--weight-rounding", a->opts.weight_rounding,
                  "Weight rounding: nearest (each weight to its nearest int8 level) or gptq (each layer's rounding "
                  "errors compensated against its inputs on the calibration batches: lower output error)")
      ->check(CLI::IsMember({"nearest", "gptq"}));
  cmd->add_option("--device", a->opts.device, "Device for the calibration and evaluation sessions (cpu)");
  cmd->add_flag("--quiet,-q", a->quiet, "No progress bar");
  cmd->callback([a, &g] {
    int rc = quantize(*a, g);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace keel::cli
