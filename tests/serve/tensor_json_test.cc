// The fast path for large JSON tensors (tools/serve/tensor_json.h): which `"data"` arrays lift_data_arrays takes out
// of a request (only numbers, true/false and nested arrays, in JSON's array grammar), the tokens it keeps, and the
// text it leaves for the general parser; fill_tensor_from_tokens' conversions and refusals.
#include "tools/serve/tensor_json.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
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
  EXPECT_EQ(lifted_index(j["inputs"][0]["data"], l), 0);
  EXPECT_EQ(lifted_index(j["inputs"][1]["data"], l), 1);
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
  for (const char* bad : {"1.5", "1e3", "true", "99999999999999999999"}) {
    const std::string body = std::string(R"({"data": [)") + bad + "]}";  // the tokens are views into it
    const LiftedData b = lift_data_arrays(body, kDepth);
    ASSERT_EQ(b.arrays.size(), 1u) << bad;
    EXPECT_FALSE(fill_tensor_from_tokens(b.arrays[0], i)) << bad;
  }
  Tensor u8 = Tensor::from_vector<uint8_t>(DType::kU8, {1}, {0});
  const LiftedData big = lift_data_arrays(R"({"data": [300]})", kDepth);
  EXPECT_FALSE(fill_tensor_from_tokens(big.arrays[0], u8)) << "300 is not a UINT8";
}

// Numbers JSON does not allow leave their array in the text (the general parser refuses the request, as it would
// without the lifting); a placeholder the request writes itself names nothing.
TEST(TensorJson, NonJsonNumbersAndLookAlikePlaceholdersAreNotLifted) {
  for (const std::string bad : {"01", "1.", ".5", "+1", "1e", "-", "1.5.5", "1e+", "tru", "truee", "--1"}) {
    const std::string body = R"({"data": [1, )" + bad + "]}";
    const LiftedData l = lift_data_arrays(body, kDepth);
    EXPECT_TRUE(l.arrays.empty()) << bad;
    EXPECT_FALSE(nlohmann::json::accept(l.text)) << bad;
  }
  const std::string body = R"({"inputs": [{"data": [1, 2]}, {"data": {"__keel_data__": 0}}]})";
  const LiftedData l = lift_data_arrays(body, kDepth);
  ASSERT_EQ(l.arrays.size(), 1u);
  const nlohmann::json j = nlohmann::json::parse(l.text);
  EXPECT_EQ(lifted_index(j["inputs"][0]["data"], l), 0);
  EXPECT_EQ(lifted_index(j["inputs"][1]["data"], l), -1);
  EXPECT_FALSE(decode_data(j["inputs"][1]["data"], l, DType::kF32, {2}).is_ok());
}

// A differential fuzzer of the two ways a request's `data` is read: lifted (lift_data_arrays, the placeholders
// parsed, decode_data from the kept tokens) and general (the whole body parsed by nlohmann-json, decode_data from
// its leaves). Random KServe v2 requests (every datatype; numbers in every form JSON allows and many it does not;
// nested, ragged and malformed arrays; `data` inside strings, parameters and look-alike placeholders; whitespace),
// half of them mutated bytewise: both paths must accept the same texts, accept the same inputs, and read the same
// values. A failing case prints its body; KEEL_JSON_FUZZ_SEED=N runs other seeds.
class RequestGen {
 public:
  explicit RequestGen(uint64_t seed) : rng_(seed) {}

  std::string request() {
    std::string r = "{" + ws();
    std::vector<std::string> members;
    if (chance(50)) members.push_back("\"id\":" + ws() + string_value());
    if (chance(30)) members.push_back("\"parameters\":" + ws() + "{\"data\":" + ws() + array(0) + "}");
    std::string inputs = "[";
    const int n = 1 + static_cast<int>(uniform(3));
    for (int k = 0; k < n; ++k) inputs += (k ? "," + ws() : "") + input(k);
    members.push_back("\"inputs\":" + ws() + inputs + "]");
    std::shuffle(members.begin(), members.end(), rng_);
    for (size_t k = 0; k < members.size(); ++k) r += (k ? "," + ws() : "") + members[k];
    r += ws() + "}";
    if (chance(50)) mutate(r);
    return r;
  }

