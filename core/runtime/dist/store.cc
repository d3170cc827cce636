// keel/core/runtime/dist/store.cc — the in-process, prefix and TCP stores (see store.h for the protocol).
#include "core/runtime/dist/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

namespace keel::dist {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMaxFrame = 64u << 20;

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kCheck = 5, kNumKeys = 6, kErase = 7 };
enum ReplyStatus : uint8_t { kReplyOk = 0, kReplyTimeout = 1, kReplyError = 2 };

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_i64(std::string& s, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
void put_str(std::string& s, std::string_view v) {
  put_u32(s, static_cast<uint32_t>(v.size()));
  s.append(v);
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
// Wraps a body into a frame.
std::string frame(const std::string& body) {
  std::string f;
  f.reserve(body.size() + 4);
  put_u32(f, static_cast<uint32_t>(body.size()));
  f += body;
  return f;
}

// Reads the fields of one frame; any read past the end sets ok = false.
struct Reader {
  const char* p;
  size_t n;
  bool ok = true;
  uint8_t u8() {
    if (n < 1) return fail<uint8_t>();
    uint8_t v = static_cast<uint8_t>(*p);
    ++p, --n;
    return v;
  }
  uint32_t u32() {
    if (n < 4) return fail<uint32_t>();
    uint32_t v = get_u32(p);
    p += 4, n -= 4;
    return v;
  }
  int64_t i64() {
    if (n < 8) return fail<int64_t>();
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
    p += 8, n -= 8;
    return static_cast<int64_t>(v);
  }
  std::string str() {
    uint32_t len = u32();
    if (!ok || n < len) return fail<std::string>();
    std::string s(p, len);
    p += len, n -= len;
    return s;
  }
  template <typename T>
  T fail() {
    ok = false;
    n = 0;
    return T{};
  }
};

std::string errno_text(int e) { return std::strerror(e); }

Status deadline_exceeded(std::string message) { return Status(StatusCode::kDeadlineExceeded, std::move(message)); }

StatusOr<int64_t> parse_counter(const std::string& key, const std::string& value) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size())
    return invalid_argument("key '" + key + "' holds '" + value.substr(0, 40) + "', not an integer counter");
  return v;
}

std::string missing_key_message(const std::string& key, int64_t timeout_ms, const std::string& where) {
  return "key '" + key + "' was not set within " + std::to_string(timeout_ms) + " ms (" + where + ")";
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return format_address(host, std::atoi(port));
}

}  // namespace

std::string format_address(const std::string& host, int32_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

// ------------------------------------------------------------------------------------------------------------
// Store: the C view.

Store::Store() {
  c_.struct_size = sizeof c_;
  c_.core_data = this;
  c_.set = [](keel_kv_store_t* self, const char* key, const void* value, size_t size) -> keel_status_t {
    try {
      if (!self || !key || (!value && size))
        return make_c_status(KEEL_STATUS_INVALID_ARGUMENT, "kv store set: null argument");
      auto* s = static_cast<Store*>(self->core_data);
      return s->set(key, std::string_view(static_cast<const char*>(value), size)).to_c();
    } catch (const std::exception& e) {
      return make_c_status(KEEL_STATUS_INTERNAL, (std::string("kv store set: ") + e.what()).c_str());
    }
  };
  c_.get = [](keel_kv_store_t* self, const char* key, int64_t timeout_ms, const void** out_value,
              size_t* out_size) -> keel_status_t {
    try {
      if (!self || !key || !out_value || !out_size)
        return make_c_status(KEEL_STATUS_INVALID_ARGUMENT, "kv store get: null argument");
      auto* s = static_cast<Store*>(self->core_data);
      auto v = s->get(key, timeout_ms);
      if (!v.is_ok()) return v.status().to_c();
      std::lock_guard<std::mutex> lock(s->values_mu_);
      s->values_.push_back(std::move(v).value());
      *out_value = s->values_.back().data();
      *out_size = s->values_.back().size();
      return nullptr;
    } catch (const std::exception& e) {
      return make_c_status(KEEL_STATUS_INTERNAL, (std::string("kv store get: ") + e.what()).c_str());
    }
  };
}

Store::~Store() = default;

// ------------------------------------------------------------------------------------------------------------
// InProcessStore

struct InProcessStore::State {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;
};

InProcessStore::InProcessStore() : s_(std::make_unique<State>()) {}
InProcessStore::~InProcessStore() = default;

Status InProcessStore::set(const std::string& key, std::string_view value) {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->kv[key] = std::string(value);
  }
  s_->cv.notify_all();
  return Status::ok();
}

