// config.toml of a served model (tools/serve/model.h): every key, its defaults and its errors; the version policy.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>

#include "tests/common/mutate.h"
#include "tools/serve/model.h"

namespace {

using keel::serve::ModelConfig;
using keel::serve::parse_model_config_text;
using keel::serve::VersionPolicy;

// Every key set (the valid input the mutation test starts from).
const char* const kFullConfig = R"(
max_batch_size = 32
max_queue_delay_us = 500
preferred_batch_sizes = [16, 8]
warmup_batch_sizes = [1, 8]
max_queue_size = 100
default_timeout_us = 250000
dynamic_batch = true
instances = 2
threads = 1
passes = ["fuse_conv_bn", "fold_constants:max_bytes=1024"]
precision = "bf16"
device = "cpu"
[version_policy]
specific = [1, 3]
)";

TEST(ServeConfig, DefaultsAndEveryKey) {
  auto empty = parse_model_config_text("", "empty.toml");
  ASSERT_TRUE(empty.is_ok()) << empty.status().to_string();
  EXPECT_EQ(empty->max_batch_size, 0);
  EXPECT_EQ(empty->instances, 1);
  EXPECT_FALSE(empty->passes.has_value());  // auto
  EXPECT_EQ(empty->precision, "fp32");
  EXPECT_EQ(empty->version_policy.kind, VersionPolicy::Kind::kLatest);
  EXPECT_EQ(empty->version_policy.latest, 1);
  auto full = parse_model_config_text(kFullConfig, "full.toml");
  ASSERT_TRUE(full.is_ok()) << full.status().to_string();
  EXPECT_EQ(full->max_batch_size, 32);
  EXPECT_EQ(full->max_queue_delay_us, 500);
  EXPECT_EQ(full->preferred_batch_sizes, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(full->max_queue_size, 100);
  EXPECT_EQ(full->default_timeout_us, 250000);
  EXPECT_TRUE(full->dynamic_batch);
  EXPECT_EQ(full->instances, 2);
  EXPECT_EQ(full->threads, 1);
  ASSERT_TRUE(full->passes.has_value());
  EXPECT_EQ(full->passes->size(), 2u);
  EXPECT_EQ(full->precision, "bf16");
  EXPECT_EQ(full->device, "cpu");
  EXPECT_EQ(full->version_policy.kind, VersionPolicy::Kind::kSpecific);
  auto none = parse_model_config_text("passes = \"none\"\n", "none.toml");
  ASSERT_TRUE(none.is_ok());
  ASSERT_TRUE(none->passes.has_value());
  EXPECT_TRUE(none->passes->empty());
}

// Mutated copies of a full config (bytes changed to TOML's punctuation, digits and signs, control bytes and invalid
// UTF-8, spans deleted, lines duplicated, the text cut short): each parses or fails with a message naming the file,
// and what parses keeps every documented bound. The seed is printed; a failing case reruns with
// KEEL_CONFIG_FUZZ_SEED.
TEST(ServeConfig, MutatedConfigsParseWithinBoundsOrNameTheFile) {
  const char* env_seed = std::getenv("KEEL_CONFIG_FUZZ_SEED");
  const uint32_t seed = env_seed ? static_cast<uint32_t>(std::strtoul(env_seed, nullptr, 10)) : 20261204u;
  std::mt19937 rng(seed);
  const std::string alphabet = "[]{}=\"'#.,\n\t\\ 0123456789-+_eEx:\x01\x7f\xc3\xff";
  constexpr int kCases = 3000;
  int ok = 0;
  for (int c = 0; c < kCases; ++c) {
    const std::string m = keel::testing_util::mutated(kFullConfig, rng, alphabet);
    auto r = parse_model_config_text(m, "fuzz.toml");
    if (!r.is_ok()) {
      EXPECT_NE(r.status().message().find("fuzz.toml"), std::string::npos)
          << "seed " << seed << " case " << c << ": " << r.status().to_string();
      continue;
    }
    ++ok;
    const ModelConfig& k = *r;
    EXPECT_GE(k.max_batch_size, 0) << "seed " << seed << " case " << c;
    EXPECT_GE(k.instances, 1) << "seed " << seed << " case " << c;
    EXPECT_GE(k.threads, 0) << "seed " << seed << " case " << c;
    EXPECT_GE(k.max_queue_delay_us, 0) << "seed " << seed << " case " << c;
    for (int64_t b : k.preferred_batch_sizes)
      EXPECT_TRUE(b >= 1 && b <= k.max_batch_size) << "seed " << seed << " case " << c << ": preferred " << b;
    if (k.dynamic_batch) {
      EXPECT_GT(k.max_batch_size, 0) << "seed " << seed << " case " << c;
    }
    EXPECT_TRUE(k.precision == "fp32" || k.precision == "fp16" || k.precision == "bf16") << k.precision;
  }
  std::printf("%d mutated configs (seed %u): %d parsed within bounds, %d refused naming the file\n", kCases, seed, ok,
              kCases - ok);
  EXPECT_GT(kCases - ok, kCases / 4);
}

TEST(ServeConfig, ErrorsNameTheFileAndTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"max_bach_size = 4", "unknown key `max_bach_size`"},
      {"max_batch_size = -1", "`max_batch_size` must be an integer"},
      {"max_batch_size = \"8\"", "`max_batch_size` must be an integer"},
      {"instances = 0", "`instances`"},
      {"max_batch_size = 4\npreferred_batch_sizes = [8]", "exceeds max_batch_size 4"},
      {"preferred_batch_sizes = [2]", "needs max_batch_size > 0"},
      {"max_batch_size = 4\npreferred_batch_sizes = [0]", "preferred_batch_sizes[]"},
      {"dynamic_batch = true", "needs max_batch_size > 0"},
      {"max_batch_size = 4\nwarmup_batch_sizes = [1, 8]", "warmup batch size 8 exceeds max_batch_size 4"},
      {"dynamic_batch = 1", "`dynamic_batch` must be true or false"},
      {"passes = \"fast\"", "`passes` is \"auto\", \"none\" or an array"},
      {"passes = [1]", "`passes` is \"auto\", \"none\" or an array"},
      {"precision = \"int8\"", "`precision` is fp32, fp16 or bf16"},
      {"device = 0", "`device` must be a string"},
      {"version_policy = 2", "`version_policy` is a table"},
      {"[version_policy]\nlatest = 0", "version_policy.latest"},
      {"[version_policy]\nall = false", "`version_policy.all` must be true"},
      {"[version_policy]\nspecific = []", "names no version"},
      {"[version_policy]\nnewest = 1", "unknown key `newest`"},
      {"[version_policy]\nlatest = 1\nall = true", "one key"},
      {"max_batch_size = ", "cfg.toml"},
  };
  for (const auto& [text, expect] : cases) {
    auto c = parse_model_config_text(text, "cfg.toml");
    ASSERT_FALSE(c.is_ok()) << text;
    EXPECT_EQ(c.status().code(), keel::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(c.status().message().find(expect), std::string::npos) << text << " -> " << c.status().message();
    EXPECT_NE(c.status().message().find("cfg.toml"), std::string::npos) << c.status().message();
  }
}

TEST(ServeConfig, VersionPolicySelects) {
  VersionPolicy p;
  EXPECT_EQ(p.select({3, 1, 10, 2}), (std::vector<int64_t>{10}));
  p.latest = 2;
  EXPECT_EQ(p.select({3, 1, 10, 2}), (std::vector<int64_t>{3, 10}));
  p.latest = 9;
  EXPECT_EQ(p.select({3, 1}), (std::vector<int64_t>{1, 3}));
  p.kind = VersionPolicy::Kind::kAll;
  EXPECT_EQ(p.select({2, 1}), (std::vector<int64_t>{1, 2}));
  p.kind = VersionPolicy::Kind::kSpecific;
  p.specific = {1, 7};
  EXPECT_EQ(p.select({1, 2, 3}), (std::vector<int64_t>{1}));
  EXPECT_TRUE(p.select({2, 3}).empty());
}

}  // namespace
