#include "core/train/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <fstream>

namespace keel::train {
namespace {

using nlohmann::json;

const std::pair<DType, const char*> kDTypes[] = {
    {DType::kF32, "F32"}, {DType::kF16, "F16"}, {DType::kBF16, "BF16"}, {DType::kF64, "F64"}, {DType::kI8, "I8"},
    {DType::kI16, "I16"}, {DType::kI32, "I32"}, {DType::kI64, "I64"},   {DType::kU8, "U8"},   {DType::kU16, "U16"},
    {DType::kU32, "U32"}, {DType::kU64, "U64"}, {DType::kBool, "BOOL"},
};

const char* st_name(DType t) {
  for (const auto& [d, n] : kDTypes)
    if (d == t) return n;
  return nullptr;
}

std::optional<DType> st_dtype(const std::string& s) {
  for (const auto& [d, n] : kDTypes)
    if (s == n) return d;
  return std::nullopt;
}

constexpr const char* kFormatKey = "format";
constexpr const char* kFormat = "keel-checkpoint-1";

}  // namespace

StatusOr<std::string> serialize_safetensors(const SafeTensors& st) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : st.tensors) {
    if (name.empty() || name == "__metadata__")
      return invalid_argument("safetensors: invalid tensor name '" + name + "'");
    if (header.contains(name)) return invalid_argument("safetensors: duplicate tensor name '" + name + "'");
    const char* dt = st_name(t.dtype());
    if (!dt)
      return invalid_argument("safetensors: tensor '" + name + "' has dtype " + dtype_name(t.dtype()) +
                              ", which the format cannot store");
    if (!t.location().is_host()) return invalid_argument("safetensors: tensor '" + name + "' is not in host memory");
    header[name] = {{"dtype", dt}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.byte_size()}}};
    offset += t.byte_size();
  }
  if (!st.metadata.empty()) header["__metadata__"] = st.metadata;
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += h;
  out.reserve(out.size() + offset);
  for (const auto& [name, t] : st.tensors) out.append(static_cast<const char*>(t.raw_data()), t.byte_size());
  return out;
}