StatusOr<std::string> InProcessStore::get(const std::string& key, int64_t timeout_ms) {
  KEEL_RETURN_IF_ERROR(wait({key}, timeout_ms), "get");
  std::lock_guard<std::mutex> lock(s_->mu);
  auto it = s_->kv.find(key);
  if (it == s_->kv.end()) return not_found("key '" + key + "' was erased while being read");
  return it->second;
}

StatusOr<int64_t> InProcessStore::add(const std::string& key, int64_t delta) {
  int64_t now = 0;
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    auto it = s_->kv.find(key);
    if (it != s_->kv.end()) {
      KEEL_ASSIGN_OR_RETURN(now, parse_counter(key, it->second), "add");
    }
    now += delta;
    s_->kv[key] = std::to_string(now);
  }
  s_->cv.notify_all();
  return now;
}

Status InProcessStore::wait(const std::vector<std::string>& keys, int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(s_->mu);
  const std::string* missing = nullptr;
  auto all_set = [&] {
    for (const auto& k : keys)
      if (!s_->kv.count(k)) {
        missing = &k;
        return false;
      }
    return true;
  };
  if (all_set()) return Status::ok();
  if (timeout_ms > 0 && s_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), all_set)) return Status::ok();
  return deadline_exceeded(missing_key_message(*missing, timeout_ms, describe()));
}

StatusOr<bool> InProcessStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(s_->mu);
  for (const auto& k : keys)
    if (!s_->kv.count(k)) return false;
  return true;
}

StatusOr<int64_t> InProcessStore::num_keys() {
  std::lock_guard<std::mutex> lock(s_->mu);
  return static_cast<int64_t>(s_->kv.size());
}

StatusOr<bool> InProcessStore::erase(const std::string& key) {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->kv.erase(key) > 0;
}

// ------------------------------------------------------------------------------------------------------------
// PrefixStore

PrefixStore::PrefixStore(std::shared_ptr<Store> base, std::string prefix)
    : base_(std::move(base)), prefix_(std::move(prefix)) {}

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(full(k));
  return out;
}
Status PrefixStore::set(const std::string& key, std::string_view value) { return base_->set(full(key), value); }
StatusOr<std::string> PrefixStore::get(const std::string& key, int64_t timeout_ms) {
  return base_->get(full(key), timeout_ms);
}
StatusOr<int64_t> PrefixStore::add(const std::string& key, int64_t delta) { return base_->add(full(key), delta); }
Status PrefixStore::wait(const std::vector<std::string>& keys, int64_t timeout_ms) {
  return base_->wait(full(keys), timeout_ms);
}
StatusOr<bool> PrefixStore::check(const std::vector<std::string>& keys) { return base_->check(full(keys)); }
StatusOr<int64_t> PrefixStore::num_keys() { return base_->num_keys(); }
StatusOr<bool> PrefixStore::erase(const std::string& key) { return base_->erase(full(key)); }
std::string PrefixStore::describe() const { return "prefix '" + prefix_ + "' of " + base_->describe(); }

// ------------------------------------------------------------------------------------------------------------
// TcpStoreServer

struct TcpStoreServer::Impl {
  struct Pending {
    uint8_t op = 0;  // kGet or kWait
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };
  struct Client {
    std::string peer;
    std::string in, out;
    std::optional<Pending> pending;  // a get/wait in progress: later frames wait behind it
    bool closed = false;
  };

  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::thread thread;
  std::map<std::string, std::string> kv;
  std::map<int, Client> clients;
  std::string address;

  ~Impl() {
    for (auto& [fd, c] : clients) close(fd);
    if (listen_fd >= 0) close(listen_fd);
    for (int fd : wake)
      if (fd >= 0) close(fd);
  }

  void drop(int fd, Client& c, const std::string& why) {
    if (!why.empty()) spdlog::warn("keel store {}: closing client {}: {}", address, c.peer, why);
    c.closed = true;
  }

