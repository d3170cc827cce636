// plugins/nccl/nccl_plugin.cc — the NCCL collective plugin: communicators for the "cuda" device type.
//
// Built against <keel/plugin.h> only, the CUDA runtime and NCCL. Rendezvous goes through the core's key-value
// store: every rank first announces itself ("<prefix>/arrived/<rank>") and waits, within the timeout, for every
// other rank, so a peer that never comes is named (DEADLINE_EXCEEDED "rank 3 of 4 never arrived"); rank 0 then
// publishes its ncclUniqueId ("<prefix>/id"), which the others read. ncclCommInitRankConfig runs non-blocking and is
// polled against the same deadline (aborted, not hung on, when it runs out). Every data entry is stream-ordered on
// the given cudaStream_t (NULL = the legacy default stream). The barrier is an all-reduce of one float.
// Every entry that NCCL answers with ncclInProgress (the communicator is non-blocking) is polled against the
// communicator's timeout: past it the communicator is aborted and the entry returns DEADLINE_EXCEEDED; later
// entries on it return FAILED_PRECONDITION. timeout_ms <= 0 means the default, 5 minutes.
// A queued collective whose peer died never completes on the device, and NCCL reports the failure only
// asynchronously: every host wait behind it would hang. So each communicator has a watchdog thread (as torch's
// ProcessGroupNCCL): every 100 ms it asks ncclCommGetAsyncError and whether the last queued collective has completed
// (an event recorded after it); an error, or a collective still running timeout_ms after it was queued, aborts the
// communicator (its kernels end, so the streams behind them go on) and logs why; the next entry returns that reason
// (FAILED_PRECONDITION), so a data-parallel step fails naming it instead of hanging.
// send/recv are separate NCCL calls (the ABI has no group): a pair of ranks must order them (one sends first,
// the other receives first), as with blocking point-to-point messages; small messages complete eagerly anyway.
// Without a driver or a GPU, init returns UNAVAILABLE: `keel plugins` shows the plugin as skipped with the reason.
#include <cuda_runtime.h>
#include <keel/plugin.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

