// gloo_collectives_test — the Gloo collective plugin (plugins/gloo) through the core (hal::Communicator), with 2, 3
// and 4 ranks as threads of this process over loopback TCP: inputs rank+1, so SUM = W(W+1)/2, PROD = W!, MIN = 1,
// MAX = W, AVG = (W+1)/2, for f32/f16/bf16/f64/i32/i64, in place and not; broadcast from every root; all-gather
// order; reduce-scatter; send/recv; empty tensors; count, dtype, op and root mismatches (an error on every rank, the
// output untouched, the communicator still usable); several communicators on one store; and the faults: a rank that
// never arrives (DEADLINE_EXCEEDED naming it, within the timeout), a peer that releases its communicator while the
// others wait on it (an error naming it, well before the timeout, then FAILED_PRECONDITION), a peer that never
// calls (DEADLINE_EXCEEDED naming it), and a peer process SIGKILLed before its first collective
// (gloo_rank_helper); a named interface (KEEL_GLOO_IFACE=lo) and one that does not exist; options per environment
// (each environment its own plugin instance; a refused option fails that environment alone). Skips with the recorded
// reason when the plugin was not built.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include <atomic>
#include <barrier>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/base/dtype.h"
#include "core/runtime/dist/process_group.h"
#include "tests/collectives/collective_script.h"
#include "tests/collectives/collective_test_util.h"

extern char** environ;

namespace keel {
namespace {

using testing::FileStore;
using testing::gloo;
using testing::KvStore;
using Clock = std::chrono::steady_clock;

#define SKIP_WITHOUT_GLOO()                              \
  do {                                                   \
    if (!gloo().why.empty()) GTEST_SKIP() << gloo().why; \
  } while (0)

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs fn(rank, comm) on `world` threads, each with its own communicator on one store; returns the errors of every
// rank ("" when fine).
std::vector<std::string> run_ranks(int32_t world, int64_t timeout_ms,
                                   const std::function<std::string(int32_t, hal::Communicator&)>& fn,
                                   KvStore* shared = nullptr, const CollectiveEntry* entry = nullptr) {
  if (entry == nullptr) entry = gloo().entry;
  KvStore local;
  KvStore* store = shared ? shared : &local;
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> ranks;
  for (int32_t r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto comm = hal::Communicator::create(entry, &store->c, r, world, 0, timeout_ms);
      if (!comm.is_ok()) {
        errors[static_cast<size_t>(r)] = "create: " + comm.status().to_string();
        return;
      }
      errors[static_cast<size_t>(r)] = fn(r, *comm);
    });
  }
  for (auto& t : ranks) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors, const std::string& what) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << what << ": rank " << r;
}

