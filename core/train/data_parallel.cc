#include "core/train/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

namespace keel::train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int64_t name_hash(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);
}

// A tensor's description for cross-rank comparison: name hash, dtype, rank, the first kMaxDims dims (a hash of the
// rest in the last slot).
constexpr size_t kMaxDims = 8;
constexpr size_t kSlots = 3 + kMaxDims + 1;

std::string describe(int64_t dtype, const int64_t* d) {
  const auto rank = static_cast<size_t>(d[0]);
  std::string s = std::string(dtype_name(static_cast<DType>(dtype))) + " [";
  for (size_t i = 0; i < std::min(rank, kMaxDims); ++i) s += (i ? ", " : "") + std::to_string(d[1 + i]);
  if (rank > kMaxDims) s += ", ...";
  return s + "]";
}

// A view of `t`'s storage: `shape` elements from element `offset` on (no copy, shares ownership).
Tensor flat_view(const Tensor& t, int64_t offset, const keel::Shape& shape) {
  const keel::Tensor& d = t.data();
  return Tensor(keel::Tensor(d.dtype(), shape, d.storage(),
                             d.byte_offset() + static_cast<uint64_t>(offset) * dtype_size(d.dtype())));
}

// The eager device ("cuda:1") whose memory a communicator's buffers must be in, or "" when that is host memory (Gloo
// on the CPU, a device of KEEL_DEVICE_CAP_UNIFIED_HOST_MEMORY).
std::string comm_device(const hal::Communicator& comm) {
  const std::string& type = comm.device_type();
  if (type.empty() || type == "cpu") return "";
  const DeviceEntry* entry = eager::environment().registry().device(type);
  if (entry != nullptr && hal::Device(entry, comm.device_index()).host_memory()) return "";
  return type + ":" + std::to_string(comm.device_index());
}

// The device of `p` when the communicator works on its type and it has streams and events (a GPU): there the
// all-reduces get a stream of their own.
std::optional<hal::Device> stream_device(const Tensor& p, const hal::Communicator& comm) {
  const Location& at = p.data().location();
  if (at.is_host() || at.device_type != comm.device_type()) return std::nullopt;
  const DeviceEntry* entry = eager::environment().registry().device(at.device_type);
  if (entry == nullptr) return std::nullopt;
  const hal::Device dev(entry, at.device_index);
  if (dev.host_memory() || !dev.can_wait_on_events()) return std::nullopt;
  return dev;
}

// `op(send, recv)`, a collective over small host arrays (the parameters' descriptions, the bucket order, metrics), on
// buffers the communicator can use: the arrays themselves for a host-memory one, copies on its device otherwise (NCCL
// reads and writes device memory only: a host pointer is an error, or worse). `recv` may be `send` (in place).
template <typename T>
Status host_collective(const hal::Communicator& comm, DType dtype, const std::vector<T>& send, std::vector<T>& recv,
                       const std::function<Status(const void*, void*)>& op) {
  const std::string dev = comm_device(comm);
  if (dev.empty() || (send.empty() && recv.empty())) return op(send.data(), recv.data());
  try {
    eager::NoGradGuard ng;
    const Tensor s = Tensor(keel::Tensor::from_vector(dtype, {static_cast<int64_t>(send.size())}, send)).to(dev);
    const Tensor r = &send == &recv ? s : eager::empty({static_cast<int64_t>(recv.size())}, dtype, dev);
    if (Status st = op(s.data().raw_data(), r.data().raw_data()); !st.is_ok()) return st;
    const Tensor back = r.to("cpu");  // complete on return
    if (!recv.empty()) std::memcpy(recv.data(), back.data().raw_data(), recv.size() * sizeof(T));
  } catch (const eager::Error& e) {
    return e.status().with_context("host values through " + dev);
  }
  return Status::ok();
}

Status tensor_broadcast(const hal::Communicator& comm, const Tensor& t, int32_t root) {
  if (!t.defined() || t.numel() == 0) return Status::ok();
  void* p = t.data().raw_data();
  return comm.broadcast(p, p, static_cast<uint64_t>(t.numel()), t.dtype(), root);
}

}  // namespace

