// The executor-native ops: If, Loop, Scan, SequenceMap with nested graphs that read outer-scope values; sequences
// and optionals through Session::run_values; ONNX export/import of both; errors.
#include "core/runtime/control_flow.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"

namespace keel {
namespace {

std::unique_ptr<Environment> make_env() {
  EnvironmentOptions o;
  o.discover_plugins = false;
  o.threads = 1;
  auto env = Environment::create(o);
  EXPECT_TRUE(env.is_ok()) << env.status().to_string();
  return std::move(env).value();
}

Environment& env() {
  static std::unique_ptr<Environment> e = make_env();
  return *e;
}

Node node(const std::string& op, std::vector<std::string> ins, std::vector<std::string> outs,
          std::map<std::string, Attribute> attrs = {}) {
  Node n;
  n.op_type = op;
  n.name = op + "_" + outs[0];
  n.inputs = std::move(ins);
  n.outputs = std::move(outs);
  n.attrs = std::move(attrs);
  return n;
}

// A nested graph with explicit value names (ONNX wants names unique across scopes).
Attribute subgraph(const std::string& name, std::vector<std::pair<std::string, ValueInfo>> inputs,
                   std::vector<Node> nodes, std::vector<std::string> outputs) {
  auto g = std::make_shared<Graph>();
  g->name = name;
  for (auto& [n, vi] : inputs) {
    g->inputs.push_back(n);
    g->value_info[n] = vi;
  }
  for (auto& n : nodes) g->add_node(std::move(n));
  g->outputs = std::move(outputs);
  Attribute a;
  a.kind = AttrKind::kGraph;
  a.g = g;
  return a;
}

Tensor i64(Shape s, std::vector<int64_t> v) { return Tensor::from_vector(DType::kI64, std::move(s), v); }
Tensor boolean(bool v) { return Tensor::from_vector<uint8_t>(DType::kBool, {}, {static_cast<uint8_t>(v)}); }

std::vector<float> values(const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

std::unique_ptr<Session> make_session(Graph g) {
  auto s = Session::create(env(), std::move(g));
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? std::move(s).value() : nullptr;
}

// y = If(cond) then Relu(x * w) else Neg(x); both branches read x (and the then branch w) from the outer graph.
Graph if_graph() {
  GraphBuilder b("if", 17);
  b.input("cond", DType::kBool, {});
  b.input("x", DType::kF32, {3});
  b.constant("w", Tensor::f32({3}, {1, 2, 3}));
  b.graph().add_node(node("Mul", {"x", "w"}, {"xw"}));
  Attribute then_b = subgraph("then", {}, {node("Relu", {"xw"}, {"then_y"})}, {"then_y"});
  Attribute else_b = subgraph("else", {}, {node("Neg", {"x"}, {"else_y"})}, {"else_y"});
  b.graph().add_node(node("If", {"cond"}, {"y"}, {{"then_branch", then_b}, {"else_branch", else_b}}));
  b.output("y");
  return b.take();
}

TEST(ControlFlow, IfRunsTheChosenBranchWithOuterValues) {
  auto s = make_session(if_graph());
  ASSERT_TRUE(s);
  Tensor x = Tensor::f32({3}, {-1, 2, 3});
  auto t = s->run({{"cond", boolean(true)}, {"x", x}});
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(values((*t)[0]), (std::vector<float>{0, 4, 9}));
  auto e = s->run({{"cond", boolean(false)}, {"x", x}});
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  EXPECT_EQ(values((*e)[0]), (std::vector<float>{1, -2, -3}));
}

TEST(ControlFlow, SubgraphReadsAreImplicitInputs) {
  Graph g = if_graph();
  const Node* mul = nullptr;
  const Node* iff = nullptr;
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    (n->op_type == "Mul" ? mul : iff) = n;
  }
  ASSERT_TRUE(mul && iff);
  EXPECT_EQ(implicit_inputs(*iff), (std::vector<std::string>{"x", "xw"})) << "attribute order: else, then";
  EXPECT_EQ(g.consumers("xw"), std::vector<NodeId>{iff->id}) << "the If reads xw through its then branch";
  // A producer added after the If still runs first.
  Graph late;
  late.inputs = {"cond", "x"};
  late.add_node(*iff);
  late.add_node(*mul);
  late.initializers["w"] = g.initializers.at("w");
  late.outputs = {"y"};
  auto order = late.topological_order();
  ASSERT_TRUE(order.is_ok());
  EXPECT_EQ(late.node((*order)[0])->op_type, "Mul");
  EXPECT_TRUE(late.validate().is_ok());
  // Renaming reaches into the branch; a branch reading an undefined value fails validation.
  late.replace_uses("xw", "x");
  EXPECT_EQ(implicit_inputs(*late.node((*order)[1])), (std::vector<std::string>{"x"}));
  Graph broken = if_graph();
  for (NodeId id : broken.node_ids())
    if (broken.node(id)->op_type == "Mul") {
      ASSERT_TRUE(broken.remove_node(id).is_ok());
    }
  Status v = broken.validate();
  EXPECT_FALSE(v.is_ok());
  EXPECT_NE(v.message().find("'xw'"), std::string::npos) << v.message();
}

// Loop: trip count M, a carried sum, a scan output of the running sums; the body reads `step` from outside.
Graph loop_graph() {
  GraphBuilder b("loop", 17);
  b.input("M", DType::kI64, {});
  b.input("s0", DType::kF32, {2});
  b.input("step", DType::kF32, {2});
  b.constant("cond0", boolean(true));
  Attribute body = subgraph("body",
                            {{"i", ValueInfo(DType::kI64, Shape{})},
                             {"c_in", ValueInfo(DType::kBool, Shape{})},
                             {"s_in", ValueInfo(DType::kF32, Shape{2})}},
                            {node("Add", {"s_in", "step"}, {"s_out"}), node("Identity", {"c_in"}, {"c_out"}),
                             node("Identity", {"s_out"}, {"scan_out"})},
                            {"c_out", "s_out", "scan_out"});
  b.graph().add_node(node("Loop", {"M", "cond0", "s0"}, {"s_final", "sums"}, {{"body", body}}));
  b.output("s_final");
  b.output("sums");
  // The ONNX checker wants the rank of main-graph outputs, and ONNX does not infer loop-carried shapes.
  b.graph().value_info["s_final"] = ValueInfo(DType::kF32, Shape{2});
  b.graph().value_info["sums"] = ValueInfo(DType::kF32, Shape{-1, 2});
  return b.take();
}

TEST(ControlFlow, LoopCarriesStateAndStacksScanOutputs) {
  auto s = make_session(loop_graph());
  ASSERT_TRUE(s);
  auto r = s->run({{"M", i64({}, {3})}, {"s0", Tensor::f32({2}, {0, 10})}, {"step", Tensor::f32({2}, {1, -1})}});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{3, 7}));
  EXPECT_EQ((*r)[1].shape(), (Shape{3, 2}));
  EXPECT_EQ(values((*r)[1]), (std::vector<float>{1, 9, 2, 8, 3, 7}));
  // Zero iterations: the initial state, and an empty scan output.
  auto z = s->run({{"M", i64({}, {0})}, {"s0", Tensor::f32({2}, {5, 6})}, {"step", Tensor::f32({2}, {1, 1})}});
  ASSERT_TRUE(z.is_ok()) << z.status().to_string();
  EXPECT_EQ(values((*z)[0]), (std::vector<float>{5, 6}));
  EXPECT_EQ((*z)[1].numel(), 0);
}

