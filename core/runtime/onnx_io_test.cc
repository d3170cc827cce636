// Tests of ONNX import/export and tensor files. Models are built as ModelProto in C++ (no Python needed).
#include "core/runtime/onnx_io.h"

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

namespace keel {
namespace {
namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("keel_onnx_io_test_" + std::to_string(rd()) + std::to_string(::getpid()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_file(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

OnnxLoadOptions quiet() {
  OnnxLoadOptions o;
  o.warn = [](const std::string&) {};
  return o;
}

void set_tensor_type(onnx::ValueInfoProto* vi, const std::string& name, int32_t elem, const std::vector<int64_t>& dims,
                     const std::string& symbolic_first = "") {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  auto* sh = tt->mutable_shape();
  for (size_t i = 0; i < dims.size(); ++i) {
    auto* d = sh->add_dim();
    if (i == 0 && !symbolic_first.empty()) d->set_dim_param(symbolic_first);
    else d->set_dim_value(dims[i]);
  }
}

onnx::ModelProto base_model(int64_t opset = 13) {
  onnx::ModelProto m;
  m.set_ir_version(7);
  m.set_producer_name("onnx_io_test");
  auto* o = m.add_opset_import();
  o->set_domain("");
  o->set_version(opset);
  m.mutable_graph()->set_name("g");
  return m;
}

// y = Relu(x + w) with x: f32[N, 4] (N symbolic) and w an initializer in `data` form.
onnx::ModelProto add_relu_model() {
  auto m = base_model();
  auto* g = m.mutable_graph();
  set_tensor_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 4}, "N");
  set_tensor_type(g->add_output(), "y", onnx::TensorProto::FLOAT, {2, 4}, "N");
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(4);
  for (float v : {1.f, -2.f, 3.f, -4.f}) w->add_float_data(v);
  // An initializer listed as an input too (old exporters do this): it must not become a graph input.
  set_tensor_type(g->add_input(), "w", onnx::TensorProto::FLOAT, {4});
  auto* add = g->add_node();
  add->set_op_type("Add");
  add->add_input("x");
  add->add_input("w");
  add->add_output("s");
  auto* relu = g->add_node();  // unnamed on purpose
  relu->set_op_type("Relu");
  relu->add_input("s");
  relu->add_output("y");
  return m;
}

std::string bytes_of(const onnx::ModelProto& m) {
  std::string s;
  m.SerializeToString(&s);
  return s;
}

const Node* find_op(const Graph& g, const std::string& op) {
  for (NodeId id : g.node_ids())
    if (g.node(id)->op_type == op) return g.node(id);
  return nullptr;
}

// ---------------------------------------------------------------------------------------------------------------

TEST(OnnxIo, LoadsHandBuiltModel) {
  auto bytes = bytes_of(add_relu_model());
  auto g = load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet());
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(g->inputs, std::vector<std::string>{"x"});
  EXPECT_EQ(g->outputs, std::vector<std::string>{"y"});
  EXPECT_EQ(g->opsets.at(""), 13);
  ASSERT_TRUE(g->is_initializer("w"));
  const Tensor& w = g->initializers.at("w");
  EXPECT_EQ(w.dtype(), DType::kF32);
  EXPECT_EQ(w.shape(), Shape{4});
  EXPECT_EQ(w.data<float>()[3], -4.f);
  const ValueInfo* x = g->info("x");
  ASSERT_TRUE(x && x->shape);
  EXPECT_EQ(*x->shape, (Shape{-1, 4}));  // symbolic dim -> -1
  // Shape inference typed the intermediate value.
  const ValueInfo* s = g->info("s");
  ASSERT_TRUE(s != nullptr);
  EXPECT_EQ(s->dtype, DType::kF32);
  ASSERT_TRUE(s->shape);
  EXPECT_EQ(s->shape->size(), 2u);
  // Every node has a unique name.
  const Node* relu = find_op(*g, "Relu");
  ASSERT_TRUE(relu);
  EXPECT_FALSE(relu->name.empty());
  EXPECT_NE(relu->name, find_op(*g, "Add")->name);
}

TEST(OnnxIo, TypedDataFieldsOfEveryDtype) {
  onnx::TensorProto p;
  p.add_dims(3);
  // int32_data carries f16/bf16/bool/i8/u8/i16/u16 as well.
  struct Case {
    int32_t type;
    std::vector<int32_t> values;
  };
  for (const Case& c : std::vector<Case>{{onnx::TensorProto::INT8, {-1, 2, -128}},
                                         {onnx::TensorProto::UINT8, {0, 200, 255}},
                                         {onnx::TensorProto::INT16, {-300, 2, 3}},
                                         {onnx::TensorProto::UINT16, {65535, 0, 1}},
                                         {onnx::TensorProto::INT32, {-7, 8, 9}},
                                         {onnx::TensorProto::BOOL, {1, 0, 1}},
                                         {onnx::TensorProto::FLOAT16, {f32_to_f16(1.5f), f32_to_f16(-2.f), 0}},
                                         {onnx::TensorProto::BFLOAT16, {f32_to_bf16(3.f), 0, f32_to_bf16(-1.f)}}}) {
    p.Clear();
    p.add_dims(3);
    p.set_data_type(c.type);
    for (int32_t v : c.values) p.add_int32_data(v);
    auto t = tensor_from_proto(p);
    ASSERT_TRUE(t.is_ok()) << c.type << ": " << t.status().to_string();
    ASSERT_EQ(static_cast<int32_t>(t->dtype()), c.type);
    for (int i = 0; i < 3; ++i) {
      double got = 0;
      switch (t->dtype()) {
        case DType::kI8: got = t->data<int8_t>()[i]; break;
        case DType::kU8: got = t->data<uint8_t>()[i]; break;
        case DType::kI16: got = t->data<int16_t>()[i]; break;
        case DType::kU16: got = t->data<uint16_t>()[i]; break;
        case DType::kI32: got = t->data<int32_t>()[i]; break;
        case DType::kBool: got = t->data<uint8_t>()[i]; break;
        case DType::kF16:
        case DType::kBF16: got = t->data<uint16_t>()[i]; break;
        default: FAIL();
      }
      EXPECT_EQ(got, c.values[i]) << dtype_name(t->dtype()) << " element " << i;
    }
  }
  p.Clear();
  p.set_data_type(onnx::TensorProto::INT64);
  p.add_dims(2);
  p.add_int64_data(-5);
  p.add_int64_data(int64_t{1} << 40);
  auto i64 = tensor_from_proto(p);
  ASSERT_TRUE(i64.is_ok());
  EXPECT_EQ(i64->data<int64_t>()[1], int64_t{1} << 40);

  p.Clear();
  p.set_data_type(onnx::TensorProto::DOUBLE);
  p.add_double_data(0.25);  // scalar
  auto f64 = tensor_from_proto(p);
  ASSERT_TRUE(f64.is_ok());
  EXPECT_EQ(f64->rank(), 0);
  EXPECT_EQ(f64->data<double>()[0], 0.25);

  p.Clear();
  p.set_data_type(onnx::TensorProto::UINT64);
  p.add_dims(1);
  p.add_uint64_data(~uint64_t{0});
  auto u64 = tensor_from_proto(p);
  ASSERT_TRUE(u64.is_ok());
  EXPECT_EQ(u64->data<uint64_t>()[0], ~uint64_t{0});

  p.Clear();
  p.set_data_type(onnx::TensorProto::UINT32);
  p.add_dims(1);
  p.add_uint64_data(4000000000u);
  auto u32 = tensor_from_proto(p);
  ASSERT_TRUE(u32.is_ok());
  EXPECT_EQ(u32->data<uint32_t>()[0], 4000000000u);

  // Count mismatch and strings are refused.
  p.Clear();
  p.set_data_type(onnx::TensorProto::FLOAT);
  p.add_dims(3);
  p.add_float_data(1);
  EXPECT_EQ(tensor_from_proto(p).status().code(), StatusCode::kInvalidArgument);
  p.Clear();
  p.set_data_type(onnx::TensorProto::STRING);
  p.add_string_data("a");
  EXPECT_EQ(tensor_from_proto(p).status().code(), StatusCode::kUnimplemented);
}

Graph builder_graph() {
  GraphBuilder b("roundtrip", 17);
  auto x = b.input("x", DType::kF32, {1, 2, 4, 4});
  auto w = b.constant("w", Tensor::f32({3, 2, 3, 3}, std::vector<float>(54, 0.5f)));
  auto conv =
      b.op1("Conv", {x, w}, {{"kernel_shape", Attribute::of_ints({3, 3})}, {"pads", Attribute::of_ints({1, 1, 1, 1})}});
  auto alpha = b.op1("LeakyRelu", {conv}, {{"alpha", Attribute::of_float(0.25f)}});
  auto shape = b.constant("shape", Tensor::from_vector<int64_t>(DType::kI64, {2}, {1, -1}));
  auto flat = b.op1("Reshape", {alpha, shape});
  Attribute t = Attribute::of_tensor(Tensor::from_vector<int64_t>(DType::kI64, {1}, {7}));
  auto c = b.op1("Constant", {}, {{"value", t}});
  auto cast = b.op1("Cast", {c}, {{"to", Attribute::of_int(1)}});
  auto out = b.op1("Add", {flat, cast});
  b.output(out);
  return b.take();
}

TEST(OnnxIo, RoundTripOfABuilderGraph) {
  Graph g = builder_graph();
  auto bytes = serialize_onnx(g);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  auto back = load_onnx_from_memory(bytes->data(), bytes->size(), {}, quiet());  // runs the ONNX checker
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->inputs, g.inputs);
  EXPECT_EQ(back->outputs, g.outputs);
  EXPECT_EQ(back->node_count(), g.node_count());
  EXPECT_EQ(back->opsets.at(""), 17);
  ASSERT_TRUE(back->is_initializer("w"));
  EXPECT_EQ(std::memcmp(back->initializers.at("w").raw_data(), g.initializers.at("w").raw_data(), 54 * 4), 0);
  const Node* conv = find_op(*back, "Conv");
  ASSERT_TRUE(conv);
  EXPECT_EQ(conv->attr("pads")->ints, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_FLOAT_EQ(find_op(*back, "LeakyRelu")->attr_float("alpha", 0), 0.25f);
  const Attribute* value = find_op(*back, "Constant")->attr("value");
  ASSERT_TRUE(value && value->kind == AttrKind::kTensor);
  EXPECT_EQ(value->t.data<int64_t>()[0], 7);
  // Shape inference (with data propagation through Reshape) found the output's shape.
  const ValueInfo* out = back->info(back->outputs[0]);
  ASSERT_TRUE(out && out->shape);
  EXPECT_EQ(*out->shape, (Shape{1, 48}));
  // Saving again gives the same bytes (deterministic export).
  auto again = serialize_onnx(*back);
  ASSERT_TRUE(again.is_ok());
  auto third = load_onnx_from_memory(again->data(), again->size(), {}, quiet());
  ASSERT_TRUE(third.is_ok()) << third.status().to_string();
}

TEST(OnnxIo, SubgraphsReadOuterScopeValues) {
  GraphBuilder b("if_graph", 17);
  auto cond = b.input("cond", DType::kBool, {});
  auto x = b.input("x", DType::kF32, {3});
  auto then_b = std::make_shared<Graph>();
  {
    GraphBuilder tb("then", 17);
    tb.output(tb.op1("Relu", {x}));  // reads the outer x
    *then_b = tb.take();
    then_b->inputs.clear();
  }
  auto else_b = std::make_shared<Graph>();
  {
    GraphBuilder eb("else", 17);
    eb.output(eb.op1("Neg", {x}));
    *else_b = eb.take();
  }
  Attribute ta, ea;
  ta.kind = ea.kind = AttrKind::kGraph;
  ta.g = then_b;
  ea.g = else_b;
  auto y = b.op1("If", {cond}, {{"then_branch", ta}, {"else_branch", ea}});
  b.output(y);
  Graph g = b.take();
  auto bytes = serialize_onnx(g);
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  auto back = load_onnx_from_memory(bytes->data(), bytes->size(), {}, quiet());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  const Node* node = find_op(*back, "If");
  ASSERT_TRUE(node);
  const Attribute* then_attr = node->attr("then_branch");
  ASSERT_TRUE(then_attr && then_attr->kind == AttrKind::kGraph && then_attr->g);
  EXPECT_EQ(then_attr->g->node_count(), 1u);
  EXPECT_TRUE(find_op(*then_attr->g, "Relu"));
  EXPECT_EQ(find_op(*then_attr->g, "Relu")->inputs[0], "x");
}

TEST(OnnxIo, SaveAndLoadFile) {
  TempDir dir;
  Graph g = builder_graph();
  ASSERT_TRUE(save_onnx(g, dir.path() / "m.onnx").is_ok());
  auto back = load_onnx(dir.path() / "m.onnx", quiet());
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->node_count(), g.node_count());
  auto missing = load_onnx(dir.path() / "nope.onnx");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// Models over 2 GiB keep their weights in an external data file; a zero threshold-free option forces it here.
TEST(OnnxIo, SaveWritesLargeWeightsAsExternalData) {
  TempDir dir;
  GraphBuilder b("ext", 17);
  auto x = b.input("x", DType::kF32, {1024});
  std::vector<float> big(1024), small = {1, 2, 3, 4};
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f;
  auto w = b.constant("w_big", Tensor::f32({1024}, big));
  auto s = b.constant("w_small", Tensor::f32({4}, small));
  auto y = b.op1("Add", {x, w});
  b.output(y);
  b.output(b.op1("Neg", {s}));
  Graph g = b.take();
  OnnxSaveOptions so;
  so.external_data = OnnxSaveOptions::ExternalData::kAlways;
  so.external_threshold = 1024;
  ASSERT_TRUE(save_onnx(g, dir.path() / "m.onnx", so).is_ok());
  ASSERT_TRUE(fs::exists(dir.path() / "m.onnx.data"));
  EXPECT_EQ(fs::file_size(dir.path() / "m.onnx.data"), 4096u) << "only the 4 KiB weight goes out";
  EXPECT_LT(fs::file_size(dir.path() / "m.onnx"), 4096u);
  OnnxModelMeta meta;
  OnnxLoadOptions lo = quiet();
  lo.meta = &meta;
  auto back = load_onnx(dir.path() / "m.onnx", lo);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(meta.external_bytes, 4096u);
  const Tensor& wb = back->initializers.at("w_big");
  ASSERT_EQ(wb.numel(), 1024);
  EXPECT_EQ(std::memcmp(wb.raw_data(), big.data(), 4096), 0);
  EXPECT_EQ(std::memcmp(back->initializers.at("w_small").raw_data(), small.data(), 16), 0);
  // Default (auto): a small model stays in one file.
  ASSERT_TRUE(save_onnx(g, dir.path() / "one.onnx").is_ok());
  EXPECT_FALSE(fs::exists(dir.path() / "one.onnx.data"));
  // The data file must sit beside the model.
  so.external_file = "../escape.data";
  EXPECT_EQ(save_onnx(g, dir.path() / "bad.onnx", so).code(), StatusCode::kInvalidArgument);
}

TEST(OnnxIo, KeelDomainIsExportedAndInferShapesToleratesIt) {
  GraphBuilder b("fused", 17);
  auto x = b.input("x", DType::kF32, {2, 3});
  auto r = b.op1("Relu", {x});
  auto f = b.op("FusedThing", {r}, {}, 1, "keel")[0];
  auto n = b.op1("Neg", {f});
  auto s = b.op1("Shape", {r});
  b.output(n);
  b.output(s);
  Graph g = b.take();
  onnx::ModelProto m;
  ASSERT_TRUE(graph_to_model_proto(g, m).is_ok());
  bool has_keel = false;
  for (const auto& o : m.opset_import()) has_keel |= o.domain() == "keel";
  EXPECT_TRUE(has_keel);
  ASSERT_TRUE(infer_shapes(g).is_ok());
  ASSERT_TRUE(g.info(r) && g.info(r)->shape);
  EXPECT_EQ(*g.info(r)->shape, (Shape{2, 3}));
  ASSERT_TRUE(g.info(s) && g.info(s)->shape);
  EXPECT_EQ(g.info(s)->dtype, DType::kI64);
  EXPECT_EQ(*g.info(s)->shape, (Shape{2}));
}

TEST(OnnxIo, InferShapesReplacesStaleTypes) {
  GraphBuilder b("stale", 17);
  auto x = b.input("x", DType::kF32, {2, 3});
  auto r = b.op1("Relu", {x});
  auto t = b.op1("Transpose", {r});
  b.output(t);
  Graph g = b.take();
  g.value_info[r] = ValueInfo{DType::kF32, Shape{7, 7, 7}};  // what a pass might have left behind
  ASSERT_TRUE(infer_shapes(g).is_ok());
  EXPECT_EQ(*g.info(r)->shape, (Shape{2, 3}));
  EXPECT_EQ(*g.info(t)->shape, (Shape{3, 2}));
}

// ONNX's lenient inference leaves a node it cannot type untyped: the fault is named when the graph is built, not at
// the session's first run ("output 0 of ... has no known dtype"). Repro: a Resize with bf16 scales.
TEST(OnnxIo, InferShapesNamesTheNodeItCannotType) {
  GraphBuilder b("bf16_scales", 17);
  auto x = b.input("x", DType::kF32, {1, 2, 4, 4});
  auto bad =
      b.constant("scales", Tensor::from_vector<uint16_t>(
                               DType::kBF16, {4}, {f32_to_bf16(1), f32_to_bf16(1), f32_to_bf16(2), f32_to_bf16(2)}));
  b.output(b.op1("Resize", {x, "", bad}, {{"mode", Attribute::of_string("nearest")}}));
  Graph g = b.take();
  const Status st = infer_shapes(g);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("Resize"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("'scales' must have float element type"), std::string::npos) << st.to_string();

  GraphBuilder ok("f32_scales", 17);  // the same graph with float scales is typed and accepted
  x = ok.input("x", DType::kF32, {1, 2, 4, 4});
  auto good = ok.constant("scales", Tensor::f32({4}, {1, 1, 2, 2}));
  auto y = ok.op1("Resize", {x, "", good}, {{"mode", Attribute::of_string("nearest")}});
  ok.output(y);
  Graph g2 = ok.take();
  ASSERT_TRUE(infer_shapes(g2).is_ok());
  EXPECT_EQ(*g2.info(y)->shape, (Shape{1, 2, 8, 8}));
}

// A required output left without a name is refused by name when the graph is checked, not at the first run
// ("output 0 of 'ln' has no known dtype"); an optional one may stay unnamed.
TEST(OnnxIo, RequiredOutputsMustHaveNames) {
  for (bool name_y : {false, true}) {
    GraphBuilder b("ln", 17);
    auto x = b.input("x", DType::kF32, {2, 8});
    auto scale = b.constant("scale", Tensor::f32({8}, std::vector<float>(8, 1.f)));
    Node n;
    n.name = "ln";
    n.op_type = "LayerNormalization";
    n.inputs = {x, scale};
    n.outputs = {name_y ? "y" : "", "mean", ""};  // InvStdDev (optional) unnamed either way
    b.graph().add_node(n);
    b.output("mean");
    Graph g = b.take();
    const Status st = infer_shapes(g);
    if (name_y) {
      EXPECT_TRUE(st.is_ok()) << st.to_string();
    } else {
      ASSERT_FALSE(st.is_ok());
      EXPECT_NE(st.message().find("output 0 (Y) is required and has no name"), std::string::npos) << st.to_string();
    }
  }
}

// A dynamic batch: the target of a Reshape and the ends of a Slice computed from Shape(x) at run time. ONNX 1.12
// leaves both outputs without a rank (and everything after them untyped); infer_shapes gives them their rank, so
// that Transpose after them has a shape too (the passes that need ranks, e.g. fuse_layer_norm, then apply).
TEST(OnnxIo, InferShapesGivesComputedReshapesAndSlicesTheirRank) {
  GraphBuilder b("dynamic_batch", 13);
  auto x = b.input("x", DType::kF32, {-1, 4, 6});
  auto i64 = [](Shape s, std::vector<int64_t> v) { return Tensor::from_vector(DType::kI64, std::move(s), v); };
  auto shape = b.op1("Shape", {x});
  auto batch = b.op1("Gather", {shape, b.constant("zero", i64({}, {0}))});
  auto batch1 = b.op1("Unsqueeze", {batch, b.constant("axes0", i64({1}, {0}))});
  auto half = b.op1("Div", {batch1, b.constant("one", i64({1}, {1}))});  // not propagated by ONNX 1.12
  auto target = b.op1("Concat", {half, b.constant("rest", i64({1}, {24}))}, {{"axis", Attribute::of_int(0)}});
  auto r = b.op1("Reshape", {x, target});
  auto rt = b.op1("Transpose", {r});
  auto sl = b.op1("Slice", {x, b.constant("starts", i64({1}, {0})), half, b.constant("axes", i64({1}, {0}))});
  auto st = b.op1("Transpose", {sl}, {{"perm", Attribute::of_ints({0, 2, 1})}});
  b.output(rt);
  b.output(st);
  Graph g = b.take();
  ASSERT_TRUE(infer_shapes(g).is_ok());
  ASSERT_TRUE(g.info(r) && g.info(r)->shape) << "the computed Reshape has no rank";
  EXPECT_EQ(g.info(r)->shape->size(), 2u);
  ASSERT_TRUE(g.info(rt) && g.info(rt)->shape);
  EXPECT_EQ(g.info(rt)->shape->size(), 2u);
  ASSERT_TRUE(g.info(sl) && g.info(sl)->shape) << "the computed Slice has no rank";
  EXPECT_EQ(g.info(sl)->shape->size(), 3u);
  ASSERT_TRUE(g.info(st) && g.info(st)->shape);
  EXPECT_EQ(*g.info(st)->shape, (Shape{-1, 6, 4}));  // the unsliced dims stay as inference knows them
}

// ---------------------------------------------------------------------------------------------------------------
// External data

onnx::ModelProto external_model(const std::string& location, int64_t offset, int64_t length) {
  auto m = base_model();
  auto* g = m.mutable_graph();
  set_tensor_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {4});
  set_tensor_type(g->add_output(), "y", onnx::TensorProto::FLOAT, {4});
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(4);
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* kv = w->add_external_data();
  kv->set_key("location");
  kv->set_value(location);
  kv = w->add_external_data();
  kv->set_key("offset");
  kv->set_value(std::to_string(offset));
  if (length >= 0) {
    kv = w->add_external_data();
    kv->set_key("length");
    kv->set_value(std::to_string(length));
  }
  auto* add = g->add_node();
  add->set_op_type("Add");
  add->add_input("x");
  add->add_input("w");
  add->add_output("y");
  return m;
}

TEST(OnnxIo, ExternalDataInsideTheDirectoryLoads) {
  TempDir dir;
  std::string data(8, '\0');
  float vals[4] = {1, 2, 3, 4};
  data.append(reinterpret_cast<const char*>(vals), sizeof vals);
  write_file(dir.path() / "weights" / "w.bin", data);
  write_file(dir.path() / "m.onnx", bytes_of(external_model("weights/w.bin", 8, 16)));
  auto g = load_onnx(dir.path() / "m.onnx", quiet());
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  EXPECT_EQ(g->initializers.at("w").data<float>()[3], 4.f);
  // A harmless ".." that stays inside is fine.
  write_file(dir.path() / "m2.onnx", bytes_of(external_model("weights/../weights/w.bin", 8, -1)));
  EXPECT_TRUE(load_onnx(dir.path() / "m2.onnx", quiet()).is_ok());
}

TEST(OnnxIo, ExternalDataThatEscapesIsRefused) {
  TempDir dir;
  float vals[4] = {1, 2, 3, 4};
  std::string data(reinterpret_cast<const char*>(vals), sizeof vals);
  write_file(dir.path() / "outside.bin", data);
  write_file(dir.path() / "model" / "inside.bin", data);
  fs::path model_dir = dir.path() / "model";
  auto load_with = [&](const std::string& location, int64_t offset = 0, int64_t length = -1) {
    write_file(model_dir / "m.onnx", bytes_of(external_model(location, offset, length)));
    return load_onnx(model_dir / "m.onnx", quiet());
  };
  EXPECT_TRUE(load_with("inside.bin").is_ok());
  auto escape = load_with("../outside.bin");
  EXPECT_EQ(escape.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(escape.status().message().find("escapes"), std::string::npos) << escape.status().to_string();
  auto absolute = load_with((dir.path() / "outside.bin").string());
  EXPECT_EQ(absolute.status().code(), StatusCode::kInvalidArgument);
  // A symlink inside the directory that points outside it.
  std::error_code ec;
  fs::create_symlink(dir.path() / "outside.bin", model_dir / "link.bin", ec);
  if (!ec) {
    EXPECT_FALSE(load_with("link.bin").is_ok());
  }
  // Declared length or offset past the file, and a length that disagrees with the shape.
  EXPECT_FALSE(load_with("inside.bin", 8).is_ok());
  EXPECT_FALSE(load_with("inside.bin", 0, 8).is_ok());
  EXPECT_FALSE(load_with("inside.bin", 0, 1000).is_ok());
  EXPECT_FALSE(load_with("missing.bin").is_ok());
  // From memory without a directory, external data is refused.
  auto bytes = bytes_of(external_model("inside.bin", 0, -1));
  EXPECT_FALSE(load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet()).is_ok());
}

// ---------------------------------------------------------------------------------------------------------------
// Malformed input

TEST(OnnxIo, MalformedBytesAreRefused) {
  const std::string junk = "this is not a protobuf \xff\xff\xff\xff";
  auto g = load_onnx_from_memory(junk.data(), junk.size(), {}, quiet(), "junk.onnx");
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("junk.onnx"), std::string::npos);
  auto empty = load_onnx_from_memory("", 0, {}, quiet());
  EXPECT_FALSE(empty.is_ok());  // no graph

