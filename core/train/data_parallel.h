// keel/core/train/data_parallel.h — data-parallel training over a communicator (torch DDP, paddle.DataParallel).
//
// Every rank holds a replica of the model, trains on its own shard of each batch (DataLoaderOptions::num_replicas /
// rank, or DistributedSampler) and, after backward, holds the gradient averaged over all ranks, so every replica
// takes the same optimizer step and the replicas stay equal.
//
//   DataParallel::create(model, comm)   checks that every rank has the same parameters and buffers (names, dtypes,
//                                       shapes; a mismatch is an error naming the tensor and the ranks) and
//                                       broadcasts their values from rank 0.
//   dp(x) / dp.forward(x)               the module's forward; in training mode first broadcasts the buffers from
//                                       rank 0 (BatchNorm statistics stay consistent: DDP's broadcast_buffers),
//                                       coalesced into one broadcast per dtype (broadcast_tensors below).
//   loss.backward()                     a post-accumulate-grad hook on every parameter marks its gradient ready;
//                                       once all gradients of a bucket are ready (buckets launch in bucket order,
//                                       the same on every rank) they are copied into the bucket's flat buffer and a
//                                       background communication thread all-reduces it while backward goes on.
//   dp.finish()                         waits for every bucket and sets each parameter's .grad to the averaged
//                                       gradient (sum / world size). Call it before the optimizer step.
//                                       On a GPU the all-reduces are queued on a communication stream (torch
//                                       DDP's NCCL stream) and finish() returns once they are queued: eager's
//                                       default stream waits for them on the device, not the host.
//
// Buckets: gradients are grouped, in reverse parameter order (backward's usual order), into flat buffers of at most
// bucket_cap_mb (25 MiB; a larger parameter gets a bucket of its own; a bucket holds one dtype and device). Each step a
// bucket takes a fresh flat buffer from its device's pool (every parameter's slice starting at a 64-byte boundary, the
// padding zeroed), so a step costs one copy per gradient into it; the all-reduce averages (KEEL_REDUCE_AVG) it in
// place, and after finish() the parameters' .grad are views into it (so a .grad kept by the caller is never
// overwritten by a later step). The gradients thus take twice their size at most, the autograd ones and the buffers
// (torch DDP's default; three times before the buffers were averaged in place).
// With grad_compress (bf16 / f16) the buffers hold that dtype: each gradient is rounded into its slice, and finish()
// casts the averaged buffer back to the parameters' dtype (one more pass) before handing out the views.
// After the second synchronised step (the first one creates kernels, so its timing is not typical) the buckets are
// rebuilt once from the order in which that step's gradients became ready, so the first bucket fills first, and a
// bucket also ends where backward spent long between two gradients (a gap of at least gap_split of the backward's span:
// e.g. the Linear layers' gradients before the convolutions' backward), so its all-reduce overlaps that compute even
// when everything fits one bucket (only after at least gap_split_min_mb of gradients: a call's latency costs more
// than overlapping a smaller transfer saves). Rank 0's order and split points are broadcast, so every rank agrees.
// Parameters without a gradient in a step (unused by that forward on some rank): at finish() their contribution is
// zero-filled, so the step never hangs; afterwards their .grad holds the average of the ranks that had one (zeros
// when no rank had one; an optimizer then applies weight decay / momentum to them, as torch DDP with
// find_unused_parameters does). Their bucket only starts at finish(), without overlap.
// no_sync(): while the guard lives, backward accumulates local gradients without communication (gradient
// accumulation); the first backward after it synchronises the accumulated sum. Run forward *and* backward inside it.
// World size 1: a pass-through (no hooks, no thread, finish() returns at once).
// Learning rate: DataParallel leaves the optimizer alone (as torch DDP): a step averages world × batch images, so a
// rate tuned for one process at that batch usually wants scaling (linear for SGD, √ for Adam); `keel train`'s
// --lr-scaling does it (docs/PERFORMANCE_HISTORY.md, data-parallel: 2 ranks of the LeNet-like model end 1 epoch 1.8
// points lower unscaled). Scheduling: the overlap needs the communication thread (and any I/O thread of the collective
// plugin; the Gloo plugin's all-reduces run on the calling thread, Gloo's own bcube and ring on its device loop) to run
// while backward computes. Under the normal policy they preempt it when a message arrives. Under a real-time policy
// (`chrt -f`) with one core per rank (keel launch pins ranks) threads of equal priority run until they block, so every
// bucket's all-reduce waits for finish() (2026-12-03, LeNet-like, 2 ranks under `chrt -f 10`: all-reduce 2.30 s per
// epoch, all of it waited after backward). Raising those threads above the compute thread is no cure: Gloo's loop
// thread polls without blocking while a pair's lock is held elsewhere or a message waits for its receive, and above a
// compute thread pinned to the same core it starves it for good (tried: ranks livelocked in their first collective).
//
// Errors: create() and finish() return a Status (a peer failing or timing out is reported by the communicator with
// the rank); forward() throws eager::Error like any module, e.g. when finish() was not called after a backward.
// Thread-safety: one training thread drives a DataParallel (forward, backward, finish); the communication thread is
// internal. The communicator is used by this object alone while it lives (collectives must be issued in the same
// order on every rank): do not call it from elsewhere between create() and destruction, except through the helpers
// below from the training thread after finish().
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/train/nn.h"
#include "hal/device.h"

