// gloo_rank_helper — one rank of a Gloo communicator in its own process, for gloo_collectives_test's multi-process
// cases: `gloo_rank_helper STORE_DIR RANK SIZE TIMEOUT_MS [allreduce]` creates its communicator through a
// directory-backed store (FileStore), announces "test/ready/<rank>", then waits (up to the timeout) to be killed; with
// `allreduce` it instead all-reduces (sum) 1000 floats of value rank+1 and checks the result; with `loop` it announces
// itself, then all-reduces 16 MiB of rank+1 (cross memory between processes of one host, else the mesh ring) again and
// again, checking each result, until one fails (for a test to kill it mid-collective); with `big` it all-reduces
// 1,000,003 floats out of place (sum) and 700,001 doubles in place (average), rank-dependent values, and checks every
// element. Exit codes: 0 fine (or the wait ran out), 2 bad arguments, 3 the plugin is
// missing, 4 the communicator could not be created, 5 the all-reduce failed or was wrong.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tests/collectives/collective_test_util.h"

int main(int argc, char** argv) {
  const std::string mode = argc == 6 ? argv[5] : "";
  if (argc != 5 && !(argc == 6 && (mode == "allreduce" || mode == "loop" || mode == "big"))) {
    std::fprintf(stderr, "usage: %s STORE_DIR RANK SIZE TIMEOUT_MS [allreduce|loop|big]\n", argv[0]);
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
