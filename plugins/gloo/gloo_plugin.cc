// plugins/gloo/gloo_plugin.cc — the Gloo collective plugin: communicators over TCP for the "cpu" device type.
//
// Built against <keel/plugin.h> only and Gloo (Debian's libgloo-dev). Buffers are host memory; `stream` is ignored
// and every entry is synchronous (it returns when this rank's part of the operation is complete).
//
// Rendezvous goes through the core's key-value store (set/get only). Every key of a communicator carries the prefix
// "keel/gloo/<g>/", where g is the number of communicators this rank created before on the same store (read back
// from the store: the first g whose "arrived/<rank>" key is missing), so several communicators and groups share one
// store as long as every rank creates its communicators in the same order. Every rank first announces itself
// ("<prefix>arrived/<rank>") and waits, within the timeout, for every other rank, so that a peer that never comes is
// named (DEADLINE_EXCEEDED "rank 3 of 4 never arrived"); Gloo then connects a full mesh of TCP pairs through the same
// store ("<prefix>gloo/..."), and the plugin a second one of its own, the message mesh ("<prefix>mesh/<rank>"; see
// "The message mesh" below), both bounded by what is left of the timeout. Both bind 127.0.0.1 (ephemeral ports)
// unless the manifest option or environment names an interface (`iface`, KEEL_GLOO_IFACE) or an address (`hostname`,
// KEEL_GLOO_HOSTNAME); the environment wins.
//
// Every collective first exchanges a 48-byte header with every peer on the message mesh (kind, count, dtype, op,
// root, a flag for invalid local arguments): a count, dtype, op or root that differs between ranks, or a rank whose
// arguments are invalid, is INVALID_ARGUMENT on every rank (the data are not touched and the communicator stays
// usable), never corruption or a hang. The header exchange is also the barrier. send/recv exchange a header and an
// acknowledgement before the data (on Gloo's pairs). all_reduce is a direct exchange for small buffers (each rank's
// input travels in its header message to every peer; each reduces in rank order) and, above, reads the peers' buffers
// out of their processes when every rank runs on this host ("Cross-memory all-reduce") or else runs a ring on the
// message mesh (allreduce_algorithm; Gloo's bcube and ring on request); broadcast travels in the root's header
// message up to the same capacity and is Gloo's binomial tree above, all_gather Gloo's ring, reduce_scatter a direct
// exchange (each rank sends every peer its block). f16 and bf16 reduce in float, element by element. AVG is the sum
// divided by the world size (integer division for integer types).
//
// Every wait is bounded by the communicator's timeout (timeout_ms <= 0 means the default, 5 minutes). A peer that
// closes its connection (released its communicator, exited, was killed) or a timeout makes the entry fail with a
// message naming the rank whose connection closed (UNAVAILABLE) or that was waited on (DEADLINE_EXCEEDED); the
// communicator is then broken and later entries return FAILED_PRECONDITION. SIGPIPE is blocked in the threads that
// write to sockets (and a pending one consumed), so a dead peer never kills this process.
//
// State: per environment (ABI 1.5 instances). Each environment that loads the plugin gets its own instance holding
// the settings it read (its plugin options, then the KEEL_GLOO_* variables) and the table's user_data points at it;
// a communicator copies the settings it was created with, so environments with different options coexist and one
// whose init fails (a bad option) changes nothing for the others.
//
// Thread-safety: entries on one communicator are serialised by its mutex; different communicators are independent.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <keel/plugin.h>
#include <linux/futex.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The core's status constructor, kept for helpers that have no instance at hand. It is a plain function of the core
// library (no environment in its arguments), the same for every environment that loads this plugin; set by every
// init_instance before its table is registered.
using StatusCreateFn = keel_status_t (*)(int32_t, const char*);
std::atomic<StatusCreateFn> g_status_create{nullptr};

keel_status_t make_status(int32_t code, const std::string& m) {
  return g_status_create.load(std::memory_order_acquire)(code, m.c_str());
}

constexpr int64_t kDefaultTimeoutMs = 5 * 60 * 1000;

// An environment's settings of this plugin, and its whole plugin state (the ABI 1.5 instance, the collective table's
// user_data, handed to shutdown_instance), read once by its init_instance (the environment's plugin options, which
// are the manifest's [options] with the host's merged over them; then the KEEL_GLOO_* variables). Each communicator
// keeps a copy: the entries after c_create need no instance.
struct Settings {
  std::string hostname = "127.0.0.1";
  std::string iface;
  // Empty: automatic — direct while (ranks - 1) * bytes <= 1 MiB (and bytes <= 512 KiB where cross memory works),
  // else cross-memory when every rank is on this host, else mesh-ring (per call, from the byte count; the header
  // exchange checks that every rank chose the same).
  // "mesh-ring" / "bcube" / "ring" (Gloo's): always that one; "cross-memory": at every size where available (else
  // mesh-ring); "direct": direct up to its capacity, the automatic choice above.
  std::string algorithm;
  bool check = true;  // KEEL_GLOO_CHECK=0 skips the header exchange (for measuring its cost only)
  // Cross-memory all-reduce between ranks of one host (see "Cross-memory all-reduce"): "auto" or "off".
  bool cross_memory = true;
  // Shared-memory all-reduce where cross memory works (see "Shared-memory all-reduce"): "auto" or "off".
  bool shared_memory = true;
  // KEEL_GLOO_SOCKET_BUFFER=0 keeps Linux's socket buffer sizes (for measuring; size_mesh_buffers).
  bool size_socket_buffers = true;
};

// Slot prefixes of this plugin's own messages (Gloo's own algorithms use 0x01-0x08).
constexpr uint8_t kP2pHeaderSlot = 0xE1, kP2pAckSlot = 0xE2, kP2pDataSlot = 0xE3, kReduceScatterSlot = 0xE4,
                  kProbeSlot = 0xEF;

// ---------------------------------------------------------------------------------------------------------------
// SIGPIPE: Gloo writes with writev(2), which raises SIGPIPE on a socket whose peer is gone. Blocked in the calling
// thread for the duration of an entry (and in Gloo's device thread, which inherits the mask at creation); a
// SIGPIPE that became pending meanwhile is consumed before the mask is restored.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe_, &old_) == 0;
  }
  ~SigpipeGuard() {
    if (!blocked_) return;
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        const struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {}
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false, blocked_ = false;
};

// ---------------------------------------------------------------------------------------------------------------
// Data types and reductions.

size_t element_size(int32_t dtype) {
  switch (dtype) {
    case KEEL_DTYPE_U8:
    case KEEL_DTYPE_I8:
    case KEEL_DTYPE_BOOL: return 1;
    case KEEL_DTYPE_U16:
    case KEEL_DTYPE_I16:
    case KEEL_DTYPE_F16:
    case KEEL_DTYPE_BF16: return 2;
    case KEEL_DTYPE_F32:
    case KEEL_DTYPE_I32:
    case KEEL_DTYPE_U32: return 4;
    case KEEL_DTYPE_F64:
    case KEEL_DTYPE_I64:
    case KEEL_DTYPE_U64: return 8;
  }
  return 0;
}

std::string dtype_name(int64_t dtype) {
  switch (dtype) {
    case KEEL_DTYPE_F32: return "f32";
    case KEEL_DTYPE_U8: return "u8";
    case KEEL_DTYPE_I8: return "i8";
    case KEEL_DTYPE_U16: return "u16";
    case KEEL_DTYPE_I16: return "i16";
    case KEEL_DTYPE_I32: return "i32";
    case KEEL_DTYPE_I64: return "i64";
    case KEEL_DTYPE_STRING: return "string";
    case KEEL_DTYPE_BOOL: return "bool";
    case KEEL_DTYPE_F16: return "f16";
    case KEEL_DTYPE_F64: return "f64";
    case KEEL_DTYPE_U32: return "u32";
    case KEEL_DTYPE_U64: return "u64";
    case KEEL_DTYPE_BF16: return "bf16";
  }
  return "dtype " + std::to_string(dtype);
}

std::string op_name(int64_t op) {
  switch (op) {
    case KEEL_REDUCE_SUM: return "sum";
    case KEEL_REDUCE_PROD: return "prod";
    case KEEL_REDUCE_MIN: return "min";
    case KEEL_REDUCE_MAX: return "max";
    case KEEL_REDUCE_AVG: return "avg";
  }
  return "op " + std::to_string(op);
}

// IEEE half <-> float (round to nearest even; NaN stays NaN, overflow becomes infinity).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 113;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t float_to_half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t o;
  if (u >= (143u << 23)) {  // >= 65536 or inf/NaN
    o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < (113u << 23)) {  // subnormal or zero: align the mantissa with a magic addend (0.5f)
    float v;
    std::memcpy(&v, &u, 4);
    v += 0.5f;
    uint32_t w;
    std::memcpy(&w, &v, 4);
    o = w - 0x3f000000u;
  } else {
    const uint32_t odd = (u >> 13) & 1u;
    u += 0xc8000fffu + odd;  // rebias the exponent (-112 << 23) and round half to even
    o = u >> 13;
  }
  return static_cast<uint16_t>(o | (sign >> 16));
}
inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

struct Sum {
  template <typename T>
  T operator()(T a, T b) const {
    return a + b;
  }
};
struct Prod {
  template <typename T>
  T operator()(T a, T b) const {
    return a * b;
  }
};
struct Min {
  template <typename T>
  T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};
struct Max {
  template <typename T>
  T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};

// out may equal a (Gloo reduces in place); plain loops that the compiler vectorises.
template <typename T, typename Op>
void reduce_plain(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  const Op op;
  for (size_t i = 0; i < n; ++i) o[i] = op(x[i], y[i]);
}
template <float (*Load)(uint16_t), uint16_t (*Store)(float), typename Op>
void reduce_16(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  const Op op;
  for (size_t i = 0; i < n; ++i) o[i] = Store(op(Load(x[i]), Load(y[i])));
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename Op>
ReduceFn reduce_for_dtype(int32_t dtype) {
  switch (dtype) {
    case KEEL_DTYPE_F32: return reduce_plain<float, Op>;
    case KEEL_DTYPE_F64: return reduce_plain<double, Op>;
    case KEEL_DTYPE_I32: return reduce_plain<int32_t, Op>;
    case KEEL_DTYPE_I64: return reduce_plain<int64_t, Op>;
    case KEEL_DTYPE_F16: return reduce_16<half_to_float, float_to_half, Op>;
    case KEEL_DTYPE_BF16: return reduce_16<bf16_to_float, float_to_bf16, Op>;
  }
  return nullptr;
}
// The element-wise function of (dtype, op); AVG reduces as SUM (then divide_by). NULL when unsupported.
ReduceFn reduce_fn(int32_t dtype, int32_t op) {
  switch (op) {
    case KEEL_REDUCE_SUM:
    case KEEL_REDUCE_AVG: return reduce_for_dtype<Sum>(dtype);
    case KEEL_REDUCE_PROD: return reduce_for_dtype<Prod>(dtype);
    case KEEL_REDUCE_MIN: return reduce_for_dtype<Min>(dtype);
    case KEEL_REDUCE_MAX: return reduce_for_dtype<Max>(dtype);
  }
  return nullptr;
}

template <typename T>
void divide_plain(void* p, size_t n, int32_t d) {
  T* x = static_cast<T*>(p);
  if constexpr (std::is_floating_point_v<T>) {
    if ((d & (d - 1)) == 0) {  // a power of two: multiplying by its inverse gives the quotient's bits, ~8x faster
      const T inv = T(1) / static_cast<T>(d);
      for (size_t i = 0; i < n; ++i) x[i] *= inv;
      return;
    }
  }
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<T>(x[i] / static_cast<T>(d));
}
// AVG: buf[i] /= d.
void divide_by(void* buf, size_t n, int32_t dtype, int32_t d) {
  auto* h = static_cast<uint16_t*>(buf);
  switch (dtype) {
    case KEEL_DTYPE_F32: divide_plain<float>(buf, n, d); break;
    case KEEL_DTYPE_F64: divide_plain<double>(buf, n, d); break;
    case KEEL_DTYPE_I32: divide_plain<int32_t>(buf, n, d); break;
    case KEEL_DTYPE_I64: divide_plain<int64_t>(buf, n, d); break;
    case KEEL_DTYPE_F16:
      for (size_t i = 0; i < n; ++i) h[i] = float_to_half(half_to_float(h[i]) / static_cast<float>(d));
      break;
    case KEEL_DTYPE_BF16:
      for (size_t i = 0; i < n; ++i) h[i] = float_to_bf16(bf16_to_float(h[i]) / static_cast<float>(d));
      break;
  }
}

bool overlaps(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return bytes > 0 && x < y + bytes && y < x + bytes;
}

// Gloo's typed option setters only need the element size.
template <typename F>
void with_element_type(size_t esize, F&& f) {
  switch (esize) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    default: f(uint64_t{}); break;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Rendezvous: gloo::rendezvous::Store over keel_kv_store_t, every key under one prefix, every wait bounded.

struct StoreError : std::exception {
  int32_t code;
  std::string message;
  StoreError(int32_t c, std::string m) : code(c), message(std::move(m)) {}
  const char* what() const noexcept override { return message.c_str(); }
};

// Takes ownership of `s` (releases it); returns its code and message.
std::pair<int32_t, std::string> take_status(keel_status_t s) {
  std::pair<int32_t, std::string> r{s->code, s->message ? s->message : ""};
  keel_status_release(s);
  return r;
}

int64_t ms_left(Clock::time_point deadline) {
  const auto d = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return d > 0 ? static_cast<int64_t>(d) : 0;
}

class KvStoreAdapter : public gloo::rendezvous::Store {
 public:
  KvStoreAdapter(keel_kv_store_t* kv, std::string prefix, Clock::time_point deadline)
      : kv_(kv), prefix_(std::move(prefix)), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    const std::string k = prefix_ + key;
    if (keel_status_t s = kv_->set(kv_, k.c_str(), data.data(), data.size())) {
      auto [code, m] = take_status(s);
      throw StoreError(code, "store set '" + k + "': " + m);
    }
  }
  std::vector<char> get(const std::string& key) override { return get_within(key, ms_left(deadline_)); }
  void wait(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) get_within(k, ms_left(deadline_));
  }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    for (const auto& k : keys) get_within(k, std::min<int64_t>(timeout.count(), ms_left(deadline_)));
  }

 private:
  std::vector<char> get_within(const std::string& key, int64_t timeout_ms) {
    const std::string k = prefix_ + key;
    const void* v = nullptr;
    size_t n = 0;
    if (keel_status_t s = kv_->get(kv_, k.c_str(), timeout_ms, &v, &n)) {
      auto [code, m] = take_status(s);
      throw StoreError(code, "store get '" + k + "': " + m);
    }
    const char* p = static_cast<const char*>(v);
    return std::vector<char>(p, p + n);
  }

  keel_kv_store_t* kv_;
  std::string prefix_;
  Clock::time_point deadline_;
};

