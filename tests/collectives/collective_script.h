// collective_script.h — random scripts of collectives for the multi-process fault fuzzer
// (GlooCollectives.RandomScriptsAcrossProcessesWithAPeerDyingAnywhere, run by gloo_rank_helper's `script` mode).
//
// A script is a sequence of 4-24 operations drawn from a seed, the same on every rank: all-reduce (sum, min, max; avg
// for floats), broadcast from a random root, all-gather, reduce-scatter, barrier, and a send/recv ring; dtypes f32,
// f64, i32, i64; 0 to 2 M elements (log-uniform, so that every all-reduce algorithm of the plugin is drawn: the direct
// exchange, cross memory between processes of one host, the mesh ring); in place or not. Element i of rank r's input
// is (r + 1) * (i % 7 + 1): every result is a small integer, checked exactly.
//
// Thread-safety: plain functions of their arguments.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hal/device.h"

namespace keel::testing {

struct ScriptOp {
  enum Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kBarrier, kSendRecv } kind = kBarrier;
  DType dtype = DType::kF32;
  uint64_t count = 0;  // elements per rank (reduce-scatter: what each rank receives)
  keel_reduce_op_t op = KEEL_REDUCE_SUM;
  int32_t root = 0;
  bool in_place = false;
};

inline std::string describe(const ScriptOp& o) {
  static const char* kinds[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "send/recv"};
  static const char* ops[] = {"sum", "prod", "min", "max", "avg"};
  std::string s = kinds[o.kind];
  if (o.kind == ScriptOp::kBarrier) return s;
  s += std::string(" ") + dtype_name(o.dtype) + " x " + std::to_string(o.count);
  if (o.kind == ScriptOp::kAllReduce || o.kind == ScriptOp::kReduceScatter) s += std::string(" ") + ops[o.op];
  if (o.kind == ScriptOp::kBroadcast) s += " root " + std::to_string(o.root);
  if (o.in_place) s += " in place";
  return s;
}

inline std::vector<ScriptOp> make_script(uint64_t seed, int32_t world) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  std::vector<ScriptOp> script(static_cast<size_t>(4 + pick(21)));
  const DType dtypes[] = {DType::kF32, DType::kF64, DType::kI32, DType::kI64};
  for (auto& o : script) {
    o.kind = static_cast<ScriptOp::Kind>(pick(6));
    o.dtype = dtypes[pick(4)];
    // 0, or log-uniform over 1 .. 2^21 elements.
    o.count = pick(12) == 0 ? 0 : static_cast<uint64_t>(1) << pick(22);
    o.count += o.count > 1 ? rng() % o.count : 0;
    if (o.kind == ScriptOp::kAllGather || o.kind == ScriptOp::kReduceScatter) o.count /= static_cast<uint64_t>(world);
    const keel_reduce_op_t ops[] = {KEEL_REDUCE_SUM, KEEL_REDUCE_MIN, KEEL_REDUCE_MAX, KEEL_REDUCE_AVG};
    o.op = ops[pick(dtype_is_integer(o.dtype) ? 3 : 4)];
    o.root = pick(world);
    o.in_place = (o.kind == ScriptOp::kAllReduce || o.kind == ScriptOp::kBroadcast) && pick(2) == 0;
  }
  return script;
}

// Rank r's input element i.
inline double script_value(int32_t r, uint64_t i) { return (r + 1) * static_cast<double>(i % 7 + 1); }

inline double script_reduced(keel_reduce_op_t op, int32_t world, uint64_t i) {
  const double m = static_cast<double>(i % 7 + 1);
  switch (op) {
    case KEEL_REDUCE_SUM: return world * (world + 1) / 2.0 * m;
    case KEEL_REDUCE_MIN: return m;
    case KEEL_REDUCE_MAX: return world * m;
    case KEEL_REDUCE_AVG: return (world + 1) / 2.0 * m;
    default: return -1;
  }
}

// A buffer of one dtype, read and written as doubles (every value a script uses is exact in each).
struct ScriptBuffer {
  DType dtype;
  std::vector<char> bytes;
  ScriptBuffer(DType t, uint64_t n) : dtype(t), bytes(n * dtype_size(t) + 1) {}
  void* data() { return bytes.data(); }
  uint64_t size() const { return (bytes.size() - 1) / dtype_size(dtype); }
  void set(uint64_t i, double v) {
    switch (dtype) {
      case DType::kF32: put(i, static_cast<float>(v)); break;
      case DType::kF64: put(i, v); break;
      case DType::kI32: put(i, static_cast<int32_t>(v)); break;
      default: put(i, static_cast<int64_t>(v)); break;
    }
  }
  double get(uint64_t i) const {
    switch (dtype) {
      case DType::kF32: return take<float>(i);
      case DType::kF64: return take<double>(i);
      case DType::kI32: return take<int32_t>(i);
      default: return static_cast<double>(take<int64_t>(i));
    }
  }

