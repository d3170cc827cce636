#include "core/base/graph.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

Node make_node(std::string name, std::string op, std::vector<std::string> inputs, std::vector<std::string> outputs) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  return n;
}

TEST(Graph, BuilderMakesAValidTopologicallyOrderedGraph) {
  GraphBuilder b("g");
  auto x = b.input("x", DType::kF32, {1, 4});
  auto w = b.constant("w", Tensor::f32({4, 2}, std::vector<float>(8, 1.f)));
  auto mm = b.op1("MatMul", {x, w});
  auto r = b.op1("Relu", {mm});
  b.output(r);
  Graph g = b.take();
  ASSERT_TRUE(g.validate().is_ok()) << g.validate().to_string();
  auto order = g.topological_order().value();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(g.node(order[0])->op_type, "MatMul");
  EXPECT_EQ(g.node(order[1])->op_type, "Relu");
  EXPECT_EQ(g.producer(mm).value(), order[0]);
  EXPECT_EQ(g.consumers(mm), std::vector<NodeId>{order[1]});
  EXPECT_TRUE(g.is_initializer("w"));
}

TEST(Graph, TopologicalOrderFollowsDataNotInsertion) {
  Graph g;
  g.inputs = {"x"};
  Node late = make_node("late", "Relu", {"y"}, {"z"});
  Node early = make_node("early", "Relu", {"x"}, {"y"});
  g.add_node(late);
  g.add_node(early);
  g.outputs = {"z"};
  auto order = g.topological_order().value();
  EXPECT_EQ(g.node(order[0])->name, "early");
}

TEST(Graph, ValidateNamesTheProblem) {
  Graph g;
  g.inputs = {"x"};
  g.add_node(make_node("n1", "Relu", {"missing"}, {"y"}));
  g.outputs = {"y"};
  Status st = g.validate();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("missing"), std::string::npos);
  EXPECT_NE(st.message().find("n1"), std::string::npos);

  Graph cyc;
  cyc.add_node(make_node("a", "Relu", {"v2"}, {"v1"}));
  cyc.add_node(make_node("b", "Relu", {"v1"}, {"v2"}));
  cyc.outputs = {"v1"};
  st = cyc.validate();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("cycle"), std::string::npos);

  Graph twice;
  twice.inputs = {"x"};
  twice.add_node(make_node("a", "Relu", {"x"}, {"y"}));
  twice.add_node(make_node("b", "Relu", {"x"}, {"y"}));
  twice.outputs = {"y"};
  EXPECT_FALSE(twice.validate().is_ok());
}

TEST(Graph, EditsRemoveAndRewire) {
  GraphBuilder b;
  auto x = b.input("x", DType::kF32, {2});
  auto id = b.op1("Identity", {x});
  auto r = b.op1("Relu", {id});
  b.output(r);
  Graph g = b.take();
  auto idnode = *g.producer(id);
  g.replace_uses(id, x);
  ASSERT_TRUE(g.remove_node(idnode).is_ok());
  EXPECT_FALSE(g.remove_node(idnode).is_ok());
  EXPECT_TRUE(g.validate().is_ok());
  EXPECT_EQ(g.node_count(), 1u);
  std::string n1 = g.unique_name("t"), n2 = g.unique_name("t");
  EXPECT_NE(n1, n2);
  Graph copy = g;
  copy.outputs.clear();
  EXPECT_EQ(g.outputs.size(), 1u);
}

}  // namespace
}  // namespace keel