  TempDir dir;
  auto bytes = bytes_of(add_relu_model());
  write_file(dir.path() / "trunc.onnx", bytes.substr(0, bytes.size() / 2));
  auto t = load_onnx(dir.path() / "trunc.onnx", quiet());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("trunc.onnx"), std::string::npos);
}

TEST(OnnxIo, HugeDeclaredTensorsAreRefusedBeforeAllocating) {
  auto m = add_relu_model();
  auto* w = m.mutable_graph()->mutable_initializer(0);
  w->clear_float_data();
  w->clear_dims();
  w->add_dims(1000000);
  w->add_dims(1000000);  // 1e12 elements, 4 TB
  w->set_raw_data(std::string(16, '\0'));
  auto bytes = bytes_of(m);
  OnnxLoadOptions o = quiet();
  o.check = false;  // let the loader itself see it
  auto g = load_onnx_from_memory(bytes.data(), bytes.size(), {}, o);
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << g.status().to_string();

  // Within the byte limit but larger than the data actually present.
  w->clear_dims();
  w->add_dims(1000);
  w->add_dims(1000);
  bytes = bytes_of(m);
  g = load_onnx_from_memory(bytes.data(), bytes.size(), {}, o);
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);

  // Overflowing dims product.
  w->clear_dims();
  for (int i = 0; i < 4; ++i) w->add_dims(int64_t{1} << 40);
  bytes = bytes_of(m);
  g = load_onnx_from_memory(bytes.data(), bytes.size(), {}, o);
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);

  // Negative dims.
  w->clear_dims();
  w->add_dims(-4);
  bytes = bytes_of(m);
  EXPECT_FALSE(load_onnx_from_memory(bytes.data(), bytes.size(), {}, o).is_ok());
}

