// Eager tensors: dispatch through the kernel registry, autograd, autocast, tracing (see eager.h).
#include "core/runtime/eager.h"

namespace keel::eager {

Error::Error(Status s) : std::runtime_error(s.to_string()), status_(std::move(s)) {}

}  // namespace keel::eager
