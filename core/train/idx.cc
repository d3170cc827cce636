#include "core/train/idx.h"

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <sstream>

namespace keel::train {
namespace {

uint32_t be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

StatusOr<std::string> gunzip(std::string_view compressed, const std::string& origin, uint64_t max_bytes) {
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  // 32 + MAX_WBITS: accept a gzip or a zlib header.
  if (inflateInit2(&zs, 32 + MAX_WBITS) != Z_OK) return internal_error(origin + ": zlib inflateInit2 failed");
  std::string out;
  // The gzip trailer holds the inflated size (mod 2^32): reserve it once instead of growing the buffer, unless it
  // claims more than deflate can give (about 1032 bytes out per byte in), as a damaged trailer may.
  if (compressed.size() >= 18 && static_cast<unsigned char>(compressed[0]) == 0x1f) {
    const auto* t = reinterpret_cast<const unsigned char*>(compressed.data() + compressed.size() - 4);
    const uint64_t isize = uint64_t{t[0]} | (uint64_t{t[1]} << 8) | (uint64_t{t[2]} << 16) | (uint64_t{t[3]} << 24);
    if (isize <= max_bytes && isize <= uint64_t{1032} * compressed.size()) out.reserve(isize);
  }
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
  zs.avail_in = static_cast<uInt>(compressed.size());
  if (compressed.size() > UINT32_MAX) {
    inflateEnd(&zs);
    return invalid_argument(origin + ": compressed file too large");
  }
  char buf[1 << 16];
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof(buf);
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      std::string why =
          zs.msg ? zs.msg : (rc == Z_BUF_ERROR ? "unexpected end of compressed data" : "error " + std::to_string(rc));
      inflateEnd(&zs);
      return invalid_argument(origin + ": corrupt gzip stream (" + why + ")");
    }
    out.append(buf, sizeof(buf) - zs.avail_out);
    if (out.size() > max_bytes) {
      inflateEnd(&zs);
      return invalid_argument(origin + ": inflated data exceeds " + std::to_string(max_bytes) + " bytes");
    }
    if (rc != Z_STREAM_END && zs.avail_in == 0 && zs.avail_out != 0) {
      inflateEnd(&zs);
      return invalid_argument(origin + ": truncated gzip stream (ends after " + std::to_string(out.size()) +
                              " inflated bytes)");
    }
  }
  inflateEnd(&zs);
  return out;
}

StatusOr<keel::Tensor> parse_idx(std::string_view bytes, const std::string& origin, uint64_t max_bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 4)
    return invalid_argument(origin + ": not an IDX file (" + std::to_string(bytes.size()) +
                            " bytes, the header needs 4)");
  if (p[0] != 0 || p[1] != 0)
    return invalid_argument(origin + ": not an IDX file (magic must start with two zero bytes)");
  DType dtype;
  size_t esize;
  switch (p[2]) {
    case 0x08:
      dtype = DType::kU8;
      esize = 1;
      break;
    case 0x09:
      dtype = DType::kI8;
      esize = 1;
      break;
    case 0x0B:
      dtype = DType::kI16;
      esize = 2;
      break;
    case 0x0C:
      dtype = DType::kI32;
      esize = 4;
      break;
    case 0x0D:
      dtype = DType::kF32;
      esize = 4;
      break;
    case 0x0E:
      dtype = DType::kF64;
      esize = 8;
      break;
    default: {
      std::ostringstream m;
      m << origin << ": unknown IDX element type 0x" << std::hex << int{p[2]};
      return invalid_argument(m.str());
    }
  }
  const int ndim = p[3];
  if (ndim == 0 || ndim > 8) return invalid_argument(origin + ": IDX rank " + std::to_string(ndim) + " is not in 1..8");
  const size_t header = 4 + 4 * static_cast<size_t>(ndim);
  if (bytes.size() < header)
    return invalid_argument(origin + ": truncated IDX header (" + std::to_string(bytes.size()) + " bytes, rank " +
                            std::to_string(ndim) + " needs " + std::to_string(header) + ")");
  Shape shape;
  uint64_t count = 1;
  for (int i = 0; i < ndim; ++i) {
    uint32_t d = be32(p + 4 + 4 * i);
    shape.push_back(d);
    if (d != 0 && count > max_bytes / esize / d)
      return invalid_argument(origin + ": IDX dimensions " + shape_to_string(shape) + "... exceed " +
                              std::to_string(max_bytes) + " bytes");
    count *= d;
  }
  const uint64_t data_bytes = count * esize;
  const uint64_t have = bytes.size() - header;
  if (have < data_bytes)
    return invalid_argument(origin + ": truncated IDX data: shape " + shape_to_string(shape) + " needs " +
                            std::to_string(data_bytes) + " bytes, the file has " + std::to_string(have));
  if (have > data_bytes)
    return invalid_argument(origin + ": " + std::to_string(have - data_bytes) +
                            " unexpected bytes after the IDX data of shape " + shape_to_string(shape));
  KEEL_ASSIGN_OR_RETURN(keel::Tensor t, keel::Tensor::host(dtype, shape), origin);
  auto* dst = static_cast<unsigned char*>(t.raw_data());
  const unsigned char* src = p + header;
  if (esize == 1) {
    std::memcpy(dst, src, data_bytes);
  } else {
    for (uint64_t i = 0; i < count; ++i)
      for (size_t b = 0; b < esize; ++b) dst[i * esize + b] = src[i * esize + (esize - 1 - b)];  // big → little endian
  }
  return t;
}

StatusOr<keel::Tensor> read_idx(const std::filesystem::path& file) {
  const std::string origin = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found(origin + ": cannot open IDX file");
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return invalid_argument(origin + ": read error");
  if (raw.size() >= 2 && static_cast<unsigned char>(raw[0]) == 0x1f && static_cast<unsigned char>(raw[1]) == 0x8b) {
    KEEL_ASSIGN_OR_RETURN(std::string inflated, gunzip(raw, origin), "read_idx");
    return parse_idx(inflated, origin);
  }
  if (file.extension() == ".gz") return invalid_argument(origin + ": named .gz but is not gzip-compressed");
  return parse_idx(raw, origin);
}

}  // namespace keel::train