// ------------------------------------------------------------------------------------------------ helpers

WaitSummary summarize_waits(std::vector<float> ms) {
  WaitSummary w;
  if (ms.empty()) return w;
  auto at = [&](size_t k) {
    std::nth_element(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(k), ms.end());
    return static_cast<double>(ms[k]);
  };
  const size_t n = ms.size();
  w.median = at(n / 2);
  w.p90 = at(std::min(n - 1, n * 9 / 10));
  w.max = at(n - 1);
  return w;
}

StatusOr<std::vector<double>> all_reduce_sum(const hal::Communicator& comm, std::vector<double> values) {
  if (comm.size() <= 1 || values.empty()) return values;
  KEEL_RETURN_IF_ERROR(host_collective(comm, DType::kF64, values, values,
                                       [&](const void* s, void* r) {
                                         return comm.all_reduce(s, r, values.size(), DType::kF64, KEEL_REDUCE_SUM);
                                       }),
                       "all-reduce of metrics");
  return values;
}

// Coalesced, as torch DDP's _broadcast_coalesced: tensors of one dtype and device travel in one flat buffer of up to
// 64 MiB, so a model's buffers (three per BatchNorm layer) cost one collective per dtype instead of one per tensor.
Status broadcast_tensors(const hal::Communicator& comm, const std::vector<Tensor>& tensors, int32_t root) {
  if (comm.size() <= 1) return Status::ok();
  constexpr uint64_t kCoalesceBytes = uint64_t{64} << 20;
  std::vector<bool> sent(tensors.size(), false);
  try {
    // The broadcast writes into them: deferred convolutions that read them see their values from before.
    for (const Tensor& t : tensors) eager::compute_deferred(t);
    eager::NoGradGuard ng;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (sent[i]) continue;
      const Tensor& first = tensors[i];
      if (!first.defined() || first.numel() == 0) continue;
      // The group: this tensor and the next ones of its dtype and device, in order, up to the cap (the same on every
      // rank: the lists agree in dtypes and shapes).
      std::vector<size_t> group;
      uint64_t bytes = 0;
      int64_t total = 0;
      for (size_t j = i; j < tensors.size(); ++j) {
        const Tensor& t = tensors[j];
        if (sent[j] || !t.defined() || t.numel() == 0 || t.dtype() != first.dtype() || t.device() != first.device())
          continue;
        const uint64_t b = static_cast<uint64_t>(t.numel()) * dtype_size(t.dtype());
        if (!group.empty() && bytes + b > kCoalesceBytes) break;
        group.push_back(j);
        sent[j] = true;
        bytes += b;
        total += t.numel();
      }
      const std::string what = "broadcast of tensor " + std::to_string(i) +
                               (group.size() > 1 ? " and " + std::to_string(group.size() - 1) + " more" : "");
      if (group.size() == 1) {
        KEEL_RETURN_IF_ERROR(tensor_broadcast(comm, first, root), what);
        continue;
      }
      Tensor flat = eager::empty({total}, first.dtype(), first.device());
      int64_t offset = 0;
      if (comm.rank() == root)
        for (size_t j : group) {
          flat_view(flat, offset, tensors[j].shape()).copy_(tensors[j]);
          offset += tensors[j].numel();
        }
      KEEL_RETURN_IF_ERROR(tensor_broadcast(comm, flat, root), what);
      offset = 0;
      if (comm.rank() != root)
        for (size_t j : group) {
          Tensor dst = tensors[j];
          dst.copy_(flat_view(flat, offset, tensors[j].shape()));
          offset += tensors[j].numel();
        }
    }
  } catch (const eager::Error& e) {
    return e.status().with_context("broadcast of tensors");
  }
  return Status::ok();
}

