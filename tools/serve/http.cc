// keel/tools/serve/http.cc — the HTTP/1.1 server under `keel serve` (see http.h).
#include "tools/serve/http.h"

#include <spdlog/spdlog.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>

namespace keel::serve::http {

namespace bh = boost::beast::http;
using clock = std::chrono::steady_clock;

namespace {

constexpr size_t kHeaderRead = 64u << 10;  // one read into a connection's buffer (headers, chunked bodies)
constexpr uint64_t kLingerBytes = 64u << 20;
constexpr int kLingerMs = 2000;

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX sequences decoded; anything else (a lone '%' included) kept as it is.
std::string decode_path(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const int hi = hex_value(s[i + 1]), lo = hex_value(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// Writes every byte of the iovecs, waiting up to `timeout_ms` whenever the socket's buffer is full.
bool send_all(int fd, iovec* iov, int count, int timeout_ms) {
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return false;
      continue;
    }
    size_t left = static_cast<size_t>(n);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

// After an answer that left the request's body unread: no more writes, and what the client still sends is read and
// dropped for a moment (bounded in bytes and time), so that it reaches the point of reading the answer.
void linger_close(int fd) {
  ::shutdown(fd, SHUT_WR);
  const auto deadline = clock::now() + std::chrono::milliseconds(kLingerMs);
  uint64_t total = 0;
  char buf[16384];
  while (total < kLingerBytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0 && !(n < 0 && (errno == EINTR || errno == EAGAIN))) break;
    if (n > 0) total += static_cast<uint64_t>(n);
  }
}

}  // namespace

const std::string* Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return &v;
  return nullptr;
}

struct Server::Connection {
  explicit Connection(int f) : fd(f) {}
  ~Connection() {
    if (fd >= 0) ::close(fd);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  enum class Read { kData, kClosed, kTimeout };
  // Reads what has arrived into [dst, dst + size) (`got` bytes), waiting up to `timeout_ms` when nothing has.
  Read read_into(char* dst, size_t size, int timeout_ms, size_t& got) {
    for (;;) {
      const ssize_t n = ::recv(fd, dst, size, 0);
      if (n > 0) {
        got = static_cast<size_t>(n);
        return Read::kData;
      }
      if (n == 0) return Read::kClosed;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Read::kClosed;
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, timeout_ms);
      if (r == 0) return Read::kTimeout;
      if (r < 0 && errno != EINTR) return Read::kClosed;
    }
  }
  // Appends what has arrived to `buf` (at most `want` bytes), waiting up to `timeout_ms` when nothing has.
  Read read_some(size_t want, int timeout_ms) {
    auto space = buf.prepare(want);
    size_t got = 0;
    const Read r = read_into(static_cast<char*>(space.data()), space.size(), timeout_ms, got);
    if (r == Read::kData) buf.commit(got);
    return r;
  }