// Values of any tested dtype, held as doubles on the test's side.
struct Values {
  DType dtype;
  std::vector<uint8_t> bytes;
  Values(DType t, size_t n, double v = 0) : dtype(t), bytes(n * dtype_size(t)) {
    for (size_t i = 0; i < n; ++i) set(i, v);
  }
  size_t size() const { return bytes.size() / dtype_size(dtype); }
  void* data() { return bytes.data(); }
  void set(size_t i, double v) {
    uint8_t* p = bytes.data() + i * dtype_size(dtype);
    switch (dtype) {
      case DType::kF32: {
        float x = static_cast<float>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::kF64: std::memcpy(p, &v, 8); break;
      case DType::kI32: {
        int32_t x = static_cast<int32_t>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::kI64: {
        int64_t x = static_cast<int64_t>(v);
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::kF16: {
        uint16_t x = f32_to_f16(static_cast<float>(v));
        std::memcpy(p, &x, 2);
        break;
      }
      case DType::kBF16: {
        uint16_t x = f32_to_bf16(static_cast<float>(v));
        std::memcpy(p, &x, 2);
        break;
      }
      default: break;
    }
  }
  double get(size_t i) const {
    const uint8_t* p = bytes.data() + i * dtype_size(dtype);
    switch (dtype) {
      case DType::kF32: {
        float x;
        std::memcpy(&x, p, 4);
        return x;
      }
      case DType::kF64: {
        double x;
        std::memcpy(&x, p, 8);
        return x;
      }
      case DType::kI32: {
        int32_t x;
        std::memcpy(&x, p, 4);
        return x;
      }
      case DType::kI64: {
        int64_t x;
        std::memcpy(&x, p, 8);
        return x;
      }
      case DType::kF16: {
        uint16_t x;
        std::memcpy(&x, p, 2);
        return f16_to_f32(x);
      }
      case DType::kBF16: {
        uint16_t x;
        std::memcpy(&x, p, 2);
        return bf16_to_f32(x);
      }
      default: return NAN;
    }
  }
  // "" when every element equals `want`, else the first difference.
  std::string all_equal(double want) const {
    for (size_t i = 0; i < size(); ++i)
      if (get(i) != want)
        return std::string(dtype_name(dtype)) + "[" + std::to_string(i) + "] = " + std::to_string(get(i)) + ", want " +
               std::to_string(want);
    return "";
  }
};

const DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI32, DType::kI64};
const keel_reduce_op_t kOps[] = {KEEL_REDUCE_SUM, KEEL_REDUCE_PROD, KEEL_REDUCE_MIN, KEEL_REDUCE_MAX, KEEL_REDUCE_AVG};

double expected(keel_reduce_op_t op, int32_t w, DType t) {
  switch (op) {
    case KEEL_REDUCE_SUM: return w * (w + 1) / 2.0;
    case KEEL_REDUCE_PROD: {
      double p = 1;
      for (int i = 2; i <= w; ++i) p *= i;
      return p;
    }
    case KEEL_REDUCE_MIN: return 1;
    case KEEL_REDUCE_MAX: return w;
    case KEEL_REDUCE_AVG: {
      const int64_t sum = w * (w + 1) / 2;
      return dtype_is_integer(t) ? static_cast<double>(sum / w) : static_cast<double>(sum) / w;
    }
  }
  return NAN;
}

std::string op_name(keel_reduce_op_t op) {
  switch (op) {
    case KEEL_REDUCE_SUM: return "sum";
    case KEEL_REDUCE_PROD: return "prod";
    case KEEL_REDUCE_MIN: return "min";
    case KEEL_REDUCE_MAX: return "max";
    case KEEL_REDUCE_AVG: return "avg";
  }
  return "?";
}

TEST(GlooCollectives, PluginLoads) {
  ASSERT_TRUE(gloo().env) << gloo().why;
  for (const auto& p : gloo().env->plugins()) {
    if (p.name != "gloo") continue;
    EXPECT_EQ(p.state, PluginState::kLoaded) << p.reason;
  }
  SKIP_WITHOUT_GLOO();
  EXPECT_EQ(gloo().entry->device_type, "cpu");
}

// A Gloo plugin whose init refuses an option fails to load; asking for the backend then names the plugin's own reason
// (not just "not registered"), so `keel train --nproc 2` with a mistyped KEEL_GLOO_* says what to fix.
TEST(GlooCollectives, AMissingBackendNamesWhyItsPluginDidNotLoad) {
  SKIP_WITHOUT_GLOO();
  EnvironmentOptions options;
  options.plugin_options["gloo"]["cross_memory"] = "sometimes";
  auto env = Environment::create(options);
  ASSERT_TRUE(env.is_ok()) << env.status().to_string();
  auto entry = dist::find_collective(**env, "gloo");
  ASSERT_FALSE(entry.is_ok());
  const std::string m = entry.status().to_string();
  EXPECT_NE(m.find("is not registered: plugin 'gloo' failed"), std::string::npos) << m;
  EXPECT_NE(m.find("cross_memory 'sometimes' is not auto or off"), std::string::npos) << m;
}

// Each environment has its own instance of the plugin (ABI 1.5 init_instance): environments with different options
// coexist, and one whose init refuses its options changes nothing for the others. (The settings were process-wide
// before: each environment's init overwrote them for every communicator of the process, and the test above had to
// run in a child process.)
TEST(GlooCollectives, EachEnvironmentKeepsItsOwnOptions) {
  SKIP_WITHOUT_GLOO();
  EnvironmentOptions named;  // an interface that does not exist: its communicators fail at creation, naming it
  named.plugin_options["gloo"]["iface"] = "keelnosuch0";
  auto b = Environment::create(named);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  auto b_entry = dist::find_collective(**b, "gloo");
  ASSERT_TRUE(b_entry.is_ok()) << b_entry.status().to_string();
  EnvironmentOptions refused;  // refused by the plugin's init: skipped in that environment alone
  refused.plugin_options["gloo"]["algorithm"] = "telepathy";
  auto c = Environment::create(refused);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto c_entry = dist::find_collective(**c, "gloo");
  ASSERT_FALSE(c_entry.is_ok());
  EXPECT_NE(c_entry.status().to_string().find("algorithm 'telepathy'"), std::string::npos)
      << c_entry.status().to_string();

  auto sum_of_two = [](int32_t r, hal::Communicator& comm) -> std::string {
    std::vector<float> x(1000, static_cast<float>(r + 1));
    if (Status s = comm.all_reduce(x.data(), x.data(), x.size(), DType::kF32, KEEL_REDUCE_SUM); !s.is_ok())
      return s.to_string();
    return x.front() == 3.f && x.back() == 3.f ? "" : "wrong sum " + std::to_string(x.front());
  };
  // The shared environment (the build tree's default options) still binds loopback...
  expect_no_errors(run_ranks(2, 5000, sum_of_two), "default options");
  // ... while the other environment's communicators use its interface.
  auto errors = run_ranks(2, 5000, sum_of_two, nullptr, *b_entry);
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_NE(errors[r].find("UNAVAILABLE"), std::string::npos) << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("interface 'keelnosuch0'"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

class GlooWorld : public ::testing::TestWithParam<int32_t> {};

TEST_P(GlooWorld, AllReduceEveryOpAndDtype) {
  SKIP_WITHOUT_GLOO();
  const int32_t w = GetParam();
  const size_t n = 1003;  // not a multiple of any world size
  auto errors = run_ranks(w, 5000, [&](int32_t r, hal::Communicator& comm) -> std::string {
    int variant = 0;
    for (DType t : kDtypes) {
      for (keel_reduce_op_t op : kOps) {
        Values in(t, n, r + 1), out(t, n, -7);
        const bool in_place = (variant++ % 2) == 1;
        Status s = in_place ? comm.all_reduce(in.data(), in.data(), n, t, op)
                            : comm.all_reduce(in.data(), out.data(), n, t, op);
        if (!s.is_ok()) return s.to_string();
        std::string bad = (in_place ? in : out).all_equal(expected(op, w, t));
        if (!bad.empty()) return std::string("all_reduce ") + (in_place ? "in place " : "") + bad;
        if (!in_place && !(bad = in.all_equal(r + 1)).empty()) return "all_reduce changed its input: " + bad;
      }
    }
    // Fewer elements than ranks, and a few more.
    for (size_t small : {1, 2, 3, 5}) {
      for (DType t : {DType::kF32, DType::kF16, DType::kI64}) {
        Values in(t, small, r + 1), out(t, small, -7);
        if (Status s = comm.all_reduce(in.data(), out.data(), small, t, KEEL_REDUCE_SUM); !s.is_ok())
          return s.to_string();
        std::string bad = out.all_equal(w * (w + 1) / 2.0);
        if (!bad.empty()) return "all_reduce of " + std::to_string(small) + ": " + bad;
      }
    }
    // Averages above the direct exchange's capacity (where every rank is in this process: cross memory, which
    // divides each block as it reduces it), every dtype, in place and not.
    for (DType t : kDtypes) {
      const size_t n_big = 300007;
      const bool in_place = t == DType::kF16 || t == DType::kI64;
      Values in(t, n_big, r + 1), out(t, n_big, -7);
      if (Status s = in_place ? comm.all_reduce(in.data(), in.data(), n_big, t, KEEL_REDUCE_AVG)
                              : comm.all_reduce(in.data(), out.data(), n_big, t, KEEL_REDUCE_AVG);
          !s.is_ok())
        return s.to_string();
      std::string bad = (in_place ? in : out).all_equal(expected(KEEL_REDUCE_AVG, w, t));
      if (!bad.empty()) return std::string("all_reduce avg of ") + std::to_string(n_big) + ": " + bad;
    }
    // Large enough for several of Gloo's 1 MiB segments per rank.
    Values big(DType::kF32, (3u << 20) / 4 + 5, r + 1);
    if (Status s = comm.all_reduce(big.data(), big.data(), big.size(), DType::kF32, KEEL_REDUCE_SUM); !s.is_ok())
      return s.to_string();
    return big.all_equal(w * (w + 1) / 2.0);
  });
  expect_no_errors(errors, "all_reduce");
}

// Distinct values per rank and element: every rank ends with the same bits (all-reduce results must not depend on the
// rank), close to the sum in double. 1003 floats take the direct exchange on every world size; 200,000 (800 KB) the
// direct exchange on 2 ranks and bcube on 3 and 4 ((W-1) x bytes > 1 MiB); 300,000 (1.2 MB) the ring.
TEST_P(GlooWorld, AllReduceGivesTheSameBitsOnEveryRank) {
  SKIP_WITHOUT_GLOO();
  const int32_t w = GetParam();
  auto value = [](int32_t r, size_t i) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(r + 1) * 40503u;
    h ^= h >> 13;
    return static_cast<float>(h % 20001) / 1000.f - 10.f;
  };
  for (size_t n : {size_t{1003}, size_t{200000}, size_t{300000}}) {
    std::vector<std::vector<float>> results(static_cast<size_t>(w));
    auto errors = run_ranks(w, 20000, [&](int32_t r, hal::Communicator& comm) -> std::string {
      std::vector<float> x(n);
      for (size_t i = 0; i < n; ++i) x[i] = value(r, i);
      const bool in_place = r % 2 == 0;
      std::vector<float>& out = results[static_cast<size_t>(r)];
      out.assign(n, -1.f);
      Status s = in_place ? comm.all_reduce(x.data(), x.data(), n, DType::kF32, KEEL_REDUCE_SUM)
                          : comm.all_reduce(x.data(), out.data(), n, DType::kF32, KEEL_REDUCE_SUM);
      if (!s.is_ok()) return s.to_string();
      if (in_place) out = x;
      return "";
    });
    expect_no_errors(errors, "all_reduce of " + std::to_string(n));
    for (size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int32_t r = 0; r < w; ++r) want += value(r, i);
      ASSERT_NEAR(results[0][i], want, 1e-4 * (1 + std::abs(want))) << "n " << n << " element " << i;
      for (int32_t r = 1; r < w; ++r)
        ASSERT_EQ(std::memcmp(&results[0][i], &results[static_cast<size_t>(r)][i], sizeof(float)), 0)
            << "n " << n << " element " << i << ": rank 0 has " << results[0][i] << ", rank " << r << " has "
            << results[static_cast<size_t>(r)][i];
    }
  }
}

TEST_P(GlooWorld, BroadcastFromEveryRoot) {
  SKIP_WITHOUT_GLOO();
  const int32_t w = GetParam();
  auto errors = run_ranks(w, 5000, [&](int32_t r, hal::Communicator& comm) -> std::string {
    for (DType t : {DType::kF32, DType::kBF16, DType::kI64}) {
      for (int32_t root = 0; root < w; ++root) {
        // In the root's header message (1, 517 elements) and above its capacity, through Gloo's tree (300,000).
        for (size_t n : {size_t{1}, size_t{517}, size_t{300000}}) {
          Values in(t, n, r == root ? 100 + root : -1), out(t, n, -2);
          const bool in_place = (root + static_cast<int32_t>(n)) % 2 == 1;
          Status s = in_place ? comm.broadcast(in.data(), in.data(), in.size(), t, root)
                              : comm.broadcast(in.data(), out.data(), in.size(), t, root);
          if (!s.is_ok()) return s.to_string();
          std::string bad = (in_place ? in : out).all_equal(100 + root);
          if (!bad.empty()) return "broadcast of " + std::to_string(n) + " from " + std::to_string(root) + ": " + bad;
        }
      }
    }
    return "";
  });
  expect_no_errors(errors, "broadcast");
}

TEST_P(GlooWorld, AllGatherKeepsRankOrder) {
  SKIP_WITHOUT_GLOO();
  const int32_t w = GetParam();
  auto errors = run_ranks(w, 5000, [&](int32_t r, hal::Communicator& comm) -> std::string {
    for (size_t n : {size_t{1}, size_t{301}})
      for (bool in_place : {false, true}) {
        Values in(DType::kI32, n), out(DType::kI32, n * static_cast<size_t>(w), -1);
        for (size_t i = 0; i < n; ++i) in.set(i, r * 1000 + static_cast<double>(i));
        Status s;
        if (in_place) {
          std::memcpy(static_cast<char*>(out.data()) + static_cast<size_t>(r) * n * 4, in.data(), n * 4);
          s = comm.all_gather(static_cast<char*>(out.data()) + static_cast<size_t>(r) * n * 4, out.data(), n,
                              DType::kI32);
        } else {
          s = comm.all_gather(in.data(), out.data(), n, DType::kI32);
        }
        if (!s.is_ok()) return s.to_string();
        for (int32_t q = 0; q < w; ++q)
          for (size_t i = 0; i < n; ++i)
            if (out.get(static_cast<size_t>(q) * n + i) != q * 1000 + static_cast<double>(i))
              return "all_gather: block " + std::to_string(q) + " element " + std::to_string(i) + " = " +
                     std::to_string(out.get(static_cast<size_t>(q) * n + i));
      }
    return "";
  });
  expect_no_errors(errors, "all_gather");
}

TEST_P(GlooWorld, ReduceScatter) {
  SKIP_WITHOUT_GLOO();
  const int32_t w = GetParam();
  auto errors = run_ranks(w, 5000, [&](int32_t r, hal::Communicator& comm) -> std::string {
    for (size_t n : {size_t{1}, size_t{257}})
      for (DType t : {DType::kF32, DType::kF16, DType::kI64}) {
        for (keel_reduce_op_t op : {KEEL_REDUCE_SUM, KEEL_REDUCE_MAX, KEEL_REDUCE_AVG}) {
          // Block q of rank r holds (r+1) * (q+1): rank q receives (q+1) times the reduction of 1..W.
          Values in(t, n * static_cast<size_t>(w)), out(t, n, -3);
          for (int32_t q = 0; q < w; ++q)
            for (size_t i = 0; i < n; ++i) in.set(static_cast<size_t>(q) * n + i, (r + 1) * (q + 1));
          const bool in_place = op == KEEL_REDUCE_MAX;  // recv = send + rank * n, as NCCL defines in place
          void* recv =
              in_place ? static_cast<char*>(in.data()) + static_cast<size_t>(r) * n * dtype_size(t) : out.data();
          Status s = comm.reduce_scatter(in.data(), recv, n, t, op);
          if (!s.is_ok()) return s.to_string();
          const double want = op == KEEL_REDUCE_AVG && dtype_is_integer(t)
                                  ? static_cast<double>((r + 1) * (w * (w + 1) / 2) / w)
                                  : (r + 1) * expected(op, w, t);
          Values got(t, n);
          std::memcpy(got.data(), recv, n * dtype_size(t));
          std::string bad = got.all_equal(want);
          if (!bad.empty()) return std::string("reduce_scatter ") + op_name(op) + ": " + bad;
        }
      }
    return "";
  });
  expect_no_errors(errors, "reduce_scatter");
}

TEST_P(GlooWorld, SendRecvRingAndBarrier) {
  SKIP_WITHOUT_GLOO();
  const int32_t w = GetParam();
  auto errors = run_ranks(w, 5000, [&](int32_t r, hal::Communicator& comm) -> std::string {
    const int32_t next = (r + 1) % w, prev = (r + w - 1) % w;
    for (int round = 0; round < 3; ++round) {
      Values out(DType::kF64, 1000, r * 10 + round), in(DType::kF64, 1000, -1);
      // Even ranks send first, odd ones receive first (blocking point-to-point).
      Status s1 =
          r % 2 == 0 ? comm.send(out.data(), 1000, DType::kF64, next) : comm.recv(in.data(), 1000, DType::kF64, prev);
      Status s2 =
          r % 2 == 0 ? comm.recv(in.data(), 1000, DType::kF64, prev) : comm.send(out.data(), 1000, DType::kF64, next);
      if (!s1.is_ok()) return s1.to_string();
      if (!s2.is_ok()) return s2.to_string();
      std::string bad = in.all_equal(prev * 10 + round);
      if (!bad.empty()) return "recv: " + bad;
      if (Status s = comm.barrier(); !s.is_ok()) return s.to_string();
    }
    // A peer out of range, or oneself, is an error.
    Values x(DType::kF32, 4);
    if (comm.send(x.data(), 4, DType::kF32, w).is_ok()) return "send to rank W succeeded";
    if (comm.recv(x.data(), 4, DType::kF32, r).is_ok()) return "recv from oneself succeeded";
    return "";
  });
  expect_no_errors(errors, "send/recv");
}

TEST_P(GlooWorld, EmptyTensorsDoNotHang) {
  SKIP_WITHOUT_GLOO();
  const int32_t w = GetParam();
  const auto t0 = Clock::now();
  auto errors = run_ranks(w, 5000, [&](int32_t r, hal::Communicator& comm) -> std::string {
    for (DType t : kDtypes)
      if (Status s = comm.all_reduce(nullptr, nullptr, 0, t, KEEL_REDUCE_SUM); !s.is_ok()) return s.to_string();
    if (Status s = comm.broadcast(nullptr, nullptr, 0, DType::kF32, w - 1); !s.is_ok()) return s.to_string();
    if (Status s = comm.all_gather(nullptr, nullptr, 0, DType::kF32); !s.is_ok()) return s.to_string();
    if (Status s = comm.reduce_scatter(nullptr, nullptr, 0, DType::kF32, KEEL_REDUCE_SUM); !s.is_ok())
      return s.to_string();
    const int32_t peer = r ^ 1;
    if (peer < w) {
      Status s = r % 2 == 0 ? comm.send(nullptr, 0, DType::kF32, peer) : comm.recv(nullptr, 0, DType::kF32, peer);
      if (!s.is_ok()) return s.to_string();
    }
    Status b = comm.barrier();
    return b.is_ok() ? "" : "barrier: " + b.to_string();
  });
  expect_no_errors(errors, "empty");
  EXPECT_LT(seconds_since(t0), 4.0);
}

TEST_P(GlooWorld, MismatchesAreErrorsOnEveryRankNotCorruption) {
  SKIP_WITHOUT_GLOO();
  const int32_t w = GetParam();
  const int32_t odd = w - 1;  // the rank that passes something else
  auto errors = run_ranks(w, 5000, [&](int32_t r, hal::Communicator& comm) -> std::string {
    const size_t n = 100;
    auto expect_mismatch = [&](Status s, Values& out, double untouched, const char* what) -> std::string {
      if (s.is_ok()) return std::string(what) + ": succeeded";
      if (s.code() != StatusCode::kInvalidArgument) return std::string(what) + ": " + s.to_string();
      if (s.message().find("rank " + std::to_string(r == odd ? 0 : odd)) == std::string::npos &&
          s.message().find("rank " + std::to_string(odd)) == std::string::npos)
        return std::string(what) + ": the message names no rank: " + s.to_string();
      std::string bad = out.all_equal(untouched);
      return bad.empty() ? "" : std::string(what) + ": output touched: " + bad;
    };
    {  // count
      Values in(DType::kF32, n + 1, 1), out(DType::kF32, n + 1, -5);
      std::string e = expect_mismatch(
          comm.all_reduce(in.data(), out.data(), r == odd ? n + 1 : n, DType::kF32, KEEL_REDUCE_SUM), out, -5, "count");
      if (!e.empty()) return e;
    }
    {  // count across paths: 100 floats (shared memory or direct) against 200,000 (cross memory or the mesh ring)
      Values in(DType::kF32, 200000, 1), out(DType::kF32, 200000, -5);
      std::string e =
          expect_mismatch(comm.all_reduce(in.data(), out.data(), r == odd ? 200000 : n, DType::kF32, KEEL_REDUCE_SUM),
                          out, -5, "count across paths");
      if (!e.empty()) return e;
    }
    {  // dtype (same byte size: f32 against i32)
      Values in(DType::kF32, n, 1), out(DType::kF32, n, -5);
      std::string e = expect_mismatch(
          comm.all_reduce(in.data(), out.data(), n, r == odd ? DType::kI32 : DType::kF32, KEEL_REDUCE_SUM), out, -5,
          "dtype");
      if (!e.empty()) return e;
    }
    {  // op
      Values in(DType::kF32, n, 1), out(DType::kF32, n, -5);
      std::string e = expect_mismatch(
          comm.all_reduce(in.data(), out.data(), n, DType::kF32, r == odd ? KEEL_REDUCE_MAX : KEEL_REDUCE_SUM), out, -5,
          "op");
      if (!e.empty()) return e;
    }
    {  // broadcast root and count
      Values buf(DType::kF32, n + 1, -5);
      std::string e =
          expect_mismatch(comm.broadcast(buf.data(), buf.data(), n, DType::kF32, r == odd ? 1 : 0), buf, -5, "root");
      if (!e.empty()) return e;
      e = expect_mismatch(comm.broadcast(buf.data(), buf.data(), r == odd ? n + 1 : n, DType::kF32, 0), buf, -5,
                          "broadcast count");
      if (!e.empty()) return e;
    }
    {  // one rank's invalid argument (an unknown op) is an error everywhere
      Values in(DType::kF32, n, 1), out(DType::kF32, n, -5);
      Status s = comm.all_reduce(in.data(), out.data(), n, DType::kF32,
                                 r == odd ? static_cast<keel_reduce_op_t>(99) : KEEL_REDUCE_SUM);
      if (s.is_ok() || s.code() != StatusCode::kInvalidArgument) return "invalid op: " + s.to_string();
    }
    {  // send/recv of different sizes: an error on both sides
      const int32_t peer = r ^ 1;
      if (peer < w) {
        Values buf(DType::kF32, n + 1, -5);
        Status s =
            r % 2 == 0 ? comm.send(buf.data(), n, DType::kF32, peer) : comm.recv(buf.data(), n + 1, DType::kF32, peer);
        if (s.is_ok() || s.code() != StatusCode::kInvalidArgument) return "send/recv sizes: " + s.to_string();
      }
    }
    // The communicator is still usable.
    Values in(DType::kF32, n, r + 1), out(DType::kF32, n);
    if (Status s = comm.all_reduce(in.data(), out.data(), n, DType::kF32, KEEL_REDUCE_SUM); !s.is_ok())
      return "after the mismatches: " + s.to_string();
    return out.all_equal(w * (w + 1) / 2.0);
  });
  expect_no_errors(errors, "mismatch");
}

// Small all-reduces (the shared-memory path where the ranks can reach each other's processes) each followed at once by
// a collective on the message mesh, one rank late by a random few tens of microseconds: a rank that finishes an
// all-reduce and sends its next header while a slower one still waits for the all-reduce must not look to it like a
// rank that took another path (random scripts, seed 5065, before shm_wait's second look at the peer's count).
TEST_P(GlooWorld, SmallAllReducesFollowedAtOnceByOtherCollectivesStayInStep) {
  SKIP_WITHOUT_GLOO();
  const int32_t w = GetParam();
  auto errors = run_ranks(w, 20000, [&](int32_t r, hal::Communicator& comm) -> std::string {
    std::mt19937 rng(static_cast<uint32_t>(r) + 7);
    std::vector<float> x(2000), g(static_cast<size_t>(w));
    for (int k = 0; k < 3000; ++k) {
      if (r == k % w && rng() % 2) std::this_thread::sleep_for(std::chrono::microseconds(20 + rng() % 60));
      std::fill(x.begin(), x.end(), static_cast<float>(r + 1));
      if (Status s = comm.all_reduce(x.data(), x.data(), x.size(), DType::kF32, KEEL_REDUCE_SUM); !s.is_ok())
        return "all_reduce " + std::to_string(k) + ": " + s.to_string();
      if (x[0] != w * (w + 1) / 2.f) return "all_reduce " + std::to_string(k) + ": wrong sum";
      float mine = static_cast<float>(r);
      Status s = k % 2 ? comm.barrier() : comm.all_gather(&mine, g.data(), 1, DType::kF32);
      if (!s.is_ok()) return "after all_reduce " + std::to_string(k) + ": " + s.to_string();
    }
    return "";
  });
  expect_no_errors(errors, "small all-reduces");
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooWorld, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int32_t>& i) { return "W" + std::to_string(i.param); });

TEST(GlooCollectives, OneRankNeedsNoStore) {
  SKIP_WITHOUT_GLOO();
  auto comm = hal::Communicator::create(gloo().entry, nullptr, 0, 1, 0, 1000);
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  Values in(DType::kF32, 10, 3), out(DType::kF32, 10);
  ASSERT_TRUE(comm->all_reduce(in.data(), out.data(), 10, DType::kF32, KEEL_REDUCE_AVG).is_ok());
  EXPECT_EQ(out.all_equal(3), "");
  ASSERT_TRUE(comm->all_gather(in.data(), out.data(), 10, DType::kF32).is_ok());
  ASSERT_TRUE(comm->barrier().is_ok());
  EXPECT_FALSE(comm->all_reduce(in.data(), out.data(), 10, DType::kString, KEEL_REDUCE_SUM).is_ok());
  auto no_store = hal::Communicator::create(gloo().entry, nullptr, 0, 2, 0, 500);
  EXPECT_EQ(no_store.status().code(), StatusCode::kInvalidArgument) << no_store.status().to_string();
}

TEST(GlooCollectives, SeveralCommunicatorsShareOneStore) {
  SKIP_WITHOUT_GLOO();
  KvStore store;
  const int32_t w = 3;
  std::vector<std::string> errors(w);
  std::vector<std::thread> ranks;
  for (int32_t r = 0; r < w; ++r) {
    ranks.emplace_back([&, r] {
      auto a = hal::Communicator::create(gloo().entry, &store.c, r, w, 0, 5000);
      auto b = hal::Communicator::create(gloo().entry, &store.c, r, w, 0, 5000);
      if (!a.is_ok() || !b.is_ok()) {
        errors[r] = "create: " + (a.is_ok() ? b.status() : a.status()).to_string();
        return;
      }
      Values x(DType::kF32, 64, r + 1), y(DType::kF32, 64, 10 * (r + 1));
      // Interleaved on the two communicators.
      if (!b->all_reduce(y.data(), y.data(), 64, DType::kF32, KEEL_REDUCE_SUM).is_ok() ||
          !a->all_reduce(x.data(), x.data(), 64, DType::kF32, KEEL_REDUCE_SUM).is_ok()) {
        errors[r] = "all_reduce failed";
        return;
      }
      errors[r] = x.all_equal(6) + y.all_equal(60);
    });
  }
  for (auto& t : ranks) t.join();
  expect_no_errors(errors, "two communicators");
}

// A KvStore whose get of one key waits until the test opens the gate (or the get's own timeout passes).
struct GatedStore {
  KvStore inner;
  keel_kv_store_t c{};
  std::string gated_key;
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;