Tensor all_reduce_sum(const Tensor& x, const hal::Communicator& comm) {
  // t summed over the ranks into a new tensor on t's device.
  auto summed = [&comm](const keel::Tensor& t) {
    keel::Tensor out = eager::empty(t.shape(), t.dtype(), Tensor(t).device()).data();
    if (t.numel() > 0) {
      Status st =
          comm.all_reduce(t.raw_data(), out.raw_data(), static_cast<uint64_t>(t.numel()), t.dtype(), KEEL_REDUCE_SUM);
      if (!st.is_ok()) throw eager::Error(st.with_context("all_reduce_sum"));
    }
    return out;
  };
  return eager::custom_function(x, summed, summed, "AllReduceSumBackward");
}

int sync_batch_norm(nn::Module& module, const hal::Communicator& comm) {
  int n = 0;
  if (auto* bn = dynamic_cast<nn::BatchNorm2D*>(&module)) {
    bn->set_stats_reducer([&comm](const Tensor& t) { return all_reduce_sum(t, comm); });
    ++n;
  }
  for (const auto& [name, child] : module.named_children()) n += sync_batch_norm(*child, comm);
  return n;
}

Status check_same_across_ranks(const hal::Communicator& comm, const std::vector<std::pair<std::string, Tensor>>& named,
                               const std::string& what) {
  const int32_t world = comm.size(), me = comm.rank();
  if (world <= 1) return Status::ok();
  const int64_t n = static_cast<int64_t>(named.size());
  std::vector<int64_t> counts(static_cast<size_t>(world));
  auto all_gather = [&](const std::vector<int64_t>& mine, std::vector<int64_t>& all) {
    return host_collective(comm, DType::kI64, mine, all,
                           [&](const void* s, void* r) { return comm.all_gather(s, r, mine.size(), DType::kI64); });
  };
  KEEL_RETURN_IF_ERROR(all_gather({n}, counts), what + " count");
  for (int32_t r = 1; r < world; ++r) {
    if (counts[static_cast<size_t>(r)] != counts[0])
      return invalid_argument("DataParallel: rank 0 has " + std::to_string(counts[0]) + " " + what + "s, rank " +
                              std::to_string(r) + " has " + std::to_string(counts[static_cast<size_t>(r)]));
  }
  if (n == 0) return Status::ok();
  std::vector<int64_t> mine(static_cast<size_t>(n) * kSlots, 0);
  for (size_t i = 0; i < named.size(); ++i) {
    int64_t* d = &mine[i * kSlots];
    const Tensor& t = named[i].second;
    d[0] = name_hash(named[i].first);
    d[1] = t.defined() ? static_cast<int64_t>(t.dtype()) : 0;
    const Shape s = t.defined() ? t.shape() : Shape{};
    d[2] = static_cast<int64_t>(s.size());
    int64_t rest = 0;
    for (size_t k = 0; k < s.size(); ++k) {
      if (k < kMaxDims) d[3 + k] = s[k];
      else rest = rest * 1000003 + s[k] + 1;
    }
    d[kSlots - 1] = rest;
  }
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(world));
  KEEL_RETURN_IF_ERROR(all_gather(mine, all), what + " shapes");
  for (size_t i = 0; i < named.size(); ++i) {
    const int64_t* d0 = &all[i * kSlots];
    for (int32_t r = 1; r < world; ++r) {
      const int64_t* dr = &all[static_cast<size_t>(r) * mine.size() + i * kSlots];
      if (std::equal(d0, d0 + kSlots, dr)) continue;
      const std::string name =
          "'" + named[i].first + "'" + (me == 0 || me == r ? "" : " (as named on rank " + std::to_string(me) + ")");
      if (d0[0] != dr[0])
        return invalid_argument("DataParallel: " + what + " #" + std::to_string(i) + " " + name +
                                " has another name on rank " + std::to_string(r) + " than on rank 0");
      return invalid_argument("DataParallel: " + what + " " + name + " differs between ranks: rank 0 has " +
                              describe(d0[1], d0 + 2) + ", rank " + std::to_string(r) + " has " +
                              describe(dr[1], dr + 2));
    }
  }
  return Status::ok();
}

// ------------------------------------------------------------------------------------------------ DataParallel