namespace {

// Atomic: each environment's init stores its table while other environments' communicators make statuses with it
// (status_create is the same function in every table).
std::atomic<const keel_core_api_t*> g_host{nullptr};

keel_status_t make_status(int32_t code, const std::string& m) {
  return g_host.load(std::memory_order_acquire)->status_create(code, m.c_str());
}

constexpr int64_t kDefaultTimeoutMs = 5 * 60 * 1000;

struct Comm {
  ncclComm_t comm = nullptr;
  int32_t rank = 0, size = 0, device = 0;
  int64_t timeout_ms = kDefaultTimeoutMs;
  float* scratch = nullptr;                // one float for the barrier
  keel_plugin_handle_t* plugin = nullptr;  // the environment's handle (the table's user_data), for the log
  // Guarded by mu (the entries hold it while they call NCCL; the watchdog while it checks and aborts):
  std::mutex mu;
  bool aborted = false;  // by a timed-out entry or the watchdog; `reason` says why
  std::string reason;
  cudaEvent_t last = nullptr;  // recorded after every queued collective
  bool pending = false;        // `last` not yet seen complete
  std::chrono::steady_clock::time_point queued_at;
  bool stop = false;
  std::condition_variable wake;
  std::thread watchdog;
};

// Aborts `c` (under c->mu) for `why`: its queued kernels end; later entries return FAILED_PRECONDITION with it.
void abort_comm(Comm* c, const std::string& why) {
  if (c->comm) ncclCommAbort(c->comm);
  c->comm = nullptr;
  c->aborted = true;
  c->pending = false;
  c->reason = why;
}

keel_status_t nccl_error(ncclResult_t r, ncclComm_t comm, const char* what) {
  if (r == ncclSuccess) return nullptr;
  std::string msg = std::string("nccl: ") + what + ": " + ncclGetErrorString(r);
  if (comm) {
    if (const char* last = ncclGetLastError(comm); last && *last) msg += std::string(" (") + last + ")";
  }
  const int32_t code = r == ncclInvalidArgument || r == ncclInvalidUsage ? KEEL_STATUS_INVALID_ARGUMENT
                       : r == ncclRemoteError || r == ncclSystemError    ? KEEL_STATUS_UNAVAILABLE
                                                                         : KEEL_STATUS_INTERNAL;
  return make_status(code, msg);
}

// The communicator is non-blocking: an entry may return ncclInProgress; wait for the real result, up to
// timeout_ms (then *timed_out is set and ncclInProgress returned).
ncclResult_t settle(ncclComm_t comm, ncclResult_t r, int64_t timeout_ms, bool* timed_out = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  if (timed_out) *timed_out = false;
  for (int spins = 0; r == ncclInProgress; ++spins) {
    if (spins < 1000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
    if (r == ncclInProgress && std::chrono::steady_clock::now() >= deadline) {
      if (timed_out) *timed_out = true;
      break;
    }
  }
  return r;
}

// The result of an entry on `c`: settled within the communicator's timeout; a timeout aborts the communicator.
keel_status_t finish(struct Comm* c, ncclResult_t r, const char* what, cudaStream_t stream) {
  bool timed_out = false;
  r = settle(c->comm, r, c->timeout_ms, &timed_out);
  if (timed_out) {
    const std::string m = std::string("nccl: ") + what + " of rank " + std::to_string(c->rank) +
                          " did not complete within " + std::to_string(c->timeout_ms) +
                          " ms (a peer is gone?): the communicator was aborted";
    abort_comm(c, m);
    return make_status(KEEL_STATUS_DEADLINE_EXCEEDED, m);
  }
  if (r == ncclSuccess && c->last) {  // queued: the watchdog follows it
    if (cudaEventRecord(c->last, stream) == cudaSuccess) {
      c->pending = true;
      c->queued_at = std::chrono::steady_clock::now();
    } else {
      (void)cudaGetLastError();
    }
  }
  return nccl_error(r, c->comm, what);
}

// The watchdog (above): runs until c->stop.
void watch(Comm* c) {
  cudaSetDevice(c->device);
  std::unique_lock<std::mutex> lock(c->mu);
  while (!c->stop) {
    c->wake.wait_for(lock, std::chrono::milliseconds(100));
    if (c->stop || c->aborted || c->comm == nullptr) continue;
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(c->comm, &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress) {
      std::string m = std::string("nccl: rank ") + std::to_string(c->rank) + " of " + std::to_string(c->size) +
                      ": the communicator failed: " + ncclGetErrorString(r);
      if (const char* last = ncclGetLastError(c->comm); last && *last) m += std::string(" (") + last + ")";
      abort_comm(c, m + "; it was aborted");
    } else if (c->pending) {
      const cudaError_t q = cudaEventQuery(c->last);
      if (q == cudaSuccess) {
        c->pending = false;
      } else if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        c->pending = false;  // the stream's own error reaches its next synchronisation
      } else if (std::chrono::steady_clock::now() - c->queued_at > std::chrono::milliseconds(c->timeout_ms)) {
        abort_comm(c, "nccl: rank " + std::to_string(c->rank) + " of " + std::to_string(c->size) +
                          ": a collective queued " + std::to_string(c->timeout_ms) +
                          " ms ago has not completed (a peer is gone or stuck?); the communicator was aborted");
      }
    }
    if (c->aborted && c->plugin)
      g_host.load(std::memory_order_acquire)->log(c->plugin, KEEL_LOG_ERROR, c->reason.c_str());
  }
}

bool to_nccl_type(int32_t dtype, ncclDataType_t* out) {
  switch (dtype) {
    case KEEL_DTYPE_F32: *out = ncclFloat32; return true;
    case KEEL_DTYPE_F16: *out = ncclFloat16; return true;
    case KEEL_DTYPE_BF16: *out = ncclBfloat16; return true;
    case KEEL_DTYPE_F64: *out = ncclFloat64; return true;
    case KEEL_DTYPE_I8: *out = ncclInt8; return true;
    case KEEL_DTYPE_U8:
    case KEEL_DTYPE_BOOL: *out = ncclUint8; return true;
    case KEEL_DTYPE_I32: *out = ncclInt32; return true;
    case KEEL_DTYPE_U32: *out = ncclUint32; return true;
    case KEEL_DTYPE_I64: *out = ncclInt64; return true;
    case KEEL_DTYPE_U64: *out = ncclUint64; return true;
  }
  return false;
}
// Bools travel as uint8 (ncclUint8): MIN and MAX are their logical and / or; a sum, product or average would give
// values other than 0 and 1, so those are refused for bools. An error names the op.
keel_status_t to_nccl_op(int32_t op, int32_t dtype, ncclRedOp_t* out) {
  if (dtype == KEEL_DTYPE_BOOL && op != KEEL_REDUCE_MIN && op != KEEL_REDUCE_MAX)
    return make_status(KEEL_STATUS_INVALID_ARGUMENT,
                       "nccl: reduce op " + std::to_string(op) + " on bools (min or max only)");
  switch (op) {
    case KEEL_REDUCE_SUM: *out = ncclSum; return nullptr;
    case KEEL_REDUCE_PROD: *out = ncclProd; return nullptr;
    case KEEL_REDUCE_MIN: *out = ncclMin; return nullptr;
    case KEEL_REDUCE_MAX: *out = ncclMax; return nullptr;
    case KEEL_REDUCE_AVG: *out = ncclAvg; return nullptr;
  }
  return make_status(KEEL_STATUS_INVALID_ARGUMENT, "nccl: unknown reduce op " + std::to_string(op));
}

std::string no_device_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device: cudaGetDeviceCount returned ") + cudaGetErrorName(e) + " (" +
           cudaGetErrorString(e) + ")";
  }
  if (n <= 0) return "no CUDA device: cudaGetDeviceCount found 0 devices";
  return "";
}