  explicit GatedStore(std::string key) : gated_key(std::move(key)) {
    c.struct_size = sizeof c;
    c.core_data = this;
    c.set = [](keel_kv_store_t* self, const char* key, const void* value, size_t size) -> keel_status_t {
      auto* s = static_cast<GatedStore*>(self->core_data);
      return s->inner.c.set(&s->inner.c, key, value, size);
    };
    c.get = [](keel_kv_store_t* self, const char* key, int64_t timeout_ms, const void** out,
               size_t* size) -> keel_status_t {
      auto* s = static_cast<GatedStore*>(self->core_data);
      if (s->gated_key == key) {
        std::unique_lock<std::mutex> lock(s->mu);
        if (!s->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms), [&] { return s->open; }))
          return make_c_status(KEEL_STATUS_DEADLINE_EXCEEDED, "the test kept the gate closed");
      }
      return s->inner.c.get(&s->inner.c, key, timeout_ms, out, size);
    };
  }
  void open_gate() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};

// Rank 0's message-mesh port (published under keel/gloo/0/mesh/0) refuses connections that do not greet as a rank of
// the world — a port scanner, a stale process: here one that sends an HTTP request line and one that says nothing —
// and goes on waiting for the real rank 1 (held back by the store until both were refused). When rank 1 does come,
// creation and an all-reduce succeed; when it never does, rank 0's timeout names the missing rank and what it refused.
TEST(GlooCollectives, StrangersOnTheMessageMeshPortAreRefused) {
  SKIP_WITHOUT_GLOO();
  for (const bool rank1_comes : {true, false}) {
    SCOPED_TRACE(rank1_comes ? "rank 1 comes" : "rank 1 never comes");
    GatedStore store("keel/gloo/0/mesh/0");
    std::vector<std::string> errors(2);
    std::vector<std::thread> ranks;
    for (int32_t r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        auto comm = hal::Communicator::create(gloo().entry, &store.c, r, 2, 0, rank1_comes ? 10000 : 2000);
        if (!comm.is_ok()) {
          errors[r] = "create: " + comm.status().to_string();
          return;
        }
        Values x(DType::kF32, 16, r + 1);
        Status s = comm->all_reduce(x.data(), x.data(), 16, DType::kF32, KEEL_REDUCE_SUM);
        errors[r] = s.is_ok() ? x.all_equal(3) : s.to_string();
      });
    }
    const void* v = nullptr;
    size_t n = 0;
    keel_status_t got = store.inner.c.get(&store.inner.c, "keel/gloo/0/mesh/0", 5000, &v, &n);
    ASSERT_EQ(got, nullptr) << "rank 0 never published its message-mesh address";
    sockaddr_storage addr{};
    ASSERT_LE(n, sizeof addr);
    std::memcpy(&addr, v, n);
    for (const bool says_nothing : {false, true}) {
      const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      ASSERT_GE(fd, 0);
      const timeval five{5, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &five, sizeof five);
      ASSERT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), static_cast<socklen_t>(n)), 0);
      if (says_nothing) {
        ::shutdown(fd, SHUT_WR);
      } else {
        const char junk[] = "GET / HTTP/1.1\r\n\r\n";
        ASSERT_GT(::send(fd, junk, sizeof junk - 1, MSG_NOSIGNAL), 0);
      }
      char byte = 0;
      EXPECT_LE(::recv(fd, &byte, 1, 0), 0) << "rank 0 answered a stranger";  // 0: closed; -1: reset
      ::close(fd);
    }
    if (rank1_comes) store.open_gate();
    for (auto& t : ranks) t.join();
    if (rank1_comes) {
      expect_no_errors(errors, "after two strangers");
    } else {
      std::printf("rank 0 sees: %s\n", errors[0].c_str());
      EXPECT_NE(errors[0].find("DEADLINE_EXCEEDED"), std::string::npos) << errors[0];
      EXPECT_NE(errors[0].find("rank(s) 1 did not connect in time (refused a connection from "), std::string::npos)
          << errors[0];
      EXPECT_NE(errors[1], "") << "rank 1 never got rank 0's address";
    }
  }
}