TEST(OnnxIo, CheckerComplaintsNameTheNode) {
  auto m = add_relu_model();
  auto* bad = m.mutable_graph()->add_node();
  bad->set_name("my_bad_conv");
  bad->set_op_type("Conv");  // no inputs: invalid
  bad->add_output("z");
  auto bytes = bytes_of(m);
  auto g = load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet());
  ASSERT_FALSE(g.is_ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("my_bad_conv"), std::string::npos) << g.status().to_string();
}

TEST(OnnxIo, ShapeInferenceComplaintsNameTheNode) {
  auto m = base_model();
  auto* g = m.mutable_graph();
  set_tensor_type(g->add_input(), "a", onnx::TensorProto::FLOAT, {2, 3});
  set_tensor_type(g->add_input(), "b", onnx::TensorProto::FLOAT, {4, 5});
  set_tensor_type(g->add_output(), "c", onnx::TensorProto::FLOAT, {});
  auto* mm = g->add_node();
  mm->set_name("mismatched_matmul");
  mm->set_op_type("MatMul");
  mm->add_input("a");
  mm->add_input("b");
  mm->add_output("c");
  auto bytes = bytes_of(m);
  auto r = load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("mismatched_matmul"), std::string::npos) << r.status().to_string();
  OnnxLoadOptions lax = quiet();
  lax.strict_shape_inference = false;
  EXPECT_TRUE(load_onnx_from_memory(bytes.data(), bytes.size(), {}, lax).is_ok());
}