DataParallel::DataParallel(nn::Module& module, const hal::Communicator& comm, DataParallelOptions options)
    : module_(module), comm_(comm), opts_(options) {}

StatusOr<std::unique_ptr<DataParallel>> DataParallel::create(nn::Module& module, const hal::Communicator& comm,
                                                             DataParallelOptions options) {
  if (!(options.bucket_cap_mb > 0))
    return invalid_argument("DataParallel: bucket_cap_mb must be > 0, got " + std::to_string(options.bucket_cap_mb));
  if (options.grad_compress != DType::kUndefined && options.grad_compress != DType::kBF16 &&
      options.grad_compress != DType::kF16)
    return invalid_argument(std::string("DataParallel: grad_compress must be bf16 or f16, got ") +
                            dtype_name(options.grad_compress));
  // Parameters in a device's memory must be in the communicator's device's (NCCL reads and writes the memory of the
  // device it was made for; cuda:1's buffers handed to a communicator of cuda:0 fail there, or worse): checked before
  // the first collective (the other ranks' first collective then fails or times out).
  for (const auto& [name, p] : module.named_parameters()) {
    const Location& at = p.data().location();
    if (!at.is_host() && at.device_type == comm.device_type() && at.device_index != comm.device_index())
      return invalid_argument("DataParallel: parameter '" + name + "' is on " + at.device_type + ":" +
                              std::to_string(at.device_index) + " but the communicator works on " + comm.device_type() +
                              ":" + std::to_string(comm.device_index()));
  }
  std::unique_ptr<DataParallel> dp(new DataParallel(module, comm, options));
  dp->rank_ = comm.rank();
  dp->world_ = comm.size();
  dp->params_ = module.parameters();
  KEEL_RETURN_IF_ERROR(check_same_across_ranks(comm, module.named_parameters(), "parameter"), "DataParallel");
  KEEL_RETURN_IF_ERROR(check_same_across_ranks(comm, module.named_buffers(), "buffer"), "DataParallel");
  {
    eager::NoGradGuard ng;
    KEEL_RETURN_IF_ERROR(broadcast_tensors(comm, dp->params_, 0), "DataParallel: parameters from rank 0");
    std::vector<Tensor> buffers;
    for (auto& [n, b] : module.named_buffers()) buffers.push_back(b);
    KEEL_RETURN_IF_ERROR(broadcast_tensors(comm, buffers, 0), "DataParallel: buffers from rank 0");
  }

  // The communication stream, on the device of the first trained parameter (stream_device).
  const auto trained =
      std::find_if(dp->params_.begin(), dp->params_.end(), [](const Tensor& p) { return p.requires_grad(); });
  if (const auto dev = trained == dp->params_.end() ? std::nullopt : stream_device(*trained, comm)) {
    auto stream = dev->create_stream();
    if (!stream.is_ok()) return stream.status().with_context("DataParallel: communication stream on " + dev->name());
    dp->comm_device_ = dev;
    dp->comm_stream_ = std::move(stream).value();
  }
  // Initial buckets: reverse parameter order (backward reaches the last layers first).
  std::vector<size_t> order;
  for (size_t i = dp->params_.size(); i-- > 0;)
    if (dp->params_[i].requires_grad()) order.push_back(i);
  KEEL_RETURN_IF_ERROR(dp->build_buckets(order), "DataParallel");
  dp->ready_.assign(dp->params_.size(), false);
  DataParallel* self = dp.get();
  try {
    for (size_t i = 0; i < dp->params_.size(); ++i) {
      if (!dp->params_[i].requires_grad()) {
        dp->hooks_.push_back(0);
        continue;
      }
      dp->hooks_.push_back(
          dp->params_[i].register_post_accumulate_grad_hook([self, i](const Tensor&) { self->on_grad_ready(i); }));
    }
  } catch (const eager::Error& e) {
    return e.status().with_context("DataParallel: gradient hooks");
  }
  dp->thread_ = std::thread([self] { self->comm_loop(); });
  return dp;
}

