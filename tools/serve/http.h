// keel/tools/serve/http.h — the HTTP/1.1 server under `keel serve`: Boost.Beast parses, Keel owns the sockets.
//
// Why not a ready-made server: the one used before (Debian's compiled cpp-httplib) read a body 4 KiB at a time with a
// poll() before every recv(); on the virtual machines Keel is measured on a system call costs microseconds, and a
// 100 KB request spent more of the server's time in those calls than in the model. Here a connection's bytes go
// through one buffer per connection (a body with a Content-Length is read straight into its own, uninitialised
// storage: no zero fill, no second copy), a wait only when a read finds nothing, and one sendmsg per response;
// Beast's parser (header and body limits, chunked bodies,
// keep-alive rules) does the HTTP.
//
// Connections and threads: `threads` workers each serve one connection at a time, request after request, while its
// client keeps it busy. A worker whose connection goes quiet while other connections wait for a worker parks it (an
// epoll set watched by the accepting thread, which queues it again when its next request arrives), so more clients
// than workers are served in turn rather than starved; a parked connection idle past `idle_timeout_s` is closed.
//
// Per request: the request line and headers are read (431 past max_header_bytes, 400 when malformed, 408 when the
// client stalls for io_timeout_s in the middle), the pre-routing hook sees them before the body is read (an answer
// there closes the connection without reading the body), `Expect: 100-continue` is answered, the body is read (413
// past max_body_bytes, as soon as a Content-Length says so), then the route whose regex matches the whole
// percent-decoded path (query string dropped) and method runs; no route: 404. A handler's exception is a 500. Every
// error the layer makes itself gets its body from the error formatter. After an answer that leaves a body unread the
// connection's write side is shut and what the client still sends is drained for a moment (bounded) before closing,
// so the client can read the answer.
//
// Stopping: stop() (any thread, once or more) closes the listening socket, closes idle and parked connections,
// answers the requests that have arrived (with `Connection: close`) and makes serve() return when they are done.
//
// Thread-safety: route(), set_*() and bind() before serve(), from one thread; serve() blocks its caller; stop() from
// any thread. Handlers run on the workers, several at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/base/status.h"

namespace keel::serve::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;         // "GET", "POST", ...
  std::string path;           // percent-decoded, without the query string
  Headers headers;            // as received
  uint64_t header_bytes = 0;  // every name and value, plus 4 each (": " and CRLF)
  std::string_view body;      // empty in the pre-routing hook; the bytes live as long as the Request (or body_storage)
  // What `body` views when the body came with a Content-Length (read straight into it): shared, so that a handler may
  // keep the bytes past the request (a tensor over them) by holding a copy of this pointer.
  std::shared_ptr<char[]> body_storage;
  std::string body_text;              // or this (a chunked body, as the parser joined it)
  std::vector<std::string> captures;  // the route's groups: [0] the path, then each group ("" when it did not match)
  // The value of the first header of that name (case-insensitive), or nullptr.
  const std::string* header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type;
  Headers headers;
  std::string body;
  bool close = false;  // close the connection after this answer
  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
  void set_header(std::string name, std::string value) { headers.emplace_back(std::move(name), std::move(value)); }
};

using Handler = std::function<void(const Request&, Response&)>;
// Sees a request's headers before its body is read: true = answered (the body is not read; the connection closes).
using PreRouting = std::function<bool(const Request&, Response&)>;
// Fills an error answer the layer makes itself (status already set) from a message.
using ErrorFormatter = std::function<void(Response&, const std::string& message)>;
// Called for every answer just before it is written (whether the write then succeeds or not), with the request as far
// as it was read: whatever the client does after reading the answer (e.g. read /metrics on another connection) sees
// what the logger recorded.
using Logger = std::function<void(const Request&, const Response&)>;

struct Options {
  int threads = 16;                       // workers: connections served at once
  uint64_t max_body_bytes = 64ull << 20;  // 413 beyond
  uint32_t max_header_bytes = 64u << 10;  // request line and headers together: 431 beyond
  int io_timeout_s = 10;                  // the longest wait for more of a started request, or to write an answer
  int idle_timeout_s = 5;                 // a keep-alive connection with no request for this long is closed
  // When set, a Content-Length body is stored so that the byte at the offset this request header gives (a decimal
  // byte count within the body) is 64-byte aligned: KServe's binary tensor data after its JSON header
  // ("Inference-Header-Content-Length"), which tensors can then use in place. Otherwise, or when the header is
  // missing or not such a count, the body itself starts 64-byte aligned.
  std::string aligned_body_offset_header;
};

class Server {
 public:
  explicit Server(Options options);
  ~Server();  // stops, and closes the listening socket
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // `pattern` (ECMAScript regex) must match the whole decoded path; routes are tried in the order added.
  void route(std::string method, const std::string& pattern, Handler handler);
  void set_pre_routing(PreRouting hook) { pre_routing_ = std::move(hook); }
  void set_error_formatter(ErrorFormatter f) { error_formatter_ = std::move(f); }
  void set_logger(Logger logger) { logger_ = std::move(logger); }

  // Binds and listens on host:port (port 0: a free one); returns the port. UNAVAILABLE naming the address when it
  // cannot be bound (in use, not local, not resolvable).
  StatusOr<int> bind(const std::string& host, int port);
  // Accepts and serves until stop(); returns once every worker is done. Needs bind() first.
  Status serve();
  void stop();

 private:
  struct Connection;
  struct Route {
    std::string method;
    std::regex pattern;
    Handler handler;
  };
  enum class After { kClose, kPark };

  void worker();
  // Serves requests on `c` until it closes, goes quiet while others wait (kPark), or the server stops.
  After serve_connection(Connection& c);
  // One request; false when the connection must close afterwards.
  bool serve_request(Connection& c);
  void dispatch(Request& req, Response& res);
  void fail(Response& res, int status, const std::string& message);
  // Queues a connection for a worker (signalling busy workers to park theirs when none is free).
  void enqueue(std::unique_ptr<Connection> c);
  void park(std::unique_ptr<Connection> c);
  void close_parked_idle(bool all);

  Options options_;
  std::vector<Route> routes_;
  PreRouting pre_routing_;
  ErrorFormatter error_formatter_;
  Logger logger_;

  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int stop_fd_ = -1;     // eventfd: readable once stop() ran
  int pending_fd_ = -1;  // eventfd: readable while connections wait and no worker is free
  std::atomic<bool> stopping_{false};

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Connection>> queue_;
  std::map<int, std::unique_ptr<Connection>> parked_;  // by fd, with the time each was parked
  int idle_workers_ = 0;
  bool pending_signalled_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace keel::serve::http