TEST(GlooCollectives, ARankThatNeverArrivesIsNamed) {
  SKIP_WITHOUT_GLOO();
  KvStore store;
  std::vector<Status> results(2);
  const auto t0 = Clock::now();
  std::vector<std::thread> ranks;
  for (int32_t r = 0; r < 2; ++r)  // rank 2 of 3 never comes
    ranks.emplace_back(
        [&, r] { results[r] = hal::Communicator::create(gloo().entry, &store.c, r, 3, 0, 1000).status(); });
  for (auto& t : ranks) t.join();
  const double s = seconds_since(t0);
  std::printf("rank 0 sees: %s\n", results[0].to_string().c_str());
  for (const Status& st : results) {
    EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.to_string();
    EXPECT_NE(st.message().find("rank 2 of 3 never arrived"), std::string::npos) << st.to_string();
  }
  EXPECT_LT(s, 3.0) << "the timeout is 1 s";
}

// Ranks 0..W-2 all-reduce while the last rank releases its communicator without joining: each gets an error naming
// the last rank, long before the 5 s timeout; later entries fail with FAILED_PRECONDITION.
TEST_P(GlooWorld, APeerThatLeavesMidCollectiveIsNamed) {
  SKIP_WITHOUT_GLOO();
  const int32_t w = GetParam();
  const int32_t leaver = w - 1;
  std::barrier all_failed(w);
  const auto t0 = Clock::now();
  auto errors = run_ranks(w, 5000, [&](int32_t r, hal::Communicator& comm) -> std::string {
    if (r == leaver) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      comm = hal::Communicator();  // releases: its connections close
      all_failed.arrive_and_wait();
      return "";
    }
    Values x(DType::kF32, 1 << 16, 1);
    Status s = comm.all_reduce(x.data(), x.data(), x.size(), DType::kF32, KEEL_REDUCE_SUM);
    all_failed.arrive_and_wait();  // keep every connection but the leaver's until all have failed
    if (s.is_ok()) return "all_reduce succeeded without rank " + std::to_string(leaver);
    if (r == 0) std::printf("rank 0 of %d sees: %s\n", w, s.to_string().c_str());
    if (s.message().find("connection to rank " + std::to_string(leaver) + " closed") == std::string::npos)
      return "the error does not name rank " + std::to_string(leaver) + ": " + s.to_string();
    Status again = comm.barrier();
    if (again.code() != StatusCode::kFailedPrecondition) return "after the error: " + again.to_string();
    return "";
  });
  expect_no_errors(errors, "a peer leaves");
  EXPECT_LT(seconds_since(t0), 4.0) << "the peer's connection closed: no need to wait for the 5 s timeout";
}

