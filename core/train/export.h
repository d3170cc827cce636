// keel/core/train/export.h — a trained module to ONNX in one call (trace → graph IR → .onnx), and the environment
// set-up a training program does first.
//
// export_onnx traces `model` on `example` (eval mode, no grad, fp32: an autocast guard of the caller is suspended),
// names the initializers after the module's parameters and buffers ("conv.weight"), and saves the graph. With
// dynamic_batch the input's and outputs' first dimension become dynamic ("N") when the traced graph allows it —
// checked by building the graph in a Session and running it at another batch size — else the result is an
// INVALID_ARGUMENT naming what pinned the batch (pass dynamic_batch = false to keep the traced shapes). Reshapes traced
// with a constant target that starts with the traced batch are rewritten to copy the input's dim (ONNX's 0), as
// torch.onnx's dynamic axes do. The model's training mode is restored on return.
//
// Errors: a Status naming the model and the problem (tracing, the batch, writing the file). Never throws.
// Thread-safety: call from the thread that owns the model; uses this thread's tracer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "core/base/graph.h"
#include "core/base/status.h"
#include "core/runtime/eager.h"
#include "core/runtime/environment.h"
#include "core/train/nn.h"

namespace keel::train {

struct ExportOptions {
  std::string graph_name = "model";
  std::string input_name = "input";
  std::string output_name = "output";
  bool dynamic_batch = true;
  int32_t opset = 17;
};

// The traced graph (validated, shapes inferred); what export_onnx saves.
StatusOr<Graph> trace_module(nn::Module& model, const eager::Tensor& example, const ExportOptions& options = {});
// trace_module + save_onnx(path). Returns the saved graph's node count.
StatusOr<int64_t> export_onnx(nn::Module& model, const eager::Tensor& example, const std::filesystem::path& path,
                              const ExportOptions& options = {});

// The runtime for a training program, as `keel train` sets it up: sets OMP_WAIT_POLICY=PASSIVE unless the process
// set a policy (OpenMP threads that spin between eager ops' short parallel regions starve the training thread),
// creates an Environment that discovers plugins (KEEL_PLUGIN_PATH, ~/.local/lib/keel/plugins, the plugins installed
// beside libkeel_core), with `threads` kernel threads (0 = all cores), and binds eager ops to it (eager::init).
// Call once, before any eager op. Returns the environment (shared with the eager runtime).
StatusOr<std::shared_ptr<Environment>> init_runtime(int32_t threads = 0);

}  // namespace keel::train
