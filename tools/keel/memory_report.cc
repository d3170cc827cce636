#include "tools/keel/memory_report.h"

#include <cstdio>

namespace keel::cli {
namespace {
std::string mib(uint64_t b) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return buf;
}
}  // namespace

nlohmann::json memory_stats_json(const AllocatorStats& s) {
  nlohmann::json j;
  j["reserved_bytes"] = s.reserved_bytes;
  j["in_use_bytes"] = s.in_use_bytes;
  j["peak_reserved_bytes"] = s.peak_reserved_bytes;
  j["peak_in_use_bytes"] = s.peak_in_use_bytes;
  j["segments"] = s.segments;
  j["blocks_in_use"] = s.blocks_in_use;
  j["free_blocks"] = s.free_blocks;
  j["allocations"] = s.allocations;
  j["cache_hits"] = s.cache_hits;
  j["cache_misses"] = s.cache_misses;
  j["hit_rate"] = s.allocations ? static_cast<double>(s.cache_hits) / static_cast<double>(s.allocations) : 0.0;
  j["raw_allocations"] = s.raw_allocations;
  j["raw_frees"] = s.raw_frees;
  j["failed_allocations"] = s.failed_allocations;
  return j;
}

nlohmann::json memory_stats_json(const Environment& env) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [device, s] : env.memory_stats()) j[device] = memory_stats_json(s);
  return j;
}

void print_memory_stats(std::ostream& os, const nlohmann::json& pools, const char* indent) {
  if (pools.empty()) os << indent << "(no memory pool used)\n";
  for (const auto& [device, m] : pools.items()) {
    auto u = [&](const char* k) { return m.at(k).get<uint64_t>(); };
    char pct[16];
    std::snprintf(pct, sizeof pct, "%.1f", 100.0 * m.at("hit_rate").get<double>());
    os << indent << device << "  reserved " << mib(u("reserved_bytes")) << " (peak " << mib(u("peak_reserved_bytes"))
       << "), in use " << mib(u("in_use_bytes")) << " (peak " << mib(u("peak_in_use_bytes")) << "), " << u("segments")
       << " segment(s), " << u("blocks_in_use") << " block(s) in use, " << u("free_blocks") << " cached; "
       << u("allocations") << " allocation(s): " << u("cache_hits") << " hit(s), " << u("cache_misses") << " miss(es) ("
       << pct << "% hits), " << u("raw_frees") << " segment(s) given back";
    if (u("failed_allocations")) os << ", " << u("failed_allocations") << " FAILED";
    os << "\n";
  }
}

}  // namespace keel::cli