DataParallel::~DataParallel() {
  for (size_t i = 0; i < hooks_.size(); ++i)
    if (hooks_[i]) params_[i].remove_post_accumulate_grad_hook(hooks_[i]);
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_work_.notify_all();
    thread_.join();  // an all-reduce in flight ends (or times out) in the communicator
  }
  settle_comm_stream();  // the buckets' memory goes back to the device's pool with the members
}

Status DataParallel::build_buckets(const std::vector<size_t>& order, const std::vector<bool>& split_after) {
  const auto cap = static_cast<uint64_t>(opts_.bucket_cap_mb * 1024.0 * 1024.0);
  buckets_.clear();
  bucket_of_.assign(params_.size(), SIZE_MAX);
  uint64_t bytes = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    const Tensor& p = params_[i];
    const uint64_t b = p.data().byte_size();
    bool fresh = buckets_.empty() || bytes + b > cap || (k > 0 && k - 1 < split_after.size() && split_after[k - 1]);
    if (!fresh) {
      const Tensor& first = params_[buckets_.back().params.front()];
      fresh = first.dtype() != p.dtype() || first.device() != p.device();
    }
    if (fresh && !(buckets_.empty() || buckets_.back().params.empty())) {
      buckets_.emplace_back();
      bytes = 0;
    }
    if (buckets_.empty()) buckets_.emplace_back();
    buckets_.back().params.push_back(i);
    bucket_of_[i] = buckets_.size() - 1;
    bytes += b;
  }
  // Each bucket's buffer: every slice starts at a 64-byte boundary (the alignment of a fresh tensor), so the .grad
  // views handed out by finish() are as aligned as any other tensor.
  try {
    for (auto& bk : buckets_) {
      bk.pending = bk.params.size();
      const Tensor& first = params_[bk.params.front()];
      const DType wire = wire_dtype(first.dtype());
      const auto align = static_cast<int64_t>(std::max<size_t>(1, 64 / dtype_size(wire)));
      int64_t n = 0;
      for (size_t i : bk.params) {
        bk.offsets.push_back(n);
        n += (params_[i].numel() + align - 1) / align * align;
      }
      bk.numel = n;
      const Location& at = first.data().location();
      bk.on_comm_stream =
          comm_device_ && at.device_type == comm_device_->type() && at.device_index == comm_device_->index();
      if (bk.on_comm_stream) {
        for (hal::Event* e : {&bk.filled, &bk.reduced}) {
          auto made = comm_device_->create_event();
          if (!made.is_ok()) throw eager::Error(made.status().with_context("event on " + comm_device_->name()));
          *e = std::move(made).value();
        }
      }
    }
  } catch (const eager::Error& e) {
    buckets_.clear();  // no bucket to fill: the hooks ignore every gradient, and finish() has nothing to wait for
    bucket_of_.assign(params_.size(), SIZE_MAX);
    return e.status().with_context("gradient buckets");
  }
  return Status::ok();
}

std::vector<std::vector<size_t>> DataParallel::bucket_layout() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

void DataParallel::on_grad_ready(size_t i) {
  if (!sync_ || bucket_of_[i] == SIZE_MAX) return;
  if (ready_[i]) return;  // a second backward before finish(): its gradient was added to .grad already, not resent
  ready_[i] = true;
  any_ready_ = true;
  if (!rebuilt_ && opts_.rebuild_buckets) {
    if (ready_order_.empty()) ready_t0_ = Clock::now();
    ready_order_.push_back(i);
    ready_times_.push_back(seconds_since(ready_t0_));
  }
  Bucket& b = buckets_[bucket_of_[i]];
  if (--b.pending == 0) launch_ready_buckets();
}

// Buckets start in index order on every rank (collectives pair up by order): a bucket that fills early waits for the
// buckets before it. A launch that throws (no memory for the buffer, a failed copy) leaves its bucket next in line:
// finish() tries it again or abandons the step.
void DataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(buckets_[next_launch_]);
    ++next_launch_;
  }
}

