// Deferred convolutions (eager_internal.h, "deferred convs"): conv2d() on the CPU returns a pending tensor, so that
// a relu() over it and a max_pool2d() over that run as the fused conv2d_relu / conv2d_relu_max_pool2d. PaddlePaddle's
// introductory SimpleCNN written as a user writes it (Conv2D, ReLU and MaxPool2D called one after the other in
// forward) spent 3.3x the time of the fused layer on this host: the convolution's 5.5 MB output written, rectified,
// pooled and read back by three backward kernels, where the fused op pools it where it is made.
//
// Life of a pending tensor: made by defer_conv2d (or defer_relu from one), registered in the process's list; computed
// by need() at its first use other than a shape query, by compute_pending_reading() before a write into memory it
// reads, or by eager::compute_deferred(); or never, when it dies unread (the usual fate of the intermediate values of
// `pool(relu(conv(x)))`). A relu whose convolution was computed first (read on its own) reads it; the other way
// round (the relu's value computed fused, then the convolution's read) the convolution runs twice, the price of not
// knowing, when the relu is needed, whether its input will be. KEEL_EAGER_DEFER=0 turns deferral off (A/B comparisons,
// bisecting).
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/runtime/eager_internal.h"

namespace keel::eager {

using namespace detail;

namespace detail {
namespace {

thread_local int t_no_defer = 0;
// Every thread's pending tensors (and some already computed or dead, pruned as the list grows): a deferred value
// handed to another thread must still be computed before a write there into what it reads.
// Never destroyed (as the runtime: tensors may outlive static destruction).
struct PendingList {
  std::mutex mu;
  std::vector<std::weak_ptr<TensorImpl>> list;  // under mu
  // list.size(), readable without mu: copy_ and every optimizer step ask, and the list is empty most of the time
  // (pruned at each walk; a training step's intermediates are dead by then).
  std::atomic<size_t> size{0};
};
PendingList& pending_list() {
  static auto* p = new PendingList();
  return *p;
}

bool defer_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KEEL_EAGER_DEFER");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// Whether this thread's state allows deferring (and fusing) at all.
bool may_defer() { return defer_enabled() && t_no_defer == 0 && t_tracer == nullptr; }

// The call state a pending tensor was made under is this thread's now (a relu or a pooling over it may join it).
bool same_state(const DeferredConv& d) { return d.grad_enabled == t_grad_enabled && d.autocast == t_autocast; }

bool is_pending(const Tensor& t) { return t.defined() && t.impl()->pending.load(std::memory_order_acquire); }

// An operand the deferred call takes: on the host, f32 (or, under autocast, already in its dtype).
bool takes(const Tensor& t) {
  return t.device() == "cpu" &&
         (t.dtype() == DType::kF32 || (t_autocast != DType::kUndefined && t.dtype() == t_autocast));
}

// Under pending_list().mu.
void prune() {
  PendingList& l = pending_list();
  std::erase_if(l.list, [](const std::weak_ptr<TensorImpl>& w) {
    auto p = w.lock();
    return !p || !p->pending.load(std::memory_order_acquire);
  });
  l.size.store(l.list.size(), std::memory_order_relaxed);
}

// The pending tensors of the list (pruned), for `keep` to choose from; computed by the caller, outside the lock.
template <class Keep>
std::vector<std::shared_ptr<TensorImpl>> pending_where(Keep keep) {
  std::vector<std::shared_ptr<TensorImpl>> out;
  if (pending_list().size.load(std::memory_order_relaxed) == 0) return out;
  std::lock_guard<std::mutex> lock(pending_list().mu);
  for (const auto& wp : pending_list().list)
    if (auto p = wp.lock(); p && p->pending.load(std::memory_order_acquire) && keep(*p)) out.push_back(std::move(p));
  prune();
  return out;
}

// A relu's convolution computed already (its own tensor read): the relu and what follows read it, rather than
// computing the convolution a second time in a fused op.
bool conv_computed(const DeferredConv& d) {
  auto c = d.conv.lock();
  return c && !c->pending.load(std::memory_order_acquire);
}

Tensor make_pending(std::shared_ptr<DeferredConv> d, bool requires_grad) {
  auto impl = std::make_shared<TensorImpl>();
  impl->deferred = std::move(d);
  impl->requires_grad = requires_grad;
  impl->pending.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(pending_list().mu);
  if (pending_list().list.size() >= 32) prune();
  pending_list().list.push_back(impl);
  pending_list().size.store(pending_list().list.size(), std::memory_order_relaxed);
  return Tensor(impl);
}

// The thread's grad mode, tracer and autocast set as a deferred call found them, restored on exit.
class CallState {
 public:
  explicit CallState(const DeferredConv& d) : grad_(t_grad_enabled), tracer_(t_tracer), autocast_(t_autocast) {
    t_grad_enabled = d.grad_enabled;
    t_tracer = nullptr;
    t_autocast = d.autocast;
  }
  ~CallState() {
    t_grad_enabled = grad_;
    t_tracer = tracer_;
    t_autocast = autocast_;
  }
  CallState(const CallState&) = delete;
  CallState& operator=(const CallState&) = delete;

