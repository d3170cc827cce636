// keel/ops/reference/testing/fake_context.h — a throwaway, self-contained stand-in for the core's kernel context,
// so kernels written against keel/plugin.h can be run without the executor: a fake keel_kernel_api_t over
// std::vectors, and a fake host that records registered kernel definitions.
//
// Usage:
//   keel::ops::testing::FakeRegistry reg;            // registers the reference kernels into itself
//   FakeNode n("Conv", 17);
//   n.add_input(FakeTensor::of<float>({1,1,3,3}, {...}));
//   n.attrs["pads"] = FakeAttr::ints({1,1,1,1});
//   n.output_dtypes = {KEEL_DTYPE_F32};
//   keel_status_t s = reg.run(n);                    // n.outputs[i] hold the results
//
// Not thread-safe; parallel_for runs its chunks sequentially (in several chunks, to exercise chunk boundaries).
#pragma once

#include <keel/plugin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ops/reference/reference_kernels.h"

namespace keel::ops::testing {

struct FakeTensor {
  int32_t dtype = KEEL_DTYPE_UNDEFINED;
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
  keel_tensor_t view{};

  template <class T>
  static FakeTensor of(int32_t dtype, std::vector<int64_t> dims, const std::vector<T>& values) {
    FakeTensor t;
    t.dtype = dtype;
    t.dims = std::move(dims);
    t.data.resize(values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
    return t;
  }
  static FakeTensor f32(std::vector<int64_t> dims, const std::vector<float>& v) { return of(KEEL_DTYPE_F32, dims, v); }
  static FakeTensor i64(std::vector<int64_t> dims, const std::vector<int64_t>& v) {
    return of(KEEL_DTYPE_I64, dims, v);
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(data.data());
  }
  template <class T>
  std::vector<T> values() const {
    return std::vector<T>(as<T>(), as<T>() + numel());
  }

  const keel_tensor_t* c_view() {
    view.struct_size = sizeof(view);
    view.dtype = dtype;
    view.ndim = static_cast<int32_t>(dims.size());
    view.dims = dims.data();
    view.data = data.empty() ? nullptr : data.data();
    view.byte_size = data.size();
    view.memory_kind = KEEL_MEMORY_HOST;
    view.device_index = 0;
    return &view;
  }
};

struct FakeAttr {
  int32_t kind = KEEL_ATTR_UNDEFINED;
  int64_t i = 0;
  float f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  std::vector<std::string> strings;
  std::vector<const char*> cstrs;
  FakeTensor t;

  static FakeAttr integer(int64_t v) {
    FakeAttr a;
    a.kind = KEEL_ATTR_INT;
    a.i = v;
    return a;
  }
  static FakeAttr real(float v) {
    FakeAttr a;
    a.kind = KEEL_ATTR_FLOAT;
    a.f = v;
    return a;
  }
  static FakeAttr str(std::string v) {
    FakeAttr a;
    a.kind = KEEL_ATTR_STRING;
    a.s = std::move(v);
    return a;
  }
  static FakeAttr int_list(std::vector<int64_t> v) {
    FakeAttr a;
    a.kind = KEEL_ATTR_INTS;
    a.ints = std::move(v);
    return a;
  }
  static FakeAttr float_list(std::vector<float> v) {
    FakeAttr a;
    a.kind = KEEL_ATTR_FLOATS;
    a.floats = std::move(v);
    return a;
  }
  static FakeAttr tensor(FakeTensor v) {
    FakeAttr a;
    a.kind = KEEL_ATTR_TENSOR;
    a.t = std::move(v);
    return a;
  }
  static FakeAttr string_list(std::vector<std::string> v) {
    FakeAttr a;
    a.kind = KEEL_ATTR_STRINGS;
    a.strings = std::move(v);
    return a;
  }
};

struct FakeNode {
  std::string op_type, domain, name;
  int32_t opset = 17;
  std::vector<std::optional<FakeTensor>> inputs;  // nullopt = omitted optional input
  std::vector<int32_t> output_dtypes;             // UNDEFINED = omitted optional output
  std::map<std::string, FakeAttr> attrs;
  std::vector<FakeTensor> outputs;  // written by the kernel through output()
  std::vector<bool> output_written;

