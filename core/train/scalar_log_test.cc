#include "core/train/scalar_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

namespace keel::train {
namespace {

TEST(ScalarLog, WritesJsonLinesAndParsesThemBack) {
  auto file = std::filesystem::temp_directory_path() / ("keel_scalars_" + std::to_string(::getpid()) + ".jsonl");
  {
    auto log = ScalarLogger::open(file);
    ASSERT_TRUE(log.is_ok());
    for (int s = 1; s <= 3; ++s)
      ASSERT_TRUE((*log)->write("step", {{"step", s}, {"loss", 1.0 / s}, {"lr", 0.01}}).is_ok());
    ASSERT_TRUE((*log)->write("epoch", {{"epoch", 1}, {"test_accuracy", 0.8}, {"bad", std::nan("")}}).is_ok());
    EXPECT_FALSE((*log)->write("step", nlohmann::json::array()).is_ok());
  }
  std::ifstream in(file);
  std::string first;
  std::getline(in, first);
  auto j = nlohmann::json::parse(first);
  EXPECT_EQ(j["kind"], "step");
  EXPECT_EQ(j["step"], 1);
  auto parsed = read_scalar_log(file);
  ASSERT_TRUE(parsed.is_ok());
  EXPECT_EQ(parsed->records, 4);
  ASSERT_EQ(parsed->series.size(), 3u);  // step/loss, step/lr, epoch/test_accuracy (NaN dropped)
  EXPECT_EQ(parsed->series[0].name, "loss");
  EXPECT_EQ(parsed->series[0].points.size(), 3u);
  EXPECT_DOUBLE_EQ(parsed->series[0].points[2].second, 1.0 / 3);
  EXPECT_EQ(parsed->series[2].x_name, "epoch");
  std::filesystem::remove(file);
}

TEST(ScalarLog, SkipsGarbageLinesAndRendersEveryCurve) {
  ParsedLog log = parse_scalar_log(
      "{\"kind\":\"step\",\"step\":1,\"loss\":2.5}\nnot json\n\n{\"kind\":\"step\",\"step\":2,\"loss\":1.5}\n"
      "{\"kind\":\"epoch\",\"epoch\":1,\"accuracy\":0.5}\n");
  EXPECT_EQ(log.records, 3);
  EXPECT_EQ(log.skipped_lines, 1);
  std::string svg = render_curves_svg(log, "run <1>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("run &lt;1&gt;"), std::string::npos);  // escaped
  EXPECT_NE(svg.find("<polyline"), std::string::npos);      // loss: two points
  EXPECT_NE(svg.find("<circle"), std::string::npos);        // accuracy: one point
  EXPECT_NE(svg.find("last 1.50"), std::string::npos);
  std::string html = render_curves_html(log, "t");
  EXPECT_NE(html.find("<!DOCTYPE html>"), std::string::npos);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_FALSE(read_scalar_log("/nonexistent/log.jsonl").is_ok());
}

}  // namespace
}  // namespace keel::train