// ---------------------------------------------------------------------------------------------------------------
// The communicator.

// The all-reduce algorithms (see allreduce_algorithm).
enum Algorithm : int64_t { kAlgoDirect = 1, kAlgoBcube, kAlgoRing, kAlgoMeshRing, kAlgoCrossMemory, kAlgoSharedMemory };
const char* algorithm_name(int64_t a) {
  switch (a) {
    case kAlgoDirect: return "direct";
    case kAlgoBcube: return "bcube";
    case kAlgoRing: return "ring";
    case kAlgoMeshRing: return "mesh-ring";
    case kAlgoCrossMemory: return "cross-memory";
    case kAlgoSharedMemory: return "shared-memory";
  }
  return "?";
}

size_t inline_capacity(int32_t size);  // bytes of an all-reduce that travel inside a header message

// The header every rank sends every peer before a collective.
enum Kind : int64_t { kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter, kBarrier, kSendRecv };
struct Header {
  int64_t kind = 0, count = 0, dtype = 0, op = 0, root = 0, bad = 0;
};
static_assert(sizeof(Header) == 48, "the header is 48 bytes on every rank");

// One connection of the message mesh (see "The message mesh" below): a plain TCP socket to one peer.
struct MeshLink {
  int fd = -1;
  size_t sent = 0, received = 0;  // progress of the current exchange (bytes of this rank's frame / of the peer's)
  uint32_t frame[2] = {0, 0};     // the peer's frame prefix: magic and body length
  std::vector<char> inbox;        // the peer's last message; grows to the largest received (at most message_bytes)
};

struct Comm {
  Settings settings;  // the creating environment's (see Settings)
  int32_t rank = 0, size = 1;
  milliseconds timeout{kDefaultTimeoutMs};
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> ctx;  // NULL for one rank
  std::mutex mu;                                   // serialises entries
  uint32_t tag = 0;                                // collectives issued (the same sequence on every rank)
  std::vector<uint32_t> sent, received;            // point-to-point messages per peer
  std::string broken;                              // set after a transport error or timeout
  std::vector<char> scratch;                       // reduce_scatter's receive blocks, all_reduce's copy aside
  // Header messages travel on the message mesh: a header, followed for a direct all-reduce by its whole input (up to
  // inline_capacity bytes). A peer's message is read into its link's inbox during this rank's exchange, and used
  // before this rank's next collective.
  std::vector<MeshLink> links;            // one per rank (this rank's own unused)
  size_t message_bytes = sizeof(Header);  // the largest message accepted: the header plus the inline capacity
  std::vector<char> outbox;               // this rank's frame prefix and header (a payload is sent from its buffer)
  // Cross-memory all-reduce: every rank of this communicator runs on this host and may read the others' memory
  // (agreed by all ranks at creation); their process ids; the word the others read to prove it (a random nonce).
  bool cross_memory = false;
  std::vector<int64_t> pids;
  uint64_t probe = 0;
  // Shared-memory all-reduce (see "Shared-memory all-reduce"): the segment every rank maps (NULL: not in use), its
  // size, one slot's bytes (the largest all-reduce it carries), and the all-reduces it carried (the same on every
  // rank).
  char* shm = nullptr;
  size_t shm_bytes = 0, shm_slot = 0;
  uint32_t shm_calls = 0;

  Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm() {
    for (auto& l : links)
      if (l.fd >= 0) ::close(l.fd);
    if (shm) ::munmap(shm, shm_bytes);
  }
};

const char* kind_name(int64_t k) {
  switch (k) {
    case kAllReduce: return "all_reduce";
    case kBroadcast: return "broadcast";
    case kAllGather: return "all_gather";
    case kReduceScatter: return "reduce_scatter";
    case kBarrier: return "barrier";
    case kSendRecv: return "send/recv";
  }
  return "?";
}

std::string describe(const Header& h) {
  std::string s = kind_name(h.kind);
  if (h.kind == kBarrier) return s;
  s += " count " + std::to_string(h.count) + " dtype " + dtype_name(h.dtype);
  if (h.kind == kAllReduce || h.kind == kReduceScatter) s += " op " + op_name(h.op);
  if (h.kind == kAllReduce) s += std::string(" algorithm ") + algorithm_name(h.root);
  if (h.kind == kBroadcast) s += " root " + std::to_string(h.root);
  return s;
}

bool same_call(const Header& a, const Header& b) {
  if (a.kind != b.kind) return false;
  if (a.kind == kBarrier) return true;
  if (a.count != b.count || a.dtype != b.dtype) return false;
  if ((a.kind == kAllReduce || a.kind == kReduceScatter) && a.op != b.op) return false;
  if ((a.kind == kBroadcast || a.kind == kAllReduce) && a.root != b.root) return false;  // all_reduce: the algorithm
  return true;
}

// After a transport exception: which peers' connections are closed? Each pair keeps the first exception it saw and
// rethrows it on the next use; a zero-byte send is the probe (the communicator is broken anyway, so a message that a
// healthy peer never reads does no harm). Pairs closed by this rank's own timeout are not counted.
std::vector<std::pair<int32_t, std::string>> closed_peers(Comm* c) {
  std::vector<std::pair<int32_t, std::string>> closed;
  char byte = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> probe;
  try {
    probe = c->ctx->createUnboundBuffer(&byte, 1);
  } catch (const std::exception&) {
    return closed;
  }
  for (int32_t peer = 0; peer < c->size; ++peer) {
    if (peer == c->rank) continue;
    try {
      auto& pair = c->ctx->getPair(peer);
      if (!pair) continue;
      pair->send(probe.get(), gloo::Slot::build(kProbeSlot, 0), 0, 0);
    } catch (const std::exception& e) {
      std::string m = e.what();
      if (m.find("Application timeout") == std::string::npos) closed.emplace_back(peer, m);
    }
  }
  return closed;
}

// Gloo's messages carry the source location first ("[file:line] what"): keep what follows.
std::string strip_location(const std::string& m) {
  if (!m.empty() && m[0] == '[') {
    const size_t end = m.find("] ");
    if (end != std::string::npos) return m.substr(end + 2);
  }
  return m;
}

// Maps an exception from Gloo to a status, naming the rank whose connection closed or that was waited on, and
// marks the communicator broken.
keel_status_t transport_failure(Comm* c, const char* what, const std::exception& e, int32_t waited_on) {
  const std::string err = strip_location(e.what());
  const auto closed = closed_peers(c);
  std::string msg =
      std::string("gloo: ") + what + " on rank " + std::to_string(c->rank) + " of " + std::to_string(c->size) + ": ";
  int32_t code;
  if (!closed.empty()) {
    code = KEEL_STATUS_UNAVAILABLE;
    for (size_t i = 0; i < closed.size(); ++i) {
      if (i) msg += "; ";
      msg += "connection to rank " + std::to_string(closed[i].first) + " closed (" + strip_location(closed[i].second) +
             ")";
    }
  } else if (err.find("Timed out") != std::string::npos || err.find("timeout") != std::string::npos) {
    code = KEEL_STATUS_DEADLINE_EXCEEDED;
    msg += "did not complete within " + std::to_string(c->timeout.count()) + " ms";
    msg += waited_on >= 0 ? " (waiting on rank " + std::to_string(waited_on) + ")" : " (a peer is stuck or gone)";
    msg += ": " + err;
  } else {
    code = KEEL_STATUS_UNAVAILABLE;
    msg += err;
  }
  c->broken = msg;
  return make_status(code, msg + "; the communicator is broken");
}

// Runs `body` (which talks to peers) mapping Gloo's exceptions, with SIGPIPE blocked where it may write through Gloo's
// transport (`through_gloo`). This plugin's own paths (the message mesh sends with MSG_NOSIGNAL, shared and cross
// memory write no socket) skip the guard's four system calls, which a small all-reduce felt on every step.
template <typename F>
keel_status_t guarded(Comm* c, const char* what, bool through_gloo, F&& body) {
  std::optional<SigpipeGuard> guard;
  if (through_gloo) guard.emplace();
  int32_t waited_on = -1;
  try {
    return body(&waited_on);
  } catch (const std::exception& e) {
    return transport_failure(c, what, e, waited_on);
  } catch (...) {
    c->broken = std::string("gloo: ") + what + ": unknown exception";
    return make_status(KEEL_STATUS_INTERNAL, c->broken);
  }
}
template <typename F>
keel_status_t guarded(Comm* c, const char* what, F&& body) {
  return guarded(c, what, true, std::forward<F>(body));
}

// ---------------------------------------------------------------------------------------------------------------
// The message mesh: one plain TCP connection per pair of ranks, beside Gloo's pairs, carrying the header messages (and
// in them the direct all-reduce's inputs) and the mesh-ring all-reduce's blocks. The calling thread drives it itself —
// non-blocking sends and receives under poll(2), bounded by the timeout — so that a peer's message wakes the thread
// that waits for it. Through Gloo, every message passes its device loop thread, which then wakes the caller: under the
// normal scheduling policy on a loaded 2-core host that hand-off made a synchronised 216 KB exchange of 2 ranks
// take 2.4-3.6 ms, against 0.28-0.31 ms driven by the calling thread (README.md). Gloo's pairs still carry broadcast,
// all-gather, reduce-scatter, send/recv and, on request, Gloo's bcube and ring all-reduces.
//
// Set-up (c_create, after Gloo's mesh): each rank listens on the address Gloo's device resolved (ephemeral port),
// publishes it under "<prefix>mesh/<rank>", connects to every lower rank and accepts every higher one; a connection
// opens with a greeting (magic, rank, world size) naming the connecting rank. Every step is bounded by what is left
// of the creation timeout.
// Framing: an 8-byte prefix (kFrameMagic and the body length, both uint32 in this host's byte order: every rank of a
// job runs the same build) and the body. A body longer than message_bytes is a protocol error.

constexpr uint32_t kFrameMagic = 0x4b4c4d31;     // "KLM1"
constexpr uint32_t kGreetingMagic = 0x4b4c4d47;  // "KLMG"
constexpr size_t kFramePrefix = 2 * sizeof(uint32_t);

// Where peer p's last header message was read.
char* inbox_of(Comm* c, int32_t p) { return c->links[p].inbox.data(); }

keel_status_t mesh_failure(Comm* c, const char* what, int32_t code, const std::string& detail) {
  c->broken = std::string("gloo: ") + what + " on rank " + std::to_string(c->rank) + " of " + std::to_string(c->size) +
              ": " + detail;
  return make_status(code, c->broken + "; the communicator is broken");
}
keel_status_t mesh_closed(Comm* c, const char* what, int32_t peer, const std::string& why) {
  return mesh_failure(c, what, KEEL_STATUS_UNAVAILABLE,
                      "connection to rank " + std::to_string(peer) + " closed (" + why + ")");
}
keel_status_t mesh_timed_out(Comm* c, const char* what, int32_t waited_on) {
  return mesh_failure(c, what, KEEL_STATUS_DEADLINE_EXCEEDED,
                      "did not complete within " + std::to_string(c->timeout.count()) + " ms (waiting on rank " +
                          std::to_string(waited_on) + ")");
}

