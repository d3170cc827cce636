// keel/tools/keel/memory_report.h — the per-device memory pools (CachingAllocator statistics) of an Environment,
// as text and JSON, for `keel bench` (and any command that wants to show them).
//
// Stateless; reads Environment::memory_stats(), which is thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>

#include "core/runtime/environment.h"

namespace keel::cli {

// {"cuda:0": {"reserved_bytes": ..., "in_use_bytes": ..., "peak_in_use_bytes": ..., "peak_reserved_bytes": ...,
//  "segments": ..., "blocks_in_use": ..., "free_blocks": ..., "allocations": ..., "cache_hits": ...,
//  "cache_misses": ..., "hit_rate": ..., "raw_allocations": ..., "raw_frees": ..., "failed_allocations": ...}, ...}
nlohmann::json memory_stats_json(const Environment& env);
nlohmann::json memory_stats_json(const AllocatorStats& s);

// One line per pool of memory_stats_json's result: "  cuda:0  reserved 12.0 MiB (peak 14.0 MiB), in use ...".
void print_memory_stats(std::ostream& os, const nlohmann::json& pools, const char* indent = "  ");

}  // namespace keel::cli
