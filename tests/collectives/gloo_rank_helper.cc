// gloo_rank_helper — one rank of a Gloo communicator in its own process, for gloo_collectives_test's multi-process
// cases: `gloo_rank_helper STORE_DIR RANK SIZE TIMEOUT_MS [allreduce]` creates its communicator through a
// directory-backed store (FileStore), announces "test/ready/<rank>", then waits (up to the timeout) to be killed; with
// `allreduce` it instead all-reduces (sum) 1000 floats of value rank+1 and checks the result; with `loop` it announces
// itself, then all-reduces 16 MiB of rank+1 (cross memory between processes of one host, else the mesh ring) again and
// again, checking each result, until one fails (for a test to kill it mid-collective); with `big` it all-reduces
// 1,000,003 floats out of place (sum) and 700,001 doubles in place (average), then 300 small ones (1-50,000 floats),
// rank-dependent values, and checks every element. Exit codes: 0 fine (or the wait ran out), 2 bad arguments, 3 the
// plugin is missing, 4 the communicator could not be created, 5 the all-reduce failed or was wrong. With `script` it
// runs the random script of collectives of $KEEL_SCRIPT_SEED (collective_script.h) and, where $KEEL_SCRIPT_DIE is
// "OP:HOW:DELAY_US", dies at operation OP: HOW "exit" (exit code 9 before it), "kill" (SIGKILL before it), "mid"
// (SIGKILL DELAY_US after starting it) or "stall" (sleeps 60 s before it, then exits 9); exit codes then: 0 every
// operation ran right, 5 one gave a wrong element, 6 one returned an error (printed on stderr, with the operation's
// index).
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/collectives/collective_script.h"
#include "tests/collectives/collective_test_util.h"