namespace keel::train {

struct DataParallelOptions {
  double bucket_cap_mb = 25;      // bucket size cap in MiB (> 0)
  bool broadcast_buffers = true;  // forward() in training mode broadcasts the module's buffers from rank 0
  bool rebuild_buckets = true;    // rebuild the buckets once from an observed backward's ready order and timing
  double gap_split = 0.15;      // rebuild: split after a gradient followed by a gap >= this share of backward (0: off)
  int max_gap_splits = 3;       // rebuild: at most this many such splits (the longest gaps)
  double gap_split_min_mb = 1;  // rebuild: only where the bucket before the split holds at least this many MiB
                                // (smaller ones cost a call's latency more than their transfer saves)
  // All-reduce f32 / f64 gradients in this 16-bit dtype (DType::kBF16 or kF16): half the bytes to send for a rounding
  // of each gradient to it, and of their average (torch DDP's bf16_compress_hook / fp16_compress_hook, Paddle fleet's
  // fp16_allreduce). The averaged gradients come back in the parameters' dtype. kUndefined: their own dtype.
  DType grad_compress = DType::kUndefined;
};

// Communication accounting since creation or the last reset_stats() (e.g. per epoch).
struct DataParallelStats {
  int64_t steps = 0;              // synchronised finish() calls
  int64_t all_reduces = 0;        // bucket all-reduces
  uint64_t bytes = 0;             // gradient bytes all-reduced (per rank; compressed, with grad_compress)
  double all_reduce_seconds = 0;  // time spent inside all-reduce calls (on a GPU: queuing them on the stream)
  double wait_seconds = 0;        // time finish() blocked on all-reduces still in flight (the part not overlapped)
  double broadcast_seconds = 0;   // buffer broadcasts in forward()
  // This rank's own work between two synchronised steps (from one finish()'s return to the next finish() call: data,
  // forward, backward, optimizer), over `compute_steps` such intervals. Every step waits for the slowest rank, so
  // comparing it across ranks tells an unequal rank (a slower core, a busy neighbour) from slow communication.
  double compute_seconds = 0;
  int64_t compute_steps = 0;
  // What finish() blocked in each synchronised step, in ms (wait_seconds step by step; 4 bytes a step until
  // reset_stats()). On the rank that arrives last a step's wait is the synchronisation itself, so the median on the
  // ranks is its floor; the tail is a rank that fell behind (a busy neighbour, a stall of its core, a slow transfer).
  // Measured 2026-12-03, SimpleCNN on 2 ranks x 1 thread: a median of 0.2-0.3 ms against 8-9 ms of work a step, and
  // single steps of 10-34 ms where one rank fell behind and both lost the time (docs/PERFORMANCE_HISTORY.md,
  // data-parallel).
  std::vector<float> step_wait_ms;
};

// Median, 90th percentile and largest of `ms` (all 0 when empty): a DataParallelStats::step_wait_ms summary.
struct WaitSummary {
  double median = 0, p90 = 0, max = 0;
};
WaitSummary summarize_waits(std::vector<float> ms);

class DataParallel {
 public:
  // `module` and `comm` must outlive the DataParallel. Move the module to its device first. Collective: every rank
  // calls create() with the same structure of module.
  static StatusOr<std::unique_ptr<DataParallel>> create(nn::Module& module, const hal::Communicator& comm,
                                                        DataParallelOptions options = {});
  // Removes the hooks; waits for an all-reduce in flight, then stops the communication thread.
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  // Waits for the all-reduces of this step (starting those whose buckets are not yet complete, zero-filled) and
  // writes the averaged gradients into .grad. No-op inside no_sync(). A communicator of one rank takes the same
  // path (identity all-reduces), as torch DDP does: `keel launch --nproc-per-node 1` exercises it.
  Status finish();

