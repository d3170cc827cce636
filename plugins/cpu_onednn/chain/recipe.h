// plugins/cpu_onednn/chain/recipe.h — (internal) what a chain is built from: the claim-time snapshot of its
// nodes (NodeDesc, attributes), constants (ConstT) and boundary (Recipe). A Recipe owns copies of everything it
// needs: it outlives the graph it was taken from. Types only; not thread-safe to mutate, safe to read from any thread.
#pragma once

// channels-last between int8 steps, f32 ones are quantized straight from their producer's layout.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <sstream>
#include <tuple>

#include "chain/const_alloc.h"
#include "common/common.h"
#include "common/conv_pick.h"
#include "kernels/int8.h"
#include "steps/attention.h"
#include "steps/convpool.h"
#include "steps/dilated.h"
#include "steps/dw_ln.h"
#include "steps/dwsilu.h"
#include "steps/expand_dw.h"
#include "steps/gelu.h"
#include "steps/grouped.h"
#include "steps/im2row.h"
#include "steps/int8_expand_dw.h"
#include "steps/int8_pool.h"
#include "steps/int8_stem.h"
#include "steps/narrow_gemm.h"
#include "steps/pointwise.h"
#include "steps/pool_arg.h"
#include "steps/resize.h"
#include "steps/se.h"
#include "steps/silu.h"
#include "steps/skinny_gemm.h"
#include "steps/wino4.h"

namespace keel::onednn::chain {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using alg = dnnl::algorithm;
using md_t = dnnl::memory::desc;

// To the current environment's log (the claim hook and the chains' entries run in its InstanceScope).
inline void debug_log(const std::string& msg) { host_log(KEEL_LOG_DEBUG, msg); }

// ------------------------------------------------------------------------------------------ claim-time snapshot

struct Attr {
  int32_t kind = KEEL_ATTR_UNDEFINED;
  int64_t i = 0;
  float f = 0;
  std::string s;
  Dims ints;
  std::vector<float> floats;
};

struct NodeDesc {
  keel_node_id_t id = 0;
  std::string op, name;
  std::vector<std::string> in, out;
  std::map<std::string, Attr> attrs;
  int64_t ai(const char* n, int64_t d) const {
    auto it = attrs.find(n);
    return it != attrs.end() && it->second.kind == KEEL_ATTR_INT ? it->second.i : d;
  }
  float af(const char* n, float d) const {
    auto it = attrs.find(n);
    return it != attrs.end() && it->second.kind == KEEL_ATTR_FLOAT ? it->second.f : d;
  }
  std::string as(const char* n, const std::string& d) const {
    auto it = attrs.find(n);
    return it != attrs.end() && it->second.kind == KEEL_ATTR_STRING ? it->second.s : d;
  }
  Dims ais(const char* n, const Dims& d) const {
    auto it = attrs.find(n);
    return it != attrs.end() && it->second.kind == KEEL_ATTR_INTS ? it->second.ints : d;
  }
  bool has(const char* n) const { return attrs.count(n) > 0; }
  std::string in_at(size_t i) const { return i < in.size() ? in[i] : std::string(); }
};

// A constant value (host copy).
struct ConstT {
  int32_t dtype = KEEL_DTYPE_UNDEFINED;
  Dims dims;
  std::vector<char, ConstAlloc<char>> bytes;
  int64_t count() const { return numel(dims); }
  // Element i as float / int64 (f32, f64, i32, i64 are read; others throw Reject).
  double at(int64_t i) const {
    switch (dtype) {
      case KEEL_DTYPE_F32: return reinterpret_cast<const float*>(bytes.data())[i];
      case KEEL_DTYPE_F64: return reinterpret_cast<const double*>(bytes.data())[i];
      case KEEL_DTYPE_I32: return reinterpret_cast<const int32_t*>(bytes.data())[i];
      case KEEL_DTYPE_I64: return static_cast<double>(reinterpret_cast<const int64_t*>(bytes.data())[i]);
    }
    throw Reject{"constant of an unsupported dtype"};
  }
  int64_t iat(int64_t i) const {
    if (dtype == KEEL_DTYPE_I64) return reinterpret_cast<const int64_t*>(bytes.data())[i];
    return static_cast<int64_t>(at(i));
  }
  const float* f32() const { return reinterpret_cast<const float*>(bytes.data()); }
};

// Everything a plan is built from; owned by the claim (it outlives the graph).
struct Recipe {
  std::string name;
  std::vector<NodeDesc> nodes;       // claimed nodes, topological order (constant nodes included)
  std::map<std::string, Dims> dims;  // static dims of the values the nodes read and write (when known)
  std::map<std::string, int32_t> dtypes;
  std::map<std::string, ConstT> consts;      // constant values
  std::vector<std::string> inputs, outputs;  // the boundary, in the core's order
  // int8 values the graph holds channels-last (fuse_qdq: NHWC bytes under the NCHW shape): read and written so at
  // the boundary (Builder::boundary_md).
  std::set<std::string> channels_last;
};

}  // namespace keel::onednn::chain
