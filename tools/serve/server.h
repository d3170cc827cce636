// keel/tools/serve/server.h — `keel serve`: a model repository served over HTTP with the KServe v2 protocol.
//
// Repository layout (Triton's): DIR/<model>/<version>/model.onnx with numeric versions (the highest is served) and
// an optional DIR/<model>/config.toml (model.h, ModelConfig). Model names are [A-Za-z0-9_.-]+ and never "." or "..".
//
// Endpoints (KServe v2 REST): GET /v2/health/live, /v2/health/ready, /v2 (server metadata), /v2/models/{m}
// [/versions/{v}] (metadata, -1 for dynamic dims), .../ready, POST .../infer (JSON tensors, flat or nested `data`,
// `outputs` selection, `id` echoed; the binary tensor-data extension with Inference-Header-Content-Length and the
// `binary_data` / `binary_data_size` parameters), GET /metrics (Prometheus text). Errors are {"error": "..."} with
// 400 (bad request), 404 (unknown model or version), 413 (body too large), 500 (a run failed), 503 (queue full,
// with Retry-After), 504 (request timeout).
//
// Thread-safety: create() and bind() from one thread; serve() blocks on that thread until stop(), which may be called
// from any thread (a signal-handling thread): it stops accepting, lets in-flight requests finish (serve() returns
// after them), then drains and stops the models.
#pragma once

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "core/base/status.h"
#include "core/runtime/environment.h"
#include "tools/serve/model.h"

namespace httplib {
class Server;
}

namespace keel::serve {

struct ServerOptions {
  std::filesystem::path model_repository;
  std::string host = "127.0.0.1";
  int port = 8000;                         // 0 = a free port (read it back from bind())
  int32_t threads = 0;                     // kernel threads per instance unless a config says otherwise
  int http_threads = 16;                   // connections served at once
  uint64_t max_body_bytes = 64ull << 20;   // 413 beyond
  int max_json_depth = 64;                 // 400 beyond
  uint64_t max_tensor_bytes = 1ull << 30;  // one input tensor's bytes, checked before allocating
  int64_t request_timeout_ms = 60'000;     // 504 when a queued request has no result by then
  int io_timeout_s = 10;                   // read/write timeout of a connection (a slow client cannot hold one)
};

// Loads every model of the repository: name -> served model (highest version). A model that fails to load is an
// error naming it (the server does not start half-configured).
StatusOr<std::map<std::string, std::unique_ptr<ServedModel>>> load_repository(Environment& env,
                                                                              const ServerOptions& options);

class Server {
 public:
  // Loads the repository. The environment must outlive the server.
  static StatusOr<std::unique_ptr<Server>> create(Environment& env, ServerOptions options);
  ~Server();
  // Binds host:port; returns the port (the chosen one for port 0). UNAVAILABLE when the address cannot be bound.
  StatusOr<int> bind();
  // Serves until stop(); then finishes in-flight requests and shuts the models down.
  Status serve();
  // Stops accepting; serve() returns once the requests in flight are answered. Call it once (from any thread).
  void stop();

 private:
  Server() = default;
  void install_routes();
  ServerOptions options_;
  std::map<std::string, std::unique_ptr<ServedModel>> models_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> stop_requested_{false};
};

}  // namespace keel::serve
