// The fast path for large JSON tensors (tools/serve/tensor_json.h): which `"data"` arrays lift_data_arrays takes out
// of a request (only numbers, true/false and nested arrays, in JSON's array grammar), the tokens it keeps, and the
// text it leaves for the general parser; fill_tensor_from_tokens' conversions and refusals.
#include "tools/serve/tensor_json.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace keel::serve {
namespace {

std::vector<std::string> tokens_of(const LiftedData& l, size_t k) {
  std::vector<std::string> out;
  for (auto t : l.arrays.at(k)) out.emplace_back(t);
  return out;
}

constexpr int kDepth = 64;  // the server's default max_json_depth

TEST(TensorJson, LiftsPlainNumericArraysFlatOrNestedWithTheirTokens) {
  const LiftedData l = lift_data_arrays(
      R"({"inputs": [{"name": "a", "data": [1, -2.5e3 ,	3]}, {"name": "b", "data" : [[true, false], [0, 1]]}]})",
      kDepth);
  ASSERT_EQ(l.arrays.size(), 2u);
  EXPECT_EQ(tokens_of(l, 0), (std::vector<std::string>{"1", "-2.5e3", "3"}));
  EXPECT_EQ(tokens_of(l, 1), (std::vector<std::string>{"true", "false", "0", "1"}));
  const nlohmann::json j = nlohmann::json::parse(l.text);
  EXPECT_EQ(lifted_index(j["inputs"][0]["data"]), 0);
  EXPECT_EQ(lifted_index(j["inputs"][1]["data"]), 1);
  EXPECT_EQ(j["inputs"][1]["name"], "b");
}

TEST(TensorJson, LeavesEveryArrayOutsideTheGrammarToTheGeneralParser) {
  for (const std::string bad : {"[1,,2]", "[1 2]", "[,1]", "[1,]", "[1, \"x\"]", "[null]", "[{\"a\": 1}]", "[[1], 2",
                                "[1, [2,]]", "{\"k\": 1}", "\"text\""}) {
    const std::string body = R"({"inputs": [{"name": "a", "data": )" + bad + "}]}";
    const LiftedData l = lift_data_arrays(body, kDepth);
    EXPECT_TRUE(l.arrays.empty()) << bad;
    EXPECT_EQ(l.text, body) << bad;
  }
  // A well-formed array followed by a stray bracket is lifted; what is left is still not JSON, and the parser says so.
  const LiftedData stray = lift_data_arrays(R"({"data": [1]]})", kDepth);
  EXPECT_FALSE(nlohmann::json::accept(stray.text)) << stray.text;
  // "data" inside a string, or as a value rather than a key, is not a tensor's data.
  const std::string quoted = R"({"id": "\"data\": [1, 2]", "x": ["data", [3]]})";
  const LiftedData q = lift_data_arrays(quoted, kDepth);
  EXPECT_TRUE(q.arrays.empty());
  EXPECT_EQ(q.text, quoted);
  const LiftedData empty = lift_data_arrays(R"({"data": []})", kDepth);
  ASSERT_EQ(empty.arrays.size(), 1u);
  EXPECT_TRUE(empty.arrays[0].empty());
}

// The server checks the depth of the lifted text only: an array that would take the document past the limit must stay
// in it. The document is {"inputs": [{"data": ...}]} (3 levels), so 4 levels of array reach 7.
TEST(TensorJson, AnArrayThatWouldPassTheDepthLimitStaysInTheText) {
  const std::string body = R"({"inputs": [{"data": [[[[1]]]]}]})";
  const LiftedData fits = lift_data_arrays(body, 7);
  ASSERT_EQ(fits.arrays.size(), 1u);
  EXPECT_EQ(tokens_of(fits, 0), (std::vector<std::string>{"1"}));
  const LiftedData deep = lift_data_arrays(body, 6);
  EXPECT_TRUE(deep.arrays.empty());
  EXPECT_EQ(deep.text, body);
}

TEST(TensorJson, TokensBecomeValuesOfTheDtypeOrAreRefused) {
  Tensor f = Tensor::f32({3}, {0, 0, 0});
  const LiftedData l = lift_data_arrays(R"({"data": [0.5, -1e-3, 7]})", kDepth);
  ASSERT_TRUE(fill_tensor_from_tokens(l.arrays[0], f));
  EXPECT_EQ(std::vector<float>(f.data<float>(), f.data<float>() + 3), (std::vector<float>{0.5f, -1e-3f, 7.f}));

  Tensor i = Tensor::from_vector<int64_t>(DType::kI64, {1}, {0});
  for (const char* bad : {"1.5", "1e3", "true", "99999999999999999999", "+1"}) {
    const std::string body = std::string(R"({"data": [)") + bad + "]}";  // the tokens are views into it
    const LiftedData b = lift_data_arrays(body, kDepth);
    ASSERT_EQ(b.arrays.size(), 1u) << bad;
    EXPECT_FALSE(fill_tensor_from_tokens(b.arrays[0], i)) << bad;
  }
  Tensor u8 = Tensor::from_vector<uint8_t>(DType::kU8, {1}, {0});
  const LiftedData big = lift_data_arrays(R"({"data": [300]})", kDepth);
  EXPECT_FALSE(fill_tensor_from_tokens(big.arrays[0], u8)) << "300 is not a UINT8";
}

}  // namespace
}  // namespace keel::serve
