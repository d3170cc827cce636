#include "core/train/scalar_log.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

namespace keel::train {

StatusOr<std::unique_ptr<ScalarLogger>> ScalarLogger::open(const std::filesystem::path& file, bool append) {
  if (file.has_parent_path()) {  // a run's own folder (runs/kd/log.jsonl) is created here
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
  }
  std::FILE* f = std::fopen(file.c_str(), append ? "a" : "w");
  if (!f) return unavailable(file.string() + ": cannot open the scalar log for writing");
  return std::unique_ptr<ScalarLogger>(new ScalarLogger(f));
}

ScalarLogger::~ScalarLogger() {
  if (f_) std::fclose(f_);
}

Status ScalarLogger::write(const std::string& kind, nlohmann::json record) {
  if (!record.is_object()) return invalid_argument("scalar log: a record must be a JSON object");
  nlohmann::json line = {{"kind", kind}};
  line.update(record);
  // Non-finite numbers are not JSON: write them as null (the plot skips them).
  for (auto& [k, v] : line.items())
    if (v.is_number_float() && !std::isfinite(v.get<double>())) v = nullptr;
  const std::string s = line.dump() + "\n";
  std::lock_guard<std::mutex> lk(mu_);
  if (std::fwrite(s.data(), 1, s.size(), f_) != s.size() || std::fflush(f_) != 0)
    return unavailable("scalar log: write failed");
  return Status::ok();
}

ParsedLog parse_scalar_log(const std::string& text) {
  ParsedLog out;
  std::map<std::pair<std::string, std::string>, size_t> index;
  std::istringstream in(text);
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ++out.skipped_lines;
      continue;
    }
    ++out.records;
    const std::string kind = j.contains("kind") && j["kind"].is_string() ? j["kind"].get<std::string>() : "record";
    std::string x_name = "line";
    double x = static_cast<double>(lineno);
    if (j.contains("step") && j["step"].is_number()) {
      x_name = "step";
      x = j["step"].get<double>();
    } else if (j.contains("epoch") && j["epoch"].is_number()) {
      x_name = "epoch";
      x = j["epoch"].get<double>();
    }
    for (const auto& [k, v] : j.items()) {
      if (k == "kind" || k == "step" || k == "epoch" || !v.is_number()) continue;
      const double y = v.get<double>();
      if (!std::isfinite(y)) continue;
      auto key = std::make_pair(kind, k);
      auto it = index.find(key);
      if (it == index.end()) {
        it = index.emplace(key, out.series.size()).first;
        out.series.push_back(ScalarSeries{kind, k, x_name, {}});
      }
      out.series[it->second].points.emplace_back(x, y);
    }
  }
  return out;
}

StatusOr<ParsedLog> read_scalar_log(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return not_found(file.string() + ": cannot open the scalar log");
  std::stringstream ss;
  ss << in.rdbuf();
  ParsedLog log = parse_scalar_log(ss.str());
  if (log.records == 0)
    return invalid_argument(file.string() + ": no JSON records (" + std::to_string(log.skipped_lines) +
                            " unreadable lines)");
  return log;
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string plot_number(double v) {
  std::ostringstream s;
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e5 || a < 1e-3)) s.precision(2), s << std::scientific << v;
  else s.precision(a >= 100 ? 0 : (a >= 1 ? 2 : 4)), s << std::fixed << v;
  return s.str();
}

namespace {

const auto& esc = html_escape;
const auto& num = plot_number;

// "Nice" tick values covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int target = 5) {
  std::vector<double> t;
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return t;
}

}  // namespace

