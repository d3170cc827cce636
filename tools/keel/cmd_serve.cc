// `keel serve`: a model repository served over HTTP with the KServe v2 protocol (tools/serve/server.h).
//
// Prints "keel serve: listening on http://HOST:PORT" on stdout once bound (with --port 0, the chosen port), serves
// until SIGTERM or SIGINT, then stops accepting, finishes the requests in flight and exits 0.
#include <malloc.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "tools/keel/commands.h"

#include <pthread.h>

#include "tools/serve/server.h"

namespace keel::cli {

namespace {
struct ServeArgs {
  std::string repository;
  std::string host = "127.0.0.1";
  int port = 8000;
  int threads = -1;
  int http_threads = 16;
  uint64_t max_body_mib = 64;
  uint64_t max_inflight_mib = 2048;
  int io_timeout_s = 10;
  int64_t request_timeout_ms = 60'000;
  std::string auth_token_file;
  bool model_control = false;
  bool exit_on_error = true;
};

// The token of --auth-token-file: the file's text without surrounding whitespace; empty or unreadable is an error.
StatusOr<std::string> read_token(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("--auth-token-file " + path + ": cannot read it");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  const auto first = t.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return invalid_argument("--auth-token-file " + path + " is empty");
  t = t.substr(first, t.find_last_not_of(" \t\r\n") - first + 1);
  for (char c : t)
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e)
      return invalid_argument("--auth-token-file " + path + ": the token must be one word of printable ASCII");
  return t;
}

int run_serve(const ServeArgs& a, Globals& g) {
  // Block the stop signals in every thread (the runtime's and the server's inherit the mask); one thread waits for
  // them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up mid-response must not end the server
  // glibc gives each thread that allocates under contention an arena of its own (up to 8 per core) and keeps what is
  // freed in it: with one HTTP thread per connection, resident memory steps up as connections first reach new
  // threads. Two arenas bound that (MALLOC_ARENA_MAX, when set, decides instead).
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
  // Every request allocates and frees buffers of its body's size (the body, its tensors, the batch). With glibc's
  // defaults a block of more than 128 KiB comes fresh from mmap, or the heap's top is trimmed after it is freed, so
  // each request faults its pages in again: SimpleCNN at batch 32 (100 KB a request) spent 11% of the server's CPU
  // in memset and the faults under it. Freed memory is kept for reuse instead (blocks up to 32 MiB from the heap, a
  // heap trimmed only past 64 MiB of free space at its top); the environment's MALLOC_MMAP_THRESHOLD_ and
  // MALLOC_TRIM_THRESHOLD_ (or GLIBC_TUNABLES) decide instead when set.
  auto set_by_env = [](const char* variable, const char* tunable) {
    const char* tunables = std::getenv("GLIBC_TUNABLES");
    return std::getenv(variable) != nullptr || (tunables != nullptr && std::strstr(tunables, tunable) != nullptr);
  };
  if (!set_by_env("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold")) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (!set_by_env("MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold")) mallopt(M_TRIM_THRESHOLD, 64 << 20);
  auto env = make_environment(g);
  if (!env) return 1;
  serve::ServerOptions o;
  o.model_repository = a.repository;
  o.host = a.host;
  o.port = a.port;
  o.threads = a.threads >= 0 ? a.threads : g.threads;
  o.http_threads = a.http_threads;
  o.max_body_bytes = a.max_body_mib << 20;
  o.max_inflight_bytes = a.max_inflight_mib << 20;
  o.io_timeout_s = a.io_timeout_s;
  o.request_timeout_ms = a.request_timeout_ms;
  o.model_control = a.model_control;
  o.exit_on_error = a.exit_on_error;
  if (!a.auth_token_file.empty()) {
    auto token = read_token(a.auth_token_file);
    if (!token.is_ok()) {
      std::cerr << "keel serve: " << token.status().to_string() << "\n";
      return 1;
    }
    o.auth_token = std::move(token).value();
  }
  // A model's passes as `keel run` / `keel bench` resolve --passes and --precision (absent = auto).
  o.pass_resolver = [](const serve::ModelConfig& c, const Graph& graph,
                       Environment& env) -> StatusOr<std::vector<std::string>> {
    std::vector<std::string> passes = c.passes ? *c.passes : session_passes("auto", graph, env);
    KEEL_RETURN_IF_ERROR(append_precision_pass(c.precision, !c.passes.has_value(), env, passes), "");
    return passes;
  };
  auto server = serve::Server::create(*env, o);
  if (!server.is_ok()) {
    std::cerr << "keel serve: " << server.status().to_string() << "\n";
    return 1;
  }
  auto port = server.value()->bind();
  if (!port.is_ok()) {
    std::cerr << port.status().to_string() << "\n";
    return 1;
  }
  // An IPv6 address goes in brackets, as in a URL (http://[::1]:8000).
  const std::string url_host = a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host;
  std::cout << "keel serve: listening on http://" << url_host << ":" << port.value() << std::endl;
  std::atomic<bool> done{false};
  std::thread signals([&] {
    timespec tick{0, 100'000'000};
    while (!done) {
      const int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig == SIGTERM || sig == SIGINT) {
        std::cerr << "keel serve: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
                  << ": finishing the requests in flight\n";
        server.value()->stop();
        return;
      }
    }
  });
  auto st = server.value()->serve();
  done = true;
  signals.join();
  server.value().reset();
  if (!st.is_ok()) {
    std::cerr << "keel serve: " << st.to_string() << "\n";
    return 1;
  }
  return 0;
}
}  // namespace

void add_serve_command(CLI::App& app, Globals& g) {
  auto a = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand("serve", "Serve a model repository over HTTP (KServe v2 protocol)");
  cmd->add_option("--model-repository", a->repository, "DIR/<model>/<version>/model.onnx [+ DIR/<model>/config.toml]")
      ->required();
  cmd->add_option("--host", a->host, "Address to bind (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", a->port, "Port (0 = a free one, printed on stdout)")->check(CLI::Range(0, 65535));
  cmd->add_option("--threads", a->threads, "Kernel threads per model instance (default: the global --threads)")
      ->check(kNonNegative);
  cmd->add_option("--http-threads", a->http_threads, "Connections served at once")->check(CLI::Range(1, 1024));
  cmd->add_option("--max-body-mib", a->max_body_mib, "Largest request body in MiB (413 beyond)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--max-inflight-mib", a->max_inflight_mib,
                  "Input memory of all requests in flight, in MiB (429 beyond; checked before allocating)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--io-timeout", a->io_timeout_s, "Seconds a connection may take to send a request or read a response")
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--request-timeout-ms", a->request_timeout_ms,
                  "How long a request may wait in the queue (504 beyond) unless its model's default_timeout_us or "
                  "the request's `timeout` parameter says otherwise")
      ->check(CLI::Range(1, 3'600'000));
  cmd->add_option("--auth-token-file", a->auth_token_file,
                  "Require `Authorization: Bearer <token>` (the file's one word) on every route but the health probes")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--model-control", a->model_control,
                "Enable POST /v2/repository/index and /v2/repository/models/{m}/load|unload");
  cmd->add_option("--exit-on-error", a->exit_on_error,
                  "true (default): a model that fails to load at start stops the server; false: it is left out, the "
                  "others serve, and its error is the reason its requests' 404 and the repository index give")
      ->default_str("true");
  cmd->callback([a, &g] {
    const int rc = run_serve(*a, g);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace keel::cli
