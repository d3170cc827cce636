// keel/kernel.hpp — a header-only C++17 layer over the kernel part of plugin.h, for kernels written in C++.
//
// The plugin boundary is C (plugin.h); this header is C++ convenience on the plugin's own side of it, compiled into
// the plugin. It depends on <keel/plugin.h>, <keel/shape.hpp> and the standard library only. It gives:
//
//  - KernelContext: a keel_kernel_context_t seen through the host's keel_kernel_api_t with std:: types: inputs and
//    their shapes, outputs, workspace, attributes with defaults, opset, threads, parallel_for. It does not own the
//    context; make one per create / compute call (it is two pointers). Like the context it wraps, it is valid only
//    during that call and is used by one thread (parallel_for's body may run on several).
//  - Reject and Failure: what a kernel throws. Reject{why}: "this kernel does not handle this case", which becomes
//    UNIMPLEMENTED, so the core tries the next kernel (and prints `why` in verbose mode) — not an error. Failure{code,
//    message}: a real error of the given keel_status_code_t.
//  - guard(): runs a create or compute body and turns whatever it throws into a keel_status_t made by the host, so
//    that no exception crosses the boundary (see the rules at guard).
//
// A kernel entry then reads:
//
//   keel_status_t my_relu_compute(void* state, keel_kernel_context_t* ctx) {
//     return keel::sdk::guard(g_host, keel::sdk::Stage::kCompute, [&] {
//       keel::sdk::KernelContext c(ctx, g_host->kernel);
//       if (c.dtype(0) != KEEL_DTYPE_F32) throw keel::sdk::Reject{"f32 only"};
//       keel_tensor_t* y = c.output(0, c.dims(0));   // throws Failure when the core cannot allocate it
//       ...
//     });
//   }
#pragma once

#include <keel/plugin.h>
#include <keel/shape.hpp>

#include <cstdint>
#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace keel::sdk {

// Thrown for a case the kernel does not handle: becomes UNIMPLEMENTED (a rejection, not an error).
struct Reject {
  std::string why;
};
// Thrown for a real failure: becomes an error status with this code (a keel_status_code_t).
struct Failure {
  int32_t code;
  std::string message;
};

// Throws Failure with `st`'s code (INTERNAL when it says OK) and message (`fallback` when it has none), after
// releasing `st`. Does nothing for NULL (OK).
inline void throw_if_failed(keel_status_t st, const char* fallback) {
  if (st == nullptr) return;
  Failure f{st->code == KEEL_STATUS_OK ? static_cast<int32_t>(KEEL_STATUS_INTERNAL) : st->code,
            st->message ? st->message : fallback};
  keel_status_release(st);
  throw f;
}

class KernelContext {
 public:
  KernelContext(keel_kernel_context_t* ctx, const keel_kernel_api_t* api) : c_(ctx), api_(api) {}

  keel_kernel_context_t* raw() const { return c_; }
  const keel_kernel_api_t* api() const { return api_; }

  // --- inputs (i out of range reads as absent) ---
  int input_count() const { return api_->input_count(c_); }
  // NULL when input i is absent (an omitted optional input) or out of range.
  const keel_tensor_t* input(int i) const { return api_->input(c_, i); }
  bool has_input(int i) const { return input(i) != nullptr; }
  bool rank_known(int i) const {
    const keel_tensor_t* t = input(i);
    return t && t->ndim >= 0;
  }
  // Shape of input i; empty when it is absent or its rank is unknown (check rank_known for a real scalar). Kept out
  // of the callers' analysis: GCC 12 reports false -Warray-bounds / -Wfree-nonheap-object on their vectors otherwise.
#if defined(__GNUC__) && !defined(__clang__)
  __attribute__((noipa))
#endif
  Dims
  dims(int i) const {
    const keel_tensor_t* t = input(i);
    if (!t || t->ndim < 0) return {};
    return Dims(t->dims, t->dims + t->ndim);
  }
  // Rank and every dimension known.
  bool dims_known(int i) const {
    const keel_tensor_t* t = input(i);
    if (!t || t->ndim < 0) return false;
    for (int32_t k = 0; k < t->ndim; ++k)
      if (t->dims[k] < 0) return false;
    return true;
  }
  // Has data at create time: a constant (an initializer).
  bool is_constant(int i) const {
    const keel_tensor_t* t = input(i);
    return t && t->data;
  }
  int32_t dtype(int i) const {
    const keel_tensor_t* t = input(i);
    return t ? t->dtype : KEEL_DTYPE_UNDEFINED;
  }
  // Input i's data as T (input i must be present).
  template <class T = void>
  const T* data(int i) const {
    return static_cast<const T*>(input(i)->data);
  }