  FakeNode() = default;
  FakeNode(std::string op, int32_t op_set) : op_type(std::move(op)), opset(op_set) {}
  void add_input(FakeTensor t) { inputs.emplace_back(std::move(t)); }
  void add_absent_input() { inputs.emplace_back(std::nullopt); }
};

namespace detail {
inline FakeNode* node(const keel_kernel_context_t* c) {
  return reinterpret_cast<FakeNode*>(const_cast<keel_kernel_context_t*>(c));
}
inline const FakeAttr* find(const keel_kernel_context_t* c, const char* name, int32_t kind) {
  auto* n = node(c);
  auto it = n->attrs.find(name);
  if (it == n->attrs.end() || it->second.kind != kind) return nullptr;
  return &it->second;
}
inline keel_status_t fake_status(int32_t code, const char* msg);
}  // namespace detail

// Set KEEL_FAKE_THREADS=1 to run parallel_for chunks on real threads.
inline bool fake_threads() {
  static bool on = [] {
    const char* e = std::getenv("KEEL_FAKE_THREADS");
    return e && *e && *e != '0';
  }();
  return on;
}

inline const keel_kernel_api_t* fake_kernel_api() {
  static keel_kernel_api_t api = [] {
    keel_kernel_api_t a{};
    a.struct_size = sizeof(a);
    a.abi_major = KEEL_PLUGIN_ABI_MAJOR;
    a.abi_minor = KEEL_PLUGIN_ABI_MINOR;
    a.input_count = [](const keel_kernel_context_t* c) { return static_cast<int32_t>(detail::node(c)->inputs.size()); };
    a.input = [](const keel_kernel_context_t* c, int32_t i) -> const keel_tensor_t* {
      auto* n = detail::node(c);
      if (i < 0 || i >= static_cast<int32_t>(n->inputs.size()) || !n->inputs[i]) return nullptr;
      return n->inputs[i]->c_view();
    };
    a.output_count = [](const keel_kernel_context_t* c) {
      return static_cast<int32_t>(detail::node(c)->output_dtypes.size());
    };
    a.output = [](keel_kernel_context_t* c, int32_t i, int32_t ndim, const int64_t* dims,
                  keel_tensor_t** out) -> keel_status_t {
      auto* n = detail::node(c);
      if (i < 0 || i >= static_cast<int32_t>(n->output_dtypes.size()))
        return detail::fake_status(KEEL_STATUS_OUT_OF_RANGE, "fake: output index out of range");
      n->outputs.resize(n->output_dtypes.size());
      n->output_written.resize(n->output_dtypes.size());
      FakeTensor& t = n->outputs[i];
      t.dtype = n->output_dtypes[i];
      t.dims.assign(dims, dims + ndim);
      size_t es = 0;
      switch (t.dtype) {
        case KEEL_DTYPE_F32:
        case KEEL_DTYPE_I32:
        case KEEL_DTYPE_U32: es = 4; break;
        case KEEL_DTYPE_F64:
        case KEEL_DTYPE_I64:
        case KEEL_DTYPE_U64: es = 8; break;
        case KEEL_DTYPE_F16:
        case KEEL_DTYPE_BF16:
        case KEEL_DTYPE_I16:
        case KEEL_DTYPE_U16: es = 2; break;
        case KEEL_DTYPE_I8:
        case KEEL_DTYPE_U8:
        case KEEL_DTYPE_BOOL: es = 1; break;
        default: return detail::fake_status(KEEL_STATUS_INVALID_ARGUMENT, "fake: output dtype undefined");
      }
      for (int64_t d : t.dims)
        if (d < 0) return detail::fake_status(KEEL_STATUS_INVALID_ARGUMENT, "fake: negative output dimension");
      double bytes = static_cast<double>(es);
      for (int64_t d : t.dims) bytes *= static_cast<double>(d);
      if (bytes > static_cast<double>(1ull << 30))
        return detail::fake_status(KEEL_STATUS_OUT_OF_MEMORY, "fake: > 1 GiB");
      // Poison the buffer so that unwritten elements show up in comparisons.
      t.data.assign(static_cast<size_t>(t.numel()) * es, 0xAB);
      n->output_written[i] = true;
      *out = const_cast<keel_tensor_t*>(t.c_view());
      return nullptr;
    };
    a.output_dtype = [](const keel_kernel_context_t* c, int32_t i) -> int32_t {
      auto* n = detail::node(c);
      if (i < 0 || i >= static_cast<int32_t>(n->output_dtypes.size())) return KEEL_DTYPE_UNDEFINED;
      return n->output_dtypes[i];
    };
    a.attr_int = [](const keel_kernel_context_t* c, const char* name, int64_t* v) {
      auto* at = detail::find(c, name, KEEL_ATTR_INT);
      if (at) *v = at->i;
      return at ? 1 : 0;
    };
    a.attr_float = [](const keel_kernel_context_t* c, const char* name, float* v) {
      auto* at = detail::find(c, name, KEEL_ATTR_FLOAT);
      if (at) *v = at->f;
      return at ? 1 : 0;
    };
    a.attr_string = [](const keel_kernel_context_t* c, const char* name, const char** v) {
      auto* at = detail::find(c, name, KEEL_ATTR_STRING);
      if (at) *v = at->s.c_str();
      return at ? 1 : 0;
    };
    a.attr_ints = [](const keel_kernel_context_t* c, const char* name, const int64_t** v, size_t* n) {
      auto* at = detail::find(c, name, KEEL_ATTR_INTS);
      if (at) {
        *v = at->ints.data();
        *n = at->ints.size();
      }
      return at ? 1 : 0;
    };
    a.attr_floats = [](const keel_kernel_context_t* c, const char* name, const float** v, size_t* n) {
      auto* at = detail::find(c, name, KEEL_ATTR_FLOATS);
      if (at) {
        *v = at->floats.data();
        *n = at->floats.size();
      }
      return at ? 1 : 0;
    };
    a.attr_tensor = [](const keel_kernel_context_t* c, const char* name, const keel_tensor_t** v) {
      auto* at = const_cast<FakeAttr*>(detail::find(c, name, KEEL_ATTR_TENSOR));
      if (at) *v = at->t.c_view();
      return at ? 1 : 0;
    };
    a.attr_strings = [](const keel_kernel_context_t* c, const char* name, const char* const** v, size_t* n) {
      auto* at = const_cast<FakeAttr*>(detail::find(c, name, KEEL_ATTR_STRINGS));
      if (at) {
        at->cstrs.clear();
        for (auto& s : at->strings) at->cstrs.push_back(s.c_str());
        *v = at->cstrs.data();
        *n = at->cstrs.size();
      }
      return at ? 1 : 0;
    };
    a.node_name = [](const keel_kernel_context_t* c) { return detail::node(c)->name.c_str(); };
    a.opset = [](const keel_kernel_context_t* c) { return detail::node(c)->opset; };
    a.device_index = [](const keel_kernel_context_t*) { return int32_t(0); };
    a.stream = [](const keel_kernel_context_t*) -> keel_stream_t { return nullptr; };
    a.workspace = [](keel_kernel_context_t*, uint64_t, void**) -> keel_status_t {
      return detail::fake_status(KEEL_STATUS_UNIMPLEMENTED, "fake: no workspace");
    };
    a.parallel_for = [](const keel_kernel_context_t*, int64_t n, int64_t min_chunk, void (*fn)(void*, int64_t, int64_t),
                        void* arg) {
      int64_t chunk = std::max<int64_t>(min_chunk, (n + 3) / 4);
      if (chunk < 1) chunk = 1;
      if (!fake_threads()) {
        for (int64_t b = 0; b < n; b += chunk) fn(arg, b, std::min(n, b + chunk));
        return;
      }
      std::vector<std::thread> ts;  // one thread per chunk: finds data races under TSan/ASan
      for (int64_t b = 0; b < n; b += chunk) ts.emplace_back([=] { fn(arg, b, std::min(n, b + chunk)); });
      for (auto& t : ts) t.join();
    };
    a.thread_count = [](const keel_kernel_context_t*) { return int32_t(4); };
    return a;
  }();
  return &api;
}

namespace detail {
struct FakeStatus {
  keel_status_s s;
  std::string msg;
};
inline keel_status_t fake_status(int32_t code, const char* msg) {
  auto* f = new FakeStatus{};
  f->msg = msg ? msg : "";
  f->s.struct_size = sizeof(keel_status_s);
  f->s.code = code;
  f->s.message = f->msg.c_str();
  f->s.release = [](keel_status_s* s) { delete reinterpret_cast<FakeStatus*>(s); };
  return &f->s;
}
}  // namespace detail

// Records kernel definitions registered through a fake host, and runs nodes on them.
class FakeRegistry {
 public:
  struct Def {
    std::string op_type, domain, name;
    int32_t since, end;
    keel_status_t (*compute)(void*, keel_kernel_context_t*);
    void* user_data;
  };

