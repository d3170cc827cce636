// io_binding_make_model OUT.onnx — writes the model io_binding_example runs (no binary files in git):
//   x: f32[2, 3] → Relu → Add(·, x) → y
#include <cstdio>

#include "core/base/graph.h"
#include "core/runtime/onnx_io.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.onnx\n", argv[0]);
    return 2;
  }
  using namespace keel;
  GraphBuilder g("relu_add", 17);
  auto x = g.input("x", DType::kF32, {2, 3});
  Node add;
  add.name = "add";
  add.op_type = "Add";
  add.inputs = {g.op1("Relu", {x}), x};
  add.outputs = {"y"};
  g.graph().add_node(std::move(add));
  g.graph().value_info["y"] = ValueInfo{DType::kF32, Shape{2, 3}};
  g.output("y");
  Status st = save_onnx(g.take(), argv[1]);
  if (!st.is_ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