void DataParallel::launch(Bucket& b) {
  // This step's buffer, fresh (the last step's lives on in the .grad views handed out): the padding between the
  // slices zeroed (in host memory directly; a device buffer is zeroed whole, one memset there), then the bucket's
  // gradients copied in (zeros for a parameter without a gradient in this step).
  const Tensor& first = params_[b.params.front()];
  const DType wire = wire_dtype(first.dtype());
  const bool host = first.data().location().is_host();
  b.flat = host ? eager::empty({b.numel}, wire, first.device()) : eager::zeros({b.numel}, wire, first.device());
  if (host) {
    char* base = static_cast<char*>(b.flat.data().raw_data());
    const size_t esize = dtype_size(wire);
    for (size_t k = 0; k < b.params.size(); ++k) {
      const int64_t end = b.offsets[k] + params_[b.params[k]].numel();
      const int64_t next = k + 1 < b.params.size() ? b.offsets[k + 1] : b.numel;
      if (next > end) std::memset(base + end * esize, 0, static_cast<size_t>(next - end) * esize);
    }
  }
  for (size_t k = 0; k < b.params.size(); ++k) {
    const Tensor& p = params_[b.params[k]];
    Tensor slice = flat_view(b.flat, b.offsets[k], p.shape());
    const Tensor g = p.grad();
    slice.copy_(g.defined() ? g : eager::zeros(p.shape(), p.dtype(), p.device()));
  }
  if (b.on_comm_stream) {
    Status st = comm_device_->record_event(b.filled, nullptr);
    if (!st.is_ok()) throw eager::Error(st.with_context("DataParallel: bucket event"));
    comm_unwaited_ = true;
  }
  b.launched = true;
  {
    std::lock_guard<std::mutex> lk(mu_);
    b.done = false;
    b.status = Status::ok();
    queue_.push_back(&b);
  }
  // The last bucket fills at the end of backward, just before finish(): finish() runs it on this thread unless the
  // communication thread is still busy with an earlier one (then that thread takes it next) — waking an idle thread
  // for it would cost two hand-offs, which on a loaded machine are a scheduler's time slice each.
  if (&b != &buckets_.back()) cv_work_.notify_one();
}

// Runs one queued bucket's all-reduce (the caller popped it and set busy_ under mu_).
void DataParallel::run_bucket(Bucket* b) {
  auto t0 = Clock::now();
  // On the communication stream: after the bucket was filled, and marking when the result is there.
  const keel_stream_t stream = b->on_comm_stream ? comm_stream_.get() : nullptr;
  Status st = b->on_comm_stream ? comm_device_->wait_event(stream, b->filled) : Status::ok();
  if (st.is_ok())
    st = comm_.all_reduce(b->flat.data().raw_data(), b->flat.data().raw_data(),  // in place
                          static_cast<uint64_t>(b->flat.numel()), b->flat.dtype(), KEEL_REDUCE_AVG, stream);
  if (st.is_ok() && b->on_comm_stream) st = comm_device_->record_event(b->reduced, stream);
  const double dt = seconds_since(t0);
  bool more = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    b->status = std::move(st);
    b->done = true;
    busy_ = false;
    comm_seconds_ += dt;
    more = !queue_.empty() || stop_;
  }
  cv_done_.notify_all();
  // The communication thread waits for a bucket to run (or the stop): woken only when there is one. Waking it after
  // every bucket finish() ran itself cost a futex call and two context switches on the rank's core every step
  // (2 ranks of SimpleCNN: one wake per step on each, for nothing).
  if (more) cv_work_.notify_all();
}

void DataParallel::comm_loop() {
  for (;;) {
    Bucket* b;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return (stop_ && !busy_) || (!queue_.empty() && !busy_); });
      if (queue_.empty()) return;  // stop_ and nothing left
      b = queue_.front();
      queue_.pop_front();
      busy_ = true;
    }
    run_bucket(b);
  }
}

// Where a step ends without the default stream's wait for the communication stream (an error), the host waits for
// it instead: the buckets' buffers go back to the device's pool, whose next user must not meet an all-reduce still
// writing them.
void DataParallel::settle_comm_stream() {
  if (comm_device_ && comm_unwaited_) (void)comm_stream_.synchronize();
  comm_unwaited_ = false;
}