  FakeRegistry() {
    host_.struct_size = sizeof(host_);
    host_.abi_major = KEEL_PLUGIN_ABI_MAJOR;
    host_.abi_minor = KEEL_PLUGIN_ABI_MINOR;
    host_.status_create = detail::fake_status;
    host_.register_kernel = [](keel_plugin_handle_t* p, const keel_kernel_def_t* d) -> keel_status_t {
      auto* self = reinterpret_cast<FakeRegistry*>(p);
      self->defs_.push_back({d->op_type, d->domain ? d->domain : "", d->name ? d->name : "", d->since_version,
                             d->end_version, d->compute, d->user_data});
      return nullptr;
    };
    host_.kernel = fake_kernel_api();
    init_status_ = keel::ops::register_reference_kernels(&host_, reinterpret_cast<keel_plugin_handle_t*>(this));
  }
  ~FakeRegistry() { keel_status_release(init_status_); }

  keel_status_t init_status() const { return init_status_; }
  const std::vector<Def>& defs() const { return defs_; }

  const Def* find(const std::string& op, const std::string& domain, int32_t opset) const {
    for (auto& d : defs_) {
      bool dom = d.domain == domain || (domain == "ai.onnx" && d.domain.empty());
      if (d.op_type == op && dom && opset >= d.since && (d.end == 0 || opset <= d.end)) return &d;
    }
    return nullptr;
  }

  // Runs the node; returns the kernel's status (or NOT_FOUND when no kernel matches). Caller releases it.
  keel_status_t run(FakeNode& n) const {
    const Def* d = find(n.op_type, n.domain, n.opset);
    if (!d) return detail::fake_status(KEEL_STATUS_NOT_FOUND, ("fake: no kernel for " + n.op_type).c_str());
    n.outputs.assign(n.output_dtypes.size(), FakeTensor{});
    n.output_written.assign(n.output_dtypes.size(), false);
    return d->compute(d->user_data, reinterpret_cast<keel_kernel_context_t*>(&n));
  }

 private:
  keel_core_api_t host_{};
  std::vector<Def> defs_;
  keel_status_t init_status_ = nullptr;
};

}  // namespace keel::ops::testing