  static void reply_ok(Client& c, const std::string& payload = {}) {
    std::string body(1, static_cast<char>(kReplyOk));
    body += payload;
    c.out += frame(body);
  }
  static void reply_error(Client& c, StatusCode code, const std::string& message) {
    std::string body(1, static_cast<char>(kReplyError));
    put_i64(body, static_cast<int64_t>(code));
    put_str(body, message);
    c.out += frame(body);
  }
  const std::string* first_missing(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (!kv.count(k)) return &k;
    return nullptr;
  }
  // Answers a get/wait whose keys are all set.
  void complete(Client& c, uint8_t op, const std::vector<std::string>& keys) {
    if (op == kGet) {
      std::string payload;
      put_str(payload, kv.at(keys[0]));
      reply_ok(c, payload);
    } else {
      reply_ok(c);
    }
  }
  static void reply_timeout(Client& c, const std::string& key) {
    std::string body(1, static_cast<char>(kReplyTimeout));
    put_str(body, key);
    c.out += frame(body);
  }
  // After a key changed: answers every waiter whose keys are now all set.
  void wake_waiters() {
    for (auto& [fd, c] : clients) {
      if (!c.pending || c.closed || first_missing(c.pending->keys)) continue;
      complete(c, c.pending->op, c.pending->keys);
      c.pending.reset();
    }
  }

  // Handles one request frame; false when it is malformed (the caller drops the client).
  bool handle(Client& c, const char* p, size_t n, std::string& why) {
    Reader r{p, n};
    const uint8_t op = r.u8();
    switch (op) {
      case kSet: {
        std::string key = r.str(), value = r.str();
        if (!r.ok || r.n) break;
        kv[key] = std::move(value);
        reply_ok(c);
        wake_waiters();
        return true;
      }
      case kAdd: {
        std::string key = r.str();
        int64_t delta = r.i64();
        if (!r.ok || r.n) break;
        int64_t now = 0;
        if (auto it = kv.find(key); it != kv.end()) {
          auto v = parse_counter(key, it->second);
          if (!v.is_ok()) {
            reply_error(c, v.status().code(), v.status().message());
            return true;
          }
          now = *v;
        }
        now += delta;
        kv[key] = std::to_string(now);
        std::string payload;
        put_i64(payload, now);
        reply_ok(c, payload);
        wake_waiters();
        return true;
      }
      case kGet:
      case kWait: {
        std::vector<std::string> keys;
        if (op == kGet) {
          keys.push_back(r.str());
        } else {
          uint32_t count = r.u32();
          if (count > r.n / 4) break;  // each key takes at least 4 bytes
          for (uint32_t i = 0; i < count && r.ok; ++i) keys.push_back(r.str());
        }
        int64_t timeout_ms = r.i64();
        if (!r.ok || r.n) break;
        const std::string* missing = first_missing(keys);
        if (!missing) {
          complete(c, op, keys);
        } else if (timeout_ms <= 0) {
          reply_timeout(c, *missing);
        } else {
          c.pending = Pending{op, std::move(keys), Clock::now() + std::chrono::milliseconds(timeout_ms)};
        }
        return true;
      }
      case kCheck: {
        uint32_t count = r.u32();
        if (count > r.n / 4) break;
        std::vector<std::string> keys;
        for (uint32_t i = 0; i < count && r.ok; ++i) keys.push_back(r.str());
        if (!r.ok || r.n) break;
        std::string payload;
        put_i64(payload, first_missing(keys) ? 0 : 1);
        reply_ok(c, payload);
        return true;
      }
      case kNumKeys: {
        if (!r.ok || r.n) break;
        std::string payload;
        put_i64(payload, static_cast<int64_t>(kv.size()));
        reply_ok(c, payload);
        return true;
      }
      case kErase: {
        std::string key = r.str();
        if (!r.ok || r.n) break;
        std::string payload;
        put_i64(payload, kv.erase(key) ? 1 : 0);
        reply_ok(c, payload);
        return true;
      }
      default: why = "bad frame: unknown op " + std::to_string(op); return false;
    }
    why = "bad frame: fields of op " + std::to_string(op) + " do not fill its " + std::to_string(n) + "-byte frame";
    return false;
  }