 private:
  uint64_t uniform(uint64_t n) { return rng_() % n; }
  bool chance(int pct) { return uniform(100) < static_cast<uint64_t>(pct); }
  std::string ws() {
    static const char* const kSpaces[] = {"", "", "", " ", "\n", "\t ", "\r\n  "};
    return kSpaces[uniform(7)];
  }
  std::string string_value() {
    static const char* const kStrings[] = {R"("x")",         R"("\"data\": [1, 2]")", R"("data")", R"("a\\")",
                                           R"("\u0064ata")", R"("[1, 2]")",           R"("\"")"};
    return kStrings[uniform(7)];
  }
  std::string number() {
    static const char* const kForms[] = {
        "0", "1", "-1", "-0", "7", "127", "128", "-128", "-129", "255", "256", "65535", "65536", "2147483647",
        "2147483648", "-2147483649", "4294967296", "9223372036854775807", "9223372036854775808", "-9223372036854775809",
        "18446744073709551615", "18446744073709551616", "0.5", "-0.0", "1e3", "1E+2", "2e-1", "1.5e-3", "3.4028235e38",
        "3.5e38", "1e-45", "1e-310", "2.5e-324", "1e-400", "1e400", "-1e400", "65504", "65520",
        "123456789012345678901234567890", "true", "false",
        // not JSON
        "01", "1.", ".5", "+1", "1e", "-", "1.5.5", "1e+", "tru", "fals", "truee", "--1", "00", "-01"};
    constexpr uint64_t kCount = sizeof(kForms) / sizeof(kForms[0]);
    if (chance(40)) {  // a random number of a common form
      std::string s = chance(30) ? "-" : "";
      s += std::to_string(uniform(chance(50) ? 300 : 100000));
      if (chance(40)) s += "." + std::to_string(uniform(1000));
      if (chance(20)) s += (chance(50) ? "e" : "E") + std::string(chance(50) ? "-" : "") + std::to_string(uniform(40));
      return s;
    }
    return kForms[uniform(kCount)];
  }
  std::string array(int depth) {
    const int n = static_cast<int>(uniform(5));
    const bool nest = depth < 3 && chance(25);
    std::string a = "[" + ws();
    for (int k = 0; k < n; ++k) {
      if (k) a += chance(3) ? " " : "," + ws();  // sometimes no comma
      a += nest ? array(depth + 1) : number();
    }
    if (n && chance(3)) a += ",";  // a trailing comma
    return a + ws() + "]";
  }
  std::string data() {
    switch (uniform(20)) {
      case 0: return "null";
      case 1: return R"("1, 2")";
      case 2: return R"({"k": 1})";
      case 3: return R"({"__keel_data__": 0})";
      case 4: return number();  // a scalar: one leaf
      case 5: return "[null, 1]";
      default: return array(0);
    }
  }
  std::string input(int k) {
    static const char* const kTypes[] = {"BOOL",  "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                                         "INT32", "INT64", "FP16",   "FP32",   "FP64",   "BF16"};
    const std::string d = data();
    // The shape: the leaves the text seems to hold (numbers and booleans by their first bytes), sometimes one off.
    int64_t leaves = 0;
    for (size_t i = 0; i < d.size(); ++i)
      if ((d[i] == '-' || d[i] == '.' || d[i] == '+' || std::isdigit(static_cast<unsigned char>(d[i])) || d[i] == 't' ||
           d[i] == 'f') &&
          (i == 0 || d[i - 1] == '[' || d[i - 1] == ',' || d[i - 1] == ' ' || d[i - 1] == '\t' || d[i - 1] == '\n'))
        ++leaves;
    if (chance(10)) leaves += chance(50) ? 1 : -1;
    std::vector<std::string> members = {"\"name\":" + ws() + "\"x" + std::to_string(k) + "\"",
                                        "\"datatype\":" + ws() + "\"" + kTypes[uniform(13)] + "\"",
                                        "\"shape\":" + ws() + "[" + std::to_string(std::max<int64_t>(leaves, 0)) + "]",
                                        "\"data\"" + ws() + ":" + ws() + d};
    if (chance(20)) members.push_back("\"parameters\": {\"data\": [1]}");
    std::shuffle(members.begin(), members.end(), rng_);
    std::string r = "{";
    for (size_t i = 0; i < members.size(); ++i) r += (i ? "," + ws() : "") + members[i];
    return r + "}";
  }
  void mutate(std::string& r) {
    static const std::string kAlphabet = "[]{},:\"\\ 0123456789-+.eEtrufalsn";
    const int edits = 1 + static_cast<int>(uniform(3));
    for (int e = 0; e < edits && !r.empty(); ++e) {
      const size_t at = uniform(r.size());
      switch (uniform(5)) {
        case 0: r[at] = kAlphabet[uniform(kAlphabet.size())]; break;
        case 1: r[at] = static_cast<char>(uniform(256)); break;
        case 2: r.erase(at, 1 + uniform(4)); break;
        case 3: r.insert(at, r.substr(at, std::min<size_t>(12, r.size() - at))); break;
        default: r.insert(at, chance(50) ? "\"data\": [" : ", 1"); break;
      }
    }
  }

  std::mt19937_64 rng_;
};

