// nccl_plugin_test — the NCCL collective plugin (plugins/nccl) through hal::Communicator: with one rank, init,
// all-reduce, broadcast, all-gather, reduce-scatter, barrier and teardown; the timeout path of a peer that never
// joins (DEADLINE_EXCEEDED naming the missing rank, within the timeout); and, where several GPUs exist, the same
// collectives plus send/recv across all of them (one thread per rank, rendezvous through an in-process key-value
// store). Without the plugin (no GPU, no driver, not built) every test skips with the recorded reason.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "core/runtime/environment.h"
#include "hal/device.h"

namespace keel {
namespace {

// An in-process rendezvous store (keel_kv_store_t): values never change once set.
struct KvStore {
  keel_kv_store_t c{};
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;

  KvStore() {
    c.struct_size = sizeof c;
    c.core_data = this;
    c.set = [](keel_kv_store_t* self, const char* key, const void* value, size_t size) -> keel_status_t {
      auto* s = static_cast<KvStore*>(self->core_data);
      {
        std::lock_guard<std::mutex> lock(s->mu);
        s->kv[key] = std::string(static_cast<const char*>(value), size);
      }
      s->cv.notify_all();
      return nullptr;
    };
    c.get = [](keel_kv_store_t* self, const char* key, int64_t timeout_ms, const void** out,
               size_t* size) -> keel_status_t {
      auto* s = static_cast<KvStore*>(self->core_data);
      std::unique_lock<std::mutex> lock(s->mu);
      const std::string k(key);
      if (!s->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms),
                          [&] { return s->kv.count(k) > 0; }))
        return make_c_status(KEEL_STATUS_DEADLINE_EXCEEDED, ("key '" + k + "' not set in time").c_str());
      *out = s->kv[k].data();
      *size = s->kv[k].size();
      return nullptr;
    };
  }
};

struct Nccl {
  std::unique_ptr<Environment> env;
  const CollectiveEntry* entry = nullptr;
  const DeviceEntry* cuda = nullptr;
  std::string why;  // empty when usable
};

Nccl& nccl() {
  static Nccl n = [] {
    Nccl r;
    auto env = Environment::create();
    if (!env.is_ok()) {
      r.why = env.status().to_string();
      return r;
    }
    r.env = std::move(env).value();
    for (const auto& c : r.env->registry().collectives())
      if (c->backend == "nccl") r.entry = c.get();
    r.cuda = r.env->registry().device("cuda");
    if (!r.entry || !r.cuda) {
      r.why = "the nccl plugin is not loaded (not built: no NCCL or CUDA toolkit)";
      for (const auto& p : r.env->plugins())
        if (p.name == "nccl") r.why = "nccl plugin " + std::string(p.reason.empty() ? "not loaded" : p.reason);
    }
    return r;
  }();
  return n;
}

#define SKIP_WITHOUT_NCCL()                              \
  do {                                                   \
    if (!nccl().why.empty()) GTEST_SKIP() << nccl().why; \
  } while (0)

TEST(NcclPlugin, SkipsWithAReasonOrLoads) {
  ASSERT_TRUE(nccl().env) << nccl().why;
  for (const auto& p : nccl().env->plugins()) {
    if (p.name != "nccl") continue;
    EXPECT_NE(p.state, PluginState::kFailed) << p.reason;
    if (p.state == PluginState::kSkipped) {
      EXPECT_NE(p.reason.find("no CUDA device"), std::string::npos) << p.reason;
    }
  }
  SKIP_WITHOUT_NCCL();
}

// Device buffers of floats through the cuda device table.
struct Buf {
  hal::Device dev;
  void* p = nullptr;
  size_t n = 0;
  Buf(const DeviceEntry* e, int32_t index, size_t count) : dev(e, index), n(count) {
    p = dev.allocate(count * sizeof(float), 256).value();
  }
  ~Buf() { dev.free(p); }
  void put(const std::vector<float>& v) {
    ASSERT_TRUE(dev.copy(KEEL_COPY_HOST_TO_DEVICE, p, dev.index(), v.data(), -1, v.size() * sizeof(float)).is_ok());
  }
  std::vector<float> get() {
    std::vector<float> v(n);
    EXPECT_TRUE(dev.synchronize().is_ok());
    EXPECT_TRUE(dev.copy(KEEL_COPY_DEVICE_TO_HOST, v.data(), -1, p, dev.index(), n * sizeof(float)).is_ok());
    return v;
  }
};

