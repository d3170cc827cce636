// keel/core/train/run_plot.cc — see run_plot.h.
#include "core/train/run_plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace keel::train {
namespace {

namespace fs = std::filesystem;

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
const char* color(size_t i) { return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))]; }

const auto& esc = html_escape;
const auto& num = plot_number;

StatusOr<std::string> read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return Status(StatusCode::kNotFound, "cannot open " + p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Leaves of a JSON object as "a.b.c" -> printable value (arrays of objects summarised).
void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) flatten(v, prefix.empty() ? k : prefix + "." + k, out);
  } else if (j.is_string()) {
    out[prefix] = j.get<std::string>();
  } else if (j.is_number_float()) {
    out[prefix] = num(j.get<double>());
  } else if (!j.is_null()) {
    out[prefix] = j.dump();
  }
}

// The rows of the records table: what identifies and configures a run, and how it ended.
std::map<std::string, std::string> record_rows(const RunView& r) {
  std::map<std::string, std::string> rows;
  const auto& j = r.record;
  if (!j.is_object()) return rows;
  for (const char* k : {"keel", "hyperparameters", "final"})
    if (j.contains(k)) flatten(j[k], k, rows);
  for (const char* k : {"seed", "status", "start_time", "end_time"})
    if (j.contains(k)) flatten(j[k], k, rows);
  if (j.contains("host") && j["host"].is_object()) {
    if (j["host"].contains("threads")) rows["host.threads"] = j["host"]["threads"].dump();
    if (j["host"].contains("hostname")) rows["host.hostname"] = j["host"]["hostname"].get<std::string>();
    if (j["host"].contains("plugins"))
      for (const auto& p : j["host"]["plugins"])
        if (p.value("state", "") == "loaded") rows["plugins." + p.value("name", "?")] = p.value("version", "");
  }
  if (j.contains("data") && j["data"].is_object()) {
    const auto& d = j["data"];
    if (d.contains("path")) rows["data.path"] = d["path"].get<std::string>();
    if (d.contains("samples")) flatten(d["samples"], "data.samples", rows);
    if (d.contains("files"))
      for (const auto& f : d["files"])
        rows["data.sha256." + f.value("name", "?")] = f.value("sha256", "").substr(0, 16) + "…";
  }
  return rows;
}

void render_table(std::ostringstream& s, const std::vector<RunView>& runs) {
  std::vector<std::map<std::string, std::string>> rows;
  std::set<std::string> keys;
  for (const auto& r : runs) {
    rows.push_back(record_rows(r));
    for (const auto& [k, v] : rows.back()) keys.insert(k);
  }
  if (keys.empty()) return;
  s << "<h2>Runs</h2>\n<p>Rows that differ between runs are highlighted.</p>\n<table>\n<tr><th></th>";
  for (size_t i = 0; i < runs.size(); ++i)
    s << "<th><span style=\"color:" << color(i) << "\">&#9632;</span> " << esc(runs[i].label) << "</th>";
  s << "</tr>\n";
  for (const auto& k : keys) {
    std::set<std::string> distinct;
    for (const auto& r : rows) distinct.insert(r.count(k) ? r.at(k) : "");
    s << "<tr" << (distinct.size() > 1 ? " class=\"diff\"" : "") << "><td>" << esc(k) << "</td>";
    for (const auto& r : rows) s << "<td>" << (r.count(k) ? esc(r.at(k)) : "") << "</td>";
    s << "</tr>\n";
  }
  s << "</table>\n";
}

