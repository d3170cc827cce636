// The eager runtime: the process-wide state (environment, default device, generator, kernel cache statistics,
// profile) and the device helpers every piece uses (names, memory types, allocation, copies, device constants).
#include "core/runtime/eager_internal.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/base/log.h"
#include "hal/device.h"

namespace keel::eager {

Error::Error(Status s) : std::runtime_error(s.to_string()), status_(std::move(s)) {}

namespace detail {

void fail(Status s) { throw Error(std::move(s)); }

Runtime& rt() {
  static Runtime* r = new Runtime();  // leaked on purpose: kernels may still be released by late tensors
  return *r;
}

thread_local bool t_grad_enabled = true;
thread_local DType t_autocast = DType::kUndefined;
thread_local Tracer::Impl* t_tracer = nullptr;

}  // namespace detail

using namespace detail;

namespace {

Environment& env_locked(Runtime& r) {
  if (!r.env) {
    // OpenMP (oneDNN's threads) spinning between the many short parallel regions of eager training starves the
    // other threads and, on a shared machine, everyone else: sleep instead, unless the user chose otherwise. Read
    // by libgomp when the plugin loads it, so it must be set before the environment discovers plugins.
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
    EnvironmentOptions o;
    auto e = Environment::create(o);
    if (!e.is_ok()) fail(e.status().with_context("eager: cannot create the default environment"));
    r.env = std::shared_ptr<Environment>(std::move(e).value());
    r.pool = &r.env->thread_pool();
  }
  return *r.env;
}

}  // namespace

void init(std::shared_ptr<Environment> env, int threads) {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  {
    std::lock_guard<std::mutex> c(r.cache_mu);
    r.cache.clear();
  }
  {
    std::lock_guard<std::mutex> c(r.const_mu);
    r.consts.clear();
  }
  {
    std::lock_guard<std::mutex> u(r.copy_mu);  // their streams and events belong to the old environment's plugins
    r.copy_streams.clear();
  }
  r.env = std::move(env);
  r.own_pool.reset();
  if (!r.env) return;
  if (threads > 0 && threads != r.env->thread_pool().thread_count()) {
    r.own_pool = std::make_unique<ThreadPool>(threads);
    r.pool = r.own_pool.get();
  } else {
    r.pool = &r.env->thread_pool();
  }
}

Environment& environment() {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  return env_locked(r);
}

void set_device(const std::string& device) {
  Environment& e = environment();
  auto spec = e.device(device);
  if (!spec.is_ok()) fail(spec.status().with_context("set_device"));
  // Stored as eager names its devices: the type for index 0, "type:index" otherwise.
  std::string name = spec->index == 0 ? spec->type : spec->to_string();
  std::lock_guard<std::mutex> lock(rt().mu);
  rt().default_device = std::move(name);
}

const std::string& default_device() { return rt().default_device; }
void manual_seed(uint64_t seed) { rt().gen.seed(seed); }
std::mt19937_64& generator() { return rt().gen; }

DispatchStats dispatch_stats() {
  Runtime& r = rt();
  return DispatchStats{r.ops.load(), r.hits.load(), r.misses.load()};
}
void set_profiling(bool on) { rt().profiling = on; }
bool profiling() { return rt().profiling; }

std::string profile_report() {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.prof_mu);
  std::vector<std::pair<std::string, std::pair<double, uint64_t>>> v(r.prof.begin(), r.prof.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  std::string out;
  for (const auto& [k, t] : v) {
    char line[256];
    std::snprintf(line, sizeof line, "%-60s %8llu calls %10.3f ms %9.4f ms/call\n", k.c_str(),
                  static_cast<unsigned long long>(t.second), t.first, t.first / static_cast<double>(t.second));
    out += line;
  }
  r.prof.clear();
  return out;
}

void clear_kernel_cache() {
  {
    std::lock_guard<std::mutex> c(rt().cache_mu);
    rt().cache.clear();
  }
  std::lock_guard<std::mutex> c(rt().const_mu);
  rt().consts.clear();
}

// ------------------------------------------------------------------------------------------------ device helpers

namespace {

const DeviceEntry* device_entry(const std::string& type) {
  const DeviceEntry* d = environment().registry().device(type);
  if (!d) fail(not_found("no device '" + type + "'"));
  return d;
}

bool is_host_device(const std::string& type) {
  if (type == "cpu") return true;
  return hal::Device(device_entry(type), 0).host_memory();
}

}  // namespace

namespace detail {

std::string device_name(const std::string& type, int32_t index) {
  return index == 0 ? type : type + ":" + std::to_string(index);
}
std::string device_name(const Location& at) { return device_name(at.device_type, at.device_index); }
// A device spec ("cuda:1", "cuda") checked against the environment (Error naming it when malformed or absent).
DeviceSpec spec_of(const std::string& device) { return check(environment().device(device), ""); }

// Where outputs of `device` live: "cpu" for host-memory devices, else the device's name.
std::string memory_type_of(const std::string& device) {
  if (device == "cpu") return "cpu";
  DeviceSpec d = spec_of(device);
  return is_host_device(d.type) ? "cpu" : device_name(d.type, d.index);
}

void synchronize_device(const std::string& device) {
  if (memory_type_of(device) == "cpu") return;
  DeviceSpec d = spec_of(device);
  Status st = hal::Device(device_entry(d.type), d.index).synchronize();
  if (!st.is_ok()) fail(st.with_context("synchronize " + device));
}

keel::Tensor alloc_tensor(DType dtype, const Shape& shape, const std::string& mem_type) {
  uint64_t bytes = check(checked_byte_size(dtype, shape), "allocate " + shape_to_string(shape));
  DeviceSpec at = spec_of(mem_type);
  CachingAllocator* a = check(environment().allocator(at), "allocate on " + mem_type);
  void* p = check(a->allocate(bytes), "allocate on " + mem_type);
  auto storage = std::make_shared<Storage>(p, bytes, Location{at.type, at.index}, [a](void* q) { a->free(q); });
  return keel::Tensor(dtype, shape, storage);
}

// Eager queues its kernels on each device's default stream. Uploads (the batch, a factory's values) and copies within a
// device (copy_: an optimizer's state, BatchNorm's running statistics, a data-parallel bucket) go on a stream of their
// own instead of the default stream, whose copies complete on return (a wait for the device each): the copy stream
// waits for an event recorded after the work eager has queued (dst may be memory that work still uses, since the
// caching allocator hands freed blocks out at once, and a device source may still be being written), and the default
// stream waits for an event recorded after the copy, so everything eager queues next (and whatever a communication
// thread queues on the default stream after this returns) sees the copied bytes. The device table's copy has read a
// host `src` when it returns (the stream contract), so the caller may reuse it at once; a device `src` freed after
// this returns goes back to the default stream's pool, which runs after the copy.
bool copy_async(const keel::Tensor& dst, const keel::Tensor& src) {
  // KEEL_EAGER_COPY=sync: every eager copy completes before it returns, as before this path (to compare, or to rule
  // it out).
  static const bool sync_copies = [] {
    const char* e = std::getenv("KEEL_EAGER_COPY");
    return e != nullptr && std::string(e) == "sync";
  }();
  if (sync_copies || src.byte_size() != dst.byte_size()) return false;
  const Location& at = dst.location();
  if (at.is_host()) return false;
  const bool upload = src.location().is_host();
  if (!upload && src.location() != at) return false;
  const DeviceEntry* entry = environment().registry().device(at.device_type);
  if (entry == nullptr) return false;
  const hal::Device dev(entry, at.device_index);
  if (!dev.can_wait_on_events()) return false;
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.copy_mu);
  std::unique_ptr<CopyStream>& cs = r.copy_streams[device_name(at)];
  if (!cs) {
    cs = std::make_unique<CopyStream>();
    auto stream = dev.create_stream();
    auto before = dev.create_event();
    auto after = dev.create_event();
    if (stream.is_ok() && before.is_ok() && after.is_ok()) {
      cs->stream = std::move(stream).value();
      cs->before = std::move(before).value();
      cs->after = std::move(after).value();
      cs->usable = true;
    }
  }
  if (!cs->usable) return false;
  auto ok = [&](const Status& st) {
    if (!st.is_ok()) fail(st.with_context("copy " + src.describe() + " to " + device_name(at)));
  };
  ok(dev.record_event(cs->before, nullptr));
  ok(dev.wait_event(cs->stream.get(), cs->before));
  ok(dev.copy(upload ? KEEL_COPY_HOST_TO_DEVICE : KEEL_COPY_DEVICE_TO_DEVICE, dst.raw_data(), at.device_index,
              src.raw_data(), upload ? 0 : at.device_index, src.byte_size(), cs->stream.get()));
  // The copy is queued: where ordering the default stream after it fails, the host waits for it before the error
  // (the caller's destination then goes back to the default stream's pool, whose next user must not meet the copy
  // still writing it).
  Status st = dev.record_event(cs->after, cs->stream.get());
  if (st.is_ok()) st = dev.wait_event(nullptr, cs->after);
  if (!st.is_ok()) {
    (void)cs->stream.synchronize();
    ok(st);
  }
  return true;
}

// A copy of `t` in memory of `mem_type` (host <-> device through the device table). Uploads leave the host free
// (copy_async) where the device can order them; downloads complete before this returns.
keel::Tensor copy_to(const keel::Tensor& t, const std::string& mem_type) {
  keel::Tensor out = alloc_tensor(t.dtype(), t.shape(), mem_type);
  if (t.byte_size() == 0) return out;
  const bool src_host = t.location().is_host(), dst_host = mem_type == "cpu";
  if (src_host && dst_host) {
    std::memcpy(out.raw_data(), t.raw_data(), t.byte_size());
    return out;
  }
  if (src_host && copy_async(out, t)) return out;
  // Host <-> device through the device's table; two devices of one type by peer copy where the table has one,
  // otherwise through the host (Environment::copy).
  Status s = environment().copy(out.raw_data(), out.location(), t.raw_data(), t.location(), t.byte_size());
  if (!s.is_ok()) fail(s.with_context("copy " + t.describe() + " to " + mem_type));
  return out;
}

keel::Tensor to_host(const keel::Tensor& t) { return t.location().is_host() ? t : copy_to(t, "cpu"); }

// A read-only copy of a small host constant (a scalar operand, a gradient program's constant) in memory of
// `mem_type`, shared by every op that uses the same value there: after its first use such an operand costs no
// host-to-device copy, which on a device means no synchronisation per op. Keyed by content, so a value can never be
// stale; at most kMaxConsts entries (the cache starts over when full). Never hand the result to user code that may
// write into it (copy_): factories copy as before.
keel::Tensor device_constant(const keel::Tensor& host, const std::string& mem_type) {
  constexpr size_t kMaxBytes = 256, kMaxConsts = 4096;
  if (mem_type == "cpu" || !host.location().is_host()) return host;
  if (host.byte_size() > kMaxBytes) return copy_to(host, mem_type);
  std::string key = mem_type;
  key += '|';
  key += std::to_string(static_cast<int>(host.dtype()));
  key += shape_to_string(host.shape());
  key += '|';
  key.append(static_cast<const char*>(host.raw_data()), host.byte_size());
  Runtime& r = rt();
  {
    std::lock_guard<std::mutex> lock(r.const_mu);
    if (auto it = r.consts.find(key); it != r.consts.end()) return it->second;
  }
  keel::Tensor d = copy_to(host, mem_type);
  std::lock_guard<std::mutex> lock(r.const_mu);
  if (r.consts.size() >= kMaxConsts) r.consts.clear();
  return r.consts.emplace(std::move(key), d).first->second;
}

// One rule for eager operands and gradient programs' constants alike (ops::scalar_constant).
keel::Tensor host_scalar(double v, DType dt) { return check(ops::scalar_constant(v, dt), ""); }

}  // namespace detail
}  // namespace keel::eager