  int fd;
  boost::beast::flat_buffer buf;  // bytes received and not yet parsed
  clock::time_point parked_at;
};

Server::Server(Options options) : options_(std::move(options)) {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  pending_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

Server::~Server() {
  stop();
  for (int fd : {listen_fd_, epoll_fd_, stop_fd_, pending_fd_})
    if (fd >= 0) ::close(fd);
}

void Server::route(std::string method, const std::string& pattern, Handler handler) {
  routes_.push_back(Route{std::move(method), std::regex(pattern), std::move(handler)});
}

StatusOr<int> Server::bind(const std::string& host, int port) {
  const std::string where = host + ":" + std::to_string(port);
  if (epoll_fd_ < 0 || stop_fd_ < 0 || pending_fd_ < 0)
    return unavailable(std::string("keel serve: cannot set up the HTTP server: ") + std::strerror(errno));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    return unavailable("keel serve: cannot bind " + where + ": " + ::gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* ai = found; ai != nullptr && listen_fd_ < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0) return unavailable("keel serve: cannot bind " + where + ": " + why);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  return static_cast<int>(ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port));
}

void Server::stop() {
  if (stopping_.exchange(true)) return;
  const uint64_t one = 1;
  if (stop_fd_ >= 0) {
    [[maybe_unused]] auto n = ::write(stop_fd_, &one, sizeof one);
  }
  std::lock_guard<std::mutex> lk(mu_);
  cv_.notify_all();
}

Status Server::serve() {
  if (listen_fd_ < 0) return failed_precondition("keel serve: serve() before bind()");
  if (stopping_) return Status::ok();
  for (int fd : {listen_fd_, stop_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  for (int i = 0; i < std::max(1, options_.threads); ++i) workers_.emplace_back([this] { worker(); });
  epoll_event events[64];
  while (!stopping_) {
    const int n = ::epoll_wait(epoll_fd_, events, 64, 250);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == stop_fd_) continue;  // the loop condition ends it
      if (fd == listen_fd_) {
        for (;;) {
          const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) {
            // Out of descriptors: let the others finish before trying again (the socket stays readable).
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
              std::this_thread::sleep_for(std::chrono::milliseconds(10));
            break;
          }
          const int one = 1;
          ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          enqueue(std::make_unique<Connection>(c));
        }
        continue;
      }
      // A parked connection has something to say (a request, or its close).
      std::unique_ptr<Connection> c;
      {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = parked_.find(fd);
        if (it == parked_.end()) continue;
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
        c = std::move(it->second);
        parked_.erase(it);
      }
      enqueue(std::move(c));
    }
    close_parked_idle(false);
  }
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  ::close(listen_fd_);
  listen_fd_ = -1;
  close_parked_idle(true);
  {
    std::lock_guard<std::mutex> lk(mu_);
    cv_.notify_all();
  }
  for (auto& w : workers_) w.join();
  workers_.clear();
  std::lock_guard<std::mutex> lk(mu_);
  queue_.clear();  // connections that arrived after the workers left: closed unanswered
  return Status::ok();
}

void Server::enqueue(std::unique_ptr<Connection> c) {
  std::lock_guard<std::mutex> lk(mu_);
  queue_.push_back(std::move(c));
  if (idle_workers_ == 0 && !pending_signalled_) {
    const uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(pending_fd_, &one, sizeof one);
    pending_signalled_ = true;
  }
  cv_.notify_one();
}

void Server::park(std::unique_ptr<Connection> c) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) return;   // closed
  c->buf.shrink_to_fit();  // nothing is buffered: a parked connection holds no read buffer (they are not bounded)
  c->parked_at = clock::now();
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = c->fd;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev) != 0) return;  // closed
  parked_.emplace(c->fd, std::move(c));
}

void Server::close_parked_idle(bool all) {
  const auto limit = clock::now() - std::chrono::seconds(options_.idle_timeout_s);
  std::lock_guard<std::mutex> lk(mu_);
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (all || it->second->parked_at < limit) {
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->first, nullptr);
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
}

void Server::worker() {
  for (;;) {
    std::unique_ptr<Connection> c;
    {
      std::unique_lock<std::mutex> lk(mu_);
      ++idle_workers_;
      cv_.wait(lk, [&] { return !queue_.empty() || stopping_; });
      --idle_workers_;
      if (queue_.empty()) return;  // stopping, nothing left
      c = std::move(queue_.front());
      queue_.pop_front();
      if (queue_.empty() && pending_signalled_) {
        uint64_t value = 0;
        [[maybe_unused]] auto n = ::read(pending_fd_, &value, sizeof value);
        pending_signalled_ = false;
      }
    }
    // Nothing a client sends may end the process: what escapes a connection (an allocation failure, a hook that
    // throws) closes that connection only.
    After after = After::kClose;
    try {
      after = serve_connection(*c);
    } catch (const std::exception& e) {
      spdlog::warn("keel serve: connection closed: {}", e.what());
    } catch (...) {
      spdlog::warn("keel serve: connection closed: unknown exception");
    }
    if (after == After::kPark) park(std::move(c));
  }
}

