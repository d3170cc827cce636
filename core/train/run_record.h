// keel/core/train/run_record.h — experiment records: what a training run needs to be reproduced and compared.
//
// A RunRecord is one JSON document (run.json, written beside the run's log and checkpoints) with:
//   "keel": {"version", "source_revision", "plugin_abi"}   the build that ran (source_revision: `git describe
//                                                          --always --dirty` at build time, "unknown" outside git)
//   "host": {"hostname", "threads", "devices": [{"type", "count", "plugin"}], "plugins": [{"name", "version", "kind",
//            "state", "reason"}]}
//   "command": [argv...], "hyperparameters": {...}, "seed"
//   "data": {"path", "files": [{"name", "bytes", "sha256"}], "samples": {"train", "test"}}
//   "start_time", "end_time" (UTC, ISO 8601), "status": "running" | "completed" | "failed", "error"
//   "epochs": [{per-epoch metrics}], "final": {final metrics}, "log", "checkpoint", "outputs"
// save() writes atomically (a temporary file renamed over the target), so a reader never sees half a record; a run
// saves it at the start, after every epoch and at the end, so a crashed run leaves its record ("running").
//
// Histograms (VisualDL's "parameter distributions"): histogram() bins one tensor; module_histograms() every
// parameter's values or gradients of a module, as the log's "histograms" records hold them:
//   {"kind": "histograms", "epoch": e, "params": {name: H}, "grads": {name: H}}   H = {"lo", "hi", "counts": [...],
//   "mean", "std", "nonfinite"}
//
// Errors: Status naming the file and the problem. Thread-safety: free functions are thread-safe; a RunRecord is a
// value used by one thread.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/runtime/eager.h"
#include "core/runtime/environment.h"
#include "core/train/nn.h"

namespace keel::train {

// SHA-256 of a file (lower-case hex) and of bytes in memory (OpenSSL's libcrypto; sha256_hex gives "" where OpenSSL
// fails, which only running out of memory makes it do).
StatusOr<std::string> sha256_file(const std::filesystem::path& file);
std::string sha256_hex(const void* data, size_t size);

// Every regular file directly in `path` (a directory; sorted by name) or `path` itself (a file): name, size, SHA-256.
StatusOr<nlohmann::json> describe_data_files(const std::filesystem::path& path);

// Keel's version, source revision and plugin ABI.
nlohmann::json build_info();
// The environment: host name, thread count, device types (with counts and the plugin that provides them), plugins.
nlohmann::json environment_info(Environment& env);
// Now, UTC, ISO 8601 with milliseconds ("2026-12-02T00:41:07.123Z").
std::string utc_now();

struct Histogram {
  double lo = 0, hi = 0, mean = 0, stddev = 0;
  std::vector<int64_t> counts;  // `bins` equal-width bins over [lo, hi] (all in the first when lo == hi)
  int64_t nonfinite = 0;        // NaN/inf values (not binned)
  nlohmann::json to_json() const;
};
// Bins a floating tensor of any device and dtype (copied to the host as f32). bins >= 1.
Histogram histogram(const eager::Tensor& t, int bins = 30);
// {name: histogram} for every parameter of `model` (grads = true: of its gradient; parameters without one are left
// out).
nlohmann::json module_histograms(const nn::Module& model, bool grads, int bins = 30);

class RunRecord {
 public:
  RunRecord();
  nlohmann::json& json() { return j_; }
  const nlohmann::json& json() const { return j_; }
  void add_epoch(nlohmann::json metrics) { j_["epochs"].push_back(std::move(metrics)); }
  // Sets end_time, status ("completed" or "failed") and, when failed, the error.
  void finish(nlohmann::json final_metrics, const std::string& error = {});
  Status save(const std::filesystem::path& file) const;
  static StatusOr<RunRecord> load(const std::filesystem::path& file);

 private:
  nlohmann::json j_;
};

}  // namespace keel::train