std::string render_curves_svg(const ParsedLog& log, const std::string& title, int columns) {
  columns = std::max(1, columns);
  const int pw = 460, ph = 260, ml = 62, mr = 16, mt = 34, mb = 40, head = 40;
  const int n = static_cast<int>(log.series.size());
  const int rows = std::max(1, (n + columns - 1) / columns);
  const int width = pw * std::min(columns, std::max(n, 1)), height = head + ph * rows;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height << "\" viewBox=\"0 0 "
    << width << " " << height << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s << "<text x=\"12\" y=\"26\" font-size=\"16\" font-weight=\"bold\">" << esc(title) << "</text>\n";
  if (n == 0) s << "<text x=\"12\" y=\"60\">no numeric scalars in the log</text>\n";
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
  for (int i = 0; i < n; ++i) {
    const ScalarSeries& se = log.series[static_cast<size_t>(i)];
    const int ox = (i % columns) * pw, oy = head + (i / columns) * ph;
    const int x0 = ox + ml, x1 = ox + pw - mr, y0 = oy + mt, y1 = oy + ph - mb;
    double xmin = 1e300, xmax = -1e300, ymin = 1e300, ymax = -1e300;
    for (const auto& [x, y] : se.points) {
      xmin = std::min(xmin, x), xmax = std::max(xmax, x), ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
    if (xmax == xmin) xmin -= 1, xmax += 1;
    if (ymax == ymin) {
      const double pad = ymin == 0 ? 1 : std::fabs(ymin) * 0.05;
      ymin -= pad, ymax += pad;
    } else {
      const double pad = (ymax - ymin) * 0.05;
      ymin -= pad, ymax += pad;
    }
    auto px = [&](double x) { return x0 + (x - xmin) / (xmax - xmin) * (x1 - x0); };
    auto py = [&](double y) { return y1 - (y - ymin) / (ymax - ymin) * (y1 - y0); };
    s << "<g>\n<text x=\"" << x0 << "\" y=\"" << oy + 20 << "\" font-size=\"13\" font-weight=\"bold\">" << esc(se.name)
      << " <tspan font-weight=\"normal\" fill=\"#666\">(" << esc(se.kind) << ", last " << num(se.points.back().second)
      << ")</tspan></text>\n";
    s << "<rect x=\"" << x0 << "\" y=\"" << y0 << "\" width=\"" << x1 - x0 << "\" height=\"" << y1 - y0
      << "\" fill=\"none\" stroke=\"#999\"/>\n";
    for (double t : ticks(ymin, ymax)) {
      s << "<line x1=\"" << x0 << "\" x2=\"" << x1 << "\" y1=\"" << py(t) << "\" y2=\"" << py(t)
        << "\" stroke=\"#eee\"/>"
        << "<text x=\"" << x0 - 4 << "\" y=\"" << py(t) + 4 << "\" text-anchor=\"end\">" << num(t) << "</text>\n";
    }
    for (double t : ticks(xmin, xmax)) {
      s << "<line x1=\"" << px(t) << "\" x2=\"" << px(t) << "\" y1=\"" << y1 << "\" y2=\"" << y1 + 4
        << "\" stroke=\"#999\"/>"
        << "<text x=\"" << px(t) << "\" y=\"" << y1 + 16 << "\" text-anchor=\"middle\">" << num(t) << "</text>\n";
    }
    s << "<text x=\"" << (x0 + x1) / 2 << "\" y=\"" << y1 + 32 << "\" text-anchor=\"middle\" fill=\"#666\">"
      << esc(se.x_name) << "</text>\n";
    const char* color = colors[static_cast<size_t>(i) % 6];
    if (se.points.size() == 1) {
      s << "<circle cx=\"" << px(se.points[0].first) << "\" cy=\"" << py(se.points[0].second) << "\" r=\"3\" fill=\""
        << color << "\"/>\n";
    } else {
      s << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
      for (const auto& [x, y] : se.points) s << px(x) << "," << py(y) << " ";
      s << "\"/>\n";
    }
    s << "</g>\n";
  }
  s << "</svg>\n";
  return s.str();
}

std::string render_curves_html(const ParsedLog& log, const std::string& title, int columns) {
  return "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + esc(title) +
         "</title></head>\n<body style=\"margin:0\">\n" + render_curves_svg(log, title, columns) + "</body></html>\n";
}

}  // namespace keel::train