// Two crashes the fuzzer found in ONNX 1.12 itself, now refused before ONNX sees them.
TEST(OnnxIo, FuzzerFindingsAreRefused) {
  // A graph output nothing produces crashed the version converter's IR import (opset < 7 models).
  auto m = base_model(6);
  m.set_ir_version(3);
  auto* g = m.mutable_graph();
  set_tensor_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {2});
  set_tensor_type(g->add_output(), "nowhere", onnx::TensorProto::FLOAT, {2});
  auto* relu = g->add_node();
  relu->set_op_type("Relu");
  relu->add_input("x");
  relu->add_output("y");
  auto bytes = bytes_of(m);
  auto r = load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("nowhere"), std::string::npos) << r.status().to_string();

  // ConvTranspose whose weight has a lower rank than its input crashed ONNX shape inference.
  auto c = base_model(11);
  g = c.mutable_graph();
  set_tensor_type(g->add_input(), "X", onnx::TensorProto::FLOAT, {1, 1, 3});
  set_tensor_type(g->add_input(), "W", onnx::TensorProto::FLOAT, {1, 2});
  set_tensor_type(g->add_output(), "Y", onnx::TensorProto::FLOAT, {1, 2, 5});
  auto* ct = g->add_node();
  ct->set_name("ct");
  ct->set_op_type("ConvTranspose");
  ct->add_input("X");
  ct->add_input("W");
  ct->add_output("Y");
  bytes = bytes_of(c);
  r = load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet());
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("ct"), std::string::npos) << r.status().to_string();
}