TEST(ControlFlow, LoopWithoutTripCountOrConditionIsRefused) {
  Graph g = loop_graph();
  for (NodeId id : g.node_ids()) {
    Node* n = g.node(id);
    if (n->op_type == "Loop") n->inputs[0] = n->inputs[1] = "";
  }
  g.inputs.erase(g.inputs.begin());
  auto s = make_session(std::move(g));
  ASSERT_TRUE(s);
  auto r = s->run({{"s0", Tensor::f32({2}, {0, 0})}, {"step", Tensor::f32({2}, {1, 1})}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("never end"), std::string::npos) << r.status().to_string();
}

TEST(ControlFlow, ScanReversesAndSumsAlongAnAxis) {
  GraphBuilder b("scan", 17);
  b.input("init", DType::kF32, {2});
  b.input("xs", DType::kF32, {2, 3});  // scanned along axis 1
  Attribute body = subgraph(
      "body", {{"acc", ValueInfo(DType::kF32, Shape{2})}, {"col", ValueInfo(DType::kF32, Shape{2})}},
      {node("Add", {"acc", "col"}, {"acc_out"}), node("Identity", {"acc_out"}, {"col_out"})}, {"acc_out", "col_out"});
  b.graph().add_node(node("Scan", {"init", "xs"}, {"final", "partial"},
                          {{"body", body},
                           {"num_scan_inputs", Attribute::of_int(1)},
                           {"scan_input_axes", Attribute::of_ints({1})},
                           {"scan_input_directions", Attribute::of_ints({1})},
                           {"scan_output_axes", Attribute::of_ints({-1})}}));
  b.output("final");
  b.output("partial");
  auto s = make_session(b.take());
  ASSERT_TRUE(s);
  auto r = s->run({{"init", Tensor::f32({2}, {0, 100})}, {"xs", Tensor::f32({2, 3}, {1, 2, 3, 4, 5, 6})}});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(values((*r)[0]), (std::vector<float>{6, 115}));
  EXPECT_EQ((*r)[1].shape(), (Shape{2, 3}));
  // Columns visited 2, 1, 0: running sums 3, 5, 6 and 106, 111, 115, stacked on the last axis.
  EXPECT_EQ(values((*r)[1]), (std::vector<float>{3, 5, 6, 106, 111, 115}));
}

// x -> Relu -> SplitToSequence -> SequenceInsert(tensor t at 0) -> outputs: the sequence, its length, item 1,
// ConcatFromSequence.
Graph sequence_graph() {
  GraphBuilder b("seq", 17);
  b.input("x", DType::kF32, {3, 2});
  b.input("t", DType::kF32, {1, 2});
  b.graph().add_node(node("Relu", {"x"}, {"rx"}));
  b.graph().add_node(node("SplitToSequence", {"rx"}, {"parts"}, {{"axis", Attribute::of_int(0)}}));
  b.constant("zero", i64({}, {0}));
  b.constant("one", i64({}, {1}));
  b.graph().add_node(node("SequenceInsert", {"parts", "t", "zero"}, {"seq"}));
  b.graph().add_node(node("SequenceLength", {"seq"}, {"len"}));
  b.graph().add_node(node("SequenceAt", {"seq", "one"}, {"item"}));
  b.graph().add_node(node("ConcatFromSequence", {"seq"}, {"cat"}, {{"axis", Attribute::of_int(0)}}));
  for (const char* o : {"seq", "len", "item", "cat"}) b.output(o);
  // The ONNX checker wants the rank of a main graph's tensor outputs.
  b.graph().value_info["item"] = ValueInfo(DType::kF32, Shape{1, 2});
  b.graph().value_info["cat"] = ValueInfo(DType::kF32, Shape{4, 2});
  return b.take();
}

TEST(Sequences, BuildTakeApartAndConcatenate) {
  auto s = make_session(sequence_graph());
  ASSERT_TRUE(s);
  Tensor x = Tensor::f32({3, 2}, {1, -2, 3, -4, 5, -6});
  Tensor t = Tensor::f32({1, 2}, {9, 9});
  auto r = s->run_values({{"x", x}, {"t", t}});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_TRUE((*r)[0].is_sequence());
  ASSERT_EQ((*r)[0].sequence.size(), 4u);
  EXPECT_EQ((*r)[1].tensor.data<int64_t>()[0], 4);
  EXPECT_EQ(values((*r)[2].tensor), (std::vector<float>{1, 0}));
  EXPECT_EQ((*r)[3].tensor.shape(), (Shape{4, 2}));
  EXPECT_EQ(values((*r)[3].tensor), (std::vector<float>{9, 9, 1, 0, 3, 0, 5, 0}));
  // The sequence keeps its items after another run reuses the session's memory.
  std::vector<float> first_item = values((*r)[0].sequence[1]);
  auto again = s->run_values({{"x", Tensor::f32({3, 2}, {7, 7, 7, 7, 7, 7})}, {"t", t}});
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(values((*r)[0].sequence[1]), first_item);
  // run() refuses a sequence output and names run_values.
  auto plain = s->run({{"x", x}, {"t", t}});
  ASSERT_FALSE(plain.is_ok());
  EXPECT_NE(plain.status().message().find("run_values"), std::string::npos);
}

TEST(Sequences, PositionsOutOfRangeAreErrors) {
  GraphBuilder b("at", 17);
  b.graph().inputs.push_back("s");
  b.graph().value_info["s"] = ValueInfo(DType::kF32, std::nullopt, {ValueKind::kSequence});
  b.input("p", DType::kI64, {});
  b.graph().add_node(node("SequenceAt", {"s", "p"}, {"y"}));
  b.output("y");
  auto s = make_session(b.take());
  ASSERT_TRUE(s);
  RunValue seq = RunValue::of_sequence({Tensor::f32({1}, {1}), Tensor::f32({1}, {2})}, DType::kF32);
  auto ok = s->run_values({{"s", seq}, {"p", i64({}, {-1})}});
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(values((*ok)[0].tensor), std::vector<float>{2});
  auto bad = s->run_values({{"s", seq}, {"p", i64({}, {2})}});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  // A tensor where a sequence is declared.
  auto kind = s->run_values({{"s", Tensor::f32({1}, {1})}, {"p", i64({}, {0})}});
  ASSERT_FALSE(kind.is_ok());
  EXPECT_NE(kind.status().message().find("seq("), std::string::npos) << kind.status().to_string();
}

TEST(Optionals, HasElementAndGetElement) {
  GraphBuilder b("opt", 17);
  b.graph().inputs.push_back("o");
  b.graph().value_info["o"] = ValueInfo(DType::kF32, Shape{2}, {ValueKind::kOptional});
  b.graph().add_node(node("OptionalHasElement", {"o"}, {"has"}));
  b.graph().add_node(node("If", {"has"}, {"y"},
                          {{"then_branch", subgraph("then", {}, {node("OptionalGetElement", {"o"}, {"got"})}, {"got"})},
                           {"else_branch", subgraph("else", {}, {node("Optional", {"o"}, {"none"})}, {"none"})}}));
  b.output("has");
  auto s = make_session(b.take());
  ASSERT_TRUE(s);
  auto with = s->run_values({{"o", Tensor::f32({2}, {1, 2})}});
  ASSERT_TRUE(with.is_ok()) << with.status().to_string();
  EXPECT_EQ((*with)[0].tensor.data<uint8_t>()[0], 1);
  auto without = s->run_values({{"o", RunValue::none()}});
  ASSERT_TRUE(without.is_ok()) << without.status().to_string();
  EXPECT_EQ((*without)[0].tensor.data<uint8_t>()[0], 0);
}

TEST(ControlFlowOnnx, SequenceTypesAndSubgraphsRoundTrip) {
  for (Graph g : {sequence_graph(), loop_graph()}) {
    auto bytes = serialize_onnx(g);
    ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
    OnnxLoadOptions lo;
    lo.warn = [](const std::string&) {};
    auto back = load_onnx_from_memory(bytes->data(), bytes->size(), {}, lo);
    ASSERT_TRUE(back.is_ok()) << g.name << ": " << back.status().to_string();
    if (g.name == "seq") {
      const ValueInfo* vi = back->info("seq");
      ASSERT_TRUE(vi);
      EXPECT_EQ(vi->containers, std::vector<ValueKind>{ValueKind::kSequence});
      EXPECT_EQ(vi->dtype, DType::kF32);
    }
    auto s = make_session(std::move(back).value());
    ASSERT_TRUE(s);
  }
}

TEST(ValueFiles, SequenceAndOptionalProtosRoundTrip) {
  const auto dir = std::filesystem::temp_directory_path() / ("keel_cf_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ValueInfo seq_t(DType::kF32, std::nullopt, {ValueKind::kSequence});
  ValueInfo opt_seq_t(DType::kF32, std::nullopt, {ValueKind::kOptional, ValueKind::kSequence});
  RunValue seq = RunValue::of_sequence({Tensor::f32({2}, {1, 2}), Tensor::f32({1}, {3})}, DType::kF32);
  ASSERT_TRUE(write_value_pb(seq, &seq_t, dir / "s.pb", "s").is_ok());
  ASSERT_TRUE(write_value_pb(RunValue::none(), &opt_seq_t, dir / "n.pb", "n").is_ok());
  ASSERT_TRUE(write_value_pb(seq, &opt_seq_t, dir / "o.pb", "o").is_ok());
  std::string name;
  auto s = read_value_file(dir / "s.pb", &seq_t, &name);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(name, "s");
  ASSERT_EQ(s->sequence.size(), 2u);
  EXPECT_EQ(values(s->sequence[1]), std::vector<float>{3});
  auto n = read_value_file(dir / "n.pb", &opt_seq_t);
  ASSERT_TRUE(n.is_ok()) << n.status().to_string();
  EXPECT_TRUE(n->is_none());
  auto o = read_value_file(dir / "o.pb", &opt_seq_t);
  ASSERT_TRUE(o.is_ok()) << o.status().to_string();
  EXPECT_TRUE(o->is_sequence());
  // Garbage is an error, not a crash.
  { std::ofstream(dir / "bad.pb") << "\xff\xff\xff not a proto"; }
  EXPECT_FALSE(read_value_file(dir / "bad.pb", &seq_t).is_ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace keel