TEST(NcclPlugin, OneRankCollectivesAndTeardown) {
  SKIP_WITHOUT_NCCL();
  auto comm = hal::Communicator::create(nccl().entry, nullptr, 0, 1, 0, 60000);
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  const size_t n = 1000;
  std::vector<float> x(n);
  std::iota(x.begin(), x.end(), 1.f);
  Buf a(nccl().cuda, 0, n), b(nccl().cuda, 0, n);
  a.put(x);
  ASSERT_TRUE(comm->all_reduce(a.p, b.p, n, DType::kF32, KEEL_REDUCE_SUM).is_ok());
  EXPECT_EQ(b.get(), x);  // one rank: the sum is the input
  b.put(std::vector<float>(n, 0.f));
  ASSERT_TRUE(comm->all_reduce(a.p, a.p, n, DType::kF32, KEEL_REDUCE_MAX).is_ok());  // in place
  EXPECT_EQ(a.get(), x);
  ASSERT_TRUE(comm->broadcast(a.p, b.p, n, DType::kF32, 0).is_ok());
  EXPECT_EQ(b.get(), x);
  b.put(std::vector<float>(n, 0.f));
  ASSERT_TRUE(comm->all_gather(a.p, b.p, n, DType::kF32).is_ok());
  EXPECT_EQ(b.get(), x);
  b.put(std::vector<float>(n, 0.f));
  ASSERT_TRUE(comm->reduce_scatter(a.p, b.p, n, DType::kF32, KEEL_REDUCE_SUM).is_ok());
  EXPECT_EQ(b.get(), x);
  ASSERT_TRUE(comm->barrier().is_ok());
  // Bad arguments are errors, not crashes.
  EXPECT_FALSE(comm->all_reduce(a.p, b.p, n, DType::kString, KEEL_REDUCE_SUM).is_ok());
  EXPECT_FALSE(comm->all_reduce(a.p, b.p, n, DType::kF32, static_cast<keel_reduce_op_t>(99)).is_ok());
  EXPECT_FALSE(hal::Communicator::create(nccl().entry, nullptr, 1, 1, 0, 1000).is_ok());  // rank out of range
  // Teardown: the communicator goes with `comm`; a second one can be made right after.
  *comm = hal::Communicator();
  auto again = hal::Communicator::create(nccl().entry, nullptr, 0, 1, 0, 60000);
  EXPECT_TRUE(again.is_ok()) << again.status().to_string();
}

TEST(NcclPlugin, APeerThatNeverJoinsTimesOut) {
  SKIP_WITHOUT_NCCL();
  KvStore store;
  const auto t0 = std::chrono::steady_clock::now();
  auto comm = hal::Communicator::create(nccl().entry, &store.c, 0, 2, 0, 500);  // rank 1 never comes
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(comm.is_ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded) << comm.status().to_string();
  EXPECT_NE(comm.status().message().find("rank 1 of 2 never arrived"), std::string::npos) << comm.status().to_string();
  EXPECT_LT(s, 10.0) << "the timeout is 500 ms";
  // Without a store, more than one rank cannot rendezvous: a clear error.
  auto no_store = hal::Communicator::create(nccl().entry, nullptr, 0, 2, 0, 500);
  EXPECT_EQ(no_store.status().code(), StatusCode::kInvalidArgument) << no_store.status().to_string();
}

TEST(NcclPlugin, EveryGpuOneRankEach) {
  SKIP_WITHOUT_NCCL();
  const int32_t n = nccl().cuda->device_count;
  if (n < 2) GTEST_SKIP() << "one GPU: the multi-rank test needs several";
  KvStore store;
  const size_t count = 4096;
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> ranks;
  for (int32_t r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      std::string& err = errors[static_cast<size_t>(r)];
      auto comm = hal::Communicator::create(nccl().entry, &store.c, r, n, r, 120000);
      if (!comm.is_ok()) {
        err = comm.status().to_string();
        return;
      }
      Buf a(nccl().cuda, r, count), b(nccl().cuda, r, count * static_cast<size_t>(n));
      a.put(std::vector<float>(count, static_cast<float>(r + 1)));
      if (!comm->all_reduce(a.p, b.p, count, DType::kF32, KEEL_REDUCE_SUM).is_ok()) err = "all_reduce failed";
      std::vector<float> got = b.get();
      if (got[0] != n * (n + 1) / 2.f || got[count - 1] != got[0]) err = "all_reduce: got " + std::to_string(got[0]);
      if (!comm->all_gather(a.p, b.p, count, DType::kF32).is_ok()) err = "all_gather failed";
      got = b.get();
      for (int32_t q = 0; q < n; ++q)
        if (got[static_cast<size_t>(q) * count] != q + 1.f)
          err = "all_gather: rank " + std::to_string(q) + " slot wrong";
      // A ring: even ranks send first, odd ones receive first.
      const int32_t next = (r + 1) % n, prev = (r + n - 1) % n;
      Buf in(nccl().cuda, r, count);
      Status s1 = r % 2 == 0 ? comm->send(a.p, count, DType::kF32, next) : comm->recv(in.p, count, DType::kF32, prev);
      Status s2 = r % 2 == 0 ? comm->recv(in.p, count, DType::kF32, prev) : comm->send(a.p, count, DType::kF32, next);
      if (!s1.is_ok() || !s2.is_ok()) err = "send/recv failed";
      if (in.get()[0] != prev + 1.f) err = "recv: got " + std::to_string(in.get()[0]);
      if (!comm->barrier().is_ok()) err = "barrier failed";
    });
  }
  for (auto& t : ranks) t.join();
  for (int32_t r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

}  // namespace
}  // namespace keel
