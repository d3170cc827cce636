// The pass manager: pipelines from lists and TOML, passes registered as plugins editing through the C graph API.
#include "core/base/pass_manager.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/runtime/host_api.h"
#include "core/runtime/kernel_context.h"
#include "core/runtime/session.h"

namespace keel {
namespace {

const keel_core_api_t* g_host = nullptr;

// Removes Identity nodes: rewires their readers to the Identity's input.
keel_status_t drop_identity(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* opts,
                            const char*, keel_pass_report_t* report) {
  int64_t limit = 1000;
  g_host->options->get_int(opts, "limit", &limit);
  keel_node_id_t ids[256];
  size_t n = api->nodes(g, ids, 256);
  int64_t removed = 0;
  for (size_t i = 0; i < n && removed < limit; ++i) {
    if (std::strcmp(api->node_op_type(g, ids[i]), "Identity") != 0) continue;
    std::string in = api->node_input(g, ids[i], 0), out = api->node_output(g, ids[i], 0);
    if (api->value_is_graph_output(g, out.c_str())) {
      report->note(report, "kept an Identity that writes a graph output");
      continue;
    }
    if (keel_status_t st = api->replace_uses(g, out.c_str(), in.c_str())) return st;
    if (keel_status_t st = api->remove_node(g, ids[i])) return st;
    ++removed;
  }
  report->count(report, "identities_removed", removed);
  return nullptr;
}

// Always fails, to check that the graph is restored.
keel_status_t broken_pass(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t*, const char*,
                          keel_pass_report_t*) {
  keel_node_id_t ids[8];
  if (api->nodes(g, ids, 8) > 0) api->remove_node(g, ids[0]);
  return g_host->status_create(KEEL_STATUS_INTERNAL, "broken on purpose");
}

keel_status_t init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  g_host = host;
  keel_pass_def_t p{};
  p.struct_size = sizeof p;
  p.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  p.name = "drop_identity";
  p.description = "removes Identity nodes";
  p.run = drop_identity;
  if (keel_status_t st = host->register_pass(plugin, &p)) return st;
  p.name = "broken";
  p.run = broken_pass;
  return host->register_pass(plugin, &p);
}
const keel_plugin_t kPasses = {.struct_size = sizeof(keel_plugin_t),
                               .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                               .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                               .name = "test_passes",
                               .version = "1.0",
                               .kind = KEEL_PLUGIN_KIND_PASS,
                               .init = init,
                               .shutdown = nullptr,
                               .init_instance = nullptr,
                               .shutdown_instance = nullptr};

std::unique_ptr<Environment> make_env() {
  EnvironmentOptions o;
  o.discover_plugins = false;
  o.builtin_plugins.push_back({&kPasses, 0, "test passes"});
  return Environment::create(o).value();
}

Graph with_identities() {
  GraphBuilder b("ids");
  auto x = b.input("x", DType::kF32, {3});
  auto a = b.op1("Identity", {x});
  auto r = b.op1("Relu", {a});
  auto c = b.op1("Identity", {r});
  auto d = b.op1("Identity", {c});
  b.output(d);
  return b.take();
}

TEST(PassPipeline, ParsesListsAndToml) {
  auto list = parse_pipeline_list("a, b,c").value();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[1].name, "b");
  EXPECT_FALSE(parse_pipeline_list("a,,b").is_ok());
  // Options after the name: typed bool / integer / number / string.
  auto opts = parse_pipeline_list("fuse:dtype=bf16:any_kernel=true:limit=3:tol=0.5, b").value();
  ASSERT_EQ(opts.size(), 2u);
  EXPECT_EQ(opts[0].name, "fuse");
  EXPECT_EQ(std::get<std::string>(opts[0].options.values.at("dtype")), "bf16");
  EXPECT_EQ(std::get<bool>(opts[0].options.values.at("any_kernel")), true);
  EXPECT_EQ(std::get<int64_t>(opts[0].options.values.at("limit")), 3);
  EXPECT_DOUBLE_EQ(std::get<double>(opts[0].options.values.at("tol")), 0.5);
  EXPECT_TRUE(opts[1].options.values.empty());
  EXPECT_FALSE(parse_pipeline_list("a:dtype").is_ok());
  EXPECT_FALSE(parse_pipeline_list("a:=x").is_ok());
  EXPECT_FALSE(parse_pipeline_list(":k=v").is_ok());

