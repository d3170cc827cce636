// Run records: SHA-256 against FIPS 180-4's test vectors, data-file descriptions, histograms, save/load.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>

#include <keel/keel.h>

#include "core/train/run_record.h"

namespace keel::train {
namespace {

std::filesystem::path temp_dir() {
  auto d = std::filesystem::temp_directory_path() / ("keel_run_record_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(d);
  return d;
}

TEST(RunRecord, Sha256KnownAnswers) {
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks =
      "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  // 56 bytes: padding spills
  EXPECT_EQ(sha256_hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(sha256_hex(million.data(), million.size()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(RunRecord, DescribesDataFiles) {
  const auto d = temp_dir() / "data";
  std::filesystem::create_directories(d);
  std::ofstream(d / "b.bin") << "abc";
  std::ofstream(d / "a.bin") << "";
  auto files = describe_data_files(d);
  ASSERT_TRUE(files.is_ok()) << files.status().to_string();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0]["name"], "a.bin");
  EXPECT_EQ((*files)[1]["bytes"], 3);
  EXPECT_EQ((*files)[1]["sha256"], "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  auto one = describe_data_files(d / "b.bin");
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(one->size(), 1u);
  auto missing = describe_data_files(d / "nope");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
  std::filesystem::remove_all(d.parent_path());
}

TEST(RunRecord, Histogram) {
  auto t = eager::from_vector(std::vector<float>{0.f, 1.f, 2.f, 3.f, 4.f, 4.f, INFINITY}, {7});
  Histogram h = histogram(t, 4);
  EXPECT_EQ(h.lo, 0);
  EXPECT_EQ(h.hi, 4);
  EXPECT_EQ(h.nonfinite, 1);
  EXPECT_EQ(h.counts, (std::vector<int64_t>{1, 1, 1, 3}));  // the top edge falls into the last bin
  EXPECT_NEAR(h.mean, 14.0 / 6, 1e-9);
  Histogram flat = histogram(eager::full({3}, 2.f), 5);
  EXPECT_EQ(flat.counts[0], 3);

  nn::Linear fc(3, 2);
  auto params = module_histograms(fc, false, 8);
  ASSERT_TRUE(params.contains("weight") && params.contains("bias"));
  EXPECT_EQ(params["weight"]["counts"].size(), 8u);
  EXPECT_TRUE(module_histograms(fc, true).empty()) << "no gradients yet";
  eager::sum(fc(eager::ones({4, 3}))).backward();
  auto grads = module_histograms(fc, true, 8);
  ASSERT_TRUE(grads.contains("weight"));
  EXPECT_NEAR(grads["bias"]["mean"].get<double>(), 4.0, 1e-6);
}

TEST(RunRecord, SaveLoadAndErrors) {
  const auto d = temp_dir();
  RunRecord r;
  EXPECT_EQ(r.json()["keel"]["version"], KEEL_VERSION_STRING);
  EXPECT_FALSE(r.json()["keel"]["source_revision"].get<std::string>().empty());
  r.json()["hyperparameters"] = {{"lr", 0.01}};
  r.add_epoch({{"epoch", 1}, {"test_accuracy", 0.5}});
  r.finish({{"test_accuracy", 0.5}});
  ASSERT_TRUE(r.save(d / "run.json").is_ok());
  auto back = RunRecord::load(d / "run.json");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->json()["status"], "completed");
  EXPECT_EQ(back->json()["epochs"].size(), 1u);
  EXPECT_LE(back->json()["start_time"].get<std::string>(), back->json()["end_time"].get<std::string>());
  std::ofstream(d / "bad.json") << "[1, 2]";
  EXPECT_EQ(RunRecord::load(d / "bad.json").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RunRecord::load(d / "missing.json").status().code(), StatusCode::kNotFound);
  // A missing folder is created; a folder that cannot be (its parent is a file) is an error.
  EXPECT_TRUE(r.save(d / "new_dir" / "run.json").is_ok());
  EXPECT_TRUE(std::filesystem::is_regular_file(d / "new_dir" / "run.json"));
  EXPECT_FALSE(r.save(d / "bad.json" / "run.json").is_ok());
  std::filesystem::remove_all(d);
}

}  // namespace
}  // namespace keel::train
