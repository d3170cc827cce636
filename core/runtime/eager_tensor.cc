// eager::Tensor's methods, the thread-local guards (no-grad, autocast), conversions and arithmetic operators.
#include "core/runtime/eager_internal.h"

#include <cstring>

namespace keel::eager {

using namespace detail;

namespace detail {

const detail::TensorImpl& need(const std::shared_ptr<detail::TensorImpl>& p) {
  if (!p) fail(failed_precondition("use of an undefined tensor"));
  if (p->pending.load(std::memory_order_acquire)) compute_pending(*p);
  return *p;
}

}  // namespace detail

Tensor::Tensor() = default;
Tensor::Tensor(std::shared_ptr<detail::TensorImpl> impl) : impl_(std::move(impl)) {}
Tensor::Tensor(keel::Tensor data, bool requires_grad) : impl_(std::make_shared<detail::TensorImpl>()) {
  if (requires_grad && !dtype_is_float(data.dtype()))
    fail(invalid_argument(std::string("requires_grad needs a floating tensor, got ") + dtype_name(data.dtype())));
  impl_->data = std::move(data);
  impl_->requires_grad = requires_grad;
}

bool Tensor::defined() const { return impl_ != nullptr; }
const keel::Tensor& Tensor::data() const { return need(impl_).data; }
// Shape, dtype and device of a deferred tensor come from its call (always on the host): asking does not compute it.
const Shape& Tensor::shape() const {
  if (impl_ && impl_->pending.load(std::memory_order_acquire)) return impl_->deferred->shape;
  return need(impl_).data.shape();
}
int64_t Tensor::rank() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::dim(int i) const {
  int64_t r = rank();
  if (i < -r || i >= r)
    fail(invalid_argument("dim " + std::to_string(i) + " out of range for rank " + std::to_string(r)));
  return shape()[static_cast<size_t>(i < 0 ? i + r : i)];
}
int64_t Tensor::numel() const { return shape_numel(shape()); }
DType Tensor::dtype() const {
  if (impl_ && impl_->pending.load(std::memory_order_acquire)) return impl_->deferred->dtype;
  return need(impl_).data.dtype();
}
std::string Tensor::device() const {
  if (impl_ && impl_->pending.load(std::memory_order_acquire)) return "cpu";
  return device_name(need(impl_).data.location());
}
bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }
bool Tensor::is_leaf() const { return need(impl_).grad_fn == nullptr; }
Tensor Tensor::grad() const { return need(impl_).grad; }

Tensor& Tensor::requires_grad_(bool on) {
  need(impl_);
  if (impl_->grad_fn) fail(failed_precondition("requires_grad_ on a non-leaf tensor (use detach())"));
  if (on && !dtype_is_float(dtype()))
    fail(invalid_argument(std::string("requires_grad needs a floating tensor, got ") + dtype_name(dtype())));
  impl_->requires_grad = on;
  return *this;
}

void Tensor::set_grad(const Tensor& g) {
  need(impl_);
  if (g.defined() && (g.shape() != shape() || g.dtype() != dtype()))
    fail(invalid_argument("set_grad: gradient " + g.data().describe() + " does not match " + data().describe()));
  impl_->grad = g;
}
void Tensor::zero_grad() {
  need(impl_);
  impl_->grad = Tensor();
}

Tensor Tensor::detach() const { return Tensor(data(), false); }

