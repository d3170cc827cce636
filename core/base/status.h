// keel/core/base/status.h — Status and StatusOr<T>: the core's cheap error type.
//
// OK carries nothing; an error carries a code (the C ABI's keel_status_code_t) and a message. Context is added on
// the way up with KEEL_RETURN_IF_ERROR(expr, "context"). Status converts to and from the C ABI's keel_status_t at
// the plugin boundary (to_c / from_c). Values are cheap to move; thread-compatible (no shared state).
#pragma once

#include <keel/plugin.h>

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace keel {

enum class StatusCode : int {
  kOk = KEEL_STATUS_OK,
  kInvalidArgument = KEEL_STATUS_INVALID_ARGUMENT,
  kNotFound = KEEL_STATUS_NOT_FOUND,
  kUnimplemented = KEEL_STATUS_UNIMPLEMENTED,
  kOutOfMemory = KEEL_STATUS_OUT_OF_MEMORY,
  kFailedPrecondition = KEEL_STATUS_FAILED_PRECONDITION,
  kUnavailable = KEEL_STATUS_UNAVAILABLE,
  kDeadlineExceeded = KEEL_STATUS_DEADLINE_EXCEEDED,
  kAbiMismatch = KEEL_STATUS_ABI_MISMATCH,
  kInternal = KEEL_STATUS_INTERNAL,
  kAlreadyExists = KEEL_STATUS_ALREADY_EXISTS,
  kOutOfRange = KEEL_STATUS_OUT_OF_RANGE,
  kCancelled = KEEL_STATUS_CANCELLED,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string to_string() const;
  // Prefixes context: "context: message". No-op on OK.
  Status with_context(std::string_view context) const;

  // Hands the status across the C boundary (NULL for OK). The receiver releases it.
  keel_status_t to_c() const;
  // Takes ownership of a C status (releasing it) and returns the equivalent Status.
  static Status from_c(keel_status_t status);

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A new C status object with a copied message (what keel_core_api_t.status_create does).
keel_status_t make_c_status(int32_t code, const char* message);

// Shorthands for the common codes.
Status invalid_argument(std::string message);
Status not_found(std::string message);
Status unimplemented(std::string message);
Status out_of_memory(std::string message);
Status failed_precondition(std::string message);
Status unavailable(std::string message);
Status internal_error(std::string message);

// A value or an error. Accessing the value of an error is a programmer bug (asserts).
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) { assert(!status_.is_ok() && "StatusOr from OK status"); }
  StatusOr(T value) : value_(std::move(value)) {}
  template <typename U,
            typename = std::enable_if_t<std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, Status> &&
                                        !std::is_same_v<std::decay_t<U>, T>>>
  StatusOr(U&& value) : value_(T(std::forward<U>(value))) {}

  bool is_ok() const { return status_.is_ok(); }
  const Status& status() const { return status_; }
  T& value() & {
    assert(value_.has_value());
    return *value_;
  }
  const T& value() const& {
    assert(value_.has_value());
    return *value_;
  }
  T&& value() && {
    assert(value_.has_value());
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace keel

#define KEEL_CONCAT_INNER_(a, b) a##b
#define KEEL_CONCAT_(a, b) KEEL_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` fails, with `context` prefixed.
#define KEEL_RETURN_IF_ERROR(expr, context)                               \
  do {                                                                    \
    ::keel::Status keel_status_ = (expr);                                 \
    if (!keel_status_.is_ok()) return keel_status_.with_context(context); \
  } while (0)

// `lhs = value of expr`, or returns its error with `context` prefixed.
#define KEEL_ASSIGN_OR_RETURN(lhs, expr, context) \
  KEEL_ASSIGN_OR_RETURN_IMPL_(KEEL_CONCAT_(keel_statusor_, __LINE__), lhs, expr, context)
#define KEEL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr, context)   \
  auto tmp = (expr);                                           \
  if (!tmp.is_ok()) return tmp.status().with_context(context); \
  lhs = std::move(tmp).value()