// What the shape-computation fuzzer (tests/fuzz/fuzz_shape_computations.py) found: two crashes in ONNX 1.12's data
// propagators, now guarded (onnx_import.cc, guard_onnx_data_propagators), and shapes too large for any tensor.
TEST(OnnxIo, ShapeComputationFuzzerFindingsLoadOrFailCleanly) {
  auto node = [](onnx::GraphProto* g, const std::string& op, std::vector<std::string> in, const std::string& out) {
    auto* n = g->add_node();
    n->set_name(out);
    n->set_op_type(op);
    for (const auto& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  };
  auto int64s = [](onnx::GraphProto* g, const std::string& name, std::vector<int64_t> values) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
  };
  {
    // Mul of an empty shape (Shape of a scalar) and a one-element constant read past the empty operand's end.
    auto m = base_model(15);
    auto* g = m.mutable_graph();
    set_tensor_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {});
    set_tensor_type(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
    int64s(g, "two", {2});
    node(g, "Shape", {"x"}, "s");
    node(g, "Mul", {"s", "two"}, "target");
    node(g, "Reshape", {"x", "target"}, "y");
    auto bytes = bytes_of(m);
    auto r = load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();  // a valid model: Reshape of a scalar to the empty shape
    EXPECT_TRUE(infer_shapes(*r).is_ok());
  }
  {
    // Shape of an Add whose operands do not broadcast ([3] + [2]): Shape's propagator read the Add's missing type.
    auto m = base_model(15);
    auto* g = m.mutable_graph();
    set_tensor_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 3, 4});
    set_tensor_type(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
    int64s(g, "ones", {1, 1});
    node(g, "Shape", {"x"}, "s");
    node(g, "Add", {"s", "ones"}, "bad_sum");
    node(g, "Shape", {"bad_sum"}, "rank");
    node(g, "Reshape", {"x", "rank"}, "y");
    auto bytes = bytes_of(m);
    auto r = load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet());
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("shape inference"), std::string::npos) << r.status().to_string();
    OnnxLoadOptions lax = quiet();
    lax.strict_shape_inference = false;
    auto loose = load_onnx_from_memory(bytes.data(), bytes.size(), {}, lax);
    ASSERT_TRUE(loose.is_ok()) << loose.status().to_string();
    // Loaded for inspection; a session (infer_shapes) refuses it, naming the Add that has no type.
    const Status st = infer_shapes(*loose);
    ASSERT_FALSE(st.is_ok());
    EXPECT_NE(st.message().find("Add node 'bad_sum'"), std::string::npos) << st.to_string();
  }
  {
    // A Reshape to constant dims of 10^12: its product overflowed int64 in the devices' shape arithmetic. Refused
    // at load, by name.
    auto m = base_model(15);
    auto* g = m.mutable_graph();
    set_tensor_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 2});
    set_tensor_type(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
    int64s(g, "huge", {1000000000000, 1000000000000});
    node(g, "Reshape", {"x", "huge"}, "reshaped");
    auto* sum = node(g, "ReduceSum", {"reshaped"}, "y");
    auto* keepdims = sum->add_attribute();
    keepdims->set_name("keepdims");
    keepdims->set_type(onnx::AttributeProto::INT);
    keepdims->set_i(0);
    auto bytes = bytes_of(m);
    auto r = load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet());
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("'reshaped'"), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().message().find("cannot run"), std::string::npos) << r.status().to_string();
  }
  {
    // The attribute fuzzer under UBSan (seed 4, case 9121): a Slice whose axes are an empty raw-data initializer made
    // the reader of small constants memcpy into an empty vector's null data() (undefined even for 0 bytes).
    // Repro: keel run case_4_9121_Slice_op16.onnx --passes none (a UBSan build reports "null pointer passed").
    auto m = base_model(16);
    auto* g = m.mutable_graph();
    set_tensor_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {});
    set_tensor_type(g->add_input(), "starts", onnx::TensorProto::INT64, {3});
    set_tensor_type(g->add_output(), "s", onnx::TensorProto::INT64, {1}, "n");
    for (const char* name : {"ends", "axes"}) {
      auto* t = g->add_initializer();
      t->set_name(name);
      t->set_data_type(onnx::TensorProto::INT64);
      t->add_dims(0);
      t->set_raw_data("");
    }
    node(g, "Slice", {"x", "starts", "ends", "axes"}, "y");
    node(g, "Shape", {"y"}, "s");
    auto bytes = bytes_of(m);
    auto r = load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet());
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const Status st = infer_shapes(*r);  // where the constant was read (a session's build runs it too)
    EXPECT_TRUE(st.is_ok() || !st.message().empty());
  }
}