Server::After Server::serve_connection(Connection& c) {
  for (bool fresh = true;; fresh = false) {
    // Wait for the next request: a connection just taken off the queue usually has it already; after an answer the
    // client needs a moment, so wait first (one poll, not a recv that finds nothing and then a poll).
    if (c.buf.size() == 0) {
      if (fresh) {
        auto space = c.buf.prepare(kHeaderRead);
        const ssize_t n = ::recv(c.fd, space.data(), space.size(), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return After::kClose;
        if (n > 0) c.buf.commit(static_cast<size_t>(n));
      }
      while (c.buf.size() == 0) {
        pollfd fds[3] = {{c.fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}, {pending_fd_, POLLIN, 0}};
        const int r = ::poll(fds, 3, options_.idle_timeout_s * 1000);
        if (r == 0) return After::kClose;  // idle too long
        if (r < 0) {
          if (errno == EINTR) continue;
          return After::kClose;
        }
        if (fds[0].revents != 0) {
          const auto got = c.read_some(kHeaderRead, 0);
          if (got == Connection::Read::kClosed) return After::kClose;
          if (got == Connection::Read::kData) break;
          continue;  // nothing after all
        }
        if (fds[1].revents != 0) return After::kClose;  // stopping: an idle connection closes
        if (fds[2].revents != 0) return After::kPark;   // others wait for a worker
      }
    }
    if (!serve_request(c)) return After::kClose;
  }
}

void Server::fail(Response& res, int status, const std::string& message) {
  res.status = status;
  res.close = true;
  try {
    if (error_formatter_) return error_formatter_(res, message);
  } catch (...) {}
  res.set_content(message, "text/plain");
}

bool Server::serve_request(Connection& c) {
  bh::request_parser<bh::string_body> parser;
  parser.header_limit(options_.max_header_bytes);
  parser.body_limit(options_.max_body_bytes);
  Request req;
  Response res;
  const int io_ms = options_.io_timeout_s * 1000;
  // Tells the logger, writes the answer; true when the connection serves on.
  auto answer = [&](bool keep_alive) {
    keep_alive = keep_alive && !res.close && !stopping_;
    std::string head;
    head.reserve(160 + res.content_type.size());
    head += "HTTP/1.1 ";
    head += std::to_string(res.status);
    head += ' ';
    const auto reason = bh::obsolete_reason(static_cast<bh::status>(res.status));
    head.append(reason.data(), reason.size());
    head += "\r\n";
    if (!res.content_type.empty()) head += "Content-Type: " + res.content_type + "\r\n";
    for (const auto& [k, v] : res.headers) head += k + ": " + v + "\r\n";
    head += "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
    head += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    iovec iov[2] = {{head.data(), head.size()}, {res.body.data(), res.body.size()}};
    if (logger_) logger_(req, res);  // before the write: a client reacting to the answer sees it counted
    const bool sent = send_all(c.fd, iov, res.body.empty() ? 1 : 2, io_ms);
    return sent && keep_alive;
  };
  // An answer sent before the body was read: the client may still be sending it.
  auto answer_early = [&] {
    answer(false);
    linger_close(c.fd);
    return false;
  };

  // The request line and headers.
  boost::system::error_code ec;
  while (!parser.is_header_done()) {
    if (c.buf.size() > 0) {
      const size_t used = parser.put(c.buf.data(), ec);
      c.buf.consume(used);
      if (parser.is_header_done() || (ec && ec != bh::error::need_more)) break;
      if (!ec && used > 0) continue;
    }
    switch (c.read_some(kHeaderRead, io_ms)) {
      case Connection::Read::kData: break;
      case Connection::Read::kClosed: return false;  // the client left
      case Connection::Read::kTimeout:
        fail(res, 408, "the request's headers did not arrive within " + std::to_string(options_.io_timeout_s) + " s");
        return answer_early();
    }
  }
  if (ec == bh::error::header_limit) {
    fail(res, 431, "request headers too large (at most " + std::to_string(options_.max_header_bytes) + " bytes)");
    return answer_early();
  }
  if (ec && ec != bh::error::body_limit) {
    fail(res, 400, "malformed HTTP request: " + ec.message());
    return answer_early();
  }
  {
    const auto& head = parser.get();
    req.method = std::string(head.method_string());
    const std::string_view target(head.target().data(), head.target().size());
    req.path = decode_path(target.substr(0, target.find('?')));
    for (const auto& field : head) {
      req.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
      req.header_bytes += field.name_string().size() + field.value().size() + 4;
    }
  }
  if (pre_routing_ && pre_routing_(req, res)) {
    res.close = true;
    return answer_early();
  }
  if (ec == bh::error::body_limit) {
    // Beast reports the limit while finishing the header, before the header counts as done: its content_length()
    // asserts there (an abort in builds with assertions), so the length comes from the header field itself.
    const std::string* length = req.header("Content-Length");
    fail(res, 413,
         "request body too large (at most " + std::to_string(options_.max_body_bytes) + " bytes" +
             (length ? "; Content-Length " + *length : std::string()) + ")");
    return answer_early();
  }

  // The body.
  if (!parser.is_done()) {
    if (const std::string* expect = req.header("Expect"); expect && iequals(*expect, "100-continue")) {
      static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      iovec iov{const_cast<char*>(kContinue), sizeof kContinue - 1};
      if (!send_all(c.fd, &iov, 1, io_ms)) return false;
    }
    auto body_timeout = [&] {
      fail(res, 408, "the request's body did not arrive within " + std::to_string(options_.io_timeout_s) + " s");
      return answer_early();
    };
    const auto length = parser.content_length();
    if (length && !parser.chunked()) {
      // Straight into the body's own storage: what the header read brought along, then the rest from the socket.
      const auto total = static_cast<size_t>(*length);
      // 64-byte aligned storage, the body placed in it so that the aligned offset (Options) falls on a boundary.
      size_t lead = 0;
      if (!options_.aligned_body_offset_header.empty())
        if (const std::string* v = req.header(options_.aligned_body_offset_header)) {
          uint64_t at = 0;
          const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), at);
          if (ec == std::errc() && end == v->data() + v->size() && at <= total) lead = (64 - at % 64) % 64;
        }
      void* raw = std::aligned_alloc(64, (lead + total + 63) / 64 * 64);
      if (!raw) {
        fail(res, 503, "cannot allocate " + std::to_string(total) + " bytes for the request body");
        return answer_early();
      }
      req.body_storage = std::shared_ptr<char[]>(static_cast<char*>(raw), [](char* p) { std::free(p); });
      char* const body = req.body_storage.get() + lead;
      size_t have = std::min(total, c.buf.size());
      std::memcpy(body, c.buf.data().data(), have);
      c.buf.consume(have);
      while (have < total) {
        size_t got = 0;
        switch (c.read_into(body + have, total - have, io_ms, got)) {
          case Connection::Read::kData: have += got; break;
          case Connection::Read::kClosed: return false;
          case Connection::Read::kTimeout: return body_timeout();
        }
      }
      req.body = std::string_view(body, total);
    } else {
      parser.eager(true);
      while (!parser.is_done()) {
        if (c.buf.size() > 0) {
          const size_t used = parser.put(c.buf.data(), ec);
          c.buf.consume(used);
          if (ec == bh::error::body_limit) {
            fail(res, 413, "request body too large (at most " + std::to_string(options_.max_body_bytes) + " bytes)");
            return answer_early();
          }
          if (ec && ec != bh::error::need_more) {
            fail(res, 400, "malformed HTTP request body: " + ec.message());
            return answer_early();
          }
          if (parser.is_done()) break;
          if (!ec && used > 0 && c.buf.size() > 0) continue;
        }
        switch (c.read_some(kHeaderRead, io_ms)) {  // a chunked body: its length is not known ahead
          case Connection::Read::kData: break;
          case Connection::Read::kClosed: return false;
          case Connection::Read::kTimeout: return body_timeout();
        }
      }
      req.body_text = std::move(parser.get().body());
      req.body = req.body_text;
    }
  }
  const bool keep_alive = parser.get().keep_alive();
  dispatch(req, res);
  return answer(keep_alive);
}

void Server::dispatch(Request& req, Response& res) {
  for (const Route& r : routes_) {
    if (r.method != req.method) continue;
    std::smatch m;
    if (!std::regex_match(req.path, m, r.pattern)) continue;
    req.captures.clear();
    for (const auto& group : m) req.captures.push_back(group.matched ? group.str() : std::string());
    try {
      r.handler(req, res);
    } catch (const std::exception& e) {
      res = Response{};
      fail(res, 500, std::string("internal error: ") + e.what());
      res.close = false;
    } catch (...) {
      res = Response{};
      fail(res, 500, "internal error");
      res.close = false;
    }
    return;
  }
  fail(res, 404, "no such endpoint: " + req.method + " " + req.path);
  res.close = false;
}

}  // namespace keel::serve::http