StatusOr<SafeTensors> parse_safetensors(std::string_view bytes, const std::string& origin) {
  auto bad = [&](const std::string& m) { return invalid_argument(origin + ": not a valid safetensors file: " + m); };
  if (bytes.size() < 8)
    return bad("shorter than the 8-byte header length (" + std::to_string(bytes.size()) + " bytes)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  if (n > bytes.size() - 8)
    return bad("header length " + std::to_string(n) + " runs past the end of the file (" +
               std::to_string(bytes.size()) + " bytes)");
  json header;
  try {
    header = json::parse(bytes.substr(8, n));
  } catch (const std::exception& e) {
    return bad(std::string("header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) return bad("header is not a JSON object");
  const std::string_view data = bytes.substr(8 + n);
  SafeTensors st;
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return bad("__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) return bad("__metadata__ value '" + m.key() + "' is not a string");
        st.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const json& v = it.value();
    const std::string& name = it.key();
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      return bad("tensor '" + name + "' needs dtype, shape and data_offsets");
    if (!v["dtype"].is_string()) return bad("tensor '" + name + "': dtype is not a string");
    auto dt = st_dtype(v["dtype"].get<std::string>());
    if (!dt) return bad("tensor '" + name + "': unsupported dtype " + v["dtype"].get<std::string>());
    Entry e{name, *dt, {}, 0, 0};
    if (!v["shape"].is_array()) return bad("tensor '" + name + "': shape is not an array");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) return bad("tensor '" + name + "': shape has a non-integer or negative dim");
      e.shape.push_back(d.get<int64_t>());
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return bad("tensor '" + name + "': data_offsets must be two non-negative integers");
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data.size())
      return bad("tensor '" + name + "': data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                 "] outside the " + std::to_string(data.size()) + " data bytes");
    auto size = checked_byte_size(e.dtype, e.shape);
    if (!size.is_ok()) return bad("tensor '" + name + "': " + size.status().message());
    if (*size != e.end - e.begin)
      return bad("tensor '" + name + "': shape " + shape_to_string(e.shape) + " of " + v["dtype"].get<std::string>() +
                 " needs " + std::to_string(*size) + " bytes, data_offsets give " + std::to_string(e.end - e.begin));
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  uint64_t expect = 0;
  for (const auto& e : entries) {
    if (e.begin != expect)
      return bad("tensor '" + e.name + "' starts at " + std::to_string(e.begin) + ", expected " +
                 std::to_string(expect) +
                 (e.begin < expect ? " (overlaps the previous tensor)" : " (a hole in the data)"));
    expect = e.end;
  }
  if (expect != data.size()) return bad(std::to_string(data.size() - expect) + " bytes after the last tensor");
  for (const auto& e : entries) {
    KEEL_ASSIGN_OR_RETURN(keel::Tensor t, keel::Tensor::host(e.dtype, e.shape), origin);
    if (e.end > e.begin) std::memcpy(t.raw_data(), data.data() + e.begin, e.end - e.begin);
    st.tensors.emplace_back(e.name, std::move(t));
  }
  return st;
}

Status save_safetensors(const std::filesystem::path& file, const SafeTensors& st) {
  KEEL_ASSIGN_OR_RETURN(std::string bytes, serialize_safetensors(st), file.string());
  auto tmp = file;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return unavailable(file.string() + ": cannot open for writing");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return unavailable(file.string() + ": write failed (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) return unavailable(file.string() + ": cannot rename the temporary file: " + ec.message());
  return Status::ok();
}

StatusOr<SafeTensors> load_safetensors(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found(file.string() + ": cannot open");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_safetensors(bytes, file.string());
}

// --- checkpoints ---

const eager::Tensor* State::tensor(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

const State* Checkpoint::get(const std::string& component) const {
  auto it = components_.find(component);
  return it == components_.end() ? nullptr : &it->second;
}

StatusOr<const State*> Checkpoint::require(const std::string& component) const {
  if (const State* s = get(component)) return s;
  std::string have;
  for (const auto& [n, s] : components_) have += (have.empty() ? "" : ", ") + n;
  return not_found("checkpoint has no '" + component + "' component (it has: " + (have.empty() ? "none" : have) + ")");
}

Status Checkpoint::save(const std::filesystem::path& file) const {
  SafeTensors st;
  st.metadata[kFormatKey] = kFormat;
  try {
    for (const auto& [comp, state] : components_) {
      if (comp.empty() || comp.find('/') != std::string::npos || comp == kFormatKey)
        return invalid_argument("checkpoint: invalid component name '" + comp + "'");
      st.metadata[comp] = state.values.dump();
      for (const auto& [name, t] : state.tensors) {
        if (!t.defined()) return invalid_argument("checkpoint: tensor " + comp + "/" + name + " is undefined");
        eager::Tensor host = t.device() == "cpu" ? t : t.to("cpu");
        st.tensors.emplace_back(comp + "/" + name, host.data());
      }
    }
  } catch (const eager::Error& e) {
    return e.status().with_context("checkpoint " + file.string());
  }
  return save_safetensors(file, st);
}

StatusOr<Checkpoint> Checkpoint::load(const std::filesystem::path& file) {
  KEEL_ASSIGN_OR_RETURN(SafeTensors st, load_safetensors(file), "checkpoint");
  auto fmt = st.metadata.find(kFormatKey);
  if (fmt == st.metadata.end() || fmt->second != kFormat)
    return invalid_argument(file.string() + ": not a Keel checkpoint (metadata 'format' is not '" + kFormat + "')");
  Checkpoint c;
  for (const auto& [key, value] : st.metadata) {
    if (key == kFormatKey) continue;
    State s;
    try {
      s.values = json::parse(value);
    } catch (const std::exception& e) {
      return invalid_argument(file.string() + ": component '" + key + "' holds no JSON (" + e.what() + ")");
    }
    c.components_[key] = std::move(s);
  }
  for (auto& [name, t] : st.tensors) {
    auto slash = name.find('/');
    if (slash == std::string::npos || slash == 0)
      return invalid_argument(file.string() + ": tensor '" + name + "' is not named <component>/<name>");
    c.components_[name.substr(0, slash)].tensors.emplace_back(name.substr(slash + 1), eager::Tensor(t));
  }
  return c;
}

}  // namespace keel::train
