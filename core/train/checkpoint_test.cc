#include "core/train/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

namespace keel::train {
namespace {

SafeTensors sample() {
  SafeTensors st;
  st.tensors.emplace_back("b.weight", Tensor::f32({2, 3}, {1, 2, 3, 4, 5, 6}));
  st.tensors.emplace_back("a.count", Tensor::from_vector(DType::kI64, {}, std::vector<int64_t>{42}));
  st.tensors.emplace_back("empty", Tensor::host(DType::kF32, {0, 4}).value());
  st.metadata["note"] = "hello";
  return st;
}

TEST(SafeTensors, RoundTripsInFileOrderWithTheStandardLayout) {
  auto bytes = serialize_safetensors(sample());
  ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  // 8-byte little-endian header length, a JSON header padded to 8 bytes, then the data.
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>((*bytes)[static_cast<size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  auto header = nlohmann::json::parse(bytes->substr(8, n));
  EXPECT_EQ(header["b.weight"]["dtype"], "F32");
  EXPECT_EQ(header["b.weight"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["a.count"]["data_offsets"], nlohmann::json({24, 32}));
  EXPECT_EQ(header["__metadata__"]["note"], "hello");
  EXPECT_EQ(bytes->size(), 8 + n + 32);
  auto back = parse_safetensors(*bytes, "mem");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  ASSERT_EQ(back->tensors.size(), 3u);
  EXPECT_EQ(back->tensors[0].first, "b.weight");
  EXPECT_EQ(back->tensors[0].second.data<float>()[5], 6.f);
  EXPECT_EQ(back->tensors[1].second.data<int64_t>()[0], 42);
  EXPECT_EQ(back->tensors[2].second.shape(), (Shape{0, 4}));
  EXPECT_EQ(back->metadata.at("note"), "hello");
}

TEST(SafeTensors, RejectsMalformedFilesWithClearErrors) {
  auto expect_error = [](const std::string& bytes, const std::string& needle) {
    auto r = parse_safetensors(bytes, "x.safetensors");
    ASSERT_FALSE(r.is_ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  auto make = [](const std::string& header, const std::string& data) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return s + header + data;
  };
  expect_error("abc", "shorter than");
  expect_error(std::string("\xff\x00\x00\x00\x00\x00\x00\x00{}", 10), "runs past the end");
  expect_error(make("{not json", ""), "not JSON");
  expect_error(make("[1]", ""), "not a JSON object");
  expect_error(make(R"({"t":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}})", "x"), "unsupported dtype Q8");
  expect_error(make(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcd"), "needs 8 bytes");
  expect_error(make(R"({"t":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", "ab"), "outside the 2 data bytes");
  expect_error(make(R"({"t":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", "abcd"), "a hole");
  expect_error(
      make(
          R"({"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"u":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
          "abc"),
      "overlaps");
  expect_error(make(R"({"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "abcd"), "2 bytes after");
  expect_error(make(R"({"t":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", "ab"), "negative");
  expect_error(make(R"({"__metadata__":{"k":1}})", ""), "not a string");
  // Random corruption never crashes.
  auto good = serialize_safetensors(sample()).value();
  std::mt19937 rng(5);
  for (int i = 0; i < 2000; ++i) {
    std::string b = good;
    b[rng() % b.size()] = static_cast<char>(rng());
    if (i % 3 == 0) b.resize(rng() % b.size());
    auto r = parse_safetensors(b, "fuzz");
    if (!r.is_ok()) {
      EXPECT_FALSE(r.status().message().empty());
    }
  }
}

TEST(SafeTensors, RefusesDtypesTheFormatCannotHold) {
  SafeTensors st;
  st.tensors.emplace_back("s", Tensor(DType::kString, {1}, nullptr));
  EXPECT_FALSE(serialize_safetensors(st).is_ok());
}

TEST(Checkpoint, SavesComponentsAtomicallyAndNamesMissingOnes) {
  auto file = std::filesystem::temp_directory_path() / ("keel_ckpt_" + std::to_string(::getpid()) + ".safetensors");
  Checkpoint c;
  State s;
  s.tensors.emplace_back("w", eager::Tensor(Tensor::f32({2}, {1.5f, -2.f})));
  s.values = {{"epoch", 3}, {"lr", 0.25}};
  c.put("model", s);
  ASSERT_TRUE(c.save(file).is_ok());
  EXPECT_FALSE(std::filesystem::exists(file.string() + ".tmp"));
  auto back = Checkpoint::load(file);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  const State* m = back->get("model");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->values["epoch"], 3);
  EXPECT_EQ(m->tensor("w")->to_vector<float>(), (std::vector<float>{1.5f, -2.f}));
  auto missing = back->require("optimizer");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("it has: model"), std::string::npos);
  // A plain safetensors file is not a checkpoint.
  ASSERT_TRUE(save_safetensors(file, sample()).is_ok());
  auto plain = Checkpoint::load(file);
  ASSERT_FALSE(plain.is_ok());
  EXPECT_NE(plain.status().message().find("not a Keel checkpoint"), std::string::npos);
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace keel::train