  // --- outputs ---
  int output_count() const { return api_->output_count(c_); }
  // The dtype the graph expects for output i; UNDEFINED for an omitted optional output.
  int32_t output_dtype(int i) const { return api_->output_dtype(c_, i); }
  // Allocates output i with these dims (only during compute); the view is valid until compute returns. Throws
  // Failure (the core's code and message) when the core cannot provide it.
  keel_tensor_t* output(int i, const Dims& d) const {
    keel_tensor_t* t = nullptr;
    throw_if_failed(api_->output(c_, i, static_cast<int32_t>(d.size()), d.data(), &t), "output allocation failed");
    return t;
  }
  // Scratch memory on the kernel's device, valid until compute returns. Throws Failure when it cannot be had.
  void* workspace(uint64_t bytes) const {
    void* p = nullptr;
    throw_if_failed(api_->workspace(c_, bytes, &p), "workspace allocation failed");
    return p;
  }

  // --- attributes: the value when present with that type, else the default ---
  bool has_attr(const char* name) const {
    int64_t i;
    float f;
    const char* s;
    const int64_t* is;
    const float* fs;
    size_t n;
    return api_->attr_int(c_, name, &i) || api_->attr_float(c_, name, &f) || api_->attr_string(c_, name, &s) ||
           api_->attr_ints(c_, name, &is, &n) || api_->attr_floats(c_, name, &fs, &n);
  }
  bool has_attr_int(const char* name) const {
    int64_t v;
    return api_->attr_int(c_, name, &v) != 0;
  }
  bool has_attr_ints(const char* name) const {
    const int64_t* v;
    size_t n;
    return api_->attr_ints(c_, name, &v, &n) != 0;
  }
  int64_t attr_i(const char* name, int64_t dflt) const {
    int64_t v;
    return api_->attr_int(c_, name, &v) ? v : dflt;
  }
  float attr_f(const char* name, float dflt) const {
    float v;
    return api_->attr_float(c_, name, &v) ? v : dflt;
  }
  std::string attr_s(const char* name, const std::string& dflt) const {
    const char* v = nullptr;
    return api_->attr_string(c_, name, &v) && v ? std::string(v) : dflt;
  }
  Dims attr_ints(const char* name, const Dims& dflt) const {
    const int64_t* v;
    size_t n;
    return api_->attr_ints(c_, name, &v, &n) ? Dims(v, v + n) : dflt;
  }
  // Empty when absent.
  std::vector<float> attr_floats(const char* name) const {
    return attr_floats_opt(name).value_or(std::vector<float>{});
  }

  std::optional<int64_t> attr_i_opt(const char* name) const {
    int64_t v;
    if (api_->attr_int(c_, name, &v)) return v;
    return std::nullopt;
  }
  std::optional<float> attr_f_opt(const char* name) const {
    float v;
    if (api_->attr_float(c_, name, &v)) return v;
    return std::nullopt;
  }
  std::optional<std::string> attr_s_opt(const char* name) const {
    const char* v = nullptr;
    if (api_->attr_string(c_, name, &v) && v) return std::string(v);
    return std::nullopt;
  }
  std::optional<Dims> attr_ints_opt(const char* name) const {
    const int64_t* v = nullptr;
    size_t n = 0;
    if (!api_->attr_ints(c_, name, &v, &n)) return std::nullopt;
    return Dims(v, v + n);
  }
  std::optional<std::vector<float>> attr_floats_opt(const char* name) const {
    const float* v = nullptr;
    size_t n = 0;
    if (!api_->attr_floats(c_, name, &v, &n)) return std::nullopt;
    return std::vector<float>(v, v + n);
  }
  std::optional<std::vector<std::string>> attr_strings_opt(const char* name) const {
    const char* const* v = nullptr;
    size_t n = 0;
    if (!api_->attr_strings || !api_->attr_strings(c_, name, &v, &n)) return std::nullopt;
    std::vector<std::string> r;
    for (size_t i = 0; i < n; ++i) r.emplace_back(v[i] ? v[i] : "");
    return r;
  }
  // A tensor attribute (host memory), NULL when absent.
  const keel_tensor_t* attr_tensor(const char* name) const {
    const keel_tensor_t* t = nullptr;
    if (!api_->attr_tensor || !api_->attr_tensor(c_, name, &t)) return nullptr;
    return t;
  }

  // --- the node and the call ---
  // The node's name ("" when it has none).
  const char* node_name() const {
    const char* n = api_->node_name ? api_->node_name(c_) : nullptr;
    return n ? n : "";
  }
  // The opset version the node was imported at (0 when the core does not say).
  int32_t opset() const { return api_->opset ? api_->opset(c_) : 0; }
  int32_t device_index() const { return api_->device_index(c_); }
  keel_stream_t stream() const { return api_->stream(c_); }
  int32_t thread_count() const { return api_->thread_count(c_); }
  // 1 when the session profiles this compute (ABI 1.3; false on an older core).
  bool profiling() const { return KEEL_HAS_MEMBER(api_, keel_kernel_api_t, profiling) && api_->profiling(c_) != 0; }

