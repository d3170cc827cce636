// keel/tools/serve/model.h — one served model version: its config, instances, request queue and dynamic batcher.
//
// A ServedModel owns `instances` sessions of one ONNX file (one session per instance, each built, warmed up and run
// by its own worker thread, not by a caller's thread unless single-threaded: see create() in model.cc for why) and
// one request queue. The
// graph passes run once, on instance 0's thread, before it builds the session; the others share its build
// (SessionOptions::share_weights_with: kernels with their prepacked weights, shape variants, activation plans), each
// with its own thread pool: one copy of the weights for all instances.
//
// submit() queues a request (its inputs in the model's input order) and returns a future; a worker takes the oldest
// request and, when max_batch_size > 0, every queued request whose inputs have the same dtypes and non-batch dims,
// until the batch holds max_batch_size rows, or the largest preferred batch size, or the oldest has waited
// max_queue_delay_us; it concatenates them along dim 0, runs one batch and splits the outputs back in request order
// (each request gets a view of the batch outputs: no copy). Requests whose non-batch dims differ are batched
// separately. A request still queued past its deadline is not run: it completes with DEADLINE_EXCEEDED. With
// single-threaded instances, when there is no batching delay, nothing is queued and an instance is idle, submit() runs
// the request on the caller's thread (the future is ready when it returns): no hand-off to a worker and back.
//
// Thread-safety: submit(), metrics() and the accessors may be called from any thread. shutdown() (also run by the
// destructor) stops accepting, lets the workers finish every queued request, and joins them.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/base/graph.h"
#include "core/base/status.h"
#include "core/base/tensor.h"
#include "core/runtime/environment.h"
#include "core/runtime/session.h"

namespace keel::serve {

// Which versions of a model serve (Triton's version_policy): the `latest` N (default 1), `all`, or `specific` ones.
struct VersionPolicy {
  enum class Kind { kLatest, kAll, kSpecific };
  Kind kind = Kind::kLatest;
  int64_t latest = 1;
  std::vector<int64_t> specific;
  // The versions to serve out of those present (any order); sorted ascending.
  std::vector<int64_t> select(std::vector<int64_t> present) const;
};

// DIR/<model>/config.toml; every key optional. Unknown keys are an error (a typo must not pass silently).
struct ModelConfig {
  int64_t max_batch_size = 0;                  // 0 = no batching; > 0: dim 0 of every input is the batch dim
  int64_t max_queue_delay_us = 0;              // how long the oldest request may wait for a fuller batch
  std::vector<int64_t> preferred_batch_sizes;  // a batch of the largest of these goes at once (ascending, <= max)
  int64_t max_queue_size = 1024;               // queued requests beyond this are refused (429)
  int64_t default_timeout_us = 0;              // a request's queue deadline; 0 = the server's request timeout
  bool dynamic_batch = false;                  // make a fixed first dim of 1 dynamic at load (for exports with batch 1)
  // Zeros run on every instance at these batch sizes at load, before the server is ready (a session's first run
  // builds its kernels: ResNet-18's took 0.6-0.8 s). Absent: one run at batch 1 (the model's own shape; dynamic dims
  // 1), and a model that cannot run at that shape only warns. [] = none.
  std::optional<std::vector<int64_t>> warmup_batch_sizes;
  int64_t instances = 1;                           // sessions (and worker threads) of this model
  int64_t threads = 0;                             // kernel threads per instance; 0 = the server's --threads
  std::optional<std::vector<std::string>> passes;  // session passes by name; absent or "auto" = the server's default
  std::string precision = "fp32";                  // fp32 | fp16 | bf16 (mixed precision, fp32 inputs and outputs)
  std::string device;                              // "" = every device by priority; else "cpu", "cuda:0", ...
  VersionPolicy version_policy;
};
// Parses config.toml text (`origin` names it in errors): INVALID_ARGUMENT naming the file and key for a malformed
// file, a wrong type or a value out of range.
StatusOr<ModelConfig> parse_model_config_text(const std::string& text, const std::string& origin);
StatusOr<ModelConfig> parse_model_config(const std::filesystem::path& file);

// A graph input or output as the metadata endpoint shows it (dims of -1 are dynamic).
struct TensorSpec {
  std::string name;
  DType dtype = DType::kUndefined;
  Shape shape;  // empty with `has_shape` false when the rank is unknown
  bool has_shape = true;
};

// Why a request failed: the `reason` label of keel_inference_request_failure.
enum class Failure { kBadRequest, kQueueFull, kUnavailable, kTimeout, kRunFailed, kCount };
const char* failure_name(Failure f);  // "bad_request", "queue_full", "unavailable", "timeout", "run_failed"

// Cumulative counters since load (Prometheus counters), and the pending gauge.
struct ModelMetrics {
  std::atomic<uint64_t> request_success{0};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Failure::kCount)> request_failure{};
  std::atomic<uint64_t> inference_count{0};  // rows (batch items) inferred
  std::atomic<uint64_t> execution_count{0};  // session runs
  // Per request (a batch's compute time counts once per request in it, as Triton counts):
  std::atomic<uint64_t> queue_us{0};           // enqueued -> its batch starts
  std::atomic<uint64_t> compute_input_us{0};   // the batch's inputs concatenated
  std::atomic<uint64_t> compute_infer_us{0};   // the session run
  std::atomic<uint64_t> compute_output_us{0};  // the outputs split back
  std::atomic<int64_t> pending{0};
  void fail(Failure f) { request_failure[static_cast<size_t>(f)]++; }
};