TEST(GlooCollectives, APeerThatNeverCallsTimesOutNamingIt) {
  SKIP_WITHOUT_GLOO();
  std::barrier done(2);
  const auto t0 = Clock::now();
  auto errors = run_ranks(2, 1000, [&](int32_t r, hal::Communicator& comm) -> std::string {
    std::string err;
    if (r == 0) {
      Values x(DType::kF32, 16, 1);
      Status s = comm.all_reduce(x.data(), x.data(), 16, DType::kF32, KEEL_REDUCE_SUM);
      std::printf("rank 0 sees: %s\n", s.to_string().c_str());
      if (s.code() != StatusCode::kDeadlineExceeded || s.message().find("waiting on rank 1") == std::string::npos)
        err = "want DEADLINE_EXCEEDED waiting on rank 1: " + s.to_string();
    }
    done.arrive_and_wait();  // rank 1 stays connected but silent until rank 0 has given up
    return err;
  });
  expect_no_errors(errors, "silent peer");
  EXPECT_LT(seconds_since(t0), 4.0) << "the timeout is 1 s";
}

// Rank 1 is another process (gloo_rank_helper) that connects and is then SIGKILLed before its first collective;
// rank 0's all-reduce fails naming it, bounded in time. The store is a directory.
TEST(GlooCollectives, APeerProcessKilledBeforeItsFirstCollective) {
  SKIP_WITHOUT_GLOO();
  const std::string helper = KEEL_GLOO_RANK_HELPER;
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("keel_gloo_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<std::string> args = {helper, dir.string(), "1", "2", "5000"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, helper.c_str(), nullptr, nullptr, argv.data(), environ), 0) << helper;
  FileStore store(dir.string());
  auto comm = hal::Communicator::create(gloo().entry, &store.c, 0, 2, 0, 5000);
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  const void* v = nullptr;
  size_t n = 0;
  keel_status_t ready = store.c.get(&store.c, "test/ready/1", 5000, &v, &n);
  ASSERT_EQ(ready, nullptr) << "the helper never connected";
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  const auto t0 = Clock::now();
  Values x(DType::kF32, 1 << 16, 1);
  Status s = comm->all_reduce(x.data(), x.data(), x.size(), DType::kF32, KEEL_REDUCE_SUM);
  std::printf("rank 0 sees: %s\n", s.to_string().c_str());
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("connection to rank 1 closed"), std::string::npos) << s.to_string();
  EXPECT_LT(seconds_since(t0), 4.0) << s.to_string();
  fs::remove_all(dir);
}

