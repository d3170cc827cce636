// keel/tools/serve/server.h — `keel serve`: a model repository served over HTTP with the KServe v2 protocol.
//
// Repository layout (Triton's): DIR/<model>/<version>/model.onnx with numeric versions and an optional
// DIR/<model>/config.toml (model.h, ModelConfig). The config's version_policy says which versions load (default: the
// highest); a request without a version goes to the highest loaded one. Model names are [A-Za-z0-9_.-]+, never with
// "..".
//
// Endpoints (KServe v2 REST): GET /v2/health/live, /v2/health/ready, /v2 (server metadata), /v2/models/{m}
// [/versions/{v}] (metadata, -1 for dynamic dims), .../ready, POST .../infer (JSON tensors, flat or nested `data`,
// `outputs` selection, `id` echoed, `parameters.timeout` in µs; the binary tensor-data extension with
// Inference-Header-Content-Length and the `binary_data` / `binary_data_size` / `binary_data_output` parameters),
// GET /metrics (Prometheus text). With model control on: POST /v2/repository/index (every model of the repository
// and the state of each version) and POST /v2/repository/models/{m}/load|unload. Loading reads the model's folder
// again: versions whose file and config are unchanged keep serving as they are, new ones are built before they are
// swapped in, and versions that go away (or an unload) finish every request they accepted before they are freed.
// Errors are {"error": "..."} with 400 (bad request), 401 (missing or wrong bearer token), 403 (model control off),
// 404 (unknown model or version), 413 (body too large), 431 (headers too large), 429 (queue full or the in-flight
// memory cap reached, with Retry-After), 500 (a run failed; the server stays up), 503 (the model is unloading, with
// Retry-After), 504 (the request's timeout passed in the queue).
//
// With an auth token, every route but /v2/health/live and /v2/health/ready needs `Authorization: Bearer TOKEN`
// (compared in constant time); anything else is answered 401 before the body is read.
//
// Thread-safety: create() and bind() from one thread; serve() blocks on that thread until stop(), which may be called
// from any thread (a signal-handling thread): it stops accepting, lets in-flight requests finish (serve() returns
// after them), then drains and stops the models.
#pragma once

#include <array>
#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "core/base/graph.h"
#include "core/base/status.h"
#include "core/runtime/environment.h"
#include "tools/serve/http.h"
#include "tools/serve/model.h"

namespace keel::serve {

// The session passes of a model: from its config (absent = "auto"), its precision and its graph. `keel serve` gives
// the CLI's resolution (auto = the default pipeline, as `keel run` and `keel bench`); without one, auto = none and
// a precision other than fp32 appends the convert_<precision> pass.
using PassResolver =
    std::function<StatusOr<std::vector<std::string>>(const ModelConfig& config, const Graph& graph, Environment& env)>;

struct ServerOptions {
  std::filesystem::path model_repository;
  std::string host = "127.0.0.1";
  int port = 8000;                           // 0 = a free port (read it back from bind())
  int32_t threads = 0;                       // kernel threads per instance unless a config says otherwise
  int http_threads = 16;                     // connections served at once
  uint64_t max_body_bytes = 64ull << 20;     // 413 beyond
  int max_json_depth = 64;                   // 400 beyond
  uint32_t max_header_bytes = 64u << 10;     // the request line and headers together: 431 beyond
  uint64_t max_tensor_bytes = 1ull << 30;    // one input tensor's bytes, checked before allocating
  uint64_t max_inflight_bytes = 2ull << 30;  // input bytes of all requests in flight; 429 beyond (checked first)
  int64_t request_timeout_ms = 60'000;       // a request's queue deadline unless its config or request says otherwise
  int io_timeout_s = 10;                     // read/write timeout of a connection (a slow client cannot hold one)
  int idle_timeout_s = 5;                    // an idle keep-alive connection is closed after this
  std::string auth_token;                    // "" = no token; else `Authorization: Bearer <token>` is required
  bool model_control = false;                // the /v2/repository endpoints
  // As Triton's --exit-on-error: true, a model that fails to load at start stops the server from starting; false, it
  // is left out (the others serve; its error is the reason the repository index and its 404s give).
  bool exit_on_error = true;
  PassResolver pass_resolver;  // empty: see PassResolver
};

class Server {
 public:
  // Loads every model of the repository (a model that fails to load is an error naming it: the server does not start
  // half-configured, unless options.exit_on_error is false). The environment must outlive the server.
  static StatusOr<std::unique_ptr<Server>> create(Environment& env, ServerOptions options);
  ~Server();
  // Binds host:port; returns the port (the chosen one for port 0). UNAVAILABLE when the address cannot be bound.
  StatusOr<int> bind();
  // Serves until stop(); then finishes in-flight requests and shuts the models down.
  Status serve();
  // Stops accepting; serve() returns once the requests in flight are answered. Call it once (from any thread).
  void stop();

  // (Re)loads one model from the repository per its config and version policy; on failure the versions that were
  // serving keep serving, and the error is kept as the model's reason until it loads or is unloaded. NOT_FOUND when
  // the folder has no <version>/model.onnx. Thread-safe (one load at a time).
  Status load_model(const std::string& name);
  // Stops routing requests to the model; its versions finish what they accepted. NOT_FOUND when not loaded.
  Status unload_model(const std::string& name);

 private:
  using Versions = std::map<int64_t, std::shared_ptr<ServedModel>>;
  Server() = default;
  void install_routes();
  void handle_infer(const http::Request& req, http::Response& res);
  std::string metrics_text();
  Status load_versions(const std::string& name);  // load_model's work, under control_mu_
  // The loaded version a request names (the highest when `version` is empty), or an HTTP error.
  std::shared_ptr<ServedModel> find(const std::string& name, const std::string* version, int& code,
                                    std::string& message) const;

  Environment* env_ = nullptr;
  ServerOptions options_;
  mutable std::shared_mutex models_mu_;  // guards models_ (requests read, load/unload swap)
  std::map<std::string, Versions> models_;
  std::map<std::string, std::string> load_errors_;  // the last failed load of each model (guarded by models_mu_)
  std::mutex control_mu_;                           // one load or unload at a time
  std::unique_ptr<http::Server> http_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<uint64_t> inflight_bytes_{0};
  std::array<std::atomic<uint64_t>, 600> responses_{};  // by HTTP status code
};

}  // namespace keel::serve
