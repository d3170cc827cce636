#include "core/base/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "core/base/host_memory.h"

namespace keel {

int64_t shape_numel(const Shape& shape) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return std::numeric_limits<int64_t>::max();
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i] < 0 ? std::string("?") : std::to_string(shape[i]);
  }
  return s + "]";
}

StatusOr<uint64_t> checked_byte_size(DType dtype, const Shape& shape, uint64_t limit) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return invalid_argument("shape " + shape_to_string(shape) + " has a negative or unknown dimension");
    if (d != 0 && n > limit / static_cast<uint64_t>(d)) {
      return invalid_argument("shape " + shape_to_string(shape) + " is too large");
    }
    n *= static_cast<uint64_t>(d);
  }
  uint64_t bytes = n * dtype_size(dtype);
  if (n != 0 && bytes / n != dtype_size(dtype))
    return invalid_argument("shape " + shape_to_string(shape) + " is too large");
  if (bytes > limit) {
    return invalid_argument("tensor " + std::string(dtype_name(dtype)) + shape_to_string(shape) + " needs " +
                            std::to_string(bytes) + " bytes, over the limit of " + std::to_string(limit));
  }
  return bytes;
}

Storage::Storage(void* data, uint64_t bytes, Location location, Deleter deleter)
    : data_(data), bytes_(bytes), location_(std::move(location)), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (deleter_ && data_ != nullptr) deleter_(data_);
}

StatusOr<std::shared_ptr<Storage>> Storage::allocate_host(uint64_t bytes, bool zero) {
  const uint64_t rounded = (std::max<uint64_t>(bytes, 1) + 63) & ~uint64_t{63};
  void* p = allocate_host_memory(rounded, 64, kHugePagesFrom, false);
  if (p == nullptr) return out_of_memory("host allocation of " + std::to_string(bytes) + " bytes failed");
  if (zero) std::memset(p, 0, rounded);
  return std::make_shared<Storage>(p, bytes, Location{}, [](void* q) { std::free(q); });
}

std::shared_ptr<Storage> Storage::borrow(void* data, uint64_t bytes, Location location) {
  return std::make_shared<Storage>(data, bytes, std::move(location), Deleter{});
}

Tensor::Tensor(DType dtype, Shape shape, std::shared_ptr<Storage> storage, uint64_t byte_offset)
    : dtype_(dtype), shape_(std::move(shape)), storage_(std::move(storage)), byte_offset_(byte_offset) {}

StatusOr<Tensor> Tensor::host(DType dtype, Shape shape) {
  KEEL_ASSIGN_OR_RETURN(uint64_t bytes, checked_byte_size(dtype, shape), "host tensor");
  KEEL_ASSIGN_OR_RETURN(auto storage, Storage::allocate_host(bytes), "host tensor");
  return Tensor(dtype, std::move(shape), std::move(storage));
}

StatusOr<Tensor> Tensor::host_uninitialized(DType dtype, Shape shape) {
  KEEL_ASSIGN_OR_RETURN(uint64_t bytes, checked_byte_size(dtype, shape), "host tensor");
  KEEL_ASSIGN_OR_RETURN(auto storage, Storage::allocate_host(bytes, /*zero=*/false), "host tensor");
  return Tensor(dtype, std::move(shape), std::move(storage));
}

const Location& Tensor::location() const {
  static const Location kHost;
  return storage_ ? storage_->location() : kHost;
}

void* Tensor::raw_data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + byte_offset_;
}

StatusOr<Tensor> Tensor::clone() const {
  if (!location().is_host()) return failed_precondition("clone() of a tensor on " + location().to_string());
  KEEL_ASSIGN_OR_RETURN(Tensor out, host(dtype_, shape_), "clone");
  if (byte_size() > 0) std::memcpy(out.raw_data(), raw_data(), byte_size());
  return out;
}

StatusOr<Tensor> Tensor::reshaped(Shape shape) const {
  if (shape_numel(shape) != numel()) {
    return invalid_argument("cannot reshape " + shape_to_string(shape_) + " to " + shape_to_string(shape));
  }
  return Tensor(dtype_, std::move(shape), storage_, byte_offset_);
}

keel_tensor_t Tensor::c_view() const {
  keel_tensor_t v{};
  v.struct_size = sizeof(keel_tensor_t);
  v.dtype = static_cast<int32_t>(dtype_);
  v.ndim = static_cast<int32_t>(shape_.size());
  v.dims = shape_.data();
  v.data = raw_data();
  v.byte_size = storage_ ? byte_size() : 0;
  v.memory_kind = location().is_host() ? KEEL_MEMORY_HOST : KEEL_MEMORY_DEVICE;
  v.device_index = location().device_index;
  return v;
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_to_string(shape_) + " on " + location().to_string();
}

double element_as_double(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32: return t.data<float>()[i];
    case DType::kF64: return t.data<double>()[i];
    case DType::kF16: return f16_to_f32(t.data<uint16_t>()[i]);
    case DType::kBF16: return bf16_to_f32(t.data<uint16_t>()[i]);
    case DType::kI8: return t.data<int8_t>()[i];
    case DType::kU8: return t.data<uint8_t>()[i];
    case DType::kI16: return t.data<int16_t>()[i];
    case DType::kU16: return t.data<uint16_t>()[i];
    case DType::kI32: return t.data<int32_t>()[i];
    case DType::kU32: return t.data<uint32_t>()[i];
    case DType::kI64: return static_cast<double>(t.data<int64_t>()[i]);
    case DType::kU64: return static_cast<double>(t.data<uint64_t>()[i]);
    case DType::kBool: return t.data<uint8_t>()[i] ? 1 : 0;
    default: return 0;
  }
}

}  // namespace keel