void render_curve(std::ostringstream& s, const std::string& kind, const std::string& name, const std::string& x_name,
                  const std::vector<std::pair<size_t, const ScalarSeries*>>& lines) {
  const int w = 460, h = 260, ml = 62, mr = 16, mt = 30, mb = 36;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& [i, se] : lines)
    for (const auto& [x, y] : se->points)
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  if (!(x1 > x0)) x1 = x0 + 1;
  if (!(y1 > y0)) y0 -= 0.5, y1 += 0.5;
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  auto px = [&](double x) { return ml + (x - x0) / (x1 - x0) * (w - ml - mr); };
  auto py = [&](double y) { return h - mb - (y - y0) / (y1 - y0) * (h - mt - mb); };
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
    << "\" font-family=\"sans-serif\" font-size=\"11\">";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\" stroke=\"#ddd\"/>";
  s << "<text x=\"8\" y=\"18\" font-size=\"13\" font-weight=\"bold\">" << esc(kind + " / " + name) << "</text>";
  s << "<line x1=\"" << ml << "\" y1=\"" << h - mb << "\" x2=\"" << w - mr << "\" y2=\"" << h - mb
    << "\" stroke=\"#888\"/>";
  s << "<line x1=\"" << ml << "\" y1=\"" << mt << "\" x2=\"" << ml << "\" y2=\"" << h - mb << "\" stroke=\"#888\"/>";
  for (int t = 0; t <= 4; ++t) {
    const double yv = y0 + (y1 - y0) * t / 4, xv = x0 + (x1 - x0) * t / 4;
    s << "<text x=\"" << ml - 4 << "\" y=\"" << py(yv) + 4 << "\" text-anchor=\"end\" fill=\"#666\">" << num(yv)
      << "</text>";
    s << "<line x1=\"" << ml << "\" y1=\"" << py(yv) << "\" x2=\"" << w - mr << "\" y2=\"" << py(yv)
      << "\" stroke=\"#eee\"/>";
    s << "<text x=\"" << px(xv) << "\" y=\"" << h - mb + 14 << "\" text-anchor=\"middle\" fill=\"#666\">" << num(xv)
      << "</text>";
  }
  s << "<text x=\"" << (ml + w - mr) / 2 << "\" y=\"" << h - 6 << "\" text-anchor=\"middle\" fill=\"#666\">"
    << esc(x_name) << "</text>";
  for (const auto& [i, se] : lines) {
    s << "<polyline fill=\"none\" stroke=\"" << color(i) << "\" stroke-width=\"1.5\" points=\"";
    for (const auto& [x, y] : se->points) s << px(x) << "," << py(y) << " ";
    s << "\"/>";
    if (se->points.size() == 1)
      s << "<circle cx=\"" << px(se->points[0].first) << "\" cy=\"" << py(se->points[0].second) << "\" r=\"3\" fill=\""
        << color(i) << "\"/>";
  }
  s << "</svg>\n";
}

// One tensor's histograms over the epochs: a ridge line per epoch on a shared value axis.
void render_ridges(std::ostringstream& s, const std::string& title,
                   const std::vector<std::pair<double, nlohmann::json>>& hs, const char* stroke) {
  const int w = 360, ml = 56, mr = 12, mt = 26, dy = 16, amp = 40, mb = 28;
  const int h = mt + amp + dy * static_cast<int>(hs.size()) + mb;
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& [e, j] : hs) lo = std::min(lo, j.value("lo", 0.0)), hi = std::max(hi, j.value("hi", 0.0));
  if (!(hi > lo)) hi = lo + 1;
  auto px = [&](double v) { return ml + (v - lo) / (hi - lo) * (w - ml - mr); };
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
    << "\" font-family=\"sans-serif\" font-size=\"10\">";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"white\" stroke=\"#ddd\"/>";
  s << "<text x=\"6\" y=\"16\" font-size=\"12\" font-weight=\"bold\">" << esc(title) << "</text>";
  for (size_t k = 0; k < hs.size(); ++k) {
    const auto& [epoch, j] = hs[k];
    const double base = mt + amp + dy * static_cast<double>(k);
    std::vector<double> counts;
    for (const auto& c : j.value("counts", nlohmann::json::array())) counts.push_back(c.get<double>());
    const double peak = counts.empty() ? 1 : std::max(1.0, *std::max_element(counts.begin(), counts.end()));
    const double blo = j.value("lo", 0.0), bhi = j.value("hi", 0.0);
    const double bw = counts.empty() ? 0 : (bhi - blo) / static_cast<double>(counts.size());
    const double opacity = 0.35 + 0.65 * static_cast<double>(k + 1) / static_cast<double>(hs.size());
    s << "<text x=\"" << ml - 4 << "\" y=\"" << base + 3 << "\" text-anchor=\"end\" fill=\"#666\">epoch " << num(epoch)
      << "</text>";
    s << "<polyline fill=\"" << stroke << "\" fill-opacity=\"0.12\" stroke=\"" << stroke << "\" stroke-opacity=\""
      << opacity << "\" points=\"" << px(blo) << "," << base << " ";
    for (size_t b = 0; b < counts.size(); ++b)
      s << px(blo + bw * (static_cast<double>(b) + 0.5)) << "," << base - counts[b] / peak * amp << " ";
    s << px(bhi) << "," << base << "\"/>";
  }
  s << "<text x=\"" << ml << "\" y=\"" << h - 8 << "\" fill=\"#666\">" << num(lo) << "</text><text x=\"" << w - mr
    << "\" y=\"" << h - 8 << "\" text-anchor=\"end\" fill=\"#666\">" << num(hi) << "</text>";
  s << "</svg>\n";
}

}  // namespace

std::vector<nlohmann::json> parse_histogram_records(const std::string& log_text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(log_text);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"histograms\"") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("kind", "") == "histograms") out.push_back(std::move(j));
  }
  return out;
}