  auto toml = parse_pipeline_toml(R"([[pass]]
name = "drop_identity"
[pass.options]
limit = 1
keep = ["x", "y"]
[[pass]]
name = "other"
)",
                                  "test.toml");
  ASSERT_TRUE(toml.is_ok()) << toml.status().to_string();
  ASSERT_EQ(toml.value().size(), 2u);
  EXPECT_EQ(std::get<int64_t>(toml.value()[0].options.values.at("limit")), 1);
  EXPECT_EQ(std::get<std::vector<std::string>>(toml.value()[0].options.values.at("keep")).size(), 2u);

  auto bad = parse_pipeline_toml("[[pass]]\nname = 3\n", "bad.toml");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("name"), std::string::npos);
  auto broken = parse_pipeline_toml("[[pass\n", "broken.toml");
  ASSERT_FALSE(broken.is_ok());
  EXPECT_NE(broken.status().message().find("broken.toml:"), std::string::npos) << broken.status().message();
}

TEST(PassManager, RunsPassesInOrderAndReports) {
  auto env = make_env();
  Graph g = with_identities();
  keel_graph_s view;
  view.graph = &g;
  view.env = env.get();
  PassManager pm(env->registry(), graph_api());
  auto reports = pm.run(g, &view, parse_pipeline_list("drop_identity").value(), "cpu");
  ASSERT_TRUE(reports.is_ok()) << reports.status().to_string();
  const PassReport& r = reports.value()[0];
  EXPECT_EQ(r.nodes_before, 4u);
  EXPECT_EQ(r.nodes_after, 2u);  // the Identity feeding the graph output stays
  EXPECT_EQ(r.counters.at("identities_removed"), 2);
  EXPECT_EQ(r.notes.size(), 1u);
  EXPECT_TRUE(g.validate().is_ok());
}

TEST(PassManager, OptionsReachThePass) {
  auto env = make_env();
  Graph g = with_identities();
  keel_graph_s view;
  view.graph = &g;
  view.env = env.get();
  auto pipeline = parse_pipeline_toml("[[pass]]\nname = \"drop_identity\"\n[pass.options]\nlimit = 1\n", "t").value();
  auto reports = PassManager(env->registry(), graph_api()).run(g, &view, pipeline, "cpu").value();
  EXPECT_EQ(reports[0].counters.at("identities_removed"), 1);
}

TEST(PassManager, UnknownPassAndFailingPass) {
  auto env = make_env();
  Graph g = with_identities();
  keel_graph_s view;
  view.graph = &g;
  view.env = env.get();
  PassManager pm(env->registry(), graph_api());
  auto r = pm.run(g, &view, parse_pipeline_list("nope").value(), "cpu");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("drop_identity"), std::string::npos) << "lists known passes";
  r = pm.run(g, &view, parse_pipeline_list("broken").value(), "cpu");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("broken on purpose"), std::string::npos);
  EXPECT_EQ(g.node_count(), 4u) << "the graph is restored after a failing pass";
}

TEST(PassManager, SessionRunsItsPipelineAndTheResultIsCorrect) {
  auto env = make_env();
  SessionOptions opts;
  opts.devices = {"cpu"};
  opts.passes = {"drop_identity"};
  auto s = Session::create(*env, with_identities(), opts);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ(s.value()->graph().node_count(), 2u);
  auto out = s.value()->run({{"x", Tensor::f32({3}, {-1, 0, 2})}}).value();
  EXPECT_EQ(out[0].data<float>()[2], 2.f);
  EXPECT_EQ(out[0].data<float>()[0], 0.f);
}

TEST(GraphApi, EvaluateRunsPartOfTheGraphOnTheCpu) {
  auto env = make_env();
  Graph g = with_identities();
  keel_graph_s view;
  view.graph = &g;
  view.env = env.get();
  std::string relu_out = g.node(g.topological_order().value()[1])->outputs[0];
  Tensor x = Tensor::f32({3}, {-1, 5, 2});
  keel_tensor_t xv = x.c_view();
  const keel_tensor_t* ins[] = {&xv};
  const char* in_names[] = {"x"};
  const char* out_names[] = {relu_out.c_str()};
  keel_tensor_t* outs[1] = {nullptr};
  Status st = Status::from_c(graph_api()->evaluate(&view, in_names, ins, 1, out_names, 1, outs));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(static_cast<float*>(outs[0]->data)[1], 5.f);
  EXPECT_EQ(static_cast<float*>(outs[0]->data)[0], 0.f);
  graph_api()->release_tensor(outs[0]);
}

}  // namespace
}  // namespace keel
