// Tests of the attribute checks: at load (before ONNX inference), inside ONNX inference (intermediate values), on the
// graph IR (infer_shapes: sessions and eager ops), and rule by rule.
#include "core/runtime/attribute_checks.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include "core/runtime/onnx_io.h"

namespace keel {
namespace {

OnnxLoadOptions quiet() {
  OnnxLoadOptions o;
  o.warn = [](const std::string&) {};
  return o;
}

void set_type(onnx::ValueInfoProto* vi, const std::string& name, const std::vector<int64_t>& dims) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  auto* sh = tt->mutable_shape();
  for (int64_t d : dims) sh->add_dim()->set_dim_value(d);
}

void add_ints(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

// The repro: y = Conv(x [1,1,5,5], w [1,1,3,3], strides) named conv0; with `relu_first`, x goes through a
// Relu first, so the Conv's input rank is known only to inference.
std::string conv_model(const std::vector<int64_t>& strides, bool relu_first) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* o = m.add_opset_import();
  o->set_domain("");
  o->set_version(13);
  auto* g = m.mutable_graph();
  g->set_name("g");
  set_type(g->add_input(), "x", {1, 1, 5, 5});
  set_type(g->add_output(), "y", {});
  for (int i = 0; i < 4; ++i) g->mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim();
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : {1, 1, 3, 3}) w->add_dims(d);
  for (int i = 0; i < 9; ++i) w->add_float_data(1.f);
  std::string x = "x";
  if (relu_first) {
    auto* r = g->add_node();
    r->set_op_type("Relu");
    r->add_input("x");
    r->add_output("r");
    x = "r";
  }
  auto* c = g->add_node();
  c->set_name("conv0");
  c->set_op_type("Conv");
  c->add_input(x);
  c->add_input("w");
  c->add_output("y");
  add_ints(c, "strides", strides);
  std::string s;
  m.SerializeToString(&s);
  return s;
}

TEST(AttributeChecks, ConvZeroStridesFailsAtLoadNamingNodeAndAttribute) {
  const std::string bytes = conv_model({0, 0}, false);
  auto g = load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet(), "m.onnx");
  ASSERT_FALSE(g.is_ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("node \"conv0\" (Conv): attribute strides = [0, 0]: every stride must be >= 1"),
            std::string::npos)
      << g.status().message();
}

TEST(AttributeChecks, ConvZeroStridesOnAnInferredValueFailsInsideInference) {
  const std::string bytes = conv_model({0, 0}, true);
  for (bool strict : {true, false}) {
    OnnxLoadOptions o = quiet();
    o.strict_shape_inference = strict;
    auto g = load_onnx_from_memory(bytes.data(), bytes.size(), {}, o, "m.onnx");
    if (strict) {
      ASSERT_FALSE(g.is_ok());
      EXPECT_NE(g.status().message().find("strides = [0, 0]"), std::string::npos) << g.status().message();
      EXPECT_NE(g.status().message().find("conv0"), std::string::npos) << g.status().message();
    } else if (g.is_ok()) {
      // Relaxed inference skips the node; the graph IR check (sessions and eager go through it) refuses it.
      Status st = infer_shapes(*g);
      ASSERT_FALSE(st.is_ok());
      EXPECT_NE(st.message().find("attribute strides = [0, 0]"), std::string::npos) << st.message();
    }
  }
}

TEST(AttributeChecks, ValidConvStillLoads) {
  const std::string bytes = conv_model({2, 2}, true);
  auto g = load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet(), "m.onnx");
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const ValueInfo* y = g->info("y");
  ASSERT_TRUE(y && y->shape);
  EXPECT_EQ(*y->shape, (Shape{1, 1, 2, 2}));
}

TEST(AttributeChecks, GraphIrIsCheckedByInferShapes) {
  Graph g;
  g.inputs = {"x"};
  g.outputs = {"y"};
  g.value_info["x"] = ValueInfo(DType::kF32, Shape{2, 3});
  Node n;
  n.name = "t";
  n.op_type = "Transpose";
  n.inputs = {"x"};
  n.outputs = {"y"};
  n.attrs["perm"] = Attribute::of_ints({0, 0});
  g.add_node(n);
  Status st = infer_shapes(g);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("node \"t\" (Transpose): attribute perm = [0, 0]"), std::string::npos) << st.message();
}