// What the batcher produced for one request, with its timings (for the access log).
struct Result {
  StatusOr<std::vector<Tensor>> outputs = internal_error("no result");
  int64_t batch_rows = 0;  // rows of the batch the request ran in
  int64_t queue_us = 0, compute_us = 0;
};

class ServedModel {
 public:
  // Loads `file` into `config.instances` sessions after running `passes` once on its graph. `default_threads` is
  // used when config.threads is 0. `fingerprint` identifies what was loaded (a reload with an equal fingerprint may
  // keep this model). The environment must outlive the model.
  static StatusOr<std::unique_ptr<ServedModel>> create(Environment& env, std::string name, int64_t version,
                                                       const std::filesystem::path& file, ModelConfig config,
                                                       const std::vector<std::string>& passes, int32_t default_threads,
                                                       std::string fingerprint = "");
  ~ServedModel();

  const std::string& name() const { return name_; }
  int64_t version() const { return version_; }
  const std::string& fingerprint() const { return fingerprint_; }
  const ModelConfig& config() const { return config_; }
  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }
  ModelMetrics& metrics() { return metrics_; }
  // Memory of the instances' builds (each distinct build once): `builds` is 1 when every instance shares one.
  struct Memory {
    uint64_t builds = 0, constant_bytes = 0, arena_bytes = 0;
  };
  Memory memory() const;
  // Warm-up runs made at load, over every instance.
  int64_t warmup_runs() const { return warmup_runs_; }

  // Queues one request; `inputs` are host tensors in inputs() order, already checked against the specs. It is not
  // run once `deadline` has passed. On failure `why` says which: kQueueFull (UNAVAILABLE: max_queue_size requests
  // wait), kUnavailable (UNAVAILABLE: the model shuts down), kBadRequest (INVALID_ARGUMENT: the batch dims differ or
  // exceed max_batch_size).
  StatusOr<std::future<Result>> submit(std::vector<Tensor> inputs, std::chrono::steady_clock::time_point deadline,
                                       Failure* why);
  void shutdown();

 private:
  struct Request {
    std::vector<Tensor> inputs;
    int64_t rows = 1;
    std::chrono::steady_clock::time_point enqueued, deadline;
    std::promise<Result> done;
  };
  using Batch = std::vector<std::shared_ptr<Request>>;
  ServedModel() = default;
  void worker(size_t instance);
  // Under mu_: takes the next batch for `instance` off the queue and marks the instance busy, sleeping until there is
  // one to run; empty when stopping with nothing left.
  Batch next_batch(std::unique_lock<std::mutex>& lk, size_t instance);
  void execute(Session& session, Batch& batch);
  // At load, after instance 0's warm-up, when max_batch_size >= 2: a batch of 2 rows (zeros, other dynamic dims 1)
  // must run and give 2 rows of every output. The batcher concatenates requests along dim 0 and splits every output
  // along it, so a graph that fixes its batch inside (a Reshape to a constant shape, which `dynamic_batch = true`
  // cannot undo) is refused here, naming the node, instead of failing only the requests that happen to be batched
  // with another, under load.
  // Then the rows must not mix: two batches of 2 random rows (random_feeds()) that share row 0 run, the first twice (a
  // model whose runs differ from each other, e.g. one that draws random numbers, is not checked further), and each of
  // its rows alone. Row 0 of a float output that changes with row 1, or a row that differs from the same row run
  // alone, refuses the model: its answers would depend on the other requests batched with it (a BatchNormalization
  // exported in training mode, a reduction or normalisation over dim 0). Bounds, in relative L2 error: 1e-3 in fp32;
  // at reduced precision 3e-2 for row 0 (the same kernels at the same batch round alike; both are
  // tests/fuzz/fuzz_serve.py's bounds) and 0.5 for a row alone (kernels at batch 1 round otherwise). Random values
  // that do not run (zeros did) leave the rows unchecked, with a note in the log.
  Status check_batch_dim(Session& session, const std::string& who) const;
  // The row check above: "" when the rows do not mix, what differs when they do, nullopt when they cannot be checked
  // (random rows do not run, two runs differ, or no output is a float tensor of finite values; the log says which).
  std::optional<std::string> mixed_rows(Session& session, const std::string& who) const;
  // The first output of a run of `rows` rows whose first dim is not `rows`, described ("output y of a batch of 3 rows
  // has shape [1, 4]: ..."), or "" when every output has the batch dim first.
  std::string unbatched_output(const std::vector<Tensor>& outs, int64_t rows) const;
  // Zeros of every input at `rows` rows (other dynamic dims 1): the warm-up's and the batch check's feeds.
  StatusOr<std::vector<std::pair<std::string, Tensor>>> zero_feeds(int64_t rows) const;
  // zero_feeds() with random values drawn from `seed` (so each row differs): in [-1, 1) in float inputs, 0 or 1 in
  // integer and bool ones (an id, index or mask that exists). The row check's.
  StatusOr<std::vector<std::pair<std::string, Tensor>>> random_feeds(int64_t rows, uint32_t seed) const;
  bool compatible(const Request& a, const Request& b) const;

  std::string name_;
  int64_t version_ = 0;
  std::string fingerprint_;
  ModelConfig config_;
  std::vector<TensorSpec> inputs_, outputs_;
  std::vector<std::unique_ptr<Session>> sessions_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  std::vector<bool> busy_;        // per instance: a batch runs on it (its worker's or a caller's inline run)
  bool single_threaded_ = false;  // instances run kernels on one thread: a caller may run a request inline
  bool stopping_ = false;
  std::atomic<int64_t> warmup_runs_{0};  // counted by the instances' threads while create() waits
  // A run's typical time (µs; -1 before the first): an average over the recent runs and the last warm-up run. Requests
  // of a model whose runs take longer than kInlineMaxRunUs always go to an instance's worker (see submit()). Updated
  // by the instances without a lock: two at once may lose one sample, which a hint can afford.
  static constexpr int64_t kInlineMaxRunUs = 1000;
  std::atomic<int64_t> typical_run_us_{-1};
  void note_run_time(int64_t us) {
    const int64_t old = typical_run_us_.load(std::memory_order_relaxed);
    typical_run_us_.store(old < 0 ? us : (7 * old + us) / 8, std::memory_order_relaxed);
  }
  ModelMetrics metrics_;
};

}  // namespace keel::serve
