// keel/core/runtime/dist/store.h — the rendezvous key-value store through which ranks find each other.
//
// A Store maps string keys to byte-string values. Ranks use it once, at start-up: to agree on a world (see
// process_group.h) and to let collective plugins exchange addresses (Gloo) or unique ids (NCCL) through the C view
// that c_store() gives them (keel_kv_store_t, whose get waits with a timeout).
//
// Implementations:
//   InProcessStore  a map in this process (tests; one-process jobs);
//   TcpStoreServer  serves a store over TCP (one thread, poll(), bound to 127.0.0.1 or the given address — never
//                   0.0.0.0 unless asked for by name); rank 0 or `keel launch` runs it at MASTER_ADDR:MASTER_PORT;
//   TcpStore        a client of that server; connects with retries until a deadline;
//   PrefixStore     puts every key of another store under "<prefix>/" (one namespace per group or attempt).
//
// Timeouts are in milliseconds; timeout_ms <= 0 means "do not wait" (the keys must already be there). A key that is
// not set in time is DEADLINE_EXCEEDED naming the key. add() keeps its counter as the decimal text of an int64, so a
// key set() to something else is INVALID_ARGUMENT for add().
//
// Thread-safety: every Store is safe to use from several threads at once (a TcpStore serialises its requests on one
// connection). Ownership: c_store() points into the Store and is valid as long as it; values returned through the C
// view stay valid until the Store is destroyed.
//
// The wire protocol (TcpStore <-> TcpStoreServer): every message is a frame, a little-endian uint32 byte count and
// that many bytes. A request starts with an op byte (set, get, add, wait, check, num_keys, erase) followed by its
// fields (strings: uint32 length + bytes; integers: little-endian int64). A reply starts with a status byte (ok,
// timeout + the missing key, error + a message) and the op's result. A frame over 64 MiB, an unknown op or a field
// that runs past its frame closes that client's connection with a warning; the server keeps serving the others.
#pragma once

#include <keel/plugin.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.h"

namespace keel::dist {

class Store {
 public:
  Store();
  virtual ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Sets (or replaces) key. Wakes every waiter on it.
  virtual Status set(const std::string& key, std::string_view value) = 0;
  // The value of key, waiting up to timeout_ms for it to be set; DEADLINE_EXCEEDED naming the key otherwise.
  virtual StatusOr<std::string> get(const std::string& key, int64_t timeout_ms) = 0;
  // Adds delta to the integer counter at key (absent = 0) and returns the new value. Atomic across clients.
  virtual StatusOr<int64_t> add(const std::string& key, int64_t delta) = 0;
  // Waits until every key is set; DEADLINE_EXCEEDED naming the first missing key after timeout_ms.
  virtual Status wait(const std::vector<std::string>& keys, int64_t timeout_ms) = 0;
  // Whether every key is set now (no waiting).
  virtual StatusOr<bool> check(const std::vector<std::string>& keys) = 0;
  // Number of keys in the whole store (a PrefixStore counts all of them, not only its own).
  virtual StatusOr<int64_t> num_keys() = 0;
  // Removes key; true when it existed.
  virtual StatusOr<bool> erase(const std::string& key) = 0;
  // Where the store lives, for messages ("in-process", "127.0.0.1:29500", "prefix 'pg/0' of 127.0.0.1:29500").
  virtual std::string describe() const = 0;

  // The C view for collective plugins; owned by this Store, valid while it lives.
  keel_kv_store_t* c_store() { return &c_; }

 private:
  keel_kv_store_t c_{};
  std::mutex values_mu_;
  std::deque<std::string> values_;  // values handed out through c_.get (the C contract: valid until release)
};

// A map in this process.
class InProcessStore final : public Store {
 public:
  InProcessStore();
  ~InProcessStore() override;
  Status set(const std::string& key, std::string_view value) override;
  StatusOr<std::string> get(const std::string& key, int64_t timeout_ms) override;
  StatusOr<int64_t> add(const std::string& key, int64_t delta) override;
  Status wait(const std::vector<std::string>& keys, int64_t timeout_ms) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  StatusOr<int64_t> num_keys() override;
  StatusOr<bool> erase(const std::string& key) override;
  std::string describe() const override { return "in-process store"; }

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Keys of `base` under "<prefix>/". Shares ownership of base.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix);
  Status set(const std::string& key, std::string_view value) override;
  StatusOr<std::string> get(const std::string& key, int64_t timeout_ms) override;
  StatusOr<int64_t> add(const std::string& key, int64_t delta) override;
  Status wait(const std::vector<std::string>& keys, int64_t timeout_ms) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  StatusOr<int64_t> num_keys() override;
  StatusOr<bool> erase(const std::string& key) override;
  std::string describe() const override;
  const std::string& prefix() const { return prefix_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

// "host:port", or "[host]:port" for an IPv6 literal.
std::string format_address(const std::string& host, int32_t port);

// Serves a store over TCP from one background thread until destroyed (or stop()). Clients that send bad frames are
// disconnected with a warning; the server never exits because of a client.
class TcpStoreServer {
 public:
  // Binds host:port (port 0 = a free port, read back with port()) and starts serving. host is an address or a name
  // that resolves to this machine; "127.0.0.1" by default. A port already bound: UNAVAILABLE "127.0.0.1:29500 is in
  // use".
  static StatusOr<std::unique_ptr<TcpStoreServer>> start(const std::string& host = "127.0.0.1", int32_t port = 0);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  const std::string& host() const { return host_; }
  int32_t port() const { return port_; }
  std::string address() const { return format_address(host_, port_); }
  // Closes every connection and joins the thread. Idempotent; called by the destructor.
  void stop();

 private:
  TcpStoreServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string host_;
  int32_t port_ = 0;
};

// A client of a TcpStoreServer over one TCP connection.
class TcpStore final : public Store {
 public:
  // Connects to host:port, retrying (the server may not be up yet) until timeout_ms: DEADLINE_EXCEEDED naming the
  // address otherwise. timeout_ms also bounds every later request that does not wait by itself (a server that stops
  // answering is DEADLINE_EXCEEDED, a server that goes away UNAVAILABLE, both naming the address).
  static StatusOr<std::unique_ptr<TcpStore>> connect(const std::string& host, int32_t port, int64_t timeout_ms);
  ~TcpStore() override;

  Status set(const std::string& key, std::string_view value) override;
  StatusOr<std::string> get(const std::string& key, int64_t timeout_ms) override;
  StatusOr<int64_t> add(const std::string& key, int64_t delta) override;
  Status wait(const std::vector<std::string>& keys, int64_t timeout_ms) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  StatusOr<int64_t> num_keys() override;
  StatusOr<bool> erase(const std::string& key) override;
  std::string describe() const override { return "store " + address_; }
  const std::string& address() const { return address_; }

 private:
  TcpStore() = default;
  struct Reply;
  // Sends one request and reads its reply; wait_ms is how long the server may legitimately take.
  StatusOr<Reply> call(const std::string& request, int64_t wait_ms);
  std::mutex mu_;
  int fd_ = -1;
  std::string address_;
  int64_t timeout_ms_ = 0;
};

}  // namespace keel::dist