keel_status_t c_create(void* user_data, keel_kv_store_t* store, int32_t rank, int32_t size, int32_t device,
                       int64_t timeout_ms, keel_communicator_t* out) {
  *out = nullptr;
  if (size < 1 || rank < 0 || rank >= size)
    return make_status(KEEL_STATUS_INVALID_ARGUMENT,
                       "nccl: rank " + std::to_string(rank) + " / size " + std::to_string(size) + " out of range");
  if (size > 1 && (store == nullptr || store->set == nullptr || store->get == nullptr))
    return make_status(KEEL_STATUS_INVALID_ARGUMENT, "nccl: a key-value store is required for more than one rank");
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    (void)cudaGetLastError();
    return make_status(KEEL_STATUS_INVALID_ARGUMENT,
                       "nccl: cudaSetDevice(" + std::to_string(device) + "): " + cudaGetErrorString(e));
  }
  if (timeout_ms <= 0) timeout_ms = kDefaultTimeoutMs;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto left_ms = [&] {
    auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return d.count() > 0 ? static_cast<int64_t>(d.count()) : int64_t{0};
  };
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (size > 1) {
    // This rank's generation on this store: the first g under which it has not announced itself yet (as the gloo
    // plugin does). Not a counter of this process: ranks that are threads of one process (an in-process store) would
    // each take another number, and a process that made a communicator its peers did not would be out of step.
    std::string prefix;
    for (int64_t g = 0;; ++g) {
      prefix = "keel/nccl/" + std::to_string(g);
      const std::string key = prefix + "/arrived/" + std::to_string(rank);
      const void* v = nullptr;
      size_t n = 0;
      keel_status_t s = store->get(store, key.c_str(), 0, &v, &n);
      if (!s) continue;
      const int32_t code = s->code;
      std::string m = s->message ? s->message : "";
      keel_status_release(s);
      if (code == KEEL_STATUS_DEADLINE_EXCEEDED || code == KEEL_STATUS_NOT_FOUND) break;
      return make_status(code, "nccl: rendezvous: store get '" + key + "': " + m);
    }
    const char one = 1;
    if (keel_status_t s = store->set(store, (prefix + "/arrived/" + std::to_string(rank)).c_str(), &one, 1)) return s;
    for (int32_t peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      const void* v = nullptr;
      size_t n = 0;
      keel_status_t s = store->get(store, (prefix + "/arrived/" + std::to_string(peer)).c_str(), left_ms(), &v, &n);
      if (s) {
        const int32_t code = s->code;
        std::string m = s->message ? s->message : "";
        keel_status_release(s);
        if (code == KEEL_STATUS_DEADLINE_EXCEEDED)
          return make_status(KEEL_STATUS_DEADLINE_EXCEEDED, "nccl: rank " + std::to_string(peer) + " of " +
                                                                std::to_string(size) + " never arrived within " +
                                                                std::to_string(timeout_ms) + " ms (rank " +
                                                                std::to_string(rank) + " waited on key " + prefix +
                                                                "/arrived/" + std::to_string(peer) + ")");
        return make_status(code, "nccl: rendezvous with rank " + std::to_string(peer) + ": " + m);
      }
    }
    if (rank == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) return nccl_error(r, nullptr, "ncclGetUniqueId");
      if (keel_status_t s = store->set(store, (prefix + "/id").c_str(), &id, sizeof id)) return s;
    } else {
      const void* v = nullptr;
      size_t n = 0;
      keel_status_t s = store->get(store, (prefix + "/id").c_str(), left_ms(), &v, &n);
      if (s) {
        const int32_t code = s->code;
        keel_status_release(s);
        return make_status(code, "nccl: rank " + std::to_string(rank) + " did not get rank 0's unique id (key " +
                                     prefix + "/id) within " + std::to_string(timeout_ms) + " ms: rank 0 is missing");
      }
      if (n != sizeof id) return make_status(KEEL_STATUS_INTERNAL, "nccl: unique id of the wrong size in the store");
      std::memcpy(&id, v, sizeof id);
    }
  } else if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return nccl_error(r, nullptr, "ncclGetUniqueId");
  }

  auto* c = new Comm;
  c->rank = rank;
  c->size = size;
  c->device = device;
  c->timeout_ms = timeout_ms;
  c->plugin = static_cast<keel_plugin_handle_t*>(user_data);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&c->comm, size, id, rank, &config);
  while (r == ncclInProgress || (r == ncclSuccess && c->comm == nullptr)) {
    if (c->comm == nullptr) break;
    if (ncclCommGetAsyncError(c->comm, &r) != ncclSuccess) break;
    if (r != ncclInProgress) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ncclCommAbort(c->comm);
      delete c;
      return make_status(KEEL_STATUS_DEADLINE_EXCEEDED,
                         "nccl: ncclCommInitRank of rank " + std::to_string(rank) + " of " + std::to_string(size) +
                             " did not finish within " + std::to_string(timeout_ms) + " ms (a peer stopped joining)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (r != ncclSuccess) {
    keel_status_t s = nccl_error(r, c->comm, "ncclCommInitRankConfig");
    if (c->comm) ncclCommAbort(c->comm);
    delete c;
    return s;
  }
  if (cudaError_t e = cudaMalloc(&c->scratch, sizeof(float)); e != cudaSuccess) {
    (void)cudaGetLastError();
    ncclCommAbort(c->comm);
    delete c;
    return make_status(KEEL_STATUS_OUT_OF_MEMORY, std::string("nccl: cudaMalloc: ") + cudaGetErrorString(e));
  }
  if (cudaError_t e = cudaMemset(c->scratch, 0, sizeof(float)); e != cudaSuccess) {
    (void)cudaGetLastError();
    cudaFree(c->scratch);
    ncclCommAbort(c->comm);
    delete c;
    return make_status(KEEL_STATUS_INTERNAL, std::string("nccl: cudaMemset: ") + cudaGetErrorString(e));
  }
  // The watchdog's event and thread (a communicator without them still works: its waits can hang on a lost peer).
  if (cudaEventCreateWithFlags(&c->last, cudaEventDisableTiming) != cudaSuccess) {
    (void)cudaGetLastError();
    c->last = nullptr;
  } else {
    try {
      c->watchdog = std::thread(watch, c);
    } catch (const std::system_error&) {
      cudaEventDestroy(c->last);
      c->last = nullptr;
    }
  }
  *out = reinterpret_cast<keel_communicator_t>(c);
  return nullptr;
}