DType DataParallel::wire_dtype(DType d) const {
  const bool wide_float = d == DType::kF32 || d == DType::kF64;
  return opts_.grad_compress != DType::kUndefined && wide_float ? opts_.grad_compress : d;
}

// A step that ends in an error: the communication thread finishes the bucket it runs (its collective ends, or times
// out in the communicator) and runs none of those still queued, the communication stream settles, and the next step
// starts clean. Before, an error thrown while finish() launched a bucket reset the buckets at once: their buffers
// could go while the communication thread still all-reduced one, and buckets left in the queue ran again at the next
// step, out of step with the other ranks' collectives.
void DataParallel::abandon_step() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    queue_.clear();
    cv_done_.wait(lk, [&] { return !busy_; });
  }
  settle_comm_stream();
  reset_step();
}

void DataParallel::reset_step() {
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
    b.done = false;
    b.flat = Tensor();  // the .grad views keep it alive as long as they are used
  }
  std::fill(ready_.begin(), ready_.end(), false);
  next_launch_ = 0;
  any_ready_ = false;
}

Status DataParallel::finish() {
  if (!sync_) return Status::ok();
  if (last_finish_ != Clock::time_point{}) {
    stats_.compute_seconds += seconds_since(last_finish_);
    ++stats_.compute_steps;
  }
  try {
    eager::NoGradGuard ng;
    // Buckets still waiting for a gradient: zero-fill those parameters and start them now.
    for (auto& b : buckets_) {
      if (b.pending > 0) b.pending = 0;
    }
    launch_ready_buckets();
    auto t0 = Clock::now();
    Status first_error;
    {
      // Collectives run one at a time, in bucket order: buckets still queued when the communication thread is idle
      // run here (saves two thread hand-offs for the last bucket, which backward usually launches just before).
      std::unique_lock<std::mutex> lk(mu_);
      for (;;) {
        bool all_done = true;
        for (const auto& b : buckets_) all_done = all_done && (!b.launched || b.done);
        if (all_done) break;
        if (!queue_.empty() && !busy_) {
          Bucket* b = queue_.front();
          queue_.pop_front();
          busy_ = true;
          lk.unlock();
          run_bucket(b);
          lk.lock();
          continue;
        }
        cv_done_.wait(lk);
      }
      stats_.all_reduce_seconds += comm_seconds_;
      comm_seconds_ = 0;
      for (const auto& b : buckets_)
        if (!b.status.is_ok() && first_error.is_ok()) first_error = b.status;
    }
    // What eager queues next on the device (the optimizer step) waits there for the all-reduces.
    for (const auto& b : buckets_)
      if (first_error.is_ok() && b.launched && b.on_comm_stream)
        first_error = comm_device_->wait_event(nullptr, b.reduced);
    if (first_error.is_ok()) comm_unwaited_ = false;
    const double waited = seconds_since(t0);
    stats_.wait_seconds += waited;
    stats_.step_wait_ms.push_back(static_cast<float>(waited * 1e3));
    if (!first_error.is_ok()) {
      abandon_step();
      return first_error.with_context("DataParallel: gradient all-reduce");
    }
    // Each parameter's .grad becomes a view of its slice of the averaged buffer (back in the parameters' dtype when
    // it travelled compressed).
    for (auto& b : buckets_) {
      stats_.bytes += b.flat.data().byte_size();
      ++stats_.all_reduces;
      const DType own = params_[b.params.front()].dtype();
      const Tensor averaged = b.flat.dtype() == own ? b.flat : b.flat.to(own);
      for (size_t k = 0; k < b.params.size(); ++k) {
        Tensor& p = params_[b.params[k]];
        p.set_grad(flat_view(averaged, b.offsets[k], p.shape()));
      }
    }
  } catch (const eager::Error& e) {
    abandon_step();
    return e.status().with_context("DataParallel: finish");
  }
  ++stats_.steps;
  reset_step();
  last_finish_ = Clock::now();
  if (opts_.rebuild_buckets && !rebuilt_) {
    if (stats_.steps >= 2) return rebuild();
    ready_order_.clear();  // observe the next (steady) step
    ready_times_.clear();
  }
  return Status::ok();
}

