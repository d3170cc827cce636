// `keel serve`: a model repository served over HTTP with the KServe v2 protocol (tools/serve/server.h).
//
// Prints "keel serve: listening on http://HOST:PORT" on stdout once bound (with --port 0, the chosen port), serves
// until SIGTERM or SIGINT, then stops accepting, finishes the requests in flight and exits 0.
#include <csignal>
#include <iostream>
#include <thread>

#include "tools/keel/commands.h"

#if KEEL_HAVE_SERVE
#include <pthread.h>

#include "tools/serve/server.h"
#endif

namespace keel::cli {

namespace {
struct ServeArgs {
  std::string repository;
  std::string host = "127.0.0.1";
  int port = 8000;
  int threads = -1;
  int http_threads = 16;
  uint64_t max_body_mib = 64;
};

int run_serve(const ServeArgs& a, Globals& g) {
#if KEEL_HAVE_SERVE
  // Block the stop signals in every thread (the runtime's and the server's inherit the mask); one thread waits for them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up mid-response must not end the server
  auto env = make_environment(g);
  if (!env) return 1;
  serve::ServerOptions o;
  o.model_repository = a.repository;
  o.host = a.host;
  o.port = a.port;
  o.threads = a.threads >= 0 ? a.threads : g.threads;
  o.http_threads = a.http_threads;
  o.max_body_bytes = a.max_body_mib << 20;
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
  std::cout << "keel serve: listening on http://" << a.host << ":" << port.value() << std::endl;
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
#else
  (void)a;
  (void)g;
  std::cerr << "keel serve: this keel was built without cpp-httplib (install libcpp-httplib-dev and rebuild)\n";
  return 1;
#endif
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
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--http-threads", a->http_threads, "Connections served at once")->check(CLI::Range(1, 1024));
  cmd->add_option("--max-body-mib", a->max_body_mib, "Largest request body in MiB (413 beyond)")
      ->check(CLI::Range(1, 4096));
  cmd->callback([a, &g] {
    const int rc = run_serve(*a, g);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace keel::cli