std::string errno_text(int e) {
  char buf[128];
  return strerror_r(e, buf, sizeof buf);
}

// One non-blocking sendmsg or recvmsg of `iov`: the bytes moved (> 0), 0 when the socket would block, or -1 when the
// connection is closed or failed (`why` says how: "end of stream" or the error).
ssize_t move_some(int fd, bool sending, iovec* iov, size_t parts, std::string* why) {
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = parts;
  for (;;) {
    const ssize_t r = sending ? ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) : ::recvmsg(fd, &msg, MSG_DONTWAIT);
    if (r > 0) return r;
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    *why = r == 0 ? std::string(sending ? "nothing sent" : "end of stream") : errno_text(errno);
    return -1;
  }
}

// Puts this rank's frame prefix (for a body of the header and `payload_bytes`) and header into c->outbox.
void write_outbox(Comm* c, const Header& h, size_t payload_bytes) {
  const uint32_t prefix[2] = {kFrameMagic, static_cast<uint32_t>(sizeof(Header) + payload_bytes)};
  std::memcpy(c->outbox.data(), prefix, kFramePrefix);
  std::memcpy(c->outbox.data() + kFramePrefix, &h, sizeof h);
}

// Sends this rank's frame (c->outbox's prefix and header, then `payload`) to every peer and reads one message from
// every peer into its inbox, within the timeout. A closed connection is UNAVAILABLE naming the peer; the timeout is
// DEADLINE_EXCEEDED naming the first peer whose message has not arrived (or that does not read).
keel_status_t mesh_exchange(Comm* c, const char* what, const void* payload, size_t payload_bytes) {
  const size_t head_bytes = kFramePrefix + sizeof(Header), frame_bytes = head_bytes + payload_bytes;
  for (auto& l : c->links) l.sent = l.received = 0;
  const auto deadline = Clock::now() + c->timeout;
  std::vector<pollfd> fds;
  fds.reserve(static_cast<size_t>(c->size));
  std::string why;
  for (;;) {
    bool progressed = false, done = true;
    for (int32_t p = 0; p < c->size; ++p) {
      if (p == c->rank) continue;
      MeshLink& l = c->links[p];
      while (l.sent < frame_bytes) {
        iovec iov[2];
        int parts = 0;
        if (l.sent < head_bytes) iov[parts++] = {c->outbox.data() + l.sent, head_bytes - l.sent};
        const size_t payload_sent = l.sent > head_bytes ? l.sent - head_bytes : 0;
        if (payload_bytes > payload_sent)
          iov[parts++] = {const_cast<char*>(static_cast<const char*>(payload)) + payload_sent,
                          payload_bytes - payload_sent};
        const ssize_t r = move_some(l.fd, true, iov, static_cast<size_t>(parts), &why);
        if (r < 0) return mesh_closed(c, what, p, why);
        if (r == 0) break;
        l.sent += static_cast<size_t>(r);
        progressed = true;
      }
      for (;;) {
        size_t want;
        char* dst;
        if (l.received < kFramePrefix) {
          want = kFramePrefix - l.received;
          dst = reinterpret_cast<char*>(l.frame) + l.received;
        } else {
          const size_t body = l.frame[1];
          if (l.received - kFramePrefix >= body) break;
          want = body - (l.received - kFramePrefix);
          dst = inbox_of(c, p) + (l.received - kFramePrefix);
        }
        iovec iov{dst, want};
        const ssize_t r = move_some(l.fd, false, &iov, 1, &why);
        if (r < 0) return mesh_closed(c, what, p, why);
        if (r == 0) break;
        l.received += static_cast<size_t>(r);
        progressed = true;
        if (l.received == kFramePrefix) {
          if (l.frame[0] != kFrameMagic || l.frame[1] > c->message_bytes)
            return mesh_failure(c, what, KEEL_STATUS_INTERNAL,
                                "rank " + std::to_string(p) + " sent a malformed message (magic " +
                                    std::to_string(l.frame[0]) + ", " + std::to_string(l.frame[1]) +
                                    " bytes; at most " + std::to_string(c->message_bytes) + ")");
          if (l.inbox.size() < l.frame[1]) {
            try {
              l.inbox.resize(l.frame[1]);
            } catch (const std::bad_alloc&) {
              return mesh_failure(
                  c, what, KEEL_STATUS_OUT_OF_MEMORY,
                  "no memory for rank " + std::to_string(p) + "'s message of " + std::to_string(l.frame[1]) + " bytes");
            }
          }
        }
      }
      if (l.sent < frame_bytes || l.received < kFramePrefix || l.received - kFramePrefix < l.frame[1]) done = false;
    }
    if (done) return nullptr;
    if (progressed) continue;
    const auto now = Clock::now();
    int32_t waited_on = -1;
    fds.clear();
    for (int32_t p = 0; p < c->size; ++p) {
      if (p == c->rank) continue;
      const MeshLink& l = c->links[p];
      const bool recv_left = l.received < kFramePrefix || l.received - kFramePrefix < l.frame[1];
      const bool send_left = l.sent < frame_bytes;
      if (!recv_left && !send_left) continue;
      if (waited_on < 0) waited_on = p;
      fds.push_back({l.fd, static_cast<short>((recv_left ? POLLIN : 0) | (send_left ? POLLOUT : 0)), 0});
    }
    if (now >= deadline) return mesh_timed_out(c, what, waited_on);
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - now).count() + 1;
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left, 1 << 30))) < 0 && errno != EINTR)
      return mesh_failure(c, what, KEEL_STATUS_INTERNAL, "poll: " + errno_text(errno));
  }
}

// Sends `send_bytes` from `send` to peer `to` while receiving `recv_bytes` from peer `from` into `recv` (to and from
// may be the same peer), on the message mesh, unframed: both sides know the sizes from the header exchange, and each
// connection carries its messages in the same order on both ends. `on_data(received)` runs after every receive that
// brought bytes (received: the bytes in so far). Failures as mesh_exchange's.
template <typename OnData>
keel_status_t mesh_sendrecv(Comm* c, const char* what, int32_t to, const char* send, size_t send_bytes, int32_t from,
                            char* recv, size_t recv_bytes, OnData&& on_data) {
  const int out_fd = c->links[to].fd, in_fd = c->links[from].fd;
  size_t sent = 0, received = 0;
  const auto deadline = Clock::now() + c->timeout;
  for (;;) {
    bool progressed = false;
    std::string why;
    while (sent < send_bytes) {
      iovec iov{const_cast<char*>(send) + sent, send_bytes - sent};
      const ssize_t r = move_some(out_fd, true, &iov, 1, &why);
      if (r < 0) return mesh_closed(c, what, to, why);
      if (r == 0) break;
      sent += static_cast<size_t>(r);
      progressed = true;
    }
    while (received < recv_bytes) {
      iovec iov{recv + received, recv_bytes - received};
      const ssize_t r = move_some(in_fd, false, &iov, 1, &why);
      if (r < 0) return mesh_closed(c, what, from, why);
      if (r == 0) break;
      received += static_cast<size_t>(r);
      progressed = true;
      on_data(received);
    }
    if (sent == send_bytes && received == recv_bytes) return nullptr;
    if (progressed) continue;
    const auto now = Clock::now();
    if (now >= deadline) return mesh_timed_out(c, what, received < recv_bytes ? from : to);
    pollfd fds[2];
    nfds_t n = 0;
    const short out_ev = sent < send_bytes ? POLLOUT : 0, in_ev = received < recv_bytes ? POLLIN : 0;
    if (out_fd == in_fd) {
      fds[n++] = {out_fd, static_cast<short>(out_ev | in_ev), 0};
    } else {
      if (out_ev) fds[n++] = {out_fd, out_ev, 0};
      if (in_ev) fds[n++] = {in_fd, in_ev, 0};
    }
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - now).count() + 1;
    if (::poll(fds, n, static_cast<int>(std::min<int64_t>(left, 1 << 30))) < 0 && errno != EINTR)
      return mesh_failure(c, what, KEEL_STATUS_INTERNAL, "poll: " + errno_text(errno));
  }
}

