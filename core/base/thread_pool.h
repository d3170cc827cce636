// keel/core/base/thread_pool.h — a fixed pool of worker threads for kernels' parallel_for.
//
// parallel_for splits [0, n) into at most thread_count() chunks of at least min_chunk, runs one on the calling
// thread and the rest on workers, and returns when all are done. Nested calls (from inside a chunk) run inline.
// An exception thrown by a chunk is rethrown to the caller once every chunk has finished (the first one wins);
// no state of the caller is touched after parallel_for returns.
// Thread-safe: several threads may call parallel_for at once; their chunks share the workers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace keel {

// The CPUs this process may run on (its affinity mask, as `keel launch` or taskset set it), at least 1; falls back to
// std::thread::hardware_concurrency() where the mask cannot be read. Thread-safe.
int available_cpus();

class ThreadPool {
 public:
  // threads = total parallelism including the caller; 0 = available_cpus().
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int thread_count() const { return threads_; }
  void parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker();
  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
};

}  // namespace keel
