// keel/core/train/idx.h — the IDX file format (MNIST, Fashion-MNIST), plain or gzip-compressed.
//
// An IDX file is: two zero bytes, a type code (0x08 u8, 0x09 s8, 0x0B s16, 0x0C s32, 0x0D f32, 0x0E f64), the number
// of dimensions, one big-endian u32 per dimension, then the elements, big-endian, row-major. Files whose name ends in
// ".gz" (or that start with the gzip magic) are inflated with zlib first.
//
// Every malformed input (bad magic, unknown type, zero or too many dimensions, a size overflow, truncated or extra
// data, a corrupt gzip stream) is an INVALID_ARGUMENT that names the file and the problem; nothing aborts.
// Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.h"
#include "core/base/tensor.h"

namespace keel::train {

// Decodes IDX bytes (already inflated) into a host tensor: u8, i8, i16, i32, f32 or f64, shaped by the header.
// `origin` names the source in error messages. At most `max_bytes` of element data are accepted.
StatusOr<keel::Tensor> parse_idx(std::string_view bytes, const std::string& origin, uint64_t max_bytes = (1ull << 32));

// Decodes a gzip (or zlib) compressed IDX file into a host tensor, as parse_idx(gunzip(compressed)) does (the same
// errors, with those of gunzip), but inflating the elements straight into the tensor, without the inflated copy.
StatusOr<keel::Tensor> parse_idx_gzip(std::string_view compressed, const std::string& origin,
                                      uint64_t max_bytes = (1ull << 32));

// Inflates a gzip (or zlib) stream. INVALID_ARGUMENT for corrupt or truncated streams; at most `max_bytes` out.
StatusOr<std::string> gunzip(std::string_view compressed, const std::string& origin, uint64_t max_bytes = (1ull << 32));

// Reads a file (inflating gzip when it starts with the gzip magic) and parses it.
StatusOr<keel::Tensor> read_idx(const std::filesystem::path& file);

}  // namespace keel::train