TEST(OnnxIo, NewerOpsetsAreRefused) {
  auto m = add_relu_model();
  m.mutable_opset_import(0)->set_version(kMaxOnnxOpset + 1);
  auto bytes = bytes_of(m);
  auto g = load_onnx_from_memory(bytes.data(), bytes.size(), {}, quiet());
  EXPECT_EQ(g.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(g.status().message().find("opset"), std::string::npos);
}

TEST(OnnxIo, Opset6ModelIsUpgraded) {
  // Opset 6: Add with the legacy broadcast attribute.
  auto m = base_model(6);
  m.set_ir_version(3);
  auto* g = m.mutable_graph();
  set_tensor_type(g->add_input(), "x", onnx::TensorProto::FLOAT, {2, 3});
  set_tensor_type(g->add_input(), "b", onnx::TensorProto::FLOAT, {3});
  set_tensor_type(g->add_output(), "y", onnx::TensorProto::FLOAT, {2, 3});
  auto* add = g->add_node();
  add->set_op_type("Add");
  add->add_input("x");
  add->add_input("b");
  add->add_output("s");
  auto* a = add->add_attribute();
  a->set_name("broadcast");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(1);
  auto* relu = g->add_node();
  relu->set_op_type("Relu");
  relu->add_input("s");
  relu->add_output("y");
  auto bytes = bytes_of(m);
  OnnxModelMeta meta;
  OnnxLoadOptions o = quiet();
  o.meta = &meta;
  auto loaded = load_onnx_from_memory(bytes.data(), bytes.size(), {}, o);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_GE(loaded->opsets.at(""), kMinOnnxOpset);
  EXPECT_TRUE(meta.upgraded);
  EXPECT_EQ(meta.declared_opsets.at(""), 6);
  const Node* n = find_op(*loaded, "Add");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->attr("broadcast"), nullptr);

  o.upgrade_old_opsets = false;
  EXPECT_EQ(load_onnx_from_memory(bytes.data(), bytes.size(), {}, o).status().code(), StatusCode::kUnimplemented);
}