// Spawns gloo_rank_helper with `args` and extra environment entries; its stderr goes to `err_file`.
pid_t spawn_helper(const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
                   const std::string& err_file) {
  std::vector<std::string> a = args, e = extra_env;
  std::vector<char*> argv, envp;
  for (auto& s : a) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (char** p = environ; *p; ++p) envp.push_back(*p);
  for (auto& s : e) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, a[0].c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Rank 1 is another process (gloo_rank_helper loop) all-reducing 16 MiB (cross memory: both processes are on this
// host; the mesh ring where cross memory is off) with rank 0 again and again; after a few correct rounds it is
// SIGKILLed, most likely mid-collective. Rank 0's next all-reduce that fails names rank 1, within seconds, not the 10 s
// timeout.
TEST(GlooCollectives, APeerProcessKilledDuringLargeAllReducesIsNamed) {
  SKIP_WITHOUT_GLOO();
  const std::string helper = KEEL_GLOO_RANK_HELPER;
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("keel_gloo_ring_kill_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const pid_t pid = spawn_helper({helper, dir.string(), "1", "2", "10000", "loop"}, {}, (dir / "helper.err").string());
  ASSERT_GT(pid, 0) << helper;
  FileStore store(dir.string());
  auto comm = hal::Communicator::create(gloo().entry, &store.c, 0, 2, 0, 10000);
  ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
  std::vector<float> x(size_t{4} << 20);
  std::thread killer;
  Status s;
  Clock::time_point killed_at{};
  for (int round = 0; round < 1000; ++round) {
    if (round == 3)
      killer = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        killed_at = Clock::now();
        ::kill(pid, SIGKILL);
      });
    std::fill(x.begin(), x.end(), 1.f);
    s = comm->all_reduce(x.data(), x.data(), x.size(), DType::kF32, KEEL_REDUCE_SUM);
    if (!s.is_ok()) break;
    ASSERT_EQ(x[0], 3.f) << "round " << round;
    ASSERT_EQ(x.back(), 3.f) << "round " << round;
  }
  if (killer.joinable()) killer.join();
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::printf("rank 0 sees: %s\n", s.to_string().c_str());
  ASSERT_FALSE(s.is_ok()) << "1000 all-reduces succeeded after the peer was killed";
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_NE(s.message().find("connection to rank 1 closed"), std::string::npos) << s.to_string();
  EXPECT_LT(seconds_since(killed_at), 4.0) << s.to_string();
  EXPECT_EQ(comm->barrier().code(), StatusCode::kFailedPrecondition);
  fs::remove_all(dir);
}

// A fuzzer of the plugin across processes: each seed draws a world of 2-4 ranks, each its own process
// (gloo_rank_helper `script`), running the same random script of collectives (collective_script.h: every kind, dtype
// and algorithm, results checked exactly), and in three seeds of four one rank that dies at a random operation: it
// exits or is SIGKILLed before it, is SIGKILLed 0-2 ms after starting it, or stalls (alive, silent) before it. Every
// process but a stalled one must end within the timeout's reach (no hang), no operation may return a wrong element, a
// world without a death must finish, and a rank that fails must say which peer: its error names the stalled rank or
// one of the ranks that ended (the dead one, or one that failed before it), as "connection to rank R closed" or
// "waiting on rank R". KEEL_GLOO_SCRIPT_SEED / _COUNT pick the seeds
// (the test prints each seed's plan: a failure reruns alone with its seed and a count of 1).
TEST(GlooCollectives, RandomScriptsAcrossProcessesWithAPeerDyingAnywhere) {
  SKIP_WITHOUT_GLOO();
  const std::string helper = KEEL_GLOO_RANK_HELPER;
  namespace fs = std::filesystem;
  const char* env_seed = std::getenv("KEEL_GLOO_SCRIPT_SEED");
  const char* env_count = std::getenv("KEEL_GLOO_SCRIPT_COUNT");
  const uint64_t first = env_seed ? std::strtoull(env_seed, nullptr, 10) : 1;
  const uint64_t count = env_count ? std::strtoull(env_count, nullptr, 10) : 12;
  constexpr int64_t kTimeoutMs = 2500;
  for (uint64_t seed = first; seed < first + count; ++seed) {
    const int32_t w = 2 + static_cast<int32_t>(seed % 3);
    const auto script = keel::testing::make_script(seed, w);
    std::mt19937_64 rng(seed);
    const bool dies = rng() % 4 != 0;
    const int32_t victim = dies ? static_cast<int32_t>(rng() % static_cast<uint64_t>(w)) : -1;
    const size_t die_op = rng() % script.size();
    const char* hows[] = {"exit", "kill", "mid", "stall"};
    const std::string how = hows[rng() % 4];
    const std::string die = std::to_string(die_op) + ":" + how + ":" + std::to_string(rng() % 2000);
    std::string plan =
        "seed " + std::to_string(seed) + ": " + std::to_string(w) + " ranks, " + std::to_string(script.size()) + " ops";
    if (dies)
      plan += ", rank " + std::to_string(victim) + " dies at op " + std::to_string(die_op) + " (" + die + ": " +
              describe(script[die_op]) + ")";
    std::printf("%s\n", plan.c_str());
    SCOPED_TRACE(plan + "; rerun: KEEL_GLOO_SCRIPT_SEED=" + std::to_string(seed) +
                 " KEEL_GLOO_SCRIPT_COUNT=1 gloo_collectives_test --gtest_filter='*RandomScripts*'");
    const fs::path dir =
        fs::temp_directory_path() / ("keel_gloo_script_" + std::to_string(::getpid()) + "_" + std::to_string(seed));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::vector<pid_t> pids(static_cast<size_t>(w), -1);
    for (int32_t r = 0; r < w; ++r) {
      std::vector<std::string> env = {"KEEL_SCRIPT_SEED=" + std::to_string(seed)};
      if (r == victim) env.push_back("KEEL_SCRIPT_DIE=" + die);
      pids[static_cast<size_t>(r)] = spawn_helper(
          {helper, dir.string(), std::to_string(r), std::to_string(w), std::to_string(kTimeoutMs), "script"}, env,
          (dir / (std::to_string(r) + ".err")).string());
      ASSERT_GT(pids[static_cast<size_t>(r)], 0) << helper;
    }
    // Each rank fails at most once and then ends, which its peers see at once (a closed connection) or within the
    // timeout: every process ends within a timeout per rank plus the start-up.
    std::vector<int> code(static_cast<size_t>(w), -1);
    const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs * (w + 1) + 10000);
    size_t left = pids.size() - (how == "stall" && dies ? 1 : 0);  // a stalled rank is ended below
    while (left > 0 && Clock::now() < deadline) {
      for (size_t r = 0; r < pids.size(); ++r) {
        int status = 0;
        if (static_cast<int32_t>(r) == victim && how == "stall") continue;
        if (code[r] != -1 || ::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
        code[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --left;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::vector<std::string> err(static_cast<size_t>(w));
    for (size_t r = 0; r < pids.size(); ++r) {
      if (code[r] == -1) {  // a hang (or the stalled rank): end it
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        if (static_cast<int32_t>(r) == victim && how == "stall") code[r] = 128 + SIGKILL;
      }
      err[r] = read_file((dir / (std::to_string(r) + ".err")).string());
    }
    for (int32_t r = 0; r < w; ++r) {
      const auto i = static_cast<size_t>(r);
      EXPECT_NE(code[i], -1) << "rank " << r << " still running at the deadline: " << err[i];
      EXPECT_NE(code[i], 5) << "rank " << r << " got a wrong result: " << err[i];
      if (r == victim) {
        EXPECT_TRUE(code[i] == 9 || code[i] == 128 + SIGKILL || (how == "mid" && code[i] == 0))
            << "the dying rank " << r << " ended with " << code[i] << ": " << err[i];
        continue;
      }
      if (!dies) {
        EXPECT_EQ(code[i], 0) << "rank " << r << " (no rank dies): " << err[i];
        continue;
      }
      EXPECT_TRUE(code[i] == 0 || code[i] == 6) << "rank " << r << " ended with " << code[i] << ": " << err[i];
      if (code[i] != 6) continue;
      bool names_an_ended_rank = false;
      for (int32_t q = 0; q < w; ++q)
        if (q != r && code[static_cast<size_t>(q)] != 0 &&
            (err[i].find("connection to rank " + std::to_string(q) + " ") != std::string::npos ||
             err[i].find("waiting on rank " + std::to_string(q) + ")") != std::string::npos))
          names_an_ended_rank = true;
      EXPECT_TRUE(names_an_ended_rank) << "rank " << r << "'s error names no rank that ended: " << err[i];
    }
    fs::remove_all(dir);
    if (::testing::Test::HasFailure()) break;
  }
}

// Whether this environment lets a process read another's memory (process_vm_readv on a child that opened itself as
// the plugin does); empty when it does, else why not (a container's seccomp profile may forbid it).
std::string cross_memory_forbidden() {
  int ready[2], done[2];
  if (::pipe(ready) != 0 || ::pipe(done) != 0) return "pipe failed";
  static uint64_t word = 0;
  word = 0x6b65656c;
  const pid_t child = ::fork();
  if (child == 0) {
    ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    if (::read(done[0], &c, 1) < 0) ::_exit(1);
    ::_exit(0);
  }
  char c = 0;
  std::string why;
  if (child < 0 || ::read(ready[0], &c, 1) != 1) {
    why = "fork failed";
  } else {
    uint64_t got = 0;
    iovec l{&got, sizeof got}, r{&word, sizeof word};
    if (::process_vm_readv(child, &l, 1, &r, 1, 0) != static_cast<ssize_t>(sizeof got) || got != word)
      why = std::string("process_vm_readv: ") + std::strerror(errno);
  }
  if (child > 0) {
    if (::write(done[1], &c, 1) != 1) ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  }
  for (int fd : {ready[0], ready[1], done[0], done[1]}) ::close(fd);
  return why;
}

// Three ranks in three processes of this host: the communicators agree to read each other's memory (each rank's
// "xmem_ok" verdict in the store is yes, where this environment allows it) and large all-reduces (out of place, in
// place, sum, average, an element count that does not divide by 3) give every element right; with
// KEEL_GLOO_CROSS_MEMORY=off the same through the mesh ring, and no rank opens its memory (no verdicts).
// Whether this kernel lets a process take a duplicate of another's file descriptor (pidfd_getfd(2), Linux 5.6; the
// same permission as reading its memory, which cross_memory_forbidden checks): empty when it does, else why not.
std::string shared_memory_forbidden() {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  std::string why;
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0));
  if (pidfd < 0) {
    why = std::string("pidfd_open: ") + std::strerror(errno);
  } else {
    const int dup = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fds[0], 0));
    if (dup < 0) why = std::string("pidfd_getfd: ") + std::strerror(errno);
    if (dup >= 0) ::close(dup);
    ::close(pidfd);
  }
  ::close(fds[0]);
  ::close(fds[1]);
  return why;
}

