#include "core/base/pass_manager.h"

#include <toml++/toml.h>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <sstream>

namespace keel {

StatusOr<std::vector<PassSpec>> parse_pipeline_list(const std::string& list) {
  std::vector<PassSpec> out;
  std::stringstream ss(list);
  std::string item;
  auto trim = [](const std::string& t) {
    auto b = t.find_first_not_of(" \t"), e = t.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : t.substr(b, e - b + 1);
  };
  while (std::getline(ss, item, ',')) {
    // name[:key=value]...: the value is a bool (true/false), an integer, a number, or else a string.
    std::stringstream parts(item);
    std::string part;
    std::getline(parts, part, ':');
    PassSpec spec{trim(part), {}};
    if (spec.name.empty()) return invalid_argument("pass list '" + list + "' has an empty entry");
    while (std::getline(parts, part, ':')) {
      const auto eq = part.find('=');
      const std::string key = trim(part.substr(0, eq)), text = eq == std::string::npos ? "" : trim(part.substr(eq + 1));
      if (eq == std::string::npos || key.empty() || text.empty())
        return invalid_argument("pass list '" + list + "': option '" + part + "' of pass '" + spec.name +
                                "' is not key=value");
      char* end = nullptr;
      errno = 0;
      const long long i = std::strtoll(text.c_str(), &end, 10);
      if (text == "true" || text == "false") spec.options.values[key] = text == "true";
      else if (errno == 0 && end && *end == 0) spec.options.values[key] = static_cast<int64_t>(i);
      else if (const double d = std::strtod(text.c_str(), &end); end && *end == 0) spec.options.values[key] = d;
      else spec.options.values[key] = text;
    }
    out.push_back(std::move(spec));
  }
  return out;
}

StatusOr<std::vector<PassSpec>> parse_pipeline_toml(const std::string& text, const std::string& origin) {
  // Debian's toml++ is built with exceptions: parse errors arrive as toml::parse_error.
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& err) {
    return invalid_argument(origin + ":" + std::to_string(err.source().begin.line) + ":" +
                            std::to_string(err.source().begin.column) + ": " + std::string(err.description()));
  }
  std::vector<PassSpec> out;
  auto* passes = root["pass"].as_array();
  if (root.contains("pass") && passes == nullptr)
    return invalid_argument(origin + ": 'pass' must be an array of tables ([[pass]])");
  if (passes == nullptr) return out;
  for (size_t i = 0; i < passes->size(); ++i) {
    auto* t = (*passes)[i].as_table();
    std::string where = origin + ": pass #" + std::to_string(i + 1);
    if (t == nullptr) return invalid_argument(where + " is not a table");
    auto name = (*t)["name"].value<std::string>();
    if (!name || name->empty()) return invalid_argument(where + " has no string 'name'");
    PassSpec spec{*name, {}};
    if (auto* opts = (*t)["options"].as_table()) {
      for (const auto& [k, v] : *opts) {
        std::string key(k.str());
        if (auto x = v.value<int64_t>(); x && v.is_integer()) spec.options.values[key] = *x;
        else if (v.is_floating_point()) spec.options.values[key] = *v.value<double>();
        else if (v.is_boolean()) spec.options.values[key] = *v.value<bool>();
        else if (v.is_string()) spec.options.values[key] = *v.value<std::string>();
        else if (auto* arr = v.as_array()) {
          std::vector<std::string> list;
          for (const auto& e : *arr) {
            if (!e.is_string()) return invalid_argument(where + ": option '" + key + "' must be a list of strings");
            list.push_back(*e.value<std::string>());
          }
          spec.options.values[key] = std::move(list);
        } else {
          return invalid_argument(where + ": option '" + key + "' has an unsupported type");
        }
      }
    }
    out.push_back(std::move(spec));
  }
  return out;
}

namespace {
struct ReportSink {
  keel_pass_report_t c{};
  PassReport* report;
};
void report_count(keel_pass_report_t* self, const char* key, int64_t value) {
  auto* s = reinterpret_cast<ReportSink*>(self);
  s->report->counters[key ? key : "?"] += value;
}
void report_note(keel_pass_report_t* self, const char* text) {
  auto* s = reinterpret_cast<ReportSink*>(self);
  s->report->notes.emplace_back(text ? text : "");
}
}  // namespace

StatusOr<std::vector<PassReport>> PassManager::run(Graph& graph, keel_graph_t* view,
                                                   const std::vector<PassSpec>& pipeline,
                                                   const std::string& target_device) const {
  for (const auto& spec : pipeline) {
    if (registry_.pass(spec.name) == nullptr) {
      std::string known;
      for (const auto& p : registry_.passes()) known += (known.empty() ? "" : ", ") + p->name;
      return not_found("unknown pass '" + spec.name + "' (registered passes: " + (known.empty() ? "none" : known) +
                       ")");
    }
  }
  std::vector<PassReport> reports;
  for (const auto& spec : pipeline) {
    const PassEntry* pass = registry_.pass(spec.name);
    PassReport report;
    report.pass = spec.name;
    report.nodes_before = graph.node_count();
    Graph backup = graph;
    ReportSink sink;
    sink.c.struct_size = sizeof(keel_pass_report_t);
    sink.c.count = report_count;
    sink.c.note = report_note;
    sink.report = &report;
    auto t0 = std::chrono::steady_clock::now();
    Status st =
        Status::from_c(pass->def.run(pass->def.user_data, view, api_, &spec.options, target_device.c_str(), &sink.c));
    if (st.is_ok()) st = graph.validate().with_context("graph invalid after pass '" + spec.name + "'");
    report.milliseconds = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    report.nodes_after = graph.node_count();
    report.status = st;
    reports.push_back(report);
    if (!st.is_ok()) {
      graph = std::move(backup);
      return st.with_context("pass '" + spec.name + "'");
    }
  }
  return reports;
}

}  // namespace keel