  // Handles the complete frames buffered for c (stopping behind a pending get/wait); true when any was handled.
  bool process(int fd, Client& c) {
    bool progress = false;
    size_t off = 0;
    while (!c.closed && !c.pending && c.in.size() - off >= 4) {
      const uint32_t len = get_u32(c.in.data() + off);
      if (len > kMaxFrame) {
        drop(fd, c, "bad frame: " + std::to_string(len) + " bytes (the limit is " + std::to_string(kMaxFrame) + ")");
        break;
      }
      if (c.in.size() - off - 4 < len) break;
      std::string why;
      if (!handle(c, c.in.data() + off + 4, len, why)) {
        drop(fd, c, why);
        break;
      }
      off += 4 + len;
      progress = true;
    }
    c.in.erase(0, off);
    return progress;
  }

  void run() {
    std::vector<pollfd> fds;
    for (;;) {
      // Answer expired waits; the nearest deadline bounds the poll.
      int timeout = -1;
      const auto now = Clock::now();
      for (auto& [fd, c] : clients) {
        if (!c.pending || c.closed) continue;
        if (c.pending->deadline <= now) {
          timeout = 0;
        } else {
          auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(c.pending->deadline - now).count() + 1;
          if (timeout < 0 || ms < timeout) timeout = static_cast<int>(std::min<int64_t>(ms, 1 << 30));
        }
      }
      fds.clear();
      fds.push_back({wake[0], POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      for (auto& [fd, c] : clients) {
        short ev = POLLRDHUP;
        if (!c.pending) ev |= POLLIN;
        if (!c.out.empty()) ev |= POLLOUT;
        fds.push_back({fd, ev, 0});
      }
      int rc = poll(fds.data(), fds.size(), timeout);
      if (rc < 0 && errno != EINTR) {
        spdlog::error("keel store {}: poll failed: {}", address, errno_text(errno));
        return;
      }
      if (fds[0].revents) return;  // stop()
      if (fds[1].revents & POLLIN) {
        for (;;) {
          int cfd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (cfd < 0) break;
          set_nodelay(cfd);
          clients[cfd].peer = peer_name(cfd);
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        const int fd = fds[i].fd;
        Client& c = clients.at(fd);
        const short re = fds[i].revents;
        if (re & POLLIN) {
          char buf[65536];
          for (;;) {
            ssize_t got = recv(fd, buf, sizeof buf, 0);
            if (got > 0) {
              c.in.append(buf, static_cast<size_t>(got));
              if (c.in.size() > kMaxFrame + 4 + sizeof buf) break;  // process() judges the frame
              continue;
            }
            if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c.closed = true;
            break;
          }
        } else if (re & (POLLHUP | POLLERR | POLLRDHUP)) {
          c.closed = true;  // gone while waiting (or idle)
        }
        if ((re & POLLOUT) && !c.out.empty() && !c.closed) {
          ssize_t sent = send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
          if (sent > 0) c.out.erase(0, static_cast<size_t>(sent));
          else if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c.closed = true;
        }
      }
      const auto after = Clock::now();
      for (auto& [fd, c] : clients) {
        if (c.pending && !c.closed && c.pending->deadline <= after) {
          reply_timeout(c, *first_missing(c.pending->keys));
          c.pending.reset();
        }
      }
      // A set from one client can release another's pending wait, behind which more frames may be buffered.
      for (bool progress = true; progress;) {
        progress = false;
        for (auto& [fd, c] : clients) progress |= process(fd, c);
      }
      // Try to send replies right away (the common case: the socket buffer has room).
      for (auto& [fd, c] : clients) {
        if (c.closed || c.out.empty()) continue;
        ssize_t sent = send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
        if (sent > 0) c.out.erase(0, static_cast<size_t>(sent));
        else if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c.closed = true;
      }
      for (auto it = clients.begin(); it != clients.end();) {
        if (it->second.closed) {
          close(it->first);
          it = clients.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
};

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const std::string& host, int32_t port) {
  if (host.empty()) return invalid_argument("store server: no address to bind (give 127.0.0.1 or this host's address)");
  if (port < 0 || port > 65535)
    return invalid_argument("store server: port " + std::to_string(port) + " is out of range");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string want = format_address(host, port);
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return invalid_argument("store server: cannot resolve '" + host + "': " + gai_strerror(rc));
  auto impl = std::make_unique<Impl>();
  std::string last_error = "no address";
  bool in_use = false;
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last_error = errno_text(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // a TIME_WAIT from a previous run is no conflict
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 512) != 0) {
      in_use |= errno == EADDRINUSE;
      last_error = errno_text(errno);
      close(fd);
      continue;
    }
    impl->listen_fd = fd;
    break;
  }
  freeaddrinfo(res);
  if (impl->listen_fd < 0) {
    if (in_use) return unavailable(want + " is in use");
    return unavailable("store server: cannot listen on " + want + ": " + last_error);
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&ss), &len);
  const int bound = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                             : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (pipe2(impl->wake, O_CLOEXEC) != 0) return internal_error("store server: pipe: " + errno_text(errno));
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  server->host_ = host;
  server->port_ = bound;
  impl->address = server->address();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  server->impl_ = std::move(impl);
  spdlog::debug("keel store: serving on {}", server->address());
  return server;
}

void TcpStoreServer::stop() {
  if (!impl_) return;
  const char x = 1;
  ssize_t ignored = write(impl_->wake[1], &x, 1);
  (void)ignored;
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_.reset();
}

TcpStoreServer::~TcpStoreServer() { stop(); }

// ------------------------------------------------------------------------------------------------------------
// TcpStore

struct TcpStore::Reply {
  std::string body;  // after the status byte
};

namespace {

// One non-blocking connect attempt bounded by deadline; the connected (blocking) socket or -1 with errno text.
int connect_once(const addrinfo* a, Clock::time_point deadline, std::string& error) {
  int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
  if (fd < 0) {
    error = errno_text(errno);
    return -1;
  }
  if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      error = errno_text(errno);
      close(fd);
      return -1;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd, POLLOUT, 0};
    int rc = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1 << 30))));
    int err = 0;
    socklen_t len = sizeof err;
    if (rc <= 0) {
      error = rc == 0 ? "connect timed out" : errno_text(errno);
      close(fd);
      return -1;
    }
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      error = errno_text(err);
      close(fd);
      return -1;
    }
  }
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  set_nodelay(fd);
  return fd;
}

}  // namespace

