// keel/core/base/tensor.h — shapes, storage and tensors.
//
// A Tensor is a dtype, a shape and a shared reference to Storage (bytes on one device). Copying a Tensor copies the
// reference, not the bytes (clone() copies bytes on the host). Storage frees its bytes through its deleter when the
// last reference goes — which is how pooled blocks go back to their CachingAllocator. Tensors are dense and
// row-major. A Tensor is thread-compatible: concurrent reads are safe, writes need external synchronisation.
#pragma once

#include <keel/plugin.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/base/dtype.h"
#include "core/base/status.h"

namespace keel {

using Shape = std::vector<int64_t>;

// Number of elements (1 for a scalar). Assumes non-negative dims. Saturates at INT64_MAX instead of overflowing
// (a hostile model's dims): comparisons stay meaningful, and an allocation of that size fails cleanly.
int64_t shape_numel(const Shape& shape);
// "[1, 3, 224, 224]"; unknown dims print as "?".
std::string shape_to_string(const Shape& shape);
// Checked element count and byte size: INVALID_ARGUMENT for negative dims or overflow past `limit` bytes.
StatusOr<uint64_t> checked_byte_size(DType dtype, const Shape& shape, uint64_t limit = (1ull << 40));

// Where bytes live: a device type ("cpu", "cuda", ...) and an index among devices of that type.
struct Location {
  std::string device_type = "cpu";
  int32_t device_index = 0;
  bool is_host() const { return device_type == "cpu"; }
  bool operator==(const Location&) const = default;
  std::string to_string() const { return device_type + ":" + std::to_string(device_index); }
};

class Storage {
 public:
  using Deleter = std::function<void(void*)>;
  // Takes ownership of `data`: `deleter(data)` runs when the storage is destroyed (may be empty for borrowed memory).
  Storage(void* data, uint64_t bytes, Location location, Deleter deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // 64-byte aligned host memory, zero-filled unless `zero` is false (then its contents are indeterminate);
  // OUT_OF_MEMORY when it cannot be had. From kHugePagesFrom bytes on it starts on a 2 MiB boundary and is advised to
  // the kernel as transparent huge pages (madvise; advice only, ignored where THP is off): on the virtual machines
  // Keel is measured on a 4 KiB page's first touch costs 10-20 µs, so writing a fresh 47 MB buffer (Fashion-MNIST's
  // training images) took 124-149 ms in 4 KiB pages and 8.5-9 ms in huge pages. The last partial 2 MiB of such an
  // allocation may cost up to 2 MiB of extra resident memory.
  static constexpr uint64_t kHugePagesFrom = 4u << 20;
  static StatusOr<std::shared_ptr<Storage>> allocate_host(uint64_t bytes, bool zero = true);
  // Borrows caller memory; the caller keeps it alive for the storage's lifetime.
  static std::shared_ptr<Storage> borrow(void* data, uint64_t bytes, Location location);

  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  const Location& location() const { return location_; }
  // False for borrowed memory (Storage::borrow, or a deleter-less storage): someone else decides its lifetime.
  bool owns_memory() const { return static_cast<bool>(deleter_); }

 private:
  void* data_;
  uint64_t bytes_;
  Location location_;
  Deleter deleter_;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape, std::shared_ptr<Storage> storage, uint64_t byte_offset = 0);

  // A new zero-filled host tensor.
  static StatusOr<Tensor> host(DType dtype, Shape shape);
  // A new host tensor whose contents are indeterminate: for a caller that writes every byte before anything reads
  // it (a copy of a request's data), which then skips host()'s fill and the page faults it takes on fresh memory.
  static StatusOr<Tensor> host_uninitialized(DType dtype, Shape shape);
  // A host tensor holding a copy of `values` (T must match dtype's size).
  template <typename T>
  static Tensor from_vector(DType dtype, Shape shape, const std::vector<T>& values);
  // A host scalar or vector helper for f32.
  static Tensor f32(Shape shape, const std::vector<float>& values) {
    return from_vector(DType::kF32, std::move(shape), values);
  }

  bool defined() const { return storage_ != nullptr || dtype_ != DType::kUndefined; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  uint64_t byte_size() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype_); }
  const Location& location() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  uint64_t byte_offset() const { return byte_offset_; }  // where this tensor's bytes start in storage()

  void* raw_data() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw_data());
  }

  // A deep copy into new host memory (the tensor must be on the host).
  StatusOr<Tensor> clone() const;
  // Same bytes, another shape of equal element count.
  StatusOr<Tensor> reshaped(Shape shape) const;
  // A C view of this tensor for the plugin ABI; valid while this Tensor lives and its shape is unchanged.
  keel_tensor_t c_view() const;
  // "f32[1, 10] on cpu:0"
  std::string describe() const;

 private:
  DType dtype_ = DType::kUndefined;
  Shape shape_;
  std::shared_ptr<Storage> storage_;
  uint64_t byte_offset_ = 0;
};

// Element i (in row-major order) of a host tensor of any numeric dtype or bool, as a double (0 for another dtype).
double element_as_double(const Tensor& t, int64_t i);

template <typename T>
Tensor Tensor::from_vector(DType dtype, Shape shape, const std::vector<T>& values) {
  auto t = host(dtype, std::move(shape));
  Tensor out = std::move(t).value();
  const uint64_t bytes = std::min<uint64_t>(out.byte_size(), values.size() * sizeof(T));
  if (bytes > 0) std::memcpy(out.raw_data(), values.data(), bytes);  // an empty vector's data() may be null
  return out;
}

}  // namespace keel
