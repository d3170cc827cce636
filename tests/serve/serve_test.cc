// `keel serve` end to end: the server is the keel binary, started on 127.0.0.1 with --port 0 (it prints the port),
// on a repository of models generated here (GraphBuilder + serialize_onnx, no files in git). Every endpoint's status
// and body; JSON and binary requests give identical outputs, equal to an in-process Session run; bad requests get
// their 4xx and the server keeps serving; concurrent clients are batched (exec count < inference count) and each gets
// its own result; the queue refuses past max_queue_size (429); SIGTERM under load loses no accepted request.
// Every wait is bounded.
#include "tests/serve/serve_test_util.h"

namespace {

using namespace keel_serve_test;

class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::signal(SIGPIPE, SIG_IGN);  // a server that closes early must not end the test
    repo_ = fs::temp_directory_path() / ("keel_serve_test_" + std::to_string(getpid()));
    fs::remove_all(repo_);
    mlp_ = mlp_model();
    write(repo_ / "mlp" / "1" / "model.onnx", mlp_);
    write(repo_ / "mlp" / "config.toml", "max_batch_size = 16\nmax_queue_delay_us = 50000\n");
    write(repo_ / "plain" / "1" / "model.onnx", mlp_);
    write(repo_ / "plain" / "3" / "model.onnx", mlp_);
    write(repo_ / "ints" / "1" / "model.onnx", int_model());
    write(repo_ / "halves" / "1" / "model.onnx", f16_model());
    write(repo_ / "fixed" / "1" / "model.onnx", fixed_mlp_model());
    write(repo_ / "fixed" / "config.toml",
          "max_batch_size = 8\nmax_queue_delay_us = 20000\ndynamic_batch = true\n"
          "warmup_batch_sizes = [1, 3]\n");
    for (int v : {1, 2, 3})
      write(repo_ / "vp" / std::to_string(v) / "model.onnx", fixed_mlp_model(static_cast<float>(v)));
    write(repo_ / "vp" / "config.toml", "[version_policy]\nlatest = 2\n");
    write(repo_ / "twins" / "1" / "model.onnx", mlp_);
    write(repo_ / "twins" / "config.toml", "instances = 3\nmax_batch_size = 4\n");
    write(repo_ / "cold" / "1" / "model.onnx", mlp_);
    write(repo_ / "cold" / "config.toml", "warmup_batch_sizes = []\n");
    write(repo_ / "picky" / "1" / "model.onnx", reshape_model());
    server_ = new ServerProcess();
    ASSERT_TRUE(server_->start(repo_, {"--max-body-mib", "1"})) << server_->log;
  }
  static void TearDownTestSuite() {
    if (server_) {
      EXPECT_EQ(server_->terminate(), 0);
    }
    delete server_;
    server_ = nullptr;
    fs::remove_all(repo_);
  }
  static json get_json(const std::string& path, int expect) {
    auto c = server_->client();
    auto r = c->Get(path.c_str());
    EXPECT_TRUE(r) << path;
    if (!r) return {};
    EXPECT_EQ(r->status, expect) << path << ": " << r->body;
    auto j = json::parse(r->body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << path << ": " << r->body;
    return j;
  }
  static httplib::Result post(const std::string& path, const std::string& body, const httplib::Headers& headers = {},
                              const char* type = "application/json") {
    auto c = server_->client();
    return c->Post(path.c_str(), headers, body, type);
  }
  // Posts and checks the status and that an error body says {"error": ...}.
  static void expect_error(const std::string& path, const std::string& body, int status,
                           const httplib::Headers& headers = {}) {
    auto r = post(path, body, headers);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, status) << body.substr(0, 200) << " -> " << r->body;
    auto j = json::parse(r->body, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("error") && j["error"].is_string()) << r->body;
  }
  static inline fs::path repo_;
  static inline std::string mlp_;
  static inline ServerProcess* server_ = nullptr;
};

