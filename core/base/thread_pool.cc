#include "core/base/thread_pool.h"

#include <algorithm>
#include <atomic>

namespace keel {

namespace {
thread_local bool t_inside_pool = false;
}

ThreadPool::ThreadPool(int threads) {
  threads_ = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
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
  std::atomic<int64_t> remaining{chunks - 1};
  std::mutex done_mu;
  std::condition_variable done_cv;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t c = 1; c < chunks; ++c) {
      int64_t b = c * per, e = std::min(n, b + per);
      tasks_.emplace_back([&, b, e] {
        if (b < e) fn(b, e);
        if (remaining.fetch_sub(1) == 1) {
          std::lock_guard<std::mutex> l(done_mu);
          done_cv.notify_one();
        }
      });
    }
  }
  cv_.notify_all();
  bool was_inside = t_inside_pool;
  t_inside_pool = true;
  fn(0, std::min(n, per));
  t_inside_pool = was_inside;
  std::unique_lock<std::mutex> lock(done_mu);
  done_cv.wait(lock, [&] { return remaining.load() == 0; });
}

}  // namespace keel