 private:
  template <class T>
  void put(uint64_t i, T v) {
    std::memcpy(bytes.data() + i * sizeof(T), &v, sizeof(T));
  }
  template <class T>
  T take(uint64_t i) const {
    T v;
    std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
    return v;
  }
};

// Runs `o` on `comm` as rank `r`. Returns "" when it ran and every element is right; "error: ..." when the
// collective returned an error; "wrong: ..." when it returned OK with a wrong element (corruption).
inline std::string run_script_op(const hal::Communicator& comm, const ScriptOp& o) {
  const int32_t r = comm.rank(), w = comm.size();
  const uint64_t n = o.count;
  auto fill = [&](ScriptBuffer& b) {
    for (uint64_t i = 0; i < b.size(); ++i) b.set(i, script_value(r, i));
  };
  auto check = [&](const ScriptBuffer& b, auto&& want) -> std::string {
    for (uint64_t i = 0; i < b.size(); ++i)
      if (b.get(i) != want(i))
        return "wrong: " + describe(o) + ": element " + std::to_string(i) + " is " + std::to_string(b.get(i)) +
               ", want " + std::to_string(want(i));
    return "";
  };
  auto error = [&](const Status& s) { return "error: " + describe(o) + ": " + s.to_string(); };
  switch (o.kind) {
    case ScriptOp::kBarrier: {
      Status s = comm.barrier();
      return s.is_ok() ? "" : error(s);
    }
    case ScriptOp::kAllReduce: {
      ScriptBuffer in(o.dtype, n), out(o.dtype, n);
      fill(in);
      ScriptBuffer& dst = o.in_place ? in : out;
      Status s = comm.all_reduce(in.data(), dst.data(), n, o.dtype, o.op);
      if (!s.is_ok()) return error(s);
      return check(dst, [&](uint64_t i) { return script_reduced(o.op, w, i); });
    }
    case ScriptOp::kBroadcast: {
      ScriptBuffer in(o.dtype, n), out(o.dtype, n);
      fill(in);
      ScriptBuffer& dst = o.in_place ? in : out;
      Status s = comm.broadcast(in.data(), dst.data(), n, o.dtype, o.root);
      if (!s.is_ok()) return error(s);
      return check(dst, [&](uint64_t i) { return script_value(o.root, i); });
    }
    case ScriptOp::kAllGather: {
      ScriptBuffer in(o.dtype, n), out(o.dtype, n * static_cast<uint64_t>(w));
      fill(in);
      Status s = comm.all_gather(in.data(), out.data(), n, o.dtype);
      if (!s.is_ok()) return error(s);
      return check(out,
                   [&](uint64_t i) { return script_value(static_cast<int32_t>(i / n), i % n); });  // n > 0 for any i
    }
    case ScriptOp::kReduceScatter: {
      ScriptBuffer in(o.dtype, n * static_cast<uint64_t>(w)), out(o.dtype, n);
      fill(in);
      Status s = comm.reduce_scatter(in.data(), out.data(), n, o.dtype, o.op);
      if (!s.is_ok()) return error(s);
      return check(out, [&](uint64_t i) { return script_reduced(o.op, w, static_cast<uint64_t>(r) * n + i); });
    }
    case ScriptOp::kSendRecv: {
      // A ring: even ranks send first, odd ones receive first (blocking point-to-point).
      ScriptBuffer out(o.dtype, n), in(o.dtype, n);
      fill(out);
      const int32_t next = (r + 1) % w, prev = (r + w - 1) % w;
      Status s1 = r % 2 == 0 ? comm.send(out.data(), n, o.dtype, next) : comm.recv(in.data(), n, o.dtype, prev);
      if (!s1.is_ok()) return error(s1);
      Status s2 = r % 2 == 0 ? comm.recv(in.data(), n, o.dtype, prev) : comm.send(out.data(), n, o.dtype, next);
      if (!s2.is_ok()) return error(s2);
      return check(in, [&](uint64_t i) { return script_value(prev, i); });
    }
  }
  return "error: unknown op";
}

}  // namespace keel::testing