TEST_F(Serve, HealthAndMetadata) {
  EXPECT_EQ(get_json("/v2/health/live", 200)["live"], true);
  EXPECT_EQ(get_json("/v2/health/ready", 200)["ready"], true);
  auto meta = get_json("/v2", 200);
  EXPECT_EQ(meta["name"], "keel");
  EXPECT_TRUE(meta["extensions"].is_array());
  auto m = get_json("/v2/models/mlp", 200);
  EXPECT_EQ(m["name"], "mlp");
  EXPECT_EQ(m["versions"], json::array({"1"}));
  ASSERT_EQ(m["inputs"].size(), 1u);
  EXPECT_EQ(m["inputs"][0]["name"], "x");
  EXPECT_EQ(m["inputs"][0]["datatype"], "FP32");
  EXPECT_EQ(m["inputs"][0]["shape"], json::array({-1, 4}));
  ASSERT_EQ(m["outputs"].size(), 2u);
  EXPECT_EQ(m["outputs"][0]["datatype"], "FP32");
  EXPECT_EQ(m["outputs"][0]["shape"], json::array({-1, 3}));
  EXPECT_EQ(get_json("/v2/models/mlp/versions/1", 200)["name"], "mlp");
  EXPECT_EQ(get_json("/v2/models/plain", 200)["versions"], json::array({"3"}));  // the highest version
  EXPECT_EQ(get_json("/v2/models/plain/versions/3/ready", 200)["ready"], true);
  EXPECT_EQ(get_json("/v2/models/mlp/ready", 200)["ready"], true);
  EXPECT_TRUE(get_json("/v2/models/plain/versions/1", 404).contains("error"));
  EXPECT_TRUE(get_json("/v2/models/nope", 404).contains("error"));
  EXPECT_TRUE(get_json("/v2/models/nope/ready", 404).contains("error"));
  EXPECT_TRUE(get_json("/v2/no/such/endpoint", 404).contains("error"));
  EXPECT_EQ(get_json("/v2/models/ints", 200)["inputs"][0]["datatype"], "INT64");
}