// A node view over a map of attributes and input shapes.
struct View {
  std::map<std::string, Attribute> attrs;
  AttrCheckNode node;
  View(std::string op, std::vector<std::optional<Shape>> shapes, int32_t opset = 13) {
    node.op_type = std::move(op);
    node.opset = opset;
    node.label = "node \"n\" (" + node.op_type + ")";
    node.input_shapes = std::move(shapes);
    node.input_present.assign(node.input_shapes.size(), true);
    node.input_ints.resize(node.input_shapes.size());
    node.num_outputs = 1;
  }
  View& set(const std::string& name, Attribute a) {
    attrs[name] = std::move(a);
    return *this;
  }
  View& ints_input(size_t i, std::vector<int64_t> v) {
    node.input_ints[i] = std::move(v);
    return *this;
  }
  Status check() {
    node.attr = [this](const std::string& name) -> const Attribute* {
      auto it = attrs.find(name);
      return it == attrs.end() ? nullptr : &it->second;
    };
    return check_node_attributes(node);
  }
};

Attribute strings_attr(std::vector<std::string> v) {
  Attribute a;
  a.kind = AttrKind::kStrings;
  a.strings = std::move(v);
  return a;
}

void expect_error(View v, const std::string& fragment) {
  Status st = v.check();
  ASSERT_FALSE(st.is_ok()) << "expected an error containing: " << fragment;
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(fragment), std::string::npos) << st.message();
}