void c_release(void*, keel_communicator_t comm) {
  auto* c = reinterpret_cast<Comm*>(comm);
  if (!c) return;
  if (c->watchdog.joinable()) {
    {
      std::lock_guard<std::mutex> lock(c->mu);
      c->stop = true;
    }
    c->wake.notify_all();
    c->watchdog.join();
  }
  if (c->last) cudaEventDestroy(c->last);
  cudaSetDevice(c->device);
  if (c->comm) {
    bool timed_out = false;
    const ncclResult_t r = settle(c->comm, ncclCommFinalize(c->comm), c->timeout_ms, &timed_out);
    if (r == ncclSuccess) ncclCommDestroy(c->comm);
    else ncclCommAbort(c->comm);  // a peer never finalised, or an error: do not hang in destroy
  }
  if (c->scratch) cudaFree(c->scratch);
  (void)cudaGetLastError();
  delete c;
}
int32_t c_rank(void*, keel_communicator_t comm) { return reinterpret_cast<Comm*>(comm)->rank; }
int32_t c_size(void*, keel_communicator_t comm) { return reinterpret_cast<Comm*>(comm)->size; }

#define KEEL_NCCL_PROLOGUE(dtype_var)                                                                           \
  auto* c = reinterpret_cast<Comm*>(comm);                                                                      \
  if (!c) return make_status(KEEL_STATUS_INVALID_ARGUMENT, "nccl: NULL communicator");                          \
  std::lock_guard<std::mutex> entry_lock(c->mu);                                                                \
  if (c->aborted) return make_status(KEEL_STATUS_FAILED_PRECONDITION, c->reason);                               \
  ncclDataType_t t;                                                                                             \
  if (!to_nccl_type(dtype_var, &t))                                                                             \
    return make_status(KEEL_STATUS_UNIMPLEMENTED, "nccl: dtype " + std::to_string(dtype_var) + " unsupported"); \
  if (cudaError_t e = cudaSetDevice(c->device); e != cudaSuccess) {                                             \
    (void)cudaGetLastError();                                                                                   \
    return make_status(KEEL_STATUS_INTERNAL, std::string("nccl: cudaSetDevice: ") + cudaGetErrorString(e));     \
  }                                                                                                             \
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream)