TEST_F(Serve, JsonAndBinaryEqualInProcessRun) {
  const std::vector<float> x = {0.5f, -1.f, 2.f, 0.25f, -0.75f, 1.5f, 3.f, -2.f};
  const auto ref = reference_run(mlp_, "x", Tensor::f32({2, 4}, x));
  ASSERT_EQ(ref.size(), 2u);
  // JSON, nested data, id echoed.
  json body = {
      {"id", "req-42"},
      {"inputs", json::array({json{
                     {"name", "x"},
                     {"datatype", "FP32"},
                     {"shape", {2, 4}},
                     {"data", json::array({json::array({0.5, -1, 2, 0.25}), json::array({-0.75, 1.5, 3, -2})})}}})}};
  for (const char* model : {"mlp", "plain"}) {
    auto r = post(std::string("/v2/models/") + model + "/infer", body.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    auto j = json::parse(r->body);
    EXPECT_EQ(j["id"], "req-42");
    EXPECT_EQ(j["model_name"], model);
    ASSERT_EQ(j["outputs"].size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(j["outputs"][k]["shape"], json::array({2, 3}));
      const auto got = floats_of(j["outputs"][k]["data"]);
      ASSERT_EQ(got.size(), 6u);
      for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(got[i], ref[k].data<float>()[i], 1e-5f) << model << " output " << k;
    }
  }
  // Brackets inside a string (after an escaped quote) are text, not nesting: the depth limit does not count them.
  json bracketed = body;
  bracketed["id"] = "\"quoted\" " + std::string(1000, '[') + "\\" + std::string(1000, '{');
  auto rq = post("/v2/models/mlp/infer", bracketed.dump());
  ASSERT_TRUE(rq);
  ASSERT_EQ(rq->status, 200) << rq->body.substr(0, 200);
  EXPECT_EQ(json::parse(rq->body)["id"], bracketed["id"]);
  // Output selection.
  body["outputs"] = json::array(
      {json{{"name", json::parse(post("/v2/models/mlp/infer", infer_body(x, 2).dump())->body)["outputs"][1]["name"]}}});
  auto sel = json::parse(post("/v2/models/mlp/infer", body.dump())->body);
  ASSERT_EQ(sel["outputs"].size(), 1u);
  const auto json_z = floats_of(sel["outputs"][0]["data"]);
  // The binary extension: input bytes after the JSON header, output z asked for as binary.
  json head = {
      {"inputs",
       json::array(
           {json{{"name", "x"}, {"datatype", "FP32"}, {"shape", {2, 4}}, {"parameters", {{"binary_data_size", 32}}}}})},
      {"outputs", json::array({json{{"name", sel["outputs"][0]["name"]}, {"parameters", {{"binary_data", true}}}}})}};
  const std::string h = head.dump();
  std::string bin = h;
  bin.append(reinterpret_cast<const char*>(x.data()), 32);
  auto r = post("/v2/models/mlp/infer", bin, {{"Inference-Header-Content-Length", std::to_string(h.size())}},
                "application/octet-stream");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  ASSERT_TRUE(r->has_header("Inference-Header-Content-Length"));
  const size_t hl = std::stoul(r->get_header_value("Inference-Header-Content-Length"));
  auto rj = json::parse(r->body.substr(0, hl));
  EXPECT_EQ(rj["outputs"][0]["parameters"]["binary_data_size"], 24);
  ASSERT_EQ(r->body.size(), hl + 24);
  std::vector<float> bin_z(6);
  std::memcpy(bin_z.data(), r->body.data() + hl, 24);
  EXPECT_EQ(bin_z, json_z);  // bit-identical
  // binary_data_output for every output.
  json all = infer_body(x, 2);
  all["parameters"] = {{"binary_data_output", true}};
  auto r2 = post("/v2/models/mlp/infer", all.dump());
  ASSERT_TRUE(r2);
  ASSERT_EQ(r2->status, 200);
  EXPECT_EQ(r2->body.size(), std::stoul(r2->get_header_value("Inference-Header-Content-Length")) + 48);
  // INT64.
  json ib = {
      {"inputs", json::array({json{{"name", "a"}, {"datatype", "INT64"}, {"shape", {1, 2}}, {"data", {1, 2}}}})}};
  auto ri = post("/v2/models/ints/infer", ib.dump());
  ASSERT_TRUE(ri);
  ASSERT_EQ(ri->status, 200) << ri->body;
  EXPECT_EQ(json::parse(ri->body)["outputs"][0]["data"], json::array({11, -18}));
  EXPECT_EQ(json::parse(ri->body)["outputs"][0]["datatype"], "INT64");
  // Integers beyond 2^53 stay exact (parsed as integers, not through a double).
  const std::string big =
      R"({"inputs":[{"name":"a","datatype":"INT64","shape":[1,2],"data":[9007199254740993, -9000000000000000001]}]})";
  auto rb = post("/v2/models/ints/infer", big);
  ASSERT_TRUE(rb);
  ASSERT_EQ(rb->status, 200) << rb->body;
  EXPECT_EQ(json::parse(rb->body)["outputs"][0]["data"],
            json::array({int64_t{9007199254741003}, int64_t{-9000000000000000021}}));
  expect_error("/v2/models/ints/infer",
               R"({"inputs":[{"name":"a","datatype":"INT64","shape":[1,2],"data":[9223372036854775808, 1]}]})", 400);
}

TEST_F(Serve, BadRequestsGetTheir4xxAndServingGoesOn) {
  const std::string p = "/v2/models/plain/infer";
  const std::vector<float> x(8, 1.f);
  expect_error(p, "{\"inputs\": [", 400);                                     // malformed JSON
  expect_error(p, std::string(100000, '[') + std::string(100000, ']'), 400);  // deep nesting
  expect_error(p, "[]", 400);                                                 // not an object
  json wrong_dtype = infer_body(x, 2);
  wrong_dtype["inputs"][0]["datatype"] = "INT64";
  expect_error(p, wrong_dtype.dump(), 400);
  json bad_dtype_name = infer_body(x, 2);
  bad_dtype_name["inputs"][0]["datatype"] = "FLOAT";
  expect_error(p, bad_dtype_name.dump(), 400);
  json short_data = infer_body(std::vector<float>(7, 1.f), 2);  // shape [2,4] with 7 values
  expect_error(p, short_data.dump(), 400);
  json overflow = infer_body(x, 2);
  overflow["inputs"][0]["shape"] = {int64_t{1} << 62, 4};
  expect_error(p, overflow.dump(), 400);
  json negative = infer_body(x, 2);
  negative["inputs"][0]["shape"] = {-2, 4};
  expect_error(p, negative.dump(), 400);
  json wrong_rank = infer_body(x, 2);
  wrong_rank["inputs"][0]["shape"] = {8};
  expect_error(p, wrong_rank.dump(), 400);
  json wrong_dim = infer_body(x, 2);
  wrong_dim["inputs"][0]["shape"] = {4, 2};
  expect_error(p, wrong_dim.dump(), 400);
  json strings = infer_body(x, 2);
  strings["inputs"][0]["data"] = json::array({"a", "b", "c", "d", "e", "f", "g", "h"});
  expect_error(p, strings.dump(), 400);
  json unknown_input = infer_body(x, 2);
  unknown_input["inputs"][0]["name"] = "nope";
  expect_error(p, unknown_input.dump(), 400);
  expect_error(p, json{{"inputs", json::array()}}.dump(), 400);  // missing input
  json unknown_output = infer_body(x, 2);
  unknown_output["outputs"] = json::array({json{{"name", "nope"}}});
  expect_error(p, unknown_output.dump(), 400);
  // The lifted-array fast path (tensor_json.h) keeps the general path's checks.
  json with_bool = infer_body(std::vector<float>(8, 1.f), 2);
  with_bool["inputs"][0]["data"][7] = true;
  expect_error(p, with_bool.dump(), 400);
  const std::string head = R"({"inputs":[{"name":"x","datatype":"FP32","shape":[2,4],"data":)";
  expect_error(p, head + "[1,2,3,4,5,6,7,]}]}", 400);       // trailing comma
  expect_error(p, head + "[1,2,3,4,5,6,7,,8]}]}", 400);     // empty element
  expect_error(p, head + "[1,2,3,4,5,6,7 8]}]}", 400);      // missing comma
  expect_error(p, head + "[1,2,3,4,5,6,7,1e400]}]}", 400);  // out of range
  expect_error(p, head + "[1,2,3,4,5,6,7,+8]}]}", 400);     // not a JSON number
  expect_error(p, head + "[1,2,3,4,5,6,7,tru]}]}", 400);
  expect_error(p, head + "{\"__keel_data__\": 9}}]}", 400);  // the marker, forged
  expect_error(p, head + "[[1,2,3,4],[5,6,7]]}]}", 400);     // 7 of 8
  json fractional = {
      {"inputs", json::array({json{{"name", "a"}, {"datatype", "INT64"}, {"shape", {1, 2}}, {"data", {1.5, 2}}}})}};
  expect_error("/v2/models/ints/infer", fractional.dump(), 400);
  json bin_size = {
      {"inputs",
       json::array({json{
           {"name", "x"}, {"datatype", "FP32"}, {"shape", {2, 4}}, {"parameters", {{"binary_data_size", 31}}}}})}};
  expect_error(p, bin_size.dump() + std::string(31, '\0'), 400,
               {{"Inference-Header-Content-Length", std::to_string(bin_size.dump().size())}});
  expect_error(p, infer_body(x, 2).dump(), 400, {{"Inference-Header-Content-Length", "999999"}});
  expect_error("/v2/models/nope/infer", infer_body(x, 2).dump(), 404);
  expect_error("/v2/models/plain/versions/1/infer", infer_body(x, 2).dump(), 404);
  expect_error("/v2/models/plain/versions/abc/infer", infer_body(x, 2).dump(), 404);
  expect_error("/v2/models/a..b/infer", infer_body(x, 2).dump(), 400);
  expect_error("/v2/models/%2E%2E/infer", infer_body(x, 2).dump(), 400);
  json too_many = infer_body(std::vector<float>(17 * 4, 1.f), 17);  // past mlp's max_batch_size 16
  expect_error("/v2/models/mlp/infer", too_many.dump(), 400);
  {
    auto r = post(p, std::string(2u << 20, ' '));  // past --max-body-mib 1
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
    // The length comes from the header field (Beast's content_length() asserts before the header counts as done: a
    // build with assertions, the ASan one, aborted the server here).
    EXPECT_NE(r->body.find("Content-Length 2097152"), std::string::npos) << r->body;
  }
  {
    // A long header line within the 64 KiB of all headers is served; one line or many headers past it: 431.
    auto big_line = post(p, infer_body(x, 2).dump(), {{"X-Big", std::string(20000, 'a')}});
    ASSERT_TRUE(big_line);
    EXPECT_EQ(big_line->status, 200) << big_line->body;
    expect_error(p, infer_body(x, 2).dump(), 431, {{"X-Big", std::string(70000, 'a')}});
    httplib::Headers many;
    for (int i = 0; i < 100; ++i) many.emplace("X-H" + std::to_string(i), std::string(1000, 'b'));
    expect_error(p, infer_body(x, 2).dump(), 431, many);
  }
  auto r = post(p, infer_body(x, 2).dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  auto metrics = server_->client()->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("keel_inference_request_failure{model=\"plain\",version=\"3\",reason=\"bad_request\"}"),
            std::string::npos);
}

TEST_F(Serve, VersionPolicyServesTheLatestTwo) {
  auto meta = get_json("/v2/models/vp", 200);
  EXPECT_EQ(meta["versions"], json::array({"2", "3"}));
  EXPECT_TRUE(get_json("/v2/models/vp/versions/1", 404)["error"].get<std::string>().find("serving 2, 3") !=
              std::string::npos);
  EXPECT_EQ(get_json("/v2/models/vp/versions/2/ready", 200)["ready"], true);
  const std::vector<float> x = {1, 2, 3, 4};
  const auto ref = reference_run(fixed_mlp_model(1.f), "x", Tensor::f32({1, 4}, x))[0];
  for (const auto& [path, version] : std::vector<std::pair<std::string, int>>{
           {"/v2/models/vp/infer", 3}, {"/v2/models/vp/versions/2/infer", 2}, {"/v2/models/vp/versions/3/infer", 3}}) {
    auto r = post(path, infer_body(x, 1).dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << path << ": " << r->body;
    auto j = json::parse(r->body);
    EXPECT_EQ(j["model_version"], std::to_string(version)) << path;
    const auto got = floats_of(j["outputs"][0]["data"]);
    ASSERT_EQ(got.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(got[i], version * ref.data<float>()[i], 1e-4f) << path;
  }
  expect_error("/v2/models/vp/versions/1/infer", infer_body(x, 1).dump(), 404);
}

TEST_F(Serve, DynamicBatchOfAFixedModelAndFp16Json) {
  // `dynamic_batch = true` serves a model exported with batch 1 at any batch up to max_batch_size.
  EXPECT_EQ(get_json("/v2/models/fixed", 200)["inputs"][0]["shape"], json::array({-1, 4}));
  const std::vector<float> x = {1, 2, 3, 4, -1, -2, -3, -4, 0.5f, 0.25f, 0, 8};
  auto r = post("/v2/models/fixed/infer", infer_body(x, 3).dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = json::parse(r->body);
  EXPECT_EQ(j["outputs"][0]["shape"], json::array({3, 3}));
  const auto got = floats_of(j["outputs"][0]["data"]);
  ASSERT_EQ(got.size(), 9u);
  for (int row = 0; row < 3; ++row) {
    const std::vector<float> xr(x.begin() + row * 4, x.begin() + row * 4 + 4);
    const auto ref = reference_run(fixed_mlp_model(), "x", Tensor::f32({1, 4}, xr))[0];
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[row * 3 + i], ref.data<float>()[i], 1e-4f) << "row " << row;
  }
  // FP16 in JSON: numbers in, numbers out (h + h); in binary: the raw bits.
  json h = {{"inputs", json::array({json{
                           {"name", "h"}, {"datatype", "FP16"}, {"shape", {2, 2}}, {"data", {0.5, 1.25, -2, 3}}}})}};
  auto rh = post("/v2/models/halves/infer", h.dump());
  ASSERT_TRUE(rh);
  ASSERT_EQ(rh->status, 200) << rh->body;
  auto jh = json::parse(rh->body);
  EXPECT_EQ(jh["outputs"][0]["datatype"], "FP16");
  EXPECT_EQ(floats_of(jh["outputs"][0]["data"]), (std::vector<float>{1, 2.5f, -4, 6}));
  const uint16_t bits[4] = {keel::f32_to_f16(0.5f), keel::f32_to_f16(1.25f), keel::f32_to_f16(-2.f),
                            keel::f32_to_f16(3.f)};
  json hb = {{"inputs",
              json::array({json{
                  {"name", "h"}, {"datatype", "FP16"}, {"shape", {2, 2}}, {"parameters", {{"binary_data_size", 8}}}}})},
             {"parameters", {{"binary_data_output", true}}}};
  std::string body = hb.dump();
  const size_t hl = body.size();
  body.append(reinterpret_cast<const char*>(bits), 8);
  auto rb = post("/v2/models/halves/infer", body, {{"Inference-Header-Content-Length", std::to_string(hl)}},
                 "application/octet-stream");
  ASSERT_TRUE(rb);
  ASSERT_EQ(rb->status, 200) << rb->body;
  const size_t rhl = std::stoul(rb->get_header_value("Inference-Header-Content-Length"));
  ASSERT_EQ(rb->body.size(), rhl + 8);
  uint16_t out[4];
  std::memcpy(out, rb->body.data() + rhl, 8);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(keel::f16_to_f32(out[i]), 2 * keel::f16_to_f32(bits[i])) << i;
  // A value outside FP16's range is still a number; a string is not.
  h["inputs"][0]["data"] = {"a", 1, 2, 3};
  expect_error("/v2/models/halves/infer", h.dump(), 400);
}

TEST_F(Serve, FailureMetricsByReasonAndModelControlOff) {
  auto before = server_->client()->Get("/metrics");
  ASSERT_TRUE(before);
  const std::string key = "keel_inference_request_failure{model=\"plain\",version=\"3\",reason=\"bad_request\"}";
  const uint64_t bad0 = metric(before->body, key);
  expect_error("/v2/models/plain/infer", "{\"inputs\": 3}", 400);
  expect_error("/v2/models/plain/infer", "nope", 400);
  expect_error("/v2/repository/index", "", 403);
  expect_error("/v2/repository/models/plain/unload", "", 403);
  EXPECT_EQ(get_json("/v2", 200)["extensions"], json::array({"binary_tensor_data"}));
  auto good = post("/v2/models/plain/infer", infer_body(std::vector<float>(4, 1.f), 1).dump());
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, 200);
  auto after = server_->client()->Get("/metrics");
  ASSERT_TRUE(after);
  EXPECT_EQ(metric(after->body, key), bad0 + 2) << after->body;
  for (const char* reason : {"queue_full", "unavailable", "timeout", "run_failed"})
    EXPECT_NE(after->body.find(std::string("version=\"3\",reason=\"") + reason + "\"}"), std::string::npos) << reason;
  EXPECT_GE(metric(after->body, "keel_http_responses{code=\"403\"}"), 2u);
  EXPECT_GE(metric(after->body, "keel_http_responses{code=\"400\"}"), 2u);
  EXPECT_EQ(metric(after->body, "keel_model_instances", "mlp"), 1u);
  // Three instances, one build: the weights once.
  EXPECT_EQ(metric(after->body, "keel_model_instances", "twins"), 3u);
  EXPECT_EQ(metric(after->body, "keel_model_builds", "twins"), 1u);
  EXPECT_EQ(metric(after->body, "keel_model_constant_bytes", "twins"),
            metric(after->body, "keel_model_constant_bytes", "mlp"));
  EXPECT_GT(metric(after->body, "keel_model_constant_bytes", "twins"), 0u);
  EXPECT_NE(after->body.find("keel_memory_pool_bytes{device=\"cpu:0\",kind=\"reserved\"}"), std::string::npos)
      << after->body;
  for (const char* family : {"keel_inference_compute_input_duration_us", "keel_inference_compute_infer_duration_us",
                             "keel_inference_compute_output_duration_us", "keel_inference_queue_duration_us"})
    EXPECT_NE(after->body.find(std::string("# TYPE ") + family + " counter"), std::string::npos) << family;
  EXPECT_GT(metric(after->body, "keel_inference_compute_infer_duration_us", "plain"), 0u) << after->body;
}

// The server's outputs equal `keel run`'s on the same input file (both with the default passes).
// Every instance runs zeros at load unless the config says `warmup_batch_sizes = []`: by default once at batch 1, at
// each listed size otherwise, and instance 0 the first size once more, timed (twins: three instances, 3 + 1 runs;
// fixed: [1, 3], 2 + 1). A model that cannot run at the default warm-up shape (picky: [1, 1] does not reshape to
// [2, 2]) loads without it and serves.
TEST_F(Serve, EveryInstanceWarmsUpAtLoadUnlessTheConfigSaysNone) {
  auto m = server_->client()->Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* model : {"twins", "fixed", "mlp", "cold", "picky"})
    EXPECT_NE(m->body.find(std::string("keel_model_warmup_runs{model=\"") + model + "\","), std::string::npos) << model;
  EXPECT_EQ(metric(m->body, "keel_model_warmup_runs", "twins"), 4u) << m->body;
  EXPECT_EQ(metric(m->body, "keel_model_warmup_runs", "fixed"), 3u);
  EXPECT_EQ(metric(m->body, "keel_model_warmup_runs", "mlp"), 2u);
  EXPECT_EQ(metric(m->body, "keel_model_warmup_runs", "cold"), 0u);
  EXPECT_EQ(metric(m->body, "keel_model_warmup_runs", "picky"), 0u);
  json body = {
      {"inputs", json::array({{{"name", "x"}, {"datatype", "FP32"}, {"shape", {1, 4}}, {"data", {1, 2, 3, 4}}}})}};
  auto r = post("/v2/models/picky/infer", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = json::parse(r->body);
  EXPECT_EQ(j["outputs"][0]["shape"], json::array({2, 2}));
  EXPECT_EQ(j["outputs"][0]["data"], json::array({1.0, 2.0, 3.0, 4.0}));
}

TEST_F(Serve, OutputsEqualKeelRun) {
  const fs::path dir = repo_.parent_path() / ("keel_serve_run_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "out");
  const std::vector<float> x = {0.5f, -1.f, 2.f, 0.25f, -0.75f, 1.5f, 3.f, -2.f};
  ASSERT_TRUE(keel::write_tensor_pb(Tensor::f32({2, 4}, x), dir / "x.pb", "x").is_ok());
  const std::string cmd = std::string(KEEL_CLI_BINARY) + " --log-level warn --threads 1 run " +
                          (repo_ / "plain" / "3" / "model.onnx").string() + " -i x=" + (dir / "x.pb").string() +
                          " -o " + (dir / "out").string() + " --print 0 > " + (dir / "log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  json body = infer_body(x, 2);
  body["parameters"] = {{"binary_data_output", true}};
  auto r = post("/v2/models/plain/infer", body.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  size_t at = std::stoul(r->get_header_value("Inference-Header-Content-Length"));
  for (int k = 0; k < 2; ++k) {
    auto expected = keel::read_tensor_file(dir / "out" / ("output_" + std::to_string(k) + ".pb"));
    ASSERT_TRUE(expected.is_ok()) << expected.status().to_string();
    ASSERT_EQ(expected->byte_size(), 24u);
    ASSERT_GE(r->body.size(), at + 24);
    std::vector<float> got(6);
    std::memcpy(got.data(), r->body.data() + at, 24);
    at += 24;
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(got[i], expected->data<float>()[i], 1e-6f) << "output " << k;
  }
  fs::remove_all(dir);
}

// mlp batches (50 ms delay); twins runs 3 instances that share one build, concurrently.
TEST_F(Serve, ConcurrentClientsAreBatchedAndGetTheirOwnResults) {
  for (const std::string model : {"mlp", "twins"}) {
    auto before = server_->client()->Get("/metrics");
    ASSERT_TRUE(before);
    constexpr int kClients = 8, kRequests = 4;
    std::atomic<int> ok{0};
    std::vector<std::thread> threads;
    for (int c = 0; c < kClients; ++c)
      threads.emplace_back([&, c] {
        auto cli = server_->client();
        for (int i = 0; i < kRequests; ++i) {
          const int64_t rows = 1 + (c + i) % 3;
          std::vector<float> x(static_cast<size_t>(rows) * 4);
          for (size_t e = 0; e < x.size(); ++e) x[e] = static_cast<float>(c * 100 + i * 10) + 0.125f * e;
          auto r = cli->Post("/v2/models/" + model + "/infer", infer_body(x, rows).dump(), "application/json");
          if (!r || r->status != 200) continue;
          const auto ref = reference_run(mlp_, "x", Tensor::f32({rows, 4}, x));
          const auto got = floats_of(json::parse(r->body)["outputs"][0]["data"]);
          bool same = got.size() == static_cast<size_t>(rows * 3);
          for (size_t e = 0; same && e < got.size(); ++e)
            same = std::abs(got[e] - ref[0].data<float>()[e]) <= 1e-4f * (1.f + std::abs(got[e]));
          if (same) ok++;
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok.load(), kClients * kRequests) << model;
    auto after = server_->client()->Get("/metrics");
    ASSERT_TRUE(after);
    const uint64_t infers =
        metric(after->body, "keel_inference_count", model) - metric(before->body, "keel_inference_count", model);
    const uint64_t execs = metric(after->body, "keel_inference_exec_count", model) -
                           metric(before->body, "keel_inference_exec_count", model);
    EXPECT_GE(infers, static_cast<uint64_t>(kClients * kRequests));
    if (model == "mlp") {
      EXPECT_LT(execs, static_cast<uint64_t>(kClients * kRequests)) << after->body;
    }
    EXPECT_GE(metric(after->body, "keel_inference_request_success", model),
              static_cast<uint64_t>(kClients * kRequests));
  }
}

// A server of its own: requests held in the queue (long batching delay) when SIGTERM comes all complete; a full queue
// refuses with 429 and Retry-After.
TEST(ServeShutdown, SigtermUnderLoadLosesNoAcceptedRequestAndFullQueueIs429) {
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path repo = fs::temp_directory_path() / ("keel_serve_sigterm_" + std::to_string(getpid()));
  fs::remove_all(repo);
  const std::string mlp = mlp_model();
  write(repo / "held" / "1" / "model.onnx", mlp);
  write(repo / "held" / "config.toml", "max_batch_size = 64\nmax_queue_delay_us = 400000\n");
  write(repo / "small" / "1" / "model.onnx", mlp);
  write(repo / "small" / "config.toml", "max_batch_size = 64\nmax_queue_delay_us = 400000\nmax_queue_size = 2\n");
  ServerProcess server;
  ASSERT_TRUE(server.start(repo)) << server.log;
  {
    // Three at once on a queue of two: one is refused.
    std::atomic<int> ok{0}, refused{0};
    std::vector<std::thread> threads;
    for (int c = 0; c < 3; ++c)
      threads.emplace_back([&] {
        auto r = server.client()->Post("/v2/models/small/infer", infer_body(std::vector<float>(4, 1.f), 1).dump(),
                                       "application/json");
        if (r && r->status == 200) ok++;
        if (r && r->status == 429 && r->has_header("Retry-After")) refused++;
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok.load(), 2);
    EXPECT_EQ(refused.load(), 1);
  }
  constexpr int kClients = 8;
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c)
    threads.emplace_back([&, c] {
      std::vector<float> x(4, static_cast<float>(c));
      auto r = server.client()->Post("/v2/models/held/infer", infer_body(x, 1).dump(), "application/json");
      if (!r || r->status != 200) {
        failed++;
        return;
      }
      const auto ref = reference_run(mlp, "x", Tensor::f32({1, 4}, x));
      const auto got = floats_of(json::parse(r->body)["outputs"][0]["data"]);
      if (got.size() == 3 && std::abs(got[0] - ref[0].data<float>()[0]) < 1e-4f) ok++;
    });
  // Wait until every request is queued (the batcher holds them for 400 ms), then SIGTERM.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    auto m = server.client()->Get("/metrics");
    if (m && metric(m->body, "keel_inference_pending_request_count", "held") == kClients) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server.terminate(), 0);
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kClients);
  EXPECT_EQ(failed.load(), 0);
  // Not accepting any more.
  EXPECT_FALSE(httplib::Client("127.0.0.1", server.port).Get("/v2/health/live"));
  fs::remove_all(repo);
}

}  // namespace

// Every run of a served model happens on its instance's own thread, whichever HTTP thread took the request: oneDNN's
// OpenMP gives every thread that starts parallel work a team of threads for the rest of its life, and once a process
// holds more of them than CPUs GNU OpenMP stops spinning between parallel regions (every region then pays a sleep and
// a wake-up: MobileNetV2 ran at half speed in the server). So requests from many connections, which land on many
// HTTP threads, must leave the server's thread count where the first request left it. Fails when requests run on the
// HTTP threads (each one that runs a request gains an OpenMP thread) or when the build runs on the loading thread.
TEST(ServeThreads, RequestsFromManyConnectionsRunOnTheInstanceThreadAlone) {
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path repo = fs::temp_directory_path() / ("keel_serve_threads_" + std::to_string(getpid()));
  fs::remove_all(repo);
  // A convolution large enough that oneDNN splits it over both threads: x f32 [1, 16, 48, 48] -> [1, 32, 48, 48].
  GraphBuilder g("conv", 17);
  auto x = g.input("x", DType::kF32, {1, 16, 48, 48});
  std::vector<float> w(32 * 16 * 9);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(static_cast<int>(i % 13) - 6);
  g.output(
      g.op1("Conv", {x, g.constant("W", Tensor::f32({32, 16, 3, 3}, w))},
            {{"kernel_shape", keel::Attribute::of_ints({3, 3})}, {"pads", keel::Attribute::of_ints({1, 1, 1, 1})}}));
  auto bytes = keel::serialize_onnx(g.take());
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  write(repo / "conv" / "1" / "model.onnx", bytes.value());
  write(repo / "conv" / "config.toml", "threads = 2\n");
  // Single-threaded instances may run a request on the HTTP thread that took it (no OpenMP team to multiply).
  write(repo / "conv1" / "1" / "model.onnx", bytes.value());
  write(repo / "conv1" / "config.toml", "threads = 1\n");
  ServerProcess server;
  ASSERT_TRUE(server.start(repo, {"--http-threads", "8"})) << server.log;
  const json body{{"inputs", json::array({json{{"name", "x"},
                                               {"datatype", "FP32"},
                                               {"shape", {1, 16, 48, 48}},
                                               {"data", std::vector<float>(16 * 48 * 48, 0.5f)}}})}};
  const std::string text = body.dump();
  auto threads_now = [&] {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/" + std::to_string(server.pid) + "/task")) ++n;
    return n;
  };
  for (const std::string model : {"conv", "conv1"}) {
    auto r = server.client()->Post("/v2/models/" + model + "/infer", text, "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
  }
  const size_t after_first = threads_now();
  // Eight connections one after the other (each on whichever HTTP thread is free), then four at once, per model.
  for (const std::string model : {"conv", "conv1"}) {
    int ok = 0;
    for (int c = 0; c < 8; ++c) {
      auto r = server.client()->Post("/v2/models/" + model + "/infer", text, "application/json");
      ok += r && r->status == 200;
    }
    std::atomic<int> ok_concurrent{0};
    std::vector<std::thread> clients;
    for (int c = 0; c < 4; ++c)
      clients.emplace_back([&] {
        for (int i = 0; i < 3; ++i) {
          auto r = server.client()->Post("/v2/models/" + model + "/infer", text, "application/json");
          ok_concurrent += r && r->status == 200;
        }
      });
    for (auto& t : clients) t.join();
    EXPECT_EQ(ok, 8) << model;
    EXPECT_EQ(ok_concurrent.load(), 12) << model;
  }
  EXPECT_EQ(threads_now(), after_first) << "requests started threads of their own: they ran outside the instance";
  EXPECT_EQ(server.terminate(), 0);
  fs::remove_all(repo);
}
