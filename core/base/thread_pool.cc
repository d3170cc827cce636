#include "core/base/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <exception>

namespace keel {

namespace {
thread_local bool t_inside_pool = false;
}

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

ThreadPool::ThreadPool(int threads) {
  threads_ = threads > 0 ? threads : available_cpus();
  for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker() {
  t_inside_pool = true;
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (stop_ && tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  int64_t chunks = std::min<int64_t>(threads_, (n + min_chunk - 1) / min_chunk);
  if (chunks <= 1 || t_inside_pool) {
    fn(0, n);
    return;
  }
  int64_t per = (n + chunks - 1) / chunks;
  // The completion state lives on this frame, so a worker may touch it only while holding `done.mu`: the count is
  // decremented and the waiter notified under the lock, and the waiter can observe zero only after the last worker
  // has released it. Nothing of this frame is used after that unlock.
  struct Completion {
    std::mutex mu;
    std::condition_variable cv;
    int64_t remaining;
    std::exception_ptr error;  // the first chunk's exception, rethrown to the caller after every chunk is done
  } done;
  done.remaining = chunks - 1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t c = 1; c < chunks; ++c) {
      int64_t b = c * per, e = std::min(n, b + per);
      tasks_.emplace_back([&fn, &done, b, e] {
        std::exception_ptr error;
        try {
          if (b < e) fn(b, e);
        } catch (...) {
          error = std::current_exception();
        }
        std::lock_guard<std::mutex> l(done.mu);
        // Handed over (or dropped) under the lock: the exception's last reference may be the caller's.
        if (error && !done.error) done.error = std::move(error);
        error = nullptr;
        if (--done.remaining == 0) done.cv.notify_one();
      });
    }
  }
  cv_.notify_all();
  bool was_inside = t_inside_pool;
  t_inside_pool = true;
  std::exception_ptr error;
  try {
    fn(0, std::min(n, per));
  } catch (...) {
    error = std::current_exception();
  }
  t_inside_pool = was_inside;
  std::unique_lock<std::mutex> lock(done.mu);
  done.cv.wait(lock, [&] { return done.remaining == 0; });
  if (!error) error = done.error;
  lock.unlock();
  if (error) std::rethrow_exception(error);
}

}  // namespace keel