TEST(GlooCollectives, CrossMemoryBetweenProcessesOfOneHost) {
  SKIP_WITHOUT_GLOO();
  namespace fs = std::filesystem;
  const std::string forbidden = cross_memory_forbidden();
  if (!forbidden.empty())
    std::printf("cross memory is forbidden here (%s): checking the mesh ring only\n", forbidden.c_str());
  const std::string no_shm = forbidden.empty() ? shared_memory_forbidden() : forbidden;
  if (!no_shm.empty()) std::printf("shared memory cannot be set up here (%s)\n", no_shm.c_str());
  // Cross memory and shared memory on, cross memory off (shared memory needs it), shared memory off alone.
  for (const int variant : {0, 1, 2}) {
    const bool off = variant == 1, shm_off = variant != 0;
    const fs::path dir =
        fs::temp_directory_path() / ("keel_gloo_xmem_" + std::to_string(::getpid()) + "_" + std::to_string(variant));
    fs::create_directories(dir);
    std::vector<pid_t> pids;
    for (int r = 0; r < 3; ++r) {
      pids.push_back(spawn_helper({KEEL_GLOO_RANK_HELPER, dir.string(), std::to_string(r), "3", "20000", "big"},
                                  {off ? "KEEL_GLOO_CROSS_MEMORY=off" : "KEEL_GLOO_CROSS_MEMORY=auto",
                                   variant == 2 ? "KEEL_GLOO_SHARED_MEMORY=off" : "KEEL_GLOO_SHARED_MEMORY=auto"},
                                  (dir / ("rank" + std::to_string(r) + ".err")).string()));
      ASSERT_GT(pids.back(), 0);
    }
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(wait_exit_code(pids[r]), 0) << read_file((dir / ("rank" + std::to_string(r) + ".err")).string());
    for (int r = 0; r < 3; ++r) {
      const fs::path verdict = dir / ("keel%gloo%0%xmem_ok%" + std::to_string(r));
      const fs::path shm = dir / ("keel%gloo%0%shm_ok%" + std::to_string(r));
      if (off) {
        EXPECT_FALSE(fs::exists(verdict)) << verdict;
      } else if (!forbidden.empty()) {
        EXPECT_EQ(read_file(verdict.string()), "0") << "rank " << r << " claims to read the others' memory";
      } else {
        EXPECT_EQ(read_file(verdict.string()), "1") << "rank " << r << " cannot read the others' memory";
      }
      if (shm_off || !forbidden.empty()) {
        EXPECT_FALSE(fs::exists(shm)) << shm;
      } else if (!no_shm.empty()) {
        EXPECT_EQ(read_file(shm.string()), "0") << "rank " << r << " claims to have mapped the shared memory";
      } else {
        EXPECT_EQ(read_file(shm.string()), "1") << "rank " << r << " did not map rank 0's shared memory";
      }
    }
    fs::remove_all(dir);
  }
}

