// Kernel acceptance, ranking and fall-through for sessions and eager ops (see kernel_dispatch.h).
#include "core/runtime/kernel_dispatch.h"

#include <onnx/defs/schema.h>

#include <algorithm>

#include "core/base/log.h"
#include "core/runtime/kernel_context.h"

namespace keel::dispatch {

CallTypes call_types(const Node& node, const Graph& g) {
  auto dtype_of = [&](const std::string& v) -> DType {
    if (v.empty()) return DType::kUndefined;
    if (auto it = g.initializers.find(v); it != g.initializers.end()) return it->second.dtype();
    const ValueInfo* vi = g.info(v);
    return vi ? vi->dtype : DType::kUndefined;
  };
  CallTypes t;
  t.inputs.reserve(node.inputs.size());
  t.outputs.reserve(node.outputs.size());
  for (const auto& v : node.inputs) t.inputs.push_back(dtype_of(v));
  for (const auto& v : node.outputs) t.outputs.push_back(dtype_of(v));
  return t;
}

bool kernel_accepts(const KernelEntry& k, const Node& node, int32_t opset, const CallTypes& types, std::string* why) {
  if (k.constraints.empty()) return true;
  const onnx::OpSchema* schema =
      onnx::OpSchemaRegistry::Schema(node.op_type, opset, node.domain.empty() ? onnx::ONNX_DOMAIN : node.domain);
  if (schema == nullptr) return true;  // custom ops: the kernel's create decides
  auto check_side = [&](const std::vector<onnx::OpSchema::FormalParameter>& formals, const std::vector<DType>& actual) {
    for (size_t i = 0; i < actual.size(); ++i) {
      if (formals.empty()) return true;
      const auto& f = formals[std::min(i, formals.size() - 1)];
      if (actual[i] == DType::kUndefined) continue;
      const auto* allowed = k.allowed(f.GetTypeStr());
      if (allowed && std::find(allowed->begin(), allowed->end(), actual[i]) == allowed->end()) {
        if (why) *why = "kernel " + k.name + " does not take " + dtype_name(actual[i]) + " for " + f.GetTypeStr();
        return false;
      }
    }
    return true;
  };
  return check_side(schema->inputs(), types.inputs) && check_side(schema->outputs(), types.outputs);
}

std::vector<const KernelEntry*> ranked_kernels(const Registry& reg, const Node& node, int32_t opset,
                                               const std::string& device_type) {
  return reg.kernels_for(node.domain, node.op_type, opset, device_type);
}

StatusOr<KernelChoice> take_kernel(std::vector<const KernelEntry*>& candidates, const Node& node, int32_t opset,
                                   const CallTypes& types, const FillCreateContext& fill, const std::string& who,
                                   std::vector<std::string>* rejections) {
  size_t taken = 0;
  KernelChoice choice;
  Status error = Status::ok();
  while (taken < candidates.size()) {
    const KernelEntry* k = candidates[taken++];
    std::string why;
    if (!kernel_accepts(*k, node, opset, types, &why)) {
      if (rejections) rejections->push_back(std::move(why));
      continue;
    }
    void* state = k->def.user_data;
    if (k->def.create) {
      keel_kernel_context_t ctx;
      fill(ctx);
      ctx.phase = keel_kernel_context_t::Phase::kCreate;
      Status st = Status::from_c(k->def.create(k->def.user_data, &ctx, &state));
      if (st.code() == StatusCode::kUnimplemented) {
        log::debug("kernel {} rejected node '{}': {}", k->name, node.name, st.message());
        if (rejections) rejections->push_back(k->name + ": " + st.message());
        continue;
      }
      if (!st.is_ok()) {
        error = st.with_context((who.empty() ? std::string() : who + " ") + "kernel " + k->name);
        break;
      }
    }
    choice.kernel = k;
    choice.state = state;
    break;
  }
  candidates.erase(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(taken));
  if (!error.is_ok()) return error;
  return choice;
}

}  // namespace keel::dispatch