StatusOr<std::unique_ptr<TcpStore>> TcpStore::connect(const std::string& host, int32_t port, int64_t timeout_ms) {
  if (host.empty()) return invalid_argument("store client: no server address");
  if (port <= 0 || port > 65535)
    return invalid_argument("store client: port " + std::to_string(port) + " is out of range");
  const std::string address = format_address(host, port);
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
  std::string error = "not tried";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    int fd = -1;
    if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
      error = std::string("cannot resolve '") + host + "': " + gai_strerror(rc);
    } else {
      for (addrinfo* a = res; a && fd < 0; a = a->ai_next) fd = connect_once(a, deadline, error);
      freeaddrinfo(res);
    }
    if (fd >= 0) {
      std::unique_ptr<TcpStore> s(new TcpStore());
      s->fd_ = fd;
      s->address_ = address;
      s->timeout_ms_ = timeout_ms > 0 ? timeout_ms : 30000;
      return s;
    }
    if (Clock::now() + std::chrono::milliseconds(50) >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return deadline_exceeded("store server " + address + " unreachable within " + std::to_string(timeout_ms) +
                           " ms (last error: " + error + ")");
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) close(fd_);
}

StatusOr<TcpStore::Reply> TcpStore::call(const std::string& request, int64_t wait_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return unavailable("the connection to store server " + address_ + " was lost earlier");
  auto fail = [&](Status s) {
    close(fd_);
    fd_ = -1;  // the stream is out of step: no later request may use it
    return s;
  };
  const std::string f = frame(request);
  for (size_t off = 0; off < f.size();) {
    ssize_t n = send(fd_, f.data() + off, f.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(unavailable("store server " + address_ + ": send failed: " + errno_text(errno)));
    off += static_cast<size_t>(n);
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(wait_ms, 0) + timeout_ms_);
  std::string in;
  auto read_exact = [&](size_t want) -> Status {
    while (in.size() < want) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return deadline_exceeded("store server " + address_ + " did not answer in time");
      pollfd p{fd_, POLLIN, 0};
      int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (rc < 0 && errno == EINTR) continue;
      if (rc <= 0) continue;
      char buf[65536];
      ssize_t n = recv(fd_, buf, std::min(sizeof buf, want - in.size()), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) return unavailable("store server " + address_ + " closed the connection");
      if (n < 0) return unavailable("store server " + address_ + ": " + errno_text(errno));
      in.append(buf, static_cast<size_t>(n));
    }
    return Status::ok();
  };
  if (Status s = read_exact(4); !s.is_ok()) return fail(s);
  const uint32_t len = get_u32(in.data());
  if (len == 0 || len > kMaxFrame) return fail(internal_error("store server " + address_ + " sent a bad frame"));
  if (Status s = read_exact(4 + len); !s.is_ok()) return fail(s);
  Reader r{in.data() + 4, len};
  const uint8_t status = r.u8();
  if (status == kReplyOk) return Reply{std::string(r.p, r.n)};
  if (status == kReplyTimeout) {
    std::string key = r.str();
    return deadline_exceeded(missing_key_message(key, wait_ms, "store " + address_));
  }
  if (status == kReplyError) {
    auto code = static_cast<StatusCode>(r.i64());
    std::string message = r.str();
    if (r.ok) return Status(code, message);
  }
  return fail(internal_error("store server " + address_ + " sent a bad reply"));
}

