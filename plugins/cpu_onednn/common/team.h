// plugins/cpu_onednn/common/team.h — (internal) how the plugin's own loops split their work over an OpenMP team
// (the int8 quantization and depthwise loops, the fused stem convolution + pooling, the training kernels' loops).
#pragma once

#include <omp.h>

#include <cstdint>

namespace keel::onednn {

// Calls f(t, begin, end) once per thread t of a team of `team` OpenMP threads, with contiguous ranges [begin, end)
// that cover [0, n) in the order of t; team <= 1: f(0, 0, n) on the calling thread. Thread-safe as f is for
// disjoint ranges.
template <class F>
void split_over_team(int64_t n, int team, F&& f) {
  if (team <= 1) return f(int64_t{0}, int64_t{0}, n);
#pragma omp parallel num_threads(team)
  {
    const int64_t t = omp_get_thread_num(), k = omp_get_num_threads();
    f(t, n * t / k, n * (t + 1) / k);
  }
}

// f(i) for every i in [0, n), split over the OpenMP team as `#pragma omp parallel for schedule(static)` would, but on
// the calling thread alone when the team is one thread: an OpenMP region costs a futex call even then (libgomp wakes
// its barrier's waiters unconditionally), 1.2 µs on this project's VMs, a few times every training step of a 1-thread
// data-parallel rank or serving instance. Thread-safe as f is for distinct i.
template <class F>
void parallel_for(int64_t n, F&& f) {
  if (n <= 1 || omp_get_max_threads() <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) f(i);
}

}  // namespace keel::onednn