std::optional<nlohmann::json> parse(const std::string& text) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) {
    switch (t.dtype()) {
      case DType::kBool: v.push_back(t.data<bool>()[i]); break;
      case DType::kU8: v.push_back(t.data<uint8_t>()[i]); break;
      case DType::kU16: v.push_back(t.data<uint16_t>()[i]); break;
      case DType::kU32: v.push_back(t.data<uint32_t>()[i]); break;
      case DType::kU64: v.push_back(static_cast<double>(t.data<uint64_t>()[i])); break;
      case DType::kI8: v.push_back(t.data<int8_t>()[i]); break;
      case DType::kI16: v.push_back(t.data<int16_t>()[i]); break;
      case DType::kI32: v.push_back(t.data<int32_t>()[i]); break;
      case DType::kI64: v.push_back(static_cast<double>(t.data<int64_t>()[i])); break;
      case DType::kF16: v.push_back(f16_to_f32(t.data<uint16_t>()[i])); break;
      case DType::kBF16: v.push_back(bf16_to_f32(t.data<uint16_t>()[i])); break;
      case DType::kF32: v.push_back(t.data<float>()[i]); break;
      default: v.push_back(t.data<double>()[i]); break;
    }
  }
  return v;
}

TEST(TensorJson, LiftedAndGeneralPathsAgreeOnRandomRequests) {
  const char* env_seed = std::getenv("KEEL_JSON_FUZZ_SEED");
  const uint64_t seed = env_seed ? std::stoull(env_seed) : 20261206u;
  RequestGen gen(seed);
  constexpr int kCases = 20000;
  int parsed = 0, inputs_read = 0, inputs_refused = 0;
  for (int c = 0; c < kCases; ++c) {
    const std::string body = gen.request();
    const LiftedData lifted = lift_data_arrays(body, kDepth);
    LiftedData none;
    none.text = body;
    const std::optional<nlohmann::json> a = parse(lifted.text), b = parse(body);
    ASSERT_EQ(a.has_value(), b.has_value()) << "case " << c << " (seed " << seed << "): " << body;
    if (!b) continue;
    ++parsed;
    if (!b->is_object() || !b->contains("inputs") || !(*b)["inputs"].is_array()) continue;
    const nlohmann::json& ins_b = (*b)["inputs"];
    const nlohmann::json& ins_a = (*a)["inputs"];
    ASSERT_EQ(ins_a.size(), ins_b.size()) << body;
    for (size_t k = 0; k < ins_b.size(); ++k) {
      const nlohmann::json& in = ins_b[k];
      if (!in.is_object() || !in.contains("data") || !in.contains("datatype") || !in["datatype"].is_string() ||
          !in.contains("shape") || !in["shape"].is_array() || in["shape"].size() != 1 ||
          !in["shape"][0].is_number_unsigned() || in["shape"][0].get<uint64_t>() > 4096)
        continue;
      const auto dtype = from_kserve_name(in["datatype"].get<std::string>());
      if (!dtype) continue;
      const Shape shape{static_cast<int64_t>(in["shape"][0].get<uint64_t>())};
      const auto ta = decode_data(ins_a[k]["data"], lifted, *dtype, shape);
      const auto tb = decode_data(in["data"], none, *dtype, shape);
      ASSERT_EQ(ta.is_ok(), tb.is_ok()) << "case " << c << " (seed " << seed << ") input " << k << ": "
                                        << (ta.is_ok() ? tb.status() : ta.status()).to_string() << "\n"
                                        << body;
      if (!tb.is_ok()) {
        ++inputs_refused;
        continue;
      }
      ++inputs_read;
      // Compared as numbers: -0 may be +0 on one side (nlohmann-json reads "-0" as the integer 0).
      ASSERT_EQ(values(ta.value()), values(tb.value()))
          << "case " << c << " (seed " << seed << ") input " << k << ": " << body;
    }
  }
  std::printf("%d random requests (seed %llu): %d parsed, %d inputs read alike, %d refused alike\n", kCases,
              static_cast<unsigned long long>(seed), parsed, inputs_read, inputs_refused);
  EXPECT_GT(inputs_read, kCases / 10);  // the generator reaches the conversions, not only the parse errors
  EXPECT_GT(inputs_refused, kCases / 20);
}

}  // namespace
}  // namespace keel::serve