float Tensor::item() const {
  if (numel() != 1) fail(invalid_argument("item() of a tensor with " + std::to_string(numel()) + " elements"));
  keel::Tensor h = to_host(data());
  switch (h.dtype()) {
    case DType::kF32: return *h.data<float>();
    case DType::kF64: return static_cast<float>(*h.data<double>());
    case DType::kF16: return f16_to_f32(*h.data<uint16_t>());
    case DType::kBF16: return bf16_to_f32(*h.data<uint16_t>());
    case DType::kI64: return static_cast<float>(*h.data<int64_t>());
    case DType::kI32: return static_cast<float>(*h.data<int32_t>());
    case DType::kBool:
    case DType::kU8: return static_cast<float>(*h.data<uint8_t>());
    default: fail(invalid_argument(std::string("item() of dtype ") + dtype_name(h.dtype())));
  }
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  if (sizeof(T) != dtype_size(dtype()))
    fail(invalid_argument(std::string("to_vector: element size ") + std::to_string(sizeof(T)) + " does not match " +
                          dtype_name(dtype())));
  keel::Tensor h = to_host(data());
  std::vector<T> v(static_cast<size_t>(h.numel()));
  if (!v.empty()) std::memcpy(v.data(), h.raw_data(), h.byte_size());
  return v;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<uint16_t> Tensor::to_vector<uint16_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

void Tensor::copy_(const Tensor& src) {
  need(impl_);
  if (impl_->grad_fn && impl_->requires_grad)
    fail(failed_precondition("copy_ into a non-leaf tensor that requires grad"));
  if (src.shape() != shape())
    fail(invalid_argument("copy_: source " + src.data().describe() + " does not match " + data().describe()));
  compute_pending_reading(data());  // deferred convolutions that read this memory see the values before the copy
  keel::Tensor s = src.data();
  if (s.dtype() != dtype()) {
    NoGradGuard ng;
    s = src.to(dtype()).data();
  }
  const Location& at = data().location();
  if (s.raw_data() == data().raw_data() || s.byte_size() == 0) return;
  if (at.is_host() && s.location().is_host()) {
    std::memcpy(data().raw_data(), s.raw_data(), s.byte_size());
    return;
  }
  // From another device of the type: first to this one (copy_to: a peer copy, or through the host). From the host or
  // within the device: queued without a wait for the device (copy_async) where the device can order it. Otherwise
  // (into the host, or a device that cannot order it) through the device table, complete on return.
  if (!at.is_host() && !s.location().is_host() && s.location() != at) s = copy_to(s, device_name(at));
  if (copy_async(data(), s)) return;
  Status st = environment().copy(data().raw_data(), at, s.raw_data(), s.location(), s.byte_size());
  if (!st.is_ok()) fail(st.with_context("copy_"));
}

void Tensor::set_data_(const Tensor& src) {
  need(impl_);
  if (impl_->grad_fn && impl_->requires_grad)
    fail(failed_precondition("set_data_ on a non-leaf tensor that requires grad"));
  const keel::Tensor& s = src.data();
  const keel::Tensor& d = impl_->data;
  if (s.shape() != d.shape() || s.dtype() != d.dtype() || s.location() != d.location())
    fail(invalid_argument("set_data_: " + s.describe() + " does not match " + d.describe()));
  compute_pending_reading(d);  // deferred convolutions that read this tensor see its values before the swap
  impl_->data = s;
}

// ------------------------------------------------------------------------------------------------ scopes

NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }
bool grad_enabled() { return t_grad_enabled; }

AutocastGuard::AutocastGuard(DType low) : prev_(t_autocast) {
  if (low != DType::kBF16 && low != DType::kF16)
    fail(invalid_argument(std::string("autocast to ") + dtype_name(low) + ": only bf16 and f16"));
  t_autocast = low;
}
AutocastGuard::~AutocastGuard() { t_autocast = prev_; }
DType autocast_dtype() { return t_autocast; }

// ------------------------------------------------------------------------------------------------ conversions

Tensor Tensor::to(DType dt) const {
  need(impl_);
  return cast_to(*this, dt);
}

Tensor Tensor::to(const std::string& device_type) const {
  need(impl_);
  const std::string mem = memory_type_of(device_type);
  const std::string here = device_name(data().location());
  if (mem == here) return *this;
  Tensor out(copy_to(data(), mem), false);
  trace_record("", "Identity", {}, {*this}, {out});
  record_unary_grad(out, *this, "ToDeviceBackward", [here](const keel::Tensor& g) { return copy_to(g, here); });
  return out;
}

// ------------------------------------------------------------------------------------------------ arithmetic

Tensor operator+(const Tensor& a, const Tensor& b) { return apply1("Add", {a, b}); }
Tensor operator-(const Tensor& a, const Tensor& b) { return apply1("Sub", {a, b}); }
Tensor operator*(const Tensor& a, const Tensor& b) { return apply1("Mul", {a, b}); }
Tensor operator/(const Tensor& a, const Tensor& b) { return apply1("Div", {a, b}); }
Tensor operator+(const Tensor& a, float b) { return a + scalar_like(a, b); }
Tensor operator-(const Tensor& a, float b) { return a - scalar_like(a, b); }
Tensor operator*(const Tensor& a, float b) { return a * scalar_like(a, b); }
Tensor operator/(const Tensor& a, float b) { return a / scalar_like(a, b); }
Tensor operator+(float a, const Tensor& b) { return scalar_like(b, a) + b; }
Tensor operator-(float a, const Tensor& b) { return scalar_like(b, a) - b; }
Tensor operator*(float a, const Tensor& b) { return scalar_like(b, a) * b; }
Tensor operator/(float a, const Tensor& b) { return scalar_like(b, a) / b; }
Tensor operator-(const Tensor& a) { return apply1("Neg", {a}); }

}  // namespace keel::eager