namespace {

int run_script(const keel::hal::Communicator& comm) {
  const char* seed = std::getenv("KEEL_SCRIPT_SEED");
  const char* die = std::getenv("KEEL_SCRIPT_DIE");
  const auto script = keel::testing::make_script(std::strtoull(seed ? seed : "1", nullptr, 10), comm.size());
  long die_op = -1, delay_us = 0;
  char how[8] = "";
  if (die && *die && std::sscanf(die, "%ld:%7[a-z]:%ld", &die_op, how, &delay_us) != 3) return 2;
  for (size_t k = 0; k < script.size(); ++k) {
    if (static_cast<long>(k) == die_op) {
      if (std::strcmp(how, "exit") == 0) std::_Exit(9);
      if (std::strcmp(how, "kill") == 0) ::raise(SIGKILL);
      if (std::strcmp(how, "stall") == 0) {  // alive but silent: its peers must time out naming it
        std::this_thread::sleep_for(std::chrono::seconds(60));
        std::_Exit(9);
      }
      std::thread([delay_us] {
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
        ::raise(SIGKILL);
      }).detach();
    }
    const std::string got = keel::testing::run_script_op(comm, script[k]);
    if (!got.empty()) {
      std::fprintf(stderr, "gloo_rank_helper: rank %d: op %zu: %s\n", comm.rank(), k, got.c_str());
      return got.rfind("wrong", 0) == 0 ? 5 : 6;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 6 ? argv[5] : "";
  if (argc != 5 && !(argc == 6 && (mode == "allreduce" || mode == "loop" || mode == "big" || mode == "script"))) {
    std::fprintf(stderr, "usage: %s STORE_DIR RANK SIZE TIMEOUT_MS [allreduce|loop|big|script]\n", argv[0]);
    return 2;
  }
  const int32_t rank = std::atoi(argv[2]), size = std::atoi(argv[3]);
  const int64_t timeout_ms = std::atoll(argv[4]);
  auto& g = keel::testing::gloo();
  if (!g.entry) {
    std::fprintf(stderr, "gloo_rank_helper: %s\n", g.why.c_str());
    return 3;
  }
  keel::testing::FileStore store(argv[1]);
  auto comm = keel::hal::Communicator::create(g.entry, &store.c, rank, size, 0, timeout_ms);
  if (!comm.is_ok()) {
    std::fprintf(stderr, "gloo_rank_helper: rank %d: %s\n", rank, comm.status().to_string().c_str());
    return 4;
  }
  const char one = 1;
  if (mode == "script") return run_script(*comm);
  if (mode == "loop") {
    keel_status_release(store.c.set(&store.c, ("test/ready/" + std::to_string(rank)).c_str(), &one, 1));
    std::vector<float> x(size_t{4} << 20);
    for (;;) {
      std::fill(x.begin(), x.end(), static_cast<float>(rank + 1));
      keel::Status s = comm->all_reduce(x.data(), x.data(), x.size(), keel::DType::kF32, KEEL_REDUCE_SUM);
      if (!s.is_ok() || x[0] != size * (size + 1) / 2.f || x.back() != x[0]) {
        std::fprintf(stderr, "gloo_rank_helper: rank %d: all_reduce: %s\n", rank, s.to_string().c_str());
        return 5;
      }
    }
  }
  if (mode == "big") {
    std::vector<float> in(1000003), out(in.size(), -1.f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(rank + 1 + static_cast<int>(i % 5));
    keel::Status s = comm->all_reduce(in.data(), out.data(), in.size(), keel::DType::kF32, KEEL_REDUCE_SUM);
    for (size_t i = 0; s.is_ok() && i < out.size(); ++i)
      if (out[i] != static_cast<float>(size * (size + 1) / 2 + size * static_cast<int>(i % 5))) {
        std::fprintf(stderr, "gloo_rank_helper: rank %d: sum element %zu is %g\n", rank, i, out[i]);
        return 5;
      }
    std::vector<double> d(700001);
    for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<double>(rank) * 2 + static_cast<double>(i % 3);
    if (s.is_ok()) s = comm->all_reduce(d.data(), d.data(), d.size(), keel::DType::kF64, KEEL_REDUCE_AVG);
    for (size_t i = 0; s.is_ok() && i < d.size(); ++i)
      if (d[i] != static_cast<double>(size - 1) + static_cast<double>(i % 3)) {
        std::fprintf(stderr, "gloo_rank_helper: rank %d: average element %zu is %g\n", rank, i, d[i]);
        return 5;
      }
    // Then many small all-reduces one after another (between the processes of one host: the shared-memory path,
    // its two buffers taking turns), of 1 to 50,000 floats, in place and not, sums and averages.
    const size_t sizes[] = {1, 1000, 50000, 7, 33333};
    for (int k = 0; s.is_ok() && k < 300; ++k) {
      const size_t n = sizes[k % 5];
      const bool in_place = k % 2 == 0, avg = k % 3 == 0;
      std::vector<float> a(n), b(n, -1.f);
      for (size_t i = 0; i < n; ++i) a[i] = static_cast<float>(rank * 4 + k % 7 + static_cast<int>(i % 3));
      float* dst = in_place ? a.data() : b.data();
      s = comm->all_reduce(a.data(), dst, n, keel::DType::kF32, avg ? KEEL_REDUCE_AVG : KEEL_REDUCE_SUM);
      for (size_t i = 0; s.is_ok() && i < n; ++i) {
        // sum over ranks of rank * 4 + k % 7 + i % 3 (small integers: exact in f32)
        const float sum = static_cast<float>(2 * size * (size - 1) + size * (k % 7 + static_cast<int>(i % 3)));
        const float want = avg ? sum / static_cast<float>(size) : sum;
        if (dst[i] != want) {
          std::fprintf(stderr, "gloo_rank_helper: rank %d: small all-reduce %d element %zu is %g, want %g\n", rank, k,
                       i, dst[i], want);
          return 5;
        }
      }
    }
    if (!s.is_ok()) {
      std::fprintf(stderr, "gloo_rank_helper: rank %d: all_reduce: %s\n", rank, s.to_string().c_str());
      return 5;
    }
    return 0;
  }
  if (mode == "allreduce") {
    std::vector<float> x(1000, static_cast<float>(rank + 1));
    keel::Status s = comm->all_reduce(x.data(), x.data(), x.size(), keel::DType::kF32, KEEL_REDUCE_SUM);
    if (!s.is_ok() || x[0] != size * (size + 1) / 2.f || x[999] != x[0]) {
      std::fprintf(stderr, "gloo_rank_helper: rank %d: all_reduce: %s (got %g)\n", rank, s.to_string().c_str(), x[0]);
      return 5;
    }
    return 0;
  }
  keel_status_release(store.c.set(&store.c, ("test/ready/" + std::to_string(rank)).c_str(), &one, 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
  return 0;
}
