// keel/tools/serve/model.h — one served model version: its config, instances, request queue and dynamic batcher.
//
// A ServedModel owns `instances` sessions of one ONNX file (one session per instance, each run by its own worker
// thread) and one request queue. submit() queues a request (its inputs in the model's input order) and returns a
// future; a worker takes the oldest request and, when max_batch_size > 0, every queued request whose inputs have the
// same dtypes and non-batch dims, up to max_batch_size rows or until the oldest has waited max_queue_delay_us,
// concatenates them along dim 0, runs one batch and splits the outputs back in request order (each request gets a
// view of the batch outputs: no copy). Requests whose non-batch dims differ are batched separately.
//
// Thread-safety: submit(), metrics() and the accessors may be called from any thread. shutdown() (also run by the
// destructor) stops accepting, lets the workers finish every queued request, and joins them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/base/status.h"
#include "core/base/tensor.h"
#include "core/runtime/environment.h"
#include "core/runtime/session.h"

namespace keel::serve {

// DIR/<model>/config.toml; every key optional. Unknown keys are an error (a typo must not pass silently).
struct ModelConfig {
  int64_t max_batch_size = 0;          // 0 = no batching; > 0: dim 0 of every input is the batch dim
  int64_t max_queue_delay_us = 0;      // how long the oldest request may wait for a fuller batch
  int64_t max_queue_size = 1024;       // queued requests beyond this are refused (503)
  int64_t instances = 1;               // sessions (and worker threads) of this model
  int64_t threads = 0;                 // kernel threads per instance; 0 = the server's --threads
  std::vector<std::string> passes;     // session passes by name
  std::string device;                  // "" = every device by priority; else "cpu", "cuda:0", ...
};
// INVALID_ARGUMENT naming the file and key for a malformed file, a wrong type or a value out of range.
StatusOr<ModelConfig> parse_model_config(const std::filesystem::path& file);

// A graph input or output as the metadata endpoint shows it (dims of -1 are dynamic).
struct TensorSpec {
  std::string name;
  DType dtype = DType::kUndefined;
  Shape shape;       // empty with `has_shape` false when the rank is unknown
  bool has_shape = true;
};

// Cumulative counters since load (Prometheus counters).
struct ModelMetrics {
  std::atomic<uint64_t> request_success{0}, request_failure{0}, request_rejected{0};
  std::atomic<uint64_t> inference_count{0};   // rows (batch items) inferred
  std::atomic<uint64_t> execution_count{0};   // session runs
  std::atomic<uint64_t> queue_us{0}, compute_us{0};
  std::atomic<int64_t> pending{0};
};

class ServedModel {
 public:
  using Outputs = StatusOr<std::vector<Tensor>>;
  // Loads `file` into `config.instances` sessions. `default_threads` is used when config.threads is 0. The
  // environment must outlive the model.
  static StatusOr<std::unique_ptr<ServedModel>> create(Environment& env, std::string name, int64_t version,
                                                       const std::filesystem::path& file, ModelConfig config,
                                                       int32_t default_threads);
  ~ServedModel();

  const std::string& name() const { return name_; }
  int64_t version() const { return version_; }
  const ModelConfig& config() const { return config_; }
  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }
  ModelMetrics& metrics() { return metrics_; }

  // Queues one request; `inputs` are host tensors in inputs() order, already checked against the specs. UNAVAILABLE
  // when the queue is full or the model shuts down; INVALID_ARGUMENT when the batch dim exceeds max_batch_size.
  StatusOr<std::future<Outputs>> submit(std::vector<Tensor> inputs);
  void shutdown();

 private:
  struct Request {
    std::vector<Tensor> inputs;
    int64_t rows = 1;
    std::chrono::steady_clock::time_point enqueued;
    std::promise<Outputs> done;
  };
  ServedModel() = default;
  void worker(size_t instance);
  void execute(Session& session, std::vector<std::shared_ptr<Request>>& batch);
  bool compatible(const Request& a, const Request& b) const;

  std::string name_;
  int64_t version_ = 0;
  ModelConfig config_;
  std::vector<TensorSpec> inputs_, outputs_;
  std::vector<std::unique_ptr<Session>> sessions_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  bool stopping_ = false;
  ModelMetrics metrics_;
};

}  // namespace keel::serve