  // Runs f(begin, end) over [0, n) in chunks of at least min_chunk on the core's thread pool; returns when every
  // chunk is done. Exceptions thrown by f are caught per chunk and the first is rethrown here.
  template <class F>
  void parallel_for(int64_t n, int64_t min_chunk, F&& f) const {
    if (n <= 0) return;
    if (min_chunk < 1) min_chunk = 1;
    if (n <= min_chunk || api_->parallel_for == nullptr) {
      f(int64_t(0), n);
      return;
    }
    struct Arg {
      std::remove_reference_t<F>* f;
      std::mutex m;
      std::exception_ptr err;
    } arg{&f, {}, {}};
    api_->parallel_for(
        c_, n, min_chunk,
        [](void* a, int64_t b, int64_t e) {
          auto* ar = static_cast<Arg*>(a);
          try {
            (*ar->f)(b, e);
          } catch (...) {
            std::lock_guard<std::mutex> lock(ar->m);
            if (!ar->err) ar->err = std::current_exception();
          }
        },
        &arg);
    if (arg.err) std::rethrow_exception(arg.err);
  }

 private:
  keel_kernel_context_t* c_;
  const keel_kernel_api_t* api_;
};

// ------------------------------------------------------------------------------------------------ the C edge

// Which entry a body runs in. At create every exception is a rejection: the core then tries the next kernel.
enum class Stage { kCreate, kCompute };

// A status as code and message, before the host makes it.
struct Outcome {
  int32_t code = KEEL_STATUS_OK;
  std::string message;
};

// No library-specific exceptions (the default of guard's `translate`).
struct NoTranslate {
  bool operator()(Stage, Outcome*) const { return false; }
};

// The outcome of the exception being handled (call only inside a catch block):
//   Reject                    UNIMPLEMENTED, its reason;
//   Failure                   its code and message (UNIMPLEMENTED at create);
//   translate(stage, &out)    true for a library's own exceptions it recognises (it rethrows with `throw;` inside a
//                             try and fills `out`): e.g. oneDNN's dnnl::error;
//   std::bad_alloc            OUT_OF_MEMORY "host allocation failed" (at create: a rejection like any other);
//   other std::exception      INTERNAL what() (at create: UNIMPLEMENTED "create failed: " what());
//   anything else             INTERNAL "unknown exception" (at create: UNIMPLEMENTED "create failed: unknown
//   exception").
template <class Translate = NoTranslate>
Outcome current_outcome(Stage stage, Translate&& translate = Translate{}) {
  const bool create = stage == Stage::kCreate;
  const int32_t other = create ? KEEL_STATUS_UNIMPLEMENTED : KEEL_STATUS_INTERNAL;
  try {
    throw;
  } catch (const Reject& r) {
    return {KEEL_STATUS_UNIMPLEMENTED, r.why};
  } catch (const Failure& f) {
    return {create ? static_cast<int32_t>(KEEL_STATUS_UNIMPLEMENTED) : f.code, f.message};
  } catch (...) {
    Outcome o;
    if (translate(stage, &o)) return o;
    try {
      throw;
    } catch (const std::bad_alloc& e) {
      if (create) return {other, std::string("create failed: ") + e.what()};
      return {KEEL_STATUS_OUT_OF_MEMORY, "host allocation failed"};
    } catch (const std::exception& e) {
      return {other, create ? std::string("create failed: ") + e.what() : std::string(e.what())};
    } catch (...) {
      return {other, create ? "create failed: unknown exception" : "unknown exception"};
    }
  }
}

// Runs body() at a kernel's C edge and returns NULL, or a status made by `host` from what it threw
// (current_outcome), with `prefix` in front of the message (e.g. the kernel's name and ": "). noexcept in effect:
// should even the status text fail to allocate, the message is dropped.
template <class Body, class Translate = NoTranslate>
keel_status_t guard(const keel_core_api_t* host, Stage stage, Body&& body, const std::string& prefix = std::string(),
                    Translate&& translate = Translate{}) {
  Outcome o;
  try {
    body();
    return nullptr;
  } catch (...) {
    try {
      o = current_outcome(stage, translate);
    } catch (...) {
      o = {stage == Stage::kCreate ? static_cast<int32_t>(KEEL_STATUS_UNIMPLEMENTED) : KEEL_STATUS_OUT_OF_MEMORY, ""};
    }
  }
  try {
    return host->status_create(o.code, (prefix + o.message).c_str());
  } catch (...) {
    return host->status_create(o.code, "");
  }
}

}  // namespace keel::sdk
