#include "core/train/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

namespace keel::train {
namespace {

uint32_t be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// A zlib inflate stream over `compressed`, inflated piece by piece into the caller's memory.
class Inflater {
 public:
  Inflater(std::string_view compressed, std::string origin) : origin_(std::move(origin)) {
    ok_ = inflateInit2(&zs_, 32 + MAX_WBITS) == Z_OK;  // 32 + MAX_WBITS: a gzip or a zlib header
    zs_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(compressed.data()));
    zs_.avail_in = static_cast<uInt>(compressed.size());
  }
  ~Inflater() {
    if (ok_) inflateEnd(&zs_);
  }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  bool initialised() const { return ok_; }
  bool ended() const { return ended_; }

  // Inflates up to n bytes into dst; fewer only where the stream ends. `filled` gets how many.
  Status fill(unsigned char* dst, uint64_t n, uint64_t* filled) {
    *filled = 0;
    while (n > 0 && !ended_) {
      const uInt chunk = static_cast<uInt>(std::min<uint64_t>(n, uint64_t{1} << 30));
      zs_.next_out = dst;
      zs_.avail_out = chunk;
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      const uint64_t got = chunk - zs_.avail_out;
      dst += got, n -= got, *filled += got, produced_ += got;
      if (rc == Z_STREAM_END) {
        ended_ = true;
      } else if (rc != Z_OK) {
        return invalid_argument(origin_ + ": corrupt gzip stream (" +
                                (zs_.msg             ? std::string(zs_.msg)
                                 : rc == Z_BUF_ERROR ? std::string("unexpected end of compressed data")
                                                     : "error " + std::to_string(rc)) +
                                ")");
      } else if (zs_.avail_in == 0 && zs_.avail_out != 0) {
        return invalid_argument(origin_ + ": truncated gzip stream (ends after " + std::to_string(produced_) +
                                " inflated bytes)");
      }
    }
    return Status::ok();
  }

 private:
  z_stream zs_{};
  std::string origin_;
  bool ok_ = false, ended_ = false;
  uint64_t produced_ = 0;
};

}  // namespace

StatusOr<std::string> gunzip(std::string_view compressed, const std::string& origin, uint64_t max_bytes) {
  if (compressed.size() > UINT32_MAX) return invalid_argument(origin + ": compressed file too large");
  Inflater z(compressed, origin);
  if (!z.initialised()) return internal_error(origin + ": zlib inflateInit2 failed");
  std::string out;
  // The gzip trailer holds the inflated size (mod 2^32): reserve it once instead of growing the buffer, unless it
  // claims more than deflate can give (about 1032 bytes out per byte in), as a damaged trailer may.
  if (compressed.size() >= 18 && static_cast<unsigned char>(compressed[0]) == 0x1f) {
    const auto* t = reinterpret_cast<const unsigned char*>(compressed.data() + compressed.size() - 4);
    const uint64_t isize = uint64_t{t[0]} | (uint64_t{t[1]} << 8) | (uint64_t{t[2]} << 16) | (uint64_t{t[3]} << 24);
    if (isize <= max_bytes && isize <= uint64_t{1032} * compressed.size()) out.reserve(isize);
  }
  unsigned char buf[1 << 16];
  while (!z.ended()) {
    uint64_t got = 0;
    KEEL_RETURN_IF_ERROR(z.fill(buf, sizeof(buf), &got), "");
    out.append(reinterpret_cast<const char*>(buf), got);
    if (out.size() > max_bytes)
      return invalid_argument(origin + ": inflated data exceeds " + std::to_string(max_bytes) + " bytes");
  }
  return out;
}

namespace {

// An IDX header: the element type, the shape, the element count and the header's own size in bytes.
struct IdxHeader {
  DType dtype = DType::kU8;
  size_t esize = 1;
  Shape shape;
  uint64_t count = 1;
  size_t bytes = 0;
};

// The header at the front of `bytes` (which may hold more, or, when inflating, be all there is so far). Its errors
// are parse_idx's (which see).
StatusOr<IdxHeader> idx_header(std::string_view bytes, const std::string& origin, uint64_t max_bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() < 4)
    return invalid_argument(origin + ": not an IDX file (" + std::to_string(bytes.size()) +
                            " bytes, the header needs 4)");
  if (p[0] != 0 || p[1] != 0)
    return invalid_argument(origin + ": not an IDX file (magic must start with two zero bytes)");
  IdxHeader h;
  switch (p[2]) {
    case 0x08: h.dtype = DType::kU8, h.esize = 1; break;
    case 0x09: h.dtype = DType::kI8, h.esize = 1; break;
    case 0x0B: h.dtype = DType::kI16, h.esize = 2; break;
    case 0x0C: h.dtype = DType::kI32, h.esize = 4; break;
    case 0x0D: h.dtype = DType::kF32, h.esize = 4; break;
    case 0x0E: h.dtype = DType::kF64, h.esize = 8; break;
    default: {
      std::ostringstream m;
      m << origin << ": unknown IDX element type 0x" << std::hex << int{p[2]};
      return invalid_argument(m.str());
    }
  }
  const int ndim = p[3];
  if (ndim == 0 || ndim > 8) return invalid_argument(origin + ": IDX rank " + std::to_string(ndim) + " is not in 1..8");
  h.bytes = 4 + 4 * static_cast<size_t>(ndim);
  if (bytes.size() < h.bytes)
    return invalid_argument(origin + ": truncated IDX header (" + std::to_string(bytes.size()) + " bytes, rank " +
                            std::to_string(ndim) + " needs " + std::to_string(h.bytes) + ")");
  for (int i = 0; i < ndim; ++i) {
    uint32_t d = be32(p + 4 + 4 * i);
    h.shape.push_back(d);
    if (d != 0 && h.count > max_bytes / h.esize / d)
      return invalid_argument(origin + ": IDX dimensions " + shape_to_string(h.shape) + "... exceed " +
                              std::to_string(max_bytes) + " bytes");
    h.count *= d;
  }
  return h;
}

