// keel/hal/device.h — the C++ view of a plugin's device table: devices, raw memory, copies, streams and events.
//
// The core reaches a keel_device_table_t's memory, copies, streams and events only through these wrappers, which turn
// C status objects into Status and own streams/events (RAII); its claim hook is asked by the session build
// (session.cc), like every registered claimer. A Device is a cheap non-owning view (a table entry and an index); it
// stays valid while the Environment that registered the table lives. Thread-safety is the plugin's: device-table
// entries may be called from any thread (plugin.h).
#pragma once

#include <keel/plugin.h>

#include <optional>
#include <string>

#include "core/base/allocator.h"
#include "core/base/registry.h"
#include "core/base/status.h"

namespace keel::hal {

class Stream;
class Event;

class Device {
 public:
  Device(const DeviceEntry* entry, int32_t index) : entry_(entry), index_(index) {}

  const std::string& type() const { return entry_->device_type; }
  int32_t index() const { return index_; }
  std::string name() const { return type() + ":" + std::to_string(index_); }
  const DeviceEntry& entry() const { return *entry_; }

  StatusOr<keel_device_properties_t> properties() const;
  // True when the device's memory is ordinary host memory (the CPU, or KEEL_DEVICE_CAP_UNIFIED_HOST_MEMORY):
  // values move between it and the host without copies. Asked of the table once per device, then remembered
  // (DeviceEntry::host_memory_known): eager asks on nearly every op.
  bool host_memory() const;

  StatusOr<void*> allocate(uint64_t bytes, uint64_t alignment) const;
  void free(void* ptr) const;
  // Copies between this device and the host, or between devices of this table (`kind` says which side is which).
  Status copy(keel_copy_kind_t kind, void* dst, int32_t dst_device, const void* src, int32_t src_device, uint64_t bytes,
              keel_stream_t stream = nullptr) const;
  Status synchronize() const;

  // Streams and events; UNIMPLEMENTED when the device has none (it then runs everything in order).
  StatusOr<Stream> create_stream() const;
  StatusOr<Event> create_event() const;
  // Whether the table can synchronise one stream, and make a stream wait for an event without the host waiting.
  bool can_synchronize_streams() const;
  bool can_wait_on_events() const;
  // The same as Event::record and Stream::wait, for a stream this device's table made but that is held raw (a
  // session's per-run streams); a null stream is the device's default stream.
  Status record_event(const Event& event, keel_stream_t stream) const;
  Status wait_event(keel_stream_t stream, const Event& event) const;

 private:
  const DeviceEntry* entry_;
  int32_t index_;
};

// Owns a keel_stream_t of one device.
class Stream {
 public:
  Stream() = default;
  Stream(const DeviceEntry* entry, keel_stream_t s) : entry_(entry), stream_(s) {}
  Stream(Stream&& o) noexcept { *this = std::move(o); }
  Stream& operator=(Stream&& o) noexcept;
  ~Stream();
  keel_stream_t get() const { return stream_; }
  Status synchronize() const;
  Status wait(const Event& event) const;

 private:
  const DeviceEntry* entry_ = nullptr;
  keel_stream_t stream_ = nullptr;
};

// Owns a keel_event_t of one device.
class Event {
 public:
  Event() = default;
  Event(const DeviceEntry* entry, keel_event_t e) : entry_(entry), event_(e) {}
  Event(Event&& o) noexcept { *this = std::move(o); }
  Event& operator=(Event&& o) noexcept;
  ~Event();
  keel_event_t get() const { return event_; }
  Status record(const Stream& stream) const;
  Status synchronize() const;

 private:
  const DeviceEntry* entry_ = nullptr;
  keel_event_t event_ = nullptr;
};

// The caching allocator's source of raw memory for one device.
class DeviceRawAllocator : public RawAllocator {
 public:
  explicit DeviceRawAllocator(Device device) : device_(device) {}
  StatusOr<void*> allocate(uint64_t bytes, uint64_t alignment) override { return device_.allocate(bytes, alignment); }
  void free(void* ptr) override { device_.free(ptr); }
  std::string name() const override { return device_.name(); }

 private:
  Device device_;
};

// A communicator of a collective plugin (NCCL, Gloo): owned, released on destruction.
class Communicator {
 public:
  // Creates a communicator of `size` ranks through `store` (the rendezvous), failing with DEADLINE_EXCEEDED when
  // peers do not arrive within timeout_ms.
  static StatusOr<Communicator> create(const CollectiveEntry* entry, keel_kv_store_t* store, int32_t rank, int32_t size,
                                       int32_t device, int64_t timeout_ms);
  Communicator() = default;
  Communicator(Communicator&& o) noexcept { *this = std::move(o); }
  Communicator& operator=(Communicator&& o) noexcept;
  ~Communicator();

  int32_t rank() const;
  int32_t size() const;
  // The device whose memory every buffer of this communicator's collectives must be in: its type ("cpu" for Gloo,
  // "cuda" for NCCL; "" for a moved-from communicator) and index (the `device` given to create()). Host arrays (a
  // program's metrics) reach a device-memory communicator through a copy to that device.
  const std::string& device_type() const;
  int32_t device_index() const { return device_; }
  Status all_reduce(const void* send, void* recv, uint64_t count, DType dtype, keel_reduce_op_t op,
                    keel_stream_t stream = nullptr) const;
  Status broadcast(const void* send, void* recv, uint64_t count, DType dtype, int32_t root,
                   keel_stream_t stream = nullptr) const;
  Status all_gather(const void* send, void* recv, uint64_t send_count, DType dtype,
                    keel_stream_t stream = nullptr) const;
  Status reduce_scatter(const void* send, void* recv, uint64_t recv_count, DType dtype, keel_reduce_op_t op,
                        keel_stream_t stream = nullptr) const;
  Status send(const void* buf, uint64_t count, DType dtype, int32_t peer, keel_stream_t stream = nullptr) const;
  Status recv(void* buf, uint64_t count, DType dtype, int32_t peer, keel_stream_t stream = nullptr) const;
  Status barrier(keel_stream_t stream = nullptr) const;

 private:
  const CollectiveEntry* entry_ = nullptr;
  keel_communicator_t comm_ = nullptr;
  int32_t device_ = 0;
};

}  // namespace keel::hal
