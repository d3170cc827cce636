#include "core/base/status.h"

#include <cstdlib>
#include <cstring>

namespace keel {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kOutOfMemory: return "OUT_OF_MEMORY";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kAbiMismatch: return "ABI_MISMATCH";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kCancelled: return "CANCELLED";
  }
  return "UNKNOWN";
}

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(std::string_view context) const {
  if (is_ok() || context.empty()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

namespace {
void release_c_status(keel_status_s* s) {
  if (s == nullptr) return;
  std::free(const_cast<char*>(s->message));
  std::free(s);
}
}  // namespace

keel_status_t make_c_status(int32_t code, const char* message) {
  auto* s = static_cast<keel_status_s*>(std::calloc(1, sizeof(keel_status_s)));
  if (s == nullptr) return nullptr;  // cannot even report: treat as OK would be wrong, but nothing else is possible
  s->struct_size = sizeof(keel_status_s);
  s->code = code;
  s->message = strdup(message ? message : "");
  s->release = release_c_status;
  return s;
}

keel_status_t Status::to_c() const {
  if (is_ok()) return nullptr;
  return make_c_status(static_cast<int32_t>(code_), message_.c_str());
}

Status Status::from_c(keel_status_t status) {
  if (status == nullptr) return Status();
  StatusCode code = status->code == 0 ? StatusCode::kInternal : static_cast<StatusCode>(status->code);
  std::string message = status->message ? status->message : "";
  if (status->code == 0) message = "plugin returned a status object with code OK: " + message;
  keel_status_release(status);
  return Status(code, std::move(message));
}

Status invalid_argument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
Status not_found(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
Status unimplemented(std::string m) { return Status(StatusCode::kUnimplemented, std::move(m)); }
Status out_of_memory(std::string m) { return Status(StatusCode::kOutOfMemory, std::move(m)); }
Status failed_precondition(std::string m) { return Status(StatusCode::kFailedPrecondition, std::move(m)); }
Status unavailable(std::string m) { return Status(StatusCode::kUnavailable, std::move(m)); }
Status internal_error(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

}  // namespace keel
