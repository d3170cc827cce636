#include "hal/device.h"

namespace keel::hal {

namespace {
// A plugin's message that already names `what` first ("gloo: rank 2 of 3 never arrived") is not prefixed again.
Status wrap(keel_status_t st, const std::string& what) {
  Status s = Status::from_c(st);
  if (s.message().rfind(what + ": ", 0) == 0) return s;
  return s.with_context(what);
}
Status missing(const std::string& type, const char* entry) {
  return unimplemented("device " + type + " has no " + entry);
}
}  // namespace

StatusOr<keel_device_properties_t> Device::properties() const {
  keel_device_properties_t p{};
  p.struct_size = sizeof p;
  if (!entry_->table.get_properties) return missing(type(), "get_properties");
  KEEL_RETURN_IF_ERROR(wrap(entry_->table.get_properties(entry_->table.user_data, index_, &p), name()), "properties");
  p.name[sizeof p.name - 1] = '\0';
  return p;
}

bool Device::host_memory() const {
  if (type() == "cpu") return true;
  std::atomic<int8_t>* known = entry_->host_memory_known && index_ >= 0 && index_ < entry_->device_count
                                   ? &entry_->host_memory_known[static_cast<size_t>(index_)]
                                   : nullptr;
  if (known) {
    if (const int8_t k = known->load(std::memory_order_relaxed); k != 0) return k == 2;
  }
  auto p = properties();
  const bool host = p.is_ok() && (p.value().capabilities & KEEL_DEVICE_CAP_UNIFIED_HOST_MEMORY);
  if (known && p.is_ok()) known->store(host ? 2 : 1, std::memory_order_relaxed);  // a failed query is asked again
  return host;
}

StatusOr<void*> Device::allocate(uint64_t bytes, uint64_t alignment) const {
  void* p = nullptr;
  KEEL_RETURN_IF_ERROR(wrap(entry_->table.allocate(entry_->table.user_data, index_, bytes, alignment, &p), name()), "");
  if (p == nullptr && bytes > 0) return out_of_memory(name() + ": allocate returned NULL");
  return p;
}

void Device::free(void* ptr) const { entry_->table.free(entry_->table.user_data, index_, ptr); }

Status Device::copy(keel_copy_kind_t kind, void* dst, int32_t dst_device, const void* src, int32_t src_device,
                    uint64_t bytes, keel_stream_t stream) const {
  return wrap(entry_->table.copy(entry_->table.user_data, kind, dst_device, dst, src_device, src, bytes, stream),
              name() + " copy of " + std::to_string(bytes) + " bytes");
}

Status Device::synchronize() const {
  if (!entry_->table.device_synchronize) return Status::ok();
  return wrap(entry_->table.device_synchronize(entry_->table.user_data, index_), name() + " synchronize");
}

StatusOr<Stream> Device::create_stream() const {
  if (!entry_->table.stream_create) return missing(type(), "streams");
  keel_stream_t s = nullptr;
  KEEL_RETURN_IF_ERROR(wrap(entry_->table.stream_create(entry_->table.user_data, index_, &s), name()), "stream");
  return Stream(entry_, s);
}

StatusOr<Event> Device::create_event() const {
  if (!entry_->table.event_create) return missing(type(), "events");
  keel_event_t e = nullptr;
  KEEL_RETURN_IF_ERROR(wrap(entry_->table.event_create(entry_->table.user_data, index_, &e), name()), "event");
  return Event(entry_, e);
}

Stream& Stream::operator=(Stream&& o) noexcept {
  std::swap(entry_, o.entry_);
  std::swap(stream_, o.stream_);
  return *this;
}
Stream::~Stream() {
  if (entry_ && stream_ && entry_->table.stream_release) entry_->table.stream_release(entry_->table.user_data, stream_);
}
Status Stream::synchronize() const {
  if (!entry_ || !entry_->table.stream_synchronize) return Status::ok();
  return wrap(entry_->table.stream_synchronize(entry_->table.user_data, stream_), "stream synchronize");
}
bool Device::can_synchronize_streams() const { return entry_->table.stream_synchronize != nullptr; }
bool Device::can_wait_on_events() const { return entry_->table.stream_wait_event != nullptr; }
Status Device::record_event(const Event& event, keel_stream_t stream) const {
  if (!entry_->table.event_record) return missing(type(), "event_record");
  return wrap(entry_->table.event_record(entry_->table.user_data, event.get(), stream), name());
}
Status Device::wait_event(keel_stream_t stream, const Event& event) const {
  if (!entry_->table.stream_wait_event) return missing(type(), "stream_wait_event");
  return wrap(entry_->table.stream_wait_event(entry_->table.user_data, stream, event.get()), name());
}

Status Stream::wait(const Event& event) const {
  if (!entry_ || !entry_->table.stream_wait_event) return Status::ok();
  return wrap(entry_->table.stream_wait_event(entry_->table.user_data, stream_, event.get()), "stream wait");
}

Event& Event::operator=(Event&& o) noexcept {
  std::swap(entry_, o.entry_);
  std::swap(event_, o.event_);
  return *this;
}
Event::~Event() {
  if (entry_ && event_ && entry_->table.event_release) entry_->table.event_release(entry_->table.user_data, event_);
}
Status Event::record(const Stream& stream) const {
  if (!entry_ || !entry_->table.event_record) return Status::ok();
  return wrap(entry_->table.event_record(entry_->table.user_data, event_, stream.get()), "event record");
}
Status Event::synchronize() const {
  if (!entry_ || !entry_->table.event_synchronize) return Status::ok();
  return wrap(entry_->table.event_synchronize(entry_->table.user_data, event_), "event synchronize");
}

StatusOr<Communicator> Communicator::create(const CollectiveEntry* entry, keel_kv_store_t* store, int32_t rank,
                                            int32_t size, int32_t device, int64_t timeout_ms) {
  if (!entry || !entry->table.communicator_create)
    return unimplemented("collective backend has no communicator_create");
  if (rank < 0 || size <= 0 || rank >= size) {
    return invalid_argument("rank " + std::to_string(rank) + " of " + std::to_string(size) + " is out of range");
  }
  Communicator c;
  c.entry_ = entry;
  c.device_ = device;
  KEEL_RETURN_IF_ERROR(
      wrap(entry->table.communicator_create(entry->table.user_data, store, rank, size, device, timeout_ms, &c.comm_),
           entry->backend),
      "communicator");
  return c;
}
Communicator& Communicator::operator=(Communicator&& o) noexcept {
  std::swap(entry_, o.entry_);
  std::swap(comm_, o.comm_);
  std::swap(device_, o.device_);
  return *this;
}
Communicator::~Communicator() {
  if (entry_ && comm_ && entry_->table.communicator_release)
    entry_->table.communicator_release(entry_->table.user_data, comm_);
}

#define KEEL_COLLECTIVE_CALL(member, ...)                                                           \
  if (!entry_ || !entry_->table.member) return unimplemented(std::string("collective ") + #member); \
  return wrap(entry_->table.member(entry_->table.user_data, comm_, __VA_ARGS__), entry_->backend + " " #member)

const std::string& Communicator::device_type() const {
  static const std::string kNone;
  return entry_ ? entry_->device_type : kNone;
}
int32_t Communicator::rank() const {
  return entry_ && entry_->table.rank ? entry_->table.rank(entry_->table.user_data, comm_) : 0;
}
int32_t Communicator::size() const {
  return entry_ && entry_->table.size ? entry_->table.size(entry_->table.user_data, comm_) : 1;
}
Status Communicator::all_reduce(const void* s, void* r, uint64_t n, DType t, keel_reduce_op_t op,
                                keel_stream_t st) const {
  KEEL_COLLECTIVE_CALL(all_reduce, s, r, n, static_cast<int32_t>(t), op, st);
}
Status Communicator::broadcast(const void* s, void* r, uint64_t n, DType t, int32_t root, keel_stream_t st) const {
  KEEL_COLLECTIVE_CALL(broadcast, s, r, n, static_cast<int32_t>(t), root, st);
}
Status Communicator::all_gather(const void* s, void* r, uint64_t n, DType t, keel_stream_t st) const {
  KEEL_COLLECTIVE_CALL(all_gather, s, r, n, static_cast<int32_t>(t), st);
}
Status Communicator::reduce_scatter(const void* s, void* r, uint64_t n, DType t, keel_reduce_op_t op,
                                    keel_stream_t st) const {
  KEEL_COLLECTIVE_CALL(reduce_scatter, s, r, n, static_cast<int32_t>(t), op, st);
}
Status Communicator::send(const void* b, uint64_t n, DType t, int32_t peer, keel_stream_t st) const {
  KEEL_COLLECTIVE_CALL(send, b, n, static_cast<int32_t>(t), peer, st);
}
Status Communicator::recv(void* b, uint64_t n, DType t, int32_t peer, keel_stream_t st) const {
  KEEL_COLLECTIVE_CALL(recv, b, n, static_cast<int32_t>(t), peer, st);
}
Status Communicator::barrier(keel_stream_t st) const {
  if (!entry_ || !entry_->table.barrier) return unimplemented("collective barrier");
  return wrap(entry_->table.barrier(entry_->table.user_data, comm_, st), entry_->backend + " barrier");
}
#undef KEEL_COLLECTIVE_CALL

}  // namespace keel::hal