StatusOr<RunView> load_run(const fs::path& path) {
  RunView v;
  v.source = path;
  std::error_code ec;
  fs::path record_file, log_file;
  if (fs::is_directory(path, ec)) {
    record_file = path / "run.json";
    if (!fs::exists(record_file, ec))
      return Status(StatusCode::kNotFound, "the run directory " + path.string() + " has no run.json");
    v.label = fs::absolute(path).lexically_normal().filename().string();
    if (v.label.empty()) v.label = fs::absolute(path).lexically_normal().parent_path().filename().string();
  } else if (path.extension() == ".json") {
    record_file = path;
    v.label = fs::absolute(path).parent_path().filename().string();
    if (path.filename() != "run.json") v.label += "/" + path.filename().string();
  } else {
    log_file = path;
    v.label = path.filename().string();
  }
  if (!record_file.empty()) {
    KEEL_ASSIGN_OR_RETURN(std::string text, read_text(record_file), "run record");
    v.record = nlohmann::json::parse(text, nullptr, false);
    if (!v.record.is_object() || !v.record.contains("format"))
      return Status(StatusCode::kInvalidArgument, record_file.string() + " is not a Keel run record");
    if (v.record.contains("label") && v.record["label"].is_string() && !v.record["label"].get<std::string>().empty())
      v.label = v.record["label"].get<std::string>();
    if (v.record.contains("log") && v.record["log"].is_string() && !v.record["log"].get<std::string>().empty()) {
      log_file = v.record["log"].get<std::string>();
      if (log_file.is_relative()) log_file = record_file.parent_path() / log_file;
    }
  }
  if (!log_file.empty()) {
    auto text = read_text(log_file);
    if (!text.is_ok()) {
      if (record_file.empty()) return Status(StatusCode::kNotFound, "cannot open the scalar log " + log_file.string());
    } else {
      v.log = parse_scalar_log(*text);
      v.histograms = parse_histogram_records(*text);
    }
  }
  return v;
}

std::string render_runs_html(const std::vector<RunView>& runs, const std::string& title, int columns) {
  std::ostringstream s;
  s << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" << esc(title) << "</title>\n<style>"
    << "body{font-family:sans-serif;margin:12px} table{border-collapse:collapse;font-size:12px} "
       "td,th{border:1px solid #ddd;padding:2px 6px;text-align:left} tr.diff td{background:#fff3c4;font-weight:bold} "
       ".grid{display:grid;grid-template-columns:repeat("
    << std::max(1, columns) << ",max-content);gap:8px}</style></head>\n<body>\n<h1>" << esc(title) << "</h1>\n<p>";
  for (size_t i = 0; i < runs.size(); ++i)
    s << "<span style=\"color:" << color(i) << "\">&#9632;</span> " << esc(runs[i].label) << " ("
      << esc(runs[i].source.string()) << ")&nbsp;&nbsp; ";
  s << "</p>\n";
  render_table(s, runs);

  // Curves: the union of (kind, name) over runs, in first-seen order, one line per run.
  std::vector<std::pair<std::string, std::string>> keys;
  for (const auto& r : runs)
    for (const auto& se : r.log.series)
      if (std::find(keys.begin(), keys.end(), std::make_pair(se.kind, se.name)) == keys.end())
        keys.emplace_back(se.kind, se.name);
  s << "<h2>Curves</h2>\n";
  if (keys.empty()) s << "<p>no scalar log</p>\n";
  s << "<div class=\"grid\">\n";
  for (const auto& [kind, name] : keys) {
    std::vector<std::pair<size_t, const ScalarSeries*>> lines;
    std::string x_name = "step";
    for (size_t i = 0; i < runs.size(); ++i)
      for (const auto& se : runs[i].log.series)
        if (se.kind == kind && se.name == name) lines.emplace_back(i, &se), x_name = se.x_name;
    render_curve(s, kind, name, x_name, lines);
  }
  s << "</div>\n";

  // Histograms per run: parameters, then gradients (at the epoch's last step), one panel per tensor.
  bool any = false;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].histograms.empty()) continue;
    any = true;
    for (const char* what : {"params", "grads"}) {
      std::vector<std::string> names;
      for (const auto& rec : runs[i].histograms)
        if (rec.contains(what) && rec[what].is_object())
          for (const auto& [n, h] : rec[what].items())
            if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
      if (names.empty()) continue;
      s << "<h2><span style=\"color:" << color(i) << "\">&#9632;</span> " << esc(runs[i].label) << ": "
        << (std::string(what) == "params" ? "parameter" : "gradient")
        << " distributions per epoch</h2>\n<div class=\"grid\">\n";
      for (const auto& n : names) {
        std::vector<std::pair<double, nlohmann::json>> hs;
        for (const auto& rec : runs[i].histograms)
          if (rec.contains(what) && rec[what].contains(n)) hs.emplace_back(rec.value("epoch", 0.0), rec[what][n]);
        render_ridges(s, n, hs, color(i));
      }
      s << "</div>\n";
    }
  }
  if (!any) s << "<p>No parameter histograms in these logs (keel train writes them with --log).</p>\n";
  s << "</body></html>\n";
  return s.str();
}

}  // namespace keel::train