TEST(OnnxIo, Opset6ModelsOfTheTestDataUpgrade) {
  const fs::path model = "/usr/share/libonnx-testdata/data/pytorch-converted/test_Conv2d/model.onnx";
  if (!fs::exists(model)) GTEST_SKIP() << "libonnx-testdata is not installed";
  OnnxModelMeta meta;
  OnnxLoadOptions o = quiet();
  o.meta = &meta;
  auto g = load_onnx(model, o);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  if (meta.declared_opsets.count("") && meta.declared_opsets.at("") < kMinOnnxOpset) {
    EXPECT_TRUE(meta.upgraded);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor files

std::string npy_bytes(int version, const std::string& descr, const std::string& shape, const std::string& payload,
                      bool fortran = false) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shape + ", }";
  const size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  const uint32_t len = static_cast<uint32_t>(header.size());
  if (version == 1) {
    out += static_cast<char>(len & 0xff);
    out += static_cast<char>(len >> 8);
  } else {
    for (int i = 0; i < 4; ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  }
  return out + header + payload;
}

template <typename T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(TensorFiles, NpyOfEveryDtype) {
  struct Case {
    std::string descr;
    DType dtype;
    std::string payload;
  };
  std::vector<Case> cases = {
      {"<f2", DType::kF16,
       raw<uint16_t>(
           {f32_to_f16(1.f), f32_to_f16(2.f), f32_to_f16(3.f), f32_to_f16(4.f), f32_to_f16(5.f), f32_to_f16(6.f)})},
      {"<f4", DType::kF32, raw<float>({1, 2, 3, 4, 5, 6})},
      {"<f8", DType::kF64, raw<double>({1, 2, 3, 4, 5, 6})},
      {"|i1", DType::kI8, raw<int8_t>({1, 2, 3, 4, 5, 6})},
      {"<i2", DType::kI16, raw<int16_t>({1, 2, 3, 4, 5, 6})},
      {"<i4", DType::kI32, raw<int32_t>({1, 2, 3, 4, 5, 6})},
      {"<i8", DType::kI64, raw<int64_t>({1, 2, 3, 4, 5, 6})},
      {"|u1", DType::kU8, raw<uint8_t>({1, 2, 3, 4, 5, 6})},
      {"<u2", DType::kU16, raw<uint16_t>({1, 2, 3, 4, 5, 6})},
      {"<u4", DType::kU32, raw<uint32_t>({1, 2, 3, 4, 5, 6})},
      {"<u8", DType::kU64, raw<uint64_t>({1, 2, 3, 4, 5, 6})},
      {"|b1", DType::kBool, raw<uint8_t>({1, 0, 1, 0, 1, 1})},
  };
  TempDir dir;
  int version = 1;
  for (const auto& c : cases) {
    std::string bytes = npy_bytes(version, c.descr, "(2, 3)", c.payload);
    version = version % 3 + 1;  // v1, v2, v3 in turn
    fs::path file = dir.path() / ("t" + c.descr.substr(1) + ".npy");
    write_file(file, bytes);
    auto t = read_tensor_file(file);
    ASSERT_TRUE(t.is_ok()) << c.descr << ": " << t.status().to_string();
    EXPECT_EQ(t->dtype(), c.dtype) << c.descr;
    EXPECT_EQ(t->shape(), (Shape{2, 3}));
    EXPECT_EQ(std::memcmp(t->raw_data(), c.payload.data(), c.payload.size()), 0) << c.descr;
  }
  // Scalars and 1-D.
  auto s =
      read_npy(npy_bytes(1, "<f4", "()", raw<float>({7})).data(), npy_bytes(1, "<f4", "()", raw<float>({7})).size());
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s->rank(), 0);
  std::string one = npy_bytes(1, "<i8", "(3,)", raw<int64_t>({1, 2, 3}));
  auto v = read_npy(one.data(), one.size());
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(v->shape(), Shape{3});
}

TEST(TensorFiles, BadNpyIsRefused) {
  auto check_bad = [](const std::string& bytes) {
    auto t = read_npy(bytes.data(), bytes.size());
    EXPECT_FALSE(t.is_ok());
  };
  check_bad("nope");
  check_bad(npy_bytes(1, "<f4", "(2, 3)", raw<float>({1, 2})));                    // truncated data
  check_bad(npy_bytes(1, ">f4", "(1,)", raw<float>({1})));                         // big-endian
  check_bad(npy_bytes(1, "<f4", "(1,)", raw<float>({1}), /*fortran=*/true));       // Fortran order
  check_bad(npy_bytes(1, "<c8", "(1,)", raw<float>({1, 2})));                      // complex
  check_bad(npy_bytes(1, "<f4", "(1000000, 1000000, 1000000)", raw<float>({1})));  // huge
  check_bad(npy_bytes(1, "<f4", "(a, b)", raw<float>({1})));                       // junk shape
  check_bad(npy_bytes(4, "<f4", "(1,)", raw<float>({1})));                         // unknown version
  std::string good = npy_bytes(1, "<f4", "(2,)", raw<float>({1, 2}));
  check_bad(good.substr(0, 20));  // truncated header
}

// Mutated .npy files (header and length bytes changed, spans deleted, the file cut short or grown): each reads or is
// refused, and what reads never holds more data than the file. The seed is printed; KEEL_NPY_FUZZ_SEED reruns one.
TEST(TensorFiles, MutatedNpyReadsWithinTheFileOrIsRefused) {
  const std::vector<std::string> valid = {npy_bytes(1, "<f4", "(2, 3)", raw<float>({1, 2, 3, 4, 5, 6})),
                                          npy_bytes(2, "<i8", "(3,)", raw<int64_t>({1, 2, 3})),
                                          npy_bytes(3, "|u1", "(2, 2, 1)", raw<uint8_t>({1, 2, 3, 4})),
                                          npy_bytes(1, "<f2", "()", raw<uint16_t>({0x3c00}))};
  const char* env_seed = std::getenv("KEEL_NPY_FUZZ_SEED");
  const uint32_t seed = env_seed ? static_cast<uint32_t>(std::strtoul(env_seed, nullptr, 10)) : 20261204u;
  std::mt19937 rng(seed);
  const std::string alphabet = "0123456789(),' :{}<>|fiuc\x01\x7f\xff\x93";
  constexpr int kCases = 20000;
  int read = 0;
  for (int c = 0; c < kCases; ++c) {
    std::string m = valid[rng() % valid.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !m.empty(); ++e) {
      const size_t at = rng() % std::min<size_t>(m.size(), rng() % 2 ? 80 : m.size());  // mostly the header
      switch (rng() % 4) {
        case 0: m[at] = alphabet[rng() % alphabet.size()]; break;
        case 1: m[at] = static_cast<char>(rng() & 0xff); break;
        case 2: m.erase(at, std::min<size_t>(m.size() - at, 1 + rng() % 8)); break;
        default: m.resize(rng() % 2 ? at : m.size() + rng() % 64, '\0'); break;
      }
    }
    auto t = read_npy(m.data(), m.size());
    if (!t.is_ok()) {
      EXPECT_FALSE(t.status().message().empty()) << "seed " << seed << " case " << c;
      continue;
    }
    ++read;
    EXPECT_LE(t->byte_size(), m.size()) << "seed " << seed << " case " << c << ": " << t->describe();
  }
  std::printf("%d mutated .npy files (seed %u): %d read, %d refused\n", kCases, seed, read, kCases - read);
}

TEST(TensorFiles, PbRoundTrip) {
  TempDir dir;
  Tensor t = Tensor::from_vector<int32_t>(DType::kI32, {2, 2}, {1, -2, 3, -4});
  ASSERT_TRUE(write_tensor_pb(t, dir.path() / "t.pb", "my_tensor").is_ok());
  std::string name;
  auto back = read_tensor_file(dir.path() / "t.pb", &name);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(name, "my_tensor");
  EXPECT_EQ(back->dtype(), DType::kI32);
  EXPECT_EQ(back->shape(), (Shape{2, 2}));
  EXPECT_EQ(back->data<int32_t>()[3], -4);
  write_file(dir.path() / "bad.pb", "\x0a\xff\xff\xff\xff\x0f");
  EXPECT_FALSE(read_tensor_file(dir.path() / "bad.pb").is_ok());
  EXPECT_EQ(read_tensor_file(dir.path() / "missing.pb").status().code(), StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------------------------------------------
// Robustness: mutated copies of a valid model (fixed seed) give errors or graphs, never crashes. The libFuzzer
// target (tests/fuzz/fuzz_model_loader.cc) does the same at scale.

TEST(OnnxIoRobustness, MutatedModelsNeverCrash) {
  GraphBuilder b("mut", 13);
  auto x = b.input("x", DType::kF32, {1, 2, 4, 4});
  auto w = b.constant("w", Tensor::f32({2, 2, 1, 1}, {1, 2, 3, 4}));
  auto conv = b.op1("Conv", {x, w}, {{"kernel_shape", Attribute::of_ints({1, 1})}});
  auto shape = b.constant("shape", Tensor::from_vector<int64_t>(DType::kI64, {2}, {1, -1}));
  auto flat = b.op1("Reshape", {conv, shape});
  auto sm = b.op1("Softmax", {flat}, {{"axis", Attribute::of_int(1)}});
  b.output(sm);
  auto valid = serialize_onnx(b.take());
  ASSERT_TRUE(valid.is_ok());
  auto also = bytes_of(add_relu_model());

  std::mt19937 rng(12345);
  int loaded = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string m = iter % 2 ? *valid : also;
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {
      m.resize(rng() % (m.size() + 1));  // truncation
    } else {
      const int flips = 1 + static_cast<int>(rng() % 8);
      for (int k = 0; k < flips && !m.empty(); ++k) {
        size_t pos = rng() % m.size();
        if (kind == 1) m[pos] = static_cast<char>(m[pos] ^ (1u << (rng() % 8)));
        else if (kind == 2) m[pos] = static_cast<char>(rng());
        else m.insert(pos, 1, static_cast<char>(rng()));
      }
    }
    auto g = load_onnx_from_memory(m.data(), m.size(), {}, quiet());
    if (g.is_ok()) ++loaded;
  }
  // Some mutations are harmless (e.g. in names); most are not. Either way nothing crashed.
  EXPECT_GT(loaded, 0);
}

}  // namespace
}  // namespace keel