Status truncated_data(const std::string& origin, const IdxHeader& h, uint64_t have) {
  return invalid_argument(origin + ": truncated IDX data: shape " + shape_to_string(h.shape) + " needs " +
                          std::to_string(h.count * h.esize) + " bytes, the file has " + std::to_string(have));
}

Status extra_data(const std::string& origin, const IdxHeader& h, uint64_t extra) {
  return invalid_argument(origin + ": " + std::to_string(extra) + " unexpected bytes after the IDX data of shape " +
                          shape_to_string(h.shape));
}

// Big-endian elements to little-endian, in place.
void swap_to_little_endian(unsigned char* d, uint64_t count, size_t esize) {
  if (esize == 1) return;
  for (uint64_t i = 0; i < count; ++i) std::reverse(d + i * esize, d + (i + 1) * esize);
}

}  // namespace

StatusOr<keel::Tensor> parse_idx(std::string_view bytes, const std::string& origin, uint64_t max_bytes) {
  KEEL_ASSIGN_OR_RETURN(IdxHeader h, idx_header(bytes, origin, max_bytes), "");
  const uint64_t data_bytes = h.count * h.esize;
  const uint64_t have = bytes.size() - h.bytes;
  if (have < data_bytes) return truncated_data(origin, h, have);
  if (have > data_bytes) return extra_data(origin, h, have - data_bytes);
  KEEL_ASSIGN_OR_RETURN(keel::Tensor t, keel::Tensor::host_uninitialized(h.dtype, h.shape), origin);
  auto* dst = static_cast<unsigned char*>(t.raw_data());
  std::memcpy(dst, bytes.data() + h.bytes, data_bytes);
  swap_to_little_endian(dst, h.count, h.esize);
  return t;
}

StatusOr<keel::Tensor> parse_idx_gzip(std::string_view compressed, const std::string& origin, uint64_t max_bytes) {
  if (compressed.size() > UINT32_MAX) return invalid_argument(origin + ": compressed file too large");
  Inflater z(compressed, origin);
  if (!z.initialised()) return internal_error(origin + ": zlib inflateInit2 failed");
  // The header: its first 4 bytes say how long it is.
  unsigned char head[4 + 4 * 8];
  uint64_t got = 0, more = 0;
  KEEL_RETURN_IF_ERROR(z.fill(head, 4, &got), "");
  if (got == 4 && head[0] == 0 && head[1] == 0 && head[3] >= 1 && head[3] <= 8) {
    KEEL_RETURN_IF_ERROR(z.fill(head + 4, 4 * uint64_t{head[3]}, &more), "");
    got += more;
  }
  KEEL_ASSIGN_OR_RETURN(IdxHeader h, idx_header({reinterpret_cast<const char*>(head), got}, origin, max_bytes), "");
  const uint64_t data_bytes = h.count * h.esize;
  // Deflate gives at most about 1032 bytes out per byte in: a header that claims more is a truncated file (and is not
  // allocated for).
  if (data_bytes > uint64_t{1032} * compressed.size()) return truncated_data(origin, h, 0);
  // The elements straight into the tensor: no inflated copy of the file in between.
  KEEL_ASSIGN_OR_RETURN(keel::Tensor t, keel::Tensor::host_uninitialized(h.dtype, h.shape), origin);
  auto* dst = static_cast<unsigned char*>(t.raw_data());
  KEEL_RETURN_IF_ERROR(z.fill(dst, data_bytes, &got), "");
  if (got < data_bytes) return truncated_data(origin, h, got);
  // Anything after the elements is an error (counted up to max_bytes), and so is a stream that does not end.
  uint64_t extra = 0;
  unsigned char scratch[4096];
  while (!z.ended()) {
    KEEL_RETURN_IF_ERROR(z.fill(scratch, sizeof(scratch), &got), "");
    extra += got;
    if (extra > max_bytes)
      return invalid_argument(origin + ": inflated data exceeds " + std::to_string(max_bytes) + " bytes");
  }
  if (extra > 0) return extra_data(origin, h, extra);
  swap_to_little_endian(dst, h.count, h.esize);
  return t;
}

StatusOr<keel::Tensor> read_idx(const std::filesystem::path& file) {
  const std::string origin = file.string();
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in) return not_found(origin + ": cannot open IDX file");
  // The whole file in one read, into memory that is not zero-filled first (host storage: huge pages for a large file,
  // whose 4 KiB pages' first touches cost more than the read itself, core/base/tensor.h).
  const std::streamoff size = in.tellg();
  if (size < 0) return invalid_argument(origin + ": cannot tell the file's size");
  auto raw = Storage::allocate_host(static_cast<uint64_t>(size), /*zero=*/false);
  if (!raw.is_ok()) return out_of_memory(origin + ": " + std::to_string(size) + " bytes to read");
  char* buf = static_cast<char*>((*raw)->data());
  in.seekg(0);
  in.read(buf, size);
  if (in.gcount() != size) return invalid_argument(origin + ": read error");
  const std::string_view bytes(buf, static_cast<size_t>(size));
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f && static_cast<unsigned char>(bytes[1]) == 0x8b)
    return parse_idx_gzip(bytes, origin);
  if (file.extension() == ".gz") return invalid_argument(origin + ": named .gz but is not gzip-compressed");
  return parse_idx(bytes, origin);
}

}  // namespace keel::train
