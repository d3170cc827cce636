// keel_make_test_model OUT.onnx — writes the small model the install test runs (no binary files in git):
//   x: f32[2, 4] → MatMul(W 4x4) → Add(b) → Relu → Sigmoid → Add(·, x) → y
// MatMul, Add and Relu are what the example vendor plugin's "sim" device implements; Sigmoid is not, so it falls
// back to the CPU, and the second Add reads a CPU value and the input.
#include <cstdio>
#include <vector>

#include "core/base/graph.h"
#include "core/runtime/onnx_io.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.onnx\n", argv[0]);
    return 2;
  }
  using namespace keel;
  GraphBuilder g("sim_demo", 17);
  auto x = g.input("x", DType::kF32, {2, 4});
  std::vector<float> w(16), b(4);
  for (int i = 0; i < 16; ++i) w[i] = (i % 5 == 0 ? 1.f : 0.f) + 0.01f * static_cast<float>(i);
  for (int i = 0; i < 4; ++i) b[i] = 0.1f * static_cast<float>(i) - 0.15f;
  auto mm = g.op1("MatMul", {x, g.constant("w", Tensor::f32({4, 4}, w))});
  auto add = g.op1("Add", {mm, g.constant("b", Tensor::f32({4}, b))});
  auto relu = g.op1("Relu", {add});
  auto sig = g.op1("Sigmoid", {relu});
  auto y = g.op1("Add", {sig, x});
  g.output(y);
  Status st = save_onnx(g.take(), argv[1]);
  if (!st.is_ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}
