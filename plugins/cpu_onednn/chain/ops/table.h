// plugins/cpu_onednn/chain/ops/table.h — (internal) the one list of the ops a chain takes. Each row names the op,
// the domains it is claimed in, the Builder function that builds it, its role at claim time and how the 1-D lift
// treats it. compute_ops(), claimable_domain(), is_view_op(), int8_op() (chain/scan.cc), Builder::build()'s
// dispatch and lift_1d are all read off this table: an op missing here is neither claimed nor built.
// The table is immutable after its first use (a function-local static): safe from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace keel::onednn::chain {

class Builder;

// Domains a row is claimed in (a bit set).
enum ChainDomain : unsigned { kOnnx = 1, kKeel = 2, kOnnxAndKeel = kOnnx | kKeel };

// What the claim does with a node of the op.
enum class ChainRole {
  kCompute,  // a chain candidate (compute_ops()) that does real work
  kView,     // a candidate that only views or moves data: a claim needs real work besides it (is_view_op())
  kInt8,     // taken through int8_candidate (int8_op()), not compute_ops()
};

// How lift_1d treats a rank-3 node of the op when it rewrites 1-D convolutions and poolings as 2-D ones.
enum class Lift1d {
  kNo,      // not lifted: a lifted value read by it is not lifted
  kSeed,    // a 1-D convolution or pooling: where lifting starts
  kUnary,   // one data input and one output, lifted with its neighbours (other inputs constants)
  kBinary,  // several data inputs (constants of rank <= 3 broadcast; Concat takes none)
};

struct ChainOp {
  const char* op;                       // ONNX op type
  unsigned domains;                     // ChainDomain bits
  void (Builder::*build)(size_t node);  // builds the node (throws Reject when it cannot)
  ChainRole role;
  Lift1d lift;
};

// Every row, in no particular order (op types are unique).
const std::vector<ChainOp>& chain_ops();
// The row of `op`, or nullptr.
const ChainOp* find_chain_op(const std::string& op);

}  // namespace keel::onednn::chain