// KEEL_GLOO_HOSTNAME=::1: two ranks (processes: the address is read once per process) on IPv6 loopback form a world
// — Gloo's pairs and the message mesh both — and an all-reduce of 1000 floats (direct, on the mesh) gives both the sum.
TEST(GlooCollectives, Ipv6Loopback) {
  SKIP_WITHOUT_GLOO();
  {
    const int probe = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    const bool ok = probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (probe >= 0) ::close(probe);
    if (!ok) GTEST_SKIP() << "no IPv6 loopback on this machine";
  }
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("keel_gloo_ipv6_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pids.push_back(spawn_helper({KEEL_GLOO_RANK_HELPER, dir.string(), std::to_string(r), "2", "10000", "allreduce"},
                                {"KEEL_GLOO_HOSTNAME=::1"}, (dir / ("rank" + std::to_string(r) + ".err")).string()));
    ASSERT_GT(pids.back(), 0);
  }
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(wait_exit_code(pids[r]), 0) << read_file((dir / ("rank" + std::to_string(r) + ".err")).string());
  fs::remove_all(dir);
}

// KEEL_GLOO_IFACE: a named interface ("lo") works against a rank on the default 127.0.0.1; an interface that does
// not exist is a clear error naming it, not a crash.
TEST(GlooCollectives, NamedInterface) {
  SKIP_WITHOUT_GLOO();
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("keel_gloo_iface_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    const std::string err = (dir / "lo.err").string();
    pid_t pid =
        spawn_helper({KEEL_GLOO_RANK_HELPER, dir.string(), "1", "2", "5000", "allreduce"}, {"KEEL_GLOO_IFACE=lo"}, err);
    ASSERT_GT(pid, 0);
    FileStore store(dir.string());
    auto comm = hal::Communicator::create(gloo().entry, &store.c, 0, 2, 0, 5000);
    ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
    std::vector<float> x(1000, 1.f);
    Status s = comm->all_reduce(x.data(), x.data(), x.size(), DType::kF32, KEEL_REDUCE_SUM);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(x[0], 3.f);
    EXPECT_EQ(wait_exit_code(pid), 0) << read_file(err);
  }
  {
    const fs::path sub = dir / "bad";
    fs::create_directories(sub);
    FileStore store(sub.string());
    const char one = 1;  // rank 0 "arrived", so the helper goes on to open its TCP device
    keel_status_release(store.c.set(&store.c, "keel/gloo/0/arrived/0", &one, 1));
    const std::string err = (dir / "bad.err").string();
    pid_t pid =
        spawn_helper({KEEL_GLOO_RANK_HELPER, sub.string(), "1", "2", "2000"}, {"KEEL_GLOO_IFACE=keelnosuch0"}, err);
    ASSERT_GT(pid, 0);
    EXPECT_EQ(wait_exit_code(pid), 4) << read_file(err);
    const std::string msg = read_file(err);
    EXPECT_NE(msg.find("UNAVAILABLE"), std::string::npos) << msg;
    EXPECT_NE(msg.find("interface 'keelnosuch0'"), std::string::npos) << msg;
    std::printf("a missing interface: %s", msg.c_str());
  }
  fs::remove_all(dir);
}

}  // namespace

}  // namespace keel