Status TcpStore::set(const std::string& key, std::string_view value) {
  std::string req(1, static_cast<char>(kSet));
  put_str(req, key);
  put_str(req, value);
  if (req.size() > kMaxFrame) return invalid_argument("store set: the value of key '" + key + "' is over 64 MiB");
  auto r = call(req, 0);
  return r.is_ok() ? Status::ok() : r.status().with_context("set '" + key + "'");
}

StatusOr<std::string> TcpStore::get(const std::string& key, int64_t timeout_ms) {
  std::string req(1, static_cast<char>(kGet));
  put_str(req, key);
  put_i64(req, timeout_ms);
  KEEL_ASSIGN_OR_RETURN(Reply r, call(req, timeout_ms), "get");
  Reader rd{r.body.data(), r.body.size()};
  std::string v = rd.str();
  if (!rd.ok) return internal_error("store server " + address_ + " sent a bad reply to get '" + key + "'");
  return v;
}

StatusOr<int64_t> TcpStore::add(const std::string& key, int64_t delta) {
  std::string req(1, static_cast<char>(kAdd));
  put_str(req, key);
  put_i64(req, delta);
  KEEL_ASSIGN_OR_RETURN(Reply r, call(req, 0), "add '" + key + "'");
  Reader rd{r.body.data(), r.body.size()};
  int64_t v = rd.i64();
  if (!rd.ok) return internal_error("store server " + address_ + " sent a bad reply to add '" + key + "'");
  return v;
}

Status TcpStore::wait(const std::vector<std::string>& keys, int64_t timeout_ms) {
  std::string req(1, static_cast<char>(kWait));
  put_u32(req, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) put_str(req, k);
  put_i64(req, timeout_ms);
  auto r = call(req, timeout_ms);
  return r.is_ok() ? Status::ok() : r.status().with_context("wait");
}

StatusOr<bool> TcpStore::check(const std::vector<std::string>& keys) {
  std::string req(1, static_cast<char>(kCheck));
  put_u32(req, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) put_str(req, k);
  KEEL_ASSIGN_OR_RETURN(Reply r, call(req, 0), "check");
  Reader rd{r.body.data(), r.body.size()};
  int64_t v = rd.i64();
  if (!rd.ok) return internal_error("store server " + address_ + " sent a bad reply to check");
  return v != 0;
}

StatusOr<int64_t> TcpStore::num_keys() {
  std::string req(1, static_cast<char>(kNumKeys));
  KEEL_ASSIGN_OR_RETURN(Reply r, call(req, 0), "num_keys");
  Reader rd{r.body.data(), r.body.size()};
  int64_t v = rd.i64();
  if (!rd.ok) return internal_error("store server " + address_ + " sent a bad reply to num_keys");
  return v;
}

StatusOr<bool> TcpStore::erase(const std::string& key) {
  std::string req(1, static_cast<char>(kErase));
  put_str(req, key);
  KEEL_ASSIGN_OR_RETURN(Reply r, call(req, 0), "erase '" + key + "'");
  Reader rd{r.body.data(), r.body.size()};
  int64_t v = rd.i64();
  if (!rd.ok) return internal_error("store server " + address_ + " sent a bad reply to erase");
  return v != 0;
}

}  // namespace keel::dist
