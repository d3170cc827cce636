#include "core/train/idx.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/train/data.h"

namespace keel::train {
namespace {

std::string idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const std::string& data) {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int b = 3; b >= 0; --b) s += static_cast<char>((d >> (8 * b)) & 0xff);
  return s + data;
}

std::string gzip(const std::string& raw) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, raw.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

TEST(Idx, ParsesU8ImagesRowMajor) {
  std::string data;
  for (int i = 0; i < 2 * 3 * 4; ++i) data += static_cast<char>(i);
  auto t = parse_idx(idx_bytes(0x08, {2, 3, 4}, data), "mem");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->dtype(), DType::kU8);
  EXPECT_EQ(t->shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t->data<uint8_t>()[23], 23);
}

TEST(Idx, ConvertsBigEndianInt32AndFloat) {
  auto t = parse_idx(idx_bytes(0x0C, {2}, std::string("\x00\x00\x01\x02\xff\xff\xff\xfe", 8)), "mem");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->data<int32_t>()[0], 258);
  EXPECT_EQ(t->data<int32_t>()[1], -2);
  auto f = parse_idx(idx_bytes(0x0D, {1}, std::string("\x3f\x80\x00\x00", 4)), "mem");
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->data<float>()[0], 1.0f);
}

TEST(Idx, InflatesStraightIntoTheTensor) {
  // Multi-byte elements swapped to little-endian, as parse_idx does.
  auto t = parse_idx_gzip(gzip(idx_bytes(0x0C, {2}, std::string("\x00\x00\x01\x02\xff\xff\xff\xfe", 8))), "gz");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  EXPECT_EQ(t->data<int32_t>()[0], 258);
  EXPECT_EQ(t->data<int32_t>()[1], -2);
  auto expect_error = [](const std::string& raw, const std::string& needle) {
    auto r = parse_idx_gzip(gzip(raw), "f.idx.gz");
    ASSERT_FALSE(r.is_ok()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("f.idx.gz"), std::string::npos);
  };
  expect_error(idx_bytes(0x08, {3, 2}, "12345"), "truncated IDX data");
  expect_error(idx_bytes(0x08, {2}, "123"), "1 unexpected bytes");
  expect_error(idx_bytes(0x08, {2, 3, 4}, "").substr(0, 9), "truncated IDX header");
  expect_error(idx_bytes(0x07, {1}, "x"), "unknown IDX element type 0x7");
  expect_error("ab", "not an IDX file");
  // A header that claims far more than the compressed bytes can hold: an error, before anything is allocated.
  expect_error(idx_bytes(0x08, {100000, 1000}, "x"), "truncated IDX data");
  auto not_gz = parse_idx_gzip("plain bytes, not compressed", "p.gz");
  ASSERT_FALSE(not_gz.is_ok());
  EXPECT_NE(not_gz.status().message().find("corrupt gzip stream"), std::string::npos) << not_gz.status().message();
}

TEST(Idx, RejectsMalformedHeadersWithClearErrors) {
  auto expect_error = [](const std::string& bytes, const std::string& needle) {
    auto t = parse_idx(bytes, "f.idx");
    ASSERT_FALSE(t.is_ok()) << needle;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find("f.idx"), std::string::npos);
  };
  expect_error("", "not an IDX file");
  expect_error(std::string("\x01\x00\x08\x01", 4), "magic");
  expect_error(idx_bytes(0x07, {1}, "x"), "unknown IDX element type 0x7");
  expect_error(idx_bytes(0x08, {}, ""), "rank 0");
  expect_error(idx_bytes(0x08, {3, 2}, "12345"), "truncated IDX data");
  expect_error(idx_bytes(0x08, {2}, "123"), "unexpected bytes");
  expect_error(idx_bytes(0x08, {2, 3, 4}, "").substr(0, 9), "truncated IDX header");
  expect_error(idx_bytes(0x0E, {0xffffffffu, 0xffffffffu}, ""), "exceed");
}