// The ring all-reduce on the message mesh, in place in `buf` (count elements of esize bytes), driven by the calling
// thread: W-1 reduce-scatter steps (send a block to the next rank, receive one from the previous and reduce it as its
// bytes arrive), then W-1 all-gather steps. Each block's final value is computed by one rank and copied to the
// others, so every rank ends with the same bits.
keel_status_t mesh_ring_all_reduce(Comm* c, char* buf, size_t count, size_t esize, ReduceFn fn) {
  const auto w = static_cast<size_t>(c->size), r = static_cast<size_t>(c->rank);
  const int32_t right = static_cast<int32_t>((r + 1) % w), left = static_cast<int32_t>((r + w - 1) % w);
  auto begin = [&](size_t b) { return count * b / w; };
  auto block_bytes = [&](size_t b) { return (begin(b + 1) - begin(b)) * esize; };
  size_t largest = 0;
  for (size_t b = 0; b < w; ++b) largest = std::max(largest, block_bytes(b));
  if (c->scratch.size() < largest) c->scratch.resize(largest);
  char* tmp = c->scratch.data();
  for (size_t s = 0; s + 1 < w; ++s) {
    const size_t out = (r + w - s) % w, in = (r + 2 * w - s - 1) % w;
    char* dst = buf + begin(in) * esize;
    size_t reduced = 0;  // elements of the incoming block reduced so far
    auto reduce_arrived = [&](size_t received) {
      const size_t ready = received / esize;
      if (ready > reduced) fn(dst + reduced * esize, dst + reduced * esize, tmp + reduced * esize, ready - reduced);
      reduced = ready;
    };
    if (keel_status_t st = mesh_sendrecv(c, "all_reduce", right, buf + begin(out) * esize, block_bytes(out), left, tmp,
                                         block_bytes(in), reduce_arrived))
      return st;
  }
  for (size_t s = 0; s + 1 < w; ++s) {
    const size_t out = (r + 1 + w - s) % w, in = (r + w - s) % w;
    if (keel_status_t st = mesh_sendrecv(c, "all_reduce", right, buf + begin(out) * esize, block_bytes(out), left,
                                         buf + begin(in) * esize, block_bytes(in), [](size_t) {}))
      return st;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------------------------
// Cross-memory all-reduce. When every rank of a communicator runs on this host, all-reduces above 512 KiB (or the
// direct capacity, when smaller) read the peers' buffers straight out of their address spaces with process_vm_readv(2)
// (Linux's cross memory attach, which Open MPI's shared-memory transport uses between the processes of a node) instead
// of streaming them through loopback TCP: one copy per byte instead of two (into and out of the socket buffers), no TCP
// stack, and the reduction reads pieces that are still in cache. For rank r of W, every block being count / W elements:
//   1. the header exchange carries every rank's send and recv addresses;
//   2. reduce-scatter: rank r reads block r of every peer's input (128 KiB at a time) and reduces it into block r of
//      its own output, starting from its own input and taking the peers in rank order;
//   3. a signal round on the message mesh: every block is final;
//   4. all-gather: rank r reads block q of peer q's output into its own, for every peer q;
//   5. a second signal round: no rank reads another's buffers any more, so each may return (and its caller reuse them).
// Each block's value is computed by one rank and copied, so every rank ends with the same bits. A peer process that
// is gone (ESRCH) is UNAVAILABLE naming the rank; the signal rounds are bounded by the timeout like every mesh message.
//
// Set-up (probe_cross_memory, in c_create): every rank publishes "<prefix>xmem/<rank>" (boot id, pid namespace, pid,
// the address of a random word); when every rank shares this host's boot id and pid namespace, each allows processes
// of its user to read its memory (prctl PR_SET_PTRACER_ANY: under Yama's ptrace_scope 1 only ancestors may, and the
// ranks of one launcher are siblings) and says so ("xmem_open/<rank>"), then reads every peer's word: equal to the
// nonce the peer published means readable. Each rank publishes its verdict ("xmem_ok/<rank>"); the communicator uses
// cross memory only when every verdict is yes, so every rank chooses the same algorithm. `cross_memory = off` (or
// KEEL_GLOO_CROSS_MEMORY=off) keeps the ranks' memory closed and the mesh ring in use.

// Why peer p is gone, or empty: its process ended, or it closed its side of the mesh link (released its communicator;
// an ending process closes it too). process_vm_readv itself fails with ESRCH on a process that has ended (also while
// it is not yet reaped); this names the failures of a read that raced with the end.
std::string peer_gone(Comm* c, int32_t p) {
  if (::kill(static_cast<pid_t>(c->pids[static_cast<size_t>(p)]), 0) != 0 && errno == ESRCH)
    return "its process is gone";
  char byte;
  const ssize_t n = ::recv(c->links[p].fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
    return "it left while this rank read its buffer";
  return "";
}

// Reads `bytes` at `remote` in peer `p`'s address space into `local`.
keel_status_t read_peer(Comm* c, const char* what, int32_t p, void* local, uint64_t remote, size_t bytes) {
  size_t done = 0;
  while (done < bytes) {
    iovec l{static_cast<char*>(local) + done, bytes - done};
    iovec r{reinterpret_cast<void*>(static_cast<uintptr_t>(remote + done)), bytes - done};
    const ssize_t n = ::process_vm_readv(static_cast<pid_t>(c->pids[static_cast<size_t>(p)]), &l, 1, &r, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int e = n < 0 ? errno : EIO;
    const std::string gone = e == ESRCH ? "its process is gone" : peer_gone(c, p);
    if (!gone.empty()) return mesh_closed(c, what, p, gone);
    return mesh_failure(c, what, KEEL_STATUS_INTERNAL,
                        "cannot read rank " + std::to_string(p) + "'s buffer: " + errno_text(e));
  }
  return nullptr;
}

// One round of small messages on the mesh (phase marks which): returns when every peer sent its own.
keel_status_t mesh_signal(Comm* c, const char* what, int64_t phase) {
  write_outbox(c, Header{kAllReduce, 0, 0, 0, phase, 0}, 0);
  if (keel_status_t s = mesh_exchange(c, what, nullptr, 0)) return s;
  for (int32_t p = 0; p < c->size; ++p) {
    if (p == c->rank) continue;
    Header theirs;
    std::memcpy(&theirs, inbox_of(c, p), sizeof theirs);
    if (c->links[p].frame[1] != sizeof(Header) || theirs.kind != kAllReduce || theirs.root != phase)
      return mesh_failure(c, what, KEEL_STATUS_INTERNAL, "rank " + std::to_string(p) + " is out of step");
  }
  return nullptr;
}

// The addresses every rank sends in its all-reduce header message (step 1).
struct CrossMemoryAddresses {
  uint64_t send = 0, recv = 0;
};

// Steps 2-5 above, after the header exchange; `send` may equal `recv` (not otherwise overlap).
// `avg_dtype` (KEEL_DTYPE_UNDEFINED: none) divides each reduced piece by the world size while it is still in cache
// (KEEL_REDUCE_AVG): each block is divided once, by its owner, and the all-gather copies the quotients, so the result
// has the bits of dividing afterwards, without a second pass over the whole buffer.
keel_status_t cross_memory_all_reduce(Comm* c, const char* send, char* recv, size_t count, size_t esize, ReduceFn fn,
                                      int32_t avg_dtype) {
  const char* what = "all_reduce";
  const auto w = static_cast<size_t>(c->size), r = static_cast<size_t>(c->rank);
  std::vector<CrossMemoryAddresses> at(w);
  for (size_t p = 0; p < w; ++p)
    if (p != r) std::memcpy(&at[p], inbox_of(c, static_cast<int32_t>(p)) + sizeof(Header), sizeof at[p]);
  auto begin = [&](size_t b) { return count * b / w; };
  constexpr size_t kPiece = size_t{128} << 10;
  const size_t piece = std::max<size_t>(1, kPiece / esize);
  if (c->scratch.size() < piece * esize) c->scratch.resize(piece * esize);
  char* tmp = c->scratch.data();
  // 2. Reduce-scatter into block r.
  const size_t b0 = begin(r), n = begin(r + 1) - b0;
  for (size_t off = 0; off < n; off += piece) {
    const size_t m = std::min(piece, n - off), at_byte = (b0 + off) * esize;
    const char* acc = send + at_byte;  // own input first; then the running result in recv
    for (size_t p = 0; p < w; ++p) {
      if (p == r) continue;
      if (keel_status_t st = read_peer(c, what, static_cast<int32_t>(p), tmp, at[p].send + at_byte, m * esize))
        return st;
      fn(recv + at_byte, acc, tmp, m);
      acc = recv + at_byte;
    }
    if (avg_dtype != KEEL_DTYPE_UNDEFINED) divide_by(recv + at_byte, m, avg_dtype, c->size);
  }
  if (keel_status_t st = mesh_signal(c, what, -1)) return st;
  // 4. All-gather: every other block from its owner's output.
  for (size_t q = 0; q < w; ++q) {
    if (q == r) continue;
    const size_t at_byte = begin(q) * esize, bytes = (begin(q + 1) - begin(q)) * esize;
    if (bytes == 0) continue;
    if (keel_status_t st = read_peer(c, what, static_cast<int32_t>(q), recv + at_byte, at[q].recv + at_byte, bytes))
      return st;
  }
  return mesh_signal(c, what, -2);
}

// The store during one of c_create's set-up steps (`step`, e.g. "cross-memory set-up"): a failure names the rank, the
// step and the key.
struct SetupStore {
  keel_kv_store_t* store;
  std::string prefix, who;  // who: "gloo: rank R of W"
  const char* step;
  Clock::time_point deadline;
  std::string key(const char* what, int32_t rank) const { return prefix + what + "/" + std::to_string(rank); }
  keel_status_t put(const std::string& key, const std::string& value) const {
    if (keel_status_t s = store->set(store, key.c_str(), value.data(), value.size())) {
      auto [code, m] = take_status(s);
      return make_status(code, who + ": " + step + ": store set '" + key + "': " + m);
    }
    return nullptr;
  }
  keel_status_t fetch(const std::string& key, std::string* value) const {
    const void* v = nullptr;
    size_t len = 0;
    if (keel_status_t s = store->get(store, key.c_str(), ms_left(deadline), &v, &len)) {
      auto [code, m] = take_status(s);
      return make_status(code, who + ": " + step + ": store get '" + key + "': " + m);
    }
    value->assign(static_cast<const char*>(v), len);
    return nullptr;
  }
  // Publishes this rank's verdict under `what` and reads every peer's: true when every rank said yes.
  keel_status_t agree(const char* what, int32_t rank, int32_t size, bool mine, bool* all) const {
    if (keel_status_t s = put(key(what, rank), mine ? "1" : "0")) return s;
    *all = mine;
    for (int32_t p = 0; p < size; ++p) {
      if (p == rank) continue;
      std::string v;
      if (keel_status_t s = fetch(key(what, p), &v)) return s;
      *all = *all && v == "1";
    }
    return nullptr;
  }
};

// The set-up described above; leaves c->cross_memory false (the mesh ring in use) when the ranks are not all on this
// host or cannot read each other. Only a failure of the store itself is an error.
keel_status_t probe_cross_memory(Comm* c, keel_kv_store_t* store, const std::string& prefix,
                                 Clock::time_point deadline) {
  c->cross_memory = false;
  if (!c->settings.cross_memory || c->size < 2) return nullptr;
  const SetupStore ss{store, prefix, "gloo: rank " + std::to_string(c->rank) + " of " + std::to_string(c->size),
                      "cross-memory set-up", deadline};
  std::string boot;
  {
    std::ifstream f("/proc/sys/kernel/random/boot_id");
    std::getline(f, boot);
  }
  struct stat ns {};
  const bool known = !boot.empty() && ::stat("/proc/self/ns/pid", &ns) == 0;
  c->probe = std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;  // never 0
  const std::string host = known ? boot + ":" + std::to_string(ns.st_ino) : "unknown";
  if (keel_status_t s = ss.put(ss.key("xmem", c->rank), host + " " + std::to_string(::getpid()) + " " +
                                                            std::to_string(reinterpret_cast<uintptr_t>(&c->probe)) +
                                                            " " + std::to_string(c->probe)))
    return s;
  c->pids.assign(static_cast<size_t>(c->size), ::getpid());
  std::vector<uint64_t> addr(static_cast<size_t>(c->size)), nonce(static_cast<size_t>(c->size));
  bool same_host = known;
  for (int32_t p = 0; p < c->size; ++p) {
    if (p == c->rank) continue;
    std::string v;
    if (keel_status_t s = ss.fetch(ss.key("xmem", p), &v)) return s;
    std::istringstream in(v);
    std::string their_host;
    int64_t pid = 0;
    in >> their_host >> pid >> addr[static_cast<size_t>(p)] >> nonce[static_cast<size_t>(p)];
    same_host = same_host && !in.fail() && their_host == host && pid > 0;
    c->pids[static_cast<size_t>(p)] = pid;
  }
  if (same_host) ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);  // EINVAL without Yama: nothing to open
  if (keel_status_t s = ss.put(ss.key("xmem_open", c->rank), same_host ? "1" : "0")) return s;
  bool readable = same_host;
  for (int32_t p = 0; p < c->size && readable; ++p) {
    if (p == c->rank) continue;
    std::string v;
    if (keel_status_t s = ss.fetch(ss.key("xmem_open", p), &v)) return s;
    uint64_t word = 0;
    iovec l{&word, sizeof word},
        r{reinterpret_cast<void*>(static_cast<uintptr_t>(addr[static_cast<size_t>(p)])), sizeof word};
    readable = v == "1" &&
               ::process_vm_readv(static_cast<pid_t>(c->pids[static_cast<size_t>(p)]), &l, 1, &r, 1, 0) ==
                   static_cast<ssize_t>(sizeof word) &&
               word == nonce[static_cast<size_t>(p)];
  }
  bool all = false;
  if (keel_status_t s = ss.agree("xmem_ok", c->rank, c->size, readable, &all)) return s;
  c->cross_memory = all;
  return nullptr;
}

// ---------------------------------------------------------------------------------------------------------------
// Shared-memory all-reduce. Where cross memory works (every rank on this host, each allowed to reach the others'
// processes), the all-reduces small enough for the direct exchange (at most 512 KiB and the inline capacity: a
// data-parallel step's gradients of a small network, a metric, a loss) go through one segment of memory that every
// rank maps, instead of the message mesh's loopback TCP connections: each input is copied once into the segment and
// read from there by every rank, no TCP stack, no socket buffers, and a peer that arrives first is not woken by the
// network. On 2 ranks of SimpleCNN's training (213 KB a step) the direct exchange took a median of ~0.09 ms of each
// ~0.95 ms step; a standalone copy-signal-reduce through shared memory took 0.045 ms (docs/PERFORMANCE_HISTORY.md).
//
// The segment (c->shm): per rank a control line (ShmCtl: the number of its last all-reduce published, `seq`; a
// `waiting` flag; its header for each of the two buffers), then two buffers of W slots of c->shm_slot bytes. The
// all-reduce numbered k (counted alike on every rank: c->shm_calls) uses buffer k % 2:
//   1. rank r writes its header and copies its input into its slot, then publishes seq = k and wakes any rank asleep
//      on its seq;
//   2. r waits until every peer's seq has reached k: spinning for up to kShmSpin, then asleep on the peer's seq (a
//      futex), 1 ms at a time, checking in between that the peer lives, that no message of it waits on the mesh, and
//      the timeout (the peer is then named, as on the mesh);
//   3. every header must equal r's (else INVALID_ARGUMENT naming both calls, as the header exchange); r reduces the W
//      slots in rank order into its output: the same sums in the same order on every rank, so equal bits.
// A rank begins all-reduce k + 2 (which writes buffer k % 2 again) only after every peer published k + 1, which each
// does only after its reduction of k: two buffers need no further round. A rank whose call took another path (its
// byte count or arguments differ, so its choice of algorithm does) sends a header message on the mesh instead; a rank
// waiting here that finds one takes its seq back and joins the header exchange, which reports the disagreement on
// every rank, the communicator still usable.
//
// Set-up (setup_shared_memory, in c_create, after probe_cross_memory agreed): rank 0 creates the segment as an
// anonymous file (memfd_create) and publishes its descriptor's number under "<prefix>shm/0"; every other rank takes a
// duplicate of that descriptor out of rank 0's process (pidfd_getfd(2): the same permission as reading its memory)
// and maps it; every rank publishes its verdict ("shm_ok/<rank>") and the communicator uses the segment only when
// every rank mapped it. No name in a file system: the memory goes when the last rank unmaps it, however ranks end.
// `shared_memory = off` (KEEL_GLOO_SHARED_MEMORY=off) keeps the direct exchange.

constexpr size_t kShmMaxBytes = size_t{512} << 10;
constexpr auto kShmSpin = std::chrono::microseconds(30);  // then asleep: a rank's comm thread shares its compute core

struct alignas(64) ShmCtl {
  uint32_t seq = 0, waiting = 0;
  Header header[2];
};

// The largest all-reduce the segment carries (bytes), and its control lines' bytes (4 KiB-rounded), for W ranks.
size_t shm_capacity(int32_t w) { return std::min(inline_capacity(w), kShmMaxBytes); }
size_t shm_control_bytes(int32_t w) { return (static_cast<size_t>(w) * sizeof(ShmCtl) + 4095) / 4096 * 4096; }

ShmCtl* shm_ctl(Comm* c, int32_t r) { return reinterpret_cast<ShmCtl*>(c->shm) + r; }
char* shm_slot(Comm* c, uint32_t call, int32_t r) {
  return c->shm + shm_control_bytes(c->size) +
         ((call % 2) * static_cast<size_t>(c->size) + static_cast<size_t>(r)) * c->shm_slot;
}
// Whether call number a comes before b (counts wrap around after 2^32 all-reduces).
bool shm_before(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) < 0; }

keel_status_t setup_shared_memory(Comm* c, keel_kv_store_t* store, const std::string& prefix,
                                  Clock::time_point deadline) {
  if (!c->cross_memory || !c->settings.shared_memory || c->size < 2) return nullptr;
  const SetupStore ss{store, prefix, "gloo: rank " + std::to_string(c->rank) + " of " + std::to_string(c->size),
                      "shared-memory set-up", deadline};
  const size_t slot = (shm_capacity(c->size) + 4095) / 4096 * 4096;
  const size_t bytes = shm_control_bytes(c->size) + 2 * static_cast<size_t>(c->size) * slot;
  int fd = -1;
  if (c->rank == 0) {
    fd = static_cast<int>(::syscall(SYS_memfd_create, "keel-gloo-all-reduce", MFD_CLOEXEC));
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) ::close(fd), fd = -1;
    if (keel_status_t s = ss.put(ss.key("shm", 0), fd >= 0 ? std::to_string(fd) : "-")) {
      if (fd >= 0) ::close(fd);
      return s;
    }
  } else {
    std::string v;
    if (keel_status_t s = ss.fetch(ss.key("shm", 0), &v)) return s;
    if (v != "-") {
      const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(c->pids[0]), 0));
      if (pidfd >= 0) {
        fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, std::atoi(v.c_str()), 0));
        ::close(pidfd);
      }
    }
  }
  void* at = MAP_FAILED;
  struct stat st {};
  if (fd >= 0 && ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes)
    at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  bool all = false;
  // Rank 0 keeps its descriptor open until every rank has said whether it took its duplicate.
  keel_status_t s = ss.agree("shm_ok", c->rank, c->size, at != MAP_FAILED, &all);
  if (fd >= 0) ::close(fd);
  if (!s && all) {
    c->shm = static_cast<char*>(at);
    c->shm_bytes = bytes;
    c->shm_slot = slot;
  } else if (at != MAP_FAILED) {
    ::munmap(at, bytes);
  }
  return s;
}