TEST(AttributeChecks, Rules) {
  const Shape x4{1, 4, 6, 6}, w4{8, 4, 3, 3};
  expect_error(View("Conv", {x4, w4}).set("dilations", Attribute::of_ints({1, 0})), "attribute dilations = [1, 0]");
  expect_error(View("Conv", {x4, w4}).set("pads", Attribute::of_ints({1, 1})), "needs 4");
  expect_error(View("Conv", {x4, w4}).set("group", Attribute::of_int(3)), "attribute group = 3: must divide");
  expect_error(View("Conv", {x4, w4}).set("kernel_shape", Attribute::of_ints({5, 5})), "differs from the weight");
  expect_error(View("Conv", {Shape{1, 4, 2, 2}, w4}), "more than the padded input");
  expect_error(View("Conv", {x4, w4}).set("auto_pad", Attribute::of_string("SAME")), "attribute auto_pad = \"SAME\"");
  expect_error(View("Conv", {x4, w4}).set("strides", Attribute::of_int(1)), "attribute strides is an int");
  expect_error(View("ConvTranspose", {x4, Shape{4, 2, 3, 3}}).set("output_padding", Attribute::of_ints({2, 0})),
               "smaller than its stride");
  // A bias of another length than the output channels (kernels would read past its end).
  expect_error(View("Conv", {x4, w4, Shape{7}}), "the bias (input 2) must hold one value per output channel (8)");
  expect_error(View("Conv", {x4, w4, Shape{1, 8}}), "got rank 2");
  expect_error(View("ConvTranspose", {x4, Shape{4, 2, 3, 3}, Shape{2}}).set("group", Attribute::of_int(2)),
               "one value per output channel (4), got rank 1 with 2 values");
  expect_error(View("ConvTranspose", {x4, Shape{4, 2, 3, 3}, Shape{3}}), "output channel (2)");
  EXPECT_TRUE(View("Conv", {x4, w4, Shape{8}}).check().is_ok());
  EXPECT_TRUE(
      View("ConvTranspose", {x4, Shape{4, 2, 3, 3}, Shape{4}}).set("group", Attribute::of_int(2)).check().is_ok());
  expect_error(View("MaxPool", {x4}), "kernel_shape is required");
  expect_error(View("MaxPool", {x4})
                   .set("kernel_shape", Attribute::of_ints({2, 2}))
                   .set("pads", Attribute::of_ints({2, 0, 0, 0})),
               "smaller than the kernel");
  expect_error(View("Gather", {Shape{2, 3}, Shape{4}}).set("axis", Attribute::of_int(2)),
               "attribute axis = 2: out of range");
  expect_error(View("Softmax", {Shape{5}}, 11), "axis = 1 (the default)");
  expect_error(View("Flatten", {Shape{2, 3}}).set("axis", Attribute::of_int(3)), "valid: [-2, 2]");
  EXPECT_TRUE(View("Flatten", {Shape{2, 3}}).set("axis", Attribute::of_int(2)).check().is_ok());
  expect_error(View("Transpose", {Shape{2, 3, 4}}).set("perm", Attribute::of_ints({0, 1})), "needs 3 values");
  expect_error(View("DepthToSpace", {Shape{1, 8, 2, 2}}).set("blocksize", Attribute::of_int(0)), "blocksize = 0");
  expect_error(View("DepthToSpace", {Shape{1, 8, 2, 2}}).set("blocksize", Attribute::of_int(3)), "must divide the 8");
  expect_error(View("SpaceToDepth", {Shape{1, 8, 3, 4}}).set("blocksize", Attribute::of_int(2)), "height and width");
  expect_error(View("Squeeze", {Shape{2, 1}, Shape{1}}).ints_input(1, {0}), "input 1 (axes) = [0]: axis 0 has dim 2");
  expect_error(View("Unsqueeze", {Shape{2, 1}, Shape{2}}).ints_input(1, {0, 4}), "axis 4 is out of range");
  expect_error(View("ReduceSum", {Shape{2, 1}, Shape{2}}).ints_input(1, {1, -1}), "axis -1 is repeated");
  expect_error(View("TopK", {Shape{2, 5}, Shape{1}}).ints_input(1, {6}), "K must be in [0, 5]");
  {
    View split("Split", {Shape{6}, Shape{2}});
    split.node.num_outputs = 2;
    expect_error(split.ints_input(1, {2, 3}), "sum to 5");
  }
  expect_error(View("Tile", {Shape{2, 3}, Shape{2}}).ints_input(1, {2, -1}), "every value must be >= 0");
  expect_error(
      View("Pad", {Shape{2, 3}, Shape{4}}).set("mode", Attribute::of_string("reflect")).ints_input(1, {0, 3, 0, 0}),
      "reflect padding of axis 1");
  expect_error(View("LRN", {x4}).set("size", Attribute::of_int(0)), "attribute size = 0");
  expect_error(View("Upsample", {x4}, 7).set("scales", Attribute::of_floats({1, 1, 0, 2})), "finite and > 0");
  expect_error(View("Range", {Shape{}, Shape{}, Shape{}}).ints_input(2, {0}), "delta must not be 0");
  expect_error(View("LSTM", {Shape{1, 1, 2}, Shape{1, 8, 2}, Shape{1, 8, 2}})
                   .set("hidden_size", Attribute::of_int(2))
                   .set("activations", strings_attr({"Tanh"})),
               "needs 3 names");
  expect_error(View("Cast", {Shape{2}}).set("to", Attribute::of_int(99)), "not a known tensor element type");

  // Valid nodes pass, and unknown ranks skip the checks that need them.
  EXPECT_TRUE(View("Conv", {x4, w4})
                  .set("strides", Attribute::of_ints({2, 2}))
                  .set("group", Attribute::of_int(1))
                  .check()
                  .is_ok());
  EXPECT_TRUE(View("Gather", {std::nullopt, Shape{4}}).set("axis", Attribute::of_int(7)).check().is_ok());
  EXPECT_TRUE(View("Unsqueeze", {Shape{2, 1}, Shape{2}}).ints_input(1, {0, 3}).check().is_ok());
  EXPECT_TRUE(View("Softmax", {Shape{5}}, 13).check().is_ok());
  EXPECT_TRUE(View("ConvTranspose", {x4, Shape{4, 2, 3, 3}})
                  .set("strides", Attribute::of_ints({2, 2}))
                  .set("output_padding", Attribute::of_ints({1, 1}))
                  .check()
                  .is_ok());
  EXPECT_TRUE(View("Relu", {Shape{1}}).check().is_ok());
  EXPECT_FALSE(attribute_checked_ops().empty());
}

}  // namespace
}  // namespace keel