keel_status_t c_all_reduce(void*, keel_communicator_t comm, const void* send, void* recv, uint64_t count, int32_t dtype,
                           int32_t op, keel_stream_t stream) {
  KEEL_NCCL_PROLOGUE(dtype);
  ncclRedOp_t o;
  if (keel_status_t st = to_nccl_op(op, dtype, &o)) return st;
  return finish(c, ncclAllReduce(send, recv, count, t, o, c->comm, s), "ncclAllReduce", s);
}
keel_status_t c_broadcast(void*, keel_communicator_t comm, const void* send, void* recv, uint64_t count, int32_t dtype,
                          int32_t root, keel_stream_t stream) {
  KEEL_NCCL_PROLOGUE(dtype);
  return finish(c, ncclBroadcast(send, recv, count, t, root, c->comm, s), "ncclBroadcast", s);
}
keel_status_t c_all_gather(void*, keel_communicator_t comm, const void* send, void* recv, uint64_t send_count,
                           int32_t dtype, keel_stream_t stream) {
  KEEL_NCCL_PROLOGUE(dtype);
  return finish(c, ncclAllGather(send, recv, send_count, t, c->comm, s), "ncclAllGather", s);
}
keel_status_t c_reduce_scatter(void*, keel_communicator_t comm, const void* send, void* recv, uint64_t recv_count,
                               int32_t dtype, int32_t op, keel_stream_t stream) {
  KEEL_NCCL_PROLOGUE(dtype);
  ncclRedOp_t o;
  if (keel_status_t st = to_nccl_op(op, dtype, &o)) return st;
  return finish(c, ncclReduceScatter(send, recv, recv_count, t, o, c->comm, s), "ncclReduceScatter", s);
}
keel_status_t c_send(void*, keel_communicator_t comm, const void* buf, uint64_t count, int32_t dtype, int32_t peer,
                     keel_stream_t stream) {
  KEEL_NCCL_PROLOGUE(dtype);
  return finish(c, ncclSend(buf, count, t, peer, c->comm, s), "ncclSend", s);
}
keel_status_t c_recv(void*, keel_communicator_t comm, void* buf, uint64_t count, int32_t dtype, int32_t peer,
                     keel_stream_t stream) {
  KEEL_NCCL_PROLOGUE(dtype);
  return finish(c, ncclRecv(buf, count, t, peer, c->comm, s), "ncclRecv", s);
}
keel_status_t c_barrier(void*, keel_communicator_t comm, keel_stream_t stream) {
  KEEL_NCCL_PROLOGUE(KEEL_DTYPE_F32);
  return finish(c, ncclAllReduce(c->scratch, c->scratch, 1, t, ncclSum, c->comm, s), "barrier (ncclAllReduce)", s);
}

keel_status_t nccl_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  if (!KEEL_HAS_MEMBER(host, keel_core_api_t, register_collective)) return nullptr;
  g_host.store(host, std::memory_order_release);
  std::string why = no_device_reason();
  if (!why.empty()) return make_status(KEEL_STATUS_UNAVAILABLE, why);
  int version = 0;
  if (ncclResult_t r = ncclGetVersion(&version); r != ncclSuccess) {
    return make_status(KEEL_STATUS_UNAVAILABLE, std::string("nccl: ncclGetVersion: ") + ncclGetErrorString(r));
  }
  keel_collective_table_t t;
  std::memset(&t, 0, sizeof t);
  t.struct_size = sizeof t;
  t.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  t.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  t.backend = "nccl";
  t.device_type = "cuda";
  t.user_data = plugin;
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
  const std::string msg = "nccl: NCCL " + std::to_string(version) + " for the cuda device";
  host->log(plugin, KEEL_LOG_INFO, msg.c_str());
  return nullptr;
}

void nccl_shutdown() { g_host.store(nullptr, std::memory_order_release); }

const keel_plugin_t kNcclPlugin = {.struct_size = sizeof(keel_plugin_t),
                                   .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                   .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                                   .name = "nccl",
                                   .version = "0.1.0",
                                   .kind = KEEL_PLUGIN_KIND_COLLECTIVE,
                                   .init = nccl_init,
                                   .shutdown = nccl_shutdown,
                                   .init_instance = nullptr,
                                   .shutdown_instance = nullptr};

}  // namespace

extern "C" KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &kNcclPlugin; }