// Waits until `fd` is ready for `events` or the deadline passes (false).
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto now = Clock::now();
    if (now >= deadline) return false;
    pollfd p{fd, events, 0};
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - now).count() + 1;
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (r > 0 || (r < 0 && errno != EINTR)) return true;  // ready, or an error the next call reports
  }
}

// Writes or reads exactly n bytes of a non-blocking socket before the deadline; returns what went wrong (empty: ok).
std::string transfer_all(int fd, bool writing, void* buf, size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = writing ? ::send(fd, p + done, n - done, MSG_NOSIGNAL) : ::recv(fd, p + done, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
    } else if (r == 0) {
      return "connection closed";
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(fd, writing ? POLLOUT : POLLIN, deadline)) return "timed out";
    } else if (errno != EINTR) {
      return errno_text(errno);
    }
  }
  return "";
}

std::string address_text(const sockaddr* a, socklen_t len) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getnameinfo(a, len, host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0) return "?";
  return a->sa_family == AF_INET6 ? "[" + std::string(host) + "]:" + port : std::string(host) + ":" + port;
}

// Socket buffers of the mesh's connections: room for a whole header message with its direct all-reduce input (the
// inline capacity) on both ends, so a rank that arrives first leaves its message in the peer's socket and waits for
// nothing but the peer's. Linux's defaults start at 16 KiB to send and 128 KiB to receive and grow with the traffic
// of one round trip; a rank reading its message only when it arrives gave 2 ranks of SimpleCNN (213 KB a step) a
// receive window near 120 KB, so every exchange took several round trips, each waking a sleeping peer. The kernel
// caps the request at net.core.wmem_max / rmem_max (setting it turns the autotuning off); KEEL_GLOO_SOCKET_BUFFER=0
// leaves the defaults (for measuring).
void size_mesh_buffers(const Comm* c, int fd) {
  if (!c->settings.size_socket_buffers) return;
  const int32_t world = c->size;
  const int bytes =
      static_cast<int>(std::min<size_t>(2 * (sizeof(Header) + inline_capacity(world)) + (64 << 10), size_t{16} << 20));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

// Builds c->links (see "The message mesh"): listens on `local` (Gloo's resolved address), publishes it under
// "<prefix>mesh/<rank>", connects to every lower rank and accepts every higher one, all before `deadline`.
keel_status_t connect_mesh(Comm* c, keel_kv_store_t* store, const std::string& prefix, const sockaddr_storage& local,
                           socklen_t local_len, Clock::time_point deadline) {
  const std::string who = "gloo: rank " + std::to_string(c->rank) + " of " + std::to_string(c->size);
  auto fail = [&](int32_t code, const std::string& m) { return make_status(code, who + ": message mesh: " + m); };
  c->links.assign(static_cast<size_t>(c->size), MeshLink{});

  // Listen on the same address as Gloo's pairs, on an ephemeral port.
  sockaddr_storage addr = local;
  socklen_t addr_len = local_len;
  if (addr.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&addr)->sin_port = 0;
  if (addr.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = 0;
  const int lfd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (lfd < 0) return fail(KEEL_STATUS_UNAVAILABLE, "socket: " + errno_text(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } listener{lfd};
  size_mesh_buffers(c, lfd);  // before listen(): accepted connections inherit it (and its window scale)
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 || ::listen(lfd, c->size) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0)
    return fail(KEEL_STATUS_UNAVAILABLE, "cannot listen on " +
                                             address_text(reinterpret_cast<const sockaddr*>(&local), local_len) + ": " +
                                             errno_text(errno));
  const std::string my_key = prefix + "mesh/" + std::to_string(c->rank);
  if (keel_status_t s = store->set(store, my_key.c_str(), &addr, addr_len)) {
    auto [code, m] = take_status(s);
    return fail(code, "store set '" + my_key + "': " + m);
  }

  const int32_t greeting[3] = {static_cast<int32_t>(kGreetingMagic), c->rank, c->size};
  for (int32_t p = 0; p < c->rank; ++p) {
    const std::string key = prefix + "mesh/" + std::to_string(p);
    const void* v = nullptr;
    size_t n = 0;
    if (keel_status_t s = store->get(store, key.c_str(), ms_left(deadline), &v, &n)) {
      auto [code, m] = take_status(s);
      return fail(code, "rank " + std::to_string(p) + " did not publish its address ('" + key + "'): " + m);
    }
    sockaddr_storage theirs{};
    if (n == 0 || n > sizeof theirs) return fail(KEEL_STATUS_INTERNAL, "'" + key + "' is not an address");
    std::memcpy(&theirs, v, n);
    const auto* ta = reinterpret_cast<const sockaddr*>(&theirs);
    const std::string at = "rank " + std::to_string(p) + " at " + address_text(ta, static_cast<socklen_t>(n));
    const int fd = ::socket(theirs.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return fail(KEEL_STATUS_UNAVAILABLE, "socket: " + errno_text(errno));
    c->links[p].fd = fd;  // closed by ~Comm on any failure
    size_mesh_buffers(c, fd);
    if (::connect(fd, ta, static_cast<socklen_t>(n)) != 0) {
      if (errno != EINPROGRESS && errno != EINTR)
        return fail(KEEL_STATUS_UNAVAILABLE, "cannot connect to " + at + ": " + errno_text(errno));
      if (!wait_ready(fd, POLLOUT, deadline))
        return fail(KEEL_STATUS_DEADLINE_EXCEEDED, "connecting to " + at + " timed out");
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) return fail(KEEL_STATUS_UNAVAILABLE, "cannot connect to " + at + ": " + errno_text(err));
    }
    int32_t hello[3];
    std::memcpy(hello, greeting, sizeof hello);
    if (std::string e = transfer_all(fd, true, hello, sizeof hello, deadline); !e.empty())
      return fail(KEEL_STATUS_UNAVAILABLE, "greeting " + at + ": " + e);
  }
  // A connection that does not greet as a higher rank of this world that has not connected yet (a port scanner, a
  // stale process) is closed and remembered for the error, not fatal; a greeting must arrive within 5 s.
  std::string refused;
  for (int32_t accepted = 0; accepted < c->size - 1 - c->rank;) {
    if (!wait_ready(lfd, POLLIN, deadline)) {
      std::string missing;
      for (int32_t p = c->rank + 1; p < c->size; ++p)
        if (c->links[p].fd < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
      return fail(KEEL_STATUS_DEADLINE_EXCEEDED, "rank(s) " + missing + " did not connect in time" +
                                                     (refused.empty() ? "" : " (refused " + refused + ")"));
    }
    sockaddr_storage from{};
    socklen_t from_len = sizeof from;
    const int fd = ::accept4(lfd, reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
      return fail(KEEL_STATUS_UNAVAILABLE, "accept: " + errno_text(errno));
    }
    int32_t hello[3] = {0, 0, 0};
    const std::string e =
        transfer_all(fd, false, hello, sizeof hello, std::min(deadline, Clock::now() + std::chrono::seconds(5)));
    const int32_t p = hello[1];
    if (!e.empty() || hello[0] != static_cast<int32_t>(kGreetingMagic) || hello[2] != c->size || p <= c->rank ||
        p >= c->size || c->links[p].fd >= 0) {
      refused = "a connection from " + address_text(reinterpret_cast<sockaddr*>(&from), from_len) + ": " +
                (!e.empty() ? "no greeting (" + e + ")"
                 : hello[0] != static_cast<int32_t>(kGreetingMagic)
                     ? std::string("not a greeting")
                     : "greeted as rank " + std::to_string(p) + " of " + std::to_string(hello[2]) +
                           ", not a higher rank of this world that has not connected yet");
      ::close(fd);
      continue;
    }
    c->links[p].fd = fd;
    ++accepted;
  }
  for (auto& l : c->links) {
    if (l.fd < 0) continue;
    const int one = 1;
    ::setsockopt(l.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return nullptr;
}

// INVALID_ARGUMENT when peer p's header `theirs` says it passed invalid arguments or called otherwise than `mine`.
keel_status_t disagreement(const Comm* c, const Header& mine, int32_t p, const Header& theirs) {
  const char* what = kind_name(mine.kind);
  if (theirs.bad)
    return make_status(KEEL_STATUS_INVALID_ARGUMENT, std::string("gloo: ") + what + ": rank " + std::to_string(p) +
                                                         " passed invalid arguments (" + describe(theirs) +
                                                         "); nothing was done");
  if (!same_call(theirs, mine))
    return make_status(KEEL_STATUS_INVALID_ARGUMENT, std::string("gloo: ") + what + ": ranks disagree: rank " +
                                                         std::to_string(c->rank) + " called " + describe(mine) +
                                                         ", rank " + std::to_string(p) + " called " + describe(theirs) +
                                                         "; nothing was done");
  return nullptr;
}

// Every rank sends its header to every peer and reads theirs: INVALID_ARGUMENT (on every rank) when one rank's
// arguments were invalid or the calls differ. `local_error` is this rank's own complaint (empty when none).
// `payload` (payload_bytes <= the inline capacity) travels in the same message, after the header: when the calls
// agree, each peer's payload is at inbox_of(c, peer) + sizeof(Header) until this rank's next collective. Every
// message fits the receiver's capacity whatever the sender passed, so disagreeing ranks cost nothing but the error.
// `always`: exchange even with the check off (KEEL_GLOO_CHECK=0), as a collective whose data travel in the messages
// of some ranks only (a direct broadcast) needs.
keel_status_t exchange_headers(Comm* c, const Header& mine, const std::string& local_error,
                               const void* payload = nullptr, size_t payload_bytes = 0, bool always = false) {
  const char* what = kind_name(mine.kind);
  if (c->size > 1 && (c->settings.check || mine.kind == kBarrier || payload != nullptr || always)) {
    write_outbox(c, mine, payload_bytes);
    if (keel_status_t s = mesh_exchange(c, what, payload, payload_bytes)) return s;
    if (!local_error.empty()) return make_status(KEEL_STATUS_INVALID_ARGUMENT, local_error);
    for (int32_t p = 0; p < c->size; ++p) {
      if (p == c->rank) continue;
      Header h;
      if (c->links[p].frame[1] < sizeof h)
        return make_status(KEEL_STATUS_INVALID_ARGUMENT, std::string("gloo: ") + what + ": rank " + std::to_string(p) +
                                                             " sent a short header; nothing was done");
      std::memcpy(&h, inbox_of(c, p), sizeof h);
      if (keel_status_t s = disagreement(c, mine, p, h)) return s;
    }
    return nullptr;
  }
  if (!local_error.empty()) return make_status(KEEL_STATUS_INVALID_ARGUMENT, local_error);
  return nullptr;
}

#define KEEL_GLOO_PROLOGUE(what)                                                                                  \
  auto* c = reinterpret_cast<Comm*>(comm);                                                                        \
  if (!c) return make_status(KEEL_STATUS_INVALID_ARGUMENT, std::string("gloo: ") + what + ": NULL communicator"); \
  std::lock_guard<std::mutex> lock(c->mu);                                                                        \
  if (!c->broken.empty())                                                                                         \
  return make_status(KEEL_STATUS_FAILED_PRECONDITION,                                                             \
                     std::string("gloo: ") + what + ": the communicator is broken by an earlier error: " + c->broken)

// Checks the common arguments; returns the complaint (empty when fine) and the buffer size in bytes.
std::string check_args(const char* what, int32_t dtype, uint64_t count, uint64_t multiple, const void* a, const void* b,
                       size_t* out_bytes) {
  const size_t es = element_size(dtype);
  *out_bytes = 0;
  if (es == 0) return std::string("gloo: ") + what + ": dtype " + dtype_name(dtype) + " is not supported";
  if (count > (uint64_t{1} << 60) / es / (multiple ? multiple : 1))
    return std::string("gloo: ") + what + ": count " + std::to_string(count) + " is too large";
  if (count > 0 && (a == nullptr || b == nullptr))
    return std::string("gloo: ") + what + ": NULL buffer with count " + std::to_string(count);
  *out_bytes = static_cast<size_t>(count) * es;
  return "";
}

// ---------------------------------------------------------------------------------------------------------------
// Entries.

keel_status_t c_create(void* user_data, keel_kv_store_t* store, int32_t rank, int32_t size,
                       int32_t /*device: host memory*/, int64_t timeout_ms, keel_communicator_t* out) {
  if (!out) return make_status(KEEL_STATUS_INVALID_ARGUMENT, "gloo: out_comm is NULL");
  *out = nullptr;
  if (size < 1 || rank < 0 || rank >= size)
    return make_status(KEEL_STATUS_INVALID_ARGUMENT,
                       "gloo: rank " + std::to_string(rank) + " / size " + std::to_string(size) + " out of range");
  if (size > 1 && (store == nullptr || store->set == nullptr || store->get == nullptr))
    return make_status(KEEL_STATUS_INVALID_ARGUMENT, "gloo: a key-value store is required for more than one rank");
  if (timeout_ms <= 0) timeout_ms = kDefaultTimeoutMs;
  auto c = std::make_unique<Comm>();
  c->settings = *static_cast<const Settings*>(user_data);
  c->rank = rank;
  c->size = size;
  c->timeout = milliseconds(timeout_ms);
  c->sent.assign(static_cast<size_t>(size), 0);
  c->received.assign(static_cast<size_t>(size), 0);
  if (size == 1) {
    *out = reinterpret_cast<keel_communicator_t>(c.release());
    return nullptr;
  }
  const auto deadline = Clock::now() + milliseconds(timeout_ms);

  // This rank's generation on this store: the first g for which it has not announced itself yet.
  std::string prefix;
  for (int64_t g = 0;; ++g) {
    prefix = "keel/gloo/" + std::to_string(g) + "/";
    const std::string key = prefix + "arrived/" + std::to_string(rank);
    const void* v = nullptr;
    size_t n = 0;
    keel_status_t s = store->get(store, key.c_str(), 0, &v, &n);
    if (!s) continue;
    auto [code, m] = take_status(s);
    if (code == KEEL_STATUS_DEADLINE_EXCEEDED || code == KEEL_STATUS_NOT_FOUND) break;
    return make_status(code, "gloo: rendezvous: store get '" + key + "': " + m);
  }
  const char one = 1;
  if (keel_status_t s = store->set(store, (prefix + "arrived/" + std::to_string(rank)).c_str(), &one, 1)) {
    auto [code, m] = take_status(s);
    return make_status(code, "gloo: rendezvous: rank " + std::to_string(rank) + " could not announce itself: " + m);
  }
  std::vector<int32_t> missing;
  for (int32_t peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const std::string key = prefix + "arrived/" + std::to_string(peer);
    const void* v = nullptr;
    size_t n = 0;
    keel_status_t s = store->get(store, key.c_str(), ms_left(deadline), &v, &n);
    if (!s) continue;
    auto [code, m] = take_status(s);
    if (code != KEEL_STATUS_DEADLINE_EXCEEDED)
      return make_status(code, "gloo: rendezvous with rank " + std::to_string(peer) + ": " + m);
    missing.push_back(peer);
  }
  if (!missing.empty()) {
    std::string who;
    for (size_t i = 0; i < missing.size(); ++i)
      who += (i ? (i + 1 == missing.size() ? " and " : ", ") : "") + std::to_string(missing[i]);
    return make_status(KEEL_STATUS_DEADLINE_EXCEEDED,
                       std::string("gloo: ") + (missing.size() == 1 ? "rank " : "ranks ") + who + " of " +
                           std::to_string(size) + " never arrived within " + std::to_string(timeout_ms) + " ms (rank " +
                           std::to_string(rank) + " waited on keys " + prefix + "arrived/<rank>)");
  }

  // Connect the full mesh within what is left of the timeout (the device thread inherits the blocked SIGPIPE).
  SigpipeGuard guard;
  gloo::transport::tcp::attr attr;
  std::string where;
  if (!c->settings.iface.empty()) {
    attr.iface = c->settings.iface;
    where = "interface '" + c->settings.iface + "'";
  } else {
    attr.hostname = c->settings.hostname;
    where = "address '" + c->settings.hostname + "'";
  }
  // Resolved once: Gloo's device and the message mesh bind the same address (CreateDevice is this plus the Device).
  gloo::transport::tcp::attr resolved;
  try {
    resolved = gloo::transport::tcp::CreateDeviceAttr(attr);
    c->device = std::make_shared<gloo::transport::tcp::Device>(resolved);
  } catch (const std::exception& e) {
    return make_status(KEEL_STATUS_UNAVAILABLE, "gloo: cannot use " + where + " for TCP: " + strip_location(e.what()));
  }
  try {
    c->ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    c->ctx->setTimeout(milliseconds(std::max<int64_t>(1, ms_left(deadline))));
    KvStoreAdapter adapter(store, prefix + "gloo/", deadline);
    c->ctx->connectFullMesh(adapter, c->device);
    c->ctx->setTimeout(c->timeout);
  } catch (const StoreError& e) {
    return make_status(e.code == KEEL_STATUS_DEADLINE_EXCEEDED ? KEEL_STATUS_DEADLINE_EXCEEDED : e.code,
                       "gloo: connecting rank " + std::to_string(rank) + " of " + std::to_string(size) +
                           " to its peers did not finish within " + std::to_string(timeout_ms) +
                           " ms (a peer stopped joining): " + e.message);
  } catch (const std::exception& e) {
    const std::string m = strip_location(e.what());
    const bool timed_out = m.find("imeout") != std::string::npos || m.find("imed out") != std::string::npos;
    return make_status(timed_out ? KEEL_STATUS_DEADLINE_EXCEEDED : KEEL_STATUS_UNAVAILABLE,
                       "gloo: connecting rank " + std::to_string(rank) + " of " + std::to_string(size) +
                           " to its peers over " + where + " failed: " + m);
  }
  try {
    if (keel_status_t s = connect_mesh(c.get(), store, prefix, resolved.ai_addr,
                                       static_cast<socklen_t>(resolved.ai_addrlen), deadline))
      return s;
  } catch (const std::bad_alloc&) {
    return make_status(KEEL_STATUS_OUT_OF_MEMORY,
                       "gloo: no memory for the message mesh of rank " + std::to_string(rank));
  }
  try {
    c->message_bytes = sizeof(Header) + std::max(inline_capacity(size), sizeof(CrossMemoryAddresses));
    c->outbox.assign(kFramePrefix + sizeof(Header), 0);
    if (keel_status_t s = probe_cross_memory(c.get(), store, prefix, deadline)) return s;
    if (keel_status_t s = setup_shared_memory(c.get(), store, prefix, deadline)) return s;
  } catch (const std::bad_alloc&) {
    return make_status(KEEL_STATUS_OUT_OF_MEMORY, "gloo: no memory for the " + std::to_string(size) +
                                                      " ranks' message buffers of rank " + std::to_string(rank));
  }
  *out = reinterpret_cast<keel_communicator_t>(c.release());
  return nullptr;
}

void c_release(void*, keel_communicator_t comm) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (!c) return;
  {
    SigpipeGuard guard;
    try {
      // A healthy communicator closes gracefully (FIN): a peer may still be reading the last message this rank
      // sent (a direct all-reduce returns as soon as its own receives are in), and Gloo's closeConnections()
      // resets the connection (SO_LINGER 0), which discards it — the peer then failed with "connection reset"
      // (GlooWorld.AllReduceGivesTheSameBitsOnEveryRank, 1 run in 4 under load). A broken one resets (Gloo's
      // pairs and the message mesh's sockets, SO_LINGER 0), so that peers still waiting fail at once. The mesh's
      // sockets close in ~Comm.
      if (c->ctx && !c->broken.empty()) c->ctx->closeConnections();
      if (!c->broken.empty()) {
        const linger reset{1, 0};
        for (auto& l : c->links)
          if (l.fd >= 0) ::setsockopt(l.fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
      }
      c->ctx.reset();  // peers still waiting on this rank see its connections closed
      c->device.reset();
    } catch (...) {}
  }
  delete c;
}
int32_t c_rank(void*, keel_communicator_t comm) { return comm ? reinterpret_cast<Comm*>(comm)->rank : -1; }
int32_t c_size(void*, keel_communicator_t comm) { return comm ? reinterpret_cast<Comm*>(comm)->size : -1; }

// The all-reduce algorithms. "direct" for small buffers: every rank's whole input travels inside its header message
// to every peer (one message per peer and call on the message mesh, so no ready-to-receive round trip and no second
// exchange), and every rank reduces the W inputs in rank order (the same sums in the same order: results equal bit
// for bit). It moves (W-1) times the buffer per rank, hence the limit: inline_capacity(W) = 1 MiB / (W-1). Above it,
// "mesh-ring": a ring (reduce-scatter, then all-gather: 2(W-1)/W of the buffer per rank) on the message mesh, driven
// by the calling thread like the direct one, reducing each block as its bytes arrive. Gloo's own ring and bcube run
// through its device loop thread: on 2 loopback ranks the mesh ring was 1.1-1.8x Gloo's ring at 1.5 and 4 MiB and
// 0.8-1.4x at 16 and 64 MiB (README.md); they stay available (`algorithm`). Gloo's ring pipelines segments: for small
// buffers its many messages per call cost more than the data (a 213 KB gradient all-reduce on 2 ranks took ~50
// epoll_wait, 29 recvfrom and 16 writev calls per rank), and bcube fell to 62% of the ring at 16 MiB and 18% at 64 MiB.
constexpr size_t kDirectMaxTraffic = size_t{1} << 20;
size_t inline_capacity(int32_t size) {
  return size > 1 ? (kDirectMaxTraffic / static_cast<size_t>(size - 1)) & ~size_t{63} : 0;
}
// Where every rank is on this host (agreed at creation) cross memory takes over from the direct exchange above 512 KiB
// (2 ranks, gloo_allreduce_bench medians: 209 KB direct 0.050-0.076 ms, cross memory 0.079-0.082; 524 KB 0.23-0.27
// against 0.14-0.20; 1 MiB 0.57-0.60 against 0.32-0.33), and from the mesh ring everywhere above the direct capacity.
constexpr size_t kCrossMemoryMin = size_t{512} << 10;
Algorithm allreduce_algorithm(const Comm* c, size_t bytes) {
  const std::string& a = c->settings.algorithm;
  if (a == "ring") return kAlgoRing;
  if (a == "bcube") return kAlgoBcube;
  if (a == "mesh-ring") return kAlgoMeshRing;
  if (a == "cross-memory") return c->cross_memory ? kAlgoCrossMemory : kAlgoMeshRing;
  // "direct" or auto
  if (c->shm && bytes > 0 && bytes <= shm_capacity(c->size)) return kAlgoSharedMemory;
  if (bytes <= inline_capacity(c->size) && !(c->cross_memory && bytes > kCrossMemoryMin)) return kAlgoDirect;
  return c->cross_memory ? kAlgoCrossMemory : kAlgoMeshRing;
}

// The direct all-reduce, after the header exchange carried every rank's input: reduces the W inputs in rank order
// into recv.
void direct_all_reduce(Comm* c, const void* send, void* recv, size_t bytes, size_t count, ReduceFn fn) {
  // recv is written from the first reduction on, so an input that lives in recv (in place) is read there only by
  // that first reduction (ranks 0 and 1); a later rank's own input is copied aside first.
  const char* own = static_cast<const char*>(send);
  if ((send == recv && c->rank >= 2) || (send != recv && overlaps(send, recv, bytes))) {
    if (c->scratch.size() < bytes) c->scratch.resize(bytes);
    std::memcpy(c->scratch.data(), send, bytes);
    own = c->scratch.data();
  }
  auto input = [&](int32_t r) -> const void* { return r == c->rank ? own : inbox_of(c, r) + sizeof(Header); };
  fn(recv, input(0), input(1), count);
  for (int32_t r = 2; r < c->size; ++r) fn(recv, recv, input(r), count);
}

void futex_wait(uint32_t* addr, uint32_t expected, long ns) {
  const timespec ts{0, ns};
  ::syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, nullptr, 0);  // not private: the ranks are processes
}
void futex_wake_all(uint32_t* addr) { ::syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Step 2 of the shared-memory all-reduce: waits until peer p has published all-reduce k. nullptr when it has, with
// *diverged set when a message of the peer waits on the mesh instead (it took another path for this call); else
// UNAVAILABLE (the peer is gone) or DEADLINE_EXCEEDED, naming it.
keel_status_t shm_wait(Comm* c, const char* what, int32_t p, uint32_t k, Clock::time_point deadline, bool* diverged) {
  std::atomic_ref<uint32_t> seq(shm_ctl(c, p)->seq), waiting(shm_ctl(c, c->rank)->waiting);
  const auto spin_end = Clock::now() + kShmSpin;
  while (shm_before(seq.load(std::memory_order_acquire), k)) {
    if (Clock::now() < spin_end) {
      cpu_relax();
      continue;
    }
    char byte;
    const ssize_t n = ::recv(c->links[p].fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    const int recv_errno = errno;
    const bool ended = ::kill(static_cast<pid_t>(c->pids[static_cast<size_t>(p)]), 0) != 0 && errno == ESRCH;
    // A peer publishes k before anything it does after this call (its next collective's message on the mesh, its
    // end), so whatever those checks saw, a peer whose seq reached k meanwhile is done with this call: fine. (Without
    // this second look, a peer that published k, finished and sent its next header between the loop's test and the
    // peek looked like one that took another path: random scripts, seed 5065.)
    if (!shm_before(seq.load(std::memory_order_acquire), k)) break;
    if (n > 0) {
      *diverged = true;
      return nullptr;
    }
    if (n == 0) return mesh_closed(c, what, p, "end of stream");
    if (recv_errno != EAGAIN && recv_errno != EWOULDBLOCK && recv_errno != EINTR)
      return mesh_closed(c, what, p, errno_text(recv_errno));
    if (ended) return mesh_closed(c, what, p, "its process is gone");
    if (Clock::now() >= deadline) return mesh_timed_out(c, what, p);
    waiting.store(1);  // sequentially consistent: the peer's publish sees the flag, or the load below sees its seq
    const uint32_t v = seq.load();
    if (shm_before(v, k)) futex_wait(&shm_ctl(c, p)->seq, v, 1000000);
    waiting.store(0);
  }
  return nullptr;
}

// Steps 1-3 of the shared-memory all-reduce for this rank's call `h`: every rank's input through the segment, reduced
// in rank order into recv (which may be send), divided by the world size when `avg_dtype` is not UNDEFINED. When a peer
// took another path for the call, this rank takes its seq back and joins the header exchange, which reports how the
// calls differ.
keel_status_t shm_all_reduce(Comm* c, const Header& h, const void* send, void* recv, size_t bytes, size_t count,
                             ReduceFn fn, int32_t avg_dtype) {
  const char* what = "all_reduce";
  const uint32_t k = ++c->shm_calls;
  ShmCtl* me = shm_ctl(c, c->rank);
  me->header[k % 2] = h;
  std::memcpy(shm_slot(c, k, c->rank), send, bytes);
  std::atomic_ref<uint32_t>(me->seq).store(k);
  for (int32_t p = 0; p < c->size; ++p) {
    if (p != c->rank && std::atomic_ref<uint32_t>(shm_ctl(c, p)->waiting).load()) {
      futex_wake_all(&me->seq);
      break;
    }
  }
  const auto deadline = Clock::now() + c->timeout;
  for (int32_t p = 0; p < c->size; ++p) {
    if (p == c->rank) continue;
    bool diverged = false;
    if (keel_status_t s = shm_wait(c, what, p, k, deadline, &diverged)) return s;
    if (diverged) {
      std::atomic_ref<uint32_t>(me->seq).store(k - 1);
      c->shm_calls = k - 1;
      if (keel_status_t s = exchange_headers(c, h, "", nullptr, 0, true)) return s;
      return mesh_failure(c, what, KEEL_STATUS_INTERNAL,
                          "rank " + std::to_string(p) + " took another all-reduce path for the same call");
    }
  }
  for (int32_t p = 0; p < c->size; ++p)
    if (p != c->rank)
      if (keel_status_t s = disagreement(c, h, p, shm_ctl(c, p)->header[k % 2])) return s;
  // In pieces that stay in L1, each divided by the world size right after its sum for an average (each element once,
  // after its whole sum: the bits of dividing afterwards, without a second pass).
  const size_t esize = bytes / count, piece = std::max<size_t>(1, (size_t{16} << 10) / esize);
  char* out = static_cast<char*>(recv);
  for (size_t off = 0; off < count; off += piece) {
    const size_t m = std::min(piece, count - off), at = off * esize;
    fn(out + at, shm_slot(c, k, 0) + at, shm_slot(c, k, 1) + at, m);
    for (int32_t r = 2; r < c->size; ++r) fn(out + at, out + at, shm_slot(c, k, r) + at, m);
    if (avg_dtype != KEEL_DTYPE_UNDEFINED) divide_by(out + at, m, avg_dtype, c->size);
  }
  return nullptr;
}

keel_status_t c_all_reduce(void*, keel_communicator_t comm, const void* send, void* recv, uint64_t count, int32_t dtype,
                           int32_t op, keel_stream_t) {
  KEEL_GLOO_PROLOGUE("all_reduce");
  size_t bytes = 0;
  std::string bad = check_args("all_reduce", dtype, count, 1, send, recv, &bytes);
  const ReduceFn fn = reduce_fn(dtype, op);
  if (bad.empty() && !fn) bad = "gloo: all_reduce: " + op_name(op) + " on " + dtype_name(dtype) + " is not supported";
  // The header carries the algorithm (in root): ranks configured differently fail instead of mismatching messages.
  const Algorithm algo = allreduce_algorithm(c, bytes);
  const Header h{kAllReduce, static_cast<int64_t>(count), dtype, op, algo, bad.empty() ? 0 : 1};
  const uint32_t tag = c->tag++;
  return guarded(c, "all_reduce", algo == kAlgoBcube || algo == kAlgoRing, [&](int32_t*) -> keel_status_t {
    if (c->size > 1 && count > 0 && bad.empty() && algo == kAlgoSharedMemory) {
      return shm_all_reduce(c, h, send, recv, bytes, static_cast<size_t>(count), fn,
                            op == KEEL_REDUCE_AVG ? dtype : static_cast<int32_t>(KEEL_DTYPE_UNDEFINED));
    }
    const bool direct = c->size > 1 && count > 0 && bad.empty() && algo == kAlgoDirect;
    const bool cross = c->size > 1 && count > 0 && bad.empty() && algo == kAlgoCrossMemory;
    // A cross-memory all-reduce reads the peers' inputs where they are; one whose output partly overlaps its input
    // moves the input into the output first (then in place).
    if (cross && send != recv && overlaps(send, recv, bytes)) {
      std::memmove(recv, send, bytes);
      send = recv;
    }
    // What travels in this rank's header message: a direct all-reduce's input, or a cross-memory one's addresses.
    const CrossMemoryAddresses mine{reinterpret_cast<uintptr_t>(send), reinterpret_cast<uintptr_t>(recv)};
    const void* payload = direct ? send : cross ? static_cast<const void*>(&mine) : nullptr;
    const size_t payload_bytes = direct ? bytes : cross ? sizeof mine : 0;
    if (keel_status_t s = exchange_headers(c, h, bad, payload, payload_bytes)) return s;
    if (count == 0) return nullptr;
    if (direct) {
      direct_all_reduce(c, send, recv, bytes, static_cast<size_t>(count), fn);
    } else if (cross) {
      if (keel_status_t st = cross_memory_all_reduce(
              c, static_cast<const char*>(send), static_cast<char*>(recv), static_cast<size_t>(count),
              element_size(dtype), fn, op == KEEL_REDUCE_AVG ? dtype : static_cast<int32_t>(KEEL_DTYPE_UNDEFINED)))
        return st;
    } else if (algo == kAlgoMeshRing && c->size > 1) {
      if (send != recv) std::memmove(recv, send, bytes);
      if (keel_status_t st =
              mesh_ring_all_reduce(c, static_cast<char*>(recv), static_cast<size_t>(count), element_size(dtype), fn))
        return st;
    } else {
      if (send != recv) {
        if (c->size == 1 || overlaps(send, recv, bytes)) std::memmove(recv, send, bytes);
      }
      if (c->size > 1) {
        gloo::AllreduceOptions opts(c->ctx);
        opts.setAlgorithm(algo == kAlgoRing ? gloo::AllreduceOptions::Algorithm::RING
                                            : gloo::AllreduceOptions::Algorithm::BCUBE);
        opts.setTag(tag);
        opts.setTimeout(c->timeout);
        const bool in_place = send == recv || overlaps(send, recv, bytes);
        with_element_type(element_size(dtype), [&](auto t) {
          using T = decltype(t);
          if (!in_place) opts.setInput(static_cast<T*>(const_cast<void*>(send)), static_cast<size_t>(count));
          opts.setOutput(static_cast<T*>(recv), static_cast<size_t>(count));
        });
        opts.setReduceFunction(fn);
        gloo::allreduce(opts);
      }
    }
    // (The cross-memory all-reduce averaged each piece as it reduced it.)
    if (op == KEEL_REDUCE_AVG && c->size > 1 && !cross) divide_by(recv, static_cast<size_t>(count), dtype, c->size);
    return nullptr;
  });
}

keel_status_t c_broadcast(void*, keel_communicator_t comm, const void* send, void* recv, uint64_t count, int32_t dtype,
                          int32_t root, keel_stream_t) {
  KEEL_GLOO_PROLOGUE("broadcast");
  size_t bytes = 0;
  const bool is_root = root == c->rank;
  std::string bad = check_args("broadcast", dtype, count, 1, is_root ? send : recv, recv, &bytes);
  if (bad.empty() && (root < 0 || root >= c->size))
    bad = "gloo: broadcast: root " + std::to_string(root) + " is not a rank of " + std::to_string(c->size);
  const Header h{kBroadcast, static_cast<int64_t>(count), dtype, 0, root, bad.empty() ? 0 : 1};
  const uint32_t tag = c->tag++;
  return guarded(c, "broadcast", [&](int32_t*) -> keel_status_t {
    // Up to the direct capacity the data travel in the root's header message on the message mesh (as a direct
    // all-reduce's inputs do): one message each way instead of the header exchange and then Gloo's tree through its
    // loop thread.
    const bool direct = c->size > 1 && count > 0 && bad.empty() && bytes <= inline_capacity(c->size);
    if (keel_status_t s =
            exchange_headers(c, h, bad, direct && is_root ? send : nullptr, direct && is_root ? bytes : 0, direct))
      return s;
    if (count == 0) return nullptr;
    if (direct && !is_root) {
      if (c->links[root].frame[1] != sizeof(Header) + bytes)
        return mesh_failure(c, "broadcast", KEEL_STATUS_INTERNAL,
                            "rank " + std::to_string(root) + " sent " + std::to_string(c->links[root].frame[1]) +
                                " bytes, not the header and " + std::to_string(bytes) + " bytes of data");
      std::memcpy(recv, inbox_of(c, root) + sizeof(Header), bytes);
      return nullptr;
    }
    if (is_root && send != recv) std::memmove(recv, send, bytes);  // then broadcast in place
    if (c->size == 1 || direct) return nullptr;
    gloo::BroadcastOptions opts(c->ctx);
    opts.setRoot(root);
    opts.setTag(tag);
    opts.setTimeout(c->timeout);
    with_element_type(element_size(dtype), [&](auto t) {
      using T = decltype(t);
      opts.setOutput(static_cast<T*>(recv), static_cast<size_t>(count));
    });
    gloo::broadcast(opts);
    return nullptr;
  });
}

keel_status_t c_all_gather(void*, keel_communicator_t comm, const void* send, void* recv, uint64_t send_count,
                           int32_t dtype, keel_stream_t) {
  KEEL_GLOO_PROLOGUE("all_gather");
  size_t bytes = 0;
  std::string bad = check_args("all_gather", dtype, send_count, static_cast<uint64_t>(c->size), send, recv, &bytes);
  const Header h{kAllGather, static_cast<int64_t>(send_count), dtype, 0, 0, bad.empty() ? 0 : 1};
  const uint32_t tag = c->tag++;
  return guarded(c, "all_gather", [&](int32_t*) -> keel_status_t {
    if (keel_status_t s = exchange_headers(c, h, bad)) return s;
    if (send_count == 0) return nullptr;
    char* mine = static_cast<char*>(recv) + static_cast<size_t>(c->rank) * bytes;
    if (send != mine) std::memmove(mine, send, bytes);  // then gather in place
    if (c->size == 1) return nullptr;
    gloo::AllgatherOptions opts(c->ctx);
    opts.setTag(tag);
    opts.setTimeout(c->timeout);
    with_element_type(element_size(dtype), [&](auto t) {
      using T = decltype(t);
      opts.setOutput(static_cast<T*>(recv), static_cast<size_t>(send_count) * static_cast<size_t>(c->size));
    });
    gloo::allgather(opts);
    return nullptr;
  });
}

keel_status_t c_reduce_scatter(void*, keel_communicator_t comm, const void* send, void* recv, uint64_t recv_count,
                               int32_t dtype, int32_t op, keel_stream_t) {
  KEEL_GLOO_PROLOGUE("reduce_scatter");
  size_t bytes = 0;
  std::string bad = check_args("reduce_scatter", dtype, recv_count, static_cast<uint64_t>(c->size), send, recv, &bytes);
  const ReduceFn fn = reduce_fn(dtype, op);
  if (bad.empty() && !fn)
    bad = "gloo: reduce_scatter: " + op_name(op) + " on " + dtype_name(dtype) + " is not supported";
  const Header h{kReduceScatter, static_cast<int64_t>(recv_count), dtype, op, 0, bad.empty() ? 0 : 1};
  const uint32_t tag = c->tag++;
  return guarded(c, "reduce_scatter", [&](int32_t*) -> keel_status_t {
    if (keel_status_t s = exchange_headers(c, h, bad)) return s;
    if (recv_count == 0) return nullptr;
    const char* in = static_cast<const char*>(send);
    const size_t n = static_cast<size_t>(recv_count);
    if (c->size > 1) {
      // Each rank sends block p of its input to rank p and reduces the blocks it receives into its own.
      const size_t peers = static_cast<size_t>(c->size - 1);
      if (c->scratch.size() < peers * bytes) c->scratch.resize(peers * bytes);
      const auto slot = gloo::Slot::build(kReduceScatterSlot, tag);
      auto out_buf = c->ctx->createUnboundBuffer(const_cast<char*>(in), bytes * static_cast<size_t>(c->size));
      auto in_buf = c->ctx->createUnboundBuffer(c->scratch.data(), peers * bytes);
      std::vector<int32_t> order;
      for (int32_t k = 1; k < c->size; ++k) order.push_back((c->rank + k) % c->size);
      for (size_t k = 0; k < order.size(); ++k) {
        const int32_t p = order[k];
        in_buf->recv(p, slot, k * bytes, bytes);
        out_buf->send(p, slot, static_cast<size_t>(p) * bytes, bytes);
      }
      for (size_t k = 0; k < order.size(); ++k) in_buf->waitRecv(nullptr, c->timeout);
      for (size_t k = 0; k < order.size(); ++k) out_buf->waitSend(nullptr, c->timeout);
      // Every send is done: recv may now be written even where it overlaps send.
      const char* own = in + static_cast<size_t>(c->rank) * bytes;
      if (own != recv) std::memmove(recv, own, bytes);
      for (size_t k = 0; k < order.size(); ++k) fn(recv, recv, c->scratch.data() + k * bytes, n);
      if (op == KEEL_REDUCE_AVG) divide_by(recv, n, dtype, c->size);
    } else if (in != recv) {
      std::memmove(recv, in, bytes);
    }
    return nullptr;
  });
}

// send/recv: the sender sends a header (count, dtype) and waits for the receiver's acknowledgement (its own count,
// dtype and whether they match) before the data, so that a mismatch is an error on both sides, never a stray
// message. Messages between two ranks are matched in order.
keel_status_t point_to_point(Comm* c, bool sending, void* buf, uint64_t count, int32_t dtype, int32_t peer) {
  const char* what = sending ? "send" : "recv";
  size_t bytes = 0;
  std::string bad = check_args(what, dtype, count, 1, buf, buf, &bytes);
  if (!bad.empty()) return make_status(KEEL_STATUS_INVALID_ARGUMENT, bad);
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return make_status(KEEL_STATUS_INVALID_ARGUMENT, std::string("gloo: ") + what + ": peer " + std::to_string(peer) +
                                                         " is not another rank of " + std::to_string(c->size));
  const uint32_t seq = sending ? c->sent[peer]++ : c->received[peer]++;
  return guarded(c, what, [&](int32_t* waited_on) -> keel_status_t {
    *waited_on = peer;
    Header mine{kSendRecv, static_cast<int64_t>(count), dtype, 0, 0, 0}, other;
    auto mine_buf = c->ctx->createUnboundBuffer(&mine, sizeof mine);
    auto other_buf = c->ctx->createUnboundBuffer(&other, sizeof other);
    const auto header_slot = gloo::Slot::build(kP2pHeaderSlot, seq), ack_slot = gloo::Slot::build(kP2pAckSlot, seq),
               data_slot = gloo::Slot::build(kP2pDataSlot, seq);
    if (sending) {
      mine_buf->send(peer, header_slot);
      other_buf->recv(peer, ack_slot);
      mine_buf->waitSend(nullptr, c->timeout);
      other_buf->waitRecv(nullptr, c->timeout);
    } else {
      other_buf->recv(peer, header_slot);
      other_buf->waitRecv(nullptr, c->timeout);
      mine.bad = same_call(mine, other) ? 0 : 1;
      mine_buf->send(peer, ack_slot);
      mine_buf->waitSend(nullptr, c->timeout);
    }
    if (!same_call(mine, other))
      return make_status(KEEL_STATUS_INVALID_ARGUMENT,
                         std::string("gloo: ") + what + ": rank " + std::to_string(c->rank) + " " +
                             (sending ? "sends" : "receives") + " count " + std::to_string(count) + " dtype " +
                             dtype_name(dtype) + " but rank " + std::to_string(peer) + " " +
                             (sending ? "receives" : "sends") + " count " + std::to_string(other.count) + " dtype " +
                             dtype_name(other.dtype) + "; nothing was transferred");
    if (count == 0) return nullptr;
    auto data = c->ctx->createUnboundBuffer(buf, bytes);
    if (sending) {
      data->send(peer, data_slot);
      data->waitSend(nullptr, c->timeout);
    } else {
      data->recv(peer, data_slot);
      data->waitRecv(nullptr, c->timeout);
    }
    return nullptr;
  });
}

keel_status_t c_send(void*, keel_communicator_t comm, const void* buf, uint64_t count, int32_t dtype, int32_t peer,
                     keel_stream_t) {
  KEEL_GLOO_PROLOGUE("send");
  return point_to_point(c, true, const_cast<void*>(buf), count, dtype, peer);
}
keel_status_t c_recv(void*, keel_communicator_t comm, void* buf, uint64_t count, int32_t dtype, int32_t peer,
                     keel_stream_t) {
  KEEL_GLOO_PROLOGUE("recv");
  return point_to_point(c, false, buf, count, dtype, peer);
}

keel_status_t c_barrier(void*, keel_communicator_t comm, keel_stream_t) {
  KEEL_GLOO_PROLOGUE("barrier");
  const Header h{kBarrier, 0, 0, 0, 0, 0};
  ++c->tag;
  return guarded(c, "barrier", /*through_gloo=*/false, [&](int32_t*) { return exchange_headers(c, h, ""); });
}

// ---------------------------------------------------------------------------------------------------------------
// Plugin entry.

std::string option_string(const keel_core_api_t* host, const char* key, const char* env) {
  if (const char* v = std::getenv(env); v && *v) return v;
  const char* v = nullptr;
  if (host->options && host->plugin_options && host->options->get_string(host->plugin_options, key, &v) && v) return v;
  return "";
}

// An option that is "auto" (or unset: *on = true) or "off"; anything else is an error naming it.
keel_status_t auto_or_off(const keel_core_api_t* host, const char* key, const char* env, bool* on) {
  const std::string v = option_string(host, key, env);
  if (!v.empty() && v != "auto" && v != "off")
    return make_status(
        KEEL_STATUS_INVALID_ARGUMENT,
        std::string("gloo: ") + key + " '" + v + "' is not auto or off (manifest option '" + key + "' or " + env + ")");
  *on = v != "off";
  return nullptr;
}

// Reads an environment's settings; an error names the option and where it can be set.
keel_status_t read_settings(const keel_core_api_t* host, Settings* out) {
  Settings st;
  if (std::string v = option_string(host, "hostname", "KEEL_GLOO_HOSTNAME"); !v.empty()) st.hostname = v;
  st.iface = option_string(host, "iface", "KEEL_GLOO_IFACE");
  std::string algorithm = option_string(host, "algorithm", "KEEL_GLOO_ALGORITHM");
  if (algorithm == "auto") algorithm.clear();
  if (!algorithm.empty() && algorithm != "ring" && algorithm != "bcube" && algorithm != "direct" &&
      algorithm != "mesh-ring" && algorithm != "cross-memory") {
    return make_status(KEEL_STATUS_INVALID_ARGUMENT,
                       "gloo: algorithm '" + algorithm +
                           "' is not one of auto, direct, mesh-ring, cross-memory, ring, bcube (manifest option "
                           "'algorithm' or KEEL_GLOO_ALGORITHM)");
  }
  st.algorithm = algorithm;
  if (keel_status_t s = auto_or_off(host, "cross_memory", "KEEL_GLOO_CROSS_MEMORY", &st.cross_memory)) return s;
  if (keel_status_t s = auto_or_off(host, "shared_memory", "KEEL_GLOO_SHARED_MEMORY", &st.shared_memory)) return s;
  if (const char* v = std::getenv("KEEL_GLOO_CHECK"); v && std::string(v) == "0") st.check = false;
  if (const char* v = std::getenv("KEEL_GLOO_SOCKET_BUFFER"); v && std::string(v) == "0")
    st.size_socket_buffers = false;
  *out = std::move(st);
  return nullptr;
}

// One call per environment that loads the plugin: its own settings and table (user_data: the settings).
keel_status_t gloo_init_instance(const keel_core_api_t* host, keel_plugin_handle_t* plugin, void** out_instance) {
  if (!KEEL_HAS_MEMBER(host, keel_core_api_t, register_collective)) return nullptr;  // a core without collectives
  g_status_create.store(host->status_create, std::memory_order_release);
  auto inst = std::make_unique<Settings>();
  if (keel_status_t s = read_settings(host, inst.get())) return s;
  const Settings& st = *inst;

  keel_collective_table_t t;
  std::memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  t.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  t.backend = "gloo";
  t.device_type = "cpu";
  t.user_data = inst.get();
  t.communicator_create = c_create;
  t.communicator_release = c_release;
  t.rank = c_rank;
  t.size = c_size;
  t.all_reduce = c_all_reduce;
  t.broadcast = c_broadcast;
  t.all_gather = c_all_gather;
  t.reduce_scatter = c_reduce_scatter;
  t.send = c_send;
  t.recv = c_recv;
  t.barrier = c_barrier;
  if (keel_status_t s = host->register_collective(plugin, &t)) return s;
  const std::string msg =
      "gloo: TCP over " + (st.iface.empty() ? "address " + st.hostname : "interface " + st.iface) + ", all-reduce " +
      (st.algorithm.empty() ? "auto (between the processes of one host shared memory up to 512 KiB and cross memory "
                              "above; else direct up to 1 MiB / (ranks-1), then mesh-ring)"
                            : st.algorithm) +
      (st.cross_memory ? "" : ", cross memory off") + (st.shared_memory ? "" : ", shared memory off") +
      (st.check ? "" : ", argument check off (KEEL_GLOO_CHECK=0)");
  host->log(plugin, KEEL_LOG_INFO, msg.c_str());
  *out_instance = inst.release();
  return nullptr;
}

// An environment's communicators are released before it (as its sessions: they call through its registry).
void gloo_shutdown_instance(void* instance) { delete static_cast<Settings*>(instance); }

const keel_plugin_t kGlooPlugin = {.struct_size = sizeof(keel_plugin_t),
                                   .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                   .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                                   .name = "gloo",
                                   .version = "0.1.0",
                                   .kind = KEEL_PLUGIN_KIND_COLLECTIVE,
                                   .init = nullptr,
                                   .shutdown = nullptr,
                                   .init_instance = gloo_init_instance,
                                   .shutdown_instance = gloo_shutdown_instance};

}  // namespace

extern "C" KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &kGlooPlugin; }