// Fuzz-style: every truncation and many random corruptions of a valid file (plain and gzip) give an error or a
// well-formed tensor, never a crash.
TEST(Idx, SurvivesTruncationAndRandomCorruption) {
  std::string data;
  for (int i = 0; i < 5 * 7 * 3; ++i) data += static_cast<char>(i * 7);
  const std::string good = idx_bytes(0x08, {5, 7, 3}, data);
  const std::string gz = gzip(good);
  for (size_t n = 0; n < good.size(); ++n) EXPECT_FALSE(parse_idx(good.substr(0, n), "t").is_ok()) << n;
  for (size_t n = 0; n < gz.size(); ++n) {
    auto r = gunzip(gz.substr(0, n), "t");
    if (r.is_ok()) {
      EXPECT_FALSE(parse_idx(*r, "t").is_ok()) << n;  // a prefix never inflates to the full file
    }
    EXPECT_FALSE(parse_idx_gzip(gz.substr(0, n), "t").is_ok()) << n;
  }
  auto whole = parse_idx_gzip(gz, "t");
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  ASSERT_EQ(whole->shape(), (Shape{5, 7, 3}));
  EXPECT_EQ(std::string(static_cast<const char*>(whole->raw_data()), data.size()), data);
  std::mt19937 rng(1);
  int ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string b = iter % 2 ? good : gz;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<char>(rng());
    StatusOr<Tensor> t = Status(StatusCode::kInvalidArgument, "-");
    if (iter % 2) {
      t = parse_idx(b, "fuzz");
    } else {
      auto raw = gunzip(b, "fuzz");
      if (raw.is_ok()) t = parse_idx(*raw, "fuzz");
      // Inflating straight into the tensor accepts exactly what inflating then parsing does, with the same elements.
      auto direct = parse_idx_gzip(b, "fuzz");
      EXPECT_EQ(direct.is_ok(), t.is_ok()) << iter << ": " << direct.status().to_string();
      if (direct.is_ok() && t.is_ok()) {
        EXPECT_EQ(direct->shape(), t->shape());
        EXPECT_EQ(direct->dtype(), t->dtype());
        EXPECT_EQ(std::memcmp(direct->raw_data(), t->raw_data(), t->byte_size()), 0);
      } else if (!direct.is_ok()) {
        EXPECT_NE(direct.status().message().find("fuzz"), std::string::npos);
      }
    }
    if (t.is_ok()) {
      ++ok;
      EXPECT_LE(t->byte_size(), b.size() + 1000000);
    } else {
      EXPECT_FALSE(t.status().message().empty());
    }
  }
  EXPECT_GT(ok, 0);  // element bytes flipped: still valid files
}

TEST(Idx, ReadsGzipFilesAndNamesMissingOnes) {
  auto dir = std::filesystem::temp_directory_path() / ("keel_idx_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string images;
  for (int i = 0; i < 3 * 28 * 28; ++i) images += static_cast<char>(i % 256);
  {
    std::ofstream(dir / "train-images-idx3-ubyte.gz", std::ios::binary) << gzip(idx_bytes(0x08, {3, 28, 28}, images));
    std::ofstream(dir / "train-labels-idx1-ubyte.gz", std::ios::binary)
        << gzip(idx_bytes(0x08, {3}, std::string("\x01\x09\x00", 3)));
    std::ofstream(dir / "t10k-images-idx3-ubyte.gz", std::ios::binary) << gzip(idx_bytes(0x08, {3, 28, 28}, images));
    std::ofstream(dir / "t10k-labels-idx1-ubyte.gz", std::ios::binary)
        << gzip(idx_bytes(0x08, {2}, std::string("\x01\x09", 2)));
  }
  auto ds = FashionMnist::load(dir, FashionMnist::Split::kTrain);
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ((*ds)->size(), 3);
  auto b = (*ds)->get_batch({2, 0});
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->data.shape(), (Shape{2, 1, 28, 28}));
  EXPECT_NEAR(b->data.data<float>()[1],
              (static_cast<float>((2 * 784 + 1) % 256) / 255.f - FashionMnist::kMean) / FashionMnist::kStd, 1e-6);
  EXPECT_EQ(b->target.data<int64_t>()[0], 0);
  EXPECT_EQ(b->target.data<int64_t>()[1], 1);
  auto bad = FashionMnist::load(dir, FashionMnist::Split::kTest);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("3 images but 2 labels"), std::string::npos) << bad.status().message();
  auto missing = FashionMnist::load(dir / "nowhere", FashionMnist::Split::kTrain);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("dataset-fashion-mnist"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Idx, ReadsDebiansFashionMnist) {
  if (!std::filesystem::exists(FashionMnist::kDefaultDir)) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  auto test = FashionMnist::load(FashionMnist::kDefaultDir, FashionMnist::Split::kTest);
  ASSERT_TRUE(test.is_ok()) << test.status().to_string();
  EXPECT_EQ((*test)->images().shape(), (Shape{10000, 28, 28}));
  int64_t hist[10] = {};
  for (int64_t i = 0; i < 10000; ++i) ++hist[(*test)->labels().data<uint8_t>()[i]];
  for (int64_t h : hist) EXPECT_EQ(h, 1000);  // the test split is balanced
}

}  // namespace
}  // namespace keel::train