Status DataParallel::rebuild() {
  rebuilt_ = true;
  // Rank 0 decides: its ready order, and split points after the longest gaps between two ready gradients.
  // Encoded per position as index + (split << 32); -1 past the gradients that were ready.
  std::vector<int64_t> code(params_.size(), -1);
  std::vector<bool> split(ready_order_.size(), false);
  if (opts_.gap_split > 0 && ready_times_.size() >= 2) {
    const double span = ready_times_.back() - ready_times_.front();
    std::vector<std::pair<double, size_t>> gaps;
    for (size_t k = 0; k + 1 < ready_times_.size(); ++k) {
      const double gap = ready_times_[k + 1] - ready_times_[k];
      if (span > 0 && gap >= opts_.gap_split * span) gaps.emplace_back(gap, k);
    }
    std::sort(gaps.rbegin(), gaps.rend());
    const auto min_bytes = static_cast<uint64_t>(opts_.gap_split_min_mb * 1024.0 * 1024.0);
    int taken = 0;
    for (const auto& [gap, k] : gaps) {
      if (taken >= opts_.max_gap_splits) break;
      uint64_t bytes = 0;  // the bucket this split would end: back to the previous split
      for (size_t j = k + 1; j-- > 0;) {
        if (j < k && split[j]) break;
        bytes += params_[ready_order_[j]].data().byte_size();
      }
      if (bytes < min_bytes) continue;
      split[k] = true;
      ++taken;
    }
  }
  for (size_t k = 0; k < ready_order_.size(); ++k)
    code[k] = static_cast<int64_t>(ready_order_[k]) | (split[k] ? (int64_t{1} << 32) : 0);
  KEEL_RETURN_IF_ERROR(
      host_collective(comm_, DType::kI64, code, code,
                      [&](const void* s, void* r) { return comm_.broadcast(s, r, code.size(), DType::kI64, 0); }),
      "DataParallel: bucket order from rank 0");
  std::vector<size_t> order;
  std::vector<bool> split_after;
  std::vector<bool> seen(params_.size(), false);
  for (int64_t c : code) {
    if (c < 0) continue;
    const auto i = static_cast<size_t>(c & 0xffffffff);
    if (i >= params_.size() || seen[i] || !params_[i].requires_grad()) continue;
    seen[i] = true;
    order.push_back(i);
    split_after.push_back((c >> 32) & 1);
  }
  for (size_t i = params_.size(); i-- > 0;) {  // never ready: last, in reverse parameter order
    if (!seen[i] && params_[i].requires_grad()) {
      order.push_back(i);
      split_after.push_back(false);
    }
  }
  return build_buckets(order, split_after);
}

Status DataParallel::broadcast_buffers() {
  if (world_ <= 1) return Status::ok();
  std::vector<Tensor> buffers;
  for (auto& [n, b] : module_.named_buffers()) buffers.push_back(b);
  if (buffers.empty()) return Status::ok();
  auto t0 = Clock::now();
  Status st = broadcast_tensors(comm_, buffers, 0);
  stats_.broadcast_seconds += seconds_since(t0);
  return st.is_ok() ? st : st.with_context("DataParallel: buffers from rank 0");
}

Tensor DataParallel::forward(const Tensor& x) {
  if (any_ready_ || next_launch_ > 0)
    throw eager::Error(failed_precondition(
        "DataParallel: forward() on rank " + std::to_string(rank_) +
        " while the previous backward's gradients are not synchronised: call finish() after backward"));
  if (opts_.broadcast_buffers && module_.is_training()) {
    Status st = broadcast_buffers();
    if (!st.is_ok()) throw eager::Error(st);
  }
  return module_.forward(x);
}

}  // namespace keel::train