 private:
  bool grad_;
  Tracer::Impl* tracer_;
  DType autocast_;
};

}  // namespace

NoDeferGuard::NoDeferGuard() { ++t_no_defer; }
NoDeferGuard::~NoDeferGuard() { --t_no_defer; }

Tensor defer_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, std::array<int64_t, 2> stride,
                    std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  // Only what the fused ops take, and only calls that are certain to succeed (shapes checked here: a call that would
  // fail runs now and reports its error where it was made).
  if (!may_defer() || !x.defined() || !w.defined() || !takes(x) || !takes(w) || (b.defined() && !takes(b))) return {};
  if (x.rank() != 4 || w.rank() != 4 || groups < 1) return {};
  const Shape& xs = x.shape();
  const Shape& ws = w.shape();
  const int64_t n = xs[0], c = xs[1], m = ws[0];
  if (n < 1 || c < 1 || m < 1 || c % groups != 0 || m % groups != 0 || ws[1] * groups != c) return {};
  if (b.defined() && (b.rank() != 1 || b.numel() != m)) return {};
  Shape y{n, m, 0, 0};
  for (int a = 0; a < 2; ++a) {
    const int64_t k = ws[2 + a];
    if (k < 1 || stride[a] < 1 || dilation[a] < 1 || padding[a] < 0) return {};
    const int64_t span = xs[2 + a] + 2 * padding[a] - dilation[a] * (k - 1) - 1;
    if (span < 0) return {};
    y[2 + a] = span / stride[a] + 1;
  }
  auto d = std::make_shared<DeferredConv>();
  d->x = x;
  d->w = w;
  d->b = b;
  d->stride = stride;
  d->padding = padding;
  d->dilation = dilation;
  d->groups = groups;
  d->grad_enabled = t_grad_enabled;
  d->autocast = t_autocast;
  d->shape = y;
  // Conv's output dtype: autocast's where a kernel takes the call in it as well as in f32, else f32 (apply's rule).
  d->dtype = autocast_runs_low("", "Conv", {x, w, b}) ? t_autocast : DType::kF32;
  const bool rg = t_grad_enabled && (x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()));
  return make_pending(std::move(d), rg);
}

Tensor defer_relu(const Tensor& x) {
  if (!is_pending(x) || !may_defer()) return {};
  DeferredConv& d = *x.impl()->deferred;
  auto e = std::make_shared<DeferredConv>();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (!x.impl()->pending.load(std::memory_order_acquire) || d.relu || !same_state(d)) return {};
    static_cast<ConvCall&>(*e) = d;
  }
  e->relu = true;
  e->conv = x.impl();
  return make_pending(std::move(e), x.requires_grad());
}

Tensor fuse_max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                       std::array<int64_t, 2> padding) {
  if (!is_pending(x) || !may_defer()) return {};
  for (int a = 0; a < 2; ++a)
    if (stride[a] == 0) stride[a] = kernel[a];
  // conv2d_relu_max_pool2d's pooling: windows at their own stride, no padding.
  if (kernel[0] < 1 || kernel[1] < 1 || kernel[0] * kernel[1] > 256 || stride != kernel ||
      padding != std::array<int64_t, 2>{0, 0})
    return {};
  DeferredConv& d = *x.impl()->deferred;
  ConvCall c;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (!x.impl()->pending.load(std::memory_order_acquire) || !d.relu || !same_state(d) || d.shape[2] < kernel[0] ||
        d.shape[3] < kernel[1] || conv_computed(d))
      return {};
    c = d;
  }
  Tensor y = conv2d_relu_max_pool2d(c.x, c.w, c.b, kernel, c.stride, c.padding, c.dilation, c.groups);
  // Under autocast the fused op may run a first layer in f32 where the separate calls' result is 16-bit: the same
  // dtype as theirs for what follows (a cast of the pooled tensor, differentiable).
  return y.dtype() == c.dtype ? y : y.to(c.dtype);
}

void compute_pending(TensorImpl& t) {
  if (!t.pending.load(std::memory_order_acquire)) return;
  DeferredConv& d = *t.deferred;
  std::lock_guard<std::mutex> lock(d.mu);
  if (!t.pending.load(std::memory_order_acquire)) return;
  Tensor r;
  {
    NoDeferGuard no_defer;
    CallState state(d);
    if (auto c = d.conv.lock(); d.relu && c && !c->pending.load(std::memory_order_acquire)) r = relu(Tensor(c));
    else if (d.relu) r = conv2d_relu(d.x, d.w, d.b, d.stride, d.padding, d.dilation, d.groups);
    else r = conv2d(d.x, d.w, d.b, d.stride, d.padding, d.dilation, d.groups);
  }
  const TensorImpl& ri = *r.impl();
  t.data = ri.data;
  t.grad_fn = ri.grad_fn;
  t.output_nr = ri.output_nr;
  d.x = d.w = d.b = Tensor();  // what it read is no longer held through it
  t.pending.store(false, std::memory_order_release);
}

void compute_pending_reading(const keel::Tensor& storage) {
  if (storage.byte_size() == 0) return;
  const auto* lo = static_cast<const char*>(storage.raw_data());
  const auto* hi = lo + storage.byte_size();
  auto reads = [&](const Tensor& in) {
    if (!in.defined()) return false;
    if (in.impl()->pending.load(std::memory_order_acquire)) return true;  // pending itself: it reads more, compute
    const keel::Tensor& s = in.impl()->data;
    const auto* a = static_cast<const char*>(s.raw_data());
    return s.byte_size() > 0 && a < hi && lo < a + s.byte_size();
  };
  for (const auto& p : pending_where([&](TensorImpl& t) {
         DeferredConv& d = *t.deferred;
         std::lock_guard<std::mutex> lock(d.mu);
         return t.pending.load(std::memory_order_acquire) && (reads(d.x) || reads(d.w) || reads(d.b));
       }))
    compute_pending(*p);
}

}  // namespace detail

void compute_deferred(const Tensor& written) {
  if (written.defined()) compute_pending_reading(written.data());
}

void compute_deferred() {
  for (const auto& p : pending_where([](TensorImpl&) { return true; })) compute_pending(*p);
}

}  // namespace keel::eager