  // While alive, backward does not synchronise gradients (see above). Nestable.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DataParallel& dp) : dp_(dp), prev_(dp.sync_) { dp.sync_ = false; }
    ~NoSyncGuard() { dp_.sync_ = prev_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DataParallel& dp_;
    bool prev_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // Broadcasts the module's buffers from rank 0 (what forward() does in training mode).
  Status broadcast_buffers();

  nn::Module& module() { return module_; }
  int32_t rank() const { return rank_; }
  int32_t world_size() const { return world_; }
  const DataParallelStats& stats() const { return stats_; }
  // Also forgets when the last step ended: the next interval counted starts at the next finish().
  void reset_stats() {
    stats_ = {};
    last_finish_ = {};
  }

  // Introspection (tests, logs): each bucket's parameters (indices into module.parameters()) in launch order; whether
  // the buckets were rebuilt; the order (parameter indices) in which gradients became ready in the last
  // synchronised backward before the rebuild.
  std::vector<std::vector<size_t>> bucket_layout() const;
  // Whether the all-reduces run on a communication stream of the device (a GPU) rather than its default stream.
  bool uses_comm_stream() const { return comm_device_.has_value(); }
  bool buckets_rebuilt() const { return rebuilt_; }
  const std::vector<size_t>& observed_ready_order() const { return ready_order_; }

 private:
  struct Bucket {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;  // element offset of each parameter's slice in flat (64-byte aligned)
    int64_t numel = 0;             // flat's elements, padding included
    size_t pending = 0;            // gradients not yet ready in this step
    bool launched = false;
    // This step's buffer (a fresh one each step, from the device's pool): the gradients copied in, then averaged in
    // place by the all-reduce; the .grad views finish() hands out point into it.
    Tensor flat;
    // Set by the communication thread under mu_.
    bool done = false;
    Status status;
    // On the communication stream (below): recorded on the device's default stream once the bucket is filled (the
    // all-reduce waits for it), and on the communication stream after the all-reduce (the default stream waits for
    // it in finish()).
    bool on_comm_stream = false;
    hal::Event filled, reduced;
  };

  DataParallel(nn::Module& module, const hal::Communicator& comm, DataParallelOptions options);
  // Buckets over `order`; split_after[k]: end a bucket after order[k] (empty: none).
  Status build_buckets(const std::vector<size_t>& order, const std::vector<bool>& split_after = {});
  Status rebuild();
  void on_grad_ready(size_t param);
  void launch_ready_buckets();
  void launch(Bucket& b);
  void comm_loop();
  void run_bucket(Bucket* b);
  void reset_step();
  void abandon_step();  // an error ended the step: the communication thread idle, its queue dropped, then reset_step
  void settle_comm_stream();
  // The dtype a bucket of parameters of dtype `d` is all-reduced in (grad_compress applied).
  DType wire_dtype(DType d) const;

  nn::Module& module_;
  const hal::Communicator& comm_;
  DataParallelOptions opts_;
  // A device with streams and events (a GPU): the buckets on it are all-reduced on a stream of their own, so NCCL's
  // transfers overlap the backward kernels that eager queues on the device's default stream (one stream would run
  // them one after the other); ordered by each bucket's two events. Absent on the CPU (Gloo) and on a device without
  // events: collectives take the default stream.
  std::optional<hal::Device> comm_device_;
  hal::Stream comm_stream_;
  bool comm_unwaited_ = false;  // all-reduces queued on it that the default stream has not been made to wait for
  int32_t rank_ = 0, world_ = 1;
  std::vector<Tensor> params_;
  std::vector<int64_t> hooks_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<bool> ready_;
  size_t next_launch_ = 0;
  bool any_ready_ = false;
  bool sync_ = true;
  bool rebuilt_ = false;
  std::vector<size_t> ready_order_;
  std::vector<double> ready_times_;  // seconds since the step's first ready gradient, parallel to ready_order_
  std::chrono::steady_clock::time_point ready_t0_;
  DataParallelStats stats_;
  std::chrono::steady_clock::time_point last_finish_{};  // when the last synchronised finish() returned (epoch: none)

  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::deque<Bucket*> queue_;
  bool stop_ = false;
  bool busy_ = false;        // an all-reduce is running (on the communication thread or in finish())
  double comm_seconds_ = 0;  // accumulated by the communication thread under mu_
  std::thread thread_;
};

// --- helpers for data-parallel loops (collective: every rank calls them in the same order) ---------------------------
// Host values (metrics, descriptions, DataParallel's bucket order) reach a communicator whose buffers must be device
// memory (NCCL: Communicator::device_type "cuda") through a copy on its device and back; a host-memory one (Gloo)
// reads them where they are.

// Sums a small vector over the ranks (metrics: loss sums, correct and example counts). Every rank passes the same
// length (else the communicator's error).
StatusOr<std::vector<double>> all_reduce_sum(const hal::Communicator& comm, std::vector<double> values);
// Broadcasts every tensor's values from rank `root` into the others' tensors in place (same shapes and dtypes).
// Tensors of one dtype and device travel together in one flat buffer of up to 64 MiB (torch DDP's
// _broadcast_coalesced): 2 ranks over Gloo, 60 tensors of 1 KB took 5.6-7.5 ms one by one, 0.10-0.13 ms as one.
Status broadcast_tensors(const hal::Communicator& comm, const std::vector<Tensor>& tensors, int32_t root = 0);
// A differentiable sum over the ranks: every rank gets the sum of every rank's `x` (same shape and dtype everywhere),
// and in backward x's gradient is the sum of every rank's gradient of the result (torch.distributed.nn's all_reduce).
// The communicator's collectives run on the calling thread.
Tensor all_reduce_sum(const Tensor& x, const hal::Communicator& comm);
// SyncBatchNorm (torch.nn.SyncBatchNorm.convert_sync_batchnorm, paddle.nn.SyncBatchNorm): every BatchNorm2D in
// `module` takes its training statistics over all ranks' batches (BatchNorm2D::set_stats_reducer with
// all_reduce_sum over `comm`), so that small per-rank batches normalise as one large batch. Give it a communicator
// of its own, not the DataParallel's: those all-reduces run on DataParallel's thread during backward while these run
// on the training thread, and collectives of one communicator must come in the same order on every rank.
// `comm` must outlive the module's use. Returns how many layers it set.
int sync_batch_norm(nn::Module& module, const hal::Communicator& comm);
// Checks that every rank holds the same list of named tensors (count, names, dtypes, shapes); the error names the
// first tensor that differs and the two ranks, with both shapes. `what` names the list ("parameter", "buffer").
Status check_same_across_ranks(const hal::Communicator& comm, const std::vector<std::pair<std::string, Tensor>>& named,
                               const std::string& what);

}  // namespace keel::train
